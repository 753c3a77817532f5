/* SPDX-License-Identifier: MIT */
/* libsbx: sandboxes (dedicated jobs and pooled sandboxes behind one handle), exec with streamed
 * output, background processes. */
#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "common/macro.h"
#include "lib/internal.h"

#define WAIT_DEFAULT_MS 120000

static void jsonp(json_t **j) { json_decref(*j); }
#define _cleanup_json_ _cleanup_(jsonp)

int sandbox_new(sbx_client_t *c, const char *id, const char *pool, sbx_sandbox_t **ret)
{
    sbx_sandbox_t *s = calloc(1, sizeof *s);
    _cleanup_free_ char *eid = url_escape(id), *ens = url_escape(c->ns);
    _cleanup_free_ char *epool = pool ? url_escape(pool) : NULL;
    if (!s || !eid || !ens || (pool && !epool)) {
        free(s);
        return -ENOMEM;
    }
    s->c = c;
    s->id = strdup(id);
    if (pool) {
        s->pool = strdup(pool);
        s->display = strprintf("%s/%s", pool, id);
        s->base = strprintf("/v1/pools/%s/%s/sandboxes/%s", ens, epool, eid);
        s->prefix = s->base ? strdup(s->base) : NULL;
    } else {
        s->display = strdup(id);
        s->base = strprintf("/v1/jobs/%s/%s", ens, eid);
        s->prefix = strprintf("/v1/jobs/%s/%s/proxy/%d/v1", ens, eid, SBX_AGENT_PORT);
    }
    if (!s->id || !s->display || !s->base || !s->prefix || (pool && !s->pool)) {
        sbx_sandbox_free(s);
        return -ENOMEM;
    }
    *ret = s;
    return 0;
}

void sbx_sandbox_free(sbx_sandbox_t *s)
{
    if (!s)
        return;
    free(s->display);
    free(s->id);
    free(s->pool);
    free(s->prefix);
    free(s->base);
    free(s);
}

void sbx_sandbox_list_free(sbx_sandbox_t **list, size_t n)
{
    for (size_t i = 0; list && i < n; i++)
        sbx_sandbox_free(list[i]);
    free(list);
}

const char *sbx_sandbox_id(const sbx_sandbox_t *s) { return s->display; }
const char *sbx_sandbox_pool(const sbx_sandbox_t *s) { return s->pool; }

char *sandbox_route(const sbx_sandbox_t *s, const char *rest)
{
    return strprintf("%s%s", s->prefix, rest);
}

/* The X-Sandbox-Token line of a dedicated sandbox (malloc'd; "" for a pooled one: the edge adds
 * the pooled sandbox's own token itself). */
static char *token_header(const sbx_sandbox_t *s)
{
    return s->pool ? strdup("") : strprintf("X-Sandbox-Token: %s\r\n", s->token);
}

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- dedicated: create, connect, wait, kill ---------------------------------------------------- */

