/* The log hook and the access log: an HTTP server on 127.0.0.1:8085 (or
 * the port given; 0: any free one) whose library messages, down to debug
 * (every refused request), and one access-log line per response go to
 * stderr. GET /hello answers; anything else is the server's own 404, which
 * is logged too. SIGINT or SIGTERM stops it.
 *
 *   ./build/examples/logging & curl localhost:8085/hello; curl localhost:8085/nothing */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include <tern/tern.h>

/* May run on any loop's thread, several at once: one fprintf per line. */
static void on_log(int level, const char *msg, void *user) {
    (void)user;
    fprintf(stderr, "tern %s: %s\n", tern_log_level_name(level), msg);
}

/* Runs at the end of the loop's batch; the strings live during the call. */
static void on_access(tern_server *srv, const tern_http_access *e, void *user) {
    (void)srv;
    (void)user;
    fprintf(stderr, "%s \"%s %s\" %d %llu %llums\n", e->peer, e->method, e->target, e->status,
            (unsigned long long)e->bytes, (unsigned long long)e->duration_ms);
}

static void hello(tern_http_req *req, void *user) {
    (void)user;
    tern_http_respond(req, 200, "text/plain", "hello\n", 6);
}

static void on_signal(tern_loop *loop, int signo, void *user) {
    (void)signo;
    (void)user;
    tern_loop_stop(loop);
}

int main(int argc, char **argv) {
    tern_set_log(TERN_LOG_DEBUG, on_log, NULL);   /* before any loop runs */
    tern_loop *loop;
    tern_server *srv;
    int err = tern_loop_new(&loop, NULL);
    if (err < 0)
        return 1;
    err = tern_server_new(&srv, loop, NULL);
    if (err == 0)
        err = tern_server_set_access_log(srv, on_access, NULL);
    if (err == 0)
        err = tern_http_route(srv, "GET", "/hello", hello, NULL);
    if (err == 0)
        err = tern_listen(srv, "127.0.0.1", argc > 1 ? atoi(argv[1]) : 8085, NULL);
    if (err == 0)
        err = tern_loop_on_signal(loop, SIGINT, on_signal, NULL);
    if (err == 0)
        err = tern_loop_on_signal(loop, SIGTERM, on_signal, NULL);
    if (err == 0) {
        fprintf(stderr, "logging: http://127.0.0.1:%d/hello\n", tern_server_port(srv));
        err = tern_loop_run(loop);
    }
    if (err < 0)
        fprintf(stderr, "logging: %s\n", tern_strerror(err));
    tern_server_free(srv);
    tern_loop_free(loop);
    return err < 0;
}
