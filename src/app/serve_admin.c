/* tern serve's admin listener (--admin-listen HOST:PORT, default
 * 127.0.0.1:9090; off: none), a server of its own on loop 0, not on the
 * public port:
 *   POST /publish/:topic    the body published to topic:
 *                           {"seq":N,"subscribers":M}; needs
 *                           "Authorization: Bearer KEY", KEY the first line of
 *                           --api-key-file (401 otherwise; 403 without one)
 *   GET  /presence?topic=T[&limit=N]   who is subscribed to T, and
 *   GET  /presence/stats?topic=T       how many (serve_presence.h); keyed as
 *                           POST /publish; 404 where T's rule does not say
 *                           presence=on
 *   GET  /stats             the threads' counters as JSON: their sum, then
 *                           each thread's
 *   GET  /metrics           the same in Prometheus' text format, with Redis's
 *                           link and the refusals by reason (serve_metrics.c)
 *   GET  /healthz, /health  200 "ok": the process answers
 *   GET  /readyz, /ready    200 "ready", or 503 with the reason: draining
 *                           (after SIGTERM), or --redis given and its link
 *                           down
 *   POST /publish, /history, /topics, /disconnect, /unsubscribe
 *                           the server API, keyed as /publish/:topic
 *                           (serve_api.c)
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "app/serve_ctx.h"
#include "app/serve_presence.h"
#include "net/crypto.h"

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
    /* "bridge": the engine's counters and its name; "redis": the same
     * counters, without the name, for Redis alone (its name before
     * "bridge", kept for the users reading it) */
    char bridge[320] = "null", redis[320] = "null";
    tern_bridge_counters rc;
    if (tern_pubsub_bridge_stats(srv, &rc) == 0) {
        char counters[256];
        snprintf(counters, sizeof(counters),
                 "\"connected\":%s,\"reconnects\":%llu,\"published\":%llu,"
                 "\"received\":%llu,\"dropped\":%llu,\"fills\":%llu,\"auth_refused\":%s",
                 rc.connected ? "true" : "false", U(rc.reconnects), U(rc.published),
                 U(rc.received), U(rc.dropped), U(rc.fills), rc.auth_refused ? "true" : "false");
        snprintf(bridge, sizeof(bridge), "{\"engine\":\"%s\",%s}", rc.engine, counters);
        if (strcmp(rc.engine, "redis") == 0)
            snprintf(redis, sizeof(redis), "{%s}", counters);
    }
    app_serve_pubsub_refusals pr;
    app_serve_pubsub_refusals_get(&pr);
    len = (size_t)snprintf(out, cap, "{\"node\":\"%s\",\"threads\":%d,\"thread\":%d,\"bridge\":%s,\"redis\":%s,"
                           "\"pubsub_limits\":{\"rate_refused\":%llu,\"rate_closed\":%llu,"
                           "\"too_big\":%llu,\"forbidden_subscribe\":%llu,"
                           "\"forbidden_publish\":%llu},\"total\":" STATS_FMT ",\"each\":[%s]}\n",
                           ctx->set.node, n, tern_server_index(srv), bridge, redis,
                           U(pr.rate_refused),
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
    app_serve_metrics(req, ctx->first, atomic_load(&ctx->draining), &ctx->rules, ctx->set.node);
}

/* GET /healthz (and /health): the process answers; nothing else is
 * looked at, so that a supervisor restarts only a process that hangs. */
static void on_health(tern_http_req *req, void *user) {
    tern_http_respond(req, 200, "text/plain", "ok\n", 3);
}

/* Why a public listener of some loop is not accepting, or NULL: each
 * loop listens on --port, --unix and --tls-port as configured, and on the
 * /http-stream relays' socket (serve_stream.c), and none of them backs off
 * (out of descriptors, tern_stats.listeners_paused). */
