/* SPDX-License-Identifier: MIT */
/* Worker threads for API calls that must wait on other machines (the pool service: booting a
 * pool host, asking its agent for sandboxes). The loop thread hands a task over and goes on
 * serving; a worker runs it with blocking calls and its own store handle; the answer comes back
 * to the loop through an eventfd, and is written only if the client is still there.
 *
 * Only the loop thread touches a task's connection: a client that leaves clears task->conn (its
 * handler's on_close), and the finished task is then just freed. */
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/log.h"
#include "control.h"

#define WORKERS 8
#define WORK_QUEUE_MAX 256

struct work_task {
    struct work_task *next;
    conn_t *conn; /* the loop thread's; NULL once the client left */
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
    size_t queued;
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
        while (!q->todo && !q->stopping)
            pthread_cond_wait(&q->cond, &q->lock);
        if (q->stopping) {
            pthread_mutex_unlock(&q->lock);
            break;
        }
        work_task_t *t = q->todo;
        q->todo = t->next;
        if (!q->todo)
            q->todo_tail = &q->todo;
        pthread_mutex_unlock(&q->lock);
        t->next = NULL;
        if (w.st)
            t->fn(&w, t->arg, &t->res);
        else
            work_fail(&t->res, HTTP_UNAVAILABLE, 0, "the control plane cannot open its store");
        pthread_mutex_lock(&q->lock);
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
        q->queued--;
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
    pthread_cond_init(&q->cond, NULL);
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

void work_submit(control_t *ctl, conn_t *c, work_fn fn, void *arg, void (*free_arg)(void *))
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
    pthread_mutex_lock(&q->lock);
    if (q->queued >= WORK_QUEUE_MAX) {
        pthread_mutex_unlock(&q->lock);
        t->conn = NULL;
        task_free(t);
        http_unavailable(c, HTTP_RETRY_SOON,
                         "the control plane is busy with pool requests; try again");
        return;
    }
    q->queued++;
    *q->todo_tail = t;
    q->todo_tail = &t->next;
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
