/* SPDX-License-Identifier: MIT */
/* The edge proxy: ANY /v1/jobs/{ns}/{job}/proxy/{port}/... -> the node of the job's run.
 *
 * The bearer has already been checked (read on ns). The proxy finds the route (cache, else the
 * run record), signs a capability for exactly that run and request purpose, strips
 * Authorization, keeps X-Sandbox-Token, and forwards to the node. Requests whose body is small
 * enough to keep (or that have none) are replayable: the proxy reads the node's answer head
 * before committing, and a recognized RefreshRoute (409 + X-Sbx-Verdict) makes it look the
 * route up again, repair the cache entry by compare-and-swap against the rejected route, and
 * make exactly one freshly built retry. A Deny is final. Transport failures: a connection that
 * could not be made sent nothing, so it is retried once on a refreshed route; after sending,
 * nothing is retried (the request may have run: 502 with X-Sbx-Outcome: unknown). Larger or
 * chunked bodies stream straight through (no retry). docs/platform.md has the table of what a
 * client may conclude from each answer. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/socket.h>

#include "cap/purpose.h"
#include "common/log.h"
#include "control.h"
#include "http/proxy.h"
#include "http/relay.h"

#define EDGE_CONNECT_TIMEOUT_MS 10000
#define EDGE_ANSWER_TIMEOUT_MS 120000 /* replayable requests: the node's answer head */
#define EDGE_HEAD_MAX (64 * 1024)
/* An idle connection to a node is used again within this time; nodes keep idle connections
 * for 75 s, so one taken from here was not closed by its node. */
#define EDGE_KEEP_MS 10000

typedef struct {
    control_t *ctl;
    conn_t *conn;  /* NULL once the client left */
    char key[128]; /* ns/job */
    char ns[64], job[32];
    uint16_t port;
    char *rest; /* path after /proxy/{port} plus the query */
    route_t route;
    bool retried, replayable, sent_any;
    bool keep; /* known in full, no upgrade: relayed, the node connection kept */
    /* a pooled sandbox: it lives only in generation pin_gen of the host's run, and the agent
     * hears its own token (the client's X-Sandbox-Token is dropped) */
    bool pinned;
    uint64_t pin_gen;
    char sandbox[CAP_ID_MAX];
    char token_hdr[128];
    bool reused; /* this attempt runs on a kept connection */
    buf_t out;   /* head (+ body) for the node, not yet sent */
    buf_t in;    /* the node's answer so far */
    size_t out_total;
    relay_conn_t *k; /* the connection to the node (k->io: TLS, or NULL), NULL before one */
    timer_t_ deadline;
    enum { E_CONNECTING, E_HANDSHAKE, E_SENDING, E_READING } st;
} edge_t;

static void edge_free(void *p)
{
    edge_t *e = p;
    sodium_memzero(e->token_hdr, sizeof e->token_hdr);
    relay_conn_close(e->k);
    buf_free(&e->out);
    buf_free(&e->in);
    free(e->rest);
    free(e);
}

static void edge_release(edge_t *e)
{
    loop_t *l = e->ctl->srv.loop;
    relay_conn_close(TAKE_PTR(e->k)); /* no event reaches e after this */
    timer_disarm(l, &e->deadline);
    if (e->conn)
        conn_set_handler(e->conn, NULL, NULL);
    e->conn = NULL;
    if (loop_defer(l, edge_free, e) < 0)
        edge_free(e);
}

static void edge_on_conn_close(conn_t *c, bool aborted)
{
    edge_t *e = c->hdata;
    (void)aborted;
    e->conn = NULL;
    edge_release(e);
}

static const handler_ops_t edge_ops = { .on_close = edge_on_conn_close };

_printf_(3, 4) static void edge_fail(edge_t *e, int status, const char *fmt, ...)
{
    conn_t *c = e->conn;
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    (void)vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    edge_release(e);
    if (c)
        http_error(c, status, 0, "%s", msg);
}

