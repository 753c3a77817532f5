/* SPDX-License-Identifier: MIT */
/* File operations behind /v1/files/..., written against a root so that one implementation serves
 * both modes:
 *  - dedicated: the root is the whole filesystem (dirfd AT_FDCWD); paths are used as given and
 *    resolved the ordinary way (a relative path starts at the server's cwd);
 *  - confined (host mode): the root is a sandbox home opened as a descriptor; every path is
 *    normalized lexically, then resolved beneath that descriptor with openat2(RESOLVE_BENEATH |
 *    RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS), and what is created is given to the sandbox.
 * Every operation works on descriptors: a path is resolved once to the directory that holds its
 * last component, and the operation is the *at() call on that name. Library code: functions
 * return >= 0 or -errno and never log. */
#pragma once

#include <fcntl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "common/fileio.h"

#define FS_PATH_MAX 4096
#define FS_LIST_MAX 50000
#define FS_DELETE_MAX_DEPTH RMTREE_MAX_DEPTH /* one open directory per level (rmtree_at) */

typedef struct {
    int dirfd;     /* where paths start: AT_FDCWD, or the opened home (confined) */
    bool confined; /* normalize, stay beneath dirfd, follow no symlink at any component */
    uid_t uid;     /* owner of what is created, or (uid_t)-1 to keep the server's */
    gid_t gid;
    const char *prefix; /* confined: the root's own absolute path, accepted as a path prefix */
} fs_root_t;

/* Dedicated mode: the whole filesystem, relative paths from the server's cwd. */
static inline fs_root_t fs_root_dedicated(void)
{
    return (fs_root_t){ .dirfd = AT_FDCWD, .confined = false, .uid = (uid_t)-1, .gid = (gid_t)-1 };
}

/* Lexical normalization for confined roots: the result is relative to the root, without empty,
 * "." or ".." components and without leading or trailing '/'; ".." pops a component and stays
 * at the root when there is none (like "/.." in the kernel). "" means the root itself. Writes a
 * NUL-terminated string into out. Returns its length, -EINVAL if `in` holds a NUL byte,
 * -ENAMETOOLONG if a component exceeds NAME_MAX or the result does not fit in cap. Pure: no
 * system calls, no allocation (fuzzed). */
int path_normalize(const char *in, size_t len, char *out, size_t cap);

/* Open path (flags get O_CLOEXEC). Confined roots resolve through openat2 beneath the root. */
int fs_open(const fs_root_t *r, const char *path, int flags, mode_t mode, int *ret_fd);

/* A regular file opened for reading, and its stat. A directory gives -EISDIR, any other
 * non-regular file (FIFO, device, socket) -ENXIO without being opened for I/O. */
int fs_open_read(const fs_root_t *r, const char *path, int *ret_fd, struct stat *ret_st);

typedef struct {
    bool truncate; /* O_TRUNC (a write without offset) */
    bool mkdir;    /* create missing parent directories */
    bool set_mode; /* fchmod(mode) through the descriptor */
    mode_t mode;
    mode_t create_mode; /* mode for a new file (before umask) */
    mode_t dir_mode;    /* mode for created parents (before umask) */
} fs_write_opts_t;

/* A regular file opened for writing (created if missing). -EISDIR for a directory, -ENXIO for
 * another non-regular file. */
int fs_open_write(const fs_root_t *r, const char *path, const fs_write_opts_t *o, int *ret_fd);
/* Write all n bytes at off (one pwrite unless the kernel writes short). */
int fs_pwrite_all(int fd, const void *p, size_t n, uint64_t off);
/* The same as uid would write it (uid -1: as this process): with its fsuid, so that blocks a
 * filesystem keeps for root are not spent for a sandbox. */
int fs_pwrite_all_as(int fd, const void *p, size_t n, uint64_t off, uid_t uid);

/* lstat semantics: a final symlink is reported, not followed. */
int fs_stat(const fs_root_t *r, const char *path, struct stat *ret_st);
/* The text of the symlink at path (never followed), NUL-terminated in out: its length. */
int fs_readlink(const fs_root_t *r, const char *path, char *out, size_t cap);

typedef struct {
    char *name;
    struct stat st;
} fs_entry_t;

typedef struct {
    fs_entry_t *entries; /* sorted by name (byte order) */
    size_t n;
    bool truncated; /* more entries follow the last one */
} fs_listing_t;

/* Entries of a directory whose names sort strictly after `after` (NULL: from the first), at most
 * limit of them (1..FS_LIST_MAX). Memory is bounded by limit, not by the directory's size.
 * Entries that vanish while listing are left out. */
int fs_list(const fs_root_t *r, const char *path, const char *after, size_t limit,
            fs_listing_t *ret);
/* The same in steps, so that a caller on an event loop reads a big directory a batch per turn:
 * begin (the directory opened), step until it returns 1 (read through; 0: more to read; < 0:
 * an error, then abort), finish (the listing; frees the lister either way). */
typedef struct fs_lister fs_lister_t;
int fs_list_begin(const fs_root_t *r, const char *path, const char *after, size_t limit,
                  fs_lister_t **ret);
int fs_list_step(fs_lister_t *ls, size_t batch);
int fs_list_finish(fs_lister_t *ls, fs_listing_t *ret);
void fs_list_abort(fs_lister_t *ls);
void fs_listing_free(fs_listing_t *l);

/* Remove a file, symlink (never its target) or directory. Without recursive a directory must be
 * empty (-ENOTEMPTY). The recursive walk goes by descriptor, follows no symlink and does not
 * cross into another filesystem (-EBUSY). The root itself, "." and ".." give -EINVAL. */
int fs_delete(const fs_root_t *r, const char *path, bool recursive);
/* fs_delete, but a directory deleted recursively is renamed to away_fd/away_name when it can
 * be (returns 1: the caller empties it there) instead of emptied here. */
int fs_delete_to(const fs_root_t *r, const char *path, bool recursive, int away_fd,
                 const char *away_name);

/* Create a directory and its missing parents; an existing directory is fine. */
int fs_mkdir_all(const fs_root_t *r, const char *path, mode_t mode);

/* renameat2; without overwrite an existing target gives -EEXIST (RENAME_NOREPLACE). */
int fs_rename(const fs_root_t *r, const char *from, const char *to, bool overwrite);
