/* SPDX-License-Identifier: MIT */
/* Image layouts (src/node/image.c): each test writes a small OCI layout itself (tar layers made
 * with libarchive, gzip with zlib, digests with libsodium) and resolves it. Needs root (the
 * unpacker chroot()s and keeps owners); prints a TAP skip otherwise. */
#define _XOPEN_SOURCE 700
#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <ftw.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "common/macro.h"
#include "node/image.h"
#include "node/node.h"
#include "tap.h"

static char g_dir[64];   /* the test's temporary directory */
static char g_imgs[128]; /* <g_dir>/images */

typedef struct {
    const char *path;
    char type;          /* 'f' file, 'd' dir, 'l' symlink, 'h' hard link, 'c' char device */
    const char *data;   /* file content, or link target */
    unsigned uid, mode; /* 0 mode: 0644 / 0755 */
} ent_t;

typedef struct {
    unsigned char *p;
    size_t n;
    char digest[IMAGE_DIGEST_MAX];  /* of the blob */
    char diff_id[IMAGE_DIGEST_MAX]; /* of the uncompressed tar */
    bool gzip;
} blob_t;

static void digest_hex(const void *p, size_t n, char out[IMAGE_DIGEST_MAX])
{
    unsigned char h[crypto_hash_sha256_BYTES];
    crypto_hash_sha256(h, p, n);
    memcpy(out, "sha256:", 7);
    sodium_bin2hex(out + 7, IMAGE_DIGEST_MAX - 7, h, sizeof h);
}

static size_t gzip_into(const unsigned char *in, size_t n, unsigned char *out, size_t cap)
{
    z_stream z = { 0 };
    deflateInit2(&z, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
    z.next_in = (unsigned char *)in;
    z.avail_in = (uInt)n;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    deflate(&z, Z_FINISH);
    size_t got = z.total_out;
    deflateEnd(&z);
    return got;
}

/* A tar (optionally gzip'd) of the entries, written by libarchive as given (no checks). */
static blob_t make_layer(const ent_t *e, size_t n, bool gz)
{
    blob_t b = { .gzip = gz };
    size_t cap = 1 << 20, used = 0;
    unsigned char *tar = calloc(1, cap);
    struct archive *a = archive_write_new();
    archive_write_set_format_pax_restricted(a);
    archive_write_set_bytes_in_last_block(a, 1);
    archive_write_open_memory(a, tar, cap, &used);
    for (size_t i = 0; i < n; i++) {
        struct archive_entry *en = archive_entry_new();
        archive_entry_set_pathname(en, e[i].path);
        archive_entry_set_uid(en, e[i].uid);
        archive_entry_set_gid(en, e[i].uid);
        archive_entry_set_mtime(en, 1700000000, 0);
        size_t len = 0;
        switch (e[i].type) {
        case 'f':
            archive_entry_set_filetype(en, AE_IFREG);
            archive_entry_set_perm(en, e[i].mode ? e[i].mode : 0644);
            len = strlen(e[i].data);
            archive_entry_set_size(en, (la_int64_t)len);
            break;
        case 'd':
            archive_entry_set_filetype(en, AE_IFDIR);
            archive_entry_set_perm(en, e[i].mode ? e[i].mode : 0755);
            break;
        case 'l':
            archive_entry_set_filetype(en, AE_IFLNK);
            archive_entry_set_perm(en, 0777);
            archive_entry_set_symlink(en, e[i].data);
            break;
        case 'h':
            archive_entry_set_filetype(en, AE_IFREG);
            archive_entry_set_perm(en, 0644);
            archive_entry_set_hardlink(en, e[i].data);
            break;
        case 'c':
            archive_entry_set_filetype(en, AE_IFCHR);
            archive_entry_set_perm(en, 0666);
            archive_entry_set_rdevmajor(en, 1);
            archive_entry_set_rdevminor(en, 3);
            break;
        }
        archive_write_header(a, en);
        if (len)
            archive_write_data(a, e[i].data, len);
        archive_entry_free(en);
    }
    archive_write_close(a);
    archive_write_free(a);
    digest_hex(tar, used, b.diff_id);
    if (!gz) {
        b.p = tar;
        b.n = used;
    } else {
        b.p = malloc(used + 1024);
        b.n = gzip_into(tar, used, b.p, used + 1024);
        free(tar);
    }
    digest_hex(b.p, b.n, b.digest);
    return b;
}

/* The layer as two concatenated gzip members (valid gzip; pigz and others write such). */
static void regzip_in_two(blob_t *b)
{
    size_t half = b->n / 2, cap = b->n + 2048;
    unsigned char *out = malloc(cap);
    size_t n = gzip_into(b->p, half, out, cap);
    n += gzip_into(b->p + half, b->n - half, out + n, cap - n);
    free(b->p);
    b->p = out;
    b->n = n;
    b->gzip = true;
    digest_hex(b->p, b->n, b->digest);
}

static void write_file(const char *path, const void *p, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || write(fd, p, n) != (ssize_t)n) {
        perror(path);
        exit(2);
    }
    close(fd);
}