/* A pooled sandbox whose host's run is not the one it was made in: it is gone (the new run's
 * agent never had it), and no other run answers for it. */
static void edge_gone(edge_t *e, uint64_t now_gen)
{
    edge_fail(e, HTTP_GONE,
              "sandbox %s is gone: its pool host %s runs generation %llu, the sandbox lived in "
              "generation %llu",
              e->sandbox, e->job, (unsigned long long)now_gen, (unsigned long long)e->pin_gen);
}

/* A failure after the request went out: 502 with X-Sbx-Outcome: unknown (never a verdict). */
_printf_(2, 3) static void edge_fail_sent(edge_t *e, const char *fmt, ...)
{
    conn_t *c = e->conn;
    char msg[256], body[400];
    va_list ap;
    va_start(ap, fmt);
    (void)vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    edge_release(e);
    if (!c)
        return;
    json_t *j = json_pack("{s:s,s:s}", "error", msg, "outcome", "unknown");
    char *t = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    int n = snprintf(body, sizeof body, "%s", t ? t : "{\"outcome\":\"unknown\"}");
    free(t);
    conn_close_after(c);
    (void)conn_respond(c, HTTP_BAD_GATEWAY, "application/json", body,
                       (size_t)MIN(n, (int)sizeof body - 1), "X-Sbx-Outcome: unknown\r\n");
}

/* The job's route from the store: 0; -ENOENT (no run record in ns); -EAGAIN (a record that
 * does not serve: *state says what it is); another -errno when the store cannot be read. */
static int route_from_store(control_t *ctl, const char *ns, const char *job, route_t *ret,
                            runrec_state_t *state)
{
    runrec_t rr;
    int64_t rev;
    *state = RR_NONE;
    int r = runrec_load(ctl->store, job, &rr, &rev);
    if (r == -ENOENT || (r >= 0 && !streq(rr.ns, ns)))
        return -ENOENT;
    if (r < 0)
        return r;
    *state = rr.state;
    if (rr.state != RR_RUNNING)
        return -EAGAIN;
    route_t rt = { .run = rr.run, .port = rr.port, .rev = rev };
    (void)snprintf(rt.job, sizeof rt.job, "%s/%s", ns, job);
    (void)snprintf(rt.host, sizeof rt.host, "%s", rr.host);
    *ret = rt;
    return 0;
}

/* The agent's read-only routes besides files: its health, and on pool hosts the sandbox
 * listing and one sandbox's record (not its proxy or any route below it). */
static bool agent_read_route(sv_t path)
{
    static const char pre[] = "/v1/sandboxes/";
    if (sv_eq(path, SV("/health")) || sv_eq(path, SV("/v1/sandboxes")))
        return true;
    if (path.len <= sizeof pre - 1 || memcmp(path.p, pre, sizeof pre - 1) != 0)
        return false;
    return memchr(path.p + sizeof pre - 1, '/', path.len - (sizeof pre - 1)) == NULL;
}

role_t edge_role_needed(sv_t method, uint16_t port, sv_t path)
{
    bool read = sv_eq(method, SV("GET")) || sv_eq(method, SV("HEAD"));
    switch (cap_purpose_of(method, port, path)) {
    case CAP_FILES_READ: return ROLE_READ;
    case CAP_PROXY:
        return port == CAP_AGENT_PORT && read && agent_read_route(path) ? ROLE_READ : ROLE_WRITE;
    default: return ROLE_WRITE; /* exec, processes, file writes */
    }
}

/* The key pin registered for a node, cached for a few seconds (a node that registers again
 * with a new key is re-read after a failed handshake). */
