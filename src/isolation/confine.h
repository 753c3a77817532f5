/* SPDX-License-Identifier: MIT */
/* Starting a command confined as a pooled sandbox: one flat, ordered list of fail-closed steps
 * run in a CLONE_VM|CLONE_VFORK child with raw syscalls (no fork of a large host, no malloc,
 * no locks in the child). The seccomp filter is not one of them: the caller (a spawn helper)
 * has it installed in itself, and the child inherits it at the clone, before its first step. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/types.h>

#define CONFINE_MAX_LIMITS 8
#define CONFINE_MAX_CGROUPS 4
#define CONFINE_MAX_CANDIDATES 16

typedef struct {
    int resource;
    rlim_t value;
} confine_limit_t;

typedef struct {
    /* identity */
    uint32_t uid, gid;
    /* isolation, applied in this order after the mount namespace and cgroups */
    int mntns_fd; /* -1: stay in the host mount namespace */
    int netns_fd; /* the sandbox's own network namespace; -1: stay in the host's */
    int cgroup_procs_fds[CONFINE_MAX_CGROUPS]; /* cgroup.procs files to join (as root); -1 ends */
    int ruleset_fd;                            /* -1: uid-only (only with --allow-unconfined) */
    confine_limit_t limits[CONFINE_MAX_LIMITS];
    int n_limits;
    /* The working directory: the home (by path; it sits in a root-owned directory the sandbox
     * cannot change), then cwd_rel beneath it with openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|
     * RESOLVE_NO_MAGICLINKS) as the sandbox uid. Resolved in the child, after setns(), so the
     * directory belongs to the sandbox mount namespace. cwd_rel is normalized ("" = home). */
    const char *home_path;
    const char *cwd_rel;
    /* what to run */
    const char *candidates[CONFINE_MAX_CANDIDATES]; /* argv[0] as given, or PATH candidates */
    int n_candidates;
    char *const *argv;
    char *const *envp;
    int stdin_fd, stdout_fd, stderr_fd;
    /* A session of its own with stdin (a pseudo-terminal's slave) as its controlling terminal,
     * instead of a process group of its own: a command on a pty (envd's PTY). Its pid is still
     * its process group's id, so group kills reach it the same way. */
    bool new_session;
    /* Start the child as a sibling (CLONE_PARENT): a spawn helper starts it, the server is its
     * parent, reaps it and signals its process group as if it had started it itself. */
    bool clone_parent;
    /* out: a pidfd of the child (CLONE_PIDFD) when confine_spawn succeeds, else -1 */
    int pidfd;
    /* out: which step failed and why, when confine_spawn returns an error */
    int failed_step;
    int failed_errno;
} confine_spec_t;

/* Names of the steps, for error messages ("setresuid", "landlock_restrict_self", ...). */
const char *confine_step_name(int step);
/* Build the exec candidates for argv[0] from the sandbox's PATH (value of PATH= in envp).
 * Strings are written into buf (cap bytes). */
int confine_resolve_candidates(confine_spec_t *spec, const char *argv0, const char *path_env,
                               char *buf, size_t cap);
/* Start the child. Returns 0 with *ret_pid, or -errno (spec->failed_step tells where). */
int confine_spawn(confine_spec_t *spec, pid_t *ret_pid);
/* Kill every process of uid: a short-lived helper running as uid calls kill(-1, SIGKILL)
 * (reaches setsid() escapees; the kernel walks the task list atomically). Returns 0 when the
 * helper ran; then confine_uid_alive() tells whether anything is left. */
int confine_kill_uid(uint32_t uid);
/* 1 if some process (zombies not yet reaped included) still has this uid, 0 if none; it scans
 * /proc, so callers with a cgroup count use that first. */
int confine_uid_alive(uint32_t uid);
