/* SPDX-License-Identifier: MIT */
/* libsbx: the sandbox file API (read, write, streamed upload and download, list with pages,
 * stat, mkdir, delete, rename). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/macro.h"
#include "lib/internal.h"

static void jsonp(json_t **j) { json_decref(*j); }
#define _cleanup_json_ _cleanup_(jsonp)

#define LIST_PAGE 1000

/* rest: "/files/<op>?path=<escaped path><more>" for the sandbox. */
static char *file_route(const sbx_sandbox_t *s, const char *op, const char *path, const char *more)
{
    _cleanup_free_ char *ep = url_escape(path);
    _cleanup_free_ char *rest =
        ep ? strprintf("/files/%s?path=%s%s", op, ep, more ? more : "") : NULL;
    return rest ? sandbox_route(s, rest) : NULL;
}

static char *token_line(const sbx_sandbox_t *s)
{
    return s->pool ? strdup("") : strprintf("X-Sandbox-Token: %s\r\n", s->token);
}

static int file_call(sbx_sandbox_t *s, const char *what, const char *path, http_req_t *rq,
                     http_resp_t *resp, sbx_error_t *err)
{
    _cleanup_free_ char *th = token_line(s);
    if (!th)
        return err_set(err, -ENOMEM, 0, "out of memory");
    char w[600];
    (void)snprintf(w, sizeof w, "%s %s:%s", what, s->display, path);
    return api_raw(s->c, w, rq, th, resp, err);
}

static int file_json(sbx_sandbox_t *s, const char *what, const char *method, const char *op,
                     const char *path, const char *more, json_t **ret, sbx_error_t *err)
{
    _cleanup_free_ char *t = file_route(s, op, path, more);
    if (!t)
        return err_set(err, -ENOMEM, 0, "out of memory");
    http_req_t rq = { .method = method, .target = t, .body_fd = -1 };
    http_resp_t resp;
    int r = file_call(s, what, path, &rq, &resp, err);
    if (r < 0)
        return r;
    json_t *j = json_loadb(resp.body, resp.body_len, 0, NULL);
    http_resp_free(&resp);
    if (!j)
        return err_set(err, -EPROTO, 0, "%s %s: the answer is not JSON", what, path);
    if (ret)
        *ret = j;
    else
        json_decref(j);
    return 0;
}

int sbx_file_read(sbx_sandbox_t *s, const char *path, void **ret_data, size_t *ret_len,
                  sbx_error_t *err)
{
    _cleanup_free_ char *t = file_route(s, "read", path, NULL);
    if (!t)
        return err_set(err, -ENOMEM, 0, "out of memory");
    http_req_t rq = { .method = "GET", .target = t, .body_fd = -1, .body_max = HTTP_BODY_MAX };
    http_resp_t resp;
    int r = file_call(s, "read", path, &rq, &resp, err);
    if (r < 0)
        return r;
    *ret_data = resp.body;
    *ret_len = resp.body_len;
    return 0;
}

int sbx_file_write(sbx_sandbox_t *s, const char *path, const void *data, size_t len,
                   sbx_error_t *err)
{
    _cleanup_free_ char *t = file_route(s, "write", path, "&mkdir=true");
    if (!t)
        return err_set(err, -ENOMEM, 0, "out of memory");
    http_req_t rq = { .method = "PUT",
                      .target = t,
                      .content_type = "application/octet-stream",
                      .body = data ? data : "",
                      .body_len = len,
                      .body_fd = -1 };
    http_resp_t resp;
    int r = file_call(s, "write", path, &rq, &resp, err);
    if (r >= 0)
        http_resp_free(&resp);
    return r;
}

/* ---- upload and download: one stream, or ranges on connections of their own ------------------ */

/* Progress summed over the ranges, reported cumulatively, one call at a time. total is
 * UINT64_MAX while unknown: a download in one stream takes its response's length (the request's
 * own total, once its headers came), so its caller sees the size as the bytes arrive. */
typedef struct {
    pthread_mutex_t lock;
    uint64_t done, total;
    sbx_transfer_fn fn;
    void *ud;
} progress_t;

static void progress_add(uint64_t n, uint64_t total, void *ud)
{
    progress_t *p = ud;
    (void)pthread_mutex_lock(&p->lock);
    if (p->total == UINT64_MAX)
        p->total = total;
    p->done += n;
    if (p->fn)
        p->fn(p->done, p->total, p->ud);
    (void)pthread_mutex_unlock(&p->lock);
}

typedef struct {
    int fd;
    uint64_t off; /* where the next byte goes */
    int failed;
} fd_sink_t;

