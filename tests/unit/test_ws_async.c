/* Answering later, and the per-connection deadline (tern_ws_ref,
 * tern_ws_unref, tern_ws_is_open, tern_ws_set_deadline), driven by a real
 * client on a thread of its own with blocking sockets while the server's
 * loop runs on the test's thread.
 *
 * Checked here: messages kept and answered from a post come back whole and
 * in order, none of the sends happening inside on_message; a reference
 * keeps the tern_ws valid past on_close (closed: sends say -EPIPE), and the
 * last unref frees it (ASan's leak check sees a forgotten one); work done
 * on another thread gets its answer sent through a post to the loop; a
 * deadline closes a quiet connection with 1008 "deadline" after about its
 * time, never before; a deadline moved on every message does not fire
 * while messages come, then fires once when they stop; a cleared one never
 * fires. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "tern/tern.h"

/* ---- a blocking client ------------------------------------------------ */

static uint64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Connects, upgrades to /ws and reads the 101 (and nothing after it). */
static int ws_client(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    /* A frame that never comes fails the read (and the test), not hangs it. */
    struct timeval tv = {.tv_sec = 3};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    const char *req = "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                      "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                      "Sec-WebSocket-Version: 13\r\n\r\n";
    assert_int_equal(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    char head[1024];
    size_t n = 0;
    while (n < 4 || memcmp(head + n - 4, "\r\n\r\n", 4) != 0) {
        assert_true(n < sizeof(head));
        assert_int_equal(read(fd, head + n, 1), 1);   /* byte by byte: nothing past the head */
        n++;
    }
    assert_memory_equal(head, "HTTP/1.1 101", 12);
    return fd;
}

/* Appends one masked frame (payload < 126 bytes) to out; returns its size. */
static size_t frame(char *out, int opcode, const char *payload, size_t len) {
    static const uint8_t key[4] = {0x11, 0x22, 0x33, 0x44};
    out[0] = (char)(0x80 | opcode);
    out[1] = (char)(0x80 | len);
    memcpy(out + 2, key, 4);
    for (size_t i = 0; i < len; i++)
        out[6 + i] = (char)(payload[i] ^ key[i % 4]);
    return 6 + len;
}

static void read_all(int fd, char *p, size_t n) {
    while (n) {
        ssize_t r = read(fd, p, n);
        assert_true(r > 0);
        p += r;
        n -= (size_t)r;
    }
}

/* Reads one server frame (payload < 126 bytes); returns its opcode. */
static int read_frame(int fd, char *payload, size_t *len) {
    uint8_t h[2];
    read_all(fd, (char *)h, 2);
    assert_true((h[1] & 0x80) == 0);   /* a server's frames are not masked */
    *len = h[1] & 0x7f;
    assert_true(*len < 126);
    read_all(fd, payload, *len);
    return h[0] & 0x0f;
}

/* ---- the application -------------------------------------------------- */

/* A message kept to be answered later: the connection's reference with a
 * copy of the bytes. */
typedef struct job {
    tern_ws *ws;
    struct job *next;
    size_t len;
    int opcode;
    char data[];
} job;

typedef struct app {
    tern_loop *loop;
    tern_server *srv;
    int port;
    /* answered later on this loop: a FIFO, drained by one post */
    job *head, **tail;
    bool post_pending;
    bool in_on_message;
    int sent_inside_on_message;
    int answered, opened, closed, close_code;
    /* a reference kept past the close */
    tern_ws *kept;
    int kept_send_after_close;   /* what tern_ws_send said then */
    bool kept_open_after_close;
    tern_timer *check;
    /* another thread's work */
    int to_worker[2];
    pthread_t worker;
    /* the deadline */
    uint32_t deadline_ms;        /* set on open and on every message when non-zero */
    bool clear_on_message;       /* ... or cleared by the first message */
    int deadlines;               /* on_deadline calls */
    /* the client thread's findings */
    int port_for_client;
    int (*client)(struct app *a);
    int client_result;
} app;

static job *job_new(tern_ws *ws, const char *data, size_t len, int opcode) {
    job *j = malloc(sizeof(*j) + len);
    assert_non_null(j);
    memcpy(j->data, data, len);
    j->len = len;
    j->opcode = opcode;
    j->next = NULL;
    tern_ws_ref(ws);
    j->ws = ws;
    return j;
}

/* The loop-side half of every answer: send if still open, drop the ref. */
static void answer(app *a, job *j) {
    if (tern_ws_is_open(j->ws)) {
        if (a->in_on_message)
            a->sent_inside_on_message++;
        assert_true(tern_ws_send(j->ws, j->data, j->len, j->opcode) >= 0);
        a->answered++;
    }
    tern_ws_unref(j->ws);
    free(j);
}

static void drain(tern_loop *loop, void *user) {
    app *a = user;
    a->post_pending = false;
    job *j = a->head;
    a->head = NULL;
    a->tail = &a->head;
    while (j) {
        job *next = j->next;
        answer(a, j);
        j = next;
    }
}

static void on_open(tern_ws *ws, void *user) {
    app *a = user;
    a->opened++;
    if (a->deadline_ms)
        assert_int_equal(tern_ws_set_deadline(ws, a->deadline_ms), 0);
}

/* Keeps the message for the post that drains the queue. */
static void on_message_later(tern_ws *ws, const char *data, size_t len, int opcode, void *user) {
    app *a = user;
    a->in_on_message = true;
    *a->tail = job_new(ws, data, len, opcode);
    a->tail = &(*a->tail)->next;
    if (!a->post_pending) {
        a->post_pending = true;
        assert_int_equal(tern_loop_post(a->loop, drain, a), 0);
    }
    if (a->deadline_ms)
        tern_ws_set_deadline(ws, a->clear_on_message ? 0 : a->deadline_ms);
    a->in_on_message = false;
}

static void on_close(tern_ws *ws, int code, const char *reason, size_t reason_len, void *user) {
    app *a = user;
    a->closed++;
    a->close_code = code;
}

static void on_deadline(tern_ws *ws, void *user) {
    app *a = user;
    a->deadlines++;
    tern_ws_close(ws, 4000, "quiet");
}

static void *client_main(void *arg) {
    app *a = arg;
    a->client_result = a->client(a);
    tern_loop_stop_async(a->loop);
    return NULL;
}

/* Runs the server's loop until the client function (on its own thread) is
 * done, then lets the loop finish what the client's end started. */
static void run(app *a, const tern_ws_handlers *h) {
    a->tail = &a->head;
    assert_int_equal(tern_loop_new(&a->loop, NULL), 0);
    assert_int_equal(tern_server_new(&a->srv, a->loop, NULL), 0);
    assert_int_equal(tern_ws_route(a->srv, "/ws", h, NULL, a), 0);
    assert_int_equal(tern_listen(a->srv, "127.0.0.1", 0, NULL), 0);
    a->port = tern_server_port(a->srv);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, client_main, a), 0);
    assert_int_equal(tern_loop_run(a->loop), 0);
    pthread_join(t, NULL);
}

