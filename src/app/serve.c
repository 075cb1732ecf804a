/* tern serve: the demo server.
 *
 * Public listener (--host/--port, --tls-port, --unix):
 *   GET  /ping              "pong"
 *   GET  /, /market         the live page (src/app/market.html)
 *   GET  /tern-client.js    the page's client (clients/js/tern-client.js)
 *   GET  /pubsub            WebSocket pub/sub with a small JSON protocol:
 *                           {"op":"subscribe"|"unsubscribe","topic":"T"},
 *                           {"op":"publish","topic":"T","data":"..."} in;
 *                           {"topic":"T","seq":N,"data":"..."}, acks
 *                           {"ok":OP,...} and {"error":"...","op":OP} out
 *                           (src/app/serve_pubsub.c has the details)
 * Only with --bench-routes (they make the server do work on request, for
 * the benchmarks, tests and Autobahn; off by default: 404 like any path):
 *   GET  /echo?size=N       N bytes of 'x'
 *   POST /echo              the request body
 *   GET  /stream?chunks=K&size=S   a chunked response of K chunks of S bytes
 *   POST /upload            a streamed request body: answers its length
 *   GET  /delay?ms=N        "done" after N ms (an answer given later)
 *   GET  /item/:id          "id N from PEER": a numeric route parameter (400 when
 *                           not a number) and the peer's address
 *   GET  /ws                WebSocket echo: every message back with its opcode
 *                           (--ws-async: echoed later, from the loop;
 *                           --ws-deadline-ms N: closed with 1008 after N ms
 *                           without a message)
 *                           (subprotocol "tern.echo" when asked for)
 *   GET  /ws/broadcast      WebSocket: every message goes to every connection
 *                           of this route, on every thread: framed (and
 *                           compressed) once per thread, and posted as a copy
 *                           to each other thread's loop; one order for every
 *                           connection, whichever threads send (bcast_message)
 *   GET  /ws/room/:room     WebSocket echo; the 101 names the room (X-Tern-Room)
 *   GET  /fanout            WebSocket: each message answered with 10 binary
 *                           messages of 10 000 bytes
 *   GET  /fanout/sub        WebSocket subscribed to topic "fanout"
 *   GET  /fanout/pub        WebSocket: each message published to "fanout"
 *   GET  /fanout/pub-keyed  the same with a key
 *   GET  /(anything else)   static files under --root, when given
 *   (Host NAME of a --vhost NAME=ROOT)  the files under ROOT, nothing else
 *   (any other path)        404 naming the path (tern_http_not_found); a
 *                           known path with another method is 405, an
 *                           unknown method 501
 *
 * Admin listener (--admin-listen HOST:PORT, default 127.0.0.1:9090; off:
 * none), a server of its own on loop 0, not on the public port:
 *   POST /publish/:topic    the body published to topic:
 *                           {"seq":N,"subscribers":M}; needs
 *                           "Authorization: Bearer KEY", KEY the first line of
 *                           --api-key-file (401 otherwise; 403 without one)
 *   GET  /stats             the threads' counters as JSON: their sum, then
 *                           each thread's
 *   GET  /metrics           the same in Prometheus' text format, with Redis's
 *                           link and the refusals by reason (serve_metrics.c)
 *   GET  /healthz, /health  200 "ok": the process answers
 *   GET  /readyz, /ready    200 "ready", or 503 with the reason: draining
 *                           (after SIGTERM), or --redis given and its link
 *                           down
 *
 * --threads N (default: one per core) loops, one per thread, with tern_run:
 * the same routes on each, SO_REUSEPORT listeners.
 *
 * SIGINT or SIGTERM: graceful shutdown of every thread (stop accepting,
 * finish responses in flight, close idle connections, close WebSockets
 * with 1001 at random moments over --shutdown-spread, /readyz 503), exit
 * 0. A second signal exits at once. */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <strings.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "app/app.h"
#include "app/serve_tokens.h"
#include "app/topic_rules.h"
#include "tern/tern.h"

#define MAX_ECHO_SIZE (64u * 1024 * 1024)
#define ORIGINS_MAX 32             /* --allowed-origin values */
#define FEED_HISTORY 4096          /* topic market's history, unless --pubsub-history */
#define FEED_HISTORY_MS 60000

typedef struct serve_thread serve_thread;

/* A connection of /ws/broadcast, on its thread's list while open. */
typedef struct bcast_member {
    tern_ws *ws;
    serve_thread *th;
    struct bcast_member *next, *prev;
} bcast_member;

/* A /ws message kept by --ws-async to be echoed later: the connection
 * (referenced), then len bytes of payload, padded to keep the next entry
 * aligned. */
typedef struct later_msg {
    tern_ws *ws;
    uint32_t len;
    int opcode;
    char data[];
} later_msg;

/* What belongs to one thread (loop): only that loop touches it. */
struct serve_thread {
    struct serve_ctx *ctx;
    int index;
    uint64_t ws_conn_seq;      /* numbers the WebSocket connections (with the thread) */
    bcast_member *members;     /* /ws/broadcast connections of this loop */
    /* /ws/broadcast messages posted to this loop and not yet delivered
     * there: raised under ctx->bcast_lock by whichever thread posts,
     * lowered by this loop once it has delivered one. */
    atomic_uint bcast_inflight;
    /* --ws-async: the messages waiting for their echo, later_msg after
     * later_msg in arrival order in one buffer (no allocation per message
     * once it has grown), and whether the flush that echoes them is due
     * (its timer, in timer mode, armed; or its post made). */
    char *later;
    size_t later_len, later_cap;
    bool later_due;
};

/* Shared by every thread: set before they start, read-only after. */
typedef struct serve_ctx {
    bool quiet;
    /* --allowed-origin (and --ws-origin): the Origins a WebSocket upgrade
     * may come from, exact or a wildcard subdomain ("*." after the scheme); none: any */
    const char *origins[ORIGINS_MAX];
    int norigins;
    FILE *access_log;          /* --access-log, or NULL (stdio locks each line) */
    tern_tls *tls;             /* --tls-cert/--tls-key, or NULL */
    int nthreads;
    serve_thread *threads;
    /* what setup needs */
    const char *host, *unix_path, *root;
    int port, tls_port;
    const char **vhosts;       /* --vhost NAME=ROOT */
    int nvhosts;
    tern_ws_options wo;
    tern_pubsub_options po;    /* --pubsub-max-backlog, --pubsub-policy, --pubsub-history* */
    tern__serve_pubsub_limits ps_limits;   /* --pubsub-max-message, --pubsub-rate */
    tern__serve_token_flags token_flags;   /* --token-* (serve_tokens.c) */
    tern__topic_rules rules;   /* --topic, --pubsub-topic-policy, and the feed's topics */
    /* --redis URL (with --redis-password-file's password put in), or NULL;
     * shown only through tern__serve_redis_redact */
    char *redis;
    bool feed;                 /* --feed on|off (on) */
    tern_listen_options listen;   /* --sndbuf */
    int ws_async;              /* --ws-async[=timer|post]: /ws echoes each message later */
    uint32_t ws_deadline_ms;   /* --ws-deadline-ms: /ws's deadline, moved by every message */
    unsigned feed_rate;        /* --feed-rate N: market updates a second */
    tern_server *first;        /* thread 0's server (setup's) */
    bool bench_routes;         /* --bench-routes: /echo, /ws, /fanout... registered */
    /* --admin-listen HOST:PORT (admin_host NULL: off): /publish and /stats
     * on a server of their own, on loop 0 (admin, freed by serve_teardown) */
    const char *admin_host;
    int admin_port;
    char admin_host_buf[256];
    tern_server *admin;
    tern_server_options server_options;   /* the admin server's too */
    tern_timer *watchdog;      /* systemd's WatchdogSec: WATCHDOG=1 from loop 0, or NULL */
    /* --api-key-file: its first line, or NULL (then POST /publish is 403) */
    char *api_key;
    /* /ws/broadcast's sequencer: a message is given its place (posted to
     * every other loop, and to its own when that one has posts of it in
     * flight) under this lock, so every loop's FIFO post queue holds the
     * messages in one order. */
    pthread_mutex_t bcast_lock;
    /* Set by the first SIGTERM or SIGINT (on loop 0), read by the admin
     * routes: from then on the server only finishes what it has. */
    atomic_bool draining;
} serve_ctx;

/* The thread whose loop runs this request. */
static serve_thread *thread_of(tern_http_req *req, serve_ctx *ctx) {
    int i = tern_server_index(tern_http_req_server(req));
    return &ctx->threads[i < 0 || i >= ctx->nthreads ? 0 : i];
}

/* --log-level: the library's lines on stderr. */
static void log_stderr(int level, const char *msg, void *user) {
    tern__serve_log(stderr, level, "%s", msg);
}

/* --access-log: peer method target status bytes duration, one line each. */
static void access_line(tern_server *srv, const tern_http_access *a, void *user) {
    serve_ctx *ctx = user;
    tern__serve_log_access(ctx->access_log, a);
}

/* Reads a non-negative integer query parameter; -1 when absent or bad. */
static long long query_num(tern_http_req *req, const char *name, long long max) {
    char buf[32];
    ssize_t n = tern_http_query_param(req, name, buf, sizeof(buf));
    if (n <= 0)
        return -1;
    char *end;
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    if (errno || *end || v < 0 || v > max)
        return -1;
    return v;
}

static void bad_request(tern_http_req *req, const char *why) {
    tern_http_respond(req, 400, "text/plain", why, strlen(why));
}

static void on_ping(tern_http_req *req, void *user) {
    tern_http_respond(req, 200, "text/plain", "pong", 4);
}

static void on_not_found(tern_http_req *req, void *user) {
    size_t len;
    const char *path = tern_http_path(req, &len);
    char body[160];
    int n = snprintf(body, sizeof(body), "tern: no route for %.*s\n",
                     len > 100 ? 100 : (int)len, path);
    tern_http_respond(req, 404, "text/plain", body, (size_t)n);
}

static void on_item(tern_http_req *req, void *user) {
    int64_t id;
    int err = tern_http_param_int(req, "id", &id);
    if (err < 0) {
        bad_request(req, err == -ERANGE ? "id out of range\n" : "id must be an integer\n");
        return;
    }
    struct sockaddr_storage ss;
    socklen_t sl;
    char peer[TERN_ADDRSTRLEN] = "-";
    if (tern_http_peer(req, &ss, &sl) == 0)
        tern_addr_format((struct sockaddr *)&ss, sl, peer, sizeof(peer));
    char out[200];
    int n = snprintf(out, sizeof(out), "id %lld from %s\n", (long long)id, peer);
    tern_http_respond(req, 200, "text/plain", out, (size_t)n);
}

