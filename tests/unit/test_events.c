/* SPDX-License-Identifier: MIT */
/* NDJSON output events (src/server/spawn.c): every encoded event is parsed back with jansson
 * and compared byte for byte with what the command wrote. */
#include <jansson.h>
#include <signal.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/strutil.h"
#include "server/spawn.h"
#include "tap.h"

/* Encode p[0..n) and parse the event back. Checks the framing (one JSON object, one trailing
 * newline, nothing else) and the output bound; returns the object or NULL. */
static json_t *encode_parse(const char *stream, const void *p, size_t n, bool base64)
{
    size_t max = event_output_max(n);
    char *dst = malloc(max + 1);
    if (!dst)
        abort();
    size_t len = event_encode_output(dst, stream, p, n, base64);
    if (len > max || len == 0 || dst[len - 1] != '\n' || memchr(dst, '\n', len - 1)) {
        printf("# bad framing: len %zu max %zu\n", len, max);
        free(dst);
        return NULL;
    }
    json_error_t err;
    json_t *o = json_loadb(dst, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &err);
    if (!o)
        printf("# jansson: %s: %.*s\n", err.text, (int)len, dst);
    free(dst);
    return o;
}

/* Base64-decode a JSON string member into a malloc'd buffer. */
static unsigned char *b64_member(json_t *o, const char *key, size_t *ret_len)
{
    json_t *s = json_object_get(o, key);
    if (!json_is_string(s))
        return NULL;
    size_t l = json_string_length(s), out = 0;
    unsigned char *bin = malloc(l / 4 * 3 + 4);
    if (!bin)
        abort();
    if (sodium_base642bin(bin, l / 4 * 3 + 4, json_string_value(s), l, NULL, &out, NULL,
                          sodium_base64_VARIANT_ORIGINAL) != 0) {
        free(bin);
        return NULL;
    }
    *ret_len = out;
    return bin;
}

#define ASSERT_DATA(o, want, want_len)                                                             \
    do {                                                                                           \
        json_t *d_ = json_object_get(o, "data");                                                   \
        ASSERT_TRUE(json_is_string(d_));                                                           \
        ASSERT_MEMEQ(json_string_value(d_), json_string_length(d_), want, want_len);               \
    } while (0)

TEST(ascii_passes_through)
{
    json_t *o = encode_parse("stdout", "hello world", 11, false);
    ASSERT_TRUE(o != NULL);
    ASSERT_STREQ(json_string_value(json_object_get(o, "event")), "stdout");
    ASSERT_DATA(o, "hello world", 11);
    ASSERT_TRUE(json_object_get(o, "data_b64") == NULL);
    ASSERT_EQ_U(json_object_size(o), 2);
    json_decref(o);

    o = encode_parse("stderr", "", 0, false);
    ASSERT_TRUE(o != NULL);
    ASSERT_STREQ(json_string_value(json_object_get(o, "event")), "stderr");
    ASSERT_DATA(o, "", 0);
    json_decref(o);
}

TEST(exact_wire_form)
{
    char dst[256];
    size_t n = event_encode_output(dst, "stdout", (const unsigned char *)"a\"b\\c\n", 6, false);
    static const char want[] = "{\"event\":\"stdout\",\"data\":\"a\\\"b\\\\c\\n\"}\n";
    ASSERT_MEMEQ(dst, n, want, sizeof want - 1);
    n = event_encode_output(dst, "stdout", (const unsigned char *)"\x01\x1f", 2, false);
    static const char want2[] = "{\"event\":\"stdout\",\"data\":\"\\u0001\\u001f\"}\n";
    ASSERT_MEMEQ(dst, n, want2, sizeof want2 - 1);
}

TEST(json_escaping_of_quotes_backslash_and_controls)
{
    unsigned char in[160];
    size_t n = 0;
    for (unsigned c = 0; c < 0x20; c++) { /* every control byte, NUL included */
        in[n++] = (unsigned char)c;
        in[n++] = 'x';
    }
    memcpy(in + n, "\"\\/\x7f end \"\"\\\\", 14);
    n += 14;
    json_t *o = encode_parse("stdout", in, n, false);
    ASSERT_TRUE(o != NULL);
    ASSERT_DATA(o, in, n);
    ASSERT_TRUE(json_object_get(o, "data_b64") == NULL); /* all valid UTF-8: no copy */
    json_decref(o);
}

