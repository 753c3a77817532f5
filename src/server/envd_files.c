/* SPDX-License-Identifier: MIT */
/* envd's /files: GET answers a file's bytes, POST writes one or more files from a
 * multipart/form-data body (parts named "file", the destination in each part's filename or
 * in ?path=) or from a raw application/octet-stream body (?path=, optionally gzip). Paths go
 * through fsops.c against the request's root, as /v1/files/... do; parents are created, and in
 * a pool sandbox what is created belongs to its uid. The body is collected (capped) before
 * anything is written. */
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <strings.h>
#include <zlib.h>

#include "envd.h"
#include "routes.h"

/* ---- errors: {"code": <status>, "message"} ----------------------------------------------- */

static void files_error(conn_t *c, int status, const char *fmt, ...) _printf_(3, 4);
static void files_error(conn_t *c, int status, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    (void)vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    json_t *j = json_pack("{s:i,s:s}", "code", status, "message", msg);
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    const char *text = s ? s : "{}";
    conn_respond(c, status, "application/json", text, strlen(text), NULL);
    free(s);
}

static int errno_status(int err)
{
    switch (-err) {
    case ENOENT: return HTTP_NOT_FOUND;
    case EACCES:
    case EPERM:
    case EROFS: return HTTP_FORBIDDEN;
    case ENOSPC:
    case EDQUOT: return HTTP_INSUFFICIENT_STORAGE;
    case ENOMEM:
    case EMFILE:
    case ENFILE: return HTTP_UNAVAILABLE;
    default: return HTTP_BAD_REQUEST;
    }
}

static int path_query(conn_t *c, char *out, size_t cap)
{
    int r = query_param(c, "path", out, cap);
    if (r < 0)
        files_error(c, HTTP_BAD_REQUEST, "path is not a valid encoded path (max %d bytes)",
                    FS_PATH_MAX - 1);
    return r;
}

/* ---- presigned URLs ---------------------------------------------------------------------- */

/* "v1_" + base64(sha256("<path>:<read|write>:<username>:<token>[:<expiration>]")) without
 * its '=' padding, as E2B's SDK signs downloadUrl()/uploadUrl(); an expiration (unix seconds)
 * in the past refuses. */
bool envd_files_signed(const conn_t *c, const char *token, uint64_t now_s)
{
    char path[FS_PATH_MAX] = "", user[256] = "", sig[128], exp[24];
    bool has_exp = false;
    uint64_t until = 0;
    if (query_param(c, "signature", sig, sizeof sig) <= 0 ||
        query_param(c, "path", path, sizeof path) < 0 ||
        query_param(c, "username", user, sizeof user) < 0)
        return false;
    int r = query_param(c, "signature_expiration", exp, sizeof exp);
    if (r < 0)
        return false;
    if (r > 0) {
        if (parse_u64_str(exp, UINT64_MAX, &until) < 0 || until < now_s)
            return false;
        has_exp = true;
    }
    const char *op =
        c->req.method.len == 4 && memcmp(c->req.method.p, "POST", 4) == 0 ? "write" : "read";
    crypto_hash_sha256_state st;
    unsigned char h[crypto_hash_sha256_BYTES];
    crypto_hash_sha256_init(&st);
    const char *parts[] = {
        path, ":", op, ":", user, ":", token, has_exp ? ":" : "", has_exp ? exp : ""
    };
    for (size_t i = 0; i < ELEMENTSOF(parts); i++)
        crypto_hash_sha256_update(&st, (const unsigned char *)parts[i], strlen(parts[i]));
    crypto_hash_sha256_final(&st, h);
    char want[3 +
              sodium_base64_ENCODED_LEN(crypto_hash_sha256_BYTES, sodium_base64_VARIANT_ORIGINAL)];
    memcpy(want, "v1_", 3);
    sodium_bin2base64(want + 3, sizeof want - 3, h, sizeof h, sodium_base64_VARIANT_ORIGINAL);
    size_t wl = strlen(want);
    while (wl > 3 && want[wl - 1] == '=')
        wl--;
    size_t sl = strlen(sig);
    return sl == wl && sodium_memcmp(sig, want, wl) == 0;
}

