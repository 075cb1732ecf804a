/* The tern command's subcommands. */
#ifndef TERN_APP_H
#define TERN_APP_H

int tern_app_serve(int argc, char **argv);
/* argv[0] is "load", argv[1] the mode (echo or pipeline). */
int tern_app_load(int argc, char **argv);
/* argv[0] is "connect": the interactive WebSocket client. */
int tern_app_connect(int argc, char **argv);

/* serve_pubsub.c: /pubsub, and with bench (--bench-routes) /fanout, on
 * srv (in tern serve's setup); wo: the WebSocket options of the other
 * routes. app_serve_publish answers POST /publish/:topic (the admin
 * listener's), publishing on srv. */
#include <stdbool.h>
#include <stdint.h>

#include "tern/tern.h"

struct app_topic_rules;

/* What one /pubsub client may make the server do. */
typedef struct app_serve_pubsub_limits {
    size_t max_message;   /* a bigger message closes with 1009 (--pubsub-max-message) */
    uint32_t rate;        /* operations a second, a burst of as many (--pubsub-rate) */
} app_serve_pubsub_limits;

/* The refusals of those limits, over every thread, since the start. */
typedef struct app_serve_pubsub_refusals {
    uint64_t rate_refused;   /* operations answered "rate limit" */
    uint64_t rate_closed;    /* connections closed with 1008 for going on */
    uint64_t too_big;        /* connections closed with 1009 for a message over max_message */
    uint64_t forbidden_subscribe, forbidden_publish;   /* answered "forbidden" */
} app_serve_pubsub_refusals;

/* rules: who may subscribe and publish where (read while serving: it
 * must outlive the servers). */
TERN_MUST_CHECK
int app_serve_pubsub_routes(tern_server *srv, const tern_ws_options *wo,
                              const tern_pubsub_options *po, const app_serve_pubsub_limits *lim,
                              const struct app_topic_rules *rules, bool bench,
                              int (*on_upgrade)(tern_http_req *, void **, void *), void *user);
/* serve_fanout.c: the /fanout routes of --bench-routes; o: /pubsub's
 * WebSocket options (for /fanout/sub), wo: the server's. */
TERN_MUST_CHECK
int app_serve_fanout_routes(tern_server *srv, const tern_ws_options *o, const tern_ws_options *wo,
                            int (*on_upgrade)(tern_http_req *, void **, void *), void *user);
void app_serve_publish(tern_http_req *req, tern_server *srv);
/* As the server (the admin API's batch): {"topic":T,"seq":N,"data":D}
 * published on srv, data a JSON string token (quotes included), with key
 * (NULL: none). The seq, or a negative errno. */
int64_t app_serve_publish_data(tern_server *srv, const char *topic, size_t tlen,
                               const char *key, const char *data, size_t dlen);
/* Whether a connection with auth's rights (NULL: anonymous) may subscribe
 * to (or publish on) topic[0..len): the topic rules, then the token. 0, or
 * -EACCES (counted as a refusal). /pubsub's and /sse's one decision. */
struct app_token_conn;
int app_serve_pubsub_may(const struct app_token_conn *auth, const char *topic, size_t len,
                         bool publish);
/* The topic rule that holds for topic[0..len) now (NULL: none): what
 * presence and join/leave /sse's subscribers are in, as /pubsub's. */
struct app_topic_rule;
const struct app_topic_rule *app_serve_pubsub_rule(const char *topic, size_t len);
/* serve_sse.c: GET /sse, /pubsub's topics as Server-Sent Events; hook is
 * the WebSocket routes' upgrade hook (its Origin check), given user. */
TERN_MUST_CHECK
int app_serve_sse_route(tern_server *srv, int (*hook)(tern_http_req *, void **, void *),
                        void *user);
/* SIGTERM: every loop of srv's run ends its /sse streams (a graceful
 * shutdown would wait for them), and streams opened meanwhile end once
 * subscribed. Any thread; once. */
void app_serve_sse_drain(tern_server *srv);
/* serve_stream.c: GET /http-stream and POST /http-stream/ops, /pubsub
 * over HTTP streaming, each stream a /pubsub session of the server's own
 * (the relay); hook as for /sse. */
TERN_MUST_CHECK
int app_serve_stream_routes(tern_server *srv, int (*hook)(tern_http_req *, void **, void *),
                            void *user);
/* The relays' listener on srv: a Unix socket in a new private directory
 * (under $TMPDIR, or /tmp); app_serve_stream_unlisten removes both. */
TERN_MUST_CHECK
int app_serve_stream_listen(tern_server *srv, const tern_listen_options *opt);
void app_serve_stream_unlisten(void);
/* SIGTERM: every loop of srv's run ends its streams. Any thread; once. */
void app_serve_stream_drain(tern_server *srv);
/* Whether req (a /pubsub upgrade) is a stream's relay: it carries the
 * process's relay key, a secret of the relays' (app_serve_stream_listen
 * draws it), so that no client can pass for one. */
