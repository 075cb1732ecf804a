/* The frame codec against RFC 6455 §5: header parsing and writing, the
 * rules a peer's frame must keep, close codes (§7.4), and masking (§5.3)
 * in every implementation the machine has. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "guard.h"
#include "ws/frame.h"
#include "ws/mask.h"

/* Parses with the header as the very last bytes before a guard page. */
static int parse(const uint8_t *buf, size_t len, bool require_mask, bool allow_rsv1,
                 tern__ws_header *h) {
    guard gp;
    uint8_t *g = (uint8_t *)guard_put(&gp, buf, len);
    int r = tern__ws_parse_header(g, len, require_mask, allow_rsv1, h);
    guard_free(&gp);
    return r;
}

/* Every proper prefix of a complete header asks for more; the whole one
 * (and the whole one with payload after it) gives its length. */
static void check_split(const uint8_t *buf, size_t hlen, bool require_mask, bool allow_rsv1) {
    tern__ws_header h;
    for (size_t k = 0; k < hlen; k++)
        assert_int_equal(parse(buf, k, require_mask, allow_rsv1, &h), 0);
    assert_int_equal(parse(buf, hlen, require_mask, allow_rsv1, &h), (int)hlen);
    uint8_t more[TERN__WS_MAX_HEADER + 8];
    memcpy(more, buf, hlen);
    memset(more + hlen, 0xAB, 8);
    assert_int_equal(parse(more, hlen + 8, require_mask, allow_rsv1, &h), (int)hlen);
}

/* A bad header fails on the whole, and each prefix either asks for more
 * or already fails: never a success, never a different answer. Once a
 * prefix fails, every longer one fails too. */
static void check_bad(const uint8_t *buf, size_t len, bool require_mask, bool allow_rsv1) {
    tern__ws_header h;
    assert_int_equal(parse(buf, len, require_mask, allow_rsv1, &h), -1002);
    bool failed = false;
    for (size_t k = 0; k <= len; k++) {
        int r = parse(buf, k, require_mask, allow_rsv1, &h);
        if (failed)
            assert_int_equal(r, -1002);
        else
            assert_true(r == 0 || r == -1002);
        failed = r == -1002;
    }
}

/* ---- RFC 6455 §5.7 examples ------------------------------------------- */

static void rfc_examples_parse(void **state) {
    tern__ws_header h;
    /* A single-frame unmasked text message, "Hello". */
    const uint8_t hello[] = {0x81, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f};
    assert_int_equal(parse(hello, sizeof(hello), false, false, &h), 2);
    assert_true(h.fin);
    assert_false(h.rsv1);
    assert_int_equal(h.opcode, TERN__WS_OP_TEXT);
    assert_false(h.masked);
    assert_int_equal(h.payload_len, 5);
    assert_memory_equal(hello + 2, "Hello", 5);

    /* The same, masked: what a server reads. */
    uint8_t masked[] = {0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58};
    assert_int_equal(parse(masked, sizeof(masked), true, false, &h), 6);
    assert_true(h.masked);
    assert_memory_equal(h.mask, "\x37\xfa\x21\x3d", 4);
    assert_int_equal(h.payload_len, 5);
    assert_int_equal(tern__ws_mask(masked + 6, 5, h.mask, 0), 1);
    assert_memory_equal(masked + 6, "Hello", 5);

    /* A fragmented unmasked text message: "Hel", then "lo". */
    const uint8_t frag1[] = {0x01, 0x03, 0x48, 0x65, 0x6c};
    const uint8_t frag2[] = {0x80, 0x02, 0x6c, 0x6f};
    assert_int_equal(parse(frag1, sizeof(frag1), false, false, &h), 2);
    assert_false(h.fin);
    assert_int_equal(h.opcode, TERN__WS_OP_TEXT);
    assert_int_equal(parse(frag2, sizeof(frag2), false, false, &h), 2);
    assert_true(h.fin);
    assert_int_equal(h.opcode, TERN__WS_OP_CONT);

    /* Unmasked ping, and a masked pong answering it. */
    const uint8_t ping[] = {0x89, 0x05, 0x48, 0x65, 0x6c, 0x6c, 0x6f};
    assert_int_equal(parse(ping, sizeof(ping), false, false, &h), 2);
    assert_int_equal(h.opcode, TERN__WS_OP_PING);
    uint8_t pong[] = {0x8a, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58};
    assert_int_equal(parse(pong, sizeof(pong), true, false, &h), 6);
    assert_int_equal(h.opcode, TERN__WS_OP_PONG);

    /* 256 bytes of binary in one unmasked frame; 64 KiB likewise. */
    const uint8_t b256[] = {0x82, 0x7E, 0x01, 0x00};
    assert_int_equal(parse(b256, sizeof(b256), false, false, &h), 4);
    assert_int_equal(h.payload_len, 256);
    const uint8_t b64k[] = {0x82, 0x7F, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00};
    assert_int_equal(parse(b64k, sizeof(b64k), false, false, &h), 10);
    assert_int_equal(h.payload_len, 65536);
}

