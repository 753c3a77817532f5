/* SPDX-License-Identifier: MIT */
/* libFuzzer harness: everything the server decodes from a request besides the head.
 *
 * The input is "<query>\n<json body>" (without a newline both parts are the whole input):
 * - query: query_get_raw for the parameter names the routes use, url_decode (both '+' modes,
 *   short output buffers), then parse_u64 / parse_octal / parse_seconds_ms on the raw and the
 *   decoded value, each compared with a slow reference implementation;
 * - body: parsed with jansson and handed to exec_spec_parse, whose result must be consistent;
 * - the whole input: utf8_valid_prefix against a reference decoder, utf8_split_tail, and an
 *   event_encode_output round trip in UTF-8 and base64 mode: the event must be one JSON line
 *   within event_output_max, and "data"/"data_b64" must give back the input exactly. */
#include <errno.h>
#include <jansson.h>
#include <sodium.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/strutil.h"
#include "server/spawn.h"

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        if (!(x)) {                                                                                \
            fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #x);              \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

typedef unsigned __int128 u128;

/* ---- numbers ----------------------------------------------------------------------------- */

/* Reference: 1 = digits only and value in *v (saturated at 2^100), 0 = not a number. */
static int ref_digits(sv_t s, unsigned base, u128 *v)
{
    u128 x = 0, cap = (u128)1 << 100;
    if (s.len == 0)
        return 0;
    for (size_t i = 0; i < s.len; i++) {
        unsigned char c = (unsigned char)s.p[i];
        if (c < '0' || c >= '0' + base)
            return 0;
        x = x * base + (c - '0');
        if (x > cap)
            x = cap;
    }
    *v = x;
    return 1;
}

static void check_u64(sv_t s, uint64_t max)
{
    uint64_t got = 0xdeadbeef;
    u128 want;
    int r = parse_u64(s, max, &got);
    CHECK(r == 0 || r == -EINVAL || r == -ERANGE);
    if (!ref_digits(s, 10, &want)) {
        CHECK(r < 0);
        CHECK(got == 0xdeadbeef);
        return;
    }
    if (want > max) {
        CHECK(r == -ERANGE);
        return;
    }
    if (s.len > 20) /* documented: more than 20 digits is out of range even with leading 0s */
        CHECK(r == 0 || r == -ERANGE);
    else
        CHECK(r == 0);
    if (r == 0)
        CHECK(got == (uint64_t)want);
}

static void check_octal(sv_t s, uint32_t max)
{
    uint32_t got = 0xdeadbeef;
    u128 want;
    int r = parse_octal(s, max, &got);
    CHECK(r == 0 || r == -EINVAL || r == -ERANGE);
    if (!ref_digits(s, 8, &want)) {
        CHECK(r < 0);
        return;
    }
    if (want > max) {
        CHECK(r < 0);
        return;
    }
    if (s.len <= 11)
        CHECK(r == 0);
    if (r == 0)
        CHECK(got == (uint32_t)want);
}

static void check_seconds(sv_t s, uint64_t max_ms)
{
    uint64_t got = 0xdeadbeef;
    int r = parse_seconds_ms(s, max_ms, &got);
    CHECK(r == 0 || r == -EINVAL || r == -ERANGE);
    const char *dot = memchr(s.p, '.', s.len);
    sv_t whole = dot ? sv_make(s.p, (size_t)(dot - s.p)) : s;
    u128 w, f = 0;
    bool ok = ref_digits(whole, 10, &w);
    if (ok && dot) {
        sv_t frac = sv_make(dot + 1, s.len - whole.len - 1);
        u128 all;
        ok = ref_digits(frac, 10, &all);
        /* milliseconds: the first three fraction digits, truncated */
        for (size_t i = 0; ok && i < 3; i++)
            f = f * 10 + (i < frac.len ? (u128)(frac.p[i] - '0') : 0);
    }
    if (!ok) {
        CHECK(r < 0);
        return;
    }
    u128 want = w * 1000 + f;
    if (want > max_ms) {
        CHECK(r == -ERANGE);
        return;
    }
    if (whole.len <= 20)
        CHECK(r == 0);
    if (r == 0)
        CHECK(got == (uint64_t)want);
}

static void check_numbers(sv_t s)
{
    static const uint64_t maxes[] = {
        0, 1, 10, 65535, UINT64_C(1) << 53, UINT64_MAX - 1, UINT64_MAX
    };
    for (size_t i = 0; i < sizeof maxes / sizeof maxes[0]; i++) {
        check_u64(s, maxes[i]);
        check_seconds(s, maxes[i]);
    }
    check_octal(s, 07777);
    check_octal(s, 0777);
    check_octal(s, UINT32_MAX);
}

/* ---- query ------------------------------------------------------------------------------- */

static void check_query(sv_t q)
{
    static const char *const names[] = { "path",   "mode",  "offset", "length",   "timeout",
                                         "signal", "since", "follow", "encoding", "recursive",
                                         "grace",  "wait",  "tag",    "" };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        sv_t raw = { NULL, 0 };
        if (!query_get_raw(q, names[i], &raw))
            continue;
        CHECK(raw.len == 0 || (raw.p >= q.p && raw.p + raw.len <= q.p + q.len));
        CHECK(raw.len == 0 || !memchr(raw.p, '&', raw.len));
        check_numbers(raw);

        size_t cap = raw.len ? raw.len : 1;
        char *out = malloc(cap); /* decoded text is never longer than the input */
        if (!out)
            return;
        for (int plus = 0; plus < 2; plus++) {
            int n = url_decode(raw, out, raw.len, plus);
            CHECK(n == -EINVAL || (n >= 0 && (size_t)n <= raw.len));
            if (n >= 0) {
                check_numbers(sv_make(out, (size_t)n));
                if (n > 0) /* one byte short of room: refused, never written past */
                    CHECK(url_decode(raw, out, (size_t)n - 1, plus) == -E2BIG);
            }
        }
        free(out);
    }
}

