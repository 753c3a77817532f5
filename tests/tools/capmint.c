/* SPDX-License-Identifier: MIT */
/* capmint: mint a capability for the platform tests, as sbx-control would, but with every field
 * chosen by the caller (so that a test can send a node exactly the capability it wants to see
 * refused: another run, another sandbox, expired, not yet valid, forged, wrong purpose).
 *
 *   capmint --store DIR/store.db --sandbox S --generation N --node NAME --substrate process
 *           --activation A --instance I --access exec|files_read|files_write|processes|proxy|
 *           manage[,...] [--port P --protocol http|websocket] [--iat-offset SECONDS]
 *           [--lifetime SECONDS] [--forge] [--kid KID]
 *           --method M --target T [--body TEXT | --body-file F]
 *
 * Every capability (v2) names its request: --method and --target (what the node receives as
 * the request target); --body or --body-file names the body's digest too (required with manage,
 * which also gets a fresh single-use id).
 *
 * The signing key is the control plane's current signer (cap_rotation_signer) read from the
 * store, or the key named by --kid. --forge signs with a freshly generated key under that
 * key's id (or under --kid even when the store has no such key): a capability whose signature
 * cannot verify, or whose key id no node knows. Prints the wire form on stdout.
 *
 * The signing keys' secret parts are sealed in the store: capmint opens them with the control's
 * secrets key file (--secrets-key, default secrets.key beside the store).
 *   capmint --store FILE --dump-secret-keys
 * prints "<kid> <base64url secret key>" for every signing key instead (for the tests that look
 * for those bytes in the store's files). */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <sodium.h>

#include "cap/cap.h"
#include "common/macro.h"
#include "common/strutil.h"
#include "control/control.h"
#include "store/store.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: capmint --store FILE --sandbox S --generation N --node NAME\n"
               "               --substrate SUB --activation A --instance I\n"
               "               --access "
               "exec|files_read|files_write|processes|proxy|manage|state_read[,..]\n"
               "               [--port P --protocol http|websocket] [--iat-offset SECONDS]\n"
               "               [--lifetime SECONDS] [--forge] [--kid KID]\n"
               "               --method M --target T [--body TEXT | --body-file F]\n"
               "               [--secrets-key FILE]\n"
               "       capmint --store FILE [--secrets-key FILE] --dump-secret-keys\n");
}

/* [+-]digits, |value| <= max */
static int parse_i64(const char *s, uint64_t max, int64_t *ret)
{
    bool neg = s[0] == '-';
    uint64_t v;
    int r = parse_u64_str(s + (neg || s[0] == '+'), max, &v);
    if (r < 0)
        return r;
    *ret = neg ? -(int64_t)v : (int64_t)v;
    return 0;
}

static int parse_access(const char *s, uint32_t *ret)
{
    static const struct {
        const char *name;
        uint32_t bit;
    } names[] = { { "exec", CAP_EXEC },
                  { "files_read", CAP_FILES_READ },
                  { "files_write", CAP_FILES_WRITE },
                  { "processes", CAP_PROCESSES },
                  { "proxy", CAP_PROXY },
                  { "manage", CAP_MANAGE },
                  { "state_read", CAP_STATE_READ } };
    uint32_t acc = 0;
    sv_t rest = sv_make(s, strlen(s));
    while (rest.len > 0) {
        const char *comma = memchr(rest.p, ',', rest.len);
        sv_t item = sv_make(rest.p, comma ? (size_t)(comma - rest.p) : rest.len);
        rest = comma ? sv_make(comma + 1, rest.len - item.len - 1) : SV("");
        size_t i;
        for (i = 0; i < ELEMENTSOF(names); i++)
            if (sv_eq(item, sv_make(names[i].name, strlen(names[i].name))))
                break;
        if (i == ELEMENTSOF(names))
            return -EINVAL;
        acc |= names[i].bit;
    }
    if (acc == 0)
        return -EINVAL;
    *ret = acc;
    return 0;
}

static int copy_id(char *dst, size_t cap, const char *src)
{
    if (strlen(src) >= cap)
        return -ENAMETOOLONG;
    memcpy(dst, src, strlen(src) + 1);
    return 0;
}

typedef struct {
    const char *store;
    const char *secrets_key;
    const char *kid;
    bool forge, dump;
    int64_t iat_offset;
    int64_t lifetime;
    const char *method, *target, *body, *body_file;
    cap_t cap;
} args_t;