/* ---- every length form ------------------------------------------------- */

static const uint64_t lengths[] = {
    0, 1, 125, 126, 127, 65535, 65536, 0xFFFFFFFFull, 0x100000000ull, 0x100000005ull,
    0x7FFFFFFFFFFFFFFFull,
};

static void length_forms(void **state) {
    const uint8_t key[4] = {1, 2, 3, 4};
    for (size_t i = 0; i < sizeof(lengths) / sizeof(lengths[0]); i++) {
        for (int m = 0; m < 2; m++) {
            uint8_t buf[TERN__WS_MAX_HEADER];
            size_t n = tern__ws_write_header(buf, true, false, TERN__WS_OP_BINARY, lengths[i],
                                             m ? key : NULL);
            size_t expect = (lengths[i] <= 125 ? 2 : lengths[i] <= 65535 ? 4 : 10) + (m ? 4 : 0);
            assert_int_equal(n, expect);
            tern__ws_header h;
            assert_int_equal(parse(buf, n, m, false, &h), (int)n);
            assert_int_equal(h.payload_len, lengths[i]);
            assert_int_equal(h.header_len, n);
            assert_int_equal(h.masked, m);
            if (m)
                assert_memory_equal(h.mask, key, 4);
            check_split(buf, n, m, false);
        }
    }
}

static void exact_length_bytes(void **state) {
    uint8_t buf[TERN__WS_MAX_HEADER];
    assert_int_equal(tern__ws_write_header(buf, true, false, TERN__WS_OP_TEXT, 125, NULL), 2);
    assert_memory_equal(buf, "\x81\x7d", 2);
    assert_int_equal(tern__ws_write_header(buf, true, false, TERN__WS_OP_TEXT, 126, NULL), 4);
    assert_memory_equal(buf, "\x81\x7e\x00\x7e", 4);
    assert_int_equal(tern__ws_write_header(buf, false, true, TERN__WS_OP_BINARY, 65535, NULL), 4);
    assert_memory_equal(buf, "\x42\x7e\xff\xff", 4);
    assert_int_equal(tern__ws_write_header(buf, true, false, TERN__WS_OP_BINARY, 65536, NULL), 10);
    assert_memory_equal(buf, "\x82\x7f\x00\x00\x00\x00\x00\x01\x00\x00", 10);
    assert_int_equal(
        tern__ws_write_header(buf, true, false, TERN__WS_OP_BINARY, 0x0102030405060708ull, NULL),
        10);
    assert_memory_equal(buf, "\x82\x7f\x01\x02\x03\x04\x05\x06\x07\x08", 10);
    const uint8_t key[4] = {0xde, 0xad, 0xbe, 0xef};
    assert_int_equal(tern__ws_write_header(buf, true, false, TERN__WS_OP_CLOSE, 2, key), 6);
    assert_memory_equal(buf, "\x88\x82\xde\xad\xbe\xef", 6);
}

