/* SPDX-License-Identifier: MIT */
/* E2B's control API on sbx-control, so that E2B's SDKs (E2B_API_URL = this control plane,
 * X-API-KEY = an sbx API token) create and manage sandboxes here. Wire contract:
 * ../shared/research/clients.md section 1.2; every error is {"code": <status>, "message"}.
 *
 *   POST   /sandboxes, /v2/sandboxes            create (201 only once the sandbox's agent runs)
 *   GET    /sandboxes, /v2/sandboxes            list (v2: ?metadata=&state=&limit=&nextToken=)
 *   GET    /sandboxes/{id}                      detail
 *   DELETE /sandboxes/{id}                      kill (204)
 *   POST   /sandboxes/{id}/timeout              {"timeout": s}: ends s seconds from now (204)
 *   POST   /sandboxes/{id}/pause                (204; 409 when paused already)
 *   POST   /sandboxes/{id}/resume               (201, the sandbox)
 *   POST   /sandboxes/{id}/connect, /v2/...     resume if paused; 200 (201 when resumed)
 *
 * A sandbox is a dedicated job of the token's namespace (a token of every namespace uses
 * namespace "e2b"): its id is the job id (no '-' or '.'), templateID names the image ("base":
 * the control's default image), metadata becomes labels "e2b.meta/<key>", envVars its env,
 * allow_internet_access (E2B's default: true) its network (egress, or none), timeout (default
 * 300 s) its lifetime. Its envdAccessToken is the job's sandbox token (SBX_TOKEN). */
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "cap/purpose.h"
#include "common/log.h"
#include "e2b.h"

#define E2B_NS CONTROL_RESERVED_NS
#define E2B_BODY_MAX (256 * 1024)
#define E2B_START_WAIT_MS 120000
#define E2B_LIST_MAX 1000
#define META_PREFIX "e2b.meta/"
#define TEMPLATE_LABEL "e2b/template"

