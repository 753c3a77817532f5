/* SPDX-License-Identifier: MIT */
/* Run-bound capabilities: what sbx-control signs and sbx-node verifies on every request.
 *
 * A capability names one sandbox, the exact run (incarnation) it was authorized for, what it
 * may do (access bits, and for the port gateway a port and protocol), and when it was issued
 * and expires. It is encoded in a versioned canonical byte format (docs/capabilities.md) and
 * signed with Ed25519 over exactly those bytes; on the wire it travels as
 * "v2.<base64url(payload)>.<base64url(signature)>" in the X-Sbx-Capability header.
 *
 * Version 2 binds the request it authorizes: its method and the SHA-256 of its target (the
 * path and query the node receives), optionally the SHA-256 of its body, and for `manage`
 * capabilities a single-use id (the node keeps used ids until they expire: cap_replay_t).
 *
 * The node's decision has three outcomes (cap_compare): ALLOW; REFRESH_ROUTE when the
 * capability is for the same sandbox but another incarnation than the installed one (the
 * sender's route is stale: it may look the route up again); DENY for anything else (another
 * sandbox, bad signature, expired, wrong purpose, port or protocol). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CAP_ID_MAX 64       /* sandbox, node, activation and instance ids: [A-Za-z0-9._:-] */
#define CAP_KID_MAX 32      /* key ids: [A-Za-z0-9._-] */
#define CAP_LIFETIME_S 120  /* issued capabilities live this long */
#define CAP_SKEW_S 15       /* clock skew tolerated on iat and exp */
#define CAP_PAYLOAD_MAX 512 /* encoded payload bytes, at most */
#define CAP_WIRE_MAX 1024   /* "v2." + base64url(payload) + "." + base64url(signature) */
#define CAP_METHOD_MAX 16   /* request methods: 1..15 bytes of [A-Z] */
#define CAP_DIGEST_BYTES 32 /* SHA-256 */
#define CAP_NONCE_BYTES 16  /* the single-use id of a manage capability (128 random bits) */

/* What a capability allows. One request needs exactly one purpose bit; a capability may
 * carry several (the control plane issues the narrowest one it can). */
enum {
    CAP_EXEC = 1u << 0,        /* run commands (exec stream) */
    CAP_FILES_READ = 1u << 1,  /* read files and list directories */
    CAP_FILES_WRITE = 1u << 2, /* write, rename, delete files */
    CAP_PROCESSES = 1u << 3,   /* background processes: start, attach, signal */
    CAP_PROXY = 1u << 4,       /* reach a service port of the run (port + protocol) */
    CAP_MANAGE = 1u << 5,      /* control plane -> node: install, retire, pause */
    CAP_STATE_READ = 1u << 6,  /* one node -> another: fetch a stopped run's root (a move) */
    CAP_ACCESS_ALL = (1u << 7) - 1,
};

typedef enum {
    CAP_PROTO_NONE = 0, /* not a port capability */
    CAP_PROTO_HTTP = 1, /* plain HTTP requests, including chunked and SSE responses */
    CAP_PROTO_WEBSOCKET = 2,
    CAP_PROTO_MAX = 2,
} cap_proto_t;

/* The identity of one run of a sandbox. Two runs are the same incarnation iff every field is
 * equal. Strings are NUL-terminated, 1..CAP_ID_MAX-1 bytes of [A-Za-z0-9._:-]. */
typedef struct {
    char sandbox[CAP_ID_MAX];    /* stable sandbox (job) id */
    uint64_t generation;         /* >= 1; every start, restore or move increments it */
    char node[CAP_ID_MAX];       /* node id the run was placed on */
    char substrate[CAP_ID_MAX];  /* "process", "microvm" */
    char activation[CAP_ID_MAX]; /* new per start attempt within a generation */
    char instance[CAP_ID_MAX];   /* the substrate's instance (e.g. node-local run id) */
} cap_run_t;

