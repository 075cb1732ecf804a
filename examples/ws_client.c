/* A WebSocket client on tern_ws_connect: sends each message given on the
 * command line, prints what comes back, and closes once every message has
 * had its answer (from an echo server, one each).
 *
 *     ./ws_client ws://127.0.0.1:8080/ws hello world
 *     ./ws_client wss://example.com/echo hi
 *
 * Shown here: the handlers a client sets (on_connect_error instead of a
 * server's on_upgrade), a request header, permessage-deflate offered,
 * sends and the closing handshake, the loop stopped from on_close (the
 * connection is gone by then), and an exit status that says how it
 * ended: 0 closed with 1000, 1 never opened, 2 closed otherwise. */
#include <stdio.h>
#include <string.h>

#include "tern/tern.h"

/* Invariants: sent messages went out; answers counts those back. */
typedef struct session {
    tern_loop *loop;
    char **messages;
    int sent, answers;
    int status;
} session;

static void on_open(tern_ws *ws, void *user) {
    session *s = user;
    fprintf(stderr, "ws_client: open%s\n", tern_ws_compressed(ws) ? " (compressed)" : "");
    for (; s->messages[s->sent]; s->sent++)
        tern_ws_send(ws, s->messages[s->sent], strlen(s->messages[s->sent]), TERN_WS_TEXT);
    if (s->sent == 0)
        tern_ws_close(ws, TERN_WS_NORMAL, "nothing to say");
}

static void on_message(tern_ws *ws, const char *data, size_t len, int opcode, void *user) {
    session *s = user;
    printf("%.*s\n", (int)len, data);
    if (++s->answers == s->sent)
        tern_ws_close(ws, TERN_WS_NORMAL, "done");
}

static void on_close(tern_ws *ws, int code, const char *reason, size_t reason_len, void *user) {
    session *s = user;
    fprintf(stderr, "ws_client: closed %d %.*s\n", code, (int)reason_len, reason);
    s->status = code == TERN_WS_NORMAL ? 0 : 2;
    tern_loop_stop(s->loop);
}

static void on_connect_error(const tern_ws_connect_error *e, void *user) {
    session *s = user;
    fprintf(stderr, "ws_client: %s\n", e->message);
    s->status = 1;
    tern_loop_stop(s->loop);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: ws_client URL [MESSAGE...]\n");
        return 1;
    }
    session s = {.messages = argv + 2, .status = 1};
    if (tern_loop_new(&s.loop, NULL) < 0)
        return 1;
    tern_ws_handlers h = {.on_open = on_open,
                          .on_message = on_message,
                          .on_close = on_close,
                          .on_connect_error = on_connect_error};
    const char *headers[] = {"Origin: http://localhost", NULL};
    tern_ws_client_options opt = {.headers = headers, .ws = {.compression = true}};
    int err = tern_ws_connect(s.loop, argv[1], &h, &opt, &s);
    if (err == 0)
        err = tern_loop_run(s.loop);
    if (err < 0) {
        fprintf(stderr, "ws_client: %s: %s\n", argv[1], tern_strerror(err));
        s.status = 1;
    }
    tern_loop_free(s.loop);
    return s.status;
}
