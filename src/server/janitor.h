/* SPDX-License-Identifier: MIT */
/* The janitor: one helper process, forked from the pool host with a file table of two
 * descriptors (its socket and the trash directory), that removes the trees handed to it, so a
 * sandbox delete costs the event loop one rename. Requests are names in the trash directory;
 * removal is the pool's own (no symlink followed, deep chains taken apart: pool.c). A janitor
 * that dies is started again at the next request and first empties what is left there. */
#pragma once

#include <stdint.h>

typedef struct server server_t;
typedef struct janitor janitor_t;

/* on_made(data, name, r): the answer to janitor_make_home(). */
typedef void (*janitor_made_cb)(void *data, const char *name, int r);

/* trash_fd: what it empties; warm_fd (-1: none): where it makes homes ahead, emptied of what an
 * earlier run left when the first janitor starts. */
int janitor_new(server_t *srv, int trash_fd, int warm_fd, janitor_made_cb on_made, void *data,
                janitor_t **ret);
/* Close the socket and kill the process: what it had not removed stays in the trash. */
janitor_t *janitor_free(janitor_t *j);
/* Queue the removal of trash/name. < 0: it cannot be queued (remove it yourself). */
int janitor_remove(janitor_t *j, const char *name);
/* Queue making warm/name: a 0700 root-owned home with .tmp, .sbx and .sbx/proxy, which a
 * create renames into the homes and hands to the sandbox uid. < 0: not queued. */
int janitor_make_home(janitor_t *j, const char *name);
/* Trees removed / that could not be removed, since start. */
void janitor_counts(const janitor_t *j, uint64_t *removed, uint64_t *failed);
