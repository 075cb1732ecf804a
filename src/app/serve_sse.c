/* tern serve's GET /sse: /pubsub's topics as Server-Sent Events
 * (EventSource), for clients that only read, or whose network refuses
 * WebSockets.
 *
 *   GET /sse?topic=T[&topic=U...][&snapshot=1][&token=...]
 *     Authorization: Bearer ... (instead of ?token=, for other clients)
 *     Last-Event-ID: ...        (a reconnect: the browser sends the last
 *                                event's id by itself)
 *
 * The same rules as /pubsub: the topic rules and the token's rights decide
 * each topic (one refused: 403, before anything is streamed; a bad token:
 * 401; no topic, more than SSE_TOPICS_MAX, or a bad one: 400), the same
 * --allowed-origin check, the same history, snapshots, conflation and
 * slow-consumer policy (the stream is a tern_sink of the library: its
 * unsent bytes count as a WebSocket's backlog). So the route is as
 * protected as /pubsub and, like it, always on.
 *
 * And the same backend proxy (serve_proxy.h). With --proxy-connect a
 * stream is a connection: the backend is asked first (the token's sub as
 * the user, when a token came) and the request is held, no head sent,
 * until it answers; its user, info and rights are the stream's from then
 * on (its "tern" rights decide the topics the rules leave to tokens);
 * refused: 403 with the backend's message; no usable answer: 503 with
 * the error ("proxy timeout", ...). With --proxy-subscribe the backend
 * decides each topic instead of the rules, one at a time in the query's
 * order, all of them before the stream starts: one refused, 403 (its
 * message), no usable answer, 503. An "expire_at" in the connect's answer
 * ends the stream then with "token expired", unless --proxy-refresh's
 * backend extends it. The client going away while a request waits
 * cancels it.
 *
 * The stream (text/event-stream):
 *   retry: 2000                       first: reconnect after 2 s
 *   event: gap                        a resume that could not be one (the
 *   data: {"topic":T,"epoch":"E","seq":N}  epoch changed, the history no
 *                                     longer reaches back, or the
 *                                     Last-Event-ID was not this stream's):
 *                                     the latest message of each key follows
 *   id: ...                           each topic's message, as /pubsub sends
 *   data: {"topic":T,"seq":N,...}     it (event type "message")
 *   event: subscribed                 each topic's subscribe, /pubsub's
 *   id: ...                           subscribe ack; the topic's replay or
 *                                     snapshot follows it
 *   data: {"ok":"subscribe","topic":T,"epoch":"E","seq":N[,...]}
 *   event: error                      before the stream ends: "token
 *   data: {"error":"token expired"}   expired" (at the token's exp plus
 *                                     --token-leeway, or the backend's
 *                                     expire_at), "slow consumer"
 *                                     (the close policy), "too many
 *                                     subscriptions", "out of memory"
 *   event: join                       where the topic's rule says
 *   data: {"topic":T,"join":{...}}    join-leave=on: another subscriber's
 *   event: leave                      join or leave, /pubsub's JSON (no
 *   data: {"topic":T,"leave":{...}}   id: they resume nothing)
 *   : keep-alive                      every SSE_KEEPALIVE_MS, so that
 *                                     proxies keep an idle stream, and a
 *                                     client gone is found (its FIN alone
 *                                     is no departure for HTTP: the next
 *                                     write, a message or this, meets its
 *                                     reset and ends the stream)
 *
 * HEAD /sse gets the head a GET would, and no stream.
 *
 * An event's id holds what a resume needs, for every topic of the stream
 * in the query's order: "E.S" (the topic's epoch in hex, the seq of its
 * last message sent) joined by ','; empty for a topic not subscribed yet.
 * A browser sends the last one back as Last-Event-ID when it reconnects to
 * the same URL, and each topic resumes after it with no gap and no
 * duplicate, or the stream says "gap". With a snapshot asked, a topic
 * without a resume point starts with the latest message of each key.
 *
 * Presence (serve_presence.h): where a topic's rule says presence=on the
 * stream is in its presence as a /pubsub subscriber is (a client id of
 * its own, the user and info of its token or of the backend), and with
 * join-leave=on its join is pushed as it subscribes and its leave when
 * the stream ends, however it ends.
 *
 * Binary messages (the /fanout routes') are not sent: SSE carries text. */
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
#include "app/serve_presence.h"
#include "app/serve_proxy.h"
#include "app/serve_tokens.h"
#include "loop/hex.h"
#include "tern/tern.h"

