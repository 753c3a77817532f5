/* SPDX-License-Identifier: MIT */
/* The relay (relay.h): a request to a backend and its framed answer back, both connections
 * kept. The answer's head is parsed strictly (digits-only Content-Length, one value; chunked
 * with Content-Length refused), its body is passed on as it arrives with a chunk scanner that
 * finds where a chunked body ends without changing a byte. Backpressure: the backend is not
 * read while the client's output holds CONN_OUT_HIGH bytes. */
#include "relay.h"

#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "common/macro.h"
#include "common/strutil.h"
#include "conn.h"
#include "http.h"
#include "http/httpd.h"

#define RELAY_READ 16384
#define RELAY_ROUNDS 16

struct relay {
    httpd_t *srv;
    conn_t *c;
    relay_conn_t *k; /* the backend connection (k->w.data is the relay while it runs) */
    buf_t out;       /* request bytes not yet sent */
    buf_t in;        /* answer bytes not yet passed on */
    enum { RL_HEAD, RL_BODY } st;
    enum { FR_LENGTH, FR_CHUNKED, FR_EOF } fr;
    bool passed;   /* the client has had bytes of the answer */
    bool deferred; /* a pump is scheduled (bytes the layer holds, or an answer read early) */
    bool close;    /* the backend said it closes */
    bool ended;
    uint64_t left;
    http_chunks_t ck;
    relay_done_cb cb;
    void *data;
    const char *answer_drop; /* header name prefix dropped from the answer's head, or NULL */
};

/* ---- parsing what the backend says ---------------------------------------------------------- */

static bool has_token(sv_t v, const char *tok)
{
    size_t tl = strlen(tok);
    for (size_t i = 0; i < v.len;) {
        while (i < v.len && (v.p[i] == ' ' || v.p[i] == '\t' || v.p[i] == ','))
            i++;
        size_t s = i;
        while (i < v.len && v.p[i] != ',')
            i++;
        size_t e = i;
        while (e > s && (v.p[e - 1] == ' ' || v.p[e - 1] == '\t'))
            e--;
        if (e - s == tl && sv_eq_lit_nocase(sv_make(v.p + s, tl), tok))
            return true;
    }
    return false;
}

ssize_t relay_parse_head(const char *p, size_t n, relay_head_t *ret)
{
    const char *end = memmem(p, MIN(n, (size_t)RELAY_HEAD_MAX), "\r\n\r\n", 4);
    if (!end)
        return n >= RELAY_HEAD_MAX ? -E2BIG : 0;
    size_t hl = (size_t)(end - p) + 4;
    relay_head_t h = { 0 };
    /* lines end in CRLF, and nothing else is a control character but a tab in a value */
    for (size_t i = 0; i < hl; i++) {
        unsigned char ch = (unsigned char)p[i];
        if (ch == '\r'   ? p[i + 1] != '\n'
            : ch == '\n' ? i == 0 || p[i - 1] != '\r'
                         : ch < 0x20 && ch != '\t')
            return -EPROTO;
        if (ch == 0x7f)
            return -EPROTO;
    }
    /* "HTTP/1.x SSS[ reason]" */
    const char *eol = memmem(p, hl, "\r\n", 2);
    if ((size_t)(eol - p) < 12 || memcmp(p, "HTTP/1.", 7) != 0 || (p[7] != '0' && p[7] != '1') ||
        p[8] != ' ' || p[9] < '1' || p[9] > '5' || p[10] < '0' || p[10] > '9' || p[11] < '0' ||
        p[11] > '9' || (eol - p > 12 && p[12] != ' '))
        return -EPROTO;
    h.status = (p[9] - '0') * 100 + (p[10] - '0') * 10 + (p[11] - '0');
    h.close = p[7] == '0'; /* HTTP/1.0 closes unless it says keep-alive (we do not ask it to) */
    bool te = false;
    for (const char *l = eol + 2; l < end + 2;) {
        const char *le = memmem(l, (size_t)(end + 2 - l), "\r\n", 2);
        const char *colon = memchr(l, ':', (size_t)(le - l));
        if (!colon || colon == l)
            return -EPROTO;
        sv_t name = sv_make(l, (size_t)(colon - l));
        for (size_t i = 0; i < name.len; i++)
            if (name.p[i] == ' ' || name.p[i] == '\t')
                return -EPROTO; /* no space before the colon */
        const char *v = colon + 1, *ve = le;
        while (v < ve && (*v == ' ' || *v == '\t'))
            v++;
        while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
            ve--;
        sv_t val = sv_make(v, (size_t)(ve - v));
        if (sv_eq_lit_nocase(name, "content-length")) {
            uint64_t len;
            if (parse_u64(val, UINT64_MAX / 2, &len) < 0 || (h.has_length && len != h.length))
                return -EPROTO;
            h.has_length = true;
            h.length = len;
        } else if (sv_eq_lit_nocase(name, "transfer-encoding")) {
            te = true;
            h.chunked = has_token(val, "chunked");
        } else if (sv_eq_lit_nocase(name, "connection")) {
            if (has_token(val, "close"))
                h.close = true;
        }
        l = le + 2;
    }
    if (te && (h.has_length || !h.chunked))
        return -EPROTO; /* ambiguous framing: nothing is passed on */
    *ret = h;
    return (ssize_t)hl;
}