typedef struct {
    char kid[CAP_KID_MAX]; /* the signing key's id */
    cap_run_t run;
    uint32_t access;   /* CAP_* bits, nonzero */
    uint16_t port;     /* CAP_PROXY: 1..65535; otherwise 0 */
    cap_proto_t proto; /* CAP_PROXY: HTTP or WEBSOCKET; otherwise NONE */
    int64_t iat, exp;  /* unix seconds, iat < exp, exp - iat <= CAP_LIFETIME_S */
    /* The request it authorizes (every capability names one). */
    char method[CAP_METHOD_MAX];      /* "GET", "POST", ... */
    uint8_t target[CAP_DIGEST_BYTES]; /* SHA-256 of the request target (path + query) */
    bool has_body;                    /* required with CAP_MANAGE */
    uint8_t body[CAP_DIGEST_BYTES];   /* SHA-256 of the request body (has_body) */
    bool has_nonce;                   /* exactly with CAP_MANAGE */
    uint8_t nonce[CAP_NONCE_BYTES];   /* single-use id (has_nonce) */
} cap_t;

/* SHA-256 of n bytes. */
void cap_digest(const void *p, size_t n, uint8_t out[CAP_DIGEST_BYTES]);
/* Bind c to one request: method, target digest, and the body digest when body is not NULL
 * (body_len bytes; an empty body is a digest too). A manage capability also gets a fresh
 * single-use id. -EINVAL for a method outside [A-Z]{1,15}. */
int cap_bind_request(cap_t *c, const char *method, size_t method_len, const char *target,
                     size_t target_len, const void *body, size_t body_len);
/* Whether body (n bytes) is the one c names (false when c names none). Constant time. */
bool cap_body_matches(const cap_t *c, const void *body, size_t n);

/* ---- encoding ------------------------------------------------------------------------------ */

/* Validate c and encode its canonical payload into out (cap bytes). Returns the length, or
 * -EINVAL (a field out of range) / -ENOBUFS. */
int cap_encode(const cap_t *c, uint8_t *out, size_t cap);
/* Decode a payload. Strict: anything that cap_encode would not have produced byte for byte
 * (unknown version, bad lengths, characters, ranges, trailing bytes) is -EINVAL. */
int cap_decode(const uint8_t *p, size_t len, cap_t *ret);

/* ---- keys ---------------------------------------------------------------------------------- */

#define CAP_PK_BYTES 32
#define CAP_SK_BYTES 64

typedef struct {
    char kid[CAP_KID_MAX];
    uint8_t pk[CAP_PK_BYTES];
} cap_pubkey_t;

typedef struct {
    char kid[CAP_KID_MAX];
    uint8_t pk[CAP_PK_BYTES];
    uint8_t sk[CAP_SK_BYTES];
} cap_signkey_t;

/* A new Ed25519 key pair with the given id. */
int cap_key_generate(const char *kid, cap_signkey_t *ret);

/* Sign: encode c (its kid is set from key), sign the payload, write the wire form
 * "v1.<b64url payload>.<b64url sig>" NUL-terminated into out. Returns its length or -errno. */
int cap_sign(const cap_signkey_t *key, const cap_t *c, char *out, size_t cap);

/* The verification key set a node holds: at most CAP_KEYSET_MAX public keys. */
#define CAP_KEYSET_MAX 8
typedef struct {
    cap_pubkey_t keys[CAP_KEYSET_MAX];
    size_t n;
} cap_keyset_t;

/* Replace the set (ids must be distinct and valid; -EINVAL otherwise, set unchanged). */
int cap_keyset_set(cap_keyset_t *ks, const cap_pubkey_t *keys, size_t n);
const cap_pubkey_t *cap_keyset_find(const cap_keyset_t *ks, const char *kid);

/* Why a capability was refused (or CAP_OK). Stable names for the wire via cap_reason_str(). */
typedef enum {
    CAP_OK = 0,
    CAP_E_MALFORMED,   /* not "v1.<payload>.<sig>", bad base64url, or payload not canonical */
    CAP_E_UNKNOWN_KEY, /* kid not in the key set */
    CAP_E_SIGNATURE,   /* signature does not verify */
    CAP_E_NOT_YET,     /* iat more than CAP_SKEW_S in the future */
    CAP_E_EXPIRED,     /* exp + CAP_SKEW_S <= now */
    CAP_E_SANDBOX,     /* another sandbox than the one addressed */
    CAP_E_PURPOSE,     /* access bits do not include what the request does */
    CAP_E_PORT,        /* port differs from the request's, or the run does not expose it */
    CAP_E_PROTOCOL,    /* protocol differs from the request's, or the run does not expose it */
    CAP_E_STALE_RUN,   /* same sandbox, another incarnation (-> REFRESH_ROUTE) */
    CAP_E_NO_RUN,      /* no run of this sandbox is installed here (-> REFRESH_ROUTE) */
    CAP_E_REQUEST,     /* another method or target than the capability names */
    CAP_E_BODY,        /* another body than the capability names (or none named) */
    CAP_E_REPLAY,      /* a single-use capability seen before (or the table is full) */
} cap_reason_t;
/* "ok", "malformed", "unknown_key", "signature", "not_yet", "expired", "sandbox", "purpose",
 * "port", "protocol", "stale_run", "no_run", "request", "body", "replay" ("unknown" for a
 * value outside the enum). */