TEST(valid_multibyte_utf8_passes_through)
{
    static const char s[] =
        "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf \xef\xbf\xbd";
    json_t *o = encode_parse("stdout", s, sizeof s - 1, false);
    ASSERT_TRUE(o != NULL);
    ASSERT_DATA(o, s, sizeof s - 1);
    ASSERT_TRUE(json_object_get(o, "data_b64") == NULL);
    json_decref(o);
}

/* Invalid input: "data" is the lossy text, "data_b64" the exact bytes. */
static void check_invalid(const char *in, size_t n, const char *lossy, size_t lossy_len)
{
    json_t *o = encode_parse("stdout", in, n, false);
    ASSERT_TRUE(o != NULL);
    ASSERT_DATA(o, lossy, lossy_len);
    size_t blen = 0;
    unsigned char *bin = b64_member(o, "data_b64", &blen);
    json_decref(o);
    ASSERT_TRUE(bin != NULL);
    ASSERT_MEMEQ(bin, blen, in, n);
    free(bin);
}

#define FFFD "\xef\xbf\xbd"
#define CHECK_INVALID(in, lossy)                                                                   \
    do {                                                                                           \
        check_invalid(in, sizeof(in) - 1, lossy, sizeof(lossy) - 1);                               \
        if (tap_failed_) {                                                                         \
            printf("#   input: %s\n", #in);                                                        \
            return;                                                                                \
        }                                                                                          \
    } while (0)

TEST(invalid_utf8_gets_replacement_and_exact_bytes)
{
    CHECK_INVALID("a\377b", "a" FFFD "b");
    CHECK_INVALID("\x80", FFFD);
    CHECK_INVALID("\xc0\xaf", FFFD FFFD);                   /* overlong */
    CHECK_INVALID("\xed\xa0\x80", FFFD FFFD FFFD);          /* surrogate */
    CHECK_INVALID("\xf4\x90\x80\x80", FFFD FFFD FFFD FFFD); /* above U+10FFFF */
    CHECK_INVALID("x\xe2\x82", "x" FFFD FFFD);              /* truncated at the end */
    CHECK_INVALID("\xc3(\"\\", FFFD "(\"\\");               /* escaping still applies */
    CHECK_INVALID("\xfe\xff\x00z", FFFD FFFD "\0z");
    CHECK_INVALID("\xc3\xa9\xff", "\xc3\xa9" FFFD); /* valid part kept as is */
}

TEST(all_byte_values_round_trip)
{
    unsigned char in[512];
    for (size_t i = 0; i < sizeof in; i++)
        in[i] = (unsigned char)(i * 7 + 3);
    /* utf8 mode: invalid, so data_b64 must carry the exact bytes */
    json_t *o = encode_parse("stdout", in, sizeof in, false);
    ASSERT_TRUE(o != NULL);
    size_t blen = 0;
    unsigned char *bin = b64_member(o, "data_b64", &blen);
    json_decref(o);
    ASSERT_TRUE(bin != NULL);
    ASSERT_MEMEQ(bin, blen, in, sizeof in);
    free(bin);
}

/* Random mixtures of plain ASCII, escapes, valid sequences at the edges of RFC 3629 and
 * invalid or cut ones, at every alignment (the encoder looks at 8 bytes at a time): data is
 * the input made valid (each byte of a bad sequence one U+FFFD), data_b64 present exactly when
 * something was replaced, and then the input byte for byte. */
/* Pieces of random mixtures: the valid ones first (MIX_VALID of them), then invalid or cut
 * sequences. */
static const char *const mix_pieces[] = {
    "a",
    "plain ascii text ",
    "\"",
    "\\",
    "\n",
    "\x01",
    "\x1f",
    "\x7f",
    " ",
    "\xc3\xa9",
    "\xdf\xbf",
    "\xe0\xa0\x80",
    "\xed\x9f\xbf",
    "\xef\xbf\xbf",
    "\xf0\x90\x80\x80",
    "\xf4\x8f\xbf\xbf",
    "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", /* valid */
    "\xc0\x80",
    "\xc1\xbf",
    "\xe0\x80\x80",
    "\xed\xa0\x80",
    "\xf4\x90\x80\x80",
    "\xf5",
    "\xff",
    "\x80",
    "\xbf",
    "\xe2\x82",
    "\xf0\x9f\x98", /* invalid or cut */
};
#define MIX_VALID 17

/* Up to k random pieces (valid ones only, or any) into in (cap bytes); returns the length. */
static size_t mix(unsigned char *in, size_t cap, unsigned *seed, unsigned k, bool valid_only)
{
    size_t n = 0;
    for (unsigned j = 0; j < k; j++) {
        *seed = *seed * 1103515245u + 12345u;
        const char *pc =
            mix_pieces[(*seed >> 16) % (valid_only ? MIX_VALID : ELEMENTSOF(mix_pieces))];
        size_t l = strlen(pc);
        if (n + l > cap)
            break;
        memcpy(in + n, pc, l);
        n += l;
    }
    return n;
}

TEST(random_mixtures_match_a_bytewise_reference)
{
    unsigned seed = 12345;
    for (int t = 0; t < 40000; t++) {
        unsigned char in[640]; /* up to 40 blocks of the vector validator's 16 bytes */
        seed = seed * 1103515245u + 12345u;
        unsigned k = (seed >> 16) % (t % 2 ? 24 : 96);
        size_t n = mix(in, sizeof in, &seed, k, false);
        if (t % 7 == 0 && n < sizeof in)
            in[n++] = 0; /* a NUL now and then */
        /* the reference: valid prefixes copied, one U+FFFD per byte that does not start one */
        unsigned char want[640 * 3];
        size_t w = 0;
        bool bad = false;
        for (size_t i = 0; i < n;) {
            size_t inc, v = utf8_valid_prefix(in + i, n - i, &inc);
            memcpy(want + w, in + i, v);
            w += v;
            i += v;
            if (i < n) {
                memcpy(want + w, "\xef\xbf\xbd", 3);
                w += 3;
                i++;
                bad = true;
            }
        }
        /* a second opinion on validity: jansson's own UTF-8 check */
        json_t *js = json_stringn((const char *)in, n);
        ASSERT_EQ(js != NULL, !bad);
        json_decref(js);
        json_t *o = encode_parse("stdout", in, n, false);
        ASSERT_TRUE(o != NULL);
        ASSERT_DATA(o, want, w);
        size_t bl = 0;
        unsigned char *b = b64_member(o, "data_b64", &bl);
        ASSERT_EQ(b != NULL, bad);
        if (b)
            ASSERT_MEMEQ(b, bl, in, n);
        free(b);
        json_decref(o);
    }
}

/* The validators and escapes of each width (bytewise, SSSE3, AVX-512; the ones this CPU has)
 * against each other and a bytewise reference, on random mixtures of 64 to 1,000 bytes: the
 * encoder takes the widest path its CPU has, so each must give exactly what the others do. */
TEST(every_vector_path_matches_the_bytewise_one)
{
    static unsigned char in[1000];
    static char want[6 * sizeof in + 16], got[6 * sizeof in + 16];
    unsigned seed = 777, tested[3] = { 0, 0, 0 };
    for (int t = 0; t < 60000; t++) {
        seed = seed * 1103515245u + 12345u;
        unsigned k = 4 + (seed >> 16) % 60;
        /* two in three all valid: the escapes compare on them */
        size_t n = mix(in, sizeof in, &seed, k, t % 3 != 0);
        if (n < 64)
            continue;
        size_t inc;
        int ref = 1;
        for (size_t i = 0; i < n && ref;) {
            size_t v = utf8_valid_prefix(in + i, n - i, &inc);
            i += v;
            if (i < n)
                ref = 0;
        }
        ssize_t wl = json_escape_at(0, want, in, n);
        ASSERT_TRUE(wl >= 0);
        for (unsigned w = 0; w < 3; w++) {
            int v = utf8_valid_at(w == 0 ? 0 : w == 1 ? 16 : 64, in, n);
            if (v < 0)
                continue;
            tested[w]++;
            ASSERT_EQ(v, ref);
            if (!ref)
                continue;
            ssize_t gl = json_escape_at(w == 0 ? 0 : w == 1 ? 16 : 64, got, in, n);
            ASSERT_TRUE(gl >= 0);
            ASSERT_MEMEQ(got, (size_t)gl, want, (size_t)wl);
        }
    }
    ASSERT_TRUE(tested[0] > 10000); /* the vector widths: wherever this CPU has them */
    if (utf8_valid_at(64, (const unsigned char *)"x", 1) < 0)
        fprintf(stderr, "# AVX-512 paths: not on this CPU, not compared\n");
}

/* A sequence cut short at every position, then plain ASCII (whole 16-byte blocks of it, which
 * the vector validator passes with one test): replaced, never passed through. Both tails on
 * every CPU: 16 bytes keep the input under 64 (the 16-byte path even where AVX-512 is), 64
 * bytes take the 64-byte path where the CPU has it. */
TEST(cut_sequences_before_ascii_blocks_are_replaced)
{
    static const char *const cuts[] = { "\xc3", "\xe2\x82", "\xf0\x9f\x98", "\xe2" };
    static const size_t tails[] = { 16, 64 };
    for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++)
        for (size_t t = 0; t < sizeof tails / sizeof tails[0]; t++)
            for (size_t at = 0; at < 40; at++) {
                unsigned char in[128];
                size_t l = strlen(cuts[c]), n = at + l + tails[t];
                memset(in, 'a', sizeof in);
                memcpy(in + at, cuts[c], l);
                json_t *o = encode_parse("stdout", in, n, false);
                ASSERT_TRUE(o != NULL);
                size_t bl = 0;
                unsigned char *b = b64_member(o, "data_b64", &bl);
                ASSERT_TRUE(b != NULL);
                ASSERT_MEMEQ(b, bl, in, n);
                json_t *d = json_object_get(o, "data");
                ASSERT_EQ_U(json_string_length(d), n - l + 3 * l);
                free(b);
                json_decref(o);
            }
}