static void on_echo_get(tern_http_req *req, void *user) {
    long long size = query_num(req, "size", MAX_ECHO_SIZE);
    if (size < 0) {
        bad_request(req, "size must be an integer from 0 to 67108864\n");
        return;
    }
    /* Small answers (the benchmarks' case) come from one static block;
     * large ones from a block made for the request and freed after it, so
     * the largest size ever asked is not kept for good. */
    static char small[65536];
    if (small[0] != 'x')
        memset(small, 'x', sizeof(small));
    char *xs = small;
    if ((size_t)size > sizeof(small) && (xs = malloc((size_t)size)) == NULL) {
        tern_http_respond(req, 500, "text/plain", "out of memory\n", 14);
        return;
    }
    if (xs != small)
        memset(xs, 'x', (size_t)size);
    tern_http_respond(req, 200, "application/octet-stream", xs, (size_t)size);
    if (xs != small)
        free(xs);
}

static void on_echo_post(tern_http_req *req, void *user) {
    size_t len;
    const char *body = tern_http_body(req, &len);
    size_t ct_len;
    const char *ct = tern_http_header(req, "Content-Type", &ct_len);
    char type[128] = "application/octet-stream";
    if (ct && ct_len < sizeof(type)) {
        memcpy(type, ct, ct_len);
        type[ct_len] = '\0';
    }
    tern_http_respond(req, 200, type, body, len);
}

static void on_stream(tern_http_req *req, void *user) {
    long long chunks = query_num(req, "chunks", 100000);
    long long size = query_num(req, "size", 1 << 20);
    if (chunks < 0) chunks = 4;
    if (size < 0) size = 16;
    char *buf = malloc((size_t)size + 1);
    if (buf == NULL) {
        tern_http_respond(req, 500, "text/plain", "out of memory\n", 14);
        return;
    }
    tern_http_start(req, 200, "application/octet-stream");
    for (long long i = 0; i < chunks; i++) {
        memset(buf, 'a' + (int)(i % 26), (size_t)size);
        tern_http_write(req, buf, (size_t)size);
    }
    free(buf);
    tern_http_end(req);
}

typedef struct upload_state {
    uint64_t bytes;
    uint32_t sum;   /* a simple checksum, so tests can tell the bytes arrived intact */
} upload_state;

static void on_upload_body(tern_http_req *req, const char *data, size_t len, bool last, void *user) {
    upload_state *st = user;
    for (size_t i = 0; i < len; i++)
        st->sum = st->sum * 31 + (unsigned char)data[i];
    st->bytes += len;
    if (!last)
        return;
    char out[96];
    int n = snprintf(out, sizeof(out), "%llu %u\n", (unsigned long long)st->bytes, st->sum);
    free(st);
    tern_http_respond(req, 200, "text/plain", out, (size_t)n);
}

static void on_upload_abort(tern_http_req *req, void *user) { free(user); }

static void on_upload(tern_http_req *req, void *user) {
    upload_state *st = calloc(1, sizeof(*st));
    if (st == NULL) {
        tern_http_respond(req, 500, "text/plain", "out of memory\n", 14);
        return;
    }
    tern_http_on_abort(req, on_upload_abort, st);
    tern_http_read_body(req, on_upload_body, st);
}

typedef struct delay_state {
    tern_http_req *req;
    tern_timer *timer;
} delay_state;

static void delay_fire(tern_timer *t, void *user) {
    delay_state *d = user;
    tern_http_respond(d->req, 200, "text/plain", "done\n", 5);
    tern_timer_stop(t);
    free(d);
}

static void delay_abort(tern_http_req *req, void *user) {
    delay_state *d = user;
    tern_timer_stop(d->timer);
    free(d);
}

static void on_delay(tern_http_req *req, void *user) {
    long long ms = query_num(req, "ms", 600000);
    if (ms < 0) {
        bad_request(req, "ms must be an integer from 0 to 600000\n");
        return;
    }
    delay_state *d = calloc(1, sizeof(*d));
    if (d == NULL || tern_timer_start(tern_http_req_loop(req), &d->timer, (uint64_t)ms, 0, delay_fire, d) < 0) {
        free(d);
        tern_http_respond(req, 500, "text/plain", "out of memory\n", 14);
        return;
    }
    d->req = req;
    tern_http_on_abort(req, delay_abort, d);
}

static void ws_echo(tern_ws *ws, const char *data, size_t len, int opcode, void *user) {
    tern_ws_send(ws, data, len, opcode);
}

/* ---- /ws: the benchmark's four variants ---------------------------------
 * sync: the echo is sent inside on_message (ws_echo). --ws-async: the
 * message is kept and echoed later from the loop, as a handler waiting on
 * a database would answer: copied with a reference to its connection into
 * the thread's queue, and one flush per batch echoes the whole queue. The
 * flush runs from a 0 ms timer (the default, "timer": after every event of
 * the batch, in the same iteration, with no system call) or from a post
 * ("post": tern_loop_post, what another thread's answer goes through; from
 * the loop's own thread it costs an eventfd write, an epoll_wait that
 * reports it and its read per batch).
 * --ws-deadline-ms N, with either: the connection's deadline is set at the
 * open and moved by every message; when N ms pass without one, tern closes
 * the connection with 1008 "deadline" (the library's default for a route
 * without on_deadline). */

static serve_thread *ws_thread(tern_ws *ws, serve_ctx *ctx);

enum { WS_ASYNC_NONE, WS_ASYNC_TIMER, WS_ASYNC_POST };

static size_t later_size(size_t len) {
    return (sizeof(later_msg) + len + 7) & ~(size_t)7;
}

/* Flow control of a handler that answers later. The pause policy holds a
 * peer back by not reading while the backlog is over its hard limit, but it
 * can do so only for answers sent inside on_message: a later answer is a
 * push to it, refused (1008) past the hard limit. So the handler does what
 * the policy would, by hand: it stops reading a connection
 * (tern_ws_pause; the connection's user data marks the pause as ours)
 * while the thread's queue holds more than LATER_PAUSE bytes (one batch
 * can bring many reads: io_uring hands over every completion of an
 * iteration), or while the echoes sent to it are more than LATER_PAUSE
 * behind; and reads it again when the flush finds it caught up, or when
 * its backlog has gone (on_drain). A peer that writes without reading then
 * fills its TCP window, not our memory. */
#define LATER_PAUSE (256u * 1024)
static char later_paused;   /* the mark: &later_paused as the connection's user data */

static void later_pause(tern_ws *ws) {
    if (tern_ws_user(ws) != &later_paused && tern_ws_pause(ws) == 0)
        tern_ws_set_user(ws, &later_paused);
}

static void later_resume(tern_ws *ws) {
    if (tern_ws_user(ws) == &later_paused) {
        tern_ws_set_user(ws, NULL);
        tern_ws_resume(ws);
    }
}

/* After an echo was sent to ws. */
static void later_settle(tern_ws *ws) {
    if (tern_ws_buffered(ws) > LATER_PAUSE)
        later_pause(ws);
    else
        later_resume(ws);
}

static void later_drain(tern_ws *ws, void *user) {
    later_resume(ws);
}

/* The post: echoes what the queue holds, in order, to the connections
 * still open, and drops each message's reference. Sends call nothing back
 * (no callback runs inside them), so the queue cannot grow meanwhile. */
static void later_flush(tern_loop *loop, void *user) {
    serve_thread *th = user;
    th->later_due = false;
    for (size_t off = 0; off < th->later_len;) {
        later_msg *m = (later_msg *)(th->later + off);
        if (tern_ws_is_open(m->ws)) {
            tern_ws_send(m->ws, m->data, m->len, m->opcode);
            later_settle(m->ws);
        }
        tern_ws_unref(m->ws);
        off += later_size(m->len);
    }
    th->later_len = 0;
    if (th->later_cap > (4u << 20)) {   /* a burst's buffer is not kept for good */
        free(th->later);
        th->later = NULL;
        th->later_cap = 0;
    }
}

/* The timer mode's one-shot timer: it exists only while a flush is due. */
static void later_timer(tern_timer *t, void *user) {
    tern_timer_stop(t);
    later_flush(NULL, user);
}

static void ws_echo_later(tern_ws *ws, const char *data, size_t len, int opcode, void *user) {
    serve_ctx *ctx = user;
    serve_thread *th = ws_thread(ws, ctx);
    if (ctx->ws_deadline_ms)
        tern_ws_set_deadline(ws, ctx->ws_deadline_ms);
    size_t need = later_size(len);
    if (len > UINT32_MAX)
        return;   /* above any --ws-max-message the parser allows */
    if (th->later_len + need > th->later_cap) {
        size_t cap = th->later_cap ? th->later_cap : 64 * 1024;
        while (cap < th->later_len + need)
            cap *= 2;
        char *p = realloc(th->later, cap);
        if (p == NULL) {
            tern_ws_close(ws, TERN_WS_INTERNAL, "out of memory");
            return;
        }
        th->later = p;
        th->later_cap = cap;
    }
    if (!th->later_due) {
        tern_timer *t;
        int err = ctx->ws_async == WS_ASYNC_POST
                      ? tern_loop_post(tern_ws_loop(ws), later_flush, th)
                      : tern_timer_start(tern_ws_loop(ws), &t, 0, 0, later_timer, th);
        if (err < 0) {
            tern_ws_close(ws, TERN_WS_INTERNAL, "out of memory");
            return;
        }
        th->later_due = true;
    }
    later_msg *m = (later_msg *)(th->later + th->later_len);
    tern_ws_ref(ws);
    m->ws = ws;
    m->len = (uint32_t)len;
    m->opcode = opcode;
    memcpy(m->data, data, len);
    th->later_len += need;
    if (th->later_len > LATER_PAUSE)
        later_pause(ws);   /* the rest of this read waits for the flush */
}

static void ws_echo_deadline(tern_ws *ws, const char *data, size_t len, int opcode, void *user) {
    serve_ctx *ctx = user;
    tern_ws_send(ws, data, len, opcode);
    tern_ws_set_deadline(ws, ctx->ws_deadline_ms);
}

static void ws_echo_open(tern_ws *ws, void *user) {
    serve_ctx *ctx = user;
    if (ctx->ws_deadline_ms)
        tern_ws_set_deadline(ws, ctx->ws_deadline_ms);
}

/* A host name's bytes, for the part a wildcard stands for. */
static bool host_chars(const char *s, size_t len) {
    for (size_t i = 0; i < len; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '-' && s[i] != '.')
            return false;
    return true;
}

