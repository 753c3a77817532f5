/* SPDX-License-Identifier: MIT */
/* The strict HTTP/1.1 request-head parser (src/http/http.c): what it accepts, what it
 * refuses and with which status. Every refusal sits beside a positive control that differs
 * from it by the one rule under test. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "http/http.h"
#include "http/status.h"
#include "tap.h"

static http_request_t req;

static int parse(const char *s) { return http_parse_request(s, strlen(s), &req); }

/* A request that is fine, with one header line inserted (or nothing if hdr is NULL). */
static int parse_with_header(const char *hdr)
{
    char buf[4096];
    int n = snprintf(buf, sizeof buf, "POST /v1/exec HTTP/1.1\r\nHost: x\r\n%s%s\r\n",
                     hdr ? hdr : "", hdr ? "\r\n" : "");
    if (n < 0 || (size_t)n >= sizeof buf)
        abort();
    return http_parse_request(buf, (size_t)n, &req);
}

/* Like parse_with_header, but the header line may hold NUL or any other byte. */
static int parse_with_header_bytes(const char *hdr, size_t hlen)
{
    static const char pre[] = "GET / HTTP/1.1\r\n";
    char buf[4096];
    size_t n = 0;
    memcpy(buf, pre, sizeof pre - 1);
    n += sizeof pre - 1;
    memcpy(buf + n, hdr, hlen);
    n += hlen;
    memcpy(buf + n, "\r\n\r\n", 4);
    n += 4;
    return http_parse_request(buf, n, &req);
}

TEST(simple_get)
{
    const char *s = "GET /v1/exec?x=1&y=%20 HTTP/1.1\r\nHost: a\r\nX-Sandbox-Token: t0k\r\n\r\n";
    ASSERT_EQ(parse(s), strlen(s));
    ASSERT_EQ_U(req.head_len, strlen(s));
    ASSERT_SV_EQ(req.method, "GET");
    ASSERT_SV_EQ(req.target, "/v1/exec?x=1&y=%20");
    ASSERT_SV_EQ(req.path, "/v1/exec");
    ASSERT_SV_EQ(req.query, "x=1&y=%20");
    ASSERT_EQ(req.minor, 1);
    ASSERT_EQ_U(req.n_headers, 2);
    ASSERT_SV_EQ(req.headers[0].name, "Host");
    ASSERT_SV_EQ(req.headers[0].value, "a");
    ASSERT_SV_EQ(req.headers[1].name, "X-Sandbox-Token");
    ASSERT_SV_EQ(req.headers[1].value, "t0k");
    ASSERT_TRUE(req.keep_alive);
    ASSERT_FALSE(req.has_content_length);
    ASSERT_FALSE(req.has_transfer_encoding);
    ASSERT_FALSE(req.upgrade);
}

TEST(no_query_and_no_headers)
{
    ASSERT_EQ(parse("GET / HTTP/1.1\r\n\r\n"), 18);
    ASSERT_SV_EQ(req.path, "/");
    ASSERT_EQ_U(req.query.len, 0);
    ASSERT_EQ_U(req.n_headers, 0);
    /* empty query after '?' */
    ASSERT_EQ(parse("GET /a? HTTP/1.1\r\n\r\n"), 20);
    ASSERT_SV_EQ(req.path, "/a");
    ASSERT_EQ_U(req.query.len, 0);
}

TEST(post_with_body_returns_head_length)
{
    const char *head = "POST /v1/exec HTTP/1.1\r\nContent-Length: 5\r\n\r\n";
    char buf[256];
    int n = snprintf(buf, sizeof buf, "%shello", head);
    ASSERT_EQ(http_parse_request(buf, (size_t)n, &req), strlen(head));
    ASSERT_TRUE(req.has_content_length);
    ASSERT_EQ_U(req.content_length, 5);
    ASSERT_SV_EQ(req.method, "POST");
}

