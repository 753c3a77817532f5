/* SPDX-License-Identifier: MIT */
#include "proc.h"

#include <signal.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <time.h>

#include "common/log.h"
#include "exec.h"
#include "pool.h"
#include "routes.h"
#include "server.h"

extern char **environ;

typedef struct blob {
    struct blob *next;
    uint64_t seq;
    bool is_err;
    size_t n;
    unsigned char data[];
} blob_t;

typedef struct attach {
    proc_t *p;
    conn_t *c;
    uint64_t next_seq;
    bool follow, base64, ended;
    const proc_sink_ops_t *sink; /* another protocol's encoding (envd); NULL: NDJSON */
    void *sink_ctx;
    struct attach *next;
} attach_t;

struct proc {
    cmdcg_t cg; /* host mode: the command's cgroup2 group (a kill reaches setsid escapees) */
    server_t *srv;
    proc_t *next;
    uint64_t id;
    pid_t pid;
    json_t *cmd;
    char *tag;
    int64_t started_at_ms;
    uint64_t start_mono, exit_mono;
    child_t child;
    outpipe_t out, err;
    int stdin_fd;
    watcher_t in_w;
    watcher_t oneshot_w; /* one-shot "stdin" data still being written, then EOF */
    char *oneshot;
    size_t oneshot_len, oneshot_off;
    conn_t *stdin_conn; /* a POST .../stdin waiting for the pipe to take more */
    uint64_t stdin_written;
    bool stdin_close_after;
    bool exited, timed_out, signaled_by_api;
    int wstatus;
    timer_t_ timeout_t, grace_t;
    blob_t *head, *tail;
    size_t log_bytes;
    uint64_t first_seq, next_seq;
    attach_t *attachers;
    sandbox_t *sb; /* host mode: the sandbox it runs as (a reference); NULL in dedicated mode */
    json_t *extra; /* what another protocol keeps about it (envd: the config it was started with) */
    bool pty;      /* output and input go through a pseudo-terminal (out.w is its master) */
};

size_t server_running_procs(const server_t *s)
{
    size_t n = 0;
    for (const proc_t *p = s->procs; p; p = p->next)
        n += !p->exited;
    return n;
}

static proc_t *proc_find(server_t *s, sv_t id)
{
    uint64_t n;
    if (id.len < 3 || id.p[0] != 'p' || id.p[1] != '-' ||
        parse_u64(sv_make(id.p + 2, id.len - 2), UINT64_MAX, &n) < 0)
        return NULL;
    for (proc_t *p = s->procs; p; p = p->next)
        if (p->id == n)
            return p;
    return NULL;
}

/* 400 for an id that is not p-<digits> (an OS pid sent by mistake), 404 for an unknown one. */
static proc_t *proc_lookup_or_answer(conn_t *c, sv_t id)
{
    uint64_t n;
    if (id.len < 3 || id.p[0] != 'p' || id.p[1] != '-' ||
        parse_u64(sv_make(id.p + 2, id.len - 2), UINT64_MAX, &n) < 0) {
        http_bad_request(c, 0, "process id must look like p-<n> (not an OS pid)");
        return NULL;
    }
    proc_t *p = proc_find(server_of(c), id);
    if (p && p->sb != conn_sandbox(c))
        p = NULL; /* another sandbox's process does not exist for this one */
    if (!p)
        http_not_found(c, 0, "no such process");
    return p;
}

static void proc_signal(proc_t *p, int sig)
{
    if (!p->exited)
        (void)kill(-p->pid, sig);
    if (!p->exited && sig == SIGKILL)
        sandbox_cmd_kill(&p->cg); /* and what left its process group (setsid) */
}

/* ---- output log and attachers ------------------------------------------------------------ */

static void attach_pump(attach_t *a);

static void proc_log_append(proc_t *p, bool is_err, const unsigned char *d, size_t n)
{
    blob_t *b = malloc(sizeof *b + n);
    if (!b)
        return; /* output is dropped, the process goes on */
    b->next = NULL;
    b->seq = p->next_seq++;
    b->is_err = is_err;
    b->n = n;
    memcpy(b->data, d, n);
    if (p->tail)
        p->tail->next = b;
    else
        p->head = b;
    p->tail = b;
    p->log_bytes += n;
    while (p->log_bytes > PROC_LOG_MAX && p->head != p->tail) {
        blob_t *old = p->head;
        p->head = old->next;
        p->log_bytes -= old->n;
        p->first_seq = p->head->seq;
        free(old);
    }
}

