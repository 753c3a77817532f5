/* SPDX-License-Identifier: MIT */
/* envd's directory watches on inotify: WatchDir streams the events of a directory (and of its
 * subdirectories when recursive); CreateWatcher / GetWatcherEvents / RemoveWatcher are the
 * polled form, whose events wait in the inotify queue until asked for. Every directory is
 * resolved through fsops.c against the request's root (in a pool sandbox: beneath its home,
 * following no symlink) and opened; the watch is put on that open directory through
 * /proc/self/fd, never on a path name a tenant could swap. */
#include <limits.h>
#include <sodium.h>
#include <stdio.h>
#include <sys/inotify.h>
#include <sys/stat.h>

#include "envd.h"
#include "pool.h"
#include "server.h"

/* The kernel counts inotify instances and watches per user (max_user_instances, 128, and
 * max_user_watches, here 192,530), and this server's are root's: it takes half of each at
 * most, and a pooled sandbox WATCH_MAX_SANDBOX instances and WATCH_MAX_SANDBOX_DIRS
 * directories of that, so no tenant can use up inotify for the host's other users nor for
 * its siblings. */
#define WATCH_MAX_DIRS 4096         /* directories of one watch (recursive) */
#define WATCH_MAX_POLLED 64         /* polled watchers of a dedicated server */
#define WATCH_MAX_SANDBOX 8         /* watches (polled or streams) of one pooled sandbox */
#define WATCH_MAX_SANDBOX_DIRS 4096 /* directories of one pooled sandbox's watches together */
#define WATCH_MAX_EVENTS 4096       /* events one GetWatcherEvents answers */
#define WATCH_READ (64 * 1024)
#define WATCH_MASK                                                                                 \
    (IN_CREATE | IN_MODIFY | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_ATTRIB | IN_ONLYDIR)

typedef struct {
    int wd;
    char *rel; /* beneath the watched directory ("" for itself) */
} wdir_t;

struct envd_watch {
    server_t *srv;
    sandbox_t *sb; /* a reference (pool mode) */
    fs_root_t root;
    int ifd;
    watcher_t w; /* streams only */
    char *path;  /* as the client wrote it */
    bool recursive, include_entry;
    wdir_t *dirs;
    size_t n_dirs;
    envd_call_t *call;  /* WatchDir: the stream */
    char id[33];        /* polled: the watcher's id */
    envd_watch_t *next; /* polled: the server's list */
};

/* A directory watch more, or fewer (delta), on the server's and the sandbox's counts. */
static void dirs_count(envd_watch_t *w, int64_t delta)
{
    w->srv->watch_dirs = (uint64_t)((int64_t)w->srv->watch_dirs + delta);
    if (w->sb)
        w->sb->watch_dirs = (unsigned)((int64_t)w->sb->watch_dirs + delta);
}

/* Its inotify instance and directories given back (the watch itself may stay until its
 * stream's connection goes). */
static void watch_release_kernel(envd_watch_t *w)
{
    if (w->call)
        loop_unwatch(w->srv->loop, &w->w);
    if (w->ifd >= 0) {
        w->ifd = safe_close(w->ifd);
        w->w.fd = -EBADF; /* never watched again (watch_stream_drain) */
        w->srv->watch_instances--;
        if (w->sb)
            w->sb->watch_instances--;
    }
    dirs_count(w, -(int64_t)w->n_dirs);
    for (size_t i = 0; i < w->n_dirs; i++)
        free(w->dirs[i].rel);
    free(w->dirs);
    w->dirs = NULL;
    w->n_dirs = 0;
}

static void watch_free(envd_watch_t *w)
{
    if (!w)
        return;
    watch_release_kernel(w);
    free(w->path);
    sandbox_unref(w->sb);
    free(w);
}

