/* SPDX-License-Identifier: MIT */
/* Principals and bearer tokens. A token is 160 random bits ("sbx_" + hex); the store keeps only
 * its SHA-256 (tokens/<hash>), so a copy of the store grants nothing. The first start of an
 * empty store creates an admin token and writes it, 0600, where the client finds it; it also
 * creates the join token that nodes present to register (state dir, 0600). */
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <sys/stat.h>

#include "common/fileio.h"
#include "common/log.h"
#include "control.h"

int random_hex(char *out, size_t nbytes)
{
    unsigned char b[64];
    if (nbytes > sizeof b)
        return -EINVAL;
    randombytes_buf(b, nbytes);
    sodium_bin2hex(out, 2 * nbytes + 1, b, nbytes);
    return 0;
}

void auth_token_hash(const char *token, char out[65])
{
    unsigned char h[crypto_hash_sha256_BYTES];
    crypto_hash_sha256(h, (const unsigned char *)token, strlen(token));
    sodium_bin2hex(out, 65, h, sizeof h);
}

static const char *role_name(role_t r)
{
    return r == ROLE_ADMIN ? "admin" : r == ROLE_WRITE ? "write" : r == ROLE_READ ? "read" : "none";
}

static role_t role_parse(const char *s)
{
    return !s                  ? ROLE_NONE
           : streq(s, "admin") ? ROLE_ADMIN
           : streq(s, "write") ? ROLE_WRITE
           : streq(s, "read")  ? ROLE_READ
                               : ROLE_NONE;
}

/* Write a secret file with mode 0600 (its directory 0700 if we create it). */
static int write_secret(const char *path, const char *value)
{
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (slash && slash != path && (size_t)(slash - path) < sizeof dir) {
        memcpy(dir, path, (size_t)(slash - path));
        dir[slash - path] = 0;
        if (mkdir(dir, 0700) < 0 && errno != EEXIST)
            return negative_errno();
    }
    char line[256];
    int n = snprintf(line, sizeof line, "%s\n", value);
    if (n < 0 || (size_t)n >= sizeof line)
        return -E2BIG;
    int r = file_write_atomic(path, line, (size_t)n, 0600);
    sodium_memzero(line, sizeof line);
    return r;
}

static int token_create(store_t *st, const char *principal, const char *ns, role_t role,
                        char out[64])
{
    char hex[41], hash[65], key[80];
    random_hex(hex, 20);
    (void)snprintf(out, 64, "sbx_%s", hex);
    auth_token_hash(out, hash);
    (void)snprintf(key, sizeof key, "tokens/%s", hash);
    json_t *j = json_pack("{s:s,s:s,s:s,s:I}", "principal", principal, "namespace", ns, "role",
                          role_name(role), "created_ms", (json_int_t)wall_ms());
    char *v = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!v)
        return -ENOMEM;
    int r = store_cas(st, key, v, strlen(v), STORE_REV_ABSENT, NULL);
    free(v);
    return r;
}