static void procs_pump_all(proc_t *p)
{
    for (attach_t *a = p->attachers; a; a = a->next)
        attach_pump(a);
}

static bool proc_output_done(const proc_t *p) { return p->exited && p->out.eof && p->err.eof; }
/* Keep at most PROC_MAX_FINISHED finished entries per sandbox (one sandbox's churn never
 * evicts another's); running ones are never dropped. */
static void procs_evict_for(server_t *s, sandbox_t *sb);

static void proc_on_pipe(loop_t *l, watcher_t *w, uint32_t ev)
{
    proc_t *p = w->data;
    outpipe_t *op = w == &p->out.w ? &p->out : &p->err;
    unsigned char buf[PROC_READ_CHUNK + 8];
    (void)ev;
    for (int i = 0; i < 8 && !op->eof; i++) {
        ssize_t n = outpipe_read(op, buf, sizeof buf, true);
        if (n == -EAGAIN)
            break;
        if (n < 0) {
            outpipe_close(l, op);
            break;
        }
        if (n > 0)
            proc_log_append(p, op == &p->err, buf, (size_t)n);
        if (op->eof)
            outpipe_close(l, op);
    }
    procs_pump_all(p);
    if (proc_output_done(p))
        procs_evict_for(p->srv, p->sb); /* the cap counts entries whose output has ended too */
}

struct blob_ctx {
    const blob_t *b;
    bool base64;
};
static size_t blob_fill(void *ctx, char *dst)
{
    struct blob_ctx *bc = ctx;
    return event_encode_output(dst, bc->b->is_err ? "stderr" : "stdout", bc->b->data, bc->b->n,
                               bc->base64);
}

static void attach_end(attach_t *a)
{
    if (a->ended)
        return;
    a->ended = true;
    if (a->sink)
        a->sink->end(a->sink_ctx, a->p); /* p is NULL when the entry went away */
    else
        conn_stream_end(a->c);
}

static void attach_pump(attach_t *a)
{
    proc_t *p = a->p;
    if (a->ended)
        return;
    if (a->next_seq < p->first_seq && a->sink) {
        a->next_seq = p->first_seq; /* the reader fell behind the log: that output is lost */
    } else if (a->next_seq < p->first_seq) {
        char line[96];
        int n = snprintf(line, sizeof line, "{\"event\":\"dropped\",\"events\":%llu}\n",
                         (unsigned long long)(p->first_seq - a->next_seq));
        if (conn_stream_chunk(a->c, line, (size_t)n) < 0)
            return;
        a->next_seq = p->first_seq;
    }
    const blob_t *b = p->head;
    while (b && b->seq < a->next_seq)
        b = b->next;
    while (b) {
        if (conn_out_full(a->c)) {
            /* Write now and go on if the socket took it: on_drain only follows a writable
             * event, which never comes once a flush has emptied the buffer. */
            conn_flush(a->c);
            if (a->c->dead || conn_out_full(a->c))
                return; /* on_drain pumps again */
        }
        struct blob_ctx bc = { b, a->base64 };
        if (a->sink && a->sink->output(a->sink_ctx, b->is_err, b->data, b->n) < 0)
            return;
        if (!a->sink && conn_stream_chunk_fill(a->c, event_output_max(b->n), blob_fill, &bc) < 0)
            return;
        a->next_seq = b->seq + 1;
        b = b->next;
    }
    if (a->next_seq == p->next_seq && (proc_output_done(p) || !a->follow)) {
        if (p->exited && !a->sink) {
            char line[256];
            int n = event_encode_exit(line, sizeof line, p->wstatus, p->timed_out,
                                      p->exit_mono - p->start_mono);
            (void)conn_stream_chunk(a->c, line, (size_t)n);
        }
        attach_end(a);
        return;
    }
    conn_flush(a->c);
}

static void attach_on_drain(conn_t *c)
{
    attach_t *a = c->hdata;
    if (a)
        attach_pump(a);
}

static void attach_on_close(conn_t *c, bool aborted)
{
    attach_t *a = c->hdata;
    (void)aborted;
    if (!a)
        return;
    c->hdata = NULL;
    if (a->p) {
        for (attach_t **pp = &a->p->attachers; *pp; pp = &(*pp)->next)
            if (*pp == a) {
                *pp = a->next;
                break;
            }
    }
    free(a);
}

static const handler_ops_t attach_ops = { .on_drain = attach_on_drain,
                                          .on_close = attach_on_close };

/* ---- lifecycle --------------------------------------------------------------------------- */

