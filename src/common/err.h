/* SPDX-License-Identifier: MIT */
/* The error contract (docs/style.md): a function returns >= 0 on success and a negative errno
 * on failure. Where a message is worth having, it also takes an optional `sbx_err_t *err`
 * (NULL: no message wanted), filled only on failure:
 *
 *     if (!json_is_object(o))
 *         return sbx_err(err, -EINVAL, "%s must be an object of strings", name);
 *
 * The caller reads err->msg only after a negative return; err->code is that return. */
#pragma once

#include <stdarg.h>

#include "macro.h"

#define SBX_ERR_MSG_MAX 512

typedef struct {
    int code; /* the negative errno returned with it */
    char msg[SBX_ERR_MSG_MAX];
} sbx_err_t;

/* Fill err (when not NULL) with code and the formatted message; returns code (< 0). */
int sbx_err(sbx_err_t *err, int code, const char *fmt, ...) _printf_(3, 4);
int sbx_errv(sbx_err_t *err, int code, const char *fmt, va_list ap) _printf_(3, 0);
