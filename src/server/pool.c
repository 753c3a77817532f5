/* SPDX-License-Identifier: MIT */
/* Pool host mode: the sandbox registry, create/delete/list, teardown and idle eviction.
 * Everything runs on the server's one event-loop thread, so "reserve a capacity slot",
 * "check deleted, then spawn" and "delete" cannot interleave. */
#include "pool.h"

#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <sodium.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>

#include "common/env.h"
#include "common/log.h"
#include "envd.h"
#include "fsops.h"
#include "isolation/confine.h"
#include "isolation/netns.h"
#include "janitor.h"
#include "proc.h"
#include "routes.h"
#include "server.h"
#include "spawner.h"

#define DEFAULT_MAX_PROCS 256
#define DEFAULT_MAX_MEM_MB 2048
#define TEARDOWN_ROUNDS 100
#define FLATTEN_DEPTH 128   /* well inside the depth fs_delete walks */
#define FLATTEN_PASSES 1024 /* deep branches one teardown takes apart */

static unsigned hash_id(const pool_t *p, const char *id, size_t len)
{
    unsigned h = 2166136261u;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)id[i]) * 16777619u;
    return h & p->bucket_mask;
}

sandbox_t *pool_find(pool_t *p, const char *id, size_t len)
{
    if (len != 16)
        return NULL;
    for (sandbox_t *sb = p->buckets[hash_id(p, id, len)]; sb; sb = sb->hnext)
        if (memcmp(sb->id, id, 16) == 0)
            return sb;
    return NULL;
}

static void pool_link(pool_t *p, sandbox_t *sb)
{
    unsigned h = hash_id(p, sb->id, 16);
    sb->hnext = p->buckets[h];
    p->buckets[h] = sb;
    sb->prev = p->last;
    if (p->last)
        p->last->next = sb;
    else
        p->first = sb;
    p->last = sb;
    p->count++;
    if (sb->idle_timeout_ms > 0) {
        sb->tnext = p->timed_first;
        if (p->timed_first)
            p->timed_first->tprev = sb;
        p->timed_first = sb;
    }
}

static void pool_unlink(pool_t *p, sandbox_t *sb)
{
    for (sandbox_t **pp = &p->buckets[hash_id(p, sb->id, 16)]; *pp; pp = &(*pp)->hnext)
        if (*pp == sb) {
            *pp = sb->hnext;
            break;
        }
    if (sb->prev)
        sb->prev->next = sb->next;
    else
        p->first = sb->next;
    if (sb->next)
        sb->next->prev = sb->prev;
    else
        p->last = sb->prev;
    sb->hnext = sb->prev = sb->next = NULL;
    p->count--;
    if (sb->idle_timeout_ms > 0) {
        if (sb->tprev)
            sb->tprev->tnext = sb->tnext;
        else
            p->timed_first = sb->tnext;
        if (sb->tnext)
            sb->tnext->tprev = sb->tprev;
        sb->tprev = sb->tnext = NULL;
    }
}

sandbox_t *sandbox_ref(sandbox_t *sb)
{
    if (sb)
        sb->refs++;
    return sb;
}

sandbox_t *sandbox_hold(sandbox_t *sb)
{
    if (sb)
        sb->ops++;
    return sandbox_ref(sb);
}

void sandbox_release(sandbox_t *sb)
{
    if (!sb)
        return;
    sb->ops--;
    if (!sb->deleted) /* after a delete, sb->pool may be gone (shutdown) */
        sb->last_activity_ms = loop_now_ms(sb->pool->srv->loop);
    sandbox_unref(sb);
}

static void sandbox_owner_release(void *owner) { sandbox_release(owner); }
const conn_owner_ops_t sandbox_owner_ops = { .release = sandbox_owner_release };

int conn_scope_sandbox(conn_t *c, sandbox_t *sb)
{
    int r = sandbox_handles(sb);
    if (r < 0)
        return r;
    conn_set_owner(c, &sandbox_owner_ops, sandbox_hold(sb));
    return 0;
}

void sandbox_unref(sandbox_t *sb)
{
    if (!sb || --sb->refs > 0)
        return;
    /* The ruleset fd is closed only now, so a spawn that holds a reference never sees it
     * closed (or its number reused) under it. */
    safe_close(sb->ruleset_fd);
    safe_close(sb->home_fd);
    safe_close(sb->netns_fd);
    for (int i = 0; i < 4 && sb->cg_fds[i] >= 0; i++)
        safe_close(sb->cg_fds[i]);
    strv_free(sb->env);
    sodium_memzero(sb->token, sizeof sb->token);
    free(sb);
}

const char *sandbox_confinement(const sandbox_t *sb)
{
    return sb->landlocked ? "landlock" : "uid-only";
}

/* ---- handles ----------------------------------------------------------------------------- */

/* An idle sandbox needs one descriptor, its network namespace (nothing else keeps that alive).
 * Its home (O_PATH), its Landlock ruleset and its cgroup.procs files can be opened again when
 * it is used: the handles_max sandboxes used last keep theirs, the others close them, so that
 * 10,000 live sandboxes fit a 20,000-entry descriptor table. Only a sandbox nothing holds (no
 * request, spawn or process: refs == 1, the registry's) closes them, so a descriptor is never
 * closed under its user. */
static void lru_unlink(pool_t *p, sandbox_t *sb)
{
    if (!sb->lru_prev && p->lru_first != sb)
        return; /* not in the list */
    if (sb->lru_prev)
        sb->lru_prev->lru_next = sb->lru_next;
    else
        p->lru_first = sb->lru_next;
    if (sb->lru_next)
        sb->lru_next->lru_prev = sb->lru_prev;
    else
        p->lru_last = sb->lru_prev;
    sb->lru_prev = sb->lru_next = NULL;
    p->n_handles--;
}

static void lru_push_front(pool_t *p, sandbox_t *sb)
{
    if (p->lru_first == sb)
        return;
    lru_unlink(p, sb);
    sb->lru_next = p->lru_first;
    if (p->lru_first)
        p->lru_first->lru_prev = sb;
    else
        p->lru_last = sb;
    p->lru_first = sb;
    p->n_handles++;
}

static void handles_close(sandbox_t *sb)
{
    sb->home_fd = safe_close(sb->home_fd);
    sb->ruleset_fd = safe_close(sb->ruleset_fd);
    for (int i = 0; i < 4 && sb->cg_fds[i] >= 0; i++)
        sb->cg_fds[i] = safe_close(sb->cg_fds[i]);
    sb->cg_fds[0] = -1;
}

/* Close the handles of the least recently used sandboxes beyond handles_max that nothing
 * holds (a bounded look from the list's end: a held one is skipped, tried again later). */
static void handles_trim(pool_t *p)
{
    sandbox_t *sb = p->lru_last;
    for (unsigned look = 0; sb && p->n_handles > p->handles_max && look < 16; look++) {
        sandbox_t *prev = sb->lru_prev;
        if (sb->refs == 1) { /* requests, spawns and processes each hold a reference */
            lru_unlink(p, sb);
            handles_close(sb);
        }
        sb = prev;
    }
}

int sandbox_handles(sandbox_t *sb)
{
    pool_t *p = sb->pool;
    if (sb->deleted)
        return -ESRCH;
    bool reopened = false;
    if (sb->home_fd < 0) {
        /* by name beneath the homes (root's, 0711: the sandbox cannot rename its home) */
        sb->home_fd =
            openat(p->homes_fd, sb->home_name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sb->home_fd < 0)
            return negative_errno();
        reopened = true;
    }
    if (sb->landlocked && sb->ruleset_fd < 0) {
        int r = landlock_ruleset_for_home(&p->ll, sb->home_fd, &sb->ruleset_fd);
        if (r < 0)
            return r;
        reopened = true;
    }
    if (reopened)
        p->handles_reopened++;
    lru_push_front(p, sb);
    handles_trim(p);
    return 0;
}

/* ---- setup ------------------------------------------------------------------------------- */

static void netns_refill(loop_t *l, timer_t_ *t);

/* The warm directory beside the homes, like the trash (root 0700, same filesystem); -1 if
 * it cannot be had (creates then make homes on the loop, as before). */
static int warm_open(pool_t *p, const struct stat *hs)
{
    struct stat ws;
    if (snprintf(p->warm_path, sizeof p->warm_path, "%s.warm", p->cfg.homes_dir) >=
        (int)sizeof p->warm_path)
        return -1;
    (void)mkdir(p->warm_path, 0700);
    int fd = open(p->warm_path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &ws) < 0 || ws.st_dev != hs->st_dev ||
        (ws.st_uid != 0 && fchown(fd, 0, 0) < 0) ||
        ((ws.st_mode & 07777) != 0700 && fchmod(fd, 0700) < 0)) {
        safe_close(fd);
        p->warm_path[0] = '\0';
        return -1;
    }
    return fd;
}

static void netns_back(void *data, int op, int fd, int r);
static void netns_want(pool_t *p);
static void creates_pump(pool_t *p);
static int remove_tree(int parent_fd, const char *name, int home_fd);

/* Whether a uid may go to the warm set without a create ever lacking one: more uids free than
 * the creates capacity still allows (a uid being made a home is no create's until the janitor
 * answers). held: the uid in question is taken already (counted as if it were free). */
static bool uids_spare(const pool_t *p, bool held)
{
    const uidpool_t *u = &p->uids;
    uint64_t taken = u->n_used + u->n_quarantined + u->n_reserved;
    uint64_t free_uids = u->count > taken ? u->count - taken : 0;
    /* the slots waiting requests reserved still need a uid each */
    uint64_t reserved = p->reserved - p->create_slots;
    uint64_t creates = p->cfg.capacity > reserved ? p->cfg.capacity - reserved : 0;
    return free_uids + (held ? 1 : 0) > creates;
}