static int fd_sink(const void *data, size_t n, void *ud)
{
    fd_sink_t *fs = ud;
    const char *p = data;
    while (n > 0) {
        ssize_t w = pwrite(fs->fd, p, n, (off_t)fs->off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return fs->failed = w < 0 ? -errno : -EIO;
        p += w;
        n -= (size_t)w;
        fs->off += (uint64_t)w;
    }
    return 0;
}

typedef struct {
    sbx_sandbox_t *s;
    const char *path;
    int fd;
    bool upload;
    uint64_t off, len;
    progress_t *prog;
    int r, status;
    char *body;    /* the platform's answer to a refused range */
    sbx_err_t err; /* why, when r < 0 and not for a status (err.msg empty: strerror(-r)) */
} range_t;

static void *range_run(void *arg)
{
    range_t *g = arg;
    sbx_client_t *c = g->s->c;
    char more[96];
    if (g->upload)
        (void)snprintf(more, sizeof more, "&offset=%llu", (unsigned long long)g->off);
    else
        (void)snprintf(more, sizeof more, "&offset=%llu&length=%llu", (unsigned long long)g->off,
                       (unsigned long long)g->len);
    _cleanup_free_ char *t = file_route(g->s, g->upload ? "write" : "read", g->path, more);
    _cleanup_free_ char *th = token_line(g->s);
    _cleanup_free_ char *hdr = th ? strprintf("%s%s", c->auth, th) : NULL;
    if (!t || !hdr) {
        g->r = -ENOMEM;
        return NULL;
    }
    http_conn_t hc;
    g->r = http_conn_init(&hc, c->endpoint, c->ca_file, c->io_timeout_ms, &g->err);
    if (g->r < 0)
        return NULL;
    fd_sink_t fs = { .fd = g->fd, .off = g->off };
    http_req_t rq = { .method = g->upload ? "PUT" : "GET",
                      .target = t,
                      .headers = hdr,
                      .content_type = g->upload ? "application/octet-stream" : NULL,
                      .body_fd = g->upload ? g->fd : -1,
                      .body_fd_off = g->off,
                      .body_fd_len = g->len,
                      .sink = g->upload ? NULL : fd_sink,
                      .sink_ud = &fs,
                      .progress = progress_add,
                      .progress_ud = g->prog };
    http_resp_t resp = { 0 };
    g->r = http_do(&hc, &rq, &resp, &g->err);
    http_conn_done(&hc);
    if (fs.failed) {
        g->r = sbx_err(&g->err, fs.failed, "cannot write the local file: %s", strerror(-fs.failed));
    } else if (g->r >= 0 && (resp.status < 200 || resp.status >= 300)) {
        g->status = resp.status;
        g->body = TAKE_PTR(resp.body);
        g->r = -EIO;
    } else if (g->r >= 0 && !g->upload && fs.off != g->off + g->len) {
        g->r = sbx_err(&g->err, -EIO, "the file changed while it was copied");
    }
    http_resp_free(&resp);
    return NULL;
}

/* Move [0, size) of fd in ranges at once; the first failure becomes the error. */
static int move_ranges(sbx_sandbox_t *s, const char *what, const char *path, int fd, bool upload,
                       uint64_t size, progress_t *prog, sbx_error_t *err)
{
    unsigned k = s->c->ranges;
    range_t g[16];
    pthread_t th[16];
    bool started[16] = { false };
    uint64_t per = (size + k - 1) / k;
    for (unsigned i = 0; i < k; i++) {
        uint64_t off = per * i;
        g[i] = (range_t){ .s = s,
                          .path = path,
                          .fd = fd,
                          .upload = upload,
                          .off = off,
                          .len = off >= size ? 0 : MIN(per, size - off),
                          .prog = prog };
        if (g[i].len == 0)
            continue;
        started[i] = pthread_create(&th[i], NULL, range_run, &g[i]) == 0;
        if (!started[i])
            g[i].r = -EAGAIN;
    }
    int r = 0;
    for (unsigned i = 0; i < k; i++) {
        if (started[i])
            (void)pthread_join(th[i], NULL);
        if (r == 0 && g[i].r < 0) {
            char w[600];
            (void)snprintf(w, sizeof w, "%s %s:%s (bytes %llu..%llu)", what, s->display, path,
                           (unsigned long long)g[i].off, (unsigned long long)(g[i].off + g[i].len));
            if (g[i].status)
                r = api_status_error(w, g[i].status, g[i].body, g[i].body ? strlen(g[i].body) : 0,
                                     err);
            else
                r = err_set(err, g[i].r, 0, "%s: %s", w,
                            g[i].err.msg[0] ? g[i].err.msg : strerror(-g[i].r));
        }
        free(g[i].body);
    }
    return r;
}

int sbx_file_upload(sbx_sandbox_t *s, const char *local_path, const char *path,
                    sbx_transfer_fn progress, void *userdata, sbx_error_t *err)
{
    _cleanup_close_ int fd = open(local_path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0)
        return err_set(err, negative_errno(), 0, "upload: cannot open %s: %s", local_path,
                       strerror(errno));
    if (!S_ISREG(st.st_mode))
        return err_set(err, -EINVAL, 0, "upload: %s is not a regular file", local_path);
    uint64_t size = (uint64_t)st.st_size;
    bool ranged = s->c->ranges > 1 && size >= s->c->range_threshold;
    char mode[32];
    (void)snprintf(mode, sizeof mode, "&mkdir=true&mode=%o", (unsigned)(st.st_mode & 0777));
    _cleanup_free_ char *t = file_route(s, "write", path, mode);
    if (!t)
        return err_set(err, -ENOMEM, 0, "out of memory");
    progress_t prog = {
        .lock = PTHREAD_MUTEX_INITIALIZER, .total = size, .fn = progress, .ud = userdata
    };
    /* ranged: the file is made (parents, mode, truncated) first, then written at offsets */
    http_req_t rq = { .method = "PUT",
                      .target = t,
                      .content_type = "application/octet-stream",
                      .body_fd = fd,
                      .body_fd_len = ranged ? 0 : size,
                      .progress = progress_add,
                      .progress_ud = &prog };
    http_resp_t resp;
    int r = file_call(s, "upload to", path, &rq, &resp, err);
    if (r < 0)
        return r;
    http_resp_free(&resp);
    if (ranged)
        r = move_ranges(s, "upload to", path, fd, true, size, &prog, err);
    return r;
}

int sbx_file_download(sbx_sandbox_t *s, const char *path, const char *local_path,
                      sbx_transfer_fn progress, void *userdata, sbx_error_t *err)
{
    uint64_t size = 0;
    bool ranged = false;
    if (s->c->ranges > 1) {
        sbx_file_info_t st;
        int r = sbx_file_stat(s, path, &st, err);
        if (r < 0)
            return r;
        size = st.size;
        ranged = strcmp(st.type, "file") == 0 && size >= s->c->range_threshold;
        sbx_file_info_clear(&st);
    }
    _cleanup_free_ char *t = file_route(s, "read", path, NULL);
    _cleanup_free_ char *tmp = strprintf("%s.sbx-part-XXXXXX", local_path);
    if (!t || !tmp)
        return err_set(err, -ENOMEM, 0, "out of memory");
    /* into a temporary file beside the target, renamed over it once complete */
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0)
        return err_set(err, negative_errno(), 0, "download: cannot create a file beside %s: %s",
                       local_path, strerror(errno));
    progress_t prog = { .lock = PTHREAD_MUTEX_INITIALIZER,
                        .total = ranged ? size : UINT64_MAX,
                        .fn = progress,
                        .ud = userdata };
    int r;
    if (ranged) {
        r = ftruncate(fd, (off_t)size) < 0
                ? err_set(err, negative_errno(), 0, "download: cannot size %s: %s", tmp,
                          strerror(errno))
                : move_ranges(s, "download", path, fd, false, size, &prog, err);
    } else {
        fd_sink_t fs = { .fd = fd };
        http_req_t rq = { .method = "GET",
                          .target = t,
                          .body_fd = -1,
                          .sink = fd_sink,
                          .sink_ud = &fs,
                          .progress = progress_add,
                          .progress_ud = &prog };
        http_resp_t resp = { 0 };
        r = file_call(s, "download", path, &rq, &resp, err);
        if (r >= 0 && resp.content_length != UINT64_MAX)
            prog.total = resp.content_length;
        http_resp_free(&resp);
        if (fs.failed)
            r = err_set(err, fs.failed, 0, "download: cannot write %s: %s", local_path,
                        strerror(-fs.failed));
    }
    if (r >= 0 && fsync(fd) < 0)
        r = err_set(err, negative_errno(), 0, "download: cannot write %s: %s", local_path,
                    strerror(errno));
    (void)close(fd);
    if (r >= 0 && rename(tmp, local_path) < 0)
        r = err_set(err, negative_errno(), 0, "download: cannot rename to %s: %s", local_path,
                    strerror(errno));
    if (r < 0)
        (void)unlink(tmp);
    return r;
}

