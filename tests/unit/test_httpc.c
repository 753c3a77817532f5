/* SPDX-License-Identifier: MIT */
/* The blocking HTTP/1.1 client (src/common/httpc.c) against tiny canned servers: each test
 * forks a child that accepts one connection on 127.0.0.1, ::1 or a unix socket, reads the
 * request, replays a fixed response and hands the request bytes it received back through a
 * pipe, so the test checks both directions byte for byte. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/httpc.h"
#include "common/macro.h"
#include "common/strutil.h"
#include "tap.h"

#define REQ_CAP (4u * 1024 * 1024)

/* The scratch directory for unix sockets (set up in main). */
static char tmpdir[64];

typedef enum {
    SRV_REPLY,      /* read the request, answer, close */
    SRV_REPLY_OPEN, /* read the request, answer, keep the connection open */
    SRV_HANG,       /* read the request, never answer */
} srv_mode_t;

typedef struct {
    pid_t pid;
    int lfd;
    int req_fd; /* read end: the request bytes the server received */
    uint16_t port;
    char path[108];
    bool ok;
} srv_t;

static int write_all_fd(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t k = write(fd, c, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Read until EOF (or 3 s without data) into a malloc'ed buffer. */
static char *read_all_fd(int fd, size_t *ret_len)
{
    size_t len = 0, cap = 65536;
    char *b = malloc(cap + 1);
    for (;;) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        if (!b || poll(&p, 1, 3000) <= 0)
            break;
        if (len == cap) {
            char *n = realloc(b, cap * 2 + 1);
            if (!n)
                break;
            b = n;
            cap *= 2;
        }
        ssize_t k = read(fd, b + len, cap - len);
        if (k <= 0)
            break;
        len += (size_t)k;
    }
    if (b)
        b[len] = '\0';
    *ret_len = len;
    return b;
}

/* The child: read one request (head + Content-Length body), act out the mode. */
static _noreturn_ void srv_child(int lfd, int wfd, srv_mode_t mode, const char *resp, size_t rlen)
{
    (void)signal(SIGPIPE, SIG_IGN);
    (void)alarm(10); /* never outlive a broken test */
    int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (c < 0)
        _exit(1);
    struct timeval tv = { .tv_sec = 3 };
    (void)setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char *req = malloc(REQ_CAP);
    size_t len = 0, want = SIZE_MAX;
    while (req && len < want && len < REQ_CAP) {
        ssize_t k = read(c, req + len, REQ_CAP - len);
        if (k <= 0)
            break;
        len += (size_t)k;
        const char *end = memmem(req, len, "\r\n\r\n", 4);
        if (end && want == SIZE_MAX) {
            uint64_t cl = 0;
            const char *h = memmem(req, (size_t)(end - req), "\r\nContent-Length: ", 18);
            if (h) {
                const char *v = h + 18, *e = memmem(v, (size_t)(end + 2 - v), "\r\n", 2);
                if (parse_u64(sv_make(v, (size_t)(e - v)), REQ_CAP, &cl) < 0)
                    cl = 0;
            }
            want = (size_t)(end - req) + 4 + cl;
        }
    }
    if (mode == SRV_HANG) {
        (void)write_all_fd(wfd, req, len);
        close(wfd);
        pause();
    }
    (void)write_all_fd(c, resp, rlen);
    if (mode == SRV_REPLY_OPEN) {
        (void)write_all_fd(wfd, req, len);
        close(wfd);
        pause();
    }
    close(c);
    (void)write_all_fd(wfd, req, len);
    free(req);
    _exit(0);
}

/* A listening socket: AF_INET (127.0.0.1), AF_INET6 (::1) or AF_UNIX (in tmpdir). With
 * listen_too false it is only bound, so connecting to it is refused. */
static int srv_socket(srv_t *s, int family, bool listen_too)
{
    static unsigned seq;
    struct sockaddr_storage ss = { 0 };
    socklen_t sl;
    *s = (srv_t){ .pid = -1, .lfd = -1, .req_fd = -1 };
    s->lfd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s->lfd < 0)
        return -1;
    if (family == AF_INET) {
        struct sockaddr_in *in = (struct sockaddr_in *)&ss;
        in->sin_family = AF_INET;
        in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        sl = sizeof *in;
    } else if (family == AF_INET6) {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
        in6->sin6_family = AF_INET6;
        in6->sin6_addr = in6addr_loopback;
        sl = sizeof *in6;
    } else {
        struct sockaddr_un *un = (struct sockaddr_un *)&ss;
        un->sun_family = AF_UNIX;
        (void)snprintf(s->path, sizeof s->path, "%s/s%u.sock", tmpdir, seq++);
        memcpy(un->sun_path, s->path, strlen(s->path) + 1);
        sl = sizeof *un;
    }
    if (bind(s->lfd, (struct sockaddr *)&ss, sl) < 0 || (listen_too && listen(s->lfd, 8) < 0))
        return -1;
    if (family != AF_UNIX) {
        sl = sizeof ss;
        if (getsockname(s->lfd, (struct sockaddr *)&ss, &sl) < 0)
            return -1;
        s->port = ntohs(family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
                                          : ((struct sockaddr_in6 *)&ss)->sin6_port);
    }
    return 0;
}