static void finish(app *a) {
    tern_server_free(a->srv);
    tern_loop_free(a->loop);
}

/* ---- answered later, in order ----------------------------------------- */

static int client_three_messages(app *a) {
    int fd = ws_client(a->port);
    char buf[256];
    size_t n = frame(buf, TERN_WS_TEXT, "one", 3);
    n += frame(buf + n, TERN_WS_BINARY, "two!", 4);
    n += frame(buf + n, TERN_WS_TEXT, "three", 5);
    assert_int_equal(write(fd, buf, n), (ssize_t)n);   /* one write: one read, one batch */
    const char *want[] = {"one", "two!", "three"};
    const int ops[] = {TERN_WS_TEXT, TERN_WS_BINARY, TERN_WS_TEXT};
    for (int i = 0; i < 3; i++) {
        char p[128];
        size_t len;
        assert_int_equal(read_frame(fd, p, &len), ops[i]);
        assert_int_equal(len, strlen(want[i]));
        assert_memory_equal(p, want[i], len);
    }
    close(fd);
    return 0;
}

static void kept_messages_are_answered_later_in_order(void **state) {
    app a = {0};
    const tern_ws_handlers h = {.on_message = on_message_later, .on_close = on_close};
    a.client = client_three_messages;
    run(&a, &h);
    assert_int_equal(a.answered, 3);
    assert_int_equal(a.sent_inside_on_message, 0);
    finish(&a);
}

/* ---- a reference outlives the close ------------------------------------ */

static void keep_one(tern_ws *ws, const char *data, size_t len, int opcode, void *user) {
    app *a = user;
    if (a->kept == NULL) {
        tern_ws_ref(ws);
        a->kept = ws;
        tern_ws_set_user(ws, a);
    }
}

/* After on_close, and after the batch end at which net gave the struct
 * back: a referenced ws is still there, closed. */
static void check_kept(tern_timer *t, void *user) {
    app *a = user;
    if (a->closed == 0)
        return;
    a->kept_open_after_close = tern_ws_is_open(a->kept);
    a->kept_send_after_close = tern_ws_send(a->kept, "late", 4, TERN_WS_TEXT);
    assert_int_equal(tern_ws_set_deadline(a->kept, 100), -EPIPE);
    assert_ptr_equal(tern_ws_user(a->kept), a);
    assert_ptr_equal(tern_ws_loop(a->kept), a->loop);
    tern_ws_unref(a->kept);   /* the last one: freed here (ASan: no leak, no later use) */
    a->kept = NULL;
    tern_timer_stop(t);
    a->check = NULL;
    tern_loop_stop(a->loop);
}

