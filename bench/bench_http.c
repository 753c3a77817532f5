/* SPDX-License-Identifier: MIT */
/* The bench's own HTTP/1.1 client: blocking loopback sockets, a response parser for
 * Content-Length and chunked bodies that hands body bytes to a sink without copying them, and an
 * NDJSON exec-event decoder (JSON string unescaping, base64) that checks every payload byte. */
#include "bench_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/socket.h>

/* Fast "every byte is zero": the first byte is zero and each byte equals the next. */
static bool all_zero(const unsigned char *p, size_t n)
{
    return n == 0 || (p[0] == 0 && memcmp(p, p + 1, n - 1) == 0);
}

/* ---- base64 and JSON strings ------------------------------------------------------------- */

/* Base64 character -> its 6-bit value; XX (bit 7 set) = not in the alphabet, '=' included. */
#define XX 0x80
/* clang-format off */
static const unsigned char b64_val[256] = { /* a row per high nibble */
    XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX,
    XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX,
    XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, 62, XX, XX, XX, 63,
    52, 53, 54, 55, 56, 57, 58, 59, 60, 61, XX, XX, XX, XX, XX, XX,
    XX,  0,  1,  2,  3,  4,  5,  6,  7,  8,  9, 10, 11, 12, 13, 14,
    15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, XX, XX, XX, XX, XX,
    XX, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40,
    41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, XX, XX, XX, XX, XX,
    XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX,
    XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX,
    XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX,
    XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX,
    XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX,
    XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX,
    XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX,
    XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX, XX,
};
/* clang-format on */
#undef XX

/* Full quads (no padding) into 3 bytes each: four lookups and one test per quad. */
static int b64_quads(const unsigned char *u, size_t quads, unsigned char *o)
{
    for (size_t i = 0; i < quads; i++, u += 4, o += 3) {
        uint32_t a = b64_val[u[0]], b = b64_val[u[1]], c = b64_val[u[2]], d = b64_val[u[3]];
        if ((a | b | c | d) & 0x80)
            return -EINVAL;
        uint32_t v = a << 18 | b << 12 | c << 6 | d;
        o[0] = (unsigned char)(v >> 16);
        o[1] = (unsigned char)(v >> 8);
        o[2] = (unsigned char)v;
    }
    return 0;
}

#if defined(__x86_64__)
#include <tmmintrin.h>

/* 16 characters -> 12 bytes a step (Mula and Lemire, "Faster Base64 Encoding and Decoding using
 * AVX2 Instructions", the pshufb bitmask lookup, here on 128 bits). Each character's low and high
 * nibble select a class bitmask from two tables; a character is in the alphabet exactly when
 * the two masks share no bit. The high nibble (and "is it '/'") then picks the offset that turns
 * the character into its value, and two multiply-adds pack four 6-bit values into 3 bytes.
 * Each step stores 16 bytes for its 12; it runs only while 24 characters are left, so the 4
 * extra bytes land where the next quads' bytes go. Returns the characters consumed: it stops
 * before a block holding a character outside the alphabet, for the scalar loop to reject. */
