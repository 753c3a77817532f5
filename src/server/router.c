/* SPDX-License-Identifier: MIT */
/* Authentication, the mode gate and the route table. Order of checks (as the reference):
 * GET /health, then authentication, then the 411 check, then the activity stamp, then the mode
 * gate (404), then routing. Authentication comes first so that an unauthenticated caller learns
 * nothing about which routes exist. */
#include <sodium.h>
#include <stdio.h>
#include <time.h>

#include "common/log.h"
#include "envd.h"
#include "pool.h"
#include "routes.h"
#include "server.h"

typedef struct {
    const char *method; /* NULL = any */
    const char *path;   /* exact path, or prefix ending in '/' with has_id */
    enum { R_EXACT, R_ID, R_ID_SUFFIX, R_PROXY } kind;
    const char *suffix; /* for R_ID_SUFFIX */
    route_fn fn;
} route_t;

static const route_t dedicated_routes[] = {
    { "POST", "/v1/exec", R_EXACT, NULL, route_exec },
    { "POST", "/v1/processes", R_EXACT, NULL, route_proc_create },
    { "GET", "/v1/processes", R_EXACT, NULL, route_proc_list },
    { "GET", "/v1/processes/", R_ID, NULL, route_proc_get },
    { "DELETE", "/v1/processes/", R_ID, NULL, route_proc_delete },
    { "POST", "/v1/processes/", R_ID_SUFFIX, "/signal", route_proc_signal },
    { "POST", "/v1/processes/", R_ID_SUFFIX, "/stdin", route_proc_stdin },
    { "GET", "/v1/processes/", R_ID_SUFFIX, "/output", route_proc_output },
    { "GET", "/v1/files/read", R_EXACT, NULL, route_files_read },
    { "PUT", "/v1/files/write", R_EXACT, NULL, route_files_write },
    { "POST", "/v1/files/write", R_EXACT, NULL, route_files_write },
    { "GET", "/v1/files/list", R_EXACT, NULL, route_files_list },
    { "GET", "/v1/files/stat", R_EXACT, NULL, route_files_stat },
    { "DELETE", "/v1/files/delete", R_EXACT, NULL, route_files_delete },
    { "POST", "/v1/files/mkdir", R_EXACT, NULL, route_files_mkdir },
    { "POST", "/v1/files/rename", R_EXACT, NULL, route_files_rename },
    { NULL, "/v1/proxy/", R_PROXY, NULL, route_proxy },
};

/* Lengths are public (64 hex chars); the bytes are compared in constant time. */
static bool token_matches(const conn_t *c, const char *token)
{
    sv_t v;
    size_t tlen = strlen(token);
    if (!http_header_get(&c->req, "x-sandbox-token", &v) || v.len != tlen || tlen == 0)
        return false;
    return sodium_memcmp(v.p, token, tlen) == 0;
}

/* E2B's envd routes carry the same token in X-Access-Token (checked the same way); our own
 * header is accepted there too. */
static bool envd_token_matches(const conn_t *c, const char *token, sv_t route)
{
    sv_t v;
    size_t tlen = strlen(token);
    if (http_header_get(&c->req, "x-access-token", &v))
        return v.len == tlen && tlen > 0 && sodium_memcmp(v.p, token, tlen) == 0;
    if (token_matches(c, token))
        return true;
    /* /files also takes the presigned URLs E2B's SDK makes with the token (no header) */
    return sv_eq(route, SV("/files")) && envd_files_signed(c, token, (uint64_t)time(NULL));
}

static bool token_ok(const server_t *s, const conn_t *c)
{
    if (!s->cfg.token)
        return true; /* --allow-no-auth */
    return token_matches(c, s->cfg.token);
}

static bool method_is(const conn_t *c, const char *m)
{
    return c->req.method.len == strlen(m) && memcmp(c->req.method.p, m, c->req.method.len) == 0;
}

