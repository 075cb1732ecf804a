/* tern serve's options: the one table its command line, --help, its
 * configuration file (--config), the environment (TERN_NAME) and
 * --print-config all come from (options.h). */
#include <arpa/inet.h>
#include <ctype.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app/app.h"
#include "app/serve_options.h"
#include "app/topic_rules.h"
#include "tern/tern.h"

#define MS_MAX 86400000ull   /* a day: the longest timeout */

bool app_serve_host_chars(const char *s, size_t len) {
    for (size_t i = 0; i < len; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '-' && s[i] != '.')
            return false;
    return true;
}

/* An --allowed-origin value: scheme://host[:port] (http or https), where
 * host may start with "*." (any subdomain); no path, no other '*'. */
static const char *origin_pattern_ok(const char *p) {
    static const char why[] = "expected http[s]://HOST[:PORT], HOST may start with *.";
    const char *rest = strncmp(p, "https://", 8) == 0 ? p + 8
                       : strncmp(p, "http://", 7) == 0 ? p + 7 : NULL;
    if (rest == NULL)
        return why;
    if (strncmp(rest, "*.", 2) == 0)
        rest += 2;
    size_t hlen = strcspn(rest, ":");
    if (hlen == 0 || !app_serve_host_chars(rest, hlen))
        return why;
    if (rest[hlen] == ':') {
        const char *port = rest + hlen + 1;
        if (*port == '\0' || strspn(port, "0123456789") != strlen(port) || strlen(port) > 5)
            return why;
    }
    return NULL;
}

/* --pubsub-topic-policy PREFIX=P: P one of --pubsub-policy's values. */
static const char *topic_policy_ok(const char *s) {
    const char *eq = strrchr(s, '=');
    int policy;
    uint16_t code;
    if (eq == NULL || eq - s > TERN_TOPIC_MAX || !app_policy_parse(eq + 1, &policy, &code))
        return "expected PREFIX=P, P one of drop, close, close-1013, conflate";
    return NULL;
}

/* --topic 'PATTERN [KEY=VALUE]...': what app_rules_add says of it alone. */
static const char *topic_rule_ok(const char *s) {
    static app_topic_rules scratch;   /* the option parser runs on one thread */
    const char *why = NULL;
    memset(&scratch, 0, sizeof(scratch));
    return app_rules_add(&scratch, s, &why) == 0 ? NULL : why;
}

static const char *vhost_ok(const char *s) {
    const char *eq = strchr(s, '=');
    return eq != NULL && eq != s && eq - s < 256 ? NULL : "expected NAME=ROOT";
}

bool app_serve_admin_listen_parse(const char *s, char *host, size_t cap, int *port) {
    if (strcmp(s, "off") == 0) {
        host[0] = '\0';
        return true;
    }
    const char *colon = strrchr(s, ':');
    if (colon == NULL || colon == s || colon[1] == '\0' ||
        strspn(colon + 1, "0123456789") != strlen(colon + 1) || strlen(colon + 1) > 5 ||
        atoi(colon + 1) > 65535)
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
    if (hlen >= cap)
        return false;
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    *port = atoi(colon + 1);
    return true;
}

bool app_serve_admin_loopback(const char *host) {
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, host, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, host, &a6) == 1)
        return IN6_IS_ADDR_LOOPBACK(&a6) || (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
    return strcmp(host, "localhost") == 0;
}

const char *app_serve_config_path(const app_opt_set *s) {
    /* --config is CLI_ONLY (a file cannot name another), so the table's
     * environment pass skips it: TERN_CONFIG is read here. */
    if (app_opt_given(s, SV_CONFIG))
        return app_opt_str(s, SV_CONFIG);
    const char *env = getenv("TERN_CONFIG");
    return env && *env ? env : NULL;
}

/* --node-name: it goes into JSON, HTML and Prometheus labels unescaped,
 * so only characters none of them quotes. */
static const char *node_name_ok(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > APP_NODE_NAME_MAX)
        return "expected 1 to 64 characters.";
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("._:-", s[i]))
            return "expected letters, digits and . _ : - only.";
    return NULL;
}

/* Hostnames hold only letters, digits, '-' and '.'; anything else (a
 * misconfigured one) becomes '-', so the default passes --node-name's
 * check. */
void app_node_name_default(char *out, size_t cap) {
    char host[256] = "";
    if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0')
        strcpy(host, "tern");
    snprintf(out, cap, "%.40s:%ld", host, (long)getpid());
    for (char *p = out; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr("._:-", *p))
            *p = '-';
}

static const char *admin_listen_ok(const char *s) {
    char host[256];
    int port;
    return app_serve_admin_listen_parse(s, host, sizeof(host), &port)
               ? NULL
               : "expected HOST:PORT, [IPV6]:PORT or off";
}

