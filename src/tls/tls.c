/* SPDX-License-Identifier: MIT */
/* TLS with OpenSSL 3 (Debian's libssl3): TLS 1.3 only, no session tickets, no renegotiation.
 * OpenSSL rather than GnuTLS because Debian keeps it maintained with the same API for the
 * whole release, its non-blocking API (SSL_read/SSL_write with WANT_READ/WANT_WRITE) fits an
 * epoll loop without callbacks, and its X509 API makes the small CA below without shelling out.
 * Verification is ours (a certificate-verify callback): chain to the one trusted CA, the peer's
 * numeric address in subjectAltName, and, when the caller knows it, the peer key's pin. */
#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/macro.h"
#include "tls/tls.h"

struct tls_ctx {
    SSL_CTX *ssl;
    int refs;
    X509_STORE *trust; /* client: the CA from a file */
    uint8_t ca_pin[TLS_PIN_BYTES];
    bool has_pin;
};

typedef struct {
    sockio_t io;
    SSL *ssl;
    tls_ctx_t *ctx;
    char peer_ip[64];
    char name[64]; /* "" = no name to check */
    uint8_t key_pin[TLS_PIN_BYTES];
    bool has_key_pin, notified;
    /* the last read wanted more from the socket: what the layer holds is part of a record,
     * which no read completes until the socket brings the rest */
    bool starved;
} tls_io_t;

static __thread char last_error[256];

const char *tls_last_error(void) { return last_error; }

static void note_error(const char *what)
{
    unsigned long e = ERR_peek_last_error();
    char buf[200] = "";
    if (e)
        ERR_error_string_n(e, buf, sizeof buf);
    (void)snprintf(last_error, sizeof last_error, "%s%s%s", what, buf[0] ? ": " : "", buf);
    ERR_clear_error();
}

/* ---- contexts ------------------------------------------------------------------------------ */

static SSL_CTX *ctx_base(const SSL_METHOD *m)
{
    SSL_CTX *s = SSL_CTX_new(m);
    if (!s)
        return NULL;
    (void)SSL_CTX_set_min_proto_version(s, TLS1_3_VERSION);
    (void)SSL_CTX_set_max_proto_version(s, TLS1_3_VERSION);
    SSL_CTX_set_options(s,
                        SSL_OP_NO_RENEGOTIATION | SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_NO_TICKET);
    /* partial writes make SSL_write behave like send(); moving buffers because ours grow */
    SSL_CTX_set_mode(s, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
                            SSL_MODE_RELEASE_BUFFERS);
    /* Read ahead: one read() takes whatever the socket holds (a record's header and body, and
     * the records after it) instead of two per record; every reader checks sock_pending()
     * before it waits for the socket again. */
    SSL_CTX_set_read_ahead(s, 1);
    SSL_CTX_set_session_cache_mode(s, SSL_SESS_CACHE_OFF);
    return s;
}

