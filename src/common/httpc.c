/* SPDX-License-Identifier: MIT */
/* The blocking HTTP/1.1 client (httpc.h). One request per connection; the socket stays
 * non-blocking and every wait is a poll() bounded by one deadline taken from CLOCK_MONOTONIC at
 * the start, so connect, send, the response head and the body together never exceed
 * timeout_ms. The response is parsed strictly: a malformed status line, header line, length or
 * chunk is -EPROTO, never a guess (the peer is another sbx daemon; anything odd is a bug or an
 * attack). Caps: the head (and the trailer section, and a chunk-size line) must fit in
 * HTTPC_HEAD_MAX bytes, an in-memory body in body_max bytes; both are -EFBIG.
 *
 * Streaming to body_fd uses write(): a pipe whose reader went away raises SIGPIPE unless the
 * process ignores it (a library cannot change that without global state, so a caller streaming
 * into a pipe ignores SIGPIPE); the socket itself always uses MSG_NOSIGNAL. */
#include "httpc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "buf.h"
#include "macro.h"
#include "strutil.h"

#define HTTPC_TIMEOUT_DEFAULT_MS 30000
#define HTTPC_INTERIM_MAX 16 /* 1xx responses skipped before the final one */
#define HTTPC_REQUEST_HEAD_MAX (1024 * 1024)
#define HTTPC_UNIX_RETRY_MS 5      /* a unix listener with a full backlog: try again this often */
#define HTTPC_JOIN_MAX (16 * 1024) /* over TLS, a body up to this joins the head in one record */

/* The connection: socket, deadline and the read buffer (HTTPC_HEAD_MAX bytes; unread bytes are
 * rbuf[off, off + len)). */
typedef struct {
    int fd;
    sockio_t *io; /* TLS over fd, or NULL */
    uint64_t deadline_ns;
    char *rbuf;
    size_t off;
    size_t len;
    size_t got; /* bytes received on this request */
} conn_t;

static void conn_done(conn_t *c)
{
    sockio_free(c->io);
    c->io = NULL;
    c->fd = safe_close(c->fd);
    free(c->rbuf);
    c->rbuf = NULL;
}

/* Where the response body goes: memory (fd < 0, capped by max) or an fd. */
typedef struct {
    int fd;
    size_t max;
    buf_t mem;
    size_t total;
    uint64_t deadline_ns;
} sink_t;

/* What the head says about the message. */
typedef struct {
    int status;
    bool chunked;
    bool has_length;
    uint64_t length;
    bool close; /* HTTP/1.0, or "Connection: close": the connection ends with this response */
} head_info_t;

void httpc_request_init(httpc_request_t *rq) { *rq = (httpc_request_t){ .body_fd = -1 }; }

void httpc_response_free(httpc_response_t *r)
{
    if (!r)
        return;
    free(r->head);
    free(r->body);
    *r = (httpc_response_t){ 0 };
}

/* ---- time and waiting ---- */

static uint64_t now_ns(void)
{
    struct timespec ts;
    (void)clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * UINT64_C(1000000000) + (uint64_t)ts.tv_nsec;
}

static uint64_t deadline_after_ms(uint64_t ms)
{
    uint64_t ns, d;
    if (__builtin_mul_overflow(ms, UINT64_C(1000000), &ns) ||
        __builtin_add_overflow(now_ns(), ns, &d))
        return UINT64_MAX;
    return d;
}

/* Milliseconds left until the deadline, rounded up and clamped for poll(); -ETIMEDOUT once it
 * has passed. */
