/* SPDX-License-Identifier: MIT */
/* sbx-node: the worker. It holds the installed run records, verifies every request's
 * capability against them (cap_compare), forwards allowed requests over a verified bridge to the
 * run's agent, and cuts every stream of a run the moment the run is replaced or retired. */
#pragma once

#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "cap/cap.h"
#include "common/err.h"
#include "common/httpc.h"
#include "http/httpd.h"
#include "http/relay.h"
#include "isolation/cgroup.h"
#include "isolation/filter.h"
#include "isolation/idrange.h"
#include "node/image.h"
#include "tls/tls.h"

#define NODE_MAX_EXPOSE 16
#define NODE_INSTALL_BODY_MAX (1024 * 1024)
#define RUN_DISK_DEFAULT_MB 4096 /* a run's disk when its flavor names none */
#define NODE_DISK_KEEP_MB 256    /* of the node's disk never promised to runs (its logs, store) */
#define NODE_BOUND_BODY_MAX (1024 * 1024) /* bodies whose digest a capability names, at most */

typedef enum { RUN_RUNNING, RUN_PAUSED, RUN_EXITED } run_state_t;

typedef struct lease lease_t;
typedef struct install install_t;
typedef struct run run_t;

typedef struct relay relay_t;

#define RUN_IDLE_BRIDGE 4
#define RUN_IDLE_BRIDGE_MS 10000 /* a kept bridge connection is used again within this time */

/* A stream bound to a run's identity epoch: a relay or an established tunnel to the run's
 * agent. */
struct lease {
    run_t *run;
    tunnel_t *tunnel;
    relay_t *relay;
    bool keep_bridge; /* the agent's own route: its bridge connection may serve the next */
    lease_t *prev, *next;
};

struct run {
    struct node *node; /* whose run it is */
    cap_run_t id;
    run_state_t state;
    char dir[PATH_MAX];  /* <state>/runs/<sandbox> (0700) */
    char sock_path[108]; /* <dir>/br/a.sock; br/ is 0700 */
    cap_expose_t expose[NODE_MAX_EXPOSE];
    size_t n_expose;
    bool pool_host;
    uint32_t id_base;    /* the run's ids 0..65535 are host ids id_base.. (its user namespace) */
    uint64_t disk_bytes; /* its disk's size (the flavor's) while it is being made */
    char image[64];      /* "host" or the name of an image of the node's --images */
    char image_rootfs[PATH_MAX]; /* its verified rootfs (resolved at install), or "" */
    bool egress;                 /* network "egress": a firewall and pasta (egress.c) */
    pid_t pasta_pid;             /* its pasta, or 0; with the start time that names it */
    uint64_t pasta_start;
    child_t pasta_child;
    pid_t holder_pid; /* the holder of its network namespace (egress), or 0 */
    uint64_t holder_start;
    child_t holder_child;
    /* its stdout and stderr: a fifo the node reads into the log (which the run cannot reach) */
    int out_fd, log_fd;
    uint64_t log_bytes;
    watcher_t out_w;
    loop_t *out_loop; /* where out_w is watched, NULL if not */
    /* what the bridge peer must be */
    pid_t pid;
    uint64_t start_time;
    dev_t exe_dev;
    ino_t exe_ino;
    ino_t sock_ino;
    uid_t sock_uid;
    int stat_fd;     /* /proc/<pid>/stat of the run's process, or -1 */
    bool installing; /* its install has not ended: recorded as "installing" (a restarted node
                      * kills what such a record names: nothing half-installed lives on) */
    int exit_status; /* RUN_EXITED: wait status */
    uint32_t cg_slot;
    child_t child;
    lease_t *leases;
    size_t n_leases;
    /* verified bridge connections to the agent kept for the next relayed request (closed with
     * the leases: a run that stops keeps none) */
    relay_conn_t *idle[RUN_IDLE_BRIDGE]; /* parked (relay.h): still registered with the loop */
    int n_idle;
    run_t *next;
};

typedef struct {
    char name[CAP_ID_MAX]; /* node id */
    char state_dir[PATH_MAX];
    char agent_bin[PATH_MAX];
    char control_host[64];
    uint16_t control_port;
    char join_token[128];
    uint8_t control_pk[CAP_PK_BYTES]; /* the control plane's identity, pinned at join */
    char advertise[128]; /* "http://127.0.0.1:port" as the control plane should call us */
    uint64_t capacity;
    uint32_t disk_overcommit;      /* runs' disks may promise this many times the free space */
    uint32_t id_start, id_count;   /* subordinate ids for runs' user namespaces */
    char images_dir[PATH_MAX];     /* OCI image layouts (image.h); IMAGE_DEFAULT_DIR */
    bool plain_http;               /* --insecure-plain-http: no TLS (loopback only) */
    uint8_t ca_pin[TLS_PIN_BYTES]; /* the control plane's CA, pinned at join */
} node_config_t;

/* The images this node verified and unpacked (images.c); v and bad under lock. */
typedef struct {
    pthread_mutex_t lock;
    bool inited, started;
    volatile bool stopping;
    pthread_t thread;
    image_t *v; /* what registration and heartbeats report */
    size_t n;
    image_entry_t *bad; /* what failed, and why (logged once per reason) */
    size_t n_bad;
} node_images_t;

