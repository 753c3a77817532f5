/* SPDX-License-Identifier: MIT */
/* The node's HTTP ingress. Every request carries a capability (X-Sbx-Capability). Before any
 * byte reaches a run, the node verifies the signature and expiry with the control plane's
 * public keys, then compares the full identity with the run installed here (cap_compare):
 *   Allow        -> forward over the verified bridge, the stream leased to the run;
 *   RefreshRoute -> 409, the sender's route is stale (same sandbox, another incarnation);
 *   Deny         -> 403 (401 without a capability).
 * Both refusals carry X-Sbx-Verdict and a JSON body {"error", "verdict", "reason"}.
 *
 * Routes:
 *   GET    /v1/health
 *   PUT    /v1/runs/{sandbox}                      install a run        (manage capability)
 *   POST   /v1/runs/{sandbox}/pause                stop, keep its root  (manage)
 *   DELETE /v1/runs/{sandbox}                      retire               (manage)
 *   GET    /v1/runs/{sandbox}/state                tar of a stopped run (manage)
 *   ANY    /v1/runs/{sandbox}/ports/{port}/{rest}  forward to the run   (exec/files/... or proxy)
 *
 * Capabilities (v2) name the request: its method and target always, its body's digest for
 * management calls and whenever the edge buffered the body (the node then collects the body
 * and checks it before forwarding), and management capabilities are single-use. */
#include <sodium.h>
#include <stdio.h>
#include <time.h>

#include "cap/purpose.h"
#include "common/log.h"
#include "http/proxy.h"
#include "http/relay.h"
#include "node.h"

#define VERDICT_BODY_MAX 512

/* Headers of the platform's own (X-Sbx-Verdict, X-Sbx-Outcome, ...): they tell a client what the
 * node and the edge did with its request (docs/platform.md: a verdict means "not forwarded"), so
 * an answer that comes from the run (its agent, or a service behind its port proxy) never
 * carries one the run set. Dropped from every answer head relayed or tunneled from the run; the
 * edge then trusts the ones it sees as the node's own (a RefreshRoute makes it retry). */
#define RUN_ANSWER_DROP "x-sbx-"

/* The one table of capability refusals to statuses: a stale route is 409 (the control plane
 * refreshes it, docs/capabilities.md), a capability that does not parse 401, any other refusal
 * 403. */
int status_from_cap_verdict(cap_verdict_t v, cap_reason_t why)
{
    if (v == CAP_REFRESH_ROUTE)
        return HTTP_CONFLICT;
    return why == CAP_E_MALFORMED ? HTTP_UNAUTHORIZED : HTTP_FORBIDDEN;
}

void node_refuse(conn_t *c, cap_verdict_t v, cap_reason_t why, const char *msg)
{
    int status = status_from_cap_verdict(v, why);
    char hdr[64];
    (void)snprintf(hdr, sizeof hdr, "X-Sbx-Verdict: %s\r\n", cap_verdict_str(v));
    json_t *j = json_pack("{s:s,s:s,s:s}", "error", msg, "verdict", cap_verdict_str(v), "reason",
                          cap_reason_str(why));
    char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!body) {
        conn_abort(c);
        return;
    }
    conn_close_after(c);
    (void)conn_respond(c, status, "application/json", body, strlen(body), hdr);
    free(body);
}

/* 503 with Retry-After: the node cannot judge capabilities yet (docs/platform.md). */
static void not_ready(conn_t *c)
{
    static const char body[] =
        "{\"error\":\"this node has no current key set from the control plane yet: retry\","
        "\"reason\":\"no_keyset\"}";
    conn_close_after(c);
    (void)conn_respond(c, HTTP_UNAVAILABLE, "application/json", body, sizeof body - 1,
                       "Retry-After: 1\r\n");
}

static int64_t now_s(void) { return (int64_t)time(NULL); }

