/* tern_histogram_bucket and tern_histogram_quantile: the library's bounds
 * (Prometheus') and tern load's log-linear ones. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "tern/tern.h"

#include "app/load.h"

static const uint64_t le15[TERN_HISTOGRAM_BUCKETS] = {
    50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000,
    1000000, 2500000};

static void buckets_by_upper_bound(void **state) {
    (void)state;
    assert_int_equal(tern_histogram_bucket(le15, 15, 0), 0);
    assert_int_equal(tern_histogram_bucket(le15, 15, 50), 0);   /* at most le[i] */
    assert_int_equal(tern_histogram_bucket(le15, 15, 51), 1);
    assert_int_equal(tern_histogram_bucket(le15, 15, 250), 2);
    assert_int_equal(tern_histogram_bucket(le15, 15, 2500000), 14);
    assert_int_equal(tern_histogram_bucket(le15, 15, 2500001), 15);   /* over them all */
    assert_int_equal(tern_histogram_bucket(le15, 15, UINT64_MAX), 15);
    assert_int_equal(tern_histogram_bucket(le15, 0, 7), 0);
    /* The linear scan it replaced, on every value near a bound. */
    for (size_t b = 0; b < 15; b++)
        for (uint64_t v = le15[b] - 1; v <= le15[b] + 1; v++) {
            size_t i = 0;
            while (i < 15 && v > le15[i])
                i++;
            assert_int_equal(tern_histogram_bucket(le15, 15, v), i);
        }
}

static void quantiles_are_bucket_middles(void **state) {
    (void)state;
    uint64_t counts[16] = {0};
    assert_int_equal(tern_histogram_quantile(le15, counts, 15, 0.5), 0);
    counts[0] = 1;    /* one value in [0, 50] */
    counts[2] = 98;   /* 98 in [101, 250] */
    counts[15] = 1;   /* one over 2.5 s */
    assert_int_equal(tern_histogram_quantile(le15, counts, 15, 0.01), 25);
    assert_int_equal(tern_histogram_quantile(le15, counts, 15, 0.5), 101 + 150 / 2);
    assert_int_equal(tern_histogram_quantile(le15, counts, 15, 0.99), 101 + 150 / 2);
    assert_true(tern_histogram_quantile(le15, counts, 15, 1.0) == UINT64_MAX);
}

/* tern load's layout (src/app/load.h): 64 one-wide buckets, then each
 * power of two in 64; its bucket computed (load_hist_bucket, recording's)
 * is the one the bounds give, and the quantile is the bucket's middle. */
#define NB LOAD_HIST_BUCKETS

static void loglinear_layout(void **state) {
    (void)state;
    static uint64_t le[NB];
    const uint64_t sub = LOAD_HIST_SUB;
    for (size_t i = 0; i < NB; i++) {
        uint64_t lo = i < sub ? i : (uint64_t)(i % sub + sub) << (i / sub - 1);
        uint64_t width = i < sub ? 1 : 1ull << (i / sub - 1);
        le[i] = lo + width - 1;
    }
    assert_int_equal(le[NB - 1], (1ull << LOAD_HIST_MAX_BITS) - 1);
    /* Every bucket's first and last value, and the next bucket's first. */
    for (size_t i = 0; i < NB; i++) {
        uint64_t first = i ? le[i - 1] + 1 : 0;
        assert_int_equal(load_hist_bucket(first), i);
        assert_int_equal(load_hist_bucket(le[i]), i);
        assert_int_equal(tern_histogram_bucket(le, NB, le[i]), i);
        assert_int_equal(load_hist_bucket(le[i] + 1), tern_histogram_bucket(le, NB, le[i] + 1));
    }
    assert_int_equal(load_hist_bucket(UINT64_MAX), NB);   /* over the last bound */
    static const uint64_t vs[] = {12345, 999999, 1000000, 123456789};
    for (size_t k = 0; k < sizeof(vs) / sizeof(vs[0]); k++)
        assert_int_equal(tern_histogram_bucket(le, NB, vs[k]), load_hist_bucket(vs[k]));
    static uint64_t counts[NB + 1];
    counts[load_hist_bucket(12345)] = 1;
    /* 12345 is in [12288, 12415], 128 wide: the middle is 12352. */
    assert_int_equal(tern_histogram_quantile(le, counts, NB, 0.5), 12352);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(buckets_by_upper_bound),
        cmocka_unit_test(quantiles_are_bucket_middles),
        cmocka_unit_test(loglinear_layout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
