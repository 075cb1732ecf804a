/* tern networking: what becomes of data you send, and how to listen. */
#ifndef TERN_NET_H
#define TERN_NET_H

#include <stddef.h>
#include <sys/socket.h>

#include "tern/loop.h"   /* TERN_MUST_CHECK */

#ifdef __cplusplus
extern "C" {
#endif

/* libtern.so exports what this header declares, and nothing else. */
#pragma GCC visibility push(default)

/* What a send did with the data. Negative values are errors (the
 * connection is closed or closing: -EPIPE). */
typedef enum tern_send_result {
    TERN_SEND_OK = 0,        /* handed to the kernel, or corked to be within this loop iteration */
    TERN_SEND_BUFFERED = 1,  /* the kernel was full: kept in the connection's backlog; on_drain follows */
    TERN_SEND_DROPPED = 2,   /* the backlog is over its limit: not sent at all */
} tern_send_result;

/* Options for tern_listen*(); zero means the default. */
typedef struct tern_listen_options {
    int backlog;       /* listen(2) backlog; 0: 4096 (the kernel caps it at somaxconn) */
    /* SO_REUSEPORT, so that several loops (threads), or processes (a
     * zero-downtime restart: the new one listens, then the old one
     * stops), share a port. Asked for here, the port is shared on
     * purpose: the listener binds even when another socket listens there.
     * Without it tern_run still sets SO_REUSEPORT for its loops, but the
     * first loop's listener refuses a fixed port another socket listens
     * on (-EADDRINUSE), so a second process started by mistake cannot
     * take a share of the connections. */
    int reuseport;
    int ipv6_only;     /* for "::": IPv6 only instead of dual-stack */
    /* SO_SNDBUF of every connection accepted (the kernel doubles it); 0:
     * the kernel's autotuning, which on loopback lets a connection hold
     * megabytes its peer has not read. A small one (64 KiB) makes a slow
     * reader show in tern_ws_buffered, and so in the slow-consumer
     * policies, within a moment. */
    int sndbuf;
    /* Out of descriptors. A listener stops accepting (backs off 100 ms
     * at a time, counted in tern_stats.listeners_paused; the clients wait
     * in the kernel's queue) before the process is out: it takes no
     * descriptor numbered within the last 16 under RLIMIT_NOFILE (a
     * quarter of the limit when that is under 64), plus one per such
     * listener. Those are kept for the listeners that set use_fd_reserve
     * (an operator's: health checks, metrics, which must answer when the
     * public ones cannot) and for the files the process opens. Off (0):
     * kept out of the reserve. (With io_uring's accept, which the kernel
     * runs ahead of the loop, listeners back off at the limit only.) */
    int use_fd_reserve;
} tern_listen_options;

/* Room for any address tern_addr_format() writes, with its NUL. */
#define TERN_ADDRSTRLEN 120

/* Writes a peer address as text into buf (NUL-terminated): "1.2.3.4:5678",
 * "[2001:db8::1]:5678", or for a Unix socket "unix:" followed by the
 * peer's path, which is empty for the usual unnamed client socket
 * ("unix:"). Returns the length written, -EINVAL for a NULL or unknown
 * address, -ENOSPC when buf is too small (TERN_ADDRSTRLEN always fits). */
TERN_MUST_CHECK
int tern_addr_format(const struct sockaddr *addr, socklen_t len, char *buf, size_t cap);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
