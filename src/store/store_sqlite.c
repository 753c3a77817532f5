/* SPDX-License-Identifier: MIT */
/* The embedded store backend: one SQLite file in WAL mode that several control processes may
 * share.
 *
 *   kv(key TEXT PRIMARY KEY, value BLOB NOT NULL, rev INTEGER NOT NULL)
 *   meta(rev INTEGER NOT NULL)            one row: the store revision, 0 in a new file
 *
 * Like etcd, every successful write (cas or del) increments the store revision and stamps the
 * written key with it, so mod revisions are unique and strictly increasing across all keys. Each
 * write is one BEGIN IMMEDIATE transaction: the write lock is taken before the current revision
 * is read, so the compare and the swap see the same state even when another process writes the
 * same file; a writer that finds the lock held waits up to BUSY_TIMEOUT_MS and then fails with
 * -EBUSY. Writers of one process (the control plane's threads) queue on a mutex first: the
 * busy handler sleeps 1, 2, 5... ms between tries, which under four concurrent clients of the
 * pool service was ~55 sleeps a second, each one a client waiting on an idle CPU; a waiter on
 * the mutex is woken as soon as the lock is free. (A second process writing the same file still
 * waits in the busy handler, and under a sustained stream of one process's writes may wait out
 * BUSY_TIMEOUT_MS; and a writer queued behind one that waits there for another process waits
 * that long in turn, so BUSY_TIMEOUT_MS bounds each wait for the file lock, not the write.
 * The mutex is the process's, over all its store files.)
 *
 * Threads: the connection is opened SQLITE_OPEN_NOMUTEX, and the prepared statements cached in
 * the struct are shared state, so a store_t is used by one thread at a time (the control plane
 * opens one per thread). A store_t must not be used across fork(): the child opens its own. */
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/macro.h"

#define BUSY_TIMEOUT_MS 5000
#define WAL_RETRY_MS 5

enum {
    ST_BEGIN,
    ST_COMMIT,
    ST_ROLLBACK,
    ST_GET,
    ST_GET_REV,
    ST_PUT,
    ST_DELETE,
    ST_BUMP,
    ST_STORE_REV,
    ST_LIST_RANGE,
    ST_LIST_FROM,
    ST__MAX,
};

static const char *const stmt_sql[ST__MAX] = {
    [ST_BEGIN] = "BEGIN IMMEDIATE",
    [ST_COMMIT] = "COMMIT",
    [ST_ROLLBACK] = "ROLLBACK",
    [ST_GET] = "SELECT key, value, rev FROM kv WHERE key = ?1",
    [ST_GET_REV] = "SELECT rev FROM kv WHERE key = ?1",
    [ST_PUT] = "INSERT OR REPLACE INTO kv(key, value, rev) VALUES (?1, ?2, ?3)",
    [ST_DELETE] = "DELETE FROM kv WHERE key = ?1",
    [ST_BUMP] = "UPDATE meta SET rev = rev + 1",
    [ST_STORE_REV] = "SELECT rev FROM meta",
    /* Keys are compared bytewise (BINARY collation), so [prefix, successor) is exactly the
     * keys that start with prefix, and the primary key index serves the range. */
    [ST_LIST_RANGE] = "SELECT key, value, rev FROM kv WHERE key >= ?1 AND key < ?2 ORDER BY key",
    [ST_LIST_FROM] = "SELECT key, value, rev FROM kv WHERE key >= ?1 ORDER BY key",
};

/* The schema, created in one write transaction so that two processes opening a new file at
 * once cannot both insert the meta row. */
static const char schema_sql[] =
    "BEGIN IMMEDIATE;"
    "CREATE TABLE IF NOT EXISTS kv(key TEXT PRIMARY KEY, value BLOB NOT NULL,"
    " rev INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS meta(rev INTEGER NOT NULL);"
    "INSERT INTO meta(rev) SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM meta);"
    "COMMIT;";

typedef struct {
    store_t base; /* first: a store_t * is a sqlite_store_t * */
    sqlite3 *db;
    sqlite3_stmt *st[ST__MAX];
} sqlite_store_t;

static int sql_err(int rc)
{
    switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED: return -EBUSY;
    case SQLITE_NOMEM: return -ENOMEM;
    default: return -EIO;
    }
}

/* Make a cached statement ready for the next use. */
static void stmt_done(sqlite3_stmt *st)
{
    (void)sqlite3_reset(st);
    (void)sqlite3_clear_bindings(st);
}

