/* The rest of the public calls with bad input (test_api_errors.c has the
 * first ones): server accessors, clones and virtual hosts, pub/sub, the
 * WebSocket's references, deadlines and subscriptions. A clear error,
 * never a crash; runs a real loop (a tern_ws_connect client against the
 * server on the same loop) for the calls that need a live WebSocket. The
 * pages of docs/api/ give these errors in prose, each under its call. */
#include <errno.h>
#include <limits.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tern/tern.h"

static void noop_handler(tern_http_req *req, void *user) {}

/* A NUL-terminated string of n bytes 'c', in buf (at least n + 1 bytes). */
static const char *filled(char *buf, size_t n, char c) {
    memset(buf, c, n);
    buf[n] = '\0';
    return buf;
}

/* ---- loop and HTTP helpers ---------------------------------------------- */

static void loop_and_reason(void **state) {
    assert_null(tern_loop_backend(NULL));
    tern_loop *loop;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    const char *b = tern_loop_backend(loop);
    assert_non_null(b);
    assert_true(strcmp(b, "epoll") == 0 || strcmp(b, "io_uring") == 0 ||
                strcmp(b, "poll") == 0);
    tern_loop_free(loop);

    assert_string_equal(tern_http_reason(404), "Not Found");
    static const int bad[] = {0, -1, 99, 299, 999, 1000, INT_MIN, INT_MAX};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_string_equal(tern_http_reason(bad[i]), "Unknown");
}

/* ---- servers: clones, peers, stats, hosts ------------------------------- */

static void server_accessors(void **state) {
    tern_loop *loop;
    tern_server *srv, *clone = (tern_server *)1, *host = NULL, *h2 = NULL;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    assert_int_equal(tern_server_new(&srv, loop, NULL), 0);

    /* peers of a server alone */
    assert_int_equal(tern_server_index(NULL), -EINVAL);
    assert_int_equal(tern_server_peer_count(NULL), -EINVAL);
    assert_null(tern_server_peer(NULL, 0));
    assert_int_equal(tern_server_index(srv), 0);
    assert_int_equal(tern_server_peer_count(srv), 1);
    assert_ptr_equal(tern_server_peer(srv, 0), srv);
    assert_null(tern_server_peer(srv, -1));
    assert_null(tern_server_peer(srv, 1));
    assert_null(tern_server_peer(srv, INT_MAX));
    assert_null(tern_server_peer(srv, INT_MIN));

    /* stats */
    tern_stats st;
    assert_int_equal(tern_server_stats(NULL, &st), -EINVAL);
    assert_int_equal(tern_server_stats(srv, NULL), -EINVAL);
    assert_int_equal(tern_server_stats(srv, &st), 0);
    assert_int_equal(st.connections, 0);

    /* virtual hosts */
    assert_int_equal(tern_server_host(NULL, "a.example", &host), -EINVAL);
    assert_int_equal(tern_server_host(srv, NULL, &host), -EINVAL);
    assert_int_equal(tern_server_host(srv, "a.example", NULL), -EINVAL);
    char name[300];
    static const char *const bad_names[] = {"", ".", "...", "a b", "a.example:80", "caf\xc3\xa9",
                                            "a/b", "a\r\nb", "[::1]"};
    for (size_t i = 0; i < sizeof(bad_names) / sizeof(bad_names[0]); i++)
        if (tern_server_host(srv, bad_names[i], &host) != -EINVAL)
            fail_msg("host name %zu taken", i);
    assert_int_equal(tern_server_host(srv, filled(name, 254, 'a'), &host), -EINVAL);
    assert_null(host);
    assert_int_equal(tern_server_host(srv, filled(name, 253, 'a'), &host), 0);
    assert_int_equal(tern_server_host(srv, "a.example", &host), 0);
    assert_non_null(host);
    assert_int_equal(tern_server_host(srv, "A.Example.", &h2), 0);   /* the same name */
    assert_ptr_equal(h2, host);

    /* what a host handle refuses */
    tern_stats hst;
    tern_pubsub_counters pc;
    assert_int_equal(tern_server_index(host), -EINVAL);
    assert_int_equal(tern_server_stats(host, &hst), -EINVAL);
    assert_int_equal(tern_server_clone(&clone, loop, host), -EINVAL);
    assert_int_equal(tern_listen(host, "127.0.0.1", 0, NULL), -EINVAL);
    assert_int_equal(tern_pubsub_stats(host, &pc), -EINVAL);
    tern_histogram hh;
    tern_pubsub_rule_counters hrc;
    assert_int_equal(tern_pubsub_latency(host, &hh), -EINVAL);
    assert_int_equal(tern_server_ws_sessions(host, &hh), -EINVAL);
    assert_int_equal(tern_server_ws_sessions(NULL, &hh), -EINVAL);
    assert_int_equal(tern_server_ws_sessions(srv, NULL), -EINVAL);
    assert_int_equal(tern_server_ws_sessions(srv, &hh), 0);
    assert_int_equal(hh.count, 0);
    assert_int_equal(hh.le_us[0], 100000);
    assert_int_equal(tern_pubsub_rule_stats(host, "a.", false, &hrc), -EINVAL);
    assert_int_equal(tern_pubsub_redis(host, "redis://127.0.0.1:1"), -EINVAL);
    assert_int_equal(tern_pubsub_bridge(host, "redis://127.0.0.1:1"), -EINVAL);
    assert_int_equal(tern_publish(host, "t", "x", 1, TERN_WS_TEXT), -EINVAL);
    assert_null(tern_server_loop(host));
    assert_int_equal(tern_topic_subscribers(host, "t"), 0);
    assert_int_equal(tern_topic_dropped(host, "t"), 0);
    tern_server_shutdown(host, NULL, NULL);
    tern_server_free(host);   /* nothing: it goes with its configuration */
    assert_int_equal(tern_http_route(host, "GET", "/h", noop_handler, NULL), 0);

    /* clones */
    assert_int_equal(tern_server_clone(NULL, loop, srv), -EINVAL);
    assert_int_equal(tern_server_clone(&clone, NULL, srv), -EINVAL);
    assert_int_equal(tern_server_clone(&clone, loop, NULL), -EINVAL);
    assert_int_equal(tern_server_clone(&clone, loop, srv), 0);
    assert_int_equal(tern_server_index(clone), 1);
    assert_int_equal(tern_server_peer_count(srv), 2);
    assert_ptr_equal(tern_server_peer(srv, 1), clone);
    assert_ptr_equal(tern_server_peer(clone, 0), srv);
    assert_null(tern_server_peer(srv, 2));
    /* The configuration is shared now: no new host, the old one is found. */
    assert_int_equal(tern_server_host(srv, "b.example", &h2), -EBUSY);
    assert_int_equal(tern_server_host(clone, "a.example", &h2), 0);
    assert_ptr_equal(h2, host);
    tern_server_free(clone);
    assert_null(tern_server_peer(srv, 1));   /* freed */
    assert_int_equal(tern_server_peer_count(srv), 2);   /* how many were made */

    tern_server_free(srv);
    tern_loop_free(loop);
}

