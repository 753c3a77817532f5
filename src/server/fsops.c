/* SPDX-License-Identifier: MIT */
#include "fsops.h"

#include <dirent.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <sys/fsuid.h>
#include <sys/syscall.h>

#include "common/fileio.h"
#include "common/macro.h"

/* ---- paths ------------------------------------------------------------------------------- */

int path_normalize(const char *in, size_t len, char *out, size_t cap)
{
    size_t o = 0;
    if (cap == 0)
        return -ENAMETOOLONG;
    if (cap > INT_MAX)
        cap = INT_MAX;
    if (len > 0 && memchr(in, '\0', len))
        return -EINVAL;
    for (size_t i = 0; i < len;) {
        while (i < len && in[i] == '/')
            i++;
        size_t s = i;
        while (i < len && in[i] != '/')
            i++;
        size_t n = i - s;
        if (n == 0 || (n == 1 && in[s] == '.'))
            continue;
        if (n > NAME_MAX)
            return -ENAMETOOLONG;
        if (n == 2 && in[s] == '.' && in[s + 1] == '.') {
            /* pop the last component; at the root there is nothing to pop */
            while (o > 0 && out[o - 1] != '/')
                o--;
            if (o > 0)
                o--;
            continue;
        }
        /* room for an optional '/', the component and the final NUL */
        if (o + (o > 0) + n >= cap)
            return -ENAMETOOLONG;
        if (o > 0)
            out[o++] = '/';
        memcpy(out + o, in + s, n);
        o += n;
    }
    out[o] = '\0';
    return (int)o;
}

static bool is_dot_name(const char *name) { return streq(name, ".") || streq(name, ".."); }

/* The one place where a path is resolved. Dedicated roots resolve the ordinary way; confined
 * roots stay beneath dirfd and refuse every symlink (ELOOP) and magic link (/proc/self/fd/N):
 * a sandbox must not steer the server's privileged file access outside its home. */
static int fs_openat(const fs_root_t *r, int dfd, const char *rel, int flags, mode_t mode,
                     int *ret_fd)
{
    int fd;
    flags |= O_CLOEXEC;
    if (r->confined) {
        struct open_how how = {
            .flags = (uint64_t)(unsigned)flags,
            .mode = (flags & O_CREAT) ? mode : 0,
            .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
        };
        /* EAGAIN: a concurrent rename raced the resolution; the kernel asks for a retry. */
        int tries = 0;
        do
            fd = (int)syscall(SYS_openat2, dfd, rel, &how, sizeof how);
        while (fd < 0 && (errno == EINTR || (errno == EAGAIN && ++tries < 8)));
    } else {
        do
            fd = openat(dfd, rel, flags, mode);
        while (fd < 0 && errno == EINTR);
    }
    if (fd < 0)
        return negative_errno();
    *ret_fd = fd;
    return 0;
}

/* Make a request path ready for resolution into buf: normalized for a confined root ("." for
 * the root itself), as given otherwise. Trailing slashes are dropped so that the path has a
 * last component ("/" stays "/"). */
static int fs_prepare(const fs_root_t *r, const char *path, char *buf, size_t cap)
{
    size_t len = strlen(path);
    if (len == 0 || cap < 2)
        return -EINVAL;
    if (r->confined) {
        /* A path that names the root by its outside name ("/sbx/homes/<shard>/<id>/x") means
         * the same as "x"; any other path is rooted at the root. */
        size_t pl = r->prefix ? strlen(r->prefix) : 0;
        if (pl > 0 && strncmp(path, r->prefix, pl) == 0 && (path[pl] == '/' || path[pl] == '\0')) {
            path += pl;
            len -= pl;
        }
        int n = path_normalize(path, len, buf, cap);
        if (n < 0)
            return n;
        if (n == 0)
            memcpy(buf, ".", 2);
        return 0;
    }
    while (len > 1 && path[len - 1] == '/')
        len--;
    if (len >= cap)
        return -ENAMETOOLONG;
    memcpy(buf, path, len);
    buf[len] = '\0';
    return 0;
}

