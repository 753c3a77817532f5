/* SPDX-License-Identifier: MIT */
/* Signing keys (store keys signing-keys/<kid>). A new key is published to nodes first and used
 * for signing only after publish_delay, so every node already holds it when the first
 * capability signed with it arrives; the key it replaces stays in the verification set until
 * every capability it signed has expired (cap_rotation_verify_set). Signing keys live in the
 * store because every control replica signs; nodes only ever receive public keys. Their secret
 * parts are sealed (seal.h) under the secrets key, bound to their record. */
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>

#include "common/log.h"
#include "control.h"

static int b64(const uint8_t *p, size_t n, char *out, size_t cap)
{
    if (cap < sodium_base64_ENCODED_LEN(n, sodium_base64_VARIANT_URLSAFE_NO_PADDING))
        return -ENOBUFS;
    sodium_bin2base64(out, cap, p, n, sodium_base64_VARIANT_URLSAFE_NO_PADDING);
    return 0;
}

static int unb64(const char *s, uint8_t *out, size_t n)
{
    size_t len;
    if (sodium_base642bin(out, n, s, strlen(s), NULL, &len, NULL,
                          sodium_base64_VARIANT_URLSAFE_NO_PADDING) != 0 ||
        len != n)
        return -EINVAL;
    return 0;
}

/* The record's "sk": sealed (seal.h) under the record's own store key, or, in a record written
 * before secrets at rest, the base64url of the secret key (accepted, and re-sealed by
 * keys_load). Returns 0 for a value sealed under the current secrets key, 1 for one that must
 * be re-sealed (plaintext, or an older key), -errno when it cannot be read. */
static int sk_open(const seal_keys_t *seal, const char *record, const char *sk, uint8_t *out)
{
    if (!seal_is_sealed(sk, strlen(sk)))
        return unb64(sk, out, CAP_SK_BYTES) == 0 ? 1 : -EINVAL;
    char *pt;
    size_t n, idx;
    int r = seal_open(seal, record, sk, strlen(sk), &pt, &n, &idx);
    if (r < 0)
        return r;
    if (n == CAP_SK_BYTES)
        memcpy(out, pt, n);
    sodium_memzero(pt, n);
    free(pt);
    return n != CAP_SK_BYTES ? -EBADMSG : idx == 0 ? 0 : 1;
}

static int keyrec_from_json(const seal_keys_t *seal, const char *record, const char *v, size_t len,
                            cap_keyrec_t *k)
{
    json_t *j = json_loadb(v, len, 0, NULL);
    const char *kid, *pk, *sk;
    json_int_t created, activate, retired;
    int r = -EINVAL;
    if (json_unpack(j, "{s:s,s:s,s:s,s:I,s:I,s:I}", "kid", &kid, "pk", &pk, "sk", &sk, "created",
                    &created, "activate", &activate, "retired", &retired) == 0 &&
        strlen(kid) < CAP_KID_MAX) {
        *k = (cap_keyrec_t){ .created = created, .activate = activate, .retired = retired };
        memcpy(k->key.kid, kid, strlen(kid) + 1);
        r = unb64(pk, k->key.pk, CAP_PK_BYTES);
        if (r == 0)
            r = sk_open(seal, record, sk, k->key.sk);
    }
    json_decref(j);
    return r;
}

static int keyrec_put(store_t *st, const seal_keys_t *seal, const cap_keyrec_t *k, int64_t expect)
{
    char pk[64], key[64], *sk;
    b64(k->key.pk, CAP_PK_BYTES, pk, sizeof pk);
    (void)snprintf(key, sizeof key, "signing-keys/%s", k->key.kid);
    int r = seal_value(seal, key, k->key.sk, CAP_SK_BYTES, &sk);
    if (r < 0)
        return r;
    json_t *j = json_pack("{s:s,s:s,s:s,s:I,s:I,s:I}", "kid", k->key.kid, "pk", pk, "sk", sk,
                          "created", (json_int_t)k->created, "activate", (json_int_t)k->activate,
                          "retired", (json_int_t)k->retired);
    free(sk);
    char *v = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!v)
        return -ENOMEM;
    r = store_cas(st, key, v, strlen(v), expect, NULL);
    free(v);
    return r;
}

static const char *open_error(int r)
{
    return r == -EBADMSG  ? "cannot decrypt: altered, or moved from another record"
           : r == -ENOKEY ? "sealed under a secrets key the key file does not hold"
                          : "malformed record";
}

