/* SPDX-License-Identifier: MIT */
#include "conn.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/sendfile.h>
#include <sys/socket.h>

#include "common/log.h"
#include "http/httpd.h"

#define CONN_IN_MAX (HTTP_MAX_HEAD + 256 * 1024)
#define CONN_READ_CHUNK (256 * 1024)

static void conn_on_event(loop_t *l, watcher_t *w, uint32_t ev);
static void conn_on_deadline(loop_t *l, timer_t_ *t);
static void conn_process_input(conn_t *c);
static void conn_update_interest(conn_t *c);

static void conn_destroy(void *p)
{
    conn_t *c = p;
    httpd_t *s = c->srv;
    if (c->ops && c->ops->on_close) {
        const handler_ops_t *ops = c->ops;
        c->ops = NULL;
        ops->on_close(c, true);
    }
    conn_set_owner(c, NULL, NULL);
    timer_disarm(s->loop, &c->deadline);
    loop_unwatch(s->loop, &c->w);
    sock_close(c->fd, c->io);
    safe_close(c->file_fd);
    buf_free(&c->in);
    buf_free(&c->out);
    buf_free(&c->body);
    free(c->head_copy);
    free(c);
}

static void conn_unlink(conn_t *c)
{
    httpd_t *s = c->srv;
    if (c->prev)
        c->prev->next = c->next;
    else if (s->conns == c)
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->prev = c->next = NULL;
    s->n_conns--;
    climit_conn_removed(c); /* its source's and owner's counters, its unauthenticated slot */
}

void conn_abort(conn_t *c)
{
    if (c->dead)
        return;
    c->dead = true;
    c->state = CS_CLOSING;
    loop_unwatch(c->srv->loop, &c->w);
    timer_disarm(c->srv->loop, &c->deadline);
    conn_unlink(c);
    if (loop_defer(c->srv->loop, conn_destroy, c) < 0)
        conn_destroy(c);
}

void conn_free_all(httpd_t *srv)
{
    while (srv->conns)
        conn_abort(srv->conns);
}

int conn_accept(httpd_t *srv, int fd, climit_hold_t *lim)
{
    conn_t *c = calloc(1, sizeof *c);
    if (!c) {
        safe_close(fd);
        climit_hold_release(lim);
        return -ENOMEM;
    }
    c->srv = srv;
    c->fd = fd;
    c->file_fd = -EBADF;
    c->state = CS_HEAD;
    buf_init(&c->in, CONN_IN_MAX);
    buf_init(&c->out, CONN_OUT_MAX);
    buf_init(&c->body, 0);
    watcher_init(&c->w, fd, conn_on_event, c);
    timer_init(&c->deadline, conn_on_deadline, c);
    c->last_progress_ms = loop_now_ms(srv->loop);
    if (srv->transport.wrap) {
        /* the handshake runs inside the first reads, under the head deadline */
        c->io = srv->transport.wrap(srv->transport.arg, fd);
        if (!c->io) {
            safe_close(fd);
            free(c);
            return -ENOMEM;
        }
        c->head_started_ms = c->last_progress_ms;
    }
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->next = srv->conns;
    if (srv->conns)
        srv->conns->prev = c;
    srv->conns = c;
    srv->n_conns++;
    climit_conn_added(c, lim);
    int r = loop_watch(srv->loop, &c->w, EPOLLIN | EPOLLRDHUP);
    if (r < 0) {
        conn_abort(c);
        return r;
    }
    conn_update_interest(c);
    return 0;
}

/* ---- output ------------------------------------------------------------------------------ */

size_t conn_out_pending(const conn_t *c) { return c->out.len + (size_t)c->file_left; }

static void conn_finish_response(void *p);

static void conn_maybe_finish(conn_t *c)
{
    if (c->resp_done && c->out.len == 0 && c->file_left == 0 && c->state == CS_REQUEST) {
        c->state = CS_FINISHING; /* conn_finish_response decides what comes next */
        if (loop_defer(c->srv->loop, conn_finish_response, c) < 0)
            conn_abort(c);
    }
}

