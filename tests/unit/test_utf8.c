/* Incremental UTF-8 validation against RFC 3629 (and Autobahn's case 6
 * families): valid forms at every boundary, every invalid class, splits at
 * every position, and the ASCII fast path with a bad byte anywhere. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "guard.h"
#include "ws/utf8.h"
#include "../common/utf8_reference.h"

/* 1 valid, 0 invalid, -1 incomplete: what the validator says, one shot,
 * with the input right before a guard page. */
static int check(const uint8_t *s, size_t len) {
    guard gp;
    uint8_t *g = (uint8_t *)guard_put(&gp, s, len);
    uint32_t st = TERN__UTF8_ACCEPT;
    bool ok = tern__utf8_feed(&st, g, len);
    bool whole = tern__utf8_valid(g, len);
    guard_free(&gp);
    assert_int_equal(whole, ok && tern__utf8_complete(st));
    if (!ok) {
        assert_int_equal(st, TERN__UTF8_REJECT);
        return 0;
    }
    return tern__utf8_complete(st) ? 1 : -1;
}

#define S(lit) (const uint8_t *)(lit), sizeof(lit) - 1

static void valid_samples(void **state) {
    assert_int_equal(check(S("")), 1);
    assert_int_equal(check(S("Hello, world")), 1);
    assert_int_equal(check(S("\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5")), 1);   /* κόσμε */
    assert_int_equal(check(S("\x00")), 1);
    assert_int_equal(check(S("\x7f")), 1);
    assert_int_equal(check(S("\xc2\x80")), 1);           /* U+0080 */
    assert_int_equal(check(S("\xdf\xbf")), 1);           /* U+07FF */
    assert_int_equal(check(S("\xe0\xa0\x80")), 1);       /* U+0800 */
    assert_int_equal(check(S("\xed\x9f\xbf")), 1);       /* U+D7FF */
    assert_int_equal(check(S("\xee\x80\x80")), 1);       /* U+E000 */
    assert_int_equal(check(S("\xef\xbf\xbd")), 1);       /* U+FFFD */
    assert_int_equal(check(S("\xef\xbf\xbf")), 1);       /* U+FFFF */
    assert_int_equal(check(S("\xf0\x90\x80\x80")), 1);   /* U+10000 */
    assert_int_equal(check(S("\xf0\x9f\x98\x80")), 1);   /* U+1F600 */
    assert_int_equal(check(S("\xf3\xbf\xbf\xbf")), 1);   /* U+FFFFF */
    assert_int_equal(check(S("\xf4\x80\x80\x80")), 1);   /* U+100000 */
    assert_int_equal(check(S("\xf4\x8f\xbf\xbf")), 1);   /* U+10FFFF */
    /* Noncharacters are still valid UTF-8. */
    assert_int_equal(check(S("\xef\xb7\x90\xef\xbf\xbe")), 1);   /* U+FDD0 U+FFFE */
}

