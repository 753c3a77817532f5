/* SPDX-License-Identifier: MIT */
/* The reconciler's pass over pools (level-triggered, from the store alone, each change a
 * compare-and-swap): hosts follow their jobs (an ended host is dropped and its sandboxes are
 * gone; a host whose run was replaced keeps its slot, empty), each ready host's sandbox records
 * are compared with its agent's list, reservations of control processes that are gone are
 * dropped, empty hosts retire after host_idle_s keeping `warm`, missing warm hosts boot, a
 * draining pool is emptied and removed, and records of pools that no longer exist go.
 *
 * A store error is never taken as an answer: what cannot be read is left for the next pass. */
#include <sodium.h>
#include <stdio.h>

#include "common/log.h"
#include "pools.h"

#define SYNC_EVERY_MS 3000    /* each ready host's sandboxes are compared this often */
#define ORPHAN_GRACE_MS 60000 /* a sandbox its agent has and no record names is deleted then */
#define ORPHAN_SWEEP_MS 10000 /* records of pools that are gone are looked for this often */
#define NEVER_MADE_MS 30000   /* a host record whose job does not exist this long is dropped */

/* Save sandbox record s (at key, read at rev) gone: with its token removed and its host's live
 * count down by one, in one transaction (pool_host_txn; host_key NULL: looked up). */
static int record_gone(store_t *st, const char *ns, const char *pool, const char *host_key,
                       const char *job, const char *key, int64_t rev, json_t *s)
{
    char tkey[200];
    pool_token_key(tkey, sizeof tkey, ns, pool, jstr(s, "id"));
    _cleanup_free_ char *v = json_dumps(s, JSON_COMPACT | JSON_SORT_KEYS); /* as record_save */
    if (!v)
        return -ENOMEM;
    store_op_t ops[3] = { { .key = key, .value = v, .len = strlen(v), .expect_rev = rev },
                          { .key = tkey, .expect_rev = STORE_REV_ANY } };
    return pool_host_txn(st, ns, pool, host_key, job, -1, NULL, ops, 2, NULL);
}

/* Mark the sandboxes of host job (of generations below below_gen; 0: all) gone, each by
 * compare-and-swap, its token removed after. Returns how many, or -errno (nothing certain). */
static int sandboxes_gone(store_t *st, const char *ns, const char *pool, const char *job,
                          uint64_t below_gen, const char *reason)
{
    char prefix[160];
    pool_sbx_prefix(prefix, sizeof prefix, ns, pool);
    store_kv_t *kvs;
    size_t n;
    int r = store_list(st, prefix, &kvs, &n), k = 0;
    if (r < 0)
        return r;
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_loadb(kvs[i].value, kvs[i].value_len, 0, NULL);
        if (!json_is_object(s) || *jstr(s, "gone") || !streq(jstr(s, "host"), job) ||
            (below_gen && (uint64_t)jint(s, "generation") >= below_gen)) {
            json_decref(s);
            continue;
        }
        json_object_set_new(s, "gone", json_string(reason));
        json_object_set_new(s, "gone_ms", json_integer(wall_ms()));
        r = record_gone(st, ns, pool, pool_sandbox_host_key(s), job, kvs[i].key, kvs[i].rev, s);
        if (r == 0) {
            k++;
            log_info("pool %s/%s: sandbox %s gone: %s", ns, pool, jstr(s, "id"), reason);
        }
        json_decref(s);
        if (r < 0 && r != -ESTALE) {
            store_kv_free(kvs, n);
            return r;
        }
    }
    store_kv_free(kvs, n);
    return k;
}

/* Delete gone records older than POOL_GONE_KEEP_MS (every record when all). */
static void gone_sweep(store_t *st, const char *ns, const char *pool, bool all)
{
    char prefix[160];
    pool_sbx_prefix(prefix, sizeof prefix, ns, pool);
    store_kv_t *kvs;
    size_t n;
    if (store_list(st, prefix, &kvs, &n) < 0)
        return;
    int64_t now = wall_ms();
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_loadb(kvs[i].value, kvs[i].value_len, 0, NULL);
        if (json_is_object(s) &&
            (all || (*jstr(s, "gone") && now - jint(s, "gone_ms") > POOL_GONE_KEEP_MS))) {
            char tkey[200];
            pool_token_key(tkey, sizeof tkey, ns, pool, jstr(s, "id"));
            if (store_del(st, kvs[i].key, kvs[i].rev) == 0)
                (void)store_del(st, tkey, STORE_REV_ANY);
        }
        json_decref(s);
    }
    store_kv_free(kvs, n);
}

