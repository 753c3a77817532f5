/* SPDX-License-Identifier: MIT */
#include "server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>

#include "common/log.h"
#include "envd.h"
#include "http/proxy.h"
#include "pool.h"
#include "proc.h"
#include "routes.h"
#include "spawner.h"

void server_touch(server_t *s) { s->last_activity_ms = loop_now_ms(s->loop); }
void server_op_begin(server_t *s)
{
    s->active_ops++;
    server_touch(s);
}
void server_op_end(server_t *s)
{
    if (s->active_ops > 0)
        s->active_ops--;
    server_touch(s);
}

void server_child_add(server_t *s, child_t *ch)
{
    ch->next = s->children;
    s->children = ch;
}

void server_child_remove(server_t *s, child_t *ch)
{
    for (child_t **pp = &s->children; *pp; pp = &(*pp)->next)
        if (*pp == ch) {
            *pp = ch->next;
            ch->next = NULL;
            return;
        }
}

/* SIGCHLD: reap every exited child. Ours are handed to their owner; others (orphans that were
 * re-parented to us as subreaper or PID 1) are just reaped so they never linger as zombies.
 * Reaping happens only here, so a pid we signal cannot be recycled before we see its exit. */
static void on_signal(loop_t *l, watcher_t *w, uint32_t ev)
{
    server_t *s = w->data;
    struct signalfd_siginfo si;
    (void)l;
    (void)ev;
    while (read(s->sig_fd, &si, sizeof si) == (ssize_t)sizeof si) {
        if (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT) {
            log_info("signal %u: shutting down", si.ssi_signo);
            loop_stop(s->loop);
            return;
        }
    }
    server_reap(s);
}

void server_reap(server_t *s)
{
    if (s->reap_registered_only) {
        /* other threads wait for their own children (sbx-node's install threads) */
        for (child_t *ch = s->children, *next; ch; ch = next) {
            next = ch->next;
            int st;
            if (waitpid(ch->pid, &st, WNOHANG) == ch->pid) {
                server_child_remove(s, ch);
                ch->on_exit(ch, st);
            }
        }
        return;
    }
    for (;;) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid <= 0)
            break;
        child_t *ch = s->children;
        for (; ch; ch = ch->next)
            if (ch->pid == pid) {
                server_child_remove(s, ch);
                ch->on_exit(ch, st);
                break;
            }
        /* A child a spawn helper started, whose answer is still to be read? */
        if (!ch)
            (void)spawner_stash_exit(s->spawner, pid, st);
    }
}

/* Refuse a connection at accept: answer without allocating anything for it. */
static void refuse(int fd, bool source)
{
    static const char full[] = "{\"error\":\"too many connections\"}";
    static const char src[] = "{\"error\":\"too many connections from this source\"}";
    char busy[256];
    int n = snprintf(busy, sizeof busy,
                     "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                     "Retry-After: %d\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
                     CLIMIT_RETRY_AFTER_S, source ? sizeof src - 1 : sizeof full - 1,
                     source ? src : full);
    if (n > 0 && (size_t)n < sizeof busy)
        (void)send(fd, busy, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
    /* Send FIN, and read away a request that already arrived: closing with unread bytes
     * would make the kernel answer RST, which can discard the 503 in transit. */
    (void)shutdown(fd, SHUT_WR);
    char sink[4096];
    for (int k = 0; k < 16 && recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0; k++)
        ;
    safe_close(fd);
}

static void on_accept(loop_t *l, watcher_t *w, uint32_t ev)
{
    server_t *s = w->data;
    (void)l;
    (void)ev;
    for (int i = 0; i < 128; i++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(s->listen_fd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE)
                log_warn("accept: %s", strerror(errno));
            return;
        }
        /* Per source, then the unauthenticated share and the total cap (connlimit.h). */
        climit_hold_t lim;
        int r = climit_admit(s, (struct sockaddr *)&ss, sl, &lim);
        if (r < 0) {
            refuse(fd, r == -EUSERS);
            continue;
        }
        if (conn_accept(s, fd, &lim) < 0)
            log_warn("could not set up a connection");
    }
}

