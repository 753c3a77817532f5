/* SPDX-License-Identifier: MIT */
/* sbx commands for pools, jobs, the lifecycle of dedicated sandboxes, and tokens. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

/* ---- pools ----------------------------------------------------------------------------------- */

static const char pool_help[] =
    "usage: sbx pool create NAME [--image I] [--flavor F] [--per-host N] [--warm N]\n"
    "                        [--max-hosts N] [--sandbox-idle S] [--host-idle S]\n"
    "       sbx pool ls [--json]\n"
    "       sbx pool inspect NAME      (JSON: hosts, slots, sandboxes)\n"
    "       sbx pool rm NAME           (drains: every sandbox deleted, every host stopped)\n"
    "Sandboxes in a pool: `sbx create --pool NAME [--count N]`, addressed as NAME/ID.\n";

static int pool_create(sbx_client_t *c, int argc, char **argv)
{
    static const struct option lo[] = { { "image", required_argument, 0, 'I' },
                                        { "flavor", required_argument, 0, 'f' },
                                        { "per-host", required_argument, 0, 'p' },
                                        { "warm", required_argument, 0, 'w' },
                                        { "max-hosts", required_argument, 0, 'm' },
                                        { "sandbox-idle", required_argument, 0, 's' },
                                        { "host-idle", required_argument, 0, 'h' },
                                        { "json", no_argument, 0, 'j' },
                                        { 0, 0, 0, 0 } };
    sbx_pool_opts_t po;
    sbx_pool_opts_init(&po);
    bool json = false;
    int o;
    optind = 0;
    while ((o = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        unsigned long v = 0;
        if (o == 'j') {
            json = true;
            continue;
        }
        if (o == 'I' || o == 'f') {
            *(o == 'I' ? &po.image : &po.flavor) = optarg;
            continue;
        }
        if (o == '?' || parse_uint(optarg, 1000000, &v) < 0)
            return o == '?' ? EXIT_USAGE : cli_usage("pool create: %s is not a number", optarg);
        int *dst = o == 'p'   ? &po.per_host
                   : o == 'w' ? &po.warm
                   : o == 'm' ? &po.max_hosts
                   : o == 's' ? &po.sandbox_idle_s
                              : &po.host_idle_s;
        *dst = (int)v;
    }
    if (optind != argc - 1)
        return cli_usage("pool create: one NAME expected");
    po.name = argv[optind];
    char *text;
    sbx_error_t e = { 0 };
    if (sbx_pool_create(c, &po, &text, &e) < 0)
        return cli_fail(&e);
    if (json)
        print_json_text(text);
    else
        puts(po.name);
    sbx_free(text);
    return EXIT_OK;
}

static int pool_ls(sbx_client_t *c, bool json)
{
    char *text;
    sbx_error_t e = { 0 };
    if (sbx_pool_list(c, &text, &e) < 0)
        return cli_fail(&e);
    json_t *j = json_loads(text, 0, NULL);
    sbx_free(text);
    json_t *pools = json_object_get(j, "pools");
    if (json) {
        print_json(pools ? pools : j);
    } else {
        printf("%-24s %-12s %-10s %-9s %-5s %-9s %s\n", "NAME", "IMAGE", "FLAVOR", "PER_HOST",
               "WARM", "MAX_HOSTS", "STATE");
        size_t i;
        json_t *p;
        json_array_foreach(pools, i, p) {
            printf("%-24s %-12s %-10s %-9lld %-5lld %-9lld %s\n",
                   json_string_value(json_object_get(p, "name")),
                   json_string_value(json_object_get(p, "image")),
                   json_string_value(json_object_get(p, "flavor")),
                   (long long)json_integer_value(json_object_get(p, "per_host")),
                   (long long)json_integer_value(json_object_get(p, "warm")),
                   (long long)json_integer_value(json_object_get(p, "max_hosts")),
                   json_string_value(json_object_get(p, "state")));
        }
    }
    json_decref(j);
    return EXIT_OK;
}

int cmd_pool(const cli_t *cli, int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)
        return argc < 2 ? (fputs(pool_help, stderr), EXIT_USAGE) : help(pool_help);
    if (want_help(argc, argv))
        return help(pool_help);
    const char *sub = argv[1];
    if (strcmp(sub, "create") && strcmp(sub, "ls") && strcmp(sub, "inspect") && strcmp(sub, "rm"))
        return cli_usage("pool: unknown subcommand %s", sub);
    simple_t a = { 0 };
    int r = 0;
    if (strcmp(sub, "create") != 0 && (r = parse_simple(argc - 1, argv + 1, &a, "j")))
        return r;
    if ((strcmp(sub, "inspect") == 0 || strcmp(sub, "rm") == 0) && a.npos != 1)
        return cli_usage("pool %s: one NAME expected", sub);
    if (strcmp(sub, "ls") == 0 && a.npos)
        return cli_usage("pool ls: unexpected argument %s", a.pos[0]);
    sbx_client_t *c CLI_AUTO(client) = NULL;
    if ((r = cli_client(cli, &c)))
        return r;
    sbx_error_t e = { 0 };
    char *text;
    if (strcmp(sub, "create") == 0) {
        r = pool_create(c, argc - 1, argv + 1);
    } else if (strcmp(sub, "ls") == 0) {
        r = pool_ls(c, a.json);
    } else if (strcmp(sub, "inspect") == 0) {
        r = sbx_pool_inspect(c, a.pos[0], &text, &e) < 0 ? cli_fail(&e) : print_json_text(text);
        if (r == EXIT_OK)
            sbx_free(text);
    } else {
        r = sbx_pool_delete(c, a.pos[0], &e) < 0 ? cli_fail(&e) : EXIT_OK;
        if (r == EXIT_OK)
            printf("%s draining\n", a.pos[0]);
    }
    return r;
}

