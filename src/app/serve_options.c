/* tern serve's options: the one table its command line, --help, its
 * configuration file (--config), the environment (TERN_NAME) and
 * --print-config all come from (options.h). */
#include <arpa/inet.h>
#include <ctype.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/serve_options.h"
#include "app/topic_rules.h"
#include "tern/tern.h"

#define MS_MAX 86400000ull   /* a day: the longest timeout */

/* A host name's bytes, for the part a wildcard stands for. */
static bool host_chars(const char *s, size_t len) {
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
    if (hlen == 0 || !host_chars(rest, hlen))
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
    if (eq == NULL || eq - s > TERN_TOPIC_MAX || !tern__policy_parse(eq + 1, &policy, &code))
        return "expected PREFIX=P, P one of drop, close, close-1013, conflate";
    return NULL;
}

/* --topic 'PATTERN [KEY=VALUE]...': what tern__rules_add says of it alone. */
static const char *topic_rule_ok(const char *s) {
    static tern__topic_rules scratch;   /* the option parser runs on one thread */
    const char *why = NULL;
    memset(&scratch, 0, sizeof(scratch));
    return tern__rules_add(&scratch, s, &why) == 0 ? NULL : why;
}

static const char *vhost_ok(const char *s) {
    const char *eq = strchr(s, '=');
    return eq != NULL && eq != s && eq - s < 256 ? NULL : "expected NAME=ROOT";
}

bool tern__serve_admin_listen_parse(const char *s, char *host, size_t cap, int *port) {
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

bool tern__serve_admin_loopback(const char *host) {
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, host, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, host, &a6) == 1)
        return IN6_IS_ADDR_LOOPBACK(&a6) || (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
    return strcmp(host, "localhost") == 0;
}

const char *tern__serve_config_path(const tern__opt_set *s) {
    /* --config is CLI_ONLY (a file cannot name another), so the table's
     * environment pass skips it: TERN_CONFIG is read here. */
    if (tern__opt_given(s, SV_CONFIG))
        return tern__opt_str(s, SV_CONFIG);
    const char *env = getenv("TERN_CONFIG");
    return env && *env ? env : NULL;
}

/* --node-name: it goes into JSON, HTML and Prometheus labels unescaped,
 * so only characters none of them quotes. */
static const char *node_name_ok(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > TERN__NODE_NAME_MAX)
        return "expected 1 to 64 characters.";
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("._:-", s[i]))
            return "expected letters, digits and . _ : - only.";
    return NULL;
}

static const char *admin_listen_ok(const char *s) {
    char host[256];
    int port;
    return tern__serve_admin_listen_parse(s, host, sizeof(host), &port)
               ? NULL
               : "expected HOST:PORT, [IPV6]:PORT or off";
}

#define U TERN__OPT_UINT
#define S TERN__OPT_STRING
#define C TERN__OPT_CHOICE
#define F TERN__OPT_FLAG
#define REPEAT TERN__OPT_REPEAT
#define RELOAD TERN__OPT_RELOAD
#define SECRET TERN__OPT_SECRET

