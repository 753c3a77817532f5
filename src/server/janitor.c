/* SPDX-License-Identifier: MIT */
#include "janitor.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>

#include "common/log.h"
#include "isolation/netns.h"
#include "pool.h"
#include "server.h"

#define JAN_NAME_MAX 64
#define JAN_INFLIGHT_MAX 4096 /* names queued in the socket; beyond, the caller removes */
#define JAN_HOLD_MAX 16       /* answers held back while more requests wait (jan_held_t) */

enum { JAN_REMOVE = 1, JAN_MKHOME = 2, JAN_NETNS_MAKE = 3, JAN_NETNS_CHECK = 4, JAN_RECYCLE = 5 };
_Static_assert(JAN_NETNS_MAKE == JANITOR_NETNS_MADE && JAN_NETNS_CHECK == JANITOR_NETNS_CHECKED,
               "the ops the callback is told are the wire's");

typedef struct {
    uint32_t op;
    uint32_t uid; /* JAN_MKHOME, JAN_RECYCLE: the warm home's owner */
    char name[JAN_NAME_MAX];
    char to[JAN_NAME_MAX]; /* JAN_RECYCLE: the warm home to give back */
} jan_req_t;

typedef struct {
    uint32_t op;
    int32_t r;
    char name[JAN_NAME_MAX];
} jan_rep_t;

struct janitor {
    server_t *srv;
    int trash_fd, warm_fd; /* the server's (not owned) */
    janitor_made_cb on_made;
    janitor_netns_cb on_netns;
    void *data;
    bool started_once;
    pid_t pid;
    int fd;
    watcher_t w;
    child_t child;
    size_t inflight, mk_inflight, ns_made_inflight, ns_checks_inflight;
    uint64_t removed, failed;
};

/* ---- the janitor process ----------------------------------------------------------------- */

static void sweep(int dir)
{
    int fd = openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        safe_close(fd);
        return;
    }
    struct dirent *de;
    while ((de = readdir(d)))
        if (!streq(de->d_name, ".") && !streq(de->d_name, ".."))
            (void)pool_remove_tree_at(dir, de->d_name);
    closedir(d);
}

/* A home made ahead, as make_home makes one (pool.c), owned by root until a create takes it. */
/* A home for uid: the four directories, 0700, given to uid (made here, in root's 0700 warm
 * directory: nothing but root can have touched them, so names under the home are safe). */
static int make_warm(int warm, const char *name, uint32_t uid)
{
    static const char *const dirs[] = { ".tmp", ".sbx", ".sbx/proxy" };
    if (mkdirat(warm, name, 0700) < 0)
        return negative_errno();
    _cleanup_close_ int home = openat(warm, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int r = home < 0 ? negative_errno() : 0;
    for (size_t i = 0; r == 0 && i < ELEMENTSOF(dirs); i++)
        if (mkdirat(home, dirs[i], 0700) < 0 ||
            fchownat(home, dirs[i], uid, uid, AT_SYMLINK_NOFOLLOW) < 0)
            r = negative_errno();
    if (r == 0 && fchown(home, uid, uid) < 0)
        r = negative_errno();
    if (r < 0)
        (void)pool_remove_tree_at(warm, name);
    return r;
}

static bool name_ok(const char *n)
{
    return n[0] && !strchr(n, '/') && !streq(n, ".") && !streq(n, "..");
}

/* One message and at most one descriptor (SCM_RIGHTS), on either side of the socket. */
static ssize_t recv_with_fd(int sock, void *msg, size_t len, int flags, int *ret_fd)
{
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    struct iovec iov = { msg, len };
    struct msghdr m = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf
    };
    *ret_fd = -1;
    ssize_t n = recvmsg(sock, &m, flags | MSG_CMSG_CLOEXEC);
    if (n < 0)
        return n;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
            c->cmsg_len >= CMSG_LEN(sizeof(int))) {
            int fd;
            memcpy(&fd, CMSG_DATA(c), sizeof fd);
            if (*ret_fd < 0)
                *ret_fd = fd;
            else
                safe_close(fd); /* never more than one: a peer that sends more loses them */
        }
    return n;
}

static ssize_t send_with_fd(int sock, const void *msg, size_t len, int flags, int fd)
{
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    struct iovec iov = { (void *)msg, len };
    struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };
    if (fd >= 0) {
        memset(&u, 0, sizeof u);
        m.msg_control = u.buf;
        m.msg_controllen = sizeof u.buf;
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof fd);
    }
    ssize_t n;
    do
        n = sendmsg(sock, &m, flags | MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n;
}

