/* SPDX-License-Identifier: MIT */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The one process-wide setting: written once by main() before any other thread exists. */
static int max_level = LOG_INFO_;

void log_set_level(int level) { max_level = level; }

int log_level_from_env(void)
{
    static const struct {
        const char *name;
        int level;
    } levels[] = {
        { "debug", LOG_DEBUG_ }, { "info", LOG_INFO_ }, { "warn", LOG_WARN_ }, { "error", LOG_ERR_ }
    };
    const char *var = "SBX_LOG_LEVEL", *v = getenv(var);
    if (!v) {
        var = "SBX_LOG";
        v = getenv(var);
    }
    if (!v || !*v)
        return 0;
    for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++)
        if (strcmp(v, levels[i].name) == 0) {
            max_level = levels[i].level;
            return 0;
        }
    log_error("%s=%s: expected debug, info, warn or error", var, v);
    return -EINVAL;
}

void log_msg(int level, const char *fmt, ...)
{
    if (level > max_level)
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    (void)vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    static const char *const names[] = { [3] = "error", [4] = "warn", [6] = "info", [7] = "debug" };
    (void)fprintf(stderr, "sbx: %s: %s\n",
                  level >= 0 && level <= 7 && names[level] ? names[level] : "log", line);
}
