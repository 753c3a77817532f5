/* SPDX-License-Identifier: MIT */
/* E2B's sandbox traffic through the edge: what E2B's SDKs send to a sandbox (envd, on port
 * 49983, our agent's port) and to the services in it (getHost(port)). They address a sandbox in
 * one of two ways (../shared/research/clients.md section 1.1):
 *
 *   E2b-Sandbox-Id: <id> + E2b-Sandbox-Port: <port>   with E2B_SANDBOX_URL = this control plane
 *   Host: <port>-<id>.<domain>                         otherwise (domain: --e2b-domain)
 *
 * The credential is the sandbox's access token (the job's SBX_TOKEN, envdAccessToken in the
 * create answer) in X-Access-Token, or for its ports (not envd) its traffic token
 * (trafficAccessToken, derived from the access token) in e2b-traffic-access-token. It is
 * compared with the job's sealed token here, before anything goes on (a presigned /files URL
 * goes on without one, and without the token the edge adds otherwise: its signature is the
 * agent's to check); then the request takes the edge's path like
 * every other (a capability bound to that run, method and path), and the agent checks the token
 * again. Unlike E2B, a sandbox's ports are never public: port traffic needs the token too. */
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>

#include "cap/purpose.h"
#include "common/log.h"
#include "e2b.h"
#include "pools.h"

#define E2B_ENVD_PORT CAP_AGENT_PORT /* 49983 both */

/* E2B's answers: envd's (Connect: a string code) or a port's ({"code": status}). */
_printf_(4, 5) static void refuse(conn_t *c, uint16_t port, int status, const char *fmt, ...)
{
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    (void)vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* (502, the sandbox is not running, and 503 are both "unavailable" to a Connect client) */
    const char *code = status == HTTP_UNAUTHORIZED  ? "unauthenticated"
                       : status == HTTP_BAD_REQUEST ? "invalid_argument"
                                                    : "unavailable";
    conn_respond_json(c, status,
                      port == E2B_ENVD_PORT
                          ? json_pack("{s:s,s:s}", "code", code, "message", msg)
                          : json_pack("{s:i,s:s}", "code", status, "message", msg));
}

static bool parse_port(sv_t v, uint16_t *ret)
{
    uint64_t p;
    if (parse_u64(v, 65535, &p) < 0 || p == 0)
        return false;
    *ret = (uint16_t)p;
    return true;
}

/* "<port>-<id>.<anything>[:port]": the left-most label split at its first '-'. */
static bool host_route(sv_t host, char id[CAP_ID_MAX], uint16_t *ret_port)
{
    const char *dot = memchr(host.p, '.', host.len);
    if (!dot)
        return false;
    sv_t label = sv_make(host.p, (size_t)(dot - host.p));
    const char *dash = memchr(label.p, '-', label.len);
    if (!dash || !parse_port(sv_make(label.p, (size_t)(dash - label.p)), ret_port))
        return false;
    sv_t sid = sv_make(dash + 1, (size_t)(label.p + label.len - dash - 1));
    return sv_copy(sid, id, CAP_ID_MAX) && cap_id_valid(id);
}

/* Where a sandbox's traffic goes: the job whose run serves it (a dedicated sandbox's own, or a
 * pooled one's host), the generation it lives in, its namespace and token, and for a pooled
 * sandbox the agent's path prefix for it. */
typedef struct {
    char ns[64], job[CAP_ID_MAX], token[128];
    uint64_t generation;
    bool pooled;
} target_t;

/* The E2B sandbox id names, running: 0; -ESRCH when there is none (no such job, not one of
 * E2B's, being killed or paused: not running from the moment it was asked to stop; a pooled
 * one gone); another -errno when the store cannot be read. */
static int sandbox_lookup(control_t *ctl, const char *id, target_t *ret)
{
    if (e2b_pooled_id(id)) {
        e2b_pool_target_t t;
        int r = e2b_pool_target(ctl->store, &ctl->seal, id, &t);
        if (r >= 0) {
            *ret = (target_t){ .generation = t.generation, .pooled = true };
            memcpy(ret->ns, t.ns, sizeof ret->ns);
            (void)snprintf(ret->job, sizeof ret->job, "%s", t.host);
            memcpy(ret->token, t.token, sizeof ret->token);
        }
        sodium_memzero(&t, sizeof t);
        return r;
    }
    runrec_t rr;
    int r = runrec_load(ctl->store, id, &rr, NULL);
    if (r >= 0 && rr.state != RR_RUNNING && rr.state != RR_INSTALLING)
        r = -ENOENT;
    json_t *job = NULL, *sec = NULL;
    if (r >= 0 && (r = job_load(ctl->store, rr.ns, id, &job, NULL)) >= 0) {
        job_stage_t st;
        job_desired_t d;
        bool running = e2b_job(job) && job_stage_of(job, &st) == 0 && !job_stage_ended(st) &&
                       job_desired_of(job, &d) == 0 && d == DESIRED_RUNNING;
        json_decref(job);
        r = running ? 0 : -ENOENT;
    }
    if (r >= 0)
        r = job_secrets_get(ctl->store, &ctl->seal, id, &sec);
    const char *tok = json_string_value(json_object_get(sec, "SBX_TOKEN"));
    if (r >= 0 && (!tok || strlen(tok) >= sizeof ret->token))
        r = -EBADMSG;
    if (r >= 0) {
        *ret = (target_t){ .generation = rr.run.generation };
        memcpy(ret->ns, rr.ns, sizeof ret->ns);
        (void)snprintf(ret->job, sizeof ret->job, "%s", id);
        memcpy(ret->token, tok, strlen(tok) + 1);
    }
    pool_json_wipe(sec);
    return r == -ENOENT ? -ESRCH : r;
}