static void put_blob(const char *layout, const void *p, size_t n, const char *digest)
{
    char path[512];
    (void)snprintf(path, sizeof path, "%s/blobs/sha256/%s", layout, digest + 7);
    write_file(path, p, n);
}

/* An OCI layout <images>/<name> of the layers; returns the manifest digest. Its blobs can be
 * found again with blob_path. */
static void make_image(const char *name, blob_t *layers, size_t n, char man_digest[72])
{
    char layout[256], path[512], cfg[8192], man[8192], idx[1024], ids[4096] = "", ls[4096] = "";
    (void)snprintf(layout, sizeof layout, "%s/%s", g_imgs, name);
    mkdir(g_imgs, 0755);
    mkdir(layout, 0755);
    (void)snprintf(path, sizeof path, "%s/blobs", layout);
    mkdir(path, 0755);
    (void)snprintf(path, sizeof path, "%s/blobs/sha256", layout);
    mkdir(path, 0755);
    for (size_t i = 0; i < n; i++) {
        put_blob(layout, layers[i].p, layers[i].n, layers[i].digest);
        size_t il = strlen(ids), ll = strlen(ls);
        (void)snprintf(ids + il, sizeof ids - il, "%s\"%s\"", i ? "," : "", layers[i].diff_id);
        (void)snprintf(ls + ll, sizeof ls - ll,
                       "%s{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar%s\","
                       "\"digest\":\"%s\",\"size\":%zu}",
                       i ? "," : "", layers[i].gzip ? "+gzip" : "", layers[i].digest, layers[i].n);
    }
    int cn = snprintf(cfg, sizeof cfg,
                      "{\"architecture\":\"amd64\",\"os\":\"linux\",\"config\":{},"
                      "\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[%s]}}",
                      ids);
    char cfg_d[72], man_d[72];
    digest_hex(cfg, (size_t)cn, cfg_d);
    put_blob(layout, cfg, (size_t)cn, cfg_d);
    int mn = snprintf(man, sizeof man,
                      "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest.v1+"
                      "json\",\"config\":{\"mediaType\":\"application/vnd.oci.image.config.v1+"
                      "json\",\"digest\":\"%s\",\"size\":%d},\"layers\":[%s]}",
                      cfg_d, cn, ls);
    digest_hex(man, (size_t)mn, man_d);
    put_blob(layout, man, (size_t)mn, man_d);
    int xn = snprintf(idx, sizeof idx,
                      "{\"schemaVersion\":2,\"manifests\":[{\"mediaType\":\"application/"
                      "vnd.oci.image.manifest.v1+json\",\"digest\":\"%s\",\"size\":%d,"
                      "\"annotations\":{\"org.opencontainers.image.ref.name\":\"%s\"}}]}",
                      man_d, mn, name);
    (void)snprintf(path, sizeof path, "%s/index.json", layout);
    write_file(path, idx, (size_t)xn);
    (void)snprintf(path, sizeof path, "%s/oci-layout", layout);
    write_file(path, "{\"imageLayoutVersion\":\"1.0.0\"}", 30);
    if (man_digest)
        memcpy(man_digest, man_d, 72);
}