/* The puts of the fields that are not a plain copy (options.h has those). */

/* --max-connections, --max-connections-per-ip: 0 is no limit. */
static void put_limit(const app_opt_set *s, int i, void *field) {
    unsigned long long v = app_opt_uint(s, i);
    *(uint32_t *)field = v ? (uint32_t)v : TERN_UNLIMITED;
}

/* --no-compression: permessage-deflate offered unless given. */
static void put_not(const app_opt_set *s, int i, void *field) {
    *(bool *)field = !app_opt_uint(s, i);
}

/* --pubsub-history-age: seconds, kept as milliseconds. */
static void put_ms_of_seconds(const app_opt_set *s, int i, void *field) {
    *(uint32_t *)field = (uint32_t)app_opt_uint(s, i) * 1000;
}

/* --shutdown-spread; unset, the WebSockets' closes over the first 4/5 of
 * --shutdown-timeout, so that their close handshakes end before it does. */
static void put_ws_spread(const app_opt_set *s, int i, void *field) {
    uint32_t t = (uint32_t)app_opt_uint(s, SV_SHUT_TO);
    *(uint32_t *)field = app_opt_given(s, i) ? (uint32_t)app_opt_uint(s, i)
                                               : (t ? t : 10000) / 5 * 4;
}

/* --tls-min-version: 12 or 13; unset, 0 (the library's, 1.2). */
static void put_tls_version(const app_opt_set *s, int i, void *field) {
    *(int *)field = !app_opt_given(s, i) ? 0 : strcmp(app_opt_str(s, i), "1.3") == 0 ? 13 : 12;
}

/* --http2: the TERN_HTTP2_* bits of tern_server_options (the default,
 * "tls": h2 offered by ALPN on the TLS port). */
static void put_http2(const app_opt_set *s, int i, void *field) {
    const char *v = app_opt_str(s, i);
    unsigned bits = TERN_HTTP2_TLS;
    if (v && strcmp(v, "off") == 0)
        bits = 0;
    else if (v && strcmp(v, "h2c") == 0)
        bits = TERN_HTTP2_TLS | TERN_HTTP2_CLEARTEXT;
    *(unsigned *)field = bits;
}

/* --tls-client-verify; unset, no certificate asked. */
static void put_client_verify(const app_opt_set *s, int i, void *field) {
    *(int *)field = !app_opt_given(s, i) ? TERN_TLS_VERIFY_NONE
                    : strcmp(app_opt_str(s, i), "require") == 0 ? TERN_TLS_VERIFY_REQUIRE
                                                                  : TERN_TLS_VERIFY_OPTIONAL;
}

/* --ws-slow-policy. An echo answers what it reads: when the client does
 * not read the answers, stop reading its requests (TCP pushes back on it):
 * pause, the default. */
static void put_slow_policy(const app_opt_set *s, int i, void *field) {
    const char *v = app_opt_str(s, i);
    *(int *)field = !strcmp(v, "close") ? TERN_WS_SLOW_CLOSE
                    : !strcmp(v, "drop") ? TERN_WS_SLOW_DROP : TERN_WS_SLOW_PAUSE;
}

static void put_ws_async(const app_opt_set *s, int i, void *field) {
    *(int *)field = !app_opt_given(s, i) ? APP_SERVE_ASYNC_NONE
                    : strcmp(app_opt_str(s, i), "post") == 0 ? APP_SERVE_ASYNC_POST
                                                                 : APP_SERVE_ASYNC_TIMER;
}

/* --pubsub-policy: the policy and, for the closing ones, the code. */
static void put_policy(const app_opt_set *s, int i, void *field) {
    tern_pubsub_options *po = field;
    app_policy_parse(app_opt_str(s, i), &po->policy, &po->close_code);
}

static void put_admin(const app_opt_set *s, int i, void *field) {
    app_serve_addr *a = field;
    app_serve_admin_listen_parse(app_opt_str(s, i), a->host, sizeof(a->host), &a->port);
}

static void put_node(const app_opt_set *s, int i, void *field) {
    if (app_opt_given(s, i))
        snprintf(field, APP_NODE_NAME_MAX + 1, "%s", app_opt_str(s, i));
    else
        app_node_name_default(field, APP_NODE_NAME_MAX + 1);
}

static void put_log_format(const app_opt_set *s, int i, void *field) {
    *(int *)field = strcmp(app_opt_str(s, i), "json") == 0 ? TERN_SERVE_LOG_JSON
                                                             : TERN_SERVE_LOG_TEXT;
}

/* --threads; unset, one loop per CPU this process may use (taskset, a
 * container's cpuset or quota), not per CPU of the machine. */
