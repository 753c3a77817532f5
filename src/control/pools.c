/* SPDX-License-Identifier: MIT */
/* Pools: a control-plane resource that packs light sandboxes into pool hosts (jobs of mode
 * "pool", one agent in host mode each).
 *
 *   POST   /v1/pools/{ns}                                  create a pool            (write)
 *   GET    /v1/pools/{ns}                                  list                     (read)
 *   GET    /v1/pools/{ns}/{pool}                           inspect: hosts, slots    (read)
 *   DELETE /v1/pools/{ns}/{pool}                           drain and remove         (write)
 *   POST   /v1/pools/{ns}/{pool}/sandboxes                 {count, env, ...}        (write)
 *   GET    /v1/pools/{ns}/{pool}/sandboxes[/{id}]          list, inspect            (read)
 *   DELETE /v1/pools/{ns}/{pool}/sandboxes/{id}            delete one               (write)
 *   ANY    /v1/pools/{ns}/{pool}/sandboxes/{id}/{exec,files/...,processes...,proxy/{port}/...}
 *          through the edge to /v1/sandboxes/{id}/... on the sandbox's host (role by purpose)
 *
 * Store records (every change a compare-and-swap):
 *   pools/<ns>/<pool>              the pool: spec and state (active | draining)
 *   poolhosts/<ns>/<pool>/<slot>   one host: its job, capacity, used slots, pending reservations
 *                                  ({id, n, owner, at_ms}), state (booting | ready | retiring),
 *                                  the generation of its run its sandboxes live in
 *   poolsbx/<ns>/<pool>/<id>       one sandbox: host, generation, uid, home; "gone" once its host
 *                                  ended, moved, or the agent no longer has it
 *   secrets/psb-<id>               its token, sealed like job secrets
 *
 * max_hosts is exact by construction: a host is a record at slot 0..max_hosts-1, created only
 * where the slot is absent. A request reserves slots on existing hosts first (booting ones too,
 * so that concurrent requests fill a host that is starting instead of booting another) and
 * creates a host at the lowest free slot only when every host is full; two requests that both
 * find every host full collide on that slot, and the loser packs into the winner's host. A
 * reservation is a pending entry in the host record until the agent answered; the reconciler
 * drops pending entries of control processes that are gone (pools_pass). */
#include <sodium.h>
#include <stdio.h>
#include <time.h>

#include "cap/purpose.h"
#include "common/log.h"
#include "control.h"

#define POOL_BODY_MAX 4096
#define ALLOC_BODY_MAX (256 * 1024)
#define POOL_HOSTS_MAX 64 /* max_hosts at most */
#define POOL_PER_HOST_MAX 4096
#define POOL_COUNT_MAX 1000 /* sandboxes per create request */
#define HOST_BOOT_WAIT_MS 180000
#define PENDING_STALE_MS 300000 /* a reservation older than this is dropped whatever its owner */
#define ORPHAN_GRACE_MS 60000   /* an agent's sandbox without a record this old is deleted */
#define GONE_KEEP_MS 600000     /* a gone sandbox's record answers 410 this long */
#define SYNC_EVERY_MS 3000      /* each ready host's sandboxes are compared this often */

/* ---- small helpers ---------------------------------------------------------------------------- */

static json_int_t jint(json_t *o, const char *k)
{
    return json_integer_value(json_object_get(o, k));
}
static const char *jstr(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

static void msleep(unsigned ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    (void)nanosleep(&ts, NULL);
}

static int load_json(store_t *st, const char *key, json_t **ret, int64_t *ret_rev)
{
    store_kv_t kv;
    int r = store_get(st, key, &kv);
    if (r < 0)
        return r;
    json_t *j = json_loadb(kv.value, kv.value_len, 0, NULL);
    if (ret_rev)
        *ret_rev = kv.rev;
    store_kv_clear(&kv);
    if (!json_is_object(j)) {
        json_decref(j);
        return -EBADMSG;
    }
    *ret = j;
    return 0;
}

static int save_json(store_t *st, const char *key, json_t *j, int64_t expect)
{
    _cleanup_free_ char *v = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    if (!v)
        return -ENOMEM;
    return store_cas(st, key, v, strlen(v), expect, NULL);
}

static void pool_key(char *out, size_t cap, const char *ns, const char *pool)
{
    (void)snprintf(out, cap, "pools/%s/%s", ns, pool);
}
static void hosts_prefix(char *out, size_t cap, const char *ns, const char *pool)
{
    (void)snprintf(out, cap, "poolhosts/%s/%s/", ns, pool);
}
static void sbx_prefix(char *out, size_t cap, const char *ns, const char *pool)
{
    (void)snprintf(out, cap, "poolsbx/%s/%s/", ns, pool);
}
static void sbx_key(char *out, size_t cap, const char *ns, const char *pool, const char *id)
{
    (void)snprintf(out, cap, "poolsbx/%s/%s/%s", ns, pool, id);
}
static void token_key(char *out, size_t cap, const char *id)
{
    (void)snprintf(out, cap, "secrets/psb-%s", id);
}

static bool sandbox_id_valid(const char *s)
{
    size_t n = strlen(s);
    if (n != 16)
        return false;
    for (; *s; s++)
        if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f')))
            return false;
    return true;
}

/* Free slots of a host record: capacity - used - pending. */
static json_int_t host_free(json_t *h)
{
    json_int_t pend = 0;
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(h, "pending"), i, p)
        pend += jint(p, "n");
    return jint(h, "capacity") - jint(h, "used") - pend;
}

static bool host_takes(json_t *h)
{
    const char *s = jstr(h, "state");
    return streq(s, "booting") || streq(s, "ready");
}

/* ---- pool records ----------------------------------------------------------------------------- */

typedef struct {
    char ns[64], principal[64];
    role_t role;
} pool_ctx_t;

static void ctx_free(conn_t *c, bool aborted)
{
    (void)aborted;
    free(c->hdata);
    c->hdata = NULL;
}
static const handler_ops_t ctx_ops = { .on_close = ctx_free };

static const char *pool_from_request(control_t *ctl, json_t *b, json_t **ret)
{
    const char *name = NULL, *image = ctl->cfg.default_image, *flavor = "cpu-small";
    json_int_t per_host = 32, warm = 0, max_hosts = 4, sbx_idle = 0, host_idle = 300;
    if (!json_is_object(b) ||
        json_unpack(b, "{s:s,s?s,s?s,s?I,s?I,s?I,s?I,s?I!}", "name", &name, "image", &image,
                    "flavor", &flavor, "per_host", &per_host, "warm", &warm, "max_hosts",
                    &max_hosts, "sandbox_idle_s", &sbx_idle, "host_idle_s", &host_idle) < 0)
        return "expected {name, image, flavor, per_host, warm, max_hosts, sandbox_idle_s, "
               "host_idle_s} (name required; unknown fields are refused)";
    if (!valid_name(name, 63))
        return "name: [a-z0-9][a-z0-9._-]*, at most 63 bytes";
    if (per_host < 1 || per_host > POOL_PER_HOST_MAX)
        return "per_host: 1..4096 sandboxes per host";
    if (max_hosts < 1 || max_hosts > POOL_HOSTS_MAX)
        return "max_hosts: 1..64";
    if (warm < 0 || warm > max_hosts)
        return "warm: 0..max_hosts hosts kept ready";
    if (sbx_idle < 0 || sbx_idle > 31536000)
        return "sandbox_idle_s: 0 (never) ..31536000 seconds";
    if (host_idle < 0 || host_idle > 31536000)
        return "host_idle_s: 0..31536000 seconds";
    /* the host job must be one the Jobs API would take */
    json_t *probe = json_pack("{s:s,s:s,s:s}", "image", image, "flavor", flavor, "mode", "pool");
    json_t *job = NULL, *sec = NULL;
    const char *e = probe ? job_from_request(probe, ctl->cfg.default_image, &job, &sec) : "oom";
    json_decref(probe);
    json_decref(job);
    json_decref(sec);
    if (e)
        return e;
    *ret = json_pack("{s:s,s:s,s:s,s:I,s:I,s:I,s:I,s:I,s:s}", "name", name, "image", image,
                     "flavor", flavor, "per_host", per_host, "warm", warm, "max_hosts", max_hosts,
                     "sandbox_idle_s", sbx_idle, "host_idle_s", host_idle, "state", "active");
    return *ret ? NULL : "out of memory";
}

