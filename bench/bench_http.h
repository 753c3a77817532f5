/* SPDX-License-Identifier: MIT */
/* The benchmark's own minimal HTTP/1.1 client (see bench_http.c). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/macro.h"
#include "common/sock.h"
#include "common/strutil.h"

#define RESP_HEAD_MAX (64 * 1024)
#define NDJSON_LINE_MAX (64u * 1024 * 1024)
#define RECV_TIMEOUT_S 60

/* Receives body bytes as they arrive (pointers into the receive buffer). */
typedef void (*sink_fn)(void *ctx, const char *p, size_t n);

/* One response being parsed. */
typedef struct {
    enum {
        RP_HEAD,
        RP_BODY,
        RP_EOF_BODY,
        RP_CHUNK_SIZE,
        RP_CHUNK_DATA,
        RP_CHUNK_END,
        RP_TRAILER,
        RP_DONE
    } state;
    int status;
    bool chunked, close, has_length;
    uint64_t content_length, left, body_bytes;
    sink_fn sink;
    void *ctx;
} rp_t;

/* A client connection and its receive buffer (unparsed bytes at buf + off, len of them). */
typedef struct {
    int fd;
    sockio_t *io; /* TLS over fd (blocking), or NULL */
    char *buf;
    size_t cap, off, len;
} hc_t;

/* Body collector for small JSON answers. */
typedef struct {
    char data[4096];
    size_t len;
} small_body_t;

/* The state of one NDJSON exec stream as its events are decoded. */
typedef struct {
    bool base64;     /* the request asked "encoding":"base64" */
    bool check_zero; /* stdout must be all zero bytes */
    char *line;
    size_t line_len, line_cap;
    unsigned char *dec;
    size_t dec_cap;
    uint64_t out_bytes, err_bytes;
    unsigned events;
    bool started, exited, bad;
    int64_t exit_code; /* -1: null (killed by a signal) */
    char out[64];      /* the first stdout and stderr bytes */
    size_t out_len;
    char err[96];
    size_t err_len;
    char exit_line[128]; /* the exit event as sent */
    uint64_t pid;        /* from the start event */
    char why[160];       /* the first problem seen */
} nd_t;

/* Standard base64 with padding into out (room for n / 4 * 3 bytes). Returns the length or
 * -EINVAL: a length that is not a multiple of 4, a character outside the alphabet, '=' anywhere
 * but the last two places (the bits that padding drops are not checked). SSSE3 where the CPU
 * has it; b64_decode_scalar is the same decoder without it (the unit test compares the two). */
ssize_t b64_decode(const char *s, size_t n, unsigned char *out);
ssize_t b64_decode_scalar(const char *s, size_t n, unsigned char *out);

void rp_init(rp_t *rp, sink_fn sink, void *ctx);
/* Consume what can be consumed of p[0..n); body bytes go to the sink as they are. Returns the
 * bytes consumed (an unfinished head or chunk-size line stays for the next call) or -errno. */
ssize_t rp_feed(rp_t *rp, const char *p, size_t n);
/* The peer closed: fine only for a body delimited by the close (else -ECONNRESET). */
int rp_eof(rp_t *rp);

/* Connect to 127.0.0.1:port (TCP_NODELAY, 60 s send/receive timeouts), buffer of cap bytes. */
int hc_open(hc_t *h, uint16_t port, size_t cap);
void hc_close(hc_t *h);
int send_all(int fd, const void *p, size_t n);
/* send_all through a layer (TLS) on a blocking socket when io is not NULL. */
int send_all_io(int fd, sockio_t *io, const void *p, size_t n);
/* Feed buffered bytes to the parser. 1: the response is complete; 0: more bytes needed. */
int hc_feed(hc_t *h, rp_t *rp);
/* One recv into the free end of the buffer: bytes read, 0 at EOF, or -errno (-EAGAIN). */
ssize_t hc_recv(hc_t *h, int flags);
/* Read one whole response (blocking). */
int hc_response(hc_t *h, rp_t *rp);

/* "METHOD target HTTP/1.1" head with X-Sandbox-Token (token may be NULL), a Content-Type (may
 * be NULL) and a Content-Length (clen >= 0). Returns its length or -E2BIG. */
int build_head(const char *token, char *dst, size_t cap, const char *method, const char *target,
               const char *ctype, int64_t clen);
/* A complete POST with a small JSON body. */
int build_json_request(const char *token, char *dst, size_t cap, const char *target,
                       const char *body);
void small_sink(void *ctx, const char *p, size_t n); /* ctx: small_body_t, reset len first */

void nd_reset(nd_t *nd); /* keeps base64/check_zero and the buffers */
void nd_free(nd_t *nd);
void nd_bad(nd_t *nd, const char *fmt, ...) _printf_(2, 3);
void nd_sink(void *ctx, const char *p, size_t n); /* ctx: nd_t */
/* A finished exec stream: HTTP 200, start first, exit last with exit_code 0, nothing malformed.
 * Returns 0 or -EBADMSG with nd->why set. */
int nd_check(nd_t *nd, const rp_t *rp);