/* ---- GET --------------------------------------------------------------------------------- */

void envd_files_get(conn_t *c)
{
    char path[FS_PATH_MAX];
    int r = path_query(c, path, sizeof path);
    if (r < 0)
        return;
    if (r == 0 || path[0] == '\0') {
        files_error(c, HTTP_BAD_REQUEST, "the path query parameter is required");
        return;
    }
    fs_root_t root = files_root(c);
    struct stat st;
    int fd;
    r = fs_open_read(&root, path, &fd, &st);
    if (r == -EISDIR || r == -ENXIO) {
        files_error(c, HTTP_BAD_REQUEST, "%s is not a regular file", path);
        return;
    }
    if (r < 0) {
        files_error(c, errno_status(r), "%s: %s", path, strerror(-r));
        return;
    }
    conn_respond_file(c, fd, 0, (uint64_t)st.st_size);
}

/* ---- multipart/form-data ----------------------------------------------------------------- */

/* The boundary parameter of a Content-Type value (quoted or not), into out. */
int envd_multipart_boundary(sv_t ctype, char *out, size_t cap)
{
    static const char key[] = "boundary=";
    for (size_t i = 0; i + sizeof key - 1 <= ctype.len; i++) {
        if (strncasecmp(ctype.p + i, key, sizeof key - 1) != 0)
            continue;
        const char *v = ctype.p + i + sizeof key - 1;
        size_t n = ctype.len - (size_t)(v - ctype.p);
        bool quoted = n > 0 && v[0] == '"';
        if (quoted) {
            v++;
            n--;
        }
        size_t len = 0;
        while (len < n && (quoted ? v[len] != '"' : v[len] != ';' && v[len] != ' '))
            len++;
        if (len == 0 || len > 70 || len >= cap)
            return -EINVAL;
        memcpy(out, v, len);
        out[len] = '\0';
        return (int)len;
    }
    return -EINVAL;
}

/* One parameter (name="..." or filename="...") of a Content-Disposition value. */
static bool disposition_param(sv_t v, const char *key, char *out, size_t cap)
{
    size_t kl = strlen(key);
    for (size_t i = 0; i + kl + 2 <= v.len; i++) {
        if ((i > 0 && v.p[i - 1] != ' ' && v.p[i - 1] != ';') ||
            strncasecmp(v.p + i, key, kl) != 0 || v.p[i + kl] != '=')
            continue;
        const char *p = v.p + i + kl + 1, *end = v.p + v.len;
        size_t n = 0;
        if (p < end && *p == '"') {
            for (p++; p < end && *p != '"'; p++) {
                if (*p == '\\' && p + 1 < end)
                    p++;
                if (n + 1 >= cap)
                    return false;
                out[n++] = *p;
            }
            if (p >= end)
                return false;
        } else {
            for (; p < end && *p != ';' && *p != ' '; p++) {
                if (n + 1 >= cap)
                    return false;
                out[n++] = *p;
            }
        }
        out[n] = '\0';
        return true;
    }
    return false;
}

