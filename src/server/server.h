/* SPDX-License-Identifier: MIT */
/* sbx-server: shared state of one agent process. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/loop.h"
#include "common/reaper.h"
#include "http/conn.h"
#include "http/httpd.h"
#include "pool.h"

typedef struct server server_t;

#define SBX_VERSION "0.1.0"
#define SBX_PROTOCOL 3
#define SBX_DEFAULT_PORT 49983

/* The agent's settings; the HTTP core's (listener, timeouts, limits) are in http. */
typedef struct {
    httpd_config_t http;
    char *token;              /* NULL with --allow-no-auth */
    uint64_t idle_timeout_ms; /* 0 = never */
    bool host_mode;
    pool_config_t pool; /* host mode */
} server_config_t;

typedef struct proc proc_t;
typedef struct pool pool_t;
typedef struct spawner spawner_t;
typedef struct janitor janitor_t;

/* sbx-server, the in-sandbox agent: processes, files, the port proxy and (host mode) the pool,
 * on the HTTP core (http/httpd.h), whose app points back here. */
struct server {
    httpd_t http;
    loop_t *loop; /* http.loop */
    server_config_t cfg;
    timer_t_ idle_t;
    unsigned active_ops; /* foreground operations in flight */
    unsigned listings;   /* listings in flight (files.c: listing_slot_take) */
    proc_t *procs;
    size_t n_procs;
    unsigned procs_starting; /* background processes handed to a spawn helper, not answered */
    uint64_t next_proc_id;
    int exit_code;
    pool_t *pool;       /* host mode only */
    janitor_t *janitor; /* host mode: removes deleted homes off the loop (janitor.h) */
    spawner_t *spawner; /* process creation off the loop (spawner.h); started by server_init */
    uint64_t pool_empty_since_ms;
    struct envd_watch *envd_watches; /* envd's polled directory watchers (envd_watch.c) */
    struct envd_watch *envd_streams; /* envd's WatchDir streams (envd_watch.c) */
    /* inotify instances and watched directories this server holds, and the most it may hold
     * (half of its uid's kernel limits; 0: not read yet): envd_watch.c */
    unsigned watch_instances, watch_instances_max;
    uint64_t watch_dirs, watch_dirs_max;
};

/* The agent a request came to. */
static inline server_t *server_of(const conn_t *c) { return c->srv->app; }

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
