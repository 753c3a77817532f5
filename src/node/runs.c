/* SPDX-License-Identifier: MIT */
/* Installed runs: install (replacing any earlier run of the sandbox), stop, retire, the stream
 * leases bound to each run, the run records kept on disk, and state archives for moves. */
#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>

#include <sodium.h>

#include "cap/runjson.h"
#include "common/env.h"
#include "common/fileio.h"
#include "common/httpc.h"
#include "common/log.h"
#include "common/strutil.h"
#include "disk.h"
#include "egress.h"
#include "http/proxy.h"
#include "http/relay.h"
#include "image.h"
#include "isolation/userns.h"
#include "node.h"
#include "substrate.h"

#define ENV_MAX 256
#define ARGV_MAX 256

/* ---- leases ---------------------------------------------------------------------------------- */

lease_t *run_lease_new(run_t *r)
{
    lease_t *l = calloc(1, sizeof *l);
    if (!l)
        return NULL;
    l->run = r;
    l->next = r->leases;
    if (r->leases)
        r->leases->prev = l;
    r->leases = l;
    r->n_leases++;
    return l;
}

void run_lease_on_close(tunnel_t *t, void *data)
{
    lease_t *l = data;
    run_t *r = l->run;
    (void)t;
    if (l->prev)
        l->prev->next = l->next;
    else
        r->leases = l->next;
    if (l->next)
        l->next->prev = l->prev;
    r->n_leases--;
    free(l);
}

/* Every stream of the run ends now, in both directions: the run it was authorized for is
 * being replaced or retired. */
static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

relay_conn_t *run_bridge_take(run_t *r)
{
    uint64_t now_ms = mono_ms();
    while (r->n_idle > 0) {
        relay_conn_t *k = r->idle[--r->n_idle];
        /* closed (the agent went away), or bytes nobody asked for: not for a request */
        if (k->since_ms + RUN_IDLE_BRIDGE_MS > now_ms && relay_conn_fit(k))
            return k;
        relay_conn_close(k);
    }
    return NULL;
}

void run_bridge_put(run_t *r, relay_conn_t *k)
{
    if (r->state != RUN_RUNNING || r->n_idle == RUN_IDLE_BRIDGE) {
        relay_conn_close(k);
        return;
    }
    r->idle[r->n_idle++] = k;
}

static void run_bridge_close_all(run_t *r)
{
    while (r->n_idle > 0)
        relay_conn_close(r->idle[--r->n_idle]);
}

void run_cut_leases(run_t *r)
{
    run_bridge_close_all(r); /* kept connections end with the streams */
    while (r->leases) {
        lease_t *l = r->leases;
        if (l->relay)
            proxy_relay_cut(l->relay); /* its callback unlinks and frees l */
        else if (l->tunnel)
            proxy_tunnel_close(l->tunnel); /* its callback unlinks and frees l */
        else
            run_lease_on_close(NULL, l);
    }
}

/* ---- helpers ------------------------------------------------------------------------------- */

static int mkdir_mode(const char *p, mode_t m)
{
    if (mkdir(p, m) < 0 && errno != EEXIST)
        return negative_errno();
    return chmod(p, m) < 0 ? negative_errno() : 0;
}

static int path_join(char *out, size_t cap, const char *a, const char *b)
{
    int n = snprintf(out, cap, "%s/%s", a, b);
    return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

/* ---- the run record on disk ---------------------------------------------------------------- */

static const char *state_name(run_state_t s)
{
    return s == RUN_RUNNING ? "running" : s == RUN_PAUSED ? "paused" : "exited";
}

json_t *run_json(const run_t *r)
{
    json_t *ex = json_array();
    for (size_t i = 0; ex && i < r->n_expose; i++)
        json_array_append_new(
            ex, json_pack("{s:i,s:s}", "port", r->expose[i].port, "protocol",
                          r->expose[i].proto == CAP_PROTO_WEBSOCKET ? "websocket" : "http"));
    return json_pack(
        "{s:o,s:s,s:i,s:I,s:I,s:I,s:I,s:o,s:b,s:I,s:I,s:I,s:I,s:s,s:I,s:i,s:I}", "run",
        cap_run_to_json(&r->id), "state", r->installing ? "installing" : state_name(r->state),
        "pid", (int)r->pid, "start_time", (json_int_t)r->start_time, "exe_dev",
        (json_int_t)r->exe_dev, "exe_ino", (json_int_t)r->exe_ino, "sock_ino",
        (json_int_t)r->sock_ino, "expose", ex ? ex : json_array(), "pool_host", r->pool_host,
        "pasta_pid", (json_int_t)r->pasta_pid, "pasta_start", (json_int_t)r->pasta_start,
        "holder_pid", (json_int_t)r->holder_pid, "holder_start", (json_int_t)r->holder_start,
        "image", r->image[0] ? r->image : "host", "id_base", (json_int_t)r->id_base, "exit_status",
        r->exit_status, "leases", (json_int_t)r->n_leases);
}

int run_save(const run_t *r)
{
    char path[PATH_MAX + 16];
    (void)snprintf(path, sizeof path, "%s/run.json", r->dir);
    json_t *j = run_json(r);
    char *v = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!v)
        return -ENOMEM;
    int rc = file_write_atomic(path, v, strlen(v), 0600);
    free(v);
    return rc;
}

static int parse_expose(json_t *ex, run_t *r)
{
    size_t i;
    json_t *e;
    if (!ex)
        return 0;
    if (!json_is_array(ex) || json_array_size(ex) > NODE_MAX_EXPOSE)
        return -EINVAL;
    json_array_foreach(ex, i, e) {
        json_int_t port;
        const char *proto = "http";
        if (json_unpack(e, "{s:I,s?s}", "port", &port, "protocol", &proto) < 0 || port < 1 ||
            port > 65535)
            return -EINVAL;
        cap_proto_t p = streq(proto, "http")        ? CAP_PROTO_HTTP
                        : streq(proto, "websocket") ? CAP_PROTO_WEBSOCKET
                                                    : CAP_PROTO_NONE;
        if (p == CAP_PROTO_NONE)
            return -EINVAL;
        r->expose[r->n_expose++] = (cap_expose_t){ (uint16_t)port, p };
    }
    return 0;
}

/* ---- starting a run ------------------------------------------------------------------------ */

typedef struct {
    char *v[ENV_MAX + 1];
    size_t n;
} strv_t;

static void strv_clear(strv_t *s)
{
    for (size_t i = 0; i < s->n; i++)
        free(s->v[i]);
    s->n = 0;
}

/* The run's environment: a fixed base, then the job's env, then its secrets (environment for
 * the command only: never stored in the run record, never logged). The node's own settings
 * (SBX_LISTEN, SBX_HOST_MODE) cannot be overridden. A pool job: the node starts the agent in
 * host mode itself. */