static void invalid_classes(void **state) {
    /* Overlong forms. */
    assert_int_equal(check(S("\xc0\x80")), 0);
    assert_int_equal(check(S("\xc1\xbf")), 0);
    assert_int_equal(check(S("\xe0\x80\x80")), 0);
    assert_int_equal(check(S("\xe0\x9f\xbf")), 0);
    assert_int_equal(check(S("\xf0\x80\x80\x80")), 0);
    assert_int_equal(check(S("\xf0\x8f\xbf\xbf")), 0);
    assert_int_equal(check(S("\xf8\x88\x80\x80\x80")), 0);   /* old 5-byte form */
    assert_int_equal(check(S("\xfc\x84\x80\x80\x80\x80")), 0);
    /* Surrogates, alone and paired. */
    assert_int_equal(check(S("\xed\xa0\x80")), 0);   /* U+D800 */
    assert_int_equal(check(S("\xed\xad\xbf")), 0);   /* U+DB7F */
    assert_int_equal(check(S("\xed\xb0\x80")), 0);   /* U+DC00 */
    assert_int_equal(check(S("\xed\xbf\xbf")), 0);   /* U+DFFF */
    assert_int_equal(check(S("\xed\xa0\x80\xed\xb0\x80")), 0);
    /* Above U+10FFFF. */
    assert_int_equal(check(S("\xf4\x90\x80\x80")), 0);
    assert_int_equal(check(S("\xf5\x80\x80\x80")), 0);
    assert_int_equal(check(S("\xf7\xbf\xbf\xbf")), 0);
    /* Bytes that never appear. */
    assert_int_equal(check(S("\xfe")), 0);
    assert_int_equal(check(S("\xff")), 0);
    assert_int_equal(check(S("\xc0")), 0);
    assert_int_equal(check(S("\xf5")), 0);
    /* Continuation bytes with no lead. */
    assert_int_equal(check(S("\x80")), 0);
    assert_int_equal(check(S("\xbf")), 0);
    assert_int_equal(check(S("a\x80")), 0);
    assert_int_equal(check(S("\xc3\xa9\xa9")), 0);
    /* A lead interrupted by something else. */
    assert_int_equal(check(S("\xc2\x41")), 0);
    assert_int_equal(check(S("\xe1\x80\x41")), 0);
    assert_int_equal(check(S("\xf1\x80\x80\x41")), 0);
    assert_int_equal(check(S("\xc2\xc2\x80")), 0);
    assert_int_equal(check(S("\xe1\xe1\x80\x80")), 0);
    /* Autobahn 6.3.1: valid up to the surrogate in the middle. */
    assert_int_equal(
        check(S("\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xed\xa0\x80\x65\x64\x69\x74\x65\x64")),
        0);
}

/* Every proper prefix of a valid multi-byte form is "valid so far", not
 * valid: feed returns true, complete is false. */
static void truncated_sequences(void **state) {
    static const char *const forms[] = {
        "\xc2\x80", "\xdf\xbf", "\xe0\xa0\x80", "\xe1\x80\x80", "\xed\x9f\xbf", "\xef\xbf\xbf",
        "\xf0\x90\x80\x80", "\xf1\x80\x80\x80", "\xf4\x8f\xbf\xbf",
    };
    for (size_t f = 0; f < sizeof(forms) / sizeof(forms[0]); f++) {
        size_t n = strlen(forms[f]);
        for (size_t k = 1; k < n; k++) {
            assert_int_equal(check((const uint8_t *)forms[f], k), -1);
            /* The same after a long ASCII run (the fast path). */
            uint8_t buf[64];
            memset(buf, 'x', 40);
            memcpy(buf + 40, forms[f], k);
            assert_int_equal(check(buf, 40 + k), -1);
        }
    }
    /* A prefix that no continuation could make valid fails at once. */
    assert_int_equal(check(S("\xe0\x80")), 0);
    assert_int_equal(check(S("\xed\xa0")), 0);
    assert_int_equal(check(S("\xf0\x80")), 0);
    assert_int_equal(check(S("\xf4\x90")), 0);
}

/* Every 1-, 2- and 3-byte input, against the independent decoder. */
static void exhaustive_short_inputs(void **state) {
    uint8_t b[3];
    for (unsigned x = 0; x < 256; x++) {
        b[0] = (uint8_t)x;
        uint32_t st = TERN__UTF8_ACCEPT;
        bool ok = tern__utf8_feed(&st, b, 1);
        int want = utf8_reference(b, 1);
        assert_int_equal(ok ? (tern__utf8_complete(st) ? 1 : -1) : 0, want);
        for (unsigned y = 0; y < 256; y++) {
            b[1] = (uint8_t)y;
            st = TERN__UTF8_ACCEPT;
            ok = tern__utf8_feed(&st, b, 2);
            want = utf8_reference(b, 2);
            if ((ok ? (tern__utf8_complete(st) ? 1 : -1) : 0) != want)
                fail_msg("%02x %02x: want %d", x, y, want);
            for (unsigned z = 0; z < 256; z++) {
                b[2] = (uint8_t)z;
                st = TERN__UTF8_ACCEPT;
                ok = tern__utf8_feed(&st, b, 3);
                want = utf8_reference(b, 3);
                if ((ok ? (tern__utf8_complete(st) ? 1 : -1) : 0) != want)
                    fail_msg("%02x %02x %02x: want %d", x, y, z, want);
            }
        }
    }
}

