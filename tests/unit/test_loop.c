/* SPDX-License-Identifier: MIT */
/* The epoll loop's timers (src/common/loop.c): due order, disarm, re-arm, arming from a
 * callback, deferred calls, and an fd watcher. Every run has a guard timer so a bug cannot
 * hang the test. */
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/loop.h"
#include "common/macro.h"
#include "tap.h"

#define N_MANY 200

typedef struct {
    timer_t_ t;
    int id;
    uint64_t due;   /* due_ms when it was armed */
    uint64_t fired; /* monotonic_ms() when it fired, 0 if never */
} probe_t;

typedef struct {
    int order[N_MANY + 8];
    size_t n;
    bool guard_fired;
    probe_t *rearm; /* re-armed from inside a callback, once */
    int deferred_seen_by;
} log_t;

static log_t logbook;

static void on_probe(loop_t *l, timer_t_ *t)
{
    probe_t *p = t->data;
    p->fired = monotonic_ms();
    if (logbook.n < ELEMENTSOF(logbook.order))
        logbook.order[logbook.n++] = p->id;
    if (logbook.rearm == p) {
        logbook.rearm = NULL;
        (void)timer_arm(l, &p->t, 10);
        p->id += 1000; /* its second firing is recorded as id + 1000 */
    }
}

static void on_stop(loop_t *l, timer_t_ *t)
{
    (void)t;
    loop_stop(l);
}

static void on_guard(loop_t *l, timer_t_ *t)
{
    (void)t;
    logbook.guard_fired = true;
    loop_stop(l);
}

static void arm_probe(loop_t *l, probe_t *p, int id, uint64_t after)
{
    timer_init(&p->t, on_probe, p);
    p->id = id;
    p->fired = 0;
    if (timer_arm(l, &p->t, after) < 0)
        abort();
    p->due = p->t.due_ms;
}

/* Run the loop until a stop timer at stop_after fires; a 5 s guard ends a hang. */
static int run_for(loop_t *l, uint64_t stop_after)
{
    timer_t_ stop, guard;
    timer_init(&stop, on_stop, NULL);
    timer_init(&guard, on_guard, NULL);
    if (timer_arm(l, &stop, stop_after) < 0 || timer_arm(l, &guard, 5000) < 0)
        abort();
    int r = loop_run(l);
    timer_disarm(l, &stop);
    timer_disarm(l, &guard);
    return r;
}

TEST(timers_fire_in_due_order)
{
    loop_t *l = NULL;
    probe_t p[5];
    logbook = (log_t){ 0 };
    ASSERT_EQ(loop_new(&l), 0);
    arm_probe(l, &p[0], 0, 30);
    arm_probe(l, &p[1], 1, 10);
    arm_probe(l, &p[2], 2, 20);
    arm_probe(l, &p[3], 3, 0);
    arm_probe(l, &p[4], 4, 40);
    ASSERT_TRUE(timer_armed(&p[2].t));
    int r = run_for(l, 60);
    loop_free(l);
    ASSERT_EQ(r, 0);
    ASSERT_FALSE(logbook.guard_fired);
    ASSERT_EQ_U(logbook.n, 5);
    ASSERT_EQ(logbook.order[0], 3);
    ASSERT_EQ(logbook.order[1], 1);
    ASSERT_EQ(logbook.order[2], 2);
    ASSERT_EQ(logbook.order[3], 0);
    ASSERT_EQ(logbook.order[4], 4);
    for (size_t i = 0; i < 5; i++) {
        ASSERT_GE(p[i].fired, p[i].due); /* never early */
        ASSERT_FALSE(timer_armed(&p[i].t));
    }
}

TEST(disarm_and_rearm)
{
    loop_t *l = NULL;
    probe_t p[4];
    logbook = (log_t){ 0 };
    ASSERT_EQ(loop_new(&l), 0);
    arm_probe(l, &p[0], 0, 5);
    arm_probe(l, &p[1], 1, 10);
    arm_probe(l, &p[2], 2, 15);
    arm_probe(l, &p[3], 3, 20);
    timer_disarm(l, &p[1].t); /* never fires */
    timer_disarm(l, &p[1].t); /* twice is harmless */
    ASSERT_FALSE(timer_armed(&p[1].t));
    ASSERT_EQ(timer_arm(l, &p[0].t, 60), 0); /* moved to the end */
    p[0].due = p[0].t.due_ms;
    logbook.rearm = &p[2]; /* fires at 15, then again 10 ms later */
    int r = run_for(l, 100);
    loop_free(l);
    ASSERT_EQ(r, 0);
    ASSERT_EQ_U(logbook.n, 4);
    ASSERT_EQ(logbook.order[0], 2);
    ASSERT_EQ(logbook.order[1], 3);
    ASSERT_EQ(logbook.order[2], 1002); /* p[2] again at >= 25 ms... */
    ASSERT_EQ(logbook.order[3], 0);    /* ...before the moved p[0] at 60 ms */
    ASSERT_EQ_U(p[1].fired, 0);
}