static json_int_t jint(json_t *o, const char *k)
{
    return json_integer_value(json_object_get(o, k));
}
static const char *jstr(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

static void rfc3339(int64_t ms, char out[80])
{
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    (void)snprintf(out, 80, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                   tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(ms % 1000));
}

/* The namespace an E2B caller's sandboxes live in. */
static const char *caller_ns(const principal_t *pr) { return streq(pr->ns, "*") ? E2B_NS : pr->ns; }

/* X-API-KEY -> principal with at least `need` on its namespace; answers 401/403 itself. */
static bool e2b_auth(control_t *ctl, conn_t *c, role_t need, principal_t *ret)
{
    sv_t v;
    char tok[256];
    if (!http_header_get(&c->req, "x-api-key", &v) || v.len == 0 || v.len >= sizeof tok) {
        http_unauthorized(c, HTTP_BODY_CODE,
                          "an API key is required (X-API-KEY: an sbx API token)");
        return false;
    }
    memcpy(tok, v.p, v.len);
    tok[v.len] = 0;
    principal_t pr;
    int r = auth_token_lookup(ctl, tok, &pr);
    sodium_memzero(tok, sizeof tok);
    if (r == -ENOENT) {
        http_unauthorized(c, HTTP_BODY_CODE, "unknown API key");
        return false;
    }
    if (r < 0) {
        http_unavailable(c, HTTP_BODY_CODE, "the control plane cannot check API keys now: %s",
                         strerror(-r));
        return false;
    }
    if (!auth_account(ctl, c, pr.principal))
        return false;
    if (pr.role < need) {
        http_forbidden(c, HTTP_BODY_CODE, "the API key of %s may not %s sandboxes", pr.principal,
                       need >= ROLE_WRITE ? "change" : "read");
        return false;
    }
    /* the namespace of keys of every namespace is theirs alone (a token of its name made before
     * it was reserved reaches nothing: auth.c) */
    if (streq(pr.ns, E2B_NS)) {
        http_forbidden(c, HTTP_BODY_CODE, "namespace %s is reserved for keys of every namespace",
                       E2B_NS);
        return false;
    }
    *ret = pr;
    return true;
}

/* ---- the Sandbox shapes ----------------------------------------------------------------------- */

bool e2b_job(json_t *job)
{
    return json_object_get(json_object_get(job, "labels"), TEMPLATE_LABEL) != NULL;
}

static json_t *metadata_of(json_t *job)
{
    json_t *m = json_object();
    const char *k;
    json_t *v;
    json_object_foreach(json_object_get(job, "labels"), k, v) {
        if (strncmp(k, META_PREFIX, strlen(META_PREFIX)) == 0)
            json_object_set(m, k + strlen(META_PREFIX), v);
    }
    return m;
}

/* What create, connect and resume answer (the SDK's Sandbox). */
void e2b_traffic_token(const char *token, char out[E2B_TRAFFIC_TOKEN_HEX + 1])
{
    static const char what[] = "sbx e2b traffic token\n";
    uint8_t h[E2B_TRAFFIC_TOKEN_HEX / 2];
    crypto_generichash_state st;
    (void)crypto_generichash_init(&st, NULL, 0, sizeof h);
    (void)crypto_generichash_update(&st, (const uint8_t *)what, sizeof what - 1);
    (void)crypto_generichash_update(&st, (const uint8_t *)token, strlen(token));
    (void)crypto_generichash_final(&st, h, sizeof h);
    (void)sodium_bin2hex(out, E2B_TRAFFIC_TOKEN_HEX + 1, h, sizeof h);
    sodium_memzero(&st, sizeof st);
    sodium_memzero(h, sizeof h);
}

/* Its domain is always given: an SDK told none sends port traffic to E2B's own cloud. The
 * traffic token reaches the sandbox's ports only (e2bproxy.c). */
json_t *e2b_sandbox_json(const control_t *ctl, const char *id, const char *tpl, const char *token)
{
    json_t *j = json_pack("{s:s,s:s,s:s,s:s,s:s,s:s}", "sandboxID", id, "templateID", tpl,
                          "clientID", "sbx", "envdVersion", E2B_ENVD_VERSION, "domain",
                          ctl->cfg.e2b_domain, "alias", tpl);
    if (j && token) {
        char traffic[E2B_TRAFFIC_TOKEN_HEX + 1];
        e2b_traffic_token(token, traffic);
        json_object_set_new(j, "envdAccessToken", json_string(token));
        json_object_set_new(j, "trafficAccessToken", json_string(traffic));
    }
    return j;
}

static json_t *sandbox_json(const control_t *ctl, json_t *job, const char *token)
{
    return e2b_sandbox_json(ctl, jstr(job, "id"),
                            jstr(json_object_get(job, "labels"), TEMPLATE_LABEL), token);
}

/* running | paused, or NULL for a job that is no sandbox any more. */
static const char *sandbox_state(json_t *job)
{
    job_stage_t st;
    job_desired_t d;
    if (job_stage_of(job, &st) < 0 || job_desired_of(job, &d) < 0 || job_stage_ended(st) ||
        d == DESIRED_CANCELED)
        return NULL;
    return st == STAGE_PAUSED || d == DESIRED_PAUSED ? "paused" : "running";
}

/* The list and detail shape (ListedSandbox / SandboxDetail); steals meta. */
json_t *e2b_listed_json(const control_t *ctl, const e2b_listed_t *l, json_t *meta, bool detail)
{
    char at[80], end[80];
    rfc3339(l->started_ms, at);
    rfc3339(l->end_ms, end);
    json_t *j =
        json_pack("{s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:I,s:I,s:I,s:s,s:o}", "sandboxID", l->id,
                  "templateID", l->tpl, "clientID", "sbx", "alias", l->tpl, "startedAt", at,
                  "endAt", end, "state", l->state, "cpuCount", (json_int_t)l->cpus, "memoryMB",
                  (json_int_t)l->memory_mb, "diskSizeMB", (json_int_t)l->disk_mb, "envdVersion",
                  E2B_ENVD_VERSION, "metadata", meta ? meta : json_object());
    if (j && detail) {
        json_object_set_new(j, "domain", json_string(ctl->cfg.e2b_domain));
        json_object_set_new(j, "allowInternetAccess", json_boolean(l->internet));
    }
    return j;
}

static json_t *listed_json(const control_t *ctl, json_t *job, bool detail)
{
    const char *state = sandbox_state(job);
    json_t *fl = json_object_get(job, "flavor");
    int64_t started = jint(job, "started_ms") ?: jint(job, "created_ms");
    e2b_listed_t l = { .id = jstr(job, "id"),
                       .tpl = jstr(json_object_get(job, "labels"), TEMPLATE_LABEL),
                       .state = state ? state : "killed",
                       .started_ms = started,
                       .end_ms = started + jint(job, "timeout") * 1000,
                       .cpus = MAX(1, jint(fl, "cpu_millis") / 1000),
                       .memory_mb = jint(fl, "memory_mb"),
                       .disk_mb = jint(fl, "disk_mb"),
                       .internet = streq(jstr(job, "network"), "egress") };
    return e2b_listed_json(ctl, &l, metadata_of(job), detail);
}

/* ---- waiting for a run (workers) -------------------------------------------------------------- */

/* 0 once the sandbox runs; -ENOENT (gone), -ESRCH (its job ended) or -ETIMEDOUT, with err. */
/* One look at whether sandbox id runs: 0 yes, -EAGAIN not yet, else why not (err). */
static int start_step(worker_t *w, const char *ns, const char *id, sbx_err_t *err)
{
    runrec_t rr;
    json_t *job = NULL;
    if (job_load(w->st, ns, id, &job, NULL) < 0)
        return sbx_err(err, -ENOENT, "sandbox %s is gone", id);
    job_stage_t st = STAGE_SCHEDULING;
    (void)job_stage_of(job, &st);
    if (job_stage_ended(st)) {
        (void)sbx_err(err, -ESRCH, "sandbox %s could not start: %s", id, jstr(job, "message"));
        json_decref(job);
        return -ESRCH;
    }
    json_decref(job);
    if (st == STAGE_RUNNING && runrec_load(w->st, id, &rr, NULL) == 0 && rr.state == RR_RUNNING)
        return 0;
    return -EAGAIN;
}

/* A sandbox its creator will never hear of (it left, or was told the create timed out) is
 * cancelled: it must not start later unseen, holding room for its whole timeout. */
static void cancel_unseen(worker_t *w, const char *ns, const char *id)
{
    if (job_cancel(w->st, ns, id) == 0) {
        log_info("e2b: sandbox %s/%s cancelled: its creator will not hear of it", ns, id);
        control_kick(w->ctl);
    }
}

typedef struct {
    char ns[64], principal[64], id[32];
    role_t role;
    bool v2, resume;
    char *body;
    size_t body_len;
    /* a task that waits (work.c: again_ms): since when it waits, how long it waits next */
    bool waiting, resumed;
    uint64_t deadline_ms;
    unsigned pause_ms;
    char tok[80]; /* a create's sandbox token, until it is answered */
} e2b_arg_t;

/* Wait (the task runs again later) until deadline: true while it should. */
static bool wait_more(e2b_arg_t *a, work_result_t *res)
{
    if (!a->waiting) {
        a->waiting = true;
        a->deadline_ms = monotonic_ms() + E2B_START_WAIT_MS;
        a->pause_ms = 20;
    }
    if (monotonic_ms() > a->deadline_ms)
        return false;
    res->again_ms = a->pause_ms;
    a->pause_ms = MIN(a->pause_ms * 2, 200u);
    return true;
}

static e2b_arg_t *new_arg(const principal_t *pr, const char *id);

static void arg_free(void *p)
{
    e2b_arg_t *a = p;
    free(a->body);
    sodium_memzero(a->tok, sizeof a->tok);
    free(a);
}

static const char *create_body(control_t *ctl, json_t *b, json_t **ret_req, const char **ret_tpl)
{
    const char *tpl = "base";
    json_t *meta = NULL, *env = NULL, *inet = NULL;
    json_int_t timeout = E2B_DEFAULT_TIMEOUT_S;
    if (!json_is_object(b))
        return "expected a JSON object";
    /* E2B's other fields (secure, autoPause, network, mcp, ...) are accepted and not used. Each
     * field is read on its own, null as absent: a field of the wrong type is refused, never
     * taken as absent with those after it (a float timeout once dropped a false
     * allow_internet_access: a sandbox with internet it was asked not to have). */
    json_t *jtpl = json_object_get(b, "templateID"), *jto = json_object_get(b, "timeout");
    meta = json_object_get(b, "metadata");
    env = json_object_get(b, "envVars");
    inet = json_object_get(b, "allow_internet_access");
    jtpl = json_is_null(jtpl) ? NULL : jtpl;
    jto = json_is_null(jto) ? NULL : jto;
    meta = json_is_null(meta) ? NULL : meta;
    env = json_is_null(env) ? NULL : env;
    inet = json_is_null(inet) ? NULL : inet;
    if (jtpl && !json_is_string(jtpl))
        return "templateID: a string";
    if (jtpl)
        tpl = json_string_value(jtpl);
    if (jto && !json_is_integer(jto))
        return "timeout: an integer number of seconds, 1..604800";
    if (jto)
        timeout = json_integer_value(jto);
    if (timeout < 1 || timeout > 7 * 86400)
        return "timeout: 1..604800 seconds";
    if (inet && !json_is_boolean(inet))
        return "allow_internet_access: a boolean";
    json_t *labels = json_pack("{s:s}", TEMPLATE_LABEL, tpl);
    const char *k;
    json_t *v;
    if (meta && !json_is_object(meta)) {
        json_decref(labels);
        return "metadata: an object of strings";
    }
    json_object_foreach(meta, k, v) {
        char key[80];
        if (!json_is_string(v) || (size_t)snprintf(key, sizeof key, META_PREFIX "%s", k) > 63) {
            json_decref(labels);
            return "metadata: string values, keys of at most 54 bytes";
        }
        json_object_set(labels, key, v);
    }
    const char *image = streq(tpl, "base") ? ctl->cfg.default_image : tpl;
    char tok[65];
    random_hex(tok, 32);
    *ret_req = json_pack("{s:s,s:s,s:o,s:{s:s},s:I,s:s}", "image", image, "network",
                         inet && !json_is_true(inet) ? "none" : "egress", "labels", labels,
                         "secrets", "SBX_TOKEN", tok, "timeout", timeout, "flavor", "cpu-basic");
    if (*ret_req && env)
        json_object_set(*ret_req, "env", env);
    /* what getHost(port) reaches: the agent (envd) and the control's --e2b-ports */
    json_t *expose = json_pack("[{s:i,s:s}]", "port", CAP_AGENT_PORT, "protocol", "http");
    for (int i = 0; expose && i < ctl->cfg.n_e2b_ports; i++)
        json_array_append_new(
            expose, json_pack("{s:i,s:s}", "port", ctl->cfg.e2b_ports[i], "protocol", "http"));
    if (*ret_req)
        json_object_set_new(*ret_req, "expose", expose);
    else
        json_decref(expose);
    sodium_memzero(tok, sizeof tok);
    *ret_tpl = tpl;
    return *ret_req ? NULL : "out of memory";
}

/* A create's second part: until its sandbox runs (the task runs again while it waits). */
static void create_wait(worker_t *w, e2b_arg_t *a, work_result_t *res)
{
    control_t *ctl = w->ctl;
    if (res->client_gone) { /* nobody to tell its id and token to */
        cancel_unseen(w, a->ns, a->id);
        work_fail(res, HTTP_GATEWAY_TIMEOUT, HTTP_BODY_CODE, "the client left");
        return;
    }
    sbx_err_t err;
    int r = start_step(w, a->ns, a->id, &err);
    if (r == -EAGAIN && !ctl->stopping && wait_more(a, res))
        return;
    if (r == -EAGAIN) {
        cancel_unseen(w, a->ns, a->id);
        work_fail(res, HTTP_GATEWAY_TIMEOUT, HTTP_BODY_CODE,
                  "sandbox %s did not start within %d s (cancelled)", a->id,
                  E2B_START_WAIT_MS / 1000);
        return;
    }
    if (r < 0) {
        work_fail(res, HTTP_INTERNAL_ERROR, HTTP_BODY_CODE, "%s", err.msg);
        return;
    }
    json_t *fresh;
    if (job_load(w->st, a->ns, a->id, &fresh, NULL) == 0) {
        work_answer(res, 201, sandbox_json(ctl, fresh, a->tok));
        json_decref(fresh);
    } else {
        work_fail(res, HTTP_INTERNAL_ERROR, HTTP_BODY_CODE, "sandbox %s: its record is gone",
                  a->id);
    }
}

static void create_fn(worker_t *w, void *arg, work_result_t *res)
{
    e2b_arg_t *a = arg;
    control_t *ctl = w->ctl;
    if (a->waiting) {
        create_wait(w, a, res);
        return;
    }
    json_t *b = json_loadb(a->body ? a->body : "{}", a->body ? a->body_len : 2, 0, NULL);
    json_t *req = NULL, *job = NULL, *sec = NULL;
    const char *tpl = json_string_value(json_object_get(b, "templateID"));
    /* a template that names a pool of the namespace: a pooled sandbox (e2bpool.c) */
    int pooled = json_is_object(b) && tpl ? e2b_pool_exists(w->st, a->ns, tpl) : 0;
    if (pooled != 0) {
        if (pooled < 0)
            work_fail(res, HTTP_UNAVAILABLE, HTTP_BODY_CODE,
                      "create: the control plane cannot read its store");
        else
            e2b_pool_create(w, a->ns, tpl, b, res);
        json_decref(b);
        return;
    }
    tpl = NULL;
    const char *e = create_body(ctl, b, &req, &tpl);
    sbx_err_t err;
    if (!e && job_from_request(req, ctl->cfg.default_image, &job, &sec, &err) < 0)
        e = err.msg;
    json_decref(req);
    if (e) {
        work_fail(res, HTTP_BAD_REQUEST, HTTP_BODY_CODE, "create: %s", e);
        json_decref(b);
        return;
    }
    const char *image = jstr(job, "image");
    if (streq(image, "host") && a->role != ROLE_ADMIN && !streq(ctl->cfg.default_image, "host")) {
        work_fail(res, HTTP_FORBIDDEN, HTTP_BODY_CODE,
                  "template host (the node's own programs) is for admins");
    } else if (!image_on_live_node(w->st, image, NULL)) {
        work_fail(res, HTTP_BAD_REQUEST, HTTP_BODY_CODE,
                  "template %s: no such image on any live node", tpl);
    } else {
        char id[25];
        random_hex(id, 12);
        (void)snprintf(a->tok, sizeof a->tok, "%s", jstr(sec, "SBX_TOKEN"));
        int r = job_insert(w->st, &ctl->seal, a->ns, a->principal, id, job, sec);
        if (r < 0) {
            work_fail(res, HTTP_INTERNAL_ERROR, HTTP_BODY_CODE, "create: %s", strerror(-r));
        } else {
            log_info("e2b: sandbox %s/%s (template %s) created by %s", a->ns, id, tpl,
                     a->principal);
            control_kick(ctl);
            (void)snprintf(a->id, sizeof a->id, "%s", id);
            create_wait(w, a, res);
        }
    }
    json_decref(job);
    json_decref(sec);
    json_decref(b);
}

/* pause: E2B's pause returns once the sandbox is paused (its root kept). */
static void pause_wait_fn(worker_t *w, void *arg, work_result_t *res)
{
    e2b_arg_t *a = arg;
    json_t *job = NULL;
    if (job_load(w->st, a->ns, a->id, &job, NULL) < 0) {
        work_fail(res, HTTP_NOT_FOUND, HTTP_BODY_CODE, "sandbox %s not found", a->id);
        return;
    }
    job_stage_t st = STAGE_SCHEDULING;
    (void)job_stage_of(job, &st);
    json_decref(job);
    if (st == STAGE_PAUSED) {
        work_answer(res, 204, NULL);
        return;
    }
    if (job_stage_ended(st)) {
        work_fail(res, HTTP_NOT_FOUND, HTTP_BODY_CODE, "sandbox %s ended", a->id);
        return;
    }
    if (res->client_gone || (!w->ctl->stopping && wait_more(a, res)))
        return; /* (the pause goes on without the client) */
    work_fail(res, HTTP_GATEWAY_TIMEOUT, HTTP_BODY_CODE, "sandbox %s did not pause within %d s",
              a->id, E2B_START_WAIT_MS / 1000);
}

/* The end a connect or resume asks for (ms since the epoch): its `timeout` (seconds from now;
 * E2B's Python SDK always sends one) or, for a paused sandbox whose end has passed, the
 * default lifetime from now; 0: the end stays. -1: the body is not valid. */
static int64_t connect_end(const e2b_arg_t *a, bool paused, int64_t end_now, const char **why)
{
    json_t *b = a->body_len ? json_loadb(a->body, a->body_len, 0, NULL) : json_object();
    json_t *jto = json_object_get(b, "timeout");
    int64_t now = wall_ms(), want = 0;
    if (!json_is_object(b))
        *why = "expected a JSON object";
    else if (jto && !json_is_null(jto) &&
             (!json_is_integer(jto) || json_integer_value(jto) < 1 ||
              json_integer_value(jto) > 7 * 86400))
        *why = "timeout: an integer number of seconds, 1..604800";
    else if (jto && json_is_integer(jto))
        want = now + json_integer_value(jto) * 1000;
    else if (paused && end_now <= now)
        want = now + E2B_DEFAULT_TIMEOUT_S * 1000;
    json_decref(b);
    return *why ? -1 : want;
}

static void connect_fn(worker_t *w, void *arg, work_result_t *res)
{
    e2b_arg_t *a = arg;
    for (int attempt = 0; !a->waiting && attempt < 8; attempt++) {
        json_t *job = NULL;
        int64_t rev;
        if (job_load(w->st, a->ns, a->id, &job, &rev) < 0 || !e2b_job(job) || !sandbox_state(job)) {
            json_decref(job);
            work_fail(res, HTTP_NOT_FOUND, HTTP_BODY_CODE, "sandbox %s not found", a->id);
            return;
        }
        job_desired_t d;
        bool paused = job_desired_of(job, &d) == 0 && d == DESIRED_PAUSED;
        /* the lifetime: timeout seconds from its start; a connect may only extend it */
        int64_t started = jint(job, "started_ms") ?: jint(job, "created_ms");
        const char *why = NULL;
        int64_t end = connect_end(a, paused, started + jint(job, "timeout") * 1000, &why);
        if (end < 0) {
            json_decref(job);
            work_fail(res, HTTP_BAD_REQUEST, HTTP_BODY_CODE, "connect: %s", why);
            return;
        }
        if (a->resume && !paused) {
            json_decref(job);
            work_fail(res, HTTP_CONFLICT, HTTP_BODY_CODE, "sandbox %s is not paused", a->id);
            return;
        }
        bool longer = end > started + jint(job, "timeout") * 1000;
        if (longer)
            json_object_set_new(job, "timeout", json_integer((end - started + 999) / 1000));
        if (paused || longer) {
            if (paused)
                job_set_desired(job, DESIRED_RUNNING);
            int r = job_save(w->st, a->ns, a->id, job, rev, NULL);
            json_decref(job);
            if (r == -ESTALE)
                continue;
            if (r < 0) {
                work_fail(res, HTTP_INTERNAL_ERROR, HTTP_BODY_CODE, "resume: %s", strerror(-r));
                return;
            }
            a->resumed = paused;
            control_kick(w->ctl);
            break;
        }
        json_decref(job);
        break;
    }
    sbx_err_t err;
    int r = start_step(w, a->ns, a->id, &err);
    if (r == -EAGAIN && !res->client_gone && !w->ctl->stopping && wait_more(a, res))
        return; /* (a resume goes on without the client) */
    if (r == -EAGAIN)
        r = sbx_err(&err, -ETIMEDOUT, "sandbox %s did not start within %d s", a->id,
                    E2B_START_WAIT_MS / 1000);
    if (r < 0) {
        work_fail(res,
                  r == -ENOENT      ? HTTP_NOT_FOUND
                  : r == -ETIMEDOUT ? HTTP_GATEWAY_TIMEOUT
                                    : HTTP_INTERNAL_ERROR,
                  HTTP_BODY_CODE, "%s", err.msg);
        return;
    }
    json_t *job, *sec;
    if (job_load(w->st, a->ns, a->id, &job, NULL) < 0) {
        work_fail(res, HTTP_NOT_FOUND, HTTP_BODY_CODE, "sandbox %s not found", a->id);
        return;
    }
    if (job_secrets_get(w->st, &w->ctl->seal, a->id, &sec) < 0) {
        json_decref(job);
        work_fail(res, HTTP_INTERNAL_ERROR, HTTP_BODY_CODE,
                  "sandbox %s: its access token cannot be read", a->id);
        return;
    }
    work_answer(res, a->resumed ? 201 : 200, sandbox_json(w->ctl, job, jstr(sec, "SBX_TOKEN")));
    json_decref(sec);
    json_decref(job);
}

/* ---- the loop thread's routes ----------------------------------------------------------------- */

static bool query_get(const conn_t *c, const char *name, char *out, size_t cap)
{
    const char *q = memchr(c->req.target.p, '?', c->req.target.len);
    if (!q)
        return false;
    sv_t query = sv_make(q + 1, c->req.target.len - (size_t)(q + 1 - c->req.target.p));
    size_t nl = strlen(name);
    while (query.len) {
        const char *amp = memchr(query.p, '&', query.len);
        sv_t part = sv_make(query.p, amp ? (size_t)(amp - query.p) : query.len);
        query = amp ? sv_make(amp + 1, query.len - part.len - 1) : SV("");
        if (part.len > nl && memcmp(part.p, name, nl) == 0 && part.p[nl] == '=') {
            int n = url_decode(sv_make(part.p + nl + 1, part.len - nl - 1), out, cap - 1, true);
            if (n < 0)
                return false;
            out[n] = 0;
            return true;
        }
    }
    return false;
}

/* Whether job matches the v2 list's filters: metadata "k=v&k2=v2" (URL-encoded), state list. */
bool e2b_list_match(const char *state, json_t *metadata, const char *meta, const char *states)
{
    if (!state)
        return false;
    if (states[0]) {
        bool any = false;
        char buf[64];
        (void)snprintf(buf, sizeof buf, "%s", states);
        for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save))
            any = any || streq(t, state);
        if (!any)
            return false;
    }
    if (meta[0]) {
        char buf[1024];
        (void)snprintf(buf, sizeof buf, "%s", meta);
        for (char *save = NULL, *t = strtok_r(buf, "&", &save); t; t = strtok_r(NULL, "&", &save)) {
            char dk[128], dv[512];
            char *eq = strchr(t, '=');
            int kn =
                url_decode(sv_make(t, eq ? (size_t)(eq - t) : strlen(t)), dk, sizeof dk - 1, true);
            int vn = eq ? url_decode(sv_make(eq + 1, strlen(eq + 1)), dv, sizeof dv - 1, true) : 0;
            if (kn < 0 || vn < 0)
                return false;
            dk[kn] = 0;
            dv[vn] = 0;
            json_t *v = json_object_get(metadata, dk);
            if (!v || (eq && !streq(json_string_value(v), dv)))
                return false;
        }
    }
    return true;
}

