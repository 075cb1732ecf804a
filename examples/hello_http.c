/* The smallest HTTP server: GET /ping answers "pong", GET /hello/:name
 * greets, on 127.0.0.1:8081 (or the port given) until Ctrl-C.
 *
 *   ./build/examples/hello_http & curl localhost:8081/hello/world */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tern/tern.h>

static void ping(tern_http_req *req, void *user) {
    (void)user;
    tern_http_respond(req, 200, "text/plain", "pong", 4);
}

static void hello(tern_http_req *req, void *user) {
    (void)user;
    size_t len;
    const char *name = tern_http_param(req, "name", &len);
    char body[128];
    int n = snprintf(body, sizeof(body), "hello, %.*s\n", (int)(len > 100 ? 100 : len), name);
    tern_http_respond(req, 200, "text/plain; charset=utf-8", body, (size_t)n);
}

static void on_signal(tern_loop *loop, int signo, void *user) {
    (void)signo;
    (void)user;
    tern_loop_stop(loop);
}

int main(int argc, char **argv) {
    int port = argc > 1 ? atoi(argv[1]) : 8081;
    tern_loop *loop;
    tern_server *srv;
    int err;
    signal(SIGPIPE, SIG_IGN);
    if ((err = tern_loop_new(&loop, NULL)) < 0 || (err = tern_server_new(&srv, loop, NULL)) < 0) {
        fprintf(stderr, "hello_http: %s\n", tern_strerror(err));
        return 1;
    }
    if ((err = tern_http_route(srv, "GET", "/ping", ping, NULL)) < 0 ||
        (err = tern_http_route(srv, "GET", "/hello/:name", hello, NULL)) < 0 ||
        (err = tern_loop_on_signal(loop, SIGINT, on_signal, NULL)) < 0 ||
        (err = tern_loop_on_signal(loop, SIGTERM, on_signal, NULL)) < 0) {
        fprintf(stderr, "hello_http: %s\n", tern_strerror(err));
        return 1;
    }
    if ((err = tern_listen(srv, "127.0.0.1", port, NULL)) < 0) {
        fprintf(stderr, "hello_http: listen: %s\n", tern_strerror(err));
        return 1;
    }
    err = tern_loop_run(loop);
    tern_server_free(srv);
    tern_loop_free(loop);
    return err < 0;
}
