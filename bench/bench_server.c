/* SPDX-License-Identifier: MIT */
/* bench-server: figures for a running sbx-server over loopback, each printed beside a baseline
 * measured in the same run (a bare HTTP round trip, posix_spawn of the same program, a raw
 * pipe, direct file I/O on the same filesystem).
 *
 * It speaks HTTP/1.1 itself: blocking sockets, one small response parser for Content-Length
 * and chunked bodies, and an NDJSON event decoder (JSON string unescaping and base64), so the
 * figures carry no client library's overhead and every byte is checked. Benchmarks print
 * figures and never assert on timings; the exit status is 1 only on a functional failure (a
 * wrong byte count, a refused or dropped connection, a stream without its exit event).
 *
 * Normally started by scripts/bench.sh, which starts the server with a random token. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>

#include "bench_http.h"
#include "bench_util.h"

extern char **environ;

#define MIB (UINT64_C(1) << 20)
#define GIB (UINT64_C(1) << 30)
#define BIG_RECV_BUF (1024 * 1024)
#define SERVER_READ_CHUNK (256 * 1024) /* the server's read of a stream (EXEC_READ_CHUNK) */
#define SMALL_RECV_BUF (4 * 1024)
#define PATTERN_SIZE (4 * MIB)
#define STREAM_CMD "for i in 1 2 3; do echo $i; sleep 0.5; done"

typedef struct {
    uint16_t port;
    const char *token;
    pid_t pid;
    const char *dir;
    const char *only;
    bool quick;
    unsigned exec_n, warmup;
    uint64_t b64_bytes, utf8_bytes, file_bytes;
    unsigned idle_n, idle_sample, streams;
    unsigned failures;
} bench_t;

/* ---- small helpers ----------------------------------------------------------------------- */

static double secs(uint64_t ns) { return (double)ns / 1e9; }

static void fig_count(const char *label, unsigned long long v, const char *note)
{
    printf("  %-52s %12llu        %s\n", label, v, note ? note : "");
}

static void fig_text(const char *label, const char *text) { printf("  %-52s %s\n", label, text); }

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

/* CPU time of this process (user + system). */
static uint64_t self_cpu_ns(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) < 0)
        return 0;
    return (uint64_t)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000000u +
           (uint64_t)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1000u;
}

/* CPU time of the (single-threaded) server, children not included: nanoseconds on the CPU
 * from /proc/<pid>/schedstat, else utime + stime in clock ticks from /proc/<pid>/stat. */

