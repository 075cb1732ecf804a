/* Why a connection dropped reaches the program: each way a WebSocket can
 * be lost gets on_close(1006) with tern_ws_close_error() naming its own
 * error, the first one the connection met, not one code for every loss.
 *
 * Checked here, each over a real socket, with the server's loop on a
 * thread of its own and the peer played by this one:
 * - the peer resets the connection (SO_LINGER 0): -ECONNRESET;
 * - a send to a peer that has closed its socket: the kernel's code for
 *   it, -EPIPE or -ECONNRESET (the send fails at the batch end's flush or
 *   at the next send; on_close comes at the batch end, with that code);
 * - a TLS failure (a record that does not decrypt): -EPROTO;
 * and an HTTP request whose client resets before the answer gets its
 * abort callback with tern_http_close_error() -ECONNRESET. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <pthread.h>

#include "tern/tern.h"

#include "cert.h"
#include "client.h"

/* The server side. Written by the loop's thread, read by the test's once
 * the loop says (closed): atomics, so the two threads agree. */
typedef struct fx {
    tern_loop *loop;
    tern_server *srv;
    tern_timer *tick;
    pthread_t thread;
    bool pause_on_open;          /* read nothing: the peer's end is not seen */
    atomic_bool opened;
    atomic_bool peer_gone;       /* the test closed its socket: start sending */
    atomic_int closed;
    atomic_int code;
    atomic_int err;
    atomic_bool handled;         /* GET /wait's handler has the request */
    atomic_int aborted;
    atomic_int abort_err;
    tern_ws *ws;                 /* loop thread only */
} fx;

static void on_open(tern_ws *ws, void *user) {
    fx *f = user;
    f->ws = ws;
    if (f->pause_on_open)
        assert_int_equal(tern_ws_pause(ws), 0);
    atomic_store(&f->opened, true);
}

static void on_close(tern_ws *ws, int code, const char *reason, size_t reason_len, void *user) {
    fx *f = user;
    f->ws = NULL;
    atomic_store(&f->code, code);
    atomic_store(&f->err, tern_ws_close_error(ws));
    atomic_fetch_add(&f->closed, 1);
}

static const tern_ws_handlers handlers = {.on_open = on_open, .on_close = on_close};

static void on_abort(tern_http_req *req, void *user) {
    fx *f = user;
    atomic_store(&f->abort_err, tern_http_close_error(req));
    atomic_fetch_add(&f->aborted, 1);
}

/* Answers never: the client goes first. */
static void on_wait(tern_http_req *req, void *user) {
    fx *f = user;
    tern_http_on_abort(req, on_abort, f);
    atomic_store(&f->handled, true);
}

/* Once the peer has gone, a message every tick: the first goes out (the
 * peer's kernel answers it with a reset), a later one fails. */
static void send_tick(tern_timer *t, void *user) {
    fx *f = user;
    static char payload[16384];
    if (f->ws && atomic_load(&f->peer_gone))
        tern_ws_send(f->ws, payload, sizeof(payload), TERN_WS_BINARY);
}

/* NULL when the loop ran and stopped as asked; the test's thread checks. */
static void *loop_main(void *arg) {
    fx *f = arg;
    return tern_loop_run(f->loop) == 0 ? NULL : arg;
}

static void fx_start(fx *f, tern_tls *tls, bool pause_on_open) {
    memset(f, 0, sizeof(*f));
    f->pause_on_open = pause_on_open;
    assert_int_equal(tern_loop_new(&f->loop, NULL), 0);
    assert_int_equal(tern_server_new(&f->srv, f->loop, NULL), 0);
    assert_int_equal(tern_ws_route(f->srv, "/ws", &handlers, NULL, f), 0);
    assert_int_equal(tern_http_route(f->srv, "GET", "/wait", on_wait, f), 0);
    if (tls)
        assert_int_equal(tern_listen_tls(f->srv, "127.0.0.1", 0, tls, NULL), 0);
    else
        assert_int_equal(tern_listen(f->srv, "127.0.0.1", 0, NULL), 0);
    assert_int_equal(tern_timer_start(f->loop, &f->tick, 5, 5, send_tick, f), 0);
    assert_int_equal(pthread_create(&f->thread, NULL, loop_main, f), 0);
}

static void fx_stop(fx *f) {
    assert_int_equal(tern_loop_stop_async(f->loop), 0);
    void *failed;
    assert_int_equal(pthread_join(f->thread, &failed), 0);
    assert_null(failed);
    tern_timer_stop(f->tick);
    tern_server_free(f->srv);
    assert_int_equal(tern_loop_free(f->loop), 0);
}

