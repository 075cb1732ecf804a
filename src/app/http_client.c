/* An HTTP client on a loop (http_client.h): libcurl's multi interface.
 *
 * curl says which sockets it waits on (on_socket) and when it next needs
 * the time (on_timer_set); the loop's watchers (on_io) and one timer
 * (on_timer) tell it what happened through curl_multi_socket_action.
 * Finished requests are read after that call has returned (finish), so
 * their done callbacks run outside every curl callback and may start or
 * cancel requests, or close the connections they answer. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "app/http_client.h"
#include "loop/loop.h"

typedef struct httpc_sock httpc_sock;

/* Invariants: multi is live; timer, when not NULL, is armed at curl's
 * next timeout or idle (curl asked for none since it fired); socks holds
 * a watcher for each socket curl has open (kept connections too). */
struct app_httpc {
    tern_loop *loop;
    CURLM *multi;
    tern_timer *timer;
    httpc_sock *socks;
    struct curl_slist *headers;   /* Content-Type: application/json, every request's */
};

/* Invariants: easy is in c->multi from app_httpc_post until finish or
 * app_httpc_cancel take it out and free the request; body holds what has
 * come of the answer, at most APP_HTTPC_BODY_MAX bytes. */
struct app_httpc_req {
    app_httpc *c;
    CURL *easy;
    app_httpc_done done;
    void *user;
    char *body;
    size_t len, cap;
    bool too_big;
    uint64_t start_ms;
    char why[CURL_ERROR_SIZE];
};

/* A socket curl has open, as a loop watcher (curl_multi_assign'ed to it). */
struct httpc_sock {
    tern__io io;
    app_httpc *c;
    httpc_sock *next;
};

/* Stops watching s and forgets it: curl's socket goes on without it. */
static void sock_drop(app_httpc *c, httpc_sock *s) {
    httpc_sock **link = &c->socks;
    while (*link != s)
        link = &(*link)->next;
    *link = s->next;
    tern__io_set(c->loop, &s->io, 0);
    curl_multi_assign(c->multi, s->io.fd, NULL);
    free(s);
}

static void finish(app_httpc *c);

static void on_io(tern__io *io, uint32_t revents) {
    httpc_sock *s = tern__container_of(io, httpc_sock, io);
    app_httpc *c = s->c;
    int fd = io->fd;   /* s may be freed inside the call below (CURL_POLL_REMOVE) */
    int mask = 0;
    if (revents & (TERN__IO_IN | TERN__IO_HUP | TERN__IO_RDHUP))
        mask |= CURL_CSELECT_IN;
    if (revents & TERN__IO_OUT)
        mask |= CURL_CSELECT_OUT;
    if (revents & TERN__IO_ERR)
        mask |= CURL_CSELECT_ERR;
    int running;
    curl_multi_socket_action(c->multi, fd, mask, &running);
    finish(c);
}

/* curl opened a socket, changed what it waits for, or is about to close
 * it (CURL_POLL_REMOVE, before its close). */
static int on_socket(CURL *easy, curl_socket_t fd, int what, void *cp, void *sp) {
    (void)easy;
    app_httpc *c = cp;
    httpc_sock *s = sp;
    if (what == CURL_POLL_REMOVE) {
        if (s)
            sock_drop(c, s);
        return 0;
    }
    if (s == NULL) {
        if ((s = calloc(1, sizeof(*s))) == NULL)
            return -1;   /* curl fails the transfer */
        tern__io_init(&s->io, fd, on_io);
        s->c = c;
        s->next = c->socks;
        c->socks = s;
        curl_multi_assign(c->multi, fd, s);
    }
    uint32_t ev = (what & CURL_POLL_IN ? TERN__IO_IN : 0) | (what & CURL_POLL_OUT ? TERN__IO_OUT : 0);
    return tern__io_set(c->loop, &s->io, ev) < 0 ? -1 : 0;
}

static void on_timer(tern_timer *t, void *user) {
    (void)t;
    app_httpc *c = user;
    int running;
    curl_multi_socket_action(c->multi, CURL_SOCKET_TIMEOUT, 0, &running);
    finish(c);
}

/* curl's next timeout: ms from now, or -1 for none. Never acts itself:
 * curl is not to be driven from inside its own callback. */
