/* SPDX-License-Identifier: MIT */
/* Pool host mode: many light sandboxes in one sbx-server, each a uid >= 20000 with a private
 * 0700 home, a scrubbed environment, NO_NEW_PRIVS, its own Landlock ruleset, rlimits, cgroup
 * limits where the machine has them, and a /proc that shows only its own processes. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/err.h"
#include "common/loop.h"
#include "http/conn.h"
#include "isolation/cgroup.h"
#include "isolation/confine.h"
#include "isolation/filter.h"
#include "isolation/landlock.h"
#include "isolation/mntns.h"
#include "isolation/uidpool.h"
#include "spawn.h"

typedef struct server server_t;
typedef struct conn conn_t;
typedef struct pool pool_t;
typedef struct sandbox sandbox_t;
typedef struct create_req create_req_t;

/* the default uid range (SBX_POOL_UID_BASE, SBX_POOL_UID_COUNT); any range set stays inside
 * it, which stays inside a 65536-uid user namespace map */
#define POOL_UID_BASE 20000
#define POOL_UID_COUNT 45000
#define POOL_UID_LOCK_FILE "/run/sbx-pool-uids.lock"
#define POOL_MAX_COUNT 4096 /* sandboxes per create request */
#define POOL_MAX_ENV_BYTES (64 * 1024)
#define POOL_BUCKETS_MIN 64 /* the id table: a power of two at least the capacity */
#define POOL_NETNS_WARM 16
#define POOL_HOMES_WARM 32
/* the homes directory holds 256 shards, 00 to ff, and each home is in the shard named by the
 * first two hex digits of its id: with 10,000 live a shard holds ~40 homes, and a create's and
 * a delete's renames change a one-block directory instead of a 10,000-entry one */
#define POOL_HOME_SHARDS 256
/* sandboxes that keep their handles open while idle (fewer where descriptors are scarce) */
#define POOL_HANDLES_MAX 1024
/* deleted sandboxes' uids, each given a fresh home (janitor_recycle_home), may fill the warm
 * set this far beyond what it is refilled to, so that creates and deletes in turn find homes */
#define POOL_HOMES_WARM_MAX (POOL_HOMES_WARM + 16)

/* A home made ahead for a uid (pool_t's warm set). */
typedef struct {
    char name[24];
    uint32_t uid;
} pool_warm_t;

struct sandbox {
    pool_t *pool;
    sandbox_t *hnext;         /* hash chain */
    sandbox_t *prev, *next;   /* creation order */
    sandbox_t *tprev, *tnext; /* among those with an idle timeout (pool_evict_idle) */
    unsigned refs;            /* the registry + each request/process that uses it */
    char id[17];
    char token[65];
    uint64_t serial; /* the pool's count of creates at its own: never reused */
    uint32_t uid;
    /* Descriptors it can do without while idle (see sandbox_handles): its home (O_PATH), its
     * Landlock ruleset and its cgroup.procs files; -1 (or cg_fds[0] -1) while closed. */
    int home_fd;
    char home_name[20]; /* beneath the homes directory: "<first two of id>/<id>" */
    char home[256];
    char **env; /* base + create-time env, KEY=VALUE */
    uint64_t max_procs, max_mem_mb;
    uint64_t idle_timeout_ms;
    int64_t created_at_ms;
    uint64_t last_activity_ms;
    unsigned ops;         /* foreground operations in flight on this sandbox */
    unsigned running;     /* running processes (foreground and background) */
    unsigned spawning;    /* spawn requests queued or in flight on a spawn helper */
    unsigned spawns_sent; /* of them, sent to a helper and not answered (spawner.c) */
    bool spawn_slow;      /* its last spawn took long: fewer sent at once (spawner.c) */
    unsigned tunnels;     /* its port proxy's open tunnels (portproxy.c: at most a quarter of the
                        * server's connections) */
    unsigned watch_instances, watch_dirs; /* its envd directory watches (envd_watch.c) */
    unsigned listings;                    /* listings in flight (files.c: listing_slot_take) */
    int ruleset_fd;                       /* -1 while closed or with uid-only confinement */
    bool landlocked; /* confined by Landlock (a ruleset is made whenever it runs something) */
    bool cg_ready;   /* its cgroups exist with its limits (cgroup_prepare ran once) */
    sandbox_t *lru_prev, *lru_next; /* in the pool's handles list while its handles are open */
    bool deleted;
    bool spawned;  /* something ran as this uid */
    int cg_fds[4]; /* cgroup.procs files of its cgroups (opened at exec), -1 ends */
    int netns_fd;  /* its own network namespace (always held: nothing else keeps it), or -1
                    * where the kernel refuses them */
    /* Its commands' kept cgroup2 groups, s<uid>-k<i> (spawn.h): bit i of cg_busy while a
     * command is in group i, of cg_lost once a command left processes in it (not used again
     * by this sandbox). */
    uint8_t cg_busy, cg_lost;
};

