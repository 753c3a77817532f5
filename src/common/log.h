/* SPDX-License-Identifier: MIT */
/* Logging for binaries. Library code logs at debug level only. */
#pragma once

#include "macro.h"

enum { LOG_ERR_ = 3, LOG_WARN_ = 4, LOG_INFO_ = 6, LOG_DEBUG_ = 7 };

void log_set_level(int level);
void log_msg(int level, const char *fmt, ...) _printf_(2, 3);

#define log_error(...) log_msg(LOG_ERR_, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARN_, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO_, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_DEBUG_, __VA_ARGS__)
