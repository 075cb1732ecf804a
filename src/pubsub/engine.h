/* The engine seam of pub/sub: what an engine that links the nodes (a
 * broker several tern servers share) gives the bridge (bridge.c), and
 * what the bridge gives it back. An engine is one file that fills a
 * tern__engine from a URL (a tern__engine_start function): Redis
 * (redis.c) and NATS (nats.c). The bridge picks one by the URL's scheme from its
 * table (bridge.c's engines[]). Nothing of pub/sub's core (publish,
 * delivery, resume) names an engine: it calls the bridge, which calls
 * these.
 *
 * Every operation and every hook runs on the engine's loop thread (the
 * bridge posts work there from other threads); the engine never blocks
 * that loop (host names through net/resolve.h, non-blocking connects). */
#ifndef TERN_PUBSUB_ENGINE_H
#define TERN_PUBSUB_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tern/loop.h"
#include "tern/pubsub.h"

/* An engine's number for a message of a topic it numbers (a topic with a
 * history, published with publish_numbered): its epoch and seq, and
 * whether it came from a fill (the engine's fill) rather than live. */
typedef struct tern__engine_num {
    uint64_t epoch, seq;
    bool fill;
} tern__engine_num;

/* What the engine tells the bridge (user is the bridge's):
 * - message: a message another node published, or any node's numbered
 *   one (num not NULL; this node's own too: the engine gave it its
 *   number), to deliver locally, not back to the engine (key NULL or
 *   klen 0: none; topic and key within TERN_TOPIC_MAX and TERN_KEY_MAX);
 * - resubscribe: after each (re)connect, the bridge names the topics and
 *   prefixes to follow again (subscribe, psubscribe);
 * - listening: the prefix subscriptions are in place, so every numbered
 *   message is heard from now on: the bridge asks for the last number of
 *   the topics it follows (last) to read back what went by while the link
 *   was down;
 * - last: the answer to last: the topic's epoch and last seq there;
 * - claimed: the answer to claim: the topic's epoch there (this node's
 *   when its claim came first) and last seq (0: none yet). */
typedef struct tern__engine_hooks {
    void (*message)(void *user, const char *topic, size_t tlen, const char *key, size_t klen,
                    const char *data, size_t len, int opcode, size_t seq_at,
                    const tern__engine_num *num);
    void (*resubscribe)(void *user);
    void (*listening)(void *user);
    void (*last)(void *user, const char *topic, size_t tlen, uint64_t epoch, uint64_t seq);
    void (*claimed)(void *user, const char *topic, size_t tlen, uint64_t epoch, uint64_t seq);
} tern__engine_hooks;

/* The operations of an engine, each given the engine's state.
 * Invariants: name, free, loop, connected, subscribe, publish and stats
 * are never NULL. The numbering (publish_numbered, psubscribe, fill, claim, last)
 * is optional, all five or none (the bridge refuses, at start, an engine
 * that gives some): an engine without it (a broker that
 * keeps nothing) leaves the five
 * NULL and never calls the listening, last and claimed hooks nor gives
 * message a num. The bridge then treats a topic with a history as any
 * other: its publishes go through publish, the engine's interest in it
 * follows its subscribers (subscribe), and every node numbers its
 * messages itself (node-local epoch and seq, as without a bridge), so a
 * subscriber resumes on the node it left, not on another. */
typedef struct tern__engine_ops {
    const char *name;   /* "redis": tern_bridge_counters.engine */
    void (*free)(void *state);
    tern_loop *(*loop)(const void *state);
    /* Linked, and, for an engine that numbers, following every numbered
     * topic (its prefix subscriptions confirmed): publish_numbered will
     * be heard back. */
    bool (*connected)(const void *state);
    /* The engine's interest in topic's messages matches `on`
     * (idempotent; after a reconnect only through the resubscribe hook). */
    void (*subscribe)(void *state, const char *topic, size_t tlen, bool on);
    /* Sends a publish to the other nodes (or counts it dropped while the
     * engine is away: nothing is queued). key as in tern_publish_key (klen
     * 0: none), seq_at as in tern_publish_ex. */
    void (*publish)(void *state, const char *topic, size_t tlen, const char *key, size_t klen,
                    const void *data, size_t len, int opcode, size_t seq_at);
    /* The numbering (optional, above), for topics with a history, so that
     * every node agrees on (epoch, seq):
     * - publish_numbered: the engine numbers the message, keeps it (at
     *   most keep messages, for keep_ms without a publish; 0: for good)
     *   and sends it to every node, this one included, through the
     *   message hook with its number;
     * - psubscribe: follows every topic starting with prefix (plen 0:
     *   every topic), numbered ones this way;
     * - fill: reads the numbered messages from..to of topic back, for a
     *   node that missed them: each to the message hook with num->fill
     *   set, in order; nothing while away (the next live message asks
     *   again);
     * - claim: makes epoch topic's, unless one is there already, so that a
     *   subscriber given it before the topic's first message holds the
     *   engine's epoch, good on every node; a claim no message follows
     *   expires after keep_ms; the claimed hook answers;
     * - last: asks for topic's epoch and last seq; the last hook answers. */
    void (*publish_numbered)(void *state, const char *topic, size_t tlen, const char *key,
                             size_t klen, const void *data, size_t len, int opcode,
                             size_t seq_at, uint32_t keep, uint32_t keep_ms);
    void (*psubscribe)(void *state, const char *prefix, size_t plen);
    void (*fill)(void *state, const char *topic, size_t tlen, uint64_t from, uint64_t to);
    void (*claim)(void *state, const char *topic, size_t tlen, uint64_t epoch,
                  uint64_t keep_ms);
    void (*last)(void *state, const char *topic, size_t tlen);
    /* Any thread. Fills every field of out but engine (the bridge sets
     * it from name). */
    void (*stats)(const void *state, tern_bridge_counters *out);
} tern__engine_ops;

/* An engine: its operations and its state (the engine's own struct). */
typedef struct tern__engine {
    const tern__engine_ops *ops;
    void *state;
} tern__engine;

/* An engine's constructor: parses url (the engine's scheme) and starts
 * linking from loop (never blocking it); the hooks are called with user.
 * Returns 0 (*out filled), -EINVAL (a URL it refuses), -ENOMEM, or
 * another negative errno of its own; nothing is left started on error. */
typedef int (*tern__engine_start)(tern__engine *out, tern_loop *loop, const char *url,
                                  const tern__engine_hooks *hooks, void *user);

/* tern_pubsub_bridge with the engine start instead of the one url's
 * scheme names: the one way in for both the scheme table and the unit
 * tests' own engines (bridge.c). Returns as tern_pubsub_bridge. */
TERN_MUST_CHECK
int tern__ps_bridge_start(tern_server *srv, const char *url, tern__engine_start start);

#endif
