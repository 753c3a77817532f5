/* SPDX-License-Identifier: MIT */
#include "idrange.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"
#include "common/strutil.h"

int idrange_parse(const char *s, uint32_t *ret_start, uint32_t *ret_count)
{
    const char *colon = strchr(s, ':');
    uint64_t start, count;
    if (!colon || parse_u64(sv_make(s, (size_t)(colon - s)), UINT32_MAX, &start) < 0 ||
        parse_u64(sv_make(colon + 1, strlen(colon + 1)), UINT32_MAX, &count) < 0)
        return -EINVAL;
    if (start == 0 || count < IDRANGE_BLOCK || start + count > (uint64_t)UINT32_MAX)
        return -ERANGE;
    *ret_start = (uint32_t)start;
    *ret_count = (uint32_t)count;
    return 0;
}

static void fclosep(FILE **f)
{
    if (*f)
        fclose(*f);
}

int idrange_from_subid_file(const char *path, const char *name, uint32_t *ret_start,
                            uint32_t *ret_count)
{
    _cleanup_(fclosep) FILE *f = fopen(path, "re");
    if (!f)
        return negative_errno();
    char line[256];
    size_t nl = strlen(name);
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (strncmp(line, name, nl) != 0 || line[nl] != ':')
            continue;
        return idrange_parse(line + nl + 1, ret_start, ret_count);
    }
    return -ENOENT;
}

int idrange_init(idrange_t *r, uint32_t start, uint32_t count)
{
    *r = (idrange_t){ 0 };
    if (start == 0 || count < IDRANGE_BLOCK || (uint64_t)start + count > (uint64_t)UINT32_MAX)
        return -ERANGE;
    uint32_t n = count / IDRANGE_BLOCK;
    if (n > IDRANGE_MAX_BLOCKS)
        n = IDRANGE_MAX_BLOCKS;
    r->used = calloc(n, 1);
    if (!r->used)
        return -ENOMEM;
    r->start = start;
    r->n_blocks = n;
    return 0;
}

void idrange_done(idrange_t *r)
{
    free(r->used);
    *r = (idrange_t){ 0 };
}

static int block_of(const idrange_t *r, uint32_t base, uint32_t *ret)
{
    if (base < r->start || (base - r->start) % IDRANGE_BLOCK != 0)
        return -EINVAL;
    uint32_t b = (base - r->start) / IDRANGE_BLOCK;
    if (b >= r->n_blocks)
        return -EINVAL;
    *ret = b;
    return 0;
}

bool idrange_contains(const idrange_t *r, uint32_t base)
{
    uint32_t b;
    return block_of(r, base, &b) == 0;
}

int idrange_take(idrange_t *r, uint32_t *ret_base)
{
    if (r->n_used >= r->n_blocks)
        return -ENOSPC;
    /* round robin from the last block handed out: a just-released block is reused last */
    for (uint32_t i = 0; i < r->n_blocks; i++) {
        uint32_t b = (r->hint + i) % r->n_blocks;
        if (r->used[b])
            continue;
        r->used[b] = 1;
        r->n_used++;
        r->hint = (b + 1) % r->n_blocks;
        *ret_base = r->start + b * IDRANGE_BLOCK;
        return 0;
    }
    return -ENOSPC;
}

int idrange_mark(idrange_t *r, uint32_t base)
{
    uint32_t b;
    int rc = block_of(r, base, &b);
    if (rc < 0)
        return rc;
    if (r->used[b])
        return -EEXIST;
    r->used[b] = 1;
    r->n_used++;
    return 0;
}

void idrange_release(idrange_t *r, uint32_t base)
{
    uint32_t b;
    if (block_of(r, base, &b) < 0 || !r->used[b])
        return;
    r->used[b] = 0;
    r->n_used--;
}