static bool valid_id(sv_t id)
{
    if (id.len == 0 || id.len > 64)
        return false;
    for (size_t i = 0; i < id.len; i++)
        if (id.p[i] == '/')
            return false;
    return true;
}

/* Match the path against one route; fill params. */
static bool route_match(const route_t *r, sv_t path, route_params_t *p)
{
    size_t plen = strlen(r->path);
    switch (r->kind) {
    case R_EXACT: return path.len == plen && memcmp(path.p, r->path, plen) == 0;
    case R_ID:
    case R_ID_SUFFIX: {
        if (path.len <= plen || memcmp(path.p, r->path, plen) != 0)
            return false;
        sv_t tail = sv_make(path.p + plen, path.len - plen);
        if (r->kind == R_ID) {
            p->id = tail;
            return valid_id(tail);
        }
        size_t slen = strlen(r->suffix);
        if (tail.len <= slen || memcmp(tail.p + tail.len - slen, r->suffix, slen) != 0)
            return false;
        p->id = sv_make(tail.p, tail.len - slen);
        return valid_id(p->id);
    }
    case R_PROXY: {
        if (path.len < plen || memcmp(path.p, r->path, plen) != 0)
            return false;
        sv_t tail = sv_make(path.p + plen, path.len - plen);
        size_t i = 0;
        while (i < tail.len && tail.p[i] != '/')
            i++;
        uint64_t port = 0;
        if (parse_u64(sv_make(tail.p, i), 65535, &port) < 0 || port == 0)
            port = 0; /* answered 404 by the proxy handler */
        p->port = (uint16_t)port;
        p->rest = sv_make(tail.p + i, tail.len - i);
        return true;
    }
    }
    return false;
}

static bool is_host_route(sv_t path)
{
    return sv_eq(path, SV("/v1/sandboxes")) || sv_has_prefix(path, SV("/v1/sandboxes/"));
}

static void dispatch_dedicated_table(conn_t *c, sv_t path)
{
    bool path_known = false;
    for (size_t i = 0; i < ELEMENTSOF(dedicated_routes); i++) {
        const route_t *r = &dedicated_routes[i];
        route_params_t p = { 0 };
        if (!route_match(r, path, &p))
            continue;
        path_known = true;
        if (r->method && !method_is(c, r->method))
            continue;
        r->fn(c, &p);
        return;
    }
    if (path_known)
        http_method_not_allowed(c, 0, "method not allowed");
    else
        http_not_found(c, 0, "not found");
}

static bool refuse_unauthorized(conn_t *c)
{
    c->keep_alive = c->keep_alive && c->body_left <= CONN_DRAIN_MAX;
    http_forbidden(c, 0, "missing or invalid X-Sandbox-Token");
    return true;
}

/* Request bodies must have a length, except through the port proxy: it replays the head and
 * splices the bytes that follow, so a chunked body reaches the service as sent (and the
 * connection closes after it: router_dispatch turned keep-alive off). path is the route as the
 * dedicated table sees it ("/v1/..."; "/proxy/..." for a pool sandbox's scoped rest). */
static bool refuse_transfer_encoding(conn_t *c, sv_t path)
{
    if (!c->req.has_transfer_encoding)
        return false;
    if (sv_has_prefix(path, SV("/v1/proxy/")) || sv_has_prefix(path, SV("/proxy/")))
        return false;
    http_length_required(c, HTTP_CLOSE, "Transfer-Encoding is not supported; send Content-Length");
    return true;
}

/* Scope the request to sb (released when the request ends, conn.c); 503 when its handles
 * cannot be opened (a full descriptor table: EMFILE). */
static bool scope_or_refuse(conn_t *c, sandbox_t *sb)
{
    int r = conn_scope_sandbox(c, sb);
    if (r < 0)
        http_unavailable(c, HTTP_RETRY_SOON, "cannot open the sandbox's home: %s", strerror(-r));
    return r >= 0;
}

