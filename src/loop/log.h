/* Private side of the log hook: the call the modules make. */
#ifndef TERN_LOOP_LOG_H
#define TERN_LOOP_LOG_H

#include <stdbool.h>

#include "tern/log.h"

/* Kinds of message, each rate-limited on its own. */
enum tern__log_kind {
    TERN__LOG_ACCEPT,        /* accept() errors, EMFILE back-off */
    TERN__LOG_LISTEN,        /* other listener errors */
    TERN__LOG_HTTP_REFUSED,  /* a request refused before any handler (4xx/5xx, close) */
    TERN__LOG_WS_REFUSED,    /* a refused WebSocket upgrade */
    TERN__LOG_WS_SLOW,       /* a route's slow-consumer policy applied */
    TERN__LOG_PUBSUB_SLOW,   /* a topic's policy dropped a message or closed a subscriber */
    TERN__LOG_SEND_TIMEOUT,  /* a peer that took nothing for the send timeout */
    TERN__LOG_UNSENT,        /* a send past the loop's bound on unsent output */
    TERN__LOG_RUN,           /* tern_run: signals, shutdown */
    TERN__LOG_BACKEND,       /* the loop's back end (io_uring unavailable: epoll) */
    TERN__LOG_TLS_HANDSHAKE, /* a failed TLS handshake, plain HTTP on a TLS port */
    TERN__LOG_MISUSE,        /* the API misused (wrong thread, loop freed while busy) */
    TERN__LOG_CONN_LIMIT,    /* connections refused by a connection limit (a count a second) */
    TERN__LOG_RANDOM,        /* no random bytes to be had (the masking keys' seed) */
    TERN__LOG_KINDS
};

/* Is anything at this level wanted? For callers that would format costly
 * arguments (a peer address). */
bool tern__log_on(int level);

/* printf-style; at most TERN__LOG_BURST lines per second per kind. */
void tern__log(int level, int kind, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
