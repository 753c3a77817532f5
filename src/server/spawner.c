/* SPDX-License-Identifier: MIT */
#include "spawner.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "common/log.h"
#include "isolation/cgroup.h"
#include "isolation/filter.h"
#include "pool.h"
#include "server.h"

#define SPW_MAX_FDS 12             /* stdio 3 + mntns + netns + ruleset + cgroups 4 + memfd */
#define SPW_INLINE_MAX (32 * 1024) /* larger requests travel in a memfd */
#define SPW_MAX_BLOB (64u << 20)
#define SPW_PER_HELPER 16 /* requests sent to one helper and not answered yet */
#define SPW_SLOW_MS 20    /* a spawn this long from sending to answer: its sandbox is capped */
#define SPW_STASH_MAX 4096
#define SPW_SETTLE_ROUND_MS 1000
#define SPW_SETTLE_KILL_ROUNDS 10 /* a helper silent this long is killed (its requests fail) */

/* ---- wire format ------------------------------------------------------------------------- */

typedef struct {
    uint32_t kind;
    uint32_t uid, gid;
    uint8_t has_mntns, has_netns, has_ruleset, n_cg, in_memfd, has_cwd, has_cmdcg, new_session;
    uint16_t n_limits;
    confine_limit_t limits[CONFINE_MAX_LIMITS];
    uint32_t argc, envc, ncand;
    uint32_t filtered; /* the child must run under the pool's seccomp filter (the helper's) */
    uint64_t blob_len;
    /* the sandbox's v1 groups to make or refresh (bit i: cgroups_t's v1 controller i, memory,
     * pids, cpu), its slot and limits */
    uint8_t cgprep, cmdcg_mode, pad[2];
    uint32_t cgprep_slot;
    cg_limits_t cgprep_lim;
    /* then the blob (unless in_memfd): home\0 cwd\0, candidates\0...,
     * argv\0..., envp\0..., [cmdcg root\0 name\0], [a v1 root\0 per cgprep bit]; fds in
     * this order: stdin stdout stderr [mntns] [netns] [ruleset] cgroups... [memfd] */
} spw_req_t;

#define SPW_STEP_CMDCG (-1)  /* failed_step: the command's cgroup could not be made */
#define SPW_STEP_CGPREP (-2) /* failed_step: the sandbox's cgroups could not be prepared */
#define SPW_STEP_FILTER (-3) /* failed_step: the helper could not install the seccomp filter */

typedef struct {
    int32_t r, pid, failed_step, failed_errno;
    /* the descriptors that follow, in this order: pidfd, cgroup.kill, cgroup.events (of a
     * kept group it made or opened again), the sandbox's cgroup.procs files (n_cgfds, when
     * it asked for them: cgprep) */
    uint8_t has_pidfd, has_killfd, has_eventsfd, n_cgfds;
} spw_rep_t;

#define SPW_REP_MAX_FDS (3 + CONFINE_MAX_CGROUPS)

/* ---- the helper process ------------------------------------------------------------------ */

/* The pool's seccomp filter in this helper: -1 none was given, 0 installed (every child it
 * starts inherits it), > 0 the errno of the install that failed (confined requests that need
 * it are refused). */
static int helper_filter = -1;

/* Dedicated mode: posix_spawnp's steps (own process group, stdio, chdir, default signal state:
 * the helper reset its dispositions at start, so the mask is what is left), raw syscalls only.
 * Candidates come from the server's PATH, as posix_spawnp took them. */
typedef struct {
    const confine_spec_t *spec;
    const char *cwd;
    volatile int failed_errno;
} plain_arg_t;

static int plain_child(void *arg)
{
    plain_arg_t *a = arg;
    const confine_spec_t *spec = a->spec;
    if ((spec->new_session ? syscall(SYS_setsid) < 0 : syscall(SYS_setpgid, 0, 0) < 0) ||
        syscall(SYS_dup2, spec->stdin_fd, 0) < 0 || syscall(SYS_dup2, spec->stdout_fd, 1) < 0 ||
        syscall(SYS_dup2, spec->stderr_fd, 2) < 0 ||
        (spec->new_session && syscall(SYS_ioctl, 0, TIOCSCTTY, 0) < 0) ||
        (a->cwd && syscall(SYS_chdir, a->cwd) < 0))
        goto fail;
    /* the one disposition the helper keeps from the server (confined children inherit it) */
    struct {
        void *handler;
        unsigned long flags;
        void *restorer;
        uint64_t mask;
    } dfl = { SIG_DFL, 0, NULL, 0 };
    uint64_t none = 0;
    if (syscall(SYS_rt_sigaction, SIGXFSZ, &dfl, NULL, 8) < 0 ||
        syscall(SYS_rt_sigprocmask, SIG_SETMASK, &none, NULL, 8) < 0)
        goto fail;
    int last = ENOENT;
    for (int i = 0; i < spec->n_candidates; i++) {
        syscall(SYS_execve, spec->candidates[i], spec->argv, spec->envp);
        if (errno == EACCES)
            last = EACCES; /* keep looking, as execvp does, but report it */
        else if (errno != ENOENT && errno != ENOTDIR) {
            last = errno;
            break;
        }
    }
    errno = last;
fail:
    a->failed_errno = errno ? errno : EIO;
    syscall(SYS_exit_group, 127);
    return 127;
}

static int plain_spawn(confine_spec_t *spec, const char *cwd, pid_t *ret_pid)
{
    static const size_t stack_size = 64 * 1024;
    char *stack = malloc(stack_size);
    plain_arg_t a = { .spec = spec, .cwd = cwd };
    int pidfd = -1;
    if (!stack)
        return -ENOMEM;
    int flags = CLONE_VM | CLONE_VFORK | CLONE_PARENT | CLONE_PIDFD | SIGCHLD;
    pid_t pid = clone(plain_child, stack + stack_size, flags, &a, &pidfd);
    if (pid < 0 && errno == EINVAL)
        pid = clone(plain_child, stack + stack_size, flags & ~CLONE_PIDFD, &a, NULL);
    int saved = errno;
    free(stack);
    if (pid < 0)
        return -saved;
    if (a.failed_errno) {
        safe_close(pidfd);
        return -a.failed_errno;
    }
    spec->pidfd = pidfd;
    *ret_pid = pid;
    return 0;
}

