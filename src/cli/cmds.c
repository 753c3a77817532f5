/* SPDX-License-Identifier: MIT */
/* sbx commands on libsbx for sandboxes: create, exec, processes, files, ls, kill, proxy. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

#define STDIN_MAX (64u * 1024 * 1024)

/* ---- create --------------------------------------------------------------------------------- */

static const char create_help[] =
    "usage: sbx create [--pool NAME [--count N]] [--image I] [--flavor F] [-e K=V]...\n"
    "                  [--secret K=V]... [--label K=V]... [--idle-timeout S] [--wait S] [--json]\n"
    "Make a sandbox and print its id: a dedicated one (a job of its own; waits until it runs)\n"
    "or, with --pool, COUNT sandboxes in that pool (printed as POOL/ID). --image, --flavor,\n"
    "--secret and --label apply to dedicated sandboxes only.\n";

/* COUNT sandboxes in a pool, one POOL/ID a line (or JSON). */
static int create_pooled(sbx_client_t *c, const char *pool, unsigned count, const kvs_t *env,
                         int idle, bool json)
{
    sbx_pool_sandbox_opts_t po = {
        .count = count, .env = env->kv, .n_env = env->n, .idle_timeout_s = idle
    };
    sbx_sandbox_t **list;
    size_t n, rejected = 0;
    sbx_error_t e = { 0 };
    if (isatty(STDERR_FILENO))
        fprintf(stderr, "sbx: placing %u sandbox%s in pool %s (a host may have to start)\n", count,
                count == 1 ? "" : "es", pool);
    if (sbx_pool_sandboxes_create(c, pool, &po, &list, &n, &rejected, &e) < 0)
        return cli_fail(&e);
    json_t *arr = json ? json_array() : NULL;
    for (size_t i = 0; i < n; i++) {
        if (arr)
            json_array_append_new(arr, json_string(sbx_sandbox_id(list[i])));
        else
            puts(sbx_sandbox_id(list[i]));
    }
    if (arr) {
        json_t *out = json_pack("{s:o,s:I}", "sandboxes", arr, "rejected", (json_int_t)rejected);
        print_json(out);
        json_decref(out);
    }
    if (rejected)
        fprintf(stderr, "sbx: %zu of %u could not be placed (the pool is at max_hosts)\n", rejected,
                count);
    sbx_sandbox_list_free(list, n);
    return rejected ? EXIT_FAIL : EXIT_OK;
}

int cmd_create(const cli_t *cli, int argc, char **argv)
{
    if (want_help(argc, argv))
        return help(create_help);
    static const struct option lo[] = { { "pool", required_argument, 0, 'p' },
                                        { "image", required_argument, 0, 'I' },
                                        { "flavor", required_argument, 0, 'f' },
                                        { "env", required_argument, 0, 'e' },
                                        { "secret", required_argument, 0, 's' },
                                        { "label", required_argument, 0, 'l' },
                                        { "idle-timeout", required_argument, 0, 't' },
                                        { "count", required_argument, 0, 'n' },
                                        { "wait", required_argument, 0, 'w' },
                                        { "json", no_argument, 0, 'j' },
                                        { 0, 0, 0, 0 } };
    const char *pool = NULL, *image = NULL, *flavor = NULL;
    static kvs_t env, secrets, labels;
    unsigned long idle = 0, count = 1, wait_s = 120;
    bool json = false;
    int o, r;
    optind = 0;
    while ((o = getopt_long(argc, argv, "+e:", lo, NULL)) != -1) {
        switch (o) {
        case 'p': pool = optarg; break;
        case 'I': image = optarg; break;
        case 'f': flavor = optarg; break;
        case 'e':
            if ((r = kv_add(&env, optarg, "env")))
                return r;
            break;
        case 's':
            if ((r = kv_add(&secrets, optarg, "secret")))
                return r;
            break;
        case 'l':
            if ((r = kv_add(&labels, optarg, "label")))
                return r;
            break;
        case 't':
            if (parse_uint(optarg, 31536000, &idle) < 0)
                return cli_usage("--idle-timeout %s: seconds expected", optarg);
            break;
        case 'n':
            if (parse_uint(optarg, 1000, &count) < 0 || count == 0)
                return cli_usage("--count %s: 1..1000 expected", optarg);
            break;
        case 'w':
            if (parse_uint(optarg, 86400, &wait_s) < 0)
                return cli_usage("--wait %s: seconds expected", optarg);
            break;
        case 'j': json = true; break;
        default: return EXIT_USAGE;
        }
    }
    if (optind != argc)
        return cli_usage("create: unexpected argument %s", argv[optind]);
    sbx_client_t *c CLI_AUTO(client) = NULL;
    if ((r = cli_client(cli, &c)))
        return r;
    if (pool) {
        if (image || flavor || secrets.n || labels.n)
            fprintf(stderr, "sbx: --image, --flavor, --secret and --label belong to the pool; "
                            "ignored for pooled sandboxes\n");
        return create_pooled(c, pool, (unsigned)count, &env, (int)idle, json);
    }
    sbx_error_t e = { 0 };
    if (count != 1)
        return cli_usage("--count needs --pool (a dedicated sandbox is one job)");
    sbx_create_opts_t co = { .image = image,
                             .flavor = flavor,
                             .env = env.kv,
                             .n_env = env.n,
                             .secrets = secrets.kv,
                             .n_secrets = secrets.n,
                             .labels = labels.kv,
                             .n_labels = labels.n,
                             .idle_timeout_s = (unsigned)idle,
                             .wait_ms = (int)(wait_s * 1000),
                             .on_progress = progress_line };
    sbx_sandbox_t *s CLI_AUTO(sandbox) = NULL;
    r = sbx_sandbox_create(c, &co, &s, &e);
    if (r < 0) {
        r = cli_fail(&e);
    } else {
        if (json)
            printf("{\"id\": \"%s\"}\n", sbx_sandbox_id(s));
        else
            puts(sbx_sandbox_id(s));
        r = EXIT_OK;
    }
    return r;
}

