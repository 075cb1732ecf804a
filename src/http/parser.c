/* Request-head parser (RFC 9112), see parser.h.
 *
 * One pass, no allocation, no state kept between calls: the caller finds the
 * end of the head first (tern__http_find_head_end, resumable), so the head is
 * parsed once. Every byte is checked where it stands, which is what lets an
 * incomplete head be refused as soon as it holds a byte no continuation can
 * make valid, and answered 0 ("more") otherwise. The long runs (the target,
 * field values) are scanned 16 bytes at a time with SSE2 where available. */
#include "http/parser.h"

#include <string.h>
#include <strings.h>

#include "http/chars.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* The longest method taken. RFC 9112 §3 answers a method longer than any
 * the server implements with 501; the longest registered one
 * ("UPDATEREDIRECTREF") has 17 bytes. With the target bounded by max_uri and
 * the version being 8 bytes, this bounds the whole request line, so no
 * separate line limit is needed. */
#define TERN__HTTP_MAX_METHOD 32

/* Defaults when the caller passes no limits (same as the server's). */
static const tern__http_limits default_limits = {16384, 8192, 100};

/* Generated: bit 1 tchar, 2 target byte, 4 field-value byte, 8 host byte
 * (see chars.h). */
const uint8_t tern__http_char_class[256] = {
     0,  0,  0,  0,  0,  0,  0,  0,  0,  4,  0,  0,  0,  0,  0,  0,  /* 0x00 */
     0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  /* 0x10 */
     4, 15,  6,  5, 15, 15, 15, 15, 14, 14, 15, 15, 14, 15, 15,  6,  /* 0x20 */
    15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 14, 14,  6, 14,  6,  6,  /* 0x30 */
     6, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15,  /* 0x40 */
    15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 14,  6, 14,  7, 15,  /* 0x50 */
     7, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15,  /* 0x60 */
    15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15,  6,  7,  6, 15,  0,  /* 0x70 */
     4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  /* 0x80 */
     4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  /* 0x90 */
     4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  /* 0xA0 */
     4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  /* 0xB0 */
     4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  /* 0xC0 */
     4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  /* 0xD0 */
     4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  /* 0xE0 */
     4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  /* 0xF0 */
};

/* First byte of [p, end) that is not a request-target byte, or end. */
static const uint8_t *scan_target(const uint8_t *p, const uint8_t *end) {
#if defined(__SSE2__)
    const __m128i sp = _mm_set1_epi8(0x20);
    const __m128i del = _mm_set1_epi8(0x7F);
    const __m128i hash = _mm_set1_epi8('#');
    while (end - p >= 16) {
        __m128i x = _mm_loadu_si128((const __m128i *)(const void *)p);
        __m128i low = _mm_cmpeq_epi8(_mm_min_epu8(x, sp), x);   /* x <= 0x20 */
        __m128i high = _mm_cmpeq_epi8(_mm_max_epu8(x, del), x); /* x >= 0x7F */
        __m128i bad = _mm_or_si128(_mm_or_si128(low, high), _mm_cmpeq_epi8(x, hash));
        unsigned mask = (unsigned)_mm_movemask_epi8(bad);
        if (mask)
            return p + __builtin_ctz(mask);
        p += 16;
    }
#endif
    while (p < end && tern__http_is(*p, TERN__C_TARGET))
        p++;
    return p;
}

/* First byte of [p, end) that may not appear in a field value, or end.
 * HTAB is allowed but rare, so the vector test leaves it out and steps
 * over it when it turns up. */
static const uint8_t *scan_value(const uint8_t *p, const uint8_t *end) {
#if defined(__SSE2__)
    const __m128i us = _mm_set1_epi8(0x1F);
    const __m128i del = _mm_set1_epi8(0x7F);
    while (end - p >= 16) {
        __m128i x = _mm_loadu_si128((const __m128i *)(const void *)p);
        __m128i ctl = _mm_cmpeq_epi8(_mm_min_epu8(x, us), x); /* x <= 0x1F */
        __m128i bad = _mm_or_si128(ctl, _mm_cmpeq_epi8(x, del));
        unsigned mask = (unsigned)_mm_movemask_epi8(bad);
        if (mask == 0) {
            p += 16;
            continue;
        }
        p += __builtin_ctz(mask);
        if (*p != '\t')
            return p;
        p++;
    }
#endif
    while (p < end && tern__http_is(*p, TERN__C_FIELD))
        p++;
    return p;
}

static inline unsigned char lower(unsigned char c) {
    return c >= 'A' && c <= 'Z' ? (unsigned char)(c + 32) : c;
}