/* Split n NUL-terminated strings off *p (within end) into v (NULL-terminated). */
static int take_strv(const char **p, const char *end, uint32_t n, char **v)
{
    for (uint32_t i = 0; i < n; i++) {
        const char *z = memchr(*p, '\0', (size_t)(end - *p));
        if (!z)
            return -EINVAL;
        v[i] = (char *)*p;
        *p = z + 1;
    }
    v[n] = NULL;
    return 0;
}

static int helper_run_one(const spw_req_t *q, const char *blob, const int *fds, int nfds,
                          spw_rep_t *rep, int *ret_pidfd, int *ret_killfd, int *ret_eventsfd,
                          int *ret_cgfds)
{
    const char *p = blob, *end = blob + q->blob_len;
    confine_spec_t spec = { .mntns_fd = -1, .netns_fd = -1, .ruleset_fd = -1, .pidfd = -1 };
    int k = 3, r;
    if (nfds < 3 || q->n_cg > CONFINE_MAX_CGROUPS || q->n_limits > CONFINE_MAX_LIMITS ||
        q->ncand == 0 || q->ncand > CONFINE_MAX_CANDIDATES || q->argc == 0)
        return -EINVAL;
    /* Fail closed: a child that must run under the filter starts only from a helper that has
     * it installed (the child inherits it at the clone, before its first step). */
    if (q->kind == SPAWN_CONFINED && q->filtered && helper_filter != 0) {
        int e = helper_filter > 0 ? helper_filter : EINVAL;
        *rep = (spw_rep_t){ .r = -e, .failed_step = SPW_STEP_FILTER, .failed_errno = e };
        return 0;
    }
    spec.new_session = q->new_session != 0;
    spec.stdin_fd = fds[0];
    spec.stdout_fd = fds[1];
    spec.stderr_fd = fds[2];
    if (q->has_mntns)
        spec.mntns_fd = k < nfds ? fds[k++] : -1;
    if (q->has_netns)
        spec.netns_fd = k < nfds ? fds[k++] : -1;
    if (q->has_ruleset)
        spec.ruleset_fd = k < nfds ? fds[k++] : -1;
    for (int i = 0; i < CONFINE_MAX_CGROUPS; i++)
        spec.cgroup_procs_fds[i] = i < q->n_cg && k < nfds ? fds[k++] : -1;
    if (k > nfds)
        return -EINVAL;
    char *strs[2 + CONFINE_MAX_CANDIDATES + 1];
    if (take_strv(&p, end, 2 + q->ncand, strs) < 0)
        return -EINVAL;
    spec.home_path = strs[0];
    spec.cwd_rel = strs[1];
    for (uint32_t i = 0; i < q->ncand; i++)
        spec.candidates[i] = strs[2 + i];
    spec.n_candidates = (int)q->ncand;
    char **argv = calloc((size_t)q->argc + q->envc + 2, sizeof *argv);
    if (!argv)
        return -ENOMEM;
    char **envp = argv + q->argc + 1;
    if (take_strv(&p, end, q->argc, argv) < 0 || take_strv(&p, end, q->envc, envp) < 0) {
        free(argv);
        return -EINVAL;
    }
    spec.argv = argv;
    spec.envp = envp;
    char *cg[3] = { NULL, NULL, NULL };
    if (q->has_cmdcg && take_strv(&p, end, 2, cg) < 0) {
        free(argv);
        return -EINVAL;
    }
    /* The sandbox's own groups, when it has none open: made or refreshed here (a mkdir, the
     * limits and an open of cgroup.procs per controller), joined first, and handed back. */
    int ncg = q->n_cg;
    if (q->cgprep) {
        cgroups_t lc = { .enabled = true };
        char *roots[3 + 1]; /* take_strv ends the vector with NULL */
        int nroots = __builtin_popcount(q->cgprep & 7), k2 = 0;
        if (ncg != 0 || (q->cgprep & ~7) || take_strv(&p, end, (uint32_t)nroots, roots) < 0) {
            free(argv);
            return -EINVAL;
        }
        bool *have[3] = { &lc.v1_memory, &lc.v1_pids, &lc.v1_cpu };
        for (int i = 0; i < 3; i++) {
            if (!(q->cgprep & (1 << i)))
                continue;
            *have[i] = true;
            if (snprintf(lc.v1_root[i], sizeof lc.v1_root[i], "%s", roots[k2++]) >=
                (int)sizeof lc.v1_root[i]) {
                free(argv);
                return -EINVAL;
            }
        }
        r = cgroup_prepare(&lc, q->cgprep_slot, &q->cgprep_lim, ret_cgfds, CONFINE_MAX_CGROUPS);
        if (r < 0) {
            free(argv);
            *rep = (spw_rep_t){ .r = r, .failed_step = SPW_STEP_CGPREP, .failed_errno = -r };
            return 0;
        }
        while (ncg < CONFINE_MAX_CGROUPS - 1 && ret_cgfds[ncg] >= 0) {
            spec.cgroup_procs_fds[ncg] = ret_cgfds[ncg];
            ncg++;
        }
        rep->n_cgfds = (uint8_t)ncg;
    }
    /* The command's group, joined by the child after the sandbox's groups: one of its own made
     * here (a mkdir and two opens in cgroupfs), removed again if the child does not start; or
     * one of the sandbox's kept groups, opened (made if missing, refused if not empty). */
    int procs = -1, killfd = -1, eventsfd = -1;
    if (q->has_cmdcg) {
        if (ncg >= CONFINE_MAX_CGROUPS || q->cmdcg_mode > CMDCG_KEEP) {
            free(argv);
            return -EINVAL;
        }
        r = cgroup_cmd_create_at(cg[0], cg[1], &procs, &killfd,
                                 q->cmdcg_mode == CMDCG_KEEP ? &eventsfd : NULL);
        if (r < 0) {
            free(argv);
            *rep = (spw_rep_t){
                .r = r, .failed_step = SPW_STEP_CMDCG, .failed_errno = -r, .n_cgfds = rep->n_cgfds
            };
            return 0;
        }
        spec.cgroup_procs_fds[ncg] = procs;
    }
    pid_t pid = 0;
    if (q->kind == SPAWN_CONFINED) {
        spec.uid = q->uid;
        spec.gid = q->gid;
        memcpy(spec.limits, q->limits, sizeof spec.limits);
        spec.n_limits = q->n_limits;
        spec.clone_parent = true;
        r = confine_spawn(&spec, &pid);
    } else if (q->kind == SPAWN_PLAIN)
        r = plain_spawn(&spec, q->has_cwd ? spec.home_path : NULL, &pid);
    else
        r = -EINVAL;
    free(argv);
    safe_close(procs);
    if (r < 0 && killfd >= 0 && q->cmdcg_mode == CMDCG_OWN) {
        char dir[300];
        killfd = safe_close(killfd);
        if (snprintf(dir, sizeof dir, "%s/%s", cg[0], cg[1]) < (int)sizeof dir)
            (void)rmdir(dir); /* the child that failed is gone: the group is empty */
    }
    rep->r = r;
    rep->pid = r >= 0 ? pid : 0;
    rep->failed_step = spec.failed_step;
    rep->failed_errno = spec.failed_errno; /* n_cgfds stays: the groups were made */
    *ret_pidfd = r >= 0 ? spec.pidfd : -1;
    /* a kept group's handles come back either way: it stays, empty, for the next command */
    *ret_killfd = r >= 0 || q->cmdcg_mode != CMDCG_OWN ? killfd : safe_close(killfd);
    *ret_eventsfd = eventsfd;
    return 0;
}

