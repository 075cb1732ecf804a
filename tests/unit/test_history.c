/* A topic's history (src/pubsub/history.c): the ring keeps the last
 * messages in seq order within its count and age limits, hands out
 * references to exactly the messages after a point, and keeps the latest
 * message of each key, in seq order; every reference it took is given
 * back (ASan's leak check says so). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pubsub/history.h"
#include "tern/tern.h"
#include "ws/ws.h"

/* A message whose payload is its seq in decimal (a small unmasked text
 * frame: 2 bytes of header, then the payload). */
static tern_ws_prepared *msg(uint64_t seq) {
    char b[24];
    int n = snprintf(b, sizeof(b), "%llu", (unsigned long long)seq);
    return tern_ws_prepare(b, (size_t)n, TERN_WS_TEXT, false);
}

/* The seq a message was made with. */
static uint64_t seq_of(tern_ws_prepared *m) {
    tern_ws_prepared *copy = tern__ws_prepared_ref(m);
    size_t len = tern__ws_prepared_len(copy);
    /* the frame is header + digits; the digits count is len - 2 */
    char digits[24] = {0};
    memcpy(digits, (const char *)tern__ws_prepared_bytes(copy) + 2, len - 2);
    tern_ws_prepared_free(copy);
    return strtoull(digits, NULL, 10);
}

/* Every history of a test counts its bytes here; each test ends at 0. */
static size_t total;

static void add(tern__hist *h, uint64_t seq, uint64_t ms, const char *key) {
    tern_ws_prepared *m = msg(seq);
    assert_int_equal(tern__hist_add(h, seq, ms, m, key, key ? strlen(key) : 0), 0);
    tern_ws_prepared_free(m);   /* the history holds its own reference */
}

static void expect_seqs(tern_ws_prepared **v, long n, const uint64_t *want, long nwant) {
    assert_int_equal(n, nwant);
    for (long i = 0; i < n; i++) {
        assert_int_equal(seq_of(v[i]), want[i]);
        tern_ws_prepared_free(v[i]);
    }
    free(v);
}

static void keeps_the_last_count_in_order(void **state) {
    (void)state;
    tern__hist *h = tern__hist_new(40, 0, &total);
    assert_non_null(h);
    assert_true(tern__hist_empty(h));
    assert_int_equal(tern__hist_first(h), 0);
    for (uint64_t s = 1; s <= 100; s++)   /* the ring grows (16, 32, 40), then wraps */
        add(h, s, 0, NULL);
    assert_int_equal(tern__hist_first(h), 61);
    assert_int_equal(tern__hist_last(h), 100);
    tern_ws_prepared **v;
    uint64_t want[] = {98, 99, 100};
    long n = tern__hist_since(h, 97, &v);
    expect_seqs(v, n, want, 3);
    n = tern__hist_since(h, 100, &v);
    assert_int_equal(n, 0);
    assert_null(v);
    n = tern__hist_since(h, 0, &v);   /* asking for more than is kept: what is kept */
    assert_int_equal(n, 40);
    assert_int_equal(seq_of(v[0]), 61);
    for (long i = 0; i < n; i++)
        tern_ws_prepared_free(v[i]);
    free(v);
    tern__hist_free(h);
}

static void forgets_by_age(void **state) {
    (void)state;
    tern__hist *h = tern__hist_new(1000, 500, &total);
    for (uint64_t s = 1; s <= 10; s++)
        add(h, s, s * 100, NULL);   /* published at 100 .. 1000 ms */
    tern__hist_prune(h, 1000);      /* older than 500 ms: 1 .. 4 */
    assert_int_equal(tern__hist_first(h), 5);
    tern__hist_prune(h, 10000);
    assert_true(tern__hist_empty(h));
    assert_int_equal(tern__hist_last(h), 0);
    tern__hist_free(h);
    /* no age limit: nothing goes by age */
    h = tern__hist_new(10, 0, &total);
    add(h, 1, 0, NULL);
    tern__hist_prune(h, UINT64_MAX);
    assert_int_equal(tern__hist_first(h), 1);
    tern__hist_free(h);
}