/* ---- exec and spawn ------------------------------------------------------------------------- */

static void out_stdout(const void *d, size_t n, void *ud)
{
    (void)ud;
    (void)fwrite(d, 1, n, stdout);
    (void)fflush(stdout);
}

static void out_stderr(const void *d, size_t n, void *ud)
{
    (void)ud;
    (void)fwrite(d, 1, n, stderr);
}

static int read_all_stdin(char **ret, size_t *ret_len)
{
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap);
    if (!buf)
        return -ENOMEM;
    for (;;) {
        if (len == cap) {
            if (cap >= STDIN_MAX) {
                free(buf);
                return -EFBIG;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                return -ENOMEM;
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t n = read(STDIN_FILENO, buf + len, cap - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            free(buf);
            return -errno;
        }
        if (n == 0)
            break;
        len += (size_t)n;
    }
    *ret = buf;
    *ret_len = len;
    return 0;
}

typedef struct {
    const char *cwd, *tag;
    double timeout;
    bool in, shell;
    kvs_t env;
    const char *id;
    char **cmd;
    char *joined;
} run_args_t;

static int parse_run(int argc, char **argv, run_args_t *a, bool spawn)
{
    static const struct option lo[] = { { "workdir", required_argument, 0, 'w' },
                                        { "timeout", required_argument, 0, 't' },
                                        { "env", required_argument, 0, 'e' },
                                        { "interactive", no_argument, 0, 'i' },
                                        { "shell", no_argument, 0, 'c' },
                                        { "tag", required_argument, 0, 'T' },
                                        { 0, 0, 0, 0 } };
    int o, r;
    optind = 0;
    while ((o = getopt_long(argc, argv, "+w:t:e:ic", lo, NULL)) != -1) {
        switch (o) {
        case 'w': a->cwd = optarg; break;
        case 't':
            if (parse_secs(optarg, &a->timeout) < 0)
                return cli_usage("--timeout %s: seconds expected", optarg);
            break;
        case 'e':
            if ((r = kv_add(&a->env, optarg, "env")))
                return r;
            break;
        case 'i': a->in = true; break;
        case 'c': a->shell = true; break;
        case 'T':
            if (!spawn)
                return cli_usage("--tag belongs to spawn");
            a->tag = optarg;
            break;
        default: return EXIT_USAGE;
        }
    }
    if (optind >= argc)
        return cli_usage("%s: a sandbox id is needed", argv[0]);
    a->id = argv[optind++];
    if (optind < argc && strcmp(argv[optind], "--") == 0)
        optind++;
    if (optind >= argc)
        return cli_usage("%s: a command is needed after the id (ID -- CMD...)", argv[0]);
    a->cmd = argv + optind;
    if (a->shell) { /* the words joined by spaces, run by /bin/sh -c */
        size_t len = 1;
        for (char **w = a->cmd; *w; w++)
            len += strlen(*w) + 1;
        a->joined = calloc(1, len);
        if (!a->joined)
            return EXIT_FAIL;
        for (char **w = a->cmd; *w; w++) {
            size_t l = strlen(a->joined);
            (void)snprintf(a->joined + l, len - l, "%s%s", l ? " " : "", *w);
        }
    }
    return 0;
}

static const char exec_help[] =
    "usage: sbx exec [-w DIR] [--timeout S] [-e K=V]... [-i] [-c] ID -- CMD [ARG]...\n"
    "Run CMD in the sandbox, its output streamed as it comes; exits with its exit code\n"
    "(124: timed out, 128+N: killed by signal N, 125: it could not be run).\n"
    "  -w, --workdir DIR   working directory\n"
    "  -t, --timeout S     kill it after S seconds (fractions allowed)\n"
    "  -e, --env K=V       an environment variable (repeatable)\n"
    "  -i, --interactive   stream this terminal's stdin to it as it comes (closed at EOF);\n"
    "                      SIGINT, SIGTERM, SIGHUP and SIGQUIT are passed on to it\n"
    "  -c, --shell         run the words joined by spaces with /bin/sh -c\n";

static int exit_code_of(const sbx_exec_result_t *res, double timeout)
{
    if (res->timed_out) {
        fprintf(stderr, "sbx: the command timed out after %.1f s and was killed\n", timeout);
        return EXIT_EXEC_TIMEOUT;
    }
    return res->signal > 0 ? 128 + res->signal : res->exit_code & 0xff;
}

/* -i: the command runs as a background process with its stdin open; one thread feeds it this
 * process's stdin, another passes signals on, each with a client of its own (a client is not
 * shared between threads); the calling thread follows the output to the exit. */
typedef struct {
    const cli_t *cli;
    const char *sid;
    char pid[32];
    int stop; /* read end of a pipe: readable once the command has exited */
} feed_t;

static int feed_open(const feed_t *f, sbx_client_t **rc, sbx_sandbox_t **rs)
{
    sbx_config_t cfg = { .ns = f->cli->ns };
    sbx_error_t e = { 0 };
    if (sbx_client_new(&cfg, rc, &e) < 0)
        return -1;
    if (sbx_sandbox_connect(*rc, f->sid, rs, &e) < 0) {
        sbx_client_free(*rc);
        return -1;
    }
    return 0;
}

static void *feed_stdin(void *arg)
{
    feed_t *f = arg;
    sbx_client_t *c;
    sbx_sandbox_t *s;
    if (feed_open(f, &c, &s) < 0)
        return NULL;
    static char buf[65536];
    sbx_error_t e = { 0 };
    for (;;) {
        struct pollfd pf[2] = { { .fd = STDIN_FILENO, .events = POLLIN },
                                { .fd = f->stop, .events = POLLIN } };
        if (poll(pf, 2, -1) < 0 && errno != EINTR)
            break;
        if (pf[1].revents)
            break; /* the command exited */
        if (!pf[0].revents)
            continue;
        ssize_t n = read(STDIN_FILENO, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            (void)sbx_process_stdin(s, f->pid, "", 0, true, &e);
            break;
        }
        if (sbx_process_stdin(s, f->pid, buf, (size_t)n, false, &e) < 0)
            break; /* it exited, or closed its stdin */
    }
    sbx_sandbox_free(s);
    sbx_client_free(c);
    return NULL;
}

static void *forward_signals(void *arg)
{
    feed_t *f = arg;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGQUIT);
    sigaddset(&set, SIGUSR2); /* from exec_interactive: the command has exited */
    for (unsigned n = 1;; n++) {
        int sig;
        if (sigwait(&set, &sig) != 0)
            continue;
        if (sig == SIGUSR2)
            break;
        if (n >= 3) { /* the sandbox does not answer: give up on it */
            fprintf(stderr, "sbx: third signal, leaving %s running in %s\n", f->pid, f->sid);
            _exit(128 + sig);
        }
        sbx_client_t *c;
        sbx_sandbox_t *s;
        sbx_error_t e = { 0 };
        if (feed_open(f, &c, &s) < 0)
            continue;
        if (sbx_process_signal(s, f->pid, sig, 0, &e) < 0)
            fprintf(stderr, "sbx: %s\n", e.message);
        sbx_sandbox_free(s);
        sbx_client_free(c);
    }
    return NULL;
}

