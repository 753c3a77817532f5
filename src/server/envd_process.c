/* SPDX-License-Identifier: MIT */
/* envd's process.Process service on proc.c's registry: a process started here is an ordinary
 * background process of the server (or of the pool sandbox), spawned and confined by the same
 * code as POST /v1/processes, listed there too, killed with its sandbox. It outlives the Start
 * stream that started it (E2B's disconnect/connect), and its OS pid or tag selects it. */
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <sys/wait.h>

#include "envd.h"
#include "exec.h"
#include "pool.h"
#include "proc.h"
#include "server.h"

extern char **environ;

#define INPUT_MAX (8u * 1024 * 1024) /* decoded bytes of one SendInput */

bool envd_process_streams(sv_t method, bool *ret_known)
{
    static const char *const unary[] = { "List", "SendInput", "CloseStdin", "SendSignal",
                                         "Update" };
    *ret_known = true;
    if (sv_eq(method, SV("Start")) || sv_eq(method, SV("Connect")))
        return true;
    for (size_t i = 0; i < ELEMENTSOF(unary); i++)
        if (method.len == strlen(unary[i]) && memcmp(method.p, unary[i], method.len) == 0)
            return false;
    /* StreamInput (a client stream) is used by neither SDK and not served */
    *ret_known = false;
    return false;
}

/* ---- events ------------------------------------------------------------------------------ */

/* Go's names for signals (os.ProcessState's "signal: killed"), which E2B's clients show. */
static const char *signal_text(int sig)
{
    switch (sig) {
    case SIGHUP: return "hangup";
    case SIGINT: return "interrupt";
    case SIGQUIT: return "quit";
    case SIGILL: return "illegal instruction";
    case SIGTRAP: return "trace/breakpoint trap";
    case SIGABRT: return "aborted";
    case SIGBUS: return "bus error";
    case SIGFPE: return "floating point exception";
    case SIGKILL: return "killed";
    case SIGUSR1: return "user defined signal 1";
    case SIGSEGV: return "segmentation fault";
    case SIGUSR2: return "user defined signal 2";
    case SIGPIPE: return "broken pipe";
    case SIGALRM: return "alarm clock";
    case SIGTERM: return "terminated";
    default: return NULL;
    }
}

/* {"event":{"end":{"exitCode","exited","status"[,"error"]}}} as envd fills it from Go's
 * ProcessState: a death by signal is exitCode -1, exited false. */
static json_t *end_event(int wstatus)
{
    char status[64];
    int code = -1;
    bool exited = WIFEXITED(wstatus);
    if (exited) {
        code = WEXITSTATUS(wstatus);
        (void)snprintf(status, sizeof status, "exit status %d", code);
    } else {
        int sig = WIFSIGNALED(wstatus) ? WTERMSIG(wstatus) : 0;
        const char *t = signal_text(sig);
        if (t)
            (void)snprintf(status, sizeof status, "signal: %s", t);
        else
            (void)snprintf(status, sizeof status, "signal: signal %d", sig);
    }
    json_t *end = json_pack("{s:i,s:b,s:s}", "exitCode", code, "exited", exited, "status", status);
    if (end && code != 0)
        json_object_set_new(end, "error", json_string(status));
    return json_pack("{s:{s:o}}", "event", "end", end);
}

/* ---- the stream of one process (Start, Connect) ------------------------------------------ */

typedef struct start_pending start_pending_t;

typedef struct {
    envd_call_t *call;
    start_pending_t *pending; /* Start: the spawn not answered yet */
    attach_t *a;
    bool pty;
} pstream_t;

struct start_pending {
    envd_call_t *call; /* NULL once the client left: the process runs on regardless */
};

static int sink_output(void *ctx, bool is_err, const unsigned char *d, size_t n)
{
    pstream_t *ps = ctx;
    size_t b64 = sodium_base64_ENCODED_LEN(n, sodium_base64_VARIANT_ORIGINAL);
    size_t cap = b64 + 64;
    char *msg = malloc(cap);
    if (!msg)
        return -ENOMEM;
    const char *stream = ps->pty ? "pty" : is_err ? "stderr" : "stdout";
    int k = snprintf(msg, cap, "{\"event\":{\"data\":{\"%s\":\"", stream);
    sodium_bin2base64(msg + k, b64, d, n, sodium_base64_VARIANT_ORIGINAL);
    size_t len = (size_t)k + strlen(msg + k);
    memcpy(msg + len, "\"}}}", 4);
    len += 4;
    int r = envd_send_raw(ps->call, msg, len);
    free(msg);
    return r;
}

