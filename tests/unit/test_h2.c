/* HTTP/2 streams as a handler sees them: a request held for a later
 * answer whose stream the client resets (RST_STREAM) is aborted at once,
 * the connection serving on; one whose connection goes is aborted too; a
 * WebSocket over a stream (RFC 8441) has the connection's peer and is
 * closed by the stream's reset. A
 * real server on the loop (h2c with prior knowledge), frames written by
 * hand (HPACK with literal fields only). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tern/tern.h"

#include "client.h"

/* The client's preface and an empty SETTINGS frame (RFC 9113 §3.4). */
static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
                              "\x00\x00\x00\x04\x00\x00\x00\x00\x00";
#define PREFACE_LEN (24 + 9)

/* HEADERS (END_STREAM | END_HEADERS) of stream id: GET http://x/slow, in
 * HPACK: :method GET (static 2), :scheme http (6), :path and :authority
 * as literals with their static names (4, 1), not indexed. */
static size_t headers_frame(unsigned char *f, uint8_t id) {
    static const unsigned char block[] = {0x82, 0x86, 0x04, 0x05, '/', 's', 'l', 'o', 'w',
                                          0x01, 0x01, 'x'};
    unsigned char h[9] = {0, 0, sizeof(block), 0x01, 0x05, 0, 0, 0, id};
    memcpy(f, h, 9);
    memcpy(f + 9, block, sizeof(block));
    return 9 + sizeof(block);
}

/* RST_STREAM of stream id with CANCEL (8). */
static size_t rst_frame(unsigned char *f, uint8_t id) {
    unsigned char r[13] = {0, 0, 4, 0x03, 0, 0, 0, 0, id, 0, 0, 0, 8};
    memcpy(f, r, sizeof(r));
    return sizeof(r);
}

typedef struct app {
    tern_loop *loop;
    tern_server *srv;
    tern_timer *tick;
    int fd;
    tern_http_req *req[2];     /* held by the handler: streams 1 and 3 */
    int held, aborts, ticks;
    int close_err;             /* tern_http_close_error in the abort */
    bool close_connection;     /* the client closes its socket, not one stream */
    bool reset_sent;
} app;

static void on_abort(tern_http_req *req, void *user) {
    app *a = user;
    a->aborts++;
    a->close_err = tern_http_close_error(req);
    for (int i = 0; i < 2; i++)
        if (a->req[i] == req)
            a->req[i] = NULL;   /* invalid from now on */
}

static void keep_request(tern_http_req *req, void *user) {
    app *a = user;
    assert_int_equal(tern_http_minor_version(req), 1);
    a->req[a->held++] = req;
    tern_http_on_abort(req, on_abort, a);
}

static void tick(tern_timer *t, void *user) {
    (void)t;
    app *a = user;
    if (++a->ticks > 400) {   /* 2 s: the abort never came */
        tern_loop_stop(a->loop);
        return;
    }
    if (a->held < 2)
        return;
    if (!a->reset_sent) {
        a->reset_sent = true;
        if (a->close_connection) {
            close(a->fd);
            a->fd = -1;
            return;
        }
        unsigned char f[16];
        size_t n = rst_frame(f, 1);
        assert_int_equal(write(a->fd, f, n), (ssize_t)n);
        return;
    }
    if (a->aborts == (a->close_connection ? 2 : 1))
        tern_loop_stop(a->loop);
}

static void run(app *a, bool close_connection) {
    memset(a, 0, sizeof(*a));
    a->close_connection = close_connection;
    tern_server_options opt = {.http2 = TERN_HTTP2_CLEARTEXT};
    assert_int_equal(tern_loop_new(&a->loop, NULL), 0);
    assert_int_equal(tern_server_new(&a->srv, a->loop, &opt), 0);
    assert_int_equal(tern_listen(a->srv, "127.0.0.1", 0, NULL), 0);
    assert_int_equal(tern_http_route(a->srv, "GET", "/slow", keep_request, a), 0);
    a->fd = client_send_rcvbuf(tern_server_port(a->srv), 0, "");
    unsigned char buf[128];
    memcpy(buf, preface, PREFACE_LEN);
    size_t n = PREFACE_LEN;
    n += headers_frame(buf + n, 1);
    n += headers_frame(buf + n, 3);
    assert_int_equal(write(a->fd, buf, n), (ssize_t)n);
    assert_int_equal(tern_timer_start(a->loop, &a->tick, 5, 5, tick, a), 0);
    assert_int_equal(tern_loop_run(a->loop), 0);
}

static void finish(app *a) {
    tern_timer_stop(a->tick);
    tern_server_free(a->srv);
    tern_loop_free(a->loop);
    if (a->fd >= 0)
        close(a->fd);
}

static void a_reset_stream_aborts_its_request_alone(void **state) {
    (void)state;
    app a;
    run(&a, false);
    assert_int_equal(a.held, 2);
    assert_int_equal(a.aborts, 1);
    assert_int_equal(a.close_err, -ECONNRESET);
    assert_null(a.req[0]);
    /* The other stream lives: its answer goes out. */
    assert_non_null(a.req[1]);
    assert_int_equal(tern_http_respond(a.req[1], 200, "text/plain", "late", 4), TERN_SEND_OK);
    finish(&a);
}

