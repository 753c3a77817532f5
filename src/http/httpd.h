/* SPDX-License-Identifier: MIT */
/* The HTTP/1.1 core's server: a listener, its connections (conn.h), their fair limits
 * (connlimit.h) and the tunnels they became (proxy.h), on one loop with the daemon's signals
 * and children (common/reaper.h). It knows no application: each complete request head goes
 * to dispatch(), and what a daemon keeps per server hangs off app, per request off the
 * connection's owner (conn_set_owner), neither interpreted here. sbx-server (the agent),
 * sbx-node and sbx-control are daemons on it. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "common/loop.h"
#include "common/reaper.h"
#include "common/sock.h"
#include "http/conn.h"
#include "http/connlimit.h"

typedef struct {
    uint16_t port;
    char bind[64];
    char unix_path[108];   /* listen on this unix socket instead */
    bool listen_inherited; /* listen on inherited_fd: a bound unix socket handed over */
    /* httpd_init leaves the listener to httpd_listen(): a daemon that may still refuse to start
     * accepts no connection before it knows it will serve */
    bool listen_later;
    int inherited_fd;
    uint64_t max_connections; /* connections + tunnels */
    uint64_t keepalive_ms;
    uint64_t head_timeout_ms, body_timeout_ms, write_timeout_ms;
    /* Fair connection limits (connlimit.h); 0 turns each off. */
    uint64_t max_conns_per_source;
    uint64_t max_unauth_conns;
    uint64_t unauth_head_timeout_ms;
    uint8_t exempt[CLIMIT_EXEMPT_MAX][CLIMIT_SOURCE_KEY]; /* sources without a per-source cap */
    size_t n_exempt;
} httpd_config_t;

typedef struct tunnel tunnel_t;

struct httpd {
    loop_t *loop;
    httpd_config_t cfg;
    int listen_fd;
    watcher_t listen_w;
    reaper_t reaper;
    conn_t *conns;
    size_t n_conns;
    climit_tab_t *sources;           /* connections per source (with max_conns_per_source) */
    conn_t *unauth_old, *unauth_new; /* unauthenticated connections, oldest first */
    size_t n_unauth;
    uint64_t start_ms;
    uint64_t last_activity_ms; /* httpd_touch() */
    tunnel_t *tunnels;         /* established tunnels (proxy.c); count against max_connections */
    size_t n_tunnels;
    /* Route a complete request head; set by the daemon before httpd_run(). */
    void (*dispatch)(conn_t *c);
    /* The transport of accepted connections (TLS); wrap NULL: plain HTTP. */
    sockio_wrap_t transport;
    void *app; /* the daemon's state */
};

/* Set up the loop, the signals and the listener. On failure httpd_done() cleans up. -errno. */
int httpd_init(httpd_t *h, const httpd_config_t *cfg);
/* Open (or take over) the listener and watch it; httpd_init does this unless listen_later. */
int httpd_listen(httpd_t *h);
int httpd_run(httpd_t *h);
/* Close every connection and tunnel, then the loop (what was deferred runs) and the listener. */
void httpd_done(httpd_t *h);
/* Activity: a request was authorized, a tunnel moved bytes. */
void httpd_touch(httpd_t *h);
