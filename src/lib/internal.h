/* SPDX-License-Identifier: MIT */
/* libsbx internals: a small blocking HTTP/1.1 client over TLS 1.3 (one kept-alive connection
 * per client, chunked and streamed responses), and the JSON API layer on it. */
#pragma once

#include <jansson.h>
#include <openssl/ssl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "sbx/sbx.h"

#define HTTP_HEAD_MAX (64 * 1024)
#define HTTP_ERRBODY_MAX (1024 * 1024)
#define HTTP_BODY_MAX (256u * 1024 * 1024) /* an in-memory body (file reads) */
#define NDJSON_LINE_MAX (8u * 1024 * 1024)

typedef struct {
    bool tls;
    char host[256];
    char port[8];
    SSL_CTX *ctx; /* NULL for http:// */
    int fd;
    SSL *ssl;
    unsigned io_timeout_ms;
    bool used; /* has carried a whole exchange: a failure before any answer may be a stale
                * keep-alive connection the server closed, and is retried once */
    char rbuf[16384];
    size_t rpos, rlen;
} http_conn_t;

/* Body bytes of a 2xx response as they come; a negative return aborts (the connection is
 * closed) and is returned by http_do. */
typedef int (*http_sink_fn)(const void *data, size_t len, void *ud);

typedef struct {
    const char *method;
    const char *target;  /* origin form, escaped */
    const char *headers; /* "Name: value\r\n" lines, may be NULL */
    const char *content_type;
    const void *body;
    size_t body_len;
    int body_fd; /* >= 0: the body is body_fd_len bytes read (pread) from this fd at body_fd_off */
    uint64_t body_fd_off, body_fd_len;
    sbx_transfer_fn progress; /* (bytes just moved, total, ud): body_fd uploads, sunk bodies */
    void *progress_ud;
    http_sink_fn sink; /* 2xx bodies go here when set; other bodies are kept for the error */
    void *sink_ud;
    size_t body_max; /* cap for a kept body; 0: HTTP_ERRBODY_MAX */
    /* A stream that may stay quiet for long (exec, following a process's output): no read
     * timeout while it lasts; TCP keepalive (on every connection) notices a dead peer. */
    bool stream;
} http_req_t;

typedef struct {
    int status;
    char *body; /* NUL-terminated; NULL when sunk */
    size_t body_len;
    uint64_t content_length; /* UINT64_MAX when unknown */
} http_resp_t;

/* Parse endpoint (and load ca_file for https); on failure err says why. */
int http_conn_init(http_conn_t *c, const char *endpoint, const char *ca_file,
                   unsigned io_timeout_ms, sbx_err_t *err);
void http_conn_close(http_conn_t *c);
void http_conn_done(http_conn_t *c);
/* One exchange; keeps the connection when the answer allows it. On failure err says why. */
int http_do(http_conn_t *c, const http_req_t *rq, http_resp_t *ret, sbx_err_t *err);
void http_resp_free(http_resp_t *r);
/* The response half of http_do on an open connection (c->fd a connected socket, no TLS): for
 * tests and fuzzing. *ret_any tells whether any byte of an answer came. */
int http_read_response(http_conn_t *c, const http_req_t *rq, http_resp_t *resp, bool *ret_any);

/* ---- the API layer ---------------------------------------------------------------------- */

struct sbx_client {
    char *endpoint;
    char *token;
    char *ns;
    char *ca_file;
    unsigned io_timeout_ms;
    uint64_t range_threshold;
    unsigned ranges;
    char *auth; /* "Authorization: Bearer <token>\r\n" */
    http_conn_t conn;
};

struct sbx_sandbox {
    sbx_client_t *c;
    char *display; /* "ID" or "POOL/ID" */
    char *id;
    char *pool;     /* NULL: dedicated */
    char *prefix;   /* agent routes: "/v1/jobs/NS/ID/proxy/49983/v1" or ".../sandboxes/ID" */
    char *base;     /* "/v1/jobs/NS/ID" or "/v1/pools/NS/POOL/sandboxes/ID" */
    char token[65]; /* a dedicated sandbox's derived token */
};

int err_set(sbx_error_t *err, int code, int http_status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* A JSON call: body (may be NULL) sent as application/json; a 2xx answer's JSON in *ret (may
 * be NULL: the answer is dropped); any other status is an error whose message starts with
 * `what` and carries the platform's reason. */
int api_json(sbx_client_t *c, const char *what, const char *method, const char *target,
             const char *extra_headers, json_t *body, json_t **ret, int *ret_status,
             sbx_error_t *err);
/* The same with a prepared request (sinks, raw bodies); the response is the caller's. */
int api_raw(sbx_client_t *c, const char *what, http_req_t *rq, const char *extra_headers,
            http_resp_t *ret, sbx_error_t *err);
/* A status and the platform's answer turned into an error. */
int api_status_error(const char *what, int status, const char *body, size_t len, sbx_error_t *err);

/* Percent-escape s for a path segment or a query value; malloc'd. */
char *url_escape(const char *s);
/* asprintf that returns NULL on failure. */
char *strprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
json_t *kv_object(const sbx_kv_t *kv, size_t n);

int sandbox_new(sbx_client_t *c, const char *id, const char *pool, sbx_sandbox_t **ret);
char *sandbox_route(const sbx_sandbox_t *s, const char *rest);