#define EDGE_PIN_TTL_MS 5000
static int edge_node_pin(control_t *ctl, const char *node, uint8_t pin[TLS_PIN_BYTES])
{
    uint64_t now = loop_now_ms(ctl->srv.loop);
    size_t n = ELEMENTSOF(ctl->pins), slot = 0;
    for (size_t i = 0; i < n; i++) {
        if (streq(ctl->pins[i].node, node) && ctl->pins[i].at_ms + EDGE_PIN_TTL_MS > now) {
            memcpy(pin, ctl->pins[i].pin, TLS_PIN_BYTES);
            return 0;
        }
        if (ctl->pins[i].at_ms < ctl->pins[slot].at_ms)
            slot = i;
    }
    int r = node_pin_load(ctl->store, node, pin);
    if (r < 0)
        return r;
    (void)snprintf(ctl->pins[slot].node, sizeof ctl->pins[slot].node, "%s", node);
    memcpy(ctl->pins[slot].pin, pin, TLS_PIN_BYTES);
    ctl->pins[slot].at_ms = now;
    return 0;
}

static void edge_node_pin_forget(control_t *ctl, const char *node)
{
    for (size_t i = 0; i < ELEMENTSOF(ctl->pins); i++)
        if (streq(ctl->pins[i].node, node))
            ctl->pins[i].at_ms = 0;
}

static int connect_node(const route_t *rt, int *ret_fd)
{
    struct sockaddr_storage ss = { 0 };
    socklen_t sl;
    struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, rt->host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons(rt->port);
        sl = sizeof *a4;
    } else if (inet_pton(AF_INET6, rt->host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons(rt->port);
        sl = sizeof *a6;
    } else
        return -EINVAL;
    _cleanup_close_ int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return negative_errno();
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&ss, sl) < 0 && errno != EINPROGRESS)
        return negative_errno();
    *ret_fd = TAKE_FD(fd);
    return 0;
}

/* Capability + head for the current route (freshly built for every attempt). */
static int build_request(edge_t *e)
{
    conn_t *c = e->conn;
    http_request_t *rq = &c->req;
    sv_t rest = sv_make(e->rest, strlen(e->rest));
    const char *q = memchr(rest.p, '?', rest.len);
    sv_t path = q ? sv_make(rest.p, (size_t)(q - rest.p)) : rest;
    sv_t up;
    cap_proto_t proto = http_header_get(rq, "upgrade", &up) && sv_eq_lit_nocase(up, "websocket")
                            ? CAP_PROTO_WEBSOCKET
                            : CAP_PROTO_HTTP;
    uint32_t purpose = cap_purpose_of(rq->method, e->port, path);
    cap_t cap = { .run = e->route.run, .access = purpose };
    if (purpose == CAP_PROXY) {
        cap.port = e->port;
        cap.proto = proto;
    }
    char target[HTTP_MAX_HEAD + 128];
    int tl = snprintf(target, sizeof target, "/v1/runs/%s/ports/%u%s", e->job, e->port, e->rest);
    if (tl < 0 || (size_t)tl >= sizeof target)
        return -E2BIG;
    /* the capability names this request: method, target, and the body when it is buffered */
    bool body = e->replayable && c->body.len > 0;
    int r = cap_bind_request(&cap, rq->method.p, rq->method.len, target, (size_t)tl,
                             !e->replayable ? NULL
                             : body         ? buf_head(&c->body)
                                            : "",
                             body ? c->body.len : 0);
    if (r < 0)
        return r;
    char wire[CAP_WIRE_MAX + 64];
    /* a repeated request (same run, purpose, method, target, body) is sent the capability
     * signed for it less than CAP_REUSE_S ago: it would be good for exactly that anyway */
    r = keys_sign_reuse(&e->ctl->keys, &e->ctl->edge_caps, &cap, wire, sizeof wire);
    if (r < 0)
        return r;
    char extra[sizeof wire + 160 + sizeof e->token_hdr];
    (void)snprintf(extra, sizeof extra, "X-Sbx-Capability: %s\r\nX-Forwarded-For: %s\r\n%s", wire,
                   c->peer, e->token_hdr);
    static const char *const drop[] = { "authorization", "x-sbx-capability", "x-forwarded-for",
                                        NULL };
    static const char *const drop_pinned[] = { "authorization", "x-sbx-capability",
                                               "x-forwarded-for", "x-sandbox-token", NULL };
    buf_free(&e->out);
    r = proxy_forward_head(rq, sv_make(target, (size_t)tl), e->pinned ? drop_pinned : drop, extra,
                           e->keep, &e->out);
    sodium_memzero(extra, sizeof extra);
    if (r >= 0 && e->replayable && c->body.len > 0) {
        e->out.max += c->body.len;
        r = buf_append(&e->out, buf_head(&c->body), c->body.len);
    }
    return r;
}

