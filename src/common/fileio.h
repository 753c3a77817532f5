/* SPDX-License-Identifier: MIT */
/* Small file helpers for daemons' state (tokens, records). */
#pragma once

#include <dirent.h>
#include <stddef.h>
#include <sys/types.h>

/* For _cleanup_(closedirp) DIR *d. */
static inline void closedirp(DIR **d)
{
    if (*d)
        (void)closedir(*d);
}

/* Replace path with exactly these bytes, atomically (a temporary file beside it, fsync,
 * rename), created with mode (also when path existed with a looser one). */
int file_write_atomic(const char *path, const void *p, size_t n, mode_t mode);
/* Read from fd until end of file or until cap bytes are in buf, retrying on EINTR. Returns the
 * length (cap: the file may hold more), or -errno. */
ssize_t fd_read_upto(int fd, void *buf, size_t cap);
/* The whole of a regular file of at most max bytes, NUL-terminated, malloc'd in *ret (length in
 * *ret_len). -EFBIG when larger. Symlinks are not followed. */
int file_read_all(const char *path, size_t max, char **ret, size_t *ret_len);

/* Remove the directory pfd/name and everything below it, by descriptor: symlinks are unlinked,
 * never followed (a directory swapped for a symlink meanwhile gives -ELOOP), and no directory
 * on a filesystem other than dev is entered (-EBUSY: a mount point, rm --one-file-system).
 * One open directory per level, at most RMTREE_MAX_DEPTH levels (deeper: -ENAMETOOLONG).
 * Stops at the first error, with what came before it removed. */
#define RMTREE_MAX_DEPTH 256
int rmtree_at(int pfd, const char *name, dev_t dev);
/* rm -rf --one-file-system path: path and everything below it on path's own filesystem,
 * by rmtree_at; a path that is not there is fine. The removal allocates nothing but the
 * directory streams, so a child forked from a threaded daemon may run it (glibc's malloc is
 * fork-safe). */
int rmtree(const char *path);