static bool sync_due(pool_syncs_t *ps, const char *job, int64_t now)
{
    size_t free_i = SIZE_MAX, oldest = 0;
    for (size_t i = 0; i < ELEMENTSOF(ps->at); i++) {
        if (streq(ps->at[i].job, job)) {
            if (now - ps->at[i].ms < SYNC_EVERY_MS)
                return false;
            ps->at[i].ms = now;
            return true;
        }
        if (!ps->at[i].job[0] && free_i == SIZE_MAX)
            free_i = i;
        if (ps->at[i].ms < ps->at[oldest].ms)
            oldest = i;
    }
    size_t i = free_i != SIZE_MAX ? free_i : oldest;
    (void)snprintf(ps->at[i].job, sizeof ps->at[i].job, "%s", job);
    ps->at[i].ms = now;
    return true;
}

/* Since when (this control's clock) sandbox id has been seen on its agent without a record. */
static int64_t orphan_since(pool_syncs_t *ps, const char *id, int64_t now)
{
    size_t free_i = SIZE_MAX, oldest = 0;
    for (size_t i = 0; i < ELEMENTSOF(ps->orphans); i++) {
        if (streq(ps->orphans[i].id, id))
            return ps->orphans[i].since_ms;
        if (!ps->orphans[i].id[0] && free_i == SIZE_MAX)
            free_i = i;
        if (ps->orphans[i].since_ms < ps->orphans[oldest].since_ms)
            oldest = i;
    }
    size_t i = free_i != SIZE_MAX ? free_i : oldest;
    (void)snprintf(ps->orphans[i].id, sizeof ps->orphans[i].id, "%s", id);
    ps->orphans[i].since_ms = now;
    return now;
}

static void orphan_forget(pool_syncs_t *ps, const char *id)
{
    for (size_t i = 0; i < ELEMENTSOF(ps->orphans); i++)
        if (streq(ps->orphans[i].id, id))
            ps->orphans[i].id[0] = 0;
}

static void delete_orphan(control_t *ctl, store_t *st, const keyring_t *kr, const runrec_t *rr,
                          const char *host_token, const char *id)
{
    char path[96];
    int status = 0;
    json_t *t = NULL;
    (void)snprintf(path, sizeof path, "/v1/sandboxes/%s/token", id);
    if (agent_call(ctl, st, kr, rr, "GET", path, host_token, NULL, POOL_SYNC_CALL_MS, &status, &t,
                   NULL) == 0 &&
        status == 200) {
        (void)snprintf(path, sizeof path, "/v1/sandboxes/%s", id);
        if (agent_call(ctl, st, kr, rr, "DELETE", path, jstr(t, "token"), NULL, POOL_SYNC_CALL_MS,
                       &status, NULL, NULL) == 0 &&
            status == 200)
            log_warn("deleted sandbox %s on pool host %s: no record names it (an allocation "
                     "that did not finish)",
                     id, rr->run.sandbox);
    }
    pool_json_wipe(t);
}

/* Compare the host's sandbox records with what its agent has: a record the agent no longer has
 * (its idle timeout, a delete on the host) is gone; a sandbox the agent has and no record names
 * (an allocation that crashed before recording) is deleted there, at once when no reservation
 * is pending on the host, else after ORPHAN_GRACE_MS. Returns
 * how many sandboxes the agent has, or -1 when it did not say. */
