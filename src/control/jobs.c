/* SPDX-License-Identifier: MIT */
/* The Jobs API (in the spirit of Hugging Face Jobs):
 *   POST /v1/jobs/{ns}                          create      (write)
 *   GET  /v1/jobs/{ns}[?label=k=v&label=k]      list        (read)
 *   GET  /v1/jobs/{ns}/{id}                     inspect     (read)
 *   POST /v1/jobs/{ns}/{id}/{cancel|pause|resume|move}     (write)
 *   ANY  /v1/jobs/{ns}/{id}/proxy/{port}/...    edge proxy  (read)
 * A job's secrets are stored apart (secrets/<id>, sealed under the secrets key: seal.h), handed
 * to the node only as the command's environment, and never returned, logged, or allowed as
 * label values. Lifecycle actions only
 * record what is wanted (desired, move_to); the reconciler makes it so and moves the stage. */
#include <ctype.h>
#include <sodium.h>
#include <stdio.h>

#include "cap/egress.h"
#include "cap/imagename.h"
#include "common/log.h"
#include "control.h"

#define JOB_BODY_MAX (256 * 1024)
#define LABELS_MAX 64
#define EXPOSE_MAX 16

static bool str_clean(json_t *v, size_t max)
{
    if (!json_is_string(v) || json_string_length(v) > max)
        return false;
    const char *s = json_string_value(v);
    return strlen(s) == json_string_length(v); /* no NUL inside */
}

/* The agent's settings that are the platform's: where it listens, whether it is a pool host
 * and how that confines its sandboxes, and test hooks. A job's env and secrets are also the
 * agent's environment; its tunables (SBX_IDLE_TIMEOUT, SBX_CAPACITY, SBX_MAX_CONNECTIONS,
 * SBX_LOG_LEVEL) stay the job's to set. */
static bool env_reserved(const char *k)
{
    static const char *const names[] = { "SBX_LISTEN",        "SBX_HOST_MODE",
                                         "SBX_BIND",          "SBX_PORT",
                                         "SBX_POOL_UID_BASE", "SBX_POOL_UID_COUNT",
                                         "SBX_HOMES_DIR",     "SBX_MIN_LANDLOCK_ABI" };
    for (size_t i = 0; i < ELEMENTSOF(names); i++)
        if (streq(k, names[i]))
            return true;
    return strncmp(k, "SBX_TEST_", 9) == 0;
}

const char *check_env(json_t *o, const char *what)
{
    const char *k;
    json_t *v;
    if (!o)
        return NULL;
    if (!json_is_object(o) || json_object_size(o) > 256)
        return what;
    json_object_foreach(o, k, v) {
        if (!env_name_valid(k) || env_reserved(k) || !str_clean(v, 64 * 1024))
            return what;
    }
    return NULL;
}

static bool label_key_ok(const char *k)
{
    size_t n = strlen(k);
    if (n == 0 || n > 63)
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)k[i];
        if (!(isalnum(ch) || ch == '.' || ch == '_' || ch == '-' || ch == '/'))
            return false;
    }
    return true;
}

static const char *check_labels(json_t *labels, json_t *secrets)
{
    const char *k, *sk;
    json_t *v, *sv;
    if (!labels)
        return NULL;
    if (!json_is_object(labels) || json_object_size(labels) > LABELS_MAX)
        return "labels: an object of at most 64 string values";
    json_object_foreach(labels, k, v) {
        if (!label_key_ok(k) || !str_clean(v, 256))
            return "labels: keys [A-Za-z0-9._/-]{1,63}, string values of at most 256 bytes";
        json_object_foreach(secrets, sk, sv) {
            if (json_string_length(sv) > 0 && json_equal(v, sv))
                return "labels: a label must not carry a secret's value";
        }
    }
    return NULL;
}

static const char *check_expose(json_t *ex)
{
    size_t i;
    json_t *e;
    if (!json_is_array(ex) || json_array_size(ex) > EXPOSE_MAX)
        return "expose: an array of at most 16 {port, protocol}";
    json_array_foreach(ex, i, e) {
        json_int_t port;
        const char *proto = "http";
        if (json_unpack(e, "{s:I,s?s!}", "port", &port, "protocol", &proto) < 0 || port < 1 ||
            port > 65535 || (!streq(proto, "http") && !streq(proto, "websocket")))
            return "expose: entries {port: 1..65535, protocol: \"http\"|\"websocket\"}";
    }
    return NULL;
}

