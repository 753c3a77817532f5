/* SPDX-License-Identifier: MIT */
/* A blocking HTTP/1.1 client for libsbx: TLS 1.3 checked against the platform's CA file, one
 * kept-alive connection, Content-Length / chunked / until-close bodies, streamed to a sink.
 * Every read and write waits at most io_timeout_ms (SO_RCVTIMEO/SO_SNDTIMEO); every size is
 * capped. Writes never raise SIGPIPE in the caller: SIGPIPE is blocked on this thread for the
 * write and a pending one it caused is consumed (no process-wide signal disposition changes). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/macro.h"
#include "common/strutil.h"
#include "lib/internal.h"

#define CONNECT_TIMEOUT_MS 10000

static bool is_ip(const char *h)
{
    unsigned char b[16];
    return inet_pton(AF_INET, h, b) == 1 || inet_pton(AF_INET6, h, b) == 1;
}

int http_conn_init(http_conn_t *c, const char *endpoint, const char *ca_file,
                   unsigned io_timeout_ms, sbx_err_t *err)
{
    memset(c, 0, sizeof *c);
    c->fd = -1;
    c->io_timeout_ms = io_timeout_ms ? io_timeout_ms : 120000;
    const char *p;
    if (strncmp(endpoint, "https://", 8) == 0) {
        c->tls = true;
        p = endpoint + 8;
    } else if (strncmp(endpoint, "http://", 7) == 0) {
        p = endpoint + 7;
    } else {
        return sbx_err(err, -EINVAL, "endpoint %s: must start with https:// (or http://)",
                       endpoint);
    }
    const char *end = p + strcspn(p, "/");
    const char *colon;
    const char *hs = p, *he;
    if (*p == '[') { /* [v6]:port */
        const char *rb = memchr(p, ']', (size_t)(end - p));
        if (!rb)
            goto bad;
        hs = p + 1;
        he = rb;
        colon = rb[1] == ':' ? rb + 1 : NULL;
    } else {
        colon = memchr(p, ':', (size_t)(end - p));
        he = colon ? colon : end;
    }
    size_t hl = (size_t)(he - hs);
    if (hl == 0 || hl >= sizeof c->host)
        goto bad;
    memcpy(c->host, hs, hl);
    c->host[hl] = 0;
    if (colon) {
        size_t pl = (size_t)(end - colon - 1);
        if (pl == 0 || pl >= sizeof c->port || strspn(colon + 1, "0123456789") < pl)
            goto bad;
        memcpy(c->port, colon + 1, pl);
        c->port[pl] = 0;
    } else {
        (void)snprintf(c->port, sizeof c->port, "%s", c->tls ? "443" : "80");
    }
    if (*end && !(end[0] == '/' && end[1] == 0))
        goto bad;
    if (!c->tls)
        return 0;
    c->ctx = SSL_CTX_new(TLS_client_method());
    if (!c->ctx)
        return sbx_err(err, -ENOMEM, "TLS: cannot make a context (out of memory?)");
    (void)SSL_CTX_set_min_proto_version(c->ctx, TLS1_3_VERSION);
    SSL_CTX_set_verify(c->ctx, SSL_VERIFY_PEER, NULL);
    if (!ca_file || SSL_CTX_load_verify_locations(c->ctx, ca_file, NULL) != 1) {
        ERR_clear_error();
        SSL_CTX_free(c->ctx);
        c->ctx = NULL;
        return sbx_err(err, -ENOENT,
                       "cannot load the platform's CA certificate from %s (set ca_file, or "
                       "run `sbx up`, which writes $SBX_HOME/ca.crt)",
                       ca_file ? ca_file : "(none)");
    }
    return 0;
bad:
    return sbx_err(err, -EINVAL, "endpoint %s: expected https://HOST:PORT", endpoint);
}