/* Four-byte inputs: every lead byte from F0 with each following byte drawn
 * from the edges of every class. */
static void four_byte_edges(void **state) {
    static const uint8_t edges[] = {0x00, 0x41, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0,
                                    0xbf, 0xc0, 0xc2, 0xdf, 0xe0, 0xed, 0xf0, 0xf4, 0xff};
    size_t ne = sizeof(edges);
    for (unsigned lead = 0xE0; lead < 256; lead++) {
        for (size_t i = 0; i < ne; i++)
            for (size_t j = 0; j < ne; j++)
                for (size_t k = 0; k < ne; k++) {
                    uint8_t b[4] = {(uint8_t)lead, edges[i], edges[j], edges[k]};
                    uint32_t st = TERN__UTF8_ACCEPT;
                    bool ok = tern__utf8_feed(&st, b, 4);
                    int got = ok ? (tern__utf8_complete(st) ? 1 : -1) : 0;
                    int want = utf8_reference(b, 4);
                    if (got != want)
                        fail_msg("%02x %02x %02x %02x: got %d want %d", b[0], b[1], b[2], b[3],
                                 got, want);
                }
    }
}

/* Fed in three pieces split at every pair of positions, the answer is the
 * one-shot answer, and so is the state at the end. */
static void split_everywhere(void **state) {
    static const char *const texts[] = {
        "Hello-\xc2\xb5@\xc3\x9f\xc3\xb6\xc3\xa4\xc3\xbc\xc3\xa0\xc3\xa1-UTF-8!!",
        "\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5 \xf0\x9f\x98\x80 abcdefghijklmnopq \xf4\x8f\xbf\xbf",
        "\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xed\xa0\x80\x65\x64\x69\x74\x65\x64",
        "plain ascii that is long enough to take the sixteen byte path twice over.....",
        "abc\xf0\x90\x80",            /* ends inside a code point */
        "abcdefghijklmnop\xc0\xaf",   /* overlong after a fast-path run */
    };
    for (size_t t = 0; t < sizeof(texts) / sizeof(texts[0]); t++) {
        const uint8_t *s = (const uint8_t *)texts[t];
        size_t n = strlen(texts[t]);
        uint32_t one = TERN__UTF8_ACCEPT;
        bool one_ok = tern__utf8_feed(&one, s, n);
        assert_int_equal(one_ok ? (tern__utf8_complete(one) ? 1 : -1) : 0, utf8_reference(s, n));
        for (size_t a = 0; a <= n; a++) {
            for (size_t b = a; b <= n; b++) {
                uint32_t st = TERN__UTF8_ACCEPT;
                bool ok = tern__utf8_feed(&st, s, a);
                ok = tern__utf8_feed(&st, s + a, b - a) && ok;
                ok = tern__utf8_feed(&st, s + b, n - b) && ok;
                assert_int_equal(ok, one_ok);
                assert_int_equal(st, one);
            }
        }
        /* And byte by byte. */
        uint32_t st = TERN__UTF8_ACCEPT;
        bool ok = true;
        for (size_t i = 0; i < n; i++)
            ok = tern__utf8_feed(&st, s + i, 1) && ok;
        assert_int_equal(ok, one_ok);
        assert_int_equal(st, one);
    }
}

/* ASCII runs long enough for the 16- and 8-byte steps, with one foreign
 * byte (or a valid two-byte form) at every offset. */
