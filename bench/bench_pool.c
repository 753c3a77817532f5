/* SPDX-License-Identifier: MIT */
/* bench-pool: figures for an sbx-server in pool host mode (SBX_HOST_MODE=1), each beside a
 * baseline measured in the same run (posix_spawn of /bin/true, the same exec in a
 * dedicated-mode server, a bare GET /health, the same mkdirs and rmdirs done by the bench on
 * the homes' filesystem).
 *
 *   1. create 1 sandbox, exec `true` in it, delete it: N trios from 1 client thread and from
 *      4 threads, wall time and mean per trio;
 *   2. what create, first exec and delete cost the server: its own CPU time (from
 *      /proc/<pid>/schedstat) around batches, divided by the batch size;
 *   3. exec round trip of `true` in one existing sandbox: p50/p99; then from 4 clients at
 *      once over 100 live sandboxes, beside 4 threads of posix_spawn;
 *   4. memory per idle sandbox: the server's VmRSS, its descriptors and the kernel's slab
 *      before and after creating many; what that many does to an exec;
 *   5. create and exec with 10 live sandboxes and with 10,000, in latency and in CPU time.
 *
 * --awake: one busy loop per CPU at the lowest priority (SCHED_IDLE) for the whole run, so
 * that no CPU halts while it waits: on a VM, waking a halted virtual CPU costs tens of
 * microseconds, which falls on every hand-over from one process to another on an idle CPU
 * (the exec path has several, a bare spawn one). A diagnosis, not a figure to quote.
 *
 * It speaks HTTP/1.1 through the bench's own client (bench_http.c); every answer is checked
 * (status, ids, exit events, nothing left over at the end). Figures only: the exit status is 1
 * only on a functional failure. Normally started by scripts/bench-pool.sh. */
#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>

#include "bench_http.h"
#include "bench_util.h"

extern char **environ;

#define KIB 1024.0
#define MIB (1024.0 * 1024.0)
#define MAX_THREADS 4
#define CREATE_CHUNK 500 /* sandboxes per create request when filling the pool */

typedef struct {
    uint16_t port, ded_port, small_port;
    const char *token; /* the host token (and the dedicated server's and the second host's) */
    pid_t pid, ded_pid, small_pid;
    const char *homes;
    const char *only;
    bool quick, awake;
    unsigned trio_n, batch_n, exec_n, idle_n, scale_n, warmup;
    uint64_t exec_p50_ns; /* section 3, for section 4 */
    unsigned failures;
} bench_t;

/* A growing response body. */
typedef struct {
    char *p;
    size_t len, cap;
    bool oom;
} body_t;

/* One client: a keep-alive connection and its parsers. */
typedef struct {
    hc_t h;
    nd_t nd;
    body_t body;
    char req[2048];
} client_t;

typedef struct {
    char id[17];
    char token[65];
    uint32_t uid;
} sbref_t;

/* ---- small helpers ----------------------------------------------------------------------- */

static void fig_count(const char *label, unsigned long long v, const char *note)
{
    printf("  %-58s %11llu       %s\n", label, v, note ? note : "");
}

static void _printf_(2, 3) fail(bench_t *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("  FAIL: ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    b->failures++;
}

/* CPU time of the (single-threaded) server, its children not included (ns on the CPU). */

/* A "Name:   123 kB" line of a /proc status-like file, in bytes. */
static int kb_line(const char *path, const char *name, uint64_t *ret)
{
    char buf[8192];
    ssize_t n = read_small_file(path, buf, sizeof buf);
    if (n < 0)
        return (int)n;
    size_t nl = strlen(name);
    for (const char *l = buf; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : NULL) {
        if (strncmp(l, name, nl) != 0 || l[nl] != ':')
            continue;
        const char *p = l + nl + 1;
        while (*p == ' ' || *p == '\t')
            p++;
        uint64_t kb;
        if (parse_u64(sv_make(p, strspn(p, "0123456789")), UINT64_MAX / 1024, &kb) < 0)
            return -EINVAL;
        *ret = kb * 1024;
        return 0;
    }
    return -ENOENT;
}

static uint64_t server_rss(pid_t pid)
{
    char path[64];
    uint64_t v = 0;
    (void)snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    (void)kb_line(path, "VmRSS", &v);
    return v;
}

static uint64_t kernel_slab(void)
{
    uint64_t v = 0;
    (void)kb_line("/proc/meminfo", "Slab", &v);
    return v;
}

/* Entries of a directory ("." and ".." and, with prefix, names not starting with it, left
 * out); -errno when it cannot be read. */
static long count_entries(const char *path, const char *prefix)
{
    DIR *d = opendir(path);
    if (!d)
        return negative_errno();
    long n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (de->d_name[0] != '.' && (!prefix || strncmp(de->d_name, prefix, strlen(prefix)) == 0))
            n++;
    closedir(d);
    return n;
}

/* The homes beneath the homes directory: in its shards (00 to ff, docs/protocol.md), and
 * anything else at its top counted as one. */
static long count_homes(const char *homes)
{
    DIR *d = opendir(homes);
    if (!d)
        return negative_errno();
    long n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char sub[PATH_MAX];
        long k = -1; /* not a shard (nor a directory): counted as one */
        if (strlen(de->d_name) == 2 && isxdigit((unsigned char)de->d_name[0]) &&
            isxdigit((unsigned char)de->d_name[1]) &&
            snprintf(sub, sizeof sub, "%s/%s", homes, de->d_name) < (int)sizeof sub)
            k = count_entries(sub, NULL);
        n += k >= 0 ? k : 1;
    }
    closedir(d);
    return n;
}

static long server_fds(pid_t pid)
{
    char path[64];
    (void)snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    return count_entries(path, NULL);
}

/* The host's cgroup slots (one per uid that ever ran something). */
static long cgroup_slots(pid_t pid)
{
    char path[96];
    (void)snprintf(path, sizeof path, "/sys/fs/cgroup/pids/sbx-pool-%d", (int)pid);
    return count_entries(path, "s");
}

/* Nearest-rank percentile of sorted samples. */

static double mean_ms(const uint64_t *v, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)v[i];
    return n ? s / (double)n / 1e6 : 0;
}

static void print_latency(const char *label, uint64_t *v, size_t n)
{
    char l[128];
    qsort(v, n, sizeof *v, cmp_u64);
    (void)snprintf(l, sizeof l, "%s p50", label);
    fig(l, (double)percentile(v, n, 50) / 1e6, "ms", NULL);
    (void)snprintf(l, sizeof l, "%s p99", label);
    fig(l, (double)percentile(v, n, 99) / 1e6, "ms", NULL);
    (void)snprintf(l, sizeof l, "%s mean", label);
    fig(l, mean_ms(v, n), "ms", NULL);
}

/* ---- client ------------------------------------------------------------------------------ */

static void body_sink(void *ctx, const char *p, size_t n)
{
    body_t *b = ctx;
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = MAX(b->cap * 2, b->len + n + 1);
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
    b->p[b->len] = '\0';
}

/* An exec answer: NDJSON events, and the first bytes kept as text for a refusal's message. */
static void exec_sink(void *ctx, const char *p, size_t n)
{
    client_t *c = ctx;
    if (c->body.len < 1024)
        body_sink(&c->body, p, MIN(n, 1024 - c->body.len));
    nd_sink(&c->nd, p, n);
}

static int client_open(client_t *c, uint16_t port)
{
    *c = (client_t){ 0 };
    return hc_open(&c->h, port, 64 * 1024);
}

static void client_close(client_t *c)
{
    hc_close(&c->h);
    nd_free(&c->nd);
    free(c->body.p);
}

/* Send c->req (len bytes) and read the whole answer. An exec stream must end with exit code 0;
 * anything else must answer `want`. On failure, why says what went wrong. */
