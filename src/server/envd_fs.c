/* SPDX-License-Identifier: MIT */
/* envd's filesystem.Filesystem service over fsops.c: every path is resolved against the
 * request's root (files_root: the whole filesystem when dedicated, the pool sandbox's home by
 * descriptor, following no symlink, otherwise), exactly as /v1/files/... resolves it. */
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>

#include "envd.h"
#include "server.h"

#define LIST_MAX_DEPTH 64

bool envd_fs_streams(sv_t method, bool *ret_known)
{
    static const char *const unary[] = {
        "Stat",          "MakeDir",          "Move",         "ListDir", "Remove",
        "CreateWatcher", "GetWatcherEvents", "RemoveWatcher"
    };
    *ret_known = true;
    if (sv_eq(method, SV("WatchDir")))
        return true;
    for (size_t i = 0; i < ELEMENTSOF(unary); i++)
        if (method.len == strlen(unary[i]) && memcmp(method.p, unary[i], method.len) == 0)
            return false;
    *ret_known = false;
    return false;
}

/* ---- EntryInfo --------------------------------------------------------------------------- */

static void permissions_text(mode_t m, char out[11])
{
    static const char rwx[] = "rwxrwxrwx";
    out[0] = S_ISDIR(m)                 ? 'd'
             : S_ISLNK(m)               ? 'L'
             : S_ISFIFO(m)              ? 'p'
             : S_ISSOCK(m)              ? 'S'
             : S_ISCHR(m) || S_ISBLK(m) ? 'D'
                                        : '-';
    for (int i = 0; i < 9; i++)
        out[1 + i] = m & (1u << (8 - i)) ? rwx[i] : '-';
    out[10] = '\0';
}

/* Names on disk are bytes: ones that are not UTF-8 are rendered with U+FFFD by jansson's
 * refusal (NULL), so such an entry is skipped by the caller. */
json_t *envd_entry_json(const char *name, const char *path, const struct stat *st)
{
    char perms[11], when[64], uid[16], gid[16];
    struct tm tm;
    time_t t = st->st_mtim.tv_sec;
    if (!gmtime_r(&t, &tm))
        return NULL;
    size_t k = strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    (void)snprintf(when + k, sizeof when - k, ".%09ldZ", (long)st->st_mtim.tv_nsec);
    permissions_text(st->st_mode, perms);
    (void)snprintf(uid, sizeof uid, "%u", (unsigned)st->st_uid);
    (void)snprintf(gid, sizeof gid, "%u", (unsigned)st->st_gid);
    char size[32];
    (void)snprintf(size, sizeof size, "%lld", (long long)st->st_size);
    json_t *jname = json_string(name), *jpath = json_string(path);
    if (!jname || !jpath) {
        json_decref(jname);
        json_decref(jpath);
        return NULL;
    }
    const char *type = S_ISDIR(st->st_mode)   ? "FILE_TYPE_DIRECTORY"
                       : S_ISLNK(st->st_mode) ? "FILE_TYPE_SYMLINK"
                                              : "FILE_TYPE_FILE";
    return json_pack("{s:o,s:s,s:o,s:s,s:i,s:s,s:s,s:s,s:s}", "name", jname, "type", type, "path",
                     jpath, "size", size, "mode", (int)(st->st_mode & 07777), "permissions", perms,
                     "owner", uid, "group", gid, "modifiedTime", when);
}

/* A symlink's entry also says where it points (its text; it is never followed). */
static json_t *with_target(json_t *e, const fs_root_t *root, const char *path,
                           const struct stat *st)
{
    char target[FS_PATH_MAX];
    if (e && S_ISLNK(st->st_mode) && fs_readlink(root, path, target, sizeof target) >= 0)
        json_object_set_new(e, "symlinkTarget", json_string(target)); /* NULL: not UTF-8 */
    return e;
}

/* The last component of path ("/" for the root). */
static const char *base_name(const char *path, char *out, size_t cap)
{
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/')
        len--;
    size_t start = len;
    while (start > 0 && path[start - 1] != '/')
        start--;
    size_t n = MIN(len - start, cap - 1);
    if (n == 0 && len > 0) {
        (void)snprintf(out, cap, "/");
        return out;
    }
    memcpy(out, path + start, n);
    out[n] = '\0';
    return out;
}

