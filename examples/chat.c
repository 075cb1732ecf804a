/* A WebSocket chat room: ws://127.0.0.1:8083/chat?name=alice (or the port
 * given; 0: any free one, the first line on stderr says which).
 *
 * Every text message a member sends goes to every other member as
 * "alice: text"; everyone hears "* bob joined (3 here)" and
 * "* bob left (2 here)". SIGINT or SIGTERM closes every connection with
 * 1001 and exits.
 *
 *   ./build/examples/chat & python3 -m websockets 'ws://localhost:8083/chat?name=me'
 *
 * The rules this shows:
 * - Per-connection data: on_upgrade allocates it (it still sees the
 *   request, here the ?name= query) and hands it to tern through
 *   *conn_user; on_open links it into the room's member list; on_close
 *   unlinks and frees it. on_close runs once for every connection that
 *   opened, whoever ended it; when the handshake fails after on_upgrade
 *   accepted, the member comes back to on_upgrade_failed instead.
 * - Broadcast: the message is framed once with tern_ws_prepare and sent to
 *   each member with tern_ws_send_prepared; each send copies the frame, so
 *   the prepared message is freed right after the loop.
 * - A slow member must not hurt the others, nor make the server's memory
 *   grow without bound: a client that stops reading would otherwise
 *   collect every message of the room in its backlog. With the close
 *   policy, a member whose backlog passes 256 KiB, or stays over 64 KiB
 *   for 2 s, is closed with 1008 (its on_close then runs like any other,
 *   and the room says "* bob left (too slow)").
 * - Callbacks are never re-entrant: a close decided during a send is
 *   delivered after the broadcast loop, so freeing a member in on_close
 *   while looping over the members is safe. */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tern/tern.h>

#define MAX_NAME 32
#define MAX_TEXT 4096

/* One per open connection; ws is set from on_open on. */
typedef struct member {
    struct member *prev, *next;
    tern_ws *ws;
    char name[MAX_NAME + 1];
} member;

/* The room's members: a list, in the order they joined. Loop thread only. */
typedef struct room {
    member *head, *tail;
    unsigned count;
    unsigned guests;    /* for the names of those who gave none */
    tern_server *srv;
    bool shutting_down;
} room;

/* Sends text to every member but `except` (NULL: to all). */
static void broadcast(room *r, const member *except, const char *text, size_t len) {
    tern_ws_prepared *msg = tern_ws_prepare(text, len, TERN_WS_TEXT, false);
    if (msg == NULL)
        return;
    for (member *m = r->head; m; m = m->next)
        if (m != except)
            tern_ws_send_prepared(m->ws, msg);   /* OK, BUFFERED, DROPPED (then closed) */
    tern_ws_prepared_free(msg);
}

static void announce(room *r, const char *name, const char *what) {
    char line[128];
    int n = snprintf(line, sizeof(line), "* %s %s (%u here)", name, what, r->count);
    broadcast(r, NULL, line, (size_t)n);
}

static bool valid_name(const char *s, size_t len) {
    if (len == 0)
        return false;
    for (size_t i = 0; i < len; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
              (s[i] >= '0' && s[i] <= '9') || s[i] == '-' || s[i] == '_' || s[i] == '.'))
            return false;
    return true;
}

/* Before the handshake is answered: the last moment the request (its
 * query) can be read. Refusing costs nothing: no member exists yet. */
static int on_upgrade(tern_http_req *req, void **conn_user, void *user) {
    room *r = user;
    char name[MAX_NAME + 1];
    ssize_t n = tern_http_query_param(req, "name", name, sizeof(name));
    if (n == -ENOENT)
        n = snprintf(name, sizeof(name), "guest-%u", ++r->guests);
    else if (n < 0 || !valid_name(name, (size_t)n))
        return 400;   /* too long, bad %-escape, or characters we don't take */
    member *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return 503;
    memcpy(m->name, name, (size_t)n + 1);
    *conn_user = m;
    return 0;
}

