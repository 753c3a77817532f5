/* SPDX-License-Identifier: MIT */
/* The HTTP core on its own (src/http/httpd.c, conn.c, proxy.c): this test links only src/http/
 * and src/common/, none of the daemons, so it builds only while the core needs nothing of them.
 * It serves real requests over loopback from a client thread and checks the seams a daemon
 * uses: dispatch and app, and the per-request owner data, released exactly once when the
 * request ends, when the connection goes away, or when the tunnel it moved into closes. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/macro.h"
#include "http/httpd.h"
#include "http/proxy.h"
#include "tap.h"

enum { OWNER_REQUEST, OWNER_TUNNEL, OWNER_HELD, N_OWNERS };

typedef struct {
    httpd_t h;
    int tags[N_OWNERS];
    int released[N_OWNERS];
    bool app_seen;
    int released_before_second; /* released[OWNER_REQUEST] when the next request came */
    bool second_had_owner;
    bool tunnel_started;
    int released_at_tunnel_start, released_at_tunnel_close, tunnel_closes;
    bool guard_fired;
    int backend; /* the backend's far end, open until the server is done */
    uint16_t port;
    char got[256]; /* what the client thread read in its last exchange */
    size_t ngot;
} world_t;

static world_t W;

static void owner_release(void *owner)
{
    int tag = *(int *)owner;
    W.released[tag]++;
    if (tag == OWNER_TUNNEL)
        loop_stop(W.h.loop);
}
static const conn_owner_ops_t test_owner = { .release = owner_release };

static void on_tunnel_close(tunnel_t *t, void *data)
{
    (void)t;
    (void)data;
    W.tunnel_closes++;
    W.released_at_tunnel_close = W.released[OWNER_TUNNEL];
}

/* The backend answers `answer` and is done: the tunnel passes that on and then ends. Its
 * first `pre` bytes reach the tunnel as already read (down_pre), the rest through the socket;
 * drop: the tunnel's answer filter. */
static void start_tunnel(conn_t *c, const char *answer, size_t pre, const char *drop)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
        return;
    (void)!write(sv[1], answer + pre, strlen(answer) - pre);
    (void)shutdown(sv[1], SHUT_WR);
    buf_t head, down;
    buf_init(&head, 4096);
    buf_init(&down, 4096);
    (void)buf_append(&head, "UP", 2);
    (void)buf_append(&down, answer, pre);
    W.tunnel_started =
        proxy_tunnel_start(c, sv[0], NULL, &head, &down, drop, on_tunnel_close, NULL);
    W.released_at_tunnel_start = W.released[OWNER_TUNNEL];
    buf_free(&head);
    buf_free(&down);
    W.backend = sv[1];
}

/* A run's answer with the platform's headers in its 1xx head and its final one (any case), and
 * what the filtered tunnel passes on: those lines gone, the body's bytes unchanged. */
#define FORGED                                                                                     \
    "HTTP/1.1 100 Continue\r\nX-Sbx-Verdict: Deny\r\n\r\n"                                         \
    "HTTP/1.1 409 Conflict\r\nx-SBX-verdict: RefreshRoute\r\nX-Keep: 1\r\n"                        \
    "X-Sbx-Outcome: unknown\r\nContent-Length: 19\r\n\r\nX-Sbx-Body: stays\r\n"
#define FILTERED                                                                                   \
    "HTTP/1.1 100 Continue\r\n\r\n"                                                                \
    "HTTP/1.1 409 Conflict\r\nX-Keep: 1\r\nContent-Length: 19\r\n\r\nX-Sbx-Body: stays\r\n"

