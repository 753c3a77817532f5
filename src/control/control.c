/* SPDX-License-Identifier: MIT */
#include "control.h"

#include <arpa/inet.h>
#include <sodium.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>

#include "common/fileio.h"
#include "common/log.h"

void control_kick(control_t *ctl)
{
    pthread_mutex_lock(&ctl->rec_lock);
    ctl->rec_dirty = true;
    pthread_cond_signal(&ctl->rec_cond);
    pthread_mutex_unlock(&ctl->rec_lock);
}

/* Signing keys are re-read every second: another replica may have rotated them. */
static void keys_tick(loop_t *l, timer_t_ *t)
{
    control_t *ctl = t->data;
    keyring_t kr;
    if (l) {
        edge_conns_sweep(ctl, false); /* idle connections to nodes past their keep time */
        (void)control_heartbeat(ctl->store, ctl->instance); /* what we install is ours */
    }
    if (keys_load(ctl->store, &ctl->seal, &kr) >= 0)
        ctl->keys = kr;
    sodium_memzero(&kr, sizeof kr);
    /* the signed key set nodes receive (re-signed only when its version changes) */
    char wire[CAP_KEYSET_WIRE_MAX];
    uint64_t version = 0;
    int r = keys_signed_set(ctl->store, &ctl->keys, &ctl->identity, (int64_t)time(NULL), wire,
                            sizeof wire, &version);
    if (r >= 0) {
        memcpy(ctl->keyset_wire, wire, (size_t)r + 1);
        ctl->keyset_version = version;
    } else
        log_warn("cannot sign the key set: %s", strerror(-r));
    if (l)
        (void)timer_arm(l, t, 1000);
}

static void rotate_done(conn_t *c)
{
    control_t *ctl = c->srv->app;
    int r = keys_rotate(ctl->store, &ctl->seal, ctl->cfg.publish_delay_ms);
    if (r < 0) {
        http_errno(c, 0, r, "rotate");
        return;
    }
    keys_tick(ctl->srv.loop, &ctl->keys_t);
    json_t *arr = json_array();
    for (size_t i = 0; i < ctl->keys.n; i++) {
        const cap_keyrec_t *k = &ctl->keys.recs[i];
        json_array_append_new(arr,
                              json_pack("{s:s,s:I,s:I,s:I}", "kid", k->key.kid, "created",
                                        (json_int_t)k->created, "activate", (json_int_t)k->activate,
                                        "retired", (json_int_t)k->retired));
    }
    conn_respond_json(c, 200, json_pack("{s:o}", "keys", arr));
}

size_t path_split(sv_t s, sv_t *seg, size_t n)
{
    size_t k = 0;
    while (s.len && k < n) {
        const char *slash = memchr(s.p, '/', s.len);
        seg[k++] = sv_make(s.p, slash ? (size_t)(slash - s.p) : s.len);
        if (!slash)
            return k;
        s = sv_make(slash + 1, s.len - seg[k - 1].len - 1);
    }
    return k;
}

bool sv_copy(sv_t v, char *out, size_t cap)
{
    if (v.len == 0 || v.len >= cap || memchr(v.p, 0, v.len))
        return false;
    memcpy(out, v.p, v.len);
    out[v.len] = 0;
    return true;
}

static void hdata_free(conn_t *c, bool aborted)
{
    (void)aborted;
    free(c->hdata);
    c->hdata = NULL;
}
const handler_ops_t ctl_hdata_free_ops = { .on_close = hdata_free };

static void control_dispatch(conn_t *c)
{
    control_t *ctl = c->srv->app;
    sv_t path = c->req.path;
    httpd_touch(c->srv);
    if (e2b_traffic_route(ctl, c)) /* to a sandbox, as E2B's SDKs address it (e2bproxy.c) */
        return;
    if (sv_eq(path, SV("/v1/health")) && sv_eq(c->req.method, SV("GET"))) {
        conn_respond_json(c, 200, json_pack("{s:s,s:s}", "status", "ok", "role", "control"));
        return;
    }
    if (sv_has_prefix(path, SV("/v1/jobs/"))) {
        route_jobs(ctl, c, sv_make(path.p + 9, path.len - 9));
        return;
    }
    if (e2b_route(ctl, c)) /* /sandboxes..., /v2/sandboxes...: E2B's control API (e2b.c) */
        return;
    if (sv_has_prefix(path, SV("/v1/pools/"))) {
        route_pools(ctl, c, sv_make(path.p + 10, path.len - 10));
        return;
    }
    if (sv_eq(path, SV("/v1/nodes"))) {
        route_nodes(ctl, c, SV(""));
        return;
    }
    if (sv_has_prefix(path, SV("/v1/nodes/"))) {
        route_nodes(ctl, c, sv_make(path.p + 10, path.len - 10));
        return;
    }
    if (sv_eq(path, SV("/v1/tokens")) && sv_eq(c->req.method, SV("POST"))) {
        route_tokens_create(ctl, c);
        return;
    }
    if (sv_eq(path, SV("/v1/tokens")) && sv_eq(c->req.method, SV("GET"))) {
        route_tokens_list(ctl, c);
        return;
    }
    if (sv_has_prefix(path, SV("/v1/tokens/")) && sv_eq(c->req.method, SV("DELETE"))) {
        route_tokens_delete(ctl, c, sv_make(path.p + 11, path.len - 11));
        return;
    }
    if (sv_eq(path, SV("/v1/admin/keys/rotate")) && sv_eq(c->req.method, SV("POST"))) {
        if (auth_check(ctl, c, "", ROLE_ADMIN, NULL))
            conn_collect_body(c, 1024, rotate_done);
        return;
    }
    http_not_found(c, 0, "no such route");
}

