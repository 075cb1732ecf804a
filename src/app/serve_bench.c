/* tern serve's bench routes: they make the server do work on request, for
 * the benchmarks, tests and Autobahn, and are served only with
 * --bench-routes (off by default: 404 like any path):
 *   GET  /echo?size=N       N bytes of 'x'
 *   POST /echo              the request body
 *   GET  /stream?chunks=K&size=S   a chunked response of K chunks of S bytes
 *   POST /upload            a streamed request body: answers its length
 *   GET  /delay?ms=N        "done" after N ms (an answer given later)
 *   GET  /item/:id          "id N from PEER": a numeric route parameter (400 when
 *                           not a number) and the peer's address
 *   GET  /ws                WebSocket echo: every message back with its opcode
 *                           (--ws-async: echoed later, from the loop;
 *                           --ws-deadline-ms N: closed with 1008 after N ms
 *                           without a message)
 *                           (subprotocol "tern.echo" when asked for)
 *   GET  /ws/broadcast      WebSocket: every message goes to every connection
 *                           of this route, on every thread: framed (and
 *                           compressed) once per thread, and posted as a copy
 *                           to each other thread's loop; one order for every
 *                           connection, whichever threads send (bcast_message)
 *   GET  /ws/room/:room     WebSocket echo; the 101 names the room (X-Tern-Room)
 *   GET  /fanout            WebSocket: each message answered with 10 binary
 *                           messages of 10 000 bytes
 *   GET  /fanout/sub        WebSocket subscribed to topic "fanout"
 *   GET  /fanout/pub        WebSocket: each message published to "fanout"
 *   GET  /fanout/pub-keyed  the same with a key
 * (the /fanout routes are serve_pubsub.c's). */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/serve_ctx.h"

#define MAX_ECHO_SIZE (64u * 1024 * 1024)

/* A connection of /ws/broadcast, on its thread's list while open. */
struct bcast_member {
    tern_ws *ws;
    serve_thread *th;
    struct bcast_member *next, *prev;
};

/* A /ws message kept by --ws-async to be echoed later: the connection
 * (referenced), then len bytes of payload, padded to keep the next entry
 * aligned. */
typedef struct later_msg {
    tern_ws *ws;
    uint32_t len;
    int opcode;
    char data[];
} later_msg;

/* Reads a non-negative integer query parameter; -1 when absent or bad. */
static long long query_num(tern_http_req *req, const char *name, long long max) {
    char buf[32];
    ssize_t n = tern_http_query_param(req, name, buf, sizeof(buf));
    if (n <= 0)
        return -1;
    char *end;
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    if (errno || *end || v < 0 || v > max)
        return -1;
    return v;
}

static void bad_request(tern_http_req *req, const char *why) {
    tern_http_respond(req, 400, "text/plain", why, strlen(why));
}

static void on_item(tern_http_req *req, void *user) {
    int64_t id;
    int err = tern_http_param_int(req, "id", &id);
    if (err < 0) {
        bad_request(req, err == -ERANGE ? "id out of range\n" : "id must be an integer\n");
        return;
    }
    struct sockaddr_storage ss;
    socklen_t sl;
    char peer[TERN_ADDRSTRLEN] = "-";
    if (tern_http_peer(req, &ss, &sl) < 0 ||
        tern_addr_format((struct sockaddr *)&ss, sl, peer, sizeof(peer)) < 0)
        snprintf(peer, sizeof(peer), "-");
    char out[200];
    int n = snprintf(out, sizeof(out), "id %lld from %s\n", (long long)id, peer);
    tern_http_respond(req, 200, "text/plain", out, (size_t)n);
}

static void on_echo_get(tern_http_req *req, void *user) {
    long long size = query_num(req, "size", MAX_ECHO_SIZE);
    if (size < 0) {
        bad_request(req, "size must be an integer from 0 to 67108864\n");
        return;
    }
    /* Small answers (the benchmarks' case) come from one static block;
     * large ones from a block made for the request and freed after it, so
     * the largest size ever asked is not kept for good. */
    static char small[65536];
    if (small[0] != 'x')
        memset(small, 'x', sizeof(small));
    char *xs = small;
    if ((size_t)size > sizeof(small) && (xs = malloc((size_t)size)) == NULL) {
        tern_http_respond(req, 500, "text/plain", "out of memory\n", 14);
        return;
    }
    if (xs != small)
        memset(xs, 'x', (size_t)size);
    tern_http_respond(req, 200, "application/octet-stream", xs, (size_t)size);
    if (xs != small)
        free(xs);
}

