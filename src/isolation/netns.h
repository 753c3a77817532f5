/* SPDX-License-Identifier: MIT */
/* Network namespaces for pooled sandboxes: each sandbox gets one of its own with only its
 * loopback (up), so sandboxes of one pool reach neither each other (TCP, UDP, abstract unix
 * sockets) nor the pool host's listener, and a listen() that autobinds a port is seen by no
 * one. Making one costs about half a millisecond, so a pool keeps a few made ahead. */
#pragma once

#include <stddef.h>

/* A new network namespace with loopback up; *ret_fd holds it (O_CLOEXEC). Needs
 * CAP_SYS_ADMIN over the caller's user namespace. */
int netns_make(int *ret_fd);

/* What a network namespace shows of itself under /proc/thread-self/net (counters of its
 * loopback and of every protocol, its sockets, addresses and routes), after the calling thread
 * entered it with setns(); the one line that counts sockets of the whole host left out. Two
 * snapshots are equal only when nothing in between sent a packet, left a socket (TIME_WAIT
 * included) or changed an address or route: what netns_pristine compares. Returns the length,
 * or -errno (-ENOBUFS when cap is too small). */
#define NETNS_SNAPSHOT_MAX (32 * 1024) /* a fresh one: ~10 KiB; a bigger one is not fresh */
int netns_snapshot(char *buf, size_t cap);
/* Whether netns_fd looks exactly like a fresh namespace whose snapshot is baseline: enters it
 * (this thread), takes the snapshot and goes back to home_fd (one it may enter again).
 * 1: equal; 0: not (or it could not be read); -errno when the thread could not go back. */
int netns_pristine(int netns_fd, int home_fd, const char *baseline, size_t len);
