/* SPDX-License-Identifier: MIT */
/* The reconciler: makes each job's runs match what was asked for (desired running / paused /
 * canceled, move_to), one job at a time, with blocking calls to nodes on its own thread.
 *
 * A new generation is claimed in the store before any node hears of it: the run record is
 * replaced by compare-and-swap against the version that was read, so of two control processes
 * racing to start generation N+1 exactly one wins, and only the winner calls a node. The new
 * run is installed with a management capability naming exactly that run; a paused run's root
 * travels with it (same node: kept in place; other node: fetched from the old node with a
 * capability for the old run). The old run is retired on its node only after the new one runs. */
#include <sodium.h>
#include <stdio.h>
#include <time.h>

#include "common/httpc.h"
#include "common/log.h"
#include "control.h"

/* A failed install is tried again after a backoff, for up to INSTALL_GIVE_UP_MS; a record whose
 * attempts reach INSTALL_ATTEMPTS_FINAL is not tried again (the job is in ERROR). */
#define INSTALL_BACKOFF_MIN_MS 500
#define INSTALL_BACKOFF_MAX_MS 30000
#define INSTALL_GIVE_UP_MS (10 * 60 * 1000)
#define INSTALL_ATTEMPTS_FINAL 1000000

typedef struct {
    control_t *ctl;
    store_t *st;
    keyring_t kr;
    pool_syncs_t pool_syncs;
} rec_t;

typedef struct {
    char name[CAP_ID_MAX];
    char host[64];
    uint16_t port;
    int64_t capacity, load;
    int64_t disk_room_mb; /* what its last heartbeat said its disk can take; INT64_MAX: unknown */
    bool live;
    bool has_image; /* reports the job's image */
} node_info_t;

/* ---- node calls ------------------------------------------------------------------------------ */

/* Bounds on a node's answer: a stuck node must not hold every job's lifecycle for long. An
 * install that fetches a moved root may take a while; everything else answers quickly. */
#define NODE_CALL_MS 30000
#define NODE_INSTALL_MS 60000
#define NODE_RESTORE_MS 600000

/* 0 with the node's answer's status, or -errno with err. Like agent_call, err also carries the
 * node's reason (its answer's "error", code -EIO) when it answers 300 or more. */
static int node_call(rec_t *rc, const char *host, uint16_t port, const cap_run_t *run,
                     const char *method, const char *suffix, json_t *body, int *ret_status,
                     sbx_err_t *err)
{
    char target[160];
    (void)snprintf(target, sizeof target, "/v1/runs/%s%s", run->sandbox, suffix);
    char *b = body ? json_dumps(body, JSON_COMPACT) : NULL;
    const char *mode = json_string_value(json_object_get(json_object_get(body, "restore"), "mode"));
    /* single-use, for exactly this method, target and body */
    node_req_t q = {
        .host = host,
        .port = port,
        .run = run,
        .access = CAP_MANAGE,
        .method = method,
        .target = target,
        .body = b,
        .body_len = b ? strlen(b) : 0,
        .bind_body = true,
        .timeout_ms = !body                           ? NODE_CALL_MS
                      : mode && streq(mode, "remote") ? NODE_RESTORE_MS
                                                      : NODE_INSTALL_MS,
    };
    httpc_response_t resp = { 0 };
    int r = node_request(rc->ctl, rc->st, &rc->kr, &q, &resp, err);
    if (b) {
        sodium_memzero(b, strlen(b)); /* held the secrets */
        free(b);
    }
    if (r < 0)
        return r;
    *ret_status = resp.status;
    json_t *j = json_loadb(resp.body ? resp.body : "", resp.body_len, 0, NULL);
    const char *e = json_string_value(json_object_get(j, "error"));
    if (resp.status >= 300)
        (void)sbx_err(err, -EIO, "%s", e ? e : "");
    json_decref(j);
    httpc_response_free(&resp);
    return 0;
}

/* ---- records --------------------------------------------------------------------------------- */

typedef struct {
    bool set_stage;
    job_stage_t stage;
    const char *message;
    bool set_run;
    uint64_t generation;
    const char *node;
    bool clear_move, started;
} job_patch_t;

