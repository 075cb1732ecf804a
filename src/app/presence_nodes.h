/* tern serve's presence across nodes: with --bridge, each node tells the
 * others who is in its topics with presence=on, and keeps what they tell
 * it in the presence store (presence.h), so that presence, presence_stats
 * and the admin listener's /presence answer for the whole cluster.
 *
 * The engine's own topics carry it (Redis or NATS alike): one hidden
 * topic, APP_PRNODES_TOPIC, which no client may subscribe or publish to.
 * Each node publishes there, from loop 0's timer:
 *   - its changes (joins and leaves) every APP_PRNODES_FLUSH_MS, batched
 *     into messages of at most 64 KiB: a join costs an append to a buffer,
 *     never anything in the topic's size;
 *   - every APP_PRNODES_ANNOUNCE_MS, all of its own entries (a snapshot,
 *     in the same messages), which replaces what the others keep of it:
 *     a change lost on the way, or a node that came later, is made right
 *     within one announcement. A node with no entry says nothing (one
 *     empty snapshot once its last entry left), so a node without presence
 *     adds nothing to the bridge's traffic.
 * A message names its node (--node-name, which must differ between nodes)
 * and its instance (random, drawn at start). A node that has said nothing
 * for APP_PRNODES_EXPIRY_MS (three announcements) is dropped, its entries
 * with it; a node whose instance changes (it restarted) is dropped the
 * same way before its new entries are taken.
 *
 * When a node is dropped, the live node whose instance is the lowest
 * (not counting the dropped one's next instance, which never heard of its
 * entries) publishes a leave for each of its entries on the topics whose rule says
 * join-leave=on, so that the others' subscribers hear each leave once
 * (two nodes that disagree for a moment about who is alive may both say
 * it). Joins and leaves of live nodes need nothing of this: they travel
 * on each topic's events topic through the bridge already.
 *
 * Bounds: at most APP_PRNODES_NODES other nodes and APP_PRNODES_ENTRIES
 * entries per node are kept (more are ignored, logged once per node);
 * changes waiting to be sent at most APP_PRNODES_PENDING bytes (past it,
 * they are dropped and a snapshot goes at the next tick instead). */
#ifndef TERN_APP_PRESENCE_NODES_H
#define TERN_APP_PRESENCE_NODES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tern/tern.h"

/* "\x01\x01presence": the events topic of a name clients cannot use, so
 * the route's hooks refuse it to every client (serve_presence.h). */
#define APP_PRNODES_TOPIC "\x01\x01presence"

#define APP_PRNODES_FLUSH_MS 100
#define APP_PRNODES_ANNOUNCE_MS 5000
#define APP_PRNODES_EXPIRY_MS (3 * APP_PRNODES_ANNOUNCE_MS)
#define APP_PRNODES_NODES 64
#define APP_PRNODES_ENTRIES 100000
#define APP_PRNODES_PENDING (1024 * 1024)

/* In tern_run's setup, on srv's loop (loop 0), once the bridge is set:
 * the hidden topic is subscribed and the timer started by a post, once
 * every loop exists. node: --node-name (copied). 0 or a negative errno. */
TERN_MUST_CHECK
int app_prnodes_start(tern_server *srv, const char *node);
/* On the same loop, in its teardown: the timer and the subscription end,
 * the other nodes' entries leave the store. Nothing when not started. */
void app_prnodes_stop(void);
/* SIGTERM or SIGINT: from now on each change is told at once (from the
 * thread that makes it), not at the next tick, so that the leaves of the
 * connections the shutdown closes reach the others before the loops end
 * (else they would wait for the expiry). Any thread. */
void app_prnodes_draining(void);
/* This node's entry client in topic joined (join) or left the store:
 * told to the other nodes at the next tick. Any thread; nothing unless
 * started. user: NUL-terminated; info: JSON text or NULL. */
void app_prnodes_changed(bool join, const char *topic, size_t tlen, uint64_t client,
                         const char *user, const char *info);

#endif
