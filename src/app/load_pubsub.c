/* tern load pubsub: N subscribers and one publisher, which sends messages
 * at a fixed rate, each stamped with its send time and a sequence number.
 * Reports deliveries per second, their latency, and the gaps in any
 * subscriber's sequence (messages the server dropped). With --cut-at and
 * --cut-for, every subscriber's connection is dropped (a reset) in the
 * middle of the measured time and connects again later, resuming after
 * the last message it got.
 *
 * The publisher and the subscribers here are market's too (load_market.c):
 * its messages start with a key, and some of its readers are slow
 * (throttled); load_pub_kind says how the two modes differ. */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/load.h"

/* ---- the subscribers ------------------------------------------------------ */

/* The topic's seq of the last message this subscriber got (what it
 * resumes after). */
static uint64_t last_topic_seq(const load_conn *c) {
    if (!c->seen || !c->delta_known)
        return c->ack_seq;
    return (uint64_t)((int64_t)(c->next_seq - 1) + c->delta);
}

/* With a cut, a subscriber's URL asks where its subscription starts
 * (ack=1) or, resuming, for what came after the last message it got:
 * that query (after sep, '?' or '&') into out. */
void load_sub_query(const load_conn *c, char sep, char *out, size_t cap) {
    if (c->resuming)
        snprintf(out, cap, "%cepoch=%s&after=%llu", sep, c->epoch,
                 (unsigned long long)last_topic_seq(c));
    else
        snprintf(out, cap, "%cack=1", sep);
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
        load_fail(run, "connection %u: not where the subscription starts: %s", load_conn_no(c),
                  ack);
        return;
    }
    if (!c->resuming) {
        memcpy(c->epoch, e, sizeof(e));
        c->ack_seq = seq;
        return;
    }
    c->resuming = false;
    const char *r = strstr(ack, "\"replayed\":");
    run->cut.replayed += r ? strtoull(r + 11, NULL, 10) : 0;
    if (strstr(ack, "\"resumed\":true"))
        run->cut.resumed++;
    else
        run->cut.not_resumed++;   /* what it missed shows as gaps */
    memcpy(c->epoch, e, sizeof(e));
    if (--run->cut.acks_due == 0)
        run->cut.resumed_ns = load_now_ns();
}

/* Pubsub: a published message whole; its stamp says when it was sent and
 * its place in the publisher's sequence. */
static void pubsub_delivered(load_conn *c, const uint8_t *msg, uint64_t sent, uint64_t seq) {
    (void)msg;
    load_run *run = c->run;
    const load_publisher_state *pub = &run->publisher;
    if (c->epoch[0] && !c->delta_known) {   /* the first message after the first ack */
        c->delta = (int64_t)(c->ack_seq + 1) - (int64_t)seq;
        c->delta_known = true;
    }
    if (c->seen && seq != c->next_seq) {
        if (seq < c->next_seq) {
            load_fail(run, "connection %u: message %llu after %llu: out of order or repeated",
                      load_conn_no(c), (unsigned long long)seq,
                      (unsigned long long)c->next_seq - 1);
            return;
        }
        /* the missing seqs that were published while measuring */
        uint64_t lo = c->next_seq > pub->seq_from ? c->next_seq : pub->seq_from;
        uint64_t hi = seq - 1 < pub->seq_to ? seq - 1 : pub->seq_to;
        if (run->phase >= PH_MEASURE && hi >= lo)
            run->m.gaps += hi - lo + 1;
    }
    c->seen = true;
    c->next_seq = seq + 1;
    if (run->phase >= PH_MEASURE && seq >= pub->seq_from && seq <= pub->seq_to) {
        uint64_t now = load_now_ns();
        run->m.messages++;
        load_hist_record(&run->m.hist, now > sent ? now - sent : 0);
        if (run->cut.reconnect_ns && now > sent + 500000000u)   /* still catching up */
            run->cut.behind_ns = now;
    }
}

/* Market: a slow reader reads while it has tokens (the tick gives them). */
static bool throttled(const load_conn *c) {
    return c->slow && (c->run->phase == PH_WARMUP || c->run->phase == PH_MEASURE);
}

/* A subscriber's message: where its subscription starts (a text message,
 * with a cut), or a published one. */
