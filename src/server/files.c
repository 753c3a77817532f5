/* SPDX-License-Identifier: MIT */
/* /v1/files/...: read (sendfile), write (the body goes to disk piece by piece as it arrives),
 * list (paginated), stat, delete, mkdir, rename. Handlers parse the request and answer; the
 * file system work is in fsops.c, against a root (dedicated mode: the whole filesystem). */
#include <limits.h>
#include <sodium.h>
#include <stdio.h>

#include "envd.h"
#include "fsops.h"
#include "pool.h"
#include "routes.h"
#include "server.h"

#define FILES_LIST_DEFAULT 10000
#define FILES_CURSOR_MAX 1024
#define FILES_RENAME_BODY_MAX (64 * 1024)
#define FILES_MODE_MAX 07777
/* JSON answers above this are sent as a chunked stream (a 50,000-entry listing is larger than
 * the connection's output cap). */
#define FILES_JSON_INLINE_MAX (1024 * 1024)

/* Dedicated mode: the whole filesystem. Host mode: the sandbox home, resolved by descriptor
 * beneath it, following no symlink, and what is created belongs to the sandbox uid. */
fs_root_t files_root(const conn_t *c)
{
    if (!conn_sandbox(c))
        return fs_root_dedicated();
    return (fs_root_t){ .dirfd = conn_sandbox(c)->home_fd,
                        .confined = true,
                        .uid = conn_sandbox(c)->uid,
                        .gid = conn_sandbox(c)->uid,
                        .prefix = conn_sandbox(c)->home };
}

bool listing_slot_take(const conn_t *c, listing_slot_t *slot)
{
    sandbox_t *sb = (sandbox_t *)conn_sandbox(c);
    server_t *srv = server_of(c);
    *slot = (listing_slot_t){ .sb = sb, .srv = srv };
    if (srv->listings >= LISTINGS_MAX || (sb && sb->listings >= LISTINGS_PER_SANDBOX))
        return false;
    srv->listings++;
    if (sb)
        sb->listings++;
    slot->held = true;
    return true;
}

void listing_slot_give(listing_slot_t *slot)
{
    if (!slot->held)
        return;
    slot->held = false;
    if (slot->srv->listings > 0)
        slot->srv->listings--;
    if (slot->sb && slot->sb->listings > 0)
        slot->sb->listings--;
}

/* Delete path: a pooled sandbox's tree goes to the trash in one rename and the janitor empties
 * it: a tree of 200,000 files emptied on the loop held every request of the host for 3 s
 * (longer while the sandbox's code kept adding files). */
int files_delete(const conn_t *c, const char *path, bool recursive)
{
    fs_root_t root = files_root(c);
    sandbox_t *sb = (sandbox_t *)conn_sandbox(c);
    char away[64];
    int away_fd = sb && recursive ? pool_trash_name(sb, away, sizeof away) : -1;
    int r = fs_delete_to(&root, path, recursive, away_fd, away_fd >= 0 ? away : NULL);
    if (r == 1)
        pool_trash_drop(sb->pool, away);
    return r < 0 ? r : 0;
}

/* ---- strings ----------------------------------------------------------------------------- */

/* Names on disk are bytes and JSON strings are Unicode: bytes that are not UTF-8 become
 * U+FFFD, so an odd name never makes an answer impossible. */
static json_t *json_string_lossy(const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    if (utf8_valid(u, len))
        return json_stringn(s, len);
    buf_t b;
    size_t max;
    if (!size_mul_ok(len, 3, &max))
        return NULL;
    buf_init(&b, max + 1);
    for (size_t i = 0; i < len;) {
        size_t incomplete;
        size_t ok = utf8_valid_prefix(u + i, len - i, &incomplete);
        if (buf_append(&b, s + i, ok) < 0)
            break;
        i += ok;
        if (i < len) {
            if (buf_append(&b, "\xEF\xBF\xBD", 3) < 0)
                break;
            i++;
        }
    }
    json_t *j = b.data ? json_stringn(buf_head(&b), b.len) : json_string("");
    buf_free(&b);
    return j;
}

/* A short, valid UTF-8 rendering of a path for error messages. */
static const char *files_display(const char *path, char *out, size_t cap)
{
    size_t len = strlen(path), n = 0;
    for (size_t i = 0; i < len && n + 4 < cap; i++) {
        unsigned char ch = (unsigned char)path[i];
        out[n++] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : '?';
    }
    if (n + 4 >= cap && len > n)
        memcpy(out + n - 3, "...", 3);
    out[n] = '\0';
    return out;
}

