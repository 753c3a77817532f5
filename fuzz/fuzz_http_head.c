/* SPDX-License-Identifier: MIT */
/* libFuzzer harness: http_parse_request on arbitrary bytes.
 *
 * Beyond "no crash, no out-of-bounds read" (ASan), it checks what callers rely on:
 * - the result is 0, a head length, or one of -EBADMSG/-EMSGSIZE/-EPROTONOSUPPORT;
 * - on success head_len == result <= len and <= HTTP_MAX_HEAD, and the head ends in CRLFCRLF;
 * - every view (method, target, path, query, header names and values) lies inside the head;
 * - names are non-empty tokens, values hold no CR/LF/NUL, content_length only with
 *   has_content_length, never Content-Length together with Transfer-Encoding;
 * - a complete head's strict prefixes all say "need more" (0), and parsing is deterministic. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/http.h"

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        if (!(x)) {                                                                                \
            fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #x);              \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static bool inside(sv_t v, const char *buf, size_t len)
{
    if (v.len == 0)
        return v.p == NULL || (v.p >= buf && v.p <= buf + len);
    return v.p >= buf && v.p < buf + len && v.len <= (size_t)(buf + len - v.p);
}

static bool is_token(sv_t v)
{
    static const char extra[] = "!#$%&'*+-.^_`|~";
    if (v.len == 0)
        return false;
    for (size_t i = 0; i < v.len; i++) {
        unsigned char c = (unsigned char)v.p[i];
        bool alnum = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        if (!alnum && (c == 0 || !memchr(extra, c, sizeof extra - 1)))
            return false;
    }
    return true;
}

static void check_success(const char *buf, size_t len, const http_request_t *req, int r)
{
    size_t h = (size_t)r;
    CHECK(req->head_len == h);
    CHECK(h <= len);
    CHECK(h <= HTTP_MAX_HEAD);
    CHECK(h >= 4 && memcmp(buf + h - 4, "\r\n\r\n", 4) == 0);
    CHECK(req->n_headers <= HTTP_MAX_HEADERS);
    CHECK(is_token(req->method));
    CHECK(req->method.p == buf);
    CHECK(inside(req->target, buf, h) && req->target.len > 0 && req->target.p[0] == '/');
    CHECK(inside(req->path, buf, h) && req->path.p == req->target.p);
    CHECK(req->path.len <= req->target.len);
    CHECK(inside(req->query, buf, h));
    CHECK(req->minor >= 0 && req->minor <= 9);
    for (size_t i = 0; i < req->n_headers; i++) {
        const http_header_t *hd = &req->headers[i];
        CHECK(inside(hd->name, buf, h));
        CHECK(inside(hd->value, buf, h));
        CHECK(is_token(hd->name));
        CHECK(!memchr(hd->value.p, '\r', hd->value.len));
        CHECK(!memchr(hd->value.p, '\n', hd->value.len));
        CHECK(!memchr(hd->value.p, '\0', hd->value.len));
        char name[256];
        sv_t v;
        if (hd->name.len < sizeof name) { /* the lookup finds it (or an earlier duplicate) */
            memcpy(name, hd->name.p, hd->name.len);
            name[hd->name.len] = '\0';
            CHECK(http_header_get(req, name, &v));
            CHECK(inside(v, buf, h));
        }
    }
    CHECK(req->has_content_length || req->content_length == 0);
    CHECK(req->content_length <= HTTP_MAX_CONTENT_LENGTH);
    CHECK(!(req->has_content_length && req->has_transfer_encoding));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* http_request_t is large (100 headers); keep it off the fuzzer's stack frames */
    static http_request_t req, again;
    const char *buf = (const char *)data;

    int r = http_parse_request(buf, size, &req);
    CHECK(r >= 0 || r == -EBADMSG || r == -EMSGSIZE || r == -EPROTONOSUPPORT);
    CHECK(!(r == 0 && size >= HTTP_MAX_HEAD)); /* a full buffer is never "need more" */

    int r2 = http_parse_request(buf, size, &again); /* deterministic */
    CHECK(r2 == r);
    if (r <= 0)
        return 0;

    check_success(buf, size, &req, r);
    CHECK(again.head_len == req.head_len && again.n_headers == req.n_headers);

    /* every strict prefix of a complete head needs more bytes */
    size_t h = (size_t)r;
    size_t cuts[] = { h - 1, h - 2, h - 3, h / 2, 1 };
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        if (cuts[i] >= h)
            continue;
        /* a copy of exactly the prefix, so ASan sees any read past it */
        char *p = malloc(cuts[i] ? cuts[i] : 1);
        if (!p)
            return 0;
        memcpy(p, buf, cuts[i]);
        int rp = http_parse_request(p, cuts[i], &again);
        free(p);
        CHECK(rp == 0);
    }
    return 0;
}