/* Signature and expiry. */
static bool verify(node_t *n, conn_t *c, cap_t *cap)
{
    sv_t w;
    if (!http_header_get(&c->req, "x-sbx-capability", &w) || w.len == 0) {
        node_refuse(c, CAP_DENY, CAP_E_MALFORMED, "a capability (X-Sbx-Capability) is required");
        return false;
    }
    pthread_mutex_lock(&n->keys_lock);
    /* the signature of these exact bytes is checked once while the key set holds its key */
    cap_reason_t why = cap_verify_reuse(&n->verified, &n->keys, w.p, w.len, now_s(), cap);
    bool current = n->keys_current;
    pthread_mutex_unlock(&n->keys_lock);
    /* A key this node does not know, before it has heard the control plane's key set since it
     * started (none at all, or only the one it kept on disk, which a rotation may have
     * outdated): not a refusal of the capability yet, but "not ready". */
    if (why == CAP_E_UNKNOWN_KEY && !current) {
        not_ready(c);
        return false;
    }
    if (why != CAP_OK) {
        node_refuse(c, CAP_DENY, why, "capability refused");
        return false;
    }
    /* a capability signed by the control plane: the connection leaves the unauthenticated
     * group (its short head deadline and share, connlimit.h) */
    climit_authenticated(c);
    return true;
}

/* Split /v1/runs/{sandbox}{tail} */
static bool parse_runs_path(sv_t path, char *sandbox, sv_t *tail)
{
    static const char pre[] = "/v1/runs/";
    if (path.len <= sizeof pre - 1 || memcmp(path.p, pre, sizeof pre - 1) != 0)
        return false;
    const char *s = path.p + sizeof pre - 1, *end = path.p + path.len;
    const char *slash = memchr(s, '/', (size_t)(end - s));
    size_t n = (size_t)((slash ? slash : end) - s);
    if (n == 0 || n >= CAP_ID_MAX)
        return false;
    memcpy(sandbox, s, n);
    sandbox[n] = 0;
    /* it names a directory under <state>/runs: never "." or ".." (or any dot file) */
    if (!cap_id_valid(sandbox) || sandbox[0] == '.')
        return false;
    *tail = slash ? sv_make(slash, (size_t)(end - slash)) : SV("");
    return true;
}

/* ---- management (control plane -> node) ---------------------------------------------------- */

/* need: CAP_MANAGE (install, pause, retire: the control plane) or CAP_STATE_READ (fetching a
 * stopped run's root: the node that resumes it holds only that). */
static bool manage_cap_ok(node_t *n, conn_t *c, const char *sandbox, uint32_t need, cap_t *cap)
{
    if (!verify(n, c, cap))
        return false;
    if (!(cap->access & need)) {
        node_refuse(c, CAP_DENY, CAP_E_PURPOSE,
                    need == CAP_MANAGE ? "not a management capability"
                                       : "not a capability to read this run's state");
        return false;
    }
    if (!streq(cap->run.sandbox, sandbox)) {
        node_refuse(c, CAP_DENY, CAP_E_SANDBOX, "capability is for another sandbox");
        return false;
    }
    if (!streq(cap->run.node, n->cfg.name)) {
        node_refuse(c, CAP_REFRESH_ROUTE, CAP_E_STALE_RUN, "capability names another node");
        return false;
    }
    return true;
}

/* The run record a management call addresses must be exactly the capability's run. */
static run_t *manage_target(node_t *n, conn_t *c, const cap_t *cap)
{
    run_t *r = node_find_run(n, cap->run.sandbox);
    if (!r) {
        node_refuse(c, CAP_REFRESH_ROUTE, CAP_E_NO_RUN, "no run of this sandbox on this node");
        return NULL;
    }
    if (!cap_run_equal(&r->id, &cap->run)) {
        node_refuse(c, CAP_REFRESH_ROUTE, CAP_E_STALE_RUN,
                    "another run of this sandbox is installed");
        return NULL;
    }
    return r;
}

/* The method and target of this very request are the ones the capability names. */
static bool request_bound(conn_t *c, const cap_t *cap)
{
    uint8_t d[CAP_DIGEST_BYTES];
    const http_request_t *rq = &c->req;
    if (rq->method.len != strnlen(cap->method, CAP_METHOD_MAX) ||
        memcmp(rq->method.p, cap->method, rq->method.len) != 0)
        return false;
    cap_digest(rq->target.p, rq->target.len, d);
    return sodium_memcmp(d, cap->target, sizeof d) == 0;
}