/* Run a statement that returns no rows. */
static int stmt_run(sqlite3_stmt *st)
{
    int rc = sqlite3_step(st);
    stmt_done(st);
    return rc == SQLITE_DONE ? 0 : sql_err(rc);
}

static int bind_key(sqlite3_stmt *st, int idx, const char *key)
{
    int rc = sqlite3_bind_text(st, idx, key, -1, SQLITE_STATIC);
    return rc == SQLITE_OK ? 0 : sql_err(rc);
}

static void sqlite_close(store_t *base)
{
    sqlite_store_t *s = (sqlite_store_t *)base;
    if (!s)
        return;
    for (size_t i = 0; i < ST__MAX; i++)
        (void)sqlite3_finalize(s->st[i]);
    /* sqlite3_close_v2: the handle goes away even if something were still unfinalized. */
    (void)sqlite3_close_v2(s->db);
    free(s);
}

static void sqlite_storep(sqlite_store_t **p) { sqlite_close(*p ? &(*p)->base : NULL); }

/* ---- transactions ---- */

/* This process's writers, one at a time (see the top). */
static pthread_mutex_t writers = PTHREAD_MUTEX_INITIALIZER;

static int tx_commit(sqlite_store_t *s) { return stmt_run(s->st[ST_COMMIT]); }

/* Some errors (I/O, full disk, out of memory) already rolled the transaction back; only roll
 * back one that is still open. */
static void tx_rollback(sqlite_store_t *s)
{
    if (!sqlite3_get_autocommit(s->db))
        (void)stmt_run(s->st[ST_ROLLBACK]);
}

/* A write transaction (BEGIN IMMEDIATE), ended by tx_end. */
static int tx_begin(sqlite_store_t *s)
{
    (void)pthread_mutex_lock(&writers);
    int r = stmt_run(s->st[ST_BEGIN]);
    if (r < 0)
        (void)pthread_mutex_unlock(&writers);
    return r;
}

/* Commit a write that went well (r >= 0), roll back one that did not; the mutex is let go. */
static int tx_end(sqlite_store_t *s, int r)
{
    if (r >= 0)
        r = tx_commit(s);
    if (r < 0)
        tx_rollback(s);
    (void)pthread_mutex_unlock(&writers);
    return r;
}

/* The key's mod revision, 0 when it is absent. */
static int current_rev(sqlite_store_t *s, const char *key, int64_t *ret_rev)
{
    sqlite3_stmt *st = s->st[ST_GET_REV];
    int r = bind_key(st, 1, key);
    if (r < 0) {
        stmt_done(st);
        return r;
    }
    int rc = sqlite3_step(st);
    int64_t rev = 0;
    if (rc == SQLITE_ROW)
        rev = sqlite3_column_int64(st, 0);
    else if (rc != SQLITE_DONE)
        r = sql_err(rc);
    stmt_done(st);
    if (r < 0)
        return r;
    if (rev < 0 || (rc == SQLITE_ROW && rev == 0))
        return -EIO; /* not a revision this code writes */
    *ret_rev = rev;
    return 0;
}

/* Increment the store revision inside the open transaction and return the new value. */
static int bump_rev(sqlite_store_t *s, int64_t *ret_rev)
{
    int r = stmt_run(s->st[ST_BUMP]);
    if (r < 0)
        return r;
    if (sqlite3_changes(s->db) != 1)
        return -EIO; /* the meta row is missing or duplicated */
    sqlite3_stmt *st = s->st[ST_STORE_REV];
    int rc = sqlite3_step(st);
    int64_t rev = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    stmt_done(st);
    if (rc != SQLITE_ROW)
        return rc == SQLITE_DONE ? -EIO : sql_err(rc);
    if (rev <= 0)
        return -EIO;
    *ret_rev = rev;
    return 0;
}

static int put_row(sqlite_store_t *s, const char *key, const char *value, size_t len, int64_t rev)
{
    sqlite3_stmt *st = s->st[ST_PUT];
    int r = bind_key(st, 1, key);
    if (r >= 0) {
        /* A non-NULL pointer even for len 0: a NULL one would bind SQL NULL, not an empty
         * blob. len is at most STORE_VALUE_MAX, checked by store_cas. */
        int rc = sqlite3_bind_blob(st, 2, value ? value : "", (int)len, SQLITE_STATIC);
        if (rc == SQLITE_OK)
            rc = sqlite3_bind_int64(st, 3, rev);
        if (rc != SQLITE_OK)
            r = sql_err(rc);
    }
    if (r < 0) {
        stmt_done(st);
        return r;
    }
    return stmt_run(st);
}

