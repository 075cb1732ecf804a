/* The client's side of the frame layer, against a raw server in the test:
 * every frame the client writes is masked, with a key of its own; the
 * payload unmasks to what was sent; a masked frame from the server is a
 * protocol error (1002); the masking keys look like random bytes. And the
 * client's flow control: pausing delivers nothing until resumed, aborting
 * resets the connection, a small rcvbuf holds a paused reader back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tern/tern.h"
#include "ws/frame.h"
#include "ws/handshake.h"
#include "ws/ws.h"

/* The raw server: one listening socket, one accepted peer, polled from a
 * timer on the client's loop (the test has one thread). */
typedef struct raw {
    tern_loop *loop;
    tern_timer *tick;
    int lfd, fd;
    char in[65536];
    size_t in_len;
    bool answered;
    bool send_masked;          /* after the 101, send the client a masked frame */
    bool mute;                 /* read the upgrade request, never answer it */
    int opened, close_code, connect_err, connect_errors;
    /* The peer's end as the first read that met it saw it: 0 not yet,
     * -ECONNRESET, or 1 for a FIN. A reset is reported by one read only
     * (the next one reads 0), so whichever read meets it must keep it. */
    int peer_end;
    uint8_t keys[2][4];
    int frames;
    char payload[2][16];
} raw;

static int raw_listen(raw *r) {
    r->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(r->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(r->lfd, 4), 0);
    socklen_t len = sizeof(a);
    getsockname(r->lfd, (struct sockaddr *)&a, &len);
    r->fd = -1;
    return ntohs(a.sin_port);
}

/* Keeps what a read of the peer that returned n said of its end. */
static void note_end(raw *r, ssize_t n) {
    if (r->peer_end == 0 && n == 0)
        r->peer_end = 1;
    else if (r->peer_end == 0 && n < 0 && errno == ECONNRESET)
        r->peer_end = -ECONNRESET;
}