static void blob_free(blob_t *b) { free(b->p); }

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *f)
{
    (void)st;
    (void)flag;
    (void)f;
    return remove(p) < 0 ? 0 : 0;
}

static bool exists(const char *p)
{
    struct stat st;
    return lstat(p, &st) == 0;
}

static int slurp(const char *path, char *out, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ssize_t k = read(fd, out, cap - 1);
    close(fd);
    if (k < 0)
        return -errno;
    out[k] = 0;
    return (int)k;
}

/* Flip one byte of a blob in place. */
static void corrupt(const char *name, const char *digest, size_t off)
{
    char path[512];
    (void)snprintf(path, sizeof path, "%s/%s/blobs/sha256/%s", g_imgs, name, digest + 7);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    unsigned char c;
    if (fd < 0 || pread(fd, &c, 1, (off_t)off) != 1)
        exit(2);
    c ^= 0x01;
    if (pwrite(fd, &c, 1, (off_t)off) != 1)
        exit(2);
    close(fd);
}

TEST(a_good_image_resolves_with_its_files_owners_and_size)
{
    sbx_err_t err = { 0 };
    const ent_t e[] = {
        { "./", 'd', NULL, 0, 0 },
        { "./etc/", 'd', NULL, 0, 0 },
        { "./etc/hello", 'f', "hello from the image\n", 0, 0 },
        { "./home/u/", 'd', NULL, 1000, 0700 },
        { "./home/u/note", 'f', "mine", 1000, 0600 },
        { "./usr/bin/", 'd', NULL, 0, 0 },
        { "./usr/bin/tool", 'f', "#!/bin/sh\n", 0, 04755 },
        { "./usr/bin/tool2", 'h', "./usr/bin/tool", 0, 0 },
        { "./bin", 'l', "usr/bin", 0, 0 },
    };
    blob_t l = make_layer(e, ELEMENTSOF(e), true);
    char md[72], buf[256], p[PATH_MAX + 64];
    make_image("good", &l, 1, md);
    image_t img;
    int r = image_resolve(g_imgs, "good", IMAGE_VERIFY_ALL, &img, &err);
    printf("# %s\n", err.msg);
    ASSERT_EQ(r, 0);
    ASSERT_STREQ(img.name, "good");
    ASSERT_STREQ(img.digest, md);
    char want[PATH_MAX];
    (void)snprintf(want, sizeof want, "%s/.rootfs/%s/rootfs", g_imgs, md + 7);
    ASSERT_STREQ(img.rootfs, want);
    ASSERT_EQ_U(img.size, strlen("hello from the image\n") + 4 + strlen("#!/bin/sh\n"));
    (void)snprintf(p, sizeof p, "%s/etc/hello", img.rootfs);
    ASSERT_GT(slurp(p, buf, sizeof buf), 0);
    ASSERT_STREQ(buf, "hello from the image\n");
    struct stat st, st2;
    (void)snprintf(p, sizeof p, "%s/home/u/note", img.rootfs);
    ASSERT_EQ(stat(p, &st), 0);
    ASSERT_EQ(st.st_uid, 1000);
    ASSERT_EQ(st.st_mode & 07777, 0600);
    (void)snprintf(p, sizeof p, "%s/usr/bin/tool", img.rootfs);
    ASSERT_EQ(stat(p, &st), 0);
    ASSERT_EQ(st.st_mode & 07777, 04755);
    (void)snprintf(p, sizeof p, "%s/usr/bin/tool2", img.rootfs);
    ASSERT_EQ(stat(p, &st2), 0);
    ASSERT_EQ(st.st_ino, st2.st_ino); /* the hard link */
    (void)snprintf(p, sizeof p, "%s/bin", img.rootfs);
    ASSERT_EQ(readlink(p, buf, sizeof buf), 7);
    /* the cache is not reachable by the host's users */
    (void)snprintf(p, sizeof p, "%s/.rootfs", g_imgs);
    ASSERT_EQ(stat(p, &st), 0);
    ASSERT_EQ(st.st_mode & 0777, 0700);
    blob_free(&l);
}