static void job_patch(rec_t *rc, const char *ns, const char *id, const job_patch_t *p)
{
    for (int i = 0; i < 8; i++) {
        json_t *job;
        int64_t rev;
        if (job_load(rc->st, ns, id, &job, &rev) < 0)
            return;
        if (p->set_stage)
            job_set_stage(job, p->stage);
        if (p->message)
            json_object_set_new(job, "message", json_string(p->message));
        if (p->set_run) {
            json_object_set_new(job, "generation", json_integer((json_int_t)p->generation));
            json_object_set_new(job, "node", json_string(p->node));
        }
        if (p->clear_move)
            json_object_set_new(job, "move_to", json_string(""));
        if (p->started && !json_object_get(job, "started_ms"))
            json_object_set_new(job, "started_ms", json_integer(wall_ms()));
        int r = job_save(rc->st, ns, id, job, rev, NULL);
        json_decref(job);
        if (r != -ESTALE)
            return;
    }
}

static size_t load_nodes(rec_t *rc, node_info_t *out, size_t max, const char *image)
{
    store_kv_t *kvs;
    size_t n, k = 0;
    if (store_list(rc->st, "nodes/", &kvs, &n) < 0)
        return 0;
    int64_t now = wall_ms();
    for (size_t i = 0; i < n && k < max; i++) {
        json_t *j = json_loadb(kvs[i].value, kvs[i].value_len, 0, NULL);
        const char *name, *host;
        json_int_t port, cap, seen;
        if (json_unpack(j, "{s:s,s:s,s:I,s:I,s:I}", "name", &name, "host", &host, "port", &port,
                        "capacity", &cap, "last_seen_ms", &seen) == 0 &&
            strlen(name) < CAP_ID_MAX && strlen(host) < 64) {
            node_info_t *ni = &out[k++];
            json_t *room = json_object_get(j, "disk_room_mb");
            *ni = (node_info_t){ .port = (uint16_t)port,
                                 .capacity = cap,
                                 .disk_room_mb =
                                     json_is_integer(room) ? json_integer_value(room) : INT64_MAX,
                                 .live = now - seen < CTL_NODE_LIVE_MS,
                                 .has_image = node_rec_has_image(j, image) };
            memcpy(ni->name, name, strlen(name) + 1);
            memcpy(ni->host, host, strlen(host) + 1);
        }
        json_decref(j);
    }
    store_kv_free(kvs, n);
    /* load: runs placed on each node that hold resources there */
    if (store_list(rc->st, "runs/", &kvs, &n) < 0)
        return k;
    for (size_t i = 0; i < n; i++) {
        json_t *j = json_loadb(kvs[i].value, kvs[i].value_len, 0, NULL);
        const char *state = json_string_value(json_object_get(j, "state"));
        const char *node = json_string_value(json_object_get(json_object_get(j, "run"), "node"));
        if (state && node && (streq(state, "running") || streq(state, "installing")))
            for (size_t m = 0; m < k; m++)
                if (streq(out[m].name, node))
                    out[m].load++;
        json_decref(j);
    }
    store_kv_free(kvs, n);
    return k;
}

static bool retire(rec_t *rc, const char *host, uint16_t port, const cap_run_t *run);

/* Tests only: SBX_TEST_CRASH_AT=control:<step> ends this process at that step (status 137), as
 * a crash would: between a node's answer and the store's record of it. */
void crash_point(const char *step)
{
    static const char *at;
    static bool read;
    if (!read) {
        at = getenv("SBX_TEST_CRASH_AT");
        read = true;
    }
    if (at && strncmp(at, "control:", 8) == 0 && streq(at + 8, step)) {
        log_warn("SBX_TEST_CRASH_AT: stopping at %s", step);
        _exit(137);
    }
}

/* How long node `name` has been silent (ms since its last heartbeat); -1: no such node. */
/* How long the node has not been heard from: since its last heartbeat, or (heard_at_register)
 * since it registered, if later. A node that registers again (a restart) heartbeats only a
 * moment after: in that moment it is not live (not placed on, not retired on) but not silent
 * either, so its runs are not taken for lost. -1 when it has no record. */