/* Host mode, every second: evict sandboxes idle past their own timeout; exit once the host
 * has had no sandbox for SBX_IDLE_TIMEOUT (the clock starts at boot, so a warmed host that
 * is never used is reclaimed too). */
static void on_pool_tick(loop_t *l, timer_t_ *t)
{
    server_t *s = t->data;
    uint64_t now = loop_now_ms(l);
    pool_evict_idle(s->pool, now);
    if (s->pool->count > 0 || s->active_ops > 0)
        s->pool_empty_since_ms = now;
    else if (s->cfg.idle_timeout_ms > 0 && now - s->pool_empty_since_ms >= s->cfg.idle_timeout_ms) {
        log_info("no sandboxes for %llu ms: exiting", (unsigned long long)s->cfg.idle_timeout_ms);
        loop_stop(l);
        return;
    }
    (void)timer_arm(l, t, 1000);
}

static void on_idle(loop_t *l, timer_t_ *t)
{
    server_t *s = t->data;
    uint64_t now = loop_now_ms(l);
    uint64_t due = s->last_activity_ms + s->cfg.idle_timeout_ms;
    if (s->active_ops > 0 || server_running_procs(s) > 0 || due > now) {
        (void)timer_arm(l, t, due > now ? MIN(due - now, 1000) : 1000);
        return;
    }
    log_info("idle for %llu ms with nothing running: exiting",
             (unsigned long long)s->cfg.idle_timeout_ms);
    loop_stop(l);
}

static int listen_tcp(const server_config_t *cfg)
{
    struct sockaddr_storage ss = { 0 };
    socklen_t sl;
    int family;
    struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, cfg->bind, &a4->sin_addr) == 1) {
        family = AF_INET;
        a4->sin_family = AF_INET;
        a4->sin_port = htons(cfg->port);
        sl = sizeof *a4;
    } else if (inet_pton(AF_INET6, cfg->bind, &a6->sin6_addr) == 1) {
        family = AF_INET6;
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons(cfg->port);
        sl = sizeof *a6;
    } else {
        return -EINVAL;
    }
    _cleanup_close_ int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return negative_errno();
    int one = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&ss, sl) < 0 || listen(fd, 4096) < 0)
        return negative_errno();
    return TAKE_FD(fd);
}

static int listen_unix(const server_config_t *cfg)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    size_t n = strlen(cfg->unix_path);
    if (n == 0 || n >= sizeof sa.sun_path)
        return -ENAMETOOLONG;
    memcpy(sa.sun_path, cfg->unix_path, n + 1);
    _cleanup_close_ int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return negative_errno();
    (void)unlink(cfg->unix_path); /* a stale socket from an earlier run */
    /* The socket is only for the node that started us: owner-only permissions. */
    mode_t old = umask(0077);
    int r = bind(fd, (struct sockaddr *)&sa, sizeof sa);
    umask(old);
    if (r < 0 || listen(fd, 4096) < 0)
        return negative_errno();
    return TAKE_FD(fd);
}

/* A socket bound by sbx-node and inherited across exec. Listening here, not in the node, makes
 * this process the socket's SO_PEERCRED identity: the node verifies exactly that (pid, start
 * time, executable) before it forwards a connection. */
static int listen_inherited(const server_config_t *cfg)
{
    int fd = cfg->inherited_fd, type = 0, domain = 0;
    socklen_t l = sizeof type;
    if (fd < 3 || getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &l) < 0)
        return -EBADF;
    l = sizeof domain;
    if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &l) < 0 || type != SOCK_STREAM ||
        domain != AF_UNIX)
        return -ENOTSOCK;
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) < 0)
        return negative_errno();
    if (listen(fd, 4096) < 0)
        return negative_errno();
    return fd;
}

