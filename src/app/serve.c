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
 *   GET  /sse?topic=T...    the same topics as Server-Sent Events, resumed by
 *                           Last-Event-ID (src/app/serve_sse.c)
 *   GET  /http-stream       /pubsub over HTTP streaming: its messages as lines
 *   POST /http-stream/ops   of JSON, the client's ops POSTed (serve_stream.c)
 *   (with --bench-routes)   the routes of serve_bench.c, and serve_pubsub.c's /fanout
 *   GET  /(anything else)   static files under --root, when given
 *   (Host NAME of a --vhost NAME=ROOT)  the files under ROOT, nothing else
 *   (any other path)        404 naming the path (tern_http_not_found); a
 *                           known path with another method is 405, an
 *                           unknown method 501
 *
 * Admin listener (--admin-listen): serve_admin.c.
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
 * --config read again (serve_reload.c). SIGUSR1: the access log reopened
 * (logrotate). SIGUSR2: ignored.
 *
 * Where each option's value goes: serve_options.c's table, put into
 * serve_ctx.set at start (serve_main). */
#include <errno.h>
#include <malloc.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "app/presence_nodes.h"
#include "app/serve_presence.h"
#include "app/serve_ctx.h"
#include "net/crypto.h"

#define FEED_HISTORY 4096          /* topic market's history, unless --pubsub-history */
#define FEED_HISTORY_MS 60000

/* --access-log: peer method target status bytes duration, one line each. */
static void access_line(tern_server *srv, const tern_http_access *a, void *user) {
    serve_ctx *ctx = user;
    app_serve_log_access(ctx->access_log, a);
}

static void on_ping(tern_http_req *req, void *user) {
    tern_http_respond(req, 200, "text/plain", "pong", 4);
}

void app_serve_not_found(tern_http_req *req, void *user) {
    size_t len;
    const char *path = tern_http_path(req, &len);
    char body[160];
    int n = snprintf(body, sizeof(body), "tern: no route for %.*s\n",
                     len > 100 ? 100 : (int)len, path);
    tern_http_respond(req, 404, "text/plain", body, (size_t)n);
}

/* SIGTERM and SIGINT, after tern_run's own handler (which starts the
 * graceful shutdown): readiness says so from now on. */
static void on_stop_signal(tern_loop *loop, int signo, void *user) {
    serve_ctx *ctx = user;
    if (!atomic_exchange(&ctx->draining, true)) {
        app_serve_sd_stopping();
        app_serve_sse_drain(ctx->first);
        app_serve_stream_drain(ctx->first);
        app_prnodes_draining();
    }
}

/* SIGUSR1, nginx's convention for logrotate: the access log is opened
 * again under its name (the library's log is on stderr, which belongs to
 * whoever started tern: journald, or a shell's redirection). */
static void on_sigusr1(tern_loop *loop, int signo, void *user) {
    serve_ctx *ctx = user;
    if (ctx->access_path == NULL)
        return;
    int err = app_serve_log_reopen(ctx->access_log, ctx->access_path);
    if (!ctx->set.quiet || err < 0)
        app_serve_log(stderr, err < 0 ? TERN_LOG_ERROR : TERN_LOG_INFO,
                        "SIGUSR1: --access-log %s %s%s", ctx->access_path,
                        err < 0 ? "not reopened, still written to the old file: " : "reopened",
                        err < 0 ? tern_strerror(err) : "");
}

/* The topic rules of set into t (zeroed, resolved): the feed's topics,
 * which anyone reads and no client writes (the feed and the admin
 * listener's POST /publish do), then --pubsub-topic-policy's (PREFIX=P: the
 * rule of PREFIX* gets policy P) and --topic's: a pattern met again is the
 * same rule, and its later keys win. Each value was checked alone;
 * together they may be too many: -1 once said why. */
