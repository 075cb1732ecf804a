/* tern serve: the demo server.
 *
 * Public listener (--host/--port, --tls-port, --unix):
 *   GET  /ping              "pong"
 *   GET  /, /market         the live page (src/app/market.html; not with --page off)
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
 * with 1012 at random moments over --shutdown-spread, /readyz 503), exit
 * 0. A second signal exits at once. With --drain-delay MS, /readyz turns
 * 503 at the first signal and the drain waits MS (a second signal ends
 * the wait, a third exits at once). SIGHUP: certificates, token keys and
 * --config read again. SIGUSR1: the access log reopened (logrotate).
 * SIGUSR2: ignored. */
#include <ctype.h>
#include <errno.h>
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

#include "app/app.h"
#include "app/serve_options.h"
#include "app/serve_tokens.h"
#include "app/topic_rules.h"
#include "net/crypto.h"
#include "tern/tern.h"

#define MAX_ECHO_SIZE (64u * 1024 * 1024)
#define ORIGINS_MAX 32             /* --allowed-origin values */
#define ORIGINS_MAX_TEXT "32"
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

/* --allowed-origin (and --ws-origin): the Origins a WebSocket upgrade may
 * come from, exact or a wildcard subdomain ("*." after the scheme); none:
 * any. Invariants: never changed once published in serve_ctx.origins; a
 * SIGHUP publishes a new one, and the old one is freed once every loop
 * has run a post made after the swap (an upgrade hook reads it only
 * within one callback, so none can be reading it then). */
typedef struct serve_origins {
    int n;
    char *v[ORIGINS_MAX];
} serve_origins;

/* Shared by every thread: set before they start, read-only after, but for
 * what SIGHUP changes (origins, through its pointer; the options' set,
 * only on loop 0, which handles the signal). */