static void pool_create_done(conn_t *c)
{
    control_t *ctl = c->srv->app;
    pool_ctx_t *cx = c->hdata;
    json_error_t jerr;
    json_t *b = json_loadb(buf_head(&c->body), c->body.len, 0, &jerr), *pool = NULL;
    const char *e = b ? pool_from_request(ctl, b, &pool) : jerr.text;
    json_decref(b);
    if (e) {
        conn_respond_error(c, 400, "pool: %s", e);
        return;
    }
    const char *image = jstr(pool, "image");
    if (streq(image, "host") && cx->role != ROLE_ADMIN && !streq(ctl->cfg.default_image, "host")) {
        conn_respond_error(c, 403, "pool: image host (the node's own programs) is for admins");
        json_decref(pool);
        return;
    }
    if (!image_on_live_node(ctl->store, image, NULL)) {
        conn_respond_error(c, 400, "pool: image %s: not available on any node", image);
        json_decref(pool);
        return;
    }
    json_object_set_new(pool, "namespace", json_string(cx->ns));
    json_object_set_new(pool, "initiator", json_string(cx->principal));
    json_object_set_new(pool, "created_ms", json_integer(wall_ms()));
    char key[160];
    pool_key(key, sizeof key, cx->ns, jstr(pool, "name"));
    int r = save_json(ctl->store, key, pool, STORE_REV_ABSENT);
    if (r == -ESTALE || r == -EEXIST) {
        conn_respond_error(c, 409, "pool %s exists in namespace %s (DELETE it first)",
                           jstr(pool, "name"), cx->ns);
        json_decref(pool);
        return;
    }
    if (r < 0) {
        json_decref(pool);
        conn_respond_errno(c, r, "pool");
        return;
    }
    log_info("pool %s/%s created by %s", cx->ns, jstr(pool, "name"), cx->principal);
    control_kick(ctl); /* warm hosts */
    conn_respond_json(c, 201, pool);
}

static int list_prefix(store_t *st, const char *prefix, store_kv_t **kvs, size_t *n)
{
    return store_list(st, prefix, kvs, n);
}

/* The host records of a pool, as JSON (each with "_key" and "_rev"). */
static json_t *hosts_load(store_t *st, const char *ns, const char *pool)
{
    char prefix[160];
    hosts_prefix(prefix, sizeof prefix, ns, pool);
    store_kv_t *kvs;
    size_t n;
    json_t *arr = json_array();
    if (!arr || list_prefix(st, prefix, &kvs, &n) < 0) {
        json_decref(arr);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *h = json_loadb(kvs[i].value, kvs[i].value_len, 0, NULL);
        if (!json_is_object(h)) {
            json_decref(h);
            continue;
        }
        json_object_set_new(h, "_key", json_string(kvs[i].key));
        json_object_set_new(h, "_rev", json_integer(kvs[i].rev));
        json_array_append_new(arr, h);
    }
    store_kv_free(kvs, n);
    return arr;
}

static int host_save(store_t *st, json_t *h)
{
    json_t *copy = json_copy(h);
    if (!copy)
        return -ENOMEM;
    char key[200];
    (void)snprintf(key, sizeof key, "%s", jstr(h, "_key"));
    int64_t rev = jint(h, "_rev");
    json_object_del(copy, "_key");
    json_object_del(copy, "_rev");
    int r = save_json(st, key, copy, rev);
    json_decref(copy);
    return r;
}

/* What inspect and list show of a sandbox (never its token). */
static json_t *sandbox_view(json_t *s, const char *ns, const char *pool)
{
    json_t *v = json_copy(s);
    if (!v)
        return NULL;
    char path[256];
    (void)snprintf(path, sizeof path, "/v1/pools/%s/%s/sandboxes/%s", ns, pool, jstr(s, "id"));
    json_object_set_new(v, "path", json_string(path));
    return v;
}

static void pool_inspect(control_t *ctl, conn_t *c, const char *ns, const char *name)
{
    char key[160];
    json_t *pool;
    pool_key(key, sizeof key, ns, name);
    if (load_json(ctl->store, key, &pool, NULL) < 0) {
        conn_respond_error(c, 404, "no pool %s in namespace %s", name, ns);
        return;
    }
    json_t *hosts = hosts_load(ctl->store, ns, name), *view = json_array();
    size_t i;
    json_t *h;
    json_array_foreach(hosts, i, h) {
        json_t *job;
        const char *stage = "";
        if (job_load(ctl->store, ns, jstr(h, "job"), &job, NULL) == 0) {
            json_array_append_new(view, json_pack("{s:I,s:s,s:s,s:s,s:I,s:I,s:I,s:I}", "slot",
                                                  jint(h, "slot"), "job", jstr(h, "job"), "state",
                                                  jstr(h, "state"), "stage", jstr(job, "stage"),
                                                  "used", jint(h, "used"), "free", host_free(h),
                                                  "capacity", jint(h, "capacity"), "generation",
                                                  jint(h, "generation")));
            json_decref(job);
        } else {
            json_array_append_new(
                view, json_pack("{s:I,s:s,s:s,s:s,s:I,s:I,s:I,s:I}", "slot", jint(h, "slot"), "job",
                                jstr(h, "job"), "state", jstr(h, "state"), "stage", stage, "used",
                                jint(h, "used"), "free", host_free(h), "capacity",
                                jint(h, "capacity"), "generation", jint(h, "generation")));
        }
    }
    json_decref(hosts);
    char prefix[160];
    sbx_prefix(prefix, sizeof prefix, ns, name);
    store_kv_t *kvs;
    size_t n = 0, live = 0;
    if (list_prefix(ctl->store, prefix, &kvs, &n) == 0) {
        for (size_t k = 0; k < n; k++) {
            json_t *s = json_loadb(kvs[k].value, kvs[k].value_len, 0, NULL);
            live += s && !*jstr(s, "gone");
            json_decref(s);
        }
        store_kv_free(kvs, n);
    }
    json_object_set_new(pool, "hosts", view);
    json_object_set_new(pool, "sandboxes", json_integer((json_int_t)live));
    conn_respond_json(c, 200, pool);
}

static void pools_list(control_t *ctl, conn_t *c, const char *ns)
{
    char prefix[96];
    (void)snprintf(prefix, sizeof prefix, "pools/%s/", ns);
    store_kv_t *kvs;
    size_t n;
    int r = list_prefix(ctl->store, prefix, &kvs, &n);
    if (r < 0) {
        conn_respond_errno(c, r, "pools");
        return;
    }
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < n; i++) {
        json_t *j = json_loadb(kvs[i].value, kvs[i].value_len, 0, NULL);
        if (j)
            json_array_append_new(arr, j);
    }
    store_kv_free(kvs, n);
    conn_respond_json(c, 200, json_pack("{s:o}", "pools", arr));
}

static void pool_delete(control_t *ctl, conn_t *c, const char *ns, const char *name)
{
    char key[160];
    pool_key(key, sizeof key, ns, name);
    for (int attempt = 0; attempt < 8; attempt++) {
        json_t *pool;
        int64_t rev;
        if (load_json(ctl->store, key, &pool, &rev) < 0) {
            conn_respond_error(c, 404, "no pool %s in namespace %s", name, ns);
            return;
        }
        json_object_set_new(pool, "state", json_string("draining"));
        int r = save_json(ctl->store, key, pool, rev);
        if (r == -ESTALE) {
            json_decref(pool);
            continue;
        }
        if (r < 0) {
            json_decref(pool);
            conn_respond_errno(c, r, "pool delete");
            return;
        }
        log_info("pool %s/%s: draining (delete requested)", ns, name);
        control_kick(ctl);
        conn_respond_json(c, 202, pool);
        return;
    }
    conn_respond_error(c, 503, "pool delete: too much contention on the pool record");
}

