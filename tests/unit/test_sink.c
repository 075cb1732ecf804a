/* Sinks (tern_sink_*): subscribers that are not WebSockets, driven as an
 * SSE stream drives them, with no socket: the sink's operations record
 * what they are given, and its "buffered" bytes are the test's to set.
 *
 * Checked here: a sink gets a topic's messages in seq order with their
 * payload (the frame's header cut off, the seq spliced in), its topic and
 * opcode; while it has bytes buffered what comes waits and goes, in
 * order, at tern_sink_drained; a conflating topic keeps the latest of each
 * key for it; the drop policy drops past max_backlog; the close policy
 * calls close once and then nothing is sent; a resume replays what was
 * missed from the history and a snapshot the latest of each key;
 * tern_sink_free and tern_sink_unsubscribe end its subscriptions; bad
 * arguments are refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tern/tern.h"

/* What one sink was given: its messages as "topic:payload" lines. */
typedef struct rec {
    char got[8192];
    size_t n;
    int sends, closes, close_code, last_opcode;
    size_t last_len;
    size_t buffered;   /* what the sink says it holds: the test sets it */
} rec;

static int rec_send(void *user, const char *topic, size_t tlen, int opcode, const void *data,
                    size_t len) {
    rec *r = user;
    r->sends++;
    r->last_opcode = opcode;
    r->last_len = len;
    if (len > 512)
        return 0;   /* a long one: its length is what is checked */
    r->n += (size_t)snprintf(r->got + r->n, sizeof(r->got) - r->n, "%.*s:%.*s\n", (int)tlen,
                             topic, (int)len, (const char *)data);
    return 0;
}

static size_t rec_buffered(void *user) { return ((rec *)user)->buffered; }

static void rec_close(void *user, int code) {
    rec *r = user;
    r->closes++;
    r->close_code = code;
}

static const tern_sink_ops ops = {.send = rec_send, .buffered = rec_buffered, .close = rec_close};

/* A loop and a server with pub/sub configured; the test's body runs in
 * a 0 ms timer, on the loop's thread inside tern_loop_run, as a handler
 * would. */
typedef struct env {
    tern_loop *loop;
    tern_server *srv;
    void (*body)(struct env *);
} env;

static void run_body(tern_timer *t, void *user) {
    tern_timer_stop(t);   /* a fired one-shot timer stays allocated: ours to free */
    env *e = user;
    e->body(e);
    tern_loop_stop(e->loop);
}

static void with_rules(const tern_pubsub_options *po, const char *const *prefix,
                       const tern_topic_options *rule, int nrules, void (*body)(env *)) {
    env e = {.body = body};
    assert_int_equal(tern_loop_new(&e.loop, NULL), 0);
    assert_int_equal(tern_server_new(&e.srv, e.loop, NULL), 0);
    assert_int_equal(tern_pubsub_configure(e.srv, po), 0);
    for (int i = 0; i < nrules; i++)
        assert_int_equal(tern_pubsub_topic_rule(e.srv, prefix[i], &rule[i]), 0);
    tern_timer *t;
    assert_int_equal(tern_timer_start(e.loop, &t, 0, 0, run_body, &e), 0);
    assert_int_equal(tern_loop_run(e.loop), 0);
    tern_server_free(e.srv);
    assert_int_equal(tern_loop_free(e.loop), 0);
}

static void with_server(const tern_pubsub_options *po, void (*body)(env *)) {
    with_rules(po, NULL, NULL, 0, body);
}

static int64_t pub(env *e, const char *topic, const char *key, const char *text) {
    /* the seq spliced in after "#" */
    char m[256];
    int n = snprintf(m, sizeof(m), "#%s", text);
    return tern_publish_key(e->srv, topic, key, m, (size_t)n, TERN_WS_TEXT, 1);
}

/* ---- live delivery, queues and drains ---------------------------------- */

