/* SPDX-License-Identifier: MIT */
#include "egress.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cap/egress.h"
#include "common/macro.h"
#include "isolation/userns.h"

extern char **environ;

#define PASTA "/usr/bin/pasta"
#define NFT "/usr/sbin/nft"

static const char *const deny4[] = { "0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/3" };
static const char *const deny6[] = { "::/128",   "::1/128",           "fe80::/10",
                                     "ff00::/8", "fd00:ec2::254/128", "::ffff:0:0/96" };
static const char *const private4[] = { "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                                        "100.64.0.0/10" };
static const char *const private6[] = { "fc00::/7" };

/* addr & the mask of prefix bits, in place (len bytes) */
static void mask_to_prefix(uint8_t *addr, size_t len, unsigned prefix)
{
    for (size_t i = 0; i < len; i++) {
        unsigned keep = prefix >= 8 * (i + 1) ? 8 : prefix > 8 * i ? prefix - 8 * (unsigned)i : 0;
        addr[i] &= (uint8_t)(0xff00u >> keep);
    }
}

static unsigned mask_bits(const uint8_t *mask, size_t len)
{
    unsigned n = 0;
    for (size_t i = 0; i < len; i++)
        n += (unsigned)__builtin_popcount(mask[i]);
    return n;
}

/* A set of the fixed elements, and of every address of the host (`what` HOST_ADDRS) or every
 * network its interfaces are on (HOST_NETS) in `family`. */
enum { HOST_NONE, HOST_ADDRS, HOST_NETS };

static void put_set(FILE *f, const char *name, const char *type, const char *const *fixed, size_t n,
                    int family, int what)
{
    fprintf(f, "  set %s {\n    type %s; flags interval; auto-merge\n    elements = { ", name,
            type);
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%s%s", i ? ", " : "", fixed[i]);
    struct ifaddrs *ifa = NULL;
    if (what != HOST_NONE && getifaddrs(&ifa) == 0) {
        for (struct ifaddrs *a = ifa; a; a = a->ifa_next) {
            if (!a->ifa_addr || a->ifa_addr->sa_family != family ||
                (what == HOST_NETS && !a->ifa_netmask))
                continue;
            uint8_t addr[16], mask[16];
            size_t len = family == AF_INET ? 4 : 16;
            memcpy(addr,
                   family == AF_INET
                       ? (const void *)&((struct sockaddr_in *)a->ifa_addr)->sin_addr
                       : (const void *)&((struct sockaddr_in6 *)a->ifa_addr)->sin6_addr,
                   len);
            char s[INET6_ADDRSTRLEN];
            if (what == HOST_NETS) {
                memcpy(mask,
                       family == AF_INET
                           ? (const void *)&((struct sockaddr_in *)a->ifa_netmask)->sin_addr
                           : (const void *)&((struct sockaddr_in6 *)a->ifa_netmask)->sin6_addr,
                       len);
                egress_rule_t net = { .family = family, .prefix = mask_bits(mask, len) };
                if (net.prefix < (family == AF_INET ? 8u : 16u))
                    continue; /* not a neighbourhood: a point-to-point or odd link */
                memcpy(net.addr, addr, len);
                mask_to_prefix(net.addr, len, net.prefix);
                char cidr[INET6_ADDRSTRLEN + 8];
                egress_rule_addr(&net, cidr, sizeof cidr);
                fprintf(f, ", %s", cidr);
            } else if (inet_ntop(family, addr, s, sizeof s))
                fprintf(f, ", %s", s);
        }
        freeifaddrs(ifa);
    }
    fprintf(f, " }\n  }\n");
}

int egress_ruleset(json_t *allow, char **ret, sbx_err_t *err)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return sbx_err(err, -ENOMEM, "out of memory");
    fprintf(f, "table inet sbx {\n");
    /* every address of the host: a run must never reach the host itself */
    put_set(f, "deny4", "ipv4_addr", deny4, ELEMENTSOF(deny4), AF_INET, HOST_ADDRS);
    put_set(f, "deny6", "ipv6_addr", deny6, ELEMENTSOF(deny6), AF_INET6, HOST_ADDRS);
    /* without an allow-list, neither private ranges nor the host's neighbours (the networks
     * its interfaces are on, whatever their addresses: a gateway, other machines) */
    put_set(f, "private4", "ipv4_addr", private4, ELEMENTSOF(private4), AF_INET, HOST_NETS);
    put_set(f, "private6", "ipv6_addr", private6, ELEMENTSOF(private6), AF_INET6, HOST_NETS);
    fprintf(f, "  chain out {\n    type filter hook output priority 0; policy drop;\n"
               "    oif \"lo\" accept\n"
               "    ip daddr " EGRESS_DNS " meta l4proto { tcp, udp } th dport 53 accept\n"
               "    ip daddr @deny4 jump refuse\n    ip6 daddr @deny6 jump refuse\n");
    size_t i;
    json_t *e;
    bool bad = false;
    json_array_foreach(allow, i, e) {
        egress_rule_t r;
        if (!json_is_string(e) || egress_rule_parse(json_string_value(e), &r) < 0) {
            bad = true;
            break;
        }
        char a[64];
        egress_rule_addr(&r, a, sizeof a);
        const char *fam = r.family == AF_INET ? "ip" : "ip6";
        if (r.port)
            fprintf(f, "    %s daddr %s meta l4proto { tcp, udp } th dport %u accept\n", fam, a,
                    r.port);
        else
            fprintf(f, "    %s daddr %s accept\n", fam, a);
    }
    if (json_array_size(allow) == 0)
        fprintf(f, "    ip daddr @private4 jump refuse\n    ip6 daddr @private6 jump refuse\n"
                   "    accept\n");
    fprintf(f, "    jump refuse\n  }\n"
               "  chain refuse {\n    meta l4proto tcp reject with tcp reset\n"
               "    reject with icmpx admin-prohibited\n  }\n}\n");
    if (fclose(f) != 0 || bad) {
        free(buf);
        return bad ? sbx_err(err, -EINVAL, "egress_allow: an entry does not parse")
                   : sbx_err(err, -ENOMEM, "out of memory");
    }
    *ret = buf;
    return 0;
}