static int client_one_message_then_drop(app *a) {
    int fd = ws_client(a->port);
    char buf[64];
    size_t n = frame(buf, TERN_WS_TEXT, "keep me", 7);
    assert_int_equal(write(fd, buf, n), (ssize_t)n);
    usleep(50 * 1000);
    close(fd);   /* no close frame: the server sees 1006 */
    return 0;
}

static void a_reference_keeps_the_ws_valid_after_on_close(void **state) {
    app a = {0};
    const tern_ws_handlers h = {.on_message = keep_one, .on_close = on_close};
    a.client = client_one_message_then_drop;
    a.tail = &a.head;
    assert_int_equal(tern_loop_new(&a.loop, NULL), 0);
    assert_int_equal(tern_server_new(&a.srv, a.loop, NULL), 0);
    assert_int_equal(tern_ws_route(a.srv, "/ws", &h, NULL, &a), 0);
    assert_int_equal(tern_listen(a.srv, "127.0.0.1", 0, NULL), 0);
    a.port = tern_server_port(a.srv);
    assert_int_equal(tern_timer_start(a.loop, &a.check, 20, 20, check_kept, &a), 0);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, client_main, &a), 0);
    /* The client's stop_async may end the first run before the close is
     * seen: run until check_kept has done its part. */
    while (a.kept != NULL || a.closed == 0)
        assert_int_equal(tern_loop_run(a.loop), 0);
    pthread_join(t, NULL);
    assert_int_equal(a.closed, 1);
    assert_int_equal(a.close_code, TERN_WS_ABNORMAL);
    assert_false(a.kept_open_after_close);
    assert_int_equal(a.kept_send_after_close, -EPIPE);
    finish(&a);
}

/* ---- answered from another thread -------------------------------------- */

static void answer_on_loop(tern_loop *loop, void *user) {
    job *j = user;
    app *a = tern_ws_user(j->ws);
    answer(a, j);
}

/* The worker: takes jobs (already referenced on the loop thread) from a
 * pipe, "works", and posts each answer back to the connection's loop. */
static void *worker_main(void *arg) {
    app *a = arg;
    job *j;
    while (read(a->to_worker[0], &j, sizeof(j)) == (ssize_t)sizeof(j)) {
        usleep(5 * 1000);
        for (size_t i = 0; i < j->len; i++)   /* the "work": upper-case it */
            if (j->data[i] >= 'a' && j->data[i] <= 'z')
                j->data[i] = (char)(j->data[i] - 'a' + 'A');
        assert_int_equal(tern_loop_post(tern_ws_loop(j->ws), answer_on_loop, j), 0);
    }
    return NULL;
}

static void hand_to_worker(tern_ws *ws, const char *data, size_t len, int opcode, void *user) {
    app *a = user;
    tern_ws_set_user(ws, a);
    job *j = job_new(ws, data, len, opcode);   /* the reference is taken here, on the loop */
    assert_int_equal(write(a->to_worker[1], &j, sizeof(j)), (ssize_t)sizeof(j));
}

static int client_two_for_the_worker(app *a) {
    int fd = ws_client(a->port);
    char buf[64];
    size_t n = frame(buf, TERN_WS_TEXT, "hello", 5);
    n += frame(buf + n, TERN_WS_TEXT, "world", 5);
    assert_int_equal(write(fd, buf, n), (ssize_t)n);
    const char *want[] = {"HELLO", "WORLD"};
    for (int i = 0; i < 2; i++) {
        char p[128];
        size_t len;
        assert_int_equal(read_frame(fd, p, &len), TERN_WS_TEXT);
        assert_int_equal(len, 5);
        assert_memory_equal(p, want[i], 5);
    }
    close(fd);
    return 0;
}

static void another_threads_answer_is_sent_through_a_post(void **state) {
    app a = {0};
    const tern_ws_handlers h = {.on_message = hand_to_worker, .on_close = on_close};
    a.client = client_two_for_the_worker;
    assert_int_equal(pipe(a.to_worker), 0);
    assert_int_equal(pthread_create(&a.worker, NULL, worker_main, &a), 0);
    run(&a, &h);
    close(a.to_worker[1]);
    pthread_join(a.worker, NULL);
    close(a.to_worker[0]);
    /* The client had both answers before it stopped the loop: no post is
     * left behind. */
    assert_int_equal(a.answered, 2);
    finish(&a);
}

/* ---- the deadline ------------------------------------------------------ */

static uint64_t opened_at, closed_after;

/* Says nothing after the upgrade; the server's close frame must come after
 * about deadline_ms, not before. */
