/* The Redis engine of pub/sub (src/pubsub/redis.c, on hiredis's async
 * API): two connections on one tern loop, one SUBSCRIBEd to the channels
 * of the topics this node has subscribers for (and PSUBSCRIBEd to the
 * prefixes of the numbered ones), one to PUBLISH on. It fills engine.h's
 * tern__engine; every call is made on its loop's thread.
 *
 * Redis's numbering (engine.h's publish_numbered): one script (EVAL)
 * counts the message in the topic's hash (tern:n:TOPIC: epoch and seq; a
 * new epoch when the count starts again), appends it to the topic's
 * stream (tern:s:TOPIC, at most `keep` entries, id 0-SEQ) and publishes it
 * on its channel; both keys expire after keep_ms without a publish (0:
 * never). A fill reads the stream back (XRANGE); a claim sets the hash's
 * epoch unless one is there. */
#ifndef TERN_PUBSUB_REDIS_H
#define TERN_PUBSUB_REDIS_H

#include "pubsub/engine.h"
#include "tern/loop.h"

/* Parses url (redis://[user:password@]host[:port][/db]; host a name or an
 * IPv4/IPv6 address) and connects from the loop (a name is resolved
 * first, without blocking); the hooks are called with user. Returns 0
 * (*out filled), -EINVAL (a bad URL), -ENOMEM, -EAGAIN (no random id). */
TERN_MUST_CHECK
int tern__redis_engine(tern__engine *out, tern_loop *loop, const char *url,
                       const tern__engine_hooks *hooks, void *user);

#endif