typedef struct {
    uint64_t capacity;
    uint64_t min_abi;
    uint64_t uid_base, uid_count; /* sandbox uids: [uid_base, uid_base + uid_count) */
    bool allow_unconfined;
    char homes_dir[200];
} pool_config_t;

struct pool {
    server_t *srv;
    pool_config_t cfg;
    uint64_t reserved; /* capacity slots taken, including creates in progress */
    /* create requests waiting for the janitor's homes and namespaces, in arrival order
     * (pool.c), the slots they reserved and have not filled yet, and whether one is being
     * served now */
    create_req_t *creq_first;
    uint64_t create_slots;
    bool pumping;
    /* the janitor's last home, or last namespace, could not be made: waiting creates make
     * theirs on the loop until one is made again */
    bool warm_failing, netns_failing;
    sandbox_t **buckets; /* by id: at most one sandbox a bucket on average when full */
    unsigned bucket_mask;
    sandbox_t *first, *last;
    size_t count;
    /* the sandboxes with an idle timeout, the only ones the once-a-second sweep looks at (with
     * 10,000 live, a walk of all of them was 0.5 % of the server's CPU during creates) */
    sandbox_t *timed_first;
    /* Sandboxes whose handles are open, most recently used first; beyond handles_max the
     * least recently used idle ones close theirs (an idle sandbox then holds one descriptor). */
    sandbox_t *lru_first, *lru_last;
    size_t n_handles, handles_max;
    uint64_t handles_reopened;
    uidpool_t uids;
    landlock_base_t ll;
    sandbox_ns_t ns;
    bool hidepid;
    /* network namespaces made ahead for the next sandboxes (netns_make costs ~0.5 ms) */
    bool have_netns;
    int netns_warm[POOL_NETNS_WARM];
    size_t n_netns_warm, netns_warm_max; /* the max: fewer where descriptors are scarce */
    /* asked of the janitor: namespaces being made, deleted sandboxes' being checked */
    size_t netns_making, netns_checking;
    uint64_t netns_recycled, netns_discarded, netns_made; /* made: by the janitor, ahead */
    timer_t_ netns_refill;
    cgroups_t cg;
    seccomp_filter_t seccomp;
    bool have_seccomp;
    int homes_fd;
    /* every shard made or checked (its empty ones go at shutdown); a start refused over a
     * shard leaves what it found */
    bool shards_made;
    char *homes_json; /* the homes directory escaped for inside a JSON string */
    /* <homes>.trash (root, 0700, the homes' filesystem): deleted homes wait there for the
     * janitor; -1 without one (deletes remove the home on the loop, as before) */
    int trash_fd;
    char trash_path[220];
    uint64_t trash_seq;
    /* <homes>.warm (-1 without): homes the janitor made ahead, each for a uid taken from the
     * pool for it (or kept from the deleted sandbox whose home it was), so that a create is
     * one rename and no chown; asked of the janitor and not answered yet in warm_wait */
    int warm_fd;
    char warm_path[220];
    pool_warm_t warm[POOL_HOMES_WARM_MAX], warm_wait[POOL_HOMES_WARM_MAX];
    size_t n_warm, n_warm_wait;
    uint64_t warm_seq, homes_from_warm;
    uint64_t created_total, deleted_total, teardown_failures;
    uint64_t cmd_seq; /* names of commands' cgroup2 groups */
    /* SBX_TEST_TEARDOWN_KILL_FAILS=1 (tests only): teardown never kills, so a sandbox whose
     * processes outlive the kill can be made on purpose and its uid seen quarantined. */
    bool test_kill_fails;
    /* SBX_TEST_CREATE_FAILS_AT=N (tests only): the Nth sandbox this host creates fails half
     * made (after its home), so that a batch's undo can be seen. */
    uint64_t test_create_fail_at, test_creates;
};

