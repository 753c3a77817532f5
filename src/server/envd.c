/* SPDX-License-Identifier: MIT */
/* The Connect protocol (JSON codec) in front of envd's services: framing, codes, deadlines,
 * keepalives and the method table. E2B's SDKs never send binary protobuf and never compress
 * (research/clients.md §1.3), so neither is accepted: a binary or compressed request is
 * refused with a Connect error that says so. */
#include "envd.h"

#include <stdarg.h>
#include <stdio.h>

#include "common/log.h"
#include "server.h"

/* ---- codes ------------------------------------------------------------------------------- */

static const struct {
    const char *name;
    int status;
} connect_codes[] = {
    [CONNECT_CANCELED] = { "canceled", HTTP_CLIENT_CLOSED },
    [CONNECT_UNKNOWN] = { "unknown", HTTP_INTERNAL_ERROR },
    [CONNECT_INVALID_ARGUMENT] = { "invalid_argument", HTTP_BAD_REQUEST },
    [CONNECT_DEADLINE_EXCEEDED] = { "deadline_exceeded", HTTP_GATEWAY_TIMEOUT },
    [CONNECT_NOT_FOUND] = { "not_found", HTTP_NOT_FOUND },
    [CONNECT_ALREADY_EXISTS] = { "already_exists", HTTP_CONFLICT },
    [CONNECT_PERMISSION_DENIED] = { "permission_denied", HTTP_FORBIDDEN },
    [CONNECT_RESOURCE_EXHAUSTED] = { "resource_exhausted", HTTP_TOO_MANY_REQUESTS },
    [CONNECT_FAILED_PRECONDITION] = { "failed_precondition", HTTP_BAD_REQUEST },
    [CONNECT_ABORTED] = { "aborted", HTTP_CONFLICT },
    [CONNECT_OUT_OF_RANGE] = { "out_of_range", HTTP_BAD_REQUEST },
    [CONNECT_UNIMPLEMENTED] = { "unimplemented", HTTP_NOT_IMPLEMENTED },
    [CONNECT_INTERNAL] = { "internal", HTTP_INTERNAL_ERROR },
    [CONNECT_UNAVAILABLE] = { "unavailable", HTTP_UNAVAILABLE },
    [CONNECT_DATA_LOSS] = { "data_loss", HTTP_INTERNAL_ERROR },
    [CONNECT_UNAUTHENTICATED] = { "unauthenticated", HTTP_UNAUTHORIZED },
};

const char *connect_code_name(connect_code_t code)
{
    if (code < CONNECT_CANCELED || code > CONNECT_UNAUTHENTICATED)
        return "unknown";
    return connect_codes[code].name;
}

int connect_code_status(connect_code_t code)
{
    if (code < CONNECT_CANCELED || code > CONNECT_UNAUTHENTICATED)
        return HTTP_INTERNAL_ERROR;
    return connect_codes[code].status;
}

connect_code_t connect_code_from_errno(int err)
{
    switch (-err) {
    case ENOENT: return CONNECT_NOT_FOUND;
    case EEXIST:
    case ENOTEMPTY: return CONNECT_ALREADY_EXISTS;
    case EACCES:
    case EPERM:
    case EROFS: return CONNECT_PERMISSION_DENIED;
    case ENOTDIR:
    case EISDIR:
    case ENXIO:
    case EBUSY:
    case ELOOP: return CONNECT_FAILED_PRECONDITION;
    case EINVAL:
    case ENAMETOOLONG:
    case E2BIG: return CONNECT_INVALID_ARGUMENT;
    case ENOSPC:
    case EDQUOT:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
    case EAGAIN: return CONNECT_RESOURCE_EXHAUSTED;
    default: return CONNECT_INTERNAL;
    }
}

/* ---- envelopes --------------------------------------------------------------------------- */