static int ms_left(uint64_t deadline_ns)
{
    uint64_t now = now_ns();
    if (now >= deadline_ns)
        return -ETIMEDOUT;
    uint64_t ms = (deadline_ns - now + 999999) / 1000000;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

/* Wait until fd is ready for events (or reports an error or hangup, which the next call will
 * see) or the deadline passes. */
static int wait_fd(int fd, short events, uint64_t deadline_ns)
{
    for (;;) {
        int left = ms_left(deadline_ns);
        if (left < 0)
            return left;
        struct pollfd p = { .fd = fd, .events = events };
        int r = poll(&p, 1, left);
        if (r < 0 && errno != EINTR)
            return negative_errno();
        if (r > 0)
            return 0;
    }
}

/* ---- request validation and serialisation ---- */

static bool is_tchar(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

static bool is_token(sv_t s)
{
    if (s.len == 0)
        return false;
    for (size_t i = 0; i < s.len; i++)
        if (!is_tchar((unsigned char)s.p[i]))
            return false;
    return true;
}

/* A field value: visible ASCII, obs-text, SP and HTAB; no other control byte. */
static bool is_field_value(sv_t v)
{
    for (size_t i = 0; i < v.len; i++) {
        unsigned char c = (unsigned char)v.p[i];
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return false;
    }
    return true;
}

/* The caller's extra header lines: each "Name: value\r\n", no bare CR or LF, no empty line
 * (which would end the head early and smuggle the rest), and none of the headers the client
 * sets itself. */
static int validate_headers(const char *h)
{
    static const char *const own[] = { "host", "content-length", "connection",
                                       "transfer-encoding" };
    size_t n = strlen(h);
    while (n > 0) {
        const char *lf = memchr(h, '\n', n);
        if (!lf || lf == h || lf[-1] != '\r')
            return -EINVAL;
        sv_t line = sv_make(h, (size_t)(lf - h) - 1);
        const char *colon = memchr(line.p, ':', line.len);
        if (!colon)
            return -EINVAL;
        sv_t name = sv_make(line.p, (size_t)(colon - line.p));
        sv_t value = sv_make(colon + 1, line.len - name.len - 1);
        if (!is_token(name) || !is_field_value(value))
            return -EINVAL;
        for (size_t i = 0; i < ELEMENTSOF(own); i++)
            if (sv_eq_lit_nocase(name, own[i]))
                return -EINVAL;
        n -= (size_t)(lf - h) + 1;
        h = lf + 1;
    }
    return 0;
}

static int validate_request(const httpc_request_t *rq)
{
    if (!!rq->unix_path == !!rq->host)
        return -EINVAL; /* exactly one destination */
    if (rq->unix_path && (rq->unix_path[0] == '\0' ||
                          strlen(rq->unix_path) >= sizeof(((struct sockaddr_un *)0)->sun_path)))
        return -EINVAL;
    if (rq->host && rq->port == 0)
        return -EINVAL;
    if (!rq->method || !is_token(sv_make(rq->method, strlen(rq->method))))
        return -EINVAL;
    if (!rq->target || rq->target[0] != '/')
        return -EINVAL;
    for (const char *p = rq->target; *p; p++)
        if ((unsigned char)*p <= ' ' || *p == 0x7f)
            return -EINVAL;
    if (rq->headers && validate_headers(rq->headers) < 0)
        return -EINVAL;
    if (rq->body_len > 0 && !rq->body)
        return -EINVAL;
    if (rq->pool && (!rq->pool_key || strlen(rq->pool_key) >= HTTPC_POOL_KEY_MAX))
        return -EINVAL;
    return 0;
}

static bool method_has_body(const char *m)
{
    return streq(m, "POST") || streq(m, "PUT") || streq(m, "PATCH");
}

static int build_request_head(const httpc_request_t *rq, buf_t *b)
{
    int r;
    buf_init(b, HTTPC_REQUEST_HEAD_MAX);
    r = buf_printf(b, "%s %s HTTP/1.1\r\n", rq->method, rq->target);
    if (r >= 0 && rq->unix_path)
        r = buf_printf(b, "Host: localhost\r\n");
    else if (r >= 0 && strchr(rq->host, ':')) /* IPv6, without a zone (local to us) */
        r = buf_printf(b, "Host: [%.*s]:%u\r\n", (int)strcspn(rq->host, "%"), rq->host,
                       (unsigned)rq->port);
    else if (r >= 0)
        r = buf_printf(b, "Host: %s:%u\r\n", rq->host, (unsigned)rq->port);
    if (r >= 0)
        r = buf_printf(b, rq->pool ? "Connection: keep-alive\r\n" : "Connection: close\r\n");
    if (r >= 0 && (rq->body_len > 0 || method_has_body(rq->method)))
        r = buf_printf(b, "Content-Length: %zu\r\n", rq->body_len);
    if (r >= 0 && rq->headers)
        r = buf_append(b, rq->headers, strlen(rq->headers));
    if (r >= 0)
        r = buf_append(b, "\r\n", 2);
    if (r < 0) {
        buf_free(b);
        return r == -ENOBUFS ? -EINVAL : r;
    }
    return 0;
}

/* ---- connecting ---- */

static int connect_addr(const struct sockaddr *sa, socklen_t salen, uint64_t deadline_ns,
                        int *ret_fd)
{
    _cleanup_close_ int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return negative_errno();
    for (;;) {
        if (connect(fd, sa, salen) == 0)
            break;
        if (errno == EAGAIN && sa->sa_family == AF_UNIX) {
            /* A unix listener with a full backlog refuses a non-blocking connect instead of
             * queueing it: wait a little and try again, within the deadline. */
            int left = ms_left(deadline_ns);
            if (left < 0)
                return left;
            (void)poll(NULL, 0, MIN(left, HTTPC_UNIX_RETRY_MS));
            continue;
        }
        if (errno != EINPROGRESS && errno != EINTR)
            return negative_errno();
        int r = wait_fd(fd, POLLOUT, deadline_ns);
        if (r < 0)
            return r;
        int err = 0;
        socklen_t len = sizeof err;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
            return negative_errno();
        if (err != 0)
            return -err;
        break;
    }
    if (sa->sa_family != AF_UNIX) {
        /* Without it a request sent as two writes (a TLS record for the head, one for the
         * body) waits for the ACK of the first: up to 40 ms of delayed ACK per call. */
        int one = 1;
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    *ret_fd = TAKE_FD(fd);
    return 0;
}

static int connect_unix(const char *path, uint64_t deadline_ns, int *ret_fd)
{
    struct sockaddr_un sun = { .sun_family = AF_UNIX };
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof sun.sun_path)
        return -EINVAL;
    memcpy(sun.sun_path, path, n + 1);
    return connect_addr((const struct sockaddr *)&sun,
                        (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1), deadline_ns,
                        ret_fd);
}

/* A numeric IPv4 or IPv6 literal, the latter with an optional "%zone" (interface name or
 * index). inet_pton rather than getaddrinfo(AI_NUMERICHOST): the same addresses (but no
 * "127.1" shorthands), and no getaddrinfo reference, which makes glibc warn when the static
 * sbx-server links this file. */
static int parse_numeric_host(const char *host, uint16_t port, struct sockaddr_storage *ss,
                              socklen_t *ret_len)
{
    struct sockaddr_in *in = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
    char addr[INET6_ADDRSTRLEN];
    *ss = (struct sockaddr_storage){ 0 };
    if (inet_pton(AF_INET, host, &in->sin_addr) == 1) {
        in->sin_family = AF_INET;
        in->sin_port = htons(port);
        *ret_len = sizeof *in;
        return 0;
    }
    const char *zone = strchr(host, '%');
    size_t n = zone ? (size_t)(zone - host) : strlen(host);
    if (n >= sizeof addr)
        return -EINVAL;
    memcpy(addr, host, n);
    addr[n] = '\0';
    if (inet_pton(AF_INET6, addr, &in6->sin6_addr) != 1)
        return -EINVAL;
    if (zone) {
        uint64_t idx;
        if (parse_u64_str(zone + 1, UINT32_MAX, &idx) < 0)
            idx = if_nametoindex(zone + 1);
        if (idx == 0)
            return -EINVAL;
        in6->sin6_scope_id = (uint32_t)idx;
    }
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(port);
    *ret_len = sizeof *in6;
    return 0;
}

static int conn_open(const httpc_request_t *rq, uint64_t deadline_ns, int *ret_fd)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    if (rq->unix_path)
        return connect_unix(rq->unix_path, deadline_ns, ret_fd);
    int r = parse_numeric_host(rq->host, rq->port, &ss, &sl);
    if (r < 0)
        return r;
    return connect_addr((const struct sockaddr *)&ss, sl, deadline_ns, ret_fd);
}

/* ---- socket I/O ---- */

/* Wait until the layer (or the socket) can make progress on what it said it waits for. */
static int wait_io(conn_t *c)
{
    return wait_fd(c->fd, c->io && c->io->want_write ? POLLOUT : POLLIN, c->deadline_ns);
}

static int send_all(conn_t *c, struct iovec *iov, size_t n)
{
    for (; c->io && n > 0; iov++, n--) /* a layer: piece by piece, records as they fill */
        for (size_t off = 0; off < iov->iov_len;) {
            ssize_t k = sock_send(c->fd, c->io, (char *)iov->iov_base + off, iov->iov_len - off);
            int r = k == -EAGAIN ? wait_io(c) : k < 0 ? (int)k : 0;
            if (r < 0)
                return r;
            off += k > 0 ? (size_t)k : 0;
        }
    while (n > 0) {
        if (iov->iov_len == 0) {
            iov++;
            n--;
            continue;
        }
        int r = wait_fd(c->fd, POLLOUT, c->deadline_ns);
        if (r < 0)
            return r;
        struct msghdr mh = { .msg_iov = iov, .msg_iovlen = n };
        ssize_t k = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return negative_errno();
        }
        for (size_t done = (size_t)k; done > 0;) {
            size_t step = MIN(done, iov->iov_len);
            iov->iov_base = (char *)iov->iov_base + step;
            iov->iov_len -= step;
            done -= step;
            if (iov->iov_len == 0) {
                iov++;
                n--;
            }
        }
    }
    return 0;
}

