/* tern serve's simulated market data and live statistics, published
 * through the library's pub/sub, and the page at / that shows them.
 *
 * Both come in /pubsub's format, {"topic":T,"seq":N,"data":D}, D a JSON
 * string holding a JSON object:
 * - topic "market", one message per price update, keyed by its instrument
 *   ({"topic":"market","seq":N,"key":"ACME","data":D}):
 *     {"sym":"ACME","px":101.25,"chg":0.42,"ts":1763950000123}
 *   (chg: percent since the feed started; ts: Unix milliseconds). One
 *   instrument is one key: a later conflation keeps the newest per sym.
 *   As it starts the feed publishes every instrument once, at its open,
 *   so the topic's snapshot holds all 24 from the first moment.
 * - topic "stats", once a second:
 *     {"node":"NAME","uptime":S,"threads":T,"connections":C,"msgs_in":R,"msgs_out":R,
 *      "bytes_in":R,"bytes_out":R,"publishes":R,"delivered":R,"dropped":D}
 *   where R are per-second rates over every thread and D a total, NAME
 *   --node-name: over Redis every node's figures reach every subscriber,
 *   and the page keeps those of the node that served it.
 *
 * Both run from timers on the first thread's loop; a publish reaches the
 * subscribers of every thread. A publish to a topic with no subscriber
 * costs a lookup: the feed runs whether anyone watches or not. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "app/app.h"
#include "tern/tern.h"

#define TICK_MS 50

typedef struct instrument {
    const char *sym;
    double open, px;
} instrument;

static instrument instruments[] = {
    {"ACME", 101.20, 0}, {"BOLT", 48.75, 0}, {"CRUX", 312.40, 0}, {"DYNA", 27.15, 0},
    {"EMBR", 88.90, 0},  {"FERN", 15.32, 0}, {"GLYF", 221.05, 0}, {"HALO", 64.48, 0},
    {"IRIS", 142.66, 0}, {"JADE", 9.87, 0},  {"KILN", 75.30, 0},  {"LUMA", 403.12, 0},
    {"MOSS", 33.44, 0},  {"NOVA", 187.25, 0}, {"ONYX", 56.01, 0}, {"PIKE", 12.78, 0},
    {"QUIL", 98.65, 0},  {"RUNE", 260.90, 0}, {"SAGE", 41.17, 0}, {"TERN", 120.00, 0},
    {"UMBR", 19.95, 0},  {"VOLT", 77.77, 0},  {"WREN", 133.33, 0}, {"XENO", 5.55, 0},
};
#define N_INSTRUMENTS (sizeof(instruments) / sizeof(instruments[0]))

/* Invariant: one feed per tern serve, touched only by the first loop's
 * thread (its timers); last holds the totals of the previous stats tick. */
typedef struct feed {
    tern_server *srv;
    const char *node;       /* --node-name */
    unsigned rate;          /* updates per second over all instruments */
    double owed;            /* updates due but not yet published (fractions) */
    uint64_t started_ms;
    uint64_t last_in, last_out, last_bin, last_bout, last_msgs, last_deliv;
    unsigned seed;
} feed;

static feed the_feed;

static uint64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* A random walk with a pull back to the open, so prices stay plausible. */
static void move(instrument *in, unsigned *seed) {
    double r = (double)rand_r(seed) / RAND_MAX - 0.5;
    double step = in->px * 0.002 * r * 2 + (in->open - in->px) * 0.01;
    in->px += step;
    if (in->px < 0.01)
        in->px = 0.01;
}

/* Publishes in's present price, keyed by its symbol: a conflating
 * subscriber keeps its newest price, a snapshot holds one per instrument. */
static void publish_price(feed *f, const instrument *in) {
    char msg[200];
    const char head[] = "{\"topic\":\"market\",\"seq\":";
    int n = snprintf(msg, sizeof(msg),
                     "%s,\"key\":\"%s\",\"data\":\"{\\\"sym\\\":\\\"%s\\\",\\\"px\\\":%.2f,"
                     "\\\"chg\\\":%.2f,\\\"ts\\\":%llu}\"}",
                     head, in->sym, in->sym, in->px, (in->px - in->open) / in->open * 100,
                     (unsigned long long)now_ms());
    tern_publish_key(f->srv, "market", in->sym, msg, (size_t)n, TERN_WS_TEXT, sizeof(head) - 1);
}

static void on_tick(tern_timer *t, void *user) {
    (void)t;
    feed *f = user;
    f->owed += f->rate * (TICK_MS / 1000.0);
    for (; f->owed >= 1; f->owed -= 1) {
        instrument *in = &instruments[(unsigned)rand_r(&f->seed) % N_INSTRUMENTS];
        move(in, &f->seed);
        publish_price(f, in);
    }
}

