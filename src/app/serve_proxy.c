/* tern serve's backend proxy (serve_proxy.h).
 *
 * A /pubsub connection or /sse stream as it opens (--proxy-connect) and
 * when the expiry that answer gave comes (--proxy-refresh), a subscribe
 * (--proxy-subscribe; each topic of an /sse stream) or a publish
 * (--proxy-publish) is POSTed to the backend as JSON, the same for both
 * transports:
 *
 *   {"transport":"websocket","protocol":"json","user":"U"}   (a connect)
 *   {"transport":"websocket","protocol":"json","user":"U","channel":"T"}
 *   ... ,"data":"D"}                                     (a publish)
 *
 * (transport: "websocket" for /pubsub, "sse" for an /sse stream,
 * "http_stream" for an /http-stream session; user: the connection's
 * token's sub, "" without one) and the backend
 * answers, with a 2xx:
 *
 *   {"result":{}}                                        allowed
 *   {"result":{"data":"D2"}}                             a publish: D2 is
 *                                                        published instead
 *   {"result":{"user":"U2","info":I}}                    a connect: the
 *                                                        connection's user
 *                                                        (presence, user
 *                                                        topics) and info
 *   ... ,"tern":{"subscribe":[...],"publish":[...]}}}    and its rights, as
 *                                                        a token's claim
 *   ... ,"expire_at":S}}                                 a connect or a
 *                                                        refresh: expires
 *                                                        at S (Unix seconds)
 *   {"result":{"expired":true}}                          a refresh: it has
 *   {"error":{"code":N,"message":"M"}}                   refused
 *   {"disconnect":{"code":N,"reason":"R"}}               the connection is
 *                                                        closed with N, R
 *
 * Anything else (no answer within --proxy-timeout, no connection, a
 * status other than 2xx, not one of those objects) refuses the operation
 * with an error that says which, and logs one line each time the reason a
 * backend fails changes (not one per request). Requests are counted per
 * backend across the threads: over --proxy-max-inflight, an operation is
 * refused at once ("proxy busy") rather than queued behind a backend that
 * is slow.
 *
 * Each loop thread has its own HTTP client (its curl multi handle, its
 * kept-alive connections) and list of requests; a request belongs to its
 * connection's list too, so that the connection's close cancels it and no
 * answer ever reaches a connection that has gone. */
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "app/app.h"
#include "app/http_client.h"
#include "app/json.h"
#include "app/serve_proxy.h"

const char *const app_proxy_kind_names[APP_PROXY_KINDS] = {"subscribe", "publish", "connect",
                                                           "refresh"};
const char *const app_proxy_err_names[APP_PROXY_ERRS] = {"timeout", "unavailable", "status",
                                                         "bad_answer", "busy"};

/* The flags, set once in setup before any loop runs, read-only after. */
static app_proxy_flags flags;

/* Per kind, over all threads: requests in flight (bounded by
 * max_inflight), the counters of /metrics, and the reason the backend
 * last failed for (-1: it answered), so that a log line says each change
 * once. */
typedef struct proxy_kind {
    atomic_uint inflight;
    _Atomic uint64_t requests, errors[APP_PROXY_ERRS];
    _Atomic uint64_t below[APP_PROXY_LATENCY_BUCKETS], count, sum_us;
    atomic_int last_failure;
} proxy_kind;
static proxy_kind kinds[APP_PROXY_KINDS];
static const uint64_t le_ms[APP_PROXY_LATENCY_BUCKETS] = {1, 2, 5, 10, 25, 50, 100, 250, 500,
                                                          1000, 2500, 5000};

/* A request in flight. Invariants: it is on its thread's list (thread_reqs)
 * and its connection's (*pending) until it ends (answered, cancelled or
 * the thread's end), and then on neither; http is live until then; op is
 * the caller's operation, handed back through done or freed here. */