int server_init(server_t *s, const server_config_t *cfg)
{
    int r;
    *s = (server_t){ .cfg = *cfg, .listen_fd = -EBADF, .sig_fd = -EBADF, .next_proc_id = 1 };
    timer_init(&s->idle_t, on_idle, s); /* initialized first: server_done disarms it */
    r = loop_new(&s->loop);
    if (r < 0)
        return r;
    s->start_ms = loop_now_ms(s->loop);
    s->last_activity_ms = s->start_ms;

    /* Become the reaper of orphaned descendants so none is left as a zombie. */
    (void)prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    (void)signal(SIGPIPE, SIG_IGN);
    /* A file write past RLIMIT_FSIZE must fail with EFBIG, not kill the server. */
    (void)signal(SIGXFSZ, SIG_IGN);
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    if (sigprocmask(SIG_BLOCK, &mask, NULL) < 0)
        return negative_errno();
    s->sig_fd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (s->sig_fd < 0)
        return negative_errno();
    watcher_init(&s->sig_w, s->sig_fd, on_signal, s);
    r = loop_watch(s->loop, &s->sig_w, EPOLLIN);
    if (r < 0)
        return r;

    if (cfg->max_conns_per_source > 0) {
        r = climit_tab_new(&s->sources);
        if (r < 0)
            return r;
    }
    s->listen_fd = cfg->listen_inherited ? listen_inherited(cfg)
                   : cfg->unix_path[0]   ? listen_unix(cfg)
                                         : listen_tcp(cfg);
    if (s->listen_fd < 0)
        return s->listen_fd;
    watcher_init(&s->listen_w, s->listen_fd, on_accept, s);
    r = loop_watch(s->loop, &s->listen_w, EPOLLIN);
    if (r < 0)
        return r;
    if (s->cfg.host_mode) {
        char err[512];
        r = pool_new(s, &s->cfg.pool, &s->pool, err, sizeof err);
        if (r < 0) {
            log_error("%s", err);
            return r;
        }
        s->pool_empty_since_ms = s->start_ms;
        timer_init(&s->idle_t, on_pool_tick, s);
        (void)timer_arm(s->loop, &s->idle_t, 1000);
        return 0;
    }
    if (cfg->idle_timeout_ms > 0)
        (void)timer_arm(s->loop, &s->idle_t, MIN(cfg->idle_timeout_ms, 1000));
    return 0;
}

int server_run(server_t *s) { return loop_run(s->loop); }

void server_done(server_t *s)
{
    s->spawner = spawner_free(s->spawner); /* what is in flight fails; the helpers exit */
    s->pool = pool_free(s->pool);          /* deletes every sandbox: kills, removes homes */
    procs_kill_all(s);
    envd_watches_free(s);
    conn_free_all(s);
    proxy_free_all(s);
    if (s->loop) {
        timer_disarm(s->loop, &s->idle_t);
        loop_unwatch(s->loop, &s->listen_w);
        loop_unwatch(s->loop, &s->sig_w);
    }
    s->loop = loop_free(s->loop); /* runs what was deferred: every connection is gone */
    s->sources = climit_tab_free(s->sources);
    safe_close(s->listen_fd);
    safe_close(s->sig_fd);
    if (s->cfg.unix_path[0])
        (void)unlink(s->cfg.unix_path);
}

/* ---- /health ----------------------------------------------------------------------------- */

void route_health(conn_t *c, const route_params_t *p)
{
    server_t *s = c->srv;
    (void)p;
    json_t *j = json_pack("{s:s,s:i}", "status", "ok", "protocol", SBX_PROTOCOL);
    if (j && c->authed) {
        server_touch(s);
        json_t *features =
            json_pack("[s,s,s,s,s,s,s]", "exec-stream", "binary-output", "process-stdin",
                      "process-signal", "process-attach", "files-rename", "proxy");
        json_object_set_new(j, "version", json_string(SBX_VERSION));
        json_object_set_new(j, "uptime_ms",
                            json_integer((json_int_t)(loop_now_ms(s->loop) - s->start_ms)));
        json_object_set_new(j, "mode", json_string(s->cfg.host_mode ? "host" : "dedicated"));
        json_object_set_new(j, "auth", json_string(s->cfg.token ? "required" : "disabled"));
        if (s->pool)
            pool_health(s->pool, j);
        else {
            json_object_set_new(j, "sandboxes", json_integer(0));
            /* what the kernel offers (the run's boundary is the VM, not Landlock) */
            json_object_set_new(j, "landlock", landlock_json(landlock_abi()));
        }
        json_object_set_new(j, "processes", json_integer((json_int_t)server_running_procs(s)));
        json_object_set_new(j, "features", features);
    }
    conn_respond_json(c, 200, j);
}
