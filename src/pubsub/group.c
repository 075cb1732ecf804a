/* The shared table of a group: one entry per topic named on any loop of
 * the configuration (epoch, seq, subscriber counts, history), under the
 * group's mutex; epochs; histories and their byte budget; where a new
 * subscription starts (resume). */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pubsub/history.h"
#include "platform/platform.h"
#include "pubsub/pubsub.h"

void tern__ps_order_unref(tern__ps_order *o) {
    if (o && atomic_fetch_sub(&o->refs, 1) == 1)
        free(o);
}

tern__ps_gtopic *tern__ps_gfind(tern__ps_group *g, const char *name, size_t len, uint64_t h) {
    if (g->topics.nb == 0)
        return NULL;
    for (tern__ps_node *n = *tern__ps_bucket(&g->topics, h); n; n = n->next) {
        tern__ps_gtopic *t = (tern__ps_gtopic *)n;
        if (n->hash == h && t->len == len && memcmp(t->name, name, len) == 0)
            return t;
    }
    return NULL;
}

uint64_t tern__ps_mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* A new epoch: random, so that a restarted server (or a topic whose
 * history ran out) never reuses one a client may still hold; never 0. */
uint64_t tern__ps_new_epoch(void) {
    static _Atomic uint64_t counter;
    uint64_t e = 0;
    if (tern__plat_random(&e, sizeof(e), false) < 0)
        e = (tern__ps_mono_ms() << 20) ^ (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull;
    e ^= atomic_fetch_add(&counter, 1);
    return e ? e : 1;
}

/* Gives t a history (its settings ask for one) and puts it on the list. */
static void hist_link(tern__ps_group *g, tern__ps_gtopic *t, const tern_topic_options *o) {
    if ((t->hist = tern__hist_new(o->history, o->history_ms, &g->hist_bytes)) == NULL)
        return;
    g->nhist++;
    t->hnext = g->hhead;
    if (g->hhead)
        g->hhead->hprev = t;
    g->hhead = t;
}

static void hist_unlink(tern__ps_group *g, tern__ps_gtopic *t) {
    tern__hist_free(t->hist);
    t->hist = NULL;
    g->nhist--;
    if (g->hcursor == t)
        g->hcursor = t->hnext;
    if (t->hprev)
        t->hprev->hnext = t->hnext;
    else
        g->hhead = t->hnext;
    if (t->hnext)
        t->hnext->hprev = t->hprev;
    t->hnext = t->hprev = NULL;
}

/* After a message was kept in t's history: while the group's histories
 * are over the byte budget, the oldest message goes from a topic that
 * keeps more than its share (the budget over the topics with a history):
 * t itself when it does, else the next such topic on the list, looked
 * for round the list from where the last search stopped (some topic is
 * over its share while the sum is over the budget, so one turn finds
 * it). So a busy topic pays for its own messages, and a quiet one keeps
 * its share. Under the mutex. */
void tern__ps_hist_budget(tern__ps_group *g, tern__ps_gtopic *t) {
    size_t budget = g->opt.history_bytes;
    while (budget && g->hist_bytes > budget && g->nhist > 0) {
        size_t share = budget / g->nhist;
        tern__ps_gtopic *v = tern__hist_bytes(t->hist) > share ? t : NULL;
        for (size_t i = 0; v == NULL && i <= g->nhist; i++) {
            tern__ps_gtopic *c = g->hcursor ? g->hcursor : g->hhead;
            g->hcursor = c->hnext;
            if (tern__hist_bytes(c->hist) > share)
                v = c;
        }
        if (v == NULL || tern__hist_shed(v->hist) == 0)
            return;
    }
}

/* Frees t when nothing keeps it: no subscription, no history left. A
 * topic with a history that has numbered nothing yet is kept too (unless
 * sweeping: at TERN_HISTORY_TOPICS it makes room like an expired one), so
 * that its epoch lives on: a subscriber that leaves it and comes back
 * with that epoch has missed nothing, and is told so (a forgotten entry
 * would come back under a new epoch and refuse the resume). */
bool tern__ps_gtopic_maybe_free(tern__ps_group *g, tern__ps_gtopic *t, bool sweeping) {
    if (t->subs > 0)
        return false;
    if (t->hist) {
        tern__hist_prune(t->hist, tern__ps_mono_ms());
        if (!tern__hist_empty(t->hist) || (t->seq == 0 && !sweeping))
            return false;
        hist_unlink(g, t);
    }
    tern__ps_table_del(&g->topics, &t->n);
    tern__ps_order_unref(t->ord);
    free(t);
    return true;
}

/* At TERN_HISTORY_TOPICS: frees the entries kept only by a history that
 * has since run out, or that never numbered anything (nothing else frees
 * an entry no one touches), so that
 * new topics can have one again. Under the mutex. */
static void sweep_histories(tern__ps_group *g) {
    uint64_t now = tern__ps_mono_ms();
    for (size_t i = 0; i < g->topics.nb; i++)
        for (tern__ps_node *n = g->topics.b[i], *next; n; n = next) {
            next = n->next;
            tern__ps_gtopic *t = (tern__ps_gtopic *)n;
            if (t->hist && t->subs == 0) {
                tern__hist_prune(t->hist, now);
                tern__ps_gtopic_maybe_free(g, t, true);
            }
        }
}

/* A new entry for name (under the mutex), with a history when its
 * settings ask for one and the group has room for another. NULL when out
 * of memory. */
tern__ps_gtopic *tern__ps_gtopic_new(tern__ps_group *g, const char *name, size_t len, uint64_t h) {
    tern__ps_gtopic *t;
    if (tern__ps_table_grow(&g->topics) < 0 || (t = calloc(1, sizeof(*t) + len + 1)) == NULL)
        return NULL;
    t->n.hash = h;
    t->len = len;
    memcpy(t->name, name, len);
    t->epoch = tern__ps_new_epoch();
    /* Every loop the group will have: in tern_run's setup only the first
     * exists yet (a topic subscribed there is made now); a loop beyond
     * these (a server cloned later by hand) gets its deliveries unordered
     * against the publishing loop's own (post_all). */
    int loops = g->cfg->npeers > g->cfg->nloops_planned ? g->cfg->npeers : g->cfg->nloops_planned;
    loops = loops > 0 ? loops : 1;
    if ((t->ord = calloc(1, sizeof(*t->ord) + sizeof(t->ord->inflight[0]) * (size_t)loops))) {
        atomic_init(&t->ord->refs, 1);
        t->ord->n = loops;
    }
    tern_topic_options o = tern__ps_topic_settings(g, name, len);
    t->throttled = o.throttle_ms > 0;
    if (o.history && g->nhist >= TERN_HISTORY_TOPICS)
        sweep_histories(g);
    if (o.history && g->nhist < TERN_HISTORY_TOPICS)
        hist_link(g, t, &o);
    tern__ps_table_add(&g->topics, &t->n);
    return t;
}

/* Under the mutex: what a new subscription to t starts with. */
static void resume_read(tern__ps_gtopic *t, tern__ps_resume *rq) {
    rq->out = (tern_resume){.epoch = t->epoch, .seq = t->seq};
    rq->msgs = NULL;
    rq->n = 0;
    if (rq->latest) {
        /* the same frames a gap gets: a new subscriber starts from the
         * state of every key, not only what is published after it */
        if (t->hist) {
            tern__hist_prune(t->hist, tern__ps_mono_ms());
            rq->n = tern__hist_latest(t->hist, &rq->msgs);
        }
        if (rq->n < 0)
            rq->n = 0;
        rq->out.replayed = (uint64_t)rq->n;
        return;
    }
    if (rq->epoch == 0)
        return;
    tern__ps_bridge_resume(t, rq);
    if (rq->epoch == t->epoch && rq->after >= t->seq) {
        /* Nothing missed. A client ahead of this node (it had them from
         * another node, and this one has not heard them all yet) gets
         * nothing now, and its stream goes on after its own position:
         * out.seq, which the subscription skips up to, so the messages
         * this node hears late are not sent to it twice. */
        rq->out.resumed = true;
        rq->out.seq = rq->after;
        return;
    }
    if (t->hist == NULL)
        return;
    tern__hist_prune(t->hist, tern__ps_mono_ms());
    uint64_t first = tern__ps_bridge_first(t);
    if (rq->epoch == t->epoch && first != 0 && rq->after + 1 >= first) {
        rq->n = tern__hist_since(t->hist, rq->after, &rq->msgs);
        rq->out.resumed = rq->n >= 0;
    } else {
        rq->n = tern__hist_latest(t->hist, &rq->msgs);
    }
    if (rq->n < 0)
        rq->n = 0;
    rq->out.replayed = (uint64_t)rq->n;
}

/* The first subscription anywhere and the last one tell the bridge. */
int tern__ps_gcount(tern__ps_group *g, const char *name, size_t len, uint64_t h, int delta,
                    bool compressed, tern__ps_resume *rq) {
    int err = 0;
    bool changed = false;
    uint64_t claim = 0;   /* an epoch to offer the engine, or 0 */
    pthread_mutex_lock(&g->mu);
    tern__ps_gtopic *t = tern__ps_gfind(g, name, len, h);
    if (delta > 0) {
        if (t == NULL && (t = tern__ps_gtopic_new(g, name, len, h)) == NULL) {
            err = -ENOMEM;
            goto out;
        }
        changed = t->subs == 0;
        t->subs++;
        t->compressed += compressed;
        if (rq)
            resume_read(t, rq);
        claim = tern__ps_bridge_claim_due(g, t);
    } else if (t) {
        t->subs--;
        t->compressed -= compressed;
        changed = t->subs == 0;
        tern__ps_gtopic_maybe_free(g, t, false);
    }
out:
    pthread_mutex_unlock(&g->mu);
    if (changed)
        tern__ps_bridge_topic_changed(g, name, len);
    if (claim)
        tern__ps_bridge_claim(g, name, len, claim);
    return err;
}

size_t tern_topic_subscribers_all(tern_server *srv, const char *name) {
    size_t len;
    if (srv == NULL || tern__ps_check_topic(name, &len) < 0)
        return 0;
    tern__ps_group *g = tern__ps_group_peek(srv->cfg);
    if (g == NULL)
        return 0;
    pthread_mutex_lock(&g->mu);
    tern__ps_gtopic *t = tern__ps_gfind(g, name, len, tern__ps_hash_name(name, len));
    size_t n = t ? t->subs : 0;
    pthread_mutex_unlock(&g->mu);
    return n;
}

