/* SPDX-License-Identifier: MIT */
/* /v1/proxy/{port}/{rest...}: the port proxy (reference §3.9).
 *
 * Two phases. While the backend connection is being set up, the request is still an HTTP
 * request on its conn_t with a pending_t hanging off it, so refusals are answered as JSON
 * errors: 404 for a bad port, 502 when the backend refuses or is unreachable, 504 when the
 * connect does not complete within PROXY_CONNECT_TIMEOUT_MS. Once the backend accepts, the
 * client socket is hijacked and becomes one side of a tunnel_t. The replayed head and any
 * bytes already read past it go first; then both directions are copied until each reaches
 * EOF, and a half-close is passed on with shutdown(SHUT_WR). Plain HTTP, chunked responses,
 * SSE and WebSocket upgrades all pass through unchanged.
 *
 * Backpressure: a direction holds at most PROXY_CHUNK bytes that its destination did not take
 * yet, and its source is not read while it holds any, so a slow reader slows the writer down
 * instead of growing the server. Established tunnels have no timeouts (long-lived
 * WebSockets). They count against SBX_MAX_CONNECTIONS through srv->n_tunnels.
 *
 * Known limitation, as in the reference: a tunnel is authenticated and routed once. Later
 * requests on the same client connection reach the same backend without another check. */
#include "proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>

#include "common/log.h"
#include "server/pool.h"
#include "server/routes.h"
#include "server/server.h"

#define TUNNEL_ROUNDS 16 /* copies per event and direction before yielding to the loop */

typedef struct {
    buf_t pend; /* read from the source, not yet taken by the destination */
    bool eof;   /* the source reached EOF (or the direction was dropped) */
    bool shut;  /* the destination was shut down for writing: this direction is done */
} tdir_t;

typedef struct {
    watcher_t w;
    bool gone;    /* HUP or ERR seen: unwatched, nothing more can be written to it */
    sockio_t *io; /* the transport over w.fd (TLS), NULL: plain */
} tside_t;

struct tunnel {
    server_t *srv;
    tside_t client, backend;
    tdir_t up;   /* client -> backend */
    tdir_t down; /* backend -> client */
    bool dead;
    sandbox_t *sb;     /* host mode: an open tunnel is activity, so no idle eviction under it */
    climit_hold_t lim; /* the client connection's source and owner counters (connlimit.h) */
    tunnel_close_cb on_close; /* the owner's lease (sbx-node), told once when the tunnel ends */
    void *on_close_data;
    tunnel_t *prev, *next;
};

typedef struct {
    server_t *srv;
    conn_t *conn; /* NULL once the connection went away */
    watcher_t w;  /* the backend socket while connect() completes */
    timer_t_ deadline;
    buf_t head; /* the request head to replay */
    uint16_t port;
} pending_t;

/* ---- backend ----------------------------------------------------------------------------- */

int proxy_open_tcp(uint16_t port, int *ret_fd)
{
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    _cleanup_close_ int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return negative_errno();
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    /* EINTR on a non-blocking connect leaves it running, like EINPROGRESS. */
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0 && errno != EINPROGRESS &&
        errno != EINTR)
        return negative_errno();
    *ret_fd = TAKE_FD(fd);
    return 0;
}

/* The one place that decides where a proxied request goes. Host mode will add the pinned
 * unix socket <home>/.sbx/proxy/<port>.sock here. */
/* Host mode: sandboxes cannot bind TCP, so a service listens on <home>/.sbx/proxy/<port>.sock.
 * The inode is pinned with O_PATH (resolved beneath the home, no symlink anywhere), must be a
 * socket owned by the sandbox uid, is connected through the pinned descriptor (so the path is
 * not walked again), and the listening peer must run as the sandbox uid (SO_PEERCRED). */
static int proxy_open_sandbox(const sandbox_t *sb, uint16_t port, int *ret_fd)
{
    char rel[48], via[48];
    (void)snprintf(rel, sizeof rel, ".sbx/proxy/%u.sock", (unsigned)port);
    struct open_how how = { .flags = O_PATH | O_CLOEXEC | O_NOFOLLOW,
                            .resolve =
                                RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS };
    _cleanup_close_ int pin = (int)syscall(SYS_openat2, sb->home_fd, rel, &how, sizeof how);
    if (pin < 0)
        return errno == ELOOP || errno == EXDEV ? -ECONNREFUSED : negative_errno();
    struct stat st;
    if (fstat(pin, &st) < 0)
        return negative_errno();
    if (!S_ISSOCK(st.st_mode) || st.st_uid != sb->uid)
        return -ECONNREFUSED;
    _cleanup_close_ int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return negative_errno();
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    (void)snprintf(via, sizeof via, "/proc/self/fd/%d", pin);
    memcpy(sa.sun_path, via, strlen(via) + 1);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0)
        return errno == EAGAIN ? -ECONNREFUSED : negative_errno();
    struct ucred cred;
    socklen_t cl = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) < 0 || cred.uid != sb->uid)
        return -ECONNREFUSED;
    *ret_fd = TAKE_FD(fd);
    return 0;
}

