/* SPDX-License-Identifier: MIT */
/* libsbx: the C client of the sbx platform (sbx-control's Jobs, pools and tokens APIs and the
 * sandbox agent behind its edge proxy). Reference: docs/libsbx.md.
 *
 * Conventions
 * - Every call returns 0 (or a count) on success and a negative errno-style code on failure;
 *   when `err` is not NULL it is filled with the code, the HTTP status (0 when none) and a
 *   message that says what went wrong and what to do next.
 * - Outputs (ret_* parameters) are assigned only on success. Strings and arrays the library
 *   returns are the caller's: free them with sbx_free() or the matching *_free() call.
 * - No global state. A client (sbx_client_t) holds one connection, kept alive between calls;
 *   use one client per thread. Streaming callbacks run on the calling thread. The library
 *   starts threads only to move a large file in ranges (see parallel_threshold), and joins
 *   them before the call returns.
 * - Reads wait at most io_timeout_ms, except on exec streams and followed process output,
 *   which last as long as the command runs (TCP keepalive watches the peer).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(SBX_BUILDING_LIBSBX)
#define SBX_API __attribute__((visibility("default")))
#else
#define SBX_API
#endif

#define SBX_AGENT_PORT 49983

typedef struct sbx_client sbx_client_t;
typedef struct sbx_sandbox sbx_sandbox_t;

typedef struct {
    int code;          /* the negative code the call returned */
    int http_status;   /* the platform's HTTP status, 0 when none came back */
    char message[512]; /* what happened and what to do next */
} sbx_error_t;

typedef struct {
    const char *key;
    const char *value;
} sbx_kv_t;

/* ---- the client --------------------------------------------------------------------------- */

typedef struct {
    /* "https://127.0.0.1:49980" (or "http://..." for a plain-HTTP loopback platform). NULL:
     * the first line of $SBX_HOME/endpoint ($SBX_HOME defaults to ~/.sbx). */
    const char *endpoint;
    /* The API token. NULL: $SBX_TOKEN, else the first line of $SBX_HOME/token. */
    const char *token;
    /* The CA certificate (PEM) that the platform's certificate must chain to. NULL:
     * $SBX_HOME/ca.crt. Unused for http:// endpoints. */
    const char *ca_file;
    /* The namespace of jobs and pools. NULL: $SBX_NAMESPACE, else "default". */
    const char *ns;
    /* How long one read or write may wait (ms; streams excepted, see above); 0: 120000. */
    unsigned io_timeout_ms;
    /* Uploads and downloads of at least this many bytes move as parallel_ranges ranges at once,
     * each on a connection (and a thread) of its own. 0: 64 MiB. */
    uint64_t parallel_threshold;
    unsigned parallel_ranges; /* 0: 4; 1: never split */
} sbx_config_t;

SBX_API int sbx_client_new(const sbx_config_t *cfg, sbx_client_t **ret, sbx_error_t *err);
SBX_API void sbx_client_free(sbx_client_t *c);
SBX_API const char *sbx_client_endpoint(const sbx_client_t *c);
SBX_API const char *sbx_client_namespace(const sbx_client_t *c);
/* Free anything the library returned as a plain pointer (JSON text, file contents). */
SBX_API void sbx_free(void *p);

/* ---- sandboxes: dedicated --------------------------------------------------------------- */

/* Progress while a run or a pool host starts: the job's stage and message. */
typedef void (*sbx_progress_fn)(const char *stage, const char *message, void *userdata);

typedef struct {
    const char *image;  /* NULL: the platform's default image */
    const char *flavor; /* NULL: cpu-small */
    const sbx_kv_t *env;
    size_t n_env;
    const sbx_kv_t *secrets; /* environment variables of the agent that are never returned */
    size_t n_secrets;
    const sbx_kv_t *labels; /* public labels (the sbx-sandbox* labels are the library's) */
    size_t n_labels;
    unsigned idle_timeout_s; /* the sandbox exits after this long idle; 0 = never */
    int wait_ms;             /* wait this long for RUNNING; 0 = 120000; < 0: do not wait */
    sbx_progress_fn on_progress;
    void *userdata;
} sbx_create_opts_t;

/* A dedicated sandbox: one job of its own. Waits until it runs (see wait_ms). */
SBX_API int sbx_sandbox_create(sbx_client_t *c, const sbx_create_opts_t *opts, sbx_sandbox_t **ret,
                               sbx_error_t *err);
/* Reach an existing sandbox by id from any process holding the API token: a dedicated job id,
 * or "POOL/ID" for a pooled sandbox. A bare id that is no job is looked up in every pool. */
SBX_API int sbx_sandbox_connect(sbx_client_t *c, const char *id, sbx_sandbox_t **ret,
                                sbx_error_t *err);
/* Wait until a dedicated sandbox's job is RUNNING (after a resume or move). */
SBX_API int sbx_sandbox_wait(sbx_sandbox_t *s, int wait_ms, sbx_progress_fn on_progress,
                             void *userdata, sbx_error_t *err);
