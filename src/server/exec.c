/* SPDX-License-Identifier: MIT */
/* POST /v1/exec: run a command and stream its output as NDJSON events.
 * Data flow: pipe -> outpipe_read (UTF-8 split kept) -> encoded event straight into the
 * connection's bounded output buffer. When that buffer is above its high mark the pipes are
 * paused, so a slow client makes the command block on write instead of growing the server. */
#include "exec.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <sys/timerfd.h>
#include <sys/wait.h>

#include "common/log.h"
#include "pool.h"
#include "proc.h"
#include "routes.h"
#include "server.h"

#define PING_MS 15000
#define DRAIN_MS 2000
/* Bulk output: a pipe that had data again within POLL_MS of its last read is read every
 * POLL_US by a timer (a timerfd: the loop's timers count milliseconds, and in 1-2 ms a fast
 * command fills the 1 MiB pipe and waits) instead of at each of the command's writes (`head`
 * writes 8 KiB at a time: ~100,000 wake-ups, reads, events and sends a second at 0.8 GB/s,
 * against 2,000). Output then reaches the client up to ~1 ms later; a command that writes now
 * and then is read at once, as before. */
#define POLL_MS 1
#define POLL_US 500

extern char **environ;

void outpipe_init(outpipe_t *op, int fd, const char *stream, watcher_cb cb, void *data)
{
    *op = (outpipe_t){ .stream = stream };
    watcher_init(&op->w, fd, cb, data);
}

ssize_t outpipe_read(outpipe_t *op, unsigned char *buf, size_t cap, bool keep_carry)
{
    size_t held = op->carry.n;
    memcpy(buf, op->carry.b, held);
    ssize_t n;
    do
        n = read(op->w.fd, buf + held, cap - held - 4);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return errno == EAGAIN ? -EAGAIN : negative_errno();
    op->carry.n = 0;
    if (n == 0) {
        op->eof = true;
        return (ssize_t)held;
    }
    if (!op->grown && n >= OUTPIPE_DEFAULT_SIZE) {
        op->grown = true; /* once, tried or not (a pty is no pipe: EBADF) */
        (void)fcntl(op->w.fd, F_SETPIPE_SZ, OUTPIPE_BULK_SIZE);
    }
    size_t len = held + (size_t)n;
    if (!keep_carry)
        return (ssize_t)len;
    return (ssize_t)utf8_split_tail(buf, len, &op->carry);
}

void outpipe_stop(loop_t *l, outpipe_t *op)
{
    loop_unwatch(l, &op->w);
    op->eof = true;
}

void outpipe_close(loop_t *l, outpipe_t *op)
{
    loop_unwatch(l, &op->w);
    op->w.fd = safe_close(op->w.fd);
    op->eof = true;
}

typedef struct {
    server_t *srv;
    conn_t *conn;
    child_t child;
    spawned_t sp;
    outpipe_t out, err;
    watcher_t in_w;
    char *in_data;
    size_t in_len, in_off;
    timer_t_ timeout_t, ping_t, drain_t;
    watcher_t tick_w; /* the bulk-output timer (a timerfd, made at the first bulk read), or -1 */
    bool ticking;
    uint64_t start_ms, exit_ms;
    uint64_t left_at_exit, read_since_exit; /* pipe bytes the command left behind / read */
    int wstatus;
    bool exited, timed_out, finished, base64, op_counted;
    bool pty;      /* output from a pseudo-terminal, whose hang-up may come before its last output
               * reaches the reader: not pipes */
    sandbox_t *sb; /* host mode: the sandbox it runs as (a reference) */
    uint64_t timeout_ms;
    char *argv0; /* for "failed to start" */
} exec_t;

static bool exec_tick(exec_t *e, bool on);

/* The foreground operation is over (stream finished or client gone). */
static void exec_op_end(exec_t *e)
{
    if (!e->op_counted)
        return;
    e->op_counted = false;
    server_op_end(e->srv);
    if (e->sb)
        e->sb->ops--;
}

static void exec_maybe_free(exec_t *e);

static void exec_free(void *p)
{
    exec_t *e = p;
    loop_t *l = e->srv->loop;
    outpipe_close(l, &e->out);
    outpipe_close(l, &e->err);
    loop_unwatch(l, &e->in_w);
    safe_close(e->in_w.fd);
    timer_disarm(l, &e->timeout_t);
    timer_disarm(l, &e->ping_t);
    timer_disarm(l, &e->drain_t);
    loop_unwatch(l, &e->tick_w);
    safe_close(e->tick_w.fd);
    exec_op_end(e);
    sandbox_cmd_done(&e->sp.cg);
    sandbox_unref(e->sb);
    free(e->in_data);
    free(e->argv0);
    free(e);
}

