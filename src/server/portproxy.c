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
 * The tunnel itself (backpressure, limits) is the HTTP core's (http/proxy.c); established
 * tunnels count against SBX_MAX_CONNECTIONS, and on a pool host one sandbox holds at most a
 * quarter of them (proxy_tunnels_max): its service's clients, or a service that never lets a
 * connection go, cannot take the slots of its siblings and of the host's own calls.
 *
 * Known limitation, as in the reference: a tunnel is authenticated and routed once. Later
 * requests on the same client connection reach the same backend without another check. */
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>

#include "common/log.h"
#include "http/proxy.h"
#include "pool.h"
#include "routes.h"
#include "server.h"

typedef struct {
    loop_t *loop;
    conn_t *conn; /* NULL once the connection went away */
    watcher_t w;  /* the backend socket while connect() completes */
    timer_t_ deadline;
    buf_t head; /* the request head to replay */
    uint16_t port;
} pending_t;

/* ---- backend ----------------------------------------------------------------------------- */

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
    const sandbox_t *sb = conn_sandbox(c);
    if (sb)
        return proxy_open_sandbox(sb, p->port, ret_fd);
    return proxy_open_tcp(p->port, ret_fd);
}

/* The most tunnels one pooled sandbox holds at once: a quarter of the server's connections. */
static unsigned proxy_tunnels_max(const server_t *s)
{
    uint64_t q = s->cfg.http.max_connections / 4;
    return q > 0 ? (unsigned)MIN(q, (uint64_t)UINT_MAX) : 1;
}

static void sandbox_tunnel_closed(tunnel_t *t, void *data)
{
    sandbox_t *sb = data;
    (void)t;
    if (sb->tunnels > 0)
        sb->tunnels--;
}

static void proxy_fail(conn_t *c, int err, uint16_t port)
{
    switch (err) {
    case -ENOMEM:
    case -ENOBUFS:
    case -EMFILE:
    case -ENFILE:
        http_unavailable(c, 0, "proxy: cannot open a backend connection: %s", strerror(-err));
        break;
    case -ETIMEDOUT:
        http_gateway_timeout(c, 0, "proxy: port %u did not accept the connection", port);
        break;
    default:
        http_bad_gateway(c, 0, "proxy: cannot connect to port %u: %s", port, strerror(-err));
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
    loop_t *l = pc->loop;
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
    /* the sandbox is held by the connection, and then by the tunnel, past the callback */
    sandbox_t *sb = (sandbox_t *)conn_sandbox(c);
    if (proxy_tunnel_start(c, fd, NULL, &head, NULL, NULL, sb ? sandbox_tunnel_closed : NULL, sb) &&
        sb)
        sb->tunnels++;
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
    loop_t *l = server_of(c)->loop;
    int fd = -EBADF;
    if (p->port == 0) {
        http_not_found(c, 0, "proxy: invalid port (expected 1..65535)");
        return;
    }
    const sandbox_t *sb = conn_sandbox(c);
    if (sb && sb->tunnels >= proxy_tunnels_max(server_of(c))) {
        http_unavailable(c, 0,
                         "proxy: this sandbox has %u connections open through its port proxy, "
                         "the most one sandbox may hold; close some",
                         sb->tunnels);
        return;
    }
    pending_t *pc = calloc(1, sizeof *pc);
    if (!pc) {
        proxy_fail(c, -ENOMEM, p->port);
        return;
    }
    pc->loop = l;
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