int envd_multipart_next(const char *body, size_t len, const char *boundary, size_t *pos,
                        envd_part_t *part)
{
    char delim[80];
    int dl = snprintf(delim, sizeof delim, "--%s", boundary);
    if (dl < 3 || (size_t)dl >= sizeof delim)
        return -EINVAL;
    size_t at = *pos;
    if (at == 0) { /* the first delimiter, after an optional preamble */
        const char *d = memmem(body, len, delim, (size_t)dl);
        if (!d)
            return -EINVAL;
        at = (size_t)(d - body);
    }
    if (len - at < (size_t)dl + 2 || memcmp(body + at, delim, (size_t)dl) != 0)
        return -EINVAL;
    at += (size_t)dl;
    if (memcmp(body + at, "--", 2) == 0)
        return 0; /* the close delimiter: no more parts */
    if (memcmp(body + at, "\r\n", 2) != 0)
        return -EINVAL;
    at += 2;
    const char *hend = memmem(body + at, len - at, "\r\n\r\n", 4);
    if (!hend)
        return -EINVAL;
    *part = (envd_part_t){ 0 };
    /* part headers: Content-Disposition is the one that matters */
    const char *h = body + at;
    while (h < hend + 2) {
        const char *eol = memmem(h, (size_t)(hend + 2 - h), "\r\n", 2);
        if (!eol)
            break;
        sv_t line = sv_make(h, (size_t)(eol - h));
        static const char cd[] = "content-disposition:";
        if (line.len > sizeof cd - 1 && strncasecmp(line.p, cd, sizeof cd - 1) == 0) {
            sv_t v = sv_make(line.p + sizeof cd - 1, line.len - (sizeof cd - 1));
            part->has_name = disposition_param(v, "name", part->name, sizeof part->name);
            part->has_filename =
                disposition_param(v, "filename", part->filename, sizeof part->filename);
        }
        h = eol + 2;
    }
    at = (size_t)(hend + 4 - body);
    /* the content ends at CRLF + delimiter */
    char tail[84];
    int tl = snprintf(tail, sizeof tail, "\r\n%s", delim);
    /* a delimiter is followed by CRLF or "--": "--XBmore" inside the content is content */
    const char *end = body + at;
    for (;;) {
        end = memmem(end, len - (size_t)(end - body), tail, (size_t)tl);
        if (!end)
            return -EINVAL;
        const char *after = end + tl;
        size_t left = len - (size_t)(after - body);
        if (left >= 2 && (memcmp(after, "\r\n", 2) == 0 || memcmp(after, "--", 2) == 0))
            break;
        end++;
    }
    part->data = body + at;
    part->len = (size_t)(end - (body + at));
    *pos = (size_t)(end - body) + 2;
    return 1;
}

/* ---- POST -------------------------------------------------------------------------------- */

static int write_file(conn_t *c, const char *path, const void *d, size_t n)
{
    fs_root_t root = files_root(c);
    fs_write_opts_t o = { .truncate = true, .mkdir = true, .create_mode = 0644, .dir_mode = 0755 };
    int fd;
    int r = fs_open_write(&root, path, &o, &fd);
    if (r < 0)
        return r;
    r = n ? fs_pwrite_all_as(fd, d, n, 0, root.uid) : 0;
    safe_close(fd);
    return r;
}

static json_t *written_json(const char *path)
{
    size_t len = strlen(path), start = len;
    while (start > 0 && path[start - 1] != '/')
        start--;
    return json_pack("{s:s,s:s,s:s}", "name", path + start, "type", "file", "path", path);
}

/* A gzip body, inflated into a new buffer of at most max bytes. */
static int gunzip(const char *p, size_t n, size_t max, char **ret, size_t *ret_len)
{
    z_stream z = { 0 };
    if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK)
        return -ENOMEM;
    size_t cap = MIN(max, MAX(n * 4, (size_t)65536)), len = 0;
    char *out = malloc(cap);
    int r = out ? 0 : -ENOMEM;
    z.next_in = (unsigned char *)p;
    z.avail_in = (uInt)n;
    while (r == 0) {
        if (len == cap) {
            if (cap >= max) {
                r = -EFBIG;
                break;
            }
            size_t ncap = MIN(max, cap * 2);
            char *nb = realloc(out, ncap);
            if (!nb) {
                r = -ENOMEM;
                break;
            }
            out = nb;
            cap = ncap;
        }
        z.next_out = (unsigned char *)out + len;
        z.avail_out = (uInt)MIN(cap - len, (size_t)UINT32_MAX);
        int zr = inflate(&z, Z_NO_FLUSH);
        len = cap - z.avail_out;
        if (zr == Z_STREAM_END)
            break;
        if (zr != Z_OK && !(zr == Z_BUF_ERROR && z.avail_out == 0))
            r = -EBADMSG;
    }
    inflateEnd(&z);
    if (r < 0) {
        free(out);
        return r;
    }
    *ret = out;
    *ret_len = len;
    return 0;
}

