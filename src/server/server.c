/* SPDX-License-Identifier: MIT */
#include "server.h"

#include <signal.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "common/log.h"
#include "envd.h"
#include "http/proxy.h"
#include "pool.h"
#include "proc.h"
#include "routes.h"
#include "spawner.h"

void server_touch(server_t *s) { httpd_touch(&s->http); }
void server_op_begin(server_t *s)
{
    s->active_ops++;
    server_touch(s);
}
void server_op_end(server_t *s)
{
    if (s->active_ops > 0)
        s->active_ops--;
    server_touch(s);
}

void server_child_add(server_t *s, child_t *ch) { reaper_add(&s->http.reaper, ch); }
void server_child_remove(server_t *s, child_t *ch) { reaper_remove(&s->http.reaper, ch); }
void server_reap(server_t *s) { reaper_reap(&s->http.reaper); }

/* A child a spawn helper started, whose answer is still to be read? */
static void on_stray_child(void *data, pid_t pid, int wstatus)
{
    server_t *s = data;
    (void)spawner_stash_exit(s->spawner, pid, wstatus);
}

/* Host mode, every second: evict sandboxes idle past their own timeout; exit once the host
 * has had no sandbox for SBX_IDLE_TIMEOUT (the clock starts at boot, so a warmed host that
 * is never used is reclaimed too). */
static void on_pool_tick(loop_t *l, timer_t_ *t)
{
    server_t *s = t->data;
    uint64_t now = loop_now_ms(l);
    pool_evict_idle(s->pool, now);
    if (s->pool->count > 0 || s->active_ops > 0)
        s->pool_empty_since_ms = now;
    else if (s->cfg.idle_timeout_ms > 0 && now - s->pool_empty_since_ms >= s->cfg.idle_timeout_ms) {
        log_info("no sandboxes for %llu ms: exiting", (unsigned long long)s->cfg.idle_timeout_ms);
        loop_stop(l);
        return;
    }
    (void)timer_arm(l, t, 1000);
}

static void on_idle(loop_t *l, timer_t_ *t)
{
    server_t *s = t->data;
    uint64_t now = loop_now_ms(l);
    uint64_t due = s->http.last_activity_ms + s->cfg.idle_timeout_ms;
    if (s->active_ops > 0 || server_running_procs(s) > 0 || due > now) {
        (void)timer_arm(l, t, due > now ? MIN(due - now, 1000) : 1000);
        return;
    }
    log_info("idle for %llu ms with nothing running: exiting",
             (unsigned long long)s->cfg.idle_timeout_ms);
    loop_stop(l);
}

int server_init(server_t *s, const server_config_t *cfg)
{
    *s = (server_t){ .cfg = *cfg, .next_proc_id = 1 };
    timer_init(&s->idle_t, on_idle, s); /* initialized first: server_done disarms it */
    /* A pool host listens once its pool is ready: one that refuses to start (a Landlock floor,
     * no seccomp filter, no homes) never accepts a connection it would then drop. */
    httpd_config_t hc = cfg->http;
    hc.listen_later = cfg->host_mode;
    int r = httpd_init(&s->http, &hc);
    s->loop = s->http.loop;
    if (r < 0)
        return r;
    s->http.dispatch = router_dispatch;
    s->http.app = s;
    s->http.reaper.on_stray = on_stray_child;
    s->http.reaper.stray_data = s;
    if (s->cfg.host_mode) {
        sbx_err_t err;
        r = pool_new(s, &s->cfg.pool, &s->pool, &err);
        if (r < 0) {
            log_error("%s", err.msg);
            return r;
        }
        s->pool_empty_since_ms = s->http.start_ms;
        timer_init(&s->idle_t, on_pool_tick, s);
        (void)timer_arm(s->loop, &s->idle_t, 1000);
        return httpd_listen(&s->http);
    }
    if (cfg->idle_timeout_ms > 0)
        (void)timer_arm(s->loop, &s->idle_t, MIN(cfg->idle_timeout_ms, 1000));
    return 0;
}

int server_run(server_t *s) { return httpd_run(&s->http); }

void server_done(server_t *s)
{
    s->spawner = spawner_free(s->spawner); /* what is in flight fails; the helpers exit */
    s->pool = pool_free(s->pool);          /* deletes every sandbox: kills, removes homes */
    procs_kill_all(s);
    envd_watches_free(s);
    if (s->loop)
        timer_disarm(s->loop, &s->idle_t);
    httpd_done(&s->http); /* every connection and tunnel, then the loop */
    s->loop = NULL;
}

/* ---- /health ----------------------------------------------------------------------------- */

void route_health(conn_t *c, const route_params_t *p)
{
    server_t *s = server_of(c);
    (void)p;
    json_t *j = json_pack("{s:s,s:i}", "status", "ok", "protocol", SBX_PROTOCOL);
    if (j && c->authed) {
        server_touch(s);
        json_t *features =
            json_pack("[s,s,s,s,s,s,s]", "exec-stream", "binary-output", "process-stdin",
                      "process-signal", "process-attach", "files-rename", "proxy");
        json_object_set_new(j, "version", json_string(SBX_VERSION));
        json_object_set_new(j, "uptime_ms",
                            json_integer((json_int_t)(loop_now_ms(s->loop) - s->http.start_ms)));
        json_object_set_new(j, "mode", json_string(s->cfg.host_mode ? "host" : "dedicated"));
        json_object_set_new(j, "auth", json_string(s->cfg.token ? "required" : "disabled"));
        if (s->pool)
            pool_health(s->pool, j);
        else {
            json_object_set_new(j, "sandboxes", json_integer(0));
            /* what the kernel offers (the run's boundary is the VM, not Landlock) */
            json_object_set_new(j, "landlock", landlock_json(landlock_abi()));
        }
        json_object_set_new(j, "processes", json_integer((json_int_t)server_running_procs(s)));
        json_object_set_new(j, "features", features);
    }
    conn_respond_json(c, 200, j);
}