static int64_t node_silent_ms(rec_t *rc, const char *name, bool heard_at_register)
{
    char key[96];
    store_kv_t kv;
    (void)snprintf(key, sizeof key, "nodes/%s", name);
    if (store_get(rc->st, key, &kv) < 0)
        return -1;
    json_t *j = json_loadb(kv.value, kv.value_len, 0, NULL);
    store_kv_clear(&kv);
    json_int_t seen = json_integer_value(json_object_get(j, "last_seen_ms"));
    json_int_t reg = json_integer_value(json_object_get(j, "registered_ms"));
    json_decref(j);
    return wall_ms() - (heard_at_register ? MAX(seen, reg) : seen);
}

static bool node_live(rec_t *rc, const char *name)
{
    int64_t s = node_silent_ms(rc, name, false);
    return s >= 0 && s < CTL_NODE_LIVE_MS;
}

/* Retire the run a record keeps as prev (a moved or lost run) once its node is live: a node
 * that does not answer is not waited for on every pass. */
static void retire_prev(rec_t *rc, const char *id, runrec_t *rr, int64_t *rev)
{
    if (rr->has_prev && node_live(rc, rr->prev.node) &&
        retire(rc, rr->prev_host, rr->prev_port, &rr->prev)) {
        rr->has_prev = false;
        (void)runrec_cas(rc->st, id, rr, *rev, rev);
    }
}

/* Placement: a live node with room (a run less than its capacity, and disk for the flavor's:
 * disk_mb, except on `kept`, which keeps the run's root in place) and the job's image; the
 * preferred one if it qualifies, never `avoid`; else the least loaded. */
static const node_info_t *place(node_info_t *nodes, size_t n, const char *prefer, const char *avoid,
                                const char *only, int64_t disk_mb, const char *kept)
{
    const node_info_t *best = NULL;
    for (size_t i = 0; i < n; i++) {
        const node_info_t *ni = &nodes[i];
        if (!ni->live || !ni->has_image || ni->load >= ni->capacity ||
            (avoid && streq(ni->name, avoid)) || (only && !streq(ni->name, only)))
            continue;
        if (ni->disk_room_mb < disk_mb && !(kept && streq(ni->name, kept)))
            continue;
        if (prefer && streq(ni->name, prefer))
            return ni;
        if (!best || ni->load < best->load)
            best = ni;
    }
    return best;
}

/* ---- transitions ----------------------------------------------------------------------------- */

static void new_run_id(const char *job, uint64_t gen, const char *node, cap_run_t *id)
{
    char act[17], inst[13];
    random_hex(act, 8);
    random_hex(inst, 6);
    *id = (cap_run_t){ .generation = gen };
    (void)snprintf(id->sandbox, sizeof id->sandbox, "%s", job);
    (void)snprintf(id->node, sizeof id->node, "%s", node);
    (void)snprintf(id->substrate, sizeof id->substrate, "process");
    (void)snprintf(id->activation, sizeof id->activation, "a-%s", act);
    (void)snprintf(id->instance, sizeof id->instance, "i-%s", inst);
}

/* The install request. Secrets that cannot be opened (altered in the store, or sealed under a
 * key the key file no longer holds) fail the install: a run never starts without them or with
 * anything but them. */
static int install_body(rec_t *rc, json_t *job, const char *id, json_t *restore, json_t **ret)
{
    json_t *secrets = NULL;
    int r = job_secrets_get(rc->st, &rc->ctl->seal, id, &secrets);
    if (r < 0 && r != -ENOENT) {
        json_decref(restore);
        return r;
    }
    /* "image": the name; the node resolves it to its verified rootfs (image_rootfs) */
    const char *image = json_string_value(json_object_get(job, "image"));
    json_t *b = json_pack(
        "{s:O,s:O,s:O,s:O,s:o,s:s,s:s}", "command", json_object_get(job, "command"), "env",
        json_object_get(job, "env"), "expose", json_object_get(job, "expose"), "flavor",
        json_object_get(job, "flavor"), "secrets", secrets ? secrets : json_object(), "mode",
        json_string_value(json_object_get(job, "mode")) ?: "dedicated", "image",
        image ? image : "host");
    if (b) { /* a job recorded before these fields existed has no network of its own */
        json_t *net = json_object_get(job, "network"),
               *allow = json_object_get(job, "egress_allow");
        json_object_set_new(b, "network", json_string(json_string_value(net) ?: "none"));
        json_object_set_new(b, "egress_allow", allow ? json_incref(allow) : json_array());
    }
    if (b && restore)
        json_object_set_new(b, "restore", restore);
    else
        json_decref(restore);
    if (!b)
        return -ENOMEM;
    *ret = b;
    return 0;
}

