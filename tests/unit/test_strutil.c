/* SPDX-License-Identifier: MIT */
/* Strict number parsers, URL decoding, query lookup and UTF-8 validation
 * (src/common/strutil.c). */
#include <errno.h>
#include <string.h>

#include "common/strutil.h"
#include "tap.h"

static sv_t S(const char *s) { return sv_make(s, strlen(s)); }

TEST(sv_helpers)
{
    ASSERT_TRUE(sv_eq(S("abc"), SV("abc")));
    ASSERT_FALSE(sv_eq(S("abc"), SV("abd")));
    ASSERT_FALSE(sv_eq(S("abc"), SV("ab")));
    ASSERT_TRUE(sv_eq(sv_make(NULL, 0), SV("")));
    ASSERT_TRUE(sv_eq_lit_nocase(S("Content-LENGTH"), "content-length"));
    ASSERT_FALSE(sv_eq_lit_nocase(S("content-lengt"), "content-length"));
    ASSERT_FALSE(sv_eq_lit_nocase(S("content_length"), "content-length"));
    ASSERT_TRUE(sv_has_prefix(S("/v1/exec"), SV("/v1/")));
    ASSERT_FALSE(sv_has_prefix(S("/v1"), SV("/v1/")));
}

TEST(parse_u64_accepts)
{
    uint64_t v = 77;
    ASSERT_EQ(parse_u64(S("0"), UINT64_MAX, &v), 0);
    ASSERT_EQ_U(v, 0);
    ASSERT_EQ(parse_u64(S("007"), UINT64_MAX, &v), 0);
    ASSERT_EQ_U(v, 7);
    ASSERT_EQ(parse_u64(S("18446744073709551615"), UINT64_MAX, &v), 0);
    ASSERT_EQ_U(v, UINT64_MAX);
    ASSERT_EQ(parse_u64(S("10"), 10, &v), 0); /* max is inclusive */
    ASSERT_EQ_U(v, 10);
    ASSERT_EQ(parse_u64(sv_make("123456", 3), UINT64_MAX, &v), 0); /* the view, not up to NUL */
    ASSERT_EQ_U(v, 123);
    ASSERT_EQ(parse_u64_str("4096", 4096, &v), 0);
    ASSERT_EQ_U(v, 4096);
}

TEST(parse_u64_refuses)
{
    uint64_t v = 77;
    ASSERT_EQ(parse_u64(S(""), UINT64_MAX, &v), -EINVAL);
    ASSERT_EQ(parse_u64(S("+1"), UINT64_MAX, &v), -EINVAL);
    ASSERT_EQ(parse_u64(S("-1"), UINT64_MAX, &v), -EINVAL);
    ASSERT_EQ(parse_u64(S(" 1"), UINT64_MAX, &v), -EINVAL);
    ASSERT_EQ(parse_u64(S("1 "), UINT64_MAX, &v), -EINVAL);
    ASSERT_EQ(parse_u64(S("0x10"), UINT64_MAX, &v), -EINVAL);
    ASSERT_EQ(parse_u64(S("1e3"), UINT64_MAX, &v), -EINVAL);
    ASSERT_EQ(parse_u64(S("1.0"), UINT64_MAX, &v), -EINVAL);
    ASSERT_EQ(parse_u64(sv_make("1\0", 2), UINT64_MAX, &v), -EINVAL);
    ASSERT_EQ(parse_u64(S("11"), 10, &v), -ERANGE);
    ASSERT_EQ(parse_u64(S("18446744073709551616"), UINT64_MAX, &v), -ERANGE);  /* 2^64 */
    ASSERT_EQ(parse_u64(S("99999999999999999999"), UINT64_MAX, &v), -ERANGE);  /* 20 digits */
    ASSERT_EQ(parse_u64(S("100000000000000000000"), UINT64_MAX, &v), -ERANGE); /* 21 digits */
    ASSERT_EQ(parse_u64_str("12x", 100, &v), -EINVAL);
    ASSERT_EQ_U(v, 77); /* untouched on failure */
}

TEST(parse_octal)
{
    uint32_t m = 1;
    ASSERT_EQ(parse_octal(S("755"), 07777, &m), 0);
    ASSERT_EQ_U(m, 0755);
    ASSERT_EQ(parse_octal(S("0"), 07777, &m), 0);
    ASSERT_EQ_U(m, 0);
    ASSERT_EQ(parse_octal(S("7777"), 07777, &m), 0);
    ASSERT_EQ_U(m, 07777);
    m = 1;
    ASSERT_EQ(parse_octal(S("17777"), 07777, &m), -ERANGE);
    ASSERT_EQ(parse_octal(S("8"), 07777, &m), -EINVAL);
    ASSERT_EQ(parse_octal(S("-1"), 07777, &m), -EINVAL);
    ASSERT_EQ(parse_octal(S(""), 07777, &m), -EINVAL);
    ASSERT_EQ(parse_octal(S("0o7"), 07777, &m), -EINVAL);
    ASSERT_EQ_U(m, 1);
}

