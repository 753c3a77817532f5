/* SPDX-License-Identifier: MIT */
#include "loop.h"

#include <time.h>

#include "macro.h"

struct loop {
    int epfd;
    bool stop;
    uint64_t now_ms;
    timer_t_ **heap;
    size_t n_heap, cap_heap;
    struct deferred {
        void (*fn)(void *);
        void *p;
    } * defer;
    size_t n_defer, cap_defer;
    /* The batch of events being dispatched (loop_run), so that loop_unwatch can strike out the
     * events still to come of a watcher its owner then frees. */
    struct epoll_event *batch;
    int batch_n, batch_i;
};

int loop_defer(loop_t *l, void (*fn)(void *), void *p)
{
    if (l->n_defer == l->cap_defer) {
        size_t ncap = l->cap_defer ? l->cap_defer * 2 : 64;
        struct deferred *n = realloc(l->defer, ncap * sizeof *n);
        if (!n)
            return -ENOMEM;
        l->defer = n;
        l->cap_defer = ncap;
    }
    l->defer[l->n_defer++] = (struct deferred){ fn, p };
    return 0;
}

static void run_deferred(loop_t *l)
{
    /* A deferred function may defer more; run until the list is empty. */
    for (size_t i = 0; i < l->n_defer; i++)
        l->defer[i].fn(l->defer[i].p);
    l->n_defer = 0;
}

uint64_t monotonic_ms(void)
{
    struct timespec ts;
    (void)clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

int loop_new(loop_t **ret)
{
    loop_t *l = calloc(1, sizeof *l);
    if (!l)
        return -ENOMEM;
    l->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (l->epfd < 0) {
        int r = negative_errno();
        free(l);
        return r;
    }
    l->now_ms = monotonic_ms();
    *ret = l;
    return 0;
}

loop_t *loop_free(loop_t *l)
{
    if (!l)
        return NULL;
    run_deferred(l);
    safe_close(l->epfd);
    free(l->heap);
    free(l->defer);
    free(l);
    return NULL;
}

uint64_t loop_now_ms(loop_t *l) { return l->now_ms; }

/* Read-side interest that is dropped lazily (loop_watch). EPOLLOUT is dropped at once: a
 * socket is writable nearly always, so it would only cost a wake-up and the same MOD later. */
#define LAZY_EVENTS ((uint32_t)(EPOLLIN | EPOLLRDHUP | EPOLLPRI))

int loop_watch(loop_t *l, watcher_t *w, uint32_t events)
{
    if (w->added && !(events & ~w->kernel) && !(w->kernel & ~events & ~LAZY_EVENTS)) {
        w->events = events; /* nothing to add, only read-side bits to drop: keep epoll's mask */
        return 0;
    }
    struct epoll_event ev = { .events = events, .data.ptr = w };
    if (epoll_ctl(l->epfd, w->added ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, w->fd, &ev) < 0)
        return negative_errno();
    w->added = true;
    w->events = w->kernel = events;
    return 0;
}

/* The events of w to report: those it asks for (errors and hang-ups always). Bits epoll still
 * has from a lazy drop are dropped for real now that they fire. */
static uint32_t wanted_events(loop_t *l, watcher_t *w, uint32_t got)
{
    uint32_t unasked = got & ~(w->events | EPOLLERR | EPOLLHUP);
    if (unasked) {
        struct epoll_event ev = { .events = w->events, .data.ptr = w };
        if (epoll_ctl(l->epfd, EPOLL_CTL_MOD, w->fd, &ev) == 0)
            w->kernel = w->events;
    }
    return got & ~unasked;
}

/* Always EPOLL_CTL_DEL, even when the fd is about to be closed: epoll registers the file
 * description, not the fd, and close() drops the registration only with the description's last
 * descriptor. A child holding a copy of the fd table (a posix_spawn/vfork child of another
 * thread before its exec, a fork) or a dup/SCM_RIGHTS copy keeps it alive, and epoll would go on
 * reporting the closed fd with w as its data: a use-after-free once w is freed
 * (tests/unit/test_loop.c shows it). */
void loop_unwatch(loop_t *l, watcher_t *w)
{
    if (!w->added)
        return;
    (void)epoll_ctl(l->epfd, EPOLL_CTL_DEL, w->fd, NULL);
    w->added = false;
    w->events = w->kernel = 0;
    /* An event of it later in the batch being dispatched would be read from w after this
     * callback returns, and its owner may free it now (a run retired by a request earlier in
     * the batch: ASan, heap-use-after-free in loop_run): struck out here instead. */
    for (int i = l->batch ? l->batch_i + 1 : l->batch_n; i < l->batch_n; i++)
        if (l->batch[i].data.ptr == w)
            l->batch[i].data.ptr = NULL;
}

static void heap_swap(loop_t *l, size_t a, size_t b)
{
    timer_t_ *t = l->heap[a];
    l->heap[a] = l->heap[b];
    l->heap[b] = t;
    l->heap[a]->heap_idx = a;
    l->heap[b]->heap_idx = b;
}

static void heap_up(loop_t *l, size_t i)
{
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (l->heap[p]->due_ms <= l->heap[i]->due_ms)
            break;
        heap_swap(l, p, i);
        i = p;
    }
}

