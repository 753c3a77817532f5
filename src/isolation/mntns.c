/* SPDX-License-Identifier: MIT */
#include "mntns.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/macro.h"

int sandbox_ns_start(sandbox_ns_t *ns)
{
    int ready[2], release[2];
    *ns = (sandbox_ns_t){ .holder = -1, .ns_fd = -EBADF, .release_fd = -EBADF };
    if (pipe2(ready, O_CLOEXEC) < 0)
        return negative_errno();
    if (pipe2(release, O_CLOEXEC) < 0) {
        int r = negative_errno();
        safe_close(ready[0]);
        safe_close(ready[1]);
        return r;
    }
    pid_t pid = fork(); /* at startup the host is small: a plain fork is cheap here */
    if (pid < 0) {
        int r = negative_errno();
        safe_close(ready[0]);
        safe_close(ready[1]);
        safe_close(release[0]);
        safe_close(release[1]);
        return r;
    }
    if (pid == 0) {
        char status = 0;
        (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
        safe_close(ready[0]);
        safe_close(release[1]);
        /* A new mount namespace whose changes never propagate back to the host, with a proc
         * instance of its own that hides processes of other uids (root still sees all). */
        if (unshare(CLONE_NEWNS) < 0)
            status = 1;
        else if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
            status = 2;
        else if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                       "hidepid=invisible") < 0 &&
                 mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2") < 0)
            status = 3;
        (void)write(ready[1], &status, 1);
        char b;
        while (read(release[0], &b, 1) < 0 && errno == EINTR)
            ;
        _exit(0);
    }
    safe_close(ready[1]);
    safe_close(release[0]);
    char status = 9;
    ssize_t n;
    do
        n = read(ready[0], &status, 1);
    while (n < 0 && errno == EINTR);
    safe_close(ready[0]);
    ns->holder = pid;
    ns->release_fd = release[1];
    if (n != 1 || status != 0) {
        sandbox_ns_stop(ns);
        return status == 1 ? -EPERM : -ENOTSUP;
    }
    char p[64];
    (void)snprintf(p, sizeof p, "/proc/%d/ns/mnt", (int)pid);
    ns->ns_fd = open(p, O_RDONLY | O_CLOEXEC);
    (void)snprintf(ns->proc_path, sizeof ns->proc_path, "/proc/%d/root/proc", (int)pid);
    if (ns->ns_fd < 0) {
        int r = negative_errno();
        sandbox_ns_stop(ns);
        return r;
    }
    return 0;
}

void sandbox_ns_stop(sandbox_ns_t *ns)
{
    ns->ns_fd = safe_close(ns->ns_fd);
    ns->release_fd = safe_close(ns->release_fd);
    if (ns->holder > 0) {
        (void)kill(ns->holder, SIGKILL);
        ns->holder = -1; /* reaped by the SIGCHLD handler (or already gone at exit) */
    }
}
