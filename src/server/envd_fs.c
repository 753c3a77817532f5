/* SPDX-License-Identifier: MIT */
/* envd's filesystem.Filesystem service over fsops.c: every path is resolved against the
 * request's root (files_root: the whole filesystem when dedicated, the pool sandbox's home by
 * descriptor, following no symlink, otherwise), exactly as /v1/files/... resolves it. */
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>

#include "envd.h"

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

/* Entries of dir (its path as the client wrote it), depth levels deep, into arr; at most
 * FS_LIST_MAX in all. */
static int list_into(const fs_root_t *root, const char *dir, unsigned depth, json_t *arr)
{
    fs_listing_t l;
    size_t room = FS_LIST_MAX - MIN(json_array_size(arr), (size_t)FS_LIST_MAX);
    if (room == 0)
        return 0;
    int r = fs_list(root, dir, NULL, room, &l);
    if (r < 0)
        return r;
    size_t dl = strlen(dir);
    while (dl > 1 && dir[dl - 1] == '/')
        dl--;
    for (size_t i = 0; i < l.n && r >= 0; i++) {
        char path[FS_PATH_MAX];
        int n = snprintf(path, sizeof path, "%.*s%s%s", (int)dl, dir,
                         dl == 1 && dir[0] == '/' ? "" : "/", l.entries[i].name);
        if (n < 0 || (size_t)n >= sizeof path)
            continue;
        json_t *e = with_target(envd_entry_json(l.entries[i].name, path, &l.entries[i].st), root,
                                path, &l.entries[i].st);
        if (!e)
            continue; /* a name that is not UTF-8: no JSON string can carry it */
        json_array_append_new(arr, e);
        if (depth > 1 && S_ISDIR(l.entries[i].st.st_mode)) {
            int k = list_into(root, path, depth - 1, arr);
            if (k < 0 && k != -ENOENT && k != -EACCES)
                r = k;
        }
    }
    fs_listing_free(&l);
    return r < 0 ? r : 0;
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
    struct stat st;
    int r = fs_stat(&root, path, &st);
    if (r == 0 && !S_ISDIR(st.st_mode))
        r = -ENOTDIR;
    json_t *arr = r == 0 ? json_array() : NULL;
    if (r == 0 && !arr)
        r = -ENOMEM;
    if (r == 0)
        r = list_into(&root, path, (unsigned)depth, arr);
    if (r < 0) {
        json_decref(arr);
        fail_errno(call, r, "list", path);
        return;
    }
    envd_reply(call, json_pack("{s:o}", "entries", arr));
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
