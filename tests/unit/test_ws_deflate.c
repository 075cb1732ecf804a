/* permessage-deflate (RFC 7692): negotiation (§5, §7.1), compression and
 * decompression of messages (§7.2) with and without context takeover,
 * the RFC's own examples, and the message size limit against bombs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>

#include "guard.h"
#include "ws/deflate.h"

/* ---- negotiation ------------------------------------------------------- */

static const tern__pmd_config defaults = {.enabled = true};

typedef struct nego {
    int r;
    tern__pmd_params p;
    char resp[160];
} nego;

static nego negotiate_with(const char *offer, const tern__pmd_config *cfg) {
    nego n;
    memset(&n, 0, sizeof(n));
    size_t len = strlen(offer);
    guard gp;
    uint8_t *g = (uint8_t *)guard_put(&gp, offer, len);
    n.r = tern__pmd_negotiate((const char *)g, len, cfg, &n.p, n.resp, sizeof(n.resp));
    guard_free(&gp);
    return n;
}

static nego negotiate(const char *offer) { return negotiate_with(offer, &defaults); }

static void assert_params(const tern__pmd_params *p, bool snct, bool cnct, int sbits, int cbits) {
    assert_int_equal(p->server_no_context_takeover, snct);
    assert_int_equal(p->client_no_context_takeover, cnct);
    assert_int_equal(p->server_max_window_bits, sbits);
    assert_int_equal(p->client_max_window_bits, cbits);
}

static void negotiate_plain_offers(void **state) {
    nego n = negotiate("permessage-deflate");
    assert_int_equal(n.r, 1);
    assert_string_equal(n.resp, "permessage-deflate");
    assert_params(&n.p, false, false, 15, 15);

    /* What browsers send: a value-less client_max_window_bits is answered
     * with nothing, which leaves the client at 15. */
    n = negotiate("permessage-deflate; client_max_window_bits");
    assert_int_equal(n.r, 1);
    assert_string_equal(n.resp, "permessage-deflate");
    assert_params(&n.p, false, false, 15, 15);

    /* With a value, the client has promised it; we say it back. */
    n = negotiate("permessage-deflate; client_max_window_bits=10");
    assert_int_equal(n.r, 1);
    assert_string_equal(n.resp, "permessage-deflate; client_max_window_bits=10");
    assert_params(&n.p, false, false, 15, 10);

    n = negotiate("permessage-deflate; server_no_context_takeover; client_no_context_takeover");
    assert_int_equal(n.r, 1);
    assert_string_equal(n.resp,
                        "permessage-deflate; server_no_context_takeover; client_no_context_takeover");
    assert_params(&n.p, true, true, 15, 15);

    /* An offered server_max_window_bits is always answered (§7.1.2.1). */
    n = negotiate("permessage-deflate; server_max_window_bits=15");
    assert_int_equal(n.r, 1);
    assert_string_equal(n.resp, "permessage-deflate; server_max_window_bits=15");
    n = negotiate("permessage-deflate; server_max_window_bits=8");
    assert_int_equal(n.r, 1);
    assert_string_equal(n.resp, "permessage-deflate; server_max_window_bits=8");
    assert_params(&n.p, false, false, 8, 15);

    n = negotiate("permessage-deflate; client_max_window_bits=8; server_max_window_bits=9; "
                  "client_no_context_takeover; server_no_context_takeover");
    assert_int_equal(n.r, 1);
    assert_string_equal(n.resp,
                        "permessage-deflate; server_no_context_takeover; client_no_context_takeover; "
                        "server_max_window_bits=9; client_max_window_bits=8");
    assert_params(&n.p, true, true, 9, 8);
}

static void negotiate_with_config(void **state) {
    tern__pmd_config cfg = {.enabled = true, .server_no_context_takeover = true};
    nego n = negotiate_with("permessage-deflate", &cfg);
    assert_int_equal(n.r, 1);
    assert_string_equal(n.resp, "permessage-deflate; server_no_context_takeover");
    assert_params(&n.p, true, false, 15, 15);

    cfg = (tern__pmd_config){.enabled = true, .client_no_context_takeover = true};
    n = negotiate_with("permessage-deflate; client_max_window_bits", &cfg);
    assert_int_equal(n.r, 1);
    assert_string_equal(n.resp, "permessage-deflate; client_no_context_takeover");
    assert_params(&n.p, false, true, 15, 15);

    /* Our window: the smaller of ours and the client's limit. */
    cfg = (tern__pmd_config){.enabled = true, .server_max_window_bits = 12};
    n = negotiate_with("permessage-deflate", &cfg);
    assert_string_equal(n.resp, "permessage-deflate; server_max_window_bits=12");
    assert_int_equal(n.p.server_max_window_bits, 12);
    n = negotiate_with("permessage-deflate; server_max_window_bits=10", &cfg);
    assert_string_equal(n.resp, "permessage-deflate; server_max_window_bits=10");
    assert_int_equal(n.p.server_max_window_bits, 10);
    n = negotiate_with("permessage-deflate; server_max_window_bits=14", &cfg);
    assert_string_equal(n.resp, "permessage-deflate; server_max_window_bits=12");
    assert_int_equal(n.p.server_max_window_bits, 12);

    /* 0 means 15; out-of-range settings are brought into 8..15. */
    cfg = (tern__pmd_config){.enabled = true, .server_max_window_bits = 0};
    n = negotiate_with("permessage-deflate", &cfg);
    assert_string_equal(n.resp, "permessage-deflate");
    cfg.server_max_window_bits = 3;
    n = negotiate_with("permessage-deflate", &cfg);
    assert_string_equal(n.resp, "permessage-deflate; server_max_window_bits=8");

    /* Disabled: nothing is accepted. */
    cfg = (tern__pmd_config){.enabled = false};
    n = negotiate_with("permessage-deflate", &cfg);
    assert_int_equal(n.r, 0);
    assert_string_equal(n.resp, "");
}