static int on_timer_set(CURLM *multi, long ms, void *user) {
    (void)multi;
    app_httpc *c = user;
    if (ms < 0) {
        if (c->timer) {
            tern_timer_stop(c->timer);
            c->timer = NULL;
        }
        return 0;
    }
    if (c->timer)
        return tern_timer_again(c->timer, (uint64_t)ms) < 0 ? -1 : 0;
    return tern_timer_start(c->loop, &c->timer, (uint64_t)ms, 0, on_timer, c) < 0 ? -1 : 0;
}

static size_t on_body(char *p, size_t size, size_t n, void *user) {
    app_httpc_req *r = user;
    size_t len = size * n;
    if (r->len + len > APP_HTTPC_BODY_MAX) {
        r->too_big = true;
        return 0;   /* curl ends the transfer (CURLE_WRITE_ERROR) */
    }
    if (r->len + len > r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 1024;
        while (cap < r->len + len)
            cap *= 2;
        char *b = realloc(r->body, cap);
        if (b == NULL)
            return 0;
        r->body = b;
        r->cap = cap;
    }
    memcpy(r->body + r->len, p, len);
    r->len += len;
    return len;
}

static void req_free(app_httpc_req *r) {
    curl_multi_remove_handle(r->c->multi, r->easy);
    curl_easy_cleanup(r->easy);
    free(r->body);
    free(r);
}

/* The requests curl has finished: each one's done, then it goes. */
static void finish(app_httpc *c) {
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(c->multi, &left))) {
        if (m->msg != CURLMSG_DONE)
            continue;
        app_httpc_req *r = NULL;
        curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&r);
        CURLcode code = m->data.result;
        curl_multi_remove_handle(c->multi, r->easy);
        app_httpc_result res = {.outcome = APP_HTTPC_OK, .body = r->body, .len = r->len,
                                .us = (tern_loop_now(c->loop) - r->start_ms) * 1000};
        if (code == CURLE_OPERATION_TIMEDOUT) {
            res.outcome = APP_HTTPC_TIMEOUT;
            res.why = "timed out";
        } else if (code != CURLE_OK) {
            res.outcome = APP_HTTPC_FAILED;
            res.why = r->too_big ? "answer too big" : r->why[0] ? r->why : curl_easy_strerror(code);
        } else
            curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &res.status);
        r->done(r->user, &res);
        req_free(r);
    }
}

app_httpc *app_httpc_new(tern_loop *loop) {
    app_httpc *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->loop = loop;
    c->multi = curl_multi_init();
    c->headers = curl_slist_append(NULL, "Content-Type: application/json");
    if (c->multi == NULL || c->headers == NULL) {
        app_httpc_free(c);
        return NULL;
    }
    curl_multi_setopt(c->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
    curl_multi_setopt(c->multi, CURLMOPT_SOCKETDATA, c);
    curl_multi_setopt(c->multi, CURLMOPT_TIMERFUNCTION, on_timer_set);
    curl_multi_setopt(c->multi, CURLMOPT_TIMERDATA, c);
    return c;
}

void app_httpc_free(app_httpc *c) {
    if (c == NULL)
        return;
    /* The watchers go before curl closes the kept connections' sockets
     * (it need not say so through on_socket while cleaning up). */
    while (c->socks)
        sock_drop(c, c->socks);
    if (c->multi)
        curl_multi_cleanup(c->multi);
    if (c->timer)
        tern_timer_stop(c->timer);
    curl_slist_free_all(c->headers);
    free(c);
}

app_httpc_req *app_httpc_post(app_httpc *c, const char *url, const char *body, size_t len,
                              uint32_t timeout_ms, app_httpc_done done, void *user) {
    app_httpc_req *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return NULL;
    *r = (app_httpc_req){.c = c, .done = done, .user = user, .start_ms = tern_loop_now(c->loop)};
    if ((r->easy = curl_easy_init()) == NULL) {
        free(r);
        return NULL;
    }
    CURL *e = r->easy;
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, c->headers);
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE, (long)len);
    curl_easy_setopt(e, CURLOPT_COPYPOSTFIELDS, body);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, r->why);
    curl_easy_setopt(e, CURLOPT_PRIVATE, r);
    /* Adding only arms the timer (at 0 ms): the request starts from the
     * loop, and done is never called from inside this function. */
    if (curl_multi_add_handle(c->multi, e) != CURLM_OK) {
        curl_easy_cleanup(e);
        free(r);
        return NULL;
    }
    return r;
}

void app_httpc_cancel(app_httpc_req *r) {
    if (r)
        req_free(r);
}

int app_httpc_global_init(void) {
    return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK ? 0 : -1;
}

void app_httpc_global_cleanup(void) {
    curl_global_cleanup();
}
