/* SPDX-License-Identifier: MIT */
/* The bench client's event decoding (bench/bench_http.c). Its base64 decoder: the SSSE3 path
 * (b64_decode) against the scalar one (b64_decode_scalar) and against the decoder they replaced
 * (kept below as the reference): the same result for every input, valid or not. Inputs and
 * outputs are heap blocks of the exact size, so the sanitizer build sees any read or write past
 * them. Then NDJSON exec events: the shortcut for base64 output lines gives what the general
 * parser gives, and JSON escapes (runs of \u00XX included) decode to the right bytes. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "bench_http.h"
#include "tap.h"

/* The decoder before the SSSE3 one, as it was: character -> value + 1, 0 = not base64. */
static ssize_t ref_decode(const char *s, size_t n, unsigned char *out)
{
    static const char alpha[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    unsigned char t[256] = { 0 };
    for (unsigned i = 0; i < 64; i++)
        t[(unsigned char)alpha[i]] = (unsigned char)(i + 1);
    if (n % 4)
        return -EINVAL;
    if (n == 0)
        return 0;
    size_t pad = (s[n - 1] == '=') + (s[n - 2] == '=');
    size_t full = n / 4 - (pad ? 1 : 0);
    const unsigned char *u = (const unsigned char *)s;
    unsigned char *o = out;
    for (size_t i = 0; i < full; i++, u += 4, o += 3) {
        unsigned a = t[u[0]], b = t[u[1]], c = t[u[2]], d = t[u[3]];
        if (!a || !b || !c || !d)
            return -EINVAL;
        uint32_t v = (a - 1) << 18 | (b - 1) << 12 | (c - 1) << 6 | (d - 1);
        o[0] = (unsigned char)(v >> 16);
        o[1] = (unsigned char)(v >> 8);
        o[2] = (unsigned char)v;
    }
    if (pad) {
        unsigned a = t[u[0]], b = t[u[1]];
        unsigned c = pad == 1 ? t[u[2]] : 1;
        if (!a || !b || !c)
            return -EINVAL;
        uint32_t v = (a - 1) << 18 | (b - 1) << 12 | (c - 1) << 6;
        *o++ = (unsigned char)(v >> 16);
        if (pad == 1)
            *o++ = (unsigned char)(v >> 8);
    }
    return o - out;
}

static size_t encode(char *d, const unsigned char *p, size_t n)
{
    static const char alpha[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *start = d;
    for (size_t i = 0; i < n; i += 3, d += 4) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) |
                     (i + 2 < n ? p[i + 2] : 0);
        d[0] = alpha[v >> 18];
        d[1] = alpha[v >> 12 & 63];
        d[2] = i + 1 < n ? alpha[v >> 6 & 63] : '=';
        d[3] = i + 2 < n ? alpha[v & 63] : '=';
    }
    return (size_t)(d - start);
}

static uint64_t rng_state = 0x5eed0b64u;

static uint64_t rnd(void) /* splitmix64: the same sequence on every run */
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15u);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    return z ^ (z >> 31);
}

/* Decode s[0..n) three ways, each from its own exact-size copy into an exact-size output. */
typedef struct {
    ssize_t r[3];
    unsigned char *out[3];
} three_t;

static void three_free(three_t *t)
{
    for (int k = 0; k < 3; k++)
        free(t->out[k]);
}

static bool three(const char *s, size_t n, three_t *t)
{
    ssize_t (*const dec[3])(const char *, size_t,
                            unsigned char *) = { ref_decode, b64_decode_scalar, b64_decode };
    *t = (three_t){ { 0 } };
    for (int k = 0; k < 3; k++) {
        size_t cap = n / 4 * 3;
        char *in = malloc(n ? n : 1);
        t->out[k] = malloc(cap ? cap : 1);
        if (!in || !t->out[k]) {
            free(in);
            return false;
        }
        memcpy(in, s, n);
        t->r[k] = dec[k](in, n, t->out[k]);
        free(in);
    }
    return true;
}

