/* A WebSocket echo server in one call: every path on 127.0.0.1:9090 (or
 * the port given) is a WebSocket endpoint that sends each message back. SIGINT or SIGTERM
 * closes the connections with 1001 and exits. */
#include <stdio.h>
#include <stdlib.h>

#include <tern/tern.h>

static void on_message(tern_ws *ws, const char *data, size_t len, int opcode, void *user) {
    (void)user;
    tern_ws_send(ws, data, len, opcode);
}

int main(int argc, char **argv) {
    static const tern_ws_handlers handlers = {.on_message = on_message};
    int err = tern_ws_serve("127.0.0.1", argc > 1 ? atoi(argv[1]) : 9090, &handlers, NULL);
    if (err < 0)
        fprintf(stderr, "ws_echo: %s\n", tern_strerror(err));
    return err < 0;
}