static int client_quiet(app *a) {
    int fd = ws_client(a->port);
    opened_at = now_ms();
    char p[128];
    size_t len;
    int op = read_frame(fd, p, &len);
    closed_after = now_ms() - opened_at;
    assert_int_equal(op, 8);   /* close */
    assert_true(len >= 2);
    int code = ((uint8_t)p[0] << 8) | (uint8_t)p[1];
    close(fd);
    return code * 1000 + (int)len;   /* code, and the reason's presence */
}

static void a_quiet_connection_gets_1008_at_its_deadline(void **state) {
    app a = {0};
    const tern_ws_handlers h = {.on_open = on_open, .on_message = on_message_later,
                                .on_close = on_close};   /* no on_deadline: tern closes */
    a.deadline_ms = 300;
    a.client = client_quiet;
    run(&a, &h);
    assert_int_equal(a.client_result / 1000, TERN_WS_POLICY);
    assert_int_equal(a.client_result % 1000, 2 + strlen("deadline"));
    assert_true(closed_after >= 300 - 5);   /* never early (the client's clock started later) */
    assert_true(closed_after < 300 + 64 + 200);
    finish(&a);
}

/* Sends a message every 50 ms for a second (the deadline, 200 ms, is moved
 * by each), then goes quiet: the close comes once, about 200 ms later. */
static int client_busy_then_quiet(app *a) {
    int fd = ws_client(a->port);
    uint64_t quiet_from = 0;   /* when the last message was written */
    for (int i = 0; i < 20; i++) {
        char buf[16];
        size_t n = frame(buf, TERN_WS_TEXT, "ping", 4);
        quiet_from = now_ms();
        assert_int_equal(write(fd, buf, n), (ssize_t)n);
        char p[128];
        size_t len;
        assert_int_equal(read_frame(fd, p, &len), TERN_WS_TEXT);   /* the echo, not a close */
        usleep(50 * 1000);
    }
    char p[128];
    size_t len;
    int op = read_frame(fd, p, &len);
    closed_after = now_ms() - quiet_from;
    assert_int_equal(op, 8);
    int code = ((uint8_t)p[0] << 8) | (uint8_t)p[1];
    close(fd);
    return code;
}

static void a_deadline_moved_by_each_message_fires_only_when_they_stop(void **state) {
    app a = {0};
    const tern_ws_handlers h = {.on_open = on_open, .on_message = on_message_later,
                                .on_close = on_close, .on_deadline = on_deadline};
    a.deadline_ms = 200;
    a.client = client_busy_then_quiet;
    run(&a, &h);
    assert_int_equal(a.client_result, 4000);   /* on_deadline's own close */
    assert_int_equal(a.deadlines, 1);
    assert_int_equal(a.answered, 20);
    /* The deadline moved when the server read the last message, after
     * quiet_from (measured from the write, not from after the 50 ms sleep,
     * which a busy machine stretches: the close then seemed early). */
    assert_true(closed_after >= 200 - 5);
    assert_true(closed_after < 50 + 200 + 64 + 200);
    finish(&a);
}

/* One message (which clears the deadline), then 600 ms of silence, then a
 * second message whose echo must still come. */
static int client_cleared(app *a) {
    int fd = ws_client(a->port);
    char buf[16], p[128];
    size_t len, n = frame(buf, TERN_WS_TEXT, "one", 3);
    assert_int_equal(write(fd, buf, n), (ssize_t)n);
    assert_int_equal(read_frame(fd, p, &len), TERN_WS_TEXT);
    usleep(600 * 1000);
    n = frame(buf, TERN_WS_TEXT, "two", 3);
    assert_int_equal(write(fd, buf, n), (ssize_t)n);
    int op = read_frame(fd, p, &len);
    close(fd);
    return op;
}

static void a_cleared_deadline_never_fires(void **state) {
    app a = {0};
    const tern_ws_handlers h = {.on_open = on_open, .on_message = on_message_later,
                                .on_close = on_close, .on_deadline = on_deadline};
    a.deadline_ms = 150;
    a.clear_on_message = true;
    a.client = client_cleared;
    run(&a, &h);
    assert_int_equal(a.client_result, TERN_WS_TEXT);
    assert_int_equal(a.deadlines, 0);
    finish(&a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(kept_messages_are_answered_later_in_order),
        cmocka_unit_test(a_reference_keeps_the_ws_valid_after_on_close),
        cmocka_unit_test(another_threads_answer_is_sent_through_a_post),
        cmocka_unit_test(a_quiet_connection_gets_1008_at_its_deadline),
        cmocka_unit_test(a_deadline_moved_by_each_message_fires_only_when_they_stop),
        cmocka_unit_test(a_cleared_deadline_never_fires),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
