/* Query strings and percent-decoding, see parser.h. */
#include <errno.h>
#include <string.h>

#include "http/parser.h"
#include "loop/hex.h"

const char *tern__query_find(const char *query, size_t query_len, const char *name,
                             size_t *value_len) {
    size_t nl = strlen(name);
    size_t i = 0;
    while (i <= query_len && query_len > 0) {
        const char *pair = query + i;
        const char *amp = memchr(pair, '&', query_len - i);
        size_t pair_len = amp ? (size_t)(amp - pair) : query_len - i;
        const char *eq = memchr(pair, '=', pair_len);
        size_t key_len = eq ? (size_t)(eq - pair) : pair_len;
        /* An empty pair ("a=1&&b") has no name, not even the empty one. */
        if (pair_len > 0 && key_len == nl && memcmp(pair, name, nl) == 0) {
            if (eq == NULL) {
                *value_len = 0;
                return pair + pair_len;
            }
            *value_len = pair_len - key_len - 1;
            return eq + 1;
        }
        if (amp == NULL)
            break;
        i += pair_len + 1;
    }
    *value_len = 0;
    return NULL;
}

/* Writing never overtakes reading (an escape shrinks three bytes to one),
 * which is why dst may equal src. A bad escape is reported before a full
 * dst: decoding continues, without writing, once dst is full. */
ssize_t tern__url_decode(char *dst, size_t cap, const char *src, size_t len, bool plus_is_space) {
    size_t out = 0;
    bool full = false;
    for (size_t i = 0; i < len; i++) {
        char c = src[i];
        if (c == '%') {
            if (len - i < 3)
                return -EINVAL;
            int hi = tern__hex_value(src[i + 1]), lo = tern__hex_value(src[i + 2]);
            if (hi < 0 || lo < 0)
                return -EINVAL;
            c = (char)(hi << 4 | lo);
            i += 2;
        } else if (c == '+' && plus_is_space) {
            c = ' ';
        }
        if (out == cap)
            full = true;
        else
            dst[out++] = c;
    }
    return full ? -ENOSPC : (ssize_t)out;
}
