/* tern serve: the demo server.
 *
 *   GET  /ping              "pong"
 *   GET  /echo?size=N       N bytes of 'x'
 *   POST /echo              the request body
 *   GET  /stream?chunks=K&size=S   a chunked response of K chunks of S bytes
 *   POST /upload            a streamed request body: answers its length
 *   GET  /delay?ms=N        "done" after N ms (an answer given later)
 *   GET  /item/:id          "id N from PEER": a numeric route parameter (400 when
 *                           not a number) and the peer's address
 *   GET  /ws                WebSocket echo: every message back with its opcode
 *                           (subprotocol "tern.echo" when asked for)
 *   GET  /ws/broadcast      WebSocket: every message goes to every connection
 *                           of this route, framed (and compressed) once
 *   GET  /ws/room/:room     WebSocket echo; the 101 names the room (X-Tern-Room)
 *   GET  /(anything else)   static files under --root, when given
 *   (any other path)        404 naming the path (tern_http_not_found); a
 *                           known path with another method is 405, an
 *                           unknown method 501
 *
 * SIGINT or SIGTERM: graceful shutdown (stop accepting, finish responses in
 * flight, close idle connections), exit 0. A second signal exits at once. */
#include <errno.h>
#include <getopt.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <strings.h>

#include "app/app.h"
#include "tern/tern.h"

#define MAX_ECHO_SIZE (64u * 1024 * 1024)

/* A connection of /ws/broadcast, on the ctx's list while open. */
typedef struct bcast_member {
    tern_ws *ws;
    struct bcast_member *next, *prev;
} bcast_member;

typedef struct serve_ctx {
    tern_loop *loop;
    tern_server *srv;
    int signals;
    bool quiet;
    const char *ws_origin;     /* --ws-origin: the Origin allowed, or NULL (any) */
    uint64_t ws_conn_seq;      /* numbers the WebSocket connections */
    bcast_member *members;     /* /ws/broadcast connections */
    FILE *access_log;          /* --access-log, or NULL */
    tern_tls *tls;             /* --tls-cert/--tls-key, or NULL */
} serve_ctx;

/* --log-level: the library's lines on stderr. */
static void log_stderr(int level, const char *msg, void *user) {
    fprintf(stderr, "tern: [%s] %s\n", tern_log_level_name(level), msg);
}