/* A "Name:   123 kB" line of /proc/<pid>/status, in bytes. */
static int proc_status_bytes(pid_t pid, const char *name, uint64_t *ret)
{
    char path[64], buf[8192];
    (void)snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
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

/* Nearest-rank percentile of sorted samples. */

/* ---- 1. exec round trip ------------------------------------------------------------------ */

static void print_latency(const char *label, uint64_t *v, size_t n, double target_ms)
{
    char l[128], note[96];
    double sum = 0;
    qsort(v, n, sizeof *v, cmp_u64);
    for (size_t i = 0; i < n; i++)
        sum += (double)v[i];
    double p50 = (double)percentile(v, n, 50) / 1e6;
    (void)snprintf(l, sizeof l, "%s p50", label);
    fig(l, p50, "ms",
        target_ms > 0 ? target_note(p50 <= target_ms, "p50 <= 0.7 ms", note, sizeof note) : NULL);
    (void)snprintf(l, sizeof l, "%s p99", label);
    fig(l, (double)percentile(v, n, 99) / 1e6, "ms", NULL);
    (void)snprintf(l, sizeof l, "%s mean", label);
    fig(l, sum / (double)n / 1e6, "ms", NULL);
}

/* N requests of one kind on one keep-alive connection; each must succeed. */
static int time_requests(bench_t *b, const char *req, size_t req_len, bool is_exec, uint64_t *v,
                         unsigned n, uint64_t *ret_server_cpu_ns)
{
    uint64_t cpu0 = 0;
    hc_t h;
    nd_t nd = { 0 };
    small_body_t sb;
    int r = hc_open(&h, b->port, 64 * 1024);
    if (r < 0) {
        fail(b, "connect: %s", strerror(-r));
        return r;
    }
    for (unsigned i = 0; i < b->warmup + n && r >= 0; i++) {
        rp_t rp;
        nd_reset(&nd);
        sb.len = 0;
        sb.data[0] = '\0';
        rp_init(&rp, is_exec ? nd_sink : small_sink, is_exec ? (void *)&nd : (void *)&sb);
        uint64_t t0 = now_ns();
        r = send_all(h.fd, req, req_len);
        if (r >= 0)
            r = hc_response(&h, &rp);
        uint64_t t1 = now_ns();
        if (r >= 0 && is_exec && nd_check(&nd, &rp) < 0)
            r = -EBADMSG;
        else if (r >= 0 && !is_exec && rp.status != 200)
            r = -EBADMSG;
        else if (r >= 0 && rp.close)
            r = -ECONNRESET;
        if (r < 0)
            fail(b, "request %u: %s%s%s", i, strerror(-r), is_exec && nd.bad ? ": " : "",
                 is_exec && nd.bad ? nd.why : sb.data);
        if (i >= b->warmup)
            v[i - b->warmup] = t1 - t0;
        if (i + 1 == b->warmup)
            cpu0 = server_cpu_ns(b->pid);
    }
    *ret_server_cpu_ns = server_cpu_ns(b->pid) - cpu0;
    nd_free(&nd);
    hc_close(&h);
    return r;
}

static int time_spawn(char *const argv[], uint64_t *v, unsigned n, unsigned warmup)
{
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

static void bench_exec(bench_t *b)
{
    static const struct {
        const char *label, *body;
    } kinds[] = {
        { "exec [\"true\"] (argv)", "{\"cmd\":[\"true\"]}" },
        { "exec cmd:\"true\" (/bin/sh -c)", "{\"cmd\":\"true\"}" },
    };
    char hdr[160], req[1024];
    unsigned n = b->exec_n;
    _cleanup_free_ uint64_t *v = calloc(n, sizeof *v);
    if (!v) {
        fail(b, "out of memory");
        return;
    }
    (void)snprintf(hdr, sizeof hdr,
                   "1. exec round trip: N=%u sequential requests on one keep-alive connection "
                   "(after %u warm-up)",
                   n, b->warmup);
    section(hdr);
    uint64_t floor_p50 = 0, exec_p50[2] = { 0, 0 }, cpu = 0;
    char l[128];
    for (size_t k = 0; k < ELEMENTSOF(kinds); k++) {
        int len = build_json_request(b->token, req, sizeof req, "/v1/exec", kinds[k].body);
        if (len < 0 || time_requests(b, req, (size_t)len, true, v, n, &cpu) < 0)
            continue;
        print_latency(kinds[k].label, v, n, 0.7);
        (void)snprintf(l, sizeof l, "%s: server CPU per request", kinds[k].label);
        fig(l, (double)cpu / n / 1e6, "ms", "(the server's own; the command's not included)");
        exec_p50[k] = percentile(v, n, 50);
    }
    int len = build_head(NULL, req, sizeof req, "GET", "/health", NULL, -1);
    if (len > 0 && time_requests(b, req, (size_t)len, false, v, n, &cpu) >= 0)
        print_latency("baseline: GET /health (no token)", v, n, 0);
    char *const argv_true[] = { "/bin/true", NULL };
    char *const argv_sh[] = { "/bin/sh", "-c", "true", NULL };
    int r = time_spawn(argv_true, v, n, b->warmup);
    if (r < 0)
        fail(b, "posix_spawn /bin/true: %s", strerror(-r));
    else {
        print_latency("baseline: posix_spawn+waitpid /bin/true", v, n, 0);
        floor_p50 = percentile(v, n, 50);
    }
    r = time_spawn(argv_sh, v, n, b->warmup);
    if (r < 0)
        fail(b, "posix_spawn /bin/sh: %s", strerror(-r));
    else
        print_latency("baseline: posix_spawn+waitpid /bin/sh -c true", v, n, 0);
    if (floor_p50 && exec_p50[0])
        fig("ratio: exec [\"true\"] p50 / spawn /bin/true p50",
            (double)exec_p50[0] / (double)floor_p50, "x", NULL);
}

/* ---- 2. stdout streaming ----------------------------------------------------------------- */

static void print_rate(const char *label, uint64_t bytes, uint64_t ns, bool with_target)
{
    char note[96];
    double gbs = (double)bytes / secs(ns) / 1e9;
    fig(label, gbs, "GB/s",
        with_target ? target_note(gbs >= 1.0, ">= 1 GB/s", note, sizeof note) : NULL);
}

static void print_cpu(const char *label, uint64_t client_ns, uint64_t server_ns, uint64_t wall_ns)
{
    char l[128], note[64];
    (void)snprintf(l, sizeof l, "  %s: bench CPU", label);
    (void)snprintf(note, sizeof note, "(%.0f%% of wall)",
                   100.0 * (double)client_ns / (double)wall_ns);
    fig(l, secs(client_ns), "s", note);
    (void)snprintf(l, sizeof l, "  %s: server CPU (its own, not the command's)", label);
    (void)snprintf(note, sizeof note, "(%.0f%% of wall)",
                   100.0 * (double)server_ns / (double)wall_ns);
    fig(l, secs(server_ns), "s", note);
}

/* UTF-8 text for the text run (ASCII with two- and three-byte sequences), one line repeated. */
#define TEXT_LINE                                                                                  \
    "sbx streams UTF-8 text: caf\u00e9, na\u00efve, \u2014 \u00bd \u00e0 la carte 0123456789"
#define TEXT_SHELL "yes '" TEXT_LINE "' | head -c "

/* The source (`head -c N /dev/zero`, or N bytes of that text) into a pipe read by us, reads
 * of the server's size. */
static int pipe_baseline(uint64_t bytes, bool text, uint64_t *ret_ns)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0)
        return negative_errno();
    (void)fcntl(p[1], F_SETPIPE_SZ, 1024 * 1024); /* as the server does */
    char count[32], shell[256];
    (void)snprintf(count, sizeof count, "%llu", (unsigned long long)bytes);
    (void)snprintf(shell, sizeof shell, "%s%s", TEXT_SHELL, count);
    char *const zeros[] = { "head", "-c", count, "/dev/zero", NULL };
    char *const texts[] = { "sh", "-c", shell, NULL };
    char *const *argv = text ? texts : zeros;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, p[1], 1);
    pid_t pid;
    uint64_t t0 = now_ns();
    int r = -posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    safe_close(p[1]);
    _cleanup_free_ unsigned char *buf = malloc(SERVER_READ_CHUNK);
    uint64_t got = 0;
    while (r >= 0 && buf) {
        ssize_t n = read(p[0], buf, SERVER_READ_CHUNK);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (uint64_t)n;
    }
    uint64_t t1 = now_ns();
    safe_close(p[0]);
    if (r >= 0)
        (void)waitpid(pid, NULL, 0);
    if (r >= 0 && got != bytes)
        r = -EIO;
    *ret_ns = t1 - t0;
    return buf ? r : -ENOMEM;
}