/* Whether origin[0..len) is pattern: the same (case-insensitive, as
 * browsers serialize the scheme and host in lower case anyway), or, for
 * a pattern with "*." right after its scheme, scheme://NAME.rest with
 * NAME one or more labels (so not the bare domain, nor one with another
 * port or a path). */
static bool origin_matches(const char *pattern, const char *origin, size_t len) {
    const char *star = strstr(pattern, "://*.");
    if (star == NULL)
        return len == strlen(pattern) && strncasecmp(origin, pattern, len) == 0;
    size_t head = (size_t)(star - pattern) + 3;   /* "scheme://" */
    size_t tail = strlen(star + 4);               /* ".rest" */
    if (len <= head + tail || strncasecmp(origin, pattern, head) != 0 ||
        strncasecmp(origin + len - tail, star + 4, tail) != 0)
        return false;
    const char *name = origin + head;
    size_t nlen = len - head - tail;
    return host_chars(name, nlen) && name[0] != '.' && name[nlen - 1] != '.' &&
           memmem(name, nlen, "..", 2) == NULL;
}

/* An --allowed-origin value: scheme://host[:port] (http or https), where
 * host may start with "*." (any subdomain); no path, no other '*'. */
static bool origin_pattern_ok(const char *p) {
    const char *rest = strncmp(p, "https://", 8) == 0 ? p + 8
                       : strncmp(p, "http://", 7) == 0 ? p + 7 : NULL;
    if (rest == NULL)
        return false;
    if (strncmp(rest, "*.", 2) == 0)
        rest += 2;
    size_t hlen = strcspn(rest, ":");
    if (hlen == 0 || !host_chars(rest, hlen))
        return false;
    if (rest[hlen] == ':') {
        const char *port = rest + hlen + 1;
        if (*port == '\0' || strspn(port, "0123456789") != strlen(port) || strlen(port) > 5)
            return false;
    }
    return true;
}

/* The upgrade hook of every WebSocket route: an Origin check when
 * --allowed-origin is given (browsers send Origin, and a page elsewhere
 * must not reach a user's session here; other clients may send none, and
 * are let in: they can write any Origin anyway), and a connection number
 * in the 101 response. */
static int ws_upgrade(tern_http_req *req, void **conn_user, void *user) {
    serve_ctx *ctx = user;
    size_t olen;
    const char *origin = tern_http_header(req, "Origin", &olen);
    if (ctx->norigins && origin) {
        bool allowed = false;
        for (int i = 0; i < ctx->norigins && !allowed; i++)
            allowed = origin_matches(ctx->origins[i], origin, olen);
        if (!allowed)
            return 403;
    }
    serve_thread *th = thread_of(req, ctx);
    char id[24];
    snprintf(id, sizeof(id), "%llu", (unsigned long long)++th->ws_conn_seq);
    tern_http_add_header(req, "X-Tern-Connection", id);
    *conn_user = NULL;
    return 0;
}

/* /ws/room/:room: the route parameter is there during the upgrade hook. */
static int room_upgrade(tern_http_req *req, void **conn_user, void *user) {
    size_t len;
    const char *room = tern_http_param(req, "room", &len);
    if (room == NULL)
        return 500;
    char name[64];
    if (len >= sizeof(name))
        return 414;
    memcpy(name, room, len);
    name[len] = '\0';
    int r = ws_upgrade(req, conn_user, user);
    if (r == 0 && tern_http_add_header(req, "X-Tern-Room", name) < 0)
        return 400;   /* a parameter is raw: it may hold bytes no header may */
    return r;
}

/* The thread whose loop runs ws. */
static serve_thread *ws_thread(tern_ws *ws, serve_ctx *ctx) {
    int i = tern_server_index(tern_ws_server(ws));
    return &ctx->threads[i < 0 || i >= ctx->nthreads ? 0 : i];
}

static void bcast_open(tern_ws *ws, void *user) {
    serve_thread *th = ws_thread(ws, user);
    bcast_member *m = calloc(1, sizeof(*m));
    if (m == NULL) {
        tern_ws_set_user(ws, NULL);
        tern_ws_close(ws, 1011, "out of memory");
        return;
    }
    m->ws = ws;
    m->th = th;
    m->next = th->members;
    if (m->next)
        m->next->prev = m;
    th->members = m;
    tern_ws_set_user(ws, m);
}

static void bcast_close(tern_ws *ws, int code, const char *reason, size_t reason_len, void *user) {
    bcast_member *m = tern_ws_user(ws);
    if (m == NULL)
        return;
    if (m->prev)
        m->prev->next = m->next;
    else
        m->th->members = m->next;
    if (m->next)
        m->next->prev = m->prev;
    free(m);
}

/* Sends to the members of th (its loop's thread). */
static void bcast_local(serve_thread *th, const char *data, size_t len, int opcode) {
    if (th->members == NULL)
        return;
    tern_ws_prepared *msg = tern_ws_prepare(data, len, opcode, true);
    if (msg == NULL)
        return;
    /* A member the slow-consumer policy closes during its send is told so
     * (bcast_close, which frees it) at the end of the batch, not inside the
     * send: the plain loop is safe. */
    for (bcast_member *m = th->members; m; m = m->next)
        tern_ws_send_prepared(m->ws, msg);
    tern_ws_prepared_free(msg);
}

/* A message for a thread's members: a copy, posted to its loop. */
typedef struct bcast_post {
    serve_thread *th;
    int opcode;
    size_t len;
    char data[];
} bcast_post;

static void bcast_remote(tern_loop *loop, void *user) {
    bcast_post *p = user;
    bcast_local(p->th, p->data, p->len, p->opcode);
    atomic_fetch_sub(&p->th->bcast_inflight, 1);
    free(p);
}

/* Posts a copy to th's loop; false when it could not (the message is then
 * lost for th's members, as before for a full or stopped loop). */
static bool bcast_post_to(tern_server *srv, serve_thread *th, const char *data, size_t len,
                          int opcode) {
    bcast_post *p = malloc(sizeof(*p) + len);
    if (p == NULL)
        return false;
    p->th = th;
    p->opcode = opcode;
    p->len = len;
    memcpy(p->data, data, len);
    /* Raised before the post: the loop may run it (and lower the count)
     * before tern_loop_post returns. */
    atomic_fetch_add(&th->bcast_inflight, 1);
    if (tern_loop_post(tern_server_loop(tern_server_peer(srv, th->index)), bcast_remote, p) < 0) {
        atomic_fetch_sub(&th->bcast_inflight, 1);
        free(p);
        return false;
    }
    return true;
}

/* One order for every member on every thread, as /pubsub keeps per topic.
 * Delivering at once to this thread's members and posting to the others
 * was not enough: two threads' messages crossed, each thread's members
 * seeing their own first. So a message takes its place under bcast_lock,
 * posted to every other loop there (each loop's post queue is FIFO); the
 * sender's own members get it at once only when no earlier message is
 * still on its way to this loop (bcast_inflight is 0), else it is posted
 * to this loop too, behind those. Delivering at once after the unlock is
 * safe: only this thread delivers to its members, and every later message
 * reaches them through its post queue, after this call returns. */
static void bcast_message(tern_ws *ws, const char *data, size_t len, int opcode, void *user) {
    bcast_member *me = tern_ws_user(ws);
    serve_ctx *ctx = user;
    if (me == NULL)
        return;
    tern_server *srv = tern_ws_server(ws);
    bool now = true;
    pthread_mutex_lock(&ctx->bcast_lock);
    for (int i = 0; i < ctx->nthreads; i++) {
        serve_thread *th = &ctx->threads[i];
        if (th != me->th)
            bcast_post_to(srv, th, data, len, opcode);
    }
    if (atomic_load(&me->th->bcast_inflight) != 0) {
        now = false;
        bcast_post_to(srv, me->th, data, len, opcode);
    }
    pthread_mutex_unlock(&ctx->bcast_lock);
    if (now)
        bcast_local(me->th, data, len, opcode);
}

/* GET /stats: every thread's counters (read from any thread: see
 * tern_server_stats) and their sum. */
static void on_stats(tern_http_req *req, void *user) {
    serve_ctx *ctx = user;
    tern_server *srv = ctx->first;   /* the public servers' counters, not the admin's */
    int n = tern_server_peer_count(srv);
    size_t cap = 1024 + (size_t)n * 768, len = 0;   /* each entry under 700 bytes */
    char *out = malloc(cap);
    if (out == NULL) {
        tern_http_respond(req, 500, "text/plain", "out of memory\n", 14);
        return;
    }
    tern_stats sum = {0};
    char *each = malloc(cap);
    size_t elen = 0;
    if (each == NULL) {
        free(out);
        tern_http_respond(req, 500, "text/plain", "out of memory\n", 14);
        return;
    }
#define STATS_FMT "{\"connections\":%llu,\"accepted\":%llu,\"requests\":%llu," \
                  "\"ws_messages_in\":%llu,\"ws_messages_out\":%llu,\"bytes_in\":%llu,\"bytes_out\":%llu," \
                  "\"refused_max_connections\":%llu,\"refused_per_ip\":%llu," \
                  "\"pubsub\":{\"subscriptions\":%llu,\"messages\":%llu,\"delivered\":%llu," \
                  "\"dropped\":%llu,\"closed\":%llu,\"conflated\":%llu,\"queue_max\":%llu}}"
#define U(x) (unsigned long long)(x)
#define STATS_ARGS(s, p) U((s).connections), U((s).accepted), U((s).requests), \
                         U((s).ws_messages_in), U((s).ws_messages_out), U((s).bytes_in), \
                         U((s).bytes_out), U((s).refused_max_connections), \
                         U((s).refused_per_ip), U((p).subscriptions), U((p).messages), \
                         U((p).delivered), U((p).dropped), U((p).closed), U((p).conflated), \
                         U((p).queue_max)
    tern_pubsub_counters psum = {0};
    for (int i = 0; i < n; i++) {
        tern_stats st = {0};
        tern_pubsub_counters ps = {0};
        tern_server_stats(tern_server_peer(srv, i), &st);
        tern_pubsub_stats(tern_server_peer(srv, i), &ps);
        sum.connections += st.connections;
        sum.accepted += st.accepted;
        sum.requests += st.requests;
        sum.ws_messages_in += st.ws_messages_in;
        sum.ws_messages_out += st.ws_messages_out;
        sum.bytes_in += st.bytes_in;
        sum.bytes_out += st.bytes_out;
        sum.refused_max_connections += st.refused_max_connections;
        sum.refused_per_ip += st.refused_per_ip;
        psum.subscriptions += ps.subscriptions;
        psum.messages += ps.messages;
        psum.delivered += ps.delivered;
        psum.dropped += ps.dropped;
        psum.closed += ps.closed;
        psum.conflated += ps.conflated;
        psum.queue_max = ps.queue_max > psum.queue_max ? ps.queue_max : psum.queue_max;
        elen += (size_t)snprintf(each + elen, cap - elen, "%s" STATS_FMT, i ? "," : "",
                                 STATS_ARGS(st, ps));
    }
    char redis[256] = "null";
    tern_redis_counters rc;
    if (tern_pubsub_redis_stats(srv, &rc) == 0)
        snprintf(redis, sizeof(redis),
                 "{\"connected\":%s,\"reconnects\":%llu,\"published\":%llu,"
                 "\"received\":%llu,\"dropped\":%llu,\"fills\":%llu,\"auth_refused\":%s}",
                 rc.connected ? "true" : "false", U(rc.reconnects), U(rc.published),
                 U(rc.received), U(rc.dropped), U(rc.fills), rc.auth_refused ? "true" : "false");
    tern__serve_pubsub_refusals pr;
    tern__serve_pubsub_refusals_get(&pr);
    len = (size_t)snprintf(out, cap, "{\"threads\":%d,\"thread\":%d,\"redis\":%s,"
                           "\"pubsub_limits\":{\"rate_refused\":%llu,\"rate_closed\":%llu,"
                           "\"too_big\":%llu,\"forbidden_subscribe\":%llu,"
                           "\"forbidden_publish\":%llu},\"total\":" STATS_FMT ",\"each\":[%s]}\n",
                           n, tern_server_index(srv), redis, U(pr.rate_refused),
                           U(pr.rate_closed), U(pr.too_big), U(pr.forbidden_subscribe),
                           U(pr.forbidden_publish), STATS_ARGS(sum, psum), each);
#undef U
#undef STATS_FMT
#undef STATS_ARGS
    free(each);
    tern_http_respond(req, 200, "application/json", out, len < cap ? len : cap - 1);
    free(out);
}

