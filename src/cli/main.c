/* SPDX-License-Identifier: MIT */
/* sbx: the command line client of the sbx platform, on libsbx. `sbx --help`; docs/cli.md. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const char usage_text[] =
    "usage: sbx [--namespace NS] COMMAND [ARGS]\n"
    "\n"
    "The local platform:\n"
    "  up [--state DIR] [--port P]     start sbx-control + sbx-node (loopback) and write "
    "$SBX_HOME\n"
    "  down [--state DIR]              stop them (the store is kept)\n"
    "  status [--state DIR]            are they running, and is the node live\n"
    "Sandboxes (ID: a dedicated sandbox's id, or POOL/ID for a pooled one):\n"
    "  create [--pool NAME] [--image I] [--flavor F] [-e K=V]...   make a sandbox, print its id\n"
    "  exec [-w DIR] [--timeout S] [-e K=V] [-i] [-c] ID -- CMD...  run a command, stream output\n"
    "  spawn [...same...] [--tag T] ID -- CMD...                    start a background process\n"
    "  ps ID | logs ID PROC [-f] | signal ID PROC [SIG] | stdin ID PROC [--close]\n"
    "  cp SRC ID:DST | cp ID:SRC DST   copy a file in or out\n"
    "  ls [--all] [--json]             list sandboxes\n"
    "  kill ID... | --all              kill sandboxes\n"
    "  proxy ID PORT                   the URL and headers that reach PORT in the sandbox\n"
    "Pools:\n"
    "  pool create NAME [--image I] [--flavor F] [--per-host N] [--warm N] [--max-hosts N]\n"
    "                   [--sandbox-idle S] [--host-idle S]\n"
    "  pool ls [--json] | pool inspect NAME | pool rm NAME\n"
    "Jobs and tokens:\n"
    "  jobs ls [--label K=V]... [--json] | jobs inspect ID | jobs cancel ID...|--label K=V\n"
    "  pause ID | resume ID | move ID [--node NODE]\n"
    "  token create --principal P [--namespace NS] [--role read|write|admin] | token revoke ID\n"
    "\n"
    "Every command takes --help. Configuration: $SBX_HOME (default ~/.sbx) holds endpoint,\n"
    "token and ca.crt (written by `sbx up`); SBX_TOKEN and SBX_NAMESPACE override.\n"
    "Exit codes: 0 ok, 1 refused or failed, 2 usage, 3 not found, 4 platform not reachable,\n"
    "5 permission denied, 6 timed out; exec: the command's code (124 timed out, 128+N signal N,\n"
    "125 could not run).\n";

int cli_usage(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("sbx: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs(" (see `sbx --help`)\n", stderr);
    return EXIT_USAGE;
}

int cli_fail(const sbx_error_t *e)
{
    fprintf(stderr, "sbx: %s\n", e->message[0] ? e->message : strerror(-e->code));
    switch (e->code) {
    case -ENOENT: return e->http_status ? EXIT_NOTFOUND : EXIT_UNREACHABLE;
    case -ECONNREFUSED:
    case -EHOSTUNREACH:
    case -ENETUNREACH: return e->http_status ? EXIT_FAIL : EXIT_UNREACHABLE;
    case -EPROTO: return e->http_status ? EXIT_FAIL : EXIT_UNREACHABLE;
    case -EACCES: return EXIT_DENIED;
    case -ETIMEDOUT: return EXIT_TIMEOUT;
    case -ESTALE: return EXIT_NOTFOUND;
    default: return EXIT_FAIL;
    }
}

int cli_client(const cli_t *cli, sbx_client_t **ret)
{
    sbx_config_t cfg = { .ns = cli->ns };
    sbx_error_t e = { 0 };
    if (sbx_client_new(&cfg, ret, &e) < 0)
        return cli_fail(&e);
    return 0;
}

static const struct {
    const char *name;
    int (*fn)(const cli_t *, int, char **);
} commands[] = {
    { "up", cmd_up },
    { "down", cmd_down },
    { "status", cmd_status },
    { "create", cmd_create },
    { "exec", cmd_exec },
    { "spawn", cmd_spawn },
    { "ps", cmd_ps },
    { "logs", cmd_logs },
    { "signal", cmd_signal },
    { "stdin", cmd_stdin },
    { "cp", cmd_cp },
    { "ls", cmd_ls },
    { "kill", cmd_kill },
    { "pool", cmd_pool },
    { "jobs", cmd_jobs },
    { "pause", cmd_lifecycle },
    { "resume", cmd_lifecycle },
    { "move", cmd_lifecycle },
    { "token", cmd_token },
    { "proxy", cmd_proxy },
};

int main(int argc, char **argv)
{
    cli_t cli = { .prog = argv[0] };
    int i = 1;
    while (i < argc && argv[i][0] == '-') {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(usage_text, stdout);
            return EXIT_OK;
        }
        if (strcmp(argv[i], "--version") == 0) {
            puts("sbx 0.1.0");
            return EXIT_OK;
        }
        if ((strcmp(argv[i], "--namespace") == 0 || strcmp(argv[i], "-n") == 0) && i + 1 < argc) {
            cli.ns = argv[i + 1];
            i += 2;
            continue;
        }
        if (strncmp(argv[i], "--namespace=", 12) == 0) {
            cli.ns = argv[i] + 12;
            i++;
            continue;
        }
        return cli_usage("unknown option %s", argv[i]);
    }
    if (i >= argc) {
        fputs(usage_text, stderr);
        return EXIT_USAGE;
    }
    if (strcmp(argv[i], "help") == 0) {
        fputs(usage_text, stdout);
        return EXIT_OK;
    }
    for (size_t k = 0; k < sizeof commands / sizeof commands[0]; k++)
        if (strcmp(argv[i], commands[k].name) == 0)
            return commands[k].fn(&cli, argc - i, argv + i);
    return cli_usage("unknown command %s", argv[i]);
}