/* The CA (made on the first start, or the operator's in --tls-dir), the control plane's own
 * certificate for its addresses (issued again at every start: the CA is what is pinned), the
 * listener's and the node client's contexts, and the CA pin for the join material. */
static int control_tls_init(control_t *ctl)
{
    control_config_t *cfg = &ctl->cfg;
    if (cfg->plain_http) {
        log_warn("--insecure-plain-http: serving plain HTTP on %s; nodes are reached without TLS",
                 cfg->listen_ip);
        return 0;
    }
    if (!cfg->tls_dir[0] && (size_t)snprintf(cfg->tls_dir, sizeof cfg->tls_dir, "%.*s/tls",
                                             PATH_MAX - 8, cfg->state_dir) >= sizeof cfg->tls_dir)
        return -ENAMETOOLONG;
    if (mkdir(cfg->tls_dir, 0700) < 0 && errno != EEXIST)
        return negative_errno();
    int r = tls_ca_ensure(cfg->tls_dir);
    if (r < 0) {
        log_error("TLS CA in %s: %s", cfg->tls_dir, tls_last_error());
        return r;
    }
    char kp[PATH_MAX + 16], cp[PATH_MAX + 16], cap_[PATH_MAX + 16];
    (void)snprintf(kp, sizeof kp, "%s/control.key", cfg->tls_dir);
    (void)snprintf(cp, sizeof cp, "%s/control.crt", cfg->tls_dir);
    (void)snprintf(cap_, sizeof cap_, "%s/ca.crt", cfg->tls_dir);
    _cleanup_free_ char *pub = NULL, *chain = NULL;
    r = tls_key_ensure(kp, &pub);
    if (r < 0) {
        log_error("TLS key %s: %s", kp, tls_last_error());
        return r;
    }
    /* the listen address (unless a wildcard), loopback, and what the operator names */
    const char *ips[12], *dns[12];
    size_t ni = 0, nd = 0;
    unsigned char a[16];
    bool wildcard = streq(cfg->listen_ip, "0.0.0.0") || streq(cfg->listen_ip, "::");
    if (!wildcard && !addr_is_loopback(cfg->listen_ip))
        ips[ni++] = cfg->listen_ip;
    ips[ni++] = "127.0.0.1";
    ips[ni++] = "::1";
    dns[nd++] = "localhost";
    dns[nd++] = TLS_CONTROL_NAME; /* what nodes check: no node certificate names it */
    for (int i = 0; i < cfg->n_tls_sans; i++) {
        bool ip = inet_pton(AF_INET, cfg->tls_sans[i], a) == 1 ||
                  inet_pton(AF_INET6, cfg->tls_sans[i], a) == 1;
        if (ip)
            ips[ni++] = cfg->tls_sans[i];
        else
            dns[nd++] = cfg->tls_sans[i];
    }
    ips[ni] = dns[nd] = NULL;
    r = tls_issue(cfg->tls_dir, pub, "sbx-control", ips, dns, &chain);
    if (r >= 0)
        r = file_write_atomic(cp, chain, strlen(chain), 0644);
    if (r >= 0)
        r = tls_server_ctx_new(cp, kp, &ctl->tls_server);
    if (r >= 0)
        r = tls_client_ctx_new(cap_, NULL, &ctl->tls_client);
    _cleanup_free_ char *ca = NULL;
    size_t calen = 0;
    uint8_t pin[TLS_PIN_BYTES];
    if (r >= 0)
        r = file_read_all(cap_, 64 * 1024, &ca, &calen);
    if (r >= 0)
        r = tls_cert_pin(ca, calen, pin);
    if (r < 0) {
        log_error("TLS setup in %s: %s (%s)", cfg->tls_dir, strerror(-r), tls_last_error());
        return r;
    }
    sodium_bin2base64(ctl->ca_pin_b64, sizeof ctl->ca_pin_b64, pin, sizeof pin,
                      sodium_base64_VARIANT_URLSAFE_NO_PADDING);
    if (wildcard && cfg->n_tls_sans == 0)
        log_warn("listening on %s: the certificate names only loopback; give --tls-san for the "
                 "addresses clients and nodes use",
                 cfg->listen_ip);
    return 0;
}