/* A simple xorshift so the test is reproducible. */
static uint32_t rnd(uint32_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

TEST(many_timers_keep_heap_order)
{
    loop_t *l = NULL;
    static probe_t p[N_MANY];
    bool disarmed[N_MANY] = { false };
    uint32_t seed = 12345;
    logbook = (log_t){ 0 };
    ASSERT_EQ(loop_new(&l), 0);
    for (int i = 0; i < N_MANY; i++)
        arm_probe(l, &p[i], i, rnd(&seed) % 25);
    size_t expect = N_MANY;
    for (int i = 0; i < N_MANY; i++)
        if (rnd(&seed) % 3 == 0) {
            timer_disarm(l, &p[i].t);
            disarmed[i] = true;
            expect--;
        }
    int r = run_for(l, 50);
    loop_free(l);
    ASSERT_EQ(r, 0);
    ASSERT_FALSE(logbook.guard_fired);
    ASSERT_EQ_U(logbook.n, expect);
    for (size_t k = 0; k < logbook.n; k++) {
        int id = logbook.order[k];
        ASSERT_FALSE(disarmed[id]);
        if (k > 0)
            ASSERT_LE(p[logbook.order[k - 1]].due, p[id].due); /* non-decreasing due times */
    }
}

static void deferred(void *p)
{
    int *v = p;
    logbook.deferred_seen_by = (int)logbook.n; /* how many timers had fired by then */
    (*v)++;
}

static void on_probe_defer(loop_t *l, timer_t_ *t)
{
    static int count;
    on_probe(l, t);
    (void)loop_defer(l, deferred, &count);
    probe_t *p = t->data;
    p->due = (uint64_t)count; /* reuse: the deferred count seen while this timer ran */
}

TEST(deferred_calls_run_after_the_batch)
{
    loop_t *l = NULL;
    probe_t p[2];
    logbook = (log_t){ 0 };
    ASSERT_EQ(loop_new(&l), 0);
    arm_probe(l, &p[0], 0, 0);
    arm_probe(l, &p[1], 1, 0);
    p[0].t.cb = on_probe_defer;
    p[1].t.cb = on_probe_defer;
    int r = run_for(l, 20);
    loop_free(l);
    ASSERT_EQ(r, 0);
    ASSERT_EQ_U(logbook.n, 2);
    ASSERT_EQ_U(p[0].due, 0); /* nothing deferred had run yet */
    ASSERT_EQ_U(p[1].due, 0); /* both timers of the batch ran first */
    ASSERT_EQ(logbook.deferred_seen_by, 2);
}

typedef struct {
    watcher_t w;
    char got[8];
    size_t n;
} reader_t;

static void on_readable(loop_t *l, watcher_t *w, uint32_t events)
{
    reader_t *rd = w->data;
    if (events & EPOLLIN) {
        ssize_t k = read(w->fd, rd->got + rd->n, sizeof rd->got - rd->n);
        if (k > 0)
            rd->n += (size_t)k;
    }
    if (rd->n >= 3)
        loop_stop(l);
}

static void on_write_later(loop_t *l, timer_t_ *t)
{
    int *fd = t->data;
    (void)l;
    if (write(*fd, "abc", 3) != 3)
        abort();
}

TEST(fd_watcher_sees_data)
{
    loop_t *l = NULL;
    int p[2];
    reader_t rd = { .n = 0 };
    timer_t_ writer, guard;
    logbook = (log_t){ 0 };
    ASSERT_EQ(pipe2(p, O_CLOEXEC | O_NONBLOCK), 0);
    ASSERT_EQ(loop_new(&l), 0);
    watcher_init(&rd.w, p[0], on_readable, &rd);
    ASSERT_EQ(loop_watch(l, &rd.w, EPOLLIN), 0);
    timer_init(&writer, on_write_later, &p[1]);
    timer_init(&guard, on_guard, NULL);
    ASSERT_EQ(timer_arm(l, &writer, 5), 0);
    ASSERT_EQ(timer_arm(l, &guard, 5000), 0);
    int r = loop_run(l);
    timer_disarm(l, &guard);
    loop_unwatch(l, &rd.w);
    loop_free(l);
    close(p[0]);
    close(p[1]);
    ASSERT_EQ(r, 0);
    ASSERT_FALSE(logbook.guard_fired);
    ASSERT_MEMEQ(rd.got, rd.n, "abc", 3);
}

typedef struct {
    watcher_t w;
    uint32_t seen; /* every event mask reported, or'ed */
    int calls;
    int calls_before;       /* calls when read interest was asked for again */
    uint32_t kernel_before; /* epoll's mask then */
    uint32_t kernel_after;  /* and right after asking */
} counter_t;

static void on_count(loop_t *l, watcher_t *w, uint32_t ev)
{
    counter_t *c = w->data;
    (void)l;
    c->seen |= ev;
    c->calls++;
}

static void on_ask_again(loop_t *l, timer_t_ *t)
{
    counter_t *c = t->data;
    c->calls_before = c->calls;
    c->kernel_before = c->w.kernel;
    if (loop_watch(l, &c->w, EPOLLIN | EPOLLRDHUP) < 0)
        abort();
    c->kernel_after = c->w.kernel;
}

/* Dropping read interest is lazy (no system call until an unasked event fires), yet the callback
 * never sees an event it did not ask for, and asking again needs no system call either. */
TEST(dropped_read_interest_is_lazy_and_never_reported)
{
    loop_t *l = NULL;
    int sv[2];
    counter_t c = { .calls = 0 };
    timer_t_ again, stop;
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv), 0);
    ASSERT_EQ(loop_new(&l), 0);
    timer_init(&again, on_ask_again, &c);
    timer_init(&stop, on_stop, NULL);
    watcher_init(&c.w, sv[0], on_count, &c);
    ASSERT_EQ(loop_watch(l, &c.w, EPOLLIN | EPOLLRDHUP), 0);
    ASSERT_EQ(loop_watch(l, &c.w, EPOLLRDHUP), 0);
    ASSERT_EQ_U(c.w.events, EPOLLRDHUP);
    ASSERT_EQ_U(c.w.kernel, EPOLLIN | EPOLLRDHUP); /* epoll still has EPOLLIN */
    ASSERT_EQ(write(sv[1], "x", 1), 1);
    ASSERT_EQ(timer_arm(l, &again, 30), 0);
    ASSERT_EQ(timer_arm(l, &stop, 60), 0);
    ASSERT_EQ(loop_run(l), 0);
    ASSERT_EQ(c.calls_before, 0);             /* the unasked EPOLLIN was not reported ... */
    ASSERT_EQ_U(c.kernel_before, EPOLLRDHUP); /* ... and dropped from epoll when it fired */
    ASSERT_EQ_U(c.kernel_after, EPOLLIN | EPOLLRDHUP);
    ASSERT_TRUE(c.calls > 0); /* positive control: asked again, the waiting byte is reported */
    ASSERT_TRUE((c.seen & EPOLLIN) != 0);
    /* EPOLLOUT is dropped at once: a writable socket would wake the loop for nothing */
    ASSERT_EQ(loop_watch(l, &c.w, EPOLLIN | EPOLLOUT), 0);
    ASSERT_EQ(loop_watch(l, &c.w, EPOLLIN), 0);
    ASSERT_EQ_U(c.w.kernel, EPOLLIN);
    loop_unwatch(l, &c.w);
    loop_free(l);
    close(sv[0]);
    close(sv[1]);
}

