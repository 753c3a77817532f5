/* SPDX-License-Identifier: MIT */
/* Installing a run without stalling the node: the request's checks and the replacement of the
 * old run happen at once on the loop; the directories (removing a fresh root, fetching a moved
 * one from the old node: rm, tar, HTTP) are prepared on a thread of their own; the process is
 * started on the loop; its agent's readiness is polled by a timer. The node forwards other runs'
 * traffic meanwhile, and the requester is answered when the run serves (or failed). A second
 * install for a sandbox whose install is in progress is refused (409). */
#include <stdio.h>
#include <sys/eventfd.h>

#include "common/log.h"
#include "node.h"

#define READY_POLL_MS 2
#define READY_POLLS 2500 /* 5 s */

struct install {
    node_t *n;
    conn_t *conn; /* NULL once the requester left: the install goes on */
    run_t *r;     /* the new run, linked into n->runs when it ends */
    json_t *spec;
    int efd; /* the directory thread -> the loop */
    watcher_t w;
    timer_t_ t;
    pthread_t th;
    bool th_started;
    int polls, rc;
    sbx_err_t err; /* why the install failed (rc < 0) */
    install_t *next;
};

bool install_in_progress(node_t *n, const char *sandbox)
{
    for (install_t *in = n->installs; in; in = in->next)
        if (streq(in->r->id.sandbox, sandbox))
            return true;
    return false;
}

uint64_t installs_unwritten(node_t *n, const run_t *skip)
{
    uint64_t sum = 0;
    for (install_t *in = n->installs; in; in = in->next)
        if (in->r && in->r != skip)
            sum += run_disk_unwritten(in->r);
    return sum;
}

static void install_free(void *p)
{
    install_t *in = p;
    safe_close(in->efd);
    json_decref(in->spec);
    free(in);
}

/* What an install failure tells the control plane: 400, the spec is invalid; 422, the run
 * cannot be made from it (its image or command: a link where a mount goes, a missing
 * directory, a command that is not the agent or exits at once), which no retry fixes; 507,
 * the node's disk has no room for the flavor's disk (another node may); 500, anything else
 * (resources, time), which a retry may fix. */
static int install_status(int rc)
{
    switch (-rc) {
    case EINVAL: return HTTP_BAD_REQUEST;
    case EPERM:
    case EACCES:
    case ELOOP:
    case ENOENT:
    case ENOTDIR:
    case EISDIR:
    case EXDEV:
    case ENOEXEC:
    case ESRCH: return HTTP_UNPROCESSABLE;
    case ENOSPC: return HTTP_INSUFFICIENT_STORAGE; /* the node's disk: placed elsewhere */
    default: return HTTP_INTERNAL_ERROR;
    }
}

static void install_end(install_t *in)
{
    node_t *n = in->n;
    loop_t *l = n->srv.loop;
    loop_unwatch(l, &in->w);
    timer_disarm(l, &in->t);
    for (install_t **pp = &n->installs; *pp; pp = &(*pp)->next)
        if (*pp == in) {
            *pp = in->next;
            break;
        }
    run_t *r = in->r;
    run_install_finish(n, r, in->rc);
    if (in->rc < 0)
        log_warn("install %s generation %llu failed: %s", r->id.sandbox,
                 (unsigned long long)r->id.generation, in->err.msg);
    else
        log_info("installed run %s generation %llu activation %s (pid %d)", r->id.sandbox,
                 (unsigned long long)r->id.generation, r->id.activation, (int)r->pid);
    conn_t *c = in->conn;
    if (c) {
        conn_set_handler(c, NULL, NULL);
        if (in->rc >= 0)
            conn_respond_json(c, 201, json_pack("{s:o}", "run", run_json(r)));
        else
            http_error(c, install_status(in->rc), 0, "install failed: %s", in->err.msg);
    }
    if (loop_defer(l, install_free, in) < 0)
        install_free(in);
}

static void on_poll(loop_t *l, timer_t_ *t)
{
    install_t *in = t->data;
    int rc = run_probe_ready(in->r, &in->err);
    if (rc == -EAGAIN && ++in->polls < READY_POLLS) {
        if (timer_arm(l, t, READY_POLL_MS) >= 0)
            return;
        rc = -ENOMEM;
    }
    if (rc == -EAGAIN) {
        rc = sbx_err(&in->err, -ETIMEDOUT, "the run's agent did not listen within 5 s");
    }
    in->rc = rc;
    install_end(in);
}