int control_init(control_t *ctl, const control_config_t *cfg, const httpd_config_t *scfg)
{
    *ctl = (control_t){ .cfg = *cfg };
    pthread_mutex_init(&ctl->rec_lock, NULL);
    pthread_cond_init(&ctl->rec_cond, NULL);
    timer_init(&ctl->keys_t, keys_tick, ctl);
    if (mkdir(cfg->state_dir, 0700) < 0 && errno != EEXIST)
        return negative_errno();
    if (chmod(cfg->state_dir, 0700) < 0)
        return negative_errno();
    char path[PATH_MAX + 16];
    (void)snprintf(path, sizeof path, "%s/store.db", cfg->state_dir);
    int r = store_open_sqlite(path, &ctl->store);
    if (r < 0) {
        log_error("store %s: %s", path, strerror(-r));
        return r;
    }
    r = identity_load_or_create(cfg->state_dir, &ctl->identity);
    if (r < 0) {
        log_error("identity key in %s: %s", cfg->state_dir, strerror(-r));
        return r;
    }
    char hex[17];
    random_hex(hex, 8);
    (void)snprintf(ctl->instance, sizeof ctl->instance, "c-%s", hex);
    (void)control_heartbeat(ctl->store, ctl->instance);
    r = control_tls_init(ctl);
    if (r >= 0)
        r = secrets_keys_open(cfg, &ctl->seal);
    if (r >= 0)
        r = secrets_migrate(ctl->store, &ctl->seal);
    if (r >= 0)
        r = auth_bootstrap(ctl);
    if (r >= 0)
        r = keys_ensure(ctl->store, &ctl->seal, cfg->publish_delay_ms);
    if (r == -EBADMSG)
        log_error("a signing key in the store cannot be read (above): not starting");
    if (r >= 0)
        keys_tick(NULL, &ctl->keys_t); /* the key ring and the signed set */
    if (r >= 0 && !ctl->keyset_wire[0])
        r = -ENOKEY;
    if (r >= 0)
        r = routecache_init(&ctl->routes, 100000);
    if (r >= 0)
        r = climit_tab_new(&ctl->principals);
    if (r >= 0 && !(ctl->node_calls = httpc_pool_new(CTL_NODE_CALLS_IDLE)))
        r = -ENOMEM;
    if (r < 0)
        return r;
    r = httpd_init(&ctl->srv, scfg);
    if (r < 0)
        return r;
    ctl->srv.dispatch = control_dispatch;
    ctl->srv.app = ctl;
    if (ctl->tls_server)
        ctl->srv.transport = (sockio_wrap_t){ tls_wrap_server, ctl->tls_server };
    (void)timer_arm(ctl->srv.loop, &ctl->keys_t, 1000);
    r = work_start(ctl);
    if (r < 0)
        return r;
    return reconciler_start(ctl);
}

int control_run(control_t *ctl) { return httpd_run(&ctl->srv); }

void control_done(control_t *ctl)
{
    reconciler_stop(ctl);
    work_stop(ctl);
    if (ctl->srv.loop)
        timer_disarm(ctl->srv.loop, &ctl->keys_t);
    edge_conns_sweep(ctl, true);
    httpd_done(&ctl->srv); /* every connection released its principal's counter */
    ctl->principals = climit_tab_free(ctl->principals);
    routecache_free(&ctl->routes);
    httpc_pool_free(ctl->node_calls);
    ctl->node_calls = NULL;
    tls_ctx_unref(ctl->tls_server);
    tls_ctx_unref(ctl->tls_client);
    ctl->tls_server = ctl->tls_client = NULL;
    store_close(ctl->store);
    ctl->store = NULL;
    sodium_memzero(&ctl->keys, sizeof ctl->keys);
    sodium_memzero(&ctl->identity, sizeof ctl->identity);
    sodium_memzero(&ctl->seal, sizeof ctl->seal);
    pthread_mutex_destroy(&ctl->rec_lock);
    pthread_cond_destroy(&ctl->rec_cond);
}
