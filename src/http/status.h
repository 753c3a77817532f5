/* SPDX-License-Identifier: MIT */
/* HTTP statuses: their names and reason phrases (one table), the one table where an errno
 * becomes a status, and the error answers (h2o's H2O_SEND_ERROR_XXX shape): one helper per
 * status, where closing the connection after the answer is a flag of the call.
 *
 *     return http_not_found(c, 0, "no job %s in namespace %s", id, ns);
 *     return http_length_required(c, HTTP_CLOSE, "send Content-Length");
 *
 * A status number is written in this file and status.c only (scripts/check-errors.sh). */
#pragma once

#include <jansson.h>
#include <stdarg.h>
#include <stddef.h>

#include "common/macro.h"

typedef enum {
    HTTP_SWITCHING_PROTOCOLS = 101,
    HTTP_OK = 200,
    HTTP_CREATED = 201,
    HTTP_ACCEPTED = 202,
    HTTP_NO_CONTENT = 204,
    HTTP_PARTIAL_CONTENT = 206,
    HTTP_BAD_REQUEST = 400,
    HTTP_UNAUTHORIZED = 401,
    HTTP_FORBIDDEN = 403,
    HTTP_NOT_FOUND = 404,
    HTTP_METHOD_NOT_ALLOWED = 405,
    HTTP_NOT_ACCEPTABLE = 406,
    HTTP_REQUEST_TIMEOUT = 408,
    HTTP_CONFLICT = 409,
    HTTP_GONE = 410,
    HTTP_LENGTH_REQUIRED = 411,
    HTTP_CONTENT_TOO_LARGE = 413,
    HTTP_URI_TOO_LONG = 414,
    HTTP_UNSUPPORTED_MEDIA_TYPE = 415,
    HTTP_RANGE_NOT_SATISFIABLE = 416,
    HTTP_UNPROCESSABLE = 422,
    HTTP_TOO_MANY_REQUESTS = 429,
    HTTP_HEADERS_TOO_LARGE = 431,
    HTTP_CLIENT_CLOSED = 499, /* Connect's "canceled" (not sent on the wire by sbx itself) */
    HTTP_INTERNAL_ERROR = 500,
    HTTP_NOT_IMPLEMENTED = 501,
    HTTP_BAD_GATEWAY = 502,
    HTTP_UNAVAILABLE = 503,
    HTTP_GATEWAY_TIMEOUT = 504,
    HTTP_VERSION_NOT_SUPPORTED = 505,
    HTTP_INSUFFICIENT_STORAGE = 507,
} http_status_t;

/* The reason phrase of a status ("Unknown" for one not in the table). */
const char *http_reason(int status);

/* The one table of errno -> status: err (-errno) gives the status and, in *ret_msg, a short
 * message ("not found", "already exists", ...); an errno not in the table is 500 with
 * strerror's text. */
int http_status_from_errno(int err, const char **ret_msg);

/* The status of a request head http_parse_request() refused (its -errno). */
int http_status_from_head_error(int err);

/* ---- error answers ------------------------------------------------------------------------ */

typedef struct conn conn_t;

enum {
    HTTP_CLOSE = 1 << 0,      /* close the connection after the answer */
    HTTP_BODY_CODE = 1 << 1,  /* the body is {"code": status, "message": ...} (E2B's shape);
                               * without it {"error": ...} */
    HTTP_RETRY_SOON = 1 << 2, /* "Retry-After: 1": the refusal is temporary */
};

/* The error answer: status, flags, the message (printf; made ASCII, at most 511 bytes). An
 * answer already started cannot be replaced: the connection is aborted (-EALREADY). */
int http_error(conn_t *c, int status, unsigned flags, const char *fmt, ...) _printf_(4, 5);
int http_verror(conn_t *c, int status, unsigned flags, const char *fmt, va_list ap) _printf_(4, 0);
/* An errno answered through the errno table: "what: <the table's message>". */
int http_errno(conn_t *c, unsigned flags, int err, const char *what);

/* The error body alone, for answers made away from the connection (a worker thread's):
 * {"error": msg}, or with HTTP_BODY_CODE {"code": status, "message": msg}; NULL without memory. */
json_t *http_error_vjson(int status, unsigned flags, const char *fmt, va_list ap) _printf_(3, 0);
/* The message of an error answer: formatted into msg (cap bytes), bytes outside printable
 * ASCII made '?' (a message may quote request bytes; truncation may split a UTF-8 sequence). */
void http_error_message(char *msg, size_t cap, const char *fmt, va_list ap) _printf_(3, 0);

#define HTTP_ERROR_HELPER_(name, status)                                                           \
    _printf_(3, 4) static inline int name(conn_t *c, unsigned flags, const char *fmt, ...)         \
    {                                                                                              \
        va_list ap;                                                                                \
        va_start(ap, fmt);                                                                         \
        int r = http_verror(c, status, flags, fmt, ap);                                            \
        va_end(ap);                                                                                \
        return r;                                                                                  \
    }
HTTP_ERROR_HELPER_(http_bad_request, HTTP_BAD_REQUEST)
HTTP_ERROR_HELPER_(http_unauthorized, HTTP_UNAUTHORIZED)
HTTP_ERROR_HELPER_(http_forbidden, HTTP_FORBIDDEN)
HTTP_ERROR_HELPER_(http_not_found, HTTP_NOT_FOUND)
HTTP_ERROR_HELPER_(http_method_not_allowed, HTTP_METHOD_NOT_ALLOWED)
HTTP_ERROR_HELPER_(http_request_timeout, HTTP_REQUEST_TIMEOUT)
HTTP_ERROR_HELPER_(http_conflict, HTTP_CONFLICT)
HTTP_ERROR_HELPER_(http_gone, HTTP_GONE)
HTTP_ERROR_HELPER_(http_length_required, HTTP_LENGTH_REQUIRED)
HTTP_ERROR_HELPER_(http_too_large, HTTP_CONTENT_TOO_LARGE)
HTTP_ERROR_HELPER_(http_uri_too_long, HTTP_URI_TOO_LONG)
HTTP_ERROR_HELPER_(http_too_many, HTTP_TOO_MANY_REQUESTS)
HTTP_ERROR_HELPER_(http_internal_error, HTTP_INTERNAL_ERROR)
HTTP_ERROR_HELPER_(http_not_implemented, HTTP_NOT_IMPLEMENTED)
HTTP_ERROR_HELPER_(http_bad_gateway, HTTP_BAD_GATEWAY)
HTTP_ERROR_HELPER_(http_unavailable, HTTP_UNAVAILABLE)
HTTP_ERROR_HELPER_(http_gateway_timeout, HTTP_GATEWAY_TIMEOUT)
#undef HTTP_ERROR_HELPER_
