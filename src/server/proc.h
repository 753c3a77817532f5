/* SPDX-License-Identifier: MIT */
/* Background processes: the p-<n> registry, bounded output log for re-attaching, streaming
 * stdin, signals with a grace period. */
#pragma once

#include "http/conn.h"
#include "spawn.h"

#define PROC_LOG_MAX (1024 * 1024) /* replay buffer per process */
#define PROC_MAX_FINISHED 256
#define PROC_MAX_RUNNING 1024
#define PROC_MAX_RUNNING_SANDBOX (PROC_MAX_RUNNING / 4) /* of them, one pooled sandbox's */

typedef struct server server_t;

typedef struct proc proc_t;
typedef struct attach attach_t;

/* Start spec as a background process and answer the request. */
void proc_start(conn_t *c, exec_spec_t *spec, bool from_exec);
size_t server_running_procs(const server_t *s);
void procs_kill_all(server_t *s);
/* A sandbox is being deleted: kill and forget its processes. */
void procs_drop_sandbox(server_t *s, sandbox_t *sb);

/* ---- the same registry for another protocol (envd.c) ------------------------------------- */

/* The answer to proc_launch(), never called from inside it: r < 0 (why says it) or the process,
 * now registered (listed, limited, scoped to its sandbox and killed with it like any other). */
typedef void (*proc_launch_cb)(void *data, int r, proc_t *p, const char *why);
/* Start spec as a background process of sandbox sb (NULL: dedicated mode); extra (a reference
 * is taken, may be NULL) stays with the entry. < 0: nothing started, err (may be NULL) says it
 * (-EAGAIN: too many running). */
int proc_launch(server_t *s, sandbox_t *sb, exec_spec_t *spec, json_t *extra, proc_launch_cb cb,
                void *data, sbx_err_t *err);
/* Running processes of sb by OS pid or by tag; NULL when none. */
proc_t *proc_find_pid(server_t *s, sandbox_t *sb, pid_t pid);
proc_t *proc_find_tag(server_t *s, sandbox_t *sb, const char *tag);
/* The entries of sb after `after` (NULL: the first), newest first. */
proc_t *proc_next(server_t *s, sandbox_t *sb, proc_t *after);
pid_t proc_pid(const proc_t *p);
const char *proc_tag(const proc_t *p);
json_t *proc_extra(const proc_t *p); /* borrowed */
json_t *proc_cmd(const proc_t *p);   /* borrowed: cmd as sent to our routes */
bool proc_exited(const proc_t *p);
int proc_wstatus(const proc_t *p);
bool proc_timed_out(const proc_t *p);
bool proc_is_pty(const proc_t *p);

/* A reader of a process's output in another encoding. output() writes one piece (is_err: it
 * came from stderr) and returns < 0 when the connection is gone; end() is called once, after
 * the last output, when the process exited and its output is drained (p) or when the entry
 * went away (p NULL). The connection's handler is the caller's: its on_drain calls
 * proc_attach_pump(), its on_close proc_attach_free(). */
typedef struct {
    int (*output)(void *ctx, bool is_err, const unsigned char *d, size_t n);
    void (*end)(void *ctx, const proc_t *p);
} proc_sink_ops_t;
/* Attach to p: from its first output (from_start) or from what comes next. */
attach_t *proc_attach_sink(proc_t *p, conn_t *c, bool from_start, const proc_sink_ops_t *ops,
                           void *ctx);
void proc_attach_pump(attach_t *a);
void proc_attach_free(attach_t *a);
/* sig to the process group (SIGKILL also kills its cgroup); false when it already exited. */
bool proc_send_signal(proc_t *p, int sig);
/* The stdin pipe (non-blocking), or < 0 when closed. */
int proc_stdin_fd(const proc_t *p);
/* -EBADF: already closed; -EBUSY: a POST .../stdin is writing. */
int proc_stdin_close(proc_t *p);
/* A process on a pty: its window size (-ENOTTY: not on a pty). */
int proc_pty_resize(proc_t *p, unsigned short rows, unsigned short cols);