int app_serve_rules_build(const app_serve_settings *set, app_topic_rules *t) {
    const char *why = NULL;
    memset(t, 0, sizeof(*t));
    if (app_rules_add(t, "market subscribe=anyone publish=none", &why) < 0 ||
        app_rules_add(t, "stats subscribe=anyone publish=none", &why) < 0) {
        fprintf(stderr, "tern serve: the built-in topic rules: %s\n", why);
        return -1;
    }
    const app_opt_val *tp = set->topic_policies, *tr = set->topics;
    for (int i = 0; i < tp->n + tr->n; i++) {
        char spec[TERN_TOPIC_MAX + 32];
        const char *v = i < tp->n ? tp->v[i] : tr->v[i - tp->n];
        const char *eq = strrchr(v, '=');
        if (i < tp->n)
            snprintf(spec, sizeof(spec), "%.*s* policy=%s", (int)(eq - v), v, eq + 1);
        if (app_rules_add(t, i < tp->n ? spec : v, &why) < 0) {
            fprintf(stderr, "tern serve: %s %s: %s\n",
                    i < tp->n ? "--pubsub-topic-policy" : "--topic", v, why);
            return -1;
        }
    }
    app_rules_resolve(t);
    /* The page resumes the feed after a network drop: a minute of it,
     * unless the history was configured. */
    app_topic_rule *market = (app_topic_rule *)app_rules_match(t, "market", 6);
    if (set->feed && set->pubsub.history == 0 &&
        market && !market->prefix && !market->has_history) {
        market->has_history = market->has_history_age = true;
        market->history = FEED_HISTORY;
        market->history_ms = FEED_HISTORY_MS;
    }
    /* The page shows how many watch "market": presence=stats, unless a
     * rule said otherwise. Counts only: with presence=on anyone allowed
     * to subscribe could list the users and token info of everybody
     * watching, which an operator must ask for. The page asks
     * presence_stats every few seconds, O(1) a question; join-leave stays
     * off, since each join and leave would go to every subscriber: N
     * messages a subscribe on a topic that load tests fill with
     * thousands. */
    if (set->page && market && !market->prefix && !market->has_presence) {
        market->has_presence = true;
        market->presence = APP_PRESENCE_STATS;
    }
    return 0;
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
    const app_serve_settings *set = &ctx->set;
    if (set->quiet || set->run.server.max_connections == TERN_UNLIMITED)
        return;
    unsigned long long need = (unsigned long long)set->run.server.max_connections + FD_HEADROOM +
                              FD_PER_THREAD * (unsigned long long)set->threads;
    if (ctx->fd_limit >= need)
        return;
    app_serve_log(stderr, TERN_LOG_WARN,
                    "descriptors: the limit (RLIMIT_NOFILE, raised to the hard limit) is %llu, "
                    "too few for --max-connections %u (about %llu needed): raise the hard limit "
                    "(LimitNOFILE= in the systemd unit, ulimit -Hn) or lower --max-connections",
                    ctx->fd_limit, set->run.server.max_connections, need);
}

/* Printed once every thread listens (the first post loop 0 runs). Even
 * with --quiet: with --port 0 this is how to learn the port. */
static void print_listening(tern_loop *loop, void *user) {
    serve_ctx *ctx = user;
    const app_serve_settings *set = &ctx->set;
    const char *host = set->host;
    bool v6 = strchr(host, ':') != NULL;
    char https[256] = "";
    if (ctx->tls)
        snprintf(https, sizeof(https), " and https://%s%s%s:%d/ (%s)", v6 ? "[" : "", host,
                 v6 ? "]" : "", tern_server_tls_port(ctx->first), tern_tls_library());
    char admin[320] = "";
    if (ctx->admin) {
        bool av6 = strchr(set->admin.host, ':') != NULL;
        snprintf(admin, sizeof(admin), " (admin http://%s%s%s:%d/)", av6 ? "[" : "",
                 set->admin.host, av6 ? "]" : "", tern_server_port(ctx->admin));
    }
    /* The back end stays last: scripts read it there. */
    char line[1024];
    snprintf(line, sizeof(line), "listening on http://%s%s%s:%d/%s%s%s%s (%d thread%s, %s)",
             v6 ? "[" : "", host, v6 ? "]" : "", tern_server_port(ctx->first), https,
             set->unix_path ? " and unix:" : "", set->unix_path ? set->unix_path : "", admin,
             set->threads, set->threads == 1 ? "" : "s",
             tern_loop_backend(tern_server_loop(ctx->first)));
    app_serve_log(stderr, TERN_LOG_INFO, "%s", line);
    app_serve_sd_ready(line);
    fd_limit_check(ctx);
    if (app_serve_sd_watchdog(loop, &ctx->watchdog) < 0)
        app_serve_log(stderr, TERN_LOG_ERROR, "systemd watchdog: no timer (out of memory)");
}