static int by_sandbox_id(const void *a, const void *b)
{
    return strcmp(json_string_value(json_object_get(*(json_t *const *)a, "sandboxID")),
                  json_string_value(json_object_get(*(json_t *const *)b, "sandboxID")));
}

static void list_sandboxes(control_t *ctl, conn_t *c, const char *ns, bool v2)
{
    char meta[1024] = "", states[64] = "", next[64] = "", lim[16] = "";
    if (v2) {
        (void)query_get(c, "metadata", meta, sizeof meta);
        (void)query_get(c, "state", states, sizeof states);
        (void)query_get(c, "nextToken", next, sizeof next);
        (void)query_get(c, "limit", lim, sizeof lim);
    } else {
        (void)snprintf(states, sizeof states, "running");
    }
    uint64_t limit = E2B_LIST_MAX;
    if (lim[0] && (parse_u64_str(lim, E2B_LIST_MAX, &limit) < 0 || limit == 0)) {
        http_bad_request(c, HTTP_BODY_CODE, "limit: 1..%d", E2B_LIST_MAX);
        return;
    }
    /* dedicated sandboxes (jobs) and pooled ones (e2bpool.c), in one id order: nextToken is the
     * last id of the previous page */
    char prefix[96];
    (void)snprintf(prefix, sizeof prefix, "jobs/%s/", ns);
    store_kv_t *kvs;
    size_t n;
    json_t *all = json_array();
    int r = store_list(ctl->store, prefix, &kvs, &n);
    if (r >= 0) {
        for (size_t i = 0; all && i < n; i++) {
            json_t *job = json_loadb(kvs[i].value, kvs[i].value_len, 0, NULL);
            json_t *md = job ? metadata_of(job) : NULL;
            if (job && e2b_job(job) && (!next[0] || strcmp(jstr(job, "id"), next) > 0) &&
                e2b_list_match(sandbox_state(job), md, meta, states))
                json_array_append_new(all, listed_json(ctl, job, false));
            json_decref(md);
            json_decref(job);
        }
        store_kv_free(kvs, n);
        r = e2b_pool_list(ctl, ns, next, meta, states, all);
    }
    if (r < 0) {
        json_decref(all);
        http_unavailable(c, HTTP_BODY_CODE, "list: the control plane cannot read its store");
        return;
    }
    size_t total = json_array_size(all);
    json_t **items = calloc(total ? total : 1, sizeof *items);
    json_t *arr = json_array();
    if (!items || !arr) {
        free(items);
        json_decref(all);
        json_decref(arr);
        http_errno(c, 0, -ENOMEM, "list");
        return;
    }
    for (size_t i = 0; i < total; i++)
        items[i] = json_array_get(all, i);
    qsort(items, total, sizeof *items, by_sandbox_id);
    size_t take = MIN(total, (size_t)limit);
    for (size_t i = 0; i < take; i++)
        json_array_append(arr, items[i]);
    char extra[96] = "";
    if (total > take)
        (void)snprintf(extra, sizeof extra, "x-next-token: %s\r\n",
                       json_string_value(json_object_get(items[take - 1], "sandboxID")));
    free(items);
    json_decref(all);
    _cleanup_free_ char *body = json_dumps(arr, JSON_COMPACT);
    json_decref(arr);
    if (!body)
        http_errno(c, 0, -ENOMEM, "list");
    else
        (void)conn_respond(c, 200, "application/json", body, strlen(body), extra[0] ? extra : NULL);
}

