/* SPDX-License-Identifier: MIT */
/* A small blocking HTTP/1.1 client for daemon-to-daemon calls (control -> node, node ->
 * control, node -> node state transfer) and tools. One request per connection
 * ("Connection: close"); every wait is bounded by a deadline; every size is capped.
 * Not for the request path: the proxies there are non-blocking (server/proxy.c). */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "common/sock.h"

#define HTTPC_HEAD_MAX (16 * 1024)
#define HTTPC_BODY_MAX_DEFAULT (4 * 1024 * 1024)

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
} httpc_request_t;

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