/* ---- the host token and the run of a host ----------------------------------------------------- */

static int host_token(worker_t *w, const char *job, char *out, size_t cap)
{
    json_t *sec;
    int r = job_secrets_get(w->st, &w->ctl->seal, job, &sec);
    if (r < 0)
        return r;
    const char *t = jstr(sec, "SBX_TOKEN");
    r = *t && strlen(t) < cap ? 0 : -ENOKEY;
    if (r == 0)
        memcpy(out, t, strlen(t) + 1);
    json_decref(sec);
    return r;
}

/* Create the job of a new pool host (id given: the host record names it already). */
static int host_job_create(store_t *st, const seal_keys_t *seal, const char *default_image,
                           json_t *pool, const char *ns, const char *job_id, char *err,
                           size_t errcap)
{
    char cap_s[16], tok[65];
    (void)snprintf(cap_s, sizeof cap_s, "%lld", (long long)jint(pool, "per_host"));
    random_hex(tok, 32);
    json_t *body =
        json_pack("{s:s,s:s,s:s,s:{s:s},s:{s:s},s:{s:s,s:s,s:s}}", "image", jstr(pool, "image"),
                  "flavor", jstr(pool, "flavor"), "mode", "pool", "env", "SBX_CAPACITY", cap_s,
                  "secrets", "SBX_TOKEN", tok, "labels", "sbx-sandbox-mode", "pool", "sbx-pool",
                  jstr(pool, "name"), "sbx-pool-host", "1");
    sodium_memzero(tok, sizeof tok);
    json_t *job = NULL, *sec = NULL;
    const char *e = body ? job_from_request(body, default_image, &job, &sec) : "out of memory";
    json_decref(body);
    if (e) {
        (void)snprintf(err, errcap, "pool host job: %s", e);
        return -EINVAL;
    }
    int r = job_insert(st, seal, ns, "sbx-pools", job_id, job, sec);
    json_decref(job);
    json_decref(sec);
    if (r < 0)
        (void)snprintf(err, errcap, "pool host job: %s", strerror(-r));
    return r;
}

/* Set a host record ready for generation gen (from booting), by compare-and-swap. */
static void host_mark_ready(store_t *st, const char *key, uint64_t gen)
{
    for (int attempt = 0; attempt < 20; attempt++) {
        json_t *h;
        int64_t rev;
        if (load_json(st, key, &h, &rev) < 0)
            return;
        bool done = !streq(jstr(h, "state"), "booting") && (uint64_t)jint(h, "generation") == gen;
        if (done || !host_takes(h)) {
            json_decref(h);
            return;
        }
        json_object_set_new(h, "state", json_string("ready"));
        json_object_set_new(h, "generation", json_integer((json_int_t)gen));
        int r = save_json(st, key, h, rev);
        json_decref(h);
        if (r != -ESTALE)
            return;
    }
}

/* Remove reservation rid from host key and add `used` (by compare-and-swap). */
static int host_settle(store_t *st, const char *key, const char *rid, json_int_t used)
{
    for (int attempt = 0; attempt < 200; attempt++) {
        json_t *h;
        int64_t rev;
        int r = load_json(st, key, &h, &rev);
        if (r < 0)
            return r;
        json_t *pend = json_object_get(h, "pending");
        for (size_t i = json_array_size(pend); i-- > 0;)
            if (streq(jstr(json_array_get(pend, i), "id"), rid))
                json_array_remove(pend, i);
        json_object_set_new(h, "used", json_integer(MAX(0, jint(h, "used") + used)));
        if (jint(h, "used") > 0)
            json_object_set_new(h, "empty_since_ms", json_integer(0));
        r = save_json(st, key, h, rev);
        json_decref(h);
        if (r != -ESTALE)
            return r;
    }
    return -EBUSY;
}

/* ---- allocation (a worker) -------------------------------------------------------------------- */

typedef struct {
    char ns[64], pool[64];
    char *body;
    size_t body_len;
} alloc_arg_t;

static void alloc_free(void *p)
{
    alloc_arg_t *a = p;
    free(a->body);
    free(a);
}

typedef struct {
    char key[200];
    char job[32];
    json_int_t n;
} resv_t;

/* Tests: SBX_TEST_POOL_RACE_MS widens the window between reading a pool's hosts and writing a
 * reservation or a new host, so that concurrent requests surely overlap there. */
static unsigned race_window_ms(void)
{
    const char *e = getenv("SBX_TEST_POOL_RACE_MS");
    uint64_t ms = 0;
    if (e && parse_u64(sv_make(e, strlen(e)), 1000, &ms) < 0)
        ms = 0;
    return (unsigned)ms;
}

/* Reserve up to count slots: existing hosts first, then new hosts at the lowest free slot while
 * under max_hosts. Returns the number of reservations; *why says why some could not be made. */
static size_t reserve(worker_t *w, json_t *pool, const char *ns, const char *rid, json_int_t count,
                      resv_t *rv, size_t rv_max, json_int_t *ret_left, char *why, size_t whycap)
{
    const char *name = jstr(pool, "name");
    json_int_t left = count, per_host = jint(pool, "per_host"), max_hosts = jint(pool, "max_hosts");
    size_t nr = 0;
    why[0] = 0;
    for (int attempt = 0; left > 0 && attempt < 400; attempt++) {
        json_t *hosts = hosts_load(w->st, ns, name);
        if (!hosts) {
            (void)snprintf(why, whycap, "cannot read the pool's hosts");
            break;
        }
        if (race_window_ms())
            msleep(race_window_ms());
        bool changed = false, slot_used[POOL_HOSTS_MAX] = { false };
        size_t i;
        json_t *h;
        json_array_foreach(hosts, i, h) {
            json_int_t slot = jint(h, "slot");
            if (slot >= 0 && slot < POOL_HOSTS_MAX)
                slot_used[slot] = true;
        }
        json_array_foreach(hosts, i, h) {
            json_int_t fr = host_free(h);
            if (left == 0 || !host_takes(h) || fr <= 0)
                continue;
            json_int_t k = MIN(fr, left);
            size_t j = 0;
            while (j < nr && !streq(rv[j].key, jstr(h, "_key")))
                j++;
            if (j == nr && nr == rv_max)
                continue;
            json_t *pend = json_object_get(h, "pending"), *mine = NULL, *p;
            size_t pi;
            json_array_foreach(pend, pi, p)
                if (streq(jstr(p, "id"), rid))
                    mine = p;
            if (mine)
                json_object_set_new(mine, "n", json_integer(jint(mine, "n") + k));
            else
                json_array_append_new(pend,
                                      json_pack("{s:s,s:I,s:s,s:I}", "id", rid, "n", k, "owner",
                                                w->ctl->instance, "at_ms", (json_int_t)wall_ms()));
            int r = host_save(w->st, h);
            if (r == -ESTALE) {
                changed = true;
                break;
            }
            if (r < 0)
                continue;
            if (j == nr) {
                (void)snprintf(rv[nr].key, sizeof rv[nr].key, "%s", jstr(h, "_key"));
                (void)snprintf(rv[nr].job, sizeof rv[nr].job, "%s", jstr(h, "job"));
                rv[nr++].n = 0;
            }
            rv[j].n += k;
            left -= k;
        }
        size_t nh = json_array_size(hosts);
        json_decref(hosts);
        if (changed || left == 0)
            continue;
        /* every host is full: a new one at the lowest free slot, if the pool may grow */
        if ((json_int_t)nh >= max_hosts) {
            (void)snprintf(why, whycap,
                           "pool %s is at max_hosts (%lld) and every host is full (%lld "
                           "sandboxes each)",
                           name, (long long)max_hosts, (long long)per_host);
            break;
        }
        if (nr == rv_max)
            break;
        int slot = 0;
        while (slot < max_hosts && slot_used[slot])
            slot++;
        if (slot >= max_hosts)
            continue; /* a record appeared between the two reads: read again */
        char key[200], job_id[25];
        (void)snprintf(key, sizeof key, "poolhosts/%s/%s/%03d", ns, name, slot);
        random_hex(job_id, 12);
        json_int_t k = MIN(per_host, left);
        json_t *nhrec = json_pack(
            "{s:i,s:s,s:I,s:I,s:[{s:s,s:I,s:s,s:I}],s:s,s:I,s:I,s:I}", "slot", slot, "job", job_id,
            "capacity", per_host, "used", (json_int_t)0, "pending", "id", rid, "n", k, "owner",
            w->ctl->instance, "at_ms", (json_int_t)wall_ms(), "state", "booting", "generation",
            (json_int_t)0, "created_ms", (json_int_t)wall_ms(), "empty_since_ms", (json_int_t)0);
        int r = nhrec ? save_json(w->st, key, nhrec, STORE_REV_ABSENT) : -ENOMEM;
        json_decref(nhrec);
        if (r == -ESTALE || r == -EEXIST)
            continue; /* another request made this host: pack into it */
        if (r < 0) {
            (void)snprintf(why, whycap, "cannot record a new host: %s", strerror(-r));
            break;
        }
        char err[256];
        r = host_job_create(w->st, &w->ctl->seal, w->ctl->cfg.default_image, pool, ns, job_id, err,
                            sizeof err);
        if (r < 0) {
            (void)store_del(w->st, key, STORE_REV_ANY);
            (void)snprintf(why, whycap, "%s", err);
            break;
        }
        log_info("pool %s/%s: host %d booting (job %s)", ns, name, slot, job_id);
        control_kick(w->ctl);
        (void)snprintf(rv[nr].key, sizeof rv[nr].key, "%s", key);
        (void)snprintf(rv[nr].job, sizeof rv[nr].job, "%s", job_id);
        rv[nr++].n = k;
        left -= k;
    }
    if (left > 0 && !why[0])
        (void)snprintf(why, whycap, "too much contention on the pool's hosts; try again");
    *ret_left = left;
    return nr;
}

