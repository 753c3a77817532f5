/* SPDX-License-Identifier: MIT */
/* Signing keys (store keys signing-keys/<kid>). A new key is published to nodes first and used
 * for signing only after publish_delay, so every node already holds it when the first
 * capability signed with it arrives; the key it replaces stays in the verification set until
 * every capability it signed has expired (cap_rotation_verify_set). Signing keys live in the
 * store because every control replica signs; nodes only ever receive public keys. */
#include <sodium.h>
#include <stdio.h>
#include <time.h>

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

static int keyrec_from_json(const char *v, size_t len, cap_keyrec_t *k)
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
        if (unb64(pk, k->key.pk, CAP_PK_BYTES) == 0 && unb64(sk, k->key.sk, CAP_SK_BYTES) == 0)
            r = 0;
    }
    json_decref(j);
    return r;
}

static int keyrec_put(store_t *st, const cap_keyrec_t *k, int64_t expect)
{
    char pk[64], sk[128], key[64];
    b64(k->key.pk, CAP_PK_BYTES, pk, sizeof pk);
    b64(k->key.sk, CAP_SK_BYTES, sk, sizeof sk);
    (void)snprintf(key, sizeof key, "signing-keys/%s", k->key.kid);
    json_t *j = json_pack("{s:s,s:s,s:s,s:I,s:I,s:I}", "kid", k->key.kid, "pk", pk, "sk", sk,
                          "created", (json_int_t)k->created, "activate", (json_int_t)k->activate,
                          "retired", (json_int_t)k->retired);
    sodium_memzero(sk, sizeof sk);
    char *v = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!v)
        return -ENOMEM;
    int r = store_cas(st, key, v, strlen(v), expect, NULL);
    sodium_memzero(v, strlen(v));
    free(v);
    return r;
}

int keys_load(store_t *st, keyring_t *kr)
{
    store_kv_t *kvs;
    size_t n;
    int r = store_list(st, "signing-keys/", &kvs, &n);
    if (r < 0)
        return r;
    keyring_t k = { 0 };
    for (size_t i = 0; i < n && k.n < CTL_KEYS_MAX; i++)
        if (keyrec_from_json(kvs[i].value, kvs[i].value_len, &k.recs[k.n]) == 0)
            k.n++;
    store_kv_free(kvs, n);
    *kr = k;
    sodium_memzero(&k, sizeof k);
    return 0;
}

static int key_new(store_t *st, int64_t now, int64_t activate)
{
    char hex[17], kid[CAP_KID_MAX];
    random_hex(hex, 8);
    (void)snprintf(kid, sizeof kid, "k-%s", hex);
    cap_keyrec_t k = { .created = now, .activate = activate };
    int r = cap_key_generate(kid, &k.key);
    if (r >= 0)
        r = keyrec_put(st, &k, STORE_REV_ABSENT);
    sodium_memzero(&k, sizeof k);
    return r;
}

int keys_ensure(store_t *st, uint64_t publish_delay_ms)
{
    keyring_t kr;
    int r = keys_load(st, &kr);
    (void)publish_delay_ms;
    if (r < 0)
        return r;
    bool have = kr.n > 0;
    sodium_memzero(&kr, sizeof kr);
    if (have)
        return 0;
    int64_t now = (int64_t)time(NULL);
    return key_new(st, now, now); /* no node can hold a capability yet: usable at once */
}

/* Publish a new key now, sign with it after the delay, retire the current signer then, and
 * delete records whose capabilities have all expired. */
int keys_rotate(store_t *st, uint64_t publish_delay_ms)
{
    keyring_t kr;
    int r = keys_load(st, &kr);
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
                (void)keyrec_put(st, &kr.recs[i], kv.rev);
                store_kv_clear(&kv);
            }
        }
    }
    sodium_memzero(&kr, sizeof kr);
    return key_new(st, now, activate);
}

json_t *keys_verify_set_json(const keyring_t *kr, int64_t now_s)
{
    cap_pubkey_t pub[CAP_KEYSET_MAX];
    size_t n = cap_rotation_verify_set(kr->recs, kr->n, now_s, pub, CAP_KEYSET_MAX);
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < n; i++) {
        char pk[64];
        b64(pub[i].pk, CAP_PK_BYTES, pk, sizeof pk);
        json_array_append_new(arr, json_pack("{s:s,s:s}", "kid", pub[i].kid, "pk", pk));
    }
    return arr;
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
