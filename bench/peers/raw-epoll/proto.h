/* What raw-epoll and raw-uring share: the protocol, byte for byte, so the
 * two differ only in how bytes come and go. SHA-1 and base64 (for
 * Sec-WebSocket-Accept), a growable buffer, and the two parsers that answer
 * one HTTP request or one WebSocket frame in place (see raw-epoll/raw.c's
 * header for what they understand). Included by each peer's one source
 * file, which stays one cc command. */
#ifndef RAW_PROTO_H
#define RAW_PROTO_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MAX_FRAME (16u << 20)

/* ---- SHA-1 and base64, just for Sec-WebSocket-Accept ---------------------- */

static uint32_t rol(uint32_t x, int n) { return (x << n) | (x >> (32 - n)); }

static void sha1(const unsigned char *msg, size_t len, unsigned char out[20]) {
    uint32_t h[5] = {0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0};
    size_t total = ((len + 8) / 64 + 1) * 64;
    unsigned char *m = calloc(1, total);
    memcpy(m, msg, len);
    m[len] = 0x80;
    uint64_t bits = (uint64_t)len * 8;
    for (int i = 0; i < 8; i++)
        m[total - 1 - i] = (unsigned char)(bits >> (8 * i));
    for (size_t off = 0; off < total; off += 64) {
        uint32_t w[80];
        for (int i = 0; i < 16; i++)
            w[i] = (uint32_t)m[off + 4 * i] << 24 | (uint32_t)m[off + 4 * i + 1] << 16 |
                   (uint32_t)m[off + 4 * i + 2] << 8 | m[off + 4 * i + 3];
        for (int i = 16; i < 80; i++)
            w[i] = rol(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
        uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
        for (int i = 0; i < 80; i++) {
            uint32_t f, k;
            if (i < 20) { f = (b & c) | (~b & d); k = 0x5A827999; }
            else if (i < 40) { f = b ^ c ^ d; k = 0x6ED9EBA1; }
            else if (i < 60) { f = (b & c) | (b & d) | (c & d); k = 0x8F1BBCDC; }
            else { f = b ^ c ^ d; k = 0xCA62C1D6; }
            uint32_t t = rol(a, 5) + f + e + k + w[i];
            e = d; d = c; c = rol(b, 30); b = a; a = t;
        }
        h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e;
    }
    free(m);
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 4; j++)
            out[4 * i + j] = (unsigned char)(h[i] >> (24 - 8 * j));
}

static size_t base64(const unsigned char *in, size_t n, char *out) {
    static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < n ? (uint32_t)in[i + 1] << 8 : 0) |
                     (i + 2 < n ? in[i + 2] : 0);
        out[o++] = t[v >> 18 & 63];
        out[o++] = t[v >> 12 & 63];
        out[o++] = i + 1 < n ? t[v >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? t[v & 63] : '=';
    }
    out[o] = 0;
    return o;
}

/* ---- buffers and connections ---------------------------------------------- */

typedef struct {
    unsigned char *p;
    size_t len, cap;
} buf;

static void buf_reserve(buf *b, size_t extra) {
    if (b->len + extra <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra)
        cap *= 2;
    b->p = realloc(b->p, cap);
    if (b->p == NULL)
        abort();
    b->cap = cap;
}

static void buf_put(buf *b, const void *p, size_t n) {
    buf_reserve(b, n);
    memcpy(b->p + b->len, p, n);
    b->len += n;
}

/* A connection's protocol state, in each peer's connection struct. */
typedef struct {
    int ws;        /* 1 after the upgrade */
    int closing;   /* shut after the out buffer drains */
} raw_proto;

/* GET /echo?size=N's bytes (filled with 'x' by raw_proto_init). */
static unsigned char xs[1 << 20];

static void raw_proto_init(void) { memset(xs, 'x', sizeof(xs)); }

/* Finds header `name` (lower case, with the colon) in head[0..n); returns
 * its value (spaces skipped) and sets *vl, or NULL. */
static const char *header(const char *head, size_t n, const char *name, size_t *vl) {
    size_t nl = strlen(name);
    const char *end = head + n;
    for (const char *l = memchr(head, '\n', n); l != NULL && l + 1 + nl < end;
         l = memchr(l + 1, '\n', (size_t)(end - l - 1))) {
        if (strncasecmp(l + 1, name, nl) == 0) {
            const char *v = l + 1 + nl;
            while (v < end && *v == ' ')
                v++;
            const char *e = v;
            while (e < end && *e != '\r' && *e != '\n')
                e++;
            *vl = (size_t)(e - v);
            return v;
        }
    }
    return NULL;
}