static int proxy_backend_open(conn_t *c, const route_params_t *p, int *ret_fd)
{
    if (c->sb)
        return proxy_open_sandbox(c->sb, p->port, ret_fd);
    return proxy_open_tcp(p->port, ret_fd);
}

static void proxy_fail(conn_t *c, int err, uint16_t port)
{
    switch (err) {
    case -ENOMEM:
    case -ENOBUFS:
    case -EMFILE:
    case -ENFILE:
        conn_respond_error(c, 503, "proxy: cannot open a backend connection: %s", strerror(-err));
        break;
    case -ETIMEDOUT:
        conn_respond_error(c, 504, "proxy: port %u did not accept the connection", port);
        break;
    default:
        conn_respond_error(c, 502, "proxy: cannot connect to port %u: %s", port, strerror(-err));
        break;
    }
}

static bool header_is_secret(sv_t name)
{
    return sv_eq_lit_nocase(name, "authorization") || sv_eq_lit_nocase(name, "x-sandbox-token");
}

/* The head the backend sees: the method, the path after /v1/proxy/{port} (or "/") with the
 * raw query, the client's HTTP version, and every header except the credentials. */
static int build_head(const conn_t *c, const route_params_t *p, buf_t *out)
{
    const http_request_t *rq = &c->req;
    sv_t target = p->rest.len > 0 ? p->rest : SV("/");
    const char *q = memchr(rq->target.p, '?', rq->target.len);
    sv_t query = q ? sv_make(q, rq->target.len - (size_t)(q - rq->target.p)) : SV("");
    /* The result is never longer than the client's head plus a byte per header. */
    buf_init(out, 2 * HTTP_MAX_HEAD);
    int r = buf_printf(out, SV_FMT " " SV_FMT SV_FMT " HTTP/1.%d\r\n", SV_ARG(rq->method),
                       SV_ARG(target), SV_ARG(query), rq->minor);
    for (size_t i = 0; r >= 0 && i < rq->n_headers; i++) {
        const http_header_t *h = &rq->headers[i];
        if (!header_is_secret(h->name))
            r = buf_printf(out, SV_FMT ": " SV_FMT "\r\n", SV_ARG(h->name), SV_ARG(h->value));
    }
    if (r >= 0)
        r = buf_append(out, "\r\n", 2);
    if (r < 0)
        buf_free(out);
    return r;
}

int proxy_forward_head(const http_request_t *rq, sv_t target, const char *const *drop,
                       const char *extra, bool keep, buf_t *out)
{
    sv_t up;
    /* Only a WebSocket upgrade keeps its connection (and its tunnel) past the first answer; any
     * other Upgrade header is dropped, so that no second request can follow on this hop. */
    bool upgrade = http_header_get(rq, "upgrade", &up) && sv_eq_lit_nocase(up, "websocket");
    buf_init(out, 2 * HTTP_MAX_HEAD + 4096);
    int r = buf_printf(out, SV_FMT " " SV_FMT " HTTP/1.1\r\n", SV_ARG(rq->method), SV_ARG(target));
    for (size_t i = 0; r >= 0 && i < rq->n_headers; i++) {
        const http_header_t *h = &rq->headers[i];
        bool skip = sv_eq_lit_nocase(h->name, "connection") ||
                    sv_eq_lit_nocase(h->name, "keep-alive") ||
                    sv_eq_lit_nocase(h->name, "proxy-connection") ||
                    (!upgrade && sv_eq_lit_nocase(h->name, "upgrade")) ||
                    (keep && sv_eq_lit_nocase(h->name, "expect")); /* the body is sent whole */
        for (size_t d = 0; !skip && drop && drop[d]; d++)
            skip = sv_eq_lit_nocase(h->name, drop[d]);
        if (!skip)
            r = buf_printf(out, SV_FMT ": " SV_FMT "\r\n", SV_ARG(h->name), SV_ARG(h->value));
    }
    if (r >= 0 && extra)
        r = buf_append(out, extra, strlen(extra));
    /* One request per forwarded connection: the next request on the client's connection is
     * authorized again, never carried by this hop's tunnel. Upgrades keep their tunnel. */
    if (r >= 0 && keep && !upgrade) /* a relay: HTTP/1.1 keeps the connection by default */
        r = buf_append(out, "\r\n", 2);
    else if (r >= 0)
        r = buf_printf(out, "Connection: %s\r\n\r\n", upgrade ? "Upgrade" : "close");
    if (r < 0)
        buf_free(out);
    return r;
}

