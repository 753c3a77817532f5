/* SPDX-License-Identifier: MIT */
/* Store records of the control plane, as JSON:
 *   jobs/<ns>/<id>     the job (never its secrets)
 *   secrets/<id>       the job's secrets, sealed (jobs.c; only the reconciler opens them, to
 *                      install a run)
 *   runs/<id>          the run record: which incarnation serves the job, on which node
 *   nodes/<name>       a registered node: address, token hash, last heartbeat
 *   tokens/<sha256>    a principal's API token (hash only)
 *   signing-keys/<kid> Ed25519 signing keys, the secret part sealed (keys.c) */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cap/runjson.h"
#include "common/log.h"
#include "control.h"

int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

bool valid_name(const char *s, size_t max)
{
    size_t n = strlen(s);
    if (n == 0 || n > max || !(islower((unsigned char)s[0]) || isdigit((unsigned char)s[0])))
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (!(islower(ch) || isdigit(ch) || ch == '.' || ch == '_' || ch == '-'))
            return false;
    }
    return true;
}

static int copy_field(char *dst, size_t cap, const char *src)
{
    if (!src || strlen(src) >= cap)
        return -EINVAL;
    memcpy(dst, src, strlen(src) + 1);
    return 0;
}

int control_heartbeat(store_t *st, const char *instance)
{
    char key[64], v[64];
    (void)snprintf(key, sizeof key, "controls/%s", instance);
    int n = snprintf(v, sizeof v, "{\"last_seen_ms\":%lld}", (long long)wall_ms());
    return store_cas(st, key, v, (size_t)n, STORE_REV_ANY, NULL);
}

bool control_alive(store_t *st, const char *instance)
{
    char key[64];
    store_kv_t kv;
    (void)snprintf(key, sizeof key, "controls/%s", instance);
    if (store_get(st, key, &kv) < 0)
        return false;
    json_t *j = json_loadb(kv.value, kv.value_len, 0, NULL);
    store_kv_clear(&kv);
    json_int_t seen = json_integer_value(json_object_get(j, "last_seen_ms"));
    json_decref(j);
    return wall_ms() - seen < CTL_ALIVE_MS;
}

bool control_gone(store_t *st, const char *instance)
{
    char key[64];
    store_kv_t kv;
    (void)snprintf(key, sizeof key, "controls/%s", instance);
    int r = store_get(st, key, &kv);
    if (r < 0)
        return r == -ENOENT;
    json_t *j = json_loadb(kv.value, kv.value_len, 0, NULL);
    store_kv_clear(&kv);
    json_int_t seen = json_integer_value(json_object_get(j, "last_seen_ms"));
    json_decref(j);
    return wall_ms() - seen >= CTL_ALIVE_MS;
}

int runrec_load(store_t *st, const char *job, runrec_t *ret, int64_t *ret_rev)
{
    char key[128];
    store_kv_t kv;
    (void)snprintf(key, sizeof key, "runs/%s", job);
    int r = store_get(st, key, &kv);
    if (r < 0)
        return r;
    json_t *j = json_loadb(kv.value, kv.value_len, 0, NULL);
    int64_t rev = kv.rev;
    store_kv_clear(&kv);
    runrec_t rr = { 0 };
    const char *state, *host, *ns = "";
    json_int_t port, attempts = 0, updated = 0, next_try = 0, first_fail = 0;
    json_t *prev = NULL, *from = NULL;
    const char *owner = "";
    r = -EIO;
    if (json_unpack(j, "{s:s,s:s,s:I,s?I,s?I,s?o,s?s,s?o,s?I,s?I,s?s}", "state", &state, "host",
                    &host, "port", &port, "attempts", &attempts, "updated_ms", &updated, "prev",
                    &prev, "ns", &ns, "from", &from, "next_try_ms", &next_try, "first_fail_ms",
                    &first_fail, "owner", &owner) == 0 &&
        copy_field(rr.owner, sizeof rr.owner, owner) == 0 &&
        cap_run_from_json(json_object_get(j, "run"), &rr.run) == 0 &&
        runrec_state_from_string(state, &rr.state) == 0 &&
        copy_field(rr.host, sizeof rr.host, host) == 0 &&
        copy_field(rr.ns, sizeof rr.ns, ns) == 0) {
        rr.port = (uint16_t)port;
        rr.attempts = (int)attempts;
        rr.updated_ms = updated;
        rr.next_try_ms = next_try;
        rr.first_fail_ms = first_fail;
        r = 0;
        const char *fh;
        json_int_t fp;
        if (json_is_object(from) && json_unpack(from, "{s:s,s:I}", "host", &fh, "port", &fp) == 0 &&
            cap_run_from_json(json_object_get(from, "run"), &rr.from) == 0 &&
            copy_field(rr.from_host, sizeof rr.from_host, fh) == 0) {
            rr.has_from = true;
            rr.from_port = (uint16_t)fp;
        }
        if (json_is_object(prev)) {
            const char *ph;
            json_int_t pp;
            if (json_unpack(prev, "{s:s,s:I}", "host", &ph, "port", &pp) == 0 &&
                cap_run_from_json(json_object_get(prev, "run"), &rr.prev) == 0 &&
                copy_field(rr.prev_host, sizeof rr.prev_host, ph) == 0) {
                rr.has_prev = true;
                rr.prev_port = (uint16_t)pp;
            }
        }
    }
    json_decref(j);
    if (r == 0) {
        *ret = rr;
        if (ret_rev)
            *ret_rev = rev;
    }
    return r;
}

