/* SPDX-License-Identifier: MIT */
/* Run-bound capabilities (cap.h): the canonical payload, Ed25519 signing and verification, the
 * node's comparison and the control plane's key rotation policy.
 *
 * Payload, version 2 (all integers big-endian, strings as a u8 length and that many bytes,
 * no terminator):
 *
 *   "SBXC" 0x02  kid  sandbox  generation:u64  node  substrate  activation  instance
 *   access:u32  port:u16  proto:u8  iat:i64  exp:i64  method  target:32  flags:u8
 *   [body:32 if flags & 1]  [nonce:16 if flags & 2]
 *
 * Decoding accepts exactly what encoding produces: the same validation runs on both sides and
 * the decoder refuses trailing bytes, so decode(p) succeeds iff encode(decode(p)) == p. The
 * signature covers exactly these payload bytes; nothing is signed that was not decoded.
 *
 * The verify + compare path allocates nothing and copies little; Ed25519 dominates its cost. */
#include "cap/cap.h"

#include <errno.h>
#include <sodium.h>
#include <string.h>

#define CAP_MAGIC "SBXC"
#define CAP_MAGIC_LEN 4
#define CAP_VERSION 2
#define CAP_WIRE_PREFIX "v2."
#define CAP_WIRE_PREFIX_LEN 3
#define CAP_SIG_BYTES 64
#define CAP_B64_VARIANT sodium_base64_VARIANT_URLSAFE_NO_PADDING
/* base64url (no padding) of the largest payload and of a signature, with the NUL */
#define CAP_PAYLOAD_B64_MAX sodium_base64_ENCODED_LEN(CAP_PAYLOAD_MAX, CAP_B64_VARIANT)
#define CAP_SIG_B64_LEN (sodium_base64_ENCODED_LEN(CAP_SIG_BYTES, CAP_B64_VARIANT) - 1)

_Static_assert(CAP_SIG_BYTES == crypto_sign_BYTES, "Ed25519 signature size");
_Static_assert(CAP_PK_BYTES == crypto_sign_PUBLICKEYBYTES, "Ed25519 public key size");
_Static_assert(CAP_SK_BYTES == crypto_sign_SECRETKEYBYTES, "Ed25519 secret key size");
_Static_assert(CAP_ID_MAX - 1 <= UINT8_MAX && CAP_KID_MAX - 1 <= UINT8_MAX, "u8 lengths");
#define CAP_FLAG_BODY 1u
#define CAP_FLAG_NONCE 2u
/* magic, version, kid, five ids, generation, access, port, proto, iat, exp, method, target,
 * flags, body, nonce */
_Static_assert(CAP_MAGIC_LEN + 1 + CAP_KID_MAX + 5 * CAP_ID_MAX + 8 + 4 + 2 + 1 + 8 + 8 +
                       CAP_METHOD_MAX + CAP_DIGEST_BYTES + 1 + CAP_DIGEST_BYTES + CAP_NONCE_BYTES <=
                   CAP_PAYLOAD_MAX,
               "the largest payload fits CAP_PAYLOAD_MAX");
_Static_assert(CAP_WIRE_PREFIX_LEN + CAP_PAYLOAD_B64_MAX + CAP_SIG_B64_LEN + 1 <= CAP_WIRE_MAX,
               "the largest wire form fits CAP_WIRE_MAX");

/* ---- validation ---------------------------------------------------------------------------- */

static bool id_char(unsigned char ch, bool colon)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '.' || ch == '_' || ch == '-' || (colon && ch == ':');
}

/* 1..max-1 bytes of the id charset (':' only where colon), NUL-terminated within max. */
static bool str_valid(const char *s, size_t max, bool colon)
{
    if (!s)
        return false;
    size_t n = strnlen(s, max);
    if (n == 0 || n >= max)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!id_char((unsigned char)s[i], colon))
            return false;
    return true;
}

bool cap_id_valid(const char *s) { return str_valid(s, CAP_ID_MAX, true); }

static bool kid_valid(const char *s) { return str_valid(s, CAP_KID_MAX, false); }

/* Both NUL-terminated within CAP_KID_MAX (validated), so the bound never cuts a difference. */
static bool kid_eq(const char *a, const char *b) { return strncmp(a, b, CAP_KID_MAX) == 0; }

static bool run_valid(const cap_run_t *r)
{
    return cap_id_valid(r->sandbox) && r->generation >= 1 && cap_id_valid(r->node) &&
           cap_id_valid(r->substrate) && cap_id_valid(r->activation) && cap_id_valid(r->instance);
}

static bool method_valid(const char *s, size_t n)
{
    if (n == 0 || n >= CAP_METHOD_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] < 'A' || s[i] > 'Z')
            return false;
    return true;
}