#define SSE_TOPICS_MAX 64         /* topics per stream: every event's id names them all */
#define SSE_KEEPALIVE_MS 15000    /* a comment on an idle stream this often */
#define SSE_RETRY_MS 2000         /* the reconnect delay told to EventSource */

/* One topic of a stream. Invariants: epoch is 0 until the topic is
 * subscribed on this stream (or the Last-Event-ID gave one); seq is the
 * last message of it the stream sent, or where the subscription started. */
typedef struct sse_topic {
    char name[TERN_TOPIC_MAX + 1];
    size_t len;
    uint64_t epoch, seq;
} sse_topic;

/* One /sse stream. Invariants: req is valid until ended (the stream's end
 * or its connection's abort, after which nothing touches it); sink is
 * this stream's subscriber, NULL while the backend is asked (then the
 * stream is on no list, no head has gone, and the abort frees it with its
 * requests); closing: the close policy or the token ended the stream,
 * whose end a 0 ms timer (end_timer) makes outside the delivery. */
typedef struct sse_conn {
    struct sse_conn *prev, *next;   /* the thread's open streams (streams) */
    tern_http_req *req;
    tern_sink *sink;
    app_token_conn *auth;
    tern_timer *keepalive, *expiry, *end_timer;
    app_proxy_req *proxy;      /* its requests waiting for the backend */
    app_proxy_clock clock;     /* the expiry the backend gave, and its refresh */
    /* Presence (serve_presence.h): its client id and the topics it is in
     * with presence or join/leave (NULL: none); srv, its server from the
     * stream's start, publishes its leave after req has gone. */
    app_pres_conn *pres;
    tern_server *srv;
    int64_t expire_at;         /* that expiry (Unix seconds, 0: none), until the stream starts */
    int decided;               /* the topics allowed so far, in the query's order */
    bool snapshot, bad_id, head;   /* the request's, kept while it waits */
    int ntopics;
    bool closing;
    const char *why;          /* the error event of a closing stream */
    char *out;                /* a formatted event, reused by every delivery */
    size_t outcap;
    sse_topic t[];
} sse_conn;

static int (*sse_upgrade_hook)(tern_http_req *, void **, void *);
static void *sse_hook_user;
/* Each loop's open streams (a loop is a thread), which the shutdown ends:
 * a graceful shutdown waits for the responses in flight, and a stream's
 * never ends by itself. */
static _Thread_local sse_conn *streams;
/* SIGTERM came (app_serve_sse_drain): streams end, new ones once they
 * have subscribed, so that EventSource reconnects to another node. */
static _Atomic bool draining;

/* ---- writing events ----------------------------------------------------- */

/* Room for n more bytes after o in c->out (grown at most a few times: the
 * largest event sets it). */
static bool out_room(sse_conn *c, size_t o, size_t n) {
    if (o + n <= c->outcap)
        return true;
    size_t cap = c->outcap ? c->outcap : 1024;
    while (cap < o + n)
        cap *= 2;
    char *p = realloc(c->out, cap);
    if (p == NULL)
        return false;
    c->out = p;
    c->outcap = cap;
    return true;
}

/* v in hex (no leading zeros) at p; returns the digits written. By hand,
 * as put_dec: an id goes with every event, and printf would cost as much
 * as the rest of a delivery. */
static size_t put_hex(char *p, uint64_t v) {
    char tmp[16];
    size_t n = 0;
    do {
        tmp[n++] = "0123456789abcdef"[v & 15];
        v >>= 4;
    } while (v);
    for (size_t i = 0; i < n; i++)
        p[i] = tmp[n - 1 - i];
    return n;
}

/* v in decimal at p; returns the digits written. */
static size_t put_dec(char *p, uint64_t v) {
    char tmp[20];
    size_t n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (size_t i = 0; i < n; i++)
        p[i] = tmp[n - 1 - i];
    return n;
}

/* "id: E.S,E.S,...\n" at c->out + o; returns the new length, 0 when out
 * of memory. */
static size_t put_id(sse_conn *c, size_t o) {
    if (!out_room(c, o, 8 + (size_t)c->ntopics * 40))
        return 0;
    memcpy(c->out + o, "id: ", 4);
    o += 4;
    for (int i = 0; i < c->ntopics; i++) {
        if (i)
            c->out[o++] = ',';
        if (c->t[i].epoch) {
            o += put_hex(c->out + o, c->t[i].epoch);
            c->out[o++] = '.';
            o += put_dec(c->out + o, c->t[i].seq);
        }
    }
    c->out[o++] = '\n';
    return o;
}