/* ---- jobs, lifecycle, tokens ------------------------------------------------------------------ */

static const char jobs_help[] =
    "usage: sbx jobs ls [--label K=V]... [--json]\n"
    "       sbx jobs inspect ID\n"
    "       sbx jobs cancel ID... | sbx jobs cancel --label K=V...\n"
    "Jobs of the namespace (every sandbox and pool host is one). A label selector is K=V or K.\n";

int cmd_jobs(const cli_t *cli, int argc, char **argv)
{
    if (argc < 2)
        return fputs(jobs_help, stderr), EXIT_USAGE;
    if (want_help(argc, argv))
        return help(jobs_help);
    const char *sub = argv[1];
    if (strcmp(sub, "ls") && strcmp(sub, "inspect") && strcmp(sub, "cancel"))
        return cli_usage("jobs: unknown subcommand %s", sub);
    static const struct option lo[] = { { "label", required_argument, 0, 'l' },
                                        { "json", no_argument, 0, 'j' },
                                        { 0, 0, 0, 0 } };
    const char *labels[64];
    size_t nl = 0;
    bool json = false;
    int o, r;
    optind = 0;
    while ((o = getopt_long(argc - 1, argv + 1, "", lo, NULL)) != -1) {
        if (o == 'l' && nl < 64)
            labels[nl++] = optarg;
        else if (o == 'j')
            json = true;
        else
            return EXIT_USAGE;
    }
    char **pos = argv + 1 + optind;
    int npos = argc - 1 - optind;
    if (strcmp(sub, "inspect") == 0 && npos != 1)
        return cli_usage("jobs inspect: one ID expected");
    if (strcmp(sub, "cancel") == 0 && (npos > 0) == (nl > 0))
        return cli_usage("jobs cancel: give ids or --label selectors");
    sbx_client_t *c CLI_AUTO(client) = NULL;
    if ((r = cli_client(cli, &c)))
        return r;
    sbx_error_t e = { 0 };
    char *text = NULL;
    r = EXIT_OK;
    if (strcmp(sub, "inspect") == 0) {
        r = sbx_job_inspect(c, pos[0], &text, &e) < 0 ? cli_fail(&e) : print_json_text(text);
    } else if (strcmp(sub, "ls") == 0 || nl > 0) {
        if (sbx_jobs_list(c, labels, nl, &text, &e) < 0) {
            r = cli_fail(&e);
        } else {
            json_t *jobs = json_loads(text, 0, NULL);
            size_t i;
            json_t *j;
            if (strcmp(sub, "ls") == 0 && json) {
                print_json(jobs);
            } else if (strcmp(sub, "ls") == 0) {
                printf("%-26s %-10s %-10s %s\n", "ID", "STAGE", "MODE", "MESSAGE");
                json_array_foreach(jobs, i, j) {
                    const char *mode = json_string_value(json_object_get(j, "mode"));
                    printf("%-26s %-10s %-10s %s\n", json_string_value(json_object_get(j, "id")),
                           json_string_value(json_object_get(j, "stage")), mode ? mode : "",
                           json_string_value(json_object_get(j, "message")));
                }
            } else {
                json_array_foreach(jobs, i, j) {
                    const char *id = json_string_value(json_object_get(j, "id"));
                    if (stage_ended(json_string_value(json_object_get(j, "stage"))))
                        continue;
                    if (sbx_job_action(c, id, "cancel", NULL, &e) < 0)
                        r = cli_fail(&e);
                    else
                        puts(id);
                }
            }
            json_decref(jobs);
        }
    } else {
        for (int i = 0; i < npos; i++) {
            if (sbx_job_action(c, pos[i], "cancel", NULL, &e) < 0)
                r = cli_fail(&e);
            else
                puts(pos[i]);
        }
    }
    sbx_free(text);
    return r;
}

