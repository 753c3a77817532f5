/* SPDX-License-Identifier: MIT */
#include "status.h"

#include <errno.h>
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
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 416: return "Range Not Satisfiable";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
    }
}

int conn_respond_errno(conn_t *c, int err, const char *what)
{
    int status;
    const char *msg;
    switch (err) {
    case -ENOENT:
        status = 404;
        msg = "not found";
        break;
    case -EISDIR:
        status = 409;
        msg = "is a directory";
        break;
    case -ENOTDIR:
        status = 409;
        msg = "not a directory";
        break;
    case -EEXIST:
        status = 409;
        msg = "already exists";
        break;
    case -ENOTEMPTY:
        status = 409;
        msg = "directory not empty";
        break;
    case -EBUSY:
        status = 409;
        msg = "busy (a mount point or in use)";
        break;
    case -ENXIO:
        status = 400;
        msg = "not a regular file";
        break;
    case -EXDEV:
        status = 400;
        msg = "crosses a filesystem boundary";
        break;
    case -ELOOP:
        status = 400;
        msg = "a path component is a symlink, which this API does not follow";
        break;
    case -EACCES:
    case -EPERM:
        status = 400;
        msg = "permission denied";
        break; /* 403 is for credentials */
    case -ENAMETOOLONG:
        status = 400;
        msg = "path too long";
        break;
    case -EINVAL:
        status = 400;
        msg = "invalid argument";
        break;
    case -EFBIG:
    case -E2BIG:
        status = 413;
        msg = "too large";
        break;
    case -ENOSPC:
    case -EDQUOT:
        status = 507;
        msg = "no space left";
        break;
    case -ENOMEM:
        status = 503;
        msg = "out of memory";
        break;
    case -EMFILE:
    case -ENFILE:
        status = 503;
        msg = "too many open files";
        break;
    default:
        status = 500;
        msg = strerror(-err);
        break;
    }
    if (status == 507)
        status = 500;
    return conn_respond_error(c, status, "%s: %s", what, msg);
}
