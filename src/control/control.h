/* SPDX-License-Identifier: MIT */
/* sbx-control: principals and tokens, the Jobs API, placement onto nodes, run records (every
 * change a compare-and-swap in the store), capability signing, lifecycle (pause, resume, move),
 * and the edge proxy that routes /v1/jobs/{ns}/{job}/proxy/{port}/... to the run's node.
 *
 * Threads: the HTTP loop (API + edge proxy) and the reconciler (talks to nodes with blocking
 * calls). Each has its own store handle; they share only the wake-up flag. */
#pragma once

#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "cap/cap.h"
#include "common/err.h"
#include "common/httpc.h"
#include "http/httpd.h"
#include "http/relay.h"
#include "routecache.h"
#include "seal.h"
#include "states.h"
#include "store/store.h"
#include "tls/tls.h"

#define CTL_KEYS_MAX 8
/* The E2B API's namespace for keys of every namespace ("*"): no token may be made for it, and
 * only principals of every namespace reach it (auth.c). */
#define CONTROL_RESERVED_NS "e2b"
#define CTL_NODE_LIVE_MS 5000        /* a node not heard from for this long gets no new runs */
#define CTL_ROUTE_TTL_MS 30000       /* edge route cache entries live this long */
#define CTL_RETRY_BODY_MAX (1 << 20) /* request bodies up to this size are replayable */
#define CTL_INSTALL_STALE_MS 60000   /* an "installing" record older than this is retried */

typedef enum { ROLE_NONE = 0, ROLE_READ = 1, ROLE_WRITE = 2, ROLE_ADMIN = 3 } role_t;

typedef struct {
    char principal[64];
    char ns[64]; /* "*" = every namespace */
    role_t role;
} principal_t;

/* The run record (store key runs/<job id>). */
typedef struct {
    cap_run_t run;
    runrec_state_t state; /* states.h: changed only through runrec_set_state */
    char host[64];        /* the node's address */
    uint16_t port;
    /* a run to retire on another node once this one runs (a move) */
    bool has_prev;
    cap_run_t prev;
    char prev_host[64];
    uint16_t prev_port;
    int attempts;
    int64_t updated_ms;
    char ns[64];
    /* the root this generation starts from (a paused run), kept across retries of its install
     * so that a retry never starts on an empty root */
    bool has_from;
    cap_run_t from;
    char from_host[64];
    uint16_t from_port;
    int64_t next_try_ms;   /* a failed install is tried again from then on (backoff) */
    char owner[24];        /* "installing": the control process installing it (its instance) */
    int64_t first_fail_ms; /* since when this generation's install fails */
} runrec_t;

typedef struct {
    char state_dir[PATH_MAX];
    char admin_token_file[PATH_MAX];
    uint64_t publish_delay_ms; /* a new signing key is published this long before use */
    uint64_t node_dead_ms;     /* a node silent this long has lost its runs (on_node_loss) */
    char default_image[64];    /* a job that names no image runs this one */
    /* transport: TLS unless plain_http (loopback only); the CA and the control plane's key and
     * certificate live in tls_dir (default <state>/tls) */
    bool plain_http;
    char tls_dir[PATH_MAX];
    char listen_ip[64];
    char tls_sans[8][64]; /* more addresses and names for the control plane's certificate */
    int n_tls_sans;
    char secrets_key_file[PATH_MAX];  /* "" = <state_dir>/secrets.key (seal.h) */
    uint64_t max_conns_per_principal; /* connections one principal holds at once (0: no cap) */
    char e2b_domain[128];             /* E2B's sandbox domain: hosts <port>-<id>.<domain> (e2b.c) */
    uint16_t e2b_ports[15]; /* the ports of an E2B sandbox reached through the edge, besides */
    int n_e2b_ports;        /* the agent's (--e2b-ports) */
} control_config_t;

typedef struct {
    cap_keyrec_t recs[CTL_KEYS_MAX];
    size_t n;
} keyring_t;

/* Recently verified API tokens (by hash), so that the edge proxy does not read the store for
 * every request. An entry lives CTL_TOKEN_CACHE_MS: a token revoked on any control process
 * (DELETE /v1/tokens/{id}) is refused by every other one within that time. */
#define CTL_TOKEN_CACHE_SLOTS 256
#define CTL_TOKEN_CACHE_MS 800
typedef struct {
    char hash[65];
    principal_t p;
    uint64_t expires_ms;
} token_cache_t;