static void exec_kill(exec_t *e)
{
    /* The leader is not reaped yet (only the SIGCHLD handler reaps, and it tells us), so the
     * process group id still belongs to this command. */
    if (!e->exited) {
        (void)kill(-e->child.pid, SIGKILL);
        sandbox_cmd_kill(&e->sp.cg); /* and what left its process group (setsid) */
    }
}

static void exec_emit(exec_t *e, const char *line, size_t n)
{
    if (!e->conn || e->finished)
        return;
    if (conn_stream_chunk(e->conn, line, n) < 0) {
        conn_abort(e->conn);
        return;
    }
    timer_arm(e->srv->loop, &e->ping_t, PING_MS);
}

static void exec_finish(exec_t *e)
{
    if (e->finished || !e->conn)
        return;
    char line[256];
    int n =
        event_encode_exit(line, sizeof line, e->wstatus, e->timed_out, e->exit_ms - e->start_ms);
    exec_emit(e, line, (size_t)n);
    e->finished = true;
    timer_disarm(e->srv->loop, &e->ping_t);
    timer_disarm(e->srv->loop, &e->drain_t);
    exec_tick(e, false);
    /* Closed once the answer is written (exec_conn_close): the command's exit releases its
     * ends of the pipes while it holds each pipe's mutex, and a close of ours meanwhile spins
     * on it (perf: pipe_release in mutex_spin_on_owner) before the client has its answer. */
    outpipe_stop(e->srv->loop, &e->out);
    outpipe_stop(e->srv->loop, &e->err);
    conn_t *c = e->conn;
    conn_stream_end(c); /* on_close follows once the stream is written */
}

static void exec_check_done(exec_t *e)
{
    if (e->exited && e->out.eof && e->err.eof)
        exec_finish(e);
}

struct enc_ctx {
    const char *stream;
    const unsigned char *p;
    size_t n;
    bool base64;
};
static size_t enc_fill(void *ctx, char *dst)
{
    struct enc_ctx *ec = ctx;
    return event_encode_output(dst, ec->stream, ec->p, ec->n, ec->base64);
}

/* The bulk-output timer on (every POLL_US) or off. Off when it cannot be had: the pipes are
 * then watched as before. */
static bool exec_tick(exec_t *e, bool on)
{
    if (on == e->ticking)
        return true;
    if (on && e->tick_w.fd < 0) {
        int fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
        if (fd < 0)
            return false;
        e->tick_w.fd = fd;
        if (loop_watch(e->srv->loop, &e->tick_w, EPOLLIN) < 0) {
            e->tick_w.fd = safe_close(fd);
            return false;
        }
    }
    if (e->tick_w.fd < 0)
        return !on;
    struct itimerspec its = { { 0, 0 }, { 0, 0 } };
    if (on)
        its.it_interval.tv_nsec = its.it_value.tv_nsec = POLL_US * 1000L;
    if (timerfd_settime(e->tick_w.fd, 0, &its, NULL) < 0)
        return !on;
    e->ticking = on;
    return true;
}

/* Paused (the client's buffer is full) or resumed: either way the pipes are watched again
 * rather than read by the timer. */
static void exec_pause(exec_t *e, bool pause)
{
    uint32_t ev = pause ? 0 : EPOLLIN;
    exec_tick(e, false);
    e->out.polled = e->err.polled = false;
    if (!e->out.eof)
        (void)loop_watch(e->srv->loop, &e->out.w, ev);
    if (!e->err.eof)
        (void)loop_watch(e->srv->loop, &e->err.w, ev);
}

/* After a read of op (got: it found data): a pipe with data again soon after the last time is
 * left unwatched and read by the timer (POLL_US); one the timer found empty is watched again
 * (epoll reports at once what came meanwhile). Not while the client's buffer is full (paused:
 * on_drain resumes), nor on a pty (interactive). */
static void exec_poll_or_watch(exec_t *e, outpipe_t *op, bool got)
{
    loop_t *l = e->srv->loop;
    uint64_t now = loop_now_ms(l);
    if (op->eof && op->polled) {
        op->polled = false;
        if (!e->out.polled && !e->err.polled)
            exec_tick(e, false);
    }
    if (op->eof || !e->conn || e->finished || e->pty || conn_out_full(e->conn))
        return;
    if (got && (op->polled || now - op->last_data_ms <= POLL_MS)) {
        if (!op->polled && exec_tick(e, true)) {
            op->polled = true;
            (void)loop_watch(l, &op->w, 0);
        }
    } else if (op->polled) {
        op->polled = false;
        (void)loop_watch(l, &op->w, EPOLLIN);
        if (!e->out.polled && !e->err.polled)
            exec_tick(e, false);
    }
    if (got)
        op->last_data_ms = now;
}

