/* SPDX-License-Identifier: MIT */
/* A daemon's signals and children: SIGTERM and SIGINT stop the loop, SIGCHLD reaps. Owners
 * register the children they started (child_t) and hear of each one's exit exactly once. Like
 * sd-event's child sources: the loop's business, not the HTTP core's or any handler's. */
#pragma once

#include <stdbool.h>
#include <sys/types.h>

#include "common/loop.h"

typedef struct child child_t;
struct child {
    pid_t pid;
    void (*on_exit)(child_t *ch, int wstatus);
    void *data;
    child_t *next;
};

typedef struct reaper reaper_t;
struct reaper {
    loop_t *loop;
    int sig_fd;
    watcher_t sig_w;
    child_t *children;
    /* waitpid() only the registered children (other threads wait for their own: sbx-node's
     * install threads); otherwise every exited child is reaped */
    bool registered_only;
    /* An exited child nobody registered (when not registered_only): a re-parented orphan, or
     * a child whose owner registers it later (sbx-server's spawn helpers). May be NULL. */
    void (*on_stray)(void *data, pid_t pid, int wstatus);
    void *stray_data;
};

/* Block SIGCHLD, SIGTERM and SIGINT and take them from a signalfd watched on l; become the
 * subreaper of orphaned descendants. r must be zeroed or reaper_done()'d before. -errno. */
int reaper_init(reaper_t *r, loop_t *l);
void reaper_done(reaper_t *r);
void reaper_add(reaper_t *r, child_t *ch);
void reaper_remove(reaper_t *r, child_t *ch);
/* Reap every exited child now (normally done on SIGCHLD); owners hear of their children. */
void reaper_reap(reaper_t *r);
