/* tern serve's presence and join/leave on /pubsub (serve_presence.c), for
 * the topics whose rule says presence=on or join-leave=on (topic_rules.h);
 * an /sse stream's topics count the same (serve_sse.c: it is a client of
 * each, and gets join and leave as SSE events):
 *
 *   client -> server
 *     {"op":"presence","topic":"T"}               who is in T (this node's)
 *     {"op":"presence","topic":"T","limit":"N"}   at most N of them (1..1000)
 *     {"op":"presence_stats","topic":"T"}         how many clients and users
 *   server -> client
 *     {"ok":"presence","topic":"T","clients":C,"users":U,"truncated":B,
 *      "presence":[{"client":"ID","user":"SUB","info":I},...]}
 *                                                  the first N (1000 unless
 *                                                  asked) in join order; B:
 *                                                  some were left out
 *     {"ok":"presence_stats","topic":"T","clients":C,"users":U}
 *     {"topic":"T","join":{"client":"ID","user":"SUB","info":I}}
 *     {"topic":"T","leave":{"client":"ID","user":"SUB","info":I}}
 *                                                  pushed to T's subscribers
 *                                                  (not to the one joining or
 *                                                  leaving) with join-leave=on
 *   errors: "presence off" (the rule does not say presence=on), "forbidden"
 *   (the connection may not subscribe to T), "bad limit".
 *
 * ID: the connection's client id, 16 hex digits, one per connection (the
 * same in every topic); SUB: its token's sub ("" without a token); I: its
 * token's "info" claim, absent when it has none. A user with two
 * connections is two clients and one user.
 *
 * Across nodes: with --bridge, presence and presence_stats count every
 * node's subscribers (presence_nodes.h: another node's come within
 * APP_PRNODES_FLUSH_MS, and a node that stops answering is gone within
 * APP_PRNODES_EXPIRY_MS, with a leave for each of its subscribers); join
 * and leave events go wherever the topic's messages go.
 *
 * Join and leave travel on a topic of their own, "\x01" and T's name (so
 * a T of 256 bytes has none), to which each subscriber of T with
 * join-leave=on is subscribed too (it counts in the connection's 1024
 * subscriptions); no client may subscribe or publish to such a name
 * itself. They are not numbered in T and are never in T's history. The
 * events topic takes the settings of rule "*" and of --pubsub-*: with a
 * history there it keeps one too (never replayed: its subscribe does not
 * resume), and through --redis such a topic is numbered by Redis, so a
 * joining connection may then hear its own join. */
#ifndef TERN_APP_SERVE_PRESENCE_H
#define TERN_APP_SERVE_PRESENCE_H

#include <stdbool.h>
#include <stddef.h>

#include "app/serve_tokens.h"
#include "app/topic_rules.h"
#include "tern/tern.h"

/* The first byte of a join/leave topic's name. */
#define APP_PRESENCE_EVENTS_MARK '\x01'

/* A subscriber's presence (a /pubsub connection's, an /sse stream's):
 * its client id and the topics it is in with presence or join/leave
 * (NULL until its first). */
typedef struct app_pres_conn app_pres_conn;

/* What presence needs of a subscriber besides its client id and user
 * (app_pres_conn, the token state), whatever its transport (a /pubsub
 * connection, an /sse stream its tern_sink feeds): its server, which
 * publishes its join and leave on the topic's join/leave topic; and what
 * hears the others' join and leave there: its WebSocket (ws) or its
 * stream's sink (sink), at most one of them set. On the subscriber's
 * loop. */
typedef struct app_pres_who {
    tern_server *srv;
    tern_ws *ws;
    tern_sink *sink;
} app_pres_who;

/* After who subscribed to topic, under rule r (NULL: none): its entry in
 * presence and its join pushed, as r says. 0, or -ENOSPC (no room for the
 * join/leave topic among its subscriptions), -ENOMEM: then nothing of it
 * is kept and the caller unsubscribes who from topic. */
TERN_MUST_CHECK
int app_presence_subscribed(const app_pres_who *who, app_pres_conn **pc,
                            const app_token_conn *auth, const app_topic_rule *r,
                            const char *topic, size_t tlen);
/* After who unsubscribed from topic: out of presence, its leave pushed. */
void app_presence_unsubscribed(const app_pres_who *who, app_pres_conn *pc, const char *topic,
                               size_t tlen);
/* {"topic":T,"join"|"leave":{"client":"ID","user":"U"[,"info":I]}} (what
 * is "join" or "leave"; info JSON text or NULL) published by srv on T's
 * join/leave topic, to its subscribers on every node. */
void app_presence_push(tern_server *srv, const char *what, uint64_t client, const char *topic,
                       size_t tlen, const char *user, const char *info);
/* At the subscriber's end (on_close, a stream's end): every topic left at
 * once, and pc freed (NULL: nothing). */
void app_presence_closed(const app_pres_who *who, app_pres_conn *pc);
/* Whether the route's hooks are asked for a join/leave topic: refused
 * unless app_presence_subscribed is subscribing to it. */
bool app_presence_events_topic(const char *topic, size_t len);
bool app_presence_events_subscribing(void);
/* {"op":"presence"} (stats false) and {"op":"presence_stats"}: answered
 * to ws. r: topic's rule; may: whether ws may subscribe to it; limit: 0
 * for the most, else what was asked (1..APP_PRESENCE_LIST_MAX). */
void app_presence_reply(tern_ws *ws, bool stats, const app_topic_rule *r, bool may,
                        const char *topic, size_t tlen, size_t limit);
/* The admin listener's GET /presence?topic=T[&limit=N] and GET
 * /presence/stats?topic=T (stats), once the key was checked: the same
 * JSON as the ops' answers without "ok"; 400 for a bad topic or limit,
 * 404 "presence off" where the rule does not say presence=on. */
void app_presence_admin(tern_http_req *req, const app_topic_rules *rules, bool stats);

#endif
