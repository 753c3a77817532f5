/* SPDX-License-Identifier: MIT */
/* E2B templates that are pools (e2b.h): Sandbox.create("<pool>") makes one pooled sandbox in
 * the caller's namespace's pool of that name, in about the time a pool host's agent takes to
 * make a user and a home, instead of a run's start. What E2B's API says of it comes from three
 * records: the index e2bpool/<id> (namespace, pool, metadata, created, timeout), the pool's
 * sandbox record (its host and generation: gone when the host ended) and its sealed token.
 *
 * Where a pooled sandbox differs from a dedicated one (docs/e2b.md): `timeout` is its idle
 * timeout (the pool host ends it after that long without a request), it cannot pause, and its
 * network is its pool host's (a namespace of its own, loopback only). */
#include <sodium.h>
#include <stdio.h>

#include "common/log.h"
#include "e2b.h"
#include "pools.h"

#define INDEX_PREFIX "e2bpool/"

bool e2b_pooled_id(const char *id) { return pool_sandbox_id_valid(id); }

static void index_key(char *out, size_t cap, const char *id)
{
    (void)snprintf(out, cap, INDEX_PREFIX "%s", id);
}

int e2b_pool_exists(store_t *st, const char *ns, const char *name)
{
    char key[160];
    store_kv_t kv;
    if (!valid_name(name, 63))
        return 0;
    pool_key(key, sizeof key, ns, name);
    int r = store_get(st, key, &kv);
    if (r == -ENOENT)
        return 0;
    if (r < 0)
        return r;
    store_kv_clear(&kv);
    return 1;
}

/* The message of a pool API answer (its "error", or "reason"). */
static const char *answer_why(json_t *j)
{
    const char *e = json_string_value(json_object_get(j, "error"));
    return e ? e : json_string_value(json_object_get(j, "reason")) ?: "(no reason given)";
}

void e2b_pool_create(worker_t *w, const char *ns, const char *pool, json_t *b, work_result_t *res)
{
    json_t *meta = json_object_get(b, "metadata"), *env = json_object_get(b, "envVars");
    json_int_t timeout = E2B_DEFAULT_TIMEOUT_S;
    if (json_object_get(b, "timeout") && json_unpack(b, "{s:I}", "timeout", &timeout) < 0)
        timeout = -1;
    if (timeout < 1 || timeout > 7 * 86400) {
        work_fail(res, HTTP_BAD_REQUEST, HTTP_BODY_CODE, "create: timeout: 1..604800 seconds");
        return;
    }
    const char *k;
    json_t *v;
    if (meta && !json_is_object(meta)) {
        work_fail(res, HTTP_BAD_REQUEST, HTTP_BODY_CODE, "create: metadata: an object of strings");
        return;
    }
    json_object_foreach(meta, k, v) {
        if (!json_is_string(v) || strlen(k) > 54 || json_string_length(v) > 512) {
            work_fail(res, HTTP_BAD_REQUEST, HTTP_BODY_CODE,
                      "create: metadata: string values, keys of at most 54 bytes");
            return;
        }
    }
    /* one sandbox through the pools service itself: its packing, its limits, its records */
    json_t *req = json_pack("{s:i,s:I}", "count", 1, "idle_timeout_secs", timeout);
    if (req && env)
        json_object_set(req, "env", env);
    pool_alloc_arg_t in = { 0 };
    (void)snprintf(in.ns, sizeof in.ns, "%s", ns);
    (void)snprintf(in.pool, sizeof in.pool, "%s", pool);
    in.body = req ? json_dumps(req, JSON_COMPACT) : NULL;
    in.body_len = in.body ? strlen(in.body) : 0;
    json_decref(req);
    if (!in.body) {
        work_fail(res, HTTP_INTERNAL_ERROR, HTTP_BODY_CODE, "create: out of memory");
        return;
    }
    work_result_t made = { 0 };
    pool_alloc_fn(w, &in, &made);
    free(in.body);
    json_t *s = json_array_get(json_object_get(made.json, "sandboxes"), 0);
    if (made.status != 200 || !s) {
        /* the pool's own refusal: 400 (bad env), 429 (at max_hosts), 503 (try again) */
        int status = made.status == HTTP_OK ? HTTP_UNAVAILABLE : made.status;
        work_fail(res, status, HTTP_BODY_CODE, "create in pool %s: %s", pool,
                  answer_why(made.json));
        if (status == HTTP_UNAVAILABLE || status == HTTP_TOO_MANY_REQUESTS)
            (void)snprintf(res->headers, sizeof res->headers, "Retry-After: 1\r\n");
        pool_json_wipe(made.json);
        return;
    }
    const char *id = json_string_value(json_object_get(s, "id"));
    const char *tok = json_string_value(json_object_get(s, "token"));
    char key[96];
    index_key(key, sizeof key, id ? id : "");
    json_t *rec = json_pack("{s:s,s:s,s:s,s:o,s:I,s:I}", "id", id ? id : "", "ns", ns, "pool", pool,
                            "metadata", meta ? json_incref(meta) : json_object(), "created_ms",
                            (json_int_t)wall_ms(), "timeout", timeout);
    int r = id && tok && rec ? record_save(w->st, key, rec, STORE_REV_ABSENT, NULL) : -ENOMEM;
    json_decref(rec);
    if (r < 0) {
        /* not findable by E2B's API: it must not live on unseen */
        pool_del_arg_t del = { 0 };
        (void)snprintf(del.ns, sizeof del.ns, "%s", ns);
        (void)snprintf(del.pool, sizeof del.pool, "%s", pool);
        (void)snprintf(del.id, sizeof del.id, "%s", id ? id : "");
        work_result_t gone = { 0 };
        pool_delete_fn(w, &del, &gone);
        json_decref(gone.json);
        work_fail(res, HTTP_UNAVAILABLE, HTTP_BODY_CODE,
                  "create: the control plane cannot write its store");
        pool_json_wipe(made.json);
        return;
    }
    log_info("e2b: pooled sandbox %s/%s in pool %s", ns, id, pool);
    work_answer(res, 201, e2b_sandbox_json(w->ctl, id, pool, tok));
    pool_json_wipe(made.json);
}