/* Retire a run on its node (the node answers no_run when it is already gone: also done). */
static bool retire(rec_t *rc, const char *host, uint16_t port, const cap_run_t *run)
{
    int status = 0;
    sbx_err_t err = { 0 };
    int r = node_call(rc, host, port, run, "DELETE", "", NULL, &status, &err);
    if (r < 0 || (status != HTTP_OK && status != HTTP_CONFLICT)) {
        log_warn("retire %s generation %llu on %s: %s (status %d)", run->sandbox,
                 (unsigned long long)run->generation, run->node, err.msg, status);
        return false;
    }
    return true;
}

static bool pause_run(rec_t *rc, runrec_t *rr, int64_t *rev)
{
    int status = 0;
    sbx_err_t err = { 0 };
    int r = node_call(rc, rr->host, rr->port, &rr->run, "POST", "/pause", NULL, &status, &err);
    if (r < 0 || status != 200) {
        log_warn("pause %s generation %llu: %s (status %d)", rr->run.sandbox,
                 (unsigned long long)rr->run.generation, err.msg, status);
        return false;
    }
    crash_point("pause:done");
    if (runrec_set_state(rr, RR_PAUSED) < 0)
        return false;
    return runrec_cas(rc->st, rr->run.sandbox, rr, *rev, rev) >= 0;
}

/* Backoff between install attempts of one generation: 0.5 s doubling to 30 s, +-20 % jitter
 * (so that jobs that failed together do not come back together). */
static int64_t install_backoff_ms(int attempts)
{
    int64_t d = INSTALL_BACKOFF_MIN_MS << (attempts < 7 ? attempts - 1 : 6);
    if (d > INSTALL_BACKOFF_MAX_MS)
        d = INSTALL_BACKOFF_MAX_MS;
    return d - d / 5 + (int64_t)randombytes_uniform((uint32_t)(2 * d / 5 + 1));
}

/* Start the next generation, or try the current one again with a new activation: from the
 * same root as before (a retried resume or move never starts on an empty root), not before
 * its backoff has passed. */
