/* Misuse of the API (issue #25, items 6 and 7): what every build answers
 * (a nested run, a loop freed while busy, an unref past zero, a response
 * from another thread, a server freed in its own handler), and, in the
 * checked build (TERN_CHECKED), that the misuse it asserts on aborts with
 * the call's name on stderr. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "tern/tern.h"
#include "client.h"

/* ---- a nested run ----------------------------------------------------- */

static int nested_rc = 1;
static tern_loop *other;

static void run_inside(tern_timer *t, void *user) {
    tern_loop *loop = user;
    nested_rc = tern_loop_run(loop);              /* the same loop */
    assert_int_equal(tern_loop_run(other), -EBUSY); /* another, same thread */
    tern_loop_stop(loop);
}

static void nested_run_is_ebusy(void **state) {
    tern_loop *loop;
    tern_timer *t;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    assert_int_equal(tern_loop_new(&other, NULL), 0);
    assert_int_equal(tern_timer_start(loop, &t, 0, 0, run_inside, loop), 0);
    assert_int_equal(tern_loop_run(loop), 0);
    assert_int_equal(nested_rc, -EBUSY);
    tern_timer_stop(t);
    /* Not running any more: runs again (and stops at once). */
    tern_loop_stop(other);
    assert_int_equal(tern_loop_free(other), 0);
    assert_int_equal(tern_loop_free(loop), 0);
}

/* ---- tern_loop_free while busy ----------------------------------------- */

static void loop_free_with_server_is_ebusy(void **state) {
    tern_loop *loop;
    tern_server *srv;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    assert_int_equal(tern_server_new(&srv, loop, NULL), 0);
    assert_int_equal(tern_listen(srv, "127.0.0.1", 0, NULL), 0);
    assert_int_equal(tern_loop_free(loop), -EBUSY);
    /* Still whole: the server can be freed, then the loop. */
    assert_int_equal(tern_server_port(srv) > 0, 1);
    tern_server_free(srv);
    assert_int_equal(tern_loop_free(loop), 0);
    assert_int_equal(tern_loop_free(NULL), 0);
}

static int free_in_run_rc = 1;
static void free_inside(tern_timer *t, void *user) {
    free_in_run_rc = tern_loop_free(user);
    tern_loop_stop(user);
}

static void loop_free_inside_run_is_ebusy(void **state) {
    tern_loop *loop;
    tern_timer *t;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    assert_int_equal(tern_timer_start(loop, &t, 0, 0, free_inside, loop), 0);
    assert_int_equal(tern_loop_run(loop), 0);
    assert_int_equal(free_in_run_rc, -EBUSY);
    tern_timer_stop(t);
    assert_int_equal(tern_loop_free(loop), 0);
}

/* ---- tern_ws_unref past zero ------------------------------------------- */

static int opened, echoed, closed;

static void ws_open(tern_ws *ws, void *user) {
    opened++;
    tern_ws_unref(ws);   /* no matching ref: must be ignored */
    tern_ws_unref(ws);
}

static void ws_message(tern_ws *ws, const char *data, size_t len, int opcode, void *user) {
    if (tern_ws_send(ws, data, len, opcode) >= 0)
        echoed++;
    tern_loop_stop(user);
}

static void ws_closed(tern_ws *ws, int code, const char *reason, size_t len, void *user) {
    closed++;
}

static void give_up(tern_timer *t, void *user) { tern_loop_stop(user); }

/* A masked text frame from the client ("hi"). */
static void send_frame(int fd) {
    const unsigned char f[] = {0x81, 0x82, 1, 2, 3, 4, 'h' ^ 1, 'i' ^ 2};
    assert_int_equal(write(fd, f, sizeof(f)), (ssize_t)sizeof(f));
}

#ifndef TERN_CHECKED   /* there it aborts: checked_aborts_name_the_call */
static void unref_past_zero_keeps_connection(void **state) {
    tern_loop *loop;
    tern_server *srv;
    tern_timer *t;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    assert_int_equal(tern_server_new(&srv, loop, NULL), 0);
    tern_ws_handlers h = {.on_open = ws_open, .on_message = ws_message, .on_close = ws_closed};
    assert_int_equal(tern_ws_route(srv, "/ws", &h, NULL, loop), 0);
    assert_int_equal(tern_listen(srv, "127.0.0.1", 0, NULL), 0);
    int fd = client_open(tern_server_port(srv), 0);
    send_frame(fd);
    assert_int_equal(tern_timer_start(loop, &t, 2000, 0, give_up, loop), 0);
    assert_int_equal(tern_loop_run(loop), 0);
    assert_int_equal(opened, 1);
    assert_int_equal(echoed, 1);   /* the connection was still there */
    assert_int_equal(closed, 0);
    close(fd);
    tern_timer_stop(t);
    tern_server_free(srv);
    assert_int_equal(closed, 1);
    assert_int_equal(tern_loop_free(loop), 0);
}
#endif

