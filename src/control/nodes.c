/* SPDX-License-Identifier: MIT */
/* Nodes: registration with the join token, heartbeats with the node's own token, and liveness.
 * Both answers carry the verification key set (public keys only).
 *   POST /v1/nodes/register            (Bearer <join token>)
 *   POST /v1/nodes/{name}/heartbeat    (Bearer <node token>)
 *   GET  /v1/nodes                     (admin) */
#include <sodium.h>
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>

#include "cap/imagename.h"
#include "common/log.h"
#include "control.h"

#define NODE_IMAGES_MAX 256

static bool bearer_hash(conn_t *c, char out[65])
{
    sv_t v;
    if (!http_header_get(&c->req, "authorization", &v) || v.len < 8 || v.len > 200 ||
        !sv_eq_lit_nocase(sv_make(v.p, 7), "bearer "))
        return false;
    char tok[256];
    memcpy(tok, v.p + 7, v.len - 7);
    tok[v.len - 7] = 0;
    auth_token_hash(tok, out);
    sodium_memzero(tok, sizeof tok);
    return true;
}

static bool hash_eq(const char *a, const char *b)
{
    return strlen(a) == 64 && strlen(b) == 64 && sodium_memcmp(a, b, 64) == 0;
}

/* A node's image report, checked: [{name, digest, size}], at most NODE_IMAGES_MAX. A new
 * reference, or NULL when it does not parse. */
static json_t *images_from_report(json_t *v)
{
    json_t *out = json_array(), *e;
    size_t i;
    if (!out || !json_is_array(v) || json_array_size(v) > NODE_IMAGES_MAX) {
        json_decref(out);
        return NULL;
    }
    json_array_foreach(v, i, e) {
        const char *name, *digest;
        json_int_t size;
        if (json_unpack(e, "{s:s,s:s,s:I}", "name", &name, "digest", &digest, "size", &size) < 0 ||
            !image_name_valid(name) || strlen(digest) != 71 || memcmp(digest, "sha256:", 7) != 0 ||
            size < 0) {
            json_decref(out);
            return NULL;
        }
        json_array_append_new(
            out, json_pack("{s:s,s:s,s:I}", "name", name, "digest", digest, "size", size));
    }
    return out;
}

bool node_rec_has_image(json_t *rec, const char *name)
{
    size_t i;
    json_t *e;
    if (streq(name, "host"))
        return true;
    json_array_foreach(json_object_get(rec, "images"), i, e) {
        const char *n = json_string_value(json_object_get(e, "name"));
        if (n && streq(n, name))
            return true;
    }
    return false;
}

static uint64_t image_size_in(json_t *rec, const char *name)
{
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(rec, "images"), i, e) {
        const char *n = json_string_value(json_object_get(e, "name"));
        if (n && streq(n, name))
            return (uint64_t)json_integer_value(json_object_get(e, "size"));
    }
    return 0;
}

bool image_on_live_node(store_t *st, const char *name, uint64_t *ret_size)
{
    store_kv_t *kvs;
    size_t n;
    bool found = false;
    uint64_t size = 0;
    if (ret_size)
        *ret_size = 0;
    if (streq(name, "host"))
        return true;
    if (store_list(st, "nodes/", &kvs, &n) < 0)
        return false;
    int64_t now = wall_ms();
    for (size_t i = 0; i < n; i++) {
        json_t *j = json_loadb(kvs[i].value, kvs[i].value_len, 0, NULL);
        json_int_t seen = json_integer_value(json_object_get(j, "last_seen_ms"));
        if (j && now - seen < CTL_NODE_LIVE_MS && node_rec_has_image(j, name)) {
            found = true;
            size = MAX(size, image_size_in(j, name));
        }
        json_decref(j);
    }
    store_kv_free(kvs, n);
    if (ret_size)
        *ret_size = size;
    return found;
}

/* The key set goes out signed by the control plane's identity (nodes refuse anything else). */
static void respond_keys(control_t *ctl, conn_t *c, int status, const char *token,
                         const char *tls_cert)
{
    if (!ctl->keyset_wire[0]) {
        http_unavailable(c, 0, "no signed key set yet");
        return;
    }
    json_t *j = json_pack("{s:s,s:I,s:i}", "keyset", ctl->keyset_wire, "keyset_version",
                          (json_int_t)ctl->keyset_version, "heartbeat_ms", 1000);
    if (j && token)
        json_object_set_new(j, "node_token", json_string(token));
    if (j && tls_cert)
        json_object_set_new(j, "tls_cert", json_string(tls_cert));
    conn_respond_json(c, status, j);
}