static int exec_interactive(const cli_t *cli, run_args_t *a, sbx_sandbox_t *s)
{
    sbx_exec_opts_t o = { .cmd = a->joined,
                          .argv = a->joined ? NULL : (const char *const *)a->cmd,
                          .cwd = a->cwd,
                          .env = a->env.kv,
                          .n_env = a->env.n,
                          .timeout_s = a->timeout,
                          .tag = "sbx exec -i",
                          .keep_stdin_open = true,
                          .on_stdout = out_stdout,
                          .on_stderr = out_stderr };
    sbx_process_t p;
    sbx_error_t e = { 0 };
    if (sbx_process_start(s, &o, &p, &e) < 0) {
        int code = cli_fail(&e);
        return e.http_status == 400 || code == EXIT_FAIL ? EXIT_EXEC_CANNOT : code;
    }
    static feed_t f;
    int stop[2];
    if (pipe2(stop, O_CLOEXEC) < 0) {
        fprintf(stderr, "sbx: pipe: %s\n", strerror(errno));
        return EXIT_FAIL;
    }
    f.cli = cli;
    f.sid = a->id;
    f.stop = stop[0];
    (void)snprintf(f.pid, sizeof f.pid, "%s", p.id);
    sbx_process_clear(&p);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGQUIT);
    sigaddset(&set, SIGUSR2);
    (void)pthread_sigmask(SIG_BLOCK, &set, NULL); /* every thread: sigwait takes them */
    pthread_t t1, t2;
    bool feeding = pthread_create(&t1, NULL, feed_stdin, &f) == 0;
    bool forwarding = pthread_create(&t2, NULL, forward_signals, &f) == 0;
    sbx_exec_result_t res;
    int r = sbx_process_output(s, f.pid, true, &o, &res, &e) < 0 ? cli_fail(&e)
                                                                 : exit_code_of(&res, a->timeout);
    /* both threads end (and free their clients) before this returns */
    (void)close(stop[1]);
    if (feeding)
        (void)pthread_join(t1, NULL);
    if (forwarding) {
        (void)pthread_kill(t2, SIGUSR2);
        (void)pthread_join(t2, NULL);
    }
    (void)close(stop[0]);
    return r;
}