/* Network namespaces, in the janitor: the snapshot of a fresh one (the baseline, taken once)
 * and that namespace itself, where the janitor stays between checks. Not the namespace it
 * started in: in a run that one belongs to a user namespace above the run's, and setns() back
 * into it is refused (the janitor died at every check there). */
typedef struct {
    int home_fd; /* the baseline namespace */
    char *baseline;
    int baseline_len; /* < 0: none could be taken (then no namespace is ever called pristine) */
} jan_netns_t;

static void netns_baseline(jan_netns_t *ns)
{
    ns->baseline_len = -1;
    ns->baseline = malloc(NETNS_SNAPSHOT_MAX);
    if (!ns->baseline || netns_make(&ns->home_fd) < 0 || setns(ns->home_fd, CLONE_NEWNET) < 0)
        return;
    ns->baseline_len = netns_snapshot(ns->baseline, NETNS_SNAPSHOT_MAX);
}

/* A namespace a deleted sandbox had: handed back (r 0, fd sent) only when it shows nothing
 * a fresh one would not (netns.h): the sandbox sent no packet and left no socket, so the next
 * sandbox learns nothing of it. Else -EBUSY and it is closed here: the kernel tears it down. */
static int netns_check(jan_netns_t *ns, int fd)
{
    if (ns->baseline_len == -1 && !ns->baseline)
        netns_baseline(ns);
    if (ns->baseline_len < 0)
        return -EBUSY;
    int r = netns_pristine(fd, ns->home_fd, ns->baseline, (size_t)ns->baseline_len);
    if (r < 0)
        _exit(1); /* could not come back to the baseline: not to stay in a tenant's namespace */
    return r == 1 ? 0 : -EBUSY;
}

/* Answers held back while more requests wait (janitor_main): each answer sent alone wakes
 * the server once, two wake-ups a sandbox in a burst of creates. Sent before anything whose
 * time has no bound (removing a tree, which may take seconds), and at most JAN_HOLD_MAX. */
typedef struct {
    jan_rep_t rep[JAN_HOLD_MAX];
    int fd[JAN_HOLD_MAX];
    size_t n;
} jan_held_t;

static void held_send(int sock, jan_held_t *h)
{
    for (size_t i = 0; i < h->n; i++) {
        if (send_with_fd(sock, &h->rep[i], sizeof h->rep[i], 0, h->fd[i]) < 0)
            _exit(1);
        safe_close(h->fd[i]);
    }
    h->n = 0;
}

static jan_rep_t remove_now(int dir, const char *name)
{
    jan_rep_t rep = { .op = JAN_REMOVE, .r = pool_remove_tree_at(dir, name) };
    if (rep.r == -ENOENT)
        rep.r = 0; /* a sweep took it */
    memcpy(rep.name, name, sizeof rep.name);
    return rep;
}

/* The remover: the janitor's own child, which empties the trash of the trees named on a pipe
 * and answers each removal to the server itself, on the janitor's socket (a seqpacket socket:
 * each answer one message). Apart from the janitor, and put off while deletes keep coming: on
 * this project's machines (ext4 without a journal, mounted with discard) an rmdir waits for
 * the disk to discard the freed block (~0.3 ms for an empty home's four directories, against
 * ~0.1 ms to make them), and every inode freed makes the next minutes' new inodes dearer (ext4
 * without a journal skips recently deleted inodes one by one: perf showed `recently_deleted`
 * and the buffer lookups it does as most of the janitor's CPU). Homes and namespaces are what
 * creates wait for. So a tree waits until no delete came for REMOVER_QUIET_MS, but never more
 * than REMOVER_WAIT_MAX_MS (a tenant deleting an empty directory every 50 ms kept every
 * sibling's home waiting), and is removed at once while more than REMOVER_BACKLOG wait or the
 * filesystem's blocks or inodes are nine tenths used (one per delete then). */
#define REMOVER_QUIET_MS 100
#define REMOVER_WAIT_MAX_MS 5000
#define REMOVER_BACKLOG 1024
#define REMOVER_DIR ".removing"

static bool space_low(int dir)
{
    struct statfs fs;
    return fstatfs(dir, &fs) == 0 && ((fs.f_blocks > 0 && fs.f_bavail < fs.f_blocks / 10) ||
                                      (fs.f_files > 0 && fs.f_ffree < fs.f_files / 10));
}

