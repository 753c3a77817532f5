/* SPDX-License-Identifier: MIT */
/* bench-libsbx: pooled sandboxes through the whole platform, beside the same work through a
 * pool host's agent directly and beside a bare spawn loop, all in one run.
 *
 *   1. cold starts: a dedicated sandbox (create until RUNNING, then its first exec), and the
 *      first sandbox of an empty pool (its host booted on demand, then the first exec);
 *   2. N trios (create 1 sandbox, exec `true` in it, delete it) from T threads:
 *      a. baseline: posix_spawn of /bin/true + waitpid (the trio's floor: one process);
 *      b. direct: the same trio against a pool-host sbx-server on loopback (plain HTTP, one
 *         kept connection per thread, libsbx's own HTTP client);
 *      c. full path: libsbx -> sbx-control (TLS, edge) -> sbx-node -> the pool host's agent,
 *         one client per thread (sbx_pool_sandboxes_create, sbx_exec, sbx_sandbox_kill).
 *      Targets (issue 11): full within 2x of direct, direct within 1.5x of the spawn loop.
 *      Beside each, the CPU time per trio of each kind of sbx process on the machine (all
 *      their threads, from /proc/<pid>/task/<tid>/schedstat), so a change shows where it
 *      saved or spent.
 *
 * Figures only: the exit status is 1 only on a functional failure (a refused call, an exit
 * code other than 0). Run through scripts/bench-libsbx.sh, which starts `sbx up` (SBX_HOME)
 * and the direct host (SBX_BENCH_DIRECT_PORT, SBX_BENCH_DIRECT_TOKEN). */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lib/internal.h"

extern char **environ;

#define MAX_THREADS 16

typedef struct {
    unsigned n, threads;
    const char *direct_port, *direct_token;
    const char *pool;
    atomic_uint failures;
    atomic_uint_fast64_t phase_ns[3]; /* create, exec, delete: summed over threads */
} bench_t;

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void figure(const char *label, double v, const char *unit, const char *note)
{
    printf("  %-52s %12.3f %-6s %s\n", label, v, unit, note ? note : "");
}

static void fail(bench_t *b, const char *what, const char *msg)
{
    atomic_fetch_add(&b->failures, 1);
    fprintf(stderr, "bench-libsbx: %s: %s\n", what, msg);
}

/* ---- cold starts ---------------------------------------------------------------------------- */

static void cold_starts(bench_t *b)
{
    printf("\n== cold starts\n");
    sbx_client_t *c;
    sbx_error_t e;
    if (sbx_client_new(NULL, &c, &e) < 0) {
        fail(b, "client", e.message);
        return;
    }
    sbx_exec_opts_t t = { .argv = (const char *const[]){ "true", NULL } };
    sbx_exec_result_t res;
    uint64_t t0 = mono_ns();
    sbx_sandbox_t *s;
    if (sbx_sandbox_create(c, NULL, &s, &e) < 0) {
        fail(b, "dedicated create", e.message);
    } else {
        uint64_t t1 = mono_ns();
        if (sbx_exec(s, &t, &res, &e) < 0 || res.exit_code != 0)
            fail(b, "dedicated exec", e.message);
        uint64_t t2 = mono_ns();
        figure("dedicated sandbox: create until RUNNING", (double)(t1 - t0) / 1e6, "ms", NULL);
        figure("dedicated sandbox: create + first exec of true", (double)(t2 - t0) / 1e6, "ms",
               NULL);
        (void)sbx_sandbox_kill(s, &e);
        sbx_sandbox_free(s);
    }
    sbx_pool_opts_t po;
    sbx_pool_opts_init(&po);
    po.name = b->pool;
    po.per_host = 64;
    po.max_hosts = 1;
    /* two CPUs, as the direct host has: the default (cpu-small) caps the pool host's run, and
     * every command of its sandboxes, at half a CPU */
    po.flavor = "cpu-large";
    if (sbx_pool_create(c, &po, NULL, &e) < 0) {
        fail(b, "pool create", e.message);
        sbx_client_free(c);
        return;
    }
    t0 = mono_ns();
    sbx_sandbox_t **list;
    size_t n;
    if (sbx_pool_sandboxes_create(c, b->pool, NULL, &list, &n, NULL, &e) < 0) {
        fail(b, "first pooled sandbox", e.message);
    } else {
        uint64_t t1 = mono_ns();
        if (sbx_exec(list[0], &t, &res, &e) < 0 || res.exit_code != 0)
            fail(b, "first pooled exec", e.message);
        uint64_t t2 = mono_ns();
        figure("empty pool: first sandbox (its host booted)", (double)(t1 - t0) / 1e6, "ms", NULL);
        figure("empty pool: first sandbox + first exec of true", (double)(t2 - t0) / 1e6, "ms",
               NULL);
        (void)sbx_sandbox_kill(list[0], &e);
        sbx_sandbox_list_free(list, n);
    }
    sbx_client_free(c);
}

