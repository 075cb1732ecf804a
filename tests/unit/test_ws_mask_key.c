/* The masking keys' generator (src/ws/mask_key.c, included for its static
 * functions): its side-by-side ChaCha20 blocks are RFC 8439's block
 * function, checked against the RFC's test vectors (Appendix A.1: the
 * zero key and nonce, counters 0 and 1), for every lane and group. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "ws/mask_key.c"

/* The first 16 bytes of the keystream block with counter 0, and 1. */
static const uint8_t block0[16] = {0x76, 0xb8, 0xe0, 0xad, 0xa0, 0xf1, 0x3d, 0x90,
                                   0x40, 0x5d, 0x6a, 0xe5, 0x53, 0x86, 0xbd, 0x28};
static const uint8_t block1[16] = {0x9f, 0x07, 0xe7, 0xbe, 0x55, 0x51, 0x38, 0x7a,
                                   0x98, 0xba, 0x97, 0x7c, 0x73, 0x2d, 0x08, 0x0d};

/* Lane l of out, as the block's bytes (little-endian words, RFC 8439 §2.3). */
static void lane_bytes(const mask_vec out[16], int l, uint8_t bytes[64]) {
    for (int w = 0; w < 16; w++) {
        uint32_t v = out[w][l];
        for (int i = 0; i < 4; i++)
            bytes[4 * w + i] = (uint8_t)(v >> (8 * i));
    }
}

static void the_lanes_are_rfc_8439_blocks(void **state) {
    uint32_t key[8] = {0};
    mask_vec out[16];
    uint8_t b[64];
    chacha_lanes(key, 0, out);
    lane_bytes(out, 0, b);
    assert_memory_equal(b, block0, 16);
    lane_bytes(out, 1, b);
    assert_memory_equal(b, block1, 16);
    /* A later group starts at its own counter: its lane 0 is block 4,
     * which is neither of the above, and lane 3 of the first group is it. */
    mask_vec later[16];
    uint8_t c[64];
    chacha_lanes(key, 4, later);
    lane_bytes(later, 0, c);
    assert_memory_not_equal(c, block0, 16);
    chacha_lanes(key, 1, out);   /* counters 1..4: lane 3 is block 4 */
    lane_bytes(out, 3, b);
    assert_memory_equal(b, c, 64);
    lane_bytes(out, 0, b);
    assert_memory_equal(b, block1, 16);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_lanes_are_rfc_8439_blocks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