/* Connections to nodes kept for the next request (edge.c), per node. */
#define CTL_POOL_NODES 32
#define CTL_POOL_CONNS 16
/* Idle kept-alive connections of node_request (workers and reconciler, all nodes together). */
#define CTL_NODE_CALLS_IDLE 64
typedef struct {
    char node[CAP_ID_MAX];
    char host[64];
    uint16_t port;
    int n;
    relay_conn_t *c[CTL_POOL_CONNS]; /* parked (relay.h): still registered with the loop */
} node_conns_t;

/* A control process whose record (controls/<instance>) is older than this is gone: what it was
 * installing is taken over. */
#define CTL_ALIVE_MS 3000

typedef struct work_queue work_queue_t;

typedef struct control {
    httpd_t srv;
    char instance[24];                     /* this process, random per start ("c-" + 16 hex) */
    cap_identity_t identity;               /* the long-term identity nodes pin at join */
    char keyset_wire[CAP_KEYSET_WIRE_MAX]; /* the current key set, signed by identity */
    uint64_t keyset_version;
    token_cache_t tokens[CTL_TOKEN_CACHE_SLOTS];
    control_config_t cfg;
    store_t *store; /* the loop thread's handle */
    routecache_t routes;
    keyring_t keys;
    cap_signcache_t edge_caps; /* what the edge signed, by request shape (the loop's) */
    seal_keys_t seal;          /* the secrets key(s): read-only after control_init */
    timer_t_ keys_t;
    climit_tab_t *principals; /* connections per principal (auth_account) */
    /* TLS (NULL when plain): what the listener serves, how nodes are checked, the CA's pin */
    tls_ctx_t *tls_server, *tls_client;
    char ca_pin_b64[48];
    struct {
        char node[CAP_ID_MAX];
        uint8_t pin[TLS_PIN_BYTES];
        uint64_t at_ms;
    } pins[32]; /* the edge's cache of registered node key pins (the loop thread's) */
    node_conns_t conns[CTL_POOL_NODES]; /* the edge's idle connections to nodes */
    work_queue_t *work;                 /* worker threads for pool calls (work.c) */
    httpc_pool_t *node_calls;           /* kept-alive connections of node_request (all threads) */
    /* reconciler */
    pthread_t rec_thread;
    bool rec_started;
    pthread_mutex_t rec_lock;
    pthread_cond_t rec_cond;
    bool rec_dirty, stopping;
} control_t;

/* control.c */
int control_init(control_t *ctl, const control_config_t *cfg, const httpd_config_t *scfg);
int control_run(control_t *ctl);
void control_done(control_t *ctl);
void control_kick(control_t *ctl); /* wake the reconciler */
int64_t wall_ms(void);

/* Route helpers: split a path into up to n '/'-separated views (the count); copy a view into a
 * NUL-terminated buffer (false when empty, too long or holding a NUL). */
size_t path_split(sv_t s, sv_t *seg, size_t n);
bool sv_copy(sv_t v, char *out, size_t cap);
/* A handler whose only state is a malloc'd c->hdata, freed when the connection goes. */
extern const handler_ops_t ctl_hdata_free_ops;

/* auth.c: tokens, principals, bootstrap */
int auth_bootstrap(control_t *ctl);
/* Check the bearer token of c for `need` on namespace ns ("" = any). Answers 401/403 itself
 * and returns false when refused. */
bool auth_check(control_t *ctl, conn_t *c, const char *ns, role_t need, principal_t *ret);
/* Count c as owner's connection ("node:<name>" for nodes, else a principal's name) and mark it
 * authenticated; over cfg.max_conns_per_principal answers 429 itself and returns false. */
bool auth_account(control_t *ctl, conn_t *c, const char *owner);
void auth_token_hash(const char *token, char out[65]);
/* The principal of an API token (remembered CTL_TOKEN_CACHE_MS): 0, -ENOENT (unknown token),
 * -EBADMSG (a corrupt record), or another -errno (the store). Answers nothing. */
int auth_token_lookup(control_t *ctl, const char *tok, principal_t *ret);
int random_hex(char *out, size_t nbytes); /* 2*nbytes hex chars + NUL */
void route_tokens_create(control_t *ctl, conn_t *c);
void route_tokens_list(control_t *ctl, conn_t *c);
void route_tokens_delete(control_t *ctl, conn_t *c, sv_t id); /* id: t-<16 hex> */

/* keys.c: signing keys in the store, rotation */
/* keys_load re-seals a record that is plaintext (written before secrets at rest) or sealed under
 * an older secrets key; -EBADMSG (logged, *kr untouched) when a record cannot be opened. */