/* Case-insensitive equality of s[0..n) and the lowercase literal lit. */
static bool eq_lower(const char *s, size_t n, const char *lit, size_t lit_len) {
    if (n != lit_len)
        return false;
    for (size_t i = 0; i < n; i++)
        if (lower((unsigned char)s[i]) != (unsigned char)lit[i])
            return false;
    return true;
}

#define EQ_LIT(s, n, lit) eq_lower((s), (n), lit, sizeof(lit) - 1)

static inline bool is_ows(char c) {
    return c == ' ' || c == '\t';
}

static inline bool is_digit(char c) {
    return c >= '0' && c <= '9';
}

/* uri-host [":" port] (RFC 9110 §4.2, §7.2). The host is a non-empty
 * reg-name or IPv4 address, or an IP-literal in brackets; no userinfo. */
static bool valid_authority(const char *a, size_t n, bool need_port) {
    size_t i = 0;
    if (n > 0 && a[0] == '[') {
        const char *rb = memchr(a, ']', n);
        if (rb == NULL || rb == a + 1)
            return false;
        for (i = 1; a + i < rb; i++)
            if (!tern__http_is((unsigned char)a[i], TERN__C_HOST) || a[i] == '[')
                return false;
        i++;
    } else {
        while (i < n && a[i] != ':') {
            if (!tern__http_is((unsigned char)a[i], TERN__C_HOST) || a[i] == '[' || a[i] == ']')
                return false;
            i++;
        }
        if (i == 0)
            return false;
    }
    if (i == n)
        return !need_port;
    if (a[i] != ':')
        return false;
    if (++i == n && need_port)
        return false;
    for (; i < n; i++)
        if (!is_digit(a[i]))
            return false;
    return true;
}

/* Splits what follows the authority (or an origin-form target) at '?'. */
static void split_query(tern__http_head *h, const char *p, size_t n) {
    const char *q = memchr(p, '?', n);
    h->path = p;
    h->path_len = q ? (size_t)(q - p) : n;
    if (q) {
        h->query = q + 1;
        h->query_len = n - h->path_len - 1;
    }
}

/* Classifies the request-target (RFC 9112 §3.2) and sets path and query. */
static int parse_target(tern__http_head *h) {
    const char *t = h->target;
    size_t n = h->target_len;
    if (h->method_len == 7 && memcmp(h->method, "CONNECT", 7) == 0) {
        /* authority-form, and only that, for CONNECT. */
        if (!valid_authority(t, n, true))
            return -400;
        h->path = t;
        h->path_len = n;
        return 0;
    }
    if (t[0] == '/') {
        split_query(h, t, n);
        return 0;
    }
    if (n == 1 && t[0] == '*') {
        if (h->method_len != 7 || memcmp(h->method, "OPTIONS", 7) != 0)
            return -400;
        h->path = t;
        h->path_len = 1;
        return 0;
    }
    /* absolute-form: only the http and https schemes mean anything here. */
    size_t skip;
    if (n >= 7 && EQ_LIT(t, 7, "http://"))
        skip = 7;
    else if (n >= 8 && EQ_LIT(t, 8, "https://"))
        skip = 8;
    else
        return -400;
    const char *a = t + skip;
    size_t rest = n - skip, alen = 0;
    while (alen < rest && a[alen] != '/' && a[alen] != '?')
        alen++;
    if (!valid_authority(a, alen, false))
        return -400;
    if (alen < rest && a[alen] == '/') {
        split_query(h, a + alen, rest - alen);
    } else {
        /* "http://host" or "http://host?q": the path is "/", and the
         * second slash of "://" is one, right in the buffer. */
        h->path = t + skip - 1;
        h->path_len = 1;
        if (alen < rest) {
            h->query = a + alen + 1;
            h->query_len = rest - alen - 1;
        }
    }
    return 0;
}

/* What the header fields said, gathered while they are read and judged
 * once the head is complete. */
typedef struct fields {
    bool content_length;
    bool transfer_encoding;
    bool te_last_chunked;   /* the last coding so far is "chunked" */
    size_t te_codings;      /* codings over all Transfer-Encoding lines */
    size_t hosts;
    bool conn_close, conn_keep_alive, conn_upgrade;
    bool upgrade_header;
} fields;

/* Content-Length = 1*DIGIT, at most 2^63 - 1 (the chunked decoder's bound
 * too). A list ("5, 5") is refused: two lengths are never reconciled. */