/* Ask the janitor for a warm home for uid (taken, and spare: uids_spare), made fresh (after
 * removing trash/name, when set); false when it is not asked (the uid stays the caller's). */
static bool warm_ask(pool_t *p, const char *name, uint32_t uid)
{
    if (p->n_warm + p->n_warm_wait >= POOL_HOMES_WARM_MAX)
        return false;
    pool_warm_t *w = &p->warm_wait[p->n_warm_wait];
    (void)snprintf(w->name, sizeof w->name, "w%llu", (unsigned long long)++p->warm_seq);
    w->uid = uid;
    if ((name ? janitor_recycle_home(p->srv->janitor, name, w->name, uid)
              : janitor_make_home(p->srv->janitor, w->name, uid)) < 0)
        return false;
    p->n_warm_wait++;
    return true;
}

/* Ask the janitor for homes until the warm set (made + being made) is full, each for a uid
 * taken now: held by the warm home until a create takes both. */
static void warm_refill(pool_t *p)
{
    while (p->warm_fd >= 0 && p->srv->janitor && p->n_warm + p->n_warm_wait < POOL_HOMES_WARM &&
           uids_spare(p, false)) {
        uint32_t uid;
        if (uidpool_take(&p->uids, &uid) < 0)
            return;
        if (!warm_ask(p, NULL, uid)) {
            uidpool_release(&p->uids, uid, true); /* nothing ever ran as it since */
            return;
        }
    }
}

/* The janitor's answer for a warm home (name NULL: one it was asked for died with it). */
static void warm_made(void *data, const char *name, int r)
{
    pool_t *p = data;
    size_t i = 0;
    while (name && i < p->n_warm_wait && !streq(p->warm_wait[i].name, name))
        i++;
    if (i >= p->n_warm_wait) {
        if (name || p->n_warm_wait == 0)
            return; /* not asked of it: cannot happen */
        i = p->n_warm_wait - 1;
    }
    pool_warm_t w = p->warm_wait[i];
    p->warm_wait[i] = p->warm_wait[--p->n_warm_wait];
    p->warm_failing = r < 0; /* waiting creates then make homes themselves (create_ready) */
    if (r >= 0 && p->n_warm < POOL_HOMES_WARM_MAX) {
        p->warm[p->n_warm++] = w;
        creates_pump(p);
        return;
    }
    if (r >= 0 || !name) /* no room (cannot happen: asked only for room); or the janitor died
                          * with it, maybe half made */
        (void)remove_tree(p->warm_fd, w.name, -1);
    /* no home for it: the uid goes back (its last teardown, if any, was verified) */
    uidpool_release(&p->uids, w.uid, true);
    creates_pump(p); /* a waiting create may now have to make its home itself */
}

/* At start no sandbox exists: a home in a shard is an earlier run's (a host killed, or a
 * paused run resumed from its kept disk). Each goes into the trash (trash_fd >= 0: the janitor's
 * sweep at its start empties it) or is removed here, so that its files never wait, owned by a
 * uid this run hands out again, for Landlock alone to keep the next tenant of that uid out. */
static void leftovers_drop(pool_t *p, int trash_fd)
{
    unsigned moved = 0, failed = 0;
    for (unsigned i = 0; i < POOL_HOME_SHARDS; i++) {
        char shard[4];
        (void)snprintf(shard, sizeof shard, "%02x", i);
        _cleanup_close_ int sfd =
            openat(p->homes_fd, shard, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        int dfd = sfd >= 0 ? fcntl(sfd, F_DUPFD_CLOEXEC, 3) : -1;
        DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
        if (!d) {
            safe_close(dfd);
            continue;
        }
        struct dirent *de;
        while ((de = readdir(d))) {
            char to[NAME_MAX + 16];
            if (streq(de->d_name, ".") || streq(de->d_name, ".."))
                continue;
            (void)snprintf(to, sizeof to, "%.200s-old%u", de->d_name, moved + failed);
            if ((trash_fd >= 0 &&
                 renameat2(sfd, de->d_name, trash_fd, to, RENAME_NOREPLACE) == 0) ||
                remove_tree(sfd, de->d_name, -1) >= 0)
                moved++;
            else
                failed++;
        }
        closedir(d);
    }
    if (moved + failed > 0)
        log_info("%u home(s) of an earlier run removed from %s%s", moved, p->cfg.homes_dir,
                 failed ? " (some could not be)" : "");
}

/* The trash beside the homes: made (or taken over from an earlier run: the janitor empties it)
 * root-owned 0700, on the same filesystem so that a delete is one rename. Without it deletes
 * remove homes on the loop. */
static void trash_open(pool_t *p)
{
    struct stat hs, ts;
    if (snprintf(p->trash_path, sizeof p->trash_path, "%s.trash", p->cfg.homes_dir) >=
        (int)sizeof p->trash_path)
        return;
    (void)mkdir(p->trash_path, 0700);
    _cleanup_close_ int fd = open(p->trash_path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &ts) < 0 || fstat(p->homes_fd, &hs) < 0 || ts.st_dev != hs.st_dev ||
        (ts.st_uid != 0 && fchown(fd, 0, 0) < 0) ||
        ((ts.st_mode & 07777) != 0700 && fchmod(fd, 0700) < 0)) {
        log_warn("no trash directory %s beside the homes: deletes remove homes on the loop",
                 p->trash_path);
        p->trash_path[0] = '\0';
        leftovers_drop(p, -1);
        return;
    }
    leftovers_drop(p, fd);
    int warm = warm_open(p, &hs);
    int r = janitor_new(p->srv, fd, warm, warm_made, netns_back, p, &p->srv->janitor);
    if (r < 0) {
        safe_close(warm);
        log_warn("cannot start the janitor: %s; deletes remove homes on the loop", strerror(-r));
        p->trash_path[0] = '\0';
        return;
    }
    p->trash_fd = TAKE_FD(fd);
    p->warm_fd = warm;
    warm_refill(p);
}

/* The homes' shards (POOL_HOME_SHARDS), made here or taken over from an earlier run when each
 * is a directory of root's (not a link: a home is opened by a path through its shard), 0711:
 * a sandbox reaches its own home's name and nothing else. */