static void sink_end(void *ctx, const proc_t *p)
{
    pstream_t *ps = ctx;
    ps->a = NULL; /* freed by the call's close, below; proc.c is done with it */
    envd_call_t *call = ps->call;
    if (!p) {
        envd_fail(call, CONNECT_ABORTED, "the process is gone (its sandbox was deleted)");
        return;
    }
    if (envd_send(call, end_event(proc_wstatus(p))) < 0)
        return;
    if (proc_timed_out(p))
        envd_fail(call, CONNECT_DEADLINE_EXCEEDED,
                  "the command ran past its deadline (Connect-Timeout-Ms) and was killed");
    else
        envd_end(call);
}

static const proc_sink_ops_t sink_ops = { .output = sink_output, .end = sink_end };

static void pstream_drain(envd_call_t *call)
{
    pstream_t *ps = call->state;
    if (ps->a)
        proc_attach_pump(ps->a);
}

/* The attach record must be released with the connection, whether or not it ended. */
typedef struct {
    pstream_t ps;
    attach_t *held;
} pstream_box_t;

static void pstream_box_close(envd_call_t *call)
{
    pstream_box_t *box = call->state;
    if (!box)
        return;
    if (box->ps.pending)
        box->ps.pending->call = NULL;
    proc_attach_free(box->held);
    call->state = NULL;
    free(box);
}

static pstream_t *pstream_new(envd_call_t *call)
{
    pstream_box_t *box = calloc(1, sizeof *box);
    if (!box)
        return NULL;
    box->ps.call = call;
    call->state = box;
    call->on_drain = pstream_drain;
    call->on_close = pstream_box_close;
    return &box->ps;
}

