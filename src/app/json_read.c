/* The admin API's JSON reader (json_read.h). */
#include "app/json_read.h"
#include "loop/hex.h"

#include <string.h>

static void skip_space(app_json_reader *r) {
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r'))
        r->p++;
}

void app_json_reader_init(app_json_reader *r, const char *s, size_t n) {
    *r = (app_json_reader){.p = s, .end = s + n};
    skip_space(r);
}

app_json_type app_json_peek(const app_json_reader *r) {
    if (r->p >= r->end)
        return APP_JSON_END;
    switch (*r->p) {
    case '"': return APP_JSON_STRING;
    case '{': return APP_JSON_OBJECT;
    case '[': return APP_JSON_ARRAY;
    case 't': case 'f': return APP_JSON_BOOL;
    case 'n': return APP_JSON_NULL;
    default:
        return (*r->p >= '0' && *r->p <= '9') || *r->p == '-' ? APP_JSON_NUMBER : APP_JSON_END;
    }
}

static bool open_with(app_json_reader *r, char c) {
    if (r->p >= r->end || *r->p != c)
        return false;
    r->p++;
    r->first = true;
    skip_space(r);
    return true;
}

bool app_json_object(app_json_reader *r) { return open_with(r, '{'); }
bool app_json_array(app_json_reader *r) { return open_with(r, '['); }

/* Before the next member or element of a container closed by `close`:
 * false at its end (ok true) or on a bad separator (ok false). */
static bool next_in(app_json_reader *r, char close, bool *ok) {
    *ok = true;
    if (r->p < r->end && *r->p == close) {
        r->p++;
        skip_space(r);
        /* The container just closed was a value of the one around it,
         * which needs a ',' before its next: an empty one never cleared
         * first ("[[] 1]" is no JSON). */
        r->first = false;
        return false;
    }
    if (!r->first) {
        if (r->p >= r->end || *r->p != ',')
            return *ok = false;
        r->p++;
        skip_space(r);
    }
    r->first = false;
    return true;
}

bool app_json_element(app_json_reader *r, bool *ok) {
    return next_in(r, ']', ok);
}

bool app_json_member(app_json_reader *r, char *key, size_t cap, bool *ok) {
    if (!next_in(r, '}', ok))
        return false;
    if (app_json_string(r, key, cap) < 0 || r->p >= r->end || *r->p != ':')
        return *ok = false;
    r->p++;
    skip_space(r);
    return true;
}

/* Four hex digits at s (s + 4 <= end): their value, or -1. */
static long hex4_at(const char *s, const char *end) {
    if (end - s < 4)
        return -1;
    long v = 0;
    for (int i = 0; i < 4; i++) {
        int d = tern__hex_value(s[i]);
        if (d < 0)
            return -1;
        v = v << 4 | d;
    }
    return v;
}

/* The length of the UTF-8 sequence at s (up to end), or 0 when it is not
 * a valid one (overlong forms and surrogates included). */
static size_t utf8_seq(const unsigned char *s, const unsigned char *end) {
    unsigned char c = s[0];
    size_t k;
    uint32_t cp, min;
    if (c < 0x80)
        return 1;
    if ((c & 0xE0) == 0xC0)
        k = 1, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0)
        k = 2, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0)
        k = 3, cp = c & 0x07, min = 0x10000;
    else
        return 0;
    if ((size_t)(end - s) <= k)
        return 0;
    for (size_t j = 1; j <= k; j++) {
        if ((s[j] & 0xC0) != 0x80)
            return 0;
        cp = cp << 6 | (s[j] & 0x3F);
    }
    return cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF) ? 0 : k + 1;
}

/* Appends code point cp to out as UTF-8, within cap - 1: false when it
 * does not fit. */
static bool put_cp(char *out, size_t cap, size_t *o, uint32_t cp) {
    char b[4];
    size_t k;
    if (cp < 0x80)
        b[0] = (char)cp, k = 1;
    else if (cp < 0x800)
        b[0] = (char)(0xC0 | cp >> 6), b[1] = (char)(0x80 | (cp & 0x3F)), k = 2;
    else if (cp < 0x10000)
        b[0] = (char)(0xE0 | cp >> 12), b[1] = (char)(0x80 | ((cp >> 6) & 0x3F)),
        b[2] = (char)(0x80 | (cp & 0x3F)), k = 3;
    else
        b[0] = (char)(0xF0 | cp >> 18), b[1] = (char)(0x80 | ((cp >> 12) & 0x3F)),
        b[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), b[3] = (char)(0x80 | (cp & 0x3F)), k = 4;
    if (out == NULL)
        return true;   /* checking only */
    if (*o + k >= cap)
        return false;
    memcpy(out + *o, b, k);
    *o += k;
    return true;
}