static void srv_start_n(srv_t *s, int family, srv_mode_t mode, const char *resp, size_t rlen)
{
    int p[2];
    if (srv_socket(s, family, true) < 0 || pipe2(p, O_CLOEXEC) < 0)
        return;
    fflush(stdout);
    s->pid = fork();
    if (s->pid == 0) {
        close(p[0]);
        srv_child(s->lfd, p[1], mode, resp, rlen);
    }
    close(p[1]);
    s->req_fd = p[0];
    s->ok = s->pid > 0;
}

static void srv_start(srv_t *s, int family, srv_mode_t mode, const char *resp)
{
    srv_start_n(s, family, mode, resp, strlen(resp));
}

static void srv_stop(srv_t *s)
{
    if (s->pid > 0) {
        (void)kill(s->pid, SIGKILL);
        (void)waitpid(s->pid, NULL, 0);
    }
    if (s->lfd >= 0)
        close(s->lfd);
    if (s->req_fd >= 0)
        close(s->req_fd);
    if (s->path[0])
        (void)unlink(s->path);
    *s = (srv_t){ .pid = -1, .lfd = -1, .req_fd = -1 };
}

/* A request to s: unix path for unix servers, else 127.0.0.1 or ::1 by family. */
static void rq_for(httpc_request_t *rq, const srv_t *s, int family)
{
    httpc_request_init(rq);
    rq->method = "GET";
    rq->target = "/";
    rq->timeout_ms = 3000;
    if (family == AF_UNIX)
        rq->unix_path = s->path;
    else
        rq->host = family == AF_INET ? "127.0.0.1" : "::1";
    rq->port = s->port;
}

/* One GET to a fresh IPv4 server replaying resp; returns httpc_do's result. */
static int get_canned(const char *resp, size_t body_max, httpc_response_t *ret)
{
    srv_t s;
    httpc_request_t rq;
    srv_start(&s, AF_INET, SRV_REPLY, resp);
    if (!s.ok) {
        srv_stop(&s);
        return -999;
    }
    rq_for(&rq, &s, AF_INET);
    rq.body_max = body_max;
    int r = httpc_do(&rq, ret);
    srv_stop(&s);
    return r;
}

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