struct app_proxy_req {
    int kind;
    void *owner;   /* the asker's, handed back to done */
    app_httpc_req *http;
    app_proxy_done done;
    void *op;
    app_proxy_req *next, **pprev;              /* the connection's list */
    app_proxy_req *thread_next, **thread_pprev;   /* the thread's */
};

static _Thread_local app_httpc *client;         /* this loop's, made at its first request */
static _Thread_local app_proxy_req *thread_reqs;

/* Whether any kind goes to a backend (then curl's global state is up). */
static bool any_on(void) {
    for (int k = 0; k < APP_PROXY_KINDS; k++)
        if (app_serve_proxy_on(k))
            return true;
    return false;
}

int app_serve_proxy_setup(const app_proxy_flags *f) {
    flags = *f;
    for (int k = 0; k < APP_PROXY_KINDS; k++)
        atomic_store(&kinds[k].last_failure, -1);
    if (!any_on())
        return 0;
    if (app_httpc_global_init() < 0) {
        fprintf(stderr, "tern serve: libcurl did not start: the backend proxy cannot run\n");
        return -1;
    }
    return 0;
}

bool app_serve_proxy_on(int kind) {
    return flags.url[kind] != NULL && flags.url[kind][0] != '\0';
}

static void unlink_req(app_proxy_req *r) {
    if ((*r->pprev = r->next))
        r->next->pprev = r->pprev;
    if ((*r->thread_pprev = r->thread_next))
        r->thread_next->thread_pprev = r->thread_pprev;
    atomic_fetch_sub_explicit(&kinds[r->kind].inflight, 1, memory_order_relaxed);
}

/* A failure counted, and logged when its reason is not the last one. */
static void failed(int kind, int err, const char *why) {
    atomic_fetch_add_explicit(&kinds[kind].errors[err], 1, memory_order_relaxed);
    if (err == APP_PROXY_ERR_BUSY)
        return;   /* the backend's state, not a change of it: counted only */
    if (atomic_exchange(&kinds[kind].last_failure, err) != err)
        app_serve_log(stderr, TERN_LOG_WARN, "the %s proxy (%s): %s",
                      app_proxy_kind_names[kind], flags.url[kind], why);
}

