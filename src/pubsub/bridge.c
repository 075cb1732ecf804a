/* The bridge: pub/sub's side of an engine that links the nodes
 * (engine.h; Redis, redis.c, and NATS, nats.c), and the one place
 * an engine is chosen (engines[], by the URL's scheme).
 *
 * The core calls the bridge (pubsub.h's tern__ps_bridge_*), never an
 * engine: a topic's first subscriber anywhere and its last
 * (tern__ps_bridge_topic_changed), every publish made here
 * (tern__ps_bridge_forward, after local delivery, or instead of it for a
 * topic the engine numbers), and the messages the engine hears, delivered
 * through the same publish path without forwarding. The engine runs on
 * one loop (its server's); work from other threads is posted there as a
 * bridge_job, and a publish on that loop goes behind the jobs still
 * queued, so a node's publishes reach the engine in order.
 *
 * Topics with a history are numbered by the engine when it numbers
 * (engine.h's optional numbering), so that every node agrees on (epoch,
 * seq): the bridge adopts the engine's numbering in the topic's entry
 * (tern__ps_gtopic.br), reads back what a node missed while its link was
 * down (fills), and offers a topic's epoch before its first message (a
 * claim), so that a subscriber may resume on any node. Under an engine
 * that does not number, they are followed and forwarded as any topic,
 * and each node numbers them itself. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loop/log.h"
#include "pubsub/history.h"
#include "pubsub/nats.h"
#include "pubsub/pubsub.h"
#include "pubsub/redis.h"

/* A group's bridge (group.bridge).
 * Invariants: e is a started engine, run by srv's loop and freed with srv
 * (tern__ps_bridge_server_free); srv is set before the engine starts, as
 * the engine may call back once it runs; g is the group it serves. */
typedef struct tern__ps_bridge {
    tern__engine e;
    tern_server *srv;
    tern__ps_group *g;
} tern__ps_bridge;

static tern_loop *bridge_loop(const tern__ps_bridge *b) { return b->e.ops->loop(b->e.state); }

/* The engine numbers topics with a history (engine.h: the five
 * numbering operations, all or none). Else they are like any other
 * topic here: followed by subscribe, numbered by each node. */
static bool numbers(const tern__ps_bridge *b) { return b->e.ops->publish_numbered != NULL; }

/* The engine's interest in a topic with subscribers: every topic when it
 * does not number, else those without a history (the numbered ones are
 * followed through their prefixes, psubscribe). */
static bool follows(const tern__ps_bridge *b, tern__ps_group *g, const char *name, size_t len) {
    return !numbers(b) || tern__ps_topic_settings(g, name, len).history == 0;
}

void tern__ps_bridge_resume(const tern__ps_gtopic *t, tern__ps_resume *rq) {
    if (rq->epoch == t->br.old_epoch && t->br.on) {
        /* subscribed here before the first message, which came numbered
         * by the engine: it got every one from adopted_from on, by the
         * engine's seq */
        if (rq->after == 0)
            rq->after = t->br.adopted_from - 1;
        if (rq->after + 1 >= t->br.adopted_from)
            rq->epoch = t->epoch;
    }
}

/* t's history forgotten (a new epoch, or a gap nothing fills): a
 * read-back in flight is of no use any more. */
static void hist_forget(tern__ps_gtopic *t) {
    if (t->hist)
        tern__hist_clear(t->hist);
    t->br.back_to = 0;
}

/* This node has just adopted the engine's numbering of t from seq `at`
 * on (the first message it has under it; the last + 1 after a claim's
 * answer): the messages the engine numbered before, as many as t's
 * history keeps, are to be read back into it (a node started after them,
 * or away meanwhile, never heard them), so that a client resumes here as
 * on a node that heard them: *from..*to for the engine's fill, and t's
 * read-back set. False when there is nothing to read. */
static bool read_back(tern__ps_gtopic *t, uint64_t at, uint64_t *from, uint64_t *to) {
    uint32_t keep = t->hist ? tern__hist_max_count(t->hist) : 0;
    if (keep == 0 || at <= 1)
        return false;
    *from = at > keep ? at - keep : 1;
    *to = at - 1;
    t->br.back_next = *from;
    t->br.back_to = *to;
    return true;
}

