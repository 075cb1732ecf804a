/* tern load's parts: the runner (load_run.c) drives the connections and
 * the phases of a run and calls its mode (load_echo.c, load_pipeline.c,
 * load_fanout.c, load_pubsub.c, load_market.c) through load_mode_ops;
 * the statistics (load_stats.c) print what the mode measured; the command
 * (load.c) reads the options. What each mode does is said at the top of
 * its file; why tern load is made as it is, at the top of load_run.c. */
#ifndef TERN_APP_LOAD_H
#define TERN_APP_LOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

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

/* The modes, in the order of the option table's groups (load.c). */
enum load_mode { LOAD_ECHO, LOAD_PIPELINE, LOAD_FANOUT, LOAD_PUBSUB, LOAD_MARKET, LOAD_MODES };

typedef struct load_opts {
    enum load_mode mode;
    const char *url;
    tern_url where;                  /* url parsed: its target is the subscribers' path */
    const char *ca_file;             /* wss://: the server's CA (NULL: the system's) */
    bool insecure;                   /* wss://: no certificate check */
    uint32_t connections;
    uint64_t size;
    uint64_t duration_ms, warmup_ms;  /* echo, fanout, pubsub, market */
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

/* ---- latency histogram (load_stats.c) -------------------------------------
 *
 * Log-linear, in nanoseconds: values below 2^SUB_BITS have a bucket each;
 * above, each power of two is cut into 2^SUB_BITS equal buckets, so a
 * bucket is at most 1/64 of its values wide (HdrHistogram's layout with
 * one significant figure and a bit). Recording computes the bucket from
 * the value's top bit (load_hist_bucket: a few instructions, once per
 * message); the quantiles are the library's one histogram logic
 * (tern_histogram_quantile) over the layout's table of upper bounds,
 * whose bucket for a value is the one load_hist_bucket computes
 * (test_histogram checks it). */
#define LOAD_HIST_SUB_BITS 6
#define LOAD_HIST_SUB (1u << LOAD_HIST_SUB_BITS)
#define LOAD_HIST_MAX_BITS 40   /* 2^40 ns is 18 minutes; longer is counted there */
#define LOAD_HIST_BUCKETS ((LOAD_HIST_MAX_BITS - LOAD_HIST_SUB_BITS + 1) * LOAD_HIST_SUB)

/* Invariant: count is the sum of bucket[], sum the sum of the values
 * recorded, min and max exact (min is UINT64_MAX while count is 0);
 * bucket[LOAD_HIST_BUCKETS] counts the values over the last bound. */
typedef struct load_hist {
    uint64_t bucket[LOAD_HIST_BUCKETS + 1];
    uint64_t count, sum, min, max;
} load_hist;

/* The bucket of v in the layout: v itself below LOAD_HIST_SUB; above, its
 * power of two (the top bit's place, past SUB_BITS) times LOAD_HIST_SUB,
 * plus its SUB_BITS bits under the top one, with the top one, which
 * counts the first LOAD_HIST_SUB buckets; LOAD_HIST_BUCKETS over the last
 * bound (2^MAX_BITS - 1). */
static inline size_t load_hist_bucket(uint64_t v) {
    if (v < LOAD_HIST_SUB)
        return (size_t)v;
    if (v >> LOAD_HIST_MAX_BITS)
        return LOAD_HIST_BUCKETS;
    unsigned shift = 63u - (unsigned)__builtin_clzll(v) - LOAD_HIST_SUB_BITS;
    return (size_t)shift * LOAD_HIST_SUB + (size_t)(v >> shift);
}

void load_hist_reset(load_hist *h);
void load_hist_record(load_hist *h, uint64_t v);
/* The value at quantile q (0..1]: the middle of its bucket, kept within
 * [min, max] so that p100 is the max and nothing is below the min. */
uint64_t load_hist_quantile(const load_hist *h, double q);

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

/* ---- the mode interface --------------------------------------------------- */

typedef struct load_run load_run;
typedef struct load_results load_results;

/* The modes with a publisher (pubsub, market) share load_pubsub.c's
 * publisher and subscribers; this is how they differ. */
typedef struct load_pub_kind {
    size_t stamp_off;   /* where a message's stamp (send time, seq) starts */
    /* A published message whole on subscriber c, its stamp read. */
    void (*delivered)(load_conn *c, const uint8_t *msg, uint64_t sent, uint64_t seq);
    /* Each tick, before the publishing (NULL: nothing). */
    void (*tick)(load_run *run);
    /* Writes message seq's head before its stamp (NULL: nothing). */
    void (*head)(load_run *run, uint8_t *msg, uint64_t seq);
} load_pub_kind;

/* What a mode does; the runner calls nothing else of it. NULL hooks are
 * skipped (the runner's default is said at each). tern load has one
 * thread; no hook is called once the run has failed. */
typedef struct load_mode_ops {
    const char *name;      /* "echo": the command's word and the JSON's "mode" */
    /* Non-NULL: conns[connections] is one more connection, the publisher
     * (load_pubsub.c), and the others subscribe. */
    const load_pub_kind *pub;
    load_opts defaults;    /* the mode's option values when not given */
    /* The mode's own checks of the options: NULL, or what is wrong. */
    const char *(*check)(const load_opts *o);
    /* Once the connections exist, before any opens: the payload and the
     * mode's state. 0, or a negative errno. */
    int (*prepare)(load_run *run);
    /* Every connection is open: set the phase, arm its timer (or not:
     * the pipeline's phases end by count) and send the first messages. */
    void (*begin)(load_run *run);
    /* A whole message on an open connection, where it lies in the loop's
     * read buffer. */
    void (*on_message)(load_conn *c, const uint8_t *p, size_t len, int opcode);
    /* The measured time begins after the warm-up; the runner has zeroed
     * the measured counters. */
    void (*measure_begin)(load_run *run);
    /* The measured time is over (t1_ns set). NULL: the run ends (every
     * connection closes); a mode that drains sets PH_DRAIN and arms the
     * phase timer, after which drain_end is called. */
    void (*measure_end)(load_run *run);
    void (*drain_end)(load_run *run);
    /* An open subscriber the server closed: true when that is a figure of
     * the run (counted by the mode), not its end. NULL: its end. */
    bool (*closed_is_figure)(load_conn *c);
    /* The first line of the text results. */
    void (*headline)(const load_run *run, FILE *f);
    /* The mode's figures into r, beyond those load_stats_common fills. */
    void (*results)(const load_run *run, load_results *r);
} load_mode_ops;

/* The modes by enum load_mode (load.c). */
extern const load_mode_ops *const load_modes[LOAD_MODES];
extern const load_mode_ops load_echo_ops, load_pipeline_ops, load_fanout_ops, load_pubsub_ops,
    load_market_ops;

/* ---- the run -------------------------------------------------------------- */

enum load_phase { PH_CONNECT, PH_WARMUP, PH_MEASURE, PH_DRAIN, PH_CLOSE };

/* What the measured time counts: zeroed when it begins (the runner's
 * on_phase_timer), so a warm-up counts nothing. */
typedef struct load_measured {
    uint64_t messages;
    load_hist hist;
    uint64_t rounds_sent, rounds, late, skipped;   /* fanout */
    uint64_t published, pub_blocked, pub_shed, gaps;   /* pubsub, market */
    uint64_t slow_messages, key_reorders;             /* market */
    load_hist slow_hist;                              /* market */
} load_measured;

/* fanout's (load_fanout.c): round k is due at load_fanout.c's fanout_due
 * from sched_ns; cursor is the first round not yet due. */
typedef struct load_fanout_state {
    uint64_t sched_ns, cursor;
} load_fanout_state;

/* The publisher's (load_pubsub.c; pubsub and market): at most cap
 * messages a tick; due is what the rate owed since start_ns at the last
 * tick, seq the last seq published. The seqs published while measuring
 * are [seq_from, seq_to] (seq_to is UINT64_MAX until the measured time
 * ends); their deliveries are what messages, gaps and hist count,
 * whenever they arrive (a short drain after the measured time lets the
 * last ones in). */
typedef struct load_publisher_state {
    uint32_t cap;
    uint64_t start_ns, due, seq;
    uint64_t seq_from, seq_to;
} load_publisher_state;

/* market's (load_market.c): last_pub[k] is the seq of key k's latest
 * message published (0: none); nslow the slow readers; the figures of the
 * whole run (disconnects) and of the end of the drain (stale_*); rng
 * draws the keys; refill_tick is the last 100 ms tick the slow readers
 * got their grain. */
typedef struct load_market_state {
    uint64_t *last_pub;
    uint32_t nslow;
    uint64_t disconnects, stale_keys, stale_fast;
    uint64_t rng, refill_tick;
} load_market_state;

/* pubsub's cut (load_pubsub.c): when it came and when the reconnects
 * began (0: not yet), the subscribers still to restart (next_restart: the
 * next one), and how their resumes went: acks_due are still unanswered,
 * resumed_ns is when the last was answered. */
typedef struct load_cut_state {
    uint64_t cut_ns, reconnect_ns, resumed_ns;
    uint64_t behind_ns;   /* the last receipt, after the reconnects, of a message over 500 ms old */
    uint32_t next_restart, resumed, not_resumed, acks_due;
    uint64_t replayed;
    tern_timer *timer;
} load_cut_state;

/* The whole run.
 * Invariants: every connection before next_start has been started;
 * handshaking counts those in CONNECTING, opened those that reached OPEN
 * (and may have gone on), live those in CONNECTING, OPEN or CLOSING. The
 * loop stops once the run failed or is closing and live is 0, so nothing
 * of a connection outlives the loop. The measured counters (m) cover
 * exactly what completed while phase is PH_MEASURE, between t0_ns and
 * t1_ns (pubsub's: the deliveries of the seqs published then). A mode's
 * own state is its substruct (fanout, publisher, market, cut). */
struct load_run {
    const load_opts *o;
    const load_mode_ops *mode;
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
    load_fanout_state fanout;
    load_publisher_state publisher;
    load_market_state market;
    load_cut_state cut;
    tern_timer *tick;        /* fanout's requests, pubsub's publishing */
    /* measurement */
    uint64_t start_ns, open_ns, t0_ns, t1_ns;
    load_measured m;
    /* timers and the stall watchdog */
    tern_timer *phase_timer, *watchdog;
    uint64_t progress, progress_seen;
    uint64_t stalled_ms;
    /* ends */
    uint32_t unclean;        /* close handshakes that did not end well */
    char unclean_why[160];   /* the first one's story */
    bool failed;
    char error[640];
};

/* ---- the runner's services to the modes (load_run.c) ---------------------- */

/* The monotonic clock in nanoseconds. */
uint64_t load_now_ns(void);
/* Ends the run with an error. The first error is the cause; what follows
 * from it (other connections failing) is not reported. */
void load_fail(load_run *run, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* c's place in run->conns, for the messages. */
unsigned load_conn_no(const load_conn *c);
bool load_is_publisher(const load_conn *c);
/* One binary message on c (false: the run failed). The library copies and
 * masks it into the loop's cork; the batch's sends leave in one write. */
bool load_send(load_conn *c, const void *data, size_t len);
/* The phase timer, (re-)armed to fire in ms. */
void load_arm_phase(load_run *run, uint64_t ms);
/* The end: every open connection closes with 1000. */
void load_close_all(load_run *run);
/* Pause (or resume) reading c. */
void load_set_paused(load_conn *c, bool paused);
/* The connections not started yet (or cut and resuming), as many at
 * once as LOAD_MAX_HANDSHAKES allows. */
void load_start_more(load_run *run);
void load_restart_more(load_run *run);
/* The timed modes' start: the warm-up, or the measured time when there is
 * none, from now (t0_ns), the phase timer armed for its end. */
void load_begin_timed(load_run *run);
/* fn(timer, run) every millisecond (fanout's requests, pubsub's
 * publishing), as run->tick. */
void load_start_tick(load_run *run, void (*fn)(tern_timer *, void *));

/* Little-endian 64-bit numbers: an echo's sequence number, a published
 * message's stamp. */
uint64_t load_get_le64(const uint8_t *p);
void load_put_le64(uint8_t *p, uint64_t v);
/* A frame's header as the server writes it (unmasked). */
size_t load_server_header_len(uint64_t len);

/* load_pubsub.c's parts that market uses too. */
const char *load_pub_check(const load_opts *o);
int load_pub_prepare(load_run *run);
void load_pub_begin(load_run *run);
void load_sub_message(load_conn *c, const uint8_t *p, size_t len, int opcode);
void load_pub_measure_begin(load_run *run);
/* With a cut: a subscriber's query, ack=1 or where it resumes (after sep). */
void load_sub_query(const load_conn *c, char sep, char *out, size_t cap);

/* The run of options o (checked): 0 after a clean run, its figures
 * printed; 1 when it failed, said why on stderr. */
int load_run_main(const load_opts *o);

/* ---- statistics (load_stats.c) -------------------------------------------- */

/* Every figure tern load reports, for every mode; each mode fills those
 * its rows in load_stats.c's table name. cut: pubsub's --cut was given
 * (else its "cut" object is null). */
struct load_results {
    const char *mode, *url, *publish_path;
    uint64_t connections, size, depth, iterations, warmup_iterations, replies, reply_size,
        rate, slow, instruments, slow_rate;
    double interval_s, warmup_s, duration_s, drain_s, connect_s, seconds;
    uint64_t rounds_sent, rounds, late, skipped, missed;
    uint64_t published, publisher_blocked, shed, expected;
    uint64_t messages, echo_bytes, gaps;
    double publish_rate, msg_per_s, mb_per_s;
    double lat_mean, lat_p50, lat_p99, lat_max;
    uint64_t slow_messages;
    double slow_msg_per_s, slow_p50, slow_p99;
    uint64_t disconnects, stale_keys, stale_keys_fast, key_reorders;
    uint64_t unclean_closes;
    bool cut;
    double cut_at_s, cut_for_s, reconnect_s, resumed_after_s, caught_up_after_s;
    uint64_t resumed, not_resumed, unanswered, replayed;
};

/* The figures every mode has (the options, the clock, the messages and
 * their latency) into r. */
void load_stats_common(const load_run *run, load_results *r);
/* The results of a clean run, as text or JSON (--json), to stdout. */
void load_stats_print(const load_run *run);

#endif
