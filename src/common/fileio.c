/* SPDX-License-Identifier: MIT */
#include "fileio.h"

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <sys/stat.h>

#include "macro.h"

int file_write_atomic(const char *path, const void *p, size_t n, mode_t mode)
{
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return -ENAMETOOLONG;
    _cleanup_close_ int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
    if (fd < 0)
        return negative_errno();
    if (fchmod(fd, mode) < 0) /* an old temporary file keeps its mode through O_CREAT */
        return negative_errno();
    const char *q = p;
    while (n > 0) {
        ssize_t w = write(fd, q, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return w < 0 ? negative_errno() : -EIO;
        q += w;
        n -= (size_t)w;
    }
    if (fsync(fd) < 0 || rename(tmp, path) < 0)
        return negative_errno();
    return 0;
}
