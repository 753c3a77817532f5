/* SPDX-License-Identifier: MIT */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "cap/egress.h"
#include "node/egress.h"
#include "tap.h"

TEST(entries_parse_with_and_without_ports)
{
    egress_rule_t r;
    char a[64];
    ASSERT_EQ(egress_rule_parse("203.0.113.0/24:443", &r), 0);
    ASSERT_EQ(r.family, AF_INET);
    ASSERT_EQ(r.prefix, 24);
    ASSERT_EQ(r.port, 443);
    egress_rule_addr(&r, a, sizeof a);
    ASSERT_STREQ(a, "203.0.113.0/24");
    ASSERT_EQ(egress_rule_parse("198.51.100.7", &r), 0);
    ASSERT_EQ(r.prefix, 32);
    ASSERT_EQ(r.port, 0);
    ASSERT_EQ(egress_rule_parse("[2001:db8::/32]:443", &r), 0);
    ASSERT_EQ(r.family, AF_INET6);
    ASSERT_EQ(r.prefix, 32);
    ASSERT_EQ(r.port, 443);
    ASSERT_EQ(egress_rule_parse("2001:db8:1::/48", &r), 0);
    ASSERT_EQ(r.port, 0);
    egress_rule_addr(&r, a, sizeof a);
    ASSERT_STREQ(a, "2001:db8:1::/48");
}

TEST(entries_that_say_more_or_less_than_they_mean_are_refused)
{
    egress_rule_t r;
    static const char *const bad[] = {
        "",
        "10.0.0.1/8",
        "10.0.0.0/33",
        "300.1.1.1",
        "10.0.0.0/8:0",
        "10.0.0.0/8:65536",
        "10.0.0.0/8:x",
        "host.example:443",
        "[::1/128",
        "2001:db8::/32:443",
        "[2001:db8::1/32]:1",
        "10.0.0.0/",
        "10.0.0.0/-1",
        "1.2.3.4:443:1",
        "[1.2.3.4]:5",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = egress_rule_parse(bad[i], &r);
        if (rc != -EINVAL)
            fprintf(stderr, "# accepted: \"%s\"\n", bad[i]);
        ASSERT_EQ(rc, -EINVAL);
    }
}

TEST(the_ruleset_refuses_the_host_before_any_allowed_entry)
{
    json_t *allow = json_pack("[s,s]", "10.1.0.0/16:8080", "[2001:db8::/32]:443");
    sbx_err_t err;
    char *rules = NULL;
    ASSERT_EQ(egress_ruleset(allow, &rules, &err), 0);
    ASSERT_TRUE(rules != NULL);
    const char *deny = strstr(rules, "ip daddr @deny4 jump refuse");
    const char *entry =
        strstr(rules, "ip daddr 10.1.0.0/16 meta l4proto { tcp, udp } th dport 8080");
    ASSERT_TRUE(deny && entry && deny < entry);
    ASSERT_TRUE(strstr(rules, "ip6 daddr 2001:db8::/32 meta l4proto { tcp, udp } th dport 443"));
    ASSERT_TRUE(strstr(rules, "127.0.0.0/8") && strstr(rules, "169.254.0.0/16"));
    ASSERT_TRUE(strstr(rules, "fd00:ec2::254/128"));
    ASSERT_TRUE(strstr(rules, "127.0.0.1")); /* the host's own addresses, from its interfaces */
    ASSERT_TRUE(strstr(rules, "policy drop"));
    /* with a list, private ranges are neither opened nor closed wholesale: only entries */
    ASSERT_TRUE(!strstr(rules, "@private4 jump refuse\n    ip6 daddr @private6 jump refuse\n"
                               "    accept"));
    free(rules);
    json_decref(allow);
    json_t *none = json_array();
    rules = NULL;
    ASSERT_EQ(egress_ruleset(none, &rules, &err), 0);
    ASSERT_TRUE(rules && strstr(rules, "ip daddr @private4 jump refuse"));
    free(rules);
    json_decref(none);
    json_t *bad = json_pack("[s]", "10.0.0.1/8");
    rules = NULL;
    ASSERT_EQ(egress_ruleset(bad, &rules, &err), -EINVAL);
    ASSERT_TRUE(rules == NULL && strstr(err.msg, "does not parse"));
    json_decref(bad);
}

TAP_MAIN(T(entries_parse_with_and_without_ports),
         T(entries_that_say_more_or_less_than_they_mean_are_refused),
         T(the_ruleset_refuses_the_host_before_any_allowed_entry))
