/* Batches: the messages posted to a loop wait in their topic's batch,
 * and a pass sends each subscriber every message of the pass in a row, a
 * chunk of subscribers per loop turn (write_delay_ms: a pass starts that
 * long after its first message was published; a topic's throttle_ms: a
 * pass starts at least that long after the topic's last one). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pubsub/pubsub.h"

/* Subscriptions a pass serves per loop turn: between two chunks the loop
 * polls, so a publish that arrives meanwhile joins the next pass instead
 * of waiting for a pass of its own (and its subscribers get it in the
 * same write as the others of that pass). */
#define BATCH_CHUNK 64
/* Messages a topic's batch holds at most: past it, the pass under way and
 * the next are finished at once, so a publisher that outruns the passes
 * waits for them rather than growing the batch. */
#define BATCH_MAX 256

static void batch_unlink(tern__ps_registry *r, tern__ps_topic *t) {
    *(t->bprev ? &t->bprev->bnext : &r->batch_head) = t->bnext;
    if (t->bnext)
        t->bnext->bprev = t->bprev;
    t->bprev = t->bnext = NULL;
    t->busy--;
}

/* Sends the pass under way to up to limit more subscriptions. When it
 * reaches the end, its messages are released and the next pass (what came
 * meanwhile) starts over; when nothing is left, t leaves the batch list
 * (t->busy drops, and the caller frees an empty topic). */
static void batch_step(tern__ps_registry *r, tern__ps_topic *t, size_t limit) {
    if (t->npass == 0) {
        t->npass = t->nds;
        t->cursor = 0;
        if (t->o.throttle_ms)
            t->pass_ns = tern__ps_mono_ns();
    }
    size_t end = t->nsubs - t->cursor > limit ? t->cursor + limit : t->nsubs;
    tern__ps_tally n = {0};
    for (size_t i = t->cursor; i < end; i++) {
        tern__ps_sub *s = t->subs[i];
        for (size_t k = 0; s && k < t->npass; k++) {
            tern__ps_pub *p = t->ds[k]->p;
            tern__ps_offer(s, p->msg, p->seq, (const tern_ws *)t->ds[k]->except, p->key,
                           p->klen, &n);
        }
    }
    t->cursor = end;
    size_t done = 0;
    if (end == t->nsubs) {
        done = t->npass;
        for (size_t k = 0; k < done; k++) {
            tern__ps_latency_observe(r, t->ds[k]->p->born_ns);
            tern__ps_delivery_free(t->ds[k]);
        }
        memmove(t->ds, t->ds + done, (t->nds - done) * sizeof(*t->ds));
        t->nds -= done;
        t->npass = 0;
        if (t->holes && t->busy == 1)   /* only the batch runs over subs */
            tern__ps_topic_compact(t);
        if (t->nds == 0)
            batch_unlink(r, t);
    }
    tern__ps_tally_add(r, t, &n, done);
}

/* Runs t's batch to its end now (a publish delivered at once must not
 * pass it; a full batch). */
void tern__ps_batch_finish(tern__ps_registry *r, tern__ps_topic *t) {
    while (t->nds > 0)
        batch_step(r, t, SIZE_MAX);
}

/* Milliseconds until t's next pass may start, first_ns being when the
 * first message of it was published: t's throttle_ms after its last pass
 * started, else opt.write_delay_ms after first_ns. */
static uint64_t pass_wait_ms(tern__ps_registry *r, const tern__ps_topic *t, uint64_t first_ns,
                             uint64_t now_ns) {
    uint64_t due;
    if (t->o.throttle_ms)
        due = t->pass_ns + (uint64_t)t->o.throttle_ms * 1000000;
    else if (r->g->opt.write_delay_ms)
        due = first_ns + (uint64_t)r->g->opt.write_delay_ms * 1000000;
    else
        return 0;
    return due > now_ns ? (due - now_ns + 999999) / 1000000 : 0;
}

