/* Who frees the per-connection data on_upgrade sets (issue #25): a real
 * server on the loop, raw sockets as clients, every handler allocating in
 * on_upgrade and freeing where ws.h says, under ASan's leak check.
 *
 * Checked here: an upgrade on_upgrade refuses hands its conn_user to
 * on_upgrade_failed with the status answered (and an out-of-range status
 * is answered 403); one that fails after on_upgrade accepted (a 101 that
 * cannot be built: a 1000-byte subprotocol) hands it back with 500; one
 * that succeeds goes to on_open and on_close and never to
 * on_upgrade_failed. In no case do on_open or on_close see a connection
 * that did not open. A route without on_upgrade_failed drops conn_user on
 * a refusal: the checked build says so once, naming the route. Headers
 * on_upgrade adds go out in the 101, after the handshake's own, short
 * ones and long ones alike. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tern/tern.h"

#include "client.h"

typedef struct app {
    tern_loop *loop;
    tern_server *srv;
    tern_timer *tick;
    int refuse;              /* what on_upgrade returns */
    bool add_headers;        /* on_upgrade adds two headers */
    int upgrades, opened, closed, failed;
    int failed_status;
    void *failed_user;       /* what on_upgrade_failed got, compared only */
    void *last_alloc;        /* what on_upgrade set last */
    int fd;
    char head[4096];         /* what the client read */
    size_t nhead;
    int ticks;
} app;

static int on_upgrade(tern_http_req *req, void **conn_user, void *user) {
    app *a = user;
    a->upgrades++;
    if (a->add_headers) {
        char long_value[301];
        memset(long_value, 'v', 300);
        long_value[300] = '\0';
        assert_int_equal(tern_http_add_header(req, "Set-Cookie", "s=1"), 0);
        assert_int_equal(tern_http_add_header(req, "X-Long", long_value), 0);
    }
    char *data = malloc(64);
    assert_non_null(data);
    snprintf(data, 64, "conn %d", a->upgrades);
    *conn_user = data;
    a->last_alloc = data;
    return a->refuse;
}

static void on_open(tern_ws *ws, void *user) {
    app *a = user;
    a->opened++;
    assert_ptr_equal(tern_ws_user(ws), a->last_alloc);
}

static void on_close(tern_ws *ws, int code, const char *reason, size_t reason_len, void *user) {
    app *a = user;
    (void)code, (void)reason, (void)reason_len;
    a->closed++;
    free(tern_ws_user(ws));
}

static void on_upgrade_failed(void *conn_user, int status, void *user) {
    app *a = user;
    a->failed++;
    a->failed_status = status;
    a->failed_user = conn_user;
    free(conn_user);
}

static const tern_ws_handlers handlers = {.on_upgrade = on_upgrade,
                                          .on_open = on_open,
                                          .on_close = on_close,
                                          .on_upgrade_failed = on_upgrade_failed};

/* Reads what the server answered until the head is whole (or 2 s). */
static void tick(tern_timer *t, void *user) {
    app *a = user;
    (void)t;
    ssize_t r = read(a->fd, a->head + a->nhead, sizeof(a->head) - 1 - a->nhead);
    if (r > 0)
        a->nhead += (size_t)r;
    a->head[a->nhead] = '\0';
    if (strstr(a->head, "\r\n\r\n") || ++a->ticks > 400)
        tern_loop_stop(a->loop);
}

static void start(app *a, int refuse, const tern_ws_options *wo) {
    memset(a, 0, sizeof(*a));
    a->refuse = refuse;
    assert_int_equal(tern_loop_new(&a->loop, NULL), 0);
    assert_int_equal(tern_server_new(&a->srv, a->loop, NULL), 0);
    assert_int_equal(tern_ws_route(a->srv, "/ws", &handlers, wo, a), 0);
    assert_int_equal(tern_listen(a->srv, "127.0.0.1", 0, NULL), 0);
}

/* Sends req and runs the loop until the answer's head came. */
static void exchange(app *a, const char *req) {
    a->fd = client_send_rcvbuf(tern_server_port(a->srv), 0, req);
    assert_int_equal(tern_timer_start(a->loop, &a->tick, 5, 5, tick, a), 0);
    assert_int_equal(tern_loop_run(a->loop), 0);
    tern_timer_stop(a->tick);
}

static void finish(app *a) {
    tern_server_free(a->srv);
    tern_loop_free(a->loop);
    close(a->fd);
}

#define UPGRADE_HEAD                                                                          \
    "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"          \
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"

static void a_refused_upgrade_hands_conn_user_to_on_upgrade_failed(void **state) {
    (void)state;
    app a;
    start(&a, 401, NULL);
    exchange(&a, UPGRADE_HEAD "\r\n");
    assert_non_null(strstr(a.head, "HTTP/1.1 401"));
    assert_int_equal(a.upgrades, 1);
    assert_int_equal(a.failed, 1);
    assert_int_equal(a.failed_status, 401);
    assert_ptr_equal(a.failed_user, a.last_alloc);
    assert_int_equal(a.opened, 0);
    finish(&a);
    assert_int_equal(a.closed, 0);
}

static void a_refusal_out_of_range_is_403_and_still_hands_it_back(void **state) {
    (void)state;
    app a;
    start(&a, 42, NULL);
    exchange(&a, UPGRADE_HEAD "\r\n");
    assert_non_null(strstr(a.head, "HTTP/1.1 403"));
    assert_int_equal(a.failed, 1);
    assert_int_equal(a.failed_status, 403);
    finish(&a);
    assert_int_equal(a.opened + a.closed, 0);
}

/* A subprotocol longer than the 101's buffer: the upgrade fails after
 * on_upgrade accepted it, with a 500. */
