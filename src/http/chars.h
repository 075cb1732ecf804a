/* Byte classes shared by the HTTP parser and the chunked decoder: one
 * table lookup answers "may this byte appear here?", so the hot loops have
 * no chains of comparisons. The table lives in parser.c. */
#ifndef TERN_HTTP_CHARS_H
#define TERN_HTTP_CHARS_H

#include <stdint.h>

enum {
    TERN__C_TCHAR = 1,  /* token character (RFC 9110 §5.6.2): methods, field names, codings */
    TERN__C_TARGET = 2, /* request-target byte: visible ASCII 0x21-0x7E but '#' */
    TERN__C_FIELD = 4,  /* field-value byte: HTAB, SP, VCHAR, obs-text (0x80-0xFF) */
    TERN__C_HOST = 8,   /* Host / authority: unreserved, pct-encoded, sub-delims, ':', '[', ']' */
};

extern const uint8_t tern__http_char_class[256];

static inline int tern__http_is(unsigned char c, int cls) {
    return tern__http_char_class[c] & cls;
}

#endif
