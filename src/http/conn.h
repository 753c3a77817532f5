/* SPDX-License-Identifier: MIT */
/* One HTTP/1.1 connection: reads heads and bodies, hands requests to handlers, writes
 * responses (fixed, chunked streams, or a file by sendfile) with bounded buffers. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/buf.h"
#include "common/loop.h"
#include "common/sock.h"
#include "connlimit.h"
#include "http.h"
#include "status.h"

typedef struct httpd httpd_t;
typedef struct conn conn_t;

/* Output buffer: producers pause above HIGH and resume (on_drain) below LOW. */
#define CONN_OUT_HIGH (256 * 1024)
#define CONN_OUT_LOW (64 * 1024)
#define CONN_OUT_MAX (4 * 1024 * 1024)
#define CONN_FILE_TURN (1024 * 1024) /* file bytes sent per turn of the loop, at most */
#define CONN_DRAIN_MAX (1024 * 1024) /* unread body drained for keep-alive, at most */
/* A connection closed with bytes of the client's still coming (a body refused, the rest of a bad
 * head) reads them away for this long, this many at most, after its answer: closed at once,
 * the kernel would answer them with RST, which can discard the answer in transit. */
#define CONN_LINGER_MS 2000
#define CONN_LINGER_MAX (64 * 1024 * 1024)

typedef struct {
    /* Body bytes as they arrive. Return how many were taken (fewer pauses body reading until
     * conn_resume_body()), or -errno to fail the request (its status from
     * http_status_from_errno(); the connection closes). */
    int (*on_body)(conn_t *c, const char *p, size_t n);
    /* The whole declared body has been delivered. */
    void (*on_body_end)(conn_t *c);
    /* The output buffer fell below CONN_OUT_LOW. */
    void (*on_drain)(conn_t *c);
    /* The connection is going away (or the response is complete): release handler state. */
    void (*on_close)(conn_t *c, bool aborted);
} handler_ops_t;

/* What a daemon holds for one request (sbx-server: its hold on the sandbox the request is
 * scoped to). The core never looks inside; it calls release() once when the request ends, when
 * the connection goes away, or when the tunnel it was handed to (proxy.h) closes. */
typedef struct {
    void (*release)(void *owner);
} conn_owner_ops_t;

struct conn {
    httpd_t *srv;
    int fd;
    sockio_t *io;        /* the transport over fd (TLS), NULL: plain */
    bool input_deferred; /* a read of what io holds decrypted is scheduled */
    watcher_t w;
    timer_t_ deadline;
    uint64_t last_progress_ms;
    uint64_t head_started_ms;
    enum { CS_HEAD, CS_REQUEST, CS_FINISHING, CS_DRAIN, CS_LINGER, CS_CLOSING, CS_HIJACKED } state;
    uint64_t linger_until_ms, linger_bytes; /* CS_LINGER: answered, written shut, reading away */
    bool rdhup_ignored;
    buf_t in;
    buf_t out;
    http_request_t req;
    char *head_copy;    /* the request head, owned; req views point into it */
    uint64_t body_left; /* declared body bytes not yet read from the socket */
    uint64_t drain_budget;
    bool body_paused;
    bool expect_continue; /* "Expect: 100-continue" and no 100 sent yet */
    bool collecting;      /* body is being collected into `body` */
    /* a chunked body being collected: its raw bytes go to `body` as scanned, and are decoded
     * in place once the last chunk and the trailers are in */
    bool collect_chunked;
    http_chunks_t chunks;
    size_t collect_max; /* the payload's cap */
    buf_t body;
    void (*collect_done)(conn_t *c);
    /* response */
    bool resp_started, resp_chunked, resp_done, keep_alive;
    int status;
    int file_fd;
    uint64_t file_off, file_left;
    const handler_ops_t *ops;
    void *hdata;
    bool dead;
    bool authed;
    /* the request's owner data (conn_set_owner), opaque here */
    const conn_owner_ops_t *owner_ops;
    void *owner;
    char peer[64];
    conn_t *prev, *next;
    /* Fair limits (connlimit.c): the counters this connection holds, whether a request on it
     * authenticated, since when it waits for a head, its place among the unauthenticated. */
    climit_hold_t lim;
    bool lim_authed;
    uint64_t head_wait_ms;
    conn_t *unauth_prev, *unauth_next;
};