static void on_echo_post(tern_http_req *req, void *user) {
    size_t len;
    const char *body = tern_http_body(req, &len);
    size_t ct_len;
    const char *ct = tern_http_header(req, "Content-Type", &ct_len);
    char type[128] = "application/octet-stream";
    if (ct && ct_len < sizeof(type)) {
        memcpy(type, ct, ct_len);
        type[ct_len] = '\0';
    }
    tern_http_respond(req, 200, type, body, len);
}

static void on_stream(tern_http_req *req, void *user) {
    long long chunks = query_num(req, "chunks", 100000);
    long long size = query_num(req, "size", 1 << 20);
    if (chunks < 0) chunks = 4;
    if (size < 0) size = 16;
    char *buf = malloc((size_t)size + 1);
    if (buf == NULL) {
        tern_http_respond(req, 500, "text/plain", "out of memory\n", 14);
        return;
    }
    tern_http_start(req, 200, "application/octet-stream");
    for (long long i = 0; i < chunks; i++) {
        memset(buf, 'a' + (int)(i % 26), (size_t)size);
        tern_http_write(req, buf, (size_t)size);
    }
    free(buf);
    tern_http_end(req);
}

typedef struct upload_state {
    uint64_t bytes;
    uint32_t sum;   /* a simple checksum, so tests can tell the bytes arrived intact */
} upload_state;

static void on_upload_body(tern_http_req *req, const char *data, size_t len, bool last, void *user) {
    upload_state *st = user;
    for (size_t i = 0; i < len; i++)
        st->sum = st->sum * 31 + (unsigned char)data[i];
    st->bytes += len;
    if (!last)
        return;
    char out[96];
    int n = snprintf(out, sizeof(out), "%llu %u\n", (unsigned long long)st->bytes, st->sum);
    free(st);
    tern_http_respond(req, 200, "text/plain", out, (size_t)n);
}

static void on_upload_abort(tern_http_req *req, void *user) { free(user); }

static void on_upload(tern_http_req *req, void *user) {
    upload_state *st = calloc(1, sizeof(*st));
    if (st == NULL) {
        tern_http_respond(req, 500, "text/plain", "out of memory\n", 14);
        return;
    }
    tern_http_on_abort(req, on_upload_abort, st);
    tern_http_read_body(req, on_upload_body, st);
}

typedef struct delay_state {
    tern_http_req *req;
    tern_timer *timer;
} delay_state;

static void delay_fire(tern_timer *t, void *user) {
    delay_state *d = user;
    tern_http_respond(d->req, 200, "text/plain", "done\n", 5);
    tern_timer_stop(t);
    free(d);
}

static void delay_abort(tern_http_req *req, void *user) {
    delay_state *d = user;
    tern_timer_stop(d->timer);
    free(d);
}

static void on_delay(tern_http_req *req, void *user) {
    long long ms = query_num(req, "ms", 600000);
    if (ms < 0) {
        bad_request(req, "ms must be an integer from 0 to 600000\n");
        return;
    }
    delay_state *d = calloc(1, sizeof(*d));
    if (d == NULL || tern_timer_start(tern_http_req_loop(req), &d->timer, (uint64_t)ms, 0, delay_fire, d) < 0) {
        free(d);
        tern_http_respond(req, 500, "text/plain", "out of memory\n", 14);
        return;
    }
    d->req = req;
    tern_http_on_abort(req, delay_abort, d);
}

static void ws_echo(tern_ws *ws, const char *data, size_t len, int opcode, void *user) {
    tern_ws_send(ws, data, len, opcode);
}

/* ---- /ws: the benchmark's four variants ---------------------------------
 * sync: the echo is sent inside on_message (ws_echo). --ws-async: the
 * message is kept and echoed later from the loop, as a handler waiting on
 * a database would answer: copied with a reference to its connection into
 * the thread's queue, and one flush per batch echoes the whole queue. The
 * flush runs from a 0 ms timer (the default, "timer": after every event of
 * the batch, in the same iteration, with no system call) or from a post
 * ("post": tern_loop_post, what another thread's answer goes through; from
 * the loop's own thread it costs an eventfd write, an epoll_wait that
 * reports it and its read per batch).
 * --ws-deadline-ms N, with either: the connection's deadline is set at the
 * open and moved by every message; when N ms pass without one, tern closes
 * the connection with 1008 "deadline" (the library's default for a route
 * without on_deadline). */

