/* An HTTP client on a loop: libcurl's multi interface, driven by the
 * loop's watchers and one timer (CURLMOPT_SOCKETFUNCTION and
 * TIMERFUNCTION), so that a request never blocks the loop. One client per
 * loop thread; its connections to a host are kept alive between requests
 * (curl's connection cache, per multi handle). Loop thread only.
 * tern serve's backend proxy (serve_proxy.c) asks through it. */
#ifndef TERN_APP_HTTP_CLIENT_H
#define TERN_APP_HTTP_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "tern/loop.h"

/* An answer bigger than this ends its request with APP_HTTPC_FAILED. */
#define APP_HTTPC_BODY_MAX (64 * 1024)

typedef struct app_httpc app_httpc;
typedef struct app_httpc_req app_httpc_req;

/* How a request ended. */
enum {
    APP_HTTPC_OK = 0,        /* an HTTP answer came: status and body */
    APP_HTTPC_TIMEOUT,       /* none within the request's timeout */
    APP_HTTPC_FAILED,        /* no connection, a cut one, an answer too big */
};

typedef struct app_httpc_result {
    int outcome;             /* APP_HTTPC_* */
    const char *why;         /* curl's reason when not OK (static or the request's) */
    long status;             /* the HTTP status when OK */
    const char *body;        /* the answer's body (not NUL-terminated), valid during the call */
    size_t len;
    uint64_t us;             /* from the request's start to its end */
} app_httpc_result;

/* Called once per request that was not cancelled, always from the loop
 * (a watcher or the timer) and outside every curl callback, so that it may
 * send, close connections, start or cancel requests. The request is over:
 * its handle must be forgotten. */
typedef void (*app_httpc_done)(void *user, const app_httpc_result *r);

/* A client on loop: NULL when out of memory (or curl refused). */
app_httpc *app_httpc_new(tern_loop *loop);
/* Frees the client. Every request must be finished or cancelled first. */
void app_httpc_free(app_httpc *c);

/* POSTs body (JSON) to url: the request, after which done(user, ...) is
 * called exactly once unless it is cancelled first; NULL when out of
 * memory (nothing started, no call). */
app_httpc_req *app_httpc_post(app_httpc *c, const char *url, const char *body, size_t len,
                              uint32_t timeout_ms, app_httpc_done done, void *user);
/* Ends a request under way (NULL: nothing): done is never called. */
void app_httpc_cancel(app_httpc_req *r);

/* curl's global state: once, before any thread uses a client, and its end
 * after every thread has. */
int app_httpc_global_init(void);
void app_httpc_global_cleanup(void);

#endif