static void put_threads(const app_opt_set *s, int i, void *field) {
    int cpus = tern_cpu_count();
    *(int *)field = app_opt_given(s, i) ? (int)app_opt_uint(s, i) : cpus > 1024 ? 1024 : cpus;
}

/* --io; unset, the loop's default (epoll, or $TERN_IO's). */
static void put_io(const app_opt_set *s, int i, void *field) {
    *(tern_io_backend *)field = !app_opt_given(s, i) ? TERN_IO_DEFAULT
                                : strcmp(app_opt_str(s, i), "uring") == 0 ? TERN_IO_URING
                                : strcmp(app_opt_str(s, i), "poll") == 0  ? TERN_IO_POLL
                                                                            : TERN_IO_EPOLL;
}

/* An option's destination: field f of app_serve_settings, of type T,
 * written by put. The _Generic is a check at compile time: a field of
 * another type than T is an error (a put writing a size_t into a uint32_t
 * would overwrite its neighbour), and it adds 0 to the offset. */
#define DEST(f, T, put_fn)                                                                         \
    .to = offsetof(app_serve_settings, f) +                                                      \
          0 * sizeof(char[_Generic(((app_serve_settings *)0)->f, T: 1)]),                       \
    .put = put_fn
#define STR(f) DEST(f, const char *, app_opt_put_str)
#define U32(f) DEST(f, uint32_t, app_opt_put_u32)
#define SIZE(f) DEST(f, size_t, app_opt_put_size)
#define U64(f) DEST(f, uint64_t, app_opt_put_u64)
#define INT(f) DEST(f, int, app_opt_put_int)
#define BOOL(f) DEST(f, bool, app_opt_put_bool)
#define VALS(f) DEST(f, const app_opt_val *, app_opt_put_vals)

#define U APP_OPT_UINT
#define S APP_OPT_STRING
#define C APP_OPT_CHOICE
#define F APP_OPT_FLAG
#define REPEAT APP_OPT_REPEAT
/* SIGHUP applies a changed value live, by group G's apply (serve_reload.c). */
#define LIVE(G) .live = APP_SERVE_LIVE_##G
#define SECRET APP_OPT_SECRET

