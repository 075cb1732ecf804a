/* Pub/sub driven as applications drive it: a real server on the loop, raw
 * sockets as subscribers, per-connection data freed in on_close while the
 * application publishes in a loop.
 *
 * Checked here: each subscriber gets a topic's messages in publish order,
 * seq numbers count from 1, tern_publish_except skips the sender, an
 * unsubscribed connection gets nothing more, a closed one leaves its
 * topics by itself, no callback runs inside a publish, a subscriber that
 * never reads has messages dropped (and counted) under the drop policy
 * and is closed with 1008 under the close policy, bad arguments are
 * refused, and a publish from on_close during tern_server_free outside
 * the loop neither reads the freed server when the loop runs again nor
 * leaks when the loop is freed instead. A route's on_subscribe and
 * on_publish refuse what they should, once per call, never per delivery. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tern/tern.h"

#include "client.h"

static char *frames_text(const char *raw, size_t n);

/* Everything the server sent (after the 101's head), until it has been
 * quiet for quiet_ms, as a list of text messages joined with '\n'. Only
 * small unmasked text frames are expected. */
static char *client_messages_within(int fd, int quiet_ms) {
    static char raw[1 << 20];
    size_t n = 0;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    while (poll(&p, 1, quiet_ms) > 0) {
        ssize_t r = read(fd, raw + n, sizeof(raw) - n);
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    return frames_text(raw, n);
}

static char *client_messages(int fd) { return client_messages_within(fd, 100); }

static char *frames_text(const char *raw, size_t n) {
    const char *body = memmem(raw, n, "\r\n\r\n", 4);
    assert_non_null(body);
    size_t pos = (size_t)(body + 4 - raw);
    char *out = calloc(1, n + 1);
    size_t o = 0;
    while (pos + 2 <= n) {
        uint8_t b0 = (uint8_t)raw[pos], b1 = (uint8_t)raw[pos + 1];
        assert_int_equal(b0, 0x81);   /* fin, text */
        assert_true(b1 < 126);
        assert_true(pos + 2 + b1 <= n);
        memcpy(out + o, raw + pos + 2, b1);
        o += b1;
        out[o++] = '\n';
        pos += 2 + b1;
    }
    assert_int_equal(pos, n);
    out[o] = '\0';
    return out;
}

/* ---- the application -------------------------------------------------- */

typedef struct member {
    tern_ws *ws;
    struct member *next, *prev;
} member;

typedef struct app {
    tern_loop *loop;
    tern_server *srv;
    tern_timer *tick;
    member *members;           /* newest first */
    member *order[8];          /* in the order they opened */
    int opened, closed;
    bool in_publish;
    int callbacks_in_publish;
    int close_code;
    int ticks;
    int fds[4];
    int nfds;
    int step;
    int64_t seqs[128];
    int nseqs;
    uint64_t dropped;
    size_t max_buffered;
} app;

static void on_open(tern_ws *ws, void *user) {
    app *a = user;
    if (a->in_publish)
        a->callbacks_in_publish++;
    member *m = calloc(1, sizeof(*m));
    assert_non_null(m);
    m->ws = ws;
    m->next = a->members;
    if (m->next)
        m->next->prev = m;
    a->members = m;
    if (a->opened < 8)
        a->order[a->opened] = m;
    a->opened++;
    tern_ws_set_user(ws, m);
    assert_int_equal(tern_ws_subscribe(ws, "t"), 0);
    assert_int_equal(tern_ws_subscribe(ws, "t"), -EALREADY);
}

static void on_close(tern_ws *ws, int code, const char *reason, size_t reason_len, void *user) {
    app *a = user;
    (void)reason, (void)reason_len;
    if (a->in_publish)
        a->callbacks_in_publish++;
    a->closed++;
    a->close_code = code;
    member *m = tern_ws_user(ws);
    for (int i = 0; i < 8; i++)
        if (a->order[i] == m)
            a->order[i] = NULL;
    if (m->prev)
        m->prev->next = m->next;
    else
        a->members = m->next;
    if (m->next)
        m->next->prev = m->prev;
    memset(m, 0xAB, sizeof(*m));
    free(m);
}

static const tern_ws_handlers handlers = {.on_open = on_open, .on_close = on_close};

static void app_start_with(app *a, const tern_pubsub_options *po, const tern_server_options *so) {
    memset(a, 0, sizeof(*a));
    assert_int_equal(tern_loop_new(&a->loop, NULL), 0);
    assert_int_equal(tern_server_new(&a->srv, a->loop, so), 0);
    if (po)
        assert_int_equal(tern_pubsub_configure(a->srv, po), 0);
    tern_ws_options wo = {.backlog_hard = 16u << 20, .backlog_soft = 16u << 20};
    assert_int_equal(tern_ws_route(a->srv, "/ws", &handlers, &wo, a), 0);
    assert_int_equal(tern_listen(a->srv, "127.0.0.1", 0, NULL), 0);
}

static void app_start(app *a, const tern_pubsub_options *po) { app_start_with(a, po, NULL); }

static void app_finish(app *a) {
    tern_timer_stop(a->tick);
    tern_server_free(a->srv);
    tern_loop_free(a->loop);
    for (int i = 0; i < a->nfds; i++)
        close(a->fds[i]);
}

static int64_t publish(app *a, const char *topic, const char *s, const tern_ws *except) {
    a->in_publish = true;
    int64_t r = tern_publish_except(a->srv, topic, s, strlen(s), TERN_WS_TEXT, except);
    a->in_publish = false;
    return r;
}

/* ---- order, except, unsubscribe, close ---------------------------------- */

static void order_tick(tern_timer *t, void *user) {
    app *a = user;
    (void)t;
    if (a->opened < 3 || ++a->ticks > 2000) {
        if (a->ticks > 2000)
            tern_loop_stop(a->loop);
        return;
    }
    switch (a->step++) {
    case 0: {
        /* A (order[0]) publishes 100 messages to the others. */
        char buf[16];
        for (int i = 0; i < 100; i++) {
            snprintf(buf, sizeof(buf), "m%d", i);
            a->seqs[a->nseqs++] = publish(a, "t", buf, a->order[0]->ws);
        }
        /* C leaves; B gets one more. */
        assert_int_equal(tern_ws_unsubscribe(a->order[2]->ws, "t"), 0);
        assert_int_equal(tern_ws_unsubscribe(a->order[2]->ws, "t"), -ENOENT);
        assert_false(tern_ws_subscribed(a->order[2]->ws, "t"));
        assert_int_equal(tern_topic_subscribers(a->srv, "t"), 2);
        a->seqs[a->nseqs++] = publish(a, "t", "last", a->order[0]->ws);
        /* Nobody on "u": not numbered, nothing sent. */
        assert_int_equal(publish(a, "u", "nobody", NULL), 0);
        break;
    }
    default:
        tern_loop_stop(a->loop);
    }
}

static void order_except_and_unsubscribe(void **state) {
    (void)state;
    app a;
    app_start(&a, NULL);
    int port = tern_server_port(a.srv);
    /* Which fd is which member is not known (accept order): they are
     * told apart by what they get. */
    for (int i = 0; i < 3; i++)
        a.fds[a.nfds++] = client_open(port, 0);
    assert_int_equal(tern_timer_start(a.loop, &a.tick, 5, 5, order_tick, &a), 0);
    assert_int_equal(tern_loop_run(a.loop), 0);
    assert_int_equal(a.opened, 3);
    assert_int_equal(a.callbacks_in_publish, 0);
    assert_int_equal(a.nseqs, 101);
    for (int i = 0; i < 101; i++)
        assert_int_equal(a.seqs[i], i + 1);

    char expect_b[2048] = "", expect_c[2048] = "";
    for (int i = 0; i < 100; i++) {
        char line[16];
        snprintf(line, sizeof(line), "m%d\n", i);
        strcat(expect_b, line);
        strcat(expect_c, line);
    }
    strcat(expect_b, "last\n");
    int seen_a = 0, seen_b = 0, seen_c = 0;
    for (int i = 0; i < 3; i++) {
        char *got = client_messages(a.fds[i]);
        if (strcmp(got, "") == 0)
            seen_a++;
        else if (strcmp(got, expect_b) == 0)
            seen_b++;
        else if (strcmp(got, expect_c) == 0)
            seen_c++;
        else
            fail_msg("unexpected messages: %.200s", got);
        free(got);
    }
    assert_int_equal(seen_a, 1);
    assert_int_equal(seen_b, 1);
    assert_int_equal(seen_c, 1);
    app_finish(&a);
}

/* ---- tern_publish_later: this loop's subscribers at its next turn ------- */

static void later_tick(tern_timer *t, void *user) {
    app *a = user;
    (void)t;
    if (a->opened < 2 || ++a->ticks > 2000) {
        if (a->ticks > 2000)
            tern_loop_stop(a->loop);
        return;
    }
    switch (a->step++) {
    case 0:
        /* later and now, interleaved: each topic's order is the calls' */
        for (int i = 0; i < 20; i++) {
            char buf[16];
            snprintf(buf, sizeof(buf), "%s%d", i % 2 ? "now" : "later", i);
            a->in_publish = true;
            a->seqs[a->nseqs++] =
                i % 2 ? tern_publish_key(a->srv, "t", NULL, buf, strlen(buf), TERN_WS_TEXT, SIZE_MAX)
                      : tern_publish_later(a->srv, "t", NULL, buf, strlen(buf), TERN_WS_TEXT,
                                           SIZE_MAX);
            a->in_publish = false;
        }
        assert_int_equal(tern_publish_later(a->srv, "nobody", NULL, "x", 1, TERN_WS_TEXT, SIZE_MAX),
                         0);
        assert_int_equal(tern_publish_later(NULL, "t", NULL, "x", 1, TERN_WS_TEXT, SIZE_MAX),
                         -EINVAL);
        break;
    default:
        tern_loop_stop(a->loop);
    }
}

static void publish_later_keeps_order_with_publish_now(void **state) {
    (void)state;
    app a;
    app_start(&a, NULL);
    int port = tern_server_port(a.srv);
    for (int i = 0; i < 2; i++)
        a.fds[a.nfds++] = client_open(port, 0);
    assert_int_equal(tern_timer_start(a.loop, &a.tick, 5, 5, later_tick, &a), 0);
    assert_int_equal(tern_loop_run(a.loop), 0);
    assert_int_equal(a.callbacks_in_publish, 0);
    assert_int_equal(a.nseqs, 20);
    char expect[512] = "";
    for (int i = 0; i < 20; i++) {
        assert_int_equal(a.seqs[i], i + 1);
        char line[16];
        snprintf(line, sizeof(line), "%s%d\n", i % 2 ? "now" : "later", i);
        strcat(expect, line);
    }
    for (int i = 0; i < 2; i++) {
        char *got = client_messages(a.fds[i]);
        assert_string_equal(got, expect);
        free(got);
    }
    app_finish(&a);
}

/* ---- posted messages in batches, a pass over the subscribers per turns ---- */

#define BURST_SUBS 150      /* more than a pass serves in one loop turn */
#define BURST_MSGS 40

typedef struct burst {
    app a;
    int fds[BURST_SUBS + 1];
    int firings;
    tern_timer *pub;
} burst;

/* A 0 ms timer that re-arms itself: one tern_publish_later per loop turn,
 * so that messages keep arriving while a pass is under way. */
static void burst_fire(tern_timer *t, void *user) {
    burst *b = user;
    app *a = &b->a;
    if (a->opened < BURST_SUBS) {
        if (++a->ticks > 20000)
            tern_loop_stop(a->loop);
        else
            assert_int_equal(tern_timer_again(t, 1), 0);
        return;
    }
    if (b->firings < BURST_MSGS) {
        char buf[16];
        snprintf(buf, sizeof(buf), "m%d", b->firings);
        a->seqs[a->nseqs++] =
            tern_publish_later(a->srv, "t", NULL, buf, strlen(buf), TERN_WS_TEXT, SIZE_MAX);
        if (b->firings == 10) {
            /* one leaves while passes run over the topic: counted out at once */
            assert_int_equal(tern_ws_unsubscribe(a->order[1]->ws, "t"), 0);
            assert_int_equal(tern_topic_subscribers(a->srv, "t"), BURST_SUBS - 1);
        }
        if (b->firings == 20)   /* one joins meanwhile */
            b->fds[BURST_SUBS] = client_open(tern_server_port(a->srv), 0);
        b->firings++;
        assert_int_equal(tern_timer_again(t, 0), 0);
        return;
    }
    if (b->firings++ < BURST_MSGS + 50)   /* 50 more turns for the passes to end */
        assert_int_equal(tern_timer_again(t, 0), 0);
    else
        tern_loop_stop(a->loop);
}

static void posted_messages_reach_everyone_in_order_across_passes(void **state) {
    (void)state;
    burst *b = calloc(1, sizeof(*b));
    assert_non_null(b);
    app *a = &b->a;
    tern_server_options so = {.max_connections_per_ip = TERN_UNLIMITED};
    app_start_with(a, NULL, &so);
    int port = tern_server_port(a->srv);
    for (int i = 0; i < BURST_SUBS; i++)
        b->fds[i] = client_open(port, 0);
    b->fds[BURST_SUBS] = -1;
    assert_int_equal(tern_timer_start(a->loop, &b->pub, 1, 0, burst_fire, b), 0);
    assert_int_equal(tern_loop_run(a->loop), 0);
    assert_int_equal(a->nseqs, BURST_MSGS);
    for (int i = 0; i < BURST_MSGS; i++)
        assert_int_equal(a->seqs[i], i + 1);
    assert_int_equal(tern_topic_subscribers(a->srv, "t"), BURST_SUBS);   /* the joiner in */
    char all[BURST_MSGS * 8] = "";
    for (int i = 0; i < BURST_MSGS; i++) {
        char line[16];
        snprintf(line, sizeof(line), "m%d\n", i);
        strcat(all, line);
    }
    /* every one of them all, in order, except the one that left: a prefix */
    int whole = 0, prefix = 0;
    for (int i = 0; i < BURST_SUBS; i++) {
        char *got = client_messages_within(b->fds[i], 0);
        if (strcmp(got, all) == 0)
            whole++;
        else if (strncmp(all, got, strlen(got)) == 0 && strlen(got) < strlen(all))
            prefix++;
        else
            fail_msg("subscriber %d got \"%s\"", i, got);
        free(got);
    }
    assert_int_equal(whole, BURST_SUBS - 1);
    assert_int_equal(prefix, 1);
    /* the joiner: from some message on, every one to the last, in order */
    assert_true(b->fds[BURST_SUBS] >= 0);
    char *got = client_messages_within(b->fds[BURST_SUBS], 0);
    size_t gl = strlen(got);
    assert_true(gl > 0 && gl < strlen(all));
    assert_string_equal(all + strlen(all) - gl, got);
    assert_true(got[0] == 'm' && (all + strlen(all) - gl == all || all[strlen(all) - gl - 1] == '\n'));
    free(got);
    tern_timer_stop(b->pub);
    app_finish(a);
    for (int i = 0; i <= BURST_SUBS; i++)
        close(b->fds[i]);
    free(b);
}

/* ---- a write delay: a topic's messages of the delay in one write ------- */

#define DELAY_MS 50

typedef struct delayed {
    app a;
    char raw[4096];
    size_t n;
    int reads;              /* reads that brought message bytes */
    uint64_t t0, first;     /* the first publish; the first message's arrival */
    uint64_t last;          /* the last publish */
} delayed;

static uint64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Every 5 ms: reads what the subscriber got so far, and publishes m0, m1,
 * m2 10 ms apart (now and later alternately, on the loop's own thread),
 * all within the delay when the timer is on time. Stops once m2, the
 * last, has come (nothing can follow it), or after 2 000 ticks. */
static void delayed_tick(tern_timer *t, void *user) {
    delayed *d = user;
    app *a = &d->a;
    (void)t;
    ssize_t r = recv(a->fds[0], d->raw + d->n, sizeof(d->raw) - 1 - d->n, MSG_DONTWAIT);
    if (r > 0) {
        d->n += (size_t)r;
        d->raw[d->n] = '\0';
        const char *body = strstr(d->raw, "\r\n\r\n");
        if (body && (size_t)(body + 4 - d->raw) < d->n) {   /* message bytes in it */
            if (d->reads++ == 0)
                d->first = now_ms();
            if (memmem(body + 4, d->n - (size_t)(body + 4 - d->raw), "m2", 2)) {
                tern_loop_stop(a->loop);
                return;
            }
        }
    }
    if (a->opened < 1 || ++a->ticks > 2000) {
        if (a->ticks > 2000)
            tern_loop_stop(a->loop);
        return;
    }
    int step = a->step++;
    if (step == 0)
        d->t0 = now_ms();
    if (step % 2 == 0 && step <= 4) {
        char buf[16];
        snprintf(buf, sizeof(buf), "m%d", step / 2);
        a->seqs[a->nseqs++] =
            step == 2 ? tern_publish_later(a->srv, "t", NULL, buf, 2, TERN_WS_TEXT, SIZE_MAX)
                      : publish(a, "t", buf, NULL);
        d->last = now_ms();
    }
}

static void write_delay_sends_a_topics_messages_together_in_order(void **state) {
    (void)state;
    delayed *d = calloc(1, sizeof(*d));
    assert_non_null(d);
    app *a = &d->a;
    tern_pubsub_options po = {.write_delay_ms = TERN_WRITE_DELAY_MAX + 1};
    app_start(a, NULL);
    assert_int_equal(tern_pubsub_configure(a->srv, &po), -EINVAL);
    po.write_delay_ms = DELAY_MS;
    assert_int_equal(tern_pubsub_configure(a->srv, &po), 0);
    a->fds[a->nfds++] = client_open(tern_server_port(a->srv), 0);
    assert_int_equal(tern_timer_start(a->loop, &a->tick, 5, 5, delayed_tick, d), 0);
    assert_int_equal(tern_loop_run(a->loop), 0);
    assert_int_equal(a->nseqs, 3);
    for (int i = 0; i < 3; i++)
        assert_int_equal(a->seqs[i], i + 1);
    char *got = frames_text(d->raw, d->n);
    assert_string_equal(got, "m0\nm1\nm2\n");   /* in order */
    free(got);
    /* Together, when the timer published all three within the delay; a
     * busy machine may run the 10 ms ticks late, past the delay, and then
     * the last ones rightly go in a pass of their own. */
    if (d->last - d->t0 < DELAY_MS)
        assert_int_equal(d->reads, 1);
    else   /* at most a pass for each message */
        assert_true(d->reads >= 1 && d->reads <= 3);
    /* held for the delay after the first, and not much longer */
    assert_true(d->first - d->t0 >= DELAY_MS);
    assert_true(d->first - d->t0 < DELAY_MS + 2000);
    app_finish(a);
    free(d);
}

/* ---- slow subscribers ---------------------------------------------------- */

/* fds[0] reads, fds[1] never does. */
static void slow_tick(tern_timer *t, void *user) {
    app *a = user;
    (void)t;
    a->ticks++;
    client_drain(a->fds[0]);
    if (a->opened < 2)
        return;
    if (a->closed > 0 || a->ticks > 300) {
        tern_loop_stop(a->loop);
        return;
    }
    static char payload[65536];
    memset(payload, 'p', sizeof(payload) - 1);
    for (int i = 0; i < 8; i++) {
        a->in_publish = true;
        int64_t seq = tern_publish(a->srv, "t", payload, sizeof(payload), TERN_WS_BINARY);
        a->in_publish = false;
        assert_true(seq > 0);
        /* Members may be closed (and freed in on_close) only later. */
        for (member *m = a->members; m; m = m->next) {
            size_t b = tern_ws_buffered(m->ws);
            if (b > a->max_buffered)
                a->max_buffered = b;
        }
    }
    if (a->closed == 0) {
        uint64_t d = 0;
        for (member *m = a->members; m; m = m->next)
            d += tern_ws_topic_dropped(m->ws, "t");
        a->dropped = d;
        assert_int_equal(tern_topic_dropped(a->srv, "t"), d);
    }
}

static void drop_policy_counts_what_a_slow_subscriber_misses(void **state) {
    (void)state;
    app a;
    tern_pubsub_options po = {.max_backlog = 256 * 1024, .policy = TERN_PUBSUB_DROP};
    app_start(&a, &po);
    int port = tern_server_port(a.srv);
    a.fds[a.nfds++] = client_open(port, 0);
    a.fds[a.nfds++] = client_open(port, 4096);
    assert_int_equal(tern_timer_start(a.loop, &a.tick, 5, 5, slow_tick, &a), 0);
    assert_int_equal(tern_loop_run(a.loop), 0);
    assert_int_equal(a.opened, 2);
    assert_int_equal(a.closed, 0);
    assert_true(a.dropped > 1000);                          /* the slow one missed most */
    assert_true(a.max_buffered <= 256 * 1024 + 65536 + 16);  /* and its memory is bounded */
    assert_int_equal(a.callbacks_in_publish, 0);
    /* The reader missed nothing: only one member has drops. */
    int with_drops = 0;
    for (member *m = a.members; m; m = m->next)
        with_drops += tern_ws_topic_dropped(m->ws, "t") > 0;
    assert_int_equal(with_drops, 1);
    app_finish(&a);
}

static void close_policy_closes_with_1008_after_the_publish(void **state) {
    (void)state;
    app a;
    tern_pubsub_options po = {.max_backlog = 256 * 1024, .policy = TERN_PUBSUB_CLOSE};
    app_start(&a, &po);
    int port = tern_server_port(a.srv);
    a.fds[a.nfds++] = client_open(port, 0);
    a.fds[a.nfds++] = client_open(port, 4096);
    assert_int_equal(tern_timer_start(a.loop, &a.tick, 5, 5, slow_tick, &a), 0);
    assert_int_equal(tern_loop_run(a.loop), 0);
    assert_int_equal(a.opened, 2);
    assert_int_equal(a.closed, 1);
    assert_int_equal(a.close_code, TERN_WS_POLICY);
    assert_int_equal(a.callbacks_in_publish, 0);
    /* The closed one left the topic by itself; the reader is still in it. */
    assert_int_equal(tern_topic_subscribers(a.srv, "t"), 1);
    assert_int_equal(tern_topic_subscribers_all(a.srv, "t"), 1);
    assert_non_null(a.members);
    assert_null(a.members->next);
    app_finish(&a);
}

/* ---- arguments ------------------------------------------------------------ */

static void bad_arguments_are_refused(void **state) {
    (void)state;
    tern_loop *loop;
    tern_server *srv;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    assert_int_equal(tern_server_new(&srv, loop, NULL), 0);
    char longname[TERN_TOPIC_MAX + 2];
    memset(longname, 'x', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    assert_int_equal(tern_publish(NULL, "t", "x", 1, TERN_WS_TEXT), -EINVAL);
    assert_int_equal(tern_publish(srv, NULL, "x", 1, TERN_WS_TEXT), -EINVAL);
    assert_int_equal(tern_publish(srv, "", "x", 1, TERN_WS_TEXT), -EINVAL);
    assert_int_equal(tern_publish(srv, "t", "x", 1, 9), -EINVAL);
    assert_int_equal(tern_publish(srv, "t", NULL, 1, TERN_WS_TEXT), -EINVAL);
    assert_int_equal(tern_publish(srv, longname, "x", 1, TERN_WS_TEXT), -ENAMETOOLONG);
    assert_int_equal(tern_publish_ex(srv, "t", "x", 1, TERN_WS_TEXT, NULL, 2), -EINVAL);
    assert_int_equal(tern_publish(srv, "t", "x", 1, TERN_WS_TEXT), 0);   /* no subscriber */
    char longkey[TERN_KEY_MAX + 2];
    memset(longkey, 'k', sizeof(longkey) - 1);
    longkey[sizeof(longkey) - 1] = '\0';
    assert_int_equal(tern_publish_key(srv, "t", "", "x", 1, TERN_WS_TEXT, SIZE_MAX), -EINVAL);
    assert_int_equal(tern_publish_key(srv, "t", longkey, "x", 1, TERN_WS_TEXT, SIZE_MAX), -EINVAL);
    assert_int_equal(tern_publish_key(srv, "t", "k", "x", 1, TERN_WS_TEXT, SIZE_MAX), 0);
    assert_int_equal(tern_ws_topic_conflated(NULL, "t"), 0);
    assert_int_equal(tern_ws_subscribe(NULL, "t"), -EINVAL);
    assert_int_equal(tern_ws_unsubscribe(NULL, "t"), -EINVAL);
    assert_int_equal(tern_topic_subscribers(srv, "t"), 0);
    tern_pubsub_options bad = {.policy = 7};
    assert_int_equal(tern_pubsub_configure(srv, &bad), -EINVAL);
    tern_pubsub_options ok = {0};
    assert_int_equal(tern_pubsub_configure(srv, &ok), -EBUSY);   /* pub/sub was used */
    tern_server_free(srv);
    tern_loop_free(loop);
}

static void topic_rules_are_checked_and_bounded(void **state) {
    (void)state;
    tern_loop *loop;
    tern_server *srv;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    assert_int_equal(tern_server_new(&srv, loop, NULL), 0);
    char longname[TERN_TOPIC_MAX + 2];
    memset(longname, 'x', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    tern_topic_options drop = {.policy = TERN_PUBSUB_DROP};
    tern_topic_options close13 = {.policy = TERN_PUBSUB_CLOSE, .close_code = 1013};
    tern_topic_options conflate = {.policy = TERN_PUBSUB_CONFLATE};
    tern_topic_options badpol = {.policy = 3}, badcode = {.policy = TERN_PUBSUB_CLOSE, .close_code = 1000};
    assert_int_equal(tern_pubsub_topic_rule(NULL, "a.", &drop), -EINVAL);
    assert_int_equal(tern_pubsub_topic_rule(srv, NULL, &drop), -EINVAL);
    assert_int_equal(tern_pubsub_topic_rule(srv, "a.", NULL), -EINVAL);
    assert_int_equal(tern_pubsub_topic_rule(srv, "a.", &badpol), -EINVAL);
    assert_int_equal(tern_pubsub_topic_rule(srv, "a.", &badcode), -EINVAL);
    assert_int_equal(tern_pubsub_topic_rule(srv, longname, &drop), -ENAMETOOLONG);
    tern_pubsub_options po = {.policy = TERN_PUBSUB_CLOSE, .close_code = 1001};
    assert_int_equal(tern_pubsub_configure(srv, &po), -EINVAL);
    po.close_code = 1013;
    assert_int_equal(tern_pubsub_configure(srv, &po), 0);
    /* the same prefix twice is one rule; TERN_TOPIC_RULES_MAX in all */
    assert_int_equal(tern_pubsub_topic_rule(srv, "a.", &drop), 0);
    assert_int_equal(tern_pubsub_topic_rule(srv, "a.", &close13), 0);
    assert_int_equal(tern_pubsub_topic_rule(srv, "a.", &conflate), 0);
    char name[16];
    for (int i = 1; i < TERN_TOPIC_RULES_MAX; i++) {
        snprintf(name, sizeof(name), "p%d.", i);
        assert_int_equal(tern_pubsub_topic_rule(srv, name, &drop), 0);
    }
    assert_int_equal(tern_pubsub_topic_rule(srv, "one.more.", &drop), -ENOSPC);
    assert_int_equal(tern_pubsub_topic_rule(srv, "p7.", &close13), 0);   /* a replacement fits */
    tern_pubsub_counters c;
    assert_int_equal(tern_pubsub_stats(NULL, &c), -EINVAL);
    assert_int_equal(tern_pubsub_stats(srv, NULL), -EINVAL);
    assert_int_equal(tern_pubsub_stats(srv, &c), 0);
    assert_int_equal(c.messages + c.delivered + c.dropped + c.closed + c.subscriptions, 0);
    /* the Redis bridge: checked URLs, one per group, counters */
    tern_redis_counters rc;
    assert_int_equal(tern_pubsub_redis_stats(srv, &rc), -ENOENT);
    assert_int_equal(tern_pubsub_redis(NULL, "redis://127.0.0.1"), -EINVAL);
    assert_int_equal(tern_pubsub_redis(srv, NULL), -EINVAL);
    assert_int_equal(tern_pubsub_redis(srv, "redis://127.0.0.1:0"), -EINVAL);
    assert_int_equal(tern_pubsub_redis(srv, "http://127.0.0.1"), -EINVAL);
    assert_int_equal(tern_pubsub_redis(srv, "redis://127.0.0.1:1/"), 0);   /* nobody there: retried */
    assert_int_equal(tern_pubsub_redis(srv, "redis://127.0.0.1:1"), -EALREADY);
    assert_int_equal(tern_pubsub_redis_stats(srv, &rc), 0);
    assert_false(rc.connected);
    /* once pub/sub is in use (the bridge made its group), the rules are fixed */
    assert_int_equal(tern_pubsub_topic_rule(srv, "b.", &drop), -EBUSY);
    tern_server_free(srv);
    tern_loop_free(loop);
}

/* ---- for operators: the topics and a history, read from any thread ------- */

static void collect_seq(const tern_history_msg *m, void *user) {
    char **at = user;
    *at += sprintf(*at, "%llu:%.*s;", (unsigned long long)m->seq, (int)m->len,
                   (const char *)m->data);
}

static void topics_and_histories_are_read_for_operators(void **state) {
    (void)state;
    tern_loop *loop;
    tern_server *srv;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    assert_int_equal(tern_server_new(&srv, loop, NULL), 0);
    tern_topic_info out[4];
    bool more = true;
    /* pub/sub not used yet: no topic, no history */
    assert_int_equal(tern_topic_list(srv, NULL, NULL, out, 4, &more), 0);
    assert_false(more);
    tern_topic_options keep3 = {.history = 3};
    assert_int_equal(tern_pubsub_topic_rule(srv, "h.", &keep3), 0);
    char data[8];
    for (int i = 1; i <= 5; i++) {
        int n = snprintf(data, sizeof(data), "m%d", i);
        assert_int_equal(tern_publish(srv, "h.b", data, (size_t)n, TERN_WS_TEXT), i);
    }
    assert_int_equal(tern_publish(srv, "h.a", "x", 1, TERN_WS_BINARY), 1);
    assert_int_equal(tern_publish(srv, "other", "x", 1, TERN_WS_TEXT), 0);   /* no entry */
    /* paged by name, with a prefix */
    assert_int_equal(tern_topic_list(srv, "h.", NULL, out, 1, &more), 1);
    assert_string_equal(out[0].name, "h.a");
    assert_true(more && out[0].history && out[0].seq == 1 && out[0].epoch != 0);
    assert_int_equal(tern_topic_list(srv, "h.", "h.a", out, 4, &more), 1);
    assert_string_equal(out[0].name, "h.b");
    assert_int_equal(out[0].seq, 5);
    assert_int_equal(out[0].subscribers, 0);
    assert_false(more);
    uint64_t epoch_b = out[0].epoch;
    assert_int_equal(tern_topic_list(srv, "", "", out, 4, NULL), 2);
    assert_int_equal(tern_topic_list(srv, NULL, NULL, out, 4, NULL), 2);
    assert_int_equal(tern_topic_list(srv, "zz", NULL, out, 4, &more), 0);
    /* a page of a history, either way */
    char got[128], *at = got;
    tern_history_info info;
    assert_int_equal(tern_topic_history(srv, "h.b", 0, 10, false, collect_seq, &at, &info), 3);
    assert_string_equal(got, "3:m3;4:m4;5:m5;");
    assert_true(info.epoch == epoch_b);
    assert_int_equal(info.first, 3);
    assert_int_equal(info.last, 5);
    at = got;
    assert_int_equal(tern_topic_history(srv, "h.b", 4, 2, true, collect_seq, &at, NULL), 2);
    assert_string_equal(got, "4:m4;3:m3;");
    at = got;
    assert_int_equal(tern_topic_history(srv, "h.b", 5, 0, false, collect_seq, &at, NULL), 0);
    assert_int_equal(tern_topic_history(srv, "nope", 0, 5, false, collect_seq, &at, &info), -ENOENT);
    assert_int_equal(info.epoch, 0);
    /* arguments */
    char longname[TERN_TOPIC_MAX + 2];
    memset(longname, 'x', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    assert_int_equal(tern_topic_list(NULL, NULL, NULL, out, 4, NULL), -EINVAL);
    assert_int_equal(tern_topic_list(srv, NULL, NULL, NULL, 4, NULL), -EINVAL);
    assert_int_equal(tern_topic_list(srv, longname, NULL, out, 4, NULL), -ENAMETOOLONG);
    assert_int_equal(tern_topic_history(NULL, "h.b", 0, 1, false, collect_seq, &at, NULL), -EINVAL);
    assert_int_equal(tern_topic_history(srv, "", 0, 1, false, collect_seq, &at, NULL), -EINVAL);
    assert_int_equal(tern_topic_history(srv, "h.b", 0, 1, false, NULL, NULL, NULL), -EINVAL);
    assert_int_equal(tern_topic_history(srv, longname, 0, 1, false, collect_seq, &at, NULL),
                     -ENAMETOOLONG);
    tern_server_free(srv);
    tern_loop_free(loop);
}

/* ---- authorization hooks --------------------------------------------------- */

/* A route whose on_subscribe refuses "secret*" and whose on_publish refuses
 * anything but "chat". The hooks count their calls: once per subscribe or
 * client publish, never per delivered message. */
typedef struct guard {
    tern_loop *loop;
    tern_server *srv;
    tern_timer *tick;
    tern_ws *ws[2];
    int opened, ticks, step;
    int sub_calls, pub_calls;
    int64_t seqs[4];
} guard;

static int guard_on_subscribe(tern_ws *ws, const char *topic, size_t len, void *user) {
    guard *g = user;
    (void)ws;
    assert_int_equal(len, strlen(topic));   /* NUL-terminated too */
    g->sub_calls++;
    return len >= 6 && memcmp(topic, "secret", 6) == 0 ? -EACCES : 0;
}

static int guard_on_publish(tern_ws *ws, const char *topic, size_t len, void *user) {
    guard *g = user;
    (void)ws;
    assert_int_equal(len, strlen(topic));
    g->pub_calls++;
    return len == 4 && memcmp(topic, "chat", 4) == 0 ? 0 : -EACCES;
}

static void guard_open(tern_ws *ws, void *user) {
    guard *g = user;
    assert_true(g->opened < 2);
    g->ws[g->opened++] = ws;
    assert_int_equal(tern_ws_subscribe(ws, "secret.x"), -EACCES);
    assert_int_equal(tern_ws_subscribe_from(ws, "secret.y", 0, 0, NULL), -EACCES);
    assert_false(tern_ws_subscribed(ws, "secret.x"));
    assert_false(tern_ws_subscribed(ws, "secret.y"));
    assert_int_equal(tern_ws_subscribe(ws, "chat"), 0);
    assert_int_equal(tern_ws_subscribe(ws, "other"), 0);
}

static void guard_close(tern_ws *ws, int code, const char *reason, size_t reason_len, void *user) {
    guard *g = user;
    (void)code, (void)reason, (void)reason_len;
    for (int i = 0; i < 2; i++)
        if (g->ws[i] == ws)
            g->ws[i] = NULL;
}

static void guard_tick(tern_timer *t, void *user) {
    guard *g = user;
    (void)t;
    if (++g->ticks > 2000 || (g->opened == 2 && g->step++ > 0)) {
        tern_loop_stop(g->loop);
        return;
    }
    if (g->opened < 2)
        return;
    tern_ws *ws = g->ws[0];
    /* Refused before the hook: a bad topic, no connection. */
    assert_int_equal(tern_ws_publish(ws, "", NULL, "x", 1, TERN_WS_TEXT, SIZE_MAX), -EINVAL);
    assert_int_equal(tern_ws_publish(NULL, "chat", NULL, "x", 1, TERN_WS_TEXT, SIZE_MAX), -EINVAL);
    /* Refused by the hook: nothing delivered, nothing numbered. */
    g->seqs[0] = tern_ws_publish(ws, "other", NULL, "nope", 4, TERN_WS_TEXT, SIZE_MAX);
    g->seqs[1] = tern_ws_publish(ws, "chat", NULL, "hello", 5, TERN_WS_TEXT, SIZE_MAX);
    /* The server's own publishes ask no hook; nobody got "secret.x". */
    g->seqs[2] = tern_publish(g->srv, "other", "server", 6, TERN_WS_TEXT);
    g->seqs[3] = tern_publish(g->srv, "secret.x", "leak", 4, TERN_WS_TEXT);
    char buf[8];
    for (int i = 0; i < 10; i++) {
        snprintf(buf, sizeof(buf), "c%d", i);
        tern_publish(g->srv, "chat", buf, strlen(buf), TERN_WS_TEXT);
    }
}

static const tern_ws_handlers guard_handlers = {
    .on_open = guard_open,
    .on_close = guard_close,
    .on_subscribe = guard_on_subscribe,
    .on_publish = guard_on_publish,
};

static void hooks_refuse_subscribes_and_publishes_once_per_call(void **state) {
    (void)state;
    guard g;
    memset(&g, 0, sizeof(g));
    assert_int_equal(tern_loop_new(&g.loop, NULL), 0);
    assert_int_equal(tern_server_new(&g.srv, g.loop, NULL), 0);
    assert_int_equal(tern_ws_route(g.srv, "/ws", &guard_handlers, NULL, &g), 0);
    assert_int_equal(tern_listen(g.srv, "127.0.0.1", 0, NULL), 0);
    int port = tern_server_port(g.srv);
    int fds[2];
    for (int i = 0; i < 2; i++)
        fds[i] = client_open(port, 0);
    assert_int_equal(tern_timer_start(g.loop, &g.tick, 5, 5, guard_tick, &g), 0);
    assert_int_equal(tern_loop_run(g.loop), 0);
    assert_int_equal(g.opened, 2);
    assert_int_equal(g.seqs[0], -EACCES);
    assert_int_equal(g.seqs[1], 1);
    assert_int_equal(g.seqs[2], 1);
    assert_int_equal(g.seqs[3], 0);
    assert_int_equal(tern_topic_subscribers(g.srv, "secret.x"), 0);
    assert_int_equal(tern_topic_subscribers(g.srv, "chat"), 2);

    const char *expect = "hello\nserver\nc0\nc1\nc2\nc3\nc4\nc5\nc6\nc7\nc8\nc9\n";
    for (int i = 0; i < 2; i++) {
        char *got = client_messages(fds[i]);
        assert_string_equal(got, expect);
        free(got);
    }
    tern_pubsub_counters c;
    assert_int_equal(tern_pubsub_stats(g.srv, &c), 0);
    assert_int_equal(c.delivered, 24);
    /* 4 subscribes per connection, 2 client publishes (the bad-topic and
     * NULL ones never reach the hook): not one call per delivered copy. */
    assert_int_equal(g.sub_calls, 8);
    assert_int_equal(g.pub_calls, 2);

    tern_timer_stop(g.tick);
    tern_server_free(g.srv);
    tern_loop_free(g.loop);
    for (int i = 0; i < 2; i++)
        close(fds[i]);
}

/* ---- teardown: a publish from on_close while the server is freed ---------- */

/* Issue #25: outside tern_loop_run, a publish is posted to the loop, and
 * that post must neither outlive what it reads (the server, freed before
 * the loop runs again) nor leak when the loop is freed without running. */
typedef struct room {
    tern_loop *loop;
    tern_server *srv;
    tern_timer *tick;
    int opened, closed, ticks;
    int64_t last;
} room;

static void room_open(tern_ws *ws, void *user) {
    room *r = user;
    r->opened++;
    assert_int_equal(tern_ws_subscribe(ws, "room"), 0);
}

static void room_close(tern_ws *ws, int code, const char *reason, size_t reason_len, void *user) {
    room *r = user;
    (void)ws, (void)code, (void)reason, (void)reason_len;
    r->closed++;
    r->last = tern_publish(r->srv, "room", "left", 4, TERN_WS_TEXT);
}

static void room_tick(tern_timer *t, void *user) {
    room *r = user;
    (void)t;
    if (r->opened == 3 || ++r->ticks > 400)
        tern_loop_stop(r->loop);
}

static const tern_ws_handlers room_handlers = {.on_open = room_open, .on_close = room_close};

/* Three subscribers of "room" connected, the loop stopped, then the server
 * freed outside tern_loop_run: every on_close publishes to the others. */
static void room_freed(room *r, int fds[3]) {
    memset(r, 0, sizeof(*r));
    assert_int_equal(tern_loop_new(&r->loop, NULL), 0);
    assert_int_equal(tern_server_new(&r->srv, r->loop, NULL), 0);
    assert_int_equal(tern_ws_route(r->srv, "/ws", &room_handlers, NULL, r), 0);
    assert_int_equal(tern_listen(r->srv, "127.0.0.1", 0, NULL), 0);
    int port = tern_server_port(r->srv);
    for (int i = 0; i < 3; i++)
        fds[i] = client_open(port, 0);
    assert_int_equal(tern_timer_start(r->loop, &r->tick, 5, 5, room_tick, r), 0);
    assert_int_equal(tern_loop_run(r->loop), 0);
    assert_int_equal(r->opened, 3);
    tern_timer_stop(r->tick);
    tern_server_free(r->srv);
    r->srv = NULL;
    assert_int_equal(r->closed, 3);
}

/* The loop runs again after the server is gone: what was posted for the
 * server's subscribers is dropped, not delivered to freed memory. */
static void publish_in_on_close_during_server_free_then_loop_runs(void **state) {
    (void)state;
    room r;
    int fds[3];
    room_freed(&r, fds);
    assert_int_equal(tern_timer_start(r.loop, &r.tick, 20, 0, room_tick, &r), 0);
    r.opened = 3;   /* room_tick stops at once */
    assert_int_equal(tern_loop_run(r.loop), 0);
    tern_timer_stop(r.tick);
    tern_loop_free(r.loop);
    for (int i = 0; i < 3; i++)
        close(fds[i]);
}

/* The loop is freed without running again: the queued deliveries are
 * freed with it (LeakSanitizer says so). */
static void publish_in_on_close_during_server_free_then_loop_freed(void **state) {
    (void)state;
    room r;
    int fds[3];
    room_freed(&r, fds);
    tern_loop_free(r.loop);
    for (int i = 0; i < 3; i++)
        close(fds[i]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(order_except_and_unsubscribe),
        cmocka_unit_test(publish_later_keeps_order_with_publish_now),
        cmocka_unit_test(posted_messages_reach_everyone_in_order_across_passes),
        cmocka_unit_test(write_delay_sends_a_topics_messages_together_in_order),
        cmocka_unit_test(drop_policy_counts_what_a_slow_subscriber_misses),
        cmocka_unit_test(close_policy_closes_with_1008_after_the_publish),
        cmocka_unit_test(bad_arguments_are_refused),
        cmocka_unit_test(topic_rules_are_checked_and_bounded),
        cmocka_unit_test(topics_and_histories_are_read_for_operators),
        cmocka_unit_test(hooks_refuse_subscribes_and_publishes_once_per_call),
        cmocka_unit_test(publish_in_on_close_during_server_free_then_loop_runs),
        cmocka_unit_test(publish_in_on_close_during_server_free_then_loop_freed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