int sbx_sandbox_create(sbx_client_t *c, const sbx_create_opts_t *opts, sbx_sandbox_t **ret,
                       sbx_error_t *err)
{
    sbx_create_opts_t none = { 0 };
    if (!opts)
        opts = &none;
    unsigned char raw[16];
    if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw)
        return err_set(err, -EIO, 0, "cannot read random bytes for the sandbox nonce");
    char nonce[33];
    for (size_t i = 0; i < sizeof raw; i++)
        (void)snprintf(nonce + 2 * i, 3, "%02x", raw[i]);
    char token[65];
    if (sbx_derive_token(c->token, nonce, token) < 0)
        return err_set(err, -EIO, 0, "cannot derive the sandbox token (HMAC failed)");

    _cleanup_json_ json_t *labels = kv_object(opts->labels, opts->n_labels);
    _cleanup_json_ json_t *env = kv_object(opts->env, opts->n_env);
    _cleanup_json_ json_t *secrets = kv_object(opts->secrets, opts->n_secrets);
    if (!labels || !env || !secrets)
        return err_set(err, -EINVAL, 0, "create: a label, env or secret has no key or value");
    const char *k;
    json_t *v;
    json_object_foreach(labels, k, v) {
        if (strncmp(k, "sbx-sandbox", 11) == 0)
            return err_set(err, -EINVAL, 0,
                           "create: label %s is reserved (sbx-sandbox* labels are set by libsbx)",
                           k);
    }
    if (json_object_get(secrets, "SBX_TOKEN"))
        return err_set(err, -EINVAL, 0,
                       "create: secret SBX_TOKEN is reserved (the sandbox token is derived)");
    (void)json_object_set_new(labels, "sbx-sandbox", json_string("1"));
    (void)json_object_set_new(labels, "sbx-sandbox-mode", json_string("dedicated"));
    (void)json_object_set_new(labels, "sbx-sandbox-nonce", json_string(nonce));
    (void)json_object_set_new(secrets, "SBX_TOKEN", json_string(token));
    if (opts->idle_timeout_s) {
        char t[24];
        (void)snprintf(t, sizeof t, "%u", opts->idle_timeout_s);
        (void)json_object_set_new(env, "SBX_IDLE_TIMEOUT", json_string(t));
    }
    _cleanup_json_ json_t *body = json_pack("{s:s,s:s,s:O,s:O,s:O}", "mode", "dedicated", "flavor",
                                            opts->flavor ? opts->flavor : "cpu-small", "labels",
                                            labels, "env", env, "secrets", secrets);
    if (!body || (opts->image && json_object_set_new(body, "image", json_string(opts->image))))
        return err_set(err, -ENOMEM, 0, "out of memory");
    _cleanup_free_ char *ens = url_escape(c->ns);
    _cleanup_free_ char *target = ens ? strprintf("/v1/jobs/%s", ens) : NULL;
    if (!target)
        return err_set(err, -ENOMEM, 0, "out of memory");
    _cleanup_json_ json_t *job = NULL;
    int r = api_json(c, "create sandbox", "POST", target, NULL, body, &job, NULL, err);
    if (r < 0)
        return r;
    const char *id = json_string_value(json_object_get(job, "id"));
    if (!id)
        return err_set(err, -EPROTO, 0, "create sandbox: the platform answered without an id");
    sbx_sandbox_t *s;
    if (sandbox_new(c, id, NULL, &s) < 0)
        return err_set(err, -ENOMEM, 0, "out of memory");
    memcpy(s->token, token, sizeof token);
    if (opts->wait_ms >= 0) {
        r = sbx_sandbox_wait(s, opts->wait_ms, opts->on_progress, opts->userdata, err);
        if (r < 0) {
            sbx_sandbox_free(s);
            return r;
        }
    }
    *ret = s;
    return 0;
}

int sbx_sandbox_wait(sbx_sandbox_t *s, int wait_ms, sbx_progress_fn on_progress, void *userdata,
                     sbx_error_t *err)
{
    if (s->pool)
        return 0; /* a pooled sandbox exists once created */
    int64_t deadline = mono_ms() + (wait_ms > 0 ? wait_ms : WAIT_DEFAULT_MS);
    char last[256] = "";
    for (unsigned i = 0;; i++) {
        _cleanup_json_ json_t *job = NULL;
        int r = api_json(s->c, "wait for sandbox", "GET", s->base, NULL, NULL, &job, NULL, err);
        if (r < 0)
            return r;
        const char *stage = json_string_value(json_object_get(job, "stage"));
        const char *msg = json_string_value(json_object_get(job, "message"));
        const char *state =
            json_string_value(json_object_get(json_object_get(job, "run"), "state"));
        stage = stage ? stage : "?";
        msg = msg ? msg : "";
        char now[256];
        (void)snprintf(now, sizeof now, "%s %s", stage, msg);
        if (on_progress && strcmp(now, last) != 0) {
            on_progress(stage, msg, userdata);
            memcpy(last, now, sizeof now);
        }
        if (strcmp(stage, "RUNNING") == 0 && state && strcmp(state, "running") == 0)
            return 0;
        if (strcmp(stage, "ERROR") == 0 || strcmp(stage, "CANCELED") == 0 ||
            strcmp(stage, "COMPLETED") == 0)
            return err_set(err, -ESRCH, 0,
                           "sandbox %s will not run: its job is %s%s%s (create a new one; `sbx "
                           "jobs inspect %s` shows the record)",
                           s->display, stage, *msg ? ": " : "", msg, s->id);
        if (mono_ms() >= deadline)
            return err_set(err, -ETIMEDOUT, 0,
                           "sandbox %s is not running after %d s (stage %s%s%s); `sbx jobs "
                           "inspect %s` shows why",
                           s->display, (wait_ms > 0 ? wait_ms : WAIT_DEFAULT_MS) / 1000, stage,
                           *msg ? ": " : "", msg, s->id);
        struct timespec ts = { 0, (i < 20 ? 50 : 200) * 1000000L };
        (void)nanosleep(&ts, NULL);
    }
}

