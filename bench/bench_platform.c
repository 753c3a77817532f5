/* SPDX-License-Identifier: MIT */
/* bench-platform: what the platform adds to one exec of `true`, hop by hop, and what the
 * node's capability check costs, on a running sbx-control + sbx-node (loopback).
 *
 *   bench-platform --control-port P --node-port P --control-state DIR --admin-token-file F
 *                  --direct PATH [--node-state DIR] [--control-pid N] [--node-pid N]
 *                  [--direct-pid N] [--ns NS] [--rounds N] [--per-round N] [--warmup N]
 *                  [--cap-iterations N] [--quick]
 *   bench-platform --free-port
 *
 * The bench creates one job (its secret SBX_TOKEN is $SBX_BENCH_TOKEN) and waits until it is
 * RUNNING, then times POST .../v1/exec {"cmd":["true"]}, each answer read to its exit event:
 *   (a)  direct: an sbx-server of its own over a unix socket (--direct; the same binary and
 *        token as the run's agent, without namespaces or cgroups);
 *   (a') the run's own agent over the node's bridge socket, node bypassed (--node-state);
 *   (b)  through the node: /v1/runs/{job}/ports/49983/v1/exec with an exec capability minted
 *        here from the control plane's signing keys (read from DIR/store.db);
 *   (c)  through control -> node: the edge proxy, bearer auth.
 * Every request opens a new connection, as the platform does on every hop; (a) on one
 * keep-alive connection is printed as a reference. Within each round the variants take turns
 * request by request (the order rotated), so machine noise hits all of them alike; each
 * process's CPU per request is measured afterwards, one variant at a time.
 *
 * Figures only; nothing asserts on timings. Exit 1 = a functional failure (a refused request,
 * a stream without its exit event, a capability that does not verify). Normally started by
 * scripts/bench-platform.sh, which starts every process itself in a temporary directory. */
#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "bench_http.h"
#include "bench_util.h"
#include "cap/purpose.h"
#include "control/control.h"
#include "tls/tls.h"

#define EXEC_BODY "{\"cmd\":[\"true\"]}"
#define RECV_BUF (64 * 1024)
#define REQ_MAX 4096
#define JOB_WAIT_MS 60000
#define TARGET_CAP_US 60.0
#define TARGET_ADDED_MS 0.5
#define TARGET_DIRECT_MS 0.7
#define TARGET_FULL_MS 1.2
#define FAILURES_SHOWN 5
#define MINT_EVERY_NS (UINT64_C(30) * 1000000000u) /* capabilities live CAP_LIFETIME_S */

enum { V_DIRECT, V_DIRECT_KA, V_RUN, V_NODE, V_CONTROL, V_CONTROL_KA, V_N };

/* A client connection: the socket, and TLS over it when the platform speaks TLS. */
typedef struct {
    int fd;
    sockio_t *io;
} bconn_t;

static void bconn_close(bconn_t *c) { c->fd = sock_close(c->fd, TAKE_PTR(c->io)); }

typedef struct {
    const char *label;
    bool on;
    char req[REQ_MAX];
    size_t req_len;
    uint64_t *lat; /* every timed request */
    size_t n;
    uint64_t *round_p50;
    uint64_t cpu_ctl, cpu_node, cpu_direct; /* loop-thread CPU while this variant ran alone */
    size_t cpu_n;                           /* requests in those blocks */
} variant_t;

typedef struct {
    uint16_t control_port, node_port;
    const char *control_state, *node_state, *admin_file, *direct_sock, *ns;
    char run_sock[PATH_MAX];
    pid_t control_pid, node_pid, direct_pid;
    uint64_t rounds, per_round, warmup, cap_n;
    char admin[256], token[256], job[CAP_ID_MAX];
    cap_run_t run;
    store_t *store;
    seal_keys_t seal; /* the control's secrets key file: the signing keys are sealed */
    char wire[CAP_WIRE_MAX + 64];
    size_t wire_len;
    uint64_t minted_ns;
    char *rbuf;
    tls_ctx_t *tls; /* the platform's CA (<control state>/tls/ca.crt), NULL: plain HTTP */
    nd_t nd;
    variant_t v[V_N];
    uint64_t *round_tmp;
    unsigned failures;
} bench_t;

