/* tern load fanout: N connections, each sends one small message every
 * interval (the connections take turns, spread evenly over it) and expects
 * R binary messages of S bytes back (the market-data write-up's
 * 10 x 10 000 bytes a second). Reports the rounds, those that missed
 * their interval, and how long each took. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "app/load.h"

/* The latency of a round runs from when it was due, not from when the
 * tick got to it: a client late to ask does not hide a slow server. */
static void fanout_round_done(load_conn *c) {
    load_run *run = c->run;
    c->awaiting = false;
    if (run->phase != PH_MEASURE || c->sent_ns < run->t0_ns)
        return;
    uint64_t lat = load_now_ns() - c->sent_ns;
    run->m.rounds++;
    run->m.messages += run->o->replies;
    load_hist_record(&run->m.hist, lat);
    if (lat > run->o->interval_ms * 1000000u)
        run->m.late++;
}

/* Fanout: a round's replies are counted; each must be a binary message of
 * the reply size, within a round. */
static void fanout_message(load_conn *c, const uint8_t *p, size_t len, int opcode) {
    (void)p;
    load_run *run = c->run;
    if (!c->awaiting) {
        load_fail(run, "connection %u: a message from the server that we did not ask for",
                  load_conn_no(c));
        return;
    }
    if (opcode != TERN_WS_BINARY || len != run->o->reply_size) {
        load_fail(run, "connection %u: a reply that is a %s message of %zu bytes, not a binary "
                       "one of %llu", load_conn_no(c),
                  opcode == TERN_WS_TEXT ? "text" : "binary", len,
                  (unsigned long long)run->o->reply_size);
        return;
    }
    if (--c->owed == 0)
        fanout_round_done(c);
}

/* Fanout: the end of the measured time. A round still in flight is
 * judged only when it is already late. Then the run ends. */
static void fanout_measure_end(load_run *run) {
    uint64_t iv = run->o->interval_ms * 1000000u;
    for (uint32_t i = 0; i < run->o->connections; i++) {
        load_conn *c = &run->conns[i];
        if (!c->awaiting || c->sent_ns < run->t0_ns)
            continue;
        if (run->t1_ns - c->sent_ns > iv)
            run->m.late++;
        else
            run->m.rounds_sent--;
    }
    load_close_all(run);
}

/* When round k is due: connection k % N's (k / N)-th round. The
 * connections take turns, spread evenly over each interval. */
static uint64_t fanout_due(const load_run *run, uint64_t k) {
    const load_opts *o = run->o;
    uint64_t iv = o->interval_ms * 1000000u;
    return run->fanout.sched_ns + k / o->connections * iv +
           k % o->connections * iv / o->connections;
}

/* Every millisecond: the rounds that are due. A connection whose last
 * round is still in flight (or whose request is not out yet) skips this
 * one, which counts as missed. */
static void on_fanout_tick(tern_timer *t, void *user) {
    (void)t;
    load_run *run = user;
    if (run->failed || run->phase == PH_CLOSE)
        return;
    uint64_t now = load_now_ns(), due;
    for (; (due = fanout_due(run, run->fanout.cursor)) <= now && !run->failed;
         run->fanout.cursor++) {
        load_conn *c = &run->conns[run->fanout.cursor % run->o->connections];
        bool counted = run->phase == PH_MEASURE && due >= run->t0_ns;
        if (c->state != CS_OPEN)
            continue;
        if (c->awaiting || tern_ws_buffered(c->ws) > 0) {
            run->m.skipped += counted;
            continue;
        }
        run->m.rounds_sent += counted;
        c->awaiting = true;
        c->sent_ns = due;
        c->owed = run->o->replies;
        load_send(c, run->payload, (size_t)run->o->size);
    }
}

/* Every connection is open: the rounds start, on a tick every millisecond. */
static void fanout_begin(load_run *run) {
    run->fanout.sched_ns = run->open_ns;
    load_begin_timed(run);
    load_start_tick(run, on_fanout_tick);
}

/* The request: size bytes of 'r'. */
static int fanout_prepare(load_run *run) {
    memset(run->payload, 'r', (size_t)run->o->size);
    return 0;
}

static void fanout_headline(const load_run *run, FILE *f) {
    const load_opts *o = run->o;
    fprintf(f, "tern load fanout %s: %u connections, a round of %u x %llu bytes every %.3f s "
               "each\n", o->url, o->connections, o->replies, (unsigned long long)o->reply_size,
            (double)o->interval_ms / 1e3);
}

static void fanout_results(const load_run *run, load_results *r) {
    const load_measured *m = &run->m;
    r->rounds_sent = m->rounds_sent;
    r->rounds = m->rounds;
    r->late = m->late;
    r->skipped = m->skipped;
    r->missed = m->late + m->skipped;
    r->mb_per_s = r->msg_per_s * (double)run->o->reply_size / 1e6;
}

const load_mode_ops load_fanout_ops = {
    .name = "fanout",
    .defaults = {.mode = LOAD_FANOUT, .connections = 1000, .size = 16, .replies = 10,
                 .reply_size = 10000, .interval_ms = 1000, .duration_ms = 10000,
                 .warmup_ms = 2000},
    .prepare = fanout_prepare,
    .begin = fanout_begin,
    .on_message = fanout_message,
    .measure_end = fanout_measure_end,
    .headline = fanout_headline,
    .results = fanout_results,
};
