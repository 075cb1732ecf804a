/* tern serve's presence store (src/app/presence.c): counts kept as
 * entries come and go, users counted once per topic, lists in join order
 * and bounded, the tables grown past their first size. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/presence.h"

static void counts(const char *topic, size_t clients, size_t users) {
    app_presence_stats st;
    app_presence_stats_get(topic, strlen(topic), &st);
    assert_int_equal(st.clients, clients);
    assert_int_equal(st.users, users);
}

static void list_is(const char *topic, size_t limit, const char *want) {
    size_t len;
    app_presence_stats st;
    char *got = app_presence_list(topic, strlen(topic), limit, &len, &st);
    assert_non_null(got);
    assert_int_equal(len, strlen(got));
    assert_string_equal(got, want);
    free(got);
}

static void one_topic(void **state) {
    (void)state;
    app_presence *a1, *a2, *b;
    static const char info[] = "{\"n\":1}";
    assert_int_equal(app_presence_join("room", 4, 1, "alice", info, &a1), 0);
    assert_int_equal(app_presence_join("room", 4, 2, "alice", NULL, &a2), 0);
    assert_int_equal(app_presence_join("room", 4, 0xabc, "b\"ob", NULL, &b), 0);
    counts("room", 3, 2);
    counts("other", 0, 0);
    list_is("room", 10,
            "{\"client\":\"0000000000000001\",\"user\":\"alice\",\"info\":{\"n\":1}},"
            "{\"client\":\"0000000000000002\",\"user\":\"alice\"},"
            "{\"client\":\"0000000000000abc\",\"user\":\"b\\\"ob\"}");
    list_is("room", 1, "{\"client\":\"0000000000000001\",\"user\":\"alice\",\"info\":{\"n\":1}}");
    list_is("other", 10, "");
    app_presence_leave(a2);   /* from the middle of the list */
    counts("room", 2, 2);
    app_presence_leave(a1);   /* alice's last: one user fewer */
    counts("room", 1, 1);
    list_is("room", 10, "{\"client\":\"0000000000000abc\",\"user\":\"b\\\"ob\"}");
    app_presence_leave(b);
    counts("room", 0, 0);
    list_is("room", 10, "");
    app_presence_leave(NULL);
}

/* 200 topics of 30 clients among 7 users each: past the tables' first
 * 64 buckets many times; left in another order than joined. */
static void many(void **state) {
    (void)state;
    enum { TOPICS = 200, EACH = 30 };
    app_presence **e = calloc(TOPICS * EACH, sizeof(*e));
    assert_non_null(e);
    char topic[32], user[32];
    for (int i = 0; i < TOPICS * EACH; i++) {
        int n = snprintf(topic, sizeof(topic), "t%d", i % TOPICS);
        snprintf(user, sizeof(user), "u%d", i % 7);
        assert_int_equal(app_presence_join(topic, (size_t)n, (uint64_t)i, user, NULL, &e[i]), 0);
    }
    for (int t = 0; t < TOPICS; t++) {
        snprintf(topic, sizeof(topic), "t%d", t);
        counts(topic, EACH, 7);
    }
    /* Every topic's odd rounds of joins, the latest first; its users
     * (i % 7 over the even rounds) are all still there. */
    for (int i = TOPICS * EACH - 1; i >= 0; i--)
        if (i / TOPICS % 2)
            app_presence_leave(e[i]);
    for (int t = 0; t < TOPICS; t++) {
        snprintf(topic, sizeof(topic), "t%d", t);
        counts(topic, EACH / 2, 7);
    }
    for (int i = 0; i < TOPICS * EACH; i++)
        if (i / TOPICS % 2 == 0)
            app_presence_leave(e[i]);
    for (int t = 0; t < TOPICS; t++) {
        snprintf(topic, sizeof(topic), "t%d", t);
        counts(topic, 0, 0);
    }
    free(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(one_topic),
        cmocka_unit_test(many),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
