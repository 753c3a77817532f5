/* SPDX-License-Identifier: MIT */
/* A small blocking HTTP/1.1 client for daemon-to-daemon calls (control -> node, node ->
 * control, node -> node state transfer) and tools. One request per connection
 * ("Connection: close"), or kept alive in a httpc_pool_t shared by threads; every wait is
 * bounded by a deadline; every size is capped.
 * Not for the request path: the proxies there are non-blocking (http/proxy.c). */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "common/sock.h"

#define HTTPC_HEAD_MAX (16 * 1024)
#define HTTPC_BODY_MAX_DEFAULT (4 * 1024 * 1024)

/* Idle keep-alive connections, shared by threads (a mutex inside). A connection is taken by
 * one request at a time and put back only after a complete, well-framed response that did not
 * ask to close; it is reused only under the same key, which must name everything the
 * connection was proven to be (address, port, the TLS peer's pinned key). */
typedef struct httpc_pool httpc_pool_t;

/* max_idle: idle connections kept at most (the oldest is closed beyond it). NULL on ENOMEM. */
httpc_pool_t *httpc_pool_new(unsigned max_idle);
void httpc_pool_free(httpc_pool_t *p);
/* Close the idle connections (all of them, or those under key). */
void httpc_pool_flush(httpc_pool_t *p, const char *key);
/* Connections opened and reused through the pool so far (for tests and benchmarks). */
void httpc_pool_stats(httpc_pool_t *p, uint64_t *ret_opened, uint64_t *ret_reused);

typedef struct {
    /* Where: either a unix socket path, or host (numeric IPv4/IPv6 literal) + port. */
    const char *unix_path;
    const char *host;
    uint16_t port;
    const char *method; /* "GET", "POST", ... */
    const char *target; /* "/v1/..." (origin form, already escaped) */
    /* Extra header lines, each "Name: value\r\n" (may be NULL). Host, Content-Length and
     * Connection are added by the client. */
    const char *headers;
    const void *body; /* may be NULL */
    size_t body_len;
    uint64_t timeout_ms; /* whole exchange; 0 = 30 s */
    size_t body_max;     /* response body cap; 0 = HTTPC_BODY_MAX_DEFAULT */
    /* If >= 0, the response body is written to this fd (blocking writes) instead of being
     * kept in memory; body_max does not apply then. */
    int body_fd;
    /* TLS: a layer over the connected socket (tls_wrap_peer with a tls_peer_t); the handshake,
     * with the peer's certificate checked, completes before anything is sent. */
    sockio_wrap_t transport;
    /* Keep-alive: with a pool and a key (at most HTTPC_POOL_KEY_MAX - 1 bytes), an idle
     * connection under the same key is used instead of a new one (after a check that the peer
     * has not closed it), and the connection goes back to the pool afterwards. A request that
     * fails on a reused connection before any byte of the answer arrived is sent once more on
     * a new connection only where that cannot run it twice: when the send itself failed, or
     * for GET/HEAD/PUT/DELETE. */
    httpc_pool_t *pool;
    const char *pool_key;
} httpc_request_t;

#define HTTPC_POOL_KEY_MAX 192

typedef struct {
    int status;
    char *head;      /* the raw response head (status line + headers), NUL-terminated */
    char *body;      /* NUL-terminated, body_len bytes (NULL when streamed to body_fd) */
    size_t body_len; /* bytes received (also when streamed to body_fd) */
} httpc_response_t;

/* Initialise a request with defaults (body_fd = -1). */
void httpc_request_init(httpc_request_t *rq);

/* Perform the exchange. Response bodies may be Content-Length, chunked, or until close.
 * Returns 0 with *ret filled (any status), or -errno: -ECONNREFUSED/-ENOENT (cannot connect),
 * -ETIMEDOUT, -EPROTO (malformed response), -EFBIG (over a cap), -EINVAL (bad request),
 * -EPERM (the TLS peer is not the one expected: nothing was sent). */
int httpc_do(const httpc_request_t *rq, httpc_response_t *ret);

/* Read and parse one response from fd as httpc_do() does after sending rq (rq->method decides
 * whether a body follows; the body caps apply). The fd is not closed. For tests and fuzzing. */
int httpc_read_response_fd(int fd, const httpc_request_t *rq, httpc_response_t *ret);

/* A response header's value (first occurrence, case-insensitive name), copied into out
 * NUL-terminated; -ENOENT if absent, -ENOBUFS if it does not fit. */
int httpc_header(const httpc_response_t *r, const char *name, char *out, size_t cap);

void httpc_response_free(httpc_response_t *r);
