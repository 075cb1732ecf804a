/* tern load: a WebSocket load generator on the tern loop (one thread).
 * This file is the command: its options, --help, and the mode chosen.
 *
 *   tern load echo     (load_echo.c) one message in flight per connection;
 *                      echoes per second and round trip times.
 *   tern load pipeline (load_pipeline.c) batches of messages written at
 *                      once per connection; echoes per second.
 *   tern load fanout   (load_fanout.c) a request every interval per
 *                      connection, R replies of S bytes back; rounds that
 *                      missed their interval, round times.
 *   tern load pubsub   (load_pubsub.c) N subscribers, one publisher at a
 *                      fixed rate; deliveries, latency, gaps; a cut and
 *                      resume.
 *   tern load market   (load_market.c) pubsub with keys and slow readers;
 *                      whether each reader ends with every key's latest.
 *
 * The runner (load_run.c) drives the connections and the phases; the
 * statistics (load_stats.c) print the results. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/app.h"
#include "app/load.h"
#include "app/options.h"

const load_mode_ops *const load_modes[LOAD_MODES] = {
    [LOAD_ECHO] = &load_echo_ops,
    [LOAD_PIPELINE] = &load_pipeline_ops,
    [LOAD_FANOUT] = &load_fanout_ops,
    [LOAD_PUBSUB] = &load_pubsub_ops,
    [LOAD_MARKET] = &load_market_ops,
};

/* ---- the command -------------------------------------------------------- */

/* The modes' bits in the table's groups. */
#define M_ECHO (1u << LOAD_ECHO)
#define M_PIPE (1u << LOAD_PIPELINE)
#define M_FAN (1u << LOAD_FANOUT)
#define M_PUB (1u << LOAD_PUBSUB)
#define M_MKT (1u << LOAD_MARKET)

static const char *pub_path_ok(const char *v) {
    return v[0] == '/' && strlen(v) < LOAD_PATH_MAX && strcspn(v, " \t\r\n") == strlen(v)
               ? NULL
               : "expected a path starting with /, without blanks";
}

/* tern load's options. Defaults differ by mode: they are the modes'
 * (load_mode_ops.defaults), and the help says them. */
enum { LO_URL, LO_CONNS, LO_SIZE, LO_DURATION, LO_WARMUP, LO_DEPTH, LO_ITER, LO_WARMUP_ITER,
       LO_REPLIES, LO_REPLY_SIZE, LO_INTERVAL, LO_RATE, LO_PUB_PATH, LO_INSTRUMENTS,
       LO_SLOW_FRACTION, LO_SLOW_RATE, LO_DRAIN, LO_CUT_AT, LO_CUT_FOR, LO_CA_FILE, LO_INSECURE,
       LO_JSON, LO_HELP,
       LO_COUNT };