static void exec_on_pipe(loop_t *l, watcher_t *w, uint32_t ev)
{
    exec_t *e = w->data;
    outpipe_t *op = w == &e->out.w ? &e->out : &e->err;
    unsigned char buf[EXEC_READ_CHUNK + 8];
    /* A pipe that hung up with nothing reported to read, before the command's exit was seen:
     * the exiting command's close wakes the loop while it still holds the pipe's mutex, and a
     * read now spins on it (perf: mutex_spin_on_owner from anon_pipe_read, a tenth of the
     * server's CPU in `bench-pool --only exec`). Read it once the exit is seen (exec_on_exit),
     * when that close is over. Never skipped: epoll's look at a pipe reads its data and its
     * writers apart, so "empty" here may be stale, and a paused stream is not told of data. */
    if (!e->pty && !e->exited && (ev & (EPOLLIN | EPOLLHUP)) == EPOLLHUP) {
        loop_unwatch(l, w);
        op->hup = true;
        return;
    }
    bool got = false;
    for (int i = 0; i < 16 && e->conn && !op->eof; i++) {
        if (conn_out_full(e->conn)) {
            /* Write now: on_drain comes only from a writable event, which is asked for only
             * while output is pending after a flush. Returning with the buffer full and
             * unflushed stalled the stream for good (pipes paused, nothing to drain). */
            conn_flush(e->conn);
            if (conn_out_full(e->conn)) {
                exec_pause(e, true); /* resumed by on_drain */
                return;
            }
        }
        ssize_t n = outpipe_read(op, buf, sizeof buf, !e->base64);
        if (n == -EAGAIN)
            break;
        if (n < 0) {
            outpipe_close(l, op);
            break;
        }
        if (n > 0) {
            got = true;
            struct enc_ctx ec = { op->stream, buf, (size_t)n, e->base64 };
            if (conn_stream_chunk_fill(e->conn, event_output_max((size_t)n), enc_fill, &ec) < 0) {
                conn_abort(e->conn);
                return;
            }
            timer_arm(l, &e->ping_t, PING_MS);
            if (e->exited)
                e->read_since_exit += (uint64_t)n;
        }
        if (op->eof)
            outpipe_stop(l, op); /* closed after the answer (exec_finish) */
    }
    if (e->conn)
        conn_flush(e->conn);
    exec_poll_or_watch(e, op, got);
    exec_check_done(e);
}

static void exec_on_tick(loop_t *l, watcher_t *w, uint32_t ev)
{
    exec_t *e = w->data;
    uint64_t expirations;
    (void)ev;
    if (read(w->fd, &expirations, sizeof expirations) < 0 && errno != EAGAIN)
        return;
    if (!e->out.polled && !e->err.polled) {
        exec_tick(e, false);
        return;
    }
    if (e->out.polled && !e->out.eof)
        exec_on_pipe(l, &e->out.w, EPOLLIN);
    if (e->err.polled && !e->err.eof && e->conn && !e->finished)
        exec_on_pipe(l, &e->err.w, EPOLLIN);
}

