/* SPDX-License-Identifier: MIT */
/* A connected stream socket's transport: plain (no sockio_t: the socket itself) or a layer over
 * it (TLS, src/tls/). The HTTP code reads and writes through sock_recv()/sock_send() and never
 * learns which; the layer's code lives outside the static agent, which only ever has plain
 * sockets. Every call is non-blocking. */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "common/macro.h"

typedef struct sockio sockio_t;

typedef struct {
    /* Bytes read (> 0), 0 at the end of the stream, -EAGAIN, or -errno. A layer finishes its
     * handshake inside the first calls. */
    ssize_t (*recv)(sockio_t *io, void *p, size_t n);
    /* Bytes written (> 0), -EAGAIN, or -errno. After -EAGAIN the next call must offer at least
     * the same bytes again (more may follow them). */
    ssize_t (*send)(sockio_t *io, const void *p, size_t n);
    /* Drive the handshake: 0 when done, -EAGAIN (wait for the socket as io->want_write says),
     * or -errno (-EPROTO, -EPERM when the peer is not the one expected). */
    int (*handshake)(sockio_t *io);
    /* Bytes the layer holds that a read returns without the socket (decrypted, or whole
     * records read ahead): the socket will not report them. */
    bool (*pending)(const sockio_t *io);
    /* Say "no more data" at the layer's level (best effort) before shutdown(SHUT_WR). */
    void (*close_notify)(sockio_t *io);
    void (*free)(sockio_t *io);
} sockio_ops_t;

struct sockio {
    const sockio_ops_t *ops;
    int fd;          /* not owned: the socket's owner closes it */
    bool want_write; /* the last -EAGAIN waits for the socket to take bytes, not to bring some */
    bool handshaken;
};

static inline ssize_t sock_recv(int fd, sockio_t *io, void *p, size_t n)
{
    if (io)
        return io->ops->recv(io, p, n);
    for (;;) {
        ssize_t k = recv(fd, p, n, MSG_DONTWAIT);
        if (k >= 0)
            return k;
        if (errno != EINTR)
            return errno == EAGAIN ? -EAGAIN : -errno;
    }
}

static inline ssize_t sock_send(int fd, sockio_t *io, const void *p, size_t n)
{
    if (io)
        return io->ops->send(io, p, n);
    for (;;) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k >= 0)
            return k;
        if (errno != EINTR)
            return errno == EAGAIN ? -EAGAIN : -errno;
    }
}

static inline bool sock_pending(const sockio_t *io) { return io && io->ops->pending(io); }

/* Half-close the sending direction. */
static inline void sock_shutdown_write(int fd, sockio_t *io)
{
    if (io)
        io->ops->close_notify(io);
    (void)shutdown(fd, SHUT_WR);
}

static inline void sockio_free(sockio_t *io)
{
    if (io)
        io->ops->free(io);
}
static inline void sockio_freep(sockio_t **io) { sockio_free(*io); }

/* End a connection: the layer says so (a TLS peer reads the end as an end, not as a cut), is
 * freed, and the socket closed. Returns -EBADF, for "fd = sock_close(fd, io)". */
static inline int sock_close(int fd, sockio_t *io)
{
    if (io)
        io->ops->close_notify(io);
    sockio_free(io);
    return safe_close(fd);
}

/* A factory for a layer over a freshly connected or accepted socket (the daemon's TLS
 * context); NULL = plain. */
typedef struct {
    sockio_t *(*wrap)(void *arg, int fd);
    void *arg;
} sockio_wrap_t;
