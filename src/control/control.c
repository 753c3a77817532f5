/* SPDX-License-Identifier: MIT */
#include "control.h"

#include <sodium.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>

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
        conn_respond_errno(c, r, "rotate");
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

static void control_dispatch(conn_t *c)
{
    control_t *ctl = c->srv->app;
    sv_t path = c->req.path;
    server_touch(c->srv);
    if (sv_eq(path, SV("/v1/health")) && sv_eq(c->req.method, SV("GET"))) {
        conn_respond_json(c, 200, json_pack("{s:s,s:s}", "status", "ok", "role", "control"));
        return;
    }
    if (sv_has_prefix(path, SV("/v1/jobs/"))) {
        route_jobs(ctl, c, sv_make(path.p + 9, path.len - 9));
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
    conn_respond_error(c, 404, "no such route");
}

int control_init(control_t *ctl, const control_config_t *cfg, const server_config_t *scfg)
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
    r = secrets_keys_open(cfg, &ctl->seal);
    if (r < 0)
        return r;
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
    if (r < 0)
        return r;
    r = server_init(&ctl->srv, scfg);
    if (r < 0)
        return r;
    ctl->srv.dispatch = control_dispatch;
    ctl->srv.app = ctl;
    (void)timer_arm(ctl->srv.loop, &ctl->keys_t, 1000);
    return reconciler_start(ctl);
}

int control_run(control_t *ctl) { return server_run(&ctl->srv); }

void control_done(control_t *ctl)
{
    reconciler_stop(ctl);
    if (ctl->srv.loop)
        timer_disarm(ctl->srv.loop, &ctl->keys_t);
    server_done(&ctl->srv);
    routecache_free(&ctl->routes);
    store_close(ctl->store);
    ctl->store = NULL;
    sodium_memzero(&ctl->keys, sizeof ctl->keys);
    sodium_memzero(&ctl->identity, sizeof ctl->identity);
    sodium_memzero(&ctl->seal, sizeof ctl->seal);
    pthread_mutex_destroy(&ctl->rec_lock);
    pthread_cond_destroy(&ctl->rec_cond);
}
