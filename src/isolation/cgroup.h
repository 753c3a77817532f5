/* SPDX-License-Identifier: MIT */
/* Aggregate limits per pooled sandbox with cgroup v1 (memory, pids, cpu) where the machine has
 * them, v2 where those controllers are delegated there. Cgroup directories are recycled like
 * uids (an empty cgroup is reused), so a create does not pay for mkdir/rmdir. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    bool v1_memory, v1_pids, v1_cpu; /* controllers we can use */
    bool v2_memory, v2_pids, v2_cpu;
    char v1_root[3][128]; /* <mount>/sbx-pool-<pid> per controller */
    char v2_root[128];    /* <cgroup2 mount>/<tag> when a cgroup2 hierarchy is mounted, or "" */
    bool enabled;
} cgroups_t;

typedef struct {
    uint64_t mem_bytes; /* 0 = unlimited */
    uint64_t pids;      /* 0 = unlimited */
    uint64_t cpu_quota_us, cpu_period_us;
} cg_limits_t;

/* Probe and create the parent cgroups for this host. Never fails hard: enabled=false. */
void cgroups_init(cgroups_t *cg, const char *tag);
/* This host's parent groups root's only (0700): no one else reaches a group under them, so a
 * sandbox reads neither its own groups' counters (recycled with its uid: the last tenant's CPU
 * time and peak memory are in them) nor a sibling's (its pids, memory use, when it runs a
 * command). For pool hosts; a node delegates groups under its parents to runs. */
int cgroups_seal(const cgroups_t *cg);
void cgroups_done(cgroups_t *cg);
/* Human-readable "memory,pids,cpu (v1)" or "none". */
void cgroups_describe(const cgroups_t *cg, char *out, size_t cap);
/* Prepare cgroup `slot` with limits and open its cgroup.procs files (fds, -1 terminated). */
int cgroup_prepare(const cgroups_t *cg, uint32_t slot, const cg_limits_t *lim, int *fds, int nfds);
/* A run's cgroups: <parent>/<name> per controller with limits; its cgroup.procs files opened
 * into fds (-1 terminated, at most nfds - 1), its directories into dirs with the controller
 * names beside them (NULL-terminated). owner >= 0: the directory and its cgroup.procs and
 * tasks files are given to that host uid (gid alike), which may then create and fill child
 * cgroups; the limit files stay root's. Returns 0 or -errno (errno set). */
int cgroup_prepare_run(const cgroups_t *cg, const char *name, const cg_limits_t *lim, int64_t owner,
                       int *fds, int nfds, char (*dirs)[192], const char **names);
/* Remove a run's cgroups and everything nested in them (depth first); best effort. */
void cgroup_remove_run(const cgroups_t *cg, const char *name);
/* A cgroup2 group for one command, root/name (name one component; root: cgroups_t's v2_root,
 * passed as a path because a spawn helper has no cgroups_t). The child joins it through
 * *ret_procs_fd; writing "1" to *ret_kill_fd (cgroup.kill) kills everything in it at once,
 * setsid() descendants included. A group that exists already is taken as it is.
 * ret_events_fd (may be NULL): its cgroup.events too, for cgroup_cmd_empty(); a group made
 * for keeping must be empty, and one that exists with processes in it is refused (-EBUSY). */
int cgroup_cmd_create_at(const char *root, const char *name, int *ret_procs_fd, int *ret_kill_fd,
                         int *ret_events_fd);
/* Whether the group whose cgroup.events is events_fd has no process in it (one pread). */
bool cgroup_cmd_empty(int events_fd);
/* rmdir v2_root/name (fails quietly while something still runs in it); true when it is gone. */
bool cgroup_cmd_remove(const cgroups_t *cg, const char *name);
/* rmdir every v2_root/<prefix>* left (after the processes are gone); how many went. */
unsigned cgroup_cmd_remove_prefix(const cgroups_t *cg, const char *prefix);
/* Number of processes left in the slot's cgroup (pids controller), -errno if unknown. */
int cgroup_count(const cgroups_t *cg, uint32_t slot);
