/* SPDX-License-Identifier: MIT */
/* Network namespaces for pooled sandboxes: each sandbox gets one of its own with only its
 * loopback (up), so sandboxes of one pool reach neither each other (TCP, UDP, abstract unix
 * sockets) nor the pool host's listener, and a listen() that autobinds a port is seen by no
 * one. Making one costs about half a millisecond, so a pool keeps a few made ahead. */
#pragma once

/* A new network namespace with loopback up; *ret_fd holds it (O_CLOEXEC). Needs
 * CAP_SYS_ADMIN over the caller's user namespace. */
int netns_make(int *ret_fd);