int tls_server_ctx_new(const char *chain_path, const char *key_path, tls_ctx_t **ret)
{
    tls_ctx_t *c = calloc(1, sizeof *c);
    if (!c)
        return -ENOMEM;
    c->refs = 1;
    c->ssl = ctx_base(TLS_server_method());
    if (!c->ssl || SSL_CTX_use_certificate_chain_file(c->ssl, chain_path) != 1 ||
        SSL_CTX_use_PrivateKey_file(c->ssl, key_path, SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(c->ssl) != 1) {
        note_error("server certificate");
        tls_ctx_unref(c);
        return -EINVAL;
    }
    /* a server sends no tickets: nothing arrives at a client after the handshake but data */
    (void)SSL_CTX_set_num_tickets(c->ssl, 0);
    *ret = c;
    return 0;
}

static X509 *find_pinned(STACK_OF(X509) * chain, const uint8_t *pin)
{
    for (int i = 0; chain && i < sk_X509_num(chain); i++) {
        X509 *x = sk_X509_value(chain, i);
        unsigned char *der = NULL;
        int n = i2d_X509(x, &der);
        uint8_t d[TLS_PIN_BYTES];
        bool same = n > 0 && EVP_Digest(der, (size_t)n, d, NULL, EVP_sha256(), NULL) == 1 &&
                    CRYPTO_memcmp(d, pin, TLS_PIN_BYTES) == 0;
        OPENSSL_free(der);
        if (same)
            return x;
    }
    return NULL;
}

static bool key_matches(X509 *leaf, const uint8_t *pin)
{
    unsigned char *der = NULL;
    int n = i2d_PUBKEY(X509_get0_pubkey(leaf), &der);
    uint8_t d[TLS_PIN_BYTES];
    bool ok = n > 0 && EVP_Digest(der, (size_t)n, d, NULL, EVP_sha256(), NULL) == 1 &&
              CRYPTO_memcmp(d, pin, TLS_PIN_BYTES) == 0;
    OPENSSL_free(der);
    return ok;
}

/* The whole verification of a server's chain (replaces OpenSSL's default). */
static int verify_peer(X509_STORE_CTX *sctx, void *arg)
{
    tls_ctx_t *c = arg;
    SSL *ssl = X509_STORE_CTX_get_ex_data(sctx, SSL_get_ex_data_X509_STORE_CTX_idx());
    tls_io_t *t = ssl ? SSL_get_app_data(ssl) : NULL;
    X509 *leaf = X509_STORE_CTX_get0_cert(sctx);
    STACK_OF(X509) *chain = X509_STORE_CTX_get0_untrusted(sctx);
    if (!t || !leaf)
        goto refuse;
    X509_STORE *trust = c->trust;
    X509_STORE *own = NULL;
    if (!trust) { /* the CA is the certificate in the chain with the pinned digest */
        X509 *ca = c->has_pin ? find_pinned(chain, c->ca_pin) : NULL;
        if (!ca || !(own = X509_STORE_new()) || X509_STORE_add_cert(own, ca) != 1) {
            X509_STORE_free(own);
            (void)snprintf(last_error, sizeof last_error,
                           "the peer's chain holds no CA with the pinned digest");
            goto refuse;
        }
        trust = own;
    }
    X509_STORE_CTX *v = X509_STORE_CTX_new();
    bool ok = v && X509_STORE_CTX_init(v, trust, leaf, chain) == 1 &&
              X509_STORE_CTX_set_purpose(v, X509_PURPOSE_SSL_SERVER) == 1 &&
              X509_verify_cert(v) == 1;
    if (!ok)
        (void)snprintf(last_error, sizeof last_error, "certificate chain: %s",
                       v ? X509_verify_cert_error_string(X509_STORE_CTX_get_error(v))
                         : "no memory");
    X509_STORE_CTX_free(v);
    X509_STORE_free(own);
    if (!ok)
        goto refuse;
    if (X509_check_ip_asc(leaf, t->peer_ip, 0) != 1) {
        (void)snprintf(last_error, sizeof last_error, "the certificate does not name %s",
                       t->peer_ip);
        goto refuse;
    }
    if (t->name[0] &&
        X509_check_host(leaf, t->name, 0, X509_CHECK_FLAG_NEVER_CHECK_SUBJECT, NULL) != 1) {
        (void)snprintf(last_error, sizeof last_error, "the certificate does not name %s", t->name);
        goto refuse;
    }
    if (t->has_key_pin && !key_matches(leaf, t->key_pin)) {
        (void)snprintf(last_error, sizeof last_error,
                       "the peer's key is not the one registered for %s", t->peer_ip);
        goto refuse;
    }
    return 1;
refuse:
    X509_STORE_CTX_set_error(sctx, X509_V_ERR_CERT_REJECTED);
    return 0;
}

int tls_client_ctx_new(const char *ca_path, const uint8_t *ca_pin, tls_ctx_t **ret)
{
    tls_ctx_t *c = calloc(1, sizeof *c);
    if (!c)
        return -ENOMEM;
    c->refs = 1;
    c->ssl = ctx_base(TLS_client_method());
    if (!c->ssl)
        goto fail;
    if (ca_path) {
        FILE *f = fopen(ca_path, "re");
        X509 *ca = f ? PEM_read_X509(f, NULL, NULL, NULL) : NULL;
        if (f)
            fclose(f);
        c->trust = ca ? X509_STORE_new() : NULL;
        bool ok = c->trust && X509_STORE_add_cert(c->trust, ca) == 1;
        X509_free(ca);
        if (!ok)
            goto fail;
    } else if (ca_pin) {
        memcpy(c->ca_pin, ca_pin, TLS_PIN_BYTES);
        c->has_pin = true;
    } else
        goto fail;
    SSL_CTX_set_verify(c->ssl, SSL_VERIFY_PEER, NULL);
    SSL_CTX_set_cert_verify_callback(c->ssl, verify_peer, c);
    *ret = c;
    return 0;
fail:
    note_error("client context");
    tls_ctx_unref(c);
    return -EINVAL;
}

tls_ctx_t *tls_ctx_ref(tls_ctx_t *c)
{
    if (c)
        __atomic_add_fetch(&c->refs, 1, __ATOMIC_RELAXED);
    return c;
}

void tls_ctx_unref(tls_ctx_t *c)
{
    if (!c || __atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL) > 0)
        return;
    SSL_CTX_free(c->ssl);
    X509_STORE_free(c->trust);
    free(c);
}

