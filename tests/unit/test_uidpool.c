/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "isolation/uidpool.h"
#include "tap.h"

TEST(fresh_uids_in_order)
{
    uidpool_t p;
    ASSERT_EQ(uidpool_init(&p, 20000, 10), 0);
    uint32_t a, b;
    ASSERT_EQ(uidpool_take(&p, &a), 0);
    ASSERT_EQ(uidpool_take(&p, &b), 0);
    ASSERT_EQ(a, 20000);
    ASSERT_EQ(b, 20001);
    ASSERT_EQ(p.n_used, 2);
    uidpool_done(&p);
}

TEST(a_released_uid_is_reused_before_a_fresh_one)
{
    uidpool_t p;
    ASSERT_EQ(uidpool_init(&p, 20000, 10), 0);
    uint32_t a, b, c;
    ASSERT_EQ(uidpool_take(&p, &a), 0);
    ASSERT_EQ(uidpool_take(&p, &b), 0);
    uidpool_release(&p, a, true);
    ASSERT_EQ(uidpool_take(&p, &c), 0);
    ASSERT_EQ(c, a);
    uidpool_done(&p);
}

TEST(an_unverified_teardown_quarantines_the_uid)
{
    uidpool_t p;
    ASSERT_EQ(uidpool_init(&p, 20000, 2), 0);
    uint32_t a, b, c;
    ASSERT_EQ(uidpool_take(&p, &a), 0);
    uidpool_release(&p, a, false);
    ASSERT_EQ(p.n_quarantined, 1);
    ASSERT_EQ(uidpool_take(&p, &b), 0);
    ASSERT_NE(b, a);
    /* the quarantined uid never comes back: the pool is now exhausted */
    ASSERT_EQ(uidpool_take(&p, &c), -ENOSPC);
    uidpool_done(&p);
}

TEST(reserved_uids_are_skipped_and_exhaustion_is_enospc)
{
    uidpool_t p;
    ASSERT_EQ(uidpool_init(&p, 20000, 3), 0);
    uidpool_reserve(&p, 20001);
    uidpool_reserve(&p, 19999); /* out of range: ignored */
    uint32_t a, b, c;
    ASSERT_EQ(uidpool_take(&p, &a), 0);
    ASSERT_EQ(uidpool_take(&p, &b), 0);
    ASSERT_EQ(a, 20000);
    ASSERT_EQ(b, 20002);
    ASSERT_EQ(uidpool_take(&p, &c), -ENOSPC);
    /* releasing a reserved or free uid is a no-op */
    uidpool_release(&p, 20001, true);
    ASSERT_EQ(uidpool_take(&p, &c), -ENOSPC);
    uidpool_done(&p);
}

TEST(a_recycled_uid_reserved_later_is_not_handed_out)
{
    uidpool_t p;
    ASSERT_EQ(uidpool_init(&p, 20000, 2), 0);
    uint32_t a, b, c;
    ASSERT_EQ(uidpool_take(&p, &a), 0);
    uidpool_release(&p, a, true);
    uidpool_reserve(&p, a); /* e.g. a process with that uid appeared */
    ASSERT_EQ(uidpool_take(&p, &b), 0);
    ASSERT_EQ(b, 20001);
    ASSERT_EQ(uidpool_take(&p, &c), -ENOSPC);
    uidpool_done(&p);
}

TEST(passwd_and_group_files_reserve_their_ids)
{
    char path[] = "/tmp/sbx-uidpool-XXXXXX";
    int fd = mkstemp(path);
    ASSERT_TRUE(fd >= 0);
    const char text[] = "root:x:0:0:root:/root:/bin/bash\n"
                        "svc:x:20001:20003:svc:/home/svc:/bin/sh\n"
                        "broken line without colons\n"
                        "big:x:99999999999:1::/:/bin/sh\n";
    ASSERT_EQ(write(fd, text, sizeof text - 1), (ssize_t)(sizeof text - 1));
    close(fd);
    uidpool_t p;
    ASSERT_EQ(uidpool_init(&p, 20000, 5), 0);
    ASSERT_EQ(uidpool_reserve_from_file(&p, path), 0);
    unlink(path);
    ASSERT_EQ(p.n_reserved, 2); /* uid 20001 and gid 20003 */
    uint32_t got[3];
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(uidpool_take(&p, &got[i]), 0);
    ASSERT_EQ(got[0], 20000);
    ASSERT_EQ(got[1], 20002);
    ASSERT_EQ(got[2], 20004);
    uidpool_done(&p);
}

TEST(pools_sharing_a_lock_file_never_hand_out_the_same_uid)
{
    char path[] = "/tmp/sbx-uidlock-XXXXXX";
    int fd = mkstemp(path);
    ASSERT_TRUE(fd >= 0);
    close(fd);
    uidpool_t p1, p2, p3;
    ASSERT_EQ(uidpool_init(&p1, 20000, 4), 0);
    ASSERT_EQ(uidpool_init(&p2, 20000, 4), 0);
    ASSERT_EQ(uidpool_lock_file(&p1, path), 0);
    ASSERT_EQ(uidpool_lock_file(&p2, path), 0);
    uint32_t a, b, c, d;
    ASSERT_EQ(uidpool_take(&p1, &a), 0);
    ASSERT_EQ(uidpool_take(&p2, &b), 0);
    ASSERT_EQ(a, 20000);
    ASSERT_EQ(b, 20001); /* 20000 is p1's: reserved in p2 */
    ASSERT_EQ(p2.n_reserved, 1);
    uidpool_release(&p1, a, false); /* quarantined: p1 keeps the lock */
    ASSERT_EQ(uidpool_take(&p1, &c), 0);
    ASSERT_EQ(c, 20002);
    uidpool_release(&p1, c, true); /* verified: unlocked, another pool may take it */
    ASSERT_EQ(uidpool_init(&p3, 20000, 4), 0);
    ASSERT_EQ(uidpool_lock_file(&p3, path), 0);
    ASSERT_EQ(uidpool_take(&p3, &d), 0);
    ASSERT_EQ(d, 20002);
    /* p1 recycles 20002 first, but p3 holds it now: p1 skips to the next free one */
    ASSERT_EQ(uidpool_take(&p1, &c), 0);
    ASSERT_EQ(c, 20003);
    /* p3 found every other uid held: each stays reserved in p3 for good */
    ASSERT_EQ(uidpool_take(&p3, &d), -ENOSPC);
    uidpool_done(&p2); /* closing the lock file drops p2's locks */
    uidpool_done(&p3);
    ASSERT_EQ(uidpool_init(&p3, 20000, 4), 0);
    ASSERT_EQ(uidpool_lock_file(&p3, path), 0);
    ASSERT_EQ(uidpool_take(&p3, &d), 0);
    ASSERT_EQ(d, 20001);
    uidpool_done(&p1);
    uidpool_done(&p3);
    unlink(path);
}

TAP_MAIN(T(fresh_uids_in_order), T(a_released_uid_is_reused_before_a_fresh_one),
         T(an_unverified_teardown_quarantines_the_uid),
         T(reserved_uids_are_skipped_and_exhaustion_is_enospc),
         T(a_recycled_uid_reserved_later_is_not_handed_out),
         T(passwd_and_group_files_reserve_their_ids),
         T(pools_sharing_a_lock_file_never_hand_out_the_same_uid))