/* A path member of the request (a non-empty string without NUL), else the call fails. */
static const char *path_member(envd_call_t *call, json_t *req, const char *key)
{
    json_t *v = json_object_get(req, key);
    if (!json_is_string(v) || json_string_length(v) == 0 ||
        strlen(json_string_value(v)) != json_string_length(v) ||
        json_string_length(v) >= FS_PATH_MAX) {
        envd_fail(call, CONNECT_INVALID_ARGUMENT, "%s must be a non-empty path", key);
        return NULL;
    }
    return json_string_value(v);
}

static void fail_errno(envd_call_t *call, int err, const char *what, const char *path)
{
    envd_fail(call, connect_code_from_errno(err), "%s %s: %s", what, path, strerror(-err));
}

static json_t *entry_of(const fs_root_t *root, const char *path, int *ret_err)
{
    struct stat st;
    char name[256];
    int r = fs_stat(root, path, &st);
    if (r < 0) {
        *ret_err = r;
        return NULL;
    }
    json_t *e = with_target(envd_entry_json(base_name(path, name, sizeof name), path, &st), root,
                            path, &st);
    if (!e)
        *ret_err = -ENOMEM;
    return e;
}

static void reply_entry(envd_call_t *call, const fs_root_t *root, const char *path,
                        const char *what)
{
    int err = 0;
    json_t *e = entry_of(root, path, &err);
    if (!e) {
        fail_errno(call, err, what, path);
        return;
    }
    envd_reply(call, json_pack("{s:o}", "entry", e));
}

static void rpc_stat(envd_call_t *call, json_t *req)
{
    const char *path = path_member(call, req, "path");
    fs_root_t root = files_root(call->c);
    if (path)
        reply_entry(call, &root, path, "stat");
}

static void rpc_make_dir(envd_call_t *call, json_t *req)
{
    const char *path = path_member(call, req, "path");
    if (!path)
        return;
    fs_root_t root = files_root(call->c);
    struct stat st;
    int r = fs_stat(&root, path, &st);
    if (r == 0) {
        envd_fail(call, CONNECT_ALREADY_EXISTS, "%s already exists", path);
        return;
    }
    if (r != -ENOENT || (r = fs_mkdir_all(&root, path, 0755)) < 0) {
        fail_errno(call, r, "mkdir", path);
        return;
    }
    reply_entry(call, &root, path, "stat");
}

static void rpc_move(envd_call_t *call, json_t *req)
{
    const char *from = path_member(call, req, "source");
    const char *to = from ? path_member(call, req, "destination") : NULL;
    if (!to)
        return;
    fs_root_t root = files_root(call->c);
    int r = fs_rename(&root, from, to, true);
    if (r < 0) {
        fail_errno(call, r, "move", from);
        return;
    }
    reply_entry(call, &root, to, "stat");
}

static void rpc_remove(envd_call_t *call, json_t *req)
{
    const char *path = path_member(call, req, "path");
    if (!path)
        return;
    int r = files_delete(call->c, path, true);
    if (r < 0 && r != -ENOENT) { /* as os.RemoveAll: a missing path is removed already */
        fail_errno(call, r, "remove", path);
        return;
    }
    envd_reply(call, json_object());
}

/* ListDir: entries of a directory, depth levels deep (each directory's entries, then under
 * each subdirectory its own, in order), at most FS_LIST_MAX in all. Read LIST_TURN entries per
 * turn of the loop (a directory of 200,000 read at once held every other request of the host
 * for ~0.5 s): a stack of the directories being read, the deepest on top. */
#define LIST_TURN 4096
/* and answers at most this many bytes (each entry counted as its path, its name and
 * LIST_ENTRY_BYTES of fields; a listing of long names or deep paths could be hundreds of MB):
 * beyond, resource_exhausted (ListDir has no pages: ask for fewer levels) */
#define LIST_BYTES_MAX (24u * 1024 * 1024)
#define LIST_ENTRY_BYTES 200

typedef struct {
    char path[FS_PATH_MAX]; /* as the client wrote it */
    unsigned depth;         /* levels left, this one's included */
    fs_lister_t *ls;        /* being read; NULL once read */
    fs_listing_t l;         /* once read: its entries */
    size_t i;               /* the next of them to answer */
} list_frame_t;

