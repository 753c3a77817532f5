/* SPDX-License-Identifier: MIT */
/* HTTP statuses: reason phrases, and the one table where an errno becomes a status. */
#pragma once

typedef struct conn conn_t;

const char *http_reason(int status);
/* Map -errno to a status and answer with its message. */
int conn_respond_errno(conn_t *c, int err, const char *what);
