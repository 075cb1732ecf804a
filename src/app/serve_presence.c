/* tern serve's presence and join/leave on /pubsub and /sse
 * (serve_presence.h). */
#include "app/serve_presence.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/json.h"
#include "app/presence.h"
#include "app/presence_nodes.h"
#include "net/crypto.h"

/* One topic a connection is in with presence or join/leave. Invariants:
 * entry is its presence entry (NULL when the rule said presence=off at
 * the subscribe); join_leave says a join was pushed, so a leave is due;
 * topic is len bytes, NUL-terminated. */
typedef struct pres_member {
    struct pres_member *next;
    app_presence *entry;
    bool join_leave;
    char *user;            /* what the join said, for the leave (a refresh may change the token) */
    char *info;            /* NULL: none */
    size_t len;
    char topic[];
} pres_member;

/* Invariants: client is unique in the process (and most likely among
 * nodes: see next_client); members, the connection's topics, is touched
 * by its loop only. */
struct app_pres_conn {
    uint64_t client;
    pres_member *members;
};

/* Client ids: a random start, then one more per connection, so that ids
 * never repeat in a process and two nodes' are unlikely to meet. */
static _Atomic uint64_t next_id;

static uint64_t next_client(void) {
    uint64_t expected = 0, start = 0;
    if (atomic_load_explicit(&next_id, memory_order_relaxed) == 0) {
        if (tern__crypto_random(&start, sizeof(start)) < 0 || start == 0)
            start = 1;
        atomic_compare_exchange_strong(&next_id, &expected, start);
    }
    return atomic_fetch_add_explicit(&next_id, 1, memory_order_relaxed);
}

/* Set while app_presence_subscribed subscribes a connection to a join/
 * leave topic: the route's hook lets that subscribe through. */
static _Thread_local bool subscribing;

bool app_presence_events_topic(const char *topic, size_t len) {
    return len > 0 && topic[0] == APP_PRESENCE_EVENTS_MARK;
}

bool app_presence_events_subscribing(void) {
    return subscribing;
}

/* The join/leave topic of topic[0..tlen) into out (TERN_TOPIC_MAX + 1
 * bytes); false when topic is too long to have one. */
static bool events_topic(const char *topic, size_t tlen, char *out) {
    if (tlen + 1 > TERN_TOPIC_MAX)
        return false;
    out[0] = APP_PRESENCE_EVENTS_MARK;
    memcpy(out + 1, topic, tlen);
    out[tlen + 1] = '\0';
    return true;
}

void app_presence_push(tern_server *srv, const char *what, uint64_t client, const char *topic,
                       size_t tlen, const char *user, const char *info) {
    char events[TERN_TOPIC_MAX + 1];
    if (!events_topic(topic, tlen, events))
        return;
    size_t ul = strlen(user), il = info ? strlen(info) : 0;
    size_t cap = 96 + APP_JSON_ESCAPE_MAX * (tlen + ul) + il;
    char *out = malloc(cap);
    if (out == NULL)
        return;   /* the subscribers miss this one, as a dropped message */
    char id[17];
    app_presence_client_text(client, id);
    size_t o = (size_t)snprintf(out, cap, "{\"topic\":\"");
    o += app_json_escape(out + o, cap - o, topic, tlen);
    o += (size_t)snprintf(out + o, cap - o, "\",\"%s\":{\"client\":\"%s\",\"user\":\"", what, id);
    o += app_json_escape(out + o, cap - o, user, ul);
    out[o++] = '"';
    if (info) {
        memcpy(out + o, ",\"info\":", 8);
        memcpy(out + o + 8, info, il);
        o += 8 + il;
    }
    out[o++] = '}';
    out[o++] = '}';
    /* The server's publish (no route hook): the client has no right to
     * this topic, the join or leave is the server's to say. */
    (void)tern_publish(srv, events, out, o, TERN_WS_TEXT);
    free(out);
}

/* A subscriber's join or leave pushed from its server. */
static void push(const app_pres_who *who, const char *what, uint64_t client,
                 const pres_member *m) {
    app_presence_push(who->srv, what, client, m->topic, m->len, m->user, m->info);
}

/* who subscribed to the join/leave topic events: a WebSocket through the
 * route's hook, which `subscribing` lets through; a sink (which asks no
 * hook) from now on, with nothing replayed (epoch 0). 0 (or -EALREADY),
 * or the error; 0 when who hears nothing. */