/* Answers the upgrade request with a correct 101. */
static void answer(raw *r) {
    char *key = strstr(r->in, "Sec-WebSocket-Key: ");
    assert_non_null(key);
    key += strlen("Sec-WebSocket-Key: ");
    char accept[TERN__WS_ACCEPT_LEN + 1];
    tern__ws_accept(key, 24, accept);
    char resp[256];
    int n = snprintf(resp, sizeof(resp),
                     "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                     "Connection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n", accept);
    assert_int_equal(write(r->fd, resp, (size_t)n), n);
    char *end = strstr(r->in, "\r\n\r\n") + 4;
    r->in_len -= (size_t)(end - r->in);
    memmove(r->in, end, r->in_len);
    r->answered = true;
    if (r->send_masked) {
        static const uint8_t f[] = {0x81, 0x82, 1, 2, 3, 4, 'h' ^ 1, 'i' ^ 2};
        assert_int_equal(write(r->fd, f, sizeof(f)), (ssize_t)sizeof(f));
    }
}

/* Reads the client's frames: each must be masked. */
static void read_frames(raw *r) {
    for (;;) {
        tern__ws_header h;
        int n = tern__ws_parse_header((uint8_t *)r->in, r->in_len, true, false, &h);
        assert_true(n >= 0);   /* require_mask: an unmasked client frame is -1002 */
        if (n == 0 || r->in_len < (size_t)n + h.payload_len)
            return;
        uint8_t *p = (uint8_t *)r->in + n;
        tern__ws_mask(p, (size_t)h.payload_len, h.mask, 0);
        if (h.opcode == TERN__WS_OP_TEXT && r->frames < 2) {
            memcpy(r->keys[r->frames], h.mask, 4);
            snprintf(r->payload[r->frames], sizeof(r->payload[0]), "%.*s", (int)h.payload_len, p);
            r->frames++;
        }
        if (h.opcode == TERN__WS_OP_CLOSE) {   /* answer it, and end */
            uint8_t f[4] = {0x88, 2, p[0], p[1]};
            write(r->fd, f, 4);
            close(r->fd);
            r->fd = -1;
            return;
        }
        r->in_len -= (size_t)n + (size_t)h.payload_len;
        memmove(r->in, r->in + n + h.payload_len, r->in_len);
    }
}

static void tick(tern_timer *t, void *user) {
    raw *r = user;
    if (r->fd < 0 && !r->answered) {
        r->fd = accept4(r->lfd, NULL, NULL, SOCK_NONBLOCK);
        if (r->fd < 0)
            return;
    }
    if (r->fd < 0)
        return;
    ssize_t n = read(r->fd, r->in + r->in_len, sizeof(r->in) - r->in_len - 1);
    if (n <= 0) {
        note_end(r, n);
        return;
    }
    r->in_len += (size_t)n;
    r->in[r->in_len] = '\0';
    if (!r->answered && !r->mute && strstr(r->in, "\r\n\r\n"))
        answer(r);
    if (r->answered)
        read_frames(r);
}

static void on_open(tern_ws *ws, void *user) {
    raw *r = user;
    r->opened++;
    assert_null(tern_ws_server(ws));
    /* topics are a server's: a client's connection is refused, not crashed on */
    assert_int_equal(tern_ws_subscribe(ws, "t"), -EINVAL);
    assert_int_equal(tern_ws_subscribe_from(ws, "t", 1, 1, NULL), -EINVAL);
    assert_false(tern_ws_subscribed(ws, "t"));
    assert_int_equal(tern_ws_unsubscribe(ws, "t"), -ENOENT);
    if (!r->send_masked) {
        assert_int_equal(tern_ws_send(ws, "hello", 5, TERN_WS_TEXT), TERN_SEND_OK);
        assert_int_equal(tern_ws_send(ws, "hello", 5, TERN_WS_TEXT), TERN_SEND_OK);
        assert_int_equal(tern_ws_close(ws, 1000, NULL), 0);
    }
}

static void on_close(tern_ws *ws, int code, const char *reason, size_t reason_len, void *user) {
    raw *r = user;
    r->close_code = code;
    tern_loop_stop(r->loop);
}

static void on_connect_error(const tern_ws_connect_error *e, void *user) {
    raw *r = user;
    r->connect_err = e->err;
    r->connect_errors++;
    tern_loop_stop(r->loop);
}

static void run(raw *r) {
    int port = raw_listen(r);
    assert_int_equal(tern_loop_new(&r->loop, NULL), 0);
    assert_int_equal(tern_timer_start(r->loop, &r->tick, 2, 2, tick, r), 0);
    tern_ws_handlers h = {.on_open = on_open, .on_close = on_close,
                          .on_connect_error = on_connect_error};
    char url[64];
    snprintf(url, sizeof(url), "ws://127.0.0.1:%d/x", port);
    assert_int_equal(tern_ws_connect(r->loop, url, &h, NULL, r), 0);
    assert_int_equal(tern_loop_run(r->loop), 0);
    tern_timer_stop(r->tick);
    if (r->fd >= 0)
        close(r->fd);
    close(r->lfd);
    /* Let net free what the close left for the batch end. */
    tern_loop_free(r->loop);
}

static void every_frame_is_masked_with_a_key_of_its_own(void **state) {
    raw r = {0};
    run(&r);
    assert_int_equal(r.opened, 1);
    assert_int_equal(r.frames, 2);
    assert_string_equal(r.payload[0], "hello");
    assert_string_equal(r.payload[1], "hello");
    assert_memory_not_equal(r.keys[0], r.keys[1], 4);
    assert_int_equal(r.close_code, 1000);
}

static void a_masked_frame_from_the_server_is_a_protocol_error(void **state) {
    raw r = {.send_masked = true};
    run(&r);
    assert_int_equal(r.opened, 1);
    assert_int_equal(r.close_code, TERN_WS_PROTOCOL_ERROR);
}

static void a_refused_connect_is_reported_from_the_loop(void **state) {
    raw r = {0};
    int port = raw_listen(&r);
    close(r.lfd);   /* nobody listens there now */
    assert_int_equal(tern_loop_new(&r.loop, NULL), 0);
    tern_ws_handlers h = {.on_open = on_open, .on_close = on_close,
                          .on_connect_error = on_connect_error};
    char url[64];
    snprintf(url, sizeof(url), "ws://127.0.0.1:%d/", port);
    assert_int_equal(tern_ws_connect(r.loop, url, &h, NULL, &r), 0);
    assert_int_equal(r.connect_err, 0);   /* not from inside the call */
    assert_int_equal(tern_loop_run(r.loop), 0);
    assert_int_equal(r.connect_err, -ECONNREFUSED);
    assert_int_equal(r.opened, 0);
    tern_loop_free(r.loop);
}

/* A port on 127.0.0.1 where nobody listens. */
static int closed_port(void) {
    raw r = {0};
    int port = raw_listen(&r);
    close(r.lfd);
    return port;
}

/* Connects to n addresses of 127.0.0.1 (ports[i]) in turn, as to a name
 * that resolves to them, and runs the loop. */
static void run_to(raw *r, const int *ports, int n) {
    struct sockaddr_in sin[4];
    const struct sockaddr *addrs[4];
    socklen_t lens[4];
    for (int i = 0; i < n; i++) {
        sin[i] = (struct sockaddr_in){.sin_family = AF_INET, .sin_port = htons((uint16_t)ports[i])};
        sin[i].sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        addrs[i] = (const struct sockaddr *)&sin[i];
        lens[i] = sizeof(sin[i]);
    }
    assert_int_equal(tern_loop_new(&r->loop, NULL), 0);
    assert_int_equal(tern_timer_start(r->loop, &r->tick, 2, 2, tick, r), 0);
    tern_ws_handlers h = {.on_open = on_open, .on_close = on_close,
                          .on_connect_error = on_connect_error};
    assert_int_equal(tern__ws_connect_to(r->loop, "ws://localhost/x", addrs, lens, n, &h, NULL, r, NULL),
                     0);
    assert_int_equal(tern_loop_run(r->loop), 0);
    tern_timer_stop(r->tick);
    if (r->fd >= 0)
        close(r->fd);
    if (r->lfd >= 0)
        close(r->lfd);
    tern_loop_free(r->loop);
}

/* localhost is often ::1 first and then 127.0.0.1, and a server may
 * listen on only one: an address that refuses is not the end. */
static void the_next_address_is_tried_when_one_refuses(void **state) {
    raw r = {0};
    int ports[3] = {closed_port(), closed_port(), raw_listen(&r)};
    run_to(&r, ports, 3);
    assert_int_equal(r.connect_errors, 0);
    assert_int_equal(r.opened, 1);
    assert_int_equal(r.frames, 2);
    assert_string_equal(r.payload[0], "hello");
    assert_int_equal(r.close_code, 1000);
}

static void every_address_refusing_is_reported_once(void **state) {
    raw r = {.lfd = -1, .fd = -1, .answered = true};
    int ports[2] = {closed_port(), closed_port()};
    run_to(&r, ports, 2);
    assert_int_equal(r.connect_errors, 1);
    assert_int_equal(r.connect_err, -ECONNREFUSED);
    assert_int_equal(r.opened, 0);
}

static void bad_urls_and_headers_are_refused(void **state) {
    tern_loop *loop;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    tern_ws_handlers h = {.on_connect_error = on_connect_error};
    static const char *const bad[] = {"http://x/", "ws://", "ws://:80/", "ws://h:0/",
                                      "ws://h:65536/", "ws://u@h/", "ws://h/#frag",
                                      "ws://[::1/", "ws://h/a b", "ws+unix:",
                                      "redis://127.0.0.1:1", NULL};   /* parsed, not a WebSocket's */
    for (int i = 0; bad[i]; i++)
        if (tern_ws_connect(loop, bad[i], &h, NULL, NULL) != -EINVAL)
            fail_msg("%s was not refused", bad[i]);
    const char *hdrs[] = {"Sec-WebSocket-Key: x", NULL};
    tern_ws_client_options o = {.headers = hdrs};
    assert_int_equal(tern_ws_connect(loop, "ws://127.0.0.1:1/", &h, &o, NULL), -EINVAL);
    const char *split[] = {"X: a\r\nY: b", NULL};
    o.headers = split;
    assert_int_equal(tern_ws_connect(loop, "ws://127.0.0.1:1/", &h, &o, NULL), -EINVAL);
    tern_ws_handlers no_error = {0};
    assert_int_equal(tern_ws_connect(loop, "ws://127.0.0.1:1/", &no_error, NULL, NULL), -EINVAL);
    tern_ws_client_options dns = {.dns_servers = "not an address"};
    assert_int_equal(tern_ws_connect(loop, "ws://example.invalid/", &h, &dns, NULL), -EINVAL);
    tern_loop_free(loop);
}

/* Not a test of randomness, which would need far more: a check that the
 * generator is not stuck, not a counter, and not biased in a gross way. */
static void masking_keys_look_random(void **state) {
    enum { N = 1 << 16 };
    unsigned counts[256] = {0};
    uint8_t prev[4] = {0}, k[4];
    int same = 0;
    for (int i = 0; i < N; i++) {
        tern__ws_mask_key(k);
        same += memcmp(k, prev, 4) == 0;
        memcpy(prev, k, 4);
        for (int j = 0; j < 4; j++)
            counts[k[j]]++;
    }
    assert_true(same <= 1);
    /* 4N bytes: 1024 expected per value; a sane generator stays well
     * within +-25% (about 8 standard deviations). */
    for (int v = 0; v < 256; v++)
        if (counts[v] < 768 || counts[v] > 1280)
            fail_msg("byte %d came %u times in %d", v, counts[v], 4 * N);
}

/* ---- flow control and the abrupt end (tern_ws_pause, _resume, _abort,
 * the rcvbuf option), against the same raw server ---------------------- */

/* A client connection's story for the tests below. */
typedef struct flow {
    raw r;
    tern_ws *ws;
    tern_timer *later;
    bool in_call;           /* inside one of our tern_ws_* calls */
    bool paused;            /* we paused it and have not resumed */
    int messages;
    char got[4][8];
    int close_code, closes;
    size_t pushed;          /* bytes the raw server's socket took while we were paused */
} flow;

static void flow_later(tern_timer *t, void *user);

/* Three messages in one write, so that they come in one read. */
static void push_three(raw *r) {
    static const uint8_t f[] = {0x81, 2, 'm', '1', 0x81, 2, 'm', '2', 0x81, 2, 'm', '3'};
    assert_int_equal(write(r->fd, f, sizeof(f)), (ssize_t)sizeof(f));
}

static void flow_tick(tern_timer *t, void *user) {
    flow *f = user;
    bool was = f->r.answered;
    tick(t, &f->r);
    if (!was && f->r.answered)
        push_three(&f->r);
}

static void pause_open(tern_ws *ws, void *user) {
    flow *f = user;
    f->ws = ws;
    f->in_call = true;
    assert_int_equal(tern_ws_pause(ws), 0);
    f->in_call = false;
    f->paused = true;
    assert_int_equal(tern_timer_start(f->r.loop, &f->later, 60, 0, flow_later, f), 0);
}

/* After m1, pause again: m2 and m3, read with it, must wait. */
static void pause_message(tern_ws *ws, const char *data, size_t len, int opcode, void *user) {
    flow *f = user;
    assert_false(f->in_call);
    assert_false(f->paused);
    snprintf(f->got[f->messages++], sizeof(f->got[0]), "%.*s", (int)len, data);
    if (f->messages == 1) {
        assert_int_equal(tern_ws_pause(ws), 0);
        f->paused = true;
        assert_int_equal(tern_timer_again(f->later, 60), 0);
    } else if (f->messages == 3) {
        assert_int_equal(tern_ws_close(ws, 1000, NULL), 0);
    }
}

static void flow_later(tern_timer *t, void *user) {
    flow *f = user;
    f->paused = false;
    f->in_call = true;
    assert_int_equal(tern_ws_resume(f->ws), 0);
    f->in_call = false;
}

static void flow_close(tern_ws *ws, int code, const char *reason, size_t reason_len, void *user) {
    flow *f = user;
    assert_false(f->in_call);
    f->close_code = code;
    f->closes++;
    tern_loop_stop(f->r.loop);
}

static void flow_connect_error(const tern_ws_connect_error *e, void *user) {
    fail_msg("connect: %s", e->message);
}

/* Runs one client with handlers h (and options o) against the raw server,
 * whose peer socket is left open in f->r.fd for the test to look at. */
static void flow_run(flow *f, const tern_ws_handlers *h, const tern_ws_client_options *o,
                     tern_timer_fn tick_fn) {
    int port = raw_listen(&f->r);
    assert_int_equal(tern_loop_new(&f->r.loop, NULL), 0);
    assert_int_equal(tern_timer_start(f->r.loop, &f->r.tick, 2, 2, tick_fn, f), 0);
    char url[64];
    snprintf(url, sizeof(url), "ws://127.0.0.1:%d/x", port);
    assert_int_equal(tern_ws_connect(f->r.loop, url, h, o, f), 0);
    assert_int_equal(tern_loop_run(f->r.loop), 0);
    tern_timer_stop(f->r.tick);
    if (f->later)
        tern_timer_stop(f->later);
    close(f->r.lfd);
    tern_loop_free(f->r.loop);
}

static void a_paused_connection_delivers_nothing_until_resumed(void **state) {
    flow f = {0};
    tern_ws_handlers h = {.on_open = pause_open, .on_message = pause_message,
                          .on_close = flow_close, .on_connect_error = flow_connect_error};
    flow_run(&f, &h, NULL, flow_tick);
    if (f.r.fd >= 0)
        close(f.r.fd);
    assert_int_equal(f.messages, 3);
    assert_string_equal(f.got[0], "m1");   /* in order, none lost */
    assert_string_equal(f.got[1], "m2");
    assert_string_equal(f.got[2], "m3");
    assert_int_equal(f.close_code, 1000);
    assert_int_equal(f.closes, 1);
}

static void abort_open(tern_ws *ws, void *user) {
    flow *f = user;
    assert_int_equal(tern_ws_send(ws, "bye", 3, TERN_WS_TEXT), TERN_SEND_OK);
    f->in_call = true;
    assert_int_equal(tern_ws_abort(ws), 0);
    f->in_call = false;
    assert_int_equal(f->closes, 0);   /* on_close comes later, from the loop */
    assert_int_equal(tern_ws_abort(ws), -EPIPE);
    assert_int_equal(tern_ws_send(ws, "x", 1, TERN_WS_TEXT), -EPIPE);
    assert_int_equal(tern_ws_pause(ws), -EPIPE);
    assert_int_equal(tern_ws_close(ws, 1000, NULL), -EPIPE);
}

/* The raw server's view of its peer's end: -ECONNRESET, 1 (FIN), or
 * -EAGAIN when neither came within a second. The raw server's own tick may
 * have met it first. */
static int peer_end(raw *r) {
    char buf[256];
    for (int i = 0; i < 200 && r->peer_end == 0; i++) {
        ssize_t n = read(r->fd, buf, sizeof(buf));
        note_end(r, n);
        if (n < 0 && errno != EAGAIN && r->peer_end == 0)
            return -errno;
        if (r->peer_end == 0)
            usleep(5000);
    }
    return r->peer_end != 0 ? r->peer_end : -EAGAIN;
}

static void abort_ends_with_a_reset_and_a_later_1006(void **state) {
    flow f = {0};
    tern_ws_handlers h = {.on_open = abort_open, .on_close = flow_close,
                          .on_connect_error = flow_connect_error};
    flow_run(&f, &h, NULL, flow_tick);
    assert_int_equal(f.closes, 1);
    assert_int_equal(f.close_code, TERN_WS_ABNORMAL);
    assert_true(f.r.fd >= 0);
    /* No close frame, no FIN: a reset (what was sent before it may or
     * may not have been read first; the raw server read nothing yet). */
    assert_int_equal(peer_end(&f.r), -ECONNRESET);
    close(f.r.fd);
}

/* The raw server writes 1 KiB frames as fast as its socket (with a small
 * send buffer) takes them, while the client is paused; after 300 ms the
 * client aborts. */
static void push_tick(tern_timer *t, void *user) {
    flow *f = user;
    bool was = f->r.answered;
    tick(t, &f->r);
    if (!f->r.answered || f->r.fd < 0)
        return;
    if (!was) {
        int small = 4096;
        setsockopt(f->r.fd, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
    }
    static uint8_t frame[4 + 1024] = {0x82, 126, 1024 >> 8, 1024 & 0xFF};
    ssize_t n;
    while ((n = send(f->r.fd, frame, sizeof(frame), MSG_NOSIGNAL)) > 0)
        f->pushed += (size_t)n;
}

static void push_later(tern_timer *t, void *user) {
    flow *f = user;
    assert_int_equal(tern_ws_abort(f->ws), 0);
}

static void push_open(tern_ws *ws, void *user) {
    flow *f = user;
    f->ws = ws;
    assert_int_equal(tern_ws_pause(ws), 0);
    assert_int_equal(tern_timer_start(f->r.loop, &f->later, 300, 0, push_later, f), 0);
}

static size_t pushed_while_paused(int rcvbuf) {
    flow f = {0};
    tern_ws_handlers h = {.on_open = push_open, .on_close = flow_close,
                          .on_connect_error = flow_connect_error};
    tern_ws_client_options o = {.rcvbuf = rcvbuf};
    flow_run(&f, &h, &o, push_tick);
    close(f.r.fd);
    assert_int_equal(f.close_code, TERN_WS_ABNORMAL);
    return f.pushed;
}

/* What a paused reader holds back is its receive buffer and the sender's
 * send buffer: with rcvbuf small, far less than the system's default. */
static void rcvbuf_makes_a_paused_reader_hold_back_sooner(void **state) {
    size_t small = pushed_while_paused(4096);
    size_t dflt = pushed_while_paused(0);
    print_message("pushed while paused: %zu bytes with rcvbuf 4096, %zu without\n", small, dflt);
    assert_true(small < 48 * 1024);
    assert_true(dflt > 2 * small);
}

static void bad_rcvbuf_is_refused(void **state) {
    tern_loop *loop;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    tern_ws_handlers h = {.on_connect_error = flow_connect_error};
    tern_ws_client_options o = {.rcvbuf = -1};
    assert_int_equal(tern_ws_connect(loop, "ws://127.0.0.1:1/", &h, &o, NULL), -EINVAL);
    assert_int_equal(tern_ws_pause(NULL), -EINVAL);
    assert_int_equal(tern_ws_resume(NULL), -EINVAL);
    assert_int_equal(tern_ws_abort(NULL), -EINVAL);
    tern_loop_free(loop);
}

/* ---- names: resolved by c-ares on the loop ---------------------------- */

/* A DNS server on 127.0.0.1 for the tests (nothing leaves loopback): it
 * answers every query "no such name" (NXDOMAIN), or, silent, nothing at
 * all (a resolution that takes its time). Polled by a timer on the
 * client's loop, as the raw server is. */
typedef struct fake_dns {
    int fd;
    bool silent;
    int queries;
    char servers[32];      /* "127.0.0.1:PORT", for dns_servers */
} fake_dns;

static void dns_open(fake_dns *f, bool silent) {
    f->fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(f->fd, (struct sockaddr *)&a, sizeof(a)), 0);
    socklen_t len = sizeof(a);
    getsockname(f->fd, (struct sockaddr *)&a, &len);
    f->silent = silent;
    f->queries = 0;
    snprintf(f->servers, sizeof(f->servers), "127.0.0.1:%d", ntohs(a.sin_port));
}

static void dns_poll(fake_dns *f) {
    uint8_t q[512];
    struct sockaddr_storage from;
    socklen_t flen;
    ssize_t n;
    while ((flen = sizeof(from)),
           (n = recvfrom(f->fd, q, sizeof(q), 0, (struct sockaddr *)&from, &flen)) >= 12) {
        f->queries++;
        if (f->silent)
            continue;
        q[2] |= 0x80;                    /* QR: an answer, to the same question */
        q[3] = (uint8_t)(0x80 | 3);      /* RA, RCODE 3: NXDOMAIN */
        sendto(f->fd, q, (size_t)n, 0, (struct sockaddr *)&from, flen);
    }
}

/* A client against a name, with the fake DNS, and a timer ticking every
 * 20 ms meanwhile (the loop is not blocked while the name resolves). */
typedef struct named {
    raw r;
    fake_dns dns;
    tern_timer *ticker;
    int ticks, ticks_at_error;
    bool in_connect;
    uint64_t t0, took;
} named;

static void named_tick(tern_timer *t, void *user) {
    named *n = user;
    dns_poll(&n->dns);
    tick(t, &n->r);
}

static void named_ticker(tern_timer *t, void *user) {
    named *n = user;
    n->ticks++;
}

static void named_connect_error(const tern_ws_connect_error *e, void *user) {
    named *n = user;
    assert_false(n->in_connect);
    n->ticks_at_error = n->ticks;
    n->took = tern_loop_now(n->r.loop) - n->t0;
    print_message("on_connect_error: %s (%s)\n", e->message, tern_err_name(e->err));
    on_connect_error(e, &n->r);
}

static void named_run(named *n, const char *host, bool silent, uint32_t timeout_ms) {
    int port = raw_listen(&n->r);
    dns_open(&n->dns, silent);
    assert_int_equal(tern_loop_new(&n->r.loop, NULL), 0);
    assert_int_equal(tern_timer_start(n->r.loop, &n->r.tick, 2, 2, named_tick, n), 0);
    assert_int_equal(tern_timer_start(n->r.loop, &n->ticker, 20, 20, named_ticker, n), 0);
    tern_ws_handlers h = {.on_open = on_open, .on_close = on_close,
                          .on_connect_error = named_connect_error};
    tern_ws_client_options o = {.dns_servers = n->dns.servers, .connect_timeout_ms = timeout_ms};
    char url[300];
    snprintf(url, sizeof(url), "ws://%s:%d/x", host, port);
    n->t0 = tern_loop_now(n->r.loop);
    n->in_connect = true;
    int err = tern_ws_connect(n->r.loop, url, &h, &o, &n->r);
    n->in_connect = false;
    assert_int_equal(err, 0);
    assert_int_equal(tern_loop_run(n->r.loop), 0);
    tern_timer_stop(n->r.tick);
    tern_timer_stop(n->ticker);
    if (n->r.fd >= 0)
        close(n->r.fd);
    close(n->r.lfd);
    close(n->dns.fd);
    tern_loop_free(n->r.loop);
}

/* localhost is in /etc/hosts, which c-ares reads before asking DNS. */
static void localhost_resolves_through_the_resolver(void **state) {
    named n = {0};
    named_run(&n, "localhost", false, 0);
    assert_int_equal(n.r.connect_errors, 0);
    assert_int_equal(n.r.opened, 1);
    assert_int_equal(n.r.frames, 2);
    assert_int_equal(n.r.close_code, 1000);
    assert_int_equal(n.dns.queries, 0);
}

static void a_name_that_does_not_exist_fails_from_the_loop(void **state) {
    named n = {0};
    named_run(&n, "no-such-host.invalid", false, 0);
    assert_int_equal(n.r.connect_errors, 1);
    assert_int_equal(n.r.connect_err, TERN_ENOHOST);
    assert_int_equal(n.r.opened, 0);
    assert_true(n.dns.queries >= 1);
}

/* A DNS server that never answers: the loop goes on (the ticker fires
 * meanwhile) until connect_timeout_ms ends the connect. */
static void a_slow_resolution_does_not_block_the_loop(void **state) {
    named n = {0};
    named_run(&n, "slow.example", true, 300);
    assert_int_equal(n.r.connect_errors, 1);
    assert_int_equal(n.r.connect_err, -ETIMEDOUT);
    assert_true(n.dns.queries >= 1);
    assert_true(n.ticks_at_error >= 5);
    assert_true(n.took >= 290 && n.took < 2000);
}

/* ---- cancelling a pending connect (tern_ws_connect2, _cancel) --------- */

/* One or more connects to cancel, each at a stage of its own: the name
 * resolving (a silent DNS server), TCP connecting (a listener whose
 * backlog is full, so the SYN goes unanswered), or the handshake (a
 * server that reads the request and never answers). */
typedef struct cancel_case {
    raw r;                     /* the mute server */
    fake_dns dns;              /* silent */
    int full_lfd;              /* a listener with its backlog full, or -1 */
    int fillers[8];
    tern_timer *poll, *later;
    tern_ws_connecting *c;
    bool cancelled;            /* c was cancelled */
    bool in_cancel, in_free;
    int errors, errors_in_free, opened;
    int err;
    bool connected;
} cancel_case;

/* A listener on 127.0.0.1 whose accept queue is full: nobody accepts, and
 * Linux drops further SYNs (tcp_abort_on_overflow is 0), so a connect to
 * it stays pending until the client gives up. */
static int full_listener(cancel_case *cc) {
    cc->full_lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(cc->full_lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(cc->full_lfd, 0), 0);
    socklen_t len = sizeof(a);
    getsockname(cc->full_lfd, (struct sockaddr *)&a, &len);
    for (int i = 0; i < 8; i++) {
        cc->fillers[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        connect(cc->fillers[i], (struct sockaddr *)&a, sizeof(a));
    }
    usleep(20000);   /* the fillers' handshakes, where they complete */
    return ntohs(a.sin_port);
}

static void cc_open(tern_ws *ws, void *user) {
    cancel_case *cc = user;
    cc->opened++;
    tern_ws_close(ws, 1000, NULL);
}

static void cc_error(const tern_ws_connect_error *e, void *user) {
    cancel_case *cc = user;
    assert_false(cc->in_cancel);   /* from the loop, not from inside the cancel */
    print_message("on_connect_error: %s (%s)%s\n", e->message, tern_err_name(e->err),
                  cc->in_free ? ", in tern_loop_free" : "");
    cc->errors++;
    cc->errors_in_free += cc->in_free;
    cc->err = e->err;
    cc->connected = e->connected;
    cc->c = NULL;   /* the handle is gone */
    tern_loop_stop(cc->r.loop);
}

static void cc_cancel(cancel_case *cc) {
    cc->in_cancel = true;
    tern_ws_connect_cancel(cc->c);
    tern_ws_connect_cancel(cc->c);   /* a second cancel does nothing */
    cc->in_cancel = false;
    cc->cancelled = true;
}

static void cc_poll(tern_timer *t, void *user) {
    cancel_case *cc = user;
    if (cc->dns.fd > 0)
        dns_poll(&cc->dns);
    tick(t, &cc->r);
    /* In the handshake: cancel once the server has the whole request. */
    if (cc->r.mute && cc->c && !cc->cancelled && strstr(cc->r.in, "\r\n\r\n"))
        cc_cancel(cc);
}

static void cc_later(tern_timer *t, void *user) {
    cancel_case *cc = user;
    if (cc->c && !cc->cancelled)
        cc_cancel(cc);
}

/* Starts a case's loop, its mute server and silent DNS; returns the mute
 * server's port. */
static int cc_setup(cancel_case *cc) {
    cc->r.mute = true;
    int port = raw_listen(&cc->r);
    dns_open(&cc->dns, true);
    cc->full_lfd = -1;
    assert_int_equal(tern_loop_new(&cc->r.loop, NULL), 0);
    assert_int_equal(tern_timer_start(cc->r.loop, &cc->poll, 2, 2, cc_poll, cc), 0);
    return port;
}

static void cc_teardown(cancel_case *cc, bool free_loop) {
    tern_timer_stop(cc->poll);
    tern_timer_stop(cc->later);
    if (free_loop) {
        cc->in_free = true;
        tern_loop_free(cc->r.loop);
        cc->in_free = false;
    }
    if (cc->r.fd >= 0)
        close(cc->r.fd);
    close(cc->r.lfd);
    close(cc->dns.fd);
    if (cc->full_lfd >= 0) {
        close(cc->full_lfd);
        for (int i = 0; i < 8; i++)
            close(cc->fillers[i]);
    }
}

static tern_ws_connecting *cc_connect(cancel_case *cc, const char *host, int port) {
    tern_ws_handlers h = {.on_open = cc_open, .on_close = on_close, .on_connect_error = cc_error};
    tern_ws_client_options o = {.dns_servers = cc->dns.servers, .connect_timeout_ms = 5000};
    char url[300];
    snprintf(url, sizeof(url), "ws://%s:%d/x", host, port);
    tern_ws_connecting *c = NULL;
    assert_int_equal(tern_ws_connect2(cc->r.loop, url, &h, &o, cc, &c), 0);
    assert_non_null(c);
    return c;
}

/* Runs one connect to host:port, cancelled after later_ms (or, with
 * later_ms 0, when the mute server has its request). */
static void cc_run(cancel_case *cc, const char *host, int port, uint64_t later_ms) {
    cc->c = cc_connect(cc, host, port);
    if (later_ms)
        assert_int_equal(tern_timer_start(cc->r.loop, &cc->later, later_ms, 0, cc_later, cc), 0);
    assert_int_equal(tern_loop_run(cc->r.loop), 0);
    cc_teardown(cc, true);
    assert_true(cc->cancelled);
    assert_int_equal(cc->errors, 1);
    assert_int_equal(cc->errors_in_free, 0);
    assert_int_equal(cc->err, -ECANCELED);
    assert_int_equal(cc->opened, 0);
}

static void cancel_during_resolution(void **state) {
    cancel_case cc = {0};
    cc_setup(&cc);
    cc_run(&cc, "slow.example", 80, 50);
    assert_false(cc.connected);
    assert_true(cc.dns.queries >= 1);
}

static void cancel_during_tcp_connect(void **state) {
    cancel_case cc = {0};
    cc_setup(&cc);
    int port = full_listener(&cc);
    cc_run(&cc, "127.0.0.1", port, 100);
    assert_false(cc.connected);
}

static void cancel_during_the_handshake(void **state) {
    cancel_case cc = {0};
    int port = cc_setup(&cc);
    cc_run(&cc, "127.0.0.1", port, 0);
    assert_true(cc.connected);
    assert_non_null(strstr(cc.r.in, "Upgrade: websocket"));
}

/* Cancelled right after the call, before the loop ran at all. */
static void cancel_before_the_loop_runs(void **state) {
    cancel_case cc = {0};
    int port = cc_setup(&cc);
    cc.c = cc_connect(&cc, "127.0.0.1", port);
    cc_cancel(&cc);
    assert_int_equal(cc.errors, 0);
    assert_int_equal(tern_loop_run(cc.r.loop), 0);
    cc_teardown(&cc, true);
    assert_int_equal(cc.errors, 1);
    assert_int_equal(cc.err, -ECANCELED);
    assert_int_equal(cc.opened, 0);
}

static void cc_stop(tern_timer *t, void *user) {
    cancel_case *cc = user;
    tern_loop_stop(cc->r.loop);
}

/* Freeing the loop with connects pending at each stage: each gets its
 * on_connect_error (-ECANCELED) from inside tern_loop_free, and nothing
 * leaks (ASan). */
static void freeing_the_loop_cancels_pending_connects(void **state) {
    cancel_case cc = {0};
    int port = cc_setup(&cc);
    cc_connect(&cc, "slow.example", 80);
    cc_connect(&cc, "127.0.0.1", full_listener(&cc));
    cc_connect(&cc, "127.0.0.1", port);
    cc_connect(&cc, "localhost", port);
    assert_int_equal(tern_timer_start(cc.r.loop, &cc.later, 150, 0, cc_stop, &cc), 0);
    assert_int_equal(tern_loop_run(cc.r.loop), 0);
    assert_int_equal(cc.errors, 0);
    assert_true(cc.dns.queries >= 1);
    cc_teardown(&cc, true);
    assert_int_equal(cc.errors, 4);
    assert_int_equal(cc.errors_in_free, 4);
    assert_int_equal(cc.err, -ECANCELED);
    assert_int_equal(cc.opened, 0);
}

/* Never run at all: the resolution and the connect are freed as well. */
static void freeing_a_loop_that_never_ran(void **state) {
    cancel_case cc = {0};
    int port = cc_setup(&cc);
    cc_connect(&cc, "slow.example", 80);
    cc_connect(&cc, "127.0.0.1", port);
    cc_teardown(&cc, true);
    assert_int_equal(cc.errors, 2);
    assert_int_equal(cc.errors_in_free, 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_frame_is_masked_with_a_key_of_its_own),
        cmocka_unit_test(a_masked_frame_from_the_server_is_a_protocol_error),
        cmocka_unit_test(a_refused_connect_is_reported_from_the_loop),
        cmocka_unit_test(the_next_address_is_tried_when_one_refuses),
        cmocka_unit_test(every_address_refusing_is_reported_once),
        cmocka_unit_test(bad_urls_and_headers_are_refused),
        cmocka_unit_test(masking_keys_look_random),
        cmocka_unit_test(a_paused_connection_delivers_nothing_until_resumed),
        cmocka_unit_test(abort_ends_with_a_reset_and_a_later_1006),
        cmocka_unit_test(rcvbuf_makes_a_paused_reader_hold_back_sooner),
        cmocka_unit_test(bad_rcvbuf_is_refused),
        cmocka_unit_test(localhost_resolves_through_the_resolver),
        cmocka_unit_test(a_name_that_does_not_exist_fails_from_the_loop),
        cmocka_unit_test(a_slow_resolution_does_not_block_the_loop),
        cmocka_unit_test(cancel_during_resolution),
        cmocka_unit_test(cancel_during_tcp_connect),
        cmocka_unit_test(cancel_during_the_handshake),
        cmocka_unit_test(cancel_before_the_loop_runs),
        cmocka_unit_test(freeing_the_loop_cancels_pending_connects),
        cmocka_unit_test(freeing_a_loop_that_never_ran),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