int auth_bootstrap(control_t *ctl)
{
    store_kv_t *kvs;
    size_t n;
    int r = store_list(ctl->store, "tokens/", &kvs, &n);
    if (r < 0)
        return r;
    store_kv_free(kvs, n);
    if (n == 0) {
        char tok[64];
        r = token_create(ctl->store, "admin", "*", ROLE_ADMIN, tok);
        if (r >= 0)
            r = write_secret(ctl->cfg.admin_token_file, tok);
        sodium_memzero(tok, sizeof tok);
        if (r < 0) {
            log_error("cannot create the admin token at %s: %s", ctl->cfg.admin_token_file,
                      strerror(-r));
            return r;
        }
        log_info("created the admin token: %s (mode 0600)", ctl->cfg.admin_token_file);
    }
    /* The join material nodes register with: the join token (its hash in the store) and the
     * control plane's identity public key, which the node pins, as one string in the state
     * dir: "sbxjoin2.<token>.<base64url identity public key>.<base64url SHA-256 of the TLS CA
     * certificate>" ("sbxjoin1.<token>.<key>" under --insecure-plain-http). */
    char path[PATH_MAX + 32], pk[64], text[256] = "", tok[64] = "", hash[65];
    (void)snprintf(path, sizeof path, "%s/node-join.token", ctl->cfg.state_dir);
    r = identity_pk_b64(&ctl->identity, pk, sizeof pk);
    if (r < 0)
        return r;
    FILE *f = fopen(path, "re");
    if (f) {
        size_t k = fread(text, 1, sizeof text - 1, f);
        fclose(f);
        text[k] = 0;
        text[strcspn(text, "\r\n")] = 0;
    }
    /* an existing token (this format, or the bare token of before) stays valid */
    const char *t =
        strncmp(text, "sbxjoin1.", 9) == 0 || strncmp(text, "sbxjoin2.", 9) == 0 ? text + 9 : text;
    size_t tl = strcspn(t, ".");
    if (tl > 0 && tl < sizeof tok) {
        memcpy(tok, t, tl);
        tok[tl] = 0;
    }
    store_kv_t kv;
    bool keep = false;
    if (tok[0] && store_get(ctl->store, "meta/join-token", &kv) == 0) {
        auth_token_hash(tok, hash);
        keep = kv.value_len == 64 && memcmp(kv.value, hash, 64) == 0;
        store_kv_clear(&kv);
    }
    if (!keep) {
        char hex[41];
        random_hex(hex, 20);
        (void)snprintf(tok, sizeof tok, "sbxjoin_%s", hex);
        auth_token_hash(tok, hash);
        r = store_cas(ctl->store, "meta/join-token", hash, strlen(hash), STORE_REV_ANY, NULL);
        if (r < 0) {
            log_error("cannot create the node join token: %s", strerror(-r));
            return r;
        }
    }
    char want[256];
    if (ctl->tls_server) /* TLS: the CA's pin too */
        (void)snprintf(want, sizeof want, "sbxjoin2.%s.%s.%s", tok, pk, ctl->ca_pin_b64);
    else
        (void)snprintf(want, sizeof want, "sbxjoin1.%s.%s", tok, pk);
    r = streq(want, text) ? 0 : write_secret(path, want);
    sodium_memzero(tok, sizeof tok);
    sodium_memzero(text, sizeof text);
    sodium_memzero(want, sizeof want);
    if (r < 0)
        log_error("cannot write the node join material %s: %s", path, strerror(-r));
    return r;
}

static bool bearer(conn_t *c, char *out, size_t cap)
{
    sv_t v;
    if (!http_header_get(&c->req, "authorization", &v) || v.len < 8 ||
        !sv_eq_lit_nocase(sv_make(v.p, 7), "bearer "))
        return false;
    sv_t t = sv_make(v.p + 7, v.len - 7);
    while (t.len && t.p[0] == ' ')
        t = sv_make(t.p + 1, t.len - 1);
    if (t.len == 0 || t.len >= cap || memchr(t.p, 0, t.len))
        return false;
    memcpy(out, t.p, t.len);
    out[t.len] = 0;
    return true;
}

static void unauthorized(conn_t *c, const char *msg)
{
    c->keep_alive = c->keep_alive && c->body_left == 0;
    json_t *j = json_pack("{s:s}", "error", msg);
    char *b = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    (void)conn_respond(c, HTTP_UNAUTHORIZED, "application/json", b ? b : "{}", b ? strlen(b) : 2,
                       "WWW-Authenticate: Bearer realm=\"sbx\"\r\n");
    free(b);
}

static bool principal_allowed(conn_t *c, const principal_t *pr, const char *ns, role_t need,
                              principal_t *ret)
{
    /* "" is a global operation: only principals of every namespace ("*") may; the reserved
     * namespace (the E2B API's, for keys of every namespace) is theirs alone, even for a token
     * of that name made before it was reserved */
    bool ns_ok =
        streq(pr->ns, "*") || (ns && *ns && streq(pr->ns, ns) && !streq(ns, CONTROL_RESERVED_NS));
    if (!ns_ok || pr->role < need) {
        http_forbidden(c, 0, "token of %s may not %s in namespace %s", pr->principal,
                       need == ROLE_ADMIN   ? "administer"
                       : need == ROLE_WRITE ? "write"
                                            : "read",
                       ns && *ns ? ns : "(any)");
        return false;
    }
    if (ret)
        *ret = *pr;
    return true;
}

/* Per principal (connlimit.h, per owner): from its first authenticated request a connection
 * counts as its principal's, at most cfg.max_conns_per_principal at once (a connection whose
 * later request presents another principal's token moves to that one). Over the limit the
 * request is answered 429 with Retry-After and its connection closes after the answer; the
 * principal's other connections, and every other principal, are not affected. */