static int conn_write_some(conn_t *c)
{
    while (c->out.len > 0) {
        ssize_t n = sock_send(c->fd, c->io, buf_head(&c->out), c->out.len);
        if (n < 0)
            return n == -EAGAIN ? 0 : (int)n;
        buf_consume(&c->out, (size_t)n);
        c->last_progress_ms = loop_now_ms(c->srv->loop);
    }
    /* A file goes out CONN_FILE_TURN bytes per turn of the loop at most, the rest when the
     * socket is writable again (at once, if it still is: the next epoll_wait says so after
     * the other connections' events): a file that reads fast (a sparse one is free to make and
     * reads as zeros) to a fast reader would otherwise hold the loop until its end. */
    uint64_t turn = 0;
    while (c->file_left > 0 && turn < CONN_FILE_TURN) {
        off_t off = (off_t)c->file_off;
        size_t want = (size_t)MIN(c->file_left, CONN_FILE_TURN - turn);
        if (c->io) { /* a layer encrypts: the file's bytes pass through our memory */
            char chunk[16384];
            ssize_t k = pread(c->file_fd, chunk, MIN(want, sizeof chunk), off);
            if (k < 0 && errno == EINTR)
                continue;
            if (k <= 0)
                return k < 0 ? negative_errno() : -EIO;
            ssize_t n = sock_send(c->fd, c->io, chunk, (size_t)k);
            if (n < 0)
                return n == -EAGAIN ? 0 : (int)n;
            c->file_off += (uint64_t)n;
            c->file_left -= (uint64_t)n;
            turn += (uint64_t)n;
            c->last_progress_ms = loop_now_ms(c->srv->loop);
            continue;
        }
        ssize_t n = sendfile(c->fd, c->file_fd, &off, want);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN)
                return 0;
            return negative_errno();
        }
        if (n == 0)
            return -EIO; /* the file shrank: fail the connection rather than send short */
        c->file_off += (uint64_t)n;
        c->file_left -= (uint64_t)n;
        turn += (uint64_t)n;
        c->last_progress_ms = loop_now_ms(c->srv->loop);
    }
    if (c->file_fd >= 0 && c->file_left == 0)
        c->file_fd = safe_close(c->file_fd);
    return 0;
}

void conn_flush(conn_t *c)
{
    if (c->dead || c->state == CS_HIJACKED)
        return;
    if (conn_write_some(c) < 0) {
        conn_abort(c);
        return;
    }
    buf_shrink_if_idle(&c->out, 64 * 1024);
    conn_update_interest(c);
    conn_maybe_finish(c);
}

static int conn_append_head(conn_t *c, int status, const char *ctype, int64_t clen,
                            const char *extra)
{
    int r = buf_printf(&c->out, "HTTP/1.1 %d %s\r\n", status, http_reason(status));
    if (r >= 0 && ctype)
        r = buf_printf(&c->out, "Content-Type: %s\r\n", ctype);
    if (r >= 0 && clen >= 0)
        r = buf_printf(&c->out, "Content-Length: %lld\r\n", (long long)clen);
    if (r >= 0 && clen < 0 && c->resp_chunked)
        r = buf_printf(&c->out, "Transfer-Encoding: chunked\r\n");
    if (r >= 0 && !c->keep_alive)
        r = buf_printf(&c->out, "Connection: close\r\n");
    else if (r >= 0 && c->req.minor == 0)
        r = buf_printf(&c->out, "Connection: keep-alive\r\n");
    if (r >= 0 && extra)
        r = buf_printf(&c->out, "%s", extra);
    if (r >= 0)
        r = buf_append(&c->out, "\r\n", 2);
    return r;
}

static int conn_start(conn_t *c, int status)
{
    if (c->resp_started || c->dead)
        return -EALREADY;
    c->resp_started = true;
    c->status = status;
    /* Answered before asking for the body: the client may never send it, so the bytes that
     * follow cannot be told apart from a next request. */
    if (c->expect_continue && c->body_left > 0)
        c->keep_alive = false;
    /* A body we will not read in full cannot be drained without bound: close after. */
    if (c->body_left > CONN_DRAIN_MAX && !c->collecting && !c->ops)
        c->keep_alive = false;
    return 0;
}