static int parse_content_length(const char *v, size_t n, uint64_t *out) {
    if (n == 0)
        return -400;
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        if (!is_digit(v[i]))
            return -400;
        unsigned d = (unsigned)(v[i] - '0');
        if (x > (UINT64_C(0x7FFFFFFFFFFFFFFF) - d) / 10)
            return -400;
        x = x * 10 + d;
    }
    *out = x;
    return 0;
}

/* Transfer-Encoding lines add to one list of codings. Each element must be
 * a bare token: empty elements and parameters are refused rather than
 * guessed at, since framing is where two readers must never disagree. */
static int add_transfer_codings(fields *f, const char *v, size_t n) {
    size_t i = 0;
    for (;;) {
        while (i < n && is_ows(v[i]))
            i++;
        size_t start = i;
        while (i < n && tern__http_is((unsigned char)v[i], TERN__C_TCHAR))
            i++;
        if (i == start)
            return -400;
        f->te_last_chunked = EQ_LIT(v + start, i - start, "chunked");
        f->te_codings++;
        while (i < n && is_ows(v[i]))
            i++;
        if (i == n)
            return 0;
        if (v[i] != ',')
            return -400;
        i++;
    }
}

/* Judges one complete field line. */
static int on_field(tern__http_head *h, fields *f, const tern__http_header *hd) {
    const char *nm = hd->name, *v = hd->value;
    size_t nl = hd->name_len, vl = hd->value_len;
    switch (nl) {
    case 4:
        if (EQ_LIT(nm, nl, "host")) {
            if (++f->hosts > 1)
                return -400;
            if (vl > 0 && !valid_authority(v, vl, false))
                return -400;
            h->host = v;
            h->host_len = vl;
        }
        break;
    case 6:
        if (EQ_LIT(nm, nl, "expect")) {
            if (!EQ_LIT(v, vl, "100-continue"))
                return -417;
            /* RFC 9110 §10.1.1: ignored from an HTTP/1.0 client. */
            h->expect_continue = h->minor_version == 1;
        }
        break;
    case 7:
        if (EQ_LIT(nm, nl, "upgrade"))
            f->upgrade_header = true;
        break;
    case 10:
        if (EQ_LIT(nm, nl, "connection")) {
            f->conn_close |= tern__http_has_token(v, vl, "close");
            f->conn_keep_alive |= tern__http_has_token(v, vl, "keep-alive");
            f->conn_upgrade |= tern__http_has_token(v, vl, "upgrade");
        }
        break;
    case 14:
        if (EQ_LIT(nm, nl, "content-length")) {
            if (f->content_length || f->transfer_encoding)
                return -400;
            f->content_length = true;
            return parse_content_length(v, vl, &h->content_length);
        }
        break;
    case 17:
        if (EQ_LIT(nm, nl, "transfer-encoding")) {
            /* RFC 9112 §6.1: a 1.0 message with it is faulty framing. */
            if (f->content_length || h->minor_version == 0)
                return -400;
            f->transfer_encoding = true;
            return add_transfer_codings(f, v, vl);
        }
        break;
    default:
        break;
    }
    return 0;
}

/* Judges the head as a whole once the blank line is read. */
static int finish(tern__http_head *h, const fields *f) {
    if (h->minor_version == 1 && f->hosts == 0)
        return -400;
    if (f->transfer_encoding) {
        /* RFC 9112 §6.3: chunked must be the final coding, else the length
         * is unknowable (400). Codings before it (gzip, or chunked twice)
         * are ones we do not decode: 501, not 400 (malformed). */
        if (!f->te_last_chunked)
            return -400;
        if (f->te_codings > 1)
            return -501;
        h->body_kind = TERN__BODY_CHUNKED;
    } else if (f->content_length) {
        h->body_kind = TERN__BODY_LENGTH;
    }
    if (h->minor_version == 1)
        h->keep_alive = !f->conn_close;
    else
        h->keep_alive = f->conn_keep_alive && !f->conn_close;
    h->upgrade = f->upgrade_header && f->conn_upgrade;
    return 0;
}

enum { LINE_MORE = 0, LINE_FIELD = 1, LINE_END = 2 };

/* One field line at *p, or the empty line that ends the head (RFC 9112
 * §5): LINE_FIELD with *hd filled and *p past the line, LINE_END with *p
 * past the blank line, LINE_MORE when the bytes stop first, or -400 (a
 * malformed line), -431 (a field line when `full`). Shared by requests
 * and responses, so both read fields byte for byte alike. */
