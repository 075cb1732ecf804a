/* Data publication: a market-data feed over WebSocket at
 * ws://127.0.0.1:8084/market (or the port given; 0: any free one, the
 * first line on stderr says which). A second argument sets the tick in ms
 * (default 100).
 *
 * Each tick moves a few of the 2490 instruments' prices. A client sends:
 *   "subscribe"    then gets every tick, a small JSON text message:
 *                  {"seq":42,"moves":[["I0123",101.25,101.27],...]}
 *   "unsubscribe"  stops that
 *   anything else  a snapshot: 10 binary messages of 10 000 bytes, the
 *                  whole book as of the current tick. Each starts with a
 *                  40-byte line "seq 0000000042 page 01/10", then 249 rows
 *                  of 40 bytes: "I0123     101.25     101.27      123456".
 *
 *   ./build/examples/market & python3 -m websockets ws://localhost:8084/market
 *
 * The rules this shows:
 * - A snapshot is framed once per tick, into ten prepared messages, however
 *   many clients ask during that tick: each send copies the frame into the
 *   client's output, and the pages are freed when the next tick rebuilds
 *   them. The tick's update is likewise framed once for all subscribers.
 * - Memory stays bounded with the drop policy. A client that asks and does
 *   not read (or reads slower than the ticks come) would otherwise make
 *   its backlog, and the server, grow without end. Here, once its backlog
 *   passes 1 MiB, or stays over 256 KiB for a second, what is sent to it
 *   is dropped (TERN_SEND_DROPPED) until it catches up; it stays
 *   connected. Dropping suits a feed: a tick is superseded by the next
 *   one, and every page says which tick it is of and which page it is,
 *   so a client that got a partial snapshot sees it and asks again. (A
 *   chat, where every line matters, closes a slow member instead: see
 *   chat.c.) So the server holds at most about 1 MiB per client. */
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tern/tern.h>

#define PAGES 10
#define PAGE_SIZE 10000
#define ROW 40
#define ROWS_PER_PAGE (PAGE_SIZE / ROW - 1)   /* the first row is the page's header */
#define INSTRUMENTS (PAGES * ROWS_PER_PAGE)
#define MOVES_PER_TICK 5

typedef struct client {
    struct client *prev, *next;
    tern_ws *ws;
    bool subscribed;
} client;

/* Loop thread only. */
typedef struct market {
    tern_server *srv;
    tern_timer *tick;
    bool shutting_down;
    client *clients;                  /* every open connection */
    uint32_t seq;                     /* the current tick */
    uint32_t rng;
    int64_t bid_cents[INSTRUMENTS];
    uint32_t volume[INSTRUMENTS];
    tern_ws_prepared *pages[PAGES];   /* the snapshot as of pages_seq */
    uint32_t pages_seq;
    bool pages_built;
} market;

static uint32_t rnd(market *m) {   /* xorshift32: good enough for fake prices */
    m->rng ^= m->rng << 13;
    m->rng ^= m->rng >> 17;
    m->rng ^= m->rng << 5;
    return m->rng;
}

static void free_pages(market *m) {
    for (int i = 0; i < PAGES; i++) {
        tern_ws_prepared_free(m->pages[i]);
        m->pages[i] = NULL;
    }
    m->pages_built = false;
}

/* Frames the snapshot of the current tick, once: only when a client asks
 * and the book has moved since it was last built. */
static bool build_pages(market *m) {
    if (m->pages_built && m->pages_seq == m->seq)
        return true;
    free_pages(m);
    char page[PAGE_SIZE + 1];   /* + 1: snprintf's NUL */
    for (int p = 0; p < PAGES; p++) {
        char *w = page;
        w += snprintf(w, ROW + 1, "seq %010u page %02d/%02d%*s\n", m->seq, p + 1, PAGES, 14, "");
        for (int r = 0; r < ROWS_PER_PAGE; r++) {
            int i = p * ROWS_PER_PAGE + r;
            int64_t bid = m->bid_cents[i], ask = bid + 2;
            w += snprintf(w, ROW + 1, "I%04d %7lld.%02lld %7lld.%02lld %11u\n", i,
                          (long long)(bid / 100), (long long)(bid % 100), (long long)(ask / 100),
                          (long long)(ask % 100), m->volume[i]);
        }
        if ((m->pages[p] = tern_ws_prepare(page, PAGE_SIZE, TERN_WS_BINARY, false)) == NULL) {
            free_pages(m);
            return false;
        }
    }
    m->pages_seq = m->seq;
    m->pages_built = true;
    return true;
}

static void send_snapshot(market *m, tern_ws *ws) {
    if (!build_pages(m)) {
        tern_ws_close(ws, TERN_WS_INTERNAL, "out of memory");
        return;
    }
    for (int p = 0; p < PAGES; p++) {
        int r = tern_ws_send_prepared(ws, m->pages[p]);
        /* Dropped (over the backlog limit) or closing: the rest of this
         * snapshot would be of no use; the client asks again. */
        if (r < 0 || r == TERN_SEND_DROPPED)
            return;
    }
}

