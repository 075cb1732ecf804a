/* HTTP connections driven the way applications drive them: a handler that
 * keeps its request and answers later, a client that leaves meanwhile, and
 * a streamed body that is empty. A real server on the loop, real sockets. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tern/tern.h"

#include "client.h"

static inline int client_send(int port, const char *req) { return client_send_rcvbuf(port, 0, req); }

typedef struct app {
    tern_loop *loop;
    tern_server *srv;
    tern_timer *tick;
    int fd;
    tern_http_req *req;        /* kept by the handler */
    bool with_abort;
    int aborts;
    int ticks, hangup_tick, abort_tick;
    int late_result;           /* what the late respond returned */
    bool in_call;              /* inside our tern_http_read_body call */
    bool half_close;           /* the client leaves with shutdown(SHUT_WR), not close() */
    int body_ends, body_ends_in_call;
    char response[2048];
    size_t response_len;
} app;

static void on_abort(tern_http_req *req, void *user) {
    app *a = user;
    a->aborts++;
    a->abort_tick = a->ticks;
    a->req = NULL;   /* invalid from now on */
}

static void keep_request(tern_http_req *req, void *user) {
    app *a = user;
    a->req = req;
    if (a->with_abort)
        tern_http_on_abort(req, on_abort, a);
}

static void app_start(app *a) {
    memset(a, 0, sizeof(*a));
    a->fd = -1;
    a->late_result = 1;
    assert_int_equal(tern_loop_new(&a->loop, NULL), 0);
    assert_int_equal(tern_server_new(&a->srv, a->loop, NULL), 0);
    assert_int_equal(tern_listen(a->srv, "127.0.0.1", 0, NULL), 0);
}

static void app_finish(app *a) {
    tern_timer_stop(a->tick);
    tern_server_free(a->srv);
    tern_loop_free(a->loop);
    if (a->fd >= 0)
        close(a->fd);
}

static void until_close_tick(tern_timer *t, void *user);

/* ---- the client leaves while the answer is pending -------------------- */

static void leave_tick(tern_timer *t, void *user) {
    app *a = user;
    a->ticks++;
    if (a->ticks > 400) {   /* 2 s: the abort never came */
        tern_loop_stop(a->loop);
        return;
    }
    if (a->hangup_tick == 0 && a->req) {
        if (a->half_close) {
            shutdown(a->fd, SHUT_WR);   /* done asking, still reading (nc -N) */
        } else {
            close(a->fd);               /* gone: a FIN, and a reset for what follows */
            a->fd = -1;
        }
        a->hangup_tick = a->ticks;
        return;
    }
    if (a->with_abort && a->aborts) {
        tern_loop_stop(a->loop);
        return;
    }
    if (a->half_close && a->hangup_tick && a->ticks - a->hangup_tick >= 40) {
        tern_loop_stop(a->loop);   /* 200 ms after the half-close, and no abort */
        return;
    }
    if (!a->with_abort && a->hangup_tick && a->ticks - a->hangup_tick >= 60) {
        /* 300 ms later the handler answers: the client is known gone. */
        a->late_result = tern_http_respond(a->req, 200, "text/plain", "late", 4);
        a->req = NULL;
        tern_loop_stop(a->loop);
    }
}