static const char lifecycle_help[] =
    "usage: sbx pause ID | sbx resume ID [--wait S] | sbx move ID [--node NODE] [--wait S]\n"
    "Pause a dedicated sandbox (its files kept), resume it (a new generation), or move it to\n"
    "another node. resume and move wait until it runs again (--wait 0: do not wait).\n";

static json_t *job_json(sbx_client_t *c, const char *id, sbx_error_t *e)
{
    char *text;
    if (sbx_job_inspect(c, id, &text, e) < 0)
        return NULL;
    json_t *j = json_loads(text, 0, NULL);
    sbx_free(text);
    return j;
}

/* After resume or move: wait until the job runs a generation newer than g0 (until then it may
 * still read RUNNING, the old generation's). Exit code. */
static int wait_generation(sbx_client_t *c, const char *id, json_int_t g0, unsigned wait_s)
{
    char last[300] = "";
    for (unsigned waited = 0;; waited += 100) {
        sbx_error_t e = { 0 };
        json_t *j = job_json(c, id, &e);
        if (!j)
            return cli_fail(&e);
        json_t *run = json_object_get(j, "run");
        const char *stage = json_string_value(json_object_get(j, "stage"));
        const char *msg = json_string_value(json_object_get(j, "message"));
        const char *state = json_string_value(json_object_get(run, "state"));
        json_int_t g = json_integer_value(json_object_get(run, "generation"));
        char now[300];
        (void)snprintf(now, sizeof now, "%s %s", stage ? stage : "?", msg ? msg : "");
        if (strcmp(now, last) != 0) {
            progress_line(stage ? stage : "?", msg ? msg : "", NULL);
            memcpy(last, now, sizeof now);
        }
        bool done = stage && strcmp(stage, "RUNNING") == 0 && state &&
                    strcmp(state, "running") == 0 && g > g0;
        bool ended = stage_ended(stage);
        json_decref(j);
        if (done)
            return EXIT_OK;
        if (ended) {
            fprintf(stderr, "sbx: %s will not run: %s (`sbx jobs inspect %s`)\n", id, now, id);
            return EXIT_FAIL;
        }
        if (waited >= wait_s * 1000u) {
            fprintf(stderr, "sbx: %s is not running a new generation after %u s (%s)\n", id, wait_s,
                    now);
            return EXIT_TIMEOUT;
        }
        usleep(100 * 1000);
    }
}