TEST(header_value_whitespace_is_trimmed)
{
    ASSERT_GT(parse_with_header("X-A: \t v a l \t "), 0);
    ASSERT_SV_EQ(req.headers[1].name, "X-A");
    ASSERT_SV_EQ(req.headers[1].value, "v a l");
    ASSERT_GT(parse_with_header("X-Empty:"), 0);
    ASSERT_SV_EQ(req.headers[1].value, "");
    ASSERT_GT(parse_with_header("X-Spaces:    "), 0);
    ASSERT_SV_EQ(req.headers[1].value, "");
    /* every tchar is allowed in a name */
    ASSERT_GT(parse_with_header("!#$%&'*+-.^_`|~09azAZ: 1"), 0);
    ASSERT_SV_EQ(req.headers[1].name, "!#$%&'*+-.^_`|~09azAZ");
}

TEST(header_lookup_is_case_insensitive)
{
    sv_t v;
    ASSERT_GT(parse("GET / HTTP/1.1\r\nX-Sandbox-Token: abc\r\nx-sandbox-token: def\r\n\r\n"), 0);
    ASSERT_TRUE(http_header_get(&req, "x-SANDBOX-token", &v));
    ASSERT_SV_EQ(v, "abc"); /* the first match */
    ASSERT_FALSE(http_header_get(&req, "x-sandbox-toke", &v));
    ASSERT_FALSE(http_header_get(&req, "x-sandbox-tokenn", &v));
}

TEST(connection_semantics)
{
    ASSERT_GT(parse("GET / HTTP/1.0\r\n\r\n"), 0);
    ASSERT_EQ(req.minor, 0);
    ASSERT_FALSE(req.keep_alive);
    ASSERT_GT(parse("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n"), 0);
    ASSERT_TRUE(req.keep_alive);
    ASSERT_GT(parse("GET / HTTP/1.1\r\nConnection: close\r\n\r\n"), 0);
    ASSERT_FALSE(req.keep_alive);
    ASSERT_GT(parse("GET / HTTP/1.1\r\nConnection: keep-alive, Upgrade\r\n\r\n"), 0);
    ASSERT_TRUE(req.keep_alive);
    ASSERT_TRUE(req.upgrade);
    ASSERT_GT(parse("GET / HTTP/1.1\r\nConnection: closed\r\n\r\n"), 0);
    ASSERT_TRUE(req.keep_alive); /* "closed" is not the token "close" */
    ASSERT_FALSE(req.upgrade);
}

TEST(duplicate_headers)
{
    ASSERT_GT(parse_with_header("Content-Length: 7\r\ncontent-length: 7"), 0);
    ASSERT_EQ_U(req.content_length, 7);
    ASSERT_EQ(parse_with_header("Content-Length: 7\r\nContent-Length: 8"), -EBADMSG);
    ASSERT_GT(parse_with_header("Content-Length: 7\r\nContent-Length: 07"), 0); /* same number */
    ASSERT_EQ_U(req.content_length, 7);
}

TEST(conflicting_host_refused)
{
    ASSERT_GT(parse_with_header("Host: x"), 0); /* same value twice */
    ASSERT_EQ(parse_with_header("Host: y"), -EBADMSG);
}

TEST(bare_lf_and_bare_cr_refused)
{
    ASSERT_GT(parse("GET / HTTP/1.1\r\nA: b\r\n\r\n"), 0);
    ASSERT_EQ(parse("GET / HTTP/1.1\nA: b\r\n\r\n"), -EBADMSG);
    ASSERT_EQ(parse("GET / HTTP/1.1\r\nA: b\n\r\n"), -EBADMSG);
    ASSERT_EQ(parse("GET / HTTP/1.1\r\nA: b\r\n\n"), -EBADMSG);
    ASSERT_EQ(parse("GET / HTTP/1.1\r\nA: b\rX\r\n\r\n"), -EBADMSG);
    ASSERT_EQ(parse("GET / HTTP/1.1\r\r\n\r\n"), -EBADMSG);
    ASSERT_EQ(parse("\n"), -EBADMSG);
}

