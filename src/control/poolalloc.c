/* SPDX-License-Identifier: MIT */
/* Making and deleting pooled sandboxes, on worker threads (work.c): they wait on hosts that boot
 * and on their agents.
 *
 * max_hosts is exact by construction: a host is a record at slot 0..max_hosts-1, created only
 * where the slot is absent. A request reserves slots on existing hosts first (booting ones too,
 * so that concurrent requests fill a host that is starting instead of booting another), each a
 * compare-and-swap on the host record, and creates a host at the lowest free slot only when
 * every host is full; two requests that both find every host full collide on that slot, and the
 * loser packs into the winner's host. A reservation is a pending entry in the host record until
 * the agent answered and the sandboxes are recorded (pools.h: how slots are counted); the
 * reconciler drops the entries of control processes that are gone (poolsync.c). */
#include <sodium.h>
#include <stdio.h>

#include "common/log.h"
#include "pools.h"

void pool_alloc_arg_free(void *p)
{
    pool_alloc_arg_t *a = p;
    if (!a)
        return;
    free(a->body);
    free(a);
}

typedef struct {
    char key[200];
    char job[32];
    json_int_t n;
} resv_t;

typedef struct {
    worker_t *w;
    json_t *pool;
    const char *ns, *rid;
    uint64_t deadline;
    resv_t rv[POOL_HOSTS_MAX];
    size_t nr;
    json_int_t left;
    int status; /* of the refusal when nothing could be reserved (429, 409, 503) */
    char why[300];
} alloc_t;

/* Whether pool record p (r: how reading it went) is active; else a->status and a->why say why
 * not. */
static bool pool_state_active(alloc_t *a, json_t *p, int r)
{
    bool active = r == 0 && streq(jstr(p, "state"), "active");
    if (!active) {
        a->status = r == 0 || r == -ENOENT ? HTTP_CONFLICT : HTTP_UNAVAILABLE;
        (void)snprintf(a->why, sizeof a->why, "pool %s %s", jstr(a->pool, "name"),
                       r == 0 || r == -ENOENT ? "is being deleted" : "cannot be read");
    }
    return active;
}

/* The pool read again: still active (not being deleted)? */
static bool pool_active(alloc_t *a)
{
    char key[160];
    json_t *p = NULL;
    pool_key(key, sizeof key, a->ns, jstr(a->pool, "name"));
    int r = record_load(a->w->st, key, &p, NULL);
    bool active = pool_state_active(a, p, r);
    json_decref(p);
    return active;
}

/* Add k slots to this request's reservation on host h (h as read, with its _rev). */
static int reserve_on(alloc_t *a, json_t *h, json_int_t k)
{
    json_t *pend = json_object_get(h, "pending"), *mine = NULL, *p;
    size_t pi;
    json_array_foreach(pend, pi, p)
        if (streq(jstr(p, "id"), a->rid))
            mine = p;
    if (mine)
        json_object_set_new(mine, "n", json_integer(jint(mine, "n") + k));
    else
        json_array_append_new(pend, json_pack("{s:s,s:I,s:s,s:I}", "id", a->rid, "n", k, "owner",
                                              a->w->ctl->instance, "at_ms", (json_int_t)wall_ms()));
    json_t *copy = json_copy(h);
    if (!copy)
        return -ENOMEM;
    json_object_del(copy, "_key");
    json_object_del(copy, "_rev");
    int r = record_save(a->w->st, jstr(h, "_key"), copy, jint(h, "_rev"), NULL);
    json_decref(copy);
    return r;
}

static void note(alloc_t *a, const char *key, const char *job, json_int_t k)
{
    size_t j = 0;
    while (j < a->nr && !streq(a->rv[j].key, key))
        j++;
    if (j == a->nr) {
        (void)snprintf(a->rv[j].key, sizeof a->rv[j].key, "%s", key);
        (void)snprintf(a->rv[j].job, sizeof a->rv[j].job, "%s", job);
        a->rv[j].n = 0;
        a->nr++;
    }
    a->rv[j].n += k;
    a->left -= k;
}