static void edge_on_event(loop_t *l, watcher_t *w, uint32_t ev);
static void edge_on_timeout(loop_t *l, timer_t_ *t);
static void on_writable(edge_t *e);

/* ---- kept connections to nodes ------------------------------------------------------------ */

static node_conns_t *node_conns(control_t *ctl, const route_t *rt, bool create)
{
    node_conns_t *free_slot = NULL;
    for (size_t i = 0; i < CTL_POOL_NODES; i++) {
        node_conns_t *p = &ctl->conns[i];
        if (p->node[0] && streq(p->node, rt->run.node) && streq(p->host, rt->host) &&
            p->port == rt->port)
            return p;
        if (!free_slot && (!p->node[0] || p->n == 0))
            free_slot = p;
    }
    if (!create || !free_slot)
        return NULL;
    node_conns_t *p = free_slot;
    p->n = 0;
    (void)snprintf(p->node, sizeof p->node, "%s", rt->run.node);
    (void)snprintf(p->host, sizeof p->host, "%s", rt->host);
    p->port = rt->port;
    return p;
}

/* A kept connection to the route's node that is still open and fresh, or NULL. */
static relay_conn_t *conns_take(control_t *ctl, const route_t *rt)
{
    node_conns_t *p = node_conns(ctl, rt, false);
    uint64_t now = loop_now_ms(ctl->srv.loop);
    while (p && p->n > 0) {
        relay_conn_t *k = p->c[--p->n]; /* the most recent first */
        /* closed, or bytes nobody asked for (an alert): not for a request */
        if (k->since_ms + EDGE_KEEP_MS > now && relay_conn_fit(k))
            return k;
        relay_conn_close(k);
    }
    return NULL;
}

/* k (parked by its relay) goes back to its node's pool. */
static void conns_put(control_t *ctl, const route_t *rt, relay_conn_t *k)
{
    node_conns_t *p = node_conns(ctl, rt, true);
    if (!p) {
        relay_conn_close(k);
        return;
    }
    if (p->n == CTL_POOL_CONNS) { /* full: the oldest goes */
        relay_conn_close(p->c[0]);
        memmove(&p->c[0], &p->c[1], sizeof p->c[0] * (CTL_POOL_CONNS - 1));
        p->n--;
    }
    p->c[p->n++] = k;
}

void edge_conns_sweep(control_t *ctl, bool all)
{
    uint64_t now = ctl->srv.loop ? loop_now_ms(ctl->srv.loop) : 0;
    for (size_t i = 0; i < CTL_POOL_NODES; i++) {
        node_conns_t *p = &ctl->conns[i];
        int keep = 0;
        for (int k = 0; k < p->n; k++) {
            if (!all && !p->c[k]->broken && p->c[k]->since_ms + EDGE_KEEP_MS > now)
                p->c[keep++] = p->c[k];
            else
                relay_conn_close(p->c[k]);
        }
        p->n = keep;
    }
}

typedef struct {
    control_t *ctl;
    route_t route;
} kept_t;

static void edge_relay_done(relay_t *rl, void *data, relay_conn_t *conn, bool ok)
{
    kept_t *k = data;
    (void)rl;
    (void)ok;
    if (conn)
        conns_put(k->ctl, &k->route, conn);
    free(k);
}

