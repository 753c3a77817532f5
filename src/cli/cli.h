/* SPDX-License-Identifier: MIT */
/* The `sbx` CLI: commands on libsbx (cmds.c) and the local platform (up.c). docs/cli.md. */
#pragma once

#include <stdbool.h>
#include <stdlib.h>

#include <jansson.h>

#include "sbx/sbx.h"

/* Exit codes (docs/cli.md). `sbx exec` exits with the command's own code instead; 124 when it
 * timed out, 128+N when a signal N ended it, 125 when it could not be run at all. */
enum {
    EXIT_OK = 0,
    EXIT_FAIL = 1,        /* the platform refused or failed (the message says why) */
    EXIT_USAGE = 2,       /* bad arguments */
    EXIT_NOTFOUND = 3,    /* no such sandbox, pool, job or token */
    EXIT_UNREACHABLE = 4, /* no platform configured or reachable: `sbx up` */
    EXIT_DENIED = 5,      /* the token was refused or lacks the role */
    EXIT_TIMEOUT = 6,     /* a wait ran out (a sandbox not running in time) */
    EXIT_EXEC_TIMEOUT = 124,
    EXIT_EXEC_CANNOT = 125,
};

typedef struct {
    const char *ns; /* --namespace, NULL: $SBX_NAMESPACE or "default" */
    const char *prog;
} cli_t;

#define MAX_KV 256

/* KEY=VALUE arguments (the strings are argv's, split in place). */
typedef struct {
    sbx_kv_t kv[MAX_KV];
    size_t n;
} kvs_t;
int kv_add(kvs_t *k, char *arg, const char *what);
/* A non-negative integer (digits only) up to max; seconds with an optional fraction. */
int parse_uint(const char *s, unsigned long max, unsigned long *ret);
int parse_secs(const char *s, double *ret);
void print_json(json_t *j);
int print_json_text(const char *text);
/* --help or -h before any "--"; help() prints text to stdout and returns 0. */
bool want_help(int argc, char **argv);
int help(const char *text);
/* Connect to sandbox id; on failure print and return the exit code (> 0). */
int open_sandbox(sbx_client_t *c, const char *id, sbx_sandbox_t **ret);
/* A client and sandbox id on it (both freed by the caller, CLI_AUTO); on failure print and
 * return the exit code (> 0). */
int cli_open(const cli_t *cli, const char *id, sbx_client_t **ret_c, sbx_sandbox_t **ret_s);
/* A job's stage changes while waiting, on a terminal's stderr. */
void progress_line(const char *stage, const char *message, void *ud);
/* Parse "[--json] [--flag]... ID [more...]" for the simple commands: flags with no values. */
typedef struct {
    bool json, all, follow, close;
    char *pos[8];
    int npos;
} simple_t;
int parse_simple(int argc, char **argv, simple_t *a, const char *allowed);
bool stage_ended(const char *stage);

/* Freed when the variable goes out of scope (every path of a command, early returns too):
 * `sbx_client_t *c CLI_AUTO(client) = NULL;`, CLI_AUTO(sandbox), CLI_AUTO(mem) (free). */
static inline void cli_auto_client(sbx_client_t **c) { sbx_client_free(*c); }
static inline void cli_auto_sandbox(sbx_sandbox_t **s) { sbx_sandbox_free(*s); }
static inline void cli_auto_mem(char **p) { free(*p); }
#define CLI_AUTO(kind) __attribute__((cleanup(cli_auto_##kind)))

/* Print "sbx: <message>" and return the exit code that matches the error. */
int cli_fail(const sbx_error_t *e);
int cli_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int cli_client(const cli_t *cli, sbx_client_t **ret);

int cmd_create(const cli_t *cli, int argc, char **argv);
int cmd_exec(const cli_t *cli, int argc, char **argv);
int cmd_spawn(const cli_t *cli, int argc, char **argv);
int cmd_ps(const cli_t *cli, int argc, char **argv);
int cmd_logs(const cli_t *cli, int argc, char **argv);
int cmd_signal(const cli_t *cli, int argc, char **argv);
int cmd_stdin(const cli_t *cli, int argc, char **argv);
int cmd_cp(const cli_t *cli, int argc, char **argv);
int cmd_ls(const cli_t *cli, int argc, char **argv);
int cmd_kill(const cli_t *cli, int argc, char **argv);
int cmd_pool(const cli_t *cli, int argc, char **argv);
int cmd_jobs(const cli_t *cli, int argc, char **argv);
int cmd_lifecycle(const cli_t *cli, int argc, char **argv); /* pause, resume, move */
int cmd_token(const cli_t *cli, int argc, char **argv);
int cmd_proxy(const cli_t *cli, int argc, char **argv);
int cmd_up(const cli_t *cli, int argc, char **argv);
int cmd_down(const cli_t *cli, int argc, char **argv);
int cmd_status(const cli_t *cli, int argc, char **argv);
