/* tern_tls with encrypted private keys (issue #25): the passphrase comes
 * from the options (a callback or a file) or not at all; OpenSSL never
 * asks on a terminal, and each way of failing has its own error. The keys
 * are made here with the openssl command. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <sys/socket.h>

#include "tern/tern.h"

#include "cert.h"
#include "client.h"

static char dir[] = "/tmp/tern-tls-XXXXXX";
static char cert[TEST_CERT_PATH_MAX], key[TEST_CERT_PATH_MAX], enc_key[64], pass_file[64];
static char ca[64], alice[64], alice_key[64], mallory[64], mallory_key[64];

static void path(char *out, const char *name) { snprintf(out, 64, "%s/%s", dir, name); }

static void write_file(const char *p, const char *text) {
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int setup(void **state) {
    if (test_cert_make(dir, TEST_CERT_RSA, false, cert, key) < 0)
        return -1;
    path(enc_key, "ek.pem");
    path(pass_file, "pass");
    path(ca, "ca.pem");
    path(alice, "alice.pem");
    path(alice_key, "alice.key");
    path(mallory, "mallory.pem");
    path(mallory_key, "mallory.key");
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             "cd %s && openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem "
             "-days 2 -subj /CN=ca >/dev/null 2>&1 && "
             "openssl req -newkey rsa:2048 -nodes -keyout alice.key -out alice.csr "
             "-subj /O=Example/CN=alice >/dev/null 2>&1 && "
             "openssl x509 -req -in alice.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
             "-out alice.pem -days 2 >/dev/null 2>&1 && "
             "openssl req -x509 -newkey rsa:2048 -nodes -keyout mallory.key -out mallory.pem "
             "-days 2 -subj /CN=mallory >/dev/null 2>&1",
             dir);
    if (system(cmd) != 0)
        return -1;
    snprintf(cmd, sizeof(cmd),
             "openssl pkey -in %s -out %s -aes256 -passout pass:secret >/dev/null 2>&1", key,
             enc_key);
    return system(cmd) == 0 ? 0 : -1;
}

static int teardown(void **state) { return test_cert_remove(dir); }

/* Log lines, to check what tern says about a key. */
static char logged[4096];
static void log_fn(int level, const char *msg, void *user) {
    size_t n = strlen(logged);
    snprintf(logged + n, sizeof(logged) - n, "%s\n", msg);
}

typedef struct pass_cb_state {
    const char *pass;
    int calls;
} pass_cb_state;