/* ---- the layer ----------------------------------------------------------------------------- */

/* An SSL call's outcome as our convention: -EAGAIN (with want_write), 0 (clean end), -errno. */
static int ssl_outcome(tls_io_t *t, int r)
{
    int e = SSL_get_error(t->ssl, r);
    switch (e) {
    case SSL_ERROR_WANT_READ:
        t->io.want_write = false;
        t->starved = true;
        return -EAGAIN;
    case SSL_ERROR_WANT_WRITE: t->io.want_write = true; return -EAGAIN;
    case SSL_ERROR_ZERO_RETURN: return 0;
    case SSL_ERROR_SYSCALL: {
        int err = errno;
        note_error("tls");
        return err && err != EAGAIN ? -err : -ECONNRESET;
    }
    default:
        note_error("tls");
        return SSL_get_verify_result(t->ssl) != X509_V_OK ? -EPERM : -EPROTO;
    }
}

static int tls_handshake(sockio_t *io)
{
    tls_io_t *t = (tls_io_t *)io;
    if (io->handshaken)
        return 0;
    ERR_clear_error();
    int r = SSL_do_handshake(t->ssl);
    if (r == 1) {
        t->starved = false;
        io->handshaken = true;
        io->want_write = false;
        return 0;
    }
    r = ssl_outcome(t, r);
    return r == 0 ? -ECONNRESET : r;
}

static ssize_t tls_recv(sockio_t *io, void *p, size_t n)
{
    tls_io_t *t = (tls_io_t *)io;
    if (!io->handshaken) {
        int r = tls_handshake(io);
        if (r < 0)
            return r;
    }
    ERR_clear_error();
    int k = SSL_read(t->ssl, p, (int)MIN(n, (size_t)INT_MAX));
    if (k > 0) {
        t->starved = false;
        return k;
    }
    return ssl_outcome(t, k);
}

static ssize_t tls_send(sockio_t *io, const void *p, size_t n)
{
    tls_io_t *t = (tls_io_t *)io;
    if (n == 0)
        return 0;
    if (!io->handshaken) {
        int r = tls_handshake(io);
        if (r < 0)
            return r;
    }
    ERR_clear_error();
    int k = SSL_write(t->ssl, p, (int)MIN(n, (size_t)INT_MAX));
    if (k > 0)
        return k;
    int r = ssl_outcome(t, k);
    return r == 0 ? -EPIPE : r;
}

/* Data a read would return without the socket: bytes decrypted already, or whole records read
 * ahead. Bytes read ahead that are only part of a record (SSL_has_pending says yes to them
 * too) count once a read has wanted more: until the socket brings the rest, another read
 * returns nothing, and a caller that read again at once would never wait for the socket (three
 * bytes of a record header held a daemon's loop spinning). */
static bool tls_pending(const sockio_t *io)
{
    const tls_io_t *t = (const tls_io_t *)io;
    return SSL_pending(t->ssl) > 0 || (!t->starved && SSL_has_pending(t->ssl) == 1);
}

static void tls_close_notify(sockio_t *io)
{
    tls_io_t *t = (tls_io_t *)io;
    if (io->handshaken && !t->notified) {
        t->notified = true;
        ERR_clear_error();
        (void)SSL_shutdown(t->ssl);
        ERR_clear_error();
    }
}

static void tls_free(sockio_t *io)
{
    tls_io_t *t = (tls_io_t *)io;
    SSL_free(t->ssl);
    tls_ctx_unref(t->ctx);
    free(t);
}

static const sockio_ops_t tls_ops = {
    .recv = tls_recv,
    .send = tls_send,
    .handshake = tls_handshake,
    .pending = tls_pending,
    .close_notify = tls_close_notify,
    .free = tls_free,
};