__attribute__((target("ssse3"))) static size_t b64_decode_ssse3(const unsigned char *u, size_t n,
                                                                unsigned char *out)
{
    const __m128i lut_lo = _mm_setr_epi8(0x15, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11,
                                         0x13, 0x1A, 0x1B, 0x1B, 0x1B, 0x1A);
    const __m128i lut_hi = _mm_setr_epi8(0x10, 0x10, 0x01, 0x02, 0x04, 0x08, 0x04, 0x08, 0x10, 0x10,
                                         0x10, 0x10, 0x10, 0x10, 0x10, 0x10);
    /* By high nibble: '+' (2) +19, '/' (2, moved to 1 by the compare) +16, digits +4,
     * 'A'-'Z' -65, 'a'-'z' -71. */
    const __m128i lut_roll =
        _mm_setr_epi8(0, 16, 19, 4, -65, -65, -71, -71, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m128i nib = _mm_set1_epi8(0x0F), slash = _mm_set1_epi8('/'), zero = _mm_setzero_si128();
    const __m128i pack = _mm_setr_epi8(2, 1, 0, 6, 5, 4, 10, 9, 8, 14, 13, 12, -1, -1, -1, -1);
    size_t i = 0;
    unsigned char *o = out;
    for (; i + 24 <= n; i += 16, o += 12) {
        __m128i in = _mm_loadu_si128((const __m128i *)(u + i));
        __m128i hi = _mm_and_si128(_mm_srli_epi32(in, 4), nib);
        __m128i cls = _mm_and_si128(_mm_shuffle_epi8(lut_lo, _mm_and_si128(in, nib)),
                                    _mm_shuffle_epi8(lut_hi, hi));
        if (_mm_movemask_epi8(_mm_cmpeq_epi8(cls, zero)) != 0xFFFF)
            break;
        __m128i roll = _mm_shuffle_epi8(lut_roll, _mm_add_epi8(_mm_cmpeq_epi8(in, slash), hi));
        __m128i v = _mm_add_epi8(in, roll);                   /* one 6-bit value per byte */
        v = _mm_maddubs_epi16(v, _mm_set1_epi32(0x01400140)); /* 12 bits per 16-bit lane */
        v = _mm_madd_epi16(v, _mm_set1_epi32(0x00011000));    /* 24 bits per 32-bit lane */
        _mm_storeu_si128((__m128i *)o, _mm_shuffle_epi8(v, pack));
    }
    return i;
}
#endif

static ssize_t b64_decode_with(const char *s, size_t n, unsigned char *out, bool simd)
{
    if (n % 4)
        return -EINVAL;
    if (n == 0)
        return 0;
    size_t pad = (s[n - 1] == '=') + (s[n - 2] == '=');
    size_t full = n / 4 - (pad ? 1 : 0);
    const unsigned char *u = (const unsigned char *)s;
    unsigned char *o = out;
#if defined(__x86_64__)
    if (simd && __builtin_cpu_supports("ssse3")) {
        size_t used = b64_decode_ssse3(u, full * 4, o);
        u += used;
        o += used / 4 * 3;
        full -= used / 4;
    }
#else
    (void)simd;
#endif
    if (b64_quads(u, full, o) < 0)
        return -EINVAL;
    u += full * 4;
    o += full * 3;
    if (pad) {
        uint32_t a = b64_val[u[0]], b = b64_val[u[1]];
        uint32_t c = pad == 1 ? b64_val[u[2]] : 0;
        if ((a | b | c) & 0x80)
            return -EINVAL;
        uint32_t v = a << 18 | b << 12 | c << 6;
        *o++ = (unsigned char)(v >> 16);
        if (pad == 1)
            *o++ = (unsigned char)(v >> 8);
    }
    return o - out;
}

ssize_t b64_decode(const char *s, size_t n, unsigned char *out)
{
    return b64_decode_with(s, n, out, true);
}

ssize_t b64_decode_scalar(const char *s, size_t n, unsigned char *out)
{
    return b64_decode_with(s, n, out, false);
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static int hex4(const char *p, const char *e, uint32_t *ret)
{
    if (e - p < 4)
        return -EINVAL;
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(p[i]);
        if (h < 0)
            return -EINVAL;
        v = v << 4 | (uint32_t)h;
    }
    *ret = v;
    return 0;
}

static size_t put_utf8(unsigned char *o, uint32_t cp)
{
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | cp >> 6);
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | cp >> 12);
        o[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | cp >> 18);
    o[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* One escape at p (p[0] == '\\'): write its bytes to *o; return the escape's length or -1. */
static int unescape_one(const char *p, const char *e, unsigned char **o)
{
    uint32_t cp, lo;
    if (e - p < 2)
        return -1;
    switch (p[1]) {
    case '"': *(*o)++ = '"'; return 2;
    case '\\': *(*o)++ = '\\'; return 2;
    case '/': *(*o)++ = '/'; return 2;
    case 'b': *(*o)++ = '\b'; return 2;
    case 'f': *(*o)++ = '\f'; return 2;
    case 'n': *(*o)++ = '\n'; return 2;
    case 'r': *(*o)++ = '\r'; return 2;
    case 't': *(*o)++ = '\t'; return 2;
    case 'u': break;
    default: return -1;
    }
    if (hex4(p + 2, e, &cp) < 0)
        return -1;
    if (cp >= 0xDC00 && cp < 0xE000)
        return -1;
    if (cp < 0xD800 || cp >= 0xE000) {
        *o += put_utf8(*o, cp);
        return 6;
    }
    if (e - p < 12 || p[6] != '\\' || p[7] != 'u' || hex4(p + 8, e, &lo) < 0 || lo < 0xDC00 ||
        lo >= 0xE000)
        return -1;
    *o += put_utf8(*o, 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00));
    return 12;
}