void load_sub_message(load_conn *c, const uint8_t *p, size_t len, int opcode) {
    load_run *run = c->run;
    if (load_is_publisher(c)) {
        load_fail(run, "connection %u: the server sent the publisher a message", load_conn_no(c));
        return;
    }
    if (opcode == TERN_WS_TEXT && run->o->cut_for_ms && len < LOAD_ACK_MAX) {
        ack_message(c, (const char *)p, len);
        return;
    }
    if (opcode != TERN_WS_BINARY || len != run->o->size) {
        load_fail(run, "connection %u: a published message came as a %s message of %zu bytes, "
                       "not a binary one of %llu", load_conn_no(c),
                  opcode == TERN_WS_TEXT ? "text" : "binary", len,
                  (unsigned long long)run->o->size);
        return;
    }
    const uint8_t *st = p + run->mode->pub->stamp_off;
    run->mode->pub->delivered(c, p, load_get_le64(st), load_get_le64(st + 8));
    if (throttled(c)) {
        /* What a frame of this size costs on the wire: its header too. */
        c->tokens -= (int64_t)(len + (len < 126 ? 2 : len < 65536 ? 4 : 10));
        if (c->tokens <= 0 && !c->paused && !run->failed)
            load_set_paused(c, true);
    }
}

/* ---- the publisher -------------------------------------------------------- */

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
    const load_pub_kind *kind = run->mode->pub;
    if (kind->tick)
        kind->tick(run);
    load_conn *c = &run->conns[run->o->connections];
    if (c->state != CS_OPEN)
        return;
    uint64_t now = load_now_ns();
    uint64_t due = (now - run->publisher.start_ns) / 1000 * run->o->rate / 1000000;
    if (due <= run->publisher.due)
        return;
    if (tern_ws_buffered(c->ws) > 0) {
        run->m.pub_blocked += run->phase == PH_MEASURE;
        return;
    }
    uint64_t k = due - run->publisher.due;
    run->publisher.due = due;
    if (k > run->publisher.cap) {
        if (run->phase == PH_MEASURE)
            run->m.pub_shed += k - run->publisher.cap;
        k = run->publisher.cap;
    }
    uint8_t *head = run->payload;
    size_t off = kind->stamp_off;
    for (uint64_t i = 0; i < k && !run->failed; i++) {
        uint64_t seq = ++run->publisher.seq;
        if (kind->head)
            kind->head(run, head, seq);
        load_put_le64(head + off, now);
        load_put_le64(head + off + 8, seq);
        if (run->phase == PH_MEASURE)
            run->m.published++;
        load_send(c, run->payload, (size_t)run->o->size);
    }
}

/* ---- the cut -------------------------------------------------------------- */

/* pubsub's cut: every subscriber's connection dropped at once (a reset, no
 * close frame), in the middle of the measured time (the publisher goes
 * on); cut_for_ms later they all connect again and resume where they
 * were. */
static void on_cut(tern_timer *t, void *user) {
    load_run *run = user;
    if (run->failed || run->phase != PH_MEASURE)
        return;
    if (run->cut.cut_ns == 0) {
        run->cut.cut_ns = load_now_ns();
        for (uint32_t i = 0; i < run->o->connections; i++) {
            load_conn *c = &run->conns[i];
            if (c->state != CS_OPEN)
                continue;
            c->cut = true;
            c->resuming = true;
            run->cut.acks_due++;
            tern_ws_abort(c->ws);   /* its on_close comes at the end of this batch */
        }
        if (tern_timer_again(t, run->o->cut_for_ms) < 0)
            load_fail(run, "timer: out of memory");
        return;
    }
    run->cut.reconnect_ns = load_now_ns();
    load_restart_more(run);
}

static void arm_cut(load_run *run) {
    if (run->o->cut_for_ms && tern_timer_start(run->loop, &run->cut.timer, run->o->cut_at_ms, 0,
                                               on_cut, run) < 0)
        load_fail(run, "timer: out of memory");
}

/* ---- the mode ------------------------------------------------------------- */

const char *load_pub_check(const load_opts *o) {
    if (o->pub_path[0] == '\0')
        return "--publish-path is required";
    if ((o->cut_at_ms != 0) != (o->cut_for_ms != 0) ||
        (o->cut_for_ms && o->cut_at_ms + o->cut_for_ms >= o->duration_ms))
        return "--cut-at and --cut-for go together, and the cut ends before --duration";
    return NULL;
}