static void register_done(conn_t *c)
{
    control_t *ctl = c->srv->app;
    char hash[65];
    store_kv_t kv;
    if (!bearer_hash(c, hash) || store_get(ctl->store, "meta/join-token", &kv) < 0) {
        http_unauthorized(c, 0, "register: the join token is required");
        return;
    }
    bool ok = kv.value_len == 64 && hash_eq(kv.value, hash);
    store_kv_clear(&kv);
    if (!ok) {
        http_unauthorized(c, 0, "register: wrong join token");
        return;
    }
    json_t *b = json_loadb(buf_head(&c->body), c->body.len, 0, NULL);
    const char *name, *url;
    json_int_t capacity = 64;
    char host[64];
    uint16_t port;
    json_t *images = NULL;
    const char *tls_pub = NULL;
    if (json_unpack(b, "{s:s,s:s,s?I,s?o,s?s}", "name", &name, "url", &url, "capacity", &capacity,
                    "images", &images, "tls_pubkey", &tls_pub) < 0 ||
        (images && !(images = images_from_report(images))) || !cap_id_valid(name) ||
        parse_hostport(url, host, sizeof host, &port) < 0 || capacity < 1) {
        json_decref(images);
        json_decref(b);
        http_bad_request(c, 0,
                         "register: expected {name, url: \"ip:port\", capacity, images: "
                         "[{name, digest, size}], tls_pubkey}");
        return;
    }
    /* TLS: the node's key is certified for its address and pinned in its record */
    _cleanup_free_ char *cert = NULL;
    char pin_b64[48] = "";
    if (ctl->tls_server) {
        uint8_t pin[TLS_PIN_BYTES];
        const char *ips[] = { host, NULL };
        int tr = !tls_pub ? -ENOKEY
                 : tls_pubkey_pin(tls_pub, strlen(tls_pub), pin) < 0
                     ? -EINVAL
                     : tls_issue(ctl->cfg.tls_dir, tls_pub, name, ips, NULL, &cert);
        if (tr < 0) {
            json_decref(images);
            json_decref(b);
            http_bad_request(c, 0,
                             tr == -ENOKEY ? "register: this control plane speaks TLS: send "
                                             "tls_pubkey (the node's public key, PEM)"
                                           : "register: cannot certify tls_pubkey for %s: %s",
                             host, tls_last_error());
            return;
        }
        sodium_bin2base64(pin_b64, sizeof pin_b64, pin, sizeof pin,
                          sodium_base64_VARIANT_URLSAFE_NO_PADDING);
    }
    char tok[64], hex[41], thash[65], key[96];
    random_hex(hex, 20);
    (void)snprintf(tok, sizeof tok, "sbxnode_%s", hex);
    auth_token_hash(tok, thash);
    (void)snprintf(key, sizeof key, "nodes/%s", name);
    /* A registered name stays its node's: registering it again takes that node's token
     * (X-Sbx-Node-Token), so a holder of the join token cannot take over another node. */
    int64_t expect = STORE_REV_ABSENT;
    store_kv_t old;
    if (store_get(ctl->store, key, &old) == 0) {
        json_t *o = json_loadb(old.value, old.value_len, 0, NULL);
        const char *th = json_string_value(json_object_get(o, "token_hash"));
        char prev[65];
        sv_t v;
        bool same = false;
        if (th && http_header_get(&c->req, "x-sbx-node-token", &v) && v.len > 0 && v.len < 200) {
            char t[200];
            memcpy(t, v.p, v.len);
            t[v.len] = 0;
            auth_token_hash(t, prev);
            sodium_memzero(t, sizeof t);
            same = hash_eq(th, prev);
        }
        expect = old.rev;
        json_decref(o);
        store_kv_clear(&old);
        if (!same) {
            json_decref(images);
            json_decref(b);
            http_conflict(c, 0,
                          "register: the name is registered to another node "
                          "(present its node token in X-Sbx-Node-Token)");
            return;
        }
    }
    json_t *rec =
        json_pack("{s:s,s:s,s:I,s:I,s:s,s:I,s:I}", "name", name, "host", host, "port",
                  (json_int_t)port, "capacity", capacity, "token_hash", thash, "last_seen_ms",
                  /* live (placeable) from its first heartbeat, once it holds the keys */
                  (json_int_t)0, "registered_ms", (json_int_t)wall_ms());
    /* the images the node verified: what jobs may name (GET /v1/nodes shows them) */
    if (rec)
        json_object_set_new(rec, "images", images ? images : json_array());
    else
        json_decref(images);
    if (rec && pin_b64[0])
        json_object_set_new(rec, "tls_pin", json_string(pin_b64));
    log_info("node %s registered at %s:%llu", name, host, (unsigned long long)port);
    json_decref(b);
    char *v = rec ? json_dumps(rec, JSON_COMPACT) : NULL;
    json_decref(rec);
    int r = v ? store_cas(ctl->store, key, v, strlen(v), expect, NULL) : -ENOMEM;
    free(v);
    if (r == -ESTALE) {
        http_conflict(c, 0, "register: the node record changed meanwhile; try again");
        return;
    }
    if (r < 0) {
        http_errno(c, 0, r, "register");
        return;
    }
    control_kick(ctl);
    respond_keys(ctl, c, 200, tok, cert);
    sodium_memzero(tok, sizeof tok);
}