/* ---- kept backend connections -------------------------------------------------------------- */

relay_conn_t *relay_conn_new(loop_t *l, int fd, sockio_t *io)
{
    relay_conn_t *k = calloc(1, sizeof *k);
    if (!k) {
        sock_close(fd, io);
        return NULL;
    }
    watcher_init(&k->w, fd, NULL, NULL);
    k->io = io;
    k->loop = l;
    return k;
}

static void relay_conn_free(void *p) { free(p); }

/* Unwatched and freed after the batch: an event already fetched for it finds w.added false. */
static void relay_conn_drop(relay_conn_t *k)
{
    loop_unwatch(k->loop, &k->w);
    if (loop_defer(k->loop, relay_conn_free, k) < 0)
        free(k);
}

void relay_conn_close(relay_conn_t *k)
{
    if (!k)
        return;
    loop_unwatch(k->loop, &k->w); /* before the fd goes */
    k->w.fd = sock_close(k->w.fd, TAKE_PTR(k->io));
    relay_conn_drop(k);
}

void relay_conn_detach(relay_conn_t *k, int *ret_fd, sockio_t **ret_io)
{
    loop_unwatch(k->loop, &k->w); /* before the fd changes hands */
    *ret_fd = TAKE_FD(k->w.fd);
    *ret_io = TAKE_PTR(k->io);
    relay_conn_drop(k);
}

static void relay_conn_on_idle_event(loop_t *l, watcher_t *w, uint32_t ev)
{
    relay_conn_t *k = w->data;
    (void)ev;
    /* The peer closed it or sent something no request asked for: never used again. */
    loop_unwatch(l, &k->w);
    k->w.fd = sock_close(k->w.fd, TAKE_PTR(k->io));
    k->broken = true;
}

void relay_conn_park(relay_conn_t *k, uint64_t now_ms)
{
    k->w.cb = relay_conn_on_idle_event;
    k->w.data = k;
    k->since_ms = now_ms;
    if (loop_watch(k->loop, &k->w, EPOLLIN) < 0)
        relay_conn_on_idle_event(k->loop, &k->w, 0);
}

