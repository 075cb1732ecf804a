/* Pub/sub: a registry per loop, a small table shared by the loops of a
 * configuration (seq numbers and subscriber counts), and publishes that
 * reach the other loops as posted references to one prepared frame.
 *
 * Per loop (the server's TERN__SRV_SLOT_PUBSUB slot, touched by that
 * loop's thread only; its counters are read by any):
 * - topics: name -> the topic's subscriptions (an array, in no order);
 * - conns: ws -> its subscriptions, so that a close (or unsubscribe) finds
 *   them without scanning topics; a ws with no subscription has no entry,
 *   and tern_ws stays as it is.
 * A subscription is one node in both: the topic's array holds it at
 * sub->index.
 *
 * Shared (the group, in the configuration's slot, under its mutex): name -> epoch, seq, the
 * number of subscriptions over all loops, and the topic's history when its
 * options give it one (history.c). An entry lives while that number is not
 * 0 or its history is not empty. A message is numbered, framed, recorded
 * in the history and posted to the loops under the mutex, so that every
 * loop gets a topic's messages in seq order, its history is in that order,
 * and a resume reads it whole (torder says how a publishing loop keeps its
 * own subscribers in that order).
 *
 * No user callback runs here: sends go through tern_ws_send_prepared,
 * which defers the slow-consumer close to the end of the batch, and the
 * close policy of this layer uses the same deferred close. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "http/server.h"
#include "loop/log.h"
#include "loop/loop.h"
#include "pubsub/history.h"
#include "pubsub/redis.h"
#include "tern/pubsub.h"
#include "ws/ws.h"

#define DEFAULT_MAX_BACKLOG (1u << 20)
#define DEFAULT_MAX_SUBS 1024u

/* ---- hashing ---------------------------------------------------------- */