/* Read more into the buffer (moving unread bytes to the front when the tail is full). Returns
 * the number of bytes read, 0 at end of stream, -ENOBUFS when the buffer is full. */
static int conn_fill(conn_t *c)
{
    if (c->len == 0)
        c->off = 0;
    else if (c->off > 0 && c->off + c->len == HTTPC_HEAD_MAX) {
        memmove(c->rbuf, c->rbuf + c->off, c->len);
        c->off = 0;
    }
    size_t room = HTTPC_HEAD_MAX - c->off - c->len;
    if (room == 0)
        return -ENOBUFS;
    for (;;) {
        /* read first: a layer may hold bytes that poll() would not report */
        ssize_t k = sock_recv(c->fd, c->io, c->rbuf + c->off + c->len, room);
        if (k >= 0) {
            c->len += (size_t)k;
            c->got += (size_t)k;
            return (int)k;
        }
        int r = k == -EAGAIN ? wait_io(c) : (int)k;
        if (r < 0)
            return r;
    }
}

static void conn_consume(conn_t *c, size_t n)
{
    c->off += n;
    c->len -= n;
}

/* The next CRLF-terminated line (without the CRLF), consumed from the buffer; the view stays
 * valid until the next conn_fill(). A bare LF is -EPROTO, a line longer than the buffer
 * -EFBIG, the end of the stream before the line ends -EPROTO. */
