/* SPDX-License-Identifier: MIT */
#include "status.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "conn.h"

const char *http_reason(int status)
{
    switch (status) {
    case 101: return "Switching Protocols";
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 206: return "Partial Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 406: return "Not Acceptable";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 410: return "Gone";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 416: return "Range Not Satisfiable";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    case 507: return "Insufficient Storage";
    default: return "Unknown";
    }
}

int http_status_from_errno(int err, const char **ret_msg)
{
    int status;
    const char *msg;
    switch (err) {
    case -ENOENT:
        status = HTTP_NOT_FOUND;
        msg = "not found";
        break;
    case -EISDIR:
        status = HTTP_CONFLICT;
        msg = "is a directory";
        break;
    case -ENOTDIR:
        status = HTTP_CONFLICT;
        msg = "not a directory";
        break;
    case -EEXIST:
        status = HTTP_CONFLICT;
        msg = "already exists";
        break;
    case -ENOTEMPTY:
        status = HTTP_CONFLICT;
        msg = "directory not empty";
        break;
    case -EBUSY:
        status = HTTP_CONFLICT;
        msg = "busy (a mount point or in use)";
        break;
    case -EPIPE:
        status = HTTP_CONFLICT;
        msg = "closed by the other end";
        break;
    case -ENXIO:
        status = HTTP_BAD_REQUEST;
        msg = "not a regular file";
        break;
    case -EXDEV:
        status = HTTP_BAD_REQUEST;
        msg = "crosses a filesystem boundary";
        break;
    case -ELOOP:
        status = HTTP_BAD_REQUEST;
        msg = "a path component is a symlink, which this API does not follow";
        break;
    case -EACCES:
    case -EPERM:
        status = HTTP_BAD_REQUEST;
        msg = "permission denied";
        break; /* 403 is for credentials */
    case -ENAMETOOLONG:
        status = HTTP_BAD_REQUEST;
        msg = "path too long";
        break;
    case -EINVAL:
        status = HTTP_BAD_REQUEST;
        msg = "invalid argument";
        break;
    case -EFBIG:
    case -E2BIG:
        status = HTTP_CONTENT_TOO_LARGE;
        msg = "too large";
        break;
    case -ENOSPC:
    case -EDQUOT:
        status = HTTP_INTERNAL_ERROR; /* not 507: no client of the API expects it */
        msg = "no space left";
        break;
    case -ENOMEM:
        status = HTTP_UNAVAILABLE;
        msg = "out of memory";
        break;
    case -EMFILE:
    case -ENFILE:
        status = HTTP_UNAVAILABLE;
        msg = "too many open files";
        break;
    default:
        status = HTTP_INTERNAL_ERROR;
        msg = strerror(-err);
        break;
    }
    if (ret_msg)
        *ret_msg = msg;
    return status;
}

int http_status_from_head_error(int err)
{
    switch (err) {
    case -EMSGSIZE: return HTTP_HEADERS_TOO_LARGE;
    case -EPROTONOSUPPORT: return HTTP_VERSION_NOT_SUPPORTED;
    default: return HTTP_BAD_REQUEST;
    }
}

/* ---- error answers ------------------------------------------------------------------------ */

void http_error_message(char *msg, size_t cap, const char *fmt, va_list ap)
{
    (void)vsnprintf(msg, cap, fmt, ap);
    for (char *m = msg; *m; m++)
        if ((unsigned char)*m >= 0x80 || (unsigned char)*m < 0x20)
            *m = '?';
}

static json_t *error_json(int status, unsigned flags, const char *msg)
{
    if (flags & HTTP_BODY_CODE)
        return json_pack("{s:i,s:s}", "code", status, "message", msg);
    return json_pack("{s:s}", "error", msg);
}

json_t *http_error_vjson(int status, unsigned flags, const char *fmt, va_list ap)
{
    char msg[512];
    http_error_message(msg, sizeof msg, fmt, ap);
    return error_json(status, flags, msg);
}

int http_verror(conn_t *c, int status, unsigned flags, const char *fmt, va_list ap)
{
    if (c->resp_started) {
        conn_abort(c);
        return -EALREADY;
    }
    json_t *j = http_error_vjson(status, flags, fmt, ap);
    _cleanup_free_ char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!body) {
        conn_abort(c);
        return -ENOMEM;
    }
    if (flags & HTTP_CLOSE)
        c->keep_alive = false;
    return conn_respond(c, status, "application/json", body, strlen(body),
                        flags & HTTP_RETRY_SOON ? "Retry-After: 1\r\n" : NULL);
}

int http_error(conn_t *c, int status, unsigned flags, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int r = http_verror(c, status, flags, fmt, ap);
    va_end(ap);
    return r;
}

int http_errno(conn_t *c, unsigned flags, int err, const char *what)
{
    const char *msg;
    int status = http_status_from_errno(err, &msg);
    return http_error(c, status, flags, "%s: %s", what, msg);
}