/* An event into c->out: "event: NAME\n" (NULL: a message), the id when
 * with_id, then data[0..len) as "data:" lines (a line break in it starts
 * another), then the blank line. Returns its length, 0 when out of
 * memory. */
static size_t format_event(sse_conn *c, const char *name, bool with_id, const char *data,
                           size_t len) {
    size_t o = 0;
    if (name) {
        size_t nl = strlen(name);
        if (!out_room(c, o, nl + 8))
            return 0;
        o += (size_t)sprintf(c->out, "event: %s\n", name);
    }
    if (with_id && (o = put_id(c, o)) == 0)
        return 0;
    /* A JSON message has no raw line break: one "data:" line, copied
     * whole. Another text gets a "data:" line per line (CR, LF or CRLF
     * ending each), as EventSource joins them back with LF. */
    bool one_line = memchr(data, '\n', len) == NULL && memchr(data, '\r', len) == NULL;
    if (!out_room(c, o, 6 + (one_line ? len : 7 * len) + 2))
        return 0;
    memcpy(c->out + o, "data: ", 6);
    o += 6;
    if (one_line) {
        memcpy(c->out + o, data, len);
        o += len;
    } else {
        for (size_t i = 0; i < len; i++) {
            if (data[i] == '\r' || data[i] == '\n') {
                if (data[i] == '\r' && i + 1 < len && data[i + 1] == '\n')
                    i++;   /* CRLF is one break */
                memcpy(c->out + o, "\ndata: ", 7);
                o += 7;
            } else {
                c->out[o++] = data[i];
            }
        }
    }
    c->out[o++] = '\n';
    c->out[o++] = '\n';
    return o;
}

/* The event format_event makes, written to the stream: a
 * tern_send_result, or a negative errno. */
static int put_event(sse_conn *c, const char *name, bool with_id, const char *data, size_t len) {
    size_t n = format_event(c, name, with_id, data, len);
    return n ? tern_http_write(c->req, c->out, n) : -ENOMEM;
}

/* {"topic":T,"epoch":"E","seq":seq + extra + } as event name (with the
 * id when with_id). */
static void put_topic_event(sse_conn *c, const char *name, bool with_id, int i, uint64_t seq,
                            const char *extra) {
    char d[96 + 6 * TERN_TOPIC_MAX + 64];
    size_t o = (size_t)snprintf(d, sizeof(d), "%s\"topic\":\"",
                                strcmp(name, "subscribed") == 0 ? "{\"ok\":\"subscribe\"," : "{");
    o += app_json_escape(d + o, sizeof(d) - o, c->t[i].name, c->t[i].len);
    o += (size_t)snprintf(d + o, sizeof(d) - o,
                          "\",\"epoch\":\"%016" PRIx64 "\",\"seq\":%" PRIu64 "%s}", c->t[i].epoch,
                          seq, extra);
    put_event(c, name, with_id, d, o);
}

/* The seq /pubsub's message format carries ({"topic":T,"seq":N,...}),
 * or 0 when the payload is not one of those. */
static uint64_t payload_seq(const char *d, size_t n) {
    size_t i = 9;
    if (n < 12 || memcmp(d, "{\"topic\":\"", 10) != 0)
        return 0;
    for (i = 10; i < n && d[i] != '"'; i++)
        if (d[i] == '\\')
            i++;
    if (i + 8 > n || memcmp(d + i, "\",\"seq\":", 8) != 0)
        return 0;
    uint64_t v = 0;
    for (i += 8; i < n && d[i] >= '0' && d[i] <= '9'; i++)
        v = v * 10 + (uint64_t)(d[i] - '0');
    return v;
}

/* The thread's last message event of a one-topic stream: a delivery
 * offers one message to every subscriber of its topic in a row, and on
 * one-topic streams (the common case) the event is the same bytes for
 * each, so it is formatted once and written as it is to the others.
 * Keyed by what the event is made of: the topic, its epoch and the
 * payload's bytes (which carry its seq). Invariants: ev[0..n) is the
 * event of payload[0..len) on topic[0..tlen) at epoch when n > 0; ev is
 * freed when the thread's last stream ends (conn_free). */
typedef struct sse_last {
    char *ev, *payload;
    size_t n, evcap, len, paycap, tlen;
    uint64_t epoch;
    char topic[TERN_TOPIC_MAX];
} sse_last;
static _Thread_local sse_last last_ev;

static void last_free(void) {
    free(last_ev.ev);
    free(last_ev.payload);
    last_ev = (sse_last){0};
}

/* *p with room for n bytes (*cap: its size), false when out of memory. */
static bool last_room(char **p, size_t *cap, size_t n) {
    if (n <= *cap)
        return true;
    char *q = realloc(*p, n);
    if (q == NULL)
        return false;
    *p = q;
    *cap = n;
    return true;
}