bool relay_conn_fit(const relay_conn_t *k)
{
    if (k->broken || k->w.fd < 0 || sock_pending(k->io))
        return false;
    char b;
    /* the loop may not have reported a close that arrived since its last wait */
    ssize_t n = recv(k->w.fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n < 0 && errno == EAGAIN;
}

/* ---- the relay ------------------------------------------------------------------------------ */

static void relay_free(void *p)
{
    relay_t *r = p;
    buf_free(&r->out);
    buf_free(&r->in);
    free(r);
}

/* Ends the relay: hands the backend back (reusable) or closes it, tells the owner. */
static void relay_end(relay_t *r, bool reusable, bool ok)
{
    if (r->ended)
        return;
    r->ended = true;
    relay_conn_t *k = TAKE_PTR(r->k);
    if (reusable) {
        relay_conn_park(k, loop_now_ms(r->srv->loop)); /* still watched: no system call */
        if (k->broken) {
            relay_conn_close(k);
            k = NULL;
        }
    } else {
        relay_conn_close(k);
        k = NULL;
    }
    if (r->cb)
        r->cb(r, r->data, k, ok);
    if (loop_defer(r->srv->loop, relay_free, r) < 0)
        relay_free(r);
}

_printf_(2, 3) static void relay_fail(relay_t *r, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    (void)vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    conn_t *c = r->c;
    r->c = NULL;
    if (c) {
        conn_set_handler(c, NULL, NULL);
        if (!r->passed) {
            http_bad_gateway(c, HTTP_CLOSE, "%s", msg);
        } else
            conn_abort(c); /* the answer was cut: the client sees the cut */
    }
    log_debug("relay: %s", msg);
    relay_end(r, false, false);
}

static void relay_complete(relay_t *r)
{
    conn_t *c = r->c;
    r->c = NULL;
    bool reusable = r->fr != FR_EOF && !r->close && r->out.len == 0 && r->in.len == 0;
    conn_set_handler(c, NULL, NULL);
    relay_end(r, reusable, true);
    conn_raw_end(c);
}

/* The backend's head is complete: the client gets it, rewritten for its own connection. */
static int pass_head(relay_t *r, const relay_head_t *h, size_t hl)
{
    conn_t *c = r->c;
    bool bodyless = h->status == 204 || h->status == 304 || sv_eq(c->req.method, SV("HEAD"));
    r->close = h->close;
    r->fr = bodyless ? FR_LENGTH : h->chunked ? FR_CHUNKED : h->has_length ? FR_LENGTH : FR_EOF;
    r->left = bodyless ? 0 : h->length;
    r->ck = (http_chunks_t){ .st = 0 };
    int rc = conn_raw_begin(c, h->status);
    if (rc < 0)
        return rc;
    if (r->fr == FR_EOF || c->req.minor == 0)
        c->keep_alive = false; /* the answer ends when the connection does */
    /* The head is queued on c with the body bytes read with it: one write (one TLS record)
     * carries them, flushed by the caller once the buffer is processed. */
    const char *p = buf_head(&r->in);
    const char *eol = memchr(p, '\r', hl);
    rc = conn_raw_queue(c, p, (size_t)(eol - p) + 2);
    for (const char *l = eol + 2; rc >= 0 && l < p + hl - 2;) {
        const char *le = memmem(l, (size_t)(p + hl - l), "\r\n", 2);
        const char *colon = memchr(l, ':', (size_t)(le - l));
        sv_t name = sv_make(l, (size_t)(colon - l));
        if (!sv_eq_lit_nocase(name, "connection") && !sv_eq_lit_nocase(name, "keep-alive") &&
            !sv_eq_lit_nocase(name, "proxy-connection") &&
            !(r->answer_drop && sv_has_prefix_lit_nocase(name, r->answer_drop)))
            rc = conn_raw_queue(c, l, (size_t)(le - l) + 2);
        l = le + 2;
    }
    if (rc >= 0 && !c->keep_alive)
        rc = conn_raw_queue(c, "Connection: close\r\n", 19);
    if (rc >= 0)
        rc = conn_raw_queue(c, "\r\n", 2);
    buf_consume(&r->in, hl);
    r->passed = true;
    return rc;
}

/* Pass on what the buffer holds (queued on the client's connection: the caller flushes, or
 * relay_complete() does). Returns 1 when the answer is complete, 0 for more, < 0. */
static int relay_process(relay_t *r)
{
    while (r->in.len > 0 || (r->st == RL_BODY && r->fr == FR_LENGTH && r->left == 0)) {
        if (r->st == RL_HEAD) {
            relay_head_t h;
            ssize_t hl = relay_parse_head(buf_head(&r->in), r->in.len, &h);
            if (hl < 0)
                return -EPROTO;
            if (hl == 0)
                return 0;
            if (h.status >= 100 && h.status < 200) {
                if (h.status == 101)
                    return -EPROTO;              /* upgrades go through tunnels, never here */
                buf_consume(&r->in, (size_t)hl); /* 100 Continue and the like: not ours */
                continue;
            }
            int rc = pass_head(r, &h, (size_t)hl);
            if (rc < 0)
                return rc;
            r->st = RL_BODY;
            continue;
        }
        size_t take = r->in.len;
        bool done = false;
        if (r->fr == FR_LENGTH) {
            take = (size_t)MIN((uint64_t)take, r->left);
            r->left -= take;
            done = r->left == 0;
        } else if (r->fr == FR_CHUNKED) {
            ssize_t k = http_scan_chunks(&r->ck, buf_head(&r->in), r->in.len, &done);
            if (k < 0)
                return -EPROTO;
            take = (size_t)k;
        }
        if (take > 0) {
            int rc = conn_raw_queue(r->c, buf_head(&r->in), take);
            if (rc < 0)
                return rc;
            buf_consume(&r->in, take);
        }
        if (done) {
            if (r->in.len > 0)
                r->close = true; /* more than it framed: this connection is not trusted again */
            buf_clear(&r->in);
            return 1;
        }
        if (take == 0)
            return 0;
    }
    return 0;
}

/* Write what relay_process() queued; < 0 when the client's connection broke. */
static int relay_flush(relay_t *r)
{
    conn_flush(r->c);
    return r->c->dead ? -EPIPE : 0;
}

static void relay_watch(relay_t *r)
{
    if (r->ended)
        return;
    uint32_t ev = 0;
    bool paused = r->c && conn_out_full(r->c);
    if (!paused)
        ev |= EPOLLIN;
    if (r->out.len > 0 || (r->k->io && r->k->io->want_write))
        ev |= EPOLLOUT;
    if (loop_watch(r->srv->loop, &r->k->w, ev) < 0)
        relay_fail(r, "cannot watch the backend");
}

static void relay_send(relay_t *r)
{
    while (r->out.len > 0) {
        ssize_t n = sock_send(r->k->w.fd, r->k->io, buf_head(&r->out), r->out.len);
        if (n == -EAGAIN)
            break;
        if (n < 0) {
            /* it may have answered (413, 401) and closed before reading all: read that */
            buf_clear(&r->out);
            r->close = true;
            break;
        }
        buf_consume(&r->out, (size_t)n);
    }
}

static void relay_deferred(void *p);

static void relay_pump(relay_t *r)
{
    relay_send(r);
    for (int round = 0; round < RELAY_ROUNDS && !r->ended; round++) {
        if (r->c && conn_out_full(r->c))
            break; /* on_drain resumes */
        char *space;
        if (buf_reserve(&r->in, RELAY_READ, &space) < 0) {
            relay_fail(r, "the backend's head is too large");
            return;
        }
        ssize_t n = sock_recv(r->k->w.fd, r->k->io, space, RELAY_READ);
        if (n == -EAGAIN)
            break;
        if (n <= 0) {
            if (n == 0 && r->st == RL_BODY && r->fr == FR_EOF) {
                relay_complete(r);
                return;
            }
            relay_fail(r, "the backend closed %s",
                       r->st == RL_HEAD ? "before answering" : "in the middle of its answer");
            return;
        }
        r->in.len += (size_t)n;
        int rc = relay_process(r);
        if (rc < 0) {
            relay_fail(r, "the backend's answer is malformed");
            return;
        }
        if (rc > 0) {
            relay_complete(r);
            return;
        }
        /* what was read in this wake-up goes out together, in writes of a bounded size */
        if (conn_out_pending(r->c) >= RELAY_READ && relay_flush(r) < 0) {
            relay_fail(r, "the client's connection broke");
            return;
        }
        /* A short read emptied a plain socket: another recv() would only say EAGAIN (epoll is
         * level-triggered: later bytes are reported again). A layer returns one record a time. */
        if (!r->k->io && (size_t)n < RELAY_READ)
            break;
    }
    if (r->c && relay_flush(r) < 0) {
        relay_fail(r, "the client's connection broke");
        return;
    }
    relay_watch(r);
    if (!r->ended && !r->deferred && sock_pending(r->k->io) && !(r->c && conn_out_full(r->c))) {
        r->deferred = true; /* decrypted bytes the socket will not report */
        if (loop_defer(r->srv->loop, relay_deferred, r) < 0)
            r->deferred = false;
    }
}

/* Settle what relay_process said before the loop ran, or read what the layer holds. */
static void relay_deferred(void *p)
{
    relay_t *r = p;
    r->deferred = false;
    if (r->ended)
        return;
    int rc = relay_process(r); /* what it queues goes out with what relay_pump reads */
    if (rc > 0)
        relay_complete(r);
    else if (rc < 0)
        relay_fail(r, "the backend's answer is malformed");
    else
        relay_pump(r);
}

static void relay_on_event(loop_t *l, watcher_t *w, uint32_t ev)
{
    relay_t *r = w->data;
    (void)l;
    (void)ev; /* errors show in the reads and writes */
    if (!r->ended)
        relay_pump(r);
}

static void relay_on_close(conn_t *c, bool aborted)
{
    relay_t *r = c->hdata;
    (void)aborted;
    r->c = NULL;
    relay_end(r, false, false);
}

static void relay_on_drain(conn_t *c)
{
    relay_t *r = c->hdata;
    if (!r->ended)
        relay_pump(r);
}

static const handler_ops_t relay_ops = { .on_close = relay_on_close, .on_drain = relay_on_drain };

relay_t *proxy_relay_start(conn_t *c, relay_conn_t *k, buf_t *out, buf_t *in,
                           const char *answer_drop, relay_done_cb cb, void *data)
{
    relay_t *r = calloc(1, sizeof *r);
    if (!r) {
        relay_conn_close(k);
        buf_free(out);
        if (in)
            buf_free(in);
        http_errno(c, 0, -ENOMEM, "relay");
        return NULL;
    }
    *r = (relay_t){ .srv = c->srv,
                    .c = c,
                    .k = k,
                    .out = *out,
                    .cb = cb,
                    .data = data,
                    .answer_drop = answer_drop };
    buf_init(out, 0);
    if (in) {
        r->in = *in;
        buf_init(in, 0);
    }
    r->in.max = RELAY_HEAD_MAX + RELAY_READ;
    k->w.cb = relay_on_event; /* the registration stays as it is: no system call */
    k->w.data = r;
    conn_set_handler(c, &relay_ops, r);
    /* The request goes now; what arrived with the head (and anything after it) is passed on
     * from the loop, so that cb never runs before the owner has r. */
    relay_send(r);
    relay_watch(r);
    if (r->in.len > 0 && !r->ended) {
        r->deferred = true;
        if (loop_defer(c->srv->loop, relay_deferred, r) < 0)
            r->deferred = false;
    }
    return r;
}

void proxy_relay_cut(relay_t *r)
{
    conn_t *c = r->c;
    r->c = NULL;
    if (c) {
        conn_set_handler(c, NULL, NULL);
        conn_abort(c);
    }
    relay_end(r, false, false);
}
