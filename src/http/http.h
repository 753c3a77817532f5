/* SPDX-License-Identifier: MIT */
/* HTTP/1.1 request-head parser. Pure: never allocates, never relies on NUL, caps everything.
 * The strict rules it enforces are listed in docs/protocol.md ("HTTP framing"). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/strutil.h"

#define HTTP_MAX_HEAD (64 * 1024)
#define HTTP_MAX_HEADERS 100
#define HTTP_MAX_CONTENT_LENGTH (UINT64_C(1) << 53)

typedef struct {
    sv_t name;
    sv_t value;
} http_header_t;

typedef struct {
    sv_t method;
    sv_t target; /* as sent */
    sv_t path;   /* target up to '?' */
    sv_t query;  /* after '?', raw */
    int minor;   /* HTTP/1.<minor> */
    http_header_t headers[HTTP_MAX_HEADERS];
    size_t n_headers;
    bool has_content_length;
    uint64_t content_length;
    bool has_transfer_encoding;
    bool keep_alive;
    bool upgrade;
    size_t head_len;
} http_request_t;

/* Parse a request head from buf[0..len).
 * Returns the head length (> 0) when complete, 0 when more bytes are needed, or -errno when the
 * head is refused: -EBADMSG (malformed), -EMSGSIZE (larger than HTTP_MAX_HEAD or too many
 * headers), -EPROTONOSUPPORT (not HTTP/1.x); http_status_from_head_error() gives the status. */
int http_parse_request(const char *buf, size_t len, http_request_t *req);

/* Case-insensitive header lookup; the first match. */
bool http_header_get(const http_request_t *req, const char *name, sv_t *ret);

/* Whether the request's Transfer-Encoding is exactly "chunked" (the only coding we decode). */
bool http_te_chunked(const http_request_t *req);

/* Decode a complete chunked body (p, n bytes: chunks, the last chunk and trailers, as
 * relay_scan_chunks() found them) in place: its payload ends up at p. Returns the payload's
 * length, or -EBADMSG when the framing is not a chunked body. */
ssize_t http_chunked_decode(char *p, size_t n);

/* Where a chunked body ends, scanned as its bytes arrive (a zeroed state starts a body). */
typedef struct {
    int st;
    uint64_t size;
    int digits;
    uint32_t trailer_bytes;
} http_chunks_t;
/* Bytes of p that belong to the chunked body (all of n, or fewer when it ended: *done), or -1
 * when it is not one: chunk sizes in hex, extensions of visible characters, CRLF line ends
 * only, trailers that are fields (name ":" value) and 8 KiB of them at most. */
ssize_t http_scan_chunks(http_chunks_t *k, const char *p, size_t n, bool *done);