static int client_do(client_t *c, size_t len, bool exec, int want, char *why, size_t wcap)
{
    rp_t rp;
    nd_reset(&c->nd);
    c->body.len = 0;
    c->body.oom = false;
    if (c->body.p)
        c->body.p[0] = '\0';
    rp_init(&rp, exec ? exec_sink : body_sink, exec ? (void *)c : (void *)&c->body);
    int r = send_all(c->h.fd, c->req, len);
    if (r >= 0)
        r = hc_response(&c->h, &rp);
    if (r < 0) {
        (void)snprintf(why, wcap, "%s", strerror(-r));
        return r;
    }
    if (exec && nd_check(&c->nd, &rp) < 0) {
        (void)snprintf(why, wcap, "exec: %s: %.200s", c->nd.why, c->body.p ? c->body.p : "");
        return -EBADMSG;
    }
    if (!exec && (rp.status != want || c->body.oom)) {
        (void)snprintf(why, wcap, "HTTP %d (expected %d): %.200s", rp.status, want,
                       c->body.p ? c->body.p : "");
        return -EBADMSG;
    }
    if (rp.close) {
        (void)snprintf(why, wcap, "the server closed the connection");
        return -ECONNRESET;
    }
    return 0;
}

/* POST /v1/sandboxes {"count":n}; the answer's sandboxes go to out (room for n). */
static int pool_create(client_t *c, const char *host_token, unsigned n, sbref_t *out,
                       unsigned *ret_got, char *why, size_t wcap)
{
    char body[64];
    (void)snprintf(body, sizeof body, "{\"count\":%u}", n);
    int len = build_json_request(host_token, c->req, sizeof c->req, "/v1/sandboxes", body);
    int r = len < 0 ? len : client_do(c, (size_t)len, false, 200, why, wcap);
    if (r < 0)
        return r;
    json_error_t jerr;
    json_t *j = json_loadb(c->body.p, c->body.len, 0, &jerr);
    json_t *arr = json_object_get(j, "sandboxes");
    size_t got = json_array_size(arr);
    r = got == n ? 0 : -EBADMSG;
    if (r < 0)
        (void)snprintf(why, wcap, "asked for %u sandboxes, got %zu", n, got);
    for (size_t i = 0; i < got && r >= 0; i++) {
        json_t *s = json_array_get(arr, i);
        const char *id = json_string_value(json_object_get(s, "id"));
        const char *tok = json_string_value(json_object_get(s, "token"));
        json_int_t uid = json_integer_value(json_object_get(s, "uid"));
        if (!id || !tok || strlen(id) != 16 || strlen(tok) != 64 || uid <= 0) {
            (void)snprintf(why, wcap, "malformed sandbox entry %zu", i);
            r = -EBADMSG;
            break;
        }
        memcpy(out[i].id, id, 17);
        memcpy(out[i].token, tok, 65);
        out[i].uid = (uint32_t)uid;
    }
    json_decref(j);
    if (r >= 0)
        *ret_got = (unsigned)got;
    return r;
}

static int pool_exec_true(client_t *c, const sbref_t *s, char *why, size_t wcap)
{
    char target[64];
    (void)snprintf(target, sizeof target, "/v1/sandboxes/%s/exec", s->id);
    int len = build_json_request(s->token, c->req, sizeof c->req, target, "{\"cmd\":[\"true\"]}");
    return len < 0 ? len : client_do(c, (size_t)len, true, 200, why, wcap);
}

static int pool_delete(client_t *c, const sbref_t *s, char *why, size_t wcap)
{
    char target[64];
    (void)snprintf(target, sizeof target, "/v1/sandboxes/%s", s->id);
    int len = build_head(s->token, c->req, sizeof c->req, "DELETE", target, NULL, -1);
    int r = len < 0 ? len : client_do(c, (size_t)len, false, 200, why, wcap);
    if (r >= 0 && !strstr(c->body.p, "\"deleted\":true")) {
        (void)snprintf(why, wcap, "delete answered %.200s", c->body.p);
        r = -EBADMSG;
    }
    return r;
}

/* DELETE /v1/sandboxes: everything; the answer must count `expect` (0: any). */
static int pool_delete_all(client_t *c, const char *host_token, unsigned expect, char *why,
                           size_t wcap)
{
    int len = build_head(host_token, c->req, sizeof c->req, "DELETE", "/v1/sandboxes", NULL, -1);
    int r = len < 0 ? len : client_do(c, (size_t)len, false, 200, why, wcap);
    char want[48];
    (void)snprintf(want, sizeof want, "\"deleted\":%u", expect);
    if (r >= 0 && expect > 0 && !strstr(c->body.p, want)) {
        (void)snprintf(why, wcap, "delete-all answered %.200s (expected %s)", c->body.p, want);
        r = -EBADMSG;
    }
    return r;
}

static int health(client_t *c, const char *token, char *why, size_t wcap)
{
    int len = build_head(token, c->req, sizeof c->req, "GET", "/health", NULL, -1);
    return len < 0 ? len : client_do(c, (size_t)len, false, 200, why, wcap);
}

/* Wait (up to 20 s) until the host's sets made ahead are settled: no warm home and no network
 * namespace asked of the janitor and not answered. Figures taken while it still fills them
 * after a start or a burst of creates measure the filling, not the steady state. */
static void settle(client_t *c, const char *token)
{
    char why[320];
    for (int i = 0; i < 200; i++) {
        if (health(c, token, why, sizeof why) < 0)
            return;
        json_t *j = json_loadb(c->body.p, c->body.len, 0, NULL);
        json_int_t homes =
            json_integer_value(json_object_get(json_object_get(j, "homes"), "making"));
        json_t *n = json_object_get(j, "netns");
        json_int_t ns = json_integer_value(json_object_get(n, "making")) +
                        json_integer_value(json_object_get(n, "checking"));
        json_decref(j);
        if (homes == 0 && ns == 0)
            return;
        (void)usleep(100 * 1000);
    }
}

/* ---- 1. create + exec + delete trios ------------------------------------------------------ */

typedef struct {
    const bench_t *b;
    unsigned n;
    uint64_t *lat[3]; /* create, exec, delete: n each */
    uint32_t *uids;   /* n */
    uint64_t wall_ns;
    int r;
    char why[320];
} trio_worker_t;

static void *trio_thread(void *arg)
{
    trio_worker_t *w = arg;
    client_t c;
    w->r = client_open(&c, w->b->port);
    if (w->r < 0) {
        (void)snprintf(w->why, sizeof w->why, "connect: %s", strerror(-w->r));
        return NULL;
    }
    uint64_t t0 = now_ns();
    for (unsigned i = 0; i < w->n && w->r >= 0; i++) {
        sbref_t s;
        unsigned got;
        uint64_t a = now_ns();
        w->r = pool_create(&c, w->b->token, 1, &s, &got, w->why, sizeof w->why);
        uint64_t bt = now_ns();
        if (w->r >= 0)
            w->r = pool_exec_true(&c, &s, w->why, sizeof w->why);
        uint64_t ct = now_ns();
        if (w->r >= 0)
            w->r = pool_delete(&c, &s, w->why, sizeof w->why);
        uint64_t d = now_ns();
        if (w->lat[0]) {
            w->lat[0][i] = bt - a;
            w->lat[1][i] = ct - bt;
            w->lat[2][i] = d - ct;
        }
        if (w->uids)
            w->uids[i] = s.uid;
    }
    w->wall_ns = now_ns() - t0;
    client_close(&c);
    return NULL;
}

static unsigned distinct_u32(uint32_t *v, size_t n)
{
    unsigned d = 0;
    for (size_t i = 0; i < n; i++) {
        size_t k = 0;
        while (k < i && v[k] != v[i])
            k++;
        d += k == i;
        if (d > 64)
            return d; /* enough to see that uids are not being recycled */
    }
    return d;
}

