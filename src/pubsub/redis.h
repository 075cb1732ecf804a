/* The Redis bridge of pub/sub (src/pubsub/redis.c): two hiredis async
 * connections on one tern loop, one SUBSCRIBEd to the channels of the
 * topics this node has subscribers for, one to PUBLISH on. Every call is
 * made on the bridge's loop thread. */
#ifndef TERN_PUBSUB_REDIS_H
#define TERN_PUBSUB_REDIS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tern/loop.h"
#include "tern/pubsub.h"

typedef struct tern__redis tern__redis;

/* Redis's number for a message of a topic numbered there (a topic with a
 * history: tern__redis_publish_numbered): its epoch and seq, and whether
 * it came from a fill (tern__redis_fill) rather than live. */
typedef struct tern__redis_num {
    uint64_t epoch, seq;
    bool fill;
} tern__redis_num;

/* What the bridge needs from pub/sub: a message another node published,
 * or any node's numbered one (num not NULL; this node's own too: Redis
 * gave it its number), to deliver locally, not back to Redis; and, after
 * each (re)connect, the topics and patterns to subscribe (pub/sub calls
 * tern__redis_subscribe and _psubscribe for each). */
typedef struct tern__redis_hooks {
    void (*message)(void *user, const char *topic, size_t tlen, const char *key, size_t klen,
                    const char *data, size_t len, int opcode, size_t seq_at,
                    const tern__redis_num *num);
    void (*resubscribe)(void *user);
    /* A pattern subscription is in place (after each reconnect): from now
     * on every numbered message is heard, so pub/sub asks for the last
     * number of the topics it follows (tern__redis_last) to read back
     * what went by while the link was down. */
    void (*listening)(void *user);
    /* tern__redis_last's answer: topic's epoch and last seq in Redis. */
    void (*last)(void *user, const char *topic, size_t tlen, uint64_t epoch, uint64_t seq);
    /* tern__redis_claim's answer: the topic's epoch in Redis (this node's
     * when its claim came first) and last seq (0: none yet). */
    void (*claimed)(void *user, const char *topic, size_t tlen, uint64_t epoch, uint64_t seq);
} tern__redis_hooks;

/* Parses url (redis://host[:port][/db]; host a name or an IPv4/IPv6
 * address) and connects from the loop (a name is resolved first, without
 * blocking). Returns 0, -EINVAL (a bad URL), -ENOMEM. */
TERN_MUST_CHECK
int tern__redis_new(tern__redis **out, tern_loop *loop, const char *url,
                    const tern__redis_hooks *hooks, void *user);
void tern__redis_free(tern__redis *r);
tern_loop *tern__redis_loop(const tern__redis *r);

/* Makes Redis's subscription to topic's channel match `on` (idempotent;
 * remembered across a reconnect only through the resubscribe hook). */
void tern__redis_subscribe(tern__redis *r, const char *topic, size_t tlen, bool on);
/* Sends a publish to the other nodes (or counts it dropped while Redis is
 * away: nothing is queued). key as in tern_publish_key (klen 0: none),
 * seq_at as in tern_publish_ex. */
void tern__redis_publish(tern__redis *r, const char *topic, size_t tlen, const char *key,
                         size_t klen, const void *data, size_t len, int opcode, size_t seq_at);
/* A topic numbered by Redis: one script (EVAL) counts the message in the
 * topic's hash (tern:n:TOPIC: epoch and seq; a new epoch when the count
 * starts again), appends it to the topic's stream (tern:s:TOPIC, at most
 * `keep` entries, id 0-SEQ) and publishes it on its channel; both keys
 * expire after keep_ms without a publish (0: never). Every node, this one
 * included, hears it through its pattern subscription with its number. */
void tern__redis_publish_numbered(tern__redis *r, const char *topic, size_t tlen,
                                  const char *key, size_t klen, const void *data, size_t len,
                                  int opcode, size_t seq_at, uint32_t keep, uint32_t keep_ms);
/* Subscribes the channels of every topic starting with prefix (plen 0:
 * every topic): the topics numbered by Redis are heard this way. */
void tern__redis_psubscribe(tern__redis *r, const char *prefix, size_t plen);
/* Reads the numbered messages from..to (seq) of topic back from its
 * stream, for a node that missed them (its link was down): each comes to
 * the message hook with num->fill set, in order. Nothing when Redis is
 * away (the next live message asks again). */
void tern__redis_fill(tern__redis *r, const char *topic, size_t tlen, uint64_t from, uint64_t to);
/* Claims epoch as topic's in Redis, unless one is there already (a count,
 * or another node's claim): so that a subscriber given it before the
 * topic's first message holds Redis's epoch, good on every node. A claim
 * no message follows expires after keep_ms. The claimed hook answers. */
void tern__redis_claim(tern__redis *r, const char *topic, size_t tlen, uint64_t epoch,
                       uint64_t keep_ms);
/* Asks Redis for topic's epoch and last seq (the last hook answers). */
void tern__redis_last(tern__redis *r, const char *topic, size_t tlen);
bool tern__redis_connected(const tern__redis *r);
/* Any thread. */
void tern__redis_stats(const tern__redis *r, tern_redis_counters *out);

#endif
