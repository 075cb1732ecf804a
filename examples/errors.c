/* What tern's errors look like: a few calls that fail on purpose, and the
 * name (tern_err_name) and sentence (tern_strerror) of what they return,
 * and of the positive send results. Runs and exits 0.
 *
 *   ./build/examples/errors */
#include <stdio.h>

#include <tern/tern.h>

static void show(const char *what, int err) {
    printf("%-40s %6d  %-18s %s\n", what, err, tern_err_name(err), tern_strerror(err));
}

static void nothing(tern_http_req *req, void *user) {
    (void)user;
    tern_http_respond(req, 204, NULL, NULL, 0);
}

int main(void) {
    tern_loop *loop;
    tern_server *srv;
    if (tern_loop_new(&loop, NULL) < 0 || tern_server_new(&srv, loop, NULL) < 0)
        return 1;

    show("tern_listen on no-such-host.invalid", tern_listen(srv, "no-such-host.invalid", 0, NULL));
    show("tern_listen on port 70000", tern_listen(srv, "127.0.0.1", 70000, NULL));
    show("tern_http_route with method \"get\"", tern_http_route(srv, "get", "/", nothing, NULL));
    show("tern_server_port with no listener", tern_server_port(srv));
    show("tern_loop_free with a server alive", tern_loop_free(loop));
    show("TERN_SEND_BUFFERED", TERN_SEND_BUFFERED);
    show("TERN_SEND_DROPPED", TERN_SEND_DROPPED);
    show("a code nobody knows", -123456);

    tern_server_free(srv);
    return tern_loop_free(loop) < 0;
}