/* Every 2- and 3-byte pattern, and every 4-byte one with four kinds of last byte, placed
 * across the boundary of two 16-byte blocks in ASCII: the encoder's verdict (a data_b64 copy
 * or not) is the bytewise validator's. */
static bool encoded_as_bad(const unsigned char *in, size_t n)
{
    char dst[64 * 6 + 200];
    size_t len = event_encode_output(dst, "stdout", in, n, false);
    return memmem(dst, len, "\"data_b64\"", 10) != NULL;
}

TEST(every_short_pattern_across_a_block_boundary)
{
    static const unsigned char last[] = { 0x41, 0x80, 0xBF, 0xC0 };
    unsigned char in[48];
    size_t miss = 0;
    for (unsigned a = 0x80; a < 0x100; a++)
        for (unsigned b = 0; b < 0x100; b++)
            for (unsigned c = 0; c < (a >= 0xE0 ? 0x100u : 1u); c++)
                for (unsigned k = 0; k < (a >= 0xF0 ? sizeof last : 1u); k++) {
                    size_t at = 14 + (b + c) % 3, l = a >= 0xF0 ? 4 : a >= 0xE0 ? 3 : 2;
                    memset(in, 'x', sizeof in);
                    in[at] = (unsigned char)a;
                    in[at + 1] = (unsigned char)b;
                    if (l > 2)
                        in[at + 2] = (unsigned char)c;
                    if (l > 3)
                        in[at + 3] = last[k];
                    size_t inc;
                    bool valid = utf8_valid_prefix(in, sizeof in, &inc) == sizeof in;
                    miss += encoded_as_bad(in, sizeof in) == valid;
                }
    ASSERT_EQ_U(miss, 0);
}