/* ---- established tunnels ----------------------------------------------------------------- */

static void tunnel_free(void *p)
{
    tunnel_t *t = p;
    loop_unwatch(t->srv->loop, &t->client.w);
    loop_unwatch(t->srv->loop, &t->backend.w);
    sock_close(t->client.w.fd, t->client.io);
    sock_close(t->backend.w.fd, t->backend.io);
    buf_free(&t->up.pend);
    buf_free(&t->down.pend);
    sandbox_release(t->sb);
    free(t);
}

static void tunnel_close(tunnel_t *t)
{
    server_t *s = t->srv;
    if (t->dead)
        return;
    t->dead = true;
    if (t->on_close)
        t->on_close(t, t->on_close_data);
    t->on_close = NULL;
    loop_unwatch(s->loop, &t->client.w);
    loop_unwatch(s->loop, &t->backend.w);
    if (t->prev)
        t->prev->next = t->next;
    else if (s->tunnels == t)
        s->tunnels = t->next;
    if (t->next)
        t->next->prev = t->prev;
    t->prev = t->next = NULL;
    s->n_tunnels--;
    climit_hold_release(&t->lim);
    if (loop_defer(s->loop, tunnel_free, t) < 0)
        tunnel_free(t);
}

void proxy_free_all(server_t *s)
{
    while (s->tunnels)
        tunnel_close(s->tunnels);
}

/* Write what x takes now: bytes written, 0 when it would block, or -errno. */
static ssize_t send_some(const tside_t *x, const char *p, size_t n)
{
    ssize_t w = sock_send(x->w.fd, x->io, p, n);
    return w == -EAGAIN ? 0 : w;
}

/* Copy one direction until a side would block. Returns 0, or -errno when the tunnel must
 * close; *moved is set when bytes moved. */
static int tdir_pump(tdir_t *d, const tside_t *src, const tside_t *dst, bool *moved)
{
    char chunk[PROXY_CHUNK];
    /* A gone source is not watched any more: read it to the end now, it cannot block. */
    for (int round = 0; (round < TUNNEL_ROUNDS || src->gone) && !d->shut; round++) {
        if (d->pend.len > 0) {
            ssize_t w = send_some(dst, buf_head(&d->pend), d->pend.len);
            if (w <= 0)
                return (int)w; /* 0: EPOLLOUT on dst resumes the copy */
            buf_consume(&d->pend, (size_t)w);
            *moved = true;
            if (d->pend.len > 0)
                continue;
            buf_shrink_if_idle(&d->pend, 0); /* idle tunnels hold no buffers */
        }
        if (d->eof)
            break;
        ssize_t n = sock_recv(src->w.fd, src->io, chunk, sizeof chunk);
        if (n == -EAGAIN) {
            d->eof = src->gone; /* nothing would wake us for more */
            break;
        }
        if (n < 0)
            return (int)n;
        if (n == 0) {
            d->eof = true;
            break;
        }
        *moved = true;
        ssize_t w = send_some(dst, chunk, (size_t)n);
        if (w < 0)
            return (int)w;
        if (w < n) {
            int r = buf_append(&d->pend, chunk + w, (size_t)(n - w));
            if (r < 0)
                return r;
        }
        /* A short read emptied the socket: another recv() would only say EAGAIN (epoll is
         * level-triggered: later bytes are reported again). A gone source is read to the end. */
        if ((size_t)n < sizeof chunk && !src->gone && !src->io)
            break;
    }
    if (d->eof && d->pend.len == 0 && !d->shut) {
        sock_shutdown_write(dst->w.fd, dst->io);
        d->shut = true;
    }
    return 0;
}

static int tside_watch(tunnel_t *t, tside_t *x, const tdir_t *from, const tdir_t *into)
{
    if (x->gone)
        return 0;
    uint32_t ev = 0;
    if (!from->eof && from->pend.len == 0)
        ev |= EPOLLIN;
    if (into->pend.len > 0)
        ev |= EPOLLOUT;
    return loop_watch(t->srv->loop, &x->w, ev);
}