/* nft -f - inside pid's network namespace (as host root: the namespace is the host's user
 * namespace's, so only the node can change it). */
static int apply_ruleset(pid_t pid, const char *rules, sbx_err_t *err)
{
    char ns[64];
    (void)snprintf(ns, sizeof ns, "/proc/%d/ns/net", (int)pid);
    _cleanup_close_ int nsfd = open(ns, O_RDONLY | O_CLOEXEC);
    if (nsfd < 0) {
        int r = negative_errno();
        return sbx_err(err, r, "the run's network namespace: %s", strerror(-r));
    }
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0)
        return negative_errno();
    pid_t c = fork();
    if (c < 0) {
        int r = negative_errno();
        safe_close(p[0]);
        safe_close(p[1]);
        return r;
    }
    if (c == 0) {
        sigset_t none;
        sigemptyset(&none);
        (void)sigprocmask(SIG_SETMASK, &none, NULL);
        if (syscall(SYS_setns, nsfd, CLONE_NEWNET) < 0 || dup2(p[0], 0) < 0)
            _exit(126);
        char *const argv[] = { NFT, "-f", "-", NULL };
        execve(argv[0], argv, environ);
        _exit(127);
    }
    safe_close(p[0]);
    size_t n = strlen(rules), off = 0;
    while (off < n) {
        ssize_t w = write(p[1], rules + off, n - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        off += (size_t)w;
    }
    safe_close(p[1]);
    int st = 0;
    while (waitpid(c, &st, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        return sbx_err(err, -EIO, "the run's firewall (nft) failed (status 0x%x)%s", st,
                       WIFEXITED(st) && WEXITSTATUS(st) == 127 ? ": is nftables installed?" : "");
    }
    return 0;
}

int egress_netns_make(uint32_t owner, pid_t *ret_holder, int *ret_netns, sbx_err_t *err)
{
    int up[2], down[2]; /* child -> node, node -> child */
    if (pipe2(up, O_CLOEXEC) < 0)
        return negative_errno();
    if (pipe2(down, O_CLOEXEC) < 0) {
        safe_close(up[0]);
        safe_close(up[1]);
        return negative_errno();
    }
    pid_t h = fork();
    if (h < 0) {
        int r = negative_errno();
        safe_close(up[0]), safe_close(up[1]), safe_close(down[0]), safe_close(down[1]);
        return r;
    }
    if (h == 0) {
        char c = 0;
        sigset_t none;
        sigemptyset(&none);
        (void)sigprocmask(SIG_SETMASK, &none, NULL);
        /* It never executes anything: it must not keep the node's descriptors (its listening
         * socket: a restarted node could not bind its address while this process holds it). */
        int lo = MIN(up[1], down[0]), hi = MAX(up[1], down[0]);
        if (lo > 3)
            (void)syscall(SYS_close_range, 3, lo - 1, 0);
        if (hi > lo + 1)
            (void)syscall(SYS_close_range, lo + 1, hi - 1, 0);
        (void)syscall(SYS_close_range, hi + 1, ~0U, 0);
        (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
        /* as `owner` first, so that the user namespace is owned by it */
        if (syscall(SYS_setgroups, 0, NULL) < 0 ||
            syscall(SYS_setresgid, owner, owner, owner) < 0 ||
            syscall(SYS_setresuid, owner, owner, owner) < 0 ||
            /* the uid change made it undumpable; pasta (same uid) must open its namespaces */
            prctl(PR_SET_DUMPABLE, 1) < 0 || unshare(CLONE_NEWUSER) < 0 ||
            write(up[1], &c, 1) != 1 || read(down[0], &c, 1) != 1 || unshare(CLONE_NEWNET) < 0)
            _exit(1);
        int sk = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        struct ifreq ifr = { .ifr_name = "lo" };
        if (sk < 0 || ioctl(sk, SIOCGIFFLAGS, &ifr) < 0)
            _exit(1);
        ifr.ifr_flags |= IFF_UP;
        if (ioctl(sk, SIOCSIFFLAGS, &ifr) < 0 || write(up[1], &c, 1) != 1)
            _exit(1);
        for (;;) /* hold the namespaces until the node ends this process */
            pause();
    }
    safe_close(up[1]);
    safe_close(down[0]);
    char c;
    int r = read(up[0], &c, 1) == 1 ? 0 : -EIO;
    if (r >= 0)
        r = userns_write_maps(h, owner, 1);
    if (r >= 0 && (write(down[1], &c, 1) != 1 || read(up[0], &c, 1) != 1))
        r = -EIO;
    int fd = -1;
    if (r >= 0) {
        char ns[64];
        (void)snprintf(ns, sizeof ns, "/proc/%d/ns/net", (int)h);
        fd = open(ns, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            r = negative_errno();
    }
    safe_close(up[0]);
    safe_close(down[1]);
    if (r < 0) {
        (void)kill(h, SIGKILL);
        (void)waitpid(h, NULL, 0);
        return sbx_err(err, r, "the run's network namespace: %s", strerror(-r));
    }
    *ret_holder = h;
    *ret_netns = fd;
    return 0;
}

/* In a forked child (async-signal-safe calls only): detach every mount of this mount namespace
 * whose mount point is below `dir` ("<dir>/..."), reading /proc/self/mountinfo a piece at a
 * time. A detached mount takes the mounts below it along; their own lines then fail, which
 * is fine. */
static void detach_mounts_below(const char *dir)
{
    static char buf[65536];
    size_t dlen = strlen(dir), have = 0;
    int fd = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    for (;;) {
        ssize_t k = read(fd, buf + have, sizeof buf - 1 - have);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0 && have == 0)
            break;
        have += k > 0 ? (size_t)k : 0;
        buf[have] = 0;
        char *end = memchr(buf, '\n', have);
        if (!end && k > 0 && have < sizeof buf - 1)
            continue; /* a line not read whole yet */
        if (!end)
            end = buf + have; /* the last line, or one longer than the buffer: taken as is */
        *end = 0;
        /* field 5 is the mount point, with space, tab, newline and backslash as \ooo */
        char *f = buf;
        for (int i = 0; i < 4 && f; i++) {
            f = strchr(f, ' ');
            f = f ? f + 1 : NULL;
        }
        char *sp = f ? strchr(f, ' ') : NULL;
        if (sp) {
            *sp = 0;
            char *o = f;
            for (char *q = f; *q; q++) {
                if (q[0] == '\\' && q[1] >= '0' && q[1] <= '3' && q[2] >= '0' && q[2] <= '7' &&
                    q[3] >= '0' && q[3] <= '7') {
                    *o++ = (char)((q[1] - '0') << 6 | (q[2] - '0') << 3 | (q[3] - '0'));
                    q += 3;
                } else
                    *o++ = *q;
            }
            *o = 0;
            if (strncmp(f, dir, dlen) == 0 && f[dlen] == '/')
                (void)umount2(f, MNT_DETACH);
        }
        size_t used = (size_t)(end - buf) + (end < buf + have ? 1 : 0);
        memmove(buf, buf + used, have - used);
        have -= used;
    }
    (void)close(fd);
}

int egress_start(pid_t holder, uint32_t owner, json_t *allow, const char *tun_path,
                 const char *detach, pid_t *ret_pasta, sbx_err_t *err)
{
    _cleanup_free_ char *rules = NULL;
    int r = egress_ruleset(allow, &rules, err);
    if (r < 0)
        return -EINVAL;
    r = apply_ruleset(holder, rules, err);
    if (r < 0)
        return r;
    if (access(PASTA, X_OK) < 0) {
        return sbx_err(err, -ENOENT, "egress needs %s (Debian package passt)", PASTA);
    }
    char target[16], runas[32];
    (void)snprintf(target, sizeof target, "%d", (int)holder);
    (void)snprintf(runas, sizeof runas, "%u:%u", owner, owner);
    /* pasta runs as `owner` (no capability on the host) and joins the holder's user and
     * network namespaces; no port of the host is forwarded into the run and none of the run's
     * out (-t/-u/-T/-U none); the gateway is not mapped to the host's loopback (--no-map-gw). */
    char *const argv[] = { PASTA, "--runas", runas,         "--config-net",  "-f",       "-q",
                           "-t",  "none",    "-u",          "none",          "-T",       "none",
                           "-U",  "none",    "--no-map-gw", "--dns-forward", EGRESS_DNS, target,
                           NULL };
    /* pasta's own tun device node: only `owner` may open it */
    (void)unlink(tun_path);
    if (mknod(tun_path, S_IFCHR | 0600, makedev(10, 200)) < 0 ||
        chown(tun_path, owner, owner) < 0) {
        r = negative_errno();
        return sbx_err(err, r, "tun device for pasta: %s", strerror(-r));
    }
    int nul = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (nul < 0)
        return negative_errno();
    pid_t pp = fork();
    if (pp < 0) {
        r = negative_errno();
        safe_close(nul);
        return r;
    }
    if (pp == 0) {
        sigset_t none;
        sigemptyset(&none);
        (void)sigprocmask(SIG_SETMASK, &none, NULL);
        /* default dispositions: the node ignores SIGPIPE, and this pasta treats an ignored
         * SIGPIPE at start as a failure to install its handlers */
        for (int sig = 1; sig < NSIG; sig++)
            (void)signal(sig, SIG_DFL);
        if (dup2(nul, 0) < 0 || dup2(nul, 1) < 0 || unshare(CLONE_NEWNS) < 0 ||
            mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
            _exit(126);
        detach_mounts_below(detach); /* before the bind below: the tun node is in a run's dir */
        if (mount(tun_path, "/dev/net/tun", NULL, MS_BIND, NULL) < 0)
            _exit(126);
        execve(PASTA, argv, environ);
        _exit(127);
    }
    safe_close(nul);
    *ret_pasta = pp;
    return 0;
}