bool app_serve_stream_relay(const tern_http_req *req);
void app_serve_pubsub_refusals_get(app_serve_pubsub_refusals *out);
/* --pubsub-rate changed while the loops run (SIGHUP), from any thread. */
void app_serve_pubsub_set_rate(uint32_t rate);
/* Other topic rules for the subscribes and publishes that follow, from
 * any thread (SIGHUP): only who may do what may differ, the pub/sub
 * settings are the library's since setup. Returns the ones replaced, which
 * a loop may still be reading in the callback it runs. */
struct app_topic_rules;
const struct app_topic_rules *app_serve_pubsub_swap_rules(const struct app_topic_rules *r);
/* The topic rules in force now (read within one callback, as above). */
const struct app_topic_rules *app_serve_pubsub_rules(void);

/* serve_metrics.c: GET /metrics (the admin listener's), the counters of
 * srv's threads in Prometheus' text format; draining: SIGTERM came. */
struct app_topic_rules;
/* rules: the topic rules given to the library in setup (one series each
 * in the per-rule pub/sub families). */
/* node: --node-name, in tern_build_info's labels. */
void app_serve_metrics(tern_http_req *req, tern_server *srv, bool draining,
                         const struct app_topic_rules *rules, const char *node);

/* serve_redis.c: --redis's URL with its password as "****" (for any line
 * that shows it); and the URL the bridge is given: url with the first line
 * of password_file (NULL: none) as its password. NULL once said why
 * (unreadable file, a URL with a password already); free() the result
 * after wiping it. */
void app_serve_redis_redact(const char *url, char *out, size_t cap);
/* The engine a bridge URL's scheme names: "redis" or "nats" (the names
 * tern_bridge_counters.engine gives). */
const char *app_serve_bridge_engine(const char *url);
char *app_serve_redis_url(const char *url, const char *password_file);

/* serve_log.c: --log-format. Every line gets an RFC 3339 timestamp and a
 * level; json makes each line one JSON object. app_serve_log writes one
 * line (level: TERN_LOG_*) to f; app_serve_log_access one access record.
 * The format is set once, before any thread runs. */
#include <stdio.h>
enum { TERN_SERVE_LOG_TEXT, TERN_SERVE_LOG_JSON };
void app_serve_log_format(int format);
bool app_serve_log_json(void);
void app_serve_log(FILE *f, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void app_serve_log_access(FILE *f, const tern_http_access *a);
/* SIGUSR1 (logrotate): f, opened on path in append mode, is pointed at
 * path afresh (the file logrotate moved away keeps what was written).
 * Returns 0, or a negative errno (then f writes where it did). */
TERN_MUST_CHECK
int app_serve_log_reopen(FILE *f, const char *path);
/* --log-level: the library's log lines (level: "error", "warn", "info" or
 * "debug") written by app_serve_log on stderr. */
void app_serve_log_library(const char *level);

/* main.c: tern --version's lines (the version, the TLS library, the I/O
 * back ends built in). */
void app_print_version(FILE *f);
/* serve_man.c: tern(1) in roff, its options from tern serve's table. */
void app_serve_man(FILE *f);

/* serve_systemd.c: sd_notify. ready: READY=1 with a status line;
 * stopping: STOPPING=1; watchdog: when the unit has WatchdogSec, a timer
 * on loop that sends WATCHDOG=1 at half its period (*out: the timer, or
 * NULL without a watchdog). 0, or a negative errno. */
void app_serve_sd_ready(const char *status);
void app_serve_sd_stopping(void);
/* SIGHUP: RELOADING=1 with MONOTONIC_USEC (as Type=notify-reload asks)
 * before the reload, READY=1 (the last status again) once it is done. */
void app_serve_sd_reloading(void);
void app_serve_sd_reloaded(void);
/* The listening sockets systemd passed (socket activation: LISTEN_FDS,
 * LISTEN_FDNAMES), by what they serve: FileDescriptorName=https the TLS
 * listener, admin the admin listener, any other name (or none) the plain
 * one. -1: none of that kind. */
typedef struct app_sd_sockets {
    int http, https, admin;
} app_sd_sockets;
/* Fills out and clears the environment (a child started later inherits
 * none of it). Returns 0, or -1 once said why on stderr (two sockets of
 * one kind, a socket that is not a listening stream one). */
TERN_MUST_CHECK
int app_serve_sd_sockets(app_sd_sockets *out);
TERN_MUST_CHECK
int app_serve_sd_watchdog(tern_loop *loop, tern_timer **out);

/* feed.c: the simulated market data ("market", rate updates a second; 0:
 * none) and live statistics ("stats", every second), from timers on srv's
 * loop; and the page that shows them at /market (and / when at_root). */
/* node: --node-name, put in every "stats" message and in the page's
 * <meta name="tern-node"> (so the page shows its own node's figures);
 * kept by pointer, valid while the servers run. */
TERN_MUST_CHECK
int app_feed_start(tern_server *srv, unsigned rate, const char *node);
TERN_MUST_CHECK
int app_page_routes(tern_server *srv, bool at_root, const char *node);
/* The page, src/app/market.html, made into an array at build time. */
extern const unsigned char app_market_html[];
extern const size_t app_market_html_len;
extern const unsigned char app_client_js[];   /* clients/js/tern-client.js */
extern const size_t app_client_js_len;

#endif