/* A run the node reports as exited ends its job, if it is still the job's current run. One it
 * reports as paused (stopped with its root kept) although the record says running was stopped
 * by the node itself (it went down with SIGTERM and came back): the record becomes paused, and
 * the reconciler resumes the job as a new generation from that root, as after a pause. */
static void run_reported(control_t *ctl, const char *node, json_t *rep)
{
    const char *sb, *act, *state;
    json_int_t gen, status = 0;
    if (json_unpack(rep, "{s:s,s:I,s:s,s:s,s?I}", "sandbox", &sb, "generation", &gen, "activation",
                    &act, "state", &state, "exit_status", &status) < 0 ||
        !(streq(state, "exited") || streq(state, "paused")) || !cap_id_valid(sb))
        return;
    runrec_t rr;
    int64_t rev;
    if (runrec_load(ctl->store, sb, &rr, &rev) < 0 || rr.state != RR_RUNNING ||
        rr.run.generation != (uint64_t)gen || !streq(rr.run.activation, act) ||
        !streq(rr.run.node, node))
        return;
    if (streq(state, "paused")) {
        if (runrec_set_state(&rr, RR_PAUSED) == 0 &&
            runrec_cas(ctl->store, sb, &rr, rev, NULL) >= 0) {
            log_info("job %s: node %s stopped generation %llu (root kept): resuming it", sb, node,
                     (unsigned long long)gen);
            control_kick(ctl);
        }
        return;
    }
    if (runrec_set_state(&rr, RR_EXITED) < 0 || runrec_cas(ctl->store, sb, &rr, rev, NULL) < 0)
        return;
    json_t *job;
    int64_t jrev;
    if (job_load(ctl->store, rr.ns, sb, &job, &jrev) < 0)
        return;
    bool ok = status >= 0 && WIFEXITED((int)status) && WEXITSTATUS((int)status) == 0;
    job_set_stage(job, ok ? STAGE_COMPLETED : STAGE_ERROR);
    char msg[96];
    if (status < 0) /* the node was down when it ended: its status is unknown */
        (void)snprintf(msg, sizeof msg, "the run ended while its node was down");
    else
        (void)snprintf(msg, sizeof msg, "the command exited (%s %d)",
                       WIFEXITED((int)status) ? "status" : "signal",
                       WIFEXITED((int)status) ? WEXITSTATUS((int)status) : WTERMSIG((int)status));
    json_object_set_new(job, "message", json_string(msg));
    (void)job_save(ctl->store, rr.ns, sb, job, jrev, NULL);
    json_decref(job);
}

static void heartbeat_done(conn_t *c, const char *name)
{
    control_t *ctl = c->srv->app;
    char hash[65], key[96];
    (void)snprintf(key, sizeof key, "nodes/%s", name);
    store_kv_t kv;
    if (!bearer_hash(c, hash) || store_get(ctl->store, key, &kv) < 0) {
        http_unauthorized(c, 0, "heartbeat: unknown node or missing token");
        return;
    }
    json_t *rec = json_loadb(kv.value, kv.value_len, 0, NULL);
    int64_t rev = kv.rev;
    store_kv_clear(&kv);
    const char *th = json_string_value(json_object_get(rec, "token_hash"));
    if (!th || !hash_eq(th, hash)) {
        json_decref(rec);
        http_unauthorized(c, 0, "heartbeat: wrong node token");
        return;
    }
    char owner[96];
    (void)snprintf(owner, sizeof owner, "node:%s", name);
    if (!auth_account(ctl, c, owner)) {
        json_decref(rec);
        return;
    }
    json_t *b = json_loadb(buf_head(&c->body), c->body.len, 0, NULL);
    json_t *images = images_from_report(json_object_get(b, "images"));
    if (images)
        json_object_set_new(rec, "images", images);
    else if (json_object_get(b, "images"))
        log_warn("node %s: its image report does not parse; keeping the last one", name);
    json_t *room = json_object_get(b, "disk_room_mb");
    if (json_is_integer(room))
        json_object_set_new(rec, "disk_room_mb", json_integer(json_integer_value(room)));
    json_object_set_new(rec, "last_seen_ms", json_integer(wall_ms()));
    char *v = json_dumps(rec, JSON_COMPACT);
    json_decref(rec);
    if (v)
        (void)store_cas(ctl->store, key, v, strlen(v), rev, NULL);
    free(v);
    size_t i;
    json_t *rep;
    json_array_foreach(json_object_get(b, "runs"), i, rep)
        run_reported(ctl, name, rep);
    json_decref(b);
    respond_keys(ctl, c, 200, NULL, NULL);
}