/* Wait until the host's run serves (or its job ends). 0 with *rr, or -errno with why. */
static int host_wait_running(worker_t *w, const char *ns, const char *job, runrec_t *rr, char *why,
                             size_t whycap)
{
    uint64_t deadline = monotonic_ms() + HOST_BOOT_WAIT_MS;
    unsigned pause = 20;
    for (;;) {
        if (runrec_load(w->st, job, rr, NULL) == 0 && rr->state == RR_RUNNING)
            return 0;
        json_t *j;
        if (job_load(w->st, ns, job, &j, NULL) < 0) {
            (void)snprintf(why, whycap, "pool host %s is gone", job);
            return -ENOENT;
        }
        const char *stage = jstr(j, "stage");
        job_stage_t st;
        if (job_stage_of(j, &st) == 0 && job_stage_ended(st)) {
            (void)snprintf(why, whycap, "pool host %s ended (%s): %s", job, stage,
                           jstr(j, "message"));
            json_decref(j);
            return -ESRCH;
        }
        json_decref(j);
        if (monotonic_ms() > deadline || w->ctl->stopping) {
            (void)snprintf(why, whycap, "pool host %s did not start within %d s", job,
                           HOST_BOOT_WAIT_MS / 1000);
            return -ETIMEDOUT;
        }
        msleep(pause);
        pause = MIN(pause * 2, 200u);
    }
}

/* Ask the host's agent for n sandboxes; record them; append their views (with tokens) to out.
 * Returns how many were made. */
static json_int_t fulfil(worker_t *w, json_t *pool, const char *ns, const resv_t *rv, json_t *req,
                         json_t *out, char *why, size_t whycap)
{
    const char *name = jstr(pool, "name");
    runrec_t rr;
    if (host_wait_running(w, ns, rv->job, &rr, why, whycap) < 0)
        return 0;
    host_mark_ready(w->st, rv->key, rr.run.generation);
    char token[80];
    if (host_token(w, rv->job, token, sizeof token) < 0 || worker_keys(w) < 0) {
        (void)snprintf(why, whycap, "pool host %s: its token cannot be read", rv->job);
        return 0;
    }
    json_t *body = json_deep_copy(req);
    json_object_set_new(body, "count", json_integer(rv->n));
    json_t *ans = NULL;
    int status = 0, r = -EAGAIN;
    char msg[256] = "";
    /* the agent may not listen yet right after its run is installed */
    for (int attempt = 0; attempt < 50 && !w->ctl->stopping; attempt++) {
        json_decref(ans);
        ans = NULL;
        r = agent_call(w->ctl, w->st, &w->kr, &rr, "POST", "/v1/sandboxes", token, body, &status,
                       &ans, msg, sizeof msg);
        if (r == 0 && status != 503 && status != 502)
            break;
        msleep(100);
        if (runrec_load(w->st, rv->job, &rr, NULL) < 0 || rr.state != RR_RUNNING)
            break;
    }
    json_decref(body);
    sodium_memzero(token, sizeof token);
    if (r < 0 || status != 200) {
        (void)snprintf(why, whycap, "pool host %s: %s", rv->job,
                       r < 0    ? msg
                       : msg[0] ? msg
                                : "the agent refused");
        json_decref(ans);
        return 0;
    }
    crash_point("pool:made");
    json_int_t made = 0;
    size_t i;
    json_t *s;
    json_array_foreach(json_object_get(ans, "sandboxes"), i, s) {
        const char *id = jstr(s, "id"), *tok = jstr(s, "token");
        if (!sandbox_id_valid(id) || !*tok)
            continue;
        char key[200], tkey[64];
        token_key(tkey, sizeof tkey, id);
        json_t *sec = json_pack("{s:s}", "token", tok);
        int pr = sec ? sealed_put(w->st, &w->ctl->seal, tkey, sec, STORE_REV_ANY) : -ENOMEM;
        json_decref(sec);
        json_t *rec = json_pack(
            "{s:s,s:s,s:s,s:s,s:I,s:O,s:O,s:O,s:O,s:I,s:s}", "id", id, "pool", name, "namespace",
            ns, "host", rv->job, "generation", (json_int_t)rr.run.generation, "uid",
            json_object_get(s, "uid"), "home", json_object_get(s, "home"), "confinement",
            json_object_get(s, "confinement"), "limits", json_object_get(s, "limits"), "created_ms",
            (json_int_t)wall_ms(), "gone", "");
        sbx_key(key, sizeof key, ns, name, id);
        if (pr >= 0 && rec)
            pr = save_json(w->st, key, rec, STORE_REV_ABSENT);
        if (pr < 0) {
            /* not recorded: the reconciler deletes it on the agent (an orphan) */
            log_warn("pool %s/%s: sandbox %s not recorded: %s", ns, name, id, strerror(-pr));
            json_decref(rec);
            continue;
        }
        json_t *v = sandbox_view(rec, ns, name);
        json_object_set_new(v, "token", json_string(tok));
        json_array_append_new(out, v);
        json_decref(rec);
        made++;
    }
    json_int_t rejected = jint(ans, "rejected");
    if (rejected > 0 && !why[0])
        (void)snprintf(why, whycap, "pool host %s had room for %lld of %lld", rv->job,
                       (long long)(rv->n - rejected), (long long)rv->n);
    if (ans) {
        /* the answer held tokens */
        char *d = json_dumps(ans, JSON_COMPACT);
        if (d) {
            sodium_memzero(d, strlen(d));
            free(d);
        }
    }
    json_decref(ans);
    return made;
}

