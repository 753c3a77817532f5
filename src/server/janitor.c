/* SPDX-License-Identifier: MIT */
#include "janitor.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#include "common/log.h"
#include "pool.h"
#include "server.h"

#define JAN_NAME_MAX 64
#define JAN_INFLIGHT_MAX 4096 /* names queued in the socket; beyond, the caller removes */

enum { JAN_REMOVE = 1, JAN_MKHOME = 2 };

typedef struct {
    uint32_t op;
    char name[JAN_NAME_MAX];
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
    void *data;
    bool started_once;
    pid_t pid;
    int fd;
    watcher_t w;
    child_t child;
    size_t inflight, mk_inflight;
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
static int make_warm(int warm, const char *name)
{
    if (mkdirat(warm, name, 0700) < 0)
        return negative_errno();
    _cleanup_close_ int home = openat(warm, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (home < 0 || mkdirat(home, ".tmp", 0700) < 0 || mkdirat(home, ".sbx", 0700) < 0 ||
        mkdirat(home, ".sbx/proxy", 0700) < 0) {
        int r = negative_errno();
        (void)pool_remove_tree_at(warm, name);
        return r;
    }
    return 0;
}

static bool name_ok(const char *n)
{
    return n[0] && !strchr(n, '/') && !streq(n, ".") && !streq(n, "..");
}

static _Noreturn void janitor_main(int sock, int dir, int warm, bool sweep_warm)
{
    sweep(dir); /* what a janitor before this one left */
    if (warm >= 0 && sweep_warm)
        sweep(warm); /* warm homes of an earlier run */
    for (;;) {
        jan_req_t q;
        ssize_t n = recv(sock, &q, sizeof q, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n != (ssize_t)sizeof q)
            _exit(0);
        jan_rep_t rep = { .op = q.op };
        q.name[JAN_NAME_MAX - 1] = '\0';
        /* one name in the trash (or warm) directory, never a path */
        if (!name_ok(q.name))
            rep.r = -EINVAL;
        else if (q.op == JAN_MKHOME)
            rep.r = warm >= 0 ? make_warm(warm, q.name) : -EBADF;
        else {
            rep.r = pool_remove_tree_at(dir, q.name);
            if (rep.r == -ENOENT)
                rep.r = 0; /* a sweep took it */
        }
        memcpy(rep.name, q.name, sizeof rep.name);
        while (send(sock, &rep, sizeof rep, MSG_NOSIGNAL) < 0)
            if (errno != EINTR)
                _exit(1);
    }
}

static _Noreturn void janitor_enter(int sock, int dir, int warm, bool sweep_warm, pid_t server)
{
    (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != server)
        _exit(0);
    (void)prctl(PR_SET_NAME, "sbx-janitor");
    /* the socket at 3, the trash directory at 4, the warm one at 5, nothing else */
    if (dup2(sock, 10) < 0 || dup2(dir, 11) < 0 || (warm >= 0 && dup2(warm, 12) < 0) ||
        dup2(10, 3) < 0 || dup2(11, 4) < 0 || (warm >= 0 && dup2(12, 5) < 0))
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
        ssize_t n = recv(j->fd, &rep, sizeof rep, MSG_DONTWAIT);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            return;
        if (n != (ssize_t)sizeof rep) {
            janitor_stop(j, n == 0 ? "it closed its socket" : "a malformed answer");
            return;
        }
        if (j->inflight > 0)
            j->inflight--;
        rep.name[JAN_NAME_MAX - 1] = '\0';
        if (rep.op == JAN_MKHOME) {
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

int janitor_new(server_t *srv, int trash_fd, int warm_fd, janitor_made_cb on_made, void *data,
                janitor_t **ret)
{
    janitor_t *j = calloc(1, sizeof *j);
    if (!j)
        return -ENOMEM;
    *j = (janitor_t){ .srv = srv,
                      .trash_fd = trash_fd,
                      .warm_fd = warm_fd,
                      .on_made = on_made,
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

int janitor_remove(janitor_t *j, const char *name) { return janitor_send(j, JAN_REMOVE, name); }

int janitor_make_home(janitor_t *j, const char *name)
{
    return j->warm_fd >= 0 ? janitor_send(j, JAN_MKHOME, name) : -EBADF;
}

static int janitor_send(janitor_t *j, uint32_t op, const char *name)
{
    jan_req_t q = { .op = op };
    if (strlen(name) >= sizeof q.name)
        return -ENAMETOOLONG;
    if (j->fd < 0 && j->pid == 0 && janitor_start(j) < 0)
        return -EPIPE;
    if (j->fd < 0 || j->inflight >= JAN_INFLIGHT_MAX)
        return -EAGAIN;
    memcpy(q.name, name, strlen(name) + 1);
    ssize_t n;
    do
        n = send(j->fd, &q, sizeof q, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n != (ssize_t)sizeof q)
        return n < 0 ? negative_errno() : -EIO;
    j->inflight++;
    j->mk_inflight += op == JAN_MKHOME;
    return 0;
}

void janitor_counts(const janitor_t *j, uint64_t *removed, uint64_t *failed)
{
    *removed = j ? j->removed : 0;
    *failed = j ? j->failed : 0;
}
