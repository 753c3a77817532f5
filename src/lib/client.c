/* SPDX-License-Identifier: MIT */
/* libsbx: the client (configuration from arguments or $SBX_HOME), errors, and the JSON call
 * layer every other part uses. */
#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fileio.h"
#include "common/macro.h"
#include "lib/internal.h"

int err_set(sbx_error_t *err, int code, int http_status, const char *fmt, ...)
{
    if (err) {
        err->code = code;
        err->http_status = http_status;
        va_list ap;
        va_start(ap, fmt);
        (void)vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
    }
    return code;
}

char *strprintf(const char *fmt, ...)
{
    char *s = NULL;
    va_list ap;
    va_start(ap, fmt);
    int r = vasprintf(&s, fmt, ap);
    va_end(ap);
    return r < 0 ? NULL : s;
}

char *url_escape(const char *s)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t n = strlen(s);
    char *out = malloc(n * 3 + 1);
    if (!out)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
            ch == '-' || ch == '_' || ch == '.' || ch == '~') {
            out[o++] = (char)ch;
        } else {
            out[o++] = '%';
            out[o++] = hex[ch >> 4];
            out[o++] = hex[ch & 15];
        }
    }
    out[o] = 0;
    return out;
}

json_t *kv_object(const sbx_kv_t *kv, size_t n)
{
    json_t *o = json_object();
    for (size_t i = 0; o && i < n; i++) {
        if (!kv[i].key || !kv[i].value ||
            json_object_set_new(o, kv[i].key, json_string(kv[i].value)) < 0) {
            json_decref(o);
            return NULL;
        }
    }
    return o;
}

void sbx_free(void *p) { free(p); }

int sbx_derive_token(const char *api_token, const char *nonce, char out[65])
{
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    char *msg = strprintf("sbx-sandbox:%s", nonce);
    if (!msg)
        return -ENOMEM;
    unsigned char *r = HMAC(EVP_sha256(), api_token, (int)strlen(api_token),
                            (const unsigned char *)msg, strlen(msg), mac, &len);
    free(msg);
    if (!r || len != 32)
        return -EIO;
    static const char hex[] = "0123456789abcdef";
    for (unsigned i = 0; i < 32; i++) {
        out[2 * i] = hex[mac[i] >> 4];
        out[2 * i + 1] = hex[mac[i] & 15];
    }
    out[64] = 0;
    OPENSSL_cleanse(mac, sizeof mac);
    return 0;
}

/* ---- configuration ------------------------------------------------------------------------ */

static char *sbx_home(void)
{
    const char *h = getenv("SBX_HOME");
    if (h && *h)
        return strdup(h);
    const char *home = getenv("HOME");
    return strprintf("%s/.sbx", home && *home ? home : "/root");
}

/* The first line of $SBX_HOME/name, or NULL (with *ret_path the path looked at). */
static char *home_file_line(const char *home, const char *name, char **ret_path)
{
    char *path = strprintf("%s/%s", home, name);
    *ret_path = path;
    if (!path)
        return NULL;
    char *data = NULL;
    size_t len = 0;
    if (file_read_all(path, 64 * 1024, &data, &len) < 0)
        return NULL;
    size_t l = strcspn(data, "\r\n");
    data[l] = 0;
    return data;
}

void sbx_client_free(sbx_client_t *c)
{
    if (!c)
        return;
    http_conn_done(&c->conn);
    if (c->token)
        OPENSSL_cleanse(c->token, strlen(c->token));
    if (c->auth)
        OPENSSL_cleanse(c->auth, strlen(c->auth));
    free(c->token);
    free(c->auth);
    free(c->endpoint);
    free(c->ns);
    free(c->ca_file);
    free(c);
}

int sbx_client_new(const sbx_config_t *cfg, sbx_client_t **ret, sbx_error_t *err)
{
    sbx_config_t none = { 0 };
    if (!cfg)
        cfg = &none;
    _cleanup_free_ char *home = sbx_home();
    if (!home)
        return err_set(err, -ENOMEM, 0, "out of memory");
    sbx_client_t *c = calloc(1, sizeof *c);
    if (!c)
        return err_set(err, -ENOMEM, 0, "out of memory");
    c->conn.fd = -1;
    _cleanup_free_ char *p_endpoint = NULL, *p_token = NULL, *ca = NULL;
    int r;
    c->endpoint =
        cfg->endpoint ? strdup(cfg->endpoint) : home_file_line(home, "endpoint", &p_endpoint);
    if (!c->endpoint) {
        r = err_set(err, -ENOENT, 0,
                    "no endpoint: %s cannot be read (run `sbx up` to start a local platform, "
                    "or set SBX_HOME to the directory that holds endpoint, token and ca.crt)",
                    p_endpoint ? p_endpoint : "$SBX_HOME/endpoint");
        goto fail;
    }
    const char *env_token = getenv("SBX_TOKEN");
    c->token = cfg->token                ? strdup(cfg->token)
               : env_token && *env_token ? strdup(env_token)
                                         : home_file_line(home, "token", &p_token);
    if (!c->token || !*c->token) {
        r = err_set(err, -ENOENT, 0,
                    "no API token: %s cannot be read (run `sbx up`, or set SBX_TOKEN)",
                    p_token ? p_token : "$SBX_HOME/token");
        goto fail;
    }
    if (strpbrk(c->token, "\r\n ")) {
        r = err_set(err, -EINVAL, 0, "the API token contains white space or a line break");
        goto fail;
    }
    const char *env_ns = getenv("SBX_NAMESPACE");
    c->ns = strdup(cfg->ns ? cfg->ns : env_ns && *env_ns ? env_ns : "default");
    c->auth = strprintf("Authorization: Bearer %s\r\n", c->token);
    ca = cfg->ca_file ? strdup(cfg->ca_file) : strprintf("%s/ca.crt", home);
    if (!c->ns || !c->auth || !ca) {
        r = err_set(err, -ENOMEM, 0, "out of memory");
        goto fail;
    }
    sbx_err_t herr;
    r = http_conn_init(&c->conn, c->endpoint, ca, cfg->io_timeout_ms, &herr);
    if (r < 0) {
        err_set(err, r, 0, "%s", herr.msg);
        goto fail;
    }
    c->ca_file = TAKE_PTR(ca);
    c->io_timeout_ms = cfg->io_timeout_ms;
    c->range_threshold = cfg->parallel_threshold ? cfg->parallel_threshold : 64u << 20;
    c->ranges = cfg->parallel_ranges ? MIN(cfg->parallel_ranges, 16u) : 4;
    *ret = c;
    return 0;
fail:
    sbx_client_free(c);
    return r;
}