static int field_line(const uint8_t **pp, const uint8_t *end, bool full, tern__http_header *hd) {
    const uint8_t *p = *pp;
    if (p == end)
        return LINE_MORE;
    if (*p == '\r') {
        if (p + 1 == end)
            return LINE_MORE;
        if (p[1] != '\n')
            return -400;
        *pp = p + 2;
        return LINE_END;
    }
    /* A line that starts with SP or HTAB (obs-fold), a bare LF, or any
     * other non-token byte has no field name. */
    if (!tern__http_is(*p, TERN__C_TCHAR))
        return -400;
    if (full)
        return -431;
    const uint8_t *name = p;
    while (p < end && tern__http_is(*p, TERN__C_TCHAR))
        p++;
    if (p == end)
        return LINE_MORE;
    if (*p != ':')   /* whitespace before ':' included (RFC 9112 §5.1) */
        return -400;
    const uint8_t *name_end = p++;
    while (p < end && (*p == ' ' || *p == '\t'))
        p++;
    const uint8_t *value = p;
    p = scan_value(p, end);
    if (p == end)
        return LINE_MORE;
    if (*p != '\r')
        return -400;
    if (p + 1 == end)
        return LINE_MORE;
    if (p[1] != '\n')
        return -400;
    const uint8_t *value_end = p;
    while (value_end > value && (value_end[-1] == ' ' || value_end[-1] == '\t'))
        value_end--;
    hd->name = (const char *)name;
    hd->name_len = (size_t)(name_end - name);
    hd->value = (const char *)value;
    hd->value_len = (size_t)(value_end - value);
    *pp = p + 2;
    return LINE_FIELD;
}

ssize_t tern__http_parse_head(const char *buf, size_t len, const tern__http_limits *lim,
                              tern__http_head *out, tern__http_header *headers,
                              size_t max_headers) {
    if (lim == NULL)
        lim = &default_limits;
    if (max_headers > lim->max_headers)
        max_headers = lim->max_headers;
    memset(out, 0, sizeof(*out));
    out->headers = headers;

    /* Nothing past max_head is looked at: a head that does not end within
     * it is too large, whatever follows. Running out of bytes before the
     * end is "more" below the limit and 431 at it, since the head would
     * then need more than max_head bytes. */
    size_t avail = len < lim->max_head ? len : lim->max_head;
    const ssize_t more = len >= lim->max_head ? -431 : 0;
    const uint8_t *const start = (const uint8_t *)buf;
    const uint8_t *const end = start + avail;
    const uint8_t *p = start;

    /* method SP */
    const uint8_t *method_end = avail > TERN__HTTP_MAX_METHOD + 1 ? p + TERN__HTTP_MAX_METHOD + 1 : end;
    while (p < method_end && tern__http_is(*p, TERN__C_TCHAR))
        p++;
    if (p - start > TERN__HTTP_MAX_METHOD)
        return -501;
    if (p == end)
        return more;
    if (*p != ' ' || p == start)
        return -400;
    out->method = buf;
    out->method_len = (size_t)(p - start);

    /* request-target SP: refused with 414 as soon as it is too long. */
    const uint8_t *t = ++p;
    const uint8_t *target_end = (size_t)(end - t) > lim->max_uri ? t + lim->max_uri + 1 : end;
    p = scan_target(t, target_end);
    if ((size_t)(p - t) > lim->max_uri)
        return -414;
    if (p == end)
        return more;
    if (*p != ' ' || p == t)
        return -400;
    out->target = (const char *)t;
    out->target_len = (size_t)(p - t);
    p++;

    /* HTTP-version CRLF: "HTTP/" DIGIT "." DIGIT, then exactly CRLF. */
    static const char version[] = "HTTP/";
    for (size_t i = 0; i < 10; i++) {
        if (p + i == end)
            return more;
        unsigned char c = p[i];
        bool ok = i < 5 ? c == (unsigned char)version[i]
                : i == 5 || i == 7 ? is_digit((char)c)
                : i == 6 ? c == '.'
                : i == 8 ? c == '\r'
                : c == '\n';
        if (!ok)
            return -400;
    }
    /* RFC 9112 §2.3: a higher minor version of 1.x is served as 1.1 (the
     * highest we speak); another major version is not ours. */
    if (p[5] != '1')
        return -505;
    out->minor_version = p[7] == '0' ? 0 : 1;
    p += 10;

    int err = parse_target(out);
    if (err)
        return err;

    /* field lines, up to the empty line */
    fields f;
    memset(&f, 0, sizeof(f));
    for (;;) {
        tern__http_header *hd = &headers[out->num_headers];
        int r = field_line(&p, end, out->num_headers == max_headers, hd);
        if (r == LINE_MORE)
            return more;
        if (r < 0)
            return r;
        if (r == LINE_END)
            break;
        out->num_headers++;
        err = on_field(out, &f, hd);
        if (err)
            return err;
    }
    err = finish(out, &f);
    if (err)
        return err;
    return (ssize_t)(p - start);
}

