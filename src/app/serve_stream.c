/* tern serve's HTTP-streaming transport: /pubsub for clients whose network
 * refuses WebSockets (a company proxy), with the same API: what the client
 * sends goes in POSTs, what the server sends comes on one long response.
 *
 *   GET /http-stream[?token=...]       (or Authorization: Bearer ...)
 *     200 application/x-ndjson, one JSON value a line:
 *       {"session":"<32 hex digits>"}  first: the id the POSTs name
 *       ...                            every message /pubsub would send
 *                                      (acks, errors, messages, presence),
 *                                      byte for byte, one a line
 *       (an empty line)                a keep-alive, every STREAM_KEEPALIVE_MS
 *       {"close":CODE,"reason":"..."}  last: how /pubsub's session ended
 *                                      (4001 "token expired", 1008 "slow
 *                                      consumer", 1001 at a shutdown, ...)
 *     401/403/...: what /pubsub's upgrade answered (a bad token, a
 *     refused Origin), before anything is streamed.
 *
 *   POST /http-stream/ops?session=ID   body: one /pubsub op a line
 *     202: the ops are on their way; their answers come on the stream.
 *     400: no or malformed session id; 404: no such stream (ended, or
 *     never was); 413: a body over the route's limit.
 *
 * How: each stream is a WebSocket session of the server's own /pubsub
 * (the "relay"), opened over a Unix socket of its own (a private
 * listener: app_serve_stream_listen), with the stream request's
 * Authorization and Origin headers and token. So every rule of /pubsub
 * holds, unchanged and not copied: the token (its rights, expiry and
 * refresh), the topic rules, the rate limit (per stream, on its ops),
 * presence, the backend proxy, the slow-consumer policy (a stream whose
 * client reads too slowly stops reading its relay, whose backlog then
 * grows in /pubsub as a slow WebSocket client's would). The price is a
 * relay connection per stream and a second pass of every message.
 *
 * The session id, 128 random bits, is the POSTs' credential: it is given
 * only on the stream, which the token opened, and dies with it; a POST
 * needs no token of its own. The table of sessions is shared by the
 * threads, as a POST may reach another thread than its stream's; the ops
 * are posted to the stream's loop (tern_loop_post, in order), and sent
 * there on its relay. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app/app.h"
#include "app/json.h"
#include "app/token.h"
#include "loop/hex.h"
#include "net/crypto.h"
#include "tern/tern.h"

#define STREAM_KEEPALIVE_MS 15000   /* an empty line on an idle stream this often */
#define STREAM_HIGH (256u << 10)    /* unsent bytes past which the relay stops reading */
#define STREAM_BUCKETS 256          /* the session table's chains */
#define STREAM_ID_LEN 16            /* bytes of a session id: 128 bits */

/* One stream. Invariants: req is valid until NULL (the client went: on
 * abort, or the response ended); ws is the relay once open, connecting
 * until then (and NULL once open or failed); s is freed only by the
 * relay's last callback (on_close or on_connect_error), on its loop; s is
 * in the session table (under table_lock) exactly while the relay is
 * open and req is valid, so that a POST finds only a stream that can
 * take its ops; s is on its thread's relays list exactly while ws is
 * set (from the relay's on_open to its on_close), closing or not. */
typedef struct stream {
    struct stream *next_in_bucket;
    struct stream *prev, *next;   /* the thread's open streams (streams) */
    struct stream *rprev, *rnext; /* the thread's open relays (relays) */
    unsigned char id[STREAM_ID_LEN];
    tern_loop *loop;
    tern_http_req *req;
    tern_ws *ws;
    tern_ws_connecting *connecting;
    tern_timer *keepalive;
    bool started;   /* req's response has begun (the relay opened) */
    bool paused;    /* the relay is paused: req's backlog is over STREAM_HIGH */
    bool listed;    /* in the session table */
} stream;

static int (*stream_upgrade_hook)(tern_http_req *, void **, void *);
static void *stream_hook_user;
/* The relays' own listener: a Unix socket in a directory only this user
 * may enter (mkdtemp), so that the relays count against no per-address
 * limit, need no TLS, and are reachable from no network. "" until
 * app_serve_stream_listen. */
static char relay_dir[200], relay_path[220];
/* The relay key: 128 random bits in hex, drawn with the listener and
 * sent by every relay as RELAY_HEADER, so that /pubsub tells a relay
 * from a client (app_serve_stream_relay): the backend proxy is told
 * "http_stream" for it. "" while there is no listener. Read-only once
 * the loops run. */