int conn_respond(conn_t *c, int status, const char *ctype, const void *body, size_t len,
                 const char *extra)
{
    int r = conn_start(c, status);
    if (r < 0)
        return r;
    if (c->body_left > CONN_DRAIN_MAX)
        c->keep_alive = false;
    r = conn_append_head(c, status, ctype, (int64_t)len, extra);
    if (r >= 0 && len && !(c->req.method.len == 4 && memcmp(c->req.method.p, "HEAD", 4) == 0))
        r = buf_append(&c->out, body, len);
    if (r < 0) {
        conn_abort(c);
        return r;
    }
    c->resp_done = true;
    conn_flush(c);
    return 0;
}

int conn_respond_json(conn_t *c, int status, json_t *j)
{
    if (!j) {
        conn_abort(c);
        return -ENOMEM;
    }
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s) {
        conn_abort(c);
        return -ENOMEM;
    }
    int r = conn_respond(c, status, "application/json", s, strlen(s), NULL);
    free(s);
    return r;
}

int conn_respond_file(conn_t *c, int fd, uint64_t off, uint64_t len)
{
    int r = conn_start(c, 200);
    if (r < 0) {
        safe_close(fd);
        return r;
    }
    r = conn_append_head(c, 200, "application/octet-stream", (int64_t)len, NULL);
    if (r < 0) {
        safe_close(fd);
        conn_abort(c);
        return r;
    }
    c->file_fd = fd;
    c->file_off = off;
    c->file_left = len;
    c->resp_done = true;
    conn_flush(c);
    return 0;
}

int conn_stream_begin(conn_t *c, int status, const char *ctype, const char *extra)
{
    int r = conn_start(c, status);
    if (r < 0)
        return r;
    c->resp_chunked = c->req.minor >= 1;
    if (!c->resp_chunked)
        c->keep_alive = false; /* HTTP/1.0: the stream ends when the connection closes */
    r = conn_append_head(c, status, ctype, -1, extra);
    if (r < 0) {
        conn_abort(c);
        return r;
    }
    return 0;
}

int conn_stream_chunk_fill(conn_t *c, size_t max, size_t (*fill)(void *ctx, char *dst), void *ctx)
{
    char *space;
    if (c->dead)
        return -EPIPE;
    int r = buf_reserve(&c->out, max + 12, &space);
    if (r < 0)
        return r;
    size_t hdr = c->resp_chunked ? 10 : 0;
    size_t n = fill(ctx, space + hdr);
    if (n == 0)
        return 0;
    if (c->resp_chunked) {
        static const char hex[] = "0123456789abcdef";
        for (int k = 7; k >= 0; k--)
            space[7 - k] = hex[(n >> (k * 4)) & 15];
        space[8] = '\r';
        space[9] = '\n';
        memcpy(space + hdr + n, "\r\n", 2);
        c->out.len += hdr + n + 2;
    } else {
        c->out.len += n;
    }
    return 0;
}

struct copy_ctx {
    const void *p;
    size_t n;
};
static size_t copy_fill(void *ctx, char *dst)
{
    struct copy_ctx *cc = ctx;
    memcpy(dst, cc->p, cc->n);
    return cc->n;
}

int conn_stream_chunk(conn_t *c, const void *p, size_t n)
{
    struct copy_ctx cc = { p, n };
    return conn_stream_chunk_fill(c, n, copy_fill, &cc);
}

void conn_stream_pump(conn_t *c, const char *s, size_t len, size_t *off)
{
    while (!c->dead) {
        while (*off < len && !conn_out_full(c)) {
            size_t n = MIN(len - *off, (size_t)CONN_STREAM_PIECE);
            if (conn_stream_chunk(c, s + *off, n) < 0) {
                conn_abort(c);
                return;
            }
            *off += n;
        }
        if (*off == len) {
            conn_stream_end(c);
            return;
        }
        conn_flush(c);
        if (c->out.len >= CONN_OUT_LOW)
            return;
    }
}

int conn_stream_end(conn_t *c)
{
    if (c->dead)
        return -EPIPE;
    if (c->resp_chunked) {
        int r = buf_append(&c->out, "0\r\n\r\n", 5);
        if (r < 0) {
            conn_abort(c);
            return r;
        }
    }
    c->resp_done = true;
    conn_flush(c);
    return 0;
}

/* ---- responses that others framed (a proxy passing a backend's answer on) ------------------ */

int conn_raw_begin(conn_t *c, int status) { return conn_start(c, status); }

