/* SPDX-License-Identifier: MIT */
#include "http.h"

#include <string.h>

#include "common/macro.h"

/* RFC 9110 tchar. */
static bool is_tchar(unsigned char c)
{
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
        return true;
    return c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static bool is_vchar(unsigned char c) { return c > 0x20 && c < 0x7F; }

/* A byte of a field value (header or trailer) or a chunk extension: visible, space or tab. */
static bool is_field_char(unsigned char c) { return is_vchar(c) || c == ' ' || c == '\t'; }

/* Find the CRLF ending the line starting at `pos`; bare CR or LF is an error. */
static int find_eol(const char *buf, size_t len, size_t pos, size_t *ret_eol)
{
    for (size_t i = pos; i < len; i++) {
        if (buf[i] == '\r') {
            if (i + 1 >= len)
                return 0;
            if (buf[i + 1] != '\n')
                return -EBADMSG;
            *ret_eol = i;
            return 1;
        }
        if (buf[i] == '\n')
            return -EBADMSG;
    }
    return 0;
}

static int parse_request_line(sv_t line, http_request_t *req)
{
    size_t i = 0;
    while (i < line.len && is_tchar((unsigned char)line.p[i]))
        i++;
    if (i == 0 || i >= line.len || line.p[i] != ' ')
        return -EBADMSG;
    req->method = sv_make(line.p, i);
    size_t t0 = ++i;
    while (i < line.len && is_vchar((unsigned char)line.p[i]))
        i++;
    if (i == t0 || i >= line.len || line.p[i] != ' ')
        return -EBADMSG;
    req->target = sv_make(line.p + t0, i - t0);
    sv_t ver = sv_make(line.p + i + 1, line.len - i - 1);
    if (ver.len != 8 || memcmp(ver.p, "HTTP/", 5) != 0 || ver.p[6] != '.' || ver.p[5] < '0' ||
        ver.p[5] > '9' || ver.p[7] < '0' || ver.p[7] > '9')
        return -EBADMSG;
    if (ver.p[5] != '1')
        return -EPROTONOSUPPORT;
    req->minor = ver.p[7] - '0';
    if (req->target.p[0] != '/')
        return -EBADMSG;
    const char *q = memchr(req->target.p, '?', req->target.len);
    if (q) {
        req->path = sv_make(req->target.p, (size_t)(q - req->target.p));
        req->query = sv_make(q + 1, req->target.len - req->path.len - 1);
    } else {
        req->path = req->target;
        req->query = sv_make(req->target.p + req->target.len, 0);
    }
    return 0;
}

static bool token_list_has(sv_t v, const char *tok)
{
    size_t i = 0;
    while (i < v.len) {
        while (i < v.len && (v.p[i] == ' ' || v.p[i] == '\t' || v.p[i] == ','))
            i++;
        size_t s = i;
        while (i < v.len && v.p[i] != ',' && v.p[i] != ' ' && v.p[i] != '\t')
            i++;
        if (i > s && sv_eq_lit_nocase(sv_make(v.p + s, i - s), tok))
            return true;
    }
    return false;
}

static int parse_header_line(sv_t line, http_header_t *h)
{
    size_t i = 0;
    if (line.len > 0 && (line.p[0] == ' ' || line.p[0] == '\t'))
        return -EBADMSG; /* obs-fold */
    while (i < line.len && is_tchar((unsigned char)line.p[i]))
        i++;
    if (i == 0 || i >= line.len || line.p[i] != ':')
        return -EBADMSG; /* empty name, non-token byte, or space before the colon */
    h->name = sv_make(line.p, i);
    i++;
    while (i < line.len && (line.p[i] == ' ' || line.p[i] == '\t'))
        i++;
    size_t end = line.len;
    while (end > i && (line.p[end - 1] == ' ' || line.p[end - 1] == '\t'))
        end--;
    for (size_t k = i; k < end; k++) {
        if (!is_field_char((unsigned char)line.p[k]))
            return -EBADMSG; /* control or non-ASCII byte */
    }
    h->value = sv_make(line.p + i, end - i);
    return 0;
}

/* Apply the framing headers; duplicates must agree. */
static int apply_header(http_request_t *req, const http_header_t *h, sv_t *host)
{
    if (sv_eq_lit_nocase(h->name, "content-length")) {
        uint64_t v;
        if (parse_u64(h->value, HTTP_MAX_CONTENT_LENGTH, &v) < 0)
            return -EBADMSG;
        if (req->has_content_length && v != req->content_length)
            return -EBADMSG;
        req->has_content_length = true;
        req->content_length = v;
    } else if (sv_eq_lit_nocase(h->name, "transfer-encoding")) {
        req->has_transfer_encoding = true;
    } else if (sv_eq_lit_nocase(h->name, "host")) {
        if (host->p && !sv_eq(*host, h->value))
            return -EBADMSG;
        *host = h->value;
    } else if (sv_eq_lit_nocase(h->name, "connection")) {
        if (token_list_has(h->value, "close"))
            req->keep_alive = false;
        else if (token_list_has(h->value, "keep-alive"))
            req->keep_alive = true;
        if (token_list_has(h->value, "upgrade"))
            req->upgrade = true;
    }
    return 0;
}

int http_parse_request(const char *buf, size_t len, http_request_t *req)
{
    size_t scan = len > HTTP_MAX_HEAD ? HTTP_MAX_HEAD : len;
    size_t eol, pos = 0;
    int r;

    memset(req, 0, offsetof(http_request_t, headers));
    req->n_headers = 0;
    req->has_content_length = req->has_transfer_encoding = req->upgrade = false;
    req->content_length = 0;

    r = find_eol(buf, scan, 0, &eol);
    if (r <= 0)
        return r < 0 ? r : (len >= HTTP_MAX_HEAD ? -EMSGSIZE : 0);
    r = parse_request_line(sv_make(buf, eol), req);
    if (r < 0)
        return r;
    req->keep_alive = req->minor >= 1;
    pos = eol + 2;

    sv_t host = { NULL, 0 };
    for (;;) {
        r = find_eol(buf, scan, pos, &eol);
        if (r <= 0)
            return r < 0 ? r : (len >= HTTP_MAX_HEAD ? -EMSGSIZE : 0);
        if (eol == pos)
            break;
        if (req->n_headers >= HTTP_MAX_HEADERS)
            return -EMSGSIZE;
        http_header_t *h = &req->headers[req->n_headers];
        r = parse_header_line(sv_make(buf + pos, eol - pos), h);
        if (r < 0)
            return r;
        r = apply_header(req, h, &host);
        if (r < 0)
            return r;
        req->n_headers++;
        pos = eol + 2;
    }
    if (req->has_content_length && req->has_transfer_encoding)
        return -EBADMSG;
    req->head_len = eol + 2;
    return (int)req->head_len;
}

bool http_header_get(const http_request_t *req, const char *name, sv_t *ret)
{
    for (size_t i = 0; i < req->n_headers; i++)
        if (sv_eq_lit_nocase(req->headers[i].name, name)) {
            *ret = req->headers[i].value;
            return true;
        }
    return false;
}

enum {
    CK_SIZE,
    CK_EXT,
    CK_SIZE_LF,
    CK_DATA,
    CK_DATA_CR,
    CK_DATA_LF,
    CK_TRAILER, /* at the start of a trailer line, or of the final empty line */
    CK_TNAME,   /* a trailer field's name */
    CK_TVALUE,  /* its value, up to CR */
    CK_TLINE_LF,
    CK_END
};

/* Trailers a chunked body may carry, in all: beyond, it is refused. */
#define CK_TRAILERS_MAX 8192

bool http_te_chunked(const http_request_t *req)
{
    sv_t v;
    return req->has_transfer_encoding && http_header_get(req, "transfer-encoding", &v) &&
           sv_eq_lit_nocase(v, "chunked");
}

static int hexval(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

ssize_t http_scan_chunks(http_chunks_t *k, const char *p, size_t n, bool *done)
{
    *done = false;
    for (size_t i = 0; i < n;) {
        char ch = p[i];
        if (k->st >= CK_TRAILER && ++k->trailer_bytes > CK_TRAILERS_MAX)
            return -1;
        switch (k->st) {
        case CK_SIZE: {
            int v = hexval(ch);
            if (v >= 0 && k->digits < 15) {
                k->size = k->size * 16 + (uint64_t)v;
                k->digits++;
            } else if (k->digits > 0 && (ch == ';' || ch == ' ' || ch == '\t'))
                k->st = CK_EXT;
            else if (k->digits > 0 && ch == '\r')
                k->st = CK_SIZE_LF;
            else
                return -1;
            i++;
            break;
        }
        case CK_EXT: /* field characters up to CR (no bare LF, no control byte) */
            if (ch == '\r')
                k->st = CK_SIZE_LF;
            else if (!is_field_char((unsigned char)ch))
                return -1;
            i++;
            break;
        case CK_SIZE_LF:
            if (ch != '\n')
                return -1;
            k->st = k->size == 0 ? CK_TRAILER : CK_DATA;
            i++;
            break;
        case CK_DATA: {
            uint64_t take = MIN(k->size, (uint64_t)(n - i));
            i += (size_t)take;
            k->size -= take;
            if (k->size == 0)
                k->st = CK_DATA_CR;
            break;
        }
        case CK_DATA_CR:
            if (ch != '\r')
                return -1;
            k->st = CK_DATA_LF;
            i++;
            break;
        case CK_DATA_LF:
            if (ch != '\n')
                return -1;
            *k = (http_chunks_t){ .st = CK_SIZE };
            i++;
            break;
        /* Trailer lines are fields (name ":" value CRLF) and nothing else: a line a relay took
         * for a trailer while its client ends the body there (a bare LF) would let the rest
         * pass as the client's next response (a red-team pass forged another run's answer
         * that way). */
        case CK_TRAILER:
            if (ch == '\r')
                k->st = CK_END;
            else if (is_tchar((unsigned char)ch))
                k->st = CK_TNAME;
            else
                return -1;
            i++;
            break;
        case CK_TNAME:
            if (ch == ':')
                k->st = CK_TVALUE;
            else if (!is_tchar((unsigned char)ch))
                return -1;
            i++;
            break;
        case CK_TVALUE:
            if (ch == '\r')
                k->st = CK_TLINE_LF;
            else if (!is_field_char((unsigned char)ch))
                return -1;
            i++;
            break;
        case CK_TLINE_LF:
            if (ch != '\n')
                return -1;
            k->st = CK_TRAILER;
            i++;
            break;
        case CK_END:
            if (ch != '\n')
                return -1;
            *done = true;
            return (ssize_t)(i + 1);
        default: return -1;
        }
    }
    return (ssize_t)n;
}

ssize_t http_chunked_decode(char *p, size_t n)
{
    size_t in = 0, out = 0;
    for (;;) {
        uint64_t size = 0;
        int digits = 0, v;
        while (in < n && (v = hexval(p[in])) >= 0) {
            if (++digits > 15)
                return -EBADMSG;
            size = size * 16 + (uint64_t)v;
            in++;
        }
        if (digits == 0)
            return -EBADMSG;
        const char *eol = memmem(p + in, n - in, "\r\n", 2); /* after extensions */
        if (!eol)
            return -EBADMSG;
        in = (size_t)(eol - p) + 2;
        if (size == 0)
            return (ssize_t)out; /* trailers follow; nothing of them is payload */
        if (size > n - in || n - in - size < 2 || p[in + size] != '\r' || p[in + size + 1] != '\n')
            return -EBADMSG;
        memmove(p + out, p + in, (size_t)size);
        out += (size_t)size;
        in += (size_t)size + 2;
    }
}