bool tern__ps_bridge_numbered(tern__ps_gtopic *t, const tern__engine_num *num,
                              uint64_t *fill_from, uint64_t *fill_to) {
    tern__ps_bridged *br = &t->br;
    *fill_from = *fill_to = 0;
    if (!br->on || t->epoch != num->epoch) {
        /* The engine's numbering, new here (or restarted there): adopted.
         * What was kept under the old epoch cannot be read back under
         * this one; what the engine kept before this message can. */
        br->old_epoch = t->seq == 0 ? t->epoch : 0;   /* (on with seq 0: a claim the engine lost) */
        br->adopted_from = num->seq;
        br->on = true;
        t->epoch = num->epoch;
        br->fill_to = 0;
        hist_forget(t);
        read_back(t, num->seq, fill_from, fill_to);
    } else if (num->seq <= t->seq || (!num->fill && num->seq <= br->fill_to)) {
        return false;
    } else if (num->seq > t->seq + 1) {
        if (!num->fill) {   /* missed while the link was down: read back first */
            *fill_from = (br->fill_to > t->seq ? br->fill_to : t->seq) + 1;
            *fill_to = num->seq;
            br->fill_to = num->seq;
            return false;
        }
        /* gone from the engine too: a gap no one can fill, so no resume
         * from before it may be told it is whole */
        hist_forget(t);
    }
    t->seq = num->seq;
    if (br->fill_to <= t->seq)
        br->fill_to = 0;
    return true;
}

bool tern__ps_bridge_backfills(tern__ps_gtopic *t, const tern__engine_num *num, bool *keep) {
    tern__ps_bridged *br = &t->br;
    if (!num->fill || br->back_to == 0 || !br->on || num->epoch != t->epoch ||
        num->seq > br->back_to)
        return false;
    /* a fill asked twice (again after a reconnect): the first one's copy
     * is kept, or went with the oldest, and must not come back as a hole */
    *keep = num->seq >= br->back_next;
    if (!*keep)
        return true;
    if (num->seq > br->back_next)   /* those before it are gone from the engine */
        tern__hist_forget_before(t->hist, num->seq);
    br->back_next = num->seq + 1;
    if (br->back_next > br->back_to)
        br->back_to = 0;   /* read back whole */
    return true;
}

uint64_t tern__ps_bridge_first(const tern__ps_gtopic *t) {
    uint64_t first = tern__hist_first(t->hist);
    if (t->br.back_to == 0 || first > t->br.back_to)
        return first;
    if (tern__hist_last(t->hist) <= t->br.back_to)
        return 0;   /* nothing held after the hole */
    return t->br.back_to + 1;
}

void tern__ps_bridge_local(tern__ps_gtopic *t) {
    if (!t->br.on)
        return;
    /* the engine away: numbered here meanwhile, under an epoch of this node */
    t->br.on = false;
    t->epoch = tern__ps_new_epoch();
    hist_forget(t);
}

uint64_t tern__ps_bridge_claim_due(tern__ps_group *g, tern__ps_gtopic *t) {
    tern__ps_bridge *b = atomic_load(&g->bridge);
    if (b == NULL || !numbers(b) || t->hist == NULL || t->br.on || t->seq != 0 ||
        t->br.claimed || !b->e.ops->connected(b->e.state))
        return 0;
    /* before the first message: the engine's epoch from now on, so that
     * this subscriber may resume on any node */
    t->br.claimed = true;
    return t->epoch;
}

void tern__ps_bridge_fill(tern__ps_group *g, const char *name, size_t len, uint64_t from,
                          uint64_t to) {
    tern__ps_bridge *b = atomic_load(&g->bridge);
    if (b && numbers(b))   /* (a fill follows a num, which only such an engine gives) */
        b->e.ops->fill(b->e.state, name, len, from, to);
}

/* Work for the bridge's loop from another thread: a topic whose first or
 * last subscriber came or went (neither publish nor claim), a publish to
 * forward, or an epoch to claim (claim not 0). */
typedef struct bridge_job {
    tern__ps_group *g;
    uint64_t claim;
    bool publish;
    bool numbered;            /* by the engine, keeping keep messages for keep_ms */
    uint32_t keep, keep_ms;
    int opcode;
    size_t tlen, klen, len, seq_at;
    char buf[];   /* topic, key, then data */
} bridge_job;