/* Flavors: resources and network of a run. */
static json_t *flavor_limits(const char *name)
{
    static const struct {
        const char *name;
        int mem_mb, pids, cpu_milli, disk_mb;
    } f[] = { { "cpu-small", 512, 256, 500, 4096 },
              { "cpu-basic", 2048, 1024, 1000, 16384 },
              { "cpu-large", 8192, 4096, 2000, 65536 } };
    char base[32];
    size_t n = strlen(name);
    if (n >= sizeof base)
        return NULL;
    memcpy(base, name, n + 1);
    /* the old "-nonet" suffix is accepted: every run has only loopback now */
    if (n > 6 && streq(base + n - 6, "-nonet"))
        base[n - 6] = 0;
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (streq(f[i].name, base))
            return json_pack("{s:s,s:i,s:i,s:i,s:i}", "name", name, "memory_mb", f[i].mem_mb,
                             "pids", f[i].pids, "cpu_milli", f[i].cpu_milli, "disk_mb",
                             f[i].disk_mb);
    return NULL;
}

static const char job_oom[] = "out of memory";

/* Validate a create request and split it into the job record and its secrets: NULL, or what is
 * wrong (job_oom: no memory). */
static const char *job_validate(json_t *b, const char *default_image, json_t **ret_job,
                                json_t **ret_secrets)
{
    const char *image = default_image, *substrate = "process", *flavor = "cpu-basic";
    const char *mode = "dedicated", *network = "none", *on_loss = "wait";
    json_t *command = NULL, *env = NULL, *secrets = NULL, *labels = NULL, *expose = NULL;
    json_t *allow = NULL;
    json_int_t timeout = 0;
    const char *e;
    if (!json_is_object(b) ||
        json_unpack(b, "{s?s,s?s,s?s,s?s,s?s,s?o,s?o,s?o,s?o,s?o,s?o,s?I,s?s!}", "image", &image,
                    "substrate", &substrate, "flavor", &flavor, "mode", &mode, "network", &network,
                    "egress_allow", &allow, "command", &command, "env", &env, "secrets", &secrets,
                    "labels", &labels, "expose", &expose, "timeout", &timeout, "on_node_loss",
                    &on_loss) < 0)
        return "expected {image, substrate, flavor, mode, network, egress_allow, command, env, "
               "secrets, labels, expose, timeout, on_node_loss} (unknown fields are refused)";
    if (!streq(on_loss, "wait") && !streq(on_loss, "restart") && !streq(on_loss, "fail"))
        return "on_node_loss: \"wait\" (the default: for the node and the run's root), "
               "\"restart\" (a fresh run elsewhere) or \"fail\"";
    if (!streq(substrate, "process"))
        return "substrate: only \"process\" is available on this platform";
    if (!streq(mode, "dedicated") && !streq(mode, "pool"))
        return "mode: \"dedicated\" (one sandbox) or \"pool\" (a pool host)";
    if (streq(mode, "pool") && json_array_size(command) > 0)
        return "command: a pool job runs the platform's agent; it takes no command";
    if (!streq(network, "none") && !streq(network, "egress"))
        return "network: \"none\" (loopback only, the default) or \"egress\"";
    if (allow && !streq(network, "egress"))
        return "egress_allow: only with network \"egress\"";
    if (allow && (!json_is_array(allow) || json_array_size(allow) > EGRESS_ALLOW_MAX))
        return "egress_allow: an array of at most 64 \"CIDR[:PORT]\" strings";
    size_t ai;
    json_t *ae;
    json_array_foreach(allow, ai, ae) {
        egress_rule_t rule;
        if (!json_is_string(ae) || egress_rule_parse(json_string_value(ae), &rule) < 0)
            return "egress_allow: entries are \"CIDR\" or \"CIDR:PORT\" (\"[CIDR]:PORT\" for "
                   "IPv6), host bits zero, e.g. \"203.0.113.0/24:443\"";
    }
    if (!streq(image, "host") && !image_name_valid(image))
        return "image: \"host\" or an image name ([a-z0-9][a-z0-9._-]*, at most 63 bytes)";
    json_t *fl = flavor_limits(flavor);
    if (!fl)
        return "flavor: one of cpu-small, cpu-basic, cpu-large (optionally with -nonet)";
    size_t i;
    json_t *a;
    if (command && (!json_is_array(command) || json_array_size(command) > 256)) {
        json_decref(fl);
        return "command: an array of strings";
    }
    json_array_foreach(command, i, a) {
        if (!str_clean(a, 64 * 1024)) {
            json_decref(fl);
            return "command: an array of strings";
        }
    }
    if ((e = check_env(env, "env: names [A-Za-z_][A-Za-z0-9_]*, string values (the agent's "
                            "SBX_LISTEN, SBX_HOST_MODE, SBX_BIND, SBX_PORT, SBX_POOL_UID_*, "
                            "SBX_HOMES_DIR, SBX_MIN_LANDLOCK_ABI and SBX_TEST_* are the "
                            "platform's: a pool host is mode \"pool\")")) ||
        (e = check_env(secrets, "secrets: names [A-Za-z_][A-Za-z0-9_]*, string values (not "
                                "the agent's reserved SBX_* settings)")) ||
        (e = check_labels(labels, secrets)) || (expose && (e = check_expose(expose))) ||
        (timeout < 0 || timeout > 7 * 86400 ? (e = "timeout: 0..604800 seconds") : NULL)) {
        json_decref(fl);
        return e;
    }
    const char *k;
    json_t *v;
    json_object_foreach(secrets, k, v) {
        if (json_object_get(env, k)) {
            json_decref(fl);
            return "secrets and env must not share a name";
        }
    }
    /* "o" steals a reference: the request's values get one more, defaults are new */
    json_t *job = json_pack(
        "{s:s,s:s,s:s,s:s,s:o,s:o,s:o,s:o,s:o,s:o,s:I}", "image", image, "substrate", substrate,
        "mode", mode, "network", network, "egress_allow", allow ? json_incref(allow) : json_array(),
        "flavor", fl, "command", command ? json_incref(command) : json_array(), "env",
        env ? json_incref(env) : json_object(), "labels",
        labels ? json_incref(labels) : json_object(), "expose",
        expose ? json_incref(expose) : json_pack("[{s:i,s:s}]", "port", 49983, "protocol", "http"),
        "timeout", timeout);
    if (job)
        json_object_set_new(job, "on_node_loss", json_string(on_loss));
    if (!job)
        return job_oom;
    *ret_job = job;
    *ret_secrets = secrets ? json_incref(secrets) : json_object();
    return NULL;
}

