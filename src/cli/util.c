/* SPDX-License-Identifier: MIT */
/* Helpers every sbx command uses: argument parsing, JSON printing, --help, opening a sandbox. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

int kv_add(kvs_t *k, char *arg, const char *what)
{
    char *eq = strchr(arg, '=');
    if (!eq || eq == arg)
        return cli_usage("%s %s: expected KEY=VALUE", what, arg);
    if (k->n >= MAX_KV)
        return cli_usage("at most %d %s entries", MAX_KV, what);
    *eq = 0;
    k->kv[k->n++] = (sbx_kv_t){ arg, eq + 1 };
    return 0;
}

/* A non-negative integer (digits only) up to max. */
int parse_uint(const char *s, unsigned long max, unsigned long *ret)
{
    unsigned long v = 0;
    if (!*s)
        return -EINVAL;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > (max - (unsigned long)(*s - '0')) / 10)
            return -EINVAL;
        v = v * 10 + (unsigned long)(*s - '0');
    }
    *ret = v;
    return 0;
}

/* Seconds with an optional fraction ("2", "0.5"). */
int parse_secs(const char *s, double *ret)
{
    double v = 0, scale = 0;
    if (!*s)
        return -EINVAL;
    for (; *s; s++) {
        if (*s == '.' && scale == 0) {
            scale = 1;
            continue;
        }
        if (*s < '0' || *s > '9' || v > 1e9)
            return -EINVAL;
        if (scale > 0) {
            scale /= 10;
            v += (*s - '0') * scale;
        } else {
            v = v * 10 + (*s - '0');
        }
    }
    *ret = v;
    return 0;
}

void print_json(json_t *j)
{
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (s) {
        puts(s);
        free(s);
    }
}

int print_json_text(const char *text)
{
    json_t *j = json_loads(text, 0, NULL);
    if (!j) {
        puts(text);
        return EXIT_OK;
    }
    print_json(j);
    json_decref(j);
    return EXIT_OK;
}

bool want_help(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--") == 0)
            return false;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return true;
    }
    return false;
}

int help(const char *text)
{
    fputs(text, stdout);
    return EXIT_OK;
}

/* Connect to sandbox id; on failure print and return the exit code (> 0). */
int open_sandbox(sbx_client_t *c, const char *id, sbx_sandbox_t **ret)
{
    sbx_error_t e = { 0 };
    return sbx_sandbox_connect(c, id, ret, &e) < 0 ? cli_fail(&e) : 0;
}

void progress_line(const char *stage, const char *message, void *ud)
{
    (void)ud;
    if (isatty(STDERR_FILENO))
        fprintf(stderr, "sbx: waiting: %s%s%s\n", stage, *message ? ": " : "", message);
}

int parse_simple(int argc, char **argv, simple_t *a, const char *allowed)
{
    static const struct option lo[] = { { "json", no_argument, 0, 'j' },
                                        { "all", no_argument, 0, 'a' },
                                        { "follow", no_argument, 0, 'f' },
                                        { "close", no_argument, 0, 'C' },
                                        { 0, 0, 0, 0 } };
    int o;
    optind = 0;
    while ((o = getopt_long(argc, argv, "f", lo, NULL)) != -1) {
        if (o == '?' || !strchr(allowed, o))
            return cli_usage("%s: unknown option", argv[0]);
        a->json |= o == 'j';
        a->all |= o == 'a';
        a->follow |= o == 'f';
        a->close |= o == 'C';
    }
    for (; optind < argc; optind++) {
        if (a->npos >= 8)
            return cli_usage("%s: too many arguments", argv[0]);
        a->pos[a->npos++] = argv[optind];
    }
    return 0;
}

bool stage_ended(const char *stage)
{
    return stage && (strcmp(stage, "CANCELED") == 0 || strcmp(stage, "COMPLETED") == 0 ||
                     strcmp(stage, "ERROR") == 0);
}

int cli_open(const cli_t *cli, const char *id, sbx_client_t **ret_c, sbx_sandbox_t **ret_s)
{
    int r = cli_client(cli, ret_c);
    return r ? r : open_sandbox(*ret_c, id, ret_s);
}