/* §5.2 allows a length in a longer form than needed; so do we. */
static void non_minimal_lengths_accepted(void **state) {
    tern__ws_header h;
    const uint8_t l16[] = {0x82, 0x7E, 0x00, 0x05};
    assert_int_equal(parse(l16, sizeof(l16), false, false, &h), 4);
    assert_int_equal(h.payload_len, 5);
    const uint8_t l64[] = {0x82, 0x7F, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};
    assert_int_equal(parse(l64, sizeof(l64), false, false, &h), 10);
    assert_int_equal(h.payload_len, 65535);
    const uint8_t l64small[] = {0x81, 0x7F, 0, 0, 0, 0, 0, 0, 0, 3};
    assert_int_equal(parse(l64small, sizeof(l64small), false, false, &h), 10);
    assert_int_equal(h.payload_len, 3);
    /* A control frame's limit is on the length, not on its encoding. */
    const uint8_t ping16[] = {0x89, 0x7E, 0x00, 0x7D};
    assert_int_equal(parse(ping16, sizeof(ping16), false, false, &h), 4);
    assert_int_equal(h.payload_len, 125);
    const uint8_t close64[] = {0x88, 0xFF, 0, 0, 0, 0, 0, 0, 0, 2, 1, 2, 3, 4};
    assert_int_equal(parse(close64, sizeof(close64), true, false, &h), 14);
    assert_int_equal(h.payload_len, 2);
    check_split(close64, sizeof(close64), true, false);
}

/* ---- round trip -------------------------------------------------------- */

static void write_parse_round_trip(void **state) {
    static const uint8_t data_ops[] = {TERN__WS_OP_CONT, TERN__WS_OP_TEXT, TERN__WS_OP_BINARY};
    static const uint8_t ctl_ops[] = {TERN__WS_OP_CLOSE, TERN__WS_OP_PING, TERN__WS_OP_PONG};
    const uint8_t key[4] = {0x00, 0xff, 0x7f, 0x80};
    for (size_t i = 0; i < sizeof(lengths) / sizeof(lengths[0]); i++) {
        for (int o = 0; o < 3; o++) {
            for (int bits = 0; bits < 8; bits++) {
                bool fin = bits & 1, rsv1 = bits & 2, m = bits & 4;
                uint8_t op = data_ops[o];
                /* RSV1 belongs on the first frame of a message only. */
                if (rsv1 && op == TERN__WS_OP_CONT)
                    continue;
                uint8_t buf[TERN__WS_MAX_HEADER];
                size_t n = tern__ws_write_header(buf, fin, rsv1, op, lengths[i], m ? key : NULL);
                tern__ws_header h;
                memset(&h, 0x55, sizeof(h));
                assert_int_equal(parse(buf, n, false, true, &h), (int)n);
                assert_int_equal(h.fin, fin);
                assert_int_equal(h.rsv1, rsv1);
                assert_int_equal(h.opcode, op);
                assert_int_equal(h.masked, m);
                assert_int_equal(h.payload_len, lengths[i]);
                assert_int_equal(h.header_len, n);
                if (m)
                    assert_memory_equal(h.mask, key, 4);
            }
        }
    }
    for (int o = 0; o < 3; o++) {
        for (uint64_t len = 0; len <= 125; len++) {
            uint8_t buf[TERN__WS_MAX_HEADER];
            size_t n = tern__ws_write_header(buf, true, false, ctl_ops[o], len, key);
            tern__ws_header h;
            assert_int_equal(parse(buf, n, true, false, &h), (int)n);
            assert_int_equal(h.opcode, ctl_ops[o]);
            assert_int_equal(h.payload_len, len);
        }
    }
}

/* ---- what a peer must not send ----------------------------------------- */

static void unknown_opcodes(void **state) {
    static const uint8_t bad_ops[] = {3, 4, 5, 6, 7, 0xB, 0xC, 0xD, 0xE, 0xF};
    for (size_t i = 0; i < sizeof(bad_ops); i++) {
        const uint8_t f[] = {(uint8_t)(0x80 | bad_ops[i]), 0x80, 1, 2, 3, 4};
        check_bad(f, sizeof(f), true, true);
        check_bad(f, sizeof(f), false, false);
        /* Known from the first byte: no need to wait for the rest. */
        tern__ws_header h;
        assert_int_equal(parse(f, 1, true, true, &h), -1002);
    }
}