/* A bare id that is no job: look for it in every pool. */
static int find_pooled(sbx_client_t *c, const char *id, sbx_sandbox_t **ret, sbx_error_t *err)
{
    _cleanup_free_ char *ens = url_escape(c->ns), *eid = url_escape(id);
    _cleanup_free_ char *t = ens ? strprintf("/v1/pools/%s", ens) : NULL;
    if (!t || !eid)
        return err_set(err, -ENOMEM, 0, "out of memory");
    _cleanup_json_ json_t *pools = NULL;
    sbx_error_t e2;
    if (api_json(c, "list pools", "GET", t, NULL, NULL, &pools, NULL, &e2) >= 0) {
        size_t i;
        json_t *p;
        json_array_foreach(json_object_get(pools, "pools"), i, p) {
            const char *name = json_string_value(json_object_get(p, "name"));
            _cleanup_free_ char *ep = name ? url_escape(name) : NULL;
            _cleanup_free_ char *st =
                ep ? strprintf("/v1/pools/%s/%s/sandboxes/%s", ens, ep, eid) : NULL;
            if (st && api_json(c, "get sandbox", "GET", st, NULL, NULL, NULL, NULL, &e2) >= 0)
                return sandbox_new(c, id, name, ret) < 0 ? err_set(err, -ENOMEM, 0, "out of memory")
                                                         : 0;
        }
    }
    return err_set(err, -ENOENT, 404,
                   "no sandbox %s in namespace %s: neither a job nor a sandbox of a pool (`sbx "
                   "ls` lists them)",
                   id, c->ns);
}

int sbx_sandbox_connect(sbx_client_t *c, const char *id, sbx_sandbox_t **ret, sbx_error_t *err)
{
    if (!id || !*id)
        return err_set(err, -EINVAL, 0, "connect: empty sandbox id");
    const char *slash = strchr(id, '/');
    int r;
    if (slash) {
        _cleanup_free_ char *pool = strndup(id, (size_t)(slash - id));
        if (!pool)
            return err_set(err, -ENOMEM, 0, "out of memory");
        if (!*pool || !slash[1] || strchr(slash + 1, '/'))
            return err_set(err, -EINVAL, 0, "connect: %s is not ID or POOL/ID", id);
        sbx_sandbox_t *s;
        if (sandbox_new(c, slash + 1, pool, &s) < 0)
            return err_set(err, -ENOMEM, 0, "out of memory");
        char what[300];
        (void)snprintf(what, sizeof what, "sandbox %s", id);
        r = api_json(c, what, "GET", s->base, NULL, NULL, NULL, NULL, err);
        if (r < 0) {
            sbx_sandbox_free(s);
            return r;
        }
        *ret = s;
        return 0;
    }
    sbx_sandbox_t *s;
    if (sandbox_new(c, id, NULL, &s) < 0)
        return err_set(err, -ENOMEM, 0, "out of memory");
    _cleanup_json_ json_t *job = NULL;
    char what[300];
    (void)snprintf(what, sizeof what, "sandbox %s", id);
    r = api_json(c, what, "GET", s->base, NULL, NULL, &job, NULL, err);
    if (r == -ENOENT) {
        sbx_sandbox_free(s);
        return find_pooled(c, id, ret, err);
    }
    if (r < 0) {
        sbx_sandbox_free(s);
        return r;
    }
    json_t *labels = json_object_get(job, "labels");
    const char *is = json_string_value(json_object_get(labels, "sbx-sandbox"));
    const char *mode = json_string_value(json_object_get(labels, "sbx-sandbox-mode"));
    const char *nonce = json_string_value(json_object_get(labels, "sbx-sandbox-nonce"));
    if (!is || strcmp(is, "1") != 0 || !nonce || (mode && strcmp(mode, "dedicated") != 0)) {
        sbx_sandbox_free(s);
        return err_set(err, -EINVAL, 0,
                       "job %s is not a dedicated sandbox made by sbx (no sbx-sandbox-nonce "
                       "label%s)",
                       id, mode && strcmp(mode, "pool") == 0 ? "; it is a pool host" : "");
    }
    if (sbx_derive_token(c->token, nonce, s->token) < 0) {
        sbx_sandbox_free(s);
        return err_set(err, -EIO, 0, "cannot derive the sandbox token (HMAC failed)");
    }
    *ret = s;
    return 0;
}

