/* SPDX-License-Identifier: MIT */
/* The node's side of the control plane: register with the join token, then heartbeat. Both
 * answers carry the verification key set (public keys only: a node can check capabilities, never
 * mint them). Runs on a thread of its own so that a slow control plane never stalls requests;
 * the key set is swapped under keys_lock. */
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <time.h>

#include "common/fileio.h"
#include "common/httpc.h"
#include "common/log.h"
#include "node.h"

#define HEARTBEAT_MS 1000

static int call(node_t *n, const char *target, const char *bearer, const char *extra, json_t *body,
                json_t **ret)
{
    char *b = json_dumps(body, JSON_COMPACT);
    char hdr[512];
    if (!b)
        return -ENOMEM;
    (void)snprintf(hdr, sizeof hdr,
                   "Authorization: Bearer %s\r\nContent-Type: application/json\r\n%s", bearer,
                   extra ? extra : "");
    httpc_request_t rq;
    httpc_request_init(&rq);
    tls_peer_t peer;
    node_tls_peer(n, n->cfg.control_host, TLS_CONTROL_NAME, &peer,
                  &rq); /* the pinned CA's chain, or nothing */
    rq.host = n->cfg.control_host;
    rq.port = n->cfg.control_port;
    rq.method = "POST";
    rq.target = target;
    rq.headers = hdr;
    rq.body = b;
    rq.body_len = strlen(b);
    rq.timeout_ms = 5000;
    httpc_response_t resp = { 0 };
    int r = httpc_do(&rq, &resp);
    free(b);
    if (r < 0)
        return r;
    int status = resp.status;
    json_t *j = status == 200 ? json_loadb(resp.body, resp.body_len, 0, NULL) : NULL;
    httpc_response_free(&resp);
    if (status == HTTP_UNAUTHORIZED || status == HTTP_FORBIDDEN || status == HTTP_NOT_FOUND)
        return -EACCES;
    if (!j)
        return -EPROTO;
    *ret = j;
    return 0;
}

/* The node token, kept 0600 in the state directory: a restarted node re-registers its name. */
static int node_token_save(node_t *n, const char *tok)
{
    char path[PATH_MAX + 32];
    (void)snprintf(path, sizeof path, "%s/node.token", n->cfg.state_dir);
    return file_write_atomic(path, tok, strlen(tok), 0600);
}

void node_token_load(node_t *n)
{
    char path[PATH_MAX + 32];
    (void)snprintf(path, sizeof path, "%s/node.token", n->cfg.state_dir);
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return;
    ssize_t k = read(fd, n->node_token, sizeof n->node_token - 1);
    n->node_token[k > 0 ? k : 0] = 0;
}

int node_keyset_apply(node_t *n, const char *wire, bool persist)
{
    cap_keyset_t ks;
    uint64_t version;
    size_t len = wire ? strlen(wire) : 0;
    int r = wire ? cap_keyset_open(n->cfg.control_pk, wire, len, &version, &ks) : -EBADMSG;
    if (r < 0)
        return r;
    pthread_mutex_lock(&n->keys_lock);
    if (version < n->keys_version || (version == n->keys_version && !streq(wire, n->keyset_wire))) {
        uint64_t have = n->keys_version;
        pthread_mutex_unlock(&n->keys_lock);
        log_warn("refused a key set of version %llu: this node holds version %llu",
                 (unsigned long long)version, (unsigned long long)have);
        return -ESTALE;
    }
    bool changed = version != n->keys_version;
    n->keys = ks;
    n->keys_version = version;
    n->keys_current = n->keys_current || persist; /* persist: it came from the control plane */
    memcpy(n->keyset_wire, wire, len + 1);
    pthread_mutex_unlock(&n->keys_lock);
    if (changed) {
        log_info("key set version %llu (%zu keys)", (unsigned long long)version, ks.n);
        char path[PATH_MAX + 32];
        (void)snprintf(path, sizeof path, "%s/keyset", n->cfg.state_dir);
        if (persist && file_write_atomic(path, wire, len, 0600) < 0)
            log_warn("cannot keep the key set in %s", path);
    }
    return 0;
}

void node_keyset_load(node_t *n)
{
    char path[PATH_MAX + 32], wire[CAP_KEYSET_WIRE_MAX + 1];
    (void)snprintf(path, sizeof path, "%s/keyset", n->cfg.state_dir);
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return;
    ssize_t k = read(fd, wire, sizeof wire - 1);
    if (k <= 0)
        return;
    wire[k] = 0;
    int r = node_keyset_apply(n, wire, false);
    if (r < 0)
        log_warn("the key set kept in %s is not one the pinned control identity signed: %s", path,
                 strerror(-r));
}

static int apply_keys(node_t *n, json_t *j)
{
    int r = node_keyset_apply(n, json_string_value(json_object_get(j, "keyset")), true);
    if (r == -EPERM || r == -EBADMSG)
        log_warn("refused the key set from %s:%u: %s", n->cfg.control_host, n->cfg.control_port,
                 r == -EPERM ? "not signed by the pinned control identity" : "malformed");
    return r;
}