static void reserved_bits(void **state) {
    tern__ws_header h;
    /* RSV2 and RSV3: never, whatever was negotiated. */
    const uint8_t rsv2[] = {0x81 | 0x20, 0x80, 1, 2, 3, 4};
    const uint8_t rsv3[] = {0x81 | 0x10, 0x80, 1, 2, 3, 4};
    check_bad(rsv2, sizeof(rsv2), true, true);
    check_bad(rsv3, sizeof(rsv3), true, true);
    /* RSV1 on a data frame: only with permessage-deflate. */
    const uint8_t text_rsv1[] = {0xC1, 0x80, 1, 2, 3, 4};
    check_bad(text_rsv1, sizeof(text_rsv1), true, false);
    assert_int_equal(parse(text_rsv1, sizeof(text_rsv1), true, true, &h), 6);
    assert_true(h.rsv1);
    const uint8_t bin_rsv1_nofin[] = {0x42, 0x80, 1, 2, 3, 4};
    assert_int_equal(parse(bin_rsv1_nofin, sizeof(bin_rsv1_nofin), true, true, &h), 6);
    assert_true(h.rsv1);
    assert_false(h.fin);
    /* ... and never on a continuation (RFC 7692 §6) or control frame. */
    const uint8_t cont_rsv1[] = {0xC0, 0x80, 1, 2, 3, 4};
    check_bad(cont_rsv1, sizeof(cont_rsv1), true, true);
    static const uint8_t ctl[] = {TERN__WS_OP_CLOSE, TERN__WS_OP_PING, TERN__WS_OP_PONG};
    for (int i = 0; i < 3; i++) {
        const uint8_t f[] = {(uint8_t)(0xC0 | ctl[i]), 0x80, 1, 2, 3, 4};
        check_bad(f, sizeof(f), true, true);
    }
}

static void control_frame_rules(void **state) {
    static const uint8_t ctl[] = {TERN__WS_OP_CLOSE, TERN__WS_OP_PING, TERN__WS_OP_PONG};
    for (int i = 0; i < 3; i++) {
        /* Fragmented: FIN clear. */
        const uint8_t nofin[] = {ctl[i], 0x80, 1, 2, 3, 4};
        check_bad(nofin, sizeof(nofin), true, false);
        /* 126 bytes, in the 16-bit form. */
        const uint8_t l126[] = {(uint8_t)(0x80 | ctl[i]), 0xFE, 0x00, 0x7E, 1, 2, 3, 4};
        check_bad(l126, sizeof(l126), true, false);
        /* Large, in the 64-bit form. */
        const uint8_t l64[] = {(uint8_t)(0x80 | ctl[i]), 0xFF, 0, 0, 0, 0, 0, 1, 0, 0, 1, 2, 3, 4};
        check_bad(l64, sizeof(l64), true, false);
        /* 125 is the most allowed. */
        const uint8_t l125[] = {(uint8_t)(0x80 | ctl[i]), 0xFD, 1, 2, 3, 4};
        tern__ws_header h;
        assert_int_equal(parse(l125, sizeof(l125), true, false, &h), 6);
        assert_int_equal(h.payload_len, 125);
    }
}

static void length_top_bit(void **state) {
    const uint8_t f[] = {0x82, 0xFF, 0x80, 0, 0, 0, 0, 0, 0, 1, 1, 2, 3, 4};
    check_bad(f, sizeof(f), true, false);
    const uint8_t g[] = {0x82, 0x7F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};
    check_bad(g, sizeof(g), false, false);
    /* Found from its first length byte. */
    tern__ws_header h;
    assert_int_equal(parse(f, 3, true, false, &h), -1002);
}

static void unmasked_from_client(void **state) {
    const uint8_t f[] = {0x81, 0x05, 'H', 'e', 'l', 'l', 'o'};
    check_bad(f, sizeof(f), true, false);
    const uint8_t ping[] = {0x89, 0x00};
    check_bad(ping, sizeof(ping), true, false);
    /* Not required (the client side reading a server): accepted. */
    tern__ws_header h;
    assert_int_equal(parse(f, sizeof(f), false, false, &h), 2);
    assert_false(h.masked);
}