int keys_load(store_t *st, const seal_keys_t *seal, keyring_t *kr);
int keys_ensure(store_t *st, const seal_keys_t *seal, uint64_t publish_delay_ms);
int keys_rotate(store_t *st, const seal_keys_t *seal, uint64_t publish_delay_ms);
/* The identity key in <state>/identity.key (made, 0600, when absent). */
int identity_load_or_create(const char *state_dir, cap_identity_t *ret);
int identity_pk_b64(const cap_identity_t *id, char *out, size_t cap);
/* The verification key set at now_s, signed by id with its version (meta/keyset in the store,
 * bumped when the set changes). Returns the wire length or -errno. */
int keys_signed_set(store_t *st, const keyring_t *kr, const cap_identity_t *id, int64_t now_s,
                    char *out, size_t cap, uint64_t *ret_version);
/* Sign c with the current signer (c->iat/exp set here: now, now + CAP_LIFETIME_S). */
int keys_sign(const keyring_t *kr, cap_t *c, char *out, size_t cap);
/* The same, but the wire form signed for the same request shape by the same key in the last
 * CAP_REUSE_S seconds is sent again (cap_sign_reuse; never for a manage capability). */
int keys_sign_reuse(const keyring_t *kr, cap_signcache_t *sc, cap_t *c, char *out, size_t cap);

/* records.c: JSON <-> records */
/* Whether control process `instance` has written its record within CTL_ALIVE_MS. */
bool control_alive(store_t *st, const char *instance);
/* Whether control process `instance` is known gone: its record absent or stale (a store error
 * is no proof: false). */
bool control_gone(store_t *st, const char *instance);
int control_heartbeat(store_t *st, const char *instance);
/* Move r to state `to` if states.h allows it; -EINVAL (logged, r unchanged) if not. */
int runrec_set_state(runrec_t *r, runrec_state_t to);
int runrec_load(store_t *st, const char *job, runrec_t *ret, int64_t *ret_rev);
int runrec_cas(store_t *st, const char *job, const runrec_t *r, int64_t expect, int64_t *ret_rev);
/* A JSON object record: 0, -ENOENT, -EBADMSG (not an object), another -errno (the store; *ret
 * is NULL on every failure); and
 * written by compare-and-swap against expect (STORE_REV_ABSENT: create only). */
int record_load(store_t *st, const char *key, json_t **ret, int64_t *ret_rev);
int record_save(store_t *st, const char *key, json_t *j, int64_t expect, int64_t *ret_rev);
/* The one table of store errors to statuses: -ENOENT 404, -ESTALE 409, -EBADMSG 500 (a record
 * that cannot be read), anything else 503 (the store failed: no answer about the record). */
int status_from_store_err(int r);
/* Answer a store error by that table: 404 with the caller's message, or the 5xx/409 (a 503 with
 * Retry-After: 1), logged with `what`. */
void respond_store_err(conn_t *c, int r, const char *what, const char *fmt, ...) _printf_(4, 5);
int job_load(store_t *st, const char *ns, const char *id, json_t **ret, int64_t *ret_rev);
/* Ask for a job's end (desired canceled) by compare-and-swap: 0 (asked, or ended or asked
 * already), -ENOENT, -EBUSY (too much contention), another -errno. */
int job_cancel(store_t *st, const char *ns, const char *id);
int job_save(store_t *st, const char *ns, const char *id, json_t *job, int64_t expect,
             int64_t *ret_rev);
bool valid_name(const char *s, size_t max);
/* A job record's stage and desired state (-EINVAL when missing or not one of states.h's), and
 * setting them (the one place their spelling is written). */
int job_stage_of(json_t *job, job_stage_t *ret);
int job_desired_of(json_t *job, job_desired_t *ret);
void job_set_stage(json_t *job, job_stage_t s);
void job_set_desired(json_t *job,
                     job_desired_t d); /* [a-z0-9][a-z0-9._-]* namespaces, label keys */

/* jobs.c */
void route_jobs(control_t *ctl, conn_t *c, sv_t rest);
/* Validate a create request (the Jobs API's body) and split it into the job record and its
 * secrets; -EINVAL (err: what is wrong, for a 400) or -ENOMEM. */
int job_from_request(json_t *b, const char *default_image, json_t **ret_job, json_t **ret_secrets,
                     sbx_err_t *err);
/* Store a new job (stage SCHEDULING) with id and its secrets; -EEXIST/-ESTALE if id is taken. */
int job_insert(store_t *st, const seal_keys_t *seal, const char *ns, const char *initiator,
               const char *id, json_t *job, json_t *sec);