typedef struct serve_ctx {
    bool quiet;
    _Atomic(serve_origins *) origins;
    /* The options the server runs with, and how to read them again on
     * SIGHUP: the same command line, --config's file (NULL: none) and the
     * environment. */
    tern__opt_set *opts;
    int argc;
    char **argv;
    const char *config_path;
    FILE *access_log;          /* --access-log, or NULL (stdio locks each line) */
    const char *access_path;   /* its file, reopened on SIGUSR1; NULL for stdout */
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
    bool page;                 /* --page on|off (on) */
    char node[TERN__NODE_NAME_MAX + 1];   /* --node-name, or HOSTNAME:PID */
    tern_server *first;        /* thread 0's server (setup's) */
    /* Sockets systemd passed, served instead of binding (closed once
     * served: the servers hold duplicates); -1 each when none. */
    tern__sd_sockets sd;
    bool bench_routes;         /* --bench-routes: /echo, /ws, /fanout... registered */
    /* --admin-listen HOST:PORT (admin_host NULL: off): /publish and /stats
     * on a server of their own, on loop 0 (admin, freed by serve_teardown) */
    const char *admin_host;
    int admin_port;
    char admin_host_buf[256];
    tern_server *admin;
    tern_server_options server_options;   /* the admin server's too */
    tern_timer *watchdog;      /* systemd's WatchdogSec: WATCHDOG=1 from loop 0, or NULL */
    /* RLIMIT_NOFILE once raised to the hard limit, and --max-connections
     * (TERN_UNLIMITED for 0), for the warning at start */
    unsigned long long fd_limit;
    uint32_t max_connections;
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

/* The upgrade hook of every WebSocket route: an Origin check when
 * --allowed-origin is given (browsers send Origin, and a page elsewhere
 * must not reach a user's session here; other clients may send none, and
 * are let in: they can write any Origin anyway), and a connection number
 * in the 101 response. */
static int ws_upgrade(tern_http_req *req, void **conn_user, void *user) {
    serve_ctx *ctx = user;
    size_t olen;
    const char *origin = tern_http_header(req, "Origin", &olen);
    const serve_origins *os = atomic_load_explicit(&ctx->origins, memory_order_acquire);
    if (os->n && origin) {
        bool allowed = false;
        for (int i = 0; i < os->n && !allowed; i++)
            allowed = origin_matches(os->v[i], origin, olen);
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
    size_t cap = 1152 + (size_t)n * 768, len = 0;   /* each entry under 700 bytes; a node name */
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
    len = (size_t)snprintf(out, cap, "{\"node\":\"%s\",\"threads\":%d,\"thread\":%d,\"redis\":%s,"
                           "\"pubsub_limits\":{\"rate_refused\":%llu,\"rate_closed\":%llu,"
                           "\"too_big\":%llu,\"forbidden_subscribe\":%llu,"
                           "\"forbidden_publish\":%llu},\"total\":" STATS_FMT ",\"each\":[%s]}\n",
                           ctx->node, n, tern_server_index(srv), redis, U(pr.rate_refused),
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
    tern__serve_metrics(req, ctx->first, atomic_load(&ctx->draining), &ctx->rules, ctx->node);
}

/* GET /healthz (and /health): the process answers; nothing else is
 * looked at, so that a supervisor restarts only a process that hangs. */
static void on_health(tern_http_req *req, void *user) {
    tern_http_respond(req, 200, "text/plain", "ok\n", 3);
}

/* Why a public listener of some loop is not accepting, or NULL: each
 * loop listens on --port, --unix and --tls-port as configured, and none of
 * them backs off (out of descriptors, tern_stats.listeners_paused). */
static const char *listeners_down(const serve_ctx *ctx) {
    uint64_t expected = 1 + (ctx->unix_path ? 1 : 0) + (ctx->tls ? 1 : 0);
    for (int i = 0; i < tern_server_peer_count(ctx->first); i++) {
        tern_stats st;
        const tern_server *peer = tern_server_peer(ctx->first, i);
        if (peer == NULL || tern_server_stats(peer, &st) < 0 || st.listeners < expected)
            return "not ready: a listener is closed\n";
        if (st.listeners_paused > 0)
            return "not ready: a listener is not accepting (out of descriptors)\n";
    }
    return NULL;
}

/* GET /readyz (and /ready): whether a load balancer should send clients
 * here. Not while draining (SIGTERM), nor while a listener is not
 * accepting, nor while the Redis bridge is down when there is one: a node
 * without it delivers its own publishes only. */
static void on_ready(tern_http_req *req, void *user) {
    serve_ctx *ctx = user;
    tern_redis_counters rc;
    const char *why = NULL;
    if (atomic_load(&ctx->draining))
        why = "not ready: draining\n";
    else if ((why = listeners_down(ctx)) != NULL)
        ;
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

/* SIGUSR1, nginx's convention for logrotate: the access log is opened
 * again under its name (the library's log is on stderr, which belongs to
 * whoever started tern: journald, or a shell's redirection). */
static void on_sigusr1(tern_loop *loop, int signo, void *user) {
    serve_ctx *ctx = user;
    if (ctx->access_path == NULL)
        return;
    int err = tern__serve_log_reopen(ctx->access_log, ctx->access_path);
    if (!ctx->quiet || err < 0)
        tern__serve_log(stderr, err < 0 ? TERN_LOG_ERROR : TERN_LOG_INFO,
                        "SIGUSR1: --access-log %s %s%s", ctx->access_path,
                        err < 0 ? "not reopened, still written to the old file: " : "reopened",
                        err < 0 ? tern_strerror(err) : "");
}

/* Whether the request's "Authorization: Bearer KEY" names ctx->api_key:
 * both are hashed and the digests compared in constant time, so the time
 * taken tells nothing of the key (not even its length). */
static bool bearer_ok(tern_http_req *req, const serve_ctx *ctx) {
    size_t len;
    const char *h = tern_http_header(req, "Authorization", &len);
    if (h == NULL || len < 7 || strncasecmp(h, "Bearer ", 7) != 0)
        return false;
    h += 7, len -= 7;
    while (len && *h == ' ')
        h++, len--;
    uint8_t a[TERN__SHA256_LEN], b[TERN__SHA256_LEN];
    if (tern__crypto_sha256(h, len, a) < 0 ||
        tern__crypto_sha256(ctx->api_key, strlen(ctx->api_key), b) < 0)
        return false;
    return tern__crypto_equal(a, b, sizeof(a));
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

static void origins_free(serve_origins *o) {
    for (int i = 0; o && i < o->n; i++)
        free(o->v[i]);
    free(o);
}

/* The --allowed-origin and --ws-origin values of s together, copied; NULL
 * when they are more than ORIGINS_MAX (*too_many) or out of memory. */
static serve_origins *origins_new(const tern__opt_set *s, bool *too_many) {
    const tern__opt_val *a = &s->vals[SV_ALLOWED_ORIGIN], *w = &s->vals[SV_WS_ORIGIN];
    *too_many = a->n + w->n > ORIGINS_MAX;
    serve_origins *o = *too_many ? NULL : calloc(1, sizeof(*o));
    for (int i = 0; o && i < a->n + w->n; i++) {
        if ((o->v[o->n] = strdup(i < a->n ? a->v[i] : w->v[i - a->n])) == NULL) {
            origins_free(o);
            return NULL;
        }
        o->n++;
    }
    return o;
}

/* Something swapped out of use (origins, a token verifier), freed by
 * free_fn when the last loop has run its post. */
typedef struct retired {
    void *old;
    void (*free_fn)(void *);
    atomic_int left;
} retired;

static void retire_one(tern_loop *loop, void *user) {
    retired *r = user;
    if (atomic_fetch_sub(&r->left, 1) == 1) {
        r->free_fn(r->old);
        free(r);
    }
}

/* Frees old once no loop can be using it (on loop 0, from SIGHUP, after
 * the swap): a loop uses such a thing only within one callback, so once
 * each has run a post made after the swap, none is. The old thing is held
 * by one reference per loop, dropped by its post, and one of this
 * function's, dropped at its end (so the posts cannot free it under the
 * loop here). A loop that takes no post is stopping, and may still be in
 * a callback: its reference is never dropped, and the old thing stays
 * allocated rather than risk it. */
static void retire_after_loops(serve_ctx *ctx, void *old, void (*free_fn)(void *)) {
    retired *r = old ? malloc(sizeof(*r)) : NULL;
    if (r == NULL)
        return;   /* nothing, or out of memory: kept rather than freed under a reader */
    r->old = old;
    r->free_fn = free_fn;
    atomic_init(&r->left, ctx->nthreads + 1);
    for (int i = 0; i < ctx->nthreads; i++)
        tern_loop_post(tern_server_loop(tern_server_peer(ctx->first, i)), retire_one, r);
    retire_one(NULL, r);
}

static void origins_free_any(void *o) { origins_free(o); }
static void token_config_free_any(void *c) { tern__token_config_free(c); }

/* Publishes o to every loop's upgrade hook (on loop 0, from SIGHUP). */
static void origins_swap(serve_ctx *ctx, serve_origins *o) {
    serve_origins *old = atomic_exchange_explicit(&ctx->origins, o, memory_order_acq_rel);
    retire_after_loops(ctx, old, origins_free_any);
}

/* SIGHUP's token verifier: made again from s's files (a rotated key is
 * read), in *out; NULL when tokens are off, or when s would turn them on
 * or off (*toggle: that needs a restart, the hooks of /pubsub depend on
 * it). false once said why when the files do not load. */
static bool tokens_rebuild(const tern__opt_set *s, tern__token_config **out, bool *toggle) {
    tern__serve_token_flags tf = {.hmac_secret_file = tern__opt_str(s, SV_TOKEN_HMAC),
                                  .public_key_file = tern__opt_str(s, SV_TOKEN_PUBKEY),
                                  .audience = tern__opt_str(s, SV_TOKEN_AUD),
                                  .issuer = tern__opt_str(s, SV_TOKEN_ISS),
                                  .leeway = (uint32_t)tern__opt_uint(s, SV_TOKEN_LEEWAY)};
    bool want = tf.hmac_secret_file || tf.public_key_file;
    *toggle = want != tern__serve_tokens_on();
    *out = NULL;
    if (!want || *toggle)
        return true;
    *out = tern__serve_tokens_build(&tf, "tern: SIGHUP");
    return *out != NULL;
}

static bool is_token_option(int i) {
    return i == SV_TOKEN_HMAC || i == SV_TOKEN_PUBKEY || i == SV_TOKEN_AUD || i == SV_TOKEN_ISS ||
           i == SV_TOKEN_LEEWAY;
}

/* The topic rules of s into t (zeroed, resolved): the feed's topics,
 * which anyone reads and no client writes (the feed and the admin
 * listener's POST /publish do), then --pubsub-topic-policy's (PREFIX=P: the
 * rule of PREFIX* gets policy P) and --topic's: a pattern met again is the
 * same rule, and its later keys win. Each value was checked alone;
 * together they may be too many: -1 once said why. */
static int rules_build(const tern__opt_set *s, tern__topic_rules *t) {
    const char *why = NULL;
    memset(t, 0, sizeof(*t));
    tern__rules_add(t, "market subscribe=anyone publish=none", &why);
    tern__rules_add(t, "stats subscribe=anyone publish=none", &why);
    const tern__opt_val *tp = &s->vals[SV_PS_TOPIC], *tr = &s->vals[SV_TOPIC];
    for (int i = 0; i < tp->n + tr->n; i++) {
        char spec[TERN_TOPIC_MAX + 32];
        const char *v = i < tp->n ? tp->v[i] : tr->v[i - tp->n];
        const char *eq = strrchr(v, '=');
        if (i < tp->n)
            snprintf(spec, sizeof(spec), "%.*s* policy=%s", (int)(eq - v), v, eq + 1);
        if (tern__rules_add(t, i < tp->n ? spec : v, &why) < 0) {
            fprintf(stderr, "tern serve: %s %s: %s\n",
                    i < tp->n ? "--pubsub-topic-policy" : "--topic", v, why);
            return -1;
        }
    }
    tern__rules_resolve(t);
    /* The page resumes the feed after a network drop: a minute of it,
     * unless the history was configured. */
    tern__topic_rule *market = (tern__topic_rule *)tern__rules_match(t, "market", 6);
    if (strcmp(tern__opt_str(s, SV_FEED), "on") == 0 && tern__opt_uint(s, SV_PS_HISTORY) == 0 &&
        market && !market->prefix && !market->has_history) {
        market->has_history = market->has_history_age = true;
        market->history = FEED_HISTORY;
        market->history_ms = FEED_HISTORY_MS;
    }
    return 0;
}

/* Whether a and b give every topic the same pub/sub settings (policy,
 * history, backlog: the library's, fixed once pub/sub runs), whatever
 * they say of who may subscribe and publish. */
static bool rules_same_settings(const tern__topic_rules *a, const tern__topic_rules *b) {
    if (a->n != b->n)
        return false;
    for (int i = 0; i < a->n; i++) {
        const tern__topic_rule *x = &a->r[i], *y = NULL;
        for (int k = 0; k < b->n && !y; k++)
            if (b->r[k].prefix == x->prefix && b->r[k].len == x->len &&
                memcmp(b->r[k].pattern, x->pattern, x->len) == 0)
                y = &b->r[k];
        if (y == NULL || x->has_policy != y->has_policy || x->policy != y->policy ||
            x->close_code != y->close_code || x->has_history != y->has_history ||
            x->history != y->history || x->has_history_age != y->has_history_age ||
            x->history_ms != y->history_ms || x->has_backlog != y->has_backlog ||
            x->max_backlog != y->max_backlog)
            return false;
    }
    return true;
}

static void rules_free_any(void *t) { free(t); }

static int log_level_of(const char *name) {
    for (int l = TERN_LOG_ERROR; l <= TERN_LOG_DEBUG; l++)
        if (strcmp(name, tern_log_level_name(l)) == 0)
            return l;
    return TERN_LOG_WARN;
}

/* Whether option i has the same values in a and b. */
static bool same_values(const tern__opt_set *a, const tern__opt_set *b, int i) {
    const tern__opt_val *va = &a->vals[i], *vb = &b->vals[i];
    if (va->n != vb->n)
        return va->n + vb->n == 1 && strcmp(tern__opt_str(a, i) ? tern__opt_str(a, i) : "",
                                            tern__opt_str(b, i) ? tern__opt_str(b, i) : "") == 0;
    for (int k = 0; k < va->n; k++)
        if (strcmp(va->v[k], vb->v[k]) != 0)
            return false;
    return true;
}

/* SIGHUP with --config: the file read again, with the same command line
 * and the environment over it. What may change live (the table's RELOAD
 * options) is applied; what may not is named and left as it is; a file
 * that does not parse changes nothing. One line says which. false when
 * the file did not parse. */
static bool reload_config(serve_ctx *ctx) {
    tern__opt_set n;
    if (tern__opt_init(&n, "tern serve", tern__serve_opts, SV_COUNT) < 0) {
        tern__serve_log(stderr, TERN_LOG_ERROR,
                        "SIGHUP: out of memory: the configuration is kept as it was");
        return false;
    }
    n.env_prefix = "TERN_";
    if (tern__opt_parse_argv(&n, ctx->argc, ctx->argv) < 0 ||
        tern__opt_parse_file(&n, ctx->config_path) < 0 || tern__opt_parse_env(&n) < 0) {
        tern__serve_log(stderr, TERN_LOG_ERROR, "SIGHUP: %s: the configuration is kept as it was",
                        n.err);
        tern__opt_free(&n);
        return false;
    }
    tern__token_config *tok;
    bool toggle;
    if (!tokens_rebuild(&n, &tok, &toggle)) {
        tern__serve_log(stderr, TERN_LOG_ERROR, "SIGHUP: the configuration is kept as it was");
        tern__opt_free(&n);
        return false;
    }
    /* Topic rules: who may subscribe and publish changes live; the
     * settings the library has (policy, history, backlog) need a restart,
     * and then the rules stay as they are, whole. */
    tern__topic_rules *rules = NULL;
    bool rules_fixed = false;
    if (!same_values(ctx->opts, &n, SV_TOPIC) || !same_values(ctx->opts, &n, SV_PS_TOPIC)) {
        if ((rules = malloc(sizeof(*rules))) == NULL || rules_build(&n, rules) < 0) {
            tern__serve_log(stderr, TERN_LOG_ERROR, "SIGHUP: %s: the configuration is kept as it was",
                    rules ? "the topic rules" : "out of memory");
            free(rules);
            tern__token_config_free(tok);
            tern__opt_free(&n);
            return false;
        }
        if (!rules_same_settings(rules, &ctx->rules)) {
            rules_fixed = true;
            free(rules);
            rules = NULL;
        }
    }
    bool too_many = false;
    serve_origins *origins = NULL;
    if (!same_values(ctx->opts, &n, SV_ALLOWED_ORIGIN) || !same_values(ctx->opts, &n, SV_WS_ORIGIN)) {
        if ((origins = origins_new(&n, &too_many)) == NULL) {
            tern__serve_log(stderr, TERN_LOG_ERROR, "SIGHUP: %s: the configuration is kept as it was",
                    too_many ? "more than " ORIGINS_MAX_TEXT " origins" : "out of memory");
            tern__token_config_free(tok);
            free(rules);
            tern__opt_free(&n);
            return false;
        }
    }
    char applied[1024] = "", kept[1024] = "";
    size_t alen = 0, klen = 0;
    for (int i = 0; i < SV_COUNT; i++) {
        const tern__opt *o = &tern__serve_opts[i];
        if ((o->flags & TERN__OPT_CLI_ONLY) || same_values(ctx->opts, &n, i))
            continue;
        bool fixed = (toggle && is_token_option(i)) ||
                     (rules_fixed && (i == SV_TOPIC || i == SV_PS_TOPIC));
        if ((o->flags & TERN__OPT_RELOAD) && !fixed) {
            alen += (size_t)snprintf(applied + alen, sizeof(applied) - alen, "%s%s",
                                     alen ? ", " : "", o->name);
            /* The running set takes the new values: the next SIGHUP
             * compares with what is live. The others keep the values the
             * server started with (and points into). */
            tern__opt_val t = ctx->opts->vals[i];
            ctx->opts->vals[i] = n.vals[i];
            n.vals[i] = t;
        } else {
            klen += (size_t)snprintf(kept + klen, sizeof(kept) - klen, "%s%s",
                                     klen ? ", " : "", o->name);
        }
        alen = alen < sizeof(applied) ? alen : sizeof(applied) - 1;
        klen = klen < sizeof(kept) ? klen : sizeof(kept) - 1;
    }
    if (origins)
        origins_swap(ctx, origins);
    if (rules) {
        const tern__topic_rules *old = tern__serve_pubsub_swap_rules(rules);
        if (old != &ctx->rules)   /* the first ones live in ctx */
            retire_after_loops(ctx, (void *)old, rules_free_any);
    }
    if (tok) {
        retire_after_loops(ctx, tern__serve_tokens_swap(tok), token_config_free_any);
        if (!ctx->quiet)
            tern__serve_log(stderr, TERN_LOG_INFO, "SIGHUP, token keys read again");
    }
    if (!ctx->quiet)
        tern_set_log(log_level_of(tern__opt_str(ctx->opts, SV_LOG_LEVEL)), log_stderr, NULL);
    tern__serve_pubsub_set_rate((uint32_t)tern__opt_uint(ctx->opts, SV_PS_RATE));
    tern__serve_log(stderr, TERN_LOG_INFO, "SIGHUP: %s read: %s%s%s%s%s%s", ctx->config_path,
            alen ? "applied " : "", applied, alen && klen ? "; " : "",
            klen ? "not applied (they need a restart): " : "", kept,
            alen || klen ? "" : "no option changed");
    tern__opt_free(&n);
    return true;
}

/* The reload itself: the file (with --config), the token keys, the
 * certificates. */
static void reload(serve_ctx *ctx) {
    if (ctx->config_path && !reload_config(ctx))
        return;   /* a file that does not parse changes nothing, certificates included */
    if (!ctx->config_path) {
        /* The token files read again (a rotated key), as the certificates. */
        tern__token_config *tok;
        bool toggle;
        if (!tokens_rebuild(ctx->opts, &tok, &toggle))
            tern__serve_log(stderr, TERN_LOG_ERROR,
                            "SIGHUP: the token keys are kept as they were");
        else if (tok)
            retire_after_loops(ctx, tern__serve_tokens_swap(tok), token_config_free_any);
    }
    if (ctx->tls == NULL)
        return;   /* no certificates: none to speak of */
    /* Renewed certificates: new handshakes use them. */
    int err = tern_tls_reload(ctx->tls);
    if (!ctx->quiet || err < 0)
        tern__serve_log(stderr, err < 0 ? TERN_LOG_ERROR : TERN_LOG_INFO,
                        "SIGHUP, certificates %s%s", err < 0 ? "kept: " : "reloaded",
                err < 0 ? tern_strerror(err) : "");
}

/* Descriptors beyond one per connection: each loop's own (epoll or the
 * ring, its wake-up and timer descriptors, its listeners), the admin
 * listener's reserve (16, src/net/listener.c), files being sent, Redis. */
#define FD_HEADROOM 64
#define FD_PER_THREAD 8

/* Warns once, after the "listening on" line (scripts read that one
 * first), when the descriptor limit cannot hold --max-connections: the
 * server would back off at the limit instead of answering 503 at
 * --max-connections. */
static void fd_limit_check(const serve_ctx *ctx) {
    if (ctx->quiet || ctx->max_connections == TERN_UNLIMITED)
        return;
    unsigned long long need = (unsigned long long)ctx->max_connections + FD_HEADROOM +
                              FD_PER_THREAD * (unsigned long long)ctx->nthreads;
    if (ctx->fd_limit >= need)
        return;
    tern__serve_log(stderr, TERN_LOG_WARN,
                    "descriptors: the limit (RLIMIT_NOFILE, raised to the hard limit) is %llu, "
                    "too few for --max-connections %u (about %llu needed): raise the hard limit "
                    "(LimitNOFILE= in the systemd unit, ulimit -Hn) or lower --max-connections",
                    ctx->fd_limit, ctx->max_connections, need);
}

/* SIGHUP: systemd (Type=notify-reload) is told a reload runs, and when it
 * is over, whether it applied or kept the old configuration. */
static void on_sighup(tern_loop *loop, int signo, void *user) {
    serve_ctx *ctx = user;
    tern__serve_sd_reloading();
    reload(ctx);
    tern__serve_sd_reloaded();
}

/* Printed once every thread listens (the first post loop 0 runs). Even
 * with --quiet: with --port 0 this is how to learn the port. */
static void print_listening(tern_loop *loop, void *user) {
    serve_ctx *ctx = user;
    const char *host = ctx->host;
    bool v6 = strchr(host, ':') != NULL;
    char https[256] = "";
    if (ctx->tls)
        snprintf(https, sizeof(https), " and https://%s%s%s:%d/ (%s)", v6 ? "[" : "", host,
                 v6 ? "]" : "", tern_server_tls_port(ctx->first), tern_tls_library());
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
    fd_limit_check(ctx);
    if (tern__serve_sd_watchdog(loop, &ctx->watchdog) < 0)
        tern__serve_log(stderr, TERN_LOG_ERROR, "systemd watchdog: no timer (out of memory)");
}

/* What a refused port means, after tern_strerror's "Address already in
 * use". */
static const char *in_use_hint(int err) {
    return err == -EADDRINUSE ? " (another process listens there; --reuse-port shares a port "
                                "on purpose)"
                              : "";
}

/* Setup fails with this once it has said why. */
#define SETUP_FAILED (-ESRCH)

/* The admin listener: a server of its own (its own routes, limits and
 * counters) on loop 0, beside the public one; made last in setup, so a
 * failure before it has nothing of it to free. */
static int admin_setup(serve_ctx *ctx, tern_loop *loop) {
    /* With --reuse-port the new process of a hand-over shares it too. It
     * may take the descriptors the public listeners leave in reserve, so
     * /readyz and /metrics answer when those are out of descriptors. */
    tern_listen_options admin_opt = {.reuseport = ctx->listen.reuseport, .use_fd_reserve = 1};
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
    } else if (ctx->sd.admin >= 0 && (err = tern_listen_fd(ctx->admin, ctx->sd.admin, NULL, &admin_opt)) < 0) {
        fprintf(stderr, "tern serve: the admin socket from systemd: %s\n", tern_strerror(err));
    } else if (ctx->sd.admin < 0 &&
               (err = tern_listen(ctx->admin, ctx->admin_host, ctx->admin_port, &admin_opt)) < 0) {
        fprintf(stderr, "tern serve: --admin-listen %s:%d: %s%s\n", ctx->admin_host,
                ctx->admin_port, tern_strerror(err), in_use_hint(err));
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
    if (ctx->page && (err = tern__page_routes(srv, ctx->root == NULL, ctx->node)) < 0) {
        fprintf(stderr, "tern serve: page: %s\n", tern_strerror(err));
        return SETUP_FAILED;
    }
    if ((err = tern__feed_start(srv, ctx->feed ? ctx->feed_rate : 0, ctx->node)) < 0) {
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
    if (ctx->sd.http >= 0 && (err = tern_listen_fd(srv, ctx->sd.http, NULL, &ctx->listen)) < 0) {
        fprintf(stderr, "tern serve: the http socket from systemd: %s\n", tern_strerror(err));
        return SETUP_FAILED;
    }
    if (ctx->sd.http < 0 && (err = tern_listen(srv, ctx->host, ctx->port, &ctx->listen)) < 0) {
        fprintf(stderr, "tern serve: listen on %s:%d: %s%s\n", ctx->host, ctx->port,
                tern_strerror(err), in_use_hint(err));
        return SETUP_FAILED;
    }
    if (ctx->unix_path && (err = tern_listen_unix(srv, ctx->unix_path, &ctx->listen)) < 0) {
        fprintf(stderr, "tern serve: listen on %s: %s%s\n", ctx->unix_path, tern_strerror(err),
                in_use_hint(err));
        return SETUP_FAILED;
    }
    if (ctx->sd.https >= 0 && ctx->tls &&
        (err = tern_listen_fd(srv, ctx->sd.https, ctx->tls, &ctx->listen)) < 0) {
        fprintf(stderr, "tern serve: the https socket from systemd: %s\n", tern_strerror(err));
        return SETUP_FAILED;
    }
    if (ctx->sd.https < 0 && ctx->tls &&
        (err = tern_listen_tls(srv, ctx->host, ctx->tls_port, ctx->tls, &ctx->listen)) < 0) {
        fprintf(stderr, "tern serve: listen on %s:%d: %s%s\n", ctx->host, ctx->tls_port,
                tern_strerror(err), in_use_hint(err));
        return SETUP_FAILED;
    }
    if (ctx->admin_host && (err = admin_setup(ctx, tern_server_loop(srv))) < 0)
        return err;
    /* SIGINT and SIGTERM are tern_run's; ours only marks the drain. */
    tern_loop_on_signal(tern_server_loop(srv), SIGHUP, on_sighup, ctx);
    tern_loop_on_signal(tern_server_loop(srv), SIGUSR1, on_sigusr1, ctx);
    tern_loop_on_signal(tern_server_loop(srv), SIGTERM, on_stop_signal, ctx);
    tern_loop_on_signal(tern_server_loop(srv), SIGINT, on_stop_signal, ctx);
    tern_loop_post(tern_server_loop(srv), print_listening, ctx);
    return 0;
}

static void usage(const tern__opt_set *s, FILE *f) {
    fprintf(f, "usage: tern serve [options]   (TLS: %s)\n\n", tern_tls_library());
    tern__opt_help(s, f);
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
            tern__crypto_wipe(line, cap);
        free(line);
        return NULL;
    }
    return line;
}


/* --admin-listen on an address other than loopback: its GET routes have no
 * key, so it is refused unless --admin-listen-public says it is meant, and
 * then said loudly, even with --quiet. 0 or -1 (refused, said why). */
static int admin_exposed(const tern__opt_set *s) {
    const char *at = tern__opt_str(s, SV_ADMIN_LISTEN);
    if (!tern__opt_uint(s, SV_ADMIN_PUBLIC)) {
        fprintf(stderr, "tern serve: --admin-listen %s is not a loopback address: /stats, "
                        "/metrics, /healthz and /readyz would answer anyone who reaches it, "
                        "with no key; give --admin-listen-public to allow it\n", at);
        return -1;
    }
    fprintf(stderr, "tern serve: WARNING: the admin listener %s is not on loopback: /stats "
                    "(every thread's counters), /metrics, /healthz and /readyz answer anyone "
                    "who reaches it, with no key%s\n", at,
            tern__opt_given(s, SV_API_KEY_FILE) ? "" : " (POST /publish answers 403: no --api-key-file)");
    return 0;
}

/* Runs the server the options s describe (the strings stay in s while it
 * runs; argc, argv: the command line they came from, for SIGHUP); the
 * command's exit status. */
static int serve_main(tern__opt_set *s, int argc, char **argv) {
    const char *host = tern__opt_str(s, SV_HOST), *unix_path = tern__opt_str(s, SV_UNIX);
    const char *root = tern__opt_str(s, SV_ROOT);
    const tern__opt_val *certs = &s->vals[SV_TLS_CERT], *keys = &s->vals[SV_TLS_KEY];
    int ncert = certs->n, nkey = keys->n;
    /* A file, not the passphrase itself: a command line is visible to
     * every user of the machine (ps, /proc). */
    tern_tls_options tls_opt = {0};
    /* One loop per CPU this process may use (taskset, a container's
     * cpuset or quota), not per CPU of the machine. */
    int cpus = tern_cpu_count();
    unsigned long long nthreads = cpus > 1024 ? 1024 : (unsigned long long)cpus;
    if (tern__opt_given(s, SV_THREADS))
        nthreads = tern__opt_uint(s, SV_THREADS);
    tern_server_options so = {0};
    tern_loop_options lo = {0};
    tern_ws_options wo = {.compression = !tern__opt_uint(s, SV_NO_PMD)};
    /* An echo answers what it reads: when the client does not read the
     * answers, stop reading its requests (TCP pushes back on it). */
    const char *slow = tern__opt_str(s, SV_WS_SLOW);
    int slow_policy = !strcmp(slow, "close") ? TERN_WS_SLOW_CLOSE
                      : !strcmp(slow, "drop") ? TERN_WS_SLOW_DROP : TERN_WS_SLOW_PAUSE;
    serve_ctx ctx = {.bcast_lock = PTHREAD_MUTEX_INITIALIZER};
    atomic_init(&ctx.draining, false);
    ctx.quiet = tern__opt_uint(s, SV_QUIET);
    ctx.feed = strcmp(tern__opt_str(s, SV_FEED), "on") == 0;
    ctx.feed_rate = (unsigned)tern__opt_uint(s, SV_FEED_RATE);
    ctx.page = strcmp(tern__opt_str(s, SV_PAGE), "on") == 0;
    if (tern__opt_given(s, SV_NODE_NAME))
        snprintf(ctx.node, sizeof(ctx.node), "%s", tern__opt_str(s, SV_NODE_NAME));
    else
        tern__node_name_default(ctx.node, sizeof(ctx.node));
    ctx.ps_limits.max_message = tern__opt_uint(s, SV_PS_MAX_MESSAGE);
    ctx.ps_limits.rate = (uint32_t)tern__opt_uint(s, SV_PS_RATE);
    ctx.bench_routes = tern__opt_uint(s, SV_BENCH_ROUTES);
    tern__serve_admin_listen_parse(tern__opt_str(s, SV_ADMIN_LISTEN), ctx.admin_host_buf,
                                   sizeof(ctx.admin_host_buf), &ctx.admin_port);
    ctx.admin_host = ctx.admin_host_buf[0] ? ctx.admin_host_buf : NULL;
    if (ctx.admin_host && !tern__serve_admin_loopback(ctx.admin_host) && admin_exposed(s) < 0)
        return 2;
    const char *api_key_path = tern__opt_str(s, SV_API_KEY_FILE);
    so.max_head = tern__opt_uint(s, SV_MAX_HEAD);
    so.max_body = tern__opt_uint(s, SV_MAX_BODY);
    so.head_timeout_ms = (uint32_t)tern__opt_uint(s, SV_HEAD_TO);
    so.body_timeout_ms = (uint32_t)tern__opt_uint(s, SV_BODY_TO);
    so.idle_timeout_ms = (uint32_t)tern__opt_uint(s, SV_IDLE_TO);
    so.shutdown_timeout_ms = (uint32_t)tern__opt_uint(s, SV_SHUT_TO);
    so.send_timeout_ms = (uint32_t)tern__opt_uint(s, SV_SEND_TO);
    unsigned long long v = tern__opt_uint(s, SV_MAX_CONNS);
    so.max_connections = v ? (uint32_t)v : TERN_UNLIMITED;
    v = tern__opt_uint(s, SV_MAX_CONNS_IP);
    so.max_connections_per_ip = v ? (uint32_t)v : TERN_UNLIMITED;
    lo.max_unsent = tern__opt_uint(s, SV_MAX_UNSENT);
    if (tern__opt_given(s, SV_IO))
        lo.io = strcmp(tern__opt_str(s, SV_IO), "uring") == 0 ? TERN_IO_URING : TERN_IO_EPOLL;
    wo.max_message = tern__opt_uint(s, SV_WS_MAX);
    wo.idle_timeout_ms = (uint32_t)tern__opt_uint(s, SV_WS_IDLE);
    if (s->vals[SV_ALLOWED_ORIGIN].n + s->vals[SV_WS_ORIGIN].n > ORIGINS_MAX) {
        fprintf(stderr, "tern serve: bad value for --allowed-origin: more than %d origins "
                        "(with --ws-origin)\n", ORIGINS_MAX);
        return 2;
    }
    ctx.opts = s;
    ctx.argc = argc;
    ctx.argv = argv;
    ctx.config_path = tern__serve_config_path(s);
    if (tern__opt_given(s, SV_WS_ASYNC))
        ctx.ws_async = strcmp(tern__opt_str(s, SV_WS_ASYNC), "post") == 0 ? WS_ASYNC_POST
                                                                         : WS_ASYNC_TIMER;
    ctx.ws_deadline_ms = (uint32_t)tern__opt_uint(s, SV_WS_DEADLINE);
    int log_level = log_level_of(tern__opt_str(s, SV_LOG_LEVEL));
    const char *access_path = tern__opt_str(s, SV_ACCESS_LOG);
    tls_opt.passphrase_file = tern__opt_str(s, SV_TLS_PASS_FILE);
    if (tern__opt_given(s, SV_TLS_MIN))
        tls_opt.min_version = strcmp(tern__opt_str(s, SV_TLS_MIN), "1.3") == 0 ? 13 : 12;
    tls_opt.ciphers = tern__opt_str(s, SV_TLS_CIPHERS);
    tls_opt.ciphersuites = tern__opt_str(s, SV_TLS_SUITES);
    tls_opt.client_ca_file = tern__opt_str(s, SV_TLS_CLIENT_CA);
    if (tern__opt_given(s, SV_TLS_CLIENT_VERIFY))
        tls_opt.client_verify = strcmp(tern__opt_str(s, SV_TLS_CLIENT_VERIFY), "require") == 0
                                    ? TERN_TLS_VERIFY_REQUIRE
                                    : TERN_TLS_VERIFY_OPTIONAL;
    unsigned long long port = tern__opt_uint(s, SV_PORT), tls_port = tern__opt_uint(s, SV_TLS_PORT);
    ctx.po.max_backlog = tern__opt_uint(s, SV_PS_BACKLOG);
    const char *redis_url = tern__opt_str(s, SV_REDIS);
    const char *redis_password_file = tern__opt_str(s, SV_REDIS_PASS_FILE);
    tern__serve_log_format(strcmp(tern__opt_str(s, SV_LOG_FORMAT), "json") == 0
                               ? TERN_SERVE_LOG_JSON
                               : TERN_SERVE_LOG_TEXT);
    ctx.po.history = (uint32_t)tern__opt_uint(s, SV_PS_HISTORY);
    ctx.listen.sndbuf = (int)tern__opt_uint(s, SV_SNDBUF);
    /* Asked for, the ports are shared on purpose (a hand-over), so the
     * library does not check that they are free. */
    ctx.listen.reuseport = (int)tern__opt_uint(s, SV_REUSE_PORT);
    ctx.po.history_ms = (uint32_t)tern__opt_uint(s, SV_PS_HISTORY_AGE) * 1000;
    ctx.po.replay_rate = tern__opt_uint(s, SV_PS_REPLAY_RATE);
    ctx.po.write_delay_ms = (uint32_t)tern__opt_uint(s, SV_PS_WRITE_DELAY);
    ctx.po.history_bytes = tern__opt_uint(s, SV_PS_HISTORY_BYTES);
    tern__policy_parse(tern__opt_str(s, SV_PS_POLICY), &ctx.po.policy, &ctx.po.close_code);
    if (rules_build(s, &ctx.rules) < 0)
        return 2;   /* said why */
    ctx.token_flags.hmac_secret_file = tern__opt_str(s, SV_TOKEN_HMAC);
    ctx.token_flags.public_key_file = tern__opt_str(s, SV_TOKEN_PUBKEY);
    ctx.token_flags.audience = tern__opt_str(s, SV_TOKEN_AUD);
    ctx.token_flags.issuer = tern__opt_str(s, SV_TOKEN_ISS);
    ctx.token_flags.leeway = (uint32_t)tern__opt_uint(s, SV_TOKEN_LEEWAY);
    if (tern__serve_tokens_setup(&ctx.token_flags) < 0)
        return 2;

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
        if (ctx.access_log != stdout)
            ctx.access_path = access_path;
    }
    if (!ctx.quiet)
        tern_set_log(log_level, log_stderr, NULL);

    signal(SIGPIPE, SIG_IGN);
    /* SIGUSR2 is nginx's binary upgrade; tern has none, and a stray one
     * must not end the process (its default) without a drain. */
    signal(SIGUSR2, SIG_IGN);
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
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
        ctx.fd_limit = rl.rlim_cur;
    ctx.max_connections = so.max_connections;
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
        err = i == 0 ? tern_tls_new_opt(&ctx.tls, certs->v[0], keys->v[0], &tls_opt)
                     : tern_tls_add_cert(ctx.tls, certs->v[i], keys->v[i]);
        if (err < 0) {
            /* Said here too: with --quiet the library's log line is off. */
            const char *why = err == -ENOKEY ? " (the key is encrypted: give --tls-key-passphrase-file)"
                              : err == -EKEYREJECTED ? " (wrong passphrase)"
                                                     : "";
            fprintf(stderr, "tern serve: --tls-cert %s --tls-key %s: %s%s\n", certs->v[i], keys->v[i],
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
    ctx.vhosts = (const char **)s->vals[SV_VHOST].v;
    ctx.nvhosts = s->vals[SV_VHOST].n;
    bool too_many;
    serve_origins *origins = origins_new(s, &too_many);
    if (origins == NULL || (ctx.threads = calloc(nthreads, sizeof(*ctx.threads))) == NULL) {
        origins_free(origins);
        fprintf(stderr, "tern serve: out of memory\n");
        return 1;
    }
    atomic_init(&ctx.origins, origins);
    for (int i = 0; i < ctx.nthreads; i++) {
        ctx.threads[i].ctx = &ctx;
        ctx.threads[i].index = i;
        atomic_init(&ctx.threads[i].bcast_inflight, 0);
    }
    if (tern__opt_given(s, SV_SHUT_SPREAD)) {
        so.shutdown_ws_spread_ms = (uint32_t)tern__opt_uint(s, SV_SHUT_SPREAD);
    } else {
        /* The WebSockets' closes over the first 4/5 of the shutdown, so
         * that their close handshakes end before it does. */
        uint32_t t = so.shutdown_timeout_ms ? so.shutdown_timeout_ms : 10000;
        so.shutdown_ws_spread_ms = t / 5 * 4;
    }
    /* A drain closes with 1012 (service restart): the clients are invited
     * to come back, to this server restarted or to another. */
    so.shutdown_ws_code = TERN_WS_SERVICE_RESTART;
    ctx.server_options = so;
    tern_run_options ro = {.loop = lo, .server = so, .teardown = serve_teardown,
                           .drain_delay_ms = (uint32_t)tern__opt_uint(s, SV_DRAIN_DELAY)};
    if (tern__serve_sd_sockets(&ctx.sd) < 0) {
        err = SETUP_FAILED;
    } else if (ctx.sd.https >= 0 && ctx.tls == NULL) {
        fprintf(stderr, "tern serve: systemd passed an https socket: it needs --tls-cert and "
                        "--tls-key\n");
        err = SETUP_FAILED;
    } else if (ctx.sd.admin >= 0 && ctx.admin_host == NULL) {
        fprintf(stderr, "tern serve: systemd passed an admin socket, and --admin-listen is off\n");
        err = SETUP_FAILED;
    } else {
        err = tern_run(ctx.nthreads, &ro, serve_setup, &ctx);
    }
    /* The servers listened on duplicates: these are no longer needed. */
    const int inherited[] = {ctx.sd.http, ctx.sd.https, ctx.sd.admin};
    for (size_t i = 0; i < sizeof(inherited) / sizeof(inherited[0]); i++)
        if (inherited[i] >= 0)
            close(inherited[i]);
    tern_tls_free(ctx.tls);
    for (unsigned long long i = 0; i < nthreads; i++) {
        /* Empty: tern_run ran the last posts, and a timer fires in the
         * iteration that armed it. Had anything stayed, its references
         * would go here (the structs outlive their loop). */
        later_flush(NULL, &ctx.threads[i]);
        free(ctx.threads[i].later);
    }
    free(ctx.threads);
    origins_free(atomic_load(&ctx.origins));
    tern__serve_tokens_cleanup();
    if (ctx.api_key) {
        tern__crypto_wipe(ctx.api_key, strlen(ctx.api_key));
        free(ctx.api_key);
    }
    if (ctx.redis) {
        tern__crypto_wipe(ctx.redis, strlen(ctx.redis));
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

/* TERN_ variables that are not options and are read (TERN_CONFIG here,
 * TERN_IO by the loop, also --io's), or set for tern's own tests, benches
 * and build, in whose environment a server runs: not misspellings. */
static const char *const env_not_options[] = {
    "TERN_CONFIG", "TERN_IO", "TERN_BIN", "TERN_B", "TERN_B_BIN", "TERN_LOAD", "TERN_LOAD_BIN",
    "TERN_SANITIZED", "TERN_CHROMIUM", "TERN_TLS", "TERN_USE_STATIC", "TERN_SOAK_*",
    "TERN_TEST_*", NULL,
};

int tern_app_serve(int argc, char **argv) {
    tern__opt_set s;
    if (tern__opt_init(&s, "tern serve", tern__serve_opts, SV_COUNT) < 0) {
        fprintf(stderr, "tern serve: out of memory\n");
        return 1;
    }
    int status = -1;
    s.env_prefix = "TERN_";
    const char *config = NULL;
    if (tern__opt_parse_argv(&s, argc, argv) < 0 ||
        ((config = tern__serve_config_path(&s)) && tern__opt_parse_file(&s, config) < 0) ||
        tern__opt_parse_env(&s) < 0) {
        fprintf(stderr, "tern serve: %s (tern serve --help lists the options)\n", s.err);
        status = 2;
    } else if (s.nargs > 0) {
        fprintf(stderr, "tern serve: unexpected argument '%s'\n", s.args[0]);
        status = 2;
    } else if (tern__opt_uint(&s, SV_HELP)) {
        usage(&s, stdout);
        status = 0;
    } else if (tern__opt_uint(&s, SV_VERSION)) {
        tern__print_version(stdout);
        status = 0;
    } else if (tern__opt_uint(&s, SV_PRINT_CONFIG)) {
        /* What the server would run with: the threads' default is the CPUs'
         * it may use. */
        int cpus = tern_cpu_count();
        char n[24];
        snprintf(n, sizeof(n), "%d", cpus > 1024 ? 1024 : cpus);
        tern__opt_set_default(&s, SV_THREADS, n);
        printf("# tern serve --print-config: flags over environment (TERN_NAME) over\n"
               "# --config file over defaults; this output is a --config file.\n");
        tern__opt_print(&s, stdout);
        status = 0;
    }
    if (status < 0) {
        tern__opt_env_warn(&s, env_not_options, stderr);
        status = serve_main(&s, argc, argv);
    }
    tern__opt_free(&s);
    return status;
}