static void negotiate_several_offers(void **state) {
    /* The first acceptable offer wins; bad ones are passed over. */
    nego n = negotiate("permessage-deflate; server_max_window_bits=7, "
                       "permessage-deflate; client_max_window_bits=12, permessage-deflate");
    assert_int_equal(n.r, 1);
    assert_string_equal(n.resp, "permessage-deflate; client_max_window_bits=12");

    n = negotiate("x-webkit-deflate-frame, permessage-deflate; server_no_context_takeover");
    assert_int_equal(n.r, 1);
    assert_string_equal(n.resp, "permessage-deflate; server_no_context_takeover");

    n = negotiate("permessage-deflate; foo, permessage-deflate; bar=1, permessage-deflate");
    assert_int_equal(n.r, 1);
    assert_string_equal(n.resp, "permessage-deflate");

    /* Other extensions' parameters, quoted or not, are theirs. */
    n = negotiate("foo; a=1; b=\"x, y\"; c, permessage-deflate; client_max_window_bits=9");
    assert_int_equal(n.r, 1);
    assert_string_equal(n.resp, "permessage-deflate; client_max_window_bits=9");

    /* A permessage-deflate inside another's quoted value is not an offer. */
    n = negotiate("foo; bar=\"x, permessage-deflate; server_max_window_bits=9\"");
    assert_int_equal(n.r, 0);

    /* None acceptable. */
    n = negotiate("permessage-deflate; server_max_window_bits, permessage-deflate; x=y");
    assert_int_equal(n.r, 0);
    assert_string_equal(n.resp, "");
    assert_int_equal(negotiate("").r, 0);
    assert_int_equal(negotiate("deflate-frame").r, 0);
    assert_int_equal(negotiate("permessage-deflater").r, 0);
    assert_int_equal(negotiate("permessage").r, 0);
}

static bool unclosed_quote(const char *s) {
    bool in = false;
    for (; *s; s++) {
        if (in && *s == '\\' && s[1])
            s++;
        else if (*s == '"')
            in = !in;
    }
    return in;
}

static void negotiate_bad_params(void **state) {
    static const char *const declined[] = {
        "permessage-deflate; unknown",
        "permessage-deflate; unknown=1",
        "permessage-deflate; server_no_context_takeover; server_no_context_takeover",
        "permessage-deflate; client_no_context_takeover; client_no_context_takeover",
        "permessage-deflate; server_no_context_takeover=1",
        "permessage-deflate; client_no_context_takeover=true",
        "permessage-deflate; server_max_window_bits",
        "permessage-deflate; server_max_window_bits=7",
        "permessage-deflate; server_max_window_bits=16",
        "permessage-deflate; server_max_window_bits=0",
        "permessage-deflate; server_max_window_bits=08",
        "permessage-deflate; server_max_window_bits=010",
        "permessage-deflate; server_max_window_bits=+9",
        "permessage-deflate; server_max_window_bits=1a",
        "permessage-deflate; server_max_window_bits=-9",
        "permessage-deflate; server_max_window_bits=\"\"",
        "permessage-deflate; server_max_window_bits=\"1 0\"",
        "permessage-deflate; server_max_window_bits=\"100000000000\"",
        "permessage-deflate; server_max_window_bits=10; server_max_window_bits=10",
        "permessage-deflate; client_max_window_bits=7",
        "permessage-deflate; client_max_window_bits=16",
        "permessage-deflate; client_max_window_bits=",
        "permessage-deflate; client_max_window_bits; client_max_window_bits",
        "permessage-deflate; client_max_window_bits=9; client_max_window_bits",
        /* Broken syntax. */
        "permessage-deflate;",
        "permessage-deflate; ;",
        "permessage-deflate x",
        "permessage-deflate; server_no_context_takeover x",
        "permessage-deflate; =1",
        "permessage-deflate; client_max_window_bits=\"10",
        "permessage-deflate; client_max_window_bits=\"10\\",
        "; permessage-deflate",
        "\"permessage-deflate\"",
    };
    for (size_t i = 0; i < sizeof(declined) / sizeof(declined[0]); i++) {
        nego n = negotiate(declined[i]);
        if (n.r != 0)
            fail_msg("accepted: %s", declined[i]);
        /* And a good offer after it is still found. */
        char both[256];
        snprintf(both, sizeof(both), "%s, permessage-deflate; client_max_window_bits=11",
                 declined[i]);
        n = negotiate(both);
        if (unclosed_quote(declined[i])) {   /* it eats the rest of the header */
            assert_int_equal(n.r, 0);
        } else if (n.r != 1 || strcmp(n.resp, "permessage-deflate; client_max_window_bits=11") != 0) {
            fail_msg("after %s: r=%d resp=%s", declined[i], n.r, n.resp);
        }
    }
}

