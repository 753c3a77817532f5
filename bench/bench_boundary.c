/* SPDX-License-Identifier: MIT */
/* bench-boundary: what the run boundary costs at start, each figure beside its baseline from the
 * same run (as root):
 *   - a run's process started and exited, step by step: the namespaces the substrate had before
 *     (mount, pid, ipc, uts) as the baseline, then + a user namespace (made and entered), then +
 *     a network namespace (loopback up), then the whole substrate (every mount, the /proc masks,
 *     the seccomp profile) as sbx-node starts a run: each runs /bin/true and is waited for;
 *   - a pooled sandbox's network namespace: made on the create path vs taken from the warm set.
 * Targets (issue 8): user + network namespaces add <= 15 ms to a dedicated start and
 * <= 100 us to a pool sandbox create. Prints figures; never judges timings by its exit status.
 *
 *   build/bench/bench-boundary [--quick] [--iterations N]
 */
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "common/macro.h"
#include "common/strutil.h"
#include "isolation/confine.h"
#include "isolation/filter.h"
#include "isolation/idrange.h"
#include "isolation/netns.h"
#include "isolation/userns.h"
#include "node/substrate.h"

#define MAXN 2000
extern char **environ;

enum { V_BASE, V_USERNS, V_NETNS };

/* A process in fresh namespaces that execs /bin/true: V_BASE the old set, V_USERNS + entering a
 * user namespace made for it, V_NETNS + its own network namespace. Returns ns from clone to
 * reaped exit. */
static uint64_t one_plain(int variant, uint32_t base)
{
    uint64_t t0 = now_ns();
    int ns = -1;
    if (variant >= V_USERNS && userns_create(base, IDRANGE_BLOCK, &ns) < 0)
        return 0;
    unsigned long flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | SIGCHLD;
    if (variant >= V_NETNS)
        flags |= CLONE_NEWNET;
    pid_t pid = (pid_t)syscall(SYS_clone, flags, NULL, NULL, NULL, NULL);
    if (pid == 0) {
        if (ns >= 0 && userns_enter_as_root(ns) < 0)
            _exit(126);
        char *const argv[] = { "/bin/true", NULL };
        execve(argv[0], argv, environ);
        _exit(127);
    }
    safe_close(ns);
    int st;
    while (pid > 0 && waitpid(pid, &st, 0) < 0)
        ;
    return pid > 0 ? now_ns() - t0 : 0;
}

static uint64_t one_substrate(const char *dir, int i, uint32_t base, const seccomp_filter_t *f)
{
    char root[512], sock[64];
    (void)snprintf(root, sizeof root, "%s/root%d", dir, i);
    if (mkdir(root, 0755) < 0 || chown(root, base, base) < 0)
        return 0;
    (void)snprintf(sock, sizeof sock, "bench%d", i);
    int nul = open("/dev/null", O_RDWR | O_CLOEXEC);
    uint64_t t0 = now_ns();
    int ns = -1;
    if (userns_create(base, IDRANGE_BLOCK, &ns) < 0)
        return 0;
    char *const argv[] = { "/bin/true", NULL };
    char *const envp[] = { "PATH=/usr/bin:/bin", NULL };
    struct stat ast;
    if (stat("/bin/true", &ast) < 0)
        return 0;
    substrate_spec_t sp = { .root = root,
                            .agent_bin = "/bin/true",
                            .agent_dev = ast.st_dev,
                            .agent_ino = ast.st_ino,
                            .hostname = sock,
                            .argv = argv,
                            .envp = envp,
                            .bridge_fd = nul,
                            .log_fd = nul,
                            .userns_fd = ns,
                            .netns_fd = -1,
                            .filter = f };
    pid_t pid;
    uint64_t start;
    sbx_err_t err;
    int r = substrate_spawn(&sp, &pid, &start, &err);
    safe_close(ns);
    if (r == -ESRCH) { /* /bin/true ended before the spawn looked (it reaped it): started */
        safe_close(nul);
        return now_ns() - t0;
    }
    if (r < 0) {
        fprintf(stderr, "bench-boundary: substrate: %s\n", err.msg);
        safe_close(nul);
        return 0;
    }
    int st;
    while (waitpid(pid, &st, 0) < 0)
        ;
    uint64_t t = now_ns() - t0;
    safe_close(nul);
    return t;
}

/* exec /bin/true as a pooled sandbox's uid through the confined spawn, with or without its
 * own network namespace (setns in the child): the per-exec cost of the pool's new layer */
static uint64_t one_pool_exec(const char *home, int netns, int nul)
{
    confine_spec_t sp = { .uid = 20999,
                          .gid = 20999,
                          .mntns_fd = -1,
                          .netns_fd = netns,
                          .ruleset_fd = -1,
                          .home_path = home,
                          .cwd_rel = "" };
    for (int i = 0; i < CONFINE_MAX_CGROUPS; i++)
        sp.cgroup_procs_fds[i] = -1;
    char *const argv[] = { "/bin/true", NULL };
    char *const envp[] = { "PATH=/usr/bin:/bin", NULL };
    sp.candidates[0] = "/bin/true";
    sp.n_candidates = 1;
    sp.argv = argv;
    sp.envp = envp;
    sp.stdin_fd = sp.stdout_fd = sp.stderr_fd = nul;
    uint64_t t0 = now_ns();
    pid_t pid;
    if (confine_spawn(&sp, &pid) < 0)
        return 0;
    if (sp.pidfd >= 0)
        close(sp.pidfd);
    int st;
    while (waitpid(pid, &st, 0) < 0)
        ;
    return now_ns() - t0;
}