bool auth_account(control_t *ctl, conn_t *c, const char *owner)
{
    int r = climit_set_owner(c, ctl->principals, owner, strlen(owner),
                             ctl->cfg.max_conns_per_principal);
    if (r == -EUSERS) {
        log_debug("%s: over its %llu connections", owner,
                  (unsigned long long)ctl->cfg.max_conns_per_principal);
        conn_close_after(c);
        json_t *j = json_pack("{s:s}", "error", "too many connections for this principal");
        char *b = j ? json_dumps(j, JSON_COMPACT) : NULL;
        json_decref(j);
        char extra[64];
        (void)snprintf(extra, sizeof extra, "Retry-After: %d\r\n", CLIMIT_RETRY_AFTER_S);
        (void)conn_respond(c, HTTP_TOO_MANY_REQUESTS, "application/json", b ? b : "{}",
                           b ? strlen(b) : 2, extra);
        free(b);
        return false;
    }
    if (r < 0) {
        http_errno(c, 0, r, "connection accounting");
        return false;
    }
    climit_authenticated(c);
    return true;
}

int auth_token_lookup(control_t *ctl, const char *tok, principal_t *ret)
{
    char hash[65], key[80];
    auth_token_hash(tok, hash);
    uint64_t now = loop_now_ms(ctl->srv.loop);
    token_cache_t *tc = &ctl->tokens[(hash[0] * 16 + hash[1]) % CTL_TOKEN_CACHE_SLOTS];
    if (tc->expires_ms > now && streq(tc->hash, hash)) {
        *ret = tc->p;
        return 0;
    }
    (void)snprintf(key, sizeof key, "tokens/%s", hash);
    store_kv_t kv;
    int r = store_get(ctl->store, key, &kv);
    if (r < 0)
        return r == -ENOENT ? -ENOENT : r;
    json_t *j = json_loadb(kv.value, kv.value_len, 0, NULL);
    store_kv_clear(&kv);
    const char *p = NULL, *pns = NULL, *role = NULL;
    if (json_unpack(j, "{s:s,s:s,s:s}", "principal", &p, "namespace", &pns, "role", &role) < 0 ||
        strlen(p) >= sizeof ret->principal || strlen(pns) >= sizeof ret->ns) {
        json_decref(j);
        return -EBADMSG;
    }
    principal_t pr = { .role = role_parse(role) };
    memcpy(pr.principal, p, strlen(p) + 1);
    memcpy(pr.ns, pns, strlen(pns) + 1);
    json_decref(j);
    memcpy(tc->hash, hash, sizeof tc->hash);
    tc->p = pr;
    tc->expires_ms = now + CTL_TOKEN_CACHE_MS;
    *ret = pr;
    return 0;
}

bool auth_check(control_t *ctl, conn_t *c, const char *ns, role_t need, principal_t *ret)
{
    char tok[256];
    if (!bearer(c, tok, sizeof tok)) {
        unauthorized(c, "an API token is required (Authorization: Bearer ...)");
        return false;
    }
    principal_t pr;
    int r = auth_token_lookup(ctl, tok, &pr);
    sodium_memzero(tok, sizeof tok);
    if (r == -ENOENT) {
        unauthorized(c, "unknown API token");
        return false;
    }
    if (r < 0) {
        respond_store_err(c, r, "token", "unknown API token");
        return false;
    }
    return auth_account(ctl, c, pr.principal) && principal_allowed(c, &pr, ns, need, ret);
}

/* A token's id: "t-" and the first 16 hex digits of its hash (what the store is keyed by; the
 * hash is no secret). Shown at creation and in the listing; DELETE /v1/tokens/{id} revokes. */
#define TOKEN_ID_LEN 18
static void token_id(const char *hash, char out[TOKEN_ID_LEN + 1])
{
    (void)snprintf(out, TOKEN_ID_LEN + 1, "t-%.16s", hash);
}