/* Reads the string at r->p, decoding it into out when out is not NULL:
 * its length, -1 (bad), -2 (too long for cap). On success r is past it. */
static long read_string(app_json_reader *r, char *out, size_t cap) {
    const char *s = r->p, *end = r->end;
    size_t o = 0;
    if (s >= end || *s++ != '"')
        return -1;
    while (s < end && *s != '"') {
        unsigned char c = (unsigned char)*s;
        uint32_t cp;
        if (c < 0x20)
            return -1;
        if (c == '\\') {
            if (++s >= end)
                return -1;
            const char *simple = strchr("\"\\/bfnrt", *s);
            if (*s != '\0' && simple) {
                static const char to[] = "\"\\/\b\f\n\r\t";
                cp = (unsigned char)to[simple - "\"\\/bfnrt"];
                s++;
            } else if (*s == 'u') {
                long hi = hex4_at(s + 1, end);
                s += 5;
                /* bad digits, a lone low surrogate; \u0000 only in a
                 * string decoded into a C string */
                if (hi < 0 || (hi == 0 && out) || (hi >= 0xDC00 && hi <= 0xDFFF))
                    return -1;
                cp = (uint32_t)hi;
                if (hi >= 0xD800 && hi <= 0xDBFF) {
                    /* a high surrogate: its low one must follow */
                    bool pair = end - s >= 6 && s[0] == '\\' && s[1] == 'u';
                    long lo = pair ? hex4_at(s + 2, end) : -1;
                    if (lo < 0xDC00 || lo > 0xDFFF)
                        return -1;
                    cp = 0x10000 + (uint32_t)((hi - 0xD800) << 10) + (uint32_t)(lo - 0xDC00);
                    s += 6;
                }
            } else {
                return -1;
            }
            if (!put_cp(out, cap, &o, cp))
                return -2;
            continue;
        }
        size_t k = utf8_seq((const unsigned char *)s, (const unsigned char *)end);
        if (k == 0)
            return -1;
        if (out) {
            if (o + k >= cap)
                return -2;
            memcpy(out + o, s, k);
        }
        o += k;
        s += k;
    }
    if (s >= end)
        return -1;
    if (out)
        out[o] = '\0';
    r->p = s + 1;
    skip_space(r);
    return (long)o;
}

long app_json_string(app_json_reader *r, char *out, size_t cap) {
    return cap == 0 ? -2 : read_string(r, out, cap);
}

bool app_json_string_token(app_json_reader *r, const char **s, size_t *n) {
    const char *start = r->p;
    if (read_string(r, NULL, 0) < 0)
        return false;
    *s = start;
    /* back over the whitespace read_string skipped, to the closing quote */
    const char *q = r->p;
    while (q[-1] != '"')
        q--;
    *n = (size_t)(q - start);
    return true;
}

bool app_json_uint(app_json_reader *r, uint64_t *out) {
    const char *s = r->p;
    uint64_t v = 0;
    if (s >= r->end || *s < '0' || *s > '9' || (*s == '0' && s + 1 < r->end && s[1] >= '0' &&
                                                s[1] <= '9'))
        return false;
    for (; s < r->end && *s >= '0' && *s <= '9'; s++) {
        if (v > (INT64_MAX - (uint64_t)(*s - '0')) / 10)
            return false;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    if (s < r->end && (*s == '.' || *s == 'e' || *s == 'E'))
        return false;
    r->p = s;
    skip_space(r);
    *out = v;
    return true;
}

bool app_json_bool(app_json_reader *r, bool *out) {
    size_t left = (size_t)(r->end - r->p);
    if (left >= 4 && !memcmp(r->p, "true", 4))
        *out = true, r->p += 4;
    else if (left >= 5 && !memcmp(r->p, "false", 5))
        *out = false, r->p += 5;
    else
        return false;
    skip_space(r);
    return true;
}

bool app_json_done(const app_json_reader *r) { return r->p == r->end; }