static void start_run(rec_t *rc, json_t *job, const char *ns, const char *id, runrec_t *old,
                      int64_t rev, bool have_old)
{
    node_info_t nodes[64];
    const char *image = json_string_value(json_object_get(job, "image"));
    if (!image)
        image = "host";
    bool resume = have_old && old->state == RR_PAUSED;
    bool retry = have_old && old->state == RR_FAILED;
    if (retry && wall_ms() < old->next_try_ms)
        return; /* backing off */
    size_t n = load_nodes(rc, nodes, 64, image);
    const char *move_to = json_string_value(json_object_get(job, "move_to"));
    bool move = move_to && *move_to;
    /* the root to start from: the paused run, or what the failed attempt started from */
    bool has_from = resume || (retry && old->has_from);
    cap_run_t from = { 0 };
    char from_host[64] = "";
    uint16_t from_port = 0;
    if (resume) {
        from = old->run;
        (void)snprintf(from_host, sizeof from_host, "%s", old->host);
        from_port = old->port;
    } else if (has_from) {
        from = old->from;
        (void)snprintf(from_host, sizeof from_host, "%s", old->from_host);
        from_port = old->from_port;
    }
    /* a resume stays where its root is (if that node can take it); a move never goes back to
     * the node it leaves, however often its install is tried */
    json_int_t disk_mb =
        json_integer_value(json_object_get(json_object_get(job, "flavor"), "disk_mb"));
    const node_info_t *ni =
        place(nodes, n, has_from && !move ? from.node : NULL, move && has_from ? from.node : NULL,
              move && !streq(move_to, "*") ? move_to : NULL, disk_mb > 0 ? disk_mb : 0,
              has_from ? from.node : NULL);
    if (!ni) {
        char msg[200];
        (void)snprintf(msg, sizeof msg,
                       "waiting for a live node with room (a run, and %lld MiB "
                       "of disk)%s%s",
                       (long long)(disk_mb > 0 ? disk_mb : 0),
                       streq(image, "host") ? "" : " and image ",
                       streq(image, "host") ? "" : image);
        job_patch(rc, ns, id, &(job_patch_t){ .message = msg });
        return;
    }
    runrec_t nr = { .port = ni->port };
    uint64_t gen = have_old ? old->run.generation + (retry ? 0 : 1) : 1;
    new_run_id(id, gen, ni->name, &nr.run);
    /* the claim: a new generation (or activation) replaces the record old is */
    if (!runrec_transition_ok(old->state, RR_INSTALLING)) {
        log_error("job %s/%s: a %s run record cannot be replaced by a new run: refused", ns, id,
                  runrec_state_to_string(old->state));
        return;
    }
    nr.state = RR_INSTALLING;
    (void)snprintf(nr.host, sizeof nr.host, "%s", ni->host);
    (void)snprintf(nr.ns, sizeof nr.ns, "%s", ns);
    nr.attempts = retry ? old->attempts : 0;
    nr.first_fail_ms = retry ? old->first_fail_ms : 0;
    memcpy(nr.owner, rc->ctl->instance, sizeof nr.owner); /* while installing: ours */
    if (has_from) {
        nr.has_from = true;
        nr.from = from;
        (void)snprintf(nr.from_host, sizeof nr.from_host, "%s", from_host);
        nr.from_port = from_port;
    }
    json_t *restore = NULL;
    if (has_from && streq(from.node, ni->name))
        restore = json_pack("{s:s}", "mode", "local");
    else if (has_from) {
        cap_t cap = { .run = from, .access = CAP_STATE_READ }; /* nothing more for B */
        char wire[CAP_WIRE_MAX + 64], st_target[128];
        (void)snprintf(st_target, sizeof st_target, "/v1/runs/%s/state", from.sandbox);
        if (cap_bind_request(&cap, "GET", 3, st_target, strlen(st_target), NULL, 0) >= 0 &&
            keys_sign(&rc->kr, &cap, wire, sizeof wire) >= 0)
            restore = json_pack("{s:s,s:s,s:i,s:s,s:s}", "mode", "remote", "host", from_host,
                                "port", from_port, "sandbox", id, "capability", wire);
        nr.has_prev = true; /* the old root is removed once the new run runs */
        nr.prev = from;
        (void)snprintf(nr.prev_host, sizeof nr.prev_host, "%s", from_host);
        nr.prev_port = from_port;
    } else if (have_old && old->has_prev) {
        nr.has_prev = true;
        nr.prev = old->prev;
        memcpy(nr.prev_host, old->prev_host, sizeof nr.prev_host);
        nr.prev_port = old->prev_port;
    }
    /* Claim generation N (activation A) before any node hears of it. */
    int64_t nrev;
    int r = runrec_cas(rc->st, id, &nr, have_old ? rev : STORE_REV_ABSENT, &nrev);
    if (r < 0) {
        json_decref(restore);
        if (r != -ESTALE)
            log_warn("job %s: cannot write the run record: %s", id, strerror(-r));
        return; /* another writer moved first: read again next pass */
    }
    crash_point("install:claimed");
    if (!retry)
        job_patch(rc, ns, id,
                  &(job_patch_t){ .set_stage = true, .stage = STAGE_SCHEDULING, .message = "" });
    json_t *body = NULL;
    int status = 0;
    sbx_err_t err = { 0 };
    r = install_body(rc, job, id, restore, &body);
    bool secrets_lost = r == -EBADMSG || r == -ENOKEY;
    if (secrets_lost)
        (void)sbx_err(&err, r, "the job's secrets cannot be decrypted (%s)",
                      r == -EBADMSG ? "altered in the store"
                                    : "sealed under a secrets key no longer in the key file");
    if (r >= 0)
        r = node_call(rc, nr.host, nr.port, &nr.run, "PUT", "", body, &status, &err);
    json_decref(body);
    if (r >= 0 && (status == 200 || status == 201)) {
        crash_point("install:done");
        if (runrec_set_state(&nr, RR_RUNNING) < 0)
            return;
        nr.owner[0] = 0;
        nr.attempts = 0;
        nr.next_try_ms = nr.first_fail_ms = 0;
        if (runrec_cas(rc->st, id, &nr, nrev, &nrev) < 0)
            return;
        log_info("job %s/%s: generation %llu running on %s (activation %s)", ns, id,
                 (unsigned long long)gen, ni->name, nr.run.activation);
        job_patch(rc, ns, id,
                  &(job_patch_t){ .set_stage = true,
                                  .stage = STAGE_RUNNING,
                                  .message = "",
                                  .set_run = true,
                                  .generation = gen,
                                  .node = ni->name,
                                  .clear_move = true,
                                  .started = true });
        retire_prev(rc, id, &nr, &nrev);
        return;
    }
    /* Only what no retry can fix ends the job: its secrets cannot be opened, or the node
     * refused the request itself (400: the spec is wrong for it; 422: the run's command
     * failed the bridge check, it is not the agent), or it kept failing for
     * INSTALL_GIVE_UP_MS. Anything else (the node unreachable, restarting, busy) is tried
     * again after a backoff, from the same root. */
    int64_t now = wall_ms();
    nr.attempts++;
    if (!nr.first_fail_ms)
        nr.first_fail_ms = now;
    bool permanent =
        secrets_lost || (r >= 0 && (status == HTTP_BAD_REQUEST || status == HTTP_UNPROCESSABLE));
    bool give_up = permanent || now - nr.first_fail_ms >= INSTALL_GIVE_UP_MS;
    nr.next_try_ms = now + install_backoff_ms(nr.attempts);
    if (give_up)
        nr.attempts = INSTALL_ATTEMPTS_FINAL;
    if (runrec_set_state(&nr, RR_FAILED) < 0)
        return;
    nr.owner[0] = 0;
    (void)runrec_cas(rc->st, id, &nr, nrev, &nrev);
    log_warn("job %s/%s: install of generation %llu on %s failed (attempt %d): %s", ns, id,
             (unsigned long long)gen, ni->name, nr.attempts, err.msg);
    if (give_up) {
        char m[600];
        (void)snprintf(m, sizeof m, "could not start: %s", err.msg);
        job_patch(rc, ns, id,
                  &(job_patch_t){ .set_stage = true, .stage = STAGE_ERROR, .message = m });
    } else {
        char m[700];
        (void)snprintf(m, sizeof m, "install on %s failed (attempt %d): %s; trying again in %.1f s",
                       ni->name, nr.attempts, err.msg, (double)(nr.next_try_ms - now) / 1000.0);
        job_patch(rc, ns, id,
                  &(job_patch_t){ .set_stage = true, .stage = STAGE_SCHEDULING, .message = m });
    }
}