/* Split a prepared path (modified in place) into the directory holding its last component and
 * that component. "/" is ("/", "."), the confined root is (".", "."). */
static void fs_split(char *buf, const char **ret_parent, const char **ret_name)
{
    char *slash = strrchr(buf, '/');
    if (!slash) {
        *ret_parent = ".";
        *ret_name = buf;
    } else if (slash == buf) {
        *ret_parent = "/";
        *ret_name = slash[1] ? slash + 1 : ".";
    } else {
        *slash = '\0';
        *ret_parent = buf;
        *ret_name = slash + 1;
    }
}

/* Resolve everything but the last component: an O_PATH descriptor of the directory holding it,
 * and the name (pointing into buf) for the *at() call. */
static int fs_open_parent(const fs_root_t *r, const char *path, char *buf, size_t cap,
                          int *ret_dirfd, const char **ret_name)
{
    int k = fs_prepare(r, path, buf, cap);
    if (k < 0)
        return k;
    const char *parent;
    fs_split(buf, &parent, ret_name);
    return fs_openat(r, r->dirfd, parent, O_PATH | O_DIRECTORY, 0, ret_dirfd);
}

int fs_open(const fs_root_t *r, const char *path, int flags, mode_t mode, int *ret_fd)
{
    char buf[FS_PATH_MAX];
    int k = fs_prepare(r, path, buf, sizeof buf);
    if (k < 0)
        return k;
    return fs_openat(r, r->dirfd, buf, flags, mode, ret_fd);
}

/* Regular files only: -EISDIR for a directory, -ENXIO for the rest (what open() itself answers
 * for a socket or a FIFO without a reader). */
static int fs_check_regular(const struct stat *st)
{
    if (S_ISREG(st->st_mode))
        return 0;
    return S_ISDIR(st->st_mode) ? -EISDIR : -ENXIO;
}

/* Look at what a path names before opening it for I/O: opening a FIFO, a device or a socket can
 * block, fail or act (a tape rewinds, a watchdog arms). ENOENT is passed through. */
static int fs_probe(const fs_root_t *r, const char *prepared)
{
    _cleanup_close_ int fd = -EBADF;
    struct stat st;
    int k = fs_openat(r, r->dirfd, prepared, O_PATH, 0, &fd);
    if (k < 0)
        return k;
    if (fstat(fd, &st) < 0)
        return negative_errno();
    return fs_check_regular(&st);
}

int fs_open_read(const fs_root_t *r, const char *path, int *ret_fd, struct stat *ret_st)
{
    char buf[FS_PATH_MAX];
    _cleanup_close_ int fd = -EBADF;
    struct stat st;
    int k = fs_prepare(r, path, buf, sizeof buf);
    if (k >= 0)
        k = fs_probe(r, buf);
    if (k >= 0)
        k = fs_openat(r, r->dirfd, buf, O_RDONLY | O_NONBLOCK | O_NOCTTY, 0, &fd);
    if (k < 0)
        return k;
    if (fstat(fd, &st) < 0)
        return negative_errno();
    k = fs_check_regular(&st); /* it may have been replaced since the probe */
    if (k < 0)
        return k;
    *ret_fd = TAKE_FD(fd);
    *ret_st = st;
    return 0;
}

/* ---- directories ------------------------------------------------------------------------- */

/* Step from *dfd into its child `name`, creating it if missing. What we create is given to the
 * root's owner so that the sandbox can manage its own tree. */