/* GET /metrics: the public servers' counters (serve_metrics.c). */
static void on_metrics(tern_http_req *req, void *user) {
    serve_ctx *ctx = user;
    tern__serve_metrics(req, ctx->first, atomic_load(&ctx->draining));
}

/* GET /healthz (and /health): the process answers; nothing else is
 * looked at, so that a supervisor restarts only a process that hangs. */
static void on_health(tern_http_req *req, void *user) {
    tern_http_respond(req, 200, "text/plain", "ok\n", 3);
}

/* GET /readyz (and /ready): whether a load balancer should send clients
 * here. Not while draining (SIGTERM), nor while the Redis bridge is down
 * when there is one: a node without it delivers its own publishes only. */
static void on_ready(tern_http_req *req, void *user) {
    serve_ctx *ctx = user;
    tern_redis_counters rc;
    const char *why = NULL;
    if (atomic_load(&ctx->draining))
        why = "not ready: draining\n";
    else if (ctx->redis && tern_pubsub_redis_stats(ctx->first, &rc) < 0)
        why = "not ready: redis down\n";   /* not bridged yet */
    else if (ctx->redis && rc.auth_refused)
        why = "not ready: redis auth failed\n";
    else if (ctx->redis && !rc.connected)
        why = "not ready: redis down\n";
    if (why)
        tern_http_respond(req, 503, "text/plain", why, strlen(why));
    else
        tern_http_respond(req, 200, "text/plain", "ready\n", 6);
}

/* SIGTERM and SIGINT, after tern_run's own handler (which starts the
 * graceful shutdown): readiness says so from now on. */
static void on_stop_signal(tern_loop *loop, int signo, void *user) {
    serve_ctx *ctx = user;
    if (!atomic_exchange(&ctx->draining, true))
        tern__serve_sd_stopping();
}

/* Whether the request's "Authorization: Bearer KEY" names ctx->api_key:
 * both are hashed and the digests compared with CRYPTO_memcmp, so the time
 * taken tells nothing of the key (not even its length). */
static bool bearer_ok(tern_http_req *req, const serve_ctx *ctx) {
    size_t len;
    const char *h = tern_http_header(req, "Authorization", &len);
    if (h == NULL || len < 7 || strncasecmp(h, "Bearer ", 7) != 0)
        return false;
    h += 7, len -= 7;
    while (len && *h == ' ')
        h++, len--;
    unsigned char a[EVP_MAX_MD_SIZE], b[EVP_MAX_MD_SIZE];
    unsigned alen = 0, blen = 0;
    if (!EVP_Digest(h, len, a, &alen, EVP_sha256(), NULL) ||
        !EVP_Digest(ctx->api_key, strlen(ctx->api_key), b, &blen, EVP_sha256(), NULL) ||
        alen != blen)
        return false;
    return CRYPTO_memcmp(a, b, alen) == 0;
}

/* POST /publish/:topic on the admin listener: published on the public
 * servers (loop 0's, this one's loop), with the operator's key only. */
static void on_admin_publish(tern_http_req *req, void *user) {
    serve_ctx *ctx = user;
    if (ctx->api_key == NULL) {
        static const char why[] = "tern serve: POST /publish needs an API key: start the server "
                                  "with --api-key-file FILE\n";
        tern_http_respond(req, 403, "text/plain", why, sizeof(why) - 1);
        return;
    }
    if (!bearer_ok(req, ctx)) {
        static const char why[] = "tern serve: POST /publish needs Authorization: Bearer KEY "
                                  "(the key of --api-key-file)\n";
        tern_http_add_header(req, "WWW-Authenticate", "Bearer");
        tern_http_respond(req, 401, "text/plain", why, sizeof(why) - 1);
        return;
    }
    tern__serve_publish(req, ctx->first);
}

static void on_sighup(tern_loop *loop, int signo, void *user) {
    serve_ctx *ctx = user;
    /* Renewed certificates: new handshakes use them. */
    int err = ctx->tls ? tern_tls_reload(ctx->tls) : 0;
    if (!ctx->quiet || err < 0)
        tern__serve_log(stderr, err < 0 ? TERN_LOG_ERROR : TERN_LOG_INFO,
                        "SIGHUP, certificates %s%s", err < 0 ? "kept: " : "reloaded",
                err < 0 ? tern_strerror(err) : "");
}

/* Printed once every thread listens (the first post loop 0 runs). Even
 * with --quiet: with --port 0 this is how to learn the port. */
static void print_listening(tern_loop *loop, void *user) {
    serve_ctx *ctx = user;
    const char *host = ctx->host;
    bool v6 = strchr(host, ':') != NULL;
    char https[128] = "";
    if (ctx->tls)
        snprintf(https, sizeof(https), " and https://%s%s%s:%d/", v6 ? "[" : "", host,
                 v6 ? "]" : "", tern_server_tls_port(ctx->first));
    char admin[320] = "";
    if (ctx->admin) {
        bool av6 = strchr(ctx->admin_host, ':') != NULL;
        snprintf(admin, sizeof(admin), " (admin http://%s%s%s:%d/)", av6 ? "[" : "",
                 ctx->admin_host, av6 ? "]" : "", tern_server_port(ctx->admin));
    }
    /* The back end stays last: scripts read it there. */
    char line[1024];
    snprintf(line, sizeof(line), "listening on http://%s%s%s:%d/%s%s%s%s (%d thread%s, %s)",
             v6 ? "[" : "", host, v6 ? "]" : "", tern_server_port(ctx->first), https,
             ctx->unix_path ? " and unix:" : "", ctx->unix_path ? ctx->unix_path : "", admin,
             ctx->nthreads, ctx->nthreads == 1 ? "" : "s",
             tern_loop_backend(tern_server_loop(ctx->first)));
    tern__serve_log(stderr, TERN_LOG_INFO, "%s", line);
    tern__serve_sd_ready(line);
    if (tern__serve_sd_watchdog(loop, &ctx->watchdog) < 0)
        tern__serve_log(stderr, TERN_LOG_ERROR, "systemd watchdog: no timer (out of memory)");
}

/* Setup fails with this once it has said why. */
#define SETUP_FAILED (-ESRCH)

/* The admin listener: a server of its own (its own routes, limits and
 * counters) on loop 0, beside the public one; made last in setup, so a
 * failure before it has nothing of it to free. */
static int admin_setup(serve_ctx *ctx, tern_loop *loop) {
    int err = tern_server_new(&ctx->admin, loop, &ctx->server_options);
    if (err < 0) {
        fprintf(stderr, "tern serve: the admin server: %s\n", tern_strerror(err));
        return SETUP_FAILED;
    }
    if ((err = tern_http_route(ctx->admin, "POST", "/publish/:topic", on_admin_publish, ctx)) < 0 ||
        (err = tern_http_route(ctx->admin, "GET", "/stats", on_stats, ctx)) < 0 ||
        (err = tern_http_route(ctx->admin, "GET", "/metrics", on_metrics, ctx)) < 0 ||
        (err = tern_http_route(ctx->admin, "GET", "/healthz", on_health, ctx)) < 0 ||
        (err = tern_http_route(ctx->admin, "GET", "/health", on_health, ctx)) < 0 ||
        (err = tern_http_route(ctx->admin, "GET", "/readyz", on_ready, ctx)) < 0 ||
        (err = tern_http_route(ctx->admin, "GET", "/ready", on_ready, ctx)) < 0 ||
        (err = tern_http_not_found(ctx->admin, on_not_found, ctx)) < 0) {
        fprintf(stderr, "tern serve: the admin routes: %s\n", tern_strerror(err));
    } else if ((err = tern_listen(ctx->admin, ctx->admin_host, ctx->admin_port, NULL)) < 0) {
        fprintf(stderr, "tern serve: --admin-listen %s:%d: %s\n", ctx->admin_host,
                ctx->admin_port, tern_strerror(err));
    }
    if (err < 0) {
        tern_server_free(ctx->admin);
        ctx->admin = NULL;
        return SETUP_FAILED;
    }
    return 0;
}

/* tern_run's teardown: loop 0 has ended, the admin server goes before it. */
static void serve_teardown(tern_loop *loop, tern_server *srv, void *user) {
    serve_ctx *ctx = user;
    if (tern_server_index(srv) == 0 && ctx->watchdog) {
        tern_timer_stop(ctx->watchdog);
        ctx->watchdog = NULL;
    }
    if (tern_server_index(srv) == 0 && ctx->admin) {
        tern_server_free(ctx->admin);
        ctx->admin = NULL;
    }
}

/* tern_run's setup: the routes and listeners of the first server (the
 * other threads' share them). */