int sbx_sandbox_kill(sbx_sandbox_t *s, sbx_error_t *err)
{
    char what[300];
    (void)snprintf(what, sizeof what, "kill %s", s->display);
    if (s->pool)
        return api_json(s->c, what, "DELETE", s->base, NULL, NULL, NULL, NULL, err);
    _cleanup_free_ char *t = strprintf("%s/cancel", s->base);
    if (!t)
        return err_set(err, -ENOMEM, 0, "out of memory");
    _cleanup_json_ json_t *b = json_object();
    return api_json(s->c, what, "POST", t, NULL, b, NULL, NULL, err);
}

int sbx_sandbox_proxy(sbx_sandbox_t *s, unsigned port, char **ret_url, char **ret_headers,
                      sbx_error_t *err)
{
    if (port < 1 || port > 65535)
        return err_set(err, -EINVAL, 0, "proxy: port %u is not 1..65535", port);
    size_t el = strlen(s->c->endpoint);
    while (el > 0 && s->c->endpoint[el - 1] == '/')
        el--;
    char *url = strprintf("%.*s%s/proxy/%u", (int)el, s->c->endpoint, s->base, port);
    _cleanup_free_ char *th = token_header(s);
    char *hdr = th ? strprintf("%s%s", s->c->auth, th) : NULL;
    if (!url || !hdr) {
        free(url);
        free(hdr);
        return err_set(err, -ENOMEM, 0, "out of memory");
    }
    *ret_url = url;
    *ret_headers = hdr;
    return 0;
}

/* ---- exec and process output: NDJSON events --------------------------------------------------- */

typedef struct {
    const sbx_exec_opts_t *cb;
    sbx_exec_result_t res;
    bool exited;
    char *line;
    size_t len, cap;
    int failed; /* a malformed event */
} stream_t;

static int b64_decode(const char *in, size_t n, unsigned char **ret, size_t *ret_len)
{
    unsigned char *out = malloc(n / 4 * 3 + 3);
    if (!out)
        return -ENOMEM;
    if (n == 0) {
        *ret = out;
        *ret_len = 0;
        return 0;
    }
    if (n % 4) {
        free(out);
        return -EPROTO;
    }
    int l = EVP_DecodeBlock(out, (const unsigned char *)in, (int)n);
    if (l < 0) {
        free(out);
        return -EPROTO;
    }
    size_t pad = (in[n - 1] == '=') + (n > 1 && in[n - 2] == '=');
    *ret = out;
    *ret_len = (size_t)l - pad;
    return 0;
}

static int stream_event(stream_t *st, const char *line, size_t len)
{
    json_t *ev = json_loadb(line, len, 0, NULL);
    if (!json_is_object(ev)) {
        json_decref(ev);
        return -EPROTO;
    }
    const char *kind = json_string_value(json_object_get(ev, "event"));
    int r = 0;
    if (!kind) {
        r = -EPROTO;
    } else if (strcmp(kind, "start") == 0) {
        st->res.pid = (int)json_integer_value(json_object_get(ev, "pid"));
    } else if (strcmp(kind, "stdout") == 0 || strcmp(kind, "stderr") == 0) {
        sbx_output_fn fn = kind[3] == 'o' ? st->cb->on_stdout : st->cb->on_stderr;
        json_t *d = json_object_get(ev, "data");
        if (fn && json_is_string(d)) {
            unsigned char *bytes;
            size_t bl;
            r = b64_decode(json_string_value(d), json_string_length(d), &bytes, &bl);
            if (r >= 0) {
                fn(bytes, bl, st->cb->userdata);
                free(bytes);
            }
        }
    } else if (strcmp(kind, "exit") == 0) {
        json_t *code = json_object_get(ev, "exit_code");
        st->res.exit_code = json_is_integer(code) ? (int)json_integer_value(code) : -1;
        st->res.signal = (int)json_integer_value(json_object_get(ev, "signal"));
        st->res.timed_out = json_is_true(json_object_get(ev, "timed_out"));
        st->res.duration_ms = json_integer_value(json_object_get(ev, "duration_ms"));
        st->exited = true;
    }
    json_decref(ev);
    return r;
}