/* Everything cap_encode requires of a capability (and so everything cap_decode checks). */
static bool cap_valid(const cap_t *c)
{
    if (!kid_valid(c->kid) || !run_valid(&c->run))
        return false;
    if (!method_valid(c->method, strnlen(c->method, CAP_METHOD_MAX)))
        return false;
    /* manage: the body and a single-use id, always; the id with nothing else */
    bool manage = (c->access & CAP_MANAGE) != 0;
    if (c->has_nonce != manage || (manage && !c->has_body))
        return false;
    if (c->access == 0 || (c->access & ~(uint32_t)CAP_ACCESS_ALL) != 0)
        return false;
    if (c->access & CAP_PROXY) {
        if (c->port == 0 || (c->proto != CAP_PROTO_HTTP && c->proto != CAP_PROTO_WEBSOCKET))
            return false;
    } else if (c->port != 0 || c->proto != CAP_PROTO_NONE) {
        return false;
    }
    /* both positive, so exp - iat cannot overflow */
    return c->iat > 0 && c->exp > 0 && c->iat < c->exp && c->exp - c->iat <= CAP_LIFETIME_S;
}

/* ---- encoding ------------------------------------------------------------------------------ */

typedef struct {
    uint8_t *p;
    size_t len, cap;
    bool overflow;
} wr_t;

static void put(wr_t *w, const void *src, size_t n)
{
    if (w->overflow || n > w->cap - w->len) {
        w->overflow = true;
        return;
    }
    memcpy(w->p + w->len, src, n);
    w->len += n;
}