/* NULL when o (may be NULL) is an environment object (names [A-Za-z_][A-Za-z0-9_]*, string
 * values, not the platform's SBX_LISTEN/SBX_HOST_MODE); else `what`. */
const char *check_env(json_t *o, const char *what);
/* A JSON object sealed under the secrets key at key (AD: the key), by compare-and-swap against
 * expect; and opened again (re-sealed when under an older key). Keys under secrets/ are
 * re-sealed by a key rotation. */
int sealed_put(store_t *st, const seal_keys_t *seal, const char *key, json_t *obj, int64_t expect);
int sealed_get(store_t *st, const seal_keys_t *seal, const char *key, json_t **ret);
/* A job's secrets (secrets/<id>), sealed. job_secrets_get accepts a plaintext record (written
 * before secrets at rest) or one sealed under an older secrets key and re-seals it. -EBADMSG /
 * -ENOKEY when it cannot be opened (nothing is returned then). */
int job_secrets_put(store_t *st, const seal_keys_t *seal, const char *id, json_t *secrets);
int job_secrets_get(store_t *st, const seal_keys_t *seal, const char *id, json_t **ret);
/* Re-seal every job's secrets not sealed under the current key; *ret_bad: records that could not
 * be opened (logged). */
int job_secrets_reseal_all(store_t *st, const seal_keys_t *seal, size_t *ret_bad);

/* atrest.c: the secrets key file of a control (config), rotation */
int secrets_key_path(const control_config_t *cfg, char *out, size_t cap);
/* Load or make the key file; logs why it is refused. */
int secrets_keys_open(const control_config_t *cfg, seal_keys_t *ret);
/* At start: re-seal values left in plaintext by an older version, or under an older secrets key
 * (an interrupted rotation), then compact the store so that their old bytes are gone.
 * -EBADMSG when a signing key cannot be opened. */
int secrets_migrate(store_t *st, const seal_keys_t *seal);
/* sbx-control --rotate-secrets-key: a new current key, every sealed value re-sealed under it,
 * then the old keys dropped from the file (kept there until every value is re-sealed). */
int secrets_rotate(const control_config_t *cfg);

/* nodes.c */
void route_nodes(control_t *ctl, conn_t *c, sv_t rest);
/* Whether a live node reports image `name` ("host" is every node's). */
/* Whether a live node offers the image; *ret_size (may be NULL): its unpacked size in bytes
 * (the largest any node reports; 0 for "host"). */
bool image_on_live_node(store_t *st, const char *name, uint64_t *ret_size);
/* Whether a node record's "images" ([{name, digest, size}]) holds `name` ("host": yes). */
bool node_rec_has_image(json_t *rec, const char *name);

/* The registered key pin of node `name` (its record's tls_pin): 0, or -ENOENT. */
int node_pin_load(store_t *st, const char *name, uint8_t pin[TLS_PIN_BYTES]);

/* edge.c */
/* The role a request through the edge needs on its namespace: read for reading files (GET/HEAD
 * of the agent's /v1/files...) and GET/HEAD of the agent's other routes that are no exec, file
 * or process route (health, listings on pool hosts); write for everything else: exec, process
 * control, file writes, any method to any other port of the run. */
role_t edge_role_needed(sv_t method, uint16_t port, sv_t path);
/* Close idle node connections older than their keep time (every second), or all. */
void edge_conns_sweep(control_t *ctl, bool all);
/* A sandbox the edge pins a request to: the generation of its (host's) run it lives in, its id,
 * and the token the edge hands its agent (the client never sends it; NULL: none is added, the
 * request carries its own proof for the agent, as a presigned URL does). */
typedef struct {
    uint64_t generation;
    const char *sandbox;
    const char *token;
} edge_pin_t;
/* Proxy c to port of job's run (rest: the path below it, plus the query). pin: NULL for a job's
 * own ports; for a pooled sandbox, what binds the request to it (410 when its run is gone). */
void edge_proxy(control_t *ctl, conn_t *c, const char *ns, const char *job, uint16_t port,
                sv_t rest, const edge_pin_t *pin);

/* nodecall.c: blocking calls to one run on its node (reconciler and pool threads) */
typedef struct {
    const char *host; /* the node's address and port */
    uint16_t port;
    const cap_run_t *run; /* the run the capability names */
    uint32_t access;      /* its purpose (CAP_MANAGE, CAP_EXEC, ...) */
    uint16_t cap_port;    /* CAP_PROXY: the port and protocol */
    cap_proto_t proto;
    const char *method, *target; /* target: /v1/runs/{job}... as the node receives it */
    const char *headers;         /* extra header lines ("Name: value\r\n"), or NULL */
    const char *body;
    size_t body_len;
    bool bind_body;      /* the capability names the body's digest */
    uint64_t timeout_ms; /* 0: httpc's default */
    size_t body_max;     /* 0: httpc's default */
} node_req_t;
/* One exchange; 0 with *resp (any status), or -errno with err (may be NULL) saying why nothing
 * came back. */