/* Keeps c->out[0..n), the event of data[0..len) on c's one topic, as the
 * thread's last (out of memory: not kept, which costs only speed). */
static void last_keep(const sse_conn *c, const char *data, size_t len, size_t n) {
    last_ev.n = 0;
    if (!last_room(&last_ev.ev, &last_ev.evcap, n) || !last_room(&last_ev.payload, &last_ev.paycap, len))
        return;
    memcpy(last_ev.ev, c->out, n);
    memcpy(last_ev.payload, data, len);
    memcpy(last_ev.topic, c->t[0].name, c->t[0].len);
    last_ev.tlen = c->t[0].len;
    last_ev.len = len;
    last_ev.epoch = c->t[0].epoch;
    last_ev.n = n;
}

/* Whether the thread's last event is data[0..len)'s on c's one topic. */
static bool last_is(const sse_conn *c, const char *data, size_t len) {
    return last_ev.n && last_ev.len == len && last_ev.epoch == c->t[0].epoch &&
           last_ev.tlen == c->t[0].len && memcmp(last_ev.topic, c->t[0].name, last_ev.tlen) == 0 &&
           memcmp(last_ev.payload, data, len) == 0;
}

/* ---- the sink's operations ---------------------------------------------- */

/* "join" or "leave": the kind of a join/leave topic's message
 * ({"topic":T,"join":{...}}, serve_presence.h), or NULL. */
static const char *join_or_leave(const char *d, size_t n) {
    size_t i;
    if (n < 12 || memcmp(d, "{\"topic\":\"", 10) != 0)
        return NULL;
    for (i = 10; i < n && d[i] != '"'; i++)
        if (d[i] == '\\')
            i++;
    if (i + 9 <= n && memcmp(d + i, "\",\"join\":", 9) == 0)
        return "join";
    if (i + 10 <= n && memcmp(d + i, "\",\"leave\":", 10) == 0)
        return "leave";
    return NULL;
}

static int topic_index(const sse_conn *c, const char *topic, size_t tlen) {
    for (int i = 0; i < c->ntopics; i++)
        if (c->t[i].len == tlen && memcmp(c->t[i].name, topic, tlen) == 0)
            return i;
    return -1;
}

/* A message for the stream (its topic subscribed: pub/sub sends nothing
 * inside the subscribe, so the epoch is known): the topic's seq moves to
 * it, and the event goes with the id that says so. */
static int sink_send(void *user, const char *topic, size_t tlen, int opcode, const void *data,
                     size_t len) {
    sse_conn *c = user;
    if (opcode == TERN_WS_TEXT && !c->closing && app_presence_events_topic(topic, tlen)) {
        /* A join or leave of a topic with join-leave=on: its own event,
         * no id (it is no message of the topic, and resumes nothing). */
        const char *what = join_or_leave(data, len);
        return what ? put_event(c, what, false, data, len) : TERN_SEND_DROPPED;
    }
    int i = topic_index(c, topic, tlen);
    if (opcode != TERN_WS_TEXT || i < 0 || c->closing)
        return TERN_SEND_DROPPED;
    uint64_t seq = payload_seq(data, len);
    if (seq)
        c->t[i].seq = seq;
    if (c->ntopics != 1 || seq == 0)
        return put_event(c, NULL, seq != 0, data, len);
    if (last_is(c, data, len))
        return tern_http_write(c->req, last_ev.ev, last_ev.n);
    size_t n = format_event(c, NULL, true, data, len);
    if (n == 0)
        return -ENOMEM;
    last_keep(c, data, len, n);
    return tern_http_write(c->req, c->out, n);
}

static size_t sink_buffered(void *user) {
    return tern_http_buffered(((sse_conn *)user)->req);
}

static void end_now(tern_timer *t, void *user);

/* Ends the stream after the delivery under way (the timer runs at the
 * loop's next turn): the error event why (NULL: none), then the end of
 * the response. */
static void end_soon(sse_conn *c, const char *why) {
    if (c->closing)
        return;
    c->closing = true;
    c->why = why;
    app_proxy_clock_stop(&c->clock);   /* ending: no refresh asked or taken now */
    if (tern_timer_start(tern_http_req_loop(c->req), &c->end_timer, 0, 0, end_now, c) < 0)
        c->end_timer = NULL;   /* no memory: it ends when the client goes */
}

static void sink_close(void *user, int code) {
    (void)code;
    end_soon(user, "slow consumer");
}

