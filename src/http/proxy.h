/* SPDX-License-Identifier: MIT */
/* Port proxy: /v1/proxy/{port}/{rest...} replays the request to a local backend, then splices
 * both directions byte for byte (plain HTTP, chunked, SSE and WebSocket all pass through). */
#pragma once

#include <stdint.h>

#include "common/buf.h"
#include "common/sock.h"
#include "http.h"

typedef struct httpd httpd_t;

#define PROXY_CONNECT_TIMEOUT_MS 10000
#define PROXY_CHUNK (64 * 1024) /* bytes buffered per direction, at most */
/* A tunnel whose client has finished sending (EOF) is closed once its backend has sent nothing
 * for this long. */
#define PROXY_HALF_CLOSED_MS 10000

/* Start a non-blocking connection to the dedicated-mode backend 127.0.0.1:port.
 * Returns 0 with *ret_fd set (connected or in progress: wait for EPOLLOUT), or -errno. */
int proxy_open_tcp(uint16_t port, int *ret_fd);

typedef struct conn conn_t;
typedef struct tunnel tunnel_t;
typedef void (*tunnel_close_cb)(tunnel_t *t, void *data);

/* Take c's socket away from HTTP and splice it with the connected backend socket bfd (taken,
 * with bio, its transport layer or NULL).
 * head: bytes for the backend first (taken; bytes the client sent past its head follow);
 * down_pre: bytes for the client first (taken; may be NULL).
 * answer_drop (may be NULL): the backend's answer heads (1xx ones and the first other one,
 * down_pre included) are checked as a relay checks them (a malformed one ends the tunnel, none
 * of it passed on) and lose the headers whose name begins with it (any case); the bytes after
 * them pass unchanged.
 * cb(t, data) runs exactly once when the tunnel ends, whoever ends it, never before this
 * returns. Returns the tunnel (valid until cb runs), or NULL when it could not start (the
 * client has then been answered or dropped, and cb never runs). */
tunnel_t *proxy_tunnel_start(conn_t *c, int bfd, sockio_t *bio, buf_t *head, buf_t *down_pre,
                             const char *answer_drop, tunnel_close_cb cb, void *cb_data);
/* A request head for a forwarding hop: "METHOD target HTTP/1.1", the client's headers except
 * those named in drop (case-insensitive, NULL-terminated list) and the hop-by-hop Connection,
 * Keep-Alive and Proxy-Connection, then extra ("Name: value\r\n" lines, may be NULL), then
 * "Connection: close" (or "Connection: Upgrade" when the client asks for an upgrade; with keep,
 * for a relay whose connection carries more requests, no Connection header and no Expect). */
int proxy_forward_head(const http_request_t *rq, sv_t target, const char *const *drop,
                       const char *extra, bool keep, buf_t *out);

/* Cut a tunnel in both directions now (its cb runs). */
void proxy_tunnel_close(tunnel_t *t);

/* Tear down every established tunnel (httpd_done). */
void proxy_free_all(httpd_t *s);