const tern__opt tern__serve_opts[SV_COUNT] = {
    [SV_HOST] = {"host", 0, S, "H", "127.0.0.1", .help = "address to listen on (0.0.0.0 or :: for all)"},
    [SV_PORT] = {"port", 0, U, "P", "8080", 0, 65535, .help = "TCP port (0 picks a free one)"},
    [SV_UNIX] = {"unix", 0, S, "PATH", .help = "also listen on a Unix socket"},
    [SV_REUSE_PORT] = {"reuse-port", 0, F,
                       .help = "share the ports (--port, --tls-port, --admin-listen) with\n"
                               "another process started with it (SO_REUSEPORT; --unix's\n"
                               "path is taken over): a zero-downtime restart starts the\n"
                               "new one, then SIGTERMs the old. Off: a port or path\n"
                               "another process listens on is refused (\"Address already\n"
                               "in use\")"},
    [SV_TLS_CERT] = {"tls-cert", 0, S, "FILE", .flags = REPEAT, .max_count = 8,
                     .help = "PEM certificate chain: serve HTTPS/WSS too (one --tls-key\n"
                             "each; more than one are chosen by SNI; SIGHUP reloads\n"
                             "their files)"},
    [SV_TLS_KEY] = {"tls-key", 0, S, "FILE", .flags = REPEAT | SECRET, .max_count = 8,
                    .help = "PEM private key of the --tls-cert before it"},
    [SV_TLS_PASS_FILE] = {"tls-key-passphrase-file", 0, S, "FILE", .flags = SECRET,
                          .help = "the passphrase of encrypted --tls-key files (its first\n"
                                  "line; read again on SIGHUP). Never asked on a terminal"},
    [SV_TLS_PORT] = {"tls-port", 0, U, "P", "8443", 0, 65535, .help = "HTTPS port (0 picks a free one)"},
    [SV_TLS_MIN] = {"tls-min-version", 0, C, "V", .choices = "1.2|1.3",
                    .help = "the oldest TLS version served (1.2 when unset)"},
    [SV_TLS_CIPHERS] = {"tls-ciphers", 0, S, "LIST",
                        .help = "TLS 1.2 ciphers, OpenSSL's syntax (unset: OpenSSL's)"},
    [SV_TLS_SUITES] = {"tls-ciphersuites", 0, S, "LIST",
                       .help = "TLS 1.3 ciphersuites, OpenSSL's syntax, the server's order\n"
                               "chosen (unset: AES-128-GCM, AES-256-GCM, ChaCha20)"},
    [SV_TLS_CLIENT_CA] = {"tls-client-ca", 0, S, "FILE",
                          .help = "PEM CAs that client certificates are verified against"},
    [SV_TLS_CLIENT_VERIFY] = {"tls-client-verify", 0, C, "M", .choices = "optional|require",
                              .help = "ask clients for a certificate (unset: none asked;\n"
                                      "needs --tls-client-ca)"},
    [SV_BENCH_ROUTES] = {"bench-routes", 0, F,
                         .help = "also serve the routes that make the server work on request,\n"
                                 "for benchmarks and tests: /echo, /stream, /upload, /delay,\n"
                                 "/item/:id, /ws, /ws/broadcast, /ws/room/:room, /fanout,\n"
                                 "/fanout/sub, /fanout/pub, /fanout/pub-keyed (off: 404;\n"
                                 "/pubsub and /ping are always served, the page's routes\n"
                                 "unless --page off)"},
    [SV_ADMIN_LISTEN] = {"admin-listen", 0, S, "HOST:PORT", "127.0.0.1:9090", .check = admin_listen_ok,
                         .help = "the admin listener: POST /publish/:topic, GET /stats and\n"
                                 "GET /metrics (Prometheus), GET /healthz and GET /readyz\n"
                                 "(503 while draining or while --redis is down), never on\n"
                                 "the public port ([::1]:P for IPv6; off for none); an\n"
                                 "address other than loopback needs --admin-listen-public"},
    [SV_ADMIN_PUBLIC] = {"admin-listen-public", 0, F,
                         .help = "let --admin-listen take an address other than loopback:\n"
                                 "/stats, /metrics, /healthz and /readyz then answer anyone\n"
                                 "who reaches it, with no key (off: refused at start)"},
    [SV_API_KEY_FILE] = {"api-key-file", 0, S, "FILE", .flags = SECRET,
                         .help = "the key POST /publish needs (Authorization: Bearer KEY):\n"
                                 "the file's first line (unset: publish answers 403)"},
    [SV_ROOT] = {"root", 0, S, "DIR", .help = "serve static files from DIR"},
    [SV_MAX_HEAD] = {"max-head", 0, U, "BYTES", "16384", 1, 1u << 24, .help = "request line + headers"},
    [SV_MAX_BODY] = {"max-body", 0, U, "BYTES", "16777216", 1, 1ull << 40, .help = "request body"},
    [SV_HEAD_TO] = {"head-timeout", 0, U, "MS", "10000", 1, MS_MAX, .help = "a request's head must arrive within this"},
    [SV_BODY_TO] = {"body-timeout", 0, U, "MS", "10000", 1, MS_MAX, .help = "a body brings 4 KiB (or its end) within this"},
    [SV_IDLE_TO] = {"idle-timeout", 0, U, "MS", "60000", 1, MS_MAX, .help = "keep-alive"},
    [SV_SEND_TO] = {"send-timeout", 0, U, "MS", "60000", 1, MS_MAX,
                    .help = "close a client that takes no bytes for this long"},
    [SV_MAX_UNSENT] = {"max-unsent", 0, U, "BYTES", "268435456", 1, 1ull << 40,
                       .help = "bound on all connections' unsent output"},
    [SV_MAX_CONNS] = {"max-connections", 0, U, "N", "10000", 0, TERN_UNLIMITED - 1,
                      .help = "open connections, all threads together; more are answered\n"
                              "503 (Retry-After: 1) and closed (0: no limit)"},
    [SV_MAX_CONNS_IP] = {"max-connections-per-ip", 0, U, "N", "50", 0, TERN_UNLIMITED - 1,
                         .help = "the same from one IPv4 address or IPv6 /64 (0: no limit)"},
    [SV_SNDBUF] = {"sndbuf", 0, U, "BYTES", NULL, 4096, 1u << 30,
                   .help = "the kernel's send buffer of each connection (SO_SNDBUF;\n"
                           "unset: autotuned, up to megabytes a client has not read)"},
    [SV_SHUT_TO] = {"shutdown-timeout", 0, U, "MS", "10000", 1, MS_MAX, .help = "graceful shutdown limit"},
    [SV_SHUT_SPREAD] = {"shutdown-spread", 0, U, "MS", NULL, 0, MS_MAX,
                        .help = "the shutdown closes each WebSocket (1012) at a random moment\n"
                                "within MS, so their clients do not all reconnect at once\n"
                                "(unset: 4/5 of --shutdown-timeout; 0: all at once)"},
    [SV_DRAIN_DELAY] = {"drain-delay", 0, U, "MS", "0", 0, MS_MAX,
                        .help = "on SIGTERM, /readyz answers 503 at once but the listeners\n"
                                "keep accepting and serving for MS before the drain begins,\n"
                                "so that a load balancer takes the node out first (0: no\n"
                                "wait; a second SIGTERM ends the wait)"},
    [SV_WS_MAX] = {"ws-max-message", 0, U, "BYTES", "16777216", 1, 1ull << 40,
                   .help = "WebSocket message limit"},
    [SV_WS_IDLE] = {"ws-idle-timeout", 0, U, "MS", "30000", 1, MS_MAX,
                    .help = "ping an idle WebSocket after this long"},
    [SV_NO_PMD] = {"no-compression", 0, F, .help = "don't offer permessage-deflate on /ws"},
    [SV_ALLOWED_ORIGIN] = {"allowed-origin", 0, S, "O", .check = origin_pattern_ok,
                           .flags = REPEAT | RELOAD, .max_count = 32,
                           .help = "a WebSocket upgrade with an Origin header must match one:\n"
                                   "https://app.example.com exactly, or https://*.example.com\n"
                                   "for its subdomains; others get 403, one without Origin\n"
                                   "(not a browser) is let in (unset: any origin)"},
    [SV_WS_ORIGIN] = {"ws-origin", 0, S, "ORIGIN", .flags = REPEAT | RELOAD, .max_count = 32,
                      .help = "the same as --allowed-origin (exact)"},
    [SV_WS_SLOW] = {"ws-slow-policy", 0, C, "P", "pause", .choices = "pause|close|drop",
                    .help = "/ws client not reading: pause, close (1008) or drop"},
    [SV_WS_ASYNC] = {"ws-async", 0, C, "timer|post", .choices = "timer|post", .flags = TERN__OPT_OPTARG,
                     .help = "/ws echoes each message later, from the loop, not inside\n"
                             "on_message (a handler that waits on I/O): from a 0 ms timer\n"
                             "per batch (timer, when bare), or from a tern_loop_post per batch"},
    [SV_WS_DEADLINE] = {"ws-deadline-ms", 0, U, "N", NULL, 1, MS_MAX,
                        .help = "/ws connections get a deadline of N ms, moved by every\n"
                                "message: N ms without one closes it with 1008 \"deadline\""},
    [SV_PS_BACKLOG] = {"pubsub-max-backlog", 0, U, "BYTES", "1048576", 1, 1ull << 32,
                       .help = "a /pubsub subscriber with more waiting gets the policy"},
    [SV_PS_MAX_MESSAGE] = {"pubsub-max-message", 0, U, "BYTES", "65536", 1, 1ull << 40,
                           .help = "a bigger /pubsub message closes its connection with 1009"},
    [SV_PS_RATE] = {"pubsub-rate", 0, U, "N", "100", 0, 1000000, .flags = RELOAD,
                    .help = "/pubsub messages a second per connection, a burst of N\n"
                            "(0: no limit); one over it is answered {\"error\":\"rate limit\"},\n"
                            "and more than N refused without a pause close it with 1008"},
    [SV_PS_POLICY] = {"pubsub-policy", 0, C, "P", "drop", .choices = "drop|close|close-1013|conflate",
                      .help = "drop (its messages are dropped and counted), close (1008),\n"
                              "close-1013 (try again later) or conflate (keep the newest\n"
                              "message per key while it is behind)"},
    [SV_TOPIC] = {"topic", 0, S, "'PATTERN [KEY=VALUE]...'", .check = topic_rule_ok,
                  .flags = REPEAT | RELOAD, .max_count = TERN_TOPIC_RULES_MAX,
                  .help = "a topic rule: PATTERN is a topic, or a prefix ending in *\n"
                          "(\"orders.*\"; \"*\": all); a topic takes its exact rule, else\n"
                          "its longest prefix's. KEYs: subscribe= and publish= (token:\n"
                          "a token's rights must cover the topic, the default; anyone;\n"
                          "none), policy=, history=N, history-age=SECONDS,\n"
                          "max-backlog=BYTES (the --pubsub-* defaults otherwise).\n"
                          "Closed by default: without a rule only tokens open a topic.\n"
                          "\"market\" and \"stats\" (the feed's) are subscribe=anyone\n"
                          "publish=none. SIGHUP applies changes of subscribe= and\n"
                          "publish=; the other keys need a restart"},
    [SV_PS_TOPIC] = {"pubsub-topic-policy", 0, S, "PREFIX=P", .check = topic_policy_ok,
                     .flags = REPEAT, .max_count = TERN_TOPIC_RULES_MAX,
                     .help = "the same as --topic 'PREFIX* policy=P' (before the --topic\n"
                             "rules: a --topic of the same pattern wins)"},
    [SV_PS_HISTORY] = {"pubsub-history", 0, U, "N", "0", 0, TERN_HISTORY_MAX,
                       .help = "keep each topic's last N messages for subscribers that\n"
                               "resume (0: none; topic \"market\" of the feed keeps 4096 for\n"
                               "a minute)"},
    [SV_PS_HISTORY_AGE] = {"pubsub-history-age", 0, U, "SECONDS", NULL, 1, 86400,
                           .help = "and none older than this (unset: no limit)"},
    [SV_PS_HISTORY_BYTES] = {"pubsub-history-bytes", 0, U, "BYTES", "67108864", 0, 1ull << 40,
                             .help = "all topics' histories together keep at most this (0: no\n"
                                     "limit); over it the oldest messages of the topics over\n"
                                     "their share go"},
    [SV_PS_REPLAY_RATE] = {"pubsub-replay-rate", 0, U, "BYTES", "0", 0, 1ull << 40,
                           .help = "bytes a second each thread sends to subscribers that\n"
                                   "resume until they catch up, together (0: no limit);\n"
                                   "spreads a reconnect storm's catch-up; above the live\n"
                                   "rate, or they fall behind"},
    [SV_PS_WRITE_DELAY] = {"pubsub-write-delay", 0, U, "MS", "0", 0, 1000,
                           .help = "a topic's messages wait up to MS before going out, so\n"
                                   "each subscriber gets those of MS in one write (fewer\n"
                                   "sends at low rates, MS more latency; 0: at once)"},
    [SV_TOKEN_HMAC] = {"token-hmac-secret-file", 0, S, "F", .flags = SECRET | RELOAD,
                       .help = "/pubsub takes JWTs signed HS256 with F's bytes (one\n"
                               "trailing newline stripped), as ?token= or Authorization:\n"
                               "Bearer; closed with 4001 at exp"},
    [SV_TOKEN_PUBKEY] = {"token-public-key-file", 0, S, "F", .flags = RELOAD,
                         .help = "and/or RS256 or ES256 ones (F: a PEM public key); SIGHUP\n"
                                 "reads both files again (tokens turned on or off need a\n"
                                 "restart)"},
    [SV_TOKEN_AUD] = {"token-audience", 0, S, "A", .flags = RELOAD, .help = "tokens must name A in aud"},
    [SV_TOKEN_ISS] = {"token-issuer", 0, S, "I", .flags = RELOAD, .help = "tokens must have iss I"},
    [SV_TOKEN_LEEWAY] = {"token-leeway", 0, U, "SECONDS", "30", 0, 3600, .flags = RELOAD,
                         .help = "clock difference allowed with the tokens' issuer: a token\n"
                                 "is taken until SECONDS after its exp (and closed with 4001\n"
                                 "then), and from SECONDS before its nbf"},
    [SV_FEED] = {"feed", 0, C, "on|off", "on", .choices = "on|off",
                 .help = "the simulated market data on topic \"market\""},
    [SV_FEED_RATE] = {"feed-rate", 0, U, "N", "40", 0, 100000,
                      .help = "its price updates a second, over all instruments"},
    [SV_PAGE] = {"page", 0, C, "on|off", "on", .choices = "on|off",
                 .help = "the live market page at / (or /market) and /tern-client.js"},
    [SV_NODE_NAME] = {"node-name", 0, S, "NAME", .check = node_name_ok,
                      .help = "this node's name in topic \"stats\", /stats and /metrics\n"
                              "(default HOSTNAME:PID; letters, digits and . _ : -)"},
    [SV_REDIS] = {"redis", 0, S, "URL",
                  .help = "bridge pub/sub through Redis (redis://host[:port][/db]):\n"
                          "every node's subscribers get every node's publishes;\n"
                          "redis://[user]:password@host... sends AUTH (never logged;\n"
                          "better --redis-password-file)"},
    [SV_REDIS_PASS_FILE] = {"redis-password-file", 0, S, "F", .flags = SECRET,
                            .help = "the password (F's first line) instead of in the URL,\n"
                                    "which would show it to every user of the machine"},
    [SV_LOG_LEVEL] = {"log-level", 0, C, "L", "warn", .choices = "error|warn|info|debug",
                      .flags = RELOAD, .help = "the library's log on stderr: error, warn, info, debug"},
    [SV_ACCESS_LOG] = {"access-log", 0, S, "FILE",
                       .help = "one line per response (peer method target status bytes ms),\n"
                               "and per WebSocket session at its end (its length, bytes and\n"
                               "messages each way, close code and side); - for stdout"},
    [SV_LOG_FORMAT] = {"log-format", 0, C, "F", "text", .choices = "text|json",
                       .help = "text or json: every log and access line with an RFC 3339\n"
                               "timestamp and a level; json: one object a line"},
    [SV_THREADS] = {"threads", 0, U, "N", NULL, 1, 1024,
                    .help = "loops, one per thread (unset: one per CPU this process may\n"
                            "use: its affinity mask, within its cgroup's CPU quota)"},
    [SV_IO] = {"io", 0, C, "uring|epoll|poll", .choices = "uring|epoll|poll",
               .help = "how each loop waits for I/O: io_uring completions, or epoll\n"
                       "readiness (unset: epoll), or poll(2)'s; io_uring falls back\n"
                       "to epoll where the kernel refuses it"},
    [SV_VHOST] = {"vhost", 0, S, "NAME=ROOT", .check = vhost_ok, .flags = REPEAT, .max_count = 64,
                  .help = "requests for host NAME get the files under ROOT, and only\n"
                          "them; other names get the routes above"},
    [SV_QUIET] = {"quiet", 0, F, .help = "no log lines but the \"listening on\" one"},
    [SV_CONFIG] = {"config", 0, S, "FILE", .flags = TERN__OPT_CLI_ONLY,
                   .help = "read options from FILE: one \"name value\" a line, as the\n"
                           "flags without their --; # comments; SIGHUP reads it again\n"
                           "(unset: $TERN_CONFIG's file, if set)"},
    [SV_PRINT_CONFIG] = {"print-config", 0, F, .flags = TERN__OPT_CLI_ONLY,
                         .help = "print the configuration in effect (flags over TERN_NAME\n"
                                 "environment variables over --config over defaults) in\n"
                                 "the file's format, and exit"},
    [SV_VERSION] = {"version", 0, F, .flags = TERN__OPT_CLI_ONLY,
                    .help = "print the version, the TLS library and the I/O back ends"},
    [SV_HELP] = {"help", 0, F, .flags = TERN__OPT_CLI_ONLY, .help = "this text"},
};