static int serve_setup(tern_server *srv, void *user) {
    serve_ctx *ctx = user;
    int err;
    ctx->first = srv;
    if (ctx->access_log)
        tern_server_set_access_log(srv, access_line, ctx);
    tern_http_route(srv, "GET", "/ping", on_ping, ctx);
    if (ctx->bench_routes) {
        tern_http_route(srv, "GET", "/echo", on_echo_get, ctx);
        tern_http_route(srv, "POST", "/echo", on_echo_post, ctx);
        tern_http_route(srv, "GET", "/stream", on_stream, ctx);
        tern_http_route_stream(srv, "POST", "/upload", on_upload, ctx);
        tern_http_route(srv, "GET", "/delay", on_delay, ctx);
        tern_http_route(srv, "GET", "/item/:id", on_item, ctx);
    }
    tern_http_not_found(srv, on_not_found, ctx);
    static const char *const echo_protocols[] = {"tern.echo", NULL};
    /* The route keeps its own copy of the handlers. */
    tern_ws_handlers echo = {.on_upgrade = ws_upgrade, .on_message = ws_echo};
    if (ctx->ws_async) {
        echo.on_message = ws_echo_later;
        echo.on_drain = later_drain;
    } else if (ctx->ws_deadline_ms)
        echo.on_message = ws_echo_deadline;
    if (ctx->ws_deadline_ms)
        echo.on_open = ws_echo_open;
    tern_ws_options wo = ctx->wo;
    wo.subprotocols = echo_protocols;
    if (ctx->bench_routes)
        tern_ws_route(srv, "/ws", &echo, &wo, ctx);
    /* One compressed frame serves every subscriber only when no compressor
     * keeps context between messages. */
    static const tern_ws_handlers bcast = {.on_upgrade = ws_upgrade,
                                           .on_open = bcast_open,
                                           .on_message = bcast_message,
                                           .on_close = bcast_close};
    tern_ws_options bo = wo;
    bo.subprotocols = NULL;
    bo.server_no_context_takeover = true;
    bo.client_no_context_takeover = true;   /* and no inflate state per member */
    bo.slow_policy = TERN_WS_SLOW_DROP;
    static const tern_ws_handlers room = {.on_upgrade = room_upgrade, .on_message = ws_echo};
    tern_ws_options ro = wo;
    ro.subprotocols = NULL;
    if (ctx->bench_routes) {
        tern_ws_route(srv, "/ws/broadcast", &bcast, &bo, ctx);
        tern_ws_route(srv, "/ws/room/:room", &room, &ro, ctx);
    }
    if ((err = tern__serve_pubsub_routes(srv, &wo, &ctx->po, &ctx->ps_limits, &ctx->rules,
                                         ctx->bench_routes,
                                         ws_upgrade, ctx)) < 0) {
        fprintf(stderr, "tern serve: pub/sub routes: %s\n", tern_strerror(err));
        return SETUP_FAILED;
    }
    /* Each topic rule's settings, what it does not say the server's: the
     * library's rule for the same pattern (its exact topic or prefix). */
    for (int i = 0; i < ctx->rules.n; i++) {
        const tern__topic_rule *r = &ctx->rules.r[i];
        tern_topic_options to = {.policy = r->has_policy ? r->policy : ctx->po.policy,
                                 .close_code = r->has_policy ? r->close_code : 0,
                                 .max_backlog = r->has_backlog ? r->max_backlog : 0,
                                 .history = r->has_history ? r->history : 0,
                                 .history_ms = r->has_history_age ? r->history_ms : 0,
                                 .exact = !r->prefix};
        if (!r->has_policy && to.policy == TERN_PUBSUB_CLOSE)
            to.close_code = ctx->po.close_code;
        char pattern[TERN_TOPIC_MAX + 1];
        memcpy(pattern, r->pattern, r->len);
        pattern[r->len] = '\0';
        if ((err = tern_pubsub_topic_rule(srv, pattern, &to)) < 0) {
            fprintf(stderr, "tern serve: --topic %s%s: %s\n", pattern, r->prefix ? "*" : "",
                    tern_strerror(err));
            return SETUP_FAILED;
        }
    }
    /* The page at / unless --root serves files there (then at /market). */
    tern__page_routes(srv, ctx->root == NULL);
    if ((err = tern__feed_start(srv, ctx->feed ? ctx->feed_rate : 0)) < 0) {
        fprintf(stderr, "tern serve: feed: %s\n", tern_strerror(err));
        return SETUP_FAILED;
    }
    if (ctx->redis && (err = tern_pubsub_redis(srv, ctx->redis)) < 0) {
        char shown[512];
        tern__serve_redis_redact(ctx->redis, shown, sizeof(shown));
        fprintf(stderr, "tern serve: --redis %s: %s\n", shown,
                err == -EINVAL ? "not a redis://[[user]:password@]host[:port][/db] URL"
                               : tern_strerror(err));
        return SETUP_FAILED;
    }
    if (ctx->root && (err = tern_http_static(srv, "/", ctx->root)) < 0) {
        fprintf(stderr, "tern serve: --root %s: %s\n", ctx->root, tern_strerror(err));
        return SETUP_FAILED;
    }
    for (int i = 0; i < ctx->nvhosts; i++) {
        /* NAME=ROOT: that host serves ROOT's files, and nothing else. */
        char name[256];
        const char *eq = strchr(ctx->vhosts[i], '=');
        size_t nlen = eq ? (size_t)(eq - ctx->vhosts[i]) : 0;
        tern_server *h;
        err = -EINVAL;
        if (eq && nlen < sizeof(name)) {
            memcpy(name, ctx->vhosts[i], nlen);
            name[nlen] = '\0';
            if ((err = tern_server_host(srv, name, &h)) == 0)
                err = tern_http_static(h, "/", eq + 1);
        }
        if (err < 0) {
            fprintf(stderr, "tern serve: --vhost %s: %s\n", ctx->vhosts[i], tern_strerror(err));
            return SETUP_FAILED;
        }
    }
    if ((err = tern_listen(srv, ctx->host, ctx->port, &ctx->listen)) < 0) {
        fprintf(stderr, "tern serve: listen on %s:%d: %s\n", ctx->host, ctx->port,
                tern_strerror(err));
        return SETUP_FAILED;
    }
    if (ctx->unix_path && (err = tern_listen_unix(srv, ctx->unix_path, &ctx->listen)) < 0) {
        fprintf(stderr, "tern serve: listen on %s: %s\n", ctx->unix_path, tern_strerror(err));
        return SETUP_FAILED;
    }
    if (ctx->tls &&
        (err = tern_listen_tls(srv, ctx->host, ctx->tls_port, ctx->tls, &ctx->listen)) < 0) {
        fprintf(stderr, "tern serve: listen on %s:%d: %s\n", ctx->host, ctx->tls_port,
                tern_strerror(err));
        return SETUP_FAILED;
    }
    if (ctx->admin_host && (err = admin_setup(ctx, tern_server_loop(srv))) < 0)
        return err;
    /* SIGINT and SIGTERM are tern_run's; ours only marks the drain. */
    tern_loop_on_signal(tern_server_loop(srv), SIGHUP, on_sighup, ctx);
    tern_loop_on_signal(tern_server_loop(srv), SIGTERM, on_stop_signal, ctx);
    tern_loop_on_signal(tern_server_loop(srv), SIGINT, on_stop_signal, ctx);
    tern_loop_post(tern_server_loop(srv), print_listening, ctx);
    return 0;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: tern serve [options]\n"
            "  --host H              address to listen on (default 127.0.0.1; 0.0.0.0 or :: for all)\n"
            "  --port P              TCP port (default 8080; 0 picks a free one)\n"
            "  --unix PATH           also listen on a Unix socket\n"
            "  --tls-cert FILE       PEM certificate chain: serve HTTPS/WSS too (repeat with\n"
            "                        --tls-key for more certificates, chosen by SNI)\n"
            "  --tls-key FILE        PEM private key of the --tls-cert before it\n"
            "  --tls-key-passphrase-file FILE\n"
            "                        the passphrase of encrypted --tls-key files (its first\n"
            "                        line; read again on SIGHUP). Never asked on a terminal\n"
            "  --tls-port P          HTTPS port (default 8443; 0 picks a free one)\n"
            "  --tls-min-version V   1.2 (default) or 1.3: the oldest TLS version served\n"
            "  --tls-ciphers LIST    TLS 1.2 ciphers, OpenSSL's syntax (default: OpenSSL's)\n"
            "  --tls-ciphersuites LIST\n"
            "                        TLS 1.3 ciphersuites, OpenSSL's syntax, the server's order\n"
            "                        chosen (default: AES-128-GCM, AES-256-GCM, ChaCha20)\n"
            "  --tls-client-ca FILE  PEM CAs that client certificates are verified against\n"
            "  --tls-client-verify M optional or require: ask clients for a certificate\n"
            "                        (default: none asked; needs --tls-client-ca)\n"
            "  --bench-routes        also serve the routes that make the server work on request,\n"
            "                        for benchmarks and tests: /echo, /stream, /upload, /delay,\n"
            "                        /item/:id, /ws, /ws/broadcast, /ws/room/:room, /fanout,\n"
            "                        /fanout/sub, /fanout/pub, /fanout/pub-keyed (default: off,\n"
            "                        404; /, /market, /tern-client.js, /pubsub and /ping are\n"
            "                        always served)\n"
            "  --admin-listen HOST:PORT  the admin listener: POST /publish/:topic, GET /stats and\n"
            "                        GET /metrics (Prometheus), GET /healthz and GET /readyz\n"
            "                        (503 while draining or while --redis is down),\n"
            "                        never on the public port (default 127.0.0.1:9090; [::1]:P\n"
            "                        for IPv6; off for none)\n"
            "  --api-key-file FILE   the key POST /publish needs (Authorization: Bearer KEY):\n"
            "                        the file's first line (default: none, publish answers 403)\n"
            "  --root DIR            serve static files from DIR\n"
            "  --max-head BYTES      request line + headers (default 16384)\n"
            "  --max-body BYTES      request body (default 16777216)\n"
            "  --head-timeout MS     (default 10000)\n"
            "  --body-timeout MS     (default 10000)\n"
            "  --idle-timeout MS     keep-alive (default 60000)\n"
            "  --send-timeout MS     close a client that takes no bytes for this long (default 60000)\n"
            "  --max-unsent BYTES    bound on all connections' unsent output (default 268435456)\n"
            "  --max-connections N   open connections, all threads together; more are answered\n"
            "                        503 (Retry-After: 1) and closed (default 10000; 0: no limit)\n"
            "  --max-connections-per-ip N  the same from one IPv4 address or IPv6 /64\n"
            "                        (default 50; 0: no limit)\n"
            "  --sndbuf BYTES        the kernel's send buffer of each connection (SO_SNDBUF;\n"
            "                        default: autotuned, up to megabytes a client has not read)\n"
            "  --shutdown-timeout MS graceful shutdown limit (default 10000)\n"
            "  --shutdown-spread MS  the shutdown closes each WebSocket (1001) at a random moment\n"
            "                        within MS, so their clients do not all reconnect at once\n"
            "                        (default: 4/5 of --shutdown-timeout; 0: all at once)\n"
            "  --ws-max-message BYTES  WebSocket message limit (default 16777216)\n"
            "  --ws-idle-timeout MS  ping an idle WebSocket after this long (default 30000)\n"
            "  --no-compression      don't offer permessage-deflate on /ws\n"
            "  --allowed-origin O    a WebSocket upgrade with an Origin header must match one\n"
            "                        (repeatable): https://app.example.com exactly, or\n"
            "                        https://*.example.com for its subdomains; others get 403,\n"
            "                        one without Origin (not a browser) is let in (default:\n"
            "                        any origin)\n"
            "  --ws-origin ORIGIN    the same as --allowed-origin (one, exact)\n"
            "  --ws-slow-policy P    /ws client not reading: pause (default), close (1008) or drop\n"
            "  --ws-async[=timer|post]  /ws echoes each message later, from the loop, not inside\n"
            "                        on_message (a handler that waits on I/O): from a 0 ms timer\n"
            "                        per batch (default), or from a tern_loop_post per batch\n"
            "  --ws-deadline-ms N    /ws connections get a deadline of N ms, moved by every\n"
            "                        message: N ms without one closes it with 1008 \"deadline\"\n"
"  --pubsub-max-backlog BYTES  a /pubsub subscriber with more waiting gets the policy\n"
            "                        (default 1048576)\n"
            "  --pubsub-max-message BYTES  a bigger /pubsub message closes its connection with\n"
            "                        1009 (default 65536)\n"
            "  --pubsub-rate N       /pubsub messages a second per connection, a burst of N\n"
            "                        (default 100; 0: no limit); one over it is answered\n"
            "                        {\"error\":\"rate limit\"}, and more than N refused\n"
            "                        without a pause close it with 1008\n"
            "  --pubsub-policy P     drop (default: its messages are dropped and counted),\n"
            "                        close (1008), close-1013 (try again later) or conflate\n"
            "                        (keep the newest message per key while it is behind)\n"
            "  --topic 'PATTERN [KEY=VALUE]...'  a topic rule (repeatable): PATTERN is a\n"
            "                        topic, or a prefix ending in * (\"orders.*\"; \"*\": all);\n"
            "                        a topic takes its exact rule, else its longest prefix's.\n"
            "                        KEYs: subscribe= and publish= (token: a token's rights\n"
            "                        must cover the topic, the default; anyone; none),\n"
            "                        policy=, history=N, history-age=SECONDS,\n"
            "                        max-backlog=BYTES (the --pubsub-* defaults otherwise).\n"
            "                        Closed by default: without a rule only tokens open a\n"
            "                        topic. \"market\" and \"stats\" (the feed's) are\n"
            "                        subscribe=anyone publish=none\n"
            "  --pubsub-topic-policy PREFIX=P  the same as --topic 'PREFIX* policy=P'\n"
            "  --pubsub-history N    keep each topic's last N messages (at most 65536) for\n"
            "                        subscribers that resume (default 0: none; topic\n"
            "                        \"market\" of the feed keeps 4096 for a minute)\n"
            "  --pubsub-history-age SECONDS  and none older than this (default: no limit)\n"
            "  --pubsub-history-bytes BYTES  all topics' histories together keep at most\n"
            "                        this (default 67108864; 0: no limit); over it the\n"
            "                        oldest messages of the topics over their share go\n"
            "  --pubsub-replay-rate BYTES  bytes a second each thread sends to subscribers\n"
            "                        that resume until they catch up, together (default\n"
            "                        0: no limit); spreads a reconnect storm's catch-up;\n"
            "                        above the live rate, or they fall behind\n"
            "  --token-hmac-secret-file F  /pubsub takes JWTs signed HS256 with F's bytes\n"
            "                        (one trailing newline stripped), as ?token= or\n"
            "                        Authorization: Bearer; closed with 4001 at exp\n"
            "  --token-public-key-file F  and/or RS256 or ES256 ones (F: a PEM public key)\n"
            "  --token-audience A    tokens must name A in aud\n"
            "  --token-issuer I      tokens must have iss I\n"
            "  --feed on|off         the simulated market data on topic \"market\" (default on)\n"
            "  --feed-rate N         its price updates a second, over all instruments (default 40)\n"
            "  --redis URL           bridge pub/sub through Redis (redis://host[:port][/db]):\n"
            "                        every node's subscribers get every node's publishes;\n"
            "                        redis://[user]:password@host... sends AUTH (never logged)\n"
            "  --redis-password-file F  the password (F's first line) instead of in the URL,\n"
            "                        which would show it to every user of the machine\n"
            "  --log-level L         the library's log on stderr: error, warn (default), info, debug\n"
            "  --access-log FILE     one line per response (peer method target status bytes ms), and\n"
            "                        per WebSocket session at its end (its length, bytes and\n"
            "                        messages each way, close code and side); - for stdout\n"
            "  --log-format F        text (default) or json: every log and access line with an\n"
            "                        RFC 3339 timestamp and a level; json: one object a line\n"
            "  --threads N           loops, one per thread (default: one per core)\n"
            "  --io uring|epoll      how each loop waits for I/O: io_uring completions, or\n"
            "                        epoll readiness (default: epoll, or $TERN_IO); io_uring\n"
            "                        falls back to epoll where the kernel refuses it\n"
            "  --vhost NAME=ROOT     requests for host NAME get the files under ROOT, and only\n"
            "                        them (repeatable); other names get the routes above\n"
            "  --quiet               no log lines but the \"listening on\" one\n");
}