TEST(parse_seconds_ms_accepts)
{
    uint64_t ms = 5;
    ASSERT_EQ(parse_seconds_ms(S("1"), 100000, &ms), 0);
    ASSERT_EQ_U(ms, 1000);
    ASSERT_EQ(parse_seconds_ms(S("0"), 100000, &ms), 0);
    ASSERT_EQ_U(ms, 0);
    ASSERT_EQ(parse_seconds_ms(S("0.5"), 100000, &ms), 0);
    ASSERT_EQ_U(ms, 500);
    ASSERT_EQ(parse_seconds_ms(S("2.25"), 100000, &ms), 0);
    ASSERT_EQ_U(ms, 2250);
    ASSERT_EQ(parse_seconds_ms(S("0.001"), 100000, &ms), 0);
    ASSERT_EQ_U(ms, 1);
    ASSERT_EQ(parse_seconds_ms(S("1.2349"), 100000, &ms), 0); /* below 1 ms: truncated */
    ASSERT_EQ_U(ms, 1234);
    ASSERT_EQ(parse_seconds_ms(S("0.0009"), 100000, &ms), 0);
    ASSERT_EQ_U(ms, 0);
    ASSERT_EQ(parse_seconds_ms(S("100"), 100000, &ms), 0); /* max is inclusive */
    ASSERT_EQ_U(ms, 100000);
    ASSERT_EQ(parse_seconds_ms(S("100.000"), 100000, &ms), 0);
    ASSERT_EQ_U(ms, 100000);
}

TEST(parse_seconds_ms_refuses)
{
    uint64_t ms = 5;
    ASSERT_EQ(parse_seconds_ms(S(""), 100000, &ms), -EINVAL);
    ASSERT_EQ(parse_seconds_ms(S("1."), 100000, &ms), -EINVAL);
    ASSERT_EQ(parse_seconds_ms(S(".5"), 100000, &ms), -EINVAL);
    ASSERT_EQ(parse_seconds_ms(S("1.x"), 100000, &ms), -EINVAL);
    ASSERT_EQ(parse_seconds_ms(S("1.2.3"), 100000, &ms), -EINVAL);
    ASSERT_EQ(parse_seconds_ms(S("-1"), 100000, &ms), -EINVAL);
    ASSERT_EQ(parse_seconds_ms(S("1e3"), 100000, &ms), -EINVAL);
    ASSERT_EQ(parse_seconds_ms(S(" 1"), 100000, &ms), -EINVAL);
    ASSERT_EQ(parse_seconds_ms(S("100.001"), 100000, &ms), -ERANGE);
    ASSERT_EQ(parse_seconds_ms(S("101"), 100000, &ms), -ERANGE);
    ASSERT_EQ(parse_seconds_ms(S("99999999999999999999"), 100000, &ms), -ERANGE);
    ASSERT_EQ(parse_seconds_ms(S("1"), 999, &ms), -ERANGE);
    ASSERT_EQ_U(ms, 5);
}

TEST(parse_seconds_ms_large_max_does_not_wrap)
{
    /* max_ms near UINT64_MAX must not let whole * 1000 wrap around into a small number */
    uint64_t ms = 5;
    ASSERT_EQ(parse_seconds_ms(S("18446744073709551"), UINT64_MAX, &ms), 0);
    ASSERT_EQ_U(ms, UINT64_C(18446744073709551000));
    ASSERT_EQ(parse_seconds_ms(S("18446744073709552"), UINT64_MAX, &ms), -ERANGE);
    ASSERT_EQ(parse_seconds_ms(S("18446744073709551.616"), UINT64_MAX, &ms), -ERANGE);
    ASSERT_EQ(parse_seconds_ms(S("18446744073709551.615"), UINT64_MAX, &ms), 0);
    ASSERT_EQ_U(ms, UINT64_MAX);
}

static int decode(const char *in, bool plus, char *out, size_t cap)
{
    return url_decode(S(in), out, cap, plus);
}