int job_from_request(json_t *b, const char *default_image, json_t **ret_job, json_t **ret_secrets,
                     sbx_err_t *err)
{
    const char *e = job_validate(b, default_image, ret_job, ret_secrets);
    if (e)
        return sbx_err(err, e == job_oom ? -ENOMEM : -EINVAL, "%s", e);
    return 0;
}

/* ---- secrets/<id> ------------------------------------------------------------------------- */

int sealed_put(store_t *st, const seal_keys_t *seal, const char *key, json_t *secrets,
               int64_t expect)
{
    char *pt = json_dumps(secrets, JSON_COMPACT), *v;
    if (!pt)
        return -ENOMEM;
    int r = seal_value(seal, key, pt, strlen(pt), &v);
    sodium_memzero(pt, strlen(pt));
    free(pt);
    if (r < 0)
        return r;
    r = store_cas(st, key, v, strlen(v), expect, NULL);
    free(v);
    return r;
}

int job_secrets_put(store_t *st, const seal_keys_t *seal, const char *id, json_t *secrets)
{
    char key[64];
    (void)snprintf(key, sizeof key, "secrets/%s", id);
    return sealed_put(st, seal, key, secrets, STORE_REV_ABSENT);
}

/* Open one record; re-seal it when it is plaintext or under an older key. */
static int secrets_open(store_t *st, const seal_keys_t *seal, const store_kv_t *kv, json_t **ret)
{
    json_t *j = NULL;
    size_t idx = 0;
    bool plain = !seal_is_sealed(kv->value, kv->value_len);
    if (plain) { /* written before secrets at rest: accepted once, re-sealed below */
        j = json_loadb(kv->value, kv->value_len, 0, NULL);
    } else {
        char *pt;
        size_t n;
        int r = seal_open(seal, kv->key, kv->value, kv->value_len, &pt, &n, &idx);
        if (r < 0) {
            log_error("%s: %s", kv->key,
                      r == -EBADMSG  ? "cannot decrypt: altered, or moved from another record"
                      : r == -ENOKEY ? "sealed under a secrets key the key file does not hold"
                                     : "malformed sealed value");
            return r;
        }
        j = json_loadb(pt, n, 0, NULL);
        sodium_memzero(pt, n);
        free(pt);
    }
    if (!json_is_object(j)) {
        json_decref(j);
        log_error("%s: not a JSON object of secrets", kv->key);
        return -EBADMSG;
    }
    if (plain || idx != 0) {
        int r = sealed_put(st, seal, kv->key, j, kv->rev);
        if (r >= 0)
            log_warn("%s: %s, re-sealed under secrets key %s", kv->key,
                     plain ? "plaintext (written before secrets at rest)" : "an older secrets key",
                     seal->keys[0].kid);
        else if (r != -ESTALE)
            log_error("%s: cannot re-seal: %s", kv->key, strerror(-r));
    }
    *ret = j;
    return 0;
}

