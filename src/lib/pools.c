/* SPDX-License-Identifier: MIT */
/* libsbx: pools (a control-plane resource: /v1/pools/{ns}), their sandboxes, jobs and tokens. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"
#include "lib/internal.h"

static void jsonp(json_t **j) { json_decref(*j); }
#define _cleanup_json_ _cleanup_(jsonp)

/* "/v1/<kind>/<ns>[/<a>[/<rest>]]" with the parts escaped. */
static char *ns_path(const sbx_client_t *c, const char *kind, const char *a, const char *rest)
{
    _cleanup_free_ char *ens = url_escape(c->ns);
    _cleanup_free_ char *ea = a ? url_escape(a) : NULL;
    if (!ens || (a && !ea))
        return NULL;
    return strprintf("/v1/%s/%s%s%s%s", kind, ens, a ? "/" : "", a ? ea : "", rest ? rest : "");
}

static int dump(json_t *j, char **ret, sbx_error_t *err)
{
    char *s = json_dumps(j, JSON_COMPACT);
    if (!s)
        return err_set(err, -ENOMEM, 0, "out of memory");
    *ret = s;
    return 0;
}

/* A call whose JSON answer goes to *ret_json as text (when ret_json is not NULL). */
static int call_text(sbx_client_t *c, const char *what, const char *method, const char *target,
                     json_t *body, char **ret_json, sbx_error_t *err)
{
    if (!target)
        return err_set(err, -ENOMEM, 0, "out of memory");
    _cleanup_json_ json_t *j = NULL;
    int r = api_json(c, what, method, target, NULL, body, ret_json ? &j : NULL, NULL, err);
    if (r < 0 || !ret_json)
        return r;
    return dump(j, ret_json, err);
}

void sbx_pool_opts_init(sbx_pool_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->per_host = o->warm = o->max_hosts = o->sandbox_idle_s = o->host_idle_s = -1;
}

int sbx_pool_create(sbx_client_t *c, const sbx_pool_opts_t *o, char **ret_json, sbx_error_t *err)
{
    if (!o || !o->name || !*o->name)
        return err_set(err, -EINVAL, 0, "create pool: a name is required");
    _cleanup_json_ json_t *b = json_pack("{s:s}", "name", o->name);
    if (!b)
        return err_set(err, -ENOMEM, 0, "out of memory");
    if (o->image)
        (void)json_object_set_new(b, "image", json_string(o->image));
    if (o->flavor)
        (void)json_object_set_new(b, "flavor", json_string(o->flavor));
    const struct {
        const char *k;
        int v;
    } nums[] = { { "per_host", o->per_host },
                 { "warm", o->warm },
                 { "max_hosts", o->max_hosts },
                 { "sandbox_idle_s", o->sandbox_idle_s },
                 { "host_idle_s", o->host_idle_s } };
    for (size_t i = 0; i < ELEMENTSOF(nums); i++)
        if (nums[i].v >= 0)
            (void)json_object_set_new(b, nums[i].k, json_integer(nums[i].v));
    _cleanup_free_ char *t = ns_path(c, "pools", NULL, NULL);
    char what[300];
    (void)snprintf(what, sizeof what, "create pool %s", o->name);
    return call_text(c, what, "POST", t, b, ret_json, err);
}

int sbx_pool_list(sbx_client_t *c, char **ret_json, sbx_error_t *err)
{
    _cleanup_free_ char *t = ns_path(c, "pools", NULL, NULL);
    return call_text(c, "list pools", "GET", t, NULL, ret_json, err);
}

int sbx_pool_inspect(sbx_client_t *c, const char *pool, char **ret_json, sbx_error_t *err)
{
    _cleanup_free_ char *t = ns_path(c, "pools", pool, NULL);
    char what[300];
    (void)snprintf(what, sizeof what, "pool %s", pool);
    return call_text(c, what, "GET", t, NULL, ret_json, err);
}

int sbx_pool_delete(sbx_client_t *c, const char *pool, sbx_error_t *err)
{
    _cleanup_free_ char *t = ns_path(c, "pools", pool, NULL);
    char what[300];
    (void)snprintf(what, sizeof what, "delete pool %s", pool);
    return call_text(c, what, "DELETE", t, NULL, NULL, err);
}

/* Handles for every {"id"} of a "sandboxes" array. */
static int handles(sbx_client_t *c, const char *pool, json_t *arr, sbx_sandbox_t ***ret,
                   size_t *ret_n, sbx_error_t *err)
{
    size_t n = json_array_size(arr);
    sbx_sandbox_t **list = calloc(n ? n : 1, sizeof *list);
    if (!list)
        return err_set(err, -ENOMEM, 0, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const char *id = json_string_value(json_object_get(json_array_get(arr, i), "id"));
        if (!id) {
            sbx_sandbox_list_free(list, i);
            return err_set(err, -EPROTO, 0, "pool %s: a sandbox without an id", pool);
        }
        if (sandbox_new(c, id, pool, &list[i]) < 0) {
            sbx_sandbox_list_free(list, i);
            return err_set(err, -ENOMEM, 0, "out of memory");
        }
    }
    *ret = list;
    *ret_n = n;
    return (int)MIN(n, (size_t)INT32_MAX);
}