static int host_sync(control_t *ctl, store_t *st, const keyring_t *kr, pool_syncs_t *ps,
                     const char *ns, const char *pool, json_t *h, const runrec_t *rr)
{
    char token[80];
    if (pool_host_token(st, &ctl->seal, jstr(h, "job"), token, sizeof token) < 0)
        return -1;
    int status = 0;
    json_t *list = NULL;
    int r = agent_call(ctl, st, kr, rr, "GET", "/v1/sandboxes", token, NULL, POOL_SYNC_CALL_MS,
                       &status, &list, NULL);
    if (r < 0 || status != 200 || !json_is_array(list)) {
        json_decref(list);
        sodium_memzero(token, sizeof token);
        return -1;
    }
    int64_t now = wall_ms();
    /* Read after the agent's list: with no reservation on the host then, no allocation that
     * made one of the listed sandboxes is still on its way to record it (an allocation records
     * its sandboxes before it drops its reservation), so one that no record names is an
     * orphan now (a control killed mid-allocation) and goes at once instead of after the
     * grace: until then the agent counts it against its capacity and creates are refused. */
    json_t *hnow = NULL;
    bool none_pending = record_load(st, jstr(h, "_key"), &hnow, NULL) == 0 &&
                        json_array_size(json_object_get(hnow, "pending")) == 0;
    json_decref(hnow);
    char prefix[160];
    pool_sbx_prefix(prefix, sizeof prefix, ns, pool);
    store_kv_t *kvs;
    size_t n;
    if (store_list(st, prefix, &kvs, &n) == 0) {
        for (size_t i = 0; i < n; i++) {
            json_t *s = json_loadb(kvs[i].value, kvs[i].value_len, 0, NULL);
            bool mine =
                json_is_object(s) && !*jstr(s, "gone") && streq(jstr(s, "host"), jstr(h, "job"));
            bool older = mine && (uint64_t)jint(s, "generation") < rr->run.generation;
            bool there = false;
            size_t k;
            json_t *a;
            json_array_foreach(list, k, a)
                there = there || streq(jstr(a, "id"), jstr(s, "id"));
            /* recorded a moment ago by an allocation: its agent has it; give it 5 s anyway */
            if (mine && (older || (!there && now - jint(s, "created_ms") > 5000))) {
                json_object_set_new(
                    s, "gone",
                    json_string(older ? "its pool host was restarted"
                                      : "its host no longer has it (its idle timeout, or "
                                        "deleted on the host)"));
                json_object_set_new(s, "gone_ms", json_integer(now));
                if (record_gone(st, ns, pool, jstr(h, "_key"), jstr(h, "job"), kvs[i].key,
                                kvs[i].rev, s) == 0) {
                    log_info("pool %s/%s: sandbox %s gone from its host", ns, pool, jstr(s, "id"));
                }
            }
            json_decref(s);
        }
        store_kv_free(kvs, n);
    }
    size_t k;
    json_t *a;
    json_array_foreach(list, k, a) {
        const char *id = jstr(a, "id");
        char key[200];
        json_t *rec;
        if (!pool_sandbox_id_valid(id))
            continue;
        pool_sbx_key(key, sizeof key, ns, pool, id);
        r = record_load(st, key, &rec, NULL);
        json_decref(r == 0 ? rec : NULL);
        if (r != -ENOENT) { /* recorded, or unreadable now: nothing to do */
            orphan_forget(ps, id);
            continue;
        }
        if (none_pending || now - orphan_since(ps, id, now) >= ORPHAN_GRACE_MS) {
            delete_orphan(ctl, st, kr, rr, token, id);
            orphan_forget(ps, id);
        }
    }
    int count = (int)json_array_size(list);
    pool_json_wipe(list);
    sodium_memzero(token, sizeof token);
    return count;
}

/* ---- edits of a host record ------------------------------------------------------------------ */

static int ready_edit(json_t *h, void *arg)
{
    const uint64_t *gen = arg;
    if (!streq(jstr(h, "state"), "booting"))
        return 1;
    json_object_set_new(h, "state", json_string("ready"));
    json_object_set_new(h, "generation", json_integer((json_int_t)*gen));
    return 0;
}

static int generation_edit(json_t *h, void *arg)
{
    const uint64_t *gen = arg;
    if ((uint64_t)jint(h, "generation") == *gen)
        return 1;
    json_object_set_new(h, "generation", json_integer((json_int_t)*gen));
    return 0;
}

typedef struct {
    store_t *st;
    const char *self;
} sweep_t;

/* Drop reservations of control processes that are gone (their heartbeat record absent or
 * stale; a store error counts as alive), and any older than POOL_PENDING_STALE_MS. */
static int pending_edit(json_t *h, void *arg)
{
    sweep_t *sw = arg;
    json_t *pend = json_object_get(h, "pending");
    bool changed = false;
    for (size_t i = json_array_size(pend); i-- > 0;) {
        json_t *p = json_array_get(pend, i);
        const char *owner = jstr(p, "owner");
        if (wall_ms() - jint(p, "at_ms") > POOL_PENDING_STALE_MS ||
            (!streq(owner, sw->self) && control_gone(sw->st, owner))) {
            json_array_remove(pend, i);
            changed = true;
        }
    }
    return changed ? 0 : 1;
}

