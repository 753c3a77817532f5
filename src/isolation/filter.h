/* SPDX-License-Identifier: MIT */
/* A seccomp deny-list for pooled sandboxes, built once with libseccomp and exported as BPF,
 * which each spawn helper installs in itself once, so every confined child inherits it (the
 * kernel compiles a program at each load: about 0.2 ms here). It closes gaps
 * that uids and Landlock leave: new user namespaces, io_uring, userfaultfd, ptrace, keyrings,
 * bpf, perf, TIOCSTI, SysV IPC shared across sandboxes, and the 32-bit syscall ABI. */
#pragma once

#include <linux/filter.h>
#include <stdbool.h>

typedef struct {
    struct sock_fprog prog;
} seccomp_filter_t;

int seccomp_filter_build(seccomp_filter_t *f);
/* The default profile of every run (an allow-list; the rest ENOSYS, dangerous families EPERM).
 * A pool host may also make network namespaces (never user namespaces) and enter them. */
int seccomp_run_filter_build(seccomp_filter_t *f, bool pool_host);
void seccomp_filter_done(seccomp_filter_t *f);
/* Raw load: as root, or with NO_NEW_PRIVS already set. */
long seccomp_filter_load_raw(const seccomp_filter_t *f);