/* On the bridge's loop: the engine's subscription follows the group's
 * count now (not the change that asked: changes from several threads may
 * arrive in any order, the count is the truth). */
static void bridge_reconcile(tern__ps_group *g, const char *name, size_t len) {
    tern__ps_bridge *b = atomic_load(&g->bridge);
    if (b == NULL)
        return;
    pthread_mutex_lock(&g->mu);
    tern__ps_gtopic *t = tern__ps_gfind(g, name, len, tern__ps_hash_name(name, len));
    bool on = t && t->subs > 0;
    pthread_mutex_unlock(&g->mu);
    b->e.ops->subscribe(b->e.state, name, len, on && follows(b, g, name, len));
}

/* A claim no message follows lives as long as a history would without a
 * publish, or a day for histories with no age limit (so that names only
 * subscribed to do not stay in the engine for good). */
#define CLAIM_MS (24ull * 3600 * 1000)

/* On the bridge's loop. */
static void claim_now(tern__ps_group *g, tern__ps_bridge *b, const char *name, size_t len,
                      uint64_t epoch) {
    uint64_t ms = tern__ps_topic_settings(g, name, len).history_ms;
    b->e.ops->claim(b->e.state, name, len, epoch, ms ? ms : CLAIM_MS);
}

static void bridge_job_run(tern_loop *loop, void *user) {
    (void)loop;
    bridge_job *j = user;
    tern__ps_bridge *b = atomic_load(&j->g->bridge);
    const char *key = j->klen ? j->buf + j->tlen : NULL, *data = j->buf + j->tlen + j->klen;
    if (b && j->claim)
        claim_now(j->g, b, j->buf, j->tlen, j->claim);
    else if (b && j->publish && j->numbered)
        b->e.ops->publish_numbered(b->e.state, j->buf, j->tlen, key, j->klen, data, j->len,
                                   j->opcode, j->seq_at, j->keep, j->keep_ms);
    else if (b && j->publish)
        b->e.ops->publish(b->e.state, j->buf, j->tlen, key, j->klen, data, j->len, j->opcode,
                          j->seq_at);
    else if (b)
        bridge_reconcile(j->g, j->buf, j->tlen);
    atomic_fetch_sub(&j->g->bridge_jobs, 1);
    free(j);
}

/* A new job for topic name[0..tlen) of g, with m's key (klen bytes) and
 * data when m is not NULL; the rest zero. NULL when out of memory. */
static bridge_job *job_new(tern__ps_group *g, const char *name, size_t tlen, const tern__ps_msg *m,
                           size_t klen) {
    size_t len = m ? m->len : 0;
    bridge_job *j = calloc(1, sizeof(*j) + tlen + klen + len);
    if (j == NULL)
        return NULL;
    j->g = g;
    j->tlen = tlen;
    j->klen = klen;
    j->len = len;
    memcpy(j->buf, name, tlen);
    if (klen)
        memcpy(j->buf + tlen, m->key, klen);
    if (len)
        memcpy(j->buf + tlen + klen, m->data, len);
    return j;
}

/* A job still queued when its loop is freed (a server freed off its
 * loop, after the loop's run, with subscribers still there): only its
 * memory, as g and the bridge may be gone by then. */
static void bridge_job_drop(void *user) { free(user); }

/* j to the bridge's loop, counted in g->bridge_jobs until it has run. */
static void job_post(tern__ps_group *g, tern__ps_bridge *b, bridge_job *j) {
    atomic_fetch_add(&g->bridge_jobs, 1);
    if (tern__loop_post_owned(bridge_loop(b), bridge_job_run, bridge_job_drop, j) < 0) {
        atomic_fetch_sub(&g->bridge_jobs, 1);
        free(j);
    }
}

void tern__ps_bridge_topic_changed(tern__ps_group *g, const char *name, size_t len) {
    tern__ps_bridge *b = atomic_load(&g->bridge);
    if (b == NULL)
        return;
    if (tern__loop_current() == bridge_loop(b)) {
        bridge_reconcile(g, name, len);
        return;
    }
    bridge_job *j = job_new(g, name, len, NULL, 0);
    if (j)   /* else out of memory: the engine's interest follows at the next change */
        job_post(g, b, j);
}