static tls_io_t *io_new(tls_ctx_t *c, int fd)
{
    tls_io_t *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->io = (sockio_t){ .ops = &tls_ops, .fd = fd };
    t->ssl = SSL_new(c->ssl);
    if (!t->ssl || SSL_set_fd(t->ssl, fd) != 1) {
        note_error("SSL_new");
        SSL_free(t->ssl);
        free(t);
        return NULL;
    }
    SSL_set_app_data(t->ssl, t);
    t->ctx = tls_ctx_ref(c);
    return t;
}

sockio_t *tls_accept(tls_ctx_t *c, int fd)
{
    tls_io_t *t = io_new(c, fd);
    if (!t)
        return NULL;
    SSL_set_accept_state(t->ssl);
    return &t->io;
}

sockio_t *tls_connect(tls_ctx_t *c, int fd, const char *peer_ip, const char *name,
                      const uint8_t *key_pin)
{
    if (!peer_ip || strlen(peer_ip) >= sizeof((tls_io_t *)0)->peer_ip ||
        (name && strlen(name) >= sizeof((tls_io_t *)0)->name))
        return NULL;
    tls_io_t *t = io_new(c, fd);
    if (!t)
        return NULL;
    memcpy(t->peer_ip, peer_ip, strlen(peer_ip) + 1);
    if (name)
        memcpy(t->name, name, strlen(name) + 1);
    if (key_pin) {
        memcpy(t->key_pin, key_pin, TLS_PIN_BYTES);
        t->has_key_pin = true;
    }
    SSL_set_connect_state(t->ssl);
    return &t->io;
}

sockio_t *tls_wrap_peer(void *peer, int fd)
{
    const tls_peer_t *p = peer;
    return tls_connect(p->ctx, fd, p->ip, p->name, p->key_pin);
}

sockio_t *tls_wrap_server(void *ctx, int fd) { return tls_accept(ctx, fd); }

/* ---- keys and certificates ----------------------------------------------------------------- */

static int write_pem_file(const char *path, mode_t mode, const char *data, size_t len)
{
    char tmp[PATH_MAX];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp)
        return -ENAMETOOLONG;
    (void)unlink(tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
    if (fd < 0)
        return negative_errno();
    bool ok = write(fd, data, len) == (ssize_t)len && fsync(fd) == 0;
    int r = close(fd) == 0 && ok ? 0 : -EIO;
    if (r == 0 && rename(tmp, path) < 0)
        r = negative_errno();
    if (r < 0)
        (void)unlink(tmp);
    return r;
}

static char *bio_text(BIO *b, size_t *ret_len)
{
    char *p;
    long n = BIO_get_mem_data(b, &p);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!s)
        return NULL;
    memcpy(s, p, (size_t)n);
    s[n] = 0;
    if (ret_len)
        *ret_len = (size_t)n;
    return s;
}

static int key_save(const char *path, EVP_PKEY *k)
{
    BIO *b = BIO_new(BIO_s_mem());
    size_t n = 0;
    char *s = b && PEM_write_bio_PrivateKey(b, k, NULL, NULL, 0, NULL, NULL) == 1 ? bio_text(b, &n)
                                                                                  : NULL;
    BIO_free(b);
    int r = s ? write_pem_file(path, 0600, s, n) : -ENOMEM;
    if (s)
        OPENSSL_cleanse(s, n);
    free(s);
    return r;
}

static EVP_PKEY *key_load(const char *path)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return NULL;
    EVP_PKEY *k = PEM_read_PrivateKey(f, NULL, NULL, NULL);
    fclose(f);
    return k;
}

static X509 *cert_load(const char *path)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return NULL;
    X509 *x = PEM_read_X509(f, NULL, NULL, NULL);
    fclose(f);
    return x;
}

static char *cert_pem(X509 *x, size_t *ret_len)
{
    BIO *b = BIO_new(BIO_s_mem());
    char *s = b && PEM_write_bio_X509(b, x) == 1 ? bio_text(b, ret_len) : NULL;
    BIO_free(b);
    return s;
}

static bool add_ext(X509 *x, X509V3_CTX *v, int nid, const char *value)
{
    X509_EXTENSION *e = X509V3_EXT_conf_nid(NULL, v, nid, value);
    bool ok = e && X509_add_ext(x, e, -1) == 1;
    X509_EXTENSION_free(e);
    return ok;
}