int conn_raw_queue(conn_t *c, const void *p, size_t n)
{
    if (c->dead)
        return -EPIPE;
    int r = buf_append(&c->out, p, n);
    if (r < 0) {
        conn_abort(c);
        return r;
    }
    return 0;
}

int conn_raw_write(conn_t *c, const void *p, size_t n)
{
    int r = conn_raw_queue(c, p, n);
    if (r < 0)
        return r;
    conn_flush(c);
    return c->dead ? -EPIPE : 0;
}

void conn_raw_end(conn_t *c)
{
    if (c->dead)
        return;
    c->resp_done = true;
    conn_flush(c);
}

/* ---- request plumbing -------------------------------------------------------------------- */

void conn_set_handler(conn_t *c, const handler_ops_t *ops, void *data)
{
    c->ops = ops;
    c->hdata = data;
}

void conn_set_owner(conn_t *c, const conn_owner_ops_t *ops, void *owner)
{
    const conn_owner_ops_t *old_ops = c->owner_ops;
    void *old = c->owner;
    c->owner_ops = ops;
    c->owner = owner;
    if (old_ops && old_ops->release)
        old_ops->release(old);
}

void *conn_take_owner(conn_t *c, const conn_owner_ops_t **ret_ops)
{
    *ret_ops = TAKE_PTR(c->owner_ops);
    return TAKE_PTR(c->owner);
}

uint64_t conn_body_left(const conn_t *c) { return c->body_left; }

/* The handler wants the body: a client that sent "Expect: 100-continue" waits for this
 * (curl does for bodies over 1 MiB, for a second) before it sends the body. */
static void conn_send_continue(conn_t *c)
{
    static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
    if (!c->expect_continue || c->resp_started || c->body_left == 0)
        return;
    c->expect_continue = false;
    if (buf_append(&c->out, cont, sizeof cont - 1) < 0) {
        conn_abort(c);
        return;
    }
    conn_flush(c);
}

/* The raw bytes a chunked body of at most max payload bytes may take: the framing of chunks
 * (a sender's chunks may be small) and trailers on top of the payload. */
static size_t chunked_raw_cap(size_t max) { return max + max / 2 + 64 * 1024; }

void conn_collect_body(conn_t *c, size_t max, void (*done)(conn_t *c))
{
    if (c->req.has_transfer_encoding) {
        if (!http_te_chunked(&c->req)) {
            http_not_implemented(c, HTTP_CLOSE, "Transfer-Encoding: only \"chunked\" is supported");
            return;
        }
        buf_init(&c->body, chunked_raw_cap(max));
        c->collecting = c->collect_chunked = true;
        c->chunks = (http_chunks_t){ 0 };
        c->collect_max = max;
        c->collect_done = done;
        c->keep_alive = c->req.keep_alive && !c->req.upgrade; /* framed: the next request follows */
        conn_send_continue(c);
        if (!c->dead)
            conn_process_input(c);
        return;
    }
    if (c->body_left > max) {
        http_too_large(c, HTTP_CLOSE, "request body too large (max %zu bytes)", max);
        return;
    }
    buf_init(&c->body, max);
    if (c->body_left == 0) { /* no body at all: nothing to wait for */
        done(c);
        return;
    }
    c->collecting = true;
    c->collect_done = done;
    conn_send_continue(c);
    if (!c->dead)
        conn_process_input(c);
}

void conn_stream_body(conn_t *c)
{
    conn_send_continue(c);
    if (!c->dead)
        conn_process_input(c);
}

void conn_resume_body(conn_t *c)
{
    if (!c->body_paused)
        return;
    c->body_paused = false;
    conn_process_input(c);
}

int conn_hijack(conn_t *c, int *ret_fd, sockio_t **ret_io, buf_t *ret_pending)
{
    if (c->dead || c->resp_started)
        return -EALREADY;
    *ret_pending = c->in;
    buf_init(&c->in, CONN_IN_MAX);
    *ret_fd = c->fd;
    *ret_io = TAKE_PTR(c->io);
    loop_unwatch(c->srv->loop, &c->w);
    c->fd = -EBADF;
    c->state = CS_HIJACKED;
    c->ops = NULL;
    conn_abort(c);
    return 0;
}