int cmd_exec(const cli_t *cli, int argc, char **argv)
{
    if (want_help(argc, argv))
        return help(exec_help);
    static run_args_t a;
    int r = parse_run(argc, argv, &a, false);
    if (r)
        return r;
    char *joined CLI_AUTO(mem) = a.joined;
    sbx_client_t *c CLI_AUTO(client) = NULL;
    sbx_sandbox_t *s CLI_AUTO(sandbox) = NULL;
    if ((r = cli_open(cli, a.id, &c, &s)))
        return r;
    if (a.in) {
        r = exec_interactive(cli, &a, s);
    } else {
        sbx_exec_opts_t o = { .cmd = a.joined,
                              .argv = a.joined ? NULL : (const char *const *)a.cmd,
                              .cwd = a.cwd,
                              .env = a.env.kv,
                              .n_env = a.env.n,
                              .timeout_s = a.timeout,
                              .on_stdout = out_stdout,
                              .on_stderr = out_stderr };
        sbx_exec_result_t res;
        sbx_error_t e = { 0 };
        if (sbx_exec(s, &o, &res, &e) < 0) {
            int code = cli_fail(&e);
            r = e.http_status == 400 || code == EXIT_FAIL ? EXIT_EXEC_CANNOT : code;
        } else {
            r = exit_code_of(&res, a.timeout);
        }
    }
    (void)fflush(stdout);
    return r;
}

static const char spawn_help[] =
    "usage: sbx spawn [-w DIR] [--timeout S] [-e K=V]... [-i] [-c] [--tag T] ID -- CMD...\n"
    "Start CMD as a background process and print its process id (p-N). -i keeps its stdin\n"
    "open for `sbx stdin`. `sbx ps ID` lists, `sbx logs ID p-N -f` re-attaches to the output,\n"
    "`sbx signal ID p-N [SIG]` signals it.\n";