static void start_attempt(edge_t *e)
{
    loop_t *l = e->ctl->srv.loop;
    int r = build_request(e);
    if (r < 0) {
        edge_fail(e, r == -ENOKEY ? HTTP_UNAVAILABLE : HTTP_INTERNAL_ERROR,
                  "edge: cannot build the request: %s", strerror(-r));
        return;
    }
    relay_conn_close(TAKE_PTR(e->k)); /* a retry: the refused connection goes */
    relay_conn_t *k = e->keep ? conns_take(e->ctl, &e->route) : NULL;
    e->reused = k != NULL;
    if (!k) {
        int fd;
        r = connect_node(&e->route, &fd);
        if (r < 0) {
            edge_fail(e, HTTP_BAD_GATEWAY, "edge: cannot connect to the node: %s", strerror(-r));
            return;
        }
        k = relay_conn_new(l, fd, NULL);
        if (!k) {
            edge_fail(e, HTTP_INTERNAL_ERROR, "edge: %s", strerror(ENOMEM));
            return;
        }
    }
    k->w.cb = edge_on_event; /* a kept connection stays registered: no system call */
    k->w.data = e;
    e->k = k;
    e->st = e->reused ? E_SENDING : E_CONNECTING; /* a kept connection is ready */
    e->sent_any = false;
    buf_clear(&e->in);
    if (timer_arm(l, &e->deadline, EDGE_CONNECT_TIMEOUT_MS) < 0) {
        edge_fail(e, HTTP_INTERNAL_ERROR, "edge: %s", "cannot watch the node connection");
        return;
    }
    if (e->reused) { /* it has room for the request: sent now, not after a wake-up */
        on_writable(e);
        return;
    }
    if (loop_watch(l, &k->w, EPOLLOUT) < 0)
        edge_fail(e, HTTP_INTERNAL_ERROR, "edge: %s", "cannot watch the node connection");
}

/* Hand the client socket to a tunnel with the node (what the node already answered goes
 * first), or, for a request known in full, the answer to a relay that keeps both connections. */
static void commit(edge_t *e)
{
    conn_t *c = e->conn;
    relay_conn_t *conn = TAKE_PTR(e->k);
    buf_t up = e->out, down = e->in;
    buf_init(&e->out, 0);
    buf_init(&e->in, 0);
    kept_t *k = e->keep && up.len == 0 ? malloc(sizeof *k) : NULL;
    if (k)
        *k = (kept_t){ .ctl = e->ctl, .route = e->route };
    edge_release(e); /* detaches from c */
    if (k) {         /* the relay takes the connection as it is registered */
        (void)proxy_relay_start(c, conn, &up, &down, NULL, edge_relay_done, k);
        return;
    }
    int fd;
    sockio_t *io;
    relay_conn_detach(conn, &fd, &io);
    (void)proxy_tunnel_start(c, fd, io, &up, &down, NULL, NULL, NULL);
    buf_free(&up);
    buf_free(&down);
}

/* Look the route up again; true (with *fresh) when the store names another run than rejected.
 * When the job has no running run any more, *state says what it has (RR_NONE if nothing). */
static bool refresh(edge_t *e, const route_t *rejected, route_t *fresh, runrec_state_t *state)
{
    route_t rt;
    if (route_from_store(e->ctl, e->ns, e->job, &rt, state) < 0) {
        routecache_drop(&e->ctl->routes, e->key, rejected);
        return false;
    }
    *state = RR_NONE;
    if (cap_run_equal(&rt.run, &rejected->run) && streq(rt.host, rejected->host) &&
        rt.port == rejected->port)
        return false;
    /* CAS: a late refusal of an old route never evicts a newer entry; expiry is kept. */
    if (!routecache_replace(&e->ctl->routes, rejected, &rt, loop_now_ms(e->ctl->srv.loop)))
        log_debug("edge: route of %s already repaired", e->key);
    *fresh = rt;
    return true;
}