/* sink_send only writes (tern_http_write, which sends nothing inside the
 * call on HTTP/2 either): a live message comes to it in pub/sub's pass. */
static const tern_sink_ops sse_ops = {
    .send = sink_send, .buffered = sink_buffered, .close = sink_close, .send_at_once = true};

/* ---- the stream's life --------------------------------------------------- */

/* c as presence sees it (serve_presence.h): its server publishes its join
 * and leave, its sink hears the others'. */
static app_pres_who pres_who(sse_conn *c) {
    return (app_pres_who){.srv = c->srv, .sink = c->sink};
}

static void conn_free(sse_conn *c) {
    if (c->prev || streams == c) {
        *(c->prev ? &c->prev->next : &streams) = c->next;
        if (c->next)
            c->next->prev = c->prev;
    }
    app_serve_proxy_cancel_all(&c->proxy);   /* no answer may reach c now */
    app_pres_who who = pres_who(c);
    app_presence_closed(&who, c->pres);   /* out of presence, its leaves pushed */
    tern_sink_free(c->sink);
    app_proxy_clock_stop(&c->clock);
    if (c->keepalive)
        tern_timer_stop(c->keepalive);
    if (c->expiry)
        tern_timer_stop(c->expiry);
    if (c->end_timer)
        tern_timer_stop(c->end_timer);
    app_token_conn_free(c->auth);
    free(c->out);
    free(c);
    if (streams == NULL)
        last_free();   /* the thread's last stream: nothing may reuse it */
}

/* The connection went before the stream ended: req is gone with it. */
static void on_abort(tern_http_req *req, void *user) {
    (void)req;
    conn_free(user);
}

static void on_drain(tern_http_req *req, void *user) {
    (void)req;
    sse_conn *c = user;
    if (!c->closing)
        tern_sink_drained(c->sink);
}

/* The stream ends: its error event (none for a shutdown's end: the
 * client reconnects as after a cut), the response's end; then c goes. */
static void finish(sse_conn *c) {
    char d[64];
    int n = snprintf(d, sizeof(d), "{\"error\":\"%s\"}", c->why ? c->why : "");
    if (c->why)
        put_event(c, "error", false, d, (size_t)n);
    tern_http_on_abort(c->req, NULL, NULL);
    tern_http_on_drain(c->req, NULL, NULL);
    tern_http_end(c->req);
    conn_free(c);
}

static void end_now(tern_timer *t, void *user) {
    (void)t;
    finish(user);
}

static void keepalive(tern_timer *t, void *user) {
    (void)t;
    sse_conn *c = user;
    if (tern_http_buffered(c->req) == 0)
        tern_http_write(c->req, ": keep-alive\n\n", 14);
}

/* The stream's rights have ended (the token's, or the backend's expiry):
 * its error event, and the end. */
static void end_expired(sse_conn *c) {
    if (!c->closing) {
        c->closing = true;
        c->why = "token expired";
        finish(c);
    }
}

/* The token's end (its exp plus the leeway; the wall clock may have gone
 * back meanwhile: then the rest is waited). */
static void expired(tern_timer *t, void *user) {
    sse_conn *c = user;
    int64_t left = app_token_conn_until(c->auth) - (int64_t)time(NULL);
    if (left > 0 && tern_timer_again(t, (uint64_t)left * 1000) == 0)
        return;
    end_expired(c);
}

/* ---- the backend proxy (serve_proxy.h) ------------------------------------ */

/* c as the backend proxy's asker: its requests on its list, which its
 * end cancels (conn_free). */
static app_proxy_asker asker_of(sse_conn *c) {
    return (app_proxy_asker){.loop = tern_http_req_loop(c->req), .owner = c,
                             .pending = &c->proxy, .user = app_token_conn_sub(c->auth),
                             .transport = "sse"};
}

/* The stream's clock (serve_proxy.h) ends it: each way as an expiry. */
static void clock_end(void *owner, int why, long code, const char *reason) {
    (void)why, (void)code, (void)reason;
    end_expired(owner);
}

/* A refresh's new info for the stream's user. */
static int clock_set_info(void *owner, const char *info) {
    sse_conn *c = owner;
    return app_token_conn_set_user(&c->auth, NULL, NULL, info, NULL);
}

/* ---- the request ---------------------------------------------------------- */

/* The query's topic= values into t[], at most SSE_TOPICS_MAX; "snapshot=1"
 * into *snapshot. Returns how many, or -1 for a bad one (empty, too long,
 * a bad escape, a repeat, too many). */
