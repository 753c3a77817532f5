/* SPDX-License-Identifier: MIT */
/* libsbx exercised directly, against a real platform (tests/integration/test_libsbx.py starts
 * it and points SBX_HOME at its client configuration). Each scenario asserts as it goes and
 * prints both sides of a failed check; exit 0 only when every check passed.
 *
 *   libsbx-check dedicated          create, exec (streams, codes, binary bytes), files,
 *                                   processes, proxy URL, kill; prints "id <ID>" first
 *   libsbx-check create TEXT        create one sandbox, write TEXT to /tmp/mark, print its id
 *   libsbx-check reconnect ID TEXT  a fresh process: connect(ID) with only the API token, read
 *                                   /tmp/mark (must be TEXT), exec in it
 *   libsbx-check errors             bad input: unknown ids, bad image, bad labels, bad endpoint
 *   libsbx-check pool NAME          a pool: create, sandboxes, exec/files in them, delete
 *   libsbx-check pool-proxy NAME    a pool with one sandbox whose service listens on its proxy
 *                                   socket for port 8080; prints sbx_sandbox_proxy's "url <URL>"
 *                                   and "header <LINE>"s (the test requests them, then deletes
 *                                   the pool)
 *   libsbx-check options SECRET     a dedicated create with env, a secret (SECRET) and an idle
 *                                   timeout of an hour: the command sees env and secret, the
 *                                   job record and listing never hold the secret; prints
 *                                   "id <ID>"; then one with an idle timeout of 2 s, left to
 *                                   exit on its own: prints "idle <ID>"
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sbx/sbx.h"

static int failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)
#define OK(call, e)                                                                                \
    do {                                                                                           \
        int _r = (call);                                                                           \
        CHECK(_r >= 0, "%s -> %d: %s", #call, _r, (e).message);                                    \
        if (_r < 0)                                                                                \
            return 1;                                                                              \
    } while (0)

typedef struct {
    char *data;
    size_t len;
} out_t;

static void collect(const void *d, size_t n, void *ud)
{
    out_t *o = ud;
    char *nb = realloc(o->data, o->len + n + 1);
    if (!nb)
        abort();
    memcpy(nb + o->len, d, n);
    o->data = nb;
    o->len += n;
    o->data[o->len] = 0;
}

typedef struct {
    out_t out, err;
} both_t;

static void on_out(const void *d, size_t n, void *ud) { collect(d, n, &((both_t *)ud)->out); }
static void on_err(const void *d, size_t n, void *ud) { collect(d, n, &((both_t *)ud)->err); }

static void both_free(both_t *b)
{
    free(b->out.data);
    free(b->err.data);
    memset(b, 0, sizeof *b);
}

static int run(sbx_sandbox_t *s, const char *cmd, both_t *b, sbx_exec_result_t *res, sbx_error_t *e)
{
    sbx_exec_opts_t o = { .cmd = cmd, .on_stdout = on_out, .on_stderr = on_err, .userdata = b };
    return sbx_exec(s, &o, res, e);
}

static int client(sbx_client_t **c)
{
    sbx_error_t e = { 0 };
    int r = sbx_client_new(NULL, c, &e);
    CHECK(r >= 0, "client: %s", e.message);
    return r;
}

static int scenario_exec(sbx_sandbox_t *s)
{
    sbx_error_t e = { 0 };
    both_t b = { 0 };
    sbx_exec_result_t res;
    OK(run(s, "echo out; echo err >&2; exit 7", &b, &res, &e), e);
    CHECK(res.exit_code == 7 && res.signal == 0 && !res.timed_out, "code %d sig %d", res.exit_code,
          res.signal);
    CHECK(b.out.len == 4 && memcmp(b.out.data, "out\n", 4) == 0, "stdout [%s]", b.out.data);
    CHECK(b.err.len == 4 && memcmp(b.err.data, "err\n", 4) == 0, "stderr [%s]", b.err.data);
    CHECK(res.pid > 0, "pid %d", res.pid);
    both_free(&b);
    /* exact bytes, not UTF-8 */
    OK(run(s, "printf '\\377\\000\\001abc'", &b, &res, &e), e);
    CHECK(b.out.len == 6 && memcmp(b.out.data, "\377\000\001abc", 6) == 0, "binary len %zu",
          b.out.len);
    both_free(&b);
    /* argv, cwd, env, stdin */
    const char *argv[] = { "sh", "-c", "pwd; echo $FOO; cat", NULL };
    sbx_kv_t env[] = { { "FOO", "bar baz" } };
    sbx_exec_opts_t o = { .argv = argv,
                          .cwd = "/tmp",
                          .env = env,
                          .n_env = 1,
                          .stdin_data = "from stdin",
                          .stdin_len = 10,
                          .on_stdout = on_out,
                          .userdata = &b };
    OK(sbx_exec(s, &o, &res, &e), e);
    CHECK(b.out.data && strcmp(b.out.data, "/tmp\nbar baz\nfrom stdin") == 0, "[%s]", b.out.data);
    both_free(&b);
    /* timeout and signal */
    sbx_exec_opts_t t = { .cmd = "sleep 10", .timeout_s = 0.3 };
    OK(sbx_exec(s, &t, &res, &e), e);
    CHECK(res.timed_out && res.signal == SIGKILL, "timed_out %d signal %d", res.timed_out,
          res.signal);
    OK(run(s, "kill -TERM $$", &b, &res, &e), e);
    CHECK(res.signal == SIGTERM, "signal %d", res.signal);
    both_free(&b);
    /* streaming: the first line arrives before the command ends */
    OK(run(s, "echo a; sleep 0.5; echo b", &b, &res, &e), e);
    CHECK(res.duration_ms >= 400, "duration %lld", (long long)res.duration_ms);
    CHECK(b.out.data && strcmp(b.out.data, "a\nb\n") == 0, "[%s]", b.out.data);
    both_free(&b);
    /* a command that cannot start: an error before any stream */
    sbx_exec_opts_t bad = { .argv = (const char *[]){ "/no/such/binary", NULL } };
    int r = sbx_exec(s, &bad, &res, &e);
    CHECK(r == -EINVAL && e.http_status == 400 && strstr(e.message, "/no/such/binary"),
          "r %d status %d: %s", r, e.http_status, e.message);
    return 0;
}