/* ---- CPU per process kind ------------------------------------------------------------------ */

/* The kinds of sbx process whose CPU a phase is charged, by comm; the pool host's agent is its
 * server and its helpers (both pool hosts: the direct one idles while the full path runs, and
 * the other is not started until then). */
enum {
    CPU_CONTROL,
    CPU_NODE,
    CPU_SERVER,
    CPU_SPAWNER,
    CPU_JANITOR,
    CPU_REMOVER,
    CPU_BENCH,
    CPU__MAX
};
static const char *const cpu_names[CPU__MAX] = { "sbx-control",
                                                 "sbx-node",
                                                 "pool host: sbx-server",
                                                 "pool host: sbx-spawner",
                                                 "pool host: sbx-janitor",
                                                 "pool host: sbx-remover",
                                                 "this bench (its clients)" };

static int cpu_kind(const char *comm)
{
    if (strcmp(comm, "sbx-control") == 0)
        return CPU_CONTROL;
    if (strcmp(comm, "sbx-node") == 0)
        return CPU_NODE;
    if (strcmp(comm, "sbx-server") == 0)
        return CPU_SERVER;
    if (strcmp(comm, "sbx-spawner") == 0)
        return CPU_SPAWNER;
    if (strcmp(comm, "sbx-janitor") == 0)
        return CPU_JANITOR;
    if (strcmp(comm, "sbx-remover") == 0)
        return CPU_REMOVER;
    return -1;
}

/* ns on a CPU of every thread of pid (schedstat's first field), added to *sum. */
static void task_cpu(const char *pid, uint64_t *sum)
{
    char path[64];
    (void)snprintf(path, sizeof path, "/proc/%.16s/task", pid);
    DIR *d = opendir(path);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        (void)snprintf(path, sizeof path, "/proc/%.16s/task/%.16s/schedstat", pid, de->d_name);
        FILE *f = fopen(path, "re");
        unsigned long long ns;
        if (f && fscanf(f, "%llu", &ns) == 1)
            *sum += ns;
        if (f)
            fclose(f);
    }
    closedir(d);
}

static void cpu_snapshot(uint64_t out[CPU__MAX])
{
    memset(out, 0, sizeof(uint64_t) * CPU__MAX);
    DIR *d = opendir("/proc");
    if (!d)
        return;
    struct dirent *de;
    char self[16];
    (void)snprintf(self, sizeof self, "%d", (int)getpid());
    while ((de = readdir(d))) {
        if (de->d_name[0] < '1' || de->d_name[0] > '9')
            continue;
        if (strcmp(de->d_name, self) == 0)
            continue;
        char path[64], comm[32] = "";
        (void)snprintf(path, sizeof path, "/proc/%.16s/comm", de->d_name);
        FILE *f = fopen(path, "re");
        if (!f)
            continue;
        if (fgets(comm, sizeof comm, f))
            comm[strcspn(comm, "\n")] = 0;
        fclose(f);
        int k = cpu_kind(comm);
        if (k >= 0)
            task_cpu(de->d_name, &out[k]);
    }
    closedir(d);
    /* this process's threads are gone when a phase ends: its usage counts them */
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0)
        out[CPU_BENCH] =
            ((uint64_t)ru.ru_utime.tv_sec + (uint64_t)ru.ru_stime.tv_sec) * 1000000000u +
            ((uint64_t)ru.ru_utime.tv_usec + (uint64_t)ru.ru_stime.tv_usec) * 1000u;
}

/* CPU per trio of each kind between two snapshots (a process that exited meanwhile is not
 * counted: none of these do during a phase). */
static void print_cpu(bench_t *b, const char *who, const uint64_t a[CPU__MAX],
                      const uint64_t z[CPU__MAX])
{
    for (int k = 0; k < CPU__MAX; k++) {
        if (z[k] <= a[k])
            continue;
        char label[96];
        (void)snprintf(label, sizeof label, "  %s: CPU per trio, %s", who, cpu_names[k]);
        figure(label, (double)(z[k] - a[k]) / b->n / 1e3, "us", NULL);
    }
}

/* ---- trios ---------------------------------------------------------------------------------- */

typedef struct {
    bench_t *b;
    unsigned count;
    int kind; /* 0 spawn, 1 direct, 2 full */
} worker_t;