static int parse_query(tern_http_req *req, sse_topic *t, bool *snapshot) {
    char v[2], name[TERN_TOPIC_MAX + 1];
    *snapshot = tern_http_query_param(req, "snapshot", v, sizeof(v)) == 1 && v[0] == '1';
    int n = 0;
    size_t at = 0;
    ssize_t l;
    while ((l = tern_http_query_param_next(req, "topic", &at, name, sizeof(name))) != -ENOENT) {
        /* too many, empty, too long, a bad escape or one decoding to a NUL */
        if (n == SSE_TOPICS_MAX || l <= 0 || memchr(name, '\0', (size_t)l))
            return -1;
        for (int j = 0; j < n; j++)
            if (t[j].len == (size_t)l && memcmp(t[j].name, name, (size_t)l) == 0)
                return -1;
        memcpy(t[n].name, name, (size_t)l + 1);
        t[n++].len = (size_t)l;
    }
    return n;
}

/* Last-Event-ID: "E.S" or "" per topic, joined by ','. The topics' epoch
 * and seq when it has one entry per topic, each empty or a hex epoch (not
 * 0), a dot and a decimal seq: true. Else false, and nothing is set. */
static bool parse_last_id(const char *s, size_t n, sse_topic *t, int ntopics) {
    uint64_t e[SSE_TOPICS_MAX], q[SSE_TOPICS_MAX];
    int k = 0;
    size_t i = 0;
    for (;;) {
        if (k == ntopics)
            return false;
        e[k] = q[k] = 0;
        size_t de = 0, dq = 0;
        while (i < n && tern__hex_value(s[i]) >= 0 && de < 16)
            e[k] = e[k] << 4 | (uint64_t)tern__hex_value(s[i++]), de++;
        if (de > 0) {
            if (i >= n || s[i++] != '.' || e[k] == 0)
                return false;
            while (i < n && s[i] >= '0' && s[i] <= '9' && dq < 19)
                q[k] = q[k] * 10 + (uint64_t)(s[i++] - '0'), dq++;
            if (dq == 0)
                return false;
        }
        k++;
        if (i == n)
            break;
        if (s[i++] != ',')
            return false;
    }
    if (k != ntopics)
        return false;
    for (int j = 0; j < k; j++)
        t[j].epoch = e[j], t[j].seq = q[j];
    return true;
}

static void refuse(tern_http_req *req, int status, const char *why) {
    char b[256];
    int n = snprintf(b, sizeof(b), "%s\n", why);
    tern_http_respond(req, status, "text/plain", b, (size_t)n);
}

/* Subscribes topic i: a gap said first, the ack; its replay follows (pub/sub
 * sends it at the loop's next iteration, with ids). False: the stream is
 * ending (why set). */
static bool subscribe_topic(sse_conn *c, int i, bool snapshot, bool bad_id) {
    sse_topic *t = &c->t[i];
    bool asked = t->epoch != 0;
    tern_resume r;
    /* A Last-Event-ID not this stream's is a gap: the latest of each key. */
    int err = !asked && (snapshot || bad_id) ? tern_sink_subscribe_latest(c->sink, t->name, &r)
                                 : tern_sink_subscribe_from(c->sink, t->name, t->epoch, t->seq, &r);
    if (err == 0) {
        /* In the topic's presence, its join pushed, as /pubsub's
         * subscribers are (the rule says which). */
        app_pres_who who = pres_who(c);
        err = app_presence_subscribed(&who, &c->pres, c->auth,
                                      app_serve_pubsub_rule(t->name, t->len), t->name, t->len);
        if (err < 0)
            (void)tern_sink_unsubscribe(c->sink, t->name);
    }
    if (err < 0) {
        c->why = err == -ENOSPC ? "too many subscriptions" : "out of memory";
        return false;
    }
    t->epoch = r.epoch;
    if ((asked && !r.resumed) || bad_id) {
        /* No id: a cut before the latest of each key has come must not
         * skip them when the client resumes. */
        put_topic_event(c, "gap", false, i, r.seq, "");
    }
    /* Nothing owed: the stream is at the topic's seq. Else what is owed
     * waits in pub/sub's queue and moves the seq as it goes out; until
     * then the id stays where the stream is: at the client's own point of
     * a resume, or at the start of the new epoch. */
    if (r.replayed == 0)
        t->seq = r.seq;
    else if (!(asked && r.resumed))
        t->seq = 0;
    char extra[80] = "";
    if (asked || bad_id)
        snprintf(extra, sizeof(extra), ",\"resumed\":%s,\"replayed\":%" PRIu64,
                 r.resumed ? "true" : "false", r.replayed);
    else if (snapshot)
        snprintf(extra, sizeof(extra), ",\"snapshot\":%" PRIu64, r.replayed);
    put_topic_event(c, "subscribed", true, i, r.seq, extra);
    return true;
}