int job_stage_of(json_t *job, job_stage_t *ret)
{
    return job_stage_from_string(json_string_value(json_object_get(job, "stage")), ret);
}

int job_desired_of(json_t *job, job_desired_t *ret)
{
    return job_desired_from_string(json_string_value(json_object_get(job, "desired")), ret);
}

void job_set_stage(json_t *job, job_stage_t s)
{
    json_object_set_new(job, "stage", json_string(job_stage_to_string(s)));
}

void job_set_desired(json_t *job, job_desired_t d)
{
    json_object_set_new(job, "desired", json_string(job_desired_to_string(d)));
}

int runrec_set_state(runrec_t *r, runrec_state_t to)
{
    if (!runrec_transition_ok(r->state, to)) {
        log_error("run %s generation %llu: %s -> %s is not a transition of a run record: refused",
                  r->run.sandbox, (unsigned long long)r->run.generation,
                  runrec_state_to_string(r->state) ?: "none", runrec_state_to_string(to) ?: "?");
        return -EINVAL;
    }
    r->state = to;
    return 0;
}

int runrec_cas(store_t *st, const char *job, const runrec_t *r, int64_t expect, int64_t *ret_rev)
{
    char key[128];
    (void)snprintf(key, sizeof key, "runs/%s", job);
    const char *state = runrec_state_to_string(r->state);
    if (!state) /* RR_NONE: nothing to write */
        return -EINVAL;
    json_t *j = json_pack("{s:o,s:s,s:s,s:i,s:i,s:I,s:s}", "run", cap_run_to_json(&r->run), "state",
                          state, "host", r->host, "port", r->port, "attempts", r->attempts,
                          "updated_ms", (json_int_t)wall_ms(), "ns", r->ns);
    if (j && r->owner[0])
        json_object_set_new(j, "owner", json_string(r->owner));
    if (j && r->has_from)
        json_object_set_new(j, "from",
                            json_pack("{s:o,s:s,s:i}", "run", cap_run_to_json(&r->from), "host",
                                      r->from_host, "port", r->from_port));
    if (j && (r->next_try_ms || r->first_fail_ms)) {
        json_object_set_new(j, "next_try_ms", json_integer(r->next_try_ms));
        json_object_set_new(j, "first_fail_ms", json_integer(r->first_fail_ms));
    }
    if (j && r->has_prev)
        json_object_set_new(j, "prev",
                            json_pack("{s:o,s:s,s:i}", "run", cap_run_to_json(&r->prev), "host",
                                      r->prev_host, "port", r->prev_port));
    char *v = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!v)
        return -ENOMEM;
    int rc = store_cas(st, key, v, strlen(v), expect, ret_rev);
    free(v);
    return rc;
}

int record_load(store_t *st, const char *key, json_t **ret, int64_t *ret_rev)
{
    store_kv_t kv;
    *ret = NULL; /* on every path: callers json_decref what they got */
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

int record_save(store_t *st, const char *key, json_t *j, int64_t expect, int64_t *ret_rev)
{
    _cleanup_free_ char *v = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    if (!v)
        return -ENOMEM;
    return store_cas(st, key, v, strlen(v), expect, ret_rev);
}

int job_load(store_t *st, const char *ns, const char *id, json_t **ret, int64_t *ret_rev)
{
    char key[192];
    (void)snprintf(key, sizeof key, "jobs/%s/%s", ns, id);
    return record_load(st, key, ret, ret_rev);
}

int job_save(store_t *st, const char *ns, const char *id, json_t *job, int64_t expect,
             int64_t *ret_rev)
{
    char key[192];
    (void)snprintf(key, sizeof key, "jobs/%s/%s", ns, id);
    return record_save(st, key, job, expect, ret_rev);
}

int job_cancel(store_t *st, const char *ns, const char *id)
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

/* ---- store errors as statuses: the one table ------------------------------------------------ */

int status_from_store_err(int r)
{
    switch (r) {
    case -ENOENT: return HTTP_NOT_FOUND;       /* no such record */
    case -ESTALE: return HTTP_CONFLICT;        /* the record changed meanwhile */
    case -EBADMSG: return HTTP_INTERNAL_ERROR; /* a record this control plane cannot read */
    default: return HTTP_UNAVAILABLE;          /* no answer about the record: the store failed */
    }
}

void respond_store_err(conn_t *c, int r, const char *what, const char *fmt, ...)
{
    int status = status_from_store_err(r);
    if (status == HTTP_NOT_FOUND) {
        va_list ap;
        va_start(ap, fmt);
        http_verror(c, status, 0, fmt, ap);
        va_end(ap);
        return;
    }
    log_warn("%s: the store: %s", what, strerror(-r));
    if (status == HTTP_UNAVAILABLE)
        http_unavailable(c, HTTP_RETRY_SOON, "the control plane cannot read its store");
    else if (status == HTTP_CONFLICT)
        http_conflict(c, 0, "%s: the record changed meanwhile; try again", what);
    else
        http_error(c, status, 0, "%s: its record cannot be read", what);
}