/* The same for t's batch (0 once a pass is under way). */
static uint64_t batch_wait_ms(tern__ps_registry *r, const tern__ps_topic *t, uint64_t now_ns) {
    return t->npass > 0 ? 0 : pass_wait_ms(r, t, t->ds[0]->p->born_ns, now_ns);
}

static void batch_tick(tern_timer *tm, void *user);

/* The batch timer fires in ms (now_ns: the mono clock): 0, or -1 when out
 * of memory to arm it. */
static int batch_arm(tern__ps_registry *r, uint64_t ms, uint64_t now_ns) {
    int err = r->batch_timer ? tern_timer_again(r->batch_timer, ms)
                             : tern_timer_start(r->srv->loop, &r->batch_timer, ms, 0,
                                                batch_tick, r);
    if (err < 0)
        return -1;
    r->batch_armed = true;
    r->batch_due_ns = now_ns + ms * 1000000;
    return 0;
}

static void batch_tick(tern_timer *tm, void *user) {
    (void)tm;
    tern__ps_registry *r = user;
    r->batch_armed = false;
    uint64_t now = tern__ps_mono_ns(), wait = UINT64_MAX;
    for (tern__ps_topic *t = r->batch_head, *next; t; t = next) {
        next = t->bnext;
        uint64_t w = batch_wait_ms(r, t, now);
        if (w == 0)
            batch_step(r, t, BATCH_CHUNK);
        if (t->nds == 0) {
            tern__ps_topic_maybe_free(r, t);
            continue;
        }
        w = batch_wait_ms(r, t, now);   /* the next pass, after one ended */
        if (w < wait)
            wait = w;
    }
    if (r->batch_head && batch_arm(r, wait, now) == 0)
        return;
    /* out of memory to arm it: the passes end now */
    while (r->batch_head) {
        tern__ps_topic *t = r->batch_head;
        tern__ps_batch_finish(r, t);
        tern__ps_topic_maybe_free(r, t);
    }
}

/* d joins t's batch. Returns -1 when it cannot (out of memory): then the
 * caller delivers it at once, behind the batch. */
int tern__ps_batch_add(tern__ps_registry *r, tern__ps_topic *t, tern__ps_delivery *d) {
    if (t->nds == BATCH_MAX)
        tern__ps_batch_finish(r, t);
    if (t->nds == t->capds) {
        size_t cap = t->capds ? t->capds * 2 : 8;
        struct tern__ps_delivery **ds = realloc(t->ds, cap * sizeof(*ds));
        if (ds == NULL)
            return -1;
        t->ds = ds;
        t->capds = cap;
    }
    if (t->nds == 0 || !r->batch_armed) {
        /* t's first message (or an idle loop's): its pass starts after
         * its wait, which may come before what the timer waits for (a
         * throttled topic beside a write delay, a quiet one beside a
         * throttled one waiting) */
        uint64_t now = tern__ps_mono_ns();
        uint64_t w = t->nds ? batch_wait_ms(r, t, now) : pass_wait_ms(r, t, d->p->born_ns, now);
        if ((!r->batch_armed || now + w * 1000000 < r->batch_due_ns) && batch_arm(r, w, now) < 0)
            return -1;
    }
    if (t->nds == 0) {
        t->busy++;
        t->npass = 0;
        t->bprev = NULL;
        t->bnext = r->batch_head;
        if (r->batch_head)
            r->batch_head->bprev = t;
        r->batch_head = t;
    }
    t->ds[t->nds++] = d;
    return 0;
}

/* The server is going: its batches are dropped (their subscribers are
 * closed next; a topic whose subscribers have all gone while its batch
 * waited, for a write delay or a throttle, is freed now). */
void tern__ps_batches_drop(tern__ps_registry *r) {
    while (r->batch_head) {
        tern__ps_topic *t = r->batch_head;
        for (size_t k = 0; k < t->nds; k++)
            tern__ps_delivery_free(t->ds[k]);
        t->nds = t->npass = 0;
        batch_unlink(r, t);
        tern__ps_topic_maybe_free(r, t);
    }
    if (r->batch_timer)
        tern_timer_stop(r->batch_timer);
    r->batch_timer = NULL;
    r->batch_armed = false;
}