/* ---- pub/sub setup, publishing with nobody there ------------------------ */

static void pubsub_setup_calls(void **state) {
    tern_loop *loop;
    tern_server *srv, *clone;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    assert_int_equal(tern_server_new(&srv, loop, NULL), 0);

    /* counters before anything */
    tern_pubsub_counters pc;
    memset(&pc, 0xff, sizeof(pc));
    assert_int_equal(tern_pubsub_stats(NULL, &pc), -EINVAL);
    assert_int_equal(tern_pubsub_stats(srv, NULL), -EINVAL);
    assert_int_equal(tern_pubsub_stats(srv, &pc), 0);
    assert_int_equal(pc.messages, 0);
    assert_int_equal(pc.subscriptions, 0);

    /* configure */
    const tern_pubsub_options bad_opts[] = {
        {.policy = 3},
        {.policy = -1},
        {.close_code = 1000},
        {.close_code = 1011},
        {.history = TERN_HISTORY_MAX + 1},
    };
    assert_int_equal(tern_pubsub_configure(NULL, &(tern_pubsub_options){0}), -EINVAL);
    assert_int_equal(tern_pubsub_configure(srv, NULL), -EINVAL);
    for (size_t i = 0; i < sizeof(bad_opts) / sizeof(bad_opts[0]); i++)
        if (tern_pubsub_configure(srv, &bad_opts[i]) != -EINVAL)
            fail_msg("pub/sub option set %zu taken", i);
    assert_int_equal(tern_pubsub_configure(srv, &(tern_pubsub_options){
                                                    .policy = TERN_PUBSUB_CLOSE,
                                                    .close_code = TERN_WS_TRY_AGAIN}), 0);

    /* topic rules */
    char name[300];
    tern_topic_options to = {.policy = TERN_PUBSUB_DROP};
    assert_int_equal(tern_pubsub_topic_rule(NULL, "a.", &to), -EINVAL);
    assert_int_equal(tern_pubsub_topic_rule(srv, NULL, &to), -EINVAL);
    assert_int_equal(tern_pubsub_topic_rule(srv, "a.", NULL), -EINVAL);
    assert_int_equal(tern_pubsub_topic_rule(srv, "a.", &(tern_topic_options){.policy = 7}), -EINVAL);
    assert_int_equal(tern_pubsub_topic_rule(srv, "a.", &(tern_topic_options){.close_code = 1000}),
                     -EINVAL);
    assert_int_equal(tern_pubsub_topic_rule(srv, "a.",
                                            &(tern_topic_options){.history = TERN_HISTORY_MAX + 1}),
                     -EINVAL);
    assert_int_equal(tern_pubsub_topic_rule(srv, filled(name, TERN_TOPIC_MAX + 1, 'p'), &to),
                     -ENAMETOOLONG);
    assert_int_equal(tern_pubsub_topic_rule(srv, filled(name, TERN_TOPIC_MAX, 'p'), &to), 0);
    for (int i = 1; i < TERN_TOPIC_RULES_MAX; i++) {
        char p[16];
        snprintf(p, sizeof(p), "r%d.", i);
        assert_int_equal(tern_pubsub_topic_rule(srv, p, &to), 0);
    }
    assert_int_equal(tern_pubsub_topic_rule(srv, "one.more.", &to), -ENOSPC);
    assert_int_equal(tern_pubsub_topic_rule(srv, "r1.", &to), 0);   /* replaces: no room needed */

    /* a rule's counters, and the latency histogram, before any use */
    tern_pubsub_rule_counters prc;
    memset(&prc, 0xff, sizeof(prc));
    assert_int_equal(tern_pubsub_rule_stats(NULL, "r1.", false, &prc), -EINVAL);
    assert_int_equal(tern_pubsub_rule_stats(srv, NULL, false, &prc), -EINVAL);
    assert_int_equal(tern_pubsub_rule_stats(srv, "r1.", false, NULL), -EINVAL);
    assert_int_equal(tern_pubsub_rule_stats(srv, "nope.", false, &prc), -ENOENT);
    assert_int_equal(tern_pubsub_rule_stats(srv, "r1.", true, &prc), -ENOENT);   /* not exact */
    assert_int_equal(tern_pubsub_rule_stats(srv, "r1.", false, &prc), 0);
    assert_int_equal(prc.subscriptions, 0);
    assert_int_equal(prc.published, 0);
    assert_int_equal(prc.resumed_gap, 0);
    tern_histogram lh;
    assert_int_equal(tern_pubsub_latency(NULL, &lh), -EINVAL);
    assert_int_equal(tern_pubsub_latency(srv, NULL), -EINVAL);
    assert_int_equal(tern_pubsub_latency(srv, &lh), 0);
    assert_int_equal(lh.count, 0);
    assert_int_equal(lh.le_us[0], 50);
    assert_int_equal(lh.le_us[TERN_HISTOGRAM_BUCKETS - 1], 2500000);

    /* Redis */
    tern_redis_counters rc;
    assert_int_equal(tern_pubsub_redis_stats(NULL, &rc), -EINVAL);
    assert_int_equal(tern_pubsub_redis_stats(srv, NULL), -EINVAL);
    assert_int_equal(tern_pubsub_redis_stats(srv, &rc), -ENOENT);   /* no bridge */
    static const char *const bad_urls[] = {"", "http://127.0.0.1", "redis://", "redis://:6379",
                                           "redis://h:0", "redis://h:65536", "redis://h:x",
                                           "redis://h/x", "redis://h/-1", "redis://h/1/2",
                                           "redis://h:6379x"};
    assert_int_equal(tern_pubsub_redis(NULL, "redis://127.0.0.1"), -EINVAL);
    assert_int_equal(tern_pubsub_redis(srv, NULL), -EINVAL);
    for (size_t i = 0; i < sizeof(bad_urls) / sizeof(bad_urls[0]); i++)
        if (tern_pubsub_redis(srv, bad_urls[i]) != -EINVAL)
            fail_msg("Redis URL \"%s\" taken", bad_urls[i]);
    char url[300];
    memcpy(url, "redis://", 8);
    filled(url + 8, 280, 'h');
    assert_int_equal(tern_pubsub_redis(srv, url), -EINVAL);   /* host too long */

    /* publishing with no subscriber anywhere */
    assert_int_equal(tern_publish(NULL, "t", "x", 1, TERN_WS_TEXT), -EINVAL);
    assert_int_equal(tern_publish(srv, NULL, "x", 1, TERN_WS_TEXT), -EINVAL);
    assert_int_equal(tern_publish(srv, "", "x", 1, TERN_WS_TEXT), -EINVAL);
    assert_int_equal(tern_publish(srv, filled(name, TERN_TOPIC_MAX + 1, 't'), "x", 1, TERN_WS_TEXT),
                     -ENAMETOOLONG);
    assert_int_equal(tern_publish(srv, filled(name, TERN_TOPIC_MAX, 't'), "x", 1, TERN_WS_TEXT), 0);
    assert_int_equal(tern_publish(srv, "t", "x", 1, 0), -EINVAL);
    assert_int_equal(tern_publish(srv, "t", "x", 1, 9), -EINVAL);
    assert_int_equal(tern_publish(srv, "t", "x", 1, -1), -EINVAL);
    assert_int_equal(tern_publish(srv, "t", NULL, 5, TERN_WS_TEXT), -EINVAL);
    assert_int_equal(tern_publish(srv, "t", NULL, 0, TERN_WS_TEXT), 0);
    assert_int_equal(tern_publish_except(NULL, "t", "x", 1, TERN_WS_TEXT, NULL), -EINVAL);
    assert_int_equal(tern_publish_except(srv, "t", "x", 1, 9, NULL), -EINVAL);
    assert_int_equal(tern_publish_except(srv, "t", "x", 1, TERN_WS_TEXT, NULL), 0);
    assert_int_equal(tern_publish_ex(NULL, "t", "x", 1, TERN_WS_TEXT, NULL, SIZE_MAX), -EINVAL);
    assert_int_equal(tern_publish_ex(srv, "t", "x", 1, TERN_WS_TEXT, NULL, 2), -EINVAL);
    assert_int_equal(tern_publish_ex(srv, "t", "x", 1, TERN_WS_TEXT, NULL, SIZE_MAX - 1), -EINVAL);
    assert_int_equal(tern_publish_ex(srv, "t", "x", 1, TERN_WS_TEXT, NULL, 1), 0);
    assert_int_equal(tern_publish_key(NULL, "t", "k", "x", 1, TERN_WS_TEXT, SIZE_MAX), -EINVAL);
    assert_int_equal(tern_publish_key(srv, "t", "", "x", 1, TERN_WS_TEXT, SIZE_MAX), -EINVAL);
    assert_int_equal(tern_publish_key(srv, "t", filled(name, TERN_KEY_MAX + 1, 'k'), "x", 1,
                                      TERN_WS_TEXT, SIZE_MAX), -EINVAL);
    assert_int_equal(tern_publish_key(srv, "t", filled(name, TERN_KEY_MAX, 'k'), "x", 1,
                                      TERN_WS_TEXT, SIZE_MAX), 0);
    assert_int_equal(tern_publish_key(srv, "t", NULL, "x", 1, TERN_WS_TEXT, SIZE_MAX), 0);
    assert_int_equal(tern_publish_key(srv, "", "k", "x", 1, TERN_WS_TEXT, SIZE_MAX), -EINVAL);

    /* counting, with bad names */
    assert_int_equal(tern_topic_subscribers(NULL, "t"), 0);
    assert_int_equal(tern_topic_subscribers(srv, NULL), 0);
    assert_int_equal(tern_topic_subscribers(srv, ""), 0);
    assert_int_equal(tern_topic_subscribers(srv, filled(name, TERN_TOPIC_MAX + 1, 't')), 0);
    assert_int_equal(tern_topic_subscribers_all(NULL, "t"), 0);
    assert_int_equal(tern_topic_subscribers_all(srv, NULL), 0);
    assert_int_equal(tern_topic_subscribers_all(srv, ""), 0);
    assert_int_equal(tern_topic_subscribers_all(srv, filled(name, TERN_TOPIC_MAX + 1, 't')), 0);
    assert_int_equal(tern_topic_dropped(NULL, "t"), 0);
    assert_int_equal(tern_topic_dropped(srv, NULL), 0);
    assert_int_equal(tern_topic_dropped(srv, ""), 0);
    assert_int_equal(tern_topic_dropped(srv, filled(name, TERN_TOPIC_MAX + 1, 't')), 0);

    /* Pub/sub was used: the configuration is fixed. */
    assert_int_equal(tern_pubsub_configure(srv, &(tern_pubsub_options){0}), -EBUSY);
    assert_int_equal(tern_pubsub_topic_rule(srv, "z.", &to), -EBUSY);

    /* A Redis URL that is good (nobody there: retried in the loop), then
     * a second bridge. */
    assert_int_equal(tern_pubsub_redis(srv, "redis://127.0.0.1:1/0"), 0);
    assert_int_equal(tern_pubsub_redis(srv, "redis://127.0.0.1:1/0"), -EALREADY);
    assert_int_equal(tern_pubsub_redis_stats(srv, &rc), 0);
    assert_false(rc.connected);
    tern_server_free(srv);

    /* A clone shares the configuration: fixed as well. */
    assert_int_equal(tern_server_new(&srv, loop, NULL), 0);
    assert_int_equal(tern_server_clone(&clone, loop, srv), 0);
    assert_int_equal(tern_pubsub_configure(srv, &(tern_pubsub_options){0}), -EBUSY);
    assert_int_equal(tern_pubsub_topic_rule(clone, "z.", &to), -EBUSY);
    tern_server_free(clone);
    tern_server_free(srv);
    tern_loop_free(loop);
}

