/* SPDX-License-Identifier: MIT */
/* The edge proxy's route cache: job id -> the run that serves it and the node to reach it.
 *
 * Entries expire (ttl) and are then looked up again in the store. A node's RefreshRoute answer
 * repairs an entry by compare-and-swap against the route that was rejected: when another
 * request has already installed a newer route, a late refusal of the old one changes nothing.
 * A repair keeps the entry's original expiry (repairing a route is not re-authorizing it). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cap/cap.h"

typedef struct {
    char job[128]; /* "<namespace>/<job id>" */
    cap_run_t run;
    char host[64]; /* node address (numeric) */
    uint16_t port;
    int64_t rev; /* store mod revision of the run record this came from */
} route_t;

typedef struct route_entry route_entry_t;

typedef struct {
    route_entry_t **buckets;
    size_t n_buckets, n, max;
} routecache_t;

int routecache_init(routecache_t *rc, size_t max_entries);
void routecache_free(routecache_t *rc);

/* The live entry for job (copied into *ret), or false when absent or expired. */
bool routecache_get(routecache_t *rc, const char *job, uint64_t now_ms, route_t *ret);
/* Insert or overwrite with a fresh expiry now + ttl_ms (a route read from the store). */
int routecache_put(routecache_t *rc, const route_t *r, uint64_t now_ms, uint64_t ttl_ms);
/* Replace the entry for rejected->job with fresh, only if the current entry is still exactly
 * rejected (same run identity, node and revision). Keeps the entry's expiry. Returns true if
 * replaced. Absent or expired entries are not resurrected. */
bool routecache_replace(routecache_t *rc, const route_t *rejected, const route_t *fresh,
                        uint64_t now_ms);
/* Drop the entry for job if it still equals expected (NULL: whatever it is). */
void routecache_drop(routecache_t *rc, const char *job, const route_t *expected);
bool route_equal(const route_t *a, const route_t *b);
