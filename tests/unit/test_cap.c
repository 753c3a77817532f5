/* SPDX-License-Identifier: MIT */
/* Run-bound capabilities (src/cap/cap.c): the canonical payload (every field's bounds, decode
 * iff re-encode), Ed25519 signing and each refusal reason of cap_verify, the node's comparator
 * table, and the key rotation policy (signer selection, the verify set's overlap window). */
#include <errno.h>
#include <sodium.h>
#include <stdint.h>
#include <string.h>

#include "cap/cap.h"
#include "tap.h"

#define T0 INT64_C(1700000000)
#define TARGET "/v1/runs/sbx-1/ports/49983/v1/exec"
/* bytes after exp in base_cap()'s payload: method "POST", target digest, flags */
#define TAIL (1 + 4 + CAP_DIGEST_BYTES + 1)

static cap_t base_cap(void)
{
    cap_t c;
    memset(&c, 0, sizeof c);
    memcpy(c.kid, "k1", 3);
    memcpy(c.run.sandbox, "sbx-1", 6);
    c.run.generation = 3;
    memcpy(c.run.node, "node-a", 7);
    memcpy(c.run.substrate, "process", 8);
    memcpy(c.run.activation, "act:7", 6);
    memcpy(c.run.instance, "run.42", 7);
    c.access = CAP_EXEC | CAP_FILES_READ;
    c.iat = T0;
    c.exp = T0 + CAP_LIFETIME_S;
    memcpy(c.method, "POST", 5);
    cap_digest(TARGET, strlen(TARGET), c.target);
    return c;
}

/* A manage capability: the body's digest and a single-use id. */
static cap_t manage_cap(void)
{
    cap_t c = base_cap();
    c.access = CAP_MANAGE;
    c.has_body = true;
    cap_digest("{}", 2, c.body);
    c.has_nonce = true;
    memset(c.nonce, 0x4e, sizeof c.nonce);
    return c;
}

static cap_t proxy_cap(void)
{
    cap_t c = base_cap();
    c.access = CAP_PROXY;
    c.port = 8080;
    c.proto = CAP_PROTO_HTTP;
    return c;
}

/* Fill an id field with n copies of ch, NUL-terminated (n < size). */
static void fill(char *dst, size_t size, char ch, size_t n)
{
    memset(dst, 0, size);
    memset(dst, ch, n);
}

#define ASSERT_CAP_EQ(a, b)                                                                        \
    do {                                                                                           \
        ASSERT_STREQ((a)->kid, (b)->kid);                                                          \
        ASSERT_STREQ((a)->run.sandbox, (b)->run.sandbox);                                          \
        ASSERT_EQ_U((a)->run.generation, (b)->run.generation);                                     \
        ASSERT_STREQ((a)->run.node, (b)->run.node);                                                \
        ASSERT_STREQ((a)->run.substrate, (b)->run.substrate);                                      \
        ASSERT_STREQ((a)->run.activation, (b)->run.activation);                                    \
        ASSERT_STREQ((a)->run.instance, (b)->run.instance);                                        \
        ASSERT_EQ_U((a)->access, (b)->access);                                                     \
        ASSERT_EQ((a)->port, (b)->port);                                                           \
        ASSERT_EQ((a)->proto, (b)->proto);                                                         \
        ASSERT_EQ((a)->iat, (b)->iat);                                                             \
        ASSERT_EQ((a)->exp, (b)->exp);                                                             \
        ASSERT_STREQ((a)->method, (b)->method);                                                    \
        ASSERT_MEMEQ((a)->target, CAP_DIGEST_BYTES, (b)->target, CAP_DIGEST_BYTES);                \
        ASSERT_EQ((a)->has_body, (b)->has_body);                                                   \
        ASSERT_MEMEQ((a)->body, CAP_DIGEST_BYTES, (b)->body, CAP_DIGEST_BYTES);                    \
        ASSERT_EQ((a)->has_nonce, (b)->has_nonce);                                                 \
        ASSERT_MEMEQ((a)->nonce, CAP_NONCE_BYTES, (b)->nonce, CAP_NONCE_BYTES);                    \
    } while (0)

/* ---- encoding ------------------------------------------------------------------------------ */

TEST(encode_golden_bytes)
{
    cap_t c = proxy_cap();
    c.access = CAP_PROXY | CAP_EXEC;
    c.proto = CAP_PROTO_WEBSOCKET;
    memset(c.target, 0xab, sizeof c.target);
    c.has_body = true;
    memset(c.body, 0xcd, sizeof c.body);
    uint8_t out[CAP_PAYLOAD_MAX];
    int n = cap_encode(&c, out, sizeof out);
    /* field order: kid, sandbox, generation, node, substrate, activation, instance, access,
     * port, proto, iat, exp, method, target, flags, body; integers big-endian */
    static const uint8_t want[] =
        "SBXC\x02"
        "\x02k1"
        "\x05sbx-1"
        "\x00\x00\x00\x00\x00\x00\x00\x03"
        "\x06node-a"
        "\x07process"
        "\x05"
        "act:7"
        "\x06run.42"
        "\x00\x00\x00\x11"
        "\x1f\x90"
        "\x02"
        "\x00\x00\x00\x00\x65\x53\xf1\x00"
        "\x00\x00\x00\x00\x65\x53\xf1\x78"
        "\x04POST"
        "\xab\xab\xab\xab\xab\xab\xab\xab\xab\xab\xab\xab\xab\xab\xab\xab"
        "\xab\xab\xab\xab\xab\xab\xab\xab\xab\xab\xab\xab\xab\xab\xab\xab"
        "\x01"
        "\xcd\xcd\xcd\xcd\xcd\xcd\xcd\xcd\xcd\xcd\xcd\xcd\xcd\xcd\xcd\xcd"
        "\xcd\xcd\xcd\xcd\xcd\xcd\xcd\xcd\xcd\xcd\xcd\xcd\xcd\xcd\xcd\xcd";
    ASSERT_MEMEQ(out, (size_t)(n < 0 ? 0 : n), want, sizeof want - 1);
    /* a manage capability's single-use id follows its body, flags 3 */
    c = manage_cap();
    n = cap_encode(&c, out, sizeof out);
    ASSERT_GT(n, CAP_NONCE_BYTES + CAP_DIGEST_BYTES + 1);
    ASSERT_EQ(out[n - CAP_NONCE_BYTES - CAP_DIGEST_BYTES - 1], 3);
    ASSERT_MEMEQ(out + n - CAP_NONCE_BYTES, CAP_NONCE_BYTES, c.nonce, CAP_NONCE_BYTES);
}

TEST(encode_decode_round_trip)
{
    cap_t cs[4] = { base_cap(), proxy_cap(), manage_cap(), manage_cap() };
    cs[2].access = CAP_ACCESS_ALL;
    cs[2].port = 65535;
    cs[2].proto = CAP_PROTO_WEBSOCKET;
    cs[2].run.generation = UINT64_MAX;
    fill(cs[2].kid, sizeof cs[2].kid, 'K', CAP_KID_MAX - 1);
    fill(cs[2].run.instance, sizeof cs[2].run.instance, 'i', CAP_ID_MAX - 1);
    cs[2].iat = INT64_MAX - CAP_LIFETIME_S;
    cs[2].exp = INT64_MAX;
    fill(cs[2].method, sizeof cs[2].method, 'Z', CAP_METHOD_MAX - 1);
    cs[1].has_body = true; /* a data-path capability naming its body */
    memset(cs[1].body, 0xff, sizeof cs[1].body);
    for (size_t i = 0; i < 4; i++) {
        uint8_t p[CAP_PAYLOAD_MAX], q[CAP_PAYLOAD_MAX];
        int n = cap_encode(&cs[i], p, sizeof p);
        ASSERT_GT(n, 0);
        cap_t d;
        ASSERT_EQ(cap_decode(p, (size_t)n, &d), 0);
        ASSERT_CAP_EQ(&d, &cs[i]);
        int m = cap_encode(&d, q, sizeof q);
        ASSERT_MEMEQ(p, (size_t)n, q, (size_t)(m < 0 ? 0 : m));
    }
}

TEST(encode_buffer_size)
{
    cap_t c = base_cap();
    uint8_t p[CAP_PAYLOAD_MAX];
    int n = cap_encode(&c, p, sizeof p);
    ASSERT_GT(n, 0);
    ASSERT_EQ(cap_encode(&c, p, (size_t)n), n);
    ASSERT_EQ(cap_encode(&c, p, (size_t)n - 1), -ENOBUFS);
    ASSERT_EQ(cap_encode(&c, NULL, 0), -ENOBUFS);
    c.run.generation = 0; /* validation comes first */
    ASSERT_EQ(cap_encode(&c, p, 1), -EINVAL);

    /* the largest capability fits CAP_PAYLOAD_MAX */
    c = manage_cap();
    c.access |= CAP_PROXY;
    c.port = 1;
    c.proto = CAP_PROTO_HTTP;
    fill(c.method, sizeof c.method, 'M', CAP_METHOD_MAX - 1);
    fill(c.kid, sizeof c.kid, 'k', CAP_KID_MAX - 1);
    char *ids[] = { c.run.sandbox, c.run.node, c.run.substrate, c.run.activation, c.run.instance };
    for (size_t i = 0; i < 5; i++)
        fill(ids[i], CAP_ID_MAX, 'x', CAP_ID_MAX - 1);
    n = cap_encode(&c, p, sizeof p);
    ASSERT_GT(n, 0);
    ASSERT_LE(n, CAP_PAYLOAD_MAX);
}

typedef struct {
    const char *name;
    void (*mutate)(cap_t *c);
} mutation_t;