/* Collect the chunked body's bytes sitting in `in`; once its end is in, decode it and call the
 * collector. Returns false if the connection went away or nothing more is wanted. */
static bool conn_collect_chunks(conn_t *c)
{
    bool done = false;
    ssize_t k = http_scan_chunks(&c->chunks, buf_head(&c->in), c->in.len, &done);
    if (k < 0) {
        c->keep_alive = false;
        c->collecting = c->collect_chunked = false;
        http_bad_request(c, 0, "malformed chunked request body");
        return false;
    }
    if (buf_append(&c->body, buf_head(&c->in), (size_t)k) < 0) {
        c->keep_alive = false;
        c->collecting = c->collect_chunked = false;
        http_too_large(c, 0, "request body too large (max %zu bytes)", c->collect_max);
        return false;
    }
    buf_consume(&c->in, (size_t)k);
    if (!done)
        return true;
    c->collecting = c->collect_chunked = false;
    ssize_t n = http_chunked_decode(buf_head(&c->body), c->body.len);
    if (n < 0 || (size_t)n > c->collect_max) {
        c->keep_alive = n >= 0 && c->keep_alive;
        http_error(c, n < 0 ? HTTP_BAD_REQUEST : HTTP_CONTENT_TOO_LARGE, 0,
                   n < 0 ? "malformed chunked request body" : "request body too large");
        return false;
    }
    c->body.len = (size_t)n;
    void (*fn)(conn_t *) = c->collect_done;
    c->collect_done = NULL;
    fn(c);
    return false;
}

/* Deliver body bytes sitting in `in` to the collector or the handler. Returns false if the
 * connection went away or reading must pause. */
static bool conn_deliver_body(conn_t *c)
{
    while (c->in.len > 0 && c->body_left > 0 && !c->body_paused && !c->dead) {
        size_t n = (size_t)MIN((uint64_t)c->in.len, c->body_left);
        if (c->collecting) {
            if (buf_append(&c->body, buf_head(&c->in), n) < 0) {
                http_too_large(c, HTTP_CLOSE, "request body too large");
                return false;
            }
        } else if (c->ops && c->ops->on_body) {
            int taken = c->ops->on_body(c, buf_head(&c->in), n);
            if (taken < 0) {
                http_error(c, http_status_from_errno(taken, NULL), HTTP_CLOSE,
                           "request body refused");
                return false;
            }
            n = (size_t)taken;
            if (n == 0) {
                c->body_paused = true;
                return false;
            }
        } else {
            return false; /* nobody wants the body now; drain after the response */
        }
        buf_consume(&c->in, n);
        c->body_left -= n;
    }
    if (c->body_left == 0 && !c->dead) {
        if (c->collecting) {
            c->collecting = false;
            void (*done)(conn_t *) = c->collect_done;
            c->collect_done = NULL;
            done(c);
        } else if (c->ops && c->ops->on_body_end && c->ops->on_body) {
            const handler_ops_t *ops = c->ops;
            ops->on_body_end(c);
        }
        return false;
    }
    return !c->dead;
}

static bool conn_wants_body(const conn_t *c)
{
    return c->state == CS_REQUEST &&
           (c->collect_chunked || (c->body_left > 0 && !c->body_paused &&
                                   (c->collecting || (c->ops && c->ops->on_body))));
}

static void conn_begin_request(conn_t *c, int head_len)
{
    free(c->head_copy);
    c->head_copy = malloc((size_t)head_len);
    if (!c->head_copy) {
        conn_abort(c);
        return;
    }
    memcpy(c->head_copy, buf_head(&c->in), (size_t)head_len);
    buf_consume(&c->in, (size_t)head_len);
    (void)http_parse_request(c->head_copy, (size_t)head_len, &c->req);
    c->state = CS_REQUEST;
    /* A request that asks to upgrade the connection is the last one on it, whatever the
     * answer: a refused upgrade never leaves a connection that a proxy in front of us would
     * keep splicing (bytes that follow could be a request nobody authorized). */
    c->keep_alive = c->req.keep_alive && !c->req.upgrade;
    c->body_left = c->req.content_length;
    sv_t expect;
    c->expect_continue = c->body_left > 0 && c->req.minor >= 1 &&
                         http_header_get(&c->req, "expect", &expect) &&
                         sv_eq_lit_nocase(expect, "100-continue");
    c->resp_started = c->resp_done = c->resp_chunked = false;
    c->body_paused = c->collecting = c->collect_chunked = false;
    c->ops = NULL;
    c->hdata = NULL;
    c->last_progress_ms = loop_now_ms(c->srv->loop);
    c->srv->dispatch(c);
}