/* Run `threads` workers of n trios each; returns the wall time for all, or 0 on failure. */
static uint64_t run_trios(bench_t *b, unsigned threads, unsigned n, uint64_t **lat, uint32_t *uids)
{
    trio_worker_t w[MAX_THREADS];
    pthread_t t[MAX_THREADS];
    uint64_t t0 = now_ns();
    for (unsigned i = 0; i < threads; i++) {
        w[i] = (trio_worker_t){ .b = b, .n = n, .uids = uids ? uids + (size_t)i * n : NULL };
        for (int k = 0; k < 3; k++)
            w[i].lat[k] = lat ? lat[k] + (size_t)i * n : NULL;
        if (pthread_create(&t[i], NULL, trio_thread, &w[i]) != 0) {
            w[i].r = -EAGAIN;
            (void)snprintf(w[i].why, sizeof w[i].why, "pthread_create failed");
            threads = i;
            fail(b, "pthread_create");
            break;
        }
    }
    for (unsigned i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    uint64_t wall = now_ns() - t0;
    for (unsigned i = 0; i < threads; i++)
        if (w[i].r < 0) {
            fail(b, "trio thread %u: %s", i, w[i].why);
            wall = 0;
        }
    return wall;
}

typedef struct {
    unsigned n;
    uint64_t wall_ns;
    int r;
} spawn_worker_t;

static void *spawn_thread(void *arg)
{
    spawn_worker_t *w = arg;
    char *const argv[] = { "/bin/true", NULL };
    uint64_t t0 = now_ns();
    for (unsigned i = 0; i < w->n && w->r >= 0; i++) {
        pid_t pid;
        int st;
        w->r = -posix_spawn(&pid, argv[0], NULL, NULL, argv, environ);
        while (w->r >= 0 && waitpid(pid, &st, 0) < 0)
            if (errno != EINTR)
                w->r = negative_errno();
        if (w->r >= 0 && (!WIFEXITED(st) || WEXITSTATUS(st) != 0))
            w->r = -ECHILD;
    }
    w->wall_ns = now_ns() - t0;
    return NULL;
}

/* posix_spawn + waitpid of /bin/true, n per thread; returns the wall time, 0 on failure. */
static uint64_t run_spawns(bench_t *b, unsigned threads, unsigned n)
{
    spawn_worker_t w[MAX_THREADS];
    pthread_t t[MAX_THREADS];
    uint64_t t0 = now_ns();
    unsigned started = 0;
    for (; started < threads; started++) {
        w[started] = (spawn_worker_t){ .n = n };
        if (pthread_create(&t[started], NULL, spawn_thread, &w[started]) != 0)
            break;
    }
    for (unsigned i = 0; i < started; i++)
        pthread_join(t[i], NULL);
    uint64_t wall = now_ns() - t0;
    for (unsigned i = 0; i < started; i++)
        if (w[i].r < 0) {
            fail(b, "posix_spawn /bin/true: %s", strerror(-w[i].r));
            return 0;
        }
    return started == threads ? wall : 0;
}

static void trio_summary(const char *label, unsigned total, uint64_t wall, uint64_t cpu)
{
    char l[128];
    (void)snprintf(l, sizeof l, "%s: wall for %u trios", label, total);
    fig(l, (double)wall / 1e9, "s", NULL);
    (void)snprintf(l, sizeof l, "%s: wall per trio", label);
    fig(l, (double)wall / total / 1e6, "ms", NULL);
    (void)snprintf(l, sizeof l, "%s: server CPU per trio", label);
    fig(l, (double)cpu / total / 1e6, "ms", "(its own; the command's process not included)");
}

static void bench_trios(bench_t *b)
{
    unsigned n = b->trio_n, per = n / MAX_THREADS;
    char hdr[200], l[128];
    (void)snprintf(hdr, sizeof hdr,
                   "1. create 1 sandbox, exec [\"true\"] in it, delete it: %u trios from 1 "
                   "client thread, then %u x %u (after %u warm-up)",
                   n, MAX_THREADS, per, b->warmup);
    section(hdr);
    _cleanup_free_ uint64_t *all = calloc((size_t)3 * n, sizeof *all);
    _cleanup_free_ uint32_t *uids = calloc(n, sizeof *uids);
    if (!all || !uids) {
        fail(b, "out of memory");
        return;
    }
    uint64_t *lat[3] = { all, all + n, all + 2 * (size_t)n };
    if (run_trios(b, 1, b->warmup, NULL, NULL) == 0)
        return;
    long slots0 = cgroup_slots(b->pid);
    uint64_t c0 = server_cpu_ns(b->pid);
    uint64_t seq = run_trios(b, 1, n, lat, uids);
    uint64_t c1 = server_cpu_ns(b->pid);
    if (seq == 0)
        return;
    trio_summary("1 thread", n, seq, c1 - c0);
    print_latency("  1 thread: create (POST /v1/sandboxes count=1)", lat[0], n);
    print_latency("  1 thread: exec [\"true\"] (first exec: cgroup joined)", lat[1], n);
    print_latency("  1 thread: delete (DELETE /v1/sandboxes/<id>)", lat[2], n);
    fig_count("  1 thread: distinct uids over the run", distinct_u32(uids, n),
              "(recycled: the last uid freed is the next taken)");
    uint64_t c2 = server_cpu_ns(b->pid);
    uint64_t par = run_trios(b, MAX_THREADS, per, NULL, uids);
    uint64_t c3 = server_cpu_ns(b->pid);
    long slots1 = cgroup_slots(b->pid);
    if (par) {
        (void)snprintf(l, sizeof l, "%d threads", MAX_THREADS);
        trio_summary(l, per * MAX_THREADS, par, c3 - c2);
        fig_count("  4 threads: distinct uids over the run", distinct_u32(uids, per * MAX_THREADS),
                  NULL);
    }
    if (slots0 >= 0)
        fig_count("cgroup slots created during both runs", (unsigned long long)(slots1 - slots0),
                  "(a slot is made once per uid and kept for its next sandbox)");
    uint64_t s1 = run_spawns(b, 1, n);
    if (s1) {
        fig("baseline: posix_spawn+waitpid /bin/true, 1 thread: wall", (double)s1 / 1e9, "s", NULL);
        fig("baseline: ... per spawn", (double)s1 / n / 1e6, "ms", NULL);
    }
    uint64_t s4 = run_spawns(b, MAX_THREADS, per);
    if (s4) {
        fig("baseline: posix_spawn+waitpid /bin/true, 4 threads: wall", (double)s4 / 1e9, "s",
            "(the floor for the 4-thread trio run)");
        fig("baseline: ... per spawn", (double)s4 / (per * MAX_THREADS) / 1e6, "ms", NULL);
    }
    if (s4 && par) {
        char note[96];
        double x = (double)par / (double)s4;
        fig("ratio: 4-thread trios / 4-thread bare spawns", x, "x",
            target_note(x <= 1.5, "<= 1.5x", note, sizeof note));
        /* the same as a difference: on a machine that spawns fast the ratio grows while this
         * stays or shrinks (README, "What bounds them") */
        fig("  4-thread wall per trio over wall per bare spawn",
            ((double)par - (double)s4) / (double)(per * MAX_THREADS) / 1e6, "ms", NULL);
    }
}

/* ---- 2. server-side create / exec / delete cost ------------------------------------------- */

static void per_item(const char *label, uint64_t cpu, uint64_t wall, unsigned n, const char *note)
{
    char l[128];
    (void)snprintf(l, sizeof l, "%s: server CPU each", label);
    fig(l, (double)cpu / n / 1e3, "us", note);
    (void)snprintf(l, sizeof l, "%s: wall each", label);
    fig(l, (double)wall / n / 1e3, "us", NULL);
}

/* Exec `true` in each, then delete each one by one; server CPU per exec and per delete. */
static int exec_then_delete(bench_t *b, client_t *c, sbref_t *s, unsigned n, const char *what)
{
    char why[320], l[128];
    uint64_t c0 = server_cpu_ns(b->pid), t0 = now_ns();
    for (unsigned i = 0; i < n; i++)
        if (pool_exec_true(c, &s[i], why, sizeof why) < 0) {
            fail(b, "exec in sandbox %u: %s", i, why);
            return -EBADMSG;
        }
    uint64_t c1 = server_cpu_ns(b->pid), t1 = now_ns();
    (void)snprintf(l, sizeof l, "first exec [\"true\"] per sandbox (%s)", what);
    per_item(l, c1 - c0, t1 - t0, n, NULL);
    for (unsigned i = 0; i < n; i++)
        if (pool_delete(c, &s[i], why, sizeof why) < 0) {
            fail(b, "delete %u: %s", i, why);
            return -EBADMSG;
        }
    uint64_t c2 = server_cpu_ns(b->pid), t2 = now_ns();
    (void)snprintf(l, sizeof l, "DELETE /v1/sandboxes/<id> after an exec (%s)", what);
    per_item(l, c2 - c1, t2 - t1, n, NULL);
    return 0;
}

/* What the filesystem alone costs for a home: mkdir + chown of the home and its three
 * directories (.tmp, .sbx, .sbx/proxy), then the four rmdirs, by this process in a scratch
 * directory beside the homes (the same filesystem). */
static int fs_floor(bench_t *b, unsigned n, uint64_t *ret_make_ns, uint64_t *ret_remove_ns)
{
    char scratch[512];
    (void)snprintf(scratch, sizeof scratch, "%s-fs-floor", b->homes);
    if (mkdir(scratch, 0700) < 0 && errno != EEXIST)
        return negative_errno();
    _cleanup_close_ int top = open(scratch, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (top < 0)
        return negative_errno();
    static const char *const sub[] = { ".tmp", ".sbx", ".sbx/proxy" };
    int r = 0;
    uint64_t t0 = now_ns();
    for (unsigned i = 0; i < n && r >= 0; i++) {
        char name[16];
        (void)snprintf(name, sizeof name, "h%u", i);
        _cleanup_close_ int h = -EBADF;
        if (mkdirat(top, name, 0700) < 0 ||
            (h = openat(top, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0 ||
            fchown(h, 20000, 20000) < 0)
            r = negative_errno();
        for (size_t k = 0; k < ELEMENTSOF(sub) && r >= 0; k++)
            if (mkdirat(h, sub[k], 0700) < 0 ||
                fchownat(h, sub[k], 20000, 20000, AT_SYMLINK_NOFOLLOW) < 0)
                r = negative_errno();
    }
    uint64_t t1 = now_ns();
    for (unsigned i = 0; i < n; i++) {
        char name[16], path[64];
        (void)snprintf(name, sizeof name, "h%u", i);
        for (size_t k = ELEMENTSOF(sub); k > 0; k--) {
            (void)snprintf(path, sizeof path, "%s/%s", name, sub[k - 1]);
            (void)unlinkat(top, path, AT_REMOVEDIR);
        }
        if (unlinkat(top, name, AT_REMOVEDIR) < 0 && r >= 0)
            r = negative_errno();
    }
    uint64_t t2 = now_ns();
    (void)rmdir(scratch);
    *ret_make_ns = t1 - t0;
    *ret_remove_ns = t2 - t1;
    return r;
}

static void bench_server_cost(bench_t *b)
{
    unsigned n = b->batch_n;
    char hdr[200], why[320], note[96];
    (void)snprintf(hdr, sizeof hdr,
                   "2. server-side cost: the server's own CPU time (/proc/<pid>/schedstat) around "
                   "batches of %u, divided by %u",
                   n, n);
    section(hdr);
    client_t c;
    _cleanup_free_ sbref_t *s = calloc(n, sizeof *s);
    int r = client_open(&c, b->port);
    if (r < 0 || !s) {
        fail(b, "connect: %s", strerror(r < 0 ? -r : ENOMEM));
        if (r >= 0)
            client_close(&c);
        return;
    }
    unsigned got;
    /* a: one request creates n; b: delete-all of sandboxes that never ran anything */
    uint64_t c0 = server_cpu_ns(b->pid), t0 = now_ns();
    r = pool_create(&c, b->token, n, s, &got, why, sizeof why);
    uint64_t c1 = server_cpu_ns(b->pid), t1 = now_ns();
    if (r < 0) {
        fail(b, "create count=%u: %s", n, why);
        goto out;
    }
    double each = (double)(c1 - c0) / n / 1e3;
    per_item("create, count=N in one request", c1 - c0, t1 - t0, n,
             target_note(each <= 100, "<= 100 us", note, sizeof note));
    r = pool_delete_all(&c, b->token, n, why, sizeof why);
    uint64_t c2 = server_cpu_ns(b->pid), t2 = now_ns();
    if (r < 0) {
        fail(b, "%s", why);
        goto out;
    }
    per_item("DELETE /v1/sandboxes (never used)", c2 - c1, t2 - t1, n, NULL);
    uint64_t mk = 0, rm = 0;
    r = fs_floor(b, n, &mk, &rm);
    if (r < 0)
        fail(b, "filesystem baseline: %s", strerror(-r));
    else {
        fig("baseline: 4 x (mkdir + chown) of a home, by the bench", (double)mk / n / 1e3, "us",
            "(same filesystem: the floor under create)");
        fig("baseline: 4 x rmdir of a home, by the bench", (double)rm / n / 1e3, "us",
            "(the floor under delete)");
    }
    /* c: one create request per sandbox, beside a bare request on the same connection */
    for (unsigned i = 0; i < n && r >= 0; i++)
        r = pool_create(&c, b->token, 1, &s[i], &got, why, sizeof why);
    uint64_t c3 = server_cpu_ns(b->pid), t3 = now_ns();
    if (r < 0) {
        fail(b, "create count=1: %s", why);
        goto out;
    }
    per_item("create, count=1 per request (HTTP included)", c3 - c2, t3 - t2, n, NULL);
    for (unsigned i = 0; i < n && r >= 0; i++)
        r = health(&c, b->token, why, sizeof why);
    uint64_t c4 = server_cpu_ns(b->pid), t4 = now_ns();
    if (r < 0)
        fail(b, "GET /health: %s", why);
    else
        per_item("baseline: GET /health with the host token", c4 - c3, t4 - t3, n, NULL);
    /* d: the uids were recycled from (a), so their cgroup slots exist when the run before
     * executed on them; then first exec per sandbox, then one DELETE each */
    long slots0 = cgroup_slots(b->pid);
    r = exec_then_delete(b, &c, s, n, "recycled uids");
    long slots1 = cgroup_slots(b->pid);
    if (slots0 >= 0)
        fig_count("cgroup slots made by these first execs", (unsigned long long)(slots1 - slots0),
                  "(0 when every uid had one already)");
out:
    if (r < 0) /* leave nothing behind for the next section */
        (void)pool_delete_all(&c, b->token, 0, why, sizeof why);
    client_close(&c);
}

/* ---- 3. exec round trip in one sandbox ---------------------------------------------------- */

/* n timed execs of ["true"] at target (after warmup untimed ones) on c's connection, into v;
 * the CPU time of the server (pid) over all of them is added to *cpu_ns. */
static int time_execs(bench_t *b, client_t *c, const char *token, const char *target, pid_t pid,
                      uint64_t *v, unsigned n, unsigned warmup, uint64_t *cpu_ns)
{
    char why[320];
    int len = build_json_request(token, c->req, sizeof c->req, target, "{\"cmd\":[\"true\"]}");
    if (len < 0)
        return len;
    uint64_t c0 = server_cpu_ns(pid);
    for (unsigned i = 0; i < warmup + n; i++) {
        uint64_t t0 = now_ns();
        if (client_do(c, (size_t)len, true, 200, why, sizeof why) < 0) {
            fail(b, "exec %u at %s: %s", i, target, why);
            return -EBADMSG;
        }
        if (i >= warmup)
            v[i - warmup] = now_ns() - t0;
    }
    *cpu_ns += server_cpu_ns(pid) - c0;
    return 0;
}

static int time_spawn(uint64_t *v, unsigned n, unsigned warmup)
{
    char *const argv[] = { "/bin/true", NULL };
    for (unsigned i = 0; i < warmup + n; i++) {
        pid_t pid;
        int st;
        uint64_t t0 = now_ns();
        int r = posix_spawn(&pid, argv[0], NULL, NULL, argv, environ);
        if (r != 0)
            return -r;
        while (waitpid(pid, &st, 0) < 0)
            if (errno != EINTR)
                return negative_errno();
        if (i >= warmup)
            v[i - warmup] = now_ns() - t0;
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            return -ECHILD;
    }
    return 0;
}

/* The floor of any agent reached over the network that starts processes off its event loop:
 * a one-byte round trip to another process, over loopback TCP (client to agent and back) and
 * over a unix socket (agent to its spawn helper and back). An echo child of ours at the other
 * end; both kept for all rounds. */
typedef struct {
    int tcp, unx;
    pid_t tcp_pid, unx_pid;
} hops_t;

static void echo_child(int fd)
{
    unsigned char c;
    while (read(fd, &c, 1) == 1 && write(fd, &c, 1) == 1)
        ;
    _exit(0);
}

static int hops_open(hops_t *h)
{
    *h = (hops_t){ -1, -1, -1, -1 };
    int sv[2], one = 1;
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t al = sizeof a;
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 1) < 0 ||
        getsockname(l, (struct sockaddr *)&a, &al) < 0) {
        safe_close(l);
        return -errno;
    }
    h->tcp_pid = fork();
    if (h->tcp_pid == 0) {
        int c = accept(l, NULL, NULL);
        if (c >= 0)
            (void)setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        echo_child(c);
    }
    h->tcp = h->tcp_pid > 0 ? socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0) : -1;
    if (h->tcp < 0 || connect(h->tcp, (struct sockaddr *)&a, sizeof a) < 0) {
        safe_close(l);
        return -EIO;
    }
    safe_close(l);
    (void)setsockopt(h->tcp, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        return -errno;
    h->unx_pid = fork();
    if (h->unx_pid == 0) {
        close(sv[0]);
        echo_child(sv[1]);
    }
    close(sv[1]);
    h->unx = sv[0];
    return h->unx_pid > 0 ? 0 : -EIO;
}

static void hops_close(hops_t *h)
{
    h->tcp = safe_close(h->tcp);
    h->unx = safe_close(h->unx);
    for (int i = 0; i < 2; i++) {
        pid_t p = i ? h->unx_pid : h->tcp_pid;
        if (p > 0) { /* the echo ends at our close; one that never got its peer, here */
            (void)kill(p, SIGKILL);
            (void)waitpid(p, NULL, 0);
        }
    }
}

static int time_hops(int fd, uint64_t *v, unsigned n, unsigned warmup)
{
    unsigned char c = 'x';
    for (unsigned i = 0; i < warmup + n; i++) {
        uint64_t t0 = now_ns();
        if (write(fd, &c, 1) != 1 || read(fd, &c, 1) != 1)
            return -EIO;
        if (i >= warmup)
            v[i - warmup] = now_ns() - t0;
    }
    return 0;
}

#define EXEC_ROUNDS 20

/* The sandbox's execs, the dedicated server's and the bare spawns take turns, a round of each
 * at a time, so that a machine whose speed drifts (a shared, nested VM: steal, other guests)
 * gives the three the same conditions. */
static void bench_exec(bench_t *b)
{
    unsigned n = b->exec_n, rounds = n >= 10 * EXEC_ROUNDS ? EXEC_ROUNDS : 1;
    char hdr[240], why[320], target[64];
    (void)snprintf(hdr, sizeof hdr,
                   "3. exec round trip of [\"true\"] in one existing sandbox: N=%u sequential "
                   "on one keep-alive connection (after %u warm-up), in %u rounds, each beside "
                   "a round of each baseline",
                   n, b->warmup, rounds);
    section(hdr);
    _cleanup_free_ uint64_t *v = calloc(n, sizeof *v);
    _cleanup_free_ uint64_t *vd = calloc(n, sizeof *vd);
    _cleanup_free_ uint64_t *vs = calloc(n, sizeof *vs);
    _cleanup_free_ uint64_t *vt = calloc(n, sizeof *vt);
    _cleanup_free_ uint64_t *vu = calloc(n, sizeof *vu);
    hops_t hops = { -1, -1, -1, -1 };
    bool hops_ok = vt && vu && hops_open(&hops) >= 0;
    client_t c, cd;
    sbref_t s;
    unsigned got;
    bool ded = false, ok = true, ded_ok = true, spawn_ok = true;
    int r = client_open(&c, b->port);
    if (r < 0 || !v || !vd || !vs) {
        fail(b, "connect: %s", strerror(r < 0 ? -r : ENOMEM));
        if (r >= 0)
            client_close(&c);
        return;
    }
    r = pool_create(&c, b->token, 1, &s, &got, why, sizeof why);
    if (r < 0) {
        fail(b, "create: %s", why);
        client_close(&c);
        return;
    }
    if (b->ded_port) {
        r = client_open(&cd, b->ded_port);
        if (r < 0)
            fail(b, "connect to the dedicated server: %s", strerror(-r));
        ded = r >= 0;
    }
    (void)snprintf(target, sizeof target, "/v1/sandboxes/%s/exec", s.id);
    uint64_t cpu = 0, ded_cpu = 0, p50 = 0, ded50 = 0, floor50 = 0;
    for (unsigned k = 0; k < rounds; k++) {
        unsigned off = (unsigned)((uint64_t)n * k / rounds);
        unsigned cnt = (unsigned)((uint64_t)n * (k + 1) / rounds) - off;
        unsigned wu = k == 0 ? b->warmup : 0;
        if (ok)
            ok = time_execs(b, &c, s.token, target, b->pid, v + off, cnt, wu, &cpu) >= 0;
        if (ded && ded_ok)
            ded_ok = time_execs(b, &cd, b->token, "/v1/exec", b->ded_pid, vd + off, cnt, wu,
                                &ded_cpu) >= 0;
        if (spawn_ok && (r = time_spawn(vs + off, cnt, wu)) < 0) {
            fail(b, "posix_spawn /bin/true: %s", strerror(-r));
            spawn_ok = false;
        }
        if (hops_ok && (time_hops(hops.tcp, vt + off, cnt, wu) < 0 ||
                        time_hops(hops.unx, vu + off, cnt, wu) < 0)) {
            fail(b, "round trips to an echo process: %s", strerror(errno));
            hops_ok = false;
        }
    }
    if (vt && vu)
        hops_close(&hops);
    if (ok) {
        print_latency("exec [\"true\"] in a sandbox", v, n);
        p50 = b->exec_p50_ns = percentile(v, n, 50);
        fig("exec [\"true\"] in a sandbox: server CPU each", (double)cpu / (b->warmup + n) / 1e3,
            "us", "(its own; the confined child runs on its own CPU time)");
    }
    if (pool_delete(&c, &s, why, sizeof why) < 0)
        fail(b, "delete: %s", why);
    client_close(&c);
    if (ded) {
        if (ded_ok) {
            print_latency("baseline: the same exec, dedicated-mode server (/v1/exec)", vd, n);
            fig("baseline: dedicated-mode server CPU each", (double)ded_cpu / (b->warmup + n) / 1e3,
                "us", NULL);
            ded50 = percentile(vd, n, 50);
        }
        client_close(&cd);
    }
    if (spawn_ok) {
        print_latency("baseline: posix_spawn+waitpid /bin/true (bench process)", vs, n);
        floor50 = percentile(vs, n, 50);
    }
    if (p50 && ded50)
        fig("ratio: exec p50 in a sandbox / dedicated-mode exec p50", (double)p50 / (double)ded50,
            "x", NULL);
    if (p50 && floor50) {
        char note[96];
        double x = (double)p50 / (double)floor50;
        fig("ratio: exec p50 in a sandbox / posix_spawn p50", x, "x",
            target_note(x <= 1.2, "<= 1.2x", note, sizeof note));
        fig("  exec p50 in a sandbox over posix_spawn p50", ((double)p50 - (double)floor50) / 1e6,
            "ms", NULL);
    }
    if (hops_ok) {
        /* what the 1.2x target leaves beside what two hand-overs cost here */
        uint64_t t50 = percentile(vt, n, 50), u50 = percentile(vu, n, 50);
        fig("baseline: 1-byte round trip to another process, loopback TCP p50", (double)t50 / 1e6,
            "ms", NULL);
        fig("baseline: 1-byte round trip to another process, unix socket p50", (double)u50 / 1e6,
            "ms", NULL);
        if (floor50) {
            fig("  the two together over posix_spawn p50", (double)(t50 + u50) / (double)floor50,
                "x", "(an agent over TCP with a spawn helper: >= 1 + this)");
            if (p50 > floor50)
                fig("  exec p50 in a sandbox over posix_spawn p50, in TCP round trips",
                    (double)(p50 - floor50) / (double)t50, "", NULL);
        }
    }
}

/* 3b. The same with 4 clients at once over 100 live sandboxes (each client its own keep-alive
 * connection, its execs spread over the sandboxes), beside 4 threads of posix_spawn+waitpid in
 * the bench: every latency of each side, p50 over all. */
#define CONC_SANDBOXES 100

typedef struct {
    const bench_t *b;
    const sbref_t *s; /* CONC_SANDBOXES */
    unsigned k, n;    /* worker index, execs */
    uint64_t *v;      /* n latencies */
    int r;
    char why[320];
} conc_worker_t;

static void *conc_exec_thread(void *arg)
{
    conc_worker_t *w = arg;
    client_t c;
    w->r = client_open(&c, w->b->port);
    if (w->r < 0) {
        (void)snprintf(w->why, sizeof w->why, "connect: %s", strerror(-w->r));
        return NULL;
    }
    for (unsigned i = 0; i < w->b->warmup + w->n && w->r >= 0; i++) {
        const sbref_t *s = &w->s[(i * MAX_THREADS + w->k) % CONC_SANDBOXES];
        uint64_t t0 = now_ns();
        w->r = pool_exec_true(&c, s, w->why, sizeof w->why);
        if (i >= w->b->warmup)
            w->v[i - w->b->warmup] = now_ns() - t0;
    }
    client_close(&c);
    return NULL;
}

static void *conc_spawn_thread(void *arg)
{
    conc_worker_t *w = arg;
    w->r = time_spawn(w->v, w->n, w->b->warmup);
    if (w->r < 0)
        (void)snprintf(w->why, sizeof w->why, "posix_spawn /bin/true: %s", strerror(-w->r));
    return NULL;
}

/* Run MAX_THREADS workers of fn, n each, latencies into v (MAX_THREADS * n); 0 or -1. */
static int conc_run(bench_t *b, void *(*fn)(void *), const sbref_t *s, unsigned n, uint64_t *v)
{
    conc_worker_t w[MAX_THREADS];
    pthread_t t[MAX_THREADS];
    unsigned started = 0;
    for (; started < MAX_THREADS; started++) {
        w[started] =
            (conc_worker_t){ .b = b, .s = s, .k = started, .n = n, .v = v + (size_t)started * n };
        if (pthread_create(&t[started], NULL, fn, &w[started]) != 0)
            break;
    }
    int r = started == MAX_THREADS ? 0 : -1;
    for (unsigned i = 0; i < started; i++) {
        pthread_join(t[i], NULL);
        if (w[i].r < 0) {
            fail(b, "concurrent worker %u: %s", i, w[i].why);
            r = -1;
        }
    }
    return r;
}

static void bench_exec_concurrent(bench_t *b)
{
    unsigned n = b->exec_n / MAX_THREADS;
    char hdr[200], why[320];
    (void)snprintf(hdr, sizeof hdr,
                   "3b. exec round trip of [\"true\"] from %d clients at once, %d live sandboxes: "
                   "%u each (after %u warm-up), beside %d threads of posix_spawn+waitpid",
                   MAX_THREADS, CONC_SANDBOXES, n, b->warmup, MAX_THREADS);
    section(hdr);
    _cleanup_free_ uint64_t *v = calloc((size_t)n * MAX_THREADS, sizeof *v);
    _cleanup_free_ sbref_t *s = calloc(CONC_SANDBOXES, sizeof *s);
    client_t c;
    unsigned got;
    if (!v || !s || client_open(&c, b->port) < 0) {
        fail(b, "concurrent exec: setup failed");
        return;
    }
    if (pool_create(&c, b->token, CONC_SANDBOXES, s, &got, why, sizeof why) < 0) {
        fail(b, "create: %s", why);
        client_close(&c);
        return;
    }
    uint64_t p50 = 0, floor50 = 0;
    if (conc_run(b, conc_exec_thread, s, n, v) == 0) {
        print_latency("exec [\"true\"], 4 clients", v, (size_t)n * MAX_THREADS);
        p50 = percentile(v, (size_t)n * MAX_THREADS, 50);
    }
    if (pool_delete_all(&c, b->token, CONC_SANDBOXES, why, sizeof why) < 0)
        fail(b, "delete all: %s", why);
    client_close(&c);
    if (conc_run(b, conc_spawn_thread, NULL, n, v) == 0) {
        print_latency("baseline: posix_spawn+waitpid /bin/true, 4 threads", v,
                      (size_t)n * MAX_THREADS);
        floor50 = percentile(v, (size_t)n * MAX_THREADS, 50);
    }
    if (p50 && floor50) {
        char note[96];
        double x = (double)p50 / (double)floor50;
        fig("ratio: exec p50, 4 clients / posix_spawn p50, 4 threads", x, "x",
            target_note(x <= 1.5, "<= 1.5x", note, sizeof note));
        fig("  exec p50, 4 clients, over posix_spawn p50, 4 threads",
            ((double)p50 - (double)floor50) / 1e6, "ms", NULL);
    }
}

/* ---- 4. memory per idle sandbox ----------------------------------------------------------- */

/* Exec in k of the sandboxes (their first), then time m execs in the first: descriptors per
 * sandbox that has run something, and what a host this full does to an exec. */
static int idle_then_exec(bench_t *b, client_t *c, sbref_t *s, unsigned k, long fd1)
{
    char why[320], l[160];
    int r = 0;
    for (unsigned i = 0; i < k && r >= 0; i++)
        r = pool_exec_true(c, &s[i], why, sizeof why);
    long fd2 = server_fds(b->pid);
    if (r < 0) {
        fail(b, "exec: %s", why);
        return r;
    }
    if (fd1 >= 0 && fd2 >= 0 && k > 0)
        fig("  more server descriptors per sandbox after its first exec", (double)(fd2 - fd1) / k,
            "", "(its cgroup.procs files, kept while among the used last)");
    unsigned m = b->quick ? 50 : 200;
    _cleanup_free_ uint64_t *v = calloc(m, sizeof *v);
    if (!v)
        return -ENOMEM;
    for (unsigned i = 0; i < m && r >= 0; i++) {
        uint64_t t0 = now_ns();
        r = pool_exec_true(c, &s[0], why, sizeof why);
        v[i] = now_ns() - t0;
    }
    if (r < 0) {
        fail(b, "exec: %s", why);
        return r;
    }
    qsort(v, m, sizeof *v, cmp_u64);
    (void)snprintf(l, sizeof l, "exec [\"true\"] p50 with %u sandboxes in the host (%ld fds)",
                   b->idle_n + CREATE_CHUNK, fd2);
    fig(l, (double)percentile(v, m, 50) / 1e6, "ms",
        b->exec_p50_ns ? "(section 3 had 1 sandbox)" : NULL);
    if (b->exec_p50_ns)
        fig("  ratio to the p50 of section 3",
            (double)percentile(v, m, 50) / (double)b->exec_p50_ns, "x", NULL);
    return 0;
}

static void idle_report(bench_t *b, uint64_t rss0, uint64_t rss1, uint64_t slab0, uint64_t slab1,
                        long fd0, long fd1)
{
    unsigned n = b->idle_n;
    char note[96];
    double per = ((double)rss1 - (double)rss0) / n;
    fig("server VmRSS before", (double)rss0 / MIB, "MiB", NULL);
    fig("server VmRSS with them", (double)rss1 / MIB, "MiB", NULL);
    fig("server VmRSS per idle sandbox", per / KIB, "KiB",
        target_note(per <= 50 * KIB, "<= 50 KB", note, sizeof note));
    if (fd0 >= 0 && fd1 >= 0)
        fig("server descriptors per idle sandbox", (double)(fd1 - fd0) / n, "",
            "(its network namespace; home + ruleset: the 1,024 used last)");
    fig("kernel slab per idle sandbox (system-wide delta, approximate)",
        ((double)slab1 - (double)slab0) / n / KIB, "KiB",
        "(home inodes and dentries, ruleset, open files)");
    long homes = count_homes(b->homes);
    if (homes >= 0)
        fig_count("homes on disk", (unsigned long long)homes, NULL);
}

/* A client and room for a chunk of sandbox references; -errno (counted as a failure). */
static int open_chunk(bench_t *b, client_t *c, sbref_t **ret)
{
    sbref_t *s = calloc(CREATE_CHUNK, sizeof *s);
    int r = s ? client_open(c, b->port) : -ENOMEM;
    if (r < 0) {
        fail(b, "connect: %s", strerror(-r));
        free(s);
        return r;
    }
    *ret = s;
    return 0;
}

static void bench_idle(bench_t *b)
{
    unsigned n = b->idle_n, total = n + CREATE_CHUNK, k = b->quick ? 50 : 200;
    char hdr[200], why[320], l[128];
    (void)snprintf(hdr, sizeof hdr,
                   "4. memory per idle sandbox: the server's VmRSS, descriptors and the kernel's "
                   "slab with %u sandboxes and with %u more (requests of %u)",
                   CREATE_CHUNK, n, CREATE_CHUNK);
    section(hdr);
    client_t c;
    _cleanup_free_ sbref_t *s = NULL;
    int r = open_chunk(b, &c, &s);
    if (r < 0)
        return;
    /* A first chunk, kept, so the allocator has grown for responses this size already. */
    unsigned got = 0, made = 0;
    r = pool_create(&c, b->token, CREATE_CHUNK, s, &got, why, sizeof why);
    uint64_t rss0 = server_rss(b->pid), slab0 = kernel_slab();
    long fd0 = server_fds(b->pid);
    uint64_t c0 = server_cpu_ns(b->pid), t0 = now_ns();
    while (r >= 0 && made < n) {
        r = pool_create(&c, b->token, MIN(CREATE_CHUNK, n - made), s, &got, why, sizeof why);
        made += r >= 0 ? got : 0;
    }
    uint64_t c1 = server_cpu_ns(b->pid), t1 = now_ns();
    if (r < 0) {
        fail(b, "create: %s (after %u)", why, made);
        (void)pool_delete_all(&c, b->token, 0, why, sizeof why);
        client_close(&c);
        return;
    }
    idle_report(b, rss0, server_rss(b->pid), slab0, kernel_slab(), fd0, server_fds(b->pid));
    per_item("create, in requests of 500", c1 - c0, t1 - t0, n, NULL);
    (void)idle_then_exec(b, &c, s, MIN(got, k), server_fds(b->pid));
    uint64_t c2 = server_cpu_ns(b->pid), t2 = now_ns();
    r = pool_delete_all(&c, b->token, total, why, sizeof why);
    uint64_t c3 = server_cpu_ns(b->pid), t3 = now_ns();
    (void)snprintf(l, sizeof l, "DELETE /v1/sandboxes (%u, %u of them after an exec)", total,
                   MIN(got, k));
    if (r < 0)
        fail(b, "%s", why);
    else
        per_item(l, c3 - c2, t3 - t2, total, NULL);
    fig("server VmRSS after deleting them", (double)server_rss(b->pid) / MIB, "MiB", NULL);
    client_close(&c);
}

/* ---- 5. scale ------------------------------------------------------------------------------ */

/* One pool host in section 5: a client, a live sandbox to exec in, and what its samples
 * measured. */
typedef struct {
    const char *name;
    uint16_t port;
    pid_t pid;
    client_t c;
    sbref_t live;
    uint64_t *cr, *ex;             /* k each: create and exec p50 samples (ns) */
    uint64_t create_cpu, tree_cpu; /* the server's own during creates; it and its helpers' */
} scale_host_t;

/* One sample: create a sandbox (timed, and the server's CPU during it), exec ["true"] in the
 * live one (timed), delete the new one; into slot i, or nothing for a warm-up (i < 0). */
static int scale_one(bench_t *b, scale_host_t *h, long i, char *why, size_t wcap)
{
    sbref_t one;
    unsigned got = 0;
    uint64_t s0 = server_cpu_ns(h->pid), t0 = now_ns();
    int r = pool_create(&h->c, b->token, 1, &one, &got, why, wcap);
    uint64_t t1 = now_ns(), s1 = server_cpu_ns(h->pid);
    if (r >= 0 && got != 1) {
        (void)snprintf(why, wcap, "%s: a create of one made %u", h->name, got);
        r = -ENOSPC;
    }
    if (r >= 0)
        r = pool_exec_true(&h->c, &h->live, why, wcap);
    uint64_t t2 = now_ns();
    if (r >= 0)
        r = pool_delete(&h->c, &one, why, wcap);
    if (r >= 0 && i >= 0) {
        h->create_cpu += s1 - s0;
        h->cr[i] = t1 - t0;
        h->ex[i] = t2 - t1;
    }
    return r;
}

/* warm untimed and then k timed samples on each of the n hosts, taking turns (who goes first
 * alternates), so that this VM's drifting speed gives them the same conditions. Each host's
 * CPU, its helpers' included, is counted from its first timed sample until what its deletes
 * left to do is done (settle): only its own samples give it work. */
static int scale_turns(bench_t *b, scale_host_t *h, unsigned n, unsigned warm, unsigned k,
                       char *why, size_t wcap)
{
    uint64_t tree0[2] = { 0 };
    for (unsigned j = 0; j < n; j++) {
        h[j].create_cpu = 0;
        settle(&h[j].c, b->token); /* not while a warm set fills */
    }
    for (unsigned i = 0; i < warm + k; i++) {
        if (i == warm)
            for (unsigned j = 0; j < n; j++)
                tree0[j] = server_tree_cpu_ns(h[j].pid);
        for (unsigned t = 0; t < n; t++) {
            scale_host_t *x = &h[i % 2 ? n - 1 - t : t];
            int r = scale_one(b, x, i < warm ? -1 : (long)(i - warm), why, wcap);
            if (r < 0)
                return r;
        }
    }
    for (unsigned j = 0; j < n; j++) {
        settle(&h[j].c, b->token);
        h[j].tree_cpu = server_tree_cpu_ns(h[j].pid) - tree0[j];
    }
    return 0;
}

/* After scale_turns: each figure of host 2 (h[1], 10 live) and of host 1 (h[0], with live
 * sandboxes), and host 1's as a ratio of host 2's; into ratio[4] and, with aa (the ratios
 * with 10 live on both), beside them. */
static void scale_report(const scale_host_t *h, unsigned k, unsigned live, const double *aa,
                         double *ratio)
{
    char l[128], note[96];
    uint64_t p[2][2];
    for (int j = 0; j < 2; j++) {
        qsort(h[j].cr, k, sizeof *h[j].cr, cmp_u64);
        qsort(h[j].ex, k, sizeof *h[j].ex, cmp_u64);
        p[j][0] = percentile(h[j].cr, k, 50);
        p[j][1] = percentile(h[j].ex, k, 50);
    }
    static const char *const what[4] = { "create p50", "exec true p50", "server CPU per create",
                                         "server+helpers CPU per sample" };
    for (int w = 0; w < 4; w++) {
        double v[2];
        for (int j = 0; j < 2; j++)
            v[j] = w < 2    ? (double)p[j][w] / 1e6
                   : w == 2 ? (double)h[j].create_cpu / k / 1e3
                            : (double)h[j].tree_cpu / k / 1e3;
        const char *unit = w < 2 ? "ms" : "us";
        ratio[w] = v[0] / v[1];
        (void)snprintf(l, sizeof l, "%s, host 2 (10 live)", what[w]);
        fig(l, v[1], unit, NULL);
        (void)snprintf(l, sizeof l, "%s, host 1 (%u live)", what[w], live);
        if (aa)
            (void)snprintf(note, sizeof note, "%.2fx of host 2 (with 10 live: %.2fx)", ratio[w],
                           aa[w]);
        else
            (void)snprintf(note, sizeof note, "%.2fx of host 2", ratio[w]);
        fig(l, v[0], unit, note);
    }
}

/* Create and exec with 10,000 live against 10 live: a host filled to 10,000 and a second host
 * with 10 take turns, sample by sample. First both have 10 live (the same comparison with
 * nothing different: the harness's own spread and any difference between the two hosts), then
 * the first is filled and they take turns again. The kernel is the same for both: what 10,000
 * sandboxes cost it (slab, namespaces) shows in both hosts' figures, here and in the figure of
 * 10 live before the fill. */
static void bench_scale(bench_t *b)
{
    unsigned big = b->scale_n, k = b->quick ? 50 : 400, warm = b->quick ? 20 : 200, small = 10;
    char hdr[400], why[320];
    (void)snprintf(hdr, sizeof hdr,
                   "5. scale: create and exec [\"true\"] with %u live sandboxes against %u: host 1 "
                   "filled to %u and host 2 with %u take turns,\n   sample by sample (%u each "
                   "after %u untimed, one client); first both with %u live, then after the fill",
                   big, small, big, small, k, warm, small);
    section(hdr);
    if (!b->small_port) {
        fail(b, "scale: needs the second host (--small-port, --small-pid)");
        return;
    }
    scale_host_t h[2] = { { .name = "host 1", .port = b->port, .pid = b->pid },
                          { .name = "host 2", .port = b->small_port, .pid = b->small_pid } };
    _cleanup_free_ sbref_t *s = calloc(CREATE_CHUNK, sizeof *s);
    _cleanup_free_ uint64_t *v = calloc(4 * (size_t)k, sizeof *v);
    int r = s && v ? 0 : -ENOMEM;
    unsigned opened = 0;
    for (; r >= 0 && opened < 2; opened++)
        r = client_open(&h[opened].c, h[opened].port);
    if (r < 0) {
        fail(b, "scale: %s", strerror(-r));
        for (unsigned j = 0; j + 1 < opened; j++)
            client_close(&h[j].c);
        return;
    }
    for (unsigned j = 0; j < 2; j++) {
        h[j].cr = v + (2 * j) * k;
        h[j].ex = v + (2 * j + 1) * k;
    }
    unsigned got = 0, made = 0;
    for (unsigned j = 0; j < 2 && r >= 0; j++) {
        r = pool_create(&h[j].c, b->token, small, s, &got, why, sizeof why);
        h[j].live = s[0];
        if (r >= 0 && got != small) {
            (void)snprintf(why, sizeof why, "%s: %u of %u made", h[j].name, got, small);
            r = -ENOSPC;
        }
    }
    made = small;
    if (r >= 0)
        r = scale_turns(b, h, 2, warm, k, why, sizeof why);
    double aa[4], ratio[4];
    if (r >= 0) {
        printf("  both with %u live (the same comparison with nothing different):\n", small);
        scale_report(h, k, small, NULL, aa);
    }
    while (r >= 0 && made < big) {
        r = pool_create(&h[0].c, b->token, MIN(CREATE_CHUNK, big - made), s, &got, why, sizeof why);
        made += r >= 0 ? got : 0;
        if (r >= 0 && got == 0) {
            (void)snprintf(why, sizeof why, "the filled host is full at %u", made);
            r = -ENOSPC;
        }
    }
    if (r >= 0)
        r = scale_turns(b, h, 2, warm, k, why, sizeof why);
    if (r >= 0) {
        printf("  host 1 filled to %u live:\n", made);
        scale_report(h, k, made, aa, ratio);
    } else {
        fail(b, "scale: %s (with %u live)", why, made);
    }
    for (unsigned j = 0; j < 2; j++) {
        if (pool_delete_all(&h[j].c, b->token, 0, why, sizeof why) < 0)
            fail(b, "%s", why);
        client_close(&h[j].c);
    }
}

/* ---- main -------------------------------------------------------------------------------- */

static const char *fs_name(unsigned long magic)
{
    switch (magic) {
    case 0xEF53: return "ext2/3/4";
    case 0x01021994: return "tmpfs";
    case 0x9123683E: return "btrfs";
    case 0x58465342: return "xfs";
    case 0x794C7630: return "overlayfs";
    default: return "another filesystem";
    }
}

/* Nothing may be left: no sandbox in the registry, no home on disk. */
static void check_empty(bench_t *b)
{
    client_t c;
    char why[320];
    int r = client_open(&c, b->port);
    if (r >= 0)
        r = health(&c, b->token, why, sizeof why);
    else
        (void)snprintf(why, sizeof why, "connect: %s", strerror(-r));
    if (r < 0)
        fail(b, "GET /health at the end: %s", why);
    else if (!strstr(c.body.p, "\"sandboxes\":0"))
        fail(b, "sandboxes left at the end: %.300s", c.body.p);
    if (r >= 0 && !strstr(c.body.p, "\"quarantined\":0"))
        fail(b, "quarantined uids at the end (a teardown did not converge): %.300s", c.body.p);
    long homes = count_homes(b->homes);
    if (homes != 0)
        fail(b, "%ld homes left in %s", homes, b->homes);
    client_close(&c);
}

static void usage(void)
{
    fprintf(stderr,
            "usage: bench-pool --port N --pid PID --homes DIR [--quick] [--awake] [--only LIST]\n"
            "                  [--dedicated-port N --dedicated-pid PID]\n"
            "                  [--small-port N --small-pid PID]   (a second pool host, section 5)\n"
            "       bench-pool --free-port\n"
            "LIST: trio,cost,exec,idle,scale. The host token comes from $SBX_BENCH_TOKEN (a\n"
            "dedicated-mode server given for a baseline uses the same token).\n"
            "Usually run through "
            "scripts/bench-pool.sh, which starts the server.\n");
}

static int parse_args(bench_t *b, int argc, char **argv)
{
    uint64_t v;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (streq(a, "--quick"))
            b->quick = true;
        else if (streq(a, "--awake"))
            b->awake = true;
        else if (streq(a, "--port") && val && parse_u64_str(val, 65535, &v) >= 0 && v > 0)
            b->port = (uint16_t)v, i++;
        else if (streq(a, "--pid") && val && parse_u64_str(val, INT32_MAX, &v) >= 0 && v > 0)
            b->pid = (pid_t)v, i++;
        else if (streq(a, "--homes") && val)
            b->homes = val, i++;
        else if (streq(a, "--only") && val)
            b->only = val, i++;
        else if (streq(a, "--scale") && val && parse_u64_str(val, 100000, &v) >= 0 && v >= 20)
            b->scale_n = (unsigned)v, i++;
        else if (streq(a, "--dedicated-port") && val && parse_u64_str(val, 65535, &v) >= 0 && v)
            b->ded_port = (uint16_t)v, i++;
        else if (streq(a, "--dedicated-pid") && val && parse_u64_str(val, INT32_MAX, &v) >= 0 &&
                 v > 0)
            b->ded_pid = (pid_t)v, i++;
        else if (streq(a, "--small-port") && val && parse_u64_str(val, 65535, &v) >= 0 && v)
            b->small_port = (uint16_t)v, i++;
        else if (streq(a, "--small-pid") && val && parse_u64_str(val, INT32_MAX, &v) >= 0 && v > 0)
            b->small_pid = (pid_t)v, i++;
        else
            return -EINVAL;
    }
    b->token = getenv("SBX_BENCH_TOKEN");
    if (!b->port || !b->pid || !b->homes || !b->token || !*b->token ||
        (b->ded_port && !b->ded_pid) || (b->small_port && !b->small_pid))
        return -EINVAL;
    b->trio_n = b->quick ? 100 : 1000;
    b->batch_n = b->quick ? 100 : 1000;
    b->exec_n = b->quick ? 100 : 1000;
    b->idle_n = b->quick ? 1000 : 5000;
    if (!b->scale_n)
        b->scale_n = b->quick ? 300 : 10000;
    b->warmup = b->quick ? 5 : 20;
    return 0;
}

/* --awake: a child per CPU that spins at SCHED_IDLE (it runs only when nothing else would,
 * and keeps its CPU from halting), gone with the bench. */
static void keep_cpus_awake(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    pid_t parent = getpid();
    for (long i = 0; i < n; i++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("bench-pool: fork");
            return;
        }
        if (pid > 0)
            continue;
        struct sched_param sp = { 0 };
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent ||
            sched_setscheduler(0, SCHED_IDLE, &sp) < 0)
            _exit(1);
        for (;;)
            __asm__ volatile("" ::: "memory");
    }
    printf("--awake: %ld busy loops at SCHED_IDLE keep the CPUs from halting (a diagnosis: "
           "every figure includes them)\n",
           n);
}