static void alloc_fn(worker_t *w, void *arg, work_result_t *res)
{
    alloc_arg_t *a = arg;
    json_error_t jerr;
    json_t *b = json_loadb(a->body, a->body_len, 0, &jerr);
    json_int_t count = 1, max_procs = -1, max_mem = -1, idle = -1;
    json_t *env = NULL;
    if (!json_is_object(b) ||
        json_unpack(b, "{s?I,s?o,s?I,s?I,s?I!}", "count", &count, "env", &env, "max_procs",
                    &max_procs, "max_mem_mb", &max_mem, "idle_timeout_secs", &idle) < 0) {
        work_fail(res, 400,
                  "sandboxes: expected {count, env, max_procs, max_mem_mb, idle_timeout_secs} "
                  "(unknown fields are refused)%s%s",
                  b ? "" : ": ", b ? "" : jerr.text);
        json_decref(b);
        return;
    }
    const char *e = NULL;
    if (count < 1 || count > POOL_COUNT_MAX)
        e = "count: 1..1000 sandboxes per request";
    else if ((e = check_env(env, "env: names [A-Za-z_][A-Za-z0-9_]*, string values")))
        ;
    else if (max_procs != -1 && (max_procs < 1 || max_procs > 4096))
        e = "max_procs: 1..4096";
    else if (max_mem != -1 && (max_mem < 1 || max_mem > 1048576))
        e = "max_mem_mb: 1..1048576";
    else if (idle != -1 && (idle < 0 || idle > 31536000))
        e = "idle_timeout_secs: 0 (never) ..31536000";
    if (e) {
        work_fail(res, 400, "sandboxes: %s", e);
        json_decref(b);
        return;
    }
    char key[160];
    json_t *pool;
    pool_key(key, sizeof key, a->ns, a->pool);
    if (load_json(w->st, key, &pool, NULL) < 0) {
        work_fail(res, 404, "no pool %s in namespace %s", a->pool, a->ns);
        json_decref(b);
        return;
    }
    if (!streq(jstr(pool, "state"), "active")) {
        work_fail(res, 409, "pool %s is being deleted", a->pool);
        json_decref(pool);
        json_decref(b);
        return;
    }
    /* what each host's agent gets (count set per host) */
    json_t *req = json_object();
    if (env)
        json_object_set(req, "env", env);
    if (max_procs != -1)
        json_object_set_new(req, "max_procs", json_integer(max_procs));
    if (max_mem != -1)
        json_object_set_new(req, "max_mem_mb", json_integer(max_mem));
    json_object_set_new(req, "idle_timeout_secs",
                        json_integer(idle != -1 ? idle : jint(pool, "sandbox_idle_s")));
    json_decref(b);
    char rid[17], why[300], why2[300] = "";
    random_hex(rid, 8);
    resv_t rv[POOL_HOSTS_MAX];
    json_int_t left;
    size_t nr = reserve(w, pool, a->ns, rid, count, rv, POOL_HOSTS_MAX, &left, why, sizeof why);
    if (nr == 0) {
        json_decref(req);
        json_decref(pool);
        work_answer(res, left == count && strstr(why, "max_hosts") ? 429 : 503,
                    json_pack("{s:s,s:I,s:s}", "error", why, "rejected", count, "reason", why));
        if (res->status == 503)
            (void)snprintf(res->headers, sizeof res->headers, "Retry-After: 1\r\n");
        return;
    }
    crash_point("pool:reserved");
    json_t *out = json_array();
    json_int_t made = 0;
    for (size_t i = 0; i < nr; i++) {
        char w2[300] = "";
        json_int_t got = fulfil(w, pool, a->ns, &rv[i], req, out, w2, sizeof w2);
        if (host_settle(w->st, rv[i].key, rid, got) < 0)
            log_warn("pool %s/%s: cannot settle a reservation on %s (the reconciler will)", a->ns,
                     a->pool, rv[i].key);
        made += got;
        if (w2[0] && !why2[0])
            (void)snprintf(why2, sizeof why2, "%s", w2);
    }
    json_decref(req);
    json_decref(pool);
    json_int_t rejected = count - made;
    const char *reason = why[0] ? why : why2;
    if (made == 0) {
        work_answer(
            res, 503,
            json_pack("{s:s,s:I,s:s}", "error", reason, "rejected", count, "reason", reason));
        json_decref(out);
        return;
    }
    json_t *ans = json_pack("{s:o,s:I}", "sandboxes", out, "rejected", rejected);
    if (rejected > 0)
        json_object_set_new(ans, "reason", json_string(reason));
    log_info("pool %s/%s: %lld sandboxes made, %lld rejected", a->ns, a->pool, (long long)made,
             (long long)rejected);
    work_answer(res, 200, ans);
}

/* ---- deleting one sandbox (a worker) ---------------------------------------------------------- */

typedef struct {
    char ns[64], pool[64], id[17];
} del_arg_t;

/* Forget sandbox rec: its record, its token, its slot on its host (when it still counted). */
static void sandbox_forget(store_t *st, const char *ns, const char *pool, json_t *rec,
                           bool slot_counted)
{
    char key[200], tkey[64];
    const char *id = jstr(rec, "id");
    sbx_key(key, sizeof key, ns, pool, id);
    token_key(tkey, sizeof tkey, id);
    (void)store_del(st, tkey, STORE_REV_ANY);
    (void)store_del(st, key, STORE_REV_ANY);
    if (!slot_counted)
        return;
    json_t *hosts = hosts_load(st, ns, pool);
    size_t i;
    json_t *h;
    json_array_foreach(hosts, i, h) {
        if (!streq(jstr(h, "job"), jstr(rec, "host")))
            continue;
        char hkey[200];
        (void)snprintf(hkey, sizeof hkey, "%s", jstr(h, "_key"));
        (void)host_settle(st, hkey, "-", -1);
    }
    json_decref(hosts);
}

static void del_fn(worker_t *w, void *arg, work_result_t *res)
{
    del_arg_t *a = arg;
    char key[200];
    json_t *rec;
    sbx_key(key, sizeof key, a->ns, a->pool, a->id);
    if (load_json(w->st, key, &rec, NULL) < 0) {
        work_fail(res, 404, "no sandbox %s in pool %s", a->id, a->pool);
        return;
    }
    if (*jstr(rec, "gone")) {
        sandbox_forget(w->st, a->ns, a->pool, rec, false);
        work_answer(
            res, 200,
            json_pack("{s:s,s:b,s:s}", "id", a->id, "deleted", true, "note", jstr(rec, "gone")));
        json_decref(rec);
        return;
    }
    runrec_t rr;
    json_t *sec = NULL;
    char tkey[64], msg[256] = "";
    token_key(tkey, sizeof tkey, a->id);
    int status = 0, r = -ESRCH;
    if (runrec_load(w->st, jstr(rec, "host"), &rr, NULL) == 0 && rr.state == RR_RUNNING &&
        rr.run.generation == (uint64_t)jint(rec, "generation") &&
        sealed_get(w->st, &w->ctl->seal, tkey, &sec) == 0 && worker_keys(w) >= 0) {
        char path[64];
        (void)snprintf(path, sizeof path, "/v1/sandboxes/%s", a->id);
        r = agent_call(w->ctl, w->st, &w->kr, &rr, "DELETE", path, jstr(sec, "token"), NULL,
                       &status, NULL, msg, sizeof msg);
    }
    json_decref(sec);
    if (r == 0 && status >= 500) {
        /* the agent could not tear it down: keep the record and the slot, say so */
        work_fail(res, 502, "sandbox %s: %s", a->id, msg);
        json_decref(rec);
        return;
    }
    /* deleted, or its host no longer has it (403: unknown there; its run is gone) */
    sandbox_forget(w->st, a->ns, a->pool, rec, true);
    log_info("pool %s/%s: sandbox %s deleted", a->ns, a->pool, a->id);
    work_answer(res, 200, json_pack("{s:s,s:b}", "id", a->id, "deleted", true));
    json_decref(rec);
}

/* ---- routes ------------------------------------------------------------------------------------ */

static size_t split(sv_t s, sv_t *seg, size_t n)
{
    size_t k = 0;
    while (s.len && k < n) {
        const char *slash = memchr(s.p, '/', s.len);
        seg[k++] = sv_make(s.p, slash ? (size_t)(slash - s.p) : s.len);
        if (!slash)
            return k;
        s = sv_make(slash + 1, s.len - seg[k - 1].len - 1);
    }
    return k;
}