int job_secrets_get(store_t *st, const seal_keys_t *seal, const char *id, json_t **ret)
{
    char key[64];
    (void)snprintf(key, sizeof key, "secrets/%s", id);
    return sealed_get(st, seal, key, ret);
}

int sealed_get(store_t *st, const seal_keys_t *seal, const char *key, json_t **ret)
{
    store_kv_t kv;
    int r = store_get(st, key, &kv);
    if (r < 0)
        return r;
    r = secrets_open(st, seal, &kv, ret);
    sodium_memzero(kv.value, kv.value_len);
    store_kv_clear(&kv);
    return r;
}

int job_secrets_reseal_all(store_t *st, const seal_keys_t *seal, size_t *ret_bad)
{
    store_kv_t *kvs;
    size_t n, bad = 0;
    int r = store_list(st, "secrets/", &kvs, &n);
    if (r < 0)
        return r;
    for (size_t i = 0; i < n; i++) {
        json_t *j;
        if (seal_has_kid(kvs[i].value, kvs[i].value_len, seal->keys[0].kid))
            continue;
        if (secrets_open(st, seal, &kvs[i], &j) < 0)
            bad++;
        else
            json_decref(j);
        sodium_memzero(kvs[i].value, kvs[i].value_len);
    }
    store_kv_free(kvs, n);
    *ret_bad = bad;
    return 0;
}

int job_insert(store_t *st, const seal_keys_t *seal, const char *ns, const char *initiator,
               const char *id, json_t *job, json_t *sec)
{
    json_object_set_new(job, "id", json_string(id));
    json_object_set_new(job, "namespace", json_string(ns));
    json_object_set_new(job, "initiator", json_string(initiator));
    json_object_set_new(job, "created_ms", json_integer(wall_ms()));
    job_set_stage(job, STAGE_SCHEDULING);
    json_object_set_new(job, "message", json_string(""));
    job_set_desired(job, DESIRED_RUNNING);
    json_object_set_new(job, "move_to", json_string(""));
    json_object_set_new(job, "secret_names", json_array());
    const char *k;
    json_t *v;
    json_object_foreach(sec, k, v)
        json_array_append_new(json_object_get(job, "secret_names"), json_string(k));
    int r = job_secrets_put(st, seal, id, sec);
    if (r < 0)
        return r;
    r = job_save(st, ns, id, job, STORE_REV_ABSENT, NULL);
    if (r < 0) { /* no job: its secrets go too */
        char key[64];
        (void)snprintf(key, sizeof key, "secrets/%s", id);
        (void)store_del(st, key, STORE_REV_ANY);
    }
    return r;
}