/* All three agree: the same result, and the same bytes when it is a length. */
#define ASSERT_AGREE(s, n, t)                                                                      \
    do {                                                                                           \
        ASSERT_TRUE(three(s, n, t));                                                               \
        if ((t)->r[1] != (t)->r[0] || (t)->r[2] != (t)->r[0])                                      \
            tap_print_bytes_("input", s, n);                                                       \
        ASSERT_EQ((t)->r[1], (t)->r[0]);                                                           \
        ASSERT_EQ((t)->r[2], (t)->r[0]);                                                           \
        if ((t)->r[0] > 0) {                                                                       \
            ASSERT_MEMEQ((t)->out[1], (size_t)(t)->r[1], (t)->out[0], (size_t)(t)->r[0]);          \
            ASSERT_MEMEQ((t)->out[2], (size_t)(t)->r[2], (t)->out[0], (size_t)(t)->r[0]);          \
        }                                                                                          \
    } while (0)

TEST(cpu)
{
#if defined(__x86_64__)
    printf("# ssse3: %s\n", __builtin_cpu_supports("ssse3") ? "yes, b64_decode takes the SIMD path"
                                                            : "no: both paths are scalar here");
#else
    printf("# not x86-64: both paths are scalar here\n");
#endif
}

TEST(known)
{
    static const struct {
        const char *in;
        ssize_t r;
        const char *out;
    } cases[] = {
        { "", 0, "" },
        { "Zg==", 1, "f" },
        { "Zm8=", 2, "fo" },
        { "Zm9v", 3, "foo" },
        { "Zm9vYg==", 4, "foob" },
        { "Zm9vYmFyYmF6cXV4cXV1eGNvcmdlZ3JhdWx0Z2FycGx5d2FsZG9mcmVk", 42,
          "foobarbazquxquuxcorgegraultgarplywaldofred" },
        { "Zh==", 1, "f" }, /* the bits padding drops are not checked */
        { "Zm9", -EINVAL, NULL },
        { "Zm9v=", -EINVAL, NULL },
        { "Z===", -EINVAL, NULL },
        { "====", -EINVAL, NULL },
        { "Zm=v", -EINVAL, NULL },
        { "Zg==Zm9v", -EINVAL, NULL },
        { "Zm9v Zm9", -EINVAL, NULL },
        { "Zm9vZm9vZm9vZm9vZm9vZm9vZm9vZm9-", -EINVAL, NULL },
        { "Zm9vZm9vZm9vZm9vZm9vZm9vZm9vZm9_", -EINVAL, NULL },
        { "Zm9vZm9vZm9vZm9vZm9vZm9vZm9vZm9vZm9vZm9vZm9vZm9vZm9vZm9vZm9vZm\xc3\xa9", -EINVAL, NULL },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        three_t t;
        size_t n = strlen(cases[i].in);
        ASSERT_AGREE(cases[i].in, n, &t);
        ASSERT_EQ(t.r[2], cases[i].r);
        if (cases[i].out)
            ASSERT_MEMEQ(t.out[2], (size_t)t.r[2], cases[i].out, strlen(cases[i].out));
        three_free(&t);
    }
}

/* Every byte value at every place of valid inputs long enough for four SIMD steps and then
 * scalar quads, with tails of 2, 0 and 1 bytes (two, no and one '='). */
TEST(every_byte_everywhere)
{
    unsigned char raw[64];
    char enc[88];
    for (size_t len = 62; len <= 64; len++) {
        for (size_t i = 0; i < len; i++)
            raw[i] = (unsigned char)rnd();
        size_t n = encode(enc, raw, len);
        for (size_t at = 0; at < n; at++) {
            char keep = enc[at];
            for (unsigned c = 0; c < 256; c++) {
                three_t t;
                enc[at] = (char)c;
                ASSERT_AGREE(enc, n, &t);
                three_free(&t);
            }
            enc[at] = keep;
        }
    }
}

static const char interesting[] = "=+/-_ .\n\r\"\\\x7f\x80\xff\x00@[`{/:AZaz09";

