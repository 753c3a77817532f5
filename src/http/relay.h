/* SPDX-License-Identifier: MIT */
/* The relay: one request passed to a backend and its answer passed back as the backend framed
 * it, after which the client's connection stays an HTTP connection (its next request is
 * authorized again) and the backend's connection may be kept for the next request too.
 * What a tunnel (proxy.h) cannot do: it copies bytes until either side closes. Used for
 * requests whose body is known in full (none, or buffered); upgrades and streamed bodies go
 * through tunnels. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/buf.h"
#include "common/loop.h"
#include "common/sock.h"

/* The largest answer head a relay (or a tunnel filtering answers) takes. */
#define RELAY_HEAD_MAX (64 * 1024)

typedef struct conn conn_t;
typedef struct relay relay_t;

/* A backend connection that may carry more than one request. Its socket stays registered with
 * the loop from when it is made until it is closed, whoever holds it (the relay, or its owner's
 * pool between requests): handing it over changes a callback, not epoll's registration, so a
 * request on a kept connection costs no epoll_ctl. */
typedef struct relay_conn {
    watcher_t w;  /* w.fd: the socket; w.cb and w.data: its holder's */
    sockio_t *io; /* its layer (TLS), or NULL */
    loop_t *loop;
    bool broken;       /* it reported something while idle (a close, stray bytes): closed */
    uint64_t since_ms; /* idle since (its pool's) */
} relay_conn_t;

/* fd (and io) taken, not watched yet (w.cb NULL: the holder sets it). NULL: -ENOMEM, closed. */
relay_conn_t *relay_conn_new(loop_t *l, int fd, sockio_t *io);
/* Parked between requests: anything it reports (the peer closed, bytes nobody asked for) marks
 * it broken and closes it. Watched for input (as a relay watches it), so parking costs nothing. */
void relay_conn_park(relay_conn_t *k, uint64_t now_ms);
/* Not broken, and a peek finds nothing waiting (no close, no stray bytes): fit for a request. */
bool relay_conn_fit(const relay_conn_t *k);
/* Close it (unwatched, closed now; freed after the current batch of events). NULL-safe. */
void relay_conn_close(relay_conn_t *k);
/* Take the socket and layer out (unwatched), for a tunnel; k is freed after the batch. */
void relay_conn_detach(relay_conn_t *k, int *ret_fd, sockio_t **ret_io);

/* The relay ended (exactly once, never before proxy_relay_start returned). k: the backend
 * connection handed back (parked) because it can carry another request (a complete answer,
 * framed by length or chunks, all of the request sent, no "Connection: close"); otherwise NULL
 * (the relay closed it). ok: the client got the whole answer. */
typedef void (*relay_done_cb)(relay_t *r, void *data, relay_conn_t *k, bool ok);

/* Send out (taken) to the connected backend k (taken), read the answer (in: bytes of it
 * already read, taken, may be NULL) and answer c's request with it: its head (hop-by-hop
 * headers dropped, and those whose name begins with answer_drop in any case when it is not
 * NULL; "Connection: close" added when c will close) and its body as framed
 * (Content-Length, chunked passed through, or until the backend closes, and then c closes
 * too). 1xx answers other than 101 are dropped. A malformed or cut answer: 502 when nothing was
 * passed on yet, else c is aborted. Returns the relay (valid until cb), or NULL when it could
 * not start (c has been answered; cb does not run). */
relay_t *proxy_relay_start(conn_t *c, relay_conn_t *k, buf_t *out, buf_t *in,
                           const char *answer_drop, relay_done_cb cb, void *data);

/* End it now (the run it serves went away): c is aborted, cb runs. */
void proxy_relay_cut(relay_t *r);

/* For tests and fuzzing: the pieces that parse what a backend says. */
typedef struct {
    int status;
    bool chunked, has_length, close;
    uint64_t length;
} relay_head_t;
/* > 0: the head's length; 0: incomplete; < 0: malformed. */
ssize_t relay_parse_head(const char *p, size_t n, relay_head_t *ret);