static void transport_failed(edge_t *e, int err)
{
    route_t fresh;
    /* A retry only where nothing reached the node (no connection, or a TLS peer that was not
     * the node): once request bytes were sent, the request may have run, whatever its method,
     * and the client hears exactly that. */
    if (!e->retried && e->replayable && !e->sent_any) {
        route_t rejected = e->route;
        runrec_state_t state;
        if (refresh(e, &rejected, &fresh, &state))
            e->route = fresh;
        else
            routecache_drop(&e->ctl->routes, e->key, &rejected);
        if (e->pinned && e->route.run.generation != e->pin_gen) {
            edge_gone(e, e->route.run.generation);
            return;
        }
        e->retried = true;
        log_debug("edge: %s: %s before sending, retrying once", e->key, strerror(-err));
        start_attempt(e);
        return;
    }
    routecache_drop(&e->ctl->routes, e->key, &e->route);
    if (err == -EPERM || err == -ENOKEY)
        edge_fail(e, HTTP_BAD_GATEWAY,
                  "edge: node %s did not prove its registered TLS identity; nothing was "
                  "sent to it",
                  e->route.run.node);
    else if (e->sent_any)
        edge_fail_sent(e,
                       "edge: the connection to the node broke after the request was sent "
                       "(%s): it may have run; not retried",
                       strerror(-err));
    else
        edge_fail(e, HTTP_BAD_GATEWAY, "edge: the node did not answer: %s; nothing was sent",
                  strerror(-err));
}

/* The node's answer head is complete: RefreshRoute -> one retry; anything else -> commit. */
/* Whether the answer head (p, n bytes, up to its blank line) has header `name` (any case) with
 * exactly `value` (surrounding blanks ignored). */
static bool head_has(const char *p, size_t n, const char *name, const char *value)
{
    const char *end = p + n, *line = memmem(p, n, "\r\n", 2);
    while (line && (line += 2) < end) {
        const char *eol = memmem(line, (size_t)(end - line), "\r\n", 2);
        if (!eol || eol == line)
            return false;
        const char *colon = memchr(line, ':', (size_t)(eol - line));
        if (colon && sv_eq_lit_nocase(sv_make(line, (size_t)(colon - line)), name)) {
            const char *v = colon + 1, *ve = eol;
            while (v < ve && (*v == ' ' || *v == '\t'))
                v++;
            while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
                ve--;
            if ((size_t)(ve - v) == strlen(value) && memcmp(v, value, strlen(value)) == 0)
                return true;
        }
        line = eol;
    }
    return false;
}

static void answered(edge_t *e)
{
    const char *p = buf_head(&e->in);
    relay_head_t h;
    ssize_t hl = relay_parse_head(p, e->in.len, &h);
    /* a node's route verdict: 409 with X-Sbx-Verdict: RefreshRoute (docs/capabilities.md);
     * never the run's: the node drops X-Sbx-* headers from what the run answers */
    bool refresh_route = hl > 0 && h.status == HTTP_CONFLICT &&
                         head_has(p, (size_t)hl, "x-sbx-verdict", "RefreshRoute");
    if (refresh_route && !e->retried) {
        route_t fresh, rejected = e->route;
        runrec_state_t state;
        bool again = refresh(e, &rejected, &fresh, &state);
        if (!again && state != RR_NONE) { /* the job stopped serving: say so, not the node's */
            edge_fail(e, HTTP_CONFLICT, "the sandbox is not running (run %s)",
                      runrec_state_to_string(state));
            return;
        }
        if (again && e->pinned && fresh.run.generation != e->pin_gen) {
            edge_gone(e, fresh.run.generation);
            return;
        }
        if (again) {
            e->retried = true;
            e->route = fresh;
            log_info("edge: %s: node refused run generation %llu (RefreshRoute); retrying on "
                     "generation %llu at %s",
                     e->key, (unsigned long long)rejected.run.generation,
                     (unsigned long long)fresh.run.generation, fresh.run.node);
            start_attempt(e);
            return;
        }
    }
    commit(e);
}