static int scenario_files(sbx_sandbox_t *s)
{
    sbx_error_t e = { 0 };
    OK(sbx_file_mkdir(s, "/tmp/ft", &e), e);
    OK(sbx_file_write(s, "/tmp/ft/a.txt", "hello files", 11, &e), e);
    void *data;
    size_t len;
    OK(sbx_file_read(s, "/tmp/ft/a.txt", &data, &len, &e), e);
    CHECK(len == 11 && memcmp(data, "hello files", 11) == 0, "read %zu", len);
    sbx_free(data);
    sbx_file_info_t st;
    OK(sbx_file_stat(s, "/tmp/ft/a.txt", &st, &e), e);
    CHECK(st.size == 11 && strcmp(st.type, "file") == 0 && strcmp(st.name, "a.txt") == 0,
          "stat %llu %s %s", (unsigned long long)st.size, st.type, st.name);
    sbx_file_info_clear(&st);
    /* pagination: more entries than one page */
    both_t b = { 0 };
    sbx_exec_result_t res;
    OK(run(s, "mkdir -p /tmp/ft/many && cd /tmp/ft/many && seq 1 1500 | xargs touch", &b, &res, &e),
       e);
    both_free(&b);
    sbx_file_info_t *list;
    size_t n;
    OK(sbx_file_list(s, "/tmp/ft/many", &list, &n, &e), e);
    CHECK(n == 1500, "listed %zu", n);
    sbx_file_list_free(list, n);
    OK(sbx_file_rename(s, "/tmp/ft/a.txt", "/tmp/ft/b.txt", false, &e), e);
    int r = sbx_file_stat(s, "/tmp/ft/a.txt", &st, &e);
    CHECK(r == -ENOENT && e.http_status == 404, "stat after rename: %d %s", r, e.message);
    /* upload and download of a local file, 3 MiB of random bytes */
    char src[] = "/tmp/libsbx-up-XXXXXX";
    int fd = mkstemp(src);
    CHECK(fd >= 0, "mkstemp");
    unsigned char *buf = malloc(3 << 20);
    int rfd = open("/dev/urandom", O_RDONLY);
    CHECK(buf && rfd >= 0 && read(rfd, buf, 3 << 20) == 3 << 20, "urandom");
    CHECK(write(fd, buf, 3 << 20) == 3 << 20, "write");
    close(fd);
    close(rfd);
    OK(sbx_file_upload(s, src, "/tmp/ft/up/big.bin", NULL, NULL, &e), e);
    char dst[64];
    snprintf(dst, sizeof dst, "%s.back", src);
    OK(sbx_file_download(s, "/tmp/ft/up/big.bin", dst, NULL, NULL, &e), e);
    OK(sbx_file_read(s, "/tmp/ft/up/big.bin", &data, &len, &e), e);
    CHECK(len == 3 << 20 && memcmp(data, buf, len) == 0, "upload bytes differ (%zu)", len);
    sbx_free(data);
    int dfd = open(dst, O_RDONLY);
    unsigned char *back = malloc((3 << 20) + 1);
    ssize_t got = 0, k;
    while (dfd >= 0 && back && (k = read(dfd, back + got, (size_t)((3 << 20) + 1 - got))) > 0)
        got += k;
    CHECK(got == 3 << 20 && memcmp(back, buf, (size_t)got) == 0, "download bytes differ (%zd)",
          got);
    close(dfd);
    unlink(src);
    unlink(dst);
    free(buf);
    free(back);
    OK(sbx_file_delete(s, "/tmp/ft", true, &e), e);
    r = sbx_file_stat(s, "/tmp/ft", &st, &e);
    CHECK(r == -ENOENT, "stat after delete: %d", r);
    return 0;
}

