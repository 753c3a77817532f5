/* SPDX-License-Identifier: MIT */
#include "httpd.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include "common/log.h"
#include "http/proxy.h"

void httpd_touch(httpd_t *h) { h->last_activity_ms = loop_now_ms(h->loop); }

/* Refuse a connection at accept: answer without allocating anything for it. */
static void refuse(int fd, bool source)
{
    static const char full[] = "{\"error\":\"too many connections\"}";
    static const char src[] = "{\"error\":\"too many connections from this source\"}";
    char busy[256];
    int n = snprintf(busy, sizeof busy,
                     "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                     "Retry-After: %d\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s",
                     CLIMIT_RETRY_AFTER_S, source ? sizeof src - 1 : sizeof full - 1,
                     source ? src : full);
    if (n > 0 && (size_t)n < sizeof busy)
        (void)send(fd, busy, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
    /* Send FIN, and read away a request that already arrived: closing with unread bytes
     * would make the kernel answer RST, which can discard the 503 in transit. */
    (void)shutdown(fd, SHUT_WR);
    char sink[4096];
    for (int k = 0; k < 16 && recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0; k++)
        ;
    safe_close(fd);
}

static void on_accept(loop_t *l, watcher_t *w, uint32_t ev)
{
    httpd_t *s = w->data;
    (void)l;
    (void)ev;
    for (int i = 0; i < 128; i++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(s->listen_fd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE)
                log_warn("accept: %s", strerror(errno));
            return;
        }
        /* Per source, then the unauthenticated share and the total cap (connlimit.h). */
        climit_hold_t lim;
        int r = climit_admit(s, (struct sockaddr *)&ss, sl, &lim);
        if (r < 0) {
            refuse(fd, r == -EUSERS);
            continue;
        }
        if (conn_accept(s, fd, &lim) < 0)
            log_warn("could not set up a connection");
    }
}

static int listen_tcp(const httpd_config_t *cfg)
{
    struct sockaddr_storage ss = { 0 };
    socklen_t sl;
    int family;
    struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, cfg->bind, &a4->sin_addr) == 1) {
        family = AF_INET;
        a4->sin_family = AF_INET;
        a4->sin_port = htons(cfg->port);
        sl = sizeof *a4;
    } else if (inet_pton(AF_INET6, cfg->bind, &a6->sin6_addr) == 1) {
        family = AF_INET6;
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons(cfg->port);
        sl = sizeof *a6;
    } else {
        return -EINVAL;
    }
    _cleanup_close_ int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return negative_errno();
    int one = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&ss, sl) < 0 || listen(fd, 4096) < 0)
        return negative_errno();
    return TAKE_FD(fd);
}

static int listen_unix(const httpd_config_t *cfg)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    size_t n = strlen(cfg->unix_path);
    if (n == 0 || n >= sizeof sa.sun_path)
        return -ENAMETOOLONG;
    memcpy(sa.sun_path, cfg->unix_path, n + 1);
    _cleanup_close_ int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return negative_errno();
    (void)unlink(cfg->unix_path); /* a stale socket from an earlier run */
    /* The socket is only for the node that started us: owner-only permissions. */
    mode_t old = umask(0077);
    int r = bind(fd, (struct sockaddr *)&sa, sizeof sa);
    umask(old);
    if (r < 0 || listen(fd, 4096) < 0)
        return negative_errno();
    return TAKE_FD(fd);
}

/* A socket bound by sbx-node and inherited across exec. Listening here, not in the node, makes
 * this process the socket's SO_PEERCRED identity: the node verifies exactly that (pid, start
 * time, executable) before it forwards a connection. */
static int listen_inherited(const httpd_config_t *cfg)
{
    int fd = cfg->inherited_fd, type = 0, domain = 0;
    socklen_t l = sizeof type;
    if (fd < 3 || getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &l) < 0)
        return -EBADF;
    l = sizeof domain;
    if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &l) < 0 || type != SOCK_STREAM ||
        domain != AF_UNIX)
        return -ENOTSOCK;
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) < 0)
        return negative_errno();
    if (listen(fd, 4096) < 0)
        return negative_errno();
    return fd;
}

int httpd_init(httpd_t *h, const httpd_config_t *cfg)
{
    *h = (httpd_t){ .cfg = *cfg, .listen_fd = -EBADF, .reaper.sig_fd = -EBADF };
    int r = loop_new(&h->loop);
    if (r < 0)
        return r;
    h->start_ms = loop_now_ms(h->loop);
    h->last_activity_ms = h->start_ms;
    (void)signal(SIGPIPE, SIG_IGN);
    /* A file write past RLIMIT_FSIZE must fail with EFBIG, not kill the daemon. */
    (void)signal(SIGXFSZ, SIG_IGN);
    r = reaper_init(&h->reaper, h->loop);
    if (r < 0)
        return r;
    if (cfg->max_conns_per_source > 0) {
        r = climit_tab_new(&h->sources);
        if (r < 0)
            return r;
    }
    return cfg->listen_later ? 0 : httpd_listen(h);
}

int httpd_listen(httpd_t *h)
{
    const httpd_config_t *cfg = &h->cfg;
    h->listen_fd = cfg->listen_inherited ? listen_inherited(cfg)
                   : cfg->unix_path[0]   ? listen_unix(cfg)
                                         : listen_tcp(cfg);
    if (h->listen_fd < 0)
        return h->listen_fd;
    watcher_init(&h->listen_w, h->listen_fd, on_accept, h);
    return loop_watch(h->loop, &h->listen_w, EPOLLIN);
}

int httpd_run(httpd_t *h) { return loop_run(h->loop); }

void httpd_done(httpd_t *h)
{
    conn_free_all(h);
    proxy_free_all(h);
    reaper_done(&h->reaper);
    if (h->loop)
        loop_unwatch(h->loop, &h->listen_w);
    h->loop = loop_free(h->loop); /* runs what was deferred: every connection is gone */
    h->sources = climit_tab_free(h->sources);
    h->listen_fd = safe_close(h->listen_fd);
    if (h->cfg.unix_path[0])
        (void)unlink(h->cfg.unix_path);
}