/* ---- on a live WebSocket ------------------------------------------------ */

#define MAX_SUBS 4

static struct {
    tern_server *srv;
    tern_ws *held;   /* the server's ws, referenced */
    int closes;      /* on_close of both ends: the loop stops at 2 */
    const char *fail;
    /* server side, on_open */
    int sub_null_ws, sub_null_topic, sub_empty, sub_long, sub_max, sub_ok, sub_again, sub_full;
    int from_null, from_odd, from_long, latest_null, latest_long, latest_again;
    tern_resume resume;
    int unsub_null_ws, unsub_null_topic, unsub_empty, unsub_long, unsub_absent, unsub_ok,
        unsub_again;
    int deadline_zero, deadline_max, deadline_clear;
    int64_t pub_empty_at0, pub_key_at0, pub_except;
    /* server side, on_message after its own close */
    int closed_sub, closed_from, closed_deadline;
    bool closed_open;
    /* server side, on_close */
    int onclose_sub, onclose_unsub;
    bool onclose_subscribed;
    /* client side */
    int cli_sub, cli_from, cli_unsub;
    bool cli_subscribed;
    tern_server *cli_server;
} S;

#define CHECK(cond, what)                                                                          \
    do {                                                                                           \
        if (!(cond) && S.fail == NULL)                                                             \
            S.fail = (what);                                                                       \
    } while (0)

