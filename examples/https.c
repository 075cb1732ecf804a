/* HTTPS and WSS on one port: 127.0.0.1:8443 (or the port given as the
 * third argument; 0: any free one) with the certificate chain CERT and
 * key KEY (PEM files, the first two arguments). GET / says whether the
 * request came over TLS and which name the client asked for (SNI);
 * /echo is a WebSocket echo (wss://). SIGHUP reads the certificate and
 * key again (after a renewal); SIGINT or SIGTERM stops it.
 *
 *   openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
 *       -keyout key.pem -out cert.pem -days 1 -subj /CN=localhost
 *   ./build/examples/https cert.pem key.pem & curl -k https://localhost:8443/ */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include <tern/tern.h>

static void hello(tern_http_req *req, void *user) {
    (void)user;
    size_t n;
    const char *sni = tern_http_sni(req, &n);
    char body[320];
    int len = snprintf(body, sizeof(body), "tls: %s, sni: %.*s\n",
                       tern_http_is_tls(req) ? "yes" : "no", sni ? (int)(n > 253 ? 253 : n) : 6,
                       sni ? sni : "(none)");
    tern_http_respond(req, 200, "text/plain", body, (size_t)len);
}

static void echo(tern_ws *ws, const char *data, size_t len, int opcode, void *user) {
    (void)user;
    tern_ws_send(ws, data, len, opcode);
}

static void on_signal(tern_loop *loop, int signo, void *user) {
    if (signo == SIGHUP) {
        int err = tern_tls_reload(user);   /* on error the old certificates stay */
        fprintf(stderr, "https: reload: %s\n", tern_strerror(err));
        return;
    }
    tern_loop_stop(loop);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: https CERT KEY [PORT]\n");
        return 2;
    }
    static const tern_ws_handlers ws = {.on_message = echo};
    tern_tls *tls;
    int err = tern_tls_new(&tls, argv[1], argv[2]);
    if (err < 0) {
        fprintf(stderr, "https: %s: %s\n", argv[1], tern_strerror(err));
        return 1;
    }
    tern_loop *loop;
    tern_server *srv;
    if (tern_loop_new(&loop, NULL) < 0)
        return 1;
    err = tern_server_new(&srv, loop, NULL);
    if (err == 0)
        err = tern_http_route(srv, "GET", "/", hello, NULL);
    if (err == 0)
        err = tern_ws_route(srv, "/echo", &ws, NULL, NULL);
    if (err == 0)
        err = tern_listen_tls(srv, "127.0.0.1", argc > 3 ? atoi(argv[3]) : 8443, tls, NULL);
    if (err == 0)
        err = tern_loop_on_signal(loop, SIGINT, on_signal, tls);
    if (err == 0)
        err = tern_loop_on_signal(loop, SIGTERM, on_signal, tls);
    if (err == 0)
        err = tern_loop_on_signal(loop, SIGHUP, on_signal, tls);
    if (err == 0) {
        fprintf(stderr, "https: https://127.0.0.1:%d/\n", tern_server_tls_port(srv));
        err = tern_loop_run(loop);
    }
    if (err < 0)
        fprintf(stderr, "https: %s\n", tern_strerror(err));
    tern_server_free(srv);
    tern_tls_free(tls);   /* the listener held its own reference until the server went */
    tern_loop_free(loop);
    return err < 0;
}
