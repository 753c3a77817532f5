/* SPDX-License-Identifier: MIT */
/* The control plane's store (src/store/store.c, store_sqlite.c): compare-and-swap on mod
 * revisions, etcd-like store revisions, prefix listing, refused keys and values, persistence and
 * file modes, and two processes writing one file at once. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/macro.h"
#include "common/strutil.h"
#include "store/store.h"
#include "tap.h"

/* The per-run temporary directory; set once by main before any test runs. */
static char tmpdir[] = "/tmp/sbx-test-store-XXXXXX";

static void store_closep(store_t **s) { store_close(*s); }
#define _cleanup_store_ _cleanup_(store_closep)
static void kv_clearp(store_kv_t *kv) { store_kv_clear(kv); }
#define _cleanup_kv_ _cleanup_(kv_clearp)

static void db_path(const char *name, char *buf, size_t sz)
{
    (void)snprintf(buf, sz, "%s/%s.db", tmpdir, name);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int mode_of(const char *path)
{
    struct stat st;
    return stat(path, &st) < 0 ? negative_errno() : (int)(st.st_mode & 07777);
}

TEST(get_missing_key)
{
    char path[256];
    db_path("missing", path, sizeof path);
    _cleanup_store_ store_t *s = NULL;
    ASSERT_EQ(store_open_sqlite(path, &s), 0);
    store_kv_t kv = { .key = (char *)"untouched" };
    ASSERT_EQ(store_get(s, "nope", &kv), -ENOENT);
    ASSERT_STREQ(kv.key, "untouched"); /* outputs are assigned only on success */
    store_kv_t *kvs = NULL;
    size_t n = 99;
    ASSERT_EQ(store_list(s, "", &kvs, &n), 0); /* an empty store lists nothing */
    ASSERT_EQ_U(n, 0);
    store_kv_free(kvs, n);
}

TEST(cas_create_update_stale_any)
{
    char path[256];
    db_path("cas", path, sizeof path);
    _cleanup_store_ store_t *s = NULL;
    ASSERT_EQ(store_open_sqlite(path, &s), 0);
    int64_t r1 = 0, r2 = 0, r3 = 0, r4 = 0;

    ASSERT_EQ(store_cas(s, "run/1", "v1", 2, STORE_REV_ABSENT, &r1), 0);
    ASSERT_EQ(r1, 1); /* the first write of a new store */
    ASSERT_EQ(store_cas(s, "run/1", "xx", 2, STORE_REV_ABSENT, NULL), -ESTALE);
    {
        _cleanup_kv_ store_kv_t kv = { 0 };
        ASSERT_EQ(store_get(s, "run/1", &kv), 0);
        ASSERT_STREQ(kv.key, "run/1");
        ASSERT_MEMEQ(kv.value, kv.value_len, "v1", 2);
        ASSERT_EQ(kv.rev, r1);
    }

    ASSERT_EQ(store_cas(s, "run/1", "v2", 2, r1, &r2), 0);
    ASSERT_GT(r2, r1);
    ASSERT_EQ(store_cas(s, "run/1", "v3", 2, r1, &r3), -ESTALE); /* r1 is stale now */
    ASSERT_EQ(r3, 0);                                            /* untouched on failure */
    {
        _cleanup_kv_ store_kv_t kv = { 0 };
        ASSERT_EQ(store_get(s, "run/1", &kv), 0);
        ASSERT_MEMEQ(kv.value, kv.value_len, "v2", 2); /* the stale write changed nothing */
        ASSERT_EQ(kv.rev, r2);
    }

    ASSERT_EQ(store_cas(s, "run/1", "v4", 2, STORE_REV_ANY, &r4), 0);
    ASSERT_GT(r4, r2);
    {
        _cleanup_kv_ store_kv_t kv = { 0 };
        ASSERT_EQ(store_get(s, "run/1", &kv), 0);
        ASSERT_MEMEQ(kv.value, kv.value_len, "v4", 2);
        ASSERT_EQ(kv.rev, r4);
    }

    /* A real revision asks for an existing key: on an absent one the comparison fails. */
    ASSERT_EQ(store_cas(s, "run/2", "x", 1, r4, NULL), -ESTALE);
    store_kv_t kv = { 0 };
    ASSERT_EQ(store_get(s, "run/2", &kv), -ENOENT);
    /* STORE_REV_ANY creates. */
    ASSERT_EQ(store_cas(s, "run/2", "x", 1, STORE_REV_ANY, NULL), 0);
    ASSERT_EQ(store_get(s, "run/2", &kv), 0);
    ASSERT_GT(kv.rev, r4);
    store_kv_clear(&kv);
}

TEST(revisions_increase_across_keys)
{
    char path[256];
    db_path("revs", path, sizeof path);
    _cleanup_store_ store_t *s = NULL;
    ASSERT_EQ(store_open_sqlite(path, &s), 0);
    int64_t prev = 0, rev = 0;
    const char *keys[] = { "a", "b", "a", "c", "b", "a" };
    for (size_t i = 0; i < ELEMENTSOF(keys); i++) {
        ASSERT_EQ(store_cas(s, keys[i], "v", 1, STORE_REV_ANY, &rev), 0);
        ASSERT_EQ(rev, prev + 1); /* one write, one revision, whatever the key */
        prev = rev;
    }
    _cleanup_kv_ store_kv_t a = { 0 }, b = { 0 }, c = { 0 };
    ASSERT_EQ(store_get(s, "a", &a), 0);
    ASSERT_EQ(store_get(s, "b", &b), 0);
    ASSERT_EQ(store_get(s, "c", &c), 0);
    ASSERT_EQ(a.rev, 6);
    ASSERT_EQ(b.rev, 5);
    ASSERT_EQ(c.rev, 4);

    /* A delete consumes a revision too (as in etcd); a failed write consumes none. */
    ASSERT_EQ(store_del(s, "c", STORE_REV_ANY), 0);
    ASSERT_EQ(store_cas(s, "a", "v", 1, 1, NULL), -ESTALE);
    ASSERT_EQ(store_del(s, "b", 1), -ESTALE);
    ASSERT_EQ(store_cas(s, "d", "v", 1, STORE_REV_ABSENT, &rev), 0);
    ASSERT_EQ(rev, 8);
}

TEST(del_with_rev_stale_rev_and_any)
{
    char path[256];
    db_path("del", path, sizeof path);
    _cleanup_store_ store_t *s = NULL;
    ASSERT_EQ(store_open_sqlite(path, &s), 0);
    int64_t rev = 0;
    store_kv_t kv = { 0 };

    ASSERT_EQ(store_del(s, "k", STORE_REV_ANY), -ENOENT);
    ASSERT_EQ(store_del(s, "k", 3), -ENOENT);

    ASSERT_EQ(store_cas(s, "k", "v", 1, STORE_REV_ABSENT, &rev), 0);
    ASSERT_EQ(store_cas(s, "other", "v", 1, STORE_REV_ABSENT, NULL), 0);
    ASSERT_EQ(store_del(s, "k", rev + 1), -ESTALE);
    ASSERT_EQ(store_get(s, "k", &kv), 0); /* still there */
    ASSERT_EQ(kv.rev, rev);
    store_kv_clear(&kv);
    ASSERT_EQ(store_del(s, "k", rev), 0);
    ASSERT_EQ(store_get(s, "k", &kv), -ENOENT);
    ASSERT_EQ(store_del(s, "k", rev), -ENOENT);

    /* Gone means absent: it can be created again with STORE_REV_ABSENT. */
    ASSERT_EQ(store_cas(s, "k", "w", 1, STORE_REV_ABSENT, &rev), 0);
    ASSERT_EQ(store_del(s, "k", STORE_REV_ANY), 0);
    ASSERT_EQ(store_get(s, "k", &kv), -ENOENT);
    ASSERT_EQ(store_get(s, "other", &kv), 0); /* control: deletes touch only their key */
    store_kv_clear(&kv);
}

static void expect_list(store_t *s, const char *prefix, const char *const *want, size_t nwant)
{
    store_kv_t *kvs = NULL;
    size_t n = 0;
    printf("#   list \"%s\"\n", prefix);
    ASSERT_EQ(store_list(s, prefix, &kvs, &n), 0);
    for (size_t i = 0; i < n && i < nwant; i++) {
        if (strcmp(kvs[i].key, want[i]) != 0)
            printf("#     [%zu] %s, want %s\n", i, kvs[i].key, want[i]);
        ASSERT_STREQ(kvs[i].key, want[i]);
        /* each key's value is the key itself, with its revision */
        ASSERT_MEMEQ(kvs[i].value, kvs[i].value_len, want[i], strlen(want[i]));
        ASSERT_GT(kvs[i].rev, 0);
    }
    ASSERT_EQ_U(n, nwant);
    store_kv_free(kvs, n);
}

TEST(list_by_prefix)
{
    char path[256];
    db_path("list", path, sizeof path);
    _cleanup_store_ store_t *s = NULL;
    ASSERT_EQ(store_open_sqlite(path, &s), 0);
    /* Inserted out of order; '0' (0x30) is '/' + 1 and '~' (0x7e) the highest key byte. */
    const char *keys[] = { "b/", "a0",  "a/y/z", "~~", "a",   "a/", "a~",
                           "}",  "a/x", "a.",    "~",  "a~~", "b" };
    for (size_t i = 0; i < ELEMENTSOF(keys); i++)
        ASSERT_EQ(store_cas(s, keys[i], keys[i], strlen(keys[i]), STORE_REV_ABSENT, NULL), 0);

    const char *slash[] = { "a/", "a/x", "a/y/z" };
    expect_list(s, "a/", slash, ELEMENTSOF(slash));
    if (tap_failed_)
        return;
    const char *a[] = { "a", "a.", "a/", "a/x", "a/y/z", "a0", "a~", "a~~" };
    expect_list(s, "a", a, ELEMENTSOF(a));
    if (tap_failed_)
        return;
    const char *all[] = { "a",   "a.", "a/", "a/x", "a/y/z", "a0", "a~",
                          "a~~", "b",  "b/", "}",   "~",     "~~" };
    expect_list(s, "", all, ELEMENTSOF(all));
    if (tap_failed_)
        return;
    const char *tilde[] = { "~", "~~" };
    expect_list(s, "~", tilde, ELEMENTSOF(tilde));
    if (tap_failed_)
        return;
    const char *atilde[] = { "a~", "a~~" };
    expect_list(s, "a~", atilde, ELEMENTSOF(atilde));
    if (tap_failed_)
        return;
    const char *exact[] = { "a/y/z" };
    expect_list(s, "a/y/z", exact, ELEMENTSOF(exact));
    if (tap_failed_)
        return;
    expect_list(s, "a/y/zz", NULL, 0);
    if (tap_failed_)
        return;
    expect_list(s, "c", NULL, 0);
}

TEST(invalid_keys_and_values_are_refused)
{
    char path[256];
    db_path("invalid", path, sizeof path);
    _cleanup_store_ store_t *s = NULL;
    ASSERT_EQ(store_open_sqlite(path, &s), 0);
    char long_key[STORE_KEY_MAX + 2];
    memset(long_key, 'k', sizeof long_key);
    long_key[STORE_KEY_MAX + 1] = '\0';
    const char *bad[] = {
        "", "a b", " ", "a\tb", "a\nb", "a\x01", "\x7f", "a\x80", "\xff", long_key
    };
    store_kv_t kv = { 0 };
    store_kv_t *kvs = NULL;
    size_t n = 0;
    for (size_t i = 0; i < ELEMENTSOF(bad); i++) {
        printf("#   key %zu\n", i);
        ASSERT_EQ(store_cas(s, bad[i], "v", 1, STORE_REV_ANY, NULL), -EINVAL);
        ASSERT_EQ(store_get(s, bad[i], &kv), -EINVAL);
        ASSERT_EQ(store_del(s, bad[i], STORE_REV_ANY), -EINVAL);
        if (i > 0) /* the empty prefix is valid for list */
            ASSERT_EQ(store_list(s, bad[i], &kvs, &n), -EINVAL);
    }
    ASSERT_EQ(store_cas(s, NULL, "v", 1, STORE_REV_ANY, NULL), -EINVAL);
    ASSERT_EQ(store_list(s, NULL, &kvs, &n), -EINVAL);
    ASSERT_EQ(store_list(s, "", &kvs, &n), 0);
    ASSERT_EQ_U(n, 0); /* none of the refused writes landed */
    store_kv_free(kvs, n);

    /* Control: the longest key and the largest value are accepted. */
    long_key[STORE_KEY_MAX] = '\0';
    ASSERT_EQ(store_cas(s, long_key, "v", 1, STORE_REV_ABSENT, NULL), 0);
    ASSERT_EQ(store_get(s, long_key, &kv), 0);
    ASSERT_EQ_U(strlen(kv.key), STORE_KEY_MAX);
    store_kv_clear(&kv);
    ASSERT_EQ(store_cas(s, "!~", "v", 1, STORE_REV_ABSENT, NULL), 0); /* the extreme bytes */

    _cleanup_free_ char *big = malloc(STORE_VALUE_MAX + 1);
    ASSERT_TRUE(big != NULL);
    memset(big, 'x', STORE_VALUE_MAX + 1);
    ASSERT_EQ(store_cas(s, "big", big, STORE_VALUE_MAX + 1, STORE_REV_ANY, NULL), -EINVAL);
    ASSERT_EQ(store_get(s, "big", &kv), -ENOENT);
    ASSERT_EQ(store_cas(s, "big", big, STORE_VALUE_MAX, STORE_REV_ANY, NULL), 0);
    ASSERT_EQ(store_get(s, "big", &kv), 0);
    ASSERT_EQ_U(kv.value_len, STORE_VALUE_MAX);
    store_kv_clear(&kv);

    /* Other nonsense arguments. */
    ASSERT_EQ(store_cas(s, "k", NULL, 1, STORE_REV_ANY, NULL), -EINVAL);
    ASSERT_EQ(store_cas(s, "k", "v", 1, -2, NULL), -EINVAL);
    ASSERT_EQ(store_del(s, "big", STORE_REV_ABSENT), -EINVAL);
    ASSERT_EQ(store_get(s, "big", &kv), 0); /* still there */
    store_kv_clear(&kv);
    ASSERT_EQ(store_open_sqlite("", &s), -EINVAL);
    ASSERT_EQ(store_open_sqlite(":memory:", &s), -EINVAL);
    ASSERT_EQ(store_open_sqlite(tmpdir, &s), -EISDIR);
}

TEST(values_with_nul_bytes_round_trip)
{
    char path[256];
    db_path("nul", path, sizeof path);
    _cleanup_store_ store_t *s = NULL;
    ASSERT_EQ(store_open_sqlite(path, &s), 0);
    static const char val[] = { 'a', '\0', 'b', '\0', '\0', (char)0xff };
    ASSERT_EQ(store_cas(s, "bin", val, sizeof val, STORE_REV_ABSENT, NULL), 0);
    ASSERT_EQ(store_cas(s, "empty", NULL, 0, STORE_REV_ABSENT, NULL), 0);
    {
        _cleanup_kv_ store_kv_t kv = { 0 };
        ASSERT_EQ(store_get(s, "bin", &kv), 0);
        ASSERT_MEMEQ(kv.value, kv.value_len, val, sizeof val);
        ASSERT_EQ(kv.value[kv.value_len], '\0'); /* NUL-terminated past the bytes */
    }
    {
        _cleanup_kv_ store_kv_t kv = { 0 };
        ASSERT_EQ(store_get(s, "empty", &kv), 0);
        ASSERT_EQ_U(kv.value_len, 0);
        ASSERT_TRUE(kv.value != NULL);
        ASSERT_EQ(kv.value[0], '\0');
    }
    store_kv_t *kvs = NULL;
    size_t n = 0;
    ASSERT_EQ(store_list(s, "", &kvs, &n), 0);
    ASSERT_EQ_U(n, 2);
    ASSERT_STREQ(kvs[0].key, "bin");
    ASSERT_MEMEQ(kvs[0].value, kvs[0].value_len, val, sizeof val);
    ASSERT_EQ(kvs[0].value[kvs[0].value_len], '\0');
    ASSERT_STREQ(kvs[1].key, "empty");
    ASSERT_EQ_U(kvs[1].value_len, 0);
    store_kv_free(kvs, n);
}

TEST(reopen_persists_and_files_are_0600)
{
    char path[256], wal[300], shm[300];
    db_path("persist", path, sizeof path);
    (void)snprintf(wal, sizeof wal, "%s-wal", path);
    (void)snprintf(shm, sizeof shm, "%s-shm", path);
    /* A permissive umask, so that 0600 comes from the store and not from the environment. */
    mode_t old_umask = umask(022);
    int64_t rev = 0;
    {
        _cleanup_store_ store_t *s = NULL;
        int r = store_open_sqlite(path, &s);
        if (r >= 0)
            r = store_cas(s, "run/7/gen/1", "{\"a\":1}", 7, STORE_REV_ABSENT, &rev);
        int mdb = mode_of(path), mwal = mode_of(wal), mshm = mode_of(shm);
        umask(old_umask);
        ASSERT_EQ(r, 0);
        ASSERT_EQ(mdb, 0600);
        ASSERT_EQ(mwal, 0600); /* open while the store is: WAL mode is in force */
        ASSERT_EQ(mshm, 0600);
    }
    {
        _cleanup_store_ store_t *s = NULL;
        ASSERT_EQ(store_open_sqlite(path, &s), 0);
        _cleanup_kv_ store_kv_t kv = { 0 };
        ASSERT_EQ(store_get(s, "run/7/gen/1", &kv), 0);
        ASSERT_MEMEQ(kv.value, kv.value_len, "{\"a\":1}", 7);
        ASSERT_EQ(kv.rev, rev);
        int64_t rev2 = 0;
        ASSERT_EQ(store_cas(s, "x", "y", 1, STORE_REV_ABSENT, &rev2), 0);
        ASSERT_EQ(rev2, rev + 1); /* the store revision persisted too */
    }
    ASSERT_EQ(mode_of(path), 0600);

    /* An existing file that others can read is tightened; the positive control shows that the
     * file really was 0644 before. */
    char loose[256];
    db_path("loose", loose, sizeof loose);
    _cleanup_close_ int fd = open(loose, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(fchmod(fd, 0644), 0);
    ASSERT_EQ(mode_of(loose), 0644);
    _cleanup_store_ store_t *s = NULL;
    ASSERT_EQ(store_open_sqlite(loose, &s), 0);
    ASSERT_EQ(mode_of(loose), 0600);
}

/* ---- two processes, one file ---- */

#define COUNTER_KEY "counter"
#define INCREMENTS 500
#define RACE_KEYS 200

typedef struct {
    int err;            /* first unexpected error, 0 if none */
    unsigned done;      /* increments made, or keys won */
    unsigned conflicts; /* -ESTALE answers */
} child_report_t;

/* Tell the parent this child is ready (its store is open), then block until the parent closes
 * the barrier's write end, which it does once both children are ready: they start together. */
static void barrier_wait(int ready, int barrier)
{
    char c = 'r';
    while (write(ready, &c, 1) < 0 && errno == EINTR)
        ;
    while (read(barrier, &c, 1) < 0 && errno == EINTR)
        ;
}

static int counter_increment(store_t *s, unsigned *conflicts)
{
    for (;;) {
        store_kv_t kv = { 0 };
        int r = store_get(s, COUNTER_KEY, &kv);
        if (r < 0)
            return r;
        uint64_t v = 0;
        r = parse_u64(sv_make(kv.value, kv.value_len), UINT64_MAX - 1, &v);
        int64_t rev = kv.rev;
        store_kv_clear(&kv);
        if (r < 0)
            return r;
        char num[24];
        int len = snprintf(num, sizeof num, "%" PRIu64, v + 1);
        /* Time between the read and the write, as real work would take, so that the other
         * writer's turns land inside it and the compare has something to catch. */
        (void)usleep(20);
        r = store_cas(s, COUNTER_KEY, num, (size_t)len, rev, NULL);
        if (r != -ESTALE)
            return r;
        (*conflicts)++; /* the other process wrote in between: read again */
    }
}

/* A new store file holding the counter at "0". */
static int counter_file(const char *name, char *path, size_t cap)
{
    db_path(name, path, cap);
    _cleanup_store_ store_t *s = NULL;
    int r = store_open_sqlite(path, &s);
    return r < 0 ? r : store_cas(s, COUNTER_KEY, "0", 1, STORE_REV_ABSENT, NULL);
}

static child_report_t child_counter(const char *path, int ready, int barrier)
{
    child_report_t rep = { 0 };
    store_t *s = NULL;
    rep.err = store_open_sqlite(path, &s);
    barrier_wait(ready, barrier);
    for (unsigned i = 0; rep.err >= 0 && i < INCREMENTS; i++) {
        rep.err = counter_increment(s, &rep.conflicts);
        rep.done += rep.err >= 0;
    }
    store_close(s);
    return rep;
}

/* Both children open the new file at once too, and so race to create its schema. */
static child_report_t child_create(const char *path, int ready, int barrier)
{
    child_report_t rep = { 0 };
    store_t *s = NULL;
    rep.err = store_open_sqlite(path, &s);
    barrier_wait(ready, barrier);
    char pid[24];
    int plen = snprintf(pid, sizeof pid, "%d", (int)getpid());
    for (unsigned i = 0; rep.err >= 0 && i < RACE_KEYS; i++) {
        char key[64];
        (void)snprintf(key, sizeof key, "run/%u/gen/1", i);
        int r = store_cas(s, key, pid, (size_t)plen, STORE_REV_ABSENT, NULL);
        if (r == 0)
            rep.done++;
        else if (r == -ESTALE)
            rep.conflicts++;
        else
            rep.err = r;
    }
    store_close(s);
    return rep;
}

/* Fork two children running fn on path, release them at once, collect their reports. */
static int run_two(child_report_t (*fn)(const char *, int, int), const char *path, pid_t pids[2],
                   child_report_t reps[2])
{
    int ready[2], barrier[2], report[2][2];
    /* A test: on a failed pipe2 or fork the fds already made leak until exit. */
    if (pipe2(ready, O_CLOEXEC) < 0 || pipe2(barrier, O_CLOEXEC) < 0)
        return negative_errno();
    for (int i = 0; i < 2; i++)
        if (pipe2(report[i], O_CLOEXEC) < 0)
            return negative_errno();
    fflush(stdout);
    for (int i = 0; i < 2; i++) {
        pids[i] = fork();
        if (pids[i] < 0)
            return negative_errno();
        if (pids[i] == 0) {
            close(barrier[1]);
            child_report_t rep = fn(path, ready[1], barrier[0]);
            ssize_t w = write(report[i][1], &rep, sizeof rep);
            _exit(w == (ssize_t)sizeof rep ? 0 : 1);
        }
    }
    close(ready[1]);
    char c[2];
    size_t got = 0;
    while (got < 2) { /* both ready, or EOF if a child died first */
        ssize_t n = read(ready[0], c + got, 2 - got);
        if (n <= 0 && !(n < 0 && errno == EINTR))
            break;
        got += n > 0 ? (size_t)n : 0;
    }
    close(ready[0]);
    close(barrier[1]); /* go */
    close(barrier[0]);
    int r = 0;
    for (int i = 0; i < 2; i++) {
        close(report[i][1]);
        ssize_t n = read(report[i][0], &reps[i], sizeof reps[i]);
        if (n != (ssize_t)sizeof reps[i])
            r = -EPIPE;
        close(report[i][0]);
    }
    for (int i = 0; i < 2; i++) {
        int status;
        if (waitpid(pids[i], &status, 0) < 0)
            r = negative_errno();
        else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            r = -ECHILD;
    }
    return r;
}

TEST(two_writers_increment_one_counter)
{
    char path[256];
    ASSERT_EQ(counter_file("counter", path, sizeof path), 0);
    pid_t pids[2];
    child_report_t reps[2] = { 0 };
    double t0 = now_s();
    ASSERT_EQ(run_two(child_counter, path, pids, reps), 0);
    double dt = now_s() - t0;
    unsigned conflicts = reps[0].conflicts + reps[1].conflicts;
    printf("# counter: %u CAS conflicts (%u + %u), %.2f s\n", conflicts, reps[0].conflicts,
           reps[1].conflicts, dt);
    if (conflicts == 0)
        printf("# note: no conflicts seen; the writers did not overlap this time\n");
    ASSERT_EQ(reps[0].err, 0);
    ASSERT_EQ(reps[1].err, 0);
    ASSERT_EQ(reps[0].done, INCREMENTS);
    ASSERT_EQ(reps[1].done, INCREMENTS);

    _cleanup_store_ store_t *s = NULL;
    ASSERT_EQ(store_open_sqlite(path, &s), 0);
    _cleanup_kv_ store_kv_t kv = { 0 };
    ASSERT_EQ(store_get(s, COUNTER_KEY, &kv), 0);
    ASSERT_STREQ(kv.value, "1000");
    ASSERT_EQ(kv.rev, 1 + 2 * INCREMENTS); /* one revision per successful write, none lost */
}

TEST(two_writers_race_to_create)
{
    char path[256];
    db_path("create", path, sizeof path);
    pid_t pids[2];
    child_report_t reps[2] = { 0 };
    double t0 = now_s();
    ASSERT_EQ(run_two(child_create, path, pids, reps), 0);
    double dt = now_s() - t0;
    printf("# create: wins %u + %u, losses %u + %u, %.2f s\n", reps[0].done, reps[1].done,
           reps[0].conflicts, reps[1].conflicts, dt);
    ASSERT_EQ(reps[0].err, 0);
    ASSERT_EQ(reps[1].err, 0);
    ASSERT_EQ(reps[0].done + reps[1].done, RACE_KEYS);
    ASSERT_EQ(reps[0].done + reps[0].conflicts, RACE_KEYS);
    ASSERT_EQ(reps[1].done + reps[1].conflicts, RACE_KEYS);

    /* Each key holds exactly one winner's pid, and each pid as often as that child won. */
    _cleanup_store_ store_t *s = NULL;
    ASSERT_EQ(store_open_sqlite(path, &s), 0);
    store_kv_t *kvs = NULL;
    size_t n = 0;
    ASSERT_EQ(store_list(s, "run/", &kvs, &n), 0);
    unsigned owned[2] = { 0, 0 };
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t pid = 0;
        if (parse_u64(sv_make(kvs[i].value, kvs[i].value_len), INT32_MAX, &pid) < 0)
            bad++;
        else if ((pid_t)pid == pids[0])
            owned[0]++;
        else if ((pid_t)pid == pids[1])
            owned[1]++;
        else
            bad++;
    }
    store_kv_free(kvs, n);
    ASSERT_EQ_U(n, RACE_KEYS);
    ASSERT_EQ(bad, 0);
    ASSERT_EQ(owned[0], reps[0].done);
    ASSERT_EQ(owned[1], reps[1].done);
}

/* Threads of one process, each with its own handle as the control plane's workers have, queue
 * on the store's writer mutex: every increment lands, none is lost. */
#define THREADS 4

typedef struct {
    const char *path;
    child_report_t rep;
} thread_arg_t;

static void *thread_counter(void *p)
{
    thread_arg_t *a = p;
    store_t *s = NULL;
    a->rep.err = store_open_sqlite(a->path, &s);
    for (unsigned i = 0; a->rep.err >= 0 && i < INCREMENTS / THREADS; i++) {
        a->rep.err = counter_increment(s, &a->rep.conflicts);
        a->rep.done += a->rep.err >= 0;
    }
    store_close(s);
    return NULL;
}

TEST(threads_increment_one_counter)
{
    char path[256];
    ASSERT_EQ(counter_file("threads", path, sizeof path), 0);
    pthread_t th[THREADS];
    thread_arg_t args[THREADS];
    for (int i = 0; i < THREADS; i++) {
        args[i] = (thread_arg_t){ .path = path };
        ASSERT_EQ(pthread_create(&th[i], NULL, thread_counter, &args[i]), 0);
    }
    for (int i = 0; i < THREADS; i++)
        ASSERT_EQ(pthread_join(th[i], NULL), 0);
    for (int i = 0; i < THREADS; i++) {
        ASSERT_EQ(args[i].rep.err, 0);
        ASSERT_EQ(args[i].rep.done, INCREMENTS / THREADS);
    }
    _cleanup_store_ store_t *s = NULL;
    ASSERT_EQ(store_open_sqlite(path, &s), 0);
    _cleanup_kv_ store_kv_t kv = { 0 };
    ASSERT_EQ(store_get(s, COUNTER_KEY, &kv), 0);
    char want[24];
    (void)snprintf(want, sizeof want, "%u", INCREMENTS / THREADS * THREADS);
    ASSERT_STREQ(kv.value, want);
}

static void remove_tmpdir(void)
{
    DIR *d = opendir(tmpdir);
    if (d) {
        struct dirent *de;
        while ((de = readdir(d)))
            if (!streq(de->d_name, ".") && !streq(de->d_name, ".."))
                (void)unlinkat(dirfd(d), de->d_name, 0);
        closedir(d);
    }
    (void)rmdir(tmpdir);
}

TEST(txn_all_or_nothing_under_one_revision)
{
    char path[256];
    db_path("txn", path, sizeof path);
    _cleanup_store_ store_t *s = NULL;
    ASSERT_EQ(store_open_sqlite(path, &s), 0);
    int64_t ra = 0, rb = 0, rt = 0, rt2 = 0;
    ASSERT_EQ(store_cas(s, "host/1", "h1", 2, STORE_REV_ABSENT, &ra), 0);
    ASSERT_EQ(store_cas(s, "sbx/old", "o", 1, STORE_REV_ABSENT, &rb), 0);

    /* two creates, a delete at its revision, an update at its revision and a delete of an
     * absent key (nothing to do): all written under one new revision */
    store_op_t ops[] = {
        { "sbx/a", "A", 1, STORE_REV_ABSENT },
        { "sbx/b", "B", 1, STORE_REV_ABSENT },
        { "sbx/old", NULL, 0, rb },
        { "host/1", "h2", 2, ra },
        { "sbx/none", NULL, 0, STORE_REV_ANY },
    };
    size_t failed = 77;
    ASSERT_EQ(store_txn(s, ops, ELEMENTSOF(ops), &rt, &failed), 0);
    ASSERT_EQ(failed, 77u); /* untouched on success */
    ASSERT_GT(rt, rb);
    const char *written[] = { "sbx/a", "sbx/b", "host/1" };
    for (size_t i = 0; i < ELEMENTSOF(written); i++) {
        _cleanup_kv_ store_kv_t kv = { 0 };
        ASSERT_EQ(store_get(s, written[i], &kv), 0);
        ASSERT_EQ(kv.rev, rt);
    }
    store_kv_t gone = { 0 };
    ASSERT_EQ(store_get(s, "sbx/old", &gone), -ENOENT);

    /* one stale comparison (host/1 at its old revision): -ESTALE naming it, nothing written,
     * and no revision spent */
    store_op_t stale[] = {
        { "sbx/c", "C", 1, STORE_REV_ABSENT },
        { "sbx/a", NULL, 0, rt },
        { "host/1", "h3", 2, ra },
    };
    ASSERT_EQ(store_txn(s, stale, ELEMENTSOF(stale), &rt2, &failed), -ESTALE);
    ASSERT_EQ(failed, 2u);
    ASSERT_EQ(rt2, 0);
    store_kv_t kv = { 0 };
    ASSERT_EQ(store_get(s, "sbx/c", &kv), -ENOENT);
    ASSERT_EQ(store_get(s, "sbx/a", &kv), 0); /* the delete did not happen either */
    store_kv_clear(&kv);
    ASSERT_EQ(store_get(s, "host/1", &kv), 0);
    ASSERT_MEMEQ(kv.value, kv.value_len, "h2", 2);
    store_kv_clear(&kv);
    /* a create of an existing key is a failed comparison too */
    store_op_t exists[] = { { "sbx/d", "D", 1, STORE_REV_ABSENT }, { "sbx/b", "B", 1, 0 } };
    ASSERT_EQ(store_txn(s, exists, 2, NULL, &failed), -ESTALE);
    ASSERT_EQ(failed, 1u);
    ASSERT_EQ(store_get(s, "sbx/d", &kv), -ENOENT);
    int64_t next = 0;
    ASSERT_EQ(store_cas(s, "x", "x", 1, STORE_REV_ANY, &next), 0);
    ASSERT_EQ(next, rt + 1); /* the failed transactions spent no revision */
}

TEST(txn_refuses_what_it_cannot_mean)
{
    char path[256];
    db_path("txnbad", path, sizeof path);
    _cleanup_store_ store_t *s = NULL;
    ASSERT_EQ(store_open_sqlite(path, &s), 0);
    store_op_t twice[] = { { "k/1", "a", 1, STORE_REV_ANY },
                           { "k/2", "b", 1, STORE_REV_ANY },
                           { "k/1", NULL, 0, STORE_REV_ANY } };
    ASSERT_EQ(store_txn(s, twice, ELEMENTSOF(twice), NULL, NULL), -EINVAL); /* one op per key */
    store_op_t del_absent[] = { { "k/1", NULL, 0, STORE_REV_ABSENT } };
    ASSERT_EQ(store_txn(s, del_absent, 1, NULL, NULL), -EINVAL);
    store_op_t bad_key[] = { { "k 1", "a", 1, STORE_REV_ANY } };
    ASSERT_EQ(store_txn(s, bad_key, 1, NULL, NULL), -EINVAL);
    ASSERT_EQ(store_txn(s, twice, STORE_TXN_MAX + 1, NULL, NULL), -EINVAL);
    ASSERT_EQ(store_txn(s, twice, 0, NULL, NULL), -EINVAL); /* no op */
    store_kv_t kv = { 0 };
    ASSERT_EQ(store_get(s, "k/1", &kv), -ENOENT); /* nothing of any of them was written */
    ASSERT_EQ(store_get(s, "k/2", &kv), -ENOENT);
}

int main(void)
{
    if (!mkdtemp(tmpdir)) {
        printf("Bail out! mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    const tap_test_t tests[] = {
        T(get_missing_key),
        T(cas_create_update_stale_any),
        T(revisions_increase_across_keys),
        T(del_with_rev_stale_rev_and_any),
        T(list_by_prefix),
        T(invalid_keys_and_values_are_refused),
        T(values_with_nul_bytes_round_trip),
        T(reopen_persists_and_files_are_0600),
        T(two_writers_increment_one_counter),
        T(two_writers_race_to_create),
        T(threads_increment_one_counter),
        T(txn_all_or_nothing_under_one_revision),
        T(txn_refuses_what_it_cannot_mean),
    };
    int r = tap_run(tests, ELEMENTSOF(tests));
    remove_tmpdir();
    return r;
}