/* What inspect and list show: the job, its run, never the secrets. */
static json_t *job_view(control_t *ctl, json_t *job)
{
    json_t *v = json_deep_copy(job);
    const char *id = json_string_value(json_object_get(job, "id"));
    runrec_t rr;
    if (v && id && runrec_load(ctl->store, id, &rr, NULL) == 0)
        json_object_set_new(v, "run",
                            json_pack("{s:I,s:s,s:s,s:s,s:s,s:s}", "generation",
                                      (json_int_t)rr.run.generation, "node", rr.run.node,
                                      "substrate", rr.run.substrate, "activation",
                                      rr.run.activation, "instance", rr.run.instance, "state",
                                      runrec_state_to_string(rr.state)));
    return v;
}

typedef struct {
    char ns[64];
    char principal[64];
    role_t role;
} create_ctx_t;

static void create_done(conn_t *c)
{
    control_t *ctl = c->srv->app;
    create_ctx_t *cx = c->hdata;
    json_error_t jerr;
    json_t *b = json_loadb(buf_head(&c->body), c->body.len, 0, &jerr), *job = NULL, *sec = NULL;
    sbx_err_t err;
    int r = b ? job_from_request(b, ctl->cfg.default_image, &job, &sec, &err)
              : sbx_err(&err, -EINVAL, "%s", jerr.text);
    json_decref(b);
    if (r < 0) {
        http_bad_request(c, 0, "create: %s", err.msg);
        return;
    }
    /* An image no live node has verified cannot run anywhere: say so now rather than leave the
     * job waiting for placement. */
    const char *image = json_string_value(json_object_get(job, "image"));
    /* "host" shows the node's own /usr to the run: an operator's choice (the platform's default
     * image) or an admin's, never a tenant's */
    if (streq(image, "host") && cx->role != ROLE_ADMIN && !streq(ctl->cfg.default_image, "host")) {
        http_forbidden(c, 0,
                       "create: image host (the node's own programs) is for admins; "
                       "name an image or leave it out for %s",
                       ctl->cfg.default_image);
        json_decref(job);
        json_decref(sec);
        return;
    }
    uint64_t isize = 0;
    if (!image_on_live_node(ctl->store, image, &isize)) {
        http_bad_request(c, 0, "create: image %s: not available on any node", image);
        json_decref(job);
        json_decref(sec);
        return;
    }
    json_int_t disk_mb =
        json_integer_value(json_object_get(json_object_get(job, "flavor"), "disk_mb"));
    if (isize > (uint64_t)disk_mb << 20) {
        http_bad_request(c, 0,
                         "create: flavor %s: its disk (%lld MiB) is smaller than image %s "
                         "(%llu MiB unpacked)",
                         json_string_value(json_object_get(json_object_get(job, "flavor"), "name")),
                         (long long)disk_mb, image, (unsigned long long)(isize >> 20));
        json_decref(job);
        json_decref(sec);
        return;
    }
    char id[25];
    random_hex(id, 12);
    r = job_insert(ctl->store, &ctl->seal, cx->ns, cx->principal, id, job, sec);
    json_decref(sec);
    if (r < 0) {
        json_decref(job);
        http_errno(c, 0, r, "create");
        return;
    }
    log_info("job %s/%s created by %s", cx->ns, id, cx->principal);
    control_kick(ctl);
    conn_respond_json(c, 201, job);
}

static bool labels_match(json_t *job, const conn_t *c)
{
    const char *q = memchr(c->req.target.p, '?', c->req.target.len);
    if (!q)
        return true;
    sv_t query = sv_make(q + 1, c->req.target.len - (size_t)(q + 1 - c->req.target.p));
    json_t *labels = json_object_get(job, "labels");
    while (query.len) {
        const char *amp = memchr(query.p, '&', query.len);
        sv_t part = sv_make(query.p, amp ? (size_t)(amp - query.p) : query.len);
        query = amp ? sv_make(amp + 1, query.len - part.len - 1) : SV("");
        if (part.len < 6 || memcmp(part.p, "label=", 6) != 0)
            continue;
        char sel[600];
        int n = url_decode(sv_make(part.p + 6, part.len - 6), sel, sizeof sel - 1, true);
        if (n < 0)
            return false;
        sel[n] = 0;
        char *eq = strchr(sel, '=');
        if (eq)
            *eq = 0;
        json_t *v = json_object_get(labels, sel);
        if (!v || (eq && !streq(json_string_value(v), eq + 1)))
            return false;
    }
    return true;
}