static serve_thread *ws_thread(tern_ws *ws, serve_ctx *ctx);

static size_t later_size(size_t len) {
    return (sizeof(later_msg) + len + 7) & ~(size_t)7;
}

/* Flow control of a handler that answers later. The pause policy holds a
 * peer back by not reading while the backlog is over its hard limit, but it
 * can do so only for answers sent inside on_message: a later answer is a
 * push to it, refused (1008) past the hard limit. So the handler does what
 * the policy would, by hand: it stops reading a connection
 * (tern_ws_pause; the connection's user data marks the pause as ours)
 * while the thread's queue holds more than LATER_PAUSE bytes (one batch
 * can bring many reads: io_uring hands over every completion of an
 * iteration), or while the echoes sent to it are more than LATER_PAUSE
 * behind; and reads it again when the flush finds it caught up, or when
 * its backlog has gone (on_drain). A peer that writes without reading then
 * fills its TCP window, not our memory. */
#define LATER_PAUSE (256u * 1024)
static char later_paused;   /* the mark: &later_paused as the connection's user data */

static void later_pause(tern_ws *ws) {
    if (tern_ws_user(ws) != &later_paused && tern_ws_pause(ws) == 0)
        tern_ws_set_user(ws, &later_paused);
}

static void later_resume(tern_ws *ws) {
    if (tern_ws_user(ws) == &later_paused) {
        tern_ws_set_user(ws, NULL);
        tern_ws_resume(ws);
    }
}

/* After an echo was sent to ws. */
static void later_settle(tern_ws *ws) {
    if (tern_ws_buffered(ws) > LATER_PAUSE)
        later_pause(ws);
    else
        later_resume(ws);
}

static void later_drain(tern_ws *ws, void *user) {
    later_resume(ws);
}

/* The post: echoes what the queue holds, in order, to the connections
 * still open, and drops each message's reference. Sends call nothing back
 * (no callback runs inside them), so the queue cannot grow meanwhile. */
static void later_flush(tern_loop *loop, void *user) {
    serve_thread *th = user;
    th->later_due = false;
    for (size_t off = 0; off < th->later_len;) {
        later_msg *m = (later_msg *)(th->later + off);
        if (tern_ws_is_open(m->ws)) {
            tern_ws_send(m->ws, m->data, m->len, m->opcode);
            later_settle(m->ws);
        }
        tern_ws_unref(m->ws);
        off += later_size(m->len);
    }
    th->later_len = 0;
    if (th->later_cap > (4u << 20)) {   /* a burst's buffer is not kept for good */
        free(th->later);
        th->later = NULL;
        th->later_cap = 0;
    }
}

/* The timer mode's one-shot timer: it exists only while a flush is due. */
static void later_timer(tern_timer *t, void *user) {
    tern_timer_stop(t);
    later_flush(NULL, user);
}

static void ws_echo_later(tern_ws *ws, const char *data, size_t len, int opcode, void *user) {
    serve_ctx *ctx = user;
    serve_thread *th = ws_thread(ws, ctx);
    if (ctx->set.ws_deadline_ms)
        tern_ws_set_deadline(ws, ctx->set.ws_deadline_ms);
    size_t need = later_size(len);
    if (len > UINT32_MAX)
        return;   /* above any --ws-max-message the parser allows */
    if (th->later_len + need > th->later_cap) {
        size_t cap = th->later_cap ? th->later_cap : 64 * 1024;
        while (cap < th->later_len + need)
            cap *= 2;
        char *p = realloc(th->later, cap);
        if (p == NULL) {
            tern_ws_close(ws, TERN_WS_INTERNAL, "out of memory");
            return;
        }
        th->later = p;
        th->later_cap = cap;
    }
    if (!th->later_due) {
        tern_timer *t;
        int err = ctx->set.ws_async == APP_SERVE_ASYNC_POST
                      ? tern_loop_post(tern_ws_loop(ws), later_flush, th)
                      : tern_timer_start(tern_ws_loop(ws), &t, 0, 0, later_timer, th);
        if (err < 0) {
            tern_ws_close(ws, TERN_WS_INTERNAL, "out of memory");
            return;
        }
        th->later_due = true;
    }
    later_msg *m = (later_msg *)(th->later + th->later_len);
    tern_ws_ref(ws);
    m->ws = ws;
    m->len = (uint32_t)len;
    m->opcode = opcode;
    memcpy(m->data, data, len);
    th->later_len += need;
    if (th->later_len > LATER_PAUSE)
        later_pause(ws);   /* the rest of this read waits for the flush */
}