/* Load an E2B sandbox of ns for the loop thread; answers 404 itself. */
static json_t *load_sandbox(control_t *ctl, conn_t *c, const char *ns, const char *id,
                            int64_t *ret_rev)
{
    json_t *job = NULL;
    if (!cap_id_valid(id) || job_load(ctl->store, ns, id, &job, ret_rev) < 0) {
        http_not_found(c, HTTP_BODY_CODE, "sandbox %s not found", id);
        return NULL;
    }
    if (!e2b_job(job) || !sandbox_state(job)) {
        json_decref(job);
        http_not_found(c, HTTP_BODY_CODE, "sandbox %s not found", id);
        return NULL;
    }
    return job;
}

static void kill_sandbox(control_t *ctl, conn_t *c, const char *ns, const char *id)
{
    for (int attempt = 0; attempt < 8; attempt++) {
        int64_t rev;
        json_t *job = load_sandbox(ctl, c, ns, id, &rev);
        if (!job)
            return;
        job_set_desired(job, DESIRED_CANCELED);
        int r = job_save(ctl->store, ns, id, job, rev, NULL);
        json_decref(job);
        if (r == -ESTALE)
            continue;
        if (r < 0) {
            http_internal_error(c, HTTP_BODY_CODE, "kill: %s", strerror(-r));
            return;
        }
        log_info("e2b: sandbox %s/%s killed", ns, id);
        control_kick(ctl);
        (void)conn_respond(c, 204, NULL, NULL, 0, NULL);
        return;
    }
    http_unavailable(c, HTTP_BODY_CODE, "kill: too much contention on the sandbox's record");
}