TEST(space_before_colon_refused)
{
    ASSERT_GT(parse_with_header("X-A: 1"), 0);
    ASSERT_EQ(parse_with_header("X-A : 1"), -EBADMSG);
    ASSERT_EQ(parse_with_header("X-A\t: 1"), -EBADMSG);
    ASSERT_EQ(parse_with_header("Content-Length : 1"), -EBADMSG);
}

TEST(obs_fold_refused)
{
    ASSERT_GT(parse_with_header("X-A: 1\r\nX-B: 2"), 0);
    ASSERT_EQ(parse_with_header("X-A: 1\r\n 2"), -EBADMSG);
    ASSERT_EQ(parse_with_header("X-A: 1\r\n\t2"), -EBADMSG);
    ASSERT_EQ(parse("GET / HTTP/1.1\r\n X-A: 1\r\n\r\n"), -EBADMSG);
}

TEST(non_token_header_name_refused)
{
    ASSERT_GT(parse_with_header("X-Ok: 1"), 0);
    ASSERT_EQ(parse_with_header(": 1"), -EBADMSG);       /* empty name */
    ASSERT_EQ(parse_with_header("X@A: 1"), -EBADMSG);    /* '@' is a separator */
    ASSERT_EQ(parse_with_header("X A: 1"), -EBADMSG);    /* space inside */
    ASSERT_EQ(parse_with_header("X(A): 1"), -EBADMSG);   /* parentheses */
    ASSERT_EQ(parse_with_header("X\"A\": 1"), -EBADMSG); /* quotes */
    ASSERT_EQ(parse_with_header("NoColon"), -EBADMSG);
    ASSERT_EQ(parse_with_header_bytes("X\xc3\xa9: 1", 6), -EBADMSG); /* non-ASCII name */
    ASSERT_EQ(parse_with_header_bytes("X\0A: 1", 6), -EBADMSG);      /* NUL in name */
}

TEST(bad_header_value_bytes_refused)
{
    ASSERT_GT(parse_with_header_bytes("X-A: caf~", 9), 0);
    ASSERT_EQ(parse_with_header_bytes("X-A: caf\xc3\xa9", 10), -EBADMSG); /* UTF-8 */
    ASSERT_EQ(parse_with_header_bytes("X-A: \x80", 6), -EBADMSG);
    ASSERT_EQ(parse_with_header_bytes("X-A: \xff", 6), -EBADMSG);
    ASSERT_EQ(parse_with_header_bytes("X-A: a\x01", 7), -EBADMSG); /* control */
    ASSERT_EQ(parse_with_header_bytes("X-A: a\x7f", 7), -EBADMSG); /* DEL */
    ASSERT_EQ(parse_with_header_bytes("X-A: a\0b", 8), -EBADMSG);  /* NUL */
    /* tab inside a value is fine */
    ASSERT_GT(parse_with_header_bytes("X-A: a\tb", 8), 0);
    ASSERT_SV_EQ(req.headers[0].value, "a\tb");
}