/* A head http_parse_request() refused (its -errno): answered, and the connection closes. */
static void conn_fail_head(conn_t *c, int err)
{
    int status = http_status_from_head_error(err);
    const char *m = status == HTTP_HEADERS_TOO_LARGE       ? "request head too large"
                    : status == HTTP_VERSION_NOT_SUPPORTED ? "HTTP version not supported"
                                                           : "malformed request";
    c->state = CS_REQUEST;
    c->req.minor = 1;
    http_error(c, status, HTTP_CLOSE, "%s", m);
}

/* Read what the socket has, within the buffer cap. Returns bytes read, 0 on EOF, -EAGAIN. */
static ssize_t conn_read(conn_t *c, size_t max, bool *ret_short)
{
    char *space;
    size_t want = MIN((size_t)CONN_READ_CHUNK, max);
    /* A request head is usually small: read 4 KiB first and grow with what has arrived. A
     * 64 KiB reserve per read pinned a 128 KiB block on every idle keep-alive connection. */
    if (c->state == CS_HEAD && !c->io) /* a layer reads whole records (16 KiB) at once */
        want = MIN(want, MAX((size_t)4096, c->in.len));
    /* A body of known length: no more than is left of it. A 20-byte JSON body read into a
     * 256 KiB block cost a malloc, page faults and a consolidating free per request. */
    else if (!c->io && !c->collect_chunked && c->body_left > 0)
        want = (size_t)MIN((uint64_t)want, MAX((uint64_t)4096, c->body_left));
    if (want == 0)
        return -ENOBUFS;
    if (buf_reserve(&c->in, want, &space) < 0) {
        want = c->in.max - c->in.len;
        if (want == 0 || buf_reserve(&c->in, want, &space) < 0)
            return -ENOBUFS;
    }
    ssize_t n = sock_recv(c->fd, c->io, space, want);
    if (n < 0)
        return n;
    c->in.len += (size_t)n;
    if (n > 0)
        c->last_progress_ms = loop_now_ms(c->srv->loop);
    /* a layer returns one record at a time: a short read says nothing about the socket */
    *ret_short = (size_t)n < want && !c->io;
    return n;
}

/* Whether the connection reads now: a head, a body someone takes or drains, or what comes
 * after the answer of a connection being closed. */
static bool conn_reading(const conn_t *c)
{
    return c->state == CS_HEAD || c->state == CS_DRAIN || c->state == CS_LINGER ||
           conn_wants_body(c);
}

/* drained: the socket is known to hold nothing now (read no further until epoll says). */
static void conn_process_input_from(conn_t *c, bool drained)
{
    for (int rounds = 0; rounds < 64 && !c->dead; rounds++) {
        if (c->state == CS_LINGER) {
            c->linger_bytes += c->in.len;
            buf_consume(&c->in, c->in.len);
            if (c->linger_bytes > CONN_LINGER_MAX) {
                conn_abort(c);
                return;
            }
        }
        if (c->state == CS_HEAD && c->in.len > 0) {
            if (c->head_started_ms == 0)
                c->head_started_ms = loop_now_ms(c->srv->loop);
            int r = http_parse_request(buf_head(&c->in), c->in.len, &c->req);
            if (r < 0) {
                conn_fail_head(c, r);
                return;
            }
            if (r > 0) {
                c->head_started_ms = 0;
                conn_begin_request(c, r);
                continue;
            }
        } else if (c->state == CS_REQUEST && c->in.len > 0 && c->collect_chunked) {
            if (!conn_collect_chunks(c))
                break;
            continue;
        } else if (c->state == CS_REQUEST && c->in.len > 0 && c->body_left > 0) {
            if (!conn_deliver_body(c))
                break;
            continue;
        } else if (c->state == CS_DRAIN && c->in.len > 0 && c->body_left > 0) {
            size_t n = (size_t)MIN((uint64_t)c->in.len, c->body_left);
            buf_consume(&c->in, n);
            c->body_left -= n;
            if (c->body_left == 0) {
                c->state = CS_HEAD;
                continue;
            }
        }
        if (!conn_reading(c))
            break;
        size_t room = c->state == CS_HEAD ? HTTP_MAX_HEAD + 1 - MIN(c->in.len, HTTP_MAX_HEAD)
                                          : CONN_READ_CHUNK;
        if (c->state != CS_HEAD && c->in.len >= CONN_READ_CHUNK)
            break;
        /* A short read emptied the socket: the next recv() would only say EAGAIN. epoll is
         * level-triggered, so whatever arrives later is reported again. */
        ssize_t n = drained ? -EAGAIN : conn_read(c, room, &drained);
        if (n == -EAGAIN) {
            if (c->state == CS_HEAD) { /* idle keep-alive: hold no buffers */
                buf_shrink_if_idle(&c->in, 0);
                buf_shrink_if_idle(&c->out, 0);
            }
            break;
        }
        if (n == 0 || n < 0) {
            if (c->state == CS_REQUEST && c->body_left > 0 && !c->resp_started) {
                /* client gave up mid-body: nothing to answer */
            }
            conn_abort(c);
            return;
        }
    }
    if (!c->dead)
        conn_update_interest(c);
}

