/* SPDX-License-Identifier: MIT */
/* The backend-independent half of the store: argument checks shared by every backend, so that
 * a backend only ever sees a valid key, a value within the cap and a meaningful expect_rev. */
#include "store.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"

/* 0..max bytes of printable ASCII without space; NULL is refused. */
static bool printable_run(const char *s, size_t min, size_t max)
{
    if (!s)
        return false;
    size_t n = strnlen(s, max + 1);
    if (n < min || n > max)
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x21 || c > 0x7e)
            return false;
    }
    return true;
}

static bool key_valid(const char *key) { return printable_run(key, 1, STORE_KEY_MAX); }

static int key_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

void store_close(store_t *s)
{
    if (s)
        s->ops->close(s);
}

int store_get(store_t *s, const char *key, store_kv_t *ret)
{
    if (!s || !ret || !key_valid(key))
        return -EINVAL;
    return s->ops->get(s, key, ret);
}

int store_cas(store_t *s, const char *key, const char *value, size_t len, int64_t expect_rev,
              int64_t *ret_rev)
{
    if (!s || !key_valid(key) || (!value && len > 0) || len > STORE_VALUE_MAX ||
        expect_rev < STORE_REV_ANY)
        return -EINVAL;
    return s->ops->cas(s, key, value ? value : "", len, expect_rev, ret_rev);
}

int store_del(store_t *s, const char *key, int64_t expect_rev)
{
    /* STORE_REV_ABSENT means nothing for a delete: there is no absent key to remove. */
    if (!s || !key_valid(key) || (expect_rev != STORE_REV_ANY && expect_rev <= 0))
        return -EINVAL;
    return s->ops->del(s, key, expect_rev);
}

int store_txn(store_t *s, const store_op_t *ops, size_t n, int64_t *ret_rev, size_t *ret_failed)
{
    if (!s || !ops || n == 0 || n > STORE_TXN_MAX)
        return -EINVAL;
    _cleanup_free_ const char **keys = calloc(n, sizeof *keys);
    if (!keys)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        const store_op_t *o = &ops[i];
        /* a delete has no absent key to remove (as store_del) */
        if (!key_valid(o->key) || o->len > STORE_VALUE_MAX || o->expect_rev < STORE_REV_ANY ||
            (!o->value && (o->len > 0 || o->expect_rev == STORE_REV_ABSENT)))
            return -EINVAL;
        keys[i] = o->key;
    }
    qsort(keys, n, sizeof *keys, key_cmp);
    for (size_t i = 1; i < n; i++) /* one op per key, as etcd asks */
        if (strcmp(keys[i - 1], keys[i]) == 0)
            return -EINVAL;
    return s->ops->txn(s, ops, n, ret_rev, ret_failed);
}

int store_list(store_t *s, const char *prefix, store_kv_t **ret, size_t *ret_n)
{
    /* The empty prefix lists everything. */
    if (!s || !ret || !ret_n || !printable_run(prefix, 0, STORE_KEY_MAX))
        return -EINVAL;
    return s->ops->list(s, prefix, ret, ret_n);
}

int store_compact(store_t *s)
{
    if (!s)
        return -EINVAL;
    return s->ops->compact ? s->ops->compact(s) : -EOPNOTSUPP;
}

void store_kv_clear(store_kv_t *kv)
{
    if (!kv)
        return;
    free(kv->key);
    free(kv->value);
    *kv = (store_kv_t){ 0 };
}

void store_kv_free(store_kv_t *kvs, size_t n)
{
    if (!kvs)
        return;
    for (size_t i = 0; i < n; i++)
        store_kv_clear(&kvs[i]);
    free(kvs);
}
