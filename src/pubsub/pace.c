/* Replay pacing (tern_pubsub_options.replay_rate): a loop's token bucket
 * for the bytes of history it sends, and the timer that sends the
 * replays it held back. */
#include <stdlib.h>

#include "pubsub/pubsub.h"

#define PACE_TURN 65536   /* bytes a paced subscription may send per turn */

/* The bucket holds at most one timer tick's worth (and at least one turn),
 * so that a replay starting after a quiet spell cannot go out unpaced. */
void tern__ps_refill(tern__ps_registry *r) {
    uint64_t rate = r->g->opt.replay_rate, now = tern__ps_mono_ms();
    uint64_t burst = rate / 100 > PACE_TURN ? rate / 100 : PACE_TURN;
    r->tokens += (now - r->tokens_ms) * rate / 1000;
    if (r->tokens > burst)
        r->tokens = burst;
    r->tokens_ms = now;
}

void tern__ps_paced_remove(tern__ps_registry *r, tern__ps_sub *s) {
    if (!s->paced)
        return;
    *(s->pprev ? &s->pprev->pnext : &r->paced_head) = s->pnext;
    *(s->pnext ? &s->pnext->pprev : &r->paced_tail) = s->pprev;
    s->paced = false;
    s->pnext = s->pprev = NULL;
    if (r->paced_head == NULL && r->pace_timer) {
        tern_timer_stop(r->pace_timer);
        r->pace_timer = NULL;
    }
}

static void pace_tick(tern_timer *tm, void *user);

/* s's queue holds a replay the tokens did not cover: the timer sends it. */
void tern__ps_paced_add(tern__ps_registry *r, tern__ps_sub *s) {
    if (s->paced)
        return;
    if (r->pace_timer == NULL &&
        tern_timer_start(tern_server_loop(r->srv), &r->pace_timer, 10, 10, pace_tick, r) < 0)
        return;   /* out of memory: left to the drains, unpaced */
    s->paced = true;
    s->pprev = r->paced_tail;
    *(r->paced_tail ? &r->paced_tail->pnext : &r->paced_head) = s;
    r->paced_tail = s;
}

/* Every 10 ms while replays wait: the tokens go round the paced
 * subscriptions, up to PACE_TURN bytes each per turn (so that several
 * frames leave in one write through the cork; a connection whose kernel
 * buffer is full is skipped), so that no one waits for the others' whole
 * replays. */
static void pace_tick(tern_timer *tm, void *user) {
    (void)tm;
    tern__ps_registry *r = user;
    tern__ps_refill(r);
    uint64_t delivered = 0;
    bool progress = true;
    while (r->paced_head && r->tokens > 0 && progress) {
        progress = false;
        for (tern__ps_sub *s = r->paced_head, *next; s && r->tokens > 0; s = next) {
            next = s->pnext;
            uint64_t sent = delivered;
            for (size_t turn = 0; s->head && r->tokens > 0 && turn < PACE_TURN &&
                                  tern__ps_sub_buffered(s) == 0;) {
                tern__ps_queued *q = s->head;
                size_t len = tern__ws_prepared_len(q->msg);
                r->tokens = len >= r->tokens ? 0 : r->tokens - len;
                turn += len;
                tern__ps_queue_unlink(s, q);
                int rc = tern__ps_sub_send(s, q->msg);
                if (rc >= 0 && rc != TERN_SEND_DROPPED)
                    delivered++;
                else
                    s->dropped++;
                tern_ws_prepared_free(q->msg);
                tern__ps_queued_free(q);
                progress = true;
            }
            RS_ADD(r, s->t->rule, delivered, delivered - sent);
            if (s->head == NULL)
                tern__ps_paced_remove(r, s);   /* may stop this timer: fine from its callback */
        }
    }
    PS_ADD(r, delivered, delivered);
}

/* A message from the history for s: sent as a live one would be, but
 * never dropped by the limit (the history bounds it): a reference joins
 * the queue when s is behind. */
void tern__ps_send_replayed(tern__ps_sub *s, tern_ws_prepared *msg, uint64_t *delivered) {
    if (s->head || tern__ps_sub_buffered(s) > 0) {
        if (tern__ps_queue_add(s, msg, NULL, 0) == 0)
            return;
    }
    int r = tern__ps_sub_send(s, msg);
    if (r >= 0 && r != TERN_SEND_DROPPED)
        (*delivered)++;
    else
        s->dropped++;
}