static void proc_free(proc_t *p)
{
    loop_t *l = p->srv->loop;
    while (p->attachers) {
        attach_t *a = p->attachers;
        p->attachers = a->next;
        a->p = NULL;
        a->next = NULL;
        attach_end(a);
    }
    if (p->stdin_conn) {
        /* Its on_close runs later, after p is gone: detach it first. */
        conn_t *sc = p->stdin_conn;
        p->stdin_conn = NULL;
        sc->hdata = NULL;
        conn_abort(sc);
    }
    outpipe_close(l, &p->out);
    outpipe_close(l, &p->err);
    loop_unwatch(l, &p->in_w);
    safe_close(p->stdin_fd);
    loop_unwatch(l, &p->oneshot_w);
    safe_close(p->oneshot_w.fd);
    free(p->oneshot);
    timer_disarm(l, &p->timeout_t);
    timer_disarm(l, &p->grace_t);
    while (p->head) {
        blob_t *b = p->head;
        p->head = b->next;
        free(b);
    }
    json_decref(p->cmd);
    json_decref(p->extra);
    sandbox_cmd_done(&p->cg);
    sandbox_unref(p->sb);
    free(p->tag);
    free(p);
}

static void proc_free_deferred(void *p) { proc_free(p); }

static void procs_evict_for(server_t *s, sandbox_t *sb)
{
    size_t finished = 0;
    for (proc_t *p = s->procs; p; p = p->next)
        finished += p->sb == sb && p->exited && proc_output_done(p);
    while (finished > PROC_MAX_FINISHED) {
        proc_t **oldest = NULL;
        for (proc_t **pp = &s->procs; *pp; pp = &(*pp)->next)
            if ((*pp)->sb == sb && (*pp)->exited && proc_output_done(*pp))
                oldest = pp; /* list is newest first: the last match is the oldest */
        if (!oldest)
            break;
        proc_t *p = *oldest;
        *oldest = p->next;
        s->n_procs--;
        /* Freed after this batch of events: one of its watchers (a paused stdin write) may
         * still have an event queued in it. */
        if (loop_defer(s->loop, proc_free_deferred, p) < 0)
            proc_free(p);
        finished--;
    }
}

void procs_drop_sandbox(server_t *s, sandbox_t *sb)
{
    for (proc_t **pp = &s->procs; *pp;) {
        proc_t *p = *pp;
        if (p->sb != sb) {
            pp = &p->next;
            continue;
        }
        *pp = p->next;
        s->n_procs--;
        proc_signal(p, SIGKILL);
        /* its exit is reaped like any orphan; nothing may call back into this entry */
        server_child_remove(s, &p->child);
        if (loop_defer(s->loop, proc_free_deferred, p) < 0)
            proc_free(p);
    }
}

static void proc_on_exit(child_t *ch, int wstatus)
{
    proc_t *p = ch->data;
    p->exited = true;
    p->wstatus = wstatus;
    p->exit_mono = monotonic_ms();
    if (p->sb)
        p->sb->running--;
    timer_disarm(p->srv->loop, &p->timeout_t);
    timer_disarm(p->srv->loop, &p->grace_t);
    /* Its group is done with now, not when the record goes: a kill no longer reaches through
     * it (proc_signal), and the sandbox's next command may have the kept one. */
    sandbox_cmd_done(&p->cg);
    server_touch(p->srv);
    procs_pump_all(p);
    procs_evict_for(p->srv, p->sb);
}

static void proc_on_timeout(loop_t *l, timer_t_ *t)
{
    proc_t *p = t->data;
    (void)l;
    p->timed_out = true;
    proc_signal(p, SIGKILL);
}

static void proc_on_grace(loop_t *l, timer_t_ *t)
{
    proc_t *p = t->data;
    (void)l;
    proc_signal(p, SIGKILL); /* the grace period is over */
}

static json_t *proc_json(const proc_t *p, bool full)
{
    char id[32];
    (void)snprintf(id, sizeof id, "p-%llu", (unsigned long long)p->id);
    json_t *j = json_pack("{s:s,s:i,s:O,s:s?}", "id", id, "pid", (json_int_t)p->pid, "cmd", p->cmd,
                          "tag", p->tag);
    if (!j || !full)
        return j;
    json_object_set_new(j, "started_at_ms", json_integer(p->started_at_ms));
    json_object_set_new(j, "running", json_boolean(!p->exited));
    json_object_set_new(j, "exit_code",
                        p->exited && WIFEXITED(p->wstatus) ? json_integer(WEXITSTATUS(p->wstatus))
                                                           : json_null());
    json_object_set_new(j, "signal",
                        p->exited && WIFSIGNALED(p->wstatus) ? json_integer(WTERMSIG(p->wstatus))
                                                             : json_null());
    json_object_set_new(j, "timed_out", json_boolean(p->timed_out));
    json_object_set_new(j, "stdin_open", json_boolean(p->stdin_fd >= 0));
    return j;
}

