/* SPDX-License-Identifier: MIT */
#include "fileio.h"

#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
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

int file_read_all(const char *path, size_t max, char **ret, size_t *ret_len)
{
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0)
        return negative_errno();
    if (!S_ISREG(st.st_mode))
        return -EINVAL;
    if ((uint64_t)st.st_size > max)
        return -EFBIG;
    char *b = malloc((size_t)st.st_size + 1);
    if (!b)
        return -ENOMEM;
    size_t n = 0;
    while (n < (size_t)st.st_size) {
        ssize_t k = read(fd, b + n, (size_t)st.st_size - n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        n += (size_t)k;
    }
    b[n] = 0;
    *ret = b;
    if (ret_len)
        *ret_len = n;
    return 0;
}