static void phases(bench_t *b, uint64_t t0, uint64_t t1, uint64_t t2, uint64_t t3)
{
    atomic_fetch_add(&b->phase_ns[0], t1 - t0);
    atomic_fetch_add(&b->phase_ns[1], t2 - t1);
    atomic_fetch_add(&b->phase_ns[2], t3 - t2);
}

/* Mean latency of each phase of the last kind run, then reset. */
static void print_phases(bench_t *b, const char *who)
{
    static const char *names[] = { "create", "exec true", "delete" };
    for (int i = 0; i < 3; i++) {
        char label[80];
        (void)snprintf(label, sizeof label, "  %s: %s, mean latency", who, names[i]);
        figure(label, (double)atomic_exchange(&b->phase_ns[i], 0) / b->n / 1e6, "ms", NULL);
    }
}

static void spawn_trios(worker_t *w)
{
    char *argv[] = { "/bin/true", NULL };
    for (unsigned i = 0; i < w->count; i++) {
        pid_t pid;
        int st;
        if (posix_spawn(&pid, "/bin/true", NULL, NULL, argv, environ) != 0 ||
            waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            fail(w->b, "spawn", "posix_spawn of /bin/true failed");
    }
}

static int direct_call(http_conn_t *hc, const char *method, const char *target, const char *token,
                       const char *body, http_resp_t *ret, bench_t *b)
{
    char hdr[160];
    (void)snprintf(hdr, sizeof hdr, "X-Sandbox-Token: %s\r\n", token);
    http_req_t rq = { .method = method,
                      .target = target,
                      .headers = hdr,
                      .content_type = body ? "application/json" : NULL,
                      .body = body,
                      .body_len = body ? strlen(body) : 0,
                      .body_fd = -1 };
    sbx_err_t err;
    int r = http_do(hc, &rq, ret, &err);
    if (r < 0 || ret->status != 200) {
        fail(b, target, r < 0 ? err.msg : ret->body);
        if (r >= 0)
            http_resp_free(ret);
        return -EIO;
    }
    return 0;
}

static void direct_trios(worker_t *w)
{
    char endpoint[64];
    (void)snprintf(endpoint, sizeof endpoint, "http://127.0.0.1:%s", w->b->direct_port);
    http_conn_t hc;
    sbx_err_t err;
    if (http_conn_init(&hc, endpoint, NULL, 0, &err) < 0) {
        fail(w->b, "direct", err.msg);
        return;
    }
    for (unsigned i = 0; i < w->count; i++) {
        http_resp_t r;
        uint64_t t0 = mono_ns();
        if (direct_call(&hc, "POST", "/v1/sandboxes", w->b->direct_token, "{\"count\":1}", &r,
                        w->b) < 0)
            break;
        json_t *j = json_loadb(r.body, r.body_len, 0, NULL);
        http_resp_free(&r);
        json_t *sb = json_array_get(json_object_get(j, "sandboxes"), 0);
        const char *id = json_string_value(json_object_get(sb, "id"));
        const char *tok = json_string_value(json_object_get(sb, "token"));
        if (!id || !tok) {
            fail(w->b, "direct create", "no sandbox in the answer");
            json_decref(j);
            break;
        }
        char target[128];
        (void)snprintf(target, sizeof target, "/v1/sandboxes/%s/exec", id);
        uint64_t t1 = mono_ns();
        if (direct_call(&hc, "POST", target, tok, "{\"cmd\":[\"/bin/true\"]}", &r, w->b) == 0) {
            if (!strstr(r.body, "\"exit_code\":0"))
                fail(w->b, "direct exec", r.body);
            http_resp_free(&r);
        }
        (void)snprintf(target, sizeof target, "/v1/sandboxes/%s", id);
        uint64_t t2 = mono_ns();
        if (direct_call(&hc, "DELETE", target, tok, NULL, &r, w->b) == 0)
            http_resp_free(&r);
        phases(w->b, t0, t1, t2, mono_ns());
        json_decref(j);
    }
    http_conn_done(&hc);
}

static void full_trios(worker_t *w)
{
    sbx_client_t *c;
    sbx_error_t e;
    if (sbx_client_new(NULL, &c, &e) < 0) {
        fail(w->b, "client", e.message);
        return;
    }
    /* the program the spawn loop runs, by the same path (no search along PATH) */
    sbx_exec_opts_t t = { .argv = (const char *const[]){ "/bin/true", NULL } };
    for (unsigned i = 0; i < w->count; i++) {
        sbx_sandbox_t **list;
        size_t n;
        uint64_t t0 = mono_ns();
        if (sbx_pool_sandboxes_create(c, w->b->pool, NULL, &list, &n, NULL, &e) < 0) {
            fail(w->b, "full create", e.message);
            break;
        }
        sbx_exec_result_t res;
        uint64_t t1 = mono_ns();
        if (sbx_exec(list[0], &t, &res, &e) < 0 || res.exit_code != 0)
            fail(w->b, "full exec", e.message);
        uint64_t t2 = mono_ns();
        if (sbx_sandbox_kill(list[0], &e) < 0)
            fail(w->b, "full delete", e.message);
        phases(w->b, t0, t1, t2, mono_ns());
        sbx_sandbox_list_free(list, n);
    }
    sbx_client_free(c);
}

static void *worker(void *arg)
{
    worker_t *w = arg;
    if (w->kind == 0)
        spawn_trios(w);
    else if (w->kind == 1)
        direct_trios(w);
    else
        full_trios(w);
    return NULL;
}

/* Run kind over N trios from T threads; wall seconds. */
static double trios(bench_t *b, int kind)
{
    pthread_t th[MAX_THREADS];
    worker_t w[MAX_THREADS];
    uint64_t t0 = mono_ns();
    for (unsigned i = 0; i < b->threads; i++) {
        w[i] = (worker_t){ .b = b,
                           .count = b->n / b->threads + (i < b->n % b->threads),
                           .kind = kind };
        if (pthread_create(&th[i], NULL, worker, &w[i]) != 0)
            abort();
    }
    for (unsigned i = 0; i < b->threads; i++)
        (void)pthread_join(th[i], NULL);
    return (double)(mono_ns() - t0) / 1e9;
}

static unsigned parse_count(const char *s, unsigned max)
{
    unsigned v = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > max / 10)
            return 0;
        v = v * 10 + (unsigned)(*s - '0');
    }
    return v <= max ? v : 0;
}