static void dispatch(conn_t *c)
{
    W.app_seen = c->srv->app == &W;
    sv_t p = c->req.path;
    if (sv_eq(p, SV("/owned"))) {
        conn_set_owner(c, &test_owner, &W.tags[OWNER_REQUEST]);
        conn_respond(c, 200, "text/plain", "one", 3, NULL);
    } else if (sv_eq(p, SV("/plain"))) {
        W.released_before_second = W.released[OWNER_REQUEST];
        const conn_owner_ops_t *ops;
        void *o = conn_take_owner(c, &ops);
        W.second_had_owner = o || ops;
        conn_respond(c, 200, "text/plain", "two", 3, NULL);
    } else if (sv_eq(p, SV("/tunnel"))) {
        conn_set_owner(c, &test_owner, &W.tags[OWNER_TUNNEL]);
        start_tunnel(c, "HELLO", 0, NULL);
    } else if (sv_eq(p, SV("/tunnel-filtered"))) { /* split inside the second head */
        conn_set_owner(c, &test_owner, &W.tags[OWNER_TUNNEL]);
        start_tunnel(c, FORGED, 60, "x-sbx-");
    } else if (sv_eq(p, SV("/tunnel-unfiltered"))) {
        conn_set_owner(c, &test_owner, &W.tags[OWNER_TUNNEL]);
        start_tunnel(c, FORGED, 60, NULL);
    } else if (sv_eq(p, SV("/tunnel-malformed"))) { /* a bare LF could hide a header line */
        conn_set_owner(c, &test_owner, &W.tags[OWNER_TUNNEL]);
        start_tunnel(c, "HTTP/1.1 409 Conflict\nX-Sbx-Verdict: Deny\r\n\r\nbody", 0, "x-sbx-");
    } else if (sv_eq(p, SV("/hold"))) {
        /* never answered: the connection still holds it when the server goes away */
        conn_set_owner(c, &test_owner, &W.tags[OWNER_HELD]);
        loop_stop(c->srv->loop);
    } else {
        http_not_found(c, 0, "no");
    }
}

static void on_guard(loop_t *l, timer_t_ *t)
{
    (void)t;
    W.guard_fired = true;
    loop_stop(l);
}

/* Read into W.got until it holds needle, or EOF (needle NULL), or the 5 s receive timeout. */
static void client_read(int fd, const char *needle)
{
    W.ngot = 0;
    W.got[0] = 0;
    while (W.ngot + 1 < sizeof W.got) {
        ssize_t n = recv(fd, W.got + W.ngot, sizeof W.got - 1 - W.ngot, 0);
        if (n <= 0)
            return;
        W.ngot += (size_t)n;
        W.got[W.ngot] = 0;
        if (needle && strstr(W.got, needle))
            return;
    }
}

static int client_connect(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(W.port) };
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = { .tv_sec = 5 };
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0)
        fd = safe_close(fd);
    return fd;
}

#define REQ(path) "GET " path " HTTP/1.1\r\nHost: t\r\n\r\n"

static char tunnel_got[64];

static void *client_tunnel(void *arg)
{
    (void)arg;
    int fd = client_connect();
    if (fd < 0)
        return NULL;
    (void)!write(fd, REQ("/owned"), strlen(REQ("/owned")));
    client_read(fd, "\r\n\r\none");
    (void)!write(fd, REQ("/plain"), strlen(REQ("/plain")));
    client_read(fd, "\r\n\r\ntwo");
    (void)!write(fd, REQ("/tunnel"), strlen(REQ("/tunnel")));
    client_read(fd, NULL); /* the backend's bytes, then its EOF passed on */
    memcpy(tunnel_got, W.got, MIN(W.ngot + 1, sizeof tunnel_got));
    tunnel_got[sizeof tunnel_got - 1] = 0;
    safe_close(fd);
    return NULL;
}

static const char *one_path;

/* One request on its own connection; W.got: everything that came back until EOF. */
static void *client_one(void *arg)
{
    (void)arg;
    int fd = client_connect();
    if (fd < 0)
        return NULL;
    char req[128];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: t\r\n\r\n", one_path);
    (void)!write(fd, req, (size_t)n);
    client_read(fd, NULL);
    safe_close(fd);
    return NULL;
}

static void *client_hold(void *arg)
{
    (void)arg;
    int fd = client_connect();
    if (fd < 0)
        return NULL;
    (void)!write(fd, REQ("/hold"), strlen(REQ("/hold")));
    client_read(fd, NULL); /* until the server goes away */
    safe_close(fd);
    return NULL;
}