ssize_t envd_envelope_parse(const char *p, size_t n, size_t max, uint8_t *ret_flags,
                            size_t *ret_len)
{
    if (n < ENVD_ENVELOPE_HEADER)
        return 0;
    const unsigned char *u = (const unsigned char *)p;
    uint32_t len = (uint32_t)u[1] << 24 | (uint32_t)u[2] << 16 | (uint32_t)u[3] << 8 | u[4];
    if (len > max)
        return -EMSGSIZE;
    if (n - ENVD_ENVELOPE_HEADER < len)
        return 0;
    *ret_flags = u[0];
    *ret_len = len;
    return (ssize_t)(ENVD_ENVELOPE_HEADER + (size_t)len);
}

void envd_envelope_header(char out[ENVD_ENVELOPE_HEADER], uint8_t flags, uint32_t len)
{
    out[0] = (char)flags;
    out[1] = (char)(len >> 24);
    out[2] = (char)(len >> 16);
    out[3] = (char)(len >> 8);
    out[4] = (char)len;
}

/* ---- answers ----------------------------------------------------------------------------- */

static int envd_stream_start(envd_call_t *call)
{
    if (call->started)
        return call->c->dead ? -EPIPE : 0;
    call->started = true;
    return conn_stream_begin(call->c, 200, "application/connect+json",
                             "Cache-Control: no-store\r\nX-Accel-Buffering: no\r\n");
}

/* One envelope as one chunk. */
static int envd_write_envelope(envd_call_t *call, uint8_t flags, const char *p, size_t n)
{
    if (call->ended || n > UINT32_MAX)
        return -EPIPE;
    int r = envd_stream_start(call);
    if (r < 0)
        return r;
    char *buf = malloc(ENVD_ENVELOPE_HEADER + n);
    if (!buf)
        return -ENOMEM;
    envd_envelope_header(buf, flags, (uint32_t)n);
    memcpy(buf + ENVD_ENVELOPE_HEADER, p, n);
    r = conn_stream_chunk(call->c, buf, ENVD_ENVELOPE_HEADER + n);
    free(buf);
    return r;
}

int envd_send_raw(envd_call_t *call, const char *json, size_t len)
{
    return envd_write_envelope(call, 0, json, len);
}

int envd_send(envd_call_t *call, json_t *j)
{
    if (!j)
        return -ENOMEM;
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s)
        return -ENOMEM;
    int r = envd_send_raw(call, s, strlen(s));
    free(s);
    return r;
}

static void envd_stop_timers(envd_call_t *call)
{
    loop_t *l = call->c->srv->loop;
    timer_disarm(l, &call->keepalive_t);
    timer_disarm(l, &call->deadline_t);
}

static void envd_end_with(envd_call_t *call, json_t *end)
{
    if (call->ended) {
        json_decref(end);
        return;
    }
    char *s = end ? json_dumps(end, JSON_COMPACT) : NULL;
    json_decref(end);
    const char *text = s ? s : "{}";
    (void)envd_write_envelope(call, ENVD_FLAG_END_STREAM, text, strlen(text));
    free(s);
    call->ended = true;
    envd_stop_timers(call);
    if (!call->c->dead)
        conn_stream_end(call->c);
}

void envd_end(envd_call_t *call) { envd_end_with(call, NULL); }

/* A unary answer above this goes as a chunked stream under backpressure (a 50,000-entry
 * ListDir is ~10 MB, past what a connection holds: it was cut without an answer). */
#define ENVD_REPLY_INLINE_MAX (1024 * 1024)

static void envd_reply_pump(envd_call_t *call)
{
    conn_stream_pump(call->c, call->reply, call->reply_len, &call->reply_off);
}

