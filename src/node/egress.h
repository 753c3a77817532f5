/* SPDX-License-Identifier: MIT */
/* A run's way out (`network: "egress"`): a firewall in the run's network namespace, then
 * pasta (Debian's passt package), a user-space network stack that gives the namespace one
 * interface and carries its connections out as ordinary sockets of an unprivileged process on
 * the host (uid `owner`, no capability on the host). Chosen over veth + NAT: nothing on the
 * host changes (no forwarding, no host firewall rules, no addresses), and a run's packets
 * never reach the host's stack as packets.
 *
 * The firewall (nftables, made by the node as host root: the run's root cannot change it, its
 * network namespace belongs to the host's user namespace) refuses, whatever the allow-list
 * says: every address of the host (its loopback included), link-local and metadata addresses
 * (169.254.0.0/16, fe80::/10, fd00:ec2::254), 0.0.0.0/8 and multicast. With an allow-list only
 * its entries are reachable; without one, everything public is, and private ranges (10/8,
 * 172.16/12, 192.168/16, 100.64/10, fc00::/7) are not. DNS goes to 198.18.0.53, which pasta
 * forwards to the host's resolver. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/err.h"

#define EGRESS_DNS "198.18.0.53"

/* The nft ruleset for an allow-list (a JSON array of "CIDR[:PORT]" strings, may be empty):
 * *ret a malloc'd string; -EINVAL (an entry does not parse) or -ENOMEM with err set. */
int egress_ruleset(json_t *allow, char **ret, sbx_err_t *err);
/* The run's network namespace, owned by a user namespace of its own whose only id (0) is the
 * host uid `owner` (the last id of the run's block, which no process of the host's user
 * namespace has): pasta, running as `owner`, may configure it, and the run, whose root lives
 * in another user namespace, may not. A holder process (uid owner) keeps both until the run
 * stops; *ret_netns is an fd of the network namespace for the run to join. */
int egress_netns_make(uint32_t owner, pid_t *ret_holder, int *ret_netns, sbx_err_t *err);
/* The firewall for the allow-list in the holder's network namespace (applied by the node, as
 * host root), then pasta (as `owner`) joining the holder's namespaces; *ret_pasta is its pid.
 * tun_path: where the node may make a tun device node for pasta alone (a file in the run's
 * 0700 directory, given to `owner`), bound over /dev/net/tun in pasta's own mount namespace:
 * the host's /dev/net/tun permissions are never relied on nor changed. Every mount below
 * `detach` (the node's runs: other runs' disks) is detached in that namespace first, so that
 * pasta, living as long as its run, never holds another run's disk after the node lets go.
 * The caller reaps both and stops them with the run. */
int egress_start(pid_t holder, uint32_t owner, json_t *allow, const char *tun_path,
                 const char *detach, pid_t *ret_pasta, sbx_err_t *err);