/* Unescape the inside of a JSON string into out (never longer than the input). Plain runs are
 * copied with memchr/memcpy, so text with few escapes goes at memory speed; a run of \u00XX
 * escapes below 0x80 (control bytes, how JSON carries them: six characters a byte) is decoded
 * in a loop of its own. */
static ssize_t json_unescape(const char *s, size_t n, unsigned char *out)
{
    const char *p = s, *e = s + n;
    unsigned char *o = out;
    while (p < e) {
        if (*p != '\\') {
            const char *bs = memchr(p, '\\', (size_t)(e - p));
            size_t run = bs ? (size_t)(bs - p) : (size_t)(e - p);
            memcpy(o, p, run);
            o += run;
            p += run;
            continue;
        }
        int hi, lo;
        const char *p0 = p;
        while (e - p >= 6 && memcmp(p, "\\u00", 4) == 0 && (hi = hexval(p[4])) >= 0 && hi < 8 &&
               (lo = hexval(p[5])) >= 0) {
            *o++ = (unsigned char)(hi << 4 | lo);
            p += 6;
        }
        if (p != p0)
            continue;
        int k = unescape_one(p, e, &o);
        if (k < 0)
            return -EINVAL;
        p += k;
    }
    return o - out;
}

/* p points at an opening quote; find the closing one: the first quote not escaped by an odd
 * run of backslashes. *ret is the raw inside; *ret_escaped says whether it has escapes. */
static int scan_string(const char **pp, const char *e, sv_t *ret, bool *ret_escaped)
{
    const char *p = *pp;
    if (p >= e || *p != '"')
        return -EINVAL;
    p++;
    const char *q = p;
    for (;;) {
        q = memchr(q, '"', (size_t)(e - q));
        if (!q)
            return -EINVAL;
        size_t bs = 0;
        while (q - bs > p && q[-1 - (ptrdiff_t)bs] == '\\')
            bs++;
        if (bs % 2 == 0)
            break;
        q++;
    }
    *ret = sv_make(p, (size_t)(q - p));
    *ret_escaped = memchr(p, '\\', (size_t)(q - p)) != NULL;
    *pp = q + 1;
    return 0;
}

/* ---- HTTP responses ---------------------------------------------------------------------- */

void rp_init(rp_t *rp, sink_fn sink, void *ctx)
{
    *rp = (rp_t){ .state = RP_HEAD, .sink = sink, .ctx = ctx };
}

static int rp_header(rp_t *rp, sv_t name, sv_t val)
{
    if (sv_eq_lit_nocase(name, "content-length")) {
        if (rp->has_length || parse_u64(val, UINT64_C(1) << 53, &rp->content_length) < 0)
            return -EPROTO;
        rp->has_length = true;
    } else if (sv_eq_lit_nocase(name, "transfer-encoding")) {
        if (!sv_eq_lit_nocase(val, "chunked"))
            return -EPROTO;
        rp->chunked = true;
    } else if (sv_eq_lit_nocase(name, "connection")) {
        rp->close = sv_eq_lit_nocase(val, "close");
    }
    return 0;
}

