/* SPDX-License-Identifier: MIT */
/* Pools: a control-plane resource that packs light sandboxes into pool hosts (jobs of mode
 * "pool", one agent in host mode each). The API, on the loop thread:
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
 * Making and deleting sandboxes waits on nodes: those run on worker threads (poolalloc.c). The
 * records and the helpers the parts share are here (pools.h says what each record holds). */
#include <sodium.h>
#include <stdio.h>
#include <time.h>

#include "cap/purpose.h"
#include "common/log.h"
#include "pools.h"

#define POOL_BODY_MAX 4096
#define ALLOC_BODY_MAX (256 * 1024)

/* ---- records ---------------------------------------------------------------------------------- */

void pool_msleep(unsigned ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    (void)nanosleep(&ts, NULL);
}

void pool_json_wipe(json_t *j)
{
    const char *k;
    json_t *v;
    size_t i;
    if (json_is_string(j) && json_string_length(j))
        sodium_memzero((char *)json_string_value(j), json_string_length(j));
    else if (json_is_object(j))
        json_object_foreach(j, k, v)
            pool_json_wipe(json_incref(v));
    else if (json_is_array(j))
        json_array_foreach(j, i, v)
            pool_json_wipe(json_incref(v));
    json_decref(j);
}

void pool_key(char *out, size_t cap, const char *ns, const char *pool)
{
    (void)snprintf(out, cap, "pools/%s/%s", ns, pool);
}
void pool_sbx_prefix(char *out, size_t cap, const char *ns, const char *pool)
{
    (void)snprintf(out, cap, "poolsbx/%s/%s/", ns, pool);
}
void pool_sbx_key(char *out, size_t cap, const char *ns, const char *pool, const char *id)
{
    (void)snprintf(out, cap, "poolsbx/%s/%s/%s", ns, pool, id);
}
void pool_token_key(char *out, size_t cap, const char *ns, const char *pool, const char *id)
{
    (void)snprintf(out, cap, "secrets/psb/%s/%s/%s", ns, pool, id);
}

bool pool_sandbox_id_valid(const char *s)
{
    size_t n = strlen(s);
    if (n != 16)
        return false;
    for (; *s; s++)
        if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f')))
            return false;
    return true;
}