/* One round: reserve on hosts with room; 1 when a compare-and-swap lost (read again), 0 when
 * done with the hosts there are, < 0 on a store error. *ret_nh: the pool's host records. */
static int reserve_existing(alloc_t *a, json_t *hosts, json_t *live)
{
    size_t i;
    json_t *h;
    json_array_foreach(hosts, i, h) {
        json_int_t fr = pool_host_free(h, live);
        if (a->left == 0 || !pool_host_takes(h) || fr <= 0)
            continue;
        json_int_t k = MIN(fr, a->left);
        int r = reserve_on(a, h, k);
        if (r == -ESTALE)
            return 1;
        if (r < 0)
            return r;
        note(a, jstr(h, "_key"), jstr(h, "job"), k);
    }
    return 0;
}

/* Every host is full: one more at the lowest free slot, if the pool may grow. 1: read again
 * (another request made that host), 0: made (or the pool is at max_hosts: a->why), < 0 error. */
static int reserve_new_host(alloc_t *a, json_t *hosts)
{
    const char *name = jstr(a->pool, "name");
    json_int_t per_host = jint(a->pool, "per_host"), max_hosts = jint(a->pool, "max_hosts");
    bool slot_used[POOL_HOSTS_MAX] = { false };
    size_t i;
    json_t *h;
    json_array_foreach(hosts, i, h) {
        json_int_t slot = jint(h, "slot");
        if (slot >= 0 && slot < POOL_HOSTS_MAX)
            slot_used[slot] = true;
    }
    if ((json_int_t)json_array_size(hosts) >= max_hosts) {
        a->status = HTTP_TOO_MANY_REQUESTS;
        (void)snprintf(a->why, sizeof a->why,
                       "pool %s is at max_hosts (%lld) and every host is full (%lld sandboxes "
                       "each)",
                       name, (long long)max_hosts, (long long)per_host);
        return 0;
    }
    int slot = 0;
    while (slot < max_hosts && slot_used[slot])
        slot++;
    if (slot >= max_hosts)
        return 1; /* a record appeared between the two reads */
    if (!pool_active(a))
        return 0;
    char key[200], job_id[25];
    (void)snprintf(key, sizeof key, "poolhosts/%s/%s/%03d", a->ns, name, slot);
    random_hex(job_id, 12);
    json_int_t k = MIN(per_host, a->left);
    json_t *rec = json_pack("{s:i,s:s,s:I,s:I,s:[{s:s,s:I,s:s,s:I}],s:s,s:I,s:I,s:I}", "slot", slot,
                            "job", job_id, "capacity", per_host, "live", (json_int_t)0, "pending",
                            "id", a->rid, "n", k, "owner", a->w->ctl->instance, "at_ms",
                            (json_int_t)wall_ms(), "state", "booting", "generation", (json_int_t)0,
                            "created_ms", (json_int_t)wall_ms(), "empty_since_ms", (json_int_t)0);
    int r = rec ? record_save(a->w->st, key, rec, STORE_REV_ABSENT, NULL) : -ENOMEM;
    json_decref(rec);
    if (r == -ESTALE || r == -EEXIST)
        return 1; /* another request made this host: pack into it */
    if (r < 0)
        return r;
    sbx_err_t err;
    r = pool_host_job_create(a->w->st, &a->w->ctl->seal, a->w->ctl->cfg.default_image, a->pool,
                             a->ns, job_id, &err);
    if (r < 0) {
        (void)store_del(a->w->st, key, STORE_REV_ANY);
        a->status = HTTP_UNAVAILABLE;
        (void)snprintf(a->why, sizeof a->why, "%.255s", err.msg); /* as its 256-byte buffer was */
        return 0;
    }
    log_info("pool %s/%s: host %d booting (job %s)", a->ns, name, slot, job_id);
    control_kick(a->w->ctl);
    note(a, key, job_id, k);
    return 0;
}

