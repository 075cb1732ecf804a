/* The registry of one loop: its topics and its connections'
 * subscriptions, looked up, compacted and freed; what ws and the server
 * tell pub/sub (a connection closed, the server freed); the accessors of
 * a loop's topics. Touched by the loop's thread only. */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "pubsub/pubsub.h"

/* srv is NULL for a client's connection (tern_ws_server): it has none. */
tern__ps_registry *tern__ps_registry_of(tern_server *srv, bool make) {
    if (srv == NULL)
        return NULL;
    tern__ps_registry *r = tern__ps_reg(srv);
    if (r || !make)
        return r;
    tern__ps_group *g = tern__ps_group_of(srv);
    if (g == NULL || (r = calloc(1, sizeof(*r))) == NULL)
        return NULL;
    r->g = g;
    r->srv = srv;
    atomic_store_explicit(&srv->slots[tern__ps_slot()], r, memory_order_release);
    return r;
}

tern__ps_topic *tern__ps_tfind(tern__ps_registry *r, const char *name, size_t len, uint64_t h) {
    if (r == NULL || r->topics.nb == 0)
        return NULL;
    for (tern__ps_node *n = *tern__ps_bucket(&r->topics, h); n; n = n->next) {
        tern__ps_topic *t = (tern__ps_topic *)n;
        if (n->hash == h && t->len == len && memcmp(t->name, name, len) == 0)
            return t;
    }
    return NULL;
}

tern__ps_conn_subs *tern__ps_cfind(tern__ps_registry *r, const tern_ws *ws) {
    if (r == NULL || r->conns.nb == 0)
        return NULL;
    uint64_t h = tern__ps_hash_ptr(ws);
    for (tern__ps_node *n = *tern__ps_bucket(&r->conns, h); n; n = n->next)
        if (((tern__ps_conn_subs *)n)->ws == ws)
            return (tern__ps_conn_subs *)n;
    return NULL;
}

tern__ps_conn_subs *tern__ps_cfind_sink(tern__ps_registry *r, const tern_sink *sink) {
    if (r == NULL || r->conns.nb == 0)
        return NULL;
    uint64_t h = tern__ps_hash_ptr(sink);
    for (tern__ps_node *n = *tern__ps_bucket(&r->conns, h); n; n = n->next)
        if (((tern__ps_conn_subs *)n)->sink == sink)
            return (tern__ps_conn_subs *)n;
    return NULL;
}

void tern__ps_topic_compact(tern__ps_topic *t) {
    size_t j = 0;
    for (size_t i = 0; i < t->nsubs; i++)
        if (t->subs[i]) {
            t->subs[j] = t->subs[i];
            t->subs[j]->index = j;
            j++;
        }
    t->nsubs = j;
    t->nholes = 0;
    t->holes = false;
}

void tern__ps_topic_maybe_free(tern__ps_registry *r, tern__ps_topic *t) {
    if (t->busy)
        return;
    if (t->holes)
        tern__ps_topic_compact(t);
    if (t->nsubs == 0) {
        tern__ps_table_del(&r->topics, &t->n);
        free(t->subs);
        free(t->ds);
        free(t);
    }
}

/* Takes s out of its topic (and the group), and frees it. */
void tern__ps_sub_remove(tern__ps_registry *r, tern__ps_sub *s) {
    tern__ps_paced_remove(r, s);
    tern__ps_queue_free(s);
    tern__ps_topic *t = s->t;
    if (t->busy) {
        t->subs[s->index] = NULL;
        t->holes = true;
        t->nholes++;
    } else {
        tern__ps_sub *last = t->subs[--t->nsubs];
        t->subs[s->index] = last;
        last->index = s->index;
    }
    tern__ps_gcount(r->g, t->name, t->len, t->n.hash, -1, s->compressed, NULL);
    PS_ADD(r, unsubscribed, 1);
    RS_ADD(r, t->rule, unsubscribed, 1);
    free(s);
    tern__ps_topic_maybe_free(r, t);
}

