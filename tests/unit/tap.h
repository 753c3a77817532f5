/* SPDX-License-Identifier: MIT */
/* A tiny TAP test harness for the C unit tests.
 *
 *   TEST(name) { ASSERT_EQ(f(1), 2); ... }
 *   TAP_MAIN(T(name), ...)          or, with setup:  tap_run(tests, n) from your own main()
 *
 * Each TEST is one TAP test point. A failed ASSERT prints the expression and both sides as TAP
 * diagnostics ("# ...") and ends that test; the others still run. The exit status is non-zero
 * when any test failed. Output goes to stdout, which meson reads with protocol 'tap'. */
#pragma once

#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    const char *name;
    void (*fn)(void);
    const char *todo; /* a known bug: reported as TAP TODO; passing it is a failure */
} tap_test_t;

/* Set by a failed assertion in the running test. Unit tests are single-threaded. */
static bool tap_failed_;

static inline void tap_diag_(const char *file, int line, const char *expr)
{
    tap_failed_ = true;
    printf("#   %s:%d: assertion failed: %s\n", file, line, expr);
}

/* Print bytes as a C-like string literal, escaping anything that is not printable ASCII. */
static inline void tap_print_bytes_(const char *label, const void *p, size_t n)
{
    const unsigned char *b = p;
    printf("#     %s (%zu bytes): \"", label, n);
    size_t show = n > 512 ? 512 : n;
    for (size_t i = 0; i < show; i++) {
        unsigned char c = b[i];
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c >= 0x20 && c < 0x7F)
            putchar(c);
        else if (c == '\n')
            printf("\\n");
        else if (c == '\r')
            printf("\\r");
        else
            printf("\\x%02x", c);
    }
    printf(n > show ? "\"...\n" : "\"\n");
}

#define TAP_FAIL_(expr) tap_diag_(__FILE__, __LINE__, expr)

/* The expression text is taken at the outermost macro, before its arguments are expanded. */
#define ASSERT_TRUE_(x, text)                                                                      \
    do {                                                                                           \
        if (!(x)) {                                                                                \
            TAP_FAIL_(text);                                                                       \
            return;                                                                                \
        }                                                                                          \
    } while (0)
#define ASSERT_TRUE(x) ASSERT_TRUE_(x, #x)
#define ASSERT_FALSE(x) ASSERT_TRUE_(!(x), "!(" #x ")")

/* Signed integer comparison (any integer type up to 64 bits). */
#define ASSERT_CMP_(a, op, b, text)                                                                \
    do {                                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                                        \
        if (!(a_ op b_)) {                                                                         \
            TAP_FAIL_(text);                                                                       \
            printf("#     left:  %lld\n#     right: %lld\n", a_, b_);                              \
            return;                                                                                \
        }                                                                                          \
    } while (0)
#define ASSERT_EQ(a, b) ASSERT_CMP_(a, ==, b, #a " == " #b)
#define ASSERT_NE(a, b) ASSERT_CMP_(a, !=, b, #a " != " #b)
#define ASSERT_LT(a, b) ASSERT_CMP_(a, <, b, #a " < " #b)
#define ASSERT_LE(a, b) ASSERT_CMP_(a, <=, b, #a " <= " #b)
#define ASSERT_GT(a, b) ASSERT_CMP_(a, >, b, #a " > " #b)
#define ASSERT_GE(a, b) ASSERT_CMP_(a, >=, b, #a " >= " #b)

/* Unsigned 64-bit comparison (sizes, uint64_t values above INT64_MAX). */
#define ASSERT_EQ_U(a, b)                                                                          \
    do {                                                                                           \
        unsigned long long a_ = (unsigned long long)(a), b_ = (unsigned long long)(b);             \
        if (a_ != b_) {                                                                            \
            TAP_FAIL_(#a " == " #b);                                                               \
            printf("#     left:  %llu\n#     right: %llu\n", a_, b_);                              \
            return;                                                                                \
        }                                                                                          \
    } while (0)

/* Byte-exact comparison of two (pointer, length) pairs. */
#define ASSERT_MEMEQ(p, n, q, m) ASSERT_MEMEQ_(p, n, q, m, #p " == " #q)
#define ASSERT_MEMEQ_(p, n, q, m, text)                                                            \
    do {                                                                                           \
        const void *p_ = (p), *q_ = (q);                                                           \
        size_t n_ = (n), m_ = (m);                                                                 \
        if (n_ != m_ || (n_ > 0 && memcmp(p_, q_, n_) != 0)) {                                     \
            TAP_FAIL_(text);                                                                       \
            tap_print_bytes_("left ", p_, n_);                                                     \
            tap_print_bytes_("right", q_, m_);                                                     \
            return;                                                                                \
        }                                                                                          \
    } while (0)

/* NUL-terminated strings; NULL compares equal only to NULL. */
#define ASSERT_STREQ(a, b)                                                                         \
    do {                                                                                           \
        const char *a_ = (a), *b_ = (b);                                                           \
        if (!a_ || !b_ || strcmp(a_, b_) != 0) {                                                   \
            if (a_ || b_) {                                                                        \
                TAP_FAIL_(#a " == " #b);                                                           \
                printf("#     left:  %s%s%s\n", a_ ? "\"" : "", a_ ? a_ : "NULL", a_ ? "\"" : ""); \
                printf("#     right: %s%s%s\n", b_ ? "\"" : "", b_ ? b_ : "NULL", b_ ? "\"" : ""); \
                return;                                                                            \
            }                                                                                      \
        }                                                                                          \
    } while (0)

/* A string view (sv_t) against a string literal. */
#define ASSERT_SV_EQ(v, lit) ASSERT_MEMEQ_((v).p, (v).len, lit, sizeof(lit) - 1, #v " == " #lit)

#define TEST(name) static void test_##name(void)

/* Entries for TAP_MAIN / tap_run. T_TODO marks a test that documents a known bug: it is
 * reported "not ok ... # TODO" (an expected failure) and turns into a failure once it passes,
 * so the marker is removed together with the fix. */
#define T(name) ((tap_test_t){ #name, test_##name, NULL })
#define T_TODO(name, why) ((tap_test_t){ #name, test_##name, why })

static inline int tap_run(const tap_test_t *tests, size_t n)
{
    size_t failed = 0;
    printf("TAP version 13\n1..%zu\n", n);
    for (size_t i = 0; i < n; i++) {
        tap_failed_ = false;
        fflush(stdout);
        tests[i].fn();
        if (tests[i].todo) {
            printf("%s %zu - %s # TODO %s\n", tap_failed_ ? "not ok" : "ok", i + 1, tests[i].name,
                   tests[i].todo);
            failed += !tap_failed_;
        } else {
            printf("%s %zu - %s\n", tap_failed_ ? "not ok" : "ok", i + 1, tests[i].name);
            failed += tap_failed_;
        }
        fflush(stdout);
    }
    if (failed)
        printf("# %zu of %zu tests failed\n", failed, n);
    return failed ? 1 : 0;
}

/* int main(void) running the listed tests in order: TAP_MAIN(T(a), T(b), ...) */
#define TAP_MAIN(...)                                                                              \
    int main(void)                                                                                 \
    {                                                                                              \
        const tap_test_t tests_[] = { __VA_ARGS__ };                                               \
        return tap_run(tests_, sizeof tests_ / sizeof tests_[0]);                                  \
    }