static const char *pubsub_check(const load_opts *o) {
    const char *why = load_pub_check(o);
    if (why == NULL && o->size < LOAD_STAMP_LEN)
        why = "--size is at least 16 (the stamp)";   /* LOAD_STAMP_LEN */
    return why;
}

/* The published message: its head (stamped per send), then filler; at
 * most publisher.cap of them a tick (LOAD_PUB_BYTES on the wire). */
int load_pub_prepare(load_run *run) {
    const load_opts *o = run->o;
    size_t frame = load_server_header_len(o->size) + 4 + (size_t)o->size;
    size_t cap = LOAD_PUB_BYTES / frame;
    run->publisher.cap = cap < 1 ? 1 : cap > 4096 ? 4096 : (uint32_t)cap;
    size_t head = run->mode->pub->stamp_off + LOAD_STAMP_LEN;
    memset(run->payload, 0, head);
    memset(run->payload + head, 'p', (size_t)o->size - head);
    return 0;
}

/* Every connection is open: the publisher starts, on a tick every
 * millisecond. Every seq it publishes counts while there is no warm-up. */
void load_pub_begin(load_run *run) {
    run->publisher.start_ns = run->open_ns;
    run->publisher.seq_from = 1;
    run->publisher.seq_to = UINT64_MAX;
    load_begin_timed(run);
    if (!run->o->warmup_ms)
        arm_cut(run);
    load_start_tick(run, on_pub_tick);
}

/* After the warm-up: the seqs published from now on count. */
void load_pub_measure_begin(load_run *run) {
    run->publisher.seq_from = run->publisher.seq + 1;
    run->publisher.seq_to = UINT64_MAX;
}

static void pubsub_measure_begin(load_run *run) {
    load_pub_measure_begin(run);
    arm_cut(run);
}

/* The publisher stops; a second for the last ones to arrive. */
static void pubsub_measure_end(load_run *run) {
    run->publisher.seq_to = run->publisher.seq;
    run->phase = PH_DRAIN;
    load_arm_phase(run, 1000);
}

static void pubsub_headline(const load_run *run, FILE *f) {
    const load_opts *o = run->o;
    fprintf(f, "tern load pubsub %s: %u subscribers, one publisher on %s at %llu msg/s of "
               "%llu bytes\n", o->url, o->connections, o->pub_path,
            (unsigned long long)o->rate, (unsigned long long)o->size);
}

static double since(uint64_t t, uint64_t from) {
    return t ? (double)(t - from) / 1e9 : -1.0;
}

static void pubsub_results(const load_run *run, load_results *r) {
    const load_opts *o = run->o;
    const load_measured *m = &run->m;
    r->published = m->published;
    r->publish_rate = r->duration_s > 0 ? (double)m->published / r->duration_s : 0;
    r->publisher_blocked = m->pub_blocked;
    r->shed = m->pub_shed;
    r->expected = m->published * o->connections;
    r->gaps = m->gaps;
    r->cut = o->cut_for_ms != 0;
    r->cut_at_s = since(run->cut.cut_ns, run->t0_ns);
    r->cut_for_s = (double)o->cut_for_ms / 1e3;
    r->reconnect_s = since(run->cut.reconnect_ns, run->t0_ns);
    r->resumed_after_s =
        run->cut.resumed_ns ? since(run->cut.resumed_ns, run->cut.reconnect_ns) : -1.0;
    r->caught_up_after_s = run->cut.behind_ns > run->cut.reconnect_ns
                               ? (double)(run->cut.behind_ns - run->cut.reconnect_ns) / 1e9 : 0.0;
    r->resumed = run->cut.resumed;
    r->not_resumed = run->cut.not_resumed;
    r->unanswered = run->cut.acks_due;
    r->replayed = run->cut.replayed;
}

static const load_pub_kind pubsub_kind = {.stamp_off = 0, .delivered = pubsub_delivered};

const load_mode_ops load_pubsub_ops = {
    .name = "pubsub",
    .pub = &pubsub_kind,
    .defaults = {.mode = LOAD_PUBSUB, .connections = 1000, .size = 256, .rate = 1000,
                 .duration_ms = 10000, .warmup_ms = 2000},
    .check = pubsub_check,
    .prepare = load_pub_prepare,
    .begin = load_pub_begin,
    .on_message = load_sub_message,
    .measure_begin = pubsub_measure_begin,
    .measure_end = pubsub_measure_end,
    .drain_end = load_close_all,
    .headline = pubsub_headline,
    .results = pubsub_results,
};