/* Every file error is answered here: conn_respond_errno maps -errno to the status. */
static void files_fail(conn_t *c, int err, const char *path)
{
    char shown[256];
    http_errno(c, 0, err, files_display(path, shown, sizeof shown));
}

/* The path query parameter, or a 400 (then returns < 0). */
static int files_path_param(conn_t *c, const char *name, char *out, size_t cap)
{
    int r = query_param(c, name, out, cap);
    if (r == 0 || (r > 0 && out[0] == '\0')) {
        http_bad_request(c, 0, "missing '%s' query parameter", name);
        return -EINVAL;
    }
    if (r == -E2BIG) {
        http_bad_request(c, 0, "'%s' is too long (max %d bytes)", name, FS_PATH_MAX - 1);
        return r;
    }
    if (r < 0) {
        http_bad_request(c, 0, "'%s' is not a valid encoded path", name);
        return r;
    }
    return 0;
}

/* ---- JSON answers ------------------------------------------------------------------------ */

typedef struct {
    char *s;
    size_t len, off;
    listing_slot_t slot; /* a listing's, given back once sent */
} json_stream_t;

static void json_stream_pump(conn_t *c)
{
    json_stream_t *js = c->hdata;
    conn_stream_pump(c, js->s, js->len, &js->off);
}

static void json_stream_close(conn_t *c, bool aborted)
{
    json_stream_t *js = c->hdata;
    (void)aborted;
    c->hdata = NULL;
    if (js) {
        free(js->s);
        listing_slot_give(&js->slot);
    }
    free(js);
}

static const handler_ops_t json_stream_ops = { .on_drain = json_stream_pump,
                                               .on_close = json_stream_close };

/* Answer 200 with j (stolen): inline when small, else streamed in chunks under backpressure;
 * slot (may be NULL): a listing's, taken over and given back once the answer is out. */
static void files_respond_json_slot(conn_t *c, json_t *j, listing_slot_t *slot)
{
    listing_slot_t none = { .held = false };
    listing_slot_t held = slot ? *slot : none;
    if (slot)
        slot->held = false;
    if (!j) {
        listing_slot_give(&held);
        http_unavailable(c, 0, "out of memory");
        return;
    }
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s) {
        listing_slot_give(&held);
        http_unavailable(c, 0, "out of memory");
        return;
    }
    size_t len = strlen(s);
    if (len <= FILES_JSON_INLINE_MAX) {
        listing_slot_give(&held); /* the answer is in the connection's buffer now */
        conn_respond(c, 200, "application/json", s, len, NULL);
        free(s);
        return;
    }
    json_stream_t *js = calloc(1, sizeof *js);
    if (!js) {
        listing_slot_give(&held);
        free(s);
        http_unavailable(c, 0, "out of memory");
        return;
    }
    *js = (json_stream_t){ .s = s, .len = len, .slot = held };
    conn_set_handler(c, &json_stream_ops, js);
    if (conn_stream_begin(c, 200, "application/json", NULL) < 0)
        return;
    json_stream_pump(c);
}

static void files_respond_json(conn_t *c, json_t *j) { files_respond_json_slot(c, j, NULL); }

static const char *entry_type(mode_t m)
{
    if (S_ISDIR(m))
        return "dir";
    if (S_ISLNK(m))
        return "symlink";
    return "file"; /* everything else counts as a file, as in the reference */
}

/* {name, path, type, size, mtime_ms, mode} */
static json_t *entry_json(const char *name, size_t name_len, const char *path, size_t path_len,
                          const struct stat *st)
{
    char mode[16];
    (void)snprintf(mode, sizeof mode, "%o", (unsigned)(st->st_mode & 07777));
    json_int_t mtime_ms = (json_int_t)st->st_mtim.tv_sec * 1000 + st->st_mtim.tv_nsec / 1000000;
    json_t *jname = json_string_lossy(name, name_len);
    json_t *jpath = json_string_lossy(path, path_len);
    if (!jname || !jpath) {
        json_decref(jname);
        json_decref(jpath);
        return NULL;
    }
    return json_pack("{s:o,s:o,s:s,s:I,s:I,s:s}", "name", jname, "path", jpath, "type",
                     entry_type(st->st_mode), "size", (json_int_t)st->st_size, "mtime_ms", mtime_ms,
                     "mode", mode);
}