static bool parse_size(const char *s, unsigned long long max, unsigned long long *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || *s == '-' || v > max)
        return false;
    *out = v;
    return true;
}

/* --admin-listen: "off", or HOST:PORT ([V6]:PORT for an IPv6 address). */
static bool parse_admin_listen(const char *s, serve_ctx *ctx) {
    if (strcmp(s, "off") == 0) {
        ctx->admin_host = NULL;
        return true;
    }
    const char *colon = strrchr(s, ':');
    unsigned long long port;
    if (colon == NULL || colon == s || !parse_size(colon + 1, 65535, &port) || colon[1] == '\0')
        return false;
    const char *h = s;
    size_t hlen = (size_t)(colon - s);
    if (h[0] == '[') {
        if (hlen < 3 || h[hlen - 1] != ']')
            return false;
        h++, hlen -= 2;
    } else if (memchr(h, ':', hlen)) {
        return false;   /* an IPv6 address goes in brackets */
    }
    if (hlen >= sizeof(ctx->admin_host_buf))
        return false;
    memcpy(ctx->admin_host_buf, h, hlen);
    ctx->admin_host_buf[hlen] = '\0';
    ctx->admin_host = ctx->admin_host_buf;
    ctx->admin_port = (int)port;
    return true;
}

/* --api-key-file: the file's first line (without its line end), or NULL
 * once said why (unreadable, empty). */
static char *read_api_key(const char *path) {
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        fprintf(stderr, "tern serve: --api-key-file %s: %s\n", path, strerror(errno));
        return NULL;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n = getline(&line, &cap, f);
    fclose(f);
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
        line[--n] = '\0';
    if (n <= 0) {
        fprintf(stderr, "tern serve: --api-key-file %s: no key on its first line\n", path);
        if (line)
            OPENSSL_cleanse(line, cap);
        free(line);
        return NULL;
    }
    return line;
}

