/* SPDX-License-Identifier: MIT */
/* Proxy plumbing of the HTTP core: the head a forwarding hop sends (proxy_forward_head) and
 * tunnels. A tunnel takes a connection's socket away from HTTP (conn_hijack) once a backend
 * accepted, and copies both directions until each reaches EOF; a half-close is passed on with
 * shutdown(SHUT_WR). Plain HTTP, chunked responses, SSE and WebSocket upgrades all pass through
 * unchanged. What the connection held moves into the tunnel: its fair-limit counters and its
 * owner data (conn_set_owner), released when the tunnel ends.
 *
 * Backpressure: a direction holds at most PROXY_CHUNK bytes that its destination did not take
 * yet, and its source is not read while it holds any, so a slow reader slows the writer down
 * instead of growing the server. An established tunnel has no timeout while its client still
 * sends (long-lived WebSockets); once the client has finished (EOF: it closed, or half-closed),
 * the backend has PROXY_HALF_CLOSED_MS of silence at most before both sides are closed, so a
 * backend that never answers nor closes cannot keep the tunnels of clients that are gone. They
 * count against max_connections through httpd_t.n_tunnels. */
#include "proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include "common/log.h"
#include "http/conn.h"
#include "http/httpd.h"
#include "http/relay.h"

#define TUNNEL_ROUNDS 16 /* copies per event and direction before yielding to the loop */

typedef struct {
    buf_t pend; /* read from the source, not yet taken by the destination */
    bool eof;   /* the source reached EOF (or the direction was dropped) */
    bool shut;  /* the destination was shut down for writing: this direction is done */
    /* backend -> client with an answer filter: headers whose name begins with drop (any case)
     * are taken out of the answer's heads (1xx ones, then the first other one) while head
     * collects them; NULL once those have passed, and then bytes pass unchanged */
    const char *drop;
    buf_t head;
} tdir_t;

typedef struct {
    watcher_t w;
    bool gone;    /* HUP or ERR seen: unwatched, nothing more can be written to it */
    sockio_t *io; /* the transport over w.fd (TLS), NULL: plain */
} tside_t;

struct tunnel {
    httpd_t *srv;
    tside_t client, backend;
    tdir_t up;   /* client -> backend */
    tdir_t down; /* backend -> client */
    bool dead;
    bool deferred; /* a pump is scheduled for bytes a layer holds (the socket will not say) */
    /* the connection's owner data, released when the tunnel ends (sbx-server: a hold on its
     * sandbox, so that an open tunnel keeps it from idle eviction) */
    const conn_owner_ops_t *owner_ops;
    void *owner;
    climit_hold_t lim;        /* the client connection's source and owner counters (connlimit.h) */
    tunnel_close_cb on_close; /* the owner's lease (sbx-node), told once when the tunnel ends */
    void *on_close_data;
    timer_t_ half_t; /* armed while the client has finished and the backend is silent */
    tunnel_t *prev, *next;
};

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
    buf_free(&t->down.head);
    if (t->owner_ops && t->owner_ops->release)
        t->owner_ops->release(t->owner);
    free(t);
}