const char *cap_reason_str(cap_reason_t r);

/* Parse the wire form and verify its signature with ks, then check iat/exp against now (unix
 * seconds) with CAP_SKEW_S. On CAP_OK *ret holds the capability. */
cap_reason_t cap_verify(const cap_keyset_t *ks, const char *wire, size_t len, int64_t now,
                        cap_t *ret);

/* ---- the node's comparison ----------------------------------------------------------------- */

typedef enum { CAP_ALLOW = 0, CAP_REFRESH_ROUTE = 1, CAP_DENY = 2 } cap_verdict_t;
const char *cap_verdict_str(cap_verdict_t v); /* "Allow", "RefreshRoute", "Deny" */

/* One service port a run exposes. */
typedef struct {
    uint16_t port;
    cap_proto_t proto;
} cap_expose_t;

/* What the node knows about the request and the run installed for the addressed sandbox. */
typedef struct {
    const char *sandbox; /* the sandbox the request addresses (from the path) */
    const char *method;  /* the request's method (method_len bytes) */
    size_t method_len;
    const char *target; /* the request target as received (target_len bytes) */
    size_t target_len;
    uint32_t purpose;           /* exactly one CAP_* bit: what the request does */
    uint16_t port;              /* CAP_PROXY requests: the port addressed, else 0 */
    cap_proto_t proto;          /* CAP_PROXY requests: the protocol used, else NONE */
    const cap_run_t *installed; /* the run installed here for that sandbox, or NULL */
    const cap_expose_t *expose; /* the installed run's exposed ports */
    size_t n_expose;
} cap_request_t;

/* Compare a verified capability with the request and the installed run, in this order:
 * sandbox (DENY), method and target (DENY, request), purpose (DENY), port/protocol named by the capability vs the request (DENY),
 * installed run missing (REFRESH_ROUTE, no_run) or different in any identity field
 * (REFRESH_ROUTE, stale_run), port/protocol not exposed by the installed run (DENY).
 * *ret_reason (ret_reason may be NULL) is CAP_OK with ALLOW, else the reason named above. */
cap_verdict_t cap_compare(const cap_t *c, const cap_request_t *rq, cap_reason_t *ret_reason);

/* Equality of two run identities (all fields). */
bool cap_run_equal(const cap_run_t *a, const cap_run_t *b);
/* Validate an id string for the run fields ([A-Za-z0-9._:-], 1..CAP_ID_MAX-1 bytes). */
bool cap_id_valid(const char *s);

/* ---- one signature per request shape -------------------------------------------------------- */

/* Capabilities that are not single-use (no manage nonce) may be presented again until they
 * expire, so both ends cache by the exact request shape to spare Ed25519 (sign ~16 µs, verify
 * ~45 µs) on a repeated request; neither cache widens what a capability allows. */
#define CAP_CACHE_SLOTS 64
#define CAP_REUSE_S 30 /* a signed capability serves the same request shape this long */

/* The signer's side: one wire form per (key, run, access, port, protocol, method, target, body)
 * for CAP_REUSE_S from its iat, so it still has CAP_LIFETIME_S - CAP_REUSE_S seconds to live
 * when it is sent again. One thread (the caller's lock). */
typedef struct {
    struct {
        uint64_t hash;
        size_t key_len, wire_len;
        int64_t iat;
        uint8_t key[CAP_PAYLOAD_MAX];
        char wire[CAP_WIRE_MAX];
    } slot[CAP_CACHE_SLOTS];
} cap_signcache_t;

/* cap_sign() with iat = now and exp = now + CAP_LIFETIME_S, unless sc holds a wire form of the
 * same shape signed by the same key in the last CAP_REUSE_S seconds: that one is returned (and
 * c->iat, c->exp are its). A manage capability (single-use) is always signed anew. */
int cap_sign_reuse(cap_signcache_t *sc, const cap_signkey_t *key, cap_t *c, int64_t now, char *out,
                   size_t cap);