static void on_readable(edge_t *e)
{
    for (;;) {
        char *space;
        if (buf_reserve(&e->in, 16384, &space) < 0) {
            commit(e); /* a huge head: not a refusal, pass it through */
            return;
        }
        ssize_t n = sock_recv(e->k->w.fd, e->k->io, space, 16384);
        if (n == -EAGAIN) {
            if (e->k->io) /* a layer that must write to read on */
                (void)loop_watch(e->ctl->srv.loop, &e->k->w,
                                 e->k->io->want_write ? EPOLLOUT : EPOLLIN);
            return;
        }
        if (n <= 0) {
            if (e->in.len > 0)
                commit(e); /* whatever the node said before closing */
            else
                transport_failed(e, n < 0 ? (int)n : -ECONNRESET);
            return;
        }
        buf_commit(&e->in, (size_t)n);
        if (memmem(buf_head(&e->in), e->in.len, "\r\n\r\n", 4)) {
            answered(e);
            return;
        }
        if (e->in.len >= EDGE_HEAD_MAX) {
            commit(e);
            return;
        }
    }
}

static void on_writable(edge_t *e)
{
    loop_t *l = e->ctl->srv.loop;
    if (e->st == E_CONNECTING) {
        int err = 0;
        socklen_t sl = sizeof err;
        if (getsockopt(e->k->w.fd, SOL_SOCKET, SO_ERROR, &err, &sl) < 0)
            err = errno;
        if (err) {
            transport_failed(e, -err);
            return;
        }
        e->st = E_HANDSHAKE;
        if (e->ctl->tls_client) {
            uint8_t pin[TLS_PIN_BYTES];
            if (edge_node_pin(e->ctl, e->route.run.node, pin) < 0) {
                transport_failed(e, -ENOKEY);
                return;
            }
            e->k->io = tls_connect(e->ctl->tls_client, e->k->w.fd, e->route.host, NULL, pin);
            if (!e->k->io) {
                transport_failed(e, -ENOMEM);
                return;
            }
        }
    }
    if (e->st == E_HANDSHAKE) {
        /* TLS: the node proves its registered key before it sees the capability */
        sockio_t *io = e->k->io;
        int r = io ? io->ops->handshake(io) : 0;
        if (r == -EAGAIN) {
            (void)loop_watch(l, &e->k->w, io->want_write ? EPOLLOUT : EPOLLIN);
            return;
        }
        if (r < 0) {
            log_warn("edge: %s: TLS with node %s at %s failed: %s", e->key, e->route.run.node,
                     e->route.host, tls_last_error());
            edge_node_pin_forget(e->ctl, e->route.run.node);
            transport_failed(e, r);
            return;
        }
        e->st = E_SENDING;
        if (!e->replayable) { /* streamed: the tunnel sends head and body */
            commit(e);
            return;
        }
    }
    while (e->out.len > 0) {
        ssize_t n = sock_send(e->k->w.fd, e->k->io, buf_head(&e->out), e->out.len);
        if (n == -EAGAIN) { /* a kept connection is watched for input only: ask for room */
            (void)loop_watch(l, &e->k->w, e->k->io && !e->k->io->want_write ? EPOLLIN : EPOLLOUT);
            return;
        }
        if (n < 0) {
            transport_failed(e, (int)n);
            return;
        }
        e->sent_any = true;
        buf_consume(&e->out, (size_t)n);
    }
    e->st = E_READING;
    (void)loop_watch(l, &e->k->w, EPOLLIN); /* a kept connection has it: no system call */
    (void)timer_arm(l, &e->deadline, EDGE_ANSWER_TIMEOUT_MS);
}

static void edge_on_event(loop_t *l, watcher_t *w, uint32_t ev)
{
    edge_t *e = w->data;
    (void)l;
    if (!e->conn)
        return;
    (void)ev; /* SO_ERROR, the layer or the read tells what happened */
    if (e->st == E_READING)
        on_readable(e);
    else
        on_writable(e);
}