void http_conn_close(http_conn_t *c)
{
    if (c->ssl) {
        SSL_free(c->ssl);
        c->ssl = NULL;
    }
    if (c->fd >= 0)
        (void)close(c->fd);
    c->fd = -1;
    c->used = false;
    c->rpos = c->rlen = 0;
}

void http_conn_done(http_conn_t *c)
{
    http_conn_close(c);
    if (c->ctx)
        SSL_CTX_free(c->ctx);
    c->ctx = NULL;
}

static int connect_tcp(http_conn_t *c, sbx_err_t *err)
{
    struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai = NULL;
    int g = getaddrinfo(c->host, c->port, &hints, &ai);
    if (g != 0)
        return sbx_err(err, -EHOSTUNREACH, "cannot resolve %s: %s", c->host, gai_strerror(g));
    int r = -ECONNREFUSED;
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            r = -errno;
            continue;
        }
        if (connect(fd, a->ai_addr, a->ai_addrlen) < 0 && errno != EINPROGRESS) {
            r = -errno;
            (void)close(fd);
            continue;
        }
        struct pollfd pfd = { .fd = fd, .events = POLLOUT };
        int pr = poll(&pfd, 1, CONNECT_TIMEOUT_MS);
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        if (pr <= 0)
            soerr = pr == 0 ? ETIMEDOUT : errno;
        else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0)
            soerr = errno;
        if (soerr) {
            r = -soerr;
            (void)close(fd);
            continue;
        }
        int fl = fcntl(fd, F_GETFL);
        (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
        struct timeval tv = { .tv_sec = c->io_timeout_ms / 1000,
                              .tv_usec = (c->io_timeout_ms % 1000) * 1000 };
        (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        int one = 1, idle = 30, intvl = 10, cnt = 3;
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        /* a peer that vanished (no FIN) is noticed within ~1 min even on a quiet stream */
        (void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
        (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
        (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
        (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
        c->fd = fd;
        r = 0;
        break;
    }
    freeaddrinfo(ai);
    if (r < 0)
        return sbx_err(err, r,
                       "cannot connect to %s:%s: %s (is the platform running? `sbx up` starts "
                       "one; `sbx status` tells)",
                       c->host, c->port, strerror(-r));
    return 0;
}

static int conn_open(http_conn_t *c, sbx_err_t *err)
{
    int r = connect_tcp(c, err);
    if (r < 0 || !c->tls)
        return r;
    c->ssl = SSL_new(c->ctx);
    if (!c->ssl || SSL_set_fd(c->ssl, c->fd) != 1) {
        http_conn_close(c);
        return sbx_err(err, -ENOMEM, "TLS: out of memory");
    }
    X509_VERIFY_PARAM *vp = SSL_get0_param(c->ssl);
    if (is_ip(c->host)) {
        (void)X509_VERIFY_PARAM_set1_ip_asc(vp, c->host);
    } else {
        (void)SSL_set_tlsext_host_name(c->ssl, c->host);
        (void)SSL_set1_host(c->ssl, c->host);
    }
    sigset_t pipe, old;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    (void)pthread_sigmask(SIG_BLOCK, &pipe, &old);
    int ok = SSL_connect(c->ssl);
    (void)pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (ok != 1) {
        long vr = SSL_get_verify_result(c->ssl);
        unsigned long e = ERR_get_error();
        ERR_clear_error();
        if (vr != X509_V_OK)
            (void)sbx_err(err, -EPROTO,
                          "TLS: the certificate of %s:%s does not verify against the CA file "
                          "(%s); is the endpoint right, and the CA the one of this platform?",
                          c->host, c->port, X509_verify_cert_error_string(vr));
        else
            (void)sbx_err(err, -EPROTO, "TLS handshake with %s:%s failed: %s", c->host, c->port,
                          e ? ERR_reason_error_string(e) : "connection closed");
        http_conn_close(c);
        return -EPROTO;
    }
    return 0;
}

/* ---- raw IO ------------------------------------------------------------------------------ */

static int io_write(http_conn_t *c, const void *buf, size_t len)
{
    sigset_t pipe, old, pending;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    (void)pthread_sigmask(SIG_BLOCK, &pipe, &old);
    sigemptyset(&pending);
    (void)sigpending(&pending);
    bool was_pending = sigismember(&pending, SIGPIPE);
    const char *p = buf;
    int r = 0;
    while (len > 0) {
        ssize_t n;
        if (c->ssl) {
            int w = SSL_write(c->ssl, p, len > INT32_MAX ? INT32_MAX : (int)len);
            if (w <= 0) {
                int se = SSL_get_error(c->ssl, w);
                r = se == SSL_ERROR_WANT_READ || se == SSL_ERROR_WANT_WRITE ? -ETIMEDOUT
                    : se == SSL_ERROR_SYSCALL && errno                      ? -errno
                                                                            : -EPIPE;
                ERR_clear_error();
                break;
            }
            n = w;
        } else {
            n = send(c->fd, p, len, MSG_NOSIGNAL);
            if (n < 0) {
                if (errno == EINTR)
                    continue;
                r = -errno;
                break;
            }
        }
        p += n;
        len -= (size_t)n;
    }
    if (r == -EPIPE && !was_pending) {
        struct timespec zero = { 0, 0 };
        (void)sigtimedwait(&pipe, NULL, &zero);
    }
    (void)pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (r == -EAGAIN || r == -EWOULDBLOCK)
        r = -ETIMEDOUT;
    return r;
}

/* Fill the read buffer: > 0 bytes, 0 at EOF, < 0 error. */
static int io_fill(http_conn_t *c)
{
    if (c->rpos < c->rlen)
        return (int)(c->rlen - c->rpos);
    c->rpos = c->rlen = 0;
    for (;;) {
        ssize_t n;
        if (c->ssl) {
            int rd = SSL_read(c->ssl, c->rbuf, sizeof c->rbuf);
            if (rd <= 0) {
                int se = SSL_get_error(c->ssl, rd);
                int e = errno;
                ERR_clear_error();
                if (se == SSL_ERROR_ZERO_RETURN)
                    return 0;
                if (se == SSL_ERROR_WANT_READ || se == SSL_ERROR_WANT_WRITE)
                    return -ETIMEDOUT; /* SO_RCVTIMEO ran out */
                if (se == SSL_ERROR_SYSCALL)
                    return e == EAGAIN || e == EWOULDBLOCK ? -ETIMEDOUT : e ? -e : 0;
                return -EPROTO;
            }
            n = rd;
        } else {
            n = recv(c->fd, c->rbuf, sizeof c->rbuf, 0);
            if (n < 0) {
                if (errno == EINTR)
                    continue;
                return errno == EAGAIN || errno == EWOULDBLOCK ? -ETIMEDOUT : -errno;
            }
        }
        c->rlen = (size_t)n;
        return (int)n;
    }
}

/* One line ending in LF (CR stripped) into out (cap), NUL-terminated. */
static int read_line(http_conn_t *c, char *out, size_t cap, size_t *ret_len)
{
    size_t n = 0;
    for (;;) {
        int r = io_fill(c);
        if (r <= 0)
            return r == 0 ? -ECONNRESET : r;
        char *start = c->rbuf + c->rpos;
        char *nl = memchr(start, '\n', c->rlen - c->rpos);
        size_t take = nl ? (size_t)(nl - start) + 1 : c->rlen - c->rpos;
        if (n + take >= cap)
            return -EFBIG;
        memcpy(out + n, start, take);
        n += take;
        c->rpos += take;
        if (nl)
            break;
    }
    /* CRLF ends a line, nothing else: a peer whose bare LF ended a line here while a relay on
     * the way took it for part of one could frame a second response inside the first */
    if (n < 2 || out[n - 2] != '\r' || memchr(out, '\r', n - 2))
        return -EPROTO;
    n -= 2;
    out[n] = 0;
    *ret_len = n;
    return 0;
}

/* ---- the exchange -------------------------------------------------------------------------- */

typedef struct {
    const http_req_t *rq;
    http_resp_t *resp;
    bool to_sink;
    size_t cap;
    size_t have_cap;
    uint64_t done;
} body_out_t;

static int body_put(body_out_t *o, const void *p, size_t n)
{
    o->done += n;
    if (o->to_sink) {
        int r = o->rq->sink(p, n, o->rq->sink_ud);
        if (r >= 0 && o->rq->progress)
            o->rq->progress(n, o->resp->content_length, o->rq->progress_ud);
        return r < 0 ? r : 0;
    }
    http_resp_t *resp = o->resp;
    size_t need;
    if (!size_add_ok(resp->body_len, n + 1, &need) || need > o->cap + 1)
        return -EFBIG;
    if (need > o->have_cap) {
        size_t nc = o->have_cap ? o->have_cap : 4096;
        while (nc < need)
            nc *= 2;
        char *nb = realloc(resp->body, nc);
        if (!nb)
            return -ENOMEM;
        resp->body = nb;
        o->have_cap = nc;
    }
    memcpy(resp->body + resp->body_len, p, n);
    resp->body_len += n;
    resp->body[resp->body_len] = 0;
    return 0;
}

static int copy_n(http_conn_t *c, body_out_t *o, uint64_t n)
{
    while (n > 0) {
        int r = io_fill(c);
        if (r <= 0)
            return r == 0 ? -ECONNRESET : r;
        size_t take = c->rlen - c->rpos;
        if (take > n)
            take = (size_t)n;
        r = body_put(o, c->rbuf + c->rpos, take);
        if (r < 0)
            return r;
        c->rpos += take;
        n -= take;
    }
    return 0;
}

/* A chunk size: hex digits, then nothing or ";extensions". */
static int parse_hex(const char *s, uint64_t *ret)
{
    uint64_t v = 0;
    size_t i = 0;
    for (; s[i] && s[i] != ';' && s[i] != ' '; i++) {
        int d = s[i] >= '0' && s[i] <= '9'   ? s[i] - '0'
                : s[i] >= 'a' && s[i] <= 'f' ? s[i] - 'a' + 10
                : s[i] >= 'A' && s[i] <= 'F' ? s[i] - 'A' + 10
                                             : -1;
        if (d < 0 || i >= 15)
            return -EPROTO;
        v = v * 16 + (uint64_t)d;
    }
    if (i == 0)
        return -EPROTO;
    *ret = v;
    return 0;
}

static int read_chunked(http_conn_t *c, body_out_t *o)
{
    char line[256];
    size_t ll;
    for (;;) {
        int r = read_line(c, line, sizeof line, &ll);
        if (r < 0)
            return r;
        uint64_t sz;
        if (parse_hex(line, &sz) < 0)
            return -EPROTO;
        if (sz == 0)
            break;
        r = copy_n(c, o, sz);
        if (r < 0)
            return r;
        r = read_line(c, line, sizeof line, &ll);
        if (r < 0)
            return r;
        if (ll != 0)
            return -EPROTO;
    }
    for (int i = 0; i < 64; i++) { /* trailers: fields, 64 at most */
        int r = read_line(c, line, sizeof line, &ll);
        if (r < 0)
            return r;
        if (ll == 0)
            return 0;
        if (!memchr(line, ':', ll) || line[0] == ' ' || line[0] == '\t' || line[0] == ':')
            return -EPROTO;
    }
    return -EPROTO;
}

static int send_request(http_conn_t *c, const http_req_t *rq, const char *hostport)
{
    uint64_t blen = rq->body_fd >= 0 ? rq->body_fd_len : rq->body_len;
    bool has_body = rq->body_fd >= 0 || rq->body || strcmp(rq->method, "POST") == 0 ||
                    strcmp(rq->method, "PUT") == 0;
    char *head = NULL;
    int hl =
        asprintf(&head, "%s %s HTTP/1.1\r\nHost: %s\r\n%s%s%s%s", rq->method, rq->target, hostport,
                 rq->headers ? rq->headers : "", rq->content_type ? "Content-Type: " : "",
                 rq->content_type ? rq->content_type : "", rq->content_type ? "\r\n" : "");
    if (hl < 0)
        return -ENOMEM;
    char tail[64];
    if (has_body)
        (void)snprintf(tail, sizeof tail, "Content-Length: %llu\r\n\r\n", (unsigned long long)blen);
    else
        (void)snprintf(tail, sizeof tail, "\r\n");
    int r = io_write(c, head, (size_t)hl);
    free(head);
    if (r >= 0)
        r = io_write(c, tail, strlen(tail));
    if (r < 0)
        return r;
    if (rq->body_fd < 0)
        return rq->body_len ? io_write(c, rq->body, rq->body_len) : 0;
    static const size_t chunk = 256 * 1024;
    char *buf = malloc(chunk);
    if (!buf)
        return -ENOMEM;
    uint64_t done = 0;
    while (done < blen && r >= 0) {
        uint64_t want = blen - done < chunk ? blen - done : chunk;
        ssize_t n = pread(rq->body_fd, buf, (size_t)want, (off_t)(rq->body_fd_off + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            r = n < 0 ? -errno : -EIO; /* the file shrank while it was sent */
            break;
        }
        r = io_write(c, buf, (size_t)n);
        done += (uint64_t)n;
        if (r >= 0 && rq->progress)
            rq->progress((uint64_t)n, blen, rq->progress_ud);
    }
    free(buf);
    return r;
}

typedef struct {
    int status;
    bool chunked, close;
    uint64_t clen;
} head_t;

static int read_head(http_conn_t *c, head_t *h, bool *ret_any)
{
    char line[8192];
    size_t ll, total = 0;
    int r = read_line(c, line, sizeof line, &ll);
    if (r < 0)
        return r;
    *ret_any = true;
    /* "HTTP/1.x NNN reason" */
    if (ll < 12 || memcmp(line, "HTTP/1.", 7) != 0 || line[8] != ' ' || line[9] < '1' ||
        line[9] > '5' || line[10] < '0' || line[10] > '9' || line[11] < '0' || line[11] > '9')
        return -EPROTO;
    h->status = (line[9] - '0') * 100 + (line[10] - '0') * 10 + (line[11] - '0');
    h->close = line[7] == '0';
    h->clen = UINT64_MAX;
    for (;;) {
        r = read_line(c, line, sizeof line, &ll);
        if (r < 0)
            return r == -EFBIG ? -EPROTO : r;
        total += ll;
        if (total > HTTP_HEAD_MAX)
            return -EPROTO;
        if (ll == 0)
            break;
        char *colon = strchr(line, ':');
        if (!colon)
            return -EPROTO;
        *colon = 0;
        char *v = colon + 1;
        v += strspn(v, " \t");
        if (strcasecmp(line, "content-length") == 0) {
            uint64_t n;
            if (parse_u64_str(v, UINT64_MAX - 1, &n) < 0)
                return -EPROTO;
            h->clen = n;
        } else if (strcasecmp(line, "transfer-encoding") == 0) {
            h->chunked = strcasestr(v, "chunked") != NULL;
        } else if (strcasecmp(line, "connection") == 0) {
            if (strcasestr(v, "close"))
                h->close = true;
        }
    }
    return 0;
}

int http_read_response(http_conn_t *c, const http_req_t *rq, http_resp_t *resp, bool *ret_any)
{
    head_t h;
    int r;
    do {
        memset(&h, 0, sizeof h);
        r = read_head(c, &h, ret_any);
        if (r < 0) {
            http_conn_close(c);
            return r;
        }
    } while (h.status >= 100 && h.status < 200);
    resp->status = h.status;
    resp->content_length = h.chunked ? UINT64_MAX : h.clen;
    bool ok = h.status >= 200 && h.status < 300;
    body_out_t o = { .rq = rq,
                     .resp = resp,
                     .to_sink = rq->sink && ok,
                     .cap = ok && rq->body_max ? rq->body_max : HTTP_ERRBODY_MAX };
    bool no_body = strcmp(rq->method, "HEAD") == 0 || h.status == 204 || h.status == 304;
    if (no_body)
        r = 0;
    else if (h.chunked)
        r = read_chunked(c, &o);
    else if (h.clen != UINT64_MAX)
        r = copy_n(c, &o, h.clen);
    else { /* until close */
        h.close = true;
        for (;;) {
            r = io_fill(c);
            if (r <= 0)
                break;
            size_t take = c->rlen - c->rpos;
            r = body_put(&o, c->rbuf + c->rpos, take);
            c->rpos += take;
            if (r < 0)
                break;
        }
    }
    if (r >= 0 && !o.to_sink && !resp->body) {
        resp->body = calloc(1, 1);
        if (!resp->body)
            r = -ENOMEM;
    }
    if (r < 0 || h.close)
        http_conn_close(c);
    else
        c->used = true;
    return r < 0 ? r : 0;
}

static int exchange(http_conn_t *c, const http_req_t *rq, http_resp_t *resp, bool *ret_any)
{
    char hostport[300];
    (void)snprintf(hostport, sizeof hostport, strchr(c->host, ':') ? "[%s]:%s" : "%s:%s", c->host,
                   c->port);
    int r = send_request(c, rq, hostport);
    if (r < 0)
        return r;
    return http_read_response(c, rq, resp, ret_any);
}

/* SO_RCVTIMEO of the connection (0: none). */
static void set_read_timeout(http_conn_t *c, unsigned ms)
{
    struct timeval tv = { .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 };
    (void)setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

int http_do(http_conn_t *c, const http_req_t *rq, http_resp_t *ret, sbx_err_t *err)
{
    for (int attempt = 0;; attempt++) {
        bool reused = c->fd >= 0 && c->used;
        if (c->fd < 0) {
            int r = conn_open(c, err);
            if (r < 0)
                return r;
        }
        http_resp_t resp = { 0 };
        bool any = false;
        if (rq->stream)
            set_read_timeout(c, 0);
        int r = exchange(c, rq, &resp, &any);
        if (rq->stream && c->fd >= 0)
            set_read_timeout(c, c->io_timeout_ms);
        if (r >= 0) {
            *ret = resp;
            return 0;
        }
        http_resp_free(&resp);
        http_conn_close(c);
        /* A kept connection the server closed meanwhile: nothing was answered, try a fresh one. */
        if (reused && !any && attempt == 0 && (r == -ECONNRESET || r == -EPIPE))
            continue;
        if (r == -EFBIG)
            return sbx_err(err, r, "the answer of %s %s is larger than this call accepts",
                           rq->method, rq->target);
        if (r == -EPROTO)
            return sbx_err(err, r, "malformed HTTP answer from %s:%s", c->host, c->port);
        if (r == -ETIMEDOUT)
            return sbx_err(err, r, "%s:%s did not answer within %u ms", c->host, c->port,
                           c->io_timeout_ms);
        if (r == -ECONNRESET || r == -EPIPE)
            return sbx_err(err, r, "the connection to %s:%s was closed mid-exchange", c->host,
                           c->port);
        return sbx_err(err, r, "%s %s: %s", rq->method, rq->target, strerror(-r));
    }
}

void http_resp_free(http_resp_t *r)
{
    free(r->body);
    r->body = NULL;
    r->body_len = 0;
}