void tern__ps_bridge_claim(tern__ps_group *g, const char *name, size_t len, uint64_t epoch) {
    tern__ps_bridge *b = atomic_load(&g->bridge);
    if (b == NULL)
        return;
    if (tern__loop_current() == bridge_loop(b)) {
        claim_now(g, b, name, len, epoch);
        return;
    }
    bridge_job *j = job_new(g, name, len, NULL, 0);
    if (j == NULL)
        return;   /* out of memory: the topic keeps this node's epoch until its first message */
    j->claim = epoch;
    job_post(g, b, j);
}

/* m to the engine: numbered there when numbered (the topic's settings) is
 * not NULL. */
static void bridge_publish(tern__ps_group *g, tern__ps_bridge *b, const tern__ps_msg *m,
                           size_t tlen, size_t klen, const tern_topic_options *numbered) {
    if (tern__loop_current() != bridge_loop(b) || atomic_load(&g->bridge_jobs) > 0) {
        bridge_job *j = job_new(g, m->topic, tlen, m, klen);
        if (j == NULL)
            return;   /* out of memory: a publish reaches this node only */
        j->publish = true;
        j->numbered = numbered != NULL;
        j->keep = numbered ? numbered->history : 0;
        j->keep_ms = numbered ? numbered->history_ms : 0;
        j->opcode = m->opcode;
        j->seq_at = m->seq_at;
        job_post(g, b, j);
    } else if (numbered) {
        b->e.ops->publish_numbered(b->e.state, m->topic, tlen, m->key, klen, m->data, m->len,
                                   m->opcode, m->seq_at, numbered->history,
                                   numbered->history_ms);
    } else {
        b->e.ops->publish(b->e.state, m->topic, tlen, m->key, klen, m->data, m->len, m->opcode,
                          m->seq_at);
    }
}

bool tern__ps_bridge_forward(tern__ps_group *g, const tern__ps_msg *m, size_t tlen, size_t klen) {
    tern__ps_bridge *b = atomic_load(&g->bridge);
    if (b == NULL)
        return false;
    tern_topic_options o = tern__ps_topic_settings(g, m->topic, tlen);
    if (o.history > 0 && numbers(b) && b->e.ops->connected(b->e.state)) {
        /* numbered by the engine: this node delivers it when it hears it back */
        bridge_publish(g, b, m, tlen, klen, &o);
        return true;
    }
    bridge_publish(g, b, m, tlen, klen, NULL);
    return false;
}

/* ---- the engine's hooks (on the bridge's loop) ------------------------- */

/* What another node published, or any node's message numbered by the
 * engine: to every loop's subscribers, as a publish on this node would,
 * but not back to the engine. */
static void bridge_message(void *user, const char *topic, size_t tlen, const char *key,
                           size_t klen, const char *data, size_t len, int opcode, size_t seq_at,
                           const tern__engine_num *num) {
    tern__ps_bridge *b = user;
    char name[TERN_TOPIC_MAX + 1], k[TERN_KEY_MAX + 1];
    memcpy(name, topic, tlen);
    name[tlen] = '\0';
    if (klen)   /* (key may be NULL without one) */
        memcpy(k, key, klen);
    k[klen] = '\0';
    tern__ps_msg m = {.topic = name, .key = klen ? k : NULL, .data = data, .len = len,
                      .seq_at = seq_at, .opcode = opcode};
    if (strlen(name) == tlen && strlen(k) == klen)
        tern__ps_publish(b->srv, &m, NULL, 0, num);
}

/* After each (re)connect: the prefixes of the topics with a history when
 * the engine numbers them (heard whether or not anyone here listens, so
 * that every node keeps their history), and every other topic with
 * subscribers on some loop. Fills in flight went with the link: the next
 * message of each topic asks again for what it lacks. */
static void bridge_resubscribe(void *user) {
    tern__ps_bridge *b = user;
    tern__ps_group *g = b->g;
    if (numbers(b) && g->opt.history > 0)
        b->e.ops->psubscribe(b->e.state, "", 0);
    for (size_t i = 0; numbers(b) && g->opt.history == 0 && g->conf && i < g->conf->nrules; i++)
        if (g->conf->rules[i].o.history > 0)
            b->e.ops->psubscribe(b->e.state, g->conf->rules[i].prefix, g->conf->rules[i].len);
    pthread_mutex_lock(&g->mu);
    for (size_t i = 0; i < g->topics.nb; i++)
        for (tern__ps_node *n = g->topics.b[i]; n; n = n->next) {
            tern__ps_gtopic *t = (tern__ps_gtopic *)n;
            t->br.fill_to = 0;
            if (t->subs > 0 && follows(b, g, t->name, t->len))
                b->e.ops->subscribe(b->e.state, t->name, t->len, true);
        }
    pthread_mutex_unlock(&g->mu);
}

