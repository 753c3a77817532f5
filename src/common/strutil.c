/* SPDX-License-Identifier: MIT */
#include "strutil.h"
#include <arpa/inet.h>
#include <netinet/in.h>

#include <ctype.h>
#include <errno.h>
#include <string.h>

bool sv_eq(sv_t a, sv_t b)
{
    return a.len == b.len && (a.len == 0 || memcmp(a.p, b.p, a.len) == 0);
}

static char ascii_lower(char c) { return (c >= 'A' && c <= 'Z') ? (char)(c + 32) : c; }

bool sv_eq_lit_nocase(sv_t a, const char *lit)
{
    size_t n = strlen(lit);
    if (a.len != n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (ascii_lower(a.p[i]) != ascii_lower(lit[i]))
            return false;
    return true;
}

bool sv_has_prefix(sv_t a, sv_t prefix)
{
    return a.len >= prefix.len && memcmp(a.p, prefix.p, prefix.len) == 0;
}

bool sv_has_prefix_lit_nocase(sv_t a, const char *lit)
{
    size_t n = strlen(lit);
    return a.len >= n && sv_eq_lit_nocase(sv_make(a.p, n), lit);
}

int parse_u64(sv_t s, uint64_t max, uint64_t *ret)
{
    uint64_t v = 0;
    if (s.len == 0 || s.len > 20)
        return s.len == 0 ? -EINVAL : -ERANGE;
    for (size_t i = 0; i < s.len; i++) {
        char c = s.p[i];
        if (c < '0' || c > '9')
            return -EINVAL;
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, (uint64_t)(c - '0'), &v))
            return -ERANGE;
    }
    if (v > max)
        return -ERANGE;
    *ret = v;
    return 0;
}

int parse_u64_str(const char *s, uint64_t max, uint64_t *ret)
{
    return parse_u64(sv_make(s, strlen(s)), max, ret);
}

int parse_octal(sv_t s, uint32_t max, uint32_t *ret)
{
    uint64_t v = 0; /* 11 octal digits fit; 32 bits do not (fuzz/corpus: octal-overflow) */
    if (s.len == 0 || s.len > 11)
        return -EINVAL;
    for (size_t i = 0; i < s.len; i++) {
        char c = s.p[i];
        if (c < '0' || c > '7')
            return -EINVAL;
        v = v * 8 + (uint64_t)(c - '0');
        if (v > max)
            return -ERANGE;
    }
    *ret = (uint32_t)v;
    return 0;
}

