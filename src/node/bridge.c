/* SPDX-License-Identifier: MIT */
/* The bridge from the node to a run's agent is a unix socket in a 0700 directory of the node.
 * Before a single byte is forwarded, the node checks who is listening on it: the socket file
 * must be the one the node created, and the listening process (SO_PEERCRED) must be the
 * process the node started for this activation — same pid, same start time (a reused pid
 * differs) — and that process must be executing the agent binary the node bind-mounted into
 * the run (/proc/<pid>/exe has the device and inode the node recorded when it opened that file
 * for the install): a run whose command listens on the bridge itself, or that executes
 * anything but the agent, is refused, whatever it ran at spawn. Every connection is checked
 * again; there is no reconnect that skips it. */
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include "node.h"
#include "substrate.h"

int bridge_connect(const run_t *r, int *ret_fd, sbx_err_t *err)
{
    struct stat st;
    if (r->state != RUN_RUNNING || r->pid <= 0)
        return sbx_err(err, -ESRCH, "%s", "the run is not running");
    if (lstat(r->sock_path, &st) < 0 || !S_ISSOCK(st.st_mode) || st.st_ino != r->sock_ino ||
        st.st_uid != r->sock_uid)
        return sbx_err(err, -EPERM, "%s",
                       "bridge socket is not the one this node created for the run");
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    size_t n = strlen(r->sock_path);
    if (n >= sizeof sa.sun_path)
        return sbx_err(err, -ENAMETOOLONG, "%s", "bridge socket path too long");
    memcpy(sa.sun_path, r->sock_path, n + 1);
    _cleanup_close_ int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return sbx_err(err, negative_errno(), "socket: %s", strerror(errno));
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        int e = errno;
        if (e == EAGAIN)
            return sbx_err(err, -EAGAIN, "%s", "the run's agent is not accepting (backlog)");
        return sbx_err(err, -e, "cannot reach the run's agent: %s", strerror(e));
    }
    struct ucred cred;
    socklen_t cl = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) < 0)
        return sbx_err(err, negative_errno(), "SO_PEERCRED: %s", strerror(errno));
    if (cred.pid != r->pid)
        return sbx_err(err, -EPERM, "%s",
                       "bridge peer is not the process started for this activation");
    uint64_t start;
    int sr = r->stat_fd >= 0 ? proc_stat_start_time(r->stat_fd, &start)
                             : proc_start_time(cred.pid, &start);
    if (sr < 0 || start != r->start_time)
        return sbx_err(err, -EPERM, "%s", "bridge peer's start time differs (pid reused)");
    char exe[64];
    (void)snprintf(exe, sizeof exe, "/proc/%d/exe", (int)cred.pid);
    if (stat(exe, &st) < 0 || st.st_dev != r->exe_dev || st.st_ino != r->exe_ino)
        return sbx_err(err, -EPERM, "%s",
                       "bridge peer runs another executable than the node's agent");
    *ret_fd = TAKE_FD(fd);
    return 0;
}