static void answered(int kind, uint64_t us) {
    proxy_kind *k = &kinds[kind];
    for (int i = 0; i < APP_PROXY_LATENCY_BUCKETS; i++)
        if (us <= le_ms[i] * 1000)
            atomic_fetch_add_explicit(&k->below[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&k->count, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&k->sum_us, us, memory_order_relaxed);
    if (atomic_exchange(&k->last_failure, -1) != -1)
        app_serve_log(stderr, TERN_LOG_WARN, "the %s proxy (%s) answers again",
                      app_proxy_kind_names[kind], flags.url[kind]);
}

/* A string member of o, or "" when absent or not a string. */
static const char *str_of(json_t *o, const char *name) {
    const char *s = json_string_value(json_object_get(o, name));
    return s ? s : "";
}

/* The answer's body read into a (strings pointing into root, which the
 * caller frees after using a, or into *data and *info, the caller's to
 * free): false when it is none of the forms. */
static bool read_answer(int kind, json_t *root, app_proxy_answer *a, char **data, char **info,
                        app_token_rights *rights) {
    json_t *res = json_object_get(root, "result"), *err = json_object_get(root, "error");
    json_t *disc = json_object_get(root, "disconnect");
    if (json_is_object(err)) {
        json_t *code = json_object_get(err, "code");
        if (code && !json_is_integer(code))
            return false;
        *a = (app_proxy_answer){.outcome = APP_PROXY_DENY, .code = (long)json_integer_value(code),
                                .message = str_of(err, "message")};
        return true;
    }
    if (json_is_object(disc)) {
        json_int_t code = json_integer_value(json_object_get(disc, "code"));
        if (code < 3000 || code > 4999)   /* an application's close codes */
            return false;
        *a = (app_proxy_answer){.outcome = APP_PROXY_DISCONNECT, .code = (long)code,
                                .message = str_of(disc, "reason")};
        return true;
    }
    if (!json_is_object(res))
        return false;
    *a = (app_proxy_answer){.outcome = APP_PROXY_ALLOW};
    json_t *d = json_object_get(res, "data");
    if (kind == APP_PROXY_PUBLISH && d) {
        if (!json_is_string(d))
            return false;   /* /pubsub's data is a string */
        /* As a JSON string token, the form the publish path takes. */
        if ((*data = json_dumps(d, JSON_ENCODE_ANY | JSON_COMPACT)) == NULL)
            return false;
        a->data = *data;
        a->data_len = strlen(*data);
    }
    json_t *u = json_object_get(res, "user"), *i = json_object_get(res, "info");
    json_t *at = json_object_get(res, "expire_at"), *gone = json_object_get(res, "expired");
    bool session = kind == APP_PROXY_CONNECT || kind == APP_PROXY_REFRESH;
    if (session && at) {
        if (!json_is_integer(at) || json_integer_value(at) < 0)
            return false;
        a->expire_at = (int64_t)json_integer_value(at);
    }
    if (kind == APP_PROXY_REFRESH && gone) {
        if (!json_is_boolean(gone))
            return false;
        a->expired = json_is_true(gone);
    }
    json_t *tern = json_object_get(res, "tern");
    const char *why;
    if (kind == APP_PROXY_CONNECT && tern) {
        if (app_token_rights_take(tern, rights, &why) < 0)
            return false;
        a->rights = rights;
    }
    if (kind == APP_PROXY_CONNECT && u) {
        if (!json_is_string(u))
            return false;
        a->user = json_string_value(u);
    }
    if (session && i) {
        if ((*info = json_dumps(i, JSON_ENCODE_ANY | JSON_COMPACT)) == NULL ||
            strlen(*info) > APP_PROXY_INFO_MAX)
            return false;
        a->info = *info;
    }
    return true;
}

/* The HTTP client's end of a request: what it means to the operation. */
static void on_http_done(void *user, const app_httpc_result *res) {
    app_proxy_req *r = user;
    unlink_req(r);
    app_proxy_answer a = {.outcome = APP_PROXY_FAILED};
    json_t *root = NULL;
    char *data = NULL, *info = NULL;
    app_token_rights rights = {0};
    char why[160];
    if (res->outcome == APP_HTTPC_TIMEOUT) {
        a.error = "proxy timeout";
        snprintf(why, sizeof(why), "no answer within %" PRIu32 " ms", flags.timeout_ms);
        failed(r->kind, APP_PROXY_ERR_TIMEOUT, why);
    } else if (res->outcome != APP_HTTPC_OK) {
        a.error = "proxy unavailable";
        snprintf(why, sizeof(why), "%s", res->why);
        failed(r->kind, APP_PROXY_ERR_DOWN, why);
    } else if (res->status < 200 || res->status > 299) {
        a.error = "proxy error";
        snprintf(why, sizeof(why), "answered HTTP %ld", res->status);
        failed(r->kind, APP_PROXY_ERR_STATUS, why);
    } else if ((root = json_loadb(res->body ? res->body : "", res->len, 0, NULL)) == NULL ||
               !read_answer(r->kind, root, &a, &data, &info, &rights)) {
        a = (app_proxy_answer){.outcome = APP_PROXY_FAILED, .error = "proxy bad answer"};
        failed(r->kind, APP_PROXY_ERR_BAD,
               "answered with neither {\"result\"}, {\"error\"} nor {\"disconnect\"}");
    } else
        answered(r->kind, res->us);
    r->done(r->owner, r->op, &a);
    free(data);
    free(info);
    app_token_rights_free(&rights);
    json_decref(root);
    free(r);
}

/* {"transport":TR,"protocol":"json","user":U[,"channel":T][,"data":D]}
 * (TR one of the askers' fixed names: nothing to escape) */
static char *request_body(const char *transport, const char *user, const char *topic,
                          size_t tlen, const char *data, size_t dlen, size_t *len) {
    size_t ulen = user ? strlen(user) : 0;
    size_t cap = 96 + strlen(transport) + APP_JSON_ESCAPE_MAX * (ulen + tlen) + dlen;
    char *b = malloc(cap);
    if (b == NULL)
        return NULL;
    size_t o = (size_t)snprintf(b, cap, "{\"transport\":\"%s\",\"protocol\":\"json\",\"user\":\"",
                                transport);
    o += app_json_escape(b + o, cap - o, user ? user : "", ulen);
    b[o++] = '"';
    if (topic) {
        memcpy(b + o, ",\"channel\":\"", 12);
        o += 12;
        o += app_json_escape(b + o, cap - o, topic, tlen);
        b[o++] = '"';
    }
    if (data) {
        memcpy(b + o, ",\"data\":", 8);
        o += 8;
        memcpy(b + o, data, dlen);
        o += dlen;
    }
    b[o++] = '}';
    b[o] = '\0';
    *len = o;
    return b;
}

const char *app_serve_proxy_ask(int kind, const app_proxy_asker *who, const char *topic,
                                size_t tlen, const char *data, size_t dlen, app_proxy_done done,
                                void *op) {
    proxy_kind *k = &kinds[kind];
    atomic_fetch_add_explicit(&k->requests, 1, memory_order_relaxed);
    if (atomic_fetch_add_explicit(&k->inflight, 1, memory_order_relaxed) >= flags.max_inflight) {
        atomic_fetch_sub_explicit(&k->inflight, 1, memory_order_relaxed);
        failed(kind, APP_PROXY_ERR_BUSY, "busy");
        return "proxy busy";
    }
    app_proxy_req *r = calloc(1, sizeof(*r));
    size_t len = 0;
    char *body = request_body(who->transport, who->user, topic, tlen, data, dlen, &len);
    if (client == NULL)
        client = app_httpc_new(who->loop);
    if (r)
        *r = (app_proxy_req){.kind = kind, .owner = who->owner, .done = done, .op = op};
    if (r == NULL || body == NULL || client == NULL ||
        (r->http = app_httpc_post(client, flags.url[kind], body, len, flags.timeout_ms,
                                  on_http_done, r)) == NULL) {
        atomic_fetch_sub_explicit(&k->inflight, 1, memory_order_relaxed);
        free(r);
        free(body);
        return "out of memory";
    }
    free(body);
    if ((r->next = *who->pending))
        r->next->pprev = &r->next;
    r->pprev = who->pending;
    *who->pending = r;
    if ((r->thread_next = thread_reqs))
        r->thread_next->thread_pprev = &r->thread_next;
    r->thread_pprev = &thread_reqs;
    thread_reqs = r;
    return NULL;
}

static void cancel(app_proxy_req *r) {
    unlink_req(r);
    app_httpc_cancel(r->http);
    free(r->op);
    free(r);
}

void app_serve_proxy_cancel_all(app_proxy_req **pending) {
    while (*pending)
        cancel(*pending);
}

/* ---- a connection's expiry-and-refresh clock ------------------------------ */

void app_proxy_clock_init(app_proxy_clock *k, tern_loop *loop, const char *transport,
                          app_proxy_req **pending, app_token_conn *const *auth, void *owner,
                          void (*end)(void *owner, int why, long code, const char *reason),
                          int (*set_info)(void *owner, const char *info)) {
    *k = (app_proxy_clock){.who = {.loop = loop, .owner = k, .pending = pending,
                                   .transport = transport},
                           .auth = auth, .owner = owner, .end = end, .set_info = set_info};
}

static void clock_due(tern_timer *t, void *user);

/* Armed ms from now (no memory for the timer: the owner ends now rather
 * than outlive what the backend allowed). */
static void clock_arm(app_proxy_clock *k, uint64_t ms) {
    int err = k->timer ? tern_timer_again(k->timer, ms)
                       : tern_timer_start(k->who.loop, &k->timer, ms, 0, clock_due, k);
    if (err < 0)
        k->end(k->owner, APP_PROXY_END_NO_MEMORY, 0, NULL);
}

void app_proxy_clock_at(app_proxy_clock *k, int64_t at) {
    if (at == 0) {
        if (k->timer)
            tern_timer_stop(k->timer);
        k->timer = NULL;
        return;
    }
    int64_t left = at - (int64_t)time(NULL);
    clock_arm(k, left > 0 ? (uint64_t)left * 1000 : 0);
}

void app_proxy_clock_stop(app_proxy_clock *k) {
    app_proxy_clock_at(k, 0);
    k->off = true;
}

/* The backend's answer to a refresh (--proxy-refresh). */
static void clock_refreshed(void *owner, void *op, const app_proxy_answer *a) {
    (void)op;
    app_proxy_clock *k = owner;
    if (k->off)
        return;   /* the owner is ending already */
    switch (a->outcome) {
    case APP_PROXY_ALLOW:
        if (a->expired) {
            k->end(k->owner, APP_PROXY_END_EXPIRED, 0, NULL);
            return;
        }
        if (a->info && k->set_info(k->owner, a->info) < 0) {
            k->end(k->owner, APP_PROXY_END_NO_MEMORY, 0, NULL);
            return;
        }
        app_proxy_clock_at(k, a->expire_at);
        break;
    case APP_PROXY_DENY:
        k->end(k->owner, APP_PROXY_END_EXPIRED, 0, NULL);
        break;
    case APP_PROXY_DISCONNECT:
        k->end(k->owner, APP_PROXY_END_DISCONNECT, a->code, a->message);
        break;
    default:
        clock_arm(k, APP_PROXY_REFRESH_RETRY_MS);
        break;
    }
}

/* The expiry the backend gave has come: without --proxy-refresh the
 * owner ends, with it the backend is asked. */
static void clock_due(tern_timer *t, void *user) {
    (void)t;
    app_proxy_clock *k = user;
    if (k->off)
        return;
    if (!app_serve_proxy_on(APP_PROXY_REFRESH)) {
        k->end(k->owner, APP_PROXY_END_EXPIRED, 0, NULL);
        return;
    }
    k->who.user = app_token_conn_sub(*k->auth);
    if (app_serve_proxy_ask(APP_PROXY_REFRESH, &k->who, NULL, 0, NULL, 0, clock_refreshed, NULL))
        clock_arm(k, APP_PROXY_REFRESH_RETRY_MS);   /* busy or out of memory: later */
}

void app_serve_proxy_thread_end(void) {
    while (thread_reqs)
        cancel(thread_reqs);
    app_httpc_free(client);
    client = NULL;
}

void app_serve_proxy_cleanup(void) {
    if (any_on())
        app_httpc_global_cleanup();
}

void app_serve_proxy_stats_get(int kind, app_proxy_stats *out) {
    proxy_kind *k = &kinds[kind];
    *out = (app_proxy_stats){0};
    out->requests = atomic_load_explicit(&k->requests, memory_order_relaxed);
    for (int e = 0; e < APP_PROXY_ERRS; e++)
        out->errors[e] = atomic_load_explicit(&k->errors[e], memory_order_relaxed);
    for (int i = 0; i < APP_PROXY_LATENCY_BUCKETS; i++) {
        out->le_ms[i] = le_ms[i];
        out->below[i] = atomic_load_explicit(&k->below[i], memory_order_relaxed);
    }
    out->count = atomic_load_explicit(&k->count, memory_order_relaxed);
    out->sum_us = atomic_load_explicit(&k->sum_us, memory_order_relaxed);
    out->inflight = atomic_load_explicit(&k->inflight, memory_order_relaxed);
}