const char *sbx_client_endpoint(const sbx_client_t *c) { return c->endpoint; }
const char *sbx_client_namespace(const sbx_client_t *c) { return c->ns; }

/* ---- calls --------------------------------------------------------------------------------- */

static int status_code(int status)
{
    switch (status) {
    case 400:
    case 422: return -EINVAL;
    case 401:
    case 403: return -EACCES;
    case 404: return -ENOENT;
    case 405: return -EOPNOTSUPP;
    case 408:
    case 504: return -ETIMEDOUT;
    case 409: return -EEXIST;
    case 410: return -ESTALE;
    case 413: return -EFBIG;
    case 429: return -EAGAIN;
    case 502:
    case 503: return -EHOSTUNREACH;
    default: return -EIO;
    }
}

static const char *status_hint(int status)
{
    switch (status) {
    case 401:
    case 403:
        return " (the API token was refused, or its role or namespace does not allow this: "
               "check $SBX_HOME/token or SBX_TOKEN, and SBX_NAMESPACE)";
    case 410: return " (the sandbox is gone: its host stopped or moved; create a new one)";
    case 429: return " (the pool is full at max_hosts: delete sandboxes or raise max_hosts)";
    case 502:
    case 503:
        return " (the sandbox is not reachable now: is its job RUNNING? `sbx jobs inspect ID`)";
    default: return "";
    }
}

int api_status_error(const char *what, int status, const char *body, size_t len, sbx_error_t *err)
{
    const char *reason = NULL;
    json_t *j = body && len ? json_loadb(body, len, 0, NULL) : NULL;
    if (json_is_object(j)) {
        reason = json_string_value(json_object_get(j, "error"));
        if (!reason)
            reason = json_string_value(json_object_get(j, "reason"));
    }
    int code = status_code(status);
    if (reason)
        err_set(err, code, status, "%s: %s (HTTP %d)%s", what, reason, status, status_hint(status));
    else
        err_set(err, code, status, "%s: HTTP %d %.*s%s", what, status, (int)(len > 200 ? 200 : len),
                body ? body : "", status_hint(status));
    json_decref(j);
    return code;
}

int api_raw(sbx_client_t *c, const char *what, http_req_t *rq, const char *extra_headers,
            http_resp_t *ret, sbx_error_t *err)
{
    _cleanup_free_ char *hdr = strprintf("%s%s", c->auth, extra_headers ? extra_headers : "");
    if (!hdr)
        return err_set(err, -ENOMEM, 0, "out of memory");
    rq->headers = hdr;
    sbx_err_t herr;
    http_resp_t resp = { 0 };
    int r = http_do(&c->conn, rq, &resp, &herr);
    rq->headers = NULL;
    if (r < 0)
        return err_set(err, r, 0, "%s: %s", what, herr.msg);
    if (resp.status < 200 || resp.status >= 300) {
        r = api_status_error(what, resp.status, resp.body, resp.body_len, err);
        http_resp_free(&resp);
        return r;
    }
    *ret = resp;
    return 0;
}

int api_json(sbx_client_t *c, const char *what, const char *method, const char *target,
             const char *extra_headers, json_t *body, json_t **ret, int *ret_status,
             sbx_error_t *err)
{
    _cleanup_free_ char *text = NULL;
    if (body) {
        text = json_dumps(body, JSON_COMPACT);
        if (!text)
            return err_set(err, -ENOMEM, 0, "out of memory");
    }
    http_req_t rq = { .method = method,
                      .target = target,
                      .content_type = body ? "application/json" : NULL,
                      .body = text,
                      .body_len = text ? strlen(text) : 0,
                      .body_fd = -1 };
    http_resp_t resp;
    int r = api_raw(c, what, &rq, extra_headers, &resp, err);
    if (r < 0)
        return r;
    if (ret_status)
        *ret_status = resp.status;
    if (ret) {
        json_error_t je;
        json_t *j = json_loadb(resp.body, resp.body_len, 0, &je);
        http_resp_free(&resp);
        if (!j)
            return err_set(err, -EPROTO, 0, "%s: the platform's answer is not JSON: %s", what,
                           je.text);
        *ret = j;
        return 0;
    }
    http_resp_free(&resp);
    return 0;
}
