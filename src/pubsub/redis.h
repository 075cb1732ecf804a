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

/* What the bridge needs from pub/sub: a message another node published
 * (deliver it locally, not back to Redis), and, after each (re)connect,
 * the topics to subscribe (pub/sub calls tern__redis_subscribe for each). */
typedef struct tern__redis_hooks {
    void (*message)(void *user, const char *topic, size_t tlen, const char *key, size_t klen,
                    const char *data, size_t len, int opcode, size_t seq_at);
    void (*resubscribe)(void *user);
} tern__redis_hooks;

/* Parses url (redis://host[:port][/db]) and starts connecting. Returns 0,
 * -EINVAL (a bad URL), -ENOMEM. */
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
/* Any thread. */
void tern__redis_stats(const tern__redis *r, tern_redis_counters *out);

#endif