int parse_seconds_ms(sv_t s, uint64_t max_ms, uint64_t *ret_ms)
{
    size_t dot = s.len;
    for (size_t i = 0; i < s.len; i++)
        if (s.p[i] == '.') {
            dot = i;
            break;
        }
    uint64_t whole = 0, ms = 0;
    int r = parse_u64(sv_make(s.p, dot), max_ms / 1000 + 1, &whole);
    if (r < 0)
        return r;
    if (dot < s.len) {
        sv_t frac = sv_make(s.p + dot + 1, s.len - dot - 1);
        if (frac.len == 0)
            return -EINVAL;
        uint64_t scale = 100;
        for (size_t i = 0; i < frac.len; i++) {
            char c = frac.p[i];
            if (c < '0' || c > '9')
                return -EINVAL;
            ms += (uint64_t)(c - '0') * scale;
            scale /= 10;
        }
    }
    uint64_t total;
    if (__builtin_mul_overflow(whole, 1000, &total) || __builtin_add_overflow(total, ms, &total) ||
        total > max_ms)
        return -ERANGE;
    *ret_ms = total;
    return 0;
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

int url_decode(sv_t in, char *out, size_t outcap, bool plus_is_space)
{
    size_t o = 0;
    for (size_t i = 0; i < in.len; i++) {
        char c = in.p[i];
        if (c == '%') {
            if (i + 2 >= in.len)
                return -EINVAL;
            int h = hexval(in.p[i + 1]), l = hexval(in.p[i + 2]);
            if (h < 0 || l < 0)
                return -EINVAL;
            c = (char)(h * 16 + l);
            i += 2;
        } else if (c == '+' && plus_is_space) {
            c = ' ';
        }
        if (o >= outcap)
            return -E2BIG;
        out[o++] = c;
    }
    return (int)o;
}

bool query_get_raw(sv_t q, const char *name, sv_t *ret)
{
    size_t nlen = strlen(name);
    size_t i = 0;
    while (i <= q.len && q.len > 0) {
        size_t end = i;
        while (end < q.len && q.p[end] != '&')
            end++;
        sv_t part = sv_make(q.p + i, end - i);
        size_t eq = 0;
        while (eq < part.len && part.p[eq] != '=')
            eq++;
        if (eq == nlen && memcmp(part.p, name, nlen) == 0) {
            *ret = eq < part.len ? sv_make(part.p + eq + 1, part.len - eq - 1)
                                 : sv_make(part.p + eq, 0);
            return true;
        }
        if (end >= q.len)
            break;
        i = end + 1;
    }
    return false;
}

/* Length of the UTF-8 sequence starting at b[0], 0 if b[0] cannot start one. */
static size_t utf8_seq_len(unsigned char c)
{
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        return 2;
    if (c >= 0xE0 && c <= 0xEF)
        return 3;
    if (c >= 0xF0 && c <= 0xF4)
        return 4;
    return 0;
}

/* Check continuation bytes with the overlong/surrogate/range rules of RFC 3629. */
static bool utf8_cont_ok(const unsigned char *b, size_t have, size_t n)
{
    for (size_t k = 1; k < have && k < n; k++) {
        unsigned char c = b[k];
        unsigned char lo = 0x80, hi = 0xBF;
        if (k == 1) {
            if (b[0] == 0xE0)
                lo = 0xA0;
            else if (b[0] == 0xED)
                hi = 0x9F;
            else if (b[0] == 0xF0)
                lo = 0x90;
            else if (b[0] == 0xF4)
                hi = 0x8F;
        }
        if (c < lo || c > hi)
            return false;
    }
    return true;
}

size_t utf8_valid_prefix(const unsigned char *buf, size_t len, size_t *ret_incomplete)
{
    size_t i = 0;
    *ret_incomplete = 0;
    while (i < len) {
        if (buf[i] < 0x80) {
            i++;
            continue;
        }
        size_t n = utf8_seq_len(buf[i]);
        if (n == 0)
            return i;
        size_t have = len - i;
        if (!utf8_cont_ok(buf + i, have, n))
            return i;
        if (have < n) {
            *ret_incomplete = have;
            return i;
        }
        i += n;
    }
    return i;
}

bool utf8_valid(const unsigned char *buf, size_t len)
{
    size_t inc;
    return utf8_valid_prefix(buf, len, &inc) == len && inc == 0;
}

bool addr_is_loopback(const char *s)
{
    unsigned char a[16];
    if (inet_pton(AF_INET, s, a) == 1)
        return a[0] == 127;
    return inet_pton(AF_INET6, s, a) == 1 && memcmp(a, in6addr_loopback.s6_addr, 16) == 0;
}

int parse_hostport(const char *s, char *host, size_t hcap, uint16_t *ret_port)
{
    const char *colon = strrchr(s, ':');
    uint64_t p;
    if (!colon || colon == s || (size_t)(colon - s) >= hcap ||
        parse_u64_str(colon + 1, 65535, &p) < 0 || p == 0)
        return -EINVAL;
    size_t hl = (size_t)(colon - s);
    if (s[0] == '[' && hl >= 2 && s[hl - 1] == ']') { /* [::1]:port */
        memcpy(host, s + 1, hl - 2);
        host[hl - 2] = 0;
    } else {
        memcpy(host, s, hl);
        host[hl] = 0;
    }
    unsigned char a[16];
    if (inet_pton(AF_INET, host, a) != 1 && inet_pton(AF_INET6, host, a) != 1)
        return -EINVAL;
    *ret_port = (uint16_t)p;
    return 0;
}

bool env_name_valid(const char *k)
{
    if (!*k || !(isalpha((unsigned char)*k) || *k == '_') || strlen(k) > ENV_NAME_MAX)
        return false;
    for (; *k; k++)
        if (!(isalnum((unsigned char)*k) || *k == '_'))
            return false;
    return true;
}