TEST(resolving_twice_unpacks_once)
{
    sbx_err_t err = { 0 };
    const ent_t e[] = { { "f", 'f', "one", 0, 0 } };
    blob_t l = make_layer(e, 1, false); /* an uncompressed layer */
    char p[PATH_MAX + 64];
    make_image("twice", &l, 1, NULL);
    image_t a, b, c;
    ASSERT_EQ(image_resolve(g_imgs, "twice", 0, &a, &err), 0);
    /* a file the unpacker never wrote: a second unpack would not have it */
    (void)snprintf(p, sizeof p, "%s/marker", a.rootfs);
    write_file(p, "x", 1);
    ASSERT_EQ(image_resolve(g_imgs, "twice", 0, &b, &err), 0);
    ASSERT_EQ(image_resolve(g_imgs, "twice", IMAGE_VERIFY_ALL, &c, &err), 0);
    ASSERT_STREQ(a.rootfs, b.rootfs);
    ASSERT_STREQ(a.rootfs, c.rootfs);
    ASSERT_TRUE(exists(p));
    ASSERT_EQ_U(c.size, 3);
    blob_free(&l);
}

TEST(a_layer_of_two_gzip_members_resolves)
{
    sbx_err_t err = { 0 };
    char big[300000];
    for (size_t i = 0; i < sizeof big - 1; i++)
        big[i] = (char)('a' + (i * 7919) % 26);
    big[sizeof big - 1] = 0;
    const ent_t e[] = { { "big", 'f', big, 0, 0 }, { "small", 'f', "s", 0, 0 } };
    blob_t l = make_layer(e, ELEMENTSOF(e), false);
    regzip_in_two(&l);
    char p[PATH_MAX + 64];
    image_t img;
    make_image("members", &l, 1, NULL);
    int r = image_resolve(g_imgs, "members", 0, &img, &err);
    printf("# %s\n", err.msg);
    ASSERT_EQ(r, 0);
    ASSERT_EQ_U(img.size, sizeof big - 1 + 1);
    (void)snprintf(p, sizeof p, "%s/small", img.rootfs);
    ASSERT_TRUE(exists(p));
    blob_free(&l);
}

TEST(a_corrupted_blob_is_refused)
{
    sbx_err_t err = { 0 };
    const ent_t e[] = { { "f", 'f', "some content that is long enough", 0, 0 } };
    blob_t l = make_layer(e, 1, true);
    char md[72];
    image_t img;
    /* positive control: the same image, untouched, resolves */
    make_image("intact", &l, 1, NULL);
    ASSERT_EQ(image_resolve(g_imgs, "intact", 0, &img, &err), 0);
    /* the cache is content-addressed: an unpacked manifest's rootfs came from verified bytes,
     * so only a full check (IMAGE_VERIFY_ALL, what a node does at startup) hashes its layers
     * again */
    corrupt("intact", l.digest, l.n / 2);
    ASSERT_EQ(image_resolve(g_imgs, "intact", 0, &img, &err), 0);
    ASSERT_EQ(image_resolve(g_imgs, "intact", IMAGE_VERIFY_ALL, &img, &err), -EBADMSG);
    const ent_t e2[] = { { "f", 'f', "other content, never unpacked before", 0, 0 } };
    blob_t l2 = make_layer(e2, 1, true);
    make_image("bitflip", &l2, 1, md);
    corrupt("bitflip", l2.digest, l2.n / 2);
    int r = image_resolve(g_imgs, "bitflip", 0, &img, &err);
    printf("# %s\n", err.msg);
    ASSERT_EQ(r, -EBADMSG);
    ASSERT_TRUE(strstr(err.msg, "image bitflip: blob ") &&
                strstr(err.msg, "does not match its digest"));
    char p[PATH_MAX];
    (void)snprintf(p, sizeof p, "%s/.rootfs/%s", g_imgs, md + 7);
    ASSERT_FALSE(exists(p)); /* nothing unpacked */
    /* the manifest itself */
    make_image("badman", &l2, 1, md);
    corrupt("badman", md, 10);
    ASSERT_EQ(image_resolve(g_imgs, "badman", 0, &img, &err), -EBADMSG);
    blob_free(&l);
    blob_free(&l2);
}

