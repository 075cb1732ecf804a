/* tern serve's pub/sub routes:
 *
 *   GET  /pubsub          WebSocket, JSON text messages (one object each):
 *     client -> server
 *       {"op":"subscribe","topic":"T"}
 *       {"op":"subscribe","topic":"T","epoch":"E","after":"N"}  resuming
 *                                                      after message N of
 *                                                      epoch E (as the last
 *                                                      ack and message said)
 *       {"op":"subscribe","topic":"T","snapshot":true}  starting with the
 *                                                      latest message of
 *                                                      each key (from T's
 *                                                      history: none when
 *                                                      T has none; those
 *                                                      without a key count
 *                                                      as one), oldest
 *                                                      first, then live; a
 *                                                      page shows every key
 *                                                      at once. With a
 *                                                      resume it changes
 *                                                      nothing (a gap gets
 *                                                      the same anyway)
 *       {"op":"unsubscribe","topic":"T"}
 *       {"op":"limits"}                               what this connection
 *                                                      may send (tern-client
 *                                                      asks first, and paces
 *                                                      itself to the rate)
 *       {"op":"presence","topic":"T"}, {"op":"presence_stats","topic":"T"}
 *                                                      who is subscribed to T,
 *                                                      where its rule says
 *                                                      presence=on; and the
 *                                                      joins and leaves pushed
 *                                                      with join-leave=on
 *                                                      (serve_presence.h)
 *       {"op":"publish","topic":"T","data":"..."}     (to every subscriber,
 *                                                      the sender too)
 *       {"op":"publish","topic":"T","key":"K","data":"..."}  the same, K its
 *                                                      key for conflation
 *     server -> client
 *       {"topic":"T","seq":N,"data":"..."}            a message of T
 *       {"topic":"T","seq":N,"key":"K","data":"..."}  one published with
 *                                                      key K (the feed's
 *                                                      too: the instrument)
 *       {"ok":"subscribe","topic":"T","epoch":"E","seq":N}
 *                                                      E: the topic's epoch
 *                                                      (16 hex digits), N:
 *                                                      its last message's seq
 *                                                      (after a resume that
 *                                                      was ahead of this
 *                                                      node: the client's
 *                                                      "after", where its
 *                                                      stream goes on)
 *       ... ,"resumed":true|false,"replayed":K}        after a resume: the K
 *                                                      messages missed came
 *                                                      just before this ack
 *                                                      (true), or the latest
 *                                                      message of each key
 *                                                      (false: a gap)
 *       ... ,"snapshot":K}                             after "snapshot":true
 *                                                      without a resume: the
 *                                                      K messages of the
 *                                                      snapshot came just
 *                                                      before this ack
 *       {"ok":"subscribe","topic":"T"}                 already subscribed
 *       {"ok":"unsubscribe","topic":"T"}
 *       {"ok":"limits","rate":R,"max_message":M}       R: --pubsub-rate now
 *                                                      (messages a second,
 *                                                      each op one, a burst
 *                                                      of R; 0: no limit),
 *                                                      M: the largest
 *                                                      message (bytes)
 *       {"ok":"publish","topic":"T","seq":N}           N is 0 when T had no
 *                                                      subscriber, or when
 *                                                      Redis numbers it
 *       {"error":"...","op":OP}                        bad input; OP is the
 *                                                      op sent, or null
 *       {"event":"unsubscribed","topic":"T"}           the server API ended
 *                                                      the subscription
 *                                                      (serve_api.c)
 *     errors: "bad json" (not one flat object of string values, "snapshot"'s
 *     true or false, or binary),
 *     "unknown op", "missing topic", "bad topic" (empty, or \u0000 or a lone
 *     surrogate in it), "topic too long" (over 256 bytes), "missing data",
 *     "too many subscriptions" (1024 per connection), "not subscribed",
 *     "forbidden" (the route's on_subscribe or on_publish refused),
 *     "bad key" (empty, or as a bad topic), "key too long" (over 128 bytes),
 *     "bad resume" (epoch without after or the other way round, an epoch
 *     not 1 to 16 hex digits or 0, an after not a decimal number), "rate
 *     limit" (over --pubsub-rate messages a second: the message is not
 *     done; more than that many refused in a row closes with 1008).
 *     A message over --pubsub-max-message closes with 1009.
 *     With a --token-* flag (serve_tokens.c): a token on the upgrade
 *     (?token= or Authorization: Bearer; a bad one: 401) says what the
 *     connection may subscribe (besides "market" and "stats") and publish
 *     ("forbidden" otherwise); at its exp the connection closes with 4001
 *     "token expired" unless {"op":"refresh","token":"..."} replaced it
 *     first: {"ok":"refresh","exp":N}, or "bad token" / "missing token".
 *     With --proxy-connect (serve_proxy.c) the connection reads nothing
 *     until the application's backend lets it in (and may give it a user
 *     and info); closed with 4403 when refused, 1013 without an answer.
 *     An "expire_at" in its answer closes it then with 4001 "expired",
 *     unless --proxy-refresh's backend extends it.
 *     With --proxy-subscribe or --proxy-publish the
 *     application's backend decides each subscribe or publish instead of
 *     the rules: the operation is answered once the backend has ("forbidden"
 *     with ,"topic":T,"code":N,"message":M when it refuses), or with "proxy
 *     timeout", "proxy unavailable", "proxy error", "proxy bad answer" or
 *     "proxy busy" (--proxy-max-inflight requests in flight already).
 *   GET  /sse             the topics of /pubsub as Server-Sent Events, under
 *                         the same rules and tokens (app_serve_pubsub_may)
 *                         and backend proxy: serve_sse.c
 *   POST /publish/:topic  (the admin listener's: app_serve_publish)
 *                         the body (UTF-8) published as data to topic;
 *                         200 {"seq":N,"subscribers":M} (M: over all threads)
 *   (with --bench-routes, the /fanout routes too: serve_fanout.c)
 *
 * A slow /pubsub subscriber (more than --pubsub-max-backlog bytes waiting)
 * has messages dropped, is closed with 1008 or 1013, or has them conflated
 * by key (--pubsub-policy, --pubsub-topic-policy). */
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "app/app.h"
#include "app/json.h"
#include "app/presence.h"
#include "app/serve_presence.h"
#include "app/serve_proxy.h"
#include "app/serve_tokens.h"
#include "app/topic_rules.h"
#include "loop/hex.h"
#include "tern/tern.h"