/* A new connection on fd (taken), holding *lim (taken: see climit_admit). */
int conn_accept(httpd_t *srv, int fd, climit_hold_t *lim);
void conn_free_all(httpd_t *srv);

/* Responses. Headers are "Name: value\r\n" lines (may be NULL). */
int conn_respond(conn_t *c, int status, const char *content_type, const void *body, size_t len,
                 const char *extra_headers);
int conn_respond_json(conn_t *c, int status, json_t *j);              /* steals j */
int conn_respond_file(conn_t *c, int fd, uint64_t off, uint64_t len); /* takes fd */
int conn_stream_begin(conn_t *c, int status, const char *content_type, const char *extra_headers);
/* Append one chunk. The payload is written by fill(), which gets room for at most max bytes and
 * returns how many it wrote. Lets producers encode straight into the output buffer. */
int conn_stream_chunk_fill(conn_t *c, size_t max, size_t (*fill)(void *ctx, char *dst), void *ctx);
int conn_stream_chunk(conn_t *c, const void *p, size_t n);
int conn_stream_end(conn_t *c);
/* Go on with a body held whole in memory (s, len; *off bytes of it sent), in chunks of
 * CONN_STREAM_PIECE: fill the output buffer and flush until the rest must wait for the peer
 * (call again from on_drain, which comes back only once the buffer was above CONN_OUT_LOW),
 * and end the stream once all is out. A connection that fails is aborted. */
#define CONN_STREAM_PIECE (64 * 1024)
void conn_stream_pump(conn_t *c, const char *s, size_t len, size_t *off);
/* A response framed by someone else (a proxy): conn_raw_begin() starts it (and may clear
 * keep_alive: the head written after it must then say "Connection: close"), conn_raw_write()
 * queues bytes as they are (head and body), conn_raw_end() says the response is complete. */
int conn_raw_begin(conn_t *c, int status);
int conn_raw_write(conn_t *c, const void *p, size_t n);
/* Like conn_raw_write() without writing yet: bytes queued together go out in one write (one TLS
 * record) at the next conn_flush() or conn_raw_end(). */
int conn_raw_queue(conn_t *c, const void *p, size_t n);
void conn_raw_end(conn_t *c);
/* The connection closes after this request's answer (an answer made by hand; the error helpers
 * of status.h take HTTP_CLOSE instead). */
static inline void conn_close_after(conn_t *c) { c->keep_alive = false; }
size_t conn_out_pending(const conn_t *c);
static inline bool conn_out_full(const conn_t *c) { return c->out.len >= CONN_OUT_HIGH; }
void conn_flush(conn_t *c);

/* Handler plumbing. */
void conn_set_handler(conn_t *c, const handler_ops_t *ops, void *data);
/* Attach the request's owner data (taken: ops->release(owner) runs once, see conn_owner_ops_t);
 * what was attached before is released first. */
void conn_set_owner(conn_t *c, const conn_owner_ops_t *ops, void *owner);
/* Hand the owner data over to the caller (who then releases it), leaving none on c. */
void *conn_take_owner(conn_t *c, const conn_owner_ops_t **ret_ops);
/* Collect the body (at most max bytes, else 413) then call done(c); c->body holds it. */
void conn_collect_body(conn_t *c, size_t max, void (*done)(conn_t *c));
void conn_stream_body(conn_t *c); /* deliver body to ops->on_body */
void conn_resume_body(conn_t *c);
uint64_t conn_body_left(const conn_t *c); /* bytes not yet delivered */
/* Take the socket away from HTTP (proxy). Bytes already read past the head are returned in
 * *ret_pending (owned by the caller). The connection object is freed later. */
int conn_hijack(conn_t *c, int *ret_fd, sockio_t **ret_io, buf_t *ret_pending);
void conn_abort(conn_t *c);
