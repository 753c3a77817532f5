/* SPDX-License-Identifier: MIT */
/* The node's TLS identity: its key (<state>/tls/node.key, made once, 0600), the certificate the
 * control plane issued for it at registration (<state>/tls/node.crt; a self-signed one until the
 * first registration: the control plane trusts no node before), the listener's context (swapped
 * when a new certificate arrives, under tls_lock), and the client context that trusts the CA
 * pinned by the join material. */
#include <stdio.h>
#include <sys/stat.h>

#include "common/fileio.h"
#include "common/log.h"
#include "node.h"

static void paths(const node_t *n, char *key, char *crt, size_t cap)
{
    (void)snprintf(key, cap, "%s/tls/node.key", n->cfg.state_dir);
    (void)snprintf(crt, cap, "%s/tls/node.crt", n->cfg.state_dir);
}

static int serve(node_t *n, const char *crt, const char *key)
{
    tls_ctx_t *c;
    int r = tls_server_ctx_new(crt, key, &c);
    if (r < 0)
        return r;
    pthread_mutex_lock(&n->tls_lock);
    tls_ctx_t *old = n->tls_server;
    n->tls_server = c;
    pthread_mutex_unlock(&n->tls_lock);
    tls_ctx_unref(old);
    return 0;
}

static sockio_t *wrap_server(void *arg, int fd)
{
    node_t *n = arg;
    pthread_mutex_lock(&n->tls_lock);
    tls_ctx_t *c = tls_ctx_ref(n->tls_server);
    pthread_mutex_unlock(&n->tls_lock);
    sockio_t *io = c ? tls_accept(c, fd) : NULL;
    tls_ctx_unref(c);
    return io;
}

int node_tls_init(node_t *n)
{
    if (n->cfg.plain_http)
        return 0;
    char dir[PATH_MAX + 8], key[PATH_MAX + 32], crt[PATH_MAX + 32];
    (void)snprintf(dir, sizeof dir, "%s/tls", n->cfg.state_dir);
    if (mkdir(dir, 0700) < 0 && errno != EEXIST)
        return negative_errno();
    paths(n, key, crt, sizeof key);
    int r = tls_key_ensure(key, &n->tls_pub);
    if (r >= 0 && access(crt, R_OK) < 0) {
        _cleanup_free_ char *pem = NULL;
        r = tls_self_signed(key, n->cfg.name, &pem);
        if (r >= 0)
            r = file_write_atomic(crt, pem, strlen(pem), 0644);
    }
    if (r >= 0)
        r = serve(n, crt, key);
    if (r >= 0)
        r = tls_client_ctx_new(NULL, n->cfg.ca_pin, &n->tls_client);
    if (r < 0) {
        log_error("TLS identity in %s: %s (%s)", dir, strerror(-r), tls_last_error());
        return r;
    }
    n->srv.transport = (sockio_wrap_t){ wrap_server, n };
    return 0;
}

int node_tls_install_cert(node_t *n, const char *chain)
{
    char key[PATH_MAX + 32], crt[PATH_MAX + 32], tmp[PATH_MAX + 40];
    paths(n, key, crt, sizeof key);
    (void)snprintf(tmp, sizeof tmp, "%s.new", crt);
    /* checked by loading it with our key before it replaces the one we serve */
    int r = file_write_atomic(tmp, chain, strlen(chain), 0644);
    if (r >= 0)
        r = serve(n, tmp, key);
    if (r >= 0 && rename(tmp, crt) < 0)
        r = negative_errno();
    if (r < 0)
        log_warn("cannot use the certificate the control plane issued: %s (%s)", strerror(-r),
                 tls_last_error());
    return r;
}

void node_tls_peer(node_t *n, const char *ip, const char *name, tls_peer_t *peer,
                   httpc_request_t *rq)
{
    if (!n->tls_client)
        return;
    *peer = (tls_peer_t){ .ctx = n->tls_client, .ip = ip, .name = name };
    rq->transport = (sockio_wrap_t){ tls_wrap_peer, peer };
}

void node_tls_done(node_t *n)
{
    tls_ctx_unref(n->tls_server);
    tls_ctx_unref(n->tls_client);
    n->tls_server = n->tls_client = NULL;
    free(n->tls_pub);
    n->tls_pub = NULL;
    pthread_mutex_destroy(&n->tls_lock);
}