static int fs_mkdir_step(const fs_root_t *r, int *dfd, const char *name, mode_t mode)
{
    int next = -EBADF;
    bool created = false;
    int k = fs_openat(r, *dfd, name, O_PATH | O_DIRECTORY, 0, &next);
    if (k == -ENOENT) {
        if (mkdirat(*dfd, name, mode) == 0)
            created = true;
        else if (errno != EEXIST)
            return negative_errno();
        k = fs_openat(r, *dfd, name, O_PATH | O_DIRECTORY, 0, &next);
    }
    if (k < 0)
        return k;
    if (created && r->uid != (uid_t)-1 && fchownat(next, "", r->uid, r->gid, AT_EMPTY_PATH) < 0) {
        k = negative_errno();
        safe_close(next);
        return k;
    }
    safe_close(*dfd);
    *dfd = next;
    return 0;
}

/* mkdir -p of a prepared path (modified while walking, restored after), one component at a
 * time from the root. */
static int fs_mkdir_walk(const fs_root_t *r, char *rel, mode_t mode)
{
    _cleanup_close_ int dfd = -EBADF;
    int k = fs_openat(r, r->dirfd, rel[0] == '/' ? "/" : ".", O_PATH | O_DIRECTORY, 0, &dfd);
    for (char *p = rel; k >= 0 && *p;) {
        while (*p == '/')
            p++;
        if (!*p)
            break;
        char *end = strchrnul(p, '/');
        char saved = *end;
        *end = '\0';
        if (!streq(p, "."))
            k = fs_mkdir_step(r, &dfd, p, mode);
        *end = saved;
        p = end;
    }
    return k < 0 ? k : 0;
}

/* What makes or moves entries for a sandbox goes with its fsuid and fsgid (this thread's only,
 * put back before anything else runs on it): blocks a filesystem keeps for root (ext4's
 * reserve) are never spent for a tenant (a red-team pass drained it with mkdirs of the files
 * API), and its own permissions apply. Not deletes: the trash is root's. */
typedef struct {
    int uid, gid; /* before; -1: unchanged */
} fs_ids_t;

static fs_ids_t fs_ids_enter(const fs_root_t *r)
{
    if (r->uid == (uid_t)-1)
        return (fs_ids_t){ -1, -1 };
    int u = setfsuid(r->uid);
    return (fs_ids_t){ u, setfsgid(r->gid) };
}

static void fs_ids_leave(fs_ids_t was)
{
    if (was.uid < 0)
        return;
    (void)setfsgid((gid_t)was.gid);
    (void)setfsuid((uid_t)was.uid);
}

int fs_mkdir_all(const fs_root_t *r, const char *path, mode_t mode)
{
    char buf[FS_PATH_MAX];
    int k = fs_prepare(r, path, buf, sizeof buf);
    if (k < 0)
        return k;
    fs_ids_t was = fs_ids_enter(r);
    k = fs_mkdir_walk(r, buf, mode);
    fs_ids_leave(was);
    return k;
}

/* Create the parents of a prepared path. */
static int fs_mkdir_parents(const fs_root_t *r, const char *prepared, mode_t mode)
{
    char buf[FS_PATH_MAX];
    size_t len = strlen(prepared);
    if (len >= sizeof buf)
        return -ENAMETOOLONG;
    memcpy(buf, prepared, len + 1);
    char *slash = strrchr(buf, '/');
    if (!slash || slash == buf)
        return 0; /* the parent is the start directory or "/" */
    *slash = '\0';
    return fs_mkdir_walk(r, buf, mode);
}

/* ---- write ------------------------------------------------------------------------------- */

static int fs_open_write_ids(const fs_root_t *r, const char *path, const fs_write_opts_t *o,
                             int *ret_fd);

int fs_open_write(const fs_root_t *r, const char *path, const fs_write_opts_t *o, int *ret_fd)
{
    fs_ids_t was = fs_ids_enter(r);
    int k = fs_open_write_ids(r, path, o, ret_fd);
    fs_ids_leave(was);
    return k;
}

