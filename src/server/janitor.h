/* SPDX-License-Identifier: MIT */
/* The janitor: one helper process, forked from the pool host with a small file table (its
 * socket, the trash and warm directories), that makes homes and network namespaces ahead and
 * checks deleted sandboxes' namespaces, and removes the trees handed to it through its own
 * child, the remover (which answers on the same socket), so a sandbox delete costs the event
 * loop one rename. Requests are names in the trash directory; removal is the pool's own (no
 * symlink followed, deep chains taken apart: pool.c). A janitor that dies (its remover with
 * it) is started again at the next request and first empties what is left there. */
#pragma once

#include <stdint.h>

typedef struct server server_t;
typedef struct janitor janitor_t;

/* on_made(data, name, r): the answer to janitor_make_home(). */
typedef void (*janitor_made_cb)(void *data, const char *name, int r);
/* on_netns(data, op, fd, r): the answer to janitor_netns_make() or janitor_netns_check() (op
 * tells which: JANITOR_NETNS_MADE / JANITOR_NETNS_CHECKED): a namespace to keep (fd >= 0, r 0),
 * or none (fd -1, r < 0: not made, or not pristine and closed). -EPIPE for each one asked of
 * a janitor that died. */
typedef void (*janitor_netns_cb)(void *data, int op, int fd, int r);
#define JANITOR_NETNS_MADE 3
#define JANITOR_NETNS_CHECKED 4

/* trash_fd: what it empties; warm_fd (-1: none): where it makes homes ahead, emptied of what an
 * earlier run left when the first janitor starts. */
int janitor_new(server_t *srv, int trash_fd, int warm_fd, janitor_made_cb on_made,
                janitor_netns_cb on_netns, void *data, janitor_t **ret);
/* Close the socket and kill the process: what it had not removed stays in the trash. */
janitor_t *janitor_free(janitor_t *j);
/* Queue the removal of trash/name. < 0: it cannot be queued (remove it yourself). */
int janitor_remove(janitor_t *j, const char *name);
/* Queue making warm/name: a 0700 home with .tmp, .sbx and .sbx/proxy, owned by uid (gid
 * alike), which a create renames into the homes for a sandbox of that uid (the warm directory
 * is root's 0700: nothing of the uid reaches it there). < 0: not queued. */
int janitor_make_home(janitor_t *j, const char *name, uint32_t uid);
/* Queue the removal of trash/name where a warm home named to, owned by uid (the deleted
 * sandbox's, its teardown verified), is wanted: the janitor removes the old home and makes
 * warm/to fresh. Never the old directories handed on: a sibling may hold descriptors or inotify
 * watches on them. Answered through on_made(to): r 0 made, < 0 none. < 0: not queued (remove it
 * yourself). */
int janitor_recycle_home(janitor_t *j, const char *name, const char *to, uint32_t uid);
/* Queue making a network namespace (netns_make, off the loop). < 0: not queued. */
int janitor_netns_make(janitor_t *j);
/* Queue the check of a deleted sandbox's network namespace (a copy of netns_fd travels; the
 * caller closes its own): answered with the namespace when it is as pristine as a fresh one
 * (netns_pristine), so the next sandbox may have it without the ~0.7 ms of CPU that making
 * and tearing down one costs the kernel. < 0: not queued. */
int janitor_netns_check(janitor_t *j, int netns_fd);
/* Trees removed / that could not be removed, since start. */
void janitor_counts(const janitor_t *j, uint64_t *removed, uint64_t *failed);
