/* SPDX-License-Identifier: MIT */
/* libFuzzer harness: the capability payload decoder and the wire form verifier (src/cap/cap.c).
 *
 * The same input is used twice:
 * - as a payload: cap_decode must accept exactly the canonical encodings, so when it succeeds
 *   cap_encode reproduces the input byte for byte (and refuses a buffer one byte short); the
 *   decoded capability, signed with the fixed key, verifies at its iat and gives back the same
 *   capability, and the comparator allows it for its own run and one of its purposes;
 * - as a wire string: cap_verify with a fixed key set returns a known reason and never reads
 *   past len; when the signature verifies (OK, NOT_YET or EXPIRED) the input is exactly what
 *   cap_sign produces for the decoded capability (one accepted text per capability: strict
 *   base64url, canonical payload, deterministic Ed25519), and at its own iat it is OK.
 *
 * The fixed key is derived from a constant seed; the seeds in fuzz/corpus/cap_decode/ that are
 * wire strings were signed with it (kid "k1"), so mutations start past the signature check. */
#include <errno.h>
#include <sodium.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cap/cap.h"

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        if (!(x)) {                                                                                \
            fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #x);              \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#define FUZZ_NOW INT64_C(1700000000)

static cap_signkey_t key;
static cap_keyset_t ks;

static void init(void)
{
    static const uint8_t seed[crypto_sign_SEEDBYTES] = "sbx fuzz_cap_decode fixed seed!";
    CHECK(sodium_init() >= 0);
    memset(&key, 0, sizeof key);
    memcpy(key.kid, "k1", 3);
    CHECK(crypto_sign_seed_keypair(key.pk, key.sk, seed) == 0);
    cap_pubkey_t pk;
    memset(&pk, 0, sizeof pk);
    memcpy(pk.kid, key.kid, sizeof pk.kid);
    memcpy(pk.pk, key.pk, sizeof pk.pk);
    CHECK(cap_keyset_set(&ks, &pk, 1) == 0);
}

/* Two capabilities are the same iff their encodings are. */
static void check_same_cap(const cap_t *a, const cap_t *b)
{
    uint8_t pa[CAP_PAYLOAD_MAX], pb[CAP_PAYLOAD_MAX];
    int na = cap_encode(a, pa, sizeof pa), nb = cap_encode(b, pb, sizeof pb);
    CHECK(na > 0 && na == nb && memcmp(pa, pb, (size_t)na) == 0);
}

/* The comparator allows a capability for its own run and request (the target's digest is
 * replaced by that of a fixed target: the decoded one has no known preimage), and refuses the
 * same request under the decoded digest (unless it happens to be that one). */
static void check_compare_allows_own_run(const cap_t *decoded)
{
    static const char target[] = "/v1/runs/fuzz/ports/1/x?y";
    cap_t own = *decoded;
    const cap_t *c = &own;
    cap_digest(target, sizeof target - 1, own.target);
    uint32_t purpose = c->access & -c->access; /* lowest granted bit */
    cap_expose_t ex = { c->port, c->proto };
    cap_request_t rq = {
        .sandbox = c->run.sandbox,
        .method = c->method,
        .method_len = strlen(c->method),
        .target = target,
        .target_len = sizeof target - 1,
        .purpose = purpose,
        .port = purpose == CAP_PROXY ? c->port : 0,
        .proto = purpose == CAP_PROXY ? c->proto : CAP_PROTO_NONE,
        .installed = &c->run,
        .expose = &ex,
        .n_expose = 1,
    };
    cap_reason_t r = CAP_E_MALFORMED;
    CHECK(cap_compare(c, &rq, &r) == CAP_ALLOW && r == CAP_OK);
    rq.installed = NULL;
    CHECK(cap_compare(c, &rq, &r) == CAP_REFRESH_ROUTE && r == CAP_E_NO_RUN);
    rq.installed = &c->run;
    if (memcmp(decoded->target, own.target, CAP_DIGEST_BYTES) != 0)
        CHECK(cap_compare(decoded, &rq, &r) == CAP_DENY && r == CAP_E_REQUEST);
    rq.method_len = 0; /* another method */
    CHECK(cap_compare(c, &rq, &r) == CAP_DENY && r == CAP_E_REQUEST);
}

static void check_payload(const uint8_t *data, size_t size)
{
    cap_t c;
    int r = cap_decode(data, size, &c);
    CHECK(r == 0 || r == -EINVAL);
    if (r < 0)
        return;
    uint8_t out[CAP_PAYLOAD_MAX];
    int n = cap_encode(&c, out, sizeof out);
    CHECK(n >= 0 && (size_t)n == size && memcmp(out, data, size) == 0);
    CHECK(cap_encode(&c, out, size - 1) == -ENOBUFS);
    CHECK(cap_id_valid(c.run.sandbox) && cap_id_valid(c.run.instance));

    char w[CAP_WIRE_MAX];
    int wn = cap_sign(&key, &c, w, sizeof w);
    CHECK(wn > 0 && (size_t)wn == strlen(w));
    cap_t d;
    CHECK(cap_verify(&ks, w, (size_t)wn, c.iat, &d) == CAP_OK);
    memcpy(c.kid, key.kid, sizeof c.kid);
    check_same_cap(&c, &d);
    check_compare_allows_own_run(&d);
}

/* The capability inside a wire string whose signature verified (only its times were out). */
static bool wire_payload(const char *s, size_t len, cap_t *ret)
{
    uint8_t p[CAP_PAYLOAD_MAX];
    size_t n = 0;
    const char *dot = len > 3 ? memchr(s + 3, '.', len - 3) : NULL;
    if (!dot || sodium_base642bin(p, sizeof p, s + 3, (size_t)(dot - s - 3), NULL, &n, NULL,
                                  sodium_base64_VARIANT_URLSAFE_NO_PADDING) != 0)
        return false;
    return cap_decode(p, n, ret) == 0;
}

static void check_wire(const char *s, size_t size)
{
    cap_t c;
    memset(&c, 0, sizeof c);
    cap_reason_t r = cap_verify(&ks, s, size, FUZZ_NOW, &c);
    CHECK(r == CAP_OK || r == CAP_E_MALFORMED || r == CAP_E_UNKNOWN_KEY || r == CAP_E_SIGNATURE ||
          r == CAP_E_NOT_YET || r == CAP_E_EXPIRED);
    if (r == CAP_E_NOT_YET || r == CAP_E_EXPIRED) {
        CHECK(wire_payload(s, size, &c));
        CHECK(cap_verify(&ks, s, size, c.iat, &c) == CAP_OK);
    } else if (r != CAP_OK) {
        return;
    }
    char w[CAP_WIRE_MAX];
    int wn = cap_sign(&key, &c, w, sizeof w);
    CHECK(wn > 0 && (size_t)wn == size && memcmp(w, s, size) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool ready;
    if (!ready) {
        init();
        ready = true;
    }
    if (size > 4096)
        return 0;
    check_payload(data, size);
    check_wire((const char *)data, size);
    return 0;
}