static int conn_line(conn_t *c, sv_t *ret)
{
    size_t scanned = 0;
    for (;;) {
        const char *p = c->rbuf + c->off;
        const char *lf = memchr(p + scanned, '\n', c->len - scanned);
        if (lf) {
            if (lf == p || lf[-1] != '\r')
                return -EPROTO;
            size_t n = (size_t)(lf - p);
            *ret = sv_make(p, n - 1);
            conn_consume(c, n + 1);
            return 0;
        }
        scanned = c->len;
        int r = conn_fill(c);
        if (r == -ENOBUFS)
            return -EFBIG;
        if (r < 0)
            return r;
        if (r == 0)
            return -EPROTO;
    }
}

/* ---- the response head ---- */

/* Wait for a complete head at the front of the buffer; *ret_len covers it including the blank
 * line. */
static int read_head(conn_t *c, size_t *ret_len)
{
    size_t scanned = 0;
    for (;;) {
        const char *p = c->rbuf + c->off;
        size_t from = scanned > 3 ? scanned - 3 : 0;
        const char *e = memmem(p + from, c->len - from, "\r\n\r\n", 4);
        if (e) {
            *ret_len = (size_t)(e - p) + 4;
            return 0;
        }
        scanned = c->len;
        int r = conn_fill(c);
        if (r == -ENOBUFS)
            return -EFBIG;
        if (r < 0)
            return r;
        if (r == 0)
            return -EPROTO; /* closed before the head ended */
    }
}

/* "HTTP/1.x DDD[ reason]" */
static int parse_status_line(sv_t l, int *ret_status)
{
    if (l.len < 12 || !sv_has_prefix(l, SV("HTTP/1.")) || l.p[7] < '0' || l.p[7] > '9' ||
        l.p[8] != ' ')
        return -EPROTO;
    for (size_t i = 9; i < 12; i++)
        if (l.p[i] < '0' || l.p[i] > '9')
            return -EPROTO;
    if (l.p[9] < '1' || l.p[9] > '5')
        return -EPROTO;
    if (l.len > 12 && l.p[12] != ' ')
        return -EPROTO;
    if (!is_field_value(sv_make(l.p + 12, l.len - 12)))
        return -EPROTO;
    *ret_status = (l.p[9] - '0') * 100 + (l.p[10] - '0') * 10 + (l.p[11] - '0');
    return 0;
}

static sv_t sv_trim(sv_t v)
{
    while (v.len > 0 && (v.p[0] == ' ' || v.p[0] == '\t')) {
        v.p++;
        v.len--;
    }
    while (v.len > 0 && (v.p[v.len - 1] == ' ' || v.p[v.len - 1] == '\t'))
        v.len--;
    return v;
}

/* "Name: value"; records the framing headers. Duplicate Content-Length must agree; the only
 * transfer coding understood is a single "chunked". */
