/* SPDX-License-Identifier: MIT */
/* The uid pool of a pool host: uids >= base (gid = uid) that no /etc/passwd entry and no
 * process uses. A uid comes back only after its teardown was verified; otherwise it stays in
 * quarantine for the life of the host. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { UID_FREE = 0, UID_USED, UID_QUARANTINE, UID_RESERVED };

typedef struct {
    uint32_t base, count;
    uint8_t *state;     /* per uid */
    uint32_t *recycled; /* released after verified teardown: reused first */
    size_t n_recycled;
    uint32_t next_fresh; /* offset of the next never-used uid */
    size_t n_used, n_quarantined, n_reserved;
    int lock_fd; /* shared uid lock file, or -1 (see uidpool_lock_file) */
} uidpool_t;

int uidpool_init(uidpool_t *p, uint32_t base, uint32_t count);
void uidpool_done(uidpool_t *p);
/* Coordinate with other pools on this kernel (another host, a test beside a benchmark): every
 * uid in use holds an open-file-description lock on byte <uid> of this file, so a uid another
 * pool holds is never handed out here (it is reserved instead). Locks go with the process. */
int uidpool_lock_file(uidpool_t *p, const char *path);
/* Mark a uid as never to be handed out (passwd entry, live process). */
void uidpool_reserve(uidpool_t *p, uint32_t uid);
/* Reserve every uid in range named in a passwd/group-format file. */
int uidpool_reserve_from_file(uidpool_t *p, const char *path);
/* Reserve every uid in range that owns a process (real, effective or saved uid). */
int uidpool_reserve_from_proc(uidpool_t *p, const char *proc_path);
/* Take a uid: recycled ones first, then fresh. -ENOSPC when exhausted. */
int uidpool_take(uidpool_t *p, uint32_t *ret);
/* Give a uid back; verified=false puts it in quarantine. */
void uidpool_release(uidpool_t *p, uint32_t uid, bool verified);