static void helper_reply(int sock, spw_rep_t *rep, int pidfd, int killfd, int eventsfd,
                         const int *cgfds)
{
    union {
        char buf[CMSG_SPACE(SPW_REP_MAX_FDS * sizeof(int))];
        struct cmsghdr align;
    } u;
    int fds[SPW_REP_MAX_FDS], n = 0;
    rep->has_pidfd = pidfd >= 0;
    rep->has_killfd = killfd >= 0;
    rep->has_eventsfd = eventsfd >= 0;
    if (pidfd >= 0)
        fds[n++] = pidfd;
    if (killfd >= 0)
        fds[n++] = killfd;
    if (eventsfd >= 0)
        fds[n++] = eventsfd;
    for (int i = 0; i < rep->n_cgfds && i < CONFINE_MAX_CGROUPS; i++)
        fds[n++] = cgfds[i];
    struct iovec iov = { (void *)rep, sizeof *rep };
    struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };
    if (n > 0) {
        memset(&u, 0, sizeof u);
        m.msg_control = u.buf;
        m.msg_controllen = CMSG_SPACE((size_t)n * sizeof(int));
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN((size_t)n * sizeof(int));
        memcpy(CMSG_DATA(c), fds, (size_t)n * sizeof(int));
    }
    while (sendmsg(sock, &m, MSG_NOSIGNAL) < 0)
        if (errno != EINTR)
            _exit(1); /* the server is gone */
}

