/* A UTF-8 reference for the tests and fuzzers of src/ws/utf8.c, written
 * the slow, obvious way so that it shares nothing with the DFA it checks. */
#ifndef TERN_TEST_UTF8_REFERENCE_H
#define TERN_TEST_UTF8_REFERENCE_H

#include <stddef.h>
#include <stdint.h>

/* An independent decoder: computes each code point and checks its range
 * and shortest form. Returns 1 valid, 0 invalid, -1 valid so far but cut
 * inside a code point. */
static int utf8_reference(const uint8_t *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        uint8_t b = s[i];
        size_t n;
        uint32_t cp, min;
        if (b < 0x80) {
            i++;
            continue;
        } else if ((b & 0xE0) == 0xC0) {
            n = 2, cp = b & 0x1F, min = 0x80;
        } else if ((b & 0xF0) == 0xE0) {
            n = 3, cp = b & 0x0F, min = 0x800;
        } else if ((b & 0xF8) == 0xF0) {
            n = 4, cp = b & 0x07, min = 0x10000;
        } else {
            return 0;
        }
        size_t k;
        for (k = 1; k < n && i + k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (k < n) {
            /* Cut short: valid so far only if some completion could be
             * valid, which the smallest and largest completions decide. */
            uint32_t lo = cp, hi = cp;
            for (; k < n; k++) {
                lo = lo << 6;
                hi = (hi << 6) | 0x3F;
            }
            if (hi < min || lo > 0x10FFFF || (lo >= 0xD800 && hi <= 0xDFFF))
                return 0;
            return -1;
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += n;
    }
    return 1;
}

#endif
