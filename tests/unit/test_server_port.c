/* tern_server_port and tern_server_tls_port (issue #25): a server that
 * listens TLS first and then plain on port 0 answered the TLS port for
 * tern_server_port, and the plain one could not be found. Real listeners on
 * 127.0.0.1, with a self-signed certificate made here. */
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cmocka.h>

#include "tern/tern.h"

#include "cert.h"
#include "client.h"

static char dir[] = "/tmp/tern-port-XXXXXX";
static char cert_path[TEST_CERT_PATH_MAX], key_path[TEST_CERT_PATH_MAX];

/* A P-256 key and a self-signed certificate for "localhost". */
static int make_cert(void **state) {
    (void)state;
    return test_cert_make(dir, TEST_CERT_P256, false, cert_path, key_path);
}

static int remove_cert(void **state) {
    (void)state;
    return test_cert_remove(dir);
}

static int answered;

static void plain_handler(tern_http_req *req, void *user) {
    answered = 1;
    tern_http_respond(req, 200, "text/plain", "plain", 5);
    tern_loop_stop(tern_http_req_loop(req));
}

static void give_up(tern_timer *t, void *user) { tern_loop_stop(user); }

/* Reads until the whole response head's first line is in, or 5 s pass. */
static void read_status(int fd, char *buf, size_t cap) {
    size_t n = 0;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    while (n < cap - 1 && poll(&p, 1, 5000) == 1) {
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r <= 0)
            break;
        n += (size_t)r;
        if (memchr(buf, '\n', n))
            break;
    }
    buf[n] = '\0';
}

/* GET /p on port, served by loop: the handler answered, and 200 came. */
static void assert_plain_answer(tern_loop *loop, int port) {
    int fd = client_send_rcvbuf(port, 0, "GET /p HTTP/1.1\r\nHost: x\r\n\r\n");
    tern_timer *t;
    assert_int_equal(tern_timer_start(loop, &t, 5000, 0, give_up, loop), 0);
    answered = 0;
    assert_int_equal(tern_loop_run(loop), 0);
    tern_timer_stop(t);
    assert_int_equal(answered, 1);
    char buf[256];
    read_status(fd, buf, sizeof(buf));
    assert_memory_equal(buf, "HTTP/1.1 200", 12);
    close(fd);
}

static void tls_first_then_plain(void **state) {
    tern_loop *loop;
    tern_server *srv;
    tern_tls *tls;
    assert_int_equal(tern_tls_new(&tls, cert_path, key_path), 0);
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    assert_int_equal(tern_server_new(&srv, loop, NULL), 0);
    assert_int_equal(tern_http_route(srv, "GET", "/p", plain_handler, NULL), 0);

    assert_int_equal(tern_listen_tls(srv, "127.0.0.1", 0, tls, NULL), 0);
    /* only TLS so far: no plain port */
    assert_int_equal(tern_server_port(srv), -ENOENT);
    int tls_port = tern_server_tls_port(srv);
    assert_true(tls_port > 0);

    assert_int_equal(tern_listen(srv, "127.0.0.1", 0, NULL), 0);
    int port = tern_server_port(srv);
    assert_true(port > 0);
    assert_int_not_equal(port, tls_port);
    assert_int_equal(tern_server_tls_port(srv), tls_port);

    /* and it is the plain listener: plain HTTP gets an answer there */
    assert_plain_answer(loop, port);

    tern_server_free(srv);
    tern_tls_free(tls);
    tern_loop_free(loop);
}

/* A socket listening on 127.0.0.1 on a port of the kernel's, as systemd
 * would pass one; its port in *port. */
static int listening_socket(int *port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sin);
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
    assert_int_equal(listen(fd, 16), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sin, &len), 0);
    *port = ntohs(sin.sin_port);
    return fd;
}

/* tern_listen_fd: an inherited listening socket is served (plain here,
 * TLS the port it has), the caller keeps its descriptor, and what is not
 * a listening stream socket is refused. */
static void inherited_sockets(void **state) {
    tern_loop *loop;
    tern_server *srv;
    tern_tls *tls;
    assert_int_equal(tern_tls_new(&tls, cert_path, key_path), 0);
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    assert_int_equal(tern_server_new(&srv, loop, NULL), 0);
    assert_int_equal(tern_http_route(srv, "GET", "/p", plain_handler, NULL), 0);

    int port, tls_port;
    int fd = listening_socket(&port), tls_fd = listening_socket(&tls_port);
    int udp = socket(AF_INET, SOCK_DGRAM, 0), unbound = socket(AF_INET, SOCK_STREAM, 0);
    int file = open("/dev/null", O_RDONLY);
    assert_int_equal(tern_listen_fd(NULL, fd, NULL, NULL), -EINVAL);
    assert_int_equal(tern_listen_fd(srv, -1, NULL, NULL), -EINVAL);
    assert_int_equal(tern_listen_fd(srv, udp, NULL, NULL), -EINVAL);
    assert_int_equal(tern_listen_fd(srv, unbound, NULL, NULL), -EINVAL);   /* not listening */
    assert_int_equal(tern_listen_fd(srv, file, NULL, NULL), -ENOTSOCK);
    assert_int_equal(tern_listen_fd(srv, 1000, NULL, NULL), -EBADF);
    assert_int_equal(tern_listen_fd(srv, fd, NULL, &(tern_listen_options){.backlog = -1}),
                     -EINVAL);
    close(udp);
    close(unbound);
    close(file);

    assert_int_equal(tern_listen_fd(srv, tls_fd, tls, NULL), 0);
    assert_int_equal(tern_listen_fd(srv, fd, NULL, NULL), 0);
    assert_int_equal(tern_server_port(srv), port);
    assert_int_equal(tern_server_tls_port(srv), tls_port);
    /* the caller's descriptors are its own: closing them leaves ours */
    close(fd);
    close(tls_fd);
    assert_plain_answer(loop, port);

    tern_server_free(srv);
    tern_tls_free(tls);
    tern_loop_free(loop);
}

/* The other way round, and a Unix listener, which has no port. */
static void plain_first_then_tls(void **state) {
    tern_loop *loop;
    tern_server *srv;
    tern_tls *tls;
    assert_int_equal(tern_tls_new(&tls, cert_path, key_path), 0);
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    assert_int_equal(tern_server_new(&srv, loop, NULL), 0);
    char sock[64];
    snprintf(sock, sizeof(sock), "/tmp/tern-port-%d.sock", (int)getpid());
    unlink(sock);
    assert_int_equal(tern_listen_unix(srv, sock, NULL), 0);
    assert_int_equal(tern_server_port(srv), -ENOENT);
    assert_int_equal(tern_server_tls_port(srv), -ENOENT);
    assert_int_equal(tern_listen(srv, "127.0.0.1", 0, NULL), 0);
    assert_int_equal(tern_listen_tls(srv, "127.0.0.1", 0, tls, NULL), 0);
    int port = tern_server_port(srv), tls_port = tern_server_tls_port(srv);
    assert_true(port > 0);
    assert_true(tls_port > 0);
    assert_int_not_equal(port, tls_port);
    tern_server_free(srv);
    unlink(sock);
    tern_tls_free(tls);
    tern_loop_free(loop);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tls_first_then_plain),
        cmocka_unit_test(plain_first_then_tls),
        cmocka_unit_test(inherited_sockets),
    };
    return cmocka_run_group_tests(tests, make_cert, remove_cert);
}
