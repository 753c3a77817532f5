/* SPDX-License-Identifier: MIT */
#include "egress.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "common/strutil.h"

int egress_rule_parse(const char *s, egress_rule_t *ret)
{
    char addr[64];
    const char *port = NULL, *end;
    egress_rule_t r = { 0 };
    size_t n = strlen(s);
    if (n == 0 || n > 80)
        return -EINVAL;
    if (s[0] == '[') { /* [v6/prefix]:port */
        end = strchr(s, ']');
        if (!end || (end[1] != 0 && end[1] != ':'))
            return -EINVAL;
        if ((size_t)(end - s - 1) >= sizeof addr)
            return -EINVAL;
        memcpy(addr, s + 1, (size_t)(end - s - 1));
        addr[end - s - 1] = 0;
        if (end[1] == ':')
            port = end + 2;
    } else {
        const char *colon = strchr(s, ':');
        bool v6 = colon && strchr(colon + 1, ':');
        size_t k = v6 || !colon ? n : (size_t)(colon - s);
        if (k >= sizeof addr)
            return -EINVAL;
        memcpy(addr, s, k);
        addr[k] = 0;
        if (!v6 && colon)
            port = colon + 1;
    }
    char *slash = strchr(addr, '/');
    uint64_t prefix = 0;
    if (slash) {
        *slash = 0;
        if (parse_u64_str(slash + 1, 128, &prefix) < 0)
            return -EINVAL;
    }
    if (s[0] != '[' && inet_pton(AF_INET, addr, r.addr) == 1) {
        r.family = AF_INET;
        if (!slash)
            prefix = 32;
        if (prefix > 32)
            return -EINVAL;
    } else if (inet_pton(AF_INET6, addr, r.addr) == 1) {
        r.family = AF_INET6;
        if (!slash)
            prefix = 128;
    } else
        return -EINVAL;
    r.prefix = (unsigned)prefix;
    /* host bits must be zero: the entry says exactly what it allows */
    unsigned bytes = r.family == AF_INET ? 4 : 16;
    for (unsigned b = 0; b < bytes * 8; b++)
        if (b >= r.prefix && (r.addr[b / 8] & (0x80 >> (b % 8))))
            return -EINVAL;
    if (port) {
        uint64_t p;
        if (parse_u64_str(port, 65535, &p) < 0 || p == 0)
            return -EINVAL;
        r.port = (uint16_t)p;
    }
    *ret = r;
    return 0;
}

void egress_rule_addr(const egress_rule_t *r, char *out, size_t cap)
{
    char a[INET6_ADDRSTRLEN];
    (void)inet_ntop(r->family, r->addr, a, sizeof a);
    (void)snprintf(out, cap, "%s/%u", a, r->prefix);
}