int node_request(control_t *ctl, store_t *st, const keyring_t *kr, const node_req_t *q,
                 httpc_response_t *resp, sbx_err_t *err);
/* A request to the agent of run rr (its port 49983) through its node: path as the agent sees it
 * ("/v1/sandboxes"), token its X-Sandbox-Token (may be NULL), body JSON (may be NULL). 0 with
 * *ret_status and *ret_json (may be NULL; the parsed answer or NULL), and for a status >= 300 err
 * says so (err->code -EIO, though 0 is returned); -errno when no answer came (err says why). */
int agent_call(control_t *ctl, store_t *st, const keyring_t *kr, const runrec_t *rr,
               const char *method, const char *path, const char *token, json_t *body,
               uint64_t timeout_ms, int *ret_status, json_t **ret_json, sbx_err_t *err);

/* work.c: API calls that wait on nodes run on worker threads; the answer returns to the loop */
typedef struct {
    control_t *ctl;
    store_t *st; /* this worker's own handle */
    keyring_t kr;
    uint64_t kr_ms;
} worker_t;
typedef struct {
    int status;
    json_t *json;      /* the answer's body */
    char headers[128]; /* extra header lines, or "" */
    /* A task that waits for something (a sandbox to start) does not sleep on its worker: it
     * sets again_ms, and fn(arg) runs again that much later, on any worker, with no answer
     * given yet. client_gone: the client left (set before each run). */
    unsigned again_ms;
    bool client_gone;
} work_result_t;
typedef struct work_task work_task_t;
typedef void (*work_fn)(worker_t *w, void *arg, work_result_t *res);
int work_start(control_t *ctl);
void work_stop(control_t *ctl);
/* Run fn(arg) on a worker and answer c with its result; free_arg(arg) afterwards in any case.
 * owner: whose task it is (a namespace): one owner has at most WORK_PER_OWNER_MAX tasks at
 * once (429 beyond), all owners WORK_QUEUE_MAX (503 beyond); flags: those refusals' body shape
 * (HTTP_BODY_CODE for E2B's). */
#define WORK_PER_OWNER_MAX 32
void work_submit(control_t *ctl, conn_t *c, const char *owner, unsigned flags, work_fn fn,
                 void *arg, void (*free_arg)(void *));
void work_answer(work_result_t *res, int status, json_t *j); /* steals j; NULL with 204 */
/* An error answer (http_error_vjson(): flags HTTP_BODY_CODE for E2B's body shape). */
void work_fail(work_result_t *res, int status, unsigned flags, const char *fmt, ...) _printf_(4, 5);
/* The worker's signing keys, loaded again when older than a second. */
int worker_keys(worker_t *w);

/* e2b.c: E2B's control API; false when the path is none of its routes */
bool e2b_route(control_t *ctl, conn_t *c);
/* e2bproxy.c: a request addressed to a sandbox the way E2B's SDKs do (E2b-Sandbox-Id header,
 * or Host <port>-<id>.<domain>) is answered or proxied: true; anything else: false. */
bool e2b_traffic_route(control_t *ctl, conn_t *c);
/* Whether a job record is one of E2B's sandboxes (made through E2B's control API). */
bool e2b_job(json_t *job);

/* pools.c */
void route_pools(control_t *ctl, conn_t *c, sv_t rest); /* rest: after /v1/pools/ */
/* The reconciler's pass over pools: hosts follow their jobs, warm hosts, idle hosts, drains.
 * ps: when each ready host was last compared with its agent (the reconciler's, zeroed at start). */
typedef struct {
    struct {
        char job[32];
        int64_t ms;
    } at[256];
    struct { /* sandboxes seen on an agent without a record, since when (this clock) */
        char id[17];
        int64_t since_ms;
    } orphans[256];
    int64_t orphans_swept_ms;
} pool_syncs_t;
void pools_pass(control_t *ctl, store_t *st, const keyring_t *kr, pool_syncs_t *ps);

/* reconcile.c */
/* Tests: SBX_TEST_CRASH_AT=control:<step> ends the process (status 137) at that step. */
void crash_point(const char *step);
int reconciler_start(control_t *ctl);
void reconciler_stop(control_t *ctl);