static void ws_echo_deadline(tern_ws *ws, const char *data, size_t len, int opcode, void *user) {
    serve_ctx *ctx = user;
    tern_ws_send(ws, data, len, opcode);
    tern_ws_set_deadline(ws, ctx->set.ws_deadline_ms);
}

static void ws_echo_open(tern_ws *ws, void *user) {
    serve_ctx *ctx = user;
    if (ctx->set.ws_deadline_ms)
        tern_ws_set_deadline(ws, ctx->set.ws_deadline_ms);
}

/* /ws/room/:room: the route parameter is there during the upgrade hook. */
static int room_upgrade(tern_http_req *req, void **conn_user, void *user) {
    size_t len;
    const char *room = tern_http_param(req, "room", &len);
    if (room == NULL)
        return 500;
    char name[64];
    if (len >= sizeof(name))
        return 414;
    memcpy(name, room, len);
    name[len] = '\0';
    int r = app_serve_ws_upgrade(req, conn_user, user);
    if (r == 0 && tern_http_add_header(req, "X-Tern-Room", name) < 0)
        return 400;   /* a parameter is raw: it may hold bytes no header may */
    return r;
}

/* The thread whose loop runs ws. */
static serve_thread *ws_thread(tern_ws *ws, serve_ctx *ctx) {
    int i = tern_server_index(tern_ws_server(ws));
    return &ctx->threads[i < 0 || i >= ctx->set.threads ? 0 : i];
}

static void bcast_open(tern_ws *ws, void *user) {
    serve_thread *th = ws_thread(ws, user);
    bcast_member *m = calloc(1, sizeof(*m));
    if (m == NULL) {
        tern_ws_set_user(ws, NULL);
        tern_ws_close(ws, 1011, "out of memory");
        return;
    }
    m->ws = ws;
    m->th = th;
    m->next = th->members;
    if (m->next)
        m->next->prev = m;
    th->members = m;
    tern_ws_set_user(ws, m);
}

static void bcast_close(tern_ws *ws, int code, const char *reason, size_t reason_len, void *user) {
    bcast_member *m = tern_ws_user(ws);
    if (m == NULL)
        return;
    if (m->prev)
        m->prev->next = m->next;
    else
        m->th->members = m->next;
    if (m->next)
        m->next->prev = m->prev;
    free(m);
}

/* Sends to the members of th (its loop's thread). */
static void bcast_local(serve_thread *th, const char *data, size_t len, int opcode) {
    if (th->members == NULL)
        return;
    tern_ws_prepared *msg = tern_ws_prepare(data, len, opcode, true);
    if (msg == NULL)
        return;
    /* A member the slow-consumer policy closes during its send is told so
     * (bcast_close, which frees it) at the end of the batch, not inside the
     * send: the plain loop is safe. */
    for (bcast_member *m = th->members; m; m = m->next)
        tern_ws_send_prepared(m->ws, msg);
    tern_ws_prepared_free(msg);
}

/* A message for a thread's members: a copy, posted to its loop. */
typedef struct bcast_post {
    serve_thread *th;
    int opcode;
    size_t len;
    char data[];
} bcast_post;

static void bcast_remote(tern_loop *loop, void *user) {
    bcast_post *p = user;
    bcast_local(p->th, p->data, p->len, p->opcode);
    atomic_fetch_sub(&p->th->bcast_inflight, 1);
    free(p);
}

/* Posts a copy to th's loop; false when it could not (the message is then
 * lost for th's members, as before for a full or stopped loop). */
static bool bcast_post_to(tern_server *srv, serve_thread *th, const char *data, size_t len,
                          int opcode) {
    bcast_post *p = malloc(sizeof(*p) + len);
    if (p == NULL)
        return false;
    p->th = th;
    p->opcode = opcode;
    p->len = len;
    memcpy(p->data, data, len);
    /* Raised before the post: the loop may run it (and lower the count)
     * before tern_loop_post returns. */
    atomic_fetch_add(&th->bcast_inflight, 1);
    if (tern_loop_post(tern_server_loop(tern_server_peer(srv, th->index)), bcast_remote, p) < 0) {
        atomic_fetch_sub(&th->bcast_inflight, 1);
        free(p);
        return false;
    }
    return true;
}