static void body_live(env *e) {
    rec r = {0};
    tern_sink *k;
    assert_int_equal(tern_sink_new(e->srv, &ops, &r, &k), 0);
    tern_resume res;
    assert_int_equal(tern_sink_subscribe_from(k, "a", 0, 0, &res), 0);
    assert_int_equal(tern_sink_subscribe_from(k, "a", 0, 0, NULL), -EALREADY);
    assert_int_equal(tern_topic_subscribers(e->srv, "a"), 1);
    assert_int_equal(pub(e, "a", NULL, "x"), 1);
    assert_int_equal(pub(e, "a", NULL, "y"), 2);
    assert_string_equal(r.got, "a:#1x\na:#2y\n");
    assert_int_equal(r.last_opcode, TERN_WS_TEXT);
    /* Behind: the next ones wait, in order, for the drain. */
    r.buffered = 10;
    assert_int_equal(pub(e, "a", NULL, "z"), 3);
    assert_int_equal(pub(e, "a", NULL, "w"), 4);
    assert_int_equal(r.sends, 2);
    tern_sink_drained(k);   /* still buffered: nothing goes */
    assert_int_equal(r.sends, 2);
    r.buffered = 0;
    tern_sink_drained(k);
    assert_string_equal(r.got, "a:#1x\na:#2y\na:#3z\na:#4w\n");
    /* A binary message keeps its opcode; a long one its whole payload
     * (a 16-bit length in the frame's header, then a 64-bit one). */
    static char big[70000];
    memset(big, 'b', sizeof(big));
    assert_int_equal(tern_publish(e->srv, "a", big, 300, TERN_WS_BINARY), 5);
    assert_int_equal(r.last_opcode, TERN_WS_BINARY);
    assert_int_equal(r.last_len, 300);
    assert_int_equal(tern_publish(e->srv, "a", big, sizeof(big), TERN_WS_BINARY), 6);
    assert_int_equal(r.last_len, sizeof(big));   /* a 64-bit length in the frame's header */
    assert_int_equal(tern_sink_unsubscribe(k, "a"), 0);
    assert_int_equal(tern_sink_unsubscribe(k, "a"), -ENOENT);
    assert_int_equal(tern_topic_subscribers(e->srv, "a"), 0);
    assert_int_equal(tern_sink_subscribe_from(k, "a", 0, 0, NULL), 0);
    tern_sink_free(k);
    assert_int_equal(tern_topic_subscribers(e->srv, "a"), 0);
}

static void test_live(void **state) {
    (void)state;
    with_server(&(tern_pubsub_options){0}, body_live);
}

/* ---- policies ----------------------------------------------------------- */

static void body_policies(env *e) {
    rec d = {0}, c = {0}, f = {0};
    tern_sink *kd, *kc, *kf;
    assert_int_equal(tern_sink_new(e->srv, &ops, &d, &kd), 0);
    assert_int_equal(tern_sink_new(e->srv, &ops, &c, &kc), 0);
    assert_int_equal(tern_sink_new(e->srv, &ops, &f, &kf), 0);
    assert_int_equal(tern_sink_subscribe_from(kd, "drop", 0, 0, NULL), 0);
    assert_int_equal(tern_sink_subscribe_from(kc, "close", 0, 0, NULL), 0);
    assert_int_equal(tern_sink_subscribe_from(kf, "keys", 0, 0, NULL), 0);
    d.buffered = c.buffered = f.buffered = 1000;   /* at max_backlog already */
    assert_true(pub(e, "drop", NULL, "1") > 0);
    assert_int_equal(d.sends, 0);
    assert_int_equal(tern_topic_dropped(e->srv, "drop"), 1);
    assert_true(pub(e, "close", NULL, "1") > 0);
    assert_true(pub(e, "close", NULL, "2") > 0);
    assert_int_equal(c.closes, 1);
    assert_int_equal(c.close_code, 1013);
    assert_int_equal(tern_sink_subscribe_from(kc, "other", 0, 0, NULL), -EPIPE);
    c.buffered = 0;
    tern_sink_drained(kc);
    assert_int_equal(c.sends, 0);   /* closing: nothing more */
    /* Conflation: the latest of each key, in the order of their updates. */
    assert_true(pub(e, "keys", "k1", "a") > 0);
    assert_true(pub(e, "keys", "k2", "b") > 0);
    assert_true(pub(e, "keys", "k1", "c") > 0);
    f.buffered = 0;
    tern_sink_drained(kf);
    assert_string_equal(f.got, "keys:#2b\nkeys:#3c\n");
    tern_sink_free(kd);
    tern_sink_free(kc);
    tern_sink_free(kf);
}