TEST(content_length_values)
{
    ASSERT_GT(parse_with_header("Content-Length: 0"), 0);
    ASSERT_TRUE(req.has_content_length);
    ASSERT_EQ_U(req.content_length, 0);
    ASSERT_GT(parse_with_header("Content-Length: 9007199254740992"), 0); /* 2^53, the cap */
    ASSERT_EQ_U(req.content_length, UINT64_C(9007199254740992));
    ASSERT_GT(parse_with_header("Content-Length: 0012"), 0);
    ASSERT_EQ_U(req.content_length, 12);
    ASSERT_EQ(parse_with_header("Content-Length: 9007199254740993"), -EBADMSG); /* 2^53 + 1 */
    ASSERT_EQ(parse_with_header("Content-Length: 18446744073709551616"), -EBADMSG);
    ASSERT_EQ(parse_with_header("Content-Length: 99999999999999999999999999"), -EBADMSG);
    ASSERT_EQ(parse_with_header("Content-Length: "), -EBADMSG);
    ASSERT_EQ(parse_with_header("Content-Length:"), -EBADMSG);
    ASSERT_EQ(parse_with_header("Content-Length: +5"), -EBADMSG);
    ASSERT_EQ(parse_with_header("Content-Length: -5"), -EBADMSG);
    ASSERT_EQ(parse_with_header("Content-Length: 5a"), -EBADMSG);
    ASSERT_EQ(parse_with_header("Content-Length: 0x10"), -EBADMSG);
    ASSERT_EQ(parse_with_header("Content-Length: 1 2"), -EBADMSG);
    ASSERT_EQ(parse_with_header("Content-Length: 1,1"), -EBADMSG);
    ASSERT_EQ(parse_with_header("Content-Length: 1.0"), -EBADMSG);
}

TEST(content_length_with_transfer_encoding_refused)
{
    ASSERT_GT(parse_with_header("Transfer-Encoding: chunked"), 0);
    ASSERT_TRUE(req.has_transfer_encoding);
    ASSERT_FALSE(req.has_content_length);
    ASSERT_EQ(parse_with_header("Content-Length: 5\r\nTransfer-Encoding: chunked"), -EBADMSG);
    ASSERT_EQ(parse_with_header("transfer-encoding: chunked\r\ncontent-length: 5"), -EBADMSG);
}

TEST(request_line_refusals)
{
    ASSERT_GT(parse("GET / HTTP/1.1\r\n\r\n"), 0);
    ASSERT_EQ(parse("GET  / HTTP/1.1\r\n\r\n"), -EBADMSG); /* double space before target */
    ASSERT_EQ(parse("GET /  HTTP/1.1\r\n\r\n"), -EBADMSG); /* double space before version */
    ASSERT_EQ(parse("GET / HTTP/1.1 \r\n\r\n"), -EBADMSG); /* trailing space */
    ASSERT_EQ(parse(" GET / HTTP/1.1\r\n\r\n"), -EBADMSG); /* leading space */
    ASSERT_EQ(parse("GET\t/ HTTP/1.1\r\n\r\n"), -EBADMSG); /* tab separator */
    ASSERT_EQ(parse("GET /\r\n\r\n"), -EBADMSG);           /* HTTP/0.9 style */
    ASSERT_EQ(parse("GET / http/1.1\r\n\r\n"), -EBADMSG);  /* version is case-sensitive */
    ASSERT_EQ(parse("GET / HTTP/1.10\r\n\r\n"), -EBADMSG);
    ASSERT_EQ(parse("GET / HTTP/1\r\n\r\n"), -EBADMSG);
    ASSERT_EQ(parse("GET / HTTP/1.x\r\n\r\n"), -EBADMSG);
    ASSERT_EQ(parse("GET * HTTP/1.1\r\n\r\n"), -EBADMSG);         /* asterisk-form */
    ASSERT_EQ(parse("GET http://a/ HTTP/1.1\r\n\r\n"), -EBADMSG); /* absolute-form */
    ASSERT_EQ(parse("G(T / HTTP/1.1\r\n\r\n"), -EBADMSG);         /* non-token method */
    ASSERT_EQ(parse_with_header_bytes("", 0), 18); /* positive control for the helper */
    ASSERT_EQ(http_parse_request("GET /\x7f HTTP/1.1\r\n\r\n", 19, &req), -EBADMSG);
    ASSERT_EQ(http_parse_request("GET /\xc3\xa9 HTTP/1.1\r\n\r\n", 20, &req), -EBADMSG);
    ASSERT_EQ(parse("\r\n\r\n"), -EBADMSG); /* empty request line */
}

