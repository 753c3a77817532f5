/* SPDX-License-Identifier: MIT */
/* Worker threads for API calls that must wait on other machines (the pool service: booting a
 * pool host, asking its agent for sandboxes). The loop thread hands a task over and goes on
 * serving; a worker runs it with blocking calls and its own store handle; the answer comes back
 * to the loop through an eventfd, and is written only if the client is still there.
 *
 * A task that waits (an E2B create until its sandbox runs: up to two minutes) asks to run again
 * later (again_ms) instead of sleeping on its worker, one owner (namespace) has at most
 * WORK_PER_OWNER_MAX tasks at once and holds at most half the workers at a time (a tenant's
 * creates on a full platform held every worker for two minutes: a red-team pass).
 *
 * Only the loop thread touches a task's connection: a client that leaves clears task->conn (its
 * handler's on_close) and sets task->gone, which the task sees; the finished task is then just
 * freed. */
#include <sodium.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/log.h"
#include "control.h"

#define WORKERS 8
#define WORK_QUEUE_MAX 256
#define WORKERS_PER_OWNER (WORKERS / 2) /* the workers one owner's tasks may hold at once */

struct work_task {
    struct work_task *next;
    struct work_task *all_next; /* every task of the queue's (under its lock) */
    conn_t *conn;               /* the loop thread's; NULL once the client left */
    atomic_bool gone;           /* the client left (set by the loop, read by workers) */
    uint64_t due_ms;            /* not run before (a task that waits: again_ms) */
    bool running;               /* on a worker now */
    char owner[64];
    work_fn fn;
    void *arg;
    void (*free_arg)(void *);
    work_result_t res;
};

struct work_queue {
    control_t *ctl;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    work_task_t *todo, **todo_tail, *done;
    work_task_t *all; /* every task not yet answered */
    bool stopping;
    pthread_t threads[WORKERS];
    int n_threads;
    watcher_t w; /* the eventfd: finished tasks */
};

static void task_free(work_task_t *t)
{
    if (t->free_arg)
        t->free_arg(t->arg);
    json_decref(t->res.json);
    free(t);
}

static void task_on_close(conn_t *c, bool aborted)
{
    work_task_t *t = c->hdata;
    (void)aborted;
    t->conn = NULL;
    atomic_store(&t->gone, true);
}

static size_t owner_running(const work_queue_t *q, const char *owner)
{
    size_t n = 0;
    for (const work_task_t *o = q->all; o; o = o->all_next)
        n += o->running && streq(o->owner, owner);
    return n;
}

/* The first task due now whose owner holds fewer than WORKERS_PER_OWNER workers, taken off the
 * list and marked running; else NULL with *ret_wait_ms the time until the next is due (-1:
 * none due later: wait for a signal). Under the lock. */
static work_task_t *todo_take(work_queue_t *q, uint64_t now, int64_t *ret_wait_ms)
{
    *ret_wait_ms = -1;
    for (work_task_t **pp = &q->todo, *prev = NULL; *pp; prev = *pp, pp = &(*pp)->next) {
        work_task_t *t = *pp;
        if (t->due_ms <= now && owner_running(q, t->owner) >= WORKERS_PER_OWNER)
            continue; /* its owner's others finish first (they signal) */
        if (t->due_ms <= now) {
            t->running = true;
            *pp = t->next;
            if (!*pp)
                q->todo_tail = prev ? &prev->next : &q->todo;
            t->next = NULL;
            return t;
        }
        int64_t w = (int64_t)(t->due_ms - now);
        if (*ret_wait_ms < 0 || w < *ret_wait_ms)
            *ret_wait_ms = w;
    }
    return NULL;
}

static void todo_append(work_queue_t *q, work_task_t *t)
{
    t->next = NULL;
    *q->todo_tail = t;
    q->todo_tail = &t->next;
}
static const handler_ops_t task_ops = { .on_close = task_on_close };

