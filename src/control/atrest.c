/* SPDX-License-Identifier: MIT */
/* Secrets at rest for a control plane: where its secrets key file is, opening it at start, and
 * the operator's rotation (sbx-control --rotate-secrets-key, with every control stopped).
 *
 * Rotation is safe against a crash at any point because the old key leaves the file last:
 *   1. the file becomes [new, old...] (atomic replace): new values are sealed under new, old
 *      ones still open;
 *   2. every sealed value in the store (signing-keys/, secrets/) is re-sealed under new, by
 *      compare-and-swap on the revision read;
 *   3. every value is read back: each must now carry new's kid;
 *   4. only then the file becomes [new].
 * Interrupted before 4, the file still holds every key a value can be sealed under; a control
 * started on it re-seals what is left (keys_load, job_secrets_reseal_all), and running the
 * rotation again finishes it. */
#include <stdio.h>
#include <sys/stat.h>

#include "common/log.h"
#include "control.h"

int secrets_key_path(const control_config_t *cfg, char *out, size_t cap)
{
    int n = cfg->secrets_key_file[0] ? snprintf(out, cap, "%s", cfg->secrets_key_file)
                                     : snprintf(out, cap, "%s/secrets.key", cfg->state_dir);
    return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

int secrets_keys_open(const control_config_t *cfg, seal_keys_t *ret)
{
    char path[PATH_MAX];
    sbx_err_t err = { 0 };
    bool created = false;
    int r = secrets_key_path(cfg, path, sizeof path);
    if (r == 0)
        r = seal_keys_load_or_create(path, ret, &created, &err);
    if (r < 0) {
        log_error("%s", err.msg[0] ? err.msg : strerror(-r));
        return r;
    }
    if (created)
        log_info("created the secrets key file %s (mode 0600): keep it out of store backups", path);
    return 0;
}

/* Whether every sealed value in the store carries kid; counts the others. */
static int count_not_under(store_t *st, const char *kid, bool verbose, size_t *ret_n)
{
    static const char *const prefixes[] = { "signing-keys/", "secrets/" };
    size_t left = 0;
    for (size_t p = 0; p < ELEMENTSOF(prefixes); p++) {
        store_kv_t *kvs;
        size_t n;
        int r = store_list(st, prefixes[p], &kvs, &n);
        if (r < 0)
            return r;
        for (size_t i = 0; i < n; i++) {
            const char *v = kvs[i].value;
            size_t len = kvs[i].value_len;
            json_t *j = p == 0 ? json_loadb(v, len, 0, NULL) : NULL;
            if (p == 0) {
                v = json_string_value(json_object_get(j, "sk"));
                len = v ? strlen(v) : 0;
            }
            if (!v || !seal_has_kid(v, len, kid)) {
                if (verbose)
                    log_error("%s: still not sealed under secrets key %s", kvs[i].key, kid);
                left++;
            }
            json_decref(j);
        }
        store_kv_free(kvs, n);
    }
    *ret_n = left;
    return 0;
}

int secrets_migrate(store_t *st, const seal_keys_t *seal)
{
    size_t left = 0, bad = 0;
    int r = count_not_under(st, seal->keys[0].kid, false, &left);
    if (r < 0 || left == 0)
        return r;
    keyring_t kr;
    r = keys_load(st, seal, &kr);
    sodium_memzero(&kr, sizeof kr);
    if (r < 0)
        return r;
    r = job_secrets_reseal_all(st, seal, &bad);
    if (r < 0)
        return r;
    if (bad)
        log_error("%zu job secret record(s) cannot be decrypted: their jobs cannot start", bad);
    if (bad == left)
        return 0; /* nothing re-sealed */
    r = store_compact(st);
    if (r < 0)
        log_warn("store: cannot compact it after re-sealing (%s): the replaced values' bytes "
                 "may stay in its free pages until SQLite reuses them",
                 strerror(-r));
    else
        log_info("store: %zu value(s) re-sealed under secrets key %s, store compacted", left - bad,
                 seal->keys[0].kid);
    return 0;
}

static void store_closep(store_t **s) { store_close(*s); }

int secrets_rotate(const control_config_t *cfg)
{
    char path[PATH_MAX], db[PATH_MAX + 16];
    sbx_err_t err = { 0 };
    seal_keys_t old, both = { .n = 0 };
    int r = secrets_key_path(cfg, path, sizeof path);
    if (r == 0)
        r = seal_keys_load(path, &old, &err);
    if (r < 0) {
        log_error("%s", err.msg[0] ? err.msg : strerror(-r));
        return r;
    }
    (void)snprintf(db, sizeof db, "%s/store.db", cfg->state_dir);
    struct stat sb;
    _cleanup_(store_closep) store_t *st = NULL;
    if (stat(db, &sb) < 0 || (r = store_open_sqlite(db, &st)) < 0) {
        log_error("store %s: cannot open it", db);
        sodium_memzero(&old, sizeof old);
        return r < 0 ? r : -ENOENT;
    }
    /* 1. [new, old...]: every old key stays until step 4 */
    if (old.n >= SEAL_KEYS_MAX) {
        log_error("secrets key file %s holds %zu keys already: start a control once (it re-seals "
                  "everything under the first), then remove the others by hand",
                  path, old.n);
        sodium_memzero(&old, sizeof old);
        return -E2BIG;
    }
    r = seal_key_generate(&both.keys[0]);
    both.n = 1;
    for (size_t i = 0; r == 0 && i < old.n; i++)
        both.keys[both.n++] = old.keys[i];
    sodium_memzero(&old, sizeof old);
    if (r == 0)
        r = seal_keys_write(path, &both);
    if (r < 0) {
        log_error("secrets key file %s: cannot write it: %s", path, strerror(-r));
        sodium_memzero(&both, sizeof both);
        return r;
    }
    log_info("secrets key %s is now current in %s; re-sealing the store", both.keys[0].kid, path);
    /* 2. re-seal everything */
    keyring_t kr;
    size_t bad = 0, left = 0;
    r = keys_load(st, &both, &kr);
    sodium_memzero(&kr, sizeof kr);
    if (r >= 0)
        r = job_secrets_reseal_all(st, &both, &bad);
    /* 3. read back */
    if (r >= 0)
        r = count_not_under(st, both.keys[0].kid, true, &left);
    if (r >= 0 && (bad || left)) {
        log_error("rotation stopped: %zu value(s) not re-sealed; the old keys stay in %s", left,
                  path);
        r = -EBADMSG;
    }
    /* the old ciphertexts' bytes out of the store's free space and WAL: the old key, if it
     * leaked, opens nothing in this store's files any more */
    if (r >= 0 && (r = store_compact(st)) < 0)
        log_error("store %s: cannot compact it (%s): is a control still running? the old keys "
                  "stay in %s",
                  db, strerror(-r), path);
    /* 4. drop the old keys */
    seal_keys_t cur = { .n = 1, .keys = { both.keys[0] } };
    if (r >= 0)
        r = seal_keys_write(path, &cur);
    if (r >= 0)
        log_info("rotated: secrets key %s is the only key in %s (%zu old key(s) dropped)",
                 cur.keys[0].kid, path, both.n - 1);
    sodium_memzero(&both, sizeof both);
    sodium_memzero(&cur, sizeof cur);
    return r;
}
