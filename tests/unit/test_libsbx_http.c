/* SPDX-License-Identifier: MIT */
/* libsbx's HTTP response reader (src/lib/http.c) on canned answers written into one end of a
 * socketpair: framing (Content-Length, chunked with extensions and trailers, until close,
 * 1xx, 204, HEAD), keep-alive state, caps, streamed sinks, and malformed answers refused. Also
 * the pure helpers: endpoint parsing, URL escaping, the reconnect token derivation. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "lib/internal.h"
#include "tap.h"

typedef struct {
    http_conn_t c;
    http_resp_t r;
    bool any;
    int ret;
} run_t;

/* Write `answer` to a socketpair (then close the writer when close_after), read one response. */
static void read_canned(run_t *t, const char *answer, size_t len, bool close_after,
                        const http_req_t *rq)
{
    int sv[2];
    memset(t, 0, sizeof *t);
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        abort();
    size_t off = 0;
    while (off < len) {
        ssize_t n = write(sv[1], answer + off, len - off);
        if (n <= 0)
            abort();
        off += (size_t)n;
    }
    if (close_after)
        close(sv[1]);
    t->c.fd = sv[0];
    t->c.io_timeout_ms = 1000;
    http_req_t def = { .method = "GET", .target = "/", .body_fd = -1 };
    t->ret = http_read_response(&t->c, rq ? rq : &def, &t->r, &t->any);
    if (!close_after)
        close(sv[1]);
}

static void run_done(run_t *t)
{
    http_resp_free(&t->r);
    http_conn_close(&t->c);
}

#define CANNED(t, lit, close_after, rq) read_canned(t, lit, sizeof(lit) - 1, close_after, rq)