static void a_closed_connection_aborts_every_stream(void **state) {
    (void)state;
    app a;
    run(&a, true);
    assert_int_equal(a.aborts, 2);
    assert_null(a.req[0]);
    assert_null(a.req[1]);
    finish(&a);
}

/* ---- the window opens as the handler takes the body ------------------- */

typedef struct upload {
    tern_loop *loop;
    tern_http_req *req;
    int fd, ticks, asked_tick;
    size_t got;                /* body bytes handed to the handler */
    /* WINDOW_UPDATE frames seen, on the connection (stream 0) and on the
     * stream, before the handler asked for the body and after */
    int conn_before, stream_before, stream_after;
} upload;

static void up_piece(tern_http_req *req, const char *data, size_t len, bool last, void *user) {
    (void)req;
    (void)data;
    (void)last;
    ((upload *)user)->got += len;
}

static void hold_upload(tern_http_req *req, void *user) { ((upload *)user)->req = req; }

/* The WINDOW_UPDATE frames among what the server sent since the last
 * call (whole frames: the test's reads come long after the writes), on
 * stream 0 (the connection's) and on the others. */
static void window_updates(int fd, int *conn, int *stream) {
    static unsigned char buf[1 << 16];
    ssize_t n = read(fd, buf, sizeof(buf));
    *conn = *stream = 0;
    for (ssize_t at = 0; n > 0 && at + 9 <= n;) {
        size_t len = (size_t)buf[at] << 16 | (size_t)buf[at + 1] << 8 | buf[at + 2];
        uint32_t id = ((uint32_t)buf[at + 5] & 0x7F) << 24 | (uint32_t)buf[at + 6] << 16 |
                      (uint32_t)buf[at + 7] << 8 | buf[at + 8];
        if (buf[at + 3] == 0x08)
            ++*(id == 0 ? conn : stream);
        at += 9 + (ssize_t)len;
    }
}

static void up_tick(tern_timer *t, void *user) {
    (void)t;
    upload *u = user;
    if (++u->ticks > 400 || (u->asked_tick && u->ticks - u->asked_tick >= 20)) {
        int conn;
        if (u->asked_tick)
            window_updates(u->fd, &conn, &u->stream_after);
        tern_loop_stop(u->loop);
        return;
    }
    if (u->req && u->ticks >= 40 && !u->asked_tick) {
        /* 200 ms with the whole first window sent and not asked for */
        window_updates(u->fd, &u->conn_before, &u->stream_before);
        u->asked_tick = u->ticks;
        tern_http_read_body(u->req, up_piece, u);
    }
}

/* A streamed body its handler has not asked for holds its stream's
 * window shut, and only its stream's: the connection's opens as the
 * bytes arrive, so the client's other streams may still send. */
static void a_body_not_asked_for_holds_its_window_shut(void **state) {
    (void)state;
    upload u = {0};
    tern_server *srv;
    tern_server_options opt = {.http2 = TERN_HTTP2_CLEARTEXT};
    assert_int_equal(tern_loop_new(&u.loop, NULL), 0);
    assert_int_equal(tern_server_new(&srv, u.loop, &opt), 0);
    assert_int_equal(tern_listen(srv, "127.0.0.1", 0, NULL), 0);
    assert_int_equal(tern_http_route_stream(srv, "POST", "/up", hold_upload, &u), 0);
    u.fd = client_send_rcvbuf(tern_server_port(srv), 0, "");
    /* HEADERS (END_HEADERS): POST http://x/up, then 65535 bytes of DATA
     * (the whole initial window) in frames of 16384 at most. */
    static const unsigned char block[] = {0x83, 0x86, 0x04, 0x03, '/', 'u', 'p', 0x01, 0x01, 'x'};
    static unsigned char buf[PREFACE_LEN + 9 + sizeof(block) + 4 * 9 + 65535];
    size_t n = PREFACE_LEN;
    memcpy(buf, preface, PREFACE_LEN);
    unsigned char h[9] = {0, 0, sizeof(block), 0x01, 0x04, 0, 0, 0, 1};
    memcpy(buf + n, h, 9);
    memcpy(buf + n + 9, block, sizeof(block));
    n += 9 + sizeof(block);
    for (size_t left = 65535; left;) {
        size_t len = left < 16384 ? left : 16384;
        unsigned char d[9] = {0, (unsigned char)(len >> 8), (unsigned char)len, 0x00, 0, 0, 0, 0, 1};
        memcpy(buf + n, d, 9);
        memset(buf + n + 9, 'b', len);
        n += 9 + len;
        left -= len;
    }
    assert_int_equal(write(u.fd, buf, n), (ssize_t)n);
    tern_timer *tick;
    assert_int_equal(tern_timer_start(u.loop, &tick, 5, 5, up_tick, &u), 0);
    assert_int_equal(tern_loop_run(u.loop), 0);
    assert_non_null(u.req);
    assert_int_equal(u.stream_before, 0);   /* held: nothing given back on the stream */
    assert_true(u.conn_before >= 1);        /* but the connection's window reopened */
    assert_int_equal(u.got, 65535);         /* asked: all of it, at the batch end */
    assert_true(u.stream_after >= 1);       /* and the stream's window opened again */
    tern_http_respond(u.req, 200, "text/plain", "ok", 2);
    tern_timer_stop(tick);
    tern_server_free(srv);
    tern_loop_free(u.loop);
    close(u.fd);
}