static void negotiate_lenient_forms(void **state) {
    /* Names are tokens, compared without case; whitespace around the
     * separators is optional; a value may be a quoted string. */
    nego n = negotiate("PerMessage-Deflate; Server_No_Context_Takeover");
    assert_int_equal(n.r, 1);
    assert_string_equal(n.resp, "permessage-deflate; server_no_context_takeover");
    n = negotiate("  permessage-deflate\t;\tclient_max_window_bits = 12 ,");
    assert_int_equal(n.r, 1);
    assert_string_equal(n.resp, "permessage-deflate; client_max_window_bits=12");
    n = negotiate("permessage-deflate; client_max_window_bits=\"13\"");
    assert_int_equal(n.r, 1);
    assert_int_equal(n.p.client_max_window_bits, 13);
    n = negotiate("permessage-deflate; server_max_window_bits=\"1\\1\"");
    assert_int_equal(n.r, 1);
    assert_int_equal(n.p.server_max_window_bits, 11);
    n = negotiate(", ,permessage-deflate");
    assert_int_equal(n.r, 1);
}

static void negotiate_response_room(void **state) {
    const char *offer = "permessage-deflate; server_no_context_takeover";
    const char *want = "permessage-deflate; server_no_context_takeover";
    size_t need = strlen(want) + 1;
    char resp[64];
    tern__pmd_params p;
    assert_int_equal(tern__pmd_negotiate(offer, strlen(offer), &defaults, &p, resp, need), 1);
    assert_string_equal(resp, want);
    memset(resp, 'x', sizeof(resp));
    assert_int_equal(tern__pmd_negotiate(offer, strlen(offer), &defaults, &p, resp, need - 1),
                     -ENOSPC);
    assert_int_equal(resp[0], '\0');
    assert_int_equal(tern__pmd_negotiate(offer, strlen(offer), &defaults, &p, resp, 0), -ENOSPC);
    /* The longest answer fits the 160 bytes the server gives it. */
    nego n = negotiate("permessage-deflate; server_no_context_takeover; client_no_context_takeover; "
                       "server_max_window_bits=10; client_max_window_bits=10");
    assert_int_equal(n.r, 1);
    assert_true(strlen(n.resp) < 160);
}

/* The answer, read back as an offer, is accepted with the same result. */
static void negotiate_response_reparses(void **state) {
    static const char *const offers[] = {
        "permessage-deflate",
        "permessage-deflate; client_max_window_bits",
        "permessage-deflate; client_max_window_bits=9; server_max_window_bits=12",
        "permessage-deflate; server_no_context_takeover; client_no_context_takeover",
    };
    tern__pmd_config cfgs[] = {
        {.enabled = true},
        {.enabled = true, .server_no_context_takeover = true, .server_max_window_bits = 10},
        {.enabled = true, .client_no_context_takeover = true, .server_max_window_bits = 8},
    };
    for (size_t i = 0; i < sizeof(offers) / sizeof(offers[0]); i++) {
        for (size_t c = 0; c < sizeof(cfgs) / sizeof(cfgs[0]); c++) {
            nego a = negotiate_with(offers[i], &cfgs[c]);
            assert_int_equal(a.r, 1);
            nego b = negotiate_with(a.resp, &cfgs[c]);
            assert_int_equal(b.r, 1);
            assert_string_equal(a.resp, b.resp);
            assert_memory_equal(&a.p, &b.p, sizeof(a.p));
        }
    }
}

/* ---- compression ------------------------------------------------------- */

typedef tern__bytes msgbuf;

static void msgbuf_free(msgbuf *m) { tern__bytes_free(m); }

static int inflate_all(tern__pmd_inflater *inf, const uint8_t *in, size_t len, bool nct,
                       msgbuf *m, size_t max_len) {
    m->len = 0;
    return tern__pmd_inflate(inf, in, len, true, nct, m, max_len);
}

static void inflate_expect(tern__pmd_inflater *inf, const uint8_t *in, size_t len, bool nct,
                           const char *want) {
    msgbuf m = {0};
    guard gp;
    uint8_t *g = (uint8_t *)guard_put(&gp, in, len);
    assert_int_equal(inflate_all(inf, g, len, nct, &m, 1 << 20), 0);
    guard_free(&gp);
    assert_int_equal(m.len, strlen(want));
    assert_memory_equal(m.data, want, m.len);
    msgbuf_free(&m);
}