typedef struct {
    uint64_t last, total;
    int calls, backwards, other_thread;
    pthread_t main;
} prog_t;

static void on_progress(uint64_t done, uint64_t total, void *ud)
{
    prog_t *p = ud;
    p->calls++;
    p->backwards += done < p->last;
    p->last = done;
    p->total = total;
    p->other_thread += !pthread_equal(pthread_self(), p->main);
}

/* Files at or above the threshold move in ranges, each on its own connection and thread. */
static int scenario_ranges(const char *id)
{
    sbx_config_t cfg = { .parallel_threshold = 1 << 20, .parallel_ranges = 3 };
    sbx_client_t *c;
    sbx_error_t e = { 0 };
    OK(sbx_client_new(&cfg, &c, &e), e);
    sbx_sandbox_t *s;
    OK(sbx_sandbox_connect(c, id, &s, &e), e);
    size_t size = (3 << 20) + 5; /* not a multiple of the range count */
    unsigned char *buf = malloc(size);
    for (size_t i = 0; i < size; i++)
        buf[i] = (unsigned char)(i * 2654435761u >> 13);
    char src[] = "/tmp/libsbx-rng-XXXXXX";
    int fd = mkstemp(src);
    CHECK(fd >= 0 && write(fd, buf, size) == (ssize_t)size, "write %s", src);
    close(fd);
    prog_t up = { .main = pthread_self() };
    OK(sbx_file_upload(s, src, "/tmp/ranges/up.bin", on_progress, &up, &e), e);
    CHECK(up.last == size && up.total == size && !up.backwards && up.other_thread > 0,
          "upload progress last %llu total %llu backwards %d other_thread %d",
          (unsigned long long)up.last, (unsigned long long)up.total, up.backwards, up.other_thread);
    void *data;
    size_t len;
    OK(sbx_file_read(s, "/tmp/ranges/up.bin", &data, &len, &e), e);
    CHECK(len == size && memcmp(data, buf, size) == 0, "ranged upload differs (%zu)", len);
    sbx_free(data);
    char dst[64];
    snprintf(dst, sizeof dst, "%s.back", src);
    prog_t down = { .main = pthread_self() };
    OK(sbx_file_download(s, "/tmp/ranges/up.bin", dst, on_progress, &down, &e), e);
    CHECK(down.last == size && down.total == size && !down.backwards && down.other_thread > 0,
          "download progress last %llu total %llu backwards %d other_thread %d",
          (unsigned long long)down.last, (unsigned long long)down.total, down.backwards,
          down.other_thread);
    unsigned char *back = malloc(size + 1);
    int dfd = open(dst, O_RDONLY);
    ssize_t got = 0, k;
    while (dfd >= 0 && (k = read(dfd, back + got, size + 1 - (size_t)got)) > 0)
        got += k;
    CHECK(got == (ssize_t)size && memcmp(back, buf, size) == 0, "ranged download differs (%zd)",
          got);
    close(dfd);
    /* a missing file: the error names it, and no partial file is left */
    int r = sbx_file_download(s, "/tmp/ranges/none", dst, NULL, NULL, &e);
    CHECK(r == -ENOENT && strstr(e.message, "/tmp/ranges/none"), "missing: %d %s", r, e.message);
    /* below the threshold: one stream on the calling thread */
    prog_t small = { .main = pthread_self() };
    OK(sbx_file_write(s, "/tmp/ranges/small", "tiny", 4, &e), e);
    OK(sbx_file_download(s, "/tmp/ranges/small", dst, on_progress, &small, &e), e);
    /* its total is the answer's length (the bar of `sbx cp` needs it) */
    CHECK(small.last == 4 && small.total == 4 && small.other_thread == 0, "small: %llu of %llu %d",
          (unsigned long long)small.last, (unsigned long long)small.total, small.other_thread);
    unlink(src);
    unlink(dst);
    free(buf);
    free(back);
    sbx_sandbox_free(s);
    sbx_client_free(c);
    return 0;
}

/* Streams may stay quiet longer than the client's read timeout: exec and following a process's
 * output wait as long as the command runs (TCP keepalive watches the peer). */