/* ---- a WebSocket over a stream (RFC 8441) ----------------------------- */

typedef struct wsapp {
    tern_loop *loop;
    int fd, ticks, opened, closes, close_code;
    int peer_err;              /* tern_ws_peer in on_open: the connection's */
    bool reset_sent;
} wsapp;

static void ws_opened(tern_ws *ws, void *user) {
    wsapp *w = user;
    struct sockaddr_storage ss;
    socklen_t sl;
    w->peer_err = tern_ws_peer(ws, &ss, &sl);
    w->opened++;
}

static void ws_closed(tern_ws *ws, int code, const char *reason, size_t len, void *user) {
    (void)ws;
    (void)reason;
    (void)len;
    wsapp *w = user;
    w->closes++;
    w->close_code = code;
}

static void ws_tick(tern_timer *t, void *user) {
    (void)t;
    wsapp *w = user;
    if (++w->ticks > 400 || w->closes) {   /* 2 s at most */
        tern_loop_stop(w->loop);
        return;
    }
    if (w->opened && !w->reset_sent) {
        w->reset_sent = true;
        unsigned char f[16];
        size_t n = rst_frame(f, 1);
        assert_int_equal(write(w->fd, f, n), (ssize_t)n);
    }
}

static void a_websocket_over_a_stream_closes_when_the_peer_resets_it(void **state) {
    (void)state;
    wsapp w = {0};
    tern_server *srv;
    tern_timer *tick;
    tern_server_options opt = {.http2 = TERN_HTTP2_CLEARTEXT};
    tern_ws_handlers h = {.on_open = ws_opened, .on_close = ws_closed};
    assert_int_equal(tern_loop_new(&w.loop, NULL), 0);
    assert_int_equal(tern_server_new(&srv, w.loop, &opt), 0);
    assert_int_equal(tern_listen(srv, "127.0.0.1", 0, NULL), 0);
    assert_int_equal(tern_ws_route(srv, "/ws", &h, NULL, &w), 0);
    w.fd = client_send_rcvbuf(tern_server_port(srv), 0, "");
    /* The preface, an ACK of the server's SETTINGS (which offer extended
     * CONNECT: it counts once acknowledged), and HEADERS (END_HEADERS) of
     * stream 1: CONNECT with :protocol websocket, :scheme http, :path /ws,
     * :authority x, sec-websocket-version 13, all literal. */
    static const unsigned char block[] = {
        0x02, 7, 'C', 'O', 'N', 'N', 'E', 'C', 'T',
        0x00, 9, ':', 'p', 'r', 'o', 't', 'o', 'c', 'o', 'l', 9, 'w', 'e', 'b', 's', 'o', 'c',
        'k', 'e', 't',
        0x86, 0x04, 3, '/', 'w', 's', 0x01, 1, 'x',
        0x00, 21, 's', 'e', 'c', '-', 'w', 'e', 'b', 's', 'o', 'c', 'k', 'e', 't', '-', 'v', 'e',
        'r', 's', 'i', 'o', 'n', 2, '1', '3'};
    unsigned char buf[256];
    memcpy(buf, preface, PREFACE_LEN);
    size_t n = PREFACE_LEN;
    static const unsigned char ack[9] = {0, 0, 0, 0x04, 0x01, 0, 0, 0, 0};
    memcpy(buf + n, ack, 9);
    n += 9;
    unsigned char hd[9] = {0, 0, sizeof(block), 0x01, 0x04, 0, 0, 0, 1};
    memcpy(buf + n, hd, 9);
    memcpy(buf + n + 9, block, sizeof(block));
    n += 9 + sizeof(block);
    assert_int_equal(write(w.fd, buf, n), (ssize_t)n);
    assert_int_equal(tern_timer_start(w.loop, &tick, 5, 5, ws_tick, &w), 0);
    assert_int_equal(tern_loop_run(w.loop), 0);
    assert_int_equal(w.opened, 1);
    assert_int_equal(w.peer_err, 0);      /* the stream's peer is the connection's */
    assert_int_equal(w.closes, 1);        /* the reset closed it */
    assert_int_equal(w.close_code, 1006); /* no close frame came */
    tern_timer_stop(tick);
    tern_server_free(srv);
    tern_loop_free(w.loop);
    close(w.fd);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_websocket_over_a_stream_closes_when_the_peer_resets_it),
        cmocka_unit_test(a_reset_stream_aborts_its_request_alone),
        cmocka_unit_test(a_closed_connection_aborts_every_stream),
        cmocka_unit_test(a_body_not_asked_for_holds_its_window_shut),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