static void srv_open(tern_ws *ws, void *user) {
    char name[300];
    tern_ws_ref(NULL);
    tern_ws_unref(NULL);
    tern_ws_ref(ws);
    S.held = ws;
    CHECK(tern_ws_server(NULL) == NULL, "tern_ws_server(NULL)");
    CHECK(tern_ws_server(ws) == S.srv, "tern_ws_server(ws) is not its server");
    CHECK(!tern_ws_is_open(NULL), "tern_ws_is_open(NULL)");
    CHECK(tern_ws_is_open(ws), "not open in on_open");

    /* subscribe */
    S.sub_null_ws = tern_ws_subscribe(NULL, "t");
    S.sub_null_topic = tern_ws_subscribe(ws, NULL);
    S.sub_empty = tern_ws_subscribe(ws, "");
    S.sub_long = tern_ws_subscribe(ws, filled(name, TERN_TOPIC_MAX + 1, 't'));
    S.sub_max = tern_ws_subscribe(ws, filled(name, TERN_TOPIC_MAX, 't'));
    S.sub_ok = tern_ws_subscribe(ws, "t");
    S.sub_again = tern_ws_subscribe(ws, "t");
    S.from_null = tern_ws_subscribe_from(NULL, "u", 1, 1, &S.resume);
    S.from_long = tern_ws_subscribe_from(ws, filled(name, TERN_TOPIC_MAX + 1, 'u'), 1, 1, NULL);
    S.latest_null = tern_ws_subscribe_latest(NULL, "u", NULL);
    S.latest_long = tern_ws_subscribe_latest(ws, filled(name, TERN_TOPIC_MAX + 1, 'u'), NULL);
    S.latest_again = tern_ws_subscribe_latest(ws, "t", NULL);
    /* An epoch nobody has and the last seq there is: told it is not a
     * resume. */
    memset(&S.resume, 0xff, sizeof(S.resume));
    S.from_odd = tern_ws_subscribe_from(ws, "u", UINT64_MAX, UINT64_MAX, &S.resume);
    CHECK(tern_ws_subscribe(ws, "v") == 0, "a fourth subscription refused");
    S.sub_full = tern_ws_subscribe(ws, "w");   /* max_subscriptions */

    /* subscribed, dropped, conflated */
    CHECK(!tern_ws_subscribed(NULL, "t"), "tern_ws_subscribed(NULL)");
    CHECK(!tern_ws_subscribed(ws, NULL), "tern_ws_subscribed(ws, NULL)");
    CHECK(!tern_ws_subscribed(ws, ""), "tern_ws_subscribed(ws, \"\")");
    CHECK(!tern_ws_subscribed(ws, filled(name, TERN_TOPIC_MAX + 1, 't')),
          "tern_ws_subscribed with a name too long");
    CHECK(tern_ws_subscribed(ws, filled(name, TERN_TOPIC_MAX, 't')), "the longest name lost");
    CHECK(tern_ws_subscribed(ws, "t"), "not subscribed to t");
    CHECK(tern_ws_topic_dropped(NULL, "t") == 0 && tern_ws_topic_dropped(ws, NULL) == 0 &&
              tern_ws_topic_dropped(ws, "") == 0 && tern_ws_topic_dropped(ws, "nope") == 0,
          "tern_ws_topic_dropped with bad input");
    CHECK(tern_ws_topic_conflated(NULL, "t") == 0 && tern_ws_topic_conflated(ws, NULL) == 0 &&
              tern_ws_topic_conflated(ws, "") == 0 && tern_ws_topic_conflated(ws, "nope") == 0,
          "tern_ws_topic_conflated with bad input");
    CHECK(tern_topic_subscribers(S.srv, "t") == 1, "tern_topic_subscribers");
    CHECK(tern_topic_subscribers_all(S.srv, "t") == 1, "tern_topic_subscribers_all");

    /* Publishing to a subscriber: no data at all, the seq inserted at 0. */
    S.pub_empty_at0 = tern_publish_ex(S.srv, "t", NULL, 0, TERN_WS_TEXT, NULL, 0);
    S.pub_key_at0 = tern_publish_key(S.srv, "t", "k", NULL, 0, TERN_WS_BINARY, 0);
    S.pub_except = tern_publish_except(S.srv, "t", "x", 1, TERN_WS_TEXT, ws);

    /* unsubscribe */
    S.unsub_null_ws = tern_ws_unsubscribe(NULL, "t");
    S.unsub_null_topic = tern_ws_unsubscribe(ws, NULL);
    S.unsub_empty = tern_ws_unsubscribe(ws, "");
    S.unsub_long = tern_ws_unsubscribe(ws, filled(name, TERN_TOPIC_MAX + 1, 't'));
    S.unsub_absent = tern_ws_unsubscribe(ws, "nope");
    S.unsub_ok = tern_ws_unsubscribe(ws, "t");
    S.unsub_again = tern_ws_unsubscribe(ws, "t");

    /* deadlines: 0 clears, the largest is taken */
    S.deadline_zero = tern_ws_set_deadline(ws, 0);
    S.deadline_max = tern_ws_set_deadline(ws, UINT32_MAX);
    S.deadline_clear = tern_ws_set_deadline(ws, 0);
}