/* A management call waits for its body: the capability names its digest (and a single-use id),
 * both checked before anything is done. */
typedef struct {
    cap_t cap;
    char op[16];
} manage_ctx_t;

static void manage_ctx_free(conn_t *c, bool aborted)
{
    (void)aborted;
    free(c->hdata);
    c->hdata = NULL;
}

static const handler_ops_t manage_ops = { .on_close = manage_ctx_free };

static void manage_body_done(conn_t *c)
{
    node_t *n = c->srv->app;
    manage_ctx_t *m = c->hdata;
    cap_t cap = m->cap;
    char op[sizeof m->op];
    memcpy(op, m->op, sizeof op);
    conn_set_handler(c, NULL, NULL);
    free(m);
    if (cap.has_body && !cap_body_matches(&cap, buf_head(&c->body), c->body.len)) {
        node_refuse(c, CAP_DENY, CAP_E_BODY, "the capability names another body");
        return;
    }
    /* single use: recorded only once everything else held, so a refused call burns nothing */
    if (cap.has_nonce && cap_replay_use(&n->replay, &cap, now_s()) != CAP_OK) {
        node_refuse(c, CAP_DENY, CAP_E_REPLAY, "this capability was used already");
        return;
    }
    /* ... and on disk before the call runs: a restart must not make it good again */
    if (cap.has_nonce && node_used_ids_save(n) < 0) {
        http_unavailable(c, 0, "cannot record the capability's use; nothing was done");
        return;
    }
    if (streq(op, "install")) {
        install_start(n, c, &cap.run);
        return;
    }
    run_t *r = manage_target(n, c, &cap);
    if (!r)
        return;
    if (streq(op, "pause")) {
        node_crash_point(n, "pause:before_stop");
        run_stop(n, r);
        node_crash_point(n, "pause:after_stop");
        log_info("paused run %s generation %llu", r->id.sandbox,
                 (unsigned long long)r->id.generation);
        conn_respond_json(c, 200, json_pack("{s:o}", "run", run_json(r)));
    } else if (streq(op, "retire")) {
        run_retire(n, r);
        conn_respond_json(c, 200, json_pack("{s:b}", "retired", 1));
    } else {
        int rc = run_state_archive_start(n, r, c);
        if (rc == -EBUSY)
            http_conflict(c, 0, "the run is still running: pause it first");
        else if (rc < 0)
            http_errno(c, 0, rc, "state archive");
    }
}

static void route_manage(node_t *n, conn_t *c, const char *sandbox, const char *op)
{
    cap_t cap;
    if (!manage_cap_ok(n, c, sandbox, streq(op, "state") ? CAP_STATE_READ : CAP_MANAGE, &cap))
        return;
    if (!request_bound(c, &cap)) {
        node_refuse(c, CAP_DENY, CAP_E_REQUEST, "the capability names another request");
        return;
    }
    if (c->req.has_transfer_encoding) {
        node_refuse(c, CAP_DENY, CAP_E_BODY, "a management body needs a Content-Length");
        return;
    }
    manage_ctx_t *m = calloc(1, sizeof *m);
    if (!m) {
        http_errno(c, 0, -ENOMEM, "manage");
        return;
    }
    m->cap = cap;
    (void)snprintf(m->op, sizeof m->op, "%s", op);
    conn_set_handler(c, &manage_ops, m);
    conn_collect_body(c, NODE_INSTALL_BODY_MAX, manage_body_done);
}

/* ---- forwarding (client -> control -> node -> run) ----------------------------------------- */

static bool parse_ports_tail(sv_t tail, uint16_t *port, sv_t *rest)
{
    static const char pre[] = "/ports/";
    if (tail.len <= sizeof pre - 1 || memcmp(tail.p, pre, sizeof pre - 1) != 0)
        return false;
    sv_t t = sv_make(tail.p + sizeof pre - 1, tail.len - (sizeof pre - 1));
    const char *slash = memchr(t.p, '/', t.len);
    sv_t num = sv_make(t.p, slash ? (size_t)(slash - t.p) : t.len);
    uint64_t p;
    if (parse_u64(num, 65535, &p) < 0 || p == 0)
        return false;
    *port = (uint16_t)p;
    *rest = slash ? sv_make(slash, t.len - num.len) : SV("");
    return true;
}