typedef struct {
    uint64_t ns, client_cpu, server_cpu, payload, wire;
} stream_res_t;

/* One streamed exec of bytes of the source, every event decoded and checked; adds to *res.
 * Returns 0, or -1 after fail(). */
static int stream_round(bench_t *b, const char *label, uint64_t bytes, bool base64, bool text,
                        stream_res_t *res)
{
    char body[512], req[1024];
    if (text) /* the line has no character that needs escaping in JSON but the UTF-8 */
        (void)snprintf(body, sizeof body, "{\"cmd\":\"%s%llu\"%s}", TEXT_SHELL,
                       (unsigned long long)bytes, base64 ? ",\"encoding\":\"base64\"" : "");
    else
        (void)snprintf(body, sizeof body, "{\"cmd\":[\"head\",\"-c\",\"%llu\",\"/dev/zero\"]%s}",
                       (unsigned long long)bytes, base64 ? ",\"encoding\":\"base64\"" : "");
    int len = build_json_request(b->token, req, sizeof req, "/v1/exec", body);
    hc_t h;
    int r = len < 0 ? len : hc_open(&h, b->port, BIG_RECV_BUF);
    if (r < 0) {
        fail(b, "%s: %s", label, strerror(-r));
        return -1;
    }
    nd_t nd = { .base64 = base64, .check_zero = !text };
    nd_reset(&nd);
    rp_t rp;
    rp_init(&rp, nd_sink, &nd);
    uint64_t c0 = self_cpu_ns(), s0 = server_cpu_ns(b->pid), t0 = now_ns();
    r = send_all(h.fd, req, (size_t)len);
    if (r >= 0)
        r = hc_response(&h, &rp);
    uint64_t t1 = now_ns(), c1 = self_cpu_ns(), s1 = server_cpu_ns(b->pid);
    hc_close(&h);
    if (r < 0)
        fail(b, "%s: %s after %llu payload bytes", label, strerror(-r),
             (unsigned long long)nd.out_bytes);
    else if (nd_check(&nd, &rp) < 0)
        fail(b, "%s: %s", label, nd.why);
    else if (nd.out_bytes != bytes)
        fail(b, "%s: %llu payload bytes decoded, expected %llu", label,
             (unsigned long long)nd.out_bytes, (unsigned long long)bytes);
    else {
        res->ns += t1 - t0;
        res->client_cpu += c1 - c0;
        res->server_cpu += s1 - s0;
        res->payload += bytes;
        res->wire += rp.body_bytes;
        r = 1;
    }
    nd_free(&nd);
    return r == 1 ? 0 : -1;
}

#define STREAM_ROUNDS 4

/* bytes of the source streamed in STREAM_ROUNDS rounds; with base_label, each round beside a
 * round of the same source read from a pipe (the two take turns, so a machine whose speed
 * drifts gives both the same conditions), else compared with *base_gbs as given. with_target:
 * the issue's >= 90 % of the pipe. Sets *base_gbs to the pipe's rate when it measured one. */
static void stream_pair(bench_t *b, const char *label, const char *base_label, uint64_t bytes,
                        bool base64, bool text, double *base_gbs, bool with_target)
{
    char l[160];
    unsigned rounds = bytes >= STREAM_ROUNDS * 64 * MIB ? STREAM_ROUNDS : 1;
    stream_res_t res = { 0 };
    uint64_t base_ns = 0, base_bytes = 0;
    bool ok = true;
    for (unsigned k = 0; k < rounds && ok; k++) {
        uint64_t chunk = bytes * (k + 1) / rounds - bytes * k / rounds, ns = 0;
        if (base_label) {
            int r = pipe_baseline(chunk, text, &ns);
            if (r < 0) {
                fail(b, "%s: %s", base_label, strerror(-r));
                ok = false;
                break;
            }
            base_ns += ns;
            base_bytes += chunk;
        }
        ok = stream_round(b, label, chunk, base64, text, &res) == 0;
    }
    if (base_label && base_bytes == bytes) {
        (void)snprintf(l, sizeof l, "%s, %llu MiB", base_label, (unsigned long long)(bytes / MIB));
        print_rate(l, bytes, base_ns, false);
        *base_gbs = (double)bytes / secs(base_ns) / 1e9;
    }
    if (!ok)
        return;
    (void)snprintf(l, sizeof l, "%s, %llu MiB", label, (unsigned long long)(bytes / MIB));
    print_rate(l, bytes, res.ns, false);
    if (*base_gbs > 0) {
        char note[96];
        double pct = 100.0 * (double)bytes / secs(res.ns) / 1e9 / *base_gbs;
        fig("  of the same source read from a pipe", pct, "%",
            with_target ? target_note(pct >= 90, ">= 90 %", note, sizeof note) : NULL);
    }
    fig("  wire bytes per payload byte", (double)res.wire / (double)bytes, "x", NULL);
    print_cpu("stream", res.client_cpu, res.server_cpu, res.ns);
}