static void put_be(wr_t *w, uint64_t v, size_t bytes)
{
    uint8_t b[8];
    for (size_t i = 0; i < bytes; i++)
        b[i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
    put(w, b, bytes);
}

static void put_str(wr_t *w, const char *s, size_t max)
{
    size_t n = strnlen(s, max); /* validated: 1..max-1 */
    put_be(w, n, 1);
    put(w, s, n);
}

int cap_encode(const cap_t *c, uint8_t *out, size_t cap)
{
    if (!c || !cap_valid(c))
        return -EINVAL;
    wr_t w = { .p = out, .cap = out ? cap : 0 };
    put(&w, CAP_MAGIC, CAP_MAGIC_LEN);
    put_be(&w, CAP_VERSION, 1);
    put_str(&w, c->kid, CAP_KID_MAX);
    put_str(&w, c->run.sandbox, CAP_ID_MAX);
    put_be(&w, c->run.generation, 8);
    put_str(&w, c->run.node, CAP_ID_MAX);
    put_str(&w, c->run.substrate, CAP_ID_MAX);
    put_str(&w, c->run.activation, CAP_ID_MAX);
    put_str(&w, c->run.instance, CAP_ID_MAX);
    put_be(&w, c->access, 4);
    put_be(&w, c->port, 2);
    put_be(&w, (uint64_t)c->proto, 1);
    put_be(&w, (uint64_t)c->iat, 8);
    put_be(&w, (uint64_t)c->exp, 8);
    put_str(&w, c->method, CAP_METHOD_MAX);
    put(&w, c->target, CAP_DIGEST_BYTES);
    put_be(&w, (c->has_body ? CAP_FLAG_BODY : 0) | (c->has_nonce ? CAP_FLAG_NONCE : 0), 1);
    if (c->has_body)
        put(&w, c->body, CAP_DIGEST_BYTES);
    if (c->has_nonce)
        put(&w, c->nonce, CAP_NONCE_BYTES);
    if (w.overflow)
        return -ENOBUFS;
    return (int)w.len;
}

/* ---- decoding ------------------------------------------------------------------------------ */

typedef struct {
    const uint8_t *p;
    size_t len, off;
    bool bad;
} rd_t;

static const uint8_t *take(rd_t *r, size_t n)
{
    if (r->bad || n > r->len - r->off) {
        r->bad = true;
        return NULL;
    }
    const uint8_t *s = r->p + r->off;
    r->off += n;
    return s;
}

static uint64_t get_be(rd_t *r, size_t bytes)
{
    const uint8_t *b = take(r, bytes);
    uint64_t v = 0;
    for (size_t i = 0; b && i < bytes; i++)
        v = (v << 8) | b[i];
    return v;
}

/* A u8 length and that many bytes into dst (capacity max, NUL-terminated). The characters are
 * checked afterwards by cap_valid; an embedded NUL makes the string shorter than its length
 * byte says, so it is refused here. */
static void get_str(rd_t *r, char *dst, size_t max)
{
    size_t n = (size_t)get_be(r, 1);
    if (r->bad || n == 0 || n >= max) {
        r->bad = true;
        return;
    }
    const uint8_t *s = take(r, n);
    if (!s || memchr(s, '\0', n)) {
        r->bad = true;
        return;
    }
    memcpy(dst, s, n);
    dst[n] = '\0';
}

int cap_decode(const uint8_t *p, size_t len, cap_t *ret)
{
    if (!p || !ret || len > CAP_PAYLOAD_MAX)
        return -EINVAL;
    rd_t r = { .p = p, .len = len };
    cap_t c;
    memset(&c, 0, sizeof c);

    const uint8_t *magic = take(&r, CAP_MAGIC_LEN);
    if (!magic || memcmp(magic, CAP_MAGIC, CAP_MAGIC_LEN) != 0 || get_be(&r, 1) != CAP_VERSION)
        return -EINVAL;
    get_str(&r, c.kid, CAP_KID_MAX);
    get_str(&r, c.run.sandbox, CAP_ID_MAX);
    c.run.generation = get_be(&r, 8);
    get_str(&r, c.run.node, CAP_ID_MAX);
    get_str(&r, c.run.substrate, CAP_ID_MAX);
    get_str(&r, c.run.activation, CAP_ID_MAX);
    get_str(&r, c.run.instance, CAP_ID_MAX);
    c.access = (uint32_t)get_be(&r, 4);
    c.port = (uint16_t)get_be(&r, 2);
    uint64_t proto = get_be(&r, 1);
    c.iat = (int64_t)get_be(&r, 8);
    c.exp = (int64_t)get_be(&r, 8);
    get_str(&r, c.method, CAP_METHOD_MAX);
    const uint8_t *d = take(&r, CAP_DIGEST_BYTES);
    if (d)
        memcpy(c.target, d, CAP_DIGEST_BYTES);
    uint64_t flags = get_be(&r, 1);
    if (flags & ~(uint64_t)(CAP_FLAG_BODY | CAP_FLAG_NONCE))
        return -EINVAL;
    c.has_body = (flags & CAP_FLAG_BODY) != 0;
    c.has_nonce = (flags & CAP_FLAG_NONCE) != 0;
    if (c.has_body && (d = take(&r, CAP_DIGEST_BYTES)))
        memcpy(c.body, d, CAP_DIGEST_BYTES);
    if (c.has_nonce && (d = take(&r, CAP_NONCE_BYTES)))
        memcpy(c.nonce, d, CAP_NONCE_BYTES);
    if (r.bad || r.off != r.len || proto > CAP_PROTO_MAX)
        return -EINVAL;
    c.proto = (cap_proto_t)proto;
    if (!cap_valid(&c))
        return -EINVAL;
    *ret = c;
    return 0;
}

/* ---- keys and signing ---------------------------------------------------------------------- */

static int sodium_ready(void) { return sodium_init() < 0 ? -EIO : 0; }

int cap_key_generate(const char *kid, cap_signkey_t *ret)
{
    if (!kid_valid(kid) || !ret)
        return -EINVAL;
    if (sodium_ready() < 0)
        return -EIO;
    cap_signkey_t k;
    memset(&k, 0, sizeof k);
    memcpy(k.kid, kid, strlen(kid)); /* kid_valid: shorter than CAP_KID_MAX */
    if (crypto_sign_keypair(k.pk, k.sk) != 0) {
        sodium_memzero(&k, sizeof k);
        return -EIO;
    }
    *ret = k;
    sodium_memzero(&k, sizeof k);
    return 0;
}

int cap_sign(const cap_signkey_t *key, const cap_t *c, char *out, size_t cap)
{
    if (!key || !c || !out || !kid_valid(key->kid))
        return -EINVAL;
    if (sodium_ready() < 0)
        return -EIO;
    cap_t k = *c;
    memset(k.kid, 0, sizeof k.kid);
    memcpy(k.kid, key->kid, strlen(key->kid)); /* kid_valid: shorter than CAP_KID_MAX */

    uint8_t payload[CAP_PAYLOAD_MAX], sig[CAP_SIG_BYTES];
    int n = cap_encode(&k, payload, sizeof payload);
    if (n < 0)
        return n;
    size_t b64p = sodium_base64_ENCODED_LEN((size_t)n, CAP_B64_VARIANT) - 1;
    size_t total = CAP_WIRE_PREFIX_LEN + b64p + 1 + CAP_SIG_B64_LEN; /* at most CAP_WIRE_MAX */
    if (total + 1 > cap)
        return -ENOBUFS;
    if (crypto_sign_detached(sig, NULL, payload, (size_t)n, key->sk) != 0)
        return -EIO;

    char *o = out;
    memcpy(o, CAP_WIRE_PREFIX, CAP_WIRE_PREFIX_LEN);
    o += CAP_WIRE_PREFIX_LEN;
    sodium_bin2base64(o, b64p + 1, payload, (size_t)n, CAP_B64_VARIANT);
    o += b64p;
    *o++ = '.';
    sodium_bin2base64(o, CAP_SIG_B64_LEN + 1, sig, sizeof sig, CAP_B64_VARIANT);
    return (int)total;
}

int cap_keyset_set(cap_keyset_t *ks, const cap_pubkey_t *keys, size_t n)
{
    if (!ks || n > CAP_KEYSET_MAX || (n > 0 && !keys))
        return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        if (!kid_valid(keys[i].kid))
            return -EINVAL;
        for (size_t j = 0; j < i; j++)
            if (kid_eq(keys[i].kid, keys[j].kid))
                return -EINVAL;
    }
    cap_pubkey_t tmp[CAP_KEYSET_MAX]; /* keys may point into ks */
    memset(tmp, 0, sizeof tmp);
    if (n > 0)
        memcpy(tmp, keys, n * sizeof *keys);
    memcpy(ks->keys, tmp, sizeof tmp);
    ks->n = n;
    return 0;
}

