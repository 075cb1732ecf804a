/* tern serve's options: the table (serve_options.c), each option's index
 * in it, and the settings its values go into (each option's `to`). */
#ifndef TERN_APP_SERVE_OPTIONS_H
#define TERN_APP_SERVE_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "app/app.h"
#include "app/options.h"
#include "app/serve_proxy.h"
#include "app/serve_tokens.h"
#include "tern/tern.h"

/* The order is the table's, and --help's. */
enum {
    SV_HOST, SV_PORT, SV_UNIX, SV_REUSE_PORT, SV_TLS_CERT, SV_TLS_KEY, SV_TLS_PASS_FILE, SV_TLS_PORT,
    SV_TLS_MIN, SV_TLS_CIPHERS, SV_TLS_SUITES, SV_TLS_CLIENT_CA, SV_TLS_CLIENT_VERIFY, SV_HTTP2,
    SV_BENCH_ROUTES, SV_ADMIN_LISTEN, SV_ADMIN_PUBLIC, SV_API_KEY_FILE, SV_ROOT, SV_MAX_HEAD, SV_MAX_BODY,
    SV_HEAD_TO, SV_BODY_TO, SV_IDLE_TO, SV_SEND_TO, SV_MAX_UNSENT, SV_MAX_CONNS, SV_MAX_CONNS_IP,
    SV_SNDBUF, SV_SHUT_TO, SV_SHUT_SPREAD, SV_DRAIN_DELAY, SV_WS_MAX, SV_WS_IDLE, SV_NO_PMD, SV_ALLOWED_ORIGIN, SV_WS_ORIGIN,
    SV_WS_SLOW, SV_WS_ASYNC, SV_WS_DEADLINE, SV_PS_BACKLOG, SV_PS_MAX_MESSAGE, SV_PS_RATE,
    SV_PS_POLICY, SV_TOPIC, SV_PS_TOPIC, SV_PS_HISTORY, SV_PS_HISTORY_AGE, SV_PS_HISTORY_BYTES,
    SV_PS_REPLAY_RATE, SV_PS_WRITE_DELAY, SV_PS_JL_THROTTLE,
    SV_TOKEN_HMAC, SV_TOKEN_PUBKEY, SV_TOKEN_AUD, SV_TOKEN_ISS, SV_TOKEN_LEEWAY,
    SV_PROXY_CONNECT, SV_PROXY_REFRESH, SV_PROXY_SUBSCRIBE, SV_PROXY_PUBLISH, SV_PROXY_TIMEOUT, SV_PROXY_MAX_INFLIGHT, SV_FEED, SV_FEED_RATE,
    SV_PAGE, SV_NODE_NAME,
    SV_BRIDGE, SV_REDIS, SV_REDIS_PASS_FILE, SV_LOG_LEVEL, SV_ACCESS_LOG, SV_LOG_FORMAT, SV_THREADS, SV_IO, SV_VHOST, SV_QUIET,
    SV_CONFIG, SV_PRINT_CONFIG, SV_VERSION, SV_HELP,
    SV_COUNT
};

/* --node-name's longest value. */
#define APP_NODE_NAME_MAX 64
/* The default --node-name, HOSTNAME:PID (characters --node-name refuses
 * as '-'), into out (cap bytes). */
void app_node_name_default(char *out, size_t cap);

/* --ws-async's modes. */
enum { APP_SERVE_ASYNC_NONE, APP_SERVE_ASYNC_TIMER, APP_SERVE_ASYNC_POST };

/* --admin-listen's address; host "" when off. */
typedef struct app_serve_addr {
    char host[256];
    int port;
} app_serve_addr;

/* What tern serve runs with: each field is the destination of one option
 * of the table (several for the library's option structs), written by
 * app_opt_apply from a parsed set, at start, and again for the options
 * SIGHUP applies. Invariants: every string and app_opt_val points into
 * the set it was applied from and is valid while that set is; run.teardown,
 * run.server.shutdown_ws_code and run.server.http2_max_streams are the only
 * fields no option writes. */
