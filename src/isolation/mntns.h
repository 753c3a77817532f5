/* SPDX-License-Identifier: MIT */
/* One shared mount namespace for all pooled sandboxes, whose /proc is a private proc mount
 * with hidepid=invisible: a sandbox sees only its own processes. A small holder process keeps
 * the namespace alive; sandboxes enter it with setns() (about free per exec). */
#pragma once

#include <sys/types.h>

typedef struct {
    pid_t holder;
    int ns_fd;          /* /proc/<holder>/ns/mnt */
    int release_fd;     /* closing it ends the holder */
    char proc_path[64]; /* /proc/<holder>/root/proc: the private proc, for the Landlock rule */
} sandbox_ns_t;

int sandbox_ns_start(sandbox_ns_t *ns);
void sandbox_ns_stop(sandbox_ns_t *ns);
