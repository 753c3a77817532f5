/* SPDX-License-Identifier: MIT */
#include "bench_util.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/macro.h"
#include "common/strutil.h"

uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void section(const char *title) { printf("\n== %s\n", title); }

void fig(const char *label, double v, const char *unit, const char *note)
{
    printf("  %-52s %12.3f %-6s %s\n", label, v, unit, note ? note : "");
}

const char *target_note(bool met, const char *target, char *buf, size_t cap)
{
    (void)snprintf(buf, cap, "target %s: %s", target, met ? "met" : "MISSED");
    return buf;
}

ssize_t read_small_file(const char *path, char *buf, size_t cap)
{
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return negative_errno();
    size_t len = 0;
    while (len + 1 < cap) {
        ssize_t n = read(fd, buf + len, cap - 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return negative_errno();
        if (n == 0)
            break;
        len += (size_t)n;
    }
    buf[len] = '\0';
    return (ssize_t)len;
}

uint64_t server_cpu_ns(pid_t pid)
{
    char path[64], buf[2048];
    uint64_t ns;
    (void)snprintf(path, sizeof path, "/proc/%d/schedstat", (int)pid);
    if (read_small_file(path, buf, sizeof buf) > 0 &&
        parse_u64(sv_make(buf, strspn(buf, "0123456789")), UINT64_MAX, &ns) >= 0)
        return ns;
    (void)snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    if (read_small_file(path, buf, sizeof buf) < 0)
        return 0;
    const char *p = strrchr(buf, ')');
    uint64_t v[2] = { 0, 0 };
    /* fields after the command name: state is field 3; utime and stime are 14 and 15 */
    for (int field = 2; p && *p && field <= 15; field++) {
        p = strchr(p, ' ');
        if (!p)
            break;
        p++;
        if (field + 1 == 14 || field + 1 == 15) {
            size_t n = strcspn(p, " ");
            if (parse_u64(sv_make(p, n), UINT64_MAX, &v[field + 1 - 14]) < 0)
                return 0;
        }
    }
    long hz = sysconf(_SC_CLK_TCK);
    return (v[0] + v[1]) * (1000000000u / (uint64_t)(hz > 0 ? hz : 100));
}

/* CPU time of pid's children whose comm is one of names (each "name\n"), and of their own
 * children of those names (the janitor's remover). */
static uint64_t children_cpu_ns(pid_t pid, const char *const *names, size_t n, int depth)
{
    char path[96], buf[4096], comm[32];
    uint64_t ns = 0;
    (void)snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)pid, (int)pid);
    if (depth > 1 || read_small_file(path, buf, sizeof buf) <= 0)
        return 0;
    for (char *save = NULL, *t = strtok_r(buf, " \n", &save); t; t = strtok_r(NULL, " \n", &save)) {
        uint64_t child;
        if (parse_u64(sv_make(t, strlen(t)), INT32_MAX, &child) < 0)
            continue;
        (void)snprintf(path, sizeof path, "/proc/%d/comm", (int)child);
        if (read_small_file(path, comm, sizeof comm) <= 0)
            continue;
        for (size_t i = 0; i < n; i++)
            if (strcmp(comm, names[i]) == 0) {
                ns += server_cpu_ns((pid_t)child) +
                      children_cpu_ns((pid_t)child, names, n, depth + 1);
                break;
            }
    }
    return ns;
}

/* The server's CPU time and its helpers' (its children named sbx-spawner or sbx-janitor, and
 * the janitor's sbx-remover: the spawns, cgroups and homes they do for it), not the sandboxes'
 * commands (also its children). */
uint64_t server_tree_cpu_ns(pid_t pid)
{
    static const char *const names[] = { "sbx-spawner\n", "sbx-janitor\n", "sbx-remover\n" };
    return server_cpu_ns(pid) + children_cpu_ns(pid, names, 3, 0);
}

int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

uint64_t percentile(const uint64_t *v, size_t n, unsigned pct)
{
    size_t rank = (n * pct + 99) / 100;
    return v[rank > 0 ? rank - 1 : 0];
}

void print_loadavg(const char *when)
{
    char buf[128];
    if (read_small_file("/proc/loadavg", buf, sizeof buf) > 0)
        printf("load average %s (1, 5, 15 min; runnable/total): %s", when, buf);
}

int free_port(void)
{
    _cleanup_close_ int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t al = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) < 0 ||
        getsockname(fd, (struct sockaddr *)&a, &al) < 0)
        return 1;
    printf("%u\n", ntohs(a.sin_port));
    return 0;
}

bool bench_want(const char *only, const char *name)
{
    if (!only)
        return true;
    size_t nl = strlen(name);
    for (const char *p = only; *p;) {
        size_t k = strcspn(p, ",");
        if (k == nl && strncmp(p, name, nl) == 0)
            return true;
        p += k + (p[k] == ',');
    }
    return false;
}