static void _printf_(2, 3) fail(bench_t *b, const char *fmt, ...)
{
    va_list ap;
    if (++b->failures > FAILURES_SHOWN)
        return;
    va_start(ap, fmt);
    printf("  FAIL: ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
}

static double ms(uint64_t ns) { return (double)ns / 1e6; }

static uint64_t cpu_of(pid_t pid) { return pid > 0 ? server_cpu_ns(pid) : 0; }

/* ---- connections ------------------------------------------------------------------------- */

static void set_timeouts(int fd)
{
    struct timeval tv = { .tv_sec = RECV_TIMEOUT_S };
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

static int connect_tcp(uint16_t port)
{
    _cleanup_close_ int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = { .sin_family = AF_INET,
                             .sin_port = htons(port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    int one = 1;
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0)
        return negative_errno();
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    set_timeouts(fd);
    return TAKE_FD(fd);
}

static int connect_unix(const char *path)
{
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    if (strlen(path) >= sizeof a.sun_path)
        return -ENAMETOOLONG;
    memcpy(a.sun_path, path, strlen(path) + 1);
    _cleanup_close_ int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0)
        return negative_errno();
    set_timeouts(fd);
    return TAKE_FD(fd);
}

static int open_variant(const bench_t *b, int v)
{
    switch (v) {
    case V_DIRECT:
    case V_DIRECT_KA: return connect_unix(b->direct_sock);
    case V_RUN: return connect_unix(b->run_sock);
    case V_NODE: return connect_tcp(b->node_port);
    default: return connect_tcp(b->control_port);
    }
}

/* A connection for variant v: TLS (checked against the platform's CA) to the node and the
 * control plane when they speak it; the handshake is part of what is timed. */
static int open_conn(const bench_t *b, int v, bconn_t *ret)
{
    *ret = (bconn_t){ .fd = open_variant(b, v) };
    if (ret->fd < 0)
        return ret->fd;
    if (!b->tls || v == V_DIRECT || v == V_DIRECT_KA || v == V_RUN)
        return 0;
    ret->io = tls_connect(b->tls, ret->fd, "127.0.0.1", NULL, NULL);
    int r = ret->io ? ret->io->ops->handshake(ret->io) : -ENOMEM;
    while (r == -EAGAIN) /* a blocking socket: a timeout */
        r = -ETIMEDOUT;
    if (r < 0) {
        bconn_close(ret);
        return r;
    }
    return 0;
}

/* A request: head lines (each ending in \r\n, may be empty) and an optional JSON body. */
static int build_req(char *dst, size_t cap, const char *method, const char *target,
                     const char *headers, const char *body)
{
    int n = body ? snprintf(dst, cap,
                            "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%sContent-Type: "
                            "application/json\r\nContent-Length: %zu\r\n\r\n%s",
                            method, target, headers, strlen(body), body)
                 : snprintf(dst, cap, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%s\r\n", method, target,
                            headers);
    return n < 0 || (size_t)n >= cap ? -E2BIG : n;
}

/* One small request to the control plane with the admin bearer; the answer in *sb. */
static int control_call(bench_t *b, const char *method, const char *target, const char *body,
                        small_body_t *sb, int *ret_status)
{
    char hdr[512], req[REQ_MAX];
    (void)snprintf(hdr, sizeof hdr, "Authorization: Bearer %s\r\nConnection: close\r\n", b->admin);
    int len = build_req(req, sizeof req, method, target, hdr, body);
    if (len < 0)
        return len;
    bconn_t cc;
    int r = open_conn(b, V_CONTROL, &cc);
    if (r < 0)
        return r;
    hc_t h = { .fd = cc.fd, .io = cc.io, .buf = b->rbuf, .cap = RECV_BUF };
    rp_t rp;
    sb->len = 0;
    sb->data[0] = '\0';
    rp_init(&rp, small_sink, sb);
    r = send_all_io(cc.fd, cc.io, req, (size_t)len);
    if (r >= 0)
        r = hc_response(&h, &rp);
    bconn_close(&cc);
    if (r < 0)
        return r;
    *ret_status = rp.status;
    return 0;
}

/* ---- the job and its run ----------------------------------------------------------------- */

static int copy_id(char *dst, json_t *v)
{
    const char *s = json_string_value(v);
    if (!s || strlen(s) >= CAP_ID_MAX)
        return -EINVAL;
    memcpy(dst, s, strlen(s) + 1);
    return 0;
}

/* The run identity from an inspected job: RUNNING with a run, else -EAGAIN (or -EIO if the job
 * can no longer get there). */
static int parse_run(bench_t *b, json_t *job)
{
    const char *stage = json_string_value(json_object_get(job, "stage"));
    json_t *run = json_object_get(job, "run");
    if (!stage)
        return -EINVAL;
    if (streq(stage, "ERROR") || streq(stage, "CANCELED") || streq(stage, "COMPLETED"))
        return -EIO;
    if (!streq(stage, "RUNNING") || !json_is_object(run))
        return -EAGAIN;
    cap_run_t id = { .generation =
                         (uint64_t)json_integer_value(json_object_get(run, "generation")) };
    memcpy(id.sandbox, b->job, sizeof id.sandbox);
    if (id.generation < 1 || copy_id(id.node, json_object_get(run, "node")) < 0 ||
        copy_id(id.substrate, json_object_get(run, "substrate")) < 0 ||
        copy_id(id.activation, json_object_get(run, "activation")) < 0 ||
        copy_id(id.instance, json_object_get(run, "instance")) < 0)
        return -EINVAL;
    b->run = id;
    return 0;
}

static int create_job(bench_t *b)
{
    small_body_t sb;
    int status = 0, r;
    char target[256];
    /* a node offers its images from its first heartbeat: wait until one is live */
    for (uint64_t t0 = now_ns(); now_ns() - t0 < UINT64_C(10) * 1000000000u;) {
        r = control_call(b, "GET", "/v1/nodes", NULL, &sb, &status);
        if (r >= 0 && status == 200 && strstr(sb.data, "\"live\":true"))
            break;
        (void)usleep(50000);
    }
    json_t *spec = json_pack("{s:{s:s},s:{s:s}}", "secrets", "SBX_TOKEN", b->token, "labels",
                             "sbx-bench", "platform");
    char *body = spec ? json_dumps(spec, JSON_COMPACT) : NULL;
    json_decref(spec);
    if (!body)
        return -ENOMEM;
    (void)snprintf(target, sizeof target, "/v1/jobs/%s", b->ns);
    r = control_call(b, "POST", target, body, &sb, &status);
    free(body);
    if (r < 0) {
        fail(b, "create job: %s", strerror(-r));
        return r;
    }
    if (status / 100 != 2) {
        fail(b, "create job: HTTP %d %s", status, sb.data);
        return -EIO;
    }
    json_t *j = json_loads(sb.data, 0, NULL);
    r = copy_id(b->job, json_object_get(j, "id"));
    json_decref(j);
    if (r < 0 || !cap_id_valid(b->job)) {
        fail(b, "create job: no id in %s", sb.data);
        return -EIO;
    }
    (void)snprintf(target, sizeof target, "/v1/jobs/%s/%s", b->ns, b->job);
    uint64_t t0 = now_ns();
    do {
        r = control_call(b, "GET", target, NULL, &sb, &status);
        if (r >= 0 && status == 200) {
            j = json_loads(sb.data, 0, NULL);
            r = j ? parse_run(b, j) : -EINVAL;
            json_decref(j);
            if (r == 0) {
                printf("job %s/%s RUNNING after %.0f ms\n", b->ns, b->job, ms(now_ns() - t0));
                return 0;
            }
            if (r != -EAGAIN)
                break;
        }
        usleep(20000);
    } while (now_ns() - t0 < (uint64_t)JOB_WAIT_MS * 1000000u);
    fail(b, "job %s did not reach RUNNING: %s", b->job, sb.data);
    return -ETIMEDOUT;
}

/* ---- capabilities ------------------------------------------------------------------------ */

/* The node's request target of the bench's exec, as the edge proxy forwards it. */
static void exec_target(const bench_t *b, char *out, size_t cap)
{
    (void)snprintf(out, cap, "/v1/runs/%s/ports/%u/v1/exec", b->job, CAP_AGENT_PORT);
}

static cap_t exec_cap(const bench_t *b)
{
    /* what the edge proxy would ask for: the same purpose function over the same request,
     * bound to it (method, target and the buffered body) */
    cap_t c = { .run = b->run,
                .access = cap_purpose_of(SV("POST"), CAP_AGENT_PORT, SV("/v1/exec")) };
    char target[256];
    exec_target(b, target, sizeof target);
    (void)cap_bind_request(&c, "POST", 4, target, strlen(target), EXEC_BODY, strlen(EXEC_BODY));
    return c;
}

/* Mint a fresh exec capability with the control plane's current signer (keys re-read: a
 * rotation during the run is followed) and rebuild the node's request around it. */
static int mint(bench_t *b)
{
    keyring_t kr;
    int r = keys_load(b->store, &b->seal, &kr);
    cap_t c = exec_cap(b);
    if (r >= 0)
        r = keys_sign(&kr, &c, b->wire, sizeof b->wire);
    sodium_memzero(&kr, sizeof kr);
    if (r < 0) {
        fail(b, "cannot mint a capability from %s/store.db: %s", b->control_state, strerror(-r));
        return r;
    }
    b->wire_len = (size_t)r;
    b->minted_ns = now_ns();
    char target[256], hdr[CAP_WIRE_MAX + 512];
    exec_target(b, target, sizeof target);
    (void)snprintf(hdr, sizeof hdr, "X-Sandbox-Token: %s\r\nX-Sbx-Capability: %s\r\n", b->token,
                   b->wire);
    variant_t *v = &b->v[V_NODE];
    r = build_req(v->req, sizeof v->req, "POST", target, hdr, EXEC_BODY);
    v->req_len = r < 0 ? 0 : (size_t)r;
    return r < 0 ? r : 0;
}

static int b64url_part(const char *s, size_t n, uint8_t *out, size_t cap, size_t *ret)
{
    return sodium_base642bin(out, cap, s, n, NULL, ret, NULL,
                             sodium_base64_VARIANT_URLSAFE_NO_PADDING) == 0
               ? 0
               : -EINVAL;
}

/* Payload and signature of the wire form, for the bare Ed25519 baseline. */
static int split_wire(const char *w, size_t n, uint8_t *payload, size_t *plen, uint8_t *sig)
{
    const char *dot1 = memchr(w, '.', n), *dot2;
    size_t slen;
    if (!dot1 || !(dot2 = memchr(dot1 + 1, '.', (size_t)(w + n - dot1 - 1))) ||
        b64url_part(dot1 + 1, (size_t)(dot2 - dot1 - 1), payload, CAP_PAYLOAD_MAX, plen) < 0 ||
        b64url_part(dot2 + 1, (size_t)(w + n - dot2 - 1), sig, crypto_sign_BYTES, &slen) < 0 ||
        slen != crypto_sign_BYTES)
        return -EINVAL;
    return 0;
}

static void stats_row(const char *label, uint64_t *v, size_t n, double div, const char *unit)
{
    double sum = 0;
    qsort(v, n, sizeof *v, cmp_u64);
    for (size_t i = 0; i < n; i++)
        sum += (double)v[i];
    printf("  %-46s %9.3f %9.3f %9.3f %9.3f %-3s n=%zu\n", label,
           (double)percentile(v, n, 50) / div, (double)percentile(v, n, 90) / div,
           (double)percentile(v, n, 99) / div, sum / (double)n / div, unit, n);
}

/* The node's per-request check, in process: cap_verify (base64url, canonical decoding, key
 * lookup, Ed25519, iat/exp) + cap_compare against the installed run, on a real minted wire
 * string and the node's verification key set; beside it a bare Ed25519 verify. */
static int bench_cap_cost(bench_t *b, double *ret_p50_us)
{
    keyring_t kr;
    cap_pubkey_t pubs[CAP_KEYSET_MAX];
    cap_keyset_t ks;
    int r = keys_load(b->store, &b->seal, &kr);
    size_t npub =
        r < 0 ? 0 : cap_rotation_verify_set(kr.recs, kr.n, time(NULL), pubs, CAP_KEYSET_MAX);
    const cap_keyrec_t *signer = r < 0 ? NULL : cap_rotation_signer(kr.recs, kr.n, time(NULL));
    cap_pubkey_t spk = { 0 };
    if (signer) {
        memcpy(spk.kid, signer->key.kid, sizeof spk.kid);
        memcpy(spk.pk, signer->key.pk, sizeof spk.pk);
    }
    sodium_memzero(&kr, sizeof kr);
    if (npub == 0 || !signer || cap_keyset_set(&ks, pubs, npub) < 0) {
        fail(b, "no verification keys in %s/store.db", b->control_state);
        return -ENOKEY;
    }
    uint8_t payload[CAP_PAYLOAD_MAX], sig[crypto_sign_BYTES];
    size_t plen;
    if (mint(b) < 0 || split_wire(b->wire, b->wire_len, payload, &plen, sig) < 0) {
        fail(b, "minted capability is not v2.<payload>.<signature>");
        return -EINVAL;
    }
    cap_expose_t expose = { CAP_AGENT_PORT, CAP_PROTO_HTTP };
    char target[256];
    exec_target(b, target, sizeof target);
    cap_request_t rq = { .sandbox = b->run.sandbox,
                         .method = "POST",
                         .method_len = 4,
                         .target = target,
                         .target_len = strlen(target),
                         .purpose = exec_cap(b).access,
                         .installed = &b->run,
                         .expose = &expose,
                         .n_expose = 1 };
    size_t n = (size_t)b->cap_n, bad = 0;
    _cleanup_free_ uint64_t *both = calloc(n, sizeof(uint64_t));
    _cleanup_free_ uint64_t *bare = calloc(n, sizeof(uint64_t));
    if (!both || !bare)
        return -ENOMEM;
    for (size_t i = 0; i < n / 10 + 1; i++) { /* warm caches and the CPU clock */
        cap_t c;
        bad += cap_verify(&ks, b->wire, b->wire_len, time(NULL), &c) != CAP_OK;
    }
    for (size_t i = 0; i < n; i++) {
        cap_t c;
        cap_reason_t why;
        uint64_t t0 = now_ns();
        bad += cap_verify(&ks, b->wire, b->wire_len, (int64_t)time(NULL), &c) != CAP_OK ||
               cap_compare(&c, &rq, &why) != CAP_ALLOW;
        uint64_t t1 = now_ns();
        bad += crypto_sign_verify_detached(sig, payload, plen, spk.pk) != 0;
        both[i] = t1 - t0;
        bare[i] = now_ns() - t1;
    }
    if (bad) {
        fail(b, "%zu capability checks did not give Allow", bad);
        return -EINVAL;
    }
    char title[160], note[64];
    (void)snprintf(title, sizeof title,
                   "1. capability verification + comparison, in process (%zu iterations; "
                   "wire form %zu bytes, %zu verification keys)",
                   n, b->wire_len, npub);
    section(title);
    printf("  %-46s %9s %9s %9s %9s\n", "", "p50", "p90", "p99", "mean");
    stats_row("cap_verify + cap_compare (the node's check)", both, n, 1e3, "us");
    stats_row("baseline: bare crypto_sign_verify_detached", bare, n, 1e3, "us");
    double p50 = (double)percentile(both, n, 50) / 1e3, base = (double)percentile(bare, n, 50);
    fig("ratio: verify+compare p50 / bare verify p50", base > 0 ? p50 * 1e3 / base : 0, "x", NULL);
    fig("verify+compare p50", p50, "us",
        target_note(p50 <= TARGET_CAP_US, "<= 60 us", note, sizeof note));
    *ret_p50_us = p50;
    return 0;
}

/* ---- exec round trips -------------------------------------------------------------------- */

/* One exec of `true`, timed from connect (or send, on a kept connection) to the exit event. */
static int exec_once(bench_t *b, int vi, bconn_t *keep, uint64_t *ret_ns)
{
    variant_t *v = &b->v[vi];
    if (vi == V_NODE && now_ns() - b->minted_ns > MINT_EVERY_NS && mint(b) < 0)
        return -EIO; /* a fresh capability well before the old one expires */
    uint64_t t0 = now_ns();
    bconn_t own = { .fd = -EBADF };
    bconn_t *cc = keep ? keep : &own;
    int r = keep ? 0 : open_conn(b, vi, &own);
    if (r < 0) {
        fail(b, "%s: connect: %s", v->label, strerror(-r));
        return r;
    }
    int keep_fd = keep ? keep->fd : -1;
    hc_t h = { .fd = cc->fd, .io = cc->io, .buf = b->rbuf, .cap = RECV_BUF };
    rp_t rp;
    nd_reset(&b->nd);
    rp_init(&rp, nd_sink, &b->nd);
    r = send_all_io(cc->fd, cc->io, v->req, v->req_len);
    if (r >= 0)
        r = hc_response(&h, &rp);
    uint64_t t1 = now_ns();
    if (!keep)
        bconn_close(&own);
    if (r < 0) {
        fail(b, "%s: %s", v->label, strerror(-r));
        return r;
    }
    if (nd_check(&b->nd, &rp) < 0 || h.len != 0 || (keep_fd >= 0 && rp.close)) {
        fail(b, "%s: %s", v->label,
             b->nd.bad ? b->nd.why
             : h.len   ? "bytes after the answer"
                       : "connection not kept");
        return -EBADMSG;
    }
    *ret_ns = t1 - t0;
    return 0;
}

/* n requests of one variant in a row (warm-up, and the CPU figures: with cpu, what each
 * process's loop thread spent meanwhile is added to the variant's). */
static int run_block(bench_t *b, int vi, unsigned n, bool cpu)
{
    variant_t *v = &b->v[vi];
    bconn_t keep = { .fd = -EBADF };
    bool kept = vi == V_DIRECT_KA || vi == V_CONTROL_KA;
    int r0 = kept ? open_conn(b, vi, &keep) : 0;
    if (r0 < 0) {
        fail(b, "%s: connect: %s", v->label, strerror(-r0));
        return r0;
    }
    uint64_t c0 = cpu_of(b->control_pid), n0 = cpu_of(b->node_pid), d0 = cpu_of(b->direct_pid);
    for (unsigned i = 0; i < n; i++) {
        uint64_t ns;
        int r = exec_once(b, vi, kept ? &keep : NULL, &ns);
        if (r < 0) {
            bconn_close(&keep);
            return r;
        }
    }
    bconn_close(&keep);
    if (cpu) {
        v->cpu_ctl += cpu_of(b->control_pid) - c0;
        v->cpu_node += cpu_of(b->node_pid) - n0;
        v->cpu_direct += cpu_of(b->direct_pid) - d0;
        v->cpu_n += n;
    }
    return 0;
}

/* One timed round: per_round requests of every variant, interleaved request by request with
 * the order rotated each time (noise hits all alike; no variant always follows the same one).
 * The keep-alive variant holds one connection for the round. Each variant's p50 of the round
 * is kept for the spread of the differences. */
static int run_round(bench_t *b, const int *order, size_t nv, size_t round)
{
    bconn_t keep[2] = { { .fd = -EBADF }, { .fd = -EBADF } }; /* (a) and (c) kept */
    size_t start[V_N];
    int r0 = b->v[V_DIRECT_KA].on ? open_conn(b, V_DIRECT_KA, &keep[0]) : 0;
    if (r0 >= 0 && b->v[V_CONTROL_KA].on)
        r0 = open_conn(b, V_CONTROL_KA, &keep[1]);
    if (r0 < 0) {
        fail(b, "keep-alive connections: %s", strerror(-r0));
        bconn_close(&keep[0]);
        return r0;
    }
    for (int i = 0; i < V_N; i++)
        start[i] = b->v[i].n;
    for (size_t i = 0; i < b->per_round; i++)
        for (size_t k = 0; k < nv; k++) {
            int vi = order[(k + i + round) % nv];
            uint64_t ns;
            int r = exec_once(b, vi,
                              vi == V_DIRECT_KA    ? &keep[0]
                              : vi == V_CONTROL_KA ? &keep[1]
                                                   : NULL,
                              &ns);
            if (r < 0) {
                bconn_close(&keep[0]);
                bconn_close(&keep[1]);
                return r;
            }
            b->v[vi].lat[b->v[vi].n++] = ns;
        }
    for (size_t k = 0; k < nv; k++) {
        variant_t *v = &b->v[order[k]];
        size_t n = v->n - start[order[k]];
        memcpy(b->round_tmp, v->lat + start[order[k]], n * sizeof(uint64_t));
        qsort(b->round_tmp, n, sizeof *b->round_tmp, cmp_u64);
        v->round_p50[round] = percentile(b->round_tmp, n, 50);
    }
    bconn_close(&keep[0]);
    bconn_close(&keep[1]);
    return 0;
}

static int setup_variants(bench_t *b)
{
    static const char *const labels[V_N] = {
        [V_DIRECT] = "(a)  direct: sbx-server, unix socket",
        [V_DIRECT_KA] = "ref: (a) on one keep-alive connection",
        [V_RUN] = "(a') the run's agent, node bypassed",
        [V_NODE] = "(b)  through the node (capability)",
        [V_CONTROL] = "(c)  through control -> node (edge proxy)",
        [V_CONTROL_KA] = "(c) on one keep-alive connection",
    };
    char hdr[512], target[256];
    (void)snprintf(hdr, sizeof hdr, "X-Sandbox-Token: %s\r\n", b->token);
    for (int i = 0; i < V_N; i++) {
        variant_t *v = &b->v[i];
        v->label = labels[i];
        v->on = i != V_RUN || b->node_state;
        v->lat = calloc(b->rounds * b->per_round, sizeof(uint64_t));
        v->round_p50 = calloc(b->rounds, sizeof(uint64_t));
        if (!v->lat || !v->round_p50)
            return -ENOMEM;
        int r = 0;
        if (i == V_DIRECT || i == V_DIRECT_KA || i == V_RUN)
            r = build_req(v->req, sizeof v->req, "POST", "/v1/exec", hdr, EXEC_BODY);
        if (i == V_CONTROL || i == V_CONTROL_KA) {
            char h2[1024];
            (void)snprintf(h2, sizeof h2, "Authorization: Bearer %s\r\n%s", b->admin, hdr);
            (void)snprintf(target, sizeof target, "/v1/jobs/%s/%s/proxy/%u/v1/exec", b->ns, b->job,
                           CAP_AGENT_PORT);
            r = build_req(v->req, sizeof v->req, "POST", target, h2, EXEC_BODY);
        }
        if (r < 0)
            return r;
        v->req_len = (size_t)r;
    }
    if (b->node_state)
        (void)snprintf(b->run_sock, sizeof b->run_sock, "%s/runs/%s/br/a.sock", b->node_state,
                       b->job);
    b->round_tmp = calloc(b->per_round, sizeof(uint64_t));
    return b->round_tmp ? mint(b) : -ENOMEM;
}

static uint64_t p50_of(variant_t *v)
{
    qsort(v->lat, v->n, sizeof *v->lat, cmp_u64);
    return percentile(v->lat, v->n, 50);
}

/* The p50 difference hi - lo, with the spread of the per-round differences. */
static void hop(bench_t *b, const char *label, int hi, int lo, double target_ms)
{
    double d = ms(p50_of(&b->v[hi])) - ms(p50_of(&b->v[lo])), mn = 1e9, mx = -1e9;
    for (size_t r = 0; r < b->rounds; r++) {
        double x = ms(b->v[hi].round_p50[r]) - ms(b->v[lo].round_p50[r]);
        mn = MIN(mn, x);
        mx = MAX(mx, x);
    }
    char note[128], tn[64];
    (void)snprintf(
        note, sizeof note, "(per round %+.3f .. %+.3f)%s%s", mn, mx, target_ms > 0 ? "  " : "",
        target_ms > 0 ? target_note(d <= target_ms, "<= 0.5 ms p50", tn, sizeof tn) : "");
    printf("  %-46s %+9.3f ms  %s\n", label, d, note);
}

static void print_cpu(bench_t *b)
{
    enum { P_SERVER, P_NODE, P_CONTROL };
    static const struct {
        int v, who;
        const char *label;
    } rows[] = {
        { V_DIRECT, P_SERVER, "sbx-server, (a) direct" },
        { V_DIRECT_KA, P_SERVER, "sbx-server, (a) on keep-alive" },
        { V_NODE, P_NODE, "sbx-node, (b) through the node" },
        { V_CONTROL, P_NODE, "sbx-node, (c) through control -> node" },
        { V_CONTROL, P_CONTROL, "sbx-control, (c) through control -> node" },
        { V_CONTROL_KA, P_NODE, "sbx-node, (c) on keep-alive" },
        { V_CONTROL_KA, P_CONTROL, "sbx-control, (c) on keep-alive" },
    };
    char title[160];
    (void)snprintf(title, sizeof title,
                   "CPU per request of each process's loop thread (/proc/<pid>/schedstat; a "
                   "block of %llu requests per variant, after the rounds)",
                   (unsigned long long)b->per_round);
    section(title);
    for (size_t i = 0; i < ELEMENTSOF(rows); i++) {
        const variant_t *v = &b->v[rows[i].v];
        int who = rows[i].who;
        pid_t pid = who == P_SERVER ? b->direct_pid : who == P_NODE ? b->node_pid : b->control_pid;
        uint64_t ns = who == P_SERVER ? v->cpu_direct : who == P_NODE ? v->cpu_node : v->cpu_ctl;
        if (v->cpu_n && pid > 0)
            fig(rows[i].label, ms(ns) / (double)v->cpu_n, "ms",
                who == P_SERVER ? "(spawning the command included)" : NULL);
    }
}

static int bench_exec(bench_t *b, double cap_p50_us)
{
    int order[V_N];
    size_t nv = 0;
    for (int i = 0; i < V_N; i++)
        if (b->v[i].on)
            order[nv++] = i;
    for (size_t k = 0; k < nv; k++) /* warm up every path (route cache, page cache, CPU clock) */
        if (run_block(b, order[k], (unsigned)b->warmup, false) < 0)
            return -1;
    for (size_t r = 0; r < b->rounds; r++)
        if (run_round(b, order, nv, r) < 0)
            return -1;
    for (size_t k = 0; k < nv; k++) /* CPU: each variant alone, so nothing spills over */
        if (run_block(b, order[k], (unsigned)b->per_round, true) < 0)
            return -1;
    char title[256], note[64];
    (void)snprintf(
        title, sizeof title,
        "2. exec [\"true\"] round trip, new connection per request: %llu rounds x %llu "
        "requests per variant, taking turns request by request (after %llu warm-up each)",
        (unsigned long long)b->rounds, (unsigned long long)b->per_round,
        (unsigned long long)b->warmup);
    section(title);
    printf("  %-46s %9s %9s %9s %9s\n", "", "p50", "p90", "p99", "mean");
    size_t total = 0;
    for (int k = 0; k < V_N; k++)
        if (b->v[k].on) {
            stats_row(b->v[k].label, b->v[k].lat, b->v[k].n, 1e6, "ms");
            total += b->v[k].n;
        }
    printf("  %zu timed requests in all\n", total);
    double pa = ms(p50_of(&b->v[V_DIRECT])), pb = ms(p50_of(&b->v[V_NODE]));
    double pc = ms(p50_of(&b->v[V_CONTROL]));
    fig("(a) direct p50", pa, "ms",
        target_note(pa <= TARGET_DIRECT_MS, "<= 0.7 ms", note, sizeof note));
    fig("(c) full path p50", pc, "ms",
        target_note(pc <= TARGET_FULL_MS, "<= 1.2 ms", note, sizeof note));

    section("3. added latency per hop (difference of the p50s)");
    hop(b, "node hop: (b) - (a)", V_NODE, V_DIRECT, 0);
    hop(b, "control hop: (c) - (b)", V_CONTROL, V_NODE, 0);
    hop(b, "full path adds, new connections: (c) - (a)", V_CONTROL, V_DIRECT, 0);
    hop(b, "full path adds, keep-alive: (c) ka - (a) ka", V_CONTROL_KA, V_DIRECT_KA,
        TARGET_ADDED_MS);
    if (b->v[V_RUN].on) {
        hop(b, "  of which the run's agent: (a') - (a)", V_RUN, V_DIRECT, 0);
        hop(b, "  of which the node itself: (b) - (a')", V_NODE, V_RUN, 0);
    }
    hop(b, "ref: new connection vs keep-alive, (a) - ka", V_DIRECT, V_DIRECT_KA, 0);
    print_cpu(b);

    double pka = ms(p50_of(&b->v[V_DIRECT_KA])), pcka = ms(p50_of(&b->v[V_CONTROL_KA]));
    double add = pcka - pka;
    const char *tr = b->tls ? "TLS" : "plain HTTP";
    printf("\nexec true p50 (%s): direct %.3f ms, through node %.3f ms, through control -> node "
           "%.3f ms (%llu requests each, new connections)\n",
           tr, pa, pb, pc, (unsigned long long)(b->rounds * b->per_round));
    printf("added p50, new connections: node hop %+.3f ms, control hop %+.3f ms, full path "
           "%+.3f ms\n",
           pb - pa, pc - pb, pc - pa);
    printf("keep-alive p50: direct %.3f ms, full path %.3f ms\n", pka, pcka);
    printf("target: %s + two hops add <= %.1f ms p50 (keep-alive, full path vs direct): %s "
           "(%+.3f ms)\n",
           tr, TARGET_ADDED_MS, add <= TARGET_ADDED_MS ? "met" : "MISSED", add);
    printf("target: capability verification + comparison <= %.0f us: %s (p50 %.1f us)\n",
           TARGET_CAP_US, cap_p50_us <= TARGET_CAP_US ? "met" : "MISSED", cap_p50_us);
    return 0;
}

/* ---- arguments --------------------------------------------------------------------------- */

static int read_token(const char *path, char *out, size_t cap)
{
    ssize_t n = read_small_file(path, out, cap);
    if (n < 0)
        return (int)n;
    while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == '\r' || out[n - 1] == ' '))
        out[--n] = '\0';
    return n > 0 ? 0 : -EINVAL;
}