TEST(http_version_not_supported)
{
    ASSERT_GT(parse("GET / HTTP/1.0\r\n\r\n"), 0);
    ASSERT_GT(parse("GET / HTTP/1.9\r\n\r\n"), 0);
    ASSERT_EQ(parse("GET / HTTP/2.0\r\n\r\n"), -EPROTONOSUPPORT);
    ASSERT_EQ(parse("GET / HTTP/0.9\r\n\r\n"), -EPROTONOSUPPORT);
    ASSERT_EQ(parse("GET / HTTP/3.0\r\n\r\n"), -EPROTONOSUPPORT);
}

static int parse_n_headers(size_t n)
{
    size_t cap = 64 + n * 16;
    char *buf = malloc(cap);
    if (!buf)
        abort();
    size_t len = (size_t)snprintf(buf, cap, "GET / HTTP/1.1\r\n");
    for (size_t i = 0; i < n; i++)
        len += (size_t)snprintf(buf + len, cap - len, "X-H%zu: %zu\r\n", i, i);
    len += (size_t)snprintf(buf + len, cap - len, "\r\n");
    int r = http_parse_request(buf, len, &req);
    free(buf);
    return r;
}

TEST(too_many_headers)
{
    ASSERT_GT(parse_n_headers(HTTP_MAX_HEADERS), 0);
    ASSERT_EQ_U(req.n_headers, HTTP_MAX_HEADERS);
    ASSERT_EQ(parse_n_headers(HTTP_MAX_HEADERS + 1), -EMSGSIZE);
    ASSERT_EQ(parse_n_headers(1000), -EMSGSIZE);
}

/* A complete head of exactly `total` bytes: one big header pads it out. */
static char *make_head(size_t total, size_t *ret_len)
{
    static const char pre[] = "GET / HTTP/1.1\r\nX-Pad: ";
    char *buf = malloc(total + 1);
    if (!buf || total < sizeof pre + 4)
        abort();
    memcpy(buf, pre, sizeof pre - 1);
    memset(buf + sizeof pre - 1, 'a', total - (sizeof pre - 1) - 4);
    memcpy(buf + total - 4, "\r\n\r\n", 4);
    *ret_len = total;
    return buf;
}

TEST(head_size_cap)
{
    size_t len;
    char *buf = make_head(HTTP_MAX_HEAD, &len);
    int r = http_parse_request(buf, len, &req);
    free(buf);
    ASSERT_EQ(r, HTTP_MAX_HEAD); /* exactly 64 KiB is allowed */

    buf = make_head(HTTP_MAX_HEAD + 1, &len);
    r = http_parse_request(buf, len, &req);
    free(buf);
    ASSERT_EQ(r, -EMSGSIZE);

    /* an unterminated head: "need more" below the cap, 431 once the cap is reached */
    buf = make_head(HTTP_MAX_HEAD + 100, &len);
    ASSERT_EQ(http_parse_request(buf, HTTP_MAX_HEAD - 1, &req), 0);
    r = http_parse_request(buf, HTTP_MAX_HEAD, &req);
    int r2 = http_parse_request(buf, HTTP_MAX_HEAD + 50, &req);
    free(buf);
    ASSERT_EQ(r, -EMSGSIZE);
    ASSERT_EQ(r2, -EMSGSIZE);

    /* a request line alone longer than the cap */
    buf = malloc(HTTP_MAX_HEAD + 10);
    ASSERT_TRUE(buf != NULL);
    memcpy(buf, "GET /", 5);
    memset(buf + 5, 'a', HTTP_MAX_HEAD + 5);
    r = http_parse_request(buf, HTTP_MAX_HEAD + 10, &req);
    free(buf);
    ASSERT_EQ(r, -EMSGSIZE);
}

TEST(incomplete_heads_need_more)
{
    const char *s = "POST /v1/exec?a=b HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\n";
    size_t n = strlen(s);
    for (size_t k = 0; k < n; k++) {
        int r = http_parse_request(s, k, &req);
        if (r != 0)
            printf("# prefix length %zu\n", k);
        ASSERT_EQ(r, 0);
    }
    ASSERT_EQ(http_parse_request(s, n, &req), n);
    ASSERT_EQ(parse("GET / HTTP/1.1\r\n\r"), 0);
    ASSERT_EQ(parse("GET / HTTP/1.1\r"), 0);
    ASSERT_EQ(parse(""), 0);
}

