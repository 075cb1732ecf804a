/* Connection limits (issue #26): max_connections and
 * max_connections_per_ip, a real listener on 127.0.0.1 and clients bound
 * to 127.0.0.x. */
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "http/server.h"
#include "tern/tern.h"
#include "client.h"

static void stop_loop(tern_timer *t, void *user) {
    tern_timer_stop(t);
    tern_loop_stop(user);
}

/* Runs the loop for ms: it accepts what waits and answers or refuses it. */
static void run_for(tern_loop *loop, uint64_t ms) {
    tern_timer *t;
    assert_int_equal(tern_timer_start(loop, &t, ms, 0, stop_loop, loop), 0);
    assert_int_equal(tern_loop_run(loop), 0);
}

/* A connection to port from 127.0.0.last, saying nothing. */
static int connect_from(int port, int last) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in src = {.sin_family = AF_INET};
    src.sin_addr.s_addr = htonl(INADDR_LOOPBACK - 1 + (uint32_t)last);
    assert_int_equal(bind(fd, (struct sockaddr *)&src, sizeof(src)), 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

/* Whether fd got the 503 and then the end. */
static bool refused(int fd) {
    char buf[512];
    size_t n = 0;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    while (n < sizeof(buf) - 1 && poll(&p, 1, 2000) == 1) {
        ssize_t r = read(fd, buf + n, sizeof(buf) - 1 - n);
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    buf[n] = '\0';
    return strncmp(buf, "HTTP/1.1 503 Service Unavailable\r\n", 34) == 0 &&
           strstr(buf, "\r\nRetry-After: 1\r\n") && strstr(buf, "\r\nConnection: close\r\n");
}

/* Nothing arrived on fd: it was admitted and is waiting for a request. */
static bool admitted(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, 0) == 0;
}

static void test_defaults(void **state) {
    tern_loop *loop;
    tern_server *srv;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    assert_int_equal(tern_server_new(&srv, loop, NULL), 0);
    assert_int_equal(srv->cfg->opt.max_connections, 10000);
    assert_int_equal(srv->cfg->opt.max_connections_per_ip, 50);
    tern_server_free(srv);
    tern_loop_free(loop);
}

static void test_per_address_and_total(void **state) {
    tern_loop *loop;
    tern_server *srv;
    tern_server_options o = {.max_connections = 4, .max_connections_per_ip = 2};
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    assert_int_equal(tern_server_new(&srv, loop, &o), 0);
    assert_int_equal(tern_listen(srv, "127.0.0.1", 0, NULL), 0);
    int port = tern_server_port(srv);

    int a1 = connect_from(port, 1), a2 = connect_from(port, 1), a3 = connect_from(port, 1);
    run_for(loop, 100);
    assert_true(admitted(a1));
    assert_true(admitted(a2));
    assert_true(refused(a3));
    close(a3);

    /* Other addresses fill the total; the next is refused by it. */
    int b1 = connect_from(port, 2), b2 = connect_from(port, 3), b3 = connect_from(port, 4);
    run_for(loop, 100);
    assert_true(admitted(b1));
    assert_true(admitted(b2));
    assert_true(refused(b3));
    close(b3);
    tern_stats st;
    assert_int_equal(tern_server_stats(srv, &st), 0);
    assert_int_equal(st.connections, 4);
    assert_int_equal(st.refused_per_ip, 1);
    assert_int_equal(st.refused_max_connections, 1);

    /* A close gives its place back, to its address and to the total. */
    close(a1);
    run_for(loop, 100);
    int a4 = connect_from(port, 1);
    run_for(loop, 100);
    assert_true(admitted(a4));
    assert_int_equal(tern_server_stats(srv, &st), 0);
    assert_int_equal(st.connections, 4);
    assert_int_equal(st.refused_per_ip + st.refused_max_connections, 2);

    close(a2);
    close(a4);
    close(b1);
    close(b2);
    run_for(loop, 100);
    assert_int_equal(atomic_load(&srv->cfg->admit.open), 0);
    tern_server_free(srv);
    tern_loop_free(loop);
}

/* Many addresses come and go: their entries are reused, never lost. */
static void test_addresses_come_and_go(void **state) {
    tern_loop *loop;
    tern_server *srv;
    tern_server_options o = {.max_connections_per_ip = 1};
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    assert_int_equal(tern_server_new(&srv, loop, &o), 0);
    assert_int_equal(tern_listen(srv, "127.0.0.1", 0, NULL), 0);
    int port = tern_server_port(srv);
    for (int round = 0; round < 3; round++) {
        int fds[200];
        for (int i = 0; i < 200; i++)
            fds[i] = connect_from(port, 2 + i);
        run_for(loop, 100);
        for (int i = 0; i < 200; i++)
            assert_true(admitted(fds[i]));
        int again = connect_from(port, 2 + 7 * round);
        run_for(loop, 100);
        assert_true(refused(again));
        close(again);
        for (int i = 0; i < 200; i++)
            close(fds[i]);
        run_for(loop, 100);
    }
    assert_int_equal(atomic_load(&srv->cfg->admit.open), 0);
    assert_true(srv->cfg->admit.used <= 201);   /* reused, not one per round */
    tern_server_free(srv);
    tern_loop_free(loop);
}

/* IPv6 is counted by /64 (two connections from ::1 are one address); Unix sockets
 * are not counted by address at all. */
static void test_ipv6_prefix_and_unix(void **state) {
    tern_loop *loop;
    tern_server *srv;
    tern_server_options o = {.max_connections_per_ip = 1};
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    assert_int_equal(tern_server_new(&srv, loop, &o), 0);
    if (tern_listen(srv, "::1", 0, NULL) < 0) {   /* no IPv6 here */
        tern_server_free(srv);
        tern_loop_free(loop);
        skip();
    }
    int port = tern_server_port(srv);
    int fds[2];
    for (int i = 0; i < 2; i++) {
        fds[i] = socket(AF_INET6, SOCK_STREAM, 0);
        struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port),
                                 .sin6_addr = IN6ADDR_LOOPBACK_INIT};
        assert_int_equal(connect(fds[i], (struct sockaddr *)&a, sizeof(a)), 0);
    }
    char path[] = "/tmp/tern-limits-XXXXXX";
    int tmp = mkstemp(path);
    assert_true(tmp >= 0);
    close(tmp);
    unlink(path);
    assert_int_equal(tern_listen_unix(srv, path, NULL), 0);
    int ufds[3];
    for (int i = 0; i < 3; i++) {
        ufds[i] = socket(AF_UNIX, SOCK_STREAM, 0);
        struct sockaddr_un u = {.sun_family = AF_UNIX};
        strcpy(u.sun_path, path);
        assert_int_equal(connect(ufds[i], (struct sockaddr *)&u, sizeof(u)), 0);
    }
    run_for(loop, 100);
    assert_true(admitted(fds[0]));
    assert_true(refused(fds[1]));
    for (int i = 0; i < 3; i++)
        assert_true(admitted(ufds[i]));
    for (int i = 0; i < 2; i++)
        close(fds[i]);
    for (int i = 0; i < 3; i++)
        close(ufds[i]);
    run_for(loop, 100);
    assert_int_equal(atomic_load(&srv->cfg->admit.open), 0);
    tern_server_free(srv);
    tern_loop_free(loop);
    unlink(path);
}

static void test_unlimited(void **state) {
    tern_loop *loop;
    tern_server *srv;
    tern_server_options o = {.max_connections = TERN_UNLIMITED,
                             .max_connections_per_ip = TERN_UNLIMITED};
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    assert_int_equal(tern_server_new(&srv, loop, &o), 0);
    assert_int_equal(tern_listen(srv, "127.0.0.1", 0, NULL), 0);
    int port = tern_server_port(srv);
    int fds[80];
    for (int i = 0; i < 80; i++)
        fds[i] = connect_from(port, 1);
    run_for(loop, 100);
    for (int i = 0; i < 80; i++)
        assert_true(admitted(fds[i]));
    for (int i = 0; i < 80; i++)
        close(fds[i]);
    run_for(loop, 100);
    tern_server_free(srv);
    tern_loop_free(loop);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_per_address_and_total),
        cmocka_unit_test(test_addresses_come_and_go),
        cmocka_unit_test(test_ipv6_prefix_and_unix),
        cmocka_unit_test(test_unlimited),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
