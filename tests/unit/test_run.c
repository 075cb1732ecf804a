/* tern_run: one loop per thread over one configuration; signals and
 * tern_run_stop end every loop; tern_server_clone freezes the routes. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "http/server.h"
#include "tern/tern.h"

#include "client.h"

#define CONNS 64

typedef struct test_run {
    atomic_int setups;
    atomic_int port;
    int seen[4];              /* answers per thread index */
    int answered;
    bool stop_by_signal;      /* else a request to /stop */
    pthread_t client;
    int busy_route;           /* tern_http_route's result after the clones exist */
    int stop_result;
} test_run;

static void on_index(tern_http_req *req, void *user) {
    char b[16];
    int n = snprintf(b, sizeof(b), "%d", tern_server_index(tern_http_req_server(req)));
    tern_http_respond(req, 200, "text/plain", b, (size_t)n);
}

static void noop(tern_http_req *req, void *user) {}

static void on_stop(tern_http_req *req, void *user) {
    test_run *t = user;
    tern_server *srv = tern_http_req_server(req);
    /* The configuration is shared by now: frozen. */
    t->busy_route = tern_http_route(srv, "GET", "/late", noop, NULL);
    t->stop_result = tern_run_stop(srv);
    tern_http_respond(req, 200, "text/plain", "bye", 3);
}

/* One request on a new connection; the body, or "" on failure. */
static void get(int port, const char *path, char *body, size_t cap) {
    body[0] = '\0';
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        close(fd);
        return;
    }
    char req[128];
    int n = snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", path);
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return;
    }
    client_read_body(fd, body, cap);
}

static void *client_main(void *arg) {
    test_run *t = arg;
    int port = atomic_load(&t->port);
    for (int i = 0; i < CONNS; i++) {
        char body[32];
        get(port, "/index", body, sizeof(body));
        int idx = body[0] ? atoi(body) : -1;
        if (idx >= 0 && idx < 4) {
            t->seen[idx]++;
            t->answered++;
        }
    }
    if (t->stop_by_signal) {
        kill(getpid(), SIGTERM);   /* blocked in every thread: loop 0's signalfd reads it */
    } else {
        char body[32];
        get(port, "/stop", body, sizeof(body));
    }
    return NULL;
}

static int setup(tern_server *srv, void *user) {
    test_run *t = user;
    atomic_fetch_add(&t->setups, 1);
    int err;
    if ((err = tern_http_route(srv, "GET", "/index", on_index, t)) < 0 ||
        (err = tern_http_route(srv, "GET", "/stop", on_stop, t)) < 0 ||
        (err = tern_listen(srv, "127.0.0.1", 0, NULL)) < 0)
        return err;
    atomic_store(&t->port, tern_server_port(srv));
    /* Started here, after tern_run has blocked SIGTERM: the client inherits
     * the mask, so the signal it raises goes to the signalfd. */
    return -pthread_create(&t->client, NULL, client_main, t);
}

static void run_two_threads(bool by_signal) {
    test_run t = {.stop_by_signal = by_signal, .busy_route = 1, .stop_result = 1};
    atomic_init(&t.setups, 0);
    atomic_init(&t.port, 0);
    assert_int_equal(tern_run(2, NULL, setup, &t), 0);
    pthread_join(t.client, NULL);
    assert_int_equal(atomic_load(&t.setups), 1);
    assert_int_equal(t.answered, CONNS);
    /* SO_REUSEPORT spreads the connections by their addresses: with 64,
     * both threads get some. */
    assert_true(t.seen[0] > 0);
    assert_true(t.seen[1] > 0);
    assert_int_equal(t.seen[0] + t.seen[1], CONNS);
    if (!by_signal) {
        assert_int_equal(t.busy_route, -EBUSY);
        assert_int_equal(t.stop_result, 0);
    }
}

static void sigterm_ends_every_loop(void **state) { run_two_threads(true); }
static void run_stop_ends_every_loop(void **state) { run_two_threads(false); }

/* ---- a second signal while another loop drains ----------------------- */

/* Loop 1 keeps one request unanswered; loop 0 has nothing left, so its
 * graceful shutdown is over at once. The second SIGTERM must still be read
 * (by loop 0's signalfd) and end the drain of loop 1 at once, not after the
 * shutdown timeout (10 s, the default). */