/* Every length around the 12-byte steps of the SSSE3 encoder and its 16-byte stop, and the
 * 48-byte steps and 64-byte stop of the AVX-512 one (where the CPU has it), at odd alignments,
 * with bytes of every value: base64 decodes back to exactly the input. */
TEST(base64_round_trips_at_every_length_and_alignment)
{
    unsigned char buf[400];
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (unsigned char)(i * 2654435761u >> 13);
    for (size_t off = 0; off < 4; off++)
        for (size_t n = 0; n + off <= sizeof buf && n < 300; n++) {
            json_t *o = encode_parse("stdout", buf + off, n, true);
            ASSERT_TRUE(o != NULL);
            size_t bl = 0;
            unsigned char *b = b64_member(o, "data", &bl);
            ASSERT_TRUE(b != NULL);
            ASSERT_MEMEQ(b, bl, buf + off, n);
            ASSERT_EQ_U(json_string_length(json_object_get(o, "data")), (n + 2) / 3 * 4);
            free(b);
            json_decref(o);
        }
}

TEST(base64_mode)
{
    unsigned char in[256];
    for (size_t i = 0; i < sizeof in; i++)
        in[i] = (unsigned char)i;
    for (size_t n = 0; n <= 7; n++) { /* every padding length, and then everything */
        size_t len = n == 7 ? sizeof in : n;
        json_t *o = encode_parse("stderr", in, len, true);
        ASSERT_TRUE(o != NULL);
        ASSERT_TRUE(json_object_get(o, "data_b64") == NULL);
        size_t blen = 99;
        unsigned char *bin = b64_member(o, "data", &blen);
        json_decref(o);
        ASSERT_TRUE(bin != NULL);
        ASSERT_MEMEQ(bin, blen, in, len);
        free(bin);
    }
    char dst[128];
    size_t n = event_encode_output(dst, "stdout", (const unsigned char *)"hi\n", 3, true);
    static const char want[] = "{\"event\":\"stdout\",\"data\":\"aGkK\"}\n";
    ASSERT_MEMEQ(dst, n, want, sizeof want - 1);
}

