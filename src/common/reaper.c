/* SPDX-License-Identifier: MIT */
#include "reaper.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>

#include "common/log.h"
#include "common/macro.h"

void reaper_add(reaper_t *r, child_t *ch)
{
    ch->next = r->children;
    r->children = ch;
}

void reaper_remove(reaper_t *r, child_t *ch)
{
    for (child_t **pp = &r->children; *pp; pp = &(*pp)->next)
        if (*pp == ch) {
            *pp = ch->next;
            ch->next = NULL;
            return;
        }
}

void reaper_reap(reaper_t *r)
{
    if (r->registered_only) {
        for (child_t *ch = r->children; ch;) {
            int st;
            if (ch->pid > 0 && waitpid(ch->pid, &st, WNOHANG) == ch->pid) {
                reaper_remove(r, ch);
                ch->on_exit(ch, st);
                ch = r->children; /* its owner may have taken others off the list */
                continue;
            }
            ch = ch->next;
        }
        return;
    }
    for (;;) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid <= 0)
            break;
        child_t *ch = r->children;
        for (; ch; ch = ch->next)
            if (ch->pid == pid) {
                reaper_remove(r, ch);
                ch->on_exit(ch, st);
                break;
            }
        if (!ch && r->on_stray)
            r->on_stray(r->stray_data, pid, st);
    }
}

/* Ours are handed to their owner; others (orphans that were re-parented to us as subreaper or
 * PID 1) are just reaped so they never linger as zombies. Reaping happens only here, so a pid
 * we signal cannot be recycled before we see its exit. */
static void on_signal(loop_t *l, watcher_t *w, uint32_t ev)
{
    reaper_t *r = w->data;
    struct signalfd_siginfo si;
    (void)ev;
    while (read(r->sig_fd, &si, sizeof si) == (ssize_t)sizeof si) {
        if (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT) {
            log_info("signal %u: shutting down", si.ssi_signo);
            loop_stop(l);
            return;
        }
    }
    reaper_reap(r);
}

int reaper_init(reaper_t *r, loop_t *l)
{
    r->loop = l;
    r->sig_fd = -EBADF;
    /* Become the reaper of orphaned descendants so none is left as a zombie. */
    (void)prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    if (sigprocmask(SIG_BLOCK, &mask, NULL) < 0)
        return negative_errno();
    r->sig_fd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (r->sig_fd < 0)
        return negative_errno();
    watcher_init(&r->sig_w, r->sig_fd, on_signal, r);
    return loop_watch(l, &r->sig_w, EPOLLIN);
}

void reaper_done(reaper_t *r)
{
    if (!r->loop) /* never initialized */
        return;
    loop_unwatch(r->loop, &r->sig_w);
    r->sig_fd = safe_close(r->sig_fd);
    r->loop = NULL;
}