static int parse_header_line(sv_t l, head_info_t *info, bool *te_seen)
{
    const char *colon = memchr(l.p, ':', l.len);
    if (!colon)
        return -EPROTO;
    sv_t name = sv_make(l.p, (size_t)(colon - l.p));
    sv_t value = sv_make(colon + 1, l.len - name.len - 1);
    if (!is_token(name) || !is_field_value(value))
        return -EPROTO; /* also refuses obs-fold (a line starting with SP/HTAB) */
    value = sv_trim(value);
    if (sv_eq_lit_nocase(name, "connection")) {
        /* a comma-separated token list; "close" anywhere in it ends the connection */
        for (sv_t rest = value; rest.len > 0;) {
            size_t n = 0;
            while (n < rest.len && rest.p[n] != ',')
                n++;
            if (sv_eq_lit_nocase(sv_trim(sv_make(rest.p, n)), "close"))
                info->close = true;
            rest = n < rest.len ? sv_make(rest.p + n + 1, rest.len - n - 1) : sv_make(rest.p, 0);
        }
    } else if (sv_eq_lit_nocase(name, "content-length")) {
        uint64_t v;
        if (parse_u64(value, UINT64_MAX, &v) < 0)
            return -EPROTO;
        if (info->has_length && v != info->length)
            return -EPROTO;
        info->has_length = true;
        info->length = v;
    } else if (sv_eq_lit_nocase(name, "transfer-encoding")) {
        if (*te_seen || !sv_eq_lit_nocase(value, "chunked"))
            return -EPROTO;
        *te_seen = true;
        info->chunked = true;
    }
    return 0;
}

/* Parse the head p[0, len) (without the blank line; every line ends with CRLF). */
static int parse_head(const char *p, size_t len, head_info_t *ret)
{
    head_info_t info = { 0 };
    bool te_seen = false, first = true;
    while (len > 0) {
        const char *lf = memchr(p, '\n', len);
        if (!lf || lf == p || lf[-1] != '\r')
            return -EPROTO;
        sv_t line = sv_make(p, (size_t)(lf - p) - 1);
        if (memchr(line.p, '\r', line.len))
            return -EPROTO;
        int r = first ? parse_status_line(line, &info.status)
                      : parse_header_line(line, &info, &te_seen);
        if (first && line.p[7] == '0')
            info.close = true; /* HTTP/1.0: no keep-alive without asking, and we do not ask */
        if (r < 0)
            return r;
        first = false;
        len -= line.len + 2;
        p = lf + 1;
    }
    if (first)
        return -EPROTO;
    /* Both framings at once is how responses get split; refuse rather than pick one. */
    if (info.chunked && info.has_length)
        return -EPROTO;
    *ret = info;
    return 0;
}

/* Read heads until a final (non-1xx) one; it is copied out NUL-terminated (without the blank
 * line) and consumed from the buffer. */
static int read_final_head(conn_t *c, head_info_t *ret_info, char **ret_head)
{
    for (unsigned interim = 0;; interim++) {
        size_t len;
        head_info_t info;
        int r = read_head(c, &len);
        if (r < 0)
            return r;
        r = parse_head(c->rbuf + c->off, len - 2, &info);
        if (r < 0)
            return r;
        if (info.status >= 200) {
            char *h = malloc(len - 1);
            if (!h)
                return -ENOMEM;
            memcpy(h, c->rbuf + c->off, len - 2);
            h[len - 2] = '\0';
            conn_consume(c, len);
            *ret_info = info;
            *ret_head = h;
            return 0;
        }
        /* 101 would switch protocols, which this client never asks for. */
        if (info.status == 101 || interim >= HTTPC_INTERIM_MAX)
            return -EPROTO;
        conn_consume(c, len);
    }
}

/* ---- the response body ---- */

static int write_all(int fd, const char *p, size_t n, uint64_t deadline_ns)
{
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN) { /* a non-blocking fd after all: wait for room */
                int r = wait_fd(fd, POLLOUT, deadline_ns);
                if (r < 0)
                    return r;
                continue;
            }
            return negative_errno();
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static int sink_put(sink_t *s, const char *p, size_t n)
{
    size_t total;
    if (!size_add_ok(s->total, n, &total))
        return -EFBIG;
    if (s->fd >= 0) {
        int r = write_all(s->fd, p, n, s->deadline_ns);
        if (r < 0)
            return r;
    } else {
        if (total > s->max)
            return -EFBIG;
        int r = buf_append(&s->mem, p, n);
        if (r < 0)
            return r == -ENOBUFS ? -EFBIG : r;
    }
    s->total = total;
    return 0;
}