/* envd (E2B) on a pool sandbox: /v1/sandboxes/<id>/{process.Process/..., filesystem.Filesystem/
 * ..., files, health}, with that sandbox's token in X-Access-Token; 401 otherwise (as envd).
 * The handlers run scoped to the sandbox, like the dedicated table's. */
static void dispatch_envd_scoped(conn_t *c, sandbox_t *sb, sv_t rest)
{
    if (!sb || !envd_token_matches(c, sb->token, rest)) {
        envd_refuse(c, rest);
        return;
    }
    server_touch(server_of(c));
    sb->last_activity_ms = loop_now_ms(server_of(c)->loop);
    if (sv_eq(rest, SV("/health"))) {
        if (method_is(c, "GET") || method_is(c, "HEAD"))
            conn_respond(c, 200, "application/json", "{\"status\":\"ok\"}", 15, NULL);
        else
            http_method_not_allowed(c, 0, "method not allowed");
        return;
    }
    if (!scope_or_refuse(c, sb))
        return;
    /* the route as the dedicated agent sees it: the prefix is dropped from the path view */
    c->req.path = rest;
    envd_dispatch(c, rest);
}

/* Host (pool) mode. The host token only manages (/v1/sandboxes, .../token); every route scoped
 * to a sandbox needs that sandbox's own token, and an unknown id is 403 (no entry, so no
 * token to match). A scoped route runs the dedicated handler with conn_sandbox(c) set, after its path
 * is rewritten from /v1/sandboxes/<id>/<rest> to /v1/<rest>. */
static void dispatch_host(conn_t *c, sv_t path)
{
    server_t *s = server_of(c);
    static const sv_t prefix = { "/v1/sandboxes/", 14 };
    if (sv_eq(path, SV("/v1/sandboxes"))) {
        if (!token_ok(s, c) && refuse_unauthorized(c))
            return;
        if (refuse_transfer_encoding(c, SV("")))
            return;
        server_touch(s);
        if (method_is(c, "POST"))
            route_sandboxes_create(c);
        else if (method_is(c, "GET"))
            route_sandboxes_list(c);
        else if (method_is(c, "DELETE"))
            route_sandboxes_delete_all(c);
        else
            http_method_not_allowed(c, 0, "method not allowed");
        return;
    }
    if (!sv_has_prefix(path, prefix)) {
        /* anything else needs the host token, then the mode gate answers 404 */
        if (!token_ok(s, c) && refuse_unauthorized(c))
            return;
        if (refuse_transfer_encoding(c, SV("")))
            return;
        http_not_found(c, 0, "not found (dedicated route; this server is a pool host)");
        return;
    }
    sv_t tail = sv_make(path.p + prefix.len, path.len - prefix.len);
    size_t idlen = 0;
    while (idlen < tail.len && tail.p[idlen] != '/')
        idlen++;
    sv_t rest = sv_make(tail.p + idlen, tail.len - idlen);
    sandbox_t *sb = pool_find(s->pool, tail.p, idlen);
    if (sv_eq(rest, SV("/token")) && method_is(c, "GET")) {
        if ((!token_ok(s, c) || !sb) && refuse_unauthorized(c))
            return;
        if (refuse_transfer_encoding(c, SV("")))
            return;
        server_touch(s);
        route_sandbox_token(c, sb);
        return;
    }
    if (envd_is_route(rest) || sv_eq(rest, SV("/health"))) {
        dispatch_envd_scoped(c, sb, rest);
        return;
    }
    if ((!sb || !token_matches(c, sb->token)) && refuse_unauthorized(c))
        return;
    if (refuse_transfer_encoding(c, rest))
        return;
    server_touch(s);
    sb->last_activity_ms = loop_now_ms(s->loop);
    if (rest.len == 0) {
        if (method_is(c, "DELETE"))
            route_sandbox_delete(c, sb);
        else
            http_method_not_allowed(c, 0, "method not allowed");
        return;
    }
    /* /v1/sandboxes/<id>/<rest> -> /v1/<rest>: the three bytes before <rest> become "/v1"
     * (the id is at least one byte, so they belong to this path). */
    char *r0 = (char *)rest.p - 3;
    memcpy(r0, "/v1", 3);
    if (!scope_or_refuse(c, sb))
        return;
    c->req.path = sv_make(r0, rest.len + 3);
    dispatch_dedicated_table(c, c->req.path);
}

