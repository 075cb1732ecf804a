/* Pub/sub: a registry per loop, a small table shared by the loops of a
 * configuration (seq numbers and subscriber counts), and publishes that
 * reach the other loops as posted references to one prepared frame.
 *
 * Per loop (the server's pub/sub slot, ps_slot, touched by that
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
 * and a resume reads it whole (tern__ps_order says how a publishing loop keeps its
 * own subscribers in that order).
 *
 * No user callback runs here: sends go through tern_ws_send_prepared,
 * which defers the slow-consumer close to the end of the batch, and the
 * close policy of this layer uses the same deferred close.
 *
 * This header is pub/sub's private one, for src/pubsub/ alone: the
 * structs every file of the module shares, each with its invariants, and
 * the calls between the files (each named after its file: the shared
 * table in group.c, the registry in registry.c, and so on), all prefixed
 * tern__ps_. What an engine linking the nodes (Redis) does is
 * behind the bridge (bridge.c, engine.h): nothing here names one. */
#ifndef TERN_PUBSUB_PUBSUB_H
#define TERN_PUBSUB_PUBSUB_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "http/server.h"
#include "loop/counter.h"
#include "loop/loop.h"
#include "pubsub/engine.h"
#include "pubsub/history.h"
#include "tern/pubsub.h"
#include "ws/ws.h"

/* ---- hashing and the chained table (table.c) --------------------------- */

static inline uint64_t tern__ps_hash_name(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;   /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
    return h;
}

static inline uint64_t tern__ps_hash_ptr(const void *p) {
    return ((uint64_t)(uintptr_t)p >> 4) * 0x9E3779B97F4A7C15ull;
}

/* A chained table of nodes that start with this; buckets is a power of 2.
 * Invariants: nb is 0 (no bucket yet) or a power of 2; count nodes are
 * chained from b[], each in the bucket of its hash. */
typedef struct tern__ps_node {
    struct tern__ps_node *next;
    uint64_t hash;
} tern__ps_node;

typedef struct tern__ps_table {
    tern__ps_node **b;
    size_t nb, count;
} tern__ps_table;

static inline tern__ps_node **tern__ps_bucket(tern__ps_table *t, uint64_t h) {
    return &t->b[h & (t->nb - 1)];
}

/* Makes room for one more node (doubles the buckets at a load of 1).
 * Returns -ENOMEM only when the table has no bucket at all. */
int tern__ps_table_grow(tern__ps_table *t);
void tern__ps_table_add(tern__ps_table *t, tern__ps_node *n);
void tern__ps_table_del(tern__ps_table *t, tern__ps_node *n);

/* ---- the shared table of a group (group.c, config.c) ------------------- */

/* A topic's posts in flight to each loop of the group (index as in
 * cfg->peers; one loop outside tern_run), shared by the entry and by every
 * message posted, so it outlives either. A publish on a loop delivers to
 * that loop's subscribers at once only when nothing of the topic is on
 * its way to it from another thread; else it posts to itself behind that,
 * so every loop sees a topic's messages in seq order. */
typedef struct tern__ps_order {
    _Atomic int refs;
    int n;
    _Atomic uint32_t inflight[];
} tern__ps_order;

void tern__ps_order_unref(tern__ps_order *o);

/* How the bridge's engine numbers a topic (engine.h's optional numbering;
 * bridge.c's alone, under the group's mutex; all zero while no engine
 * numbers it).
 * Invariants: on means the entry's epoch and seq are the engine's,
 * adopted from the messages heard; fill_to, when above seq, is how far
 * the fills asked of the engine reach (0: none). old_epoch is the epoch
 * this node had given the topic before it adopted the engine's, when it
 * had numbered nothing under it (else 0), and adopted_from the first seq
 * it delivered under the engine's: a subscriber from before holds
 * old_epoch and the engine's seqs (tern__ps_bridge_resume maps it).
 * claimed: its epoch was offered to the engine before any message, once
 * per entry, at its first subscription while bridged.
 * back_to, when not 0, is the last seq of a read-back in flight: the
 * messages the engine numbered before this node adopted its numbering
 * (back_to < adopted_from), asked of it for the history alone, so that a
 * client may resume here from before. back_next is the next one
 * expected; the history holds the read-back's messages below it, and
 * whole messages from back_to + 1 on (tern__ps_bridge_first). */