static void srv_message(tern_ws *ws, const char *data, size_t len, int opcode, void *user) {
    /* The client's "bye": close, then try what a closing ws refuses. */
    tern_ws_close(ws, 1000, NULL);
    S.closed_open = tern_ws_is_open(ws);
    S.closed_sub = tern_ws_subscribe(ws, "late");
    S.closed_from = tern_ws_subscribe_from(ws, "late", 1, 0, NULL);
    S.closed_deadline = tern_ws_set_deadline(ws, 100);
}

static void srv_close(tern_ws *ws, int code, const char *reason, size_t reason_len, void *user) {
    S.onclose_sub = tern_ws_subscribe(ws, "t");
    S.onclose_unsub = tern_ws_unsubscribe(ws, "v");
    S.onclose_subscribed = tern_ws_subscribed(ws, "v");   /* ended before on_close */
    if (++S.closes == 2)
        tern_loop_stop(tern_ws_loop(ws));
}

static void cli_open(tern_ws *ws, void *user) {
    /* Topics are a server's: a client's connection has none. */
    S.cli_server = tern_ws_server(ws);
    S.cli_sub = tern_ws_subscribe(ws, "t");
    S.cli_from = tern_ws_subscribe_from(ws, "t", 1, 1, NULL);
    S.cli_unsub = tern_ws_unsubscribe(ws, "t");
    S.cli_subscribed = tern_ws_subscribed(ws, "t");
    CHECK(tern_ws_topic_dropped(ws, "t") == 0 && tern_ws_topic_conflated(ws, "t") == 0,
          "a client's topic counters");
    tern_ws_send(ws, "bye", 3, TERN_WS_TEXT);
}