static bool sv_to(sv_t v, char *out, size_t cap)
{
    if (v.len == 0 || v.len >= cap || memchr(v.p, 0, v.len))
        return false;
    memcpy(out, v.p, v.len);
    out[v.len] = 0;
    return true;
}

static alloc_arg_t *alloc_pending_arg(conn_t *c) { return c->hdata; }

static void alloc_body_done(conn_t *c)
{
    control_t *ctl = c->srv->app;
    alloc_arg_t *a = alloc_pending_arg(c);
    conn_set_handler(c, NULL, NULL); /* the task owns a from here */
    a->body = malloc(c->body.len + 1);
    if (!a->body) {
        alloc_free(a);
        conn_respond_errno(c, -ENOMEM, "sandboxes");
        return;
    }
    memcpy(a->body, buf_head(&c->body), c->body.len);
    a->body_len = c->body.len;
    work_submit(ctl, c, alloc_fn, a, alloc_free);
}

static void alloc_arg_close(conn_t *c, bool aborted)
{
    (void)aborted;
    alloc_free(c->hdata);
    c->hdata = NULL;
}
static const handler_ops_t alloc_ops = { .on_close = alloc_arg_close };

/* A pooled sandbox's own routes, through the edge. */
static void sandbox_proxy(control_t *ctl, conn_t *c, const char *ns, const char *pool,
                          const char *id, sv_t rest)
{
    char path[HTTP_MAX_HEAD];
    int n = snprintf(path, sizeof path, "/v1/sandboxes/%s" SV_FMT, id, SV_ARG(rest));
    if (n < 0 || (size_t)n >= sizeof path) {
        conn_respond_error(c, 414, "path too long");
        return;
    }
    sv_t agent_path = sv_make(path, (size_t)n);
    if (!auth_check(ctl, c, ns, edge_role_needed(c->req.method, CAP_AGENT_PORT, agent_path), NULL))
        return;
    char key[200], tkey[64];
    json_t *rec, *sec;
    sbx_key(key, sizeof key, ns, pool, id);
    if (load_json(ctl->store, key, &rec, NULL) < 0) {
        conn_respond_error(c, 404, "no sandbox %s in pool %s", id, pool);
        return;
    }
    if (*jstr(rec, "gone")) {
        conn_respond_error(c, 410, "sandbox %s is gone: %s", id, jstr(rec, "gone"));
        json_decref(rec);
        return;
    }
    token_key(tkey, sizeof tkey, id);
    if (sealed_get(ctl->store, &ctl->seal, tkey, &sec) < 0) {
        conn_respond_error(c, 503, "sandbox %s: its token cannot be read", id);
        json_decref(rec);
        return;
    }
    char host[32];
    (void)snprintf(host, sizeof host, "%s", jstr(rec, "host"));
    edge_pin_t pin = { .generation = (uint64_t)jint(rec, "generation"),
                       .sandbox = id,
                       .token = jstr(sec, "token") };
    edge_proxy(ctl, c, ns, host, CAP_AGENT_PORT, agent_path, &pin);
    json_decref(sec);
    json_decref(rec);
}

static void sandboxes_list(control_t *ctl, conn_t *c, const char *ns, const char *pool)
{
    char key[160], prefix[160];
    json_t *p;
    pool_key(key, sizeof key, ns, pool);
    if (load_json(ctl->store, key, &p, NULL) < 0) {
        conn_respond_error(c, 404, "no pool %s in namespace %s", pool, ns);
        return;
    }
    json_decref(p);
    sbx_prefix(prefix, sizeof prefix, ns, pool);
    store_kv_t *kvs;
    size_t n;
    int r = list_prefix(ctl->store, prefix, &kvs, &n);
    if (r < 0) {
        conn_respond_errno(c, r, "sandboxes");
        return;
    }
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < n; i++) {
        json_t *s = json_loadb(kvs[i].value, kvs[i].value_len, 0, NULL);
        if (s && !*jstr(s, "gone"))
            json_array_append_new(arr, sandbox_view(s, ns, pool));
        json_decref(s);
    }
    store_kv_free(kvs, n);
    conn_respond_json(c, 200, json_pack("{s:o}", "sandboxes", arr));
}

/* rest: what follows /v1/pools/ */
void route_pools(control_t *ctl, conn_t *c, sv_t rest)
{
    sv_t seg[5];
    char ns[64], pool[64], id[17];
    size_t n = split(rest, seg, 5);
    sv_t m = c->req.method;
    bool get = sv_eq(m, SV("GET")), post = sv_eq(m, SV("POST")), del = sv_eq(m, SV("DELETE"));
    if (n < 1 || !sv_to(seg[0], ns, sizeof ns) || !valid_name(ns, 63)) {
        conn_respond_error(c, 404, "expected /v1/pools/{namespace}[/{pool}[/sandboxes[/{id}]]]");
        return;
    }
    if (n >= 2 && (!sv_to(seg[1], pool, sizeof pool) || !valid_name(pool, 63))) {
        conn_respond_error(c, 404, "no such pool");
        return;
    }
    if (n >= 3 && !sv_eq(seg[2], SV("sandboxes"))) {
        conn_respond_error(c, 404, "no such route (expected .../sandboxes)");
        return;
    }
    if (n >= 4 && (!sv_to(seg[3], id, sizeof id) || !sandbox_id_valid(id))) {
        conn_respond_error(c, 404, "no such sandbox (ids are 16 hex digits)");
        return;
    }
    if (n == 5) {
        const char *after = seg[3].p + seg[3].len; /* "/exec", "/files/read", ... */
        sandbox_proxy(ctl, c, ns, pool, id, sv_make(after, (size_t)(rest.p + rest.len - after)));
        return;
    }
    principal_t pr;
    if (n == 1 && post) {
        if (!auth_check(ctl, c, ns, ROLE_WRITE, &pr))
            return;
        pool_ctx_t *cx = calloc(1, sizeof *cx);
        if (!cx) {
            conn_respond_errno(c, -ENOMEM, "pool");
            return;
        }
        memcpy(cx->ns, ns, strlen(ns) + 1);
        memcpy(cx->principal, pr.principal, strlen(pr.principal) + 1);
        cx->role = pr.role;
        conn_set_handler(c, &ctx_ops, cx);
        conn_collect_body(c, POOL_BODY_MAX, pool_create_done);
    } else if (n == 1 && get) {
        if (auth_check(ctl, c, ns, ROLE_READ, NULL))
            pools_list(ctl, c, ns);
    } else if (n == 2 && get) {
        if (auth_check(ctl, c, ns, ROLE_READ, NULL))
            pool_inspect(ctl, c, ns, pool);
    } else if (n == 2 && del) {
        if (auth_check(ctl, c, ns, ROLE_WRITE, NULL))
            pool_delete(ctl, c, ns, pool);
    } else if (n == 3 && post) {
        if (!auth_check(ctl, c, ns, ROLE_WRITE, NULL))
            return;
        alloc_arg_t *a = calloc(1, sizeof *a);
        if (!a) {
            conn_respond_errno(c, -ENOMEM, "sandboxes");
            return;
        }
        memcpy(a->ns, ns, strlen(ns) + 1);
        memcpy(a->pool, pool, strlen(pool) + 1);
        conn_set_handler(c, &alloc_ops, a);
        conn_collect_body(c, ALLOC_BODY_MAX, alloc_body_done);
    } else if (n == 3 && get) {
        if (auth_check(ctl, c, ns, ROLE_READ, NULL))
            sandboxes_list(ctl, c, ns, pool);
    } else if (n == 4 && get) {
        if (!auth_check(ctl, c, ns, ROLE_READ, NULL))
            return;
        char key[200];
        json_t *rec;
        sbx_key(key, sizeof key, ns, pool, id);
        if (load_json(ctl->store, key, &rec, NULL) < 0) {
            conn_respond_error(c, 404, "no sandbox %s in pool %s", id, pool);
            return;
        }
        if (*jstr(rec, "gone"))
            conn_respond_error(c, 410, "sandbox %s is gone: %s", id, jstr(rec, "gone"));
        else
            conn_respond_json(c, 200, sandbox_view(rec, ns, pool));
        json_decref(rec);
    } else if (n == 4 && del) {
        if (!auth_check(ctl, c, ns, ROLE_WRITE, NULL))
            return;
        del_arg_t *a = calloc(1, sizeof *a);
        if (!a) {
            conn_respond_errno(c, -ENOMEM, "delete");
            return;
        }
        memcpy(a->ns, ns, strlen(ns) + 1);
        memcpy(a->pool, pool, strlen(pool) + 1);
        memcpy(a->id, id, strlen(id) + 1);
        work_submit(ctl, c, del_fn, a, free);
    } else {
        conn_respond_error(c, 405, "method not allowed");
    }
}

