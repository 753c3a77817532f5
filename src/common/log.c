/* SPDX-License-Identifier: MIT */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

/* The one process-wide setting: written once by main() before any other thread exists. */
static int max_level = LOG_INFO_;

void log_set_level(int level) { max_level = level; }

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
