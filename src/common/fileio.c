/* SPDX-License-Identifier: MIT */
#include "fileio.h"

#include <dirent.h>
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

ssize_t fd_read_upto(int fd, void *buf, size_t cap)
{
    size_t len = 0;
    while (len < cap) {
        ssize_t n = read(fd, (char *)buf + len, cap - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return negative_errno();
        if (n == 0)
            break;
        len += (size_t)n;
    }
    return (ssize_t)len;
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
    ssize_t k = fd_read_upto(fd, b, (size_t)st.st_size);
    size_t n = k > 0 ? (size_t)k : 0; /* a read error: what was read, as before */
    b[n] = 0;
    *ret = b;
    if (ret_len)
        *ret_len = n;
    return 0;
}

/* ---- removing trees by descriptor ------------------------------------------------------- */

static int remove_tree(int pfd, const char *name, dev_t dev, unsigned depth);

/* Remove everything inside the directory d. Symlinks are unlinked, never followed. */
static int empty_dir(DIR *d, dev_t dev, unsigned depth)
{
    for (;;) {
        errno = 0;
        struct dirent *de = readdir(d);
        if (!de)
            return errno ? negative_errno() : 0;
        if (streq(de->d_name, ".") || streq(de->d_name, ".."))
            continue;
        if (de->d_type != DT_DIR) {
            if (unlinkat(dirfd(d), de->d_name, 0) == 0 || errno == ENOENT)
                continue;
            if (errno != EISDIR) /* d_type may be DT_UNKNOWN: a directory says EISDIR */
                return negative_errno();
        }
        int k = remove_tree(dirfd(d), de->d_name, dev, depth + 1);
        if (k < 0 && k != -ENOENT)
            return k;
    }
}

static int remove_tree(int pfd, const char *name, dev_t dev, unsigned depth)
{
    _cleanup_(closedirp) DIR *d = NULL;
    struct stat st;
    if (depth >= RMTREE_MAX_DEPTH)
        return -ENAMETOOLONG;
    /* O_NOFOLLOW: if `name` was swapped for a symlink since we looked, this fails with ELOOP
     * instead of emptying the symlink's target. */
    int fd = openat(pfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return negative_errno();
    d = fdopendir(fd);
    if (!d) {
        int k = negative_errno();
        safe_close(fd);
        return k;
    }
    if (fstat(fd, &st) < 0)
        return negative_errno();
    if (st.st_dev != dev)
        return -EBUSY; /* a mount point: never empty another filesystem */
    int k = empty_dir(d, dev, depth);
    if (k < 0)
        return k;
    if (unlinkat(pfd, name, AT_REMOVEDIR) < 0)
        return negative_errno();
    return 0;
}

int rmtree_at(int pfd, const char *name, dev_t dev) { return remove_tree(pfd, name, dev, 0); }

int rmtree(const char *path)
{
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/'), *name = slash ? slash + 1 : path;
    size_t dl = slash ? (size_t)(slash - path) : 0;
    if (!*name || streq(name, ".") || streq(name, ".."))
        return -EINVAL;
    if (dl >= sizeof dir)
        return -ENAMETOOLONG;
    memcpy(dir, path, dl);
    dir[dl] = '\0';
    _cleanup_close_ int pfd = open(!slash    ? "."
                                   : dl == 0 ? "/"
                                             : dir,
                                   O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    struct stat st;
    if (pfd < 0 || fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return errno == ENOENT ? 0 : negative_errno();
    if (!S_ISDIR(st.st_mode))
        return unlinkat(pfd, name, 0) < 0 && errno != ENOENT ? negative_errno() : 0;
    int r = rmtree_at(pfd, name, st.st_dev); /* the filesystem of path itself, as rm's */
    return r == -ENOENT ? 0 : r;
}
