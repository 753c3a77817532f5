/* SPDX-License-Identifier: MIT */
/* The node's subordinate id range, cut into blocks of 65,536 ids: each run's user namespace maps
 * its ids 0..65535 onto one block, so root in a run is an unprivileged uid on the host and no two
 * runs share an id. A block is handed out again only after the run's files and processes are
 * gone (the caller releases it then). Pure bookkeeping: no system calls. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#define IDRANGE_BLOCK 65536u
#define IDRANGE_MAX_BLOCKS 65536u

typedef struct {
    uint32_t start;    /* first host id of the range (a multiple of nothing in particular) */
    uint32_t n_blocks; /* usable blocks */
    uint8_t *used;     /* per block */
    uint32_t n_used, hint;
} idrange_t;

/* "START:COUNT" (decimal). COUNT must hold at least one block; START + COUNT must stay below
 * 2^32 - 1 (the kernel's invalid id) and START must be above 0. */
int idrange_parse(const char *s, uint32_t *ret_start, uint32_t *ret_count);
/* The first "NAME:START:COUNT" line of an /etc/subuid-style file for name; -ENOENT if none. */
int idrange_from_subid_file(const char *path, const char *name, uint32_t *ret_start,
                            uint32_t *ret_count);
int idrange_init(idrange_t *r, uint32_t start, uint32_t count);
void idrange_done(idrange_t *r);
/* A free block's first host id; -ENOSPC when every block is taken. */
int idrange_take(idrange_t *r, uint32_t *ret_base);
/* Mark base as taken (a run found at restart): -EINVAL if base is not a block of the range,
 * -EEXIST if it is taken already. */
int idrange_mark(idrange_t *r, uint32_t base);
void idrange_release(idrange_t *r, uint32_t base);
bool idrange_contains(const idrange_t *r, uint32_t base);
