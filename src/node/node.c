/* SPDX-License-Identifier: MIT */
#include "node.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>

#include "common/fileio.h"
#include "common/log.h"

run_t *node_find_run(node_t *n, const char *sandbox)
{
    for (run_t *r = n->runs; r; r = r->next)
        if (streq(r->id.sandbox, sandbox))
            return r;
    return NULL;
}

void node_crash_point(const node_t *n, const char *step)
{
    if (n->crash_at[0] && streq(n->crash_at, step)) {
        log_warn("SBX_TEST_CRASH_AT=%s: the node exits here (a test's fault injection)", step);
        _exit(137);
    }
}

/* What the heartbeat thread tells the control plane: each run's identity and state, and the
 * room left for runs' disks. */
static void report_runs(loop_t *l, timer_t_ *t)
{
    node_t *n = t->data;
    json_t *arr = json_array();
    for (run_t *r = n->runs; arr && r; r = r->next) {
        const char *st = r->state == RUN_RUNNING  ? "running"
                         : r->state == RUN_PAUSED ? "paused"
                                                  : "exited";
        json_array_append_new(
            arr, json_pack("{s:s,s:I,s:s,s:s,s:i,s:I}", "sandbox", r->id.sandbox, "generation",
                           (json_int_t)r->id.generation, "activation", r->id.activation, "state",
                           st, "exit_status", r->exit_status, "leases", (json_int_t)r->n_leases));
    }
    int64_t room = node_disk_room(n, NULL);
    if (arr) {
        pthread_mutex_lock(&n->keys_lock);
        json_decref(n->runs_report);
        n->runs_report = arr;
        n->disk_room_mb = room >> 20; /* rounded down: never more than there is */
        pthread_mutex_unlock(&n->keys_lock);
    }
    (void)timer_arm(l, t, 500);
}

static int mkdir_p0700(const char *p)
{
    if (mkdir(p, 0700) < 0 && errno != EEXIST)
        return negative_errno();
    return chmod(p, 0700) < 0 ? negative_errno() : 0;
}

/* <state>/used-ids: the single-use ids of manage capabilities this node has taken and that
 * have not expired, one "<hex id> <until>" a line, written before the call they authorize
 * runs; loaded at start, so a restart does not make a used capability good again. */
static void used_ids_path(const node_t *n, char *out, size_t cap)
{
    (void)snprintf(out, cap, "%s/used-ids", n->cfg.state_dir);
}

int node_used_ids_save(node_t *n)
{
    char path[PATH_MAX + 16];
    used_ids_path(n, path, sizeof path);
    size_t line = 2 * CAP_NONCE_BYTES + 24, len = 0;
    _cleanup_free_ char *buf = malloc(n->replay.n * line + 1);
    if (!buf)
        return -ENOMEM;
    for (size_t i = 0; i < n->replay.n; i++) {
        char hex[2 * CAP_NONCE_BYTES + 1];
        (void)sodium_bin2hex(hex, sizeof hex, n->replay.slots[i].nonce, CAP_NONCE_BYTES);
        len += (size_t)snprintf(buf + len, line + 1, "%s %lld\n", hex,
                                (long long)n->replay.slots[i].until);
    }
    return file_write_atomic(path, buf, len, 0600);
}

static int used_ids_load(node_t *n)
{
    char path[PATH_MAX + 16];
    used_ids_path(n, path, sizeof path);
    FILE *f = fopen(path, "re");
    if (!f)
        return errno == ENOENT ? 0 : negative_errno();
    char l[160];
    int64_t now = (int64_t)time(NULL);
    while (fgets(l, sizeof l, f) && n->replay.n < CAP_REPLAY_SLOTS) {
        /* "<2 * CAP_NONCE_BYTES hex> <until>\n"; a line that is not is skipped */
        cap_replay_slot_t *sl = &n->replay.slots[n->replay.n];
        size_t hl = 2 * CAP_NONCE_BYTES, bin;
        uint64_t until;
        l[strcspn(l, "\n")] = '\0';
        if (strlen(l) <= hl + 1 || l[hl] != ' ' ||
            sodium_hex2bin(sl->nonce, CAP_NONCE_BYTES, l, hl, NULL, &bin, NULL) != 0 ||
            bin != CAP_NONCE_BYTES || parse_u64_str(l + hl + 1, INT64_MAX, &until) < 0)
            continue;
        if ((int64_t)until > now) {
            sl->until = (int64_t)until;
            n->replay.n++;
        }
    }
    fclose(f);
    return 0;
}

