/* SPDX-License-Identifier: MIT */
#include "confine.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "common/macro.h"
#include "landlock.h"

enum {
    STEP_NONE,
    STEP_SETNS,
    STEP_SETNS_NET,
    STEP_CGROUP,
    STEP_SETPGID,
    STEP_STDIO,
    STEP_SETGROUPS,
    STEP_SETRESGID,
    STEP_SETRESUID,
    STEP_NO_NEW_PRIVS,
    STEP_LANDLOCK,
    STEP_RLIMIT,
    STEP_CHDIR,
    STEP_SIGNALS,
    STEP_EXEC,
    STEP_MAX
};

const char *confine_step_name(int step)
{
    static const char *const names[STEP_MAX] = {
        [STEP_NONE] = "none",
        [STEP_SETNS] = "setns(mount namespace)",
        [STEP_SETNS_NET] = "setns(network namespace)",
        [STEP_CGROUP] = "join cgroup",
        [STEP_SETPGID] = "setpgid",
        [STEP_STDIO] = "dup2(stdio)",
        [STEP_SETGROUPS] = "setgroups",
        [STEP_SETRESGID] = "setresgid",
        [STEP_SETRESUID] = "setresuid",
        [STEP_NO_NEW_PRIVS] = "PR_SET_NO_NEW_PRIVS",
        [STEP_LANDLOCK] = "landlock_restrict_self",
        [STEP_RLIMIT] = "setrlimit",
        [STEP_CHDIR] = "chdir",
        [STEP_SIGNALS] = "reset signals",
        [STEP_EXEC] = "execve",
    };
    return step >= 0 && step < STEP_MAX && names[step] ? names[step] : "unknown";
}

int confine_resolve_candidates(confine_spec_t *spec, const char *argv0, const char *path_env,
                               char *buf, size_t cap)
{
    spec->n_candidates = 0;
    if (strchr(argv0, '/')) {
        spec->candidates[spec->n_candidates++] = argv0;
        return 0;
    }
    if (!path_env)
        path_env = "/usr/local/bin:/usr/bin:/bin";
    size_t used = 0;
    const char *p = path_env;
    while (*p && spec->n_candidates < CONFINE_MAX_CANDIDATES) {
        size_t n = strcspn(p, ":");
        const char *dir = n ? p : ".";
        size_t dl = n ? n : 1;
        size_t need = dl + 1 + strlen(argv0) + 1;
        if (used + need > cap)
            return -E2BIG;
        char *dst = buf + used;
        memcpy(dst, dir, dl);
        dst[dl] = '/';
        memcpy(dst + dl + 1, argv0, strlen(argv0) + 1);
        spec->candidates[spec->n_candidates++] = dst;
        used += need;
        p += n;
        if (*p == ':')
            p++;
    }
    return spec->n_candidates > 0 ? 0 : -ENOENT;
}

/* Everything below runs in the child, which shares our memory until execve: raw syscalls
 * only, no allocation, no stdio. A failure records the step and errno and exits. */
#define FAIL(s)                                                                                    \
    do {                                                                                           \
        spec->failed_step = (s);                                                                   \
        spec->failed_errno = errno;                                                                \
        syscall(SYS_exit_group, 127);                                                              \
    } while (0)

