/* SPDX-License-Identifier: MIT */
/* sbx-server: shared state of one server process. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/loop.h"
#include "http/conn.h"
#include "pool.h"

#define SBX_VERSION "0.1.0"
#define SBX_PROTOCOL 3
#define SBX_DEFAULT_PORT 49983

typedef struct {
    uint16_t port;
    char bind[64];
    char unix_path[108];   /* SBX_LISTEN=unix:/path */
    bool listen_inherited; /* SBX_LISTEN=fd:N: a bound socket handed over by sbx-node */
    int inherited_fd;
    char *token;              /* NULL with --allow-no-auth */
    uint64_t idle_timeout_ms; /* 0 = never */
    uint64_t max_connections;
    uint64_t keepalive_ms;
    uint64_t head_timeout_ms, body_timeout_ms, write_timeout_ms;
    bool host_mode;
    pool_config_t pool; /* host mode */
    /* Fair connection limits (connlimit.h); 0 turns each off. */
    uint64_t max_conns_per_source;
    uint64_t max_unauth_conns;
    uint64_t unauth_head_timeout_ms;
    uint8_t exempt[CLIMIT_EXEMPT_MAX][CLIMIT_SOURCE_KEY]; /* sources without a per-source cap */
    size_t n_exempt;
} server_config_t;

typedef struct child child_t;
struct child {
    pid_t pid;
    void (*on_exit)(child_t *ch, int wstatus);
    void *data;
    child_t *next;
};

typedef struct proc proc_t;
typedef struct pool pool_t;
typedef struct tunnel tunnel_t;
typedef struct spawner spawner_t;
typedef struct janitor janitor_t;

struct server {
    loop_t *loop;
    server_config_t cfg;
    int listen_fd;
    watcher_t listen_w;
    int sig_fd;
    watcher_t sig_w;
    timer_t_ idle_t;
    conn_t *conns;
    size_t n_conns;
    climit_tab_t *sources;           /* connections per source (with max_conns_per_source) */
    conn_t *unauth_old, *unauth_new; /* unauthenticated connections, oldest first */
    size_t n_unauth;
    uint64_t start_ms;
    uint64_t last_activity_ms;
    unsigned active_ops; /* foreground operations in flight */
    child_t *children;
    tunnel_t *tunnels; /* established proxy tunnels (proxy.c); count against max_connections */
    size_t n_tunnels;
    proc_t *procs;
    size_t n_procs;
    unsigned procs_starting; /* background processes handed to a spawn helper, not answered */
    uint64_t next_proc_id;
    int exit_code;
    pool_t *pool;       /* host mode only */
    janitor_t *janitor; /* host mode: removes deleted homes off the loop (janitor.h) */
    spawner_t *spawner; /* process creation off the loop (spawner.h); started by server_init */
    /* Daemons built on this HTTP core (sbx-node, sbx-control) route requests themselves. */
    void (*dispatch)(conn_t *c);
    /* The transport of accepted connections (TLS); wrap NULL: plain HTTP. */
    sockio_wrap_t transport;
    void *app;
    bool reap_registered_only; /* waitpid() only the children in `children` */
    uint64_t pool_empty_since_ms;
    struct envd_watch *envd_watches; /* envd's polled directory watchers (envd_watch.c) */
};

/* Called by handlers: a request was authorized / an operation starts or ends. */
void server_touch(server_t *s);
void server_op_begin(server_t *s);
void server_op_end(server_t *s);
void server_child_add(server_t *s, child_t *ch);
void server_child_remove(server_t *s, child_t *ch);
/* Reap every exited child now (normally done on SIGCHLD); owners hear of their children. */
void server_reap(server_t *s);
size_t server_running_procs(const server_t *s);

/* Route a complete request head (after auth). */
void router_dispatch(conn_t *c);
int server_init(server_t *s, const server_config_t *cfg);
int server_run(server_t *s);
void server_done(server_t *s);
