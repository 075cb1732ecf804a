/* WebSocket connections driven the way applications drive them: a real
 * server on the loop, real sockets as clients, per-connection data freed in
 * on_close while the application loops over its connections and sends.
 *
 * Checked here: no callback runs inside a send (a close decided by the
 * slow-consumer policy reaches on_close at the end of the batch), on_close
 * gets the code and reason tern sent, tern_ws_buffered() counts only what
 * the kernel has not taken after the batch, the pause policy bounds pushes
 * to a peer that never reads, a graceful shutdown with nothing left
 * calls its done callback after the call, not inside it, and one with
 * shutdown_ws_spread_ms closes its WebSockets at moments spread over it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tern/tern.h"

#include "client.h"

/* ---- the application -------------------------------------------------- */

typedef struct member {
    tern_ws *ws;
    struct member *next, *prev;
} member;

typedef struct app {
    tern_loop *loop;
    tern_server *srv;
    tern_timer *tick;
    member *members;
    int opened, closed;
    bool in_send;              /* inside one of our tern_ws_send* calls */
    int callbacks_in_send;     /* on_close calls that came from inside one */
    int close_code;
    char close_reason[64];
    int ticks;
    int fast_fd, slow_fd;
    size_t max_buffered;       /* the largest tern_ws_buffered() seen for the slow one */
    int dropped;
} app;

static void on_open(tern_ws *ws, void *user) {
    app *a = user;
    member *m = calloc(1, sizeof(*m));
    assert_non_null(m);
    m->ws = ws;
    m->next = a->members;
    if (m->next)
        m->next->prev = m;
    a->members = m;
    tern_ws_set_user(ws, m);
    a->opened++;
}

static void on_close(tern_ws *ws, int code, const char *reason, size_t reason_len, void *user) {
    app *a = user;
    if (a->in_send)
        a->callbacks_in_send++;
    a->closed++;
    a->close_code = code;
    size_t n = reason_len < sizeof(a->close_reason) - 1 ? reason_len : sizeof(a->close_reason) - 1;
    memcpy(a->close_reason, reason, n);
    a->close_reason[n] = '\0';
    member *m = tern_ws_user(ws);
    if (m->prev)
        m->prev->next = m->next;
    else
        a->members = m->next;
    if (m->next)
        m->next->prev = m->prev;
    memset(m, 0xAB, sizeof(*m));   /* a later use would follow garbage even without ASan */
    free(m);
}

static const tern_ws_handlers handlers = {.on_open = on_open, .on_close = on_close};

static void app_start(app *a, const tern_ws_options *opt) {
    memset(a, 0, sizeof(*a));
    a->fast_fd = a->slow_fd = -1;
    assert_int_equal(tern_loop_new(&a->loop, NULL), 0);
    assert_int_equal(tern_server_new(&a->srv, a->loop, NULL), 0);
    assert_int_equal(tern_ws_route(a->srv, "/ws", &handlers, opt, a), 0);
    assert_int_equal(tern_listen(a->srv, "127.0.0.1", 0, NULL), 0);
}

static void app_finish(app *a) {
    tern_timer_stop(a->tick);
    tern_server_free(a->srv);
    tern_loop_free(a->loop);
    if (a->fast_fd >= 0)
        close(a->fast_fd);
    if (a->slow_fd >= 0)
        close(a->slow_fd);
}

/* ---- broadcast with the close policy ---------------------------------- */

/* The loop every chat room writes: step to m->next after sending to m,
 * which is only safe because on_close never runs inside the send. */
static void broadcast(app *a, tern_ws_prepared *msg) {
    for (member *m = a->members; m; m = m->next) {
        a->in_send = true;
        int r = tern_ws_send_prepared(m->ws, msg);
        a->in_send = false;
        if (r == TERN_SEND_DROPPED)
            a->dropped++;
    }
}