/* x reported HUP or ERR: nothing more can be written to it, so the direction into it ends
 * here. What x still has for us is read by the next pump. */
static void tside_gone(tunnel_t *t, tside_t *x)
{
    tdir_t *into = x == &t->client ? &t->down : &t->up;
    x->gone = true;
    loop_unwatch(t->srv->loop, &x->w);
    buf_free(&into->pend);
    into->eof = into->shut = true;
}

static void tunnel_pump(tunnel_t *t)
{
    bool moved = false;
    int r = tdir_pump(&t->up, &t->client, &t->backend, &moved);
    if (r >= 0)
        r = tdir_pump(&t->down, &t->backend, &t->client, &moved);
    if (r >= 0 && moved)
        server_touch(t->srv);
    if (r >= 0 && !(t->up.shut && t->down.shut)) {
        r = tside_watch(t, &t->client, &t->up, &t->down);
        if (r >= 0)
            r = tside_watch(t, &t->backend, &t->down, &t->up);
        if (r >= 0)
            return;
    }
    if (r < 0)
        log_debug("proxy tunnel closed: %s", strerror(-r));
    tunnel_close(t);
}

static void tunnel_on_event(loop_t *l, watcher_t *w, uint32_t ev)
{
    tunnel_t *t = w->data;
    (void)l;
    if (t->dead)
        return;
    if (ev & (EPOLLERR | EPOLLHUP))
        tside_gone(t, w == &t->client.w ? &t->client : &t->backend);
    tunnel_pump(t);
}

void proxy_tunnel_close(tunnel_t *t) { tunnel_close(t); }

/* The backend accepted: take the client socket away from HTTP and start copying. Takes bfd
 * and the contents of head (and of down_pre). */
tunnel_t *proxy_tunnel_start(conn_t *c, int bfd, sockio_t *bio, buf_t *head, buf_t *down_pre,
                             tunnel_close_cb cb, void *cb_data)
{
    server_t *s = c->srv;
    _cleanup_close_ int fd = bfd;
    _cleanup_(sockio_freep) sockio_t *bio_owned = bio;
    char *space;
    if (c->dead)
        return NULL;
    /* What can fail is done before the hijack, while an HTTP answer is still possible: the
     * bytes already read past the head join the replayed head. */
    tunnel_t *t = calloc(1, sizeof *t);
    size_t total;
    if (!t || !size_add_ok(head->len, c->in.len, &total)) {
        free(t);
        proxy_fail(c, -ENOMEM, 0);
        return NULL;
    }
    head->max = MAX(total, (size_t)PROXY_CHUNK);
    if (buf_reserve(head, c->in.len, &space) < 0) {
        free(t);
        proxy_fail(c, -ENOMEM, 0);
        return NULL;
    }
    int cfd;
    sockio_t *cio;
    buf_t early;
    sandbox_t *sb = sandbox_hold(c->sb); /* taken while c is still ours */
    climit_hold_t lim = c->lim;          /* the tunnel holds what the connection held */
    c->lim = (climit_hold_t){ 0 };
    if (conn_hijack(c, &cfd, &cio, &early) < 0) {
        c->lim = lim;
        sandbox_release(sb);
        free(t);
        return NULL;
    }
    (void)buf_append(head, buf_head(&early), early.len); /* reserved above */
    buf_free(&early);
    *t = (tunnel_t){
        .srv = s, .up.pend = *head, .sb = sb, .lim = lim, .on_close = cb, .on_close_data = cb_data
    };
    buf_init(head, 0);
    if (down_pre && down_pre->len > 0) {
        t->down.pend = *down_pre; /* what the backend already answered goes first */
        t->down.pend.max = MAX(t->down.pend.max, (size_t)PROXY_CHUNK);
        buf_init(down_pre, 0);
    } else
        buf_init(&t->down.pend, PROXY_CHUNK);
    watcher_init(&t->client.w, cfd, tunnel_on_event, t);
    watcher_init(&t->backend.w, TAKE_FD(fd), tunnel_on_event, t);
    t->client.io = cio;
    t->backend.io = TAKE_PTR(bio_owned);
    t->next = s->tunnels;
    if (s->tunnels)
        s->tunnels->prev = t;
    s->tunnels = t;
    s->n_tunnels++;
    /* What is ready to go is sent now (the sockets are connected and usually have room);
     * anything else, errors included, is left to the loop, so cb never runs before the caller
     * has t. */
    ssize_t w = t->up.pend.len ? send_some(&t->backend, buf_head(&t->up.pend), t->up.pend.len) : 0;
    if (w > 0)
        buf_consume(&t->up.pend, (size_t)w);
    w = t->down.pend.len ? send_some(&t->client, buf_head(&t->down.pend), t->down.pend.len) : 0;
    if (w > 0)
        buf_consume(&t->down.pend, (size_t)w);
    int r = tside_watch(t, &t->client, &t->up, &t->down);
    if (r >= 0)
        r = tside_watch(t, &t->backend, &t->down, &t->up);
    if (r < 0) {
        t->on_close = NULL;
        tunnel_close(t);
        return NULL;
    }
    return t;
}

