/* SPDX-License-Identifier: MIT */
/* The edge proxy's route cache (src/control/routecache.c): expiry, and repair by compare-and-
 * swap against the rejected route, which keeps the entry's expiry and never lets a late
 * refusal evict a newer route. Also the process start time the node's bridge check relies on
 * (src/node/substrate.c). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/strutil.h"
#include "control/routecache.h"
#include "node/substrate.h"
#include "tap.h"

static route_t mk(const char *job, uint64_t gen, const char *node, int64_t rev)
{
    route_t r = { .port = 7000, .rev = rev };
    (void)snprintf(r.job, sizeof r.job, "%s", job);
    (void)snprintf(r.run.sandbox, sizeof r.run.sandbox, "%s", job + 3);
    r.run.generation = gen;
    (void)snprintf(r.run.node, sizeof r.run.node, "%s", node);
    (void)snprintf(r.run.substrate, sizeof r.run.substrate, "process");
    (void)snprintf(r.run.activation, sizeof r.run.activation, "a-%llu", (unsigned long long)gen);
    (void)snprintf(r.run.instance, sizeof r.run.instance, "i-%llu", (unsigned long long)gen);
    (void)snprintf(r.host, sizeof r.host, "127.0.0.1");
    return r;
}

TEST(put_get_and_expiry)
{
    routecache_t rc;
    ASSERT_EQ(routecache_init(&rc, 16), 0);
    route_t a = mk("ns/job1", 7, "A", 10), got;
    ASSERT_FALSE(routecache_get(&rc, "ns/job1", 1000, &got));
    ASSERT_EQ(routecache_put(&rc, &a, 1000, 30000), 0);
    ASSERT_TRUE(routecache_get(&rc, "ns/job1", 1000, &got));
    ASSERT_TRUE(route_equal(&got, &a));
    ASSERT_TRUE(routecache_get(&rc, "ns/job1", 30999, &got));  /* control: still live */
    ASSERT_FALSE(routecache_get(&rc, "ns/job1", 31000, &got)); /* expired exactly at ttl */
    ASSERT_FALSE(routecache_get(&rc, "ns/job2", 1000, &got));
    routecache_free(&rc);
}

TEST(repair_replaces_only_the_rejected_route_and_keeps_expiry)
{
    routecache_t rc;
    ASSERT_EQ(routecache_init(&rc, 16), 0);
    route_t g7 = mk("ns/job1", 7, "A", 10), g8 = mk("ns/job1", 8, "B", 11), got;
    ASSERT_EQ(routecache_put(&rc, &g7, 1000, 30000), 0);
    /* the node refused g7: replace it with g8, expiry stays at 31000 */
    ASSERT_TRUE(routecache_replace(&rc, &g7, &g8, 5000));
    ASSERT_TRUE(routecache_get(&rc, "ns/job1", 30999, &got));
    ASSERT_TRUE(route_equal(&got, &g8));
    ASSERT_FALSE(routecache_get(&rc, "ns/job1", 31000, &got)); /* repair is not renewal */
    routecache_free(&rc);
}

TEST(a_late_refusal_never_evicts_a_newer_route)
{
    routecache_t rc;
    ASSERT_EQ(routecache_init(&rc, 16), 0);
    route_t g7 = mk("ns/job1", 7, "A", 10), g8 = mk("ns/job1", 8, "B", 11);
    route_t g9 = mk("ns/job1", 9, "A", 12), got;
    ASSERT_EQ(routecache_put(&rc, &g7, 1000, 30000), 0);
    /* request 1 repairs g7 -> g8 */
    ASSERT_TRUE(routecache_replace(&rc, &g7, &g8, 2000));
    /* request 2 had also been refused on g7, and read g9 meanwhile: its CAS fails */
    ASSERT_FALSE(routecache_replace(&rc, &g7, &g9, 2100));
    ASSERT_TRUE(routecache_get(&rc, "ns/job1", 2200, &got));
    ASSERT_TRUE(route_equal(&got, &g8));
    /* a drop that expects the old route leaves the newer one */
    routecache_drop(&rc, "ns/job1", &g7);
    ASSERT_TRUE(routecache_get(&rc, "ns/job1", 2300, &got));
    ASSERT_TRUE(route_equal(&got, &g8));
    routecache_drop(&rc, "ns/job1", &g8); /* control: the matching drop removes it */
    ASSERT_FALSE(routecache_get(&rc, "ns/job1", 2400, &got));
    routecache_free(&rc);
}