static const char *listeners_down(const serve_ctx *ctx) {
    uint64_t expected = 2 + (ctx->set.unix_path ? 1 : 0) + (ctx->tls ? 1 : 0);
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
 * accepting, nor while the bridge (--bridge) is down when there is one: a
 * node without it delivers its own publishes only. The reason names the
 * engine: "not ready: bridge (nats) down". */
static void on_ready(tern_http_req *req, void *user) {
    serve_ctx *ctx = user;
    tern_bridge_counters rc;
    const char *why = NULL;
    char bridge_why[64];
    bool bridged = ctx->bridge && tern_pubsub_bridge_stats(ctx->first, &rc) == 0;
    if (atomic_load(&ctx->draining)) {
        why = "not ready: draining\n";
    } else if ((why = listeners_down(ctx)) != NULL) {
        ;
    } else if (ctx->bridge && (!bridged || rc.auth_refused || !rc.connected)) {
        /* not bridged yet: the engine the URL's scheme names */
        snprintf(bridge_why, sizeof(bridge_why), "not ready: bridge (%s) %s\n",
                 bridged ? rc.engine : app_serve_bridge_engine(ctx->bridge),
                 bridged && rc.auth_refused ? "auth failed" : "down");
        why = bridge_why;
    }
    if (why)
        tern_http_respond(req, 503, "text/plain", why, strlen(why));
    else
        tern_http_respond(req, 200, "text/plain", "ready\n", 6);
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

bool app_serve_admin_key_ok(tern_http_req *req, const serve_ctx *ctx, const char *route) {
    char why[160];
    int n;
    if (ctx->api_key == NULL) {
        n = snprintf(why, sizeof(why), "tern serve: %s needs an API key: start the server "
                                       "with --api-key-file FILE\n", route);
        tern_http_respond(req, 403, "text/plain", why, (size_t)n);
        return false;
    }
    if (!bearer_ok(req, ctx)) {
        n = snprintf(why, sizeof(why), "tern serve: %s needs Authorization: Bearer KEY "
                                       "(the key of --api-key-file)\n", route);
        tern_http_add_header(req, "WWW-Authenticate", "Bearer");
        tern_http_respond(req, 401, "text/plain", why, (size_t)n);
        return false;
    }
    return true;
}

/* POST /publish/:topic on the admin listener: published on the public
 * servers (loop 0's, this one's loop), with the operator's key only. */
static void on_admin_publish(tern_http_req *req, void *user) {
    if (app_serve_admin_key_ok(req, user, "POST /publish"))
        app_serve_publish(req, ((serve_ctx *)user)->first);
}

/* GET /presence?topic=T and GET /presence/stats?topic=T: who is
 * subscribed there (serve_presence.h), with the operator's key only. */
static void on_admin_presence(tern_http_req *req, void *user) {
    if (app_serve_admin_key_ok(req, user, "GET /presence"))
        app_presence_admin(req, app_serve_pubsub_rules(), false);
}

static void on_admin_presence_stats(tern_http_req *req, void *user) {
    if (app_serve_admin_key_ok(req, user, "GET /presence/stats"))
        app_presence_admin(req, app_serve_pubsub_rules(), true);
}

/* The admin listener: a server of its own (its own routes, limits and
 * counters) on loop 0, beside the public one; made last in setup, so a
 * failure before it has nothing of it to free. */
int app_serve_admin_setup(serve_ctx *ctx, tern_loop *loop) {
    /* With --reuse-port the new process of a hand-over shares it too. It
     * may take the descriptors the public listeners leave in reserve, so
     * /readyz and /metrics answer when those are out of descriptors. */
    tern_listen_options admin_opt = {.reuseport = ctx->set.listen.reuseport, .use_fd_reserve = 1};
    /* HTTP/1.1 only: Prometheus, load balancers' probes and curl speak
     * it, and --http2 h2c is asked for the public port, not for this one
     * (it would add HTTP/2's parser to what the operator's port exposes). */
    tern_server_options admin_server = ctx->set.run.server;
    admin_server.http2 = 0;
    int err = tern_server_new(&ctx->admin, loop, &admin_server);
    if (err < 0) {
        fprintf(stderr, "tern serve: the admin server: %s\n", tern_strerror(err));
        return SETUP_FAILED;
    }
    if ((err = tern_http_route(ctx->admin, "POST", "/publish/:topic", on_admin_publish, ctx)) < 0 ||
        (err = tern_http_route(ctx->admin, "GET", "/presence", on_admin_presence, ctx)) < 0 ||
        (err = tern_http_route(ctx->admin, "GET", "/presence/stats", on_admin_presence_stats,
                               ctx)) < 0 ||
        (err = tern_http_route(ctx->admin, "GET", "/stats", on_stats, ctx)) < 0 ||
        (err = tern_http_route(ctx->admin, "GET", "/metrics", on_metrics, ctx)) < 0 ||
        (err = tern_http_route(ctx->admin, "GET", "/healthz", on_health, ctx)) < 0 ||
        (err = tern_http_route(ctx->admin, "GET", "/health", on_health, ctx)) < 0 ||
        (err = tern_http_route(ctx->admin, "GET", "/readyz", on_ready, ctx)) < 0 ||
        (err = tern_http_route(ctx->admin, "GET", "/ready", on_ready, ctx)) < 0 ||
        (err = app_serve_api_routes(ctx)) < 0 ||
        (err = tern_http_not_found(ctx->admin, app_serve_not_found, ctx)) < 0) {
        fprintf(stderr, "tern serve: the admin routes: %s\n", tern_strerror(err));
    } else if (ctx->sd.admin >= 0 && (err = tern_listen_fd(ctx->admin, ctx->sd.admin, NULL, &admin_opt)) < 0) {
        fprintf(stderr, "tern serve: the admin socket from systemd: %s\n", tern_strerror(err));
    } else if (ctx->sd.admin < 0 &&
               (err = tern_listen(ctx->admin, ctx->set.admin.host, ctx->set.admin.port, &admin_opt)) < 0) {
        fprintf(stderr, "tern serve: --admin-listen %s:%d: %s%s\n", ctx->set.admin.host,
                ctx->set.admin.port, tern_strerror(err), app_serve_in_use_hint(err));
    }
    if (err < 0) {
        tern_server_free(ctx->admin);
        ctx->admin = NULL;
        return SETUP_FAILED;
    }
    return 0;
}

/* --api-key-file: the file's first line (without its line end), or NULL
 * once said why (unreadable, empty). */
char *app_serve_read_api_key(const char *path) {
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
int app_serve_admin_exposed(const app_opt_set *s) {
    const char *at = app_opt_str(s, SV_ADMIN_LISTEN);
    if (!app_opt_uint(s, SV_ADMIN_PUBLIC)) {
        fprintf(stderr, "tern serve: --admin-listen %s is not a loopback address: /stats, "
                        "/metrics, /healthz and /readyz would answer anyone who reaches it, "
                        "with no key; give --admin-listen-public to allow it\n", at);
        return -1;
    }
    fprintf(stderr, "tern serve: WARNING: the admin listener %s is not on loopback: /stats "
                    "(every thread's counters), /metrics, /healthz and /readyz answer anyone "
                    "who reaches it, with no key%s\n", at,
            app_opt_given(s, SV_API_KEY_FILE) ? "" : " (POST /publish and the server API answer 403: no --api-key-file)");
    return 0;
}