typedef struct {
    char ns[64], id[32], op[16];
} body_ctx_t;

/* timeout and pause: a change of the job record, answered 204 */
static void change_done(conn_t *c)
{
    control_t *ctl = c->srv->app;
    body_ctx_t *bx = c->hdata;
    json_t *b = c->body.len ? json_loadb(buf_head(&c->body), c->body.len, 0, NULL) : NULL;
    json_int_t secs = -1;
    if (streq(bx->op, "timeout") &&
        (json_unpack(b, "{s:I}", "timeout", &secs) < 0 || secs < 0 || secs > 7 * 86400)) {
        json_decref(b);
        http_bad_request(c, HTTP_BODY_CODE, "timeout: expected {\"timeout\": 0..604800 seconds}");
        return;
    }
    json_decref(b);
    for (int attempt = 0; attempt < 8; attempt++) {
        int64_t rev;
        json_t *job = load_sandbox(ctl, c, bx->ns, bx->id, &rev);
        if (!job)
            return;
        if (streq(bx->op, "pause")) {
            if (streq(sandbox_state(job), "paused")) {
                json_decref(job);
                http_conflict(c, HTTP_BODY_CODE, "sandbox %s is paused already", bx->id);
                return;
            }
            job_set_desired(job, DESIRED_PAUSED);
        } else {
            /* the job ends `timeout` seconds after it started: make that s from now */
            int64_t started = jint(job, "started_ms") ?: jint(job, "created_ms");
            int64_t t = (wall_ms() - started) / 1000 + secs;
            json_object_set_new(job, "timeout", json_integer(MAX(1, t)));
        }
        int r = job_save(ctl->store, bx->ns, bx->id, job, rev, NULL);
        json_decref(job);
        if (r == -ESTALE)
            continue;
        if (r < 0) {
            http_internal_error(c, HTTP_BODY_CODE, "%s: %s", bx->op, strerror(-r));
            return;
        }
        control_kick(ctl);
        if (streq(bx->op, "pause")) { /* answered once paused */
            principal_t pr = { .role = ROLE_WRITE };
            e2b_arg_t *a = new_arg(&pr, bx->id);
            if (!a) {
                http_internal_error(c, HTTP_BODY_CODE, "out of memory");
                return;
            }
            (void)snprintf(a->ns, sizeof a->ns, "%s", bx->ns);
            conn_set_handler(c, NULL, NULL);
            free(bx);
            work_submit(ctl, c, a->ns, HTTP_BODY_CODE, pause_wait_fn, a, arg_free);
            return;
        }
        (void)conn_respond(c, 204, NULL, NULL, 0, NULL);
        return;
    }
    http_unavailable(c, HTTP_BODY_CODE, "%s: too much contention on the sandbox's record", bx->op);
}

