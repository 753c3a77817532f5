/* SPDX-License-Identifier: MIT */
#include "err.h"

#include <stdio.h>

int sbx_errv(sbx_err_t *err, int code, const char *fmt, va_list ap)
{
    if (err) {
        err->code = code;
        (void)vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    }
    return code;
}

int sbx_err(sbx_err_t *err, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int r = sbx_errv(err, code, fmt, ap);
    va_end(ap);
    return r;
}