/* The helper's loop: one request, one answer, in order, until the server closes the socket. */
static _Noreturn void helper_main(int sock)
{
    _Static_assert(sizeof(spw_req_t) % 8 == 0, "the blob after the header stays aligned");
    char msg[sizeof(spw_req_t) + SPW_INLINE_MAX] __attribute__((aligned(16)));
    union {
        char buf[CMSG_SPACE(SPW_MAX_FDS * sizeof(int))];
        struct cmsghdr align;
    } u;
    for (;;) {
        struct iovec iov = { msg, sizeof msg };
        struct msghdr m = {
            .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf
        };
        ssize_t n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            _exit(0);
        int fds[SPW_MAX_FDS], nfds = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
                int cnt = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
                for (int i = 0; i < cnt && nfds < SPW_MAX_FDS; i++)
                    memcpy(&fds[nfds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            }
        spw_rep_t rep = { .r = -EINVAL };
        int pidfd = -1, killfd = -1, eventsfd = -1;
        int cgfds[CONFINE_MAX_CGROUPS] = { -1, -1, -1, -1 };
        spw_req_t q = { 0 };
        const char *blob = NULL;
        void *map = MAP_FAILED;
        int memfd = -1;
        if ((size_t)n >= sizeof q && !(m.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
            memcpy(&q, msg, sizeof q);
            if (q.in_memfd && nfds > 0) {
                memfd = fds[--nfds]; /* the request itself, not one of the spawn's fds */
                if (q.blob_len > 0 && q.blob_len <= SPW_MAX_BLOB)
                    map = mmap(NULL, q.blob_len, PROT_READ, MAP_PRIVATE, memfd, 0);
                blob = map == MAP_FAILED ? NULL : map;
            } else if (!q.in_memfd && q.blob_len == (uint64_t)n - sizeof q)
                blob = msg + sizeof q;
            if (blob &&
                helper_run_one(&q, blob, fds, nfds, &rep, &pidfd, &killfd, &eventsfd, cgfds) < 0) {
                rep.r = -EINVAL;
                rep.n_cgfds = 0;
            }
        }
        if (map != MAP_FAILED)
            munmap(map, q.blob_len);
        for (int i = 0; i < nfds; i++)
            close(fds[i]);
        if (memfd >= 0)
            close(memfd);
        helper_reply(sock, &rep, pidfd, killfd, eventsfd, cgfds);
        if (pidfd >= 0)
            close(pidfd);
        if (killfd >= 0)
            close(killfd);
        if (eventsfd >= 0)
            close(eventsfd);
        for (int i = 0; i < CONFINE_MAX_CGROUPS && cgfds[i] >= 0; i++)
            close(cgfds[i]);
    }
}

/* In the forked child: a tiny file table, default signal dispositions, gone with the server,
 * and the pool's seccomp filter (filter: NULL in dedicated mode). */
static _Noreturn void helper_enter(int sock, pid_t server, const seccomp_filter_t *filter)
{
    (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != server)
        _exit(0);
    (void)prctl(PR_SET_NAME, "sbx-spawner");
    if (sock != 3) {
        if (dup2(sock, 3) < 0)
            _exit(1);
        sock = 3;
    }
    (void)fcntl(sock, F_SETFD, FD_CLOEXEC);
    if (syscall(SYS_close_range, 4u, ~0u, 0u) < 0) {
        struct rlimit rl;
        rlim_t max = getrlimit(RLIMIT_NOFILE, &rl) == 0 ? rl.rlim_cur : 65536;
        for (rlim_t fd = 4; fd < max; fd++)
            (void)close((int)fd);
    }
    /* The server ignores SIGPIPE and SIGXFSZ; children start with what posix_spawn's
     * POSIX_SPAWN_SETSIGDEF gave them (confine_child resets SIGPIPE itself, as before). */
    for (int sig = 1; sig < NSIG; sig++)
        if (sig != SIGKILL && sig != SIGSTOP && sig != SIGXFSZ)
            (void)signal(sig, SIG_DFL);
    /* Once, as root (no NO_NEW_PRIVS needed): the kernel compiles the program here instead
     * of in every child. Nothing this process does needs a refused call. */
    if (filter)
        helper_filter = seccomp_filter_load_raw(filter) < 0 ? (errno ? errno : EIO) : 0;
    helper_main(sock);
}

/* ---- the server's side ------------------------------------------------------------------- */

typedef struct job job_t;
struct job {
    job_t *next;
    spawner_cb cb;
    void *data;
    sandbox_t *sb; /* a reference, counted in sb->spawning */
    bool sent;     /* to a helper: counted in sb->spawns_sent too */
    uint64_t sent_ms;
    char *msg; /* unsent: the request */
    size_t msg_len;
    int fds[SPW_MAX_FDS], nfds;
    int owned[SPW_MAX_FDS], n_owned; /* closed once sent */
};

typedef struct {
    spawner_t *sp;
    pid_t pid;
    int fd;
    watcher_t w;
    child_t child;
    job_t *head, *tail; /* sent, answers due in this order */
    size_t inflight;
    unsigned silent_rounds;
} helper_t;

typedef struct {
    pid_t pid;
    int wstatus;
} stashed_t;

struct spawner {
    server_t *srv;
    const seccomp_filter_t *filter; /* the pool's, installed in each helper; NULL: none */
    size_t n;
    helper_t h[SPAWNER_MAX_HELPERS];
    job_t *queue_head, *queue_tail; /* not sent yet: every helper has SPW_PER_HELPER */
    size_t pending;                 /* queued + sent */
    stashed_t *stash;
    size_t n_stash, cap_stash;
};

static void job_free(job_t *j)
{
    for (int i = 0; i < j->n_owned; i++)
        safe_close(j->owned[i]);
    free(j->msg);
    if (j->sb) {
        j->sb->spawning--;
        sandbox_unref(j->sb);
    }
    free(j);
}

static void settle_pid(spawner_t *sp, pid_t pid, int pidfd);

/* The sandbox's cgroup.procs files a helper made (cgprep): its own from now on, unless it has
 * a set already (two first commands at once) or is gone. Either way its groups exist with
 * its limits now. */
static void adopt_cgroups(sandbox_t *sb, int *cgfds, int n)
{
    bool take = sb && !sb->deleted && sb->cg_fds[0] < 0 && n > 0;
    for (int i = 0; i < n; i++) {
        if (take)
            sb->cg_fds[i] = cgfds[i];
        else
            safe_close(cgfds[i]);
    }
    if (take)
        sb->cg_fds[n] = -1;
    if (sb && n > 0)
        sb->cg_ready = true;
}

/* One answer: the callback, then the child's exit if server_reap() saw it first. */
static void job_done(spawner_t *sp, job_t *j, int r, pid_t pid, int killfd, int eventsfd, int pidfd,
                     int *cgfds, int n_cgfds, const char *err)
{
    sp->pending--;
    sandbox_t *sb = j->sb;
    j->sb = NULL;
    adopt_cgroups(sb, cgfds, n_cgfds);
    if (sb)
        sb->spawning--;
    if (sb && j->sent && sb->spawns_sent > 0)
        sb->spawns_sent--;
    if (sb && j->sent) /* its children slow to start (its CPU share starved), or not now */
        sb->spawn_slow = loop_now_ms(sp->srv->loop) - j->sent_ms >= SPW_SLOW_MS;
    j->cb(j->data, r, pid, killfd, eventsfd, err);
    sandbox_unref(sb);
    if (r >= 0)
        settle_pid(sp, pid, pidfd);
    safe_close(pidfd);
    job_free(j);
    if (sp->pending == 0)
        sp->n_stash = 0; /* nothing in flight: what was kept were orphans */
}

static void helper_on_event(loop_t *l, watcher_t *w, uint32_t ev);
static void helper_on_exit(child_t *ch, int wstatus);

static int helper_start(spawner_t *sp, helper_t *h)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
        return negative_errno();
    /* Room for SPW_PER_HELPER inline requests either way. */
    int sz = (int)(SPW_PER_HELPER * (sizeof(spw_req_t) + SPW_INLINE_MAX));
    (void)setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
    (void)setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
    pid_t server = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        int r = negative_errno();
        safe_close(sv[0]);
        safe_close(sv[1]);
        return r;
    }
    if (pid == 0) {
        close(sv[0]);
        helper_enter(sv[1], server, sp->filter);
    }
    safe_close(sv[1]);
    (void)fcntl(sv[0], F_SETFL, O_NONBLOCK);
    *h = (helper_t){ .sp = sp, .pid = pid, .fd = sv[0] };
    watcher_init(&h->w, sv[0], helper_on_event, h);
    h->child = (child_t){ .pid = pid, .on_exit = helper_on_exit, .data = h };
    server_child_add(sp->srv, &h->child);
    int r = loop_watch(sp->srv->loop, &h->w, EPOLLIN);
    if (r < 0) {
        (void)kill(pid, SIGKILL);
        h->fd = safe_close(h->fd);
        return r;
    }
    log_debug("spawn helper %d started", (int)pid);
    return 0;
}

