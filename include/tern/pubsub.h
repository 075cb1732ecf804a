/* tern pub/sub: topics over WebSocket connections.
 *
 * A connection subscribes to topics by exact name; a publish sends a
 * message to every subscriber of the topic, on every loop of the server's
 * tern_run group (or just the server's loop outside tern_run).
 *
 *   static void on_message(tern_ws *ws, const char *d, size_t n, int op, void *u) {
 *       tern_ws_subscribe(ws, "chat");
 *       tern_publish_except(tern_ws_server(ws), "chat", d, n, op, ws);
 *   }
 *
 * Each loop keeps its own registry (topics -> subscribers, connection ->
 * its subscriptions); a connection that subscribes to nothing costs
 * nothing. A connection's subscriptions end by themselves when it closes
 * (before its on_close runs, or at the latest when it is freed).
 *
 * A published message is framed (and, when some subscriber negotiated
 * permessage-deflate, compressed) once, and the same frame is given to
 * every subscriber of every loop: other loops get a reference to it
 * through tern_loop_post. A subscriber that keeps up gets it through the
 * loop's cork (several messages to one subscriber in one batch leave in
 * one write); one that is behind (its connection has bytes the kernel
 * refused) keeps a reference to it in a queue per subscription, sent as
 * the backlog drains, so a thousand slow subscribers share one copy of
 * each frame. No callback runs inside a publish: a subscriber closed by
 * the slow-consumer policy hears of it (on_close) at the end of the
 * batch.
 *
 * Order: every message is numbered per topic (seq, from 1, over all the
 * loops of the group), and every subscriber sees a topic's messages in seq
 * order, whichever threads publish (so one thread's in the order it
 * published them). Publishers of one group take turns, per message, for
 * the numbering and framing (a mutex).
 *
 * A topic exists while it has a subscriber somewhere, or a history: when
 * the last subscriber leaves a topic without one, its seq is forgotten
 * (the next publish to it with subscribers starts again at 1), and a
 * publish to a topic with neither is not numbered (0). So memory is
 * bounded by the subscriptions and the histories, not by the names ever
 * used.
 *
 * History and resume: a topic whose options give it a history keeps its
 * last messages (the prepared frames, shared, not copied; at most
 * `history` of them, none older than `history_ms`) and the latest message
 * of each key, and numbers its messages whether or not anyone listens
 * (and is kept, with its epoch, while it has numbered none, so that a
 * subscriber that leaves it and comes back has missed nothing).
 * Its numbering has an epoch, a random number drawn when the topic comes
 * to exist (a restart, or a history that ran out entirely, starts a new
 * one). A subscriber that comes back with the epoch and the last seq it
 * saw (tern_ws_subscribe_from) gets every message it missed from the
 * history, then the live stream, with no gap and no duplicate; when the
 * epoch differs or the history no longer reaches back, it is told so and
 * gets the latest message of each key instead.
 *
 * Authorization: a route's on_subscribe and on_publish hooks
 * (tern_ws_handlers) decide when one of its connections subscribes
 * (tern_ws_subscribe*) or publishes through tern_ws_publish; never per
 * delivered message. tern_publish* (the server publishing itself) asks
 * no hook.
 *
 * Across nodes (tern_pubsub_bridge) through an engine that numbers topics
 * (Redis does), a topic with a history is numbered by the broker, so every
 * node gives its messages the same (epoch, seq) and a subscriber may
 * resume on any node: a publish to it goes to the broker first and returns
 * 0, and every node, the publisher's too, delivers it when it comes back
 * numbered (so except does not apply to it). A topic's epoch is the
 * broker's even before its first message: the first node to have a
 * subscriber claims its own there. */
#ifndef TERN_PUBSUB_H
#define TERN_PUBSUB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tern/http.h"
#include "tern/ws.h"