static int stream_sink(const void *data, size_t n, void *ud)
{
    stream_t *st = ud;
    const char *p = data;
    while (n > 0) {
        const char *nl = memchr(p, '\n', n);
        size_t take = nl ? (size_t)(nl - p) : n;
        if (st->len + take > NDJSON_LINE_MAX)
            return st->failed = -EFBIG;
        if (st->len + take + 1 > st->cap) {
            size_t nc = st->cap ? st->cap : 4096;
            while (nc < st->len + take + 1)
                nc *= 2;
            char *nb = realloc(st->line, nc);
            if (!nb)
                return st->failed = -ENOMEM;
            st->line = nb;
            st->cap = nc;
        }
        memcpy(st->line + st->len, p, take);
        st->len += take;
        p += take;
        n -= take;
        if (nl) {
            p++;
            n--;
            if (st->len > 0) {
                int r = stream_event(st, st->line, st->len);
                if (r < 0)
                    return st->failed = r;
            }
            st->len = 0;
        }
    }
    return 0;
}

static int exec_body(const sbx_exec_opts_t *o, bool background, json_t **ret, sbx_error_t *err)
{
    json_t *b = json_object();
    if (!b)
        return err_set(err, -ENOMEM, 0, "out of memory");
    if (o->cmd && !o->argv) {
        (void)json_object_set_new(b, "cmd", json_string(o->cmd));
    } else if (o->argv && !o->cmd && o->argv[0]) {
        json_t *a = json_array();
        for (size_t i = 0; a && o->argv[i]; i++)
            (void)json_array_append_new(a, json_string(o->argv[i]));
        (void)json_object_set_new(b, "cmd", a);
    } else {
        json_decref(b);
        return err_set(err, -EINVAL, 0, "exec: give either cmd or a non-empty argv");
    }
    if (o->cwd)
        (void)json_object_set_new(b, "cwd", json_string(o->cwd));
    if (o->n_env) {
        json_t *env = kv_object(o->env, o->n_env);
        if (!env) {
            json_decref(b);
            return err_set(err, -EINVAL, 0, "exec: an env entry has no key or value");
        }
        (void)json_object_set_new(b, "env", env);
    }
    if (o->timeout_s > 0)
        (void)json_object_set_new(b, "timeout", json_real(o->timeout_s));
    if (background && o->keep_stdin_open) {
        (void)json_object_set_new(b, "stdin", json_true());
    } else if (o->stdin_data) {
        size_t cap = (o->stdin_len + 2) / 3 * 4 + 1;
        char *enc = malloc(cap);
        if (!enc) {
            json_decref(b);
            return err_set(err, -ENOMEM, 0, "out of memory");
        }
        EVP_EncodeBlock((unsigned char *)enc, o->stdin_data, (int)o->stdin_len);
        (void)json_object_set_new(b, "stdin_b64", json_string(enc));
        free(enc);
    }
    if (o->tag)
        (void)json_object_set_new(b, "tag", json_string(o->tag));
    (void)json_object_set_new(b, "encoding", json_string("base64"));
    *ret = b;
    return 0;
}

/* A streamed NDJSON call (exec, process output) until the exit event. */
static int stream_call(sbx_sandbox_t *s, const char *what, const char *method, const char *target,
                       json_t *body, const sbx_exec_opts_t *cb, sbx_exec_result_t *ret,
                       bool need_exit, sbx_error_t *err)
{
    _cleanup_free_ char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    _cleanup_free_ char *th = token_header(s);
    if ((body && !text) || !th)
        return err_set(err, -ENOMEM, 0, "out of memory");
    stream_t st = { .cb = cb };
    st.res.exit_code = -1;
    http_req_t rq = { .method = method,
                      .target = target,
                      .content_type = body ? "application/json" : NULL,
                      .body = text,
                      .body_len = text ? strlen(text) : 0,
                      .body_fd = -1,
                      .sink = stream_sink,
                      .sink_ud = &st,
                      .stream = true };
    http_resp_t resp = { 0 };
    int r = api_raw(s->c, what, &rq, th, &resp, err);
    http_resp_free(&resp);
    if (r >= 0 && st.len > 0 && !st.failed)
        r = stream_event(&st, st.line, st.len);
    free(st.line);
    if (st.failed)
        return err_set(err, st.failed, 0, "%s: a malformed or oversized event in the stream", what);
    if (r < 0)
        return r;
    if (need_exit && !st.exited)
        return err_set(err, -EPROTO, 0,
                       "%s: the stream ended before the exit event (the sandbox stopped or the "
                       "connection was cut)",
                       what);
    if (ret)
        *ret = st.res;
    return 0;
}

