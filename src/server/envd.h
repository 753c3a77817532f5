/* SPDX-License-Identifier: MIT */
/* E2B's "envd" on sbx-server: the Connect protocol with its JSON codec (unary calls and server
 * streams of 5-byte envelopes), the process.Process and filesystem.Filesystem services, and the
 * /files upload and download routes (docs/e2b.md, "envd on the agent"). The services run on
 * the same code paths as our own routes: processes in proc.c's registry (spawned and confined
 * by spawn.c), files through fsops.c's descriptor-based walks. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/loop.h"
#include "fsops.h"
#include "http/conn.h"

typedef struct server server_t;

#define ENVD_MAX_MESSAGE (16u * 1024 * 1024) /* one request message (JSON) */
#define ENVD_ENVELOPE_HEADER 5
#define ENVD_FLAG_COMPRESSED 0x01
#define ENVD_FLAG_END_STREAM 0x02
#define ENVD_DEFAULT_KEEPALIVE_S 90        /* envd's default when the client names none */
#define ENVD_FILES_MAX (64u * 1024 * 1024) /* one POST /files body (collected), inflated too */

/* Connect's error codes; their names and HTTP statuses follow Connect's specification. */
typedef enum {
    CONNECT_CANCELED = 1,
    CONNECT_UNKNOWN,
    CONNECT_INVALID_ARGUMENT,
    CONNECT_DEADLINE_EXCEEDED,
    CONNECT_NOT_FOUND,
    CONNECT_ALREADY_EXISTS,
    CONNECT_PERMISSION_DENIED,
    CONNECT_RESOURCE_EXHAUSTED,
    CONNECT_FAILED_PRECONDITION,
    CONNECT_ABORTED,
    CONNECT_OUT_OF_RANGE,
    CONNECT_UNIMPLEMENTED,
    CONNECT_INTERNAL,
    CONNECT_UNAVAILABLE,
    CONNECT_DATA_LOSS,
    CONNECT_UNAUTHENTICATED,
} connect_code_t;

const char *connect_code_name(connect_code_t code);
int connect_code_status(connect_code_t code);
/* The code for a -errno of a file or process operation. */
connect_code_t connect_code_from_errno(int err);

/* One envelope at the start of p (n bytes): flags, then a big-endian 32-bit length, then that
 * many bytes. Returns the envelope's whole length when it is complete (payload at p + 5,
 * *ret_len bytes), 0 when more bytes are needed, -EMSGSIZE when the payload would exceed max.
 * Pure (fuzzed by the unit test's cases). */
ssize_t envd_envelope_parse(const char *p, size_t n, size_t max, uint8_t *ret_flags,
                            size_t *ret_len);
void envd_envelope_header(char out[ENVD_ENVELOPE_HEADER], uint8_t flags, uint32_t len);

/* One part of a multipart/form-data body (a view into it). */
typedef struct {
    char name[64];
    char filename[FS_PATH_MAX];
    bool has_name, has_filename;
    const char *data;
    size_t len;
} envd_part_t;
/* The boundary parameter of a Content-Type value: its length, or -EINVAL. */
int envd_multipart_boundary(sv_t ctype, char *out, size_t cap);
/* The part that starts at *pos (0: the first): 1 and *part (and *pos moved past it), 0 at the
 * close delimiter, -EINVAL when the body is not well-formed. Pure. */
int envd_multipart_next(const char *body, size_t len, const char *boundary, size_t *pos,
                        envd_part_t *part);

/* Routes of envd (matched on the path as the agent sees it, after a pool sandbox's prefix was
 * taken off): /process.Process/<M>, /filesystem.Filesystem/<M>, /files. */
bool envd_is_route(sv_t path);
/* An authenticated request on such a route (c->sb: the pool sandbox, NULL when dedicated). */
void envd_dispatch(conn_t *c, sv_t path);
/* The answer to a wrong or missing X-Access-Token: 401, as envd answers it. */
void envd_refuse(conn_t *c, sv_t path);

/* Listings in flight (the files API's, envd's ListDir), each from when it starts reading until
 * its answer is sent: it holds the names it keeps and up to several megabytes of answer. A
 * pooled sandbox has at most LISTINGS_PER_SANDBOX, the server LISTINGS_MAX (files.c). */