static void list_jobs(control_t *ctl, conn_t *c, const char *ns)
{
    char prefix[96];
    (void)snprintf(prefix, sizeof prefix, "jobs/%s/", ns);
    store_kv_t *kvs;
    size_t n;
    int r = store_list(ctl->store, prefix, &kvs, &n);
    if (r < 0) {
        http_errno(c, 0, r, "list");
        return;
    }
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < n; i++) {
        json_t *j = json_loadb(kvs[i].value, kvs[i].value_len, 0, NULL);
        if (j && labels_match(j, c))
            json_array_append_new(arr, job_view(ctl, j));
        json_decref(j);
    }
    store_kv_free(kvs, n);
    conn_respond_json(c, 200, arr);
}

static void action_done(conn_t *c);

typedef struct {
    char ns[64], id[32], action[16];
} action_ctx_t;

/* Record what the caller wants (CAS on the job record) and wake the reconciler. */
static void job_action(control_t *ctl, conn_t *c, const char *ns, const char *id,
                       const char *action, json_t *body)
{
    for (int attempt = 0; attempt < 8; attempt++) {
        json_t *job;
        int64_t rev;
        int r = job_load(ctl->store, ns, id, &job, &rev);
        if (r < 0) { /* a store failure is no answer about the job: not 404 */
            respond_store_err(c, r, "job", "no job %s in namespace %s", id, ns);
            return;
        }
        job_stage_t stage;
        job_desired_t desired;
        if (job_stage_of(job, &stage) < 0 || job_desired_of(job, &desired) < 0) {
            json_decref(job);
            http_internal_error(c, 0, "job %s: its record names no stage or desired state", id);
            return;
        }
        bool ended = job_stage_ended(stage);
        const char *err = NULL;
        if (streq(action, "cancel")) {
            if (!ended || stage == STAGE_ERROR)
                job_set_desired(job, DESIRED_CANCELED);
        } else if (ended || desired == DESIRED_CANCELED) {
            err = "the job has ended";
        } else if (streq(action, "pause")) {
            job_set_desired(job, DESIRED_PAUSED);
        } else if (streq(action, "resume")) {
            if (desired != DESIRED_PAUSED)
                err = "the job is not paused";
            job_set_desired(job, DESIRED_RUNNING);
        } else { /* move */
            const char *to = json_string_value(json_object_get(body, "node"));
            if (to && !cap_id_valid(to))
                err = "move: node must be a node name";
            job_set_desired(job, DESIRED_RUNNING);
            json_object_set_new(job, "move_to", json_string(to ? to : "*"));
        }
        if (err) {
            http_conflict(c, 0, "%s: %s (stage %s)", action, err, job_stage_to_string(stage));
            json_decref(job); /* stage points into it */
            return;
        }
        r = job_save(ctl->store, ns, id, job, rev, NULL);
        if (r == -ESTALE) {
            json_decref(job);
            continue; /* someone else changed it: read again */
        }
        if (r < 0) {
            json_decref(job);
            http_errno(c, 0, r, action);
            return;
        }
        log_info("job %s/%s: %s requested", ns, id, action);
        control_kick(ctl);
        conn_respond_json(c, 202, job_view(ctl, job));
        json_decref(job);
        return;
    }
    http_unavailable(c, 0, "%s: too much contention on the job record", action);
}

static void action_done(conn_t *c)
{
    control_t *ctl = c->srv->app;
    action_ctx_t *ax = c->hdata;
    json_t *body = c->body.len ? json_loadb(buf_head(&c->body), c->body.len, 0, NULL) : NULL;
    if (c->body.len && !json_is_object(body)) {
        json_decref(body);
        http_bad_request(c, 0, "%s: body must be a JSON object", ax->action);
        return;
    }
    job_action(ctl, c, ax->ns, ax->id, ax->action, body);
    json_decref(body);
}