static int info_from_json(json_t *j, sbx_file_info_t *f)
{
    memset(f, 0, sizeof *f);
    const char *name = json_string_value(json_object_get(j, "name"));
    const char *path = json_string_value(json_object_get(j, "path"));
    const char *type = json_string_value(json_object_get(j, "type"));
    const char *mode = json_string_value(json_object_get(j, "mode"));
    if (!name || !path || !type)
        return -EPROTO;
    f->name = strdup(name);
    f->path = strdup(path);
    (void)snprintf(f->type, sizeof f->type, "%s", type);
    f->size = (uint64_t)json_integer_value(json_object_get(j, "size"));
    f->mtime_ms = json_integer_value(json_object_get(j, "mtime_ms"));
    uint32_t m = 0;
    for (size_t i = 0; mode && mode[i] >= '0' && mode[i] <= '7' && i < 8; i++)
        m = m * 8 + (uint32_t)(mode[i] - '0');
    f->mode = m;
    if (!f->name || !f->path) {
        sbx_file_info_clear(f);
        return -ENOMEM;
    }
    return 0;
}

void sbx_file_info_clear(sbx_file_info_t *f)
{
    free(f->name);
    free(f->path);
    f->name = f->path = NULL;
}

void sbx_file_list_free(sbx_file_info_t *list, size_t n)
{
    for (size_t i = 0; list && i < n; i++)
        sbx_file_info_clear(&list[i]);
    free(list);
}