/* Half of what the kernel allows this server's uid, read once. */
static void budget_read(server_t *s)
{
    if (s->watch_instances_max)
        return;
    uint64_t inst = 128, dirs = 8192;
    static const char *const files[2] = { "/proc/sys/fs/inotify/max_user_instances",
                                          "/proc/sys/fs/inotify/max_user_watches" };
    uint64_t *vals[2] = { &inst, &dirs };
    for (int i = 0; i < 2; i++) {
        char b[32];
        FILE *f = fopen(files[i], "re");
        if (f && fgets(b, sizeof b, f)) {
            b[strcspn(b, "\n")] = '\0';
            (void)parse_u64_str(b, UINT32_MAX, vals[i]); /* unchanged if it does not parse */
        }
        if (f)
            fclose(f);
    }
    s->watch_instances_max = (unsigned)MIN(MAX(inst / 2, 1), (uint64_t)UINT_MAX);
    s->watch_dirs_max = MAX(dirs / 2, 1);
}

/* path + "/" + rel (rel may be ""). */
static int join(char *out, size_t cap, const char *path, const char *rel)
{
    size_t pl = strlen(path);
    while (pl > 1 && path[pl - 1] == '/')
        pl--;
    int n = rel[0] ? snprintf(out, cap, "%.*s%s%s", (int)pl, path,
                              pl == 1 && path[0] == '/' ? "" : "/", rel)
                   : snprintf(out, cap, "%.*s", (int)pl, path);
    return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

/* Watch the directory rel beneath the watched one (opened by descriptor first). */
static int watch_add_dir(envd_watch_t *w, const char *rel)
{
    char full[FS_PATH_MAX], proc[64];
    int fd, r;
    if (w->n_dirs >= WATCH_MAX_DIRS || w->srv->watch_dirs >= w->srv->watch_dirs_max ||
        (w->sb && w->sb->watch_dirs >= WATCH_MAX_SANDBOX_DIRS))
        return -ENOSPC;
    if ((r = join(full, sizeof full, w->path, rel)) < 0)
        return r;
    if ((r = fs_open(&w->root, full, O_PATH | O_DIRECTORY, 0, &fd)) < 0)
        return r;
    (void)snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    int wd = inotify_add_watch(w->ifd, proc, WATCH_MASK);
    r = wd < 0 ? negative_errno() : 0;
    safe_close(fd);
    if (r < 0)
        return r;
    for (size_t i = 0; i < w->n_dirs; i++)
        if (w->dirs[i].wd == wd)
            return 0; /* the same directory again (a rename) */
    wdir_t *nd = realloc(w->dirs, (w->n_dirs + 1) * sizeof *nd);
    if (!nd)
        return -ENOMEM;
    w->dirs = nd;
    if (!(nd[w->n_dirs].rel = strdup(rel))) {
        (void)inotify_rm_watch(w->ifd, wd);
        return -ENOMEM;
    }
    nd[w->n_dirs++].wd = wd;
    dirs_count(w, 1);
    return 0;
}

/* rel and, when recursive, every directory beneath it (none followed through a symlink). */
static int watch_add_tree(envd_watch_t *w, const char *rel, unsigned depth)
{
    int r = watch_add_dir(w, rel);
    if (r < 0 || !w->recursive || depth > 64)
        return r;
    char full[FS_PATH_MAX];
    fs_listing_t l;
    if (join(full, sizeof full, w->path, rel) < 0 || fs_list(&w->root, full, NULL, 10000, &l) < 0)
        return 0; /* gone meanwhile: its events end with it */
    for (size_t i = 0; i < l.n && r >= 0; i++) {
        if (!S_ISDIR(l.entries[i].st.st_mode))
            continue;
        char sub[FS_PATH_MAX];
        int n = rel[0] ? snprintf(sub, sizeof sub, "%s/%s", rel, l.entries[i].name)
                       : snprintf(sub, sizeof sub, "%s", l.entries[i].name);
        if (n > 0 && (size_t)n < sizeof sub) {
            int k = watch_add_tree(w, sub, depth + 1);
            if (k == -ENOSPC || k == -ENOMEM)
                r = k;
        }
    }
    fs_listing_free(&l);
    return r;
}

static int watch_new(conn_t *c, json_t *req, envd_watch_t **ret, connect_code_t *code,
                     const char **what)
{
    json_t *p = json_object_get(req, "path"), *rec = json_object_get(req, "recursive");
    json_t *inc = json_object_get(req, "includeEntry");
    *code = CONNECT_INVALID_ARGUMENT;
    *what = "path must be a non-empty path; recursive and includeEntry booleans";
    if (!json_is_string(p) || json_string_length(p) == 0 ||
        strlen(json_string_value(p)) != json_string_length(p) ||
        json_string_length(p) >= FS_PATH_MAX || (rec && !json_is_boolean(rec)) ||
        (inc && !json_is_boolean(inc)))
        return -EINVAL;
    server_t *s = server_of(c);
    const sandbox_t *sb = conn_sandbox(c);
    budget_read(s);
    *code = CONNECT_RESOURCE_EXHAUSTED;
    if (sb && sb->watch_instances >= WATCH_MAX_SANDBOX) {
        *what = "too many watches in this sandbox (max 8)";
        return -ENOSPC;
    }
    if (s->watch_instances >= s->watch_instances_max) {
        *what = "the host's directory watches are all in use";
        return -ENOSPC;
    }
    envd_watch_t *w = calloc(1, sizeof *w);
    if (!w)
        return -ENOMEM;
    w->srv = s;
    w->sb = sandbox_ref(conn_sandbox(c));
    w->root = files_root(c);
    w->recursive = json_is_true(rec);
    w->include_entry = json_is_true(inc);
    w->ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (w->ifd >= 0) {
        s->watch_instances++;
        if (w->sb)
            w->sb->watch_instances++;
    }
    w->path = strdup(json_string_value(p));
    int r = w->ifd < 0 ? negative_errno() : !w->path ? -ENOMEM : 0;
    if (r == 0) {
        struct stat st;
        r = fs_stat(&w->root, w->path, &st);
        if (r == 0 && !S_ISDIR(st.st_mode))
            r = -ENOTDIR;
    }
    if (r == 0)
        r = watch_add_tree(w, "", 0);
    if (r < 0) {
        watch_free(w);
        *code = r == -ENOSPC ? CONNECT_RESOURCE_EXHAUSTED : connect_code_from_errno(r);
        *what = r == -ENOSPC ? "too many watched directories (4096 per watch and per sandbox, "
                               "or the host's budget)"
                             : strerror(-r);
        return r;
    }
    *ret = w;
    return 0;
}

/* ---- events ------------------------------------------------------------------------------ */

static const char *event_type(uint32_t mask)
{
    if (mask & (IN_CREATE | IN_MOVED_TO))
        return "EVENT_TYPE_CREATE";
    if (mask & IN_MODIFY)
        return "EVENT_TYPE_WRITE";
    if (mask & IN_DELETE)
        return "EVENT_TYPE_REMOVE";
    if (mask & IN_MOVED_FROM)
        return "EVENT_TYPE_RENAME";
    if (mask & IN_ATTRIB)
        return "EVENT_TYPE_CHMOD";
    return NULL;
}

static const char *dir_rel(const envd_watch_t *w, int wd)
{
    for (size_t i = 0; i < w->n_dirs; i++)
        if (w->dirs[i].wd == wd)
            return w->dirs[i].rel;
    return NULL;
}

/* One inotify event as a FilesystemEvent (NULL: none to report). */
static json_t *event_json(envd_watch_t *w, const struct inotify_event *ev)
{
    const char *type = event_type(ev->mask);
    const char *rel = dir_rel(w, ev->wd);
    if (ev->mask & IN_IGNORED) { /* a watched directory went away */
        for (size_t i = 0; i < w->n_dirs; i++)
            if (w->dirs[i].wd == ev->wd) {
                free(w->dirs[i].rel);
                w->dirs[i] = w->dirs[--w->n_dirs];
                dirs_count(w, -1);
                break;
            }
        return NULL;
    }
    if (!type || !rel || ev->len == 0)
        return NULL;
    char name[FS_PATH_MAX];
    int n = rel[0] ? snprintf(name, sizeof name, "%s/%s", rel, ev->name)
                   : snprintf(name, sizeof name, "%s", ev->name);
    if (n < 0 || (size_t)n >= sizeof name)
        return NULL;
    if (w->recursive && (ev->mask & IN_ISDIR) && (ev->mask & (IN_CREATE | IN_MOVED_TO)))
        (void)watch_add_tree(w, name, 1); /* a new directory: watched from now on */
    json_t *e = json_pack("{s:s,s:s}", "name", name, "type", type);
    if (e && w->include_entry && !(ev->mask & (IN_DELETE | IN_MOVED_FROM))) {
        char full[FS_PATH_MAX];
        struct stat st;
        if (join(full, sizeof full, w->path, name) == 0 && fs_stat(&w->root, full, &st) == 0) {
            json_t *entry = envd_entry_json(ev->name, full, &st);
            if (entry)
                json_object_set_new(e, "entry", entry);
        }
    }
    return e;
}

/* Read what inotify holds and hand each event to emit(); stops when emit() returns false
 * (the reader is full) or nothing is left. Returns < 0 on a read error. */
static int watch_read(envd_watch_t *w, bool (*emit)(void *ctx, json_t *ev), void *ctx)
{
    char buf[WATCH_READ] __attribute__((aligned(__alignof__(struct inotify_event))));
    for (;;) {
        ssize_t n = read(w->ifd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return errno == EAGAIN ? 0 : negative_errno();
        bool more = true;
        for (char *p = buf; p < buf + n;) {
            const struct inotify_event *ev = (const struct inotify_event *)p;
            p += sizeof *ev + ev->len;
            json_t *e = event_json(w, ev);
            if (e && !emit(ctx, e))
                more = false; /* the rest of this batch is still delivered: read already */
        }
        if (!more)
            return 0;
    }
}

/* ---- WatchDir (stream) ------------------------------------------------------------------- */

static bool stream_emit(void *ctx, json_t *ev)
{
    envd_call_t *call = ctx;
    (void)envd_send(call, json_pack("{s:o}", "filesystem", ev));
    return !conn_out_full(call->c);
}

static void watch_on_inotify(loop_t *l, watcher_t *wt, uint32_t events)
{
    envd_watch_t *w = wt->data;
    envd_call_t *call = w->call;
    (void)events;
    if (call->ended)
        return;
    int r = watch_read(w, stream_emit, call);
    if (r < 0) {
        envd_fail(call, CONNECT_INTERNAL, "reading the watch: %s", strerror(-r));
        return;
    }
    conn_flush(call->c);
    if (conn_out_full(call->c))
        (void)loop_watch(l, wt, 0); /* until the client reads: the kernel queues meanwhile */
}

static void watch_stream_drain(envd_call_t *call)
{
    envd_watch_t *w = call->state;
    if (w && w->ifd >= 0) /* not once its sandbox was deleted (envd_watches_drop) */
        (void)loop_watch(w->srv->loop, &w->w, EPOLLIN);
}

static void watch_stream_close(envd_call_t *call)
{
    envd_watch_t *w = call->state;
    if (w)
        for (envd_watch_t **pp = &w->srv->envd_streams; *pp; pp = &(*pp)->next)
            if (*pp == w) {
                *pp = w->next;
                break;
            }
    watch_free(w);
    call->state = NULL;
}

void envd_watch_dir(envd_call_t *call, json_t *req)
{
    envd_watch_t *w;
    connect_code_t code;
    const char *what;
    if (watch_new(call->c, req, &w, &code, &what) < 0) {
        envd_fail(call, code, "watch: %s", what);
        return;
    }
    w->call = call;
    call->state = w;
    w->next = w->srv->envd_streams;
    w->srv->envd_streams = w;
    call->on_drain = watch_stream_drain;
    call->on_close = watch_stream_close;
    watcher_init(&w->w, w->ifd, watch_on_inotify, w);
    if (envd_send_raw(call, "{\"start\":{}}", 12) < 0 ||
        loop_watch(w->srv->loop, &w->w, EPOLLIN) < 0) {
        envd_fail(call, CONNECT_RESOURCE_EXHAUSTED, "cannot watch");
        return;
    }
    conn_flush(call->c);
}

/* ---- polled watchers --------------------------------------------------------------------- */

/* Watchers of sandboxes deleted since are dropped (their directories are gone). */
static void polled_sweep(server_t *s)
{
    for (envd_watch_t **pp = &s->envd_watches; *pp;) {
        envd_watch_t *w = *pp;
        if (w->sb && w->sb->deleted) {
            *pp = w->next;
            watch_free(w);
        } else
            pp = &w->next;
    }
}

static envd_watch_t **polled_find(envd_call_t *call, json_t *req)
{
    json_t *id = json_object_get(req, "watcherId");
    conn_t *c = call->c;
    polled_sweep(server_of(c));
    if (!json_is_string(id)) {
        envd_fail(call, CONNECT_INVALID_ARGUMENT, "watcherId is required");
        return NULL;
    }
    for (envd_watch_t **pp = &server_of(c)->envd_watches; *pp; pp = &(*pp)->next)
        if ((*pp)->sb == conn_sandbox(c) && streq((*pp)->id, json_string_value(id)))
            return pp; /* another sandbox's watcher does not exist for this one */
    envd_fail(call, CONNECT_NOT_FOUND, "no such watcher");
    return NULL;
}

void envd_create_watcher(envd_call_t *call, json_t *req)
{
    conn_t *c = call->c;
    size_t mine = 0;
    polled_sweep(server_of(c));
    for (envd_watch_t *w = server_of(c)->envd_watches; w; w = w->next)
        mine += w->sb == conn_sandbox(c);
    if (!conn_sandbox(c) && mine >= WATCH_MAX_POLLED) {
        envd_fail(call, CONNECT_RESOURCE_EXHAUSTED, "too many watchers (max %d)", WATCH_MAX_POLLED);
        return;
    }
    envd_watch_t *w;
    connect_code_t code;
    const char *what;
    if (watch_new(c, req, &w, &code, &what) < 0) {
        envd_fail(call, code, "watch: %s", what);
        return;
    }
    unsigned char rnd[16];
    randombytes_buf(rnd, sizeof rnd);
    sodium_bin2hex(w->id, sizeof w->id, rnd, sizeof rnd);
    w->next = server_of(c)->envd_watches;
    server_of(c)->envd_watches = w;
    envd_reply(call, json_pack("{s:s}", "watcherId", w->id));
}

static bool polled_emit(void *ctx, json_t *ev)
{
    json_t *arr = ctx;
    json_array_append_new(arr, ev);
    return json_array_size(arr) < WATCH_MAX_EVENTS;
}

void envd_get_watcher_events(envd_call_t *call, json_t *req)
{
    envd_watch_t **pp = polled_find(call, req);
    if (!pp)
        return;
    json_t *arr = json_array();
    if (!arr) {
        envd_fail(call, CONNECT_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    int r = watch_read(*pp, polled_emit, arr);
    if (r < 0) {
        json_decref(arr);
        envd_fail(call, CONNECT_INTERNAL, "reading the watch: %s", strerror(-r));
        return;
    }
    envd_reply(call, json_pack("{s:o}", "events", arr));
}

void envd_remove_watcher(envd_call_t *call, json_t *req)
{
    envd_watch_t **pp = polled_find(call, req);
    if (!pp)
        return;
    envd_watch_t *w = *pp;
    *pp = w->next;
    watch_free(w);
    envd_reply(call, json_object());
}

void envd_watches_drop(server_t *s, const sandbox_t *sb)
{
    polled_sweep(s); /* sb is marked deleted already */
    for (envd_watch_t *w = s->envd_streams; w; w = w->next)
        if (w->sb == sb && w->call) {
            if (!w->call->ended)
                envd_fail(w->call, CONNECT_NOT_FOUND, "the sandbox was deleted");
            watch_release_kernel(w); /* freed when its connection goes (watch_stream_close) */
        }
}

void envd_watches_free(server_t *s)
{
    while (s->envd_watches) {
        envd_watch_t *w = s->envd_watches;
        s->envd_watches = w->next;
        watch_free(w);
    }
}
