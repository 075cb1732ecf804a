/* The UTF-8 validator: fed in pieces at split points drawn from the
 * input, it ends in the same state as in one call, and both agree with a
 * decoder written the slow way.
 *
 * Input: two bytes that seed the split points, then the text. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ws/utf8.h"
#include "../common/utf8_reference.h"

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond))                                                                               \
            abort();                                                                               \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2)
        return 0;
    uint32_t seed = (uint32_t)data[0] << 8 | data[1];
    /* The text in an allocation of its own size: ASan sees any over-read
     * of the word-at-a-time ASCII path. */
    size_t n = size - 2;
    uint8_t *s = malloc(n ? n : 1);
    memcpy(s, data + 2, n);

    uint32_t one = TERN__UTF8_ACCEPT;
    bool one_ok = tern__utf8_feed(&one, s, n);
    int got = one_ok ? (tern__utf8_complete(one) ? 1 : -1) : 0;
    CHECK(got == utf8_reference(s, n));
    CHECK(tern__utf8_valid(s, n) == (got == 1));
    CHECK(one_ok == (one != TERN__UTF8_REJECT));

    uint32_t st = TERN__UTF8_ACCEPT;
    bool ok = true;
    size_t pos = 0;
    while (pos < n) {
        seed = seed * 1103515245u + 12345u;
        size_t k = (seed >> 16) % 40;   /* 0 included: empty pieces change nothing */
        if (k > n - pos)
            k = n - pos;
        uint8_t *piece = malloc(k ? k : 1);
        memcpy(piece, s + pos, k);
        bool r = tern__utf8_feed(&st, piece, k);
        free(piece);
        /* Once refused, always refused. */
        CHECK(ok || !r);
        ok = r;
        pos += k;
    }
    CHECK(ok == one_ok);
    CHECK(st == one);
    free(s);
    return 0;
}