void envd_reply(envd_call_t *call, json_t *j)
{
    if (call->ended) {
        json_decref(j);
        return;
    }
    call->ended = true;
    if (!j) {
        conn_respond(call->c, HTTP_INTERNAL_ERROR, "application/json",
                     "{\"code\":\"internal\",\"message\":\"out of memory\"}", 46, NULL);
        return;
    }
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s) {
        conn_respond(call->c, HTTP_INTERNAL_ERROR, "application/json",
                     "{\"code\":\"internal\",\"message\":\"out of memory\"}", 46, NULL);
        return;
    }
    size_t len = strlen(s);
    if (len > ENVD_REPLY_INLINE_MAX) {
        call->reply = s; /* freed with the call */
        call->reply_len = len;
        if (conn_stream_begin(call->c, 200, "application/json", NULL) >= 0)
            envd_reply_pump(call);
        return;
    }
    conn_respond(call->c, 200, "application/json", s, len, NULL);
    free(s);
}

void envd_fail(envd_call_t *call, connect_code_t code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    (void)vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    json_t *err = json_pack("{s:s,s:s}", "code", connect_code_name(code), "message", msg);
    if (call->stream) {
        /* a stream's error travels in its end envelope, with HTTP 200: connect-es takes the
         * code from the HTTP status alone when it is not 200 */
        envd_end_with(call, err ? json_pack("{s:o}", "error", err) : NULL);
        return;
    }
    if (call->ended) {
        json_decref(err);
        return;
    }
    call->ended = true;
    char *s = err ? json_dumps(err, JSON_COMPACT) : NULL;
    json_decref(err);
    const char *text = s ? s : "{\"code\":\"internal\"}";
    conn_respond(call->c, connect_code_status(code), "application/json", text, strlen(text), NULL);
    free(s);
}

/* ---- the call's connection --------------------------------------------------------------- */

static void envd_on_drain(conn_t *c)
{
    envd_call_t *call = c->hdata;
    if (call && call->reply)
        envd_reply_pump(call);
    else if (call && call->on_drain && !call->ended)
        call->on_drain(call);
}

static void envd_on_close(conn_t *c, bool aborted)
{
    envd_call_t *call = c->hdata;
    (void)aborted;
    if (!call)
        return;
    c->hdata = NULL;
    envd_stop_timers(call);
    if (call->on_close)
        call->on_close(call);
    if (call->op_counted)
        server_op_end(server_of(c));
    free(call->reply);
    listing_slot_give(&call->listing);
    free(call);
}

static const handler_ops_t envd_ops = { .on_drain = envd_on_drain, .on_close = envd_on_close };

static void envd_on_keepalive(loop_t *l, timer_t_ *t)
{
    envd_call_t *call = t->data;
    if (call->ended || !call->keepalive_msg)
        return;
    if (envd_send_raw(call, call->keepalive_msg, strlen(call->keepalive_msg)) < 0)
        return;
    conn_flush(call->c);
    timer_arm(l, t, call->keepalive_ms);
}

static void envd_on_deadline(loop_t *l, timer_t_ *t)
{
    envd_call_t *call = t->data;
    (void)l;
    if (call->ended)
        return;
    if (call->on_deadline)
        call->on_deadline(call);
    else
        envd_fail(call, CONNECT_DEADLINE_EXCEEDED,
                  "the call's deadline (Connect-Timeout-Ms) passed");
}

/* A numeric header (digits only), or def. */
static uint64_t header_u64(const conn_t *c, const char *name, uint64_t max, uint64_t def,
                           bool *ret_bad)
{
    sv_t v;
    uint64_t n;
    if (!http_header_get(&c->req, name, &v))
        return def;
    if (parse_u64(v, max, &n) < 0) {
        *ret_bad = true;
        return def;
    }
    return n;
}

/* ---- dispatch ---------------------------------------------------------------------------- */

static const sv_t process_prefix = { "/process.Process/", 17 };
static const sv_t fs_prefix = { "/filesystem.Filesystem/", 23 };

bool envd_is_route(sv_t path)
{
    return sv_has_prefix(path, process_prefix) || sv_has_prefix(path, fs_prefix) ||
           sv_eq(path, SV("/files"));
}

