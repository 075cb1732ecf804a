/* tern load: a WebSocket load generator on the tern loop (one thread).
 *
 *   tern load echo     N connections, each sends one message, waits for the
 *                      whole echo, checks it and sends the next; for a time.
 *                      Reports echoes per second and the round trip times.
 *   tern load pipeline N connections, each writes a batch of P messages at
 *                      once and the next batch when every echo of the last
 *                      one is back; a fixed number of messages. Reports
 *                      echoes per second.
 *   tern load fanout   N connections, each sends one small message every
 *                      interval (the connections take turns, spread evenly
 *                      over it) and expects R binary messages of S bytes
 *                      back (the market-data write-up's 10 x 10 000 bytes
 *                      a second). Reports the rounds, those that missed
 *                      their interval, and how long each took.
 *   tern load pubsub   N subscribers and one publisher, which sends
 *                      messages at a fixed rate, each stamped with its send
 *                      time and a sequence number. Reports deliveries per
 *                      second, their latency, and the gaps in any
 *                      subscriber's sequence (messages the server dropped).
 *   tern load market   pubsub with keys (instruments) and slow readers: every
 *                      message carries an instrument's key; a fraction of
 *                      the subscribers read at a fixed byte rate. Reports
 *                      the fast ones' latency and gaps, the slow ones'
 *                      disconnects and, after the publisher stops and they
 *                      catch up, whether each holds every key's latest
 *                      message (what a conflating server gives).
 *
 * It exists to measure the server on a small machine, where the client
 * shares the CPUs with it, so the client does as little as it can per
 * message. Its connections are the library's public WebSocket client
 * (tern_ws_connect, tern/client.h), with nothing of its own below the
 * messages:
 * - replies are delivered where they lie in the loop's one shared read
 *   buffer and checked (echo) or only counted (pipeline, fanout) there:
 *   nothing is allocated or copied per message on the way in;
 * - a send copies its payload into the loop's cork buffer and masks it
 *   there, with a fresh key per frame as RFC 6455 asks (a few hundred
 *   nanoseconds for 1 KiB, next to the kernel's microseconds); the sends
 *   of one batch of events (a pipeline's batch, a publisher's tick) leave
 *   in one write. The payload is one shared buffer per run: an echo's
 *   sequence number is written into it just before its send;
 * - one clock read per echo: the time the echo completed is also the time
 *   the next message is sent;
 * - what the modes need beyond sending and receiving is the client API's
 *   too: the market's slow readers pause and resume reading
 *   (tern_ws_pause) on a small receive buffer (the rcvbuf option), and
 *   pubsub's cut drops connections with a reset (tern_ws_abort).
 *
 * Any error ends the run at once (exit 1) with the first error's message;
 * the measurement is only printed after a clean run. */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <time.h>

#include "app/app.h"
#include "app/json.h"
#include "app/options.h"
#include "tern/tern.h"

#define LOAD_MAX_HANDSHAKES 256   /* connections being opened at once: kind to the accept queue */
#define LOAD_PATH_MAX 2048
#define LOAD_CTR_LEN 8            /* an echo message starts with its sequence number */
#define LOAD_STALL_MS 10000       /* nothing received for this long: the server is stuck */
#define LOAD_CLOSE_MS 2000        /* for the close handshakes at the end */
#define LOAD_MAX_BATCH (1u << 30) /* bytes of a pipeline batch on the wire */
#define LOAD_FRAME_MAX_HEADER 14  /* a client frame: a 10-byte header and the masking key */
#define LOAD_STAMP_LEN 16         /* a published message starts with its send time and seq */
#define LOAD_KEY_DIGITS 4         /* market: a message starts with 4, "0042", and the key in it */
#define LOAD_KEY_PREFIX (1 + LOAD_KEY_DIGITS)
#define LOAD_HEAD_BYTES (LOAD_KEY_PREFIX + LOAD_STAMP_LEN)   /* what a subscriber keeps */
#define LOAD_PUB_BYTES (1u << 20) /* the publisher writes at most this much per tick */
#define LOAD_ACK_MAX 128          /* pubsub: the server's word on where a subscription starts */

enum load_mode { LOAD_ECHO, LOAD_PIPELINE, LOAD_FANOUT, LOAD_PUBSUB, LOAD_MARKET };

typedef struct load_opts {
    enum load_mode mode;
    const char *url;
    tern_url where;                  /* url parsed: its target is the subscribers' path */
    const char *ca_file;             /* wss://: the server's CA (NULL: the system's) */
    bool insecure;                   /* wss://: no certificate check */
    uint32_t connections;
    uint64_t size;
    uint64_t duration_ms, warmup_ms;  /* echo */
    uint32_t depth;                   /* pipeline */
    uint64_t iterations, warmup_iterations;
    uint32_t replies;                 /* fanout: messages per round, */
    uint64_t reply_size;              /* of this many bytes each, */
    uint64_t interval_ms;             /* one round per connection this often */
    uint64_t rate;                    /* pubsub: messages published per second */
    char pub_path[LOAD_PATH_MAX];     /* pubsub: the publisher's request target */
    uint32_t instruments;             /* market: keys */
    double slow_fraction;             /* market: of the subscribers, reading at */
    uint64_t slow_rate;               /* this many bytes a second */
    uint64_t drain_ms;                /* market: after publishing, for the slow to catch up */
    uint64_t cut_at_ms, cut_for_ms;   /* pubsub: every subscriber cut this far into the
                                         measured time, for this long, then resumed (0: no cut) */
    bool json;
} load_opts;

/* ---- latency histogram ---------------------------------------------------
 *
 * Log-linear, in nanoseconds: values below 2^SUB_BITS have a bucket each;
 * above, each power of two is cut into 2^SUB_BITS equal buckets, so a
 * bucket is at most 1/64 of its values wide (HdrHistogram's layout with
 * one significant figure and a bit). Fixed size: recording is an index
 * computation and an increment. */
#define HIST_SUB_BITS 6
#define HIST_SUB (1u << HIST_SUB_BITS)
#define HIST_MAX_BITS 40   /* 2^40 ns is 18 minutes; longer is counted there */
#define HIST_BUCKETS ((HIST_MAX_BITS - HIST_SUB_BITS + 1) * HIST_SUB)

/* Invariant: count is the sum of bucket[], sum the sum of the values
 * recorded, min and max exact (min is UINT64_MAX while count is 0). */
typedef struct load_hist {
    uint64_t bucket[HIST_BUCKETS];
    uint64_t count, sum, min, max;
} load_hist;

static void hist_reset(load_hist *h) {
    memset(h, 0, sizeof(*h));
    h->min = UINT64_MAX;
}

static size_t hist_index(uint64_t v) {
    if (v < HIST_SUB)
        return (size_t)v;
    if (v >= (1ull << HIST_MAX_BITS))
        v = (1ull << HIST_MAX_BITS) - 1;
    unsigned top = 63u - (unsigned)__builtin_clzll(v);   /* HIST_SUB_BITS..HIST_MAX_BITS-1 */
    unsigned shift = top - HIST_SUB_BITS;
    return (size_t)(shift + 1) * HIST_SUB + (size_t)((v >> shift) - HIST_SUB);
}

static void hist_record(load_hist *h, uint64_t v) {
    h->bucket[hist_index(v)]++;
    h->count++;
    h->sum += v;
    if (v < h->min)
        h->min = v;
    if (v > h->max)
        h->max = v;
}

/* The value at quantile q (0..1]: the middle of its bucket, kept within
 * [min, max] so that p100 is the max and nothing is below the min. */
static uint64_t hist_quantile(const load_hist *h, double q) {
    if (h->count == 0)
        return 0;
    double want = q * (double)h->count;
    uint64_t rank = (uint64_t)want;
    if ((double)rank < want)
        rank++;
    if (rank == 0)
        rank = 1;
    uint64_t seen = 0;
    size_t i = 0;
    for (; i < HIST_BUCKETS; i++) {
        seen += h->bucket[i];
        if (seen >= rank)
            break;
    }
    uint64_t lo, width;
    if (i < HIST_SUB) {
        lo = i;
        width = 1;
    } else {
        unsigned shift = (unsigned)(i / HIST_SUB) - 1;
        lo = (uint64_t)(i % HIST_SUB + HIST_SUB) << shift;
        width = 1ull << shift;
    }
    uint64_t v = lo + width / 2;
    return v < h->min ? h->min : v > h->max ? h->max : v;
}

/* ---- connections ---------------------------------------------------------- */

enum load_state {
    CS_NEW,          /* not started (or cut by pubsub's cut, and not connecting again yet) */
    CS_CONNECTING,   /* tern_ws_connect called: on_open or on_connect_error is to come */
    CS_OPEN,         /* the run */
    CS_CLOSING,      /* our close frame is sent (tern_ws_close): on_close is to come */
    CS_DONE,         /* on_close or on_connect_error came: nothing more */
};

struct load_run;

/* One client connection, on the public client API (tern/client.h): the
 * library does the handshake, the framing, the masking and the close
 * handshake; what is here is what each mode counts.
 * Invariants:
 * - ws is the library's connection exactly in OPEN and CLOSING, from
 *   on_open to on_close; the run's `live` counts the connections in
 *   CONNECTING, OPEN and CLOSING (a callback of theirs is still to come).
 * - cut: pubsub's cut aborted ws (tern_ws_abort); its on_close takes the
 *   connection back to NEW, from where it connects again and resumes.
 * - Echo: awaiting is true from the send of message number seq until its
 *   echo has come; sent_ns is when it was sent.
 * - Pipeline: a batch of `batch` messages is in flight while owed (the
 *   echoes it still owes) is non-zero; left counts the messages of the
 *   current phase not yet sent.
 * - Fanout: awaiting is true from a request (due at sent_ns) until the
 *   `owed` replies of its round have all come.
 * - Market: a slow reader may take `tokens` more bytes before it pauses
 *   (tern_ws_pause; paused) until the tick gives it more; last_key[k] is
 *   the seq of the newest message of key k it got (0: none).
 * - Pubsub: conns[connections] is the publisher; the others subscribe. */
