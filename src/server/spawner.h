/* SPDX-License-Identifier: MIT */
/* Process creation off the event loop: a few spawn helpers (about one per core), each a process
 * forked from the server with a file table of five descriptors, that take a spawn request over
 * a SOCK_SEQPACKET socket (the stdio pipes, the sandbox's namespace, ruleset and cgroup
 * descriptors passed with SCM_RIGHTS), run the same clone(CLONE_VM|CLONE_VFORK) + confine steps
 * the server used to run itself (src/isolation/confine.c, in the same order), and answer with
 * the pid and a pidfd. In host mode each helper installs the pool's seccomp filter in itself
 * at its start, so every child it starts inherits it (one compile per helper, not one per
 * command); a helper whose install failed refuses confined requests. The child is started with CLONE_PARENT: the server is its
 * parent, reaps it and signals its process group exactly as before.
 *
 * Fail closed: a request a helper cannot take, or that was in flight on a helper that died,
 * fails with a clear error and nothing runs in its place (no in-process fallback); the slot gets
 * a fresh helper at the next request. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "isolation/confine.h"
#include "spawn.h"

typedef struct server server_t;
typedef struct sandbox sandbox_t;
typedef struct spawner spawner_t;

#define SPAWNER_MAX_HELPERS 16

enum {
    SPAWN_PLAIN = 1,    /* dedicated mode: the command runs as the server (posix_spawn steps) */
    SPAWN_CONFINED = 2, /* host mode: confine_child as the sandbox's uid */
};

/* The answer to one request, never called from inside spawner_submit(): r < 0 when nothing was
 * started (err says why, naming the confinement step that failed). kill_fd, events_fd:
 * cgroup.kill and cgroup.events of the command's group, when the helper made or opened them
 * (the callback owns them; a kept group's come back even when nothing started), or -1. */
typedef void (*spawner_cb)(void *data, int r, pid_t pid, int kill_fd, int events_fd,
                           const char *err);

/* Start the helpers (count: online CPUs, 1..SPAWNER_MAX_HELPERS). */
int spawner_new(server_t *srv, spawner_t **ret);
/* Fail what is queued or in flight, close the sockets (the helpers exit on EOF). */
spawner_t *spawner_free(spawner_t *sp);

/* Queue one spawn. spec's strings and fds are read now;
 * stdio, namespace, ruleset and cgroup descriptors must stay open until the callback (the
 * caller owns them), except owned[]: descriptors handed over, closed once sent (or at
 * failure). cmdcg (may be NULL): the command's own cgroup2 group, made by the helper and
 * joined by the child after spec's groups. A confined spawn for sandbox sb counts in
 * sb->spawning until it is answered. */
int spawner_submit(spawner_t *sp, int kind, const confine_spec_t *spec, const cmdcg_req_t *cmdcg,
                   const int *owned, int n_owned, sandbox_t *sb, spawner_cb cb, void *data);
/* Sandbox sb is being deleted: fail its queued requests now and wait (blocking, bounded) for
 * the answers to those already sent, so nothing of it can start after its teardown. */
void spawner_settle_sandbox(spawner_t *sp, sandbox_t *sb);
/* server_reap() found an exit of a pid it does not know: a child a helper started whose answer
 * has not been read yet? Kept (bounded) while requests are in flight; true when kept. */
bool spawner_stash_exit(spawner_t *sp, pid_t pid, int wstatus);
/* The helpers' pids (tests, health): n written, at most cap. */
size_t spawner_helper_pids(const spawner_t *sp, pid_t *pids, size_t cap);
size_t spawner_helper_count(const spawner_t *sp);