typedef struct tern__ps_bridged {
    bool on;
    bool claimed;
    uint64_t fill_to;
    uint64_t old_epoch, adopted_from;
    uint64_t back_next, back_to;
} tern__ps_bridged;

/* A topic's entry in the shared table.
 * Invariants: epoch is never 0; seq is the last message's; the entry
 * lives while subs is not 0 or its history keeps something (or, with a
 * history, while nothing was numbered yet: tern__ps_gtopic_maybe_free);
 * hist is on the group's list (hnext, hprev) exactly while not NULL. */
typedef struct tern__ps_gtopic {
    tern__ps_node n;
    tern__ps_order *ord;         /* NULL when out of memory: then no order across threads */
    uint64_t epoch;      /* drawn when the entry is made; never 0 */
    uint64_t seq;        /* the last message's */
    tern__ps_bridged br;          /* the engine's numbering (bridge.c) */
    tern__hist *hist;    /* NULL: the topic's options give it no history */
    /* The group's list of the entries with a history (hist != NULL), in
     * which the byte budget looks for what to shed. */
    struct tern__ps_gtopic *hnext, *hprev;
    size_t subs;         /* subscriptions on all loops */
    size_t compressed;   /* ... of them, with permessage-deflate */
    bool throttled;      /* its options' throttle_ms: every delivery goes through a batch */
    size_t len;
    char name[];
} tern__ps_gtopic;

/* A rule of tern_pubsub_topic_rule: the topics starting with prefix get o
 * (its zeros already replaced by the server's values when the group is
 * made). */
typedef struct tern__ps_rule {
    size_t len;
    char prefix[TERN_TOPIC_MAX + 1];
    tern_topic_options o;
} tern__ps_rule;

/* What setup configured (tern__ps_config.setup; one block, freed with free()). */
typedef struct tern__ps_conf {
    tern_pubsub_options opt;
    size_t nrules;
    tern__ps_rule rules[];
} tern__ps_conf;

/* A configuration's shared pub/sub state (its tern__ps_config's g), one for the
 * loops of a tern_run. Invariants: mu guards topics, every entry, nhist,
 * hhead, hcursor and hist_bytes; opt and conf never change once the group
 * is made; bridge is set once, by the server that runs it, and cleared
 * when that server is freed. */
typedef struct tern__ps_group {
    pthread_mutex_t mu;
    tern__ps_table topics;
    tern_pubsub_options opt;   /* defaults applied */
    tern__ps_conf *conf;                /* a copy of setup's, rules completed; NULL when none */
    /* The bridge to an engine linking the nodes (tern_pubsub_bridge;
     * bridge.c), run by its server's loop and freed with that server;
     * set once in setup, read by any thread. NULL: none. */
    struct tern__ps_bridge *_Atomic bridge;
    /* Jobs posted to the bridge's loop and not yet run: while there are
     * any, a publish on that loop goes behind them too, or it would reach
     * the engine before a publish another thread made earlier (a node's
     * publishes keep their order). */
    _Atomic int bridge_jobs;
    size_t nhist;              /* entries with a history (TERN_HISTORY_TOPICS at most) */
    /* Those entries as a list (tern__ps_gtopic.hnext), where the byte budget's
     * search for a topic over its share goes on (hcursor, NULL: from the
     * head), and the bytes all their histories count together. */
    struct tern__ps_gtopic *hhead, *hcursor;
    size_t hist_bytes;
    const tern__server_config *cfg;   /* its loops: cfg->peers */
    /* Publishes made on this node, by the slot of their topic's rule
     * (tern__ps_rule_slot): counted on the publish path, which takes mu anyway,
     * never on the delivery path. */
    _Atomic uint64_t published[TERN_TOPIC_RULES_MAX + 1];
} tern__ps_group;