static uint64_t hash_name(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;   /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t hash_ptr(const void *p) {
    return ((uint64_t)(uintptr_t)p >> 4) * 0x9E3779B97F4A7C15ull;
}

/* A chained table of nodes that start with this; buckets is a power of 2. */
typedef struct node {
    struct node *next;
    uint64_t hash;
} node;

typedef struct table {
    node **b;
    size_t nb, count;
} table;

static node **slot(table *t, uint64_t h) { return &t->b[h & (t->nb - 1)]; }

static int table_grow(table *t) {
    if (t->count < t->nb)
        return 0;
    size_t nb = t->nb ? t->nb * 2 : 16;
    node **b = calloc(nb, sizeof(*b));
    if (b == NULL)
        return t->nb ? 0 : -ENOMEM;   /* a full table still works, only slower */
    for (size_t i = 0; i < t->nb; i++)
        for (node *n = t->b[i], *next; n; n = next) {
            next = n->next;
            n->next = b[n->hash & (nb - 1)];
            b[n->hash & (nb - 1)] = n;
        }
    free(t->b);
    t->b = b;
    t->nb = nb;
    return 0;
}

static void table_add(table *t, node *n) {
    node **s = slot(t, n->hash);
    n->next = *s;
    *s = n;
    t->count++;
}

static void table_del(table *t, node *n) {
    for (node **p = slot(t, n->hash); *p; p = &(*p)->next)
        if (*p == n) {
            *p = n->next;
            t->count--;
            return;
        }
}

/* ---- the shared table ------------------------------------------------- */

/* A topic's posts in flight to each loop of the group (index as in
 * cfg->peers; one loop outside tern_run), shared by the entry and by every
 * message posted, so it outlives either. A publish on a loop delivers to
 * that loop's subscribers at once only when nothing of the topic is on
 * its way to it from another thread; else it posts to itself behind that,
 * so every loop sees a topic's messages in seq order. */
typedef struct torder {
    _Atomic int refs;
    int n;
    _Atomic uint32_t inflight[];
} torder;

static void torder_unref(torder *o) {
    if (o && atomic_fetch_sub(&o->refs, 1) == 1)
        free(o);
}

typedef struct gtopic {
    node n;
    torder *ord;         /* NULL when out of memory: then no order across threads */
    uint64_t epoch;      /* drawn when the entry is made; never 0 */
    uint64_t seq;        /* the last message's */
    /* Numbered by Redis (a history topic of a bridged group): epoch and
     * seq are Redis's, adopted from the messages heard; fill_to, when
     * above seq, is how far the fills asked of Redis reach (0: none). */
    bool shared;
    uint64_t fill_to;
    /* The epoch this node had given the topic before it adopted Redis's,
     * when it had numbered nothing under it (else 0), and the first seq it
     * delivered under Redis's: a subscriber from before holds old_epoch
     * and Redis's seqs (resume_read maps it). */
    uint64_t old_epoch, adopted_from;
    /* Its epoch was offered to Redis (tern__redis_claim) before any
     * message: once per entry, at its first subscription while bridged. */
    bool claimed;
    tern__hist *hist;    /* NULL: the topic's options give it no history */
    /* The group's list of the entries with a history (hist != NULL), in
     * which the byte budget looks for what to shed. */
    struct gtopic *hnext, *hprev;
    size_t subs;         /* subscriptions on all loops */
    size_t compressed;   /* ... of them, with permessage-deflate */
    size_t len;
    char name[];
} gtopic;

/* A rule of tern_pubsub_topic_rule: the topics starting with prefix get o
 * (its zeros already replaced by the server's values when the group is
 * made). */
typedef struct rule {
    size_t len;
    char prefix[TERN_TOPIC_MAX + 1];
    tern_topic_options o;
} rule;

/* What setup configured (psconf.setup; one block, freed with free()). */
typedef struct conf {
    tern_pubsub_options opt;
    size_t nrules;
    rule rules[];
} conf;

typedef struct group {
    pthread_mutex_t mu;
    table topics;
    tern_pubsub_options opt;   /* defaults applied */
    conf *conf;                /* a copy of setup's, rules completed; NULL when none */
    /* The Redis bridge (tern_pubsub_redis), run by bridge_srv's loop and
     * freed with that server; set once in setup, read by any thread. */
    tern__redis *_Atomic redis;
    tern_server *bridge_srv;
    /* Jobs posted to the bridge's loop and not yet run: while there are
     * any, a publish on that loop goes behind them too, or it would reach
     * Redis before a publish another thread made earlier (a node's
     * publishes keep their order). */
    _Atomic int bridge_jobs;
    size_t nhist;              /* entries with a history (TERN_HISTORY_TOPICS at most) */
    /* Those entries as a list (gtopic.hnext), where the byte budget's
     * search for a topic over its share goes on (hcursor, NULL: from the
     * head), and the bytes all their histories count together. */
    struct gtopic *hhead, *hcursor;
    size_t hist_bytes;
    const tern__server_config *cfg;   /* its loops: cfg->peers */
    /* Publishes made on this node, by the slot of their topic's rule
     * (rule_slot): counted on the publish path, which takes mu anyway,
     * never on the delivery path. */
    _Atomic uint64_t published[TERN_TOPIC_RULES_MAX + 1];
} group;

/* Pub/sub's slot of a configuration (TERN__SRV_SLOT_PUBSUB), made at first
 * use by whichever thread: setup's options (tern_pubsub_configure, before
 * serving) and the group, made when pub/sub is first used, which freezes
 * the options. */
typedef struct psconf {
    conf *setup;
    _Atomic(group *) g;
} psconf;

static gtopic *gfind(group *g, const char *name, size_t len, uint64_t h) {
    if (g->topics.nb == 0)
        return NULL;
    for (node *n = *slot(&g->topics, h); n; n = n->next) {
        gtopic *t = (gtopic *)n;
        if (n->hash == h && t->len == len && memcmp(t->name, name, len) == 0)
            return t;
    }
    return NULL;
}

static void group_free(void *p) {
    group *g = p;
    for (size_t i = 0; i < g->topics.nb; i++)
        for (node *n = g->topics.b[i], *next; n; n = next) {
            next = n->next;
            tern__hist_free(((gtopic *)n)->hist);
            torder_unref(((gtopic *)n)->ord);
            free(n);
        }
    free(g->topics.b);
    free(g->conf);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

static void registry_free(tern_server *srv);
static void ws_closed(tern_server *srv, tern_ws *ws);

static void ws_drained(tern_server *srv, tern_ws *ws);

static void psconf_free(void *p) {
    psconf *pc = p;
    group *g = atomic_load(&pc->g);
    if (g)
        group_free(g);
    free(pc->setup);
    free(pc);
}

static const tern__srv_module module = {
    .ws_closed = ws_closed,
    .ws_drained = ws_drained,
    .server_free = registry_free,
    .config_free = psconf_free,
};

/* The configuration's slot, made at first use by whichever thread (the
 * module is registered before the slot is visible). NULL: no memory. */
static psconf *psconf_of(tern__server_config *cfg) {
    psconf *pc = atomic_load(&cfg->slots[TERN__SRV_SLOT_PUBSUB]);
    if (pc)
        return pc;
    if ((pc = calloc(1, sizeof(*pc))) == NULL)
        return NULL;
    atomic_store(&cfg->modules[TERN__SRV_SLOT_PUBSUB], &module);
    void *expected = NULL;
    if (!atomic_compare_exchange_strong(&cfg->slots[TERN__SRV_SLOT_PUBSUB], &expected, pc)) {
        free(pc);
        return expected;
    }
    return pc;
}

/* The configuration's group, or NULL when pub/sub has not been used. */
static group *group_peek(const tern__server_config *cfg) {
    psconf *pc = atomic_load(&((tern__server_config *)cfg)->slots[TERN__SRV_SLOT_PUBSUB]);
    return pc ? atomic_load(&pc->g) : NULL;
}

/* The loop's registry (its slot of srv), or NULL. */
static struct registry *reg(const tern_server *srv) {
    return atomic_load_explicit(&((tern_server *)srv)->slots[TERN__SRV_SLOT_PUBSUB],
                                memory_order_acquire);
}

static void apply_defaults(tern_pubsub_options *o) {
    if (o->max_backlog == 0)
        o->max_backlog = DEFAULT_MAX_BACKLOG;
    if (o->max_subscriptions == 0)
        o->max_subscriptions = DEFAULT_MAX_SUBS;
    if (o->close_code == 0)
        o->close_code = TERN_WS_POLICY;
}

/* The rule a topic named name follows: its exact rule, else the longest
 * rule whose prefix starts it; NULL: none (the server's settings). */
static const rule *topic_rule(const group *g, const char *name, size_t len) {
    const rule *best = NULL;
    for (size_t i = 0; g->conf && i < g->conf->nrules; i++) {
        const rule *r = &g->conf->rules[i];
        if (r->o.exact ? r->len != len : r->len > len)
            continue;
        if (memcmp(r->prefix, name, r->len) != 0)
            continue;
        if (r->o.exact)
            return r;
        if (best == NULL || r->len > best->len)
            best = r;
    }
    return best;
}

/* The slot of a topic's rule in the per-rule counters: 0 for none, else
 * 1 + the rule's index in g->conf. */
static uint8_t rule_slot(const group *g, const char *name, size_t len) {
    const rule *r = topic_rule(g, name, len);
    return r ? (uint8_t)(r - g->conf->rules + 1) : 0;
}

/* The settings a topic named name gets: its rule's, else the server's. */
static tern_topic_options topic_settings(const group *g, const char *name, size_t len) {
    const rule *r = topic_rule(g, name, len);
    if (r)
        return r->o;
    return (tern_topic_options){.max_backlog = g->opt.max_backlog, .policy = g->opt.policy,
                                .close_code = g->opt.close_code, .history = g->opt.history,
                                .history_ms = g->opt.history_ms};
}

/* The configuration's group, made at first use by whichever thread. */
static group *group_of(tern_server *srv) {
    tern__server_config *cfg = srv->cfg;
    psconf *pc = psconf_of(cfg);
    if (pc == NULL)
        return NULL;
    group *g = atomic_load(&pc->g);
    if (g)
        return g;
    g = calloc(1, sizeof(*g));
    if (g == NULL)
        return NULL;
    pthread_mutex_init(&g->mu, NULL);
    g->cfg = cfg;
    const conf *c = pc->setup;
    if (c)
        g->opt = c->opt;
    apply_defaults(&g->opt);
    if (c && c->nrules) {
        size_t size = sizeof(*c) + c->nrules * sizeof(rule);
        if ((g->conf = malloc(size)) == NULL) {
            group_free(g);
            return NULL;
        }
        memcpy(g->conf, c, size);
        for (size_t i = 0; i < c->nrules; i++) {
            tern_topic_options *o = &g->conf->rules[i].o;
            if (o->max_backlog == 0)
                o->max_backlog = g->opt.max_backlog;
            if (o->close_code == 0)
                o->close_code = g->opt.close_code;
            if (o->history == 0)
                o->history = g->opt.history;
            if (o->history_ms == 0)
                o->history_ms = g->opt.history_ms;
        }
    }
    group *expected = NULL;
    if (!atomic_compare_exchange_strong(&pc->g, &expected, g)) {
        group_free(g);
        return expected;
    }
    return g;
}

static bool policy_ok(int policy, uint16_t close_code, uint32_t history) {
    return (policy == TERN_PUBSUB_DROP || policy == TERN_PUBSUB_CLOSE ||
            policy == TERN_PUBSUB_CONFLATE) &&
           (close_code == 0 || close_code == TERN_WS_POLICY || close_code == TERN_WS_TRY_AGAIN) &&
           history <= TERN_HISTORY_MAX;
}

/* Setup's conf block, made at the first call. */
static int setup_conf(tern_server *srv, conf **out) {
    if (srv->cfg->shared || group_peek(srv->cfg))
        return -EBUSY;
    psconf *pc = psconf_of(srv->cfg);
    if (pc == NULL || (pc->setup == NULL && (pc->setup = calloc(1, sizeof(conf))) == NULL))
        return -ENOMEM;
    *out = pc->setup;
    return 0;
}

int tern_pubsub_configure(tern_server *srv, const tern_pubsub_options *opt) {
    if (srv == NULL || opt == NULL || !policy_ok(opt->policy, opt->close_code, opt->history) ||
        opt->write_delay_ms > TERN_WRITE_DELAY_MAX)
        return -EINVAL;
    conf *c;
    int err = setup_conf(srv, &c);
    if (err == 0)
        c->opt = *opt;
    return err;
}

int tern_pubsub_topic_rule(tern_server *srv, const char *prefix, const tern_topic_options *opt) {
    if (srv == NULL || prefix == NULL || opt == NULL ||
        !policy_ok(opt->policy, opt->close_code, opt->history))
        return -EINVAL;
    size_t len = strnlen(prefix, TERN_TOPIC_MAX + 1);
    if (len > TERN_TOPIC_MAX)
        return -ENAMETOOLONG;
    conf *c;
    int err = setup_conf(srv, &c);
    if (err < 0)
        return err;
    size_t i = 0;
    while (i < c->nrules && !(c->rules[i].len == len && c->rules[i].o.exact == opt->exact &&
                              memcmp(c->rules[i].prefix, prefix, len) == 0))
        i++;
    if (i == c->nrules) {
        if (c->nrules == TERN_TOPIC_RULES_MAX)
            return -ENOSPC;
        conf *n = realloc(c, sizeof(*c) + (c->nrules + 1) * sizeof(rule));
        if (n == NULL)
            return -ENOMEM;
        ((psconf *)atomic_load(&srv->cfg->slots[TERN__SRV_SLOT_PUBSUB]))->setup = c = n;
        c->nrules++;
    }
    rule *r = &c->rules[i];
    memset(r, 0, sizeof(*r));
    r->len = len;
    memcpy(r->prefix, prefix, len);
    r->o = *opt;
    return 0;
}

static void bridge_topic_changed(group *g, const char *name, size_t len);
static void bridge_claim(group *g, const char *name, size_t len, uint64_t epoch);

static uint64_t mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* A new epoch: random, so that a restarted server (or a topic whose
 * history ran out) never reuses one a client may still hold; never 0. */
static uint64_t new_epoch(void) {
    static _Atomic uint64_t counter;
    uint64_t e = 0;
    if (getrandom(&e, sizeof(e), GRND_NONBLOCK) != (ssize_t)sizeof(e))
        e = (mono_ms() << 20) ^ (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull;
    e ^= atomic_fetch_add(&counter, 1);
    return e ? e : 1;
}

/* Gives t a history (its settings ask for one) and puts it on the list. */
static void hist_link(group *g, gtopic *t, const tern_topic_options *o) {
    if ((t->hist = tern__hist_new(o->history, o->history_ms, &g->hist_bytes)) == NULL)
        return;
    g->nhist++;
    t->hnext = g->hhead;
    if (g->hhead)
        g->hhead->hprev = t;
    g->hhead = t;
}

static void hist_unlink(group *g, gtopic *t) {
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
static void hist_budget(group *g, gtopic *t) {
    size_t budget = g->opt.history_bytes;
    while (budget && g->hist_bytes > budget && g->nhist > 0) {
        size_t share = budget / g->nhist;
        gtopic *v = tern__hist_bytes(t->hist) > share ? t : NULL;
        for (size_t i = 0; v == NULL && i <= g->nhist; i++) {
            gtopic *c = g->hcursor ? g->hcursor : g->hhead;
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
static bool gtopic_maybe_free(group *g, gtopic *t, bool sweeping) {
    if (t->subs > 0)
        return false;
    if (t->hist) {
        tern__hist_prune(t->hist, mono_ms());
        if (!tern__hist_empty(t->hist) || (t->seq == 0 && !sweeping))
            return false;
        hist_unlink(g, t);
    }
    table_del(&g->topics, &t->n);
    torder_unref(t->ord);
    free(t);
    return true;
}

/* At TERN_HISTORY_TOPICS: frees the entries kept only by a history that
 * has since run out, or that never numbered anything (nothing else frees
 * an entry no one touches), so that
 * new topics can have one again. Under the mutex. */
static void sweep_histories(group *g) {
    uint64_t now = mono_ms();
    for (size_t i = 0; i < g->topics.nb; i++)
        for (node *n = g->topics.b[i], *next; n; n = next) {
            next = n->next;
            gtopic *t = (gtopic *)n;
            if (t->hist && t->subs == 0) {
                tern__hist_prune(t->hist, now);
                gtopic_maybe_free(g, t, true);
            }
        }
}

/* A new entry for name (under the mutex), with a history when its
 * settings ask for one and the group has room for another. NULL when out
 * of memory. */
static gtopic *gtopic_new(group *g, const char *name, size_t len, uint64_t h) {
    gtopic *t;
    if (table_grow(&g->topics) < 0 || (t = calloc(1, sizeof(*t) + len + 1)) == NULL)
        return NULL;
    t->n.hash = h;
    t->len = len;
    memcpy(t->name, name, len);
    t->epoch = new_epoch();
    int loops = g->cfg->npeers ? g->cfg->npeers : 1;
    if ((t->ord = calloc(1, sizeof(*t->ord) + sizeof(t->ord->inflight[0]) * (size_t)loops))) {
        atomic_init(&t->ord->refs, 1);
        t->ord->n = loops;
    }
    tern_topic_options o = topic_settings(g, name, len);
    if (o.history && g->nhist >= TERN_HISTORY_TOPICS)
        sweep_histories(g);
    if (o.history && g->nhist < TERN_HISTORY_TOPICS)
        hist_link(g, t, &o);
    table_add(&g->topics, &t->n);
    return t;
}

/* A resume asked of gcount (tern_ws_subscribe_from): in, the client's
 * epoch and last seq (epoch 0: none), or latest (tern_ws_subscribe_latest:
 * the latest message of each key, as after a gap); out, tern_resume's
 * fields and the frames to send (references, msgs[0..n)). */
typedef struct resume_req {
    uint64_t epoch, after;
    bool latest;
    tern_resume out;
    tern_ws_prepared **msgs;
    long n;
} resume_req;

/* Under the mutex: what a new subscription to t starts with. */
static void resume_read(gtopic *t, resume_req *rq) {
    rq->out = (tern_resume){.epoch = t->epoch, .seq = t->seq};
    rq->msgs = NULL;
    rq->n = 0;
    if (rq->latest) {
        /* the same frames a gap gets: a new subscriber starts from the
         * state of every key, not only what is published after it */
        if (t->hist) {
            tern__hist_prune(t->hist, mono_ms());
            rq->n = tern__hist_latest(t->hist, &rq->msgs);
        }
        if (rq->n < 0)
            rq->n = 0;
        rq->out.replayed = (uint64_t)rq->n;
        return;
    }
    if (rq->epoch == 0)
        return;
    if (rq->epoch == t->old_epoch && t->shared) {
        /* subscribed here before the first message, which came numbered
         * by Redis: it got every one from adopted_from on, by Redis's seq */
        if (rq->after == 0)
            rq->after = t->adopted_from - 1;
        if (rq->after + 1 >= t->adopted_from)
            rq->epoch = t->epoch;
    }
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
    tern__hist_prune(t->hist, mono_ms());
    uint64_t first = tern__hist_first(t->hist);
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

/* Counts a subscription in (+1) or out (-1) of the shared table; the
 * first subscription anywhere and the last one tell the Redis bridge. A
 * subscription in reads where it starts into rq (may be NULL). */
static int gcount(group *g, const char *name, size_t len, uint64_t h, int delta,
                  bool compressed, resume_req *rq) {
    int err = 0;
    bool changed = false;
    uint64_t claim = 0;   /* an epoch to offer Redis, or 0 */
    tern__redis *b = atomic_load(&g->redis);
    pthread_mutex_lock(&g->mu);
    gtopic *t = gfind(g, name, len, h);
    if (delta > 0) {
        if (t == NULL && (t = gtopic_new(g, name, len, h)) == NULL) {
            err = -ENOMEM;
            goto out;
        }
        changed = t->subs == 0;
        t->subs++;
        t->compressed += compressed;
        if (rq)
            resume_read(t, rq);
        if (b && t->hist && !t->shared && t->seq == 0 && !t->claimed &&
            tern__redis_connected(b)) {
            /* before the first message: Redis's epoch from now on, so that
             * this subscriber may resume on any node */
            t->claimed = true;
            claim = t->epoch;
        }
    } else if (t) {
        t->subs--;
        t->compressed -= compressed;
        changed = t->subs == 0;
        gtopic_maybe_free(g, t, false);
    }
out:
    pthread_mutex_unlock(&g->mu);
    if (changed && b)
        bridge_topic_changed(g, name, len);
    if (claim)
        bridge_claim(g, name, len, claim);
    return err;
}

/* ---- the registry of one loop ----------------------------------------- */

typedef struct topic topic_t;

/* A message waiting for a subscriber that is behind: a reference to the
 * prepared frame every subscriber shares (not a copy of it), and its key
 * (klen 0: none). */
typedef struct queued {
    struct queued *next, *prev;
    struct queued *hnext;   /* in its subscription's key index (conflation) */
    uint64_t khash;
    tern_ws_prepared *msg;
    bool replay;            /* from the history, held back by pacing */
    size_t klen;
    char key[];
} queued;

/* One subscription.
 * Invariants: head..tail is what waits for ws beyond its connection's
 * backlog, in the order it is to be sent, nq entries of qbytes frame bytes
 * in all; it is not empty only while ws has a backlog (so that a drain
 * comes to send it) or while s is paced (a replay held back by the loop's
 * replay_rate: on the registry's paced list, which its timer sends). In
 * a TERN_PUBSUB_CONFLATE topic it holds at most one entry per key
 * (keyless entries aside), oldest latest-update first. */
typedef struct sub {
    tern_ws *ws;
    topic_t *t;
    size_t index;        /* in t->subs */
    uint64_t dropped, conflated;
    queued *head, *tail;
    uint32_t nq, nkeys;
    size_t qbytes;
    /* Conflating topics: the keyed entries of the queue by key, chained
     * through hnext, knb buckets (a power of 2, at least twice nkeys once
     * made), so that a replacement costs a lookup, not a walk of up to
     * TERN_CONFLATE_KEYS entries per message. NULL until the first one. */
    queued **kb;
    uint32_t knb;
    /* Messages up to this seq were published before the subscription
     * began (or were sent from the history): those still on their way to
     * this loop are not delivered again. */
    uint64_t skip_upto;
    bool compressed;     /* counted as such in the group */
    bool paced;
    struct sub *pnext, *pprev;   /* on the paced list while paced */
    /* rbytes of the queue's frames are a replay held back by pacing
     * (entries marked replay): the backlog limit does not count them
     * against live messages. */
    size_t rbytes;
} sub;

/* A topic's subscriptions on one loop.
 * Invariants: subs[0..nsubs) holds NULL slots (nholes of them) only while
 * busy, which counts the publishes running over subs plus one while the
 * topic has a batch. The batch (ds[0..nds)) is the posted messages not yet
 * written to every subscriber, oldest first: the pass under way sends
 * ds[0..npass) to subs[cursor..nsubs), a chunk per loop turn (npass 0: no
 * pass started yet); ds[npass..nds) came during the pass and go to every
 * subscriber in the next one. So a subscriber gets all of a pass's
 * messages in one write, and under load, when messages arrive while a
 * pass runs, several per write. The topic is on its registry's batch list
 * (bprev, bnext) exactly while nds > 0. */
struct topic {
    node n;
    sub **subs;
    size_t nsubs, cap, nholes;
    uint64_t dropped, conflated;
    tern_topic_options o;   /* its slow-consumer settings (topic_settings) */
    uint8_t rule;        /* its slot in the per-rule counters (rule_slot) */
    int busy;
    bool holes;
    struct delivery **ds;
    size_t nds, capds, npass, cursor;
    struct topic *bprev, *bnext;
    size_t len;
    char name[];
};

typedef struct conn_subs {
    node n;
    tern_ws *ws;
    sub **subs;
    uint32_t nsubs, cap;
} conn_subs;

/* A loop's pub/sub state. Replays (opt.replay_rate): tokens is the bytes
 * of history this loop may still send now, refilled at replay_rate up to
 * one 10 ms tick's worth (tokens_ms: when last); paced_head.. lists
 * the subscriptions whose queue waits for them, and pace_timer runs
 * exactly while the list is not empty. */
typedef struct registry {
    table topics, conns;
    group *g;
    /* tern_pubsub_stats: written by the loop alone, with relaxed loads and
     * stores (PS_ADD), read by any thread. */
    struct {
        _Atomic uint64_t messages, delivered, dropped, closed, subscribed, unsubscribed,
            conflated, queue_max;
        /* tern_pubsub_latency: observations by bucket (latency_le_us),
         * their sum in microseconds and their count */
        _Atomic uint64_t lat[TERN_HISTOGRAM_BUCKETS], lat_sum_us, lat_count;
    } stats;
    /* tern_pubsub_rule_stats: the same, by the slot of the topic's rule
     * (topic_t.rule), a fixed array so that counting allocates nothing. */
    struct {
        _Atomic uint64_t subscribed, unsubscribed, delivered, dropped, conflated, replayed,
            resumed, resumed_gap;
    } rstats[TERN_TOPIC_RULES_MAX + 1];
    tern_server *srv;    /* the loop's server (its counters) */
    sub *paced_head, *paced_tail;
    uint64_t tokens, tokens_ms;
    tern_timer *pace_timer;
    /* The topics with a batch (topic.ds), and the zero-delay timer that
     * runs their passes a chunk per loop turn: armed while the list is
     * not empty (batch_armed), so that the loop polls between chunks. */
    topic_t *batch_head;
    tern_timer *batch_timer;
    bool batch_armed;
} registry;

/* One of r's counters += n: a plain load and store, the loop being the
 * only writer (as TERN__STAT_ADD for the server's). */
#define PS_ADD(r, field, n)                                                                   \
    atomic_store_explicit(&(r)->stats.field,                                                 \
                          atomic_load_explicit(&(r)->stats.field, memory_order_relaxed) +    \
                              (uint64_t)(n),                                                 \
                          memory_order_relaxed)

/* The latency histogram's upper bounds, in microseconds. */
static const uint64_t latency_le_us[TERN_HISTOGRAM_BUCKETS] = {
    50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000,
    1000000, 2500000};

/* One of r's counters of rule slot i += n, as PS_ADD. */
#define RS_ADD(r, i, field, n)                                                                \
    do {                                                                                      \
        if ((n) > 0)                                                                          \
            atomic_store_explicit(                                                            \
                &(r)->rstats[i].field,                                                        \
                atomic_load_explicit(&(r)->rstats[i].field, memory_order_relaxed) +           \
                    (uint64_t)(n),                                                            \
                memory_order_relaxed);                                                        \
    } while (0)

int tern_pubsub_stats(const tern_server *srv, tern_pubsub_counters *out) {
    if (srv == NULL || out == NULL || srv->loop == NULL)
        return -EINVAL;
    /* No registry yet: nothing counted on this loop. The registry lives
     * as long as the server, so the counters outlive nothing they count. */
    const registry *r = reg(srv);
    *out = (tern_pubsub_counters){0};
    if (r == NULL)
        return 0;
#define LOAD(f) atomic_load_explicit(&r->stats.f, memory_order_relaxed)
    out->messages = LOAD(messages);
    out->delivered = LOAD(delivered);
    out->dropped = LOAD(dropped);
    out->closed = LOAD(closed);
    out->conflated = LOAD(conflated);
    out->queue_max = LOAD(queue_max);
    uint64_t in = LOAD(subscribed), gone = LOAD(unsubscribed);
    out->subscriptions = in > gone ? in - gone : 0;
#undef LOAD
    return 0;
}

int tern_pubsub_latency(const tern_server *srv, tern_histogram *out) {
    if (srv == NULL || out == NULL || srv->loop == NULL)
        return -EINVAL;
    *out = (tern_histogram){0};
    const registry *r = reg(srv);
    uint64_t below = 0;
    for (size_t i = 0; i < TERN_HISTOGRAM_BUCKETS; i++) {
        if (r)
            below += atomic_load_explicit(&r->stats.lat[i], memory_order_relaxed);
        out->le_us[i] = latency_le_us[i];
        out->below[i] = below;
    }
    if (r) {
        out->sum_us = atomic_load_explicit(&r->stats.lat_sum_us, memory_order_relaxed);
        out->count = atomic_load_explicit(&r->stats.lat_count, memory_order_relaxed);
    }
    /* Read while the loop counts: a bucket may be ahead of the count. */
    if (out->count < below)
        out->count = below;
    return 0;
}

int tern_pubsub_rule_stats(const tern_server *srv, const char *prefix, bool exact,
                           tern_pubsub_rule_counters *out) {
    if (srv == NULL || prefix == NULL || out == NULL || srv->loop == NULL)
        return -EINVAL;
    *out = (tern_pubsub_rule_counters){0};
    size_t len = strnlen(prefix, TERN_TOPIC_MAX + 1);
    const tern__server_config *cfg = srv->cfg;
    psconf *pc = atomic_load(&((tern__server_config *)cfg)->slots[TERN__SRV_SLOT_PUBSUB]);
    group *g = pc ? atomic_load(&pc->g) : NULL;
    /* Before pub/sub's first use the rules are setup's, and nothing is
     * counted yet; after it the group's copy, in the same order. */
    const conf *c = g ? g->conf : pc ? pc->setup : NULL;
    size_t i = 0;
    while (c && i < c->nrules && !(c->rules[i].len == len && c->rules[i].o.exact == exact &&
                                   memcmp(c->rules[i].prefix, prefix, len) == 0))
        i++;
    if (c == NULL || i == c->nrules)
        return -ENOENT;
    if (g == NULL)
        return 0;
    size_t slot = i + 1;
    out->published = atomic_load_explicit(&g->published[slot], memory_order_relaxed);
    uint64_t in = 0, gone = 0;
    int n = cfg->npeers ? cfg->npeers : 1;
    for (int k = 0; k < n; k++) {
        const tern_server *peer = cfg->npeers ? cfg->peers[k] : srv;
        const registry *r = peer ? reg(peer) : NULL;
        if (r == NULL)
            continue;
#define LOAD(f) atomic_load_explicit(&r->rstats[slot].f, memory_order_relaxed)
        in += LOAD(subscribed);
        gone += LOAD(unsubscribed);
        out->delivered += LOAD(delivered);
        out->dropped += LOAD(dropped);
        out->conflated += LOAD(conflated);
        out->replayed += LOAD(replayed);
        out->resumed += LOAD(resumed);
        out->resumed_gap += LOAD(resumed_gap);
#undef LOAD
    }
    out->subscriptions = in > gone ? in - gone : 0;
    return 0;
}

/* srv is NULL for a client's connection (tern_ws_server): it has none. */
static registry *registry_of(tern_server *srv, bool make) {
    if (srv == NULL)
        return NULL;
    registry *r = reg(srv);
    if (r || !make)
        return r;
    group *g = group_of(srv);
    if (g == NULL || (r = calloc(1, sizeof(*r))) == NULL)
        return NULL;
    r->g = g;
    r->srv = srv;
    atomic_store_explicit(&srv->slots[TERN__SRV_SLOT_PUBSUB], r, memory_order_release);
    return r;
}

static topic_t *tfind(registry *r, const char *name, size_t len, uint64_t h) {
    if (r == NULL || r->topics.nb == 0)
        return NULL;
    for (node *n = *slot(&r->topics, h); n; n = n->next) {
        topic_t *t = (topic_t *)n;
        if (n->hash == h && t->len == len && memcmp(t->name, name, len) == 0)
            return t;
    }
    return NULL;
}

static conn_subs *cfind(registry *r, const tern_ws *ws) {
    if (r == NULL || r->conns.nb == 0)
        return NULL;
    uint64_t h = hash_ptr(ws);
    for (node *n = *slot(&r->conns, h); n; n = n->next)
        if (((conn_subs *)n)->ws == ws)
            return (conn_subs *)n;
    return NULL;
}

static void topic_compact(topic_t *t) {
    size_t j = 0;
    for (size_t i = 0; i < t->nsubs; i++)
        if (t->subs[i]) {
            t->subs[j] = t->subs[i];
            t->subs[j]->index = j;
            j++;
        }
    t->nsubs = j;
    t->nholes = 0;
    t->holes = false;
}

static void topic_maybe_free(registry *r, topic_t *t) {
    if (t->busy)
        return;
    if (t->holes)
        topic_compact(t);
    if (t->nsubs == 0) {
        table_del(&r->topics, &t->n);
        free(t->subs);
        free(t->ds);
        free(t);
    }
}

/* ---- the key index of a conflating subscription ---- */

static queued *kindex_find(const sub *s, const char *key, size_t klen, uint64_t h) {
    for (queued *q = s->kb ? s->kb[h & (s->knb - 1)] : NULL; q; q = q->hnext)
        if (q->khash == h && q->klen == klen && memcmp(q->key, key, klen) == 0)
            return q;
    return NULL;
}

static void kindex_del(sub *s, queued *q) {
    for (queued **p = &s->kb[q->khash & (s->knb - 1)]; *p; p = &(*p)->hnext)
        if (*p == q) {
            *p = q->hnext;
            return;
        }
}

/* Indexes q (a keyed entry just queued); the index doubles when it would
 * be over half full. Returns -1 when out of memory (then q is not queued). */
static int kindex_add(sub *s, queued *q) {
    if (s->knb < 2 * (s->nkeys + 1)) {
        uint32_t nb = s->knb ? s->knb * 2 : 16;
        queued **b = calloc(nb, sizeof(*b));
        if (b == NULL)
            return -1;
        for (uint32_t i = 0; i < s->knb; i++)
            for (queued *e = s->kb[i], *next; e; e = next) {
                next = e->hnext;
                e->hnext = b[e->khash & (nb - 1)];
                b[e->khash & (nb - 1)] = e;
            }
        free(s->kb);
        s->kb = b;
        s->knb = nb;
    }
    q->hnext = s->kb[q->khash & (s->knb - 1)];
    s->kb[q->khash & (s->knb - 1)] = q;
    return 0;
}

/* ---- the queue ---- */

static void list_unlink(sub *s, queued *q) {
    *(q->prev ? &q->prev->next : &s->head) = q->next;
    *(q->next ? &q->next->prev : &s->tail) = q->prev;
}

static void list_push(sub *s, queued *q) {
    q->next = NULL;
    q->prev = s->tail;
    *(s->tail ? &s->tail->next : &s->head) = q;
    s->tail = q;
}

static void queue_unlink(sub *s, queued *q) {
    list_unlink(s, q);
    if (q->klen && s->kb)
        kindex_del(s, q);
    s->nq--;
    s->nkeys -= q->klen > 0;
    s->qbytes -= tern__ws_prepared_len(q->msg);
    if (q->replay)
        s->rbytes -= tern__ws_prepared_len(q->msg);
}

static void queue_push(sub *s, queued *q) {
    list_push(s, q);
    s->nq++;
    s->nkeys += q->klen > 0;
    s->qbytes += tern__ws_prepared_len(q->msg);
}

static void queue_free(sub *s) {
    for (queued *q = s->head, *next; q; q = next) {
        next = q->next;
        tern_ws_prepared_free(q->msg);
        free(q);
    }
    s->head = s->tail = NULL;
    s->nq = s->nkeys = 0;
    s->qbytes = 0;
    s->rbytes = 0;
    free(s->kb);
    s->kb = NULL;
    s->knb = 0;
}

/* msg joins s's queue (a reference, with its key; indexed by it when s's
 * topic conflates). Returns 0, or -1 when out of memory. */
static int queue_add(sub *s, tern_ws_prepared *msg, const char *key, size_t klen) {
    queued *q = malloc(sizeof(*q) + klen);
    if (q == NULL)
        return -1;
    q->klen = klen;
    q->replay = false;
    q->khash = klen ? hash_name(key, klen) : 0;
    if (klen)
        memcpy(q->key, key, klen);
    if (klen && s->t->o.policy == TERN_PUBSUB_CONFLATE && kindex_add(s, q) < 0) {
        free(q);
        return -1;
    }
    q->msg = tern__ws_prepared_ref(msg);
    queue_push(s, q);
    return 0;
}

/* Takes s out of its topic (and the group), and frees it. */
static void paced_remove(registry *r, sub *s);

static void sub_remove(registry *r, sub *s) {
    paced_remove(r, s);
    queue_free(s);
    topic_t *t = s->t;
    if (t->busy) {
        t->subs[s->index] = NULL;
        t->holes = true;
        t->nholes++;
    } else {
        sub *last = t->subs[--t->nsubs];
        t->subs[s->index] = last;
        last->index = s->index;
    }
    gcount(r->g, t->name, t->len, t->n.hash, -1, s->compressed, NULL);
    PS_ADD(r, unsubscribed, 1);
    RS_ADD(r, t->rule, unsubscribed, 1);
    free(s);
    topic_maybe_free(r, t);
}

static void conn_subs_free(registry *r, conn_subs *c) {
    table_del(&r->conns, &c->n);
    free(c->subs);
    free(c);
}

static void ws_closed(tern_server *srv, tern_ws *ws) {
    registry *r = reg(srv);
    conn_subs *c = cfind(r, ws);
    if (c == NULL)
        return;
    for (uint32_t i = 0; i < c->nsubs; i++)
        sub_remove(r, c->subs[i]);
    conn_subs_free(r, c);
}

static void batches_drop(registry *r);

static void registry_free(tern_server *srv) {
    registry *r = reg(srv);
    batches_drop(r);
    for (size_t i = 0; i < r->conns.nb; i++)
        for (node *n = r->conns.b[i], *next; n; n = next) {
            next = n->next;
            ws_closed(srv, ((conn_subs *)n)->ws);
        }
    group *g = r->g;
    if (g->bridge_srv == srv) {
        tern__redis_free(atomic_exchange(&g->redis, NULL));
        g->bridge_srv = NULL;
    }
    if (r->pace_timer)
        tern_timer_stop(r->pace_timer);
    free(r->topics.b);
    free(r->conns.b);
    free(r);
    atomic_store(&srv->slots[TERN__SRV_SLOT_PUBSUB], NULL);
}

static int check_topic(const char *topic, size_t *len) {
    if (topic == NULL || topic[0] == '\0')
        return -EINVAL;
    *len = strnlen(topic, TERN_TOPIC_MAX + 1);
    return *len > TERN_TOPIC_MAX ? -ENAMETOOLONG : 0;
}

static bool ws_open(const tern_ws *ws) {
    return ws->state == TERN__WS_OPEN && !(ws->conn.flags & TERN__CONN_CLOSED);
}

/* ---- replay pacing ---------------------------------------------------- */

#define PACE_TURN 65536   /* bytes a paced subscription may send per turn */

/* The bucket holds at most one timer tick's worth (and at least one turn),
 * so that a replay starting after a quiet spell cannot go out unpaced. */
static void refill(registry *r) {
    uint64_t rate = r->g->opt.replay_rate, now = mono_ms();
    uint64_t burst = rate / 100 > PACE_TURN ? rate / 100 : PACE_TURN;
    r->tokens += (now - r->tokens_ms) * rate / 1000;
    if (r->tokens > burst)
        r->tokens = burst;
    r->tokens_ms = now;
}

static void paced_remove(registry *r, sub *s) {
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
static void paced_add(registry *r, sub *s) {
    if (s->paced)
        return;
    if (r->pace_timer == NULL &&
        tern_timer_start(tern_ws_loop(s->ws), &r->pace_timer, 10, 10, pace_tick, r) < 0)
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
    registry *r = user;
    refill(r);
    uint64_t delivered = 0;
    bool progress = true;
    while (r->paced_head && r->tokens > 0 && progress) {
        progress = false;
        for (sub *s = r->paced_head, *next; s && r->tokens > 0; s = next) {
            next = s->pnext;
            uint64_t sent = delivered;
            for (size_t turn = 0; s->head && r->tokens > 0 && turn < PACE_TURN &&
                                  tern_ws_buffered(s->ws) == 0;) {
                queued *q = s->head;
                size_t len = tern__ws_prepared_len(q->msg);
                r->tokens = len >= r->tokens ? 0 : r->tokens - len;
                turn += len;
                queue_unlink(s, q);
                int rc = tern_ws_send_prepared(s->ws, q->msg);
                if (rc >= 0 && rc != TERN_SEND_DROPPED)
                    delivered++;
                else
                    s->dropped++;
                tern_ws_prepared_free(q->msg);
                free(q);
                progress = true;
            }
            RS_ADD(r, s->t->rule, delivered, delivered - sent);
            if (s->head == NULL)
                paced_remove(r, s);   /* may stop this timer: fine from its callback */
        }
    }
    PS_ADD(r, delivered, delivered);
}

/* A message from the history for s: sent as a live one would be, but
 * never dropped by the limit (the history bounds it): a reference joins
 * the queue when s is behind. */
static void send_replayed(sub *s, tern_ws_prepared *msg, uint64_t *delivered) {
    if (s->head || tern_ws_buffered(s->ws) > 0) {
        if (queue_add(s, msg, NULL, 0) == 0)
            return;
    }
    int r = tern_ws_send_prepared(s->ws, msg);
    if (r >= 0 && r != TERN_SEND_DROPPED)
        (*delivered)++;
    else
        s->dropped++;
}

int tern_ws_subscribe(tern_ws *ws, const char *name) {
    return tern_ws_subscribe_from(ws, name, 0, 0, NULL);
}

/* The route's verdict (its on_subscribe or on_publish) on ws's subscribe
 * or publish to name[0..len): 0 to go on, or a negative errno. Asked once
 * per call, never per delivered message. */
static int authorize(tern_ws *ws, bool publishing, const char *name, size_t len) {
    const tern_ws_handlers *h = &ws->ep->h;
    int (*fn)(tern_ws *, const char *, size_t, void *) = publishing ? h->on_publish
                                                                    : h->on_subscribe;
    if (fn == NULL)
        return 0;
    int rc = fn(ws, name, len, ws->ep->user);
    return rc == 0 ? 0 : rc < 0 ? rc : -EACCES;
}

/* tern_ws_subscribe_from and tern_ws_subscribe_latest: where the
 * subscription starts is rq's (its in fields). */
static int subscribe_req(tern_ws *ws, const char *name, resume_req rq, tern_resume *out);

int tern_ws_subscribe_from(tern_ws *ws, const char *name, uint64_t epoch, uint64_t after,
                           tern_resume *out) {
    return subscribe_req(ws, name, (resume_req){.epoch = epoch, .after = after}, out);
}

int tern_ws_subscribe_latest(tern_ws *ws, const char *name, tern_resume *out) {
    return subscribe_req(ws, name, (resume_req){.latest = true}, out);
}

static int subscribe_req(tern_ws *ws, const char *name, resume_req rq, tern_resume *out) {
    size_t len;
    int err;
    if (ws == NULL)
        return -EINVAL;
    if ((err = check_topic(name, &len)) < 0)
        return err;
    if (!ws_open(ws))
        return -EPIPE;
    tern_server *srv = tern_ws_server(ws);
    if (srv == NULL)
        return -EINVAL;   /* a client's connection */
    if ((err = authorize(ws, false, name, len)) < 0)
        return err;
    if (!ws_open(ws))
        return -EPIPE;   /* the hook closed it */
    registry *r = registry_of(srv, true);
    if (r == NULL)
        return -ENOMEM;
    uint64_t h = hash_name(name, len);
    conn_subs *c = cfind(r, ws);
    topic_t *t = tfind(r, name, len, h);
    if (c && t)
        for (uint32_t i = 0; i < c->nsubs; i++)
            if (c->subs[i]->t == t)
                return -EALREADY;
    if (c && c->nsubs >= r->g->opt.max_subscriptions)
        return -ENOSPC;
    /* Everything that may fail first, then nothing that can. */
    if (table_grow(&r->topics) < 0 || table_grow(&r->conns) < 0)
        return -ENOMEM;
    bool new_c = c == NULL, new_t = t == NULL;
    if (new_c) {
        if ((c = calloc(1, sizeof(*c))) == NULL)
            return -ENOMEM;
        c->n.hash = hash_ptr(ws);
        c->ws = ws;
    }
    if (new_t) {
        if ((t = calloc(1, sizeof(*t) + len + 1)) == NULL)
            goto fail;
        t->n.hash = h;
        t->len = len;
        memcpy(t->name, name, len);
        t->o = topic_settings(r->g, name, len);
        t->rule = rule_slot(r->g, name, len);
    }
    sub *s = calloc(1, sizeof(*s));
    if (s == NULL)
        goto fail;
    if (c->nsubs == c->cap) {
        uint32_t cap = c->cap ? c->cap * 2 : 2;
        sub **p = realloc(c->subs, sizeof(*p) * cap);
        if (p == NULL)
            goto fail_s;
        c->subs = p;
        c->cap = cap;
    }
    if (t->nsubs == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 4;
        sub **p = realloc(t->subs, sizeof(*p) * cap);
        if (p == NULL)
            goto fail_s;
        t->subs = p;
        t->cap = cap;
    }
    s->compressed = tern_ws_compressed(ws);
    if (gcount(r->g, name, len, h, +1, s->compressed, &rq) < 0)
        goto fail_s;
    s->ws = ws;
    s->t = t;
    s->index = t->nsubs;
    s->skip_upto = rq.out.seq;   /* the topic's seq, or a client's ahead of it */
    t->subs[t->nsubs++] = s;
    c->subs[c->nsubs++] = s;
    PS_ADD(r, subscribed, 1);
    RS_ADD(r, t->rule, subscribed, 1);
    if (new_c)
        table_add(&r->conns, &c->n);
    if (new_t)
        table_add(&r->topics, &t->n);
    uint64_t delivered = 0, rate = r->g->opt.replay_rate;
    if (rate && rq.n > 0)
        refill(r);
    for (long i = 0; i < rq.n; i++) {
        tern_ws_prepared *m = rq.msgs[i];
        size_t mlen = tern__ws_prepared_len(m);
        if (rate && (s->paced || r->tokens < mlen))
            paced_add(r, s);
        if (s->paced && queue_add(s, m, NULL, 0) == 0) {   /* held back: the timer sends it */
            s->tail->replay = true;
            s->rbytes += mlen;
        } else {
            r->tokens -= mlen < r->tokens ? mlen : r->tokens;
            send_replayed(s, m, &delivered);
        }
        tern_ws_prepared_free(m);
    }
    free(rq.msgs);
    PS_ADD(r, delivered, delivered);
    RS_ADD(r, t->rule, delivered, delivered);
    RS_ADD(r, t->rule, replayed, rq.n);
    if (rq.epoch != 0 && rq.out.resumed)
        RS_ADD(r, t->rule, resumed, 1);
    else if (rq.epoch != 0)
        RS_ADD(r, t->rule, resumed_gap, 1);
    if (out)
        *out = rq.out;
    return 0;
fail_s:
    free(s);
fail:
    if (new_t && t) {
        free(t->subs);
        free(t);
    }
    if (new_c) {
        free(c->subs);
        free(c);
    }
    return -ENOMEM;
}

int tern_ws_unsubscribe(tern_ws *ws, const char *name) {
    size_t len;
    int err;
    if (ws == NULL)
        return -EINVAL;
    if ((err = check_topic(name, &len)) < 0)
        return err == -ENAMETOOLONG ? -ENOENT : err;
    registry *r = registry_of(tern_ws_server(ws), false);
    conn_subs *c = cfind(r, ws);
    topic_t *t = tfind(r, name, len, hash_name(name, len));
    if (c == NULL || t == NULL)
        return -ENOENT;
    for (uint32_t i = 0; i < c->nsubs; i++)
        if (c->subs[i]->t == t) {
            sub *s = c->subs[i];
            c->subs[i] = c->subs[--c->nsubs];
            sub_remove(r, s);
            if (c->nsubs == 0)
                conn_subs_free(r, c);
            return 0;
        }
    return -ENOENT;
}

static sub *find_sub(const tern_ws *ws, const char *name) {
    size_t len;
    if (ws == NULL || check_topic(name, &len) < 0)
        return NULL;
    registry *r = registry_of(tern_ws_server(ws), false);
    conn_subs *c = cfind(r, ws);
    if (c == NULL)
        return NULL;
    for (uint32_t i = 0; i < c->nsubs; i++)
        if (c->subs[i]->t->len == len && memcmp(c->subs[i]->t->name, name, len) == 0)
            return c->subs[i];
    return NULL;
}

bool tern_ws_subscribed(const tern_ws *ws, const char *name) { return find_sub(ws, name) != NULL; }

uint64_t tern_ws_topic_dropped(const tern_ws *ws, const char *name) {
    sub *s = find_sub(ws, name);
    return s ? s->dropped : 0;
}

uint64_t tern_ws_topic_conflated(const tern_ws *ws, const char *name) {
    sub *s = find_sub(ws, name);
    return s ? s->conflated : 0;
}

static topic_t *local_topic(tern_server *srv, const char *name) {
    size_t len;
    if (srv == NULL || srv->loop == NULL || check_topic(name, &len) < 0)
        return NULL;
    return tfind(reg(srv), name, len, hash_name(name, len));
}

size_t tern_topic_subscribers(tern_server *srv, const char *name) {
    topic_t *t = local_topic(srv, name);
    return t ? t->nsubs - t->nholes : 0;
}

uint64_t tern_topic_dropped(tern_server *srv, const char *name) {
    topic_t *t = local_topic(srv, name);
    return t ? t->dropped : 0;
}

size_t tern_topic_subscribers_all(tern_server *srv, const char *name) {
    size_t len;
    if (srv == NULL || check_topic(name, &len) < 0)
        return 0;
    group *g = group_peek(srv->cfg);
    if (g == NULL)
        return 0;
    pthread_mutex_lock(&g->mu);
    gtopic *t = gfind(g, name, len, hash_name(name, len));
    size_t n = t ? t->subs : 0;
    pthread_mutex_unlock(&g->mu);
    return n;
}

/* ---- publishing ------------------------------------------------------- */

/* One published message on its way to the loops: a reference per loop
 * still to deliver it. */
typedef struct pub {
    _Atomic int refs;
    uint64_t seq;
    torder *ord;         /* a reference, or NULL */
    tern_ws_prepared *msg;
    const char *key;     /* in name's block, after the name; NULL for none */
    size_t len, klen;
    uint64_t born_ns;    /* the monotonic clock at the publish (the latency histogram) */
    char name[];
} pub;

/* One loop's share of a pub: which server (its index in cfg->peers, and
 * in the order), and the connection not to send it to (a publish_except
 * posted to its own loop; only compared, never followed).
 *
 * A delivery may outlive its server: a publish from on_close while
 * tern_server_free closes the connections outside tern_loop_run is posted
 * to the server's own loop, which may run again (or only be freed) after
 * the server is gone; so may one posted by another thread. So it holds no
 * server pointer but a reference to the configuration, and looks the
 * server up in cfg->peers when it runs, on that server's loop thread (the
 * only thread that frees it): NULL there means the server is freed, and
 * its subscribers with it, so the message is dropped. The loop frees a
 * delivery it never ran through its drop hook (tern__loop_post_owned). */
typedef struct delivery {
    pub *p;
    tern__server_config *cfg;   /* a reference */
    int idx;
    /* Compared by address only, which is safe although a connection
     * opened after the publisher closed may reuse the address while the
     * delivery waits (posted, or in a batch): that connection subscribed
     * after the publish, so its subscription skips up to a seq at or past
     * this message's (skip_upto; the group's mutex orders the two), and
     * offer() would skip the message for it anyway. (Its topic's entry may
     * be new, numbering from 0 again; the message predates the
     * subscription all the same, so it is not owed to it.) */
    uintptr_t except;
} delivery;

static void pub_unref(pub *p) {
    if (atomic_fetch_sub(&p->refs, 1) == 1) {
        tern_ws_prepared_free(p->msg);
        torder_unref(p->ord);
        free(p);
    }
}

/* A subscriber of a conflating topic that is behind: msg replaces the
 * queued entry of the same key, which moves to the tail (its latest update
 * is now the newest). Returns 1 when it replaced one, 0 when it joined the
 * queue, -1 when it cannot wait that way (no key, TERN_CONFLATE_KEYS keys
 * already, out of memory). */
static int conflate(sub *s, tern_ws_prepared *msg, const char *key, size_t klen) {
    if (key == NULL)
        return -1;
    queued *q = kindex_find(s, key, klen, hash_name(key, klen));
    if (q) {
        s->qbytes += tern__ws_prepared_len(msg) - tern__ws_prepared_len(q->msg);
        tern_ws_prepared_free(q->msg);
        q->msg = tern__ws_prepared_ref(msg);
        list_unlink(s, q);   /* its key's latest update is now the newest */
        list_push(s, q);
        s->conflated++;
        return 1;
    }
    if (s->nkeys >= TERN_CONFLATE_KEYS)
        return -1;
    return queue_add(s, msg, key, klen);
}

/* After a drain: sends what s's queue holds until the kernel refuses some
 * (the connection has a backlog again) or the queue is empty. The frames
 * go through the loop's cork, so several leave in one write, and only the
 * part of one write that the kernel refused is ever copied. */
static void queue_flush(sub *s, uint64_t *delivered, uint64_t *dropped) {
    while (s->head) {
        queued *q = s->head;
        if (tern_ws_buffered(s->ws) > 0)
            return;   /* the rest waits for the next drain */
        queue_unlink(s, q);
        int r = tern_ws_send_prepared(s->ws, q->msg);
        if (r < 0 || r == TERN_SEND_DROPPED) {
            s->dropped++;
            s->t->dropped++;
            (*dropped)++;
        } else {
            (*delivered)++;
        }
        tern_ws_prepared_free(q->msg);
        free(q);
    }
}

static void ws_drained(tern_server *srv, tern_ws *ws) {
    registry *r = reg(srv);
    conn_subs *c = cfind(r, ws);
    uint64_t delivered = 0, dropped = 0;
    for (uint32_t i = 0; c && i < c->nsubs; i++) {
        sub *s = c->subs[i];
        if (s->head && !s->paced) {   /* a paced one waits for its timer */
            uint64_t d = delivered, x = dropped;
            queue_flush(s, &delivered, &dropped);
            RS_ADD(r, s->t->rule, delivered, delivered - d);
            RS_ADD(r, s->t->rule, dropped, dropped - x);
        }
    }
    PS_ADD(r, delivered, delivered);
    PS_ADD(r, dropped, dropped);
}

static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* One observation of the publish-to-delivery latency on r's loop: a
 * bucket (not cumulative; tern_pubsub_latency sums them up), the sum and
 * the count, each a plain store by the loop. */
static void latency_observe(registry *r, uint64_t born_ns) {
    uint64_t now = mono_ns(), us = now > born_ns ? (now - born_ns) / 1000 : 0;
    size_t i = tern_histogram_bucket(latency_le_us, TERN_HISTOGRAM_BUCKETS, us);
    if (i < TERN_HISTOGRAM_BUCKETS)
        PS_ADD(r, lat[i], 1);
    PS_ADD(r, lat_sum_us, us);
    PS_ADD(r, lat_count, 1);
}

/* What one pass of deliveries did, added to the counters once. */
typedef struct tally {
    uint64_t delivered, dropped, closed, conflated, qmax;
} tally;

static const char *policy_name(int policy) {
    switch (policy) {
    case TERN_PUBSUB_CLOSE: return "close";
    case TERN_PUBSUB_CONFLATE: return "conflate";
    default: return "drop";
    }
}

/* The info line of a slow subscriber the topic's policy acted on: a
 * message dropped for it, or its connection closed (logging.md: "slow
 * consumers dropped or closed"). Rate-limited as every kind is: a
 * subscriber that misses every message does not flood the log. */
static void log_slow(const sub *s, size_t behind, bool closed) {
    if (!tern__log_on(TERN_LOG_INFO))
        return;
    const tern_topic_options *o = &s->t->o;
    char peer[TERN_ADDRSTRLEN] = "-";
    struct sockaddr_storage ss;
    socklen_t sl;
    if (tern_ws_peer(s->ws, &ss, &sl) == 0 &&
        tern_addr_format((struct sockaddr *)&ss, sl, peer, sizeof(peer)) < 0)
        strcpy(peer, "-");
    int tl = s->t->len > 128 ? 128 : (int)s->t->len;
    if (closed)
        tern__log(TERN_LOG_INFO, TERN__LOG_PUBSUB_SLOW,
                  "pubsub: slow consumer %s on topic %.*s, %zu bytes behind: policy %s, closed "
                  "with %d", peer, tl, s->t->name, behind, policy_name(o->policy),
                  o->close_code ? o->close_code : TERN_WS_POLICY);
    else
        tern__log(TERN_LOG_INFO, TERN__LOG_PUBSUB_SLOW,
                  "pubsub: slow consumer %s on topic %.*s, %zu bytes behind: policy %s, message "
                  "dropped", peer, tl, s->t->name, behind, policy_name(o->policy));
}

/* Offers msg (numbered seq, with its key) to s: sent (through the loop's
 * cork, so that what one subscriber is offered in a row leaves in one
 * write), queued behind what s waits for, or dropped or closed by the
 * topic's policy. */
static void offer(sub *s, tern_ws_prepared *msg, uint64_t seq, const tern_ws *except,
                  const char *key, size_t klen, tally *n) {
    const tern_topic_options *o = &s->t->o;
    if (s->ws == except || seq <= s->skip_upto)
        return;
    tern_ws *ws = s->ws;
    size_t mlen = tern__ws_prepared_len(msg);
    size_t backlog = tern_ws_buffered(ws);
    int q;
    if (s->head || backlog > 0) {
        /* Behind: the message waits in s's queue, behind older ones, as a
         * reference; unless what waits would pass the limit. */
        if (o->policy == TERN_PUBSUB_CONFLATE && key != NULL) {
            if ((q = conflate(s, msg, key, klen)) >= 0) {
                n->conflated += (uint64_t)q;
                n->qmax = s->nq > n->qmax ? s->nq : n->qmax;
                return;
            }
        } else if (backlog + s->qbytes - s->rbytes + mlen <= o->max_backlog) {
            if (queue_add(s, msg, key, klen) == 0) {
                n->qmax = s->nq > n->qmax ? s->nq : n->qmax;
                return;
            }
        } else if (o->policy == TERN_PUBSUB_CLOSE) {
            if (ws_open(ws)) {
                log_slow(s, backlog + s->qbytes, true);
                tern__ws_policy_close_code(ws, o->close_code);
                n->closed++;
            }
            return;
        }
        log_slow(s, backlog + s->qbytes, false);
        s->dropped++;
        n->dropped++;
        return;
    }
    /* It could never wait: the policy now. But not for a keyed message
     * under conflation, which the byte limit never drops while the
     * subscriber is behind (its keys bound that): dropped here, for a
     * subscriber with nothing waiting, that key's latest value would never
     * arrive. */
    if (mlen > o->max_backlog && !(o->policy == TERN_PUBSUB_CONFLATE && key != NULL)) {
        if (o->policy == TERN_PUBSUB_CLOSE) {
            if (ws_open(ws)) {
                log_slow(s, backlog, true);
                tern__ws_policy_close_code(ws, o->close_code);
                n->closed++;
            }
        } else {
            log_slow(s, backlog, false);
            s->dropped++;
            n->dropped++;
        }
        return;
    }
    if (tern_ws_send_prepared(ws, msg) == TERN_SEND_DROPPED) {
        s->dropped++;
        n->dropped++;
    } else {
        n->delivered++;
    }
}

static void tally_add(registry *r, topic_t *t, const tally *n, uint64_t messages) {
    t->dropped += n->dropped;
    t->conflated += n->conflated;
    PS_ADD(r, conflated, n->conflated);
    PS_ADD(r, messages, messages);
    PS_ADD(r, delivered, n->delivered);
    PS_ADD(r, dropped, n->dropped);
    PS_ADD(r, closed, n->closed);
    RS_ADD(r, t->rule, conflated, n->conflated);
    RS_ADD(r, t->rule, delivered, n->delivered);
    RS_ADD(r, t->rule, dropped, n->dropped);
    if (n->qmax > atomic_load_explicit(&r->stats.queue_max, memory_order_relaxed))
        atomic_store_explicit(&r->stats.queue_max, n->qmax, memory_order_relaxed);
}

/* ---- batches: posted messages, a subscriber's several in one write ---- */

static void delivery_free(void *user);

/* Subscriptions a pass serves per loop turn: between two chunks the loop
 * polls, so a publish that arrives meanwhile joins the next pass instead
 * of waiting for a pass of its own (and its subscribers get it in the
 * same write as the others of that pass). */
#define BATCH_CHUNK 64
/* Messages a topic's batch holds at most: past it, the pass under way and
 * the next are finished at once, so a publisher that outruns the passes
 * waits for them rather than growing the batch. */
#define BATCH_MAX 256

static void batch_unlink(registry *r, topic_t *t) {
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
static void batch_step(registry *r, topic_t *t, size_t limit) {
    if (t->npass == 0) {
        t->npass = t->nds;
        t->cursor = 0;
    }
    size_t end = t->nsubs - t->cursor > limit ? t->cursor + limit : t->nsubs;
    tally n = {0};
    for (size_t i = t->cursor; i < end; i++) {
        sub *s = t->subs[i];
        for (size_t k = 0; s && k < t->npass; k++) {
            pub *p = t->ds[k]->p;
            offer(s, p->msg, p->seq, (const tern_ws *)t->ds[k]->except, p->key, p->klen, &n);
        }
    }
    t->cursor = end;
    size_t done = 0;
    if (end == t->nsubs) {
        done = t->npass;
        for (size_t k = 0; k < done; k++) {
            latency_observe(r, t->ds[k]->p->born_ns);
            delivery_free(t->ds[k]);
        }
        memmove(t->ds, t->ds + done, (t->nds - done) * sizeof(*t->ds));
        t->nds -= done;
        t->npass = 0;
        if (t->holes && t->busy == 1)   /* only the batch runs over subs */
            topic_compact(t);
        if (t->nds == 0)
            batch_unlink(r, t);
    }
    tally_add(r, t, &n, done);
}

/* Runs t's batch to its end now (a publish delivered at once must not
 * pass it; a full batch). */
static void batch_finish(registry *r, topic_t *t) {
    while (t->nds > 0)
        batch_step(r, t, SIZE_MAX);
}

/* Milliseconds until t's next pass may start (opt.write_delay_ms after
 * the first message of it was published; 0 once a pass is under way). */
static uint64_t batch_wait_ms(registry *r, const topic_t *t, uint64_t now_ns) {
    uint64_t delay_ns = (uint64_t)r->g->opt.write_delay_ms * 1000000;
    if (t->npass > 0 || delay_ns == 0)
        return 0;
    uint64_t due = t->ds[0]->p->born_ns + delay_ns;
    return due > now_ns ? (due - now_ns + 999999) / 1000000 : 0;
}

static void batch_tick(tern_timer *tm, void *user) {
    (void)tm;
    registry *r = user;
    r->batch_armed = false;
    uint64_t now = mono_ns(), wait = UINT64_MAX;
    for (topic_t *t = r->batch_head, *next; t; t = next) {
        next = t->bnext;
        uint64_t w = batch_wait_ms(r, t, now);
        if (w == 0)
            batch_step(r, t, BATCH_CHUNK);
        if (t->nds == 0) {
            topic_maybe_free(r, t);
            continue;
        }
        w = batch_wait_ms(r, t, now);   /* the next pass, after one ended */
        if (w < wait)
            wait = w;
    }
    if (r->batch_head && tern_timer_again(r->batch_timer, wait) == 0)
        r->batch_armed = true;
    else   /* out of memory to arm it: the passes end now */
        while (r->batch_head) {
            topic_t *t = r->batch_head;
            batch_finish(r, t);
            topic_maybe_free(r, t);
        }
}

/* d joins t's batch. Returns -1 when it cannot (out of memory): then the
 * caller delivers it at once, behind the batch. */
static int batch_add(registry *r, topic_t *t, struct delivery *d) {
    if (t->nds == BATCH_MAX)
        batch_finish(r, t);
    if (t->nds == t->capds) {
        size_t cap = t->capds ? t->capds * 2 : 8;
        struct delivery **ds = realloc(t->ds, cap * sizeof(*ds));
        if (ds == NULL)
            return -1;
        t->ds = ds;
        t->capds = cap;
    }
    if (!r->batch_armed) {
        /* the first batch of an idle loop: its pass starts after the delay */
        uint64_t ms = r->g->opt.write_delay_ms;
        int err = r->batch_timer ? tern_timer_again(r->batch_timer, ms)
                                 : tern_timer_start(r->srv->loop, &r->batch_timer, ms, 0,
                                                    batch_tick, r);
        if (err < 0)
            return -1;
        r->batch_armed = true;
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
 * closed next). */
static void batches_drop(registry *r) {
    while (r->batch_head) {
        topic_t *t = r->batch_head;
        for (size_t k = 0; k < t->nds; k++)
            delivery_free(t->ds[k]);
        t->nds = t->npass = 0;
        batch_unlink(r, t);
    }
    if (r->batch_timer)
        tern_timer_stop(r->batch_timer);
    r->batch_timer = NULL;
    r->batch_armed = false;
}

/* Sends msg to the subscribers of the topic on srv's loop now, after the
 * topic's batch (so in seq order). */
static void deliver(tern_server *srv, const char *name, size_t len, uint64_t seq,
                    tern_ws_prepared *msg, const tern_ws *except, const char *key, size_t klen,
                    uint64_t born_ns) {
    registry *r = reg(srv);
    topic_t *t = tfind(r, name, len, hash_name(name, len));
    if (t == NULL)
        return;
    latency_observe(r, born_ns);
    tally n = {0};
    t->busy++;
    if (t->nds > 0)
        batch_finish(r, t);
    for (size_t i = 0; i < t->nsubs; i++)
        if (t->subs[i])
            offer(t->subs[i], msg, seq, except, key, klen, &n);
    tally_add(r, t, &n, 1);
    t->busy--;
    topic_maybe_free(r, t);
}

/* Releases what d holds, whether it was delivered or not (the loop was
 * freed first: then as its drop hook). */
static void delivery_free(void *user) {
    delivery *d = user;
    if (d->p->ord)
        atomic_fetch_sub(&d->p->ord->inflight[d->idx], 1);
    pub_unref(d->p);
    tern__config_unref(d->cfg);
    free(d);
}

/* A message posted to this loop joins its topic's batch; the delivery
 * (and so the topic's count of posts in flight to this loop, which makes
 * a publish here post behind it) lives until the batch has sent it. */
static void deliver_post(tern_loop *loop, void *user) {
    (void)loop;
    delivery *d = user;
    tern_server *srv = d->idx < d->cfg->npeers ? d->cfg->peers[d->idx] : NULL;
    registry *r = srv ? reg(srv) : NULL;
    pub *p = d->p;
    topic_t *t = r ? tfind(r, p->name, p->len, hash_name(p->name, p->len)) : NULL;
    if (t && batch_add(r, t, d) == 0)
        return;
    if (t)
        deliver(srv, p->name, p->len, p->seq, p->msg, (const tern_ws *)d->except, p->key,
                p->klen, p->born_ns);
    delivery_free(d);
}

/* Under the mutex: posts p to every loop of the group, in the order the
 * mutex gives (so in seq order). Returns true when srv's own loop (the
 * caller's) is to deliver it now, after the mutex: nothing of the topic is
 * on its way to it. */
static bool post_all(tern_server *srv, pub *p, bool here, const tern_ws *except) {
    tern__server_config *cfg = srv->cfg;
    int n = cfg->npeers ? cfg->npeers : 1;
    bool now = false;
    for (int i = 0; i < n; i++) {
        tern_server *peer = cfg->npeers ? cfg->peers[i] : srv;
        if (peer == NULL)
            continue;
        bool ordered = p->ord && i < p->ord->n;
        if (here && peer == srv && (!ordered || atomic_load(&p->ord->inflight[i]) == 0)) {
            now = true;
            continue;
        }
        delivery *d = malloc(sizeof(*d));
        if (d == NULL)
            continue;   /* that loop misses it: out of memory */
        *d = (delivery){.p = p, .cfg = cfg, .idx = i,
                        .except = peer == srv ? (uintptr_t)except : 0};
        atomic_fetch_add(&p->refs, 1);
        tern__config_ref(cfg);
        if (ordered)
            atomic_fetch_add(&p->ord->inflight[i], 1);
        if (tern__loop_post_owned(peer->loop, deliver_post, delivery_free, d) < 0) {
            if (ordered)
                atomic_fetch_sub(&p->ord->inflight[i], 1);
            atomic_fetch_sub(&p->refs, 1);
            tern__config_unref(cfg);
            free(d);
        }
    }
    return now;
}

static void bridge_publish(group *g, const char *name, size_t tlen, const char *key,
                           size_t klen, const void *data, size_t len, int opcode, size_t seq_at,
                           const tern_topic_options *numbered);

/* The frame of a message numbered seq, with seq spliced in at seq_at
 * (SIZE_MAX: nowhere). NULL when out of memory. */
static tern_ws_prepared *prepare(const void *data, size_t len, int opcode, bool compress,
                                 uint64_t seq, size_t seq_at) {
    if (seq_at == SIZE_MAX)
        return tern_ws_prepare(data, len, opcode, compress);
    char num[24];
    int nl = snprintf(num, sizeof(num), "%" PRIu64, seq);
    char *buf = malloc(len + (size_t)nl);
    if (buf == NULL)
        return NULL;
    if (data == NULL)   /* no data (len 0): the message is the seq alone */
        data = "";
    memcpy(buf, data, seq_at);
    memcpy(buf + seq_at, num, (size_t)nl);
    memcpy(buf + seq_at + nl, (const char *)data + seq_at, len - seq_at);
    tern_ws_prepared *msg = tern_ws_prepare(buf, len + (size_t)nl, opcode, compress);
    free(buf);
    return msg;
}

/* Under the mutex: where a message Redis numbered goes in t's sequence.
 * True: deliver it, as num->seq (t->seq is that now). False: a duplicate,
 * or one a fill in flight brings, or one that starts a fill (*fill_from
 * up to num->seq, for the caller to ask of Redis). */
static bool redis_numbered(gtopic *t, const tern__redis_num *num, uint64_t *fill_from) {
    *fill_from = 0;
    if (!t->shared || t->epoch != num->epoch) {
        /* Redis's numbering, new here (or restarted there): adopted. What
         * was kept under the old epoch cannot be read back under this one. */
        t->old_epoch = t->seq == 0 ? t->epoch : 0;   /* (shared with seq 0: a claim Redis lost) */
        t->adopted_from = num->seq;
        t->shared = true;
        t->epoch = num->epoch;
        t->fill_to = 0;
        if (t->hist)
            tern__hist_clear(t->hist);
    } else if (num->seq <= t->seq || (!num->fill && num->seq <= t->fill_to)) {
        return false;
    } else if (num->seq > t->seq + 1) {
        if (!num->fill) {   /* missed while the link was down: read back first */
            *fill_from = (t->fill_to > t->seq ? t->fill_to : t->seq) + 1;
            t->fill_to = num->seq;
            return false;
        }
        /* gone from the stream too: a gap no one can fill, so no resume
         * from before it may be told it is whole */
        if (t->hist)
            tern__hist_clear(t->hist);
    }
    t->seq = num->seq;
    if (t->fill_to <= t->seq)
        t->fill_to = 0;
    return true;
}

/* tern_publish_ex, and the delivery of what came through Redis (forward
 * false: not sent back; num: numbered there). */
static int64_t publish(tern_server *srv, const char *name, const char *key, const void *data,
                       size_t len, int opcode, const tern_ws *except, size_t seq_at,
                       bool forward, const tern__redis_num *num, bool later) {
    size_t tlen, klen = 0;
    int err;
    if (srv == NULL || srv->loop == NULL || (data == NULL && len > 0) ||
        (opcode != TERN_WS_TEXT && opcode != TERN_WS_BINARY) ||
        (seq_at != SIZE_MAX && seq_at > len))
        return -EINVAL;
    if ((err = check_topic(name, &tlen)) < 0)
        return err;
    if (key && ((klen = strnlen(key, TERN_KEY_MAX + 1)) == 0 || klen > TERN_KEY_MAX))
        return -EINVAL;
    group *g = group_of(srv);
    if (g == NULL)
        return -ENOMEM;
    if (forward)   /* made here, not heard from another node */
        atomic_fetch_add_explicit(&g->published[rule_slot(g, name, tlen)], 1,
                                  memory_order_relaxed);
    tern__redis *b = forward ? atomic_load(&g->redis) : NULL;
    if (b) {
        tern_topic_options o = topic_settings(g, name, tlen);
        if (o.history > 0 && tern__redis_connected(b)) {
            /* numbered by Redis: this node delivers it when it hears it back */
            bridge_publish(g, name, tlen, key, klen, data, len, opcode, seq_at, &o);
            return 0;
        }
        bridge_publish(g, name, tlen, key, klen, data, len, opcode, seq_at, NULL);
    }
    uint64_t h = hash_name(name, tlen);
    /* later: this loop's subscribers too by a post, behind what the
     * caller writes now */
    /* With a write delay, a publish on this loop's thread joins its
     * topic's batch by a post too: delivering it now would end the batch
     * early (it must not pass it), defeating the delay. */
    bool here = !later && g->opt.write_delay_ms == 0 && tern__loop_current() == srv->loop;
    pub *p = malloc(sizeof(*p) + tlen + 1 + klen);
    if (p == NULL)
        return -ENOMEM;
    atomic_init(&p->refs, 1);
    p->ord = NULL;
    p->msg = NULL;
    p->len = tlen;
    memcpy(p->name, name, tlen);
    p->name[tlen] = '\0';
    p->key = key ? memcpy(p->name + tlen + 1, key, klen) : NULL;
    p->klen = klen;
    p->born_ns = mono_ns();
    /* Numbered, framed, recorded and posted under the mutex: every loop
     * gets a topic's messages in seq order, the history stays in that
     * order, and a resume that reads it sees every seq it numbers. (The
     * price: publishers of one group on several threads take turns for
     * the framing, and the compression, of each other's messages.) */
    pthread_mutex_lock(&g->mu);
    gtopic *gt = gfind(g, name, tlen, h);
    if (gt == NULL && topic_settings(g, name, tlen).history > 0) {
        gt = gtopic_new(g, name, tlen, h);   /* numbered and kept with no one listening */
        if (gt && gt->hist == NULL && gtopic_maybe_free(g, gt, false))
            gt = NULL;   /* no room for another history: like any topic no one hears */
    }
    uint64_t before = gt ? gt->seq : 0, fill_from = 0;
    if (gt && num && !redis_numbered(gt, num, &fill_from))
        gt = NULL;
    if (gt == NULL) {
        pthread_mutex_unlock(&g->mu);
        free(p);
        if (fill_from)
            tern__redis_fill(atomic_load(&g->redis), name, tlen, fill_from, num->seq);
        return 0;
    }
    if (num == NULL && gt->shared) {
        /* Redis away: numbered here meanwhile, under an epoch of this node */
        gt->shared = false;
        gt->epoch = new_epoch();
        if (gt->hist)
            tern__hist_clear(gt->hist);
    }
    p->seq = num ? num->seq : ++gt->seq;
    p->msg = prepare(data, len, opcode, gt->compressed > 0 && len >= 64, p->seq, seq_at);
    if (p->msg == NULL) {
        gt->seq = before;   /* not published: the number is free again */
        pthread_mutex_unlock(&g->mu);
        free(p);
        return -ENOMEM;
    }
    if (gt->hist) {
        uint64_t now = mono_ms();
        tern__hist_prune(gt->hist, now);
        tern__hist_add(gt->hist, p->seq, now, p->msg, key, klen);
        hist_budget(g, gt);
    }
    bool now = false;
    if (gt->subs > 0) {   /* else kept for later: no one to send it to now */
        if (gt->ord) {
            p->ord = gt->ord;
            atomic_fetch_add(&p->ord->refs, 1);
        }
        now = post_all(srv, p, here, except);
    }
    pthread_mutex_unlock(&g->mu);
    int64_t seq = (int64_t)p->seq;
    if (now && reg(srv))
        deliver(srv, name, tlen, p->seq, p->msg, except, p->key, klen, p->born_ns);
    pub_unref(p);
    return seq;
}

int64_t tern_publish_ex(tern_server *srv, const char *topic, const void *data, size_t len,
                        int opcode, const tern_ws *except, size_t seq_at) {
    return publish(srv, topic, NULL, data, len, opcode, except, seq_at, true, NULL, false);
}

int64_t tern_publish_key(tern_server *srv, const char *topic, const char *key, const void *data,
                         size_t len, int opcode, size_t seq_at) {
    return publish(srv, topic, key, data, len, opcode, NULL, seq_at, true, NULL, false);
}

int64_t tern_publish_later(tern_server *srv, const char *topic, const char *key,
                           const void *data, size_t len, int opcode, size_t seq_at) {
    return publish(srv, topic, key, data, len, opcode, NULL, seq_at, true, NULL, true);
}

int64_t tern_ws_publish(tern_ws *ws, const char *topic, const char *key, const void *data,
                        size_t len, int opcode, size_t seq_at) {
    size_t tlen;
    int err;
    if (ws == NULL)
        return -EINVAL;
    tern_server *srv = tern_ws_server(ws);
    if (srv == NULL)
        return -EINVAL;   /* a client's connection */
    /* A bad topic is refused as tern_publish_key would, before the hook
     * sees it. */
    if ((err = check_topic(topic, &tlen)) < 0)
        return err;
    if ((err = authorize(ws, true, topic, tlen)) < 0)
        return err;
    return publish(srv, topic, key, data, len, opcode, NULL, seq_at, true, NULL, false);
}

int64_t tern_publish(tern_server *srv, const char *topic, const void *data, size_t len,
                     int opcode) {
    return tern_publish_ex(srv, topic, data, len, opcode, NULL, SIZE_MAX);
}

int64_t tern_publish_except(tern_server *srv, const char *topic, const void *data, size_t len,
                            int opcode, const tern_ws *except) {
    return tern_publish_ex(srv, topic, data, len, opcode, except, SIZE_MAX);
}

/* ---- the Redis bridge ------------------------------------------------- */

/* Work for the bridge's loop from another thread: a topic whose first or
 * last subscriber came or went (len == 0: data is the topic), a publish
 * to forward, or an epoch to claim (claim not 0). */
typedef struct bridge_job {
    group *g;
    uint64_t claim;
    bool publish;
    bool numbered;            /* by Redis, keeping keep messages for keep_ms */
    uint32_t keep, keep_ms;
    int opcode;
    size_t tlen, klen, len, seq_at;
    char buf[];   /* topic, key, then data */
} bridge_job;

/* On the bridge's loop: Redis's subscription follows the group's count
 * now (not the change that asked: changes from several threads may
 * arrive in any order, the count is the truth). */
static void bridge_reconcile(group *g, const char *name, size_t len) {
    tern__redis *b = atomic_load(&g->redis);
    if (b == NULL)
        return;
    pthread_mutex_lock(&g->mu);
    gtopic *t = gfind(g, name, len, hash_name(name, len));
    bool on = t && t->subs > 0;
    pthread_mutex_unlock(&g->mu);
    tern__redis_subscribe(b, name, len, on && topic_settings(g, name, len).history == 0);
}

/* A claim no message follows lives as long as a history would without a
 * publish, or a day for histories with no age limit (so that names only
 * subscribed to do not stay in Redis for good). */
#define CLAIM_MS (24ull * 3600 * 1000)

/* On the bridge's loop. */
static void claim_now(group *g, tern__redis *b, const char *name, size_t len, uint64_t epoch) {
    uint64_t ms = topic_settings(g, name, len).history_ms;
    tern__redis_claim(b, name, len, epoch, ms ? ms : CLAIM_MS);
}

static void bridge_job_run(tern_loop *loop, void *user) {
    (void)loop;
    bridge_job *j = user;
    tern__redis *b = atomic_load(&j->g->redis);
    if (b && j->claim)
        claim_now(j->g, b, j->buf, j->tlen, j->claim);
    else if (b && j->publish && j->numbered)
        tern__redis_publish_numbered(b, j->buf, j->tlen, j->klen ? j->buf + j->tlen : NULL,
                                     j->klen, j->buf + j->tlen + j->klen, j->len, j->opcode,
                                     j->seq_at, j->keep, j->keep_ms);
    else if (b && j->publish)
        tern__redis_publish(b, j->buf, j->tlen, j->klen ? j->buf + j->tlen : NULL, j->klen,
                            j->buf + j->tlen + j->klen, j->len, j->opcode, j->seq_at);
    else if (b)
        bridge_reconcile(j->g, j->buf, j->tlen);
    atomic_fetch_sub(&j->g->bridge_jobs, 1);
    free(j);
}

static void bridge_post(group *g, bool is_publish, const char *name, size_t tlen, const char *key,
                        size_t klen, const void *data, size_t len, int opcode, size_t seq_at,
                        const tern_topic_options *numbered) {
    tern__redis *b = atomic_load(&g->redis);
    bridge_job *j = malloc(sizeof(*j) + tlen + klen + len);
    if (j == NULL)
        return;   /* out of memory: a publish reaches this node only */
    j->g = g;
    j->claim = 0;
    j->publish = is_publish;
    j->numbered = numbered != NULL;
    j->keep = numbered ? numbered->history : 0;
    j->keep_ms = numbered ? numbered->history_ms : 0;
    j->opcode = opcode;
    j->tlen = tlen;
    j->klen = klen;
    j->len = len;
    j->seq_at = seq_at;
    memcpy(j->buf, name, tlen);
    if (klen)
        memcpy(j->buf + tlen, key, klen);
    if (len)
        memcpy(j->buf + tlen + klen, data, len);
    atomic_fetch_add(&g->bridge_jobs, 1);
    if (b == NULL || tern_loop_post(tern__redis_loop(b), bridge_job_run, j) < 0) {
        atomic_fetch_sub(&g->bridge_jobs, 1);
        free(j);
    }
}

static void bridge_topic_changed(group *g, const char *name, size_t len) {
    tern__redis *b = atomic_load(&g->redis);
    if (b && tern__loop_current() == tern__redis_loop(b))
        bridge_reconcile(g, name, len);
    else
        bridge_post(g, false, name, len, NULL, 0, NULL, 0, 0, 0, NULL);
}

static void bridge_claim(group *g, const char *name, size_t len, uint64_t epoch) {
    tern__redis *b = atomic_load(&g->redis);
    if (b && tern__loop_current() == tern__redis_loop(b)) {
        claim_now(g, b, name, len, epoch);
        return;
    }
    bridge_job *j = calloc(1, sizeof(*j) + len);
    if (j == NULL)
        return;   /* out of memory: the topic keeps this node's epoch until its first message */
    j->g = g;
    j->claim = epoch;
    j->tlen = len;
    memcpy(j->buf, name, len);
    atomic_fetch_add(&g->bridge_jobs, 1);
    if (b == NULL || tern_loop_post(tern__redis_loop(b), bridge_job_run, j) < 0) {
        atomic_fetch_sub(&g->bridge_jobs, 1);
        free(j);
    }
}

static void bridge_publish(group *g, const char *name, size_t tlen, const char *key,
                           size_t klen, const void *data, size_t len, int opcode, size_t seq_at,
                           const tern_topic_options *numbered) {
    tern__redis *b = atomic_load(&g->redis);
    if (b && (tern__loop_current() != tern__redis_loop(b) || atomic_load(&g->bridge_jobs) > 0))
        bridge_post(g, true, name, tlen, key, klen, data, len, opcode, seq_at, numbered);
    else if (b && numbered)
        tern__redis_publish_numbered(b, name, tlen, key, klen, data, len, opcode, seq_at,
                                     numbered->history, numbered->history_ms);
    else if (b)
        tern__redis_publish(b, name, tlen, key, klen, data, len, opcode, seq_at);
}

/* What another node published, or any node's message numbered by Redis:
 * to every loop's subscribers, as a publish on this node would, but not
 * back to Redis. */
static void bridge_message(void *user, const char *topic, size_t tlen, const char *key,
                           size_t klen, const char *data, size_t len, int opcode, size_t seq_at,
                           const tern__redis_num *num) {
    group *g = user;
    char name[TERN_TOPIC_MAX + 1], k[TERN_KEY_MAX + 1];
    memcpy(name, topic, tlen);
    name[tlen] = '\0';
    memcpy(k, key, klen);
    k[klen] = '\0';
    if (g->bridge_srv && strlen(name) == tlen && strlen(k) == klen)
        publish(g->bridge_srv, name, klen ? k : NULL, data, len, opcode, NULL, seq_at, false, num,
                false);
}

/* After each (re)connect: the patterns of the topics with a history
 * (numbered by Redis, heard whether or not anyone here listens, so that
 * every node keeps their history), and the channel of every other topic
 * with subscribers on some loop. Fills in flight went with the link: the
 * next message of each topic asks again for what it lacks. */
static void bridge_resubscribe(void *user) {
    group *g = user;
    tern__redis *b = atomic_load(&g->redis);
    if (b == NULL)
        return;
    if (g->opt.history > 0)
        tern__redis_psubscribe(b, "", 0);
    for (size_t i = 0; g->opt.history == 0 && g->conf && i < g->conf->nrules; i++)
        if (g->conf->rules[i].o.history > 0)
            tern__redis_psubscribe(b, g->conf->rules[i].prefix, g->conf->rules[i].len);
    pthread_mutex_lock(&g->mu);
    for (size_t i = 0; i < g->topics.nb; i++)
        for (node *n = g->topics.b[i]; n; n = n->next) {
            gtopic *t = (gtopic *)n;
            t->fill_to = 0;
            if (t->subs > 0 && topic_settings(g, t->name, t->len).history == 0)
                tern__redis_subscribe(b, t->name, t->len, true);
        }
    pthread_mutex_unlock(&g->mu);
}

/* The patterns are in place: every topic followed under Redis's
 * numbering asks how far Redis is, to read back what it missed; one with
 * a history and subscribers that nothing was numbered in yet claims its
 * epoch (its subscribers came while Redis was away). */
static void bridge_listening(void *user) {
    group *g = user;
    tern__redis *b = atomic_load(&g->redis);
    if (b == NULL)
        return;
    pthread_mutex_lock(&g->mu);
    for (size_t i = 0; i < g->topics.nb; i++)
        for (node *n = g->topics.b[i]; n; n = n->next) {
            gtopic *t = (gtopic *)n;
            if (t->shared) {
                tern__redis_last(b, t->name, t->len);
            } else if (t->hist && t->seq == 0 && t->subs > 0) {
                t->claimed = true;
                claim_now(g, b, t->name, t->len, t->epoch);
            }
        }
    pthread_mutex_unlock(&g->mu);
}

/* How far Redis is with a topic: what lies beyond this node's last
 * message (and the fills in flight) is read back. */
static void bridge_last(void *user, const char *topic, size_t tlen, uint64_t epoch, uint64_t seq) {
    group *g = user;
    tern__redis *b = atomic_load(&g->redis);
    uint64_t from = 0;
    pthread_mutex_lock(&g->mu);
    gtopic *t = gfind(g, topic, tlen, hash_name(topic, tlen));
    if (t && t->shared && t->epoch == epoch) {
        uint64_t have = t->fill_to > t->seq ? t->fill_to : t->seq;
        if (seq > have) {
            from = have + 1;
            t->fill_to = seq;
        }
    }
    pthread_mutex_unlock(&g->mu);
    if (b && from)
        tern__redis_fill(b, topic, tlen, from, seq);
}

/* tern__redis_claim's answer. This node's epoch held: the topic is
 * Redis's from now on (nothing numbered yet). Another one did (a node
 * that claimed first, or a count this node has not heard): adopted, as
 * with a first message heard (the subscribers given this node's epoch
 * meanwhile are mapped by old_epoch, here only). */
static void bridge_claimed(void *user, const char *topic, size_t tlen, uint64_t epoch,
                           uint64_t seq) {
    group *g = user;
    pthread_mutex_lock(&g->mu);
    gtopic *t = gfind(g, topic, tlen, hash_name(topic, tlen));
    if (t && !t->shared && t->seq == 0) {   /* else heard (or numbered here) meanwhile */
        if (epoch != t->epoch) {
            t->old_epoch = t->epoch;
            t->adopted_from = seq + 1;
            t->epoch = epoch;
            t->seq = seq;
            if (t->hist)
                tern__hist_clear(t->hist);
        }
        t->shared = true;
    }
    pthread_mutex_unlock(&g->mu);
}

int tern_pubsub_redis(tern_server *srv, const char *url) {
    if (srv == NULL || url == NULL || srv->loop == NULL)
        return -EINVAL;
    registry *r = registry_of(srv, true);   /* so that freeing srv frees the bridge */
    if (r == NULL)
        return -ENOMEM;
    group *g = r->g;
    if (atomic_load(&g->redis))
        return -EALREADY;
    static const tern__redis_hooks rh = {.message = bridge_message,
                                         .resubscribe = bridge_resubscribe,
                                         .listening = bridge_listening,
                                         .last = bridge_last,
                                         .claimed = bridge_claimed};
    tern__redis *b;
    /* bridge_srv first: the bridge may call back once it runs */
    g->bridge_srv = srv;
    int err = tern__redis_new(&b, srv->loop, url, &rh, g);
    if (err < 0) {
        g->bridge_srv = NULL;
        return err;
    }
    atomic_store(&g->redis, b);
    return 0;
}

int tern_pubsub_redis_stats(const tern_server *srv, tern_redis_counters *out) {
    if (srv == NULL || out == NULL)
        return -EINVAL;
    group *g = group_peek(srv->cfg);
    tern__redis *b = g ? atomic_load(&g->redis) : NULL;
    if (b == NULL)
        return -ENOENT;
    tern__redis_stats(b, out);
    return 0;
}