int sbx_file_stat(sbx_sandbox_t *s, const char *path, sbx_file_info_t *ret, sbx_error_t *err)
{
    _cleanup_json_ json_t *j = NULL;
    int r = file_json(s, "stat", "GET", "stat", path, NULL, &j, err);
    if (r < 0)
        return r;
    sbx_file_info_t f;
    if (info_from_json(j, &f) < 0)
        return err_set(err, -EPROTO, 0, "stat %s: a malformed answer", path);
    *ret = f;
    return 0;
}

int sbx_file_list(sbx_sandbox_t *s, const char *path, sbx_file_info_t **ret, size_t *ret_n,
                  sbx_error_t *err)
{
    sbx_file_info_t *list = NULL;
    size_t n = 0, cap = 0;
    _cleanup_free_ char *after = NULL;
    int r = 0;
    for (unsigned page = 0; page < 100000; page++) {
        _cleanup_free_ char *ea = after ? url_escape(after) : NULL;
        _cleanup_free_ char *more =
            strprintf("&limit=%d%s%s", LIST_PAGE, ea ? "&after=" : "", ea ? ea : "");
        if (!more) {
            r = err_set(err, -ENOMEM, 0, "out of memory");
            break;
        }
        _cleanup_json_ json_t *j = NULL;
        r = file_json(s, "list", "GET", "list", path, more, &j, err);
        if (r < 0)
            break;
        json_t *entries = json_object_get(j, "entries");
        size_t k;
        json_t *e;
        json_array_foreach(entries, k, e) {
            if (n == cap) {
                size_t nc = cap ? cap * 2 : 64;
                sbx_file_info_t *nl = realloc(list, nc * sizeof *nl);
                if (!nl) {
                    r = err_set(err, -ENOMEM, 0, "out of memory");
                    break;
                }
                list = nl;
                cap = nc;
            }
            if (info_from_json(e, &list[n]) < 0) {
                r = err_set(err, -EPROTO, 0, "list %s: a malformed entry", path);
                break;
            }
            n++;
        }
        if (r < 0)
            break;
        const char *next = json_string_value(json_object_get(j, "next"));
        if (!json_is_true(json_object_get(j, "truncated")) || !next)
            break;
        free(after);
        after = strdup(next);
        if (!after) {
            r = err_set(err, -ENOMEM, 0, "out of memory");
            break;
        }
    }
    if (r < 0) {
        sbx_file_list_free(list, n);
        return r;
    }
    if (!list)
        list = calloc(1, sizeof *list);
    if (!list)
        return err_set(err, -ENOMEM, 0, "out of memory");
    *ret = list;
    *ret_n = n;
    return (int)MIN(n, (size_t)INT32_MAX);
}

int sbx_file_mkdir(sbx_sandbox_t *s, const char *path, sbx_error_t *err)
{
    return file_json(s, "mkdir", "POST", "mkdir", path, NULL, NULL, err);
}

int sbx_file_delete(sbx_sandbox_t *s, const char *path, bool recursive, sbx_error_t *err)
{
    return file_json(s, "delete", "DELETE", "delete", path, recursive ? "&recursive=true" : NULL,
                     NULL, err);
}

int sbx_file_rename(sbx_sandbox_t *s, const char *from, const char *to, bool overwrite,
                    sbx_error_t *err)
{
    _cleanup_json_ json_t *b =
        json_pack("{s:s,s:s,s:b}", "from", from, "to", to, "overwrite", overwrite);
    _cleanup_free_ char *t = sandbox_route(s, "/files/rename");
    _cleanup_free_ char *text = b ? json_dumps(b, JSON_COMPACT) : NULL;
    if (!t || !text)
        return err_set(err, -ENOMEM, 0, "out of memory");
    http_req_t rq = { .method = "POST",
                      .target = t,
                      .content_type = "application/json",
                      .body = text,
                      .body_len = strlen(text),
                      .body_fd = -1 };
    http_resp_t resp;
    int r = file_call(s, "rename", from, &rq, &resp, err);
    if (r >= 0)
        http_resp_free(&resp);
    return r;
}