/* Why loop_unwatch() does EPOLL_CTL_DEL before the fd is closed, and why skipping it (relying on
 * close() to drop the registration) was a use-after-free: epoll registers a *file description*,
 * and close() removes it only when the last descriptor of that description goes. A child that
 * holds a copy of the fd table (fork, or a posix_spawn/vfork child of another thread before its
 * exec closes the CLOEXEC fds; also a dup or SCM_RIGHTS copy) keeps the description alive, and
 * epoll goes on reporting events for the closed fd with the old data.ptr: a freed watcher. */
static pid_t hold_fds_in_a_child(int *ret_release)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) { /* holds a copy of every fd until the parent closes p[1] */
        char c;
        close(p[1]);
        (void)!read(p[0], &c, 1);
        _exit(0);
    }
    close(p[0]);
    *ret_release = p[1];
    return pid;
}

static bool stale_event;
static void on_stale(loop_t *l, watcher_t *w, uint32_t ev)
{
    (void)w;
    (void)ev;
    stale_event = true;
    loop_stop(l);
}

TEST(a_closed_fd_shared_with_a_child_stays_registered_unless_deleted_first)
{
    static int stale_marker, our_marker;
    int ep = epoll_create1(EPOLL_CLOEXEC);
    ASSERT_TRUE(ep >= 0);
    struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &stale_marker }, got[4];
    /* the cause: closed without EPOLL_CTL_DEL while a child holds the description */
    int sv[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    ASSERT_EQ(epoll_ctl(ep, EPOLL_CTL_ADD, sv[0], &ev), 0);
    int release;
    pid_t child = hold_fds_in_a_child(&release);
    ASSERT_TRUE(child > 0);
    close(sv[0]); /* no EPOLL_CTL_DEL */
    ASSERT_EQ(write(sv[1], "x", 1), 1);
    int n = epoll_wait(ep, got, 4, 200);
    ASSERT_EQ(n, 1);                               /* an event for a closed fd ... */
    ASSERT_TRUE(got[0].data.ptr == &stale_marker); /* ... carrying the freed watcher */
    close(release);
    ASSERT_EQ(waitpid(child, NULL, 0), child);
    ASSERT_EQ(epoll_wait(ep, got, 4, 50), 0); /* the child's exit dropped the description */
    close(sv[1]);
    /* what the loop does: delete, then close; the child holding the description is harmless */
    loop_t *l = NULL;
    ASSERT_EQ(loop_new(&l), 0);
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    watcher_t w;
    watcher_init(&w, sv[0], on_stale, &our_marker);
    ASSERT_EQ(loop_watch(l, &w, EPOLLIN), 0);
    child = hold_fds_in_a_child(&release);
    ASSERT_TRUE(child > 0);
    loop_unwatch(l, &w);
    close(sv[0]);
    ASSERT_EQ(write(sv[1], "x", 1), 1);
    timer_t_ stop;
    timer_init(&stop, on_stop, NULL);
    ASSERT_EQ(timer_arm(l, &stop, 200), 0);
    stale_event = false;
    ASSERT_EQ(loop_run(l), 0);
    ASSERT_FALSE(stale_event); /* nothing reported for the closed fd */
    close(release);
    ASSERT_EQ(waitpid(child, NULL, 0), child);
    close(sv[1]);
    loop_free(l);
    close(ep);
}