static void bench_stream(bench_t *b)
{
    char hdr[600];
    (void)snprintf(
        hdr, sizeof hdr,
        "2. stdout streaming: exec `head -c N /dev/zero`, payload bytes decoded per second "
        "at the client\n   (every event parsed, JSON unescaped or base64 decoded, each byte "
        "checked to be zero; 1 GB = 1e9 bytes;\n   the utf8 run uses a quarter of the size: "
        "each zero byte is 6 bytes on the wire;\n   then UTF-8 text, not zeros, beside the same "
        "text read from a pipe;\n   base64 and UTF-8 text each in %d rounds of 64 MiB or more "
        "(else one), taking turns with a round of their pipe baseline)",
        STREAM_ROUNDS);
    section(hdr);
    double zeros_gbs = 0, text_gbs = 0;
    stream_pair(b, "exec stdout, encoding base64", "baseline: raw pipe read by the bench",
                b->b64_bytes, true, false, &zeros_gbs, true);
    stream_pair(b, "exec stdout, utf8 (zeros arrive as \\u0000)", NULL, b->utf8_bytes, false, false,
                &zeros_gbs, false);
    /* UTF-8 text (not zeros): `yes <a line with multi-byte characters> | head -c N` */
    stream_pair(b, "exec stdout, UTF-8 text", "baseline: UTF-8 text, raw pipe read by the bench",
                b->b64_bytes, false, true, &text_gbs, true);
}

/* ---- 3. files ---------------------------------------------------------------------------- */

static void fill_pattern(unsigned char *p, size_t n)
{
    uint64_t x = 0x9E3779B97F4A7C15u;
    for (size_t i = 0; i + 8 <= n; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(p + i, &x, 8);
    }
}

typedef struct {
    const unsigned char *pattern;
    uint64_t off;
    bool bad;
} verify_t;

static void verify_sink(void *ctx, const char *p, size_t n)
{
    verify_t *vf = ctx;
    while (n > 0 && !vf->bad) {
        size_t at = (size_t)(vf->off % PATTERN_SIZE), take = MIN(n, PATTERN_SIZE - at);
        if (memcmp(p, vf->pattern + at, take) != 0)
            vf->bad = true;
        vf->off += take;
        p += take;
        n -= take;
    }
}

static int write_pattern(int fd, const unsigned char *pat, uint64_t bytes, bool sock)
{
    for (uint64_t done = 0; done < bytes;) {
        size_t n = (size_t)MIN(bytes - done, (uint64_t)PATTERN_SIZE);
        int r = sock ? send_all(fd, pat, n) : 0;
        for (size_t w = 0; !sock && w < n;) {
            ssize_t k = write(fd, pat + w, n - w);
            if (k < 0 && errno == EINTR)
                continue;
            if (k < 0)
                return negative_errno();
            w += (size_t)k;
        }
        if (r < 0)
            return r;
        done += n;
    }
    return 0;
}

/* Write the file once unmeasured and delete it: the first use of fresh memory for the page
 * cache is several times slower in a VM (the host backs the pages on first touch), and it
 * would be charged to whichever test came first. Then write it again, measured. */
static int file_baseline(const char *path, const unsigned char *pat, uint64_t bytes,
                         uint64_t *ret_write_ns, uint64_t *ret_read_ns)
{
    _cleanup_close_ int fd = -EBADF;
    uint64_t t0 = 0;
    int r = 0;
    for (int pass = 0; pass < 2 && r >= 0; pass++) {
        (void)unlink(path);
        t0 = now_ns();
        fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0)
            return negative_errno();
        r = write_pattern(fd, pat, bytes, false);
        fd = safe_close(fd);
    }
    *ret_write_ns = now_ns() - t0;
    if (r < 0)
        return r;
    _cleanup_free_ char *buf = malloc(PATTERN_SIZE);
    t0 = now_ns();
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || !buf)
        return fd < 0 ? negative_errno() : -ENOMEM;
    verify_t vf = { .pattern = pat };
    for (;;) {
        ssize_t n = read(fd, buf, PATTERN_SIZE);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return negative_errno();
        if (n == 0)
            break;
        verify_sink(&vf, buf, (size_t)n);
    }
    *ret_read_ns = now_ns() - t0;
    return vf.off == bytes && !vf.bad ? 0 : -EIO;
}