/* clang-format off */
static void m_kid_empty(cap_t *c) { c->kid[0] = '\0'; }
static void m_kid_long(cap_t *c) { memset(c->kid, 'k', CAP_KID_MAX); } /* no NUL */
static void m_kid_colon(cap_t *c) { memcpy(c->kid, "k:1", 4); }
static void m_kid_space(cap_t *c) { memcpy(c->kid, "k 1", 4); }
static void m_sandbox_empty(cap_t *c) { c->run.sandbox[0] = '\0'; }
static void m_sandbox_long(cap_t *c) { memset(c->run.sandbox, 's', CAP_ID_MAX); }
static void m_sandbox_slash(cap_t *c) { memcpy(c->run.sandbox, "a/b", 4); }
static void m_sandbox_high(cap_t *c) { memcpy(c->run.sandbox, "a\xc3\xa9", 4); }
static void m_generation_0(cap_t *c) { c->run.generation = 0; }
static void m_node_empty(cap_t *c) { c->run.node[0] = '\0'; }
static void m_node_long(cap_t *c) { memset(c->run.node, 'n', CAP_ID_MAX); }
static void m_node_space(cap_t *c) { memcpy(c->run.node, "n 1", 4); }
static void m_substrate_empty(cap_t *c) { c->run.substrate[0] = '\0'; }
static void m_substrate_long(cap_t *c) { memset(c->run.substrate, 'p', CAP_ID_MAX); }
static void m_substrate_bad(cap_t *c) { memcpy(c->run.substrate, "p*", 3); }
static void m_activation_empty(cap_t *c) { c->run.activation[0] = '\0'; }
static void m_activation_long(cap_t *c) { memset(c->run.activation, 'a', CAP_ID_MAX); }
static void m_activation_bad(cap_t *c) { memcpy(c->run.activation, "a\n", 3); }
static void m_instance_empty(cap_t *c) { c->run.instance[0] = '\0'; }
static void m_instance_long(cap_t *c) { memset(c->run.instance, 'i', CAP_ID_MAX); }
static void m_instance_bad(cap_t *c) { memcpy(c->run.instance, "i=1", 4); }
static void m_access_0(cap_t *c) { c->access = 0; }
static void m_access_unknown(cap_t *c) { c->access |= 1u << 7; }
static void m_access_high(cap_t *c) { c->access = 1u << 31; }
static void m_port_without_proxy(cap_t *c) { c->port = 80; }
static void m_proto_without_proxy(cap_t *c) { c->proto = CAP_PROTO_HTTP; }
static void m_proxy_port_0(cap_t *c) { c->access = CAP_PROXY; c->port = 0; c->proto = CAP_PROTO_HTTP; }
static void m_proxy_proto_none(cap_t *c) { c->access = CAP_PROXY; c->port = 80; c->proto = CAP_PROTO_NONE; }
static void m_proxy_proto_3(cap_t *c) { c->access = CAP_PROXY; c->port = 80; c->proto = (cap_proto_t)3; }
static void m_proto_3(cap_t *c) { c->proto = (cap_proto_t)3; }
static void m_iat_0(cap_t *c) { c->iat = 0; c->exp = 60; }
static void m_iat_negative(cap_t *c) { c->iat = -10; c->exp = 10; }
static void m_exp_0(cap_t *c) { c->exp = 0; }
static void m_exp_negative(cap_t *c) { c->iat = -100; c->exp = -50; }
static void m_iat_eq_exp(cap_t *c) { c->exp = c->iat; }
static void m_iat_gt_exp(cap_t *c) { c->exp = c->iat - 1; }
static void m_lifetime_long(cap_t *c) { c->exp = c->iat + CAP_LIFETIME_S + 1; }
static void m_lifetime_huge(cap_t *c) { c->iat = 1; c->exp = INT64_MAX; }
static void m_method_empty(cap_t *c) { c->method[0] = '\0'; }
static void m_method_lower(cap_t *c) { memcpy(c->method, "post", 5); }
static void m_method_long(cap_t *c) { memset(c->method, 'P', CAP_METHOD_MAX); } /* no NUL */
static void m_method_space(cap_t *c) { memcpy(c->method, "PO T", 5); }
static void m_manage_no_nonce(cap_t *c) { *c = manage_cap(); c->has_nonce = false; }
static void m_manage_no_body(cap_t *c) { *c = manage_cap(); c->has_body = false; }
static void m_nonce_without_manage(cap_t *c) { c->has_nonce = true; }
/* clang-format on */

static const mutation_t invalid[] = {
    { "kid empty", m_kid_empty },
    { "kid CAP_KID_MAX bytes", m_kid_long },
    { "kid with ':'", m_kid_colon },
    { "kid with space", m_kid_space },
    { "sandbox empty", m_sandbox_empty },
    { "sandbox CAP_ID_MAX bytes", m_sandbox_long },
    { "sandbox with '/'", m_sandbox_slash },
    { "sandbox non-ASCII", m_sandbox_high },
    { "generation 0", m_generation_0 },
    { "node empty", m_node_empty },
    { "node CAP_ID_MAX bytes", m_node_long },
    { "node with space", m_node_space },
    { "substrate empty", m_substrate_empty },
    { "substrate CAP_ID_MAX bytes", m_substrate_long },
    { "substrate with '*'", m_substrate_bad },
    { "activation empty", m_activation_empty },
    { "activation CAP_ID_MAX bytes", m_activation_long },
    { "activation with newline", m_activation_bad },
    { "instance empty", m_instance_empty },
    { "instance CAP_ID_MAX bytes", m_instance_long },
    { "instance with '='", m_instance_bad },
    { "access 0", m_access_0 },
    { "access unknown bit 6", m_access_unknown },
    { "access bit 31", m_access_high },
    { "port without CAP_PROXY", m_port_without_proxy },
    { "proto without CAP_PROXY", m_proto_without_proxy },
    { "CAP_PROXY port 0", m_proxy_port_0 },
    { "CAP_PROXY proto NONE", m_proxy_proto_none },
    { "CAP_PROXY proto 3", m_proxy_proto_3 },
    { "proto 3 without CAP_PROXY", m_proto_3 },
    { "iat 0", m_iat_0 },
    { "iat negative", m_iat_negative },
    { "exp 0", m_exp_0 },
    { "iat and exp negative", m_exp_negative },
    { "iat == exp", m_iat_eq_exp },
    { "iat > exp", m_iat_gt_exp },
    { "lifetime CAP_LIFETIME_S + 1", m_lifetime_long },
    { "lifetime huge", m_lifetime_huge },
    { "method empty", m_method_empty },
    { "method lower case", m_method_lower },
    { "method CAP_METHOD_MAX bytes", m_method_long },
    { "method with space", m_method_space },
    { "manage without single-use id", m_manage_no_nonce },
    { "manage without body digest", m_manage_no_body },
    { "single-use id without manage", m_nonce_without_manage },
};

TEST(encode_refuses_each_invalid_field)
{
    uint8_t p[CAP_PAYLOAD_MAX];
    for (size_t i = 0; i < sizeof invalid / sizeof invalid[0]; i++) {
        cap_t c = base_cap();
        invalid[i].mutate(&c);
        int r = cap_encode(&c, p, sizeof p);
        if (r != -EINVAL)
            printf("#   case: %s\n", invalid[i].name);
        ASSERT_EQ(r, -EINVAL);
    }
}

/* Positive controls at each bound: the largest and smallest accepted values. */
TEST(encode_accepts_each_bound)
{
    uint8_t p[CAP_PAYLOAD_MAX];
    cap_t c = base_cap();
    fill(c.kid, sizeof c.kid, 'k', CAP_KID_MAX - 1);
    ASSERT_GT(cap_encode(&c, p, sizeof p), 0);
    memcpy(c.kid, "A.z_0-9", 8);
    ASSERT_GT(cap_encode(&c, p, sizeof p), 0);
    fill(c.run.sandbox, CAP_ID_MAX, 's', CAP_ID_MAX - 1);
    fill(c.run.node, CAP_ID_MAX, ':', 1);
    fill(c.run.substrate, CAP_ID_MAX, '.', CAP_ID_MAX - 1);
    memcpy(c.run.activation, "A:b.c_d-9", 10);
    fill(c.run.instance, CAP_ID_MAX, '-', 1);
    c.run.generation = 1;
    ASSERT_GT(cap_encode(&c, p, sizeof p), 0);
    c.access = CAP_MANAGE;
    c.has_body = c.has_nonce = true;
    ASSERT_GT(cap_encode(&c, p, sizeof p), 0);
    fill(c.method, sizeof c.method, 'A', 1);
    ASSERT_GT(cap_encode(&c, p, sizeof p), 0);
    fill(c.method, sizeof c.method, 'Z', CAP_METHOD_MAX - 1);
    c.iat = 1;
    c.exp = 1 + CAP_LIFETIME_S;
    ASSERT_GT(cap_encode(&c, p, sizeof p), 0);
    c.exp = 2;
    ASSERT_GT(cap_encode(&c, p, sizeof p), 0);
    c.access = CAP_PROXY;
    c.has_nonce = false; /* a body digest without an id: fine off the manage path */
    c.port = 1;
    c.proto = CAP_PROTO_WEBSOCKET;
    ASSERT_GT(cap_encode(&c, p, sizeof p), 0);
    c.port = 65535;
    c.proto = CAP_PROTO_HTTP;
    ASSERT_GT(cap_encode(&c, p, sizeof p), 0);
}

TEST(id_valid)
{
    char s[CAP_ID_MAX + 1];
    fill(s, sizeof s, 'a', CAP_ID_MAX - 1);
    ASSERT_TRUE(cap_id_valid(s));
    fill(s, sizeof s, 'a', CAP_ID_MAX);
    ASSERT_FALSE(cap_id_valid(s));
    ASSERT_TRUE(cap_id_valid("a:b.c_d-E9"));
    ASSERT_FALSE(cap_id_valid(""));
    ASSERT_FALSE(cap_id_valid(NULL));
    ASSERT_FALSE(cap_id_valid("a b"));
    ASSERT_FALSE(cap_id_valid("a/b"));
    ASSERT_FALSE(cap_id_valid("a\x7f"));
}

/* ---- decoding ------------------------------------------------------------------------------ */