/* RFC 7692 §7.2.3: every example of the section. */
static void rfc7692_examples(void **state) {
    tern__pmd_inflater *inf = tern__pmd_inflater_new(15);
    assert_non_null(inf);
    /* §7.2.3.1 A message compressed. */
    static const uint8_t hello[] = {0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00};
    inflate_expect(inf, hello, sizeof(hello), true, "Hello");
    /* §7.2.3.2 Sharing the LZ77 window: the second "Hello" refers back. */
    static const uint8_t again[] = {0xf2, 0x00, 0x11, 0x00, 0x00};
    inflate_expect(inf, hello, sizeof(hello), false, "Hello");
    inflate_expect(inf, again, sizeof(again), false, "Hello");
    tern__pmd_inflater_free(inf);

    inf = tern__pmd_inflater_new(15);
    /* §7.2.3.3 A block with no compression. */
    static const uint8_t stored[] = {0x00, 0x05, 0x00, 0xfa, 0xff, 0x48,
                                     0x65, 0x6c, 0x6c, 0x6f, 0x00};
    inflate_expect(inf, stored, sizeof(stored), false, "Hello");
    /* §7.2.3.4 A block with BFINAL set, then an empty stored block's
     * header; and then, with context kept, a message referring back. */
    static const uint8_t bfinal[] = {0xf3, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00, 0x00};
    inflate_expect(inf, bfinal, sizeof(bfinal), false, "Hello");
    inflate_expect(inf, again, sizeof(again), false, "Hello");
    /* BFINAL with nothing after: the tail we add must not start a stream. */
    inflate_expect(inf, bfinal, sizeof(bfinal) - 1, false, "Hello");
    inflate_expect(inf, hello, sizeof(hello), false, "Hello");
    /* A final block in the middle of a message: the next stream still
     * sees the window (here, "Hello" again as a back-reference). */
    static const uint8_t mid[] = {0xf3, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00,
                                  0xf2, 0x00, 0x11, 0x00, 0x00};
    inflate_expect(inf, mid, sizeof(mid), false, "HelloHello");
    /* §7.2.3.5 Two blocks in one message. */
    static const uint8_t two[] = {0xf2, 0x48, 0x05, 0x00, 0x00, 0x00, 0xff,
                                  0xff, 0xca, 0xc9, 0xc9, 0x07, 0x00};
    inflate_expect(inf, two, sizeof(two), false, "Hello");
    tern__pmd_inflater_free(inf);
}

/* §7.2.3.6: an empty message is sent as 00; ours is, and it reads back
 * as empty, with or without context, and the context survives it. */
static void empty_messages(void **state) {
    tern__pmd_deflater *d = tern__pmd_deflater_new(15, 0);
    tern__pmd_inflater *inf = tern__pmd_inflater_new(15);
    uint8_t *out;
    ssize_t n = tern__pmd_deflate(d, (const uint8_t *)"", 0, false, &out);
    assert_int_equal(n, 1);
    assert_int_equal(out[0], 0x00);
    inflate_expect(inf, out, (size_t)n, false, "");
    free(out);
    n = tern__pmd_deflate(d, (const uint8_t *)"Hello", 5, false, &out);
    assert_true(n > 0);
    inflate_expect(inf, out, (size_t)n, false, "Hello");
    free(out);
    n = tern__pmd_deflate(d, (const uint8_t *)"", 0, false, &out);
    assert_int_equal(n, 1);
    inflate_expect(inf, out, (size_t)n, false, "");
    free(out);
    /* A zero-length compressed payload: nothing, and no harm done. */
    inflate_expect(inf, NULL, 0, false, "");
    n = tern__pmd_deflate(d, (const uint8_t *)"Hello", 5, false, &out);
    inflate_expect(inf, out, (size_t)n, false, "Hello");
    free(out);
    tern__pmd_deflater_free(d);
    tern__pmd_inflater_free(inf);
}

static uint8_t *make_text(size_t len, uint32_t seed) {
    static const char *const words[] = {"the ", "quick ", "brown ", "fox ", "jumps ",
                                        "over ", "lazy ", "dog ", "\xc3\xa9t\xc3\xa9 ", "42 "};
    uint8_t *s = malloc(len + 1);
    size_t n = 0;
    while (n < len) {
        seed = seed * 1103515245u + 12345u;
        const char *w = words[(seed >> 16) % 10];
        size_t wl = strlen(w);
        if (wl > len - n)
            wl = len - n;
        memcpy(s + n, w, wl);
        n += wl;
    }
    return s;
}

/* Several messages through one deflater and one inflater, for each
 * window size and both context modes. */
static void round_trip_messages(void **state) {
    static const size_t sizes[] = {0, 1, 5, 100, 1000, 30000, 70000, 300000};
    for (int bits = 8; bits <= 15; bits++) {
        for (int nct = 0; nct < 2; nct++) {
            tern__pmd_deflater *d = tern__pmd_deflater_new(bits, 0);
            tern__pmd_inflater *inf = tern__pmd_inflater_new(bits);
            assert_non_null(d);
            assert_non_null(inf);
            msgbuf m = {0};
            for (size_t round = 0; round < 2; round++) {
                for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
                    uint8_t *text = make_text(sizes[i], (uint32_t)(i + round * 100));
                    uint8_t *out;
                    ssize_t n = tern__pmd_deflate(d, text, sizes[i], nct, &out);
                    assert_true(n > 0);
                    assert_int_equal(inflate_all(inf, out, (size_t)n, nct, &m, 1 << 20), 0);
                    assert_int_equal(m.len, sizes[i]);
                    if (sizes[i])
                        assert_memory_equal(m.data, text, sizes[i]);
                    free(out);
                    free(text);
                }
            }
            msgbuf_free(&m);
            tern__pmd_deflater_free(d);
            tern__pmd_inflater_free(inf);
        }
    }
}

/* With context takeover a repeated message costs a few bytes; without,
 * it costs as much as the first time. */