static int build_env(json_t *spec, bool pool_host, char ***ret, sbx_err_t *err)
{
    static const char *const reserved[] = { "SBX_LISTEN", "SBX_HOST_MODE", NULL };
    char *const base[] = {
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/.sbx/bin",
        "HOME=/root",
        "SBX_LISTEN=fd:3",
        pool_host ? "SBX_HOST_MODE=1" : NULL,
        NULL,
    };
    const env_overlay_t ov[] = { { "env", json_object_get(spec, "env") },
                                 { "secrets", json_object_get(spec, "secrets") } };
    const env_rules_t rules = { .portable_names = true,
                                .reserved = reserved,
                                .max_entries = ENV_MAX };
    return env_build(base, ov, ELEMENTSOF(ov), &rules, ret, err);
}

static int build_argv(json_t *spec, bool pool_host, strv_t *argv, sbx_err_t *err)
{
    json_t *cmd = json_object_get(spec, "command"), *a;
    size_t i;
    if (pool_host && json_array_size(cmd) > 0)
        return sbx_err(err, -EINVAL, "a pool job runs the node's agent: it takes no command");
    if (!cmd || json_array_size(cmd) == 0) {
        argv->v[0] = strdup("sbx-server");
        argv->v[1] = NULL;
        argv->n = 1;
        return argv->v[0] ? 0 : sbx_err(err, -ENOMEM, "out of memory");
    }
    if (!json_is_array(cmd) || json_array_size(cmd) > ARGV_MAX)
        return sbx_err(err, -EINVAL, "command must be an array of strings");
    json_array_foreach(cmd, i, a) {
        if (!json_is_string(a) || strlen(json_string_value(a)) != json_string_length(a))
            return sbx_err(err, -EINVAL, "command must be an array of strings without NUL");
        argv->v[argv->n] = strdup(json_string_value(a));
        if (!argv->v[argv->n])
            return sbx_err(err, -ENOMEM, "out of memory");
        argv->v[++argv->n] = NULL;
    }
    if (argv->v[0][0] != '/' && !streq(argv->v[0], "sbx-server"))
        return sbx_err(err, -EINVAL, "command[0] must be an absolute path or \"sbx-server\"");
    return 0;
}

/* A fresh bound (not listening) socket at sock_path: the agent calls listen() on it. */
static int make_bridge_socket(run_t *r, int *ret_fd)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    if (strlen(r->sock_path) >= sizeof sa.sun_path)
        return -ENAMETOOLONG;
    memcpy(sa.sun_path, r->sock_path, strlen(r->sock_path) + 1);
    _cleanup_close_ int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return negative_errno();
    (void)unlink(r->sock_path);
    mode_t old = umask(0077);
    int rc = bind(fd, (struct sockaddr *)&sa, sizeof sa);
    umask(old);
    if (rc < 0)
        return negative_errno();
    struct stat st;
    if (stat(r->sock_path, &st) < 0)
        return negative_errno();
    r->sock_ino = st.st_ino;
    r->sock_uid = st.st_uid;
    *ret_fd = TAKE_FD(fd);
    return 0;
}

/* The run's cgroups' name under the node's: <sandbox>.<generation> (the run's identity). */
#define RUN_CGROUP_NAME_MAX (CAP_ID_MAX + 24)
static const char *run_cgroup_name(const run_t *r, char buf[RUN_CGROUP_NAME_MAX])
{
    (void)snprintf(buf, RUN_CGROUP_NAME_MAX, "%s.%llu", r->id.sandbox,
                   (unsigned long long)r->id.generation);
    return buf;
}

/* ---- the run's output ------------------------------------------------------------------- */

/* What pid 1 of a run writes to stdout and stderr goes into a fifo in the run's directory (a
 * node-owned 0700 directory the run cannot reach), which the node copies into the run's log, up
 * to RUN_LOG_MAX. The run holds the fifo open for reading and writing, so a node restart never
 * hands it a SIGPIPE: its writes wait until the restarted node reads again. It can neither
 * truncate, rewind nor grow the log past the cap. */
#define RUN_LOG_MAX (16ULL << 20)