/* Parse the head if it is complete: returns its length, 0 for more bytes, or -errno. */
static ssize_t rp_head(rp_t *rp, const char *p, size_t n)
{
    const char *end = memmem(p, n, "\r\n\r\n", 4);
    if (!end)
        return n > RESP_HEAD_MAX ? -E2BIG : 0;
    const char *eol = memmem(p, (size_t)(end + 2 - p), "\r\n", 2);
    uint64_t st;
    if (eol - p < 12 || memcmp(p, "HTTP/1.", 7) != 0 || p[8] != ' ' || p[12] != ' ' ||
        parse_u64(sv_make(p + 9, 3), 999, &st) < 0)
        return -EPROTO;
    rp->status = (int)st;
    rp->close = p[7] == '0';
    for (const char *l = eol + 2; l < end;) {
        const char *le = memmem(l, (size_t)(end + 2 - l), "\r\n", 2);
        const char *colon = memchr(l, ':', (size_t)(le - l));
        if (!colon)
            return -EPROTO;
        const char *v = colon + 1, *ve = le;
        while (v < ve && (*v == ' ' || *v == '\t'))
            v++;
        while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
            ve--;
        int r = rp_header(rp, sv_make(l, (size_t)(colon - l)), sv_make(v, (size_t)(ve - v)));
        if (r < 0)
            return r;
        l = le + 2;
    }
    if (rp->chunked && rp->has_length)
        return -EPROTO;
    if (rp->chunked)
        rp->state = RP_CHUNK_SIZE;
    else if (rp->has_length) {
        rp->left = rp->content_length;
        rp->state = rp->left ? RP_BODY : RP_DONE;
    } else if (rp->status == 204 || rp->status == 304) {
        rp->state = RP_DONE;
    } else {
        rp->state = RP_EOF_BODY;
        rp->close = true;
    }
    return end + 4 - p;
}

static ssize_t rp_chunk_size(rp_t *rp, const char *p, size_t n)
{
    const char *nl = memchr(p, '\n', n);
    if (!nl)
        return n > 1024 ? -EPROTO : 0;
    uint64_t size = 0;
    const char *q = p;
    for (; q < nl && hexval(*q) >= 0; q++) {
        if (q - p >= 14)
            return -EPROTO;
        size = size << 4 | (uint64_t)hexval(*q);
    }
    if (q == p || (*q != '\r' && *q != ';') || nl[-1] != '\r')
        return -EPROTO;
    rp->left = size;
    rp->state = size ? RP_CHUNK_DATA : RP_TRAILER;
    return nl + 1 - p;
}

static void rp_deliver(rp_t *rp, const char *p, size_t n)
{
    rp->body_bytes += n;
    if (rp->sink && n)
        rp->sink(rp->ctx, p, n);
}

ssize_t rp_feed(rp_t *rp, const char *p, size_t n)
{
    size_t off = 0;
    while (off < n && rp->state != RP_DONE) {
        const char *q = p + off;
        size_t m = n - off, take;
        ssize_t r;
        switch (rp->state) {
        case RP_HEAD:
            r = rp_head(rp, q, m);
            if (r <= 0)
                return r < 0 ? r : (ssize_t)off;
            off += (size_t)r;
            break;
        case RP_BODY:
        case RP_CHUNK_DATA:
            take = (size_t)MIN((uint64_t)m, rp->left);
            rp_deliver(rp, q, take);
            rp->left -= take;
            off += take;
            if (rp->left == 0)
                rp->state = rp->state == RP_BODY ? RP_DONE : RP_CHUNK_END;
            break;
        case RP_EOF_BODY:
            rp_deliver(rp, q, m);
            off += m;
            break;
        case RP_CHUNK_SIZE:
            r = rp_chunk_size(rp, q, m);
            if (r <= 0)
                return r < 0 ? r : (ssize_t)off;
            off += (size_t)r;
            break;
        case RP_CHUNK_END:
            if (m < 2)
                return (ssize_t)off;
            if (q[0] != '\r' || q[1] != '\n')
                return -EPROTO;
            off += 2;
            rp->state = RP_CHUNK_SIZE;
            break;
        case RP_TRAILER: {
            const char *nl = memchr(q, '\n', m);
            if (!nl)
                return m > 1024 ? -EPROTO : (ssize_t)off;
            if (nl == q + 1 && q[0] == '\r')
                rp->state = RP_DONE;
            off += (size_t)(nl + 1 - q);
            break;
        }
        case RP_DONE: break;
        }
    }
    return (ssize_t)off;
}

int rp_eof(rp_t *rp)
{
    if (rp->state != RP_EOF_BODY)
        return -ECONNRESET;
    rp->state = RP_DONE;
    return 0;
}

/* ---- HTTP client connection -------------------------------------------------------------- */

void hc_close(hc_t *h)
{
    h->fd = safe_close(h->fd);
    free(h->buf);
    h->buf = NULL;
}

