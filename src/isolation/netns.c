/* SPDX-License-Identifier: MIT */
#include "netns.h"

#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fileio.h"
#include "common/macro.h"

typedef struct {
    int fd;
    int err;
} made_t;

/* In a child that shares our memory and file table (CLONE_VM|CLONE_VFORK|CLONE_FILES): a new
 * network namespace for itself, its loopback up, and an fd of it left in the shared table. Raw
 * system calls only. */
static int make_child(void *arg)
{
    made_t *m = arg;
    if (syscall(SYS_unshare, CLONE_NEWNET) < 0)
        goto fail;
    int s = (int)syscall(SYS_socket, AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        goto fail;
    struct ifreq ifr = { .ifr_name = "lo" };
    if (syscall(SYS_ioctl, s, SIOCGIFFLAGS, &ifr) < 0)
        goto fail;
    ifr.ifr_flags |= IFF_UP;
    if (syscall(SYS_ioctl, s, SIOCSIFFLAGS, &ifr) < 0)
        goto fail;
    syscall(SYS_close, s);
    m->fd = (int)syscall(SYS_open, "/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    if (m->fd < 0)
        goto fail;
    syscall(SYS_exit, 0);
    return 0;
fail:
    m->err = errno ? errno : EIO;
    syscall(SYS_exit, 1);
    return 1;
}

int netns_make(int *ret_fd)
{
    static const size_t stack_size = 16 * 1024;
    char *stack = malloc(stack_size);
    if (!stack)
        return -ENOMEM;
    made_t m = { .fd = -1, .err = 0 };
    pid_t pid =
        clone(make_child, stack + stack_size, CLONE_VM | CLONE_VFORK | CLONE_FILES | SIGCHLD, &m);
    int e = errno;
    free(stack);
    if (pid < 0)
        return -e;
    while (waitpid(pid, NULL, __WALL) < 0 && errno == EINTR)
        ;
    if (m.fd < 0)
        return -(m.err ? m.err : EIO);
    *ret_fd = m.fd;
    return 0;
}

/* The files of /proc/<tid>/net that a sandbox without CAP_NET_ADMIN can change: by sending
 * (dev, snmp, snmp6, netstat), by holding or leaving a socket (sockstat's per-namespace counts
 * of TCP (TIME_WAIT included), UDP and raw sockets; unix), by leaving IPv6 flow labels (a
 * setsockopt sends nothing and leaves no socket, yet the namespace keeps each label, with a
 * 128-bit address the tenant chose, up to 150 s after the socket closed: a message to whoever
 * gets the namespace next), and the addresses and routes it cannot change at all. Not the
 * socket lists tcp, udp and raw: each read walks the host's whole hash table (most of the
 * janitor's time, measured), and sockstat counts them. */
static const char *const snapshot_files[] = {
    "dev",  "snmp",     "snmp6",         "netstat", "sockstat",   "sockstat6",
    "unix", "if_inet6", "ip6_flowlabel", "route",   "ipv6_route",
};

/* sockstat keeps only what counts this namespace's sockets: "inuse", "tw" and FRAG's
 * "memory". Its first line (sockets of every namespace) and the "orphan", "alloc" and "mem"
 * fields are the host's, changed by anyone's sockets. In place; returns the new length. */
static size_t sockstat_own(char *b, size_t n)
{
    size_t out = 0, i = 0;
    while (i < n) {
        char *eol = memchr(b + i, '\n', n - i);
        size_t end = eol ? (size_t)(eol - b) : n;
        if (!(end - i >= 8 && memcmp(b + i, "sockets:", 8) == 0)) {
            /* the label, then "key value" pairs */
            size_t k = i;
            while (k < end && b[k] != ' ')
                k++;
            memmove(b + out, b + i, k - i);
            out += k - i;
            while (k < end) {
                size_t key = ++k; /* past the space */
                while (k < end && b[k] != ' ')
                    k++;
                size_t key_end = k, val_end = k < end ? k + 1 : k;
                while (val_end < end && b[val_end] != ' ')
                    val_end++;
                size_t kl = key_end - key;
                bool host = (kl == 6 && memcmp(b + key, "orphan", 6) == 0) ||
                            (kl == 5 && memcmp(b + key, "alloc", 5) == 0) ||
                            (kl == 3 && memcmp(b + key, "mem", 3) == 0);
                if (!host) {
                    b[out++] = ' ';
                    memmove(b + out, b + key, val_end - key);
                    out += val_end - key;
                }
                k = val_end;
            }
            b[out++] = '\n';
        }
        i = end + 1;
    }
    return out;
}

int netns_snapshot(char *buf, size_t cap)
{
    /* the directory once, each file relative to it: walking the path from /proc for each file
     * (the thread-self link resolved every time) cost ~8 % more here (a C loop, 210 vs 229 µs
     * per check) */
    _cleanup_close_ int dir = open("/proc/thread-self/net", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0)
        return negative_errno();
    size_t len = 0;
    for (size_t i = 0; i < ELEMENTSOF(snapshot_files); i++) {
        _cleanup_close_ int fd = openat(dir, snapshot_files[i], O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            if (errno == ENOENT)
                continue; /* a protocol this kernel lacks: absent in every snapshot */
            return negative_errno();
        }
        size_t start = len;
        ssize_t n = fd_read_upto(fd, buf + len, cap - len);
        if (n < 0)
            return (int)n;
        len += (size_t)n;
        if (len == cap)
            return -ENOBUFS;
        if (strncmp(snapshot_files[i], "sockstat", 8) == 0)
            len = start + sockstat_own(buf + start, len - start);
        if (len == cap)
            return -ENOBUFS;
        buf[len++] = '\0'; /* one file from the next */
    }
    return (int)len;
}

int netns_pristine(int netns_fd, int home_fd, const char *baseline, size_t len)
{
    char buf[NETNS_SNAPSHOT_MAX];
    if (setns(netns_fd, CLONE_NEWNET) < 0)
        return 0;
    int n = netns_snapshot(buf, sizeof buf);
    if (setns(home_fd, CLONE_NEWNET) < 0)
        return negative_errno();
    return n >= 0 && (size_t)n == len && memcmp(buf, baseline, len) == 0;
}
