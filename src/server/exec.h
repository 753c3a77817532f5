/* SPDX-License-Identifier: MIT */
/* Reading a child's output pipe in UTF-8-safe pieces; shared by foreground exec and background
 * processes. */
#pragma once

#include "common/loop.h"
#include "spawn.h"

typedef struct {
    watcher_t w;
    const char *stream; /* "stdout" | "stderr" */
    utf8_carry_t carry;
    bool eof;
    bool hup;              /* hung up before the command's exit was seen: read after it (exec.c) */
    bool polled;           /* read by a timer, not watched (exec.c: bulk output) */
    bool grown;            /* its pipe made OUTPIPE_BULK_SIZE (outpipe_read) */
    uint64_t last_data_ms; /* when a read last found data */
} outpipe_t;

/* A pipe is made at the kernel's default size (64 KiB) and grown to this when a read finds it
 * full: fewer wake-ups for bulk output, and a command that writes little (most) costs no
 * resize and no larger ring to allocate and free. */
#define OUTPIPE_BULK_SIZE (1024 * 1024)
#define OUTPIPE_DEFAULT_SIZE (64 * 1024)

void outpipe_init(outpipe_t *op, int fd, const char *stream, watcher_cb cb, void *data);
/* Read once into buf (cap: the read's size + 8, room for up to 3 held UTF-8 bytes). Returns the number of bytes to emit now
 * (may be 0), -EAGAIN when nothing is there, or 0 with op->eof set at end of file (any held
 * UTF-8 bytes are then emitted). */
ssize_t outpipe_read(outpipe_t *op, unsigned char *buf, size_t cap, bool keep_carry);
void outpipe_close(loop_t *l, outpipe_t *op);
/* At its end: no longer watched, its descriptor kept for outpipe_close later (see exec.c). */
void outpipe_stop(loop_t *l, outpipe_t *op);