const cap_pubkey_t *cap_keyset_find(const cap_keyset_t *ks, const char *kid)
{
    if (!ks || !kid)
        return NULL;
    for (size_t i = 0; i < ks->n && i < CAP_KEYSET_MAX; i++)
        if (kid_eq(ks->keys[i].kid, kid))
            return &ks->keys[i];
    return NULL;
}

/* ---- verification -------------------------------------------------------------------------- */

const char *cap_reason_str(cap_reason_t r)
{
    switch (r) {
    case CAP_OK: return "ok";
    case CAP_E_MALFORMED: return "malformed";
    case CAP_E_UNKNOWN_KEY: return "unknown_key";
    case CAP_E_SIGNATURE: return "signature";
    case CAP_E_NOT_YET: return "not_yet";
    case CAP_E_EXPIRED: return "expired";
    case CAP_E_SANDBOX: return "sandbox";
    case CAP_E_PURPOSE: return "purpose";
    case CAP_E_PORT: return "port";
    case CAP_E_PROTOCOL: return "protocol";
    case CAP_E_STALE_RUN: return "stale_run";
    case CAP_E_NO_RUN: return "no_run";
    case CAP_E_REQUEST: return "request";
    case CAP_E_BODY: return "body";
    case CAP_E_REPLAY: return "replay";
    }
    return "unknown";
}

/* Strict base64url without padding: sodium refuses padding, characters outside the alphabet
 * (no ignore set, so whitespace too) and lengths of 4k+1; re-encoding also refuses non-zero
 * trailing bits, so each byte string has exactly one accepted text. */
static bool b64_decode_strict(const char *s, size_t n, uint8_t *out, size_t max, size_t *ret)
{
    char again[sodium_base64_ENCODED_LEN(CAP_WIRE_MAX, CAP_B64_VARIANT)]; /* payloads, key sets */
    size_t len = 0;
    if (n == 0 || n >= sizeof again)
        return false;
    if (sodium_base642bin(out, max, s, n, NULL, &len, NULL, CAP_B64_VARIANT) != 0)
        return false;
    if (sodium_base64_ENCODED_LEN(len, CAP_B64_VARIANT) - 1 != n)
        return false;
    sodium_bin2base64(again, sizeof again, out, len, CAP_B64_VARIANT);
    if (memcmp(again, s, n) != 0)
        return false;
    *ret = len;
    return true;
}

/* Whether now >= t + d (d >= 0), exactly, without overflow: past the end of int64_t, never. */
static bool reached(int64_t now, int64_t t, int64_t d)
{
    return t <= INT64_MAX - d && now >= t + d;
}

/* iat > now + skew, and now >= exp + skew, without overflow (iat and exp are positive) */
static cap_reason_t check_time(const cap_t *c, int64_t now)
{
    if (c->iat - CAP_SKEW_S > now)
        return CAP_E_NOT_YET;
    if (reached(now, c->exp, CAP_SKEW_S))
        return CAP_E_EXPIRED;
    return CAP_OK;
}

