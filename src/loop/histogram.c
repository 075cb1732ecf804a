/* tern_histogram_bucket and tern_histogram_quantile (tern/http.h): the
 * one histogram logic of tern; the counts are the caller's (the library's
 * per-loop atomics, tern load's plain array). */
#include <stddef.h>
#include <stdint.h>

#include "tern/http.h"

size_t tern_histogram_bucket(const uint64_t *le, size_t n, uint64_t v) {
    /* The first bound at or over v: [lo, hi) holds it while it is unknown. */
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (v <= le[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

uint64_t tern_histogram_quantile(const uint64_t *le, const uint64_t *counts, size_t n, double q) {
    uint64_t total = 0;
    for (size_t i = 0; i <= n; i++)
        total += counts[i];
    if (total == 0)
        return 0;
    /* The rank of the value wanted: ceil(q * total), at least 1. */
    double want = q * (double)total;
    uint64_t rank = (uint64_t)want;
    if ((double)rank < want)
        rank++;
    if (rank == 0)
        rank = 1;
    uint64_t seen = 0;
    size_t i = 0;
    for (; i < n; i++) {
        seen += counts[i];
        if (seen >= rank)
            break;
    }
    if (i == n)
        return UINT64_MAX;
    uint64_t lo = i == 0 ? 0 : le[i - 1] + 1;
    return lo + (le[i] - lo + 1) / 2;
}