static int shards_make(pool_t *p, sbx_err_t *err)
{
    for (unsigned i = 0; i < POOL_HOME_SHARDS; i++) {
        char name[4];
        struct stat st;
        (void)snprintf(name, sizeof name, "%02x", i);
        if (mkdirat(p->homes_fd, name, 0711) < 0 && errno != EEXIST)
            return sbx_err(err, negative_errno(), "cannot create %s/%s: %s", p->cfg.homes_dir, name,
                           strerror(errno));
        if (fstatat(p->homes_fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
            return sbx_err(err, negative_errno(), "cannot stat %s/%s: %s", p->cfg.homes_dir, name,
                           strerror(errno));
        if (!S_ISDIR(st.st_mode) || st.st_uid != 0)
            return sbx_err(err, -EPERM,
                           "%s/%s is not a directory of root's; refusing to start (a home "
                           "is reached through it)",
                           p->cfg.homes_dir, name);
        if ((st.st_mode & 07777) != 0711 && fchmodat(p->homes_fd, name, 0711, 0) < 0)
            return sbx_err(err, negative_errno(), "cannot chmod %s/%s: %s", p->cfg.homes_dir, name,
                           strerror(errno));
    }
    return 0;
}

/* At shutdown, after every home: the shards that are empty (one that is not stays, with what
 * an earlier failure left in it). */
static void shards_remove(pool_t *p)
{
    for (unsigned i = 0; i < POOL_HOME_SHARDS && p->homes_fd >= 0; i++) {
        char name[4];
        (void)snprintf(name, sizeof name, "%02x", i);
        (void)unlinkat(p->homes_fd, name, AT_REMOVEDIR);
    }
}

/* Remove every entry of dir (by descriptor, as a delete does). */
static void sweep_dir(int dir)
{
    int fd = openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        safe_close(fd);
        return;
    }
    struct dirent *de;
    while ((de = readdir(d)))
        if (!streq(de->d_name, ".") && !streq(de->d_name, ".."))
            (void)remove_tree(dir, de->d_name, -1);
    closedir(d);
}

/* At shutdown: the janitor is gone; what it had not removed goes now (and the warm homes never
 * taken), then the directories. */
int pool_trash_name(sandbox_t *sb, char *name, size_t cap)
{
    pool_t *p = sb->pool;
    if (p->trash_fd < 0 || !p->srv->janitor)
        return -1;
    (void)snprintf(name, cap, "%s-f%llu", sb->id, (unsigned long long)++p->trash_seq);
    return p->trash_fd;
}

void pool_trash_drop(pool_t *p, const char *name)
{
    if (p->srv->janitor && janitor_remove(p->srv->janitor, name) >= 0)
        return;
    (void)pool_remove_tree_at(p->trash_fd, name); /* no janitor to take it: here */
}

static void trash_close(pool_t *p)
{
    if (p->trash_fd >= 0)
        sweep_dir(p->trash_fd);
    p->trash_fd = safe_close(p->trash_fd);
    if (p->trash_path[0])
        (void)rmdir(p->trash_path);
    if (p->warm_fd >= 0)
        sweep_dir(p->warm_fd);
    p->n_warm = p->n_warm_wait = 0; /* their uids go with the pool's */
    p->warm_fd = safe_close(p->warm_fd);
    if (p->warm_path[0])
        (void)rmdir(p->warm_path);
}

int pool_new(server_t *srv, const pool_config_t *cfg, pool_t **ret, sbx_err_t *err)
{
    _cleanup_(pool_freep) pool_t *p = calloc(1, sizeof *p);
    int r;
    if (!p)
        return sbx_err(err, -ENOMEM, "out of memory");
    p->srv = srv;
    p->cfg = *cfg;
    p->homes_fd = -EBADF;
    p->trash_fd = -EBADF;
    p->warm_fd = -EBADF;
    const char *tk = getenv("SBX_TEST_TEARDOWN_KILL_FAILS");
    p->test_kill_fails = tk && streq(tk, "1");
    if (p->test_kill_fails)
        log_warn("SBX_TEST_TEARDOWN_KILL_FAILS=1: teardown will not kill (a test knob)");
    const char *cf = getenv("SBX_TEST_CREATE_FAILS_AT");
    if (cf && parse_u64_str(cf, UINT64_MAX, &p->test_create_fail_at) >= 0 &&
        p->test_create_fail_at > 0)
        log_warn("SBX_TEST_CREATE_FAILS_AT=%s: that create will fail (a test knob)", cf);
    p->uids.lock_fd = -1; /* pool_free may run before uidpool_init */
    p->ns = (sandbox_ns_t){ .holder = -1, .ns_fd = -EBADF, .release_fd = -EBADF };
    timer_init(&p->netns_refill, netns_refill, p);
    unsigned n = POOL_BUCKETS_MIN;
    while (n < cfg->capacity && n < (1u << 20))
        n <<= 1;
    p->buckets = calloc(n, sizeof *p->buckets);
    if (!p->buckets)
        return sbx_err(err, -ENOMEM, "out of memory");
    p->bucket_mask = n - 1;
    /* sandbox_put_json writes each home as this and its id (hex): escaped once, here */
    json_t *hs = json_string(cfg->homes_dir);
    char *q = hs ? json_dumps(hs, JSON_ENCODE_ANY) : NULL;
    json_decref(hs);
    if (!q)
        return sbx_err(err, -EINVAL, "SBX_HOMES_DIR is not valid UTF-8");
    q[strlen(q) - 1] = '\0';
    memmove(q, q + 1, strlen(q)); /* without its quotes */
    p->homes_json = q;

    int abi = landlock_abi();
    if ((uint64_t)abi < cfg->min_abi && !cfg->allow_unconfined) {
        char have[128];
        landlock_features(abi, have, sizeof have);
        return sbx_err(err, -EOPNOTSUPP,
                       "Landlock ABI %d is below SBX_MIN_LANDLOCK_ABI=%llu (have: %s); refusing "
                       "to start (--allow-unconfined accepts uid-only isolation)",
                       abi, (unsigned long long)cfg->min_abi, have);
    }
    /* A private /proc with hidepid in one shared mount namespace, if the kernel allows it. */
    p->hidepid = sandbox_ns_start(&p->ns) >= 0;
    if (abi >= 1 && (uint64_t)abi >= cfg->min_abi) {
        r = landlock_base_init(&p->ll, p->hidepid ? p->ns.proc_path : "/proc");
        if (r < 0)
            return sbx_err(err, r, "cannot prepare Landlock rules: %s", strerror(-r));
    }
    r = uidpool_init(&p->uids, (uint32_t)cfg->uid_base, (uint32_t)cfg->uid_count);
    if (r >= 0)
        r = uidpool_reserve_from_file(&p->uids, "/etc/passwd");
    if (r >= 0)
        r = uidpool_reserve_from_file(&p->uids, "/etc/group");
    if (r >= 0)
        r = uidpool_reserve_from_proc(&p->uids, "/proc");
    /* Other pool hosts on this kernel: /run is root's, so no one else can hold these locks. */
    if (r >= 0 && uidpool_lock_file(&p->uids, POOL_UID_LOCK_FILE) < 0)
        log_warn("cannot open %s: uids are not coordinated with other pool hosts here",
                 POOL_UID_LOCK_FILE);
    if (r < 0)
        return sbx_err(err, r, "cannot set up the uid pool: %s", strerror(-r));
    /* the parents too (a fresh run root has no /sbx): root-owned, not writable by others */
    char parent[sizeof cfg->homes_dir];
    memcpy(parent, cfg->homes_dir, sizeof parent);
    for (char *sl = strchr(parent + 1, '/'); sl; sl = strchr(sl + 1, '/')) {
        *sl = 0;
        (void)mkdir(parent, 0755);
        *sl = '/';
    }
    if (mkdir(cfg->homes_dir, 0711) < 0 && errno != EEXIST)
        return sbx_err(err, negative_errno(), "cannot create SBX_HOMES_DIR %s: %s", cfg->homes_dir,
                       strerror(errno));
    p->homes_fd = open(cfg->homes_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (p->homes_fd < 0)
        return sbx_err(err, negative_errno(), "cannot open SBX_HOMES_DIR %s: %s", cfg->homes_dir,
                       strerror(errno));
    r = shards_make(p, err);
    if (r < 0)
        return r;
    p->shards_made = true;
    trash_open(p);
    char tag[48];
    (void)snprintf(tag, sizeof tag, "sbx-pool-%d", (int)getpid());
    cgroups_init(&p->cg, tag);
    r = cgroups_seal(&p->cg);
    if (r < 0)
        return sbx_err(err, r, "cannot make the host's cgroups root's only: %s", strerror(-r));
    /* Fail closed: no host whose sandboxes would run without their filter, unless asked to
     * accept weaker isolation (then the spawn helpers start their children unfiltered). */
    r = seccomp_filter_build(&p->seccomp);
    p->have_seccomp = r >= 0;
    if (r < 0 && !cfg->allow_unconfined)
        return sbx_err(err, r,
                       "cannot build the sandboxes' seccomp filter: %s; refusing to start "
                       "(--allow-unconfined accepts sandboxes without it)",
                       strerror(-r));
    if (r < 0)
        log_warn("cannot build the sandboxes' seccomp filter: %s; --allow-unconfined: "
                 "sandboxes run without it",
                 strerror(-r));
    /* A network namespace per sandbox where the kernel allows this process to make them. */
    int nfd;
    /* Namespaces made ahead hold a descriptor each: where the table is small (a test's 200),
     * none, so that what a delete frees is a create's, not the warm set's. */
    struct rlimit rl;
    p->netns_warm_max = POOL_NETNS_WARM;
    p->handles_max = POOL_HANDLES_MAX;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        if (rl.rlim_cur / 256 < p->netns_warm_max)
            p->netns_warm_max = (size_t)(rl.rlim_cur / 256);
        /* up to 6 descriptors each (home, ruleset, 3 cgroups' procs, +1 spare): 1/32 of the
         * table holds a fifth of it at most */
        if (rl.rlim_cur / 32 < p->handles_max)
            p->handles_max = rl.rlim_cur / 32 < 4 ? 4 : (size_t)(rl.rlim_cur / 32);
    }
    if (netns_make(&nfd) >= 0) {
        p->have_netns = true;
        if (p->netns_warm_max > 0)
            p->netns_warm[p->n_netns_warm++] = nfd;
        else
            safe_close(nfd);
        if (srv->janitor)
            netns_want(p);
        else
            netns_refill(srv->loop, &p->netns_refill);
        /* A sandbox's TCP ports are its own now (nothing else shares its loopback): a service
         * may listen on them. Landlock keeps refusing TCP bind where sandboxes share one. */
        p->ll.handled_net = 0;
    } else
        log_warn("cannot make network namespaces: pooled sandboxes share the host's network");
    *ret = TAKE_PTR(p);
    return 0;
}

static void creates_refuse_all(pool_t *p);

pool_t *pool_free(pool_t *p)
{
    if (!p)
        return NULL;
    creates_refuse_all(p);
    while (p->first)
        (void)sandbox_delete(p->first, NULL);
    if (p->srv)
        p->srv->janitor = janitor_free(p->srv->janitor);
    trash_close(p);
    landlock_base_done(&p->ll);
    seccomp_filter_done(&p->seccomp);
    if (p->srv && p->srv->loop)
        timer_disarm(p->srv->loop, &p->netns_refill);
    while (p->n_netns_warm > 0)
        safe_close(p->netns_warm[--p->n_netns_warm]);
    sandbox_ns_stop(&p->ns);
    cgroups_done(&p->cg);
    uidpool_done(&p->uids);
    if (p->shards_made)
        shards_remove(p);
    safe_close(p->homes_fd);
    free(p->homes_json);
    free(p->buckets);
    free(p);
    return NULL;
}

/* ---- create ------------------------------------------------------------------------------ */

typedef struct {
    json_t *env;
    uint64_t max_procs, max_mem_mb, idle_ms;
} create_opts_t;

/* The sandbox's base environment, then its create-time env (checked by parse_create_opts),
 * which replaces a base entry of the same name. */
static int build_env(const sandbox_t *sb, json_t *env, char ***ret)
{
    char b[8][512];
    (void)snprintf(
        b[0], sizeof b[0],
        "PATH=%s/.local/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        sb->home);
    (void)snprintf(b[1], sizeof b[1], "HOME=%s", sb->home);
    (void)snprintf(b[2], sizeof b[2], "TMPDIR=%s/.tmp", sb->home);
    (void)snprintf(b[3], sizeof b[3], "USER=sbx-%s", sb->id);
    (void)snprintf(b[4], sizeof b[4], "LOGNAME=sbx-%s", sb->id);
    (void)snprintf(b[5], sizeof b[5], "SBX_SANDBOX_ID=%s", sb->id);
    (void)snprintf(b[6], sizeof b[6], "SBX_PROXY_DIR=%s/.sbx/proxy", sb->home);
    (void)snprintf(b[7], sizeof b[7], "LANG=C.UTF-8");
    char *const base[] = { b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], NULL };
    const env_overlay_t ov = { "env", env };
    const env_rules_t rules = { .replace = true };
    return env_build(base, &ov, 1, &rules, ret, NULL);
}

/* A home the janitor made ahead, with its uid: one rename into the homes (root's, 0711: the
 * uid reaches only its own home's name), nothing to chown (made 0700 for the uid in a
 * root-only directory: nothing in it is anyone else's, no symlink to follow). */
static int take_warm_home(pool_t *p, sandbox_t *sb)
{
    if (p->n_warm == 0)
        return -EAGAIN;
    pool_warm_t w = p->warm[--p->n_warm];
    warm_refill(p);
    if (renameat2(p->warm_fd, w.name, p->homes_fd, sb->home_name, RENAME_NOREPLACE) < 0) {
        uidpool_release(&p->uids, w.uid, true); /* gone (a sweep), or an id that exists */
        return -EAGAIN;
    }
    sb->uid = w.uid;
    p->homes_from_warm++;
    return 0;
}

/* The sandbox's uid and home: a warm pair, else a uid taken now and a home made here (on the
 * loop: the warm set is empty during a burst of creates). */
static int make_home(pool_t *p, sandbox_t *sb)
{
    /* Created by descriptor under the homes directory; the id is ours (hex), never a path. */
    bool warm = take_warm_home(p, sb) >= 0;
    if (!warm) {
        int r = uidpool_take(&p->uids, &sb->uid);
        if (r < 0)
            return r; /* -ENOSPC: no uid left */
        if (mkdirat(p->homes_fd, sb->home_name, 0700) < 0)
            return errno == ENOSPC ? -EDQUOT : negative_errno(); /* the disk: not the uids */
    }
    /* O_PATH: only ever a base for *at() calls and a Landlock rule. Every confined child holds
     * a copy of each sandbox's home descriptor until its execve closes them, and closing an
     * O_PATH one skips the per-directory dnotify and lock checks (a third of an exec's time
     * with 5,000 sandboxes in the host). */
    sb->home_fd = openat(p->homes_fd, sb->home_name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sb->home_fd < 0)
        return negative_errno();
    if (warm)
        return 0;
    if (fchownat(sb->home_fd, "", sb->uid, sb->uid, AT_EMPTY_PATH) < 0)
        return negative_errno();
    static const char *const dirs[] = { ".tmp", ".sbx", ".sbx/proxy" };
    for (size_t i = 0; i < ELEMENTSOF(dirs); i++)
        if (mkdirat(sb->home_fd, dirs[i], 0700) < 0 ||
            fchownat(sb->home_fd, dirs[i], sb->uid, sb->uid, AT_SYMLINK_NOFOLLOW) < 0)
            return negative_errno();
    return 0;
}

static void hex_random(char *out, size_t nbytes)
{
    unsigned char b[32];
    randombytes_buf(b, nbytes);
    (void)sodium_bin2hex(out, nbytes * 2 + 1, b, nbytes);
    sodium_memzero(b, sizeof b);
}

/* Fill the warm set of network namespaces: from a timer on the loop without a janitor; with
 * one, made there once the supply (made, being made, and deleted sandboxes' on their way back)
 * falls below half the set, then up to all of it. Refilling at every take made one namespace
 * per create in steady use, and the one a delete brought back found the set full and was torn
 * down: each sandbox cost a namespace made and one destroyed (`perf`: copy_net_ns). */
static void netns_want(pool_t *p)
{
    janitor_t *j = p->srv->janitor;
    if (!j) {
        if (!timer_armed(&p->netns_refill))
            (void)timer_arm(p->srv->loop, &p->netns_refill, 1);
        return;
    }
    size_t low = p->netns_warm_max / 2 > 0 ? p->netns_warm_max / 2 : 1;
    if (p->n_netns_warm + p->netns_making + p->netns_checking >= low)
        return;
    while (p->n_netns_warm + p->netns_making + p->netns_checking < p->netns_warm_max &&
           janitor_netns_make(j) >= 0)
        p->netns_making++;
}

static void netns_back(void *data, int op, int fd, int r)
{
    pool_t *p = data;
    (void)r;
    if (op == JANITOR_NETNS_MADE && p->netns_making > 0)
        p->netns_making--;
    if (op == JANITOR_NETNS_MADE && fd >= 0)
        p->netns_made++;
    if (op == JANITOR_NETNS_MADE)
        p->netns_failing = fd < 0;
    if (op == JANITOR_NETNS_CHECKED) {
        if (p->netns_checking > 0)
            p->netns_checking--;
        if (fd >= 0)
            p->netns_recycled++;
        else
            p->netns_discarded++;
    }
    if (fd >= 0 && p->netns_warm_max == 0)
        fd = safe_close(fd);
    if (fd >= 0 && p->n_netns_warm >= p->netns_warm_max) {
        /* full: the oldest goes (one closed either way), the one back is taken next */
        safe_close(p->netns_warm[0]);
        memmove(p->netns_warm, p->netns_warm + 1, (p->n_netns_warm - 1) * sizeof(int));
        p->n_netns_warm--;
    }
    if (fd >= 0)
        p->netns_warm[p->n_netns_warm++] = fd;
    if (fd < 0 && r != -EPIPE)
        netns_want(p); /* one that did not come back; not after a janitor died (no loop) */
    creates_pump(p);
}

/* A network namespace for a new sandbox: one made ahead if there is one, else a fresh one. */
static int netns_take(pool_t *p, int *ret_fd)
{
    int r = 0;
    if (p->n_netns_warm > 0)
        *ret_fd = p->netns_warm[--p->n_netns_warm];
    else
        r = netns_make(ret_fd);
    netns_want(p);
    return r;
}

/* A deleted sandbox's namespace, its processes verified gone: to the janitor, which hands it
 * back for the next sandbox only if it is as pristine as a fresh one (janitor.h). */
static void netns_return(pool_t *p, sandbox_t *sb)
{
    if (sb->netns_fd < 0 || !p->srv->janitor ||
        janitor_netns_check(p->srv->janitor, sb->netns_fd) < 0)
        return;
    p->netns_checking++;
    sb->netns_fd = safe_close(sb->netns_fd);
}

static void netns_refill(loop_t *l, timer_t_ *t)
{
    pool_t *p = t->data;
    /* a few per round, so a burst of creates is never held up behind a long refill */
    for (int k = 0; k < 4 && p->n_netns_warm < p->netns_warm_max; k++) {
        int fd;
        if (netns_make(&fd) < 0)
            return;
        p->netns_warm[p->n_netns_warm++] = fd;
    }
    if (p->n_netns_warm < p->netns_warm_max)
        (void)timer_arm(l, t, 1);
}

/* Create one sandbox; -ENOSPC when no uid is left, -EDQUOT when the homes filesystem has no
 * room for its home (both counted as rejected, with the reason). */
static int remove_home(sandbox_t *sb, bool killed);

static int sandbox_create(pool_t *p, const create_opts_t *o, sandbox_t **ret)
{
    sandbox_t *sb = calloc(1, sizeof *sb);
    if (!sb)
        return -ENOMEM;
    sb->pool = p;
    sb->refs = 1;
    sb->home_fd = -EBADF;
    sb->ruleset_fd = -EBADF;
    sb->netns_fd = -EBADF;
    sb->cg_fds[0] = -1;
    /* One getrandom for both: the id (8 bytes, public) and the token (32 bytes, secret). */
    unsigned char rnd[40];
    randombytes_buf(rnd, sizeof rnd);
    (void)sodium_bin2hex(sb->id, sizeof sb->id, rnd, 8);
    (void)sodium_bin2hex(sb->token, sizeof sb->token, rnd + 8, 32);
    sodium_memzero(rnd, sizeof rnd);
    while (pool_find(p, sb->id, 16))
        hex_random(sb->id, 8);
    (void)snprintf(sb->home_name, sizeof sb->home_name, "%.2s/%s", sb->id, sb->id);
    (void)snprintf(sb->home, sizeof sb->home, "%s/%s", p->cfg.homes_dir, sb->home_name);
    sb->max_procs = o->max_procs;
    sb->max_mem_mb = o->max_mem_mb;
    sb->idle_timeout_ms = o->idle_ms;
    struct timespec ts;
    (void)clock_gettime(CLOCK_REALTIME, &ts);
    sb->created_at_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    sb->last_activity_ms = loop_now_ms(p->srv->loop);
    int r = make_home(p, sb);
    if (r < 0 && sb->uid == 0) { /* no uid left: nothing was made */
        free(sb);
        return r;
    }
    if (r >= 0 && p->have_netns)
        r = netns_take(p, &sb->netns_fd);
    if (r >= 0 && p->ll.abi > 0) {
        sb->landlocked = true;
        r = landlock_ruleset_for_home(&p->ll, sb->home_fd, &sb->ruleset_fd);
    }
    if (r >= 0)
        r = build_env(sb, o->env, &sb->env);
    if (r >= 0 && ++p->test_creates == p->test_create_fail_at)
        r = -EIO;
    if (r < 0) {
        /* Its descriptors go first: when the failure was a full descriptor table (EMFILE) the
         * removal needs some. The home may exist without a descriptor (made, then not opened);
         * nothing ran as its uid, so it goes as a killed sandbox's does (to the trash, with one
         * rename that needs no descriptor). */
        sb->home_fd = safe_close(sb->home_fd);
        sb->ruleset_fd = safe_close(sb->ruleset_fd);
        sb->netns_fd = safe_close(sb->netns_fd);
        int d = remove_home(sb, true);
        bool removed = d >= 0 || d == -ENOENT;
        if (!removed)
            log_warn("sandbox %s: its half-made home was not removed: %s", sb->id, strerror(-d));
        if (d != 1) /* 1: the uid went with its home to the warm set */
            uidpool_release(&p->uids, sb->uid, removed);
        sandbox_unref(sb);
        return r;
    }
    pool_link(p, sb);
    lru_push_front(p, sb);
    handles_trim(p);
    sb->serial = ++p->created_total;
    *ret = sb;
    return 0;
}

/* A sandbox as JSON (its shape: docs/protocol.md), appended to b. Written here, not built with
 * jansson: that was ~40 small allocations per sandbox, per answer to a create and per list
 * entry, and on a heap holding 10,000 sandboxes each one cost more (bench-pool section 5). Only
 * the home needs escaping: its directory's escape is made once (homes_json), its name is hex. */
static int sandbox_put_json(buf_t *b, const sandbox_t *sb, bool with_token)
{
    const cgroups_t *cg = &sb->pool->cg;
    char mem[24] = "null", pids[24] = "null";
    if (cg->v1_memory)
        (void)snprintf(mem, sizeof mem, "%llu", (unsigned long long)sb->max_mem_mb << 20);
    if (cg->v1_pids)
        (void)snprintf(pids, sizeof pids, "%llu", (unsigned long long)sb->max_procs);
    int r = buf_printf(b,
                       "{\"id\":\"%s\",\"uid\":%u,\"home\":\"%s/%s\",\"confinement\":\"%s\","
                       "\"created_at_ms\":%lld",
                       sb->id, sb->uid, sb->pool->homes_json, sb->home_name,
                       sandbox_confinement(sb), (long long)sb->created_at_ms);
    if (r >= 0 && with_token)
        r = buf_printf(b, ",\"token\":\"%s\"", sb->token);
    if (r >= 0) /* aggregate limits for the whole sandbox (all its processes together) */
        r = buf_printf(b,
                       ",\"limits\":{\"max_procs\":%llu,\"max_mem_mb\":%llu,"
                       "\"idle_timeout_secs\":%llu,\"nofile\":4096,\"core\":0,"
                       "\"cgroup_memory_bytes\":%s,\"cgroup_pids\":%s}}",
                       (unsigned long long)sb->max_procs, (unsigned long long)sb->max_mem_mb,
                       (unsigned long long)(sb->idle_timeout_ms / 1000), mem, pids);
    return r;
}

static int get_u64(json_t *o, const char *name, uint64_t def, uint64_t min, uint64_t max,
                   uint64_t *ret)
{
    json_t *v = json_object_get(o, name);
    if (!v || json_is_null(v)) {
        *ret = def;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < (json_int_t)min ||
        (uint64_t)json_integer_value(v) > max)
        return -EINVAL;
    *ret = (uint64_t)json_integer_value(v);
    return 0;
}

static int parse_create(json_t *o, create_opts_t *opts, uint64_t *count, sbx_err_t *err)
{
    if (get_u64(o, "count", 1, 1, POOL_MAX_COUNT, count) < 0)
        return sbx_err(err, -EINVAL, "count must be an integer from 1 to 4096");
    if (get_u64(o, "max_procs", DEFAULT_MAX_PROCS, 1, 4096, &opts->max_procs) < 0)
        return sbx_err(err, -EINVAL, "max_procs must be an integer from 1 to 4096");
    if (get_u64(o, "max_mem_mb", DEFAULT_MAX_MEM_MB, 1, 1048576, &opts->max_mem_mb) < 0)
        return sbx_err(err, -EINVAL, "max_mem_mb must be an integer from 1 to 1048576");
    uint64_t idle;
    if (get_u64(o, "idle_timeout_secs", 0, 0, 31536000, &idle) < 0)
        return sbx_err(err, -EINVAL, "idle_timeout_secs must be an integer from 0 to 31536000");
    opts->idle_ms = idle * 1000;
    opts->env = json_object_get(o, "env");
    if (opts->env && json_is_null(opts->env))
        opts->env = NULL;
    if (opts->env && !json_is_object(opts->env))
        return sbx_err(err, -EINVAL, "env must be an object of strings");
    size_t bytes = 0;
    const char *key;
    json_t *val;
    json_object_foreach(opts->env, key, val) {
        if (!*key || strchr(key, '=') || !json_is_string(val) ||
            strlen(json_string_value(val)) != json_string_length(val))
            return sbx_err(err, -EINVAL,
                           "env keys must be non-empty without '=', values strings without NUL");
        bytes += strlen(key) + json_string_length(val);
    }
    if (bytes > POOL_MAX_ENV_BYTES)
        return sbx_err(err, -EINVAL, "env is too large (max 64 KiB of keys and values)");
    return 0;
}

/* ---- create requests --------------------------------------------------------------------
 *
 * A create request makes its sandboxes from the warm sets (a home the janitor made, a network
 * namespace made ahead): a rename, a ruleset, no disk work. A request for more than the warm
 * sets hold waits (parked on its connection, in arrival order) for the janitor to make the
 * rest, and the loop serves everything else meanwhile; it is answered once all are made. Its
 * capacity is reserved when it arrives. A client that goes away before the answer has its
 * sandboxes deleted: nobody holds their tokens. Homes and namespaces are made on the loop only
 * without a janitor or warm directory, or while the janitor fails to make them. */

/* A sandbox a request made, found again by id and serial: one deleted meanwhile (a delete by
 * id, shutdown) is gone from the registry, and no reference is held that would keep its
 * handles open (a burst of 4,000 would hold 12,000 descriptors). */
typedef struct {
    char id[17];
    uint64_t serial;
} creq_made_t;

struct create_req {
    pool_t *pool;
    conn_t *conn;
    create_opts_t opts; /* opts.env referenced */
    uint64_t count;     /* asked */
    uint64_t slots;     /* capacity reserved for the sandboxes still to make */
    uint64_t n;         /* made */
    creq_made_t *made;  /* each counted in its ops until the answer: not evicted while idle */
    const char *why;    /* why the rest were rejected, when it was not capacity */
    create_req_t *next;
};

static sandbox_t *creq_sandbox(const create_req_t *q, uint64_t i)
{
    sandbox_t *sb = pool_find(q->pool, q->made[i].id, 16);
    return sb && sb->serial == q->made[i].serial ? sb : NULL;
}

/* The answer is out (or will never be): the sandboxes are the client's to use or leave idle. */
static void creq_release(create_req_t *q)
{
    for (uint64_t i = 0; i < q->n; i++) {
        sandbox_t *sb = creq_sandbox(q, i);
        if (sb) {
            sb->ops--;
            sb->last_activity_ms = loop_now_ms(q->pool->srv->loop);
        }
    }
    q->n = 0;
}

static void creq_free(create_req_t *q)
{
    creq_release(q);
    json_decref(q->opts.env);
    free(q->made);
    free(q);
}

/* The slots it did not fill give their capacity back. */
static void creq_give_back(pool_t *p, create_req_t *q)
{
    p->reserved -= q->slots;
    p->create_slots -= q->slots;
    q->slots = 0;
}

static void creq_unlink(pool_t *p, create_req_t *q)
{
    create_req_t **pp = &p->creq_first;
    while (*pp && *pp != q)
        pp = &(*pp)->next;
    if (*pp)
        *pp = q->next;
    q->next = NULL;
    creq_give_back(p, q);
    server_op_end(p->srv);
}

/* A request that fails part way, or whose client left, undoes what it made: a client that got
 * no tokens must not be billed for ghosts. */
static void creq_undo(create_req_t *q)
{
    for (uint64_t i = 0; i < q->n; i++) {
        sandbox_t *sb = creq_sandbox(q, i);
        if (sb)
            (void)sandbox_delete(sb, NULL);
    }
    q->n = 0;
}

/* Answer with what was made (deleted meanwhile: counted as rejected), or with r's error and
 * what was made undone. */
static void creq_answer(create_req_t *q, int r)
{
    conn_t *c = q->conn;
    creq_unlink(q->pool, q);
    conn_set_handler(c, NULL, NULL);
    _cleanup_(buf_free) buf_t out;
    buf_init(&out, SIZE_MAX);
    int w = r < 0 ? r : buf_append(&out, "{\"sandboxes\":[", 14);
    uint64_t made = 0;
    for (uint64_t i = 0; i < q->n && w >= 0; i++) {
        sandbox_t *sb = creq_sandbox(q, i);
        if (!sb)
            continue;
        if (made++ > 0)
            w = buf_append(&out, ",", 1);
        if (w >= 0)
            w = sandbox_put_json(&out, sb, true);
    }
    if (w >= 0)
        w = buf_printf(&out, "],\"rejected\":%llu", (unsigned long long)(q->count - made));
    if (w >= 0 && q->why && made < q->count)
        w = buf_printf(&out, ",\"reason\":\"%s\"", q->why);
    if (w >= 0)
        w = buf_append(&out, "}", 1);
    if (r < 0 || w < 0)
        creq_undo(q);
    if (r == -ESHUTDOWN)
        http_unavailable(c, HTTP_CLOSE, "the host is shutting down");
    else if (r < 0)
        http_internal_error(c, 0, "creating a sandbox failed: %s", strerror(-r));
    else if (w < 0) /* no memory for the answer: the client never learns their tokens */
        http_unavailable(c, 0, "out of memory");
    else
        (void)conn_respond(c, 200, "application/json", buf_head(&out), out.len, NULL);
    creq_free(q);
}

/* Whether the next sandbox can be made now without disk work on the loop: a warm home, and a
 * warm namespace where sandboxes get one. If not, the janitor is asked for what is missing
 * (homes beyond what the warm set refills to, each for a uid taken now for a reserved slot).
 * True also when nothing is coming, or the janitor's last try failed (no janitor, no uid left,
 * a warm directory it cannot write): the create then makes, or refuses, the rest here rather
 * than wait for what may never come. need: slots still to fill. */
static bool create_ready(pool_t *p, uint64_t need)
{
    if (!p->srv->janitor || p->warm_fd < 0)
        return true;
    bool home = p->n_warm > 0 || p->warm_failing;
    bool ns = !p->have_netns || p->n_netns_warm > 0 || p->netns_failing;
    if (!home) {
        while (p->n_warm + p->n_warm_wait < MIN(need, (uint64_t)POOL_HOMES_WARM)) {
            uint32_t uid;
            if (uidpool_take(&p->uids, &uid) < 0)
                break;
            if (!warm_ask(p, NULL, uid)) {
                uidpool_release(&p->uids, uid, true);
                break;
            }
        }
        home = p->n_warm_wait == 0;
    }
    if (!ns) {
        netns_want(p);
        ns = p->netns_making + p->netns_checking == 0;
    }
    return home && ns;
}

/* Make what the waiting requests can have now, first come first served; answer each once its
 * sandboxes are made. Runs when a request arrives and when the janitor hands back a home or a
 * namespace. */
static void creates_pump(pool_t *p)
{
    if (p->pumping)
        return;
    p->pumping = true;
    create_req_t *q;
    while ((q = p->creq_first)) {
        int r = 0;
        while (q->slots > 0 && create_ready(p, q->slots)) {
            sandbox_t *sb;
            r = sandbox_create(p, &q->opts, &sb);
            if (r == -ENOSPC || r == -EDQUOT) { /* no uid, or no disk, left: the rest are
                                                 * rejected, and why is said */
                if (r == -EDQUOT) {
                    q->why = "no space left on the homes filesystem";
                    log_warn("create: %s (%s): %llu sandboxes rejected", q->why, p->cfg.homes_dir,
                             (unsigned long long)q->slots);
                } else
                    q->why = "no uid left";
                r = 0;
                creq_give_back(p, q);
                break;
            }
            if (r < 0)
                break;
            q->slots--; /* the slot is the sandbox's now (its delete gives it back) */
            p->create_slots--;
            sb->ops++;
            memcpy(q->made[q->n].id, sb->id, sizeof sb->id);
            q->made[q->n++].serial = sb->serial;
        }
        if (r >= 0 && q->slots > 0)
            break; /* waits for the janitor */
        creq_answer(q, r);
    }
    p->pumping = false;
}

static void creq_conn_close(conn_t *c, bool aborted)
{
    create_req_t *q = c->hdata;
    (void)aborted; /* only before the answer: the answer unhooks this first */
    c->hdata = NULL;
    pool_t *p = q->pool;
    creq_unlink(p, q);
    creq_undo(q);
    creq_free(q);
    creates_pump(p); /* what it held back may serve the next one */
}

static const handler_ops_t creq_ops = { .on_close = creq_conn_close };

/* At shutdown, before the sandboxes go: the waiting requests are refused. */
static void creates_refuse_all(pool_t *p)
{
    p->pumping = true; /* nothing is made any more */
    while (p->creq_first)
        creq_answer(p->creq_first, -ESHUTDOWN);
}

static void create_body(conn_t *c, json_t *o)
{
    pool_t *p = server_of(c)->pool;
    create_opts_t opts = { 0 };
    uint64_t count;
    sbx_err_t err;
    if (parse_create(o, &opts, &count, &err) < 0) {
        http_bad_request(c, 0, "%s", err.msg);
        return;
    }
    create_req_t *q = calloc(1, sizeof *q);
    /* Capacity is authoritative here and reserved before any work. */
    uint64_t slots = p->cfg.capacity > p->reserved ? p->cfg.capacity - p->reserved : 0;
    slots = MIN(slots, count);
    if (!q || !(q->made = calloc(slots ? slots : 1, sizeof *q->made))) {
        free(q);
        http_unavailable(c, 0, "out of memory");
        return;
    }
    *q = (create_req_t){
        .pool = p, .conn = c, .opts = opts, .count = count, .slots = slots, .made = q->made
    };
    json_incref(q->opts.env);
    p->reserved += slots;
    p->create_slots += slots;
    server_op_begin(p->srv);
    create_req_t **tail = &p->creq_first; /* a handful wait at most: one per connection */
    while (*tail)
        tail = &(*tail)->next;
    *tail = q;
    conn_set_handler(c, &creq_ops, q); /* until it is answered */
    creates_pump(p);
}

void route_sandboxes_create(conn_t *c) { route_with_json_body(c, 1024 * 1024, create_body); }

void route_sandboxes_list(conn_t *c)
{
    _cleanup_(buf_free) buf_t out;
    buf_init(&out, SIZE_MAX);
    int w = buf_append(&out, "[", 1);
    for (sandbox_t *sb = server_of(c)->pool->first; sb && w >= 0; sb = sb->next) {
        if (sb != server_of(c)->pool->first)
            w = buf_append(&out, ",", 1);
        if (w >= 0)
            w = sandbox_put_json(&out, sb, false);
    }
    if (w >= 0)
        w = buf_append(&out, "]", 1);
    if (w < 0)
        http_unavailable(c, 0, "out of memory");
    else
        (void)conn_respond(c, 200, "application/json", buf_head(&out), out.len, NULL);
}

void route_sandbox_token(conn_t *c, sandbox_t *sb)
{
    conn_respond_json(c, 200, json_pack("{s:s,s:s}", "id", sb->id, "token", sb->token));
}

/* ---- delete ------------------------------------------------------------------------------ */

/* Anything left of this sandbox: its cgroup's task count when it has one (one read, and
 * setsid() escapees are counted too), else a look through /proc. */
static int sandbox_alive(const sandbox_t *sb)
{
    if (sb->cg_ready) {
        int n = cgroup_count(&sb->pool->cg, sb->uid - (uint32_t)sb->pool->cfg.uid_base);
        if (n >= 0)
            return n > 0;
    }
    return confine_uid_alive(sb->uid);
}

static bool teardown_processes(sandbox_t *sb)
{
    server_t *s = sb->pool->srv;
    if (!sb->spawned)
        return true; /* nothing ever ran as this uid */
    server_reap(s);
    for (int i = 0; i < TEARDOWN_ROUNDS; i++) {
        if (sandbox_alive(sb) == 0)
            return true;
        if (!sb->pool->test_kill_fails)
            (void)confine_kill_uid(sb->uid);
        server_reap(s); /* killed children (and re-parented orphans) are ours to reap */
        if (sandbox_alive(sb) == 0)
            return true;
        struct timespec ts = { 0, (i < 10 ? 1 : 10) * 1000000L };
        nanosleep(&ts, NULL);
        server_reap(s);
    }
    return false;
}

/* The first subdirectory of dir (readdir order, the order fs_delete walks in); 0 when none. */
static int first_subdir(int dir, char *name, size_t cap)
{
    int fd = openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return negative_errno();
    DIR *d = fdopendir(fd);
    if (!d) {
        int r = negative_errno();
        safe_close(fd);
        return r;
    }
    struct dirent *de;
    int found = 0;
    while (!found && (de = readdir(d))) {
        struct stat st;
        if (streq(de->d_name, ".") || streq(de->d_name, "..") || strlen(de->d_name) >= cap)
            continue;
        if (fstatat(dir, de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode)) {
            memcpy(name, de->d_name, strlen(de->d_name) + 1);
            found = 1;
        }
    }
    closedir(d);
    return found;
}

/* A sandbox can build a directory chain deeper than fs_delete walks (one descriptor per
 * level). fs_delete removes everything before the branch it gave up on, so that branch is the
 * first subdirectory at each level: follow it down and, every FLATTEN_DEPTH levels, move what
 * is below to the top of the home, where the next fs_delete pass reaches it. Only
 * descriptors, no symlink followed; the sandbox's processes are gone by now. */
static int flatten_deep(int top, unsigned *serial)
{
    _cleanup_close_ int cur = openat(top, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    char name[NAME_MAX + 1], to[48];
    unsigned moved = 0;
    if (cur < 0)
        return negative_errno();
    for (unsigned depth = 1;; depth++) {
        int r = first_subdir(cur, name, sizeof name);
        if (r <= 0)
            return r < 0 ? r : moved > 0 ? 0 : -ENAMETOOLONG;
        int next = openat(cur, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (next < 0)
            return negative_errno();
        if (depth % FLATTEN_DEPTH == 0) {
            /* a name the tenant cannot have made ahead (it chose every name in this tree: with
             * names it could guess, each move "succeeded" without moving, and the tree was
             * never removed), tried again only if it exists all the same */
            int k = -EEXIST;
            for (int tries = 0; tries < 4 && k == -EEXIST; tries++) {
                char rnd[17];
                hex_random(rnd, 8);
                (void)snprintf(to, sizeof to, ".sbx-teardown-%u-%s", (*serial)++, rnd);
                k = renameat2(cur, name, top, to, RENAME_NOREPLACE) < 0 ? negative_errno() : 0;
            }
            if (k < 0) {
                safe_close(next);
                return k;
            }
            moved++;
        }
        safe_close(cur);
        cur = next;
    }
}

/* The usual home, holding only what make_home made: four rmdirs by descriptor instead of a
 * walk (opendir, fstat, getdents per directory). One name per call and relative to a
 * directory descriptor, so no symlink is ever followed (rmdir of a symlink fails with ENOTDIR,
 * .sbx is opened O_NOFOLLOW), and rmdir never removes anything but an empty directory. The
 * first step that fails (a file left, an entry replaced) hands the rest to the full walk. */
static int remove_home_pristine(int parent_fd, const char *name, int home_fd)
{
    if (home_fd < 0)
        return -EBADF;
    if (unlinkat(home_fd, ".tmp", AT_REMOVEDIR) < 0)
        return negative_errno();
    _cleanup_close_ int sbx =
        openat(home_fd, ".sbx", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sbx < 0 || unlinkat(sbx, "proxy", AT_REMOVEDIR) < 0 ||
        unlinkat(home_fd, ".sbx", AT_REMOVEDIR) < 0 || unlinkat(parent_fd, name, AT_REMOVEDIR) < 0)
        return negative_errno();
    return 0;
}

/* Remove parent_fd/name (a home, or one in the trash), however deep the tree the sandbox left
 * in it. home_fd: the home opened O_PATH, or -1 to open it here. */
static int remove_tree(int parent_fd, const char *name, int home_fd)
{
    fs_root_t root = { .dirfd = parent_fd, .confined = true, .uid = (uid_t)-1, .gid = (gid_t)-1 };
    _cleanup_close_ int own = -EBADF;
    unsigned serial = 0;
    if (home_fd < 0) {
        own = openat(parent_fd, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (own < 0 && errno == ENOENT)
            return -ENOENT;
        home_fd = own;
    }
    if (remove_home_pristine(parent_fd, name, home_fd) >= 0)
        return 0;
    int r = fs_delete(&root, name, true);
    for (int pass = 0; r == -ENAMETOOLONG && pass < FLATTEN_PASSES && home_fd >= 0; pass++) {
        if (flatten_deep(home_fd, &serial) < 0)
            break;
        r = fs_delete(&root, name, true);
    }
    return r;
}

int pool_remove_tree_at(int parent_fd, const char *name)
{
    return remove_tree(parent_fd, name, -1);
}

/* Remove the home. Its processes verified gone, a pool with a trash directory (on the homes'
 * filesystem, root-only) moves it there with one rename and the janitor (janitor.h) empties it
 * off the loop: no path leads a later sandbox of this uid to it, and nothing of the old one
 * runs, so the uid may be recycled now. Where a warm home is wanted, the janitor removes it
 * and makes a fresh one for the same uid: then the uid goes with that to the warm set (1).
 * Otherwise (no trash, survivors) the home goes here. */
static int remove_home(sandbox_t *sb, bool killed)
{
    pool_t *p = sb->pool;
    if (killed && p->trash_fd >= 0 && p->srv->janitor) {
        char name[48];
        (void)snprintf(name, sizeof name, "%s-%llu", sb->id, (unsigned long long)++p->trash_seq);
        if (renameat2(p->homes_fd, sb->home_name, p->trash_fd, name, RENAME_NOREPLACE) == 0) {
            if (p->warm_fd >= 0 && uids_spare(p, true) && warm_ask(p, name, sb->uid))
                return 1;
            if (janitor_remove(p->srv->janitor, name) < 0)
                return remove_tree(p->trash_fd, name, sb->home_fd);
            return 0;
        }
        if (errno == ENOENT)
            return -ENOENT;
    }
    return remove_tree(p->homes_fd, sb->home_name, sb->home_fd);
}

/* Commands' cgroup2 groups that could not be removed when their command ended (descendants
 * lived on; or unknown): a delete looks through the cgroup root for its sandbox's only while
 * some are left, so that a delete is no readdir of every live command's group. */
static unsigned cmdcg_left;

int sandbox_delete(sandbox_t *sb, sbx_err_t *err)
{
    pool_t *p = sb->pool;
    /* From here no request may spawn under this uid, even one authorized before: spawn checks
     * `deleted` on the same thread that runs this. */
    sb->deleted = true;
    /* Spawns of it already sent to a helper: their answers first, so a child that starts
     * after this point cannot exist and the teardown below sees every one that did start. */
    spawner_settle_sandbox(p->srv->spawner, sb);
    pool_unlink(p, sb);
    lru_unlink(p, sb); /* its descriptors are closed with its last reference */
    p->reserved--;
    procs_drop_sandbox(p->srv, sb);
    envd_watches_drop(p->srv, sb);
    bool killed = teardown_processes(sb);
    if (killed)
        netns_return(p, sb);
    int r = remove_home(sb, killed);
    bool removed = r >= 0 || r == -ENOENT, uid_kept = r == 1;
    int ret = 0;
    if (!killed)
        ret = sbx_err(err, -EBUSY, "processes of uid %u survived the kill", sb->uid);
    else if (!removed)
        ret = sbx_err(err, r, "home could not be removed: %s", strerror(-r));
    if (cmdcg_left > 0) { /* its commands' cgroup2 groups left over, empty now */
        char cgp[24];     /* its own groups ("c"), not the kept ones ("k"): those stay */
        (void)snprintf(cgp, sizeof cgp, "s%u-c", sb->uid);
        unsigned gone = cgroup_cmd_remove_prefix(&p->cg, cgp);
        cmdcg_left -= gone < cmdcg_left ? gone : cmdcg_left;
    }
    for (int i = 0; i < CMDCG_KEPT && killed; i++) {
        if (!(sb->cg_lost & (1u << i)))
            continue;  /* an empty one stays for the uid's next sandbox, which takes it over */
        char kept[32]; /* processes were left in it: empty now, and removed */
        (void)snprintf(kept, sizeof kept, "s%u-k%d", sb->uid, i);
        (void)cgroup_cmd_remove(&p->cg, kept);
    }
    /* The uid is recycled only after verified teardown; otherwise it stays quarantined. */
    if (!uid_kept) /* else it went with its home to the warm set (remove_home) */
        uidpool_release(&p->uids, sb->uid, killed && removed);
    p->deleted_total++;
    if (!(killed && removed))
        p->teardown_failures++;
    if (p->count == 0) /* the host's idle clock (SBX_IDLE_TIMEOUT) starts now, not at a tick */
        p->srv->pool_empty_since_ms = monotonic_ms();
    sandbox_unref(sb);
    return ret;
}

void route_sandbox_delete(conn_t *c, sandbox_t *sb)
{
    char id[17];
    sbx_err_t err;
    memcpy(id, sb->id, sizeof id);
    if (sandbox_delete(sb, &err) >= 0)
        conn_respond_json(c, HTTP_OK, json_pack("{s:s,s:b}", "id", id, "deleted", 1));
    else
        conn_respond_json(c, HTTP_INTERNAL_ERROR,
                          json_pack("{s:s,s:b,s:s}", "id", id, "deleted", 1, "error", err.msg));
}

void route_sandboxes_delete_all(conn_t *c)
{
    pool_t *p = server_of(c)->pool;
    json_t *errors = json_array();
    size_t n = 0;
    while (p->first) {
        char id[17];
        sbx_err_t err;
        memcpy(id, p->first->id, sizeof id);
        if (sandbox_delete(p->first, &err) < 0)
            json_array_append_new(errors, json_pack("{s:s,s:s}", "id", id, "error", err.msg));
        n++;
    }
    if (json_array_size(errors) > 0)
        conn_respond_json(c, HTTP_INTERNAL_ERROR,
                          json_pack("{s:I,s:o}", "deleted", (json_int_t)n, "errors", errors));
    else {
        json_decref(errors);
        conn_respond_json(c, 200, json_pack("{s:I}", "deleted", (json_int_t)n));
    }
}

void pool_evict_idle(pool_t *p, uint64_t now_ms)
{
    sandbox_t *sb = p->timed_first;
    while (sb) {
        sandbox_t *next = sb->tnext;
        if (sb->ops == 0 && sb->running == 0 &&
            now_ms - sb->last_activity_ms >= sb->idle_timeout_ms) {
            log_info("sandbox %s idle for %llu s: evicting", sb->id,
                     (unsigned long long)(sb->idle_timeout_ms / 1000));
            (void)sandbox_delete(sb, NULL);
        }
        sb = next;
    }
}

void *landlock_json(int abi)
{
    json_t *feats = json_array();
    for (int i = 0; feats && landlock_feature(abi, i); i++)
        json_array_append_new(feats, json_string(landlock_feature(abi, i)));
    return json_pack("{s:i,s:o*}", "abi", abi, "features", feats);
}

void pool_health(pool_t *p, void *json_obj)
{
    json_t *j = json_obj;
    char cgs[64];
    cgroups_describe(&p->cg, cgs, sizeof cgs);
    json_object_set_new(j, "sandboxes", json_integer((json_int_t)p->count));
    json_object_set_new(j, "capacity", json_integer((json_int_t)p->cfg.capacity));
    json_object_set_new(j, "landlock", landlock_json(p->ll.abi));
    json_t *conf = json_array();
    if (p->ll.abi > 0)
        json_array_append_new(conf, json_string("landlock"));
    json_array_append_new(conf, json_string("uid"));
    json_array_append_new(conf, json_string("no_new_privs"));
    json_array_append_new(conf, json_string("rlimits"));
    if (p->hidepid)
        json_array_append_new(conf, json_string("hidepid"));
    if (p->cg.enabled)
        json_array_append_new(conf, json_string("cgroups"));
    if (p->have_netns)
        json_array_append_new(conf, json_string("netns"));
    json_object_set_new(j, "confinement", conf);
    json_object_set_new(j, "cgroups", json_string(cgs));
    if (p->have_netns)
        json_object_set_new(
            j, "netns",
            json_pack("{s:I,s:I,s:I,s:I,s:I,s:I}", "warm", (json_int_t)p->n_netns_warm, "making",
                      (json_int_t)p->netns_making, "checking", (json_int_t)p->netns_checking,
                      "recycled", (json_int_t)p->netns_recycled, "discarded",
                      (json_int_t)p->netns_discarded, "made", (json_int_t)p->netns_made));
    json_object_set_new(j, "homes",
                        json_pack("{s:I,s:I,s:I}", "warm", (json_int_t)p->n_warm, "making",
                                  (json_int_t)p->n_warm_wait, "from_warm",
                                  (json_int_t)p->homes_from_warm));
    json_int_t waiting = 0; /* create requests waiting for the janitor's homes or namespaces */
    for (const create_req_t *q = p->creq_first; q; q = q->next)
        waiting++;
    json_object_set_new(
        j, "creates",
        json_pack("{s:I,s:I}", "waiting", waiting, "slots", (json_int_t)p->create_slots));
    json_object_set_new(j, "handles",
                        json_pack("{s:I,s:I,s:I}", "open", (json_int_t)p->n_handles, "max",
                                  (json_int_t)p->handles_max, "reopened",
                                  (json_int_t)p->handles_reopened));
    json_object_set_new(j, "uids",
                        json_pack("{s:I,s:I,s:I}", "used", (json_int_t)p->uids.n_used,
                                  "quarantined", (json_int_t)p->uids.n_quarantined, "reserved",
                                  (json_int_t)p->uids.n_reserved));
}

/* ---- confined exec ----------------------------------------------------------------------- */

int sandbox_rel_path(const sandbox_t *sb, const char *path, char *out, size_t cap)
{
    size_t hl = strlen(sb->home);
    if (strncmp(path, sb->home, hl) == 0 && (path[hl] == '/' || path[hl] == '\0'))
        path += hl;
    return path_normalize(path, strlen(path), out, cap);
}

static const char *envp_get(char *const *envp, const char *name)
{
    size_t n = strlen(name);
    for (; envp && *envp; envp++)
        if (strncmp(*envp, name, n) == 0 && (*envp)[n] == '=')
            return *envp + n + 1;
    return NULL;
}

void sandbox_cmd_kill(cmdcg_t *cg)
{
    if (cg->kill_fd >= 0)
        (void)!write(cg->kill_fd, "1", 1);
}

void sandbox_cmd_done(cmdcg_t *cg)
{
    sandbox_t *sb = cg->keep;
    if (sb) {
        /* One of the sandbox's kept groups: its next commands may have it if it is empty now.
         * Nothing but a spawn helper's child can enter an empty group (cgroup.procs is root's,
         * and a group without processes has none to fork), so it stays empty until then. One
         * that processes were left in is not used again by this sandbox: a kill of a later
         * command would reach them. Its delete kills them, and the uid's next sandbox takes
         * the group over only if it is empty then (cgroup_cmd_create_at). */
        unsigned bit = 1u << cg->slot;
        cg->keep = NULL;
        sb->cg_busy &= (uint8_t)~bit;
        bool empty = cg->events_fd >= 0 && cgroup_cmd_empty(cg->events_fd);
        if (!empty) /* processes left in it, or refused by the helper (not empty: not ours) */
            sb->cg_lost |= (uint8_t)bit;
        cg->kill_fd = safe_close(cg->kill_fd);
        cg->events_fd = safe_close(cg->events_fd);
        sandbox_unref(sb);
        return;
    }
    if (cg->kill_fd >= 0)
        cg->kill_fd = safe_close(cg->kill_fd);
    if (!cg->dir[0])
        return; /* no group (dedicated mode, cgroup2 off), or done already */
    if (rmdir(cg->dir) < 0 && errno != ENOENT)
        cmdcg_left++; /* EBUSY while descendants live on: removed with the sandbox */
    cg->dir[0] = '\0';
}

int sandbox_exec_prepare(sandbox_t *sb, char *const *argv, char *const *envp, const char *cwd,
                         int stdin_fd, int stdout_fd, int stderr_fd, confine_spec_t *ret_spec,
                         char *cands, size_t cap, cmdcg_req_t *ret_cmdcg, cmdcg_t *ret_cg,
                         sbx_err_t *err)
{
    pool_t *p = sb->pool;
    confine_spec_t spec = { 0 };
    char rel[FS_PATH_MAX];
    int r;

    if (sb->deleted) {
        return sbx_err(err, -ESRCH, "sandbox has been deleted");
    }
    r = sandbox_rel_path(sb, cwd ? cwd : "", rel, sizeof rel);
    if (r < 0) {
        return sbx_err(err, r, "invalid cwd");
    }
    spec.uid = spec.gid = sb->uid;
    spec.mntns_fd = p->hidepid ? p->ns.ns_fd : -1;
    spec.netns_fd = sb->netns_fd;
    ret_cmdcg->prep = NULL;
    if (p->cg.enabled && sb->cg_fds[0] < 0) {
        /* Aggregate limits for everything the sandbox runs, made (or, the cgroup being
         * recycled with the uid, refreshed) by the spawn helper, which hands the cgroup.procs
         * descriptors back for the sandbox's next commands (spawner.c, job_done). */
        ret_cmdcg->prep = &p->cg;
        ret_cmdcg->prep_slot = sb->uid - (uint32_t)p->cfg.uid_base;
        ret_cmdcg->prep_lim =
            (cg_limits_t){ .mem_bytes = sb->max_mem_mb << 20, .pids = sb->max_procs };
    }
    int k = 0;
    for (; k < CONFINE_MAX_CGROUPS && k < 4 && sb->cg_fds[k] >= 0; k++)
        spec.cgroup_procs_fds[k] = sb->cg_fds[k];
    for (int i = k; i < CONFINE_MAX_CGROUPS; i++)
        spec.cgroup_procs_fds[i] = -1;
    /* The request's scope opened the handles (conn_scope_sandbox) and its hold keeps them
     * open; fail closed all the same: never a child without its ruleset. */
    if (sb->landlocked && sb->ruleset_fd < 0)
        return sbx_err(err, -EIO, "the sandbox's Landlock ruleset is not open");
    spec.ruleset_fd = sb->ruleset_fd;
    const confine_limit_t limits[] = {
        { RLIMIT_NPROC, sb->max_procs },
        { RLIMIT_AS, sb->max_mem_mb << 20 },
        { RLIMIT_NOFILE, 4096 },
        { RLIMIT_FSIZE, (rlim_t)8192 << 20 },
        { RLIMIT_CORE, 0 },
    };
    memcpy(spec.limits, limits, sizeof limits);
    spec.n_limits = (int)ELEMENTSOF(limits);
    /* the home by path; the helper copies the strings before this frame is gone */
    spec.home_path = sb->home;
    r = confine_resolve_candidates(&spec, argv[0], envp_get(envp, "PATH"), cands, cap);
    if (r < 0) {
        return sbx_err(err, r, "cannot resolve %s", argv[0]);
    }
    /* cwd_rel must outlive this frame: kept after the candidates in cands */
    size_t used = 0;
    for (int i = 0; i < spec.n_candidates; i++)
        used = MAX(used, (size_t)(spec.candidates[i] - cands) + strlen(spec.candidates[i]) + 1);
    if (!strchr(argv[0], '/') && used + strlen(rel) + 1 <= cap) {
        memcpy(cands + used, rel, strlen(rel) + 1);
        spec.cwd_rel = cands + used;
    } else if (strchr(argv[0], '/') && strlen(rel) + 1 <= cap) {
        memcpy(cands, rel, strlen(rel) + 1);
        spec.cwd_rel = cands;
    } else {
        return sbx_err(err, -E2BIG, "cannot resolve %s", argv[0]);
    }
    spec.argv = argv;
    spec.envp = envp;
    spec.stdin_fd = stdin_fd;
    spec.stdout_fd = stdout_fd;
    spec.stderr_fd = stderr_fd;
    spec.pidfd = -1;
    /* The command's cgroup2 group, so a kill reaches all it started: one of the sandbox's
     * kept ones when one is free, else one of its own. Named here, made or opened by the spawn
     * helper (off the loop), joined by the child after the sandbox's own groups. */
    cmdcg_t cg = CMDCG_NONE;
    ret_cmdcg->root = NULL;
    ret_cmdcg->name[0] = '\0';
    ret_cmdcg->mode = CMDCG_OWN;
    if (p->cg.v2_root[0] && k < CONFINE_MAX_CGROUPS) {
        ret_cmdcg->root = p->cg.v2_root;
        int slot = 0;
        while (slot < CMDCG_KEPT && ((sb->cg_busy | sb->cg_lost) & (1u << slot)))
            slot++;
        if (slot < CMDCG_KEPT) {
            (void)snprintf(ret_cmdcg->name, sizeof ret_cmdcg->name, "s%u-k%d", sb->uid, slot);
            ret_cmdcg->mode = CMDCG_KEEP;
            sb->cg_busy |= (uint8_t)(1u << slot);
            cg.slot = slot;
            cg.keep = sandbox_ref(sb);
        } else {
            (void)snprintf(ret_cmdcg->name, sizeof ret_cmdcg->name, "s%u-c%llu", sb->uid,
                           (unsigned long long)++p->cmd_seq);
            if (snprintf(cg.dir, sizeof cg.dir, "%s/%s", p->cg.v2_root, ret_cmdcg->name) >=
                (int)sizeof cg.dir)
                return sbx_err(err, -ENAMETOOLONG, "cgroup path too long");
        }
    }
    sb->spawned = true; /* from now on, teardown must verify the uid is empty */
    *ret_spec = spec;
    *ret_cg = cg;
    return 0;
}
