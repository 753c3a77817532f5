/* SPDX-License-Identifier: MIT */
/* Secrets at rest (seal.h): the key file and sealed values.
 *
 * Why secretbox with a per-record subkey: the issue names libsodium's secretbox
 * (XSalsa20-Poly1305, random 192-bit nonces, so random nonces never collide in practice). It
 * has no associated data, so the record is bound through the key instead: each value is sealed
 * under subkey = BLAKE2b-256(key = the secrets key, message = "sbx-seal-v1" NUL record name).
 * A ciphertext copied into another record (another job's secrets, another signing key's
 * record) is opened there under another subkey and fails authentication, exactly as a
 * ciphertext altered in place does. The kid in front only picks the key; a wrong or altered kid
 * picks another key (or none) and fails the same way. */
#include "seal.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/macro.h"

#define SEAL_CONTEXT "sbx-seal-v1"
#define B64 sodium_base64_VARIANT_URLSAFE_NO_PADDING

static bool kid_valid(const char *s, size_t n)
{
    if (n != SEAL_KID_LEN)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return true;
}

int seal_key_generate(seal_key_t *ret)
{
    uint8_t id[SEAL_KID_LEN / 2];
    if (sodium_init() < 0)
        return -EIO;
    seal_key_t k;
    crypto_secretbox_keygen(k.key);
    randombytes_buf(id, sizeof id);
    sodium_bin2hex(k.kid, sizeof k.kid, id, sizeof id);
    *ret = k;
    sodium_memzero(&k, sizeof k);
    return 0;
}

/* One line "<kid> <base64url key>" of the key file. */
static int parse_line(const char *line, size_t n, seal_key_t *ret)
{
    const char *sp = memchr(line, ' ', n);
    size_t klen;
    if (!sp || !kid_valid(line, (size_t)(sp - line)))
        return -EINVAL;
    seal_key_t k;
    memcpy(k.kid, line, SEAL_KID_LEN);
    k.kid[SEAL_KID_LEN] = 0;
    const char *b = sp + 1;
    if (sodium_base642bin(k.key, sizeof k.key, b, n - (size_t)(b - line), NULL, &klen, NULL, B64) !=
            0 ||
        klen != sizeof k.key) {
        sodium_memzero(&k, sizeof k);
        return -EINVAL;
    }
    *ret = k;
    sodium_memzero(&k, sizeof k);
    return 0;
}

static int parse_file(const char *text, size_t len, seal_keys_t *ret)
{
    seal_keys_t ks = { .n = 0 };
    int r = 0;
    for (size_t at = 0; at < len && r == 0;) {
        const char *nl = memchr(text + at, '\n', len - at);
        size_t n = nl ? (size_t)(nl - (text + at)) : len - at;
        const char *line = text + at;
        at += n + 1;
        if (n == 0 || line[0] == '#')
            continue;
        if (ks.n == SEAL_KEYS_MAX)
            r = -E2BIG;
        else
            r = parse_line(line, n, &ks.keys[ks.n]);
        if (r == 0)
            for (size_t i = 0; i < ks.n && r == 0; i++)
                if (streq(ks.keys[i].kid, ks.keys[ks.n].kid))
                    r = -EINVAL; /* one kid, one key */
        if (r == 0)
            ks.n++;
    }
    if (r == 0 && ks.n == 0)
        r = -ENODATA; /* empty: being written by another process, or emptied */
    if (r == 0)
        *ret = ks;
    sodium_memzero(&ks, sizeof ks);
    return r;
}

int seal_keys_load(const char *path, seal_keys_t *ret, sbx_err_t *err)
{
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY);
    if (fd < 0) {
        int r = negative_errno();
        if (r != -ENOENT)
            return sbx_err(err, r, "secrets key file %s: cannot open it", path);
        return r;
    }
    struct stat st;
    if (fstat(fd, &st) < 0)
        return negative_errno();
    if (!S_ISREG(st.st_mode))
        return sbx_err(err, -EPERM, "secrets key file %s: not a regular file", path);
    if ((st.st_mode & 077) != 0)
        return sbx_err(err, -EPERM,
                       "secrets key file %s: group or other may access it (mode must be 0600 or "
                       "stricter: chmod 600 it after checking who read it)",
                       path);
    if (st.st_uid != 0 && st.st_uid != geteuid())
        return sbx_err(err, -EPERM,
                       "secrets key file %s: owned by another user (must be root or us)", path);
    char text[SEAL_FILE_MAX + 1];
    size_t len = 0;
    for (;;) {
        ssize_t k = read(fd, text + len, sizeof text - len);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return negative_errno();
        if (k == 0)
            break;
        len += (size_t)k;
        if (len == sizeof text) {
            sodium_memzero(text, sizeof text);
            return sbx_err(err, -EINVAL, "secrets key file %s: larger than 4 KiB", path);
        }
    }
    int r = parse_file(text, len, ret);
    sodium_memzero(text, sizeof text);
    if (r == -EINVAL || r == -E2BIG)
        return sbx_err(err, r,
                       "secrets key file %s: malformed (lines \"<8 hex kid> <base64url 32-byte "
                       "key>\", at most 8 keys, each kid once)",
                       path);
    if (r == -ENODATA)
        return sbx_err(err, r, "secrets key file %s: holds no key", path);
    return r;
}

