/* SPDX-License-Identifier: MIT */
/* Pools inside sbx-control: the store records the three parts share (pools.c: the API;
 * poolalloc.c: making and deleting sandboxes on worker threads; poolsync.c: the reconciler's
 * pass). docs/platform.md, "Pools", says what they do.
 *
 * Store records (every change a compare-and-swap):
 *   pools/<ns>/<pool>               the pool: its spec, state active | draining
 *   poolhosts/<ns>/<pool>/<slot>    one host at slot 0..max_hosts-1: its job, capacity, pending
 *                                   reservations ({id, n, owner, at_ms}), state booting | ready
 *                                   | retiring, the generation of its run its sandboxes live in
 *   poolsbx/<ns>/<pool>/<id>        one sandbox: its host, generation, uid, home; "gone" (the
 *                                   reason) once its host ended or was replaced, or its agent
 *                                   no longer has it
 *   secrets/psb/<ns>/<pool>/<id>    its token, sealed like job secrets
 *
 * A host's slots in use are never a counter: they are its sandbox records that are not gone
 * plus its pending reservations. An allocation writes its sandboxes' records before it removes
 * its reservation, so a sandbox is always counted (twice, briefly: a conservative error); a
 * delete removes the record; nothing can drift. */
#pragma once

#include "control.h"

#define POOL_HOSTS_MAX 64 /* max_hosts at most */
#define POOL_PER_HOST_MAX 4096
#define POOL_COUNT_MAX 1000          /* sandboxes per create request */
#define POOL_ALLOC_MAX_MS 120000     /* an allocation gives up after this long (a host that does */
                                     /* not start, an agent that does not answer) */
#define POOL_PENDING_STALE_MS 300000 /* a reservation older than this is dropped (> the above) */
#define POOL_GONE_KEEP_MS 600000     /* a gone sandbox's record answers 410 this long */
#define POOL_AGENT_CALL_MS 20000     /* one call to a host's agent */
#define POOL_SYNC_CALL_MS 5000       /* the reconciler's calls to an agent */

static inline json_int_t jint(json_t *o, const char *k)
{
    return json_integer_value(json_object_get(o, k));
}
static inline const char *jstr(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

void pool_msleep(unsigned ms);
/* Tests: SBX_TEST_POOL_RACE_MS widens the windows between reading a host record and writing it
 * (a reservation, a new host, a live count), so that concurrent requests surely overlap there. */
unsigned pool_race_window_ms(void);
/* Zero every string of j (tokens) and drop it. */
void pool_json_wipe(json_t *j);

void pool_key(char *out, size_t cap, const char *ns, const char *pool);
void pool_sbx_prefix(char *out, size_t cap, const char *ns, const char *pool);
void pool_sbx_key(char *out, size_t cap, const char *ns, const char *pool, const char *id);
void pool_token_key(char *out, size_t cap, const char *ns, const char *pool, const char *id);
bool pool_sandbox_id_valid(const char *s);

/* The host records of a pool (each with "_key" and "_rev"), or NULL on a store error. */
json_t *pool_hosts_load(store_t *st, const char *ns, const char *pool);
/* Sandbox records that are not gone, per host job: {job: n}; NULL on a store error. A listing
 * of every record of the pool: used where a host record has no live count (pool_host_live). */
json_t *pool_live_counts(store_t *st, const char *ns, const char *pool);
/* Host h's live count: its sandbox records that are not gone, kept in the host record by every
 * change of one of them (pool_host_txn); -1 in a record written before the count was kept,
 * until the reconciler counts it (poolsync.c). */
json_int_t pool_host_live(json_t *h);
/* Whether every host record of hosts has a live count (then no listing is needed). */
bool pool_hosts_counted(json_t *hosts);
json_int_t pool_host_pending(json_t *h);
/* Host h's live sandboxes: its live count, or where it has none the count in live (from
 * pool_live_counts). */
json_int_t pool_host_used(json_t *h, json_t *live);
/* Slots of host h free: its capacity less pool_host_used and its reservations. */
json_int_t pool_host_free(json_t *h, json_t *live);
/* Write ops[0..n) (records of host job's sandboxes: each put or delete that makes one live or
 * not) and, in the same transaction, the host record of job with its live count moved by delta
 * and the reservation drop_rid (NULL: none) removed: read again and retried when another write
 * changed it first. host_key: the record's key, or NULL to look it up among the pool's hosts.
 * Where no host record has that job any more, ops alone. ops must have room for n + 1.
 * -ESTALE with *ret_failed (< n) when one of ops failed its comparison; other -errno as
 * store_txn. */
int pool_host_txn(store_t *st, const char *ns, const char *pool, const char *host_key,
                  const char *job, json_int_t delta, const char *drop_rid, store_op_t *ops,
                  size_t n, size_t *ret_failed);
bool pool_host_takes(json_t *h); /* booting or ready */
/* Change the host record at key (whose job must be `job`) by edit(h, arg): 0 saves, 1 leaves it,
 * < 0 stops with that error; read again and retried on a concurrent change. -ENOENT when the
 * record is gone or another job's. */
int pool_host_edit(store_t *st, const char *key, const char *job, int (*edit)(json_t *h, void *arg),
                   void *arg);
/* Remove reservation rid from the host record. */
int pool_host_settle(store_t *st, const char *key, const char *job, const char *rid);

/* The host job's token (its SBX_TOKEN secret). */
int pool_host_token(store_t *st, const seal_keys_t *seal, const char *job, char *out, size_t cap);
/* A new pool host's job, with the id its host record names already. */
int pool_host_job_create(store_t *st, const seal_keys_t *seal, const char *default_image,
                         json_t *pool, const char *ns, const char *job_id, sbx_err_t *err);
/* What list and inspect show of a sandbox record (never its token). */
json_t *pool_sandbox_view(json_t *s, const char *ns, const char *pool);
/* The key of the host record a sandbox record was made on ("host_key"); NULL for a record from
 * before it was kept (its host is then found by job among the pool's hosts). */
const char *pool_sandbox_host_key(json_t *s);

/* poolalloc.c: worker tasks */
typedef struct {
    char ns[64], pool[64];
    char *body;
    size_t body_len;
} pool_alloc_arg_t;
void pool_alloc_arg_free(void *p);
void pool_alloc_fn(worker_t *w, void *arg, work_result_t *res);
typedef struct {
    char ns[64], pool[64], id[17];
} pool_del_arg_t;
void pool_delete_fn(worker_t *w, void *arg, work_result_t *res);