int main(int argc, char **argv)
{
    bench_t b = { .n = 1000, .threads = 4 };
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            b.n = 100;
        } else if (strcmp(argv[i], "--n") == 0 && i + 1 < argc) {
            b.n = parse_count(argv[++i], 1000000);
        } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            b.threads = parse_count(argv[++i], MAX_THREADS);
        } else {
            fprintf(stderr, "usage: bench-libsbx [--quick] [--n N] [--threads T]\n");
            return 2;
        }
    }
    b.direct_port = getenv("SBX_BENCH_DIRECT_PORT");
    b.direct_token = getenv("SBX_BENCH_DIRECT_TOKEN");
    if (!b.n || !b.threads || !b.direct_port || !b.direct_token) {
        fprintf(stderr, "bench-libsbx: run it through scripts/bench-libsbx.sh\n");
        return 2;
    }
    char pool[32];
    (void)snprintf(pool, sizeof pool, "bench-%d", (int)getpid());
    b.pool = pool;
    cold_starts(&b);
    printf("\n== %u trios (create 1 sandbox, exec true, delete), %u threads\n", b.n, b.threads);
    double spawn = trios(&b, 0);
    figure("baseline: posix_spawn /bin/true + waitpid", spawn / b.n * 1e6, "us/op", NULL);
    uint64_t c0[CPU__MAX], c1[CPU__MAX], c2[CPU__MAX];
    cpu_snapshot(c0);
    double direct = trios(&b, 1);
    cpu_snapshot(c1);
    figure("direct: pool host agent (HTTP, loopback)", direct / b.n * 1e6, "us/op", NULL);
    print_phases(&b, "direct");
    print_cpu(&b, "direct", c0, c1);
    cpu_snapshot(c1);
    double full = trios(&b, 2);
    cpu_snapshot(c2);
    figure("full path: libsbx -> control -> node -> pool host", full / b.n * 1e6, "us/op", NULL);
    print_phases(&b, "full path");
    print_cpu(&b, "full path", c1, c2);
    figure("full path throughput", b.n / full, "ops/s", NULL);
    char note[64];
    (void)snprintf(note, sizeof note, "target <= 2: %s", full / direct <= 2 ? "met" : "MISSED");
    figure("full path / direct", full / direct, "x", note);
    (void)snprintf(note, sizeof note, "target <= 1.5: %s",
                   direct / spawn <= 1.5 ? "met" : "MISSED");
    figure("direct / spawn loop", direct / spawn, "x", note);
    sbx_client_t *c;
    sbx_error_t e;
    if (sbx_client_new(NULL, &c, &e) == 0) {
        (void)sbx_pool_delete(c, pool, &e);
        sbx_client_free(c);
    }
    unsigned f = atomic_load(&b.failures);
    if (f)
        fprintf(stderr, "bench-libsbx: %u functional failures\n", f);
    return f ? 1 : 0;
}