cap_reason_t cap_verify(const cap_keyset_t *ks, const char *wire, size_t len, int64_t now,
                        cap_t *ret)
{
    if (!wire || len > CAP_WIRE_MAX || len < CAP_WIRE_PREFIX_LEN ||
        memcmp(wire, CAP_WIRE_PREFIX, CAP_WIRE_PREFIX_LEN) != 0)
        return CAP_E_MALFORMED;
    const char *body = wire + CAP_WIRE_PREFIX_LEN;
    size_t body_len = len - CAP_WIRE_PREFIX_LEN;
    const char *dot = memchr(body, '.', body_len);
    if (!dot)
        return CAP_E_MALFORMED;
    size_t plen = (size_t)(dot - body), slen = body_len - plen - 1;

    uint8_t payload[CAP_PAYLOAD_MAX], sig[CAP_SIG_BYTES];
    size_t n = 0, sn = 0;
    if (slen != CAP_SIG_B64_LEN || !b64_decode_strict(body, plen, payload, sizeof payload, &n) ||
        !b64_decode_strict(dot + 1, slen, sig, sizeof sig, &sn) || sn != sizeof sig)
        return CAP_E_MALFORMED;
    cap_t c;
    if (cap_decode(payload, n, &c) < 0)
        return CAP_E_MALFORMED;

    const cap_pubkey_t *pk = cap_keyset_find(ks, c.kid);
    if (!pk)
        return CAP_E_UNKNOWN_KEY;
    /* fail closed if the library cannot start */
    if (sodium_ready() < 0 || crypto_sign_verify_detached(sig, payload, n, pk->pk) != 0)
        return CAP_E_SIGNATURE;

    cap_reason_t why = check_time(&c, now);
    if (why != CAP_OK)
        return why;
    if (ret)
        *ret = c;
    return CAP_OK;
}

/* ---- one signature per request shape -------------------------------------------------------- */

/* FNV-1a: picks a slot; a hit is always confirmed by comparing every byte. */
static uint64_t fnv1a(const void *p, size_t n)
{
    const uint8_t *b = p;
    uint64_t h = UINT64_C(14695981039346656037);
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * UINT64_C(1099511628211);
    return h;
}

int cap_sign_reuse(cap_signcache_t *sc, const cap_signkey_t *key, cap_t *c, int64_t now, char *out,
                   size_t cap)
{
    if (!sc || !key || !c || !kid_valid(key->kid) || now <= 0 || now > INT64_MAX - CAP_LIFETIME_S)
        return -EINVAL;
    if (c->has_nonce) { /* single-use: never presented twice */
        c->iat = now;
        c->exp = now + CAP_LIFETIME_S;
        return cap_sign(key, c, out, cap);
    }
    /* the shape: the payload as signed by key, with a fixed time */
    cap_t k = *c;
    memset(k.kid, 0, sizeof k.kid);
    memcpy(k.kid, key->kid, strlen(key->kid));
    k.iat = 1;
    k.exp = 2;
    uint8_t shape[CAP_PAYLOAD_MAX];
    int kn = cap_encode(&k, shape, sizeof shape);
    if (kn < 0)
        return kn;
    uint64_t h = fnv1a(shape, (size_t)kn);
    __typeof__(sc->slot[0]) *s = &sc->slot[h % CAP_CACHE_SLOTS];
    if (s->wire_len > 0 && s->hash == h && s->key_len == (size_t)kn &&
        memcmp(s->key, shape, (size_t)kn) == 0 && s->iat <= now && now - s->iat < CAP_REUSE_S) {
        if (s->wire_len + 1 > cap)
            return -ENOBUFS;
        memcpy(out, s->wire, s->wire_len + 1);
        c->iat = s->iat;
        c->exp = s->iat + CAP_LIFETIME_S;
        return (int)s->wire_len;
    }
    c->iat = now;
    c->exp = now + CAP_LIFETIME_S;
    int n = cap_sign(key, c, out, cap);
    if (n < 0 || (size_t)n >= sizeof s->wire)
        return n;
    s->hash = h;
    s->key_len = (size_t)kn;
    memcpy(s->key, shape, (size_t)kn);
    s->wire_len = (size_t)n; /* n < CAP_WIRE_MAX: cap_sign wrote it and its NUL into out */
    memcpy(s->wire, out, (size_t)n + 1);
    s->iat = now;
    return n;
}

cap_reason_t cap_verify_reuse(cap_verifycache_t *vc, const cap_keyset_t *ks, const char *wire,
                              size_t len, int64_t now, cap_t *ret)
{
    if (!vc || !wire || len >= CAP_WIRE_MAX)
        return cap_verify(ks, wire, len, now, ret);
    uint64_t h = fnv1a(wire, len);
    __typeof__(vc->slot[0]) *s = &vc->slot[h % CAP_CACHE_SLOTS];
    if (s->len == len && s->hash == h && memcmp(s->wire, wire, len) == 0) {
        /* these exact bytes verified under this key: valid while ks still holds that key */
        const cap_pubkey_t *pk = cap_keyset_find(ks, s->cap.kid);
        if (pk && sodium_memcmp(pk->pk, s->pk, CAP_PK_BYTES) == 0) {
            cap_reason_t why = check_time(&s->cap, now);
            if (why == CAP_OK && ret)
                *ret = s->cap;
            return why;
        }
    }
    cap_t c;
    cap_reason_t why = cap_verify(ks, wire, len, now, &c);
    if (why != CAP_OK)
        return why;
    const cap_pubkey_t *pk = cap_keyset_find(ks, c.kid);
    if (!c.has_nonce && pk) { /* a single-use capability is never presented twice */
        s->hash = h;
        s->len = len;
        memcpy(s->pk, pk->pk, CAP_PK_BYTES);
        s->cap = c;
        memcpy(s->wire, wire, len);
    }
    if (ret)
        *ret = c;
    return CAP_OK;
}