static void proc_on_oneshot_writable(loop_t *l, watcher_t *w, uint32_t ev)
{
    proc_t *p = w->data;
    (void)ev;
    while (p->oneshot_off < p->oneshot_len) {
        ssize_t n = write(w->fd, p->oneshot + p->oneshot_off, p->oneshot_len - p->oneshot_off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN) {
            if (loop_watch(l, w, EPOLLOUT) >= 0)
                return;
            break;
        }
        if (n < 0)
            break; /* EPIPE: the command does not read stdin (any more) */
        p->oneshot_off += (size_t)n;
    }
    loop_unwatch(l, w);
    w->fd = safe_close(w->fd);
    free(p->oneshot);
    p->oneshot = NULL;
}

typedef struct {
    proc_t *p;
    conn_t *conn; /* NULL once the client left */
    bool from_exec, has_stdin;
    uint64_t timeout_ms;
    char *argv0;
    proc_launch_cb cb; /* proc_launch(): told instead of answering conn */
    void *cb_data;
} proc_pending_t;

static void proc_pending_close(conn_t *c, bool aborted)
{
    proc_pending_t *pp = c->hdata;
    (void)aborted;
    c->hdata = NULL;
    pp->conn = NULL;
}

static const handler_ops_t proc_pending_ops = { .on_close = proc_pending_close };

static void proc_started(void *data, int r, spawned_t *sp, const char *why)
{
    proc_pending_t *pp = data;
    proc_t *p = pp->p;
    server_t *s = p->srv;
    conn_t *c = pp->conn;
    s->procs_starting--;
    if (c)
        conn_set_handler(c, NULL, NULL);
    if (r < 0 && pp->cb) {
        char msg[256];
        (void)snprintf(msg, sizeof msg, "failed to start %s: %s", pp->argv0, why);
        pp->cb(pp->cb_data, r, NULL, r == -ESRCH ? why : msg);
        proc_free(p);
        free(pp->argv0);
        free(pp);
        return;
    }
    if (r < 0) {
        if (c && r == -ESRCH)
            http_bad_request(c, 0, "%s", why); /* the sandbox was deleted */
        else if (c)
            http_bad_request(c, 0, "failed to start %s: %s", pp->argv0, why);
        proc_free(p);
        free(pp->argv0);
        free(pp);
        return;
    }
    if (p->sb)
        p->sb->running++;
    /* A client that left meanwhile gets no answer; the process is listed like any other. */
    p->id = s->next_proc_id++;
    p->pid = sp->pid;
    p->cg = sp->cg;
    p->start_mono = monotonic_ms();
    p->child = (child_t){ .pid = sp->pid, .on_exit = proc_on_exit, .data = p };
    server_child_add(s, &p->child);
    outpipe_init(&p->out, sp->out_fd, "stdout", proc_on_pipe, p);
    outpipe_init(&p->err, sp->err_fd, "stderr", proc_on_pipe, p);
    (void)loop_watch(s->loop, &p->out.w, EPOLLIN);
    if (sp->err_fd >= 0)
        (void)loop_watch(s->loop, &p->err.w, EPOLLIN);
    else
        p->err.eof = true; /* on a pty: one stream, read from the master */
    if (pp->timeout_ms)
        timer_arm(s->loop, &p->timeout_t, pp->timeout_ms);
    if (sp->in_fd >= 0 && pp->has_stdin) {
        /* one-shot stdin: all of it is written as the command reads, then EOF */
        p->oneshot_w.fd = sp->in_fd;
        proc_on_oneshot_writable(s->loop, &p->oneshot_w, EPOLLOUT);
    } else if (sp->in_fd >= 0) {
        p->stdin_fd = sp->in_fd;
    }
    p->next = s->procs;
    s->procs = p;
    s->n_procs++;
    if (pp->cb)
        pp->cb(pp->cb_data, 0, p, "");
    else if (c) {
        json_t *j = proc_json(p, false);
        if (pp->from_exec && j)
            json_object_del(j, "cmd");
        conn_respond_json(c, 200, j);
    }
    free(pp->argv0);
    free(pp);
}

/* The shared start of proc_start() and proc_launch(): pp->conn or pp->cb hears the answer.
 * Returns < 0 (nothing started; err says it, pp is freed) or 0 (the answer follows). */