static void context_takeover_pays(void **state) {
    uint8_t *text = make_text(2000, 5);
    uint8_t *a, *b;
    tern__pmd_deflater *d = tern__pmd_deflater_new(15, 0);
    ssize_t first = tern__pmd_deflate(d, text, 2000, false, &a);
    ssize_t second = tern__pmd_deflate(d, text, 2000, false, &b);
    assert_true(second > 0 && second < 50 && first > 200);
    tern__pmd_inflater *inf = tern__pmd_inflater_new(15);
    msgbuf m = {0};
    assert_int_equal(inflate_all(inf, a, (size_t)first, false, &m, 4096), 0);
    assert_int_equal(inflate_all(inf, b, (size_t)second, false, &m, 4096), 0);
    assert_int_equal(m.len, 2000);
    assert_memory_equal(m.data, text, 2000);
    /* The second alone, to an inflater without the first: it cannot be
     * read (it refers to bytes it does not have). */
    tern__pmd_inflater *cold = tern__pmd_inflater_new(15);
    assert_int_equal(inflate_all(cold, b, (size_t)second, false, &m, 4096), -EINVAL);
    tern__pmd_inflater_free(cold);
    free(a);
    free(b);
    tern__pmd_deflater_free(d);

    d = tern__pmd_deflater_new(15, 0);
    first = tern__pmd_deflate(d, text, 2000, true, &a);
    second = tern__pmd_deflate(d, text, 2000, true, &b);
    assert_int_equal(first, second);
    assert_memory_equal(a, b, (size_t)first);
    /* Each stands alone. */
    tern__pmd_inflater *inf2 = tern__pmd_inflater_new(15);
    assert_int_equal(inflate_all(inf2, b, (size_t)second, true, &m, 4096), 0);
    assert_memory_equal(m.data, text, 2000);
    tern__pmd_inflater_free(inf2);
    free(a);
    free(b);
    tern__pmd_deflater_free(d);
    tern__pmd_inflater_free(inf);
    msgbuf_free(&m);
    free(text);
}

/* Does a raw deflate stream decode with a window of 2^bits? zlib reads a
 * back-reference out of the output buffer when it can, so only output one
 * byte at a time forces every reference through the window, where one
 * reaching too far back fails. */
static bool fits_window(const uint8_t *z, size_t n, int bits, size_t want_len) {
    z_stream zs;
    memset(&zs, 0, sizeof(zs));
    if (inflateInit2(&zs, -bits) != Z_OK)
        return false;
    zs.next_in = (Bytef *)z;
    zs.avail_in = (uInt)n;
    size_t got = 0;
    int r = Z_OK;
    while (r == Z_OK) {
        uint8_t byte;
        zs.next_out = &byte;
        zs.avail_out = 1;
        r = inflate(&zs, Z_SYNC_FLUSH);
        got += 1 - zs.avail_out;
    }
    inflateEnd(&zs);
    return r == Z_BUF_ERROR && zs.avail_in == 0 && got == want_len;
}

/* The messages of a connection as one stream: each with its 00 00 FF FF. */
typedef struct stream {
    uint8_t *z;
    size_t n;
} stream;

static void stream_add(stream *st, const uint8_t *msg, size_t n) {
    st->z = realloc(st->z, st->n + n + 4);
    memcpy(st->z + st->n, msg, n);
    memcpy(st->z + st->n + n, "\x00\x00\xff\xff", 4);
    st->n += n + 4;
}

/* Window 8 is compressed with zlib's 9 (zlib refuses 8 for raw deflate);
 * zlib keeps its matches within 250 bytes at 9, so what it sends suits a
 * peer holding only 256, across messages too. */
static void window_8_stays_within_256(void **state) {
    enum { LEN = 20000 };
    uint8_t *data = malloc(LEN);
    /* Random blocks repeated at distances from 200 to 504. */
    uint32_t s = 9;
    for (size_t i = 0; i < LEN; i++) {
        s = s * 1103515245u + 12345u;
        size_t dist = 200 + (i / 1000) * 16;
        data[i] = (i >= dist && (i / 50) % 2) ? data[i - dist] : (uint8_t)(s >> 16);
    }
    tern__pmd_deflater *d = tern__pmd_deflater_new(8, 9);
    tern__pmd_inflater *inf = tern__pmd_inflater_new(8);
    msgbuf m = {0};
    stream st = {0};
    for (int round = 0; round < 3; round++) {
        uint8_t *out;
        ssize_t n = tern__pmd_deflate(d, data, LEN, false, &out);
        assert_true(n > 0 && n < LEN);
        assert_int_equal(inflate_all(inf, out, (size_t)n, false, &m, LEN), 0);
        assert_int_equal(m.len, LEN);
        assert_memory_equal(m.data, data, LEN);
        stream_add(&st, out, (size_t)n);
        free(out);
    }
    assert_true(fits_window(st.z, st.n, 8, 3 * LEN));
    free(st.z);

    /* The check does catch a stream that needs more: window 15 here. */
    tern__pmd_deflater *d15 = tern__pmd_deflater_new(15, 0);
    uint8_t *far = malloc(LEN);
    for (size_t i = 0; i < LEN; i++) {
        s = s * 1103515245u + 12345u;
        far[i] = i >= 5000 ? far[i - 5000] : (uint8_t)(s >> 16);
    }
    uint8_t *out;
    ssize_t n = tern__pmd_deflate(d15, far, LEN, false, &out);
    assert_true(n > 0 && n < LEN / 2);
    st = (stream){0};
    stream_add(&st, out, (size_t)n);
    assert_true(fits_window(st.z, st.n, 15, LEN));
    assert_false(fits_window(st.z, st.n, 8, LEN));
    assert_false(fits_window(st.z, st.n, 12, LEN));
    free(st.z);
    free(out);
    free(far);
    tern__pmd_deflater_free(d15);
    msgbuf_free(&m);
    tern__pmd_deflater_free(d);
    tern__pmd_inflater_free(inf);
    free(data);
}

