/* SPDX-License-Identifier: MIT */
/* Secrets at rest (src/control/seal.c): sealing and opening values bound to their record, keys
 * picked by kid (old keys still open, unknown ones refused), altered ciphertexts refused without
 * yielding bytes, and the key file's format, mode and owner checks, creation and replacement. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/macro.h"
#include "control/seal.h"
#include "tap.h"

static char tmpdir[] = "/tmp/sbx-test-seal-XXXXXX";

static void freestr(char **p) { free(*p); }
#define _cleanup_str_ _cleanup_(freestr)

static seal_keys_t one_key(void)
{
    seal_keys_t k = { .n = 1 };
    (void)seal_key_generate(&k.keys[0]);
    return k;
}

static void path_of(const char *name, char *buf, size_t cap)
{
    (void)snprintf(buf, cap, "%s/%s", tmpdir, name);
}

static int write_file(const char *path, const char *text, mode_t mode)
{
    (void)unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0)
        return -errno;
    ssize_t n = write(fd, text, strlen(text));
    (void)fchmod(fd, mode); /* the umask may have narrowed it */
    close(fd);
    return n == (ssize_t)strlen(text) ? 0 : -EIO;
}

TEST(seal_open_round_trip)
{
    seal_keys_t k = one_key();
    const char pt[] = "{\"API_SECRET\":\"hunter2\"}";
    _cleanup_str_ char *v = NULL, *out = NULL;
    ASSERT_EQ(seal_value(&k, "secrets/abc", pt, strlen(pt), &v), 0);
    ASSERT_TRUE(seal_is_sealed(v, strlen(v)));
    ASSERT_TRUE(seal_has_kid(v, strlen(v), k.keys[0].kid));
    ASSERT_TRUE(strstr(v, "hunter2") == NULL);
    size_t n = 0, idx = 9;
    ASSERT_EQ(seal_open(&k, "secrets/abc", v, strlen(v), &out, &n, &idx), 0);
    ASSERT_MEMEQ(out, n, pt, strlen(pt));
    ASSERT_EQ((int)idx, 0);
    /* a random nonce per value: sealing twice gives two ciphertexts */
    _cleanup_str_ char *v2 = NULL;
    ASSERT_EQ(seal_value(&k, "secrets/abc", pt, strlen(pt), &v2), 0);
    ASSERT_TRUE(!streq(v, v2));
    /* binary plaintext (a signing key's 64 bytes) and an empty one */
    uint8_t bin[64];
    randombytes_buf(bin, sizeof bin);
    _cleanup_str_ char *vb = NULL, *ob = NULL, *ve = NULL, *oe = NULL;
    ASSERT_EQ(seal_value(&k, "signing-keys/k-1", bin, sizeof bin, &vb), 0);
    ASSERT_EQ(seal_open(&k, "signing-keys/k-1", vb, strlen(vb), &ob, &n, NULL), 0);
    ASSERT_MEMEQ(ob, n, bin, sizeof bin);
    ASSERT_EQ(seal_value(&k, "secrets/e", "", 0, &ve), 0);
    ASSERT_EQ(seal_open(&k, "secrets/e", ve, strlen(ve), &oe, &n, NULL), 0);
    ASSERT_EQ((int)n, 0);
}

TEST(ciphertext_is_bound_to_its_record)
{
    seal_keys_t k = one_key();
    _cleanup_str_ char *v = NULL;
    char *out = NULL;
    size_t n = 0;
    ASSERT_EQ(seal_value(&k, "secrets/job-a", "A's secret", 10, &v), 0);
    /* record binding check: the same bytes under another record's name do not open */
    ASSERT_EQ(seal_open(&k, "secrets/job-b", v, strlen(v), &out, &n, NULL), -EBADMSG);
    ASSERT_EQ(seal_open(&k, "secrets/job-a ", v, strlen(v), &out, &n, NULL), -EBADMSG);
    ASSERT_TRUE(out == NULL);
    ASSERT_EQ(seal_open(&k, "secrets/job-a", v, strlen(v), &out, &n, NULL), 0);
    free(out);
}