/* Pub/sub's slot of a configuration (tern__ps_conf_slot), made at first
 * use by whichever thread: setup's options (tern_pubsub_configure, before
 * serving) and the group, made when pub/sub is first used, which freezes
 * the options. */
typedef struct tern__ps_config {
    tern__ps_conf *setup;
    _Atomic(tern__ps_group *) g;
} tern__ps_config;

/* Pub/sub's key of the module slots (srv->slots[], cfg->slots[]), taken
 * at first use (tern__srv_slot_key). */
int tern__ps_slot(void);
/* The configuration's slot, made at first use by whichever thread (the
 * module is registered before the slot is visible). NULL: no memory. */
tern__ps_config *tern__ps_conf_slot(tern__server_config *cfg);
/* The slot if it is made, else NULL. */
tern__ps_config *tern__ps_conf_peek(const tern__server_config *cfg);
/* The configuration's group, made at first use by whichever thread; NULL:
 * no memory. */
tern__ps_group *tern__ps_group_of(tern_server *srv);
/* The configuration's group, or NULL when pub/sub has not been used. */
tern__ps_group *tern__ps_group_peek(const tern__server_config *cfg);
/* The slot of a topic's rule in the per-rule counters: 0 for none, else
 * 1 + the rule's index in g->conf. */
uint8_t tern__ps_rule_slot(const tern__ps_group *g, const char *name, size_t len);
/* The settings a topic named name gets: its rule's, else the server's. */
tern_topic_options tern__ps_topic_settings(const tern__ps_group *g, const char *name, size_t len);
/* The server's pub/sub slot (its registry), or NULL. */
struct tern__ps_registry *tern__ps_reg(const tern_server *srv);

/* The monotonic clock in ms and ns. */
uint64_t tern__ps_mono_ms(void);
uint64_t tern__ps_mono_ns(void);
/* A new epoch: random, never 0. */
uint64_t tern__ps_new_epoch(void);
/* Under the mutex: the entry of name (hash h), or NULL. */
tern__ps_gtopic *tern__ps_gfind(tern__ps_group *g, const char *name, size_t len, uint64_t h);
/* Under the mutex: a new entry for name, with a history when its settings
 * ask for one and the group has room. NULL when out of memory. */
tern__ps_gtopic *tern__ps_gtopic_new(tern__ps_group *g, const char *name, size_t len, uint64_t h);
/* Under the mutex: frees t when nothing keeps it; true when it did. */
bool tern__ps_gtopic_maybe_free(tern__ps_group *g, tern__ps_gtopic *t, bool sweeping);
/* Under the mutex, after a message was kept in t's history: the byte
 * budget of the group's histories. */
void tern__ps_hist_budget(tern__ps_group *g, tern__ps_gtopic *t);

/* A resume asked of tern__ps_gcount (tern_ws_subscribe_from): in, the client's
 * epoch and last seq (epoch 0: none), or latest (tern_ws_subscribe_latest:
 * the latest message of each key, as after a gap); out, tern_resume's
 * fields and the frames to send (references, msgs[0..n)). */
typedef struct tern__ps_resume {
    uint64_t epoch, after;
    bool latest;
    tern_resume out;
    tern_ws_prepared **msgs;
    long n;
} tern__ps_resume;


/* Counts a subscription in (+1) or out (-1) of the shared table; a
 * subscription in reads where it starts into rq (may be NULL). 0 or
 * -ENOMEM. */
int tern__ps_gcount(tern__ps_group *g, const char *name, size_t len, uint64_t h, int delta,
                    bool compressed, tern__ps_resume *rq);

/* ---- the registry of one loop (registry.c, queue.c, pace.c) ----------- */

typedef struct tern__ps_topic tern__ps_topic;

/* A message waiting for a subscriber that is behind: a reference to the
 * prepared frame every subscriber shares (not a copy of it), and its key
 * (klen 0: none). */
