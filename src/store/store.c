/* SPDX-License-Identifier: MIT */
/* The backend-independent half of the store: argument checks shared by every backend, so that
 * a backend only ever sees a valid key, a value within the cap and a meaningful expect_rev. */
#include "store.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

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
