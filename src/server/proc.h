/* SPDX-License-Identifier: MIT */
/* Background processes: the p-<n> registry, bounded output log for re-attaching, streaming
 * stdin, signals with a grace period. */
#pragma once

#include "conn.h"
#include "spawn.h"

#define PROC_LOG_MAX (1024 * 1024) /* replay buffer per process */
#define PROC_MAX_FINISHED 256
#define PROC_MAX_RUNNING 1024

typedef struct server server_t;

/* Start spec as a background process and answer the request. */
void proc_start(conn_t *c, exec_spec_t *spec, bool from_exec);
size_t server_running_procs(const server_t *s);
void procs_kill_all(server_t *s);
/* A sandbox is being deleted: kill and forget its processes. */
void procs_drop_sandbox(server_t *s, sandbox_t *sb);