static void lease_relay_done(relay_t *rl, void *data, relay_conn_t *k, bool ok)
{
    lease_t *l = data;
    (void)rl;
    (void)ok;
    /* The lease was not cut: its run is the one the connection was verified for. Only an
     * answer of the agent itself is trusted to end where it says: behind the agent's port proxy
     * the run's own service answers, and it could keep the connection as a tunnel to itself. */
    if (k && l->keep_bridge)
        run_bridge_put(l->run, k);
    else
        relay_conn_close(k);
    run_lease_on_close(NULL, l);
}

/* Whether the agent hands a request for path (as sent, undecoded: the agent routes it as it
 * is) to a service of the run: its port proxy, /v1/proxy/{port}/... on a dedicated agent and
 * /v1/sandboxes/{id}/proxy/{port}/... on a pool host. Any path with a segment "proxy" counts
 * (a route added later errs on the side of a new connection): a service that keeps the
 * connection after its answer must never get the next request on it, which would be a
 * sibling's (its token with it) or the control plane's (the host's token). */
static bool through_port_proxy(sv_t path)
{
    for (size_t i = 0; i + 6 <= path.len; i++)
        if (path.p[i] == '/' && memcmp(path.p + i + 1, "proxy", 5) == 0 &&
            (i + 6 == path.len || path.p[i + 6] == '/'))
            return true;
    return false;
}

/* Forward an allowed request over the verified bridge (with its body when it was collected to
 * check its digest), the stream leased to the run. */
static void forward_to_run(conn_t *c, run_t *r, uint16_t port, sv_t rest, bool with_body)
{
    http_request_t *rq = &c->req;
    const char *sandbox = r->id.sandbox;
    /* The path inside the run: the agent's own routes, or its port proxy for other ports. */
    const char *q = memchr(rq->target.p, '?', rq->target.len);
    sv_t query = q ? sv_make(q, rq->target.len - (size_t)(q - rq->target.p)) : SV("");
    char target[HTTP_MAX_HEAD];
    int tl = port == CAP_AGENT_PORT ? snprintf(target, sizeof target, SV_FMT SV_FMT,
                                               SV_ARG(rest.len ? rest : SV("/")), SV_ARG(query))
                                    : snprintf(target, sizeof target, "/v1/proxy/%u" SV_FMT SV_FMT,
                                               port, SV_ARG(rest), SV_ARG(query));
    if (tl < 0 || (size_t)tl >= sizeof target) {
        http_uri_too_long(c, 0, "target too long");
        return;
    }
    /* A request known in full (no body, or the body collected) goes through a relay: the
     * answer is framed, the connection from the control plane carries the next request, and
     * the bridge connection (verified when it was made) goes back to the run for the next. */
    sv_t up;
    bool upgrade = http_header_get(rq, "upgrade", &up);
    bool relay = !upgrade && (with_body || (rq->content_length == 0 && !rq->has_transfer_encoding));
    /* the agent's own routes, never its port proxy (a service of the run answers there) */
    bool keep = relay && port == CAP_AGENT_PORT && !through_port_proxy(rest);
    sbx_err_t err;
    relay_conn_t *k = keep ? run_bridge_take(r) : NULL; /* registered with the loop already */
    int fd = -1;
    int rc = k ? 0 : bridge_connect(r, &fd, &err);
    if (rc < 0) {
        log_warn("run %s: bridge refused: %s", sandbox, err.msg);
        http_error(c, rc == -EAGAIN ? HTTP_UNAVAILABLE : HTTP_BAD_GATEWAY, 0, "bridge: %s",
                   err.msg);
        return;
    }
    static const char *const drop[] = { "x-sbx-capability", "authorization", NULL };
    buf_t head;
    rc = proxy_forward_head(rq, sv_make(target, (size_t)tl), drop, NULL, keep, &head);
    if (rc >= 0 && with_body && c->body.len > 0) {
        head.max += c->body.len;
        rc = buf_append(&head, buf_head(&c->body), c->body.len);
    }
    if (rc >= 0 && relay && !k && !(k = relay_conn_new(c->srv->loop, TAKE_FD(fd), NULL)))
        rc = -ENOMEM;
    if (rc < 0) {
        safe_close(fd);
        relay_conn_close(k);
        buf_free(&head);
        http_errno(c, 0, rc, "forward");
        return;
    }
    lease_t *l = run_lease_new(r);
    if (!l) {
        safe_close(fd);
        relay_conn_close(k);
        buf_free(&head);
        http_errno(c, 0, -ENOMEM, "forward");
        return;
    }
    /* The stream is leased to this run: replacing or retiring it cuts the relay or tunnel. */
    if (relay) {
        l->keep_bridge = keep;
        l->relay = proxy_relay_start(c, k, &head, NULL, RUN_ANSWER_DROP, lease_relay_done, l);
        if (!l->relay)
            run_lease_on_close(NULL, l);
        return;
    }
    tunnel_t *t =
        proxy_tunnel_start(c, fd, NULL, &head, NULL, RUN_ANSWER_DROP, run_lease_on_close, l);
    buf_free(&head);
    if (!t)
        run_lease_on_close(NULL, l);
    else
        l->tunnel = t;
}