/* Every first byte and every second byte, checked against the rules
 * written out independently of the parser. */
static void every_first_two_bytes(void **state) {
    for (int b0 = 0; b0 < 256; b0++) {
        for (int b1 = 0; b1 < 256; b1++) {
            for (int flags = 0; flags < 4; flags++) {
                bool require_mask = flags & 1, allow_rsv1 = flags & 2;
                uint8_t f[TERN__WS_MAX_HEADER] = {(uint8_t)b0, (uint8_t)b1};
                /* Small extended lengths so control frames can pass. */
                memset(f + 2, 0, sizeof(f) - 2);
                int op = b0 & 0xF, len7 = b1 & 0x7F;
                bool fin = b0 & 0x80, rsv1 = b0 & 0x40, masked = b1 & 0x80;
                bool control = op >= 8;
                bool ok = (b0 & 0x30) == 0 && (op <= 2 || (op >= 8 && op <= 10)) &&
                          !(control && !fin) && !(require_mask && !masked) &&
                          !(rsv1 && (!allow_rsv1 || control || op == 0));
                size_t hl = 2 + (len7 == 126 ? 2 : len7 == 127 ? 8 : 0) + (masked ? 4 : 0);
                tern__ws_header h;
                int r = tern__ws_parse_header(f, hl, require_mask, allow_rsv1, &h);
                if (ok) {
                    assert_int_equal(r, (int)hl);
                    assert_int_equal(h.payload_len, len7 >= 126 ? 0 : len7);
                } else {
                    assert_int_equal(r, -1002);
                }
            }
        }
    }
}

/* ---- close codes ------------------------------------------------------- */

static void close_codes(void **state) {
    /* Autobahn 7.7.x: must be accepted. */
    static const unsigned good[] = {1000, 1001, 1002, 1003, 1007, 1008, 1009,
                                    1010, 1011, 3000, 3999, 4000, 4999};
    /* Autobahn 7.9.x: must be refused. */
    static const unsigned bad[] = {0, 999, 1004, 1005, 1006, 1016, 1100, 2000, 2999};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        assert_true(tern__ws_close_code_valid(good[i]));
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_false(tern__ws_close_code_valid(bad[i]));
    /* Registered with IANA since RFC 6455: service restart, try again
     * later, bad gateway. 1015 (TLS failure) is for reporting only. */
    assert_true(tern__ws_close_code_valid(1012));
    assert_true(tern__ws_close_code_valid(1013));
    assert_true(tern__ws_close_code_valid(1014));
    assert_false(tern__ws_close_code_valid(1015));
    /* The whole range, against the rule. */
    for (unsigned c = 0; c < 70000; c++) {
        bool expect = (c >= 1000 && c <= 1003) || (c >= 1007 && c <= 1014) ||
                      (c >= 3000 && c < 5000);
        assert_int_equal(tern__ws_close_code_valid(c), expect);
    }
    assert_false(tern__ws_close_code_valid(65535));
    assert_false(tern__ws_close_code_valid(4294967295u));
}

/* ---- masking ----------------------------------------------------------- */

static void mask_reference(uint8_t *d, size_t len, const uint8_t key[4], size_t phase) {
    for (size_t i = 0; i < len; i++)
        d[i] ^= key[(phase + i) % 4];
}

typedef struct variant {
    const char *name;
    tern__ws_mask_fn fn;
} variant;

static size_t dispatched(uint8_t *d, size_t len, const uint8_t key[4], size_t phase) {
    return tern__ws_mask(d, len, key, phase);
}

static size_t variants(variant *v) {
    size_t n = 0;
    v[n++] = (variant){"tern__ws_mask", dispatched};
    static const struct {
        const char *name;
        enum tern__ws_mask_kind kind;
    } kinds[] = {{"portable", TERN__WS_MASK_PORTABLE},
                 {"sse2", TERN__WS_MASK_SSE2},
                 {"avx2", TERN__WS_MASK_AVX2}};
    for (size_t i = 0; i < 3; i++) {
        tern__ws_mask_fn f = tern__ws_mask_variant(kinds[i].kind);
        if (f != NULL)
            v[n++] = (variant){kinds[i].name, f};
        else
            printf("# mask: no %s on this machine, not tested\n", kinds[i].name);
    }
    return n;
}