static int delete_row(sqlite_store_t *s, const char *key)
{
    sqlite3_stmt *st = s->st[ST_DELETE];
    int r = bind_key(st, 1, key);
    if (r < 0) {
        stmt_done(st);
        return r;
    }
    return stmt_run(st);
}

/* ---- reads ---- */

/* Copy the current row (key, value, rev) of st into ret; the value gets a trailing NUL. */
static int kv_from_row(sqlite3_stmt *st, store_kv_t *ret)
{
    const unsigned char *k = sqlite3_column_text(st, 0);
    int klen = sqlite3_column_bytes(st, 0);
    if (!k || klen <= 0)
        return -EIO; /* SQLite out of memory, or a row this code never writes */
    const void *v = sqlite3_column_blob(st, 1);
    int vlen = sqlite3_column_bytes(st, 1);
    if (vlen < 0 || (!v && vlen > 0))
        return -EIO;
    int64_t rev = sqlite3_column_int64(st, 2);
    if (rev <= 0)
        return -EIO;

    _cleanup_free_ char *key = malloc((size_t)klen + 1);
    _cleanup_free_ char *value = malloc((size_t)vlen + 1);
    if (!key || !value)
        return -ENOMEM;
    memcpy(key, k, (size_t)klen);
    key[klen] = '\0';
    if (vlen > 0)
        memcpy(value, v, (size_t)vlen);
    value[vlen] = '\0';
    *ret = (store_kv_t){
        .key = TAKE_PTR(key),
        .value = TAKE_PTR(value),
        .value_len = (size_t)vlen,
        .rev = rev,
    };
    return 0;
}

static int sqlite_get(store_t *base, const char *key, store_kv_t *ret)
{
    sqlite_store_t *s = (sqlite_store_t *)base;
    sqlite3_stmt *st = s->st[ST_GET];
    int r = bind_key(st, 1, key);
    if (r >= 0) {
        int rc = sqlite3_step(st);
        if (rc == SQLITE_ROW)
            r = kv_from_row(st, ret);
        else
            r = rc == SQLITE_DONE ? -ENOENT : sql_err(rc);
    }
    stmt_done(st);
    return r;
}

/* The smallest string above every string that starts with prefix: trailing 0xff bytes dropped
 * and the last remaining byte incremented. False when there is none (an empty prefix, or only
 * 0xff bytes): the range then has no upper bound. Valid keys never contain bytes above 0x7e,
 * so in practice this is the last byte + 1. */
static bool prefix_successor(const char *prefix, char *buf, size_t bufsz)
{
    size_t n = strlen(prefix);
    while (n > 0 && (unsigned char)prefix[n - 1] == 0xff)
        n--;
    if (n == 0 || n >= bufsz)
        return false;
    memcpy(buf, prefix, n);
    buf[n - 1] = (char)((unsigned char)buf[n - 1] + 1);
    buf[n] = '\0';
    return true;
}

static int list_grow(store_kv_t **kvs, size_t *cap)
{
    size_t ncap = *cap ? *cap : 16, bytes;
    if (*cap && !size_mul_ok(*cap, 2, &ncap))
        return -ENOMEM;
    if (!size_mul_ok(ncap, sizeof(store_kv_t), &bytes))
        return -ENOMEM;
    store_kv_t *n = realloc(*kvs, bytes);
    if (!n)
        return -ENOMEM;
    *kvs = n;
    *cap = ncap;
    return 0;
}

static int list_rows(sqlite3_stmt *st, store_kv_t **ret, size_t *ret_n)
{
    store_kv_t *kvs = NULL;
    size_t n = 0, cap = 0;
    int r = 0;
    for (;;) {
        int rc = sqlite3_step(st);
        if (rc == SQLITE_DONE)
            break;
        if (rc != SQLITE_ROW) {
            r = sql_err(rc);
            break;
        }
        if (n == cap && (r = list_grow(&kvs, &cap)) < 0)
            break;
        if ((r = kv_from_row(st, &kvs[n])) < 0)
            break;
        n++;
    }
    if (r < 0) {
        store_kv_free(kvs, n);
        return r;
    }
    *ret = kvs;
    *ret_n = n;
    return 0;
}

static int sqlite_list(store_t *base, const char *prefix, store_kv_t **ret, size_t *ret_n)
{
    sqlite_store_t *s = (sqlite_store_t *)base;
    char upper[STORE_KEY_MAX + 1];
    bool bounded = prefix_successor(prefix, upper, sizeof upper);
    sqlite3_stmt *st = s->st[bounded ? ST_LIST_RANGE : ST_LIST_FROM];

    /* One statement, so the rows come from one read snapshot. */
    int r = bind_key(st, 1, prefix);
    if (r >= 0 && bounded)
        r = bind_key(st, 2, upper);
    if (r >= 0)
        r = list_rows(st, ret, ret_n);
    stmt_done(st);
    return r;
}