typedef struct node {
    httpd_t srv;
    node_config_t cfg;
    run_t *runs;
    size_t n_runs;
    cgroups_t cg;
    uint32_t next_slot;
    idrange_t ids;
    seccomp_filter_t filter_run, filter_pool; /* the runs' seccomp profiles, built once */
    char *ld_cache; /* the host's /etc/ld.so.cache, for a fresh run's /etc */
    size_t ld_cache_len;
    /* The verification key set: written by the control-plane thread, read by the loop. */
    pthread_mutex_t keys_lock;
    cap_keyset_t keys;
    uint64_t keys_version; /* of the signed set held (0: none yet) */
    bool keys_current;     /* that set came from the control plane since this process started */
    char keyset_wire[CAP_KEYSET_WIRE_MAX]; /* that set as signed (kept in DIR/keyset) */
    cap_replay_t replay;                   /* single-use ids seen (the loop's; on disk too) */
    cap_verifycache_t verified;            /* capabilities whose signature held (keys_lock) */
    bool registered;
    pthread_t agent_thread;
    bool agent_started;
    volatile bool stopping;
    char node_token[128];
    json_t *runs_report;  /* what the next heartbeat reports (under keys_lock) */
    int64_t disk_room_mb; /* and the room for runs' disks (node_disk_room), MiB */
    install_t *installs;  /* in progress */
    timer_t_ report_t;
    node_images_t images;
    /* TLS (tlsid.c): the listener's context (swapped under tls_lock), the client's */
    pthread_mutex_t tls_lock;
    tls_ctx_t *tls_server, *tls_client;
    char *tls_pub;     /* our public key, PEM, for registration */
    char crash_at[64]; /* SBX_TEST_CRASH_AT (tests only): the named step exits the node */
} node_t;

/* tlsid.c */
int node_tls_init(node_t *n);
int node_tls_install_cert(node_t *n, const char *chain);
/* Make rq a TLS request to ip (and name, when not NULL: TLS_CONTROL_NAME for the control
 * plane) checked against the pinned CA (no-op in plain mode). */
void node_tls_peer(node_t *n, const char *ip, const char *name, tls_peer_t *peer,
                   httpc_request_t *rq);
void node_tls_done(node_t *n);

/* node.c */
int node_init(node_t *n, const node_config_t *cfg, const httpd_config_t *scfg);
/* Write the unexpired single-use ids (node.replay) to the state directory (node.c). */
int node_used_ids_save(node_t *n);
int node_run(node_t *n);
void node_done(node_t *n);
run_t *node_find_run(node_t *n, const char *sandbox);
/* A named step of a lifecycle transition ("install:after_spawn", ...): when SBX_TEST_CRASH_AT
 * names it, the node exits at once with status 137, as if killed there (fault tests; the
 * steps are listed in docs/platform.md). */
void node_crash_point(const node_t *n, const char *step);

/* runs.c: install / pause / retire, leases */
int run_install_prepare(node_t *n, const cap_run_t *id, json_t *spec, sbx_err_t *err, run_t **ret);
int run_install_dirs(node_t *n, run_t *r, json_t *spec, sbx_err_t *err);
int run_install_spawn(node_t *n, run_t *r, json_t *spec, sbx_err_t *err);
int run_probe_ready(run_t *r, sbx_err_t *err);
void run_install_finish(node_t *n, run_t *r, int rc);
void run_stop(node_t *n, run_t *r);   /* cut leases, kill the process tree; keeps the root */
void run_retire(node_t *n, run_t *r); /* stop and forget it; removes its directory */
lease_t *run_lease_new(run_t *r);
void run_lease_on_close(tunnel_t *t, void *data); /* the tunnel callback; frees the lease */
json_t *run_json(const run_t *r);
void run_cut_leases(run_t *r);
/* A kept, verified bridge connection of the run that is still open, or NULL; and back. */
relay_conn_t *run_bridge_take(run_t *r);
void run_bridge_put(run_t *r, relay_conn_t *k);
int run_save(const run_t *r);
void node_load_runs(node_t *n);
int run_state_archive_start(node_t *n, run_t *r, conn_t *c); /* answers c itself */
void run_free(run_t *r);
void run_unmount_disk(const run_t *r); /* nothing of the run uses its disk any more */
/* What more the node's disk can take of runs' disks, in bytes (negative: it is promised past
 * its free space): its free space less NODE_DISK_KEEP_MB (times --disk-overcommit), less what
 * each run's disk but skip's may still grow into (its size less the blocks it holds; a disk being made counts whole). An
 * install of a disk larger than that is refused (507), and heartbeats report it, so that the
 * control plane places a run only where its flavor's disk fits. */
int64_t node_disk_room(node_t *n, const run_t *skip);
uint64_t run_disk_unwritten(const run_t *r); /* what r's disk may still take, in bytes */

/* bridge.c: connect to the run's agent and verify who answers */
int bridge_connect(const run_t *r, int *ret_fd, sbx_err_t *err);

/* agent.c: registration and heartbeats with sbx-control (a thread) */
int node_agent_start(node_t *n);
void node_token_load(node_t *n);  /* before node_agent_start */
void node_keyset_load(node_t *n); /* the last good signed key set, before node_agent_start */
/* Take a signed key set (from the control plane or DIR/keyset): it must verify with the pinned
 * identity and be no older than the one held (the same version must be the same bytes).
 * 0 (taken or unchanged), -EPERM (another signer), -EBADMSG, -ESTALE (older or different). */
int node_keyset_apply(node_t *n, const char *wire, bool persist);
void node_agent_stop(node_t *n);

/* install.c: installs run off the loop where they block (directories, restore, readiness).
 * install_start takes the request body already collected in c->body (its digest checked). */
void install_start(node_t *n, conn_t *c, const cap_run_t *id);
bool install_in_progress(node_t *n, const char *sandbox);
/* What the disks of the runs being installed (but skip) may still take, in bytes. */
uint64_t installs_unwritten(node_t *n, const run_t *skip);
void install_abandon_all(node_t *n);

/* ingress.c */
void node_dispatch(conn_t *c);
int status_from_cap_verdict(cap_verdict_t v, cap_reason_t why);
void node_refuse(conn_t *c, cap_verdict_t v, cap_reason_t why, const char *msg);