/* The index record of id in ns, and its pool sandbox record: 0; -ESRCH when there is none (or
 * it is another namespace's, or gone); another -errno on a store error. */
static int load(store_t *st, const char *ns, const char *id, json_t **ret_index, json_t **ret_rec)
{
    char key[200];
    json_t *ix = NULL, *rec = NULL;
    index_key(key, sizeof key, id);
    int r = e2b_pooled_id(id) ? record_load(st, key, &ix, NULL) : -ENOENT;
    if (r >= 0 && ns && !streq(jstr(ix, "ns"), ns))
        r = -ENOENT;
    if (r >= 0) {
        pool_sbx_key(key, sizeof key, jstr(ix, "ns"), jstr(ix, "pool"), id);
        r = record_load(st, key, &rec, NULL);
    }
    if (r >= 0 && *jstr(rec, "gone"))
        r = -ENOENT;
    if (r < 0) {
        json_decref(ix);
        json_decref(rec);
        return r == -ENOENT ? -ESRCH : r;
    }
    *ret_index = ix;
    if (ret_rec)
        *ret_rec = rec;
    else
        json_decref(rec);
    return 0;
}

static json_t *listed(control_t *ctl, json_t *ix, bool detail)
{
    int64_t created = jint(ix, "created_ms");
    e2b_listed_t l = { .id = jstr(ix, "id"),
                       .tpl = jstr(ix, "pool"),
                       .state = "running",
                       .started_ms = created,
                       .end_ms = created + jint(ix, "timeout") * 1000,
                       .cpus = 1 };
    json_t *meta = json_object_get(ix, "metadata");
    return e2b_listed_json(ctl, &l, json_is_object(meta) ? json_incref(meta) : NULL, detail);
}

int e2b_pool_list(control_t *ctl, const char *ns, const char *after, const char *meta,
                  const char *states, json_t *out)
{
    store_kv_t *kvs;
    size_t n;
    int r = store_list(ctl->store, INDEX_PREFIX, &kvs, &n);
    if (r < 0)
        return r;
    for (size_t i = 0; i < n; i++) {
        json_t *ix = json_loadb(kvs[i].value, kvs[i].value_len, 0, NULL), *rec = NULL;
        const char *id = jstr(ix, "id");
        if (ix && streq(jstr(ix, "ns"), ns) && (!after[0] || strcmp(id, after) > 0)) {
            char key[200];
            pool_sbx_key(key, sizeof key, ns, jstr(ix, "pool"), id);
            bool live = record_load(ctl->store, key, &rec, NULL) == 0 && !*jstr(rec, "gone");
            if (e2b_list_match(live ? "running" : NULL, json_object_get(ix, "metadata"), meta,
                               states))
                json_array_append_new(out, listed(ctl, ix, false));
        }
        json_decref(rec);
        json_decref(ix);
    }
    store_kv_free(kvs, n);
    return 0;
}

