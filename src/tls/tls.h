/* SPDX-License-Identifier: MIT */
/* TLS for the platform's daemons (OpenSSL 3, TLS 1.3 only), as a sockio_t layer under the HTTP
 * code, and the small certificate authority that sbx-control keeps.
 *
 * Who trusts what (docs/platform.md, "The trust chain"):
 * - sbx-control makes a CA on first start (<state>/tls/ca.key, 0600) and serves a certificate
 *   it issues itself for its listen address (or one the operator supplies).
 * - A node's join material pins the CA by the SHA-256 of its certificate; the node finds the CA
 *   in the chain the control plane presents, checks that digest, verifies the chain and the
 *   address against it. No file has to be copied to the node.
 * - A node keeps its own key (<state>/tls/node.key); at registration the control plane issues it
 *   a certificate for its advertised address and pins the key (SHA-256 of the public key) in
 *   the node's record. The control plane and other nodes check a node's chain against the CA,
 *   its address, and, where they know it, that pin. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "common/sock.h"

#define TLS_PIN_BYTES 32

typedef struct tls_ctx tls_ctx_t;

/* A server context from a PEM chain (leaf first) and its key. */
int tls_server_ctx_new(const char *chain_path, const char *key_path, tls_ctx_t **ret);
/* A client context that trusts the CA certificate in ca_path, or (ca_path NULL) the CA whose
 * certificate's SHA-256 is ca_pin, taken from the chain the peer presents. */
int tls_client_ctx_new(const char *ca_path, const uint8_t *ca_pin, tls_ctx_t **ret);
tls_ctx_t *tls_ctx_ref(tls_ctx_t *c);
void tls_ctx_unref(tls_ctx_t *c);

/* The name in the control plane's certificate (a DNS subjectAltName no node certificate has):
 * what a node checks besides the address, so that another node cannot pose as its control
 * plane. */
#define TLS_CONTROL_NAME "control.sbx.invalid"

/* Layers over a socket (not taken). tls_accept: the server side. tls_connect: the client side;
 * the peer's certificate must chain to the trusted CA and name peer_ip (a numeric address),
 * and name (a DNS name) when name is not NULL; when key_pin is not NULL its public key's
 * SHA-256 must equal it. NULL on allocation failure. */
sockio_t *tls_accept(tls_ctx_t *c, int fd);
sockio_t *tls_connect(tls_ctx_t *c, int fd, const char *peer_ip, const char *name,
                      const uint8_t *key_pin);

/* A client peer for sockio_wrap_t: tls_wrap_peer(peer, fd) = tls_connect(ctx, fd, ip, pin). */
typedef struct {
    tls_ctx_t *ctx;
    const char *ip;
    const char *name;       /* may be NULL */
    const uint8_t *key_pin; /* may be NULL */
} tls_peer_t;
sockio_t *tls_wrap_peer(void *peer, int fd);
/* A server for sockio_wrap_t: arg is a tls_ctx_t. */
sockio_t *tls_wrap_server(void *ctx, int fd);

/* ---- the certificate authority and keys (PEM files) ---------------------------------------- */

/* <dir>/ca.key + <dir>/ca.crt: loaded, or made (P-256, ten years) when both are missing. */
int tls_ca_ensure(const char *dir);
/* An EC P-256 key in key_path (0600), made when missing; its public key as PEM in *ret_pub
 * (malloc'd) when ret_pub is not NULL. */
int tls_key_ensure(const char *key_path, char **ret_pub);
/* A certificate signed by the CA in dir for pub_pem: subject CN=cn, subjectAltName the numeric
 * addresses in ips and the names in dns (NULL-terminated lists, either may be NULL), one year,
 * serverAuth. *ret_chain: the certificate followed by the CA's, PEM, malloc'd. */
int tls_issue(const char *dir, const char *pub_pem, const char *cn, const char *const *ips,
              const char *const *dns, char **ret_chain);
/* A self-signed certificate for the key in key_path (a node before its registration). */
int tls_self_signed(const char *key_path, const char *cn, char **ret_pem);

/* SHA-256 of the first certificate in a PEM text (the CA pin), or of a PEM public key (a key
 * pin). */
int tls_cert_pin(const char *pem, size_t len, uint8_t out[TLS_PIN_BYTES]);
int tls_pubkey_pin(const char *pem, size_t len, uint8_t out[TLS_PIN_BYTES]);

/* The reason of the last failure on this thread, for logs ("" if none). */
const char *tls_last_error(void);