typedef struct {
    store_t *st;
    const char *ns, *pool;
    json_t *spec;
    int agent_count; /* from this pass's sync, -1 unknown */
    bool may_retire; /* more hosts serve than `warm` */
    bool retired;
} idle_t;

/* Empty since when; retire after host_idle_s. Empty is counted here, on the record as read for
 * this compare-and-swap: its reservations and its live count, which every change of one of its
 * sandbox records changes in the same transaction (pool_host_txn), so none is missed. */
static int idle_edit(json_t *h, void *arg)
{
    idle_t *x = arg;
    if (!streq(jstr(h, "state"), "ready"))
        return 1;
    json_int_t used = pool_host_live(h);
    if (used < 0) { /* a record from before the count: the listing */
        json_t *live = pool_live_counts(x->st, x->ns, x->pool);
        if (!live)
            return -EIO;
        used = jint(live, jstr(h, "job"));
        json_decref(live);
    }
    bool empty = used == 0 && pool_host_pending(h) == 0;
    int64_t since = jint(h, "empty_since_ms"), now = wall_ms();
    json_int_t idle_s = jint(x->spec, "host_idle_s");
    if (!empty) {
        if (!since)
            return 1;
        json_object_set_new(h, "empty_since_ms", json_integer(0));
        return 0;
    }
    if (!since) {
        json_object_set_new(h, "empty_since_ms", json_integer(now));
        return 0;
    }
    if (idle_s > 0 && now - since > idle_s * 1000 && x->may_retire && x->agent_count == 0) {
        json_object_set_new(h, "state", json_string("retiring"));
        x->retired = true;
        return 0;
    }
    return 1;
}

/* ---- one pool ------------------------------------------------------------------------------------ */

static void warm_hosts(control_t *ctl, store_t *st, json_t *pool, size_t serving)
{
    const char *ns = jstr(pool, "namespace"), *name = jstr(pool, "name");
    for (json_int_t want = jint(pool, "warm") - (json_int_t)serving; want > 0; want--) {
        json_t *all = pool_hosts_load(st, ns, name), *h;
        if (!all)
            return;
        bool used[POOL_HOSTS_MAX] = { false };
        size_t i, nh = json_array_size(all);
        json_array_foreach(all, i, h)
            if (jint(h, "slot") >= 0 && jint(h, "slot") < POOL_HOSTS_MAX)
                used[jint(h, "slot")] = true;
        json_decref(all);
        if ((json_int_t)nh >= jint(pool, "max_hosts"))
            return;
        int slot = 0;
        while (slot < jint(pool, "max_hosts") && used[slot])
            slot++;
        char hkey[200], job_id[25];
        (void)snprintf(hkey, sizeof hkey, "poolhosts/%s/%s/%03d", ns, name, slot);
        random_hex(job_id, 12);
        int64_t now = wall_ms();
        json_t *rec = json_pack("{s:i,s:s,s:I,s:[],s:s,s:I,s:I,s:I}", "slot", slot, "job", job_id,
                                "capacity", jint(pool, "per_host"), "pending", "state", "booting",
                                "generation", (json_int_t)0, "created_ms", (json_int_t)now,
                                "empty_since_ms", (json_int_t)0);
        int r = rec ? record_save(st, hkey, rec, STORE_REV_ABSENT, NULL) : -ENOMEM;
        json_decref(rec);
        if (r < 0)
            return;
        sbx_err_t err;
        r = pool_host_job_create(st, &ctl->seal, ctl->cfg.default_image, pool, ns, job_id, &err);
        if (r < 0) {
            log_warn("pool %s/%s: cannot make a warm host: %s", ns, name, err.msg);
            (void)store_del(st, hkey, STORE_REV_ANY);
            return;
        }
        log_info("pool %s/%s: warm host %d booting (job %s)", ns, name, slot, job_id);
        control_kick(ctl);
    }
}

/* A host whose job ended or never came is dropped (its sandboxes gone); a draining or retiring
 * host's job is canceled. Returns whether the host still counts (is not dropped). */