#define SEC APP_OPT_SECONDS
static const app_opt load_opts_table[LO_COUNT] = {
    [LO_URL] = {"url", 0, APP_OPT_STRING, "URL",
                .help = "ws://HOST[:PORT]/PATH or wss://...: a name (its addresses\n"
                        "tried in turn) or an address (IPv6 in brackets); or\n"
                        "ws+unix:SOCKET:/PATH; required"},
    [LO_CONNS] = {"connections", 0, APP_OPT_UINT, "N", NULL, 1, 1000000,
                  .help = "connections; pubsub, market: subscribers (default: echo 100,\n"
                          "pipeline 1, fanout and pubsub 1000, market 5000)"},
    [LO_SIZE] = {"size", 0, APP_OPT_UINT, "BYTES", NULL, 0, 256u << 20,
                 .help = "message payload (default: echo 64, pipeline and fanout 16,\n"
                         "pubsub 256 and at least 16, market 512 and at least 21)"},
    [LO_DURATION] = {"duration", 0, SEC, "SECONDS", .groups = M_ECHO | M_FAN | M_PUB | M_MKT,
                     .help = "measured time (default: echo 5, the others 10)"},
    [LO_WARMUP] = {"warmup", 0, SEC, "SECONDS", .flags = APP_OPT_ZERO_MIN,
                   .groups = M_ECHO | M_FAN | M_PUB | M_MKT,
                   .help = "before measuring (default: echo 1, the others 2; 0 for none)"},
    [LO_DEPTH] = {"depth", 0, APP_OPT_UINT, "P", NULL, 1, 1u << 20, .groups = M_PIPE,
                  .help = "messages per batch (default 8)"},
    [LO_ITER] = {"iterations", 0, APP_OPT_UINT, "I", NULL, 1, 1ull << 40, .groups = M_PIPE,
                 .help = "measured messages per connection (default 200000)"},
    [LO_WARMUP_ITER] = {"warmup-iterations", 0, APP_OPT_UINT, "W", NULL, 0, 1ull << 40,
                        .groups = M_PIPE,
                        .help = "messages per connection before measuring (default 20000)"},
    [LO_REPLIES] = {"replies", 0, APP_OPT_UINT, "R", NULL, 1, 1000, .groups = M_FAN,
                    .help = "messages per round (default 10)"},
    [LO_REPLY_SIZE] = {"reply-size", 0, APP_OPT_UINT, "S", NULL, 0, 16u << 20, .groups = M_FAN,
                       .help = "bytes of each (default 10000)"},
    [LO_INTERVAL] = {"interval", 0, SEC, "SECONDS", .groups = M_FAN, .help = "(default 1)"},
    [LO_RATE] = {"rate", 0, APP_OPT_UINT, "R", NULL, 1, 10000000, .groups = M_PUB | M_MKT,
                 .help = "messages published per second (default: pubsub 1000,\n"
                         "market 200)"},
    [LO_PUB_PATH] = {"publish-path", 0, APP_OPT_STRING, "PATH", .check = pub_path_ok,
                     .groups = M_PUB | M_MKT,
                     .help = "the publisher's path on the same host (required)"},
    [LO_INSTRUMENTS] = {"instruments", 0, APP_OPT_UINT, "K", NULL, 1, 10000, .groups = M_MKT,
                        .help = "keys (default 100)"},
    [LO_SLOW_FRACTION] = {"slow-fraction", 0, APP_OPT_REAL, "F", .groups = M_MKT,
                          .help = "of the subscribers, read slowly (default 0.1)"},
    [LO_SLOW_RATE] = {"slow-rate", 0, APP_OPT_UINT, "BYTES", NULL, 1, 1ull << 32,
                      .groups = M_MKT, .help = "a slow one's bytes a second (default 16384)"},
    [LO_DRAIN] = {"drain", 0, SEC, "SECONDS", .flags = APP_OPT_ZERO_MIN, .groups = M_MKT,
                  .help = "after publishing, before checking (default 3)"},
    [LO_CUT_AT] = {"cut-at", 0, SEC, "S", .groups = M_PUB,
                   .help = "with --cut-for T: S seconds into the measured time, every\n"
                           "subscriber's connection is cut; T seconds later they all\n"
                           "connect again and resume after the last message they got\n"
                           "(tern serve's /fanout/sub ?ack=1 and ?epoch=E&after=N, with\n"
                           "a history: --pubsub-history); a gap or a duplicate shows in\n"
                           "the sequences"},
    [LO_CUT_FOR] = {"cut-for", 0, SEC, "T", .groups = M_PUB, .help = "see --cut-at"},
    [LO_CA_FILE] = {"ca-file", 0, APP_OPT_STRING, "FILE",
                    .help = "wss://: the CA certificates (PEM) that sign the server's\n"
                            "(default: the system's)"},
    [LO_INSECURE] = {"insecure", 'k', APP_OPT_FLAG,
                     .help = "wss://: do not check the server's certificate"},
    [LO_JSON] = {"json", 0, APP_OPT_FLAG, .help = "print one JSON object instead of text"},
    [LO_HELP] = {"help", 0, APP_OPT_FLAG, .flags = APP_OPT_CLI_ONLY, .help = "this text"},
};
#undef SEC