/* ---- exec spec --------------------------------------------------------------------------- */

static void check_spec(const char *p, size_t n)
{
    static char *const base_env[] = { "PATH=/usr/bin:/bin", "HOME=/root", "LANG=C.UTF-8",
                                      "NOEQUALS", NULL };
    json_t *o = json_loadb(p, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    if (!o)
        return;
    exec_spec_t spec;
    sbx_err_t err = { 0 };
    int r = exec_spec_parse(o, base_env, &spec, &err);
    CHECK(r == 0 || r == -EINVAL || r == -ENOMEM);
    if (r == -EINVAL)
        CHECK(err.code == r && err.msg[0] != '\0'); /* a refusal says why */
    if (r == 0) {
        CHECK(spec.argv && spec.argv[0]);
        CHECK(spec.envp);
        for (char **e = spec.envp; *e; e++)
            CHECK(strchr(*e, '=') != NULL);
        CHECK(!spec.has_stdin || spec.stdin_data || spec.stdin_len == 0);
        CHECK(spec.timeout_ms <= UINT64_C(31536000000));
        exec_spec_done(&spec);
    }
    json_decref(o);
}

/* ---- UTF-8 and events -------------------------------------------------------------------- */

/* Reference validator: decode code points and reject overlongs, surrogates, > U+10FFFF. */
static size_t ref_utf8_valid_len(const unsigned char *b, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = b[i], need, min;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            need = 1, min = 0x80, cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            need = 2, min = 0x800, cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            need = 3, min = 0x10000, cp = c & 0x07;
        } else {
            return i;
        }
        if (i + need >= n) /* truncated at the end of the input */
            return i;
        for (unsigned k = 1; k <= need; k++) {
            if ((b[i + k] & 0xC0) != 0x80)
                return i;
            cp = (cp << 6) | (b[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return i;
        i += need + 1;
    }
    return i;
}

static unsigned char *b64_decode(json_t *s, size_t *ret_len)
{
    if (!json_is_string(s))
        return NULL;
    size_t l = json_string_length(s), out = 0;
    unsigned char *bin = malloc(l / 4 * 3 + 4);
    if (!bin)
        return NULL;
    if (sodium_base642bin(bin, l / 4 * 3 + 4, json_string_value(s), l, NULL, &out, NULL,
                          sodium_base64_VARIANT_ORIGINAL) != 0) {
        free(bin);
        return NULL;
    }
    *ret_len = out;
    return bin;
}

static void check_event(const unsigned char *p, size_t n, bool base64, bool valid)
{
    size_t max = event_output_max(n);
    char *dst = malloc(max); /* exactly the promised bound: ASan catches a write past it */
    CHECK(dst != NULL);
    size_t len = event_encode_output(dst, base64 ? "stderr" : "stdout", p, n, base64);
    CHECK(len > 0 && len <= max);
    CHECK(dst[len - 1] == '\n' && !memchr(dst, '\n', len - 1));
    json_error_t jerr;
    json_t *o = json_loadb(dst, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
    if (!o)
        fprintf(stderr, "not JSON (%s): %.*s\n", jerr.text, (int)len, dst);
    CHECK(o != NULL);
    free(dst);
    CHECK(json_is_string(json_object_get(o, "event")));
    json_t *data = json_object_get(o, "data"), *d64 = json_object_get(o, "data_b64");
    CHECK(json_is_string(data));
    size_t blen = 0;
    unsigned char *bin = NULL;
    if (base64) {
        CHECK(d64 == NULL);
        bin = b64_decode(data, &blen);
    } else if (valid) {
        CHECK(d64 == NULL); /* valid text travels as itself */
        CHECK(json_string_length(data) == n);
        CHECK(n == 0 || memcmp(json_string_value(data), p, n) == 0);
    } else {
        bin = b64_decode(d64, &blen); /* invalid text: the exact bytes ride along */
        CHECK(utf8_valid((const unsigned char *)json_string_value(data), json_string_length(data)));
    }
    if (base64 || !valid) {
        CHECK(bin != NULL);
        CHECK(blen == n && (n == 0 || memcmp(bin, p, n) == 0));
        free(bin);
    }
    json_decref(o);
}

static void check_utf8_and_events(const unsigned char *p, size_t n)
{
    size_t inc = 99;
    size_t pre = utf8_valid_prefix(p, n, &inc);
    size_t ref = ref_utf8_valid_len(p, n);
    CHECK(pre <= n && inc <= 3 && pre + inc <= n);
    if (inc > 0) /* the incomplete tail ends the input */
        CHECK(pre + inc == n);
    CHECK(pre == ref);
    bool valid = utf8_valid(p, n);
    CHECK(valid == (ref == n));

    utf8_carry_t carry;
    size_t emit = utf8_split_tail(p, n, &carry);
    CHECK(carry.n <= 3 && emit + carry.n == n);
    CHECK(carry.n == 0 || memcmp(carry.b, p + emit, carry.n) == 0);
    if (carry.n)
        CHECK(utf8_valid_prefix(carry.b, carry.n, &inc) == 0 && inc == carry.n);

    check_event(p, n, false, valid);
    check_event(p, n, true, false);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool init;
    if (!init) {
        if (sodium_init() < 0)
            abort();
        init = true;
    }
    if (size > 1 << 16)
        return 0;
    const char *s = (const char *)data;
    const char *nl = memchr(s, '\n', size);
    sv_t query = nl ? sv_make(s, (size_t)(nl - s)) : sv_make(s, size);
    sv_t body = nl ? sv_make(nl + 1, size - query.len - 1) : sv_make(s, size);

    check_query(query);
    check_numbers(query);
    check_spec(body.p, body.len);
    check_utf8_and_events(data, size);
    return 0;
}