/* Each window size: what we send fits the window we agreed to. */
static void deflate_respects_window(void **state) {
    enum { LEN = 50000 };
    uint8_t *data = malloc(LEN);
    uint32_t s = 1;
    for (size_t i = 0; i < LEN; i++) {
        s = s * 1103515245u + 12345u;
        size_t dist = 100 + (s >> 20) % 40000;
        data[i] = (i >= dist && (s >> 8) % 4) ? data[i - dist] : (uint8_t)(s >> 16);
    }
    for (int bits = 8; bits <= 15; bits++) {
        tern__pmd_deflater *d = tern__pmd_deflater_new(bits, 0);
        stream st = {0};
        for (int round = 0; round < 2; round++) {
            uint8_t *out;
            ssize_t n = tern__pmd_deflate(d, data, LEN, false, &out);
            assert_true(n > 0);
            stream_add(&st, out, (size_t)n);
            free(out);
        }
        assert_true(fits_window(st.z, st.n, bits, 2 * LEN));
        free(st.z);
        tern__pmd_deflater_free(d);
    }
    free(data);
}

/* A message arriving in fragments (and reads) decompresses the same
 * wherever it is cut. */
static void fragmented_inflate(void **state) {
    uint8_t *text = make_text(3000, 77);
    tern__pmd_deflater *d = tern__pmd_deflater_new(15, 0);
    uint8_t *warm, *out;
    ssize_t wn = tern__pmd_deflate(d, text + 1000, 500, false, &warm);
    ssize_t n = tern__pmd_deflate(d, text, 3000, false, &out);
    assert_true(n > 0 && wn > 0);
    msgbuf m = {0};
    for (size_t cut = 0; cut <= (size_t)n; cut++) {
        for (int nct = 0; nct < 2; nct++) {
            tern__pmd_inflater *inf = tern__pmd_inflater_new(15);
            assert_int_equal(inflate_all(inf, warm, (size_t)wn, false, &m, 4096), 0);
            m.len = 0;
            assert_int_equal(
                tern__pmd_inflate(inf, out, cut, false, nct, &m, 3000), 0);
            assert_int_equal(tern__pmd_inflate(inf, out + cut, (size_t)n - cut, true, nct, &m, 3000),
                             0);
            assert_int_equal(m.len, 3000);
            assert_memory_equal(m.data, text, 3000);
            tern__pmd_inflater_free(inf);
        }
    }
    /* One byte at a time, several messages. */
    tern__pmd_inflater *inf = tern__pmd_inflater_new(15);
    assert_int_equal(inflate_all(inf, warm, (size_t)wn, false, &m, 4096), 0);
    m.len = 0;
    for (ssize_t i = 0; i < n; i++)
        assert_int_equal(
            tern__pmd_inflate(inf, out + i, 1, false, false, &m, 3000), 0);
    assert_int_equal(tern__pmd_inflate(inf, NULL, 0, true, false, &m, 3000), 0);
    assert_int_equal(m.len, 3000);
    assert_memory_equal(m.data, text, 3000);
    tern__pmd_inflater_free(inf);
    free(warm);
    free(out);
    msgbuf_free(&m);
    tern__pmd_deflater_free(d);
    free(text);
}

/* A few kilobytes that inflate to 64 MiB: refused at the limit, the
 * buffer never larger than the limit and one byte. */
static void bomb_is_refused(void **state) {
    size_t big = 64u << 20;
    uint8_t *zeros = calloc(1, big);
    tern__pmd_deflater *d = tern__pmd_deflater_new(15, 0);
    uint8_t *bomb;
    ssize_t n = tern__pmd_deflate(d, zeros, big, true, &bomb);
    free(zeros);
    assert_true(n > 0 && n < 100000);
    static const size_t limits[] = {0, 1, 1000, 1 << 20, 16 << 20};
    for (size_t i = 0; i < sizeof(limits) / sizeof(limits[0]); i++) {
        tern__pmd_inflater *inf = tern__pmd_inflater_new(15);
        msgbuf m = {0};
        assert_int_equal(inflate_all(inf, bomb, (size_t)n, true, &m, limits[i]), -EMSGSIZE);
        assert_true(m.cap <= limits[i] + 1);
        /* Fragment by fragment, the same. */
        m.len = 0;
        int r = 0;
        for (ssize_t off = 0; off < n && r == 0; off += 100) {
            size_t k = (size_t)(n - off) < 100 ? (size_t)(n - off) : 100;
            r = tern__pmd_inflate(inf, bomb + off, k, off + (ssize_t)k == n, true, &m, limits[i]);
        }
        assert_int_equal(r, -EMSGSIZE);
        assert_true(m.len <= limits[i] + 1);
        msgbuf_free(&m);
        tern__pmd_inflater_free(inf);
    }
    free(bomb);
    tern__pmd_deflater_free(d);
}