typedef struct held_run {
    atomic_int port;
    atomic_int held;          /* requests kept unanswered on loop `on` */
    int on;                   /* the loop index that holds */
    pthread_t client;
    int fd;                   /* the client's held connection, or -1 */
    struct timespec second;   /* when the second signal was sent */
} held_run;

static void held_abort(tern_http_req *req, void *user) {}

static void hold_or_answer(tern_http_req *req, void *user) {
    held_run *h = user;
    int i = tern_server_index(tern_http_req_server(req));
    if (i == h->on) {
        /* Never answered: the shutdown closes it, and the abort callback
         * is what lets tern free a request kept without an answer. */
        tern_http_on_abort(req, held_abort, NULL);
        atomic_fetch_add(&h->held, 1);
        return;
    }
    tern_http_respond(req, 200, "text/plain", "next", 4);
}

/* Connections until one is held on loop `on`; then SIGTERM, and a second
 * once loop 0 has had the time to end its own (empty) shutdown. */
static void *held_client(void *arg) {
    held_run *h = arg;
    int port = atomic_load(&h->port);
    h->fd = -1;
    for (int i = 0; i < CONNS && h->fd < 0; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        const char req[] = "GET /hold HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
        if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
            write(fd, req, sizeof(req) - 1) != (ssize_t)sizeof(req) - 1) {
            close(fd);
            continue;
        }
        /* An answer (the other loop) or a hold, whichever comes. */
        for (int waited = 0; waited < 2000; waited += 10) {
            if (atomic_load(&h->held) > 0) {
                h->fd = fd;
                break;
            }
            struct pollfd p = {.fd = fd, .events = POLLIN};
            if (poll(&p, 1, 10) > 0)
                break;
        }
        if (h->fd < 0)
            close(fd);
    }
    kill(getpid(), SIGTERM);
    usleep(300 * 1000);
    clock_gettime(CLOCK_MONOTONIC, &h->second);
    kill(getpid(), SIGTERM);
    return NULL;
}

static int held_setup(tern_server *srv, void *user) {
    held_run *h = user;
    int err;
    if ((err = tern_http_route(srv, "GET", "/hold", hold_or_answer, h)) < 0 ||
        (err = tern_listen(srv, "127.0.0.1", 0, NULL)) < 0)
        return err;
    atomic_store(&h->port, tern_server_port(srv));
    return -pthread_create(&h->client, NULL, held_client, h);
}

static void second_signal_with_a_request_held_on(int on) {
    held_run h = {.on = on, .fd = -1};
    atomic_init(&h.port, 0);
    atomic_init(&h.held, 0);
    assert_int_equal(tern_run(2, NULL, held_setup, &h), 0);
    struct timespec end;
    clock_gettime(CLOCK_MONOTONIC, &end);
    pthread_join(h.client, NULL);
    assert_int_equal(atomic_load(&h.held), 1);
    assert_true(h.fd >= 0);
    double took = (double)(end.tv_sec - h.second.tv_sec) +
                  (double)(end.tv_nsec - h.second.tv_nsec) / 1e9;
    /* Promptly: far under the 10 s of the shutdown timeout. */
    if (took > 2.0)
        fail_msg("tern_run returned %.2f s after the second SIGTERM", took);
    /* The held request's connection was closed, without an answer. */
    char buf[64];
    fcntl(h.fd, F_SETFL, 0);
    assert_int_equal(read(h.fd, buf, sizeof(buf)), 0);
    close(h.fd);
}

static void second_signal_ends_a_drain_on_loop_1(void **state) {
    second_signal_with_a_request_held_on(1);
}
static void second_signal_ends_a_drain_on_loop_0(void **state) {
    second_signal_with_a_request_held_on(0);
}

/* ---- per-thread hooks ------------------------------------------------ */

typedef struct hooks_run {
    test_run t;
    pthread_t init_thread[3], teardown_thread[3];
    atomic_int inits[3], teardowns[3];
    atomic_int loop_matches;   /* hooks that got their server's own loop */
    atomic_int order_bad;      /* a teardown before its init */
    atomic_int served;         /* requests answered, seen by teardown */
} hooks_run;

static void counted_stop(tern_http_req *req, void *user) {
    hooks_run *h = user;
    atomic_fetch_add(&h->served, 1);
    on_stop(req, &h->t);
}

