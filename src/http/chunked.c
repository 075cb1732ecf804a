/* Chunked transfer coding decoder (RFC 9112 §7.1), see chunked.h.
 *
 *   chunked-body = *chunk last-chunk trailer-section CRLF
 *   chunk        = chunk-size [ chunk-ext ] CRLF chunk-data CRLF
 *   chunk-ext    = *( BWS ";" BWS ext-name [ BWS "=" BWS ext-val ] )
 *   ext-val      = token / quoted-string
 *
 * A byte-at-a-time state machine for the framing, which is short, and one
 * step per span for the data, which is the bulk. Every state's accepted
 * bytes are spelled out: the framing of a body is where a front end and
 * this server must never read two different messages. */
#include "http/chunked.h"

#include <stdbool.h>

#include "http/chars.h"
#include "loop/hex.h"

enum {
    S_SIZE_START = 0,    /* the first hex digit of a chunk-size */
    S_SIZE,              /* more hex digits, BWS, ';' or CR */
    S_SIZE_BWS,          /* whitespace after the size: only more of it, or ';' */
    S_EXT_PRE_NAME,      /* after ';': BWS, then the ext-name */
    S_EXT_NAME,          /* in the ext-name */
    S_EXT_POST_NAME,     /* BWS after the name: '=', ';' or CR */
    S_EXT_PRE_VALUE,     /* after '=': BWS, then a token or '"' */
    S_EXT_VALUE,         /* in a token ext-val */
    S_EXT_QUOTED,        /* in a quoted-string ext-val */
    S_EXT_QUOTED_ESC,    /* after a backslash in it */
    S_EXT_POST_VALUE,    /* after the ext-val: BWS, ';' or CR */
    S_SIZE_LF,           /* the LF ending the size line */
    S_DATA,              /* remaining data bytes of the chunk */
    S_DATA_CR,           /* the CRLF after the data */
    S_DATA_LF,
    S_TRAILER_START,     /* start of a trailer line: a field name, or CR */
    S_TRAILER_NAME,
    S_TRAILER_VALUE,
    S_TRAILER_LF,
    S_FINAL_LF,          /* the LF of the final empty line */
    S_DONE,
    S_ERROR,
};

#define MAX_SIZE_DIGITS 16
#define MAX_CHUNK_SIZE UINT64_C(0x7FFFFFFFFFFFFFFF)

void tern__chunked_init(tern__chunked *d) {
    d->state = S_SIZE_START;
    d->remaining = 0;
    d->count = 0;
}

static inline bool is_ws(unsigned char c) {
    return c == ' ' || c == '\t';
}

static inline bool is_tchar(unsigned char c) {
    return tern__http_is(c, TERN__C_TCHAR) != 0;
}

/* The state after a byte of a size line's tail that may be followed by
 * BWS, ';' or CR; S_ERROR for any other byte. from_ws is the state BWS
 * leads to. */
static uint8_t ext_boundary(unsigned char c, uint8_t from_ws) {
    if (is_ws(c))
        return from_ws;
    if (c == ';')
        return S_EXT_PRE_NAME;
    if (c == '\r')
        return S_SIZE_LF;
    return S_ERROR;
}