static int proc_begin(server_t *s, sandbox_t *sb, exec_spec_t *spec, proc_pending_t *pp,
                      sbx_err_t *err)
{
    /* running ones, and of them this sandbox's: a pooled sandbox runs a quarter at most, the
     * rest stay its siblings' */
    size_t running = 0, mine = 0;
    for (const proc_t *q = s->procs; q; q = q->next) {
        running += !q->exited;
        mine += sb && q->sb == sb && !q->exited;
    }
    if (running + s->procs_starting >= PROC_MAX_RUNNING) {
        free(pp);
        return sbx_err(err, -EAGAIN, "too many running processes (max %d)", PROC_MAX_RUNNING);
    }
    if (sb && mine >= PROC_MAX_RUNNING_SANDBOX) {
        free(pp);
        return sbx_err(err, -EAGAIN,
                       "this sandbox runs %zu background processes, the most one sandbox may",
                       mine);
    }
    proc_t *p = calloc(1, sizeof *p);
    if (!p || !(pp->argv0 = strdup(spec->argv[0]))) {
        free(p);
        free(pp);
        return sbx_err(err, -ENOMEM, "out of memory");
    }
    struct timespec ts;
    (void)clock_gettime(CLOCK_REALTIME, &ts);
    p->srv = s;
    p->cmd = json_incref(spec->cmd);
    p->tag = TAKE_PTR(spec->tag);
    p->started_at_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    p->stdin_fd = -EBADF;
    p->cg = CMDCG_NONE;
    outpipe_init(&p->out, -EBADF, "stdout", proc_on_pipe, p);
    outpipe_init(&p->err, -EBADF, "stderr", proc_on_pipe, p);
    watcher_init(&p->in_w, -EBADF, NULL, p);
    timer_init(&p->timeout_t, proc_on_timeout, p);
    timer_init(&p->grace_t, proc_on_grace, p);
    watcher_init(&p->oneshot_w, -EBADF, proc_on_oneshot_writable, p);
    if (spec->has_stdin) {
        p->oneshot = TAKE_PTR(spec->stdin_data);
        p->oneshot_len = spec->stdin_len;
    }
    p->pty = spec->pty;
    pp->p = p;
    pp->has_stdin = spec->has_stdin;
    pp->timeout_ms = spec->timeout_ms;
    sbx_err_t serr;
    int r = spawn_command(s, spec, sb, proc_started, pp, &serr);
    if (r < 0) {
        if (r == -ESRCH)
            (void)sbx_err(err, r, "%s", serr.msg); /* the sandbox was deleted */
        else
            (void)sbx_err(err, r, "failed to start %s: %s", spec->argv[0], serr.msg);
        proc_free(p);
        free(pp->argv0);
        free(pp);
        return r;
    }
    p->sb = sandbox_ref(sb);
    s->procs_starting++;
    return 0;
}

void proc_start(conn_t *c, exec_spec_t *spec, bool from_exec)
{
    proc_pending_t *pp = calloc(1, sizeof *pp);
    if (!pp) {
        http_unavailable(c, 0, "out of memory");
        return;
    }
    pp->conn = c;
    pp->from_exec = from_exec;
    sbx_err_t err;
    int r = proc_begin(server_of(c), conn_sandbox(c), spec, pp, &err);
    if (r < 0) {
        http_error(c, r == -EAGAIN || r == -ENOMEM ? HTTP_UNAVAILABLE : HTTP_BAD_REQUEST, 0, "%s",
                   err.msg);
        return;
    }
    conn_set_handler(c, &proc_pending_ops, pp);
}

int proc_launch(server_t *s, sandbox_t *sb, exec_spec_t *spec, json_t *extra, proc_launch_cb cb,
                void *data, sbx_err_t *err)
{
    proc_pending_t *pp = calloc(1, sizeof *pp);
    if (!pp)
        return sbx_err(err, -ENOMEM, "out of memory");
    pp->cb = cb;
    pp->cb_data = data;
    int r = proc_begin(s, sb, spec, pp, err);
    if (r >= 0)
        pp->p->extra = json_incref(extra);
    return r;
}

void procs_kill_all(server_t *s)
{
    while (s->procs) {
        proc_t *p = s->procs;
        s->procs = p->next;
        proc_signal(p, SIGKILL);
        server_child_remove(s, &p->child);
        proc_free(p);
    }
}

/* ---- routes ------------------------------------------------------------------------------ */