static int arg_u64(const char *s, uint64_t max, uint64_t *ret)
{
    return parse_u64_str(s, max, ret) < 0 || *ret == 0 ? -EINVAL : 0;
}

static int parse_args(int argc, char **argv, bench_t *b)
{
    bool quick = false;
    uint64_t v, rounds = 0, per = 0, warm = UINT64_MAX, capn = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        int r = 0;
        if (streq(a, "--quick")) {
            quick = true;
            continue;
        }
        if (!val)
            return -EINVAL;
        i++;
        if (streq(a, "--control-port") || streq(a, "--node-port")) {
            r = arg_u64(val, 65535, &v);
            *(streq(a, "--node-port") ? &b->node_port : &b->control_port) = (uint16_t)v;
        } else if (streq(a, "--control-pid") || streq(a, "--node-pid") ||
                   streq(a, "--direct-pid")) {
            r = arg_u64(val, INT32_MAX, &v);
            *(streq(a, "--control-pid") ? &b->control_pid
              : streq(a, "--node-pid")  ? &b->node_pid
                                        : &b->direct_pid) = (pid_t)v;
        } else if (streq(a, "--control-state"))
            b->control_state = val;
        else if (streq(a, "--node-state"))
            b->node_state = val;
        else if (streq(a, "--admin-token-file"))
            b->admin_file = val;
        else if (streq(a, "--direct"))
            b->direct_sock = val;
        else if (streq(a, "--ns"))
            b->ns = val;
        else if (streq(a, "--rounds"))
            r = arg_u64(val, 1000, &rounds);
        else if (streq(a, "--per-round"))
            r = arg_u64(val, 1000000, &per);
        else if (streq(a, "--warmup"))
            r = parse_u64_str(val, 1000000, &warm);
        else if (streq(a, "--cap-iterations"))
            r = arg_u64(val, 100000000, &capn);
        else
            return -EINVAL;
        if (r < 0)
            return r;
    }
    b->rounds = rounds ? rounds : quick ? 3 : 10;
    b->per_round = per ? per : quick ? 20 : 200;
    b->warmup = warm != UINT64_MAX ? warm : quick ? 5 : 20;
    b->cap_n = capn ? capn : quick ? 2000 : 20000;
    if (!b->control_port || !b->node_port || !b->control_state || !b->admin_file ||
        !b->direct_sock || !valid_name(b->ns, 63))
        return -EINVAL;
    return 0;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: bench-platform --control-port P --node-port P --control-state DIR\n"
            "                      --admin-token-file F --direct SOCKET [--node-state DIR]\n"
            "                      [--control-pid N] [--node-pid N] [--direct-pid N] [--ns NS]\n"
            "                      [--rounds N] [--per-round N] [--warmup N]\n"
            "                      [--cap-iterations N] [--quick]\n"
            "       bench-platform --free-port\n"
            "SBX_BENCH_TOKEN: the sandbox token (the job's secret SBX_TOKEN and the direct\n"
            "server's). Normally run through scripts/bench-platform.sh.\n");
}