static int output_drain(run_t *r, int rounds)
{
    char buf[16384];
    while (rounds-- > 0) {
        ssize_t n = read(r->out_fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return errno == EAGAIN ? -EAGAIN : negative_errno();
        if (n == 0)
            return 0; /* no writer left: the run is gone */
        if (r->log_fd >= 0 && r->log_bytes < RUN_LOG_MAX) {
            uint64_t k = MIN((uint64_t)n, RUN_LOG_MAX - r->log_bytes);
            (void)!write(r->log_fd, buf, (size_t)k);
            r->log_bytes += k;
            if (r->log_bytes >= RUN_LOG_MAX) {
                static const char cut[] = "\n[sbx-node: log limit reached; the rest is dropped]\n";
                (void)!write(r->log_fd, cut, sizeof cut - 1);
            }
        }
    }
    return -EAGAIN;
}

static void output_close(run_t *r)
{
    if (r->out_fd >= 0) {
        (void)output_drain(r, 64);
        if (r->out_loop)
            loop_unwatch(r->out_loop, &r->out_w);
    }
    r->out_fd = safe_close(r->out_fd);
    r->log_fd = safe_close(r->log_fd);
    r->out_loop = NULL;
}

static void on_output(loop_t *l, watcher_t *w, uint32_t ev)
{
    run_t *r = w->data;
    (void)l;
    (void)ev;
    int rc = output_drain(r, 16);
    if (rc != -EAGAIN)
        output_close(r);
}

/* Open the node's side of the run's output (create: a new fifo, and *ret_child the run's side,
 * opened for reading and writing). */
static int output_open(node_t *n, run_t *r, bool create, int *ret_child)
{
    char fifo[PATH_MAX + 8], logp[PATH_MAX + 8];
    int rc = path_join(fifo, sizeof fifo, r->dir, "out");
    if (rc >= 0)
        rc = path_join(logp, sizeof logp, r->dir, "log");
    if (rc < 0)
        return rc;
    if (create) {
        (void)unlink(fifo);
        if (mkfifo(fifo, 0600) < 0)
            return negative_errno();
    }
    r->out_fd = open(fifo, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW);
    if (r->out_fd < 0)
        return negative_errno();
    r->log_fd = open(logp, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
    struct stat st;
    r->log_bytes = r->log_fd >= 0 && fstat(r->log_fd, &st) == 0 ? (uint64_t)st.st_size : 0;
    if (create) {
        *ret_child = open(fifo, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
        if (*ret_child < 0) {
            rc = negative_errno();
            output_close(r);
            return rc;
        }
    }
    watcher_init(&r->out_w, r->out_fd, on_output, r);
    rc = loop_watch(n->srv.loop, &r->out_w, EPOLLIN);
    if (rc < 0) {
        if (create)
            *ret_child = safe_close(*ret_child);
        output_close(r);
        return rc;
    }
    r->out_loop = n->srv.loop;
    return 0;
}

/* ---- the run's way out (network "egress") ------------------------------------------------- */

static void holder_exited(child_t *ch, int wstatus)
{
    run_t *r = ch->data;
    (void)wstatus;
    if (r->holder_pid == ch->pid)
        r->holder_pid = 0;
}

static void pasta_exited(child_t *ch, int wstatus)
{
    run_t *r = ch->data;
    if (r->pasta_pid == ch->pid) {
        r->pasta_pid = 0;
        if (r->state == RUN_RUNNING)
            log_warn("run %s: pasta exited (status 0x%x): no egress until the run restarts",
                     r->id.sandbox, wstatus);
    }
}

/* Stop a helper of the run (pasta, the namespace holder): ours (a child, reaped through the
 * registry) or one a previous node process started (named by pid and start time, never another
 * process with its pid). */
static void helper_proc_stop(node_t *n, pid_t *pid, uint64_t start, child_t *ch)
{
    if (*pid <= 0)
        return;
    uint64_t st;
    if (ch->pid == *pid) {
        (void)kill(*pid, SIGKILL);
        reaper_remove(&n->srv.reaper, ch);
        (void)waitpid(*pid, NULL, 0);
    } else if (proc_start_time(*pid, &st) >= 0 && st == start)
        (void)kill(*pid, SIGKILL);
    *pid = 0;
    ch->pid = 0;
}

static void pasta_stop(node_t *n, run_t *r)
{
    helper_proc_stop(n, &r->pasta_pid, r->pasta_start, &r->pasta_child);
    helper_proc_stop(n, &r->holder_pid, r->holder_start, &r->holder_child);
}

/* The last id of the run's block: owner of an egress run's network namespace and pasta's uid;
 * no process of the host's user namespace has it (the run's processes are in their own). */
static uint32_t egress_owner(const run_t *r) { return r->id_base + IDRANGE_BLOCK - 1; }

static void run_on_exit(child_t *ch, int wstatus)
{
    run_t *r = ch->data;
    r->pid = 0;
    output_close(r);
    r->stat_fd = safe_close(r->stat_fd);
    r->exit_status = wstatus;
    if (r->state == RUN_RUNNING) {
        r->state = RUN_EXITED;
        run_cut_leases(r);
        /* nor its network: pasta and the namespace's holder end with it (they outlived it,
         * and the node, a red-team pass found) */
        pasta_stop(r->node, r);
        (void)run_save(r);
        /* nothing of the run uses its disk any more: its mount and loop device go now, not
         * when the run is retired (whatever needs the root again mounts it again) */
        run_unmount_disk(r);
        log_info("run %s generation %llu exited (status 0x%x)", r->id.sandbox,
                 (unsigned long long)r->id.generation, wstatus);
    }
}

/* Whether the agent listens on the bridge and passes verification: 0, -EAGAIN (not yet: it
 * has not called listen()), or -errno with err set (its process is gone, or it is not who it
 * must be). */
int run_probe_ready(run_t *r, sbx_err_t *err)
{
    int fd;
    int rc = bridge_connect(r, &fd, err);
    if (rc >= 0) {
        safe_close(fd);
        return 0;
    }
    uint64_t st;
    int sr = r->stat_fd >= 0 ? proc_stat_start_time(r->stat_fd, &st) : -ESRCH;
    if (sr < 0 || st != r->start_time) {
        char last[256];
        (void)snprintf(last, sizeof last, "%.*s", (int)sizeof last - 1, err ? err->msg : "");
        return sbx_err(err, -ESRCH, "the run's process exited during start (see its log; %s)",
                       last);
    }
    return rc == -ECONNREFUSED ? -EAGAIN : rc;
}

/* Fetch a paused run's root from the node that holds it, as a tar stream, into root. */
static int restore_remote(node_t *n, json_t *rs, const run_t *r, const char *root, sbx_err_t *err)
{
    const char *host, *cap, *sandbox;
    json_int_t port;
    if (json_unpack(rs, "{s:s,s:I,s:s,s:s}", "host", &host, "port", &port, "capability", &cap,
                    "sandbox", &sandbox) < 0 ||
        port < 1 || port > 65535 || !cap_id_valid(sandbox) || strlen(cap) > CAP_WIRE_MAX) {
        return sbx_err(err, -EINVAL, "restore: expected {host, port, sandbox, capability}");
    }
    /* The archive is unpacked by tar as root of a user namespace with the new run's mapping:
     * ownership inside the archive is relative to the run (0..65535), so it lands on this
     * node's block; a link in the archive leads nowhere the run's own root could not write, and
     * device nodes cannot be made. */
    _cleanup_close_ int rootfd = open(root, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (rootfd < 0)
        return negative_errno();
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) < 0)
        return negative_errno();
    _cleanup_close_ int rd = pfd[0], wr = pfd[1]; /* tar's stdin, and the response's way in */
    char *const argv[] = {
        "/bin/tar", "-x", "--numeric-owner", "--same-permissions", "--no-overwrite-dir", "-f",
        "-",        NULL
    };
    pid_t pid;
    int rc = userns_spawn(r->id_base, IDRANGE_BLOCK, rootfd, rd, -1, argv, &pid);
    rd = safe_close(rd);
    if (rc < 0)
        return rc;
    char target[160], hdr[CAP_WIRE_MAX + 64];
    (void)snprintf(target, sizeof target, "/v1/runs/%s/state", sandbox);
    (void)snprintf(hdr, sizeof hdr, "X-Sbx-Capability: %s\r\n", cap);
    httpc_request_t rq;
    httpc_request_init(&rq);
    tls_peer_t peer; /* the other node: a certificate from our control plane's CA for host */
    node_tls_peer(n, host, NULL, &peer, &rq);
    rq.host = host;
    rq.port = (uint16_t)port;
    rq.method = "GET";
    rq.target = target;
    rq.headers = hdr;
    rq.body_fd = wr;
    rq.timeout_ms = 300000;
    _cleanup_(httpc_response_free) httpc_response_t resp = { 0 };
    rc = httpc_do(&rq, &resp);
    wr = safe_close(wr); /* tar sees the end of the stream */
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (rc < 0 || resp.status != 200 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        return sbx_err(err, rc < 0 ? rc : -EIO,
                       "restore from %s:%lld failed: %s (status %d, tar %d)", host, (long long)port,
                       rc < 0 ? strerror(-rc) : "http", resp.status,
                       WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    return 0;
}

void run_free(run_t *r)
{
    if (!r)
        return;
    output_close(r);
    safe_close(r->stat_fd);
    run_bridge_close_all(r);
    free(r);
}

static void run_unlink(node_t *n, run_t *r)
{
    for (run_t **pp = &n->runs; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            n->n_runs--;
            return;
        }
}

void run_stop(node_t *n, run_t *r)
{
    run_cut_leases(r);
    if (r->pid > 0) {
        /* pid 1 of the run's pid namespace: when it dies the kernel kills the whole tree */
        (void)kill(r->pid, SIGKILL);
        reaper_remove(&n->srv.reaper, &r->child);
        int st;
        while (waitpid(r->pid, &st, 0) < 0 && errno == EINTR)
            ;
        r->pid = 0;
    }
    pasta_stop(n, r);
    output_close(r);
    char cg[RUN_CGROUP_NAME_MAX];
    cgroup_remove_run(&n->cg, run_cgroup_name(r, cg)); /* empty now: pid 1 took its processes */
    r->stat_fd = safe_close(r->stat_fd);
    if (r->state == RUN_RUNNING)
        r->state = RUN_PAUSED;
    (void)run_save(r);
}

void run_unmount_disk(const run_t *r)
{
    char root[PATH_MAX + 8];
    int rc = path_join(root, sizeof root, r->dir, "root");
    if (rc >= 0)
        rc = disk_umount(root);
    if (rc < 0)
        log_warn("run %s: cannot unmount its disk: %s", r->id.sandbox, strerror(-rc));
}

uint64_t run_disk_unwritten(const run_t *r)
{
    char img[PATH_MAX + 16];
    if (path_join(img, sizeof img, r->dir, "disk.img") < 0)
        return r->installing ? r->disk_bytes : 0;
    /* not made yet: the whole disk is promised */
    return disk_unwritten(img, r->installing ? r->disk_bytes : 0);
}

int64_t node_disk_room(node_t *n, const run_t *skip)
{
    char runs[PATH_MAX];
    struct statvfs sv;
    if (path_join(runs, sizeof runs, n->cfg.state_dir, "runs") < 0 || statvfs(runs, &sv) < 0)
        return INT64_MAX; /* not known: the install itself meets a full disk */
    int64_t room = ((int64_t)((uint64_t)sv.f_bavail * sv.f_frsize) - (NODE_DISK_KEEP_MB << 20)) *
                   (int64_t)MAX(n->cfg.disk_overcommit, 1u);
    for (const run_t *r = n->runs; r; r = r->next)
        if (r != skip)
            room -= (int64_t)run_disk_unwritten(r);
    return room - (int64_t)installs_unwritten(n, skip);
}

/* A helper process (a tree removal, tar) the loop does not wait for: done() runs when it exits. */
typedef struct helper helper_t;
struct helper {
    child_t child;
    node_t *n;
    void (*done)(helper_t *h, int wstatus);
    conn_t *conn;     /* who waits for the result, NULL once gone */
    uint32_t id_base; /* a retired run's id block, free again once its files are gone */
    char path[PATH_MAX + 32];
};

static void helper_exited(child_t *ch, int wstatus)
{
    helper_t *h = ch->data;
    h->done(h, wstatus);
    free(h);
}

static void helper_adopt(node_t *n, helper_t *h, pid_t pid)
{
    h->n = n;
    h->child = (child_t){ .pid = pid, .on_exit = helper_exited, .data = h };
    reaper_add(&n->srv.reaper, &h->child);
}

static void trash_removed(helper_t *h, int wstatus)
{
    if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
        /* the block stays taken: files of the old run may be left with its ids */
        log_warn("cannot remove %s (status 0x%x)", h->path, wstatus);
        return;
    }
    idrange_release(&h->n->ids, h->id_base);
}

/* Remove h->path (rmtree: by descriptor, never following a symlink, never leaving the tree's
 * filesystem) in a child the loop does not wait for: a run's tree can be large. The child only
 * walks and unlinks, then _exit()s. */
static int helper_rmtree(node_t *n, helper_t *h)
{
    h->done = trash_removed;
    pid_t pid = fork();
    if (pid < 0)
        return negative_errno();
    if (pid == 0)
        _exit(rmtree(h->path) < 0 ? 1 : 0);
    helper_adopt(n, h, pid);
    return 0;
}

/* Stop the run and forget it; its directory is renamed away at once (a later install of the
 * sandbox starts clean) and removed by a child the loop does not wait for. */
void run_retire(node_t *n, run_t *r)
{
    run_stop(n, r);
    node_crash_point(n, "retire:after_stop");
    run_unlink(n, r);
    run_unmount_disk(r);
    helper_t *h = calloc(1, sizeof *h);
    char rnd[9];
    uint32_t v = randombytes_random();
    (void)snprintf(rnd, sizeof rnd, "%08x", v);
    int rc = -ENOMEM;
    /* the trash keeps the id block in its name: a node restarted meanwhile still knows it */
    if (h &&
        snprintf(h->path, sizeof h->path, "%s/runs/.trash-%u-%s-%s", n->cfg.state_dir, r->id_base,
                 r->id.sandbox, rnd) < (int)sizeof h->path &&
        rename(r->dir, h->path) == 0) {
        node_crash_point(n, "retire:after_rename");
        h->id_base = r->id_base;
        rc = helper_rmtree(n, h);
        if (rc < 0)
            rc = rmtree(h->path);
        else
            h = NULL; /* owned by the child record now */
    } else {
        rc = rmtree(r->dir);
    }
    if (h && rc >= 0)
        idrange_release(&n->ids, r->id_base);
    free(h);
    if (rc < 0)
        log_warn("cannot remove %s: %s", r->dir, strerror(-rc));
    log_info("retired run %s generation %llu", r->id.sandbox, (unsigned long long)r->id.generation);
    run_free(r);
}

/* The run's directories, its root fresh, kept (resume here) or fetched from the node that held
 * it (a move). Blocking (tree removal, tar, HTTP): runs on an install thread; touches nothing
 * shared. */
/* An image run's writable layer on its disk: upper/ (the run's, owned by its root) and
 * work/ (overlayfs's, the node's). The disk's top directory is never visible inside an image
 * run (its root is upper/ over the image), so these are the node's to make. */
static int image_layer_dirs(const run_t *r, const char *root, sbx_err_t *err)
{
    char upper[PATH_MAX + 16], work[PATH_MAX + 16];
    if (path_join(upper, sizeof upper, root, "upper") < 0 ||
        path_join(work, sizeof work, root, "work") < 0)
        return -ENAMETOOLONG;
    struct stat st;
    if (mkdir(upper, 0755) < 0 && errno != EEXIST)
        goto fail;
    if (lstat(upper, &st) < 0 || !S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        goto fail;
    }
    if (chown(upper, r->id_base, r->id_base) < 0)
        goto fail;
    if (mkdir(work, 0700) < 0 && errno != EEXIST)
        goto fail;
    if (lstat(work, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != 0) {
        errno = ENOTDIR;
        goto fail;
    }
    return 0;
fail:;
    int rc = negative_errno();
    return sbx_err(err, rc, "the run's writable layer: %s", strerror(-rc));
}

int run_install_dirs(node_t *n, run_t *r, json_t *spec, sbx_err_t *err)
{
    json_t *restore = json_object_get(spec, "restore");
    const char *mode = json_string_value(json_object_get(restore, "mode"));
    bool keep_root = mode && streq(mode, "local");
    if (!(mode && streq(mode, "remote")))
        restore = NULL;
    char root[PATH_MAX + 8], bridge[PATH_MAX + 8], img[PATH_MAX + 16];
    int rc = path_join(root, sizeof root, r->dir, "root");
    if (rc >= 0)
        rc = path_join(bridge, sizeof bridge, r->dir, "br");
    if (rc >= 0)
        rc = path_join(img, sizeof img, r->dir, "disk.img");
    if (rc < 0)
        return rc;
    if (!keep_root) {
        (void)disk_umount(root);
        (void)rmtree(root);
        (void)unlink(img);
    }
    rc = mkdir_mode(r->dir, 0700);
    if (rc >= 0)
        rc = mkdir_mode(bridge, 0700); /* only the node reaches the agent's socket */
    bool fresh = !keep_root || (access(img, F_OK) < 0 && access(root, F_OK) < 0);
    if (rc >= 0 && fresh && mkdir(root, 0755) < 0 && errno != EEXIST)
        rc = negative_errno();
    if (rc < 0)
        return sbx_err(err, rc, "cannot create the run's directories: %s", strerror(-rc));
    /* the run's root is a file system of the flavor's size whose root directory belongs to
     * the run's root (host id id_base); the node puts nothing else in it: the run's process
     * makes what a fresh tree needs from inside its namespaces */
    if (fresh)
        rc = disk_create(img, r->disk_bytes, r->id_base, err);
    if (rc >= 0 && access(img, F_OK) == 0)
        rc = disk_mount(img, root, err);
    if (rc < 0)
        return rc;
    if (restore && !keep_root) {
        rc = restore_remote(n, restore, r, root, err);
        if (rc >= 0)
            node_crash_point(n, "install:after_fetch"); /* a moved root, here, not yet running */
    }
    if (rc < 0 || streq(r->image, "host"))
        return rc;
    /* an image run: its verified rootfs (unpacked once per manifest) under the layer kept on
     * the run's disk, and a node-owned mount point for the idmapped image */
    rc = image_rootfs(n, r->image, r->image_rootfs, sizeof r->image_rootfs, NULL, err);
    if (rc >= 0)
        rc = image_layer_dirs(r, root, err);
    char lower[PATH_MAX + 16];
    if (rc >= 0 && path_join(lower, sizeof lower, r->dir, "lower") >= 0 && mkdir(lower, 0700) < 0 &&
        errno != EEXIST) {
        rc = negative_errno();
        (void)sbx_err(err, rc, "the image's mount point: %s", strerror(-rc));
    }
    return rc;
}

/* The run's cgroups, named after the run (<sandbox>.<generation>) under the node's own, with
 * the flavor's limits. A pool host's are delegated to the run's root: it nests its sandboxes'
 * cgroups in them, so the flavor bounds the whole pool; the limit files stay the node's. */
static int run_cgroups(node_t *n, run_t *r, const cg_limits_t *lim, int *fds, char (*dirs)[192],
                       const char **names)
{
    char name[RUN_CGROUP_NAME_MAX];
    return cgroup_prepare_run(&n->cg, run_cgroup_name(r, name), lim,
                              r->pool_host ? (int64_t)r->id_base : -1, fds,
                              SUBSTRATE_MAX_CGROUPS + 1, dirs, names);
}

/* The node's agent binary for a run: r->exe_dev and r->exe_ino become the identity the bridge
 * requires of the run's listener (bridge.c), and the substrate mounts only that file. */
static int agent_pin(node_t *n, run_t *r, sbx_err_t *err)
{
    struct stat st;
    int rc = stat(n->cfg.agent_bin, &st) < 0 ? negative_errno()
             : S_ISREG(st.st_mode)           ? 0
                                             : -ENOEXEC;
    if (rc < 0)
        return sbx_err(err, rc, "the agent binary %s: %s", n->cfg.agent_bin, strerror(-rc));
    r->exe_dev = st.st_dev;
    r->exe_ino = st.st_ino;
    return 0;
}

/* The run's process exists and waits (substrate.h): record it before it may go on. */
typedef struct {
    node_t *n;
    run_t *r;
} cloned_ctx_t;

static int run_cloned(void *arg, pid_t pid, uint64_t start_time)
{
    cloned_ctx_t *cx = arg;
    node_crash_point(cx->n, "install:after_clone"); /* before the record: it must exit itself */
    cx->r->pid = pid;
    cx->r->start_time = start_time;
    return run_save(cx->r);
}

int run_install_spawn(node_t *n, run_t *r, json_t *spec, sbx_err_t *err)
{
    _cleanup_strv_free_ char **env = NULL;
    _cleanup_(strv_clear) strv_t argv = { 0 };
    int rc = build_env(spec, r->pool_host, &env, err);
    if (rc < 0)
        return rc;
    rc = build_argv(spec, r->pool_host, &argv, err);
    if (rc < 0)
        return rc;
    json_t *fl = json_object_get(spec, "flavor");
    json_int_t mem_mb = 0, pids = 0, cpu_milli = 0;
    (void)json_unpack(fl, "{s?I,s?I,s?I}", "memory_mb", &mem_mb, "pids", &pids, "cpu_milli",
                      &cpu_milli);
    cg_limits_t lim = { .mem_bytes = mem_mb > 0 ? (uint64_t)mem_mb << 20 : 0,
                        .pids = pids > 0 ? (uint64_t)pids : 0 };
    if (cpu_milli > 0) {
        lim.cpu_period_us = 100000;
        lim.cpu_quota_us = (uint64_t)cpu_milli * 100;
    }
    int cgfds[SUBSTRATE_MAX_CGROUPS + 1] = { -1, -1, -1, -1, -1 };
    char cgdirs[SUBSTRATE_MAX_CGROUPS + 1][192] = { { 0 } };
    const char *cgnames[SUBSTRATE_MAX_CGROUPS + 1] = { 0 };
    const char *cgdirp[SUBSTRATE_MAX_CGROUPS + 1] = { 0 };
    if (n->cg.enabled && run_cgroups(n, r, &lim, cgfds, cgdirs, cgnames) < 0)
        rc = sbx_err(err, -EIO, "cannot prepare the run's cgroups: %s", strerror(errno));
    for (size_t i = 0; i < SUBSTRATE_MAX_CGROUPS && cgnames[i]; i++)
        cgdirp[i] = cgdirs[i];
    int sock = -1, userns = -1, out = -1, netns = -1;
    char root[PATH_MAX + 8], lower[PATH_MAX + 16];
    (void)path_join(root, sizeof root, r->dir, "root");
    (void)path_join(lower, sizeof lower, r->dir, "lower");
    bool imaged = !streq(r->image, "host") && r->image_rootfs[0];
    if (rc >= 0 && (rc = userns_create(r->id_base, IDRANGE_BLOCK, &userns)) < 0)
        (void)sbx_err(err, rc, "user namespace: %s", strerror(-rc));
    if (rc >= 0 && (rc = output_open(n, r, true, &out)) < 0)
        (void)sbx_err(err, rc, "output fifo: %s", strerror(-rc));
    if (rc >= 0 && r->egress &&
        (rc = egress_netns_make(egress_owner(r), &r->holder_pid, &netns, err)) >= 0) {
        (void)proc_start_time(r->holder_pid, &r->holder_start);
        r->holder_child = (child_t){ .pid = r->holder_pid, .on_exit = holder_exited, .data = r };
        reaper_add(&n->srv.reaper, &r->holder_child);
        if ((rc = run_save(r)) < 0) /* the holder is recorded before anything else starts */
            (void)sbx_err(err, rc, "cannot record the run: %s", strerror(-rc));
    }
    if (rc >= 0 && (rc = make_bridge_socket(r, &sock)) < 0)
        (void)sbx_err(err, rc, "bridge socket: %s", strerror(-rc));
    /* The agent binary, pinned by device and inode: the run gets this very file (read-only),
     * and the bridge accepts as its listener only a process executing it */
    if (rc >= 0)
        rc = agent_pin(n, r, err);
    if (rc >= 0) {
        substrate_spec_t sp = { .root = root,
                                .agent_bin = n->cfg.agent_bin,
                                .agent_dev = r->exe_dev,
                                .agent_ino = r->exe_ino,
                                .hostname = r->id.sandbox,
                                .argv = argv.v,
                                .envp = env,
                                .bridge_fd = sock,
                                .log_fd = out,
                                .userns_fd = userns,
                                .netns_fd = netns,
                                .pool_host = r->pool_host,
                                .cgroup_fds = cgfds,
                                .cgroup_dirs = cgdirp,
                                .cgroup_names = cgnames,
                                .filter = r->pool_host ? &n->filter_pool : &n->filter_run,
                                .image_rootfs = imaged ? r->image_rootfs : NULL,
                                .lower_mnt = imaged ? lower : NULL,
                                .resolv_conf = r->egress ? "nameserver " EGRESS_DNS "\n" : NULL,
                                .etc_ld_cache = n->ld_cache,
                                .etc_ld_cache_len = n->ld_cache_len,
                                .cloned = run_cloned,
                                .cloned_arg = &(cloned_ctx_t){ n, r } };
        rc = substrate_spawn(&sp, &r->pid, &r->start_time, err);
    }
    safe_close(sock);
    safe_close(userns);
    safe_close(out);
    safe_close(netns);
    for (int i = 0; i < SUBSTRATE_MAX_CGROUPS + 1; i++)
        safe_close(cgfds[i]);
    if (rc < 0) {
        pasta_stop(n, r);
        output_close(r);
        return rc;
    }
    r->state = RUN_RUNNING;
    r->child = (child_t){ .pid = r->pid, .on_exit = run_on_exit, .data = r };
    reaper_add(&n->srv.reaper, &r->child);
    r->stat_fd = proc_stat_open(r->pid); /* still our unreaped child: the same process */
    if (r->egress) { /* the firewall first, then the way out: until pasta runs, lo only */
        pid_t pp;
        char tun[PATH_MAX + 8];
        (void)path_join(tun, sizeof tun, r->dir, "tun");
        char runs[PATH_MAX + 8];
        char real[PATH_MAX];
        (void)path_join(runs, sizeof runs, n->cfg.state_dir, "runs");
        rc = egress_start(r->holder_pid, egress_owner(r), json_object_get(spec, "egress_allow"),
                          tun, realpath(runs, real) ? real : runs, &pp, err);
        if (rc < 0)
            return rc;
        r->pasta_pid = pp;
        (void)proc_start_time(pp, &r->pasta_start);
        r->pasta_child = (child_t){ .pid = pp, .on_exit = pasta_exited, .data = r };
        reaper_add(&n->srv.reaper, &r->pasta_child);
        (void)run_save(r);
    }
    return 0;
}

/* The synchronous part of an install: refuse what must be refused, describe the new run, and
 * replace the old one (its streams end and its capabilities stop matching now). On 0, *ret is
 * the new run, not yet in n->runs (run_install_finish links it). -EEXIST: that very run is
 * installed and running (*ret is it); -ESTALE: a newer one is. */
int run_install_prepare(node_t *n, const cap_run_t *id, json_t *spec, sbx_err_t *err, run_t **ret)
{
    run_t *old = node_find_run(n, id->sandbox);
    if (old && cap_run_equal(&old->id, id) && old->state == RUN_RUNNING) {
        *ret = old;
        return -EEXIST;
    }
    if (old && old->id.generation > id->generation) {
        return sbx_err(err, -ESTALE, "a newer run (generation %llu) is installed",
                       (unsigned long long)old->id.generation);
    }
    _cleanup_free_ run_t *r = calloc(1, sizeof *r);
    if (!r)
        return -ENOMEM;
    r->node = n;
    r->stat_fd = -1;
    r->out_fd = r->log_fd = -1;
    r->id = *id;
    r->installing = true;
    if (parse_expose(json_object_get(spec, "expose"), r) < 0) {
        return sbx_err(err, -EINVAL,
                       "expose: expected [{port: 1..65535, protocol: http|websocket}]");
    }
    const char *image = json_string_value(json_object_get(spec, "image"));
    if (!image)
        image = "host";
    if (!streq(image, "host") && !image_name_valid(image)) {
        return sbx_err(err, -EINVAL, "image: \"host\" or an image name");
    }
    (void)snprintf(r->image, sizeof r->image, "%s", image);
    json_t *mode = json_object_get(spec, "mode");
    if (mode && !(json_is_string(mode) && (streq(json_string_value(mode), "dedicated") ||
                                           streq(json_string_value(mode), "pool")))) {
        return sbx_err(err, -EINVAL, "mode: \"dedicated\" or \"pool\"");
    }
    r->pool_host = mode && streq(json_string_value(mode), "pool");
    const char *net = json_string_value(json_object_get(spec, "network"));
    if (net && !streq(net, "none") && !streq(net, "egress")) {
        return sbx_err(err, -EINVAL, "network: \"none\" or \"egress\"");
    }
    r->egress = net && streq(net, "egress");
    if (r->egress) {
        _cleanup_free_ char *rules = NULL;
        if (egress_ruleset(json_object_get(spec, "egress_allow"), &rules, err) < 0)
            return -EINVAL;
    }
    char runs[PATH_MAX];
    int rc = path_join(runs, sizeof runs, n->cfg.state_dir, "runs");
    if (rc >= 0)
        rc = path_join(r->dir, sizeof r->dir, runs, id->sandbox);
    if (rc >= 0 && snprintf(r->sock_path, sizeof r->sock_path, "%s/br/a.sock", r->dir) >=
                       (int)sizeof r->sock_path)
        rc = -ENAMETOOLONG;
    if (rc < 0) {
        return sbx_err(err, rc, "state directory path too long");
    }
    json_int_t disk_mb = 0;
    (void)json_unpack(json_object_get(spec, "flavor"), "{s?I}", "disk_mb", &disk_mb);
    if (disk_mb <= 0 || disk_mb > (json_int_t)16 << 20)
        disk_mb = RUN_DISK_DEFAULT_MB;
    r->disk_bytes = (uint64_t)disk_mb << 20;
    /* the disk must fit beside every other run's, each as full as its flavor allows; a root
     * kept in place (a local resume) is already counted as the old run's */
    const char *restore =
        json_string_value(json_object_get(json_object_get(spec, "restore"), "mode"));
    bool kept = old && restore && streq(restore, "local");
    int64_t room = node_disk_room(n, old);
    if (!kept && room < disk_mb << 20) {
        return sbx_err(err, -ENOSPC,
                       "the node's disk has room for %lld MiB more of runs' disks; this "
                       "run's is %lld MiB",
                       (long long)(room > 0 ? room >> 20 : 0), (long long)disk_mb);
    }
    /* A sandbox keeps its id block on this node from run to run (its kept root is owned by
     * it); a new one takes a free block. */
    if (old)
        r->id_base = old->id_base;
    else if ((rc = idrange_take(&n->ids, &r->id_base)) < 0) {
        return sbx_err(err, rc, "no free block of ids for a user namespace (%u in use)",
                       n->ids.n_used);
    }
    if (old) {
        run_stop(n, old);
        run_unlink(n, old);
        run_free(old);
    }
    *ret = TAKE_PTR(r);
    return 0;
}

/* The install ended (rc): a failed run is kept as exited (its directory and log are found
 * again; it serves nothing), its disk unmounted and its loop device released at once (a retry
 * from the same root mounts it again; a retire removes the directory); either way it becomes
 * the sandbox's record. */
void run_install_finish(node_t *n, run_t *r, int rc)
{
    if (rc < 0) {
        if (r->pid > 0 || r->pasta_pid > 0 || r->holder_pid > 0)
            run_stop(n, r);
        r->state = RUN_EXITED;
        run_unmount_disk(r); /* failed install: nothing may hold the node's mounts */
    }
    r->installing = false;
    r->next = n->runs;
    n->runs = r;
    n->n_runs++;
    (void)run_save(r);
}

/* A tar archive of a stopped run's root, to be fetched by the node that resumes it: tar runs
 * as a helper the loop does not wait for; the requester gets the file when it is complete. */
static void archive_done(helper_t *h, int wstatus)
{
    conn_t *c = h->conn;
    int fd = open(h->path, O_RDONLY | O_CLOEXEC);
    (void)unlink(h->path);
    if (!c) {
        safe_close(fd);
        return;
    }
    conn_set_handler(c, NULL, NULL);
    struct stat st;
    if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0 || fd < 0 || fstat(fd, &st) < 0) {
        safe_close(fd);
        http_internal_error(c, 0, "state archive: tar failed (status 0x%x)", wstatus);
        return;
    }
    conn_respond_file(c, fd, 0, (uint64_t)st.st_size);
}

static void archive_requester_gone(conn_t *c, bool aborted)
{
    helper_t *h = c->hdata;
    (void)aborted;
    h->conn = NULL;
}

static const handler_ops_t archive_ops = { .on_close = archive_requester_gone };

int run_state_archive_start(node_t *n, run_t *r, conn_t *c)
{
    char root[PATH_MAX + 8];
    if (r->state == RUN_RUNNING)
        return -EBUSY;
    _cleanup_free_ helper_t *h = calloc(1, sizeof *h);
    if (!h)
        return -ENOMEM;
    (void)path_join(root, sizeof root, r->dir, "root");
    char img[PATH_MAX + 16];
    sbx_err_t err;
    (void)path_join(img, sizeof img, r->dir, "disk.img");
    if (access(img, F_OK) == 0 && disk_mount(img, root, &err) < 0) {
        log_warn("run %s: %s", r->id.sandbox, err.msg);
        return -EIO;
    }
    char rnd[9];
    (void)snprintf(rnd, sizeof rnd, "%08x", randombytes_random());
    (void)snprintf(h->path, sizeof h->path, "%s/state-%s.tar", r->dir, rnd);
    /* tar reads the root as root of a user namespace with the run's mapping: it follows no
     * link out of the tree with host privileges, reads only what the run's ids may, and
     * records ownership relative to the run (0..65535), which the new node maps onto its own
     * block. Sparse files stay sparse. */
    _cleanup_close_ int rootfd = open(root, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (rootfd < 0)
        return negative_errno();
    _cleanup_close_ int out =
        open(h->path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (out < 0)
        return negative_errno();
    char *const argv[] = { "/bin/tar",
                           "-c",
                           "--numeric-owner",
                           "--one-file-system",
                           "--sparse",
                           "--exclude=./lost+found",
                           "--exclude=./work",
                           "-f",
                           "-",
                           ".",
                           NULL };
    pid_t pid;
    int rc = userns_spawn(r->id_base, IDRANGE_BLOCK, rootfd, -1, out, argv, &pid);
    if (rc < 0) {
        (void)unlink(h->path);
        return rc;
    }
    h->done = archive_done;
    h->conn = c;
    helper_adopt(n, h, pid);
    conn_set_handler(c, &archive_ops, TAKE_PTR(h));
    return 0;
}

/* A retired run's directory that a restart interrupted: its id block stays taken until a child
 * the loop does not wait for has removed it (helper_rmtree). */
static void load_trash(node_t *n, const char *dir, const char *name)
{
    uint64_t base;
    const char *dash = strchr(name + 7, '-');
    if (!dash || parse_u64(sv_make(name + 7, (size_t)(dash - (name + 7))), UINT32_MAX, &base) < 0)
        return;
    (void)idrange_mark(&n->ids, (uint32_t)base);
    helper_t *h = calloc(1, sizeof *h);
    if (!h || snprintf(h->path, sizeof h->path, "%s/%s", dir, name) >= (int)sizeof h->path) {
        free(h);
        return;
    }
    h->id_base = (uint32_t)base;
    if (helper_rmtree(n, h) < 0)
        free(h);
}

/* A run recorded as "installing" when the node stopped (crashed): its install never ended,
 * nobody was told it serves. Its process (pid 1 of its pid namespace: the kernel ends the rest
 * with it) and its helpers are killed if they are still the recorded ones (pid + start time),
 * its cgroups removed once it is gone, and it is kept as exited (status unknown) with its
 * directory, which the next install of the sandbox replaces or reuses. */
static void load_kill_half_installed(node_t *n, run_t *r)
{
    uint64_t st;
    bool alive = r->pid > 0 && proc_start_time(r->pid, &st) >= 0 && st == r->start_time;
    if (alive) {
        (void)kill(r->pid, SIGKILL);
        /* not our child: wait (bounded) until it is gone, its namespace with it */
        for (int i = 0; i < 500 && proc_start_time(r->pid, &st) >= 0 && st == r->start_time; i++)
            (void)nanosleep(&(struct timespec){ 0, 10 * 1000 * 1000 }, NULL);
    }
    pasta_stop(n, r);
    char cg[RUN_CGROUP_NAME_MAX];
    cgroup_remove_run(&n->cg, run_cgroup_name(r, cg));
    log_warn("run %s generation %llu was being installed when the node stopped: %s", r->id.sandbox,
             (unsigned long long)r->id.generation,
             alive ? "its process is killed" : "no process of it is left");
    r->pid = 0;
    r->state = RUN_EXITED;
    r->exit_status = -1;
    (void)run_save(r);
    run_unmount_disk(r); /* a killed node left it mounted: nothing runs on it any more */
}

/* Reload run records after a node restart. A run whose process is still the one recorded
 * (pid and start time) keeps serving; any other becomes exited (its root is kept). */
void node_load_runs(node_t *n)
{
    char dir[PATH_MAX + 8];
    (void)path_join(dir, sizeof dir, n->cfg.state_dir, "runs");
    _cleanup_(closedirp) DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (strncmp(de->d_name, ".trash-", 7) == 0) {
            load_trash(n, dir, de->d_name);
            continue;
        }
        if (de->d_name[0] == '.' || !cap_id_valid(de->d_name))
            continue;
        char path[PATH_MAX + 300];
        if (snprintf(path, sizeof path, "%s/%s/run.json", dir, de->d_name) >= (int)sizeof path)
            continue;
        json_t *j = json_load_file(path, 0, NULL);
        run_t *r = calloc(1, sizeof *r);
        if (r) {
            r->node = n;
            r->stat_fd = r->out_fd = r->log_fd = -1;
        }
        json_int_t pid = 0, start = 0, dev = 0, ino = 0, sino = 0, idb = 0, ppid = 0, pstart = 0;
        json_int_t hpid = 0, hstart = 0;
        const char *state = "", *image = "host";
        int pool = 0;
        if (!r || !j || cap_run_from_json(json_object_get(j, "run"), &r->id) < 0 ||
            json_unpack(j, "{s:s,s:I,s:I,s:I,s:I,s:I,s?b,s?I,s?s,s?I,s?I,s?I,s?I}", "state", &state,
                        "pid", &pid, "start_time", &start, "exe_dev", &dev, "exe_ino", &ino,
                        "sock_ino", &sino, "pool_host", &pool, "id_base", &idb, "image", &image,
                        "pasta_pid", &ppid, "pasta_start", &pstart, "holder_pid", &hpid,
                        "holder_start", &hstart) < 0 ||
            idb <= 0 || idb > UINT32_MAX || parse_expose(json_object_get(j, "expose"), r) < 0) {
            json_decref(j);
            free(r);
            continue;
        }
        r->pid = (pid_t)pid;
        r->start_time = (uint64_t)start;
        r->exe_dev = (dev_t)dev;
        r->exe_ino = (ino_t)ino;
        r->sock_ino = (ino_t)sino;
        r->pool_host = pool;
        r->id_base = (uint32_t)idb;
        (void)snprintf(r->image, sizeof r->image, "%s", image);
        r->pasta_pid = (pid_t)ppid; /* a previous node process's: stopped by pid + start time */
        r->pasta_start = (uint64_t)pstart;
        r->holder_pid = (pid_t)hpid;
        r->holder_start = (uint64_t)hstart;
        int mr = idrange_mark(&n->ids, r->id_base);
        if (mr == -EEXIST) {
            log_warn("run %s: id block %u is taken twice; not loaded", de->d_name, r->id_base);
            json_decref(j);
            free(r);
            continue;
        }
        if (path_join(r->dir, sizeof r->dir, dir, de->d_name) < 0 ||
            snprintf(r->sock_path, sizeof r->sock_path, "%s/br/a.sock", r->dir) >=
                (int)sizeof r->sock_path) {
            json_decref(j);
            free(r);
            continue;
        }
        uint64_t now_start;
        r->state = streq(state, "paused") ? RUN_PAUSED : RUN_EXITED;
        if (streq(state, "installing")) {
            /* the node stopped during this run's install: nothing of it serves or lives on */
            load_kill_half_installed(n, r);
            json_decref(j);
            r->next = n->runs;
            n->runs = r;
            n->n_runs++;
            continue;
        }
        if (streq(state, "running") && r->pid > 0 && proc_start_time(r->pid, &now_start) >= 0 &&
            now_start == r->start_time) {
            r->state = RUN_RUNNING; /* not our child any more: never reaped here */
            r->stat_fd = proc_stat_open(r->pid);
            struct stat sst;
            if (lstat(r->sock_path, &sst) == 0)
                r->sock_uid = sst.st_uid;
            if (output_open(n, r, false, NULL) < 0)
                log_warn("run %s: its output is not read any more", de->d_name);
        } else {
            if (streq(state, "running"))
                r->exit_status = -1; /* ended while the node was down: status unknown */
            r->pid = 0;
            if (r->state == RUN_EXITED) /* a killed node left it mounted: nothing runs on it */
                run_unmount_disk(r);
        }
        json_decref(j);
        r->next = n->runs;
        n->runs = r;
        n->n_runs++;
        log_info("loaded run %s generation %llu (%s)", r->id.sandbox,
                 (unsigned long long)r->id.generation, state_name(r->state));
    }
}