static void an_upgrade_failing_after_acceptance_hands_it_back_with_500(void **state) {
    (void)state;
    static char proto[1001];
    memset(proto, 'p', sizeof(proto) - 1);
    const char *protos[] = {proto, NULL};
    tern_ws_options wo = {.subprotocols = protos};
    app a;
    start(&a, 0, &wo);
    static char req[2048];
    snprintf(req, sizeof(req), UPGRADE_HEAD "Sec-WebSocket-Protocol: %s\r\n\r\n", proto);
    exchange(&a, req);
    assert_non_null(strstr(a.head, "HTTP/1.1 500"));
    assert_int_equal(a.upgrades, 1);
    assert_int_equal(a.failed, 1);
    assert_int_equal(a.failed_status, 500);
    assert_ptr_equal(a.failed_user, a.last_alloc);
    finish(&a);
    assert_int_equal(a.opened + a.closed, 0);
}

/* The other way: the data goes to on_open, then on_close frees it. */
static void an_accepted_upgrade_goes_to_on_close_not_on_upgrade_failed(void **state) {
    (void)state;
    app a;
    start(&a, 0, NULL);
    exchange(&a, UPGRADE_HEAD "\r\n");
    assert_non_null(strstr(a.head, "HTTP/1.1 101"));
    assert_int_equal(a.opened, 1);
    finish(&a);   /* closes it: on_close frees */
    assert_int_equal(a.closed, 1);
    assert_int_equal(a.failed, 0);
}

/* The fields go after the handshake's own, in the order added, longer
 * together than the 101's stack buffer for them. */
static void headers_added_by_on_upgrade_go_out_in_the_101(void **state) {
    (void)state;
    app a;
    start(&a, 0, NULL);
    a.add_headers = true;
    exchange(&a, UPGRADE_HEAD "\r\n");
    char want[1024];
    char long_value[301];
    memset(long_value, 'v', 300);
    long_value[300] = '\0';
    snprintf(want, sizeof(want),
             "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
             "Connection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"
             "Set-Cookie: s=1\r\nX-Long: %s\r\n\r\n",
             long_value);
    assert_string_equal(a.head, want);
    assert_int_equal(a.opened, 1);
    finish(&a);
    assert_int_equal(a.closed, 1);
}

/* ---- a refusal with no on_upgrade_failed --------------------------------- */

/* The route forgot on_upgrade_failed: tern drops conn_user (the test
 * frees it itself, through last_alloc). The checked build says so, one
 * line naming the route, once however many refusals; the release build
 * says nothing. */
static const tern_ws_handlers handlers_no_failed = {.on_upgrade = on_upgrade,
                                                    .on_open = on_open,
                                                    .on_close = on_close};

/* Refuses one upgrade of /room/7 with stderr going to a file; returns
 * what was written to stderr (in buf). */
static void refuse_capturing_stderr(app *a, char *buf, size_t cap) {
    FILE *tmp = tmpfile();
    assert_non_null(tmp);
    fflush(stderr);
    int saved = dup(2);
    assert_true(saved >= 0);
    dup2(fileno(tmp), 2);
    exchange(a, "GET /room/7 HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n");
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(a->fd);
    rewind(tmp);
    size_t n = fread(buf, 1, cap - 1, tmp);
    buf[n] = '\0';
    fclose(tmp);
    free(a->last_alloc);   /* dropped by tern: ours to free */
}

#ifdef TERN_CHECKED
static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}
#endif

static void a_refusal_without_on_upgrade_failed_is_reported_by_the_checked_build(void **state) {
    (void)state;
    app a;
    memset(&a, 0, sizeof(a));
    a.refuse = 403;
    assert_int_equal(tern_loop_new(&a.loop, NULL), 0);
    assert_int_equal(tern_server_new(&a.srv, a.loop, NULL), 0);
    assert_int_equal(tern_ws_route(a.srv, "/room/:id", &handlers_no_failed, NULL, &a), 0);
    assert_int_equal(tern_listen(a.srv, "127.0.0.1", 0, NULL), 0);
    char first[1024], second[1024];
    refuse_capturing_stderr(&a, first, sizeof(first));
    assert_non_null(strstr(a.head, "HTTP/1.1 403"));
    a.nhead = 0;
    a.ticks = 0;
    refuse_capturing_stderr(&a, second, sizeof(second));
    assert_non_null(strstr(a.head, "HTTP/1.1 403"));
    assert_int_equal(a.upgrades, 2);
    assert_int_equal(a.opened + a.closed + a.failed, 0);
#ifdef TERN_CHECKED
    if (count_lines(first) != 1 || strstr(first, "tern: on_upgrade: route /room/:id:") == NULL ||
        strstr(first, "(403)") == NULL || strstr(first, "dropped") == NULL)
        fail_msg("the checked build's warning: \"%s\"", first);
#else
    assert_string_equal(first, "");
#endif
    assert_string_equal(second, "");   /* once per route */
    a.fd = -1;
    tern_server_free(a.srv);
    tern_loop_free(a.loop);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_refused_upgrade_hands_conn_user_to_on_upgrade_failed),
        cmocka_unit_test(a_refusal_out_of_range_is_403_and_still_hands_it_back),
        cmocka_unit_test(an_upgrade_failing_after_acceptance_hands_it_back_with_500),
        cmocka_unit_test(an_accepted_upgrade_goes_to_on_close_not_on_upgrade_failed),
        cmocka_unit_test(headers_added_by_on_upgrade_go_out_in_the_101),
        cmocka_unit_test(a_refusal_without_on_upgrade_failed_is_reported_by_the_checked_build),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