typedef struct load_conn {
    tern_ws *ws;
    struct load_run *run;
    uint8_t state;
    bool awaiting;
    bool cut;
    /* echo */
    uint64_t seq;
    uint64_t sent_ns;
    /* pipeline; fanout: owed is what the round in flight still owes */
    uint64_t left;
    uint32_t batch, owed;
    /* pubsub subscriber: the seq the next message should have once one
     * has come (seen) */
    bool seen;
    uint64_t next_seq;
    /* market */
    bool slow, paused;
    int64_t tokens;
    uint64_t *last_key;
    /* pubsub with a cut: the server's word on where the subscription
     * starts, its epoch once known, and the offset between the topic's
     * seqs and the publisher's (delta: topic seq = publisher seq + delta,
     * known from the first message after the first ack) */
    bool delta_known, resuming;
    char epoch[17];
    uint64_t ack_seq;
    int64_t delta;
} load_conn;

enum load_phase { PH_CONNECT, PH_WARMUP, PH_MEASURE, PH_DRAIN, PH_CLOSE };

/* The whole run.
 * Invariants: every connection before next_start has been started;
 * handshaking counts those in CONNECTING, opened those that reached OPEN
 * (and may have gone on), live those in CONNECTING, OPEN or CLOSING. The
 * loop stops once the run failed or is closing and live is 0, so nothing
 * of a connection outlives the loop. The measured counters (messages,
 * hist) cover exactly the echoes completed while phase is PH_MEASURE,
 * between t0_ns and t1_ns (and so do fanout's and pubsub's counters
 * marked measured). */
typedef struct load_run {
    const load_opts *o;
    tern_loop *loop;
    load_conn *conns;
    uint32_t nconns;         /* o->connections, and the publisher in pubsub */
    tern_ws_handlers handlers;
    tern_ws_client_options copt;
    const char *headers[2];
    enum load_phase phase;
    uint32_t next_start, handshaking, opened, live, ready, finished;
    /* The payload every send of the mode copies from (the library masks
     * each frame as it copies it into the cork). Echo: payload[i] is what
     * byte i of an echo must be for i >= ctr_len; the first ctr_len bytes
     * are the sequence number, written in just before each send. Fanout:
     * the request; pubsub: the published message, stamped before each
     * send; pipeline: each message of a batch. */
    uint8_t *payload;
    size_t ctr_len;
    size_t echo_len;         /* pipeline: one echoed frame, the server's header + size */
    /* fanout: round k's schedule (fanout_due) */
    uint64_t sched_ns, cursor;
    uint64_t rounds_sent, rounds, late, skipped;   /* measured */
    /* pubsub: at most pub_cap messages a tick */
    uint32_t pub_cap;
    uint64_t pub_start_ns, pub_due, pub_seq;
    uint64_t published, pub_blocked, pub_shed, gaps;   /* measured */
    /* pubsub: the seqs published while measuring, [seq_from, seq_to]
     * (seq_to is UINT64_MAX until the measured time ends); their deliveries
     * are what messages, gaps and hist count, whenever they arrive (a
     * short drain after the measured time lets the last ones in) */
    uint64_t seq_from, seq_to;
    /* market: the keys' latest seqs published, the slow readers' figures
     * (the fast ones' are messages and hist above), and after the drain */
    uint64_t *last_pub;
    uint32_t nslow;
    uint64_t slow_messages, disconnects, stale_keys, stale_fast, key_reorders;
    load_hist slow_hist;
    /* pubsub's cut: when it came and when the reconnects began (0: not
     * yet), the subscribers still to restart (next_restart: the next
     * one), and how their resumes went */
    uint64_t cut_ns, reconnect_ns, resumed_ns;
    uint64_t behind_ns;      /* the last receipt, after the reconnects, of a message over 500 ms old */
    uint32_t next_restart, resumed, not_resumed, acks_due;
    uint64_t replayed;
    tern_timer *cut_timer;
    uint64_t rng, refill_tick;
    tern_timer *tick;        /* fanout's requests, pubsub's publishing */
    /* measurement */
    uint64_t start_ns, open_ns, t0_ns, t1_ns;
    uint64_t messages;
    load_hist hist;
    /* timers and the stall watchdog */
    tern_timer *phase_timer, *watchdog;
    uint64_t progress, progress_seen;
    uint64_t stalled_ms;
    /* ends */
    uint32_t unclean;        /* close handshakes that did not end well */
    char unclean_why[160];   /* the first one's story */
    bool failed;
    char error[640];
} load_run;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The loop stops once nothing of any connection is left to come: at the
 * end of the run, or after a failure (see run_settle). */
static void maybe_stop(load_run *run) {
    if ((run->failed || run->phase == PH_CLOSE) && run->live == 0)
        tern_loop_stop(run->loop);
}

/* Ends the run with an error. The first error is the cause; what follows
 * from it (other connections failing) is not reported. */