/* trash/name moved into the remover's own directory and removed there: an rmdir holds its
 * parent's lock while ext4 discards the freed blocks (waiting for the disk), and the trash is
 * where every delete on the server's loop renames a home */
static jan_rep_t remove_apart(int dir, int own, const char *name)
{
    if (own < 0)
        return remove_now(dir, name);
    if (renameat(dir, name, own, name) < 0) {
        jan_rep_t rep = { .op = JAN_REMOVE, .r = errno == ENOENT ? 0 : negative_errno() };
        memcpy(rep.name, name, sizeof rep.name);
        return rep;
    }
    return remove_now(own, name);
}

static _Noreturn void remover_main(int sock, int dir, int names)
{
    char(*q)[JAN_NAME_MAX] = malloc(JAN_INFLIGHT_MAX * sizeof *q);
    uint64_t *at = malloc(JAN_INFLIGHT_MAX * sizeof *at); /* when each was named */
    size_t head = 0, n = 0;
    bool quiet = false, eager = false;
    if (!q || !at)
        _exit(1);
    /* its own directory in the trash (a name no trash entry has: each is a sandbox's id and
     * more); the janitor's sweep at start removes it with what it holds */
    (void)mkdirat(dir, REMOVER_DIR, 0700);
    int own = openat(dir, REMOVER_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    for (;;) {
        struct pollfd pfd = { .fd = names, .events = POLLIN };
        uint64_t now = monotonic_ms();
        uint64_t waited = n > 0 ? now - at[head] : 0;
        bool overdue = n > 0 && waited >= REMOVER_WAIT_MAX_MS;
        int timeout = n == 0 ? -1
                      : quiet || eager || overdue
                          ? 0
                          : (int)MIN((uint64_t)REMOVER_QUIET_MS, REMOVER_WAIT_MAX_MS - waited);
        int r = poll(&pfd, 1, timeout);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            _exit(1);
        if (r > 0) {
            char name[JAN_NAME_MAX];
            ssize_t got = read(names, name, sizeof name);
            if (got < 0 && errno == EINTR)
                continue;
            if (got != (ssize_t)sizeof name || n >= JAN_INFLIGHT_MAX)
                _exit(got == 0 ? 0 : 1); /* the janitor is gone (or broke the bound) */
            name[JAN_NAME_MAX - 1] = '\0';
            at[(head + n) % JAN_INFLIGHT_MAX] = now;
            memcpy(q[(head + n++) % JAN_INFLIGHT_MAX], name, sizeof name);
            quiet = false;
            eager = n > REMOVER_BACKLOG || space_low(dir);
            if (!eager && !overdue)
                continue;
        } else
            quiet = true; /* no delete for a while (or one overdue, or eager): one removal, then
                           * look again */
        const char *name = q[head];
        jan_rep_t rep = name_ok(name) ? remove_apart(dir, own, name)
                                      : (jan_rep_t){ .op = JAN_REMOVE, .r = -EINVAL };
        head = (head + 1) % JAN_INFLIGHT_MAX;
        n--;
        eager = eager && n > 0 && (n > REMOVER_BACKLOG || space_low(dir));
        if (send_with_fd(sock, &rep, sizeof rep, 0, -1) < 0)
            _exit(1);
    }
}

/* The write end of the remover's pipe (room for every name the server may have in flight, so
 * that a write never blocks), or < 0: the janitor removes trees itself. */
static int remover_start(int sock, int dir)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0)
        return -1;
    if (fcntl(p[1], F_SETPIPE_SZ, JAN_INFLIGHT_MAX * JAN_NAME_MAX) < 0) {
        safe_close(p[0]);
        safe_close(p[1]);
        return -1;
    }
    pid_t janitor = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != janitor)
            _exit(0);
        (void)prctl(PR_SET_NAME, "sbx-remover");
        safe_close(p[1]);
        remover_main(sock, dir, p[0]);
    }
    safe_close(p[0]);
    if (pid < 0)
        safe_close(p[1]);
    return pid < 0 ? -1 : p[1];
}

/* Hand trash/name to the remover, which answers it; false: the caller removes it. */
static bool remover_take(int remover, const char *name)
{
    char rec[JAN_NAME_MAX] = { 0 };
    memcpy(rec, name, strnlen(name, JAN_NAME_MAX - 1));
    ssize_t n;
    do
        n = write(remover, rec, sizeof rec); /* one record: below PIPE_BUF, never split */
    while (n < 0 && errno == EINTR);
    if (n < 0)
        _exit(1); /* the remover is gone: the server starts a new janitor, which sweeps */
    return n == (ssize_t)sizeof rec;
}

