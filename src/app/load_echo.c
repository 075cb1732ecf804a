/* tern load echo: N connections, each sends one message, waits for the
 * whole echo, checks it and sends the next; for a time. Reports echoes
 * per second and the round trip times. One clock read per echo: the time
 * the echo completed is also the time the next message is sent. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "app/load.h"

/* Echo: sends message number seq+1 at time now. */
static void echo_send(load_conn *c, uint64_t now) {
    load_run *run = c->run;
    c->seq++;
    uint8_t ctr[8];
    load_put_le64(ctr, c->seq);
    memcpy(run->payload, ctr, run->ctr_len);
    c->awaiting = true;
    c->sent_ns = now;
    load_send(c, run->payload, (size_t)run->o->size);
}

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
        load_fail(run, "connection %u: a message from the server that is not an echo of ours",
                  load_conn_no(c));
        return;
    }
    if (opcode == TERN_WS_TEXT) {
        load_fail(run, "connection %u: wrong echo: a text message for our binary one",
                  load_conn_no(c));
        return;
    }
    if (len != run->o->size) {
        load_fail(run, "connection %u: wrong echo: %zu bytes for the %llu sent", load_conn_no(c),
                  len,
                  (unsigned long long)run->o->size);
        return;
    }
    uint8_t ctr[8];
    load_put_le64(ctr, c->seq);
    if (memcmp(p, ctr, run->ctr_len) != 0 ||
        memcmp(p + run->ctr_len, run->payload + run->ctr_len, len - run->ctr_len) != 0) {
        load_fail(run, "connection %u: wrong echo: message %llu differs from what was sent at "
                       "byte %zu", load_conn_no(c), (unsigned long long)c->seq,
                  echo_first_diff(c, p, len));
        return;
    }
    c->awaiting = false;
    uint64_t now = load_now_ns();
    if (run->phase == PH_MEASURE) {
        run->m.messages++;
        load_hist_record(&run->m.hist, now - c->sent_ns);
    }
    echo_send(c, now);
}

/* Every connection is open: the warm-up (or the measured time) begins
 * with every connection's first message. */
static void echo_begin(load_run *run) {
    const load_opts *o = run->o;
    run->phase = o->warmup_ms ? PH_WARMUP : PH_MEASURE;
    run->t0_ns = run->open_ns;
    load_arm_phase(run, o->warmup_ms ? o->warmup_ms : o->duration_ms);
    for (uint32_t i = 0; i < o->connections && !run->failed; i++)
        echo_send(&run->conns[i], load_now_ns());
}

/* The payload: its first bytes the sequence number (written per send),
 * then bytes that are not all one, so a shifted or reordered echo shows. */
static int echo_prepare(load_run *run) {
    const load_opts *o = run->o;
    run->ctr_len = o->size < LOAD_CTR_LEN ? (size_t)o->size : LOAD_CTR_LEN;
    for (uint64_t i = 0; i < o->size; i++)
        run->payload[i] = (uint8_t)(i * 131 + (i >> 8) + 7);
    return 0;
}

static void echo_headline(const load_run *run, FILE *f) {
    const load_opts *o = run->o;
    fprintf(f, "tern load echo %s: %u connection%s, %llu-byte messages\n", o->url,
            o->connections, o->connections == 1 ? "" : "s", (unsigned long long)o->size);
}

const load_mode_ops load_echo_ops = {
    .name = "echo",
    .defaults = {.mode = LOAD_ECHO, .connections = 100, .size = 64, .duration_ms = 5000,
                 .warmup_ms = 1000},
    .prepare = echo_prepare,
    .begin = echo_begin,
    .on_message = echo_message,
    .headline = echo_headline,
};
