/* SPDX-License-Identifier: MIT */
/* A small epoll event loop: fd watchers and one-shot timers (binary heap). Single-threaded. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/epoll.h>

typedef struct loop loop_t;
typedef struct watcher watcher_t;
typedef struct timer timer_t_;

typedef void (*watcher_cb)(loop_t *l, watcher_t *w, uint32_t events);
typedef void (*timer_cb)(loop_t *l, timer_t_ *t);

struct watcher {
    int fd;
    uint32_t events; /* the mask asked for (0 = registered but paused) */
    uint32_t kernel; /* the mask epoll has: events plus read-side bits not dropped yet */
    bool added;
    watcher_cb cb;
    void *data;
};

struct timer {
    uint64_t due_ms; /* monotonic */
    size_t heap_idx; /* SIZE_MAX when not armed */
    timer_cb cb;
    void *data;
};

int loop_new(loop_t **ret);
loop_t *loop_free(loop_t *l);
uint64_t loop_now_ms(loop_t *l); /* cached at each iteration */
uint64_t monotonic_ms(void);

static inline void watcher_init(watcher_t *w, int fd, watcher_cb cb, void *data)
{
    *w = (watcher_t){ .fd = fd, .cb = cb, .data = data };
}
/* Register or change the interest mask; events 0 keeps the fd registered but silent. Only the
 * events asked for reach the callback. Dropping read-side interest (EPOLLIN, EPOLLRDHUP) is
 * lazy: epoll keeps it until it reports such an event unasked (then one EPOLL_CTL_MOD), so a
 * connection that stops reading while it answers and reads again afterwards costs no system
 * call when its peer sent nothing meanwhile. */
int loop_watch(loop_t *l, watcher_t *w, uint32_t events);
/* Deregister. An event of w still to come in the batch being dispatched is dropped, so the
 * caller may free w at once (tested: a watcher freed by an earlier callback of its batch). */
void loop_unwatch(loop_t *l, watcher_t *w);

static inline void timer_init(timer_t_ *t, timer_cb cb, void *data)
{
    *t = (timer_t_){ .heap_idx = SIZE_MAX, .cb = cb, .data = data };
}
int timer_arm(loop_t *l, timer_t_ *t, uint64_t after_ms);
void timer_disarm(loop_t *l, timer_t_ *t);
static inline bool timer_armed(const timer_t_ *t) { return t->heap_idx != SIZE_MAX; }

/* Run fn(p) after the current batch of events and timers: objects that own watchers are
 * freed this way, so an event already fetched for them never reaches freed memory. If the
 * deferral itself cannot be recorded (-ENOMEM), fn runs at once. */
int loop_defer(loop_t *l, void (*fn)(void *), void *p);

/* Run until loop_stop(); returns 0 or -errno. */
int loop_run(loop_t *l);
void loop_stop(loop_t *l);
