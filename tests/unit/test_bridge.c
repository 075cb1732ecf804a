/* The pub/sub bridge against an engine of the test's own (engine.h): two
 * servers on one loop, each bridged through a tiny in-process engine that
 * hands a publish made on one server to the other's message hook. The
 * engine has none of the optional numbering operations (as NATS core
 * without JetStream would not), so the bridge must fall back to each
 * node numbering its topics itself, a topic with a history included.
 *
 * Checked here: a publish on server A reaches a subscriber of server B
 * through the engine, in order, for a topic with a history; A numbers its
 * publishes itself (tern_publish returns its seq, not 0 as under an
 * engine that numbers); B numbers what it hears itself, so its own next
 * publish follows on; the engine followed the topic (subscribe) although
 * it has a history; tern_pubsub_bridge refuses an unknown scheme with
 * nothing started and a log line naming the schemes known, and the
 * counters name the engine. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pubsub/engine.h"
#include "tern/tern.h"

#include "client.h"

/* ---- the test engine ------------------------------------------------------
 *
 * Every engine started is one node of one broker (the array broker[]);
 * a publish goes to every other node that follows the topic, by a post to
 * its loop, as a message heard from the network would arrive.
 * Invariants: broker[i] is a started engine until its free; one topic
 * followed at a time is all this test needs (topic, following). */

#define NODES 2

typedef struct test_engine {
    tern_loop *loop;
    const tern__engine_hooks *hooks;
    void *user;
    char topic[64];        /* the topic followed, when following */
    bool following;
    int subscribes;        /* calls of subscribe with on set */
    uint64_t published, received;
} test_engine;

static test_engine *broker[NODES];

/* A message on its way to one node. */
typedef struct test_post {
    test_engine *to;
    size_t tlen, len;
    char buf[];   /* topic, then data */
} test_post;

static void post_run(tern_loop *loop, void *user) {
    (void)loop;
    test_post *p = user;
    p->to->received++;
    p->to->hooks->message(p->to->user, p->buf, p->tlen, NULL, 0, p->buf + p->tlen, p->len,
                          TERN_WS_TEXT, SIZE_MAX, NULL);
    free(p);
}

static void engine_free(void *state) {
    for (int i = 0; i < NODES; i++)
        if (broker[i] == state)
            broker[i] = NULL;
    free(state);
}

static tern_loop *engine_loop(const void *state) { return ((const test_engine *)state)->loop; }

static bool engine_connected(const void *state) {
    (void)state;
    return true;
}

static void engine_subscribe(void *state, const char *topic, size_t tlen, bool on) {
    test_engine *e = state;
    assert_true(tlen < sizeof(e->topic));
    memcpy(e->topic, topic, tlen);
    e->topic[tlen] = '\0';
    e->following = on;
    e->subscribes += on;
}

static void engine_publish(void *state, const char *topic, size_t tlen, const char *key,
                           size_t klen, const void *data, size_t len, int opcode, size_t seq_at) {
    (void)key, (void)klen, (void)opcode, (void)seq_at;
    test_engine *from = state;
    from->published++;
    for (int i = 0; i < NODES; i++) {
        test_engine *to = broker[i];
        if (to == NULL || to == from || !to->following || strlen(to->topic) != tlen ||
            memcmp(to->topic, topic, tlen) != 0)
            continue;
        test_post *p = malloc(sizeof(*p) + tlen + len);
        assert_non_null(p);
        p->to = to;
        p->tlen = tlen;
        p->len = len;
        memcpy(p->buf, topic, tlen);
        memcpy(p->buf + tlen, data, len);
        assert_int_equal(tern_loop_post(to->loop, post_run, p), 0);
    }
}

static void engine_stats(const void *state, tern_bridge_counters *out) {
    const test_engine *e = state;
    out->connected = true;
    out->published = e->published;
    out->received = e->received;
}

/* No numbering: publish_numbered, psubscribe, fill, claim and last NULL. */
static const tern__engine_ops test_ops = {
    .name = "test",
    .free = engine_free,
    .loop = engine_loop,
    .connected = engine_connected,
    .subscribe = engine_subscribe,
    .publish = engine_publish,
    .stats = engine_stats,
};

/* An engine that numbers in part: publish_numbered alone (a claim, a
 * fill, a last the bridge would call through NULL). */