static e2b_arg_t *new_arg(const principal_t *pr, const char *id)
{
    e2b_arg_t *a = calloc(1, sizeof *a);
    if (!a)
        return NULL;
    (void)snprintf(a->ns, sizeof a->ns, "%s", caller_ns(pr));
    (void)snprintf(a->principal, sizeof a->principal, "%s", pr->principal);
    if (id)
        (void)snprintf(a->id, sizeof a->id, "%s", id);
    a->role = pr->role;
    return a;
}

static void submit_done(conn_t *c)
{
    control_t *ctl = c->srv->app;
    e2b_arg_t *a = c->hdata;
    conn_set_handler(c, NULL, NULL);
    a->body = malloc(c->body.len + 1);
    if (!a->body) {
        arg_free(a);
        http_internal_error(c, HTTP_BODY_CODE, "out of memory");
        return;
    }
    memcpy(a->body, buf_head(&c->body), c->body.len);
    a->body_len = c->body.len;
    work_submit(ctl, c, a->ns, HTTP_BODY_CODE, a->id[0] ? connect_fn : create_fn, a, arg_free);
}

static void submit_arg_close(conn_t *c, bool aborted)
{
    (void)aborted;
    arg_free(c->hdata);
    c->hdata = NULL;
}
static const handler_ops_t submit_ops = { .on_close = submit_arg_close };