/* Exactly n bytes of body; the stream ending first is -EPROTO. */
static int body_fixed(conn_t *c, uint64_t n, sink_t *s)
{
    if (s->fd < 0 && (n > s->max || s->total > s->max - n))
        return -EFBIG; /* known up front: do not read what will not fit */
    while (n > 0) {
        if (c->len == 0) {
            int r = conn_fill(c);
            if (r < 0)
                return r;
            if (r == 0)
                return -EPROTO;
        }
        size_t k = (size_t)MIN((uint64_t)c->len, n);
        int r = sink_put(s, c->rbuf + c->off, k);
        if (r < 0)
            return r;
        conn_consume(c, k);
        n -= k;
    }
    return 0;
}

static int body_until_eof(conn_t *c, sink_t *s)
{
    for (;;) {
        if (c->len > 0) {
            int r = sink_put(s, c->rbuf + c->off, c->len);
            if (r < 0)
                return r;
            conn_consume(c, c->len);
        }
        int r = conn_fill(c);
        if (r < 0)
            return r;
        if (r == 0)
            return 0;
    }
}

/* chunk-size [ BWS ";" extensions ] — extensions are ignored. */
static int parse_chunk_size(sv_t l, uint64_t *ret)
{
    uint64_t v = 0;
    size_t i = 0;
    for (; i < l.len; i++) {
        char ch = l.p[i];
        unsigned d;
        if (ch >= '0' && ch <= '9')
            d = (unsigned)(ch - '0');
        else if ((ch | 0x20) >= 'a' && (ch | 0x20) <= 'f')
            d = (unsigned)((ch | 0x20) - 'a' + 10);
        else
            break;
        if (i >= 16)
            return -EPROTO; /* more than 64 bits */
        v = v * 16 + d;
    }
    if (i == 0)
        return -EPROTO;
    while (i < l.len && (l.p[i] == ' ' || l.p[i] == '\t'))
        i++;
    if (i < l.len && l.p[i] != ';')
        return -EPROTO;
    *ret = v;
    return 0;
}

static int body_chunked(conn_t *c, sink_t *s)
{
    sv_t line;
    for (;;) {
        uint64_t size;
        int r = conn_line(c, &line);
        if (r < 0)
            return r;
        r = parse_chunk_size(line, &size);
        if (r < 0)
            return r;
        if (size == 0)
            break;
        r = body_fixed(c, size, s);
        if (r < 0)
            return r;
        r = conn_line(c, &line);
        if (r < 0)
            return r;
        if (line.len != 0)
            return -EPROTO; /* chunk data longer than its size */
    }
    /* Trailer section: ignored, but capped like a head. */
    for (size_t total = 0;;) {
        int r = conn_line(c, &line);
        if (r < 0)
            return r;
        if (line.len == 0)
            return 0;
        total += line.len + 2;
        if (total > HTTPC_HEAD_MAX)
            return -EFBIG;
    }
}

static bool response_has_body(const httpc_request_t *rq, int status)
{
    return !streq(rq->method, "HEAD") && status != 204 && status != 304;
}

/* *ret_keep: the connection may carry another request (a framed, complete response that did
 * not say close, nothing unread after it). */
static int read_response(conn_t *c, const httpc_request_t *rq, httpc_response_t *ret,
                         bool *ret_keep)
{
    _cleanup_free_ char *head = NULL;
    head_info_t info;
    int r = read_final_head(c, &info, &head);
    if (r < 0)
        return r;

    sink_t s = {
        .fd = rq->body_fd,
        .max = rq->body_max ? MIN(rq->body_max, SIZE_MAX - 1) : HTTPC_BODY_MAX_DEFAULT,
        .deadline_ns = c->deadline_ns,
    };
    buf_init(&s.mem, s.max + 1); /* + the terminating NUL */
    if (!response_has_body(rq, info.status))
        r = 0;
    else if (info.chunked)
        r = body_chunked(c, &s);
    else if (info.has_length)
        r = body_fixed(c, info.length, &s);
    else {
        r = body_until_eof(c, &s);
        info.close = true;
    }
    if (ret_keep)
        *ret_keep = !info.close && c->len == 0;
    if (r >= 0 && s.fd < 0)
        r = buf_append(&s.mem, "", 1);
    if (r < 0) {
        buf_free(&s.mem);
        return r;
    }
    *ret = (httpc_response_t){
        .status = info.status,
        .head = TAKE_PTR(head),
        .body = s.fd < 0 ? s.mem.data : NULL,
        .body_len = s.total,
    };
    return 0;
}

/* ---- the keep-alive pool ---- */

#define HTTPC_POOL_REUSE_MS                                                                        \
    5000 /* idle longer than this: closed, not reused (servers keep
                                  * idle connections 75 s; this stays well inside that) */