static void http_reply(buf *out, const char *status, const char *type, const void *body,
                       size_t n) {
    char h[160];
    int hl = snprintf(h, sizeof(h), "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n\r\n",
                      status, type, n);
    buf_reserve(out, (size_t)hl + n);
    memcpy(out->p + out->len, h, (size_t)hl);
    memcpy(out->p + out->len + hl, body, n);
    out->len += (size_t)hl + n;
}

/* Handles one HTTP request at the front of data[0..n), answering into out;
 * returns bytes consumed, 0 when incomplete, -1 to close. */
static long http_one(raw_proto *c, const unsigned char *data, size_t n, buf *out) {
    const char *p = (const char *)data;
    const char *eoh = memmem(p, n, "\r\n\r\n", 4);
    if (eoh == NULL)
        return n > 65536 ? -1 : 0;
    size_t hl = (size_t)(eoh - p) + 4;
    size_t vl;
    const char *key = header(p, hl, "sec-websocket-key:", &vl);
    if (key != NULL && strncmp(p, "GET ", 4) == 0) {
        char cat[128];
        if (vl > 60)
            return -1;
        memcpy(cat, key, vl);
        memcpy(cat + vl, "258EAFA5-E914-47DA-95CA-C5AB0DC85B11", 36);
        unsigned char d[20];
        char acc[32];
        sha1((unsigned char *)cat, vl + 36, d);
        base64(d, 20, acc);
        char r[256];
        int rl = snprintf(r, sizeof(r),
                          "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                          "Connection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n", acc);
        buf_put(out, r, (size_t)rl);
        c->ws = 1;
        return (long)hl;
    }
    size_t body = 0;
    const char *cl = header(p, hl, "content-length:", &vl);
    if (cl != NULL)
        body = strtoul(cl, NULL, 10);
    if (body > MAX_FRAME)
        return -1;
    if (n < hl + body)
        return 0;
    if (strncmp(p, "GET /ping ", 10) == 0) {
        http_reply(out, "200 OK", "text/plain", "pong", 4);
    } else if (strncmp(p, "GET /echo?size=", 15) == 0) {
        size_t sz = strtoul(p + 15, NULL, 10);
        if (sz > sizeof(xs))
            http_reply(out, "400 Bad Request", "text/plain", "bad size", 8);
        else
            http_reply(out, "200 OK", "application/octet-stream", xs, sz);
    } else if (strncmp(p, "POST /echo ", 11) == 0) {
        http_reply(out, "200 OK", "application/octet-stream", p + hl, body);
    } else {
        http_reply(out, "404 Not Found", "text/plain", "not found", 9);
    }
    return (long)(hl + body);
}

/* Echoes one frame at the front of p[0..n) into out; returns bytes consumed,
 * 0 when incomplete, -1 to close. */
static long ws_one(raw_proto *c, const unsigned char *p, size_t n, buf *out) {
    if (n < 2)
        return 0;
    uint64_t len = p[1] & 0x7f;
    size_t h = 2;
    if (len == 126) {
        if (n < 4)
            return 0;
        len = (uint64_t)p[2] << 8 | p[3];
        h = 4;
    } else if (len == 127) {
        if (n < 10)
            return 0;
        len = 0;
        for (int i = 0; i < 8; i++)
            len = len << 8 | p[2 + i];
        h = 10;
    }
    if (len > MAX_FRAME || !(p[1] & 0x80))
        return -1;   /* clients must mask */
    if (n < h + 4 + len)
        return 0;
    const unsigned char *mask = p + h;
    const unsigned char *pay = p + h + 4;
    unsigned char b0 = p[0], op = b0 & 0x0f;
    if (op == 0x9)
        b0 = (b0 & 0xf0) | 0xA;   /* ping → pong */
    if (op == 0xA)
        return (long)(h + 4 + len);   /* unsolicited pong: nothing */
    buf_reserve(out, 10 + len);
    unsigned char *o = out->p + out->len;
    o[0] = b0;
    size_t oh;
    if (len < 126) {
        o[1] = (unsigned char)len;
        oh = 2;
    } else if (len < 65536) {
        o[1] = 126;
        o[2] = (unsigned char)(len >> 8);
        o[3] = (unsigned char)len;
        oh = 4;
    } else {
        o[1] = 127;
        for (int i = 0; i < 8; i++)
            o[2 + i] = (unsigned char)(len >> (56 - 8 * i));
        oh = 10;
    }
    unsigned char *d = o + oh;
    uint64_t m8;
    uint32_t m4;
    memcpy(&m4, mask, 4);
    m8 = (uint64_t)m4 << 32 | m4;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t v;
        memcpy(&v, pay + i, 8);
        v ^= m8;
        memcpy(d + i, &v, 8);
    }
    for (; i < len; i++)
        d[i] = pay[i] ^ mask[i & 3];
    out->len += oh + len;
    if (op == 0x8)
        c->closing = 1;
    return (long)(h + 4 + len);
}

#endif
