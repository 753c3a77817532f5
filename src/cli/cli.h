/* SPDX-License-Identifier: MIT */
/* The `sbx` CLI: commands on libsbx (cmds.c) and the local platform (up.c). docs/cli.md. */
#pragma once

#include <stdbool.h>

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