static int confine_child(void *arg)
{
    confine_spec_t *spec = arg;

    /* As root: enter the shared sandbox mount namespace (private /proc with hidepid), so this
     * sandbox cannot see other sandboxes' processes. */
    if (spec->mntns_fd >= 0 && syscall(SYS_setns, spec->mntns_fd, CLONE_NEWNS) < 0)
        FAIL(STEP_SETNS);
    /* As root: the sandbox's own network namespace (loopback only), so it reaches neither its
     * siblings nor the host's listeners, and nothing it binds is reachable from them. */
    if (spec->netns_fd >= 0 && syscall(SYS_setns, spec->netns_fd, CLONE_NEWNET) < 0)
        FAIL(STEP_SETNS_NET);
    /* As root: join this sandbox's cgroups (aggregate memory/pids/cpu limits) before any
     * code of the sandbox runs, so nothing it starts can escape them. */
    for (int i = 0; i < CONFINE_MAX_CGROUPS && spec->cgroup_procs_fds[i] >= 0; i++)
        if (syscall(SYS_write, spec->cgroup_procs_fds[i], "0", 1) != 1)
            FAIL(STEP_CGROUP);
    /* Own process group, so process-group kills reach the command's pipeline (on a pty: own
     * session, whose group has the same id). */
    if (spec->new_session ? syscall(SYS_setsid) < 0 : syscall(SYS_setpgid, 0, 0) < 0)
        FAIL(STEP_SETPGID);
    if (syscall(SYS_dup2, spec->stdin_fd, 0) < 0 || syscall(SYS_dup2, spec->stdout_fd, 1) < 0 ||
        syscall(SYS_dup2, spec->stderr_fd, 2) < 0)
        FAIL(STEP_STDIO);
    /* The pty as controlling terminal of the new session (0: never taken from another one). */
    if (spec->new_session && syscall(SYS_ioctl, 0, TIOCSCTTY, 0) < 0)
        FAIL(STEP_STDIO);
    /* Drop root: no supplementary groups, then gid, then uid (uid last, since changing gid
     * needs the privilege that changing uid gives up). */
    if (syscall(SYS_setgroups, 0, NULL) < 0)
        FAIL(STEP_SETGROUPS);
    if (syscall(SYS_setresgid, spec->gid, spec->gid, spec->gid) < 0)
        FAIL(STEP_SETRESGID);
    if (syscall(SYS_setresuid, spec->uid, spec->uid, spec->uid) < 0)
        FAIL(STEP_SETRESUID);
    /* No setuid binary can give privileges back; also required for Landlock as non-root. */
    if (syscall(SYS_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        FAIL(STEP_NO_NEW_PRIVS);
    /* Filesystem (system dirs read/exec, home read/write, nothing else), TCP bind denied,
     * abstract unix sockets scoped to this domain. */
    if (spec->ruleset_fd >= 0 && landlock_restrict_self_raw(spec->ruleset_fd) < 0)
        FAIL(STEP_LANDLOCK);
    /* As the sandbox uid, so ordinary permissions apply too; no symlink is followed. */
    long home = syscall(SYS_openat, AT_FDCWD, spec->home_path,
                        O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, 0);
    if (home < 0)
        FAIL(STEP_CHDIR);
    long cwd = home;
    if (spec->cwd_rel && spec->cwd_rel[0]) {
        struct open_how_raw {
            uint64_t flags, mode, resolve;
        } how = { O_PATH | O_DIRECTORY | O_CLOEXEC, 0, 0x08 | 0x04 | 0x02 };
        /* RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS */
        cwd = syscall(SYS_openat2, (int)home, spec->cwd_rel, &how, sizeof how);
        if (cwd < 0)
            FAIL(STEP_CHDIR);
    }
    if (syscall(SYS_fchdir, (int)cwd) < 0)
        FAIL(STEP_CHDIR);
    /* Per-process limits (NPROC is per uid, i.e. per sandbox). Soft = hard, so the sandbox
     * cannot raise them. After the last descriptor this child opens: it still holds a copy of
     * every server descriptor (close-on-exec), so with a busy host the home's would be numbered
     * above RLIMIT_NOFILE and refused. Nothing of the sandbox runs before the execve below. */
    for (int i = 0; i < spec->n_limits; i++) {
        struct rlimit rl = { spec->limits[i].value, spec->limits[i].value };
        if (syscall(SYS_prlimit64, 0, spec->limits[i].resource, &rl, NULL) < 0)
            FAIL(STEP_RLIMIT);
    }
    /* The server blocks SIGCHLD/SIGTERM and ignores SIGPIPE; exec would keep both. */
    struct sigaction_raw {
        void *handler;
        unsigned long flags;
        void *restorer;
        uint64_t mask;
    } dfl = { SIG_DFL, 0, NULL, 0 };
    if (syscall(SYS_rt_sigaction, SIGPIPE, &dfl, NULL, 8) < 0)
        FAIL(STEP_SIGNALS);
    uint64_t none = 0;
    if (syscall(SYS_rt_sigprocmask, SIG_SETMASK, &none, NULL, 8) < 0)
        FAIL(STEP_SIGNALS);
    int last = ENOENT;
    for (int i = 0; i < spec->n_candidates; i++) {
        syscall(SYS_execve, spec->candidates[i], spec->argv, spec->envp);
        if (errno != ENOENT && errno != ENOTDIR)
            last = errno; /* e.g. EACCES from Landlock: report it rather than ENOENT */
    }
    errno = last;
    FAIL(STEP_EXEC);
    return 127;
}

int confine_spawn(confine_spec_t *spec, pid_t *ret_pid)
{
    /* The child runs on this stack while we are suspended (CLONE_VFORK). */
    static const size_t stack_size = 64 * 1024;
    char *stack = malloc(stack_size);
    if (!stack)
        return -ENOMEM;
    spec->failed_step = STEP_NONE;
    spec->failed_errno = 0;
    int pidfd = -1;
    int flags = CLONE_VM | CLONE_VFORK | SIGCHLD | CLONE_PIDFD;
    if (spec->clone_parent)
        flags |= CLONE_PARENT; /* exit signal: the caller's own (SIGCHLD), sent to its parent */
    pid_t pid = clone(confine_child, stack + stack_size, flags, spec, &pidfd);
    if (pid < 0 && errno == EINVAL) /* a kernel without CLONE_PIDFD (before 5.2) */
        pid = clone(confine_child, stack + stack_size, flags & ~CLONE_PIDFD, spec, NULL);
    int saved = errno;
    free(stack);
    if (pid < 0)
        return -saved;
    if (spec->failed_step != STEP_NONE) {
        /* The child exited; its zombie is reaped by the SIGCHLD handler like any other. */
        safe_close(pidfd);
        return spec->failed_errno ? -spec->failed_errno : -EPERM;
    }
    spec->pidfd = pidfd; /* close-on-exec, as every pidfd */
    *ret_pid = pid;
    return 0;
}

/* kill(-1, sig) as exactly uid, from a vfork()ed helper: -errno when the helper could not
 * become uid, else 0 with kill's errno (0: sent) in *ret_errno. */
static int run_as_uid(uint32_t uid, int sig, int *ret_errno)
{
    volatile int setid_errno = 0, kill_errno = 0; /* written by the child (vfork: shared) */
    pid_t pid = vfork();
    if (pid < 0)
        return negative_errno();
    if (pid == 0) {
        /* A helper with exactly the sandbox's uid and nothing else: kill(-1) then reaches every
         * process of that uid (and only those), including setsid() escapees. */
        if (syscall(SYS_setgroups, 0, NULL) < 0 || syscall(SYS_setresgid, uid, uid, uid) < 0 ||
            syscall(SYS_setresuid, uid, uid, uid) < 0) {
            setid_errno = errno ? errno : EPERM;
            syscall(SYS_exit_group, 1);
        }
        long r = syscall(SYS_kill, -1, sig);
        kill_errno = r < 0 ? errno : 0;
        syscall(SYS_exit_group, 0);
    }
    int st;
    while (waitpid(pid, &st, __WALL) < 0 && errno == EINTR)
        ;
    if (setid_errno)
        return -setid_errno;
    *ret_errno = kill_errno;
    return 0;
}

int confine_kill_uid(uint32_t uid)
{
    int e;
    return run_as_uid(uid, SIGKILL, &e);
}

/* Whether any process has uid as its real, effective or saved uid. kill(-1, 0) from a helper
 * cannot answer this (on this kernel it reports success with nothing to signal), so look. */
int confine_uid_alive(uint32_t uid)
{
    DIR *d = opendir("/proc");
    if (!d)
        return negative_errno();
    struct dirent *de;
    int found = 0;
    while (!found && (de = readdir(d))) {
        if (de->d_name[0] < '1' || de->d_name[0] > '9')
            continue;
        char path[300], line[256];
        (void)snprintf(path, sizeof path, "/proc/%.255s/status", de->d_name);
        FILE *f = fopen(path, "re");
        if (!f)
            continue;
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "Uid:", 4) != 0)
                continue;
            unsigned long ids[4] = { 0 };
            char *q = line + 4;
            for (int k = 0; k < 3; k++) {
                while (*q == ' ' || *q == '\t')
                    q++;
                unsigned long v = 0;
                while (*q >= '0' && *q <= '9')
                    v = v * 10 + (unsigned long)(*q++ - '0');
                ids[k] = v;
            }
            found = ids[0] == uid || ids[1] == uid || ids[2] == uid;
            break;
        }
        fclose(f);
    }
    closedir(d);
    return found;
}