int pool_new(server_t *srv, const pool_config_t *cfg, pool_t **ret, sbx_err_t *err);
pool_t *pool_free(pool_t *p);
static inline void pool_freep(pool_t **p) { (void)pool_free(*p); }
sandbox_t *pool_find(pool_t *p, const char *id, size_t len);
sandbox_t *sandbox_ref(sandbox_t *sb);
void sandbox_unref(sandbox_t *sb);
/* A request working on this sandbox (an upload, a download, an exec stream, a proxy connect):
 * a reference that also keeps idle eviction away until it ends; its end counts as activity. */
sandbox_t *sandbox_hold(sandbox_t *sb);
void sandbox_release(sandbox_t *sb);
/* A request scoped to a sandbox (/v1/sandboxes/{id}/...) holds it as its connection's owner
 * data (conn_set_owner): released when the request ends, or when the tunnel it became closes.
 * Opens its handles first (sandbox_handles; a negative errno when they cannot be opened, and
 * then nothing is held). */
extern const conn_owner_ops_t sandbox_owner_ops;
int conn_scope_sandbox(conn_t *c, sandbox_t *sb); /* takes a hold on sb */
/* The sandbox c's request is scoped to, or NULL (dedicated mode, host-level routes). */
static inline sandbox_t *conn_sandbox(const conn_t *c)
{
    return c->owner_ops == &sandbox_owner_ops ? c->owner : NULL;
}
/* Open what of sb's handles is closed (its home, its ruleset) and mark it used; may close the
 * handles of sandboxes nothing uses. A request, spawn or process that uses the handles holds
 * a reference, which keeps them open. */
int sandbox_handles(sandbox_t *sb);
/* "landlock" or "uid-only" */
const char *sandbox_confinement(const sandbox_t *sb);
/* {"abi": N, "features": ["fs", "refer", ...]} (Hugging Face's names) for an ABI. */
void *landlock_json(int abi);
/* Health detail: Landlock ABI and features in force. */
void pool_health(pool_t *p, void *json_obj);
/* Delete: kill everything of the uid (setsid escapees included), remove the home, recycle the
 * uid only when that converged. 0 when teardown converged; else -EBUSY (processes of the uid
 * survived the kill) or the home's removal error, with err saying which. The sandbox is gone
 * from the pool either way. */
int sandbox_delete(sandbox_t *sb, sbx_err_t *err);
/* Remove parent_fd/name however deep (the janitor's removal; no symlink followed). */
int pool_remove_tree_at(int parent_fd, const char *name);
/* A files-API delete of a directory in sb: a new name in the trash (root 0700, beside the
 * homes) and the trash's descriptor to rename it to, or -1 when there is no trash or no
 * janitor (then it is removed in place); pool_trash_drop has the janitor remove it there. */
int pool_trash_name(sandbox_t *sb, char *name, size_t cap);
void pool_trash_drop(pool_t *p, const char *name);
/* Evict sandboxes idle past their own timeout with nothing running or in flight. */
void pool_evict_idle(pool_t *p, uint64_t now_ms);

/* Prepare a command as this sandbox: the confined child sequence (src/isolation/confine.c)
 * that a spawn helper runs, with stdio on the given fds. cwd is the request's cwd (rooted at the
 * home) or NULL. cands (cap bytes) holds the exec candidates spec points to. *ret_cmdcg names
 * the command's own cgroup2 group for the helper to make (root NULL: none) and *ret_cg its
 * path (its kill_fd comes with the helper's answer). On failure err says why. */
int sandbox_exec_prepare(sandbox_t *sb, char *const *argv, char *const *envp, const char *cwd,
                         int stdin_fd, int stdout_fd, int stderr_fd, confine_spec_t *spec,
                         char *cands, size_t cap, cmdcg_req_t *ret_cmdcg, cmdcg_t *ret_cg,
                         sbx_err_t *err);
/* A command of the sandbox is killed (timeout, kill, client gone): everything in its cgroup2
 * group goes at once, setsid() descendants included. No-op without a group. */
void sandbox_cmd_kill(cmdcg_t *cg);
/* The command is over: its group is removed when empty (else with the sandbox). */
void sandbox_cmd_done(cmdcg_t *cg);
/* A path from a request, relative to the home: an absolute path that starts with the home is
 * taken relative to it; any other path is rooted at the home. Normalized; "" = the home. */
int sandbox_rel_path(const sandbox_t *sb, const char *path, char *out, size_t cap);

/* Host routes. */
void route_sandboxes_create(conn_t *c);
void route_sandboxes_list(conn_t *c);
void route_sandboxes_delete_all(conn_t *c);
void route_sandbox_token(conn_t *c, sandbox_t *sb);
void route_sandbox_delete(conn_t *c, sandbox_t *sb);