TEST(url_decode_good)
{
    char out[64];
    ASSERT_EQ(decode("a%20b", false, out, sizeof out), 3);
    ASSERT_MEMEQ(out, 3, "a b", 3);
    ASSERT_EQ(decode("%2F%2f%41", false, out, sizeof out), 3);
    ASSERT_MEMEQ(out, 3, "//A", 3);
    ASSERT_EQ(decode("a+b", true, out, sizeof out), 3);
    ASSERT_MEMEQ(out, 3, "a b", 3);
    ASSERT_EQ(decode("a+b", false, out, sizeof out), 3);
    ASSERT_MEMEQ(out, 3, "a+b", 3);
    ASSERT_EQ(decode("%2B", true, out, sizeof out), 1); /* an escaped '+' stays a '+' */
    ASSERT_MEMEQ(out, 1, "+", 1);
    ASSERT_EQ(decode("%00%ff", false, out, sizeof out), 2);
    ASSERT_MEMEQ(out, 2, "\0\xff", 2);
    ASSERT_EQ(decode("", false, out, sizeof out), 0);
    ASSERT_EQ(decode("abc", false, out, 3), 3); /* exactly fits */
    ASSERT_MEMEQ(out, 3, "abc", 3);
    ASSERT_EQ(decode("%41%42", false, out, 2), 2);
}

TEST(url_decode_bad)
{
    char out[64];
    ASSERT_EQ(decode("%", false, out, sizeof out), -EINVAL);
    ASSERT_EQ(decode("%4", false, out, sizeof out), -EINVAL);
    ASSERT_EQ(decode("ab%", false, out, sizeof out), -EINVAL);
    ASSERT_EQ(decode("ab%4", false, out, sizeof out), -EINVAL);
    ASSERT_EQ(decode("%zz", false, out, sizeof out), -EINVAL);
    ASSERT_EQ(decode("%4g", false, out, sizeof out), -EINVAL);
    ASSERT_EQ(decode("%g4", false, out, sizeof out), -EINVAL);
    ASSERT_EQ(decode("%%41", false, out, sizeof out), -EINVAL);
    ASSERT_EQ(decode("% 41", false, out, sizeof out), -EINVAL);
    ASSERT_EQ(decode("abcd", false, out, 3), -E2BIG);
    ASSERT_EQ(decode("a", false, out, 0), -E2BIG);
}

TEST(query_get_raw)
{
    sv_t v;
    sv_t q = S("a=1&b=2&flag&empty=&eq=x=y&a=3");
    ASSERT_TRUE(query_get_raw(q, "a", &v));
    ASSERT_SV_EQ(v, "1"); /* the first */
    ASSERT_TRUE(query_get_raw(q, "b", &v));
    ASSERT_SV_EQ(v, "2");
    ASSERT_TRUE(query_get_raw(q, "flag", &v));
    ASSERT_SV_EQ(v, "");
    ASSERT_TRUE(query_get_raw(q, "empty", &v));
    ASSERT_SV_EQ(v, "");
    ASSERT_TRUE(query_get_raw(q, "eq", &v));
    ASSERT_SV_EQ(v, "x=y");
    ASSERT_FALSE(query_get_raw(q, "fla", &v));
    ASSERT_FALSE(query_get_raw(q, "flags", &v));
    ASSERT_FALSE(query_get_raw(q, "c", &v));
    ASSERT_FALSE(query_get_raw(q, "1", &v));
    ASSERT_FALSE(query_get_raw(S(""), "a", &v));
    ASSERT_FALSE(query_get_raw(S("ab=1"), "b", &v));
    ASSERT_TRUE(query_get_raw(S("&&x=9&"), "x", &v));
    ASSERT_SV_EQ(v, "9");
    ASSERT_TRUE(query_get_raw(S("x=1&"), "", &v)); /* the empty part after the last '&' */
    ASSERT_SV_EQ(v, "");
    ASSERT_TRUE(query_get_raw(S("path=%2Ftmp%2Fx"), "path", &v));
    ASSERT_SV_EQ(v, "%2Ftmp%2Fx"); /* still encoded */
    /* the view is bounded: nothing past q.len is looked at */
    ASSERT_FALSE(query_get_raw(sv_make("a=1&b=2", 3), "b", &v));
    ASSERT_TRUE(query_get_raw(sv_make("a=1&b=2", 3), "a", &v));
    ASSERT_SV_EQ(v, "1");
}

static size_t prefix(const char *s, size_t n, size_t *inc)
{
    return utf8_valid_prefix((const unsigned char *)s, n, inc);
}

#define ASSERT_PREFIX(s, want_len, want_inc)                                                       \
    do {                                                                                           \
        size_t inc_ = 99;                                                                          \
        ASSERT_EQ_U(prefix(s, sizeof(s) - 1, &inc_), want_len);                                    \
        ASSERT_EQ_U(inc_, want_inc);                                                               \
    } while (0)