/* One order for every member on every thread, as /pubsub keeps per topic.
 * Delivering at once to this thread's members and posting to the others
 * was not enough: two threads' messages crossed, each thread's members
 * seeing their own first. So a message takes its place under bcast_lock,
 * posted to every other loop there (each loop's post queue is FIFO); the
 * sender's own members get it at once only when no earlier message is
 * still on its way to this loop (bcast_inflight is 0), else it is posted
 * to this loop too, behind those. Delivering at once after the unlock is
 * safe: only this thread delivers to its members, and every later message
 * reaches them through its post queue, after this call returns. */
static void bcast_message(tern_ws *ws, const char *data, size_t len, int opcode, void *user) {
    bcast_member *me = tern_ws_user(ws);
    serve_ctx *ctx = user;
    if (me == NULL)
        return;
    tern_server *srv = tern_ws_server(ws);
    bool now = true;
    pthread_mutex_lock(&ctx->bcast_lock);
    for (int i = 0; i < ctx->set.threads; i++) {
        serve_thread *th = &ctx->threads[i];
        if (th != me->th)
            bcast_post_to(srv, th, data, len, opcode);
    }
    if (atomic_load(&me->th->bcast_inflight) != 0) {
        now = false;
        bcast_post_to(srv, me->th, data, len, opcode);
    }
    pthread_mutex_unlock(&ctx->bcast_lock);
    if (now)
        bcast_local(me->th, data, len, opcode);
}

int app_serve_bench_routes(tern_server *srv, serve_ctx *ctx, const tern_ws_options *ws_opt) {
    static const char *const echo_protocols[] = {"tern.echo", NULL};
    /* The route keeps its own copy of the handlers. */
    tern_ws_handlers echo = {.on_upgrade = app_serve_ws_upgrade, .on_message = ws_echo};
    if (ctx->set.ws_async) {
        echo.on_message = ws_echo_later;
        echo.on_drain = later_drain;
    } else if (ctx->set.ws_deadline_ms)
        echo.on_message = ws_echo_deadline;
    if (ctx->set.ws_deadline_ms)
        echo.on_open = ws_echo_open;
    tern_ws_options wo = *ws_opt;
    wo.subprotocols = echo_protocols;
    /* One compressed frame serves every subscriber only when no compressor
     * keeps context between messages. */
    static const tern_ws_handlers bcast = {.on_upgrade = app_serve_ws_upgrade,
                                           .on_open = bcast_open,
                                           .on_message = bcast_message,
                                           .on_close = bcast_close};
    tern_ws_options bo = wo;
    bo.subprotocols = NULL;
    bo.server_no_context_takeover = true;
    bo.client_no_context_takeover = true;   /* and no inflate state per member */
    bo.slow_policy = TERN_WS_SLOW_DROP;
    static const tern_ws_handlers room = {.on_upgrade = room_upgrade, .on_message = ws_echo};
    tern_ws_options ro = wo;
    ro.subprotocols = NULL;
    int err;
    if ((err = tern_http_route(srv, "GET", "/echo", on_echo_get, ctx)) < 0 ||
        (err = tern_http_route(srv, "POST", "/echo", on_echo_post, ctx)) < 0 ||
        (err = tern_http_route(srv, "GET", "/stream", on_stream, ctx)) < 0 ||
        (err = tern_http_route_stream(srv, "POST", "/upload", on_upload, ctx)) < 0 ||
        (err = tern_http_route(srv, "GET", "/delay", on_delay, ctx)) < 0 ||
        (err = tern_http_route(srv, "GET", "/item/:id", on_item, ctx)) < 0 ||
        (err = tern_ws_route(srv, "/ws", &echo, &wo, ctx)) < 0 ||
        (err = tern_ws_route(srv, "/ws/broadcast", &bcast, &bo, ctx)) < 0 ||
        (err = tern_ws_route(srv, "/ws/room/:room", &room, &ro, ctx)) < 0)
        return err;
    return 0;
}

void app_serve_later_free(serve_thread *th) {
    /* Empty: tern_run ran the last posts, and a timer fires in the
     * iteration that armed it. Had anything stayed, its references
     * would go here (the structs outlive their loop). */
    later_flush(NULL, th);
    free(th->later);
}