static void broadcast_tick(tern_timer *t, void *user) {
    app *a = user;
    a->ticks++;
    client_drain(a->fast_fd);
    if (a->opened < 2)
        return;
    if (a->closed > 0 || a->ticks > 2000) {
        tern_loop_stop(a->loop);
        return;
    }
    static char payload[65536];
    tern_ws_prepared *msg = tern_ws_prepare(payload, sizeof(payload), TERN_WS_BINARY, false);
    assert_non_null(msg);
    for (int i = 0; i < 8 && a->closed == 0; i++)
        broadcast(a, msg);
    tern_ws_prepared_free(msg);
}

static void close_policy_runs_on_close_after_the_send(void **state) {
    app a;
    tern_ws_options opt = {.slow_policy = TERN_WS_SLOW_CLOSE,
                           .backlog_soft = 64 * 1024,
                           .backlog_hard = 256 * 1024,
                           .backlog_grace_ms = 100};
    app_start(&a, &opt);
    int port = tern_server_port(a.srv);
    a.fast_fd = client_open(port, 0);
    a.slow_fd = client_open(port, 4096);   /* never reads */
    assert_int_equal(tern_timer_start(a.loop, &a.tick, 5, 5, broadcast_tick, &a), 0);
    assert_int_equal(tern_loop_run(a.loop), 0);

    assert_int_equal(a.opened, 2);
    assert_int_equal(a.closed, 1);                 /* the slow one, and only it */
    assert_int_equal(a.callbacks_in_send, 0);      /* never from inside the send */
    assert_int_equal(a.close_code, TERN_WS_POLICY);
    assert_string_equal(a.close_reason, "slow consumer");
    assert_non_null(a.members);                    /* the fast one is still there */
    assert_null(a.members->next);
    app_finish(&a);
}

/* ---- tern_ws_buffered ------------------------------------------------- */

static void buffered_tick(tern_timer *t, void *user) {
    app *a = user;
    if (a->opened < 1)
        return;
    static char payload[1000];
    for (int i = 0; i < 100; i++)
        assert_int_equal(tern_ws_send(a->members->ws, payload, sizeof(payload), TERN_WS_BINARY),
                         TERN_SEND_OK);
    /* 100 KB went into the batch's cork and the kernel will take it at the
     * batch end: nothing is waiting for the kernel. */
    a->max_buffered = tern_ws_buffered(a->members->ws);
    tern_loop_stop(a->loop);
}

static void buffered_counts_only_what_the_kernel_has_not_taken(void **state) {
    app a;
    app_start(&a, NULL);
    a.fast_fd = client_open(tern_server_port(a.srv), 0);
    assert_int_equal(tern_timer_start(a.loop, &a.tick, 5, 5, buffered_tick, &a), 0);
    assert_int_equal(tern_loop_run(a.loop), 0);
    assert_int_equal(a.opened, 1);
    assert_int_equal(a.max_buffered, 0);
    app_finish(&a);
}

/* ---- the pause policy bounds pushes ----------------------------------- */

static void push_tick(tern_timer *t, void *user) {
    app *a = user;
    a->ticks++;
    if (a->closed > 0 || a->ticks > 2000) {
        tern_loop_stop(a->loop);
        return;
    }
    if (a->members == NULL)
        return;
    static char payload[65536];
    for (int i = 0; i < 8; i++) {
        a->in_send = true;
        int r = tern_ws_send(a->members->ws, payload, sizeof(payload), TERN_WS_BINARY);
        a->in_send = false;
        if (r == TERN_SEND_DROPPED) {
            a->dropped++;
            break;
        }
        size_t b = tern_ws_buffered(a->members->ws);
        if (b > a->max_buffered)
            a->max_buffered = b;
    }
}

