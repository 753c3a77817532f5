/* SPDX-License-Identifier: MIT */
/* Fair connection limits (src/http/connlimit.c): keyed counters with a limit, entries gone at
 * a count of 0, the table growing past its first buckets, and source keys (IPv4, an IPv6 /64,
 * IPv4-mapped IPv6 as IPv4, unix peers as no source). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/un.h>

#include "http/connlimit.h"
#include "tap.h"

TEST(counts_up_to_the_limit_per_key)
{
    climit_tab_t *t;
    ASSERT_EQ(climit_tab_new(&t), 0);
    climit_ent_t *a[3], *b, *over = NULL;
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(climit_acquire(t, "alice", 5, 3, &a[i]), 0);
    ASSERT_TRUE(a[0] == a[1] && a[1] == a[2]);
    ASSERT_EQ_U(climit_count(a[0]), 3);
    ASSERT_EQ(climit_acquire(t, "alice", 5, 3, &over), -EUSERS);
    ASSERT_TRUE(over == NULL);
    /* another key has a count of its own */
    ASSERT_EQ(climit_acquire(t, "bob", 3, 3, &b), 0);
    ASSERT_EQ_U(climit_count(b), 1);
    ASSERT_EQ_U(climit_tab_size(t), 2);
    /* a release makes room for one */
    climit_release(a[2]);
    ASSERT_EQ(climit_acquire(t, "alice", 5, 3, &a[2]), 0);
    ASSERT_EQ(climit_acquire(t, "alice", 5, 3, &over), -EUSERS);
    /* limit 0: none */
    climit_ent_t *many;
    for (int i = 0; i < 10; i++)
        ASSERT_EQ(climit_acquire(t, "bob", 3, 0, &many), 0);
    ASSERT_EQ_U(climit_count(b), 11);
    for (int i = 0; i < 11; i++)
        climit_release(b);
    ASSERT_EQ_U(climit_tab_size(t), 1); /* bob's entry went with its last holder */
    for (int i = 0; i < 3; i++)
        climit_release(a[i]);
    ASSERT_EQ_U(climit_tab_size(t), 0);
    climit_release(NULL);
    ASSERT_EQ(climit_acquire(t, "", 0, 1, &over), -EINVAL);
    char big[CLIMIT_KEY_MAX + 1] = { 0 };
    ASSERT_EQ(climit_acquire(t, big, sizeof big, 1, &over), -EINVAL);
    climit_tab_free(t);
}

TEST(many_keys_grow_the_table)
{
    climit_tab_t *t;
    ASSERT_EQ(climit_tab_new(&t), 0);
    static climit_ent_t *e[5000];
    char k[32];
    for (int i = 0; i < 5000; i++) {
        int n = snprintf(k, sizeof k, "principal-%d", i);
        ASSERT_EQ(climit_acquire(t, k, (size_t)n, 2, &e[i]), 0);
    }
    ASSERT_EQ_U(climit_tab_size(t), 5000);
    for (int i = 0; i < 5000; i++) { /* each key found again after the growth: its second */
        int n = snprintf(k, sizeof k, "principal-%d", i);
        climit_ent_t *again;
        ASSERT_EQ(climit_acquire(t, k, (size_t)n, 2, &again), 0);
        ASSERT_TRUE(again == e[i]);
        ASSERT_EQ(climit_acquire(t, k, (size_t)n, 2, &again), -EUSERS);
    }
    for (int i = 0; i < 5000; i++) {
        climit_release(e[i]);
        climit_release(e[i]);
    }
    ASSERT_EQ_U(climit_tab_size(t), 0);
    climit_tab_free(t);
}

static size_t key_of(const char *addr, uint8_t key[CLIMIT_SOURCE_KEY])
{
    struct sockaddr_in a4 = { .sin_family = AF_INET };
    struct sockaddr_in6 a6 = { .sin6_family = AF_INET6 };
    if (inet_pton(AF_INET, addr, &a4.sin_addr) == 1)
        return climit_source_key((struct sockaddr *)&a4, sizeof a4, key);
    if (inet_pton(AF_INET6, addr, &a6.sin6_addr) == 1)
        return climit_source_key((struct sockaddr *)&a6, sizeof a6, key);
    return 0;
}

TEST(source_keys)
{
    uint8_t a[CLIMIT_SOURCE_KEY], b[CLIMIT_SOURCE_KEY];
    /* IPv4: the address */
    ASSERT_EQ_U(key_of("127.0.0.2", a), CLIMIT_SOURCE_KEY);
    ASSERT_EQ_U(key_of("127.0.0.3", b), CLIMIT_SOURCE_KEY);
    ASSERT_TRUE(memcmp(a, b, sizeof a) != 0);
    /* IPv4-mapped IPv6 is that IPv4 address */
    ASSERT_EQ_U(key_of("::ffff:127.0.0.2", b), CLIMIT_SOURCE_KEY);
    ASSERT_MEMEQ(a, sizeof a, b, sizeof b);
    /* IPv6: one /64 is one source, the next /64 another */
    ASSERT_EQ_U(key_of("2001:db8:1:2::1", a), CLIMIT_SOURCE_KEY);
    ASSERT_EQ_U(key_of("2001:db8:1:2:ffff:ffff:ffff:ffff", b), CLIMIT_SOURCE_KEY);
    ASSERT_MEMEQ(a, sizeof a, b, sizeof b);
    ASSERT_EQ_U(key_of("2001:db8:1:3::1", b), CLIMIT_SOURCE_KEY);
    ASSERT_TRUE(memcmp(a, b, sizeof a) != 0);
    /* an IPv6 address never equals an IPv4 one that shares its bytes */
    ASSERT_EQ_U(key_of("7f00:2::", a), CLIMIT_SOURCE_KEY);
    ASSERT_EQ_U(key_of("127.0.0.2", b), CLIMIT_SOURCE_KEY);
    ASSERT_TRUE(memcmp(a, b, sizeof a) != 0);
    /* parsed addresses (--control-source) give the same keys, brackets allowed */
    ASSERT_EQ(climit_source_key_parse("[2001:db8:1:2::7]", a), 0);
    ASSERT_EQ_U(key_of("2001:db8:1:2::1", b), CLIMIT_SOURCE_KEY);
    ASSERT_MEMEQ(a, sizeof a, b, sizeof b);
    ASSERT_EQ(climit_source_key_parse("10.1.2.3", a), 0);
    ASSERT_EQ_U(key_of("10.1.2.3", b), CLIMIT_SOURCE_KEY);
    ASSERT_MEMEQ(a, sizeof a, b, sizeof b);
    ASSERT_EQ(climit_source_key_parse("node.example", a), -EINVAL);
    ASSERT_EQ(climit_source_key_parse("10.1.2.3:80", a), -EINVAL);
    /* a unix peer is no source */
    struct sockaddr_un su = { .sun_family = AF_UNIX };
    ASSERT_EQ_U(climit_source_key((struct sockaddr *)&su, sizeof su, a), 0);
    /* a truncated address is none either */
    struct sockaddr_in6 a6 = { .sin6_family = AF_INET6 };
    ASSERT_EQ_U(climit_source_key((struct sockaddr *)&a6, 8, a), 0);
}

TAP_MAIN(T(counts_up_to_the_limit_per_key), T(many_keys_grow_the_table), T(source_keys))