/* Length of path without trailing slashes ("/" keeps its slash). */
static size_t path_trimmed_len(const char *path)
{
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/')
        len--;
    return len;
}

/* ---- read -------------------------------------------------------------------------------- */

void route_files_read(conn_t *c, const route_params_t *p)
{
    char path[FS_PATH_MAX];
    bool has_off, has_len;
    uint64_t off = 0, len = 0;
    struct stat st;
    int fd;
    (void)p;
    if (files_path_param(c, "path", path, sizeof path) < 0)
        return;
    if (query_u64(c, "offset", INT64_MAX, &has_off, &off) < 0 ||
        query_u64(c, "length", INT64_MAX, &has_len, &len) < 0) {
        http_bad_request(c, 0, "offset and length must be non-negative integers");
        return;
    }
    fs_root_t root = files_root(c);
    int r = fs_open_read(&root, path, &fd, &st);
    if (r < 0) {
        files_fail(c, r, path);
        return;
    }
    uint64_t size = (uint64_t)st.st_size;
    uint64_t avail = off < size ? size - off : 0;
    conn_respond_file(c, fd, off, has_len ? MIN(len, avail) : avail);
}

/* ---- write ------------------------------------------------------------------------------- */

typedef struct {
    int fd;
    uint64_t pos;
    uid_t uid; /* written as (fs_pwrite_all_as) */
    bool has_truncate;
    uint64_t truncate_to;
    char path[];
} upload_t;

static void upload_finish(conn_t *c, upload_t *u)
{
    struct stat st;
    if (u->has_truncate && ftruncate(u->fd, (off_t)u->truncate_to) < 0) {
        files_fail(c, negative_errno(), u->path);
        return;
    }
    if (fstat(u->fd, &st) < 0) {
        files_fail(c, negative_errno(), u->path);
        return;
    }
    u->fd = safe_close(u->fd);
    json_t *jpath = json_string_lossy(u->path, strlen(u->path));
    files_respond_json(
        c, jpath ? json_pack("{s:o,s:I}", "path", jpath, "size", (json_int_t)st.st_size) : NULL);
}

/* One write per piece the connection hands us: no copy, no buffering of the body. */
static int upload_on_body(conn_t *c, const char *d, size_t n)
{
    upload_t *u = c->hdata;
    int r = fs_pwrite_all_as(u->fd, d, n, u->pos, u->uid);
    if (r < 0) {
        /* Answer now and take nothing more: the connection drains or closes after it. */
        files_fail(c, r, u->path);
        return 0;
    }
    u->pos += n;
    return (int)n;
}

static void upload_on_body_end(conn_t *c) { upload_finish(c, c->hdata); }

static void upload_on_close(conn_t *c, bool aborted)
{
    upload_t *u = c->hdata;
    (void)aborted; /* an interrupted upload leaves what arrived, as a ranged writer expects */
    c->hdata = NULL;
    if (!u)
        return;
    safe_close(u->fd);
    free(u);
}

static const handler_ops_t upload_ops = { .on_body = upload_on_body,
                                          .on_body_end = upload_on_body_end,
                                          .on_close = upload_on_close };

/* Query of a write: mode (octal), offset, mkdir, truncate_to. 400 answered here. */
static int write_options(conn_t *c, fs_write_opts_t *o, bool *has_off, uint64_t *off,
                         bool *has_trunc, uint64_t *trunc)
{
    char mode[16];
    int r = query_param(c, "mode", mode, sizeof mode);
    uint32_t m = 0;
    if (r < 0 || (r > 0 && parse_octal(sv_make(mode, strlen(mode)), FILES_MODE_MAX, &m) < 0)) {
        http_bad_request(c, 0, "mode must be an octal permission string such as 644");
        return -EINVAL;
    }
    *o = (fs_write_opts_t){
        .set_mode = r > 0, .mode = (mode_t)m, .create_mode = 0666, .dir_mode = 0777
    };
    if (query_bool(c, "mkdir", true, &o->mkdir) < 0) {
        http_bad_request(c, 0, "mkdir must be true or false");
        return -EINVAL;
    }
    if (query_u64(c, "offset", INT64_MAX, has_off, off) < 0 ||
        query_u64(c, "truncate_to", INT64_MAX, has_trunc, trunc) < 0) {
        http_bad_request(c, 0, "offset and truncate_to must be non-negative integers");
        return -EINVAL;
    }
    o->truncate = !*has_off;
    return 0;
}

