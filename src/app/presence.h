/* tern serve's presence store: who is subscribed to the topics whose rule
 * says presence=on (topic_rules.h), for every loop of the process.
 *
 * One entry per subscription of a /pubsub connection to such a topic: the
 * connection's client id, its user (the token's sub; "" when anonymous)
 * and its info (the token's "info" claim as JSON text, or none). A user
 * with two connections is two clients and one user. Other nodes'
 * subscribers are in it too, each entry with the node it came from
 * (presence_nodes.h keeps them), so that lists and counts are the
 * cluster's.
 *
 * Cost: a join or a leave is O(1) in the topic's size (the topic and the
 * user are found by hash, the entry is unlinked from a doubly linked list
 * through the pointer the connection keeps; counts are kept as entries
 * come and go; the hash tables double when full, amortized O(1)). Only a
 * list is O(n), for the one who asks, and bounded by its limit.
 *
 * Threads: every call takes the store's one mutex, so any loop may call
 * any function; an entry is its connection's (its loop's) to leave. */
#ifndef TERN_APP_PRESENCE_H
#define TERN_APP_PRESENCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tern/loop.h"   /* TERN_MUST_CHECK */

/* Entries a presence list gives at most (a request may ask for fewer). */
#define APP_PRESENCE_LIST_MAX 1000
#define APP_PRESENCE_LIST_TEXT "1000"

/* One connection's subscription to one topic, in the store. */
typedef struct app_presence app_presence;

/* A topic's counts: its clients (entries) and distinct users. */
typedef struct app_presence_stats {
    size_t clients, users;
} app_presence_stats;

/* Adds client (user: NUL-terminated, "" for anonymous, copied once per
 * user and topic; info: JSON text or NULL, borrowed: it must stay until
 * the entry leaves) to topic[0..tlen). 0 and *out, or -ENOMEM. */
TERN_MUST_CHECK
int app_presence_join(const char *topic, size_t tlen, uint64_t client, const char *user,
                      const char *info, app_presence **out);
/* The same for another node's entry: node is what presence_nodes.c
 * keeps of that node (never NULL), so that app_presence_each_local skips
 * it. */
TERN_MUST_CHECK
int app_presence_join_node(const char *topic, size_t tlen, uint64_t client, const char *user,
                           const char *info, const void *node, app_presence **out);
/* The entry's user (NUL-terminated), valid until the entry leaves. */
const char *app_presence_user(const app_presence *p);
/* Calls visit for each of this node's entries (node NULL), under the
 * store's mutex: visit may not call the store. O(entries): for the
 * periodic announcement to the other nodes, never per join. */
typedef void app_presence_visit(void *arg, const char *topic, size_t tlen, uint64_t client,
                                const char *user, const char *info);
void app_presence_each_local(app_presence_visit *visit, void *arg);
/* Removes the entry (freed): its topic goes once it has none. */
void app_presence_leave(app_presence *p);
/* The topic's counts (zeros when nobody is there). */
void app_presence_stats_get(const char *topic, size_t tlen, app_presence_stats *out);
/* The topic's first `limit` clients in the order they joined, as JSON
 * objects {"client":"ID","user":"U"[,"info":I]} separated by commas,
 * into a buffer of the caller's (freed with free()): NULL when out of
 * memory. *len its length; *stats the counts at the same moment. */
char *app_presence_list(const char *topic, size_t tlen, size_t limit, size_t *len,
                        app_presence_stats *stats);
/* A client id as JSON's string content: 16 hex digits into out (17 bytes). */
void app_presence_client_text(uint64_t client, char out[17]);

#endif