static void run_fail(load_run *run, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void run_fail(load_run *run, const char *fmt, ...) {
    if (run->failed)
        return;
    run->failed = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(run->error, sizeof(run->error), fmt, ap);
    va_end(ap);
    tern_loop_stop(run->loop);
}

static unsigned conn_no(const load_conn *c) { return (unsigned)(c - c->run->conns); }

static bool is_publisher(const load_conn *c);
static void run_begin(load_run *run);
static void start_more(load_run *run);
static void restart_more(load_run *run);

/* A close handshake at the end that went wrong: not an error of the
 * measurement, but worth a line. */
static void note_unclean(load_conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note_unclean(load_conn *c, const char *fmt, ...) {
    load_run *run = c->run;
    if (run->unclean++ == 0) {
        int n = snprintf(run->unclean_why, sizeof(run->unclean_why), "connection %u: ", conn_no(c));
        va_list ap;
        va_start(ap, fmt);
        if (n > 0 && (size_t)n < sizeof(run->unclean_why))
            vsnprintf(run->unclean_why + n, sizeof(run->unclean_why) - (size_t)n, fmt, ap);
        va_end(ap);
    }
}

/* ---- sending -------------------------------------------------------------- */

/* Little-endian 64-bit numbers: an echo's sequence number, a published
 * message's stamp. */
static uint64_t get_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static void put_le64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* One binary message. The library copies and masks it into the loop's
 * cork, and the batch's sends leave in one write at the end of the batch.
 * A refusal ends the run: tern load's sends never pass the backlog
 * limits it sets (run_prepare), so a drop would be a bug. */
static bool conn_send(load_conn *c, const void *data, size_t len) {
    int r = tern_ws_send(c->ws, data, len, TERN_WS_BINARY);
    if (r == TERN_SEND_OK || r == TERN_SEND_BUFFERED)
        return true;
    run_fail(c->run, "connection %u: send: %s", conn_no(c),
             r == TERN_SEND_DROPPED ? "dropped over the backlog limit" : tern_strerror(r));
    return false;
}

/* Echo: sends message number seq+1 at time now. */
static void echo_send(load_conn *c, uint64_t now) {
    load_run *run = c->run;
    c->seq++;
    uint8_t ctr[8];
    put_le64(ctr, c->seq);
    memcpy(run->payload, ctr, run->ctr_len);
    c->awaiting = true;
    c->sent_ns = now;
    conn_send(c, run->payload, (size_t)run->o->size);
}

/* Pipeline: sends the next batch of the phase (left > 0): its messages
 * are corked together and written at once at the end of the batch. */
static void pipeline_send(load_conn *c) {
    load_run *run = c->run;
    uint64_t k = c->left < run->o->depth ? c->left : run->o->depth;
    c->batch = (uint32_t)k;
    c->owed = (uint32_t)k;
    for (uint64_t i = 0; i < k; i++)
        if (!conn_send(c, run->payload, (size_t)run->o->size))
            return;
}

static void run_close_all(load_run *run);

/* Pipeline: this connection has sent and got back every message of the
 * phase. The measured phase starts when every connection is through the
 * warm-up, and ends when the last one is through it. */
static void pipeline_conn_finished(load_conn *c) {
    load_run *run = c->run;
    if (run->phase == PH_WARMUP) {
        if (++run->ready < run->o->connections)
            return;
        run->phase = PH_MEASURE;
        run->t0_ns = now_ns();
        for (uint32_t i = 0; i < run->o->connections && !run->failed; i++) {
            run->conns[i].left = run->o->iterations;
            pipeline_send(&run->conns[i]);
        }
        return;
    }
    if (++run->finished == run->o->connections) {
        run->t1_ns = now_ns();
        run_close_all(run);
    }
}

/* ---- echo and pipeline: what comes back ----------------------------------- */

/* The first byte of the echo that differs from what was sent (only
 * called once a difference is known). */
static size_t echo_first_diff(const load_conn *c, const uint8_t *p, size_t len) {
    const load_run *run = c->run;
    for (size_t i = 0; i < len; i++) {
        uint8_t want = i < run->ctr_len ? (uint8_t)(c->seq >> (8 * i)) : run->payload[i];
        if (p[i] != want)
            return i;
    }
    return len;
}

/* Echo: a whole message, checked where it lies in the loop's read
 * buffer; then the next message goes. */
static void echo_message(load_conn *c, const uint8_t *p, size_t len, int opcode) {
    load_run *run = c->run;
    if (!c->awaiting) {
        run_fail(run, "connection %u: a message from the server that is not an echo of ours",
                 conn_no(c));
        return;
    }
    if (opcode == TERN_WS_TEXT) {
        run_fail(run, "connection %u: wrong echo: a text message for our binary one", conn_no(c));
        return;
    }
    if (len != run->o->size) {
        run_fail(run, "connection %u: wrong echo: %zu bytes for the %llu sent", conn_no(c), len,
                 (unsigned long long)run->o->size);
        return;
    }
    uint8_t ctr[8];
    put_le64(ctr, c->seq);
    if (memcmp(p, ctr, run->ctr_len) != 0 ||
        memcmp(p + run->ctr_len, run->payload + run->ctr_len, len - run->ctr_len) != 0) {
        run_fail(run, "connection %u: wrong echo: message %llu differs from what was sent at "
                      "byte %zu", conn_no(c), (unsigned long long)c->seq,
                 echo_first_diff(c, p, len));
        return;
    }
    c->awaiting = false;
    uint64_t now = now_ns();
    if (run->phase == PH_MEASURE) {
        run->messages++;
        hist_record(&run->hist, now - c->sent_ns);
    }
    echo_send(c, now);
}

/* Pipeline: the echoes are counted; each must be a binary message of the
 * size sent, and none may come beyond what the batch owes. */
static void pipeline_message(load_conn *c, size_t len, int opcode) {
    load_run *run = c->run;
    if (c->owed == 0) {
        run_fail(run, "connection %u: a message from the server that we did not ask for",
                 conn_no(c));
        return;
    }
    if (opcode != TERN_WS_BINARY || len != run->o->size) {
        run_fail(run, "connection %u: an echo that is a %s message of %zu bytes, not a binary "
                      "one of %llu", conn_no(c), opcode == TERN_WS_TEXT ? "text" : "binary", len,
                 (unsigned long long)run->o->size);
        return;
    }
    if (--c->owed > 0)
        return;
    c->left -= c->batch;
    if (run->phase == PH_MEASURE)
        run->messages += c->batch;
    if (c->left > 0)
        pipeline_send(c);
    else
        pipeline_conn_finished(c);
}

/* ---- fanout --------------------------------------------------------------- */

/* The latency of a round runs from when it was due, not from when the
 * tick got to it: a client late to ask does not hide a slow server. */
static void fanout_round_done(load_conn *c) {
    load_run *run = c->run;
    c->awaiting = false;
    if (run->phase != PH_MEASURE || c->sent_ns < run->t0_ns)
        return;
    uint64_t lat = now_ns() - c->sent_ns;
    run->rounds++;
    run->messages += run->o->replies;
    hist_record(&run->hist, lat);
    if (lat > run->o->interval_ms * 1000000u)
        run->late++;
}

/* Fanout: a round's replies are counted; each must be a binary message of
 * the reply size, within a round. */
static void fanout_message(load_conn *c, size_t len, int opcode) {
    load_run *run = c->run;
    if (!c->awaiting) {
        run_fail(run, "connection %u: a message from the server that we did not ask for",
                 conn_no(c));
        return;
    }
    if (opcode != TERN_WS_BINARY || len != run->o->reply_size) {
        run_fail(run, "connection %u: a reply that is a %s message of %zu bytes, not a binary "
                      "one of %llu", conn_no(c), opcode == TERN_WS_TEXT ? "text" : "binary", len,
                 (unsigned long long)run->o->reply_size);
        return;
    }
    if (--c->owed == 0)
        fanout_round_done(c);
}

/* ---- pubsub: what a subscriber reads ------------------------------------- */

static bool has_publisher(enum load_mode m) { return m == LOAD_PUBSUB || m == LOAD_MARKET; }

static bool is_publisher(const load_conn *c) {
    return has_publisher(c->run->o->mode) && conn_no(c) == c->run->o->connections;
}

/* Where the stamp is in a published message: market's start with the key. */
static size_t stamp_off(const load_run *run) {
    return run->o->mode == LOAD_MARKET ? LOAD_KEY_PREFIX : 0;
}

/* The topic's seq of the last message this subscriber got (what it
 * resumes after). */
static uint64_t last_topic_seq(const load_conn *c) {
    if (!c->seen || !c->delta_known)
        return c->ack_seq;
    return (uint64_t)((int64_t)(c->next_seq - 1) + c->delta);
}

/* The server's text message: {"epoch":"E","seq":N} where a subscription
 * starts, with ,"resumed":B,"replayed":K after a resume. */
static void ack_message(load_conn *c, const char *data, size_t len) {
    load_run *run = c->run;
    char ack[LOAD_ACK_MAX];
    char e[17];
    unsigned long long seq;
    memcpy(ack, data, len);   /* len < LOAD_ACK_MAX */
    ack[len] = '\0';
    if (sscanf(ack, "{\"epoch\":\"%16[0-9a-f]\",\"seq\":%llu", e, &seq) != 2) {
        run_fail(run, "connection %u: not where the subscription starts: %s", conn_no(c), ack);
        return;
    }
    if (!c->resuming) {
        memcpy(c->epoch, e, sizeof(e));
        c->ack_seq = seq;
        return;
    }
    c->resuming = false;
    const char *r = strstr(ack, "\"replayed\":");
    run->replayed += r ? strtoull(r + 11, NULL, 10) : 0;
    if (strstr(ack, "\"resumed\":true"))
        run->resumed++;
    else
        run->not_resumed++;   /* what it missed shows as gaps */
    memcpy(c->epoch, e, sizeof(e));
    if (--run->acks_due == 0)
        run->resumed_ns = now_ns();
}

/* Market: a message of key k whole. A conflating server sends a key's
 * updates in order and its queue in the order of their latest update, so
 * seqs still rise on every connection, with gaps where it conflated (or
 * dropped); a key that goes back is counted. The fast readers should miss
 * nothing. */
static void market_message(load_conn *c, const uint8_t *head, uint64_t sent, uint64_t seq) {
    load_run *run = c->run;
    unsigned k = 0;
    bool ok = head[0] == LOAD_KEY_DIGITS;
    for (int i = 1; i <= LOAD_KEY_DIGITS; i++) {
        ok = ok && head[i] >= '0' && head[i] <= '9';
        k = k * 10 + (unsigned)(head[i] - '0');
    }
    if (!ok || k >= run->o->instruments) {
        run_fail(run, "connection %u: a message whose key we did not publish", conn_no(c));
        return;
    }
    if (seq <= c->last_key[k])
        run->key_reorders++;
    else
        c->last_key[k] = seq;
    if (!c->slow) {
        if (c->seen && seq != c->next_seq && run->phase == PH_MEASURE) {
            if (seq < c->next_seq)
                run->key_reorders++;
            else
                run->gaps += seq - c->next_seq;
        }
        c->seen = true;
        if (seq >= c->next_seq)
            c->next_seq = seq + 1;
    }
    if (run->phase == PH_MEASURE) {
        uint64_t now = now_ns(), lat = now > sent ? now - sent : 0;
        if (c->slow) {
            run->slow_messages++;
            hist_record(&run->slow_hist, lat);
        } else {
            run->messages++;
            hist_record(&run->hist, lat);
        }
    }
}

/* Pubsub: a published message whole; its stamp says when it was sent and
 * its place in the publisher's sequence. */
static void pubsub_message(load_conn *c, uint64_t sent, uint64_t seq) {
    load_run *run = c->run;
    if (c->epoch[0] && !c->delta_known) {   /* the first message after the first ack */
        c->delta = (int64_t)(c->ack_seq + 1) - (int64_t)seq;
        c->delta_known = true;
    }
    if (c->seen && seq != c->next_seq) {
        if (seq < c->next_seq) {
            run_fail(run, "connection %u: message %llu after %llu: out of order or repeated",
                     conn_no(c), (unsigned long long)seq, (unsigned long long)c->next_seq - 1);
            return;
        }
        /* the missing seqs that were published while measuring */
        uint64_t lo = c->next_seq > run->seq_from ? c->next_seq : run->seq_from;
        uint64_t hi = seq - 1 < run->seq_to ? seq - 1 : run->seq_to;
        if (run->phase >= PH_MEASURE && hi >= lo)
            run->gaps += hi - lo + 1;
    }
    c->seen = true;
    c->next_seq = seq + 1;
    if (run->phase >= PH_MEASURE && seq >= run->seq_from && seq <= run->seq_to) {
        uint64_t now = now_ns();
        run->messages++;
        hist_record(&run->hist, now > sent ? now - sent : 0);
        if (run->reconnect_ns && now > sent + 500000000u)   /* still catching up */
            run->behind_ns = now;
    }
}

/* Market: a slow reader reads while it has tokens (the tick gives them). */
static bool throttled(const load_conn *c) {
    return c->slow && (c->run->phase == PH_WARMUP || c->run->phase == PH_MEASURE);
}

static void set_paused(load_conn *c, bool paused) {
    c->paused = paused;
    int err = paused ? tern_ws_pause(c->ws) : tern_ws_resume(c->ws);
    if (err < 0)
        run_fail(c->run, "connection %u: %s reading: %s", conn_no(c),
                 paused ? "pausing" : "resuming", tern_strerror(err));
}

/* A subscriber's message: where its subscription starts (a text message,
 * with a cut), or a published one. */
static void sub_message(load_conn *c, const uint8_t *p, size_t len, int opcode) {
    load_run *run = c->run;
    if (is_publisher(c)) {
        run_fail(run, "connection %u: the server sent the publisher a message", conn_no(c));
        return;
    }
    if (opcode == TERN_WS_TEXT && run->o->cut_for_ms && len < LOAD_ACK_MAX) {
        ack_message(c, (const char *)p, len);
        return;
    }
    if (opcode != TERN_WS_BINARY || len != run->o->size) {
        run_fail(run, "connection %u: a published message came as a %s message of %zu bytes, "
                      "not a binary one of %llu", conn_no(c),
                 opcode == TERN_WS_TEXT ? "text" : "binary", len,
                 (unsigned long long)run->o->size);
        return;
    }
    const uint8_t *st = p + stamp_off(run);
    uint64_t sent = get_le64(st), seq = get_le64(st + 8);
    if (run->o->mode == LOAD_MARKET)
        market_message(c, p, sent, seq);
    else
        pubsub_message(c, sent, seq);
    if (throttled(c)) {
        /* What a frame of this size costs on the wire: its header too. */
        c->tokens -= (int64_t)(len + (len < 126 ? 2 : len < 65536 ? 4 : 10));
        if (c->tokens <= 0 && !c->paused && !run->failed)
            set_paused(c, true);
    }
}

/* ---- the library's callbacks ---------------------------------------------- */

static void on_message(tern_ws *ws, const char *data, size_t len, int opcode, void *user) {
    (void)ws;
    load_conn *c = user;
    load_run *run = c->run;
    /* After our close frame (the echo in flight, a last publish), or once
     * the run failed: nothing more is counted. */
    if (run->failed || c->state != CS_OPEN)
        return;
    run->progress++;
    const uint8_t *p = (const uint8_t *)data;
    switch (run->o->mode) {
    case LOAD_ECHO: echo_message(c, p, len, opcode); return;
    case LOAD_PIPELINE: pipeline_message(c, len, opcode); return;
    case LOAD_FANOUT: fanout_message(c, len, opcode); return;
    default: sub_message(c, p, len, opcode); return;
    }
}

static void on_open(tern_ws *ws, void *user) {
    load_conn *c = user;
    load_run *run = c->run;
    c->ws = ws;
    c->state = CS_OPEN;
    run->handshaking--;
    if (run->failed) {   /* settling: it only has to go */
        tern_ws_abort(ws);
        return;
    }
    run->opened += !c->resuming;   /* else back after the cut */
    run->progress++;
    if (c->resuming) {
        restart_more(run);
        return;
    }
    if (run->opened == run->nconns)
        run_begin(run);
    else
        start_more(run);
}

static void on_close(tern_ws *ws, int code, const char *reason, size_t reason_len, void *user) {
    (void)ws;
    load_conn *c = user;
    load_run *run = c->run;
    int was = c->state;
    c->ws = NULL;
    c->state = CS_DONE;
    c->paused = false;
    run->live--;
    int rlen = (int)(reason_len > 100 ? 100 : reason_len);
    if (c->cut) {   /* pubsub's cut: back to NEW, to connect again when it ends */
        c->cut = false;
        c->state = CS_NEW;
    } else if (run->failed) {
        /* settling after the error already reported */
    } else if (was == CS_OPEN && run->o->mode == LOAD_MARKET && !is_publisher(c)) {
        run->disconnects++;   /* a figure of the run, not its end */
    } else if (was == CS_OPEN) {
        if (code == TERN_WS_ABNORMAL)
            run_fail(run, "connection %u: the connection dropped during the run (no close frame)",
                     conn_no(c));
        else
            run_fail(run, "connection %u: the server closed the connection during the run: %d%s%.*s",
                     conn_no(c), code, rlen ? " " : "", rlen, reason);
    } else if (code == TERN_WS_ABNORMAL) {
        note_unclean(c, "no close frame from the server within %d ms", LOAD_CLOSE_MS);
    } else if (code != TERN_WS_NORMAL) {
        note_unclean(c, "the server answered our close 1000 with %d%s%.*s", code,
                     rlen ? " " : "", rlen, reason);
    }
    maybe_stop(run);
}

static void on_connect_error(const tern_ws_connect_error *e, void *user) {
    load_conn *c = user;
    load_run *run = c->run;
    c->state = CS_DONE;
    run->handshaking--;
    run->live--;
    if (!e->connected)
        run_fail(run, "connect to %s: %s", run->o->where.authority,
                 e->err == -ETIMEDOUT ? "timed out" : tern_strerror(e->err));
    else if (e->status)
        run_fail(run, "connection %u: handshake refused: %s (is %s a WebSocket route?)",
                 conn_no(c), e->message, is_publisher(c) ? run->o->pub_path : run->o->where.target);
    else
        run_fail(run, "connection %u: handshake: %s", conn_no(c), e->message);
    maybe_stop(run);
}

/* ---- opening ---------------------------------------------------------- */

/* The URL of connection c: the publisher's path or the subscribers', and
 * with a cut, the subscriber asks where it starts (ack=1) or, resuming,
 * for what came after the last message it got. */
static void conn_url(const load_conn *c, char *url, size_t cap) {
    const load_run *run = c->run;
    const tern_url *w = &run->o->where;
    const char *target = is_publisher(c) ? run->o->pub_path : w->target;
    int n = w->unix_socket ? snprintf(url, cap, "%s+unix:%s:%s", w->tls ? "wss" : "ws",
                                      w->socket_path, target)
                           : snprintf(url, cap, "%s://%s%s", w->tls ? "wss" : "ws",
                                      w->authority, target);
    if (n < 0 || (size_t)n >= cap || is_publisher(c) || !run->o->cut_for_ms)
        return;
    char sep = strchr(target, '?') ? '&' : '?';
    if (c->resuming)
        snprintf(url + n, cap - (size_t)n, "%cepoch=%s&after=%llu", sep, c->epoch,
                 (unsigned long long)last_topic_seq(c));
    else
        snprintf(url + n, cap - (size_t)n, "%cack=1", sep);
}

static void conn_start(load_conn *c) {
    load_run *run = c->run;
    char url[LOAD_PATH_MAX + sizeof(run->o->where.authority) + 96];
    conn_url(c, url, sizeof(url));
    tern_ws_client_options opt = run->copt;
    if (c->slow)
        opt.rcvbuf = 16384;   /* a small window, as a reader on a slow link has */
    int err = tern_ws_connect(run->loop, url, &run->handlers, &opt, c);
    if (err < 0) {
        if (err == TERN_ENOHOST)
            run_fail(run, "cannot resolve %s", run->o->where.host);
        else
            run_fail(run, "connection %u: connect to %s: %s%s", conn_no(c), run->o->where.authority,
                     tern_strerror(err), err == -EMFILE ? " (raise ulimit -n)" : "");
        return;
    }
    c->state = CS_CONNECTING;
    run->handshaking++;
    run->live++;
}

/* Keeps up to LOAD_MAX_HANDSHAKES connections being opened at once. */
static void start_more(load_run *run) {
    while (!run->failed && run->handshaking < LOAD_MAX_HANDSHAKES &&
           run->next_start < run->nconns)
        conn_start(&run->conns[run->next_start++]);
}

/* After the cut: the subscribers that were cut connect again, as many at
 * once as start_more opens. */
static void restart_more(load_run *run) {
    while (!run->failed && run->reconnect_ns && run->handshaking < LOAD_MAX_HANDSHAKES &&
           run->next_restart < run->o->connections) {
        load_conn *c = &run->conns[run->next_restart++];
        if (c->resuming && c->state == CS_NEW)
            conn_start(c);
    }
}

/* pubsub's cut: every subscriber's connection dropped at once (a reset, no
 * close frame), in the middle of the measured time (the publisher goes
 * on); cut_for_ms later they all connect again and resume where they
 * were. */
static void on_cut(tern_timer *t, void *user) {
    load_run *run = user;
    if (run->failed || run->phase != PH_MEASURE)
        return;
    if (run->cut_ns == 0) {
        run->cut_ns = now_ns();
        for (uint32_t i = 0; i < run->o->connections; i++) {
            load_conn *c = &run->conns[i];
            if (c->state != CS_OPEN)
                continue;
            c->cut = true;
            c->resuming = true;
            run->acks_due++;
            tern_ws_abort(c->ws);   /* its on_close comes at the end of this batch */
        }
        if (tern_timer_again(t, run->o->cut_for_ms) < 0)
            run_fail(run, "timer: out of memory");
        return;
    }
    run->reconnect_ns = now_ns();
    restart_more(run);
}

static void arm_cut(load_run *run) {
    if (run->o->cut_for_ms && tern_timer_start(run->loop, &run->cut_timer, run->o->cut_at_ms, 0,
                                               on_cut, run) < 0)
        run_fail(run, "timer: out of memory");
}

/* After a failure: every open connection is dropped, and the loop runs
 * until each has had its on_close and each connect under way its outcome,
 * so that nothing of a connection is left when the loop is freed. */
static void run_settle(load_run *run) {
    for (uint32_t i = 0; i < run->nconns; i++) {
        load_conn *c = &run->conns[i];
        if (c->state == CS_OPEN || c->state == CS_CLOSING) {
            c->cut = false;
            tern_ws_abort(c->ws);
        }
    }
    if (run->live > 0)
        tern_loop_run(run->loop);
}

/* ---- phases ------------------------------------------------------------- */

static void on_phase_timer(tern_timer *t, void *user);

static void arm_phase(load_run *run, uint64_t ms) {
    int err = run->phase_timer ? tern_timer_again(run->phase_timer, ms)
                               : tern_timer_start(run->loop, &run->phase_timer, ms, 0,
                                                  on_phase_timer, run);
    if (err < 0)
        run_fail(run, "timer: %s", tern_strerror(err));
}

/* The end: every connection says goodbye with a close frame (1000); the
 * library gives the rest of the close handshake LOAD_CLOSE_MS (its
 * close_timeout_ms), and the phase timer a little more, in case. */
static void run_close_all(load_run *run) {
    run->phase = PH_CLOSE;
    arm_phase(run, LOAD_CLOSE_MS + 1000);
    for (uint32_t i = 0; i < run->nconns && !run->failed; i++) {
        load_conn *c = &run->conns[i];
        if (c->state != CS_OPEN)
            continue;
        c->state = CS_CLOSING;
        if (c->paused)
            set_paused(c, false);   /* the server's close frame must be read */
        tern_ws_close(c->ws, TERN_WS_NORMAL, NULL);
    }
    maybe_stop(run);
}

/* Fanout: the end of the measured time. A round still in flight is
 * judged only when it is already late. */
static void fanout_judge_pending(load_run *run) {
    uint64_t iv = run->o->interval_ms * 1000000u;
    for (uint32_t i = 0; i < run->o->connections; i++) {
        load_conn *c = &run->conns[i];
        if (!c->awaiting || c->sent_ns < run->t0_ns)
            continue;
        if (run->t1_ns - c->sent_ns > iv)
            run->late++;
        else
            run->rounds_sent--;
    }
}

static void on_phase_timer(tern_timer *t, void *user) {
    load_run *run = user;
    if (run->failed)
        return;
    switch (run->phase) {
    case PH_WARMUP:   /* not the pipeline's: its phases end by count */
        run->phase = PH_MEASURE;
        run->t0_ns = now_ns();
        run->messages = 0;
        hist_reset(&run->hist);
        run->rounds_sent = run->rounds = run->late = run->skipped = 0;
        run->published = run->pub_blocked = run->pub_shed = run->gaps = 0;
        run->seq_from = run->pub_seq + 1;
        run->seq_to = UINT64_MAX;
        run->slow_messages = run->key_reorders = 0;
        hist_reset(&run->slow_hist);
        arm_phase(run, run->o->duration_ms);
        arm_cut(run);
        return;
    case PH_MEASURE:
        run->t1_ns = now_ns();
        if (run->o->mode == LOAD_FANOUT)
            fanout_judge_pending(run);
        run->seq_to = run->pub_seq;
        if (run->o->mode == LOAD_PUBSUB) {   /* the publisher stops; the last ones arrive */
            run->phase = PH_DRAIN;
            arm_phase(run, 1000);
            return;
        }
        if (run->o->mode == LOAD_MARKET) {   /* the publisher stops; the slow read freely */
            run->phase = PH_DRAIN;
            for (uint32_t i = 0; i < run->o->connections && !run->failed; i++)
                if (run->conns[i].paused && run->conns[i].state == CS_OPEN)
                    set_paused(&run->conns[i], false);
            arm_phase(run, run->o->drain_ms);
            return;
        }
        run_close_all(run);
        return;
    case PH_DRAIN:   /* market: does every reader hold each key's latest? */
        if (run->o->mode == LOAD_PUBSUB) {
            run_close_all(run);
            return;
        }
        for (uint32_t i = 0; i < run->o->connections; i++) {
            load_conn *c = &run->conns[i];
            if (c->state != CS_OPEN)
                continue;
            for (uint32_t k = 0; k < run->o->instruments; k++)
                if (c->last_key[k] != run->last_pub[k])
                    *(c->slow ? &run->stale_keys : &run->stale_fast) += 1;
        }
        run_close_all(run);
        return;
    case PH_CLOSE:
        /* The library's close timeout should have ended every one. */
        for (uint32_t i = 0; i < run->nconns; i++) {
            load_conn *c = &run->conns[i];
            if (c->state != CS_OPEN && c->state != CS_CLOSING)
                continue;
            note_unclean(c, "close handshake not done after %d ms", LOAD_CLOSE_MS + 1000);
            tern_ws_abort(c->ws);
        }
        return;
    default:
        return;
    }
}

static void on_watchdog(tern_timer *t, void *user) {
    load_run *run = user;
    if (run->failed || run->phase == PH_CLOSE)
        return;
    if (run->progress != run->progress_seen) {
        run->progress_seen = run->progress;
        run->stalled_ms = 0;
        return;
    }
    run->stalled_ms += 1000;
    if (run->stalled_ms < LOAD_STALL_MS)
        return;
    if (run->phase == PH_CONNECT)
        run_fail(run, "stuck opening connections: %u of %u open, no progress for %d s",
                 run->opened, run->nconns, LOAD_STALL_MS / 1000);
    else
        run_fail(run, "the server stopped answering: nothing received for %d s",
                 LOAD_STALL_MS / 1000);
}

/* ---- fanout: the requests ------------------------------------------------- */

/* When round k is due: connection k % N's (k / N)-th round. The
 * connections take turns, spread evenly over each interval. */
static uint64_t fanout_due(const load_run *run, uint64_t k) {
    const load_opts *o = run->o;
    uint64_t iv = o->interval_ms * 1000000u;
    return run->sched_ns + k / o->connections * iv + k % o->connections * iv / o->connections;
}

/* Every millisecond: the rounds that are due. A connection whose last
 * round is still in flight (or whose request is not out yet) skips this
 * one, which counts as missed. */
static void on_fanout_tick(tern_timer *t, void *user) {
    (void)t;
    load_run *run = user;
    if (run->failed || run->phase == PH_CLOSE)
        return;
    uint64_t now = now_ns(), due;
    for (; (due = fanout_due(run, run->cursor)) <= now && !run->failed; run->cursor++) {
        load_conn *c = &run->conns[run->cursor % run->o->connections];
        bool counted = run->phase == PH_MEASURE && due >= run->t0_ns;
        if (c->state != CS_OPEN)
            continue;
        if (c->awaiting || tern_ws_buffered(c->ws) > 0) {
            run->skipped += counted;
            continue;
        }
        run->rounds_sent += counted;
        c->awaiting = true;
        c->sent_ns = due;
        c->owed = run->o->replies;
        conn_send(c, run->payload, (size_t)run->o->size);
    }
}

/* ---- pubsub: the publisher ------------------------------------------------ */

/* Market: every 100 ms each slow reader may read another tenth of its
 * rate (a smaller grain would cost a pause and a resume per millisecond
 * each). What a reader took beyond its tokens (a message is taken whole)
 * comes off the next grain, so the rate holds. */
static void slow_refill(load_run *run) {
    int64_t grain = (int64_t)(run->o->slow_rate / 10 ? run->o->slow_rate / 10 : 1);
    for (uint32_t i = 0; i < run->o->connections && !run->failed; i++) {
        load_conn *c = &run->conns[i];
        if (!c->slow || c->state != CS_OPEN)
            continue;
        c->tokens = c->tokens < 0 ? c->tokens + grain : grain;
        if (c->paused && c->tokens > 0)
            set_paused(c, false);
    }
}

/* xorshift64: which key each market message updates. */
static uint64_t next_rand(load_run *run) {
    uint64_t x = run->rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return run->rng = x;
}

/* Every millisecond: the messages the rate owes since the start, stamped
 * now, sent together (the cork makes them one write). A publisher whose
 * last messages are not through yet (the server reads it slower than the
 * rate) waits; what it owes beyond one tick's worth is shed, so that it
 * never bursts above the rate, and counted. */
static void on_pub_tick(tern_timer *t, void *user) {
    (void)t;
    load_run *run = user;
    if (run->failed || (run->phase != PH_WARMUP && run->phase != PH_MEASURE))
        return;
    if (run->o->mode == LOAD_MARKET) {
        uint64_t tick = (now_ns() - run->pub_start_ns) / 100000000 + 1;   /* 100 ms */
        if (tick != run->refill_tick) {
            run->refill_tick = tick;
            slow_refill(run);
        }
    }
    load_conn *c = &run->conns[run->o->connections];
    if (c->state != CS_OPEN)
        return;
    uint64_t now = now_ns();
    uint64_t due = (now - run->pub_start_ns) / 1000 * run->o->rate / 1000000;
    if (due <= run->pub_due)
        return;
    if (tern_ws_buffered(c->ws) > 0) {
        run->pub_blocked += run->phase == PH_MEASURE;
        return;
    }
    uint64_t k = due - run->pub_due;
    run->pub_due = due;
    if (k > run->pub_cap) {
        if (run->phase == PH_MEASURE)
            run->pub_shed += k - run->pub_cap;
        k = run->pub_cap;
    }
    uint8_t *head = run->payload;
    size_t off = stamp_off(run);
    for (uint64_t i = 0; i < k && !run->failed; i++) {
        uint64_t seq = ++run->pub_seq;
        if (run->o->mode == LOAD_MARKET) {
            unsigned key = (unsigned)(next_rand(run) % run->o->instruments);
            run->last_pub[key] = seq;
            head[0] = LOAD_KEY_DIGITS;
            for (int d = LOAD_KEY_DIGITS; d >= 1; d--, key /= 10)
                head[d] = (uint8_t)('0' + key % 10);
        }
        put_le64(head + off, now);
        put_le64(head + off + 8, seq);
        if (run->phase == PH_MEASURE)
            run->published++;
        conn_send(c, run->payload, (size_t)run->o->size);
    }
}

/* Every connection is open: the messages start. */
static void run_begin(load_run *run) {
    const load_opts *o = run->o;
    run->open_ns = now_ns();
    if (o->mode == LOAD_FANOUT || has_publisher(o->mode)) {
        run->phase = o->warmup_ms ? PH_WARMUP : PH_MEASURE;
        run->t0_ns = run->sched_ns = run->pub_start_ns = run->open_ns;
        run->seq_from = 1;
        run->seq_to = UINT64_MAX;
        arm_phase(run, o->warmup_ms ? o->warmup_ms : o->duration_ms);
        if (!o->warmup_ms)
            arm_cut(run);
        int err = tern_timer_start(run->loop, &run->tick, 1, 1,
                                   o->mode == LOAD_FANOUT ? on_fanout_tick : on_pub_tick, run);
        if (err < 0)
            run_fail(run, "timer: %s", tern_strerror(err));
        return;
    }
    if (o->mode == LOAD_ECHO) {
        run->phase = o->warmup_ms ? PH_WARMUP : PH_MEASURE;
        run->t0_ns = run->open_ns;
        arm_phase(run, o->warmup_ms ? o->warmup_ms : o->duration_ms);
        for (uint32_t i = 0; i < o->connections && !run->failed; i++)
            echo_send(&run->conns[i], now_ns());
        return;
    }
    run->phase = o->warmup_iterations ? PH_WARMUP : PH_MEASURE;
    run->t0_ns = run->open_ns;
    for (uint32_t i = 0; i < o->connections && !run->failed; i++) {
        run->conns[i].left = o->warmup_iterations ? o->warmup_iterations : o->iterations;
        pipeline_send(&run->conns[i]);
    }
}

/* A frame's header as the server writes it (unmasked): the echo's bytes
 * on the wire, for the pipeline's echo_bytes. */
static size_t server_header_len(uint64_t len) { return len < 126 ? 2 : len < 65536 ? 4 : 10; }

/* The message bytes and the connections' options, made once. */
static int run_prepare(load_run *run) {
    const load_opts *o = run->o;
    run->handlers = (tern_ws_handlers){.on_open = on_open, .on_message = on_message,
                                       .on_close = on_close,
                                       .on_connect_error = on_connect_error};
    run->headers[0] = "User-Agent: tern-load/" TERN_VERSION;
    run->headers[1] = NULL;
    /* No backlog limit that tern load's own sends could pass (a pipeline
     * batch may be up to LOAD_MAX_BATCH bytes): the run reads as it writes,
     * so its backlog is bounded by what it sends. The close handshake at
     * the end gets LOAD_CLOSE_MS. */
    size_t biggest = o->size > o->reply_size ? (size_t)o->size : (size_t)o->reply_size;
    run->copt = (tern_ws_client_options){
        .headers = run->headers,
        .ca_file = o->ca_file,
        .insecure = o->insecure,
        .ws = {.max_message = biggest > (16u << 20) ? biggest : 0,
               .close_timeout_ms = LOAD_CLOSE_MS,
               .backlog_soft = (size_t)LOAD_MAX_BATCH * 2,
               .backlog_hard = (size_t)LOAD_MAX_BATCH * 2},
    };
    run->payload = malloc(o->size + 1);
    if (run->payload == NULL)
        return -ENOMEM;
    if (o->mode == LOAD_FANOUT) {   /* the request: size bytes of 'r' */
        memset(run->payload, 'r', (size_t)o->size);
        return 0;
    }
    if (has_publisher(o->mode)) {   /* the head (stamped per send), then filler */
        size_t frame = server_header_len(o->size) + 4 + (size_t)o->size;
        size_t cap = LOAD_PUB_BYTES / frame;
        run->pub_cap = cap < 1 ? 1 : cap > 4096 ? 4096 : (uint32_t)cap;
        size_t head = stamp_off(run) + LOAD_STAMP_LEN;
        memset(run->payload, 0, head);
        memset(run->payload + head, 'p', (size_t)o->size - head);
        if (o->mode == LOAD_MARKET) {
            run->rng = 0x9E3779B97F4A7C15ull ^ now_ns();
            if ((run->last_pub = calloc(o->instruments, sizeof(uint64_t))) == NULL)
                return -ENOMEM;
            for (uint32_t i = 0; i < o->connections; i++) {
                load_conn *c = &run->conns[i];
                c->slow = (uint64_t)((i + 1) * o->slow_fraction) > (uint64_t)(i * o->slow_fraction);
                run->nslow += c->slow;
                if ((c->last_key = calloc(o->instruments, sizeof(uint64_t))) == NULL)
                    return -ENOMEM;
            }
        }
        return 0;
    }
    if (o->mode == LOAD_ECHO) {
        run->ctr_len = o->size < LOAD_CTR_LEN ? (size_t)o->size : LOAD_CTR_LEN;
        /* Not all one byte, so a shifted or reordered echo shows. */
        for (uint64_t i = 0; i < o->size; i++)
            run->payload[i] = (uint8_t)(i * 131 + (i >> 8) + 7);
        return 0;
    }
    run->echo_len = server_header_len(o->size) + (size_t)o->size;
    for (uint64_t i = 0; i < o->size; i++)
        run->payload[i] = (uint8_t)('a' + i % 26);
    return 0;
}

/* ---- results ------------------------------------------------------------ */

static void print_results(const load_run *run) {
    const load_opts *o = run->o;
    double secs = (double)(run->t1_ns - run->t0_ns) / 1e9;
    double connect_s = (double)(run->open_ns - run->start_ns) / 1e9;
    double rate = secs > 0 ? (double)run->messages / secs : 0;
    double mbps = rate * (double)o->size / 1e6;
    const load_hist *h = &run->hist;
    double mean = h->count ? (double)h->sum / (double)h->count / 1e3 : 0;
    double p50 = (double)hist_quantile(h, 0.50) / 1e3;
    double p99 = (double)hist_quantile(h, 0.99) / 1e3;
    double max = (double)h->max / 1e3;
    if (o->mode == LOAD_FANOUT) {
        uint64_t missed = run->late + run->skipped;
        mbps = rate * (double)o->reply_size / 1e6;
        if (o->json) {
            printf("{\"mode\":\"fanout\",\"url\":");
            tern__json_print_string(stdout, o->url);
            printf(",\"connections\":%u,\"size\":%llu,\"replies\":%u,\"reply_size\":%llu,"
                   "\"interval_s\":%.3f,\"warmup_s\":%.3f,\"duration_s\":%.3f,\"connect_s\":%.3f,"
                   "\"rounds_sent\":%llu,\"rounds\":%llu,\"late\":%llu,\"skipped\":%llu,"
                   "\"missed\":%llu,\"messages\":%llu,\"msg_per_s\":%.1f,\"mb_per_s\":%.3f,"
                   "\"latency_us\":{\"mean\":%.1f,\"p50\":%.1f,\"p99\":%.1f,\"max\":%.1f},"
                   "\"unclean_closes\":%u}\n",
                   o->connections, (unsigned long long)o->size, o->replies,
                   (unsigned long long)o->reply_size, (double)o->interval_ms / 1e3,
                   (double)o->warmup_ms / 1e3, secs, connect_s,
                   (unsigned long long)run->rounds_sent, (unsigned long long)run->rounds,
                   (unsigned long long)run->late, (unsigned long long)run->skipped,
                   (unsigned long long)missed, (unsigned long long)run->messages, rate, mbps,
                   mean, p50, p99, max, run->unclean);
        } else {
            printf("tern load fanout %s: %u connections, a round of %u x %llu bytes every %.3f s "
                   "each\n", o->url, o->connections, o->replies,
                   (unsigned long long)o->reply_size, (double)o->interval_ms / 1e3);
            printf("  opened in %.3f s; warm-up %.1f s, measured %.3f s\n", connect_s,
                   (double)o->warmup_ms / 1e3, secs);
            printf("  %llu rounds asked, %llu done; %llu missed their interval (%llu late, "
                   "%llu skipped: the last one still in flight)\n",
                   (unsigned long long)run->rounds_sent, (unsigned long long)run->rounds,
                   (unsigned long long)missed, (unsigned long long)run->late,
                   (unsigned long long)run->skipped);
            printf("  %.1f msg/s, %.3f MB/s\n", rate, mbps);
            printf("  round time (us): mean %.1f  p50 %.1f  p99 %.1f  max %.1f\n", mean, p50,
                   p99, max);
        }
    } else if (o->mode == LOAD_MARKET) {
        const load_hist *sh = &run->slow_hist;
        double prate = secs > 0 ? (double)run->published / secs : 0;
        double srate = secs > 0 ? (double)run->slow_messages / secs : 0;
        double s50 = (double)hist_quantile(sh, 0.50) / 1e3, s99 = (double)hist_quantile(sh, 0.99) / 1e3;
        if (o->json) {
            printf("{\"mode\":\"market\",\"url\":");
            tern__json_print_string(stdout, o->url);
            printf(",\"publish_path\":");
            tern__json_print_string(stdout, o->pub_path);
            printf(",\"connections\":%u,\"slow\":%u,\"instruments\":%u,\"size\":%llu,"
                   "\"rate\":%llu,\"slow_rate\":%llu,\"warmup_s\":%.3f,\"duration_s\":%.3f,"
                   "\"drain_s\":%.3f,\"connect_s\":%.3f,\"published\":%llu,\"publish_rate\":%.1f,"
                   "\"shed\":%llu,\"messages\":%llu,\"msg_per_s\":%.1f,\"gaps\":%llu,"
                   "\"latency_us\":{\"mean\":%.1f,\"p50\":%.1f,\"p99\":%.1f,\"max\":%.1f},"
                   "\"slow_messages\":%llu,\"slow_msg_per_s\":%.1f,"
                   "\"slow_latency_us\":{\"p50\":%.1f,\"p99\":%.1f},\"disconnects\":%llu,"
                   "\"stale_keys\":%llu,\"stale_keys_fast\":%llu,\"key_reorders\":%llu,"
                   "\"unclean_closes\":%u}\n",
                   o->connections, run->nslow, o->instruments, (unsigned long long)o->size,
                   (unsigned long long)o->rate, (unsigned long long)o->slow_rate,
                   (double)o->warmup_ms / 1e3, secs, (double)o->drain_ms / 1e3, connect_s,
                   (unsigned long long)run->published, prate, (unsigned long long)run->pub_shed,
                   (unsigned long long)run->messages, rate, (unsigned long long)run->gaps, mean,
                   p50, p99, max, (unsigned long long)run->slow_messages, srate, s50, s99,
                   (unsigned long long)run->disconnects, (unsigned long long)run->stale_keys,
                   (unsigned long long)run->stale_fast, (unsigned long long)run->key_reorders,
                   run->unclean);
        } else {
            printf("tern load market %s: %u subscribers (%u reading %llu bytes/s), one publisher "
                   "on %s: %llu msg/s of %llu bytes over %u keys\n", o->url, o->connections,
                   run->nslow, (unsigned long long)o->slow_rate, o->pub_path,
                   (unsigned long long)o->rate, (unsigned long long)o->size, o->instruments);
            printf("  opened in %.3f s; warm-up %.1f s, measured %.3f s, drain %.1f s\n",
                   connect_s, (double)o->warmup_ms / 1e3, secs, (double)o->drain_ms / 1e3);
            printf("  published %llu (%.1f/s)\n", (unsigned long long)run->published, prate);
            printf("  fast readers: %.1f msg/s, %llu missing; latency (us) p50 %.1f p99 %.1f "
                   "max %.1f\n", rate, (unsigned long long)run->gaps, p50, p99, max);
            printf("  slow readers: %.1f msg/s; latency (us) p50 %.1f p99 %.1f; %llu "
                   "disconnected\n", srate, s50, s99, (unsigned long long)run->disconnects);
            printf("  after the drain: %llu keys not at their latest on slow readers, %llu on "
                   "fast ones; %llu updates older than one already seen\n",
                   (unsigned long long)run->stale_keys, (unsigned long long)run->stale_fast,
                   (unsigned long long)run->key_reorders);
        }
    } else if (o->mode == LOAD_PUBSUB) {
        double prate = secs > 0 ? (double)run->published / secs : 0;
        uint64_t expected = run->published * o->connections;
        if (o->json) {
            printf("{\"mode\":\"pubsub\",\"url\":");
            tern__json_print_string(stdout, o->url);
            printf(",\"publish_path\":");
            tern__json_print_string(stdout, o->pub_path);
            printf(",\"connections\":%u,\"size\":%llu,\"rate\":%llu,\"warmup_s\":%.3f,"
                   "\"duration_s\":%.3f,\"connect_s\":%.3f,\"published\":%llu,"
                   "\"publish_rate\":%.1f,\"publisher_blocked\":%llu,\"shed\":%llu,"
                   "\"expected\":%llu,\"messages\":%llu,\"gaps\":%llu,\"msg_per_s\":%.1f,"
                   "\"mb_per_s\":%.3f,"
                   "\"latency_us\":{\"mean\":%.1f,\"p50\":%.1f,\"p99\":%.1f,\"max\":%.1f},"
                   "\"unclean_closes\":%u,\"cut\":",
                   o->connections, (unsigned long long)o->size, (unsigned long long)o->rate,
                   (double)o->warmup_ms / 1e3, secs, connect_s,
                   (unsigned long long)run->published, prate,
                   (unsigned long long)run->pub_blocked, (unsigned long long)run->pub_shed,
                   (unsigned long long)expected, (unsigned long long)run->messages,
                   (unsigned long long)run->gaps, rate, mbps, mean, p50, p99, max, run->unclean);
            if (o->cut_for_ms == 0)
                printf("null}\n");
            else
                printf("{\"at_s\":%.3f,\"for_s\":%.3f,\"reconnect_s\":%.3f,"
                       "\"resumed_after_s\":%.3f,\"caught_up_after_s\":%.3f,\"resumed\":%u,"
                       "\"not_resumed\":%u,\"unanswered\":%u,\"replayed\":%llu}}\n",
                       run->cut_ns ? (double)(run->cut_ns - run->t0_ns) / 1e9 : -1.0,
                       (double)o->cut_for_ms / 1e3,
                       run->reconnect_ns ? (double)(run->reconnect_ns - run->t0_ns) / 1e9 : -1.0,
                       run->resumed_ns ? (double)(run->resumed_ns - run->reconnect_ns) / 1e9
                                       : -1.0,
                       run->behind_ns > run->reconnect_ns
                           ? (double)(run->behind_ns - run->reconnect_ns) / 1e9 : 0.0,
                       run->resumed, run->not_resumed, run->acks_due,
                       (unsigned long long)run->replayed);
        } else {
            printf("tern load pubsub %s: %u subscribers, one publisher on %s at %llu msg/s of "
                   "%llu bytes\n", o->url, o->connections, o->pub_path,
                   (unsigned long long)o->rate, (unsigned long long)o->size);
            printf("  opened in %.3f s; warm-up %.1f s, measured %.3f s\n", connect_s,
                   (double)o->warmup_ms / 1e3, secs);
            printf("  published %llu (%.1f/s; %llu shed: the server read the publisher too "
                   "slowly)\n", (unsigned long long)run->published, prate,
                   (unsigned long long)run->pub_shed);
            printf("  delivered %llu of about %llu: %.1f msg/s, %.3f MB/s; %llu missing in "
                   "the subscribers' sequences\n",
                   (unsigned long long)run->messages, (unsigned long long)expected, rate, mbps,
                   (unsigned long long)run->gaps);
            printf("  latency (us): mean %.1f  p50 %.1f  p99 %.1f  max %.1f\n", mean, p50, p99,
                   max);
            if (o->cut_for_ms)
                printf("  cut at %.1f s for %.1f s: %u resumed, %u not, %u unanswered, in "
                       "%.3f s; %llu messages replayed\n", (double)o->cut_at_ms / 1e3,
                       (double)o->cut_for_ms / 1e3, run->resumed, run->not_resumed,
                       run->acks_due,
                       run->resumed_ns ? (double)(run->resumed_ns - run->reconnect_ns) / 1e9
                                       : -1.0,
                       (unsigned long long)run->replayed);
        }
    } else if (o->mode == LOAD_ECHO) {
        if (o->json) {
            printf("{\"mode\":\"echo\",\"url\":");
            tern__json_print_string(stdout, o->url);
            printf(",\"connections\":%u,\"size\":%llu,\"warmup_s\":%.3f,\"duration_s\":%.3f,"
                   "\"connect_s\":%.3f,\"messages\":%llu,\"msg_per_s\":%.1f,\"mb_per_s\":%.3f,"
                   "\"latency_us\":{\"mean\":%.1f,\"p50\":%.1f,\"p99\":%.1f,\"max\":%.1f},"
                   "\"unclean_closes\":%u}\n",
                   o->connections, (unsigned long long)o->size, (double)o->warmup_ms / 1e3, secs,
                   connect_s, (unsigned long long)run->messages, rate, mbps, mean, p50, p99, max,
                   run->unclean);
        } else {
            printf("tern load echo %s: %u connection%s, %llu-byte messages\n", o->url,
                   o->connections, o->connections == 1 ? "" : "s", (unsigned long long)o->size);
            printf("  opened in %.3f s; warm-up %.1f s, measured %.3f s\n", connect_s,
                   (double)o->warmup_ms / 1e3, secs);
            printf("  %llu echoes: %.1f msg/s, %.3f MB/s\n", (unsigned long long)run->messages,
                   rate, mbps);
            printf("  latency (us): mean %.1f  p50 %.1f  p99 %.1f  max %.1f\n", mean, p50, p99,
                   max);
        }
    } else if (o->json) {
        printf("{\"mode\":\"pipeline\",\"url\":");
        tern__json_print_string(stdout, o->url);
        printf(",\"connections\":%u,\"depth\":%u,\"size\":%llu,\"iterations\":%llu,"
               "\"warmup_iterations\":%llu,\"connect_s\":%.3f,\"seconds\":%.3f,\"messages\":%llu,"
               "\"echo_bytes\":%llu,\"msg_per_s\":%.1f,\"mb_per_s\":%.3f,\"unclean_closes\":%u}\n",
               o->connections, o->depth, (unsigned long long)o->size,
               (unsigned long long)o->iterations, (unsigned long long)o->warmup_iterations,
               connect_s, secs, (unsigned long long)run->messages,
               (unsigned long long)(run->messages * run->echo_len), rate, mbps, run->unclean);
    } else {
        printf("tern load pipeline %s: %u connection%s, depth %u, %llu-byte messages\n", o->url,
               o->connections, o->connections == 1 ? "" : "s", o->depth,
               (unsigned long long)o->size);
        printf("  opened in %.3f s; %llu warm-up messages per connection\n", connect_s,
               (unsigned long long)o->warmup_iterations);
        printf("  %llu echoes in %.3f s: %.1f msg/s, %.3f MB/s\n",
               (unsigned long long)run->messages, secs, rate, mbps);
    }
    if (run->unclean)
        fprintf(stderr, "tern load: %u connection%s did not close cleanly; %s\n", run->unclean,
                run->unclean == 1 ? "" : "s", run->unclean_why);
}

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
 * (tern_app_load), and the help says them. */
enum { LO_URL, LO_CONNS, LO_SIZE, LO_DURATION, LO_WARMUP, LO_DEPTH, LO_ITER, LO_WARMUP_ITER,
       LO_REPLIES, LO_REPLY_SIZE, LO_INTERVAL, LO_RATE, LO_PUB_PATH, LO_INSTRUMENTS,
       LO_SLOW_FRACTION, LO_SLOW_RATE, LO_DRAIN, LO_CUT_AT, LO_CUT_FOR, LO_CA_FILE, LO_INSECURE,
       LO_JSON, LO_HELP,
       LO_COUNT };
#define SEC TERN__OPT_SECONDS
static const tern__opt load_opts_table[LO_COUNT] = {
    [LO_URL] = {"url", 0, TERN__OPT_STRING, "URL",
                .help = "ws://HOST[:PORT]/PATH or wss://...: a name (its addresses\n"
                        "tried in turn) or an address (IPv6 in brackets); or\n"
                        "ws+unix:SOCKET:/PATH; required"},
    [LO_CONNS] = {"connections", 0, TERN__OPT_UINT, "N", NULL, 1, 1000000,
                  .help = "connections; pubsub, market: subscribers (default: echo 100,\n"
                          "pipeline 1, fanout and pubsub 1000, market 5000)"},
    [LO_SIZE] = {"size", 0, TERN__OPT_UINT, "BYTES", NULL, 0, 256u << 20,
                 .help = "message payload (default: echo 64, pipeline and fanout 16,\n"
                         "pubsub 256 and at least 16, market 512 and at least 21)"},
    [LO_DURATION] = {"duration", 0, SEC, "SECONDS", .groups = M_ECHO | M_FAN | M_PUB | M_MKT,
                     .help = "measured time (default: echo 5, the others 10)"},
    [LO_WARMUP] = {"warmup", 0, SEC, "SECONDS", .flags = TERN__OPT_ZERO_MIN,
                   .groups = M_ECHO | M_FAN | M_PUB | M_MKT,
                   .help = "before measuring (default: echo 1, the others 2; 0 for none)"},
    [LO_DEPTH] = {"depth", 0, TERN__OPT_UINT, "P", NULL, 1, 1u << 20, .groups = M_PIPE,
                  .help = "messages per batch (default 8)"},
    [LO_ITER] = {"iterations", 0, TERN__OPT_UINT, "I", NULL, 1, 1ull << 40, .groups = M_PIPE,
                 .help = "measured messages per connection (default 200000)"},
    [LO_WARMUP_ITER] = {"warmup-iterations", 0, TERN__OPT_UINT, "W", NULL, 0, 1ull << 40,
                        .groups = M_PIPE,
                        .help = "messages per connection before measuring (default 20000)"},
    [LO_REPLIES] = {"replies", 0, TERN__OPT_UINT, "R", NULL, 1, 1000, .groups = M_FAN,
                    .help = "messages per round (default 10)"},
    [LO_REPLY_SIZE] = {"reply-size", 0, TERN__OPT_UINT, "S", NULL, 0, 16u << 20, .groups = M_FAN,
                       .help = "bytes of each (default 10000)"},
    [LO_INTERVAL] = {"interval", 0, SEC, "SECONDS", .groups = M_FAN, .help = "(default 1)"},
    [LO_RATE] = {"rate", 0, TERN__OPT_UINT, "R", NULL, 1, 10000000, .groups = M_PUB | M_MKT,
                 .help = "messages published per second (default: pubsub 1000,\n"
                         "market 200)"},
    [LO_PUB_PATH] = {"publish-path", 0, TERN__OPT_STRING, "PATH", .check = pub_path_ok,
                     .groups = M_PUB | M_MKT,
                     .help = "the publisher's path on the same host (required)"},
    [LO_INSTRUMENTS] = {"instruments", 0, TERN__OPT_UINT, "K", NULL, 1, 10000, .groups = M_MKT,
                        .help = "keys (default 100)"},
    [LO_SLOW_FRACTION] = {"slow-fraction", 0, TERN__OPT_REAL, "F", .groups = M_MKT,
                          .help = "of the subscribers, read slowly (default 0.1)"},
    [LO_SLOW_RATE] = {"slow-rate", 0, TERN__OPT_UINT, "BYTES", NULL, 1, 1ull << 32,
                      .groups = M_MKT, .help = "a slow one's bytes a second (default 16384)"},
    [LO_DRAIN] = {"drain", 0, SEC, "SECONDS", .flags = TERN__OPT_ZERO_MIN, .groups = M_MKT,
                  .help = "after publishing, before checking (default 3)"},
    [LO_CUT_AT] = {"cut-at", 0, SEC, "S", .groups = M_PUB,
                   .help = "with --cut-for T: S seconds into the measured time, every\n"
                           "subscriber's connection is cut; T seconds later they all\n"
                           "connect again and resume after the last message they got\n"
                           "(tern serve's /fanout/sub ?ack=1 and ?epoch=E&after=N, with\n"
                           "a history: --pubsub-history); a gap or a duplicate shows in\n"
                           "the sequences"},
    [LO_CUT_FOR] = {"cut-for", 0, SEC, "T", .groups = M_PUB, .help = "see --cut-at"},
    [LO_CA_FILE] = {"ca-file", 0, TERN__OPT_STRING, "FILE",
                    .help = "wss://: the CA certificates (PEM) that sign the server's\n"
                            "(default: the system's)"},
    [LO_INSECURE] = {"insecure", 'k', TERN__OPT_FLAG,
                     .help = "wss://: do not check the server's certificate"},
    [LO_JSON] = {"json", 0, TERN__OPT_FLAG, .help = "print one JSON object instead of text"},
    [LO_HELP] = {"help", 0, TERN__OPT_FLAG, .flags = TERN__OPT_CLI_ONLY, .help = "this text"},
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
    tern__opt_set s;
    if (tern__opt_init(&s, "tern load", load_opts_table, LO_COUNT) == 0) {
        s.group_names = mode_names;
        tern__opt_help(&s, f);
        tern__opt_free(&s);
    }
    fprintf(f,
            "\n"
            "Exit status: 0 after a clean run; 1 when the run failed (connection refused,\n"
            "handshake refused, a wrong echo, the server closing); 2 for bad options.\n");
}

/* Enough descriptors for the connections, raising the soft limit when the
 * hard one allows. */
static bool ensure_fds(uint32_t n) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
        return true;   /* socket() will say so */
    rlim_t need = (rlim_t)n + 32;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > need ? need : rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        if (rl.rlim_cur < need) {
            fprintf(stderr, "tern load: %u connections need %llu file descriptors; "
                            "the limit is %llu (ulimit -Hn)\n",
                    n, (unsigned long long)need, (unsigned long long)rl.rlim_max);
            return false;
        }
    }
    return true;
}