TEST(content_length_keeps_the_connection)
{
    run_t t;
    CANNED(&t, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloEXTRA", false, NULL);
    ASSERT_EQ(t.ret, 0);
    ASSERT_EQ(t.r.status, 200);
    ASSERT_MEMEQ(t.r.body, t.r.body_len, "hello", 5);
    ASSERT_TRUE(t.c.used);
    ASSERT_GE(t.c.fd, 0); /* kept alive */
    run_done(&t);
}

TEST(connection_close_and_http10_close_it)
{
    run_t t;
    CANNED(&t, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", false, NULL);
    ASSERT_EQ(t.ret, 0);
    ASSERT_EQ(t.c.fd, -1);
    run_done(&t);
    CANNED(&t, "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", false, NULL);
    ASSERT_EQ(t.ret, 0);
    ASSERT_EQ(t.c.fd, -1);
    run_done(&t);
}

TEST(chunked_with_extensions_and_trailers)
{
    run_t t;
    CANNED(&t,
           "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
           "3;ext=1\r\nabc\r\nA\r\n0123456789\r\n0\r\nX-Trailer: 1\r\n\r\n",
           false, NULL);
    ASSERT_EQ(t.ret, 0);
    ASSERT_MEMEQ(t.r.body, t.r.body_len, "abc0123456789", 13);
    ASSERT_TRUE(t.c.used);
    run_done(&t);
}

TEST(until_close_and_1xx_and_204)
{
    run_t t;
    CANNED(&t, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n\r\nall of it", true, NULL);
    ASSERT_EQ(t.ret, 0);
    ASSERT_EQ(t.r.status, 200);
    ASSERT_MEMEQ(t.r.body, t.r.body_len, "all of it", 9);
    ASSERT_EQ(t.c.fd, -1); /* a body until close never keeps the connection */
    run_done(&t);
    CANNED(&t, "HTTP/1.1 204 No Content\r\n\r\n", false, NULL);
    ASSERT_EQ(t.ret, 0);
    ASSERT_EQ(t.r.body_len, 0u);
    run_done(&t);
    http_req_t head = { .method = "HEAD", .target = "/", .body_fd = -1 };
    CANNED(&t, "HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n", false, &head);
    ASSERT_EQ(t.ret, 0);
    ASSERT_EQ(t.r.body_len, 0u);
    run_done(&t);
}

typedef struct {
    char buf[256];
    size_t len;
    int calls;
    int fail_at;
} sink_t;

static int sink(const void *d, size_t n, void *ud)
{
    sink_t *s = ud;
    if (++s->calls == s->fail_at)
        return -ECANCELED;
    if (s->len + n > sizeof s->buf)
        return -ENOBUFS;
    memcpy(s->buf + s->len, d, n);
    s->len += n;
    return 0;
}

TEST(sink_gets_2xx_bodies_and_errors_are_kept)
{
    run_t t;
    sink_t s = { 0 };
    http_req_t rq = { .method = "GET", .target = "/", .body_fd = -1, .sink = sink, .sink_ud = &s };
    CANNED(&t,
           "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n1\r\nc\r\n0\r\n\r\n",
           false, &rq);
    ASSERT_EQ(t.ret, 0);
    ASSERT_MEMEQ(s.buf, s.len, "abc", 3);
    ASSERT_TRUE(t.r.body == NULL);
    run_done(&t);
    sink_t s2 = { 0 };
    rq.sink_ud = &s2;
    CANNED(&t, "HTTP/1.1 404 Not Found\r\nContent-Length: 15\r\n\r\n{\"error\":\"no\"}\n", false,
           &rq);
    ASSERT_EQ(t.ret, 0);
    ASSERT_EQ(t.r.status, 404);
    ASSERT_EQ(s2.len, 0u);
    ASSERT_MEMEQ(t.r.body, t.r.body_len, "{\"error\":\"no\"}\n", 15);
    run_done(&t);
    /* a sink that stops: its code comes back and the connection is closed */
    sink_t s3 = { .fail_at = 2 };
    rq.sink_ud = &s3;
    CANNED(&t,
           "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n1\r\nc\r\n0\r\n\r\n",
           false, &rq);
    ASSERT_EQ(t.ret, -ECANCELED);
    ASSERT_EQ(t.c.fd, -1);
    run_done(&t);
}

TEST(caps)
{
    run_t t;
    http_req_t rq = { .method = "GET", .target = "/", .body_fd = -1, .body_max = 4 };
    CANNED(&t, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", false, &rq);
    ASSERT_EQ(t.ret, -EFBIG);
    ASSERT_EQ(t.c.fd, -1);
    run_done(&t);
    CANNED(&t, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nhell", false, &rq);
    ASSERT_EQ(t.ret, 0);
    run_done(&t);
    /* a head line longer than the line buffer */
    size_t n = 20000;
    char *big = malloc(n + 64);
    int k = snprintf(big, n + 64, "HTTP/1.1 200 OK\r\nX: ");
    memset(big + k, 'a', n);
    memcpy(big + k + n, "\r\n\r\n", 4);
    read_canned(&t, big, (size_t)k + n + 4, true, NULL);
    ASSERT_EQ(t.ret, -EPROTO);
    run_done(&t);
    free(big);
}

TEST(malformed_answers_are_refused)
{
    static const char *bad[] = {
        "HTTP/2 200 OK\r\n\r\n",
        "HTTP/1.1 20 OK\r\n\r\n",
        "HTTP/1.1 600 What\r\n\r\n",
        "ICY 200 OK\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\nx",
        "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\n",
        "HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1234567890abcdef0\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabX\r\n0\r\n\r\n",
        /* a bare LF ends no line: not in a head, a chunk size or the trailers (a second
         * response framed inside the first) */
        "HTTP/1.1 200 OK\nContent-Length: 0\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\nx\r\n0\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\n"
        "HTTP/1.1 200 OK\r\nX-Forged: 1\r\nContent-Length: 0\r\n\r\n",
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nnot a field\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        run_t t;
        read_canned(&t, bad[i], strlen(bad[i]), true, NULL);
        if (t.ret != -EPROTO)
            printf("#   case %zu: %s\n", i, bad[i]);
        ASSERT_EQ(t.ret, -EPROTO);
        ASSERT_EQ(t.c.fd, -1);
        run_done(&t);
    }
}

TEST(cut_answers_are_resets_and_silence_is_noticed)
{
    run_t t;
    CANNED(&t, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", true, NULL);
    ASSERT_EQ(t.ret, -ECONNRESET);
    ASSERT_TRUE(t.any);
    run_done(&t);
    CANNED(&t, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab", true, NULL);
    ASSERT_EQ(t.ret, -ECONNRESET);
    run_done(&t);
    /* nothing at all: a stale kept connection (retried once by http_do) */
    read_canned(&t, "", 0, true, NULL);
    ASSERT_EQ(t.ret, -ECONNRESET);
    ASSERT_FALSE(t.any);
    run_done(&t);
}

TEST(endpoints)
{
    http_conn_t c;
    sbx_err_t err;
    ASSERT_EQ(http_conn_init(&c, "http://127.0.0.1:49980", NULL, 0, &err), 0);
    ASSERT_STREQ(c.host, "127.0.0.1");
    ASSERT_STREQ(c.port, "49980");
    http_conn_done(&c);
    ASSERT_EQ(http_conn_init(&c, "http://[::1]:8080/", NULL, 0, &err), 0);
    ASSERT_STREQ(c.host, "::1");
    ASSERT_STREQ(c.port, "8080");
    http_conn_done(&c);
    ASSERT_EQ(http_conn_init(&c, "http://localhost", NULL, 0, &err), 0);
    ASSERT_STREQ(c.port, "80");
    http_conn_done(&c);
    static const char *bad[] = { "ftp://x",         "127.0.0.1:1",       "http://",
                                 "http://h:",       "http://h:1x",       "http://[::1",
                                 "http://h:1/path", "http://h:123456789" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int r = http_conn_init(&c, bad[i], NULL, 0, &err);
        if (r != -EINVAL)
            printf("#   %s\n", bad[i]);
        ASSERT_EQ(r, -EINVAL);
    }
    /* https needs a CA file it can load */
    ASSERT_EQ(http_conn_init(&c, "https://127.0.0.1:1", "/nonexistent/ca.crt", 0, &err), -ENOENT);
    ASSERT_EQ(err.code, -ENOENT);
    ASSERT_TRUE(strstr(err.msg, "/nonexistent/ca.crt") != NULL);
}

TEST(escaping_and_token_derivation)
{
    char *e = url_escape("a b/c?d=e&f%~._-Z9");
    ASSERT_STREQ(e, "a%20b%2Fc%3Fd%3De%26f%25~._-Z9");
    free(e);
    /* HMAC-SHA256(key "k", "sbx-sandbox:n"), the same as scripts/demo.sh's python */
    char out[65];
    ASSERT_EQ(sbx_derive_token("k", "n", out), 0);
    ASSERT_STREQ(out, "79c8acf79e9d1eb84d870a836e80614ca5fc41d0f0389cb8dfdcf7b9a08dd7fc");
}

TAP_MAIN(T(content_length_keeps_the_connection), T(connection_close_and_http10_close_it),
         T(chunked_with_extensions_and_trailers), T(until_close_and_1xx_and_204),
         T(sink_gets_2xx_bodies_and_errors_are_kept), T(caps), T(malformed_answers_are_refused),
         T(cut_answers_are_resets_and_silence_is_noticed), T(endpoints),
         T(escaping_and_token_derivation))