TEST(utf8_valid_sequences)
{
    ASSERT_PREFIX("", 0, 0);
    ASSERT_PREFIX("plain ascii \x01\x7f", 14, 0);
    ASSERT_PREFIX("\xc3\xa9", 2, 0);         /* U+00E9 */
    ASSERT_PREFIX("\xc2\x80", 2, 0);         /* U+0080, smallest 2-byte */
    ASSERT_PREFIX("\xdf\xbf", 2, 0);         /* U+07FF */
    ASSERT_PREFIX("\xe0\xa0\x80", 3, 0);     /* U+0800, smallest 3-byte */
    ASSERT_PREFIX("\xe2\x82\xac", 3, 0);     /* U+20AC */
    ASSERT_PREFIX("\xed\x9f\xbf", 3, 0);     /* U+D7FF, below the surrogates */
    ASSERT_PREFIX("\xee\x80\x80", 3, 0);     /* U+E000, above them */
    ASSERT_PREFIX("\xef\xbf\xbf", 3, 0);     /* U+FFFF */
    ASSERT_PREFIX("\xf0\x90\x80\x80", 4, 0); /* U+10000 */
    ASSERT_PREFIX("\xf0\x9f\x98\x80", 4, 0); /* U+1F600 */
    ASSERT_PREFIX("\xf4\x8f\xbf\xbf", 4, 0); /* U+10FFFF, the last */
    ASSERT_PREFIX("a\303\251b\342\202\254c", 8, 0);
    ASSERT_TRUE(utf8_valid((const unsigned char *)"\xf0\x9f\x98\x80 ok", 7));
}

TEST(utf8_overlongs_surrogates_and_range)
{
    ASSERT_PREFIX("\xc0\x80", 0, 0);             /* overlong NUL */
    ASSERT_PREFIX("\xc0\xaf", 0, 0);             /* overlong '/' */
    ASSERT_PREFIX("\xc1\xbf", 0, 0);             /* overlong U+007F */
    ASSERT_PREFIX("\xe0\x80\x80", 0, 0);         /* overlong 3-byte */
    ASSERT_PREFIX("\xe0\x9f\xbf", 0, 0);         /* overlong U+07FF */
    ASSERT_PREFIX("\xf0\x80\x80\x80", 0, 0);     /* overlong 4-byte */
    ASSERT_PREFIX("\xf0\x8f\xbf\xbf", 0, 0);     /* overlong U+FFFF */
    ASSERT_PREFIX("\xed\xa0\x80", 0, 0);         /* U+D800 surrogate */
    ASSERT_PREFIX("\xed\xbf\xbf", 0, 0);         /* U+DFFF surrogate */
    ASSERT_PREFIX("\xf4\x90\x80\x80", 0, 0);     /* U+110000 */
    ASSERT_PREFIX("\xf5\x80\x80\x80", 0, 0);     /* lead byte above F4 */
    ASSERT_PREFIX("\xf8\x88\x80\x80\x80", 0, 0); /* 5-byte form */
    ASSERT_PREFIX("\xfe", 0, 0);
    ASSERT_PREFIX("\xff", 0, 0);
    ASSERT_PREFIX("\x80", 0, 0);         /* lone continuation */
    ASSERT_PREFIX("ab\277cd", 2, 0);     /* invalid in the middle stops the scan */
    ASSERT_PREFIX("\xc3\x28", 0, 0);     /* lead followed by a non-continuation */
    ASSERT_PREFIX("\xe2\x82\x28", 0, 0); /* third byte not a continuation */
    ASSERT_PREFIX("\xc3\xa9\xc3", 2, 1); /* control: the valid part before a truncation */
    ASSERT_FALSE(utf8_valid((const unsigned char *)"\xed\xa0\x80", 3));
}

TEST(utf8_truncated)
{
    ASSERT_PREFIX("a\xc3", 1, 1);
    ASSERT_PREFIX("a\xe2", 1, 1);
    ASSERT_PREFIX("a\xe2\x82", 1, 2);
    ASSERT_PREFIX("\xf0", 0, 1);
    ASSERT_PREFIX("\xf0\x9f", 0, 2);
    ASSERT_PREFIX("\xf0\x9f\x98", 0, 3);
    ASSERT_PREFIX("\xe0\x80", 0, 0); /* a prefix that can never become valid is invalid */
    ASSERT_PREFIX("\xed\xa0", 0, 0); /* surrogate prefix */
    ASSERT_PREFIX("\xf4\x90", 0, 0); /* beyond U+10FFFF */
    ASSERT_PREFIX("\xe0\xa0", 0, 2); /* control: a good prefix of U+0800 */
    ASSERT_FALSE(utf8_valid((const unsigned char *)"a\xc3", 2));
}

TAP_MAIN(T(sv_helpers), T(parse_u64_accepts), T(parse_u64_refuses), T(parse_octal),
         T(parse_seconds_ms_accepts), T(parse_seconds_ms_refuses),
         T(parse_seconds_ms_large_max_does_not_wrap), T(url_decode_good), T(url_decode_bad),
         T(query_get_raw), T(utf8_valid_sequences), T(utf8_overlongs_surrogates_and_range),
         T(utf8_truncated))