static bool request_waiting(int sock)
{
    uint32_t next;
    return recv(sock, &next, sizeof next, MSG_PEEK | MSG_DONTWAIT) == (ssize_t)sizeof next;
}

static _Noreturn void janitor_main(int sock, int dir, int warm, bool sweep_warm)
{
    jan_netns_t ns = { .home_fd = -1, .baseline_len = -1 };
    jan_held_t held = { .n = 0 };
    sweep(dir); /* what a janitor before this one left */
    if (warm >= 0 && sweep_warm)
        sweep(warm); /* warm homes of an earlier run */
    int remover = remover_start(sock, dir);
    for (;;) {
        jan_req_t q;
        int fd;
        ssize_t n = recv_with_fd(sock, &q, sizeof q, 0, &fd);
        if (n < 0 && errno == EINTR)
            continue;
        if (n != (ssize_t)sizeof q)
            _exit(0);
        jan_rep_t rep = { .op = q.op };
        int out = -1;
        q.name[JAN_NAME_MAX - 1] = '\0';
        q.to[JAN_NAME_MAX - 1] = '\0';
        if (q.op == JAN_RECYCLE) {
            /* answered as a warm home made, always fresh: the deleted one is removed, never
             * handed on (a sibling may hold descriptors or inotify watches on its directories,
             * and would list the next tenant's names through them) */
            if (!name_ok(q.to) || warm < 0)
                rep.r = -EINVAL;
            else
                rep.r = make_warm(warm, q.to, q.uid);
            /* the old one goes to the remover, which answers it (without one, here) */
            if (!name_ok(q.name) || remover < 0 || !remover_take(remover, q.name)) {
                held_send(sock, &held);
                jan_rep_t gone = { .op = JAN_REMOVE, .r = -EINVAL };
                if (name_ok(q.name))
                    gone = remove_now(dir, q.name);
                if (send_with_fd(sock, &gone, sizeof gone, 0, -1) < 0)
                    _exit(1);
            }
            memcpy(rep.name, q.to, sizeof rep.name);
        } else if (q.op == JAN_NETNS_MAKE)
            rep.r = netns_make(&out);
        else if (q.op == JAN_NETNS_CHECK) {
            rep.r = fd >= 0 ? netns_check(&ns, fd) : -EBADF;
            if (rep.r == 0)
                out = TAKE_FD(fd);
        }
        /* one name in the trash (or warm) directory, never a path */
        else if (!name_ok(q.name))
            rep.r = -EINVAL;
        else if (q.op == JAN_MKHOME)
            rep.r = warm >= 0 ? make_warm(warm, q.name, q.uid) : -EBADF;
        else if (remover >= 0 && remover_take(remover, q.name)) {
            safe_close(fd);
            continue; /* the remover answers it */
        } else {
            held_send(sock, &held);
            rep = remove_now(dir, q.name);
        }
        safe_close(fd);
        if (q.op != JAN_RECYCLE)
            memcpy(rep.name, q.name, sizeof rep.name);
        held.rep[held.n] = rep;
        held.fd[held.n++] = out;
        /* more waiting (the next one's head peeked at, nothing taken): answer together */
        if (held.n < JAN_HOLD_MAX && request_waiting(sock))
            continue;
        held_send(sock, &held);
    }
}

