/* tern load pipeline: N connections, each writes a batch of P messages at
 * once and the next batch when every echo of the last one is back; a
 * fixed number of messages, the warm-up's first. Reports echoes per
 * second. The echoes are only counted, where they lie in the loop's read
 * buffer. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "app/load.h"

/* Pipeline: sends the next batch of the phase (left > 0): its messages
 * are corked together and written at once at the end of the batch. */
static void pipeline_send(load_conn *c) {
    load_run *run = c->run;
    uint64_t k = c->left < run->o->depth ? c->left : run->o->depth;
    c->batch = (uint32_t)k;
    c->owed = (uint32_t)k;
    for (uint64_t i = 0; i < k; i++)
        if (!load_send(c, run->payload, (size_t)run->o->size))
            return;
}

/* Pipeline: this connection has sent and got back every message of the
 * phase. The measured phase starts when every connection is through the
 * warm-up, and ends when the last one is through it. */
static void pipeline_conn_finished(load_conn *c) {
    load_run *run = c->run;
    if (run->phase == PH_WARMUP) {
        if (++run->ready < run->o->connections)
            return;
        run->phase = PH_MEASURE;
        run->t0_ns = load_now_ns();
        for (uint32_t i = 0; i < run->o->connections && !run->failed; i++) {
            run->conns[i].left = run->o->iterations;
            pipeline_send(&run->conns[i]);
        }
        return;
    }
    if (++run->finished == run->o->connections) {
        run->t1_ns = load_now_ns();
        load_close_all(run);
    }
}

/* Pipeline: the echoes are counted; each must be a binary message of the
 * size sent, and none may come beyond what the batch owes. */
static void pipeline_message(load_conn *c, const uint8_t *p, size_t len, int opcode) {
    (void)p;
    load_run *run = c->run;
    if (c->owed == 0) {
        load_fail(run, "connection %u: a message from the server that we did not ask for",
                  load_conn_no(c));
        return;
    }
    if (opcode != TERN_WS_BINARY || len != run->o->size) {
        load_fail(run, "connection %u: an echo that is a %s message of %zu bytes, not a binary "
                       "one of %llu", load_conn_no(c),
                  opcode == TERN_WS_TEXT ? "text" : "binary", len,
                  (unsigned long long)run->o->size);
        return;
    }
    if (--c->owed > 0)
        return;
    c->left -= c->batch;
    if (run->phase == PH_MEASURE)
        run->m.messages += c->batch;
    if (c->left > 0)
        pipeline_send(c);
    else
        pipeline_conn_finished(c);
}

/* Every connection is open: each sends its first batch of the warm-up (or
 * of the measured messages). The phases end by count, not by a timer. */
static void pipeline_begin(load_run *run) {
    const load_opts *o = run->o;
    run->phase = o->warmup_iterations ? PH_WARMUP : PH_MEASURE;
    run->t0_ns = run->open_ns;
    for (uint32_t i = 0; i < o->connections && !run->failed; i++) {
        run->conns[i].left = o->warmup_iterations ? o->warmup_iterations : o->iterations;
        pipeline_send(&run->conns[i]);
    }
}

static const char *pipeline_check(const load_opts *o) {
    if ((uint64_t)o->depth * (o->size + LOAD_FRAME_MAX_HEADER) > LOAD_MAX_BATCH)
        return "--depth x --size is over 1073741824 bytes a batch";   /* LOAD_MAX_BATCH */
    return NULL;
}

static int pipeline_prepare(load_run *run) {
    const load_opts *o = run->o;
    run->echo_len = load_server_header_len(o->size) + (size_t)o->size;
    for (uint64_t i = 0; i < o->size; i++)
        run->payload[i] = (uint8_t)('a' + i % 26);
    return 0;
}

static void pipeline_headline(const load_run *run, FILE *f) {
    const load_opts *o = run->o;
    fprintf(f, "tern load pipeline %s: %u connection%s, depth %u, %llu-byte messages\n", o->url,
            o->connections, o->connections == 1 ? "" : "s", o->depth,
            (unsigned long long)o->size);
}

static void pipeline_results(const load_run *run, load_results *r) {
    r->echo_bytes = run->m.messages * run->echo_len;
}

const load_mode_ops load_pipeline_ops = {
    .name = "pipeline",
    .defaults = {.mode = LOAD_PIPELINE, .connections = 1, .size = 16, .depth = 8,
                 .iterations = 200000, .warmup_iterations = 20000},
    .check = pipeline_check,
    .prepare = pipeline_prepare,
    .begin = pipeline_begin,
    .on_message = pipeline_message,
    .headline = pipeline_headline,
    .results = pipeline_results,
};
