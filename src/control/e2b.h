/* SPDX-License-Identifier: MIT */
/* E2B compatibility inside sbx-control, shared by its three parts: e2b.c (E2B's control API),
 * e2bpool.c (templates that are pools: pooled sandboxes behind that API) and e2bproxy.c (a
 * sandbox's traffic, envd's and its ports', as E2B's SDKs address it). docs/e2b.md. */
#pragma once

#include "control.h"

#define E2B_ENVD_VERSION "0.5.7"
#define E2B_DEFAULT_TIMEOUT_S 300

/* What the list and detail shapes say of a sandbox. */
typedef struct {
    const char *id, *tpl, *state; /* state: running | paused | killed */
    int64_t started_ms, end_ms;
    json_int_t cpus, memory_mb, disk_mb;
    bool internet;
} e2b_listed_t;

/* The Sandbox shape create, connect and resume answer (with its tokens when token is given). */
json_t *e2b_sandbox_json(const control_t *ctl, const char *id, const char *tpl, const char *token);
/* ListedSandbox / SandboxDetail; steals meta (the sandbox's metadata, may be NULL). */
json_t *e2b_listed_json(const control_t *ctl, const e2b_listed_t *l, json_t *meta, bool detail);
/* Whether a sandbox in state (NULL: none any more) with metadata passes the v2 list's filters:
 * meta "k=v&k2=v2" (URL-encoded), states "running,paused" ("" any). */
bool e2b_list_match(const char *state, json_t *metadata, const char *meta, const char *states);
/* A worker's answer in E2B's error shape, {"code": status, "message"}. */
/* A sandbox's traffic token (trafficAccessToken): reaches its ports, not its agent. Derived
 * from its access token (BLAKE2b), so nothing more is stored. */
#define E2B_TRAFFIC_TOKEN_HEX 64
void e2b_traffic_token(const char *token, char out[E2B_TRAFFIC_TOKEN_HEX + 1]);

/* ---- e2bpool.c: templates that are pools -----------------------------------------------------
 * A templateID that names a pool of the caller's namespace makes a pooled sandbox in it (a
 * pool's name wins over an image of the same name). Its id is the pooled sandbox's (16 hex
 * digits; a dedicated sandbox's is 24), indexed at e2bpool/<id> -> {ns, pool, metadata,
 * created_ms, timeout}. */
bool e2b_pooled_id(const char *id);
/* 1 when ns has a pool named name, 0 when not, -errno when the store cannot be read. */
int e2b_pool_exists(store_t *st, const char *ns, const char *name);
/* On a worker: one sandbox of pool for the create body b (metadata, envVars, timeout: its idle
 * timeout); answers 201 with the Sandbox, or E2B's error. */
void e2b_pool_create(worker_t *w, const char *ns, const char *pool, json_t *b, work_result_t *res);
/* Append ns's pooled sandboxes with ids after `after` that pass the filters to out (listed
 * shape); 0 or -errno. */
int e2b_pool_list(control_t *ctl, const char *ns, const char *after, const char *meta,
                  const char *states, json_t *out);
/* GET /sandboxes/{id} of a pooled sandbox (the loop thread; answers itself). */
void e2b_pool_detail(control_t *ctl, conn_t *c, const char *ns, const char *id);
/* Worker tasks on a pooled sandbox: kill (204), connect (200 with the Sandbox). */
typedef struct {
    char ns[64], id[32];
} e2b_pool_arg_t;
void e2b_pool_kill_fn(worker_t *w, void *arg, work_result_t *res);
void e2b_pool_connect_fn(worker_t *w, void *arg, work_result_t *res);
/* Where a pooled sandbox's traffic goes: its namespace, its host's job and run generation, and
 * its token (0); -ESRCH when it is not running (none, gone, another namespace's index record
 * missing); another -errno when the store cannot be read. */
typedef struct {
    char ns[64], host[32];
    uint64_t generation;
    char token[128];
} e2b_pool_target_t;
int e2b_pool_target(store_t *st, const seal_keys_t *seal, const char *id, e2b_pool_target_t *ret);