TEST(output_bound_holds_for_worst_cases)
{
    static unsigned char in[4096];
    const unsigned char fills[] = { 0x01, 0xff, '"', 0xc3, 'a' };
    for (size_t f = 0; f < sizeof fills; f++) {
        memset(in, fills[f], sizeof in);
        for (size_t n = 0; n < sizeof in; n = n * 2 + 1) {
            json_t *o = encode_parse("stdout", in, n, false); /* checks len <= max */
            ASSERT_TRUE(o != NULL);
            json_decref(o);
            o = encode_parse("stdout", in, n, true);
            ASSERT_TRUE(o != NULL);
            json_decref(o);
        }
    }
}

static size_t split(const char *s, size_t n, utf8_carry_t *carry)
{
    return utf8_split_tail((const unsigned char *)s, n, carry);
}

#define ASSERT_SPLIT(s, want_emit, want_carry)                                                     \
    do {                                                                                           \
        utf8_carry_t c_ = { .n = 9 };                                                              \
        ASSERT_EQ_U(split(s, sizeof(s) - 1, &c_), want_emit);                                      \
        ASSERT_EQ_U(c_.n, sizeof(s) - 1 - (want_emit));                                            \
        ASSERT_MEMEQ(c_.b, c_.n, want_carry, sizeof(want_carry) - 1);                              \
    } while (0)

TEST(utf8_split_tail_keeps_unfinished_sequences)
{
    ASSERT_SPLIT("ab\xc3", 2, "\xc3");               /* 2-byte, 1 of 2 */
    ASSERT_SPLIT("ab\xe2", 2, "\xe2");               /* 3-byte, 1 of 3 */
    ASSERT_SPLIT("ab\xe2\x82", 2, "\xe2\x82");       /* 3-byte, 2 of 3 */
    ASSERT_SPLIT("\xf0", 0, "\xf0");                 /* 4-byte, 1 of 4 */
    ASSERT_SPLIT("a\xf0\x9f", 1, "\xf0\x9f");        /* 4-byte, 2 of 4 */
    ASSERT_SPLIT("\xf0\x9f\x98", 0, "\xf0\x9f\x98"); /* 4-byte, 3 of 4 */
    ASSERT_SPLIT("ab", 2, "");                       /* controls: complete input */
    ASSERT_SPLIT("", 0, "");
    ASSERT_SPLIT("\xc3\xa9", 2, "");
    ASSERT_SPLIT("\xe2\x82\xac", 3, "");
    ASSERT_SPLIT("\xf0\x9f\x98\x80", 4, "");
    ASSERT_SPLIT("a\xff", 2, "");         /* invalid bytes are not held back */
    ASSERT_SPLIT("a\x80\x80\x80", 4, ""); /* continuation bytes without a lead */
    ASSERT_SPLIT("a\xe0\x80", 3, "");     /* a prefix that can never be valid */
    ASSERT_SPLIT("a\xed\xa0", 3, "");     /* surrogate prefix */
    ASSERT_SPLIT("a\xc3(", 3, "");        /* lead then ASCII: invalid, not held */
}

/* A stream cut at every position still yields the exact text with no replacement. */
TEST(utf8_split_across_reads_reassembles)
{
    static const char text[] = "x\xc3\xa9y\xe2\x82\xacz\xf0\x9f\x98\x80!";
    size_t n = sizeof text - 1;
    for (size_t cut = 0; cut <= n; cut++) {
        char out[256];
        size_t outlen = 0;
        utf8_carry_t carry = { .n = 0 };
        const char *chunks[2] = { text, text + cut };
        size_t lens[2] = { cut, n - cut };
        for (int k = 0; k < 2; k++) {
            unsigned char joined[64];
            memcpy(joined, carry.b, carry.n);
            memcpy(joined + carry.n, chunks[k], lens[k]);
            size_t jl = carry.n + lens[k];
            size_t emit = k == 0 ? utf8_split_tail(joined, jl, &carry) : jl;
            json_t *o = encode_parse("stdout", joined, emit, false);
            ASSERT_TRUE(o != NULL);
            ASSERT_TRUE(json_object_get(o, "data_b64") == NULL);
            json_t *d = json_object_get(o, "data");
            memcpy(out + outlen, json_string_value(d), json_string_length(d));
            outlen += json_string_length(d);
            json_decref(o);
        }
        ASSERT_MEMEQ(out, outlen, text, n);
    }
}