TEST(pipelined_requests)
{
    const char *s = "POST /a HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"
                    "GET /b?q HTTP/1.1\r\nConnection: close\r\n\r\n"
                    "GET /c HTTP/1.1\r\n";
    size_t n = strlen(s);
    int r = http_parse_request(s, n, &req);
    ASSERT_EQ(r, 39);
    ASSERT_SV_EQ(req.path, "/a");
    ASSERT_EQ_U(req.content_length, 3);
    size_t off = (size_t)r + 3; /* skip the body */
    r = http_parse_request(s + off, n - off, &req);
    ASSERT_EQ(r, 40);
    ASSERT_SV_EQ(req.path, "/b");
    ASSERT_SV_EQ(req.query, "q");
    ASSERT_FALSE(req.keep_alive);
    ASSERT_FALSE(req.has_content_length); /* nothing left over from the first request */
    off += (size_t)r;
    ASSERT_EQ(http_parse_request(s + off, n - off, &req), 0);
}

TEST(reasons)
{
    ASSERT_STREQ(http_reason(200), "OK");
    ASSERT_STREQ(http_reason(400), "Bad Request");
    ASSERT_STREQ(http_reason(431), "Request Header Fields Too Large");
    ASSERT_STREQ(http_reason(505), "HTTP Version Not Supported");
    ASSERT_STREQ(http_reason(410), "Gone"); /* was "Unknown" before the table in http/status.c */
    ASSERT_STREQ(http_reason(299), "Unknown");
}

/* A chunked request body: scanned as it arrives (http_scan_chunks), then decoded in place. */
static ssize_t scan_then_decode(const char *wire, char *out, size_t cap, size_t *ret_used)
{
    size_t n = strlen(wire);
    if (n > cap)
        return -1;
    memcpy(out, wire, n);
    http_chunks_t k = { 0 };
    bool done = false;
    size_t used = 0;
    for (size_t i = 0; i < n && !done; i++) { /* one byte at a time: the scanner keeps state */
        ssize_t t = http_scan_chunks(&k, out + i, 1, &done);
        if (t < 0)
            return -2;
        used += (size_t)t;
    }
    if (!done)
        return -3;
    *ret_used = used;
    return http_chunked_decode(out, used);
}

TEST(chunked_bodies_decode)
{
    char buf[256];
    size_t used;
    ASSERT_EQ(
        scan_then_decode("5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\n\r\n", buf, sizeof buf, &used),
        12);
    ASSERT_MEMEQ(buf, 12, "hello, world", 12);
    /* trailers are no payload; bytes after the body are not the body's */
    const char *w = "A\r\n0123456789\r\n0\r\nX-Trailer: 1\r\n\r\nGET / HTTP/1.1";
    http_chunks_t k = { 0 };
    bool done = false;
    memcpy(buf, w, strlen(w));
    ssize_t t = http_scan_chunks(&k, buf, strlen(w), &done);
    ASSERT_TRUE(done);
    ASSERT_EQ(t, (ssize_t)(strlen(w) - strlen("GET / HTTP/1.1")));
    ASSERT_EQ(http_chunked_decode(buf, (size_t)t), 10);
    ASSERT_MEMEQ(buf, 10, "0123456789", 10);
    /* an empty body */
    ASSERT_EQ(scan_then_decode("0\r\n\r\n", buf, sizeof buf, &used), 0);
    /* malformed: no size, a size longer than the data, a missing CRLF after the data */
    ASSERT_EQ(scan_then_decode("\r\n\r\n", buf, sizeof buf, &used), -2);
    char bad[] = "5\r\nhel\r\n0\r\n\r\n";
    ASSERT_EQ(http_chunked_decode(bad, strlen(bad)), -EBADMSG);
    char nocrlf[] = "3\r\nabcX\r\n0\r\n\r\n";
    ASSERT_EQ(http_chunked_decode(nocrlf, strlen(nocrlf)), -EBADMSG);
    char huge[] = "1000000000000000\r\nx\r\n0\r\n\r\n";
    ASSERT_EQ(http_chunked_decode(huge, strlen(huge)), -EBADMSG);
}