static void reserve(alloc_t *a)
{
    for (int attempt = 0; a->left > 0 && attempt < 400; attempt++) {
        if (monotonic_ms() > a->deadline)
            break;
        json_t *hosts = pool_hosts_load(a->w->st, a->ns, jstr(a->pool, "name"));
        /* the hosts' live counts; a listing of every record only for a host without one */
        json_t *live = !hosts ? NULL
                       : pool_hosts_counted(hosts)
                           ? json_object()
                           : pool_live_counts(a->w->st, a->ns, jstr(a->pool, "name"));
        if (!live) {
            json_decref(hosts);
            a->status = HTTP_UNAVAILABLE;
            (void)snprintf(a->why, sizeof a->why, "the pool's hosts cannot be read");
            return;
        }
        if (pool_race_window_ms())
            pool_msleep(pool_race_window_ms());
        int r = reserve_existing(a, hosts, live);
        if (r == 0 && a->left > 0 && a->nr < POOL_HOSTS_MAX)
            r = reserve_new_host(a, hosts);
        json_decref(hosts);
        json_decref(live);
        if (r < 0) {
            a->status = HTTP_UNAVAILABLE;
            (void)snprintf(a->why, sizeof a->why, "the store: %s", strerror(-r));
            return;
        }
        if (r == 0 && (a->why[0] || a->nr == POOL_HOSTS_MAX))
            return;
    }
    if (a->left > 0 && !a->why[0]) {
        a->status = HTTP_UNAVAILABLE;
        (void)snprintf(a->why, sizeof a->why, "too much contention on the pool's hosts");
    }
}

/* Wait until the host's run serves (or its job ends). 0 with *rr, or -errno with err. */
static int host_wait_running(alloc_t *a, const char *job, runrec_t *rr, sbx_err_t *err)
{
    unsigned pause = 20;
    for (;;) {
        if (runrec_load(a->w->st, job, rr, NULL) == 0 && rr->state == RR_RUNNING)
            return 0;
        json_t *j;
        int r = job_load(a->w->st, a->ns, job, &j, NULL);
        if (r == -ENOENT)
            return sbx_err(err, -ENOENT, "pool host %s is gone", job);
        job_stage_t st = STAGE_SCHEDULING;
        if (r == 0 && job_stage_of(j, &st) == 0 && job_stage_ended(st)) {
            (void)sbx_err(err, -ESRCH, "pool host %s ended (%s): %s", job, jstr(j, "stage"),
                          jstr(j, "message"));
            json_decref(j);
            return -ESRCH;
        }
        if (monotonic_ms() > a->deadline || a->w->ctl->stopping) {
            (void)sbx_err(err, -ETIMEDOUT, "pool host %s did not start in time%s%s", job,
                          r == 0 && *jstr(j, "message") ? ": " : "",
                          r == 0 ? jstr(j, "message") : "");
            json_decref(j);
            return -ETIMEDOUT;
        }
        json_decref(j);
        pool_msleep(pause);
        pause = MIN(pause * 2, 200u);
    }
}

static int mark_ready_edit(json_t *h, void *arg)
{
    const uint64_t *gen = arg;
    if (!streq(jstr(h, "state"), "booting"))
        return 1; /* ready already: a generation change is the reconciler's to handle */
    json_object_set_new(h, "state", json_string("ready"));
    json_object_set_new(h, "generation", json_integer((json_int_t)*gen));
    return 0;
}

/* Record the sandboxes the agent made on rv's host in one transaction (pool_host_txn): each
 * one's record and its sealed token (both create-only), the host's live count up by as many, and
 * this request's reservation there dropped, so that each is counted once at every moment. Their
 * views (with tokens) go to out. Returns how many were recorded: every valid one, or none (a
 * store failure: their host deletes them as orphans, and the reservation is settled after). */
