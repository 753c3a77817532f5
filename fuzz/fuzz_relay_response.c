/* SPDX-License-Identifier: MIT */
/* libFuzzer harness: what the relay (src/http/relay.c) parses of a backend's answer, on
 * arbitrary bytes as a node or a run's agent could send them: the head parser and the chunk
 * scanner that finds where a chunked body ends without changing a byte.
 *
 * The first byte seeds how the body is cut into pieces. Beyond ASan's checks it verifies:
 * - relay_parse_head returns < 0, 0 (only when no complete head is within the cap) or the
 *   head's length (<= the input), a status 100..599, and never both chunked and a length;
 * - the chunk scanner takes at most what it is given, stops exactly once at the end of a body,
 *   and the end it finds does not depend on how the bytes were cut (whole vs. in pieces). */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/http.h"
#include "http/relay.h"

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        if (!(x)) {                                                                                \
            fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #x);              \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Scan p[0..n) in pieces; returns the body's length when it ended, -1 malformed, -2 unfinished */
static long scan(const char *p, size_t n, unsigned seed)
{
    http_chunks_t k = { 0 };
    size_t off = 0;
    while (off < n) {
        size_t piece = seed ? 1 + (seed * 2654435761u + off) % 7 : n - off;
        piece = piece > n - off ? n - off : piece;
        bool done = false;
        ssize_t t = http_scan_chunks(&k, p + off, piece, &done);
        if (t < 0)
            return -1;
        CHECK((size_t)t <= piece);
        CHECK(done || (size_t)t == piece);
        off += (size_t)t;
        if (done)
            return (long)off;
    }
    return -2;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 256 * 1024)
        return 0;
    unsigned seed = data[0];
    const char *p = (const char *)data + 1;
    size_t n = size - 1;
    relay_head_t h;
    ssize_t hl = relay_parse_head(p, n, &h);
    CHECK(hl <= (ssize_t)n);
    if (hl > 0) {
        CHECK(h.status >= 100 && h.status <= 599);
        CHECK(!(h.chunked && h.has_length));
        CHECK(hl >= 16 && memcmp(p + hl - 4, "\r\n\r\n", 4) == 0);
    }
    /* the body after a head, or the whole input as a chunked body */
    const char *b = hl > 0 ? p + hl : p;
    size_t bn = hl > 0 ? n - (size_t)hl : n;
    long whole = scan(b, bn, 0), pieces = scan(b, bn, seed | 1);
    CHECK(whole == pieces);
    if (whole >= 0)
        CHECK(whole >= 5 && memcmp(b + whole - 2, "\r\n", 2) == 0);
    return 0;
}