int cmd_spawn(const cli_t *cli, int argc, char **argv)
{
    if (want_help(argc, argv))
        return help(spawn_help);
    static run_args_t a;
    int r = parse_run(argc, argv, &a, true);
    if (r)
        return r;
    char *joined CLI_AUTO(mem) = a.joined;
    sbx_client_t *c CLI_AUTO(client) = NULL;
    sbx_sandbox_t *s CLI_AUTO(sandbox) = NULL;
    if ((r = cli_open(cli, a.id, &c, &s)))
        return r;
    sbx_exec_opts_t o = { .cmd = a.joined,
                          .argv = a.joined ? NULL : (const char *const *)a.cmd,
                          .cwd = a.cwd,
                          .env = a.env.kv,
                          .n_env = a.env.n,
                          .timeout_s = a.timeout,
                          .tag = a.tag,
                          .keep_stdin_open = a.in };
    sbx_process_t p;
    sbx_error_t e = { 0 };
    r = sbx_process_start(s, &o, &p, &e);
    if (r < 0) {
        r = cli_fail(&e);
    } else {
        puts(p.id);
        sbx_process_clear(&p);
        r = EXIT_OK;
    }
    return r;
}

/* ---- ps, logs, signal, stdin ------------------------------------------------------------------ */

static const char ps_help[] =
    "usage: sbx ps [--json] ID\nList the background processes of a sandbox.\n";

int cmd_ps(const cli_t *cli, int argc, char **argv)
{
    if (want_help(argc, argv))
        return help(ps_help);
    simple_t a = { 0 };
    int r = parse_simple(argc, argv, &a, "j");
    if (r)
        return r;
    if (a.npos != 1)
        return cli_usage("ps: one sandbox id expected");
    sbx_client_t *c CLI_AUTO(client) = NULL;
    sbx_sandbox_t *s CLI_AUTO(sandbox) = NULL;
    if ((r = cli_open(cli, a.pos[0], &c, &s)))
        return r;
    sbx_process_t *list;
    size_t n;
    sbx_error_t e = { 0 };
    if (sbx_process_list(s, &list, &n, &e) < 0) {
        r = cli_fail(&e);
    } else {
        json_t *arr = json_array();
        if (!a.json)
            printf("%-8s %-8s %-10s %-6s %s\n", "ID", "PID", "STATE", "CODE", "CMD");
        for (size_t i = 0; i < n; i++) {
            sbx_process_t *p = &list[i];
            if (a.json) {
                json_array_append_new(arr, json_pack("{s:s,s:i,s:s,s:s,s:b,s:i,s:i,s:b,s:b}", "id",
                                                     p->id, "pid", p->pid, "cmd", p->cmd, "tag",
                                                     p->tag, "running", p->running, "exit_code",
                                                     p->exit_code, "signal", p->signal, "timed_out",
                                                     p->timed_out, "stdin_open", p->stdin_open));
                continue;
            }
            char code[16] = "-";
            if (!p->running)
                (void)snprintf(code, sizeof code, p->signal ? "sig%d" : "%d",
                               p->signal ? p->signal : p->exit_code);
            printf("%-8s %-8d %-10s %-6s %s\n", p->id, p->pid, p->running ? "running" : "exited",
                   code, p->cmd);
        }
        if (a.json)
            print_json(arr);
        json_decref(arr);
        sbx_process_list_free(list, n);
    }
    return r;
}

static const char logs_help[] =
    "usage: sbx logs [-f] ID PROC\nThe kept output of a background process; -f follows it\n"
    "until it exits (and exits with its code).\n";

int cmd_logs(const cli_t *cli, int argc, char **argv)
{
    if (want_help(argc, argv))
        return help(logs_help);
    simple_t a = { 0 };
    int r = parse_simple(argc, argv, &a, "f");
    if (r)
        return r;
    if (a.npos != 2)
        return cli_usage("logs: ID PROC expected");
    sbx_client_t *c CLI_AUTO(client) = NULL;
    sbx_sandbox_t *s CLI_AUTO(sandbox) = NULL;
    if ((r = cli_open(cli, a.pos[0], &c, &s)))
        return r;
    sbx_exec_opts_t cb = { .on_stdout = out_stdout, .on_stderr = out_stderr };
    sbx_exec_result_t res = { .exit_code = 0 };
    sbx_error_t e = { 0 };
    if (sbx_process_output(s, a.pos[1], a.follow, &cb, &res, &e) < 0)
        r = cli_fail(&e);
    else
        r = !a.follow ? EXIT_OK : res.signal ? 128 + res.signal : res.exit_code & 0xff;
    return r;
}