static _Noreturn void janitor_enter(int sock, int dir, int warm, bool sweep_warm, pid_t server)
{
    (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != server)
        _exit(0);
    (void)prctl(PR_SET_NAME, "sbx-janitor");
    /* the socket at 3, the trash directory at 4, the warm one at 5, nothing else: each copied
     * first above all three (a fixed number in between could be one of them, and then the
     * trash would take the warm directory's place) */
    int top = MAX(MAX(sock, dir), MAX(warm, 5)) + 1;
    int s2 = fcntl(sock, F_DUPFD, top), d2 = fcntl(dir, F_DUPFD, top);
    int w2 = warm >= 0 ? fcntl(warm, F_DUPFD, top) : -1;
    if (s2 < 0 || d2 < 0 || (warm >= 0 && w2 < 0) || dup2(s2, 3) < 0 || dup2(d2, 4) < 0 ||
        (warm >= 0 && dup2(w2, 5) < 0))
        _exit(1);
    if (syscall(SYS_close_range, warm >= 0 ? 6u : 5u, ~0u, 0u) < 0)
        for (int fd = warm >= 0 ? 6 : 5; fd < 65536; fd++)
            (void)close(fd);
    for (int fd = 3; fd <= (warm >= 0 ? 5 : 4); fd++)
        (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
    janitor_main(3, 4, warm >= 0 ? 5 : -1, sweep_warm);
}

/* ---- the server's side ------------------------------------------------------------------- */

static void janitor_on_event(loop_t *l, watcher_t *w, uint32_t ev);
static void janitor_on_exit(child_t *ch, int wstatus);

static void janitor_stop(janitor_t *j, const char *why)
{
    if (j->fd < 0)
        return;
    loop_unwatch(j->srv->loop, &j->w);
    j->fd = safe_close(j->fd);
    if (j->pid > 0)
        (void)kill(j->pid, SIGKILL);
    if (j->inflight > 0 && why) /* at shutdown (why NULL) the pool sweeps the trash itself */
        log_warn("janitor %d: %s; %zu trees stay in the trash until the next one sweeps it",
                 (int)j->pid, why, j->inflight);
    j->inflight = 0;
    /* homes it was making: never made, as far as the pool knows */
    for (size_t n = j->mk_inflight; n > 0; n--)
        j->on_made(j->data, NULL, -EPIPE);
    j->mk_inflight = 0;
    for (size_t n = j->ns_made_inflight; n > 0; n--)
        j->on_netns(j->data, JAN_NETNS_MAKE, -1, -EPIPE);
    for (size_t n = j->ns_checks_inflight; n > 0; n--)
        j->on_netns(j->data, JAN_NETNS_CHECK, -1, -EPIPE);
    j->ns_made_inflight = j->ns_checks_inflight = 0;
}

static int janitor_start(janitor_t *j)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
        return negative_errno();
    int sz = (int)(JAN_INFLIGHT_MAX * (sizeof(jan_req_t) + 64));
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
        janitor_enter(sv[1], j->trash_fd, j->warm_fd, !j->started_once, server);
    }
    safe_close(sv[1]);
    (void)fcntl(sv[0], F_SETFL, O_NONBLOCK);
    j->started_once = true;
    j->pid = pid;
    j->fd = sv[0];
    j->inflight = 0;
    watcher_init(&j->w, j->fd, janitor_on_event, j);
    j->child = (child_t){ .pid = pid, .on_exit = janitor_on_exit, .data = j };
    server_child_add(j->srv, &j->child);
    int r = loop_watch(j->srv->loop, &j->w, EPOLLIN);
    if (r < 0)
        janitor_stop(j, "cannot watch its socket");
    return r;
}

static void janitor_on_exit(child_t *ch, int wstatus)
{
    janitor_t *j = ch->data;
    (void)wstatus;
    janitor_stop(j, "it exited");
    j->pid = 0;
}

static void janitor_on_event(loop_t *l, watcher_t *w, uint32_t ev)
{
    janitor_t *j = w->data;
    (void)l;
    for (int i = 0; i < 256 && j->fd >= 0; i++) {
        jan_rep_t rep;
        _cleanup_close_ int fd = -EBADF;
        ssize_t n = recv_with_fd(j->fd, &rep, sizeof rep, MSG_DONTWAIT, &fd);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            return;
        if (n != (ssize_t)sizeof rep) {
            janitor_stop(j, n == 0 ? "it closed its socket" : "a malformed answer");
            return;
        }
        if (j->inflight > 0)
            j->inflight--;
        rep.name[JAN_NAME_MAX - 1] = '\0';
        if (rep.op == JAN_NETNS_MAKE || rep.op == JAN_NETNS_CHECK) {
            size_t *pending =
                rep.op == JAN_NETNS_MAKE ? &j->ns_made_inflight : &j->ns_checks_inflight;
            if (*pending > 0)
                (*pending)--;
            j->on_netns(j->data, (int)rep.op, rep.r >= 0 ? TAKE_FD(fd) : -1, rep.r);
            continue;
        }
        if (rep.op == JAN_MKHOME || rep.op == JAN_RECYCLE) {
            if (j->mk_inflight > 0)
                j->mk_inflight--;
            j->on_made(j->data, rep.name, rep.r);
            continue;
        }
        if (rep.r < 0) {
            j->failed++;
            log_warn("trash/%s could not be removed: %s", rep.name, strerror(-rep.r));
        } else
            j->removed++;
    }
    if (j->fd >= 0 && (ev & (EPOLLHUP | EPOLLERR)) && !(ev & EPOLLIN))
        janitor_stop(j, "its socket hung up");
}