int cmd_lifecycle(const cli_t *cli, int argc, char **argv)
{
    if (want_help(argc, argv))
        return help(lifecycle_help);
    static const struct option lo[] = { { "node", required_argument, 0, 'N' },
                                        { "wait", required_argument, 0, 'w' },
                                        { 0, 0, 0, 0 } };
    const char *node = NULL;
    unsigned long wait_s = 120;
    int o, r;
    optind = 0;
    while ((o = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        if (o == 'N' && strcmp(argv[0], "move") == 0)
            node = optarg;
        else if (o == 'w' && parse_uint(optarg, 86400, &wait_s) == 0)
            continue;
        else
            return cli_usage("%s: bad option", argv[0]);
    }
    if (optind != argc - 1)
        return cli_usage("%s: one ID expected", argv[0]);
    const char *id = argv[optind];
    sbx_client_t *c CLI_AUTO(client) = NULL;
    if ((r = cli_client(cli, &c)))
        return r;
    sbx_error_t e = { 0 };
    json_t *before = job_json(c, id, &e);
    if (!before)
        return cli_fail(&e);
    json_int_t g0 =
        json_integer_value(json_object_get(json_object_get(before, "run"), "generation"));
    json_decref(before);
    r = sbx_job_action(c, id, argv[0], node, &e) < 0 ? cli_fail(&e) : EXIT_OK;
    if (r == EXIT_OK && strcmp(argv[0], "pause") != 0 && wait_s > 0)
        r = wait_generation(c, id, g0, (unsigned)wait_s);
    if (r == EXIT_OK)
        puts(id);
    return r;
}

static const char token_help[] =
    "usage: sbx token create --principal P [--namespace NS] [--role read|write|admin] [--json]\n"
    "       sbx token revoke ID\n"
    "create prints the new token (shown once) and its id; revoke takes the id (t-...).\n";

int cmd_token(const cli_t *cli, int argc, char **argv)
{
    if (argc < 2)
        return fputs(token_help, stderr), EXIT_USAGE;
    if (want_help(argc, argv))
        return help(token_help);
    const char *sub = argv[1];
    int r;
    if (strcmp(sub, "create") == 0) {
        static const struct option lo[] = { { "principal", required_argument, 0, 'p' },
                                            { "namespace", required_argument, 0, 'n' },
                                            { "role", required_argument, 0, 'r' },
                                            { "json", no_argument, 0, 'j' },
                                            { 0, 0, 0, 0 } };
        const char *principal = NULL, *ns = cli->ns ? cli->ns : "default", *role = "write";
        bool json = false;
        int o;
        optind = 0;
        while ((o = getopt_long(argc - 1, argv + 1, "", lo, NULL)) != -1) {
            if (o == 'p')
                principal = optarg;
            else if (o == 'n')
                ns = optarg;
            else if (o == 'r')
                role = optarg;
            else if (o == 'j')
                json = true;
            else
                return EXIT_USAGE;
        }
        if (!principal || optind != argc - 1)
            return cli_usage("token create: --principal P expected");
        sbx_client_t *c CLI_AUTO(client) = NULL;
        if ((r = cli_client(cli, &c)))
            return r;
        char *text;
        sbx_error_t e = { 0 };
        if (sbx_token_create(c, principal, ns, role, &text, &e) < 0) {
            r = cli_fail(&e);
        } else {
            json_t *j = json_loads(text, 0, NULL);
            if (json)
                print_json(j);
            else
                printf("%s\nid %s\n", json_string_value(json_object_get(j, "token")),
                       json_string_value(json_object_get(j, "id")));
            json_decref(j);
            sbx_free(text);
        }
        return r;
    }
    if (strcmp(sub, "revoke") == 0) {
        if (argc != 3)
            return cli_usage("token revoke: one ID expected");
        sbx_client_t *c CLI_AUTO(client) = NULL;
        if ((r = cli_client(cli, &c)))
            return r;
        sbx_error_t e = { 0 };
        r = sbx_token_revoke(c, argv[2], &e) < 0 ? cli_fail(&e) : EXIT_OK;
        return r;
    }
    return cli_usage("token: unknown subcommand %s", sub);
}