/* Cancel a dedicated sandbox's job, or delete a pooled sandbox. The handle stays to be freed. */
SBX_API int sbx_sandbox_kill(sbx_sandbox_t *s, sbx_error_t *err);
SBX_API void sbx_sandbox_free(sbx_sandbox_t *s);
/* "ID" for a dedicated sandbox, "POOL/ID" for a pooled one. */
SBX_API const char *sbx_sandbox_id(const sbx_sandbox_t *s);
SBX_API const char *sbx_sandbox_pool(const sbx_sandbox_t *s); /* NULL when dedicated */

/* The URL and header lines that reach `port` in the sandbox through the edge proxy:
 * *ret_url is "<endpoint>/v1/.../proxy/<port>" (append "/path"), *ret_headers holds
 * "Name: value\r\n" lines (the API token, and a dedicated sandbox's token). Free both. */
SBX_API int sbx_sandbox_proxy(sbx_sandbox_t *s, unsigned port, char **ret_url, char **ret_headers,
                              sbx_error_t *err);

/* ---- exec ------------------------------------------------------------------------------- */

typedef void (*sbx_output_fn)(const void *data, size_t len, void *userdata);

typedef struct {
    const char *cmd;         /* run by /bin/sh -c; or: */
    const char *const *argv; /* NULL-terminated argv (looked up in PATH); cmd must be NULL */
    const char *cwd;
    const sbx_kv_t *env;
    size_t n_env;
    double timeout_s;       /* the command is killed after this long; 0 = none */
    const void *stdin_data; /* written to the command, then closed */
    size_t stdin_len;
    const char *tag;      /* background processes: a label shown in lists */
    bool keep_stdin_open; /* background processes: stdin stays open (sbx_process_stdin) */
    sbx_output_fn on_stdout;
    sbx_output_fn on_stderr;
    void *userdata;
} sbx_exec_opts_t;

typedef struct {
    int pid;
    int exit_code; /* -1 when killed by a signal */
    int signal;    /* 0 when none */
    bool timed_out;
    int64_t duration_ms;
} sbx_exec_result_t;

/* Run a command and stream its output to the callbacks as it comes. */
SBX_API int sbx_exec(sbx_sandbox_t *s, const sbx_exec_opts_t *opts, sbx_exec_result_t *ret,
                     sbx_error_t *err);

/* ---- background processes ----------------------------------------------------------------- */

typedef struct {
    char id[32]; /* "p-<n>" */
    int pid;
    char *cmd; /* as given (a string, or argv as JSON) */
    char *tag;
    int64_t started_at_ms;
    bool running;
    int exit_code; /* -1 while running or when signaled */
    int signal;
    bool timed_out;
    bool stdin_open;
} sbx_process_t;

SBX_API int sbx_process_start(sbx_sandbox_t *s, const sbx_exec_opts_t *opts, sbx_process_t *ret,
                              sbx_error_t *err);
SBX_API int sbx_process_list(sbx_sandbox_t *s, sbx_process_t **ret, size_t *ret_n,
                             sbx_error_t *err);
SBX_API int sbx_process_get(sbx_sandbox_t *s, const char *id, sbx_process_t *ret, sbx_error_t *err);
SBX_API void sbx_process_clear(sbx_process_t *p);
SBX_API void sbx_process_list_free(sbx_process_t *list, size_t n);
/* Re-attach: replay the kept output, then (follow) stream it live until the exit, which fills
 * *ret (when not NULL and the process ended). The callbacks are opts' on_stdout/on_stderr. */
SBX_API int sbx_process_output(sbx_sandbox_t *s, const char *id, bool follow,
                               const sbx_exec_opts_t *callbacks, sbx_exec_result_t *ret,
                               sbx_error_t *err);
SBX_API int sbx_process_stdin(sbx_sandbox_t *s, const char *id, const void *data, size_t len,
                              bool close, sbx_error_t *err);
/* Send a signal to the process group (number, e.g. SIGTERM); grace_s > 0: SIGKILL after. */
SBX_API int sbx_process_signal(sbx_sandbox_t *s, const char *id, int signo, unsigned grace_s,
                               sbx_error_t *err);

/* ---- files ------------------------------------------------------------------------------ */

typedef struct {
    char *name;
    char *path;
    char type[8]; /* "file", "dir", "symlink" */
    uint64_t size;
    int64_t mtime_ms;
    uint32_t mode;
} sbx_file_info_t;

SBX_API int sbx_file_read(sbx_sandbox_t *s, const char *path, void **ret_data, size_t *ret_len,
                          sbx_error_t *err);
SBX_API int sbx_file_write(sbx_sandbox_t *s, const char *path, const void *data, size_t len,
                           sbx_error_t *err);
/* Copy a local file into the sandbox / a sandbox file to a local path, streamed; at or above
 * the client's parallel_threshold in ranges moved at once. progress (may be NULL) is called
 * with bytes done and the total as they move (one call at a time; from the library's transfer
 * threads when the file moves in ranges); the total is UINT64_MAX while unknown (a download
 * whose answer has no length). */