/* What a refused port means, after tern_strerror's "Address already in
 * use". */
const char *app_serve_in_use_hint(int err) {
    return err == -EADDRINUSE ? " (another process listens there; --reuse-port shares a port "
                                "on purpose)"
                              : "";
}

/* tern_run's teardown: loop 0 has ended, the admin server goes before it. */
static void serve_teardown(tern_loop *loop, tern_server *srv, void *user) {
    serve_ctx *ctx = user;
    /* This loop's backend proxy requests and HTTP client, while the loop
     * is still there to take their watchers and timer back. */
    app_serve_proxy_thread_end();
    if (tern_server_index(srv) == 0 && ctx->watchdog) {
        tern_timer_stop(ctx->watchdog);
        ctx->watchdog = NULL;
    }
    if (tern_server_index(srv) == 0)
        app_prnodes_stop();
    if (tern_server_index(srv) == 0 && ctx->admin) {
        tern_server_free(ctx->admin);
        ctx->admin = NULL;
    }
}

/* tern_run's setup: the routes and listeners of the first server (the
 * other threads' share them). */
/* Rule r's settings for the library, what it does not say the server's
 * (--pubsub-*). */
static tern_topic_options rule_options(const app_topic_rule *r, const app_serve_settings *set) {
    tern_topic_options to = {.policy = r->has_policy ? r->policy : set->pubsub.policy,
                             .close_code = r->has_policy ? r->close_code : 0,
                             .max_backlog = r->has_backlog ? r->max_backlog : 0,
                             .history = r->has_history ? r->history : 0,
                             .history_ms = r->has_history_age ? r->history_ms : 0,
                             .throttle_ms = r->has_throttle ? r->throttle_ms : 0,
                             .exact = !r->prefix};
    if (!r->has_policy && to.policy == TERN_PUBSUB_CLOSE)
        to.close_code = set->pubsub.close_code;
    return to;
}