static void latest_per_key_in_seq_order(void **state) {
    (void)state;
    tern__hist *h = tern__hist_new(3, 0, &total);   /* the ring keeps 3; the keys outlive it */
    add(h, 1, 0, "a");
    add(h, 2, 0, "b");
    add(h, 3, 0, "a");
    add(h, 4, 0, "c");
    add(h, 5, 0, NULL);   /* keyless: under the empty key */
    add(h, 6, 0, "b");
    add(h, 7, 0, NULL);
    tern_ws_prepared **v;
    uint64_t want[] = {3, 4, 6, 7};   /* a, c, b, "" by their latest seq */
    long n = tern__hist_latest(h, &v);
    expect_seqs(v, n, want, 4);
    tern__hist_free(h);
    /* keys beyond TERN_CONFLATE_KEYS are not followed */
    h = tern__hist_new(1, 0, &total);
    char key[16];
    for (int i = 0; i < TERN_CONFLATE_KEYS + 10; i++) {
        snprintf(key, sizeof(key), "k%d", i);
        add(h, (uint64_t)i + 1, 0, key);
    }
    n = tern__hist_latest(h, &v);
    assert_int_equal(n, TERN_CONFLATE_KEYS);
    for (long i = 0; i < n; i++)
        tern_ws_prepared_free(v[i]);
    free(v);
    tern__hist_free(h);
}

/* The byte count: the ring's frames plus the keys' (a message in both
 * counted twice), every change reflected in the shared total; shedding
 * takes the oldest of the ring first, then the key with the oldest
 * latest, and the total returns to 0 when the histories go. */
static void counts_bytes_and_sheds_oldest_first(void **state) {
    (void)state;
    assert_int_equal(total, 0);
    tern__hist *h = tern__hist_new(3, 0, &total);
    tern__hist *other = tern__hist_new(8, 0, &total);
    add(other, 100, 0, NULL);   /* 5 bytes: header 2 + "100" */
    add(h, 1, 0, "a");          /* 3 bytes, in the ring and as a's latest */
    add(h, 2, 0, "b");
    assert_int_equal(tern__hist_bytes(h), 12);
    assert_int_equal(total, 12 + 10);
    add(h, 3, 0, "a");          /* a's latest replaced: 3 out, 3 in */
    add(h, 4, 0, "c");          /* the ring keeps 3: seq 1 leaves it */
    assert_int_equal(tern__hist_bytes(h), 3 * 3 + 3 * 3);
    assert_int_equal(tern__hist_shed(h), 3);   /* seq 2 from the ring */
    assert_int_equal(tern__hist_first(h), 3);
    assert_int_equal(tern__hist_shed(h), 3);
    assert_int_equal(tern__hist_shed(h), 3);   /* the ring is empty now */
    assert_true(tern__hist_empty(h));
    tern_ws_prepared **v;
    uint64_t want_bc[] = {3, 4};   /* the key with the oldest latest (b: 2) goes first */
    assert_int_equal(tern__hist_shed(h), 3);
    long n = tern__hist_latest(h, &v);
    expect_seqs(v, n, want_bc, 2);
    assert_int_equal(tern__hist_shed(h), 3);
    assert_int_equal(tern__hist_shed(h), 3);
    assert_int_equal(tern__hist_shed(h), 0);   /* nothing left */
    assert_int_equal(tern__hist_bytes(h), 0);
    assert_int_equal(total, 10);
    add(h, 5, 0, "a");   /* the key table still works after the removals */
    add(h, 6, 0, "a");
    uint64_t want6[] = {6};
    n = tern__hist_latest(h, &v);
    expect_seqs(v, n, want6, 1);
    tern__hist_clear(other);
    assert_int_equal(total, tern__hist_bytes(h));
    tern__hist_free(h);
    tern__hist_free(other);
    assert_int_equal(total, 0);
}