void route_files_write(conn_t *c, const route_params_t *p)
{
    char path[FS_PATH_MAX];
    fs_write_opts_t o;
    bool has_off, has_trunc;
    uint64_t off = 0, trunc = 0, end;
    int fd;
    (void)p;
    if (files_path_param(c, "path", path, sizeof path) < 0 ||
        write_options(c, &o, &has_off, &off, &has_trunc, &trunc) < 0)
        return;
    if (__builtin_add_overflow(off, conn_body_left(c), &end) || end > INT64_MAX) {
        http_too_large(c, 0, "offset plus body length is too large");
        return;
    }
    fs_root_t root = files_root(c);
    int r = fs_open_write(&root, path, &o, &fd);
    if (r < 0) {
        files_fail(c, r, path);
        return;
    }
    size_t plen = strlen(path);
    upload_t *u = malloc(sizeof *u + plen + 1);
    if (!u) {
        safe_close(fd);
        http_unavailable(c, 0, "out of memory");
        return;
    }
    *u = (upload_t){
        .fd = fd, .pos = off, .uid = root.uid, .has_truncate = has_trunc, .truncate_to = trunc
    };
    memcpy(u->path, path, plen + 1);
    conn_set_handler(c, &upload_ops, u);
    if (conn_body_left(c) == 0) {
        upload_finish(c, u); /* Content-Length: 0 creates or truncates */
        return;
    }
    conn_stream_body(c);
}

/* ---- list and stat ----------------------------------------------------------------------- */

/* A listing's cursor: the last name, or for a name that is not UTF-8 (which JSON would only
 * carry with U+FFFD in place of its bytes: a cursor that names no entry, and paging would
 * never end) LIST_CURSOR_RAW and its bytes in hex. No entry's name holds a '/', so the two
 * cannot be confused (list_after). */
#define LIST_CURSOR_RAW "/hex:"
static json_t *list_cursor(const char *name)
{
    size_t len = strlen(name);
    if (utf8_valid((const unsigned char *)name, len))
        return json_stringn(name, len);
    char out[sizeof LIST_CURSOR_RAW + 2 * NAME_MAX + 1];
    if (len > NAME_MAX)
        return NULL;
    memcpy(out, LIST_CURSOR_RAW, sizeof LIST_CURSOR_RAW - 1);
    (void)sodium_bin2hex(out + sizeof LIST_CURSOR_RAW - 1, 2 * len + 1, (const unsigned char *)name,
                         len);
    return json_string(out);
}

/* The name an `after` cursor stands for, in place: itself, or the bytes of a raw one. -EINVAL
 * for a raw one that is not hex of a name. */
static int list_after(char *after)
{
    size_t pl = sizeof LIST_CURSOR_RAW - 1, len = strlen(after), bin;
    if (strncmp(after, LIST_CURSOR_RAW, pl) != 0)
        return 0;
    char name[NAME_MAX + 1];
    if (sodium_hex2bin((unsigned char *)name, NAME_MAX, after + pl, len - pl, NULL, &bin, NULL) !=
            0 ||
        bin == 0 || 2 * bin != len - pl || memchr(name, '/', bin) || memchr(name, '\0', bin))
        return -EINVAL;
    memcpy(after, name, bin);
    after[bin] = '\0';
    return 0;
}

/* A listing's answer stops near this many bytes (each entry counted as its path, its name and
 * FILES_ENTRY_BYTES of fields): truncated, with its cursor, so that one with long names (or a
 * path written long: 3.8 KB x 50,000 entries made 219 MB) stays small. */
#define FILES_LIST_BYTES_MAX (8u * 1024 * 1024)
#define FILES_ENTRY_BYTES 200

static json_t *listing_json(const char *dir, const fs_listing_t *l)
{
    size_t dlen = path_trimmed_len(dir);
    bool root = dlen == 1 && dir[0] == '/';
    json_t *arr = json_array();
    char *full = malloc(dlen + NAME_MAX + 2);
    if (!arr || !full) {
        json_decref(arr);
        free(full);
        return NULL;
    }
    memcpy(full, dir, dlen);
    size_t base = root ? 1 : dlen + 1;
    full[base - 1] = '/';
    size_t n = 0, bytes = 0;
    for (; n < l->n && bytes < FILES_LIST_BYTES_MAX; n++) {
        const fs_entry_t *e = &l->entries[n];
        size_t nlen = strlen(e->name);
        memcpy(full + base, e->name, nlen);
        if (json_array_append_new(arr, entry_json(e->name, nlen, full, base + nlen, &e->st)) < 0) {
            json_decref(arr);
            free(full);
            return NULL;
        }
        bytes += base + 2 * nlen + FILES_ENTRY_BYTES;
    }
    free(full);
    bool truncated = l->truncated || n < l->n;
    json_t *next = json_null();
    if (truncated && n > 0)
        next = list_cursor(l->entries[n - 1].name);
    return json_pack("{s:o,s:b,s:o?}", "entries", arr, "truncated", truncated, "next", next);
}

