/* SPDX-License-Identifier: MIT */
/* The `process` substrate: one run is a process tree whose boundary is the run itself, in the
 * way user-namespaced OCI runtimes draw it.
 *
 * The node makes the run's user namespace first (its ids 0..65535 are one block of the node's
 * subordinate id range: root in the run is an unprivileged uid on the host), then clones the
 * run's process as host root into new mount, pid, network, ipc, uts and cgroup namespaces. That
 * process joins the run's cgroups, builds the run's tree (its root, the host's programs
 * read-only, its own /proc with the kernel's interfaces masked or read-only, a /dev of a few
 * harmless nodes, the agent binary read-only; no /sys, or for a pool host only its own cgroup
 * subtree), pivots into it, and only then enters the user namespace, becomes its root, drops
 * the capability bounding set, sets NO_NEW_PRIVS, loads the run's seccomp profile and execs.
 * Its other namespaces stay owned by the host's user namespace, so root in the run holds no
 * capability over them: it cannot mount, unmount a mask, configure its network or set its host
 * name. Every mount point inside the run's root is resolved by descriptor beneath the root
 * (openat2, no symlinks): a link the tenant left in a kept root never leads a host-root step
 * outside it. Everything else the run's tree needs (/tmp, /etc, homes) is made after the run
 * entered its user namespace, as the run's own root.
 *
 * The process is pid 1 of its pid namespace: when it dies, the kernel kills everything left. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/err.h"
#include "isolation/filter.h"

#define SUBSTRATE_AGENT_PATH "/.sbx/bin/sbx-server"
#define SUBSTRATE_MAX_CGROUPS 4

typedef struct {
    const char *root;      /* the run's root directory (a node-owned path; its contents are the
                            * tenant's), owned by the run's root (host id id_base) */
    const char *agent_bin; /* sbx-server binary on the host, mounted at SUBSTRATE_AGENT_PATH */
    dev_t agent_dev;       /* ... which must be this file (else the spawn fails): the one the */
    ino_t agent_ino;       /* bridge accepts as the run's listener (bridge.c) */
    const char *hostname;  /* uts name of the run */
    char *const *argv;     /* argv[0] "sbx-server" means the mounted agent */
    char *const *envp;
    int bridge_fd;  /* bound unix socket, becomes fd 3 (the agent listens on it) */
    int log_fd;     /* the run's stdout and stderr (the write side of the node's log fifo) */
    int userns_fd;  /* the run's user namespace (userns_create) */
    int netns_fd;   /* an egress run's network namespace (egress_netns_make), or -1: a new one */
    bool pool_host; /* packs uid sandboxes: hidepid /proc, its cgroup subtree, more capabilities */
    /* cgroup.procs files to join, -1 terminated (may be NULL) */
    const int *cgroup_fds;
    /* a pool host's own cgroup directories, bound at /sys/fs/cgroup/<name> (NULL-terminated) */
    const char *const *cgroup_dirs;
    const char *const *cgroup_names;
    const seccomp_filter_t *filter; /* the run's profile (seccomp_run_filter_build) */
    /* An image run: root is the run's disk, holding upper/ and work/; the image's verified
     * rootfs (owned by host root) is mounted idmapped onto the run's block at lower_mnt (a
     * node-owned empty directory) and the overlay of both becomes the run's root. NULL: the
     * "host" image (the disk is the root; the host's /usr is bound read-only). */
    const char *image_rootfs;
    const char *lower_mnt;
    const char *etc_ld_cache; /* the host's /etc/ld.so.cache (for a fresh /etc), or NULL */
    const char *resolv_conf;  /* a fresh /etc/resolv.conf (egress runs), or NULL: empty */
    size_t etc_ld_cache_len;
    /* Called in the node right after the clone, before the run's process does anything (it
     * waits for the node's go-ahead, and exits by itself if the node dies first): the node
     * records the pid durably here, so no process of a run exists that a restarted node cannot
     * find. A negative return kills the process and fails the spawn. May be NULL. */
    int (*cloned)(void *arg, pid_t pid, uint64_t start_time);
    void *cloned_arg;
} substrate_spec_t;

/* Start the run. On success *ret_pid is its pid (in the node's pid namespace) and
 * *ret_start its start time (clock ticks since boot, /proc/<pid>/stat field 22): together they
 * identify the process even after the pid is reused. On failure err says which setup step
 * failed and why. */
int substrate_spawn(const substrate_spec_t *spec, pid_t *ret_pid, uint64_t *ret_start,
                    sbx_err_t *err);

/* Start time of pid (field 22 of /proc/<pid>/stat), or -errno (-ESRCH for a dead process,
 * zombies included). */
int proc_start_time(pid_t pid, uint64_t *ret);
/* The same through an fd of /proc/<pid>/stat opened earlier (proc_stat_open): such an fd stays
 * bound to that process, never to a later one with the same pid (reads fail once it is gone),
 * so one pread() re-checks the identity. */
int proc_stat_open(pid_t pid);
int proc_stat_start_time(int fd, uint64_t *ret);