static int record_sandboxes(alloc_t *a, const resv_t *rv, const runrec_t *rr, json_t *list,
                            json_t *out, bool *ret_settled)
{
    const char *name = jstr(a->pool, "name");
    size_t n = json_array_size(list), k = 0, i;
    _cleanup_free_ store_op_t *ops = calloc(2 * n + 1, sizeof *ops);
    _cleanup_free_ char(*keys)[200] = calloc(2 * n + 1, sizeof *keys);
    _cleanup_free_ char **vals = calloc(2 * n + 1, sizeof *vals);
    json_t *views = json_array(), *s;
    int r = ops && keys && vals && views ? 0 : -ENOMEM;
    json_array_foreach(list, i, s) {
        const char *id = jstr(s, "id"), *tok = jstr(s, "token");
        if (r < 0)
            break;
        if (!pool_sandbox_id_valid(id) || !*tok) {
            log_warn("pool %s/%s: sandbox %s not recorded (a bad id or no token): its host "
                     "deletes it",
                     a->ns, name, id);
            continue;
        }
        char *key = keys[2 * k], *tkey = keys[2 * k + 1];
        pool_sbx_key(key, sizeof keys[0], a->ns, name, id);
        pool_token_key(tkey, sizeof keys[0], a->ns, name, id);
        /* deep copies: the agent's answer (its tokens) is wiped afterwards */
        /* host_key: a delete reads that one host record instead of finding the job's among
         * all of the pool's (pool_host_txn checks it still holds the job) */
        json_t *rec = json_pack("{s:s,s:s,s:s,s:s,s:s,s:I,s:o,s:o,s:o,s:o,s:I,s:s}", "id", id,
                                "pool", name, "namespace", a->ns, "host", rv->job, "host_key",
                                rv->key, "generation", (json_int_t)rr->run.generation, "uid",
                                json_deep_copy(json_object_get(s, "uid")), "home",
                                json_deep_copy(json_object_get(s, "home")), "confinement",
                                json_deep_copy(json_object_get(s, "confinement")), "limits",
                                json_deep_copy(json_object_get(s, "limits")), "created_ms",
                                (json_int_t)wall_ms(), "gone", "");
        json_t *sec = json_pack("{s:s}", "token", tok);
        char *pt = sec ? json_dumps(sec, JSON_COMPACT) : NULL;
        pool_json_wipe(sec);
        vals[2 * k] =
            rec ? json_dumps(rec, JSON_COMPACT | JSON_SORT_KEYS) : NULL; /* as record_save */
        r = pt ? seal_value(&a->w->ctl->seal, tkey, pt, strlen(pt), &vals[2 * k + 1]) : -ENOMEM;
        if (pt) {
            sodium_memzero(pt, strlen(pt));
            free(pt);
        }
        if (r >= 0 && (!rec || !vals[2 * k]))
            r = -ENOMEM;
        if (r >= 0) {
            ops[2 * k] = (store_op_t){ key, vals[2 * k], strlen(vals[2 * k]), STORE_REV_ABSENT };
            ops[2 * k + 1] =
                (store_op_t){ tkey, vals[2 * k + 1], strlen(vals[2 * k + 1]), STORE_REV_ABSENT };
            json_t *v = pool_sandbox_view(rec, a->ns, name);
            json_object_set_new(v, "token", json_string(tok));
            json_array_append_new(views, v);
            k++;
        }
        json_decref(rec);
    }
    if (r >= 0 && k > 0)
        r = pool_host_txn(a->w->st, a->ns, name, rv->key, rv->job, (json_int_t)k, a->rid, ops,
                          2 * k, NULL);
    for (size_t j = 0; vals && j < 2 * n + 1; j++)
        free(vals[j]);
    if (r < 0 || k == 0) {
        if (r < 0)
            log_warn("pool %s/%s: %zu sandboxes of host %s not recorded (%s): their host deletes "
                     "them",
                     a->ns, name, k, rv->job, strerror(-r));
        pool_json_wipe(views);
        return 0;
    }
    *ret_settled = true;
    json_array_extend(out, views);
    json_decref(views);
    return (int)k;
}

/* Ask the host's agent for rv->n sandboxes and record them (their views, with tokens, go to
 * out). Returns how many were made (which a store failure can leave below what the agent made),
 * or -errno with err when the host never served or its agent made none; *ret_rejected: how
 * many of rv->n the agent had no room for. */