static void reconcile_job(rec_t *rc, json_t *job)
{
    const char *id = json_string_value(json_object_get(job, "id"));
    const char *ns = json_string_value(json_object_get(job, "namespace"));
    job_stage_t stage;
    job_desired_t desired;
    if (!id || !ns || job_stage_of(job, &stage) < 0 || job_desired_of(job, &desired) < 0 ||
        stage == STAGE_CANCELED)
        return;
    runrec_t rr = { .state = RR_NONE };
    int64_t rev = 0;
    bool have = runrec_load(rc->st, id, &rr, &rev) == 0;
    if (!have)
        rr = (runrec_t){ .state = RR_NONE };
    bool holds = have && (rr.state == RR_RUNNING || rr.state == RR_PAUSED ||
                          rr.state == RR_INSTALLING || rr.state == RR_EXITED);
    if (desired == DESIRED_CANCELED) {
        if (holds && !retire(rc, rr.host, rr.port, &rr.run))
            return;
        /* A failed install may have left the run's record and directory on its node (kept for
         * a retry and its log): retired too, where the node is live; one that is not keeps
         * nothing mounted and does not hold the cancel up. */
        if (have && rr.state == RR_FAILED && node_live(rc, rr.run.node))
            (void)retire(rc, rr.host, rr.port, &rr.run);
        crash_point("cancel:retired");
        if (have && rr.has_prev)
            (void)retire(rc, rr.prev_host, rr.prev_port, &rr.prev);
        if (have && rr.state != RR_RETIRED && runrec_set_state(&rr, RR_RETIRED) == 0) {
            rr.has_prev = false;
            (void)runrec_cas(rc->st, id, &rr, rev, &rev);
        }
        job_patch(rc, ns, id, &(job_patch_t){ .set_stage = true, .stage = STAGE_CANCELED });
        log_info("job %s/%s canceled", ns, id);
        return;
    }
    if (stage == STAGE_COMPLETED || stage == STAGE_ERROR) {
        if (have) /* a run lost with its node is retired once the node is back */
            retire_prev(rc, id, &rr, &rev);
        return;
    }
    if (have && rr.state == RR_INSTALLING) {
        /* Being installed by a live control process (another one: this reconciler installs
         * synchronously), or by one that is gone: a crash between claiming the generation and
         * recording the node's answer. Then it is tried again as the same generation, from the
         * same root, at once. A record without an owner (older) goes stale after a minute. */
        bool theirs = rr.owner[0]
                          ? !streq(rr.owner, rc->ctl->instance) && control_alive(rc->st, rr.owner)
                          : wall_ms() - rr.updated_ms < CTL_INSTALL_STALE_MS;
        if (theirs)
            return;
        log_warn("job %s/%s: the install of generation %llu on %s was interrupted (control %s "
                 "is gone): trying it again",
                 ns, id, (unsigned long long)rr.run.generation, rr.run.node,
                 rr.owner[0] ? rr.owner : "unknown");
        if (runrec_set_state(&rr, RR_FAILED) < 0)
            return;
        rr.next_try_ms = 0;
        rr.owner[0] = 0;
        if (runrec_cas(rc->st, id, &rr, rev, &rev) < 0)
            return;
    }
    if (desired == DESIRED_PAUSED) {
        if (have && rr.state == RR_RUNNING && !pause_run(rc, &rr, &rev))
            return;
        if (stage != STAGE_PAUSED)
            job_patch(rc, ns, id,
                      &(job_patch_t){ .set_stage = true, .stage = STAGE_PAUSED, .message = "" });
        return;
    }
    /* The run's node went silent: past node_dead_ms its run is lost, and the job's
     * on_node_loss says what follows. A lost run is kept as prev: retired when its node is back,
     * so its generation is refused there too (a new generation is refused nothing). */
    int64_t silent = have && (rr.state == RR_RUNNING || rr.state == RR_INSTALLING)
                         ? node_silent_ms(rc, rr.run.node, true)
                         : -1;
    if (silent >= 0 && (uint64_t)silent >= rc->ctl->cfg.node_dead_ms) {
        const char *policy = json_string_value(json_object_get(job, "on_node_loss")) ?: "wait";
        char m[256];
        if (streq(policy, "wait")) {
            (void)snprintf(m, sizeof m,
                           "node %s silent for %lld s: waiting for it and the run's root "
                           "(on_node_loss: wait)",
                           rr.run.node, (long long)(silent / 1000));
            job_patch(rc, ns, id, &(job_patch_t){ .message = m });
            return;
        }
        if (rr.has_prev) /* an older run still to retire: that one first (it is the oldest) */
            retire_prev(rc, id, &rr, &rev);
        if (rr.has_prev)
            return;
        if (runrec_set_state(&rr, RR_LOST) < 0)
            return;
        rr.has_prev = true;
        rr.prev = rr.run;
        memcpy(rr.prev_host, rr.host, sizeof rr.prev_host);
        rr.prev_port = rr.port;
        rr.has_from = false;
        if (runrec_cas(rc->st, id, &rr, rev, &rev) < 0)
            return;
        log_warn("job %s/%s: node %s silent for %lld s: generation %llu lost (on_node_loss: %s)",
                 ns, id, rr.run.node, (long long)(silent / 1000),
                 (unsigned long long)rr.run.generation, policy);
        (void)snprintf(m, sizeof m, "node %s lost (silent for %lld s)%s", rr.run.node,
                       (long long)(silent / 1000),
                       streq(policy, "fail") ? "; on_node_loss: fail"
                                             : ": a fresh run elsewhere (on_node_loss: restart)");
        job_patch(rc, ns, id,
                  &(job_patch_t){ .set_stage = true,
                                  .stage = streq(policy, "fail") ? STAGE_ERROR : STAGE_SCHEDULING,
                                  .message = m });
        if (streq(policy, "restart"))
            start_run(rc, job, ns, id, &rr, rev, true);
        return;
    }
    const char *move_to = json_string_value(json_object_get(job, "move_to"));
    bool move = move_to && *move_to;
    if (have && rr.state == RR_RUNNING) {
        if (!move) {
            json_int_t timeout = json_integer_value(json_object_get(job, "timeout"));
            json_int_t started = json_integer_value(json_object_get(job, "started_ms"));
            if (timeout > 0 && started > 0 && wall_ms() - started > timeout * 1000) {
                if (retire(rc, rr.host, rr.port, &rr.run) &&
                    runrec_set_state(&rr, RR_RETIRED) == 0) {
                    (void)runrec_cas(rc->st, id, &rr, rev, &rev);
                    job_patch(rc, ns, id,
                              &(job_patch_t){ .set_stage = true,
                                              .stage = STAGE_ERROR,
                                              .message = "timed out" });
                }
                return;
            }
            retire_prev(rc, id, &rr, &rev);
            const char *msg = json_string_value(json_object_get(job, "message"));
            if (stage != STAGE_RUNNING || (msg && *msg)) /* e.g. its node is back */
                job_patch(
                    rc, ns, id,
                    &(job_patch_t){ .set_stage = true, .stage = STAGE_RUNNING, .message = "" });
            return;
        }
        if (!pause_run(rc, &rr, &rev)) /* a move stops the run first: its root moves */
            return;
    }
    if (have && rr.state == RR_FAILED && rr.attempts >= INSTALL_ATTEMPTS_FINAL)
        return;
    if (have && rr.state == RR_EXITED)
        return;
    start_run(rc, job, ns, id, &rr, rev, have && rr.state != RR_RETIRED);
}