/* rest: what follows /v1/jobs/ */
void route_jobs(control_t *ctl, conn_t *c, sv_t rest)
{
    sv_t seg[4];
    char ns[64], id[32];
    size_t n = path_split(rest, seg, 4);
    bool get = sv_eq(c->req.method, SV("GET")), post = sv_eq(c->req.method, SV("POST"));
    if (n < 1 || !sv_copy(seg[0], ns, sizeof ns) || !valid_name(ns, 63)) {
        http_not_found(c, 0, "expected /v1/jobs/{namespace}[/{id}[/...]]");
        return;
    }
    if (n >= 2 && (!sv_copy(seg[1], id, sizeof id) || !cap_id_valid(id))) {
        http_not_found(c, 0, "no such job");
        return;
    }
    if (n >= 3 && sv_eq(seg[2], SV("proxy"))) {
        /* /v1/jobs/{ns}/{id}/proxy/{port}[/rest] */
        const char *after = seg[2].p + seg[2].len;
        sv_t tail = sv_make(after, (size_t)(rest.p + rest.len - after)); /* "/{port}/..." */
        sv_t num = tail.len > 1 ? sv_make(tail.p + 1, tail.len - 1) : SV("");
        const char *slash = memchr(num.p, '/', num.len);
        sv_t pnum = sv_make(num.p, slash ? (size_t)(slash - num.p) : num.len);
        uint64_t port;
        if (parse_u64(pnum, 65535, &port) < 0 || port == 0) {
            http_not_found(c, 0, "proxy: invalid port (expected 1..65535)");
            return;
        }
        sv_t prest = slash ? sv_make(slash, (size_t)(num.p + num.len - slash)) : SV("");
        /* the role the request's purpose needs (docs/platform.md: read vs write) */
        if (!auth_check(ctl, c, ns, edge_role_needed(c->req.method, (uint16_t)port, prest), NULL))
            return;
        edge_proxy(ctl, c, ns, id, (uint16_t)port, prest, NULL);
        return;
    }
    if (n == 1 && post) {
        principal_t pr;
        if (!auth_check(ctl, c, ns, ROLE_WRITE, &pr))
            return;
        create_ctx_t *cx = calloc(1, sizeof *cx);
        if (!cx) {
            http_errno(c, 0, -ENOMEM, "create");
            return;
        }
        memcpy(cx->ns, ns, strlen(ns) + 1);
        memcpy(cx->principal, pr.principal, strlen(pr.principal) + 1);
        cx->role = pr.role;
        conn_set_handler(c, &ctl_hdata_free_ops, cx);
        conn_collect_body(c, JOB_BODY_MAX, create_done);
    } else if (n == 1 && get) {
        if (auth_check(ctl, c, ns, ROLE_READ, NULL))
            list_jobs(ctl, c, ns);
    } else if (n == 2 && get) {
        if (!auth_check(ctl, c, ns, ROLE_READ, NULL))
            return;
        json_t *job;
        int r = job_load(ctl->store, ns, id, &job, NULL);
        if (r < 0) { /* a store failure is no answer about the job: not 404 */
            respond_store_err(c, r, "job", "no job %s in namespace %s", id, ns);
            return;
        }
        conn_respond_json(c, 200, job_view(ctl, job));
        json_decref(job);
    } else if (n == 3 && post &&
               (sv_eq(seg[2], SV("cancel")) || sv_eq(seg[2], SV("pause")) ||
                sv_eq(seg[2], SV("resume")) || sv_eq(seg[2], SV("move")))) {
        if (!auth_check(ctl, c, ns, ROLE_WRITE, NULL))
            return;
        action_ctx_t *ax = calloc(1, sizeof *ax);
        if (!ax) {
            http_errno(c, 0, -ENOMEM, "action");
            return;
        }
        memcpy(ax->ns, ns, strlen(ns) + 1);
        memcpy(ax->id, id, strlen(id) + 1);
        (void)sv_copy(seg[2], ax->action, sizeof ax->action);
        conn_set_handler(c, &ctl_hdata_free_ops, ax);
        conn_collect_body(c, 4096, action_done);
    } else if (n <= 3) {
        http_method_not_allowed(c, 0, "method not allowed");
    } else {
        http_not_found(c, 0, "no such route");
    }
}