static void on_stats_tick(tern_timer *t, void *user) {
    (void)t;
    feed *f = user;
    uint64_t conns = 0, in = 0, out = 0, bin = 0, bout = 0, msgs = 0, deliv = 0, dropped = 0;
    int n = tern_server_peer_count(f->srv);
    for (int i = 0; i < n; i++) {
        tern_stats st = {0};
        tern_pubsub_counters ps = {0};
        tern_server_stats(tern_server_peer(f->srv, i), &st);
        tern_pubsub_stats(tern_server_peer(f->srv, i), &ps);
        conns += st.connections;
        in += st.ws_messages_in;
        out += st.ws_messages_out;
        bin += st.bytes_in;
        bout += st.bytes_out;
        msgs += ps.messages;
        deliv += ps.delivered;
        dropped += ps.dropped;
    }
    char msg[640];
    const char head[] = "{\"topic\":\"stats\",\"seq\":";
#define Q "\\\""   /* a quote inside the data string */
    int len = snprintf(msg, sizeof(msg),
                       "%s,\"data\":\"{" Q "node" Q ":" Q "%s" Q "," Q "uptime" Q ":%llu,"
                       Q "threads" Q ":%d," Q "connections" Q ":%llu," Q "msgs_in" Q ":%llu,"
                       Q "msgs_out" Q ":%llu," Q "bytes_in" Q ":%llu,"
                       Q "bytes_out" Q ":%llu," Q "publishes" Q ":%llu," Q "delivered" Q ":%llu,"
                       Q "dropped" Q ":%llu}\"}",
                       head, f->node, (unsigned long long)((now_ms() - f->started_ms) / 1000), n,
                       (unsigned long long)conns, (unsigned long long)(in - f->last_in),
                       (unsigned long long)(out - f->last_out),
                       (unsigned long long)(bin - f->last_bin),
                       (unsigned long long)(bout - f->last_bout),
                       (unsigned long long)(msgs - f->last_msgs),
                       (unsigned long long)(deliv - f->last_deliv), (unsigned long long)dropped);
#undef Q
    f->last_in = in, f->last_out = out, f->last_bin = bin, f->last_bout = bout;
    f->last_msgs = msgs, f->last_deliv = deliv;
    tern_publish_ex(f->srv, "stats", msg, (size_t)len, TERN_WS_TEXT, NULL, sizeof(head) - 1);
}

int app_feed_start(tern_server *srv, unsigned rate, const char *node) {
    feed *f = &the_feed;
    memset(f, 0, sizeof(*f));
    f->srv = srv;
    f->node = node;
    f->rate = rate;
    f->started_ms = now_ms();
    f->seed = (unsigned)f->started_ms;
    for (size_t i = 0; i < N_INSTRUMENTS; i++)
        instruments[i].px = instruments[i].open;
    tern_timer *t;
    tern_loop *loop = tern_server_loop(srv);
    /* Both repeat until the loop is freed, which frees them. */
    int err = tern_timer_start(loop, &t, 1000, 1000, on_stats_tick, f);
    if (err == 0 && rate > 0)
        err = tern_timer_start(loop, &t, TICK_MS, TICK_MS, on_tick, f);
    /* Every instrument once, at its open, before any client can come: the
     * updates pick instruments at random, so without this a snapshot taken
     * in the first seconds holds only the few picked so far. */
    if (err == 0 && rate > 0)
        for (size_t i = 0; i < N_INSTRUMENTS; i++)
            publish_price(f, &instruments[i]);
    return err;
}

/* ---- the page ------------------------------------------------------------ */

/* The page with its <meta name="tern-node"> filled in: made once, by
 * app_page_routes, and read by every loop (never written again). */
static char *page;
static size_t page_len;

static void on_page(tern_http_req *req, void *user) {
    (void)user;
    tern_http_add_header(req, "Cache-Control", "no-cache");
    tern_http_respond(req, 200, "text/html; charset=utf-8", page, page_len);
}

/* market.html with node in its tern-node meta. node needs no escaping:
 * --node-name takes only letters, digits and . _ : -. */
static int page_make(const char *node) {
    static const char meta[] = "<meta name=\"tern-node\" content=\"";
    const char *html = (const char *)app_market_html;
    size_t len = app_market_html_len, mlen = sizeof(meta) - 1, nlen = strlen(node);
    const char *at = NULL;
    for (size_t i = 0; at == NULL && i + mlen <= len; i++)
        if (memcmp(html + i, meta, mlen) == 0)
            at = html + i;
    if (at == NULL)
        return -EINVAL;
    size_t head = (size_t)(at - html) + mlen;
    char *p = malloc(len + nlen);
    if (p == NULL)
        return -ENOMEM;
    memcpy(p, html, head);
    memcpy(p + head, node, nlen);
    memcpy(p + head + nlen, html + head, len - head);
    free(page);
    page = p;
    page_len = len + nlen;
    return 0;
}

/* The page's client: clients/js/tern-client.js, the file the npm package
 * ships, so the page runs exactly what applications get. */
static void on_client_js(tern_http_req *req, void *user) {
    (void)user;
    tern_http_add_header(req, "Cache-Control", "no-cache");
    tern_http_respond(req, 200, "text/javascript; charset=utf-8", (const char *)app_client_js,
                      app_client_js_len);
}

int app_page_routes(tern_server *srv, bool at_root, const char *node) {
    int err = page_make(node);
    if (err == 0)
        err = tern_http_route(srv, "GET", "/market", on_page, NULL);
    if (err == 0)
        err = tern_http_route(srv, "GET", "/tern-client.js", on_client_js, NULL);
    if (err == 0 && at_root)
        err = tern_http_route(srv, "GET", "/", on_page, NULL);
    return err < 0 ? err : 0;
}