/* A certificate for pub: a CA (issuer NULL: self-signed) or a server leaf. */
static X509 *cert_make(EVP_PKEY *pub, const char *cn, X509 *issuer, EVP_PKEY *issuer_key, long days,
                       bool ca, const char *san)
{
    X509 *x = X509_new();
    BIGNUM *bn = BN_new();
    ASN1_INTEGER *serial = NULL;
    bool ok = x && bn && X509_set_version(x, 2) == 1 &&
              BN_rand(bn, 127, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) == 1 &&
              (serial = BN_to_ASN1_INTEGER(bn, NULL)) && X509_set_serialNumber(x, serial) == 1 &&
              X509_gmtime_adj(X509_getm_notBefore(x), -3600) &&
              X509_gmtime_adj(X509_getm_notAfter(x), days * 86400L) &&
              X509_set_pubkey(x, pub) == 1 &&
              X509_NAME_add_entry_by_txt(X509_get_subject_name(x), "CN", MBSTRING_UTF8,
                                         (const unsigned char *)cn, -1, -1, 0) == 1 &&
              X509_set_issuer_name(x, issuer ? X509_get_subject_name(issuer)
                                             : X509_get_subject_name(x)) == 1;
    ASN1_INTEGER_free(serial);
    BN_free(bn);
    X509V3_CTX v;
    if (ok) {
        X509V3_set_ctx_nodb(&v);
        X509V3_set_ctx(&v, issuer ? issuer : x, x, NULL, NULL, 0);
        ok = add_ext(x, &v, NID_subject_key_identifier, "hash") &&
             add_ext(x, &v, NID_authority_key_identifier, "keyid:always");
    }
    if (ok && ca)
        ok = add_ext(x, &v, NID_basic_constraints, "critical,CA:TRUE,pathlen:0") &&
             add_ext(x, &v, NID_key_usage, "critical,keyCertSign,cRLSign");
    else if (ok)
        ok = add_ext(x, &v, NID_basic_constraints, "critical,CA:FALSE") &&
             add_ext(x, &v, NID_key_usage, "critical,digitalSignature") &&
             add_ext(x, &v, NID_ext_key_usage, "serverAuth") &&
             (!san || !san[0] || add_ext(x, &v, NID_subject_alt_name, san));
    if (ok)
        ok = X509_sign(x, issuer_key, EVP_sha256()) > 0;
    if (!ok) {
        note_error("certificate");
        X509_free(x);
        return NULL;
    }
    return x;
}

int tls_key_ensure(const char *key_path, char **ret_pub)
{
    EVP_PKEY *k = key_load(key_path);
    if (!k && access(key_path, F_OK) == 0) {
        (void)snprintf(last_error, sizeof last_error, "%s is not a PEM private key", key_path);
        return -EINVAL;
    }
    if (!k) {
        k = EVP_EC_gen("P-256");
        int r = k ? key_save(key_path, k) : -ENOMEM;
        if (r < 0) {
            EVP_PKEY_free(k);
            return r;
        }
    }
    int r = 0;
    if (ret_pub) {
        BIO *b = BIO_new(BIO_s_mem());
        *ret_pub = b && PEM_write_bio_PUBKEY(b, k) == 1 ? bio_text(b, NULL) : NULL;
        BIO_free(b);
        r = *ret_pub ? 0 : -ENOMEM;
    }
    EVP_PKEY_free(k);
    return r;
}

int tls_ca_ensure(const char *dir)
{
    char kp[PATH_MAX], cp[PATH_MAX];
    (void)snprintf(kp, sizeof kp, "%s/ca.key", dir);
    (void)snprintf(cp, sizeof cp, "%s/ca.crt", dir);
    bool hk = access(kp, F_OK) == 0, hc = access(cp, F_OK) == 0;
    if (hk && hc)
        return 0;
    if (hk != hc) {
        (void)snprintf(last_error, sizeof last_error, "%s has %s but not %s", dir,
                       hk ? "ca.key" : "ca.crt", hk ? "ca.crt" : "ca.key");
        return -EINVAL;
    }
    EVP_PKEY *k = EVP_EC_gen("P-256");
    X509 *x = k ? cert_make(k, "sbx platform CA", NULL, k, 3650, true, NULL) : NULL;
    size_t n = 0;
    char *pem = x ? cert_pem(x, &n) : NULL;
    int r = pem ? key_save(kp, k) : -ENOMEM;
    if (r >= 0)
        r = write_pem_file(cp, 0644, pem, n);
    free(pem);
    X509_free(x);
    EVP_PKEY_free(k);
    return r;
}