static void pass(rec_t *rc)
{
    store_kv_t *kvs;
    size_t n;
    if (keys_load(rc->st, &rc->ctl->seal, &rc->kr) < 0 || store_list(rc->st, "jobs/", &kvs, &n) < 0)
        return;
    for (size_t i = 0; i < n && !rc->ctl->stopping; i++) {
        json_t *job = json_loadb(kvs[i].value, kvs[i].value_len, 0, NULL);
        if (job)
            reconcile_job(rc, job);
        json_decref(job);
    }
    store_kv_free(kvs, n);
    pools_pass(rc->ctl, rc->st, &rc->kr, &rc->pool_syncs);
}

static void *rec_main(void *p)
{
    rec_t *rc = p;
    control_t *ctl = rc->ctl;
    for (;;) {
        pthread_mutex_lock(&ctl->rec_lock);
        if (!ctl->rec_dirty && !ctl->stopping) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;
            (void)pthread_cond_timedwait(&ctl->rec_cond, &ctl->rec_lock, &ts);
        }
        bool stop = ctl->stopping;
        ctl->rec_dirty = false;
        pthread_mutex_unlock(&ctl->rec_lock);
        if (stop)
            break;
        pass(rc);
    }
    store_close(rc->st);
    sodium_memzero(&rc->kr, sizeof rc->kr);
    free(rc);
    return NULL;
}

int reconciler_start(control_t *ctl)
{
    rec_t *rc = calloc(1, sizeof *rc);
    if (!rc)
        return -ENOMEM;
    rc->ctl = ctl;
    char path[PATH_MAX + 16];
    (void)snprintf(path, sizeof path, "%s/store.db", ctl->cfg.state_dir);
    int r = store_open_sqlite(path, &rc->st);
    if (r < 0) {
        free(rc);
        return r;
    }
    r = pthread_create(&ctl->rec_thread, NULL, rec_main, rc);
    if (r != 0) {
        store_close(rc->st);
        free(rc);
        return -r;
    }
    ctl->rec_started = true;
    return 0;
}

void reconciler_stop(control_t *ctl)
{
    pthread_mutex_lock(&ctl->rec_lock);
    ctl->stopping = true;
    pthread_cond_signal(&ctl->rec_cond);
    pthread_mutex_unlock(&ctl->rec_lock);
    if (ctl->rec_started)
        (void)pthread_join(ctl->rec_thread, NULL);
    ctl->rec_started = false;
}