#define RELAY_HEADER "X-Tern-Relay"
#define RELAY_KEY_LEN (2 * STREAM_ID_LEN)
static char relay_key[RELAY_KEY_LEN + 1];

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static stream *table[STREAM_BUCKETS];
/* Each loop's streams with a response under way, which the shutdown ends
 * (as serve_sse.c's: a graceful shutdown would wait for them). */
static _Thread_local stream *streams;
/* Each loop's open relays, those whose stream has ended and that are
 * closing included. No server owns a relay (it is a client connection):
 * the shutdown drops them itself (drain_loop), for once its server is
 * done the loop stops, and a relay still alive then, its closing
 * handshake waiting on a session of another loop, would never be freed.
 * draining: this loop's shutdown has begun; a new stream is refused. */
static _Thread_local stream *relays;
static _Thread_local bool draining;

/* ---- the session table ------------------------------------------------------ */

static void table_add(stream *s) {
    pthread_mutex_lock(&table_lock);
    stream **b = &table[s->id[0]];
    s->next_in_bucket = *b;
    *b = s;
    s->listed = true;
    pthread_mutex_unlock(&table_lock);
}

static void table_remove(stream *s) {
    if (!s->listed)
        return;
    pthread_mutex_lock(&table_lock);
    for (stream **p = &table[s->id[0]]; *p; p = &(*p)->next_in_bucket)
        if (*p == s) {
            *p = s->next_in_bucket;
            break;
        }
    s->listed = false;
    pthread_mutex_unlock(&table_lock);
}

/* The stream of id, or NULL; only its own loop may use what this returns
 * (elsewhere it may be freed at any time): under table_lock. */
static stream *table_find_locked(const unsigned char *id) {
    for (stream *s = table[id[0]]; s; s = s->next_in_bucket)
        if (memcmp(s->id, id, STREAM_ID_LEN) == 0)
            return s;
    return NULL;
}

/* ---- the response ----------------------------------------------------------- */

static void unlist(stream *s) {
    if (s->prev || streams == s) {
        *(s->prev ? &s->prev->next : &streams) = s->next;
        if (s->next)
            s->next->prev = s->prev;
    }
    s->prev = s->next = NULL;
}

/* The response is over (ended, or its client gone): nothing touches req
 * after this, no POST finds the stream, and the relay is let go. */
static void drop_req(stream *s) {
    table_remove(s);
    unlist(s);
    if (s->keepalive)
        tern_timer_stop(s->keepalive);
    s->keepalive = NULL;
    if (s->req) {
        tern_http_on_abort(s->req, NULL, NULL);
        tern_http_on_drain(s->req, NULL, NULL);
    }
    s->req = NULL;
    if (s->ws) {
        /* a paused relay would not read /pubsub's answer to its close,
         * and wait for it until the close timeout */
        if (s->paused && tern_ws_resume(s->ws) == 0)
            s->paused = false;
        tern_ws_close(s->ws, 1000, NULL);
    } else if (s->connecting)
        tern_ws_connect_cancel(s->connecting);
}

/* The last line, {"close":code,"reason":...}, and the response's end;
 * before the response began (the relay still connecting), a 503. */
static void end_stream(stream *s, int code, const char *reason, size_t len) {
    if (s->req == NULL)
        return;
    if (!s->started) {
        tern_http_req *req = s->req;
        drop_req(s);
        tern_http_respond(req, 503, "text/plain", "shutting down\n", 14);
        return;
    }
    char line[64 + 6 * 123];   /* a close reason is at most 123 bytes */
    int n = snprintf(line, sizeof(line), "{\"close\":%d,\"reason\":\"", code);
    n += (int)app_json_escape(line + n, sizeof(line) - (size_t)n, reason, len);
    n += snprintf(line + n, sizeof(line) - (size_t)n, "\"}\n");
    tern_http_req *req = s->req;
    drop_req(s);
    tern_http_write(req, line, (size_t)n);
    tern_http_end(req);
}

static void on_abort(tern_http_req *req, void *user) {
    (void)req;
    drop_req(user);
}

static void on_drain(tern_http_req *req, void *user) {
    (void)req;
    stream *s = user;
    if (s->paused && s->ws && tern_ws_resume(s->ws) == 0)
        s->paused = false;
}

static void keepalive(tern_timer *t, void *user) {
    (void)t;
    stream *s = user;
    if (s->req && tern_http_buffered(s->req) == 0)
        tern_http_write(s->req, "\n", 1);
}

/* ---- the relay: the stream's /pubsub session ---------------------------------- */

