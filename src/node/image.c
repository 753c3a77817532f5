/* SPDX-License-Identifier: MIT */
/* OCI image layouts: verify, then unpack once into a cache keyed by the manifest digest
 * (image.h says what is checked and what is refused).
 *
 * The unpacker is libarchive's archive_write_disk, run in a child process that is chroot()ed
 * into the new rootfs, rather than `umoci raw unpack` as a helper. Reasons: we already verify
 * every byte ourselves (umoci would verify again, and bring a Go toolchain's binary into the
 * node's trust base); we refuse ".." and absolute paths (and so do libarchive's
 * ARCHIVE_EXTRACT_SECURE_{NODOTDOT,NOABSOLUTEPATHS}), devices and ids above 65535 ourselves, and
 * the chroot into the new rootfs makes every path and link resolve inside it, symlinks
 * included; the child's cwd and root change nothing in the node's threads.
 * We decompress gzip ourselves (zlib) so that the config's diff_ids, the digests of the
 * uncompressed layers, are checked too, and the unpacked size is capped while we go. */
#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <zlib.h>

#include "common/macro.h"
#include "common/strutil.h"
#include "image.h"

#define MT_INDEX "application/vnd.oci.image.index.v1+json"
#define MT_MANIFEST "application/vnd.oci.image.manifest.v1+json"
#define MT_CONFIG "application/vnd.oci.image.config.v1+json"
#define MT_LAYER_TAR "application/vnd.oci.image.layer.v1.tar"
#define MT_LAYER_GZIP "application/vnd.oci.image.layer.v1.tar+gzip"
#define REF_NAME "org.opencontainers.image.ref.name"
#define JSON_BLOB_MAX (4 << 20) /* index, manifest, config */
#define ROOTFS_DIR ".rootfs"
#define IO_CHUNK (128 * 1024)

#if defined(__x86_64__)
#define HOST_ARCH "amd64"
#elif defined(__aarch64__)
#define HOST_ARCH "arm64"
#else
#error "unknown architecture: name it as OCI configs do"
#endif

typedef struct {
    char digest[IMAGE_DIGEST_MAX];
    uint64_t size;
    bool gzip;
} desc_t;

typedef struct {
    const char *name;
    sbx_err_t *err;
} ctx_t;

_printf_(3, 4) static int fail(const ctx_t *c, int r, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    (void)vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return sbx_err(c->err, r, "image %s: %s", c->name, msg);
}

static bool digest_valid(const char *d)
{
    if (strlen(d) != 71 || memcmp(d, "sha256:", 7) != 0)
        return false;
    for (size_t i = 7; i < 71; i++)
        if (!((d[i] >= '0' && d[i] <= '9') || (d[i] >= 'a' && d[i] <= 'f')))
            return false;
    return true;
}

static void digest_of(const crypto_hash_sha256_state *st_in, char out[IMAGE_DIGEST_MAX])
{
    crypto_hash_sha256_state st = *st_in;
    unsigned char h[crypto_hash_sha256_BYTES];
    crypto_hash_sha256_final(&st, h);
    memcpy(out, "sha256:", 7);
    sodium_bin2hex(out + 7, IMAGE_DIGEST_MAX - 7, h, sizeof h);
}

/* A descriptor {mediaType, digest, size}; mediaType must be one of `allowed` (NULL-ended). */
static int parse_desc(const ctx_t *c, json_t *j, const char *what, const char *const *allowed,
                      desc_t *ret, const char **ret_mt)
{
    const char *mt, *dg;
    json_int_t size;
    if (json_unpack(j, "{s:s,s:s,s:I}", "mediaType", &mt, "digest", &dg, "size", &size) < 0)
        return fail(c, -EINVAL, "malformed layout: %s: expected {mediaType, digest, size}", what);
    if (!digest_valid(dg))
        return fail(c, -EINVAL, "malformed layout: %s: digest \"%.80s\" is not sha256:<64 hex>",
                    what, dg);
    if (size < 0 || (size > JSON_BLOB_MAX && !ret_mt))
        return fail(c, -EINVAL, "malformed layout: %s: size %lld out of range", what,
                    (long long)size);
    size_t i;
    for (i = 0; allowed[i]; i++)
        if (streq(mt, allowed[i]))
            break;
    if (!allowed[i])
        return fail(c, -EINVAL, "unsupported %s media type \"%.100s\"", what, mt);
    memcpy(ret->digest, dg, 72);
    ret->size = (uint64_t)size;
    ret->gzip = streq(mt, MT_LAYER_GZIP);
    if (ret_mt)
        *ret_mt = mt;
    return 0;
}

static int open_blob(const ctx_t *c, int blobs_fd, const desc_t *d, int *ret_fd)
{
    int fd = openat(blobs_fd, d->digest + 7, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0)
        return fail(c, errno == ENOENT ? -EINVAL : negative_errno(),
                    "malformed layout: blob %s: %s", d->digest, strerror(errno));
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        safe_close(fd);
        return fail(c, -EINVAL, "malformed layout: blob %s is not a regular file", d->digest);
    }
    if ((uint64_t)st.st_size != d->size) {
        safe_close(fd);
        return fail(c, -EBADMSG, "blob %s: size %lld, its descriptor says %llu", d->digest,
                    (long long)st.st_size, (unsigned long long)d->size);
    }
    *ret_fd = fd;
    return 0;
}