int node_init(node_t *n, const node_config_t *cfg, const httpd_config_t *scfg)
{
    *n = (node_t){ .cfg = *cfg };
    const char *crash = getenv("SBX_TEST_CRASH_AT");
    if (crash && strlen(crash) < sizeof n->crash_at)
        memcpy(n->crash_at, crash, strlen(crash) + 1);
    pthread_mutex_init(&n->keys_lock, NULL);
    pthread_mutex_init(&n->tls_lock, NULL);
    timer_init(&n->report_t, report_runs, n); /* first: node_done disarms it */
    struct stat st;
    if (stat(cfg->agent_bin, &st) < 0 || !S_ISREG(st.st_mode)) {
        log_error("agent binary %s: %s", cfg->agent_bin, strerror(errno ?: EINVAL));
        return -ENOENT;
    }
    char runs[PATH_MAX + 8];
    (void)snprintf(runs, sizeof runs, "%s/runs", cfg->state_dir);
    int r = mkdir_p0700(cfg->state_dir);
    if (r >= 0)
        r = mkdir_p0700(runs);
    if (r < 0) {
        log_error("state directory %s: %s", cfg->state_dir, strerror(-r));
        return r;
    }
    r = used_ids_load(n);
    if (r < 0) {
        log_error("%s/used-ids: %s", cfg->state_dir, strerror(-r));
        return r;
    }
    /* the node's parent cgroups: named after the node and its state directory (its path and
     * its device and inode: one path may name different directories in different mount
     * namespaces, two `sbx up` with the default /var/lib/sbx in two containers), so that two
     * nodes of one name on a machine never remove each other's; a restart on the same state
     * finds its own again */
    char tag[96];
    uint32_t h = 2166136261u; /* FNV-1a */
    for (const char *c = cfg->state_dir; *c; c++)
        h = (h ^ (uint8_t)*c) * 16777619u;
    struct stat sst;
    if (stat(cfg->state_dir, &sst) == 0) {
        uint64_t id[2] = { (uint64_t)sst.st_dev, (uint64_t)sst.st_ino };
        for (size_t i = 0; i < sizeof id; i++)
            h = (h ^ ((const uint8_t *)id)[i]) * 16777619u;
    }
    (void)snprintf(tag, sizeof tag, "sbx-node-%s-%08x", cfg->name, h);
    cgroups_init(&n->cg, tag);
    r = idrange_init(&n->ids, cfg->id_start, cfg->id_count);
    if (r < 0) {
        log_error("id range %u:%u: %s", cfg->id_start, cfg->id_count, strerror(-r));
        return r;
    }
    r = seccomp_run_filter_build(&n->filter_run, false);
    if (r >= 0)
        r = seccomp_run_filter_build(&n->filter_pool, true);
    if (r < 0) {
        log_error("cannot build the runs' seccomp profiles: %s", strerror(-r));
        return r;
    }
    /* the dynamic linker's cache of the host programs runs see (a fresh run's /etc gets it) */
    FILE *lc = fopen("/etc/ld.so.cache", "re");
    if (lc) {
        char *buf = NULL;
        size_t len = 0;
        FILE *mem = open_memstream(&buf, &len);
        char chunk[8192];
        size_t k;
        while (mem && (k = fread(chunk, 1, sizeof chunk, lc)) > 0 && len < (8u << 20))
            (void)fwrite(chunk, 1, k, mem);
        if (mem && fclose(mem) == 0) {
            n->ld_cache = buf;
            n->ld_cache_len = len;
        } else
            free(buf);
        fclose(lc);
    }
    r = httpd_init(&n->srv, scfg);
    if (r < 0)
        return r;
    n->srv.dispatch = node_dispatch;
    n->srv.app = n;
    r = node_tls_init(n);
    if (r < 0)
        return r;
    /* Runs are our children (reaped through the registry); install threads wait for their own
     * tar and rm. Orphans go to init, not to us: nothing here would reap them. */
    n->srv.reaper.registered_only = true;
    (void)prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0);
    /* images before registration: the first report holds what this node verified */
    r = node_images_init(n);
    if (r < 0 || (r = node_images_start(n)) < 0)
        return r;
    node_load_runs(n);
    node_token_load(n);
    node_keyset_load(n);
    report_runs(n->srv.loop, &n->report_t);
    return node_agent_start(n);
}

int node_run(node_t *n) { return httpd_run(&n->srv); }

void node_done(node_t *n)
{
    node_agent_stop(n);
    node_images_stop(n);
    if (n->srv.loop)
        install_abandon_all(n);
    /* A node going down stops its runs (their roots stay): nothing runs unsupervised. */
    for (run_t *r = n->runs; r; r = r->next)
        if (r->state == RUN_RUNNING || r->pasta_pid > 0 || r->holder_pid > 0)
            run_stop(n, r);
    while (n->runs) {
        run_t *r = n->runs;
        n->runs = r->next;
        /* nothing runs on it any more: a restarted node mounts it again when it needs it */
        run_unmount_disk(r);
        run_free(r);
    }
    if (n->srv.loop)
        timer_disarm(n->srv.loop, &n->report_t);
    httpd_done(&n->srv);
    cgroups_done(&n->cg);
    idrange_done(&n->ids);
    seccomp_filter_done(&n->filter_run);
    seccomp_filter_done(&n->filter_pool);
    free(n->ld_cache);
    json_decref(n->runs_report);
    node_tls_done(n);
    pthread_mutex_destroy(&n->keys_lock);
}