static void pause_policy_closes_a_peer_that_never_reads_what_is_pushed(void **state) {
    app a;
    tern_ws_options opt = {.slow_policy = TERN_WS_SLOW_PAUSE, .backlog_hard = 256 * 1024};
    app_start(&a, &opt);
    a.slow_fd = client_open(tern_server_port(a.srv), 4096);   /* never reads, never sends */
    assert_int_equal(tern_timer_start(a.loop, &a.tick, 5, 5, push_tick, &a), 0);
    assert_int_equal(tern_loop_run(a.loop), 0);
    assert_int_equal(a.closed, 1);
    assert_int_equal(a.dropped, 1);
    assert_int_equal(a.callbacks_in_send, 0);
    assert_int_equal(a.close_code, TERN_WS_POLICY);
    assert_true(a.max_buffered <= 256 * 1024);
    app_finish(&a);
}

/* ---- graceful shutdown ------------------------------------------------ */

typedef struct shut {
    bool inside;
    int done_calls, done_inside;
} shut;

static void shutdown_done(tern_server *srv, void *user) {
    shut *s = user;
    s->done_calls++;
    if (s->inside)
        s->done_inside++;
    tern_loop_stop(tern_server_loop(srv));
}

static void shutdown_done_runs_after_the_call(void **state) {
    tern_loop *loop;
    tern_server *srv;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    assert_int_equal(tern_server_new(&srv, loop, NULL), 0);
    assert_int_equal(tern_listen(srv, "127.0.0.1", 0, NULL), 0);
    shut s = {0};
    s.inside = true;
    tern_server_shutdown(srv, shutdown_done, &s);
    s.inside = false;
    assert_int_equal(s.done_calls, 0);
    assert_int_equal(tern_loop_run(loop), 0);
    assert_int_equal(s.done_calls, 1);
    assert_int_equal(s.done_inside, 0);
    tern_server_free(srv);
    tern_loop_free(loop);
}

/* ---- a shutdown that spreads its closes ------------------------------- */

#define SPREAD_N 16
#define SPREAD_MS 800

typedef struct spread {
    app a;
    int fds[SPREAD_N];
    uint64_t shut_at, seen_at[SPREAD_N];   /* when each client read its close (0: not yet) */
    /* The longest time between two of our ticks since the shutdown: what
     * a busy machine added to the moment a close was sent (the wheel's
     * expiry comes at the first iteration after it) and to the moment we
     * read it (the tick after it came); and the sum of every gap's excess
     * over the tick's 5 ms, the time over which closes due apart may have
     * come together. */
    uint64_t last_tick, stall, lost;
    uint16_t code;                         /* the close code expected */
    int seen, ticks, deadline_results;
    bool shut;
} spread;

static void spread_done(tern_server *srv, void *user) { tern_loop_stop(tern_server_loop(srv)); }

static void spread_tick(tern_timer *t, void *user) {
    spread *sp = user;
    uint64_t now = tern_loop_now(sp->a.loop);
    if (++sp->ticks > 1000) {   /* 5 s: give up, the asserts say what is missing */
        tern_loop_stop(sp->a.loop);
        return;
    }
    if (sp->shut) {
        uint64_t gap = now - sp->last_tick;
        sp->stall = gap > sp->stall ? gap : sp->stall;
        sp->lost += gap > 5 ? gap - 5 : 0;
    }
    sp->last_tick = now;
    if (!sp->shut) {
        if (sp->a.opened < SPREAD_N)
            return;
        sp->shut = true;
        sp->shut_at = now;
        tern_server_shutdown(sp->a.srv, spread_done, sp);
        /* The shutdown's moment holds each connection's clock: a deadline
         * set now changes nothing (it would close them with 1008 at once). */
        for (member *m = sp->a.members; m; m = m->next)
            sp->deadline_results |= tern_ws_set_deadline(m->ws, 1);
    }
    for (int i = 0; i < SPREAD_N; i++) {
        char buf[4096];
        ssize_t r = sp->fds[i] < 0 ? 0 : read(sp->fds[i], buf, sizeof(buf));
        if (r <= 0 || !sp->shut)
            continue;
        /* The close frame: FIN + close opcode, its length, the code. */
        for (ssize_t k = 0; k + 3 < r; k++)
            if ((uint8_t)buf[k] == 0x88 && (uint8_t)buf[k + 2] == sp->code >> 8 &&
                (uint8_t)buf[k + 3] == (sp->code & 0xff)) {
                sp->seen_at[i] = now;
                sp->seen++;
                close(sp->fds[i]);
                sp->fds[i] = -1;
                break;
            }
    }
}