static int fs_open_write_ids(const fs_root_t *r, const char *path, const fs_write_opts_t *o,
                             int *ret_fd)
{
    char buf[FS_PATH_MAX];
    _cleanup_close_ int fd = -EBADF;
    struct stat st;
    int flags = O_WRONLY | O_CREAT | O_NONBLOCK | O_NOCTTY | (o->truncate ? O_TRUNC : 0) |
                (r->confined ? O_NOFOLLOW : 0);
    int k = fs_prepare(r, path, buf, sizeof buf);
    if (k < 0)
        return k;
    k = fs_probe(r, buf);
    if (k < 0 && k != -ENOENT)
        return k;
    k = fs_openat(r, r->dirfd, buf, flags, o->create_mode, &fd);
    if (k == -ENOENT && o->mkdir) {
        k = fs_mkdir_parents(r, buf, o->dir_mode);
        if (k >= 0)
            k = fs_openat(r, r->dirfd, buf, flags, o->create_mode, &fd);
    }
    if (k < 0)
        return k;
    if (fstat(fd, &st) < 0)
        return negative_errno();
    k = fs_check_regular(&st);
    if (k < 0)
        return k;
    /* The server writes as root: hand the file to the sandbox before a byte lands in it. */
    if (r->uid != (uid_t)-1 && fchown(fd, r->uid, r->gid) < 0)
        return negative_errno();
    if (o->set_mode && fchmod(fd, o->mode) < 0)
        return negative_errno();
    *ret_fd = TAKE_FD(fd);
    return 0;
}

int fs_pwrite_all_as(int fd, const void *p, size_t n, uint64_t off, uid_t uid)
{
    if (uid == (uid_t)-1)
        return fs_pwrite_all(fd, p, n, off);
    /* The blocks a filesystem keeps for root (ext4's reserve, for its resuid) are never spent
     * for a tenant: the write goes with the sandbox's fsuid (this thread's only, put back before
     * anything else runs on it; the descriptor was opened, and is checked, as before). Here
     * that alone keeps a root task out of the reserve: CAP_SYS_RESOURCE, kept, did not let it
     * in (a C test on a loop-mounted ext4). */
    uid_t was = (uid_t)setfsuid(uid);
    int r = fs_pwrite_all(fd, p, n, off);
    (void)setfsuid(was);
    return r;
}

int fs_pwrite_all(int fd, const void *p, size_t n, uint64_t off)
{
    const char *b = p;
    while (n > 0) {
        if (off > (uint64_t)INT64_MAX - n)
            return -EFBIG;
        ssize_t w = pwrite(fd, b, n, (off_t)off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return negative_errno();
        }
        if (w == 0)
            return -EIO;
        b += w;
        n -= (size_t)w;
        off += (uint64_t)w;
    }
    return 0;
}

/* ---- stat and list ----------------------------------------------------------------------- */

int fs_stat(const fs_root_t *r, const char *path, struct stat *ret_st)
{
    char buf[FS_PATH_MAX];
    _cleanup_close_ int pfd = -EBADF;
    const char *name;
    struct stat st;
    int k = fs_open_parent(r, path, buf, sizeof buf, &pfd, &name);
    if (k < 0)
        return k;
    if (fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return negative_errno();
    *ret_st = st;
    return 0;
}

int fs_readlink(const fs_root_t *r, const char *path, char *out, size_t cap)
{
    char buf[FS_PATH_MAX];
    _cleanup_close_ int pfd = -EBADF;
    const char *name;
    if (cap == 0)
        return -EINVAL;
    int k = fs_open_parent(r, path, buf, sizeof buf, &pfd, &name);
    if (k < 0)
        return k;
    ssize_t n = readlinkat(pfd, name, out, cap - 1);
    if (n < 0)
        return negative_errno();
    out[n] = '\0';
    return (int)n;
}

/* A max-heap of names: it keeps the `cap` smallest names seen, so a listing page costs memory
 * in proportion to the page, not to the directory. */
typedef struct {
    char **v;
    size_t n, alloc, cap;
} name_heap_t;

static void heap_sift_down(name_heap_t *h, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        if (l < h->n && strcmp(h->v[l], h->v[m]) > 0)
            m = l;
        if (l + 1 < h->n && strcmp(h->v[l + 1], h->v[m]) > 0)
            m = l + 1;
        if (m == i)
            return;
        char *t = h->v[i];
        h->v[i] = h->v[m];
        h->v[m] = t;
        i = m;
    }
}