/* Trailer lines are fields and nothing else: a line a client ends the body at must not be taken
 * for one (the rest would pass as that client's next response), and they are bounded. */
TEST(chunked_trailers_are_fields_only)
{
    char buf[16384];
    size_t used;
    /* positive control: fields, one with an empty value and a tab */
    ASSERT_EQ(
        scan_then_decode("1\r\nx\r\n0\r\nA: 1\r\nB-c:\t2\r\nD:\r\n\r\n", buf, sizeof buf, &used),
        1);
    /* a bare LF line, the forged response behind it, or any line that is not a field */
    const char *bad[] = {
        "1\r\nx\r\n0\r\n\nHTTP/1.1 200 OK\r\nX-Forged: 1\r\nContent-Length: 0\r\n\r\n",
        "1\r\nx\r\n0\r\nHTTP/1.1 200 OK\r\n\r\n", /* a space in the name, no colon */
        "1\r\nx\r\n0\r\nA: 1\nB: 2\r\n\r\n",      /* a bare LF inside */
        "1\r\nx\r\n0\r\nA: 1\r\n folded\r\n\r\n", /* obs-fold */
        "1\r\nx\r\n0\r\n: 1\r\n\r\n",             /* no name */
        "1\r\nx\r\n0\r\nA: \x01\r\n\r\n",         /* a control character */
        "1\r\nx\r\n0\r\nA: 1\r\r\n\r\n",          /* CR not before LF */
        "1;a\nb\r\nx\r\n0\r\n\r\n",               /* a bare LF in an extension */
        "1;a\x00\r\nx\r\n0\r\n\r\n", /* NUL in an extension (cut by strlen: incomplete) */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ssize_t r = scan_then_decode(bad[i], buf, sizeof buf, &used);
        ASSERT_TRUE(r == -2 || (i == 8 && r == -3));
    }
    char ctl[] = "1;a\x01\r\nx\r\n0\r\n\r\n";
    ASSERT_EQ(scan_then_decode(ctl, buf, sizeof buf, &used), -2);
    /* 8 KiB of trailers at most */
    char big[12000];
    int n = snprintf(big, sizeof big, "0\r\nA: ");
    memset(big + n, 'v', 9000);
    memcpy(big + n + 9000, "\r\n\r\n", 5);
    ASSERT_EQ(scan_then_decode(big, buf, sizeof buf, &used), -2);
    n = snprintf(big, sizeof big, "0\r\nA: ");
    memset(big + n, 'v', 8000);
    memcpy(big + n + 8000, "\r\n\r\n", 5);
    ASSERT_EQ(scan_then_decode(big, buf, sizeof buf, &used), 0);
}

TAP_MAIN(T(chunked_bodies_decode), T(chunked_trailers_are_fields_only), T(simple_get),
         T(no_query_and_no_headers), T(post_with_body_returns_head_length),
         T(header_value_whitespace_is_trimmed), T(header_lookup_is_case_insensitive),
         T(connection_semantics), T(duplicate_headers), T(conflicting_host_refused),
         T(bare_lf_and_bare_cr_refused), T(space_before_colon_refused), T(obs_fold_refused),
         T(non_token_header_name_refused), T(bad_header_value_bytes_refused),
         T(content_length_values), T(content_length_with_transfer_encoding_refused),
         T(request_line_refusals), T(http_version_not_supported), T(too_many_headers),
         T(head_size_cap), T(incomplete_heads_need_more), T(pipelined_requests), T(reasons))