TEST(altered_ciphertext_never_opens)
{
    seal_keys_t k = one_key();
    _cleanup_str_ char *v = NULL;
    const char pt[] = "a secret value long enough to have a middle";
    ASSERT_EQ(seal_value(&k, "secrets/x", pt, strlen(pt), &v), 0);
    size_t len = strlen(v), head = strlen(SEAL_PREFIX) + SEAL_KID_LEN + 1;
    /* every character of the body changed in turn (the last may carry unused bits: skip) */
    for (size_t i = head; i + 1 < len; i++) {
        char save = v[i], *out = NULL;
        size_t n = 0;
        v[i] = save == 'A' ? 'B' : 'A';
        int r = seal_open(&k, "secrets/x", v, strlen(v), &out, &n, NULL);
        v[i] = save;
        if (r != -EBADMSG || out) {
            printf("# position %zu: r=%d\n", i, r);
            ASSERT_EQ(r, -EBADMSG);
        }
    }
    /* truncated, extended, and not base64 */
    char *out = NULL;
    size_t n;
    ASSERT_EQ(seal_open(&k, "secrets/x", v, len - 4, &out, &n, NULL), -EBADMSG);
    ASSERT_EQ(seal_open(&k, "secrets/x", v, head + 10, &out, &n, NULL), -EBADMSG);
    char bad[512];
    (void)snprintf(bad, sizeof bad, "%s%s", v, "AAAA");
    ASSERT_EQ(seal_open(&k, "secrets/x", bad, strlen(bad), &out, &n, NULL), -EBADMSG);
    (void)snprintf(bad, sizeof bad, "%.*s!!!!", (int)head, v);
    ASSERT_EQ(seal_open(&k, "secrets/x", bad, strlen(bad), &out, &n, NULL), -EBADMSG);
    /* not a sealed value at all (a plaintext record) */
    ASSERT_EQ(seal_open(&k, "secrets/x", pt, strlen(pt), &out, &n, NULL), -EINVAL);
    ASSERT_FALSE(seal_is_sealed(pt, strlen(pt)));
    ASSERT_TRUE(out == NULL);
    (void)n;
}

TEST(keys_are_picked_by_kid)
{
    seal_keys_t a = one_key(), b = one_key();
    _cleanup_str_ char *va = NULL, *vb = NULL;
    ASSERT_EQ(seal_value(&a, "r", "under a", 7, &va), 0);
    ASSERT_EQ(seal_value(&b, "r", "under b", 7, &vb), 0);
    char *out = NULL;
    size_t n = 0, idx = 9;
    /* kid check: a value sealed under a key the set does not hold is refused as such */
    ASSERT_EQ(seal_open(&b, "r", va, strlen(va), &out, &n, NULL), -ENOKEY);
    /* a rotation in progress: [b, a] opens both, and says which key did */
    seal_keys_t both = { .n = 2, .keys = { b.keys[0], a.keys[0] } };
    ASSERT_EQ(seal_open(&both, "r", va, strlen(va), &out, &n, &idx), 0);
    ASSERT_MEMEQ(out, n, "under a", 7);
    ASSERT_EQ((int)idx, 1);
    free(out);
    ASSERT_EQ(seal_open(&both, "r", vb, strlen(vb), &out, &n, &idx), 0);
    ASSERT_EQ((int)idx, 0);
    free(out);
    /* new values go under the first key */
    _cleanup_str_ char *vn = NULL;
    ASSERT_EQ(seal_value(&both, "r", "new", 3, &vn), 0);
    ASSERT_TRUE(seal_has_kid(vn, strlen(vn), b.keys[0].kid));
    /* a value whose kid is changed to another key's opens under that key: it fails */
    size_t p = strlen(SEAL_PREFIX);
    memcpy(va + p, b.keys[0].kid, SEAL_KID_LEN);
    out = NULL;
    ASSERT_EQ(seal_open(&both, "r", va, strlen(va), &out, &n, NULL), -EBADMSG);
    ASSERT_TRUE(out == NULL);
}

TEST(key_file_create_load_write)
{
    char path[256];
    path_of("secrets.key", path, sizeof path);
    seal_keys_t k, again;
    bool created = false;
    sbx_err_t err = { 0 };
    ASSERT_EQ(seal_keys_load(path, &k, &err), -ENOENT);
    ASSERT_EQ(seal_keys_load_or_create(path, &k, &created, &err), 0);
    ASSERT_TRUE(created);
    ASSERT_EQ((int)k.n, 1);
    struct stat st;
    ASSERT_EQ(stat(path, &st), 0);
    ASSERT_EQ((int)(st.st_mode & 07777), 0600);
    ASSERT_EQ(seal_keys_load_or_create(path, &again, &created, &err), 0);
    ASSERT_FALSE(created);
    ASSERT_MEMEQ(again.keys[0].key, sizeof again.keys[0].key, k.keys[0].key, sizeof k.keys[0].key);
    ASSERT_STREQ(again.keys[0].kid, k.keys[0].kid);
    /* replaced with two keys, in order */
    seal_keys_t two = { .n = 2, .keys = { one_key().keys[0], k.keys[0] } };
    ASSERT_EQ(seal_keys_write(path, &two), 0);
    ASSERT_EQ(seal_keys_load(path, &again, &err), 0);
    ASSERT_EQ((int)again.n, 2);
    ASSERT_STREQ(again.keys[0].kid, two.keys[0].kid);
    ASSERT_STREQ(again.keys[1].kid, k.keys[0].kid);
    ASSERT_EQ(stat(path, &st), 0);
    ASSERT_EQ((int)(st.st_mode & 07777), 0600);
    char tmp[300];
    (void)snprintf(tmp, sizeof tmp, "%s.new", path);
    ASSERT_EQ(access(tmp, F_OK), -1); /* no temporary left behind */
}