int worker_keys(worker_t *w)
{
    uint64_t now = monotonic_ms();
    if (w->kr_ms && now - w->kr_ms < 1000)
        return 0;
    int r = keys_load(w->st, &w->ctl->seal, &w->kr);
    if (r >= 0)
        w->kr_ms = now;
    return r;
}

static void *worker_main(void *p)
{
    work_queue_t *q = p;
    worker_t w = { .ctl = q->ctl };
    char path[PATH_MAX + 16];
    (void)snprintf(path, sizeof path, "%s/store.db", q->ctl->cfg.state_dir);
    int r = store_open_sqlite(path, &w.st);
    if (r < 0)
        log_error("worker: store %s: %s", path, strerror(-r));
    for (;;) {
        pthread_mutex_lock(&q->lock);
        work_task_t *t = NULL;
        while (!q->stopping) {
            int64_t wait_ms;
            t = todo_take(q, monotonic_ms(), &wait_ms);
            if (t)
                break;
            if (wait_ms < 0) {
                pthread_cond_wait(&q->cond, &q->lock);
                continue;
            }
            struct timespec ts;
            (void)clock_gettime(CLOCK_MONOTONIC, &ts);
            uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)wait_ms * 1000000u;
            ts.tv_sec += (time_t)(ns / 1000000000u);
            ts.tv_nsec = (long)(ns % 1000000000u);
            (void)pthread_cond_timedwait(&q->cond, &q->lock, &ts);
        }
        if (q->stopping) {
            pthread_mutex_unlock(&q->lock);
            break;
        }
        pthread_mutex_unlock(&q->lock);
        t->res.again_ms = 0;
        t->res.client_gone = atomic_load(&t->gone);
        if (w.st)
            t->fn(&w, t->arg, &t->res);
        else
            work_fail(&t->res, HTTP_UNAVAILABLE, 0, "the control plane cannot open its store");
        pthread_mutex_lock(&q->lock);
        t->running = false;
        pthread_cond_broadcast(&q->cond);          /* a worker its owner held is free again */
        if (t->res.again_ms > 0 && !q->stopping) { /* waits: run again later */
            t->due_ms = monotonic_ms() + t->res.again_ms;
            todo_append(q, t);
            pthread_mutex_unlock(&q->lock);
            continue;
        }
        t->next = q->done;
        q->done = t;
        pthread_mutex_unlock(&q->lock);
        uint64_t one = 1;
        (void)!write(q->w.fd, &one, sizeof one);
    }
    store_close(w.st);
    sodium_memzero(&w.kr, sizeof w.kr);
    return NULL;
}

static void answer(work_task_t *t)
{
    conn_t *c = t->conn;
    if (!c)
        return;
    conn_set_handler(c, NULL, NULL);
    t->conn = NULL;
    const char *extra = t->res.headers[0] ? t->res.headers : NULL;
    if (t->res.status == 204) {
        (void)conn_respond(c, 204, NULL, NULL, 0, extra);
        return;
    }
    if (!t->res.json) {
        http_internal_error(c, 0, "internal error: the task gave no answer");
        return;
    }
    _cleanup_free_ char *body = json_dumps(t->res.json, JSON_COMPACT);
    if (!body) {
        http_errno(c, 0, -ENOMEM, "answer");
        return;
    }
    (void)conn_respond(c, t->res.status, "application/json", body, strlen(body), extra);
}

static void on_done(loop_t *l, watcher_t *w, uint32_t ev)
{
    work_queue_t *q = w->data;
    uint64_t n;
    (void)l;
    (void)ev;
    (void)!read(w->fd, &n, sizeof n);
    pthread_mutex_lock(&q->lock);
    work_task_t *t = q->done;
    q->done = NULL;
    pthread_mutex_unlock(&q->lock);
    while (t) {
        work_task_t *next = t->next;
        pthread_mutex_lock(&q->lock);
        for (work_task_t **pp = &q->all; *pp; pp = &(*pp)->all_next)
            if (*pp == t) {
                *pp = t->all_next;
                break;
            }
        pthread_mutex_unlock(&q->lock);
        answer(t);
        task_free(t);
        t = next;
    }
}