typedef struct tern__ps_queued {
    struct tern__ps_queued *next, *prev;
    struct tern__ps_queued *hnext;   /* in its subscription's key index (conflation) */
    uint64_t khash;
    tern_ws_prepared *msg;
    bool replay;            /* from the history, held back by pacing */
    size_t klen;
    char key[];
} tern__ps_queued;

/* One subscription.
 * Invariants: head..tail is what waits for ws beyond its connection's
 * backlog, in the order it is to be sent, nq entries of qbytes frame bytes
 * in all; it is not empty only while ws has a backlog (so that a drain
 * comes to send it) or while s is paced (a replay held back by the loop's
 * replay_rate: on the registry's paced list, which its timer sends). In
 * a TERN_PUBSUB_CONFLATE topic it holds at most one entry per key
 * (keyless entries aside), oldest latest-update first. */
typedef struct tern__ps_sub {
    /* Who it delivers to: a WebSocket (ws), or a sink (tern_sink_new: an
     * HTTP stream, say); exactly one of the two is set. */
    tern_ws *ws;
    tern_sink *sink;
    tern__ps_topic *t;
    size_t index;        /* in t->subs */
    uint64_t dropped, conflated;
    tern__ps_queued *head, *tail;
    uint32_t nq, nkeys;
    size_t qbytes;
    /* Conflating topics: the keyed entries of the queue by key, chained
     * through hnext, knb buckets (a power of 2, at least twice nkeys once
     * made), so that a replacement costs a lookup, not a walk of up to
     * TERN_CONFLATE_KEYS entries per message. NULL until the first one. */
    tern__ps_queued **kb;
    uint32_t knb;
    /* Messages up to this seq were published before the subscription
     * began (or were sent from the history): those still on their way to
     * this loop are not delivered again. */
    uint64_t skip_upto;
    bool compressed;     /* counted as such in the group */
    bool paced;
    struct tern__ps_sub *pnext, *pprev;   /* on the paced list while paced */
    /* rbytes of the queue's frames are a replay held back by pacing
     * (entries marked replay): the backlog limit does not count them
     * against live messages. */
    size_t rbytes;
} tern__ps_sub;

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
 * (bprev, bnext) exactly while nds > 0. pass_ns: when its last pass
 * started (the mono clock), which o.throttle_ms counts from. */
struct tern__ps_topic {
    tern__ps_node n;
    tern__ps_sub **subs;
    size_t nsubs, cap, nholes;
    uint64_t dropped, conflated;
    tern_topic_options o;   /* its slow-consumer settings (tern__ps_topic_settings) */
    uint8_t rule;        /* its slot in the per-rule counters (tern__ps_rule_slot) */
    int busy;
    bool holes;
    struct tern__ps_delivery **ds;
    size_t nds, capds, npass, cursor;
    uint64_t pass_ns;
    struct tern__ps_topic *bprev, *bnext;
    size_t len;
    char name[];
};

/* A connection's subscriptions on one loop (the registry's conns, keyed
 * by the address of its ws or its sink, exactly one of which is set).
 * Invariants: subs[0..nsubs) are its subscriptions, in no order, each
 * also in its topic's subs; the entry exists exactly while nsubs > 0
 * (tern__ps_conn_subs_free when the last goes). */
typedef struct tern__ps_conn_subs {
    tern__ps_node n;
    tern_ws *ws;
    tern_sink *sink;
    tern__ps_sub **subs;
    uint32_t nsubs, cap;
} tern__ps_conn_subs;

/* A loop's pub/sub state. Replays (opt.replay_rate): tokens is the bytes
 * of history this loop may still send now, refilled at replay_rate up to
 * one 10 ms tick's worth (tokens_ms: when last); paced_head.. lists
 * the subscriptions whose queue waits for them, and pace_timer runs
 * exactly while the list is not empty. */