static void files_post_octet(conn_t *c, const char *path)
{
    const char *d = buf_head(&c->body);
    size_t n = c->body.len;
    char *inflated = NULL;
    sv_t enc;
    if (http_header_get(&c->req, "content-encoding", &enc) && !sv_eq_lit_nocase(enc, "identity")) {
        if (!sv_eq_lit_nocase(enc, "gzip")) {
            files_error(c, HTTP_NOT_ACCEPTABLE, "Content-Encoding must be gzip or identity");
            return;
        }
        int r = gunzip(d, n, ENVD_FILES_MAX, &inflated, &n);
        if (r < 0) {
            files_error(c, r == -EFBIG ? HTTP_CONTENT_TOO_LARGE : HTTP_BAD_REQUEST, "%s",
                        r == -EFBIG ? "the inflated body is too large" : "bad gzip body");
            return;
        }
        d = inflated;
    }
    int r = write_file(c, path, d, n);
    free(inflated);
    if (r < 0) {
        files_error(c, errno_status(r), "%s: %s", path, strerror(-r));
        return;
    }
    json_t *arr = json_array();
    json_array_append_new(arr, written_json(path));
    conn_respond_json(c, 200, arr);
}

static void files_post_multipart(conn_t *c, sv_t ctype, const char *qpath, bool has_qpath)
{
    char boundary[80];
    if (envd_multipart_boundary(ctype, boundary, sizeof boundary) < 0) {
        files_error(c, HTTP_BAD_REQUEST, "multipart/form-data needs a boundary");
        return;
    }
    const char *body = buf_head(&c->body);
    size_t len = c->body.len;
    /* count the parts first: ?path= names the destination of a single part */
    size_t pos = 0, nparts = 0;
    envd_part_t part;
    int r;
    while ((r = envd_multipart_next(body, len, boundary, &pos, &part)) > 0)
        nparts++;
    if (r < 0 || nparts == 0) {
        files_error(c, HTTP_BAD_REQUEST, "malformed multipart/form-data body");
        return;
    }
    json_t *arr = json_array();
    pos = 0;
    while (arr && envd_multipart_next(body, len, boundary, &pos, &part) > 0) {
        if (!part.has_name || !streq(part.name, "file"))
            continue;
        const char *path = has_qpath && nparts == 1 ? qpath : part.filename;
        if (!path[0]) {
            json_decref(arr);
            files_error(c, HTTP_BAD_REQUEST,
                        "a part names no destination (filename) and ?path= is absent");
            return;
        }
        r = write_file(c, path, part.data, part.len);
        if (r < 0) {
            json_decref(arr);
            files_error(c, errno_status(r), "%s: %s", path, strerror(-r));
            return;
        }
        json_array_append_new(arr, written_json(path));
    }
    if (!arr || json_array_size(arr) == 0) {
        json_decref(arr);
        files_error(c, HTTP_BAD_REQUEST, "no part named \"file\"");
        return;
    }
    conn_respond_json(c, 200, arr);
}

static void files_post_body(conn_t *c)
{
    char path[FS_PATH_MAX];
    int r = path_query(c, path, sizeof path);
    if (r < 0)
        return;
    bool has_path = r > 0 && path[0];
    sv_t ctype = SV("");
    (void)http_header_get(&c->req, "content-type", &ctype);
    static const char mp[] = "multipart/form-data";
    if (ctype.len >= sizeof mp - 1 && strncasecmp(ctype.p, mp, sizeof mp - 1) == 0) {
        files_post_multipart(c, ctype, path, has_path);
        return;
    }
    if (!has_path) {
        files_error(c, HTTP_BAD_REQUEST, "the path query parameter is required for a raw body");
        return;
    }
    files_post_octet(c, path);
}

void envd_files_post(conn_t *c) { conn_collect_body(c, ENVD_FILES_MAX, files_post_body); }