static void *stop_client(void *arg) {
    hooks_run *h = arg;
    char body[32];
    get(atomic_load(&h->t.port), "/stop", body, sizeof(body));
    return NULL;
}

static int hooks_setup(tern_server *srv, void *user) {
    hooks_run *h = user;
    atomic_fetch_add(&h->t.setups, 1);
    int err;
    if ((err = tern_http_route(srv, "GET", "/stop", counted_stop, h)) < 0 ||
        (err = tern_listen(srv, "127.0.0.1", 0, NULL)) < 0)
        return err;
    atomic_store(&h->t.port, tern_server_port(srv));
    return -pthread_create(&h->t.client, NULL, stop_client, h);
}

static void thread_init(tern_loop *loop, tern_server *srv, void *user) {
    hooks_run *h = user;
    int i = tern_server_index(srv);
    assert_true(i >= 0 && i < 3);
    h->init_thread[i] = pthread_self();
    if (tern_server_loop(srv) == loop)
        atomic_fetch_add(&h->loop_matches, 1);
    atomic_fetch_add(&h->inits[i], 1);
}

static void thread_teardown(tern_loop *loop, tern_server *srv, void *user) {
    hooks_run *h = user;
    int i = tern_server_index(srv);   /* the server is still there */
    assert_true(i >= 0 && i < 3);
    h->teardown_thread[i] = pthread_self();
    if (atomic_load(&h->inits[i]) != 1)
        atomic_fetch_add(&h->order_bad, 1);
    if (tern_server_loop(srv) == loop)
        atomic_fetch_add(&h->loop_matches, 1);
    atomic_fetch_add(&h->teardowns[i], 1);
}

static void thread_hooks_run_on_each_thread(void **state) {
    hooks_run h;
    memset(&h, 0, sizeof(h));
    h.t.busy_route = 1;
    h.t.stop_result = 1;
    tern_run_options opt = {.thread_init = thread_init, .teardown = thread_teardown};
    assert_int_equal(tern_run(3, &opt, hooks_setup, &h), 0);
    pthread_join(h.t.client, NULL);
    assert_int_equal(atomic_load(&h.t.setups), 1);
    assert_int_equal(atomic_load(&h.served), 1);
    assert_int_equal(h.t.stop_result, 0);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(atomic_load(&h.inits[i]), 1);
        assert_int_equal(atomic_load(&h.teardowns[i]), 1);
        /* Both on the loop's own thread; loop 0's is the caller's. */
        assert_true(pthread_equal(h.init_thread[i], h.teardown_thread[i]));
    }
    assert_true(pthread_equal(h.init_thread[0], pthread_self()));
    assert_false(pthread_equal(h.init_thread[1], pthread_self()));
    assert_false(pthread_equal(h.init_thread[1], h.init_thread[2]));
    assert_int_equal(atomic_load(&h.loop_matches), 6);
    assert_int_equal(atomic_load(&h.order_bad), 0);
}

static int failing_setup(tern_server *srv, void *user) {
    (*(int *)user)++;
    return -EADDRINUSE;
}

/* A topic subscribed in tern_run's setup, when only the first loop exists,
 * is made for every loop tern_run will have: each publish is posted to
 * the other loop, counted there and uncounted when done, within the
 * topic's per-loop counts (ASan saw one past their end when they were
 * sized for the one loop of setup's time). */
typedef struct setup_topic {
    tern_server *srv;
    tern_sink *sink;
    int ticks;
    _Atomic int got;
} setup_topic;

static int st_send(void *u, const char *topic, size_t tl, int op, const void *d, size_t n) {
    (void)topic, (void)tl, (void)op, (void)d, (void)n;
    atomic_fetch_add(&((setup_topic *)u)->got, 1);
    return 0;
}
static size_t st_buffered(void *u) { return (void)u, 0; }
static void st_close(void *u, int code) { (void)u, (void)code; }

static void st_tick(tern_timer *t, void *user) {
    setup_topic *s = user;
    if (s->ticks++ < 3) {
        assert_true(tern_publish(s->srv, "t", "x", 1, TERN_WS_TEXT) > 0);
        return;
    }
    if (atomic_load(&s->got) < 3 && s->ticks < 500)
        return;
    tern_sink_free(s->sink);
    tern_timer_stop(t);
    assert_int_equal(tern_run_stop(s->srv), 0);
}