static bool host_follow_job(store_t *st, json_t *pool, json_t *h, bool draining)
{
    const char *ns = jstr(pool, "namespace"), *name = jstr(pool, "name");
    const char *job_id = jstr(h, "job");
    json_t *job = NULL;
    int r = job_load(st, ns, job_id, &job, NULL);
    if (r < 0 && r != -ENOENT)
        return true; /* unreadable now: next pass */
    job_stage_t stage = STAGE_SCHEDULING;
    bool ended = r == 0 && job_stage_of(job, &stage) == 0 && job_stage_ended(stage);
    char reason[300] = "";
    if (r == -ENOENT && wall_ms() - jint(h, "created_ms") > NEVER_MADE_MS)
        (void)snprintf(reason, sizeof reason, "its pool host %s was never made", job_id);
    else if (ended)
        (void)snprintf(reason, sizeof reason, "its pool host %s ended (%s%s%s)", job_id,
                       jstr(job, "stage"), *jstr(job, "message") ? ": " : "", jstr(job, "message"));
    if ((draining || streq(jstr(h, "state"), "retiring")) && r == 0 && !ended)
        (void)job_cancel(st, ns, job_id);
    json_decref(job);
    if (!reason[0])
        return true;
    if (sandboxes_gone(st, ns, name, job_id, 0, draining ? "its pool was deleted" : reason) < 0)
        return true;
    if (store_del(st, jstr(h, "_key"), jint(h, "_rev")) < 0)
        return true;
    log_info("pool %s/%s: host %s dropped: %s", ns, name, job_id, reason);
    return false;
}

/* Host records written before live counts were kept (pool_host_live) get theirs: the pool's
 * sandbox records are counted after the host records were read, and each count is written only
 * if its host record is still as read then: every change of a sandbox record changes its host
 * record in the same transaction (pool_host_txn), so a count that is written is exact. */
static void hosts_count_live(store_t *st, const char *ns, const char *pool, json_t *hosts)
{
    if (pool_hosts_counted(hosts))
        return;
    json_t *live = pool_live_counts(st, ns, pool), *h;
    size_t i;
    json_array_foreach(hosts, i, h) {
        if (!live || pool_host_live(h) >= 0)
            continue;
        json_t *copy = json_copy(h);
        if (!copy)
            break;
        json_object_del(copy, "_key");
        json_object_del(copy, "_rev");
        json_object_set_new(copy, "live", json_integer(jint(live, jstr(h, "job"))));
        if (record_save(st, jstr(h, "_key"), copy, jint(h, "_rev"), NULL) == 0)
            log_info("pool %s/%s: host %s counts %lld live sandboxes", ns, pool, jstr(h, "job"),
                     (long long)jint(live, jstr(h, "job")));
        json_decref(copy); /* a write that lost (-ESTALE): the next pass counts again */
    }
    json_decref(live);
}

static void pool_sync(control_t *ctl, store_t *st, const keyring_t *kr, pool_syncs_t *ps,
                      json_t *pool, const char *key, int64_t pool_rev)
{
    const char *ns = jstr(pool, "namespace"), *name = jstr(pool, "name");
    bool draining = !streq(jstr(pool, "state"), "active");
    json_t *hosts = pool_hosts_load(st, ns, name), *h;
    if (!hosts)
        return;
    if (!draining)
        hosts_count_live(st, ns, name, hosts);
    size_t i, serving = 0, left = 0;
    json_array_foreach(hosts, i, h) {
        bool kept = host_follow_job(st, pool, h, draining);
        json_object_set_new(h, "_kept", json_boolean(kept));
        left += kept;
        serving += kept && !draining && pool_host_takes(h);
    }
    int64_t now = wall_ms();
    json_array_foreach(hosts, i, h) {
        const char *job = jstr(h, "job"), *hkey = jstr(h, "_key");
        if (draining || !json_is_true(json_object_get(h, "_kept")) || !pool_host_takes(h))
            continue;
        sweep_t sw = { .st = st, .self = ctl->instance };
        (void)pool_host_edit(st, hkey, job, pending_edit, &sw);
        runrec_t rr;
        if (runrec_load(st, job, &rr, NULL) < 0 || rr.state != RR_RUNNING)
            continue;
        uint64_t gen = rr.run.generation;
        if (streq(jstr(h, "state"), "booting") || jint(h, "generation") == 0) {
            (void)pool_host_edit(st, hkey, job, ready_edit, &gen);
            continue;
        }
        if ((uint64_t)jint(h, "generation") != gen) {
            /* the host's run was replaced (moved, restarted, resumed): the new agent has none
             * of its sandboxes; the host serves on, empty */
            char reason[200];
            (void)snprintf(reason, sizeof reason,
                           "its pool host %s was restarted (generation %lld -> %llu)", job,
                           (long long)jint(h, "generation"), (unsigned long long)gen);
            if (sandboxes_gone(st, ns, name, job, gen, reason) >= 0)
                (void)pool_host_edit(st, hkey, job, generation_edit, &gen);
            continue;
        }
        idle_t x = { .st = st,
                     .ns = ns,
                     .pool = name,
                     .spec = pool,
                     .agent_count = -1,
                     .may_retire = (json_int_t)serving > jint(pool, "warm") };
        bool idle_long = jint(h, "empty_since_ms") &&
                         now - jint(h, "empty_since_ms") > jint(pool, "host_idle_s") * 1000;
        if (sync_due(ps, job, now) || (idle_long && x.may_retire))
            x.agent_count = host_sync(ctl, st, kr, ps, ns, name, h, &rr);
        (void)pool_host_edit(st, hkey, job, idle_edit, &x);
        if (x.retired) {
            serving--;
            log_info("pool %s/%s: host %s empty for %lld s: retiring", ns, name, job,
                     (long long)jint(pool, "host_idle_s"));
            (void)job_cancel(st, ns, job);
        }
    }
    json_decref(hosts);
    if (draining) {
        if (left == 0) {
            gone_sweep(st, ns, name, true);
            if (store_del(st, key, pool_rev) == 0)
                log_info("pool %s/%s: drained and removed", ns, name);
        }
        return;
    }
    gone_sweep(st, ns, name, false);
    warm_hosts(ctl, st, pool, serving);
}