static void proc_create_body(conn_t *c, json_t *o)
{
    exec_spec_t spec;
    sbx_err_t err = { 0 };
    int r = exec_spec_parse(o, conn_sandbox(c) ? conn_sandbox(c)->env : environ, &spec, &err);
    if (r < 0) {
        http_error(c, r == -EINVAL ? HTTP_BAD_REQUEST : HTTP_UNAVAILABLE, 0, "%s", err.msg);
        return;
    }
    proc_start(c, &spec, false);
    exec_spec_done(&spec);
}

void route_proc_create(conn_t *c, const route_params_t *rp)
{
    (void)rp;
    route_with_json_body(c, EXEC_MAX_BODY, proc_create_body);
}

void route_proc_list(conn_t *c, const route_params_t *rp)
{
    (void)rp;
    json_t *arr = json_array();
    /* oldest first */
    size_t n = server_of(c)->n_procs, i = n;
    proc_t **v = calloc(n ? n : 1, sizeof *v);
    if (!arr || !v) {
        free(v);
        json_decref(arr);
        http_unavailable(c, 0, "out of memory");
        return;
    }
    for (proc_t *p = server_of(c)->procs; p && i > 0; p = p->next)
        v[--i] = p;
    for (i = 0; i < n; i++)
        if (v[i] && v[i]->sb == conn_sandbox(c))
            json_array_append_new(arr, proc_json(v[i], true));
    free(v);
    conn_respond_json(c, 200, arr);
}

void route_proc_get(conn_t *c, const route_params_t *rp)
{
    proc_t *p = proc_lookup_or_answer(c, rp->id);
    if (p)
        conn_respond_json(c, 200, proc_json(p, true));
}

static int parse_signal(json_t *v, int *ret)
{
    static const struct {
        const char *name;
        int sig;
    } names[] = { { "TERM", SIGTERM }, { "KILL", SIGKILL }, { "INT", SIGINT },
                  { "HUP", SIGHUP },   { "QUIT", SIGQUIT }, { "USR1", SIGUSR1 },
                  { "USR2", SIGUSR2 }, { "STOP", SIGSTOP }, { "CONT", SIGCONT } };
    if (!v) {
        *ret = SIGTERM;
        return 0;
    }
    if (json_is_integer(v)) {
        json_int_t n = json_integer_value(v);
        if (n < 1 || n > 64)
            return -EINVAL;
        *ret = (int)n;
        return 0;
    }
    if (!json_is_string(v))
        return -EINVAL;
    const char *s = json_string_value(v);
    if (strncmp(s, "SIG", 3) == 0)
        s += 3;
    for (size_t i = 0; i < ELEMENTSOF(names); i++)
        if (streq(s, names[i].name)) {
            *ret = names[i].sig;
            return 0;
        }
    return -EINVAL;
}

/* Send sig now; if grace_ms > 0 and the process still runs then, SIGKILL. */
static bool proc_signal_with_grace(proc_t *p, int sig, uint64_t grace_ms)
{
    if (p->exited)
        return false;
    proc_signal(p, sig);
    if (grace_ms > 0 && sig != SIGKILL)
        timer_arm(p->srv->loop, &p->grace_t, grace_ms);
    return true;
}

static sv_t pending_id(conn_t *c)
{
    /* the id is in the path: /v1/processes/<id>/signal */
    sv_t path = c->req.path;
    size_t pre = strlen("/v1/processes/");
    size_t end = pre;
    while (end < path.len && path.p[end] != '/')
        end++;
    return sv_make(path.p + pre, end - pre);
}

static void proc_signal_body(conn_t *c, json_t *o)
{
    proc_t *p = proc_lookup_or_answer(c, pending_id(c));
    if (!p)
        return;
    int sig;
    if (parse_signal(json_object_get(o, "signal"), &sig) < 0) {
        http_bad_request(c, 0, "signal must be a number 1..64 or a name like \"TERM\"");
        return;
    }
    json_t *g = json_object_get(o, "grace_secs");
    double grace = 0;
    if (g && (!json_is_number(g) || (grace = json_number_value(g)) < 0 || grace > 3600)) {
        http_bad_request(c, 0, "grace_secs must be a number between 0 and 3600");
        return;
    }
    bool sent = proc_signal_with_grace(p, sig, (uint64_t)(grace * 1000));
    char id[32];
    (void)snprintf(id, sizeof id, "p-%llu", (unsigned long long)p->id);
    conn_respond_json(c, 200,
                      json_pack("{s:s,s:b,s:i}", "id", id, "signaled", sent, "signal", sig));
}

void route_proc_signal(conn_t *c, const route_params_t *rp)
{
    (void)rp;
    route_with_json_body(c, 4096, proc_signal_body);
}