static void bench_free(bench_t *b)
{
    for (int i = 0; i < V_N; i++) {
        free(b->v[i].lat);
        free(b->v[i].round_p50);
    }
    free(b->round_tmp);
    free(b->rbuf);
    nd_free(&b->nd);
    store_close(b->store);
    tls_ctx_unref(b->tls);
    sodium_memzero(&b->seal, sizeof b->seal);
    sodium_memzero(b->admin, sizeof b->admin);
}

static int bench_main(bench_t *b)
{
    char path[PATH_MAX];
    const char *tok = getenv("SBX_BENCH_TOKEN");
    if (!tok || !*tok || strlen(tok) >= sizeof b->token) {
        fprintf(stderr, "bench-platform: SBX_BENCH_TOKEN is not set\n");
        return -EINVAL;
    }
    memcpy(b->token, tok, strlen(tok) + 1);
    if (read_token(b->admin_file, b->admin, sizeof b->admin) < 0) {
        fprintf(stderr, "bench-platform: cannot read the admin token from %s\n", b->admin_file);
        return -EINVAL;
    }
    (void)snprintf(path, sizeof path, "%s/tls/ca.crt", b->control_state);
    if (access(path, R_OK) == 0 && tls_client_ctx_new(path, NULL, &b->tls) < 0) {
        fprintf(stderr, "bench-platform: cannot use the CA %s: %s\n", path, tls_last_error());
        return -EINVAL;
    }
    printf("transport to control and node: %s\n", b->tls ? "TLS 1.3 (the platform's CA)" : "plain");
    (void)snprintf(path, sizeof path, "%s/store.db", b->control_state);
    int r = access(path, R_OK | W_OK) < 0 ? negative_errno() : store_open_sqlite(path, &b->store);
    if (r < 0) {
        fprintf(stderr, "bench-platform: cannot open %s: %s\n", path, strerror(-r));
        return r;
    }
    sbx_err_t err = { 0 };
    (void)snprintf(path, sizeof path, "%s/secrets.key", b->control_state);
    r = seal_keys_load(path, &b->seal, &err);
    if (r < 0) {
        fprintf(stderr, "bench-platform: %s\n", err.msg[0] ? err.msg : strerror(-r));
        return r;
    }
    b->rbuf = malloc(RECV_BUF);
    if (!b->rbuf)
        return -ENOMEM;
    if ((r = create_job(b)) < 0 || (r = setup_variants(b)) < 0)
        return r;
    printf("run: sandbox %s generation %llu on %s (substrate %s, activation %s, instance %s)\n",
           b->run.sandbox, (unsigned long long)b->run.generation, b->run.node, b->run.substrate,
           b->run.activation, b->run.instance);
    double cap_p50 = 0;
    if ((r = bench_cap_cost(b, &cap_p50)) < 0)
        return r;
    return bench_exec(b, cap_p50);
}

int main(int argc, char **argv)
{
    static bench_t b = { .ns = "bench", .control_pid = -1, .node_pid = -1, .direct_pid = -1 };
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 2 && streq(argv[1], "--free-port"))
        return free_port();
    if (parse_args(argc, argv, &b) < 0) {
        usage();
        return 2;
    }
    if (sodium_init() < 0)
        return 1;
    struct utsname u;
    (void)uname(&u);
    printf("sbx platform benchmark: %ld CPUs, Linux %s, libsodium %s\n",
           sysconf(_SC_NPROCESSORS_ONLN), u.release, sodium_version_string());
    printf("figures only; nothing here asserts on timings (exit 1 = a functional failure)\n");
    print_loadavg("at start");
    int r = bench_main(&b);
    print_loadavg("at end");
    if (b.failures > FAILURES_SHOWN)
        printf("  (%u failures in all; the first %d shown)\n", b.failures, FAILURES_SHOWN);
    bench_free(&b);
    return r < 0 || b.failures ? 1 : 0;
}