TEST(key_file_mode_and_owner_are_checked)
{
    char path[256];
    sbx_err_t err = { 0 };
    path_of("k2", path, sizeof path);
    seal_keys_t k;
    const char text[] = "0123abcd AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\n";
    ASSERT_EQ(write_file(path, text, 0600), 0);
    ASSERT_EQ(seal_keys_load(path, &k, &err), 0); /* positive control */
    ASSERT_STREQ(k.keys[0].kid, "0123abcd");
    /* key file mode check: group or other bits refuse the file */
    static const mode_t modes[] = { 0644, 0640, 0604, 0620, 0602, 0610, 0601 };
    for (size_t i = 0; i < ELEMENTSOF(modes); i++) {
        ASSERT_EQ(chmod(path, modes[i]), 0);
        err.msg[0] = 0;
        ASSERT_EQ(seal_keys_load(path, &k, &err), -EPERM);
        ASSERT_TRUE(strstr(err.msg, "group or other") != NULL);
    }
    ASSERT_EQ(chmod(path, 0400), 0);
    ASSERT_EQ(seal_keys_load(path, &k, &err), 0);
    /* owner check: another user's file is refused (root may chown it) */
    if (geteuid() == 0) {
        ASSERT_EQ(chown(path, 65534, 65534), 0);
        err.msg[0] = 0;
        ASSERT_EQ(seal_keys_load(path, &k, &err), -EPERM);
        ASSERT_TRUE(strstr(err.msg, "owned by another user") != NULL);
    }
    /* a symlink is never followed */
    char link[256];
    path_of("k2-link", link, sizeof link);
    ASSERT_EQ(symlink(path, link), 0);
    ASSERT_TRUE(seal_keys_load(link, &k, &err) < 0);
}

TEST(key_file_format)
{
    char path[256];
    sbx_err_t err;
    path_of("k3", path, sizeof path);
    seal_keys_t k;
    static const char *const bad[] = {
        "0123abcd AAAA\n",                                         /* short key */
        "0123ABCD AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\n",  /* kid not lowercase */
        "0123abc AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\n",   /* kid length */
        "0123abcd AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA+\n", /* not base64url */
        "0123abcd AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\n"
        "0123abcd BAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\n", /* one kid twice */
    };
    for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
        ASSERT_EQ(write_file(path, bad[i], 0600), 0);
        ASSERT_EQ(seal_keys_load(path, &k, &err), -EINVAL);
    }
    ASSERT_EQ(write_file(path, "# only a comment\n\n", 0600), 0);
    ASSERT_EQ(seal_keys_load(path, &k, &err), -ENODATA);
    ASSERT_EQ(write_file(path,
                         "# c\n0123abcd AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\n\n"
                         "ffffffff BAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
                         0600),
              0);
    ASSERT_EQ(seal_keys_load(path, &k, &err), 0);
    ASSERT_EQ((int)k.n, 2);
    ASSERT_STREQ(k.keys[1].kid, "ffffffff");
}

static void remove_tmpdir(void)
{
    DIR *d = opendir(tmpdir);
    struct dirent *de;
    if (d) {
        while ((de = readdir(d)))
            if (!streq(de->d_name, ".") && !streq(de->d_name, ".."))
                (void)unlinkat(dirfd(d), de->d_name, 0);
        closedir(d);
    }
    (void)rmdir(tmpdir);
}

int main(void)
{
    if (sodium_init() < 0 || !mkdtemp(tmpdir)) {
        printf("Bail out! setup: %s\n", strerror(errno));
        return 1;
    }
    const tap_test_t tests[] = {
        T(seal_open_round_trip),
        T(ciphertext_is_bound_to_its_record),
        T(altered_ciphertext_never_opens),
        T(keys_are_picked_by_kid),
        T(key_file_create_load_write),
        T(key_file_mode_and_owner_are_checked),
        T(key_file_format),
    };
    int r = tap_run(tests, ELEMENTSOF(tests));
    remove_tmpdir();
    return r;
}
