/* Static files and virtual hosts on 127.0.0.1:8086 (or the port given as
 * the second argument; 0: any free one). Requests for the host name
 * "docs.localhost" get the files under DIR (the first argument, default
 * ".") at /files/...; on that host, a path outside /files/ gets a small
 * JSON 404 from tern_http_not_found (a missing file under /files/ gets
 * the static route's own 404). Every other name, and requests without a
 * Host, get the default host's one route, GET /, which says so. SIGINT
 * or SIGTERM stops it.
 *
 *   ./build/examples/static_hosts docs &
 *   curl -H 'Host: docs.localhost' localhost:8086/files/api/README.md
 *   curl localhost:8086/ */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include <tern/tern.h>

static void front(tern_http_req *req, void *user) {
    (void)user;
    static const char body[] = "the files are on docs.localhost\n";
    tern_http_respond(req, 200, "text/plain", body, sizeof(body) - 1);
}

static void not_found(tern_http_req *req, void *user) {
    (void)user;
    static const char body[] = "{\"error\":\"not found\"}\n";
    tern_http_respond(req, 404, "application/json", body, sizeof(body) - 1);
}

static void on_signal(tern_loop *loop, int signo, void *user) {
    (void)signo;
    (void)user;
    tern_loop_stop(loop);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : ".";
    tern_loop *loop;
    tern_server *srv, *docs;
    if (tern_loop_new(&loop, NULL) < 0)
        return 1;
    int err = tern_server_new(&srv, loop, NULL);
    if (err == 0)
        err = tern_http_route(srv, "GET", "/", front, NULL);   /* the default host */
    if (err == 0)
        err = tern_server_host(srv, "docs.localhost", &docs);  /* owned by the configuration */
    if (err == 0)
        err = tern_http_static(docs, "/files", dir);   /* GET /files/... */
    if (err == 0)
        err = tern_http_not_found(docs, not_found, NULL);
    if (err == 0)
        err = tern_listen(srv, "127.0.0.1", argc > 2 ? atoi(argv[2]) : 8086, NULL);
    if (err == 0)
        err = tern_loop_on_signal(loop, SIGINT, on_signal, NULL);
    if (err == 0)
        err = tern_loop_on_signal(loop, SIGTERM, on_signal, NULL);
    if (err == 0) {
        fprintf(stderr, "static_hosts: %s on port %d\n", dir, tern_server_port(srv));
        err = tern_loop_run(loop);
    }
    if (err < 0)
        fprintf(stderr, "static_hosts: %s\n", tern_strerror(err));
    tern_server_free(srv);
    tern_loop_free(loop);
    return err < 0;
}
