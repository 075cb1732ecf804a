/* tern networking: what becomes of data you send, and how to listen. */
#ifndef TERN_NET_H
#define TERN_NET_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

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
    int reuseport;     /* SO_REUSEPORT, so several loops (threads) share a port */
    int ipv6_only;     /* for "::": IPv6 only instead of dual-stack */
} tern_listen_options;

#ifdef __cplusplus
}
#endif
#endif