TEST(a_layer_whose_content_does_not_match_its_diff_id_is_refused)
{
    const ent_t e[] = { { "f", 'f', "a", 0, 0 } }, e2[] = { { "f", 'f', "b", 0, 0 } };
    blob_t l = make_layer(e, 1, true), other = make_layer(e2, 1, true);
    memcpy(l.diff_id, other.diff_id, sizeof l.diff_id); /* blob digest right, diff_id wrong */
    sbx_err_t err = { 0 };
    image_t img;
    make_image("diffid", &l, 1, NULL);
    int r = image_resolve(g_imgs, "diffid", 0, &img, &err);
    printf("# %s\n", err.msg);
    ASSERT_EQ(r, -EBADMSG);
    ASSERT_TRUE(strstr(err.msg, "diff_id") != NULL);
    blob_free(&l);
    blob_free(&other);
}

/* Each hostile layer is refused, and nothing lands outside the rootfs; the same layer without
 * its hostile entry resolves (the control). */
static void hostile(const char *name, const ent_t *bad, const char *outside)
{
    ent_t e[3] = { { "ok", 'f', "fine", 0, 0 }, bad[0], bad[1] };
    size_t n = bad[1].path ? 3 : 2;
    blob_t l = make_layer(e, n, true), ctl = make_layer(e, 1, true);
    char cname[64];
    sbx_err_t err = { 0 };
    image_t img;
    make_image(name, &l, 1, NULL);
    int r = image_resolve(g_imgs, name, 0, &img, &err);
    printf("# %s: %s\n", name, err.msg);
    ASSERT_EQ(r, -EPERM);
    ASSERT_FALSE(exists(outside));
    (void)snprintf(cname, sizeof cname, "%s-control", name);
    make_image(cname, &ctl, 1, NULL);
    ASSERT_EQ(image_resolve(g_imgs, cname, 0, &img, &err), 0);
    blob_free(&l);
    blob_free(&ctl);
}

TEST(path_traversal_absolute_paths_hard_links_out_and_devices_are_refused)
{
    char outside[256], target[300], abs_path[300];
    (void)snprintf(outside, sizeof outside, "%s/outside", g_dir);
    mkdir(outside, 0755);
    /* ../ from the rootfs (images/.rootfs/<hex>/rootfs) up to g_dir */
    ent_t dotdot[2] = { { "../../../../outside/dotdot", 'f', "x", 0, 0 }, { 0 } };
    (void)snprintf(target, sizeof target, "%s/dotdot", outside);
    hostile("dotdot", dotdot, target);

    (void)snprintf(abs_path, sizeof abs_path, "%s/absolute", outside);
    ent_t absolute[2] = { { abs_path, 'f', "x", 0, 0 }, { 0 } };
    hostile("absolute", absolute, abs_path);

    /* a hard link to a file outside */
    (void)snprintf(target, sizeof target, "%s/victim", outside);
    write_file(target, "host file", 9);
    ent_t hard[2] = { { "hl", 'h', "../../../../outside/victim", 0, 0 }, { 0 } };
    hostile("hardlink", hard, "/nonexistent-sbx-test");
    struct stat st;
    ASSERT_EQ(stat(target, &st), 0);
    ASSERT_EQ(st.st_nlink, 1); /* never linked into the image */

    ent_t dev[2] = { { "dev/mem", 'c', NULL, 0, 0 }, { 0 } };
    hostile("devnode", dev, "/nonexistent-sbx-test");

    ent_t uid[2] = { { "big", 'f', "x", 70000, 0 }, { 0 } };
    hostile("biguid", uid, "/nonexistent-sbx-test");
}

