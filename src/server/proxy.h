/* SPDX-License-Identifier: MIT */
/* Port proxy: /v1/proxy/{port}/{rest...} replays the request to a local backend, then splices
 * both directions byte for byte (plain HTTP, chunked, SSE and WebSocket all pass through). */
#pragma once

#include <stdint.h>

typedef struct server server_t;

#define PROXY_CONNECT_TIMEOUT_MS 10000
#define PROXY_CHUNK (64 * 1024) /* bytes buffered per direction, at most */

/* Start a non-blocking connection to the dedicated-mode backend 127.0.0.1:port.
 * Returns 0 with *ret_fd set (connected or in progress: wait for EPOLLOUT), or -errno. */
int proxy_open_tcp(uint16_t port, int *ret_fd);

/* Tear down every established tunnel (server shutdown). */
void proxy_free_all(server_t *s);