TEST(repair_does_not_resurrect_an_absent_or_expired_entry)
{
    routecache_t rc;
    ASSERT_EQ(routecache_init(&rc, 16), 0);
    route_t g7 = mk("ns/job1", 7, "A", 10), g8 = mk("ns/job1", 8, "B", 11), got;
    ASSERT_FALSE(routecache_replace(&rc, &g7, &g8, 1000));
    ASSERT_FALSE(routecache_get(&rc, "ns/job1", 1000, &got));
    ASSERT_EQ(routecache_put(&rc, &g7, 1000, 100), 0);
    ASSERT_FALSE(routecache_replace(&rc, &g7, &g8, 1100));
    ASSERT_FALSE(routecache_get(&rc, "ns/job1", 1100, &got));
    /* a revision change alone makes it another route */
    route_t g7b = g7;
    g7b.rev = 99;
    ASSERT_EQ(routecache_put(&rc, &g7b, 2000, 1000), 0);
    ASSERT_FALSE(routecache_replace(&rc, &g7, &g8, 2001));
    ASSERT_TRUE(routecache_replace(&rc, &g7b, &g8, 2001));
    routecache_free(&rc);
}

TEST(capacity_evicts_expired_first)
{
    routecache_t rc;
    ASSERT_EQ(routecache_init(&rc, 2), 0);
    route_t a = mk("ns/a", 1, "A", 1), b = mk("ns/b", 1, "A", 2), c = mk("ns/c", 1, "A", 3);
    route_t got;
    ASSERT_EQ(routecache_put(&rc, &a, 1000, 10), 0);    /* expires at 1010 */
    ASSERT_EQ(routecache_put(&rc, &b, 1000, 10000), 0); /* lives */
    ASSERT_EQ(routecache_put(&rc, &c, 2000, 10000), 0); /* full: the expired a goes */
    ASSERT_EQ_U(rc.n, 2);
    ASSERT_TRUE(routecache_get(&rc, "ns/b", 2000, &got));
    ASSERT_TRUE(routecache_get(&rc, "ns/c", 2000, &got));
    routecache_free(&rc);
}

TEST(proc_start_time_identifies_a_process)
{
    uint64_t a, b;
    ASSERT_EQ(proc_start_time(getpid(), &a), 0);
    ASSERT_EQ(proc_start_time(getpid(), &b), 0);
    ASSERT_EQ_U(a, b);
    /* field 22 of /proc/self/stat read independently */
    FILE *f = fopen("/proc/self/stat", "re");
    ASSERT_TRUE(f != NULL);
    char buf[1024];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')') + 2; /* field 3 */
    uint64_t v = 0;
    for (int field = 3; field < 22; field++)
        p = strchr(p, ' ') + 1;
    ASSERT_EQ(parse_u64(sv_make(p, strcspn(p, " ")), UINT64_MAX, &v), 0);
    ASSERT_EQ_U(a, v);
    /* a child started later has a later (or equal, same tick) start time; a dead one has none */
    pid_t pid = fork();
    if (pid == 0) {
        pause();
        _exit(0);
    }
    uint64_t c;
    ASSERT_EQ(proc_start_time(pid, &c), 0);
    ASSERT_GE(c, a);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    ASSERT_EQ(proc_start_time(pid, &c), -ENOENT);
}

TAP_MAIN(T(put_get_and_expiry), T(repair_replaces_only_the_rejected_route_and_keeps_expiry),
         T(a_late_refusal_never_evicts_a_newer_route),
         T(repair_does_not_resurrect_an_absent_or_expired_entry), T(capacity_evicts_expired_first),
         T(proc_start_time_identifies_a_process))