int sbx_pool_sandboxes_create(sbx_client_t *c, const char *pool, const sbx_pool_sandbox_opts_t *o,
                              sbx_sandbox_t ***ret, size_t *ret_n, size_t *ret_rejected,
                              sbx_error_t *err)
{
    sbx_pool_sandbox_opts_t none = { 0 };
    if (!o)
        o = &none;
    _cleanup_json_ json_t *b = json_pack("{s:i}", "count", o->count ? (int)o->count : 1);
    if (!b)
        return err_set(err, -ENOMEM, 0, "out of memory");
    if (o->n_env) {
        json_t *env = kv_object(o->env, o->n_env);
        if (!env)
            return err_set(err, -EINVAL, 0, "create sandboxes: an env entry has no key or value");
        (void)json_object_set_new(b, "env", env);
    }
    if (o->max_procs > 0)
        (void)json_object_set_new(b, "max_procs", json_integer(o->max_procs));
    if (o->max_mem_mb > 0)
        (void)json_object_set_new(b, "max_mem_mb", json_integer(o->max_mem_mb));
    if (o->idle_timeout_s > 0)
        (void)json_object_set_new(b, "idle_timeout_secs", json_integer(o->idle_timeout_s));
    _cleanup_free_ char *t = ns_path(c, "pools", pool, "/sandboxes");
    if (!t)
        return err_set(err, -ENOMEM, 0, "out of memory");
    char what[300];
    (void)snprintf(what, sizeof what, "create sandboxes in pool %s", pool);
    _cleanup_json_ json_t *j = NULL;
    int r = api_json(c, what, "POST", t, NULL, b, &j, NULL, err);
    if (r < 0)
        return r;
    json_t *arr = json_object_get(j, "sandboxes");
    size_t rejected = (size_t)json_integer_value(json_object_get(j, "rejected"));
    if (json_array_size(arr) == 0) {
        const char *why = json_string_value(json_object_get(j, "reason"));
        return err_set(err, -EAGAIN, 0, "%s: none could be placed%s%s", what, why ? ": " : "",
                       why ? why : "");
    }
    r = handles(c, pool, arr, ret, ret_n, err);
    if (r >= 0 && ret_rejected)
        *ret_rejected = rejected;
    return r;
}

int sbx_pool_sandboxes_list(sbx_client_t *c, const char *pool, sbx_sandbox_t ***ret, size_t *ret_n,
                            sbx_error_t *err)
{
    _cleanup_free_ char *t = ns_path(c, "pools", pool, "/sandboxes");
    if (!t)
        return err_set(err, -ENOMEM, 0, "out of memory");
    char what[300];
    (void)snprintf(what, sizeof what, "list sandboxes of pool %s", pool);
    _cleanup_json_ json_t *j = NULL;
    int r = api_json(c, what, "GET", t, NULL, NULL, &j, NULL, err);
    if (r < 0)
        return r;
    return handles(c, pool, json_object_get(j, "sandboxes"), ret, ret_n, err);
}

/* ---- jobs and tokens ----------------------------------------------------------------------- */

int sbx_jobs_list(sbx_client_t *c, const char *const *labels, size_t n_labels, char **ret_json,
                  sbx_error_t *err)
{
    _cleanup_free_ char *t = ns_path(c, "jobs", NULL, NULL);
    for (size_t i = 0; t && i < n_labels; i++) {
        _cleanup_free_ char *e = url_escape(labels[i]);
        char *nt = e ? strprintf("%s%slabel=%s", t, i ? "&" : "?", e) : NULL;
        free(t);
        t = nt;
    }
    return call_text(c, "list jobs", "GET", t, NULL, ret_json, err);
}

int sbx_job_inspect(sbx_client_t *c, const char *id, char **ret_json, sbx_error_t *err)
{
    _cleanup_free_ char *t = ns_path(c, "jobs", id, NULL);
    char what[300];
    (void)snprintf(what, sizeof what, "job %s", id);
    return call_text(c, what, "GET", t, NULL, ret_json, err);
}

int sbx_job_action(sbx_client_t *c, const char *id, const char *action, const char *node,
                   sbx_error_t *err)
{
    if (!action || (strcmp(action, "cancel") != 0 && strcmp(action, "pause") != 0 &&
                    strcmp(action, "resume") != 0 && strcmp(action, "move") != 0))
        return err_set(err, -EINVAL, 0, "job action must be cancel, pause, resume or move");
    char rest[32];
    (void)snprintf(rest, sizeof rest, "/%s", action);
    _cleanup_free_ char *t = ns_path(c, "jobs", id, rest);
    _cleanup_json_ json_t *b = json_object();
    if (!b || (node && strcmp(action, "move") == 0 &&
               json_object_set_new(b, "node", json_string(node)) < 0))
        return err_set(err, -ENOMEM, 0, "out of memory");
    char what[300];
    (void)snprintf(what, sizeof what, "%s job %s", action, id);
    return call_text(c, what, "POST", t, b, NULL, err);
}

int sbx_token_create(sbx_client_t *c, const char *principal, const char *ns, const char *role,
                     char **ret_json, sbx_error_t *err)
{
    if (!principal || !ns || !role)
        return err_set(err, -EINVAL, 0, "create token: principal, namespace and role are needed");
    _cleanup_json_ json_t *b =
        json_pack("{s:s,s:s,s:s}", "principal", principal, "namespace", ns, "role", role);
    if (!b)
        return err_set(err, -ENOMEM, 0, "out of memory");
    return call_text(c, "create token", "POST", "/v1/tokens", b, ret_json, err);
}

int sbx_token_revoke(sbx_client_t *c, const char *id, sbx_error_t *err)
{
    _cleanup_free_ char *e = url_escape(id);
    _cleanup_free_ char *t = e ? strprintf("/v1/tokens/%s", e) : NULL;
    char what[300];
    (void)snprintf(what, sizeof what, "revoke token %s", id);
    return call_text(c, what, "DELETE", t, NULL, NULL, err);
}

int sbx_nodes_list(sbx_client_t *c, char **ret_json, sbx_error_t *err)
{
    return call_text(c, "list nodes", "GET", "/v1/nodes", NULL, ret_json, err);
}