/* Hash the whole of fd (from offset 0) and compare with d; keep the bytes when ret_buf. */
static int check_blob(const ctx_t *c, int fd, const desc_t *d, char **ret_buf)
{
    crypto_hash_sha256_state st;
    _cleanup_free_ char *all = ret_buf ? malloc(d->size + 1) : NULL;
    _cleanup_free_ unsigned char *chunk = ret_buf ? NULL : malloc(IO_CHUNK);
    uint64_t off = 0;
    char got[IMAGE_DIGEST_MAX];
    if (ret_buf ? !all : !chunk)
        return -ENOMEM;
    crypto_hash_sha256_init(&st);
    for (;;) {
        unsigned char *p = all ? (unsigned char *)all + off : chunk;
        size_t want = all ? (size_t)(d->size - off) : IO_CHUNK;
        if (all && want == 0)
            want = 1; /* read once more: EOF expected */
        ssize_t k = pread(fd, p, want, (off_t)off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return fail(c, negative_errno(), "blob %s: %s", d->digest, strerror(errno));
        if (k == 0)
            break;
        if (off + (uint64_t)k > d->size)
            return fail(c, -EBADMSG, "blob %s grew while read", d->digest);
        crypto_hash_sha256_update(&st, p, (size_t)k);
        off += (uint64_t)k;
    }
    digest_of(&st, got);
    if (off != d->size || !streq(got, d->digest))
        return fail(c, -EBADMSG, "blob %s does not match its digest (content is %s)", d->digest,
                    got);
    if (ret_buf) {
        all[off] = 0;
        *ret_buf = TAKE_PTR(all);
    }
    return 0;
}

static int load_json_blob(const ctx_t *c, int blobs_fd, const desc_t *d, const char *what,
                          json_t **ret)
{
    _cleanup_close_ int fd = -EBADF;
    _cleanup_free_ char *buf = NULL;
    int r = open_blob(c, blobs_fd, d, &fd);
    if (r < 0 || (r = check_blob(c, fd, d, &buf)) < 0)
        return r;
    json_error_t je;
    json_t *j = json_loadb(buf, d->size, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(j)) {
        json_decref(j);
        return fail(c, -EINVAL, "malformed layout: %s %s is not a JSON object", what, d->digest);
    }
    *ret = j;
    return 0;
}

/* A small file of the layout (oci-layout, index.json), at most JSON_BLOB_MAX. */
static int load_json_file(const ctx_t *c, int dfd, const char *file, json_t **ret)
{
    _cleanup_close_ int fd = openat(dfd, file, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0)
        return fail(c, -EINVAL, "malformed layout: %s: %s", file, strerror(errno));
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size > JSON_BLOB_MAX)
        return fail(c, -EINVAL, "malformed layout: %s is not a regular file of at most %d bytes",
                    file, JSON_BLOB_MAX);
    _cleanup_free_ char *buf = malloc((size_t)st.st_size + 1);
    size_t n = 0;
    if (!buf)
        return -ENOMEM;
    while (n < (size_t)st.st_size) {
        ssize_t k = read(fd, buf + n, (size_t)st.st_size - n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return fail(c, -EINVAL, "malformed layout: %s: short read", file);
        n += (size_t)k;
    }
    json_t *j = json_loadb(buf, n, JSON_REJECT_DUPLICATES, NULL);
    if (!json_is_object(j)) {
        json_decref(j);
        return fail(c, -EINVAL, "malformed layout: %s is not a JSON object", file);
    }
    *ret = j;
    return 0;
}

static int check_schema(const ctx_t *c, json_t *j, const char *what, const char *mt)
{
    json_t *sv = json_object_get(j, "schemaVersion"), *m = json_object_get(j, "mediaType");
    if (!json_is_integer(sv) || json_integer_value(sv) != 2)
        return fail(c, -EINVAL, "malformed layout: %s: schemaVersion must be 2", what);
    if (m && (!json_is_string(m) || !streq(json_string_value(m), mt)))
        return fail(c, -EINVAL, "malformed layout: %s: mediaType must be %s", what, mt);
    return 0;
}

/* index.json -> the manifest descriptor named c->name (or the only one, unnamed). */
static int pick_manifest(const ctx_t *c, int dfd, desc_t *ret)
{
    json_t *layout = NULL, *index = NULL;
    int r = load_json_file(c, dfd, "oci-layout", &layout);
    if (r < 0)
        return r;
    const char *ver = json_string_value(json_object_get(layout, "imageLayoutVersion"));
    bool ok = ver && streq(ver, "1.0.0");
    json_decref(layout);
    if (!ok)
        return fail(c, -EINVAL, "malformed layout: oci-layout: imageLayoutVersion must be 1.0.0");
    if ((r = load_json_file(c, dfd, "index.json", &index)) < 0 ||
        (r = check_schema(c, index, "index.json", MT_INDEX)) < 0) {
        json_decref(index);
        return r;
    }
    json_t *ms = json_object_get(index, "manifests"), *m, *chosen = NULL;
    size_t i, unnamed = 0;
    if (!json_is_array(ms) || json_array_size(ms) == 0) {
        json_decref(index);
        return fail(c, -EINVAL, "malformed layout: index.json has no manifests");
    }
    json_array_foreach(ms, i, m) {
        const char *ref =
            json_string_value(json_object_get(json_object_get(m, "annotations"), REF_NAME));
        if (ref && streq(ref, c->name)) {
            if (chosen) {
                json_decref(index);
                return fail(c, -EINVAL, "malformed layout: index.json names two manifests %s",
                            c->name);
            }
            chosen = m;
        }
        unnamed += !ref;
    }
    if (!chosen && json_array_size(ms) == 1 && unnamed == 1)
        chosen = json_array_get(ms, 0);
    if (!chosen) {
        json_decref(index);
        return fail(c, -EINVAL, "malformed layout: index.json has no manifest named %s (%s)",
                    c->name, REF_NAME);
    }
    static const char *const mts[] = { MT_MANIFEST, NULL };
    r = parse_desc(c, chosen, "manifest", mts, ret, NULL);
    json_decref(index);
    return r;
}

typedef struct {
    desc_t manifest, config;
    desc_t layers[IMAGE_LAYERS_MAX];
    char diff_ids[IMAGE_LAYERS_MAX][IMAGE_DIGEST_MAX];
    size_t n_layers;
} chain_t;

static int parse_config(const ctx_t *c, json_t *cfg, chain_t *ch)
{
    const char *os, *arch, *type;
    json_t *ids, *v;
    size_t i;
    if (json_unpack(cfg, "{s:s,s:s,s:{s:s,s:o}}", "os", &os, "architecture", &arch, "rootfs",
                    "type", &type, "diff_ids", &ids) < 0 ||
        !streq(type, "layers") || !json_is_array(ids))
        return fail(c, -EINVAL,
                    "malformed layout: config: expected {os, architecture, rootfs: {type: "
                    "\"layers\", diff_ids}}");
    if (!streq(os, "linux") || !streq(arch, HOST_ARCH))
        return fail(c, -EINVAL, "the image is for %.32s/%.32s; this node runs linux/%s", os, arch,
                    HOST_ARCH);
    if (json_array_size(ids) != ch->n_layers)
        return fail(c, -EINVAL, "malformed layout: config has %zu diff_ids for %zu layers",
                    json_array_size(ids), ch->n_layers);
    json_array_foreach(ids, i, v) {
        const char *s = json_string_value(v);
        if (!s || !digest_valid(s))
            return fail(c, -EINVAL, "malformed layout: config: diff_ids[%zu] is not sha256", i);
        memcpy(ch->diff_ids[i], s, 72);
    }
    return 0;
}

/* manifest -> config and layers, all verified but the layers' contents. */
static int load_chain(const ctx_t *c, int dfd, int blobs_fd, chain_t *ch)
{
    json_t *man = NULL, *cfg = NULL, *layers, *l;
    size_t i;
    int r = pick_manifest(c, dfd, &ch->manifest);
    if (r < 0 || (r = load_json_blob(c, blobs_fd, &ch->manifest, "manifest", &man)) < 0 ||
        (r = check_schema(c, man, "manifest", MT_MANIFEST)) < 0)
        goto out;
    static const char *const cmts[] = { MT_CONFIG, NULL };
    static const char *const lmts[] = { MT_LAYER_TAR, MT_LAYER_GZIP, NULL };
    if ((r = parse_desc(c, json_object_get(man, "config"), "config", cmts, &ch->config, NULL)) < 0)
        goto out;
    layers = json_object_get(man, "layers");
    if (!json_is_array(layers) || json_array_size(layers) == 0 ||
        json_array_size(layers) > IMAGE_LAYERS_MAX) {
        r = fail(c, -EINVAL, "malformed layout: manifest: 1 to %d layers", IMAGE_LAYERS_MAX);
        goto out;
    }
    json_array_foreach(layers, i, l) {
        const char *mt;
        char what[32];
        (void)snprintf(what, sizeof what, "layer %zu", i);
        if ((r = parse_desc(c, l, what, lmts, &ch->layers[i], &mt)) < 0)
            goto out;
    }
    ch->n_layers = json_array_size(layers);
    if ((r = load_json_blob(c, blobs_fd, &ch->config, "config", &cfg)) < 0)
        goto out;
    r = parse_config(c, cfg, ch);
out:
    json_decref(man);
    json_decref(cfg);
    return r;
}

/* ---- removing trees by descriptor -------------------------------------------------------- */

static int remove_tree_at(int pfd, const char *name, unsigned depth);

static int empty_dir_fd(int fd, unsigned depth)
{
    int dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (dup_fd < 0)
        return negative_errno();
    DIR *d = fdopendir(dup_fd);
    if (!d) {
        safe_close(dup_fd);
        return -ENOMEM;
    }
    int r = 0;
    struct dirent *de;
    while (r == 0 && (de = readdir(d))) {
        if (streq(de->d_name, ".") || streq(de->d_name, ".."))
            continue;
        if (unlinkat(dirfd(d), de->d_name, 0) == 0 || errno == ENOENT)
            continue;
        r = errno == EISDIR ? remove_tree_at(dirfd(d), de->d_name, depth + 1) : negative_errno();
    }
    closedir(d);
    return r;
}

/* Remove pfd/name and below; symlinks are unlinked, never followed. */
static int remove_tree_at(int pfd, const char *name, unsigned depth)
{
    if (depth > 256)
        return -ELOOP;
    if (unlinkat(pfd, name, 0) == 0 || errno == ENOENT)
        return 0;
    if (errno != EISDIR)
        return negative_errno();
    _cleanup_close_ int fd = openat(pfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return negative_errno();
    int r = empty_dir_fd(fd, depth);
    if (r < 0)
        return r;
    return unlinkat(pfd, name, AT_REMOVEDIR) < 0 ? negative_errno() : 0;
}

/* ---- unpacking (in the chroot()ed child) -------------------------------------------------- */

typedef struct {
    int fd;
    bool gzip;
    z_stream z;
    bool z_live, z_end;
    unsigned char in[IO_CHUNK], out[IO_CHUNK];
    size_t in_len;
    crypto_hash_sha256_state diff; /* of the uncompressed tar */
    uint64_t total;                /* uncompressed bytes */
    char why[160];
} src_t;

/* The next uncompressed bytes of the layer: 0 at EOF. */
static ssize_t src_read(src_t *s, const void **ret)
{
    if (!s->gzip) {
        ssize_t k;
        do
            k = read(s->fd, s->out, sizeof s->out);
        while (k < 0 && errno == EINTR);
        if (k > 0) {
            crypto_hash_sha256_update(&s->diff, s->out, (size_t)k);
            s->total += (uint64_t)k;
        }
        *ret = s->out;
        return k;
    }
    for (;;) {
        if (s->z.avail_in == 0) {
            ssize_t k;
            do
                k = read(s->fd, s->in, sizeof s->in);
            while (k < 0 && errno == EINTR);
            if (k < 0)
                return -1;
            if (k == 0) {
                if (s->z_live) {
                    (void)snprintf(s->why, sizeof s->why, "gzip stream ends early");
                    return -1;
                }
                return 0; /* the end of the blob at the end of a member */
            }
            s->z.next_in = s->in;
            s->z.avail_in = (uInt)k;
        }
        if (s->z_end) { /* another gzip member follows (concatenated members are valid gzip) */
            if (inflateReset(&s->z) != Z_OK)
                return -1;
            s->z_end = false;
        }
        s->z_live = true;
        s->z.next_out = s->out;
        s->z.avail_out = sizeof s->out;
        int zr = inflate(&s->z, Z_NO_FLUSH);
        if (zr != Z_OK && zr != Z_STREAM_END && zr != Z_BUF_ERROR) {
            (void)snprintf(s->why, sizeof s->why, "gzip: %s", s->z.msg ? s->z.msg : "corrupt");
            return -1;
        }
        if (zr == Z_STREAM_END) {
            s->z_end = true;
            s->z_live = false;
        }
        size_t got = sizeof s->out - s->z.avail_out;
        if (got) {
            crypto_hash_sha256_update(&s->diff, s->out, got);
            s->total += got;
            *ret = s->out;
            return (ssize_t)got;
        }
        if (zr == Z_BUF_ERROR && s->z.avail_in != 0)
            return -1;
    }
}

static la_ssize_t arc_read(struct archive *a, void *p, const void **buf)
{
    src_t *s = p;
    ssize_t k = src_read(s, buf);
    if (k < 0) {
        archive_set_error(a, EIO, "%s", s->why[0] ? s->why : "read error");
        return -1;
    }
    return k;
}

typedef struct {
    char **v;
    size_t cap, n;
} pathset_t;

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static bool pathset_has(const pathset_t *ps, const char *p)
{
    if (!ps->cap)
        return false;
    for (size_t i = hash_str(p) & (ps->cap - 1);; i = (i + 1) & (ps->cap - 1)) {
        if (!ps->v[i])
            return false;
        if (streq(ps->v[i], p))
            return true;
    }
}

static int pathset_add(pathset_t *ps, const char *p)
{
    if (pathset_has(ps, p))
        return 0;
    if ((ps->n + 1) * 2 > ps->cap) {
        size_t ncap = ps->cap ? ps->cap * 2 : 1024;
        char **nv = calloc(ncap, sizeof *nv);
        if (!nv)
            return -ENOMEM;
        for (size_t i = 0; i < ps->cap; i++)
            if (ps->v[i]) {
                size_t j = hash_str(ps->v[i]) & (ncap - 1);
                while (nv[j])
                    j = (j + 1) & (ncap - 1);
                nv[j] = ps->v[i];
            }
        free(ps->v);
        ps->v = nv;
        ps->cap = ncap;
    }
    size_t j = hash_str(p) & (ps->cap - 1);
    while (ps->v[j])
        j = (j + 1) & (ps->cap - 1);
    if (!(ps->v[j] = strdup(p)))
        return -ENOMEM;
    ps->n++;
    return 0;
}

static void pathset_clear(pathset_t *ps)
{
    for (size_t i = 0; i < ps->cap; i++)
        free(ps->v[i]);
    free(ps->v);
    *ps = (pathset_t){ 0 };
}

/* A layer path as a clean relative path ("" for the root), or NULL: absolute, "..", empty
 * components are refused. Leading "./" is the usual tar spelling and is dropped. */
static const char *clean_path(const char *in, char *out, size_t cap)
{
    size_t n = 0;
    if (in[0] == '/')
        return NULL;
    for (const char *p = in; *p;) {
        const char *e = strchr(p, '/');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if ((len == 2 && p[0] == '.' && p[1] == '.'))
            return NULL;
        if (len > 0 && !(len == 1 && p[0] == '.')) {
            if (n + len + 2 > cap)
                return NULL;
            if (n)
                out[n++] = '/';
            memcpy(out + n, p, len);
            n += len;
        }
        p = e ? e + 1 : p + len;
    }
    out[n] = 0;
    return out;
}

typedef struct {
    struct archive *w;
    pathset_t layer; /* paths this layer wrote: its own whiteouts never hide them */
    uint64_t size, entries;
    char why[400];
} unpack_t;

_printf_(2, 3) static int refuse(unpack_t *u, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    (void)vsnprintf(u->why, sizeof u->why, fmt, ap);
    va_end(ap);
    return -EPERM;
}

/* An opaque directory (fd dfd, layer path dir): every entry a lower layer made goes; what this
 * layer wrote stays, and its directories are made opaque in turn (a lower file below them goes
 * too). */
static int opaque(unpack_t *u, int dfd, const char *dir, unsigned depth)
{
    char full[PATH_MAX];
    int r = 0;
    if (depth > 256)
        return refuse(u, "directories nest too deep");
    int dup_fd = fcntl(dfd, F_DUPFD_CLOEXEC, 3);
    DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
    struct dirent *de;
    if (!d) {
        safe_close(dup_fd);
        return -ENOMEM;
    }
    while (r == 0 && (de = readdir(d))) {
        if (streq(de->d_name, ".") || streq(de->d_name, ".."))
            continue;
        int n = snprintf(full, sizeof full, "%s%s%s", dir, dir[0] ? "/" : "", de->d_name);
        if (n < 0 || (size_t)n >= sizeof full)
            r = refuse(u, "path too long below \"%.200s\"", dir);
        else if (!pathset_has(&u->layer, full))
            r = remove_tree_at(dirfd(d), de->d_name, 0);
        else {
            int cfd = openat(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (cfd >= 0) {
                r = opaque(u, cfd, full, depth + 1);
                safe_close(cfd);
            }
        }
    }
    closedir(d);
    return r;
}

/* A whiteout in dir: ".wh..wh..opq" hides every lower entry of dir, ".wh.X" hides dir/X. The
 * chroot holds every path we touch inside the new rootfs; O_NOFOLLOW keeps removal to what
 * the layers made. */
static int whiteout(unpack_t *u, const char *dir, const char *base)
{
    _cleanup_close_ int dfd =
        open(dir[0] ? dir : ".", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    char full[PATH_MAX];
    if (dfd < 0)
        return errno == ENOENT ? 0 : refuse(u, "whiteout in \"%s\": %s", dir, strerror(errno));
    if (streq(base, ".wh..wh..opq"))
        return opaque(u, dfd, dir, 0);
    const char *victim = base + 4;
    if (!victim[0] || streq(victim, ".") || streq(victim, ".."))
        return refuse(u, "whiteout \"%s/%s\" names nothing", dir, base);
    int n = snprintf(full, sizeof full, "%s%s%s", dir, dir[0] ? "/" : "", victim);
    if (n < 0 || (size_t)n >= sizeof full)
        return refuse(u, "whiteout path too long in \"%.200s\"", dir);
    if (pathset_has(&u->layer, full))
        return 0; /* the same layer's file: whiteouts hide lower layers only */
    return remove_tree_at(dfd, victim, 0);
}

/* This layer wrote path: it and its parent directories are the layer's own. */
static int layer_wrote(unpack_t *u, char *path)
{
    for (char *p = path; (p = strchr(p, '/')); p++) {
        *p = 0;
        int r = pathset_add(&u->layer, path);
        *p = '/';
        if (r < 0)
            return r;
    }
    return pathset_add(&u->layer, path);
}

static int unpack_entry(unpack_t *u, struct archive *a, struct archive_entry *e)
{
    char path[PATH_MAX], target[PATH_MAX];
    const char *raw = archive_entry_pathname(e);
    if (!raw || !clean_path(raw, path, sizeof path))
        return refuse(u, "entry \"%.200s\": absolute path or \"..\"", raw ? raw : "(none)");
    if (++u->entries > IMAGE_ENTRIES_MAX)
        return refuse(u, "more than %d entries", IMAGE_ENTRIES_MAX);
    mode_t type = archive_entry_filetype(e);
    const char *hl = archive_entry_hardlink(e);
    if (type == AE_IFCHR || type == AE_IFBLK || type == AE_IFSOCK)
        return refuse(u, "entry \"%.200s\": device node or socket", path);
    if (archive_entry_uid(e) > 65535 || archive_entry_gid(e) > 65535)
        return refuse(u, "entry \"%.200s\": owner above 65535", path);
    if (hl && !clean_path(hl, target, sizeof target))
        return refuse(u, "entry \"%.200s\": hard link to an absolute path or \"..\"", path);
    if (!path[0]) /* the root directory itself: the rootfs is ours (root, 0755) */
        return archive_read_data_skip(a) == ARCHIVE_OK ? 0 : refuse(u, "read error");
    char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (strncmp(base, ".wh.", 4) == 0) {
        char dir[PATH_MAX];
        size_t dl = slash ? (size_t)(slash - path) : 0;
        memcpy(dir, path, dl);
        dir[dl] = 0;
        int r = whiteout(u, dir, base);
        return r < 0 ? r : (archive_read_data_skip(a) == ARCHIVE_OK ? 0 : refuse(u, "read"));
    }
    if (type == AE_IFREG && !hl) {
        int64_t sz = archive_entry_size(e);
        if (sz < 0 || __builtin_add_overflow(u->size, (uint64_t)sz, &u->size) ||
            u->size > IMAGE_UNPACK_MAX)
            return refuse(u, "unpacks to more than %llu bytes",
                          (unsigned long long)IMAGE_UNPACK_MAX);
    }
    archive_entry_set_pathname(e, path);
    if (hl)
        archive_entry_set_hardlink(e, target);
    if (layer_wrote(u, path) < 0)
        return -ENOMEM;
    if (archive_write_header(u->w, e) != ARCHIVE_OK)
        return refuse(u, "entry \"%.200s\": %s", path, archive_error_string(u->w));
    const void *buf;
    size_t len;
    la_int64_t off;
    int ar;
    while ((ar = archive_read_data_block(a, &buf, &len, &off)) == ARCHIVE_OK)
        if (archive_write_data_block(u->w, buf, len, off) != ARCHIVE_OK)
            return refuse(u, "entry \"%.200s\": %s", path, archive_error_string(u->w));
    if (ar != ARCHIVE_EOF)
        return refuse(u, "entry \"%.200s\": %s", path, archive_error_string(a));
    if (archive_write_finish_entry(u->w) != ARCHIVE_OK)
        return refuse(u, "entry \"%.200s\": %s", path, archive_error_string(u->w));
    return 0;
}

static int unpack_layer(unpack_t *u, int fd, const desc_t *d, const char *diff_id, size_t idx)
{
    src_t *s = calloc(1, sizeof *s);
    int r = 0;
    if (!s)
        return -ENOMEM;
    s->fd = fd;
    s->gzip = d->gzip;
    crypto_hash_sha256_init(&s->diff);
    if (s->gzip && inflateInit2(&s->z, 16 + MAX_WBITS) != Z_OK) {
        free(s);
        return -ENOMEM;
    }
    struct archive *a = archive_read_new();
    struct archive_entry *e;
    if (!a || archive_read_support_format_tar(a) != ARCHIVE_OK ||
        archive_read_open(a, s, NULL, arc_read, NULL) != ARCHIVE_OK) {
        r = refuse(u, "layer %zu: %s", idx, a ? archive_error_string(a) : "out of memory");
        goto out;
    }
    pathset_clear(&u->layer);
    int ar;
    while ((ar = archive_read_next_header(a, &e)) == ARCHIVE_OK)
        if ((r = unpack_entry(u, a, e)) < 0) {
            char tmp[sizeof u->why];
            memcpy(tmp, u->why, sizeof tmp);
            (void)snprintf(u->why, sizeof u->why, "layer %zu: %.360s", idx, tmp);
            goto out;
        }
    if (ar != ARCHIVE_EOF) {
        r = refuse(u, "layer %zu: not a tar archive (%s)", idx, archive_error_string(a));
        goto out;
    }
    const void *rest; /* the tar's trailing blocks count in the diff_id too */
    ssize_t k;
    while ((k = src_read(s, &rest)) > 0)
        ;
    char got[IMAGE_DIGEST_MAX];
    digest_of(&s->diff, got);
    if (k < 0)
        r = refuse(u, "layer %zu: %s", idx, s->why[0] ? s->why : "read error");
    else if (!streq(got, diff_id)) {
        (void)snprintf(u->why, sizeof u->why,
                       "layer %zu: uncompressed content %s does not match the config's diff_id %s",
                       idx, got, diff_id);
        r = -EBADMSG;
    }
out:
    if (a)
        archive_read_free(a);
    if (s->gzip)
        inflateEnd(&s->z);
    free(s);
    return r;
}

typedef struct {
    int error;
    uint64_t size;
    char why[400];
} unpack_result_t;

/* In the child: chroot into the new rootfs (cwd), then every layer in order. */
_noreturn_ static void unpack_child(int out_fd, const chain_t *ch, const int *fds)
{
    unpack_t u = { 0 };
    unpack_result_t res = { 0 };
    /* The chroot is the backstop for libarchive's own checks: a path or link that slipped past
     * them still resolves inside the new rootfs. No new privileges: nothing here execs. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0 ||
        prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 || chroot(".") < 0 || chdir("/") < 0) {
        res.error = negative_errno();
        (void)snprintf(res.why, sizeof res.why, "cannot enter the new rootfs: %s", strerror(errno));
        goto done;
    }
    umask(0);
    u.w = archive_write_disk_new();
    /* Numeric owners (no name lookup is installed), modes, times; no xattrs, ACLs or flags.
     * Not ARCHIVE_EXTRACT_SECURE_SYMLINKS: with it, libarchive either refuses a path through a
     * symlink or (with _UNLINK) replaces the symlink by a directory, and both break layers
     * over a merged-/usr base ("bin" -> "usr/bin"). Paths through symlinks are followed the
     * way other OCI unpackers do, within the image's root: the chroot is that root, so an
     * absolute or climbing link resolves inside the new rootfs, never on the host. A final
     * component that is a symlink is replaced, never written through. */
    const int opts = ARCHIVE_EXTRACT_SECURE_NODOTDOT | ARCHIVE_EXTRACT_SECURE_NOABSOLUTEPATHS |
                     ARCHIVE_EXTRACT_OWNER | ARCHIVE_EXTRACT_PERM | ARCHIVE_EXTRACT_TIME;
    if (!u.w || archive_write_disk_set_options(u.w, opts) != ARCHIVE_OK) {
        res.error = -ENOMEM;
        goto done;
    }
    for (size_t i = 0; i < ch->n_layers && res.error == 0; i++) {
        int r = unpack_layer(&u, fds[i], &ch->layers[i], ch->diff_ids[i], i);
        if (r < 0) {
            res.error = r;
            memcpy(res.why, u.why, sizeof res.why);
        }
    }
    if (res.error == 0 && archive_write_close(u.w) != ARCHIVE_OK) {
        res.error = -EIO;
        (void)snprintf(res.why, sizeof res.why, "%s", archive_error_string(u.w));
    }
    res.size = u.size;
done:
    (void)!write(out_fd, &res, sizeof res);
    _exit(0);
}

static int run_unpack(const ctx_t *c, int tmp_fd, const chain_t *ch, const int *fds,
                      uint64_t *ret_size)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0)
        return negative_errno();
    pid_t pid = fork();
    if (pid < 0) {
        int r = negative_errno();
        safe_close(p[0]);
        safe_close(p[1]);
        return r;
    }
    if (pid == 0) {
        safe_close(p[0]);
        if (fchdir(tmp_fd) < 0)
            _exit(127);
        unpack_child(p[1], ch, fds);
    }
    safe_close(p[1]);
    unpack_result_t res;
    size_t got = 0;
    while (got < sizeof res) {
        ssize_t k = read(p[0], (char *)&res + got, sizeof res - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    safe_close(p[0]);
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (got != sizeof res)
        return fail(c, -EIO, "the unpacking process died");
    res.why[sizeof res.why - 1] = 0;
    if (res.error < 0)
        return fail(c, res.error, "%s", res.why[0] ? res.why : strerror(-res.error));
    *ret_size = res.size;
    return 0;
}

/* ---- the cache ---------------------------------------------------------------------------- */

static int read_size_file(int dfd, uint64_t *ret)
{
    char b[32];
    _cleanup_close_ int fd = openat(dfd, "size", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return negative_errno();
    ssize_t k = read(fd, b, sizeof b - 1);
    if (k <= 0)
        return -EINVAL;
    while (k > 0 && b[k - 1] == '\n')
        k--;
    b[k] = 0;
    return parse_u64_str(b, UINT64_MAX, ret);
}

/* The unpacked entry for hex, if complete: <hex>/rootfs and <hex>/size. */
static bool cached(int cache_fd, const char *hex, uint64_t *ret_size)
{
    _cleanup_close_ int fd = openat(cache_fd, hex, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    return fd >= 0 && fstatat(fd, "rootfs", &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode) &&
           read_size_file(fd, ret_size) == 0;
}

/* Under the cache lock: leftovers of an unpack that died are removed. */
static void clean_stale(int cache_fd)
{
    int dfd = fcntl(cache_fd, F_DUPFD_CLOEXEC, 3);
    DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
    struct dirent *de;
    if (!d) {
        safe_close(dfd);
        return;
    }
    while ((de = readdir(d)))
        if (strncmp(de->d_name, ".tmp-", 5) == 0)
            (void)remove_tree_at(cache_fd, de->d_name, 0);
    closedir(d);
}

static int unpack_into_cache(const ctx_t *c, int cache_fd, const chain_t *ch, const int *fds,
                             const char *hex, uint64_t *ret_size)
{
    char tmp[32];
    int r;
    clean_stale(cache_fd);
    for (int i = 0;; i++) {
        unsigned char rnd[6];
        char h[13];
        randombytes_buf(rnd, sizeof rnd);
        sodium_bin2hex(h, sizeof h, rnd, sizeof rnd);
        (void)snprintf(tmp, sizeof tmp, ".tmp-%s", h);
        if (mkdirat(cache_fd, tmp, 0700) == 0)
            break;
        if (errno != EEXIST || i > 8)
            return fail(c, negative_errno(), "cannot make the rootfs: %s", strerror(errno));
    }
    _cleanup_close_ int tfd =
        openat(cache_fd, tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    _cleanup_close_ int rfd = -EBADF, sfd = -EBADF;
    if (tfd < 0 || mkdirat(tfd, "rootfs", 0755) < 0 ||
        (rfd = openat(tfd, "rootfs", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0) {
        r = fail(c, negative_errno(), "cannot make the rootfs: %s", strerror(errno));
        goto fail;
    }
    uint64_t size = 0;
    if ((r = run_unpack(c, rfd, ch, fds, &size)) < 0)
        goto fail;
    char sb[32];
    int n = snprintf(sb, sizeof sb, "%llu\n", (unsigned long long)size);
    sfd = openat(tfd, "size", O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (sfd < 0 || write(sfd, sb, (size_t)n) != n || fsync(sfd) < 0 || syncfs(tfd) < 0) {
        r = fail(c, sfd < 0 ? negative_errno() : -EIO, "cannot write the rootfs");
        goto fail;
    }
    /* atomic: a reader sees no <hex> or a whole one */
    if (renameat(cache_fd, tmp, cache_fd, hex) < 0) {
        r = fail(c, negative_errno(), "cannot put the rootfs in place: %s", strerror(errno));
        goto fail;
    }
    *ret_size = size;
    return 0;
fail:
    (void)remove_tree_at(cache_fd, tmp, 0);
    return r;
}

static void close_all(int *fds, size_t n)
{
    for (size_t i = 0; i < n; i++)
        fds[i] = safe_close(fds[i]);
}

static int resolve_layers(const ctx_t *c, int blobs_fd, int cache_fd, const chain_t *ch,
                          unsigned flags, uint64_t *ret_size)
{
    const char *hex = ch->manifest.digest + 7;
    int fds[IMAGE_LAYERS_MAX];
    int r = 0;
    if (!(flags & IMAGE_VERIFY_ALL) && cached(cache_fd, hex, ret_size))
        return 0;
    /* one unpacker at a time (this process's threads and other processes) */
    _cleanup_close_ int lock =
        openat(cache_fd, ".lock", O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (lock < 0 || flock(lock, LOCK_EX) < 0)
        return fail(c, negative_errno(), "cannot lock the rootfs cache: %s", strerror(errno));
    size_t n = 0;
    for (; n < ch->n_layers; n++) {
        if ((r = open_blob(c, blobs_fd, &ch->layers[n], &fds[n])) < 0)
            break;
        /* verified before a byte is unpacked; the same descriptor is then unpacked */
        if ((r = check_blob(c, fds[n], &ch->layers[n], NULL)) < 0) {
            n++;
            break;
        }
    }
    if (r == 0 && !cached(cache_fd, hex, ret_size))
        r = unpack_into_cache(c, cache_fd, ch, fds, hex, ret_size);
    close_all(fds, n);
    return r;
}

int image_resolve(const char *images_dir, const char *name, unsigned flags, image_t *ret,
                  sbx_err_t *err)
{
    ctx_t c = { .name = name, .err = err };
    if (!image_name_valid(name))
        return fail(&c, -ENOENT, "not a valid image name ([a-z0-9][a-z0-9._-]*)");
    _cleanup_close_ int top = open(images_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (top < 0)
        return fail(&c, negative_errno(), "cannot open %s: %s", images_dir, strerror(errno));
    _cleanup_close_ int dfd = openat(top, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0 && (errno == ENOENT || errno == ENOTDIR || errno == ELOOP))
        return fail(&c, -ENOENT, "unknown image (no layout %s/%s)", images_dir, name);
    if (dfd < 0)
        return fail(&c, negative_errno(), "%s/%s: %s", images_dir, name, strerror(errno));
    _cleanup_close_ int blobs =
        openat(dfd, "blobs/sha256", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (blobs < 0)
        return fail(&c, -EINVAL, "malformed layout: no blobs/sha256 directory");
    _cleanup_free_ chain_t *ch = calloc(1, sizeof *ch);
    if (!ch)
        return -ENOMEM;
    int r = load_chain(&c, dfd, blobs, ch);
    if (r < 0)
        return r;
    /* .rootfs is 0700: the image's setuid files are never reachable by the host's users */
    if (mkdirat(top, ROOTFS_DIR, 0700) < 0 && errno != EEXIST)
        return fail(&c, negative_errno(), "cannot make %s/%s: %s", images_dir, ROOTFS_DIR,
                    strerror(errno));
    _cleanup_close_ int cache =
        openat(top, ROOTFS_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (cache < 0 || fchmod(cache, 0700) < 0)
        return fail(&c, -EIO, "cannot open %s/%s", images_dir, ROOTFS_DIR);
    uint64_t size = 0;
    if ((r = resolve_layers(&c, blobs, cache, ch, flags, &size)) < 0)
        return r;
    image_t img = { .size = size };
    memcpy(img.name, name, strlen(name) + 1);
    memcpy(img.digest, ch->manifest.digest, IMAGE_DIGEST_MAX);
    int n = snprintf(img.rootfs, sizeof img.rootfs, "%s/%s/%s/rootfs", images_dir, ROOTFS_DIR,
                     ch->manifest.digest + 7);
    if (n < 0 || (size_t)n >= sizeof img.rootfs)
        return fail(&c, -ENAMETOOLONG, "the rootfs path is too long");
    *ret = img;
    return 0;
}

int image_list(const char *images_dir, unsigned flags, image_entry_t **ret, size_t *ret_n)
{
    DIR *d = opendir(images_dir);
    if (!d)
        return negative_errno();
    image_entry_t *v = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    int r = 0;
    while ((de = readdir(d))) {
        if (!image_name_valid(de->d_name)) /* ".", "..", .rootfs, .build-*: not images */
            continue;
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 8;
            image_entry_t *nv = realloc(v, ncap * sizeof *nv);
            if (!nv) {
                r = -ENOMEM;
                break;
            }
            v = nv;
            cap = ncap;
        }
        image_entry_t *e = &v[n++];
        *e = (image_entry_t){ 0 };
        sbx_err_t err;
        e->error = image_resolve(images_dir, de->d_name, flags, &e->img, &err);
        if (e->error < 0)
            (void)snprintf(e->why, sizeof e->why, "%.*s", (int)sizeof e->why - 1, err.msg);
        memcpy(e->img.name, de->d_name, strlen(de->d_name) + 1);
        if (e->error >= 0)
            e->error = 0;
    }
    closedir(d);
    if (r < 0) {
        free(v);
        return r;
    }
    *ret = v;
    *ret_n = n;
    return 0;
}