static int parse_args(int argc, char **argv, args_t *a)
{
    static const struct option opts[] = {
        { "store", required_argument, NULL, 'S' },
        { "sandbox", required_argument, NULL, 's' },
        { "generation", required_argument, NULL, 'g' },
        { "node", required_argument, NULL, 'n' },
        { "substrate", required_argument, NULL, 'b' },
        { "activation", required_argument, NULL, 'a' },
        { "instance", required_argument, NULL, 'i' },
        { "access", required_argument, NULL, 'x' },
        { "port", required_argument, NULL, 'p' },
        { "protocol", required_argument, NULL, 'P' },
        { "iat-offset", required_argument, NULL, 'o' },
        { "lifetime", required_argument, NULL, 'L' },
        { "forge", no_argument, NULL, 'F' },
        { "kid", required_argument, NULL, 'k' },
        { "method", required_argument, NULL, 'M' },
        { "target", required_argument, NULL, 'T' },
        { "body", required_argument, NULL, 'B' },
        { "body-file", required_argument, NULL, 'f' },
        { "secrets-key", required_argument, NULL, 'K' },
        { "dump-secret-keys", no_argument, NULL, 'D' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    cap_t *c = &a->cap;
    *a = (args_t){ .lifetime = CAP_LIFETIME_S };
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int r = 0;
        uint64_t v = 0;
        switch (o) {
        case 'S': a->store = optarg; break;
        case 's': r = copy_id(c->run.sandbox, sizeof c->run.sandbox, optarg); break;
        case 'g':
            r = parse_u64_str(optarg, UINT64_MAX, &v);
            c->run.generation = v;
            break;
        case 'n': r = copy_id(c->run.node, sizeof c->run.node, optarg); break;
        case 'b': r = copy_id(c->run.substrate, sizeof c->run.substrate, optarg); break;
        case 'a': r = copy_id(c->run.activation, sizeof c->run.activation, optarg); break;
        case 'i': r = copy_id(c->run.instance, sizeof c->run.instance, optarg); break;
        case 'x': r = parse_access(optarg, &c->access); break;
        case 'p':
            r = parse_u64_str(optarg, 65535, &v);
            c->port = (uint16_t)v;
            break;
        case 'P':
            if (streq(optarg, "http"))
                c->proto = CAP_PROTO_HTTP;
            else if (streq(optarg, "websocket"))
                c->proto = CAP_PROTO_WEBSOCKET;
            else
                r = -EINVAL;
            break;
        case 'o': r = parse_i64(optarg, 10L * 365 * 86400, &a->iat_offset); break;
        case 'L': r = parse_i64(optarg, CAP_LIFETIME_S, &a->lifetime); break;
        case 'F': a->forge = true; break;
        case 'k': a->kid = optarg; break;
        case 'M': a->method = optarg; break;
        case 'T': a->target = optarg; break;
        case 'B': a->body = optarg; break;
        case 'f': a->body_file = optarg; break;
        case 'K': a->secrets_key = optarg; break;
        case 'D': a->dump = true; break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return -EINVAL;
        }
        if (r < 0) {
            fprintf(stderr, "capmint: bad option value: %s\n", optarg);
            return -EINVAL;
        }
    }
    if (a->dump && optind == argc && a->store)
        return 0;
    if (optind != argc || !a->store || !c->run.sandbox[0] || !c->run.node[0] ||
        !c->run.substrate[0] || !c->run.activation[0] || !c->run.instance[0] || c->access == 0 ||
        !a->method || !a->target || (a->body && a->body_file)) {
        usage(stderr);
        return -EINVAL;
    }
    if (a->lifetime < 1) {
        fprintf(stderr, "capmint: --lifetime must be 1..%d\n", CAP_LIFETIME_S);
        return -EINVAL;
    }
    return 0;
}

static void store_closep(store_t **s) { store_close(*s); }

/* The key to sign with: --kid, else the current signer. */
static int pick_key(const args_t *a, cap_signkey_t *ret)
{
    struct stat st;
    /* never create a store: a wrong path is a mistake in the test, not a new platform */
    if (stat(a->store, &st) < 0) {
        fprintf(stderr, "capmint: %s: %s\n", a->store, strerror(errno));
        return -errno;
    }
    _cleanup_(store_closep) store_t *s = NULL;
    int r = store_open_sqlite(a->store, &s);
    if (r < 0) {
        fprintf(stderr, "capmint: cannot open %s: %s\n", a->store, strerror(-r));
        return r;
    }
    char kpath[PATH_MAX];
    sbx_err_t err = { 0 };
    const char *slash = strrchr(a->store, '/');
    if (a->secrets_key)
        (void)snprintf(kpath, sizeof kpath, "%s", a->secrets_key);
    else
        (void)snprintf(kpath, sizeof kpath, "%.*s/secrets.key", slash ? (int)(slash - a->store) : 1,
                       slash ? a->store : ".");
    seal_keys_t seal;
    r = seal_keys_load(kpath, &seal, &err);
    if (r < 0) {
        fprintf(stderr, "capmint: %s\n", err.msg[0] ? err.msg : strerror(-r));
        return r;
    }
    keyring_t kr;
    r = keys_load(s, &seal, &kr);
    sodium_memzero(&seal, sizeof seal);
    if (r < 0) {
        fprintf(stderr, "capmint: cannot read the signing keys: %s\n", strerror(-r));
        return r;
    }
    if (a->dump) {
        for (size_t i = 0; i < kr.n; i++) {
            char b[sodium_base64_ENCODED_LEN(CAP_SK_BYTES,
                                             sodium_base64_VARIANT_URLSAFE_NO_PADDING)];
            sodium_bin2base64(b, sizeof b, kr.recs[i].key.sk, CAP_SK_BYTES,
                              sodium_base64_VARIANT_URLSAFE_NO_PADDING);
            printf("%s %s\n", kr.recs[i].key.kid, b);
        }
        sodium_memzero(&kr, sizeof kr);
        return 1; /* done: nothing to sign */
    }
    const cap_keyrec_t *k = NULL;
    if (a->kid) {
        for (size_t i = 0; i < kr.n && !k; i++)
            if (streq(kr.recs[i].key.kid, a->kid))
                k = &kr.recs[i];
    } else
        k = cap_rotation_signer(kr.recs, kr.n, (int64_t)time(NULL));
    r = 0;
    if (!k && a->kid && a->forge && strlen(a->kid) < CAP_KID_MAX) {
        /* a forgery may name a key id the platform never had (unknown_key) */
        *ret = (cap_signkey_t){ 0 };
        memcpy(ret->kid, a->kid, strlen(a->kid) + 1);
    } else if (!k) {
        fprintf(stderr, "capmint: no signing key %s in the store\n", a->kid ? a->kid : "in use");
        r = -ENOKEY;
    } else
        *ret = k->key;
    sodium_memzero(&kr, sizeof kr);
    return r;
}

int main(int argc, char **argv)
{
    args_t a;
    if (parse_args(argc, argv, &a) < 0)
        return 2;
    if (sodium_init() < 0)
        return 1;
    cap_signkey_t key;
    int pr = pick_key(&a, &key);
    if (a.dump)
        return pr < 0 ? 1 : 0;
    if (pr < 0)
        return 1;
    if (a.forge) { /* same key id, another key: the signature cannot verify */
        char kid[CAP_KID_MAX];
        memcpy(kid, key.kid, sizeof kid);
        if (cap_key_generate(kid, &key) < 0) {
            fprintf(stderr, "capmint: cannot generate a key\n");
            return 1;
        }
    }
    char *body = NULL;
    size_t body_len = 0;
    if (a.body_file) {
        FILE *f = fopen(a.body_file, "re");
        if (!f || getdelim(&body, &body_len, '\0', f) < 0) { /* the whole file (no NULs) */
            fprintf(stderr, "capmint: cannot read %s\n", a.body_file);
            return 1;
        }
        fclose(f);
        body_len = strlen(body);
    } else if (a.body) {
        body = strdup(a.body);
        body_len = strlen(body);
    }
    if (cap_bind_request(&a.cap, a.method, strlen(a.method), a.target, strlen(a.target), body,
                         body_len) < 0) {
        fprintf(stderr, "capmint: bad --method\n");
        return 2;
    }
    free(body);
    a.cap.iat = (int64_t)time(NULL) + a.iat_offset;
    a.cap.exp = a.cap.iat + a.lifetime;
    char wire[CAP_WIRE_MAX + 1];
    int r = cap_sign(&key, &a.cap, wire, sizeof wire);
    sodium_memzero(&key, sizeof key);
    if (r < 0) {
        fprintf(stderr, "capmint: cannot sign: %s\n", strerror(-r));
        return 1;
    }
    printf("%s\n", wire);
    return 0;
}
