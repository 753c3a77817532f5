/* SPDX-License-Identifier: MIT */
/* Logging for binaries. Library code logs at debug level only. */
#pragma once

#include "macro.h"

enum { LOG_ERR_ = 3, LOG_WARN_ = 4, LOG_INFO_ = 6, LOG_DEBUG_ = 7 };

void log_set_level(int level);
/* The level from the environment: SBX_LOG_LEVEL (debug, info, warn or error; default info),
 * or, when that is unset, SBX_LOG (its former name in sbx-server, still read). A bad value is
 * logged naming the variable and returns -EINVAL (the daemon refuses to start). */
int log_level_from_env(void);
void log_msg(int level, const char *fmt, ...) _printf_(2, 3);

#define log_error(...) log_msg(LOG_ERR_, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARN_, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO_, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_DEBUG_, __VA_ARGS__)
