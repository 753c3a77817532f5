/* SPDX-License-Identifier: MIT */
/* The capped byte buffer (src/common/buf.c): appends past the cap fail with -ENOBUFS and leave
 * the buffer exactly as it was. */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "common/buf.h"
#include "tap.h"

TEST(append_up_to_the_cap)
{
    buf_t b;
    buf_init(&b, 10);
    ASSERT_EQ(buf_append(&b, "0123456789", 10), 0);
    ASSERT_MEMEQ(buf_head(&b), b.len, "0123456789", 10);
    ASSERT_LE(b.cap, 256);
    buf_free(&b);
}

TEST(append_past_the_cap_fails_and_changes_nothing)
{
    buf_t b;
    buf_init(&b, 10);
    ASSERT_EQ(buf_append(&b, "01234567", 8), 0);
    ASSERT_EQ(buf_append(&b, "abc", 3), -ENOBUFS);
    ASSERT_MEMEQ(buf_head(&b), b.len, "01234567", 8);
    ASSERT_EQ(buf_append(&b, "ab", 2), 0); /* control: what fits still fits */
    ASSERT_MEMEQ(buf_head(&b), b.len, "01234567ab", 10);
    ASSERT_EQ(buf_append(&b, "x", 1), -ENOBUFS);
    ASSERT_EQ(buf_append(&b, "", 0), 0);
    ASSERT_EQ_U(b.len, 10);
    buf_free(&b);
}

TEST(reserve_overflow_is_refused)
{
    buf_t b;
    char *space = NULL;
    buf_init(&b, SIZE_MAX);
    ASSERT_EQ(buf_append(&b, "abc", 3), 0);
    ASSERT_EQ(buf_reserve(&b, SIZE_MAX, &space), -ENOBUFS); /* len + extra wraps */
    ASSERT_EQ(buf_reserve(&b, SIZE_MAX - 2, &space), -ENOBUFS);
    ASSERT_TRUE(space == NULL);
    ASSERT_MEMEQ(buf_head(&b), b.len, "abc", 3);
    buf_free(&b);
}

TEST(allocation_never_exceeds_the_cap)
{
    buf_t b;
    char block[1000];
    memset(block, 'z', sizeof block);
    buf_init(&b, 300);
    ASSERT_EQ(buf_append(&b, block, 257), 0); /* doubling 256 -> 512 would overshoot */
    ASSERT_EQ_U(b.cap, 300);
    ASSERT_EQ(buf_append(&b, block, 43), 0);
    ASSERT_EQ_U(b.len, 300);
    ASSERT_EQ_U(b.cap, 300);
    ASSERT_EQ(buf_append(&b, block, 1), -ENOBUFS);
    buf_free(&b);
    ASSERT_TRUE(b.data == NULL);
    ASSERT_EQ_U(b.cap, 0);
}

TEST(consume_then_append_compacts)
{
    buf_t b;
    buf_init(&b, 16);
    ASSERT_EQ(buf_append(&b, "0123456789abcdef", 16), 0);
    buf_consume(&b, 10);
    ASSERT_MEMEQ(buf_head(&b), b.len, "abcdef", 6);
    ASSERT_EQ(buf_append(&b, "ABCDEFGHIJ", 10), 0); /* fits only after moving to the front */
    ASSERT_MEMEQ(buf_head(&b), b.len, "abcdefABCDEFGHIJ", 16);
    ASSERT_EQ(buf_append(&b, "!", 1), -ENOBUFS);
    buf_consume(&b, 100); /* consuming more than there is empties it */
    ASSERT_EQ_U(b.len, 0);
    ASSERT_EQ_U(b.off, 0);
    ASSERT_EQ(buf_append(&b, "xy", 2), 0);
    ASSERT_MEMEQ(buf_head(&b), b.len, "xy", 2);
    buf_free(&b);
}

TEST(reserve_and_commit)
{
    buf_t b;
    char *space;
    buf_init(&b, 64);
    ASSERT_EQ(buf_reserve(&b, 5, &space), 0);
    memcpy(space, "hello", 5);
    buf_commit(&b, 3);
    ASSERT_MEMEQ(buf_head(&b), b.len, "hel", 3);
    ASSERT_EQ(buf_reserve(&b, 61, &space), 0);
    ASSERT_EQ(buf_reserve(&b, 62, &space), -ENOBUFS);
    buf_free(&b);
}