static int heap_offer(name_heap_t *h, const char *name)
{
    if (h->n == h->cap) {
        if (strcmp(name, h->v[0]) >= 0)
            return 0;
        char *s = strdup(name);
        if (!s)
            return -ENOMEM;
        free(h->v[0]);
        h->v[0] = s;
        heap_sift_down(h, 0);
        return 0;
    }
    if (h->n == h->alloc) {
        size_t na = MIN(MAX(h->alloc * 2, (size_t)64), h->cap);
        char **nv = realloc(h->v, na * sizeof *nv);
        if (!nv)
            return -ENOMEM;
        h->v = nv;
        h->alloc = na;
    }
    char *s = strdup(name);
    if (!s)
        return -ENOMEM;
    size_t i = h->n++;
    h->v[i] = s;
    while (i > 0 && strcmp(h->v[(i - 1) / 2], h->v[i]) < 0) {
        size_t up = (i - 1) / 2;
        char *t = h->v[i];
        h->v[i] = h->v[up];
        h->v[up] = t;
        i = up;
    }
    return 0;
}

static void heap_free(name_heap_t *h)
{
    for (size_t i = 0; i < h->n; i++)
        free(h->v[i]);
    free(h->v);
    *h = (name_heap_t){ 0 };
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

struct fs_lister {
    DIR *d;
    char *after; /* NULL: from the first */
    name_heap_t h;
    size_t limit, total;
};

void fs_list_abort(fs_lister_t *ls)
{
    if (!ls)
        return;
    if (ls->d)
        closedir(ls->d);
    heap_free(&ls->h);
    free(ls->after);
    free(ls);
}

int fs_list_begin(const fs_root_t *r, const char *path, const char *after, size_t limit,
                  fs_lister_t **ret)
{
    _cleanup_close_ int fd = -EBADF;
    if (limit == 0 || limit > FS_LIST_MAX)
        return -EINVAL;
    int k = fs_open(r, path, O_RDONLY | O_DIRECTORY | O_NONBLOCK, 0, &fd);
    if (k < 0)
        return k;
    fs_lister_t *ls = calloc(1, sizeof *ls);
    if (!ls)
        return -ENOMEM;
    ls->h.cap = limit + 1;
    ls->limit = limit;
    if (after && !(ls->after = strdup(after))) {
        fs_list_abort(ls);
        return -ENOMEM;
    }
    ls->d = fdopendir(fd);
    if (!ls->d) {
        k = negative_errno();
        fs_list_abort(ls);
        return k;
    }
    TAKE_FD(fd);
    *ret = ls;
    return 0;
}

/* Read up to batch more entries, keeping the limit+1 smallest names after the cursor (the
 * extra one only tells whether the page is truncated). */
int fs_list_step(fs_lister_t *ls, size_t batch)
{
    for (size_t i = 0; i < batch; i++) {
        errno = 0;
        struct dirent *de = readdir(ls->d);
        if (!de)
            return errno ? negative_errno() : 1;
        if (is_dot_name(de->d_name) || (ls->after && strcmp(de->d_name, ls->after) <= 0))
            continue;
        ls->total++;
        int k = heap_offer(&ls->h, de->d_name);
        if (k < 0)
            return k;
    }
    return 0;
}

int fs_list_finish(fs_lister_t *ls, fs_listing_t *ret)
{
    name_heap_t *h = &ls->h;
    fs_listing_t l = { 0 };
    int k = 0;
    if (h->n > ls->limit) {
        /* drop the largest: it only proved that more entries follow */
        free(h->v[0]);
        h->v[0] = h->v[--h->n];
        heap_sift_down(h, 0);
    }
    if (h->n > 0) {
        qsort(h->v, h->n, sizeof *h->v, cmp_names);
        l.entries = calloc(h->n, sizeof *l.entries);
        if (!l.entries)
            k = -ENOMEM;
    }
    for (size_t i = 0; k >= 0 && i < h->n; i++) {
        fs_entry_t *e = &l.entries[l.n];
        if (fstatat(dirfd(ls->d), h->v[i], &e->st, AT_SYMLINK_NOFOLLOW) < 0) {
            if (errno == ENOENT)
                continue; /* removed while we were listing */
            k = negative_errno();
            break;
        }
        e->name = TAKE_PTR(h->v[i]);
        l.n++;
    }
    l.truncated = ls->total > ls->limit;
    fs_list_abort(ls);
    if (k < 0) {
        fs_listing_free(&l);
        return k;
    }
    *ret = l;
    return 0;
}

int fs_list(const fs_root_t *r, const char *path, const char *after, size_t limit,
            fs_listing_t *ret)
{
    fs_lister_t *ls;
    int k = fs_list_begin(r, path, after, limit, &ls);
    if (k < 0)
        return k;
    k = fs_list_step(ls, SIZE_MAX);
    if (k < 0) {
        fs_list_abort(ls);
        return k;
    }
    return fs_list_finish(ls, ret);
}

void fs_listing_free(fs_listing_t *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->entries[i].name);
    free(l->entries);
    *l = (fs_listing_t){ 0 };
}

