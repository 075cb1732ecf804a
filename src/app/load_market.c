/* tern load market: pubsub with keys (instruments) and slow readers:
 * every message carries an instrument's key; a fraction of the
 * subscribers read at a fixed byte rate (they pause and resume reading,
 * tern_ws_pause, on a small receive buffer). Reports the fast ones'
 * latency and gaps, the slow ones' disconnects and, after the publisher
 * stops and they catch up, whether each holds every key's latest message
 * (what a conflating server gives). The publisher and the subscribers are
 * load_pubsub.c's. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/load.h"

/* Market: a message of key k whole. A conflating server sends a key's
 * updates in order and its queue in the order of their latest update, so
 * seqs still rise on every connection, with gaps where it conflated (or
 * dropped); a key that goes back is counted. The fast readers should miss
 * nothing. */
static void market_delivered(load_conn *c, const uint8_t *head, uint64_t sent, uint64_t seq) {
    load_run *run = c->run;
    unsigned k = 0;
    bool ok = head[0] == LOAD_KEY_DIGITS;
    for (int i = 1; i <= LOAD_KEY_DIGITS; i++) {
        ok = ok && head[i] >= '0' && head[i] <= '9';
        k = k * 10 + (unsigned)(head[i] - '0');
    }
    if (!ok || k >= run->o->instruments) {
        load_fail(run, "connection %u: a message whose key we did not publish", load_conn_no(c));
        return;
    }
    if (seq <= c->last_key[k])
        run->m.key_reorders++;
    else
        c->last_key[k] = seq;
    if (!c->slow) {
        if (c->seen && seq != c->next_seq && run->phase == PH_MEASURE) {
            if (seq < c->next_seq)
                run->m.key_reorders++;
            else
                run->m.gaps += seq - c->next_seq;
        }
        c->seen = true;
        if (seq >= c->next_seq)
            c->next_seq = seq + 1;
    }
    if (run->phase == PH_MEASURE) {
        uint64_t now = load_now_ns(), lat = now > sent ? now - sent : 0;
        if (c->slow) {
            run->m.slow_messages++;
            load_hist_record(&run->m.slow_hist, lat);
        } else {
            run->m.messages++;
            load_hist_record(&run->m.hist, lat);
        }
    }
}

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
            load_set_paused(c, false);
    }
}

/* xorshift64: which key each market message updates. */
static uint64_t next_rand(load_run *run) {
    uint64_t x = run->market.rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return run->market.rng = x;
}

/* Before each tick's publishing: every 100 ms, the slow readers' grain. */
static void market_tick(load_run *run) {
    uint64_t tick = (load_now_ns() - run->publisher.start_ns) / 100000000 + 1;   /* 100 ms */
    if (tick != run->market.refill_tick) {
        run->market.refill_tick = tick;
        slow_refill(run);
    }
}

/* A message's head: 4 and the four digits of the key it updates, drawn
 * at random. */
static void market_head(load_run *run, uint8_t *head, uint64_t seq) {
    unsigned key = (unsigned)(next_rand(run) % run->o->instruments);
    run->market.last_pub[key] = seq;
    head[0] = LOAD_KEY_DIGITS;
    for (int d = LOAD_KEY_DIGITS; d >= 1; d--, key /= 10)
        head[d] = (uint8_t)('0' + key % 10);
}

static const char *market_check(const load_opts *o) {
    const char *why = load_pub_check(o);
    if (why == NULL && o->size < LOAD_HEAD_BYTES)
        why = "--size is at least 21 (the stamp and the key)";   /* LOAD_HEAD_BYTES */
    return why;
}

/* The publisher's message, the keys' latest seqs, and which subscribers
 * are slow: slow_fraction of them, spread evenly. */