/* The modes' names: tern load's groups of options. */
static const char *const mode_names[] = {"tern load echo", "tern load pipeline",
                                         "tern load fanout", "tern load pubsub",
                                         "tern load market"};

static void usage(FILE *f) {
    fprintf(f,
            "usage: tern load echo     --url ws://HOST[:PORT]/PATH [options]\n"
            "       tern load pipeline --url ws://HOST[:PORT]/PATH [options]\n"
            "       tern load fanout   --url ws://HOST[:PORT]/PATH [options]\n"
            "       tern load pubsub   --url ws://HOST[:PORT]/PATH --publish-path PATH [options]\n"
            "       tern load market   --url ws://HOST[:PORT]/PATH --publish-path PATH [options]\n"
            "\n"
            "echo: each connection sends a binary message, waits for the whole echo, checks\n"
            "it and sends the next; after the warm-up it counts echoes and round trips.\n"
            "\n"
            "pipeline: each connection writes DEPTH messages at once, and the next batch\n"
            "when all their echoes are back; each echo must be a binary message of the size.\n"
            "\n"
            "fanout: each connection sends a binary message every interval (the connections\n"
            "take turns, spread evenly over it) and expects R binary messages of S bytes back;\n"
            "a round not done within its interval is missed (tern serve's /fanout).\n"
            "\n"
            "pubsub: N connections to --url subscribe (the server is to send each one\n"
            "every message published); one more, to --publish-path, publishes RATE binary\n"
            "messages a second, each starting with its send time and a sequence number\n"
            "(tern serve's /fanout/sub and /fanout/pub). Counts deliveries, their latency\n"
            "and the gaps in each subscriber's sequence.\n"
            "\n"
            "market: pubsub with keys: each message updates one of K instruments (its\n"
            "first bytes: 4 and four digits, the key of tern serve's /fanout/pub-keyed), and\n"
            "a fraction of the subscribers read only RATE bytes a second. Then the\n"
            "publisher stops and, after the drain, every reader should hold each key's\n"
            "latest message (a conflating server gives that). A disconnect is counted,\n"
            "not an error.\n"
            "\n"
            "options (the modes each belongs to in parentheses; without: all modes):\n");
    app_opt_set s;
    if (app_opt_init(&s, "tern load", load_opts_table, LO_COUNT) == 0) {
        s.group_names = mode_names;
        app_opt_help(&s, f);
        app_opt_free(&s);
    }
    fprintf(f,
            "\n"
            "Exit status: 0 after a clean run; 1 when the run failed (connection refused,\n"
            "handshake refused, a wrong echo, the server closing); 2 for bad options.\n");
}

static int load_configure(app_opt_set *s, load_opts *o, int argc, char **argv);

int tern_app_load(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *mode = argv[1];
    if (!strcmp(mode, "--help") || !strcmp(mode, "-h") || !strcmp(mode, "help")) {
        usage(stdout);
        return 0;
    }
    const load_mode_ops *ops = NULL;
    for (int m = 0; m < LOAD_MODES && ops == NULL; m++)
        if (strcmp(mode, load_modes[m]->name) == 0)
            ops = load_modes[m];
    if (ops == NULL) {
        fprintf(stderr, "tern load: unknown mode '%s' (echo, pipeline, fanout, pubsub or "
                        "market)\n", mode);
        usage(stderr);
        return 2;
    }
    load_opts o = ops->defaults;

    app_opt_set s;
    if (app_opt_init(&s, "tern load", load_opts_table, LO_COUNT) < 0) {
        fprintf(stderr, "tern load: out of memory\n");
        return 1;
    }
    s.group_names = mode_names;
    s.group = (int)o.mode;
    int status = load_configure(&s, &o, argc, argv);
    if (status < 0)
        status = load_run_main(&o);
    app_opt_free(&s);
    return status;
}

/* The options of argv (argv[1] the mode) into o; -1 when they are good, or
 * the exit status (help: 0; bad options: 2, said why). */
