/* SPDX-License-Identifier: MIT */
/* A growable byte buffer with a hard cap. Appends beyond the cap fail with -ENOBUFS and leave
 * the buffer as it was; the caller maps that to a status (413/431/503) or to backpressure. */
#pragma once

#include <stdarg.h>
#include <stddef.h>

#include "macro.h"

typedef struct {
    char *data;
    size_t off; /* start of unread bytes */
    size_t len; /* unread bytes */
    size_t cap; /* allocated */
    size_t max; /* hard cap on len */
} buf_t;

static inline void buf_init(buf_t *b, size_t max) { *b = (buf_t){ .max = max }; }
/* Keep up to n (at most BUF_SPARES_MAX) freed blocks of BUF_SPARE_SIZE for this thread's next
 * buffers, and start every buffer of this thread at that size: for an event loop, whose
 * connections give their buffers back each time they go idle. A 4 KiB malloc is a large-chunk
 * request to glibc: it consolidates the fast bins and sorts the unsorted ones, and with the
 * heap fragmented by 10,000 live sandboxes that was most of what a create cost more than with
 * 10 (perf, bench-pool section 5). Off (0) by default; a lower n frees what it no longer
 * keeps. A buffer with a cap below BUF_SPARE_SIZE never takes a spare. */
#define BUF_SPARE_SIZE 4096
#define BUF_SPARES_MAX 64
void buf_keep_spares(unsigned n);
unsigned buf_spares_held(void); /* blocks kept now, by this thread */
void buf_free(buf_t *b);
static inline char *buf_head(const buf_t *b) { return b->data + b->off; }
/* Make room for at least `extra` more bytes; return a pointer to the free space. */
int buf_reserve(buf_t *b, size_t extra, char **ret_space);
static inline void buf_commit(buf_t *b, size_t n) { b->len += n; }
int buf_append(buf_t *b, const void *p, size_t n);
int buf_printf(buf_t *b, const char *fmt, ...) _printf_(2, 3);
void buf_consume(buf_t *b, size_t n);
static inline void buf_clear(buf_t *b)
{
    b->off = 0;
    b->len = 0;
}
/* Release memory if the buffer is empty and large (idle connections stay small). */
void buf_shrink_if_idle(buf_t *b, size_t keep);