/* A symlink that points out of the rootfs, then an entry through it: the path resolves inside
 * the rootfs (a chroot), as it would for a run, and never on the host. A link to a host directory
 * dangles there: that write is refused; links to the root itself are followed into the rootfs. */
TEST(writes_through_escaping_symlinks_never_reach_the_host)
{
    sbx_err_t err = { 0 };
    char outside[256], target[400], p[PATH_MAX + 400];
    (void)snprintf(outside, sizeof outside, "%s/outside2", g_dir);
    mkdir(outside, 0755);
    const ent_t abs[] = { { "esc", 'l', outside, 0, 0 }, { "esc/through-abs", 'f', "x", 0, 0 } };
    blob_t la = make_layer(abs, ELEMENTSOF(abs), true);
    image_t img;
    make_image("symabs", &la, 1, NULL);
    int r = image_resolve(g_imgs, "symabs", 0, &img, &err);
    printf("# %s\n", err.msg);
    ASSERT_EQ(r, -EPERM);
    (void)snprintf(target, sizeof target, "%s/through-abs", outside);
    ASSERT_FALSE(exists(target));

    const ent_t climb[] = {
        { "up", 'l', "../../../..", 0, 0 },
        { "up/through-rel", 'f', "y", 0, 0 },
        { "root", 'l', "/", 0, 0 },
        { "root/through-root", 'f', "z", 0, 0 },
    };
    blob_t lc = make_layer(climb, ELEMENTSOF(climb), true);
    make_image("symclimb", &lc, 1, NULL);
    r = image_resolve(g_imgs, "symclimb", 0, &img, &err);
    printf("# %s\n", err.msg);
    ASSERT_EQ(r, 0);
    /* where an escape would have written: g_dir is four levels above the rootfs, and / */
    (void)snprintf(target, sizeof target, "%s/through-rel", g_dir);
    ASSERT_FALSE(exists(target));
    ASSERT_FALSE(exists("/through-root"));
    /* the control: both writes happened, inside the rootfs */
    (void)snprintf(p, sizeof p, "%s/through-rel", img.rootfs);
    ASSERT_TRUE(exists(p));
    (void)snprintf(p, sizeof p, "%s/through-root", img.rootfs);
    ASSERT_TRUE(exists(p));
    blob_free(&la);
    blob_free(&lc);
}