void router_dispatch(conn_t *c)
{
    server_t *s = server_of(c);
    sv_t path = c->req.path;

    /* A body framed by Transfer-Encoding is never read, so nothing after this head can be
     * trusted as the next request: whatever the answer, the connection closes after it. */
    if (c->req.has_transfer_encoding)
        conn_close_after(c);
    if (sv_eq(path, SV("/health")) && (method_is(c, "GET") || method_is(c, "HEAD"))) {
        c->authed = token_ok(s, c) && s->cfg.token; /* detail only with a real token */
        if (!s->cfg.token)
            c->authed = true;
        route_health(c, NULL);
        return;
    }
    if (s->pool) {
        dispatch_host(c, path);
        return;
    }
    if (envd_is_route(path)) {
        /* E2B's envd: X-Access-Token, 401 as envd answers; chunked bodies are collected */
        if (s->cfg.token && !envd_token_matches(c, s->cfg.token, path)) {
            envd_refuse(c, path);
            return;
        }
        server_touch(s);
        envd_dispatch(c, path);
        return;
    }
    if (!token_ok(s, c)) {
        refuse_unauthorized(c);
        return;
    }
    if (refuse_transfer_encoding(c, path))
        return;
    server_touch(s);
    if (is_host_route(path)) {
        http_not_found(c, 0, "not found (host-mode route; this server is dedicated)");
        return;
    }
    dispatch_dedicated_table(c, path);
}

/* ---- shared helpers ---------------------------------------------------------------------- */

static json_body_fn pending_json_fn(conn_t *c) { return (json_body_fn)c->hdata; }

static void json_body_done(conn_t *c)
{
    json_body_fn fn = pending_json_fn(c);
    c->hdata = NULL;
    json_error_t err;
    json_t *j = NULL;
    if (c->body.len == 0)
        j = json_object();
    else
        j = json_loadb(buf_head(&c->body), c->body.len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY,
                       &err);
    if (!j) {
        http_bad_request(c, 0, "invalid JSON body: %s", err.text);
        return;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        http_bad_request(c, 0, "JSON body must be an object");
        return;
    }
    fn(c, j);
    json_decref(j);
}

void route_with_json_body(conn_t *c, size_t max, json_body_fn done)
{
    c->hdata = (void *)done;
    conn_collect_body(c, max, json_body_done);
}

int query_param(const conn_t *c, const char *name, char *out, size_t outcap)
{
    sv_t raw;
    if (!query_get_raw(c->req.query, name, &raw))
        return 0;
    if (outcap == 0)
        return -E2BIG;
    int n = url_decode(raw, out, outcap - 1, true);
    if (n < 0)
        return n;
    if (memchr(out, '\0', (size_t)n))
        return -EINVAL;
    out[n] = '\0';
    return 1;
}

int query_bool(const conn_t *c, const char *name, bool def, bool *ret)
{
    char v[16];
    int r = query_param(c, name, v, sizeof v);
    if (r < 0)
        return r;
    if (r == 0) {
        *ret = def;
        return 0;
    }
    if (streq(v, "true") || streq(v, "1") || streq(v, "yes"))
        *ret = true;
    else if (streq(v, "false") || streq(v, "0") || streq(v, "no"))
        *ret = false;
    else
        return -EINVAL;
    return 0;
}

int query_u64(const conn_t *c, const char *name, uint64_t max, bool *ret_present, uint64_t *ret)
{
    char v[32];
    int r = query_param(c, name, v, sizeof v);
    if (r < 0)
        return r;
    *ret_present = r > 0;
    if (r == 0)
        return 0;
    return parse_u64_str(v, max, ret);
}