/* Refuses a stream that waited for the backend (its abort hook on):
 * status, why as the body; then c goes. Nothing was streamed. */
static void refuse_held(sse_conn *c, int status, const char *why) {
    tern_http_on_abort(c->req, NULL, NULL);
    refuse(c->req, status, why);
    conn_free(c);
}

/* Starts the stream, every topic allowed: the head (HEAD: alone), the
 * retry, each topic's subscribe, the expiries. */
static void start_stream(sse_conn *c) {
    tern_http_req *req = c->req;
    tern_http_on_abort(req, NULL, NULL);   /* set again once the response is under way */
    if (c->head) {
        /* The head a GET would get, and no stream: nothing would read it. */
        tern_http_add_header(req, "Cache-Control", "no-store");
        tern_http_respond(req, 200, "text/event-stream", NULL, 0);
        conn_free(c);
        return;
    }
    c->srv = tern_http_req_server(req);
    if (tern_sink_new(c->srv, &sse_ops, c, &c->sink) < 0 ||
        tern_timer_start(tern_http_req_loop(req), &c->keepalive, SSE_KEEPALIVE_MS,
                         SSE_KEEPALIVE_MS, keepalive, c) < 0) {
        refuse(req, 503, "out of memory");
        conn_free(c);
        return;
    }
    int64_t until = app_token_conn_until(c->auth);
    if (until > 0) {
        int64_t left = until - (int64_t)time(NULL);
        if (tern_timer_start(tern_http_req_loop(req), &c->expiry,
                             left > 0 ? (uint64_t)left * 1000 : 0, 0, expired, c) < 0) {
            refuse(req, 503, "out of memory");
            conn_free(c);
            return;
        }
    }
    tern_http_add_header(req, "Cache-Control", "no-store");
    tern_http_add_header(req, "X-Accel-Buffering", "no");   /* nginx: stream, do not buffer */
    if (tern_http_start(req, 200, "text/event-stream") < 0) {
        conn_free(c);
        return;
    }
    tern_http_on_abort(req, on_abort, c);
    tern_http_on_drain(req, on_drain, c);
    c->next = streams;
    if (streams)
        streams->prev = c;
    streams = c;
    char retry[32];
    int n = snprintf(retry, sizeof(retry), "retry: %d\n\n", SSE_RETRY_MS);
    tern_http_write(req, retry, (size_t)n);
    for (int i = 0; i < c->ntopics && !c->closing; i++)
        if (!subscribe_topic(c, i, c->snapshot, c->bad_id)) {
            c->closing = true;
            finish(c);
            return;
        }
    if (c->expire_at)
        app_proxy_clock_at(&c->clock, c->expire_at);   /* may end the stream (no memory) */
    if (!c->closing && atomic_load_explicit(&draining, memory_order_relaxed))
        end_soon(c, NULL);
}

static void decide_topics(sse_conn *c);

/* The backend's refusal of a held stream, when a is one: deny or
 * disconnect (an HTTP stream has no close code) answer 403 with its
 * message, no usable answer 503 with the error; c is gone then. False:
 * a allows. */
static bool refused_held(sse_conn *c, const app_proxy_answer *a) {
    switch (a->outcome) {
    case APP_PROXY_ALLOW:
        return false;
    case APP_PROXY_DENY:
    case APP_PROXY_DISCONNECT:
        refuse_held(c, 403, a->message[0] ? a->message : "forbidden");
        return true;
    default:
        refuse_held(c, 503, a->error);
        return true;
    }
}

/* The backend's answer for the topic being decided (--proxy-subscribe):
 * the next topic, or the refusal. */
static void subscribe_answered(void *owner, void *op, const app_proxy_answer *a) {
    (void)op;
    sse_conn *c = owner;
    if (refused_held(c, a))
        return;
    c->decided++;
    decide_topics(c);
}

/* Decides the topics from c->decided on, in the query's order: with
 * --proxy-subscribe each is asked of the backend (the answer goes on
 * from the next; join and leave topics are the server's, which the rules
 * keep), else the rules (and the token's or the backend's rights) decide
 * at once. Once every topic is allowed the stream starts. */
