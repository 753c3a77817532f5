/* SPDX-License-Identifier: MIT */
/* The control plane's store: a key-value map with one revision counter, in the shape of etcd's
 * v3 API, so that the embedded SQLite backend and a later etcd backend are interchangeable.
 *
 * Every key carries the store revision at which it was last written (its mod revision, > 0).
 * Writes are compare-and-swap on that revision: a run record is only replaced by a writer that
 * read the current version, so two control processes can never both install a run for one
 * generation. Keys are printable ASCII without spaces, at most STORE_KEY_MAX bytes; values are
 * opaque bytes (JSON in practice), at most STORE_VALUE_MAX. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define STORE_KEY_MAX 512
#define STORE_VALUE_MAX (1024 * 1024)

/* expect_rev values for store_cas() besides a real revision (> 0) */
#define STORE_REV_ABSENT 0 /* the key must not exist */
#define STORE_REV_ANY (-1) /* unconditional write */

typedef struct store store_t;

typedef struct {
    char *key;
    char *value; /* NUL-terminated for convenience; value_len bytes */
    size_t value_len;
    int64_t rev; /* mod revision */
} store_kv_t;

/* One operation of store_txn(): put len bytes of value under key, or delete key (value NULL),
 * if the key's mod revision is expect_rev (STORE_REV_ABSENT: the key must not exist;
 * STORE_REV_ANY: whatever it is, and a delete of an absent key then does nothing). */
typedef struct {
    const char *key;
    const char *value;
    size_t len;
    int64_t expect_rev;
} store_op_t;
#define STORE_TXN_MAX 4096 /* operations in one transaction */

typedef struct {
    void (*close)(store_t *s);
    int (*get)(store_t *s, const char *key, store_kv_t *ret);
    int (*cas)(store_t *s, const char *key, const char *value, size_t len, int64_t expect_rev,
               int64_t *ret_rev);
    int (*del)(store_t *s, const char *key, int64_t expect_rev);
    int (*list)(store_t *s, const char *prefix, store_kv_t **ret, size_t *ret_n);
    int (*txn)(store_t *s, const store_op_t *ops, size_t n, int64_t *ret_rev, size_t *ret_failed);
    int (*compact)(store_t *s); /* may be NULL */
} store_ops_t;

struct store {
    const store_ops_t *ops;
};

/* Open (creating if needed) the SQLite store at path: WAL journal, busy timeout so that
 * several processes can share one file, schema created on first open. */
int store_open_sqlite(const char *path, store_t **ret);

/* Close; NULL-safe. */
void store_close(store_t *s);

/* Read one key. -ENOENT if absent. On success the caller owns ret's strings (store_kv_clear). */
int store_get(store_t *s, const char *key, store_kv_t *ret);

/* Write value under key if its current mod revision equals expect_rev (STORE_REV_ABSENT: the
 * key must not exist; STORE_REV_ANY: always). On success *ret_rev (may be NULL) is the new mod
 * revision. -ESTALE when the comparison fails (nothing written), -EINVAL for a bad key or a
 * value over STORE_VALUE_MAX, -EIO for a backend failure. */
int store_cas(store_t *s, const char *key, const char *value, size_t len, int64_t expect_rev,
              int64_t *ret_rev);

/* Delete key if its mod revision equals expect_rev (STORE_REV_ANY: whatever it is).
 * -ENOENT if absent, -ESTALE on a revision mismatch. */
int store_del(store_t *s, const char *key, int64_t expect_rev);

/* All of ops or none, like etcd's Txn: every comparison is made first, then every write and
 * delete, all stamped with one new store revision (*ret_rev, may be NULL). -ESTALE when a
 * comparison failed (nothing written; *ret_failed, may be NULL: the first such op's index),
 * -EINVAL for a bad key or value, a key named twice, no op or more than STORE_TXN_MAX, -EIO for a
 * backend failure. */
int store_txn(store_t *s, const store_op_t *ops, size_t n, int64_t *ret_rev, size_t *ret_failed);

/* Every key starting with prefix, in key order. The caller frees with store_kv_free. */
int store_list(store_t *s, const char *prefix, store_kv_t **ret, size_t *ret_n);

/* Drop what the backend keeps of replaced and deleted values (SQLite: VACUUM, then a TRUNCATE
 * checkpoint of the WAL), so that an old value's bytes are nowhere in its files. -EBUSY when
 * another process kept the WAL from being emptied; -EOPNOTSUPP without a compact operation. */
int store_compact(store_t *s);

void store_kv_clear(store_kv_t *kv);
void store_kv_free(store_kv_t *kvs, size_t n);
