/* SPDX-License-Identifier: MIT */
#include "env.h"

#include <stdio.h>
#include <string.h>

#include "strutil.h"

void strv_free(char **v)
{
    for (size_t i = 0; v && v[i]; i++)
        free(v[i]);
    free(v);
}

static bool name_reserved(const env_rules_t *rules, const char *k)
{
    for (size_t i = 0; rules->reserved && rules->reserved[i]; i++)
        if (streq(k, rules->reserved[i]))
            return true;
    return false;
}

/* Whether an overlay sets the name of the base entry e ("NAME=value"). */
static bool overlaid(const char *e, const env_overlay_t *ov, size_t n)
{
    const char *eq = strchr(e, '=');
    char key[256];
    size_t kl = (size_t)(eq - e);
    if (kl >= sizeof key)
        return false;
    memcpy(key, e, kl);
    key[kl] = '\0';
    for (size_t i = 0; i < n; i++)
        if (json_object_get(ov[i].obj, key))
            return true;
    return false;
}

/* Check one overlay against the rules; its entries' count and bytes are added up. */
static int overlay_check(const env_overlay_t *ov, const env_rules_t *rules, size_t *count,
                         size_t *bytes, sbx_err_t *err)
{
    if (!ov->obj)
        return 0;
    if (!json_is_object(ov->obj))
        return sbx_err(err, -EINVAL, "%s must be an object of strings", ov->name);
    const char *k;
    json_t *val;
    json_object_foreach(ov->obj, k, val) {
        bool name_ok = rules->portable_names ? env_name_valid(k) : *k && !strchr(k, '=');
        if (!name_ok)
            return sbx_err(err, -EINVAL,
                           rules->portable_names
                               ? "%s: names are [A-Za-z_][A-Za-z0-9_]* (at most 128 bytes)"
                               : "%s: names must be non-empty without '='",
                           ov->name);
        if (name_reserved(rules, k))
            return sbx_err(err, -EINVAL, "%s: %s is the platform's, it cannot be set", ov->name, k);
        if (!json_is_string(val) || strlen(json_string_value(val)) != json_string_length(val))
            return sbx_err(err, -EINVAL, "%s: values must be strings without NUL", ov->name);
        *bytes += strlen(k) + json_string_length(val) + 2;
        if (rules->max_bytes && *bytes > rules->max_bytes)
            return sbx_err(err, -EINVAL, "%s is too large (max %zu bytes)", ov->name,
                           rules->max_bytes);
        (*count)++;
    }
    return 0;
}

int env_build(char *const *base, const env_overlay_t *overlays, size_t n_overlays,
              const env_rules_t *rules, char ***ret, sbx_err_t *err)
{
    size_t nbase = 0, count = 0, bytes = 0;
    while (base && base[nbase])
        nbase++;
    for (size_t i = 0; i < n_overlays; i++) {
        int r = overlay_check(&overlays[i], rules, &count, &bytes, err);
        if (r < 0)
            return r;
    }
    if (rules->max_entries && nbase + count > rules->max_entries)
        return sbx_err(err, -E2BIG, "too many environment variables (max %zu)", rules->max_entries);
    _cleanup_strv_free_ char **v = calloc(nbase + count + 1, sizeof *v);
    if (!v)
        return sbx_err(err, -ENOMEM, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < nbase; i++) {
        if (!strchr(base[i], '=') || (rules->replace && overlaid(base[i], overlays, n_overlays)))
            continue;
        if (!(v[k++] = strdup(base[i])))
            return sbx_err(err, -ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n_overlays; i++) {
        const char *key;
        json_t *val;
        json_object_foreach(overlays[i].obj, key, val) {
            if (asprintf(&v[k], "%s=%s", key, json_string_value(val)) < 0) {
                v[k] = NULL;
                return sbx_err(err, -ENOMEM, "out of memory");
            }
            k++;
        }
    }
    *ret = TAKE_PTR(v);
    return 0;
}