static int scenario_quiet(const char *id)
{
    sbx_config_t cfg = { .io_timeout_ms = 1000 };
    sbx_client_t *c;
    sbx_error_t e = { 0 };
    OK(sbx_client_new(&cfg, &c, &e), e);
    sbx_sandbox_t *s;
    OK(sbx_sandbox_connect(c, id, &s, &e), e);
    both_t b = { 0 };
    sbx_exec_result_t res;
    OK(run(s, "sleep 2.5; echo late", &b, &res, &e), e);
    CHECK(res.exit_code == 0 && b.out.data && strcmp(b.out.data, "late\n") == 0, "[%s]",
          b.out.data);
    both_free(&b);
    sbx_exec_opts_t o = { .cmd = "sleep 2.5; echo later" };
    sbx_process_t p;
    OK(sbx_process_start(s, &o, &p, &e), e);
    sbx_exec_opts_t cb = { .on_stdout = on_out, .on_stderr = on_err, .userdata = &b };
    OK(sbx_process_output(s, p.id, true, &cb, &res, &e), e);
    CHECK(res.exit_code == 0 && b.out.data && strcmp(b.out.data, "later\n") == 0, "[%s]",
          b.out.data);
    both_free(&b);
    sbx_process_clear(&p);
    /* and the short read timeout still holds for the calls after them */
    OK(run(s, "true", &b, &res, &e), e);
    both_free(&b);
    sbx_sandbox_free(s);
    sbx_client_free(c);
    return 0;
}

static int scenario_processes(sbx_sandbox_t *s)
{
    sbx_error_t e = { 0 };
    sbx_exec_opts_t o = { .cmd = "read line; echo got:$line; echo to-err >&2; exit 4",
                          .keep_stdin_open = true,
                          .tag = "reader" };
    sbx_process_t p;
    OK(sbx_process_start(s, &o, &p, &e), e);
    CHECK(strncmp(p.id, "p-", 2) == 0 && p.pid > 0, "id %s pid %d", p.id, p.pid);
    OK(sbx_process_stdin(s, p.id, "hi\n", 3, true, &e), e);
    both_t b = { 0 };
    sbx_exec_opts_t cb = { .on_stdout = on_out, .on_stderr = on_err, .userdata = &b };
    sbx_exec_result_t res;
    OK(sbx_process_output(s, p.id, true, &cb, &res, &e), e);
    CHECK(b.out.data && strcmp(b.out.data, "got:hi\n") == 0, "[%s]", b.out.data);
    CHECK(b.err.data && strcmp(b.err.data, "to-err\n") == 0, "[%s]", b.err.data);
    CHECK(res.exit_code == 4, "code %d", res.exit_code);
    both_free(&b);
    /* re-attach once more: the kept output replays */
    OK(sbx_process_output(s, p.id, false, &cb, NULL, &e), e);
    CHECK(b.out.data && strstr(b.out.data, "got:hi"), "replay [%s]", b.out.data);
    both_free(&b);
    sbx_process_t q;
    sbx_exec_opts_t sl = { .cmd = "sleep 100" };
    OK(sbx_process_start(s, &sl, &q, &e), e);
    OK(sbx_process_signal(s, q.id, SIGKILL, 0, &e), e);
    sbx_process_t g = { 0 };
    for (int i = 0; i < 50; i++) {
        sbx_process_clear(&g);
        OK(sbx_process_get(s, q.id, &g, &e), e);
        if (!g.running)
            break;
        usleep(50000);
    }
    CHECK(!g.running && g.signal == SIGKILL, "running %d signal %d", g.running, g.signal);
    sbx_process_clear(&g);
    sbx_process_t *list;
    size_t n;
    OK(sbx_process_list(s, &list, &n, &e), e);
    int seen = 0;
    for (size_t i = 0; i < n; i++)
        seen += strcmp(list[i].id, p.id) == 0 && strcmp(list[i].tag, "reader") == 0;
    CHECK(seen == 1, "process %s with tag reader listed %d times of %zu", p.id, seen, n);
    sbx_process_list_free(list, n);
    sbx_process_clear(&p);
    sbx_process_clear(&q);
    return 0;
}