/* ---- the node's comparison ----------------------------------------------------------------- */

const char *cap_verdict_str(cap_verdict_t v)
{
    switch (v) {
    case CAP_ALLOW: return "Allow";
    case CAP_REFRESH_ROUTE: return "RefreshRoute";
    case CAP_DENY: return "Deny";
    }
    return "Deny";
}

/* Ids are NUL-terminated within CAP_ID_MAX, so the bound never hides a difference and a
 * malformed (unterminated) id is never read past its array. */
static bool id_eq(const char *a, const char *b) { return strncmp(a, b, CAP_ID_MAX) == 0; }

bool cap_run_equal(const cap_run_t *a, const cap_run_t *b)
{
    return a->generation == b->generation && id_eq(a->sandbox, b->sandbox) &&
           id_eq(a->node, b->node) && id_eq(a->substrate, b->substrate) &&
           id_eq(a->activation, b->activation) && id_eq(a->instance, b->instance);
}

static cap_verdict_t verdict(cap_verdict_t v, cap_reason_t r, cap_reason_t *ret_reason)
{
    if (ret_reason)
        *ret_reason = r;
    return v;
}

cap_verdict_t cap_compare(const cap_t *c, const cap_request_t *rq, cap_reason_t *ret_reason)
{
    if (!c || !rq || !rq->sandbox || !id_eq(c->run.sandbox, rq->sandbox))
        return verdict(CAP_DENY, CAP_E_SANDBOX, ret_reason);

    /* the one request it was issued for: method, then the target's digest */
    uint8_t td[CAP_DIGEST_BYTES];
    if (!rq->method || !rq->target || rq->method_len != strnlen(c->method, CAP_METHOD_MAX) ||
        memcmp(rq->method, c->method, rq->method_len) != 0)
        return verdict(CAP_DENY, CAP_E_REQUEST, ret_reason);
    cap_digest(rq->target, rq->target_len, td);
    if (sodium_memcmp(td, c->target, sizeof td) != 0)
        return verdict(CAP_DENY, CAP_E_REQUEST, ret_reason);

    uint32_t purpose = rq->purpose;
    bool one_bit = purpose != 0 && (purpose & (purpose - 1)) == 0 &&
                   (purpose & ~(uint32_t)CAP_ACCESS_ALL) == 0;
    if (!one_bit || (c->access & purpose) == 0)
        return verdict(CAP_DENY, CAP_E_PURPOSE, ret_reason);

    bool proxy = purpose == CAP_PROXY;
    if (proxy && c->port != rq->port)
        return verdict(CAP_DENY, CAP_E_PORT, ret_reason);
    if (proxy && c->proto != rq->proto)
        return verdict(CAP_DENY, CAP_E_PROTOCOL, ret_reason);

    /* The sender addressed the right sandbox with a valid capability, but for another run
     * than the one here (or none): its route is stale, not its authority. */
    if (!rq->installed)
        return verdict(CAP_REFRESH_ROUTE, CAP_E_NO_RUN, ret_reason);
    if (!cap_run_equal(&c->run, rq->installed))
        return verdict(CAP_REFRESH_ROUTE, CAP_E_STALE_RUN, ret_reason);

    if (proxy) {
        bool port_seen = false;
        for (size_t i = 0; rq->expose && i < rq->n_expose; i++) {
            if (rq->expose[i].port != c->port)
                continue;
            if (rq->expose[i].proto == c->proto)
                return verdict(CAP_ALLOW, CAP_OK, ret_reason);
            port_seen = true;
        }
        return verdict(CAP_DENY, port_seen ? CAP_E_PROTOCOL : CAP_E_PORT, ret_reason);
    }
    return verdict(CAP_ALLOW, CAP_OK, ret_reason);
}

/* ---- request binding ------------------------------------------------------------------------ */

void cap_digest(const void *p, size_t n, uint8_t out[CAP_DIGEST_BYTES])
{
    _Static_assert(CAP_DIGEST_BYTES == crypto_hash_sha256_BYTES, "SHA-256 size");
    crypto_hash_sha256(out, p ? p : (const void *)"", p ? n : 0);
}

int cap_bind_request(cap_t *c, const char *method, size_t method_len, const char *target,
                     size_t target_len, const void *body, size_t body_len)
{
    if (!c || !method || !target || !method_valid(method, method_len))
        return -EINVAL;
    if (sodium_ready() < 0)
        return -EIO;
    memset(c->method, 0, sizeof c->method);
    memcpy(c->method, method, method_len);
    cap_digest(target, target_len, c->target);
    c->has_body = body != NULL;
    memset(c->body, 0, sizeof c->body);
    if (body)
        cap_digest(body, body_len, c->body);
    c->has_nonce = (c->access & CAP_MANAGE) != 0;
    memset(c->nonce, 0, sizeof c->nonce);
    if (c->has_nonce)
        randombytes_buf(c->nonce, sizeof c->nonce);
    return 0;
}