/* The connection did not open after on_upgrade: the member was never
 * linked, only allocated. */
static void on_upgrade_failed(void *conn_user, int status, void *user) {
    (void)status, (void)user;
    free(conn_user);
}

static void on_open(tern_ws *ws, void *user) {
    room *r = user;
    member *m = tern_ws_user(ws);
    m->ws = ws;
    m->prev = r->tail;
    if (r->tail)
        r->tail->next = m;
    else
        r->head = m;
    r->tail = m;
    r->count++;
    announce(r, m->name, "joined");
}

static void on_message(tern_ws *ws, const char *data, size_t len, int opcode, void *user) {
    room *r = user;
    member *m = tern_ws_user(ws);
    if (opcode != TERN_WS_TEXT) {
        tern_ws_close(ws, 1003, "text only");
        return;
    }
    /* data is a view into the loop's read buffer, valid during this call:
     * the line is built (copied) here and framed once for everyone. */
    char line[MAX_NAME + 2 + MAX_TEXT];
    int n = snprintf(line, sizeof(line), "%s: %.*s", m->name, (int)len, data);
    broadcast(r, m, line, (size_t)n);
}

static void on_close(tern_ws *ws, int code, const char *reason, size_t reason_len, void *user) {
    room *r = user;
    member *m = tern_ws_user(ws);
    if (m->prev)
        m->prev->next = m->next;
    else
        r->head = m->next;
    if (m->next)
        m->next->prev = m->prev;
    else
        r->tail = m->prev;
    r->count--;
    if (!r->shutting_down)
        announce(r, m->name, code == TERN_WS_POLICY ? "left, too slow" : "left");
    free(m);
}

static void shutdown_done(tern_server *srv, void *user) { tern_loop_stop(tern_server_loop(srv)); }

static void on_signal(tern_loop *loop, int signo, void *user) {
    room *r = user;
    if (r->shutting_down) {   /* a second Ctrl-C: now */
        tern_loop_stop(loop);
        return;
    }
    r->shutting_down = true;
    tern_server_shutdown(r->srv, shutdown_done, r);   /* every member gets 1001 */
}

int main(int argc, char **argv) {
    static room r;
    static const tern_ws_handlers handlers = {
        .on_upgrade = on_upgrade,
        .on_open = on_open,
        .on_message = on_message,
        .on_close = on_close,
        .on_upgrade_failed = on_upgrade_failed,
    };
    static const tern_ws_options options = {
        .max_message = MAX_TEXT,            /* a chat line; longer: close 1009 */
        .slow_policy = TERN_WS_SLOW_CLOSE,  /* a member that does not read is closed (1008) */
        .backlog_soft = 64 * 1024,          /* over this for backlog_grace_ms ... */
        .backlog_grace_ms = 2000,
        .backlog_hard = 256 * 1024,         /* ... or ever over this */
    };
    int port = argc > 1 ? atoi(argv[1]) : 8083;
    tern_loop *loop;
    int err;
    signal(SIGPIPE, SIG_IGN);
    if ((err = tern_loop_new(&loop, NULL)) < 0 || (err = tern_server_new(&r.srv, loop, NULL)) < 0 ||
        (err = tern_ws_route(r.srv, "/chat", &handlers, &options, &r)) < 0 ||
        (err = tern_listen(r.srv, "127.0.0.1", port, NULL)) < 0 ||
        (err = tern_loop_on_signal(loop, SIGINT, on_signal, &r)) < 0 ||
        (err = tern_loop_on_signal(loop, SIGTERM, on_signal, &r)) < 0) {
        fprintf(stderr, "chat: %s\n", tern_strerror(err));
        return 1;
    }
    fprintf(stderr, "chat: listening on http://127.0.0.1:%d/\n", tern_server_port(r.srv));
    err = tern_loop_run(loop);
    tern_server_free(r.srv);   /* closes what is left; their on_close frees them */
    tern_loop_free(loop);
    return err < 0;
}