static bool method_is(const conn_t *c, const char *m)
{
    return c->req.method.len == strlen(m) && memcmp(c->req.method.p, m, c->req.method.len) == 0;
}

/* The media type without parameters ("application/json; charset=utf-8"). */
static sv_t media_type(const conn_t *c)
{
    sv_t v;
    if (!http_header_get(&c->req, "content-type", &v))
        return SV("");
    size_t n = 0;
    while (n < v.len && v.p[n] != ';' && v.p[n] != ' ')
        n++;
    return sv_make(v.p, n);
}

static void envd_run(envd_call_t *call, json_t *req)
{
    if (call->process)
        envd_process_call(call, call->method, req);
    else
        envd_fs_call(call, call->method, req);
}

/* The request's message: a unary body is the JSON itself, a stream's body is one envelope. */
static void envd_body_done(conn_t *c)
{
    envd_call_t *call = c->hdata;
    const char *p = buf_head(&c->body);
    size_t n = c->body.len;
    if (call->stream) {
        uint8_t flags = 0;
        size_t len = 0;
        ssize_t k = envd_envelope_parse(p, n, ENVD_MAX_MESSAGE, &flags, &len);
        if (k <= 0 || (size_t)k != n) {
            envd_fail(call, CONNECT_INVALID_ARGUMENT,
                      "the request body must be exactly one envelope (5-byte prefix, JSON)");
            return;
        }
        if (flags & ENVD_FLAG_COMPRESSED) {
            envd_fail(call, CONNECT_UNIMPLEMENTED, "compressed messages are not supported");
            return;
        }
        if (flags != 0) { /* end-stream is the server's; no other flag is defined */
            envd_fail(call, CONNECT_INVALID_ARGUMENT,
                      "a request envelope's flags must be 0 (got 0x%02x)", flags);
            return;
        }
        p += ENVD_ENVELOPE_HEADER;
        n = len;
    }
    json_error_t err;
    json_t *req = n == 0 ? json_object() : json_loadb(p, n, JSON_REJECT_DUPLICATES, &err);
    if (!req || !json_is_object(req)) {
        json_decref(req);
        if (!req)
            envd_fail(call, CONNECT_INVALID_ARGUMENT, "the message is not valid JSON: %s",
                      err.text); /* a duplicate key among them */
        else
            envd_fail(call, CONNECT_INVALID_ARGUMENT, "the message must be a JSON object");
        return;
    }
    if (call->stream) {
        /* the stream answers from now on: deadlines and keepalives run */
        loop_t *l = server_of(c)->loop;
        if (call->timeout_ms)
            timer_arm(l, &call->deadline_t, call->timeout_ms);
        timer_arm(l, &call->keepalive_t, call->keepalive_ms);
        server_op_begin(server_of(c));
        call->op_counted = true;
    }
    envd_run(call, req);
    json_decref(req);
}

