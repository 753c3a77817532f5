/* SPDX-License-Identifier: MIT */
/* Route handlers of sbx-server. Each answers through the conn_* response API. */
#pragma once

#include "http/conn.h"

typedef struct {
    sv_t id;   /* {id} of /v1/processes/{id} */
    sv_t rest; /* what follows /v1/proxy/{port} (starts with '/' or is empty) */
    uint16_t port;
} route_params_t;

typedef void (*route_fn)(conn_t *c, const route_params_t *p);

void route_health(conn_t *c, const route_params_t *p);
void route_exec(conn_t *c, const route_params_t *p);
void route_proc_create(conn_t *c, const route_params_t *p);
void route_proc_list(conn_t *c, const route_params_t *p);
void route_proc_get(conn_t *c, const route_params_t *p);
void route_proc_delete(conn_t *c, const route_params_t *p);
void route_proc_signal(conn_t *c, const route_params_t *p);
void route_proc_stdin(conn_t *c, const route_params_t *p);
void route_proc_output(conn_t *c, const route_params_t *p);
void route_files_read(conn_t *c, const route_params_t *p);
void route_files_write(conn_t *c, const route_params_t *p);
void route_files_list(conn_t *c, const route_params_t *p);
void route_files_stat(conn_t *c, const route_params_t *p);
void route_files_delete(conn_t *c, const route_params_t *p);
void route_files_mkdir(conn_t *c, const route_params_t *p);
void route_files_rename(conn_t *c, const route_params_t *p);
void route_proxy(conn_t *c, const route_params_t *p);

/* Helpers shared by handlers. */
/* Collect a JSON object body (max bytes) and call done(c, obj) with it (borrowed). */
typedef void (*json_body_fn)(conn_t *c, json_t *obj);
void route_with_json_body(conn_t *c, size_t max, json_body_fn done);
/* Decoded query parameter into a NUL-terminated string; false if absent. -EINVAL when bad. */
int query_param(const conn_t *c, const char *name, char *out, size_t outcap);
/* Parse an optional boolean query parameter ("true/false/1/0"). */
int query_bool(const conn_t *c, const char *name, bool def, bool *ret);
int query_u64(const conn_t *c, const char *name, uint64_t max, bool *ret_present, uint64_t *ret);
