/* tern_histogram_bucket and tern_histogram_quantile: the library's bounds
 * (Prometheus') and tern load's log-linear ones. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "tern/tern.h"

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
 * power of two in 64; the quantile is the bucket's middle, as its own
 * index computation gave before it used these calls. */
#define SUB 64u
#define NB ((40 - 6 + 1) * SUB)

static size_t loglinear_index(uint64_t v) {
    if (v < SUB)
        return (size_t)v;
    unsigned top = 63u - (unsigned)__builtin_clzll(v);
    unsigned shift = top - 6;
    return (size_t)(shift + 1) * SUB + (size_t)((v >> shift) - SUB);
}

static void loglinear_layout(void **state) {
    (void)state;
    static uint64_t le[NB];
    for (size_t i = 0; i < NB; i++) {
        uint64_t lo = i < SUB ? i : (uint64_t)(i % SUB + SUB) << (i / SUB - 1);
        uint64_t width = i < SUB ? 1 : 1ull << (i / SUB - 1);
        le[i] = lo + width - 1;
    }
    static const uint64_t vs[] = {0, 1, 63, 64, 65, 127, 128, 129, 1000, 4095, 4096, 12345,
                                  999999, 1000000, 123456789, (1ull << 40) - 1};
    for (size_t k = 0; k < sizeof(vs) / sizeof(vs[0]); k++)
        assert_int_equal(tern_histogram_bucket(le, NB, vs[k]), loglinear_index(vs[k]));
    static uint64_t counts[NB + 1];
    counts[loglinear_index(12345)] = 1;
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