static void cli_close(tern_ws *ws, int code, const char *reason, size_t reason_len, void *user) {
    if (++S.closes == 2)
        tern_loop_stop(tern_ws_loop(ws));
}

static void cli_error(const tern_ws_connect_error *e, void *user) {
    S.fail = "the client could not connect";
    tern_loop_stop((tern_loop *)user);
}

static void give_up(tern_timer *t, void *user) {
    S.fail = "timed out";
    tern_loop_stop((tern_loop *)user);
}

static void ws_calls(void **state) {
    tern_loop *loop;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    memset(&S, 0, sizeof(S));
    assert_int_equal(tern_server_new(&S.srv, loop, NULL), 0);
    assert_int_equal(tern_pubsub_configure(S.srv, &(tern_pubsub_options){
                                                      .max_subscriptions = MAX_SUBS}), 0);
    tern_ws_handlers hs = {.on_open = srv_open, .on_message = srv_message, .on_close = srv_close};
    assert_int_equal(tern_ws_route(S.srv, "/ws", &hs, NULL, NULL), 0);
    assert_int_equal(tern_listen(S.srv, "127.0.0.1", 0, NULL), 0);
    char url[64];
    snprintf(url, sizeof(url), "ws://127.0.0.1:%d/ws", tern_server_port(S.srv));
    tern_ws_handlers hc = {.on_open = cli_open, .on_close = cli_close, .on_connect_error = cli_error};
    assert_int_equal(tern_ws_connect(loop, url, &hc, NULL, loop), 0);
    tern_timer *t;
    assert_int_equal(tern_timer_start(loop, &t, 10000, 0, give_up, loop), 0);
    assert_int_equal(tern_loop_run(loop), 0);
    tern_timer_stop(t);
    if (S.fail)
        fail_msg("%s", S.fail);
    assert_int_equal(S.closes, 2);

    assert_int_equal(S.sub_null_ws, -EINVAL);
    assert_int_equal(S.sub_null_topic, -EINVAL);
    assert_int_equal(S.sub_empty, -EINVAL);
    assert_int_equal(S.sub_long, -ENAMETOOLONG);
    assert_int_equal(S.sub_max, 0);
    assert_int_equal(S.sub_ok, 0);
    assert_int_equal(S.sub_again, -EALREADY);
    assert_int_equal(S.from_null, -EINVAL);
    assert_int_equal(S.from_long, -ENAMETOOLONG);
    assert_int_equal(S.latest_null, -EINVAL);
    assert_int_equal(S.latest_long, -ENAMETOOLONG);
    assert_int_equal(S.latest_again, -EALREADY);
    assert_int_equal(S.from_odd, 0);
    assert_false(S.resume.resumed);
    assert_int_equal(S.resume.replayed, 0);
    assert_true(S.resume.epoch != 0 && S.resume.epoch != UINT64_MAX);
    assert_int_equal(S.sub_full, -ENOSPC);
    assert_true(S.pub_empty_at0 >= 1);
    assert_true(S.pub_key_at0 > S.pub_empty_at0);
    assert_true(S.pub_except > S.pub_key_at0);
    assert_int_equal(S.unsub_null_ws, -EINVAL);
    assert_int_equal(S.unsub_null_topic, -EINVAL);
    assert_int_equal(S.unsub_empty, -EINVAL);
    assert_int_equal(S.unsub_long, -ENOENT);
    assert_int_equal(S.unsub_absent, -ENOENT);
    assert_int_equal(S.unsub_ok, 0);
    assert_int_equal(S.unsub_again, -ENOENT);
    assert_int_equal(S.deadline_zero, 0);
    assert_int_equal(S.deadline_max, 0);
    assert_int_equal(S.deadline_clear, 0);
    assert_false(S.closed_open);
    assert_int_equal(S.closed_sub, -EPIPE);
    assert_int_equal(S.closed_from, -EPIPE);
    assert_int_equal(S.closed_deadline, -EPIPE);
    assert_int_equal(S.onclose_sub, -EPIPE);
    assert_int_equal(S.onclose_unsub, -ENOENT);
    assert_false(S.onclose_subscribed);
    assert_null(S.cli_server);
    assert_int_equal(S.cli_sub, -EINVAL);
    assert_int_equal(S.cli_from, -EINVAL);
    assert_int_equal(S.cli_unsub, -ENOENT);
    assert_false(S.cli_subscribed);

    /* The reference outlives the connection: what a closed ws answers. */
    assert_false(tern_ws_is_open(S.held));
    assert_int_equal(tern_ws_set_deadline(S.held, 100), -EPIPE);
    assert_int_equal(tern_ws_send(S.held, "x", 1, TERN_WS_TEXT), -EPIPE);
    assert_null(tern_ws_user(S.held));
    /* Its subscriptions ended before on_close; none may start again
     * (while its server lives: after that, ws.h's list of what a closed
     * ws answers does not include these). */
    assert_int_equal(tern_ws_subscribe(S.held, "t"), -EPIPE);
    assert_int_equal(tern_ws_unsubscribe(S.held, "v"), -ENOENT);
    assert_false(tern_ws_subscribed(S.held, "v"));
    assert_int_equal(tern_ws_topic_dropped(S.held, "v"), 0);
    assert_int_equal(tern_topic_subscribers(S.srv, "t"), 0);
    assert_int_equal(tern_topic_subscribers_all(S.srv, "v"), 0);
    tern_server_free(S.srv);
    tern_ws_unref(S.held);   /* after its server is gone */
    tern_loop_free(loop);
}