/* ---- delete and rename ------------------------------------------------------------------- */

int fs_delete_to(const fs_root_t *r, const char *path, bool recursive, int away_fd,
                 const char *away_name)
{
    char buf[FS_PATH_MAX];
    _cleanup_close_ int pfd = -EBADF;
    const char *name;
    struct stat pst;
    int k = fs_open_parent(r, path, buf, sizeof buf, &pfd, &name);
    if (k < 0)
        return k;
    if (is_dot_name(name))
        return -EINVAL; /* the root, or a path ending in "." or ".." */
    if (unlinkat(pfd, name, 0) == 0)
        return 0;
    if (errno != EISDIR)
        return negative_errno();
    if (!recursive)
        return unlinkat(pfd, name, AT_REMOVEDIR) < 0 ? negative_errno() : 0;
    /* out of reach in one rename, emptied elsewhere (another filesystem, or none: here) */
    if (away_fd >= 0 && away_name &&
        renameat2(pfd, name, away_fd, away_name, RENAME_NOREPLACE) == 0)
        return 1;
    if (fstat(pfd, &pst) < 0)
        return negative_errno();
    return rmtree_at(pfd, name, pst.st_dev);
}

int fs_delete(const fs_root_t *r, const char *path, bool recursive)
{
    return fs_delete_to(r, path, recursive, -1, NULL);
}

int fs_rename(const fs_root_t *r, const char *from, const char *to, bool overwrite)
{
    char a[FS_PATH_MAX], b[FS_PATH_MAX];
    _cleanup_close_ int pa = -EBADF, pb = -EBADF;
    const char *na, *nb;
    int k = fs_open_parent(r, from, a, sizeof a, &pa, &na);
    if (k < 0)
        return k;
    k = fs_open_parent(r, to, b, sizeof b, &pb, &nb);
    if (k < 0)
        return k;
    if (is_dot_name(na) || is_dot_name(nb))
        return -EINVAL;
    fs_ids_t was = fs_ids_enter(r);
    k = renameat2(pa, na, pb, nb, overwrite ? 0 : RENAME_NOREPLACE) < 0 ? negative_errno() : 0;
    fs_ids_leave(was);
    return k;
}