static int cmd_dedicated(void)
{
    sbx_client_t *c;
    if (client(&c) < 0)
        return 1;
    sbx_error_t e = { 0 };
    sbx_sandbox_t *s;
    sbx_kv_t labels[] = { { "purpose", "libsbx-check" } };
    sbx_create_opts_t co = { .labels = labels, .n_labels = 1 };
    OK(sbx_sandbox_create(c, &co, &s, &e), e);
    printf("id %s\n", sbx_sandbox_id(s));
    fflush(stdout);
    CHECK(sbx_sandbox_pool(s) == NULL, "dedicated has a pool");
    if (scenario_exec(s) || scenario_files(s) || scenario_ranges(sbx_sandbox_id(s)) ||
        scenario_quiet(sbx_sandbox_id(s)) || scenario_processes(s))
        return 1;
    char *url, *hdr;
    OK(sbx_sandbox_proxy(s, SBX_AGENT_PORT, &url, &hdr, &e), e);
    CHECK(strstr(url, "/v1/jobs/") && strstr(url, "/proxy/49983") &&
              strncmp(url, sbx_client_endpoint(c), strlen(sbx_client_endpoint(c))) == 0,
          "url %s", url);
    CHECK(strstr(hdr, "Authorization: Bearer ") && strstr(hdr, "X-Sandbox-Token: "), "%s", hdr);
    sbx_free(url);
    sbx_free(hdr);
    /* the job lists under its labels */
    const char *sel[] = { "purpose=libsbx-check" };
    char *jobs;
    OK(sbx_jobs_list(c, sel, 1, &jobs, &e), e);
    CHECK(strstr(jobs, sbx_sandbox_id(s)) != NULL, "not listed: %s", jobs);
    sbx_free(jobs);
    OK(sbx_sandbox_kill(s, &e), e);
    /* after the kill, exec is refused once the job is canceled */
    int r = 0;
    for (int i = 0; i < 100; i++) {
        char *j;
        OK(sbx_job_inspect(c, sbx_sandbox_id(s), &j, &e), e);
        r = strstr(j, "\"CANCELED\"") != NULL;
        sbx_free(j);
        if (r)
            break;
        usleep(100000);
    }
    CHECK(r, "job not CANCELED after kill");
    sbx_exec_opts_t t = { .cmd = "true" };
    sbx_exec_result_t res;
    r = sbx_exec(s, &t, &res, &e);
    CHECK(r < 0 && e.http_status >= 400, "exec after kill: %d (%d)", r, e.http_status);
    sbx_sandbox_free(s);
    sbx_client_free(c);
    return failures ? 1 : 0;
}

static int cmd_create(const char *mark)
{
    sbx_client_t *c;
    if (client(&c) < 0)
        return 1;
    sbx_error_t e = { 0 };
    sbx_sandbox_t *s;
    OK(sbx_sandbox_create(c, NULL, &s, &e), e);
    OK(sbx_file_write(s, "/tmp/mark", mark, strlen(mark), &e), e);
    printf("%s\n", sbx_sandbox_id(s));
    sbx_sandbox_free(s);
    sbx_client_free(c);
    return failures ? 1 : 0;
}

static int cmd_reconnect(const char *id, const char *text)
{
    sbx_client_t *c;
    if (client(&c) < 0)
        return 1;
    sbx_error_t e = { 0 };
    sbx_sandbox_t *s;
    OK(sbx_sandbox_connect(c, id, &s, &e), e);
    void *data;
    size_t len;
    OK(sbx_file_read(s, "/tmp/mark", &data, &len, &e), e);
    CHECK(len == strlen(text) && memcmp(data, text, len) == 0, "mark [%.*s] want [%s]", (int)len,
          (char *)data, text);
    sbx_free(data);
    both_t b = { 0 };
    sbx_exec_result_t res;
    OK(run(s, "echo reconnected", &b, &res, &e), e);
    CHECK(b.out.data && strcmp(b.out.data, "reconnected\n") == 0, "[%s]", b.out.data);
    both_free(&b);
    sbx_sandbox_free(s);
    sbx_client_free(c);
    return failures ? 1 : 0;
}