TEST(random_round_trip_and_corruption)
{
    enum { ROUNDS = 20000, MAXLEN = 700 };
    unsigned char raw[MAXLEN];
    char enc[(MAXLEN + 2) / 3 * 4];
    size_t rejected = 0;
    for (unsigned round = 0; round < ROUNDS; round++) {
        size_t len = (size_t)(rnd() % (round % 4 ? 64 : MAXLEN + 1));
        for (size_t i = 0; i < len; i++)
            raw[i] = (unsigned char)rnd();
        size_t n = encode(enc, raw, len);
        three_t t;
        ASSERT_AGREE(enc, n, &t);
        ASSERT_MEMEQ(t.out[2], (size_t)t.r[2], raw, len);
        three_free(&t);
        if (n == 0)
            continue;
        /* 1 to 3 characters replaced (an interesting one or any byte), or the length cut */
        unsigned k = 1 + (unsigned)(rnd() % 3);
        for (unsigned j = 0; j < k; j++) {
            uint64_t x = rnd();
            enc[x % n] =
                x >> 32 & 1 ? interesting[(x >> 40) % (sizeof interesting - 1)] : (char)(x >> 48);
        }
        size_t cut = rnd() % 8 == 0 ? (size_t)(rnd() % n) : n;
        ASSERT_AGREE(enc, cut, &t);
        rejected += t.r[0] < 0;
        three_free(&t);
    }
    printf("# %u rounds; %zu corrupted inputs rejected by all three\n", ROUNDS, rejected);
    ASSERT_GT(rejected, ROUNDS / 2);
}

/* ---- NDJSON events ----------------------------------------------------------------------- */

/* Feed text to a fresh decoder in pieces of `step` bytes (0: all at once). */
static void feed(nd_t *nd, bool base64, bool check_zero, const char *text, size_t step)
{
    nd_free(nd);
    *nd = (nd_t){ .base64 = base64, .check_zero = check_zero };
    nd_reset(nd);
    size_t n = strlen(text);
    for (size_t off = 0; off < n;) {
        size_t k = step && n - off > step ? step : n - off;
        nd_sink(nd, text + off, k);
        off += k;
    }
}

#define START "{\"event\":\"start\",\"pid\":42}\n"
#define EXIT "{\"event\":\"exit\",\"exit_code\":0,\"signal\":null}\n"

TEST(nd_base64_stream)
{
    static const char text[] = START "{\"event\":\"stdout\",\"data\":\"AAAAAAAAAAAAAAAAAAAAAAAAAAAA"
                                     "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA==\"}\n"
                                     "{\"event\":\"stderr\",\"data\":\"b29wcw==\"}\n"
                                     "{\"event\":\"stdout\",\"data\":\"\"}\n"
                                     "{\"event\":\"stdout\",\"data\":\"AAA=\"}\n" EXIT;
    nd_t nd = { 0 };
    for (size_t step = 0; step < 9; step++) {
        feed(&nd, true, true, text, step);
        if (nd.bad)
            printf("#     why: %s\n", nd.why);
        ASSERT_FALSE(nd.bad);
        ASSERT_EQ(nd.events, 6);
        ASSERT_TRUE(nd.started && nd.exited);
        ASSERT_EQ(nd.exit_code, 0);
        ASSERT_EQ(nd.pid, 42);
        ASSERT_EQ_U(nd.out_bytes, 55 + 2);
        ASSERT_EQ_U(nd.err_bytes, 4);
        ASSERT_STREQ(nd.err, "oops");
    }
    nd_free(&nd);
}