/* (From an engine that numbers only.) The prefixes are followed: every
 * topic under the engine's numbering asks how far the engine is, to read
 * back what it missed; one with a history and subscribers that nothing
 * was numbered in yet claims its epoch (its subscribers came while the
 * engine was away). */
static void bridge_listening(void *user) {
    tern__ps_bridge *b = user;
    tern__ps_group *g = b->g;
    pthread_mutex_lock(&g->mu);
    for (size_t i = 0; i < g->topics.nb; i++)
        for (tern__ps_node *n = g->topics.b[i]; n; n = n->next) {
            tern__ps_gtopic *t = (tern__ps_gtopic *)n;
            if (t->br.on) {
                b->e.ops->last(b->e.state, t->name, t->len);
                if (t->br.back_to)   /* its read-back went with the link */
                    b->e.ops->fill(b->e.state, t->name, t->len, t->br.back_next,
                                   t->br.back_to);
            } else if (t->hist && t->seq == 0 && t->subs > 0) {
                t->br.claimed = true;
                claim_now(g, b, t->name, t->len, t->epoch);
            }
        }
    pthread_mutex_unlock(&g->mu);
}

/* How far the engine is with a topic: what lies beyond this node's last
 * message (and the fills in flight) is read back. */
static void bridge_last(void *user, const char *topic, size_t tlen, uint64_t epoch, uint64_t seq) {
    tern__ps_bridge *b = user;
    tern__ps_group *g = b->g;
    uint64_t from = 0;
    pthread_mutex_lock(&g->mu);
    tern__ps_gtopic *t = tern__ps_gfind(g, topic, tlen, tern__ps_hash_name(topic, tlen));
    if (t && t->br.on && t->epoch == epoch) {
        uint64_t have = t->br.fill_to > t->seq ? t->br.fill_to : t->seq;
        if (seq > have) {
            from = have + 1;
            t->br.fill_to = seq;
        }
    }
    pthread_mutex_unlock(&g->mu);
    if (from)
        b->e.ops->fill(b->e.state, topic, tlen, from, seq);
}

/* The claim's answer. This node's epoch held: the topic is the engine's
 * from now on (nothing numbered yet). Another one did (a node that
 * claimed first, or a count this node has not heard): adopted, as with a
 * first message heard (the subscribers given this node's epoch meanwhile
 * are mapped by old_epoch, here only). */
static void bridge_claimed(void *user, const char *topic, size_t tlen, uint64_t epoch,
                           uint64_t seq) {
    tern__ps_bridge *b = user;
    tern__ps_group *g = b->g;
    uint64_t from = 0, to = 0;
    pthread_mutex_lock(&g->mu);
    tern__ps_gtopic *t = tern__ps_gfind(g, topic, tlen, tern__ps_hash_name(topic, tlen));
    if (t && !t->br.on && t->seq == 0) {   /* else heard (or numbered here) meanwhile */
        if (epoch != t->epoch) {
            t->br.old_epoch = t->epoch;
            t->br.adopted_from = seq + 1;
            t->epoch = epoch;
            t->seq = seq;
            hist_forget(t);
            read_back(t, seq + 1, &from, &to);
        }
        t->br.on = true;
    }
    pthread_mutex_unlock(&g->mu);
    if (from)
        b->e.ops->fill(b->e.state, topic, tlen, from, to);
}

/* ---- starting and ending ------------------------------------------------ */

/* Whether ops has the numbering whole or not at all (engine.h): numbers()
 * reads publish_numbered alone, and then calls the other four. */
static bool numbering_whole(const tern__engine_ops *ops) {
    int given = (ops->publish_numbered != NULL) + (ops->psubscribe != NULL) +
                (ops->fill != NULL) + (ops->claim != NULL) + (ops->last != NULL);
    return given == 0 || given == 5;
}

