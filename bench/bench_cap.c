/* SPDX-License-Identifier: MIT */
/* bench-cap: the cost of run-bound capabilities (src/cap/cap.c) on one core, in process.
 *
 *   bench-cap [--iterations N] [--quick]
 *
 * Figures: cap_sign, cap_verify, cap_compare and verify + compare (what the node pays per
 * request), each as p50 and mean; beside them, in the same loop, a bare
 * crypto_sign_verify_detached on the same payload and signature, so the ratio shows what the
 * wire parsing, base64url, canonical decoding and comparison add to Ed25519. Target: verify +
 * compare well under 60 us. Figures only; exit 1 means a functional failure. */
#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "bench_util.h"
#include "cap/cap.h"
#include "common/macro.h"
#include "common/strutil.h"

#define TARGET_US 60.0
/* the request the capability names (method, target digest and an empty body's digest) */
#define BENCH_TARGET "/v1/runs/sbx-01HZX3K9Q4M8N2P7R5T6V8W0YZ/ports/8080/app/socket?room=42"
#define COMPARE_BATCH 256 /* cap_compare takes tens of ns: time it in batches */
#define NOW INT64_C(1700000000)

typedef struct {
    uint64_t p50, sum;
    size_t n;
} stat_t;

static stat_t summarize(uint64_t *v, size_t n)
{
    stat_t s = { .n = n };
    for (size_t i = 0; i < n; i++)
        s.sum += v[i];
    qsort(v, n, sizeof v[0], cmp_u64);
    s.p50 = percentile(v, n, 50);
    return s;
}

static double mean_ns(stat_t s) { return s.n ? (double)s.sum / (double)s.n : 0; }

static void fig_stat(const char *what, stat_t s, double div)
{
    char l[96];
    (void)snprintf(l, sizeof l, "%s p50", what);
    fig(l, (double)s.p50 / div, "ns", NULL);
    (void)snprintf(l, sizeof l, "%s mean", what);
    fig(l, mean_ns(s) / div, "ns", NULL);
}

typedef struct {
    cap_signkey_t key;
    cap_keyset_t ks;
    cap_t cap;
    cap_run_t installed;
    cap_expose_t expose[4];
    char wire[CAP_WIRE_MAX];
    size_t wire_len;
    uint8_t payload[CAP_PAYLOAD_MAX], sig[crypto_sign_BYTES];
    size_t payload_len;
} fixture_t;

static int setup(fixture_t *f)
{
    memset(f, 0, sizeof *f);
    if (sodium_init() < 0 || cap_key_generate("bench-2024", &f->key) < 0)
        return -EIO;
    cap_pubkey_t pks[3];
    memset(pks, 0, sizeof pks);
    for (size_t i = 0; i < 3; i++) { /* the key looked up is the last of three */
        (void)snprintf(pks[i].kid, sizeof pks[i].kid, "older-%zu", i);
        randombytes_buf(pks[i].pk, sizeof pks[i].pk);
    }
    memcpy(pks[2].kid, f->key.kid, sizeof pks[2].kid);
    memcpy(pks[2].pk, f->key.pk, sizeof pks[2].pk);
    if (cap_keyset_set(&f->ks, pks, 3) < 0)
        return -EINVAL;

    /* a realistic proxy capability: ids of typical length */
    cap_t *c = &f->cap;
    memcpy(c->run.sandbox, "sbx-01HZX3K9Q4M8N2P7R5T6V8W0YZ", 31);
    c->run.generation = 7;
    memcpy(c->run.node, "node-eu-west-3a-017", 20);
    memcpy(c->run.substrate, "microvm", 8);
    memcpy(c->run.activation, "act-01HZX3M2B7C9D4E6F8G0H1J3K5", 31);
    memcpy(c->run.instance, "fc-4f1c2a9e7b3d", 16);
    c->access = CAP_PROXY;
    c->port = 8080;
    c->proto = CAP_PROTO_WEBSOCKET;
    c->iat = NOW;
    c->exp = NOW + CAP_LIFETIME_S;
    if (cap_bind_request(c, "GET", 3, BENCH_TARGET, strlen(BENCH_TARGET), "", 0) < 0)
        return -EINVAL;
    f->installed = c->run;
    f->expose[0] = (cap_expose_t){ 3000, CAP_PROTO_HTTP };
    f->expose[1] = (cap_expose_t){ 5173, CAP_PROTO_HTTP };
    f->expose[2] = (cap_expose_t){ 8080, CAP_PROTO_HTTP };
    f->expose[3] = (cap_expose_t){ 8080, CAP_PROTO_WEBSOCKET };

    int n = cap_sign(&f->key, c, f->wire, sizeof f->wire);
    if (n < 0)
        return n;
    f->wire_len = (size_t)n;
    memcpy(c->kid, f->key.kid, sizeof c->kid);
    n = cap_encode(c, f->payload, sizeof f->payload);
    if (n < 0)
        return n;
    f->payload_len = (size_t)n;
    crypto_sign_detached(f->sig, NULL, f->payload, f->payload_len, f->key.sk);
    return 0;
}

static cap_request_t request(const fixture_t *f)
{
    return (cap_request_t){
        .sandbox = f->cap.run.sandbox,
        .method = "GET",
        .method_len = 3,
        .target = BENCH_TARGET,
        .target_len = strlen(BENCH_TARGET),
        .purpose = CAP_PROXY,
        .port = 8080,
        .proto = CAP_PROTO_WEBSOCKET,
        .installed = &f->installed,
        .expose = f->expose,
        .n_expose = 4,
    };
}

