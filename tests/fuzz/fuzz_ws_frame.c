/* Frames as a server reads them: header parse (whole and byte by byte),
 * unmasking (in one call and in pieces, against a byte-by-byte reference),
 * and UTF-8 validation of text payloads (one shot against fragments).
 *
 * Input: one byte of options, then the byte stream of a connection. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ws/frame.h"
#include "ws/utf8.h"
#include "../common/utf8_reference.h"

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond))                                                                               \
            abort();                                                                               \
    } while (0)

/* A header parsed whole is parsed the same way fed one more byte at a
 * time: incomplete prefixes ask for more, an error shows no later than
 * the whole, and a success never follows an error. */
static int parse_checked(const uint8_t *p, size_t n, bool require_mask, bool allow_rsv1,
                         tern__ws_header *h) {
    int whole = tern__ws_parse_header(p, n, require_mask, allow_rsv1, h);
    CHECK(whole == 0 || whole == -1002 || (whole >= 2 && whole <= TERN__WS_MAX_HEADER));
    size_t upto = n < TERN__WS_MAX_HEADER ? n : TERN__WS_MAX_HEADER;
    bool failed = false;
    for (size_t k = 0; k <= upto; k++) {
        /* Each prefix in its own allocation, so ASan sees any over-read. */
        uint8_t *copy = malloc(k ? k : 1);
        memcpy(copy, p, k);
        tern__ws_header hk;
        int r = tern__ws_parse_header(copy, k, require_mask, allow_rsv1, &hk);
        free(copy);
        if (whole > 0) {
            CHECK(r == ((int)k < whole ? 0 : whole));
        } else if (whole == 0) {
            CHECK(r == 0);
        } else {
            CHECK(r == 0 || r == -1002);
            CHECK(!failed || r == -1002);
            failed = r == -1002;
        }
    }
    if (whole > 0) {
        CHECK(h->header_len == whole);
        CHECK(h->opcode <= 2 || (h->opcode >= 8 && h->opcode <= 10));
        CHECK(!require_mask || h->masked);
        CHECK(!h->rsv1 || (allow_rsv1 && h->opcode != 0 && h->opcode < 8));
        CHECK(h->opcode < 8 || (h->fin && h->payload_len <= 125));
        CHECK(h->payload_len < (1ull << 63));
        /* Written back in the shortest form and parsed again: the same. */
        uint8_t out[TERN__WS_MAX_HEADER];
        size_t wl = tern__ws_write_header(out, h->fin, h->rsv1, h->opcode, h->payload_len,
                                          h->masked ? h->mask : NULL);
        CHECK(wl <= (size_t)whole);
        tern__ws_header h2;
        CHECK(tern__ws_parse_header(out, wl, require_mask, allow_rsv1, &h2) == (int)wl);
        CHECK(h2.fin == h->fin && h2.rsv1 == h->rsv1 && h2.opcode == h->opcode &&
              h2.masked == h->masked && h2.payload_len == h->payload_len);
        CHECK(!h->masked || memcmp(h2.mask, h->mask, 4) == 0);
    }
    return whole;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    uint8_t opt = data[0];
    bool require_mask = opt & 1, allow_rsv1 = opt & 2;
    size_t step = 1 + (opt >> 2);   /* piece size for the piecewise paths */
    const uint8_t *p = data + 1;
    size_t n = size - 1;

    uint32_t text_state = TERN__UTF8_ACCEPT;
    uint8_t msg_op = 0;
    while (n > 0) {
        tern__ws_header h;
        int r = parse_checked(p, n, require_mask, allow_rsv1, &h);
        if (r <= 0)
            break;
        p += r;
        n -= (size_t)r;
        size_t plen = h.payload_len < n ? (size_t)h.payload_len : n;

        uint8_t *whole = malloc(plen ? plen : 1);
        uint8_t *pieces = malloc(plen ? plen : 1);
        uint8_t *ref = malloc(plen ? plen : 1);
        memcpy(whole, p, plen);
        memcpy(pieces, p, plen);
        memcpy(ref, p, plen);
        if (h.masked) {
            size_t ph = tern__ws_mask(whole, plen, h.mask, 0);
            CHECK(ph == plen % 4);
            size_t pos = 0;
            ph = 0;
            while (pos < plen) {
                size_t k = plen - pos < step ? plen - pos : step;
                ph = tern__ws_mask(pieces + pos, k, h.mask, ph);
                pos += k;
            }
            CHECK(ph == plen % 4);
            for (size_t i = 0; i < plen; i++)
                ref[i] ^= h.mask[i % 4];
            CHECK(memcmp(whole, ref, plen) == 0);
            CHECK(memcmp(pieces, ref, plen) == 0);
        }

        /* A text message, fragment by fragment, as the connection does. */
        bool is_text = h.opcode == TERN__WS_OP_TEXT || (h.opcode == TERN__WS_OP_CONT &&
                                                        msg_op == TERN__WS_OP_TEXT);
        if (h.opcode == TERN__WS_OP_TEXT || h.opcode == TERN__WS_OP_BINARY) {
            msg_op = h.opcode;
            text_state = TERN__UTF8_ACCEPT;
        }
        if (is_text && text_state != TERN__UTF8_REJECT) {
            uint32_t before = text_state;
            bool ok = tern__utf8_feed(&text_state, whole, plen);
            uint32_t split = before;
            bool ok2 = true;
            for (size_t pos = 0; pos < plen; pos += step) {
                size_t k = plen - pos < step ? plen - pos : step;
                ok2 = tern__utf8_feed(&split, whole + pos, k) && ok2;
            }
            CHECK(ok == ok2 && split == text_state);
            if (before == TERN__UTF8_ACCEPT) {
                int want = utf8_reference(whole, plen);
                if (want == 1)
                    CHECK(ok && tern__utf8_complete(text_state));
                if (want == 0)
                    CHECK(!ok);
                CHECK(tern__utf8_valid(whole, plen) == (want == 1));
            }
        }
        if (h.opcode < 8 && h.fin)
            msg_op = 0;
        if (h.opcode == TERN__WS_OP_CLOSE && plen >= 2) {
            unsigned code = (unsigned)whole[0] << 8 | whole[1];
            bool v = tern__ws_close_code_valid(code);
            CHECK(v == ((code >= 1000 && code <= 1003) || (code >= 1007 && code <= 1014) ||
                        (code >= 3000 && code <= 4999)));
        }
        free(whole);
        free(pieces);
        free(ref);
        p += plen;
        n -= plen;
    }
    return 0;
}