static void relay_open(tern_ws *ws, void *user) {
    stream *s = user;
    s->connecting = NULL;
    s->ws = ws;
    s->rnext = relays;
    if (relays)
        relays->rprev = s;
    relays = s;
    if (s->req == NULL) {   /* the client went while the relay connected */
        if (draining)
            tern_ws_abort(ws);
        else
            tern_ws_close(ws, 1000, NULL);
        return;
    }
    char hex[2 * STREAM_ID_LEN + 1], line[64];
    for (int i = 0; i < STREAM_ID_LEN; i++)
        snprintf(hex + 2 * i, 3, "%02x", s->id[i]);
    int n = snprintf(line, sizeof(line), "{\"session\":\"%s\"}\n", hex);
    tern_http_add_header(s->req, "Cache-Control", "no-store");
    tern_http_add_header(s->req, "X-Accel-Buffering", "no");   /* nginx: stream, do not buffer */
    if (tern_timer_start(s->loop, &s->keepalive, STREAM_KEEPALIVE_MS, STREAM_KEEPALIVE_MS,
                         keepalive, s) < 0) {
        s->keepalive = NULL;
        tern_http_req *req = s->req;
        drop_req(s);
        tern_http_respond(req, 503, "text/plain", "out of memory\n", 14);
        return;
    }
    tern_http_on_abort(s->req, NULL, NULL);
    if (tern_http_start(s->req, 200, "application/x-ndjson") < 0) {
        s->req = NULL;   /* its response counts as ended: req is gone */
        drop_req(s);
        return;
    }
    tern_http_on_abort(s->req, on_abort, s);
    s->started = true;
    tern_http_on_drain(s->req, on_drain, s);
    tern_http_write(s->req, line, (size_t)n);
    table_add(s);
}

/* A /pubsub message: a line of the stream. The relay stops reading while
 * the client is behind, so that /pubsub's own policy judges it. */
static void relay_message(tern_ws *ws, const char *data, size_t len, int opcode, void *user) {
    stream *s = user;
    if (s->req == NULL || opcode != TERN_WS_TEXT)
        return;   /* /pubsub sends text only */
    tern_http_write(s->req, data, len);
    tern_http_write(s->req, "\n", 1);
    if (s->req && tern_http_buffered(s->req) > STREAM_HIGH && tern_ws_pause(ws) == 0)
        s->paused = true;
}

static void relay_close(tern_ws *ws, int code, const char *reason, size_t len, void *user) {
    (void)ws;
    stream *s = user;
    s->ws = NULL;
    *(s->rprev ? &s->rprev->rnext : &relays) = s->rnext;
    if (s->rnext)
        s->rnext->rprev = s->rprev;
    end_stream(s, code, reason, len);
    free(s);
}

/* The relay never opened: /pubsub's refusal (401 bad token, 403 a refused
 * Origin) is the stream's answer; any other failure a 502. */
static void relay_failed(const tern_ws_connect_error *e, void *user) {
    stream *s = user;
    s->connecting = NULL;
    if (s->req) {
        int status = e->status >= 400 && e->status <= 599 ? e->status : 502;
        char body[96];
        int n = snprintf(body, sizeof(body), "%s\n",
                         status == 502 ? "pubsub unavailable" : tern_http_reason(status));
        tern_http_req *req = s->req;
        drop_req(s);
        tern_http_respond(req, status, "text/plain", body, (size_t)n);
    }
    free(s);
}

static const tern_ws_handlers relay_handlers = {.on_open = relay_open,
                                                .on_message = relay_message,
                                                .on_close = relay_close,
                                                .on_connect_error = relay_failed};

/* ws+unix:RELAY_SOCKET:/pubsub, with the token if the query has one. */
static bool relay_url(tern_http_req *req, char *url, size_t cap) {
    static _Thread_local char token[TERN_TOKEN_MAX + 1], q[TERN_TOKEN_MAX + 8];
    q[0] = '\0';
    ssize_t tl = tern_http_query_param(req, "token", token, sizeof(token));
    if (tl > 0) {
        /* A JWT is base64url and dots: nothing to escape in a query. */
        for (ssize_t i = 0; i < tl; i++)
            if (!(token[i] == '-' || token[i] == '_' || token[i] == '.' ||
                  (token[i] >= '0' && token[i] <= '9') || (token[i] >= 'a' && token[i] <= 'z') ||
                  (token[i] >= 'A' && token[i] <= 'Z')))
                return false;
        snprintf(q, sizeof(q), "?token=%s", token);
    } else if (tl < 0 && tl != -ENOENT) {
        return false;   /* too long for a token */
    }
    int n = snprintf(url, cap, "ws+unix:%s:/pubsub%s", relay_path, q);
    return n > 0 && (size_t)n < cap;
}

