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
 * message:
 * - replies are read into the loop's one shared read buffer and checked
 *   (echo) or only counted (pipeline) where they lie: nothing is allocated
 *   or copied per message;
 * - messages are masked once, at start. Every frame of the run uses the
 *   same masking key, so the payload after the sequence number (echo) or
 *   the whole batch (pipeline) is one shared buffer and a send is a writev
 *   of a few bytes of per-connection header plus that buffer. RFC 6455
 *   wants a fresh key per frame to keep browser scripts from steering the
 *   bytes that intermediaries see; a load generator pointed at a server by
 *   its operator has no such attacker, and a server must unmask whatever
 *   key it gets;
 * - one clock read per echo: the time the echo completed is also the time
 *   the next message is sent.
 *
 * Any error ends the run at once (exit 1) with the first error's message;
 * the measurement is only printed after a clean run. */
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/rand.h>

#include "app/app.h"
#include "loop/loop.h"
#include "tern/tern.h"
#include "http/parser.h"
#include "ws/frame.h"
#include "ws/handshake.h"

#define LOAD_MAX_HANDSHAKES 256   /* connections being opened at once: kind to the accept queue */
#define LOAD_HEAD_MAX 4096        /* the 101 response's head */
#define LOAD_HOST_MAX 256
#define LOAD_PATH_MAX 2048
#define LOAD_CTR_LEN 8            /* an echo message starts with its sequence number */
#define LOAD_STALL_MS 10000       /* nothing received for this long: the server is stuck */
#define LOAD_CLOSE_MS 2000        /* for the close handshakes at the end */
#define LOAD_MAX_BATCH (1u << 30) /* bytes of the pipeline's batch buffer */
#define LOAD_STAMP_LEN 16         /* a published message starts with its send time and seq */
#define LOAD_KEY_DIGITS 4         /* market: a message starts with 4, "0042", and the key in it */
#define LOAD_KEY_PREFIX (1 + LOAD_KEY_DIGITS)
#define LOAD_HEAD_BYTES (LOAD_KEY_PREFIX + LOAD_STAMP_LEN)   /* what a subscriber keeps */
#define LOAD_PUB_BYTES (1u << 20) /* the publisher writes at most this much per tick */

enum load_mode { LOAD_ECHO, LOAD_PIPELINE, LOAD_FANOUT, LOAD_PUBSUB, LOAD_MARKET };

typedef struct load_opts {
    enum load_mode mode;
    const char *url;
    char host[LOAD_HOST_MAX];        /* as resolved */
    char authority[LOAD_HOST_MAX + 8];  /* the Host header: host[:port] as in the URL */
    char path[LOAD_PATH_MAX];        /* request target, starts with '/' */
    unsigned port;
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
    CS_NEW,          /* not started */
    CS_CONNECTING,   /* connect() in progress */
    CS_HANDSHAKE,    /* upgrade request sent, reading the 101 */
    CS_OPEN,         /* the run */
    CS_CLOSING,      /* our close frame is sent or queued; waiting for the server's and its EOF */
    CS_DONE,         /* socket closed */
};

/* What a connection holds only while it is being opened. */
typedef struct load_handshake {
    char accept[TERN__WS_ACCEPT_LEN + 1];   /* the Sec-WebSocket-Accept we expect */
    size_t len;
    char head[LOAD_HEAD_MAX];
} load_handshake;

struct load_run;

/* One client connection.
 * Invariants:
 * - io.fd is open exactly in CONNECTING..CLOSING; TERN__IO_OUT is in io.events
 *   only while connecting or while out[] holds bytes the kernel refused.
 * - out[0..out_cnt) is what is left of the frame being written. A frame
 *   (message, batch, pong, close) is started only when out_cnt is 0, so
 *   frames never interleave; a pong or close that comes up meanwhile waits
 *   in pong_pending / close_pending.
 * - hs is allocated exactly in CONNECTING and HANDSHAKE.
 * - Frame reading (echo, and the close in both modes): rhdr holds the
 *   rhdr_have bytes of a header split across reads; in_frame says a header
 *   was read and frame_left payload bytes of it are still to come;
 *   msg_open says a data message has begun and not ended, msg_off how many
 *   of its payload bytes have come.
 * - Echo: awaiting is true from the send of message number seq until its
 *   whole echo has arrived; sent_ns is when it was sent.
 * - Pipeline: a batch of `batch` messages is in flight while expect (the
 *   echo bytes it still owes) is non-zero; left counts the messages of the
 *   current phase not yet sent.
 * - Fanout: awaiting is true from a request (due at sent_ns) until the
 *   expect bytes of its replies have all come.
 * - Pubsub: conns[connections] is the publisher; the others subscribe. */
typedef struct load_conn {
    tern__io io;
    struct load_run *run;
    uint8_t state;
    uint8_t out_cnt;
    uint8_t rhdr_have;
    uint8_t frame_opcode;
    bool frame_fin, in_frame, msg_open;
    bool awaiting;
    bool pong_pending, close_pending, close_received;
    uint8_t ctl_len;                   /* control payload gathered in ctl */
    uint8_t head_len;                  /* bytes of msg_head that are the frame header */
    uint64_t frame_left;
    uint64_t msg_off;
    struct iovec out[2];
    load_handshake *hs;
    /* echo */
    uint64_t seq;
    uint64_t sent_ns;
    uint8_t msg_head[TERN__WS_MAX_HEADER + LOAD_CTR_LEN];   /* header, masked sequence number */
    /* pipeline; fanout: expect is what the round in flight still owes */
    uint64_t left;
    uint64_t expect;
    uint32_t batch;
    /* pubsub subscriber: the first bytes of the message being read, and
     * the seq the next one should have once one has come (seen) */
    bool seen;
    uint8_t stamp[LOAD_HEAD_BYTES];
    uint64_t next_seq;
    /* market: a slow reader has `tokens` bytes it may still read (paused:
     * reading is off until the tick gives it more); last_key[k] is the seq
     * of the newest message of key k it got (0: none) */
    bool slow, paused;
    uint32_t tokens;
    uint64_t *last_key;
    /* pubsub with a cut: the server's word on where the subscription
     * starts (a text frame: ack[0..ack_len)), its epoch once known, and
     * the offset between the topic's seqs and the publisher's (delta:
     * topic seq = publisher seq + delta, known from the first message
     * after the first ack) */
    bool in_ack, delta_known, resuming;
    uint8_t ack_len;
    char epoch[17];
    uint64_t ack_seq;
    int64_t delta;
    char ack[128];
    /* control frames: what came in, what goes out */
    uint8_t rhdr[TERN__WS_MAX_HEADER];
    uint8_t ctl[125];
    uint8_t ctl_out[TERN__WS_MAX_HEADER + 125];
} load_conn;

enum load_phase { PH_CONNECT, PH_WARMUP, PH_MEASURE, PH_DRAIN, PH_CLOSE };

/* The whole run.
 * Invariants: every connection before next_start has been started;
 * handshaking counts those in CONNECTING or HANDSHAKE, opened those that
 * reached OPEN (and may have gone on), done those in DONE. The measured
 * counters (messages, hist) cover exactly the echoes completed while
 * phase is PH_MEASURE, between t0_ns and t1_ns (and so do fanout's and
 * pubsub's counters marked measured). */