/* A real wait status from a child that exits with `code`, or is killed by `sig`. */
static int child_status(int code, int sig)
{
    pid_t pid = fork();
    if (pid < 0)
        abort();
    if (pid == 0) {
        if (sig)
            (void)kill(getpid(), sig);
        _exit(code);
    }
    int ws = 0;
    if (waitpid(pid, &ws, 0) != pid)
        abort();
    return ws;
}

static json_t *exit_event(int wstatus, bool timed_out, uint64_t ms)
{
    char buf[256];
    int n = event_encode_exit(buf, sizeof buf, wstatus, timed_out, ms);
    if (n <= 0 || (size_t)n >= sizeof buf || buf[n - 1] != '\n')
        return NULL;
    return json_loadb(buf, (size_t)n, JSON_REJECT_DUPLICATES, NULL);
}

TEST(exit_event_exit_code)
{
    json_t *o = exit_event(child_status(3, 0), false, 1234);
    ASSERT_TRUE(o != NULL);
    ASSERT_STREQ(json_string_value(json_object_get(o, "event")), "exit");
    ASSERT_EQ(json_integer_value(json_object_get(o, "exit_code")), 3);
    ASSERT_TRUE(json_is_null(json_object_get(o, "signal")));
    ASSERT_TRUE(json_is_false(json_object_get(o, "timed_out")));
    ASSERT_EQ(json_integer_value(json_object_get(o, "duration_ms")), 1234);
    json_decref(o);

    o = exit_event(child_status(0, 0), false, 0);
    ASSERT_TRUE(o != NULL);
    ASSERT_TRUE(json_is_integer(json_object_get(o, "exit_code")));
    ASSERT_EQ(json_integer_value(json_object_get(o, "exit_code")), 0);
    json_decref(o);

    o = exit_event(child_status(255, 0), false, 0);
    ASSERT_TRUE(o != NULL);
    ASSERT_EQ(json_integer_value(json_object_get(o, "exit_code")), 255);
    json_decref(o);
}

TEST(exit_event_signal)
{
    json_t *o = exit_event(child_status(0, SIGKILL), true, UINT64_C(31536000000));
    ASSERT_TRUE(o != NULL);
    ASSERT_TRUE(json_is_null(json_object_get(o, "exit_code")));
    ASSERT_EQ(json_integer_value(json_object_get(o, "signal")), SIGKILL);
    ASSERT_TRUE(json_is_true(json_object_get(o, "timed_out")));
    ASSERT_EQ(json_integer_value(json_object_get(o, "duration_ms")), INT64_C(31536000000));
    json_decref(o);

    o = exit_event(child_status(0, SIGTERM), false, 5);
    ASSERT_TRUE(o != NULL);
    ASSERT_EQ(json_integer_value(json_object_get(o, "signal")), SIGTERM);
    ASSERT_TRUE(json_is_false(json_object_get(o, "timed_out")));
    json_decref(o);
}

TEST(exit_event_reports_truncation)
{
    char small[16];
    int n = event_encode_exit(small, sizeof small, child_status(1, 0), false, 1);
    ASSERT_GE(n, (int)sizeof small); /* snprintf contract: the caller sees it did not fit */
    ASSERT_EQ(small[sizeof small - 1], '\0');
}

int main(void)
{
    if (sodium_init() < 0)
        return 1;
    const tap_test_t tests[] = {
        T(ascii_passes_through),
        T(exact_wire_form),
        T(json_escaping_of_quotes_backslash_and_controls),
        T(valid_multibyte_utf8_passes_through),
        T(invalid_utf8_gets_replacement_and_exact_bytes),
        T(all_byte_values_round_trip),
        T(random_mixtures_match_a_bytewise_reference),
        T(every_vector_path_matches_the_bytewise_one),
        T(cut_sequences_before_ascii_blocks_are_replaced),
        T(every_short_pattern_across_a_block_boundary),
        T(base64_mode),
        T(base64_round_trips_at_every_length_and_alignment),
        T(output_bound_holds_for_worst_cases),
        T(utf8_split_tail_keeps_unfinished_sequences),
        T(utf8_split_across_reads_reassembles),
        T(exit_event_exit_code),
        T(exit_event_signal),
        T(exit_event_reports_truncation),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0]);
}