static void edge_on_timeout(loop_t *l, timer_t_ *t)
{
    edge_t *e = t->data;
    (void)l;
    if (e->st == E_CONNECTING || e->st == E_HANDSHAKE) /* nothing was sent */
        transport_failed(e, -ETIMEDOUT);
    else
        edge_fail(e, HTTP_GATEWAY_TIMEOUT, "edge: %s",
                  "the node did not answer in time: the request may have run");
}

static void edge_begin(conn_t *c)
{
    edge_t *e = c->hdata;
    start_attempt(e);
}

void edge_proxy(control_t *ctl, conn_t *c, const char *ns, const char *job, uint16_t port,
                sv_t rest, const edge_pin_t *pin)
{
    http_request_t *rq = &c->req;
    edge_t *e = calloc(1, sizeof *e);
    const char *q = memchr(rq->target.p, '?', rq->target.len);
    sv_t query = q ? sv_make(q, rq->target.len - (size_t)(q - rq->target.p)) : SV("");
    if (!e || asprintf(&e->rest, SV_FMT SV_FMT, SV_ARG(rest), SV_ARG(query)) < 0) {
        free(e);
        http_errno(c, 0, -ENOMEM, "edge");
        return;
    }
    e->ctl = ctl;
    e->port = port;
    (void)snprintf(e->ns, sizeof e->ns, "%s", ns);
    (void)snprintf(e->job, sizeof e->job, "%s", job);
    (void)snprintf(e->key, sizeof e->key, "%s/%s", ns, job);
    timer_init(&e->deadline, edge_on_timeout, e);
    buf_init(&e->in, EDGE_HEAD_MAX + 16384);
    if (pin) {
        e->pinned = true;
        e->pin_gen = pin->generation;
        (void)snprintf(e->sandbox, sizeof e->sandbox, "%s", pin->sandbox);
        if (pin->token) /* (none: the request carries its own proof, e.g. a presigned URL's) */
            (void)snprintf(e->token_hdr, sizeof e->token_hdr, "X-Sandbox-Token: %s\r\n",
                           pin->token);
    }
    uint64_t now = loop_now_ms(ctl->srv.loop);
    bool cached = routecache_get(&ctl->routes, e->key, now, &e->route);
    if (cached && pin && e->route.run.generation != pin->generation)
        cached = false; /* the store decides whether the sandbox's run is still the one */
    if (!cached) {
        runrec_state_t state;
        int r = route_from_store(ctl, ns, job, &e->route, &state);
        if (r == -EAGAIN) {
            edge_free(e);
            if (state == RR_INSTALLING)
                http_unavailable(c, HTTP_RETRY_SOON, "the sandbox is starting");
            else
                http_conflict(c, 0, "the sandbox is not running (run %s)",
                              runrec_state_to_string(state));
            return;
        }
        if (r < 0) { /* -ENOENT: 404; the store cannot be read: not an answer about the job */
            edge_free(e);
            respond_store_err(c, r, "edge", "no running job %s in namespace %s", job, ns);
            return;
        }
        (void)routecache_put(&ctl->routes, &e->route, now, CTL_ROUTE_TTL_MS);
    }
    if (pin && e->route.run.generation != pin->generation) {
        e->conn = c;
        edge_gone(e, e->route.run.generation);
        return;
    }
    e->conn = c;
    conn_set_handler(c, &edge_ops, e);
    e->replayable = !rq->has_transfer_encoding && rq->content_length <= CTL_RETRY_BODY_MAX;
    sv_t up;
    e->keep = e->replayable && !http_header_get(rq, "upgrade", &up);
    if (e->replayable && rq->content_length > 0)
        conn_collect_body(c, CTL_RETRY_BODY_MAX, edge_begin);
    else
        start_attempt(e);
}