static void engine_publish_numbered(void *state, const char *topic, size_t tlen,
                                    const char *key, size_t klen, const void *data, size_t len,
                                    int opcode, size_t seq_at, uint32_t keep, uint32_t keep_ms) {
    (void)keep, (void)keep_ms;
    engine_publish(state, topic, tlen, key, klen, data, len, opcode, seq_at);
}

static int start_with(const tern__engine_ops *ops, tern__engine *out, tern_loop *loop,
                      const tern__engine_hooks *hooks, void *user) {
    for (int i = 0; i < NODES; i++) {
        if (broker[i])
            continue;
        test_engine *e = calloc(1, sizeof(*e));
        if (e == NULL)
            return -ENOMEM;
        *e = (test_engine){.loop = loop, .hooks = hooks, .user = user};
        broker[i] = e;
        *out = (tern__engine){.ops = ops, .state = e};
        return 0;
    }
    return -ENOSPC;
}

static int engine_start(tern__engine *out, tern_loop *loop, const char *url,
                        const tern__engine_hooks *hooks, void *user) {
    (void)url;
    return start_with(&test_ops, out, loop, hooks, user);
}

static int partial_start(tern__engine *out, tern_loop *loop, const char *url,
                         const tern__engine_hooks *hooks, void *user) {
    (void)url;
    static tern__engine_ops partial_ops;
    partial_ops = test_ops;
    partial_ops.name = "partial";
    partial_ops.publish_numbered = engine_publish_numbered;
    return start_with(&partial_ops, out, loop, hooks, user);
}

/* ---- two servers, a subscriber on B ---------------------------------------- */

typedef struct nodes {
    tern_loop *loop;
    tern_server *a, *b;
    tern_timer *tick;
    int opened, ticks, step;
    int64_t seq_one, seq_two, seq_three;
} nodes;

static void on_open(tern_ws *ws, void *user) {
    nodes *n = user;
    n->opened++;
    assert_int_equal(tern_ws_subscribe(ws, "h.x"), 0);
}

static const tern_ws_handlers handlers = {.on_open = on_open};

static tern_server *server_new(nodes *n) {
    tern_server *srv;
    assert_int_equal(tern_server_new(&srv, n->loop, NULL), 0);
    tern_topic_options history = {.history = 16};
    assert_int_equal(tern_pubsub_topic_rule(srv, "h.", &history), 0);
    assert_int_equal(tern_ws_route(srv, "/ws", &handlers, NULL, n), 0);
    assert_int_equal(tern_listen(srv, "127.0.0.1", 0, NULL), 0);
    return srv;
}

static test_engine *engine_of(int i) {
    assert_non_null(broker[i]);
    return broker[i];
}

static void tick(tern_timer *t, void *user) {
    (void)t;
    nodes *n = user;
    if (++n->ticks > 2000) {   /* 10 s: give up, the asserts below say what was missing */
        tern_loop_stop(n->loop);
        return;
    }
    switch (n->step) {
    case 0:   /* B's subscriber in: A publishes twice */
        if (n->opened < 1)
            return;
        assert_true(engine_of(1)->following);   /* a topic with a history, followed all the same */
        n->seq_one = tern_publish(n->a, "h.x", "one", 3, TERN_WS_TEXT);
        n->seq_two = tern_publish(n->a, "h.x", "two", 3, TERN_WS_TEXT);
        n->step++;
        return;
    case 1:   /* both heard on B: B publishes on */
        if (engine_of(1)->received < 2)
            return;
        n->seq_three = tern_publish(n->b, "h.x", "three", 5, TERN_WS_TEXT);
        n->step++;
        return;
    default:   /* a few more turns for the writes */
        if (++n->step > 10)
            tern_loop_stop(n->loop);
    }
}

/* Every text message the server sent after the 101's head, joined with
 * '\n' (small unmasked frames only). */