static int topic_setup(tern_server *srv, void *user) {
    static const tern_sink_ops ops = {.send = st_send, .buffered = st_buffered,
                                      .close = st_close};
    setup_topic *s = user;
    s->srv = srv;
    tern_timer *t;
    int err;
    if ((err = tern_sink_new(srv, &ops, s, &s->sink)) < 0 ||
        (err = tern_sink_subscribe_latest(s->sink, "t", NULL)) < 0 ||
        (err = tern_timer_start(tern_server_loop(srv), &t, 10, 10, st_tick, s)) < 0)
        return err;
    return 0;
}

static void a_topic_made_in_setup_counts_every_loop(void **state) {
    (void)state;
    setup_topic s = {0};
    atomic_init(&s.got, 0);
    assert_int_equal(tern_run(2, NULL, topic_setup, &s), 0);
    assert_int_equal(atomic_load(&s.got), 3);
}

static void bad_calls(void **state) {
    int calls = 0;
    assert_int_equal(tern_run(2, NULL, NULL, NULL), -EINVAL);
    assert_int_equal(tern_run(-1, NULL, failing_setup, &calls), -EINVAL);
    assert_int_equal(tern_run(5000, NULL, failing_setup, &calls), -EINVAL);
    assert_int_equal(calls, 0);
    assert_int_equal(tern_run(3, NULL, failing_setup, &calls), -EADDRINUSE);
    assert_int_equal(calls, 1);
    assert_int_equal(tern_run_stop(NULL), -EINVAL);
}

static void clone_shares_and_freezes(void **state) {
    tern_loop *l1, *l2;
    tern_server *a, *b;
    assert_int_equal(tern_loop_new(&l1, NULL), 0);
    assert_int_equal(tern_loop_new(&l2, NULL), 0);
    assert_int_equal(tern_server_new(&a, l1, NULL), 0);
    assert_int_equal(tern_run_stop(a), -EINVAL);   /* not tern_run's */
    assert_int_equal(tern_http_route(a, "GET", "/", noop, NULL), 0);
    assert_int_equal(tern_server_clone(NULL, l2, a), -EINVAL);
    assert_int_equal(tern_server_clone(&b, NULL, a), -EINVAL);
    assert_int_equal(tern_server_clone(&b, l2, a), 0);
    assert_int_equal(tern_server_index(a), 0);
    assert_int_equal(tern_server_index(b), 1);
    assert_int_equal(tern_server_peer_count(a), 2);
    assert_ptr_equal(tern_server_peer(b, 0), a);
    assert_ptr_equal(tern_server_peer(a, 1), b);
    assert_null(tern_server_peer(a, 2));
    assert_null(tern_server_peer(a, -1));
    assert_ptr_equal(tern_server_loop(b), l2);
    assert_int_equal(tern_http_route(a, "GET", "/x", noop, NULL), -EBUSY);
    assert_int_equal(tern_http_route(b, "GET", "/x", noop, NULL), -EBUSY);
    assert_int_equal(tern_http_not_found(b, noop, NULL), -EBUSY);
    assert_int_equal(tern_ws_route(a, "/ws", &(tern_ws_handlers){0}, NULL, NULL), -EBUSY);
    tern_stats st;
    assert_int_equal(tern_server_stats(b, &st), 0);
    assert_int_equal(st.accepted, 0);
    assert_int_equal(tern_server_stats(NULL, &st), -EINVAL);
    /* Either may go first: the configuration lives until both have. */
    tern_server_free(a);
    assert_null(tern_server_peer(b, 0));
    tern_server_free(b);
    tern_loop_free(l1);
    tern_loop_free(l2);
}