/* --access-log: peer method target status bytes duration, one line each. */
static void access_line(tern_server *srv, const tern_http_access *a, void *user) {
    serve_ctx *ctx = user;
    fprintf(ctx->access_log, "%s %s %s %d %llu %llums\n", a->peer, a->method, a->target,
            a->status, (unsigned long long)a->bytes, (unsigned long long)a->duration_ms);
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
    serve_ctx *ctx = user;
    long long ms = query_num(req, "ms", 600000);
    if (ms < 0) {
        bad_request(req, "ms must be an integer from 0 to 600000\n");
        return;
    }
    delay_state *d = calloc(1, sizeof(*d));
    if (d == NULL || tern_timer_start(ctx->loop, &d->timer, (uint64_t)ms, 0, delay_fire, d) < 0) {
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

/* The upgrade hook of both WebSocket routes: an Origin check when
 * --ws-origin is given (browsers send Origin; other clients may not, and
 * are let in), and a connection number in the 101 response. */
static int ws_upgrade(tern_http_req *req, void **conn_user, void *user) {
    serve_ctx *ctx = user;
    size_t olen;
    const char *origin = tern_http_header(req, "Origin", &olen);
    if (ctx->ws_origin && origin &&
        (olen != strlen(ctx->ws_origin) || strncasecmp(origin, ctx->ws_origin, olen) != 0))
        return 403;
    char id[24];
    snprintf(id, sizeof(id), "%llu", (unsigned long long)++ctx->ws_conn_seq);
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

static void bcast_open(tern_ws *ws, void *user) {
    serve_ctx *ctx = user;
    bcast_member *m = calloc(1, sizeof(*m));
    if (m == NULL) {
        tern_ws_close(ws, 1011, "out of memory");
        return;
    }
    m->ws = ws;
    m->next = ctx->members;
    if (m->next)
        m->next->prev = m;
    ctx->members = m;
    tern_ws_set_user(ws, m);
}

static void bcast_close(tern_ws *ws, int code, const char *reason, size_t reason_len, void *user) {
    serve_ctx *ctx = user;
    bcast_member *m = tern_ws_user(ws);
    if (m == NULL)
        return;
    if (m->prev)
        m->prev->next = m->next;
    else
        ctx->members = m->next;
    if (m->next)
        m->next->prev = m->prev;
    free(m);
}

static void bcast_message(tern_ws *ws, const char *data, size_t len, int opcode, void *user) {
    serve_ctx *ctx = user;
    tern_ws_prepared *msg = tern_ws_prepare(data, len, opcode, true);
    if (msg == NULL) {
        tern_ws_close(ws, 1011, "out of memory");
        return;
    }
    /* A member the slow-consumer policy closes during its send is told so
     * (bcast_close, which frees it) at the end of the batch, not inside the
     * send: the plain loop is safe. */
    for (bcast_member *m = ctx->members; m; m = m->next)
        tern_ws_send_prepared(m->ws, msg);
    tern_ws_prepared_free(msg);
}

static void shutdown_done(tern_server *srv, void *user) {
    serve_ctx *ctx = user;
    tern_loop_stop(ctx->loop);
}

static void on_signal(tern_loop *loop, int signo, void *user) {
    serve_ctx *ctx = user;
    if (signo == SIGHUP) {   /* renewed certificates: new handshakes use them */
        int err = ctx->tls ? tern_tls_reload(ctx->tls) : 0;
        if (!ctx->quiet || err < 0)
            fprintf(stderr, "tern: SIGHUP, certificates %s%s\n", err < 0 ? "kept: " : "reloaded",
                    err < 0 ? tern_strerror(err) : "");
        return;
    }
    if (++ctx->signals > 1) {
        if (!ctx->quiet)
            fprintf(stderr, "tern: second signal, exiting now\n");
        tern_loop_stop(loop);
        return;
    }
    if (!ctx->quiet)
        fprintf(stderr, "tern: %s, shutting down (%zu connections)\n",
                signo == SIGINT ? "SIGINT" : "SIGTERM", tern_server_connections(ctx->srv));
    tern_server_shutdown(ctx->srv, shutdown_done, ctx);
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
            "  --tls-port P          HTTPS port (default 8443; 0 picks a free one)\n"
            "  --root DIR            serve static files from DIR\n"
            "  --max-head BYTES      request line + headers (default 16384)\n"
            "  --max-body BYTES      request body (default 16777216)\n"
            "  --head-timeout MS     (default 10000)\n"
            "  --body-timeout MS     (default 10000)\n"
            "  --idle-timeout MS     keep-alive (default 60000)\n"
            "  --send-timeout MS     close a client that takes no bytes for this long (default 60000)\n"
            "  --max-unsent BYTES    bound on all connections' unsent output (default 268435456)\n"
            "  --shutdown-timeout MS graceful shutdown limit (default 10000)\n"
            "  --ws-max-message BYTES  WebSocket message limit (default 16777216)\n"
            "  --ws-idle-timeout MS  ping an idle WebSocket after this long (default 30000)\n"
            "  --no-compression      don't offer permessage-deflate on /ws\n"
            "  --ws-origin ORIGIN    refuse (403) WebSocket upgrades from any other Origin\n"
            "  --ws-slow-policy P    /ws client not reading: pause (default), close (1008) or drop\n"
            "  --log-level L         the library's log on stderr: error, warn (default), info, debug\n"
            "  --access-log FILE     one line per response (peer method target status bytes ms); - for stdout\n"
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

int tern_app_serve(int argc, char **argv) {
    enum { O_HOST = 1, O_PORT, O_UNIX, O_ROOT, O_MAX_HEAD, O_MAX_BODY, O_HEAD_TO, O_BODY_TO,
           O_IDLE_TO, O_SHUT_TO, O_QUIET, O_HELP, O_WS_MAX, O_WS_IDLE, O_NO_PMD, O_WS_ORIGIN, O_WS_SLOW,
           O_SEND_TO, O_MAX_UNSENT, O_LOG_LEVEL, O_ACCESS_LOG, O_TLS_CERT, O_TLS_KEY, O_TLS_PORT };
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
        {NULL, 0, NULL, 0},
    };
    const char *host = "127.0.0.1", *unix_path = NULL, *root = NULL;
    unsigned long long port = 8080, v = 0;
    const char *certs[8], *keys[8];
    int ncert = 0, nkey = 0;
    unsigned long long tls_port = 8443;
    tern_server_options so = {0};
    tern_loop_options lo = {0};
    tern_ws_options wo = {.compression = true};
    /* An echo answers what it reads: when the client does not read the
     * answers, stop reading its requests (TCP pushes back on it). */
    int slow_policy = TERN_WS_SLOW_PAUSE;
    serve_ctx ctx = {0};
    int log_level = TERN_LOG_WARN;
    const char *access_path = NULL;
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
        case O_SEND_TO: ok = parse_size(optarg, 86400000, &v) && v > 0; so.send_timeout_ms = (uint32_t)v; break;
        case O_MAX_UNSENT: ok = parse_size(optarg, 1ull << 40, &v) && v > 0; lo.max_unsent = v; break;
        case O_QUIET: ctx.quiet = true; break;
        case O_HELP: usage(stdout); return 0;
        case O_WS_MAX: ok = parse_size(optarg, 1ull << 40, &v) && v > 0; wo.max_message = v; break;
        case O_WS_IDLE: ok = parse_size(optarg, 86400000, &v) && v > 0; wo.idle_timeout_ms = (uint32_t)v; break;
        case O_NO_PMD: wo.compression = false; break;
        case O_WS_ORIGIN: ctx.ws_origin = optarg; break;
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
        case O_TLS_PORT: ok = parse_size(optarg, 65535, &tls_port); break;
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
    int err = tern_loop_new(&ctx.loop, &lo);
    if (err == 0)
        err = tern_server_new(&ctx.srv, ctx.loop, &so);
    if (err < 0) {
        fprintf(stderr, "tern serve: %s\n", tern_strerror(err));
        return 1;
    }
    if (ctx.access_log)
        tern_server_set_access_log(ctx.srv, access_line, &ctx);
    tern_http_route(ctx.srv, "GET", "/ping", on_ping, &ctx);
    tern_http_route(ctx.srv, "GET", "/echo", on_echo_get, &ctx);
    tern_http_route(ctx.srv, "POST", "/echo", on_echo_post, &ctx);
    tern_http_route(ctx.srv, "GET", "/stream", on_stream, &ctx);
    tern_http_route_stream(ctx.srv, "POST", "/upload", on_upload, &ctx);
    tern_http_route(ctx.srv, "GET", "/delay", on_delay, &ctx);
    tern_http_route(ctx.srv, "GET", "/item/:id", on_item, &ctx);
    tern_http_not_found(ctx.srv, on_not_found, &ctx);
    static const char *const echo_protocols[] = {"tern.echo", NULL};
    static const tern_ws_handlers echo = {.on_upgrade = ws_upgrade, .on_message = ws_echo};
    wo.subprotocols = echo_protocols;
    wo.slow_policy = slow_policy;
    tern_ws_route(ctx.srv, "/ws", &echo, &wo, &ctx);
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
    tern_ws_route(ctx.srv, "/ws/broadcast", &bcast, &bo, &ctx);
    static const tern_ws_handlers room = {.on_upgrade = room_upgrade, .on_message = ws_echo};
    tern_ws_options ro = wo;
    ro.subprotocols = NULL;
    tern_ws_route(ctx.srv, "/ws/room/:room", &room, &ro, &ctx);
    if (root && (err = tern_http_static(ctx.srv, "/", root)) < 0) {
        fprintf(stderr, "tern serve: --root %s: %s\n", root, tern_strerror(err));
        return 1;
    }
    if ((err = tern_listen(ctx.srv, host, (int)port, NULL)) < 0) {
        fprintf(stderr, "tern serve: listen on %s:%llu: %s\n", host, port, tern_strerror(err));
        return 1;
    }
    if (unix_path && (err = tern_listen_unix(ctx.srv, unix_path, NULL)) < 0) {
        fprintf(stderr, "tern serve: listen on %s: %s\n", unix_path, tern_strerror(err));
        return 1;
    }
    if (ncert != nkey) {
        fprintf(stderr, "tern serve: each --tls-cert needs its --tls-key\n");
        return 2;
    }
    for (int i = 0; i < ncert; i++) {
        err = i == 0 ? tern_tls_new(&ctx.tls, certs[0], keys[0])
                     : tern_tls_add_cert(ctx.tls, certs[i], keys[i]);
        if (err < 0) {
            fprintf(stderr, "tern serve: --tls-cert %s --tls-key %s: %s\n", certs[i], keys[i],
                    tern_strerror(err));
            return 1;
        }
    }
    if (ctx.tls && (err = tern_listen_tls(ctx.srv, host, (int)tls_port, ctx.tls, NULL)) < 0) {
        fprintf(stderr, "tern serve: listen on %s:%llu: %s\n", host, tls_port, tern_strerror(err));
        return 1;
    }
    tern_loop_on_signal(ctx.loop, SIGINT, on_signal, &ctx);
    tern_loop_on_signal(ctx.loop, SIGTERM, on_signal, &ctx);
    tern_loop_on_signal(ctx.loop, SIGHUP, on_signal, &ctx);
    {   /* Even with --quiet: with --port 0 this is how to learn the port. */
        bool v6 = strchr(host, ':') != NULL;
        char https[128] = "";
        if (ctx.tls)
            snprintf(https, sizeof(https), " and https://%s%s%s:%d/", v6 ? "[" : "", host,
                     v6 ? "]" : "", tern_server_tls_port(ctx.srv));
        fprintf(stderr, "tern: listening on http://%s%s%s:%d/%s%s%s\n", v6 ? "[" : "", host,
                v6 ? "]" : "", tern_server_port(ctx.srv), https, unix_path ? " and unix:" : "",
                unix_path ? unix_path : "");
    }
    err = tern_loop_run(ctx.loop);
    tern_server_free(ctx.srv);
    tern_tls_free(ctx.tls);
    tern_loop_free(ctx.loop);
    if (ctx.access_log && ctx.access_log != stdout)
        fclose(ctx.access_log);
    if (err < 0) {
        fprintf(stderr, "tern serve: %s\n", tern_strerror(err));
        return 1;
    }
    return 0;
}