static void url_path(const char *path, char *dst, size_t cap)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)path; *p && o + 4 < cap; p++) {
        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
            strchr("/-._~", *p))
            dst[o++] = (char)*p;
        else {
            dst[o++] = '%';
            dst[o++] = hex[*p >> 4];
            dst[o++] = hex[*p & 15];
        }
    }
    dst[o] = '\0';
}

/* PUT the body (pattern repeated) to path. Returns the HTTP status, or -errno. */
static int file_put(bench_t *b, const char *path, const unsigned char *pat, uint64_t bytes,
                    small_body_t *sb)
{
    char target[4200], enc[4096], head[4096];
    url_path(path, enc, sizeof enc);
    (void)snprintf(target, sizeof target, "/v1/files/write?path=%s", enc);
    int len = build_head(b->token, head, sizeof head, "PUT", target, "application/octet-stream",
                         (int64_t)bytes);
    hc_t h;
    int r = len < 0 ? len : hc_open(&h, b->port, 64 * 1024);
    if (r < 0)
        return r;
    rp_t rp;
    sb->len = 0;
    sb->data[0] = '\0';
    rp_init(&rp, small_sink, sb);
    r = send_all(h.fd, head, (size_t)len);
    if (r >= 0)
        r = write_pattern(h.fd, pat, bytes, true);
    /* An early answer (501, 4xx) may have cut the upload short: read it either way. */
    int rr = hc_response(&h, &rp);
    hc_close(&h);
    if (rr < 0)
        return r < 0 ? r : rr;
    return rp.status;
}

static int file_get(bench_t *b, const char *path, verify_t *vf, rp_t *rp)
{
    char target[4200], enc[4096], head[4096];
    url_path(path, enc, sizeof enc);
    (void)snprintf(target, sizeof target, "/v1/files/read?path=%s", enc);
    int len = build_head(b->token, head, sizeof head, "GET", target, NULL, -1);
    hc_t h;
    int r = len < 0 ? len : hc_open(&h, b->port, BIG_RECV_BUF);
    if (r < 0)
        return r;
    rp_init(rp, verify_sink, vf);
    r = send_all(h.fd, head, (size_t)len);
    if (r >= 0)
        r = hc_response(&h, rp);
    hc_close(&h);
    return r < 0 ? r : rp->status;
}

static bool put_size_ok(const small_body_t *sb, uint64_t bytes)
{
    json_t *j = json_loadb(sb->data, sb->len, 0, NULL);
    json_t *sz = j ? json_object_get(j, "size") : NULL;
    bool ok = sz && json_is_integer(sz) && (uint64_t)json_integer_value(sz) == bytes &&
              json_is_string(json_object_get(j, "path"));
    json_decref(j);
    return ok;
}

static void files_via_server(bench_t *b, const char *path, const unsigned char *pat)
{
    small_body_t sb;
    uint64_t bytes = b->file_bytes;
    char l[128];
    uint64_t t0 = now_ns();
    int st = file_put(b, path, pat, bytes, &sb);
    uint64_t t1 = now_ns();
    (void)snprintf(l, sizeof l, "PUT /v1/files/write, %llu MiB", (unsigned long long)(bytes / MIB));
    if (st < 0) {
        fail(b, "%s: %s", l, strerror(-st));
        return;
    }
    if (st != 200) {
        fail(b, "%s: HTTP %d %s", l, st, sb.data);
        return;
    }
    if (!put_size_ok(&sb, bytes)) {
        fail(b, "%s: answer %s does not report size %llu", l, sb.data, (unsigned long long)bytes);
        return;
    }
    print_rate(l, bytes, t1 - t0, true);

    verify_t vf = { .pattern = pat };
    rp_t rp;
    t0 = now_ns();
    st = file_get(b, path, &vf, &rp);
    t1 = now_ns();
    (void)snprintf(l, sizeof l, "GET /v1/files/read, %llu MiB", (unsigned long long)(bytes / MIB));
    if (st < 0)
        fail(b, "%s: %s after %llu bytes", l, strerror(-st), (unsigned long long)vf.off);
    else if (st != 200)
        fail(b, "%s: HTTP %d", l, st);
    else if (vf.bad || vf.off != bytes || !rp.has_length || rp.content_length != bytes)
        fail(b, "%s: %llu bytes (Content-Length %llu), content %s", l, (unsigned long long)vf.off,
             (unsigned long long)rp.content_length, vf.bad ? "differs" : "matches");
    else
        print_rate(l, bytes, t1 - t0, true);
}

