/* SPDX-License-Identifier: MIT */
/* Blocking calls from the control plane to one run on its node (the reconciler's installs,
 * pauses and retires; the pool service's calls to a pool host's agent). Every call carries a
 * capability naming exactly that run, bound to its method and target (and, for management, its
 * body), and goes only to a node that proves its registered TLS key. */
#include <sodium.h>
#include <stdio.h>

#include "cap/purpose.h"
#include "common/log.h"
#include "control.h"

int node_request(control_t *ctl, store_t *st, const keyring_t *kr, const node_req_t *q,
                 httpc_response_t *resp, sbx_err_t *err)
{
    cap_t cap = { .run = *q->run, .access = q->access, .port = q->cap_port, .proto = q->proto };
    char wire[CAP_WIRE_MAX + 64];
    int r = cap_bind_request(&cap, q->method, strlen(q->method), q->target, strlen(q->target),
                             q->bind_body ? (q->body ? q->body : "") : NULL,
                             q->bind_body ? q->body_len : 0);
    if (r >= 0)
        r = keys_sign(kr, &cap, wire, sizeof wire);
    if (r < 0)
        return sbx_err(err, r, "cannot sign a capability for %s: %s", q->run->sandbox,
                       strerror(-r));
    size_t hcap = sizeof wire + 128 + (q->headers ? strlen(q->headers) : 0);
    _cleanup_free_ char *hdr = malloc(hcap);
    if (!hdr)
        return sbx_err(err, -ENOMEM, "out of memory");
    (void)snprintf(hdr, hcap, "X-Sbx-Capability: %s\r\nContent-Type: application/json\r\n%s", wire,
                   q->headers ? q->headers : "");
    httpc_request_t rq;
    httpc_request_init(&rq);
    /* TLS: the node's certificate must chain to our CA, name its address and carry the key its
     * registration pinned; nothing (no capability, no secret) is sent to anyone else */
    uint8_t pin[TLS_PIN_BYTES];
    tls_peer_t peer = { .ctx = ctl->tls_client, .ip = q->host, .key_pin = pin };
    if (ctl->tls_client) {
        if (node_pin_load(st, q->run->node, pin) < 0)
            return sbx_err(err, -ENOKEY, "node %s has no registered TLS key", q->run->node);
        rq.transport = (sockio_wrap_t){ tls_wrap_peer, &peer };
    }
    /* Kept alive under what the connection was proven to be: address and pinned key. */
    char key[HTTPC_POOL_KEY_MAX], pinhex[2 * TLS_PIN_BYTES + 1] = "plain";
    if (ctl->tls_client)
        (void)sodium_bin2hex(pinhex, sizeof pinhex, pin, sizeof pin);
    (void)snprintf(key, sizeof key, "%s|%u|%s", q->host, (unsigned)q->port, pinhex);
    rq.pool = ctl->node_calls;
    rq.pool_key = key;
    rq.host = q->host;
    rq.port = q->port;
    rq.method = q->method;
    rq.target = q->target;
    rq.headers = hdr;
    rq.body = q->body;
    rq.body_len = q->body_len;
    rq.timeout_ms = q->timeout_ms;
    rq.body_max = q->body_max;
    r = httpc_do(&rq, resp);
    sodium_memzero(hdr, hcap); /* may hold a sandbox token */
    if (r < 0)
        return sbx_err(err, r, "node %s:%u: %s%s%s", q->host, q->port, strerror(-r),
                       r == -EPERM ? ": " : "", r == -EPERM ? tls_last_error() : "");
    return 0;
}

int agent_call(control_t *ctl, store_t *st, const keyring_t *kr, const runrec_t *rr,
               const char *method, const char *path, const char *token, json_t *body,
               uint64_t timeout_ms, int *ret_status, json_t **ret_json, sbx_err_t *err)
{
    char target[512], hdr[160] = "";
    int n = snprintf(target, sizeof target, "/v1/runs/%s/ports/%u%s", rr->run.sandbox,
                     CAP_AGENT_PORT, path);
    if (n < 0 || (size_t)n >= sizeof target)
        return -E2BIG;
    if (token)
        (void)snprintf(hdr, sizeof hdr, "X-Sandbox-Token: %s\r\n", token);
    _cleanup_free_ char *b = body ? json_dumps(body, JSON_COMPACT) : NULL;
    if (body && !b)
        return -ENOMEM;
    uint32_t purpose = cap_purpose_of(sv_make(method, strlen(method)), CAP_AGENT_PORT,
                                      sv_make(path, strcspn(path, "?")));
    node_req_t q = {
        .host = rr->host,
        .port = rr->port,
        .run = &rr->run,
        .access = purpose,
        .cap_port = purpose == CAP_PROXY ? CAP_AGENT_PORT : 0,
        .proto = purpose == CAP_PROXY ? CAP_PROTO_HTTP : CAP_PROTO_NONE,
        .method = method,
        .target = target,
        .headers = hdr,
        .body = b,
        .body_len = b ? strlen(b) : 0,
        .bind_body = true,
        .timeout_ms = timeout_ms,
    };
    httpc_response_t resp = { 0 };
    int r = node_request(ctl, st, kr, &q, &resp, err);
    sodium_memzero(hdr, sizeof hdr);
    if (r < 0)
        return r;
    *ret_status = resp.status;
    json_t *j = json_loadb(resp.body ? resp.body : "", resp.body_len, 0, NULL);
    if (resp.status >= 300) {
        const char *e = json_string_value(json_object_get(j, "error"));
        (void)sbx_err(err, -EIO, "agent of %s answered %d: %s", rr->run.sandbox, resp.status,
                      e ? e : "(no reason given)");
    }
    if (ret_json)
        *ret_json = j;
    else
        json_decref(j);
    if (resp.body)
        sodium_memzero(resp.body, resp.body_len); /* may hold sandbox tokens */
    httpc_response_free(&resp);
    return 0;
}