int tern__chunked_decode(tern__chunked *d, const char *buf, size_t len, size_t *consumed,
                         const char **data, size_t *data_len, size_t max_trailer) {
    /* count is 32 bits: a larger bound means no bound it could reach. */
    const uint32_t limit = max_trailer < UINT32_MAX ? (uint32_t)max_trailer : UINT32_MAX - 1;
    *data = NULL;
    *data_len = 0;
    if (d->state == S_DONE || d->state == S_ERROR) {
        *consumed = 0;
        return d->state == S_DONE ? TERN__CHUNKED_DONE : TERN__CHUNKED_ERROR;
    }
    const unsigned char *b = (const unsigned char *)buf;
    size_t i = 0;
    while (i < len) {
        if (d->state == S_DATA) {
            size_t n = len - i;
            if (n > d->remaining)
                n = (size_t)d->remaining;
            d->remaining -= n;
            if (d->remaining == 0)
                d->state = S_DATA_CR;
            *data = buf + i;
            *data_len = n;
            *consumed = i + n;
            return TERN__CHUNKED_DATA;
        }
        unsigned char c = b[i++];
        uint8_t next;
        switch (d->state) {
        case S_SIZE_START: {
            int v = tern__hex_value(c);
            next = v < 0 ? S_ERROR : S_SIZE;
            d->remaining = v < 0 ? 0 : (uint64_t)v;
            d->count = 1;
            break;
        }
        case S_SIZE: {
            int v = tern__hex_value(c);
            if (v >= 0) {
                if (++d->count > MAX_SIZE_DIGITS || d->remaining > (MAX_CHUNK_SIZE - (uint64_t)v) >> 4)
                    next = S_ERROR;
                else {
                    d->remaining = d->remaining << 4 | (uint64_t)v;
                    next = S_SIZE;
                }
                break;
            }
            d->count = 0;   /* from here on it counts extension bytes */
            if (c == '\r')
                next = S_SIZE_LF;
            else if (is_ws(c))
                next = S_SIZE_BWS;
            else if (c == ';')
                next = S_EXT_PRE_NAME;
            else
                next = S_ERROR;
            break;
        }
        case S_SIZE_BWS:
            next = is_ws(c) ? S_SIZE_BWS : c == ';' ? S_EXT_PRE_NAME : S_ERROR;
            break;
        case S_EXT_PRE_NAME:
            next = is_ws(c) ? S_EXT_PRE_NAME : is_tchar(c) ? S_EXT_NAME : S_ERROR;
            break;
        case S_EXT_NAME:
            next = is_tchar(c) ? S_EXT_NAME : c == '=' ? S_EXT_PRE_VALUE
                 : ext_boundary(c, S_EXT_POST_NAME);
            break;
        case S_EXT_POST_NAME:
            next = c == '=' ? S_EXT_PRE_VALUE : ext_boundary(c, S_EXT_POST_NAME);
            break;
        case S_EXT_PRE_VALUE:
            next = is_ws(c) ? S_EXT_PRE_VALUE : c == '"' ? S_EXT_QUOTED
                 : is_tchar(c) ? S_EXT_VALUE : S_ERROR;
            break;
        case S_EXT_VALUE:
            next = is_tchar(c) ? S_EXT_VALUE : ext_boundary(c, S_EXT_POST_VALUE);
            break;
        case S_EXT_QUOTED:
            /* qdtext is HTAB, SP and VCHAR but '"' and '\', or obs-text:
             * the field-value bytes, so no CR or LF can hide in here. */
            next = c == '"' ? S_EXT_POST_VALUE : c == '\\' ? S_EXT_QUOTED_ESC
                 : tern__http_is(c, TERN__C_FIELD) ? S_EXT_QUOTED : S_ERROR;
            break;
        case S_EXT_QUOTED_ESC:
            next = tern__http_is(c, TERN__C_FIELD) ? S_EXT_QUOTED : S_ERROR;
            break;
        case S_EXT_POST_VALUE:
            next = ext_boundary(c, S_EXT_POST_VALUE);
            break;
        case S_SIZE_LF:
            if (c != '\n')
                next = S_ERROR;
            else if (d->remaining == 0) {
                next = S_TRAILER_START;
                d->count = 0;   /* from here on it counts trailer bytes */
            } else
                next = S_DATA;
            break;
        case S_DATA_CR:
            next = c == '\r' ? S_DATA_LF : S_ERROR;
            break;
        case S_DATA_LF:
            next = c == '\n' ? S_SIZE_START : S_ERROR;
            break;
        case S_TRAILER_START:
            /* SP/HTAB here would be obs-fold; a bare LF no line at all. */
            next = c == '\r' ? S_FINAL_LF : is_tchar(c) ? S_TRAILER_NAME : S_ERROR;
            break;
        case S_TRAILER_NAME:
            next = is_tchar(c) ? S_TRAILER_NAME : c == ':' ? S_TRAILER_VALUE : S_ERROR;
            break;
        case S_TRAILER_VALUE:
            next = c == '\r' ? S_TRAILER_LF
                 : tern__http_is(c, TERN__C_FIELD) ? S_TRAILER_VALUE : S_ERROR;
            break;
        case S_TRAILER_LF:
            next = c == '\n' ? S_TRAILER_START : S_ERROR;
            break;
        case S_FINAL_LF:
            next = c == '\n' ? S_DONE : S_ERROR;
            break;
        default:
            next = S_ERROR;
            break;
        }
        /* Extension and trailer bytes are bounded; the CRLF ending a size
         * line and the final empty line are not part of either. */
        bool counted = (next >= S_SIZE_BWS && next <= S_EXT_POST_VALUE)
                    || (d->state >= S_TRAILER_START && d->state <= S_TRAILER_LF
                        && !(d->state == S_TRAILER_START && c == '\r'));
        if (counted && ++d->count > limit)
            next = S_ERROR;
        d->state = next;
        if (next == S_ERROR) {
            *consumed = i - 1;
            return TERN__CHUNKED_ERROR;
        }
        if (next == S_DONE) {
            *consumed = i;
            return TERN__CHUNKED_DONE;
        }
    }
    *consumed = i;
    return TERN__CHUNKED_MORE;
}