/* ---- the routes ---------------------------------------------------------------- */

static void refuse(tern_http_req *req, int status, const char *why) {
    char b[128];
    int n = snprintf(b, sizeof(b), "%s\n", why);
    tern_http_respond(req, status, "text/plain", b, (size_t)n);
}

/* The upgrade hook's verdict (--allowed-origin), asked as /pubsub asks
 * it: false, and the request answered with its status, when refused. */
static bool origin_allowed(tern_http_req *req) {
    void *hook_user = NULL;
    int status = stream_upgrade_hook(req, &hook_user, stream_hook_user);
    if (status != 0)
        refuse(req, status, tern_http_reason(status));
    return status == 0;
}

static void stream_handler(tern_http_req *req, void *user) {
    (void)user;
    if (draining) {   /* a request on a kept-alive connection, after drain_loop */
        refuse(req, 503, "shutting down");
        return;
    }
    if (!origin_allowed(req))
        return;
    static _Thread_local char url[TERN_TOKEN_MAX + 300];
    if (!relay_url(req, url, sizeof(url))) {
        refuse(req, 401, "bad token");
        return;
    }
    stream *s = calloc(1, sizeof(*s));
    if (s == NULL || tern__crypto_random(s->id, sizeof(s->id)) < 0) {
        free(s);
        refuse(req, 503, "out of memory");
        return;
    }
    s->loop = tern_http_req_loop(req);
    s->req = req;
    /* /pubsub judges the client by what it sent us: its token and Origin
     * (one too long for /pubsub is refused as /pubsub would refuse it). */
    static _Thread_local char auth[TERN_TOKEN_MAX + 32], origin[600];
    static _Thread_local char key[sizeof(RELAY_HEADER) + RELAY_KEY_LEN + 2];
    const char *headers[4];
    int nh = 0;
    size_t al, ol;
    const char *a = tern_http_header(req, "Authorization", &al);
    const char *o = tern_http_header(req, "Origin", &ol);
    if ((a && al >= sizeof(auth) - 16) || (o && ol >= sizeof(origin) - 9)) {
        free(s);
        refuse(req, a && al >= sizeof(auth) - 16 ? 401 : 403,
               a && al >= sizeof(auth) - 16 ? "bad token" : "Forbidden");
        return;
    }
    if (a) {
        snprintf(auth, sizeof(auth), "Authorization: %.*s", (int)al, a);
        headers[nh++] = auth;
    }
    if (o) {
        snprintf(origin, sizeof(origin), "Origin: %.*s", (int)ol, o);
        headers[nh++] = origin;
    }
    snprintf(key, sizeof(key), RELAY_HEADER ": %s", relay_key);
    headers[nh++] = key;
    headers[nh] = NULL;
    tern_ws_client_options opt = {.headers = headers};
    int err = tern_ws_connect2(s->loop, url, &relay_handlers, &opt, s, &s->connecting);
    if (err < 0) {
        free(s);
        refuse(req, err == -ENOMEM ? 503 : 400, err == -ENOMEM ? "out of memory" : "bad request");
        return;
    }
    tern_http_on_abort(req, on_abort, s);
    s->next = streams;
    if (streams)
        streams->prev = s;
    streams = s;
}

/* Ops for a stream, on their way to its loop. */
typedef struct stream_ops {
    unsigned char id[STREAM_ID_LEN];
    size_t len;
    char data[];
} stream_ops;

/* On the stream's loop: each line of the body to /pubsub, as its client
 * would send it. The stream may have ended meanwhile: then they go. */
static void deliver(tern_loop *loop, void *user) {
    (void)loop;
    stream_ops *o = user;
    pthread_mutex_lock(&table_lock);
    stream *s = table_find_locked(o->id);   /* ours, on this loop: it stays */
    pthread_mutex_unlock(&table_lock);
    for (size_t i = 0; s && s->ws && i < o->len;) {
        const char *nl = memchr(o->data + i, '\n', o->len - i);
        size_t end = nl ? (size_t)(nl - o->data) : o->len, n = end - i;
        if (n > 0 && o->data[end - 1] == '\r')
            n--;
        if (n > 0)
            tern_ws_send(s->ws, o->data + i, n, TERN_WS_TEXT);
        i = end + 1;
    }
    free(o);
}