/* ---- a JSON scanner for {"key":"string",...} --------------------------- */

typedef struct tok {
    const char *p;   /* the string token, quotes included; NULL when absent */
    size_t n;
} tok;

static const char *skip_ws(const char *s, const char *end) {
    while (s < end && (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r'))
        s++;
    return s;
}

/* A string token at *s: no raw control characters, only valid escapes.
 * (The message is text: the ws layer checked its UTF-8.) */
static bool scan_string(const char **s, const char *end, tok *t) {
    const char *p = *s;
    if (p >= end || *p != '"')
        return false;
    for (p++; p < end; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '"') {
            t->p = *s;
            t->n = (size_t)(p + 1 - *s);
            *s = p + 1;
            return true;
        }
        if (c < 0x20)
            return false;
        if (c == '\\') {
            if (++p >= end)
                return false;
            switch (*p) {
            case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
                break;
            case 'u':
                if (end - p < 5)
                    return false;
                for (int i = 1; i <= 4; i++)
                    if (tern__hex_value(p[i]) < 0)
                        return false;
                p += 4;
                break;
            default:
                return false;
            }
        }
    }
    return false;
}

/* The fields of a client's message that mean something (absent: p NULL). */
typedef struct fields {
    tok op, topic, data, key, epoch, after, token, limit;
    int snapshot;   /* "snapshot": -1 absent, 0 false, 1 true */
} fields;

/* A literal true or false at *s, for the one field that takes a boolean. */
static bool scan_bool(const char **s, const char *end, int *out) {
    if (end - *s >= 4 && !memcmp(*s, "true", 4)) {
        *s += 4;
        *out = 1;
        return true;
    }
    if (end - *s >= 5 && !memcmp(*s, "false", 5)) {
        *s += 5;
        *out = 0;
        return true;
    }
    return false;
}

/* One flat object whose values are all strings, but "snapshot"'s, a
 * boolean; the fields are picked out (a repeated key: the last one). */
static bool parse_msg(const char *d, size_t n, fields *f) {
    const char *s = skip_ws(d, d + n), *end = d + n;
    *f = (fields){.snapshot = -1};
    if (s >= end || *s++ != '{')
        return false;
    s = skip_ws(s, end);
    if (s < end && *s == '}')
        return skip_ws(s + 1, end) == end;
    for (;;) {
        tok k, v;
        if (!scan_string(&s, end, &k))
            return false;
        s = skip_ws(s, end);
        if (s >= end || *s++ != ':')
            return false;
        s = skip_ws(s, end);
        if (k.n == 10 && !memcmp(k.p, "\"snapshot\"", 10)) {
            if (!scan_bool(&s, end, &f->snapshot))
                return false;
            goto next;
        }
        if (!scan_string(&s, end, &v))
            return false;
#define IS(name) (k.n == sizeof(name) + 1 && !memcmp(k.p + 1, name, sizeof(name) - 1))
        if (IS("op"))
            f->op = v;
        else if (IS("topic"))
            f->topic = v;
        else if (IS("data"))
            f->data = v;
        else if (IS("key"))
            f->key = v;
        else if (IS("epoch"))
            f->epoch = v;
        else if (IS("after"))
            f->after = v;
        else if (IS("token"))
            f->token = v;
        else if (IS("limit"))
            f->limit = v;
#undef IS
    next:
        s = skip_ws(s, end);
        if (s < end && *s == ',') {
            s = skip_ws(s + 1, end);
            continue;
        }
        if (s < end && *s == '}')
            return skip_ws(s + 1, end) == end;
        return false;
    }
}

static size_t put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | cp >> 6); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F)); return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18); o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F)); return 4;
}

static uint32_t hex4(const char *p) {
    return (uint32_t)(tern__hex_value(p[0]) << 12 | tern__hex_value(p[1]) << 8 | tern__hex_value(p[2]) << 4 | tern__hex_value(p[3]));
}

/* Decodes a scanned string token into out (NUL-terminated). Returns its
 * length, -1 when it holds \u0000 or a lone surrogate, -2 when over cap. */
static long decode(tok t, char *out, size_t cap) {
    size_t o = 0;
    for (size_t i = 1; i + 1 < t.n; i++) {
        char buf[4];
        size_t k = 1;
        buf[0] = t.p[i];
        if (t.p[i] == '\\') {
            char e = t.p[++i];
            switch (e) {
            case 'b': buf[0] = '\b'; break;
            case 'f': buf[0] = '\f'; break;
            case 'n': buf[0] = '\n'; break;
            case 'r': buf[0] = '\r'; break;
            case 't': buf[0] = '\t'; break;
            case 'u': {
                uint32_t cp = hex4(t.p + i + 1);
                i += 4;
                if (cp == 0 || (cp >= 0xDC00 && cp <= 0xDFFF))
                    return -1;
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    if (i + 6 >= t.n || t.p[i + 1] != '\\' || t.p[i + 2] != 'u')
                        return -1;
                    uint32_t lo = hex4(t.p + i + 3);
                    if (lo < 0xDC00 || lo > 0xDFFF)
                        return -1;
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    i += 6;
                }
                k = put_utf8(buf, cp);
                break;
            }
            default: buf[0] = e; break;   /* " \ / */
            }
        }
        if (o + k > cap)
            return -2;
        memcpy(out + o, buf, k);
        o += k;
    }
    out[o] = '\0';
    return (long)o;
}

/* Appends s[0..n) as a JSON string (quotes included) to out; returns the
 * new length. out has room for 6n + 2 more bytes. */
static size_t put_json_string(char *out, size_t o, const char *s, size_t n) {
    out[o++] = '"';
    o += app_json_escape(out + o, APP_JSON_ESCAPE_MAX * n + 1, s, n);
    out[o++] = '"';
    return o;
}