static int fulfil(alloc_t *a, const resv_t *rv, json_t *req, json_t *out, json_int_t *ret_rejected,
                  bool *ret_settled, sbx_err_t *err)
{
    runrec_t rr;
    int r = host_wait_running(a, rv->job, &rr, err);
    if (r < 0)
        return r;
    uint64_t gen = rr.run.generation;
    (void)pool_host_edit(a->w->st, rv->key, rv->job, mark_ready_edit, &gen);
    char token[80];
    if ((r = pool_host_token(a->w->st, &a->w->ctl->seal, rv->job, token, sizeof token)) < 0 ||
        (r = worker_keys(a->w)) < 0)
        return sbx_err(err, r, "pool host %s: its token cannot be read", rv->job);
    json_t *body = json_deep_copy(req), *ans = NULL;
    json_object_set_new(body, "count", json_integer(rv->n));
    sbx_err_t aerr = { 0 };
    int status = 0;
    r = -EAGAIN;
    /* Only what surely did not run is tried again: no connection (the agent is not listening
     * yet right after its run is installed), or the node's 503 (not ready). */
    for (int attempt = 0; attempt < 50 && !a->w->ctl->stopping; attempt++) {
        pool_json_wipe(ans);
        ans = NULL;
        r = agent_call(a->w->ctl, a->w->st, &a->w->kr, &rr, "POST", "/v1/sandboxes", token, body,
                       POOL_AGENT_CALL_MS, &status, &ans, &aerr);
        bool again = (r == -ECONNREFUSED || r == -ENOENT) || (r == 0 && status == HTTP_UNAVAILABLE);
        if (!again || monotonic_ms() > a->deadline)
            break;
        pool_msleep(100);
        if (runrec_load(a->w->st, rv->job, &rr, NULL) < 0 || rr.state != RR_RUNNING ||
            rr.run.generation != gen)
            break;
    }
    json_decref(body);
    sodium_memzero(token, sizeof token);
    if (r < 0 || status != 200) {
        pool_json_wipe(ans);
        return sbx_err(err, r < 0 ? r : -EIO, "pool host %s: %.255s", /* as the 256-byte msg was */
                       rv->job,
                       aerr.msg[0] ? aerr.msg
                       : r < 0     ? strerror(-r)
                                   : "the agent refused");
    }
    crash_point("pool:made");
    int made = 0;
    json_t *list = json_object_get(ans, "sandboxes");
    if (pool_active(a))
        made = record_sandboxes(a, rv, &rr, list, out, ret_settled);
    else if (json_array_size(list) > 0)
        log_warn("pool %s/%s: %zu sandboxes not recorded (pool draining): their host deletes them",
                 a->ns, jstr(a->pool, "name"), json_array_size(list));
    json_int_t rejected = jint(ans, "rejected");
    *ret_rejected = rejected > 0 ? rejected : 0;
    pool_json_wipe(ans);
    return made;
}

static const char *alloc_request(json_t *b, json_t *pool, json_int_t *ret_count, json_t **ret_req)
{
    json_int_t count = 1, max_procs = -1, max_mem = -1, idle = -1;
    json_t *env = NULL;
    if (!json_is_object(b) ||
        json_unpack(b, "{s?I,s?o,s?I,s?I,s?I!}", "count", &count, "env", &env, "max_procs",
                    &max_procs, "max_mem_mb", &max_mem, "idle_timeout_secs", &idle) < 0)
        return "expected {count, env, max_procs, max_mem_mb, idle_timeout_secs} (unknown "
               "fields are refused)";
    const char *e = NULL;
    if (count < 1 || count > POOL_COUNT_MAX)
        return "count: 1..1000 sandboxes per request";
    if ((e = check_env(env, "env: names [A-Za-z_][A-Za-z0-9_]*, string values")))
        return e;
    if (max_procs != -1 && (max_procs < 1 || max_procs > 4096))
        return "max_procs: 1..4096";
    if (max_mem != -1 && (max_mem < 1 || max_mem > 1048576))
        return "max_mem_mb: 1..1048576";
    if (idle != -1 && (idle < 0 || idle > 31536000))
        return "idle_timeout_secs: 0 (never) ..31536000";
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
    *ret_count = count;
    *ret_req = req;
    return NULL;
}