static int serve_setup(tern_server *srv, void *user) {
    serve_ctx *ctx = user;
    const app_serve_settings *set = &ctx->set;
    int err;
    ctx->first = srv;
    if ((ctx->access_log && (err = tern_server_set_access_log(srv, access_line, ctx)) < 0) ||
        (err = tern_http_route(srv, "GET", "/ping", on_ping, ctx)) < 0 ||
        (set->bench_routes && (err = app_serve_bench_routes(srv, ctx, &set->ws)) < 0) ||
        (err = tern_http_not_found(srv, app_serve_not_found, ctx)) < 0) {
        fprintf(stderr, "tern serve: the routes: %s\n", tern_strerror(err));
        return SETUP_FAILED;
    }
    if ((err = app_serve_pubsub_routes(srv, &set->ws, &set->pubsub, &set->ps_limits, &ctx->rules,
                                         set->bench_routes, app_serve_ws_upgrade, ctx)) < 0) {
        fprintf(stderr, "tern serve: pub/sub routes: %s\n", tern_strerror(err));
        return SETUP_FAILED;
    }
    if ((err = app_serve_stream_routes(srv, app_serve_ws_upgrade, ctx)) < 0) {
        fprintf(stderr, "tern serve: stream routes: %s\n", tern_strerror(err));
        return SETUP_FAILED;
    }
    /* Each topic rule's settings, what it does not say the server's: the
     * library's rule for the same pattern (its exact topic or prefix). */
    const app_topic_rule *all = NULL;   /* rule "*" */
    for (int i = 0; i < ctx->rules.n; i++) {
        const app_topic_rule *r = &ctx->rules.r[i];
        tern_topic_options to = rule_options(r, set);
        if (r->prefix && r->len == 0)
            all = r;
        char pattern[TERN_TOPIC_MAX + 1];
        memcpy(pattern, r->pattern, r->len);
        pattern[r->len] = '\0';
        if ((err = tern_pubsub_topic_rule(srv, pattern, &to)) < 0) {
            fprintf(stderr, "tern serve: --topic %s%s: %s\n", pattern, r->prefix ? "*" : "",
                    tern_strerror(err));
            return SETUP_FAILED;
        }
    }
    /* The join/leave topics (APP_PRESENCE_EVENTS_MARK and a topic's name)
     * take rule "*"'s settings, throttled by --join-leave-throttle: a
     * crowd of joins then costs each watcher a write per pass, not one
     * per event (the library's last rule: APP_TOPIC_RULES_MAX). */
    if (set->join_leave_throttle_ms) {
        app_topic_rule none = {.prefix = true};
        tern_topic_options to = rule_options(all ? all : &none, set);
        to.throttle_ms = set->join_leave_throttle_ms;
        const char events[] = {APP_PRESENCE_EVENTS_MARK, '\0'};
        if ((err = tern_pubsub_topic_rule(srv, events, &to)) < 0) {
            fprintf(stderr, "tern serve: --join-leave-throttle: %s\n", tern_strerror(err));
            return SETUP_FAILED;
        }
    }
    /* The page at / unless --root serves files there (then at /market). */
    if (set->page && (err = app_page_routes(srv, set->root == NULL, set->node)) < 0) {
        fprintf(stderr, "tern serve: page: %s\n", tern_strerror(err));
        return SETUP_FAILED;
    }
    if ((err = app_feed_start(srv, set->feed ? set->feed_rate : 0, set->node)) < 0) {
        fprintf(stderr, "tern serve: feed: %s\n", tern_strerror(err));
        return SETUP_FAILED;
    }
    /* --bridge names Redis's engine or NATS's: another scheme is refused as
     * a bad URL, before the bridge would pick another engine for it */
    if (ctx->bridge && (err = strncmp(ctx->bridge, "redis://", 8) != 0 &&
                                      strncmp(ctx->bridge, "nats://", 7) != 0 &&
                                      strncmp(ctx->bridge, "tls://", 6) != 0
                                  ? -EINVAL
                                  : tern_pubsub_bridge(srv, ctx->bridge)) < 0) {
        char shown[512];
        app_serve_redis_redact(ctx->bridge, shown, sizeof(shown));
        fprintf(stderr, "tern serve: %s %s: %s\n", ctx->bridge_flag, shown,
                err == -EINVAL ? "not a redis://[[user]:password@]host[:port][/db] or "
                                 "nats://[credentials@]host[:port][,host[:port]...][?query] "
                                 "(tls://... over TLS) URL"
                               : tern_strerror(err));
        return SETUP_FAILED;
    }
    if (set->root && (err = tern_http_static(srv, "/", set->root)) < 0) {
        fprintf(stderr, "tern serve: --root %s: %s\n", set->root, tern_strerror(err));
        return SETUP_FAILED;
    }
    for (int i = 0; i < set->vhosts->n; i++) {
        /* NAME=ROOT: that host serves ROOT's files, and nothing else. */
        const char *vhost = set->vhosts->v[i];
        char name[256];
        const char *eq = strchr(vhost, '=');
        size_t nlen = eq ? (size_t)(eq - vhost) : 0;
        tern_server *h;
        err = -EINVAL;
        if (eq && nlen < sizeof(name)) {
            memcpy(name, vhost, nlen);
            name[nlen] = '\0';
            if ((err = tern_server_host(srv, name, &h)) == 0)
                err = tern_http_static(h, "/", eq + 1);
        }
        if (err < 0) {
            fprintf(stderr, "tern serve: --vhost %s: %s\n", vhost, tern_strerror(err));
            return SETUP_FAILED;
        }
    }
    if (ctx->sd.http >= 0 && (err = tern_listen_fd(srv, ctx->sd.http, NULL, &set->listen)) < 0) {
        fprintf(stderr, "tern serve: the http socket from systemd: %s\n", tern_strerror(err));
        return SETUP_FAILED;
    }
    if (ctx->sd.http < 0 && (err = tern_listen(srv, set->host, set->port, &set->listen)) < 0) {
        fprintf(stderr, "tern serve: listen on %s:%d: %s%s\n", set->host, set->port,
                tern_strerror(err), app_serve_in_use_hint(err));
        return SETUP_FAILED;
    }
    if (set->unix_path && (err = tern_listen_unix(srv, set->unix_path, &set->listen)) < 0) {
        fprintf(stderr, "tern serve: listen on %s: %s%s\n", set->unix_path, tern_strerror(err),
                app_serve_in_use_hint(err));
        return SETUP_FAILED;
    }
    if (ctx->sd.https >= 0 && ctx->tls &&
        (err = tern_listen_fd(srv, ctx->sd.https, ctx->tls, &set->listen)) < 0) {
        fprintf(stderr, "tern serve: the https socket from systemd: %s\n", tern_strerror(err));
        return SETUP_FAILED;
    }
    if (ctx->sd.https < 0 && ctx->tls &&
        (err = tern_listen_tls(srv, set->host, set->tls_port, ctx->tls, &set->listen)) < 0) {
        fprintf(stderr, "tern serve: listen on %s:%d: %s%s\n", set->host, set->tls_port,
                tern_strerror(err), app_serve_in_use_hint(err));
        return SETUP_FAILED;
    }
    if ((err = app_serve_stream_listen(srv, &set->listen)) < 0) {
        fprintf(stderr, "tern serve: the /http-stream relays' socket: %s\n", tern_strerror(err));
        return SETUP_FAILED;
    }
    /* SIGINT and SIGTERM are tern_run's; ours only marks the drain. Before
     * the admin server, which a failure here would have to free. */
    tern_loop *loop = tern_server_loop(srv);
    if ((err = tern_loop_on_signal(loop, SIGHUP, app_serve_on_sighup, ctx)) < 0 ||
        (err = tern_loop_on_signal(loop, SIGUSR1, on_sigusr1, ctx)) < 0 ||
        (err = tern_loop_on_signal(loop, SIGTERM, on_stop_signal, ctx)) < 0 ||
        (err = tern_loop_on_signal(loop, SIGINT, on_stop_signal, ctx)) < 0 ||
        (err = tern_loop_post(loop, print_listening, ctx)) < 0) {
        fprintf(stderr, "tern serve: signals: %s\n", tern_strerror(err));
        return SETUP_FAILED;
    }
    /* Presence across the nodes the bridge joins (presence_nodes.h):
     * last but the admin server, so that a failure before has nothing of
     * it to undo (it undoes its own). */
    if (ctx->bridge && (err = app_prnodes_start(srv, set->node)) < 0) {
        fprintf(stderr, "tern serve: presence across nodes: %s\n", tern_strerror(err));
        return SETUP_FAILED;
    }
    if (set->admin.host[0] && (err = app_serve_admin_setup(ctx, loop)) < 0)
        return err;
    return 0;
}

