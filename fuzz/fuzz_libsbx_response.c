/* SPDX-License-Identifier: MIT */
/* libFuzzer harness: libsbx's HTTP response reader (src/lib/http.c, http_read_response) on
 * arbitrary bytes, as a platform endpoint (or whatever answers at the configured address)
 * could send them.
 *
 * The first byte picks the method (GET or HEAD), whether a 2xx body goes to a sink (which
 * stops after a number of calls given by the byte's high bits) or to memory, and a small or
 * the default body cap; the rest is what the server sends before closing. Beyond "no crash,
 * no out-of-bounds access" (ASan), it checks what callers rely on:
 * - the result is 0 or a negative errno, and on failure the connection is closed;
 * - on success the status is 200..599 (interim answers skipped), a kept body is NUL-terminated
 *   and within its cap, a sunk body reached the sink only for a 2xx answer and is within the
 *   input, HEAD answers carry no body;
 * - the connection is kept only after a complete answer that allows it. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "lib/internal.h"

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        if (!(x)) {                                                                                \
            fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #x);              \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#define INPUT_MAX (96 * 1024) /* fits a unix socket's buffer: written before reading */

typedef struct {
    size_t bytes;
    int calls, stop_at;
} sink_t;

static int sink(const void *d, size_t n, void *ud)
{
    sink_t *s = ud;
    (void)d;
    if (++s->calls == s->stop_at)
        return -ECANCELED;
    s->bytes += n;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > INPUT_MAX)
        return 0;
    uint8_t mode = data[0];
    data++;
    size--;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        abort();
    int big = 4 * INPUT_MAX;
    (void)setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    (void)setsockopt(sv[0], SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    for (size_t off = 0; off < size;) {
        ssize_t n = write(sv[1], data + off, size - off);
        if (n <= 0)
            abort();
        off += (size_t)n;
    }
    close(sv[1]);
    bool head = mode & 1, to_sink = mode & 2, small = mode & 4;
    sink_t s = { .stop_at = mode >> 3 };
    http_req_t rq = { .method = head ? "HEAD" : "GET",
                      .target = "/",
                      .body_fd = -1,
                      .sink = to_sink ? sink : NULL,
                      .sink_ud = &s,
                      .body_max = small ? 16 : 0 };
    http_conn_t c;
    memset(&c, 0, sizeof c);
    c.fd = sv[0];
    c.io_timeout_ms = 1000;
    http_resp_t r = { 0 };
    bool any = false;
    int ret = http_read_response(&c, &rq, &r, &any);
    CHECK(ret <= 0);
    if (ret < 0) {
        CHECK(c.fd == -1);
        CHECK(r.body == NULL || r.body[r.body_len] == 0);
    } else {
        CHECK(any);
        CHECK(r.status >= 200 && r.status <= 599);
        bool ok = r.status < 300;
        if (to_sink && ok) {
            CHECK(r.body == NULL);
            CHECK(s.bytes <= size);
            CHECK(!head || s.bytes == 0);
        } else {
            CHECK(r.body != NULL && r.body[r.body_len] == 0);
            CHECK(r.body_len <= size);
            CHECK(r.body_len <= (ok && small ? 16u : (size_t)HTTP_ERRBODY_MAX));
            CHECK(!head || r.body_len == 0);
            CHECK(to_sink ? s.bytes == 0 : true);
        }
        CHECK(c.fd == -1 || c.used);
    }
    http_resp_free(&r);
    http_conn_close(&c);
    return 0;
}