/* path as a listing shows it (and each entry's under it): tidied (path_normalize: no empty or
 * "." component, "name/.." folded), absolute if it was written so, so that a path written long
 * does not make every entry long. */
static void shown_path(const char *path, char *out, size_t cap)
{
    size_t abs = path[0] == '/';
    int n = cap > 1 ? path_normalize(path, strlen(path), out + abs, cap - abs) : -ENAMETOOLONG;
    if (n < 0) {
        (void)snprintf(out, cap, "%s", path);
        return;
    }
    if (abs)
        out[0] = '/';
    else if (n == 0)
        (void)snprintf(out, cap, ".");
}

/* A listing read a batch per turn of the loop (a directory of 200,000 entries read at once held
 * every other request of the host for ~0.5 s): the rest after the other connections' events. */
#define FILES_LIST_TURN 4096

typedef struct {
    conn_t *c;
    fs_lister_t *ls;
    timer_t_ turn;
    listing_slot_t slot;
    char path[FS_PATH_MAX];
} list_job_t;

static void list_job_free(conn_t *c, list_job_t *j)
{
    c->hdata = NULL;
    timer_disarm(c->srv->loop, &j->turn);
    fs_list_abort(j->ls);
    listing_slot_give(&j->slot);
    server_op_end(server_of(c));
    free(j);
}

static void list_on_close(conn_t *c, bool aborted)
{
    (void)aborted;
    if (c->hdata)
        list_job_free(c, c->hdata);
}

static const handler_ops_t list_ops = { .on_close = list_on_close };

/* Read the next batch, then answer or come back (j is freed once answered). */
static void list_go_on(conn_t *c, list_job_t *j)
{
    int k = fs_list_step(j->ls, FILES_LIST_TURN);
    if (k == 0 && timer_arm(c->srv->loop, &j->turn, 0) >= 0)
        return;
    char path[FS_PATH_MAX];
    fs_listing_t l;
    listing_slot_t slot = j->slot;
    j->slot.held = false; /* goes with the answer */
    memcpy(path, j->path, sizeof path);
    if (k >= 0)
        k = k == 0 ? -ENOMEM : fs_list_finish(TAKE_PTR(j->ls), &l);
    conn_set_handler(c, NULL, NULL);
    list_job_free(c, j);
    if (k < 0) {
        listing_slot_give(&slot);
        files_fail(c, k, path);
        return;
    }
    json_t *jl = listing_json(path, &l);
    fs_listing_free(&l);
    files_respond_json_slot(c, jl, &slot);
}

static void list_on_turn(loop_t *l, timer_t_ *t)
{
    list_job_t *j = t->data;
    (void)l;
    list_go_on(j->c, j);
}

void route_files_list(conn_t *c, const route_params_t *p)
{
    char path[FS_PATH_MAX], after[FILES_CURSOR_MAX];
    bool has_limit;
    uint64_t limit = FILES_LIST_DEFAULT;
    (void)p;
    if (files_path_param(c, "path", path, sizeof path) < 0)
        return;
    if (query_u64(c, "limit", FS_LIST_MAX, &has_limit, &limit) < 0 || (has_limit && limit == 0)) {
        http_bad_request(c, 0, "limit must be an integer from 1 to %d", FS_LIST_MAX);
        return;
    }
    if (!has_limit)
        limit = FILES_LIST_DEFAULT;
    int r = query_param(c, "after", after, sizeof after);
    if (r < 0 || (r > 0 && list_after(after) < 0)) {
        http_bad_request(c, 0, "after must be an entry name, or the next of a listing");
        return;
    }
    fs_root_t root = files_root(c);
    listing_slot_t slot;
    if (!listing_slot_take(c, &slot)) {
        http_too_many(c, 0, "too many listings in flight (%d per sandbox, %d per host)",
                      LISTINGS_PER_SANDBOX, LISTINGS_MAX);
        return;
    }
    list_job_t *j = calloc(1, sizeof *j);
    int k = j ? fs_list_begin(&root, path, r > 0 ? after : NULL, (size_t)limit, &j->ls) : -ENOMEM;
    if (k < 0) {
        listing_slot_give(&slot);
        free(j);
        files_fail(c, k, path);
        return;
    }
    j->slot = slot;
    j->c = c;
    shown_path(path, j->path, sizeof j->path);
    timer_init(&j->turn, list_on_turn, j);
    server_op_begin(server_of(c));
    conn_set_handler(c, &list_ops, j);
    list_go_on(c, j);
}

