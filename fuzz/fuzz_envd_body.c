/* SPDX-License-Identifier: MIT */
/* envd's request bodies (src/server/envd.c, envd_files.c): the bytes as a Connect envelope and
 * as a multipart/form-data body. First line: the boundary (at most 70 bytes); the rest: the
 * body. Beyond "no ASan/UBSan report": an envelope is complete exactly when its declared length
 * fits, no prefix of it is, and the payload stays inside the input; every multipart part's
 * data lies inside the body, parts advance, and the walk ends. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/envd.h"

static void check_envelope(const char *p, size_t n)
{
    uint8_t flags;
    size_t len;
    ssize_t k = envd_envelope_parse(p, n, 1 << 20, &flags, &len);
    if (k > 0) {
        if ((size_t)k > n || (size_t)k != ENVD_ENVELOPE_HEADER + len || flags != (uint8_t)p[0])
            abort();
        for (size_t m = 0; m < (size_t)k; m++) /* every strict prefix needs more */
            if (envd_envelope_parse(p, m, 1 << 20, &flags, &len) != 0)
                abort();
    } else if (k != 0 && k != -EMSGSIZE)
        abort();
    char hdr[ENVD_ENVELOPE_HEADER];
    if (n >= 5) { /* the header writer and the parser agree */
        uint32_t l = (uint32_t)(n - 5);
        envd_envelope_header(hdr, (uint8_t)p[0], l);
        char *buf = malloc(n);
        if (!buf)
            abort();
        memcpy(buf, hdr, 5);
        memcpy(buf + 5, p + 5, n - 5);
        if (envd_envelope_parse(buf, n, SIZE_MAX, &flags, &len) != (ssize_t)n || len != l)
            abort();
        free(buf);
    }
}

static void check_multipart(const char *p, size_t n)
{
    const char *nl = memchr(p, '\n', n);
    if (!nl || nl - p > 70 || nl == p)
        return;
    char boundary[80];
    memcpy(boundary, p, (size_t)(nl - p));
    boundary[nl - p] = '\0';
    if (strlen(boundary) != (size_t)(nl - p))
        return;
    const char *body = nl + 1;
    size_t len = n - (size_t)(body - p), pos = 0, last = 0;
    envd_part_t part;
    for (int i = 0; i < 100000; i++) {
        int r = envd_multipart_next(body, len, boundary, &pos, &part);
        if (r <= 0) {
            if (r != 0 && r != -EINVAL)
                abort();
            return;
        }
        if (part.data < body || part.data + part.len > body + len || pos > len ||
            (i > 0 && pos <= last))
            abort();
        if (strnlen(part.name, sizeof part.name) == sizeof part.name ||
            strnlen(part.filename, sizeof part.filename) == sizeof part.filename)
            abort();
        last = pos;
    }
    abort(); /* the walk must end */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check_envelope((const char *)data, size);
    check_multipart((const char *)data, size);
    return 0;
}