/* A request whose capability names its body: collected (the edge buffered it too), its digest
 * checked, and the run looked up again (it may have been replaced meanwhile). */
typedef struct {
    cap_t cap;
} fwd_ctx_t;

static void fwd_ctx_free(conn_t *c, bool aborted)
{
    (void)aborted;
    free(c->hdata);
    c->hdata = NULL;
}

static const handler_ops_t fwd_ops = { .on_close = fwd_ctx_free };

static void forward_body_done(conn_t *c)
{
    node_t *n = c->srv->app;
    fwd_ctx_t *f = c->hdata;
    cap_t cap = f->cap;
    conn_set_handler(c, NULL, NULL);
    free(f);
    char sandbox[CAP_ID_MAX];
    sv_t tail, rest;
    uint16_t port;
    if (!parse_runs_path(c->req.path, sandbox, &tail) || !parse_ports_tail(tail, &port, &rest)) {
        http_not_found(c, 0, "no such route");
        return;
    }
    if (!cap_body_matches(&cap, buf_head(&c->body), c->body.len)) {
        node_refuse(c, CAP_DENY, CAP_E_BODY, "the capability names another body");
        return;
    }
    run_t *r = node_find_run(n, sandbox);
    if (!r || r->state != RUN_RUNNING || !cap_run_equal(&r->id, &cap.run)) {
        node_refuse(c, CAP_REFRESH_ROUTE, r ? CAP_E_STALE_RUN : CAP_E_NO_RUN,
                    "the route is stale: this node does not serve that run");
        return;
    }
    forward_to_run(c, r, port, rest, true);
}