#define LISTINGS_PER_SANDBOX 2
#define LISTINGS_MAX 8
typedef struct {
    struct sandbox *sb; /* NULL: dedicated */
    struct server *srv;
    bool held;
} listing_slot_t;
/* false: none free (the caller answers 429) */
bool listing_slot_take(const conn_t *c, listing_slot_t *slot);
void listing_slot_give(listing_slot_t *slot);

/* ---- one RPC (shared by envd_process.c and envd_fs.c) ----------------------------------- */

typedef struct envd_call envd_call_t;
struct envd_call {
    conn_t *c;
    sv_t method;               /* "Start", "Stat", ... (a view of the request's path) */
    bool process;              /* process.Process (else filesystem.Filesystem) */
    bool stream;               /* application/connect+json */
    bool started;              /* the stream's 200 head is out */
    bool ended;                /* the end-stream envelope is out (or the unary answer) */
    const char *keepalive_msg; /* the method's keepalive message, for streams */
    timer_t_ keepalive_t, deadline_t;
    uint64_t keepalive_ms, timeout_ms; /* Connect-Timeout-Ms (0: none) */
    bool op_counted;
    /* the method's state and hooks (all may be NULL) */
    void *state;
    void (*on_drain)(envd_call_t *call);
    void (*on_deadline)(envd_call_t *call); /* default: end with deadline_exceeded */
    void (*on_close)(envd_call_t *call);    /* release state; the connection is going away */
    char *reply;                            /* a unary answer too big to go at once: streamed */
    size_t reply_len, reply_off;
    listing_slot_t listing; /* a ListDir's, until its answer is sent */
};

/* Unary: answer j (stolen) with 200. */
void envd_reply(envd_call_t *call, json_t *j);
/* Unary: an error; stream: the end-stream envelope with that error (HTTP 200). */
void envd_fail(envd_call_t *call, connect_code_t code, const char *fmt, ...) _printf_(3, 4);
/* Stream: one message (j stolen; the stream's head goes out first). < 0: connection gone. */
int envd_send(envd_call_t *call, json_t *j);
/* Stream: one message already encoded as JSON text. */
int envd_send_raw(envd_call_t *call, const char *json, size_t len);
/* Stream: the end-stream envelope without error. */
void envd_end(envd_call_t *call);

/* The root file operations of this request work against (files.c): the whole filesystem, or
 * the pool sandbox's home, resolved by descriptor beneath it. */
fs_root_t files_root(const conn_t *c);
/* Delete path as the files API does (files.c): a pooled sandbox's tree is renamed into the
 * trash and emptied by the janitor, off the loop. */
int files_delete(const conn_t *c, const char *path, bool recursive);

/* Services. */
void envd_process_call(envd_call_t *call, sv_t method, json_t *req);
bool envd_process_streams(sv_t method, bool *ret_known);
void envd_fs_call(envd_call_t *call, sv_t method, json_t *req);
bool envd_fs_streams(sv_t method, bool *ret_known);
/* A /files request carrying E2B's presigned-URL signature made with token (docs/e2b.md). */
bool envd_files_signed(const conn_t *c, const char *token, uint64_t now_s);
void envd_files_get(conn_t *c);
void envd_files_post(conn_t *c);
/* EntryInfo of a stat (name and path as the client sees them); NULL if not UTF-8. */
json_t *envd_entry_json(const char *name, const char *path, const struct stat *st);

/* Directory watches (inotify): WatchDir's stream, and the polled watchers, which the server
 * keeps (server_t.envd_watches) until removed, their sandbox deleted, or the server ends. */
typedef struct envd_watch envd_watch_t;
typedef struct sandbox sandbox_t;
void envd_watch_dir(envd_call_t *call, json_t *req);
void envd_create_watcher(envd_call_t *call, json_t *req);
void envd_get_watcher_events(envd_call_t *call, json_t *req);
void envd_remove_watcher(envd_call_t *call, json_t *req);
void envd_watches_free(server_t *s);
/* A deleted sandbox's watches: its polled watchers freed, its streams ended (their inotify
 * instances closed now). */
void envd_watches_drop(server_t *s, const sandbox_t *sb);