void route_files_stat(conn_t *c, const route_params_t *p)
{
    char path[FS_PATH_MAX];
    struct stat st;
    (void)p;
    if (files_path_param(c, "path", path, sizeof path) < 0)
        return;
    fs_root_t root = files_root(c);
    int r = fs_stat(&root, path, &st);
    if (r < 0) {
        files_fail(c, r, path);
        return;
    }
    /* name: the last component ("" for "/" and for a path ending in ".."), as the reference */
    size_t len = path_trimmed_len(path);
    const char *slash = memrchr(path, '/', len);
    const char *name = slash ? slash + 1 : path;
    size_t nlen = len - (size_t)(name - path);
    if (nlen == 2 && name[0] == '.' && name[1] == '.')
        nlen = 0;
    files_respond_json(c, entry_json(name, nlen, path, strlen(path), &st));
}

/* ---- delete, mkdir, rename --------------------------------------------------------------- */

static void files_respond_path(conn_t *c, const char *key, const char *path)
{
    json_t *jp = json_string_lossy(path, strlen(path));
    files_respond_json(c, jp ? json_pack("{s:o}", key, jp) : NULL);
}

void route_files_delete(conn_t *c, const route_params_t *p)
{
    char path[FS_PATH_MAX];
    bool recursive;
    (void)p;
    if (files_path_param(c, "path", path, sizeof path) < 0)
        return;
    if (query_bool(c, "recursive", false, &recursive) < 0) {
        http_bad_request(c, 0, "recursive must be true or false");
        return;
    }
    int r = files_delete(c, path, recursive);
    if (r < 0) {
        files_fail(c, r, path);
        return;
    }
    files_respond_path(c, "deleted", path);
}

void route_files_mkdir(conn_t *c, const route_params_t *p)
{
    char path[FS_PATH_MAX];
    (void)p;
    if (files_path_param(c, "path", path, sizeof path) < 0)
        return;
    fs_root_t root = files_root(c);
    int r = fs_mkdir_all(&root, path, 0777);
    if (r < 0) {
        files_fail(c, r, path);
        return;
    }
    files_respond_path(c, "created", path);
}

/* A string member of the rename body, or NULL after answering 400. */
static const char *rename_member(conn_t *c, json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    const char *s = json_string_value(v);
    if (!s || s[0] == '\0') {
        http_bad_request(c, 0, "'%s' must be a non-empty string", key);
        return NULL;
    }
    if (json_string_length(v) >= FS_PATH_MAX || strlen(s) != json_string_length(v)) {
        http_bad_request(c, 0, "'%s' is not a valid path", key);
        return NULL;
    }
    return s;
}

static void rename_body(conn_t *c, json_t *obj)
{
    const char *from = rename_member(c, obj, "from");
    if (!from)
        return;
    const char *to = rename_member(c, obj, "to");
    if (!to)
        return;
    json_t *ov = json_object_get(obj, "overwrite");
    if (ov && !json_is_boolean(ov)) {
        http_bad_request(c, 0, "'overwrite' must be a boolean");
        return;
    }
    fs_root_t root = files_root(c);
    int r = fs_rename(&root, from, to, ov && json_is_true(ov));
    if (r < 0) {
        files_fail(c, r, r == -EEXIST ? to : from);
        return;
    }
    json_t *jf = json_string_lossy(from, strlen(from));
    json_t *jt = json_string_lossy(to, strlen(to));
    files_respond_json(c, jf && jt ? json_pack("{s:o,s:o}", "from", jf, "to", jt) : NULL);
    if (!jf || !jt) {
        json_decref(jf);
        json_decref(jt);
    }
}

void route_files_rename(conn_t *c, const route_params_t *p)
{
    (void)p;
    route_with_json_body(c, FILES_RENAME_BODY_MAX, rename_body);
}