static int cmd_errors(void)
{
    sbx_client_t *c;
    if (client(&c) < 0)
        return 1;
    sbx_error_t e = { 0 };
    sbx_sandbox_t *s = NULL;
    int r = sbx_sandbox_connect(c, "0123456789abcdef01234567", &s, &e);
    CHECK(r == -ENOENT && strstr(e.message, "no sandbox"), "unknown id: %d %s", r, e.message);
    r = sbx_sandbox_connect(c, "nopool/abc", &s, &e);
    CHECK(r == -ENOENT && e.http_status == 404, "unknown pool id: %d %d %s", r, e.http_status,
          e.message);
    sbx_create_opts_t bad_image = { .image = "no-such-image", .wait_ms = 10000 };
    r = sbx_sandbox_create(c, &bad_image, &s, &e);
    CHECK(r == -EINVAL && e.http_status == 400 && strstr(e.message, "no-such-image"),
          "bad image: %d %d %s", r, e.http_status, e.message);
    sbx_create_opts_t bad_flavor = { .flavor = "cpu-enormous" };
    r = sbx_sandbox_create(c, &bad_flavor, &s, &e);
    CHECK(r == -EINVAL && e.http_status == 400, "bad flavor: %d %d %s", r, e.http_status,
          e.message);
    sbx_kv_t reserved[] = { { "sbx-sandbox-nonce", "x" } };
    sbx_create_opts_t bad_label = { .labels = reserved, .n_labels = 1 };
    r = sbx_sandbox_create(c, &bad_label, &s, &e);
    CHECK(r == -EINVAL && strstr(e.message, "reserved"), "reserved label: %d %s", r, e.message);
    r = sbx_job_action(c, "0123456789abcdef01234567", "cancel", NULL, &e);
    CHECK(r == -ENOENT && e.http_status == 404, "cancel unknown: %d %s", r, e.message);
    r = sbx_job_action(c, "x", "explode", NULL, &e);
    CHECK(r == -EINVAL, "bad action: %d", r);
    sbx_client_free(c);
    /* a wrong token: refused with a message that says what to check */
    sbx_config_t wrong = { .token = "wrong-token" };
    OK(sbx_client_new(&wrong, &c, &e), e);
    char *text;
    r = sbx_jobs_list(c, NULL, 0, &text, &e);
    CHECK(r == -EACCES && (e.http_status == 401 || e.http_status == 403) &&
              strstr(e.message, "token"),
          "wrong token: %d %d %s", r, e.http_status, e.message);
    sbx_client_free(c);
    /* nothing listening: a connect error that names `sbx up` */
    sbx_config_t dead = { .endpoint = "https://127.0.0.1:1" };
    OK(sbx_client_new(&dead, &c, &e), e);
    r = sbx_jobs_list(c, NULL, 0, &text, &e);
    CHECK(r == -ECONNREFUSED && strstr(e.message, "sbx up"), "dead endpoint: %d %s", r, e.message);
    sbx_client_free(c);
    /* a CA that is not the platform's: the TLS check fails, nothing is sent */
    sbx_config_t other_ca = { .ca_file = "/etc/ssl/certs/ca-certificates.crt" };
    if (access(other_ca.ca_file, R_OK) == 0) {
        OK(sbx_client_new(&other_ca, &c, &e), e);
        r = sbx_jobs_list(c, NULL, 0, &text, &e);
        CHECK(r == -EPROTO && strstr(e.message, "verify"), "other CA: %d %s", r, e.message);
        sbx_client_free(c);
    }
    sbx_config_t bad_ep = { .endpoint = "ftp://x" };
    r = sbx_client_new(&bad_ep, &c, &e);
    CHECK(r == -EINVAL && strstr(e.message, "https://"), "bad endpoint: %d %s", r, e.message);
    return failures ? 1 : 0;
}

static int cmd_pool(const char *name)
{
    sbx_client_t *c;
    if (client(&c) < 0)
        return 1;
    sbx_error_t e = { 0 };
    sbx_pool_opts_t po;
    sbx_pool_opts_init(&po);
    po.name = name;
    po.per_host = 4;
    po.max_hosts = 1;
    char *text;
    OK(sbx_pool_create(c, &po, &text, &e), e);
    CHECK(strstr(text, name) != NULL, "%s", text);
    sbx_free(text);
    int r = sbx_pool_create(c, &po, &text, &e);
    CHECK(r == -EEXIST && e.http_status == 409, "second create: %d %s", r, e.message);
    sbx_sandbox_t **list;
    size_t n, rejected = 99;
    sbx_pool_sandbox_opts_t so = { .count = 3 };
    OK(sbx_pool_sandboxes_create(c, name, &so, &list, &n, &rejected, &e), e);
    CHECK(n == 3 && rejected == 0, "n %zu rejected %zu", n, rejected);
    for (size_t i = 0; i < n; i++) {
        sbx_sandbox_t *s = list[i];
        CHECK(sbx_sandbox_pool(s) && strcmp(sbx_sandbox_pool(s), name) == 0, "pool");
        both_t b = { 0 };
        sbx_exec_result_t res;
        OK(run(s, "echo $SBX_SANDBOX_ID; exit 5", &b, &res, &e), e);
        const char *id = strchr(sbx_sandbox_id(s), '/') + 1;
        CHECK(res.exit_code == 5 && b.out.data && strncmp(b.out.data, id, strlen(id)) == 0,
              "code %d out [%s] id %s", res.exit_code, b.out.data, id);
        both_free(&b);
        OK(sbx_file_write(s, "/note", "pooled", 6, &e), e);
        void *d;
        size_t len;
        OK(sbx_file_read(s, "note", &d, &len, &e), e);
        CHECK(len == 6 && memcmp(d, "pooled", 6) == 0, "read %zu", len);
        sbx_free(d);
    }
    sbx_sandbox_list_free(list, n);
    /* full: 4 per host, one host: 3 + 3 places 1 and rejects 2 */
    sbx_sandbox_t **more;
    size_t m;
    OK(sbx_pool_sandboxes_create(c, name, &so, &more, &m, &rejected, &e), e);
    CHECK(m == 1 && rejected == 2, "m %zu rejected %zu", m, rejected);
    r = sbx_pool_sandboxes_create(c, name, &so, &list, &n, &rejected, &e);
    CHECK(r == -EAGAIN, "at max_hosts: %d %s", r, e.message);
    /* reconnect by POOL/ID and by the bare id */
    sbx_sandbox_t *again;
    OK(sbx_sandbox_connect(c, sbx_sandbox_id(more[0]), &again, &e), e);
    sbx_sandbox_free(again);
    OK(sbx_sandbox_connect(c, strchr(sbx_sandbox_id(more[0]), '/') + 1, &again, &e), e);
    CHECK(strcmp(sbx_sandbox_id(again), sbx_sandbox_id(more[0])) == 0, "%s", sbx_sandbox_id(again));
    OK(sbx_sandbox_kill(again, &e), e);
    sbx_exec_opts_t t = { .cmd = "true" };
    sbx_exec_result_t res;
    r = sbx_exec(again, &t, &res, &e);
    CHECK(r < 0 && (e.http_status == 404 || e.http_status == 410), "exec after delete: %d %d", r,
          e.http_status);
    sbx_sandbox_free(again);
    sbx_sandbox_list_free(more, m);
    OK(sbx_pool_sandboxes_list(c, name, &more, &m, &e), e);
    CHECK(m == 3, "listed %zu", m);
    sbx_sandbox_list_free(more, m);
    OK(sbx_pool_inspect(c, name, &text, &e), e);
    CHECK(strstr(text, "\"hosts\"") != NULL, "%s", text);
    sbx_free(text);
    OK(sbx_pool_delete(c, name, &e), e);
    r = sbx_pool_sandboxes_create(c, "no-such-pool", &so, &list, &n, &rejected, &e);
    CHECK(r == -ENOENT && e.http_status == 404, "unknown pool: %d %s", r, e.message);
    sbx_client_free(c);
    return failures ? 1 : 0;
}

