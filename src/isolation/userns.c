/* SPDX-License-Identifier: MIT */
#include "userns.h"

#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/macro.h"

extern char **environ;

static int write_map(pid_t pid, const char *file, const char *val)
{
    char path[64];
    (void)snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, file);
    _cleanup_close_ int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return negative_errno();
    size_t n = strlen(val);
    return write(fd, val, n) == (ssize_t)n ? 0 : negative_errno();
}

int userns_write_maps(pid_t pid, uint32_t base, uint32_t count)
{
    char map[64];
    (void)snprintf(map, sizeof map, "0 %u %u\n", base, count);
    int r = write_map(pid, "uid_map", map);
    return r < 0 ? r : write_map(pid, "gid_map", map);
}

int userns_create(uint32_t base, uint32_t count, int *ret_fd)
{
    int p[2], ready[2];
    if (pipe2(p, O_CLOEXEC) < 0)
        return negative_errno();
    if (pipe2(ready, O_CLOEXEC) < 0) {
        int r = negative_errno();
        safe_close(p[0]);
        safe_close(p[1]);
        return r;
    }
    /* A holder process makes the new user namespace as host uid `base` (the run's root), not
     * as root: the kernel charges what every uid of a namespace holds (inotify instances,
     * POSIX message queue bytes, queued signals, ...) to its owner one level up too, so with
     * root as every run's owner one run took all of root's and left none to the host's root
     * processes nor to any other run. Nothing in the host's namespace runs as `base` (its
     * owner would hold every capability in the run's namespace). The holder waits until the
     * maps are written and the namespace is held by an fd, then exits. */
    pid_t pid = fork();
    if (pid < 0) {
        int r = negative_errno();
        safe_close(p[0]);
        safe_close(p[1]);
        safe_close(ready[0]);
        safe_close(ready[1]);
        return r;
    }
    if (pid == 0) {
        char c = 1;
        (void)close(p[1]);
        (void)close(ready[0]);
        if (syscall(SYS_setgroups, 0, NULL) < 0 || syscall(SYS_setresgid, base, base, base) < 0 ||
            syscall(SYS_setresuid, base, base, base) < 0 || unshare(CLONE_NEWUSER) < 0)
            _exit(1);
        if (write(ready[1], &c, 1) != 1)
            _exit(1);
        while (read(p[0], &c, 1) < 0 && errno == EINTR)
            ;
        _exit(0);
    }
    safe_close(p[0]);
    safe_close(ready[1]);
    char c;
    ssize_t k;
    do
        k = read(ready[0], &c, 1);
    while (k < 0 && errno == EINTR);
    safe_close(ready[0]);
    int r = k == 1 ? userns_write_maps(pid, base, count) : -EPERM;
    int fd = -1;
    if (r >= 0) {
        char path[64];
        (void)snprintf(path, sizeof path, "/proc/%d/ns/user", (int)pid);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            r = negative_errno();
    }
    safe_close(p[1]); /* the holder exits */
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
    if (r < 0)
        return r;
    *ret_fd = fd;
    return 0;
}

int userns_enter_as_root(int userns_fd)
{
    /* After setns the process is the namespace's overflow uid with every capability inside
     * it; becoming its uid 0 (host id base) keeps them for the exec that follows. */
    if (syscall(SYS_setns, userns_fd, CLONE_NEWUSER) < 0)
        return negative_errno();
    if (syscall(SYS_setgroups, 0, NULL) < 0)
        return negative_errno();
    if (syscall(SYS_setresgid, 0, 0, 0) < 0)
        return negative_errno();
    if (syscall(SYS_setresuid, 0, 0, 0) < 0)
        return negative_errno();
    return 0;
}

int userns_spawn(uint32_t base, uint32_t count, int dirfd, int in_fd, int out_fd,
                 char *const argv[], pid_t *ret_pid)
{
    _cleanup_close_ int ns = -EBADF;
    int r = userns_create(base, count, &ns);
    if (r < 0)
        return r;
    _cleanup_close_ int nul = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (nul < 0)
        return negative_errno();
    pid_t pid = fork();
    if (pid < 0)
        return negative_errno();
    if (pid == 0) {
        sigset_t none;
        sigemptyset(&none);
        (void)sigprocmask(SIG_SETMASK, &none, NULL);
        if (dup2(in_fd >= 0 ? in_fd : nul, 0) < 0 || dup2(out_fd >= 0 ? out_fd : nul, 1) < 0 ||
            fchdir(dirfd) < 0 || userns_enter_as_root(ns) < 0)
            _exit(126);
        execve(argv[0], argv, environ);
        _exit(127);
    }
    *ret_pid = pid;
    return 0;
}

int userns_run(uint32_t base, uint32_t count, int dirfd, int in_fd, int out_fd, char *const argv[],
               int *ret_status)
{
    pid_t pid;
    int r = userns_spawn(base, count, dirfd, in_fd, out_fd, argv, &pid);
    if (r < 0)
        return r;
    int st = 0;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return negative_errno();
    if (ret_status)
        *ret_status = st;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -EIO;
}