void e2b_pool_detail(control_t *ctl, conn_t *c, const char *ns, const char *id)
{
    json_t *ix;
    int r = load(ctl->store, ns, id, &ix, NULL);
    if (r < 0) {
        int status = r == -ESRCH ? HTTP_NOT_FOUND : HTTP_UNAVAILABLE;
        conn_respond_json(c, status,
                          json_pack("{s:i,s:s}", "code", status, "message",
                                    r == -ESRCH ? "sandbox not found"
                                                : "the control plane cannot read its store"));
        return;
    }
    conn_respond_json(c, 200, listed(ctl, ix, true));
    json_decref(ix);
}

/* A worker's index record of a->id in a->ns, or NULL with res answered (404 or 503). */
static json_t *load_or_fail(worker_t *w, const e2b_pool_arg_t *a, work_result_t *res)
{
    json_t *ix;
    int r = load(w->st, a->ns, a->id, &ix, NULL);
    if (r == -ESRCH)
        work_fail(res, HTTP_NOT_FOUND, HTTP_BODY_CODE, "sandbox %s not found", a->id);
    else if (r < 0)
        work_fail(res, HTTP_UNAVAILABLE, HTTP_BODY_CODE, "the control plane cannot read its store");
    return r < 0 ? NULL : ix;
}

void e2b_pool_kill_fn(worker_t *w, void *arg, work_result_t *res)
{
    e2b_pool_arg_t *a = arg;
    json_t *ix = load_or_fail(w, a, res);
    if (!ix)
        return;
    pool_del_arg_t del = { 0 };
    (void)snprintf(del.ns, sizeof del.ns, "%s", a->ns);
    (void)snprintf(del.pool, sizeof del.pool, "%s", jstr(ix, "pool"));
    (void)snprintf(del.id, sizeof del.id, "%.16s", a->id);
    json_decref(ix);
    work_result_t done = { 0 };
    pool_delete_fn(w, &del, &done);
    if (done.status != HTTP_OK && done.status != HTTP_NOT_FOUND) {
        work_fail(res, done.status, HTTP_BODY_CODE, "kill: %s", answer_why(done.json));
        json_decref(done.json);
        return;
    }
    json_decref(done.json);
    char key[96];
    index_key(key, sizeof key, a->id);
    (void)store_del(w->st, key, STORE_REV_ANY);
    log_info("e2b: pooled sandbox %s/%s killed", a->ns, a->id);
    if (done.status == HTTP_OK)
        work_answer(res, HTTP_NO_CONTENT, NULL);
    else
        work_fail(res, HTTP_NOT_FOUND, HTTP_BODY_CODE, "sandbox not found");
}

void e2b_pool_connect_fn(worker_t *w, void *arg, work_result_t *res)
{
    e2b_pool_arg_t *a = arg;
    json_t *ix = load_or_fail(w, a, res);
    if (!ix)
        return;
    char tkey[200];
    json_t *sec = NULL;
    pool_token_key(tkey, sizeof tkey, a->ns, jstr(ix, "pool"), a->id);
    int r = sealed_get(w->st, &w->ctl->seal, tkey, &sec);
    if (r < 0)
        work_fail(res, r == -ENOENT ? HTTP_NOT_FOUND : HTTP_UNAVAILABLE, HTTP_BODY_CODE,
                  "sandbox %s: its token cannot be read", a->id);
    else
        work_answer(res, 200,
                    e2b_sandbox_json(w->ctl, a->id, jstr(ix, "pool"), jstr(sec, "token")));
    pool_json_wipe(sec);
    json_decref(ix);
}

int e2b_pool_target(store_t *st, const seal_keys_t *seal, const char *id, e2b_pool_target_t *ret)
{
    json_t *ix, *rec, *sec = NULL;
    int r = load(st, NULL, id, &ix, &rec);
    if (r < 0)
        return r;
    char tkey[200];
    pool_token_key(tkey, sizeof tkey, jstr(ix, "ns"), jstr(ix, "pool"), id);
    r = sealed_get(st, seal, tkey, &sec);
    const char *tok = jstr(sec, "token");
    if (r >= 0 &&
        (strlen(tok) >= sizeof ret->token || strlen(jstr(rec, "host")) >= sizeof ret->host))
        r = -EBADMSG;
    if (r >= 0) {
        *ret = (e2b_pool_target_t){ .generation = (uint64_t)jint(rec, "generation") };
        (void)snprintf(ret->ns, sizeof ret->ns, "%s", jstr(ix, "ns"));
        (void)snprintf(ret->host, sizeof ret->host, "%s", jstr(rec, "host"));
        memcpy(ret->token, tok, strlen(tok) + 1);
    }
    pool_json_wipe(sec);
    json_decref(ix);
    json_decref(rec);
    return r == -ENOENT ? -ESRCH : r;
}