/* A service on the sandbox's proxy socket (a pooled sandbox cannot bind TCP): "libsbx <path>". */
static const char svc_py[] = "import http.server as h, socketserver as s, sys\n"
                             "class H(h.BaseHTTPRequestHandler):\n"
                             "    def do_GET(self):\n"
                             "        b = ('libsbx ' + self.path).encode()\n"
                             "        self.send_response(200)\n"
                             "        self.send_header('Content-Length', str(len(b)))\n"
                             "        self.end_headers()\n"
                             "        self.wfile.write(b)\n"
                             "    def log_message(self, *a):\n"
                             "        pass\n"
                             "s.UnixStreamServer(sys.argv[1], H).serve_forever()\n";

static int cmd_pool_proxy(const char *name)
{
    sbx_client_t *c;
    if (client(&c) < 0)
        return 1;
    sbx_error_t e = { 0 };
    sbx_pool_opts_t po;
    sbx_pool_opts_init(&po);
    po.name = name;
    po.per_host = 2;
    po.max_hosts = 1;
    char *text;
    OK(sbx_pool_create(c, &po, &text, &e), e);
    sbx_free(text);
    sbx_sandbox_t **list;
    size_t n, rejected;
    sbx_pool_sandbox_opts_t so = { .count = 1 };
    OK(sbx_pool_sandboxes_create(c, name, &so, &list, &n, &rejected, &e), e);
    CHECK(n == 1, "n %zu", n);
    if (n != 1)
        return 1;
    sbx_sandbox_t *s = list[0];
    OK(sbx_file_write(s, "/svc.py", svc_py, sizeof svc_py - 1, &e), e);
    sbx_exec_opts_t so2 = { .cmd = "exec python3 $HOME/svc.py $HOME/.sbx/proxy/8080.sock" };
    sbx_process_t p;
    OK(sbx_process_start(s, &so2, &p, &e), e);
    sbx_process_clear(&p);
    both_t b = { 0 };
    sbx_exec_result_t res;
    OK(run(s,
           "for i in $(seq 200); do test -S $HOME/.sbx/proxy/8080.sock && exit 0; sleep 0.1; "
           "done; exit 1",
           &b, &res, &e),
       e);
    CHECK(res.exit_code == 0, "the service never listened: %s", b.err.data ? b.err.data : "");
    both_free(&b);
    char *url, *hdr;
    OK(sbx_sandbox_proxy(s, 8080, &url, &hdr, &e), e);
    const char *id = strchr(sbx_sandbox_id(s), '/') + 1;
    char want[256];
    (void)snprintf(want, sizeof want, "/v1/pools/%s/%s/sandboxes/%s/proxy/8080",
                   sbx_client_namespace(c), name, id);
    size_t ul = strlen(url), wl = strlen(want);
    CHECK(ul > wl && strcmp(url + ul - wl, want) == 0 &&
              strncmp(url, sbx_client_endpoint(c), strlen(sbx_client_endpoint(c))) == 0,
          "url %s, want ...%s", url, want);
    /* a pooled sandbox's token stays with the edge: only the API token is sent */
    CHECK(strstr(hdr, "Authorization: Bearer ") && !strstr(hdr, "X-Sandbox-Token"), "%s", hdr);
    printf("url %s\n", url);
    for (char *l = hdr, *end; (end = strstr(l, "\r\n")) != NULL; l = end + 2)
        printf("header %.*s\n", (int)(end - l), l);
    sbx_free(url);
    sbx_free(hdr);
    sbx_sandbox_list_free(list, n);
    sbx_client_free(c);
    return failures ? 1 : 0;
}