/* The directories are ready (or not): start the run's process, then poll its agent. */
static void on_prepared(loop_t *l, watcher_t *w, uint32_t ev)
{
    install_t *in = w->data;
    uint64_t v;
    (void)ev;
    if (read(in->efd, &v, sizeof v) != (ssize_t)sizeof v)
        return;
    loop_unwatch(l, &in->w);
    (void)pthread_join(in->th, NULL); /* it has signalled: it is returning */
    in->th_started = false;
    if (in->rc >= 0) {
        node_crash_point(in->n, "install:before_spawn");
        in->rc = run_install_spawn(in->n, in->r, in->spec, &in->err);
    }
    if (in->rc >= 0)
        node_crash_point(in->n, "install:after_spawn");
    if (in->rc >= 0 && timer_arm(l, &in->t, 0) >= 0)
        return;
    install_end(in);
}

static void *prepare_thread(void *p)
{
    install_t *in = p;
    in->rc = run_install_dirs(in->n, in->r, in->spec, &in->err);
    uint64_t one = 1;
    (void)!write(in->efd, &one, sizeof one);
    return NULL;
}

static void on_requester_gone(conn_t *c, bool aborted)
{
    install_t *in = c->hdata;
    (void)aborted;
    in->conn = NULL;
}

static const handler_ops_t waiting_ops = { .on_close = on_requester_gone };

typedef struct {
    cap_run_t id;
} pending_t;

static void pending_free(conn_t *c, bool aborted)
{
    (void)aborted;
    free(c->hdata);
    c->hdata = NULL;
}

static const handler_ops_t pending_ops = { .on_close = pending_free };

static void body_done(conn_t *c)
{
    node_t *n = c->srv->app;
    pending_t *pd = c->hdata;
    cap_run_t id = pd->id;
    conn_set_handler(c, NULL, NULL);
    free(pd);
    json_error_t jerr;
    json_t *spec = json_loadb(buf_head(&c->body), c->body.len, 0, &jerr);
    if (!json_is_object(spec)) {
        json_decref(spec);
        http_bad_request(c, 0, "install: body must be a JSON object: %s", jerr.text);
        return;
    }
    if (install_in_progress(n, id.sandbox)) {
        json_decref(spec);
        http_conflict(c, 0, "install: another install of this sandbox is in progress");
        return;
    }
    install_t *in = calloc(1, sizeof *in);
    if (!in) {
        json_decref(spec);
        http_errno(c, 0, -ENOMEM, "install");
        return;
    }
    *in = (install_t){ .n = n, .spec = spec, .efd = -1 };
    timer_init(&in->t, on_poll, in);
    run_t *r = NULL;
    int rc = run_install_prepare(n, &id, spec, &in->err, &r);
    if (rc == -EEXIST) { /* that very run serves already: the call is idempotent */
        conn_respond_json(c, 200, json_pack("{s:o}", "run", run_json(r)));
        install_free(in);
        return;
    }
    if (rc == -ESTALE) {
        node_refuse(c, CAP_REFRESH_ROUTE, CAP_E_STALE_RUN, in->err.msg);
        install_free(in);
        return;
    }
    if (rc < 0) {
        http_error(c, install_status(rc), 0, "install failed: %s", in->err.msg);
        install_free(in);
        return;
    }
    in->r = r;
    in->next = n->installs;
    n->installs = in;
    in->conn = c;
    conn_set_handler(c, &waiting_ops, in);
    in->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    watcher_init(&in->w, in->efd, on_prepared, in);
    rc = in->efd < 0 ? -errno : loop_watch(n->srv.loop, &in->w, EPOLLIN);
    if (rc >= 0) {
        rc = -pthread_create(&in->th, NULL, prepare_thread, in);
        in->th_started = rc == 0;
    }
    if (rc < 0) {
        in->rc = rc;
        (void)sbx_err(&in->err, rc, "cannot start the install: %s", strerror(-rc));
        install_end(in);
    }
}

void install_start(node_t *n, conn_t *c, const cap_run_t *id)
{
    pending_t *pd = calloc(1, sizeof *pd);
    (void)n;
    if (!pd) {
        http_errno(c, 0, -ENOMEM, "install");
        return;
    }
    pd->id = *id;
    conn_set_handler(c, &pending_ops, pd);
    body_done(c); /* the ingress collected the body and checked its digest */
}

/* The node is going down: every install in progress ends now. Its thread is waited for (it is
 * bounded by its own timeouts), a process it started is stopped, and the run is recorded as
 * exited, so that nothing runs unsupervised and a restart finds its directory. */
void install_abandon_all(node_t *n)
{
    while (n->installs) {
        install_t *in = n->installs;
        n->installs = in->next;
        if (in->th_started)
            (void)pthread_join(in->th, NULL);
        in->th_started = false;
        loop_unwatch(n->srv.loop, &in->w);
        timer_disarm(n->srv.loop, &in->t);
        in->rc = sbx_err(&in->err, -ECANCELED, "the node stopped during the install");
        run_install_finish(n, in->r, in->rc); /* stops its process, saves it as exited */
        if (in->conn)
            conn_set_handler(in->conn, NULL, NULL);
        install_free(in);
    }
}