/* /sandboxes/{id}[/op] of a pooled sandbox (e2bpool.c): it has no lifetime to move and cannot
 * pause; detail, kill and connect work as for a dedicated one. */
static bool pooled_route(control_t *ctl, conn_t *c, const char *id, const char *op)
{
    sv_t m = c->req.method;
    bool get = sv_eq(m, SV("GET")), post = sv_eq(m, SV("POST")), del = sv_eq(m, SV("DELETE"));
    principal_t pr;
    if (!e2b_auth(ctl, c, get ? ROLE_READ : ROLE_WRITE, &pr))
        return true;
    if (!op[0] && get) {
        e2b_pool_detail(ctl, c, caller_ns(&pr), id);
        return true;
    }
    bool kill = !op[0] && del, connect = post && streq(op, "connect");
    if (kill || connect) {
        e2b_pool_arg_t *a = calloc(1, sizeof *a);
        if (!a) {
            http_internal_error(c, HTTP_BODY_CODE, "out of memory");
            return true;
        }
        (void)snprintf(a->ns, sizeof a->ns, "%s", caller_ns(&pr));
        (void)snprintf(a->id, sizeof a->id, "%s", id);
        work_submit(ctl, c, a->ns, HTTP_BODY_CODE, kill ? e2b_pool_kill_fn : e2b_pool_connect_fn, a,
                    free);
        return true;
    }
    if (post && (streq(op, "timeout") || streq(op, "pause") || streq(op, "resume"))) {
        http_bad_request(
            c, HTTP_BODY_CODE,
            "sandbox %s is pooled: it ends after its idle timeout (the create's timeout) "
            "and cannot pause or resume",
            id);
        return true;
    }
    http_error(c, op[0] ? HTTP_NOT_FOUND : HTTP_METHOD_NOT_ALLOWED, HTTP_BODY_CODE,
               op[0] ? "no such route" : "method not allowed");
    return true;
}

