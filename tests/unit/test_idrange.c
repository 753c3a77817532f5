/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "isolation/idrange.h"
#include "tap.h"

TEST(parse_accepts_a_range_of_whole_blocks_only_above_zero)
{
    uint32_t s, c;
    ASSERT_EQ(idrange_parse("100000:65536", &s, &c), 0);
    ASSERT_EQ(s, 100000);
    ASSERT_EQ(c, 65536);
    ASSERT_EQ(idrange_parse("100000:65535", &s, &c), -ERANGE);     /* less than one block */
    ASSERT_EQ(idrange_parse("0:131072", &s, &c), -ERANGE);         /* 0 is the host's root */
    ASSERT_EQ(idrange_parse("4294901760:65536", &s, &c), -ERANGE); /* reaches 2^32 - 1 */
    ASSERT_EQ(idrange_parse("100000", &s, &c), -EINVAL);
    ASSERT_EQ(idrange_parse("x:65536", &s, &c), -EINVAL);
    ASSERT_EQ(idrange_parse("1:+65536", &s, &c), -EINVAL);
}

TEST(blocks_are_disjoint_and_exhaustion_is_enospc)
{
    idrange_t r;
    ASSERT_EQ(idrange_init(&r, 100000, 3 * IDRANGE_BLOCK + 5), 0);
    uint32_t a, b, c, d;
    ASSERT_EQ(idrange_take(&r, &a), 0);
    ASSERT_EQ(idrange_take(&r, &b), 0);
    ASSERT_EQ(idrange_take(&r, &c), 0);
    ASSERT_EQ(idrange_take(&r, &d), -ENOSPC); /* the 5 ids left over make no block */
    ASSERT_EQ(a, 100000);
    ASSERT_EQ(b, 100000 + IDRANGE_BLOCK);
    ASSERT_EQ(c, 100000 + 2 * IDRANGE_BLOCK);
    idrange_done(&r);
}

TEST(a_released_block_comes_back_last)
{
    idrange_t r;
    ASSERT_EQ(idrange_init(&r, 200000, 3 * IDRANGE_BLOCK), 0);
    uint32_t a, b, c;
    ASSERT_EQ(idrange_take(&r, &a), 0);
    idrange_release(&r, a);
    ASSERT_EQ(idrange_take(&r, &b), 0);
    ASSERT_TRUE(b != a); /* the next fresh block first: a is reused last */
    ASSERT_EQ(idrange_take(&r, &c), 0);
    ASSERT_TRUE(c != a && c != b);
    idrange_done(&r);
}

TEST(mark_refuses_blocks_outside_the_range_and_twice)
{
    idrange_t r;
    ASSERT_EQ(idrange_init(&r, 300000, 2 * IDRANGE_BLOCK), 0);
    ASSERT_EQ(idrange_mark(&r, 300000 + IDRANGE_BLOCK), 0);
    ASSERT_EQ(idrange_mark(&r, 300000 + IDRANGE_BLOCK), -EEXIST);
    ASSERT_EQ(idrange_mark(&r, 300001), -EINVAL);                     /* not a block start */
    ASSERT_EQ(idrange_mark(&r, 300000 + 2 * IDRANGE_BLOCK), -EINVAL); /* past the end */
    ASSERT_EQ(idrange_mark(&r, 100), -EINVAL);
    uint32_t a, b;
    ASSERT_EQ(idrange_take(&r, &a), 0);
    ASSERT_EQ(a, 300000); /* the marked block is never handed out */
    ASSERT_EQ(idrange_take(&r, &b), -ENOSPC);
    idrange_release(&r, 300000 + IDRANGE_BLOCK);
    ASSERT_EQ(idrange_take(&r, &b), 0);
    ASSERT_EQ(b, 300000 + IDRANGE_BLOCK);
    idrange_done(&r);
}

TEST(a_block_taken_by_a_run_found_at_restart_is_never_handed_out)
{
    idrange_t r;
    ASSERT_EQ(idrange_init(&r, 400000, 3 * IDRANGE_BLOCK), 0);
    ASSERT_EQ(idrange_mark(&r, 400000), 0); /* the first block: a run loaded from disk */
    uint32_t a, b;
    ASSERT_EQ(idrange_take(&r, &a), 0);
    ASSERT_EQ(idrange_take(&r, &b), 0);
    ASSERT_NE(a, 400000);
    ASSERT_NE(b, 400000);
    ASSERT_NE(a, b);
    idrange_done(&r);
}

TEST(subid_file_gives_roots_entry)
{
    char path[] = "/tmp/sbx-subuid-XXXXXX";
    int fd = mkstemp(path);
    ASSERT_TRUE(fd >= 0);
    static const char txt[] = "rootless:100000:65536\nroot:500000:262144\n";
    ASSERT_EQ(write(fd, txt, sizeof txt - 1), (ssize_t)(sizeof txt - 1));
    close(fd);
    uint32_t s, c;
    ASSERT_EQ(idrange_from_subid_file(path, "root", &s, &c), 0);
    ASSERT_EQ(s, 500000);
    ASSERT_EQ(c, 262144);
    ASSERT_EQ(idrange_from_subid_file(path, "nobody", &s, &c), -ENOENT);
    unlink(path);
    ASSERT_EQ(idrange_from_subid_file(path, "root", &s, &c), -ENOENT);
}

TAP_MAIN(T(parse_accepts_a_range_of_whole_blocks_only_above_zero),
         T(blocks_are_disjoint_and_exhaustion_is_enospc), T(a_released_block_comes_back_last),
         T(mark_refuses_blocks_outside_the_range_and_twice),
         T(a_block_taken_by_a_run_found_at_restart_is_never_handed_out),
         T(subid_file_gives_roots_entry))