int sbx_exec(sbx_sandbox_t *s, const sbx_exec_opts_t *opts, sbx_exec_result_t *ret,
             sbx_error_t *err)
{
    json_t *body = NULL;
    int r = exec_body(opts, false, &body, err);
    if (r < 0)
        return r;
    _cleanup_free_ char *t = sandbox_route(s, "/exec");
    char what[300];
    (void)snprintf(what, sizeof what, "exec in %s", s->display);
    r = t ? stream_call(s, what, "POST", t, body, opts, ret, true, err)
          : err_set(err, -ENOMEM, 0, "out of memory");
    json_decref(body);
    return r;
}

/* ---- background processes ------------------------------------------------------------------- */

static int process_from_json(json_t *j, sbx_process_t *p)
{
    memset(p, 0, sizeof *p);
    const char *id = json_string_value(json_object_get(j, "id"));
    if (!id || strlen(id) >= sizeof p->id)
        return -EPROTO;
    memcpy(p->id, id, strlen(id) + 1);
    p->pid = (int)json_integer_value(json_object_get(j, "pid"));
    json_t *cmd = json_object_get(j, "cmd");
    p->cmd = json_is_string(cmd) ? strdup(json_string_value(cmd))
             : cmd               ? json_dumps(cmd, JSON_COMPACT)
                                 : strdup("");
    const char *tag = json_string_value(json_object_get(j, "tag"));
    p->tag = strdup(tag ? tag : "");
    p->started_at_ms = json_integer_value(json_object_get(j, "started_at_ms"));
    p->running = json_is_true(json_object_get(j, "running"));
    json_t *code = json_object_get(j, "exit_code");
    p->exit_code = json_is_integer(code) ? (int)json_integer_value(code) : -1;
    p->signal = (int)json_integer_value(json_object_get(j, "signal"));
    p->timed_out = json_is_true(json_object_get(j, "timed_out"));
    p->stdin_open = json_is_true(json_object_get(j, "stdin_open"));
    if (!p->cmd || !p->tag) {
        sbx_process_clear(p);
        return -ENOMEM;
    }
    return 0;
}

void sbx_process_clear(sbx_process_t *p)
{
    free(p->cmd);
    free(p->tag);
    p->cmd = p->tag = NULL;
}

void sbx_process_list_free(sbx_process_t *list, size_t n)
{
    for (size_t i = 0; list && i < n; i++)
        sbx_process_clear(&list[i]);
    free(list);
}

static int sandbox_json(sbx_sandbox_t *s, const char *what, const char *method, const char *rest,
                        json_t *body, json_t **ret, sbx_error_t *err)
{
    _cleanup_free_ char *t = sandbox_route(s, rest);
    _cleanup_free_ char *th = token_header(s);
    if (!t || !th)
        return err_set(err, -ENOMEM, 0, "out of memory");
    char w[300];
    (void)snprintf(w, sizeof w, "%s in %s", what, s->display);
    return api_json(s->c, w, method, t, th, body, ret, NULL, err);
}

int sbx_process_start(sbx_sandbox_t *s, const sbx_exec_opts_t *opts, sbx_process_t *ret,
                      sbx_error_t *err)
{
    _cleanup_json_ json_t *body = NULL;
    int r = exec_body(opts, true, &body, err);
    if (r < 0)
        return r;
    _cleanup_json_ json_t *j = NULL;
    r = sandbox_json(s, "start process", "POST", "/processes", body, &j, err);
    if (r < 0)
        return r;
    sbx_process_t p;
    if (process_from_json(j, &p) < 0)
        return err_set(err, -EPROTO, 0, "start process: an answer without an id");
    p.running = true;
    *ret = p;
    return 0;
}