typedef struct {
    char key[HTTPC_POOL_KEY_MAX];
    int fd;
    sockio_t *io;
    uint64_t idle_since_ns;
} pooled_t;

struct httpc_pool {
    pthread_mutex_t lock;
    unsigned max, n; /* slots, and idle connections in items[0, n) (oldest first) */
    uint64_t opened, reused;
    pooled_t items[];
};

httpc_pool_t *httpc_pool_new(unsigned max_idle)
{
    if (max_idle == 0 || max_idle > 4096)
        return NULL;
    httpc_pool_t *p = calloc(1, sizeof *p + (size_t)max_idle * sizeof(pooled_t));
    if (!p)
        return NULL;
    if (pthread_mutex_init(&p->lock, NULL) != 0) {
        free(p);
        return NULL;
    }
    p->max = max_idle;
    return p;
}

static void pooled_close(pooled_t *it) { it->fd = sock_close(it->fd, it->io); }

/* Take item i out (under the lock), keeping the rest in order. */
static pooled_t pool_remove(httpc_pool_t *p, unsigned i)
{
    pooled_t it = p->items[i];
    memmove(&p->items[i], &p->items[i + 1], (p->n - i - 1) * sizeof(pooled_t));
    p->n--;
    return it;
}

void httpc_pool_flush(httpc_pool_t *p, const char *key)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    for (unsigned i = p->n; i-- > 0;)
        if (!key || streq(p->items[i].key, key)) {
            pooled_t it = pool_remove(p, i);
            pooled_close(&it);
        }
    pthread_mutex_unlock(&p->lock);
}

