/* Chat rooms on pub/sub over threads: ws://127.0.0.1:8088/room/NAME (or
 * the port given as the first argument; 0: any free one), served by one
 * loop per core. A connection joins the room its path names; each text
 * message it sends goes to every other member, whichever thread holds
 * them, numbered ("{"seq":N} text"). Each room keeps its last 100 messages:
 * a client that reconnects to /room/NAME?epoch=E&after=N (the values of
 * the "resume" line it got) gets what it missed first. Rooms whose names
 * start with "staff-" are refused to everyone by the on_subscribe hook.
 * SIGINT or SIGTERM stop it.
 *
 *   ./build/examples/pubsub_rooms & python3 -m websockets ws://localhost:8088/room/lobby */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tern/tern.h>

/* Per connection: the room's topic, and where a resume starts. */
typedef struct member {
    char topic[TERN_TOPIC_MAX + 1];
    uint64_t epoch, after;
} member;

static int on_upgrade(tern_http_req *req, void **conn_user, void *user) {
    (void)user;
    size_t n;
    const char *name = tern_http_param(req, "name", &n);   /* a view: copy it */
    if (!name || n == 0 || n + 5 > TERN_TOPIC_MAX)
        return 404;
    member *m = calloc(1, sizeof(*m));
    if (!m)
        return 503;
    snprintf(m->topic, sizeof(m->topic), "room.%.*s", (int)n, name);
    char num[24];
    if (tern_http_query_param(req, "epoch", num, sizeof(num)) > 0)
        m->epoch = strtoull(num, NULL, 10);
    if (tern_http_query_param(req, "after", num, sizeof(num)) > 0)
        m->after = strtoull(num, NULL, 10);
    *conn_user = m;   /* on_close frees it, or on_upgrade_failed */
    return 0;
}

static void on_upgrade_failed(void *conn_user, int status, void *user) {
    (void)status;
    (void)user;
    free(conn_user);
}

static int on_subscribe(tern_ws *ws, const char *topic, size_t len, void *user) {
    (void)ws;
    (void)user;
    return len >= 11 && memcmp(topic, "room.staff-", 11) == 0 ? -EACCES : 0;
}

static void on_open(tern_ws *ws, void *user) {
    (void)user;
    member *m = tern_ws_user(ws);
    tern_resume r;
    int err = tern_ws_subscribe_from(ws, m->topic, m->epoch, m->after, &r);
    if (err < 0) {
        tern_ws_close(ws, 4003, tern_strerror(err));
        return;
    }
    char line[96];
    int n = snprintf(line, sizeof(line), "resume epoch=%" PRIu64 " after=%" PRIu64 " (%s)",
                     r.epoch, r.seq, r.resumed ? "nothing missed" : "fresh start");
    tern_ws_send(ws, line, (size_t)n, TERN_WS_TEXT);
}

static void on_message(tern_ws *ws, const char *data, size_t len, int opcode, void *user) {
    (void)user;
    member *m = tern_ws_user(ws);
    if (opcode != TERN_WS_TEXT || len > 4096)
        return;
    char msg[4096 + 16];
    memcpy(msg, "{\"seq\":}", 8);   /* the seq goes in at byte 7 */
    msg[8] = ' ';
    memcpy(msg + 9, data, len);
    /* To every subscriber of every thread but this connection. */
    tern_publish_ex(tern_ws_server(ws), m->topic, msg, len + 9, TERN_WS_TEXT, ws, 7);
}

static void on_close(tern_ws *ws, int code, const char *reason, size_t len, void *user) {
    (void)code;
    (void)reason;
    (void)len;
    (void)user;
    free(tern_ws_user(ws));   /* its subscription ended before this ran */
}

static int port;

static int setup(tern_server *srv, void *user) {
    (void)user;
    static const tern_ws_handlers h = {
        .on_upgrade = on_upgrade, .on_upgrade_failed = on_upgrade_failed,
        .on_subscribe = on_subscribe, .on_open = on_open,
        .on_message = on_message, .on_close = on_close,
    };
    tern_pubsub_options ps = {.history = 100, .history_ms = 3600 * 1000};
    int err = tern_pubsub_configure(srv, &ps);
    if (err == 0)
        err = tern_ws_route(srv, "/room/:name", &h, NULL, NULL);
    if (err == 0)
        err = tern_listen(srv, "127.0.0.1", port, NULL);
    if (err == 0)
        fprintf(stderr, "pubsub_rooms: ws://127.0.0.1:%d/room/lobby\n", tern_server_port(srv));
    return err;
}

int main(int argc, char **argv) {
    port = argc > 1 ? atoi(argv[1]) : 8088;
    int err = tern_run(0, NULL, setup, NULL);
    if (err < 0)
        fprintf(stderr, "pubsub_rooms: %s\n", tern_strerror(err));
    return err < 0;
}