static void abort_fires_when_the_client_leaves(void **state) {
    app a;
    app_start(&a);
    a.with_abort = true;
    assert_int_equal(tern_http_route(a.srv, "GET", "/slow", keep_request, &a), 0);
    a.fd = client_send(tern_server_port(a.srv), "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_int_equal(tern_timer_start(a.loop, &a.tick, 5, 5, leave_tick, &a), 0);
    assert_int_equal(tern_loop_run(a.loop), 0);
    assert_int_equal(a.aborts, 1);
    /* Within a wheel tick or two of the close (64 ms each: the probe's
     * reset is looked for on the wheel), not when the handler answers. */
    assert_true(a.abort_tick - a.hangup_tick <= 40);
    app_finish(&a);
}

static void late_answer_to_a_client_that_left_fails(void **state) {
    app a;
    app_start(&a);
    assert_int_equal(tern_http_route(a.srv, "GET", "/slow", keep_request, &a), 0);
    a.fd = client_send(tern_server_port(a.srv), "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_int_equal(tern_timer_start(a.loop, &a.tick, 5, 5, leave_tick, &a), 0);
    assert_int_equal(tern_loop_run(a.loop), 0);
    assert_int_equal(a.aborts, 0);
    assert_int_equal(a.late_result, -EPIPE);
    app_finish(&a);
}

/* A half-close is not a departure: the late answer goes out, after an
 * interim 100 (the probe that would have found a closed client). */
static void half_closed_client_gets_its_late_answer(void **state) {
    app a;
    app_start(&a);
    a.with_abort = true;
    a.half_close = true;
    assert_int_equal(tern_http_route(a.srv, "GET", "/slow", keep_request, &a), 0);
    a.fd = client_send(tern_server_port(a.srv), "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n");
    /* No abort comes: leave_tick answers at the 2 s mark instead... */
    assert_int_equal(tern_timer_start(a.loop, &a.tick, 5, 5, leave_tick, &a), 0);
    assert_int_equal(tern_loop_run(a.loop), 0);
    assert_int_equal(a.aborts, 0);
    assert_non_null(a.req);
    assert_int_equal(tern_http_respond(a.req, 200, "text/plain", "late", 4), 0);
    a.req = NULL;
    tern_timer_stop(a.tick);
    a.ticks = 0;
    a.response_len = 0;
    assert_int_equal(tern_timer_start(a.loop, &a.tick, 5, 5, until_close_tick, &a), 0);
    assert_int_equal(tern_loop_run(a.loop), 0);
    assert_true(strncmp(a.response, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n", 42) == 0);
    assert_non_null(strstr(a.response, "\r\n\r\nlate"));
    app_finish(&a);
}

/* ---- a streamed body that is empty ------------------------------------ */

static void body_piece(tern_http_req *req, const char *data, size_t len, bool last, void *user) {
    app *a = user;
    if (a->in_call)
        a->body_ends_in_call++;
    assert_true(last);
    assert_int_equal(len, 0);
    a->body_ends++;
    tern_http_respond(req, 200, "text/plain", "empty", 5);
}

static void read_empty_body(tern_http_req *req, void *user) {
    app *a = user;
    a->in_call = true;
    tern_http_read_body(req, body_piece, a);
    a->in_call = false;
}

static void read_tick(tern_timer *t, void *user) {
    app *a = user;
    ssize_t r = read(a->fd, a->response + a->response_len, sizeof(a->response) - 1 - a->response_len);
    if (r > 0)
        a->response_len += (size_t)r;
    a->response[a->response_len] = '\0';
    if (strstr(a->response, "empty") || ++a->ticks > 400)
        tern_loop_stop(a->loop);
}

static void empty_streamed_body_ends_after_the_call(void **state) {
    app a;
    app_start(&a);
    assert_int_equal(tern_http_route_stream(a.srv, "POST", "/up", read_empty_body, &a), 0);
    a.fd = client_send(tern_server_port(a.srv),
                       "POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
    assert_int_equal(tern_timer_start(a.loop, &a.tick, 5, 5, read_tick, &a), 0);
    assert_int_equal(tern_loop_run(a.loop), 0);
    assert_int_equal(a.body_ends, 1);
    assert_int_equal(a.body_ends_in_call, 0);
    assert_non_null(strstr(a.response, "HTTP/1.1 200"));
    app_finish(&a);
}

/* ---- a whole exchange: one request, the answer up to the close -------- */

static void app_start_opt(app *a, const tern_server_options *opt) {
    memset(a, 0, sizeof(*a));
    a->fd = -1;
    assert_int_equal(tern_loop_new(&a->loop, NULL), 0);
    assert_int_equal(tern_server_new(&a->srv, a->loop, opt), 0);
    assert_int_equal(tern_listen(a->srv, "127.0.0.1", 0, NULL), 0);
}

static void until_close_tick(tern_timer *t, void *user) {
    app *a = user;
    for (;;) {
        ssize_t r = read(a->fd, a->response + a->response_len,
                         sizeof(a->response) - 1 - a->response_len);
        if (r > 0) {
            a->response_len += (size_t)r;
            a->response[a->response_len] = '\0';
            continue;
        }
        if (r == 0 || a->response_len == sizeof(a->response) - 1 || ++a->ticks > 400)
            tern_loop_stop(a->loop);   /* closed, full, or 2 s */
        return;
    }
}

/* Sends req on a fresh connection and reads the answer until the server
 * closes (every request here is refused, or asks for the close). */
static void exchange(app *a, const char *req) {
    if (a->fd >= 0)
        close(a->fd);
    a->response_len = 0;
    a->response[0] = '\0';
    a->ticks = 0;
    a->fd = client_send(tern_server_port(a->srv), req);
    assert_int_equal(tern_timer_start(a->loop, &a->tick, 5, 5, until_close_tick, a), 0);
    assert_int_equal(tern_loop_run(a->loop), 0);
    tern_timer_stop(a->tick);
    a->tick = NULL;
}

/* ---- the server's own answers: the error_page hook --------------------- */

static int pages_called;

static void error_page(int status, const char **ctype, const char **body, size_t *len,
                       void *user) {
    pages_called++;
    assert_string_equal(user, "pages");
    assert_string_equal(*ctype, "text/plain");
    if (status == 413) {
        *ctype = "application/json";
        *body = "{\"error\":\"too big\"}";
        *len = strlen(*body);
    } else if (status == 431) {
        *ctype = "text/html";
        *body = "<h1>headers</h1>";
        *len = strlen(*body);
    } else if (status == 404) {
        *ctype = "text/plain\r\nX-Injected: 1";   /* refused: the default goes */
        *body = "nothing here";
        *len = 12;
    }
}

static void error_pages_replace_the_server_s_own_bodies(void **state) {
    tern_server_options opt = {.max_body = 100, .max_head = 1024, .error_page = error_page,
                               .error_page_user = "pages"};
    app a;
    app_start_opt(&a, &opt);
    pages_called = 0;

    exchange(&a, "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n");
    assert_non_null(strstr(a.response, "HTTP/1.1 413 "));
    assert_non_null(strstr(a.response, "Content-Type: application/json\r\n"));
    assert_non_null(strstr(a.response, "Content-Length: 19\r\n"));
    assert_non_null(strstr(a.response, "\r\n\r\n{\"error\":\"too big\"}"));

    char big[2048];
    snprintf(big, sizeof(big), "GET / HTTP/1.1\r\nHost: x\r\nX-Big: %01500d\r\n\r\n", 0);
    exchange(&a, big);
    assert_non_null(strstr(a.response, "HTTP/1.1 431 "));
    assert_non_null(strstr(a.response, "Content-Type: text/html\r\n"));
    assert_non_null(strstr(a.response, "\r\n\r\n<h1>headers</h1>"));

    /* A route's own 404 (no handler takes it) goes through it too; its
     * bad Content-Type is dropped for the default. */
    exchange(&a, "GET /none HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    assert_non_null(strstr(a.response, "HTTP/1.1 404 "));
    assert_null(strstr(a.response, "X-Injected"));
    assert_non_null(strstr(a.response, "Content-Type: text/plain\r\n"));
    assert_non_null(strstr(a.response, "\r\n\r\nnothing here"));

    /* Statuses the hook leaves alone keep the defaults. */
    exchange(&a, "BAD\x01 / HTTP/1.1\r\n\r\n");
    assert_non_null(strstr(a.response, "HTTP/1.1 400 "));
    assert_non_null(strstr(a.response, "\r\n\r\nBad Request\n"));
    assert_int_equal(pages_called, 4);
    app_finish(&a);
}

/* ---- route parameters, decoded and raw ---------------------------------- */

static void echo_params(tern_http_req *req, void *user) {
    size_t nl = 0, rl = 0, sl = 0, srl = 0;
    const char *n = tern_http_param(req, "name", &nl);
    const char *r = tern_http_param_raw(req, "name", &rl);
    const char *st = tern_http_param(req, "*", &sl);
    const char *sr = tern_http_param_raw(req, "*", &srl);
    int64_t id = -1;
    if (tern_http_param_int(req, "name", &id) < 0)
        id = -1;   /* not a number: shown as such */
    char b[256];
    int len = snprintf(b, sizeof(b), "dec=[%.*s] raw=[%.*s] rest=[%.*s] rawrest=[%.*s] int=%lld%s",
                       (int)nl, n, (int)rl, r, (int)sl, st, (int)srl, sr, (long long)id,
                       tern_http_param(req, "name", NULL) || tern_http_param_raw(req, "name", NULL)
                           ? " NULL-len-gave-a-view" : "");
    tern_http_respond(req, 200, "text/plain", b, (size_t)len);
}

static void route_parameters_are_decoded(void **state) {
    app a;
    app_start_opt(&a, NULL);
    assert_int_equal(tern_http_route(a.srv, "GET", "/u/:name/*", echo_params, &a), 0);
    exchange(&a, "GET /u/a%20b%2Fc/x%41+y%2f HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    assert_non_null(strstr(a.response, "HTTP/1.1 200 "));
    assert_non_null(strstr(a.response, "dec=[a b/c] raw=[a%20b%2Fc] rest=[xA+y/] "
                                       "rawrest=[x%41+y%2f] int=-1\0"));
    assert_null(strstr(a.response, "NULL-len"));
    exchange(&a, "GET /u/%31%32/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    assert_non_null(strstr(a.response, "dec=[12] raw=[%31%32] rest=[] rawrest=[] int=12"));
    /* Escapes that do not decode, or decode to a NUL: 400, no handler. */
    const char *bad[] = {"/u/%zz/x", "/u/%4/x", "/u/ok/%4", "/u/a%00/x", "/u/ok/x%"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char req[128];
        snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                 bad[i]);
        exchange(&a, req);
        assert_non_null(strstr(a.response, "HTTP/1.1 400 "));
        assert_null(strstr(a.response, "dec="));
    }
    app_finish(&a);
}

/* ---- the server's own answers: methods, and their debug lines ---------- */

static char log_text[4096];

static void collect_log(int level, const char *msg, void *user) {
    size_t n = strlen(log_text);
    snprintf(log_text + n, sizeof(log_text) - n, "%d %s\n", level, msg);
}

static void answer_name(tern_http_req *req, void *user) {
    tern_http_respond(req, 200, "text/plain", user, strlen(user));
}

#define CLOSE_REQ(m, p) m " " p " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"

/* RFC 9110: 501 for a method the server does not recognise (§15.6.2): not
 * one of §9's (nor PATCH) and no route's; 405 with Allow for a path that
 * has routes for other methods (§15.5.6); 404 otherwise, also for a
 * standard method no route has. Each is a debug line (logging.md: every
 * refusal before a handler), naming method and path, not the query. */
static void own_answers_by_method_and_their_log_lines(void **state) {
    app a;
    app_start_opt(&a, NULL);
    assert_int_equal(tern_http_route(a.srv, "GET", "/r", answer_name, "r"), 0);
    log_text[0] = '\0';
    assert_int_equal(tern_set_log(TERN_LOG_DEBUG, collect_log, NULL), 0);

    /* Four lines: under the log's 10 a second for one kind. */
    exchange(&a, CLOSE_REQ("GET", "/none?token=secret"));
    assert_non_null(strstr(a.response, "HTTP/1.1 404 "));
    exchange(&a, CLOSE_REQ("PUT", "/r"));
    assert_non_null(strstr(a.response, "HTTP/1.1 405 "));
    exchange(&a, CLOSE_REQ("BREW", "/r"));
    assert_non_null(strstr(a.response, "HTTP/1.1 501 "));
    exchange(&a, CLOSE_REQ("BREW", "/none"));
    assert_non_null(strstr(a.response, "HTTP/1.1 501 "));
    assert_non_null(strstr(log_text, "3 http: 404 Not Found for GET /none to 127.0.0.1:"));
    assert_null(strstr(log_text, "secret"));
    assert_non_null(strstr(log_text, "3 http: 405 Method Not Allowed for PUT /r to 127.0.0.1:"));
    assert_non_null(strstr(log_text, "3 http: 501 Not Implemented for BREW /r to 127.0.0.1:"));
    assert_non_null(strstr(log_text, "3 http: 501 Not Implemented for BREW /none to 127.0.0.1:"));
    assert_int_equal(tern_set_log(TERN_LOG_DEBUG, NULL, NULL), 0);

    const char *std[] = {"PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "POST"};
    for (size_t i = 0; i < sizeof(std) / sizeof(std[0]); i++) {
        char req[128];
        snprintf(req, sizeof(req), CLOSE_REQ("%s", "/none"), std[i]);
        exchange(&a, req);
        assert_non_null(strstr(a.response, "HTTP/1.1 404 "));
        snprintf(req, sizeof(req), CLOSE_REQ("%s", "/r"), std[i]);
        exchange(&a, req);
        assert_non_null(strstr(a.response, "HTTP/1.1 405 "));
        assert_non_null(strstr(a.response, "\r\nAllow: GET, HEAD\r\n"));
    }

    /* A method some route has is implemented: elsewhere it is 404 or 405. */
    assert_int_equal(tern_http_route(a.srv, "BREW", "/pot", answer_name, "pot"), 0);
    exchange(&a, CLOSE_REQ("BREW", "/none"));
    assert_non_null(strstr(a.response, "HTTP/1.1 404 "));
    exchange(&a, CLOSE_REQ("BREW", "/r"));
    assert_non_null(strstr(a.response, "HTTP/1.1 405 "));
    assert_non_null(strstr(a.response, "\r\nAllow: GET, HEAD\r\n"));
    /* So does every method, once an any-method route exists. */
    exchange(&a, CLOSE_REQ("QUUX", "/none"));
    assert_non_null(strstr(a.response, "HTTP/1.1 501 "));
    assert_int_equal(tern_http_route(a.srv, NULL, "/any", answer_name, "any"), 0);
    exchange(&a, CLOSE_REQ("QUUX", "/none"));
    assert_non_null(strstr(a.response, "HTTP/1.1 404 "));
    exchange(&a, CLOSE_REQ("QUUX", "/any"));
    assert_non_null(strstr(a.response, "\r\n\r\nany"));
    app_finish(&a);
}

/* ---- one loop, several servers ------------------------------------------ */

static void one_loop_carries_several_servers(void **state) {
    app a;
    app_start_opt(&a, NULL);
    tern_server *one = a.srv, *two;
    assert_int_equal(tern_server_new(&two, a.loop, NULL), 0);
    assert_int_equal(tern_listen(two, "127.0.0.1", 0, NULL), 0);
    assert_int_equal(tern_http_route(one, "GET", "/a", answer_name, "one"), 0);
    assert_int_equal(tern_http_route(two, "GET", "/b", answer_name, "two"), 0);
    assert_int_not_equal(tern_server_port(one), tern_server_port(two));

    exchange(&a, CLOSE_REQ("GET", "/a"));
    assert_non_null(strstr(a.response, "HTTP/1.1 200 "));
    assert_non_null(strstr(a.response, "\r\n\r\none"));
    exchange(&a, CLOSE_REQ("GET", "/b"));   /* each has its own routes */
    assert_non_null(strstr(a.response, "HTTP/1.1 404 "));
    a.srv = two;
    exchange(&a, CLOSE_REQ("GET", "/b"));
    assert_non_null(strstr(a.response, "\r\n\r\ntwo"));
    exchange(&a, CLOSE_REQ("GET", "/a"));
    assert_non_null(strstr(a.response, "HTTP/1.1 404 "));
    a.srv = one;
    tern_server_free(two);
    /* The other goes on serving. */
    exchange(&a, CLOSE_REQ("GET", "/a"));
    assert_non_null(strstr(a.response, "\r\n\r\none"));
    app_finish(&a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(abort_fires_when_the_client_leaves),
        cmocka_unit_test(late_answer_to_a_client_that_left_fails),
        cmocka_unit_test(half_closed_client_gets_its_late_answer),
        cmocka_unit_test(empty_streamed_body_ends_after_the_call),
        cmocka_unit_test(error_pages_replace_the_server_s_own_bodies),
        cmocka_unit_test(route_parameters_are_decoded),
        cmocka_unit_test(own_answers_by_method_and_their_log_lines),
        cmocka_unit_test(one_loop_carries_several_servers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