static void envd_rpc(conn_t *c, sv_t path)
{
    bool process = sv_has_prefix(path, process_prefix);
    sv_t method = process ? sv_make(path.p + process_prefix.len, path.len - process_prefix.len)
                          : sv_make(path.p + fs_prefix.len, path.len - fs_prefix.len);
    bool known = false;
    bool streams = process ? envd_process_streams(method, &known) : envd_fs_streams(method, &known);
    sv_t ct = media_type(c);
    bool is_stream = sv_eq_lit_nocase(ct, "application/connect+json");
    bool is_unary = sv_eq_lit_nocase(ct, "application/json");
    static const char bad_type[] = "{\"code\":\"unimplemented\",\"message\":\"only Connect's JSON "
                                   "codec is served (application/json, "
                                   "application/connect+json)\"}";
    if (!method_is(c, "POST")) {
        c->keep_alive = c->keep_alive && c->body_left <= CONN_DRAIN_MAX;
        conn_respond(c, HTTP_METHOD_NOT_ALLOWED, "application/json",
                     "{\"code\":\"unimplemented\",\"message\":\"use POST\"}", 45,
                     "Allow: POST\r\n");
        return;
    }
    if (!known) {
        c->keep_alive = c->keep_alive && c->body_left <= CONN_DRAIN_MAX;
        http_not_found(c, 0, "no such method");
        return;
    }
    if ((!is_stream && !is_unary) || is_stream != streams) {
        c->keep_alive = c->keep_alive && c->body_left <= CONN_DRAIN_MAX;
        conn_respond(c, HTTP_UNSUPPORTED_MEDIA_TYPE, "application/json", bad_type,
                     sizeof bad_type - 1, NULL);
        return;
    }
    envd_call_t *call = calloc(1, sizeof *call);
    if (!call) {
        http_unavailable(c, 0, "out of memory");
        return;
    }
    bool bad = false;
    call->c = c;
    call->stream = is_stream;
    call->process = process;
    call->method = method;
    /* Connect-Timeout-Ms: at most 10 digits; Keepalive-Ping-Interval (E2B's): seconds */
    call->timeout_ms = header_u64(c, "connect-timeout-ms", 9999999999ULL, 0, &bad);
    uint64_t ka = header_u64(c, "keepalive-ping-interval", 3600, ENVD_DEFAULT_KEEPALIVE_S, &bad);
    call->keepalive_ms = (ka ? ka : ENVD_DEFAULT_KEEPALIVE_S) * 1000;
    call->keepalive_msg = process ? "{\"event\":{\"keepalive\":{}}}" : "{\"keepalive\":{}}";
    timer_init(&call->keepalive_t, envd_on_keepalive, call);
    timer_init(&call->deadline_t, envd_on_deadline, call);
    conn_set_handler(c, &envd_ops, call);
    if (bad) {
        envd_fail(call, CONNECT_INVALID_ARGUMENT,
                  "Connect-Timeout-Ms and Keepalive-Ping-Interval must be numbers");
        return;
    }
    sv_t enc;
    if ((http_header_get(&c->req, "content-encoding", &enc) &&
         !sv_eq_lit_nocase(enc, "identity")) ||
        (http_header_get(&c->req, "connect-content-encoding", &enc) &&
         !sv_eq_lit_nocase(enc, "identity"))) {
        envd_fail(call, CONNECT_UNIMPLEMENTED, "compressed requests are not supported");
        return;
    }
    conn_collect_body(c, ENVD_MAX_MESSAGE + ENVD_ENVELOPE_HEADER, envd_body_done);
}

void envd_dispatch(conn_t *c, sv_t path)
{
    if (sv_eq(path, SV("/files"))) {
        if (method_is(c, "GET"))
            envd_files_get(c);
        else if (method_is(c, "POST"))
            envd_files_post(c);
        else {
            c->keep_alive = c->keep_alive && c->body_left <= CONN_DRAIN_MAX;
            conn_respond(c, HTTP_METHOD_NOT_ALLOWED, "application/json",
                         "{\"code\":405,\"message\":\"method not allowed\"}", 43,
                         "Allow: GET, POST\r\n");
        }
        return;
    }
    envd_rpc(c, path);
}

void envd_refuse(conn_t *c, sv_t path)
{
    c->keep_alive = c->keep_alive && c->body_left <= CONN_DRAIN_MAX;
    if (sv_eq(path, SV("/files"))) {
        static const char body[] = "{\"code\":401,\"message\":\"missing or invalid "
                                   "X-Access-Token\"}";
        conn_respond(c, HTTP_UNAUTHORIZED, "application/json", body, sizeof body - 1, NULL);
        return;
    }
    static const char body[] = "{\"code\":\"unauthenticated\",\"message\":\"missing or invalid "
                               "X-Access-Token\"}";
    conn_respond(c, HTTP_UNAUTHORIZED, "application/json", body, sizeof body - 1, NULL);
}