/* A buffer of n bytes holds text (not NUL-terminated) */
static bool holds(const void *buf, size_t n, const char *text)
{
    size_t k = strlen(text);
    for (size_t i = 0; k && i + k <= n; i++)
        if (memcmp((const char *)buf + i, text, k) == 0)
            return true;
    return false;
}

static int cmd_options(const char *secret)
{
    sbx_client_t *c;
    if (client(&c) < 0)
        return 1;
    sbx_error_t e = { 0 };
    sbx_sandbox_t *s;
    sbx_kv_t env[] = { { "SBX_CHECK_ENV", "env value with spaces" } };
    sbx_kv_t sec[] = { { "SBX_CHECK_SECRET", secret } };
    sbx_kv_t labels[] = { { "purpose", "libsbx-options" } };
    sbx_create_opts_t co = { .env = env,
                             .n_env = 1,
                             .secrets = sec,
                             .n_secrets = 1,
                             .labels = labels,
                             .n_labels = 1,
                             .idle_timeout_s = 3600 };
    OK(sbx_sandbox_create(c, &co, &s, &e), e);
    printf("id %s\n", sbx_sandbox_id(s));
    fflush(stdout);
    /* a command in the sandbox sees the env and the secret */
    both_t b = { 0 };
    sbx_exec_result_t res;
    OK(run(s, "printf '%s|%s|%s' \"$SBX_CHECK_ENV\" \"$SBX_CHECK_SECRET\" \"$SBX_IDLE_TIMEOUT\"",
           &b, &res, &e),
       e);
    char want[512];
    (void)snprintf(want, sizeof want, "env value with spaces|%s|3600", secret);
    CHECK(res.exit_code == 0 && b.out.data && strcmp(b.out.data, want) == 0, "[%s] want [%s]",
          b.out.data, want);
    both_free(&b);
    /* the job record and the listing name the secret, never its value (positive control: the
     * env value and the secret's name are in both) */
    char *text;
    OK(sbx_job_inspect(c, sbx_sandbox_id(s), &text, &e), e);
    CHECK(strstr(text, "env value with spaces") && strstr(text, "SBX_CHECK_SECRET"), "%s", text);
    CHECK(!holds(text, strlen(text), secret), "the secret is in the job record: %s", text);
    sbx_free(text);
    const char *sel[] = { "purpose=libsbx-options" };
    OK(sbx_jobs_list(c, sel, 1, &text, &e), e);
    CHECK(strstr(text, sbx_sandbox_id(s)) && strstr(text, "env value with spaces"), "%s", text);
    CHECK(!holds(text, strlen(text), secret), "the secret is in the job listing: %s", text);
    sbx_free(text);
    /* a sandbox that idles out: nothing runs in it, it exits on its own (the test watches) */
    sbx_sandbox_t *idle;
    sbx_create_opts_t io = { .labels = labels, .n_labels = 1, .idle_timeout_s = 2 };
    OK(sbx_sandbox_create(c, &io, &idle, &e), e);
    printf("idle %s\n", sbx_sandbox_id(idle));
    sbx_sandbox_free(idle);
    sbx_sandbox_free(s);
    sbx_client_free(c);
    return failures ? 1 : 0;
}
int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "dedicated") == 0)
        return cmd_dedicated();
    if (argc >= 3 && strcmp(argv[1], "create") == 0)
        return cmd_create(argv[2]);
    if (argc >= 4 && strcmp(argv[1], "reconnect") == 0)
        return cmd_reconnect(argv[2], argv[3]);
    if (argc >= 2 && strcmp(argv[1], "errors") == 0)
        return cmd_errors();
    if (argc >= 3 && strcmp(argv[1], "pool") == 0)
        return cmd_pool(argv[2]);
    if (argc >= 3 && strcmp(argv[1], "pool-proxy") == 0)
        return cmd_pool_proxy(argv[2]);
    if (argc >= 3 && strcmp(argv[1], "options") == 0)
        return cmd_options(argv[2]);
    fprintf(stderr, "usage: libsbx-check dedicated|create TEXT|reconnect ID TEXT|errors|pool NAME|"
                    "pool-proxy NAME|options SECRET\n");
    return 2;
}