static void ops_handler(tern_http_req *req, void *user) {
    (void)user;
    if (!origin_allowed(req))
        return;
    char hex[2 * STREAM_ID_LEN + 2];
    ssize_t hl = tern_http_query_param(req, "session", hex, sizeof(hex));
    unsigned char id[STREAM_ID_LEN];
    bool ok = hl == 2 * STREAM_ID_LEN;
    for (int i = 0; ok && i < STREAM_ID_LEN; i++) {
        int a = tern__hex_value(hex[2 * i]), b = tern__hex_value(hex[2 * i + 1]);
        ok = a >= 0 && b >= 0;
        id[i] = (unsigned char)(a << 4 | b);
    }
    if (!ok) {
        refuse(req, 400, "bad session");
        return;
    }
    size_t len;
    const char *body = tern_http_body(req, &len);
    stream_ops *o = malloc(sizeof(*o) + len);
    if (o == NULL) {
        refuse(req, 503, "out of memory");
        return;
    }
    memcpy(o->id, id, sizeof(id));
    o->len = len;
    memcpy(o->data, body, len);
    pthread_mutex_lock(&table_lock);
    stream *s = table_find_locked(id);
    /* Posted under the lock: the loop is the stream's, and alive. */
    int err = s ? tern_loop_post(s->loop, deliver, o) : -ENOENT;
    pthread_mutex_unlock(&table_lock);
    if (err < 0) {
        free(o);
        refuse(req, err == -ENOENT ? 404 : 503, err == -ENOENT ? "no such session" : "out of memory");
        return;
    }
    tern_http_respond(req, 202, "application/json", "{}\n", 3);
}

/* On each loop: its streams end now (1001, as /pubsub's sessions do), and
 * every relay is dropped (their on_close at this batch's end: before the
 * loop can stop). A relay that opens later is dropped as it opens; one
 * still connecting when the loop is freed is cancelled by tern_loop_free. */
static void drain_loop(tern_loop *loop, void *user) {
    (void)loop, (void)user;
    draining = true;
    while (streams)
        end_stream(streams, 1001, "going away", 10);
    for (stream *s = relays; s; s = s->rnext)
        tern_ws_abort(s->ws);
}

void app_serve_stream_drain(tern_server *srv) {
    for (int i = 0; i < tern_server_peer_count(srv); i++) {
        tern_server *p = tern_server_peer(srv, i);
        if (p && tern_loop_post(tern_server_loop(p), drain_loop, NULL) < 0)
            continue;   /* out of memory: that loop's end at the shutdown's deadline */
    }
}

int app_serve_stream_routes(tern_server *srv, int (*hook)(tern_http_req *, void **, void *),
                            void *user) {
    stream_upgrade_hook = hook;
    stream_hook_user = user;
    int err = tern_http_route(srv, "GET", "/http-stream", stream_handler, NULL);
    return err < 0 ? err : tern_http_route(srv, "POST", "/http-stream/ops", ops_handler, NULL);
}

int app_serve_stream_listen(tern_server *srv, const tern_listen_options *opt) {
    const char *tmp = getenv("TMPDIR");
    if (tmp == NULL || tmp[0] == '\0' || strlen(tmp) > 120)
        tmp = "/tmp";
    snprintf(relay_dir, sizeof(relay_dir), "%s/tern-relay-XXXXXX", tmp);
    if (mkdtemp(relay_dir) == NULL) {
        relay_dir[0] = '\0';
        return -errno;
    }
    snprintf(relay_path, sizeof(relay_path), "%s/pubsub.sock", relay_dir);
    uint8_t bits[STREAM_ID_LEN];
    if (tern__crypto_random(bits, sizeof(bits)) < 0) {
        app_serve_stream_unlisten();
        return -EIO;
    }
    for (int i = 0; i < STREAM_ID_LEN; i++)
        snprintf(relay_key + 2 * i, 3, "%02x", bits[i]);
    int err = tern_listen_unix(srv, relay_path, opt);
    if (err < 0)
        app_serve_stream_unlisten();
    return err;
}

void app_serve_stream_unlisten(void) {
    if (relay_dir[0] == '\0')
        return;
    unlink(relay_path);
    rmdir(relay_dir);
    relay_dir[0] = '\0';
    relay_key[0] = '\0';
}

bool app_serve_stream_relay(const tern_http_req *req) {
    size_t len;
    const char *v = tern_http_header(req, RELAY_HEADER, &len);
    /* compared in constant time: the key is a credential */
    return relay_key[0] != '\0' && v && len == RELAY_KEY_LEN &&
           tern__crypto_equal(v, relay_key, RELAY_KEY_LEN);
}