static void exec_on_stdin(loop_t *l, watcher_t *w, uint32_t ev)
{
    exec_t *e = w->data;
    (void)ev;
    while (e->in_off < e->in_len) {
        ssize_t n = write(w->fd, e->in_data + e->in_off, e->in_len - e->in_off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        if (n < 0)
            break; /* EPIPE: the command does not read stdin */
        e->in_off += (size_t)n;
    }
    loop_unwatch(l, w);
    w->fd = safe_close(w->fd); /* one-shot stdin: EOF after the data */
}

static void exec_on_exit(child_t *ch, int wstatus)
{
    exec_t *e = ch->data;
    e->exited = true;
    e->wstatus = wstatus;
    e->exit_ms = monotonic_ms();
    if (e->sb)
        e->sb->running--;
    timer_disarm(e->srv->loop, &e->timeout_t);
    if (!e->conn) {
        exec_maybe_free(e);
        return;
    }
    /* Drain what is left in the pipes; grandchildren may hold them open (and keep writing),
     * so bounded: what the command wrote before it exited is always delivered, anything
     * after that only until DRAIN_MS. */
    int pending;
    if (!e->out.eof && ioctl(e->out.w.fd, FIONREAD, &pending) == 0 && pending > 0)
        e->left_at_exit += (uint64_t)pending;
    if (!e->err.eof && ioctl(e->err.w.fd, FIONREAD, &pending) == 0 && pending > 0)
        e->left_at_exit += (uint64_t)pending;
    timer_arm(e->srv->loop, &e->drain_t, DRAIN_MS);
    /* the pipes that hung up before the exit (exec_on_pipe): their last close is over now */
    if (e->out.hup && !e->out.eof)
        exec_on_pipe(e->srv->loop, &e->out.w, 0);
    if (e->err.hup && !e->err.eof && e->conn && !e->finished)
        exec_on_pipe(e->srv->loop, &e->err.w, 0);
    exec_check_done(e);
}

static void exec_on_drain_timer(loop_t *l, timer_t_ *t)
{
    exec_t *e = t->data;
    /* A slow client, or output of the command itself still in the pipes (up to 3 bytes of a
     * UTF-8 sequence may be held back, hence the slack): keep going. */
    if (e->conn && (conn_out_full(e->conn) || e->read_since_exit + 4 <= e->left_at_exit)) {
        timer_arm(l, t, DRAIN_MS / 4);
        return;
    }
    /* Read what the pipes already hold before giving up on them: the loop runs timers after a
     * whole batch of events, and a batch full of spawns can outlast DRAIN_MS, so the pipes'
     * readiness may not have been seen yet. (1000 concurrent execs lost their whole output
     * this way: bench/bench_server.c, section 5.) Output that comes later (a
     * grandchild still writing) does not hold the stream open. */
    if (!e->out.eof)
        exec_on_pipe(l, &e->out.w, EPOLLIN);
    if (!e->err.eof && e->conn && !e->finished)
        exec_on_pipe(l, &e->err.w, EPOLLIN);
    if (!e->conn || e->finished || timer_armed(t))
        return;
    if (conn_out_full(e->conn)) {
        timer_arm(l, t, DRAIN_MS);
        return;
    }
    exec_finish(e);
}

static void exec_on_timeout(loop_t *l, timer_t_ *t)
{
    exec_t *e = t->data;
    (void)l;
    e->timed_out = true;
    exec_kill(e);
}

static void exec_on_ping(loop_t *l, timer_t_ *t)
{
    exec_t *e = t->data;
    static const char ping[] = "{\"event\":\"ping\"}\n";
    (void)l;
    exec_emit(e, ping, sizeof ping - 1);
    if (e->conn && !e->finished) {
        conn_flush(e->conn);
        /* This flush may have emptied a buffer the pipes were paused on; on_drain only
         * follows a writable event, so resume here or nobody will. */
        if (!conn_out_full(e->conn))
            exec_pause(e, false);
    }
}

static void exec_maybe_free(exec_t *e)
{
    if (e->conn || !e->exited)
        return;
    if (loop_defer(e->srv->loop, exec_free, e) < 0)
        exec_free(e);
}

static void exec_conn_drain(conn_t *c)
{
    exec_t *e = c->hdata;
    if (e && !e->finished)
        exec_pause(e, false);
}

static void exec_conn_close(conn_t *c, bool aborted)
{
    exec_t *e = c->hdata;
    (void)aborted;
    c->hdata = NULL;
    e->conn = NULL;
    /* A client that went away must not leave its command running unattended. */
    exec_kill(e);
    outpipe_close(e->srv->loop, &e->out);
    outpipe_close(e->srv->loop, &e->err);
    timer_disarm(e->srv->loop, &e->ping_t);
    timer_disarm(e->srv->loop, &e->drain_t);
    exec_op_end(e);
    exec_maybe_free(e);
}

static const handler_ops_t exec_ops = {
    .on_drain = exec_conn_drain,
    .on_close = exec_conn_close,
};

/* Between the request and the helper's answer: a client that goes away only detaches. */
static void exec_pending_close(conn_t *c, bool aborted)
{
    exec_t *e = c->hdata;
    (void)aborted;
    c->hdata = NULL;
    e->conn = NULL;
}

static const handler_ops_t exec_pending_ops = {
    .on_close = exec_pending_close,
};

static void exec_started(void *data, int r, spawned_t *sp, const char *why)
{
    exec_t *e = data;
    server_t *s = e->srv;
    conn_t *c = e->conn;
    if (r < 0) {
        if (c) {
            conn_set_handler(c, NULL, NULL);
            if (r == -ESRCH)
                http_bad_request(c, 0, "%s", why); /* the sandbox was deleted */
            else
                http_bad_request(c, 0, "failed to start %s: %s", e->argv0, why);
        }
        exec_op_end(e);
        sandbox_unref(e->sb);
        free(e->in_data);
        free(e->argv0);
        free(e);
        return;
    }
    if (e->sb)
        e->sb->running++;
    e->sp = *sp;
    e->start_ms = monotonic_ms();
    e->child = (child_t){ .pid = sp->pid, .on_exit = exec_on_exit, .data = e };
    server_child_add(s, &e->child);
    outpipe_init(&e->out, sp->out_fd, "stdout", exec_on_pipe, e);
    outpipe_init(&e->err, sp->err_fd, "stderr", exec_on_pipe, e);
    watcher_init(&e->in_w, sp->in_fd, exec_on_stdin, e);
    if (!c) { /* the client left while it started: it must not run unattended */
        exec_kill(e);
        outpipe_close(s->loop, &e->out);
        outpipe_close(s->loop, &e->err);
        exec_op_end(e);
        return; /* freed at its exit */
    }
    conn_set_handler(c, &exec_ops, e);
    if (e->in_data)
        (void)loop_watch(s->loop, &e->in_w, EPOLLOUT);
    if (e->timeout_ms)
        timer_arm(s->loop, &e->timeout_t, e->timeout_ms);
    (void)loop_watch(s->loop, &e->out.w, EPOLLIN);
    (void)loop_watch(s->loop, &e->err.w, EPOLLIN);

    conn_stream_begin(c, 200, "application/x-ndjson",
                      "Cache-Control: no-store\r\nX-Accel-Buffering: no\r\n");
    char line[64];
    int n = snprintf(line, sizeof line, "{\"event\":\"start\",\"pid\":%d}\n", (int)sp->pid);
    exec_emit(e, line, (size_t)n);
    conn_flush(c);
}

static void exec_start_foreground(conn_t *c, exec_spec_t *spec)
{
    server_t *s = server_of(c);
    exec_t *e = calloc(1, sizeof *e);
    if (!e || !(e->argv0 = strdup(spec->argv[0]))) {
        free(e);
        http_unavailable(c, 0, "out of memory");
        return;
    }
    e->srv = s;
    e->conn = c;
    e->base64 = spec->base64;
    e->pty = spec->pty;
    e->timeout_ms = spec->timeout_ms;
    e->sp = (spawned_t){ .pid = 0, .in_fd = -1, .out_fd = -1, .err_fd = -1, .cg = CMDCG_NONE };
    outpipe_init(&e->out, -EBADF, "stdout", exec_on_pipe, e);
    outpipe_init(&e->err, -EBADF, "stderr", exec_on_pipe, e);
    watcher_init(&e->in_w, -EBADF, exec_on_stdin, e);
    timer_init(&e->timeout_t, exec_on_timeout, e);
    timer_init(&e->ping_t, exec_on_ping, e);
    timer_init(&e->drain_t, exec_on_drain_timer, e);
    watcher_init(&e->tick_w, -EBADF, exec_on_tick, e);
    if (spec->has_stdin) {
        e->in_data = TAKE_PTR(spec->stdin_data);
        e->in_len = spec->stdin_len;
    }
    sbx_err_t why;
    int r = spawn_command(s, spec, conn_sandbox(c), exec_started, e, &why);
    if (r < 0) {
        if (r == -ESRCH)
            http_bad_request(c, 0, "%s", why.msg); /* the sandbox was deleted */
        else
            http_bad_request(c, 0, "failed to start %s: %s", spec->argv[0], why.msg);
        free(e->in_data);
        free(e->argv0);
        free(e);
        return;
    }
    /* From here the operation counts (idle eviction and the server's idle timer wait). */
    e->sb = sandbox_ref(conn_sandbox(c));
    if (e->sb)
        e->sb->ops++;
    server_op_begin(s);
    e->op_counted = true;
    conn_set_handler(c, &exec_pending_ops, e);
}

static void exec_body(conn_t *c, json_t *o)
{
    exec_spec_t spec;
    sbx_err_t err = { 0 };
    int r = exec_spec_parse(o, conn_sandbox(c) ? conn_sandbox(c)->env : environ, &spec, &err);
    if (r < 0) {
        http_error(c, r == -EINVAL ? HTTP_BAD_REQUEST : HTTP_UNAVAILABLE, 0, "%s", err.msg);
        return;
    }
    if (spec.background)
        proc_start(c, &spec, true);
    else if (spec.stdin_stream)
        http_bad_request(c, 0, "stdin:true (a stdin stream) needs background:true");
    else
        exec_start_foreground(c, &spec);
    exec_spec_done(&spec);
}

void route_exec(conn_t *c, const route_params_t *p)
{
    (void)p;
    route_with_json_body(c, EXEC_MAX_BODY, exec_body);
}