static void read_messages(int fd, char *out, size_t cap) {
    static char raw[1 << 16];
    size_t n = 0, o = 0;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    while (n < sizeof(raw) && poll(&p, 1, 100) > 0) {
        ssize_t r = read(fd, raw + n, sizeof(raw) - n);
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    const char *body = memmem(raw, n, "\r\n\r\n", 4);
    assert_non_null(body);
    for (size_t pos = (size_t)(body + 4 - raw); pos + 2 <= n;) {
        size_t len = (uint8_t)raw[pos + 1];
        assert_int_equal((uint8_t)raw[pos], 0x81);   /* fin, text */
        assert_true(len < 126 && pos + 2 + len <= n && o + len + 1 < cap);
        memcpy(out + o, raw + pos + 2, len);
        o += len;
        out[o++] = '\n';
        pos += 2 + len;
    }
    out[o] = '\0';
}

/* The last log line, for the unknown scheme's. */
static char logged[256];

static void log_keep(int level, const char *msg, void *user) {
    (void)level, (void)user;
    snprintf(logged, sizeof(logged), "%s", msg);
}

static void publish_reaches_the_other_node_without_numbering(void **state) {
    (void)state;
    nodes n = {0};
    assert_int_equal(tern_loop_new(&n.loop, NULL), 0);
    n.a = server_new(&n);
    n.b = server_new(&n);

    /* an unknown scheme: refused, nothing started, the schemes known said
     * (and not the URL, which may hold a password) */
    tern_bridge_counters c;
    assert_int_equal(tern_set_log(TERN_LOG_ERROR, log_keep, NULL), 0);
    assert_int_equal(tern_pubsub_bridge(n.a, "amqp://user:secret@127.0.0.1:5672"), -EINVAL);
    assert_int_equal(tern_set_log(TERN_LOG_ERROR, NULL, NULL), 0);
    assert_non_null(strstr(logged, "known: redis://, nats://"));
    assert_null(strstr(logged, "secret"));
    assert_int_equal(tern_pubsub_bridge_stats(n.a, &c), -ENOENT);
    assert_int_equal(tern_pubsub_redis(n.a, "test://"), -EINVAL);

    assert_int_equal(tern__ps_bridge_start(n.a, "test://", engine_start), 0);
    assert_int_equal(tern__ps_bridge_start(n.b, "test://", engine_start), 0);
    assert_int_equal(tern__ps_bridge_start(n.a, "test://", engine_start), -EALREADY);

    int fd = client_open(tern_server_port(n.b), 0);
    assert_int_equal(tern_timer_start(n.loop, &n.tick, 5, 5, tick, &n), 0);
    assert_int_equal(tern_loop_run(n.loop), 0);

    /* numbered by each node: A's own seqs, B's next one after the two heard */
    assert_int_equal(n.seq_one, 1);
    assert_int_equal(n.seq_two, 2);
    assert_int_equal(n.seq_three, 3);
    char got[256];
    read_messages(fd, got, sizeof(got));
    assert_string_equal(got, "one\ntwo\nthree\n");
    assert_int_equal(engine_of(1)->subscribes, 1);

    assert_int_equal(tern_pubsub_bridge_stats(n.a, &c), 0);
    assert_string_equal(c.engine, "test");
    assert_true(c.connected);
    assert_int_equal(c.published, 2);   /* A's two (B's "three" is counted on B) */
    tern_redis_counters rc;
    assert_int_equal(tern_pubsub_redis_stats(n.b, &rc), 0);
    assert_int_equal(rc.received, 2);
    assert_int_equal(rc.published, 1);

    close(fd);
    tern_timer_stop(n.tick);
    tern_server_free(n.a);
    tern_server_free(n.b);
    assert_null(broker[0]);
    assert_null(broker[1]);
    tern_loop_free(n.loop);
}

/* The numbering is all five operations or none (engine.h): an engine
 * that gives some is refused at start, and freed, nothing left started. */
static void partial_numbering_is_refused(void **state) {
    (void)state;
    tern_loop *loop;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    tern_server *srv;
    assert_int_equal(tern_server_new(&srv, loop, NULL), 0);
    assert_int_equal(tern_set_log(TERN_LOG_ERROR, log_keep, NULL), 0);
    assert_int_equal(tern__ps_bridge_start(srv, "test://", partial_start), -EINVAL);
    assert_int_equal(tern_set_log(TERN_LOG_ERROR, NULL, NULL), 0);
    assert_non_null(strstr(logged, "engine partial gives some of the numbering operations"));
    assert_null(broker[0]);   /* freed */
    tern_bridge_counters c;
    assert_int_equal(tern_pubsub_bridge_stats(srv, &c), -ENOENT);
    /* the whole set (none here) is taken, on the same server */
    assert_int_equal(tern__ps_bridge_start(srv, "test://", engine_start), 0);
    tern_server_free(srv);
    assert_null(broker[0]);
    tern_loop_free(loop);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(publish_reaches_the_other_node_without_numbering),
        cmocka_unit_test(partial_numbering_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