/* Waits (10 s at most) for flag to become true. */
static void wait_for(atomic_bool *flag) {
    for (int i = 0; i < 2000 && !atomic_load(flag); i++)
        usleep(5000);
    assert_true(atomic_load(flag));
}

/* Waits (10 s at most) for on_close, and checks it came once with 1006. */
static void wait_closed(fx *f) {
    for (int i = 0; i < 2000 && atomic_load(&f->closed) == 0; i++)
        usleep(5000);
    assert_int_equal(atomic_load(&f->closed), 1);
    assert_int_equal(atomic_load(&f->code), TERN_WS_ABNORMAL);
}

/* Reads what arrives on the non-blocking fd until some has (the 101). */
static void read_some(int fd) {
    for (int i = 0; i < 2000 && client_drain(fd) == 0; i++)
        usleep(5000);
}

static void a_reset_is_econnreset(void **state) {
    (void)state;
    fx f;
    fx_start(&f, NULL, false);
    int fd = client_open(tern_server_port(f.srv), 0);
    wait_for(&f.opened);
    read_some(fd);
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
    close(fd);   /* a reset, not a FIN */
    wait_closed(&f);
    assert_int_equal(atomic_load(&f.err), -ECONNRESET);
    fx_stop(&f);
}

static void a_send_to_a_closed_peer_is_the_kernels_code(void **state) {
    (void)state;
    fx f;
    fx_start(&f, NULL, true);   /* paused: the FIN is not read, the sends find the end */
    int fd = client_open(tern_server_port(f.srv), 0);
    wait_for(&f.opened);
    read_some(fd);
    close(fd);   /* a FIN; the next bytes sent get a reset back */
    atomic_store(&f.peer_gone, true);
    wait_closed(&f);
    int err = atomic_load(&f.err);
    assert_true(err == -EPIPE || err == -ECONNRESET);
    fx_stop(&f);
}

static void an_http_client_that_resets_is_econnreset(void **state) {
    (void)state;
    fx f;
    fx_start(&f, NULL, false);
    int fd = client_send_rcvbuf(tern_server_port(f.srv), 0, "GET /wait HTTP/1.1\r\nHost: x\r\n\r\n");
    wait_for(&f.handled);
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
    close(fd);
    for (int i = 0; i < 2000 && atomic_load(&f.aborted) == 0; i++)
        usleep(5000);
    assert_int_equal(atomic_load(&f.aborted), 1);
    assert_int_equal(atomic_load(&f.abort_err), -ECONNRESET);
    fx_stop(&f);
}

/* ---- TLS ------------------------------------------------------------ */

static char dir[] = "/tmp/tern-close-XXXXXX";
static char cert[TEST_CERT_PATH_MAX], key[TEST_CERT_PATH_MAX];

static int setup(void **state) {
    (void)state;
    return test_cert_make(dir, TEST_CERT_RSA, false, cert, key);
}

static int teardown(void **state) {
    (void)state;
    return test_cert_remove(dir);
}

static const char upgrade_req[] = "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                                  "Connection: Upgrade\r\n"
                                  "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                                  "Sec-WebSocket-Version: 13\r\n\r\n";

static void a_tls_failure_is_eproto(void **state) {
    (void)state;
    tern_tls *tls;
    assert_int_equal(tern_tls_new(&tls, cert, key), 0);
    fx f;
    fx_start(&f, tls, false);
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    assert_non_null(ctx);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
    SSL *ssl = SSL_new(ctx);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)tern_server_tls_port(f.srv))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    SSL_set_fd(ssl, fd);
    assert_int_equal(SSL_connect(ssl), 1);
    assert_int_equal(SSL_write(ssl, upgrade_req, (int)strlen(upgrade_req)),
                     (int)strlen(upgrade_req));
    char buf[1024];
    assert_true(SSL_read(ssl, buf, sizeof(buf)) > 0);   /* the 101 */
    wait_for(&f.opened);
    /* An application-data record whose bytes are not what the session's
     * keys made: it cannot be decrypted. */
    unsigned char bogus[5 + 32] = {0x17, 0x03, 0x03, 0x00, 0x20};
    memset(bogus + 5, 0x5a, 32);
    assert_int_equal(write(fd, bogus, sizeof(bogus)), (ssize_t)sizeof(bogus));
    wait_closed(&f);
    assert_int_equal(atomic_load(&f.err), -EPROTO);
    SSL_free(ssl);
    SSL_CTX_free(ctx);
    close(fd);
    fx_stop(&f);
    tern_tls_free(tls);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_reset_is_econnreset),
        cmocka_unit_test(a_send_to_a_closed_peer_is_the_kernels_code),
        cmocka_unit_test(an_http_client_that_resets_is_econnreset),
        cmocka_unit_test(a_tls_failure_is_eproto),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
