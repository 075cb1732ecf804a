/* tern serve's backend proxy (serve_proxy.c): connections, subscribes
 * and publishes decided by the application's backend over HTTP, JSON in and
 * JSON out (the shape of Centrifugo's proxy), through each loop's HTTP
 * client (http_client.h). The operation waits, its connection goes on,
 * and the answer finishes it later; a connection that closes first
 * cancels its requests. The proxy knows no transport but its name: its
 * askers (a /pubsub WebSocket, an /sse stream) hand it their loop, the
 * name the backend is told and an opaque owner, which the answer gets
 * back. Loop thread only, but for setup and the stats. */
#ifndef TERN_APP_SERVE_PROXY_H
#define TERN_APP_SERVE_PROXY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "app/serve_tokens.h"
#include "app/token.h"
#include "tern/tern.h"

/* The operations a backend may decide. */
enum { APP_PROXY_SUBSCRIBE, APP_PROXY_PUBLISH, APP_PROXY_CONNECT, APP_PROXY_REFRESH,
       APP_PROXY_KINDS };

/* --proxy-*: each URL NULL when that operation is not proxied (the
 * default: the topic rules decide). */
typedef struct app_proxy_flags {
    const char *url[APP_PROXY_KINDS];   /* --proxy-subscribe, -publish, -connect, -refresh */
    uint32_t timeout_ms;                /* --proxy-timeout */
    uint32_t max_inflight;              /* --proxy-max-inflight, per kind (URL) */
} app_proxy_flags;

/* What the backend said, as the waiting operation gets it. */
enum {
    APP_PROXY_ALLOW,        /* {"result":{...}} */
    APP_PROXY_DENY,         /* {"error":{"code":N,"message":"..."}} */
    APP_PROXY_DISCONNECT,   /* {"disconnect":{"code":N,"reason":"..."}} */
    APP_PROXY_FAILED,       /* no usable answer: error says which */
};

typedef struct app_proxy_answer {
    int outcome;           /* APP_PROXY_* */
    /* FAILED: the /pubsub error, "proxy timeout", "proxy unavailable"
     * (no connection), "proxy error" (not a 2xx) or "proxy bad answer" */
    const char *error;
    long code;             /* DENY: the backend's code (0: none); DISCONNECT: the close code */
    const char *message;   /* DENY: its message; DISCONNECT: the reason ("" when none) */
    /* ALLOW of a publish: the data to publish instead, a JSON string
     * token (quotes included); NULL: the client's */
    const char *data;
    size_t data_len;
    /* ALLOW of a connect: the connection's user and info (JSON text, at
     * most APP_PROXY_INFO_MAX bytes) from now on; NULL: not given (a
     * refresh may give info too) */
    const char *user, *info;
    /* ALLOW of a connect: the rights of its "tern" object (a token's
     * claim's shape), the connection's from now on; NULL: not given.
     * done may take its lists (and leave them empty). */
    app_token_rights *rights;
    /* ALLOW of a connect or refresh: when the connection expires (Unix
     * seconds; 0: never), or that it has (expired, a refresh's) */
    int64_t expire_at;
    bool expired;
} app_proxy_answer;

#define APP_PROXY_INFO_MAX 1024

/* The answer for op (what app_serve_proxy_ask was given) to owner (the
 * asker's), on the asker's loop, from the loop and outside every curl
 * callback. op is the caller's to free. */
typedef void (*app_proxy_done)(void *owner, void *op, const app_proxy_answer *a);

/* A connection's requests in flight: a list head in its state, NULL
 * when none. */
typedef struct app_proxy_req app_proxy_req;

/* Who asks: a connection (or stream) of a loop. Read during
 * app_serve_proxy_ask only; loop and pending must outlive the requests
 * (the asker's close cancels them). */
typedef struct app_proxy_asker {
    tern_loop *loop;           /* the asker's: the answer comes on it */
    void *owner;               /* handed back to done as it is */
    app_proxy_req **pending;   /* the asker's list of requests in flight */
    const char *user;          /* its user (a token's sub, or the backend's), or NULL */
    /* the requests' "transport": "websocket" (/pubsub), "sse" (/sse) or
     * "http_stream" (/http-stream's relay) */
    const char *transport;
} app_proxy_asker;

/* A failed refresh (no usable answer, or none could be asked) is asked
 * again this much later: the backend may be back then. */
#define APP_PROXY_REFRESH_RETRY_MS 5000

/* Why a connection's clock ends it (app_proxy_clock's end). */
enum {
    APP_PROXY_END_EXPIRED,      /* the expiry came, or a refresh was refused */
    APP_PROXY_END_NO_MEMORY,    /* no timer, or no room for the new info */
    APP_PROXY_END_DISCONNECT,   /* a refresh answered {"disconnect"}: code, reason */
};

