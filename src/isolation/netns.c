/* SPDX-License-Identifier: MIT */
#include "netns.h"

#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

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
