/* SPDX-License-Identifier: MIT */
/* Exec requests: parsing the JSON spec, starting the command, encoding its output as events. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/err.h"
#include "isolation/cgroup.h"

typedef struct sandbox sandbox_t;
typedef struct server server_t;

#define EXEC_MAX_BODY (16 * 1024 * 1024)
#define EXEC_MAX_ENV_BYTES (64 * 1024)
/* One read of a /v1/exec stream's pipe, one event: a quarter of the pipe (1 MiB). Fewer,
 * larger reads and sends cost the server ~18 % less CPU per streamed byte than 64 KiB ones
 * (base64, measured); an event is at most ~1.5 MiB on the wire (UTF-8 escapes). */
#define EXEC_READ_CHUNK (256 * 1024)
/* The same for background processes (proc.c; envd's streams), whose events clients also
 * buffer whole. */
#define PROC_READ_CHUNK (64 * 1024)

typedef struct {
    json_t *cmd; /* as sent (string or array), for echoing back */
    char **argv;
    char **envp;
    char *cwd;
    uint64_t timeout_ms; /* 0 = none */
    char *stdin_data;
    size_t stdin_len;
    bool has_stdin;
    bool stdin_stream; /* background: keep stdin open for POST .../stdin */
    bool background;
    char *tag;
    bool base64; /* "encoding":"base64" */
    /* On a pseudo-terminal (envd's PTY): stdin, stdout and stderr are its slave, the command
     * leads a session of its own with it as controlling terminal; output and input go through
     * the master (spawned_t: out_fd the master, in_fd a second descriptor of it, err_fd -1). */
    bool pty;
    unsigned short pty_rows, pty_cols;
} exec_spec_t;

/* Parse and validate; on failure (-EINVAL: the request's fault, -ENOMEM) err says why. */
int exec_spec_parse(json_t *o, char *const *base_env, exec_spec_t *spec, sbx_err_t *err);
void exec_spec_done(exec_spec_t *spec);

/* A pooled sandbox's command in a cgroup2 group of its own, so that killing it reaches every
 * process it started, setsid() descendants included (cgroup.kill). A sandbox keeps up to
 * CMDCG_KEPT groups, "s<uid>-k<i>", for its commands (each reused while it is left empty: no
 * mkdir and rmdir per command, ~80 us of cgroupfs work; a long-running background process
 * holds one, the next command takes another); a command that starts while all are in use, or
 * are ones commands left processes in, gets a group of its own ("s<uid>-c<n>"), removed when
 * it ends. */
typedef struct {
    int kill_fd;     /* cgroup.kill of the command's group, or -1 (no group: dedicated mode) */
    int events_fd;   /* cgroup.events of the sandbox's kept group (keep set), or -1 */
    sandbox_t *keep; /* the sandbox whose kept group this is (a reference), or NULL */
    int slot;        /* which of its kept groups (keep set) */
    char dir[200];   /* a group of its own: removed when the command is over, if empty (the
                      * pool may be gone by then: at shutdown processes are freed after it) */
} cmdcg_t;

#define CMDCG_NONE ((cmdcg_t){ .kill_fd = -1, .events_fd = -1 })
#define CMDCG_KEPT 4 /* kept groups per sandbox (bits of sandbox_t's cg_busy and cg_lost) */

/* How a spawn helper comes by the command's group. */
enum {
    CMDCG_OWN = 0,  /* made for this command (removed again if the child does not start) */
    CMDCG_KEEP = 1, /* one of the sandbox's kept groups: made if missing, taken if it is
                     * empty (else refused), its cgroup.kill and cgroup.events handed back
                     * with the answer, and left in place when the child does not start */
};

/* The cgroups a spawn helper makes for a command: the command's own group root/name (root
 * NULL: none) and how (CMDCG_*), and the sandbox's (v1) groups when they are not open yet (its
 * first command, or its handles were closed): made or refreshed there (limits written,
 * cgroup.procs opened, off the event loop) and handed back to the sandbox (prep NULL: none). */
typedef struct {
    const char *root;
    char name[40];
    int mode;
    const cgroups_t *prep;
    uint32_t prep_slot;
    cg_limits_t prep_lim;
} cmdcg_req_t;

typedef struct {
    pid_t pid;
    int in_fd; /* -1 unless stdin data or a stdin stream was asked for */
    int out_fd, err_fd;
    cmdcg_t cg;
} spawned_t;

/* The answer to spawn_command(): r < 0 (err says why, sp is NULL) or the started command. The
 * callback owns what sp holds (pipes, cgroup). Never called from inside spawn_command(). */
typedef void (*spawn_done_cb)(void *data, int r, spawned_t *sp, const char *err);

/* Start the command in its own process group with pipes for stdout/stderr (non-blocking on
 * our side): as the server in dedicated mode, confined as sandbox sb in host mode. The child is
 * created by a spawn helper (spawner.h) while the loop goes on; done() follows. A command that
 * cannot be started fails (in done(), or here with -errno and err) before any stream begins;
 * -ESRCH: the sandbox was deleted. */
int spawn_command(server_t *s, const exec_spec_t *spec, sandbox_t *sb, spawn_done_cb done,
                  void *data, sbx_err_t *err);
void spawned_close(spawned_t *sp);

/* Output events. `carry` holds up to 3 bytes of a UTF-8 sequence split across reads. */
typedef struct {
    unsigned char b[4];
    size_t n;
} utf8_carry_t;

/* Upper bound of the encoded size of one output event for n payload bytes. */
size_t event_output_max(size_t n);
/* Encode {"event":<stream>,"data":...}\n into dst. In UTF-8 mode the bytes must already be
 * split at a sequence boundary; invalid bytes make the event carry "data" (with U+FFFD) and
 * "data_b64" (the exact bytes). Returns the length written. */
size_t event_encode_output(char *dst, const char *stream, const unsigned char *p, size_t n,
                           bool base64);
/* Move the incomplete UTF-8 tail of buf (len) into carry; return the length to emit now. */
size_t utf8_split_tail(const unsigned char *buf, size_t len, utf8_carry_t *carry);
/* The encoder's paths one at a time, for tests that compare them: width 0 the bytewise one,
 * 16 SSSE3, 64 AVX-512; -1 where this CPU has not that path. utf8_valid_at: whether the path's
 * validator finds p[0..n) valid UTF-8. json_escape_at: what its escape writes for p[0..n)
 * (for widths 16 and 64, p must be valid UTF-8; dst: room for event_output_max(n)). */
int utf8_valid_at(unsigned width, const unsigned char *p, size_t n);
ssize_t json_escape_at(unsigned width, char *dst, const unsigned char *p, size_t n);
/* {"event":"exit",...}\n from a wait status. */
int event_encode_exit(char *dst, size_t cap, int wstatus, bool timed_out, uint64_t duration_ms);