/* A connection's expiry-and-refresh clock, the same for every transport:
 * at the expire_at the backend's connect (or refresh) answer gave,
 * without --proxy-refresh the connection ends; with it the backend is
 * asked APP_PROXY_REFRESH: an allow with a new expire_at re-arms (0:
 * none), its info replaces the user's, "expired", a deny or a disconnect
 * end the connection, no usable answer asks again
 * APP_PROXY_REFRESH_RETRY_MS later. The owner (a /pubsub connection, an
 * /sse stream) embeds it and says what ending and new info mean to it.
 * Invariants: timer is armed, or NULL; off once stopped: no answer and no
 * expiry reaches the owner after (a refresh in flight is on the owner's
 * pending list, which its close cancels); who.user is read from *auth at
 * each ask, as the backend's answers may replace it. */
typedef struct app_proxy_clock {
    app_proxy_asker who;             /* the refresh's asker (its owner: the clock) */
    app_token_conn *const *auth;     /* where the owner keeps its user */
    void *owner;                     /* handed back to end and set_info */
    void (*end)(void *owner, int why, long code, const char *reason);   /* APP_PROXY_END_* */
    int (*set_info)(void *owner, const char *info);   /* <0: out of memory */
    tern_timer *timer;
    bool off;
} app_proxy_clock;

/* The clock idle, for an owner on loop whose requests go on *pending
 * (their "transport": transport) and whose user is *auth's (at ask time). */
void app_proxy_clock_init(app_proxy_clock *k, tern_loop *loop, const char *transport,
                          app_proxy_req **pending, app_token_conn *const *auth, void *owner,
                          void (*end)(void *owner, int why, long code, const char *reason),
                          int (*set_info)(void *owner, const char *info));
/* Armed at Unix second at (0: none, the timer stopped); a time past
 * fires at the loop's next turn. No memory for the timer: end now
 * (APP_PROXY_END_NO_MEMORY) rather than outlive what the backend allowed. */
void app_proxy_clock_at(app_proxy_clock *k, int64_t at);
/* The clock stopped for good (the owner ends): no end and no info after. */
void app_proxy_clock_stop(app_proxy_clock *k);

/* Setup, before the loops run: the flags (copied) and curl's global
 * state. -1 once said why. */
int app_serve_proxy_setup(const app_proxy_flags *f);
/* Whether kind goes to a backend. */
bool app_serve_proxy_on(int kind);

/* Asks kind's backend about topic (NULL for a connect; and data, a JSON
 * string token, for a publish) on behalf of who: NULL, and
 * done(who->owner, op, ...) comes exactly once later unless the asker's
 * requests are cancelled first (then op is freed with free()); or the
 * error that refuses the operation at once ("proxy busy": the backend
 * has --proxy-max-inflight requests in flight; "out of memory"), op
 * untouched. */
const char *app_serve_proxy_ask(int kind, const app_proxy_asker *who, const char *topic,
                                size_t tlen, const char *data, size_t dlen, app_proxy_done done,
                                void *op);
/* Cancels a connection's requests (its on_close): no done comes. */
void app_serve_proxy_cancel_all(app_proxy_req **pending);
/* tern_run's teardown of a thread: its requests cancelled, its client
 * freed. And curl's global state, once every thread has ended. */
void app_serve_proxy_thread_end(void);
void app_serve_proxy_cleanup(void);

/* /metrics: per kind, the requests asked, those that failed (by reason:
 * the FAILED errors, and "busy"), the latency of those answered and those
 * in flight now. */
enum { APP_PROXY_ERR_TIMEOUT, APP_PROXY_ERR_DOWN, APP_PROXY_ERR_STATUS, APP_PROXY_ERR_BAD,
       APP_PROXY_ERR_BUSY, APP_PROXY_ERRS };
#define APP_PROXY_LATENCY_BUCKETS 12
typedef struct app_proxy_stats {
    uint64_t requests, errors[APP_PROXY_ERRS];
    uint64_t le_ms[APP_PROXY_LATENCY_BUCKETS];   /* the buckets' upper bounds */
    uint64_t below[APP_PROXY_LATENCY_BUCKETS];   /* cumulative counts */
    uint64_t count, sum_us;
    uint64_t inflight;   /* asked, neither answered nor cancelled yet */
} app_proxy_stats;
extern const char *const app_proxy_kind_names[APP_PROXY_KINDS];   /* "subscribe", ... */
extern const char *const app_proxy_err_names[APP_PROXY_ERRS];     /* "timeout", ... */
void app_serve_proxy_stats_get(int kind, app_proxy_stats *out);

#endif