static void ascii_runs_with_one_bad_byte(void **state) {
    enum { LEN = 100 };
    uint8_t buf[LEN + 1];
    for (size_t off = 0; off < LEN; off++) {
        static const uint8_t bad[] = {0x80, 0xbf, 0xc0, 0xf5, 0xff};
        for (size_t b = 0; b < sizeof(bad); b++) {
            memset(buf, 'a' + (int)(off % 26), LEN);
            buf[off] = bad[b];
            assert_int_equal(check(buf, LEN), 0);
        }
        /* A truncated lead, then ASCII: bad as soon as the ASCII comes. */
        memset(buf, 'q', LEN);
        buf[off] = 0xc3;
        assert_int_equal(check(buf, LEN), off == LEN - 1 ? -1 : 0);
        /* A valid two-byte form anywhere. */
        memset(buf, 'z', LEN + 1);
        buf[off] = 0xc3;
        buf[off + 1] = 0xa9;
        assert_int_equal(check(buf, LEN + 1), 1);
    }
    /* Pure ASCII of every length to 100, at the end of a page. */
    memset(buf, 0x7f, LEN);
    for (size_t n = 0; n <= LEN; n++)
        assert_int_equal(check(buf, n), 1);
}

static void reject_is_sticky(void **state) {
    uint32_t st = TERN__UTF8_ACCEPT;
    assert_false(tern__utf8_feed(&st, S("\xff")));
    assert_int_equal(st, TERN__UTF8_REJECT);
    assert_false(tern__utf8_feed(&st, S("fine")));
    assert_false(tern__utf8_feed(&st, S("")));
    assert_false(tern__utf8_complete(st));
    /* A state the validator never made is refused, not indexed with. */
    st = 0xdeadbeef;
    assert_false(tern__utf8_feed(&st, S("a")));
    /* Empty input changes nothing. */
    st = TERN__UTF8_ACCEPT;
    assert_true(tern__utf8_feed(&st, S("\xe2\x82")));
    uint32_t mid = st;
    assert_true(tern__utf8_feed(&st, NULL, 0));
    assert_int_equal(st, mid);
    assert_true(tern__utf8_feed(&st, S("\xac")));   /* U+20AC */
    assert_true(tern__utf8_complete(st));
}

/* A long mixed text, fed in pieces of many sizes, agrees with one shot. */
static void long_mixed_text(void **state) {
    enum { LEN = 1 << 16 };
    uint8_t *s = malloc(LEN + 32);   /* the last part may run past LEN */
    size_t n = 0;
    uint32_t seed = 42;
    static const char *const parts[] = {"a", "hello world ", "\xc3\xa9", "\xe2\x82\xac",
                                        "\xf0\x9f\x98\x80", "0123456789abcdef0123456789"};
    while (n < LEN) {
        seed = seed * 1103515245u + 12345u;
        const char *p = parts[(seed >> 16) % 6];
        size_t pl = strlen(p);
        memcpy(s + n, p, pl);
        n += pl;
    }
    assert_true(tern__utf8_valid(s, n));
    for (uint32_t round = 0; round < 50; round++) {
        uint32_t st = TERN__UTF8_ACCEPT;
        size_t pos = 0;
        bool ok = true;
        while (pos < n) {
            seed = seed * 1103515245u + 12345u;
            size_t k = (seed >> 16) % 97;
            if (k > n - pos)
                k = n - pos;
            ok = tern__utf8_feed(&st, s + pos, k) && ok;
            pos += k;
        }
        assert_true(ok);
        assert_true(tern__utf8_complete(st));
    }
    /* One bad byte far in. */
    s[n / 2] = 0xff;
    assert_false(tern__utf8_valid(s, n));
    free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(valid_samples),
        cmocka_unit_test(invalid_classes),
        cmocka_unit_test(truncated_sequences),
        cmocka_unit_test(exhaustive_short_inputs),
        cmocka_unit_test(four_byte_edges),
        cmocka_unit_test(split_everywhere),
        cmocka_unit_test(ascii_runs_with_one_bad_byte),
        cmocka_unit_test(reject_is_sticky),
        cmocka_unit_test(long_mixed_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