typedef struct app_serve_settings {
    /* the public listeners */
    const char *host, *unix_path;            /* --host, --unix */
    int port, tls_port;                      /* --port, --tls-port */
    tern_listen_options listen;              /* --reuse-port, --sndbuf */
    const app_opt_val *tls_certs, *tls_keys;
    tern_tls_options tls;                    /* --tls-key-passphrase-file, --tls-min-version... */
    /* what they serve */
    bool bench_routes, feed, page;
    uint32_t feed_rate;
    const char *root;
    const app_opt_val *vhosts;             /* NAME=ROOT each */
    char node[APP_NODE_NAME_MAX + 1];      /* --node-name, or HOSTNAME:PID */
    /* the admin listener */
    app_serve_addr admin;
    bool admin_public;
    const char *api_key_file;
    /* the loops and servers: run.loop (--max-unsent, --io), run.server
     * (limits and timeouts, the admin server's too), run.drain_delay_ms */
    tern_run_options run;
    int threads;                             /* --threads, or the CPUs this process may use */
    /* WebSockets */
    tern_ws_options ws;                      /* the routes' (--ws-max-message...) */
    const app_opt_val *allowed_origins, *ws_origins;
    int ws_async;                            /* APP_SERVE_ASYNC_* */
    uint32_t ws_deadline_ms;                 /* 0: none */
    /* pub/sub */
    tern_pubsub_options pubsub;              /* --pubsub-max-backlog, --pubsub-policy... */
    app_serve_pubsub_limits ps_limits;     /* --pubsub-max-message, --pubsub-rate */
    uint32_t join_leave_throttle_ms;       /* --join-leave-throttle */
    const app_opt_val *topics, *topic_policies;   /* --topic, --pubsub-topic-policy */
    app_serve_token_flags tokens;          /* --token-* */
    app_proxy_flags proxy;                 /* --proxy-* */
    /* --bridge, and --redis: its older name, kept working (one of them) */
    const char *bridge, *redis, *redis_password_file;
    /* logs */
    const char *log_level, *access_log;
    int log_format;                          /* TERN_SERVE_LOG_* */
    bool quiet;
} app_serve_settings;

extern const app_opt app_serve_opts[SV_COUNT];

/* The groups by which start-up and SIGHUP apply options (an option's
 * `live`; each group's start and apply are in serve_reload.c), in the
 * order both run them: the topic rules, the token verifier, the WebSocket
 * origins, the library's log level, the /pubsub rate. NONE: the value is
 * read where it goes, and a change needs a restart. */
enum {
    APP_SERVE_LIVE_NONE, APP_SERVE_LIVE_RULES, APP_SERVE_LIVE_TOKENS, APP_SERVE_LIVE_ORIGINS,
    APP_SERVE_LIVE_LOG, APP_SERVE_LIVE_RATE,
    APP_SERVE_LIVE_COUNT
};

/* --admin-listen's value: "off" (host[0] = '\0'), or HOST:PORT ([V6]:PORT
 * for an IPv6 address) into host (cap bytes) and port. */
bool app_serve_admin_listen_parse(const char *s, char *host, size_t cap, int *port);
/* Whether s[0..len) holds only a host name's bytes (letters, digits, '-'
 * and '.'): an --allowed-origin's host, and the part its wildcard stands
 * for in an Origin. */
bool app_serve_host_chars(const char *s, size_t len);
/* Whether an --admin-listen host is a loopback address (127.0.0.0/8, ::1,
 * localhost): reachable from this machine only. */
bool app_serve_admin_loopback(const char *host);
/* The configuration file: --config's, else $TERN_CONFIG's (the flag wins),
 * else NULL. */
const char *app_serve_config_path(const app_opt_set *s);

#endif