static void conn_process_input(conn_t *c) { conn_process_input_from(c, false); }

static void conn_finish_response(void *p)
{
    conn_t *c = p;
    if (c->dead)
        return;
    if (c->ops && c->ops->on_close) {
        const handler_ops_t *ops = c->ops;
        c->ops = NULL;
        ops->on_close(c, false);
    }
    conn_set_owner(c, NULL, NULL); /* the request's owner data ends with it */
    c->ops = NULL;
    c->hdata = NULL;
    buf_free(&c->body);
    c->collecting = false;
    c->resp_started = c->resp_done = false;
    free(c->head_copy);
    c->head_copy = NULL;
    if (!c->keep_alive || c->body_left > CONN_DRAIN_MAX) {
        sock_shutdown_write(c->fd, c->io);
        /* bytes of the client's may still come (a body not read, a head refused): read them
         * away a while before closing (a lingering close, as Apache and nginx do) */
        if (c->body_left > 0 || c->in.len > 0 || c->status >= HTTP_BAD_REQUEST) {
            c->state = CS_LINGER;
            c->linger_bytes = 0;
            c->linger_until_ms = loop_now_ms(c->srv->loop) + CONN_LINGER_MS;
            conn_process_input(c);
            return;
        }
        conn_abort(c);
        return;
    }
    c->state = c->body_left > 0 ? CS_DRAIN : CS_HEAD;
    c->rdhup_ignored = false;
    c->last_progress_ms = loop_now_ms(c->srv->loop);
    c->head_wait_ms = c->last_progress_ms;
    buf_shrink_if_idle(&c->in, 4096);
    /* A client on a kept connection sends its next request after this answer: a read now would
     * nearly always say EAGAIN. epoll is level-triggered and the connection is watched for
     * input again, so a request already there is reported at once; bytes already read (in, or
     * held by the layer) are processed now. */
    conn_process_input_from(c, !sock_pending(c->io));
}

/* ---- events and deadlines ---------------------------------------------------------------- */

/* Between requests, with nothing of the next one read (a handshake in progress is not idle). */
static bool conn_idle(const conn_t *c) { return c->in.len == 0 && (!c->io || c->io->handshaken); }

/* The one rule for which timeout applies now (like h2o's set_timeout per phase): waiting for a
 * head, the keep-alive idle time or, once a head started, the head timeout (either shortened
 * for an unauthenticated connection, connlimit.h); reading a body, the body timeout since the
 * last progress; writing a response, the write timeout since the last progress. False: none
 * (a handler is working, the connection waits for it). */
static bool conn_due(const conn_t *c, bool reading, bool writing, uint64_t *ret)
{
    const httpd_config_t *cfg = &c->srv->cfg;
    if (c->state == CS_LINGER)
        *ret = c->linger_until_ms;
    else if (c->state == CS_HEAD)
        *ret = climit_head_due(c, conn_idle(c) ? c->last_progress_ms + cfg->keepalive_ms
                                               : c->head_started_ms + cfg->head_timeout_ms);
    else if (reading)
        *ret = c->last_progress_ms + cfg->body_timeout_ms;
    else if (writing)
        *ret = c->last_progress_ms + cfg->write_timeout_ms;
    else
        return false;
    return true;
}