static int events_subscribe(const app_pres_who *who, const char *events) {
    int err = 0;
    if (who->ws) {
        subscribing = true;
        err = tern_ws_subscribe(who->ws, events);
        subscribing = false;
    } else if (who->sink) {
        err = tern_sink_subscribe_from(who->sink, events, 0, 0, NULL);
    }
    return err;
}

static void events_unsubscribe(const app_pres_who *who, const char *events) {
    if (who->ws)
        (void)tern_ws_unsubscribe(who->ws, events);
    else if (who->sink)
        (void)tern_sink_unsubscribe(who->sink, events);
}

/* The member's entry out of the store, the other nodes told. */
static void entry_leave(uint64_t client, pres_member *m) {
    if (m->entry == NULL)
        return;
    app_presence_leave(m->entry);
    m->entry = NULL;
    app_prnodes_changed(false, m->topic, m->len, client, m->user, m->info);
}

static void member_free(pres_member *m) {
    free(m->user);
    free(m->info);
    free(m);
}

int app_presence_subscribed(const app_pres_who *who, app_pres_conn **pc,
                            const app_token_conn *auth, const app_topic_rule *r,
                            const char *topic, size_t tlen) {
    char events[TERN_TOPIC_MAX + 1];
    bool presence = r && r->presence != APP_PRESENCE_OFF;
    bool join_leave = r && r->join_leave && events_topic(topic, tlen, events);
    if (!presence && !join_leave)
        return 0;
    if (*pc == NULL) {
        if ((*pc = calloc(1, sizeof(**pc))) == NULL)
            return -ENOMEM;
        (*pc)->client = next_client();
    }
    const char *user = app_token_conn_sub(auth), *info = app_token_conn_info(auth);
    pres_member *m = calloc(1, sizeof(*m) + tlen + 1);
    if (m == NULL || (m->user = strdup(user ? user : "")) == NULL ||
        (info && (m->info = strdup(info)) == NULL))
        goto nomem;
    m->len = tlen;
    memcpy(m->topic, topic, tlen);
    if (presence && app_presence_join(topic, tlen, (*pc)->client, m->user, m->info, &m->entry) < 0)
        goto nomem;
    if (presence)
        app_prnodes_changed(true, topic, tlen, (*pc)->client, m->user, m->info);
    if (join_leave) {
        /* Pushed before who is subscribed to the events, so that it does
         * not get its own join (a subscription skips what was numbered
         * before it). */
        push(who, "join", (*pc)->client, m);
        int err = events_subscribe(who, events);
        if (err < 0 && err != -EALREADY) {
            /* The join has gone out: its leave follows, so that the
             * others' view stays whole (a rare case: no room left). */
            push(who, "leave", (*pc)->client, m);
            entry_leave((*pc)->client, m);
            member_free(m);
            return err == -ENOSPC ? -ENOSPC : -ENOMEM;
        }
        m->join_leave = true;
    }
    m->next = (*pc)->members;
    (*pc)->members = m;
    return 0;
nomem:
    if (m)
        member_free(m);
    return -ENOMEM;
}

/* Out of presence and, when a join was pushed, out of the join/leave
 * topic (when the subscriber is still open) with its leave pushed. */
static void leave(const app_pres_who *who, uint64_t client, pres_member *m, bool open) {
    entry_leave(client, m);
    if (m->join_leave) {
        char events[TERN_TOPIC_MAX + 1];
        if (open && events_topic(m->topic, m->len, events))
            events_unsubscribe(who, events);
        push(who, "leave", client, m);
    }
    member_free(m);
}

void app_presence_unsubscribed(const app_pres_who *who, app_pres_conn *pc, const char *topic,
                               size_t tlen) {
    if (pc == NULL)
        return;
    for (pres_member **p = &pc->members; *p; p = &(*p)->next) {
        pres_member *m = *p;
        if (m->len == tlen && memcmp(m->topic, topic, tlen) == 0) {
            *p = m->next;
            leave(who, pc->client, m, true);
            return;
        }
    }
}

void app_presence_closed(const app_pres_who *who, app_pres_conn *pc) {
    if (pc == NULL)
        return;
    /* Its subscriptions have ended (or end) with the subscriber: only the
     * store and the leaves are left. */
    while (pc->members) {
        pres_member *m = pc->members;
        pc->members = m->next;
        leave(who, pc->client, m, false);
    }
    free(pc);
}

/* {"topic":T,"clients":C,"users":U[,"truncated":B,"presence":[L]]}, with
 * "ok" first when op is given: a buffer to free, or NULL (out of memory). */