/* ---- the reconciler's part: hosts follow their jobs, warm hosts, idle hosts, drains ---------- */

static int job_cancel(store_t *st, const char *ns, const char *id)
{
    for (int attempt = 0; attempt < 8; attempt++) {
        json_t *job;
        int64_t rev;
        int r = job_load(st, ns, id, &job, &rev);
        if (r < 0)
            return r;
        job_stage_t stage;
        job_desired_t desired;
        if (job_stage_of(job, &stage) < 0 || job_desired_of(job, &desired) < 0 ||
            desired == DESIRED_CANCELED || stage == STAGE_CANCELED || stage == STAGE_COMPLETED) {
            json_decref(job);
            return 0;
        }
        job_set_desired(job, DESIRED_CANCELED);
        r = job_save(st, ns, id, job, rev, NULL);
        json_decref(job);
        if (r != -ESTALE)
            return r;
    }
    return -EBUSY;
}

/* Mark the sandboxes of host job (of generations below below_gen; 0: all) gone. Returns how many
 * that still counted on the host. */
static json_int_t sandboxes_gone(store_t *st, const char *ns, const char *pool, const char *job,
                                 uint64_t below_gen, const char *reason)
{
    char prefix[160];
    sbx_prefix(prefix, sizeof prefix, ns, pool);
    store_kv_t *kvs;
    size_t n;
    json_int_t k = 0;
    if (list_prefix(st, prefix, &kvs, &n) < 0)
        return 0;
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_loadb(kvs[i].value, kvs[i].value_len, 0, NULL);
        if (!json_is_object(s) || *jstr(s, "gone") || !streq(jstr(s, "host"), job) ||
            (below_gen && (uint64_t)jint(s, "generation") >= below_gen)) {
            json_decref(s);
            continue;
        }
        json_object_set_new(s, "gone", json_string(reason));
        json_object_set_new(s, "gone_ms", json_integer(wall_ms()));
        if (save_json(st, kvs[i].key, s, kvs[i].rev) == 0) {
            char tkey[64];
            token_key(tkey, sizeof tkey, jstr(s, "id"));
            (void)store_del(st, tkey, STORE_REV_ANY);
            k++;
            log_info("pool %s/%s: sandbox %s gone: %s", ns, pool, jstr(s, "id"), reason);
        }
        json_decref(s);
    }
    store_kv_free(kvs, n);
    return k;
}