static void hosts(void **state) {
    tern_loop *l1, *l2;
    tern_server *a, *b, *h1, *h2, *again;
    assert_int_equal(tern_loop_new(&l1, NULL), 0);
    assert_int_equal(tern_loop_new(&l2, NULL), 0);
    assert_int_equal(tern_server_new(&a, l1, NULL), 0);
    const tern__server_config *cfg = a->cfg;
    assert_ptr_equal(tern__vhost_find(cfg, "x", 1), &cfg->host);   /* no hosts yet */
    assert_int_equal(tern_server_host(NULL, "a.test", &h1), -EINVAL);
    assert_int_equal(tern_server_host(a, NULL, &h1), -EINVAL);
    assert_int_equal(tern_server_host(a, "a.test", NULL), -EINVAL);
    assert_int_equal(tern_server_host(a, "", &h1), -EINVAL);
    assert_int_equal(tern_server_host(a, "bad name", &h1), -EINVAL);
    assert_int_equal(tern_server_host(a, "a:80", &h1), -EINVAL);
    assert_int_equal(tern_server_host(a, "A.Test", &h1), 0);
    assert_int_equal(tern_server_host(a, "a.test.", &again), 0);
    assert_ptr_equal(again, h1);
    assert_int_equal(tern_server_host(a, "b.test", &h2), 0);
    assert_int_equal(tern_http_route(h1, "GET", "/", noop, NULL), 0);
    /* A handle takes routes only. */
    assert_int_equal(tern_listen(h1, "127.0.0.1", 0, NULL), -EINVAL);
    assert_int_equal(tern_server_clone(&b, l2, h1), -EINVAL);
    tern_stats st;
    assert_int_equal(tern_server_stats(h1, &st), -EINVAL);
    assert_int_equal(tern_server_index(h1), -EINVAL);
    tern_server_shutdown(h1, NULL, NULL);
    tern_server_free(h1);   /* nothing: the configuration owns it */

    const tern__vhost *va = h1->target, *vb = h2->target;
    assert_ptr_equal(tern__vhost_find(cfg, "a.test", 6), va);
    assert_ptr_equal(tern__vhost_find(cfg, "A.TEST:8443", 11), va);
    assert_ptr_equal(tern__vhost_find(cfg, "a.test.", 7), va);
    assert_ptr_equal(tern__vhost_find(cfg, "b.test", 6), vb);
    assert_ptr_equal(tern__vhost_find(cfg, "a.tes", 5), &cfg->host);
    assert_ptr_equal(tern__vhost_find(cfg, "a.test.x", 8), &cfg->host);
    assert_ptr_equal(tern__vhost_find(cfg, "[::1]:80", 8), &cfg->host);
    assert_ptr_equal(tern__vhost_find(cfg, "", 0), &cfg->host);
    assert_ptr_equal(tern__vhost_find(cfg, NULL, 0), &cfg->host);

    assert_int_equal(tern_server_clone(&b, l2, a), 0);
    assert_int_equal(tern_server_host(b, "a.test", &again), 0);   /* existing: fine */
    assert_ptr_equal(again, h1);
    assert_int_equal(tern_server_host(b, "c.test", &again), -EBUSY);
    assert_int_equal(tern_http_route(h2, "GET", "/", noop, NULL), -EBUSY);
    tern_server_free(b);
    tern_server_free(a);
    tern_loop_free(l1);
    tern_loop_free(l2);
}

/* tern_cpu_count follows the affinity mask (taskset, a container's
 * cpuset): a process held to one CPU counts 1, and gets its CPUs back.
 * Not in the portable build: POSIX has no affinity mask. */
static void cpu_count_follows_the_affinity_mask(void **state) {
    (void)state;
#ifdef TERN_PORTABLE
    skip();
#endif
    cpu_set_t all, one;
    assert_int_equal(sched_getaffinity(0, sizeof(all), &all), 0);
    int n = tern_cpu_count();
    assert_true(n >= 1 && n <= CPU_COUNT(&all));
    int first = 0;
    while (!CPU_ISSET(first, &all))
        first++;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    assert_int_equal(sched_setaffinity(0, sizeof(one), &one), 0);
    assert_int_equal(tern_cpu_count(), 1);
    assert_int_equal(sched_setaffinity(0, sizeof(all), &all), 0);
    assert_int_equal(tern_cpu_count(), n);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bad_calls),
        cmocka_unit_test(a_topic_made_in_setup_counts_every_loop),
        cmocka_unit_test(cpu_count_follows_the_affinity_mask),
        cmocka_unit_test(clone_shares_and_freezes),
        cmocka_unit_test(hosts),
        cmocka_unit_test(run_stop_ends_every_loop),
        cmocka_unit_test(sigterm_ends_every_loop),
        cmocka_unit_test(second_signal_ends_a_drain_on_loop_1),
        cmocka_unit_test(second_signal_ends_a_drain_on_loop_0),
        cmocka_unit_test(thread_hooks_run_on_each_thread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