void pool_alloc_fn(worker_t *w, void *arg, work_result_t *res)
{
    pool_alloc_arg_t *in = arg;
    char key[160];
    json_t *pool;
    pool_key(key, sizeof key, in->ns, in->pool);
    int r = record_load(w->st, key, &pool, NULL);
    if (r < 0) {
        if (r == -ENOENT)
            work_fail(res, HTTP_NOT_FOUND, 0, "no pool %s in namespace %s", in->pool, in->ns);
        else
            work_fail(res, HTTP_UNAVAILABLE, 0, "the control plane cannot read its store");
        return;
    }
    json_error_t jerr;
    json_t *b = json_loadb(in->body ? in->body : "", in->body_len, 0, &jerr), *req = NULL;
    json_int_t count = 0;
    const char *e = b ? alloc_request(b, pool, &count, &req) : jerr.text;
    json_decref(b);
    if (e) {
        work_fail(res, HTTP_BAD_REQUEST, 0, "sandboxes: %s", e);
        json_decref(pool);
        return;
    }
    char rid[17];
    random_hex(rid, 8);
    alloc_t a = { .w = w,
                  .pool = pool,
                  .ns = in->ns,
                  .rid = rid,
                  .deadline = monotonic_ms() + POOL_ALLOC_MAX_MS,
                  .left = count };
    if (pool_state_active(&a, pool, 0)) /* as just read */
        reserve(&a);
    if (a.nr == 0) {
        work_answer(res, a.status ? a.status : HTTP_UNAVAILABLE,
                    json_pack("{s:s,s:I,s:s}", "error", a.why, "rejected", count, "reason", a.why));
        if (res->status == HTTP_UNAVAILABLE)
            (void)snprintf(res->headers, sizeof res->headers, "Retry-After: 1\r\n");
        json_decref(req);
        json_decref(pool);
        return;
    }
    crash_point("pool:reserved");
    json_t *out = json_array();
    json_int_t made = 0;
    bool all_room = true;
    char why2[300] = "";
    for (size_t i = 0; i < a.nr; i++) {
        sbx_err_t err;
        json_int_t rej = 0;
        bool settled = false; /* with the sandboxes' records (record_sandboxes) */
        int got = fulfil(&a, &a.rv[i], req, out, &rej, &settled, &err);
        /* none recorded: the reservation goes (a failure here is dropped by the reconciler with
         * the rest of a stale reservation) */
        if (!settled && pool_host_settle(w->st, a.rv[i].key, a.rv[i].job, rid) < 0)
            log_warn("pool %s/%s: reservation %s on %s not settled (dropped later)", in->ns,
                     in->pool, rid, a.rv[i].key);
        /* a host that failed leaves no room; one whose agent had no room for all says so */
        made += MAX(got, 0);
        all_room = all_room && got >= 0 && (got == a.rv[i].n || rej > 0);
        if (!why2[0] && got < 0)
            (void)snprintf(why2, sizeof why2, "%.*s", (int)sizeof why2 - 1, err.msg);
        else if (!why2[0] && rej > 0)
            (void)snprintf(why2, sizeof why2, "pool host %s had room for %lld of %lld", a.rv[i].job,
                           (long long)(a.rv[i].n - rej), (long long)a.rv[i].n);
    }
    json_decref(req);
    json_decref(pool);
    json_int_t rejected = count - made;
    const char *reason = a.why[0] ? a.why : why2;
    if (made == 0) {
        /* no room anywhere is 429 (try later or raise max_hosts); a host that failed is 503 */
        int status = all_room ? HTTP_TOO_MANY_REQUESTS : HTTP_UNAVAILABLE;
        work_answer(
            res, status,
            json_pack("{s:s,s:I,s:s}", "error", reason, "rejected", count, "reason", reason));
        if (status == HTTP_UNAVAILABLE)
            (void)snprintf(res->headers, sizeof res->headers, "Retry-After: 1\r\n");
        pool_json_wipe(out);
        return;
    }
    json_t *ans = json_pack("{s:o,s:I}", "sandboxes", out, "rejected", rejected);
    if (rejected > 0)
        json_object_set_new(ans, "reason", json_string(reason));
    log_info("pool %s/%s: %lld sandboxes made, %lld rejected", in->ns, in->pool, (long long)made,
             (long long)rejected);
    work_answer(res, 200, ans);
}