static int load_configure(app_opt_set *s, load_opts *o, int argc, char **argv) {
    const char *mode = argv[1];
    const char *name = mode_names[o->mode];
    if (app_opt_parse_argv(s, argc - 1, argv + 1) < 0) {
        fprintf(stderr, "%s: %s\n", name, s->err);
        return 2;
    }
    if (app_opt_uint(s, LO_HELP)) {
        usage(stdout);
        return 0;
    }
    if (s->nargs > 0) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", name, s->args[0]);
        return 2;
    }
#define GIVEN(i) app_opt_given(s, i)
    o->url = app_opt_str(s, LO_URL);
    if (GIVEN(LO_CONNS)) o->connections = (uint32_t)app_opt_uint(s, LO_CONNS);
    if (GIVEN(LO_SIZE)) o->size = app_opt_uint(s, LO_SIZE);
    if (GIVEN(LO_DURATION)) o->duration_ms = app_opt_uint(s, LO_DURATION);
    if (GIVEN(LO_WARMUP)) o->warmup_ms = app_opt_uint(s, LO_WARMUP);
    if (GIVEN(LO_DEPTH)) o->depth = (uint32_t)app_opt_uint(s, LO_DEPTH);
    if (GIVEN(LO_ITER)) o->iterations = app_opt_uint(s, LO_ITER);
    if (GIVEN(LO_WARMUP_ITER)) o->warmup_iterations = app_opt_uint(s, LO_WARMUP_ITER);
    if (GIVEN(LO_REPLIES)) o->replies = (uint32_t)app_opt_uint(s, LO_REPLIES);
    if (GIVEN(LO_REPLY_SIZE)) o->reply_size = app_opt_uint(s, LO_REPLY_SIZE);
    if (GIVEN(LO_INTERVAL)) o->interval_ms = app_opt_uint(s, LO_INTERVAL);
    if (GIVEN(LO_RATE)) o->rate = app_opt_uint(s, LO_RATE);
    if (GIVEN(LO_PUB_PATH)) strcpy(o->pub_path, app_opt_str(s, LO_PUB_PATH));
    if (GIVEN(LO_INSTRUMENTS)) o->instruments = (uint32_t)app_opt_uint(s, LO_INSTRUMENTS);
    if (GIVEN(LO_SLOW_FRACTION)) o->slow_fraction = app_opt_real(s, LO_SLOW_FRACTION);
    if (GIVEN(LO_SLOW_RATE)) o->slow_rate = app_opt_uint(s, LO_SLOW_RATE);
    if (GIVEN(LO_DRAIN)) o->drain_ms = app_opt_uint(s, LO_DRAIN);
    if (GIVEN(LO_CUT_AT)) o->cut_at_ms = app_opt_uint(s, LO_CUT_AT);
    if (GIVEN(LO_CUT_FOR)) o->cut_for_ms = app_opt_uint(s, LO_CUT_FOR);
    o->ca_file = app_opt_str(s, LO_CA_FILE);
    o->insecure = app_opt_uint(s, LO_INSECURE);
    o->json = app_opt_uint(s, LO_JSON);
#undef GIVEN
    if (o->url == NULL) {
        fprintf(stderr, "tern load %s: --url is required\n", mode);
        return 2;
    }
    const char *why = NULL;
    if (tern_url_parse(o->url, &o->where, &why) == 0)
        why = o->where.target == NULL ? "not a WebSocket URL (ws://, wss://, ws+unix: or wss+unix:)"
              : strlen(o->where.target) >= LOAD_PATH_MAX ? "path too long" : NULL;
    if (why != NULL) {
        fprintf(stderr, "tern load %s: bad --url %s: %s\n", mode, o->url, why);
        return 2;
    }
    const char *bad = load_modes[o->mode]->check ? load_modes[o->mode]->check(o) : NULL;
    if (bad != NULL) {
        fprintf(stderr, "%s: %s\n", name, bad);
        return 2;
    }
    return -1;
}