static int tcp_connect(uint16_t port)
{
    _cleanup_close_ int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return negative_errno();
    struct sockaddr_in a = { .sin_family = AF_INET,
                             .sin_port = htons(port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0)
        return negative_errno();
    int one = 1;
    struct timeval tv = { .tv_sec = RECV_TIMEOUT_S };
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    return TAKE_FD(fd);
}

int hc_open(hc_t *h, uint16_t port, size_t cap)
{
    *h = (hc_t){ .fd = -EBADF, .cap = cap };
    h->buf = malloc(cap);
    if (!h->buf)
        return -ENOMEM;
    h->fd = tcp_connect(port);
    if (h->fd < 0) {
        int r = h->fd;
        hc_close(h);
        return r;
    }
    return 0;
}

int send_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return negative_errno();
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

int send_all_io(int fd, sockio_t *io, const void *p, size_t n)
{
    if (!io)
        return send_all(fd, p, n);
    const char *c = p;
    while (n > 0) {
        ssize_t w = io->ops->send(io, c, n);
        if (w == -EAGAIN || w == -EINTR)
            continue; /* a blocking socket: only a signal or a timeout */
        if (w < 0)
            return (int)w;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

int hc_feed(hc_t *h, rp_t *rp)
{
    ssize_t r = rp_feed(rp, h->buf + h->off, h->len);
    if (r < 0)
        return (int)r;
    h->off += (size_t)r;
    h->len -= (size_t)r;
    if (h->len == 0)
        h->off = 0;
    return rp->state == RP_DONE;
}

ssize_t hc_recv(hc_t *h, int flags)
{
    if (h->off > 0) { /* what is left is an unfinished head or chunk line: small */
        memmove(h->buf, h->buf + h->off, h->len);
        h->off = 0;
    }
    if (h->len == h->cap)
        return -ENOBUFS;
    for (;;) {
        ssize_t n = h->io ? h->io->ops->recv(h->io, h->buf + h->len, h->cap - h->len)
                          : recv(h->fd, h->buf + h->len, h->cap - h->len, flags);
        if (h->io && n == -EAGAIN) /* a timeout on the blocking socket */
            return -ETIMEDOUT;
        if (h->io && n < 0)
            return n;
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return negative_errno();
        h->len += (size_t)n;
        return n;
    }
}

int hc_response(hc_t *h, rp_t *rp)
{
    for (;;) {
        int r = hc_feed(h, rp);
        if (r != 0)
            return r < 0 ? r : 0;
        ssize_t n = hc_recv(h, 0);
        if (n == 0)
            return rp_eof(rp);
        if (n < 0)
            return (int)n;
    }
}

int build_head(const char *token, char *dst, size_t cap, const char *method, const char *target,
               const char *ctype, int64_t clen)
{
    char tok[256] = "", ct[128] = "", cl[64] = "";
    if (token)
        (void)snprintf(tok, sizeof tok, "X-Sandbox-Token: %s\r\n", token);
    if (ctype)
        (void)snprintf(ct, sizeof ct, "Content-Type: %s\r\n", ctype);
    if (clen >= 0)
        (void)snprintf(cl, sizeof cl, "Content-Length: %lld\r\n", (long long)clen);
    int n = snprintf(dst, cap, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%s%s%s\r\n", method, target,
                     tok, ct, cl);
    return n < 0 || (size_t)n >= cap ? -E2BIG : n;
}

int build_json_request(const char *token, char *dst, size_t cap, const char *target,
                       const char *body)
{
    size_t bl = strlen(body);
    int n = build_head(token, dst, cap, "POST", target, "application/json", (int64_t)bl);
    if (n < 0 || (size_t)n + bl >= cap)
        return -E2BIG;
    memcpy(dst + n, body, bl);
    return n + (int)bl;
}

void small_sink(void *ctx, const char *p, size_t n)
{
    small_body_t *sb = ctx;
    size_t take = MIN(n, sizeof sb->data - 1 - sb->len);
    memcpy(sb->data + sb->len, p, take);
    sb->len += take;
    sb->data[sb->len] = '\0';
}

/* ---- NDJSON exec events ------------------------------------------------------------------ */

void nd_reset(nd_t *nd)
{
    nd->line_len = 0;
    nd->out_bytes = nd->err_bytes = 0;
    nd->events = 0;
    nd->started = nd->exited = nd->bad = false;
    nd->exit_code = -1;
    nd->out_len = nd->err_len = 0;
    nd->pid = 0;
    nd->why[0] = '\0';
}

void nd_free(nd_t *nd)
{
    free(nd->line);
    free(nd->dec);
    nd->line = NULL;
    nd->dec = NULL;
}

void nd_bad(nd_t *nd, const char *fmt, ...)
{
    if (!nd->bad) {
        va_list ap;
        va_start(ap, fmt);
        (void)vsnprintf(nd->why, sizeof nd->why, fmt, ap);
        va_end(ap);
    }
    nd->bad = true;
}

static unsigned char *nd_scratch(nd_t *nd, size_t need)
{
    if (need > nd->dec_cap) {
        unsigned char *d = realloc(nd->dec, need);
        if (!d)
            return NULL;
        nd->dec = d;
        nd->dec_cap = need;
    }
    return nd->dec;
}

/* Decode the payload of an output event into exact bytes. */
static ssize_t nd_payload(nd_t *nd, sv_t data, bool esc, sv_t data_b64, const unsigned char **ret)
{
    if (data_b64.p || nd->base64) {
        sv_t s = data_b64.p ? data_b64 : data;
        unsigned char *d = nd_scratch(nd, s.len / 4 * 3 + 3);
        *ret = d;
        return d ? b64_decode(s.p, s.len, d) : -ENOMEM;
    }
    if (!esc) {
        *ret = (const unsigned char *)data.p;
        return (ssize_t)data.len;
    }
    unsigned char *d = nd_scratch(nd, data.len + 1);
    *ret = d;
    return d ? json_unescape(data.p, data.len, d) : -ENOMEM;
}

/* The decoded bytes of an output event: counted, the first kept, stdout checked for zeros. */
static void nd_bytes(nd_t *nd, bool is_stdout, const unsigned char *bytes, size_t n)
{
    if (!is_stdout) {
        size_t keep = MIN(n, sizeof nd->err - 1 - nd->err_len);
        memcpy(nd->err + nd->err_len, bytes, keep);
        nd->err_len += keep;
        nd->err[nd->err_len] = '\0';
        nd->err_bytes += n;
        return;
    }
    if (nd->check_zero && !all_zero(bytes, n))
        nd_bad(nd, "stdout byte at offset >= %llu is not zero", (unsigned long long)nd->out_bytes);
    size_t keep = MIN(n, sizeof nd->out - nd->out_len);
    memcpy(nd->out + nd->out_len, bytes, keep);
    nd->out_len += keep;
    nd->out_bytes += n;
}

static void nd_output(nd_t *nd, bool is_stdout, sv_t data, bool esc, sv_t data_b64)
{
    const unsigned char *bytes;
    ssize_t n = nd_payload(nd, data, esc, data_b64, &bytes);
    if (n < 0) {
        nd_bad(nd, "undecodable output event (%s)", strerror((int)-n));
        return;
    }
    nd_bytes(nd, is_stdout, bytes, (size_t)n);
}

/* The usual line of a base64 stream, {"event":"stdout","data":"<base64>"} (or stderr), decoded
 * without first scanning its data for the closing quote and for backslashes: data that decodes
 * as base64 holds neither, so the general parser would read the same one event from it. Returns
 * false, having counted nothing, for any other line or data that does not decode; nd_line then
 * parses it (and reports what is wrong). */
static bool nd_line_b64(nd_t *nd, const char *s, size_t len)
{
    static const char head[] = "{\"event\":\"std???\",\"data\":\"";
    const size_t hl = sizeof head - 1;
    if (len < hl + 2 || memcmp(s, head, 13) != 0 || memcmp(s + 16, head + 16, hl - 16) != 0 ||
        s[len - 2] != '"' || s[len - 1] != '}')
        return false;
    bool is_stdout = memcmp(s + 13, "out", 3) == 0;
    if (!is_stdout && memcmp(s + 13, "err", 3) != 0)
        return false;
    size_t n = len - hl - 2;
    unsigned char *d = nd_scratch(nd, n / 4 * 3 + 3);
    ssize_t r = d ? b64_decode(s + hl, n, d) : -ENOMEM;
    if (r < 0)
        return false;
    if (nd->exited)
        nd_bad(nd, "event after exit");
    nd->events++;
    nd_bytes(nd, is_stdout, d, (size_t)r);
    return true;
}

/* One event: a flat JSON object of string, number and literal members. */
static void nd_line(nd_t *nd, const char *s, size_t len)
{
    const char *p = s, *e = s + len;
    sv_t event = { 0 }, data = { 0 }, data_b64 = { 0 }, code = { 0 }, pid = { 0 };
    bool data_esc = false;
    if (nd->base64 && nd_line_b64(nd, s, len))
        return;
    if (p == e || *p++ != '{')
        goto bad;
    while (p < e && *p != '}') {
        sv_t key, val;
        bool esc = false;
        if (scan_string(&p, e, &key, &esc) < 0 || p >= e || *p++ != ':')
            goto bad;
        if (p < e && *p == '"') {
            if (scan_string(&p, e, &val, &esc) < 0)
                goto bad;
        } else {
            const char *t = p;
            while (t < e && *t != ',' && *t != '}')
                t++;
            val = sv_make(p, (size_t)(t - p));
            p = t;
        }
        if (sv_eq(key, SV("event")))
            event = val;
        else if (sv_eq(key, SV("data"))) {
            data = val;
            data_esc = esc;
        } else if (sv_eq(key, SV("data_b64")))
            data_b64 = val;
        else if (sv_eq(key, SV("exit_code")))
            code = val;
        else if (sv_eq(key, SV("pid")))
            pid = val;
        if (p < e && *p == ',')
            p++;
    }
    if (p >= e || !event.p)
        goto bad;
    if (nd->exited)
        nd_bad(nd, "event after exit");
    nd->events++;
    if (sv_eq(event, SV("start"))) {
        if (nd->events != 1)
            nd_bad(nd, "start is not the first event");
        nd->started = true;
        (void)parse_u64(pid, INT32_MAX, &nd->pid);
    } else if (sv_eq(event, SV("stdout")) || sv_eq(event, SV("stderr"))) {
        nd_output(nd, event.p[3] == 'o', data, data_esc, data_b64);
    } else if (sv_eq(event, SV("exit"))) {
        uint64_t c;
        nd->exited = true;
        (void)snprintf(nd->exit_line, sizeof nd->exit_line, "%.*s", (int)MIN(len, 120), s);
        nd->exit_code = parse_u64(code, 255, &c) < 0 ? -1 : (int64_t)c;
    } else if (!sv_eq(event, SV("ping"))) {
        nd_bad(nd, "unknown event " SV_FMT, SV_ARG(event));
    }
    return;
bad:
    nd_bad(nd, "malformed event line (%zu bytes)", len);
}

/* Body sink: split the chunked body into lines; whole lines are decoded in place. */
void nd_sink(void *ctx, const char *p, size_t n)
{
    nd_t *nd = ctx;
    while (n > 0) {
        const char *nl = memchr(p, '\n', n);
        size_t take = nl ? (size_t)(nl - p) : n;
        if (nl && nd->line_len == 0) {
            nd_line(nd, p, take);
        } else {
            if (nd->line_len + take > NDJSON_LINE_MAX) {
                nd_bad(nd, "event line longer than %llu bytes",
                       (unsigned long long)NDJSON_LINE_MAX);
                return;
            }
            if (nd->line_len + take + 1 > nd->line_cap) {
                size_t cap = MAX(nd->line_cap * 2, nd->line_len + take + 1);
                char *l = realloc(nd->line, cap);
                if (!l) {
                    nd_bad(nd, "out of memory");
                    return;
                }
                nd->line = l;
                nd->line_cap = cap;
            }
            memcpy(nd->line + nd->line_len, p, take);
            nd->line_len += take;
            if (nl) {
                nd->line[nd->line_len] = '\0';
                nd_line(nd, nd->line, nd->line_len);
                nd->line_len = 0;
            }
        }
        size_t used = take + (nl ? 1 : 0);
        p += used;
        n -= used;
    }
}

int nd_check(nd_t *nd, const rp_t *rp)
{
    if (rp->status != 200)
        nd_bad(nd, "HTTP status %d", rp->status);
    else if (nd->line_len)
        nd_bad(nd, "stream ended inside an event line");
    else if (!nd->started)
        nd_bad(nd, "no start event");
    else if (!nd->exited)
        nd_bad(nd, "no exit event");
    else if (nd->exit_code != 0)
        nd_bad(nd, "exit_code %lld", (long long)nd->exit_code);
    return nd->bad ? -EBADMSG : 0;
}