static int load_run_main(load_opts *o) {
    if (!ensure_fds(o->connections + 1))
        return 1;
    signal(SIGPIPE, SIG_IGN);

    load_run *run = calloc(1, sizeof(*run));
    if (run == NULL) {
        fprintf(stderr, "tern load: out of memory\n");
        return 1;
    }
    run->o = o;
    run->nconns = o->connections + has_publisher(o->mode);   /* and the publisher */
    hist_reset(&run->hist);
    hist_reset(&run->slow_hist);
    int err = tern_loop_new(&run->loop, NULL);
    if (err == 0) {
        run->conns = calloc(run->nconns, sizeof(*run->conns));
        for (uint32_t i = 0; run->conns && i < run->nconns; i++)
            run->conns[i].run = run;
        err = run->conns ? run_prepare(run) : -ENOMEM;
    }
    if (err == 0)
        err = tern_timer_start(run->loop, &run->watchdog, 1000, 1000, on_watchdog, run);
    int status = 0;
    if (err < 0) {
        fprintf(stderr, "tern load: %s\n", tern_strerror(err));
        status = 1;
    } else {
        run->start_ns = now_ns();
        start_more(run);
        if (!run->failed && (err = tern_loop_run(run->loop)) < 0)
            run_fail(run, "epoll: %s", tern_strerror(err));
        if (run->failed) {
            run_settle(run);
            fprintf(stderr, "tern load: %s\n", run->error);
            status = 1;
        } else {
            print_results(run);
        }
    }
    for (uint32_t i = 0; run->conns && i < run->nconns; i++)
        free(run->conns[i].last_key);
    free(run->last_pub);
    if (run->phase_timer)
        tern_timer_stop(run->phase_timer);
    if (run->tick)
        tern_timer_stop(run->tick);
    if (run->cut_timer)
        tern_timer_stop(run->cut_timer);
    if (run->watchdog)
        tern_timer_stop(run->watchdog);
    free(run->conns);
    free(run->payload);
    if (run->loop)
        tern_loop_free(run->loop);
    free(run);
    return status;
}