typedef struct {
    char name[CAP_ID_MAX];
} hb_ctx_t;

static void hb_free(conn_t *c, bool aborted)
{
    (void)aborted;
    free(c->hdata);
    c->hdata = NULL;
}
static const handler_ops_t hb_ops = { .on_close = hb_free };

static void hb_body_done(conn_t *c)
{
    hb_ctx_t *h = c->hdata;
    heartbeat_done(c, h->name);
}

static void list_nodes(control_t *ctl, conn_t *c)
{
    store_kv_t *kvs;
    size_t n;
    int rl = store_list(ctl->store, "nodes/", &kvs, &n);
    if (rl < 0) {
        respond_store_err(c, rl, "nodes", "nodes: not found");
        return;
    }
    json_t *arr = json_array();
    int64_t now = wall_ms();
    for (size_t i = 0; i < n; i++) {
        json_t *j = json_loadb(kvs[i].value, kvs[i].value_len, 0, NULL);
        if (!j)
            continue;
        json_object_del(j, "token_hash");
        json_int_t seen = json_integer_value(json_object_get(j, "last_seen_ms"));
        json_object_set_new(j, "live", json_boolean(now - seen < CTL_NODE_LIVE_MS));
        json_array_append_new(arr, j);
    }
    store_kv_free(kvs, n);
    conn_respond_json(c, 200, arr);
}

void route_nodes(control_t *ctl, conn_t *c, sv_t rest)
{
    bool post = sv_eq(c->req.method, SV("POST"));
    if (rest.len == 0 && sv_eq(c->req.method, SV("GET"))) {
        if (auth_check(ctl, c, "", ROLE_ADMIN, NULL))
            list_nodes(ctl, c);
        return;
    }
    if (sv_eq(rest, SV("register")) && post) {
        conn_collect_body(c, 16 * 1024, register_done);
        return;
    }
    static const char hb[] = "/heartbeat";
    if (post && rest.len > sizeof hb - 1 &&
        memcmp(rest.p + rest.len - (sizeof hb - 1), hb, sizeof hb - 1) == 0) {
        size_t nl = rest.len - (sizeof hb - 1);
        hb_ctx_t *h = calloc(1, sizeof *h);
        if (!h || nl >= sizeof h->name) {
            free(h);
            http_not_found(c, 0, "no such node");
            return;
        }
        memcpy(h->name, rest.p, nl);
        h->name[nl] = 0;
        if (!cap_id_valid(h->name)) {
            free(h);
            http_not_found(c, 0, "no such node");
            return;
        }
        conn_set_handler(c, &hb_ops, h);
        conn_collect_body(c, 256 * 1024, hb_body_done);
        return;
    }
    http_not_found(c, 0, "no such route");
}

int node_pin_load(store_t *st, const char *name, uint8_t pin[TLS_PIN_BYTES])
{
    char key[96];
    store_kv_t kv;
    (void)snprintf(key, sizeof key, "nodes/%s", name);
    if (store_get(st, key, &kv) < 0)
        return -ENOENT;
    json_t *rec = json_loadb(kv.value, kv.value_len, 0, NULL);
    store_kv_clear(&kv);
    const char *b = json_string_value(json_object_get(rec, "tls_pin"));
    size_t len = 0;
    int r = b &&
                    sodium_base642bin(pin, TLS_PIN_BYTES, b, strlen(b), NULL, &len, NULL,
                                      sodium_base64_VARIANT_URLSAFE_NO_PADDING) == 0 &&
                    len == TLS_PIN_BYTES
                ? 0
                : -ENOENT;
    json_decref(rec);
    return r;
}