void route_proc_delete(conn_t *c, const route_params_t *rp)
{
    proc_t *p = proc_lookup_or_answer(c, rp->id);
    if (!p)
        return;
    bool present;
    uint64_t grace = 0;
    if (query_u64(c, "grace", 3600, &present, &grace) < 0) {
        http_bad_request(c, 0, "grace must be whole seconds (0..3600)");
        return;
    }
    bool killed = present && grace > 0 ? proc_signal_with_grace(p, SIGTERM, grace * 1000)
                                       : proc_signal_with_grace(p, SIGKILL, 0);
    char id[32];
    (void)snprintf(id, sizeof id, "p-%llu", (unsigned long long)p->id);
    conn_respond_json(c, 200, json_pack("{s:s,s:b}", "id", id, "killed", killed));
}

/* ---- stdin stream ------------------------------------------------------------------------ */

/* The request is answered: the connection no longer refers to p (it may outlive p until its
 * on_close, which runs deferred). */
static void stdin_detach(conn_t *c, proc_t *p)
{
    if (p && p->stdin_conn == c) {
        p->stdin_conn = NULL;
        loop_unwatch(p->srv->loop, &p->in_w);
    }
    c->hdata = NULL;
}

static void stdin_answer(conn_t *c, proc_t *p)
{
    char id[32];
    (void)snprintf(id, sizeof id, "p-%llu", (unsigned long long)p->id);
    stdin_detach(c, p);
    if (p->stdin_close_after && p->stdin_fd >= 0)
        p->stdin_fd = safe_close(p->stdin_fd);
    conn_respond_json(c, 200,
                      json_pack("{s:s,s:I,s:b}", "id", id, "written", (json_int_t)p->stdin_written,
                                "closed", p->stdin_fd < 0));
}

static int stdin_on_body(conn_t *c, const char *d, size_t n)
{
    proc_t *p = c->hdata;
    ssize_t w;
    do
        w = write(p->stdin_fd, d, n);
    while (w < 0 && errno == EINTR);
    if (w < 0 && errno == EAGAIN) {
        /* the pipe is full: stop reading the body until the command reads */
        (void)loop_watch(p->srv->loop, &p->in_w, EPOLLOUT);
        return 0;
    }
    if (w < 0) {
        stdin_detach(c, p);
        return -EPIPE; /* the command closed its stdin: 409 (http_status_from_errno) */
    }
    p->stdin_written += (uint64_t)w;
    return (int)w;
}

static void stdin_on_body_end(conn_t *c)
{
    proc_t *p = c->hdata;
    stdin_answer(c, p);
}

static void stdin_on_close(conn_t *c, bool aborted)
{
    (void)aborted;
    stdin_detach(c, c->hdata); /* hdata is NULL once answered or once p went away */
}

static const handler_ops_t stdin_ops = { .on_body = stdin_on_body,
                                         .on_body_end = stdin_on_body_end,
                                         .on_close = stdin_on_close };

static void proc_on_stdin_writable(loop_t *l, watcher_t *w, uint32_t ev)
{
    proc_t *p = w->data;
    (void)ev;
    (void)loop_watch(l, w, 0);
    if (p->stdin_conn)
        conn_resume_body(p->stdin_conn);
}

void route_proc_stdin(conn_t *c, const route_params_t *rp)
{
    proc_t *p = proc_lookup_or_answer(c, rp->id);
    if (!p)
        return;
    if (p->stdin_fd < 0) {
        http_conflict(c, 0, "stdin is not open (start with \"stdin\": true, background)");
        return;
    }
    if (p->stdin_conn) {
        http_conflict(c, 0, "another stdin write is in progress");
        return;
    }
    bool close_after;
    if (query_bool(c, "close", false, &close_after) < 0) {
        http_bad_request(c, 0, "close must be true or false");
        return;
    }
    p->stdin_close_after = close_after;
    p->stdin_written = 0;
    p->stdin_conn = c;
    watcher_init(&p->in_w, p->stdin_fd, proc_on_stdin_writable, p);
    conn_set_handler(c, &stdin_ops, p);
    if (conn_body_left(c) == 0) {
        stdin_answer(c, p);
        return;
    }
    conn_stream_body(c);
}

/* ---- re-attach --------------------------------------------------------------------------- */