static const struct {
    const char *name;
    int num;
} signames[] = { { "HUP", SIGHUP },   { "INT", SIGINT },   { "QUIT", SIGQUIT },
                 { "KILL", SIGKILL }, { "TERM", SIGTERM }, { "USR1", SIGUSR1 },
                 { "USR2", SIGUSR2 }, { "STOP", SIGSTOP }, { "CONT", SIGCONT } };

static const char signal_help[] =
    "usage: sbx signal ID PROC [SIG]\nSend SIG (TERM by default; a name or a number) to a "
    "background process's group.\n";

int cmd_signal(const cli_t *cli, int argc, char **argv)
{
    if (want_help(argc, argv))
        return help(signal_help);
    simple_t a = { 0 };
    int r = parse_simple(argc, argv, &a, "");
    if (r)
        return r;
    if (a.npos < 2 || a.npos > 3)
        return cli_usage("signal: ID PROC [SIG] expected");
    int sig = SIGTERM;
    if (a.npos == 3) {
        const char *n = a.pos[2];
        if (strncmp(n, "SIG", 3) == 0)
            n += 3;
        unsigned long v;
        sig = 0;
        for (size_t i = 0; i < sizeof signames / sizeof signames[0]; i++)
            if (strcmp(n, signames[i].name) == 0)
                sig = signames[i].num;
        if (!sig && parse_uint(n, 64, &v) == 0 && v > 0)
            sig = (int)v;
        if (!sig)
            return cli_usage("signal: %s is not a signal name or number", a.pos[2]);
    }
    sbx_client_t *c CLI_AUTO(client) = NULL;
    sbx_sandbox_t *s CLI_AUTO(sandbox) = NULL;
    if ((r = cli_open(cli, a.pos[0], &c, &s)))
        return r;
    sbx_error_t e = { 0 };
    r = sbx_process_signal(s, a.pos[1], sig, 0, &e) < 0 ? cli_fail(&e) : EXIT_OK;
    return r;
}

static const char stdin_help[] =
    "usage: sbx stdin [--close] ID PROC\nSend this command's stdin (to its end) to a background\n"
    "process started with `sbx spawn -i`; --close closes the process's stdin after.\n";

int cmd_stdin(const cli_t *cli, int argc, char **argv)
{
    if (want_help(argc, argv))
        return help(stdin_help);
    simple_t a = { 0 };
    int r = parse_simple(argc, argv, &a, "C");
    if (r)
        return r;
    if (a.npos != 2)
        return cli_usage("stdin: ID PROC expected");
    char *in CLI_AUTO(mem) = NULL;
    size_t len = 0;
    if (read_all_stdin(&in, &len) < 0) {
        fprintf(stderr, "sbx: cannot read stdin (at most 64 MiB)\n");
        return EXIT_FAIL;
    }
    sbx_client_t *c CLI_AUTO(client) = NULL;
    if ((r = cli_client(cli, &c)))
        return r;
    sbx_sandbox_t *s CLI_AUTO(sandbox) = NULL;
    if ((r = open_sandbox(c, a.pos[0], &s)) == 0) {
        sbx_error_t e = { 0 };
        r = sbx_process_stdin(s, a.pos[1], in, len, a.close, &e) < 0 ? cli_fail(&e) : EXIT_OK;
    }
    return r;
}

/* ---- cp ------------------------------------------------------------------------------------ */

/* "ID:PATH" or "POOL/ID:PATH": the part before the first ':' is made of id characters and at
 * most one '/', and does not start with '.' or '/' (a local path such as ./a:b never does). */
static bool split_remote(char *arg, char **ret_id, char **ret_path)
{
    char *colon = strchr(arg, ':');
    if (!colon || colon == arg || arg[0] == '.' || arg[0] == '/')
        return false;
    int slashes = 0;
    for (char *p = arg; p < colon; p++) {
        if (*p == '/')
            slashes++;
        else if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                   (*p >= '0' && *p <= '9') || *p == '-' || *p == '_' || *p == '.'))
            return false;
    }
    if (slashes > 1)
        return false;
    *colon = 0;
    *ret_id = arg;
    *ret_path = colon + 1;
    return true;
}