/* The publisher: moves some prices, then tells every subscriber. */
static void on_tick(tern_timer *timer, void *user) {
    market *m = user;
    char msg[64 + MOVES_PER_TICK * 48];
    size_t n = (size_t)snprintf(msg, sizeof(msg), "{\"seq\":%u,\"moves\":[", ++m->seq);
    for (int k = 0; k < MOVES_PER_TICK; k++) {
        int i = (int)(rnd(m) % INSTRUMENTS);
        int64_t bid = m->bid_cents[i] + (int64_t)(rnd(m) % 21) - 10;
        m->bid_cents[i] = bid < 100 ? 100 : bid;
        m->volume[i] += rnd(m) % 1000;
        bid = m->bid_cents[i];
        n += (size_t)snprintf(msg + n, sizeof(msg) - n, "%s[\"I%04d\",%lld.%02lld,%lld.%02lld]",
                              k ? "," : "", i, (long long)(bid / 100), (long long)(bid % 100),
                              (long long)((bid + 2) / 100), (long long)((bid + 2) % 100));
    }
    n += (size_t)snprintf(msg + n, sizeof(msg) - n, "]}");
    tern_ws_prepared *update = tern_ws_prepare(msg, n, TERN_WS_TEXT, false);
    if (update == NULL)
        return;
    for (client *c = m->clients; c; c = c->next)
        if (c->subscribed)
            tern_ws_send_prepared(c->ws, update);   /* DROPPED for those behind */
    tern_ws_prepared_free(update);
}

static void on_open(tern_ws *ws, void *user) {
    market *m = user;
    client *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        tern_ws_close(ws, TERN_WS_INTERNAL, "out of memory");
        return;   /* on_close still runs, and finds no client */
    }
    c->ws = ws;
    c->next = m->clients;
    if (m->clients)
        m->clients->prev = c;
    m->clients = c;
    tern_ws_set_user(ws, c);
}

static void on_message(tern_ws *ws, const char *data, size_t len, int opcode, void *user) {
    market *m = user;
    client *c = tern_ws_user(ws);
    if (c == NULL)
        return;
    if (len == 9 && memcmp(data, "subscribe", 9) == 0)
        c->subscribed = true;
    else if (len == 11 && memcmp(data, "unsubscribe", 11) == 0)
        c->subscribed = false;
    else
        send_snapshot(m, ws);
}

static void on_close(tern_ws *ws, int code, const char *reason, size_t reason_len, void *user) {
    market *m = user;
    client *c = tern_ws_user(ws);
    if (c == NULL)
        return;
    if (c->prev)
        c->prev->next = c->next;
    else
        m->clients = c->next;
    if (c->next)
        c->next->prev = c->prev;
    free(c);
}

static void shutdown_done(tern_server *srv, void *user) { tern_loop_stop(tern_server_loop(srv)); }

static void on_signal(tern_loop *loop, int signo, void *user) {
    market *m = user;
    if (m->shutting_down) {   /* a second Ctrl-C: now */
        tern_loop_stop(loop);
        return;
    }
    m->shutting_down = true;
    tern_server_shutdown(m->srv, shutdown_done, m);   /* every client gets 1001 */
}

int main(int argc, char **argv) {
    static market m = {.rng = 2463534242u};
    static const tern_ws_handlers handlers = {
        .on_open = on_open,
        .on_message = on_message,
        .on_close = on_close,
    };
    static const tern_ws_options options = {
        .max_message = 256,               /* requests are words */
        .slow_policy = TERN_WS_SLOW_DROP, /* see the top of the file */
        .backlog_soft = 256 * 1024,       /* over this for backlog_grace_ms ... */
        .backlog_grace_ms = 1000,
        .backlog_hard = 1024 * 1024,      /* ... or ever over this: drop */
    };
    int port = argc > 1 ? atoi(argv[1]) : 8084;
    int tick_ms = argc > 2 ? atoi(argv[2]) : 100;
    tern_loop *loop;
    int err;
    if (tick_ms <= 0)
        tick_ms = 100;
    for (int i = 0; i < INSTRUMENTS; i++) {
        m.bid_cents[i] = 1000 + rnd(&m) % 100000;
        m.volume[i] = rnd(&m) % 1000000;
    }
    signal(SIGPIPE, SIG_IGN);
    if ((err = tern_loop_new(&loop, NULL)) < 0 || (err = tern_server_new(&m.srv, loop, NULL)) < 0 ||
        (err = tern_ws_route(m.srv, "/market", &handlers, &options, &m)) < 0 ||
        (err = tern_listen(m.srv, "127.0.0.1", port, NULL)) < 0 ||
        (err = tern_timer_start(loop, &m.tick, (uint64_t)tick_ms, (uint64_t)tick_ms, on_tick, &m)) <
            0 ||
        (err = tern_loop_on_signal(loop, SIGINT, on_signal, &m)) < 0 ||
        (err = tern_loop_on_signal(loop, SIGTERM, on_signal, &m)) < 0) {
        fprintf(stderr, "market: %s\n", tern_strerror(err));
        return 1;
    }
    fprintf(stderr, "market: listening on http://127.0.0.1:%d/\n", tern_server_port(m.srv));
    err = tern_loop_run(loop);
    tern_timer_stop(m.tick);
    tern_server_free(m.srv);   /* closes what is left; their on_close frees them */
    free_pages(&m);
    tern_loop_free(loop);
    return err < 0;
}