static void route_forward(node_t *n, conn_t *c, const char *sandbox, sv_t tail)
{
    http_request_t *rq = &c->req;
    uint16_t port;
    sv_t rest;
    if (!parse_ports_tail(tail, &port, &rest)) {
        http_not_found(c, 0, "expected /v1/runs/{sandbox}/ports/{port}/...");
        return;
    }
    cap_t cap;
    if (!verify(n, c, &cap))
        return;
    /* The agent's own port proxy would reach any port of the run past the exposed list: ports
     * are addressed as themselves (/ports/{port}/), where the gateway checks them. */
    if (port == CAP_AGENT_PORT && sv_has_prefix(rest, SV("/v1/proxy/"))) {
        node_refuse(c, CAP_DENY, CAP_E_PORT,
                    "address the run's port itself (/ports/{port}/), not the agent's proxy");
        return;
    }
    sv_t up;
    cap_proto_t proto = http_header_get(rq, "upgrade", &up) && sv_eq_lit_nocase(up, "websocket")
                            ? CAP_PROTO_WEBSOCKET
                            : CAP_PROTO_HTTP;
    run_t *r = node_find_run(n, sandbox);
    const cap_run_t *installed = r && r->state == RUN_RUNNING ? &r->id : NULL;
    uint32_t purpose = cap_purpose_of(rq->method, port, rest);
    bool is_proxy = purpose == CAP_PROXY;
    cap_request_t creq = { .sandbox = sandbox,
                           .method = rq->method.p,
                           .method_len = rq->method.len,
                           .target = rq->target.p,
                           .target_len = rq->target.len,
                           .purpose = purpose,
                           .port = is_proxy ? port : 0,
                           .proto = is_proxy ? proto : CAP_PROTO_NONE,
                           .installed = installed,
                           .expose = installed ? r->expose : NULL,
                           .n_expose = installed ? r->n_expose : 0 };
    cap_reason_t why;
    cap_verdict_t v = cap_compare(&cap, &creq, &why);
    if (v != CAP_ALLOW) {
        node_refuse(c, v, why,
                    v == CAP_REFRESH_ROUTE ? "the route is stale: this node does not serve that run"
                                           : "capability does not allow this request");
        return;
    }
    if (!cap.has_body) { /* a streamed body (the edge did not buffer it) */
        forward_to_run(c, r, port, rest, false);
        return;
    }
    if (rq->has_transfer_encoding || rq->content_length > NODE_BOUND_BODY_MAX) {
        node_refuse(c, CAP_DENY, CAP_E_BODY, "the capability names a body: send it with a length");
        return;
    }
    fwd_ctx_t *f = calloc(1, sizeof *f);
    if (!f) {
        http_errno(c, 0, -ENOMEM, "forward");
        return;
    }
    f->cap = cap;
    conn_set_handler(c, &fwd_ops, f);
    conn_collect_body(c, NODE_BOUND_BODY_MAX, forward_body_done);
}

static void route_health_node(node_t *n, conn_t *c)
{
    size_t running = 0;
    for (run_t *r = n->runs; r; r = r->next)
        running += r->state == RUN_RUNNING;
    pthread_mutex_lock(&n->keys_lock);
    uint64_t version = n->keys_version;
    bool registered = n->registered;
    int64_t room_mb = n->disk_room_mb; /* what the heartbeats report (report_runs) */
    pthread_mutex_unlock(&n->keys_lock);
    conn_respond_json(c, 200,
                      json_pack("{s:s,s:s,s:I,s:I,s:b,s:I,s:I}", "status", "ok", "node",
                                n->cfg.name, "runs", (json_int_t)n->n_runs, "running",
                                (json_int_t)running, "registered", registered, "keyset_version",
                                (json_int_t)version, "disk_room_mb", (json_int_t)room_mb));
}

void node_dispatch(conn_t *c)
{
    node_t *n = c->srv->app;
    http_request_t *rq = &c->req;
    sv_t path = rq->path, tail;
    char sandbox[CAP_ID_MAX];
    httpd_touch(c->srv);
    if (sv_eq(path, SV("/v1/health")) && sv_eq(rq->method, SV("GET"))) {
        route_health_node(n, c);
        return;
    }
    if (!parse_runs_path(path, sandbox, &tail)) {
        http_not_found(c, 0, "no such route");
        return;
    }
    bool get = sv_eq(rq->method, SV("GET")), post = sv_eq(rq->method, SV("POST"));
    if (tail.len == 0 && sv_eq(rq->method, SV("PUT")))
        route_manage(n, c, sandbox, "install");
    else if (tail.len == 0 && sv_eq(rq->method, SV("DELETE")))
        route_manage(n, c, sandbox, "retire");
    else if (sv_eq(tail, SV("/pause")) && post)
        route_manage(n, c, sandbox, "pause");
    else if (sv_eq(tail, SV("/state")) && get)
        route_manage(n, c, sandbox, "state");
    else if (sv_has_prefix(tail, SV("/ports/")))
        route_forward(n, c, sandbox, tail);
    else if (tail.len == 0 || sv_eq(tail, SV("/pause")) || sv_eq(tail, SV("/state")))
        http_method_not_allowed(c, 0, "method not allowed");
    else
        http_not_found(c, 0, "no such route");
}