static void transfer_bar(uint64_t done, uint64_t total, void *ud)
{
    (void)ud;
    if (total == UINT64_MAX || total < (1u << 20))
        return;
    fprintf(stderr, "\r%8.1f / %.1f MiB %3d%%", done / 1048576.0, total / 1048576.0,
            (int)(done * 100 / (total ? total : 1)));
    if (done >= total)
        fputc('\n', stderr);
}

static const char cp_help[] =
    "usage: sbx cp LOCAL ID:PATH | sbx cp ID:PATH LOCAL\n"
    "Copy a file into a sandbox (parents made, mode kept) or out of it (written beside the\n"
    "target, then renamed over it). ID is a sandbox id or POOL/ID. A progress bar shows on a\n"
    "terminal for files above 1 MiB.\n";

int cmd_cp(const cli_t *cli, int argc, char **argv)
{
    if (want_help(argc, argv))
        return help(cp_help);
    if (argc != 3)
        return cli_usage("cp: SRC and DST expected");
    char *sid, *spath, *did, *dpath;
    bool src_remote = split_remote(argv[1], &sid, &spath);
    bool dst_remote = split_remote(argv[2], &did, &dpath);
    if (src_remote == dst_remote)
        return cli_usage("cp: exactly one of SRC and DST must be ID:PATH");
    if (!*(src_remote ? spath : dpath))
        return cli_usage("cp: the sandbox path is empty");
    sbx_client_t *c CLI_AUTO(client) = NULL;
    sbx_sandbox_t *s CLI_AUTO(sandbox) = NULL;
    int r;
    if ((r = cli_open(cli, src_remote ? sid : did, &c, &s)))
        return r;
    sbx_transfer_fn bar = isatty(STDERR_FILENO) ? transfer_bar : NULL;
    sbx_error_t e = { 0 };
    if (src_remote)
        r = sbx_file_download(s, spath, argv[2], bar, NULL, &e);
    else
        r = sbx_file_upload(s, argv[1], dpath, bar, NULL, &e);
    r = r < 0 ? cli_fail(&e) : EXIT_OK;
    return r;
}

/* ---- ls and kill ------------------------------------------------------------------------------ */

/* Every sandbox: {"id","kind","stage","detail"} in *ret (a JSON array). Pools are skipped
 * when the platform has no pools API. */
static int collect(sbx_client_t *c, bool all, json_t **ret, sbx_error_t *e)
{
    const char *sel[] = { "sbx-sandbox=1", "sbx-sandbox-mode=dedicated" };
    char *text;
    if (sbx_jobs_list(c, sel, 2, &text, e) < 0)
        return e->code;
    json_t *jobs = json_loads(text, 0, NULL);
    sbx_free(text);
    json_t *out = json_array();
    size_t i;
    json_t *j;
    json_array_foreach(jobs, i, j) {
        const char *stage = json_string_value(json_object_get(j, "stage"));
        if (!all && stage_ended(stage))
            continue;
        const char *image = json_string_value(json_object_get(j, "image"));
        json_array_append_new(out, json_pack("{s:O,s:s,s:s,s:s,s:O}", "id",
                                             json_object_get(j, "id"), "kind", "dedicated", "stage",
                                             stage ? stage : "?", "detail", image ? image : "",
                                             "created_ms", json_object_get(j, "created_ms")));
    }
    json_decref(jobs);
    sbx_error_t pe = { 0 };
    if (sbx_pool_list(c, &text, &pe) >= 0) {
        json_t *pools = json_loads(text, 0, NULL);
        sbx_free(text);
        json_array_foreach(json_object_get(pools, "pools"), i, j) {
            const char *name = json_string_value(json_object_get(j, "name"));
            sbx_sandbox_t **list;
            size_t n;
            if (!name || sbx_pool_sandboxes_list(c, name, &list, &n, &pe) < 0)
                continue;
            for (size_t k = 0; k < n; k++)
                json_array_append_new(out, json_pack("{s:s,s:s,s:s,s:s}", "id",
                                                     sbx_sandbox_id(list[k]), "kind", "pooled",
                                                     "stage", "RUNNING", "detail", name));
            sbx_sandbox_list_free(list, n);
        }
        json_decref(pools);
    }
    *ret = out;
    return 0;
}