static bool port_exposed(const control_t *ctl, uint16_t port)
{
    for (int i = 0; i < ctl->cfg.n_e2b_ports; i++)
        if (ctl->cfg.e2b_ports[i] == port)
            return true;
    return port == E2B_ENVD_PORT;
}

/* GET or POST /files?...signature=...: a presigned URL of E2B's SDK (downloadUrl, uploadUrl). */
static bool presigned_files(const http_request_t *rq)
{
    const char *q = memchr(rq->target.p, '?', rq->target.len);
    sv_t sig;
    return (sv_eq(rq->method, SV("GET")) || sv_eq(rq->method, SV("POST"))) &&
           sv_eq(rq->path, SV("/files")) && q &&
           query_get_raw(sv_make(q + 1, rq->target.len - (size_t)(q + 1 - rq->target.p)),
                         "signature", &sig) &&
           sig.len > 0;
}

bool e2b_traffic_route(control_t *ctl, conn_t *c)
{
    char id[CAP_ID_MAX], tok[256];
    uint16_t port = E2B_ENVD_PORT;
    sv_t v;
    if (http_header_get(&c->req, "e2b-sandbox-id", &v)) {
        sv_t pv;
        if (http_header_get(&c->req, "e2b-sandbox-port", &pv) && !parse_port(pv, &port)) {
            refuse(c, E2B_ENVD_PORT, HTTP_BAD_REQUEST, "E2b-Sandbox-Port: a port number (1-65535)");
            return true;
        }
        if (!sv_copy(v, id, sizeof id) || !cap_id_valid(id)) {
            refuse(c, port, HTTP_BAD_GATEWAY, "sandbox not found");
            return true;
        }
    } else if (!http_header_get(&c->req, "host", &v) || !host_route(v, id, &port)) {
        return false; /* not E2B's sandbox traffic */
    }
    /* the access token reaches everything; the traffic token only the ports, not envd; a
     * presigned /files URL carries no token: its signature (of path, operation, user, token
     * and expiry) is the agent's to check, and the edge adds no token of its own to it */
    bool traffic = false, presigned = false;
    if (!http_header_get(&c->req, "x-access-token", &v)) {
        traffic = port != E2B_ENVD_PORT && http_header_get(&c->req, "e2b-traffic-access-token", &v);
        presigned = !traffic && port == E2B_ENVD_PORT && presigned_files(&c->req);
    }
    if (!presigned && ((!traffic && !http_header_get(&c->req, "x-access-token", &v)) ||
                       !sv_copy(v, tok, sizeof tok) || !tok[0])) {
        refuse(c, port, HTTP_UNAUTHORIZED,
               "sandbox %s: its access token is required (X-Access-Token: the envdAccessToken "
               "of the create answer)",
               id);
        return true;
    }
    target_t t;
    int r = sandbox_lookup(ctl, id, &t);
    if (r < 0) {
        sodium_memzero(tok, sizeof tok);
        /* E2B's SDKs read 502 (only) as "the sandbox is not running" */
        if (r == -ESRCH)
            refuse(c, port, HTTP_BAD_GATEWAY, "sandbox %s is not running", id);
        else
            refuse(c, port, HTTP_UNAVAILABLE, "the control plane cannot read its store");
        return true;
    }
    char derived[E2B_TRAFFIC_TOKEN_HEX + 1] = "";
    if (traffic)
        e2b_traffic_token(t.token, derived);
    const char *cmp = traffic ? derived : t.token;
    bool ok =
        presigned || (strlen(cmp) == strlen(tok) && sodium_memcmp(cmp, tok, strlen(tok)) == 0);
    sodium_memzero(tok, sizeof tok);
    sodium_memzero(derived, sizeof derived);
    char owner[CAP_ID_MAX + 16], path[HTTP_MAX_HEAD];
    (void)snprintf(owner, sizeof owner, "sandbox:%s", id);
    /* a pooled sandbox: its routes on its host's agent, its ports through that agent's proxy
     * (where a dedicated run's node refuses a port the job does not expose, this does) */
    int n = !t.pooled ? snprintf(path, sizeof path, SV_FMT, SV_ARG(c->req.path))
            : port == E2B_ENVD_PORT
                ? snprintf(path, sizeof path, "/v1/sandboxes/%s" SV_FMT, id, SV_ARG(c->req.path))
                : snprintf(path, sizeof path, "/v1/sandboxes/%s/proxy/%u" SV_FMT, id,
                           (unsigned)port, SV_ARG(c->req.path));
    if (!ok)
        refuse(c, port, HTTP_UNAUTHORIZED, "sandbox %s: wrong access token", id);
    else if (n < 0 || (size_t)n >= sizeof path)
        refuse(c, port, HTTP_BAD_REQUEST, "path too long");
    else if (t.pooled && !port_exposed(ctl, port))
        refuse(c, port, HTTP_FORBIDDEN,
               "port %u of sandbox %s is not exposed (sbx-control --e2b-ports)", (unsigned)port,
               id);
    else if (auth_account(ctl, c, owner)) {
        /* to the run it has now, with its token for the agent (which also guards the ports) */
        edge_pin_t pin = { .generation = t.generation,
                           .sandbox = id,
                           .token = presigned ? NULL : t.token };
        edge_proxy(ctl, c, t.ns, t.job, t.pooled ? E2B_ENVD_PORT : port, sv_make(path, (size_t)n),
                   &pin);
    }
    sodium_memzero(&t, sizeof t);
    return true;
}