typedef struct tern__ps_registry {
    tern__ps_table topics, conns;
    tern__ps_group *g;
    /* tern_pubsub_stats: written by the loop alone, with relaxed loads and
     * stores (PS_ADD), read by any thread. */
    struct {
        _Atomic uint64_t messages, delivered, dropped, closed, subscribed, unsubscribed,
            conflated, queue_max;
        /* tern_pubsub_latency: observations by bucket (tern__ps_latency_le_us),
         * their sum in microseconds and their count */
        _Atomic uint64_t lat[TERN_HISTOGRAM_BUCKETS], lat_sum_us, lat_count;
    } stats;
    /* tern_pubsub_rule_stats: the same, by the slot of the topic's rule
     * (tern__ps_topic.rule), a fixed array so that counting allocates nothing. */
    struct {
        _Atomic uint64_t subscribed, unsubscribed, delivered, dropped, conflated, replayed,
            resumed, resumed_gap;
    } rstats[TERN_TOPIC_RULES_MAX + 1];
    tern_server *srv;    /* the loop's server (its counters) */
    tern__ps_sub *paced_head, *paced_tail;
    uint64_t tokens, tokens_ms;
    tern_timer *pace_timer;
    /* The topics with a batch (topic.ds), and the zero-delay timer that
     * runs their passes a chunk per loop turn: armed while the list is
     * not empty (batch_armed), so that the loop polls between chunks. */
    tern__ps_topic *batch_head;
    tern_timer *batch_timer;
    bool batch_armed;
    uint64_t batch_due_ns;   /* while armed: when the timer fires (the mono clock) */
} tern__ps_registry;

/* One of r's counters += n: a plain load and store, the loop being the
 * only writer (loop/counter.h). */
#define PS_ADD(r, field, n) TERN__COUNTER_ADD((r)->stats.field, n)

/* One of r's counters of rule slot i += n, as PS_ADD. */
#define RS_ADD(r, i, field, n)                                                                \
    do {                                                                                      \
        if ((n) > 0)                                                                          \
            TERN__COUNTER_ADD((r)->rstats[i].field, n);                                       \
    } while (0)


/* The loop's registry, made when make is set; NULL for a client's
 * connection (srv NULL), when not made, or out of memory. */
tern__ps_registry *tern__ps_registry_of(tern_server *srv, bool make);
tern__ps_topic *tern__ps_tfind(tern__ps_registry *r, const char *name, size_t len, uint64_t h);
tern__ps_conn_subs *tern__ps_cfind(tern__ps_registry *r, const tern_ws *ws);
/* The same for a sink's subscriptions. */
tern__ps_conn_subs *tern__ps_cfind_sink(tern__ps_registry *r, const tern_sink *sink);
/* Ends every subscription of c, and c (a connection or a sink gone). */
void tern__ps_conn_gone(tern__ps_registry *r, tern__ps_conn_subs *c);
/* Closes t's holes (not while busy). */
void tern__ps_topic_compact(tern__ps_topic *t);
/* Frees t when not busy and without subscriptions (compacting it first). */
void tern__ps_topic_maybe_free(tern__ps_registry *r, tern__ps_topic *t);
/* Takes s out of its topic (and the group), and frees it. */
void tern__ps_sub_remove(tern__ps_registry *r, tern__ps_sub *s);
void tern__ps_conn_subs_free(tern__ps_registry *r, tern__ps_conn_subs *c);
/* 0, or -EINVAL (NULL or empty), -ENAMETOOLONG; *len the topic's length. */
int tern__ps_check_topic(const char *topic, size_t *len);
bool tern__ps_ws_open(const tern_ws *ws);
/* The route's verdict on ws's subscribe or publish: 0 or a negative errno. */
int tern__ps_authorize(tern_ws *ws, bool publishing, const char *name, size_t len);
/* Subscribes ws or sink (exactly one; checked, authorized) to
 * name[0..len) on r, starting where rq says (subscribe.c). Returns as
 * tern_ws_subscribe_from. */
int tern__ps_subscribe(tern__ps_registry *r, tern_ws *ws, tern_sink *sink, const char *name,
                       size_t len, tern__ps_resume rq, tern_resume *out);
/* Ends c's subscription to name[0..len): 0, or -ENOENT. */
int tern__ps_unsubscribe(tern__ps_registry *r, tern__ps_conn_subs *c, const char *name,
                         size_t len);