static void limit_is_exact(void **state) {
    uint8_t *text = make_text(5000, 3);
    tern__pmd_deflater *d = tern__pmd_deflater_new(15, 0);
    uint8_t *out;
    ssize_t n = tern__pmd_deflate(d, text, 5000, true, &out);
    tern__pmd_inflater *inf = tern__pmd_inflater_new(15);
    msgbuf m = {0};
    assert_int_equal(inflate_all(inf, out, (size_t)n, true, &m, 5000), 0);
    assert_int_equal(m.len, 5000);
    assert_int_equal(inflate_all(inf, out, (size_t)n, true, &m, 4999), -EMSGSIZE);
    /* The limit counts what is already in the buffer. */
    m.len = 10;
    assert_int_equal(
        tern__pmd_inflate(inf, out, (size_t)n, true, true, &m, 5009),
        -EMSGSIZE);
    m.len = 10;
    assert_int_equal(
        tern__pmd_inflate(inf, out, (size_t)n, true, true, &m, 5010), 0);
    assert_int_equal(m.len, 5010);
    assert_memory_equal(m.data + 10, text, 5000);
    m.len = 11;
    assert_int_equal(tern__pmd_inflate(inf, out, 1, false, true, &m, 10),
                     -EMSGSIZE);
    msgbuf_free(&m);
    free(out);
    free(text);
    tern__pmd_deflater_free(d);
    tern__pmd_inflater_free(inf);
}

static void corrupt_data(void **state) {
    msgbuf m = {0};
    tern__pmd_inflater *inf = tern__pmd_inflater_new(15);
    /* BTYPE 11 is reserved. */
    static const uint8_t reserved[] = {0x07, 0x00};
    assert_int_equal(inflate_all(inf, reserved, sizeof(reserved), false, &m, 100), -EINVAL);
    /* A stored block whose length check fails. */
    static const uint8_t badlen[] = {0x00, 0x05, 0x00, 0x00, 0x00, 'H', 'e', 'l', 'l', 'o'};
    assert_int_equal(inflate_all(inf, badlen, sizeof(badlen), false, &m, 100), -EINVAL);
    /* A message cut short: the tail we add cannot end the block. */
    static const uint8_t cut[] = {0xf2, 0x48, 0xcd, 0xc9};
    assert_int_equal(inflate_all(inf, cut, sizeof(cut), false, &m, 100), -EINVAL);
    /* The sender kept the 00 00 FF FF it should have dropped: with ours
     * after it, the stream is inside a stored block at the end. */
    static const uint8_t kept[] = {0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00, 0x00, 0x00, 0xff, 0xff};
    assert_int_equal(inflate_all(inf, kept, sizeof(kept), false, &m, 100), -EINVAL);
    /* A distance before the start of the stream. */
    static const uint8_t far[] = {0x02, 0x02, 0x00};   /* fixed block: length 3, distance 1 */
    assert_int_equal(inflate_all(inf, far, sizeof(far), false, &m, 100), -EINVAL);
    for (int b = 0; b < 256; b++) {
        uint8_t junk[64];
        memset(junk, b, sizeof(junk));
        int r = inflate_all(inf, junk, sizeof(junk), b & 1, &m, 1000);
        assert_true(r == 0 || r == -EINVAL || r == -EMSGSIZE);
    }
    /* After errors, a good message on the same inflater (a new stream). */
    static const uint8_t hello[] = {0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00};
    inflate_expect(inf, hello, sizeof(hello), false, "Hello");
    tern__pmd_inflater_free(inf);
    msgbuf_free(&m);
}

/* A message of nothing but empty final blocks (2 bytes each): each
 * restarts the stream, at constant cost. */
static void many_final_blocks(void **state) {
    enum { N = 200000 };
    uint8_t *z = malloc(2 * N + 1);
    for (size_t i = 0; i < N; i++) {
        z[2 * i] = 0x03;   /* BFINAL, fixed codes, end of block */
        z[2 * i + 1] = 0x00;
    }
    tern__pmd_inflater *inf = tern__pmd_inflater_new(15);
    static const uint8_t hello[] = {0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00};
    inflate_expect(inf, hello, sizeof(hello), false, "Hello");
    msgbuf m = {0};
    assert_int_equal(inflate_all(inf, z, 2 * N, false, &m, 100), 0);
    assert_int_equal(m.len, 0);
    /* The window survived all of them. */
    static const uint8_t again[] = {0xf2, 0x00, 0x11, 0x00, 0x00};
    inflate_expect(inf, again, sizeof(again), false, "Hello");
    msgbuf_free(&m);
    tern__pmd_inflater_free(inf);
    free(z);
}

static void constructors(void **state) {
    /* Out-of-range settings are brought into range, not refused. */
    static const int bits[] = {0, -1, 1, 7, 8, 9, 15, 16, 100};
    for (size_t i = 0; i < sizeof(bits) / sizeof(bits[0]); i++) {
        for (int mem = -1; mem <= 10; mem++) {
            tern__pmd_deflater *d = tern__pmd_deflater_new(bits[i], mem);
            tern__pmd_inflater *inf = tern__pmd_inflater_new(bits[i]);
            assert_non_null(d);
            assert_non_null(inf);
            uint8_t *out;
            ssize_t n = tern__pmd_deflate(d, (const uint8_t *)"Hello Hello", 11, false, &out);
            assert_true(n > 0);
            inflate_expect(inf, out, (size_t)n, false, "Hello Hello");
            free(out);
            tern__pmd_deflater_free(d);
            tern__pmd_inflater_free(inf);
        }
    }
    tern__pmd_deflater_free(NULL);
    tern__pmd_inflater_free(NULL);
}