int janitor_new(server_t *srv, int trash_fd, int warm_fd, janitor_made_cb on_made,
                janitor_netns_cb on_netns, void *data, janitor_t **ret)
{
    janitor_t *j = calloc(1, sizeof *j);
    if (!j)
        return -ENOMEM;
    *j = (janitor_t){ .srv = srv,
                      .trash_fd = trash_fd,
                      .warm_fd = warm_fd,
                      .on_made = on_made,
                      .on_netns = on_netns,
                      .data = data,
                      .fd = -1 };
    int r = janitor_start(j);
    if (r < 0) {
        free(j);
        return r;
    }
    *ret = j;
    return 0;
}

janitor_t *janitor_free(janitor_t *j)
{
    if (!j)
        return NULL;
    if (j->pid > 0)
        server_child_remove(j->srv, &j->child);
    janitor_stop(j, NULL);
    free(j);
    return NULL;
}

static int janitor_send(janitor_t *j, uint32_t op, const char *name);
static int janitor_send_fd(janitor_t *j, uint32_t op, const char *name, int fd);
static int janitor_send_req(janitor_t *j, jan_req_t *req, const char *name, int fd);

int janitor_remove(janitor_t *j, const char *name) { return janitor_send(j, JAN_REMOVE, name); }

int janitor_make_home(janitor_t *j, const char *name, uint32_t uid)
{
    jan_req_t q = { .op = JAN_MKHOME, .uid = uid };
    return j->warm_fd >= 0 ? janitor_send_req(j, &q, name, -1) : -EBADF;
}

static int janitor_send_fd(janitor_t *j, uint32_t op, const char *name, int fd)
{
    jan_req_t q = { .op = op };
    return janitor_send_req(j, &q, name, fd);
}

static int janitor_send_req(janitor_t *j, jan_req_t *req, const char *name, int fd)
{
    jan_req_t q = *req;
    uint32_t op = q.op;
    if (strlen(name) >= sizeof q.name)
        return -ENAMETOOLONG;
    if (j->fd < 0 && j->pid == 0 && janitor_start(j) < 0)
        return -EPIPE;
    if (j->fd < 0 || j->inflight >= JAN_INFLIGHT_MAX)
        return -EAGAIN;
    memcpy(q.name, name, strlen(name) + 1);
    ssize_t n = send_with_fd(j->fd, &q, sizeof q, MSG_DONTWAIT, fd);
    if (n != (ssize_t)sizeof q)
        return n < 0 ? negative_errno() : -EIO;
    j->inflight++;
    j->mk_inflight += op == JAN_MKHOME || op == JAN_RECYCLE;
    j->ns_made_inflight += op == JAN_NETNS_MAKE;
    j->ns_checks_inflight += op == JAN_NETNS_CHECK;
    return 0;
}

static int janitor_send(janitor_t *j, uint32_t op, const char *name)
{
    return janitor_send_fd(j, op, name, -1);
}

int janitor_recycle_home(janitor_t *j, const char *name, const char *to, uint32_t uid)
{
    jan_req_t q = { .op = JAN_RECYCLE, .uid = uid };
    if (j->warm_fd < 0)
        return -EBADF;
    if (strlen(to) >= sizeof q.to)
        return -ENAMETOOLONG;
    memcpy(q.to, to, strlen(to) + 1);
    if (j->inflight + 1 >= JAN_INFLIGHT_MAX)
        return -EAGAIN; /* two answers: the home made, then the old one removed */
    int r = janitor_send_req(j, &q, name, -1);
    if (r >= 0)
        j->inflight++;
    return r;
}

int janitor_netns_make(janitor_t *j) { return janitor_send(j, JAN_NETNS_MAKE, ""); }

int janitor_netns_check(janitor_t *j, int netns_fd)
{
    return netns_fd >= 0 ? janitor_send_fd(j, JAN_NETNS_CHECK, "", netns_fd) : -EBADF;
}

void janitor_counts(const janitor_t *j, uint64_t *removed, uint64_t *failed)
{
    *removed = j ? j->removed : 0;
    *failed = j ? j->failed : 0;
}