typedef struct load_run {
    const load_opts *o;
    tern_loop *loop;
    load_conn *conns;
    uint32_t nconns;         /* o->connections, and the publisher in pubsub */
    struct sockaddr_in addr;
    enum load_phase phase;
    uint32_t next_start, handshaking, opened, ready, finished, done;
    uint8_t key[4];          /* the masking key of every frame */
    /* echo: the payload. plain[i] is what byte i of an echo must be for
     * i >= ctr_len; masked[] is plain[ctr_len..] masked, sent as is. */
    size_t ctr_len;
    uint8_t *plain, *masked;
    /* pipeline: `depth` masked frames back to back */
    uint8_t *batch;
    size_t frame_len;        /* one frame of the batch */
    size_t echo_len;         /* one echoed frame: the server's header + size */
    /* fanout: the request (one masked frame), the bytes of a round's
     * replies, and round k's schedule (fanout_due) */
    uint8_t *req;
    size_t req_len, reply_len;
    uint64_t sched_ns, cursor;
    uint64_t rounds_sent, rounds, late, skipped;   /* measured */
    /* pubsub: pub_cap frames of pub_frame_len bytes, masked, to be stamped */
    uint8_t *pub;
    size_t pub_frame_len;
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

static void conn_done(load_conn *c);
static bool is_publisher(const load_conn *c);
static void run_begin(load_run *run);
static void start_more(load_run *run);
static void restart_more(load_run *run);
static void frames_feed(load_conn *c, const uint8_t *p, size_t n);

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

/* ---- writing -------------------------------------------------------------- */

/* Writes what out[] holds; what the kernel refuses stays there for
 * TERN__IO_OUT. Returns false when the run failed. */
static bool conn_flush(load_conn *c) {
    while (c->out_cnt > 0) {
        struct msghdr mh = {.msg_iov = c->out, .msg_iovlen = c->out_cnt};
        ssize_t w = sendmsg(c->io.fd, &mh, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return true;
            if (c->state == CS_CLOSING) {   /* the server went first: nothing more to say */
                note_unclean(c, "send during the close: %s", strerror(errno));
                conn_done(c);
                return true;
            }
            run_fail(c->run, "connection %u: send: %s", conn_no(c), strerror(errno));
            return false;
        }
        size_t n = (size_t)w;
        while (n > 0 && n >= c->out[0].iov_len) {
            n -= c->out[0].iov_len;
            c->out[0] = c->out[1];
            c->out_cnt--;
        }
        if (n > 0) {
            c->out[0].iov_base = (char *)c->out[0].iov_base + n;
            c->out[0].iov_len -= n;
        }
    }
    return true;
}

/* A control frame (pong, close) from ctl_out, masked with the run's key. */
static void conn_queue_control(load_conn *c, uint8_t opcode, const uint8_t *payload, size_t len) {
    size_t hl = tern__ws_write_header(c->ctl_out, true, false, opcode, len, c->run->key);
    memcpy(c->ctl_out + hl, payload, len);
    tern__ws_mask(c->ctl_out + hl, len, c->run->key, 0);
    c->out[0] = (struct iovec){.iov_base = c->ctl_out, .iov_len = hl + len};
    c->out_cnt = 1;
}

/* Writes the frame in progress, then the pong and the close that waited
 * for it, and sets the epoll interest to match what is left. */
static void conn_pump(load_conn *c) {
    for (;;) {
        if (c->out_cnt > 0 && !conn_flush(c))
            return;
        if (c->state == CS_DONE)
            return;
        if (c->out_cnt > 0)
            break;
        if (c->pong_pending) {
            c->pong_pending = false;
            conn_queue_control(c, TERN__WS_OP_PONG, c->ctl, c->ctl_len);
            continue;
        }
        if (c->close_pending) {
            c->close_pending = false;
            static const uint8_t normal[2] = {1000 >> 8, 1000 & 0xFF};
            conn_queue_control(c, TERN__WS_OP_CLOSE, normal, sizeof(normal));
            continue;
        }
        break;
    }
    int err = tern__io_set(c->run->loop, &c->io,
                           (c->paused ? 0 : TERN__IO_IN) | (c->out_cnt ? TERN__IO_OUT : 0));
    if (err < 0)
        run_fail(c->run, "connection %u: epoll: %s", conn_no(c), tern_strerror(err));
}

/* Echo: sends message number seq+1 at time now. */
static void echo_send(load_conn *c, uint64_t now) {
    load_run *run = c->run;
    c->seq++;
    uint8_t *ctr = c->msg_head + c->head_len;
    for (size_t i = 0; i < run->ctr_len; i++)
        ctr[i] = (uint8_t)(c->seq >> (8 * i)) ^ run->key[i & 3];
    c->out[0] = (struct iovec){.iov_base = c->msg_head, .iov_len = c->head_len + run->ctr_len};
    c->out_cnt = 1;
    if (run->o->size > run->ctr_len)
        c->out[c->out_cnt++] = (struct iovec){.iov_base = run->masked,
                                              .iov_len = run->o->size - run->ctr_len};
    c->awaiting = true;
    c->sent_ns = now;
    conn_pump(c);
}

/* Pipeline: sends the next batch of the phase (left > 0). */
static void pipeline_send(load_conn *c) {
    load_run *run = c->run;
    uint64_t k = c->left < run->o->depth ? c->left : run->o->depth;
    c->batch = (uint32_t)k;
    c->expect = k * run->echo_len;
    c->out[0] = (struct iovec){.iov_base = run->batch, .iov_len = k * run->frame_len};
    c->out_cnt = 1;
    conn_pump(c);
}

static void conn_begin_close(load_conn *c) {
    c->state = CS_CLOSING;
    c->close_pending = true;
    conn_pump(c);
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

/* ---- reading ------------------------------------------------------------- */

static void conn_lost(load_conn *c, int err) {
    if (c->state == CS_CLOSING) {
        if (err != 0)
            note_unclean(c, "%s during the close handshake", strerror(err));
        else if (!c->close_received)
            note_unclean(c, "EOF without a close frame");
        conn_done(c);
        return;
    }
    if (c->run->o->mode == LOAD_MARKET && !is_publisher(c)) {
        c->run->disconnects++;
        conn_done(c);
        return;
    }
    if (err != 0)
        run_fail(c->run, "connection %u: %s during the run", conn_no(c), strerror(err));
    else
        run_fail(c->run, "connection %u: the server closed the connection (EOF) during the run",
                 conn_no(c));
}

/* The first byte of the echo payload that differs from what was sent
 * (only called once a difference is known). */
static uint64_t echo_first_diff(load_conn *c, const uint8_t *p, size_t len) {
    load_run *run = c->run;
    for (size_t i = 0; i < len; i++) {
        uint64_t off = c->msg_off + i;
        uint8_t want = off < run->ctr_len ? (uint8_t)(c->seq >> (8 * off)) : run->plain[off];
        if (p[i] != want)
            return off;
    }
    return c->msg_off + len;
}

/* Echo: checks len payload bytes of the echo at offset msg_off. */
static bool echo_check(load_conn *c, const uint8_t *p, size_t len) {
    load_run *run = c->run;
    uint64_t off = c->msg_off;
    const uint8_t *q = p;
    size_t n = len;
    for (; n > 0 && off < run->ctr_len; off++, q++, n--)
        if (*q != (uint8_t)(c->seq >> (8 * off)))
            goto differs;
    if (n > 0 && memcmp(q, run->plain + off, n) != 0)
        goto differs;
    return true;
differs:
    run_fail(run, "connection %u: wrong echo: message %llu differs from what was sent at byte %llu",
             conn_no(c), (unsigned long long)c->seq,
             (unsigned long long)echo_first_diff(c, p, len));
    return false;
}

/* Echo: message number seq is back whole. */
static void echo_done(load_conn *c) {
    load_run *run = c->run;
    c->awaiting = false;
    if (c->state != CS_OPEN)   /* the one in flight when the run ended */
        return;
    uint64_t now = now_ns();
    if (run->phase == PH_MEASURE) {
        run->messages++;
        hist_record(&run->hist, now - c->sent_ns);
    }
    echo_send(c, now);
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

/* The topic's seq of the last message this subscriber got (what it
 * resumes after). */
static uint64_t last_topic_seq(const load_conn *c) {
    if (!c->seen || !c->delta_known)
        return c->ack_seq;
    return (uint64_t)((int64_t)(c->next_seq - 1) + c->delta);
}

/* The server's text message: {"epoch":"E","seq":N} where a subscription
 * starts, with ,"resumed":B,"replayed":K after a resume. */
static void ack_done(load_conn *c) {
    load_run *run = c->run;
    char e[17];
    unsigned long long seq;
    c->ack[c->ack_len] = '\0';
    if (sscanf(c->ack, "{\"epoch\":\"%16[0-9a-f]\",\"seq\":%llu", e, &seq) != 2) {
        run_fail(run, "connection %u: not where the subscription starts: %s", conn_no(c), c->ack);
        return;
    }
    if (!c->resuming) {
        memcpy(c->epoch, e, sizeof(e));
        c->ack_seq = seq;
        return;
    }
    c->resuming = false;
    const char *r = strstr(c->ack, "\"replayed\":");
    run->replayed += r ? strtoull(r + 11, NULL, 10) : 0;
    if (strstr(c->ack, "\"resumed\":true"))
        run->resumed++;
    else
        run->not_resumed++;   /* what it missed shows as gaps */
    memcpy(c->epoch, e, sizeof(e));
    if (--run->acks_due == 0)
        run->resumed_ns = now_ns();
}

/* A data frame's header: one binary frame of the published size. */
static bool sub_frame_begin(load_conn *c, const tern__ws_header *h) {
    load_run *run = c->run;
    if (is_publisher(c)) {
        run_fail(run, "connection %u: the server sent the publisher a message", conn_no(c));
        return false;
    }
    if (h->opcode == TERN__WS_OP_TEXT && h->fin && run->o->cut_for_ms &&
        h->payload_len < sizeof(c->ack)) {   /* where the subscription starts */
        c->in_ack = true;
        c->msg_open = true;
        return true;
    }
    if (h->opcode != TERN__WS_OP_BINARY || !h->fin || h->payload_len != run->o->size) {
        run_fail(run, "connection %u: a published message came as a %s%s frame of %llu bytes, "
                      "not one binary frame of %llu", conn_no(c),
                 h->fin ? "" : "non-final ", h->opcode == TERN__WS_OP_TEXT ? "text" : "binary",
                 (unsigned long long)h->payload_len, (unsigned long long)run->o->size);
        return false;
    }
    c->msg_open = true;
    return true;
}

/* A published message is whole: its stamp says when it was sent and its
 * place in the publisher's sequence. */
static void market_message(load_conn *c, uint64_t sent, uint64_t seq);

static void sub_message(load_conn *c) {
    load_run *run = c->run;
    const uint8_t *st = c->stamp + stamp_off(run);
    uint64_t sent = get_le64(st), seq = get_le64(st + 8);
    if (run->o->mode == LOAD_MARKET) {
        market_message(c, sent, seq);
        return;
    }
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

/* Market: a message of key k whole. A conflating server sends a key's
 * updates in order and its queue in the order of their latest update, so
 * seqs still rise on every connection, with gaps where it conflated (or
 * dropped); a key that goes back is counted. The fast readers should miss
 * nothing. */
static void market_message(load_conn *c, uint64_t sent, uint64_t seq) {
    load_run *run = c->run;
    unsigned k = 0;
    bool ok = c->stamp[0] == LOAD_KEY_DIGITS;
    for (int i = 1; i <= LOAD_KEY_DIGITS; i++) {
        ok = ok && c->stamp[i] >= '0' && c->stamp[i] <= '9';
        k = k * 10 + (unsigned)(c->stamp[i] - '0');
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

static void on_close_frame(load_conn *c) {
    unsigned code = c->ctl_len >= 2 ? (unsigned)c->ctl[0] << 8 | c->ctl[1] : 1005;
    int rlen = c->ctl_len > 2 ? c->ctl_len - 2 : 0;
    if (c->state == CS_OPEN && c->run->o->mode == LOAD_MARKET && !is_publisher(c)) {
        c->run->disconnects++;   /* a figure of the run, not its end */
        conn_done(c);
        return;
    }
    if (c->state == CS_OPEN) {
        run_fail(c->run, "connection %u: the server closed the connection during the run: %u%s%.*s",
                 conn_no(c), code, rlen ? " " : "", rlen, (const char *)c->ctl + 2);
        return;
    }
    c->close_received = true;
    if (code != 1000)
        note_unclean(c, "the server answered our close 1000 with %u%s%.*s", code,
                     rlen ? " " : "", rlen, (const char *)c->ctl + 2);
    /* Then the server closes TCP first (RFC 6455 §7.1.1): wait for EOF. */
}

/* A frame header is complete: checks it against where we are. */
static bool frame_begin(load_conn *c, const tern__ws_header *h) {
    load_run *run = c->run;
    if (h->masked) {
        run_fail(run, "connection %u: the server sent a masked frame", conn_no(c));
        return false;
    }
    c->in_frame = true;
    c->frame_opcode = h->opcode;
    c->frame_fin = h->fin;
    c->frame_left = h->payload_len;
    if (h->opcode & 0x08) {
        c->ctl_len = 0;
        return true;
    }
    if (h->opcode == TERN__WS_OP_CONT ? !c->msg_open : c->msg_open) {
        run_fail(run, "connection %u: protocol error: %s", conn_no(c),
                 c->msg_open ? "a new message inside a fragmented one"
                             : "a continuation frame outside a message");
        return false;
    }
    if (has_publisher(run->o->mode))
        return sub_frame_begin(c, h);
    if (run->o->mode != LOAD_ECHO || !c->awaiting) {
        run_fail(run, "connection %u: a message from the server that %s", conn_no(c),
                 run->o->mode == LOAD_ECHO ? "is not an echo of ours" : "we did not ask for");
        return false;
    }
    if (h->opcode == TERN__WS_OP_TEXT) {
        run_fail(run, "connection %u: wrong echo: a text message for our binary one", conn_no(c));
        return false;
    }
    if (h->payload_len > run->o->size - c->msg_off) {
        run_fail(run, "connection %u: wrong echo: longer than the %llu bytes sent", conn_no(c),
                 (unsigned long long)run->o->size);
        return false;
    }
    c->msg_open = true;
    return true;
}

static void frame_end(load_conn *c) {
    c->in_frame = false;
    switch (c->frame_opcode) {
    case TERN__WS_OP_PING:
        /* Not after our close frame: nothing may follow it. */
        if (c->state == CS_OPEN || c->close_pending) {
            c->pong_pending = true;
            conn_pump(c);
        }
        return;
    case TERN__WS_OP_PONG:
        return;   /* we never ping; an unsolicited pong is a heartbeat */
    case TERN__WS_OP_CLOSE:
        on_close_frame(c);
        return;
    default:
        if (!c->frame_fin)
            return;
        c->msg_open = false;
        if (has_publisher(c->run->o->mode)) {
            if (c->in_ack) {
                c->in_ack = false;
                c->ack_len = (uint8_t)c->msg_off;
                c->msg_off = 0;
                ack_done(c);
                return;
            }
            c->msg_off = 0;
            sub_message(c);
            return;
        }
        if (c->msg_off != c->run->o->size) {
            run_fail(c->run, "connection %u: wrong echo: %llu bytes for the %llu sent", conn_no(c),
                     (unsigned long long)c->msg_off, (unsigned long long)c->run->o->size);
            return;
        }
        c->msg_off = 0;
        echo_done(c);
    }
}

/* Reads a frame header from *p, or the part of one that is there. Returns
 * false when the header is not complete yet or the run failed. */
static bool frame_header(load_conn *c, const uint8_t **p, size_t *n) {
    tern__ws_header h;
    int r;
    if (c->rhdr_have == 0) {   /* the usual case: the header is whole, read it where it is */
        r = tern__ws_parse_header(*p, *n, false, false, &h);
        if (r > 0) {
            *p += r;
            *n -= (size_t)r;
            return frame_begin(c, &h);
        }
    }
    size_t have = c->rhdr_have;
    size_t take = *n < TERN__WS_MAX_HEADER - have ? *n : TERN__WS_MAX_HEADER - have;
    memcpy(c->rhdr + have, *p, take);
    r = tern__ws_parse_header(c->rhdr, have + take, false, false, &h);
    if (r < 0) {
        run_fail(c->run, "connection %u: protocol error in a frame from the server "
                         "(header %02x %02x)",
                 conn_no(c), c->rhdr[0], have + take > 1 ? c->rhdr[1] : 0);
        return false;
    }
    if (r == 0) {
        c->rhdr_have = (uint8_t)(have + take);
        *p += take;
        *n -= take;
        return false;
    }
    *p += (size_t)r - have;
    *n -= (size_t)r - have;
    c->rhdr_have = 0;
    return frame_begin(c, &h);
}

/* Frames from the server (echo mode, and the end of both modes). */
static void frames_feed(load_conn *c, const uint8_t *p, size_t n) {
    load_run *run = c->run;
    for (;;) {
        if (!c->in_frame) {
            if (n == 0 || !frame_header(c, &p, &n))
                return;
        }
        size_t take = c->frame_left < n ? (size_t)c->frame_left : n;
        if (c->frame_opcode & 0x08) {
            memcpy(c->ctl + c->ctl_len, p, take);
            c->ctl_len = (uint8_t)(c->ctl_len + take);
        } else if (take > 0) {
            if (c->in_ack) {
                memcpy(c->ack + c->msg_off, p, take);
            } else if (has_publisher(run->o->mode)) {
                size_t head = stamp_off(run) + LOAD_STAMP_LEN;
                if (c->msg_off < head) {
                    size_t k = head - (size_t)c->msg_off;
                    memcpy(c->stamp + c->msg_off, p, take < k ? take : k);
                }
            } else if (!echo_check(c, p, take)) {
                return;
            }
            c->msg_off += take;
        }
        p += take;
        n -= take;
        c->frame_left -= take;
        if (c->frame_left > 0)
            return;   /* and n is 0 */
        frame_end(c);
        if (run->failed || c->state == CS_DONE)
            return;
    }
}

/* Pipeline: the echoes are only counted. The one check is cheap: a batch's
 * echoes start with a binary frame (a close frame there is the server
 * ending the connection). Bytes beyond what the batch owes are an error. */
static void pipeline_read(load_conn *c, const uint8_t *p, size_t n) {
    load_run *run = c->run;
    if (n > c->expect) {
        uint8_t b = p[c->expect];   /* the first byte beyond the batch's echoes */
        if ((b & 0x0F) == TERN__WS_OP_CLOSE)
            run_fail(run, "connection %u: the server sent a close frame during the run",
                     conn_no(c));
        else
            run_fail(run, "connection %u: %zu bytes from the server beyond the echoes of the "
                          "batch (the first is %02x)", conn_no(c), n - (size_t)c->expect, b);
        return;
    }
    if (c->expect == (uint64_t)c->batch * run->echo_len && p[0] != (0x80 | TERN__WS_OP_BINARY)) {
        if ((p[0] & 0x0F) == TERN__WS_OP_CLOSE)
            run_fail(run, "connection %u: the server sent a close frame during the run",
                     conn_no(c));
        else
            run_fail(run, "connection %u: an echo starts with %02x, not a binary frame", conn_no(c),
                     p[0]);
        return;
    }
    c->expect -= n;
    if (c->expect > 0)
        return;
    c->left -= c->batch;
    if (run->phase == PH_MEASURE)
        run->messages += c->batch;
    if (c->left > 0)
        pipeline_send(c);
    else
        pipeline_conn_finished(c);
}

/* Fanout: a round's replies are counted, not parsed, as the pipeline's
 * echoes are; the first byte of the round must begin a binary frame. What
 * comes outside a round (a ping, the close) goes to the frame reader. */
static void fanout_round_done(load_conn *c);

static void fanout_read(load_conn *c, const uint8_t *p, size_t n) {
    load_run *run = c->run;
    if (c->awaiting && !c->in_frame && c->rhdr_have == 0) {
        if (c->expect == run->reply_len && (p[0] & 0x0F) != TERN__WS_OP_CLOSE &&
            p[0] != (0x80 | TERN__WS_OP_BINARY)) {
            run_fail(run, "connection %u: a reply starts with %02x, not a binary frame",
                     conn_no(c), p[0]);
            return;
        }
        if (c->expect != run->reply_len || (p[0] & 0x0F) != TERN__WS_OP_CLOSE) {
            size_t take = c->expect < n ? (size_t)c->expect : n;
            c->expect -= take;
            p += take;
            n -= take;
            if (c->expect == 0)
                fanout_round_done(c);
        }
    }
    if (n > 0 && !run->failed)
        frames_feed(c, p, n);
}

/* Market: a slow reader reads while it has tokens (the tick gives them). */
static bool throttled(const load_conn *c) {
    return c->slow && (c->run->phase == PH_WARMUP || c->run->phase == PH_MEASURE);
}

static void set_paused(load_conn *c, bool paused) {
    c->paused = paused;
    int err = tern__io_set(c->run->loop, &c->io,
                           (paused ? 0 : TERN__IO_IN) | (c->out_cnt ? TERN__IO_OUT : 0));
    if (err < 0)
        run_fail(c->run, "connection %u: epoll: %s", conn_no(c), tern_strerror(err));
}

static void conn_read(load_conn *c) {
    load_run *run = c->run;
    size_t cap;
    uint8_t *buf = (uint8_t *)tern__loop_rbuf(run->loop, &cap);
    bool slow = throttled(c);
    if (slow) {
        if (c->tokens == 0) {
            set_paused(c, true);
            return;
        }
        cap = c->tokens < cap ? c->tokens : cap;
    }
    ssize_t r = recv(c->io.fd, buf, cap, 0);
    if (slow && r > 0 && (c->tokens -= (uint32_t)r) == 0)
        set_paused(c, true);
    if (r < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
            return;
        conn_lost(c, errno);
        return;
    }
    if (r == 0) {
        conn_lost(c, 0);
        return;
    }
    run->progress++;
    if (run->o->mode == LOAD_PIPELINE && c->state == CS_OPEN)
        pipeline_read(c, buf, (size_t)r);
    else if (run->o->mode == LOAD_FANOUT)
        fanout_read(c, buf, (size_t)r);
    else
        frames_feed(c, buf, (size_t)r);
}

/* ---- opening ---------------------------------------------------------- */

/* Checks the response head hs->head[0..len) (up to its blank line) is a
 * 101 that accepts our key and agreed to nothing we did not ask for. */
static bool check_101(load_conn *c, size_t len) {
    load_run *run = c->run;
    const char *h = c->hs->head, *end = h + len;
    const char *eol = memmem(h, len, "\r\n", 2);
    size_t sl = (size_t)(eol - h);
    if (sl < 12 || memcmp(h, "HTTP/1.1 101", 12) != 0 || (sl > 12 && h[12] != ' ')) {
        run_fail(run, "connection %u: handshake refused: the server answered \"%.*s\", "
                      "not 101 Switching Protocols (is %s a WebSocket route?)",
                 conn_no(c), (int)(sl < 120 ? sl : 120), h, run->o->path);
        return false;
    }
    bool upgrade = false, connection = false, accept = false;
    for (const char *line = eol + 2; line < end;) {
        const char *le = memmem(line, (size_t)(end - line), "\r\n", 2);
        if (le == NULL)
            le = end;
        const char *colon = memchr(line, ':', (size_t)(le - line));
        if (colon != NULL) {
            size_t nl = (size_t)(colon - line);
            const char *v = colon + 1;
            while (v < le && (*v == ' ' || *v == '\t'))
                v++;
            size_t vl = (size_t)(le - v);
            while (vl > 0 && (v[vl - 1] == ' ' || v[vl - 1] == '\t'))
                vl--;
#define IS(name) (nl == sizeof(name) - 1 && strncasecmp(line, name, nl) == 0)
            if (IS("Upgrade"))
                upgrade = vl == 9 && strncasecmp(v, "websocket", 9) == 0;
            else if (IS("Connection"))
                connection = tern__http_has_token(v, vl, "upgrade");
            else if (IS("Sec-WebSocket-Accept")) {
                accept = vl == TERN__WS_ACCEPT_LEN && memcmp(v, c->hs->accept, vl) == 0;
                if (!accept) {
                    run_fail(run, "connection %u: handshake: wrong Sec-WebSocket-Accept \"%.*s\" "
                                  "(expected %s)", conn_no(c), (int)(vl < 64 ? vl : 64), v,
                             c->hs->accept);
                    return false;
                }
            } else if (IS("Sec-WebSocket-Extensions") || IS("Sec-WebSocket-Protocol")) {
                run_fail(run, "connection %u: handshake: the server agreed to \"%.*s: %.*s\", "
                              "which we did not offer", conn_no(c), (int)nl, line,
                         (int)(vl < 64 ? vl : 64), v);
                return false;
            }
#undef IS
        }
        line = le + 2;
    }
    if (!upgrade || !connection || !accept) {
        run_fail(run, "connection %u: handshake: a 101 without %s", conn_no(c),
                 !upgrade ? "\"Upgrade: websocket\"" : !connection ? "\"Connection: Upgrade\""
                                                                   : "Sec-WebSocket-Accept");
        return false;
    }
    return true;
}

static void conn_opened(load_conn *c) {
    load_run *run = c->run;
    free(c->hs);
    c->hs = NULL;
    c->state = CS_OPEN;
    run->handshaking--;
    run->opened += !c->resuming;   /* else back after the cut */
    run->progress++;
    int err = tern__io_set(run->loop, &c->io, TERN__IO_IN);
    if (err < 0) {
        run_fail(run, "connection %u: epoll: %s", conn_no(c), tern_strerror(err));
        return;
    }
    if (c->resuming) {
        restart_more(run);
        return;
    }
    if (run->opened == run->nconns)
        run_begin(run);
    else
        start_more(run);
}

static void handshake_read(load_conn *c) {
    load_handshake *hs = c->hs;
    ssize_t r = recv(c->io.fd, hs->head + hs->len, sizeof(hs->head) - hs->len, 0);
    if (r < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
            return;
        run_fail(c->run, "connection %u: reading the handshake response: %s", conn_no(c),
                 strerror(errno));
        return;
    }
    if (r == 0) {
        run_fail(c->run, "connection %u: the server closed the connection during the handshake",
                 conn_no(c));
        return;
    }
    hs->len += (size_t)r;
    const char *blank = memmem(hs->head, hs->len, "\r\n\r\n", 4);
    if (blank == NULL) {
        if (hs->len == sizeof(hs->head))
            run_fail(c->run, "connection %u: handshake response head over %d bytes", conn_no(c),
                     LOAD_HEAD_MAX);
        return;
    }
    size_t head_len = (size_t)(blank - hs->head) + 2;   /* through the last header's CRLF */
    size_t extra = hs->len - (head_len + 2);
    if (!check_101(c, head_len))
        return;
    /* The server has no reason to speak first on an echo route; a
     * subscriber that asked where it starts may hear that (and, resuming,
     * what it missed) at once. */
    bool told = !is_publisher(c) && c->run->o->cut_for_ms;
    if (extra > 0 && !told) {
        run_fail(c->run, "connection %u: %zu bytes from the server right after the 101, "
                         "before any message", conn_no(c), extra);
        return;
    }
    uint8_t early[LOAD_HEAD_MAX];
    memcpy(early, blank + 4, extra);
    conn_opened(c);
    if (extra > 0 && !c->run->failed)
        frames_feed(c, early, extra);
}

static void handshake_send(load_conn *c) {
    load_run *run = c->run;
    unsigned char raw[16];
    char key[32];
    if (RAND_bytes(raw, sizeof(raw)) != 1) {
        run_fail(run, "RAND_bytes failed");
        return;
    }
    EVP_EncodeBlock((unsigned char *)key, raw, sizeof(raw));   /* 24 characters and a NUL */
    tern__ws_accept(key, 24, c->hs->accept);
    const char *target = is_publisher(c) ? run->o->pub_path : run->o->path;
    char resume[LOAD_PATH_MAX + 64];
    if (!is_publisher(c) && run->o->cut_for_ms) {   /* the server says where it starts */
        char sep = strchr(target, '?') ? '&' : '?';
        if (c->resuming)
            snprintf(resume, sizeof(resume), "%s%cepoch=%s&after=%llu", target, sep, c->epoch,
                     (unsigned long long)last_topic_seq(c));
        else
            snprintf(resume, sizeof(resume), "%s%cack=1", target, sep);
        target = resume;
    }
    char req[sizeof(resume) + LOAD_HOST_MAX + 256];
    int n = snprintf(req, sizeof(req),
                     "GET %s HTTP/1.1\r\n"
                     "Host: %s\r\n"
                     "Upgrade: websocket\r\n"
                     "Connection: Upgrade\r\n"
                     "Sec-WebSocket-Key: %s\r\n"
                     "Sec-WebSocket-Version: 13\r\n"
                     "User-Agent: tern-load/" TERN_VERSION "\r\n"
                     "\r\n",
                     target, run->o->authority, key);
    /* A new socket's send buffer takes a few hundred bytes whole. */
    ssize_t w = send(c->io.fd, req, (size_t)n, MSG_NOSIGNAL);
    if (w != n) {
        run_fail(run, "connection %u: sending the upgrade request: %s", conn_no(c),
                 w < 0 ? strerror(errno) : "short write");
        return;
    }
    c->state = CS_HANDSHAKE;
    int err = tern__io_set(run->loop, &c->io, TERN__IO_IN);
    if (err < 0)
        run_fail(run, "connection %u: epoll: %s", conn_no(c), tern_strerror(err));
}

static void on_conn_io(tern__io *io, uint32_t revents) {
    load_conn *c = tern__container_of(io, load_conn, io);
    load_run *run = c->run;
    if (run->failed)
        return;
    switch (c->state) {
    case CS_CONNECTING: {
        int err = 0;
        socklen_t len = sizeof(err);
        if (getsockopt(io->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
            err = errno;
        if (err != 0) {
            run_fail(run, "connect to %s:%u: %s", run->o->host, run->o->port, strerror(err));
            return;
        }
        handshake_send(c);
        return;
    }
    case CS_HANDSHAKE:
        handshake_read(c);
        return;
    case CS_OPEN:
    case CS_CLOSING:
        if (revents & TERN__IO_OUT) {
            conn_pump(c);
            if (run->failed || c->state == CS_DONE)
                return;
        }
        if (revents & (TERN__IO_IN | TERN__IO_HUP | TERN__IO_ERR))
            conn_read(c);
        return;
    default:
        return;
    }
}

static void conn_start(load_conn *c) {
    load_run *run = c->run;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        run_fail(run, "connection %u: socket: %s%s", conn_no(c), strerror(errno),
                 errno == EMFILE ? " (raise ulimit -n)" : "");
        return;
    }
    /* Echo messages are small and one at a time: Nagle would hold each
     * one back waiting for the previous ACK. */
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (c->slow) {   /* a small window, as a reader on a slow link has */
        int rcvbuf = 16384;
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    }
    tern__io_init(&c->io, fd, on_conn_io);
    c->hs = malloc(sizeof(*c->hs));
    if (c->hs == NULL) {
        close(fd);
        c->io.fd = -1;
        run_fail(run, "out of memory");
        return;
    }
    c->hs->len = 0;
    c->state = CS_CONNECTING;
    run->handshaking++;
    if (connect(fd, (const struct sockaddr *)&run->addr, sizeof(run->addr)) == 0) {
        handshake_send(c);
        return;
    }
    if (errno != EINPROGRESS) {
        run_fail(run, "connect to %s:%u: %s", run->o->host, run->o->port, strerror(errno));
        return;
    }
    int err = tern__io_set(run->loop, &c->io, TERN__IO_OUT);
    if (err < 0)
        run_fail(run, "connection %u: epoll: %s", conn_no(c), tern_strerror(err));
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

/* pubsub's cut: every subscriber's socket closed at once, in the middle of
 * the measured time (the publisher goes on); cut_for_ms later they all
 * connect again and resume where they were. */
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
            tern__io_set(run->loop, &c->io, 0);
            close(c->io.fd);
            c->io.fd = -1;
            c->state = CS_NEW;
            c->in_frame = c->msg_open = c->in_ack = false;
            c->pong_pending = c->close_pending = false;
            c->rhdr_have = c->out_cnt = c->ctl_len = 0;
            c->msg_off = 0;
            c->resuming = true;
            run->acks_due++;
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

static void conn_done(load_conn *c) {
    load_run *run = c->run;
    tern__io_set(run->loop, &c->io, 0);
    close(c->io.fd);
    c->io.fd = -1;
    c->state = CS_DONE;
    if (++run->done == run->nconns)
        tern_loop_stop(run->loop);
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
 * rest of the close handshake has LOAD_CLOSE_MS. */
static void run_close_all(load_run *run) {
    run->phase = PH_CLOSE;
    arm_phase(run, LOAD_CLOSE_MS);
    for (uint32_t i = 0; i < run->nconns && !run->failed; i++)
        if (run->conns[i].state == CS_OPEN)
            conn_begin_close(&run->conns[i]);
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
            for (uint32_t i = 0; i < run->o->connections; i++)
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
        for (uint32_t i = 0; i < run->nconns; i++) {
            load_conn *c = &run->conns[i];
            if (c->state == CS_DONE)
                continue;
            note_unclean(c, "close handshake not done after %d ms (%s)", LOAD_CLOSE_MS,
                         c->close_received ? "no EOF after the server's close frame"
                                           : "no close frame from the server");
            conn_done(c);
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

/* Every millisecond: the rounds that are due. A connection whose last
 * round is still in flight skips this one, which counts as missed. */
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
        if (c->awaiting || c->out_cnt > 0) {
            run->skipped += counted;
            continue;
        }
        run->rounds_sent += counted;
        c->awaiting = true;
        c->sent_ns = due;
        c->expect = run->reply_len;
        c->out[0] = (struct iovec){.iov_base = run->req, .iov_len = run->req_len};
        c->out_cnt = 1;
        conn_pump(c);
    }
}

/* ---- pubsub: the publisher ------------------------------------------------ */

/* Every millisecond: the messages the rate owes since the start, stamped
 * now, in one write. A publisher whose last write is not through yet (the
 * server reads it slower than the rate) waits; what it owes beyond one
 * write's worth is shed, so that it never bursts above the rate, and
 * counted. */
/* Market: every 100 ms each slow reader may read another tenth of its
 * rate (a smaller grain would cost a read per millisecond each). */
static void slow_refill(load_run *run) {
    uint32_t grain = (uint32_t)(run->o->slow_rate / 10 ? run->o->slow_rate / 10 : 1);
    for (uint32_t i = 0; i < run->o->connections; i++) {
        load_conn *c = &run->conns[i];
        if (!c->slow || c->state != CS_OPEN)
            continue;
        c->tokens = grain;
        if (c->paused)
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
    if (c->out_cnt > 0) {
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
    size_t hl = run->pub_frame_len - (size_t)run->o->size;
    size_t off = stamp_off(run);
    for (uint64_t i = 0; i < k; i++) {
        uint8_t *head = run->pub + i * run->pub_frame_len + hl;
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
        tern__ws_mask(head, off + LOAD_STAMP_LEN, run->key, 0);
    }
    if (run->phase == PH_MEASURE)
        run->published += k;
    c->out[0] = (struct iovec){.iov_base = run->pub, .iov_len = k * run->pub_frame_len};
    c->out_cnt = 1;
    conn_pump(c);
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
        for (uint32_t i = 0; i < o->connections && !run->failed; i++) {
            load_conn *c = &run->conns[i];
            c->head_len = (uint8_t)tern__ws_write_header(c->msg_head, true, false,
                                                         TERN__WS_OP_BINARY, o->size, run->key);
            echo_send(c, now_ns());
        }
        return;
    }
    run->phase = o->warmup_iterations ? PH_WARMUP : PH_MEASURE;
    run->t0_ns = run->open_ns;
    for (uint32_t i = 0; i < o->connections && !run->failed; i++) {
        run->conns[i].left = o->warmup_iterations ? o->warmup_iterations : o->iterations;
        pipeline_send(&run->conns[i]);
    }
}

/* The shared message bytes, built once. */
static int run_prepare(load_run *run) {
    const load_opts *o = run->o;
    if (RAND_bytes(run->key, sizeof(run->key)) != 1)
        return -EIO;
    uint8_t hdr[TERN__WS_MAX_HEADER];
    if (o->mode == LOAD_FANOUT) {   /* the request: size bytes of 'r' */
        run->req = malloc(TERN__WS_MAX_HEADER + o->size);
        if (run->req == NULL)
            return -ENOMEM;
        size_t hl = tern__ws_write_header(run->req, true, false, TERN__WS_OP_BINARY, o->size,
                                          run->key);
        memset(run->req + hl, 'r', (size_t)o->size);
        tern__ws_mask(run->req + hl, (size_t)o->size, run->key, 0);
        run->req_len = hl + (size_t)o->size;
        run->reply_len = (uint64_t)o->replies *
            (tern__ws_write_header(hdr, true, false, TERN__WS_OP_BINARY, o->reply_size, NULL) +
             o->reply_size);
        return 0;
    }
    if (has_publisher(o->mode)) {   /* pub_cap frames: header, head (filled per send), filler */
        size_t hl = tern__ws_write_header(hdr, true, false, TERN__WS_OP_BINARY, o->size, run->key);
        run->pub_frame_len = hl + (size_t)o->size;
        size_t cap = LOAD_PUB_BYTES / run->pub_frame_len;
        run->pub_cap = cap < 1 ? 1 : cap > 4096 ? 4096 : (uint32_t)cap;
        run->pub = malloc((size_t)run->pub_cap * run->pub_frame_len);
        if (run->pub == NULL)
            return -ENOMEM;
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
        for (uint32_t f = 0; f < run->pub_cap; f++) {
            uint8_t *p = run->pub + (size_t)f * run->pub_frame_len;
            memcpy(p, hdr, hl);
            size_t head = stamp_off(run) + LOAD_STAMP_LEN;
            memset(p + hl, 0, head);
            memset(p + hl + head, 'p', (size_t)o->size - head);
            tern__ws_mask(p + hl + head, (size_t)o->size - head, run->key, head);
        }
        return 0;
    }
    if (o->mode == LOAD_ECHO) {
        run->ctr_len = o->size < LOAD_CTR_LEN ? (size_t)o->size : LOAD_CTR_LEN;
        run->plain = malloc(o->size + 1);
        run->masked = malloc(o->size + 1);
        if (run->plain == NULL || run->masked == NULL)
            return -ENOMEM;
        /* Not all one byte, so a shifted or reordered echo shows. */
        for (uint64_t i = 0; i < o->size; i++)
            run->plain[i] = (uint8_t)(i * 131 + (i >> 8) + 7);
        size_t rest = (size_t)o->size - run->ctr_len;
        memcpy(run->masked, run->plain + run->ctr_len, rest);
        /* ctr_len is 8 or the whole payload, so the phase here is 0. */
        tern__ws_mask(run->masked, rest, run->key, run->ctr_len);
        return 0;
    }
    size_t hl = tern__ws_write_header(hdr, true, false, TERN__WS_OP_BINARY, o->size, run->key);
    run->frame_len = hl + (size_t)o->size;
    run->echo_len = tern__ws_write_header(hdr, true, false, TERN__WS_OP_BINARY, o->size, NULL) +
                    (size_t)o->size;
    run->batch = malloc(run->frame_len * o->depth);
    if (run->batch == NULL)
        return -ENOMEM;
    for (uint32_t f = 0; f < o->depth; f++) {
        uint8_t *p = run->batch + f * run->frame_len;
        tern__ws_write_header(p, true, false, TERN__WS_OP_BINARY, o->size, run->key);
        for (uint64_t i = 0; i < o->size; i++)
            p[hl + i] = (uint8_t)('a' + (f + i) % 26);
        tern__ws_mask(p + hl, (size_t)o->size, run->key, 0);
    }
    return 0;
}

/* ---- results ------------------------------------------------------------ */

static void json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            printf("\\%c", ch);
        else if (ch < 0x20)
            printf("\\u%04x", ch);
        else
            putchar(ch);
    }
    putchar('"');
}

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
            json_string(o->url);
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
            json_string(o->url);
            printf(",\"publish_path\":");
            json_string(o->pub_path);
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
            json_string(o->url);
            printf(",\"publish_path\":");
            json_string(o->pub_path);
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
            json_string(o->url);
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
        json_string(o->url);
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

static void usage(FILE *f) {
    fprintf(f,
            "usage: tern load echo     --url ws://HOST[:PORT]/PATH [options]\n"
            "       tern load pipeline --url ws://HOST[:PORT]/PATH [options]\n"
            "       tern load fanout   --url ws://HOST[:PORT]/PATH [options]\n"
            "       tern load pubsub   --url ws://HOST[:PORT]/PATH --publish-path PATH [options]\n"
            "\n"
            "echo: each connection sends a binary message, waits for the whole echo, checks\n"
            "it and sends the next; after the warm-up it counts echoes and round trips.\n"
            "  --connections N       (default 100)\n"
            "  --size BYTES          message payload (default 64)\n"
            "  --duration SECONDS    measured time (default 5)\n"
            "  --warmup SECONDS      before measuring (default 1; 0 for none)\n"
            "\n"
            "pipeline: each connection writes DEPTH messages at once, and the next batch\n"
            "when all their echoes are back; echoes are counted, not parsed.\n"
            "  --connections N       (default 1)\n"
            "  --depth P             messages per batch (default 8)\n"
            "  --size BYTES          message payload (default 16)\n"
            "  --iterations I        measured messages per connection (default 200000)\n"
            "  --warmup-iterations W messages per connection before measuring (default 20000)\n"
            "\n"
            "fanout: each connection sends a binary message every interval (the connections\n"
            "take turns, spread evenly over it) and expects R binary messages of S bytes back;\n"
            "a round not done within its interval is missed (tern serve's /fanout).\n"
            "  --connections N       (default 1000)\n"
            "  --size BYTES          the request's payload (default 16)\n"
            "  --replies R           messages per round (default 10)\n"
            "  --reply-size S        bytes of each (default 10000)\n"
            "  --interval SECONDS    (default 1)\n"
            "  --duration SECONDS    measured time (default 10)\n"
            "  --warmup SECONDS      before measuring (default 2; 0 for none)\n"
            "\n"
            "pubsub: N connections to --url subscribe (the server is to send each one\n"
            "every message published); one more, to --publish-path, publishes RATE binary\n"
            "messages a second, each starting with its send time and a sequence number\n"
            "(tern serve's /fanout/sub and /fanout/pub). Counts deliveries, their latency\n"
            "and the gaps in each subscriber's sequence.\n"
            "  --connections N       subscribers (default 1000)\n"
            "  --publish-path PATH   the publisher's path on the same host (required)\n"
            "  --rate R              messages published per second (default 1000)\n"
            "  --size BYTES          payload, at least 16 (default 256)\n"
            "  --duration SECONDS    measured time (default 10)\n"
            "  --warmup SECONDS      before measuring (default 2; 0 for none)\n"
            "  --cut-at S --cut-for T  S seconds into the measured time, every subscriber's\n"
            "                        connection is cut; T seconds later they all connect\n"
            "                        again and resume after the last message they got\n"
            "                        (tern serve's /fanout/sub ?ack=1 and ?epoch=E&after=N,\n"
            "                        with a history: --pubsub-history); a gap or a\n"
            "                        duplicate shows in the sequences\n"
            "\n"
            "market: pubsub with keys: each message updates one of K instruments (its\n"
            "first bytes: 4 and four digits, the key of tern serve's /fanout/pub-keyed), and\n"
            "a fraction of the subscribers read only RATE bytes a second. Then the\n"
            "publisher stops and, after the drain, every reader should hold each key's\n"
            "latest message (a conflating server gives that). A disconnect is counted,\n"
            "not an error.\n"
            "  --connections N       subscribers (default 5000)\n"
            "  --publish-path PATH   the publisher's path (required)\n"
            "  --rate R              messages published per second (default 200)\n"
            "  --size BYTES          payload, at least 21 (default 512)\n"
            "  --instruments K       keys (default 100, at most 10000)\n"
            "  --slow-fraction F     of the subscribers, read slowly (default 0.1)\n"
            "  --slow-rate BYTES     a slow one's bytes a second (default 16384)\n"
            "  --duration, --warmup  (default 10, 2)\n"
            "  --drain SECONDS       after publishing, before checking (default 3)\n"
            "\n"
            "all modes:\n"
            "  --url URL             ws://HOST[:PORT]/PATH, IPv4 (no wss:// yet)\n"
            "  --json                print one JSON object instead of text\n"
            "\n"
            "Exit status: 0 after a clean run; 1 when the run failed (connection refused,\n"
            "handshake refused, a wrong echo, the server closing); 2 for bad options.\n");
}

static bool parse_uint(const char *s, unsigned long long min, unsigned long long max,
                       unsigned long long *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || *s == '-' || v < min || v > max)
        return false;
    *out = v;
    return true;
}

/* Seconds, decimals allowed, as milliseconds. */
static bool parse_seconds(const char *s, bool zero_ok, uint64_t *ms) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= 0 && v <= 86400))   /* also refuses NaN */
        return false;
    uint64_t m = (uint64_t)(v * 1000 + 0.5);
    if (m == 0 && !zero_ok)
        return false;
    *ms = m;
    return true;
}

/* ws://HOST[:PORT][/PATH][?QUERY]: fills host, port, authority, path.
 * Returns NULL or what is wrong with it. */
static const char *parse_url(const char *url, load_opts *o) {
    if (strncasecmp(url, "wss://", 6) == 0)
        return "wss:// is not supported yet (no TLS in tern load)";
    if (strncasecmp(url, "ws://", 5) != 0)
        return "it must start with ws://";
    const char *a = url + 5;
    size_t alen = strcspn(a, "/?#");
    if (alen == 0)
        return "no host";
    if (alen >= LOAD_HOST_MAX)
        return "host too long";
    if (a[0] == '[')
        return "IPv6 addresses are not supported yet";
    if (memchr(a, '@', alen))
        return "user info is not supported";
    memcpy(o->authority, a, alen);
    o->authority[alen] = '\0';
    const char *colon = memchr(a, ':', alen);
    size_t hlen = colon ? (size_t)(colon - a) : alen;
    if (hlen == 0)
        return "no host";
    memcpy(o->host, a, hlen);
    o->host[hlen] = '\0';
    o->port = 80;
    if (colon) {
        char port[8];
        size_t plen = alen - hlen - 1;
        unsigned long long p;
        if (plen == 0 || plen >= sizeof(port))
            return "bad port";
        memcpy(port, colon + 1, plen);
        port[plen] = '\0';
        if (!parse_uint(port, 1, 65535, &p))
            return "bad port";
        o->port = (unsigned)p;
    }
    const char *path = a + alen;
    size_t plen = strcspn(path, "#");   /* a fragment is not sent */
    if (plen + 2 > LOAD_PATH_MAX)
        return "path too long";
    size_t off = 0;
    if (path[0] != '/')   /* "" or "?query": the path is "/" */
        o->path[off++] = '/';
    memcpy(o->path + off, path, plen);
    o->path[off + plen] = '\0';
    for (const char *p = o->path; *p; p++)
        if ((unsigned char)*p <= 0x20 || *p == 0x7F)
            return "the path has a space or a control character (percent-encode it)";
    return NULL;
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
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    char port[8];
    snprintf(port, sizeof(port), "%u", o->port);
    int gai = getaddrinfo(o->host, port, &hints, &ai);
    if (gai != 0) {
        fprintf(stderr, "tern load: cannot resolve %s: %s\n", o->host, gai_strerror(gai));
        return 1;
    }
    if (!ensure_fds(o->connections + 1)) {
        freeaddrinfo(ai);
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);

    load_run *run = calloc(1, sizeof(*run));
    if (run == NULL) {
        freeaddrinfo(ai);
        fprintf(stderr, "tern load: out of memory\n");
        return 1;
    }
    run->o = o;
    run->nconns = o->connections + has_publisher(o->mode);   /* and the publisher */
    memcpy(&run->addr, ai->ai_addr, sizeof(run->addr));
    freeaddrinfo(ai);
    hist_reset(&run->hist);
    hist_reset(&run->slow_hist);
    int err = tern_loop_new(&run->loop, NULL);
    if (err == 0) {
        run->conns = calloc(run->nconns, sizeof(*run->conns));
        err = run->conns ? run_prepare(run) : -ENOMEM;
    }
    for (uint32_t i = 0; run->conns && i < run->nconns; i++) {
        run->conns[i].run = run;
        run->conns[i].io.fd = -1;
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
            fprintf(stderr, "tern load: %s\n", run->error);
            status = 1;
        } else {
            print_results(run);
        }
    }
    for (uint32_t i = 0; run->conns && i < run->nconns; i++) {
        if (run->conns[i].io.fd >= 0)
            close(run->conns[i].io.fd);
        free(run->conns[i].hs);
        free(run->conns[i].last_key);
    }
    free(run->last_pub);
    if (run->phase_timer)
        tern_timer_stop(run->phase_timer);
    if (run->tick)
        tern_timer_stop(run->tick);
    if (run->cut_timer)
        tern_timer_stop(run->cut_timer);
    free(run->req);
    free(run->pub);
    if (run->watchdog)
        tern_timer_stop(run->watchdog);
    free(run->conns);
    free(run->plain);
    free(run->masked);
    free(run->batch);
    tern_loop_free(run->loop);
    free(run);
    return status;
}

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

    /* The order is the enum's: an option's name is opts[c - 1].name. */
    enum { O_URL = 1, O_CONNS, O_SIZE, O_DURATION, O_WARMUP, O_DEPTH, O_ITER, O_WARMUP_ITER,
           O_REPLIES, O_REPLY_SIZE, O_INTERVAL, O_RATE, O_PUB_PATH, O_INSTRUMENTS,
           O_SLOW_FRACTION, O_SLOW_RATE, O_DRAIN, O_CUT_AT, O_CUT_FOR, O_JSON, O_HELP };
    static const struct option opts[] = {
        {"url", required_argument, NULL, O_URL},
        {"connections", required_argument, NULL, O_CONNS},
        {"size", required_argument, NULL, O_SIZE},
        {"duration", required_argument, NULL, O_DURATION},
        {"warmup", required_argument, NULL, O_WARMUP},
        {"depth", required_argument, NULL, O_DEPTH},
        {"iterations", required_argument, NULL, O_ITER},
        {"warmup-iterations", required_argument, NULL, O_WARMUP_ITER},
        {"replies", required_argument, NULL, O_REPLIES},
        {"reply-size", required_argument, NULL, O_REPLY_SIZE},
        {"interval", required_argument, NULL, O_INTERVAL},
        {"rate", required_argument, NULL, O_RATE},
        {"publish-path", required_argument, NULL, O_PUB_PATH},
        {"instruments", required_argument, NULL, O_INSTRUMENTS},
        {"slow-fraction", required_argument, NULL, O_SLOW_FRACTION},
        {"slow-rate", required_argument, NULL, O_SLOW_RATE},
        {"drain", required_argument, NULL, O_DRAIN},
        {"cut-at", required_argument, NULL, O_CUT_AT},
        {"cut-for", required_argument, NULL, O_CUT_FOR},
        {"json", no_argument, NULL, O_JSON},
        {"help", no_argument, NULL, O_HELP},
        {NULL, 0, NULL, 0},
    };
    /* getopt names argv[0] in its complaints: make it the whole command. */
    static const char *const names[] = {"tern load echo", "tern load pipeline",
                                        "tern load fanout", "tern load pubsub",
                                        "tern load market"};
    argv[1] = (char *)names[o.mode];
    /* Which mode each option belongs to (bit per mode; the rest are all modes'). */
    static const unsigned only[] = {
        [O_DURATION] = 1u << LOAD_ECHO | 1u << LOAD_FANOUT | 1u << LOAD_PUBSUB | 1u << LOAD_MARKET,
        [O_WARMUP] = 1u << LOAD_ECHO | 1u << LOAD_FANOUT | 1u << LOAD_PUBSUB | 1u << LOAD_MARKET,
        [O_DEPTH] = 1u << LOAD_PIPELINE, [O_ITER] = 1u << LOAD_PIPELINE,
        [O_WARMUP_ITER] = 1u << LOAD_PIPELINE,
        [O_REPLIES] = 1u << LOAD_FANOUT, [O_REPLY_SIZE] = 1u << LOAD_FANOUT,
        [O_INTERVAL] = 1u << LOAD_FANOUT,
        [O_RATE] = 1u << LOAD_PUBSUB | 1u << LOAD_MARKET,
        [O_PUB_PATH] = 1u << LOAD_PUBSUB | 1u << LOAD_MARKET,
        [O_INSTRUMENTS] = 1u << LOAD_MARKET, [O_SLOW_FRACTION] = 1u << LOAD_MARKET,
        [O_SLOW_RATE] = 1u << LOAD_MARKET, [O_DRAIN] = 1u << LOAD_MARKET,
        [O_CUT_AT] = 1u << LOAD_PUBSUB, [O_CUT_FOR] = 1u << LOAD_PUBSUB,
    };
    unsigned long long v = 0;
    int c;
    optind = 1;
    while ((c = getopt_long(argc - 1, argv + 1, "", opts, NULL)) != -1) {
        bool ok = true;
        if (c > 0 && (size_t)c < sizeof(only) / sizeof(only[0]) && only[c] &&
            !(only[c] & 1u << o.mode)) {
            char modes[64] = "";
            for (unsigned m = 0, k = 0; m < 5; m++) {
                if (!(only[c] & 1u << m))
                    continue;
                unsigned left = (unsigned)__builtin_popcount(only[c] >> (m + 1));
                snprintf(modes + strlen(modes), sizeof(modes) - strlen(modes), "%s%s",
                         names[m] + (k++ ? 10 : 0), left > 1 ? ", " : left ? " and " : "");
            }
            fprintf(stderr, "tern load %s: --%s is an option of %s\n", mode, opts[c - 1].name,
                    modes);
            return 2;
        }
        switch (c) {
        case O_URL: o.url = optarg; break;
        case O_CONNS: ok = parse_uint(optarg, 1, 1000000, &v); o.connections = (uint32_t)v; break;
        case O_SIZE: ok = parse_uint(optarg, 0, 256u << 20, &v); o.size = v; break;
        case O_DURATION: ok = parse_seconds(optarg, false, &o.duration_ms); break;
        case O_WARMUP: ok = parse_seconds(optarg, true, &o.warmup_ms); break;
        case O_DEPTH: ok = parse_uint(optarg, 1, 1u << 20, &v); o.depth = (uint32_t)v; break;
        case O_ITER: ok = parse_uint(optarg, 1, 1ull << 40, &v); o.iterations = v; break;
        case O_WARMUP_ITER: ok = parse_uint(optarg, 0, 1ull << 40, &v); o.warmup_iterations = v; break;
        case O_REPLIES: ok = parse_uint(optarg, 1, 1000, &v); o.replies = (uint32_t)v; break;
        case O_REPLY_SIZE: ok = parse_uint(optarg, 0, 16u << 20, &v); o.reply_size = v; break;
        case O_INTERVAL: ok = parse_seconds(optarg, false, &o.interval_ms); break;
        case O_RATE: ok = parse_uint(optarg, 1, 10000000, &v); o.rate = v; break;
        case O_PUB_PATH:
            ok = optarg[0] == '/' && strlen(optarg) < LOAD_PATH_MAX &&
                 strcspn(optarg, " \t\r\n") == strlen(optarg);
            if (ok)
                strcpy(o.pub_path, optarg);
            break;
        case O_INSTRUMENTS: ok = parse_uint(optarg, 1, 10000, &v); o.instruments = (uint32_t)v; break;
        case O_SLOW_FRACTION: {
            char *end;
            o.slow_fraction = strtod(optarg, &end);
            ok = end != optarg && *end == '\0' && o.slow_fraction >= 0 && o.slow_fraction <= 1;
            break;
        }
        case O_SLOW_RATE: ok = parse_uint(optarg, 1, 1ull << 32, &v); o.slow_rate = v; break;
        case O_DRAIN: ok = parse_seconds(optarg, true, &o.drain_ms); break;
        case O_CUT_AT: ok = parse_seconds(optarg, false, &o.cut_at_ms); break;
        case O_CUT_FOR: ok = parse_seconds(optarg, false, &o.cut_for_ms); break;
        case O_JSON: o.json = true; break;
        case O_HELP: usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (!ok) {
            fprintf(stderr, "tern load %s: bad value for --%s: %s\n", mode, opts[c - 1].name,
                    optarg);
            return 2;
        }
    }
    if (optind < argc - 1) {
        fprintf(stderr, "tern load %s: unexpected argument '%s'\n", mode, argv[optind + 1]);
        return 2;
    }
    if (o.url == NULL) {
        fprintf(stderr, "tern load %s: --url is required\n", mode);
        return 2;
    }
    const char *why = parse_url(o.url, &o);
    if (why != NULL) {
        fprintf(stderr, "tern load %s: bad --url %s: %s\n", mode, o.url, why);
        return 2;
    }
    if (has_publisher(o.mode) && o.pub_path[0] == '\0') {
        fprintf(stderr, "%s: --publish-path is required\n", names[o.mode]);
        return 2;
    }
    if ((o.cut_at_ms != 0) != (o.cut_for_ms != 0) ||
        (o.cut_for_ms && o.cut_at_ms + o.cut_for_ms >= o.duration_ms)) {
        fprintf(stderr, "%s: --cut-at and --cut-for go together, and the cut ends before "
                        "--duration\n", names[o.mode]);
        return 2;
    }
    size_t min_size = o.mode == LOAD_MARKET ? LOAD_HEAD_BYTES : LOAD_STAMP_LEN;
    if (has_publisher(o.mode) && o.size < min_size) {
        fprintf(stderr, "%s: --size is at least %zu (the stamp%s)\n", names[o.mode], min_size,
                o.mode == LOAD_MARKET ? " and the key" : "");
        return 2;
    }
    if (o.mode == LOAD_PIPELINE &&
        (uint64_t)o.depth * (o.size + TERN__WS_MAX_HEADER) > LOAD_MAX_BATCH) {
        fprintf(stderr, "tern load pipeline: --depth x --size is over %u bytes a batch\n",
                LOAD_MAX_BATCH);
        return 2;
    }
    return load_run_main(&o);
}