static void bench_files(bench_t *b)
{
    char hdr[200], path[4096], probe[4096];
    (void)snprintf(hdr, sizeof hdr,
                   "3. files: upload (streamed from memory) and download of "
                   "%llu MiB under %s",
                   (unsigned long long)(b->file_bytes / MIB), b->dir);
    section(hdr);
    _cleanup_free_ unsigned char *pat = malloc(PATTERN_SIZE);
    if (!pat) {
        fail(b, "out of memory");
        return;
    }
    fill_pattern(pat, PATTERN_SIZE);
    (void)snprintf(path, sizeof path, "%s/bench-baseline.bin", b->dir);
    uint64_t wns = 0, rns = 0;
    int r = file_baseline(path, pat, b->file_bytes, &wns, &rns);
    (void)unlink(path);
    if (r < 0)
        fail(b, "direct file I/O in %s: %s", b->dir, strerror(-r));
    else {
        print_rate("baseline: write() to the same filesystem (warmed)", b->file_bytes, wns, false);
        print_rate("baseline: read() back (page cache)", b->file_bytes, rns, false);
    }
    small_body_t sb;
    (void)snprintf(probe, sizeof probe, "%s/bench-probe.bin", b->dir);
    int st = file_put(b, probe, pat, 16, &sb);
    (void)unlink(probe);
    if (st == 501 || st == 404) {
        char why[32];
        (void)snprintf(why, sizeof why, "n/a (%d)", st);
        fig_text("PUT /v1/files/write", why);
        fig_text("GET /v1/files/read", why);
        return;
    }
    (void)snprintf(path, sizeof path, "%s/bench-upload.bin", b->dir);
    files_via_server(b, path, pat);
    (void)unlink(path);
}

/* ---- 4. idle keep-alive connections ------------------------------------------------------ */

/* Connect, send the request, and read one complete 200 answer on each of conns[from..to). */
static int open_batch(bench_t *b, hc_t *conns, unsigned from, unsigned to, const char *req,
                      size_t req_len)
{
    for (unsigned i = from; i < to; i++) {
        int r = hc_open(&conns[i], b->port, SMALL_RECV_BUF);
        if (r >= 0)
            r = send_all(conns[i].fd, req, req_len);
        if (r < 0) {
            fail(b, "connection %u: %s", i, strerror(-r));
            return r;
        }
    }
    for (unsigned i = from; i < to; i++) {
        small_body_t sb = { .len = 0 };
        rp_t rp;
        rp_init(&rp, small_sink, &sb);
        int r = hc_response(&conns[i], &rp);
        if (r < 0 || rp.status != 200 || rp.close) {
            fail(b, "connection %u: %s (HTTP %d) %s", i, r < 0 ? strerror(-r) : "refused",
                 rp.status, sb.data);
            return -EPROTO;
        }
    }
    return 0;
}

static unsigned count_closed(hc_t *conns, unsigned n)
{
    _cleanup_free_ struct pollfd *pfd = calloc(n, sizeof *pfd);
    if (!pfd)
        return n;
    for (unsigned i = 0; i < n; i++)
        pfd[i] = (struct pollfd){ .fd = conns[i].fd, .events = POLLIN | POLLRDHUP };
    unsigned closed = 0;
    if (poll(pfd, n, 0) < 0)
        return n;
    for (unsigned i = 0; i < n; i++)
        closed += pfd[i].revents != 0; /* an idle kept-alive connection has nothing to say */
    return closed;
}

static bool fd_budget(bench_t *b, unsigned need)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
        return false;
    if (rl.rlim_cur < need && rl.rlim_max >= need) {
        rl.rlim_cur = need;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
        (void)getrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur >= need)
        return true;
    char why[128];
    (void)snprintf(why, sizeof why, "n/a (RLIMIT_NOFILE %llu < %u; raise `ulimit -n`)",
                   (unsigned long long)rl.rlim_cur, need);
    fig_text("connections", why);
    b->failures++;
    return false;
}

static void idle_report(bench_t *b, hc_t *conns, unsigned n, uint64_t before)
{
    uint64_t after = 0;
    char l[128], req[1024];
    if (proc_status_bytes(b->pid, "VmRSS", &after) < 0) {
        fail(b, "cannot read /proc/%d/status", (int)b->pid);
        return;
    }
    fig("server VmRSS before", (double)before / MIB, "MiB", NULL);
    (void)snprintf(l, sizeof l, "server VmRSS with %u idle connections", n);
    fig(l, (double)after / MIB, "MiB", NULL);
    fig("growth, total", (double)(after > before ? after - before : 0) / MIB, "MiB", NULL);
    fig("growth per connection", (double)(after > before ? after - before : 0) / n, "bytes",
        "(user-space RSS; kernel socket memory not included)");
    unsigned closed = count_closed(conns, n);
    fig_count("connections closed or readable while idle", closed, closed ? "(expected 0)" : "");
    if (closed)
        fail(b, "%u of %u idle connections were closed by the server", closed, n);
    int len = build_head(b->token, req, sizeof req, "GET", "/health", NULL, -1);
    unsigned step = MAX(1u, n / b->idle_sample), asked = 0, ok = 0;
    for (unsigned i = 0; i < n && asked < b->idle_sample && len > 0; i += step, asked++) {
        small_body_t sb = { .len = 0 };
        rp_t rp;
        rp_init(&rp, small_sink, &sb);
        int r = send_all(conns[i].fd, req, (size_t)len);
        if (r >= 0)
            r = hc_response(&conns[i], &rp);
        ok += r >= 0 && rp.status == 200;
    }
    (void)snprintf(l, sizeof l, "second request answered 200, of %u sampled", asked);
    fig_count(l, ok, NULL);
    if (ok != asked)
        fail(b, "%u of %u sampled idle connections did not answer a second request", asked - ok,
             asked);
}