static const char ls_help[] =
    "usage: sbx ls [--all] [--json]\nList sandboxes: dedicated ones (their job's stage; --all\n"
    "shows ended ones too) and those of every pool (as POOL/ID).\n";

int cmd_ls(const cli_t *cli, int argc, char **argv)
{
    if (want_help(argc, argv))
        return help(ls_help);
    simple_t a = { 0 };
    int r = parse_simple(argc, argv, &a, "ja");
    if (r)
        return r;
    if (a.npos)
        return cli_usage("ls: unexpected argument %s", a.pos[0]);
    sbx_client_t *c CLI_AUTO(client) = NULL;
    if ((r = cli_client(cli, &c)))
        return r;
    sbx_error_t e = { 0 };
    json_t *list;
    if (collect(c, a.all, &list, &e) < 0)
        return cli_fail(&e);
    if (a.json) {
        print_json(list);
    } else {
        printf("%-40s %-10s %-10s %s\n", "ID", "KIND", "STAGE", "IMAGE/POOL");
        size_t i;
        json_t *j;
        json_array_foreach(list, i, j) {
            printf("%-40s %-10s %-10s %s\n", json_string_value(json_object_get(j, "id")),
                   json_string_value(json_object_get(j, "kind")),
                   json_string_value(json_object_get(j, "stage")),
                   json_string_value(json_object_get(j, "detail")));
        }
    }
    json_decref(list);
    return EXIT_OK;
}

static const char kill_help[] =
    "usage: sbx kill ID... | sbx kill --all\nCancel dedicated sandboxes (their jobs) and delete\n"
    "pooled ones; --all: every sandbox `sbx ls` shows.\n";

int cmd_kill(const cli_t *cli, int argc, char **argv)
{
    if (want_help(argc, argv))
        return help(kill_help);
    simple_t a = { 0 };
    int r = parse_simple(argc, argv, &a, "a");
    if (r)
        return r;
    if (a.all == (a.npos > 0))
        return cli_usage("kill: give sandbox ids or --all");
    sbx_client_t *c CLI_AUTO(client) = NULL;
    if ((r = cli_client(cli, &c)))
        return r;
    json_t *ids = json_array();
    sbx_error_t e = { 0 };
    if (a.all) {
        json_t *list;
        if (collect(c, false, &list, &e) < 0) {
            r = cli_fail(&e);
            json_decref(ids);
            return r;
        }
        size_t i;
        json_t *j;
        json_array_foreach(list, i, j)
            json_array_append(ids, json_object_get(j, "id"));
        json_decref(list);
    } else {
        for (int i = 0; i < a.npos; i++)
            json_array_append_new(ids, json_string(a.pos[i]));
    }
    r = EXIT_OK;
    size_t i;
    json_t *j;
    json_array_foreach(ids, i, j) {
        const char *id = json_string_value(j);
        sbx_sandbox_t *s;
        int k = open_sandbox(c, id, &s);
        if (k) {
            r = r ? r : k;
            continue;
        }
        if (sbx_sandbox_kill(s, &e) < 0) {
            k = cli_fail(&e);
            r = r ? r : k;
        } else {
            printf("%s\n", id);
        }
        sbx_sandbox_free(s);
    }
    json_decref(ids);
    return r;
}

static const char proxy_help[] =
    "usage: sbx proxy ID PORT\nPrint the URL that reaches PORT in the sandbox through the edge\n"
    "proxy, then the headers a request needs (the API token included: keep them private).\n";

int cmd_proxy(const cli_t *cli, int argc, char **argv)
{
    if (want_help(argc, argv))
        return help(proxy_help);
    unsigned long port;
    if (argc != 3 || parse_uint(argv[2], 65535, &port) < 0 || port == 0)
        return cli_usage("proxy: ID PORT expected");
    sbx_client_t *c CLI_AUTO(client) = NULL;
    int r;
    if ((r = cli_client(cli, &c)))
        return r;
    sbx_sandbox_t *s CLI_AUTO(sandbox) = NULL;
    if ((r = open_sandbox(c, argv[1], &s)) == 0) {
        char *url, *hdr;
        sbx_error_t e = { 0 };
        if (sbx_sandbox_proxy(s, (unsigned)port, &url, &hdr, &e) < 0) {
            r = cli_fail(&e);
        } else {
            printf("%s\n%s", url, hdr);
            sbx_free(url);
            sbx_free(hdr);
        }
    }
    return r;
}