static void heap_down(loop_t *l, size_t i)
{
    for (;;) {
        size_t c = 2 * i + 1, m = i;
        if (c < l->n_heap && l->heap[c]->due_ms < l->heap[m]->due_ms)
            m = c;
        if (c + 1 < l->n_heap && l->heap[c + 1]->due_ms < l->heap[m]->due_ms)
            m = c + 1;
        if (m == i)
            break;
        heap_swap(l, i, m);
        i = m;
    }
}

int timer_arm(loop_t *l, timer_t_ *t, uint64_t after_ms)
{
    if (timer_armed(t))
        timer_disarm(l, t);
    if (l->n_heap == l->cap_heap) {
        size_t ncap = l->cap_heap ? l->cap_heap * 2 : 64;
        timer_t_ **n = realloc(l->heap, ncap * sizeof *n);
        if (!n)
            return -ENOMEM;
        l->heap = n;
        l->cap_heap = ncap;
    }
    t->due_ms = monotonic_ms() + after_ms;
    t->heap_idx = l->n_heap;
    l->heap[l->n_heap++] = t;
    heap_up(l, t->heap_idx);
    return 0;
}

void timer_disarm(loop_t *l, timer_t_ *t)
{
    if (!timer_armed(t))
        return;
    size_t i = t->heap_idx;
    l->n_heap--;
    if (i != l->n_heap) {
        l->heap[i] = l->heap[l->n_heap];
        l->heap[i]->heap_idx = i;
        heap_down(l, i);
        heap_up(l, l->heap[i]->heap_idx);
    }
    t->heap_idx = SIZE_MAX;
}

static void run_timers(loop_t *l)
{
    l->now_ms = monotonic_ms();
    while (l->n_heap > 0 && l->heap[0]->due_ms <= l->now_ms) {
        timer_t_ *t = l->heap[0];
        timer_disarm(l, t);
        t->cb(l, t);
        if (l->stop)
            return;
    }
}

void loop_stop(loop_t *l) { l->stop = true; }

int loop_run(loop_t *l)
{
    struct epoll_event evs[256];
    while (!l->stop) {
        int timeout = -1;
        l->now_ms = monotonic_ms();
        if (l->n_heap > 0) {
            uint64_t due = l->heap[0]->due_ms;
            timeout = due <= l->now_ms ? 0 : (int)MIN(due - l->now_ms, 60000);
        }
        int n = epoll_wait(l->epfd, evs, (int)ELEMENTSOF(evs), timeout);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return negative_errno();
        }
        l->now_ms = monotonic_ms();
        l->batch = evs;
        l->batch_n = n;
        for (l->batch_i = 0; l->batch_i < n && !l->stop; l->batch_i++) {
            watcher_t *w = evs[l->batch_i].data.ptr;
            if (!w || !w->added) /* unwatched (and maybe freed) by an earlier callback */
                continue;
            uint32_t ev = wanted_events(l, w, evs[l->batch_i].events);
            if (ev)
                w->cb(l, w, ev);
        }
        l->batch = NULL;
        l->batch_n = 0;
        run_timers(l);
        run_deferred(l);
    }
    return 0;
}