int tern_app_serve(int argc, char **argv) {
    enum { O_HOST = 1, O_PORT, O_UNIX, O_ROOT, O_MAX_HEAD, O_MAX_BODY, O_HEAD_TO, O_BODY_TO,
           O_IDLE_TO, O_SHUT_TO, O_QUIET, O_HELP, O_WS_MAX, O_WS_IDLE, O_NO_PMD, O_WS_ORIGIN, O_WS_SLOW,
           O_SEND_TO, O_MAX_UNSENT, O_LOG_LEVEL, O_ACCESS_LOG, O_TLS_CERT, O_TLS_KEY, O_TLS_PORT, O_THREADS, O_VHOST,
           O_PS_BACKLOG, O_PS_POLICY, O_PS_TOPIC, O_REDIS, O_FEED, O_FEED_RATE, O_PS_HISTORY,
           O_PS_HISTORY_AGE, O_PS_REPLAY_RATE, O_SNDBUF, O_IO, O_WS_ASYNC, O_WS_DEADLINE, O_TLS_PASS_FILE,
           O_TLS_MIN, O_TLS_CIPHERS, O_TLS_SUITES, O_TLS_CLIENT_CA, O_TLS_CLIENT_VERIFY, O_MAX_CONNS,
           O_MAX_CONNS_IP, O_ALLOWED_ORIGIN, O_PS_MAX_MESSAGE, O_PS_RATE,
           O_TOKEN_HMAC, O_TOKEN_PUBKEY, O_TOKEN_AUD, O_TOKEN_ISS, O_BENCH_ROUTES,
           O_ADMIN_LISTEN, O_API_KEY_FILE, O_TOPIC, O_PS_HISTORY_BYTES, O_SHUT_SPREAD,
           O_REDIS_PASS_FILE, O_LOG_FORMAT };
    static const struct option opts[] = {
        {"host", required_argument, NULL, O_HOST},
        {"port", required_argument, NULL, O_PORT},
        {"unix", required_argument, NULL, O_UNIX},
        {"root", required_argument, NULL, O_ROOT},
        {"max-head", required_argument, NULL, O_MAX_HEAD},
        {"max-body", required_argument, NULL, O_MAX_BODY},
        {"head-timeout", required_argument, NULL, O_HEAD_TO},
        {"body-timeout", required_argument, NULL, O_BODY_TO},
        {"idle-timeout", required_argument, NULL, O_IDLE_TO},
        {"shutdown-timeout", required_argument, NULL, O_SHUT_TO},
        {"quiet", no_argument, NULL, O_QUIET},
        {"help", no_argument, NULL, O_HELP},
        {"ws-max-message", required_argument, NULL, O_WS_MAX},
        {"ws-idle-timeout", required_argument, NULL, O_WS_IDLE},
        {"no-compression", no_argument, NULL, O_NO_PMD},
        {"ws-origin", required_argument, NULL, O_WS_ORIGIN},
        {"ws-slow-policy", required_argument, NULL, O_WS_SLOW},
        {"send-timeout", required_argument, NULL, O_SEND_TO},
        {"max-unsent", required_argument, NULL, O_MAX_UNSENT},
        {"log-level", required_argument, NULL, O_LOG_LEVEL},
        {"access-log", required_argument, NULL, O_ACCESS_LOG},
        {"tls-cert", required_argument, NULL, O_TLS_CERT},
        {"tls-key", required_argument, NULL, O_TLS_KEY},
        {"tls-port", required_argument, NULL, O_TLS_PORT},
        {"threads", required_argument, NULL, O_THREADS},
        {"vhost", required_argument, NULL, O_VHOST},
        {"pubsub-max-backlog", required_argument, NULL, O_PS_BACKLOG},
        {"pubsub-policy", required_argument, NULL, O_PS_POLICY},
        {"pubsub-topic-policy", required_argument, NULL, O_PS_TOPIC},
        {"redis", required_argument, NULL, O_REDIS},
        {"feed", required_argument, NULL, O_FEED},
        {"feed-rate", required_argument, NULL, O_FEED_RATE},
        {"pubsub-history", required_argument, NULL, O_PS_HISTORY},
        {"pubsub-history-age", required_argument, NULL, O_PS_HISTORY_AGE},
        {"pubsub-replay-rate", required_argument, NULL, O_PS_REPLAY_RATE},
        {"sndbuf", required_argument, NULL, O_SNDBUF},
        {"io", required_argument, NULL, O_IO},
        {"ws-async", optional_argument, NULL, O_WS_ASYNC},
        {"ws-deadline-ms", required_argument, NULL, O_WS_DEADLINE},
        {"tls-key-passphrase-file", required_argument, NULL, O_TLS_PASS_FILE},
        {"tls-min-version", required_argument, NULL, O_TLS_MIN},
        {"tls-ciphers", required_argument, NULL, O_TLS_CIPHERS},
        {"tls-ciphersuites", required_argument, NULL, O_TLS_SUITES},
        {"tls-client-ca", required_argument, NULL, O_TLS_CLIENT_CA},
        {"tls-client-verify", required_argument, NULL, O_TLS_CLIENT_VERIFY},
        {"max-connections", required_argument, NULL, O_MAX_CONNS},
        {"max-connections-per-ip", required_argument, NULL, O_MAX_CONNS_IP},
        {"allowed-origin", required_argument, NULL, O_ALLOWED_ORIGIN},
        {"pubsub-max-message", required_argument, NULL, O_PS_MAX_MESSAGE},
        {"pubsub-rate", required_argument, NULL, O_PS_RATE},
        {"token-hmac-secret-file", required_argument, NULL, O_TOKEN_HMAC},
        {"token-public-key-file", required_argument, NULL, O_TOKEN_PUBKEY},
        {"token-audience", required_argument, NULL, O_TOKEN_AUD},
        {"token-issuer", required_argument, NULL, O_TOKEN_ISS},
        {"bench-routes", no_argument, NULL, O_BENCH_ROUTES},
        {"admin-listen", required_argument, NULL, O_ADMIN_LISTEN},
        {"api-key-file", required_argument, NULL, O_API_KEY_FILE},
        {"topic", required_argument, NULL, O_TOPIC},
        {"pubsub-history-bytes", required_argument, NULL, O_PS_HISTORY_BYTES},
        {"shutdown-spread", required_argument, NULL, O_SHUT_SPREAD},
        {"redis-password-file", required_argument, NULL, O_REDIS_PASS_FILE},
        {"log-format", required_argument, NULL, O_LOG_FORMAT},
        {NULL, 0, NULL, 0},
    };
    const char *host = "127.0.0.1", *unix_path = NULL, *root = NULL;
    unsigned long long port = 8080, v = 0;
    const char *certs[8], *keys[8];
    int ncert = 0, nkey = 0;
    /* A file, not the passphrase itself: a command line is visible to
     * every user of the machine (ps, /proc). */
    tern_tls_options tls_opt = {0};
    unsigned long long tls_port = 8443;
    const char *vhosts[64];
    int nvhost = 0;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned long long nthreads = cores < 1 ? 1 : cores > 1024 ? 1024 : (unsigned long long)cores;
    tern_server_options so = {0};
    tern_loop_options lo = {0};
    tern_ws_options wo = {.compression = true};
    /* An echo answers what it reads: when the client does not read the
     * answers, stop reading its requests (TCP pushes back on it). */
    int slow_policy = TERN_WS_SLOW_PAUSE;
    serve_ctx ctx = {.feed = true, .feed_rate = 40, .bcast_lock = PTHREAD_MUTEX_INITIALIZER,
                     .ps_limits = {.max_message = 65536, .rate = 100}};
    atomic_init(&ctx.draining, false);
    int log_level = TERN_LOG_WARN;
    const char *access_path = NULL, *api_key_path = NULL;
    bool shutdown_spread_set = false;
    const char *redis_url = NULL, *redis_password_file = NULL;
    ctx.admin_host = "127.0.0.1";
    ctx.admin_port = 9090;
    ctx.po.history_bytes = 64u << 20;
    /* The feed's topics: anyone reads them, no client writes them (the
     * feed and the admin listener's POST /publish do). --topic may change
     * them as any rule. */
    const char *rule_why = NULL;
    tern__rules_add(&ctx.rules, "market subscribe=anyone publish=none", &rule_why);
    tern__rules_add(&ctx.rules, "stats subscribe=anyone publish=none", &rule_why);
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        bool ok = true;
        switch (c) {
        case O_HOST: host = optarg; break;
        case O_PORT: ok = parse_size(optarg, 65535, &port); break;
        case O_UNIX: unix_path = optarg; break;
        case O_ROOT: root = optarg; break;
        case O_MAX_HEAD: ok = parse_size(optarg, 1u << 24, &v) && v > 0; so.max_head = v; break;
        case O_MAX_BODY: ok = parse_size(optarg, 1ull << 40, &v) && v > 0; so.max_body = v; break;
        case O_HEAD_TO: ok = parse_size(optarg, 86400000, &v) && v > 0; so.head_timeout_ms = (uint32_t)v; break;
        case O_BODY_TO: ok = parse_size(optarg, 86400000, &v) && v > 0; so.body_timeout_ms = (uint32_t)v; break;
        case O_IDLE_TO: ok = parse_size(optarg, 86400000, &v) && v > 0; so.idle_timeout_ms = (uint32_t)v; break;
        case O_SHUT_TO: ok = parse_size(optarg, 86400000, &v) && v > 0; so.shutdown_timeout_ms = (uint32_t)v; break;
        case O_SHUT_SPREAD:
            ok = parse_size(optarg, 86400000, &v);
            so.shutdown_ws_spread_ms = (uint32_t)v;
            shutdown_spread_set = true;
            break;
        case O_SEND_TO: ok = parse_size(optarg, 86400000, &v) && v > 0; so.send_timeout_ms = (uint32_t)v; break;
        case O_PS_MAX_MESSAGE:
            ok = parse_size(optarg, 1ull << 40, &v) && v > 0;
            ctx.ps_limits.max_message = v;
            break;
        case O_PS_RATE:
            ok = parse_size(optarg, 1000000, &v);
            ctx.ps_limits.rate = (uint32_t)v;
            break;
        case O_BENCH_ROUTES: ctx.bench_routes = true; break;
        case O_ADMIN_LISTEN: ok = parse_admin_listen(optarg, &ctx); break;
        case O_API_KEY_FILE: api_key_path = optarg; break;
        case O_MAX_CONNS:
            ok = parse_size(optarg, TERN_UNLIMITED - 1, &v);
            so.max_connections = v ? (uint32_t)v : TERN_UNLIMITED;
            break;
        case O_MAX_CONNS_IP:
            ok = parse_size(optarg, TERN_UNLIMITED - 1, &v);
            so.max_connections_per_ip = v ? (uint32_t)v : TERN_UNLIMITED;
            break;
        case O_MAX_UNSENT: ok = parse_size(optarg, 1ull << 40, &v) && v > 0; lo.max_unsent = v; break;
        case O_QUIET: ctx.quiet = true; break;
        case O_IO:
            ok = strcmp(optarg, "uring") == 0 || strcmp(optarg, "epoll") == 0;
            lo.io = optarg[0] == 'u' ? TERN_IO_URING : TERN_IO_EPOLL;
            break;
        case O_HELP: usage(stdout); return 0;
        case O_WS_MAX: ok = parse_size(optarg, 1ull << 40, &v) && v > 0; wo.max_message = v; break;
        case O_WS_IDLE: ok = parse_size(optarg, 86400000, &v) && v > 0; wo.idle_timeout_ms = (uint32_t)v; break;
        case O_NO_PMD: wo.compression = false; break;
        case O_WS_ORIGIN:
        case O_ALLOWED_ORIGIN:
            /* --ws-origin takes any value, as it always has */
            ok = ctx.norigins < ORIGINS_MAX && (c == O_WS_ORIGIN || origin_pattern_ok(optarg));
            if (ok) ctx.origins[ctx.norigins++] = optarg;
            break;
        case O_WS_ASYNC:
            ok = optarg == NULL || strcmp(optarg, "timer") == 0 || strcmp(optarg, "post") == 0;
            ctx.ws_async = optarg && strcmp(optarg, "post") == 0 ? WS_ASYNC_POST : WS_ASYNC_TIMER;
            break;
        case O_WS_DEADLINE:
            ok = parse_size(optarg, 86400000, &v) && v > 0;
            ctx.ws_deadline_ms = (uint32_t)v;
            break;
        case O_WS_SLOW:
            slow_policy = !strcmp(optarg, "close") ? TERN_WS_SLOW_CLOSE
                          : !strcmp(optarg, "drop") ? TERN_WS_SLOW_DROP
                          : !strcmp(optarg, "pause") ? TERN_WS_SLOW_PAUSE : -1;
            ok = slow_policy >= 0;
            break;
        case O_LOG_LEVEL:
            log_level = -1;
            for (int l = TERN_LOG_ERROR; l <= TERN_LOG_DEBUG; l++)
                if (strcmp(optarg, tern_log_level_name(l)) == 0)
                    log_level = l;
            ok = log_level >= 0;
            break;
        case O_ACCESS_LOG: access_path = optarg; break;
        case O_TLS_CERT: ok = ncert < 8; if (ok) certs[ncert++] = optarg; break;
        case O_TLS_KEY: ok = nkey < 8; if (ok) keys[nkey++] = optarg; break;
        case O_TLS_PASS_FILE: tls_opt.passphrase_file = optarg; break;
        case O_TLS_MIN:
            ok = strcmp(optarg, "1.2") == 0 || strcmp(optarg, "1.3") == 0;
            tls_opt.min_version = strcmp(optarg, "1.3") == 0 ? 13 : 12;
            break;
        case O_TLS_CIPHERS: tls_opt.ciphers = optarg; break;
        case O_TLS_SUITES: tls_opt.ciphersuites = optarg; break;
        case O_TLS_CLIENT_CA: tls_opt.client_ca_file = optarg; break;
        case O_TLS_CLIENT_VERIFY:
            ok = strcmp(optarg, "optional") == 0 || strcmp(optarg, "require") == 0;
            tls_opt.client_verify = strcmp(optarg, "require") == 0 ? TERN_TLS_VERIFY_REQUIRE
                                                                   : TERN_TLS_VERIFY_OPTIONAL;
            break;
        case O_TLS_PORT: ok = parse_size(optarg, 65535, &tls_port); break;
        case O_THREADS: ok = parse_size(optarg, 1024, &nthreads) && nthreads > 0; break;
        case O_VHOST:
            ok = nvhost < 64 && strchr(optarg, '=') != NULL;
            if (ok) vhosts[nvhost++] = optarg;
            break;
        case O_PS_BACKLOG: ok = parse_size(optarg, 1ull << 32, &v) && v > 0; ctx.po.max_backlog = v; break;
        case O_REDIS: redis_url = optarg; break;
        case O_REDIS_PASS_FILE: redis_password_file = optarg; break;
        case O_LOG_FORMAT:
            ok = strcmp(optarg, "text") == 0 || strcmp(optarg, "json") == 0;
            tern__serve_log_format(strcmp(optarg, "json") == 0 ? TERN_SERVE_LOG_JSON
                                                               : TERN_SERVE_LOG_TEXT);
            break;
        case O_FEED:
            ok = !strcmp(optarg, "on") || !strcmp(optarg, "off");
            ctx.feed = !strcmp(optarg, "on");
            break;
        case O_FEED_RATE: ok = parse_size(optarg, 100000, &v); ctx.feed_rate = (unsigned)v; break;
        case O_PS_HISTORY:
            ok = parse_size(optarg, TERN_HISTORY_MAX, &v);
            ctx.po.history = (uint32_t)v;
            break;
        case O_SNDBUF:
            ok = parse_size(optarg, 1u << 30, &v) && v >= 4096;
            ctx.listen.sndbuf = (int)v;
            break;
        case O_PS_HISTORY_AGE:
            ok = parse_size(optarg, 86400, &v) && v > 0;
            ctx.po.history_ms = (uint32_t)v * 1000;
            break;
        case O_PS_REPLAY_RATE:
            ok = parse_size(optarg, 1ull << 40, &v);
            ctx.po.replay_rate = v;
            break;
        case O_PS_POLICY: ok = tern__policy_parse(optarg, &ctx.po.policy, &ctx.po.close_code); break;
        case O_PS_TOPIC: {
            /* PREFIX=P: the rule of pattern PREFIX* gets policy P */
            const char *eq = strrchr(optarg, '=');
            char spec[TERN_TOPIC_MAX + 32];
            ok = eq && eq - optarg <= TERN_TOPIC_MAX && strlen(eq + 1) < 16;
            if (ok) {
                snprintf(spec, sizeof(spec), "%.*s* policy=%s", (int)(eq - optarg), optarg, eq + 1);
                ok = tern__rules_add(&ctx.rules, spec, &rule_why) == 0;
            }
            break;
        }
        case O_TOPIC:
            if (tern__rules_add(&ctx.rules, optarg, &rule_why) < 0) {
                fprintf(stderr, "tern serve: --topic %s: %s\n", optarg, rule_why);
                return 2;
            }
            break;
        case O_PS_HISTORY_BYTES:
            ok = parse_size(optarg, 1ull << 40, &v);
            ctx.po.history_bytes = v;
            break;
        case O_TOKEN_HMAC: ctx.token_flags.hmac_secret_file = optarg; break;
        case O_TOKEN_PUBKEY: ctx.token_flags.public_key_file = optarg; break;
        case O_TOKEN_AUD: ctx.token_flags.audience = optarg; break;
        case O_TOKEN_ISS: ctx.token_flags.issuer = optarg; break;
        default: usage(stderr); return 2;
        }
        if (!ok) {
            fprintf(stderr, "tern serve: bad value for --%s: %s\n", opts[c - 1].name, optarg);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "tern serve: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (tern__serve_tokens_setup(&ctx.token_flags) < 0)
        return 2;
    tern__rules_resolve(&ctx.rules);
    /* The page resumes the feed after a network drop: a minute of it,
     * unless the history was configured. */
    tern__topic_rule *market = (tern__topic_rule *)tern__rules_match(&ctx.rules, "market", 6);
    if (ctx.feed && ctx.po.history == 0 && market && !market->prefix && !market->has_history) {
        market->has_history = market->has_history_age = true;
        market->history = FEED_HISTORY;
        market->history_ms = FEED_HISTORY_MS;
    }

    if (api_key_path && (ctx.api_key = read_api_key(api_key_path)) == NULL)
        return 1;   /* said why */
    if (redis_password_file && redis_url == NULL) {
        fprintf(stderr, "tern serve: --redis-password-file needs --redis\n");
        return 2;
    }
    if (redis_url && (ctx.redis = tern__serve_redis_url(redis_url, redis_password_file)) == NULL)
        return 1;   /* said why */
    if (access_path) {
        ctx.access_log = strcmp(access_path, "-") == 0 ? stdout : fopen(access_path, "a");
        if (ctx.access_log == NULL) {
            fprintf(stderr, "tern serve: --access-log %s: %s\n", access_path, strerror(errno));
            return 1;
        }
        setvbuf(ctx.access_log, NULL, _IOLBF, 0);   /* whole lines, as they happen */
    }
    if (!ctx.quiet)
        tern_set_log(log_level, log_stderr, NULL);

    signal(SIGPIPE, SIG_IGN);
    /* Buffers of large messages and bodies (over 256 KiB) come from mmap,
     * so they go back to the system when freed instead of staying in
     * glibc's heap at their peak (measured: 31.6 MB resident after four
     * 8 MB echoes without this, 6 MB with it). */
    mallopt(M_MMAP_THRESHOLD, 256 * 1024);
    /* One descriptor per connection: take all the descriptors the hard
     * limit allows (the soft limit is often 1024). */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (tls_opt.passphrase_file && ncert == 0) {
        fprintf(stderr, "tern serve: --tls-key-passphrase-file needs --tls-cert and --tls-key\n");
        return 2;
    }
    bool tls_protocol_opts = tls_opt.min_version || tls_opt.ciphers || tls_opt.ciphersuites ||
                             tls_opt.client_ca_file || tls_opt.client_verify;
    if (tls_protocol_opts && ncert == 0) {
        fprintf(stderr, "tern serve: the --tls-* options need --tls-cert and --tls-key\n");
        return 2;
    }
    if ((tls_opt.client_ca_file != NULL) != (tls_opt.client_verify != 0)) {
        fprintf(stderr, "tern serve: --tls-client-ca and --tls-client-verify go together\n");
        return 2;
    }
    if (ncert != nkey) {
        fprintf(stderr, "tern serve: each --tls-cert needs its --tls-key\n");
        return 2;
    }
    int err = 0;
    for (int i = 0; i < ncert; i++) {
        err = i == 0 ? tern_tls_new_opt(&ctx.tls, certs[0], keys[0], &tls_opt)
                     : tern_tls_add_cert(ctx.tls, certs[i], keys[i]);
        if (err < 0) {
            /* Said here too: with --quiet the library's log line is off. */
            const char *why = err == -ENOKEY ? " (the key is encrypted: give --tls-key-passphrase-file)"
                              : err == -EKEYREJECTED ? " (wrong passphrase)"
                                                     : "";
            fprintf(stderr, "tern serve: --tls-cert %s --tls-key %s: %s%s\n", certs[i], keys[i],
                    tern_strerror(err), why);
            return 1;
        }
    }
    ctx.host = host;
    ctx.unix_path = unix_path;
    ctx.root = root;
    ctx.port = (int)port;
    ctx.tls_port = (int)tls_port;
    ctx.wo = wo;
    ctx.wo.slow_policy = slow_policy;
    ctx.nthreads = (int)nthreads;
    ctx.vhosts = vhosts;
    ctx.nvhosts = nvhost;
    if ((ctx.threads = calloc(nthreads, sizeof(*ctx.threads))) == NULL) {
        fprintf(stderr, "tern serve: out of memory\n");
        return 1;
    }
    for (int i = 0; i < ctx.nthreads; i++) {
        ctx.threads[i].ctx = &ctx;
        ctx.threads[i].index = i;
        atomic_init(&ctx.threads[i].bcast_inflight, 0);
    }
    if (!shutdown_spread_set) {
        /* The WebSockets' closes over the first 4/5 of the shutdown, so
         * that their close handshakes end before it does. */
        uint32_t t = so.shutdown_timeout_ms ? so.shutdown_timeout_ms : 10000;
        so.shutdown_ws_spread_ms = t / 5 * 4;
    }
    /* A drain closes with 1012 (service restart): the clients are invited
     * to come back, to this server restarted or to another. */
    so.shutdown_ws_code = TERN_WS_SERVICE_RESTART;
    ctx.server_options = so;
    tern_run_options ro = {.loop = lo, .server = so, .teardown = serve_teardown};
    err = tern_run(ctx.nthreads, &ro, serve_setup, &ctx);
    tern_tls_free(ctx.tls);
    for (unsigned long long i = 0; i < nthreads; i++) {
        /* Empty: tern_run ran the last posts, and a timer fires in the
         * iteration that armed it. Had anything stayed, its references
         * would go here (the structs outlive their loop). */
        later_flush(NULL, &ctx.threads[i]);
        free(ctx.threads[i].later);
    }
    free(ctx.threads);
    tern__serve_tokens_cleanup();
    if (ctx.api_key) {
        OPENSSL_cleanse(ctx.api_key, strlen(ctx.api_key));
        free(ctx.api_key);
    }
    if (ctx.redis) {
        OPENSSL_cleanse(ctx.redis, strlen(ctx.redis));
        free(ctx.redis);
    }
    if (ctx.access_log && ctx.access_log != stdout)
        fclose(ctx.access_log);
    if (err == -ESRCH)
        return 1;   /* setup said why */
    if (err < 0) {
        fprintf(stderr, "tern serve: %s\n", tern_strerror(err));
        return 1;
    }
    return 0;
}