int keys_load(store_t *st, const seal_keys_t *seal, keyring_t *kr)
{
    store_kv_t *kvs;
    size_t n;
    int r = store_list(st, "signing-keys/", &kvs, &n), bad = 0;
    if (r < 0)
        return r;
    keyring_t k = { 0 };
    for (size_t i = 0; i < n && k.n < CTL_KEYS_MAX; i++) {
        r = keyrec_from_json(seal, kvs[i].key, kvs[i].value, kvs[i].value_len, &k.recs[k.n]);
        if (r < 0) { /* loudly: a key that cannot be read is never replaced by guesswork */
            log_error("%s: %s", kvs[i].key, open_error(r));
            bad = r;
            continue;
        }
        if (r == 1) { /* plaintext (before secrets at rest) or an older secrets key */
            int w = keyrec_put(st, seal, &k.recs[k.n], kvs[i].rev);
            if (w >= 0)
                log_warn("%s: re-sealed under secrets key %s", kvs[i].key, seal->keys[0].kid);
            else if (w != -ESTALE)
                log_error("%s: cannot re-seal: %s", kvs[i].key, strerror(-w));
        }
        k.n++;
    }
    store_kv_free(kvs, n);
    if (bad == 0)
        *kr = k;
    sodium_memzero(&k, sizeof k);
    return bad < 0 ? -EBADMSG : 0;
}

static int key_new(store_t *st, const seal_keys_t *seal, int64_t now, int64_t activate)
{
    char hex[17], kid[CAP_KID_MAX];
    random_hex(hex, 8);
    (void)snprintf(kid, sizeof kid, "k-%s", hex);
    cap_keyrec_t k = { .created = now, .activate = activate };
    int r = cap_key_generate(kid, &k.key);
    if (r >= 0)
        r = keyrec_put(st, seal, &k, STORE_REV_ABSENT);
    sodium_memzero(&k, sizeof k);
    return r;
}

int keys_ensure(store_t *st, const seal_keys_t *seal, uint64_t publish_delay_ms)
{
    keyring_t kr;
    int r = keys_load(st, seal, &kr);
    (void)publish_delay_ms;
    if (r < 0)
        return r;
    bool have = kr.n > 0;
    sodium_memzero(&kr, sizeof kr);
    if (have)
        return 0;
    int64_t now = (int64_t)time(NULL);
    return key_new(st, seal, now, now); /* no node can hold a capability yet: usable at once */
}

/* Publish a new key now, sign with it after the delay, retire the current signer then, and
 * delete records whose capabilities have all expired. */
int keys_rotate(store_t *st, const seal_keys_t *seal, uint64_t publish_delay_ms)
{
    keyring_t kr;
    int r = keys_load(st, seal, &kr);
    if (r < 0)
        return r;
    int64_t now = (int64_t)time(NULL), activate = now + (int64_t)((publish_delay_ms + 999) / 1000);
    for (size_t i = 0; i < kr.n; i++) {
        char key[64];
        (void)snprintf(key, sizeof key, "signing-keys/%s", kr.recs[i].key.kid);
        if (cap_rotation_expired(&kr.recs[i], now)) {
            (void)store_del(st, key, STORE_REV_ANY);
            continue;
        }
        if (kr.recs[i].retired == 0) {
            kr.recs[i].retired = activate;
            store_kv_t kv;
            if (store_get(st, key, &kv) == 0) {
                (void)keyrec_put(st, seal, &kr.recs[i], kv.rev);
                store_kv_clear(&kv);
            }
        }
    }
    sodium_memzero(&kr, sizeof kr);
    return key_new(st, seal, now, activate);
}

int keys_sign(const keyring_t *kr, cap_t *c, char *out, size_t cap)
{
    int64_t now = (int64_t)time(NULL);
    const cap_keyrec_t *k = cap_rotation_signer(kr->recs, kr->n, now);
    if (!k)
        return -ENOKEY;
    c->iat = now;
    c->exp = now + CAP_LIFETIME_S;
    return cap_sign(&k->key, c, out, cap);
}

int keys_sign_reuse(const keyring_t *kr, cap_signcache_t *sc, cap_t *c, char *out, size_t cap)
{
    int64_t now = (int64_t)time(NULL);
    const cap_keyrec_t *k = cap_rotation_signer(kr->recs, kr->n, now);
    if (!k)
        return -ENOKEY;
    return cap_sign_reuse(sc, &k->key, c, now, out, cap);
}

/* ---- the control plane's identity and the signed key set ------------------------------------ */

/* <state>/identity.key: base64url of the Ed25519 secret key (seed || public key), 0600, made
 * by the first control process that starts on this state directory (O_EXCL: replicas sharing
 * the directory all read the one that won). */
