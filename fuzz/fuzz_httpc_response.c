/* SPDX-License-Identifier: MIT */
/* libFuzzer harness: the daemon-to-daemon HTTP client's response reader (src/common/httpc.c)
 * on arbitrary bytes, as a peer (a node, the control plane) could send them.
 *
 * The first byte picks the request method (GET or HEAD) and whether the body goes to memory
 * (capped at 4 KiB) or to a pipe; the rest is what the server sends before closing. Beyond "no
 * crash, no out-of-bounds access" (ASan), it checks what callers rely on:
 * - the result is 0 or a negative errno;
 * - on success the status is 100..599 (never 1xx: interim answers are skipped), the head is
 *   NUL-terminated and no longer than the input, the body is within its cap and
 *   NUL-terminated, HEAD answers carry no body, and a pipe got exactly body_len bytes;
 * - httpc_header never writes past its buffer and always NUL-terminates on success. */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/httpc.h"

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        if (!(x)) {                                                                                \
            fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #x);              \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#define INPUT_MAX (96 * 1024) /* fits a unix socket's buffer: written before reading */
#define BODY_MAX 4096

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
        ssize_t w = write(sv[1], data + off, size - off);
        if (w <= 0)
            abort(); /* the buffer holds INPUT_MAX: never blocks */
        off += (size_t)w;
    }
    close(sv[1]);
    int pfd[2] = { -1, -1 };
    bool to_pipe = mode & 2;
    if (to_pipe) {
        if (pipe2(pfd, O_CLOEXEC | O_NONBLOCK) < 0)
            abort();
        (void)fcntl(pfd[1], F_SETPIPE_SZ, 1 << 20);
        int fl = fcntl(pfd[1], F_GETFL);
        (void)fcntl(pfd[1], F_SETFL, fl & ~O_NONBLOCK); /* httpc writes blocking */
    }
    httpc_request_t rq;
    httpc_request_init(&rq);
    rq.method = (mode & 1) ? "HEAD" : "GET";
    rq.target = "/";
    rq.timeout_ms = 2000;
    rq.body_max = BODY_MAX;
    rq.body_fd = to_pipe ? pfd[1] : -1;
    httpc_response_t resp = { 0 };
    int r = httpc_read_response_fd(sv[0], &rq, &resp);
    CHECK(r <= 0);
    if (r == 0) {
        CHECK(resp.status >= 200 && resp.status <= 599);
        CHECK(resp.head != NULL && strlen(resp.head) <= size);
        if (mode & 1)
            CHECK(resp.body_len == 0);
        if (!to_pipe) {
            CHECK(resp.body_len <= BODY_MAX);
            CHECK(resp.body == NULL || resp.body[resp.body_len] == '\0');
        } else {
            char buf[65536];
            size_t got = 0;
            ssize_t n;
            (void)fcntl(pfd[0], F_SETFL, O_NONBLOCK);
            while ((n = read(pfd[0], buf, sizeof buf)) > 0)
                got += (size_t)n;
            CHECK(got == resp.body_len);
        }
        char v[16];
        int hr = httpc_header(&resp, "content-type", v, sizeof v);
        CHECK(hr == 0 || hr == -ENOENT || hr == -ENOBUFS);
        if (hr == 0)
            CHECK(memchr(v, 0, sizeof v) != NULL);
    }
    httpc_response_free(&resp);
    close(sv[0]);
    if (to_pipe) {
        close(pfd[0]);
        close(pfd[1]);
    }
    return 0;
}