static void conn_deferred_input(void *p)
{
    conn_t *c = p;
    c->input_deferred = false;
    if (!c->dead)
        conn_process_input(c);
}

static void conn_update_interest(conn_t *c)
{
    if (c->dead)
        return;
    uint32_t ev = c->rdhup_ignored ? 0 : EPOLLRDHUP;
    bool reading = conn_reading(c);
    if (reading)
        ev |= EPOLLIN;
    if (c->out.len > 0 || c->file_left > 0 || (reading && c->io && c->io->want_write))
        ev |= EPOLLOUT;
    if (loop_watch(c->srv->loop, &c->w, ev) < 0) {
        conn_abort(c);
        return;
    }
    /* Bytes the layer decrypted but we did not take yet: the socket will not report them. */
    if (reading && sock_pending(c->io) && !c->input_deferred) {
        c->input_deferred = true;
        if (loop_defer(c->srv->loop, conn_deferred_input, c) < 0)
            c->input_deferred = false;
    }
    uint64_t due;
    if (!conn_due(c, reading, (ev & EPOLLOUT) != 0, &due)) {
        timer_disarm(c->srv->loop, &c->deadline);
        return;
    }
    uint64_t now = loop_now_ms(c->srv->loop);
    /* Re-arming on every event would churn the heap; the timer re-checks when it fires. */
    if (!timer_armed(&c->deadline) || c->deadline.due_ms > due)
        (void)timer_arm(c->srv->loop, &c->deadline, due > now ? due - now : 0);
}

static void conn_on_deadline(loop_t *l, timer_t_ *t)
{
    conn_t *c = t->data;
    (void)l;
    uint64_t now = loop_now_ms(c->srv->loop);
    bool reading = conn_reading(c);
    uint64_t due;
    if (!conn_due(c, reading, c->out.len > 0 || c->file_left > 0, &due))
        return;
    if (due > now) {
        (void)timer_arm(c->srv->loop, &c->deadline, due - now);
        return;
    }
    if (c->state == CS_LINGER || (c->state == CS_HEAD && c->in.len == 0)) {
        conn_abort(c); /* idle keep-alive connection, or a handshake that did not finish */
        return;
    }
    if ((c->state == CS_HEAD || reading) && !c->resp_started) {
        log_debug("%s: request timed out", c->peer);
        c->state = CS_REQUEST;
        c->keep_alive = false;
        if (c->ops && c->ops->on_close) {
            const handler_ops_t *ops = c->ops;
            c->ops = NULL;
            ops->on_close(c, true);
        }
        c->collecting = false;
        c->body_left = 0;
        http_request_timeout(c, 0, "request timed out");
        return;
    }
    conn_abort(c);
}

static void conn_on_event(loop_t *l, watcher_t *w, uint32_t ev)
{
    conn_t *c = w->data;
    (void)l;
    if (ev & (EPOLLERR | EPOLLHUP)) {
        conn_abort(c);
        return;
    }
    if (ev & EPOLLOUT) {
        bool was_full = c->out.len >= CONN_OUT_LOW;
        conn_flush(c);
        if (c->dead)
            return;
        if (was_full && c->out.len < CONN_OUT_LOW && c->ops && c->ops->on_drain)
            c->ops->on_drain(c);
        if (c->dead)
            return;
    }
    if ((ev & EPOLLIN) || ((ev & EPOLLOUT) && c->io && c->io->want_write)) {
        conn_process_input(c);
        if (c->dead)
            return;
    }
    if ((ev & EPOLLRDHUP) && !(c->w.events & EPOLLIN)) {
        /* The peer closed while we were not reading (a response is streaming): check that it
         * is a real close and not pipelined bytes, then stop the work for it. */
        char b;
        ssize_t n = recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
            conn_abort(c);
            return;
        }
        /* Pipelined data is waiting: stop listening for RDHUP until the next request. */
        c->rdhup_ignored = true;
        (void)loop_watch(c->srv->loop, &c->w, c->w.events & ~(uint32_t)EPOLLRDHUP);
    }
}