/* Host and sandbox records whose pool is gone (a pool removed while an allocation was still
 * making a host or recording sandboxes): the host's job is canceled, the records go. */
static void orphan_records(store_t *st, const char *prefix, bool hosts)
{
    store_kv_t *kvs;
    size_t n;
    if (store_list(st, prefix, &kvs, &n) < 0)
        return;
    for (size_t i = 0; i < n; i++) {
        /* <prefix><ns>/<pool>/<slot or id> */
        char ns[64], pool[64], key[160];
        const char *p = kvs[i].key + strlen(prefix), *s1 = strchr(p, '/');
        const char *s2 = s1 ? strchr(s1 + 1, '/') : NULL;
        if (!s2 || (size_t)(s1 - p) >= sizeof ns || (size_t)(s2 - s1 - 1) >= sizeof pool)
            continue;
        (void)snprintf(ns, sizeof ns, "%.*s", (int)(s1 - p), p);
        (void)snprintf(pool, sizeof pool, "%.*s", (int)(s2 - s1 - 1), s1 + 1);
        pool_key(key, sizeof key, ns, pool);
        store_kv_t kv;
        int r = store_get(st, key, &kv);
        if (r == 0)
            store_kv_clear(&kv);
        if (r != -ENOENT)
            continue;
        json_t *rec = json_loadb(kvs[i].value, kvs[i].value_len, 0, NULL);
        if (hosts && json_is_object(rec))
            (void)job_cancel(st, ns, jstr(rec, "job"));
        if (!hosts && json_is_object(rec)) {
            char tkey[200];
            pool_token_key(tkey, sizeof tkey, ns, pool, jstr(rec, "id"));
            (void)store_del(st, tkey, STORE_REV_ANY);
        }
        if (store_del(st, kvs[i].key, kvs[i].rev) == 0)
            log_info("%s: its pool %s/%s is gone: removed", kvs[i].key, ns, pool);
        json_decref(rec);
    }
    store_kv_free(kvs, n);
}

void pools_pass(control_t *ctl, store_t *st, const keyring_t *kr, pool_syncs_t *ps)
{
    store_kv_t *kvs;
    size_t n;
    if (store_list(st, "pools/", &kvs, &n) < 0)
        return;
    for (size_t i = 0; i < n && !ctl->stopping; i++) {
        json_t *pool = json_loadb(kvs[i].value, kvs[i].value_len, 0, NULL);
        if (json_is_object(pool))
            pool_sync(ctl, st, kr, ps, pool, kvs[i].key, kvs[i].rev);
        json_decref(pool);
    }
    store_kv_free(kvs, n);
    int64_t now = wall_ms();
    if (now - ps->orphans_swept_ms >= ORPHAN_SWEEP_MS) {
        ps->orphans_swept_ms = now;
        orphan_records(st, "poolhosts/", true);
        orphan_records(st, "poolsbx/", false);
    }
}