static int do_register(node_t *n)
{
    json_t *body = json_pack("{s:s,s:s,s:I,s:[s],s:o}", "name", n->cfg.name, "url",
                             n->cfg.advertise, "capacity", (json_int_t)n->cfg.capacity,
                             "substrates", "process", "images", node_images_json(n));
    if (body && n->tls_pub) /* the control plane certifies this key for our address */
        json_object_set_new(body, "tls_pubkey", json_string(n->tls_pub));
    json_t *resp = NULL;
    /* our previous token proves this name is ours when the control plane knows it already */
    char extra[200] = "";
    pthread_mutex_lock(&n->keys_lock);
    if (n->node_token[0])
        (void)snprintf(extra, sizeof extra, "X-Sbx-Node-Token: %s\r\n", n->node_token);
    pthread_mutex_unlock(&n->keys_lock);
    int r = body ? call(n, "/v1/nodes/register", n->cfg.join_token, extra, body, &resp) : -ENOMEM;
    sodium_memzero(extra, sizeof extra);
    json_decref(body);
    if (r < 0)
        return r;
    const char *tok = json_string_value(json_object_get(resp, "node_token"));
    const char *cert = json_string_value(json_object_get(resp, "tls_cert"));
    if (!tok || strlen(tok) >= sizeof n->node_token || (n->tls_pub && !cert) ||
        apply_keys(n, resp) < 0) {
        json_decref(resp);
        return -EPROTO;
    }
    if (cert && node_tls_install_cert(n, cert) < 0) {
        json_decref(resp);
        return -EPROTO;
    }
    pthread_mutex_lock(&n->keys_lock);
    memcpy(n->node_token, tok, strlen(tok) + 1);
    n->registered = true;
    pthread_mutex_unlock(&n->keys_lock);
    if (node_token_save(n, tok) < 0)
        log_warn("cannot keep the node token in %s: a restart must register under a new name",
                 n->cfg.state_dir);
    json_decref(resp);
    return 0;
}

static int do_heartbeat(node_t *n)
{
    char target[160], token[sizeof n->node_token];
    (void)snprintf(target, sizeof target, "/v1/nodes/%s/heartbeat", n->cfg.name);
    pthread_mutex_lock(&n->keys_lock);
    memcpy(token, n->node_token, sizeof token);
    json_t *runs = n->runs_report ? json_deep_copy(n->runs_report) : json_array();
    bool measured = n->runs_report != NULL;
    json_int_t room = (json_int_t)n->disk_room_mb;
    pthread_mutex_unlock(&n->keys_lock);
    json_t *body =
        json_pack("{s:o,s:o}", "runs", runs ? runs : json_array(), "images", node_images_json(n));
    if (body && measured)
        json_object_set_new(body, "disk_room_mb", json_integer(room));
    json_t *resp = NULL;
    int r = body ? call(n, target, token, NULL, body, &resp) : -ENOMEM;
    json_decref(body);
    sodium_memzero(token, sizeof token);
    if (r < 0)
        return r;
    r = apply_keys(n, resp);
    json_decref(resp);
    return r;
}

static void *agent_main(void *p)
{
    node_t *n = p;
    bool was_ok = false;
    int last_err = 0;
    while (!n->stopping) {
        int r = n->registered ? do_heartbeat(n) : do_register(n);
        if (r == -EACCES && n->registered) {
            log_warn("control plane does not know this node any more: registering again");
            pthread_mutex_lock(&n->keys_lock);
            n->registered = false;
            pthread_mutex_unlock(&n->keys_lock);
            continue;
        }
        if (r == -EPERM && last_err != r) /* every time it changes: an impostor is news */
            log_warn("refused the TLS identity of whatever answers at %s:%u: %s",
                     n->cfg.control_host, n->cfg.control_port, tls_last_error());
        else if (r < 0 && was_ok)
            log_warn("control plane unreachable: %s", strerror(-r));
        else if (r >= 0 && !was_ok)
            log_info("registered with the control plane at %s:%u as %s", n->cfg.control_host,
                     n->cfg.control_port, n->cfg.name);
        was_ok = r >= 0;
        last_err = r;
        for (int i = 0; i < HEARTBEAT_MS / 50 && !n->stopping; i++) {
            struct timespec ts = { 0, 50 * 1000 * 1000 };
            nanosleep(&ts, NULL);
        }
    }
    return NULL;
}

int node_agent_start(node_t *n)
{
    int r = pthread_create(&n->agent_thread, NULL, agent_main, n);
    if (r != 0)
        return -r;
    n->agent_started = true;
    return 0;
}

void node_agent_stop(node_t *n)
{
    n->stopping = true;
    if (n->agent_started)
        (void)pthread_join(n->agent_thread, NULL);
    n->agent_started = false;
}