/* The module's hooks (tern__srv_module). */
void tern__ps_ws_closed(tern_server *srv, tern_ws *ws);
void tern__ps_ws_drained(tern_server *srv, tern_ws *ws);
/* c's queues sent, as far as its stream takes them (c may be NULL). */
void tern__ps_conn_drained(tern__ps_registry *r, tern__ps_conn_subs *c);
void tern__ps_registry_free(tern_server *srv);

/* ---- the subscriber seam (sink.c) --------------------------------------
 *
 * A subscription delivers to one of two kinds of subscriber: a WebSocket
 * (the fan-out's hot path, called directly) or a sink, an application's
 * stream behind tern_sink_ops (an HTTP streamed response: SSE). Delivery,
 * the queues, pacing and the policies see both through the four calls
 * below, so that a sink gets exactly a WebSocket's treatment. */

/* A sink (tern_sink_new). Invariants: srv is the loop's server it
 * subscribes on; closing is set once the close policy acted (nothing more
 * is sent to it; ops.close is called once, close_told after). Its ops are
 * user callbacks, never called inside a call the user made (the no
 * re-entrancy rule): what a subscribe replays, what a drain releases and
 * what a publish offers (unless ops.send_at_once says its send only
 * writes: then a live message delivered in pub/sub's own pass, not in
 * the user's publish, goes at once, as to a WebSocket) wait in
 * the sink's queues for due, a 0 ms timer
 * (NULL until first needed, then kept), which sends them, or tells the
 * close, at the loop's next iteration; due_armed says it is armed. */
struct tern_sink {
    tern_sink_ops ops;
    void *user;
    tern_server *srv;
    tern_timer *due;
    int close_code;    /* with closing: the code ops.close is told */
    bool due_armed;
    bool closing;
    bool close_told;   /* ops.close was called */
};

/* A sink's side of the four calls: a message's payload handed to its
 * send (the frame's header cut off), its buffered bytes, the close
 * policy. */
int tern__ps_sink_send(tern_sink *k, const tern__ps_topic *t, tern_ws_prepared *msg);
void tern__ps_sink_close(tern_sink *k, int code);
/* Arms k's 0 ms timer (once for any number of calls before it fires),
 * which tells a close, else sends what k's queues hold: 0, or -ENOMEM. */
int tern__ps_sink_defer(tern_sink *k);

/* The bytes waiting for s's subscriber beyond what pub/sub queues. */
static inline size_t tern__ps_sub_buffered(const tern__ps_sub *s) {
    return s->sink ? s->sink->ops.buffered(s->sink->user) : tern_ws_buffered(s->ws);
}

/* msg sent to s's subscriber: a tern_send_result or a negative errno. */
static inline int tern__ps_sub_send(tern__ps_sub *s, tern_ws_prepared *msg) {
    return s->sink ? tern__ps_sink_send(s->sink, s->t, msg) : tern_ws_send_prepared(s->ws, msg);
}

/* Whether s's subscriber still takes messages (not closing). */
static inline bool tern__ps_sub_open(const tern__ps_sub *s) {
    return s->sink ? !s->sink->closing : tern__ps_ws_open(s->ws);
}

/* The close policy on s's subscriber (code 0: 1008), taking effect later
 * (a WebSocket's at the batch end, a sink's when its owner acts). */
static inline void tern__ps_sub_close(tern__ps_sub *s, uint16_t code) {
    if (s->sink)
        tern__ps_sink_close(s->sink, code ? code : TERN_WS_POLICY);
    else
        tern__ws_policy_close_code(s->ws, code);
}

/* s's queue (queue.c): msg joins it (0, or -1 when out of memory); an
 * entry leaves it; all of it is freed. */
int tern__ps_queue_add(tern__ps_sub *s, tern_ws_prepared *msg, const char *key, size_t klen);
void tern__ps_queue_unlink(tern__ps_sub *s, tern__ps_queued *q);
void tern__ps_queue_free(tern__ps_sub *s);
/* An entry out of every queue, with its message released: kept as a
 * spare when unkeyed; the thread's spares go back to malloc with its
 * registry (tern__ps_registry_free). */