static void tunnel_close(tunnel_t *t)
{
    httpd_t *s = t->srv;
    if (t->dead)
        return;
    t->dead = true;
    if (t->on_close)
        t->on_close(t, t->on_close_data);
    t->on_close = NULL;
    timer_disarm(s->loop, &t->half_t);
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

void proxy_free_all(httpd_t *s)
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

/* Bytes of the backend's answer while its heads are filtered (d->drop): collected until a
 * head is complete, checked as the relay checks one (relay_parse_head: a malformed or
 * oversized head ends the tunnel, nothing of it passed on), and queued on d->pend without
 * the dropped headers. A 1xx head other than 101 is followed by another head, filtered too;
 * after the first other head the filter ends and the rest passes unchanged. */
static int tdir_filter(tdir_t *d, const char *p, size_t n)
{
    d->head.max = RELAY_HEAD_MAX + PROXY_CHUNK;
    int r = buf_append(&d->head, p, n);
    while (r >= 0 && d->drop && d->head.len > 0) {
        relay_head_t h;
        const char *hp = buf_head(&d->head);
        ssize_t hl = relay_parse_head(hp, d->head.len, &h);
        if (hl < 0)
            return (int)hl;
        if (hl == 0)
            return 0; /* more to come */
        size_t need;
        if (!size_add_ok(d->pend.len, (size_t)hl, &need))
            return -ENOMEM;
        d->pend.max = MAX(d->pend.max, need);
        const char *eol = memmem(hp, (size_t)hl, "\r\n", 2);
        r = buf_append(&d->pend, hp, (size_t)(eol - hp) + 2);
        for (const char *l = eol + 2; r >= 0 && l < hp + hl - 2;) {
            const char *le = memmem(l, (size_t)(hp + hl - l), "\r\n", 2);
            const char *colon = memchr(l, ':', (size_t)(le - l));
            if (!sv_has_prefix_lit_nocase(sv_make(l, (size_t)(colon - l)), d->drop))
                r = buf_append(&d->pend, l, (size_t)(le - l) + 2);
            l = le + 2;
        }
        if (r >= 0)
            r = buf_append(&d->pend, "\r\n", 2);
        buf_consume(&d->head, (size_t)hl);
        if (h.status >= 200 || h.status == 101)
            d->drop = NULL; /* the answer itself (or the switch): what follows is its body */
    }
    if (r >= 0 && !d->drop && d->head.len > 0) {
        size_t need;
        if (!size_add_ok(d->pend.len, d->head.len, &need))
            return -ENOMEM;
        d->pend.max = MAX(d->pend.max, need);
        r = buf_append(&d->pend, buf_head(&d->head), d->head.len);
    }
    if (!d->drop)
        buf_free(&d->head);
    return r < 0 ? r : 0;
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
        if (d->drop) { /* an answer head being filtered: queued on pend, sent next round */
            int r = tdir_filter(d, chunk, (size_t)n);
            if (r < 0)
                return r;
            continue;
        }
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

static void tunnel_pump(tunnel_t *t);

static void tunnel_deferred(void *p)
{
    tunnel_t *t = p;
    t->deferred = false;
    if (!t->dead)
        tunnel_pump(t);
}

/* A layer (TLS, reading ahead) may hold bytes of a side that epoll will never report: a
 * direction that wants them gets a pump after this batch of events. */
static void tunnel_check_pending(tunnel_t *t)
{
    bool up = !t->up.eof && t->up.pend.len == 0 && sock_pending(t->client.io);
    bool down = !t->down.eof && t->down.pend.len == 0 && sock_pending(t->backend.io);
    if ((up || down) && !t->deferred && !t->dead) {
        t->deferred = true;
        if (loop_defer(t->srv->loop, tunnel_deferred, t) < 0)
            t->deferred = false;
    }
}

static void tunnel_half_closed_expired(loop_t *l, timer_t_ *tm)
{
    tunnel_t *t = tm->data;
    (void)l;
    log_debug("proxy tunnel closed: the client finished and the backend was silent for %d ms",
              PROXY_HALF_CLOSED_MS);
    tunnel_close(t);
}

static void tunnel_pump(tunnel_t *t)
{
    bool moved = false, answered = false;
    int r = tdir_pump(&t->up, &t->client, &t->backend, &moved);
    if (r >= 0)
        r = tdir_pump(&t->down, &t->backend, &t->client, &answered);
    if (r >= 0 && (moved || answered))
        httpd_touch(t->srv);
    /* the client has finished: the backend's silence is counted from then, or from the last
     * bytes it sent */
    if (r >= 0 && t->up.eof && !t->down.shut && (answered || !timer_armed(&t->half_t)))
        timer_arm(t->srv->loop, &t->half_t, PROXY_HALF_CLOSED_MS);
    if (r >= 0 && !(t->up.shut && t->down.shut)) {
        r = tside_watch(t, &t->client, &t->up, &t->down);
        if (r >= 0)
            r = tside_watch(t, &t->backend, &t->down, &t->up);
        if (r >= 0) {
            tunnel_check_pending(t);
            return;
        }
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
                             const char *answer_drop, tunnel_close_cb cb, void *cb_data)
{
    httpd_t *s = c->srv;
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
        http_unavailable(c, 0, "proxy: cannot set up a tunnel: %s", strerror(ENOMEM));
        return NULL;
    }
    head->max = MAX(total, (size_t)PROXY_CHUNK);
    if (buf_reserve(head, c->in.len, &space) < 0) {
        free(t);
        http_unavailable(c, 0, "proxy: cannot set up a tunnel: %s", strerror(ENOMEM));
        return NULL;
    }
    int cfd;
    sockio_t *cio;
    buf_t early;
    /* taken while c is still ours: the tunnel holds what the connection held */
    const conn_owner_ops_t *owner_ops;
    void *owner = conn_take_owner(c, &owner_ops);
    climit_hold_t lim = c->lim;
    c->lim = (climit_hold_t){ 0 };
    if (conn_hijack(c, &cfd, &cio, &early) < 0) {
        c->lim = lim;
        conn_set_owner(c, owner_ops, owner);
        free(t);
        return NULL;
    }
    (void)buf_append(head, buf_head(&early), early.len); /* reserved above */
    buf_free(&early);
    *t = (tunnel_t){ .srv = s,
                     .up.pend = *head,
                     .owner_ops = owner_ops,
                     .owner = owner,
                     .lim = lim,
                     .on_close = cb,
                     .on_close_data = cb_data };
    buf_init(head, 0);
    t->down.drop = answer_drop;
    buf_init(&t->down.head, 0);
    if (answer_drop && down_pre && down_pre->len > 0) { /* filtered like the bytes after it */
        buf_init(&t->down.pend, PROXY_CHUNK);
        int fr = tdir_filter(&t->down, buf_head(down_pre), down_pre->len);
        buf_free(down_pre);
        if (fr < 0)
            t->down.eof = true; /* nothing of a malformed head goes out: the client sees EOF */
    } else if (down_pre && down_pre->len > 0) {
        t->down.pend = *down_pre; /* what the backend already answered goes first */
        t->down.pend.max = MAX(t->down.pend.max, (size_t)PROXY_CHUNK);
        buf_init(down_pre, 0);
    } else
        buf_init(&t->down.pend, PROXY_CHUNK);
    watcher_init(&t->client.w, cfd, tunnel_on_event, t);
    watcher_init(&t->backend.w, TAKE_FD(fd), tunnel_on_event, t);
    timer_init(&t->half_t, tunnel_half_closed_expired, t);
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
    tunnel_check_pending(t); /* what the client sent past its head, read ahead by its layer */
    return t;
}