int main(int argc, char **argv)
{
    bench_t b = { 0 };
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 2 && streq(argv[1], "--free-port"))
        return free_port();
    if (parse_args(&b, argc, argv) < 0) {
        usage();
        return 2;
    }
    struct utsname u;
    (void)uname(&u);
    printf("sbx-server pool-host benchmark%s: %ld CPUs, Linux %s, server pid %d, port %u\n",
           b.quick ? " (--quick: small sizes, a CI smoke run)" : "", sysconf(_SC_NPROCESSORS_ONLN),
           u.release, (int)b.pid, b.port);
    printf("bench command:");
    for (int i = 0; i < argc; i++)
        printf(" %s", argv[i]);
    printf("\nfigures only; nothing here asserts on timings (exit 1 = a functional failure)\n");
    struct statfs sf;
    if (statfs(b.homes, &sf) == 0)
        printf("homes: %s on %s\n", b.homes, fs_name((unsigned long)sf.f_type));
    print_loadavg("at start");
    if (b.awake)
        keep_cpus_awake();
    if (bench_want(b.only, "trio"))
        bench_trios(&b);
    if (bench_want(b.only, "cost"))
        bench_server_cost(&b);
    if (bench_want(b.only, "exec")) {
        bench_exec(&b);
        bench_exec_concurrent(&b);
    }
    if (bench_want(b.only, "idle"))
        bench_idle(&b);
    if (bench_want(b.only, "scale"))
        bench_scale(&b);
    check_empty(&b);
    print_loadavg("at end");
    printf("\n%s: %u functional failure%s\n", b.failures ? "FAILED" : "done", b.failures,
           b.failures == 1 ? "" : "s");
    return b.failures ? 1 : 0;
}