const app_opt app_serve_opts[SV_COUNT] = {
    [SV_HOST] = {"host", 0, S, "H", "127.0.0.1", .help = "address to listen on (0.0.0.0 or :: for all)",
        STR(host)},
    [SV_PORT] = {"port", 0, U, "P", "8080", 0, 65535, .help = "TCP port (0 picks a free one)",
        INT(port)},
    [SV_UNIX] = {"unix", 0, S, "PATH", .help = "also listen on a Unix socket",
        STR(unix_path)},
    [SV_REUSE_PORT] = {"reuse-port", 0, F,
                       .help = "share the ports (--port, --tls-port, --admin-listen) with\n"
                               "another process started with it (SO_REUSEPORT; --unix's\n"
                               "path is taken over): a zero-downtime restart starts the\n"
                               "new one, then SIGTERMs the old. Off: a port or path\n"
                               "another process listens on is refused (\"Address already\n"
                               "in use\")",
        INT(listen.reuseport)},
    [SV_TLS_CERT] = {"tls-cert", 0, S, "FILE", .flags = REPEAT, .max_count = 8,
                     .help = "PEM certificate chain: serve HTTPS/WSS too (one --tls-key\n"
                             "each; more than one are chosen by SNI; SIGHUP reloads\n"
                             "their files)",
        VALS(tls_certs)},
    [SV_TLS_KEY] = {"tls-key", 0, S, "FILE", .flags = REPEAT | SECRET, .max_count = 8,
                    .help = "PEM private key of the --tls-cert before it",
        VALS(tls_keys)},
    [SV_TLS_PASS_FILE] = {"tls-key-passphrase-file", 0, S, "FILE", .flags = SECRET,
                          .help = "the passphrase of encrypted --tls-key files (its first\n"
                                  "line; read again on SIGHUP). Never asked on a terminal",
        STR(tls.passphrase_file)},
    [SV_TLS_PORT] = {"tls-port", 0, U, "P", "8443", 0, 65535, .help = "HTTPS port (0 picks a free one)",
        INT(tls_port)},
    [SV_TLS_MIN] = {"tls-min-version", 0, C, "V", .choices = "1.2|1.3",
                    .help = "the oldest TLS version served (1.2 when unset)",
        DEST(tls.min_version, int, put_tls_version)},
    [SV_TLS_CIPHERS] = {"tls-ciphers", 0, S, "LIST",
                        .help = "TLS 1.2 ciphers, OpenSSL's syntax (unset: OpenSSL's)",
        STR(tls.ciphers)},
    [SV_TLS_SUITES] = {"tls-ciphersuites", 0, S, "LIST",
                       .help = "TLS 1.3 ciphersuites, OpenSSL's syntax, the server's order\n"
                               "chosen (unset: AES-128-GCM, AES-256-GCM, ChaCha20)",
        STR(tls.ciphersuites)},
    [SV_TLS_CLIENT_CA] = {"tls-client-ca", 0, S, "FILE",
                          .help = "PEM CAs that client certificates are verified against",
        STR(tls.client_ca_file)},
    [SV_TLS_CLIENT_VERIFY] = {"tls-client-verify", 0, C, "M", .choices = "optional|require",
                              .help = "ask clients for a certificate (unset: none asked;\n"
                                      "needs --tls-client-ca)",
        DEST(tls.client_verify, int, put_client_verify)},
    [SV_HTTP2] = {"http2", 0, C, "M", "tls", .choices = "tls|h2c|off",
                  .help = "HTTP/2: tls offers it by ALPN on the TLS port; h2c also\n"
                          "serves it with prior knowledge on the plain port; off: HTTP/1.1\n"
                          "alone. Over HTTP/2 /pubsub and /ws are WebSockets too, a\n"
                          "stream each (RFC 8441: what browsers use over h2)",
        DEST(run.server.http2, unsigned, put_http2)},
    [SV_BENCH_ROUTES] = {"bench-routes", 0, F,
                         .help = "also serve the routes that make the server work on request,\n"
                                 "for benchmarks and tests: /echo, /stream, /upload, /delay,\n"
                                 "/item/:id, /ws, /ws/broadcast, /ws/room/:room, /fanout,\n"
                                 "/fanout/sub, /fanout/pub, /fanout/pub-keyed (off: 404;\n"
                                 "/pubsub and /ping are always served, the page's routes\n"
                                 "unless --page off)",
        BOOL(bench_routes)},
    [SV_ADMIN_LISTEN] = {"admin-listen", 0, S, "HOST:PORT", "127.0.0.1:9090", .check = admin_listen_ok,
                         .help = "the admin listener: POST /publish/:topic, GET /stats and\n"
                                 "GET /metrics (Prometheus), GET /healthz and GET /readyz\n"
                                 "(503 while draining or while --bridge is down), never on\n"
                                 "the public port ([::1]:P for IPv6; off for none); an\n"
                                 "address other than loopback needs --admin-listen-public",
        DEST(admin, app_serve_addr, put_admin)},
    [SV_ADMIN_PUBLIC] = {"admin-listen-public", 0, F,
                         .help = "let --admin-listen take an address other than loopback:\n"
                                 "/stats, /metrics, /healthz and /readyz then answer anyone\n"
                                 "who reaches it, with no key (off: refused at start)",
        BOOL(admin_public)},
    [SV_API_KEY_FILE] = {"api-key-file", 0, S, "FILE", .flags = SECRET,
                         .help = "the key POST /publish and the server API need\n"
                                 "(Authorization: Bearer KEY): the file's first line\n"
                                 "(unset: they answer 403)",
        STR(api_key_file)},
    [SV_ROOT] = {"root", 0, S, "DIR", .help = "serve static files from DIR",
        STR(root)},
    [SV_MAX_HEAD] = {"max-head", 0, U, "BYTES", "16384", 1, 1u << 24, .help = "request line + headers",
        SIZE(run.server.max_head)},
    [SV_MAX_BODY] = {"max-body", 0, U, "BYTES", "16777216", 1, 1ull << 40, .help = "request body",
        SIZE(run.server.max_body)},
    [SV_HEAD_TO] = {"head-timeout", 0, U, "MS", "10000", 1, MS_MAX, .help = "a request's head must arrive within this",
        U32(run.server.head_timeout_ms)},
    [SV_BODY_TO] = {"body-timeout", 0, U, "MS", "10000", 1, MS_MAX, .help = "a body brings 4 KiB (or its end) within this",
        U32(run.server.body_timeout_ms)},
    [SV_IDLE_TO] = {"idle-timeout", 0, U, "MS", "60000", 1, MS_MAX, .help = "keep-alive",
        U32(run.server.idle_timeout_ms)},
    [SV_SEND_TO] = {"send-timeout", 0, U, "MS", "60000", 1, MS_MAX,
                    .help = "close a client that takes no bytes for this long",
        U32(run.server.send_timeout_ms)},
    [SV_MAX_UNSENT] = {"max-unsent", 0, U, "BYTES", "268435456", 1, 1ull << 40,
                       .help = "bound on all connections' unsent output",
        SIZE(run.loop.max_unsent)},
    [SV_MAX_CONNS] = {"max-connections", 0, U, "N", "10000", 0, TERN_UNLIMITED - 1,
                      .help = "open connections, all threads together; more are answered\n"
                              "503 (Retry-After: 1) and closed (0: no limit)",
        DEST(run.server.max_connections, uint32_t, put_limit)},
    [SV_MAX_CONNS_IP] = {"max-connections-per-ip", 0, U, "N", "50", 0, TERN_UNLIMITED - 1,
                         .help = "the same from one IPv4 address or IPv6 /64 (0: no limit)",
        DEST(run.server.max_connections_per_ip, uint32_t, put_limit)},
    [SV_SNDBUF] = {"sndbuf", 0, U, "BYTES", NULL, 4096, 1u << 30,
                   .help = "the kernel's send buffer of each connection (SO_SNDBUF;\n"
                           "unset: autotuned, up to megabytes a client has not read)",
        INT(listen.sndbuf)},
    [SV_SHUT_TO] = {"shutdown-timeout", 0, U, "MS", "10000", 1, MS_MAX, .help = "graceful shutdown limit",
        U32(run.server.shutdown_timeout_ms)},
    [SV_SHUT_SPREAD] = {"shutdown-spread", 0, U, "MS", NULL, 0, MS_MAX,
                        .help = "the shutdown closes each WebSocket (1012) at a random moment\n"
                                "within MS, so their clients do not all reconnect at once\n"
                                "(unset: 4/5 of --shutdown-timeout; 0: all at once)",
        DEST(run.server.shutdown_ws_spread_ms, uint32_t, put_ws_spread)},
    [SV_DRAIN_DELAY] = {"drain-delay", 0, U, "MS", "0", 0, MS_MAX,
                        .help = "on SIGTERM, /readyz answers 503 at once but the listeners\n"
                                "keep accepting and serving for MS before the drain begins,\n"
                                "so that a load balancer takes the node out first (0: no\n"
                                "wait; a second SIGTERM ends the wait)",
        U32(run.drain_delay_ms)},
    [SV_WS_MAX] = {"ws-max-message", 0, U, "BYTES", "16777216", 1, 1ull << 40,
                   .help = "WebSocket message limit",
        SIZE(ws.max_message)},
    [SV_WS_IDLE] = {"ws-idle-timeout", 0, U, "MS", "30000", 1, MS_MAX,
                    .help = "ping an idle WebSocket after this long",
        U32(ws.idle_timeout_ms)},
    [SV_NO_PMD] = {"no-compression", 0, F, .help = "don't offer permessage-deflate on /ws",
        DEST(ws.compression, bool, put_not)},
    [SV_ALLOWED_ORIGIN] = {"allowed-origin", 0, S, "O", .check = origin_pattern_ok,
                           .flags = REPEAT, LIVE(ORIGINS), .max_count = 32,
                           .help = "a WebSocket upgrade with an Origin header must match one:\n"
                                   "https://app.example.com exactly, or https://*.example.com\n"
                                   "for its subdomains; others get 403, one without Origin\n"
                                   "(not a browser) is let in (unset: any origin)",
        VALS(allowed_origins)},
    [SV_WS_ORIGIN] = {"ws-origin", 0, S, "ORIGIN", .flags = REPEAT, LIVE(ORIGINS), .max_count = 32,
                      .help = "the same as --allowed-origin (exact)",
        VALS(ws_origins)},
    [SV_WS_SLOW] = {"ws-slow-policy", 0, C, "P", "pause", .choices = "pause|close|drop",
                    .help = "/ws client not reading: pause, close (1008) or drop",
        DEST(ws.slow_policy, int, put_slow_policy)},
    [SV_WS_ASYNC] = {"ws-async", 0, C, "timer|post", .choices = "timer|post", .flags = APP_OPT_OPTARG,
                     .help = "/ws echoes each message later, from the loop, not inside\n"
                             "on_message (a handler that waits on I/O): from a 0 ms timer\n"
                             "per batch (timer, when bare), or from a tern_loop_post per batch",
        DEST(ws_async, int, put_ws_async)},
    [SV_WS_DEADLINE] = {"ws-deadline-ms", 0, U, "N", NULL, 1, MS_MAX,
                        .help = "/ws connections get a deadline of N ms, moved by every\n"
                                "message: N ms without one closes it with 1008 \"deadline\"",
        U32(ws_deadline_ms)},
    [SV_PS_BACKLOG] = {"pubsub-max-backlog", 0, U, "BYTES", "1048576", 1, 1ull << 32,
                       .help = "a /pubsub subscriber with more waiting gets the policy",
        SIZE(pubsub.max_backlog)},
    [SV_PS_MAX_MESSAGE] = {"pubsub-max-message", 0, U, "BYTES", "65536", 1, 1ull << 40,
                           .help = "a bigger /pubsub message closes its connection with 1009",
        SIZE(ps_limits.max_message)},
    [SV_PS_RATE] = {"pubsub-rate", 0, U, "N", "100", 0, 1000000, LIVE(RATE),
                    .help = "/pubsub messages a second per connection, a burst of N\n"
                            "(0: no limit); one over it is answered {\"error\":\"rate limit\"},\n"
                            "and more than N refused without a pause close it with 1008",
        U32(ps_limits.rate)},
    [SV_PS_POLICY] = {"pubsub-policy", 0, C, "P", "drop", .choices = "drop|close|close-1013|conflate",
                      .help = "drop (its messages are dropped and counted), close (1008),\n"
                              "close-1013 (try again later) or conflate (keep the newest\n"
                              "message per key while it is behind)",
        DEST(pubsub, tern_pubsub_options, put_policy)},
    [SV_TOPIC] = {"topic", 0, S, "'PATTERN [KEY=VALUE]...'", .check = topic_rule_ok,
                  .flags = REPEAT, LIVE(RULES), .max_count = APP_TOPIC_RULES_MAX,
                  .help = "a topic rule: PATTERN is a topic, or a prefix ending in *\n"
                          "(\"orders.*\"; \"*\": all); a topic takes its exact rule, else\n"
                          "its longest prefix's. KEYs: subscribe= and publish= (token:\n"
                          "a token's rights must cover the topic, the default; anyone;\n"
                          "none; user: a topic ending in #USER[,USER...] to those\n"
                          "users' tokens (their sub) alone), policy=, history=N,\n"
                          "history-age=SECONDS, max-backlog=BYTES (the --pubsub-*\n"
                          "defaults otherwise), throttle=MS (a pass over the topic's\n"
                          "subscribers at most every MS: at once when quiet, a burst's\n"
                          "messages in one write each), presence=on (who is\n"
                          "subscribed may be asked; presence=stats: how many only)\n"
                          "and join-leave=on (joins and leaves pushed; both off by\n"
                          "default). At most 63 rules.\n"
                          "Closed by default: without a rule only tokens open a topic.\n"
                          "\"market\" and \"stats\" (the feed's) are subscribe=anyone\n"
                          "publish=none, and with --page on \"market\" presence=stats\n"
                          "(the page shows how many watch). SIGHUP applies changes\n"
                          "of subscribe=, publish=, presence= and join-leave= to the\n"
                          "operations that follow; the other keys need a restart",
        VALS(topics)},
    [SV_PS_TOPIC] = {"pubsub-topic-policy", 0, S, "PREFIX=P", .check = topic_policy_ok,
                     .flags = REPEAT, .max_count = APP_TOPIC_RULES_MAX,
                     .help = "the same as --topic 'PREFIX* policy=P' (before the --topic\n"
                             "rules: a --topic of the same pattern wins)",
        VALS(topic_policies)},
    [SV_PS_HISTORY] = {"pubsub-history", 0, U, "N", "0", 0, TERN_HISTORY_MAX,
                       .help = "keep each topic's last N messages for subscribers that\n"
                               "resume (0: none; topic \"market\" of the feed keeps 4096 for\n"
                               "a minute)",
        U32(pubsub.history)},
    [SV_PS_HISTORY_AGE] = {"pubsub-history-age", 0, U, "SECONDS", NULL, 1, 86400,
                           .help = "and none older than this (unset: no limit)",
        DEST(pubsub.history_ms, uint32_t, put_ms_of_seconds)},
    [SV_PS_HISTORY_BYTES] = {"pubsub-history-bytes", 0, U, "BYTES", "67108864", 0, 1ull << 40,
                             .help = "all topics' histories together keep at most this (0: no\n"
                                     "limit); over it the oldest messages of the topics over\n"
                                     "their share go",
        SIZE(pubsub.history_bytes)},
    [SV_PS_REPLAY_RATE] = {"pubsub-replay-rate", 0, U, "BYTES", "0", 0, 1ull << 40,
                           .help = "bytes a second each thread sends to subscribers that\n"
                                   "resume until they catch up, together (0: no limit);\n"
                                   "spreads a reconnect storm's catch-up; above the live\n"
                                   "rate, or they fall behind",
        U64(pubsub.replay_rate)},
    [SV_PS_WRITE_DELAY] = {"pubsub-write-delay", 0, U, "MS", "0", 0, 1000,
                           .help = "a topic's messages wait up to MS before going out, so\n"
                                   "each subscriber gets those of MS in one write (fewer\n"
                                   "sends at low rates, MS more latency; 0: at once)",
        U32(pubsub.write_delay_ms)},
    [SV_PS_JL_THROTTLE] = {"join-leave-throttle", 0, U, "MS", "5", 0, 1000,
                           .help = "join and leave events go to a topic's watchers in a\n"
                                   "pass at most every MS, each watcher getting a pass's\n"
                                   "events in one write: at once when joins are rare, far\n"
                                   "fewer writes when they crowd (0: every event alone)",
        U32(join_leave_throttle_ms)},
    [SV_TOKEN_HMAC] = {"token-hmac-secret-file", 0, S, "F", .flags = SECRET, LIVE(TOKENS),
                       .help = "/pubsub takes JWTs signed HS256 with F's bytes (one\n"
                               "trailing newline stripped), as ?token= or Authorization:\n"
                               "Bearer; closed with 4001 at exp",
        STR(tokens.hmac_secret_file)},
    [SV_TOKEN_PUBKEY] = {"token-public-key-file", 0, S, "F", LIVE(TOKENS),
                         .help = "and/or RS256 or ES256 ones (F: a PEM public key); SIGHUP\n"
                                 "reads both files again (tokens turned on or off need a\n"
                                 "restart)",
        STR(tokens.public_key_file)},
    [SV_TOKEN_AUD] = {"token-audience", 0, S, "A", LIVE(TOKENS), .help = "tokens must name A in aud",
        STR(tokens.audience)},
    [SV_TOKEN_ISS] = {"token-issuer", 0, S, "I", LIVE(TOKENS), .help = "tokens must have iss I",
        STR(tokens.issuer)},
    [SV_TOKEN_LEEWAY] = {"token-leeway", 0, U, "SECONDS", "30", 0, 3600, LIVE(TOKENS),
                         .help = "clock difference allowed with the tokens' issuer: a token\n"
                                 "is taken until SECONDS after its exp (and closed with 4001\n"
                                 "then), and from SECONDS before its nbf",
        U32(tokens.leeway)},
    [SV_PROXY_CONNECT] = {"proxy-connect", 0, S, "URL",
                          .help = "each /pubsub connection and /sse stream, as it opens, is\n"
                                  "POSTed to the backend at URL ({\"user\":U,...}; it reads\n"
                                  "nothing, or gets no head, until the answer):\n"
                                  "{\"result\":{}} lets it in, and with \"user\", \"info\" and\n"
                                  "\"tern\" gives it a user, info (presence, user topics, the\n"
                                  "server API) and rights (a token's \"tern\" claim); a\n"
                                  "refusal closes it with 4403 (/sse: 403), no usable answer\n"
                                  "with 1013 (/sse: 503) (unset: no connect proxy)",
        STR(proxy.url[APP_PROXY_CONNECT])},
    [SV_PROXY_REFRESH] = {"proxy-refresh", 0, S, "URL",
                          .help = "a connection whose connect answer said \"expire_at\":S\n"
                                  "(Unix seconds) is POSTed to URL at S: \"expire_at\" again\n"
                                  "extends it, \"expired\":true or a refusal closes it with\n"
                                  "4001 (/sse: event error \"token expired\"), no usable\n"
                                  "answer asks again 5 s later (unset: closed so at S)",
        STR(proxy.url[APP_PROXY_REFRESH])},
    [SV_PROXY_SUBSCRIBE] = {"proxy-subscribe", 0, S, "URL",
                            .help = "the backend at URL decides each /pubsub subscribe and\n"
                                    "each topic of an /sse stream instead of the topic rules:\n"
                                    "POSTed {\"user\",\"channel\",...}, it answers\n"
                                    "{\"result\":{}} (allowed), {\"error\":{\"code\":N,\n"
                                    "\"message\":M}} (refused; /sse: 403) or\n"
                                    "{\"disconnect\":{\"code\":N,\"reason\":R}} (closed; /sse:\n"
                                    "403); no usable answer refuses it too (/sse: 503)\n"
                                    "(unset: no subscribe proxy)",
        STR(proxy.url[APP_PROXY_SUBSCRIBE])},
    [SV_PROXY_PUBLISH] = {"proxy-publish", 0, S, "URL",
                          .help = "the same for each /pubsub publish (with its \"data\"); an\n"
                                  "answer {\"result\":{\"data\":\"D\"}} publishes D instead",
        STR(proxy.url[APP_PROXY_PUBLISH])},
    [SV_PROXY_TIMEOUT] = {"proxy-timeout", 0, U, "MS", "1000", 1, MS_MAX,
                          .help = "a backend's answer must come within MS, or the operation\n"
                                  "is refused (\"proxy timeout\")",
        U32(proxy.timeout_ms)},
    [SV_PROXY_MAX_INFLIGHT] = {"proxy-max-inflight", 0, U, "N", "1000", 1, 1000000,
                               .help = "requests in flight to each proxy (connect, refresh,\n"
                                       "subscribe, publish), over all threads;\n"
                                       "an operation beyond them is refused (\"proxy busy\")",
        U32(proxy.max_inflight)},
    [SV_FEED] = {"feed", 0, C, "on|off", "on", .choices = "on|off",
                 .help = "the simulated market data on topic \"market\"",
        BOOL(feed)},
    [SV_FEED_RATE] = {"feed-rate", 0, U, "N", "40", 0, 100000,
                      .help = "its price updates a second, over all instruments",
        U32(feed_rate)},
    [SV_PAGE] = {"page", 0, C, "on|off", "on", .choices = "on|off",
                 .help = "the live market page at / (or /market) and /tern-client.js",
        BOOL(page)},
    [SV_NODE_NAME] = {"node-name", 0, S, "NAME", .check = node_name_ok,
                      .help = "this node's name in topic \"stats\", /stats and /metrics\n"
                              "(default HOSTNAME:PID; letters, digits and . _ : -)",
        DEST(node, char *, put_node)},
    [SV_BRIDGE] = {"bridge", 0, S, "URL", .show = app_serve_redis_redact,
                   .help = "bridge pub/sub through Redis (redis://host[:port][/db])\n"
                           "or NATS (nats://host[:port][,host[:port]...]; tls://...\n"
                           "over TLS, ?ca=F to verify with, ?cert=F&key=F):\n"
                           "every node's subscribers get every node's publishes;\n"
                           "redis://[user]:password@host... sends AUTH (never logged;\n"
                           "better --redis-password-file); NATS's credentials:\n"
                           "nats://user:password@ or nats://token@, or files:\n"
                           "?creds=F, ?token_file=F, nats://user:@...?password_file=F;\n"
                           "topics with a history are JetStream streams, kept in\n"
                           "?replicas=N copies (1 to 5, default 1)",
        STR(bridge)},
    [SV_REDIS] = {"redis", 0, S, "URL", .show = app_serve_redis_redact,
                  .help = "the older name of --bridge, still taken (give one of them)",
        STR(redis)},
    [SV_REDIS_PASS_FILE] = {"redis-password-file", 0, S, "F", .flags = SECRET,
                            .help = "the password (F's first line) instead of in the URL,\n"
                                    "which would show it to every user of the machine",
        STR(redis_password_file)},
    [SV_LOG_LEVEL] = {"log-level", 0, C, "L", "warn", .choices = "error|warn|info|debug",
                      LIVE(LOG), .help = "the library's log on stderr: error, warn, info, debug",
        STR(log_level)},
    [SV_ACCESS_LOG] = {"access-log", 0, S, "FILE",
                       .help = "one line per response (peer method target status bytes ms),\n"
                               "and per WebSocket session at its end (its length, bytes and\n"
                               "messages each way, close code and side); - for stdout",
        STR(access_log)},
    [SV_LOG_FORMAT] = {"log-format", 0, C, "F", "text", .choices = "text|json",
                       .help = "text or json: every log and access line with an RFC 3339\n"
                               "timestamp and a level; json: one object a line",
        DEST(log_format, int, put_log_format)},
    [SV_THREADS] = {"threads", 0, U, "N", NULL, 1, 1024,
                    .help = "loops, one per thread (unset: one per CPU this process may\n"
                            "use: its affinity mask, within its cgroup's CPU quota)",
        DEST(threads, int, put_threads)},
    [SV_IO] = {"io", 0, C, "uring|epoll|poll", .choices = "uring|epoll|poll",
               .help = "how each loop waits for I/O: io_uring completions, or epoll\n"
                       "readiness (unset: epoll), or poll(2)'s; io_uring falls back\n"
                       "to epoll where the kernel refuses it",
        DEST(run.loop.io, tern_io_backend, put_io)},
    [SV_VHOST] = {"vhost", 0, S, "NAME=ROOT", .check = vhost_ok, .flags = REPEAT, .max_count = 64,
                  .help = "requests for host NAME get the files under ROOT, and only\n"
                          "them; other names get the routes above",
        VALS(vhosts)},
    [SV_QUIET] = {"quiet", 0, F, .help = "no log lines but the \"listening on\" one",
        BOOL(quiet)},
    [SV_CONFIG] = {"config", 0, S, "FILE", .flags = APP_OPT_CLI_ONLY,
                   .help = "read options from FILE: one \"name value\" a line, as the\n"
                           "flags without their --; # comments; SIGHUP reads it again\n"
                           "(unset: $TERN_CONFIG's file, if set)"},
    [SV_PRINT_CONFIG] = {"print-config", 0, F, .flags = APP_OPT_CLI_ONLY,
                         .help = "print the configuration in effect (flags over TERN_NAME\n"
                                 "environment variables over --config over defaults) in\n"
                                 "the file's format, and exit"},
    [SV_VERSION] = {"version", 0, F, .flags = APP_OPT_CLI_ONLY,
                    .help = "print the version, the TLS library and the I/O back ends"},
    [SV_HELP] = {"help", 0, F, .flags = APP_OPT_CLI_ONLY, .help = "this text"},
};
