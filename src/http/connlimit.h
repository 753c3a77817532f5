/* SPDX-License-Identifier: MIT */
/* Fair connection limits for the daemons built on the HTTP core (sbx-control, sbx-node), so
 * that one peer cannot push everyone else to "503 too many connections". Each limit is off
 * when its setting is 0; the agent (sbx-server) sets none.
 *
 * 1. Per source (httpd_config_t.max_conns_per_source): connections open at once from one
 *    source, which is a peer's IPv4 address or the /64 of its IPv6 address (an IPv4-mapped
 *    IPv6 address is its IPv4 address). Sources listed in exempt[] have no per-source cap
 *    (sbx-node: its control plane). A connection over the cap is refused at accept, alone:
 *    503 with Retry-After, and no other connection is touched. Unix-socket peers are no
 *    source (the agent's only peer is its node).
 *
 * 2. Unauthenticated connections (max_unauth_conns, unauth_head_timeout_ms). A connection is
 *    unauthenticated until a request on it authenticates (the daemon calls
 *    climit_authenticated(): sbx-control after a bearer token resolves to a principal, sbx-node
 *    after a capability verifies). While it waits for a request head (idle, or a head partly
 *    received) an unauthenticated connection has unauth_head_timeout_ms, counted from its
 *    accept or from the end of its previous response, then it is closed (a partial head gets
 *    408 first). Admission, for a connection that passed 1:
 *      - if unauthenticated connections number max_unauth_conns or more, or the table is full
 *        (connections + tunnels >= max_connections), the oldest unauthenticated connection
 *        that is waiting for a request head (oldest by accept) is closed to make room; only
 *        when there is none (every unauthenticated connection has a request in progress; in
 *        a full table that means the table is full of authenticated connections and requests)
 *        is the new connection refused: 503 with Retry-After.
 *    An authenticated connection is never closed to make room, so idle floods, from however
 *    many sources, can hold at most max_unauth_conns connections for at most
 *    unauth_head_timeout_ms each, and an authenticated client's new connection is admitted.
 *    max_unauth_conns = 0 turns both the share and the shedding off (a full table refuses).
 *
 * 3. Per owner: the daemon's own counter table (climit_tab_t), keyed by whatever it chooses
 *    (sbx-control: the principal a bearer token resolves to). climit_set_owner() counts a
 *    connection under a key, at most `limit` at once; the connection code knows nothing of
 *    owners and only releases what a connection holds when it ends.
 *
 * What a connection holds (its source's and its owner's counters) moves with its socket into
 * the tunnel it may become (proxy.c), and is released when that ends. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

typedef struct httpd httpd_t;
typedef struct conn conn_t;
typedef struct climit_tab climit_tab_t;
typedef struct climit_ent climit_ent_t;

#define CLIMIT_KEY_MAX 96      /* bytes of a key (a principal or node name fits) */
#define CLIMIT_SOURCE_KEY 9    /* a source key: family tag + 4 (IPv4) or 8 (IPv6 /64) bytes */
#define CLIMIT_EXEMPT_MAX 8    /* exempt sources a server takes */
#define CLIMIT_RETRY_AFTER_S 1 /* what refusals tell the client to wait */

/* What one connection (or tunnel) holds. Zero-initialized: nothing. */
typedef struct {
    climit_ent_t *source; /* its source's counter (NULL: not counted) */
    climit_ent_t *owner;  /* the daemon's owner counter (NULL: none) */
} climit_hold_t;

/* Keyed counters: an entry exists while its count is above 0. */
int climit_tab_new(climit_tab_t **ret);
climit_tab_t *climit_tab_free(climit_tab_t *t); /* entries still held must be released first */
/* Count one more under key (len <= CLIMIT_KEY_MAX). limit 0: no limit. Returns 0 with *ret,
 * -EUSERS when key already counts limit, -EINVAL, -ENOMEM. */
int climit_acquire(climit_tab_t *t, const void *key, size_t len, uint64_t limit,
                   climit_ent_t **ret);
void climit_release(climit_ent_t *e); /* NULL-safe */
uint64_t climit_count(const climit_ent_t *e);
size_t climit_tab_size(const climit_tab_t *t); /* keys with a count above 0 */
void climit_hold_release(climit_hold_t *h);

/* The source key of a peer address: its length (CLIMIT_SOURCE_KEY), or 0 for a peer that is
 * no source (not IPv4/IPv6). */
size_t climit_source_key(const struct sockaddr *sa, socklen_t len, uint8_t key[CLIMIT_SOURCE_KEY]);
/* The same for a numeric address ("10.0.0.1", "fd00::1", "[fd00::1]"): -EINVAL if none. */
int climit_source_key_parse(const char *addr, uint8_t key[CLIMIT_SOURCE_KEY]);

/* Accept-time admission of a new connection from sa (see 1 and 2 above). Returns 0 with *ret
 * (the counters the connection holds from now), or -EUSERS (its source is at its cap) or
 * -EBUSY (no room): refuse it. May close the oldest waiting unauthenticated connection. */
int climit_admit(httpd_t *s, const struct sockaddr *sa, socklen_t len, climit_hold_t *ret);

/* Called by conn.c: a connection joins (taking *hold) or leaves the server's table; the
 * deadline of a connection waiting for a head, given the regular one. */
void climit_conn_added(conn_t *c, climit_hold_t *hold);
void climit_conn_removed(conn_t *c);
uint64_t climit_head_due(const conn_t *c, uint64_t due);

/* Called by daemons: a request on c authenticated (c leaves the unauthenticated group for
 * good). */
void climit_authenticated(conn_t *c);
/* Count c under key in the daemon's table t, at most limit (0: no limit) connections at once;
 * a connection already counted under another key moves. Returns 0, or -EUSERS (over the
 * limit: c is not counted under key and keeps what it had) or -ENOMEM. */
int climit_set_owner(conn_t *c, climit_tab_t *t, const void *key, size_t len, uint64_t limit);