int sbx_process_list(sbx_sandbox_t *s, sbx_process_t **ret, size_t *ret_n, sbx_error_t *err)
{
    _cleanup_json_ json_t *j = NULL;
    int r = sandbox_json(s, "list processes", "GET", "/processes", NULL, &j, err);
    if (r < 0)
        return r;
    if (!json_is_array(j))
        return err_set(err, -EPROTO, 0, "list processes: the answer is not a list");
    size_t n = json_array_size(j);
    sbx_process_t *list = calloc(n ? n : 1, sizeof *list);
    if (!list)
        return err_set(err, -ENOMEM, 0, "out of memory");
    for (size_t i = 0; i < n; i++) {
        if (process_from_json(json_array_get(j, i), &list[i]) < 0) {
            sbx_process_list_free(list, i);
            return err_set(err, -EPROTO, 0, "list processes: a malformed entry");
        }
    }
    *ret = list;
    *ret_n = n;
    return (int)MIN(n, (size_t)INT32_MAX);
}

int sbx_process_get(sbx_sandbox_t *s, const char *id, sbx_process_t *ret, sbx_error_t *err)
{
    _cleanup_free_ char *eid = url_escape(id);
    _cleanup_free_ char *rest = eid ? strprintf("/processes/%s", eid) : NULL;
    if (!rest)
        return err_set(err, -ENOMEM, 0, "out of memory");
    _cleanup_json_ json_t *j = NULL;
    int r = sandbox_json(s, "process", "GET", rest, NULL, &j, err);
    if (r < 0)
        return r;
    return process_from_json(j, ret) < 0 ? err_set(err, -EPROTO, 0, "process: a malformed answer")
                                         : 0;
}

int sbx_process_output(sbx_sandbox_t *s, const char *id, bool follow,
                       const sbx_exec_opts_t *callbacks, sbx_exec_result_t *ret, sbx_error_t *err)
{
    sbx_exec_opts_t none = { 0 };
    _cleanup_free_ char *eid = url_escape(id);
    _cleanup_free_ char *rest = eid ? strprintf("/processes/%s/output?follow=%s&encoding=base64",
                                                eid, follow ? "true" : "false")
                                    : NULL;
    _cleanup_free_ char *t = rest ? sandbox_route(s, rest) : NULL;
    if (!t)
        return err_set(err, -ENOMEM, 0, "out of memory");
    char what[300];
    (void)snprintf(what, sizeof what, "output of %s in %s", id, s->display);
    return stream_call(s, what, "GET", t, NULL, callbacks ? callbacks : &none, ret, follow, err);
}

int sbx_process_stdin(sbx_sandbox_t *s, const char *id, const void *data, size_t len, bool close,
                      sbx_error_t *err)
{
    _cleanup_free_ char *eid = url_escape(id);
    _cleanup_free_ char *rest =
        eid ? strprintf("/processes/%s/stdin%s", eid, close ? "?close=true" : "") : NULL;
    _cleanup_free_ char *t = rest ? sandbox_route(s, rest) : NULL;
    _cleanup_free_ char *th = token_header(s);
    if (!t || !th)
        return err_set(err, -ENOMEM, 0, "out of memory");
    http_req_t rq = { .method = "POST",
                      .target = t,
                      .content_type = "application/octet-stream",
                      .body = data,
                      .body_len = len,
                      .body_fd = -1 };
    http_resp_t resp;
    char what[300];
    (void)snprintf(what, sizeof what, "stdin of %s in %s", id, s->display);
    int r = api_raw(s->c, what, &rq, th, &resp, err);
    if (r >= 0)
        http_resp_free(&resp);
    return r;
}

int sbx_process_signal(sbx_sandbox_t *s, const char *id, int signo, unsigned grace_s,
                       sbx_error_t *err)
{
    _cleanup_free_ char *eid = url_escape(id);
    _cleanup_free_ char *rest = eid ? strprintf("/processes/%s/signal", eid) : NULL;
    _cleanup_json_ json_t *b = json_pack("{s:i}", "signal", signo);
    if (!rest || !b)
        return err_set(err, -ENOMEM, 0, "out of memory");
    if (grace_s)
        (void)json_object_set_new(b, "grace_secs", json_integer(grace_s));
    return sandbox_json(s, "signal", "POST", rest, b, NULL, err);
}