TEST(whiteouts_remove_lower_files_and_opaque_dirs_hide_lower_entries)
{
    sbx_err_t err = { 0 };
    const ent_t lower[] = {
        { "a/", 'd', NULL, 0, 0 },      { "a/keep", 'f', "k", 0, 0 },
        { "a/gone", 'f', "g", 0, 0 },   { "a/sub/", 'd', NULL, 0, 0 },
        { "a/sub/x", 'f', "x", 0, 0 },  { "d/", 'd', NULL, 0, 0 },
        { "d/x", 'f', "x", 0, 0 },      { "d/y/", 'd', NULL, 0, 0 },
        { "d/y/deep", 'f', "z", 0, 0 },
    };
    const ent_t upper[] = {
        { "a/.wh.gone", 'f', "", 0, 0 },     { "a/.wh.sub", 'f', "", 0, 0 },
        { "d/new", 'f', "n", 0, 0 }, /* written before the opaque marker: stays */
        { "d/.wh..wh..opq", 'f', "", 0, 0 }, { "d/later", 'f', "l", 0, 0 },
    };
    blob_t l[2] = { make_layer(lower, ELEMENTSOF(lower), true),
                    make_layer(upper, ELEMENTSOF(upper), true) };
    char p[PATH_MAX + 64];
    image_t img;
    make_image("wh", l, 2, NULL);
    int r = image_resolve(g_imgs, "wh", 0, &img, &err);
    printf("# %s\n", err.msg);
    ASSERT_EQ(r, 0);
    static const char *const present[] = { "a/keep", "d/new", "d/later" };
    static const char *const absent[] = { "a/gone",     "a/sub",          "d/x",      "d/y",
                                          "a/.wh.gone", "d/.wh..wh..opq", "a/.wh.sub" };
    for (size_t i = 0; i < ELEMENTSOF(present); i++) {
        (void)snprintf(p, sizeof p, "%s/%s", img.rootfs, present[i]);
        if (!exists(p))
            printf("# missing %s\n", present[i]);
        ASSERT_TRUE(exists(p));
    }
    for (size_t i = 0; i < ELEMENTSOF(absent); i++) {
        (void)snprintf(p, sizeof p, "%s/%s", img.rootfs, absent[i]);
        if (exists(p))
            printf("# still there: %s\n", absent[i]);
        ASSERT_FALSE(exists(p));
    }
    blob_free(&l[0]);
    blob_free(&l[1]);
}

TEST(unknown_and_malformed_images_say_why)
{
    sbx_err_t err = { 0 };
    char p[512];
    image_t img;
    ASSERT_EQ(image_resolve(g_imgs, "nosuch", 0, &img, &err), -ENOENT);
    ASSERT_TRUE(strstr(err.msg, "image nosuch: unknown image") == err.msg);
    ASSERT_EQ(image_resolve(g_imgs, "../good", 0, &img, &err), -ENOENT);
    ASSERT_EQ(image_resolve(g_imgs, "host", 0, &img, &err), -ENOENT);
    const ent_t e[] = { { "f", 'f', "x", 0, 0 } };
    blob_t l = make_layer(e, 1, true);
    make_image("garbled", &l, 1, NULL);
    (void)snprintf(p, sizeof p, "%s/garbled/index.json", g_imgs);
    write_file(p, "{\"schemaVersion\":2,\"manifests\":[{]}", 35);
    int r = image_resolve(g_imgs, "garbled", 0, &img, &err);
    printf("# %s\n", err.msg);
    ASSERT_EQ(r, -EINVAL);
    ASSERT_TRUE(strstr(err.msg, "malformed layout") != NULL);
    /* a manifest naming another image only */
    make_image("named", &l, 1, NULL);
    (void)snprintf(p, sizeof p, "%s/named", g_imgs);
    char q[512];
    (void)snprintf(q, sizeof q, "%s/renamed", g_imgs);
    ASSERT_EQ(rename(p, q), 0);
    ASSERT_EQ(image_resolve(g_imgs, "renamed", 0, &img, &err), -EINVAL);
    ASSERT_TRUE(strstr(err.msg, "no manifest named renamed") != NULL);
    blob_free(&l);
}

TEST(image_list_reports_what_resolved_and_why_the_rest_did_not)
{
    image_entry_t *v;
    size_t n;
    ASSERT_EQ(image_list(g_imgs, 0, &v, &n), 0);
    bool good = false, bitflip = false, rootfs = false;
    for (size_t i = 0; i < n; i++) {
        good |= streq(v[i].img.name, "good") && v[i].error == 0;
        bitflip |= streq(v[i].img.name, "bitflip") && v[i].error == -EBADMSG &&
                   strstr(v[i].why, "does not match") != NULL;
        rootfs |= v[i].img.name[0] == '.';
    }
    free(v);
    ASSERT_TRUE(good);
    ASSERT_TRUE(bitflip);
    ASSERT_FALSE(rootfs);
}