/* Pages for operators: from a seq, either way, within a limit. */
static void pages_either_way(void **state) {
    (void)state;
    tern__hist *h = tern__hist_new(5, 0, &total);
    for (uint64_t s = 1; s <= 8; s++)   /* keeps 4..8 */
        add(h, s, 0, NULL);
    tern__hist_item it[8];
    struct { uint64_t from; bool newest; uint32_t max, n; uint64_t first; } cases[] = {
        {0, false, 8, 5, 4}, {6, false, 8, 3, 6}, {2, false, 2, 2, 4}, {9, false, 8, 0, 0},
        {0, true, 2, 2, 8},  {6, true, 8, 3, 6},  {3, true, 8, 0, 0},  {100, true, 1, 1, 8},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        uint32_t n = tern__hist_page(h, cases[c].from, cases[c].newest, it, cases[c].max);
        assert_int_equal(n, cases[c].n);
        for (uint32_t i = 0; i < n; i++) {
            uint64_t want = cases[c].newest ? cases[c].first - i : cases[c].first + i;
            assert_int_equal(it[i].seq, want);
            assert_int_equal(seq_of(it[i].msg), want);
            tern_ws_prepared_free(it[i].msg);
        }
    }
    tern__hist_free(h);
    assert_int_equal(total, 0);
}

static void insert(tern__hist *h, uint64_t seq, uint64_t ms, const char *key) {
    tern_ws_prepared *m = msg(seq);
    assert_int_equal(tern__hist_insert(h, seq, ms, m, key, key ? strlen(key) : 0), 0);
    tern_ws_prepared_free(m);
}

/* Messages read back from a broker (pubsub's bridge) go in before newer
 * ones already kept: the ring stays in seq order, a seq kept already is
 * not taken twice, the oldest of a full ring is not taken, a key's latest
 * stays the newest, times stay in order for the age limit, and what came
 * before a gap can be forgotten. */
static void inserts_older_messages_in_place(void **state) {
    (void)state;
    tern__hist *h = tern__hist_new(6, 1000, &total);
    assert_non_null(h);
    add(h, 10, 500, "k");
    add(h, 11, 600, NULL);
    for (uint64_t s = 7; s <= 9; s++)
        insert(h, s, 900, s == 8 ? "k" : NULL);
    insert(h, 9, 900, NULL);   /* kept already */
    tern_ws_prepared **v;
    uint64_t all[] = {7, 8, 9, 10, 11};
    expect_seqs(v, tern__hist_since(h, 0, &v), all, 5);
    uint64_t latest[] = {10, 11};   /* k's stays 10, not the older 8 */
    expect_seqs(v, tern__hist_latest(h, &v), latest, 2);
    insert(h, 6, 900, NULL);   /* the ring's 6th */
    insert(h, 5, 900, NULL);   /* the oldest of a full ring: not kept */
    assert_int_equal(tern__hist_first(h), 6);
    add(h, 12, 700, NULL);     /* a full ring: 6 goes */
    assert_int_equal(tern__hist_first(h), 7);
    /* the read-back took the time of the message after it (500): the
     * age limit takes it with those, not 400 ms later */
    tern__hist_prune(h, 1550);
    assert_int_equal(tern__hist_first(h), 11);
    tern__hist_forget_before(h, 12);
    assert_int_equal(tern__hist_first(h), 12);
    assert_int_equal(tern__hist_last(h), 12);
    tern__hist_free(h);
    assert_int_equal(total, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(keeps_the_last_count_in_order),
        cmocka_unit_test(forgets_by_age),
        cmocka_unit_test(latest_per_key_in_seq_order),
        cmocka_unit_test(counts_bytes_and_sheds_oldest_first),
        cmocka_unit_test(pages_either_way),
        cmocka_unit_test(inserts_older_messages_in_place),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