/* Lines the base64 shortcut must leave to the general parser, which reads them its own way. */
TEST(nd_base64_general_cases)
{
    nd_t nd = { 0 };
    /* data_b64 wins over data; the shortcut would have tried to decode the quote */
    feed(&nd, true, false,
         START "{\"event\":\"stdout\",\"data\":\"AAAA\",\"data_b64\":\"AQID\"}\n" EXIT, 0);
    ASSERT_FALSE(nd.bad);
    ASSERT_MEMEQ(nd.out, nd.out_len, "\x01\x02\x03", 3);
    /* members in another order, spaces: still one stdout event */
    feed(&nd, true, false, START "{\"data\":\"AQID\",\"event\":\"stdout\"}\n" EXIT, 0);
    ASSERT_FALSE(nd.bad);
    ASSERT_MEMEQ(nd.out, nd.out_len, "\x01\x02\x03", 3);
    /* not base64, an escape, an unknown stream: refused with the general parser's words */
    feed(&nd, true, false, START "{\"event\":\"stdout\",\"data\":\"AQI*\"}\n", 0);
    ASSERT_TRUE(nd.bad);
    ASSERT_STREQ(nd.why, "undecodable output event (Invalid argument)");
    feed(&nd, true, false, START "{\"event\":\"stdout\",\"data\":\"AQ\\/D\"}\n", 0);
    ASSERT_TRUE(nd.bad);
    ASSERT_STREQ(nd.why, "undecodable output event (Invalid argument)");
    feed(&nd, true, false, START "{\"event\":\"stdfoo\",\"data\":\"AQID\"}\n", 0);
    ASSERT_TRUE(nd.bad);
    ASSERT_STREQ(nd.why, "unknown event stdfoo");
    /* an output event after exit, through the shortcut */
    feed(&nd, true, false, START EXIT "{\"event\":\"stdout\",\"data\":\"AQID\"}\n", 0);
    ASSERT_TRUE(nd.bad);
    ASSERT_STREQ(nd.why, "event after exit");
    ASSERT_EQ_U(nd.out_bytes, 3);
    /* zeros checked through the shortcut */
    feed(&nd, true, true, START "{\"event\":\"stdout\",\"data\":\"AAAB\"}\n", 0);
    ASSERT_TRUE(nd.bad);
    ASSERT_STREQ(nd.why, "stdout byte at offset >= 0 is not zero");
    nd_free(&nd);
}

TEST(nd_json_escapes)
{
    static const char text[] =
        START "{\"event\":\"stdout\",\"data\":\"\\u0000\\u0000\\u001f\\u007f\\u0080a\\u0000\\n"
              "\\\"\\\\\\/\\b\\f\\r\\t\\u00e9\\u20ac\\ud83d\\ude00\\u0041\\u00\"}\n";
    static const char want[] = "\0\0\x1f\x7f\xc2\x80"
                               "a\0\n\"\\/\b\f\r\t\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"
                               "A";
    nd_t nd = { 0 };
    /* "\u00" at the end is cut short: all before it decoded, then the line refused */
    feed(&nd, false, false, text, 0);
    ASSERT_TRUE(nd.bad);
    ASSERT_STREQ(nd.why, "undecodable output event (Invalid argument)");
    char fixed[sizeof text + 4];
    size_t cut = strlen(text) - strlen("\\u00\"}\n");
    memcpy(fixed, text, cut);
    memcpy(fixed + cut, "\"}\n", 4);
    feed(&nd, false, false, fixed, 0);
    ASSERT_FALSE(nd.bad);
    ASSERT_MEMEQ(nd.out, nd.out_len, want, sizeof want - 1);
    static const char *const bad[] = {
        "\\u00g0", "\\u0", "\\x41", "\\ude00", "\\ud83d\\u0041", "\\"
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char line[128];
        (void)snprintf(line, sizeof line, START "{\"event\":\"stdout\",\"data\":\"a%s\"}\n",
                       bad[i]);
        feed(&nd, false, false, line, 0);
        if (!nd.bad)
            printf("#     accepted: %s\n", bad[i]);
        ASSERT_TRUE(nd.bad);
    }
    nd_free(&nd);
}

TAP_MAIN(T(cpu), T(known), T(every_byte_everywhere), T(random_round_trip_and_corruption),
         T(nd_base64_stream), T(nd_base64_general_cases), T(nd_json_escapes))