static void bench_idle(bench_t *b)
{
    unsigned n = b->idle_n;
    char hdr[200], req[1024];
    (void)snprintf(hdr, sizeof hdr,
                   "4. memory at %u idle keep-alive connections (each sent one "
                   "GET /health with the token)",
                   n);
    section(hdr);
    if (!fd_budget(b, n + 64))
        return;
    _cleanup_free_ hc_t *conns = calloc(n, sizeof *conns);
    if (!conns) {
        fail(b, "out of memory");
        return;
    }
    uint64_t before = 0;
    if (proc_status_bytes(b->pid, "VmRSS", &before) < 0) {
        fail(b, "cannot read /proc/%d/status", (int)b->pid);
        return;
    }
    int len = build_head(b->token, req, sizeof req, "GET", "/health", NULL, -1);
    unsigned opened = 0;
    uint64_t t0 = now_ns();
    int r = len < 0 ? len : 0;
    while (r >= 0 && opened < n) {
        unsigned to = MIN(n, opened + 256); /* stays well inside the listen backlog */
        r = open_batch(b, conns, opened, to, req, (size_t)len);
        opened = to;
    }
    if (r >= 0) {
        fig("time to open them all", secs(now_ns() - t0), "s", NULL);
        idle_report(b, conns, n, before);
    }
    for (unsigned i = 0; i < opened; i++)
        hc_close(&conns[i]);
}

/* ---- 5. concurrent streaming execs ------------------------------------------------------- */

typedef struct {
    hc_t h;
    rp_t rp;
    nd_t nd;
    bool done;
} stream_t;

static int stream_finish(bench_t *b, stream_t *s, unsigned i, int r)
{
    static const char want[] = "1\n2\n3\n";
    s->done = true;
    if (r >= 0 && nd_check(&s->nd, &s->rp) >= 0 &&
        (s->nd.out_len != sizeof want - 1 || memcmp(s->nd.out, want, sizeof want - 1) != 0))
        nd_bad(&s->nd,
               "stdout is %zu bytes, not \"1\\n2\\n3\\n\" (pid %llu, %u events, %s); stderr: %.80s",
               s->nd.out_len, (unsigned long long)s->nd.pid, s->nd.events, s->nd.exit_line,
               s->nd.err_len ? s->nd.err : "(empty)");
    if (r < 0 && !s->nd.bad)
        nd_bad(&s->nd, "%s", strerror(-r));
    if (s->nd.bad && b->failures < 10)
        fail(b, "stream %u: %s", i, s->nd.why);
    else if (s->nd.bad)
        b->failures++;
    hc_close(&s->h);
    nd_free(&s->nd);
    return s->nd.bad ? 1 : 0;
}

/* Read whatever is there for stream i; finish it when its response is complete. */
static int stream_pump(bench_t *b, stream_t *s, unsigned i)
{
    for (;;) {
        ssize_t n = hc_recv(&s->h, MSG_DONTWAIT);
        if (n == -EAGAIN)
            return 0;
        if (n == 0)
            return stream_finish(b, s, i, rp_eof(&s->rp));
        if (n < 0)
            return stream_finish(b, s, i, (int)n);
        int r = hc_feed(&s->h, &s->rp);
        if (r != 0)
            return stream_finish(b, s, i, r);
    }
}

static unsigned streams_poll(bench_t *b, stream_t *st, unsigned n, uint64_t deadline)
{
    unsigned failed = 0, left = n;
    _cleanup_free_ struct pollfd *pfd = calloc(n, sizeof *pfd);
    if (!pfd)
        return n;
    for (unsigned i = 0; i < n; i++)
        pfd[i] = (struct pollfd){ .fd = st[i].done ? -1 : st[i].h.fd, .events = POLLIN };
    for (unsigned i = 0; i < n; i++)
        left -= st[i].done;
    while (left > 0 && now_ns() < deadline) {
        int k = poll(pfd, n, 500);
        if (k < 0 && errno != EINTR)
            break;
        for (unsigned i = 0; i < n && k > 0; i++) {
            if (!pfd[i].revents)
                continue;
            k--;
            failed += (unsigned)stream_pump(b, &st[i], i);
            if (st[i].done) {
                pfd[i].fd = -1;
                left--;
            }
        }
    }
    for (unsigned i = 0; i < n; i++)
        if (!st[i].done)
            failed += (unsigned)stream_finish(b, &st[i], i, -ETIMEDOUT);
    return failed;
}