/* ---- a response from another thread ------------------------------------ */

#ifndef TERN_CHECKED   /* there it aborts, as tern_timer_start's below */
static int thread_rc = 1;
static tern_http_req *held;

static void *respond_elsewhere(void *arg) {
    thread_rc = tern_http_respond(held, 200, "text/plain", "x", 1);
    return NULL;
}

static void answer_later(tern_timer *t, void *user) {
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, respond_elsewhere, NULL), 0);
    pthread_join(th, NULL);
    /* Refused, and nothing was sent: the loop's thread may still answer. */
    assert_int_equal(tern_http_respond(held, 204, NULL, NULL, 0), 0);
    tern_loop_stop(user);
}

static tern_timer *later;
static void keep_handler(tern_http_req *req, void *user) {
    held = req;
    assert_int_equal(tern_timer_start(user, &later, 0, 0, answer_later, user), 0);
}

static void respond_from_other_thread_is_eperm(void **state) {
    tern_loop *loop;
    tern_server *srv;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    assert_int_equal(tern_server_new(&srv, loop, NULL), 0);
    assert_int_equal(tern_http_route(srv, "GET", "/", keep_handler, loop), 0);
    assert_int_equal(tern_listen(srv, "127.0.0.1", 0, NULL), 0);
    int fd = client_send_rcvbuf(tern_server_port(srv), 0, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_int_equal(tern_loop_run(loop), 0);
    assert_int_equal(thread_rc, -EPERM);
    tern_timer_stop(later);
    close(fd);
    tern_server_free(srv);
    assert_int_equal(tern_loop_free(loop), 0);
}

#endif

/* ---- tern_server_free in its own handler --------------------------------- */

static tern_server *self_srv;
static int self_freed;

static void free_self(tern_http_req *req, void *user) {
    tern_http_respond(req, 200, "text/plain", "bye", 3);
    tern_server_free(self_srv);
    self_freed++;
    tern_loop_stop(user);
}

static void server_free_in_handler(void **state) {
    tern_loop *loop;
    tern_timer *t;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    assert_int_equal(tern_server_new(&self_srv, loop, NULL), 0);
    assert_int_equal(tern_http_route(self_srv, "GET", "/", free_self, loop), 0);
    assert_int_equal(tern_listen(self_srv, "127.0.0.1", 0, NULL), 0);
    int fd = client_send_rcvbuf(tern_server_port(self_srv), 0,
                                "GET / HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_int_equal(tern_timer_start(loop, &t, 2000, 0, give_up, loop), 0);
    assert_int_equal(tern_loop_run(loop), 0);
    assert_int_equal(self_freed, 1);   /* the pipelined second request never ran */
    tern_timer_stop(t);
    close(fd);
    /* The server is gone: nothing holds the loop (the leak checker of
     * the sanitizer build sees what the request held). */
    assert_int_equal(tern_loop_free(loop), 0);
}

/* The handler frees its server and returns without an answer: the request
 * ends with the handler (its abort callback told then, not inside
 * tern_server_free), the client sees a clean close (a FIN, no reset), and
 * nothing of the request is left (the sanitizer build's leak checker). */
static int abort_calls, abort_calls_in_free;

static void count_abort(tern_http_req *req, void *user) { abort_calls++; }

static void free_self_unanswered(tern_http_req *req, void *user) {
    if (user)
        tern_http_on_abort(req, count_abort, NULL);
    tern_server_free(self_srv);
    abort_calls_in_free = abort_calls;
    self_freed++;
}

static void quiet_stop(tern_timer *t, void *user) { tern_loop_stop(user); }

static void free_unanswered(bool with_abort) {
    tern_loop *loop;
    tern_timer *t;
    self_freed = abort_calls = 0;
    abort_calls_in_free = -1;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    assert_int_equal(tern_server_new(&self_srv, loop, NULL), 0);
    assert_int_equal(tern_http_route(self_srv, "GET", "/", free_self_unanswered,
                                     with_abort ? loop : NULL), 0);
    assert_int_equal(tern_listen(self_srv, "127.0.0.1", 0, NULL), 0);
    int fd = client_send_rcvbuf(tern_server_port(self_srv), 0, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    /* Runs on after the free, so that what the iteration's end does is done. */
    assert_int_equal(tern_timer_start(loop, &t, 200, 0, quiet_stop, loop), 0);
    assert_int_equal(tern_loop_run(loop), 0);
    tern_timer_stop(t);
    assert_int_equal(self_freed, 1);
    assert_int_equal(abort_calls_in_free, 0);
    assert_int_equal(abort_calls, with_abort ? 1 : 0);
    fcntl(fd, F_SETFL, 0);
    char buf[64];
    assert_int_equal(read(fd, buf, sizeof(buf)), 0);   /* closed: no bytes, no reset */
    close(fd);
    assert_int_equal(tern_loop_free(loop), 0);
}

static void server_free_in_handler_unanswered(void **state) { free_unanswered(false); }
static void server_free_in_handler_unanswered_abort(void **state) { free_unanswered(true); }

/* ---- the checked build's assertions -------------------------------------- */

#ifdef TERN_CHECKED
/* Runs fn in a child; the child must abort, its stderr naming call. */
static void expect_abort(void (*fn)(void), const char *call) {
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(pipefd[1], 2);
        close(pipefd[0]);
        fn();
        _exit(0);   /* no abort: the parent fails */
    }
    close(pipefd[1]);
    char buf[4096];
    size_t n = 0;
    ssize_t r;
    while (n < sizeof(buf) - 1 && (r = read(pipefd[0], buf + n, sizeof(buf) - 1 - n)) > 0)
        n += (size_t)r;
    buf[n] = '\0';
    close(pipefd[0]);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGABRT)
        fail_msg("%s: the child did not abort (status %d); stderr: %s", call, status, buf);
    char want[128];
    snprintf(want, sizeof(want), "tern: %s:", call);
    if (strstr(buf, want) == NULL)
        fail_msg("stderr does not name %s: %s", call, buf);
}

/* In a child: a call that sets up the misuse and fails ends the child
 * without the abort the parent waits for, so the parent fails, naming the
 * call it expected. */
static void must(int r) {
    if (r < 0)
        _exit(3);
}

static void twice_timer_stop(void) {
    tern_loop *loop;
    tern_timer *t;
    must(tern_loop_new(&loop, NULL));
    must(tern_timer_start(loop, &t, 1000, 0, give_up, loop));
    tern_timer_stop(t);
    tern_timer_stop(t);
}

static void twice_prepared_free(void) {
    tern_ws_prepared *m = tern_ws_prepare("x", 1, TERN_WS_TEXT, false);
    tern_ws_prepared_free(m);
    tern_ws_prepared_free(m);
}

static void twice_server_free(void) {
    tern_loop *loop;
    tern_server *srv;
    must(tern_loop_new(&loop, NULL));
    must(tern_server_new(&srv, loop, NULL));
    tern_server_free(srv);
    tern_server_free(srv);
}

static void unref_past_zero(void) {
    /* Needs no connection: the count is checked before anything else. */
    tern_loop *loop;
    tern_server *srv;
    tern_timer *t;
    must(tern_loop_new(&loop, NULL));
    must(tern_server_new(&srv, loop, NULL));
    tern_ws_handlers h = {.on_open = ws_open, .on_message = ws_message, .on_close = ws_closed};
    must(tern_ws_route(srv, "/ws", &h, NULL, loop));
    must(tern_listen(srv, "127.0.0.1", 0, NULL));
    int fd = client_open(tern_server_port(srv), 0);
    send_frame(fd);
    must(tern_timer_start(loop, &t, 2000, 0, give_up, loop));
    must(tern_loop_run(loop));
}

static void *timer_elsewhere(void *arg) {
    tern_timer *t;
    must(tern_timer_start(arg, &t, 1000, 0, give_up, arg));
    return NULL;
}
static void start_on_other_thread(tern_timer *t, void *user) {
    pthread_t th;
    pthread_create(&th, NULL, timer_elsewhere, user);
    pthread_join(th, NULL);
}
static void wrong_thread_timer(void) {
    tern_loop *loop;
    tern_timer *t;
    must(tern_loop_new(&loop, NULL));
    must(tern_timer_start(loop, &t, 0, 0, start_on_other_thread, loop));
    must(tern_loop_run(loop));
}

static void checked_aborts_name_the_call(void **state) {
    expect_abort(twice_timer_stop, "tern_timer_stop");
    expect_abort(twice_prepared_free, "tern_ws_prepared_free");
    expect_abort(twice_server_free, "tern_server_free");
    expect_abort(unref_past_zero, "tern_ws_unref");
    expect_abort(wrong_thread_timer, "tern_timer_start");
}
#endif

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(nested_run_is_ebusy),
        cmocka_unit_test(loop_free_with_server_is_ebusy),
        cmocka_unit_test(loop_free_inside_run_is_ebusy),
#ifndef TERN_CHECKED
        /* The checked build aborts on these (tested below). */
        cmocka_unit_test(unref_past_zero_keeps_connection),
        cmocka_unit_test(respond_from_other_thread_is_eperm),
#endif
        cmocka_unit_test(server_free_in_handler),
        cmocka_unit_test(server_free_in_handler_unanswered),
        cmocka_unit_test(server_free_in_handler_unanswered_abort),
#ifdef TERN_CHECKED
        cmocka_unit_test(checked_aborts_name_the_call),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