bool cap_body_matches(const cap_t *c, const void *body, size_t n)
{
    uint8_t d[CAP_DIGEST_BYTES];
    if (!c || !c->has_body)
        return false;
    cap_digest(body, n, d);
    return sodium_memcmp(d, c->body, sizeof d) == 0;
}

/* ---- single-use ids ------------------------------------------------------------------------ */

cap_reason_t cap_replay_use(cap_replay_t *t, const cap_t *c, int64_t now)
{
    if (!t || !c || !c->has_nonce)
        return CAP_E_MALFORMED;
    size_t k = 0;
    bool seen = false;
    /* drop the expired ones while looking (compacting in place) */
    for (size_t i = 0; i < t->n && i < CAP_REPLAY_SLOTS; i++) {
        if (now >= t->slots[i].until)
            continue;
        if (sodium_memcmp(t->slots[i].nonce, c->nonce, CAP_NONCE_BYTES) == 0)
            seen = true;
        t->slots[k++] = t->slots[i];
    }
    t->n = k;
    if (seen || t->n >= CAP_REPLAY_SLOTS)
        return CAP_E_REPLAY;
    memcpy(t->slots[t->n].nonce, c->nonce, CAP_NONCE_BYTES);
    t->slots[t->n].until = c->exp <= INT64_MAX - CAP_SKEW_S ? c->exp + CAP_SKEW_S : INT64_MAX;
    t->n++;
    return CAP_OK;
}

/* ---- signed key sets ----------------------------------------------------------------------- */

#define KS_MAGIC "SBXK"
#define KS_VERSION 1
#define KS_PAYLOAD_MAX (CAP_MAGIC_LEN + 1 + 8 + 1 + CAP_KEYSET_MAX * (CAP_KID_MAX + CAP_PK_BYTES))
_Static_assert(sodium_base64_ENCODED_LEN(KS_PAYLOAD_MAX, CAP_B64_VARIANT) + 1 + CAP_SIG_B64_LEN <=
                   CAP_KEYSET_WIRE_MAX,
               "the largest signed key set fits CAP_KEYSET_WIRE_MAX");

static int keyset_encode(uint64_t version, const cap_pubkey_t *keys, size_t n, uint8_t *out,
                         size_t cap)
{
    cap_keyset_t tmp; /* validates ids: distinct, well formed */
    if (n == 0 || !keys || cap_keyset_set(&tmp, keys, n) < 0)
        return -EINVAL;
    wr_t w = { .p = out, .cap = cap };
    put(&w, KS_MAGIC, CAP_MAGIC_LEN);
    put_be(&w, KS_VERSION, 1);
    put_be(&w, version, 8);
    put_be(&w, n, 1);
    for (size_t i = 0; i < n; i++) {
        put_str(&w, keys[i].kid, CAP_KID_MAX);
        put(&w, keys[i].pk, CAP_PK_BYTES);
    }
    return w.overflow ? -ENOBUFS : (int)w.len;
}

int cap_keyset_sign(const cap_identity_t *id, uint64_t version, const cap_pubkey_t *keys, size_t n,
                    char *out, size_t cap)
{
    uint8_t payload[KS_PAYLOAD_MAX], sig[CAP_SIG_BYTES];
    if (!id || !out)
        return -EINVAL;
    if (sodium_ready() < 0)
        return -EIO;
    int len = keyset_encode(version, keys, n, payload, sizeof payload);
    if (len < 0)
        return len;
    size_t b64p = sodium_base64_ENCODED_LEN((size_t)len, CAP_B64_VARIANT) - 1;
    size_t total = b64p + 1 + CAP_SIG_B64_LEN;
    if (total + 1 > cap)
        return -ENOBUFS;
    if (crypto_sign_detached(sig, NULL, payload, (size_t)len, id->sk) != 0)
        return -EIO;
    sodium_bin2base64(out, b64p + 1, payload, (size_t)len, CAP_B64_VARIANT);
    out[b64p] = '.';
    sodium_bin2base64(out + b64p + 1, CAP_SIG_B64_LEN + 1, sig, sizeof sig, CAP_B64_VARIANT);
    return (int)total;
}