/* Delete gone records older than GONE_KEEP_MS (all of them when all). */
static void gone_sweep(store_t *st, const char *ns, const char *pool, bool all)
{
    char prefix[160];
    sbx_prefix(prefix, sizeof prefix, ns, pool);
    store_kv_t *kvs;
    size_t n;
    if (list_prefix(st, prefix, &kvs, &n) < 0)
        return;
    int64_t now = wall_ms();
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_loadb(kvs[i].value, kvs[i].value_len, 0, NULL);
        if (json_is_object(s) &&
            (all || (*jstr(s, "gone") && now - jint(s, "gone_ms") > GONE_KEEP_MS))) {
            char tkey[64];
            token_key(tkey, sizeof tkey, jstr(s, "id"));
            (void)store_del(st, tkey, STORE_REV_ANY);
            (void)store_del(st, kvs[i].key, kvs[i].rev);
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

/* Compare the host's sandbox records with what its agent has: records the agent lost (its idle
 * timeout, or a delete straight on the host) are gone and free their slots; sandboxes the agent
 * has without a record (an allocation that crashed before recording) are deleted there. */
static void host_sync(control_t *ctl, store_t *st, const keyring_t *kr, const char *ns,
                      const char *pool, json_t *h, const runrec_t *rr)
{
    worker_t w = { .ctl = ctl, .st = st, .kr = *kr, .kr_ms = monotonic_ms() };
    char token[80], msg[256];
    if (host_token(&w, jstr(h, "job"), token, sizeof token) < 0)
        return;
    int status = 0;
    json_t *list = NULL;
    int r = agent_call(ctl, st, kr, rr, "GET", "/v1/sandboxes", token, NULL, &status, &list, msg,
                       sizeof msg);
    if (r < 0 || status != 200 || !json_is_array(list)) {
        json_decref(list);
        sodium_memzero(token, sizeof token);
        return;
    }
    int64_t now = wall_ms();
    /* records whose sandbox the agent no longer has */
    char prefix[160];
    sbx_prefix(prefix, sizeof prefix, ns, pool);
    store_kv_t *kvs;
    size_t n;
    json_int_t lost = 0;
    if (list_prefix(st, prefix, &kvs, &n) == 0) {
        for (size_t i = 0; i < n; i++) {
            json_t *s = json_loadb(kvs[i].value, kvs[i].value_len, 0, NULL);
            bool mine = json_is_object(s) && !*jstr(s, "gone") &&
                        streq(jstr(s, "host"), jstr(h, "job")) &&
                        (uint64_t)jint(s, "generation") == rr->run.generation &&
                        now - jint(s, "created_ms") > 5000;
            bool there = false;
            size_t k;
            json_t *a;
            json_array_foreach(list, k, a)
                if (mine && streq(jstr(a, "id"), jstr(s, "id")))
                    there = true;
            if (mine && !there) {
                json_object_set_new(s, "gone",
                                    json_string("its host no longer has it (its idle timeout, or "
                                                "deleted on the host)"));
                json_object_set_new(s, "gone_ms", json_integer(now));
                if (save_json(st, kvs[i].key, s, kvs[i].rev) == 0) {
                    char tkey[64];
                    token_key(tkey, sizeof tkey, jstr(s, "id"));
                    (void)store_del(st, tkey, STORE_REV_ANY);
                    lost++;
                    log_info("pool %s/%s: sandbox %s gone from its host", ns, pool, jstr(s, "id"));
                }
            }
            json_decref(s);
        }
        store_kv_free(kvs, n);
    }
    if (lost)
        (void)host_settle(st, jstr(h, "_key"), "-", -lost);
    /* sandboxes without a record */
    size_t k;
    json_t *a;
    json_array_foreach(list, k, a) {
        const char *id = jstr(a, "id");
        char key[200], path[96];
        json_t *rec;
        if (!sandbox_id_valid(id) || now - jint(a, "created_at_ms") < ORPHAN_GRACE_MS)
            continue;
        sbx_key(key, sizeof key, ns, pool, id);
        if (load_json(st, key, &rec, NULL) == 0) {
            json_decref(rec);
            continue;
        }
        json_t *t = NULL;
        (void)snprintf(path, sizeof path, "/v1/sandboxes/%s/token", id);
        if (agent_call(ctl, st, kr, rr, "GET", path, token, NULL, &status, &t, msg, sizeof msg) ==
                0 &&
            status == 200) {
            (void)snprintf(path, sizeof path, "/v1/sandboxes/%s", id);
            if (agent_call(ctl, st, kr, rr, "DELETE", path, jstr(t, "token"), NULL, &status, NULL,
                           msg, sizeof msg) == 0 &&
                status == 200)
                log_warn("pool %s/%s: deleted sandbox %s on host %s: it had no record (an "
                         "allocation that did not finish)",
                         ns, pool, id, jstr(h, "job"));
        }
        json_decref(t);
    }
    json_decref(list);
    sodium_memzero(token, sizeof token);
    sodium_memzero(&w.kr, sizeof w.kr);
}

/* Drop reservations whose control process is gone, or that are too old. */
static void pending_sweep(store_t *st, const char *self, json_t *h)
{
    json_t *pend = json_object_get(h, "pending");
    bool changed = false;
    for (size_t i = json_array_size(pend); i-- > 0;) {
        json_t *p = json_array_get(pend, i);
        const char *owner = jstr(p, "owner");
        if (wall_ms() - jint(p, "at_ms") > PENDING_STALE_MS ||
            (!streq(owner, self) && !control_alive(st, owner))) {
            json_array_remove(pend, i);
            changed = true;
        }
    }
    if (changed && host_save(st, h) == 0)
        log_info("pool host %s: dropped reservations of a control process that is gone",
                 jstr(h, "job"));
}

static void pool_sync(control_t *ctl, store_t *st, const keyring_t *kr, pool_syncs_t *ps,
                      json_t *pool, const char *key, int64_t pool_rev)
{
    const char *ns = jstr(pool, "namespace"), *name = jstr(pool, "name");
    bool draining = !streq(jstr(pool, "state"), "active");
    json_t *hosts = hosts_load(st, ns, name);
    if (!hosts)
        return;
    int64_t now = wall_ms();
    size_t i, serving = 0;
    json_t *h;
    /* first: hosts whose job ended or that are being retired */
    json_array_foreach(hosts, i, h) {
        const char *job_id = jstr(h, "job");
        json_t *job = NULL;
        bool have = job_load(st, ns, job_id, &job, NULL) == 0;
        const char *stage = have ? jstr(job, "stage") : "";
        job_stage_t jst;
        bool ended = have && job_stage_of(job, &jst) == 0 && job_stage_ended(jst);
        char reason[300] = "";
        if (!have && now - jint(h, "created_ms") > 30000)
            (void)snprintf(reason, sizeof reason, "its pool host %s was never made", job_id);
        else if (ended)
            (void)snprintf(reason, sizeof reason, "its pool host %s ended (%s%s%s)", job_id, stage,
                           *jstr(job, "message") ? ": " : "", jstr(job, "message"));
        if ((draining || streq(jstr(h, "state"), "retiring")) && have && !ended)
            (void)job_cancel(st, ns, job_id);
        if (reason[0]) {
            (void)sandboxes_gone(st, ns, name, job_id, 0,
                                 draining ? "its pool was deleted" : reason);
            if (store_del(st, jstr(h, "_key"), jint(h, "_rev")) == 0)
                log_info("pool %s/%s: host %s dropped: %s", ns, name, job_id, reason);
            json_object_set_new(h, "_dropped", json_true());
        } else if (!draining && host_takes(h)) {
            serving++;
        }
        json_decref(job);
    }
    /* then: the hosts that serve */
    json_array_foreach(hosts, i, h) {
        if (draining || json_is_true(json_object_get(h, "_dropped")) || !host_takes(h))
            continue;
        pending_sweep(st, ctl->instance, h);
        runrec_t rr;
        if (runrec_load(st, jstr(h, "job"), &rr, NULL) < 0 || rr.state != RR_RUNNING)
            continue;
        char hkey[200];
        (void)snprintf(hkey, sizeof hkey, "%s", jstr(h, "_key"));
        uint64_t gen = (uint64_t)jint(h, "generation");
        if (streq(jstr(h, "state"), "booting") || gen == 0) {
            host_mark_ready(st, hkey, rr.run.generation);
            continue;
        }
        if (gen != rr.run.generation) {
            /* the host's run was replaced (moved, restarted): the new agent has none of them */
            char reason[200];
            (void)snprintf(
                reason, sizeof reason, "its pool host %s was restarted (generation %llu -> %llu)",
                jstr(h, "job"), (unsigned long long)gen, (unsigned long long)rr.run.generation);
            json_int_t lost =
                sandboxes_gone(st, ns, name, jstr(h, "job"), rr.run.generation, reason);
            json_object_set_new(h, "generation", json_integer((json_int_t)rr.run.generation));
            json_object_set_new(h, "used", json_integer(MAX(0, jint(h, "used") - lost)));
            (void)host_save(st, h);
            continue;
        }
        if (sync_due(ps, jstr(h, "job"), now))
            host_sync(ctl, st, kr, ns, name, h, &rr);
        /* empty: retire after host_idle_s, keeping `warm` hosts */
        json_t *fresh;
        int64_t rev;
        if (load_json(st, hkey, &fresh, &rev) < 0)
            continue;
        bool empty =
            jint(fresh, "used") == 0 && json_array_size(json_object_get(fresh, "pending")) == 0;
        int64_t since = jint(fresh, "empty_since_ms");
        int r = 1;
        if (!empty && since) {
            json_object_set_new(fresh, "empty_since_ms", json_integer(0));
            r = save_json(st, hkey, fresh, rev);
        } else if (empty && !since) {
            json_object_set_new(fresh, "empty_since_ms", json_integer(now));
            r = save_json(st, hkey, fresh, rev);
        } else if (empty && jint(pool, "host_idle_s") > 0 &&
                   now - since > jint(pool, "host_idle_s") * 1000 &&
                   (json_int_t)serving > jint(pool, "warm")) {
            json_object_set_new(fresh, "state", json_string("retiring"));
            r = save_json(st, hkey, fresh, rev);
            if (r == 0) {
                serving--;
                log_info("pool %s/%s: host %s empty for %lld s: retiring", ns, name,
                         jstr(fresh, "job"), (long long)((now - since) / 1000));
                (void)job_cancel(st, ns, jstr(fresh, "job"));
            }
        }
        (void)r;
        json_decref(fresh);
    }
    size_t left = 0;
    json_array_foreach(hosts, i, h)
        left += !json_is_true(json_object_get(h, "_dropped"));
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
    /* warm hosts: booted ahead, at the lowest free slots */
    for (json_int_t want = jint(pool, "warm") - (json_int_t)serving; want > 0; want--) {
        json_t *all = hosts_load(st, ns, name);
        bool used[POOL_HOSTS_MAX] = { false };
        size_t nh = json_array_size(all);
        json_array_foreach(all, i, h)
            if (jint(h, "slot") >= 0 && jint(h, "slot") < POOL_HOSTS_MAX)
                used[jint(h, "slot")] = true;
        json_decref(all);
        if ((json_int_t)nh >= jint(pool, "max_hosts"))
            break;
        int slot = 0;
        while (slot < jint(pool, "max_hosts") && used[slot])
            slot++;
        char hkey[200], job_id[25], err[256];
        (void)snprintf(hkey, sizeof hkey, "poolhosts/%s/%s/%03d", ns, name, slot);
        random_hex(job_id, 12);
        json_t *rec = json_pack("{s:i,s:s,s:I,s:I,s:[],s:s,s:I,s:I,s:I}", "slot", slot, "job",
                                job_id, "capacity", jint(pool, "per_host"), "used", (json_int_t)0,
                                "pending", "state", "booting", "generation", (json_int_t)0,
                                "created_ms", (json_int_t)now, "empty_since_ms", (json_int_t)0);
        int r = rec ? save_json(st, hkey, rec, STORE_REV_ABSENT) : -ENOMEM;
        json_decref(rec);
        if (r < 0)
            break;
        if (host_job_create(st, &ctl->seal, ctl->cfg.default_image, pool, ns, job_id, err,
                            sizeof err) < 0) {
            log_warn("pool %s/%s: cannot make a warm host: %s", ns, name, err);
            (void)store_del(st, hkey, STORE_REV_ANY);
            break;
        }
        log_info("pool %s/%s: warm host %d booting (job %s)", ns, name, slot, job_id);
        control_kick(ctl);
    }
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
}