void tern__ps_queued_free(tern__ps_queued *q);
void tern__ps_queue_spares_free(void);
/* A keyed message for a subscriber of a conflating topic that is behind:
 * 1 when it replaced a queued one, 0 when it joined, -1 when it cannot. */
int tern__ps_conflate(tern__ps_sub *s, tern_ws_prepared *msg, const char *key, size_t klen);

/* Replay pacing (pace.c). */
void tern__ps_refill(tern__ps_registry *r);
void tern__ps_paced_add(tern__ps_registry *r, tern__ps_sub *s);
void tern__ps_paced_remove(tern__ps_registry *r, tern__ps_sub *s);
void tern__ps_send_replayed(tern__ps_sub *s, tern_ws_prepared *msg, uint64_t *delivered);

/* The latency histogram's bounds and one observation (stats.c). */
extern const uint64_t tern__ps_latency_le_us[TERN_HISTOGRAM_BUCKETS];
void tern__ps_latency_observe(tern__ps_registry *r, uint64_t born_ns);

/* ---- publishing and delivery (publish.c, deliver.c, batch.c) ---------- */

/* One published message on its way to the loops: a reference per loop
 * still to deliver it. */
typedef struct tern__ps_pub {
    _Atomic int refs;
    uint64_t seq;
    tern__ps_order *ord;         /* a reference, or NULL */
    tern_ws_prepared *msg;
    const char *key;     /* in name's block, after the name; NULL for none */
    size_t len, klen;
    uint64_t born_ns;    /* the monotonic clock at the publish (the latency histogram) */
    char name[];
} tern__ps_pub;

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
typedef struct tern__ps_delivery {
    tern__ps_pub *p;
    tern__server_config *cfg;   /* a reference */
    int idx;
    /* Compared by address only, which is safe although a connection
     * opened after the publisher closed may reuse the address while the
     * delivery waits (posted, or in a batch): that connection subscribed
     * after the publish, so its subscription skips up to a seq at or past
     * this message's (skip_upto; the group's mutex orders the two), and
     * tern__ps_offer would skip the message for it anyway. (Its topic's entry may
     * be new, numbering from 0 again; the message predates the
     * subscription all the same, so it is not owed to it.) */
    uintptr_t except;
} tern__ps_delivery;


/* What one pass of deliveries did, added to the counters once. */
typedef struct tern__ps_tally {
    uint64_t delivered, dropped, closed, conflated, qmax;
    /* The delivery runs inside the application's publish: no sink's send
     * may run then, not even a send_at_once one's (no re-entrancy). */
    bool in_call;
} tern__ps_tally;

/* A message to publish, as the public calls give it: topic and key
 * NUL-terminated (key NULL: none), data[0..len), seq spliced in at seq_at
 * (SIZE_MAX: nowhere). */
typedef struct tern__ps_msg {
    const char *topic, *key;
    const void *data;
    size_t len, seq_at;
    int opcode;
} tern__ps_msg;

/* How tern__ps_publish publishes: FORWARD, made on this node (counted, and
 * handed to the bridge for the other nodes); LATER, this loop's
 * subscribers too by a post, behind what the caller writes now. */
enum { TERN__PS_FORWARD = 1, TERN__PS_LATER = 2 };

/* tern_publish_ex and the others, and the delivery of what the bridge
 * heard (flags without FORWARD; num: numbered by the engine, else NULL).
 * Returns the seq, 0 when the engine numbers it, or a negative errno. */
int64_t tern__ps_publish(tern_server *srv, const tern__ps_msg *m, const tern_ws *except,
                         int flags, const tern__engine_num *num);

void tern__ps_pub_unref(tern__ps_pub *p);
void tern__ps_offer(tern__ps_sub *s, tern_ws_prepared *msg, uint64_t seq, const tern_ws *except,
                    const char *key, size_t klen, tern__ps_tally *n);
void tern__ps_tally_add(tern__ps_registry *r, tern__ps_topic *t, const tern__ps_tally *n,
                        uint64_t messages);