TEST(decode_refuses_prefixes_and_trailing_bytes)
{
    cap_t c = proxy_cap(), d;
    uint8_t p[CAP_PAYLOAD_MAX + 2];
    int n = cap_encode(&c, p, CAP_PAYLOAD_MAX);
    ASSERT_GT(n, 0);
    for (int i = 0; i < n; i++) {
        int r = cap_decode(p, (size_t)i, &d);
        if (r != -EINVAL)
            printf("#   prefix length %d of %d\n", i, n);
        ASSERT_EQ(r, -EINVAL);
    }
    p[n] = 0;
    ASSERT_EQ(cap_decode(p, (size_t)n + 1, &d), -EINVAL);
    ASSERT_EQ(cap_decode(p, (size_t)n, &d), 0); /* control */
    ASSERT_EQ(cap_decode(NULL, 0, &d), -EINVAL);
}

/* Offsets into the base_cap() payload (kid "k1", sandbox "sbx-1"). */
enum {
    OFF_VERSION = 4,
    OFF_KID_LEN = 5,
    OFF_SANDBOX_LEN = 8,
    OFF_SANDBOX = 9,
    OFF_GENERATION = 14,
};

TEST(decode_refuses_non_canonical)
{
    cap_t c = base_cap(), d;
    uint8_t p[CAP_PAYLOAD_MAX], q[CAP_PAYLOAD_MAX];
    int n = cap_encode(&c, p, sizeof p);
    ASSERT_GT(n, 0);
    ASSERT_EQ(p[OFF_SANDBOX_LEN], 5);
    ASSERT_EQ(p[OFF_GENERATION + 7], 3);

    struct {
        const char *name;
        size_t off;
        uint8_t val;
    } cases[] = {
        { "magic", 0, 's' },
        { "version 1 (before request binding)", OFF_VERSION, 1 },
        { "version 3", OFF_VERSION, 3 },
        { "version 0", OFF_VERSION, 0 },
        { "kid length 0", OFF_KID_LEN, 0 },
        { "kid length past the end", OFF_KID_LEN, 255 },
        { "sandbox length 0", OFF_SANDBOX_LEN, 0 },
        { "sandbox with NUL", OFF_SANDBOX + 2, 0 },
        { "sandbox with '/'", OFF_SANDBOX + 2, '/' },
        { "generation 0", OFF_GENERATION + 7, 0 },
        { "access unknown bit", (size_t)n - TAIL - 23 + 0, 0x80 },
        { "access 0", (size_t)n - TAIL - 23 + 3, 0 },
        { "access manage without its id", (size_t)n - TAIL - 23 + 3, CAP_MANAGE },
        { "port without CAP_PROXY", (size_t)n - TAIL - 19 + 1, 80 },
        { "proto without CAP_PROXY", (size_t)n - TAIL - 17, 1 },
        { "proto 3", (size_t)n - TAIL - 17, 3 },
        { "iat negative", (size_t)n - TAIL - 16, 0x80 },
        { "exp beyond the lifetime", (size_t)n - TAIL - 2, 0xff },
        { "exp equal to iat", (size_t)n - TAIL - 1, 0x00 },
        { "method length 0", (size_t)n - TAIL, 0 },
        { "method length past the target", (size_t)n - TAIL, 40 },
        { "method lower case", (size_t)n - TAIL + 1, 'p' },
        { "method with NUL", (size_t)n - TAIL + 2, 0 },
        { "flags: a body digest that is not there", (size_t)n - 1, 1 },
        { "flags: an id that is not there", (size_t)n - 1, 2 },
        { "flags: unknown bit", (size_t)n - 1, 4 },
        { "flags: high bit", (size_t)n - 1, 0x80 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memcpy(q, p, (size_t)n);
        q[cases[i].off] = cases[i].val;
        int r = cap_decode(q, (size_t)n, &d);
        if (r != -EINVAL)
            printf("#   case: %s\n", cases[i].name);
        ASSERT_EQ(r, -EINVAL);
    }

    /* an id length of CAP_ID_MAX with as many valid bytes behind it; CAP_ID_MAX - 1 is fine */
    for (size_t len = CAP_ID_MAX - 1; len <= CAP_ID_MAX; len++) {
        uint8_t big[CAP_PAYLOAD_MAX];
        size_t off = OFF_SANDBOX_LEN;
        memcpy(big, p, off);
        big[off++] = (uint8_t)len;
        memset(big + off, 's', len);
        off += len;
        memcpy(big + off, p + OFF_GENERATION, (size_t)n - OFF_GENERATION);
        off += (size_t)n - OFF_GENERATION;
        ASSERT_EQ(cap_decode(big, off, &d), len < CAP_ID_MAX ? 0 : -EINVAL);
    }
}

/* Every single-byte change of a valid payload either decodes to something that re-encodes to
 * exactly the changed bytes, or is refused. Both outcomes must occur. */
TEST(decode_mutated_bytes_iff_canonical)
{
    cap_t cs[3] = { base_cap(), proxy_cap(), manage_cap() };
    size_t accepted = 0, refused = 0;
    for (size_t k = 0; k < 3; k++) {
        uint8_t p[CAP_PAYLOAD_MAX], q[CAP_PAYLOAD_MAX], e[CAP_PAYLOAD_MAX];
        int n = cap_encode(&cs[k], p, sizeof p);
        ASSERT_GT(n, 0);
        for (int i = 0; i < n; i++) {
            for (unsigned v = 0; v < 256; v++) {
                memcpy(q, p, (size_t)n);
                q[i] = (uint8_t)v;
                cap_t d;
                int r = cap_decode(q, (size_t)n, &d);
                if (r < 0) {
                    if (r != -EINVAL)
                        printf("#   offset %d value %u\n", i, v);
                    ASSERT_EQ(r, -EINVAL);
                    refused++;
                    continue;
                }
                int m = cap_encode(&d, e, sizeof e);
                if (m != n || memcmp(e, q, (size_t)n) != 0)
                    printf("#   offset %d value %u\n", i, v);
                ASSERT_MEMEQ(e, (size_t)(m < 0 ? 0 : m), q, (size_t)n);
                accepted++;
            }
        }
    }
    printf("#   %zu accepted, %zu refused\n", accepted, refused);
    ASSERT_GT(accepted, 1000);
    ASSERT_GT(refused, 1000);
}

/* ---- signing and verification -------------------------------------------------------------- */

static cap_signkey_t key_a, key_a_forged, key_b;
static cap_keyset_t ks_a;

static int setup_keys(void)
{
    if (sodium_init() < 0 || cap_key_generate("k1", &key_a) < 0 ||
        cap_key_generate("k1", &key_a_forged) < 0 || cap_key_generate("k2", &key_b) < 0)
        return -1;
    cap_pubkey_t pk;
    memset(&pk, 0, sizeof pk);
    memcpy(pk.kid, key_a.kid, sizeof pk.kid);
    memcpy(pk.pk, key_a.pk, sizeof pk.pk);
    return cap_keyset_set(&ks_a, &pk, 1);
}

#define ASSERT_REASON(got, want)                                                                   \
    do {                                                                                           \
        cap_reason_t g_ = (got), w_ = (want);                                                      \
        if (g_ != w_) {                                                                            \
            TAP_FAIL_(#got " == " #want);                                                          \
            printf("#     left:  %s\n#     right: %s\n", cap_reason_str(g_), cap_reason_str(w_));  \
            return;                                                                                \
        }                                                                                          \
    } while (0)

#define ASSERT_VERDICT(c, rq, want_v, want_r)                                                      \
    do {                                                                                           \
        cap_reason_t r_ = (cap_reason_t)99;                                                        \
        cap_verdict_t v_ = cap_compare((c), (rq), &r_);                                            \
        if (v_ != (want_v) || r_ != (want_r)) {                                                    \
            TAP_FAIL_("cap_compare(" #c ", " #rq ") == " #want_v "/" #want_r);                     \
            printf("#     left:  %s/%s\n#     right: %s/%s\n", cap_verdict_str(v_),                \
                   cap_reason_str(r_), cap_verdict_str(want_v), cap_reason_str(want_r));           \
            return;                                                                                \
        }                                                                                          \
    } while (0)

TEST(key_generate)
{
    cap_signkey_t k;
    memset(&k, 0x5a, sizeof k);
    ASSERT_EQ(cap_key_generate("", &k), -EINVAL);
    ASSERT_EQ(cap_key_generate("a:b", &k), -EINVAL);
    ASSERT_EQ(cap_key_generate(NULL, &k), -EINVAL);
    ASSERT_EQ(k.kid[0], 0x5a); /* untouched on failure */
    ASSERT_EQ(cap_key_generate("2024-06.a_b", &k), 0);
    ASSERT_STREQ(k.kid, "2024-06.a_b");
    ASSERT_MEMEQ(k.pk, sizeof k.pk, k.sk + 32, 32); /* libsodium: sk = seed || pk */
    ASSERT_TRUE(memcmp(k.pk, key_a.pk, sizeof k.pk) != 0);
}

TEST(sign_verify)
{
    cap_t c = proxy_cap(), d;
    memcpy(c.kid, "zz", 3); /* replaced by the key's id */
    char w[CAP_WIRE_MAX];
    int n = cap_sign(&key_a, &c, w, sizeof w);
    ASSERT_GT(n, 0);
    ASSERT_EQ_U(strlen(w), (size_t)n);
    ASSERT_TRUE(strncmp(w, "v2.", 3) == 0);
    ASSERT_EQ_U(strspn(w + 3, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_."),
                (size_t)n - 3);
    const char *dot = strchr(w + 3, '.');
    ASSERT_TRUE(dot != NULL);
    ASSERT_TRUE(strchr(dot + 1, '.') == NULL);
    ASSERT_EQ_U(strlen(dot + 1), 86); /* 64 bytes, no padding */

    ASSERT_REASON(cap_verify(&ks_a, w, (size_t)n, T0, &d), CAP_OK);
    memcpy(c.kid, "k1", 3);
    ASSERT_CAP_EQ(&d, &c);

    /* the buffer: exactly length + NUL fits */
    char small[CAP_WIRE_MAX];
    ASSERT_EQ(cap_sign(&key_a, &c, small, (size_t)n + 1), n);
    ASSERT_STREQ(small, w);
    ASSERT_EQ(cap_sign(&key_a, &c, small, (size_t)n), -ENOBUFS);
    c.run.generation = 0;
    ASSERT_EQ(cap_sign(&key_a, &c, small, sizeof small), -EINVAL);

    /* deterministic (Ed25519): the same capability gives the same wire form */
    c.run.generation = 3;
    ASSERT_EQ(cap_sign(&key_a, &c, small, sizeof small), n);
    ASSERT_STREQ(small, w);
}

/* The wire form of c signed by key, split into its parts. */
typedef struct {
    char w[CAP_WIRE_MAX];
    size_t len, plen; /* plen: characters of the payload part (after "v2.") */
} wire_t;

static int sign_wire(const cap_signkey_t *key, const cap_t *c, wire_t *ret)
{
    int n = cap_sign(key, c, ret->w, sizeof ret->w);
    if (n < 0)
        return n;
    ret->len = (size_t)n;
    ret->plen = (size_t)(strchr(ret->w + 3, '.') - (ret->w + 3));
    return 0;
}

static cap_reason_t verify_str(const char *s, int64_t now)
{
    cap_t d;
    return cap_verify(&ks_a, s, strlen(s), now, &d);
}

TEST(verify_malformed)
{
    cap_t c = base_cap(), d;
    wire_t a;
    ASSERT_EQ(sign_wire(&key_a, &c, &a), 0);
    ASSERT_REASON(verify_str(a.w, T0), CAP_OK); /* control */

    char buf[CAP_WIRE_MAX + 8];
    const char *sig = a.w + 3 + a.plen + 1;
    ASSERT_REASON(verify_str("", T0), CAP_E_MALFORMED);
    ASSERT_REASON(verify_str("v2", T0), CAP_E_MALFORMED);
    ASSERT_REASON(verify_str("v2.", T0), CAP_E_MALFORMED);
    ASSERT_REASON(verify_str("v2..", T0), CAP_E_MALFORMED);
    ASSERT_REASON(cap_verify(&ks_a, NULL, 0, T0, &d), CAP_E_MALFORMED);

    /* wrong prefix: the version before request binding is refused, so is any other */
    memcpy(buf, a.w, a.len + 1);
    buf[1] = '1';
    ASSERT_REASON(verify_str(buf, T0), CAP_E_MALFORMED);
    buf[1] = '3';
    ASSERT_REASON(verify_str(buf, T0), CAP_E_MALFORMED);
    ASSERT_REASON(verify_str(a.w + 3, T0), CAP_E_MALFORMED);
    ASSERT_REASON(verify_str(a.w + 1, T0), CAP_E_MALFORMED);

    /* missing dots: no signature part; the two parts run together */
    (void)snprintf(buf, sizeof buf, "v2.%.*s", (int)a.plen, a.w + 3);
    ASSERT_REASON(verify_str(buf, T0), CAP_E_MALFORMED);
    (void)snprintf(buf, sizeof buf, "v2.%.*s%s", (int)a.plen, a.w + 3, sig);
    ASSERT_REASON(verify_str(buf, T0), CAP_E_MALFORMED);
    /* a third part */
    (void)snprintf(buf, sizeof buf, "%s.", a.w);
    ASSERT_REASON(verify_str(buf, T0), CAP_E_MALFORMED);
    (void)snprintf(buf, sizeof buf, "%s.AA", a.w);
    ASSERT_REASON(verify_str(buf, T0), CAP_E_MALFORMED);

    /* bad base64url: standard alphabet characters, padding, whitespace, a stray NUL */
    const char *bad[] = { "+", "/", "=", " ", "\n", "!" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memcpy(buf, a.w, a.len + 1);
        buf[3 + a.plen / 2] = bad[i][0];
        if (verify_str(buf, T0) != CAP_E_MALFORMED)
            printf("#   bad payload char 0x%02x\n", (unsigned char)bad[i][0]);
        ASSERT_REASON(verify_str(buf, T0), CAP_E_MALFORMED);
        memcpy(buf, a.w, a.len + 1);
        buf[a.len - 10] = bad[i][0];
        ASSERT_REASON(verify_str(buf, T0), CAP_E_MALFORMED);
    }
    memcpy(buf, a.w, a.len + 1);
    buf[5] = '\0';
    ASSERT_REASON(cap_verify(&ks_a, buf, a.len, T0, &d), CAP_E_MALFORMED);
    (void)snprintf(buf, sizeof buf, "%s=", a.w); /* padding after the signature */
    ASSERT_REASON(verify_str(buf, T0), CAP_E_MALFORMED);
    (void)snprintf(buf, sizeof buf, "%s==", a.w);
    ASSERT_REASON(verify_str(buf, T0), CAP_E_MALFORMED);
    if (a.plen % 4 != 0) { /* padding after the payload */
        (void)snprintf(buf, sizeof buf, "v2.%.*s=%s", (int)a.plen, a.w + 3, sig - 1);
        ASSERT_REASON(verify_str(buf, T0), CAP_E_MALFORMED);
    }
    (void)snprintf(buf, sizeof buf, " %s", a.w);
    ASSERT_REASON(verify_str(buf, T0), CAP_E_MALFORMED);
    (void)snprintf(buf, sizeof buf, "%s\n", a.w);
    ASSERT_REASON(verify_str(buf, T0), CAP_E_MALFORMED);

    /* non-canonical trailing bits: 86 characters carry 516 bits for 512; set a spare one */
    static const char alpha[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    memcpy(buf, a.w, a.len + 1);
    const char *pos = strchr(alpha, buf[a.len - 1]);
    ASSERT_TRUE(pos != NULL);
    ASSERT_EQ((pos - alpha) & 3, 0);
    buf[a.len - 1] = alpha[(pos - alpha) | 1];
    ASSERT_REASON(verify_str(buf, T0), CAP_E_MALFORMED);

    /* signature one character short / long; payload with a 4k+1 length */
    memcpy(buf, a.w, a.len + 1);
    buf[a.len - 1] = '\0';
    ASSERT_REASON(verify_str(buf, T0), CAP_E_MALFORMED);
    (void)snprintf(buf, sizeof buf, "%sA", a.w);
    ASSERT_REASON(verify_str(buf, T0), CAP_E_MALFORMED);
    int extra = (int)((5 - a.plen % 4) % 4); /* characters to a length of 4k+1 */
    (void)snprintf(buf, sizeof buf, "v2.%.*s%.*s.%s", (int)a.plen, a.w + 3, extra, "AAA", sig);
    ASSERT_EQ((a.plen + (size_t)extra) % 4, 1);
    ASSERT_REASON(verify_str(buf, T0), CAP_E_MALFORMED);

    /* valid base64url of a payload that is not canonical (a trailing byte) */
    uint8_t p[CAP_PAYLOAD_MAX + 1];
    int n = cap_encode(&c, p, sizeof p);
    ASSERT_GT(n, 0);
    p[n] = 0;
    char b64[CAP_WIRE_MAX];
    sodium_bin2base64(b64, sizeof b64, p, (size_t)n + 1, sodium_base64_VARIANT_URLSAFE_NO_PADDING);
    (void)snprintf(buf, sizeof buf, "v2.%s.%s", b64, sig);
    ASSERT_REASON(verify_str(buf, T0), CAP_E_MALFORMED);

    /* too long for CAP_WIRE_MAX: refused before anything is decoded */
    char huge[CAP_WIRE_MAX + 2];
    memset(huge, 'A', sizeof huge);
    memcpy(huge, "v2.", 3);
    huge[CAP_WIRE_MAX - 90] = '.';
    ASSERT_REASON(cap_verify(&ks_a, huge, sizeof huge, T0, &d), CAP_E_MALFORMED);
}

TEST(verify_unknown_key)
{
    cap_t c = base_cap(), d;
    wire_t b;
    ASSERT_EQ(sign_wire(&key_b, &c, &b), 0);
    ASSERT_REASON(cap_verify(&ks_a, b.w, b.len, T0, &d), CAP_E_UNKNOWN_KEY);
    cap_keyset_t empty = { .n = 0 };
    ASSERT_REASON(cap_verify(&empty, b.w, b.len, T0, &d), CAP_E_UNKNOWN_KEY);
    ASSERT_REASON(cap_verify(NULL, b.w, b.len, T0, &d), CAP_E_UNKNOWN_KEY);
}

TEST(verify_forged_and_tampered)
{
    cap_t c = base_cap(), d;
    wire_t a, f, t;
    /* another key that claims the same kid */
    ASSERT_EQ(sign_wire(&key_a_forged, &c, &f), 0);
    ASSERT_REASON(cap_verify(&ks_a, f.w, f.len, T0, &d), CAP_E_SIGNATURE);

    /* a payload changed after signing: splice another capability's payload with a's signature */
    ASSERT_EQ(sign_wire(&key_a, &c, &a), 0);
    c.run.generation = 4;
    ASSERT_EQ(sign_wire(&key_a, &c, &t), 0);
    ASSERT_REASON(cap_verify(&ks_a, t.w, t.len, T0, &d), CAP_OK); /* control */
    ASSERT_EQ_U(a.plen, t.plen);
    char buf[CAP_WIRE_MAX];
    memcpy(buf, t.w, 3 + t.plen);
    memcpy(buf + 3 + t.plen, a.w + 3 + a.plen, a.len - 3 - a.plen + 1);
    ASSERT_REASON(cap_verify(&ks_a, buf, a.len, T0, &d), CAP_E_SIGNATURE);

    /* a changed signature byte (a character in the middle keeps the encoding canonical) */
    memcpy(buf, a.w, a.len + 1);
    char *s = buf + a.len - 40;
    *s = *s == 'A' ? 'B' : 'A';
    ASSERT_REASON(cap_verify(&ks_a, buf, a.len, T0, &d), CAP_E_SIGNATURE);
}

/* The signer's cache: the same request shape gets the same wire form for CAP_REUSE_S, another
 * shape, key or a later time a fresh one, and a manage capability is never sent twice. */
TEST(sign_reuse)
{
    static cap_signcache_t sc; /* large: not on the stack */
    memset(&sc, 0, sizeof sc);
    cap_t c = proxy_cap(), d;
    char w1[CAP_WIRE_MAX], w2[CAP_WIRE_MAX];
    int n1 = cap_sign_reuse(&sc, &key_a, &c, T0, w1, sizeof w1);
    ASSERT_GT(n1, 0);
    ASSERT_EQ(c.iat, T0);
    ASSERT_EQ(c.exp, T0 + CAP_LIFETIME_S);
    ASSERT_REASON(cap_verify(&ks_a, w1, (size_t)n1, T0, &d), CAP_OK);
    /* the same shape later: the same bytes, with the first one's times */
    cap_t again = proxy_cap();
    ASSERT_EQ(cap_sign_reuse(&sc, &key_a, &again, T0 + CAP_REUSE_S - 1, w2, sizeof w2), n1);
    ASSERT_STREQ(w2, w1);
    ASSERT_EQ(again.iat, T0);
    ASSERT_EQ(again.exp, T0 + CAP_LIFETIME_S);
    /* too small a buffer for the kept form: refused, nothing written past it */
    ASSERT_EQ(cap_sign_reuse(&sc, &key_a, &again, T0 + 1, w2, (size_t)n1), -ENOBUFS);
    /* CAP_REUSE_S after: signed anew */
    again = proxy_cap();
    int n2 = cap_sign_reuse(&sc, &key_a, &again, T0 + CAP_REUSE_S, w2, sizeof w2);
    ASSERT_GT(n2, 0);
    ASSERT_TRUE(strcmp(w2, w1) != 0);
    ASSERT_EQ(again.iat, T0 + CAP_REUSE_S);
    /* a clock that went back: not served from the future */
    again = proxy_cap();
    ASSERT_GT(cap_sign_reuse(&sc, &key_a, &again, T0 + CAP_REUSE_S - 1, w1, sizeof w1), 0);
    ASSERT_EQ(again.iat, T0 + CAP_REUSE_S - 1);
    /* another target, or another key: another capability */
    cap_t other = proxy_cap();
    other.target[0] ^= 1;
    ASSERT_GT(cap_sign_reuse(&sc, &key_a, &other, T0 + CAP_REUSE_S, w1, sizeof w1), 0);
    ASSERT_TRUE(strcmp(w1, w2) != 0);
    ASSERT_REASON(cap_verify(&ks_a, w1, strlen(w1), T0 + CAP_REUSE_S, &d), CAP_OK);
    ASSERT_TRUE(memcmp(d.target, other.target, sizeof d.target) == 0);
    cap_t by_b = proxy_cap();
    ASSERT_GT(cap_sign_reuse(&sc, &key_b, &by_b, T0 + CAP_REUSE_S, w1, sizeof w1), 0);
    ASSERT_TRUE(strcmp(w1, w2) != 0);
    ASSERT_REASON(cap_verify(&ks_a, w1, strlen(w1), T0 + CAP_REUSE_S, &d), CAP_E_UNKNOWN_KEY);
    /* single-use (manage): signed anew every time, never taken from the cache */
    cap_t m1 = manage_cap(), m2 = manage_cap();
    ASSERT_GT(cap_sign_reuse(&sc, &key_a, &m1, T0, w1, sizeof w1), 0);
    ASSERT_GT(cap_sign_reuse(&sc, &key_a, &m2, T0 + 1, w2, sizeof w2), 0);
    ASSERT_EQ(m2.iat, T0 + 1);
    ASSERT_TRUE(strcmp(w1, w2) != 0);
}

/* The verifier's cache: only the exact bytes that verified skip the signature, and only while
 * the key set holds the key that verified them; the time window holds on every use. */
TEST(verify_reuse)
{
    static cap_verifycache_t vc;
    memset(&vc, 0, sizeof vc);
    cap_t c = proxy_cap(), d;
    c.iat = T0;
    c.exp = T0 + CAP_LIFETIME_S;
    wire_t a;
    ASSERT_EQ(sign_wire(&key_a, &c, &a), 0);
    ASSERT_REASON(cap_verify_reuse(&vc, &ks_a, a.w, a.len, T0, &d), CAP_OK);
    ASSERT_REASON(cap_verify_reuse(&vc, &ks_a, a.w, a.len, T0 + 1, &d), CAP_OK); /* a hit */
    memcpy(c.kid, "k1", 3);
    ASSERT_CAP_EQ(&d, &c);
    /* expiry is checked on a hit too */
    ASSERT_REASON(cap_verify_reuse(&vc, &ks_a, a.w, a.len, T0 + CAP_LIFETIME_S + CAP_SKEW_S, &d),
                  CAP_E_EXPIRED);
    ASSERT_REASON(cap_verify_reuse(&vc, &ks_a, a.w, a.len, T0 - CAP_SKEW_S - 1, &d), CAP_E_NOT_YET);
    /* one changed signature byte: not the cached bytes, and it does not verify */
    wire_t t = a;
    t.w[t.len - 2] = t.w[t.len - 2] == 'A' ? 'B' : 'A';
    ASSERT_REASON(cap_verify_reuse(&vc, &ks_a, t.w, t.len, T0, &d), CAP_E_SIGNATURE);
    ASSERT_REASON(cap_verify_reuse(&vc, &ks_a, a.w, a.len, T0, &d), CAP_OK);
    /* the key set drops k1, or has another key under that id: the cached result is not used */
    cap_keyset_t ks_b, ks_forged;
    cap_pubkey_t pb, pf;
    memcpy(pb.kid, key_b.kid, sizeof pb.kid);
    memcpy(pb.pk, key_b.pk, sizeof pb.pk);
    memcpy(pf.kid, key_a_forged.kid, sizeof pf.kid);
    memcpy(pf.pk, key_a_forged.pk, sizeof pf.pk);
    ASSERT_EQ(cap_keyset_set(&ks_b, &pb, 1), 0);
    ASSERT_EQ(cap_keyset_set(&ks_forged, &pf, 1), 0);
    ASSERT_REASON(cap_verify_reuse(&vc, &ks_b, a.w, a.len, T0, &d), CAP_E_UNKNOWN_KEY);
    ASSERT_REASON(cap_verify_reuse(&vc, &ks_forged, a.w, a.len, T0, &d), CAP_E_SIGNATURE);
    ASSERT_REASON(cap_verify_reuse(&vc, &ks_a, a.w, a.len, T0, &d), CAP_OK);
    /* a forgery signed by another key under kid k1 is refused even after the real one was kept */
    cap_t f = proxy_cap();
    f.iat = T0;
    f.exp = T0 + CAP_LIFETIME_S;
    wire_t fw;
    ASSERT_EQ(sign_wire(&key_a_forged, &f, &fw), 0);
    ASSERT_REASON(cap_verify_reuse(&vc, &ks_a, fw.w, fw.len, T0, &d), CAP_E_SIGNATURE);
    /* a manage capability (single-use) is never kept: each use verifies its signature */
    cap_t m = manage_cap();
    m.iat = T0;
    m.exp = T0 + CAP_LIFETIME_S;
    wire_t mw;
    ASSERT_EQ(sign_wire(&key_a, &m, &mw), 0);
    ASSERT_REASON(cap_verify_reuse(&vc, &ks_a, mw.w, mw.len, T0, &d), CAP_OK);
    uint64_t h = UINT64_C(14695981039346656037);
    for (size_t i = 0; i < mw.len; i++)
        h = (h ^ (uint8_t)mw.w[i]) * UINT64_C(1099511628211);
    ASSERT_EQ_U(vc.slot[h % CAP_CACHE_SLOTS].len == mw.len &&
                    memcmp(vc.slot[h % CAP_CACHE_SLOTS].wire, mw.w, mw.len) == 0,
                0);
}

TEST(verify_time_window)
{
    cap_t c = base_cap(), d;
    c.iat = T0;
    c.exp = T0 + CAP_LIFETIME_S;
    wire_t a;
    ASSERT_EQ(sign_wire(&key_a, &c, &a), 0);
    struct {
        int64_t now;
        cap_reason_t want;
    } cases[] = {
        { T0 - CAP_SKEW_S - 1, CAP_E_NOT_YET },
        { T0 - CAP_SKEW_S, CAP_OK },
        { T0, CAP_OK },
        { T0 + CAP_LIFETIME_S, CAP_OK },
        { T0 + CAP_LIFETIME_S + CAP_SKEW_S - 1, CAP_OK },
        { T0 + CAP_LIFETIME_S + CAP_SKEW_S, CAP_E_EXPIRED },
        { INT64_MAX, CAP_E_EXPIRED },
        { INT64_MIN, CAP_E_NOT_YET },
        { 0, CAP_E_NOT_YET },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cap_reason_t r = cap_verify(&ks_a, a.w, a.len, cases[i].now, &d);
        if (r != cases[i].want)
            printf("#   now = T0 %+lld\n", (long long)(cases[i].now - T0));
        ASSERT_REASON(r, cases[i].want);
    }

    /* at the edge of the representable range nothing wraps */
    c.iat = INT64_MAX - CAP_LIFETIME_S;
    c.exp = INT64_MAX;
    ASSERT_EQ(sign_wire(&key_a, &c, &a), 0);
    ASSERT_REASON(cap_verify(&ks_a, a.w, a.len, INT64_MAX, &d), CAP_OK);
    ASSERT_REASON(cap_verify(&ks_a, a.w, a.len, INT64_MAX - CAP_LIFETIME_S - CAP_SKEW_S, &d),
                  CAP_OK);
    ASSERT_REASON(cap_verify(&ks_a, a.w, a.len, INT64_MAX - CAP_LIFETIME_S - CAP_SKEW_S - 1, &d),
                  CAP_E_NOT_YET);
}

TEST(reason_and_verdict_names)
{
    static const char *const want[] = { "ok",      "malformed", "unknown_key", "signature",
                                        "not_yet", "expired",   "sandbox",     "purpose",
                                        "port",    "protocol",  "stale_run",   "no_run",
                                        "request", "body",      "replay" };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        ASSERT_STREQ(cap_reason_str((cap_reason_t)i), want[i]);
    ASSERT_STREQ(cap_verdict_str(CAP_ALLOW), "Allow");
    ASSERT_STREQ(cap_verdict_str(CAP_REFRESH_ROUTE), "RefreshRoute");
    ASSERT_STREQ(cap_verdict_str(CAP_DENY), "Deny");
}

/* ---- key set ------------------------------------------------------------------------------- */

TEST(keyset_set_and_find)
{
    cap_pubkey_t keys[CAP_KEYSET_MAX + 1];
    memset(keys, 0, sizeof keys);
    for (size_t i = 0; i < CAP_KEYSET_MAX + 1; i++) {
        (void)snprintf(keys[i].kid, sizeof keys[i].kid, "key-%zu", i);
        keys[i].pk[0] = (uint8_t)i;
    }
    cap_keyset_t ks = { .n = 0 };
    ASSERT_EQ(cap_keyset_set(&ks, keys, CAP_KEYSET_MAX + 1), -EINVAL);
    ASSERT_EQ(cap_keyset_set(&ks, keys, CAP_KEYSET_MAX), 0);
    ASSERT_EQ_U(ks.n, CAP_KEYSET_MAX);
    const cap_pubkey_t *k = cap_keyset_find(&ks, "key-5");
    ASSERT_TRUE(k != NULL);
    ASSERT_EQ(k->pk[0], 5);
    ASSERT_TRUE(cap_keyset_find(&ks, "key-8") == NULL);
    ASSERT_TRUE(cap_keyset_find(&ks, "key-") == NULL);
    ASSERT_TRUE(cap_keyset_find(&ks, NULL) == NULL);

    /* duplicate or invalid ids: refused, the set unchanged */
    memcpy(keys[2].kid, "key-1", 6);
    ASSERT_EQ(cap_keyset_set(&ks, keys, 3), -EINVAL);
    ASSERT_EQ_U(ks.n, CAP_KEYSET_MAX);
    memcpy(keys[2].kid, "key:2", 6);
    ASSERT_EQ(cap_keyset_set(&ks, keys, 3), -EINVAL);
    keys[2].kid[0] = '\0';
    ASSERT_EQ(cap_keyset_set(&ks, keys, 3), -EINVAL);
    ASSERT_EQ_U(ks.n, CAP_KEYSET_MAX);
    ASSERT_TRUE(cap_keyset_find(&ks, "key-7") != NULL);

    /* from its own storage (a shrink in place) and to empty */
    ASSERT_EQ(cap_keyset_set(&ks, ks.keys + 6, 2), 0);
    ASSERT_EQ_U(ks.n, 2);
    ASSERT_STREQ(ks.keys[0].kid, "key-6");
    ASSERT_TRUE(cap_keyset_find(&ks, "key-0") == NULL);
    ASSERT_EQ(cap_keyset_set(&ks, NULL, 0), 0);
    ASSERT_TRUE(cap_keyset_find(&ks, "key-6") == NULL);
}

/* ---- comparator ---------------------------------------------------------------------------- */

static const cap_expose_t exposed[] = {
    { 3000, CAP_PROTO_HTTP },
    { 8080, CAP_PROTO_HTTP },
    { 8080, CAP_PROTO_WEBSOCKET },
    { 9000, CAP_PROTO_WEBSOCKET },
};

static cap_request_t request(const cap_t *c, uint32_t purpose, const cap_run_t *installed)
{
    cap_request_t rq = {
        .sandbox = c->run.sandbox,
        .method = "POST",
        .method_len = 4,
        .target = TARGET,
        .target_len = strlen(TARGET),
        .purpose = purpose,
        .installed = installed,
        .expose = exposed,
        .n_expose = sizeof exposed / sizeof exposed[0],
    };
    if (purpose == CAP_PROXY) {
        rq.port = c->port;
        rq.proto = c->proto;
    }
    return rq;
}

TEST(compare_allow_and_refresh_route)
{
    cap_t c = base_cap();
    cap_run_t run = c.run;
    cap_request_t rq = request(&c, CAP_EXEC, &run);
    ASSERT_VERDICT(&c, &rq, CAP_ALLOW, CAP_OK);
    rq.purpose = CAP_FILES_READ;
    ASSERT_VERDICT(&c, &rq, CAP_ALLOW, CAP_OK);
    ASSERT_EQ(cap_compare(&c, &rq, NULL), CAP_ALLOW);

    /* each identity field: same sandbox, another incarnation */
    for (int f = 0; f < 5; f++) {
        run = c.run;
        switch (f) {
        case 0: run.generation++; break;
        case 1: memcpy(run.node, "node-b", 7); break;
        case 2: memcpy(run.substrate, "microvm", 8); break;
        case 3: memcpy(run.activation, "act:8", 6); break;
        case 4: memcpy(run.instance, "run.42x", 8); break;
        }
        rq = request(&c, CAP_EXEC, &run);
        if (cap_run_equal(&c.run, &run))
            printf("#   identity field %d\n", f);
        ASSERT_FALSE(cap_run_equal(&c.run, &run));
        ASSERT_VERDICT(&c, &rq, CAP_REFRESH_ROUTE, CAP_E_STALE_RUN);
    }
    rq = request(&c, CAP_EXEC, NULL);
    ASSERT_VERDICT(&c, &rq, CAP_REFRESH_ROUTE, CAP_E_NO_RUN);
}

TEST(compare_deny)
{
    cap_t c = base_cap();
    cap_run_t run = c.run;
    cap_request_t rq = request(&c, CAP_EXEC, &run);

    /* another sandbox: denied first, whatever else differs */
    rq.sandbox = "sbx-2";
    ASSERT_VERDICT(&c, &rq, CAP_DENY, CAP_E_SANDBOX);
    rq.sandbox = "sbx-1x";
    ASSERT_VERDICT(&c, &rq, CAP_DENY, CAP_E_SANDBOX);
    rq.sandbox = "sbx-";
    ASSERT_VERDICT(&c, &rq, CAP_DENY, CAP_E_SANDBOX);
    rq.sandbox = NULL;
    ASSERT_VERDICT(&c, &rq, CAP_DENY, CAP_E_SANDBOX);
    rq = request(&c, CAP_MANAGE, NULL);
    rq.sandbox = "other";
    ASSERT_VERDICT(&c, &rq, CAP_DENY, CAP_E_SANDBOX);

    /* purpose: not granted, not exactly one bit, unknown; checked before the run */
    uint32_t bad_purpose[] = { CAP_FILES_WRITE,           CAP_PROCESSES, CAP_PROXY, CAP_MANAGE, 0,
                               CAP_EXEC | CAP_FILES_READ, 1u << 7,       1u << 31 };
    for (size_t i = 0; i < sizeof bad_purpose / sizeof bad_purpose[0]; i++) {
        rq = request(&c, bad_purpose[i], &run);
        if (cap_compare(&c, &rq, NULL) != CAP_DENY)
            printf("#   purpose 0x%x\n", bad_purpose[i]);
        ASSERT_VERDICT(&c, &rq, CAP_DENY, CAP_E_PURPOSE);
        rq.installed = NULL;
        ASSERT_VERDICT(&c, &rq, CAP_DENY, CAP_E_PURPOSE);
    }
}

TEST(compare_proxy)
{
    cap_t c = proxy_cap(); /* 8080 HTTP */
    cap_run_t run = c.run;
    cap_request_t rq = request(&c, CAP_PROXY, &run);
    ASSERT_VERDICT(&c, &rq, CAP_ALLOW, CAP_OK);
    c.proto = CAP_PROTO_WEBSOCKET;
    rq.proto = CAP_PROTO_WEBSOCKET;
    ASSERT_VERDICT(&c, &rq, CAP_ALLOW, CAP_OK);
    c.proto = CAP_PROTO_HTTP;

    /* the capability names another port / protocol than the request uses: denied before the
     * run is looked at */
    rq = request(&c, CAP_PROXY, &run);
    rq.port = 3000;
    ASSERT_VERDICT(&c, &rq, CAP_DENY, CAP_E_PORT);
    rq.installed = NULL;
    ASSERT_VERDICT(&c, &rq, CAP_DENY, CAP_E_PORT);
    rq = request(&c, CAP_PROXY, &run);
    rq.proto = CAP_PROTO_WEBSOCKET;
    ASSERT_VERDICT(&c, &rq, CAP_DENY, CAP_E_PROTOCOL);
    rq.installed = NULL;
    ASSERT_VERDICT(&c, &rq, CAP_DENY, CAP_E_PROTOCOL);
    rq = request(&c, CAP_PROXY, &run);
    rq.port = 3000; /* both differ: the port is named first */
    rq.proto = CAP_PROTO_WEBSOCKET;
    ASSERT_VERDICT(&c, &rq, CAP_DENY, CAP_E_PORT);

    /* the run moved on: refresh comes before the exposure check */
    rq = request(&c, CAP_PROXY, NULL);
    ASSERT_VERDICT(&c, &rq, CAP_REFRESH_ROUTE, CAP_E_NO_RUN);
    run.generation++;
    rq = request(&c, CAP_PROXY, &run);
    ASSERT_VERDICT(&c, &rq, CAP_REFRESH_ROUTE, CAP_E_STALE_RUN);
    run = c.run;

    /* the installed run does not expose the port, or exposes it for another protocol */
    c.port = 4000;
    rq = request(&c, CAP_PROXY, &run);
    ASSERT_VERDICT(&c, &rq, CAP_DENY, CAP_E_PORT);
    c.port = 9000;
    rq = request(&c, CAP_PROXY, &run);
    ASSERT_VERDICT(&c, &rq, CAP_DENY, CAP_E_PROTOCOL);
    c.proto = CAP_PROTO_WEBSOCKET;
    rq = request(&c, CAP_PROXY, &run);
    ASSERT_VERDICT(&c, &rq, CAP_ALLOW, CAP_OK); /* control */
    rq.n_expose = 0;
    ASSERT_VERDICT(&c, &rq, CAP_DENY, CAP_E_PORT);
    rq.expose = NULL;
    rq.n_expose = 4;
    ASSERT_VERDICT(&c, &rq, CAP_DENY, CAP_E_PORT);

    /* a proxy capability does not allow other purposes, nor they the proxy */
    rq = request(&c, CAP_EXEC, &run);
    ASSERT_VERDICT(&c, &rq, CAP_DENY, CAP_E_PURPOSE);
    cap_t e = base_cap();
    rq = request(&e, CAP_PROXY, &run);
    rq.port = 9000;
    rq.proto = CAP_PROTO_WEBSOCKET;
    ASSERT_VERDICT(&e, &rq, CAP_DENY, CAP_E_PURPOSE);
}

/* ---- request binding, single use, signed key sets ------------------------------------------ */

TEST(compare_request_binding)
{
    cap_t c = base_cap();
    cap_run_t run = c.run;
    cap_request_t rq = request(&c, CAP_EXEC, &run);
    ASSERT_VERDICT(&c, &rq, CAP_ALLOW, CAP_OK); /* control */
    /* another method: a captured capability is good for its own request only */
    static const char *const methods[] = { "GET", "PUT", "POS", "POSTX", "post" };
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
        rq = request(&c, CAP_EXEC, &run);
        rq.method = methods[i];
        rq.method_len = strlen(methods[i]);
        ASSERT_VERDICT(&c, &rq, CAP_DENY, CAP_E_REQUEST);
    }
    /* another target: another path, a query added, one byte more or less */
    static const char *const targets[] = { "/v1/runs/sbx-1/ports/49983/v1/files/write",
                                           TARGET "?x=1", TARGET "/",
                                           "/v1/runs/sbx-1/ports/"
                                           "49983/v1/exe" };
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) {
        rq = request(&c, CAP_EXEC, &run);
        rq.target = targets[i];
        rq.target_len = strlen(targets[i]);
        ASSERT_VERDICT(&c, &rq, CAP_DENY, CAP_E_REQUEST);
    }
    rq = request(&c, CAP_EXEC, &run);
    rq.method = NULL;
    ASSERT_VERDICT(&c, &rq, CAP_DENY, CAP_E_REQUEST);
    rq = request(&c, CAP_EXEC, &run);
    rq.target = NULL;
    ASSERT_VERDICT(&c, &rq, CAP_DENY, CAP_E_REQUEST);
    /* the request is checked before the run: a stale run with another request is a Deny */
    run.generation++;
    rq = request(&c, CAP_EXEC, &run);
    rq.method = "GET";
    rq.method_len = 3;
    ASSERT_VERDICT(&c, &rq, CAP_DENY, CAP_E_REQUEST);
}

TEST(bind_request)
{
    cap_t c = base_cap(), m = base_cap(), m2 = base_cap();
    ASSERT_EQ(cap_bind_request(&c, "GET", 3, "/a?b", 4, NULL, 0), 0);
    ASSERT_STREQ(c.method, "GET");
    uint8_t d[CAP_DIGEST_BYTES];
    cap_digest("/a?b", 4, d);
    ASSERT_MEMEQ(c.target, sizeof c.target, d, sizeof d);
    ASSERT_FALSE(c.has_body);
    ASSERT_FALSE(c.has_nonce);
    ASSERT_FALSE(cap_body_matches(&c, "", 0)); /* names no body: nothing matches */
    ASSERT_EQ(cap_bind_request(&c, "POST", 4, "/a", 2, "", 0), 0);
    ASSERT_TRUE(c.has_body);
    ASSERT_TRUE(cap_body_matches(&c, "", 0));
    ASSERT_TRUE(cap_body_matches(&c, NULL, 0));
    ASSERT_FALSE(cap_body_matches(&c, "x", 1));
    ASSERT_EQ(cap_bind_request(&c, "get", 3, "/a", 2, NULL, 0), -EINVAL);
    ASSERT_EQ(cap_bind_request(&c, "", 0, "/a", 2, NULL, 0), -EINVAL);
    ASSERT_EQ(cap_bind_request(&c, "GETGETGETGETGETG", 16, "/a", 2, NULL, 0), -EINVAL);

    /* manage: a fresh 128-bit single-use id every time */
    m.access = m2.access = CAP_MANAGE;
    ASSERT_EQ(cap_bind_request(&m, "PUT", 3, "/v1/runs/sbx-1", 14, "{\"a\":1}", 7), 0);
    ASSERT_EQ(cap_bind_request(&m2, "PUT", 3, "/v1/runs/sbx-1", 14, "{\"a\":1}", 7), 0);
    ASSERT_TRUE(m.has_nonce && m2.has_nonce && m.has_body);
    ASSERT_TRUE(memcmp(m.nonce, m2.nonce, CAP_NONCE_BYTES) != 0);
    ASSERT_TRUE(cap_body_matches(&m, "{\"a\":1}", 7));
    ASSERT_FALSE(cap_body_matches(&m, "{\"a\":2}", 7));
    uint8_t p[CAP_PAYLOAD_MAX];
    ASSERT_GT(cap_encode(&m, p, sizeof p), 0);
}

TEST(replay_table)
{
    static cap_replay_t t; /* large: not on the stack */
    memset(&t, 0, sizeof t);
    cap_t a = manage_cap(), b = manage_cap(), plain = base_cap();
    b.nonce[0] ^= 1;
    ASSERT_REASON(cap_replay_use(&t, &a, T0), CAP_OK);
    ASSERT_REASON(cap_replay_use(&t, &a, T0), CAP_E_REPLAY);
    ASSERT_REASON(cap_replay_use(&t, &a, a.exp + CAP_SKEW_S - 1), CAP_E_REPLAY);
    ASSERT_REASON(cap_replay_use(&t, &b, T0), CAP_OK); /* another id */
    ASSERT_REASON(cap_replay_use(&t, &plain, T0), CAP_E_MALFORMED);
    /* once it can no longer verify, its id is forgotten */
    ASSERT_REASON(cap_replay_use(&t, &a, a.exp + CAP_SKEW_S), CAP_OK);
    ASSERT_EQ_U(t.n, 1);

    /* full of unexpired ids: new ones are refused, never an old one forgotten */
    memset(&t, 0, sizeof t);
    for (uint32_t i = 0; i < CAP_REPLAY_SLOTS; i++) {
        cap_t c = manage_cap();
        memcpy(c.nonce, &i, sizeof i);
        if (cap_replay_use(&t, &c, T0) != CAP_OK)
            printf("#   id %u\n", i);
        ASSERT_REASON(cap_replay_use(&t, &c, T0 + 1), CAP_E_REPLAY);
    }
    cap_t extra = manage_cap();
    memset(extra.nonce, 0xee, sizeof extra.nonce);
    ASSERT_REASON(cap_replay_use(&t, &extra, T0), CAP_E_REPLAY);
    uint32_t first = 0;
    cap_t again = manage_cap();
    memcpy(again.nonce, &first, sizeof first);
    ASSERT_REASON(cap_replay_use(&t, &again, T0), CAP_E_REPLAY);
    /* positive control: once they expire there is room again */
    ASSERT_REASON(cap_replay_use(&t, &extra, again.exp + CAP_SKEW_S), CAP_OK);
}

TEST(signed_keyset)
{
    cap_identity_t id, other;
    ASSERT_EQ(crypto_sign_keypair(id.pk, id.sk), 0);
    ASSERT_EQ(crypto_sign_keypair(other.pk, other.sk), 0);
    cap_pubkey_t keys[2];
    memset(keys, 0, sizeof keys);
    memcpy(keys[0].kid, "k-new", 6);
    memset(keys[0].pk, 1, CAP_PK_BYTES);
    memcpy(keys[1].kid, "k-old", 6);
    memset(keys[1].pk, 2, CAP_PK_BYTES);
    char w[CAP_KEYSET_WIRE_MAX], f[CAP_KEYSET_WIRE_MAX];
    int n = cap_keyset_sign(&id, 7, keys, 2, w, sizeof w);
    ASSERT_GT(n, 0);
    ASSERT_EQ_U(strlen(w), (size_t)n);
    cap_keyset_t ks;
    uint64_t v = 0;
    ASSERT_EQ(cap_keyset_open(id.pk, w, (size_t)n, &v, &ks), 0);
    ASSERT_EQ_U(v, 7);
    ASSERT_EQ_U(ks.n, 2);
    ASSERT_TRUE(cap_keyset_find(&ks, "k-old") != NULL);
    ASSERT_EQ(cap_keyset_find(&ks, "k-old")->pk[0], 2);
    /* deterministic: the same set and version give the same bytes (replicas agree) */
    ASSERT_EQ(cap_keyset_sign(&id, 7, keys, 2, f, sizeof f), n);
    ASSERT_STREQ(f, w);

    /* another signer: refused under the pinned key, accepted under its own (control) */
    int m = cap_keyset_sign(&other, 8, keys, 1, f, sizeof f);
    ASSERT_GT(m, 0);
    ASSERT_EQ(cap_keyset_open(id.pk, f, (size_t)m, &v, &ks), -EPERM);
    ASSERT_EQ(cap_keyset_open(other.pk, f, (size_t)m, &v, &ks), 0);
    ASSERT_EQ_U(v, 8);

    /* tampering anywhere: one character of the payload, of the signature; the parts swapped */
    for (int i = 0; i < n; i++) {
        if (w[i] == '.')
            continue;
        memcpy(f, w, (size_t)n + 1);
        f[i] = f[i] == 'A' ? 'B' : 'A';
        int r = cap_keyset_open(id.pk, f, (size_t)n, &v, &ks);
        if (r != -EPERM && r != -EBADMSG)
            printf("#   offset %d\n", i);
        ASSERT_TRUE(r == -EPERM || r == -EBADMSG);
    }
    ASSERT_EQ(cap_keyset_open(id.pk, w, (size_t)n - 1, &v, &ks), -EBADMSG);
    ASSERT_EQ(cap_keyset_open(id.pk, "", 0, &v, &ks), -EBADMSG);
    ASSERT_EQ(cap_keyset_open(id.pk, "abc", 3, &v, &ks), -EBADMSG);
    /* a capability signature is not a key set signature (another magic) */
    ASSERT_EQ(cap_keyset_sign(&id, 1, keys, 0, f, sizeof f), -EINVAL);
    memcpy(keys[1].kid, "k-new", 6); /* duplicate ids */
    ASSERT_EQ(cap_keyset_sign(&id, 1, keys, 2, f, sizeof f), -EINVAL);
    ASSERT_EQ(cap_keyset_sign(&id, 1, keys, 1, f, 10), -ENOBUFS);
}

/* ---- rotation ------------------------------------------------------------------------------ */

#define PUBLISH_DELAY 60
#define RETIRE_K1 (T0 + 3600)

static void rotation_recs(cap_keyrec_t recs[2])
{
    memset(recs, 0, 2 * sizeof recs[0]);
    recs[0].key = key_a; /* k1 */
    recs[0].created = T0;
    recs[0].activate = T0 + PUBLISH_DELAY;
    recs[0].retired = RETIRE_K1;
    recs[1].key = key_b; /* k2, published 600 s before k1 retires */
    recs[1].created = RETIRE_K1 - 600;
    recs[1].activate = RETIRE_K1 - 600 + PUBLISH_DELAY;
    recs[1].retired = 0;
}

static const char *signer_kid(const cap_keyrec_t *recs, size_t n, int64_t now)
{
    const cap_keyrec_t *r = cap_rotation_signer(recs, n, now);
    return r ? r->key.kid : "(none)";
}

TEST(rotation_signer)
{
    cap_keyrec_t recs[2];
    rotation_recs(recs);
    ASSERT_STREQ(signer_kid(recs, 2, T0 - 1), "(none)");
    ASSERT_STREQ(signer_kid(recs, 2, T0), "(none)"); /* published, not yet signing */
    ASSERT_STREQ(signer_kid(recs, 2, T0 + PUBLISH_DELAY - 1), "(none)");
    ASSERT_STREQ(signer_kid(recs, 2, T0 + PUBLISH_DELAY), "k1");
    ASSERT_STREQ(signer_kid(recs, 2, RETIRE_K1 - 600), "k1"); /* k2 published only */
    ASSERT_STREQ(signer_kid(recs, 2, RETIRE_K1 - 600 + PUBLISH_DELAY - 1), "k1");
    ASSERT_STREQ(signer_kid(recs, 2, RETIRE_K1 - 600 + PUBLISH_DELAY), "k2"); /* newer */
    ASSERT_STREQ(signer_kid(recs, 2, RETIRE_K1), "k2");
    ASSERT_STREQ(signer_kid(recs, 2, RETIRE_K1 + 100000), "k2");

    /* the order of the records does not matter */
    cap_keyrec_t rev[2] = { recs[1], recs[0] };
    ASSERT_STREQ(signer_kid(rev, 2, RETIRE_K1 - 600 + PUBLISH_DELAY), "k2");
    ASSERT_STREQ(signer_kid(rev, 2, RETIRE_K1 - 600 + PUBLISH_DELAY - 1), "k1");

    /* only k1: nothing to sign with from its retirement on */
    ASSERT_STREQ(signer_kid(recs, 1, RETIRE_K1 - 1), "k1");
    ASSERT_STREQ(signer_kid(recs, 1, RETIRE_K1), "(none)");
    ASSERT_STREQ(signer_kid(recs, 0, RETIRE_K1), "(none)");
}

/* The verify set at now as a string "kid,kid,..." (newest first). */
static const char *verify_set_str(const cap_keyrec_t *recs, size_t n, int64_t now, size_t max,
                                  char *buf, size_t cap)
{
    cap_pubkey_t out[CAP_KEYSET_MAX];
    size_t k = cap_rotation_verify_set(recs, n, now, out, max);
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < k && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%s", i ? "," : "", out[i].kid);
    return buf;
}

TEST(rotation_verify_set)
{
    cap_keyrec_t recs[2];
    char buf[128];
    rotation_recs(recs);
    const int64_t keep = CAP_LIFETIME_S + CAP_SKEW_S;
    ASSERT_STREQ(verify_set_str(recs, 2, T0 - 1, 8, buf, sizeof buf), "");
    ASSERT_STREQ(verify_set_str(recs, 2, T0, 8, buf, sizeof buf), "k1"); /* before signing */
    ASSERT_STREQ(verify_set_str(recs, 2, RETIRE_K1 - 601, 8, buf, sizeof buf), "k1");
    ASSERT_STREQ(verify_set_str(recs, 2, RETIRE_K1 - 600, 8, buf, sizeof buf), "k2,k1");
    ASSERT_STREQ(verify_set_str(recs, 2, RETIRE_K1, 8, buf, sizeof buf), "k2,k1");
    ASSERT_STREQ(verify_set_str(recs, 2, RETIRE_K1 + keep - 1, 8, buf, sizeof buf), "k2,k1");
    ASSERT_STREQ(verify_set_str(recs, 2, RETIRE_K1 + keep, 8, buf, sizeof buf), "k2");
    /* newest first whatever the record order; max keeps the newest */
    cap_keyrec_t rev[2] = { recs[1], recs[0] };
    ASSERT_STREQ(verify_set_str(rev, 2, RETIRE_K1, 8, buf, sizeof buf), "k2,k1");
    ASSERT_STREQ(verify_set_str(recs, 2, RETIRE_K1, 1, buf, sizeof buf), "k2");
    ASSERT_STREQ(verify_set_str(recs, 2, RETIRE_K1, 0, buf, sizeof buf), "");

    cap_pubkey_t out[2];
    ASSERT_EQ_U(cap_rotation_verify_set(recs, 2, RETIRE_K1, out, 2), 2);
    ASSERT_MEMEQ(out[1].pk, sizeof out[1].pk, key_a.pk, sizeof key_a.pk);
    ASSERT_MEMEQ(out[0].pk, sizeof out[0].pk, key_b.pk, sizeof key_b.pk);

    ASSERT_FALSE(cap_rotation_expired(&recs[1], RETIRE_K1 + 1000000)); /* in service */
    ASSERT_FALSE(cap_rotation_expired(&recs[0], RETIRE_K1 - 1));
    ASSERT_FALSE(cap_rotation_expired(&recs[0], RETIRE_K1 + keep - 1));
    ASSERT_TRUE(cap_rotation_expired(&recs[0], RETIRE_K1 + keep));
    recs[0].retired = INT64_MAX - 10; /* no wrap near the end of time */
    ASSERT_FALSE(cap_rotation_expired(&recs[0], INT64_MAX - 1));
    ASSERT_STREQ(verify_set_str(recs, 2, INT64_MAX, 8, buf, sizeof buf), "k2,k1");
}

/* A capability signed by the old key just before its retirement verifies on a node that
 * holds the set computed at any time in the overlap, until the capability expires, and the
 * key is gone from the set after that. */
TEST(rotation_overlap_end_to_end)
{
    cap_keyrec_t recs[2];
    rotation_recs(recs);
    /* the last second k1 can sign if k2 had not taken over (recs[0] alone) */
    const cap_keyrec_t *signer = cap_rotation_signer(recs, 1, RETIRE_K1 - 1);
    ASSERT_TRUE(signer != NULL);
    ASSERT_STREQ(signer->key.kid, "k1");
    cap_t c = base_cap(), d;
    c.iat = RETIRE_K1 - 1;
    c.exp = c.iat + CAP_LIFETIME_S;
    wire_t w;
    ASSERT_EQ(sign_wire(&signer->key, &c, &w), 0);

    const int64_t keep = CAP_LIFETIME_S + CAP_SKEW_S;
    for (int64_t now = RETIRE_K1 - 1; now <= RETIRE_K1 + keep + 1; now++) {
        cap_pubkey_t pks[CAP_KEYSET_MAX];
        cap_keyset_t ks;
        size_t k = cap_rotation_verify_set(recs, 2, now, pks, CAP_KEYSET_MAX);
        ASSERT_EQ(cap_keyset_set(&ks, pks, k), 0);
        cap_reason_t r = cap_verify(&ks, w.w, w.len, now, &d);
        cap_reason_t want = now < c.exp + CAP_SKEW_S ? CAP_OK
                            : now < RETIRE_K1 + keep ? CAP_E_EXPIRED
                                                     : CAP_E_UNKNOWN_KEY;
        if (r != want)
            printf("#   now = retired %+lld\n", (long long)(now - RETIRE_K1));
        ASSERT_REASON(r, want);
    }
    /* the window is tight: the last second it verifies is the last one the key is kept for,
     * minus one (iat < retired) */
    ASSERT_EQ(c.exp + CAP_SKEW_S, RETIRE_K1 + keep - 1);
}

int main(void)
{
    if (setup_keys() < 0) {
        printf("Bail out! key setup failed\n");
        return 1;
    }
    const tap_test_t tests[] = {
        T(encode_golden_bytes),
        T(encode_decode_round_trip),
        T(encode_buffer_size),
        T(encode_refuses_each_invalid_field),
        T(encode_accepts_each_bound),
        T(id_valid),
        T(decode_refuses_prefixes_and_trailing_bytes),
        T(decode_refuses_non_canonical),
        T(decode_mutated_bytes_iff_canonical),
        T(key_generate),
        T(sign_verify),
        T(verify_malformed),
        T(verify_unknown_key),
        T(verify_forged_and_tampered),
        T(verify_time_window),
        T(sign_reuse),
        T(verify_reuse),
        T(reason_and_verdict_names),
        T(keyset_set_and_find),
        T(compare_allow_and_refresh_route),
        T(compare_deny),
        T(compare_proxy),
        T(compare_request_binding),
        T(bind_request),
        T(replay_table),
        T(signed_keyset),
        T(rotation_signer),
        T(rotation_verify_set),
        T(rotation_overlap_end_to_end),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0]);
}