int tern__ps_bridge_start(tern_server *srv, const char *url, tern__engine_start start) {
    if (srv == NULL || url == NULL || start == NULL || srv->loop == NULL)
        return -EINVAL;
    /* the registry first, so that freeing srv frees the bridge */
    tern__ps_registry *r = tern__ps_registry_of(srv, true);
    if (r == NULL)
        return -ENOMEM;
    tern__ps_group *g = r->g;
    if (atomic_load(&g->bridge))
        return -EALREADY;
    static const tern__engine_hooks hooks = {.message = bridge_message,
                                             .resubscribe = bridge_resubscribe,
                                             .listening = bridge_listening,
                                             .last = bridge_last,
                                             .claimed = bridge_claimed};
    tern__ps_bridge *b = calloc(1, sizeof(*b));
    if (b == NULL)
        return -ENOMEM;
    b->srv = srv;
    b->g = g;
    int err = start(&b->e, srv->loop, url, &hooks, b);
    if (err < 0) {
        free(b);
        return err;
    }
    if (!numbering_whole(b->e.ops)) {
        tern__log(TERN_LOG_ERROR, TERN__LOG_RUN,
                  "pubsub bridge: engine %s gives some of the numbering operations, not all "
                  "five (publish_numbered, psubscribe, fill, claim, last): refused",
                  b->e.ops->name);
        b->e.ops->free(b->e.state);
        free(b);
        return -EINVAL;
    }
    atomic_store(&g->bridge, b);
    return 0;
}

/* The engines, by the scheme their URLs start with: the one place an
 * engine is chosen. A new engine is one line here. */
static const struct {
    const char *scheme;   /* with "://" */
    tern__engine_start start;
} engines[] = {
    {"redis://", tern__redis_engine},
    {"nats://", tern__nats_engine},
    {"tls://", tern__nats_engine},   /* NATS over TLS */
};

#define ENGINES (sizeof(engines) / sizeof(engines[0]))

int tern_pubsub_bridge(tern_server *srv, const char *url) {
    if (srv == NULL || url == NULL)
        return -EINVAL;
    for (size_t i = 0; i < ENGINES; i++)
        if (strncmp(url, engines[i].scheme, strlen(engines[i].scheme)) == 0)
            return tern__ps_bridge_start(srv, url, engines[i].start);
    /* Nothing started. The URL is not logged: it may hold a password. */
    char known[64] = "";
    for (size_t i = 0, n = 0; i < ENGINES && n < sizeof(known); i++)
        n += (size_t)snprintf(known + n, sizeof(known) - n, "%s%s", i ? ", " : "",
                              engines[i].scheme);
    tern__log(TERN_LOG_ERROR, TERN__LOG_RUN,
              "pubsub bridge: no engine for the URL's scheme (known: %s)", known);
    return -EINVAL;
}

int tern_pubsub_redis(tern_server *srv, const char *url) {
    if (url && strncmp(url, "redis://", 8) != 0)
        return -EINVAL;   /* another engine's URL, or none: not this call's */
    return tern_pubsub_bridge(srv, url);
}

void tern__ps_bridge_server_free(tern__ps_group *g, tern_server *srv) {
    tern__ps_bridge *b = atomic_load(&g->bridge);
    if (b == NULL || b->srv != srv)
        return;
    atomic_store(&g->bridge, NULL);
    b->e.ops->free(b->e.state);
    free(b);
}

int tern_pubsub_bridge_stats(const tern_server *srv, tern_bridge_counters *out) {
    if (srv == NULL || out == NULL)
        return -EINVAL;
    tern__ps_group *g = tern__ps_group_peek(srv->cfg);
    tern__ps_bridge *b = g ? atomic_load(&g->bridge) : NULL;
    if (b == NULL)
        return -ENOENT;
    *out = (tern_bridge_counters){.engine = b->e.ops->name};
    b->e.ops->stats(b->e.state, out);
    return 0;
}

int tern_pubsub_redis_stats(const tern_server *srv, tern_redis_counters *out) {
    if (out == NULL)
        return -EINVAL;
    tern_bridge_counters c;
    int err = tern_pubsub_bridge_stats(srv, &c);
    if (err < 0)
        return err;
    *out = (tern_redis_counters){.connected = c.connected,
                                 .reconnects = c.reconnects,
                                 .published = c.published,
                                 .received = c.received,
                                 .dropped = c.dropped,
                                 .fills = c.fills,
                                 .auth_refused = c.auth_refused};
    return 0;
}