/* Two watchers with events in the same batch; whichever is called first unwatches and frees
 * the other (a node retiring a run whose output watcher is ready too): the other's event is
 * never delivered, and nothing reads the freed watcher (ASan build: heap-use-after-free in
 * loop_run before the batch's events were struck out). */
typedef struct {
    watcher_t w;
    int *calls;
    void **other; /* the other one's slot, freed and cleared by the first callback */
} pair_half_t;

static void on_free_other(loop_t *l, watcher_t *w, uint32_t ev)
{
    pair_half_t *h = w->data;
    (void)ev;
    (*h->calls)++;
    pair_half_t *o = *h->other;
    if (o) {
        loop_unwatch(l, &o->w);
        free(o);
        *h->other = NULL;
    }
    loop_unwatch(l, w); /* the batch goes on: the other's event comes next */
}

TEST(a_watcher_freed_by_an_earlier_callback_of_its_batch_is_never_called)
{
    loop_t *l = NULL;
    int a[2], b[2], calls = 0;
    void *slot[2];
    ASSERT_EQ(pipe2(a, O_CLOEXEC | O_NONBLOCK), 0);
    ASSERT_EQ(pipe2(b, O_CLOEXEC | O_NONBLOCK), 0);
    ASSERT_EQ(write(a[1], "x", 1), 1);
    ASSERT_EQ(write(b[1], "y", 1), 1); /* both readable before the loop asks: one batch */
    ASSERT_EQ(loop_new(&l), 0);
    for (int i = 0; i < 2; i++) {
        pair_half_t *h = calloc(1, sizeof *h);
        ASSERT_TRUE(h != NULL);
        *h = (pair_half_t){ .calls = &calls, .other = &slot[1 - i] };
        slot[i] = h;
        watcher_init(&h->w, i == 0 ? a[0] : b[0], on_free_other, h);
        ASSERT_EQ(loop_watch(l, &h->w, EPOLLIN), 0);
    }
    timer_t_ stop;
    timer_init(&stop, on_stop, NULL);
    ASSERT_EQ(timer_arm(l, &stop, 50), 0); /* after the batch */
    ASSERT_EQ(loop_run(l), 0);
    ASSERT_EQ(calls, 1);
    free(slot[0] ? slot[0] : slot[1]); /* the one that was called */
    loop_free(l);
    for (int i = 0; i < 2; i++) {
        close(a[i]);
        close(b[i]);
    }
}

TAP_MAIN(T(timers_fire_in_due_order), T(disarm_and_rearm), T(many_timers_keep_heap_order),
         T(deferred_calls_run_after_the_batch), T(fd_watcher_sees_data),
         T(dropped_read_interest_is_lazy_and_never_reported),
         T(a_closed_fd_shared_with_a_child_stays_registered_unless_deleted_first),
         T(a_watcher_freed_by_an_earlier_callback_of_its_batch_is_never_called))