static int load_configure(tern__opt_set *s, load_opts *o, int argc, char **argv);

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
    load_opts o = {0};
    if (!strcmp(mode, "echo")) {
        o = (load_opts){.mode = LOAD_ECHO, .connections = 100, .size = 64,
                        .duration_ms = 5000, .warmup_ms = 1000};
    } else if (!strcmp(mode, "pipeline")) {
        o = (load_opts){.mode = LOAD_PIPELINE, .connections = 1, .size = 16, .depth = 8,
                        .iterations = 200000, .warmup_iterations = 20000};
    } else if (!strcmp(mode, "fanout")) {
        o = (load_opts){.mode = LOAD_FANOUT, .connections = 1000, .size = 16, .replies = 10,
                        .reply_size = 10000, .interval_ms = 1000, .duration_ms = 10000,
                        .warmup_ms = 2000};
    } else if (!strcmp(mode, "market")) {
        o = (load_opts){.mode = LOAD_MARKET, .connections = 5000, .size = 512, .rate = 200,
                        .instruments = 100, .slow_fraction = 0.1, .slow_rate = 16384,
                        .duration_ms = 10000, .warmup_ms = 2000, .drain_ms = 3000};
    } else if (!strcmp(mode, "pubsub")) {
        o = (load_opts){.mode = LOAD_PUBSUB, .connections = 1000, .size = 256, .rate = 1000,
                        .duration_ms = 10000, .warmup_ms = 2000};
    } else {
        fprintf(stderr, "tern load: unknown mode '%s' (echo, pipeline, fanout, pubsub or "
                        "market)\n", mode);
        usage(stderr);
        return 2;
    }

    tern__opt_set s;
    if (tern__opt_init(&s, "tern load", load_opts_table, LO_COUNT) < 0) {
        fprintf(stderr, "tern load: out of memory\n");
        return 1;
    }
    s.group_names = mode_names;
    s.group = (int)o.mode;
    int status = load_configure(&s, &o, argc, argv);
    if (status < 0)
        status = load_run_main(&o);
    tern__opt_free(&s);
    return status;
}