static char *answer(const char *op, const char *topic, size_t tlen, bool stats, size_t limit,
                    size_t *len) {
    app_presence_stats st;
    size_t ll = 0;
    char *list = NULL;
    if (stats)
        app_presence_stats_get(topic, tlen, &st);
    else if ((list = app_presence_list(topic, tlen, limit, &ll, &st)) == NULL)
        return NULL;
    size_t cap = 160 + APP_JSON_ESCAPE_MAX * tlen + ll;
    char *out = malloc(cap);
    if (out == NULL) {
        free(list);
        return NULL;
    }
    size_t o = 0;
    if (op)
        o += (size_t)snprintf(out, cap, "{\"ok\":\"%s\",\"topic\":\"", op);
    else
        o += (size_t)snprintf(out, cap, "{\"topic\":\"");
    o += app_json_escape(out + o, cap - o, topic, tlen);
    o += (size_t)snprintf(out + o, cap - o, "\",\"clients\":%zu,\"users\":%zu", st.clients,
                          st.users);
    if (!stats) {
        o += (size_t)snprintf(out + o, cap - o, ",\"truncated\":%s,\"presence\":[",
                              st.clients > limit ? "true" : "false");
        memcpy(out + o, list, ll);
        o += ll;
        out[o++] = ']';
    }
    out[o++] = '}';
    free(list);
    *len = o;
    return out;
}

static void reply_error(tern_ws *ws, const char *why, bool stats) {
    char out[96];
    int n = snprintf(out, sizeof(out), "{\"error\":\"%s\",\"op\":\"%s\"}", why,
                     stats ? "presence_stats" : "presence");
    tern_ws_send(ws, out, (size_t)n, TERN_WS_TEXT);
}

void app_presence_reply(tern_ws *ws, bool stats, const app_topic_rule *r, bool may,
                        const char *topic, size_t tlen, size_t limit) {
    if (r == NULL || r->presence == APP_PRESENCE_OFF) {
        reply_error(ws, "presence off", stats);
        return;
    }
    if (!stats && r->presence == APP_PRESENCE_STATS) {
        reply_error(ws, "counts only", stats);   /* presence=stats: nobody is listed */
        return;
    }
    if (!may) {
        reply_error(ws, "forbidden", stats);
        return;
    }
    size_t len;
    char *out = answer(stats ? "presence_stats" : "presence", topic, tlen, stats,
                       limit ? limit : APP_PRESENCE_LIST_MAX, &len);
    if (out == NULL) {
        reply_error(ws, "out of memory", stats);
        return;
    }
    tern_ws_send(ws, out, len, TERN_WS_TEXT);
    free(out);
}

void app_presence_admin(tern_http_req *req, const app_topic_rules *rules, bool stats) {
    char topic[TERN_TOPIC_MAX + 1], lim[8];
    ssize_t tl = tern_http_query_param(req, "topic", topic, sizeof(topic));
    if (tl <= 0 || memchr(topic, '\0', (size_t)tl)) {
        tern_http_respond(req, 400, "text/plain", "bad topic\n", 10);
        return;
    }
    size_t limit = APP_PRESENCE_LIST_MAX;
    ssize_t ln = tern_http_query_param(req, "limit", lim, sizeof(lim));
    if (ln != -ENOENT) {
        char *end;
        unsigned long v = ln > 0 ? strtoul(lim, &end, 10) : 0;
        if (ln <= 0 || *end || lim[0] < '0' || lim[0] > '9' || v == 0 ||
            v > APP_PRESENCE_LIST_MAX) {
            static const char why[] = "bad limit (1 to " APP_PRESENCE_LIST_TEXT ")\n";
            tern_http_respond(req, 400, "text/plain", why, sizeof(why) - 1);
            return;
        }
        limit = v;
    }
    const app_topic_rule *r = app_rules_match(rules, topic, (size_t)tl);
    if (r == NULL || r->presence == APP_PRESENCE_OFF) {
        static const char why[] = "presence off: no --topic rule says presence=on or stats here\n";
        tern_http_respond(req, 404, "text/plain", why, sizeof(why) - 1);
        return;
    }
    size_t len;
    char *out = answer(NULL, topic, (size_t)tl, stats, limit, &len);
    if (out == NULL) {
        tern_http_respond(req, 500, "text/plain", "out of memory\n", 14);
        return;
    }
    tern_http_respond(req, 200, "application/json", out, len);
    free(out);
}
