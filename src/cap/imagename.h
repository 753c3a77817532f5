/* SPDX-License-Identifier: MIT */
/* Image names as the platform's protocol has them (job specs, install bodies, node reports):
 * shared by sbx-control and sbx-node, like the capability format. */
#pragma once

#include <stdbool.h>
#include <string.h>

#define IMAGE_NAME_MAX 64 /* [a-z0-9][a-z0-9._-]*, "host" reserved */

static inline bool image_name_valid(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n >= IMAGE_NAME_MAX || strcmp(name, "host") == 0)
        return false;
    for (size_t i = 0; i < n; i++) {
        char ch = name[i];
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
                  (i > 0 && (ch == '.' || ch == '_' || ch == '-'));
        if (!ok)
            return false;
    }
    return true;
}