/* The helper is gone (or must be): what it had in flight fails; nothing is retried, since a
 * request may have started its child before the helper died. */
static void helper_fail(helper_t *h, const char *why)
{
    spawner_t *sp = h->sp;
    if (h->fd >= 0) {
        loop_unwatch(sp->srv->loop, &h->w);
        h->fd = safe_close(h->fd);
        if (h->pid > 0)
            (void)kill(h->pid, SIGKILL);
        log_warn("spawn helper %d: %s", (int)h->pid, why);
    }
    while (h->head) {
        job_t *j = h->head;
        h->head = j->next;
        h->inflight--;
        char err[96];
        (void)snprintf(err, sizeof err, "the spawn helper died (%s)", why);
        job_done(sp, j, -EPIPE, 0, -1, -1, -1, NULL, 0, err);
    }
    h->tail = NULL;
}

static void spawner_pump(spawner_t *sp);

static void helper_on_exit(child_t *ch, int wstatus)
{
    helper_t *h = ch->data;
    (void)wstatus;
    h->pid = 0;
    helper_fail(h, "it exited");
    if (h->sp->queue_head)
        spawner_pump(h->sp); /* requests that waited for a slot: a fresh helper takes them */
}

static int job_send(helper_t *h, job_t *j)
{
    union {
        char buf[CMSG_SPACE(SPW_MAX_FDS * sizeof(int))];
        struct cmsghdr align;
    } u;
    memset(&u, 0, sizeof u);
    struct iovec iov = { j->msg, j->msg_len };
    struct msghdr m = { .msg_iov = &iov,
                        .msg_iovlen = 1,
                        .msg_control = u.buf,
                        .msg_controllen = CMSG_SPACE((size_t)j->nfds * sizeof(int)) };
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN((size_t)j->nfds * sizeof(int));
    memcpy(CMSG_DATA(c), j->fds, (size_t)j->nfds * sizeof(int));
    ssize_t n;
    do
        n = sendmsg(h->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return negative_errno();
    /* The helper holds its own copies now. */
    for (int i = 0; i < j->n_owned; i++)
        j->owned[i] = safe_close(j->owned[i]);
    j->n_owned = 0;
    free(j->msg);
    j->msg = NULL;
    j->next = NULL;
    if (h->tail)
        h->tail->next = j;
    else
        h->head = j;
    h->tail = j;
    h->inflight++;
    j->sent = true;
    j->sent_ms = loop_now_ms(h->sp->srv->loop);
    if (j->sb)
        j->sb->spawns_sent++;
    return 0;
}

/* A sandbox whose last spawn took SPW_SLOW_MS or more from its sending to its answer (its
 * children slow to start, its own CPU share starved: each holds its helper until its execve)
 * has this many sent and not answered at most: all helpers but one, so that it always leaves
 * one to its siblings (whose execs waited 0.4-0.7 s behind its spawns). Others have no cap
 * beyond the helpers' (one sandbox's parallel execs keep every helper busy). */
static unsigned per_sandbox_max(const spawner_t *sp) { return sp->n > 1 ? (unsigned)sp->n - 1 : 1; }

/* The first queued job that may be sent now (a slow sandbox under per_sandbox_max; each
 * sandbox's own jobs keep their order), taken out of the queue; NULL if none. */
static job_t *queue_take(spawner_t *sp)
{
    for (job_t **pp = &sp->queue_head, *prev = NULL; *pp; prev = *pp, pp = &(*pp)->next) {
        job_t *j = *pp;
        if (j->sb && j->sb->spawn_slow && j->sb->spawns_sent >= per_sandbox_max(sp))
            continue;
        *pp = j->next;
        if (sp->queue_tail == j)
            sp->queue_tail = prev;
        j->next = NULL;
        return j;
    }
    return NULL;
}

/* Put j back at the front of the queue (its helper's socket was full). */
static void queue_put_back(spawner_t *sp, job_t *j)
{
    j->next = sp->queue_head;
    sp->queue_head = j;
    if (!sp->queue_tail)
        sp->queue_tail = j;
}

/* Send what is queued to the helpers with room (starting a helper where a slot is empty). */
static void spawner_pump(spawner_t *sp)
{
    while (sp->queue_head) {
        helper_t *best = NULL;
        bool live = false, waiting = false;
        for (size_t i = 0; i < sp->n; i++) {
            helper_t *h = &sp->h[i];
            if (h->fd < 0 && h->pid == 0 && helper_start(sp, h) < 0)
                continue;
            live |= h->fd >= 0;
            waiting |= h->fd < 0 && h->pid > 0; /* dying: restarted once reaped */
            if (h->fd >= 0 && h->inflight < SPW_PER_HELPER &&
                (!best || h->inflight < best->inflight))
                best = h;
        }
        if (!best && !live && !waiting) {
            /* no helper could be started (fork failed): fail rather than wait for nothing */
            job_t *j = sp->queue_head;
            sp->queue_head = j->next;
            if (!sp->queue_head)
                sp->queue_tail = NULL;
            job_done(sp, j, -EAGAIN, 0, -1, -1, -1, NULL, 0, "cannot start a spawn helper");
            continue;
        }
        if (!best)
            return; /* answers (or a restart) will make room */
        job_t *j = queue_take(sp);
        if (!j)
            return; /* every queued job's sandbox has its share in flight: answers come */
        int r = job_send(best, j);
        if (r == -EAGAIN) { /* its socket is full: back to the front, wait for answers */
            queue_put_back(sp, j);
            return;
        }
        if (r < 0) {
            helper_fail(best, "cannot send to it");
            job_done(sp, j, r, 0, -1, -1, -1, NULL, 0, "cannot reach a spawn helper");
        }
    }
}

static void helper_read(helper_t *h)
{
    spawner_t *sp = h->sp;
    for (int i = 0; i < 64 && h->fd >= 0; i++) {
        spw_rep_t rep;
        union {
            char buf[CMSG_SPACE(SPW_REP_MAX_FDS * sizeof(int))];
            struct cmsghdr align;
        } u;
        struct iovec iov = { &rep, sizeof rep };
        struct msghdr m = {
            .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf
        };
        ssize_t n = recvmsg(h->fd, &m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            return;
        int fds[SPW_REP_MAX_FDS], nf = 0, pidfd = -1, killfd = -1, eventsfd = -1;
        int cgfds[CONFINE_MAX_CGROUPS], ncg = 0;
        for (struct cmsghdr *c = n > 0 ? CMSG_FIRSTHDR(&m) : NULL; c; c = CMSG_NXTHDR(&m, c))
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
                for (size_t k = 0;
                     k < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int) && nf < SPW_REP_MAX_FDS; k++)
                    memcpy(&fds[nf++], CMSG_DATA(c) + k * sizeof(int), sizeof(int));
        if (n == (ssize_t)sizeof rep) {
            int k = 0;
            if (rep.has_pidfd && k < nf)
                pidfd = fds[k++];
            if (rep.has_killfd && k < nf)
                killfd = fds[k++];
            if (rep.has_eventsfd && k < nf)
                eventsfd = fds[k++];
            while (ncg < rep.n_cgfds && ncg < CONFINE_MAX_CGROUPS - 1 && k < nf)
                cgfds[ncg++] = fds[k++];
            for (; k < nf; k++)
                safe_close(fds[k]);
        } else
            for (int k = 0; k < nf; k++)
                safe_close(fds[k]);
        if (n != (ssize_t)sizeof rep || !h->head) {
            safe_close(pidfd);
            safe_close(killfd);
            safe_close(eventsfd);
            for (int k = 0; k < ncg; k++)
                safe_close(cgfds[k]);
            helper_fail(h, n == 0 ? "it closed its socket" : "a malformed answer");
            return;
        }
        h->silent_rounds = 0;
        job_t *j = h->head;
        h->head = j->next;
        if (!h->head)
            h->tail = NULL;
        h->inflight--;
        char err[160] = "";
        if (rep.r < 0) {
            if (rep.failed_step == SPW_STEP_CMDCG)
                (void)snprintf(err, sizeof err, "cannot prepare the command's cgroup: %s",
                               strerror(-rep.r));
            else if (rep.failed_step == SPW_STEP_CGPREP)
                (void)snprintf(err, sizeof err, "cannot prepare the sandbox cgroup: %s",
                               strerror(-rep.r));
            else if (rep.failed_step == SPW_STEP_FILTER)
                (void)snprintf(err, sizeof err,
                               "seccomp failed: the spawn helper could not install the filter: %s",
                               strerror(-rep.r));
            else if (rep.failed_step > 0)
                (void)snprintf(err, sizeof err, "%s failed: %s", confine_step_name(rep.failed_step),
                               strerror(-rep.r));
            else
                (void)snprintf(err, sizeof err, "%s", strerror(-rep.r));
        }
        job_done(sp, j, rep.r, rep.pid, killfd, eventsfd, pidfd, cgfds, ncg, err);
    }
}

static void helper_on_event(loop_t *l, watcher_t *w, uint32_t ev)
{
    helper_t *h = w->data;
    (void)l;
    if (ev & EPOLLIN)
        helper_read(h);
    if (h->fd >= 0 && (ev & (EPOLLHUP | EPOLLERR)) && !(ev & EPOLLIN))
        helper_fail(h, "its socket hung up");
    spawner_pump(h->sp);
}

int spawner_new(server_t *srv, spawner_t **ret)
{
    spawner_t *sp = calloc(1, sizeof *sp);
    if (!sp)
        return -ENOMEM;
    sp->srv = srv;
    if (srv->pool && srv->pool->have_seccomp)
        sp->filter = &srv->pool->seccomp;
    /* the CPUs this process may run on (a run's cpuset), not all the machine has */
    cpu_set_t set;
    long cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                            : sysconf(_SC_NPROCESSORS_ONLN);
    sp->n = cpus < 1 ? 1 : cpus > SPAWNER_MAX_HELPERS ? SPAWNER_MAX_HELPERS : (size_t)cpus;
    for (size_t i = 0; i < sp->n; i++)
        sp->h[i] = (helper_t){ .sp = sp, .fd = -1 };
    for (size_t i = 0; i < sp->n; i++) {
        int r = helper_start(sp, &sp->h[i]);
        if (r < 0) {
            spawner_free(sp);
            return r;
        }
    }
    *ret = sp;
    return 0;
}

spawner_t *spawner_free(spawner_t *sp)
{
    if (!sp)
        return NULL;
    while (sp->queue_head) {
        job_t *j = sp->queue_head;
        sp->queue_head = j->next;
        job_done(sp, j, -ECANCELED, 0, -1, -1, -1, NULL, 0, "the server is shutting down");
    }
    for (size_t i = 0; i < sp->n; i++) {
        helper_t *h = &sp->h[i];
        if (h->pid > 0)
            server_child_remove(sp->srv, &h->child);
        if (h->fd >= 0) {
            loop_unwatch(sp->srv->loop, &h->w);
            h->fd = safe_close(h->fd); /* EOF: it exits */
        }
        h->pid = 0;
        helper_fail(h, "shutdown");
    }
    free(sp->stash);
    free(sp);
    return NULL;
}

/* ---- requests ---------------------------------------------------------------------------- */

static size_t strv_bytes(char *const *v, uint32_t *count)
{
    size_t n = 0;
    uint32_t k = 0;
    for (; v && v[k]; k++)
        n += strlen(v[k]) + 1;
    *count = k;
    return n;
}

static char *put_str(char *d, const char *s)
{
    size_t n = strlen(s) + 1;
    memcpy(d, s, n);
    return d + n;
}

static int memfd_with(const char *p, size_t n)
{
    int fd = (int)syscall(SYS_memfd_create, "sbx-spawn", MFD_CLOEXEC);
    if (fd < 0)
        return negative_errno();
    for (size_t off = 0; off < n;) {
        ssize_t w = write(fd, p + off, n - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            int r = w < 0 ? negative_errno() : -EIO;
            safe_close(fd);
            return r;
        }
        off += (size_t)w;
    }
    return fd;
}

/* Serialize spec into j (strings copied; descriptors recorded, not duplicated). */
static int job_build(job_t *j, int kind, const confine_spec_t *spec, const cmdcg_req_t *cgq,
                     bool filtered)
{
    bool cmdcg = kind == SPAWN_CONFINED && cgq && cgq->root;
    spw_req_t q = { .kind = (uint32_t)kind, .filtered = kind == SPAWN_CONFINED && filtered };
    size_t blob = 0;
    uint32_t argc, envc;
    blob += strlen(spec->home_path ? spec->home_path : "") + 1;
    blob += strlen(spec->cwd_rel ? spec->cwd_rel : "") + 1;
    for (int i = 0; i < spec->n_candidates; i++)
        blob += strlen(spec->candidates[i]) + 1;
    blob += strv_bytes(spec->argv, &argc) + strv_bytes(spec->envp, &envc);
    if (cmdcg)
        blob += strlen(cgq->root) + 1 + strlen(cgq->name) + 1;
    const cgroups_t *prep = kind == SPAWN_CONFINED && cgq ? cgq->prep : NULL;
    const bool prep_have[3] = { prep && prep->v1_memory, prep && prep->v1_pids,
                                prep && prep->v1_cpu };
    for (int i = 0; i < 3; i++)
        if (prep_have[i]) {
            blob += strlen(prep->v1_root[i]) + 1;
            q.cgprep |= (uint8_t)(1 << i);
        }
    if (q.cgprep) {
        q.cgprep_slot = cgq->prep_slot;
        q.cgprep_lim = cgq->prep_lim;
    }
    if (blob > SPW_MAX_BLOB)
        return -E2BIG;
    q.uid = spec->uid;
    q.gid = spec->gid;
    q.has_cwd = spec->home_path != NULL;
    q.new_session = spec->new_session;
    q.n_limits = (uint16_t)spec->n_limits;
    memcpy(q.limits, spec->limits, sizeof q.limits);
    q.argc = argc;
    q.envc = envc;
    q.ncand = (uint32_t)spec->n_candidates;
    q.blob_len = blob;
    q.in_memfd = blob > SPW_INLINE_MAX;
    char *b = malloc(sizeof q + blob);
    if (!b)
        return -ENOMEM;
    char *d = b + sizeof q;
    d = put_str(d, spec->home_path ? spec->home_path : "");
    d = put_str(d, spec->cwd_rel ? spec->cwd_rel : "");
    for (int i = 0; i < spec->n_candidates; i++)
        d = put_str(d, spec->candidates[i]);
    for (uint32_t i = 0; i < argc; i++)
        d = put_str(d, spec->argv[i]);
    for (uint32_t i = 0; i < envc; i++)
        d = put_str(d, spec->envp[i]);
    if (cmdcg) {
        d = put_str(d, cgq->root);
        d = put_str(d, cgq->name);
        q.has_cmdcg = 1;
        q.cmdcg_mode = (uint8_t)cgq->mode;
    }
    for (int i = 0; i < 3; i++)
        if (prep_have[i])
            d = put_str(d, prep->v1_root[i]);
    j->fds[j->nfds++] = spec->stdin_fd;
    j->fds[j->nfds++] = spec->stdout_fd;
    j->fds[j->nfds++] = spec->stderr_fd;
    if (kind == SPAWN_CONFINED) {
        if ((q.has_mntns = spec->mntns_fd >= 0))
            j->fds[j->nfds++] = spec->mntns_fd;
        if ((q.has_netns = spec->netns_fd >= 0))
            j->fds[j->nfds++] = spec->netns_fd;
        if ((q.has_ruleset = spec->ruleset_fd >= 0))
            j->fds[j->nfds++] = spec->ruleset_fd;
        for (int i = 0; i < CONFINE_MAX_CGROUPS && spec->cgroup_procs_fds[i] >= 0; i++) {
            j->fds[j->nfds++] = spec->cgroup_procs_fds[i];
            q.n_cg++;
        }
    }
    if (q.in_memfd) {
        int mfd = memfd_with(b + sizeof q, blob);
        if (mfd < 0) {
            free(b);
            return mfd;
        }
        j->fds[j->nfds++] = mfd;
        j->owned[j->n_owned++] = mfd;
        j->msg_len = sizeof q;
    } else
        j->msg_len = sizeof q + blob;
    memcpy(b, &q, sizeof q);
    j->msg = b;
    return 0;
}

int spawner_submit(spawner_t *sp, int kind, const confine_spec_t *spec, const cmdcg_req_t *cmdcg,
                   const int *owned, int n_owned, sandbox_t *sb, spawner_cb cb, void *data)
{
    job_t *j = calloc(1, sizeof *j);
    if (!j || n_owned > SPW_MAX_FDS - 1) {
        for (int i = 0; i < n_owned; i++)
            safe_close(owned[i]);
        free(j);
        return -ENOMEM;
    }
    for (int i = 0; i < n_owned; i++)
        j->owned[j->n_owned++] = owned[i];
    int r = job_build(j, kind, spec, cmdcg, sp->filter != NULL);
    if (r < 0) {
        job_free(j);
        return r;
    }
    j->cb = cb;
    j->data = data;
    if (sb) {
        j->sb = sandbox_ref(sb);
        sb->spawning++;
    }
    if (sp->queue_tail)
        sp->queue_tail->next = j;
    else
        sp->queue_head = j;
    sp->queue_tail = j;
    sp->pending++;
    spawner_pump(sp);
    return 0;
}

void spawner_settle_sandbox(spawner_t *sp, sandbox_t *sb)
{
    if (!sp || sb->spawning == 0)
        return;
    /* never sent: nothing started, nothing will */
    for (job_t **pp = &sp->queue_head, *prev = NULL; *pp;) {
        job_t *j = *pp;
        if (j->sb != sb) {
            prev = j;
            pp = &j->next;
            continue;
        }
        *pp = j->next;
        if (sp->queue_tail == j)
            sp->queue_tail = prev;
        job_done(sp, j, -ESRCH, 0, -1, -1, -1, NULL, 0, "sandbox has been deleted");
    }
    /* sent: their answers (and so their children, if any) come before the teardown */
    while (sb->spawning > 0) {
        struct pollfd pfd[SPAWNER_MAX_HELPERS];
        helper_t *hs[SPAWNER_MAX_HELPERS];
        nfds_t n = 0;
        for (size_t i = 0; i < sp->n; i++)
            if (sp->h[i].fd >= 0 && sp->h[i].head) {
                pfd[n] = (struct pollfd){ .fd = sp->h[i].fd, .events = POLLIN };
                hs[n++] = &sp->h[i];
            }
        if (n == 0)
            break; /* cannot happen: a sent request sits on a live helper */
        int r = poll(pfd, n, SPW_SETTLE_ROUND_MS);
        if (r < 0 && errno != EINTR)
            break;
        for (nfds_t i = 0; i < n; i++) {
            if (pfd[i].revents)
                helper_on_event(sp->srv->loop, &hs[i]->w, EPOLLIN | (uint32_t)pfd[i].revents);
            else if (r == 0 && ++hs[i]->silent_rounds >= SPW_SETTLE_KILL_ROUNDS)
                helper_fail(hs[i], "no answer for 10 s");
        }
    }
}

bool spawner_stash_exit(spawner_t *sp, pid_t pid, int wstatus)
{
    if (!sp || sp->pending == 0)
        return false;
    if (sp->n_stash == sp->cap_stash) {
        if (sp->cap_stash >= SPW_STASH_MAX) {
            /* oldest first out: with this many orphans reaped in one window, an answer this
             * late is not plausible */
            memmove(sp->stash, sp->stash + 1, (sp->n_stash - 1) * sizeof *sp->stash);
            sp->n_stash--;
        } else {
            size_t cap = sp->cap_stash ? sp->cap_stash * 2 : 16;
            stashed_t *s = realloc(sp->stash, cap * sizeof *s);
            if (!s)
                return false;
            sp->stash = s;
            sp->cap_stash = cap;
        }
    }
    sp->stash[sp->n_stash++] = (stashed_t){ pid, wstatus };
    return true;
}

/* A child was just registered (or not) for pid: if server_reap() already took an exit of that
 * pid, and the pidfd says our child is indeed reaped (ECHILD; an unrelated orphan that had the
 * number before would leave ours still waitable), hand that exit to its owner now. */
static void settle_pid(spawner_t *sp, pid_t pid, int pidfd)
{
    for (size_t i = sp->n_stash; i-- > 0;) {
        if (sp->stash[i].pid != pid)
            continue;
        int wstatus = sp->stash[i].wstatus;
        memmove(sp->stash + i, sp->stash + i + 1, (sp->n_stash - i - 1) * sizeof *sp->stash);
        sp->n_stash--;
        if (pidfd >= 0) {
            siginfo_t si;
            if (waitid((idtype_t)3 /* P_PIDFD */, (id_t)pidfd, &si, WEXITED | WNOHANG | WNOWAIT) ==
                    0 ||
                errno != ECHILD)
                continue; /* ours is still to be reaped: that entry was someone else's */
        }
        for (child_t *ch = sp->srv->http.reaper.children; ch; ch = ch->next)
            if (ch->pid == pid) {
                server_child_remove(sp->srv, ch);
                ch->on_exit(ch, wstatus);
                break;
            }
        return;
    }
}

size_t spawner_helper_count(const spawner_t *sp)
{
    size_t n = 0;
    for (size_t i = 0; sp && i < sp->n; i++)
        n += sp->h[i].fd >= 0;
    return n;
}

size_t spawner_helper_pids(const spawner_t *sp, pid_t *pids, size_t cap)
{
    size_t n = 0;
    for (size_t i = 0; sp && i < sp->n && n < cap; i++)
        if (sp->h[i].pid > 0)
            pids[n++] = sp->h[i].pid;
    return n;
}