TEST(content_length_body)
{
    httpc_response_t r = { 0 };
    ASSERT_EQ(get_canned("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Thing:  spaced \t\r\n\r\nhello",
                         0, &r),
              0);
    ASSERT_EQ(r.status, 200);
    ASSERT_MEMEQ(r.body, r.body_len, "hello", 5);
    ASSERT_EQ(r.body[5], '\0');
    ASSERT_STREQ(r.head, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Thing:  spaced \t\r\n");
    httpc_response_free(&r);
    ASSERT_TRUE(r.head == NULL && r.body == NULL);
    /* An empty body is still a NUL-terminated string. */
    ASSERT_EQ(get_canned("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n", 0, &r), 0);
    ASSERT_EQ(r.status, 404);
    ASSERT_EQ_U(r.body_len, 0);
    ASSERT_STREQ(r.body, "");
    httpc_response_free(&r);
}

TEST(chunked_body_with_extensions_and_trailer)
{
    httpc_response_t r = { 0 };
    ASSERT_EQ(get_canned("HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n"
                         "5;name=val\r\nhello\r\n6 ; x=\"y\"\r\n world\r\nB\r\n 0123456789\r\n"
                         "0;last\r\nX-Trailer: yes\r\nX-More: 1\r\n\r\n",
                         0, &r),
              0);
    ASSERT_EQ(r.status, 200);
    ASSERT_MEMEQ(r.body, r.body_len, "hello world 0123456789", 22);
    httpc_response_free(&r);
    /* Chunk data longer than its size, a size that is not hex, a stream cut short. */
    ASSERT_EQ(
        get_canned("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhello\r\n0\r\n\r\n",
                   0, &r),
        -EPROTO);
    ASSERT_EQ(get_canned("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nx\r\n\r\n", 0, &r),
              -EPROTO);
    ASSERT_EQ(get_canned("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel", 0, &r),
              -EPROTO);
    /* Both framings at once, and an unknown coding, are refused. */
    ASSERT_EQ(
        get_canned("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n"
                   "0\r\n\r\n",
                   0, &r),
        -EPROTO);
    ASSERT_EQ(get_canned("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nxx", 0, &r), -EPROTO);
}

TEST(body_until_close)
{
    httpc_response_t r = { 0 };
    ASSERT_EQ(get_canned("HTTP/1.0 200 OK\r\nServer: x\r\n\r\nuntil the end\r\n\r\nreally", 0, &r),
              0);
    ASSERT_EQ(r.status, 200);
    ASSERT_MEMEQ(r.body, r.body_len, "until the end\r\n\r\nreally", 23);
    httpc_response_free(&r);
    /* Content-Length promised more than came before the close. */
    ASSERT_EQ(get_canned("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", 0, &r), -EPROTO);
}

TEST(interim_100_continue_then_final)
{
    httpc_response_t r = { 0 };
    ASSERT_EQ(get_canned("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\nX-A: 1\r\n\r\n"
                         "HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok",
                         0, &r),
              0);
    ASSERT_EQ(r.status, 201);
    ASSERT_STREQ(r.head, "HTTP/1.1 201 Created\r\nContent-Length: 2\r\n");
    ASSERT_MEMEQ(r.body, r.body_len, "ok", 2);
    httpc_response_free(&r);
    /* 101 is never asked for. */
    ASSERT_EQ(get_canned("HTTP/1.1 101 Switching Protocols\r\n\r\n", 0, &r), -EPROTO);
}

/* 204 and HEAD: no body is read, so they return although the server keeps the connection
 * open (reading to the end would wait for the 3 s timeout). */
TEST(no_content_204_and_head)
{
    srv_t s;
    httpc_request_t rq;
    httpc_response_t r = { 0 };
    uint64_t t0 = mono_ms();
    srv_start(&s, AF_INET, SRV_REPLY_OPEN, "HTTP/1.1 204 No Content\r\nX-Id: 7\r\n\r\n");
    ASSERT_TRUE(s.ok);
    rq_for(&rq, &s, AF_INET);
    int ret = httpc_do(&rq, &r);
    srv_stop(&s);
    ASSERT_EQ(ret, 0);
    ASSERT_EQ(r.status, 204);
    ASSERT_EQ_U(r.body_len, 0);
    httpc_response_free(&r);

    srv_start(&s, AF_INET, SRV_REPLY_OPEN, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n");
    ASSERT_TRUE(s.ok);
    rq_for(&rq, &s, AF_INET);
    rq.method = "HEAD";
    rq.target = "/thing";
    ret = httpc_do(&rq, &r);
    size_t n;
    char *got = read_all_fd(s.req_fd, &n);
    char want[256];
    (void)snprintf(want, sizeof want,
                   "HEAD /thing HTTP/1.1\r\nHost: 127.0.0.1:%u\r\nConnection: close\r\n\r\n",
                   (unsigned)s.port);
    srv_stop(&s);
    ASSERT_EQ(ret, 0);
    ASSERT_EQ(r.status, 200);
    ASSERT_EQ_U(r.body_len, 0);
    char v[16];
    ASSERT_EQ(httpc_header(&r, "content-length", v, sizeof v), 0);
    ASSERT_STREQ(v, "100");
    httpc_response_free(&r);
    ASSERT_MEMEQ(got, n, want, strlen(want));
    free(got);
    ASSERT_LT(mono_ms() - t0, 2000);
}

/* A head of exactly HTTPC_HEAD_MAX bytes (blank line included) is accepted; one byte more is
 * -EFBIG. */
TEST(head_over_the_cap)
{
    const char *pre = "HTTP/1.1 200 OK\r\nX-Big: ";
    size_t fill = HTTPC_HEAD_MAX - strlen(pre) - 4;
    char *resp = malloc(HTTPC_HEAD_MAX + 64);
    ASSERT_TRUE(resp != NULL);
    memcpy(resp, pre, strlen(pre));
    memset(resp + strlen(pre), 'a', fill + 1);
    memcpy(resp + strlen(pre) + fill, "\r\n\r\n", 5);
    ASSERT_EQ_U(strlen(resp), HTTPC_HEAD_MAX);
    httpc_response_t r = { 0 };
    int ret = get_canned(resp, 0, &r);
    size_t head_len = r.head ? strlen(r.head) : 0;
    httpc_response_free(&r);
    ASSERT_EQ(ret, 0);
    ASSERT_EQ_U(head_len, HTTPC_HEAD_MAX - 2);

    memset(resp + strlen(pre), 'a', fill + 1);
    memcpy(resp + strlen(pre) + fill + 1, "\r\n\r\n", 5);
    ret = get_canned(resp, 0, &r);
    free(resp);
    ASSERT_EQ(ret, -EFBIG);
}

TEST(body_over_body_max)
{
    httpc_response_t r = { 0 };
    const char *cl = "HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhello world";
    ASSERT_EQ(get_canned(cl, 10, &r), -EFBIG);
    ASSERT_EQ(get_canned(cl, 11, &r), 0); /* control: exactly the cap */
    ASSERT_MEMEQ(r.body, r.body_len, "hello world", 11);
    httpc_response_free(&r);
    ASSERT_EQ(get_canned("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                         "6\r\nhello \r\n5\r\nworld\r\n0\r\n\r\n",
                         10, &r),
              -EFBIG);
    ASSERT_EQ(get_canned("HTTP/1.1 200 OK\r\n\r\nhello world", 10, &r), -EFBIG);
    ASSERT_EQ(get_canned("HTTP/1.1 200 OK\r\n\r\nhello worl", 10, &r), 0);
    ASSERT_EQ_U(r.body_len, 10);
    httpc_response_free(&r);
}

TEST(malformed_responses)
{
    static const char *const bad[] = {
        "HTTP/1.1 2OO OK\r\n\r\n",
        "HTTP/2 200 OK\r\n\r\n",
        "ICY 200 OK\r\n\r\n",
        "HTTP/1.1 200OK\r\n\r\n",
        "HTTP/1.1  200 OK\r\n\r\n",
        "HTTP/1.1 20 OK\r\n\r\n",
        "HTTP/1.1 600 What\r\n\r\n",
        "HTTP/1.1 200 OK\nContent-Length: 0\r\n\r\n",
        "HTTP/1.1 200 OK\r\nNo colon here\r\n\r\n",
        "HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n",
        "HTTP/1.1 200 OK\r\nX-A: 1\r\n folded\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        "HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello",
        "HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello",
        "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999999\r\n\r\n",
        "\r\nHTTP/1.1 200 OK\r\n\r\n",
        "",
    };
    for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
        httpc_response_t r = { 0 };
        int ret = get_canned(bad[i], 0, &r);
        if (ret != -EPROTO)
            tap_print_bytes_("response", bad[i], strlen(bad[i]));
        ASSERT_EQ(ret, -EPROTO);
    }
    /* Controls: agreeing duplicates, a status line without a reason, OWS around values. */
    httpc_response_t r = { 0 };
    ASSERT_EQ(
        get_canned("HTTP/1.1 200 OK\r\nContent-Length: 2\r\ncontent-length:2 \r\n\r\nok", 0, &r),
        0);
    ASSERT_MEMEQ(r.body, r.body_len, "ok", 2);
    httpc_response_free(&r);
    ASSERT_EQ(get_canned("HTTP/1.1 503\r\nContent-Length:\t0\t\r\n\r\n", 0, &r), 0);
    ASSERT_EQ(r.status, 503);
    httpc_response_free(&r);
}

TEST(server_that_never_answers_times_out)
{
    srv_t s;
    httpc_request_t rq;
    httpc_response_t r = { 0 };
    srv_start(&s, AF_INET, SRV_HANG, "");
    ASSERT_TRUE(s.ok);
    rq_for(&rq, &s, AF_INET);
    rq.timeout_ms = 300;
    uint64_t t0 = mono_ms();
    int ret = httpc_do(&rq, &r);
    uint64_t took = mono_ms() - t0;
    srv_stop(&s);
    ASSERT_EQ(ret, -ETIMEDOUT);
    ASSERT_GE(took, 290);
    ASSERT_LT(took, 1000);
}

/* A bound but not listening TCP socket: the port is ours and connecting is refused. */
TEST(connection_refused)
{
    srv_t s;
    httpc_request_t rq;
    httpc_response_t r = { 0 };
    ASSERT_EQ(srv_socket(&s, AF_INET, false), 0);
    rq_for(&rq, &s, AF_INET);
    int ret = httpc_do(&rq, &r);
    srv_stop(&s);
    ASSERT_EQ(ret, -ECONNREFUSED);
}

/* A unix path with nothing there is -ENOENT (what connect(2) says); a socket file with no
 * listener behind it (a daemon that died) is -ECONNREFUSED. */
TEST(unix_socket_missing_or_stale)
{
    srv_t s;
    httpc_request_t rq;
    httpc_response_t r = { 0 };
    char path[128];
    (void)snprintf(path, sizeof path, "%s/nothing-here.sock", tmpdir);
    httpc_request_init(&rq);
    rq.method = "GET";
    rq.target = "/";
    rq.unix_path = path;
    ASSERT_EQ(httpc_do(&rq, &r), -ENOENT);

    ASSERT_EQ(srv_socket(&s, AF_UNIX, false), 0);
    rq.unix_path = s.path;
    int ret = httpc_do(&rq, &r);
    srv_stop(&s);
    ASSERT_EQ(ret, -ECONNREFUSED);
}

/* Run rq against a fresh server of the family (at host, if given, instead of the loopback
 * literal); return httpc_do's result and what the server got. */
static int exchange(int family, httpc_request_t *rq, httpc_response_t *r, char **ret_req,
                    size_t *ret_len, uint16_t *ret_port, const char *host)
{
    srv_t s;
    srv_start(&s, family, SRV_REPLY, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
    if (!s.ok) {
        srv_stop(&s);
        return -999;
    }
    httpc_request_t base;
    rq_for(&base, &s, family);
    rq->unix_path = base.unix_path;
    rq->host = host ? host : base.host;
    rq->port = base.port;
    int ret = httpc_do(rq, r);
    *ret_req = read_all_fd(s.req_fd, ret_len);
    *ret_port = s.port;
    srv_stop(&s);
    return ret;
}

TEST(request_bytes_ipv4_post)
{
    httpc_request_t rq;
    httpc_response_t r = { 0 };
    char *got, want[512];
    size_t n;
    uint16_t port;
    httpc_request_init(&rq);
    rq.method = "POST";
    rq.target = "/v1/runs/a%20b?x=1&y=2";
    rq.headers = "Authorization: Bearer t0k\r\nX-Empty:\r\nContent-Type: application/json\r\n";
    rq.body = "{\"a\":1}";
    rq.body_len = 7;
    ASSERT_EQ(exchange(AF_INET, &rq, &r, &got, &n, &port, NULL), 0);
    ASSERT_EQ(r.status, 200);
    ASSERT_MEMEQ(r.body, r.body_len, "ok", 2);
    httpc_response_free(&r);
    (void)snprintf(want, sizeof want,
                   "POST /v1/runs/a%%20b?x=1&y=2 HTTP/1.1\r\nHost: 127.0.0.1:%u\r\n"
                   "Connection: close\r\nContent-Length: 7\r\nAuthorization: Bearer t0k\r\n"
                   "X-Empty:\r\nContent-Type: application/json\r\n\r\n{\"a\":1}",
                   (unsigned)port);
    ASSERT_MEMEQ(got, n, want, strlen(want));
    free(got);
}

/* A GET carries no Content-Length; a DELETE with a body does. */
TEST(request_bytes_ipv6_get_and_delete)
{
    srv_t probe;
    if (srv_socket(&probe, AF_INET6, true) < 0) {
        srv_stop(&probe);
        printf("# ::1 unavailable here; IPv6 case skipped\n");
        return;
    }
    srv_stop(&probe);
    httpc_request_t rq;
    httpc_response_t r = { 0 };
    char *got, want[512];
    size_t n;
    uint16_t port;
    httpc_request_init(&rq);
    rq.method = "GET";
    rq.target = "/v1/health";
    ASSERT_EQ(exchange(AF_INET6, &rq, &r, &got, &n, &port, NULL), 0);
    httpc_response_free(&r);
    (void)snprintf(want, sizeof want,
                   "GET /v1/health HTTP/1.1\r\nHost: [::1]:%u\r\nConnection: close\r\n\r\n",
                   (unsigned)port);
    ASSERT_MEMEQ(got, n, want, strlen(want));
    free(got);

    /* A zone is used to connect but not sent (it means nothing to the server). */
    ASSERT_EQ(exchange(AF_INET6, &rq, &r, &got, &n, &port, "::1%lo"), 0);
    httpc_response_free(&r);
    (void)snprintf(want, sizeof want,
                   "GET /v1/health HTTP/1.1\r\nHost: [::1]:%u\r\nConnection: close\r\n\r\n",
                   (unsigned)port);
    ASSERT_MEMEQ(got, n, want, strlen(want));
    free(got);

    rq.method = "DELETE";
    rq.body = "x";
    rq.body_len = 1;
    ASSERT_EQ(exchange(AF_INET6, &rq, &r, &got, &n, &port, NULL), 0);
    httpc_response_free(&r);
    (void)snprintf(want, sizeof want,
                   "DELETE /v1/health HTTP/1.1\r\nHost: [::1]:%u\r\nConnection: close\r\n"
                   "Content-Length: 1\r\n\r\nx",
                   (unsigned)port);
    ASSERT_MEMEQ(got, n, want, strlen(want));
    free(got);
}

/* Over a unix socket the Host is "localhost"; a PUT without a body says Content-Length: 0. */
TEST(request_bytes_unix_put_empty)
{
    httpc_request_t rq;
    httpc_response_t r = { 0 };
    char *got;
    size_t n;
    uint16_t port;
    httpc_request_init(&rq);
    rq.method = "PUT";
    rq.target = "/v1/x";
    ASSERT_EQ(exchange(AF_UNIX, &rq, &r, &got, &n, &port, NULL), 0);
    ASSERT_EQ(r.status, 200);
    httpc_response_free(&r);
    const char *want = "PUT /v1/x HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
                       "Content-Length: 0\r\n\r\n";
    ASSERT_MEMEQ(got, n, want, strlen(want));
    free(got);
}

/* A 1 MiB body goes out whole (many partial sends) and arrives byte for byte. */
TEST(large_request_body)
{
    size_t blen = 1024 * 1024;
    char *body = malloc(blen);
    ASSERT_TRUE(body != NULL);
    for (size_t i = 0; i < blen; i++)
        body[i] = (char)('a' + i % 26);
    httpc_request_t rq;
    httpc_response_t r = { 0 };
    char *got;
    size_t n;
    uint16_t port;
    httpc_request_init(&rq);
    rq.method = "POST";
    rq.target = "/big";
    rq.body = body;
    rq.body_len = blen;
    int ret = exchange(AF_INET, &rq, &r, &got, &n, &port, NULL);
    httpc_response_free(&r);
    const char *end = got ? memmem(got, n, "\r\n\r\n", 4) : NULL;
    bool same = end && n - (size_t)(end + 4 - got) == blen && memcmp(end + 4, body, blen) == 0;
    free(got);
    free(body);
    ASSERT_EQ(ret, 0);
    ASSERT_TRUE(same);
}

/* A chunked 40 000-byte body streamed into a pipe; body_max does not apply then. */
TEST(body_fd_streams_into_a_pipe)
{
    size_t blen = 40000, rlen = 0;
    char *resp = malloc(blen + 4096), *expect = malloc(blen);
    ASSERT_TRUE(resp && expect);
    rlen += (size_t)snprintf(resp, 128, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
    for (size_t off = 0; off < blen;) {
        size_t k = MIN(blen - off, (size_t)7000);
        rlen += (size_t)snprintf(resp + rlen, 32, "%zx\r\n", k);
        for (size_t i = 0; i < k; i++)
            resp[rlen + i] = expect[off + i] = (char)('A' + (off + i) % 23);
        rlen += k;
        memcpy(resp + rlen, "\r\n", 2);
        rlen += 2;
        off += k;
    }
    memcpy(resp + rlen, "0\r\n\r\n", 5);
    rlen += 5;

    int p[2];
    ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
    srv_t s;
    httpc_request_t rq;
    httpc_response_t r = { 0 };
    srv_start_n(&s, AF_INET, SRV_REPLY, resp, rlen);
    rq_for(&rq, &s, AF_INET);
    rq.body_fd = p[1];
    rq.body_max = 10;
    int ret = s.ok ? httpc_do(&rq, &r) : -999;
    srv_stop(&s);
    close(p[1]);
    size_t n;
    char *got = read_all_fd(p[0], &n);
    close(p[0]);
    bool same = got && n == blen && memcmp(got, expect, blen) == 0;
    free(got);
    free(resp);
    free(expect);
    ASSERT_EQ(ret, 0);
    ASSERT_EQ(r.status, 200);
    ASSERT_TRUE(r.body == NULL);
    ASSERT_EQ_U(r.body_len, blen);
    httpc_response_free(&r);
    ASSERT_EQ_U(n, blen);
    ASSERT_TRUE(same);
}

TEST(header_lookup)
{
    httpc_response_t r = { 0 };
    char v[16];
    ASSERT_EQ(get_canned("HTTP/1.1 200 OK\r\nContent-Type: \t text/plain \t\r\nX-Dup: first\r\n"
                         "x-dup: second\r\nX-Empty:\r\nContent-Length: 0\r\n\r\n",
                         0, &r),
              0);
    ASSERT_EQ(httpc_header(&r, "content-type", v, sizeof v), 0);
    ASSERT_STREQ(v, "text/plain");
    ASSERT_EQ(httpc_header(&r, "CONTENT-TYPE", v, sizeof v), 0);
    ASSERT_STREQ(v, "text/plain");
    ASSERT_EQ(httpc_header(&r, "X-DUP", v, sizeof v), 0);
    ASSERT_STREQ(v, "first");
    ASSERT_EQ(httpc_header(&r, "x-empty", v, sizeof v), 0);
    ASSERT_STREQ(v, "");
    ASSERT_EQ(httpc_header(&r, "X-Missing", v, sizeof v), -ENOENT);
    ASSERT_EQ(httpc_header(&r, "Content", v, sizeof v), -ENOENT);
    ASSERT_EQ(httpc_header(&r, "HTTP/1.1 200 OK", v, sizeof v), -ENOENT); /* not a header */
    ASSERT_EQ(httpc_header(&r, "content-type", v, 10), -ENOBUFS);         /* 10 + NUL */
    ASSERT_EQ(httpc_header(&r, "content-type", v, 11), 0);
    ASSERT_STREQ(v, "text/plain");
    httpc_response_free(&r);
}

/* Requests that could not be sent as asked are refused before connecting: a closed port would
 * otherwise say -ECONNREFUSED (the control at the end). */
TEST(invalid_requests_are_refused)
{
    srv_t s;
    ASSERT_EQ(srv_socket(&s, AF_INET, false), 0);
    httpc_request_t rq;
    httpc_response_t r = { 0 };
    struct {
        const char *method, *target, *headers;
    } bad[] = {
        { "GET", "/a b", NULL },
        { "GET", "/a\r\nX: y", NULL },
        { "GET", "a", NULL },
        { "GET", "", NULL },
        { "G ET", "/", NULL },
        { "", "/", NULL },
        { "GET", "/", "X-A: 1" },
        { "GET", "/", "X-A: 1\n" },
        { "GET", "/", "X-A: 1\nX-B: 2\r\n" },
        { "GET", "/", "X-A: 1\r\n\r\nGET /smuggled HTTP/1.1\r\n" },
        { "GET", "/", "X-A: 1\rX-B: 2\r\n" },
        { "GET", "/", "No colon\r\n" },
        { "GET", "/", "Host: evil\r\n" },
        { "GET", "/", "content-length: 5\r\n" },
    };
    for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
        rq_for(&rq, &s, AF_INET);
        rq.method = bad[i].method;
        rq.target = bad[i].target;
        rq.headers = bad[i].headers;
        int ret = httpc_do(&rq, &r);
        if (ret != -EINVAL)
            printf("#   case %zu\n", i);
        ASSERT_EQ(ret, -EINVAL);
    }
    rq_for(&rq, &s, AF_INET);
    rq.body_len = 3; /* and no body */
    ASSERT_EQ(httpc_do(&rq, &r), -EINVAL);
    static const char *const hosts[] = { "localhost",      "127.1", "127.0.0.1 ",
                                         "::1%no-such-if", "[::1]", "" };
    for (size_t i = 0; i < ELEMENTSOF(hosts); i++) {
        rq_for(&rq, &s, AF_INET);
        rq.host = hosts[i]; /* numeric addresses only */
        ASSERT_EQ(httpc_do(&rq, &r), -EINVAL);
    }
    rq_for(&rq, &s, AF_INET);
    rq.unix_path = "/run/x.sock"; /* two destinations */
    ASSERT_EQ(httpc_do(&rq, &r), -EINVAL);
    rq_for(&rq, &s, AF_INET);
    rq.port = 0;
    ASSERT_EQ(httpc_do(&rq, &r), -EINVAL);
    httpc_request_init(&rq);
    rq.method = "GET";
    rq.target = "/";
    char longpath[200];
    memset(longpath, 'p', sizeof longpath - 1);
    longpath[sizeof longpath - 1] = '\0';
    rq.unix_path = longpath; /* longer than sun_path */
    ASSERT_EQ(httpc_do(&rq, &r), -EINVAL);

    rq_for(&rq, &s, AF_INET); /* control */
    rq.headers = "X-A: 1\r\n";
    int ret = httpc_do(&rq, &r);
    srv_stop(&s);
    ASSERT_EQ(ret, -ECONNREFUSED);
}

/* ---- keep-alive (httpc_pool_t) ---- */

typedef enum {
    KA_KEEP,        /* answer every request and keep the connection */
    KA_SAY_CLOSE,   /* answer with "Connection: close", then close */
    KA_QUIET_CLOSE, /* answer, then close without saying so (a server's idle timeout) */
    KA_DROP_SECOND, /* answer the first request; read the second and close without answering */
} ka_mode_t;

/* One connection of the keep-alive server: answers "<conn>:<request>" and logs
 * "<conn>:<request>:<method>" lines to logfd (O_APPEND). */
static _noreturn_ void ka_conn(int c, unsigned conn_no, ka_mode_t mode, int logfd)
{
    char req[8192];
    size_t len = 0;
    (void)alarm(10);
    for (unsigned n = 1;; n++) {
        const char *end;
        while (!(end = memmem(req, len, "\r\n\r\n", 4))) {
            ssize_t k = len < sizeof req ? read(c, req + len, sizeof req - len) : -1;
            if (k <= 0)
                _exit(0);
            len += (size_t)k;
        }
        size_t used = (size_t)(end - req) + 4;
        const char *h = memmem(req, used, "\r\nContent-Length: ", 18);
        uint64_t cl = 0;
        if (h && parse_u64(sv_make(h + 18, strcspn(h + 18, "\r")), sizeof req, &cl) < 0)
            _exit(1);
        used += (size_t)cl;
        while (len < used) { /* the body (small in these tests) */
            ssize_t k = read(c, req + len, sizeof req - len);
            if (k <= 0)
                _exit(0);
            len += (size_t)k;
        }
        char line[64], resp[256], body[32];
        int ml = (int)strcspn(req, " ");
        int ll = snprintf(line, sizeof line, "%u:%u:%.*s\n", conn_no, n, ml, req);
        (void)write_all_fd(logfd, line, (size_t)ll);
        memmove(req, req + used, len - used);
        len -= used;
        if (mode == KA_DROP_SECOND && n == 2)
            _exit(0);
        int bl = snprintf(body, sizeof body, "%u:%u", conn_no, n);
        int rl = snprintf(resp, sizeof resp, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s",
                          bl, mode == KA_SAY_CLOSE ? "Connection: close\r\n" : "", body);
        (void)write_all_fd(c, resp, (size_t)rl);
        if (mode == KA_SAY_CLOSE || mode == KA_QUIET_CLOSE)
            _exit(0);
    }
}

/* The server: a child per connection, numbered in accept order. */
static void ka_start(srv_t *s, ka_mode_t mode, int logfd)
{
    if (srv_socket(s, AF_INET, true) < 0)
        return;
    fflush(stdout);
    s->pid = fork();
    if (s->pid == 0) {
        (void)signal(SIGPIPE, SIG_IGN);
        (void)alarm(10);
        for (unsigned conn_no = 1;; conn_no++) {
            int c = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC);
            if (c < 0)
                _exit(1);
            if (fork() == 0) {
                close(s->lfd);
                ka_conn(c, conn_no, mode, logfd);
            }
            close(c);
        }
    }
    s->ok = s->pid > 0;
}

/* A GET (or method) through the pool under key; the body, or "" with *ret the error. */
static int ka_get(const srv_t *s, httpc_pool_t *pool, const char *key, const char *method,
                  char *out, size_t cap)
{
    httpc_request_t rq;
    httpc_response_t r = { 0 };
    rq_for(&rq, s, AF_INET);
    rq.method = method;
    rq.pool = pool;
    rq.pool_key = key;
    if (streq(method, "POST")) {
        rq.body = "{}";
        rq.body_len = 2;
    }
    out[0] = '\0';
    int ret = httpc_do(&rq, &r);
    if (ret >= 0)
        (void)snprintf(out, cap, "%.*s", (int)r.body_len, r.body ? r.body : "");
    httpc_response_free(&r);
    return ret;
}

static int ka_log(const char *path, char *out, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t k = read(fd, out, cap - 1);
    close(fd);
    out[k > 0 ? k : 0] = '\0';
    return 0;
}

static int ka_logfd(char *path, size_t cap)
{
    static unsigned seq;
    (void)snprintf(path, cap, "%s/ka%u.log", tmpdir, seq++);
    return open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
}

TEST(keep_alive_reuses_one_connection)
{
    char path[128], b[64];
    int logfd = ka_logfd(path, sizeof path);
    ASSERT_GE(logfd, 0);
    srv_t s;
    ka_start(&s, KA_KEEP, logfd);
    ASSERT_TRUE(s.ok);
    httpc_pool_t *pool = httpc_pool_new(4);
    ASSERT_TRUE(pool != NULL);
    ASSERT_EQ(ka_get(&s, pool, "a", "GET", b, sizeof b), 0);
    ASSERT_STREQ(b, "1:1");
    ASSERT_EQ(ka_get(&s, pool, "a", "POST", b, sizeof b), 0);
    ASSERT_STREQ(b, "1:2"); /* the same connection, its second request */
    ASSERT_EQ(ka_get(&s, pool, "a", "GET", b, sizeof b), 0);
    ASSERT_STREQ(b, "1:3");
    /* another key never shares a connection */
    ASSERT_EQ(ka_get(&s, pool, "b", "GET", b, sizeof b), 0);
    ASSERT_STREQ(b, "2:1");
    uint64_t opened, reused;
    httpc_pool_stats(pool, &opened, &reused);
    ASSERT_EQ_U(opened, 2);
    ASSERT_EQ_U(reused, 2);
    /* control: without a pool every request is a connection of its own */
    ASSERT_EQ(ka_get(&s, NULL, NULL, "GET", b, sizeof b), 0);
    ASSERT_STREQ(b, "3:1");
    httpc_pool_free(pool);
    srv_stop(&s); /* its connection children end with their sockets */
    close(logfd);
}

TEST(keep_alive_honours_close)
{
    char path[128], b[64];
    int logfd = ka_logfd(path, sizeof path);
    srv_t s;
    ka_start(&s, KA_SAY_CLOSE, logfd);
    ASSERT_TRUE(s.ok);
    httpc_pool_t *pool = httpc_pool_new(4);
    ASSERT_EQ(ka_get(&s, pool, "a", "GET", b, sizeof b), 0);
    ASSERT_STREQ(b, "1:1");
    ASSERT_EQ(ka_get(&s, pool, "a", "POST", b, sizeof b), 0);
    ASSERT_STREQ(b, "2:1"); /* "Connection: close": not kept */
    httpc_pool_free(pool);
    srv_stop(&s);

    /* a server that closes an idle connection without saying so: seen before sending */
    ka_start(&s, KA_QUIET_CLOSE, logfd);
    ASSERT_TRUE(s.ok);
    pool = httpc_pool_new(4);
    ASSERT_EQ(ka_get(&s, pool, "a", "GET", b, sizeof b), 0);
    ASSERT_STREQ(b, "1:1");
    struct timespec ts = { .tv_nsec = 50 * 1000 * 1000 };
    (void)nanosleep(&ts, NULL); /* its end reaches us */
    ASSERT_EQ(ka_get(&s, pool, "a", "POST", b, sizeof b), 0);
    ASSERT_STREQ(b, "2:1");
    uint64_t opened, reused;
    httpc_pool_stats(pool, &opened, &reused);
    ASSERT_EQ_U(reused, 0);
    httpc_pool_free(pool);
    srv_stop(&s);
    close(logfd);
}

/* A reused connection that ends after the request went out: a GET is sent again on a new
 * connection; a POST is not (it may have run), and the server saw it exactly once. */
TEST(keep_alive_resends_only_what_cannot_run_twice)
{
    char path[128], b[64], log[512];
    int logfd = ka_logfd(path, sizeof path);
    srv_t s;
    ka_start(&s, KA_DROP_SECOND, logfd);
    ASSERT_TRUE(s.ok);
    httpc_pool_t *pool = httpc_pool_new(4);
    ASSERT_EQ(ka_get(&s, pool, "a", "GET", b, sizeof b), 0);
    ASSERT_STREQ(b, "1:1");
    ASSERT_EQ(ka_get(&s, pool, "a", "GET", b, sizeof b), 0);
    ASSERT_STREQ(b, "2:1"); /* 1:2 was dropped; sent again on connection 2 */
    ASSERT_EQ(ka_get(&s, pool, "a", "POST", b, sizeof b), -EPROTO);
    ASSERT_EQ(ka_get(&s, pool, "a", "GET", b, sizeof b), 0);
    ASSERT_STREQ(b, "3:1");
    ASSERT_EQ(ka_log(path, log, sizeof log), 0);
    ASSERT_STREQ(log, "1:1:GET\n1:2:GET\n2:1:GET\n2:2:POST\n3:1:GET\n");
    httpc_pool_free(pool);
    srv_stop(&s);
    close(logfd);
}

TEST(keep_alive_needs_a_key)
{
    httpc_pool_t *pool = httpc_pool_new(1);
    httpc_request_t rq;
    httpc_response_t r;
    httpc_request_init(&rq);
    rq.method = "GET";
    rq.target = "/";
    rq.host = "127.0.0.1";
    rq.port = 1;
    rq.pool = pool;
    ASSERT_EQ(httpc_do(&rq, &r), -EINVAL);
    char longkey[HTTPC_POOL_KEY_MAX + 1];
    memset(longkey, 'k', sizeof longkey - 1);
    longkey[sizeof longkey - 1] = '\0';
    rq.pool_key = longkey;
    ASSERT_EQ(httpc_do(&rq, &r), -EINVAL);
    ASSERT_TRUE(httpc_pool_new(0) == NULL);
    httpc_pool_free(pool);
}

int main(void)
{
    const tap_test_t tests[] = {
        T(content_length_body),
        T(chunked_body_with_extensions_and_trailer),
        T(body_until_close),
        T(interim_100_continue_then_final),
        T(no_content_204_and_head),
        T(head_over_the_cap),
        T(body_over_body_max),
        T(malformed_responses),
        T(server_that_never_answers_times_out),
        T(connection_refused),
        T(unix_socket_missing_or_stale),
        T(request_bytes_ipv4_post),
        T(request_bytes_ipv6_get_and_delete),
        T(request_bytes_unix_put_empty),
        T(large_request_body),
        T(body_fd_streams_into_a_pipe),
        T(header_lookup),
        T(invalid_requests_are_refused),
        T(keep_alive_reuses_one_connection),
        T(keep_alive_honours_close),
        T(keep_alive_resends_only_what_cannot_run_twice),
        T(keep_alive_needs_a_key),
    };
    (void)snprintf(tmpdir, sizeof tmpdir, "/tmp/sbx-test-httpc-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        printf("Bail out! mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    int r = tap_run(tests, ELEMENTSOF(tests));
    (void)rmdir(tmpdir);
    return r;
}