static int identity_read(const char *path, cap_identity_t *ret)
{
    char text[256];
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return negative_errno();
    struct stat st;
    if (fstat(fd, &st) < 0)
        return negative_errno();
    if ((st.st_mode & 077) != 0 || !S_ISREG(st.st_mode)) {
        log_error("%s: the identity key must be a regular file of mode 0600", path);
        return -EPERM;
    }
    ssize_t k = read(fd, text, sizeof text - 1);
    if (k <= 0)
        return k < 0 ? negative_errno() : -ENODATA;
    while (k > 0 && (text[k - 1] == '\n' || text[k - 1] == ' '))
        k--;
    text[k] = 0;
    cap_identity_t id;
    int r = unb64(text, id.sk, CAP_SK_BYTES);
    sodium_memzero(text, sizeof text);
    if (r < 0)
        return -ENODATA;
    memcpy(id.pk, id.sk + 32, CAP_PK_BYTES); /* libsodium: sk = seed || pk */
    *ret = id;
    sodium_memzero(&id, sizeof id);
    return 0;
}

int identity_load_or_create(const char *state_dir, cap_identity_t *ret)
{
    char path[PATH_MAX + 32];
    (void)snprintf(path, sizeof path, "%s/identity.key", state_dir);
    int r = identity_read(path, ret);
    if (r != -ENOENT) {
        for (int i = 0; r == -ENODATA && i < 50; i++) { /* another replica is writing it */
            struct timespec ts = { 0, 20 * 1000 * 1000 };
            nanosleep(&ts, NULL);
            r = identity_read(path, ret);
        }
        return r;
    }
    cap_identity_t id;
    if (sodium_init() < 0 || crypto_sign_keypair(id.pk, id.sk) != 0)
        return -EIO;
    char text[160];
    b64(id.sk, CAP_SK_BYTES, text, sizeof text);
    size_t len = strlen(text);
    text[len++] = '\n';
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        sodium_memzero(text, sizeof text);
        sodium_memzero(&id, sizeof id);
        return errno == EEXIST ? identity_load_or_create(state_dir, ret) : negative_errno();
    }
    r = write(fd, text, len) == (ssize_t)len && fsync(fd) == 0 ? 0 : -EIO;
    safe_close(fd);
    sodium_memzero(text, sizeof text);
    if (r == 0) {
        *ret = id;
        log_info("created the control plane's identity key %s (mode 0600)", path);
    }
    sodium_memzero(&id, sizeof id);
    return r;
}

int identity_pk_b64(const cap_identity_t *id, char *out, size_t cap)
{
    return b64(id->pk, CAP_PK_BYTES, out, cap);
}

/* The key set version (store key meta/keyset: {"version": N, "kids": "k1,k2"}): bumped by
 * compare-and-swap whenever the set nodes must hold changes (a rotation publishes a key, a
 * retired key's last capability expires), so it only ever goes up, and every control process
 * that agrees on the set signs the very same bytes for it. */
int keys_signed_set(store_t *st, const keyring_t *kr, const cap_identity_t *id, int64_t now_s,
                    char *out, size_t cap, uint64_t *ret_version)
{
    cap_pubkey_t pub[CAP_KEYSET_MAX];
    size_t n = cap_rotation_verify_set(kr->recs, kr->n, now_s, pub, CAP_KEYSET_MAX);
    if (n == 0)
        return -ENOKEY;
    char kids[CAP_KEYSET_MAX * CAP_KID_MAX + 8] = "";
    size_t kl = 0;
    for (size_t i = 0; i < n; i++) { /* ids are < CAP_KID_MAX: it fits */
        int w = snprintf(kids + kl, sizeof kids - kl, "%s%s", i ? "," : "", pub[i].kid);
        if (w < 0 || (size_t)w >= sizeof kids - kl)
            return -ENOBUFS;
        kl += (size_t)w;
    }
    for (int attempt = 0; attempt < 8; attempt++) {
        store_kv_t kv;
        uint64_t version = 0;
        int64_t rev = STORE_REV_ABSENT;
        const char *have = "";
        json_t *j = NULL;
        if (store_get(st, "meta/keyset", &kv) == 0) {
            j = json_loadb(kv.value, kv.value_len, 0, NULL);
            rev = kv.rev;
            store_kv_clear(&kv);
            json_int_t v = json_integer_value(json_object_get(j, "version"));
            version = v > 0 ? (uint64_t)v : 0;
            const char *k = json_string_value(json_object_get(j, "kids"));
            have = k ? k : "";
        }
        bool same = version > 0 && streq(have, kids);
        json_decref(j);
        if (same) {
            *ret_version = version;
            return cap_keyset_sign(id, version, pub, n, out, cap);
        }
        json_t *nj = json_pack("{s:I,s:s}", "version", (json_int_t)(version + 1), "kids", kids);
        char *v = nj ? json_dumps(nj, JSON_COMPACT) : NULL;
        json_decref(nj);
        int r = v ? store_cas(st, "meta/keyset", v, strlen(v), rev, NULL) : -ENOMEM;
        free(v);
        if (r < 0 && r != -ESTALE && r != -EEXIST)
            return r;
        if (r >= 0)
            log_info("key set version %llu: %s", (unsigned long long)(version + 1), kids);
    }
    return -EAGAIN;
}