#ifdef __cplusplus
extern "C" {
#endif

#pragma GCC visibility push(default)

#define TERN_TOPIC_MAX 256   /* longest topic name, in bytes */

/* What happens to a subscriber whose waiting bytes (its connection's
 * backlog and its queued messages) would pass max_backlog. */
enum tern_pubsub_policy {
    TERN_PUBSUB_DROP = 0,    /* the message is not sent to it, and counted as dropped */
    TERN_PUBSUB_CLOSE = 1,   /* the connection is closed with 1008 "slow consumer" */
    /* Per-key conflation: while a subscriber is behind, a message published
     * with a key (tern_publish_key) replaces the one of the same key still
     * queued for it (counted as conflated), whatever the limit; keys leave
     * in the order of their latest update. Memory is bounded by the keys
     * (at most TERN_CONFLATE_KEYS per subscription), not the rate; so a
     * keyed message larger than max_backlog still goes to a subscriber
     * with nothing waiting (else that key's latest value would never
     * arrive). A message without a key waits, or is dropped past
     * max_backlog, as with TERN_PUBSUB_DROP; so is a new key past that
     * bound. */
    TERN_PUBSUB_CONFLATE = 2,
};

#define TERN_CONFLATE_KEYS 4096   /* queued keys per subscription */
#define TERN_KEY_MAX 128          /* longest key, in bytes */

/* Zero means the default for every field. */
typedef struct tern_pubsub_options {
    /* A subscriber whose tern_ws_buffered() plus its queued messages plus
     * the message would pass this gets the policy instead of the message:
     * 1 MiB. (The route's own backlog limits and slow policy still apply
     * under it; a send the route refuses is counted as dropped too.) */
    size_t max_backlog;
    int policy;                    /* enum tern_pubsub_policy */
    uint32_t max_subscriptions;    /* per connection: 1024 */
    /* The close code of TERN_PUBSUB_CLOSE: 1008 (policy violation, the
     * default) or 1013 (try again later: a client that reconnects on 1013
     * is invited to). Anything else is -EINVAL. */
    uint16_t close_code;
    /* A history for every topic (rules may give one to some): the last
     * `history` messages (0: none, the default; at most TERN_HISTORY_MAX),
     * none older than history_ms (0: no age limit). */
    uint32_t history;
    uint32_t history_ms;
    /* Bytes a second each loop sends to subscribers that resume
     * (tern_ws_subscribe_from) until they have caught up, all of them
     * together: what the loop's token bucket (10 ms worth) does not
     * cover waits in their queues, and the live messages behind it. After
     * a mass reconnect this spreads the catch-up over time, bounding the
     * CPU of the storm, at the price of the resumed subscribers' lag. Set
     * it above the rate the topics publish at (times the subscribers that
     * resume), or they fall further behind. 0 (the default): no limit, a
     * replay goes as fast as the kernel takes it. */
    uint64_t replay_rate;
    /* Bytes all topics' histories may keep together (every message
     * counted once for the ring and once more when it is its key's
     * latest, so the figure errs high). Over it, the oldest messages go
     * first from the topics that keep more than their share (this budget
     * over the topics with a history), so one busy topic cannot wipe a
     * quiet one's. 0 (the default): no byte limit, only the counts. */
    size_t history_bytes;
    /* Milliseconds a topic's messages may wait on a loop before their
     * pass over its subscribers starts, counted from the first of them
     * (at most TERN_WRITE_DELAY_MAX). The messages that come meanwhile go
     * in the same pass, each subscriber getting them in a row in one
     * write: fewer sends per message at a low publish rate, for up to
     * this much more latency. With a delay, a publish on the loop's own
     * thread waits in the batch too (behind the others: per-topic order
     * holds). While a server stops gracefully its loop still runs the
     * passes; what waits when it is freed is dropped for every
     * subscriber alike, as they are closed. 0 (the default): a pass
     * starts on the loop's next turn. */
    uint32_t write_delay_ms;
} tern_pubsub_options;

#define TERN_WRITE_DELAY_MAX 1000   /* write_delay_ms at most */

#define TERN_HISTORY_MAX 65536       /* messages kept per topic */
#define TERN_HISTORY_TOPICS 4096     /* topics with a history, per group */

/* The settings of a family of topics, overriding the server's
 * (tern_pubsub_options) for them. Zero means the server's value for
 * max_backlog, close_code, history and history_ms; policy is always this
 * rule's. */
typedef struct tern_topic_options {
    size_t max_backlog;
    int policy;                    /* enum tern_pubsub_policy */
    uint16_t close_code;           /* 1008 or 1013 */
    uint32_t history;              /* messages kept (see tern_pubsub_options) */
    uint32_t history_ms;
    /* Each loop starts a pass over the topic's subscribers at most this
     * often (0: as messages come; at most TERN_WRITE_DELAY_MAX): a message
     * on a quiet topic goes at the loop's next turn, and those that come
     * within throttle_ms of the last pass wait for the next one, each
     * subscriber getting them in one write. Fewer writes under a burst,
     * no delay when quiet; replaces write_delay_ms for the topic. */
    uint32_t throttle_ms;
    /* The rule is for the topic named `prefix` alone, not for the topics
     * it starts; it wins over every prefix rule for that topic. */
    bool exact;
} tern_topic_options;

#define TERN_TOPIC_RULES_MAX 64   /* rules per configuration */

/* Sets the pub/sub options of srv's configuration (every loop of its
 * tern_run group): call it in setup, before serving. Returns 0, -EINVAL
 * (srv or opt NULL, a bad policy, a close_code not 0, 1008 or 1013, a
 * history over TERN_HISTORY_MAX, a write_delay_ms over
 * TERN_WRITE_DELAY_MAX), -EBUSY once the configuration is shared
 * or pub/sub used, -ENOMEM. */
TERN_MUST_CHECK
int tern_pubsub_configure(tern_server *srv, const tern_pubsub_options *opt);

/* Gives the topics whose names start with prefix their own slow-consumer
 * settings: "market." may drop while "orders." closes. An exact rule
 * (opt->exact) for the topic wins, else the longest matching prefix; a
 * second rule for the same prefix (and exactness) replaces the first. Like tern_pubsub_configure, in setup before serving (call that
 * first if you call both: it keeps the rules). Returns 0, -EINVAL (NULL
 * argument, bad policy, close code or history, a throttle_ms over
 * TERN_WRITE_DELAY_MAX), -ENAMETOOLONG (prefix over
 * TERN_TOPIC_MAX), -ENOSPC (TERN_TOPIC_RULES_MAX rules), -EBUSY (the
 * configuration is shared or pub/sub used), -ENOMEM. */
TERN_MUST_CHECK
int tern_pubsub_topic_rule(tern_server *srv, const char *prefix, const tern_topic_options *opt);

/* A loop's pub/sub counters since its server was made. Written by that
 * loop alone and readable from any thread, as tern_server_stats. */
typedef struct tern_pubsub_counters {
    uint64_t messages;    /* published messages that found subscribers on this loop */
    uint64_t delivered;   /* copies given to subscribers */
    uint64_t dropped;     /* copies not given: a subscriber over its backlog (drop policy) or
                             refused by its route's own limit */
    uint64_t closed;      /* subscribers closed by the close policy */
    uint64_t conflated;   /* queued copies replaced by newer ones with their key */
    uint64_t subscriptions;   /* live subscriptions on this loop */
    /* The most messages one subscription had waiting in its queue (as
     * references) at any time: with TERN_PUBSUB_CONFLATE, at most its
     * keys. */
    uint64_t queue_max;
} tern_pubsub_counters;
/* Returns 0, or -EINVAL for a NULL argument or a host handle. */
int tern_pubsub_stats(const tern_server *srv, tern_pubsub_counters *out);

/* srv's loop's publish-to-delivery latency: from the publish call (on
 * whichever thread) to this loop having handed the message to every
 * subscriber of the topic (a posted message: at the end of the batch pass
 * that carried it), once per message per loop (copies queued behind a slow
 * subscriber leave later than this says). Bounds from 50 us to 2.5 s.
 * Counted by the loop in a fixed array, readable from any thread.
 * Returns 0, or -EINVAL for a NULL argument or a host handle. */
int tern_pubsub_latency(const tern_server *srv, tern_histogram *out);

/* The pub/sub counters of the topics one rule of tern_pubsub_topic_rule
 * covers (the topics whose settings it gives), summed over every loop of
 * srv's group. Counted on the loops without a lock or an allocation: a
 * fixed array of TERN_TOPIC_RULES_MAX slots per loop. */
typedef struct tern_pubsub_rule_counters {
    uint64_t subscriptions;   /* live subscriptions now */
    uint64_t published;       /* publishes made on this node (not those heard from the bridge) */
    uint64_t delivered;       /* copies given to subscribers, replayed ones too */
    uint64_t dropped;         /* copies not given (as tern_pubsub_counters.dropped) */
    uint64_t conflated;       /* queued copies replaced by newer ones with their key */
    uint64_t replayed;        /* messages from the history given to subscriptions at their start */
    uint64_t resumed;         /* resumes (tern_ws_subscribe_from, epoch not 0) with nothing missed */
    uint64_t resumed_gap;     /* resumes that could not give every missed message */
} tern_pubsub_rule_counters;
/* The rule named by prefix and exact as in tern_pubsub_topic_rule.
 * Readable from any thread. Returns 0, -EINVAL (a NULL argument, a host
 * handle), -ENOENT (no such rule). */
int tern_pubsub_rule_stats(const tern_server *srv, const char *prefix, bool exact,
                           tern_pubsub_rule_counters *out);

/* ---- many nodes: the bridge to a broker ------------------------------
 *
 * tern_pubsub_bridge(srv, "redis://127.0.0.1:6379/0") makes every process
 * (node) bridged to the same broker one pub/sub space. The URL's scheme
 * picks the engine that speaks to the broker: Redis ("redis://") or NATS
 * ("nats://", or "tls://" over TLS: core NATS subjects; see
 * docs/api/pubsub.md for its URL). A
 * publish is delivered to this node's subscribers at
 * once, as without a bridge, and sent to the broker (with Redis, on
 * channel "tern:" + topic, in an envelope that names the node); a node
 * follows a topic while it has subscribers to the topic (on any loop),
 * and delivers what comes from the other nodes on all its loops. So every
 * subscriber of every node gets each message once. The engine runs on
 * srv's loop and never blocks it: a host name is resolved by c-ares on
 * the loop, again before each try.
 *
 * Order: a subscriber gets each node's publishes to a topic in that
 * node's order (as one thread's, above); publishes made on different nodes
 * interleave as they arrive. The seq a subscriber sees is its node's
 * numbering (a message from another node is numbered when it arrives),
 * except for a topic with a history under an engine that numbers topics
 * (Redis does: below, tern_pubsub_redis).
 *
 * The broker going away is survived: local delivery goes on; publishes
 * meanwhile reach this node only (counted as dropped, never queued); the
 * engine reconnects with a backoff (with Redis: 100 ms, doubling to 5 s,
 * with jitter; from 100 ms again only after the links have stayed up for
 * 3 s) and follows its topics again. Every failure is logged with its
 * reason (warn: the resolver's, a refused connect, an error reply such as
 * NOPERM, a lost link), once per change of reason; regaining the broker
 * after one is logged once (warn; a first connect, info). */
typedef struct tern_bridge_counters {
    const char *engine;    /* the engine's name ("redis", "nats"), a static string */
    bool connected;        /* linked, and following the topics with a history
                            * when the engine numbers them */
    uint64_t reconnects;   /* links made again after a loss */
    uint64_t published;    /* publishes sent to the broker */
    uint64_t received;     /* messages from the other nodes */
    uint64_t dropped;      /* publishes not sent: the broker was away */
    uint64_t fills;        /* numbered messages missed (link down) and read back */
    bool auth_refused;     /* the broker refused the URL's credentials (or their absence)
                            * at the last try */
} tern_bridge_counters;

/* Bridges srv's configuration (every loop of its group) to the broker at
 * url, through the engine its scheme names: "redis://" (see
 * tern_pubsub_redis for its URL and behaviour), or "nats://" and "tls://"
 * (NATS, which does not number topics: each node numbers its own). In
 * setup, on srv's loop thread, after tern_pubsub_configure and the topic
 * rules. Returns 0,
 * -EINVAL (NULL argument, a host handle, a scheme no engine speaks, logged
 * with the schemes known, or a URL its engine refuses), -EALREADY (bridged
 * already), -ENOMEM. Connecting goes on in the loop: a broker that is not
 * there yet is retried as after a loss. */
TERN_MUST_CHECK
int tern_pubsub_bridge(tern_server *srv, const char *url);
/* Any thread. Returns 0, or -ENOENT when srv's group has no bridge,
 * -EINVAL. */
int tern_pubsub_bridge_stats(const tern_server *srv, tern_bridge_counters *out);

/* The Redis engine. A topic with a history is numbered by Redis, so
 * every node gives its messages the same (epoch, seq) and a subscriber
 * may resume on any node: a publish to it goes to Redis first and
 * returns 0, and every node delivers it when it comes back numbered. */

/* tern_bridge_counters without the engine's name, kept for compatibility
 * (tern_pubsub_redis_stats). */
typedef struct tern_redis_counters {
    bool connected;        /* both connections up, and the pattern subscription
                            * of topics with a history running in Redis */
    uint64_t reconnects;   /* connections made again after a loss */
    uint64_t published;    /* publishes sent to Redis */
    uint64_t received;     /* messages from the other nodes */
    uint64_t dropped;      /* publishes not sent: Redis was away */
    uint64_t fills;        /* numbered messages missed (link down) and read back from Redis */
    bool auth_refused;     /* Redis refused the URL's password (or its absence) at the last try */
} tern_redis_counters;

/* Kept for compatibility: tern_pubsub_bridge with a redis:// url (any
 * other scheme is -EINVAL). url is
 * redis://[[user]:password@]host[:port][/db]; port 6379, db 0 by default;
 * the password, and the ACL user when given, are sent with AUTH first on
 * every connection, %XX escapes decoded; a refusal is logged once,
 * without the password, and retried with the backoff, as a loss. Returns
 * as tern_pubsub_bridge. */
TERN_MUST_CHECK
int tern_pubsub_redis(tern_server *srv, const char *url);
/* Kept for compatibility: tern_pubsub_bridge_stats's counters as
 * tern_redis_counters. Any thread. Returns 0, or -ENOENT when srv's group
 * has no bridge, -EINVAL. */
int tern_pubsub_redis_stats(const tern_server *srv, tern_redis_counters *out);

/* Subscribes ws to topic (1..TERN_TOPIC_MAX bytes, NUL-terminated). On
 * ws's loop only. Returns 0, -EALREADY when it already is, -EINVAL (NULL,
 * empty, or a client's connection: topics are a server's), -ENAMETOOLONG, -ENOSPC (max_subscriptions reached), -EPIPE (ws
 * is closing), -ENOMEM, or the route's on_subscribe refusal (-EACCES,
 * say: then nothing is subscribed). */
TERN_MUST_CHECK
int tern_ws_subscribe(tern_ws *ws, const char *topic);

/* Where a subscription starts, from tern_ws_subscribe_from. */
typedef struct tern_resume {
    uint64_t epoch;      /* the topic's epoch (never 0) */
    /* The seq of its last message so far (0: none yet); after a resume
     * ahead of this node (the client had later messages from another
     * node, which this one has not heard yet), the client's `after`: its
     * stream goes on after it, and nothing up to it is sent again when
     * this node hears it. */
    uint64_t seq;
    uint64_t replayed;   /* messages sent to ws from the history at once */
    /* true: every message after the one asked for was sent (or there was
     * none), so nothing is missed. false: the epoch differs or the history
     * no longer reaches back (or the topic has none); what was sent is
     * the latest message of each key. */
    bool resumed;
} tern_resume;

/* tern_ws_subscribe, resuming after message `after` of epoch `epoch` (as
 * a client last saw them): the messages it missed, from the topic's
 * history, are sent to ws now (references to the frames; the subscriber's
 * backlog limit does not drop them), and the live stream follows with no
 * gap and no duplicate, whatever thread publishes. epoch 0 asks for no
 * resume (and gets none: nothing is sent). out (may be NULL) says where
 * the subscription starts. Returns as tern_ws_subscribe. */
TERN_MUST_CHECK
int tern_ws_subscribe_from(tern_ws *ws, const char *topic, uint64_t epoch, uint64_t after,
                           tern_resume *out);
/* tern_ws_subscribe, starting with a snapshot: the latest message of each
 * key still in the topic's history (none when it has no history), oldest
 * first, sent to ws now as after a resume's gap; then the live stream,
 * with no gap and no duplicate. out (may be NULL): resumed false, replayed
 * the messages sent. Returns as tern_ws_subscribe. */
TERN_MUST_CHECK
int tern_ws_subscribe_latest(tern_ws *ws, const char *topic, tern_resume *out);
/* Returns 0, or -ENOENT when ws was not subscribed, -EINVAL. */
int tern_ws_unsubscribe(tern_ws *ws, const char *topic);
bool tern_ws_subscribed(const tern_ws *ws, const char *topic);

/* ---- subscribers that are not WebSockets: sinks ------------------------
 *
 * A sink is a stream the application writes to on srv's loop (an HTTP
 * streamed response carrying Server-Sent Events, say) that subscribes to
 * topics as a WebSocket does: the same seq order, history, resume and
 * snapshot, and the same slow-consumer treatment, its buffered bytes
 * standing for a connection's backlog (max_backlog, drop, close,
 * conflation, a queue of shared references sent as it drains, replay
 * pacing). The application gives its operations; a delivery calls send
 * with a view of the message's payload, allocating nothing. No route hook
 * is asked (on_subscribe is a WebSocket route's): the application decides
 * before it subscribes a sink.
 *
 *   static int sse_send(void *u, const char *topic, size_t tlen, int opcode,
 *                       const void *data, size_t len) {
 *       ...format an event around data, then:
 *       return tern_http_write(req_of(u), event, n);
 *   }
 *
 * None of the operations runs inside a call the application made (a
 * publish, tern_sink_subscribe_*, tern_sink_drained): what a publish
 * offers the sink, a subscribe's replay and a drain's queue wait in the
 * sink's queue, and go from its own 0 ms timer at the loop's next
 * iteration; the close policy is told from there too. send and buffered
 * may not call pub/sub for the sink they are given, nor free it (they run
 * inside the flush of its queue); close may. */
typedef struct tern_sink tern_sink;
typedef struct tern_sink_ops {
    /* One message of topic[0..tlen) for the sink: its payload as
     * published (the seq spliced in), and its opcode (TERN_WS_TEXT or
     * TERN_WS_BINARY). Returns a tern_send_result (TERN_SEND_DROPPED:
     * counted as dropped) or a negative errno. */
    int (*send)(void *user, const char *topic, size_t tlen, int opcode, const void *data,
                size_t len);
    /* Bytes written to the stream that its peer has not taken yet
     * (tern_http_buffered): above 0, what comes waits in pub/sub's queue. */
    size_t (*buffered)(void *user);
    /* The close policy (TERN_PUBSUB_CLOSE) acted: end the stream (and
     * free the sink, if the application likes: this runs from the sink's
     * timer). code is the topic's close code (1008 or 1013). Called at
     * most once; nothing is sent to the sink after it. */
    void (*close)(void *user, int code);
    /* Set when send only writes to the stream (it calls nothing of
     * pub/sub): a live message that pub/sub delivers in a loop turn of
     * its own (a publish from another thread, a batch pass) then goes to
     * it at once, as to a WebSocket, rather than through the sink's queue
     * and 0 ms timer (an entry and a timer turn less per message). Never
     * inside a call the application made: a publish on the sink's own
     * thread, replays, drains and the close policy still go from the
     * timer. */
    bool send_at_once;
} tern_sink_ops;

/* A sink on srv (a loop's server, not a host handle), subscribed to
 * nothing yet. ops is copied; user is handed to each operation. On srv's
 * loop. Returns 0, -EINVAL (a NULL argument or operation, a host
 * handle), -ENOMEM. */
TERN_MUST_CHECK
int tern_sink_new(tern_server *srv, const tern_sink_ops *ops, void *user, tern_sink **out);
/* Ends the sink's subscriptions and frees it (NULL: nothing). On its
 * loop, never from inside its operations; before its server is freed. */
void tern_sink_free(tern_sink *sink);
/* As tern_ws_subscribe_from and tern_ws_subscribe_latest, for a sink:
 * the messages owed (out->replayed) wait in its queue and go through its
 * send at the loop's next iteration (or paced, or as it drains), never
 * inside this call, before any live message of the topic. Returns as
 * those, and -EPIPE once its close was called. */
TERN_MUST_CHECK
int tern_sink_subscribe_from(tern_sink *sink, const char *topic, uint64_t epoch, uint64_t after,
                             tern_resume *out);
TERN_MUST_CHECK
int tern_sink_subscribe_latest(tern_sink *sink, const char *topic, tern_resume *out);
/* Returns 0, or -ENOENT when sink was not subscribed, -EINVAL. */
int tern_sink_unsubscribe(tern_sink *sink, const char *topic);
/* The sink's stream has sent everything it buffered (call it from
 * tern_http_on_drain's callback): what waits in its queues goes at the
 * loop's next iteration, not inside this call. */
void tern_sink_drained(tern_sink *sink);

/* Publishes to every subscriber of topic on every loop of srv's group.
 * Any thread: on srv's loop thread the subscribers of this loop get the
 * message now (into their output; nothing is called back), the other
 * loops at their next iteration; from any other thread, every loop at its
 * next iteration. data is copied. Returns the message's seq (>= 1), 0 when
 * the topic has no subscriber anywhere (nothing is sent) or when the
 * bridge's engine numbers it (a topic with a history, bridged through
 * Redis: see above), or a negative
 * error: -EINVAL (NULL srv or topic, a bad opcode, NULL data with len),
 * -ENAMETOOLONG, -ENOMEM.
 * Outside tern_loop_run (on_close called by tern_server_free, say) even
 * srv's own loop gets the message at its next iteration. A message on its
 * way to a loop whose server is freed before it arrives is dropped there
 * (its subscribers are gone), and one still queued when that loop is freed
 * is freed with it: publishing from on_close during teardown is safe in
 * either order of tern_server_free and running or freeing the loop. */
int64_t tern_publish(tern_server *srv, const char *topic, const void *data, size_t len,
                     int opcode);
/* The same, to every subscriber but except (the sender, typically; it
 * matters only on except's own loop). */
int64_t tern_publish_except(tern_server *srv, const char *topic, const void *data, size_t len,
                            int opcode, const tern_ws *except);
/* The general form: when seq_at <= len, the message's seq in decimal is
 * inserted at byte seq_at of data (so a text protocol can carry it, as
 * {"seq":N,...}); seq_at == SIZE_MAX inserts nothing. */
int64_t tern_publish_ex(tern_server *srv, const char *topic, const void *data, size_t len,
                        int opcode, const tern_ws *except, size_t seq_at);

/* tern_publish_ex with a key (NUL-terminated, up to TERN_KEY_MAX bytes;
 * NULL for none): the unit of conflation for the topics whose policy is
 * TERN_PUBSUB_CONFLATE (an instrument, say); other policies ignore it.
 * Returns as tern_publish_ex, and -EINVAL for a key too long or empty. */
int64_t tern_publish_key(tern_server *srv, const char *topic, const char *key, const void *data,
                         size_t len, int opcode, size_t seq_at);
/* tern_publish_key, but the subscribers of the caller's loop too get the
 * message at that loop's next iteration instead of inside the call: the
 * call costs the numbering, the framing and a post, not a send to each
 * subscriber, so that what the caller writes now (the answer to an HTTP
 * publish request, say) leaves before the fan-out. Order per topic is
 * kept with the other publish calls. Any thread; returns as
 * tern_publish_key.
 * A message posted to a loop (this one, or from another thread) joins its
 * topic's batch there: a pass over the topic's subscribers sends each of
 * them every message of the batch in one write, 64 subscribers per loop
 * iteration, the loop polling between them; what arrives during a pass
 * goes to everyone in the next. Under load a subscriber so gets several
 * messages per write (one WebSocket frame each), with no added delay when
 * the fan-out keeps up. */
int64_t tern_publish_later(tern_server *srv, const char *topic, const char *key,
                           const void *data, size_t len, int opcode, size_t seq_at);
/* A publish made on behalf of ws (a client asked for it): its route's
 * on_publish is asked first (once, never per delivered message); allowed,
 * it is tern_publish_key on tern_ws_server(ws) (ws gets the message too
 * when it is subscribed). On ws's loop only. Returns as tern_publish_key;
 * -EINVAL too for a NULL ws or a client's connection; or the hook's
 * refusal (-EACCES, say: then nothing is published or numbered). */
int64_t tern_ws_publish(tern_ws *ws, const char *topic, const char *key, const void *data,
                        size_t len, int opcode, size_t seq_at);
/* Updates of topic replaced in ws's queue by newer ones with their key. */
uint64_t tern_ws_topic_conflated(const tern_ws *ws, const char *topic);

/* Subscribers of topic on srv's loop (call it there). */
size_t tern_topic_subscribers(tern_server *srv, const char *topic);
/* Subscribers of topic on all the loops of srv's group, any thread: a
 * snapshot (it counts subscribe and unsubscribe calls as they happen on
 * each loop). */
size_t tern_topic_subscribers_all(tern_server *srv, const char *topic);
/* ---- for operators: the topics and their histories, from any thread --- */

/* A topic of srv's group, as tern_topic_list gives it. */
typedef struct tern_topic_info {
    char name[TERN_TOPIC_MAX + 1];   /* NUL-terminated */
    size_t len;
    size_t subscribers;   /* on all the loops of the group (as tern_topic_subscribers_all) */
    uint64_t epoch;       /* never 0 */
    uint64_t seq;         /* its last message's (0: none yet) */
    bool history;         /* its settings give it a history */
} tern_topic_info;

/* The topics of srv's group (those with a subscriber or a history)
 * whose names start with prefix ("" or NULL: every topic) and sort after
 * `after` in byte order ("" or NULL: from the first), at most max of them
 * into out, in that order; *more (may be NULL) says whether others
 * follow the last one given, which is the next call's `after`. Any
 * thread; it holds the group's lock while it sorts the matching names
 * (O(n log n) in the topics): for operators, not for a hot path.
 * Returns how many, or -EINVAL (NULL srv, NULL out with max, a host
 * handle), -ENAMETOOLONG (prefix or after over TERN_TOPIC_MAX), -ENOMEM. */
long tern_topic_list(tern_server *srv, const char *prefix, const char *after,
                     tern_topic_info *out, size_t max, bool *more);

/* One message of a topic's history, as tern_topic_history gives it: its
 * seq and payload (as published, with the seq inserted when seq_at asked
 * for it), valid during the callback only. */
typedef struct tern_history_msg {
    uint64_t seq;
    int opcode;          /* TERN_WS_TEXT or TERN_WS_BINARY */
    const void *data;
    size_t len;
} tern_history_msg;
typedef void (*tern_history_fn)(const tern_history_msg *msg, void *user);

/* Where a topic's history stands, from tern_topic_history. */
typedef struct tern_history_info {
    uint64_t epoch;   /* the topic's epoch: a seq means something only under it */
    uint64_t first;   /* the oldest message kept (0: none) */
    uint64_t last;    /* the topic's last message (0: none yet) */
} tern_history_info;

/* Reads a page of topic's history: at most limit messages (at most
 * TERN_HISTORY_MAX), oldest first from the first whose seq is at least
 * from, or (newest_first) newest first from the last whose seq is at
 * most from (0: the newest); fn is called for each, in that order, on
 * the caller's thread after the group's lock is released. info (may be
 * NULL) says the epoch and the range kept. Messages past the history's
 * age limit are forgotten first. Any thread. Returns how many messages
 * fn was given (0 for a topic without a history), or -ENOENT (no such
 * topic: neither a subscriber nor a history; info is zeroed), -EINVAL
 * (NULL srv, topic or fn, a host handle, an empty topic), -ENAMETOOLONG,
 * -ENOMEM. */
long tern_topic_history(tern_server *srv, const char *topic, uint64_t from, size_t limit,
                        bool newest_first, tern_history_fn fn, void *user,
                        tern_history_info *info);

/* Messages of topic not sent to ws (slow-consumer drops), while it is
 * subscribed; and the sum for topic on srv's loop (kept while the topic
 * has subscribers there). */
uint64_t tern_ws_topic_dropped(const tern_ws *ws, const char *topic);
uint64_t tern_topic_dropped(tern_server *srv, const char *topic);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
