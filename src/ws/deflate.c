/* permessage-deflate (RFC 7692): the negotiation of §5 and §7.1, and the
 * per-message compression of §7.2 on zlib's raw deflate. */
#include "ws/deflate.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>

/* ---- negotiation ------------------------------------------------------ */

/* A cursor over the header value. */
typedef struct hcur {
    const char *s;
    size_t len;
    size_t pos;
} hcur;

static bool is_tchar(char c) {   /* RFC 9110 §5.6.2 token characters */
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
        return true;
    return c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static char ascii_lower(char c) { return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c; }

/* Token names compare case-insensitively, as HTTP tokens do elsewhere. */
static bool token_is(const char *tok, size_t n, const char *name) {
    size_t m = strlen(name);
    if (n != m)
        return false;
    for (size_t i = 0; i < n; i++)
        if (ascii_lower(tok[i]) != name[i])
            return false;
    return true;
}

static void skip_ows(hcur *c) {
    while (c->pos < c->len && (c->s[c->pos] == ' ' || c->s[c->pos] == '\t'))
        c->pos++;
}

static size_t take_token(hcur *c, const char **tok) {
    *tok = c->s + c->pos;
    size_t start = c->pos;
    while (c->pos < c->len && is_tchar(c->s[c->pos]))
        c->pos++;
    return c->pos - start;
}

/* Reads a quoted-string (RFC 9110 §5.6.4) with the cursor on its opening
 * quote, unescaped into val[0..cap) when it fits. Returns its unescaped
 * length (which may be more than cap), or -1 when it never closes. */
static long take_quoted(hcur *c, char *val, size_t cap) {
    size_t n = 0;
    c->pos++;   /* the opening quote */
    while (c->pos < c->len) {
        char ch = c->s[c->pos++];
        if (ch == '"')
            return (long)n;
        if (ch == '\\') {
            if (c->pos == c->len)
                return -1;
            ch = c->s[c->pos++];
        }
        if (n < cap)
            val[n] = ch;
        n++;
    }
    return -1;
}

/* After a syntax error: on to the next list element, stepping over
 * quoted strings so a comma inside one does not end the element early. */
static void skip_element(hcur *c) {
    char scratch[1];
    while (c->pos < c->len && c->s[c->pos] != ',') {
        if (c->s[c->pos] == '"') {
            if (take_quoted(c, scratch, 0) < 0)
                c->pos = c->len;
        } else {
            c->pos++;
        }
    }
}

/* One permessage-deflate offer as read from the header. */
typedef struct pmd_offer {
    bool server_nct, client_nct;
    bool has_server_bits, has_client_bits;
    int server_bits;   /* valid when has_server_bits */
    int client_bits;   /* 0 when client_max_window_bits came without a value */
} pmd_offer;

/* §7.1.2: "a decimal integer value without leading zeroes between 8 to 15
 * inclusive". Returns it, or -1. */
static int window_bits_value(const char *v, size_t n) {
    if (n == 1 && v[0] >= '8' && v[0] <= '9')
        return v[0] - '0';
    if (n == 2 && v[0] == '1' && v[1] >= '0' && v[1] <= '5')
        return 10 + (v[1] - '0');
    return -1;
}

/* Applies one parameter to the offer; false when §7.1 says to decline the
 * offer: an unknown name, a repeated one, a value where none belongs, a
 * missing or bad value where one is needed. */
static bool offer_param(pmd_offer *o, const char *name, size_t nlen, bool has_value,
                        const char *v, size_t vlen) {
    if (token_is(name, nlen, "server_no_context_takeover")) {
        if (o->server_nct || has_value)
            return false;
        o->server_nct = true;
        return true;
    }
    if (token_is(name, nlen, "client_no_context_takeover")) {
        if (o->client_nct || has_value)
            return false;
        o->client_nct = true;
        return true;
    }
    if (token_is(name, nlen, "server_max_window_bits")) {
        if (o->has_server_bits || !has_value)
            return false;
        o->server_bits = window_bits_value(v, vlen);
        o->has_server_bits = true;
        return o->server_bits > 0;
    }
    if (token_is(name, nlen, "client_max_window_bits")) {
        if (o->has_client_bits)
            return false;
        o->has_client_bits = true;
        o->client_bits = 0;
        if (has_value) {
            o->client_bits = window_bits_value(v, vlen);
            return o->client_bits > 0;
        }
        return true;
    }
    return false;
}

static int clamp_bits(int bits) {
    if (bits == 0)
        return 15;
    return bits < 8 ? 8 : bits > 15 ? 15 : bits;
}

/* What we agree to for a valid offer: every valid offer is acceptable,
 * since we can always compress with a smaller window than the client
 * allows and decompress with the window it announces. */
static int accept_offer(const pmd_offer *o, const tern__pmd_config *cfg, tern__pmd_params *out,
                        char *resp, size_t resp_cap) {
    tern__pmd_params p;
    p.server_no_context_takeover = o->server_nct || cfg->server_no_context_takeover;
    /* The client may name client_no_context_takeover in its offer as a
     * hint that it will not keep context anyway; saying so back costs
     * nothing and lets us drop the inflater's memory between messages. */
    p.client_no_context_takeover = o->client_nct || cfg->client_no_context_takeover;
    int ours = clamp_bits(cfg->server_max_window_bits);
    p.server_max_window_bits = o->has_server_bits && o->server_bits < ours ? o->server_bits : ours;
    /* With a value in the offer the client has promised that window; we
     * echo it (answering a value-less client_max_window_bits with none,
     * which means 15). Without the parameter we must not send one back. */
    p.client_max_window_bits = o->has_client_bits && o->client_bits ? o->client_bits : 15;

    char tmp[192];
    int n = snprintf(tmp, sizeof(tmp), "permessage-deflate%s%s",
                     p.server_no_context_takeover ? "; server_no_context_takeover" : "",
                     p.client_no_context_takeover ? "; client_no_context_takeover" : "");
    /* §7.1.2.1: an offered server_max_window_bits must be answered. */
    if (o->has_server_bits || p.server_max_window_bits < 15)
        n += snprintf(tmp + n, sizeof(tmp) - (size_t)n, "; server_max_window_bits=%d",
                      p.server_max_window_bits);
    if (o->has_client_bits && o->client_bits)
        n += snprintf(tmp + n, sizeof(tmp) - (size_t)n, "; client_max_window_bits=%d",
                      p.client_max_window_bits);
    if ((size_t)n >= resp_cap) {
        if (resp_cap)
            resp[0] = '\0';
        return -ENOSPC;
    }
    memcpy(resp, tmp, (size_t)n + 1);
    *out = p;
    return 1;
}

int tern__pmd_negotiate(const char *offer, size_t len, const tern__pmd_config *cfg,
                        tern__pmd_params *out, char *resp, size_t resp_cap) {
    if (resp_cap)
        resp[0] = '\0';
    if (offer == NULL || cfg == NULL || !cfg->enabled)
        return 0;
    hcur c = {offer, len, 0};
    for (;;) {
        /* extension-list = 1#extension: empty elements are allowed. */
        skip_ows(&c);
        while (c.pos < c.len && c.s[c.pos] == ',') {
            c.pos++;
            skip_ows(&c);
        }
        if (c.pos == c.len)
            return 0;

        const char *name;
        size_t nlen = take_token(&c, &name);
        bool ok = nlen > 0;
        bool pmd = ok && token_is(name, nlen, "permessage-deflate");
        pmd_offer o = {0};
        /* extension = extension-token *( ";" extension-param ) */
        while (ok) {
            skip_ows(&c);
            if (c.pos == c.len || c.s[c.pos] == ',')
                break;
            if (c.s[c.pos] != ';') {
                ok = false;
                break;
            }
            c.pos++;
            skip_ows(&c);
            const char *pname;
            size_t plen = take_token(&c, &pname);
            if (plen == 0) {
                ok = false;
                break;
            }
            skip_ows(&c);
            bool has_value = false, value_ok = true;
            const char *v = NULL;
            size_t vlen = 0;
            char qbuf[8];
            if (c.pos < c.len && c.s[c.pos] == '=') {
                c.pos++;
                skip_ows(&c);
                has_value = true;
                if (c.pos < c.len && c.s[c.pos] == '"') {
                    long q = take_quoted(&c, qbuf, sizeof(qbuf));
                    if (q < 0) {
                        ok = false;
                        break;
                    }
                    /* RFC 6455 §9.1: unescaped, the value must still be a
                     * token; none of ours is longer than 2 characters. */
                    v = qbuf;
                    vlen = (size_t)q;
                    value_ok = vlen > 0 && vlen <= sizeof(qbuf);
                    for (size_t k = 0; value_ok && k < vlen; k++)
                        value_ok = is_tchar(qbuf[k]);
                } else {
                    vlen = take_token(&c, &v);
                    if (vlen == 0) {
                        ok = false;
                        break;
                    }
                }
            }
            /* Another extension's parameters are its business; ours must
             * all be understood or the offer is declined (§5). */
            if (pmd && (!value_ok || !offer_param(&o, pname, plen, has_value, v, vlen)))
                pmd = false;
        }
        if (!ok) {
            skip_element(&c);
            continue;
        }
        if (pmd)
            return accept_offer(&o, cfg, out, resp, resp_cap);
    }
}

/* ---- the client's side ------------------------------------------------- */

int tern__pmd_client_offer(const tern__pmd_config *cfg, char *buf, size_t cap) {
    int bits = cfg->server_max_window_bits;
    int n = snprintf(buf, cap, "permessage-deflate; client_max_window_bits%s%s",
                     cfg->client_no_context_takeover ? "; client_no_context_takeover" : "",
                     cfg->server_no_context_takeover ? "; server_no_context_takeover" : "");
    if (n >= 0 && (size_t)n < cap && bits >= 9 && bits < 15)
        n += snprintf(buf + n, cap - (size_t)n, "; server_max_window_bits=%d", bits);
    return n < 0 || (size_t)n >= cap ? -ENOSPC : n;
}

int tern__pmd_client_accept(const char *resp, size_t len, const tern__pmd_config *cfg,
                            tern__pmd_params *out) {
    hcur c = {resp, len, 0};
    skip_ows(&c);
    const char *name;
    size_t nlen = take_token(&c, &name);
    if (!token_is(name, nlen, "permessage-deflate"))
        return -EPROTO;   /* an extension we never offered */
    pmd_offer o = {0};
    for (;;) {
        skip_ows(&c);
        if (c.pos == c.len)
            break;
        if (c.s[c.pos] != ';')
            return -EPROTO;   /* a second extension, or junk */
        c.pos++;
        skip_ows(&c);
        const char *pname, *v = NULL;
        size_t plen = take_token(&c, &pname), vlen = 0;
        if (plen == 0)
            return -EPROTO;
        skip_ows(&c);
        bool has_value = false;
        char qbuf[8];
        if (c.pos < c.len && c.s[c.pos] == '=') {
            c.pos++;
            skip_ows(&c);
            has_value = true;
            if (c.pos < c.len && c.s[c.pos] == '"') {
                long q = take_quoted(&c, qbuf, sizeof(qbuf));
                if (q < 0 || q > (long)sizeof(qbuf))
                    return -EPROTO;
                v = qbuf;
                vlen = (size_t)q;
            } else if ((vlen = take_token(&c, &v)) == 0) {
                return -EPROTO;
            }
        }
        if (!offer_param(&o, pname, plen, has_value, v, vlen))
            return -EPROTO;
    }
    /* §7.1.2.2: the server names our window with a value, or not at all. */
    if (o.has_client_bits && o.client_bits == 0)
        return -EPROTO;
    int asked = cfg->server_max_window_bits >= 9 && cfg->server_max_window_bits < 15
                    ? cfg->server_max_window_bits : 15;
    if (o.has_server_bits && o.server_bits > asked)
        return -EPROTO;
    out->server_no_context_takeover = o.server_nct;
    /* What we promised holds whether or not the server repeats it. */
    out->client_no_context_takeover = o.client_nct || cfg->client_no_context_takeover;
    /* Our decompressor takes any window up to 15; the server's is at most
     * what it said, so 15 is always right and never too small. */
    out->server_max_window_bits = 15;
    out->client_max_window_bits = o.has_client_bits ? o.client_bits : 15;
    return 1;
}

/* ---- compression ------------------------------------------------------ */

/* zlib's default level: a balance that suits chat-sized text; level 1
 * would trade about a tenth more bytes for roughly twice the speed. */
#define TERN__PMD_LEVEL 6

/* Invariants: `live` says zs holds zlib state (deflateInit2 done,
 * deflateEnd not yet); while it is false the struct owns no other memory.
 * window_bits is what zlib is given: 9..15. */
struct tern__pmd_deflater {
    z_stream zs;
    bool live;
    int window_bits;
    int mem_level;
};

/* Invariants: as for the deflater; `fresh` says the stream has taken no
 * input since it was started or restarted after a final block; `in_msg`
 * says the message in progress has had compressed bytes. */
struct tern__pmd_inflater {
    z_stream zs;
    bool live;
    bool fresh;
    bool in_msg;
    int window_bits;   /* 8..15 */
};

/* zlib refuses windowBits 8 for raw deflate (since 1.2.9; before, it
 * silently used 9). 9 is safe where 8 was agreed: zlib never emits a
 * distance beyond its window minus MIN_LOOKAHEAD (262 bytes), so with a
 * 512-byte window every match is within 250 bytes, inside the peer's 256. */
tern__pmd_deflater *tern__pmd_deflater_new(int window_bits, int mem_level) {
    tern__pmd_deflater *d = calloc(1, sizeof(*d));
    if (d == NULL)
        return NULL;
    d->window_bits = clamp_bits(window_bits);
    if (d->window_bits < 9)
        d->window_bits = 9;
    d->mem_level = mem_level == 0 ? 8 : mem_level < 1 ? 1 : mem_level > 9 ? 9 : mem_level;
    return d;
}

static void deflater_end(tern__pmd_deflater *d) {
    if (d->live)
        deflateEnd(&d->zs);
    d->live = false;
}

void tern__pmd_deflater_free(tern__pmd_deflater *d) {
    if (d == NULL)
        return;
    deflater_end(d);
    free(d);
}

static unsigned chunk(size_t n) { return n > UINT_MAX ? UINT_MAX : (unsigned)n; }

ssize_t tern__pmd_deflate(tern__pmd_deflater *d, const uint8_t *in, size_t len,
                          bool no_context_takeover, uint8_t **out) {
    *out = NULL;
    if (len > (size_t)SSIZE_MAX / 2)
        return -ENOMEM;
    if (!d->live) {
        memset(&d->zs, 0, sizeof(d->zs));
        if (deflateInit2(&d->zs, TERN__PMD_LEVEL, Z_DEFLATED, -d->window_bits, d->mem_level,
                         Z_DEFAULT_STRATEGY) != Z_OK)
            return -ENOMEM;
        d->live = true;
    }
    z_stream *zs = &d->zs;
    /* deflateBound is for a Z_FINISH stream; the sync flush adds at most a
     * few bytes, and the loop grows the buffer if ever it does not fit. */
    tern__bytes buf = {0};
    if (tern__bytes_reserve(&buf, (size_t)deflateBound(zs, (uLong)len) + 16) < 0) {
        deflater_end(d);
        return -ENOMEM;
    }
    const uint8_t *ip = in;
    size_t in_left = len;
    zs->avail_in = 0;
    /* All the input with Z_NO_FLUSH, then Z_SYNC_FLUSH until deflate leaves
     * room unused. The Z_NO_FLUSH call is made even for an empty message:
     * zlib ignores a sync flush that directly follows another one (the
     * last message's), and an empty message still needs its 00 byte. */
    int flush = Z_NO_FLUSH;
    for (;;) {
        if (zs->avail_in == 0 && in_left > 0) {
            zs->next_in = (Bytef *)ip;
            zs->avail_in = chunk(in_left);
            ip += zs->avail_in;
            in_left -= zs->avail_in;
        }
        if (buf.len == buf.cap && tern__bytes_reserve(&buf, 1) < 0)
            goto fail;
        zs->next_out = (Bytef *)buf.data + buf.len;
        zs->avail_out = chunk(buf.cap - buf.len);
        unsigned out_before = zs->avail_out;
        int r = deflate(zs, flush);
        buf.len += out_before - zs->avail_out;
        if (r != Z_OK && r != Z_BUF_ERROR)
            goto fail;
        if (flush == Z_NO_FLUSH) {
            /* deflate stops only when the input or the room runs out. */
            if (zs->avail_in == 0 && in_left == 0)
                flush = Z_SYNC_FLUSH;
            continue;
        }
        if (zs->avail_out != 0)
            break;   /* the flush is complete; otherwise grow and go on */
    }
    /* §7.2.1: the flush ends in an empty stored block, 00 00 FF FF, which
     * is not sent; the receiver puts it back. */
    static const uint8_t tail[4] = {0x00, 0x00, 0xFF, 0xFF};
    if (buf.len < 4 || memcmp(buf.data + buf.len - 4, tail, 4) != 0) {
        tern__bytes_free(&buf);
        deflater_end(d);
        return -EIO;
    }
    buf.len -= 4;
    if (no_context_takeover)
        deflater_end(d);   /* the next message starts afresh, and idle costs nothing */
    if (buf.cap - buf.len > 4096) {   /* do not hold on to deflateBound's slack */
        char *nb = realloc(buf.data, buf.len ? buf.len : 1);
        if (nb != NULL)
            buf.data = nb;
    }
    *out = (uint8_t *)buf.data;
    return (ssize_t)buf.len;

fail:
    tern__bytes_free(&buf);
    deflater_end(d);
    return -ENOMEM;
}

/* ---- decompression ---------------------------------------------------- */

tern__pmd_inflater *tern__pmd_inflater_new(int window_bits) {
    tern__pmd_inflater *i = calloc(1, sizeof(*i));
    if (i == NULL)
        return NULL;
    i->window_bits = clamp_bits(window_bits);
    return i;
}

static void inflater_end(tern__pmd_inflater *i) {
    if (i->live)
        inflateEnd(&i->zs);
    i->live = false;
}

void tern__pmd_inflater_free(tern__pmd_inflater *i) {
    if (i == NULL)
        return;
    inflater_end(i);
    free(i);
}

/* A final block (BFINAL, RFC 7692 §7.2.3.4) ends zlib's stream but not
 * the connection's: what follows is a new stream that may still refer
 * back into the window (§7.2.2 keeps one window across messages, not one
 * per DEFLATE stream). inflateResetKeep, exported by zlib for this though
 * not in its manual, restarts the stream and keeps the window in O(1).
 * Copying the window out and back as a dictionary would cost up to 64 KiB
 * per restart, and a final block is 2 bytes: an amplifier for anyone
 * sending a message of nothing but final blocks. */
static int inflate_restart(tern__pmd_inflater *i) {
    if (inflateResetKeep(&i->zs) != Z_OK)
        return -EINVAL;
    i->fresh = true;
    return 0;
}

/* Makes room for output: the buffer grows as every tern__bytes does, but
 * never past `limit` (max_len + 1: one byte more than allowed is how an
 * overflow is seen), so this is not tern__bytes_reserve: a bomb must not
 * get a doubled buffer it is not allowed to fill. Sets *room (0 when at
 * the limit); returns 0 or -ENOMEM. */
static int out_room(tern__bytes *out, size_t limit, size_t *room) {
    size_t cap = out->cap < limit ? out->cap : limit;
    *room = 0;
    if (out->len < cap) {
        *room = cap - out->len;
        return 0;
    }
    if (out->cap >= limit)
        return 0;
    size_t ncap = tern__bytes_grow_cap(out->cap, out->len + 1);
    if (ncap > limit)
        ncap = limit;
    char *nb = realloc(out->data, ncap);
    if (nb == NULL)
        return -ENOMEM;
    out->data = nb;
    out->cap = ncap;
    *room = ncap - out->len;
    return 0;
}

/* Inflates data[0..n) into the buffer. is_tail: this is the 00 00 FF FF
 * we append, of which whatever follows the end of a final block is
 * dropped. */
static int inflate_bytes(tern__pmd_inflater *i, const uint8_t *data, size_t n, bool is_tail,
                         tern__bytes *out, size_t max_len) {
    /* Nothing can be pending from before: each call ends only when inflate
     * has stopped for lack of input with room to spare. */
    if (n == 0)
        return 0;
    z_stream *zs = &i->zs;
    size_t limit = max_len < SIZE_MAX ? max_len + 1 : SIZE_MAX;
    const uint8_t *p = data;
    size_t left = n;
    zs->avail_in = 0;
    for (;;) {
        if (zs->avail_in == 0 && left > 0) {
            zs->next_in = (Bytef *)p;
            zs->avail_in = chunk(left);
            p += zs->avail_in;
            left -= zs->avail_in;
        }
        size_t room;
        if (out_room(out, limit, &room) < 0)
            return -ENOMEM;
        if (room == 0)
            return -EMSGSIZE;   /* out->len >= limit: caught below before it gets here */
        zs->next_out = (Bytef *)out->data + out->len;
        zs->avail_out = chunk(room);
        unsigned in_before = zs->avail_in, out_before = zs->avail_out;
        int r = inflate(zs, Z_SYNC_FLUSH);
        out->len += out_before - zs->avail_out;
        if (zs->avail_in != in_before)
            i->fresh = false;
        if (out->len > max_len)
            return -EMSGSIZE;
        if (r == Z_STREAM_END) {
            if (is_tail) {
                left = 0;   /* the block ended inside our tail: the rest is ours */
                zs->avail_in = 0;
            }
            int rr = inflate_restart(i);
            if (rr < 0)
                return rr;
            if (left == 0 && zs->avail_in == 0)
                return 0;
            continue;
        }
        if (r == Z_MEM_ERROR)
            return -ENOMEM;
        if (r != Z_OK && r != Z_BUF_ERROR)
            return -EINVAL;   /* Z_DATA_ERROR, or a dictionary asked of a raw stream */
        /* Done when all input is in and inflate stopped for lack of input
         * rather than of room (room left over means nothing is pending). */
        if (zs->avail_in == 0 && left == 0 && zs->avail_out != 0)
            return 0;
    }
}

int tern__pmd_inflate(tern__pmd_inflater *i, const uint8_t *in, size_t len, bool last,
                      bool no_context_takeover, tern__bytes *out, size_t max_len) {
    if (out->len > max_len)
        return -EMSGSIZE;
    if (len == 0 && !last)
        return 0;
    if (!i->live) {
        memset(&i->zs, 0, sizeof(i->zs));
        int r = inflateInit2(&i->zs, -i->window_bits);
        if (r != Z_OK)
            return r == Z_MEM_ERROR ? -ENOMEM : -EINVAL;
        i->live = true;
        i->fresh = true;
    }
    if (len > 0)
        i->in_msg = true;
    int r = inflate_bytes(i, in, len, false, out, max_len);
    if (r == 0 && last) {
        /* §7.2.2: the sender dropped the sync flush's 00 00 FF FF; put it
         * back. Not when the message ended exactly with a final block,
         * where it would start a stream of its own, nor when the message
         * had no bytes at all: §7.2.3.6 says an empty message is sent as
         * 00, but nothing to decode can only mean nothing, and feeding the
         * tail alone would leave the stream inside a stored block. */
        static const uint8_t tail[4] = {0x00, 0x00, 0xFF, 0xFF};
        if (!i->fresh && i->in_msg) {
            r = inflate_bytes(i, tail, sizeof(tail), true, out, max_len);
            /* Then the stream must be between blocks: otherwise the message
             * was cut short, and with context takeover the next one would
             * be read as the rest of this block. */
            if (r == 0 && !i->fresh && !(i->zs.data_type & 128))
                r = -EINVAL;
        }
    }
    if (last || r != 0)
        i->in_msg = false;
    if (r != 0 || (last && no_context_takeover))
        inflater_end(i);   /* after an error the stream is of no further use */
    return r;
}