static void usage(const app_opt_set *s, FILE *f) {
    fprintf(f, "usage: tern serve [options]   (TLS: %s)\n\n", tern_tls_library());
    app_opt_help(s, f);
}

/* --api-key-file, --bridge or --redis (with --redis-password-file) and --access-log:
 * read or opened before the loops start. 0, or the exit status once said
 * why. */
static int open_files(serve_ctx *ctx) {
    const app_serve_settings *set = &ctx->set;
    if (set->api_key_file && (ctx->api_key = app_serve_read_api_key(set->api_key_file)) == NULL)
        return 1;   /* said why */
    /* --redis is --bridge's older name: either gives the URL, not both */
    if (set->bridge && set->redis) {
        fprintf(stderr, "tern serve: --redis is the older name of --bridge: give one of them\n");
        return 2;
    }
    const char *url = set->bridge ? set->bridge : set->redis;
    ctx->bridge_flag = set->bridge ? "--bridge" : "--redis";
    if (set->redis_password_file && url == NULL) {
        fprintf(stderr, "tern serve: --redis-password-file needs --bridge\n");
        return 2;
    }
    if (url && (ctx->bridge = app_serve_redis_url(url, set->redis_password_file)) == NULL)
        return 1;   /* said why */
    const char *access_path = set->access_log;
    if (access_path) {
        ctx->access_log = strcmp(access_path, "-") == 0 ? stdout : fopen(access_path, "a");
        if (ctx->access_log == NULL) {
            fprintf(stderr, "tern serve: --access-log %s: %s\n", access_path, strerror(errno));
            return 1;
        }
        setvbuf(ctx->access_log, NULL, _IOLBF, 0);   /* whole lines, as they happen */
        if (ctx->access_log != stdout)
            ctx->access_path = access_path;
    }
    return 0;
}