void httpc_pool_free(httpc_pool_t *p)
{
    if (!p)
        return;
    httpc_pool_flush(p, NULL);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

void httpc_pool_stats(httpc_pool_t *p, uint64_t *ret_opened, uint64_t *ret_reused)
{
    pthread_mutex_lock(&p->lock);
    *ret_opened = p->opened;
    *ret_reused = p->reused;
    pthread_mutex_unlock(&p->lock);
}

/* Still good to send on: nothing to read (no end, no reset, no TLS alert, no stray bytes). */
static bool pooled_alive(const pooled_t *it)
{
    struct pollfd pf = { .fd = it->fd, .events = POLLIN | POLLRDHUP };
    return poll(&pf, 1, 0) == 0;
}

/* The newest idle connection under the request's key that is young enough and alive. */
static bool pool_take(const httpc_request_t *rq, conn_t *c)
{
    httpc_pool_t *p = rq->pool;
    uint64_t now = now_ns();
    pthread_mutex_lock(&p->lock);
    for (unsigned i = p->n; i-- > 0;) {
        if (!streq(p->items[i].key, rq->pool_key))
            continue;
        pooled_t it = pool_remove(p, i);
        if (now - it.idle_since_ns < HTTPC_POOL_REUSE_MS * UINT64_C(1000000) && pooled_alive(&it)) {
            p->reused++;
            pthread_mutex_unlock(&p->lock);
            c->fd = it.fd;
            c->io = it.io;
            return true;
        }
        pooled_close(&it);
    }
    pthread_mutex_unlock(&p->lock);
    return false;
}

static void pool_count_open(httpc_pool_t *p)
{
    pthread_mutex_lock(&p->lock);
    p->opened++;
    pthread_mutex_unlock(&p->lock);
}

static void pool_put(const httpc_request_t *rq, conn_t *c)
{
    httpc_pool_t *p = rq->pool;
    pooled_t it = { .fd = c->fd, .io = c->io, .idle_since_ns = now_ns() }, old = { .fd = -EBADF };
    (void)snprintf(it.key, sizeof it.key, "%s", rq->pool_key);
    c->fd = -EBADF;
    c->io = NULL;
    pthread_mutex_lock(&p->lock);
    if (p->n == p->max)
        old = pool_remove(p, 0);
    p->items[p->n++] = it;
    pthread_mutex_unlock(&p->lock);
    if (old.fd >= 0)
        pooled_close(&old);
}

/* ---- one exchange ---- */

static int conn_connect(const httpc_request_t *rq, conn_t *c)
{
    int r = conn_open(rq, c->deadline_ns, &c->fd);
    if (r < 0)
        return r;
    if (rq->transport.wrap) { /* TLS: nothing is sent before the peer proved who it is */
        c->io = rq->transport.wrap(rq->transport.arg, c->fd);
        if (!c->io)
            return -ENOMEM;
        while ((r = c->io->ops->handshake(c->io)) == -EAGAIN)
            if ((r = wait_io(c)) < 0)
                return r;
        if (r < 0)
            return r == -EPERM ? -EPERM : -ECONNREFUSED;
    }
    return 0;
}

/* A request that failed on a reused connection before any answer arrived may go once more on
 * a new one where that cannot run it twice. */
static bool may_resend(const httpc_request_t *rq, const conn_t *c, int sent, int r)
{
    if (c->got > 0 || (r != -EPROTO && r != -ECONNRESET && r != -EPIPE))
        return false;
    return sent < 0 || streq(rq->method, "GET") || streq(rq->method, "HEAD") ||
           streq(rq->method, "PUT") || streq(rq->method, "DELETE");
}

int httpc_do(const httpc_request_t *rq, httpc_response_t *ret)
{
    _cleanup_(buf_free) buf_t req = { 0 };
    if (!rq || !ret)
        return -EINVAL;
    int r = validate_request(rq);
    if (r < 0)
        return r;
    r = build_request_head(rq, &req);
    if (r < 0)
        return r;
    /* Head and body in one sendmsg where they fit, so a small request is one segment; over a
     * layer (TLS), which sends piece by piece, a small body joins the head: one record. */
    bool join = rq->transport.wrap && rq->body_len > 0 && rq->body_len <= HTTPC_JOIN_MAX;
    if (join && (r = buf_append(&req, rq->body, rq->body_len)) < 0)
        return r;
    uint64_t deadline_ns =
        deadline_after_ms(rq->timeout_ms ? rq->timeout_ms : HTTPC_TIMEOUT_DEFAULT_MS);

    for (bool retry = false;;) {
        _cleanup_(conn_done) conn_t c = { .fd = -EBADF, .deadline_ns = deadline_ns };
        c.rbuf = malloc(HTTPC_HEAD_MAX);
        if (!c.rbuf)
            return -ENOMEM;
        bool reused = rq->pool && !retry && pool_take(rq, &c);
        if (!reused && (r = conn_connect(rq, &c)) < 0)
            return r;
        if (!reused && rq->pool)
            pool_count_open(rq->pool);
        struct iovec iov[2] = {
            { .iov_base = buf_head(&req), .iov_len = req.len },
            { .iov_base = (void *)rq->body, .iov_len = join ? 0 : rq->body_len },
        };
        int sent = send_all(&c, iov, ELEMENTSOF(iov));
        if (sent < 0 && sent != -EPIPE && sent != -ECONNRESET)
            return sent;
        /* A server may answer (413, 401) and close without reading the whole body: its answer
         * is still worth reading; only without one is the send error reported. */
        bool keep = false;
        r = read_response(&c, rq, ret, &keep);
        if (r < 0 && reused && may_resend(rq, &c, sent, r)) {
            retry = true; /* once, on a new connection */
            continue;
        }
        if (r < 0 && sent < 0)
            return sent;
        if (r >= 0 && keep && rq->pool && sent >= 0)
            pool_put(rq, &c);
        return r;
    }
}

int httpc_read_response_fd(int fd, const httpc_request_t *rq, httpc_response_t *ret)
{
    conn_t c = { .fd = fd };
    if (!rq || !ret || !rq->method)
        return -EINVAL;
    c.deadline_ns = deadline_after_ms(rq->timeout_ms ? rq->timeout_ms : HTTPC_TIMEOUT_DEFAULT_MS);
    c.rbuf = malloc(HTTPC_HEAD_MAX);
    if (!c.rbuf)
        return -ENOMEM;
    int r = read_response(&c, rq, ret, NULL);
    free(c.rbuf); /* the fd stays the caller's */
    return r;
}

int httpc_header(const httpc_response_t *r, const char *name, char *out, size_t cap)
{
    if (!r || !r->head || !name || (!out && cap > 0))
        return -EINVAL;
    /* The stored head passed parse_head(): CRLF lines, a status line first, then "Name:"
     * lines whose names hold no ':' (so the first colon ends the name). */
    const char *p = strstr(r->head, "\r\n");
    while (p && p[2] != '\0') {
        p += 2;
        const char *e = strstr(p, "\r\n");
        size_t len = e ? (size_t)(e - p) : strlen(p);
        const char *colon = memchr(p, ':', len);
        if (colon && sv_eq_lit_nocase(sv_make(p, (size_t)(colon - p)), name)) {
            sv_t v = sv_trim(sv_make(colon + 1, len - (size_t)(colon - p) - 1));
            if (v.len >= cap)
                return -ENOBUFS;
            memcpy(out, v.p, v.len);
            out[v.len] = '\0';
            return 0;
        }
        p = e;
    }
    return -ENOENT;
}