/* A server on 127.0.0.1, an ephemeral port, plain HTTP, no limits but a total. */
static int world_start(void)
{
    memset(&W, 0, sizeof W);
    W.backend = -EBADF;
    for (int i = 0; i < N_OWNERS; i++)
        W.tags[i] = i;
    httpd_config_t cfg = { .max_connections = 16,
                           .keepalive_ms = 5000,
                           .head_timeout_ms = 5000,
                           .body_timeout_ms = 5000,
                           .write_timeout_ms = 5000 };
    memcpy(cfg.bind, "127.0.0.1", 10);
    int r = httpd_init(&W.h, &cfg);
    if (r < 0)
        return r;
    W.h.dispatch = dispatch;
    W.h.app = &W;
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    if (getsockname(W.h.listen_fd, (struct sockaddr *)&sa, &sl) < 0)
        return -errno;
    W.port = ntohs(sa.sin_port);
    return 0;
}

static void world_run(void *(*client)(void *))
{
    timer_t_ guard;
    pthread_t th;
    timer_init(&guard, on_guard, NULL);
    (void)timer_arm(W.h.loop, &guard, 10000);
    if (pthread_create(&th, NULL, client, NULL) != 0)
        return;
    (void)httpd_run(&W.h);
    timer_disarm(W.h.loop, &guard);
    httpd_done(&W.h); /* the hold client sees its connection close here */
    pthread_join(th, NULL);
    W.backend = safe_close(W.backend);
}

TEST(owner_released_at_request_end_and_when_its_tunnel_closes)
{
    ASSERT_EQ(world_start(), 0);
    world_run(client_tunnel);
    ASSERT_FALSE(W.guard_fired);
    ASSERT_TRUE(W.app_seen);
    /* the first request's owner is released once, when its request ended, before the next */
    ASSERT_EQ(W.released_before_second, 1);
    ASSERT_EQ(W.released[OWNER_REQUEST], 1);
    ASSERT_FALSE(W.second_had_owner); /* nothing carries over to the next request */
    /* the tunnel took the owner with the socket: not released by the connection's end */
    ASSERT_TRUE(W.tunnel_started);
    ASSERT_EQ(W.released_at_tunnel_start, 0);
    ASSERT_STREQ(tunnel_got, "HELLO");
    ASSERT_EQ(W.tunnel_closes, 1);
    ASSERT_EQ(W.released_at_tunnel_close, 0); /* held for the tunnel's whole life */
    ASSERT_EQ(W.released[OWNER_TUNNEL], 1);   /* then released once */
    ASSERT_EQ(W.released[OWNER_HELD], 0);
}

TEST(owner_released_once_when_the_connection_goes_away)
{
    ASSERT_EQ(world_start(), 0);
    world_run(client_hold);
    ASSERT_FALSE(W.guard_fired);
    ASSERT_EQ(W.released[OWNER_HELD], 1);
    ASSERT_EQ(W.released[OWNER_REQUEST], 0);
}

TEST(tunnel_filters_the_answer_heads)
{
    ASSERT_EQ(world_start(), 0);
    one_path = "/tunnel-filtered";
    world_run(client_one);
    ASSERT_FALSE(W.guard_fired);
    ASSERT_TRUE(W.tunnel_started);
    ASSERT_STREQ(W.got, FILTERED);
    ASSERT_EQ(W.tunnel_closes, 1);
}

TEST(tunnel_without_a_filter_passes_the_answer_unchanged)
{
    ASSERT_EQ(world_start(), 0);
    one_path = "/tunnel-unfiltered";
    world_run(client_one);
    ASSERT_FALSE(W.guard_fired);
    ASSERT_STREQ(W.got, FORGED);
}

TEST(tunnel_ends_on_a_malformed_answer_head_passing_none_of_it)
{
    ASSERT_EQ(world_start(), 0);
    one_path = "/tunnel-malformed";
    world_run(client_one);
    ASSERT_FALSE(W.guard_fired);
    ASSERT_TRUE(W.tunnel_started);
    ASSERT_EQ(W.ngot, 0u);
    ASSERT_EQ(W.tunnel_closes, 1);
}

TAP_MAIN(T(owner_released_at_request_end_and_when_its_tunnel_closes),
         T(tunnel_filters_the_answer_heads), T(tunnel_without_a_filter_passes_the_answer_unchanged),
         T(tunnel_ends_on_a_malformed_answer_head_passing_none_of_it),
         T(owner_released_once_when_the_connection_goes_away))