/* The client's side: the offer it sends, and what it accepts back. */
static void client_offer_and_answers(void **state) {
    char buf[200];
    tern__pmd_config cfg = {.enabled = true};
    assert_true(tern__pmd_client_offer(&cfg, buf, sizeof(buf)) > 0);
    assert_string_equal(buf, "permessage-deflate; client_max_window_bits");
    cfg = (tern__pmd_config){.enabled = true, .client_no_context_takeover = true,
                             .server_no_context_takeover = true, .server_max_window_bits = 10};
    assert_true(tern__pmd_client_offer(&cfg, buf, sizeof(buf)) > 0);
    assert_string_equal(buf, "permessage-deflate; client_max_window_bits; "
                             "client_no_context_takeover; server_no_context_takeover; "
                             "server_max_window_bits=10");
    assert_int_equal(tern__pmd_client_offer(&cfg, buf, 20), -ENOSPC);

    /* Our own server's answer to the offer is accepted, and the two ends
     * agree on every parameter. */
    tern__pmd_config srv = {.enabled = true, .server_max_window_bits = 15};
    tern__pmd_params sp, cp;
    char answer[160];
    cfg = (tern__pmd_config){.enabled = true, .client_no_context_takeover = true};
    assert_true(tern__pmd_client_offer(&cfg, buf, sizeof(buf)) > 0);
    assert_int_equal(tern__pmd_negotiate(buf, strlen(buf), &srv, &sp, answer, sizeof(answer)), 1);
    assert_int_equal(tern__pmd_client_accept(answer, strlen(answer), &cfg, &cp), 1);
    assert_int_equal(cp.client_no_context_takeover, sp.client_no_context_takeover);
    assert_true(cp.client_no_context_takeover);
    assert_int_equal(cp.server_no_context_takeover, sp.server_no_context_takeover);
    assert_int_equal(cp.client_max_window_bits, sp.client_max_window_bits);

    cfg = (tern__pmd_config){.enabled = true};
    const char *ok[] = {"permessage-deflate",
                        "permessage-deflate; server_no_context_takeover",
                        "permessage-deflate;client_no_context_takeover",
                        "permessage-deflate; client_max_window_bits=9",
                        "permessage-deflate; client_max_window_bits=\"10\"",
                        "permessage-deflate; server_max_window_bits=12",
                        "PerMessage-Deflate ; Server_No_Context_Takeover", NULL};
    for (int i = 0; ok[i]; i++)
        if (tern__pmd_client_accept(ok[i], strlen(ok[i]), &cfg, &cp) != 1)
            fail_msg("refused: %s", ok[i]);
    assert_int_equal(tern__pmd_client_accept(ok[1], strlen(ok[1]), &cfg, &cp), 1);
    assert_true(cp.server_no_context_takeover);
    assert_false(cp.client_no_context_takeover);
    assert_int_equal(cp.client_max_window_bits, 15);
    assert_int_equal(tern__pmd_client_accept(ok[3], strlen(ok[3]), &cfg, &cp), 1);
    assert_int_equal(cp.client_max_window_bits, 9);   /* our compressor's window */
    assert_int_equal(cp.server_max_window_bits, 15);  /* our decompressor takes any */

    const char *bad[] = {"x-webkit-deflate-frame",
                         "permessage-deflate, permessage-deflate",
                         "permessage-deflate; foo",
                         "permessage-deflate; server_no_context_takeover; server_no_context_takeover",
                         "permessage-deflate; client_max_window_bits",   /* no value: §7.1.2.2 */
                         "permessage-deflate; client_max_window_bits=16",
                         "permessage-deflate; server_max_window_bits=7",
                         "permessage-deflate; server_no_context_takeover=1",
                         "permessage-deflate; =1", "", NULL};
    for (int i = 0; bad[i]; i++)
        if (tern__pmd_client_accept(bad[i], strlen(bad[i]), &cfg, &cp) != -EPROTO)
            fail_msg("accepted: %s", bad[i]);
    /* A server window over the one asked for breaks the offer. */
    cfg.server_max_window_bits = 10;
    const char *wide = "permessage-deflate; server_max_window_bits=12";
    assert_int_equal(tern__pmd_client_accept(wide, strlen(wide), &cfg, &cp), -EPROTO);
    const char *narrow = "permessage-deflate; server_max_window_bits=9";
    assert_int_equal(tern__pmd_client_accept(narrow, strlen(narrow), &cfg, &cp), 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(negotiate_plain_offers),
        cmocka_unit_test(negotiate_with_config),
        cmocka_unit_test(negotiate_several_offers),
        cmocka_unit_test(negotiate_bad_params),
        cmocka_unit_test(negotiate_lenient_forms),
        cmocka_unit_test(negotiate_response_room),
        cmocka_unit_test(negotiate_response_reparses),
        cmocka_unit_test(rfc7692_examples),
        cmocka_unit_test(empty_messages),
        cmocka_unit_test(round_trip_messages),
        cmocka_unit_test(context_takeover_pays),
        cmocka_unit_test(window_8_stays_within_256),
        cmocka_unit_test(deflate_respects_window),
        cmocka_unit_test(fragmented_inflate),
        cmocka_unit_test(bomb_is_refused),
        cmocka_unit_test(limit_is_exact),
        cmocka_unit_test(corrupt_data),
        cmocka_unit_test(many_final_blocks),
        cmocka_unit_test(constructors),
        cmocka_unit_test(client_offer_and_answers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