/* ---- deleting one sandbox ------------------------------------------------------------------------ */

void pool_delete_fn(worker_t *w, void *arg, work_result_t *res)
{
    pool_del_arg_t *a = arg;
    char key[200], tkey[200];
    sbx_err_t err = { 0 };
    json_t *rec;
    int64_t rev;
    pool_sbx_key(key, sizeof key, a->ns, a->pool, a->id);
    pool_token_key(tkey, sizeof tkey, a->ns, a->pool, a->id);
    int r = record_load(w->st, key, &rec, &rev);
    if (r < 0) {
        if (r == -ENOENT)
            work_fail(res, HTTP_NOT_FOUND, 0, "no sandbox %s in pool %s", a->id, a->pool);
        else
            work_fail(res, HTTP_UNAVAILABLE, 0, "the control plane cannot read its store");
        return;
    }
    bool gone = *jstr(rec, "gone");
    if (!gone) {
        /* torn down on its host, or proven gone with its host's run */
        runrec_t rr;
        int lr = runrec_load(w->st, jstr(rec, "host"), &rr, NULL);
        bool same_run = lr == 0 && rr.run.generation == (uint64_t)jint(rec, "generation");
        if (lr < 0 && lr != -ENOENT) {
            work_fail(res, HTTP_UNAVAILABLE, 0, "the control plane cannot read its store");
            json_decref(rec);
            return;
        }
        if (same_run && rr.state == RR_RUNNING) {
            json_t *sec = NULL;
            int status = 0;
            r = sealed_get(w->st, &w->ctl->seal, tkey, &sec);
            if (r >= 0)
                r = worker_keys(w);
            if (r >= 0) {
                char path[64];
                (void)snprintf(path, sizeof path, "/v1/sandboxes/%s", a->id);
                r = agent_call(w->ctl, w->st, &w->kr, &rr, "DELETE", path, jstr(sec, "token"), NULL,
                               POOL_AGENT_CALL_MS, &status, NULL, &err);
            }
            pool_json_wipe(sec);
            /* 200: deleted; 403: the agent has no such sandbox (its idle timeout took it) */
            if (r < 0 || (status != HTTP_OK && status != HTTP_FORBIDDEN)) {
                work_fail(res, r < 0 ? HTTP_UNAVAILABLE : HTTP_BAD_GATEWAY, 0,
                          "sandbox %s was not deleted on its host: %s", a->id,
                          err.msg[0] ? err.msg : strerror(r < 0 ? -r : EIO));
                json_decref(rec);
                return;
            }
        }
        /* any other state: the agent that had it is not running, and no later run has it */
    }
    /* The record goes by compare-and-swap (of two deletes, one answers 404), with its token
     * and, for one that was live, its host's live count, in one transaction. */
    store_op_t ops[3] = { { .key = key, .expect_rev = rev },
                          { .key = tkey, .expect_rev = STORE_REV_ANY } };
    size_t failed = SIZE_MAX;
    r = gone ? store_txn(w->st, ops, 2, NULL, &failed)
             : pool_host_txn(w->st, a->ns, a->pool, pool_sandbox_host_key(rec), jstr(rec, "host"),
                             -1, NULL, ops, 2, &failed);
    json_decref(rec);
    if ((r == -ESTALE && failed == 0) || r == -ENOENT) {
        work_fail(res, HTTP_NOT_FOUND, 0, "no sandbox %s in pool %s (deleted meanwhile)", a->id,
                  a->pool);
        return;
    }
    if (r < 0) {
        work_fail(res, HTTP_UNAVAILABLE, 0, "the control plane cannot write its store");
        return;
    }
    log_info("pool %s/%s: sandbox %s deleted", a->ns, a->pool, a->id);
    work_answer(res, 200, json_pack("{s:s,s:b}", "id", a->id, "deleted", true));
}