static void tokens_create_done(conn_t *c)
{
    control_t *ctl = c->srv->app;
    json_t *b = json_loadb(buf_head(&c->body), c->body.len, 0, NULL);
    const char *p = NULL, *ns = NULL, *role = NULL;
    if (json_unpack(b, "{s:s,s:s,s:s}", "principal", &p, "namespace", &ns, "role", &role) < 0 ||
        !valid_name(p, 63) || (!streq(ns, "*") && !valid_name(ns, 63)) ||
        role_parse(role) == ROLE_NONE) {
        json_decref(b);
        http_bad_request(c, 0,
                         "expected {principal, namespace (or \"*\"), role: "
                         "read|write|admin} with names [a-z0-9][a-z0-9._-]*");
        return;
    }
    if (streq(ns, CONTROL_RESERVED_NS)) {
        json_decref(b);
        http_bad_request(c, 0,
                         "namespace %s is reserved: the E2B API's sandboxes of keys of every "
                         "namespace live there, reached with such a key (\"*\") only",
                         CONTROL_RESERVED_NS);
        return;
    }
    char tok[64];
    int r = token_create(ctl->store, p, ns, role_parse(role), tok);
    if (r < 0) {
        json_decref(b);
        http_errno(c, 0, r, "token");
        return;
    }
    char hash[65], id[TOKEN_ID_LEN + 1];
    auth_token_hash(tok, hash);
    token_id(hash, id);
    conn_respond_json(c, 201,
                      json_pack("{s:s,s:s,s:s,s:s,s:s}", "token", tok, "id", id, "principal", p,
                                "namespace", ns, "role", role));
    sodium_memzero(tok, sizeof tok);
    json_decref(b);
}

void route_tokens_create(control_t *ctl, conn_t *c)
{
    if (!auth_check(ctl, c, "", ROLE_ADMIN, NULL))
        return;
    conn_collect_body(c, 4096, tokens_create_done);
}

void route_tokens_list(control_t *ctl, conn_t *c)
{
    if (!auth_check(ctl, c, "", ROLE_ADMIN, NULL))
        return;
    store_kv_t *kvs;
    size_t n;
    int rl = store_list(ctl->store, "tokens/", &kvs, &n);
    if (rl < 0) {
        respond_store_err(c, rl, "tokens", "tokens: not found");
        return;
    }
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < n; i++) {
        json_t *j = json_loadb(kvs[i].value, kvs[i].value_len, 0, NULL);
        char id[TOKEN_ID_LEN + 1];
        if (!j || strlen(kvs[i].key) != 7 + 64) {
            json_decref(j);
            continue;
        }
        token_id(kvs[i].key + 7, id);
        json_object_set_new(j, "id", json_string(id));
        json_array_append_new(arr, j);
    }
    store_kv_free(kvs, n);
    conn_respond_json(c, 200, arr);
}

/* Revoke: the record goes from the store; every control process re-reads a token it verified
 * within CTL_TOKEN_CACHE_MS, this one forgets it at once. */
void route_tokens_delete(control_t *ctl, conn_t *c, sv_t id)
{
    if (!auth_check(ctl, c, "", ROLE_ADMIN, NULL))
        return;
    bool hex = id.len == TOKEN_ID_LEN && memcmp(id.p, "t-", 2) == 0;
    for (size_t i = 2; hex && i < id.len; i++)
        hex = (id.p[i] >= '0' && id.p[i] <= '9') || (id.p[i] >= 'a' && id.p[i] <= 'f');
    if (!hex) {
        http_not_found(c, 0, "no such token (ids are t-<16 hex>)");
        return;
    }
    char prefix[32];
    (void)snprintf(prefix, sizeof prefix, "tokens/%.16s", id.p + 2);
    store_kv_t *kvs;
    size_t n;
    int rl = store_list(ctl->store, prefix, &kvs, &n);
    if (rl < 0) {
        respond_store_err(c, rl, "tokens", "tokens: not found");
        return;
    }
    if (n != 1) {
        store_kv_free(kvs, n);
        http_error(c, n == 0 ? HTTP_NOT_FOUND : HTTP_CONFLICT, 0,
                   n == 0 ? "no such token" : "ambiguous id");
        return;
    }
    char hash[65] = "";
    if (strlen(kvs[0].key) == 7 + 64)
        memcpy(hash, kvs[0].key + 7, 65);
    int r = store_del(ctl->store, kvs[0].key, kvs[0].rev);
    store_kv_free(kvs, n);
    if (r < 0) {
        http_errno(c, 0, r, "revoke");
        return;
    }
    for (size_t i = 0; i < CTL_TOKEN_CACHE_SLOTS; i++)
        if (streq(ctl->tokens[i].hash, hash))
            ctl->tokens[i].expires_ms = 0;
    log_info("token %.*s revoked", (int)id.len, id.p);
    conn_respond_json(c, 200, json_pack("{s:s%,s:b}", "id", id.p, id.len, "revoked", 1));
}