static bool utf8_valid(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        size_t k;
        uint32_t cp, min;
        if (c < 0x80) { i++; continue; }
        else if ((c & 0xE0) == 0xC0) { k = 1; cp = c & 0x1F; min = 0x80; }
        else if ((c & 0xF0) == 0xE0) { k = 2; cp = c & 0x0F; min = 0x800; }
        else if ((c & 0xF8) == 0xF0) { k = 3; cp = c & 0x07; min = 0x10000; }
        else return false;
        for (size_t j = 1; j <= k; j++) {
            if (i + j >= n || (s[i + j] & 0xC0) != 0x80)
                return false;
            cp = cp << 6 | (s[i + j] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += k + 1;
    }
    return true;
}

/* ---- /pubsub ------------------------------------------------------------ */

/* Publishes {"topic":T,"seq":N,"data":D}, D a JSON string token (quotes
 * included), N filled in by the pub/sub layer; with a key K,
 * {"topic":T,"seq":N,"key":K,"data":D}, so that a subscriber can keep the
 * latest of each key without knowing what the data holds. On behalf of ws
 * when it is not NULL (a client's publish: its route's on_publish
 * decides), else as the server (srv). */
static int64_t publish_json(tern_server *srv, tern_ws *ws, const char *topic, size_t tlen,
                            const char *key, const char *d, size_t dlen) {
    size_t klen = key ? strlen(key) : 0;
    size_t cap = 16 + 6 * tlen + 2 + 16 + 8 + 6 * klen + 2 + dlen + 2;
    char *m = malloc(cap);
    if (m == NULL)
        return -ENOMEM;
    size_t o = 0;
    memcpy(m, "{\"topic\":", 9);
    o = put_json_string(m, 9, topic, tlen);
    memcpy(m + o, ",\"seq\":", 7);
    o += 7;
    size_t seq_at = o;
    if (key) {
        memcpy(m + o, ",\"key\":", 7);
        o = put_json_string(m, o + 7, key, klen);
    }
    memcpy(m + o, ",\"data\":", 8);
    o += 8;
    memcpy(m + o, d, dlen);
    o += dlen;
    m[o++] = '}';
    /* The admin API's publish (no ws) answers before the fan-out: its
     * subscribers here get the message at the loop's next turn. */
    int64_t seq = ws ? tern_ws_publish(ws, topic, key, m, o, TERN_WS_TEXT, seq_at)
                     : tern_publish_later(srv, topic, key, m, o, TERN_WS_TEXT, seq_at);
    free(m);
    return seq;
}

static void reply_error(tern_ws *ws, const char *why, tok op) {
    char out[600];
    int n;
    if (op.p && op.n < 300)
        n = snprintf(out, sizeof(out), "{\"error\":\"%s\",\"op\":%.*s}", why, (int)op.n, op.p);
    else
        n = snprintf(out, sizeof(out), "{\"error\":\"%s\",\"op\":null}", why);
    tern_ws_send(ws, out, (size_t)n, TERN_WS_TEXT);
}

static void reply_ok(tern_ws *ws, const char *op, const char *topic, size_t tlen, int64_t seq) {
    char out[64 + 6 * TERN_TOPIC_MAX];
    int n = snprintf(out, sizeof(out), "{\"ok\":\"%s\",\"topic\":", op);
    size_t o = put_json_string(out, (size_t)n, topic, tlen);
    if (seq >= 0)
        o += (size_t)snprintf(out + o, sizeof(out) - o, ",\"seq\":%lld", (long long)seq);
    out[o++] = '}';
    tern_ws_send(ws, out, o, TERN_WS_TEXT);
}

/* A string token of 1 to 16 hex digits (epoch) or 1 to 20 decimal
 * digits (after), as a number. */
static bool tok_number(tok t, int base, uint64_t *out) {
    size_t n = t.n - 2, max = base == 16 ? 16 : 20;
    if (t.p == NULL || n == 0 || n > max)
        return false;
    uint64_t v = 0;
    for (size_t i = 1; i <= n; i++) {
        int d = base == 16 ? tern__hex_value(t.p[i]) : (t.p[i] >= '0' && t.p[i] <= '9' ? t.p[i] - '0' : -1);
        if (d < 0 || (base == 10 && v > (UINT64_MAX - (uint64_t)d) / 10))
            return false;
        v = v * (uint64_t)base + (uint64_t)d;
    }
    *out = v;
    return true;
}

/* {"ok":"subscribe","topic":T,"epoch":"E","seq":N[,"resumed":B,"replayed":K]} */
static void reply_subscribed(tern_ws *ws, const char *topic, size_t tlen, const tern_resume *r,
                             bool asked, bool snapshot) {
    char out[160 + 6 * TERN_TOPIC_MAX];
    int n = snprintf(out, sizeof(out), "{\"ok\":\"subscribe\",\"topic\":");
    size_t o = put_json_string(out, (size_t)n, topic, tlen);
    o += (size_t)snprintf(out + o, sizeof(out) - o, ",\"epoch\":\"%016" PRIx64 "\",\"seq\":%" PRIu64,
                          r->epoch, r->seq);
    if (asked)
        o += (size_t)snprintf(out + o, sizeof(out) - o, ",\"resumed\":%s,\"replayed\":%" PRIu64,
                              r->resumed ? "true" : "false", r->replayed);
    else if (snapshot)
        o += (size_t)snprintf(out + o, sizeof(out) - o, ",\"snapshot\":%" PRIu64, r->replayed);
    out[o++] = '}';
    tern_ws_send(ws, out, o, TERN_WS_TEXT);
}

/* ---- limits: message size and operation rate ---------------------------- */

static app_serve_pubsub_limits limits;   /* set once, in setup, before any loop runs */
/* limits.rate, which SIGHUP may change while the loops run: read once per
 * use. Every /pubsub connection has a bucket, even one opened while the
 * rate was 0 (unlimited), so that all follow a new rate from their next
 * message. */
static _Atomic uint32_t live_rate;

void app_serve_pubsub_set_rate(uint32_t rate) {
    atomic_store_explicit(&live_rate, rate, memory_order_relaxed);
}

static uint32_t rate_now(void) {
    return atomic_load_explicit(&live_rate, memory_order_relaxed);
}
static _Atomic uint64_t n_rate_refused, n_rate_closed, n_too_big, n_forbid_sub, n_forbid_pub;
/* tern serve's topic rules: never changed once published here; a SIGHUP
 * may publish others (app_serve_pubsub_swap_rules). Read once per
 * subscribe or publish, within one callback. */
static _Atomic(const app_topic_rules *) rules;

const app_topic_rules *app_serve_pubsub_swap_rules(const app_topic_rules *r) {
    return atomic_exchange_explicit(&rules, r, memory_order_acq_rel);
}

const app_topic_rules *app_serve_pubsub_rules(void) {
    return atomic_load_explicit(&rules, memory_order_acquire);
}

/* A /pubsub connection's token bucket: `rate` tokens a second, at most
 * `rate` held (the burst), one taken per message. Invariants: tokens <=
 * rate * 1000 (tokens are kept in thousandths, so that a refill of a few
 * milliseconds is not rounded away); strikes counts the messages refused
 * since the bucket was last full, and once over rate the connection is
 * closing. */
typedef struct ps_bucket {
    uint64_t tokens;
    uint64_t stamp;        /* the loop's clock (ms) of the last refill */
    uint32_t strikes;
    uint32_t rate;         /* the rate tokens count at; another one refills it */
    bool closing;          /* closed with 1008 for its rate */
    app_token_conn *auth;   /* with tokens on (serve_tokens.h) */
    app_pres_conn *pres;    /* its presence and join/leave topics (serve_presence.h) */
    app_proxy_req *proxy;   /* its operations waiting for the backend (serve_proxy.h) */
    app_proxy_clock clock;  /* the expiry the backend gave (--proxy-connect), and its refresh */
    /* the backend's "transport": "websocket", or "http_stream" for an
     * /http-stream session's relay (app_serve_stream_relay) */
    const char *transport;
    /* The topic the backend has just allowed, while its subscribe or
     * publish runs (the library asks the route's hook again): NULL
     * otherwise. */
    const char *grant;
    size_t grant_len;
    bool grant_publish;
} ps_bucket;

static int (*pubsub_upgrade_next)(tern_http_req *, void **, void *);

static int pubsub_upgrade(tern_http_req *req, void **conn_user, void *user) {
    int r = pubsub_upgrade_next(req, conn_user, user);
    if (r != 0)
        return r;
    app_token_conn *auth = NULL;
    if (app_serve_tokens_on() && (r = app_token_conn_upgrade(req, &auth)) != 0)
        return r;
    ps_bucket *b = malloc(sizeof(*b));
    if (b == NULL) {
        app_token_conn_free(auth);
        return 503;
    }
    /* Full: a connection starts with its burst. */
    uint32_t rate = rate_now();
    *b = (ps_bucket){.tokens = (uint64_t)rate * 1000, .rate = rate,
                     .stamp = tern_loop_now(tern_http_req_loop(req)), .auth = auth,
                     .transport = app_serve_stream_relay(req) ? "http_stream" : "websocket"};
    *conn_user = b;
    return 0;
}

static void pubsub_upgrade_failed(void *conn_user, int status, void *user) {
    (void)status, (void)user;
    if (conn_user)
        app_token_conn_free(((ps_bucket *)conn_user)->auth);
    free(conn_user);
}

static void ask_connect(tern_ws *ws, ps_bucket *b);

/* With tokens on: the connection's rights decide (serve_tokens.c); with
 * --proxy-connect, the backend lets it in first. */
static void pubsub_open(tern_ws *ws, void *user) {
    (void)user;
    ps_bucket *b = tern_ws_user(ws);
    app_token_conn_open(b ? b->auth : NULL, ws);
    if (b && app_serve_proxy_on(APP_PROXY_CONNECT))
        ask_connect(ws, b);
}

/* ws as presence sees it (serve_presence.h): its server publishes its
 * join and leave, and it hears the others'. */
static app_pres_who pres_who(tern_ws *ws) {
    return (app_pres_who){.srv = tern_ws_server(ws), .ws = ws};
}

/* The topic's rule now (NULL: none). */
static const app_topic_rule *rule_of(const char *topic, size_t len) {
    return app_rules_match(atomic_load_explicit(&rules, memory_order_acquire), topic, len);
}

/* The topic's rule decides (topic_rules.h); "token" asks the
 * connection's token (serve_tokens.c), and no rule means "token". Asked
 * once per subscribe or publish (and presence request), never per
 * delivered message. Join and leave are the server's to say: only its
 * own subscribe to their topic goes through. */
static bool allowed_auth(const app_token_conn *auth, const char *topic, size_t len,
                         bool publish) {
    if (app_presence_events_topic(topic, len))
        return !publish && app_presence_events_subscribing();
    const app_topic_rule *r = rule_of(topic, len);
    app_access a = !r ? APP_ACCESS_TOKEN : publish ? r->publish : r->subscribe;
    return a == APP_ACCESS_ANYONE ||
           (a == APP_ACCESS_TOKEN && (publish ? app_token_conn_may_publish(auth, topic, len)
                                              : app_token_conn_may_subscribe(auth, topic, len)) == 0) ||
           (a == APP_ACCESS_USER && app_rules_user_named(topic, len, app_token_conn_sub(auth)));
}

static bool allowed(tern_ws *ws, const char *topic, size_t len, bool publish) {
    ps_bucket *b = tern_ws_user(ws);
    return allowed_auth(b ? b->auth : NULL, topic, len, publish);
}

const app_topic_rule *app_serve_pubsub_rule(const char *topic, size_t len) {
    return rule_of(topic, len);
}

/* allowed_auth(), a refusal counted: /pubsub's and /sse's one decision. */
int app_serve_pubsub_may(const app_token_conn *auth, const char *topic, size_t len,
                         bool publish) {
    if (allowed_auth(auth, topic, len, publish))
        return 0;
    atomic_fetch_add_explicit(publish ? &n_forbid_pub : &n_forbid_sub, 1, memory_order_relaxed);
    return -EACCES;
}

static int may(tern_ws *ws, const char *topic, size_t len, bool publish) {
    ps_bucket *b = tern_ws_user(ws);
    if (b && b->grant && b->grant_publish == publish && b->grant_len == len &&
        !memcmp(b->grant, topic, len))
        return 0;   /* the backend decided (serve_proxy.c) */
    return app_serve_pubsub_may(b ? b->auth : NULL, topic, len, publish);
}

static int pubsub_may_subscribe(tern_ws *ws, const char *topic, size_t len, void *user) {
    (void)user;
    return may(ws, topic, len, false);
}

static int pubsub_may_publish(tern_ws *ws, const char *topic, size_t len, void *user) {
    (void)user;
    return may(ws, topic, len, true);
}

static void pubsub_close(tern_ws *ws, int code, const char *reason, size_t len, void *user) {
    (void)reason, (void)len, (void)user;
    /* on_close has the code we sent: 1009 is only ever the size limit's */
    if (code == TERN_WS_TOO_BIG)
        atomic_fetch_add_explicit(&n_too_big, 1, memory_order_relaxed);
    ps_bucket *b = tern_ws_user(ws);
    if (b) {
        app_serve_proxy_cancel_all(&b->proxy);   /* no answer may reach ws now */
        app_proxy_clock_stop(&b->clock);
        app_pres_who who = pres_who(ws);
        app_presence_closed(&who, b->pres);
        app_token_conn_free(b->auth);
    }
    free(b);
}

/* Takes a token for one message: true when there was one. A rate that
 * SIGHUP changed starts the bucket again, full, as for a new connection
 * (one opened while the rate was 0 gets its burst, not an empty bucket). */
static bool bucket_take(tern_ws *ws, ps_bucket *b, uint32_t rate) {
    uint64_t now = tern_loop_now(tern_ws_loop(ws));
    if (b->rate != rate) {
        /* a new rate (SIGHUP): a full bucket at it; the connection's
         * other state (token, presence, proxy, grant) stays as it is */
        b->tokens = (uint64_t)rate * 1000;
        b->stamp = now;
        b->rate = rate;
        b->strikes = 0;
    }
    uint64_t full = (uint64_t)rate * 1000;
    uint64_t add = (now - b->stamp) * rate;   /* thousandths: rate/s is rate per 1000 ms */
    b->stamp = now;
    b->tokens = b->tokens + add >= full ? full : b->tokens + add;
    if (b->tokens == full)
        b->strikes = 0;
    if (b->tokens >= 1000) {
        b->tokens -= 1000;
        return true;
    }
    return false;
}

void app_serve_pubsub_refusals_get(app_serve_pubsub_refusals *out) {
    out->rate_refused = atomic_load_explicit(&n_rate_refused, memory_order_relaxed);
    out->rate_closed = atomic_load_explicit(&n_rate_closed, memory_order_relaxed);
    out->too_big = atomic_load_explicit(&n_too_big, memory_order_relaxed);
    out->forbidden_subscribe = atomic_load_explicit(&n_forbid_sub, memory_order_relaxed);
    out->forbidden_publish = atomic_load_explicit(&n_forbid_pub, memory_order_relaxed);
}

/* {"op":"limits"} -> {"ok":"limits","rate":N,"max_message":M}: the rate
 * in force now (SIGHUP may change it), so that a client paces itself to
 * it instead of guessing and losing operations to "rate limit". */
static void reply_limits(tern_ws *ws, uint32_t rate) {
    char out[96];
    int n = snprintf(out, sizeof(out), "{\"ok\":\"limits\",\"rate\":%" PRIu32 ",\"max_message\":%zu}",
                     rate, limits.max_message);
    tern_ws_send(ws, out, (size_t)n, TERN_WS_TEXT);
}

/* {"op":"refresh","token":"..."} -> {"ok":"refresh","exp":N}, or
 * {"error":"bad token",...} and the connection keeps its rights. */
static void pubsub_refresh(tern_ws *ws, app_token_conn *auth, tok t, tok op) {
    static _Thread_local char token[TERN_TOKEN_MAX + 1];
    long n = t.p ? decode(t, token, TERN_TOKEN_MAX) : -1;
    int64_t exp = 0;
    if (n <= 0 || app_token_conn_refresh(auth, ws, token, (size_t)n, &exp) != NULL) {
        reply_error(ws, t.p ? "bad token" : "missing token", op);
        return;
    }
    char out[64];
    int k = snprintf(out, sizeof(out), "{\"ok\":\"refresh\",\"exp\":%lld}", (long long)exp);
    tern_ws_send(ws, out, (size_t)k, TERN_WS_TEXT);
}

/* ---- subscribe and publish: at once, or once the backend allows --------- */

static const tok op_subscribe = {"\"subscribe\"", 11}, op_publish = {"\"publish\"", 9};

/* Closes ws with code and the reason, cut to a close frame's 123 bytes
 * (at a character's start: the reason is UTF-8). */
static void close_with(tern_ws *ws, int code, const char *reason) {
    char r[124];
    size_t n = strlen(reason);
    if (n > 123) {
        n = 123;
        while (n > 0 && ((unsigned char)reason[n] & 0xC0) == 0x80)
            n--;
    }
    memcpy(r, reason, n);
    r[n] = '\0';
    tern_ws_close(ws, code, r);
}

/* A client's subscribe to topic, decided (the route's on_subscribe hook
 * asks may()), and answered. */
static void do_subscribe(tern_ws *ws, ps_bucket *b, const char *topic, size_t tl, uint64_t epoch,
                         uint64_t after, bool asked, bool snapshot) {
    tern_resume r;
    app_pres_who who = pres_who(ws);
    int err = snapshot ? tern_ws_subscribe_latest(ws, topic, &r)
                       : tern_ws_subscribe_from(ws, topic, epoch, after, &r);
    if (err == 0 && b &&
        (err = app_presence_subscribed(&who, &b->pres, b->auth, rule_of(topic, tl), topic, tl)) < 0)
        (void)tern_ws_unsubscribe(ws, topic);
    if (err == 0)
        reply_subscribed(ws, topic, tl, &r, asked, snapshot);
    else if (err == -EALREADY)
        reply_ok(ws, "subscribe", topic, tl, -1);
    else
        reply_error(ws,
                    err == -ENOSPC                    ? "too many subscriptions"
                    : err == -EACCES || err == -EPERM ? "forbidden"
                                                      : "out of memory",
                    op_subscribe);
}

/* A client's publish of d (a JSON string token) to topic, with key or
 * NULL, decided (on_publish asks may()) and answered. */
static void do_publish(tern_ws *ws, const char *topic, size_t tl, const char *key, const char *d,
                       size_t dlen) {
    int64_t seq = publish_json(tern_ws_server(ws), ws, topic, tl, key, d, dlen);
    if (seq < 0)
        reply_error(ws, seq == -EACCES || seq == -EPERM ? "forbidden" : "out of memory",
                    op_publish);
    else
        reply_ok(ws, "publish", topic, tl, seq);
}

/* A subscribe or publish waiting for the backend (serve_proxy.h): what
 * the client asked, to finish it with once the answer comes. */
typedef struct ps_waiting {
    bool publish, asked, snapshot, keyed;
    uint64_t epoch, after;
    size_t tlen, dlen;
    char topic[TERN_TOPIC_MAX + 1];
    char key[TERN_KEY_MAX + 1];
    char data[];   /* a publish's data: its JSON string token */
} ps_waiting;

/* {"error":"forbidden","op":OP,"topic":T,"code":N,"message":M}: the
 * backend's refusal, with what it said. */
static void reply_denied(tern_ws *ws, const ps_waiting *w, const app_proxy_answer *a) {
    size_t mlen = strlen(a->message);
    size_t cap = 96 + 6 * (w->tlen + mlen);
    char *out = malloc(cap);
    if (out == NULL) {
        reply_error(ws, "forbidden", w->publish ? op_publish : op_subscribe);
        return;
    }
    int n = snprintf(out, cap, "{\"error\":\"forbidden\",\"op\":\"%s\",\"topic\":",
                     w->publish ? "publish" : "subscribe");
    size_t o = put_json_string(out, (size_t)n, w->topic, w->tlen);
    o += (size_t)snprintf(out + o, cap - o, ",\"code\":%ld,\"message\":", a->code);
    o = put_json_string(out, o, a->message, mlen);
    out[o++] = '}';
    tern_ws_send(ws, out, o, TERN_WS_TEXT);
    free(out);
}

/* ws as the backend proxy's asker (serve_proxy.h): its requests on b's
 * list, which its close cancels. */
static app_proxy_asker asker_of(tern_ws *ws, ps_bucket *b) {
    return (app_proxy_asker){.loop = tern_ws_loop(ws), .owner = ws, .pending = &b->proxy,
                             .user = app_token_conn_sub(b->auth), .transport = b->transport};
}

/* The backend's answer for a waiting operation: run from the loop, never
 * inside curl (serve_proxy.c); ws is still open (its close cancels). */
static void backend_answered(void *owner, void *op, const app_proxy_answer *a) {
    tern_ws *ws = owner;
    ps_waiting *w = op;
    ps_bucket *b = tern_ws_user(ws);
    tok opt = w->publish ? op_publish : op_subscribe;
    switch (a->outcome) {
    case APP_PROXY_ALLOW:
        /* The library asks may() again: it says yes to this topic only. */
        b->grant = w->topic;
        b->grant_len = w->tlen;
        b->grant_publish = w->publish;
        if (w->publish)
            do_publish(ws, w->topic, w->tlen, w->keyed ? w->key : NULL,
                       a->data ? a->data : w->data, a->data ? a->data_len : w->dlen);
        else
            do_subscribe(ws, b, w->topic, w->tlen, w->epoch, w->after, w->asked, w->snapshot);
        b->grant = NULL;
        break;
    case APP_PROXY_DENY:
        atomic_fetch_add_explicit(w->publish ? &n_forbid_pub : &n_forbid_sub, 1,
                                  memory_order_relaxed);
        reply_denied(ws, w, a);
        break;
    case APP_PROXY_DISCONNECT:
        close_with(ws, (int)a->code, a->message);
        break;
    default:
        reply_error(ws, a->error, opt);
        break;
    }
    free(w);
}

/* ws's clock (serve_proxy.h) ends it: "expired" (4001), out of memory
 * (1011), or the backend's disconnect with its code and reason. */
static void clock_end(void *owner, int why, long code, const char *reason) {
    tern_ws *ws = owner;
    if (why == APP_PROXY_END_DISCONNECT)
        close_with(ws, (int)code, reason);
    else if (why == APP_PROXY_END_NO_MEMORY)
        tern_ws_close(ws, TERN_WS_INTERNAL, "out of memory");
    else
        tern_ws_close(ws, TERN_WS_TOKEN_EXPIRED, "expired");
}

/* A refresh's new info for ws's user. */
static int clock_set_info(void *owner, const char *info) {
    tern_ws *ws = owner;
    ps_bucket *b = tern_ws_user(ws);
    return app_token_conn_set_user(&b->auth, ws, NULL, info, NULL);
}

/* The backend's answer for a connection that opened (--proxy-connect):
 * it reads again, with the user and info given, or is closed. */
static void connect_answered(void *owner, void *op, const app_proxy_answer *a) {
    (void)op;
    tern_ws *ws = owner;
    ps_bucket *b = tern_ws_user(ws);
    /* Reading again in every case: a close waits for the client's close
     * frame, which a paused connection would not read. */
    (void)tern_ws_resume(ws);
    switch (a->outcome) {
    case APP_PROXY_ALLOW:
        if ((a->user || a->info || a->rights) &&
            app_token_conn_set_user(&b->auth, ws, a->user, a->info, a->rights) < 0) {
            tern_ws_close(ws, TERN_WS_INTERNAL, "out of memory");
            return;
        }
        app_proxy_clock_at(&b->clock, a->expire_at);
        break;
    case APP_PROXY_DENY:
        close_with(ws, 4403, a->message[0] ? a->message : "forbidden");
        break;
    case APP_PROXY_DISCONNECT:
        close_with(ws, (int)a->code, a->message);
        break;
    default:
        close_with(ws, TERN_WS_TRY_AGAIN, a->error);
        break;
    }
}

/* --proxy-connect: ws reads nothing (its messages wait in the kernel)
 * until the backend has let it in. */
static void ask_connect(tern_ws *ws, ps_bucket *b) {
    (void)tern_ws_pause(ws);
    app_proxy_clock_init(&b->clock, tern_ws_loop(ws), b->transport, &b->proxy, &b->auth, ws,
                         clock_end, clock_set_info);
    app_proxy_asker who = asker_of(ws, b);
    const char *err =
        app_serve_proxy_ask(APP_PROXY_CONNECT, &who, NULL, 0, NULL, 0, connect_answered, NULL);
    if (err)
        close_with(ws, TERN_WS_TRY_AGAIN, err);
}

/* Hands the operation w describes (topic, key, data filled in here) to
 * the backend; refused at once when it cannot be asked. */
static void ask_backend(tern_ws *ws, ps_bucket *b, const ps_waiting *w, const char *topic,
                        size_t tl, const char *key, const char *d, size_t dlen) {
    tok opt = w->publish ? op_publish : op_subscribe;
    ps_waiting *op = malloc(sizeof(*op) + dlen);
    if (op == NULL) {
        reply_error(ws, "out of memory", opt);
        return;
    }
    *op = *w;
    memcpy(op->topic, topic, tl);
    op->topic[tl] = '\0';
    op->tlen = tl;
    op->keyed = key != NULL;
    if (key)
        snprintf(op->key, sizeof(op->key), "%s", key);
    if (dlen)
        memcpy(op->data, d, dlen);
    op->dlen = dlen;
    app_proxy_asker who = asker_of(ws, b);
    const char *err = app_serve_proxy_ask(w->publish ? APP_PROXY_PUBLISH : APP_PROXY_SUBSCRIBE, &who,
                                          topic, tl, w->publish ? d : NULL, dlen, backend_answered,
                                          op);
    if (err) {
        free(op);
        reply_error(ws, err, opt);
    }
}

static void pubsub_message(tern_ws *ws, const char *data, size_t len, int opcode, void *user) {
    (void)user;
    fields f = {0};
    bool json = opcode == TERN_WS_TEXT && parse_msg(data, len, &f);
    ps_bucket *b = tern_ws_user(ws);
    /* Closed for its rate: what it sent behind (still read until its
     * close frame comes) is ignored. */
    uint32_t rate = rate_now();
    if (b && b->closing)
        return;
    /* Every message costs a token, a bad one too: parsing it is work. */
    if (b && rate && !bucket_take(ws, b, rate)) {
        atomic_fetch_add_explicit(&n_rate_refused, 1, memory_order_relaxed);
        reply_error(ws, "rate limit", json ? f.op : (tok){0});
        /* A client that goes on regardless (more refused than its burst
         * since it last let the bucket fill) is not slowed by answers. */
        if (++b->strikes > rate) {
            b->closing = true;
            atomic_fetch_add_explicit(&n_rate_closed, 1, memory_order_relaxed);
            tern_ws_close(ws, TERN_WS_POLICY, "rate limit");
        }
        return;
    }
    if (!json) {
        reply_error(ws, "bad json", (tok){0});
        return;
    }
    tok op = f.op, topic_tok = f.topic, dtok = f.data, ktok = f.key;
    enum { SUB, UNSUB, PUB, PRESENCE, PRESENCE_STATS } what;
    if (op.p && op.n == 11 && !memcmp(op.p, "\"subscribe\"", 11))
        what = SUB;
    else if (op.p && op.n == 13 && !memcmp(op.p, "\"unsubscribe\"", 13))
        what = UNSUB;
    else if (op.p && op.n == 9 && !memcmp(op.p, "\"publish\"", 9))
        what = PUB;
    else if (op.p && op.n == 10 && !memcmp(op.p, "\"presence\"", 10))
        what = PRESENCE;
    else if (op.p && op.n == 16 && !memcmp(op.p, "\"presence_stats\"", 16))
        what = PRESENCE_STATS;
    else if (op.p && op.n == 8 && !memcmp(op.p, "\"limits\"", 8)) {
        reply_limits(ws, rate);
        return;
    } else if (app_serve_tokens_on() && op.p && op.n == 9 && !memcmp(op.p, "\"refresh\"", 9)) {
        pubsub_refresh(ws, b ? b->auth : NULL, f.token, op);
        return;
    } else {
        reply_error(ws, "unknown op", op);
        return;
    }
    if (topic_tok.p == NULL) {
        reply_error(ws, "missing topic", op);
        return;
    }
    char topic[TERN_TOPIC_MAX + 1];
    long tl = decode(topic_tok, topic, TERN_TOPIC_MAX);
    if (tl == -2) {
        reply_error(ws, "topic too long", op);
        return;
    }
    if (tl <= 0) {
        reply_error(ws, "bad topic", op);
        return;
    }
    switch (what) {
    case SUB: {
        uint64_t epoch = 0, after = 0;
        bool asked = f.epoch.p || f.after.p;
        if (asked && (!tok_number(f.epoch, 16, &epoch) || epoch == 0 ||
                      !tok_number(f.after, 10, &after))) {
            reply_error(ws, "bad resume", op);
            return;
        }
        /* A resume that cannot be one gets the latest of each key anyway,
         * so "snapshot" only changes a subscription that starts afresh. */
        bool snapshot = !asked && f.snapshot == 1;
        if (b && app_serve_proxy_on(APP_PROXY_SUBSCRIBE) && !app_presence_events_topic(topic, (size_t)tl)) {
            ps_waiting w = {.asked = asked, .snapshot = snapshot, .epoch = epoch, .after = after};
            ask_backend(ws, b, &w, topic, (size_t)tl, NULL, NULL, 0);
            return;
        }
        do_subscribe(ws, b, topic, (size_t)tl, epoch, after, asked, snapshot);
        break;
    }
    case UNSUB:
        if (tern_ws_unsubscribe(ws, topic) == 0) {
            app_pres_who who = pres_who(ws);
            app_presence_unsubscribed(&who, b ? b->pres : NULL, topic, (size_t)tl);
            reply_ok(ws, "unsubscribe", topic, (size_t)tl, -1);
        } else
            reply_error(ws, "not subscribed", op);
        break;
    case PUB: {
        if (dtok.p == NULL) {
            reply_error(ws, "missing data", op);
            return;
        }
        char key[TERN_KEY_MAX + 1];
        long kl = ktok.p ? decode(ktok, key, TERN_KEY_MAX) : 0;
        if (kl < 0 || (ktok.p && kl == 0)) {
            reply_error(ws, kl == -2 ? "key too long" : "bad key", op);
            return;
        }
        if (b && app_serve_proxy_on(APP_PROXY_PUBLISH)) {
            ps_waiting w = {.publish = true};
            ask_backend(ws, b, &w, topic, (size_t)tl, ktok.p ? key : NULL, dtok.p, dtok.n);
            return;
        }
        do_publish(ws, topic, (size_t)tl, ktok.p ? key : NULL, dtok.p, dtok.n);
        break;
    }
    case PRESENCE:
    case PRESENCE_STATS: {
        uint64_t limit = 0;
        if (f.limit.p && (!tok_number(f.limit, 10, &limit) || limit == 0 ||
                          limit > APP_PRESENCE_LIST_MAX)) {
            reply_error(ws, "bad limit", op);
            return;
        }
        /* With --proxy-subscribe the backend decided who subscribes: one
         * it let in may ask too. */
        bool may_ask = allowed(ws, topic, (size_t)tl, false) ||
                       (app_serve_proxy_on(APP_PROXY_SUBSCRIBE) && tern_ws_subscribed(ws, topic));
        app_presence_reply(ws, what == PRESENCE_STATS, rule_of(topic, (size_t)tl), may_ask, topic,
                           (size_t)tl, (size_t)limit);
        break;
    }
    }
}

/* POST /publish/:topic (the admin listener's, once it has checked the key):
 * published on srv, a public server of loop req's. */
void app_serve_publish(tern_http_req *req, tern_server *srv) {
    size_t tl, len;
    const char *t = tern_http_param(req, "topic", &tl);
    const char *body = tern_http_body(req, &len);
    if (t == NULL || tl == 0 || tl > TERN_TOPIC_MAX || memchr(t, '\0', tl)) {
        tern_http_respond(req, 400, "text/plain", "bad topic\n", 10);
        return;
    }
    if (!utf8_valid((const unsigned char *)body, len)) {
        tern_http_respond(req, 400, "text/plain", "body is not UTF-8\n", 17);
        return;
    }
    char topic[TERN_TOPIC_MAX + 1];
    memcpy(topic, t, tl);
    topic[tl] = '\0';
    char *d = malloc(6 * len + 2);
    if (d == NULL) {
        tern_http_respond(req, 500, "text/plain", "out of memory\n", 14);
        return;
    }
    size_t dl = put_json_string(d, 0, body ? body : "", len);
    int64_t seq = publish_json(srv, NULL, topic, tl, NULL, d, dl);
    free(d);
    if (seq < 0) {
        tern_http_respond(req, 500, "text/plain", "out of memory\n", 14);
        return;
    }
    char out[96];
    int n = snprintf(out, sizeof(out), "{\"seq\":%lld,\"subscribers\":%zu}\n", (long long)seq,
                     tern_topic_subscribers_all(srv, topic));
    tern_http_respond(req, 200, "application/json", out, (size_t)n);
}

int64_t app_serve_publish_data(tern_server *srv, const char *topic, size_t tlen,
                               const char *key, const char *data, size_t dlen) {
    return publish_json(srv, NULL, topic, tlen, key, data, dlen);
}

int app_serve_pubsub_routes(tern_server *srv, const tern_ws_options *wo,
                              const tern_pubsub_options *po, const app_serve_pubsub_limits *lim,
                              const app_topic_rules *topic_rules, bool bench,
                              int (*on_upgrade)(tern_http_req *, void **, void *), void *user) {
    int err;
    if ((err = tern_pubsub_configure(srv, po)) < 0)
        return err;
    limits = *lim;
    app_serve_pubsub_set_rate(lim->rate);
    atomic_store(&rules, topic_rules);
    pubsub_upgrade_next = on_upgrade;
    static tern_ws_handlers ps;
    ps = (tern_ws_handlers){.on_upgrade = pubsub_upgrade, .on_message = pubsub_message,
                            .on_close = pubsub_close, .on_upgrade_failed = pubsub_upgrade_failed,
                            .on_subscribe = pubsub_may_subscribe,
                            .on_publish = pubsub_may_publish};
    if (app_serve_tokens_on() || app_serve_proxy_on(APP_PROXY_CONNECT))
        ps.on_open = pubsub_open;
    tern_ws_options o = *wo;
    o.subprotocols = NULL;
    /* One compressed frame serves every subscriber only when no compressor
     * keeps context; the pub/sub layer's limit decides about slow ones,
     * under the route's (kept above it). */
    o.server_no_context_takeover = true;
    o.client_no_context_takeover = true;
    o.slow_policy = TERN_WS_SLOW_DROP;
    size_t limit = po->max_backlog ? po->max_backlog : (1u << 20);
    o.backlog_hard = limit * 2 > (1u << 20) ? limit * 2 : (1u << 20);
    o.backlog_soft = o.backlog_hard;
    tern_ws_options pso = o;
    pso.max_message = lim->max_message;
    if ((err = tern_ws_route(srv, "/pubsub", &ps, &pso, user)) < 0 ||
        (err = app_serve_sse_route(srv, on_upgrade, user)) < 0)
        return err;
    /* the /fanout routes are --bench-routes'; /fanout/sub with /pubsub's
     * options (its pub/sub settings) */
    return bench ? app_serve_fanout_routes(srv, &o, wo, on_upgrade, user) : 0;
}