/* Send the start event, then everything from `from_start` on. */
static void pstream_attach(pstream_t *ps, proc_t *p, bool from_start)
{
    envd_call_t *call = ps->call;
    ps->pty = proc_is_pty(p);
    json_t *start = json_pack("{s:{s:{s:i}}}", "event", "start", "pid", (int)proc_pid(p));
    if (envd_send(call, start) < 0)
        return;
    pstream_box_t *box = (pstream_box_t *)ps;
    box->held = ps->a = proc_attach_sink(p, call->c, from_start, &sink_ops, ps);
    if (!ps->a) {
        envd_fail(call, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    proc_attach_pump(ps->a);
    conn_flush(call->c);
}

static void start_answered(void *data, int r, proc_t *p, const char *why)
{
    start_pending_t *sp = data;
    envd_call_t *call = sp->call;
    free(sp);
    if (!call)
        return; /* the client left; a started process runs on, listed */
    pstream_t *ps = call->state;
    ps->pending = NULL;
    if (r < 0) {
        envd_fail(call, r == -EAGAIN ? CONNECT_RESOURCE_EXHAUSTED : CONNECT_INVALID_ARGUMENT, "%s",
                  why);
        return;
    }
    pstream_attach(ps, p, true);
}

/* The deadline of a Start stream is the command's: proc.c kills it then, and the end event
 * (signal: killed) is followed by deadline_exceeded. Before the process started, it ends now. */
static void start_deadline(envd_call_t *call)
{
    pstream_t *ps = call->state;
    if (ps->pending)
        envd_fail(call, CONNECT_DEADLINE_EXCEEDED, "the deadline passed before the start");
}

/* Our exec request from E2B's ProcessConfig: argv is cmd + args (no shell), envs on top of the
 * base environment, cwd (rooted at the home in a pool sandbox), tag, stdin kept open unless
 * "stdin": false. */
static int exec_request(json_t *req, json_t **ret, sbx_err_t *err)
{
    json_t *pc = json_object_get(req, "process");
    json_t *cmd = json_object_get(pc, "cmd");
    if (!json_is_object(pc) || !json_is_string(cmd) || json_string_length(cmd) == 0)
        return sbx_err(err, -EINVAL, "process.cmd is required");
    json_t *argv = json_array();
    json_t *o = json_object();
    if (!argv || !o || json_array_append(argv, cmd) < 0) {
        json_decref(argv);
        json_decref(o);
        return sbx_err(err, -ENOMEM, "out of memory");
    }
    json_object_set_new(o, "cmd", argv);
    json_t *args = json_object_get(pc, "args");
    if (args && !json_is_null(args)) {
        if (!json_is_array(args)) {
            json_decref(o);
            return sbx_err(err, -EINVAL, "process.args must be an array of strings");
        }
        size_t i;
        json_t *a;
        json_array_foreach(args, i, a)
            json_array_append(argv, a);
    }
    json_t *envs = json_object_get(pc, "envs");
    if (envs && !json_is_null(envs))
        json_object_set(o, "env", envs);
    json_t *cwd = json_object_get(pc, "cwd");
    if (json_is_string(cwd) && json_string_length(cwd) > 0)
        json_object_set(o, "cwd", cwd);
    else if (cwd && !json_is_null(cwd) && !json_is_string(cwd)) {
        json_decref(o);
        return sbx_err(err, -EINVAL, "process.cwd must be a string");
    }
    json_t *tag = json_object_get(req, "tag");
    if (tag && !json_is_null(tag))
        json_object_set(o, "tag", tag);
    json_t *in = json_object_get(req, "stdin");
    if (in && !json_is_null(in) && !json_is_boolean(in)) {
        json_decref(o);
        return sbx_err(err, -EINVAL, "stdin must be a boolean");
    }
    json_object_set_new(o, "stdin", json_boolean(!in || json_is_null(in) || json_is_true(in)));
    *ret = o;
    return 0;
}

/* {"cols": N, "rows": N} */
static int pty_size(json_t *size, unsigned short *rows, unsigned short *cols)
{
    json_t *c = json_object_get(size, "cols"), *r = json_object_get(size, "rows");
    if (!json_is_integer(c) || !json_is_integer(r) || json_integer_value(c) < 1 ||
        json_integer_value(c) > 65535 || json_integer_value(r) < 1 || json_integer_value(r) > 65535)
        return -EINVAL;
    *cols = (unsigned short)json_integer_value(c);
    *rows = (unsigned short)json_integer_value(r);
    return 0;
}

static void rpc_start(envd_call_t *call, json_t *req)
{
    conn_t *c = call->c;
    pstream_t *ps = pstream_new(call);
    start_pending_t *sp = calloc(1, sizeof *sp);
    if (!ps || !sp) {
        free(sp);
        envd_fail(call, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    call->on_deadline = start_deadline;
    json_t *o = NULL;
    exec_spec_t spec;
    sbx_err_t err = { 0 };
    int r = exec_request(req, &o, &err);
    if (r >= 0)
        r = exec_spec_parse(o, conn_sandbox(c) ? conn_sandbox(c)->env : environ, &spec, &err);
    json_decref(o);
    if (r < 0) {
        free(sp);
        envd_fail(call, r == -EINVAL ? CONNECT_INVALID_ARGUMENT : CONNECT_RESOURCE_EXHAUSTED, "%s",
                  err.msg);
        return;
    }
    json_t *pty = json_object_get(req, "pty");
    if (pty && !json_is_null(pty)) {
        if (pty_size(json_object_get(pty, "size"), &spec.pty_rows, &spec.pty_cols) < 0) {
            exec_spec_done(&spec);
            free(sp);
            envd_fail(call, CONNECT_INVALID_ARGUMENT, "pty.size needs cols and rows (1..65535)");
            return;
        }
        spec.pty = true; /* input always open: it is the terminal's */
    }
    spec.timeout_ms = call->timeout_ms; /* Connect-Timeout-Ms is the command's timeout */
    /* what List answers: the config as sent, and the tag */
    json_t *extra = json_pack("{s:O?}", "config", json_object_get(req, "process"));
    sp->call = call;
    r = proc_launch(server_of(c), conn_sandbox(c), &spec, extra, start_answered, sp, &err);
    json_decref(extra);
    exec_spec_done(&spec);
    if (r < 0) {
        free(sp);
        envd_fail(call, r == -EAGAIN ? CONNECT_RESOURCE_EXHAUSTED : CONNECT_INVALID_ARGUMENT, "%s",
                  err.msg);
        return;
    }
    ps->pending = sp;
}

/* {"process":{"pid":N}} or {"process":{"tag":"..."}} (pid as a number or a string). */
static proc_t *select_process(envd_call_t *call, json_t *req)
{
    conn_t *c = call->c;
    json_t *sel = json_object_get(req, "process");
    json_t *pid = json_object_get(sel, "pid"), *tag = json_object_get(sel, "tag");
    proc_t *p = NULL;
    if (json_is_integer(pid) && json_integer_value(pid) > 0 &&
        json_integer_value(pid) <= INT32_MAX) {
        p = proc_find_pid(server_of(c), conn_sandbox(c), (pid_t)json_integer_value(pid));
    } else if (json_is_string(pid)) {
        uint64_t n;
        if (parse_u64(sv_make(json_string_value(pid), json_string_length(pid)), INT32_MAX, &n) == 0)
            p = proc_find_pid(server_of(c), conn_sandbox(c), (pid_t)n);
    } else if (json_is_string(tag)) {
        p = proc_find_tag(server_of(c), conn_sandbox(c), json_string_value(tag));
    } else {
        envd_fail(call, CONNECT_INVALID_ARGUMENT, "process must name a pid or a tag");
        return NULL;
    }
    if (!p)
        envd_fail(call, CONNECT_NOT_FOUND, "process not found");
    return p;
}

static void rpc_connect(envd_call_t *call, json_t *req)
{
    pstream_t *ps = pstream_new(call);
    if (!ps) {
        envd_fail(call, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    proc_t *p = select_process(call, req);
    if (p)
        pstream_attach(ps, p, false);
}

/* ---- unary ------------------------------------------------------------------------------- */

/* ProcessConfig of a process started by our own routes: its cmd as argv. */
static json_t *config_of(proc_t *p)
{
    json_t *extra = proc_extra(p);
    json_t *cfg = json_object_get(extra, "config");
    if (cfg)
        return json_incref(cfg);
    json_t *cmd = proc_cmd(p);
    if (json_is_string(cmd))
        return json_pack("{s:s,s:[s,O]}", "cmd", "/bin/sh", "args", "-c", cmd);
    json_t *args = json_array();
    size_t i;
    json_t *a;
    json_array_foreach(cmd, i, a)
        if (i > 0)
            json_array_append(args, a);
    return json_pack("{s:O,s:o}", "cmd", json_array_get(cmd, 0), "args", args);
}

static void rpc_list(envd_call_t *call, json_t *req)
{
    conn_t *c = call->c;
    json_t *arr = json_array();
    (void)req;
    for (proc_t *p = proc_next(server_of(c), conn_sandbox(c), NULL); p && arr;
         p = proc_next(server_of(c), conn_sandbox(c), p)) {
        if (proc_exited(p))
            continue;
        json_t *e = json_pack("{s:i,s:o}", "pid", (int)proc_pid(p), "config", config_of(p));
        if (e && proc_tag(p))
            json_object_set_new(e, "tag", json_string(proc_tag(p)));
        json_array_append_new(arr, e);
    }
    envd_reply(call, arr ? json_pack("{s:o}", "processes", arr) : NULL);
}

static int signal_of(json_t *v)
{
    if (json_is_integer(v))
        return (int)json_integer_value(v);
    if (!json_is_string(v))
        return 0;
    const char *s = json_string_value(v);
    if (streq(s, "SIGNAL_SIGKILL"))
        return SIGKILL;
    if (streq(s, "SIGNAL_SIGTERM"))
        return SIGTERM;
    return 0;
}

static void rpc_send_signal(envd_call_t *call, json_t *req)
{
    int sig = signal_of(json_object_get(req, "signal"));
    if (sig != SIGKILL && sig != SIGTERM) {
        envd_fail(call, CONNECT_INVALID_ARGUMENT,
                  "signal must be SIGNAL_SIGKILL or SIGNAL_SIGTERM");
        return;
    }
    proc_t *p = select_process(call, req);
    if (!p)
        return;
    (void)proc_send_signal(p, sig);
    envd_reply(call, json_object());
}

static void rpc_close_stdin(envd_call_t *call, json_t *req)
{
    proc_t *p = select_process(call, req);
    if (!p)
        return;
    int r = proc_stdin_close(p);
    if (r == -EBUSY) {
        envd_fail(call, CONNECT_FAILED_PRECONDITION, "a stdin write is in progress");
        return;
    }
    envd_reply(call, json_object()); /* closing a closed stdin is not an error */
}

/* ---- SendInput: written as the command reads; the answer comes once all of it is in ----- */

typedef struct {
    watcher_t w; /* a duplicate of the stdin pipe's descriptor */
    unsigned char *data;
    size_t len, off;
} input_t;

static void input_free(input_t *in, loop_t *l)
{
    if (!in)
        return;
    loop_unwatch(l, &in->w);
    safe_close(in->w.fd);
    free(in->data);
    free(in);
}

static void input_close(envd_call_t *call)
{
    input_free(call->state, call->c->srv->loop);
    call->state = NULL;
}

/* Write what the pipe takes; 1: all written, 0: wait for room, < 0: failed. */
static int input_write(input_t *in)
{
    while (in->off < in->len) {
        ssize_t n = write(in->w.fd, in->data + in->off, in->len - in->off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return 0;
        if (n < 0)
            return negative_errno();
        in->off += (size_t)n;
    }
    return 1;
}

static void input_answer(envd_call_t *call, int r)
{
    input_close(call);
    if (r < 0)
        envd_fail(call, CONNECT_FAILED_PRECONDITION, "stdin is closed: %s", strerror(-r));
    else
        envd_reply(call, json_object());
}

static void input_on_writable(loop_t *l, watcher_t *w, uint32_t ev)
{
    envd_call_t *call = w->data;
    (void)ev;
    int r = input_write(call->state);
    if (r == 0 && loop_watch(l, w, EPOLLOUT) >= 0)
        return;
    input_answer(call, r == 0 ? -EIO : r);
}

static void rpc_send_input(envd_call_t *call, json_t *req)
{
    json_t *input = json_object_get(req, "input");
    json_t *d = json_object_get(input, "stdin");
    if (!d)
        d = json_object_get(input, "pty");
    if (!json_is_string(d)) {
        envd_fail(call, CONNECT_INVALID_ARGUMENT, "input.stdin or input.pty (base64) is required");
        return;
    }
    proc_t *p = select_process(call, req);
    if (!p)
        return;
    size_t l = json_string_length(d), n = 0;
    if (l / 4 * 3 > INPUT_MAX) {
        envd_fail(call, CONNECT_RESOURCE_EXHAUSTED, "input too large (max %u bytes)", INPUT_MAX);
        return;
    }
    input_t *in = calloc(1, sizeof *in);
    unsigned char *buf = malloc(l / 4 * 3 + 3);
    if (!in || !buf) {
        free(in);
        free(buf);
        envd_fail(call, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    watcher_init(&in->w, -EBADF, input_on_writable, call);
    in->data = buf;
    call->state = in;
    call->on_close = input_close;
    if (sodium_base642bin(buf, l / 4 * 3 + 3, json_string_value(d), l, "\n\r ", &n, NULL,
                          sodium_base64_VARIANT_ORIGINAL) != 0) {
        input_close(call);
        envd_fail(call, CONNECT_INVALID_ARGUMENT, "input is not valid base64");
        return;
    }
    in->len = n;
    int fd = proc_stdin_fd(p);
    if (fd < 0) {
        input_close(call);
        envd_fail(call, CONNECT_FAILED_PRECONDITION, "stdin is closed");
        return;
    }
    /* our own descriptor of the pipe: the process's may be closed (CloseStdin) meanwhile */
    in->w.fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (in->w.fd < 0) {
        input_answer(call, negative_errno());
        return;
    }
    int r = input_write(in);
    if (r == 0 && loop_watch(call->c->srv->loop, &in->w, EPOLLOUT) >= 0)
        return;
    input_answer(call, r == 0 ? -EIO : r);
}

/* Update: the pty's size (the only thing ProcessConfig lets a client change). */
static void rpc_update(envd_call_t *call, json_t *req)
{
    unsigned short rows = 0, cols = 0;
    json_t *pty = json_object_get(req, "pty");
    if (pty && pty_size(json_object_get(pty, "size"), &rows, &cols) < 0) {
        envd_fail(call, CONNECT_INVALID_ARGUMENT, "pty.size needs cols and rows (1..65535)");
        return;
    }
    proc_t *p = select_process(call, req);
    if (!p)
        return;
    int r = pty ? proc_pty_resize(p, rows, cols) : 0;
    if (r == -ENOTTY)
        envd_fail(call, CONNECT_FAILED_PRECONDITION, "the process has no pty");
    else if (r < 0)
        envd_fail(call, CONNECT_FAILED_PRECONDITION, "cannot resize: %s", strerror(-r));
    else
        envd_reply(call, json_object());
}

void envd_process_call(envd_call_t *call, sv_t method, json_t *req)
{
    if (sv_eq(method, SV("Start")))
        rpc_start(call, req);
    else if (sv_eq(method, SV("Connect")))
        rpc_connect(call, req);
    else if (sv_eq(method, SV("List")))
        rpc_list(call, req);
    else if (sv_eq(method, SV("SendSignal")))
        rpc_send_signal(call, req);
    else if (sv_eq(method, SV("SendInput")))
        rpc_send_input(call, req);
    else if (sv_eq(method, SV("CloseStdin")))
        rpc_close_stdin(call, req);
    else if (sv_eq(method, SV("Update")))
        rpc_update(call, req);
    else
        envd_fail(call, CONNECT_UNIMPLEMENTED, "method not served");
}