typedef struct {
    envd_call_t *call;
    fs_root_t root;
    json_t *arr;
    size_t bytes;            /* the answer's, as counted (LIST_BYTES_MAX) */
    char first[FS_PATH_MAX]; /* the directory asked for */
    list_frame_t frames[LIST_MAX_DEPTH];
    size_t n;
    timer_t_ turn;
} list_job_t;

static void list_pop(list_job_t *j)
{
    list_frame_t *f = &j->frames[--j->n];
    fs_list_abort(f->ls);
    fs_listing_free(&f->l);
    *f = (list_frame_t){ 0 };
}

static void list_job_free(envd_call_t *call)
{
    list_job_t *j = call->state;
    if (!j)
        return;
    call->state = NULL;
    timer_disarm(server_of(call->c)->loop, &j->turn);
    while (j->n > 0)
        list_pop(j);
    json_decref(j->arr);
    free(j);
}

/* Begin reading dir above the others (depth levels); < 0 only for an error that ends the
 * call: the first directory's errors are the call's; below, one gone or closed is left out. */
static int list_push(list_job_t *j, const char *dir, unsigned depth)
{
    size_t room = FS_LIST_MAX - MIN(json_array_size(j->arr), (size_t)FS_LIST_MAX);
    if (room == 0 || j->n >= LIST_MAX_DEPTH)
        return 0;
    list_frame_t *f = &j->frames[j->n];
    int r = fs_list_begin(&j->root, dir, NULL, room, &f->ls);
    if (r < 0)
        return j->n == 0 || (r != -ENOENT && r != -EACCES) ? r : 0;
    (void)snprintf(f->path, sizeof f->path, "%s", dir);
    f->depth = depth;
    j->n++;
    return 0;
}

/* One turn's work: 1 when the listing is whole, 0 when more is left, < 0 an error. */
static int list_work(list_job_t *j)
{
    for (size_t budget = LIST_TURN; j->n > 0;) {
        list_frame_t *f = &j->frames[j->n - 1];
        if (f->ls) {
            if (budget == 0)
                return 0;
            int r = fs_list_step(f->ls, budget);
            if (r == 0)
                return 0; /* read a turn's worth */
            budget--;
            if (r > 0)
                r = fs_list_finish(TAKE_PTR(f->ls), &f->l);
            if (r < 0) {
                if (j->n > 1 && (r == -ENOENT || r == -EACCES)) {
                    list_pop(j);
                    continue;
                }
                return r;
            }
            continue;
        }
        if (f->i >= f->l.n) {
            list_pop(j);
            continue;
        }
        if (budget == 0)
            return 0;
        budget--;
        const fs_entry_t *e = &f->l.entries[f->i++];
        size_t dl = strlen(f->path);
        while (dl > 1 && f->path[dl - 1] == '/')
            dl--;
        char path[FS_PATH_MAX];
        int n = snprintf(path, sizeof path, "%.*s%s%s", (int)dl, f->path,
                         dl == 1 && f->path[0] == '/' ? "" : "/", e->name);
        if (n < 0 || (size_t)n >= sizeof path)
            continue;
        json_t *je = with_target(envd_entry_json(e->name, path, &e->st), &j->root, path, &e->st);
        if (!je)
            continue; /* a name that is not UTF-8: no JSON string can carry it */
        json_array_append_new(j->arr, je);
        j->bytes += 2 * (size_t)n + LIST_ENTRY_BYTES; /* path, and name within it */
        if (j->bytes > LIST_BYTES_MAX)
            return -E2BIG;
        if (f->depth > 1 && S_ISDIR(e->st.st_mode)) {
            int r = list_push(j, path, f->depth - 1);
            if (r < 0)
                return r;
        }
    }
    return 1;
}

/* Do a turn's work, then answer or come back (the call, and j with it, is freed once
 * answered). */