static void fill(uint8_t *d, size_t len, uint32_t seed) {
    for (size_t i = 0; i < len; i++) {
        seed = seed * 1103515245u + 12345u;
        d[i] = (uint8_t)(seed >> 16);
    }
}

/* Every length to 300 and from 1000 to 1100 (across the length from which
 * the wide variants align first), every key phase, every misalignment mod
 * 32 (which covers the alignment heads of the 8-, 16- and 32-byte loops):
 * the same bytes as the reference, nothing outside the range touched, and
 * the right phase back. */
static void mask_matches_reference(void **state) {
    variant v[4];
    size_t nv = variants(v);
    assert_non_null(tern__ws_mask_variant(TERN__WS_MASK_PORTABLE));
    const uint8_t key[4] = {0x12, 0x9a, 0xf0, 0x5c};
    enum { MAXLEN = 1100, SLACK = 64, SIZE = MAXLEN + 2 * SLACK };
    uint8_t *raw = aligned_alloc(64, (SIZE + 63) / 64 * 64);   /* C11: a multiple of the alignment */
    uint8_t pristine[SIZE], want[SIZE];
    fill(pristine, SIZE, 12345);
    for (size_t vi = 0; vi < nv; vi++) {
        for (size_t len = 0; len <= MAXLEN; len = len == 300 ? 1000 : len + 1) {
            for (size_t phase = 0; phase < 4; phase++) {
                for (size_t off = 0; off < 32; off++) {
                    memcpy(raw, pristine, SIZE);
                    memcpy(want, pristine, SIZE);
                    mask_reference(want + SLACK + off, len, key, phase);
                    /* A phase of 4 or more is taken mod 4. */
                    size_t given = phase + 4 * (off % 3);
                    size_t ph = v[vi].fn(raw + SLACK + off, len, key, given);
                    if (memcmp(raw, want, SIZE) != 0 || ph != (phase + len) % 4)
                        fail_msg("%s: len %zu phase %zu offset %zu", v[vi].name, len, phase, off);
                }
            }
        }
    }
    free(raw);
}

/* The client's copy-and-mask: for every length to 300 and misalignment of
 * either side, dst is src masked from phase 0, and nothing around dst or
 * in src is touched. */
static void mask_copy_matches_reference(void **state) {
    const uint8_t key[4] = {0x9e, 0x01, 0x7c, 0xd3};
    enum { MAXLEN = 300, SLACK = 16, SIZE = MAXLEN + 2 * SLACK };
    uint8_t src[SIZE], src_before[SIZE], dst[SIZE], want[SIZE];
    fill(src, SIZE, 777);
    memcpy(src_before, src, SIZE);
    for (size_t len = 0; len <= MAXLEN; len++) {
        for (size_t off = 0; off < 8; off++) {
            memset(dst, 0xEE, SIZE);
            memset(want, 0xEE, SIZE);
            memcpy(want + SLACK + off, src + SLACK + 7 - off, len);
            mask_reference(want + SLACK + off, len, key, 0);
            tern__ws_mask_copy(dst + SLACK + off, src + SLACK + 7 - off, len, key);
            if (memcmp(dst, want, SIZE) != 0 || memcmp(src, src_before, SIZE) != 0)
                fail_msg("len %zu offset %zu", len, off);
        }
    }
}

/* tern__ws_header_len says what tern__ws_write_header writes. */
static void header_len_matches_write_header(void **state) {
    const uint8_t key[4] = {1, 2, 3, 4};
    for (size_t i = 0; i < sizeof(lengths) / sizeof(lengths[0]); i++) {
        uint8_t buf[TERN__WS_MAX_HEADER];
        assert_int_equal(tern__ws_header_len(lengths[i], true),
                         tern__ws_write_header(buf, true, false, TERN__WS_OP_BINARY, lengths[i], key));
        assert_int_equal(tern__ws_header_len(lengths[i], false),
                         tern__ws_write_header(buf, true, false, TERN__WS_OP_BINARY, lengths[i], NULL));
    }
}

