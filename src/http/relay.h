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
#include "common/sock.h"

typedef struct conn conn_t;
typedef struct relay relay_t;

/* The relay ended (exactly once, never before proxy_relay_start returned). fd and io: the
 * backend connection handed back because it can carry another request (a complete answer,
 * framed by length or chunks, all of the request sent, no "Connection: close"); otherwise -1
 * and NULL (the relay closed it). ok: the client got the whole answer. */
typedef void (*relay_done_cb)(relay_t *r, void *data, int fd, sockio_t *io, bool ok);

/* Send out (taken) to the connected backend bfd (with its layer bio, both taken), read the
 * answer (in: bytes of it already read, taken, may be NULL) and answer c's request with it:
 * its head (hop-by-hop headers dropped, "Connection: close" added when c will close) and its
 * body as framed (Content-Length, chunked passed through, or until the backend closes, and
 * then c closes too). 1xx answers other than 101 are dropped. A malformed or cut answer: 502
 * when nothing was passed on yet, else c is aborted. Returns the relay (valid until cb), or NULL
 * when it could not start (c has been answered; cb does not run). */
relay_t *proxy_relay_start(conn_t *c, int bfd, sockio_t *bio, buf_t *out, buf_t *in,
                           relay_done_cb cb, void *data);

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