static void report(const char *label, uint64_t *v, size_t n, const char *note)
{
    qsort(v, n, sizeof *v, cmp_u64);
    char l[160];
    (void)snprintf(l, sizeof l, "%s, p50", label);
    fig(l, (double)percentile(v, n, 50) / 1e6, "ms", note);
}

int main(int argc, char **argv)
{
    size_t n = 200;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            n = 10;
        else if (!strcmp(argv[i], "--iterations") && i + 1 < argc) {
            uint64_t v;
            n = parse_u64_str(argv[++i], MAXN, &v) >= 0 ? (size_t)v : 0;
        }
    }
    if (n < 1 || n > MAXN)
        n = 200;
    if (geteuid() != 0) {
        fprintf(stderr, "bench-boundary: needs root (namespaces, mounts)\n");
        return 2;
    }
    char dir[] = "/tmp/sbx-bench-boundary-XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    seccomp_filter_t f;
    if (seccomp_run_filter_build(&f, false) < 0)
        return 1;
    /* a block nobody else uses: the tests take 1.0e9..2.0e9, the other benches 2.0e9..2.08e9 */
    const uint32_t base = 2090000000u;
    static uint64_t v[4][MAXN];
    print_loadavg("start");
    section("a run's process: clone -> exec /bin/true -> reaped, interleaved");
    for (size_t i = 0; i < n; i++) {
        v[0][i] = one_plain(V_BASE, base);
        v[1][i] = one_plain(V_USERNS, base);
        v[2][i] = one_plain(V_NETNS, base);
        v[3][i] = one_substrate(dir, (int)i, base, &f);
        if (!v[0][i] || !v[1][i] || !v[2][i] || !v[3][i]) {
            fprintf(stderr, "bench-boundary: a start failed (iteration %zu)\n", i);
            return 1;
        }
    }
    uint64_t p[4];
    for (int k = 0; k < 4; k++) {
        qsort(v[k], n, sizeof v[k][0], cmp_u64);
        p[k] = percentile(v[k], n, 50);
    }
    report("mount+pid+ipc+uts namespaces (the substrate's set before; baseline)", v[0], n, "");
    report("+ a user namespace, made and entered", v[1], n, "");
    report("+ a network namespace, loopback up", v[2], n, "");
    char note[160], tn[96];
    double added = ((double)p[2] - (double)p[0]) / 1e6;
    (void)snprintf(note, sizeof note, "user + network namespaces add %.2f ms (%s)", added,
                   target_note(added <= 15.0, "<= 15 ms", tn, sizeof tn));
    fig("added by the user and network namespaces", added, "ms", note);
    report("the whole substrate (+ root, /usr, masked /proc, /dev, seccomp, pivot)", v[3], n, "");

    section("a pooled sandbox's network namespace");
    static uint64_t m[MAXN], w[MAXN];
    int fds[MAXN];
    for (size_t i = 0; i < n; i++) {
        uint64_t t0 = now_ns();
        if (netns_make(&fds[i]) < 0) {
            fprintf(stderr, "bench-boundary: netns_make failed\n");
            return 1;
        }
        m[i] = now_ns() - t0;
    }
    /* the warm set: the create path only takes an fd made earlier */
    size_t k = n;
    for (size_t i = 0; i < n; i++) {
        uint64_t t0 = now_ns();
        int fd = fds[--k];
        w[i] = now_ns() - t0;
        close(fd);
    }
    qsort(m, n, sizeof m[0], cmp_u64);
    qsort(w, n, sizeof w[0], cmp_u64);
    double wu = (double)percentile(w, n, 50) / 1e3;
    fig("made on the create path (netns_make), p50", (double)percentile(m, n, 50) / 1e3, "us",
        "the refill timer pays this, off the create path");
    (void)snprintf(note, sizeof note, "%s", target_note(wu <= 100.0, "<= 100 us", tn, sizeof tn));
    fig("taken from the warm set, p50", wu, "us", note);
    section("exec /bin/true as a pooled sandbox (confined spawn), interleaved");
    char home[600];
    (void)snprintf(home, sizeof home, "%s/home", dir);
    int nul = open("/dev/null", O_RDWR | O_CLOEXEC), ns = -1;
    if (chmod(dir, 0711) < 0 || mkdir(home, 0700) < 0 || chown(home, 20999, 20999) < 0 ||
        netns_make(&ns) < 0) {
        fprintf(stderr, "bench-boundary: pool exec setup failed\n");
        return 1;
    }
    for (size_t i = 0; i < n; i++) {
        m[i] = one_pool_exec(home, -1, nul);
        w[i] = one_pool_exec(home, ns, nul);
        if (!m[i] || !w[i]) {
            fprintf(stderr, "bench-boundary: a confined spawn failed\n");
            return 1;
        }
    }
    close(ns);
    close(nul);
    qsort(m, n, sizeof m[0], cmp_u64);
    qsort(w, n, sizeof w[0], cmp_u64);
    double pm = (double)percentile(m, n, 50) / 1e6, pw = (double)percentile(w, n, 50) / 1e6;
    fig("without a network namespace (before), p50", pm, "ms", "");
    (void)snprintf(note, sizeof note, "+%.3f ms for entering the sandbox's network namespace",
                   pw - pm);
    fig("with the sandbox's own network namespace, p50", pw, "ms", note);
    seccomp_filter_done(&f);
    char *const rm[] = { "/bin/rm", "-rf", "--one-file-system", dir, NULL };
    pid_t pid = fork();
    if (pid == 0) {
        execve(rm[0], rm, environ);
        _exit(127);
    }
    (void)waitpid(pid, NULL, 0);
    print_loadavg("end");
    return 0;
}
