/* SPDX-License-Identifier: MIT */
#include "routecache.h"

#include <stdlib.h>
#include <string.h>

#include "common/macro.h"

struct route_entry {
    route_t r;
    uint64_t expires_ms;
    route_entry_t *next;
};

static size_t hash(const char *s)
{
    size_t h = 1469598103934665603ULL; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

int routecache_init(routecache_t *rc, size_t max_entries)
{
    *rc = (routecache_t){ .max = max_entries ? max_entries : 1 };
    rc->n_buckets = 1024;
    rc->buckets = calloc(rc->n_buckets, sizeof *rc->buckets);
    return rc->buckets ? 0 : -ENOMEM;
}

void routecache_free(routecache_t *rc)
{
    for (size_t i = 0; rc->buckets && i < rc->n_buckets; i++)
        while (rc->buckets[i]) {
            route_entry_t *e = rc->buckets[i];
            rc->buckets[i] = e->next;
            free(e);
        }
    free(rc->buckets);
    *rc = (routecache_t){ 0 };
}

bool route_equal(const route_t *a, const route_t *b)
{
    return streq(a->job, b->job) && cap_run_equal(&a->run, &b->run) && streq(a->host, b->host) &&
           a->port == b->port && a->rev == b->rev;
}

static route_entry_t **find(routecache_t *rc, const char *job)
{
    route_entry_t **pp = &rc->buckets[hash(job) % rc->n_buckets];
    for (; *pp; pp = &(*pp)->next)
        if (streq((*pp)->r.job, job))
            return pp;
    return pp;
}

static void unlink_entry(routecache_t *rc, route_entry_t **pp)
{
    route_entry_t *e = *pp;
    *pp = e->next;
    free(e);
    rc->n--;
}

/* Make room: drop expired entries, then (still full) the first ones found. */
static void evict(routecache_t *rc, uint64_t now_ms)
{
    for (size_t i = 0; i < rc->n_buckets && rc->n >= rc->max; i++)
        for (route_entry_t **pp = &rc->buckets[i]; *pp;)
            if ((*pp)->expires_ms <= now_ms)
                unlink_entry(rc, pp);
            else
                pp = &(*pp)->next;
    for (size_t i = 0; i < rc->n_buckets && rc->n >= rc->max; i++)
        while (rc->buckets[i] && rc->n >= rc->max)
            unlink_entry(rc, &rc->buckets[i]);
}

bool routecache_get(routecache_t *rc, const char *job, uint64_t now_ms, route_t *ret)
{
    route_entry_t **pp = find(rc, job);
    if (!*pp)
        return false;
    if ((*pp)->expires_ms <= now_ms) {
        unlink_entry(rc, pp);
        return false;
    }
    *ret = (*pp)->r;
    return true;
}

int routecache_put(routecache_t *rc, const route_t *r, uint64_t now_ms, uint64_t ttl_ms)
{
    route_entry_t **pp = find(rc, r->job);
    if (*pp) {
        (*pp)->r = *r;
        (*pp)->expires_ms = now_ms + ttl_ms;
        return 0;
    }
    if (rc->n >= rc->max) {
        evict(rc, now_ms);
        pp = find(rc, r->job);
    }
    route_entry_t *e = calloc(1, sizeof *e);
    if (!e)
        return -ENOMEM;
    e->r = *r;
    e->expires_ms = now_ms + ttl_ms;
    *pp = e;
    rc->n++;
    return 0;
}

bool routecache_replace(routecache_t *rc, const route_t *rejected, const route_t *fresh,
                        uint64_t now_ms)
{
    if (!streq(rejected->job, fresh->job))
        return false;
    route_entry_t **pp = find(rc, rejected->job);
    if (!*pp || (*pp)->expires_ms <= now_ms || !route_equal(&(*pp)->r, rejected))
        return false;
    (*pp)->r = *fresh; /* the expiry stays what it was */
    return true;
}

void routecache_drop(routecache_t *rc, const char *job, const route_t *expected)
{
    route_entry_t **pp = find(rc, job);
    if (*pp && (!expected || route_equal(&(*pp)->r, expected)))
        unlink_entry(rc, pp);
}