static int market_prepare(load_run *run) {
    const load_opts *o = run->o;
    int err = load_pub_prepare(run);
    if (err < 0)
        return err;
    run->market.rng = 0x9E3779B97F4A7C15ull ^ load_now_ns();
    if ((run->market.last_pub = calloc(o->instruments, sizeof(uint64_t))) == NULL)
        return -ENOMEM;
    for (uint32_t i = 0; i < o->connections; i++) {
        load_conn *c = &run->conns[i];
        c->slow = (uint64_t)((i + 1) * o->slow_fraction) > (uint64_t)(i * o->slow_fraction);
        run->market.nslow += c->slow;
        if ((c->last_key = calloc(o->instruments, sizeof(uint64_t))) == NULL)
            return -ENOMEM;
    }
    return 0;
}

/* The publisher stops; the slow read freely until the drain ends. */
static void market_measure_end(load_run *run) {
    run->publisher.seq_to = run->publisher.seq;
    run->phase = PH_DRAIN;
    for (uint32_t i = 0; i < run->o->connections && !run->failed; i++)
        if (run->conns[i].paused && run->conns[i].state == CS_OPEN)
            load_set_paused(&run->conns[i], false);
    load_arm_phase(run, run->o->drain_ms);
}

/* After the drain: does every reader hold each key's latest? */
static void market_drain_end(load_run *run) {
    for (uint32_t i = 0; i < run->o->connections; i++) {
        load_conn *c = &run->conns[i];
        if (c->state != CS_OPEN)
            continue;
        for (uint32_t k = 0; k < run->o->instruments; k++)
            if (c->last_key[k] != run->market.last_pub[k])
                *(c->slow ? &run->market.stale_keys : &run->market.stale_fast) += 1;
    }
    load_close_all(run);
}

/* A subscriber the server closed (a slow one, say) is a figure. */
static bool market_closed_is_figure(load_conn *c) {
    if (load_is_publisher(c))
        return false;
    c->run->market.disconnects++;
    return true;
}

static void market_headline(const load_run *run, FILE *f) {
    const load_opts *o = run->o;
    fprintf(f, "tern load market %s: %u subscribers (%u reading %llu bytes/s), one publisher "
               "on %s: %llu msg/s of %llu bytes over %u keys\n", o->url, o->connections,
            run->market.nslow, (unsigned long long)o->slow_rate, o->pub_path,
            (unsigned long long)o->rate, (unsigned long long)o->size, o->instruments);
}

static void market_results(const load_run *run, load_results *r) {
    const load_measured *m = &run->m;
    double secs = r->duration_s;
    r->published = m->published;
    r->publish_rate = secs > 0 ? (double)m->published / secs : 0;
    r->shed = m->pub_shed;
    r->gaps = m->gaps;
    r->slow_messages = m->slow_messages;
    r->slow_msg_per_s = secs > 0 ? (double)m->slow_messages / secs : 0;
    r->slow_p50 = (double)load_hist_quantile(&m->slow_hist, 0.50) / 1e3;
    r->slow_p99 = (double)load_hist_quantile(&m->slow_hist, 0.99) / 1e3;
    r->disconnects = run->market.disconnects;
    r->stale_keys = run->market.stale_keys;
    r->stale_keys_fast = run->market.stale_fast;
    r->key_reorders = m->key_reorders;
}

static const load_pub_kind market_kind = {
    .stamp_off = LOAD_KEY_PREFIX,
    .delivered = market_delivered,
    .tick = market_tick,
    .head = market_head,
};

const load_mode_ops load_market_ops = {
    .name = "market",
    .pub = &market_kind,
    .defaults = {.mode = LOAD_MARKET, .connections = 5000, .size = 512, .rate = 200,
                 .instruments = 100, .slow_fraction = 0.1, .slow_rate = 16384,
                 .duration_ms = 10000, .warmup_ms = 2000, .drain_ms = 3000},
    .check = market_check,
    .prepare = market_prepare,
    .begin = load_pub_begin,
    .on_message = load_sub_message,
    .measure_begin = load_pub_measure_begin,
    .measure_end = market_measure_end,
    .drain_end = market_drain_end,
    .closed_is_figure = market_closed_is_figure,
    .headline = market_headline,
    .results = market_results,
};