TEST(printf_small_and_large)
{
    buf_t b;
    char big[600];
    memset(big, 'q', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    buf_init(&b, 4096);
    ASSERT_EQ(buf_printf(&b, "%d-%s", 42, "x"), 0);
    ASSERT_MEMEQ(buf_head(&b), b.len, "42-x", 4);
    ASSERT_EQ(buf_printf(&b, "[%s]", big), 0); /* longer than the 256-byte fast path */
    ASSERT_EQ_U(b.len, 4 + 2 + 599);
    ASSERT_EQ(buf_head(&b)[4], '[');
    ASSERT_EQ(buf_head(&b)[b.len - 1], ']');
    ASSERT_EQ(buf_head(&b)[b.len - 2], 'q');
    buf_free(&b);
}

TEST(printf_past_the_cap_fails_and_changes_nothing)
{
    buf_t b;
    char big[600];
    memset(big, 'q', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    buf_init(&b, 100);
    ASSERT_EQ(buf_printf(&b, "%s", "head"), 0);
    ASSERT_EQ(buf_printf(&b, "%s", big), -ENOBUFS);
    ASSERT_EQ(buf_printf(&b, "%.*s", 97, big), -ENOBUFS); /* small path, one byte too many */
    ASSERT_MEMEQ(buf_head(&b), b.len, "head", 4);
    ASSERT_EQ(buf_printf(&b, "%.*s", 96, big), 0); /* control: exactly fills the cap */
    ASSERT_EQ_U(b.len, 100);
    buf_free(&b);
}

/* buf_printf's long path reserves room for vsnprintf's NUL too, so a long result that would
 * exactly fill the cap is refused although it fits (the short path gets this right). */
TEST(printf_long_result_exactly_filling_the_cap)
{
    buf_t b;
    char big[600];
    memset(big, 'q', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    buf_init(&b, 1000);
    ASSERT_EQ(buf_append(&b, big, 401), 0);
    int r = buf_printf(&b, "%s", big); /* 599 bytes: 401 + 599 == 1000 */
    size_t len = b.len;
    buf_free(&b);
    ASSERT_EQ(r, 0);
    ASSERT_EQ_U(len, 1000);
}

TEST(shrink_if_idle)
{
    buf_t b;
    char block[1024] = { 0 };
    buf_init(&b, 1 << 20);
    ASSERT_EQ(buf_append(&b, block, sizeof block), 0);
    buf_shrink_if_idle(&b, 256);
    ASSERT_TRUE(b.data != NULL); /* not idle: kept */
    buf_clear(&b);
    buf_shrink_if_idle(&b, 4096);
    ASSERT_TRUE(b.data != NULL); /* small enough: kept */
    buf_shrink_if_idle(&b, 256);
    ASSERT_TRUE(b.data == NULL); /* idle and large: released */
    ASSERT_EQ(buf_append(&b, "again", 5), 0);
    ASSERT_MEMEQ(buf_head(&b), b.len, "again", 5);
    buf_free(&b);
}

TEST(zero_cap_buffer_refuses_everything)
{
    buf_t b;
    buf_init(&b, 0);
    ASSERT_EQ(buf_append(&b, "a", 1), -ENOBUFS);
    ASSERT_EQ(buf_printf(&b, "%c", 'a'), -ENOBUFS);
    ASSERT_EQ_U(b.len, 0);
    buf_free(&b);
}

/* buf_keep_spares: a block given back is the next buffer's, with what it held not visible;
 * buffers start at the spare size; the set is bounded; 0 turns it off and frees it. */
TEST(spares_are_reused_and_bounded)
{
    buf_t a, b, c;
    buf_init(&a, SIZE_MAX);
    ASSERT_EQ(buf_append(&a, "x", 1), 0);
    ASSERT_EQ_U(a.cap, 256); /* control: off by default, a buffer starts small */
    buf_free(&a);
    ASSERT_EQ_U(buf_spares_held(), 0);

    buf_keep_spares(2);
    buf_init(&a, SIZE_MAX);
    ASSERT_EQ(buf_append(&a, "secret", 6), 0);
    ASSERT_EQ_U(a.cap, BUF_SPARE_SIZE); /* on: one block that fits a head or an answer */
    char *block = a.data;
    buf_free(&a);
    ASSERT_EQ_U(buf_spares_held(), 1);
    buf_init(&b, SIZE_MAX);
    ASSERT_EQ(buf_printf(&b, "%s", "ab"), 0);
    ASSERT_TRUE(b.data == block); /* the same block again, not a malloc */
    ASSERT_MEMEQ(buf_head(&b), b.len, "ab", 2);
    ASSERT_EQ_U(buf_spares_held(), 0);

    buf_init(&c, 100); /* a cap below the block's size: never a spare */
    ASSERT_EQ(buf_append(&c, "y", 1), 0);
    ASSERT_LE(c.cap, 256);
    buf_free(&c);

    buf_t many[4];
    for (int i = 0; i < 4; i++) {
        buf_init(&many[i], SIZE_MAX);
        ASSERT_EQ(buf_append(&many[i], "z", 1), 0);
    }
    for (int i = 0; i < 4; i++)
        buf_free(&many[i]);
    buf_free(&b);
    ASSERT_EQ_U(buf_spares_held(), 2); /* bounded: the others went back to malloc */

    char big[5000];
    memset(big, 'g', sizeof big);
    buf_init(&a, SIZE_MAX); /* a larger first need: grown as before */
    ASSERT_EQ(buf_append(&a, big, sizeof big), 0);
    ASSERT_EQ_U(a.cap, 2 * BUF_SPARE_SIZE);
    ASSERT_EQ_U(buf_spares_held(), 2); /* too big for a block: no spare taken */
    buf_free(&a);
    buf_keep_spares(0);
    ASSERT_EQ_U(buf_spares_held(), 0);
}

TAP_MAIN(T(append_up_to_the_cap), T(append_past_the_cap_fails_and_changes_nothing),
         T(reserve_overflow_is_refused), T(allocation_never_exceeds_the_cap),
         T(consume_then_append_compacts), T(reserve_and_commit), T(printf_small_and_large),
         T(printf_past_the_cap_fails_and_changes_nothing),
         T(printf_long_result_exactly_filling_the_cap), T(shrink_if_idle),
         T(zero_cap_buffer_refuses_everything), T(spares_are_reused_and_bounded))