/* Sends msg to the subscribers of the topic on srv's loop now, after the
 * topic's batch (so in seq order); in_call: inside the application's
 * publish, not a loop turn of pub/sub's own. */
void tern__ps_deliver(tern_server *srv, const char *name, size_t len, uint64_t seq,
                      tern_ws_prepared *msg, const tern_ws *except, const char *key,
                      size_t klen, uint64_t born_ns, bool in_call);
/* A delivery posted to its loop (tern__loop_post_owned's fn and drop). */
void tern__ps_deliver_post(tern_loop *loop, void *user);
void tern__ps_delivery_free(void *user);

/* Batches (batch.c): d joins t's batch (-1: it cannot, deliver it at
 * once); t's batch runs to its end now; the server's batches dropped. */
int tern__ps_batch_add(tern__ps_registry *r, tern__ps_topic *t, tern__ps_delivery *d);
void tern__ps_batch_finish(tern__ps_registry *r, tern__ps_topic *t);
void tern__ps_batches_drop(tern__ps_registry *r);

/* ---- the bridge (bridge.c) --------------------------------------------- */

/* The first subscription anywhere to a topic came, or the last went: the
 * engine's interest follows (on the bridge's loop). */
void tern__ps_bridge_topic_changed(tern__ps_group *g, const char *name, size_t len);
/* Under the mutex, at a subscription to t: the epoch to offer the engine
 * (t's, before its first message, when the engine numbers its topics),
 * or 0. The caller offers it after the mutex (tern__ps_bridge_claim). */
uint64_t tern__ps_bridge_claim_due(tern__ps_group *g, tern__ps_gtopic *t);
void tern__ps_bridge_claim(tern__ps_group *g, const char *name, size_t len, uint64_t epoch);
/* Under the mutex: a resume asked with the epoch t had before it adopted
 * the engine's, mapped to the engine's numbering. */
void tern__ps_bridge_resume(const tern__ps_gtopic *t, tern__ps_resume *rq);
/* A publish made here, handed to the engine for the other nodes. True:
 * the engine numbers it (the node delivers it when it hears it back), so
 * the caller stops there. */
bool tern__ps_bridge_forward(tern__ps_group *g, const tern__ps_msg *m, size_t tlen, size_t klen);
/* Under the mutex: where a message the engine numbered goes in t's
 * sequence. True: deliver it as num->seq (t->seq is that now). False: a
 * duplicate, one a fill in flight brings, or one that starts a fill. A
 * fill to ask (a gap before num->seq, or, when the message makes this
 * node adopt the engine's numbering, what the engine numbered before
 * it, for the history) is *fill_from..*fill_to, for tern__ps_bridge_fill
 * after the mutex (*fill_from 0: none). */
bool tern__ps_bridge_numbered(tern__ps_gtopic *t, const tern__engine_num *num,
                              uint64_t *fill_from, uint64_t *fill_to);
/* Under the mutex: whether num is a message of t's read-back
 * (tern__ps_bridged's back_to), older than what t's subscribers have had:
 * then *keep says whether it goes in t's history alone
 * (tern__hist_insert; false: a copy of one read back already). What the
 * engine no longer had before it is forgotten from the history here. */
bool tern__ps_bridge_backfills(tern__ps_gtopic *t, const tern__engine_num *num, bool *keep);
/* Under the mutex: the oldest seq from which t's history holds every
 * message up to its last (0: none), for a resume: a read-back in flight
 * leaves a hole before its end. */
uint64_t tern__ps_bridge_first(const tern__ps_gtopic *t);
void tern__ps_bridge_fill(tern__ps_group *g, const char *name, size_t len, uint64_t from,
                          uint64_t to);
/* Under the mutex, a message numbered here: a topic the engine numbered
 * while it was reachable is numbered here meanwhile, under a new epoch. */
void tern__ps_bridge_local(tern__ps_gtopic *t);
/* srv is being freed: its bridge (if it runs one) goes with it. */
void tern__ps_bridge_server_free(tern__ps_group *g, tern_server *srv);

#endif