static int pass_cb(char *buf, size_t size, void *user) {
    pass_cb_state *s = user;
    s->calls++;
    size_t n = strlen(s->pass);
    if (n > size)
        return -1;
    memcpy(buf, s->pass, n);
    return (int)n;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void encrypted_key_without_passphrase_is_refused_at_once(void **state) {
    logged[0] = 0;
    tern_set_log(TERN_LOG_WARN, log_fn, NULL);
    tern_tls *tls = (tern_tls *)1;
    /* No prompt: stdin and the terminal are never read (a prompt would
     * block here, or fail as a "UI routines" error with no terminal). */
    double t0 = now_s();
    assert_int_equal(tern_tls_new(&tls, cert, enc_key), -ENOKEY);
    assert_true(now_s() - t0 < 2.0);
    assert_null(tls);
    char want[160];
    snprintf(want, sizeof(want), "the key in %s is encrypted: give its passphrase", enc_key);
    assert_non_null(strstr(logged, want));
    assert_null(strstr(logged, "UI routines"));
    /* A callback that has nothing to give is the same. */
    pass_cb_state s = {.pass = ""};
    tern_tls_options o = {.passphrase = pass_cb, .passphrase_user = &s};
    assert_int_equal(tern_tls_new_opt(&tls, cert, enc_key, &o), -ENOKEY);
    assert_true(s.calls >= 1);
    tern_set_log(TERN_LOG_WARN, NULL, NULL);
}

static void wrong_passphrase_is_said(void **state) {
    logged[0] = 0;
    tern_set_log(TERN_LOG_WARN, log_fn, NULL);
    tern_tls *tls = (tern_tls *)1;
    pass_cb_state s = {.pass = "not the secret"};
    tern_tls_options o = {.passphrase = pass_cb, .passphrase_user = &s};
    assert_int_equal(tern_tls_new_opt(&tls, cert, enc_key, &o), -EKEYREJECTED);
    assert_null(tls);
    assert_non_null(strstr(logged, "wrong passphrase"));
    write_file(pass_file, "wrong\n");
    o = (tern_tls_options){.passphrase_file = pass_file};
    assert_int_equal(tern_tls_new_opt(&tls, cert, enc_key, &o), -EKEYREJECTED);
    tern_set_log(TERN_LOG_WARN, NULL, NULL);
}

static void passphrase_callback_serves_every_load(void **state) {
    pass_cb_state s = {.pass = "secret"};
    tern_tls_options o = {.passphrase = pass_cb, .passphrase_user = &s};
    tern_tls *tls;
    /* An unencrypted key never calls it. */
    assert_int_equal(tern_tls_new_opt(&tls, cert, key, &o), 0);
    assert_int_equal(s.calls, 0);
    /* An encrypted one added, then both reloaded: once per encrypted key. */
    assert_int_equal(tern_tls_add_cert(tls, cert, enc_key), 0);
    assert_int_equal(s.calls, 1);
    assert_int_equal(tern_tls_reload(tls), 0);
    assert_int_equal(s.calls, 2);
    /* A reload with a passphrase now wrong keeps what is in use. */
    s.pass = "changed";
    assert_int_equal(tern_tls_reload(tls), -EKEYREJECTED);
    tern_tls_free(tls);
}

static void passphrase_file_first_line(void **state) {
    tern_tls *tls;
    tern_tls_options o = {.passphrase_file = pass_file};
    write_file(pass_file, "secret\r\nthe rest is not the passphrase\n");
    assert_int_equal(tern_tls_new_opt(&tls, cert, enc_key, &o), 0);
    /* Read again at a reload: a changed file counts. */
    write_file(pass_file, "wrong");
    assert_int_equal(tern_tls_reload(tls), -EKEYREJECTED);
    write_file(pass_file, "secret");
    assert_int_equal(tern_tls_reload(tls), 0);
    unlink(pass_file);
    assert_int_equal(tern_tls_reload(tls), -ENOENT);
    tern_tls_free(tls);
    /* Unreadable from the start: said at once, even for a plain key. */
    tls = (tern_tls *)1;
    assert_int_equal(tern_tls_new_opt(&tls, cert, key, &o), -ENOENT);
    assert_null(tls);
}

/* ---- a server on a thread, a TLS client here ------------------------- */

typedef struct tls_server {
    tern_loop *loop;
    tern_server *srv;
    tern_tls *tls;
    pthread_t thread;
    int port, tls_port;
} tls_server;

/* Says what the request knows of its transport. */
static void on_info(tern_http_req *req, void *user) {
    char b[256];
    size_t len = 99;
    const char *sni = tern_http_sni(req, &len);
    char subject[128];
    int cert_state = tern_http_peer_cert(req, subject, sizeof(subject));
    int n = snprintf(b, sizeof(b), "tls=%d sni=%.*s len=%zu cert=%d[%s]", tern_http_is_tls(req),
                     sni ? (int)len : 6, sni ? sni : "(none)", len, cert_state, subject);
    tern_http_respond(req, 200, "text/plain", b, (size_t)n);
}

/* Leaves an entry in the loop thread's OpenSSL error queue, as any
 * application code using libcrypto in a handler may (a failed signature
 * check), and answers. */
static void on_dirty(tern_http_req *req, void *user) {
    (void)user;
    ERR_raise(ERR_LIB_USER, 1);
    tern_http_respond(req, 200, "text/plain", "dirty", 5);
}

/* NULL when the loop ran and stopped as asked; server_stop checks. */
static void *server_main(void *arg) {
    tls_server *s = arg;
    return tern_loop_run(s->loop) == 0 ? NULL : arg;
}

static void server_start(tls_server *s, tern_tls *tls) {
    memset(s, 0, sizeof(*s));
    s->tls = tls;
    assert_int_equal(tern_loop_new(&s->loop, NULL), 0);
    assert_int_equal(tern_server_new(&s->srv, s->loop, NULL), 0);
    assert_int_equal(tern_http_route(s->srv, "GET", "/info", on_info, NULL), 0);
    assert_int_equal(tern_http_route(s->srv, "GET", "/dirty", on_dirty, NULL), 0);
    assert_int_equal(tern_listen(s->srv, "127.0.0.1", 0, NULL), 0);
    assert_int_equal(tern_listen_tls(s->srv, "127.0.0.1", 0, tls, NULL), 0);
    s->port = tern_server_port(s->srv);
    s->tls_port = tern_server_tls_port(s->srv);
    assert_int_equal(pthread_create(&s->thread, NULL, server_main, s), 0);
}

static void server_stop(tls_server *s) {
    tern_loop_stop_async(s->loop);
    void *failed;
    assert_int_equal(pthread_join(s->thread, &failed), 0);
    assert_null(failed);
    tern_server_free(s->srv);
    tern_loop_free(s->loop);
}

static int tcp_connect(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

static const char info_req[] = "GET /info HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n";

/* GET /info over TLS (with name as SNI unless NULL); the body in out, ""
 * when the handshake failed. */
static void tls_get_as(int port, const char *name, const char *ccert, const char *ckey,
                       char *out, size_t cap) {
    out[0] = '\0';
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    assert_non_null(ctx);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
    if (ccert) {
        assert_int_equal(SSL_CTX_use_certificate_file(ctx, ccert, SSL_FILETYPE_PEM), 1);
        assert_int_equal(SSL_CTX_use_PrivateKey_file(ctx, ckey, SSL_FILETYPE_PEM), 1);
    }
    SSL *ssl = SSL_new(ctx);
    int fd = tcp_connect(port);
    SSL_set_fd(ssl, fd);
    if (name)
        SSL_set_tlsext_host_name(ssl, name);
    if (SSL_connect(ssl) == 1) {
        SSL_write(ssl, info_req, (int)strlen(info_req));
        char buf[2048];
        size_t len = 0;
        int r;
        while (len < sizeof(buf) - 1 && (r = SSL_read(ssl, buf + len, (int)(sizeof(buf) - 1 - len))) > 0)
            len += (size_t)r;
        buf[len] = '\0';
        const char *body = strstr(buf, "\r\n\r\n");
        snprintf(out, cap, "%s", body ? body + 4 : "");
    }
    ERR_clear_error();
    SSL_free(ssl);
    SSL_CTX_free(ctx);
    close(fd);
}

static void tls_get(int port, const char *name, char *out, size_t cap) {
    tls_get_as(port, name, NULL, NULL, out, cap);
}

static void plain_get(int port, char *out, size_t cap) {
    int fd = tcp_connect(port);
    assert_int_equal(write(fd, info_req, strlen(info_req)), (ssize_t)strlen(info_req));
    client_read_body(fd, out, cap);
}

static void request_knows_tls_and_sni(void **state) {
    tern_tls *tls;
    assert_int_equal(tern_tls_new(&tls, cert, key), 0);
    tls_server s;
    server_start(&s, tls);
    char body[256];
    tls_get(s.tls_port, "Example.test", body, sizeof(body));
    assert_string_equal(body, "tls=1 sni=Example.test len=12 cert=0[]");
    tls_get(s.tls_port, NULL, body, sizeof(body));   /* no SNI sent */
    assert_string_equal(body, "tls=1 sni=(none) len=0 cert=0[]");
    plain_get(s.port, body, sizeof(body));
    assert_string_equal(body, "tls=0 sni=(none) len=0 cert=0[]");
    server_stop(&s);
    tern_tls_free(tls);
}

/* A TLS session's failed call (a read finding half a record) is judged by
 * the thread's error queue: an entry the application left there must not
 * fail a healthy connection. The request's record reaches the server in
 * two pieces 50 ms apart, so that its read of the first piece fails
 * (wants more) just after a plain request's handler left an error. */
static void errors_left_by_a_handler_fail_no_connection(void **state) {
    tern_tls *tls;
    assert_int_equal(tern_tls_new(&tls, cert, key), 0);
    tls_server s;
    server_start(&s, tls);
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    assert_non_null(ctx);
    SSL *ssl = SSL_new(ctx);
    int fd = tcp_connect(s.tls_port);
    SSL_set_fd(ssl, fd);
    assert_int_equal(SSL_connect(ssl), 1);
    BIO *mem = BIO_new(BIO_s_mem());   /* the client's records, sent by hand */
    SSL_set0_wbio(ssl, mem);
    static const char keep_req[] = "GET /info HTTP/1.1\r\nHost: h\r\n\r\n";
    static const char dirty_req[] =
        "GET /dirty HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n";
    for (int i = 0; i < 3; i++) {
        int pfd = tcp_connect(s.port);
        assert_int_equal(write(pfd, dirty_req, strlen(dirty_req)), (ssize_t)strlen(dirty_req));
        char body[256];
        client_read_body(pfd, body, sizeof(body));
        assert_string_equal(body, "dirty");
        assert_int_equal(SSL_write(ssl, keep_req, (int)strlen(keep_req)), (int)strlen(keep_req));
        char rec[1024];
        int n = BIO_read(mem, rec, sizeof(rec));
        assert_true(n > 10);
        assert_int_equal(write(fd, rec, 10), 10);
        usleep(50 * 1000);
        assert_int_equal(write(fd, rec + 10, (size_t)n - 10), n - 10);
        char buf[1024] = "";
        int len = 0, r;
        while (!strstr(buf, "cert=0[]") && (r = SSL_read(ssl, buf + len, (int)sizeof(buf) - 1 - len)) > 0) {
            len += r;
            buf[len] = '\0';
        }
        assert_non_null(strstr(buf, "tls=1 sni=(none) len=0 cert=0[]"));
    }
    ERR_clear_error();
    SSL_free(ssl);
    SSL_CTX_free(ctx);
    close(fd);
    server_stop(&s);
    tern_tls_free(tls);
}

static void client_certificates_are_told_to_the_handler(void **state) {
    tern_tls *tls;
    tern_tls_options o = {.client_verify = TERN_TLS_VERIFY_OPTIONAL, .client_ca_file = ca};
    assert_int_equal(tern_tls_new_opt(&tls, cert, key, &o), 0);
    tls_server s;
    server_start(&s, tls);
    char body[256];
    tls_get_as(s.tls_port, "a.test", alice, alice_key, body, sizeof(body));
    assert_string_equal(body, "tls=1 sni=a.test len=6 cert=1[CN=alice,O=Example]");
    tls_get_as(s.tls_port, "a.test", mallory, mallory_key, body, sizeof(body));
    assert_string_equal(body, "tls=1 sni=a.test len=6 cert=-129[CN=mallory]");   /* -EKEYREJECTED */
    tls_get(s.tls_port, "a.test", body, sizeof(body));
    assert_string_equal(body, "tls=1 sni=a.test len=6 cert=0[]");
    server_stop(&s);
    tern_tls_free(tls);

    /* Required: only alice gets an answer. */
    o.client_verify = TERN_TLS_VERIFY_REQUIRE;
    assert_int_equal(tern_tls_new_opt(&tls, cert, key, &o), 0);
    server_start(&s, tls);
    tls_get_as(s.tls_port, "a.test", alice, alice_key, body, sizeof(body));
    assert_string_equal(body, "tls=1 sni=a.test len=6 cert=1[CN=alice,O=Example]");
    tls_get_as(s.tls_port, "a.test", mallory, mallory_key, body, sizeof(body));
    assert_string_equal(body, "");
    tls_get(s.tls_port, "a.test", body, sizeof(body));
    assert_string_equal(body, "");
    server_stop(&s);
    tern_tls_free(tls);
}

static void bad_protocol_options(void **state) {
    tern_tls *tls = (tern_tls *)1;
    tern_tls_options bad[] = {
        {.min_version = 11},
        {.min_version = 14},
        {.client_verify = TERN_TLS_VERIFY_REQUIRE},   /* no CA */
        {.client_ca_file = ca},                       /* nothing asked */
        {.client_verify = 7, .client_ca_file = ca},
        {.ciphers = "NO-SUCH-CIPHER"},
        {.ciphersuites = "TLS_NO_SUCH_SUITE"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(tern_tls_new_opt(&tls, cert, key, &bad[i]), -EINVAL);
        assert_null(tls);
    }
    tern_tls_options missing = {.client_verify = TERN_TLS_VERIFY_OPTIONAL,
                                .client_ca_file = "/nonexistent/ca.pem"};
    assert_int_equal(tern_tls_new_opt(&tls, cert, key, &missing), -ENOENT);
    tern_tls_options not_a_ca = {.client_verify = TERN_TLS_VERIFY_OPTIONAL,
                                 .client_ca_file = pass_file};
    write_file(pass_file, "not a certificate\n");
    assert_int_equal(tern_tls_new_opt(&tls, cert, key, &not_a_ca), -ENOENT);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(encrypted_key_without_passphrase_is_refused_at_once),
        cmocka_unit_test(wrong_passphrase_is_said),
        cmocka_unit_test(passphrase_callback_serves_every_load),
        cmocka_unit_test(passphrase_file_first_line),
        cmocka_unit_test(request_knows_tls_and_sni),
        cmocka_unit_test(errors_left_by_a_handler_fail_no_connection),
        cmocka_unit_test(client_certificates_are_told_to_the_handler),
        cmocka_unit_test(bad_protocol_options),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