/* The options of argv (argv[1] the mode) into o; -1 when they are good, or
 * the exit status (help: 0; bad options: 2, said why). */
static int load_configure(tern__opt_set *s, load_opts *o, int argc, char **argv) {
    const char *mode = argv[1];
    const char *name = mode_names[o->mode];
    if (tern__opt_parse_argv(s, argc - 1, argv + 1) < 0) {
        fprintf(stderr, "%s: %s\n", name, s->err);
        return 2;
    }
    if (tern__opt_uint(s, LO_HELP)) {
        usage(stdout);
        return 0;
    }
    if (s->nargs > 0) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", name, s->args[0]);
        return 2;
    }
#define GIVEN(i) tern__opt_given(s, i)
    o->url = tern__opt_str(s, LO_URL);
    if (GIVEN(LO_CONNS)) o->connections = (uint32_t)tern__opt_uint(s, LO_CONNS);
    if (GIVEN(LO_SIZE)) o->size = tern__opt_uint(s, LO_SIZE);
    if (GIVEN(LO_DURATION)) o->duration_ms = tern__opt_uint(s, LO_DURATION);
    if (GIVEN(LO_WARMUP)) o->warmup_ms = tern__opt_uint(s, LO_WARMUP);
    if (GIVEN(LO_DEPTH)) o->depth = (uint32_t)tern__opt_uint(s, LO_DEPTH);
    if (GIVEN(LO_ITER)) o->iterations = tern__opt_uint(s, LO_ITER);
    if (GIVEN(LO_WARMUP_ITER)) o->warmup_iterations = tern__opt_uint(s, LO_WARMUP_ITER);
    if (GIVEN(LO_REPLIES)) o->replies = (uint32_t)tern__opt_uint(s, LO_REPLIES);
    if (GIVEN(LO_REPLY_SIZE)) o->reply_size = tern__opt_uint(s, LO_REPLY_SIZE);
    if (GIVEN(LO_INTERVAL)) o->interval_ms = tern__opt_uint(s, LO_INTERVAL);
    if (GIVEN(LO_RATE)) o->rate = tern__opt_uint(s, LO_RATE);
    if (GIVEN(LO_PUB_PATH)) strcpy(o->pub_path, tern__opt_str(s, LO_PUB_PATH));
    if (GIVEN(LO_INSTRUMENTS)) o->instruments = (uint32_t)tern__opt_uint(s, LO_INSTRUMENTS);
    if (GIVEN(LO_SLOW_FRACTION)) o->slow_fraction = tern__opt_real(s, LO_SLOW_FRACTION);
    if (GIVEN(LO_SLOW_RATE)) o->slow_rate = tern__opt_uint(s, LO_SLOW_RATE);
    if (GIVEN(LO_DRAIN)) o->drain_ms = tern__opt_uint(s, LO_DRAIN);
    if (GIVEN(LO_CUT_AT)) o->cut_at_ms = tern__opt_uint(s, LO_CUT_AT);
    if (GIVEN(LO_CUT_FOR)) o->cut_for_ms = tern__opt_uint(s, LO_CUT_FOR);
    o->ca_file = tern__opt_str(s, LO_CA_FILE);
    o->insecure = tern__opt_uint(s, LO_INSECURE);
    o->json = tern__opt_uint(s, LO_JSON);
