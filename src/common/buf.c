/* SPDX-License-Identifier: MIT */
#include "buf.h"

#include <stdio.h>

/* Blocks of BUF_SPARE_SIZE that buffers of this thread gave back, kept for the next buffer that
 * starts (buf_keep_spares). */
static __thread struct {
    char *block[BUF_SPARES_MAX];
    unsigned n, max;
} spares;

void buf_keep_spares(unsigned n)
{
    spares.max = MIN(n, (unsigned)BUF_SPARES_MAX);
    while (spares.n > spares.max)
        free(spares.block[--spares.n]);
}

unsigned buf_spares_held(void) { return spares.n; }

/* A buffer's block goes back: to the spares if it is one of their size and there is room. */
static void block_free(char *p, size_t cap)
{
    if (p && cap == BUF_SPARE_SIZE && spares.n < spares.max)
        spares.block[spares.n++] = p;
    else
        free(p);
}

void buf_free(buf_t *b)
{
    block_free(b->data, b->cap);
    b->data = NULL;
    b->off = b->len = b->cap = 0;
}

int buf_reserve(buf_t *b, size_t extra, char **ret_space)
{
    size_t need;
    if (!size_add_ok(b->len, extra, &need) || need > b->max)
        return -ENOBUFS;
    if (b->off + need <= b->cap) {
        *ret_space = b->data + b->off + b->len;
        return 0;
    }
    if (need <= b->cap && b->off > 0) {
        memmove(b->data, b->data + b->off, b->len);
        b->off = 0;
        *ret_space = b->data + b->len;
        return 0;
    }
    size_t ncap = b->cap ? b->cap : 256;
    char *n = NULL;
    if (spares.max > 0 && b->cap == 0 && need <= BUF_SPARE_SIZE && b->max >= BUF_SPARE_SIZE) {
        ncap = BUF_SPARE_SIZE; /* a request's head, an answer: one block, no growing */
        if (spares.n > 0)
            n = spares.block[--spares.n];
    }
    while (ncap < need) {
        if (!size_mul_ok(ncap, 2, &ncap))
            return -ENOBUFS;
    }
    if (ncap > b->max && need <= b->max)
        ncap = b->max;
    if (!n)
        n = malloc(ncap);
    if (!n)
        return -ENOMEM;
    if (b->len)
        memcpy(n, b->data + b->off, b->len);
    block_free(b->data, b->cap);
    b->data = n;
    b->cap = ncap;
    b->off = 0;
    *ret_space = b->data + b->len;
    return 0;
}

int buf_append(buf_t *b, const void *p, size_t n)
{
    char *space;
    int r = buf_reserve(b, n, &space);
    if (r < 0)
        return r;
    if (n)
        memcpy(space, p, n);
    b->len += n;
    return 0;
}

int buf_printf(buf_t *b, const char *fmt, ...)
{
    va_list ap;
    /* Straight into the free space when the result fits there and within the cap: one pass. */
    size_t room = b->data ? b->cap - b->off - b->len : 0;
    if (room > 1) {
        va_start(ap, fmt);
        int n = vsnprintf(b->data + b->off + b->len, room, fmt, ap);
        va_end(ap);
        if (n < 0)
            return -EINVAL;
        if ((size_t)n < room && b->len + (size_t)n <= b->max) {
            b->len += (size_t)n;
            return 0;
        }
    }
    char small[256];
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0)
        return -EINVAL;
    if ((size_t)n < sizeof small)
        return buf_append(b, small, (size_t)n);
    /* Longer than the stack buffer: format into a temporary so that a result that exactly
     * fills the cap (no room for vsnprintf's NUL inside the buffer) is still accepted. */
    char *tmp = malloc((size_t)n + 1);
    if (!tmp)
        return -ENOMEM;
    va_start(ap, fmt);
    (void)vsnprintf(tmp, (size_t)n + 1, fmt, ap);
    va_end(ap);
    int r = buf_append(b, tmp, (size_t)n);
    free(tmp);
    return r;
}

void buf_consume(buf_t *b, size_t n)
{
    if (n >= b->len) {
        b->off = 0;
        b->len = 0;
        return;
    }
    b->off += n;
    b->len -= n;
}

void buf_shrink_if_idle(buf_t *b, size_t keep)
{
    if (b->len == 0 && b->cap > keep)
        buf_free(b);
}