/* The node's set: the startup scan, image_rootfs from the set and on demand, the report. */
TEST(the_node_image_set_answers_image_rootfs_and_reports_what_resolved)
{
    sbx_err_t err = { 0 };
    static node_t n;
    char path[PATH_MAX], digest[IMAGE_DIGEST_MAX];
    memset(&n, 0, sizeof n);
    (void)snprintf(n.cfg.images_dir, sizeof n.cfg.images_dir, "%s", g_imgs);
    ASSERT_EQ(node_images_init(&n), 0);
    image_t good;
    ASSERT_EQ(image_resolve(g_imgs, "good", 0, &good, &err), 0);
    ASSERT_EQ(image_rootfs(&n, "good", path, sizeof path, digest, &err), 0);
    ASSERT_STREQ(path, good.rootfs);
    ASSERT_STREQ(digest, good.digest);
    ASSERT_EQ(image_rootfs(&n, "bitflip", path, sizeof path, NULL, &err), -EBADMSG);
    ASSERT_EQ(image_rootfs(&n, "nosuch", path, sizeof path, NULL, &err), -ENOENT);
    ASSERT_TRUE(strstr(err.msg, "image nosuch: unknown image") == err.msg);
    /* an image added after the scan resolves on demand, and is reported from then on */
    const ent_t e[] = { { "added", 'f', "later", 0, 0 } };
    blob_t l = make_layer(e, 1, true);
    make_image("added", &l, 1, NULL);
    ASSERT_EQ(image_rootfs(&n, "added", path, sizeof path, NULL, &err), 0);
    json_t *rep = node_images_json(&n);
    bool has_good = false, has_added = false, has_bad = false;
    size_t i;
    json_t *v;
    json_array_foreach(rep, i, v) {
        const char *nm = json_string_value(json_object_get(v, "name"));
        has_good |= streq(nm, "good") &&
                    streq(json_string_value(json_object_get(v, "digest")), good.digest) &&
                    (uint64_t)json_integer_value(json_object_get(v, "size")) == good.size;
        has_added |= streq(nm, "added");
        has_bad |= streq(nm, "bitflip") || streq(nm, "dotdot") || streq(nm, "devnode");
    }
    json_decref(rep);
    node_images_stop(&n);
    blob_free(&l);
    ASSERT_TRUE(has_good);
    ASSERT_TRUE(has_added);
    ASSERT_FALSE(has_bad);
}

int main(void)
{
    if (geteuid() != 0) {
        printf("1..0 # SKIP image unpacking needs root (chroot, owners)\n");
        return 0;
    }
    if (sodium_init() < 0)
        return 2;
    (void)snprintf(g_dir, sizeof g_dir, "/tmp/sbx-test-image-XXXXXX");
    if (!mkdtemp(g_dir))
        return 2;
    (void)snprintf(g_imgs, sizeof g_imgs, "%s/images", g_dir);
    const tap_test_t tests[] = {
        T(a_good_image_resolves_with_its_files_owners_and_size),
        T(resolving_twice_unpacks_once),
        T(a_layer_of_two_gzip_members_resolves),
        T(a_corrupted_blob_is_refused),
        T(a_layer_whose_content_does_not_match_its_diff_id_is_refused),
        T(path_traversal_absolute_paths_hard_links_out_and_devices_are_refused),
        T(writes_through_escaping_symlinks_never_reach_the_host),
        T(whiteouts_remove_lower_files_and_opaque_dirs_hide_lower_entries),
        T(unknown_and_malformed_images_say_why),
        T(image_list_reports_what_resolved_and_why_the_rest_did_not),
        T(the_node_image_set_answers_image_rootfs_and_reports_what_resolved),
    };
    int rc = tap_run(tests, ELEMENTSOF(tests));
    (void)nftw(g_dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    return rc;
}