/* What the process needs of its system: signals, memory, descriptors. */
static void process_setup(serve_ctx *ctx) {
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
        ctx->fd_limit = rl.rlim_cur;
}

/* --tls-cert and --tls-key (each pair one certificate of ctx->tls) with
 * the --tls-* options. 0, or the exit status once said why. */
static int tls_load(serve_ctx *ctx) {
    /* A file, not the passphrase itself: a command line is visible to
     * every user of the machine (ps, /proc). */
    const tern_tls_options *tls_opt = &ctx->set.tls;
    const app_opt_val *certs = ctx->set.tls_certs, *keys = ctx->set.tls_keys;
    if (tls_opt->passphrase_file && certs->n == 0) {
        fprintf(stderr, "tern serve: --tls-key-passphrase-file needs --tls-cert and --tls-key\n");
        return 2;
    }
    bool tls_protocol_opts = tls_opt->min_version || tls_opt->ciphers || tls_opt->ciphersuites ||
                             tls_opt->client_ca_file || tls_opt->client_verify;
    if (tls_protocol_opts && certs->n == 0) {
        fprintf(stderr, "tern serve: the --tls-* options need --tls-cert and --tls-key\n");
        return 2;
    }
    if ((tls_opt->client_ca_file != NULL) != (tls_opt->client_verify != 0)) {
        fprintf(stderr, "tern serve: --tls-client-ca and --tls-client-verify go together\n");
        return 2;
    }
    if (certs->n != keys->n) {
        fprintf(stderr, "tern serve: each --tls-cert needs its --tls-key\n");
        return 2;
    }
    for (int i = 0; i < certs->n; i++) {
        int err = i == 0 ? tern_tls_new_opt(&ctx->tls, certs->v[0], keys->v[0], tls_opt)
                         : tern_tls_add_cert(ctx->tls, certs->v[i], keys->v[i]);
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
    return 0;
}

/* Runs the loops once set up: the sockets systemd passed checked, then
 * tern_run. Returns tern_run's result (SETUP_FAILED once said why). */
static int serve_run(serve_ctx *ctx) {
    if (app_serve_sd_sockets(&ctx->sd) < 0)
        return SETUP_FAILED;
    if (ctx->sd.https >= 0 && ctx->tls == NULL) {
        fprintf(stderr, "tern serve: systemd passed an https socket: it needs --tls-cert and "
                        "--tls-key\n");
        return SETUP_FAILED;
    }
    if (ctx->sd.admin >= 0 && ctx->set.admin.host[0] == '\0') {
        fprintf(stderr, "tern serve: systemd passed an admin socket, and --admin-listen is off\n");
        return SETUP_FAILED;
    }
    int rc = tern_run(ctx->set.threads, &ctx->set.run, serve_setup, ctx);
    app_serve_stream_unlisten();   /* after a failed setup too */
    return rc;
}

/* What serve_main made, freed (and the secrets wiped) once the loops have
 * ended. */
static void serve_free(serve_ctx *ctx) {
    /* The servers listened on duplicates: these are no longer needed. */
    const int inherited[] = {ctx->sd.http, ctx->sd.https, ctx->sd.admin};
    for (size_t i = 0; i < sizeof(inherited) / sizeof(inherited[0]); i++)
        if (inherited[i] >= 0)
            close(inherited[i]);
    tern_tls_free(ctx->tls);
    for (int i = 0; i < ctx->set.threads; i++)
        app_serve_later_free(&ctx->threads[i]);
    free(ctx->threads);
    app_serve_origins_free(atomic_load(&ctx->origins));
    app_serve_tokens_cleanup();
    app_serve_proxy_cleanup();
    if (ctx->api_key) {
        tern__crypto_wipe(ctx->api_key, strlen(ctx->api_key));
        free(ctx->api_key);
    }
    if (ctx->bridge) {
        tern__crypto_wipe(ctx->bridge, strlen(ctx->bridge));
        free(ctx->bridge);
    }
    if (ctx->access_log && ctx->access_log != stdout)
        fclose(ctx->access_log);
}

/* Runs the server the options s describe (the strings stay in s while it
 * runs; argc, argv: the command line they came from, for SIGHUP); the
 * command's exit status. */
static int serve_main(app_opt_set *s, int argc, char **argv) {
    serve_ctx ctx = {.opts = s, .argc = argc, .argv = argv,
                     .bcast_lock = PTHREAD_MUTEX_INITIALIZER,
                     .sd = {.http = -1, .https = -1, .admin = -1}};
    app_serve_settings *set = &ctx.set;
    atomic_init(&ctx.draining, false);
    /* Every option into its destination: the table's (serve_options.c). */
    app_opt_apply(s, set);
    if (set->admin.host[0] && !app_serve_admin_loopback(set->admin.host) &&
        app_serve_admin_exposed(s) < 0)
        return 2;
    if (set->allowed_origins->n + set->ws_origins->n > ORIGINS_MAX) {
        fprintf(stderr, "tern serve: bad value for --allowed-origin: more than %d origins "
                        "(with --ws-origin)\n", ORIGINS_MAX);
        return 2;
    }
    ctx.config_path = app_serve_config_path(s);
    app_serve_log_format(set->log_format);
    /* The groups of options SIGHUP applies again, applied a first time:
     * the same table, the same code (serve_reload.c). */
    atomic_init(&ctx.origins, NULL);
    int status = app_serve_live_start(&ctx);
    if (status == 0)
        status = open_files(&ctx);
    if (status == 0) {
        process_setup(&ctx);
        status = tls_load(&ctx);
    }
    if (status == 0 && app_serve_proxy_setup(&set->proxy) < 0)
        status = 1;   /* said why */
    if (status == 0 && (ctx.threads = calloc((size_t)set->threads, sizeof(*ctx.threads))) == NULL) {
        fprintf(stderr, "tern serve: out of memory\n");
        status = 1;
    }
    if (status != 0) {
        app_serve_origins_free(atomic_load(&ctx.origins));
        return status;
    }
    for (int i = 0; i < set->threads; i++) {
        ctx.threads[i].ctx = &ctx;
        ctx.threads[i].index = i;
        atomic_init(&ctx.threads[i].bcast_inflight, 0);
    }
    /* A drain closes with 1012 (service restart): the clients are invited
     * to come back, to this server restarted or to another. */
    set->run.server.shutdown_ws_code = TERN_WS_SERVICE_RESTART;
    set->run.teardown = serve_teardown;
    int err = serve_run(&ctx);
    serve_free(&ctx);
    if (err == SETUP_FAILED)
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
    app_opt_set s;
    if (app_opt_init(&s, "tern serve", app_serve_opts, SV_COUNT) < 0) {
        fprintf(stderr, "tern serve: out of memory\n");
        return 1;
    }
    int status = -1;
    s.env_prefix = "TERN_";
    const char *config = NULL;
    if (app_opt_parse_argv(&s, argc, argv) < 0 ||
        ((config = app_serve_config_path(&s)) && app_opt_parse_file(&s, config) < 0) ||
        app_opt_parse_env(&s) < 0) {
        fprintf(stderr, "tern serve: %s (tern serve --help lists the options)\n", s.err);
        status = 2;
    } else if (s.nargs > 0) {
        fprintf(stderr, "tern serve: unexpected argument '%s'\n", s.args[0]);
        status = 2;
    } else if (app_opt_uint(&s, SV_HELP)) {
        usage(&s, stdout);
        status = 0;
    } else if (app_opt_uint(&s, SV_VERSION)) {
        app_print_version(stdout);
        status = 0;
    } else if (app_opt_uint(&s, SV_PRINT_CONFIG)) {
        /* What the server would run with: the threads' default is the CPUs'
         * it may use. */
        int cpus = tern_cpu_count();
        char n[24];
        snprintf(n, sizeof(n), "%d", cpus > 1024 ? 1024 : cpus);
        if (app_opt_set_default(&s, SV_THREADS, n) < 0)
            fprintf(stderr, "tern serve: --threads: out of memory for its default\n");
        printf("# tern serve --print-config: flags over environment (TERN_NAME) over\n"
               "# --config file over defaults; this output is a --config file.\n");
        app_opt_print(&s, stdout);
        status = 0;
    }
    if (status < 0) {
        app_opt_env_warn(&s, env_not_options, stderr);
        status = serve_main(&s, argc, argv);
    }
    app_opt_free(&s);
    return status;
}