static int format_keys(const seal_keys_t *k, char *out, size_t cap)
{
    size_t at = 0;
    int w = snprintf(out, cap,
                     "# sbx-control secrets key file: \"<kid> <key>\" a line; the first is the "
                     "current key, the others are old keys still accepted for reading.\n");
    if (w < 0 || (size_t)w >= cap)
        return -ENOBUFS;
    at = (size_t)w;
    for (size_t i = 0; i < k->n; i++) {
        char b[sodium_base64_ENCODED_LEN(crypto_secretbox_KEYBYTES, B64)];
        sodium_bin2base64(b, sizeof b, k->keys[i].key, sizeof k->keys[i].key, B64);
        w = snprintf(out + at, cap - at, "%s %s\n", k->keys[i].kid, b);
        sodium_memzero(b, sizeof b);
        if (w < 0 || (size_t)w >= cap - at)
            return -ENOBUFS;
        at += (size_t)w;
    }
    return (int)at;
}

static int write_all_sync(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return k < 0 ? negative_errno() : -EIO;
        p += k;
        n -= (size_t)k;
    }
    return fsync(fd) < 0 ? negative_errno() : 0;
}

int seal_keys_write(const char *path, const seal_keys_t *k)
{
    char tmp[PATH_MAX], dir[PATH_MAX], text[SEAL_FILE_MAX];
    if (k->n == 0 || k->n > SEAL_KEYS_MAX ||
        (size_t)snprintf(tmp, sizeof tmp, "%s.new", path) >= sizeof tmp ||
        (size_t)snprintf(dir, sizeof dir, "%s", path) >= sizeof dir)
        return -EINVAL;
    int len = format_keys(k, text, sizeof text);
    if (len < 0)
        return len;
    (void)unlink(tmp); /* left by a crash: never followed, O_EXCL below */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    int r = fd < 0 ? negative_errno() : write_all_sync(fd, text, (size_t)len);
    sodium_memzero(text, sizeof text);
    if (fd >= 0)
        (void)close(fd);
    if (r == 0 && rename(tmp, path) < 0)
        r = negative_errno();
    if (r < 0) {
        (void)unlink(tmp);
        return r;
    }
    _cleanup_close_ int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || fsync(dfd) < 0)
        return negative_errno();
    return 0;
}

int seal_keys_load_or_create(const char *path, seal_keys_t *ret, bool *ret_created, sbx_err_t *err)
{
    int r = seal_keys_load(path, ret, err);
    for (int i = 0; r == -ENODATA && i < 50; i++) { /* another process is writing it */
        struct timespec ts = { 0, 20 * 1000 * 1000 };
        nanosleep(&ts, NULL);
        r = seal_keys_load(path, ret, err);
    }
    if (r != -ENOENT) {
        if (r == 0)
            *ret_created = false;
        return r;
    }
    seal_keys_t ks = { .n = 1 };
    char text[SEAL_FILE_MAX];
    r = seal_key_generate(&ks.keys[0]);
    int len = r < 0 ? r : format_keys(&ks, text, sizeof text);
    if (len < 0)
        return len;
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        r = negative_errno();
        sodium_memzero(text, sizeof text);
        sodium_memzero(&ks, sizeof ks);
        if (r == -EEXIST) /* another process made it first: use that one */
            return seal_keys_load_or_create(path, ret, ret_created, err);
        return sbx_err(err, r, "secrets key file %s: cannot create it", path);
    }
    r = write_all_sync(fd, text, (size_t)len);
    (void)close(fd);
    sodium_memzero(text, sizeof text);
    if (r == 0) {
        *ret = ks;
        *ret_created = true;
    }
    sodium_memzero(&ks, sizeof ks);
    return r;
}

bool seal_is_sealed(const char *v, size_t len)
{
    return len >= strlen(SEAL_PREFIX) && memcmp(v, SEAL_PREFIX, strlen(SEAL_PREFIX)) == 0;
}

bool seal_has_kid(const char *v, size_t len, const char *kid)
{
    size_t p = strlen(SEAL_PREFIX);
    return seal_is_sealed(v, len) && len > p + SEAL_KID_LEN && strlen(kid) == SEAL_KID_LEN &&
           memcmp(v + p, kid, SEAL_KID_LEN) == 0 && v[p + SEAL_KID_LEN] == '.';
}