/* Whether path is one of the E2B control API's: /sandboxes[/...] or /v2/sandboxes[/...]. */
bool e2b_route(control_t *ctl, conn_t *c)
{
    sv_t path = c->req.path, m = c->req.method;
    bool v2 = sv_has_prefix(path, SV("/v2/sandboxes"));
    sv_t rest;
    if (v2)
        rest = sv_make(path.p + 13, path.len - 13);
    else if (sv_has_prefix(path, SV("/sandboxes")))
        rest = sv_make(path.p + 10, path.len - 10);
    else
        return false;
    if (rest.len && rest.p[0] != '/')
        return false;
    bool get = sv_eq(m, SV("GET")), post = sv_eq(m, SV("POST")), del = sv_eq(m, SV("DELETE"));
    char id[32] = "", op[16] = "";
    if (rest.len > 1) {
        sv_t r = sv_make(rest.p + 1, rest.len - 1);
        const char *slash = memchr(r.p, '/', r.len);
        size_t il = slash ? (size_t)(slash - r.p) : r.len;
        size_t ol = slash ? r.len - il - 1 : 0;
        if (il == 0 || il >= sizeof id || ol >= sizeof op || memchr(r.p, 0, r.len)) {
            http_not_found(c, HTTP_BODY_CODE, "no such route");
            return true;
        }
        memcpy(id, r.p, il);
        if (ol)
            memcpy(op, slash + 1, ol);
    }
    principal_t pr;
    if (!id[0] && (post || get)) {
        if (!e2b_auth(ctl, c, post ? ROLE_WRITE : ROLE_READ, &pr))
            return true;
        if (get) {
            list_sandboxes(ctl, c, caller_ns(&pr), v2);
            return true;
        }
        e2b_arg_t *a = new_arg(&pr, NULL);
        if (!a) {
            http_internal_error(c, HTTP_BODY_CODE, "out of memory");
            return true;
        }
        a->v2 = v2;
        conn_set_handler(c, &submit_ops, a);
        conn_collect_body(c, E2B_BODY_MAX, submit_done);
        return true;
    }
    if (!id[0]) {
        http_method_not_allowed(c, HTTP_BODY_CODE, "method not allowed");
        return true;
    }
    if (e2b_pooled_id(id))
        return pooled_route(ctl, c, id, op);
    if (!op[0] && (get || del)) {
        if (!e2b_auth(ctl, c, get ? ROLE_READ : ROLE_WRITE, &pr))
            return true;
        if (del) {
            kill_sandbox(ctl, c, caller_ns(&pr), id);
            return true;
        }
        json_t *job = load_sandbox(ctl, c, caller_ns(&pr), id, NULL);
        if (job) {
            conn_respond_json(c, 200, listed_json(ctl, job, true));
            json_decref(job);
        }
        return true;
    }
    if (post && (streq(op, "timeout") || streq(op, "pause"))) {
        if (!e2b_auth(ctl, c, ROLE_WRITE, &pr))
            return true;
        body_ctx_t *bx = calloc(1, sizeof *bx);
        if (!bx) {
            http_internal_error(c, HTTP_BODY_CODE, "out of memory");
            return true;
        }
        (void)snprintf(bx->ns, sizeof bx->ns, "%s", caller_ns(&pr));
        (void)snprintf(bx->id, sizeof bx->id, "%s", id);
        (void)snprintf(bx->op, sizeof bx->op, "%s", op);
        conn_set_handler(c, &ctl_hdata_free_ops, bx);
        conn_collect_body(c, 4096, change_done);
        return true;
    }
    if (post && (streq(op, "connect") || streq(op, "resume"))) {
        if (!e2b_auth(ctl, c, ROLE_WRITE, &pr))
            return true;
        e2b_arg_t *a = new_arg(&pr, id);
        if (!a) {
            http_internal_error(c, HTTP_BODY_CODE, "out of memory");
            return true;
        }
        a->resume = streq(op, "resume");
        conn_set_handler(c, &submit_ops, a);
        conn_collect_body(c, 4096, submit_done);
        return true;
    }
    http_error(c, op[0] ? HTTP_NOT_FOUND : HTTP_METHOD_NOT_ALLOWED, HTTP_BODY_CODE,
               op[0] ? "no such route" : "method not allowed");
    return true;
}