static void bench_concurrent(bench_t *b)
{
    unsigned n = b->streams;
    char hdr[200], req[1024], l[128];
    (void)snprintf(hdr, sizeof hdr,
                   "5. %u concurrent streaming execs of `%s` (all requests "
                   "sent first, then all streams read with poll())",
                   n, STREAM_CMD);
    section(hdr);
    if (!fd_budget(b, n + 64))
        return;
    _cleanup_free_ stream_t *st = calloc(n, sizeof *st);
    int len =
        build_json_request(b->token, req, sizeof req, "/v1/exec", "{\"cmd\":\"" STREAM_CMD "\"}");
    if (!st || len < 0) {
        fail(b, "out of memory");
        return;
    }
    /* Reset the server's peak RSS so VmHWM below is this test's (Linux >= 4.0). */
    char path[64];
    (void)snprintf(path, sizeof path, "/proc/%d/clear_refs", (int)b->pid);
    _cleanup_close_ int cr = open(path, O_WRONLY | O_CLOEXEC);
    bool hwm_reset = cr >= 0 && write(cr, "5", 1) == 1;
    uint64_t rss0 = 0, hwm = 0, rss1 = 0;
    (void)proc_status_bytes(b->pid, "VmRSS", &rss0);
    unsigned failed = 0;
    uint64_t t0 = now_ns();
    for (unsigned i = 0; i < n; i++) {
        int r = hc_open(&st[i].h, b->port, 16 * 1024);
        if (r >= 0)
            r = send_all(st[i].h.fd, req, (size_t)len);
        nd_reset(&st[i].nd);
        rp_init(&st[i].rp, nd_sink, &st[i].nd);
        if (r < 0)
            failed += (unsigned)stream_finish(b, &st[i], i, r);
    }
    uint64_t sent = now_ns();
    failed += streams_poll(b, st, n, t0 + (uint64_t)(30 + n / 20) * 1000000000u);
    uint64_t t1 = now_ns();
    (void)proc_status_bytes(b->pid, "VmHWM", &hwm);
    (void)proc_status_bytes(b->pid, "VmRSS", &rss1);
    fig("time to connect and send all requests", secs(sent - t0), "s", NULL);
    fig("wall time, first connect to last exit event", secs(t1 - t0), "s",
        "(the command alone takes 1.5 s)");
    fig_count("failed streams", failed, "(must be 0)");
    fig("server VmRSS before", (double)rss0 / MIB, "MiB", NULL);
    (void)snprintf(l, sizeof l, "server peak RSS (VmHWM%s)",
                   hwm_reset ? ", reset before" : ", lifetime");
    fig(l, (double)hwm / MIB, "MiB", NULL);
    fig("server VmRSS after", (double)rss1 / MIB, "MiB", NULL);
}

/* ---- main -------------------------------------------------------------------------------- */

/* Other work on the machine skews every figure: say how busy it was. */

static void usage(void)
{
    fprintf(stderr,
            "usage: bench-server --port N --pid PID --dir DIR [--quick] [--only LIST]\n"
            "       bench-server --free-port\n"
            "The token comes from $SBX_BENCH_TOKEN. LIST: exec,stream,files,idle,concurrent.\n"
            "Usually run through scripts/bench.sh, which starts the server.\n");
}

static int parse_args(bench_t *b, int argc, char **argv)
{
    uint64_t v;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (streq(a, "--quick"))
            b->quick = true;
        else if (streq(a, "--port") && val && parse_u64_str(val, 65535, &v) >= 0 && v > 0)
            b->port = (uint16_t)v, i++;
        else if (streq(a, "--pid") && val && parse_u64_str(val, INT32_MAX, &v) >= 0 && v > 0)
            b->pid = (pid_t)v, i++;
        else if (streq(a, "--dir") && val)
            b->dir = val, i++;
        else if (streq(a, "--only") && val)
            b->only = val, i++;
        else
            return -EINVAL;
    }
    b->token = getenv("SBX_BENCH_TOKEN");
    if (!b->port || !b->pid || !b->dir || !b->token || !*b->token)
        return -EINVAL;
    b->exec_n = b->quick ? 200 : 2000;
    b->warmup = b->quick ? 5 : 20;
    b->b64_bytes = b->quick ? 32 * MIB : GIB;
    b->utf8_bytes = b->quick ? 8 * MIB : 256 * MIB;
    b->file_bytes = b->quick ? 64 * MIB : GIB;
    b->idle_n = b->quick ? 1000 : 10000;
    b->idle_sample = b->quick ? 100 : 500;
    b->streams = b->quick ? 100 : 1000;
    return 0;
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
    printf("sbx-server benchmark%s: %ld CPUs, Linux %s, server pid %d, port %u\n",
           b.quick ? " (--quick: small sizes, a CI smoke run)" : "", sysconf(_SC_NPROCESSORS_ONLN),
           u.release, (int)b.pid, b.port);
    printf("bench command:");
    for (int i = 0; i < argc; i++)
        printf(" %s", argv[i]);
    printf("\nfigures only; nothing here asserts on timings (exit 1 = a functional failure)\n");
    print_loadavg("at start");
    if (bench_want(b.only, "exec"))
        bench_exec(&b);
    if (bench_want(b.only, "stream"))
        bench_stream(&b);
    if (bench_want(b.only, "files"))
        bench_files(&b);
    if (bench_want(b.only, "idle"))
        bench_idle(&b);
    if (bench_want(b.only, "concurrent"))
        bench_concurrent(&b);
    print_loadavg("at end");
    printf("\n%s: %u functional failure%s\n", b.failures ? "FAILED" : "done", b.failures,
           b.failures == 1 ? "" : "s");
    return b.failures ? 1 : 0;
}