/* Time n iterations of each figure; returns -1 on a functional failure. */
static int run(const fixture_t *f, size_t n)
{
    _cleanup_free_ uint64_t *sign = calloc(n, sizeof(uint64_t));
    _cleanup_free_ uint64_t *verify = calloc(n, sizeof(uint64_t));
    _cleanup_free_ uint64_t *cmp = calloc(n, sizeof(uint64_t));
    _cleanup_free_ uint64_t *both = calloc(n, sizeof(uint64_t));
    _cleanup_free_ uint64_t *bare = calloc(n, sizeof(uint64_t));
    if (!sign || !verify || !cmp || !both || !bare)
        return -1;
    cap_request_t rq = request(f);
    char out[CAP_WIRE_MAX];
    size_t bad = 0;

    for (size_t i = 0; i < n / 10 + 1; i++) { /* warm up caches and the CPU clock */
        cap_t c;
        bad += cap_verify(&f->ks, f->wire, f->wire_len, NOW, &c) != CAP_OK;
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t t0 = now_ns();
        bad += cap_sign(&f->key, &f->cap, out, sizeof out) != (int)f->wire_len;
        uint64_t t1 = now_ns();
        cap_t c;
        bad += cap_verify(&f->ks, f->wire, f->wire_len, NOW, &c) != CAP_OK;
        uint64_t t2 = now_ns();
        for (size_t k = 0; k < COMPARE_BATCH; k++)
            bad += cap_compare(&f->cap, &rq, NULL) != CAP_ALLOW;
        uint64_t t3 = now_ns();
        cap_reason_t r;
        bad += cap_verify(&f->ks, f->wire, f->wire_len, NOW, &c) != CAP_OK ||
               cap_compare(&c, &rq, &r) != CAP_ALLOW;
        uint64_t t4 = now_ns();
        bad += crypto_sign_verify_detached(f->sig, f->payload, f->payload_len, f->key.pk) != 0;
        uint64_t t5 = now_ns();
        sign[i] = t1 - t0;
        verify[i] = t2 - t1;
        cmp[i] = t3 - t2;
        both[i] = t4 - t3;
        bare[i] = t5 - t4;
    }
    if (bad) {
        fprintf(stderr, "bench-cap: %zu operations gave an unexpected result\n", bad);
        return -1;
    }

    stat_t s_sign = summarize(sign, n), s_verify = summarize(verify, n);
    stat_t s_cmp = summarize(cmp, n), s_both = summarize(both, n), s_bare = summarize(bare, n);
    section("capabilities (ns per operation)");
    fig_stat("cap_sign", s_sign, 1);
    fig_stat("cap_verify", s_verify, 1);
    fig_stat("cap_compare (batches of 256)", s_cmp, COMPARE_BATCH);
    fig_stat("cap_verify + cap_compare", s_both, 1);
    fig_stat("baseline: bare crypto_sign_verify_detached", s_bare, 1);
    double ratio = s_bare.p50 ? (double)s_both.p50 / (double)s_bare.p50 : 0;
    fig("ratio: verify+compare p50 / bare verify p50", ratio, "x", NULL);
    char note[64];
    double p50_us = (double)s_both.p50 / 1e3;
    fig("verify+compare p50", p50_us, "us",
        target_note(p50_us <= TARGET_US, "<= 60 us", note, sizeof note));
    printf("\ncap verify+compare: p50 %.1f us mean %.1f us (target <= %.0f us); "
           "bare ed25519 verify p50 %.1f us; ratio %.2f\n",
           p50_us, mean_ns(s_both) / 1e3, TARGET_US, (double)s_bare.p50 / 1e3, ratio);
    printf("cap sign p50 %.1f us; cap verify p50 %.1f us; cap compare p50 %.1f ns "
           "(wire form %zu bytes, payload %zu bytes)\n",
           (double)s_sign.p50 / 1e3, (double)s_verify.p50 / 1e3, (double)s_cmp.p50 / COMPARE_BATCH,
           f->wire_len, f->payload_len);
    return 0;
}

int main(int argc, char **argv)
{
    uint64_t n = 20000;
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 1; i < argc; i++) {
        if (streq(argv[i], "--quick")) {
            n = 2000;
        } else if (streq(argv[i], "--iterations") && i + 1 < argc &&
                   parse_u64_str(argv[i + 1], 100000000, &n) >= 0 && n > 0) {
            i++;
        } else {
            fprintf(stderr, "usage: bench-cap [--iterations N] [--quick]\n");
            return 2;
        }
    }
    struct utsname u;
    (void)uname(&u);
    printf("sbx capability benchmark: %ld CPUs, Linux %s, libsodium %s, %llu iterations\n",
           sysconf(_SC_NPROCESSORS_ONLN), u.release, sodium_version_string(),
           (unsigned long long)n);
    printf("figures only; nothing here asserts on timings (exit 1 = a functional failure)\n");
    print_loadavg("at start");
    fixture_t f;
    if (setup(&f) < 0) {
        fprintf(stderr, "bench-cap: setup failed\n");
        return 1;
    }
    return run(&f, (size_t)n) < 0 ? 1 : 0;
}
