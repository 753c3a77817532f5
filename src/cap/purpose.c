/* SPDX-License-Identifier: MIT */
#include "purpose.h"

#include <string.h>

static bool has_prefix(sv_t p, const char *pre)
{
    size_t n = strlen(pre);
    if (p.len < n || memcmp(p.p, pre, n) != 0)
        return false;
    return p.len == n || p.p[n] == '/' || p.p[n] == '?';
}

static uint32_t agent_purpose(sv_t method, sv_t path)
{
    if (has_prefix(path, "/v1/exec"))
        return CAP_EXEC;
    if (has_prefix(path, "/v1/processes"))
        return CAP_PROCESSES;
    if (has_prefix(path, "/v1/files")) {
        bool read = sv_eq(method, SV("GET")) || sv_eq(method, SV("HEAD"));
        return read ? CAP_FILES_READ : CAP_FILES_WRITE;
    }
    return 0;
}

uint32_t cap_purpose_of(sv_t method, uint16_t port, sv_t path)
{
    if (port != CAP_AGENT_PORT)
        return CAP_PROXY;
    uint32_t p = agent_purpose(method, path);
    if (p)
        return p;
    /* pool hosts: /v1/sandboxes/{id}/<route> is that sandbox's <route> */
    if (has_prefix(path, "/v1/sandboxes") && path.len > 14) {
        sv_t rest = sv_make(path.p + 14, path.len - 14);
        const char *slash = memchr(rest.p, '/', rest.len);
        if (slash) {
            size_t off = (size_t)(slash - rest.p);
            char tmp[512];
            size_t n = rest.len - off;
            if (n + 3 < sizeof tmp) { /* "/v1" + "/<route>" */
                memcpy(tmp, "/v1", 3);
                memcpy(tmp + 3, slash, n);
                p = agent_purpose(method, sv_make(tmp, n + 3));
                if (p)
                    return p;
            }
        }
    }
    return CAP_PROXY;
}
