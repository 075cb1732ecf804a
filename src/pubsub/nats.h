/* The NATS engine of pub/sub (src/pubsub/nats.c, on libnats): one
 * connection to a NATS server or cluster on which each topic with
 * subscribers on this node is one core NATS subscription (subject
 * "tern." and the topic, escaped) and each publish one message. It fills
 * engine.h's tern__engine without the numbering: a topic with a history
 * is numbered by each node (engine.h), so a subscriber resumes on the
 * node it left. Every call is made on its loop's thread. */
#ifndef TERN_PUBSUB_NATS_H
#define TERN_PUBSUB_NATS_H

#include "pubsub/engine.h"
#include "tern/loop.h"

/* Parses url (nats_url.h) and connects from a thread of its own (a name
 * is resolved and the connect made there, never on the loop); the hooks
 * are called with user, on the loop. Returns 0 (*out filled), -EINVAL (a
 * bad URL, its reason logged), -ENOMEM. */
TERN_MUST_CHECK
int tern__nats_engine(tern__engine *out, tern_loop *loop, const char *url,
                      const tern__engine_hooks *hooks, void *user);

#endif