void route_proc_output(conn_t *c, const route_params_t *rp)
{
    proc_t *p = proc_lookup_or_answer(c, rp->id);
    if (!p)
        return;
    bool follow;
    char enc[16] = "utf8";
    bool since_present;
    uint64_t since = 0;
    if (query_bool(c, "follow", true, &follow) < 0 ||
        query_param(c, "encoding", enc, sizeof enc) < 0 ||
        (!streq(enc, "utf8") && !streq(enc, "base64")) ||
        query_u64(c, "since", UINT64_MAX, &since_present, &since) < 0) {
        http_bad_request(c, 0, "bad query: follow=bool, encoding=utf8|base64, since=<seq>");
        return;
    }
    attach_t *a = calloc(1, sizeof *a);
    if (!a) {
        http_unavailable(c, 0, "out of memory");
        return;
    }
    *a = (attach_t){ .p = p,
                     .c = c,
                     .follow = follow,
                     .base64 = streq(enc, "base64"),
                     .next_seq = since_present ? MIN(since, p->next_seq) : 0, /* no endless wait */
                     .next = p->attachers };
    p->attachers = a;
    conn_set_handler(c, &attach_ops, a);
    conn_stream_begin(c, 200, "application/x-ndjson",
                      "Cache-Control: no-store\r\nX-Accel-Buffering: no\r\n");
    char line[96];
    int n = snprintf(line, sizeof line, "{\"event\":\"start\",\"pid\":%d,\"seq\":%llu}\n",
                     (int)p->pid, (unsigned long long)MAX(a->next_seq, p->first_seq));
    (void)conn_stream_chunk(c, line, (size_t)n);
    attach_pump(a);
    conn_flush(c);
}

/* ---- for other protocols (envd.c) -------------------------------------------------------- */

proc_t *proc_find_pid(server_t *s, sandbox_t *sb, pid_t pid)
{
    for (proc_t *p = s->procs; p; p = p->next)
        if (p->sb == sb && p->pid == pid && !p->exited)
            return p;
    return NULL;
}

proc_t *proc_find_tag(server_t *s, sandbox_t *sb, const char *tag)
{
    for (proc_t *p = s->procs; p; p = p->next)
        if (p->sb == sb && p->tag && streq(p->tag, tag) && !p->exited)
            return p;
    return NULL;
}

proc_t *proc_next(server_t *s, sandbox_t *sb, proc_t *after)
{
    for (proc_t *p = after ? after->next : s->procs; p; p = p->next)
        if (p->sb == sb)
            return p;
    return NULL;
}

pid_t proc_pid(const proc_t *p) { return p->pid; }
const char *proc_tag(const proc_t *p) { return p->tag; }
json_t *proc_extra(const proc_t *p) { return p->extra; }
json_t *proc_cmd(const proc_t *p) { return p->cmd; }
bool proc_exited(const proc_t *p) { return p->exited; }
int proc_wstatus(const proc_t *p) { return p->wstatus; }
bool proc_timed_out(const proc_t *p) { return p->timed_out; }
bool proc_is_pty(const proc_t *p) { return p->pty; }

attach_t *proc_attach_sink(proc_t *p, conn_t *c, bool from_start, const proc_sink_ops_t *ops,
                           void *ctx)
{
    attach_t *a = calloc(1, sizeof *a);
    if (!a)
        return NULL;
    *a = (attach_t){ .p = p,
                     .c = c,
                     .follow = true,
                     .next_seq = from_start ? 0 : p->next_seq,
                     .sink = ops,
                     .sink_ctx = ctx,
                     .next = p->attachers };
    p->attachers = a;
    return a;
}

void proc_attach_pump(attach_t *a) { attach_pump(a); }

void proc_attach_free(attach_t *a)
{
    if (!a)
        return;
    if (a->p) {
        for (attach_t **pp = &a->p->attachers; *pp; pp = &(*pp)->next)
            if (*pp == a) {
                *pp = a->next;
                break;
            }
    }
    free(a);
}

bool proc_send_signal(proc_t *p, int sig) { return proc_signal_with_grace(p, sig, 0); }

int proc_stdin_fd(const proc_t *p) { return p->stdin_fd; }

int proc_stdin_close(proc_t *p)
{
    if (p->stdin_fd < 0)
        return -EBADF;
    if (p->stdin_conn)
        return -EBUSY; /* a POST .../stdin is writing */
    p->stdin_fd = safe_close(p->stdin_fd);
    return 0;
}

int proc_pty_resize(proc_t *p, unsigned short rows, unsigned short cols)
{
    if (!p->pty)
        return -ENOTTY;
    if (p->out.w.fd < 0)
        return -EBADF; /* the terminal is gone */
    struct winsize ws = { .ws_row = rows, .ws_col = cols };
    return ioctl(p->out.w.fd, TIOCSWINSZ, &ws) < 0 ? negative_errno() : 0;
}