static void decide_topics(sse_conn *c) {
    for (; c->decided < c->ntopics; c->decided++) {
        const sse_topic *t = &c->t[c->decided];
        if (app_serve_proxy_on(APP_PROXY_SUBSCRIBE) && !app_presence_events_topic(t->name, t->len)) {
            app_proxy_asker who = asker_of(c);
            const char *err = app_serve_proxy_ask(APP_PROXY_SUBSCRIBE, &who, t->name, t->len, NULL,
                                                  0, subscribe_answered, NULL);
            if (err)
                refuse_held(c, 503, err);
            else
                tern_http_on_abort(c->req, on_abort, c);   /* held: the client may go */
            return;
        }
        if (app_serve_pubsub_may(c->auth, t->name, t->len, false) < 0) {
            refuse_held(c, 403, "forbidden");
            return;
        }
    }
    start_stream(c);
}

/* The backend's answer for the stream as a connection (--proxy-connect):
 * its user, info and rights taken, then its topics decided; or the
 * refusal. */
static void connect_answered(void *owner, void *op, const app_proxy_answer *a) {
    (void)op;
    sse_conn *c = owner;
    if (refused_held(c, a))
        return;
    if ((a->user || a->info || a->rights) &&
        app_token_conn_set_user(&c->auth, NULL, a->user, a->info, a->rights) < 0) {
        refuse_held(c, 503, "out of memory");
        return;
    }
    c->expire_at = a->expire_at;
    decide_topics(c);
}

static void sse_handler(tern_http_req *req, void *user) {
    (void)user;
    void *hook_user = NULL;
    int status = sse_upgrade_hook(req, &hook_user, sse_hook_user);   /* --allowed-origin */
    if (status != 0) {
        refuse(req, status, tern_http_reason(status));
        return;
    }
    static _Thread_local sse_topic parsed[SSE_TOPICS_MAX];
    bool snapshot;
    int n = parse_query(req, parsed, &snapshot);
    if (n <= 0) {
        refuse(req, 400, n == 0 ? "no topic" : "bad topic");
        return;
    }
    sse_conn *c = calloc(1, sizeof(*c) + (size_t)n * sizeof(sse_topic));
    if (c == NULL) {
        refuse(req, 503, "out of memory");
        return;
    }
    c->req = req;
    c->ntopics = n;
    app_proxy_clock_init(&c->clock, tern_http_req_loop(req), "sse", &c->proxy, &c->auth, c,
                         clock_end, clock_set_info);
    c->snapshot = snapshot;
    memcpy(c->t, parsed, (size_t)n * sizeof(sse_topic));
    if (app_serve_tokens_on() && (status = app_token_conn_upgrade(req, &c->auth)) != 0) {
        refuse(req, status, status == 401 ? "bad token" : "out of memory");
        conn_free(c);
        return;
    }
    /* What the request says, read now: its views end with this call, and
     * the backend may answer later. */
    size_t ml, ll;
    const char *method = tern_http_method(req, &ml);
    c->head = ml == 4 && memcmp(method, "HEAD", 4) == 0;
    const char *last = tern_http_header(req, "Last-Event-ID", &ll);
    c->bad_id = last && ll > 0 && !parse_last_id(last, ll, c->t, c->ntopics);
    if (!app_serve_proxy_on(APP_PROXY_CONNECT)) {
        decide_topics(c);
        return;
    }
    app_proxy_asker who = asker_of(c);
    const char *err =
        app_serve_proxy_ask(APP_PROXY_CONNECT, &who, NULL, 0, NULL, 0, connect_answered, NULL);
    if (err) {
        refuse(req, 503, err);
        conn_free(c);
        return;
    }
    tern_http_on_abort(req, on_abort, c);   /* held: the client may go meanwhile */
}

/* On each loop: its streams end now. */
static void drain_loop(tern_loop *loop, void *user) {
    (void)loop, (void)user;
    while (streams) {
        sse_conn *c = streams;
        if (c->end_timer)
            tern_timer_stop(c->end_timer);   /* ending already: now instead */
        c->end_timer = NULL;
        c->closing = true;
        finish(c);
    }
}

void app_serve_sse_drain(tern_server *srv) {
    if (atomic_exchange(&draining, true))
        return;
    for (int i = 0; i < tern_server_peer_count(srv); i++) {
        tern_server *p = tern_server_peer(srv, i);
        if (p && tern_loop_post(tern_server_loop(p), drain_loop, NULL) < 0)
            continue;   /* out of memory: that loop's end at the shutdown's deadline */
    }
}

int app_serve_sse_route(tern_server *srv, int (*hook)(tern_http_req *, void **, void *),
                        void *user) {
    sse_upgrade_hook = hook;
    sse_hook_user = user;
    return tern_http_route(srv, "GET", "/sse", sse_handler, NULL);
}
