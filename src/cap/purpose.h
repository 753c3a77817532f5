/* SPDX-License-Identifier: MIT */
/* What a request forwarded to a run's port does, in capability terms. The control plane uses it
 * to issue the narrowest capability and the node to check that the capability covers the
 * request: both run this same function over the same method, port and path. */
#pragma once

#include <stdint.h>

#include "cap.h"
#include "common/strutil.h"

/* The port on which a run's own sbx-server answers (through the node's bridge). */
#define CAP_AGENT_PORT 49983

/* The purpose (one CAP_* bit) of `method path` sent to `port` of a run, and the protocol
 * (websocket when the client asks for an upgrade). Requests to the agent port for exec, files
 * and processes (also under /v1/sandboxes/{id}/ on pool hosts) get their own bits; everything
 * else is CAP_PROXY to that port. */
uint32_t cap_purpose_of(sv_t method, uint16_t port, sv_t path);