/* ---- writes ---- */

static int sqlite_cas(store_t *base, const char *key, const char *value, size_t len,
                      int64_t expect_rev, int64_t *ret_rev)
{
    sqlite_store_t *s = (sqlite_store_t *)base;
    int64_t cur = 0, rev = 0;
    int r = tx_begin(s);
    if (r < 0)
        return r;
    r = current_rev(s, key, &cur);
    if (r >= 0 && expect_rev != STORE_REV_ANY && cur != expect_rev)
        r = -ESTALE; /* STORE_REV_ABSENT (0) matches exactly an absent key */
    if (r >= 0)
        r = bump_rev(s, &rev);
    if (r >= 0)
        r = put_row(s, key, value, len, rev);
    r = tx_end(s, r);
    if (r < 0)
        return r;
    if (ret_rev)
        *ret_rev = rev;
    return 0;
}

static int sqlite_del(store_t *base, const char *key, int64_t expect_rev)
{
    sqlite_store_t *s = (sqlite_store_t *)base;
    int64_t cur = 0, rev = 0;
    int r = tx_begin(s);
    if (r < 0)
        return r;
    r = current_rev(s, key, &cur);
    if (r >= 0 && cur == 0)
        r = -ENOENT;
    if (r >= 0 && expect_rev != STORE_REV_ANY && cur != expect_rev)
        r = -ESTALE;
    if (r >= 0)
        r = bump_rev(s, &rev); /* a delete is a write: it consumes a revision, as in etcd */
    if (r >= 0)
        r = delete_row(s, key);
    r = tx_end(s, r);
    return r < 0 ? r : 0;
}

/* Every comparison first, then one new revision for every write and delete (etcd's Txn). */
static int sqlite_txn(store_t *base, const store_op_t *ops, size_t n, int64_t *ret_rev,
                      size_t *ret_failed)
{
    sqlite_store_t *s = (sqlite_store_t *)base;
    int64_t rev = 0;
    int r = tx_begin(s);
    if (r < 0)
        return r;
    for (size_t i = 0; i < n && r >= 0; i++) {
        int64_t cur = 0;
        r = current_rev(s, ops[i].key, &cur);
        if (r >= 0 && ops[i].expect_rev != STORE_REV_ANY && cur != ops[i].expect_rev) {
            r = -ESTALE; /* STORE_REV_ABSENT (0) matches exactly an absent key */
            if (ret_failed)
                *ret_failed = i;
        }
    }
    if (r >= 0)
        r = bump_rev(s, &rev);
    for (size_t i = 0; i < n && r >= 0; i++)
        r = ops[i].value ? put_row(s, ops[i].key, ops[i].value, ops[i].len, rev)
                         : delete_row(s, ops[i].key);
    r = tx_end(s, r);
    if (r < 0)
        return r;
    if (ret_rev)
        *ret_rev = rev;
    return 0;
}

static int exec_sql(sqlite3 *db, const char *sql);

/* VACUUM rewrites every page from the live rows (free pages and the free space inside pages,
 * where SQLite leaves the bytes of replaced and deleted values, are gone), then a TRUNCATE
 * checkpoint writes it into the database file and empties the WAL. */
static int sqlite_compact(store_t *base)
{
    sqlite_store_t *s = (sqlite_store_t *)base;
    int r = exec_sql(s->db, "VACUUM");
    if (r < 0)
        return r;
    int log = 0, done = 0;
    int rc = sqlite3_wal_checkpoint_v2(s->db, NULL, SQLITE_CHECKPOINT_TRUNCATE, &log, &done);
    if (rc != SQLITE_OK)
        return sql_err(rc);
    return log == done ? 0 : -EBUSY;
}

static const store_ops_t sqlite_ops = {
    .close = sqlite_close,
    .get = sqlite_get,
    .cas = sqlite_cas,
    .del = sqlite_del,
    .list = sqlite_list,
    .txn = sqlite_txn,
    .compact = sqlite_compact,
};

/* ---- open ---- */

/* Create the database file 0600 before SQLite opens it: SQLite creates -wal and -shm (and any
 * rollback journal) with the database file's mode, so the whole store stays owner-only without
 * touching the process-wide umask. An existing file readable by group or others is tightened;
 * the store holds run records and who owns them. */