/* Masking at the very end of the mapping: no wide load may go past it. */
static void mask_stays_in_bounds(void **state) {
    variant v[4];
    size_t nv = variants(v);
    const uint8_t key[4] = {1, 2, 3, 4};
    for (size_t vi = 0; vi < nv; vi++) {
        for (size_t len = 0; len <= 200; len++) {
            uint8_t src[200];
            fill(src, len, (uint32_t)len);
            guard gp;
            uint8_t *g = (uint8_t *)guard_put(&gp, src, len);
            v[vi].fn(g, len, key, len % 4);
            mask_reference(g, len, key, len % 4);
            assert_memory_equal(g, src, len);
            guard_free(&gp);
        }
    }
}

/* A payload arriving in pieces: each piece masked from the phase the last
 * one returned gives the same bytes as one call over the whole. */
static void mask_piecewise(void **state) {
    variant v[4];
    size_t nv = variants(v);
    const uint8_t key[4] = {0xa1, 0xb2, 0xc3, 0xd4};
    enum { LEN = 300 };
    uint8_t orig[LEN], want[LEN], got[LEN];
    fill(orig, LEN, 7);
    memcpy(want, orig, LEN);
    mask_reference(want, LEN, key, 0);
    for (size_t vi = 0; vi < nv; vi++) {
        /* Two pieces, split everywhere. */
        for (size_t cut = 0; cut <= LEN; cut++) {
            memcpy(got, orig, LEN);
            size_t ph = v[vi].fn(got, cut, key, 0);
            assert_int_equal(ph, cut % 4);
            ph = v[vi].fn(got + cut, LEN - cut, key, ph);
            assert_int_equal(ph, LEN % 4);
            assert_memory_equal(got, want, LEN);
        }
        /* Many pieces of varied sizes. */
        for (uint32_t seed = 1; seed < 200; seed++) {
            memcpy(got, orig, LEN);
            size_t pos = 0, ph = 0;
            uint32_t s = seed;
            while (pos < LEN) {
                s = s * 1103515245u + 12345u;
                size_t n = (s >> 16) % 70;
                if (n > LEN - pos)
                    n = LEN - pos;
                ph = v[vi].fn(got + pos, n, key, ph);
                pos += n;
            }
            assert_int_equal(ph, LEN % 4);
            assert_memory_equal(got, want, LEN);
        }
    }
}

/* A big buffer through the dispatcher: masking twice is the identity. */
static void mask_large_involution(void **state) {
    size_t len = (1u << 20) + 13;
    uint8_t *a = malloc(len), *b = malloc(len);
    fill(a, len, 99);
    memcpy(b, a, len);
    const uint8_t key[4] = {0xff, 0x00, 0x55, 0xaa};
    assert_int_equal(tern__ws_mask(b + 1, len - 1, key, 3), (3 + len - 1) % 4);
    assert_memory_not_equal(a + 1, b + 1, 64);
    tern__ws_mask(b + 1, len - 1, key, 3);
    assert_memory_equal(a, b, len);
    free(a);
    free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(rfc_examples_parse),
        cmocka_unit_test(length_forms),
        cmocka_unit_test(exact_length_bytes),
        cmocka_unit_test(non_minimal_lengths_accepted),
        cmocka_unit_test(write_parse_round_trip),
        cmocka_unit_test(unknown_opcodes),
        cmocka_unit_test(reserved_bits),
        cmocka_unit_test(control_frame_rules),
        cmocka_unit_test(length_top_bit),
        cmocka_unit_test(unmasked_from_client),
        cmocka_unit_test(every_first_two_bytes),
        cmocka_unit_test(close_codes),
        cmocka_unit_test(mask_matches_reference),
        cmocka_unit_test(mask_stays_in_bounds),
        cmocka_unit_test(mask_piecewise),
        cmocka_unit_test(mask_large_involution),
        cmocka_unit_test(mask_copy_matches_reference),
        cmocka_unit_test(header_len_matches_write_header),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