static void list_go_on(list_job_t *j)
{
    envd_call_t *call = j->call;
    int r = list_work(j);
    if (r == 0 && timer_arm(server_of(call->c)->loop, &j->turn, 0) >= 0)
        return;
    if (r == 0)
        r = -ENOMEM;
    json_t *arr = r == 1 ? json_incref(j->arr) : NULL;
    char path[FS_PATH_MAX];
    memcpy(path, j->first, sizeof path);
    list_job_free(call);
    if (r == -E2BIG) {
        listing_slot_give(&call->listing);
        envd_fail(call, CONNECT_RESOURCE_EXHAUSTED,
                  "the listing of %.200s is larger than %u MB: list fewer levels", path,
                  LIST_BYTES_MAX >> 20);
        return;
    }
    if (r < 0) {
        listing_slot_give(&call->listing);
        fail_errno(call, r, "list", path);
        return;
    }
    envd_reply(call, json_pack("{s:o}", "entries", arr)); /* its slot goes with the call */
}

static void list_on_turn(loop_t *l, timer_t_ *t)
{
    (void)l;
    list_go_on(t->data);
}

static void rpc_list_dir(envd_call_t *call, json_t *req)
{
    const char *path = path_member(call, req, "path");
    if (!path)
        return;
    json_t *d = json_object_get(req, "depth");
    json_int_t depth = 1;
    if (json_is_integer(d))
        depth = json_integer_value(d);
    else if (d && !json_is_null(d)) {
        envd_fail(call, CONNECT_INVALID_ARGUMENT, "depth must be a number");
        return;
    }
    if (depth == 0)
        depth = 1;
    if (depth < 1 || depth > LIST_MAX_DEPTH) {
        envd_fail(call, CONNECT_INVALID_ARGUMENT, "depth must be 1..%d", LIST_MAX_DEPTH);
        return;
    }
    fs_root_t root = files_root(call->c);
    if (!listing_slot_take(call->c, &call->listing)) {
        envd_fail(call, CONNECT_RESOURCE_EXHAUSTED,
                  "too many listings in flight (%d per sandbox, %d per host)", LISTINGS_PER_SANDBOX,
                  LISTINGS_MAX);
        return;
    }
    struct stat st;
    int r = fs_stat(&root, path, &st);
    if (r == 0 && !S_ISDIR(st.st_mode))
        r = -ENOTDIR;
    list_job_t *j = r == 0 ? calloc(1, sizeof *j) : NULL;
    if (r == 0 && (!j || !(j->arr = json_array())))
        r = -ENOMEM;
    if (r == 0) {
        j->call = call;
        j->root = root;
        /* each entry's path is this one's and its name: tidied, so that a path written long
         * does not make every entry long (path_normalize; absolute if written so) */
        size_t abs = path[0] == '/';
        int n = path_normalize(path, strlen(path), j->first + abs, sizeof j->first - abs);
        if (n < 0)
            (void)snprintf(j->first, sizeof j->first, "%s", path);
        else if (abs)
            j->first[0] = '/';
        else if (n == 0)
            (void)snprintf(j->first, sizeof j->first, ".");
        r = list_push(j, j->first, (unsigned)depth);
    }
    if (r < 0) {
        if (j)
            json_decref(j->arr);
        free(j);
        listing_slot_give(&call->listing);
        fail_errno(call, r, "list", path);
        return;
    }
    timer_init(&j->turn, list_on_turn, j);
    call->state = j;
    call->on_close = list_job_free;
    list_go_on(j);
}

void envd_fs_call(envd_call_t *call, sv_t method, json_t *req)
{
    if (sv_eq(method, SV("Stat")))
        rpc_stat(call, req);
    else if (sv_eq(method, SV("ListDir")))
        rpc_list_dir(call, req);
    else if (sv_eq(method, SV("MakeDir")))
        rpc_make_dir(call, req);
    else if (sv_eq(method, SV("Move")))
        rpc_move(call, req);
    else if (sv_eq(method, SV("Remove")))
        rpc_remove(call, req);
    else if (sv_eq(method, SV("WatchDir")))
        envd_watch_dir(call, req);
    else if (sv_eq(method, SV("CreateWatcher")))
        envd_create_watcher(call, req);
    else if (sv_eq(method, SV("GetWatcherEvents")))
        envd_get_watcher_events(call, req);
    else if (sv_eq(method, SV("RemoveWatcher")))
        envd_remove_watcher(call, req);
    else
        envd_fail(call, CONNECT_UNIMPLEMENTED, "method not served");
}