static int san_text(const char *const *ips, const char *const *dns, char *out, size_t cap)
{
    size_t off = 0;
    out[0] = 0;
    for (int pass = 0; pass < 2; pass++)
        for (const char *const *p = pass ? dns : ips; p && *p; p++) {
            int n =
                snprintf(out + off, cap - off, "%s%s:%s", off ? "," : "", pass ? "DNS" : "IP", *p);
            if (n < 0 || (size_t)n >= cap - off)
                return -ENAMETOOLONG;
            off += (size_t)n;
        }
    return 0;
}

int tls_issue(const char *dir, const char *pub_pem, const char *cn, const char *const *ips,
              const char *const *dns, char **ret_chain)
{
    char kp[PATH_MAX], cp[PATH_MAX], san[1024];
    (void)snprintf(kp, sizeof kp, "%s/ca.key", dir);
    (void)snprintf(cp, sizeof cp, "%s/ca.crt", dir);
    if (san_text(ips, dns, san, sizeof san) < 0)
        return -ENAMETOOLONG;
    EVP_PKEY *cak = key_load(kp);
    X509 *ca = cert_load(cp);
    BIO *b = BIO_new_mem_buf(pub_pem, -1);
    EVP_PKEY *pub = b ? PEM_read_bio_PUBKEY(b, NULL, NULL, NULL) : NULL;
    BIO_free(b);
    int r = -EINVAL;
    X509 *x = cak && ca && pub ? cert_make(pub, cn, ca, cak, 365, false, san) : NULL;
    if (x) {
        size_t n1 = 0, n2 = 0;
        char *a = cert_pem(x, &n1), *c = cert_pem(ca, &n2);
        char *s = a && c ? malloc(n1 + n2 + 1) : NULL;
        if (s) {
            memcpy(s, a, n1);
            memcpy(s + n1, c, n2 + 1);
            *ret_chain = s;
            r = 0;
        } else
            r = -ENOMEM;
        free(a);
        free(c);
    } else if (!cak || !ca)
        note_error("the CA's key or certificate");
    else if (!pub)
        note_error("the public key to certify");
    X509_free(x);
    EVP_PKEY_free(pub);
    X509_free(ca);
    EVP_PKEY_free(cak);
    return r;
}

int tls_self_signed(const char *key_path, const char *cn, char **ret_pem)
{
    EVP_PKEY *k = key_load(key_path);
    X509 *x = k ? cert_make(k, cn, NULL, k, 1, false, NULL) : NULL;
    *ret_pem = x ? cert_pem(x, NULL) : NULL;
    X509_free(x);
    EVP_PKEY_free(k);
    return *ret_pem ? 0 : -EINVAL;
}

int tls_cert_pin(const char *pem, size_t len, uint8_t out[TLS_PIN_BYTES])
{
    BIO *b = BIO_new_mem_buf(pem, (int)MIN(len, (size_t)INT_MAX));
    X509 *x = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
    BIO_free(b);
    unsigned char *der = NULL;
    int n = x ? i2d_X509(x, &der) : -1;
    int r = n > 0 && EVP_Digest(der, (size_t)n, out, NULL, EVP_sha256(), NULL) == 1 ? 0 : -EINVAL;
    OPENSSL_free(der);
    X509_free(x);
    ERR_clear_error();
    return r;
}

int tls_pubkey_pin(const char *pem, size_t len, uint8_t out[TLS_PIN_BYTES])
{
    BIO *b = BIO_new_mem_buf(pem, (int)MIN(len, (size_t)INT_MAX));
    EVP_PKEY *k = b ? PEM_read_bio_PUBKEY(b, NULL, NULL, NULL) : NULL;
    BIO_free(b);
    unsigned char *der = NULL;
    int n = k ? i2d_PUBKEY(k, &der) : -1;
    int r = n > 0 && EVP_Digest(der, (size_t)n, out, NULL, EVP_sha256(), NULL) == 1 ? 0 : -EINVAL;
    OPENSSL_free(der);
    EVP_PKEY_free(k);
    ERR_clear_error();
    return r;
}