/* The last reference may outlive the loop too. */
static void ref_outlives_loop(void **state) {
    tern_loop *loop;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    memset(&S, 0, sizeof(S));
    assert_int_equal(tern_server_new(&S.srv, loop, NULL), 0);
    assert_int_equal(tern_pubsub_configure(S.srv, &(tern_pubsub_options){
                                                      .max_subscriptions = MAX_SUBS}), 0);
    tern_ws_handlers hs = {.on_open = srv_open, .on_message = srv_message, .on_close = srv_close};
    assert_int_equal(tern_ws_route(S.srv, "/ws", &hs, NULL, NULL), 0);
    assert_int_equal(tern_listen(S.srv, "127.0.0.1", 0, NULL), 0);
    char url[64];
    snprintf(url, sizeof(url), "ws://127.0.0.1:%d/ws", tern_server_port(S.srv));
    tern_ws_handlers hc = {.on_open = cli_open, .on_close = cli_close, .on_connect_error = cli_error};
    assert_int_equal(tern_ws_connect(loop, url, &hc, NULL, loop), 0);
    tern_timer *t;
    assert_int_equal(tern_timer_start(loop, &t, 10000, 0, give_up, loop), 0);
    assert_int_equal(tern_loop_run(loop), 0);
    tern_timer_stop(t);
    if (S.fail)
        fail_msg("%s", S.fail);
    tern_server_free(S.srv);
    tern_loop_free(loop);
    assert_false(tern_ws_is_open(S.held));
    assert_int_equal(tern_ws_send(S.held, "x", 1, TERN_WS_TEXT), -EPIPE);
    assert_int_equal(tern_ws_set_deadline(S.held, 100), -EPIPE);
    tern_ws_unref(S.held);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(loop_and_reason),
        cmocka_unit_test(server_accessors),
        cmocka_unit_test(pubsub_setup_calls),
        cmocka_unit_test(ws_calls),
        cmocka_unit_test(ref_outlives_loop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