typedef void (*sbx_transfer_fn)(uint64_t done, uint64_t total, void *userdata);
SBX_API int sbx_file_upload(sbx_sandbox_t *s, const char *local_path, const char *path,
                            sbx_transfer_fn progress, void *userdata, sbx_error_t *err);
SBX_API int sbx_file_download(sbx_sandbox_t *s, const char *path, const char *local_path,
                              sbx_transfer_fn progress, void *userdata, sbx_error_t *err);
/* Every entry of a directory (pages followed). */
SBX_API int sbx_file_list(sbx_sandbox_t *s, const char *path, sbx_file_info_t **ret, size_t *ret_n,
                          sbx_error_t *err);
SBX_API int sbx_file_stat(sbx_sandbox_t *s, const char *path, sbx_file_info_t *ret,
                          sbx_error_t *err);
SBX_API void sbx_file_info_clear(sbx_file_info_t *f);
SBX_API void sbx_file_list_free(sbx_file_info_t *list, size_t n);
SBX_API int sbx_file_mkdir(sbx_sandbox_t *s, const char *path, sbx_error_t *err);
SBX_API int sbx_file_delete(sbx_sandbox_t *s, const char *path, bool recursive, sbx_error_t *err);
SBX_API int sbx_file_rename(sbx_sandbox_t *s, const char *from, const char *to, bool overwrite,
                            sbx_error_t *err);

/* ---- pools ------------------------------------------------------------------------------ */

typedef struct {
    const char *name; /* required */
    const char *image;
    const char *flavor;
    /* -1: the platform's default (per_host 32, warm 0, max_hosts 4, sandbox_idle_s 0,
     * host_idle_s 300). sbx_pool_opts_init() sets them all to -1. */
    int per_host, warm, max_hosts, sandbox_idle_s, host_idle_s;
} sbx_pool_opts_t;

SBX_API void sbx_pool_opts_init(sbx_pool_opts_t *o);
/* Pool records are returned as JSON text (docs/libsbx.md shows the fields). */
SBX_API int sbx_pool_create(sbx_client_t *c, const sbx_pool_opts_t *opts, char **ret_json,
                            sbx_error_t *err);
SBX_API int sbx_pool_list(sbx_client_t *c, char **ret_json, sbx_error_t *err);
SBX_API int sbx_pool_inspect(sbx_client_t *c, const char *pool, char **ret_json, sbx_error_t *err);
SBX_API int sbx_pool_delete(sbx_client_t *c, const char *pool, sbx_error_t *err);

typedef struct {
    unsigned count; /* 0 means 1 */
    const sbx_kv_t *env;
    size_t n_env;
    int max_procs, max_mem_mb, idle_timeout_s; /* 0: the default */
} sbx_pool_sandbox_opts_t;

/* Sandboxes in a pool: *ret gets an array of *ret_n handles (free with
 * sbx_sandbox_list_free); *ret_rejected (may be NULL) how many could not be placed. When none
 * could, the call fails (-EAGAIN, the reason in err). */
SBX_API int sbx_pool_sandboxes_create(sbx_client_t *c, const char *pool,
                                      const sbx_pool_sandbox_opts_t *opts, sbx_sandbox_t ***ret,
                                      size_t *ret_n, size_t *ret_rejected, sbx_error_t *err);
SBX_API int sbx_pool_sandboxes_list(sbx_client_t *c, const char *pool, sbx_sandbox_t ***ret,
                                    size_t *ret_n, sbx_error_t *err);
SBX_API void sbx_sandbox_list_free(sbx_sandbox_t **list, size_t n);

/* ---- jobs, tokens --------------------------------------------------------------------------- */

/* labels: "k=v" or "k" selectors, all of which must match. JSON: the job array. */
SBX_API int sbx_jobs_list(sbx_client_t *c, const char *const *labels, size_t n_labels,
                          char **ret_json, sbx_error_t *err);
SBX_API int sbx_job_inspect(sbx_client_t *c, const char *id, char **ret_json, sbx_error_t *err);
/* action: "cancel", "pause", "resume" or "move" (node: the target for move, may be NULL). */
SBX_API int sbx_job_action(sbx_client_t *c, const char *id, const char *action, const char *node,
                           sbx_error_t *err);
/* role: "read", "write" or "admin"; ns may be "*". JSON: {"token","id"} (shown once). */
SBX_API int sbx_token_create(sbx_client_t *c, const char *principal, const char *ns,
                             const char *role, char **ret_json, sbx_error_t *err);
SBX_API int sbx_token_revoke(sbx_client_t *c, const char *id, sbx_error_t *err);

/* The registered nodes, their liveness and images (admin): JSON text. */
SBX_API int sbx_nodes_list(sbx_client_t *c, char **ret_json, sbx_error_t *err);

/* The reconnect token of a dedicated sandbox: HMAC-SHA256(api_token, "sbx-sandbox:" + nonce)
 * as 64 hex characters and a NUL. */
SBX_API int sbx_derive_token(const char *api_token, const char *nonce, char out[65]);

#ifdef __cplusplus
}
#endif