#undef GIVEN
    if (o->url == NULL) {
        fprintf(stderr, "tern load %s: --url is required\n", mode);
        return 2;
    }
    const char *why = NULL;
    if (tern_url_parse(o->url, &o->where, &why) == 0 && strlen(o->where.target) >= LOAD_PATH_MAX)
        why = "path too long";
    if (why != NULL) {
        fprintf(stderr, "tern load %s: bad --url %s: %s\n", mode, o->url, why);
        return 2;
    }
    if (has_publisher(o->mode) && o->pub_path[0] == '\0') {
        fprintf(stderr, "%s: --publish-path is required\n", name);
        return 2;
    }
    if ((o->cut_at_ms != 0) != (o->cut_for_ms != 0) ||
        (o->cut_for_ms && o->cut_at_ms + o->cut_for_ms >= o->duration_ms)) {
        fprintf(stderr, "%s: --cut-at and --cut-for go together, and the cut ends before "
                        "--duration\n", name);
        return 2;
    }
    size_t min_size = o->mode == LOAD_MARKET ? LOAD_HEAD_BYTES : LOAD_STAMP_LEN;
    if (has_publisher(o->mode) && o->size < min_size) {
        fprintf(stderr, "%s: --size is at least %zu (the stamp%s)\n", name, min_size,
                o->mode == LOAD_MARKET ? " and the key" : "");
        return 2;
    }
    if (o->mode == LOAD_PIPELINE &&
        (uint64_t)o->depth * (o->size + LOAD_FRAME_MAX_HEADER) > LOAD_MAX_BATCH) {
        fprintf(stderr, "tern load pipeline: --depth x --size is over %u bytes a batch\n",
                LOAD_MAX_BATCH);
        return 2;
    }
    return -1;
}