int cap_keyset_open(const uint8_t pk[CAP_PK_BYTES], const char *wire, size_t len,
                    uint64_t *ret_version, cap_keyset_t *ret)
{
    uint8_t payload[KS_PAYLOAD_MAX], sig[CAP_SIG_BYTES];
    size_t n = 0, sn = 0;
    if (!pk || !wire || len >= CAP_KEYSET_WIRE_MAX) /* it and a NUL fit CAP_KEYSET_WIRE_MAX */
        return -EBADMSG;
    const char *dot = memchr(wire, '.', len);
    if (!dot)
        return -EBADMSG;
    size_t plen = (size_t)(dot - wire), slen = len - plen - 1;
    if (slen != CAP_SIG_B64_LEN || !b64_decode_strict(wire, plen, payload, sizeof payload, &n) ||
        !b64_decode_strict(dot + 1, slen, sig, sizeof sig, &sn) || sn != sizeof sig)
        return -EBADMSG;
    if (sodium_ready() < 0 || crypto_sign_verify_detached(sig, payload, n, pk) != 0)
        return -EPERM;
    /* signed by the pinned identity: now decode it, strictly */
    rd_t r = { .p = payload, .len = n };
    const uint8_t *magic = take(&r, CAP_MAGIC_LEN);
    if (!magic || memcmp(magic, KS_MAGIC, CAP_MAGIC_LEN) != 0 || get_be(&r, 1) != KS_VERSION)
        return -EBADMSG;
    uint64_t version = get_be(&r, 8);
    size_t count = (size_t)get_be(&r, 1);
    if (r.bad || count == 0 || count > CAP_KEYSET_MAX)
        return -EBADMSG;
    cap_pubkey_t keys[CAP_KEYSET_MAX];
    memset(keys, 0, sizeof keys);
    for (size_t i = 0; i < count; i++) {
        get_str(&r, keys[i].kid, CAP_KID_MAX);
        const uint8_t *k = take(&r, CAP_PK_BYTES);
        if (k)
            memcpy(keys[i].pk, k, CAP_PK_BYTES);
    }
    cap_keyset_t ks;
    if (r.bad || r.off != r.len || cap_keyset_set(&ks, keys, count) < 0)
        return -EBADMSG;
    if (ret_version)
        *ret_version = version;
    if (ret)
        *ret = ks;
    return 0;
}

/* ---- signing keys over time ---------------------------------------------------------------- */

const cap_keyrec_t *cap_rotation_signer(const cap_keyrec_t *recs, size_t n, int64_t now)
{
    const cap_keyrec_t *best = NULL;
    for (size_t i = 0; recs && i < n; i++) {
        const cap_keyrec_t *r = &recs[i];
        if (r->activate > now || (r->retired != 0 && r->retired <= now))
            continue;
        /* newest: latest activation, then latest creation, then the later record */
        if (!best || r->activate > best->activate ||
            (r->activate == best->activate && r->created >= best->created))
            best = r;
    }
    return best;
}

/* A retired key stays published this long: the last capability it signed (iat < retired)
 * expires before retired + CAP_LIFETIME_S, and nodes accept it CAP_SKEW_S longer. */
static bool retired_long_enough(const cap_keyrec_t *r, int64_t now)
{
    return r->retired != 0 && reached(now, r->retired, CAP_LIFETIME_S + CAP_SKEW_S);
}

static bool in_verify_set(const cap_keyrec_t *r, int64_t now)
{
    return r->created <= now && !retired_long_enough(r, now);
}

/* Strict "a is newer than b" for the verify set's order: created, then activate, then index. */
static bool newer(const cap_keyrec_t *recs, size_t a, size_t b)
{
    if (recs[a].created != recs[b].created)
        return recs[a].created > recs[b].created;
    if (recs[a].activate != recs[b].activate)
        return recs[a].activate > recs[b].activate;
    return a > b;
}

size_t cap_rotation_verify_set(const cap_keyrec_t *recs, size_t n, int64_t now, cap_pubkey_t *out,
                               size_t max)
{
    size_t k = 0, last = SIZE_MAX;
    if (!recs || !out)
        return 0;
    /* selection in order, newest first, without allocating (n and max are small) */
    while (k < max) {
        size_t pick = SIZE_MAX;
        for (size_t i = 0; i < n; i++) {
            if (!in_verify_set(&recs[i], now))
                continue;
            if (last != SIZE_MAX && !newer(recs, last, i))
                continue;
            if (pick == SIZE_MAX || newer(recs, i, pick))
                pick = i;
        }
        if (pick == SIZE_MAX)
            break;
        memset(&out[k], 0, sizeof out[k]);
        memcpy(out[k].kid, recs[pick].key.kid, sizeof out[k].kid);
        memcpy(out[k].pk, recs[pick].key.pk, sizeof out[k].pk);
        k++;
        last = pick;
    }
    return k;
}

bool cap_rotation_expired(const cap_keyrec_t *rec, int64_t now)
{
    return rec && retired_long_enough(rec, now);
}