/* Create the file 0600 before SQLite does (its mode follows the umask otherwise), and tighten
 * an existing one. Never open() an existing database file here: closing any descriptor of a
 * file drops every POSIX lock this process holds on it, including the read lock of an open
 * SQLite connection of another thread -- after which another process's close would take
 * itself for the last user and checkpoint and unlink the WAL under us. */
static int precreate(const char *path)
{
    struct stat st;
    if (lstat(path, &st) < 0) {
        if (errno != ENOENT)
            return negative_errno();
        int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW, 0600);
        if (fd >= 0) {
            safe_close(fd); /* new: no connection of ours can hold a lock on it yet */
            return 0;
        }
        if (errno != EEXIST)
            return negative_errno();
        if (lstat(path, &st) < 0) /* created by someone else meanwhile */
            return negative_errno();
    }
    if (!S_ISREG(st.st_mode))
        return S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
    if ((st.st_mode & 0077) && chmod(path, st.st_mode & 0600) < 0)
        return negative_errno();
    return 0;
}

static int exec_sql(sqlite3 *db, const char *sql)
{
    int rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
    return rc == SQLITE_OK ? 0 : sql_err(rc);
}

/* Run a journal_mode pragma; *ret_wal tells whether the mode in force afterwards is WAL (where
 * WAL is impossible the old mode stays, and the pragma answers with that). */
static int journal_mode(sqlite3 *db, const char *sql, bool *ret_wal)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
    if (rc != SQLITE_OK)
        return sql_err(rc);
    rc = sqlite3_step(st);
    const unsigned char *mode = rc == SQLITE_ROW ? sqlite3_column_text(st, 0) : NULL;
    int r = 0;
    if (rc != SQLITE_ROW)
        r = sql_err(rc);
    else if (!mode)
        r = -ENOMEM;
    else
        *ret_wal = strcasecmp((const char *)mode, "wal") == 0;
    (void)sqlite3_finalize(st);
    return r;
}

/* WAL lets readers run beside the one writer, which several processes sharing the file need.
 * A connection that has not read the file yet still believes it is in rollback mode, and its
 * switch to WAL can be answered SQLITE_BUSY at once, without the busy handler, while another
 * process writes the (already WAL) file; so BUSY is retried here up to the same timeout. */
static int set_wal(sqlite3 *db)
{
    for (unsigned waited_ms = 0;; waited_ms += WAL_RETRY_MS) {
        bool wal = false;
        int r = journal_mode(db, "PRAGMA journal_mode=WAL", &wal);
        if (r >= 0)
            return wal ? 0 : -EIO;
        if (r != -EBUSY || waited_ms >= BUSY_TIMEOUT_MS)
            return r;
        (void)usleep(WAL_RETRY_MS * 1000);
    }
}

static int configure(sqlite_store_t *s)
{
    /* The busy handler first: switching a new file to WAL and creating the schema take locks
     * that another process opening the same file may hold for a moment. */
    int rc = sqlite3_busy_timeout(s->db, BUSY_TIMEOUT_MS);
    if (rc != SQLITE_OK)
        return sql_err(rc);
    int r = set_wal(s->db);
    if (r >= 0)
        r = exec_sql(s->db, "PRAGMA synchronous=NORMAL");
    if (r >= 0)
        r = exec_sql(s->db, "PRAGMA foreign_keys=ON");
    if (r < 0)
        return r;
    r = exec_sql(s->db, schema_sql);
    if (r < 0 && !sqlite3_get_autocommit(s->db))
        (void)exec_sql(s->db, "ROLLBACK");
    if (r < 0)
        return r;
    for (size_t i = 0; i < ST__MAX; i++) {
        rc = sqlite3_prepare_v3(s->db, stmt_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &s->st[i], NULL);
        if (rc != SQLITE_OK)
            return sql_err(rc);
    }
    return 0;
}

int store_open_sqlite(const char *path, store_t **ret)
{
    /* "" and ":memory:" would open a private temporary database, not a shared file. */
    if (!path || !ret || !*path || streq(path, ":memory:"))
        return -EINVAL;
    int r = precreate(path);
    if (r < 0)
        return r;

    _cleanup_(sqlite_storep) sqlite_store_t *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    s->base.ops = &sqlite_ops;
    /* On failure sqlite3_open_v2 may still return a handle; sqlite_close releases it. */
    int rc = sqlite3_open_v2(
        path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc != SQLITE_OK)
        return sql_err(rc);
    r = configure(s);
    if (r < 0)
        return r;
    *ret = &TAKE_PTR(s)->base;
    return 0;
}