/* opt_code: the server's shutdown_ws_code; want: the code the clients get. */
static void shutdown_spread(uint16_t opt_code, uint16_t want) {
    spread *sp = calloc(1, sizeof(*sp));
    assert_non_null(sp);
    sp->code = want;
    app *a = &sp->a;
    memset(a, 0, sizeof(*a));
    a->fast_fd = a->slow_fd = -1;
    tern_server_options so = {.shutdown_ws_spread_ms = SPREAD_MS, .shutdown_timeout_ms = 5000,
                              .shutdown_ws_code = opt_code};
    assert_int_equal(tern_loop_new(&a->loop, NULL), 0);
    assert_int_equal(tern_server_new(&a->srv, a->loop, &so), 0);
    assert_int_equal(tern_ws_route(a->srv, "/ws", &handlers, NULL, a), 0);
    assert_int_equal(tern_listen(a->srv, "127.0.0.1", 0, NULL), 0);
    for (int i = 0; i < SPREAD_N; i++)
        sp->fds[i] = client_open(tern_server_port(a->srv), 0);
    assert_int_equal(tern_timer_start(a->loop, &a->tick, 5, 5, spread_tick, sp), 0);
    assert_int_equal(tern_loop_run(a->loop), 0);

    assert_int_equal(sp->seen, SPREAD_N);
    assert_int_equal(sp->deadline_results, 0);
    uint64_t first = UINT64_MAX, last = 0;
    for (int i = 0; i < SPREAD_N; i++) {
        first = sp->seen_at[i] < first ? sp->seen_at[i] : first;
        last = sp->seen_at[i] > last ? sp->seen_at[i] : last;
    }
    /* 16 moments drawn over 800 ms all within 200 ms of each other: about
     * one run in 10^8, less what the stalls of a busy machine brought
     * together. The wheel's tick (64 ms) and ours (5) come on top of the
     * spread, and twice the longest stall this thread had (one delaying
     * the send, one our read). */
    assert_true(last - first + sp->lost >= 200);
    assert_true(last - sp->shut_at <= SPREAD_MS + 150 + 2 * sp->stall);
    app_finish(a);
    for (int i = 0; i < SPREAD_N; i++)
        if (sp->fds[i] >= 0)
            close(sp->fds[i]);
    free(sp);
}

static void shutdown_spreads_the_websockets_closes(void **state) {
    (void)state;
    shutdown_spread(0, 1001);   /* going away, the default */
}

/* A drain that invites its clients back says so: 1012; other codes are
 * refused when the server is made. */
static void shutdown_code_1012_when_asked(void **state) {
    (void)state;
    shutdown_spread(1012, 1012);
    tern_loop *loop;
    tern_server *srv = NULL;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    tern_server_options bad = {.shutdown_ws_code = 1000};
    assert_int_equal(tern_server_new(&srv, loop, &bad), -EINVAL);
    assert_null(srv);
    assert_int_equal(tern_loop_free(loop), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(close_policy_runs_on_close_after_the_send),
        cmocka_unit_test(buffered_counts_only_what_the_kernel_has_not_taken),
        cmocka_unit_test(pause_policy_closes_a_peer_that_never_reads_what_is_pushed),
        cmocka_unit_test(shutdown_done_runs_after_the_call),
        cmocka_unit_test(shutdown_spreads_the_websockets_closes),
        cmocka_unit_test(shutdown_code_1012_when_asked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