/* ---- connecting -------------------------------------------------------------------------- */

static void pending_free(void *p)
{
    pending_t *pc = p;
    safe_close(pc->w.fd);
    buf_free(&pc->head);
    free(pc);
}

/* Detach from the connection, stop watching, and free after this batch of events. */
static void pending_release(pending_t *pc)
{
    loop_t *l = pc->srv->loop;
    loop_unwatch(l, &pc->w);
    timer_disarm(l, &pc->deadline);
    if (pc->conn)
        conn_set_handler(pc->conn, NULL, NULL);
    pc->conn = NULL;
    if (loop_defer(l, pending_free, pc) < 0)
        pending_free(pc);
}

static void pending_on_conn_close(conn_t *c, bool aborted)
{
    pending_t *pc = c->hdata;
    (void)aborted;
    pc->conn = NULL; /* the client left before the backend answered */
    pending_release(pc);
}

static const handler_ops_t pending_ops = { .on_close = pending_on_conn_close };

static void pending_on_connect(loop_t *l, watcher_t *w, uint32_t ev)
{
    pending_t *pc = w->data;
    int err = 0;
    socklen_t sl = sizeof err;
    if (getsockopt(w->fd, SOL_SOCKET, SO_ERROR, &err, &sl) < 0)
        err = errno;
    else if (err == 0 && (ev & (EPOLLERR | EPOLLHUP)))
        err = ECONNRESET;
    conn_t *c = pc->conn;
    uint16_t port = pc->port;
    buf_t head = pc->head;
    buf_init(&pc->head, 0);
    loop_unwatch(l, &pc->w);
    int fd = TAKE_FD(pc->w.fd);
    pending_release(pc);
    if (!c || err != 0) {
        safe_close(fd);
        buf_free(&head);
        if (c)
            proxy_fail(c, -err, port);
        return;
    }
    (void)proxy_tunnel_start(c, fd, NULL, &head, NULL, NULL, NULL);
    buf_free(&head);
}

static void pending_on_timeout(loop_t *l, timer_t_ *t)
{
    pending_t *pc = t->data;
    conn_t *c = pc->conn;
    uint16_t port = pc->port;
    (void)l;
    pending_release(pc);
    if (c)
        proxy_fail(c, -ETIMEDOUT, port);
}

void route_proxy(conn_t *c, const route_params_t *p)
{
    loop_t *l = c->srv->loop;
    int fd = -EBADF;
    if (p->port == 0) {
        conn_respond_error(c, 404, "proxy: invalid port (expected 1..65535)");
        return;
    }
    pending_t *pc = calloc(1, sizeof *pc);
    if (!pc) {
        proxy_fail(c, -ENOMEM, p->port);
        return;
    }
    pc->srv = c->srv;
    pc->port = p->port;
    watcher_init(&pc->w, -EBADF, pending_on_connect, pc);
    timer_init(&pc->deadline, pending_on_timeout, pc);
    int r = build_head(c, p, &pc->head);
    if (r >= 0)
        r = proxy_backend_open(c, p, &fd);
    if (r >= 0) {
        pc->w.fd = fd;
        /* Completion (or refusal) of the non-blocking connect shows as EPOLLOUT. */
        r = loop_watch(l, &pc->w, EPOLLOUT);
    }
    if (r >= 0)
        r = timer_arm(l, &pc->deadline, PROXY_CONNECT_TIMEOUT_MS);
    if (r < 0) {
        loop_unwatch(l, &pc->w);
        pending_free(pc);
        proxy_fail(c, r, p->port);
        return;
    }
    pc->conn = c;
    conn_set_handler(c, &pending_ops, pc);
}