void tern__ps_conn_subs_free(tern__ps_registry *r, tern__ps_conn_subs *c) {
    tern__ps_table_del(&r->conns, &c->n);
    free(c->subs);
    free(c);
}

void tern__ps_conn_gone(tern__ps_registry *r, tern__ps_conn_subs *c) {
    if (c == NULL)
        return;
    for (uint32_t i = 0; i < c->nsubs; i++)
        tern__ps_sub_remove(r, c->subs[i]);
    tern__ps_conn_subs_free(r, c);
}

void tern__ps_ws_closed(tern_server *srv, tern_ws *ws) {
    tern__ps_registry *r = tern__ps_reg(srv);
    tern__ps_conn_gone(r, tern__ps_cfind(r, ws));
}

void tern__ps_registry_free(tern_server *srv) {
    tern__ps_registry *r = tern__ps_reg(srv);
    tern__ps_batches_drop(r);
    for (size_t i = 0; i < r->conns.nb; i++)
        for (tern__ps_node *n = r->conns.b[i], *next; n; n = next) {
            next = n->next;
            tern__ps_conn_gone(r, (tern__ps_conn_subs *)n);
        }
    tern__ps_bridge_server_free(r->g, srv);
    if (r->pace_timer)
        tern_timer_stop(r->pace_timer);
    free(r->topics.b);
    free(r->conns.b);
    free(r);
    atomic_store(&srv->slots[tern__ps_slot()], NULL);
    tern__ps_queue_spares_free();
}

int tern__ps_check_topic(const char *topic, size_t *len) {
    if (topic == NULL || topic[0] == '\0')
        return -EINVAL;
    *len = strnlen(topic, TERN_TOPIC_MAX + 1);
    return *len > TERN_TOPIC_MAX ? -ENAMETOOLONG : 0;
}

bool tern__ps_ws_open(const tern_ws *ws) {
    return ws->state == TERN__WS_OPEN && !(ws->conn.flags & TERN__CONN_CLOSED);
}

static tern__ps_sub *find_sub(const tern_ws *ws, const char *name) {
    size_t len;
    if (ws == NULL || tern__ps_check_topic(name, &len) < 0)
        return NULL;
    tern__ps_registry *r = tern__ps_registry_of(tern_ws_server(ws), false);
    tern__ps_conn_subs *c = tern__ps_cfind(r, ws);
    if (c == NULL)
        return NULL;
    for (uint32_t i = 0; i < c->nsubs; i++)
        if (c->subs[i]->t->len == len && memcmp(c->subs[i]->t->name, name, len) == 0)
            return c->subs[i];
    return NULL;
}

bool tern_ws_subscribed(const tern_ws *ws, const char *name) { return find_sub(ws, name) != NULL; }

uint64_t tern_ws_topic_dropped(const tern_ws *ws, const char *name) {
    tern__ps_sub *s = find_sub(ws, name);
    return s ? s->dropped : 0;
}

uint64_t tern_ws_topic_conflated(const tern_ws *ws, const char *name) {
    tern__ps_sub *s = find_sub(ws, name);
    return s ? s->conflated : 0;
}

static tern__ps_topic *local_topic(tern_server *srv, const char *name) {
    size_t len;
    if (srv == NULL || srv->loop == NULL || tern__ps_check_topic(name, &len) < 0)
        return NULL;
    return tern__ps_tfind(tern__ps_reg(srv), name, len, tern__ps_hash_name(name, len));
}

size_t tern_topic_subscribers(tern_server *srv, const char *name) {
    tern__ps_topic *t = local_topic(srv, name);
    return t ? t->nsubs - t->nholes : 0;
}

uint64_t tern_topic_dropped(tern_server *srv, const char *name) {
    tern__ps_topic *t = local_topic(srv, name);
    return t ? t->dropped : 0;
}

