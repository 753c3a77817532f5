/* SPDX-License-Identifier: MIT */
/* Small helpers shared by every sbx component: cleanup attributes, ownership
 * hand-over, overflow-checked arithmetic. Kept deliberately tiny. */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define _cleanup_(f) __attribute__((cleanup(f)))
#define _unused_ __attribute__((unused))
#define _printf_(a, b) __attribute__((format(printf, a, b)))
#define _noreturn_ __attribute__((noreturn))
#define _likely_(x) __builtin_expect(!!(x), 1)
#define _unlikely_(x) __builtin_expect(!!(x), 0)

#define ELEMENTSOF(a) (sizeof(a) / sizeof((a)[0]))
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

/* Hand ownership of a pointer or fd out of a cleanup-managed variable. */
#define TAKE_PTR(p)                                                                                \
    ({                                                                                             \
        __typeof__(p) _tp = (p);                                                                   \
        (p) = NULL;                                                                                \
        _tp;                                                                                       \
    })
#define TAKE_FD(fd)                                                                                \
    ({                                                                                             \
        int _tf = (fd);                                                                            \
        (fd) = -EBADF;                                                                             \
        _tf;                                                                                       \
    })

static inline void freep(void *p) { free(*(void **)p); }
#define _cleanup_free_ _cleanup_(freep)

static inline int safe_close(int fd)
{
    if (fd >= 0) {
        int saved = errno;
        (void)close(fd);
        errno = saved;
    }
    return -EBADF;
}
static inline void closep(int *fd) { *fd = safe_close(*fd); }
#define _cleanup_close_ _cleanup_(closep)

/* Return -errno from a libc call that returned -1. */
static inline int negative_errno(void) { return errno > 0 ? -errno : -EIO; }

static inline bool size_add_ok(size_t a, size_t b, size_t *ret)
{
    return !__builtin_add_overflow(a, b, ret);
}
static inline bool size_mul_ok(size_t a, size_t b, size_t *ret)
{
    return !__builtin_mul_overflow(a, b, ret);
}

static inline bool streq(const char *a, const char *b) { return strcmp(a, b) == 0; }