int work_start(control_t *ctl)
{
    work_queue_t *q = calloc(1, sizeof *q);
    if (!q)
        return -ENOMEM;
    q->ctl = ctl;
    q->todo_tail = &q->todo;
    pthread_mutex_init(&q->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* due times are monotonic */
    pthread_cond_init(&q->cond, &ca);
    pthread_condattr_destroy(&ca);
    int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (fd < 0) {
        free(q);
        return negative_errno();
    }
    watcher_init(&q->w, fd, on_done, q);
    int r = loop_watch(ctl->srv.loop, &q->w, EPOLLIN);
    for (int i = 0; r >= 0 && i < WORKERS; i++) {
        r = -pthread_create(&q->threads[i], NULL, worker_main, q);
        if (r == 0)
            q->n_threads++;
    }
    ctl->work = q;
    return r < 0 ? r : 0;
}

void work_stop(control_t *ctl)
{
    work_queue_t *q = ctl->work;
    if (!q)
        return;
    pthread_mutex_lock(&q->lock);
    q->stopping = true;
    pthread_cond_broadcast(&q->cond);
    pthread_mutex_unlock(&q->lock);
    for (int i = 0; i < q->n_threads; i++)
        (void)pthread_join(q->threads[i], NULL);
    loop_unwatch(ctl->srv.loop, &q->w);
    safe_close(q->w.fd);
    for (work_task_t *lists[2] = { q->todo, q->done }, **l = lists; l < lists + 2; l++)
        for (work_task_t *t = *l, *next; t; t = next) {
            next = t->next;
            if (t->conn)
                conn_set_handler(t->conn, NULL, NULL);
            task_free(t);
        }
    pthread_mutex_destroy(&q->lock);
    pthread_cond_destroy(&q->cond);
    free(q);
    ctl->work = NULL;
}

void work_submit(control_t *ctl, conn_t *c, const char *owner, unsigned flags, work_fn fn,
                 void *arg, void (*free_arg)(void *))
{
    work_queue_t *q = ctl->work;
    work_task_t *t = q ? calloc(1, sizeof *t) : NULL;
    if (!t) {
        if (free_arg)
            free_arg(arg);
        http_errno(c, 0, -ENOMEM, "work");
        return;
    }
    *t = (work_task_t){ .conn = c, .fn = fn, .arg = arg, .free_arg = free_arg };
    atomic_init(&t->gone, false);
    (void)snprintf(t->owner, sizeof t->owner, "%s", owner ? owner : "");
    pthread_mutex_lock(&q->lock);
    size_t all = 0, mine = 0;
    for (work_task_t *o = q->all; o; o = o->all_next, all++)
        mine += streq(o->owner, t->owner);
    if (all >= WORK_QUEUE_MAX || mine >= WORK_PER_OWNER_MAX) {
        pthread_mutex_unlock(&q->lock);
        t->conn = NULL;
        task_free(t);
        if (mine >= WORK_PER_OWNER_MAX)
            http_error(c, HTTP_TOO_MANY_REQUESTS, flags | HTTP_RETRY_SOON,
                       "%d requests of this namespace are in progress already; try again",
                       WORK_PER_OWNER_MAX);
        else
            http_unavailable(c, flags | HTTP_RETRY_SOON,
                             "the control plane is busy with pool requests; try again");
        return;
    }
    t->all_next = q->all;
    q->all = t;
    todo_append(q, t);
    pthread_cond_signal(&q->cond);
    pthread_mutex_unlock(&q->lock);
    conn_set_handler(c, &task_ops, t);
}

void work_answer(work_result_t *res, int status, json_t *j)
{
    json_decref(res->json);
    res->status = status;
    res->json = j || status == 204 ? j : json_pack("{s:s}", "error", "out of memory");
}

void work_fail(work_result_t *res, int status, unsigned flags, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    work_answer(res, status, http_error_vjson(status, flags, fmt, ap));
    va_end(ap);
}
