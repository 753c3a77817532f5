/* SPDX-License-Identifier: MIT */
/* The `process` substrate: one run is a process tree in fresh mount, pid, ipc and uts (and
 * optionally net) namespaces, inside cgroup limits, on a root of its own.
 *
 * The run's root is a directory the node keeps (its writable state: what pause keeps and move
 * carries). The host's /usr, /etc and the merged-/usr links are bind-mounted read-only into it,
 * /proc is the run's own, /dev holds a handful of device nodes, and the agent binary is
 * bind-mounted read-only at /.sbx/bin/sbx-server. The process is pid 1 of its namespace: when it
 * dies, the kernel kills everything left in the run. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "isolation/cgroup.h"

#define SUBSTRATE_AGENT_PATH "/.sbx/bin/sbx-server"

typedef struct {
    const char *root;      /* the run's root directory (exists, owned by root, 0755) */
    const char *agent_bin; /* sbx-server binary on the host, mounted at SUBSTRATE_AGENT_PATH */
    const char *hostname;  /* uts name of the run */
    const char *log_path;  /* stdout+stderr of the run (appended) */
    char *const *argv;     /* argv[0] "sbx-server" means the mounted agent */
    char *const *envp;
    int bridge_fd;         /* bound unix socket, becomes fd 3 (the agent listens on it) */
    bool new_netns;        /* flavor: no network at all (loopback only) */
    bool pool_host;        /* the run packs uid sandboxes: needs /sys/fs/cgroup and the uid lock */
    const int *cgroup_fds; /* cgroup.procs files to join, -1 terminated (may be NULL) */
} substrate_spec_t;

/* Start the run. On success *ret_pid is its pid (in the node's pid namespace) and
 * *ret_start its start time (clock ticks since boot, /proc/<pid>/stat field 22): together they
 * identify the process even after the pid is reused. On failure err says which setup step
 * failed and why. */
int substrate_spawn(const substrate_spec_t *spec, pid_t *ret_pid, uint64_t *ret_start, char *err,
                    size_t errlen);

/* Start time of pid (field 22 of /proc/<pid>/stat), or -errno (-ESRCH for a dead process,
 * zombies included). */
int proc_start_time(pid_t pid, uint64_t *ret);
/* The same through an fd of /proc/<pid>/stat opened earlier (proc_stat_open): such an fd stays
 * bound to that process, never to a later one with the same pid (reads fail once it is gone),
 * so one pread() re-checks the identity. */
int proc_stat_open(pid_t pid);
int proc_stat_start_time(int fd, uint64_t *ret);