json_t *pool_hosts_load(store_t *st, const char *ns, const char *pool)
{
    char prefix[160];
    (void)snprintf(prefix, sizeof prefix, "poolhosts/%s/%s/", ns, pool);
    store_kv_t *kvs;
    size_t n;
    json_t *arr = json_array();
    if (!arr || store_list(st, prefix, &kvs, &n) < 0) {
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

json_t *pool_live_counts(store_t *st, const char *ns, const char *pool)
{
    char prefix[160];
    pool_sbx_prefix(prefix, sizeof prefix, ns, pool);
    store_kv_t *kvs;
    size_t n;
    json_t *counts = json_object();
    if (!counts || store_list(st, prefix, &kvs, &n) < 0) {
        json_decref(counts);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_loadb(kvs[i].value, kvs[i].value_len, 0, NULL);
        if (json_is_object(s) && !*jstr(s, "gone"))
            json_object_set_new(counts, jstr(s, "host"),
                                json_integer(jint(counts, jstr(s, "host")) + 1));
        json_decref(s);
    }
    store_kv_free(kvs, n);
    return counts;
}

json_int_t pool_host_pending(json_t *h)
{
    json_int_t pend = 0;
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(h, "pending"), i, p)
        pend += jint(p, "n");
    return pend;
}

json_int_t pool_host_live(json_t *h)
{
    json_t *v = json_object_get(h, "live");
    return json_is_integer(v) && json_integer_value(v) >= 0 ? json_integer_value(v) : -1;
}

bool pool_hosts_counted(json_t *hosts)
{
    size_t i;
    json_t *h;
    json_array_foreach(hosts, i, h)
        if (pool_host_live(h) < 0)
            return false;
    return true;
}

json_int_t pool_host_used(json_t *h, json_t *live)
{
    json_int_t used = pool_host_live(h);
    return used >= 0 ? used : jint(live, jstr(h, "job"));
}

json_int_t pool_host_free(json_t *h, json_t *live)
{
    return jint(h, "capacity") - pool_host_used(h, live) - pool_host_pending(h);
}

bool pool_host_takes(json_t *h)
{
    const char *s = jstr(h, "state");
    return streq(s, "booting") || streq(s, "ready");
}

int pool_host_edit(store_t *st, const char *key, const char *job, int (*edit)(json_t *h, void *arg),
                   void *arg)
{
    for (int attempt = 0; attempt < 200; attempt++) {
        json_t *h;
        int64_t rev;
        int r = record_load(st, key, &h, &rev);
        if (r < 0)
            return r;
        if (!streq(jstr(h, "job"), job)) { /* the slot holds another host now */
            json_decref(h);
            return -ENOENT;
        }
        r = edit(h, arg);
        if (r == 0)
            r = record_save(st, key, h, rev, NULL);
        json_decref(h);
        if (r != -ESTALE)
            return r > 0 ? 0 : r;
    }
    return -EBUSY;
}

static int settle_edit(json_t *h, void *arg)
{
    const char *rid = arg;
    json_t *pend = json_object_get(h, "pending");
    bool found = false;
    for (size_t i = json_array_size(pend); i-- > 0;)
        if (streq(jstr(json_array_get(pend, i), "id"), rid)) {
            json_array_remove(pend, i);
            found = true;
        }
    return found ? 0 : 1;
}

int pool_host_settle(store_t *st, const char *key, const char *job, const char *rid)
{
    return pool_host_edit(st, key, job, settle_edit, (void *)rid);
}

unsigned pool_race_window_ms(void)
{
    const char *e = getenv("SBX_TEST_POOL_RACE_MS");
    uint64_t ms = 0;
    if (e && parse_u64(sv_make(e, strlen(e)), 1000, &ms) < 0)
        ms = 0;
    return (unsigned)ms;
}

/* The host record of job: read by key, or found among the pool's hosts; *ret NULL when there is
 * none (or the slot holds another host now). */
static int host_of_job(store_t *st, const char *ns, const char *pool, const char *host_key,
                       const char *job, json_t **ret, char *key, size_t key_cap, int64_t *ret_rev)
{
    *ret = NULL;
    if (host_key) {
        json_t *h;
        int r = record_load(st, host_key, &h, ret_rev);
        if (r == -ENOENT)
            return 0;
        if (r < 0)
            return r;
        if (!streq(jstr(h, "job"), job)) {
            json_decref(h);
            return 0;
        }
        (void)snprintf(key, key_cap, "%s", host_key);
        *ret = h;
        return 0;
    }
    json_t *hosts = pool_hosts_load(st, ns, pool), *h;
    if (!hosts)
        return -EIO;
    size_t i;
    json_array_foreach(hosts, i, h) {
        if (!streq(jstr(h, "job"), job))
            continue;
        (void)snprintf(key, key_cap, "%s", jstr(h, "_key"));
        *ret_rev = jint(h, "_rev");
        json_object_del(h, "_key");
        json_object_del(h, "_rev");
        *ret = json_incref(h);
        break;
    }
    json_decref(hosts);
    return 0;
}

int pool_host_txn(store_t *st, const char *ns, const char *pool, const char *host_key,
                  const char *job, json_int_t delta, const char *drop_rid, store_op_t *ops,
                  size_t n, size_t *ret_failed)
{
    for (int attempt = 0; attempt < 200; attempt++) {
        json_t *h;
        char key[200];
        int64_t rev = 0;
        int r = host_of_job(st, ns, pool, host_key, job, &h, key, sizeof key, &rev);
        if (r < 0)
            return r;
        if (pool_race_window_ms())
            pool_msleep(pool_race_window_ms());
        size_t m = n, failed = SIZE_MAX;
        _cleanup_free_ char *v = NULL;
        if (h) {
            json_int_t live = pool_host_live(h);
            if (live >= 0) /* else the reconciler counts it (pool_host_live) */
                json_object_set_new(h, "live", json_integer(MAX(live + delta, 0)));
            if (drop_rid)
                (void)settle_edit(h, (void *)drop_rid);
            v = json_dumps(h, JSON_COMPACT | JSON_SORT_KEYS); /* as record_save */
            json_decref(h);
            if (!v)
                return -ENOMEM;
            ops[m++] = (store_op_t){ .key = key, .value = v, .len = strlen(v), .expect_rev = rev };
        }
        r = store_txn(st, ops, m, NULL, &failed);
        if (r == -ESTALE && failed == n)
            continue; /* the host record changed meanwhile: read it again */
        if (ret_failed)
            *ret_failed = failed;
        return r;
    }
    return -EBUSY;
}

int pool_host_token(store_t *st, const seal_keys_t *seal, const char *job, char *out, size_t cap)
{
    json_t *sec;
    int r = job_secrets_get(st, seal, job, &sec);
    if (r < 0)
        return r;
    const char *t = jstr(sec, "SBX_TOKEN");
    r = *t && strlen(t) < cap ? 0 : -ENOKEY;
    if (r == 0)
        memcpy(out, t, strlen(t) + 1);
    pool_json_wipe(sec);
    return r;
}

int pool_host_job_create(store_t *st, const seal_keys_t *seal, const char *default_image,
                         json_t *pool, const char *ns, const char *job_id, sbx_err_t *err)
{
    char cap_s[16], tok[65];
    (void)snprintf(cap_s, sizeof cap_s, "%lld", (long long)jint(pool, "per_host"));
    random_hex(tok, 32);
    /* a host whose node is lost is started again elsewhere at once (its sandboxes are gone
     * either way): waiting for the node would leave the pool's slots held */
    json_t *body =
        json_pack("{s:s,s:s,s:s,s:s,s:{s:s},s:{s:s},s:{s:s,s:s,s:s}}", "image", jstr(pool, "image"),
                  "flavor", jstr(pool, "flavor"), "mode", "pool", "on_node_loss", "restart", "env",
                  "SBX_CAPACITY", cap_s, "secrets", "SBX_TOKEN", tok, "labels", "sbx-sandbox-mode",
                  "pool", "sbx-pool", jstr(pool, "name"), "sbx-pool-host", "1");
    sodium_memzero(tok, sizeof tok);
    json_t *job = NULL, *sec = NULL;
    sbx_err_t jerr;
    const char *e = !body                                                          ? "out of memory"
                    : job_from_request(body, default_image, &job, &sec, &jerr) < 0 ? jerr.msg
                                                                                   : NULL;
    /* job and sec hold parts of body (the token is in sec's strings, wiped below) */
    if (e)
        pool_json_wipe(body);
    else
        json_decref(body);
    if (e)
        return sbx_err(err, -EINVAL, "pool host job: %s", e);
    int r = job_insert(st, seal, ns, "sbx-pools", job_id, job, sec);
    json_decref(job);
    pool_json_wipe(sec);
    if (r < 0)
        return sbx_err(err, r, "pool host job: %s", strerror(-r));
    return r;
}

const char *pool_sandbox_host_key(json_t *s)
{
    const char *k = jstr(s, "host_key");
    return *k ? k : NULL;
}

json_t *pool_sandbox_view(json_t *s, const char *ns, const char *pool)
{
    json_t *v = json_copy(s);
    if (!v)
        return NULL;
    json_object_del(v, "host_key"); /* the control's own bookkeeping */
    char path[256];
    (void)snprintf(path, sizeof path, "/v1/pools/%s/%s/sandboxes/%s", ns, pool, jstr(s, "id"));
    json_object_set_new(v, "path", json_string(path));
    return v;
}

/* ---- the API: pools ----------------------------------------------------------------------------- */

typedef struct {
    char ns[64], principal[64];
    role_t role;
} pool_ctx_t;

static int pool_from_request(control_t *ctl, json_t *b, json_t **ret, sbx_err_t *err)
{
    const char *name = NULL, *image = ctl->cfg.default_image, *flavor = "cpu-small";
    json_int_t per_host = 32, warm = 0, max_hosts = 4, sbx_idle = 0, host_idle = 300;
    if (!json_is_object(b) ||
        json_unpack(b, "{s:s,s?s,s?s,s?I,s?I,s?I,s?I,s?I!}", "name", &name, "image", &image,
                    "flavor", &flavor, "per_host", &per_host, "warm", &warm, "max_hosts",
                    &max_hosts, "sandbox_idle_s", &sbx_idle, "host_idle_s", &host_idle) < 0)
        return sbx_err(err, -EINVAL,
                       "expected {name, image, flavor, per_host, warm, max_hosts, sandbox_idle_s, "
                       "host_idle_s} (name required; unknown fields are refused)");
    if (!valid_name(name, 63))
        return sbx_err(err, -EINVAL, "name: [a-z0-9][a-z0-9._-]*, at most 63 bytes");
    if (per_host < 1 || per_host > POOL_PER_HOST_MAX)
        return sbx_err(err, -EINVAL, "per_host: 1..4096 sandboxes per host");
    if (max_hosts < 1 || max_hosts > POOL_HOSTS_MAX)
        return sbx_err(err, -EINVAL, "max_hosts: 1..64");
    if (warm < 0 || warm > max_hosts)
        return sbx_err(err, -EINVAL, "warm: 0..max_hosts hosts kept ready");
    if (sbx_idle < 0 || sbx_idle > 31536000)
        return sbx_err(err, -EINVAL, "sandbox_idle_s: 0 (never) ..31536000 seconds");
    if (host_idle < 0 || host_idle > 31536000)
        return sbx_err(err, -EINVAL, "host_idle_s: 0..31536000 seconds");
    /* the host job must be one the Jobs API would take */
    json_t *probe = json_pack("{s:s,s:s,s:s}", "image", image, "flavor", flavor, "mode", "pool");
    json_t *job = NULL, *sec = NULL;
    int r = probe ? job_from_request(probe, ctl->cfg.default_image, &job, &sec, err)
                  : sbx_err(err, -ENOMEM, "out of memory");
    json_decref(probe);
    json_decref(job);
    json_decref(sec);
    if (r < 0)
        return r;
    *ret = json_pack("{s:s,s:s,s:s,s:I,s:I,s:I,s:I,s:I,s:s}", "name", name, "image", image,
                     "flavor", flavor, "per_host", per_host, "warm", warm, "max_hosts", max_hosts,
                     "sandbox_idle_s", sbx_idle, "host_idle_s", host_idle, "state", "active");
    return *ret ? 0 : sbx_err(err, -ENOMEM, "out of memory");
}

static void pool_create_done(conn_t *c)
{
    control_t *ctl = c->srv->app;
    pool_ctx_t *cx = c->hdata;
    json_error_t jerr;
    json_t *b = json_loadb(buf_head(&c->body), c->body.len, 0, &jerr), *pool = NULL;
    sbx_err_t err;
    int r = b ? pool_from_request(ctl, b, &pool, &err) : sbx_err(&err, -EINVAL, "%s", jerr.text);
    json_decref(b);
    if (r < 0) {
        http_bad_request(c, 0, "pool: %s", err.msg);
        return;
    }
    const char *image = jstr(pool, "image");
    if (streq(image, "host") && cx->role != ROLE_ADMIN && !streq(ctl->cfg.default_image, "host")) {
        http_forbidden(c, 0, "pool: image host (the node's own programs) is for admins");
        json_decref(pool);
        return;
    }
    if (!image_on_live_node(ctl->store, image, NULL)) {
        http_bad_request(c, 0, "pool: image %s: not available on any node", image);
        json_decref(pool);
        return;
    }
    json_object_set_new(pool, "namespace", json_string(cx->ns));
    json_object_set_new(pool, "initiator", json_string(cx->principal));
    json_object_set_new(pool, "created_ms", json_integer(wall_ms()));
    char key[160];
    pool_key(key, sizeof key, cx->ns, jstr(pool, "name"));
    r = record_save(ctl->store, key, pool, STORE_REV_ABSENT, NULL);
    if (r == -ESTALE || r == -EEXIST) {
        http_conflict(c, 0, "pool %s exists in namespace %s (DELETE it first)", jstr(pool, "name"),
                      cx->ns);
        json_decref(pool);
        return;
    }
    if (r < 0) {
        json_decref(pool);
        respond_store_err(c, r, "pool create", "pool create: not found");
        return;
    }
    log_info("pool %s/%s created by %s", cx->ns, jstr(pool, "name"), cx->principal);
    control_kick(ctl); /* warm hosts */
    conn_respond_json(c, 201, pool);
}

/* The pool record, or an answer (404, or 503 for a store error) and NULL. */
static json_t *pool_or_answer(control_t *ctl, conn_t *c, const char *ns, const char *name,
                              int64_t *ret_rev)
{
    char key[160];
    json_t *pool;
    pool_key(key, sizeof key, ns, name);
    int r = record_load(ctl->store, key, &pool, ret_rev);
    if (r < 0)
        respond_store_err(c, r, "pool", "no pool %s in namespace %s", name, ns);
    return r < 0 ? NULL : pool;
}

static void pool_inspect(control_t *ctl, conn_t *c, const char *ns, const char *name)
{
    json_t *pool = pool_or_answer(ctl, c, ns, name, NULL);
    if (!pool)
        return;
    json_t *hosts = pool_hosts_load(ctl->store, ns, name);
    json_t *live = pool_live_counts(ctl->store, ns, name);
    if (!hosts || !live) {
        json_decref(hosts);
        json_decref(live);
        json_decref(pool);
        respond_store_err(c, -EIO, "pool inspect", "pool inspect: not found");
        return;
    }
    json_t *view = json_array(), *h, *v;
    size_t i;
    json_int_t total = 0;
    const char *k;
    json_object_foreach(live, k, v)
        total += json_integer_value(v);
    json_array_foreach(hosts, i, h) {
        json_t *job = NULL;
        (void)job_load(ctl->store, ns, jstr(h, "job"), &job, NULL);
        json_array_append_new(
            view, json_pack("{s:I,s:s,s:s,s:s,s:I,s:I,s:I,s:I,s:I}", "slot", jint(h, "slot"), "job",
                            jstr(h, "job"), "state", jstr(h, "state"), "stage",
                            job ? jstr(job, "stage") : "", "used", pool_host_used(h, live),
                            "pending", pool_host_pending(h), "free", pool_host_free(h, live),
                            "capacity", jint(h, "capacity"), "generation", jint(h, "generation")));
        json_decref(job);
    }
    json_decref(hosts);
    json_decref(live);
    json_object_set_new(pool, "hosts", view);
    json_object_set_new(pool, "sandboxes", json_integer(total));
    conn_respond_json(c, 200, pool);
}

static void pools_list(control_t *ctl, conn_t *c, const char *ns)
{
    char prefix[96];
    (void)snprintf(prefix, sizeof prefix, "pools/%s/", ns);
    store_kv_t *kvs;
    size_t n;
    int r = store_list(ctl->store, prefix, &kvs, &n);
    if (r < 0) {
        respond_store_err(c, r, "pools", "pools: not found");
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
        int64_t rev;
        json_t *pool = pool_or_answer(ctl, c, ns, name, &rev);
        if (!pool)
            return;
        json_object_set_new(pool, "state", json_string("draining"));
        int r = record_save(ctl->store, key, pool, rev, NULL);
        if (r == -ESTALE) {
            json_decref(pool);
            continue;
        }
        if (r < 0) {
            json_decref(pool);
            respond_store_err(c, r, "pool delete", "pool delete: not found");
            return;
        }
        log_info("pool %s/%s: draining (delete requested)", ns, name);
        control_kick(ctl);
        conn_respond_json(c, 202, pool);
        return;
    }
    http_unavailable(c, 0, "pool delete: too much contention on the pool record");
}

/* ---- the API: sandboxes --------------------------------------------------------------------------- */

static void alloc_body_done(conn_t *c)
{
    control_t *ctl = c->srv->app;
    pool_alloc_arg_t *a = c->hdata;
    conn_set_handler(c, NULL, NULL); /* the task owns a from here */
    a->body = malloc(c->body.len + 1);
    if (!a->body) {
        pool_alloc_arg_free(a);
        http_errno(c, 0, -ENOMEM, "sandboxes");
        return;
    }
    memcpy(a->body, buf_head(&c->body), c->body.len);
    a->body_len = c->body.len;
    work_submit(ctl, c, a->ns, 0, pool_alloc_fn, a, pool_alloc_arg_free);
}

static void alloc_arg_close(conn_t *c, bool aborted)
{
    (void)aborted;
    pool_alloc_arg_free(c->hdata);
    c->hdata = NULL;
}
static const handler_ops_t alloc_ops = { .on_close = alloc_arg_close };

/* The sandbox's record, or an answer (404, 410 when gone, 503) and NULL. */
static json_t *sandbox_or_answer(control_t *ctl, conn_t *c, const char *ns, const char *pool,
                                 const char *id)
{
    char key[200];
    json_t *rec;
    pool_sbx_key(key, sizeof key, ns, pool, id);
    int r = record_load(ctl->store, key, &rec, NULL);
    if (r < 0) {
        respond_store_err(c, r, "sandbox", "no sandbox %s in pool %s", id, pool);
        return NULL;
    }
    if (*jstr(rec, "gone")) {
        http_gone(c, 0, "sandbox %s is gone: %s", id, jstr(rec, "gone"));
        json_decref(rec);
        return NULL;
    }
    return rec;
}

/* A pooled sandbox's own routes, through the edge. */
static void sandbox_proxy(control_t *ctl, conn_t *c, const char *ns, const char *pool,
                          const char *id, sv_t rest)
{
    char path[HTTP_MAX_HEAD];
    int n = snprintf(path, sizeof path, "/v1/sandboxes/%s" SV_FMT, id, SV_ARG(rest));
    if (n < 0 || (size_t)n >= sizeof path) {
        http_uri_too_long(c, 0, "path too long");
        return;
    }
    sv_t agent_path = sv_make(path, (size_t)n);
    if (!auth_check(ctl, c, ns, edge_role_needed(c->req.method, CAP_AGENT_PORT, agent_path), NULL))
        return;
    json_t *rec = sandbox_or_answer(ctl, c, ns, pool, id), *sec;
    if (!rec)
        return;
    char tkey[200];
    pool_token_key(tkey, sizeof tkey, ns, pool, id);
    int r = sealed_get(ctl->store, &ctl->seal, tkey, &sec);
    if (r < 0) {
        json_decref(rec);
        if (r != -ENOENT) {
            http_unavailable(c, 0, "sandbox %s: its token cannot be read", id);
            return;
        }
        /* marked gone meanwhile (its token goes first): say so; else not recorded yet */
        rec = sandbox_or_answer(ctl, c, ns, pool, id);
        if (rec) {
            http_unavailable(c, 0, "sandbox %s: its token is not recorded yet", id);
            json_decref(rec);
        }
        return;
    }
    char host[32];
    (void)snprintf(host, sizeof host, "%s", jstr(rec, "host"));
    edge_pin_t pin = { .generation = (uint64_t)jint(rec, "generation"),
                       .sandbox = id,
                       .token = jstr(sec, "token") };
    edge_proxy(ctl, c, ns, host, CAP_AGENT_PORT, agent_path, &pin);
    pool_json_wipe(sec);
    json_decref(rec);
}

static void sandboxes_list(control_t *ctl, conn_t *c, const char *ns, const char *pool)
{
    json_t *p = pool_or_answer(ctl, c, ns, pool, NULL);
    if (!p)
        return;
    json_decref(p);
    char prefix[160];
    pool_sbx_prefix(prefix, sizeof prefix, ns, pool);
    store_kv_t *kvs;
    size_t n;
    int r = store_list(ctl->store, prefix, &kvs, &n);
    if (r < 0) {
        respond_store_err(c, r, "sandboxes", "sandboxes: not found");
        return;
    }
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < n; i++) {
        json_t *s = json_loadb(kvs[i].value, kvs[i].value_len, 0, NULL);
        if (s && !*jstr(s, "gone"))
            json_array_append_new(arr, pool_sandbox_view(s, ns, pool));
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
    size_t n = path_split(rest, seg, 5);
    sv_t m = c->req.method;
    bool get = sv_eq(m, SV("GET")), post = sv_eq(m, SV("POST")), del = sv_eq(m, SV("DELETE"));
    if (n < 1 || !sv_copy(seg[0], ns, sizeof ns) || !valid_name(ns, 63)) {
        http_not_found(c, 0, "expected /v1/pools/{namespace}[/{pool}[/sandboxes[/{id}]]]");
        return;
    }
    if (n >= 2 && (!sv_copy(seg[1], pool, sizeof pool) || !valid_name(pool, 63))) {
        http_not_found(c, 0, "no such pool");
        return;
    }
    if (n >= 3 && !sv_eq(seg[2], SV("sandboxes"))) {
        http_not_found(c, 0, "no such route (expected .../sandboxes)");
        return;
    }
    if (n >= 4 && (!sv_copy(seg[3], id, sizeof id) || !pool_sandbox_id_valid(id))) {
        http_not_found(c, 0, "no such sandbox (ids are 16 hex digits)");
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
            http_errno(c, 0, -ENOMEM, "pool");
            return;
        }
        memcpy(cx->ns, ns, strlen(ns) + 1);
        memcpy(cx->principal, pr.principal, strlen(pr.principal) + 1);
        cx->role = pr.role;
        conn_set_handler(c, &ctl_hdata_free_ops, cx);
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
        pool_alloc_arg_t *a = calloc(1, sizeof *a);
        if (!a) {
            http_errno(c, 0, -ENOMEM, "sandboxes");
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
        json_t *rec = sandbox_or_answer(ctl, c, ns, pool, id);
        if (rec) {
            conn_respond_json(c, 200, pool_sandbox_view(rec, ns, pool));
            json_decref(rec);
        }
    } else if (n == 4 && del) {
        if (!auth_check(ctl, c, ns, ROLE_WRITE, NULL))
            return;
        pool_del_arg_t *a = calloc(1, sizeof *a);
        if (!a) {
            http_errno(c, 0, -ENOMEM, "delete");
            return;
        }
        memcpy(a->ns, ns, strlen(ns) + 1);
        memcpy(a->pool, pool, strlen(pool) + 1);
        memcpy(a->id, id, strlen(id) + 1);
        work_submit(ctl, c, a->ns, 0, pool_delete_fn, a, free);
    } else {
        http_method_not_allowed(c, 0, "method not allowed");
    }
}