/* The per-record subkey (see the top of this file). */
static int subkey(const seal_key_t *k, const char *record, uint8_t out[crypto_secretbox_KEYBYTES])
{
    size_t cl = sizeof SEAL_CONTEXT, rl = strlen(record); /* the context with its NUL */
    crypto_generichash_state h;
    if (crypto_generichash_init(&h, k->key, sizeof k->key, crypto_secretbox_KEYBYTES) != 0 ||
        crypto_generichash_update(&h, (const uint8_t *)SEAL_CONTEXT, cl) != 0 ||
        crypto_generichash_update(&h, (const uint8_t *)record, rl) != 0 ||
        crypto_generichash_final(&h, out, crypto_secretbox_KEYBYTES) != 0) {
        sodium_memzero(&h, sizeof h);
        return -EIO;
    }
    sodium_memzero(&h, sizeof h);
    return 0;
}

int seal_value(const seal_keys_t *k, const char *record, const void *pt, size_t len, char **ret)
{
    if (k->n == 0 || len > SEAL_VALUE_MAX || sodium_init() < 0)
        return -EINVAL;
    size_t blen = crypto_secretbox_NONCEBYTES + crypto_secretbox_MACBYTES + len;
    size_t elen = sodium_base64_ENCODED_LEN(blen, B64);
    size_t head = strlen(SEAL_PREFIX) + SEAL_KID_LEN + 1;
    uint8_t *box = malloc(blen), sk[crypto_secretbox_KEYBYTES];
    char *out = malloc(head + elen);
    int r = box && out ? subkey(&k->keys[0], record, sk) : -ENOMEM;
    if (r == 0) {
        randombytes_buf(box, crypto_secretbox_NONCEBYTES);
        if (crypto_secretbox_easy(box + crypto_secretbox_NONCEBYTES, pt, len, box, sk) != 0)
            r = -EIO;
    }
    sodium_memzero(sk, sizeof sk);
    if (r == 0) {
        (void)snprintf(out, head + 1, "%s%s.", SEAL_PREFIX, k->keys[0].kid);
        sodium_bin2base64(out + head, elen, box, blen, B64);
        *ret = TAKE_PTR(out);
    }
    free(box);
    free(out);
    return r;
}

int seal_open(const seal_keys_t *k, const char *record, const char *v, size_t len, char **ret,
              size_t *ret_len, size_t *ret_index)
{
    size_t p = strlen(SEAL_PREFIX);
    if (!seal_is_sealed(v, len) || len < p + SEAL_KID_LEN + 1 || v[p + SEAL_KID_LEN] != '.' ||
        !kid_valid(v + p, SEAL_KID_LEN))
        return -EINVAL;
    size_t idx = k->n;
    for (size_t i = 0; i < k->n && idx == k->n; i++)
        if (memcmp(k->keys[i].kid, v + p, SEAL_KID_LEN) == 0)
            idx = i;
    if (idx == k->n)
        return -ENOKEY;
    const char *b = v + p + SEAL_KID_LEN + 1;
    size_t bl = len - (size_t)(b - v), blen;
    if (bl > sodium_base64_ENCODED_LEN(SEAL_VALUE_MAX + 64, B64))
        return -EBADMSG;
    uint8_t *box = malloc(bl), sk[crypto_secretbox_KEYBYTES];
    if (!box)
        return -ENOMEM;
    int r = 0;
    if (sodium_base642bin(box, bl, b, bl, NULL, &blen, NULL, B64) != 0 ||
        blen < crypto_secretbox_NONCEBYTES + crypto_secretbox_MACBYTES)
        r = -EBADMSG;
    size_t n = r == 0 ? blen - crypto_secretbox_NONCEBYTES - crypto_secretbox_MACBYTES : 0;
    char *pt = r == 0 ? malloc(n + 1) : NULL;
    if (r == 0 && !pt)
        r = -ENOMEM;
    if (r == 0)
        r = subkey(&k->keys[idx], record, sk);
    if (r == 0 && crypto_secretbox_open_easy((uint8_t *)pt, box + crypto_secretbox_NONCEBYTES,
                                             blen - crypto_secretbox_NONCEBYTES, box, sk) != 0)
        r = -EBADMSG;
    sodium_memzero(sk, sizeof sk);
    free(box);
    if (r < 0) {
        if (pt)
            sodium_memzero(pt, n + 1);
        free(pt);
        return r;
    }
    pt[n] = 0;
    *ret = pt;
    *ret_len = n;
    if (ret_index)
        *ret_index = idx;
    return 0;
}