size_t tern__http_find_head_end(const char *buf, size_t len, size_t *scanned) {
    /* The terminator is found at its last byte, '\n'; the three bytes
     * before a '\n' are there whenever the '\n' is, so no position is
     * looked at twice across calls. */
    size_t pos = *scanned;
    while (pos < len) {
        const char *nl = memchr(buf + pos, '\n', len - pos);
        if (nl == NULL)
            break;
        size_t i = (size_t)(nl - buf);
        if (i >= 3 && buf[i - 1] == '\r' && buf[i - 2] == '\n' && buf[i - 3] == '\r') {
            *scanned = i + 1;
            return i + 1;
        }
        pos = i + 1;
    }
    *scanned = len;
    return 0;
}

const tern__http_header *tern__http_find_header(const tern__http_head *head, const char *name) {
    size_t n = strlen(name);
    for (size_t i = 0; i < head->num_headers; i++) {
        const tern__http_header *h = &head->headers[i];
        if (h->name_len == n && strncasecmp(h->name, name, n) == 0)
            return h;
    }
    return NULL;
}

bool tern__http_has_token(const char *value, size_t len, const char *token) {
    size_t tl = strlen(token);
    size_t i = 0;
    while (i < len) {
        while (i < len && (is_ows(value[i]) || value[i] == ','))
            i++;
        size_t s = i;
        while (i < len && value[i] != ',')
            i++;
        size_t e = i;
        while (e > s && is_ows(value[e - 1]))
            e--;
        if (e - s == tl && strncasecmp(value + s, token, tl) == 0)
            return true;
    }
    return false;
}

/* status-line = HTTP-version SP status-code SP [ reason-phrase ] CRLF
 * (RFC 9112 §4). The SP before an empty reason is also accepted missing,
 * as RFC 9112 asks clients to be lenient there; the reason itself is never
 * interpreted. */
ssize_t tern__http_parse_response(const char *buf, size_t len, size_t max_head,
                                  tern__http_response_head *out, tern__http_header *headers,
                                  size_t max_headers) {
    memset(out, 0, sizeof(*out));
    out->headers = headers;
    size_t avail = len < max_head ? len : max_head;
    const ssize_t more = len >= max_head ? -431 : 0;
    const uint8_t *const start = (const uint8_t *)buf;
    const uint8_t *const end = start + avail;
    const uint8_t *p = start;

    /* "HTTP/" DIGIT "." DIGIT SP 3DIGIT */
    static const char version[] = "HTTP/";
    for (size_t i = 0; i < 12; i++) {
        if (p + i == end)
            return more;
        unsigned char c = p[i];
        bool ok = i < 5 ? c == (unsigned char)version[i]
                : i == 5 || i == 7 || i >= 9 ? is_digit((char)c)
                : i == 6 ? c == '.'
                : c == ' ';
        if (!ok)
            return -400;
    }
    if (p[5] != '1')
        return -505;
    out->minor_version = p[7] == '0' ? 0 : 1;
    out->status = (p[9] - '0') * 100 + (p[10] - '0') * 10 + (p[11] - '0');
    if (out->status < 100)
        return -400;
    p += 12;
    if (p == end)
        return more;
    if (*p == ' ') {
        p++;
        const uint8_t *reason = p;
        /* reason-phrase = 1*( HTAB / SP / VCHAR / obs-text ) */
        while (p < end && (tern__http_is(*p, TERN__C_FIELD) || *p == ' '))
            p++;
        out->reason = (const char *)reason;
        out->reason_len = (size_t)(p - reason);
        if (p == end)
            return more;
    }
    if (*p != '\r')
        return -400;
    if (p + 1 == end)
        return more;
    if (p[1] != '\n')
        return -400;
    p += 2;
    for (;;) {
        tern__http_header *hd = &headers[out->num_headers];
        int r = field_line(&p, end, out->num_headers == max_headers, hd);
        if (r == LINE_MORE)
            return more;
        if (r < 0)
            return r;
        if (r == LINE_END)
            break;
        out->num_headers++;
    }
    return (ssize_t)(p - start);
}

const tern__http_header *tern__http_response_header(const tern__http_response_head *head,
                                                    const char *name) {
    tern__http_head h = {.headers = head->headers, .num_headers = head->num_headers};
    return tern__http_find_header(&h, name);
}
