/* SPDX-License-Identifier: MIT */
/* A job's egress allow-list entry, as the platform's protocol has it (job specs, install
 * bodies): "CIDR" or "CIDR:PORT" for IPv4 ("10.1.2.0/24:443"), "[CIDR]:PORT" or "CIDR" for
 * IPv6 ("[2001:db8::/32]:443"). Shared by sbx-control (validation, 400 on a bad entry) and
 * sbx-node (the run's firewall). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define EGRESS_ALLOW_MAX 64

typedef struct {
    int family;       /* AF_INET or AF_INET6 */
    uint8_t addr[16]; /* network address (host bits zero) */
    unsigned prefix;  /* 0..32 or 0..128 */
    uint16_t port;    /* 0: every port */
} egress_rule_t;

/* Parse one entry; 0 or -EINVAL. Host bits must be zero ("10.1.2.3/24" is refused). */
int egress_rule_parse(const char *s, egress_rule_t *ret);
/* The nft form of the address ("10.1.2.0/24", "2001:db8::/32"). */
void egress_rule_addr(const egress_rule_t *r, char *out, size_t cap);
