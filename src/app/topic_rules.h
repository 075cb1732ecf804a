/* tern serve's topic rules (--topic): one place per topic pattern for who
 * may subscribe and publish there and which pub/sub settings (slow-consumer
 * policy, history, backlog) its topics get.
 *
 * A pattern is a topic's exact name, or a prefix ending in '*' ("orders.*";
 * "*" alone: every topic), as in a token's rights. Each setting of a topic
 * comes from the most specific of its rules that gives it (its exact
 * pattern's, then the longer prefixes before the shorter): so
 * `--topic '* subscribe=anyone'` and `--topic 'orders.* policy=close'`
 * make orders.eu open to anyone and closed when slow. What no rule gives
 * is the default: subscribe=token publish=token (closed: only a token's
 * rights open a topic) and the server's --pubsub-* settings.
 * Rules are made and resolved in setup and only read while serving. */
#ifndef TERN_APP_TOPIC_RULES_H
#define TERN_APP_TOPIC_RULES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tern/tern.h"

/* Who may do a thing on a topic. */
typedef enum app_access {
    APP_ACCESS_TOKEN = 0,   /* a connection whose token's rights cover the topic */
    APP_ACCESS_ANYONE,      /* every connection, anonymous ones too */
    APP_ACCESS_NONE,        /* no connection (the admin listener's API still may publish) */
    APP_ACCESS_USER,        /* a connection whose token's sub a user topic names (below) */
} app_access;

/* A user topic: its name ends with '#' and the users who may use it,
 * separated by commas ("chat:#alice", "dm:#alice,bob"), as Centrifugo's
 * '#' channels. Under a rule whose subscribe (or publish) is "user", only
 * a connection whose token's sub is one of them may, with no right in the
 * token for the topic: one token per user, not per topic. A topic there
 * without a '#' is open to no one; a connection without a token (or a
 * sub) to none of them. The users are what follows the last '#'. */
bool app_rules_user_named(const char *topic, size_t len, const char *sub);

/* Invariants: pattern is len bytes (no '*'), 0 < len or prefix; a
 * field is meaningful only when its has_ flag is set (access fields
 * without one are APP_ACCESS_TOKEN). After app_rules_resolve, a rule
 * holds what it inherits too. */
/* How much of a topic's presence subscribers may ask for. The store
 * keeps the subscribers of any topic whose level is not OFF; the level
 * decides what a subscriber's question gets: STATS the counts only
 * (presence_stats), ON the list too (presence), with each member's user
 * and the info its token carries. The operator's admin listener sees the
 * list at either level. */
enum app_presence_level { APP_PRESENCE_OFF = 0, APP_PRESENCE_STATS, APP_PRESENCE_ON };

typedef struct app_topic_rule {
    char pattern[TERN_TOPIC_MAX + 1];
    size_t len;
    bool prefix;                          /* given with a trailing '*' */
    app_access subscribe, publish;
    bool has_subscribe, has_publish, has_policy, has_history, has_history_age, has_backlog;
    bool has_presence, has_join_leave, has_throttle;
    uint8_t presence;                     /* enum app_presence_level, above */
    bool join_leave;                      /* joins and leaves are pushed to subscribers */
    int policy;                           /* enum tern_pubsub_policy */
    uint16_t close_code;                  /* with policy close-1013 */
    uint32_t history;                     /* messages, 1..TERN_HISTORY_MAX */
    uint32_t history_ms;
    uint32_t throttle_ms;                 /* tern_topic_options.throttle_ms, 1..1000 */
    size_t max_backlog;
} app_topic_rule;

/* Rules a server holds: the library's less the one the join/leave topics
 * take (serve.c). */
#define APP_TOPIC_RULES_MAX (TERN_TOPIC_RULES_MAX - 1)

typedef struct app_topic_rules {
    int n;
    app_topic_rule r[APP_TOPIC_RULES_MAX];
} app_topic_rules;

/* "PATTERN [KEY=VALUE]...", KEY one of subscribe, publish (anyone, token,
 * none, user), policy (drop, close, close-1013, conflate), history (messages),
 * history-age (seconds), max-backlog (bytes), presence (on, stats, off;
 * off by default) and join-leave (on, off; off by default). A pattern met before is
 * the same rule: the new keys change it. Returns 0, or -1 and *why. */
TERN_MUST_CHECK
int app_rules_add(app_topic_rules *t, const char *spec, const char **why);

/* Fills each rule's unset fields from the most specific rule that covers
 * its pattern (a shorter prefix of it) and sets them: after it, a topic's
 * settings are all in the one rule app_rules_match gives. Once, after
 * the last app_rules_add. */
void app_rules_resolve(app_topic_rules *t);

/* The topic's most specific rule (its exact pattern's, else the longest
 * prefix's), or NULL: the defaults. */
const app_topic_rule *app_rules_match(const app_topic_rules *t, const char *topic,
                                          size_t len);

/* --pubsub-policy's and a rule's policy names: true and the values, or
 * false for an unknown name. */
bool app_policy_parse(const char *s, int *policy, uint16_t *close_code);

#endif