/* The verifier's side: wire forms whose signature verified, with the key that verified it. One
 * thread (the caller's lock). */
typedef struct {
    struct {
        uint64_t hash;
        size_t len;
        uint8_t pk[CAP_PK_BYTES];
        cap_t cap;
        char wire[CAP_WIRE_MAX];
    } slot[CAP_CACHE_SLOTS];
} cap_verifycache_t;

/* cap_verify(), but a wire form identical byte for byte to one that verified before under a key
 * ks still holds (same kid, same public key) skips the signature check; the time window is
 * checked every time. Only CAP_OK results without a nonce are kept. */
cap_reason_t cap_verify_reuse(cap_verifycache_t *vc, const cap_keyset_t *ks, const char *wire,
                              size_t len, int64_t now, cap_t *ret);

/* ---- single-use ids ------------------------------------------------------------------------ */

/* The ids of single-use capabilities seen, each kept until its capability expires (exp +
 * CAP_SKEW_S). Bounded: when every slot holds an unexpired id, new ones are refused (fail
 * closed) rather than an old one forgotten. */
#define CAP_REPLAY_SLOTS 4096
typedef struct {
    uint8_t nonce[CAP_NONCE_BYTES];
    int64_t until;
} cap_replay_slot_t;
typedef struct {
    cap_replay_slot_t slots[CAP_REPLAY_SLOTS];
    size_t n;
} cap_replay_t;

/* Record c's id: CAP_OK the first time; CAP_E_REPLAY when it was seen and has not expired, or
 * when the table is full of unexpired ids; CAP_E_MALFORMED when c carries no id. */
cap_reason_t cap_replay_use(cap_replay_t *t, const cap_t *c, int64_t now);

/* ---- signed key sets (control identity -> nodes) ------------------------------------------- */

/* The verification key set a node receives is signed by the control plane's long-term
 * identity key (Ed25519), which the node pinned at join, and carries a version that only goes
 * up. Wire: "<base64url(payload)>.<base64url(signature)>", payload
 *   "SBXK" 0x01 version:u64 n:u8 (kid pk:32)*n     (kid as in capabilities) */
#define CAP_KEYSET_WIRE_MAX 1024
typedef struct {
    uint8_t pk[CAP_PK_BYTES];
    uint8_t sk[CAP_SK_BYTES];
} cap_identity_t;

/* Sign version + keys (1..CAP_KEYSET_MAX, distinct valid ids) with id. Returns the length
 * written (NUL-terminated) or -EINVAL / -ENOBUFS / -EIO. */
int cap_keyset_sign(const cap_identity_t *id, uint64_t version, const cap_pubkey_t *keys, size_t n,
                    char *out, size_t cap);
/* Verify a signed key set against the pinned identity public key. 0 with *ret_version and *ret;
 * -EBADMSG when malformed (not canonical, or len >= CAP_KEYSET_WIRE_MAX), -EPERM when the
 * signature does not verify. */
int cap_keyset_open(const uint8_t pk[CAP_PK_BYTES], const char *wire, size_t len,
                    uint64_t *ret_version, cap_keyset_t *ret);

/* ---- signing keys over time (the control plane's rotation policy) -------------------------- */

/* One signing key as the control plane stores it. Times are unix seconds. */
typedef struct {
    cap_signkey_t key;
    int64_t created;  /* published to nodes from this time */
    int64_t activate; /* used for signing from this time (created + publish delay) */
    int64_t retired;  /* 0 while in service; else no longer used for signing from then */
} cap_keyrec_t;

/* The key to sign with at time now: the newest record with activate <= now and not retired
 * (retired == 0 or retired > now). NULL if none. Newest: the latest activate, then the latest
 * created, then the later record. */
const cap_keyrec_t *cap_rotation_signer(const cap_keyrec_t *recs, size_t n, int64_t now);
/* Which public keys nodes must hold at time now: every key that is published (created <= now)
 * and either still in service or retired less than CAP_LIFETIME_S + CAP_SKEW_S ago (so every
 * capability it signed can still be verified until it expires). Writes at most max keys,
 * newest first (latest created, then latest activate, then the later record); returns how
 * many. */
size_t cap_rotation_verify_set(const cap_keyrec_t *recs, size_t n, int64_t now, cap_pubkey_t *out,
                               size_t max);
/* Whether a retired record can be deleted at time now (nothing it signed is still valid). */
bool cap_rotation_expired(const cap_keyrec_t *rec, int64_t now);