static void test_policies(void **state) {
    (void)state;
    const char *prefix[] = {"close", "keys"};
    tern_topic_options rule[] = {
        {.policy = TERN_PUBSUB_CLOSE, .close_code = 1013, .max_backlog = 1000, .exact = true},
        {.policy = TERN_PUBSUB_CONFLATE, .exact = true},
    };
    with_rules(&(tern_pubsub_options){.max_backlog = 1000}, prefix, rule, 2, body_policies);
}

/* ---- history: resume and snapshot --------------------------------------- */

static void body_history(env *e) {
    rec w = {0};
    tern_sink *kw;
    tern_resume res;
    /* Someone watches, so that the history has an epoch to resume. */
    assert_int_equal(tern_sink_new(e->srv, &ops, &w, &kw), 0);
    assert_int_equal(tern_sink_subscribe_from(kw, "h", 0, 0, &res), 0);
    uint64_t epoch = res.epoch;
    assert_true(pub(e, "h", "k1", "a") > 0);
    assert_true(pub(e, "h", "k2", "b") > 0);
    assert_true(pub(e, "h", "k1", "c") > 0);
    rec r = {0}, s = {0}, g = {0};
    tern_sink *kr, *ks, *kg;
    assert_int_equal(tern_sink_new(e->srv, &ops, &r, &kr), 0);
    assert_int_equal(tern_sink_subscribe_from(kr, "h", epoch, 1, &res), 0);
    assert_true(res.resumed);
    assert_int_equal(res.replayed, 2);
    assert_int_equal(res.seq, 3);
    assert_string_equal(r.got, "h:#2b\nh:#3c\n");
    assert_int_equal(tern_sink_new(e->srv, &ops, &s, &ks), 0);
    assert_int_equal(tern_sink_subscribe_latest(ks, "h", &res), 0);
    assert_false(res.resumed);
    assert_string_equal(s.got, "h:#2b\nh:#3c\n");
    assert_int_equal(tern_sink_new(e->srv, &ops, &g, &kg), 0);
    assert_int_equal(tern_sink_subscribe_from(kg, "h", epoch + 1, 1, &res), 0);
    assert_false(res.resumed);   /* another epoch: a gap, and the latest of each key */
    assert_string_equal(g.got, "h:#2b\nh:#3c\n");
    /* Live after the replay: no gap, no duplicate. */
    assert_true(pub(e, "h", NULL, "d") > 0);
    assert_string_equal(r.got, "h:#2b\nh:#3c\nh:#4d\n");
    tern_sink_free(kw);
    tern_sink_free(kr);
    tern_sink_free(ks);
    tern_sink_free(kg);
}

static void test_history(void **state) {
    (void)state;
    with_server(&(tern_pubsub_options){.history = 16}, body_history);
}

/* ---- bad arguments ------------------------------------------------------ */

static void body_args(env *e) {
    rec r = {0};
    tern_sink *k;
    tern_sink_ops none = {0};
    assert_int_equal(tern_sink_new(NULL, &ops, &r, &k), -EINVAL);
    assert_int_equal(tern_sink_new(e->srv, NULL, &r, &k), -EINVAL);
    assert_int_equal(tern_sink_new(e->srv, &none, &r, &k), -EINVAL);
    assert_int_equal(tern_sink_new(e->srv, &ops, &r, NULL), -EINVAL);
    assert_int_equal(tern_sink_new(e->srv, &ops, &r, &k), 0);
    assert_int_equal(tern_sink_subscribe_from(NULL, "a", 0, 0, NULL), -EINVAL);
    assert_int_equal(tern_sink_subscribe_from(k, "", 0, 0, NULL), -EINVAL);
    assert_int_equal(tern_sink_subscribe_latest(k, NULL, NULL), -EINVAL);
    char longname[TERN_TOPIC_MAX + 2];
    memset(longname, 'n', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    assert_int_equal(tern_sink_subscribe_from(k, longname, 0, 0, NULL), -ENAMETOOLONG);
    assert_int_equal(tern_sink_unsubscribe(NULL, "a"), -EINVAL);
    assert_int_equal(tern_sink_unsubscribe(k, "a"), -ENOENT);
    tern_sink_drained(NULL);
    tern_sink_drained(k);   /* nothing subscribed: nothing happens */
    tern_sink_free(NULL);
    tern_sink_free(k);
}

static void test_args(void **state) {
    (void)state;
    with_server(&(tern_pubsub_options){0}, body_args);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_live),
        cmocka_unit_test(test_policies),
        cmocka_unit_test(test_history),
        cmocka_unit_test(test_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
