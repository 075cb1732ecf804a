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
 * missed from the history and a snapshot the latest of each key, before
 * any live message; no operation runs inside a call the test made
 * (publish, subscribe, drained: DESIGN.md's no re-entrancy), what those
 * owe goes at the loop's next iteration, the close policy's close too;
 * a sink whose ops say send_at_once gets a live message in pub/sub's own
 * pass (never inside the application's publish) when nothing waits for
 * it, and waits like the others when it is behind; tern_sink_free and tern_sink_unsubscribe end its subscriptions; bad
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
#include <time.h>
#include <unistd.h>

#include "tern/tern.h"

/* What one sink was given: its messages as "topic:payload" lines. */
typedef struct rec {
    char got[8192];
    size_t n;
    int sends, closes, close_code, last_opcode;
    size_t last_len;
    size_t buffered;   /* what the sink says it holds: the test sets it */
} rec;

/* Inside a call the test made (a publish, tern_sink_subscribe_*,
 * tern_sink_drained): an operation then would break the no re-entrancy
 * rule, and is counted in reentered (checked 0 after every test). */
static int in_call, reentered;

static int rec_send(void *user, const char *topic, size_t tlen, int opcode, const void *data,
                    size_t len) {
    rec *r = user;
    if (in_call)
        reentered++;
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
    if (in_call)
        reentered++;
    r->closes++;
    r->close_code = code;
}

static const tern_sink_ops ops = {.send = rec_send, .buffered = rec_buffered, .close = rec_close};

/* The sink calls, marked as the test's own (in_call). */
static int sub_from(tern_sink *k, const char *topic, uint64_t epoch, uint64_t after,
                    tern_resume *out) {
    in_call++;
    int rc = tern_sink_subscribe_from(k, topic, epoch, after, out);
    in_call--;
    return rc;
}

static int sub_latest(tern_sink *k, const char *topic, tern_resume *out) {
    in_call++;
    int rc = tern_sink_subscribe_latest(k, topic, out);
    in_call--;
    return rc;
}

static void drained(tern_sink *k) {
    in_call++;
    tern_sink_drained(k);
    in_call--;
}

/* A loop and a server with pub/sub configured. The test's steps run one
 * per loop iteration, each in a 0 ms timer re-armed after it, on the
 * loop's thread inside tern_loop_run, as a handler would: what a sink call
 * left for the loop's next iteration (a replay, a drain) has gone out when
 * the next step begins (timers due together fire in the order they were
 * armed, the sink's during the step, the step's after it). */
typedef void (*step_fn)(tern_server *srv);

typedef struct env {
    tern_loop *loop;
    tern_server *srv;
    const step_fn *steps;
    int nsteps, next;
} env;

static void run_step(tern_timer *t, void *user) {
    env *e = user;
    e->steps[e->next++](e->srv);
    if (e->next < e->nsteps) {
        assert_int_equal(tern_timer_again(t, 0), 0);
        return;
    }
    tern_timer_stop(t);   /* a fired one-shot timer stays allocated: ours to free */
    tern_loop_stop(e->loop);
}

static void with_rules(const tern_pubsub_options *po, const char *const *prefix,
                       const tern_topic_options *rule, int nrules, const step_fn *steps,
                       int nsteps) {
    env e = {.steps = steps, .nsteps = nsteps};
    reentered = 0;
    assert_int_equal(tern_loop_new(&e.loop, NULL), 0);
    assert_int_equal(tern_server_new(&e.srv, e.loop, NULL), 0);
    assert_int_equal(tern_pubsub_configure(e.srv, po), 0);
    for (int i = 0; i < nrules; i++)
        assert_int_equal(tern_pubsub_topic_rule(e.srv, prefix[i], &rule[i]), 0);
    tern_timer *t;
    assert_int_equal(tern_timer_start(e.loop, &t, 0, 0, run_step, &e), 0);
    assert_int_equal(tern_loop_run(e.loop), 0);
    assert_int_equal(e.next, nsteps);
    tern_server_free(e.srv);
    assert_int_equal(tern_loop_free(e.loop), 0);
    assert_int_equal(reentered, 0);
}

/* The steps' array and their count, as with_rules takes them. */
#define STEPS(...)                                                                            \
    (const step_fn[]){__VA_ARGS__},                                                           \
        (int)(sizeof((step_fn[]){__VA_ARGS__}) / sizeof(step_fn))

static void with_server(const tern_pubsub_options *po, const step_fn *steps, int nsteps) {
    with_rules(po, NULL, NULL, 0, steps, nsteps);
}

static int64_t pub(tern_server *srv, const char *topic, const char *key, const char *text) {
    /* the seq spliced in after "#" */
    char m[256];
    int n = snprintf(m, sizeof(m), "#%s", text);
    in_call++;
    int64_t seq = tern_publish_key(srv, topic, key, m, (size_t)n, TERN_WS_TEXT, 1);
    in_call--;
    return seq;
}

static int64_t pub_bin(tern_server *srv, const char *topic, const void *data, size_t len) {
    in_call++;
    int64_t seq = tern_publish(srv, topic, data, len, TERN_WS_BINARY);
    in_call--;
    return seq;
}

/* ---- live delivery, queues and drains ---------------------------------- */

/* One test's sinks and what they were given, kept from step to step. */
static rec r1, r2, r3, r4;
static tern_sink *k1, *k2, *k3, *k4;
static uint64_t epoch;

static void live_1(tern_server *srv) {
    r1 = (rec){0};
    assert_int_equal(tern_sink_new(srv, &ops, &r1, &k1), 0);
    tern_resume res;
    assert_int_equal(sub_from(k1, "a", 0, 0, &res), 0);
    assert_int_equal(sub_from(k1, "a", 0, 0, NULL), -EALREADY);
    assert_int_equal(tern_topic_subscribers(srv, "a"), 1);
    assert_int_equal(pub(srv, "a", NULL, "x"), 1);
    assert_int_equal(pub(srv, "a", NULL, "y"), 2);
    assert_int_equal(r1.sends, 0);   /* at the next iteration, not inside the publish */
}

static void live_2(tern_server *srv) {
    assert_string_equal(r1.got, "a:#1x\na:#2y\n");
    assert_int_equal(r1.last_opcode, TERN_WS_TEXT);
    /* Behind: the next ones wait, in order, for the drain. */
    r1.buffered = 10;
    assert_int_equal(pub(srv, "a", NULL, "z"), 3);
    assert_int_equal(pub(srv, "a", NULL, "w"), 4);
    drained(k1);
}

static void live_3(tern_server *srv) {
    (void)srv;
    assert_int_equal(r1.sends, 2);   /* still buffered: nothing went */
    r1.buffered = 0;
    drained(k1);
    assert_int_equal(r1.sends, 2);   /* at the next iteration, not inside */
}

static char big[70000];

static void live_4(tern_server *srv) {
    assert_string_equal(r1.got, "a:#1x\na:#2y\na:#3z\na:#4w\n");
    /* A binary message keeps its opcode; a long one its whole payload
     * (a 16-bit length in the frame's header, then a 64-bit one). */
    memset(big, 'b', sizeof(big));
    assert_int_equal(pub_bin(srv, "a", big, 300), 5);
}

static void live_5(tern_server *srv) {
    assert_int_equal(r1.last_opcode, TERN_WS_BINARY);
    assert_int_equal(r1.last_len, 300);
    assert_int_equal(pub_bin(srv, "a", big, sizeof(big)), 6);
}

static void live_6(tern_server *srv) {
    assert_int_equal(r1.last_len, sizeof(big));   /* a 64-bit length in the frame's header */
    assert_int_equal(tern_sink_unsubscribe(k1, "a"), 0);
    assert_int_equal(tern_sink_unsubscribe(k1, "a"), -ENOENT);
    assert_int_equal(tern_topic_subscribers(srv, "a"), 0);
    assert_int_equal(sub_from(k1, "a", 0, 0, NULL), 0);
    tern_sink_free(k1);
    assert_int_equal(tern_topic_subscribers(srv, "a"), 0);
}

static void test_live(void **state) {
    (void)state;
    with_server(&(tern_pubsub_options){0}, STEPS(live_1, live_2, live_3, live_4, live_5, live_6));
}

/* ---- a sink whose send only writes (send_at_once) ---------------------- */

static const tern_sink_ops ops_at_once = {
    .send = rec_send, .buffered = rec_buffered, .close = rec_close, .send_at_once = true};

/* tern_publish_later: delivered at a loop turn of pub/sub's own (a batch
 * pass), where an at-once sink's send may run. */
static void pub_later(tern_server *srv, const char *topic, const char *text, int64_t want) {
    char m[64];
    int n = snprintf(m, sizeof(m), "#%s", text);
    in_call++;
    assert_int_equal(tern_publish_later(srv, topic, NULL, m, (size_t)n, TERN_WS_TEXT, 1), want);
    in_call--;
}

static void at_once_1(tern_server *srv) {
    r1 = r2 = (rec){0};
    assert_int_equal(tern_sink_new(srv, &ops_at_once, &r1, &k1), 0);
    assert_int_equal(tern_sink_new(srv, &ops, &r2, &k2), 0);
    assert_int_equal(sub_from(k1, "a", 0, 0, NULL), 0);
    assert_int_equal(sub_from(k2, "a", 0, 0, NULL), 0);
    /* Inside the application's publish no sink's send runs, not even an
     * at-once one's: both at the next iteration. */
    assert_int_equal(pub(srv, "a", NULL, "x"), 1);
    assert_int_equal(r1.sends + r2.sends, 0);
}

static void at_once_2(tern_server *srv) {
    assert_string_equal(r1.got, "a:#1x\n");
    assert_string_equal(r2.got, "a:#1x\n");
    /* Behind: it waits as any sink's message does, and goes after the
     * drain at the next iteration, never inside the drain. */
    r1.buffered = 10;
    pub_later(srv, "a", "y", 2);
}

static void at_once_3(tern_server *srv) {
    (void)srv;
    assert_int_equal(r1.sends, 1);
    r1.buffered = 0;
    drained(k1);
    assert_int_equal(r1.sends, 1);
}

static void at_once_4(tern_server *srv) {
    assert_string_equal(r1.got, "a:#1x\na:#2y\n");
    pub_later(srv, "a", "z", 3);   /* nothing waits: in the pass, at once */
}

static void at_once_wait(tern_server *srv) {
    (void)srv;   /* the post, the pass, the other sink's timer */
}

static void at_once_5(tern_server *srv) {
    assert_string_equal(r1.got, "a:#1x\na:#2y\na:#3z\n");
    assert_string_equal(r2.got, "a:#1x\na:#2y\na:#3z\n");
    tern_sink_free(k1);
    tern_sink_free(k2);
    assert_int_equal(tern_topic_subscribers(srv, "a"), 0);
}

static void test_send_at_once(void **state) {
    (void)state;
    with_server(&(tern_pubsub_options){0}, STEPS(at_once_1, at_once_wait, at_once_2, at_once_wait,
                                                  at_once_3, at_once_wait, at_once_4,
                                                  at_once_wait, at_once_wait, at_once_5));
}

/* ---- a throttled topic (throttle_ms) ------------------------------------ */

static uint64_t mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static uint64_t passed_at;

static void throttle_1(tern_server *srv) {
    tern_topic_options bad = {.throttle_ms = TERN_WRITE_DELAY_MAX + 1};
    assert_int_equal(tern_pubsub_topic_rule(srv, "z", &bad), -EINVAL);
    r1 = r2 = (rec){0};
    assert_int_equal(tern_sink_new(srv, &ops_at_once, &r1, &k1), 0);
    assert_int_equal(tern_sink_new(srv, &ops_at_once, &r2, &k2), 0);
    assert_int_equal(sub_from(k1, "t.x", 0, 0, NULL), 0);
    assert_int_equal(sub_from(k2, "u", 0, 0, NULL), 0);
    /* On a quiet topic, throttled or not, a message goes at the loop's
     * next turns (never inside the publish). */
    assert_int_equal(pub(srv, "t.x", NULL, "x"), 1);
    assert_int_equal(pub(srv, "u", NULL, "a"), 1);
    assert_int_equal(r1.sends + r2.sends, 0);
}

static void throttle_wait(tern_server *srv) {
    (void)srv;   /* the post, then the pass's timer: perhaps after the step */
}

static void throttle_2(tern_server *srv) {
    /* quiet: its pass ran at once (the loop's next turns) */
    assert_string_equal(r1.got, "t.x:#1x\n");
    assert_string_equal(r2.got, "u:#1a\n");
    passed_at = mono_ms();
    assert_int_equal(pub(srv, "t.x", NULL, "y"), 2);
    assert_int_equal(pub(srv, "t.x", NULL, "z"), 3);
}

static void throttle_3(tern_server *srv) {
    (void)srv;
    /* Within the throttle of the last pass, they wait (unless this
     * machine took most of the second to come here). */
    if (mono_ms() - passed_at < TERN_WRITE_DELAY_MAX - 100)
        assert_int_equal(r1.sends, 1);
    usleep((TERN_WRITE_DELAY_MAX + 100) * 1000);
}

static void throttle_5(tern_server *srv) {
    assert_string_equal(r1.got, "t.x:#1x\nt.x:#2y\nt.x:#3z\n");
    /* One more, which waits for the throttle (in the topic's batch from
     * the loop's next turn) when its subscribers go and the server is
     * freed: dropped, its topic freed too (LeakSanitizer). */
    assert_int_equal(pub(srv, "t.x", NULL, "w"), 4);
}

static void throttle_6(tern_server *srv) {
    assert_int_equal(r1.sends, 3);
    tern_sink_free(k1);
    tern_sink_free(k2);
    assert_int_equal(tern_topic_subscribers(srv, "t.x"), 0);
}

static void test_throttle(void **state) {
    (void)state;
    const char *prefix[] = {"t."};
    tern_topic_options rule[] = {{.throttle_ms = TERN_WRITE_DELAY_MAX}};
    with_rules(&(tern_pubsub_options){0}, prefix, rule, 1,
               STEPS(throttle_1, throttle_wait, throttle_2, throttle_3, throttle_wait,
                     throttle_5, throttle_wait, throttle_6));
}

/* ---- policies ----------------------------------------------------------- */

static void policies_1(tern_server *srv) {
    r1 = r2 = r3 = (rec){0};
    assert_int_equal(tern_sink_new(srv, &ops, &r1, &k1), 0);
    assert_int_equal(tern_sink_new(srv, &ops, &r2, &k2), 0);
    assert_int_equal(tern_sink_new(srv, &ops, &r3, &k3), 0);
    assert_int_equal(sub_from(k1, "drop", 0, 0, NULL), 0);
    assert_int_equal(sub_from(k2, "close", 0, 0, NULL), 0);
    assert_int_equal(sub_from(k3, "keys", 0, 0, NULL), 0);
    r1.buffered = r2.buffered = r3.buffered = 1000;   /* at max_backlog already */
    assert_true(pub(srv, "drop", NULL, "1") > 0);
    assert_int_equal(r1.sends, 0);
    assert_int_equal(tern_topic_dropped(srv, "drop"), 1);
    assert_true(pub(srv, "close", NULL, "1") > 0);
    assert_true(pub(srv, "close", NULL, "2") > 0);
    assert_int_equal(r2.closes, 0);   /* told at the next iteration, not inside */
    assert_int_equal(sub_from(k2, "other", 0, 0, NULL), -EPIPE);
    r2.buffered = 0;
    drained(k2);
    /* Conflation: the latest of each key, in the order of their updates. */
    assert_true(pub(srv, "keys", "k1", "a") > 0);
    assert_true(pub(srv, "keys", "k2", "b") > 0);
    assert_true(pub(srv, "keys", "k1", "c") > 0);
    r3.buffered = 0;
    drained(k3);
}

static void policies_2(tern_server *srv) {
    (void)srv;
    assert_int_equal(r2.closes, 1);
    assert_int_equal(r2.close_code, 1013);
    assert_int_equal(r2.sends, 0);   /* closing: nothing more */
    assert_string_equal(r3.got, "keys:#2b\nkeys:#3c\n");
    tern_sink_free(k1);
    tern_sink_free(k2);
    tern_sink_free(k3);
}

static void test_policies(void **state) {
    (void)state;
    const char *prefix[] = {"close", "keys"};
    tern_topic_options rule[] = {
        {.policy = TERN_PUBSUB_CLOSE, .close_code = 1013, .max_backlog = 1000, .exact = true},
        {.policy = TERN_PUBSUB_CONFLATE, .exact = true},
    };
    with_rules(&(tern_pubsub_options){.max_backlog = 1000}, prefix, rule, 2,
               STEPS(policies_1, policies_2));
}

/* ---- history: resume and snapshot --------------------------------------- */

static void history_1(tern_server *srv) {
    tern_resume res;
    r1 = r2 = r3 = r4 = (rec){0};
    /* Someone watches, so that the history has an epoch to resume. */
    assert_int_equal(tern_sink_new(srv, &ops, &r4, &k4), 0);
    assert_int_equal(sub_from(k4, "h", 0, 0, &res), 0);
    epoch = res.epoch;
    assert_true(pub(srv, "h", "k1", "a") > 0);
    assert_true(pub(srv, "h", "k2", "b") > 0);
    assert_true(pub(srv, "h", "k1", "c") > 0);
    assert_int_equal(tern_sink_new(srv, &ops, &r1, &k1), 0);
    assert_int_equal(sub_from(k1, "h", epoch, 1, &res), 0);
    assert_true(res.resumed);
    assert_int_equal(res.replayed, 2);
    assert_int_equal(res.seq, 3);
    assert_int_equal(tern_sink_new(srv, &ops, &r2, &k2), 0);
    assert_int_equal(sub_latest(k2, "h", &res), 0);
    assert_false(res.resumed);
    assert_int_equal(res.replayed, 2);
    assert_int_equal(tern_sink_new(srv, &ops, &r3, &k3), 0);
    assert_int_equal(sub_from(k3, "h", epoch + 1, 1, &res), 0);
    assert_false(res.resumed);   /* another epoch: a gap, and the latest of each key */
    /* Nothing owed went inside the calls; a live message published before
     * the replays went out waits behind them. */
    assert_int_equal(r1.sends + r2.sends + r3.sends, 0);
    assert_true(pub(srv, "h", NULL, "d") > 0);
    assert_int_equal(r1.sends + r2.sends + r3.sends, 0);
}

static void history_2(tern_server *srv) {
    /* The replays in order, then the live one: no gap, no duplicate. */
    assert_string_equal(r1.got, "h:#2b\nh:#3c\nh:#4d\n");
    assert_string_equal(r2.got, "h:#2b\nh:#3c\nh:#4d\n");
    assert_string_equal(r3.got, "h:#2b\nh:#3c\nh:#4d\n");
    assert_true(pub(srv, "h", NULL, "e") > 0);
    assert_string_equal(r1.got, "h:#2b\nh:#3c\nh:#4d\n");   /* e: at the next iteration */
    /* A replay for a sink that is behind waits for its drain; a sink
     * freed with its replay still waiting is simply gone. */
    tern_resume res;
    assert_int_equal(tern_sink_unsubscribe(k2, "h"), 0);
    r2 = (rec){.buffered = 10};
    assert_int_equal(sub_from(k2, "h", epoch, 3, &res), 0);
    assert_int_equal(res.replayed, 2);
    assert_int_equal(tern_sink_unsubscribe(k3, "h"), 0);
    assert_int_equal(sub_from(k3, "h", epoch, 3, &res), 0);
    tern_sink_free(k3);
}

static void history_3(tern_server *srv) {
    (void)srv;
    assert_string_equal(r1.got, "h:#2b\nh:#3c\nh:#4d\nh:#5e\n");
    assert_int_equal(r2.sends, 0);   /* behind */
    r2.buffered = 0;
    drained(k2);
}

static void history_4(tern_server *srv) {
    (void)srv;
    assert_string_equal(r2.got, "h:#4d\nh:#5e\n");
    tern_sink_free(k4);
    tern_sink_free(k1);
    tern_sink_free(k2);
}

static void test_history(void **state) {
    (void)state;
    with_server(&(tern_pubsub_options){.history = 16},
                STEPS(history_1, history_2, history_3, history_4));
}

/* ---- bad arguments ------------------------------------------------------ */

static void args_1(tern_server *srv) {
    rec r = {0};
    tern_sink *k;
    tern_sink_ops none = {0};
    assert_int_equal(tern_sink_new(NULL, &ops, &r, &k), -EINVAL);
    assert_int_equal(tern_sink_new(srv, NULL, &r, &k), -EINVAL);
    assert_int_equal(tern_sink_new(srv, &none, &r, &k), -EINVAL);
    assert_int_equal(tern_sink_new(srv, &ops, &r, NULL), -EINVAL);
    assert_int_equal(tern_sink_new(srv, &ops, &r, &k), 0);
    assert_int_equal(sub_from(NULL, "a", 0, 0, NULL), -EINVAL);
    assert_int_equal(sub_from(k, "", 0, 0, NULL), -EINVAL);
    assert_int_equal(sub_latest(k, NULL, NULL), -EINVAL);
    char longname[TERN_TOPIC_MAX + 2];
    memset(longname, 'n', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    assert_int_equal(sub_from(k, longname, 0, 0, NULL), -ENAMETOOLONG);
    assert_int_equal(tern_sink_unsubscribe(NULL, "a"), -EINVAL);
    assert_int_equal(tern_sink_unsubscribe(k, "a"), -ENOENT);
    drained(NULL);
    drained(k);   /* nothing subscribed: nothing happens */
    tern_sink_free(NULL);
    tern_sink_free(k);   /* with its timer armed: stopped */
}

static void test_args(void **state) {
    (void)state;
    with_server(&(tern_pubsub_options){0}, STEPS(args_1));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_live),
        cmocka_unit_test(test_send_at_once),
        cmocka_unit_test(test_throttle),
        cmocka_unit_test(test_policies),
        cmocka_unit_test(test_history),
        cmocka_unit_test(test_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
