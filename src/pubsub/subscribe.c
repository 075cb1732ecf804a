/* Subscribing and unsubscribing: tern_ws_subscribe*, with the route's
 * verdict asked first and the history replayed (paced) where a resume
 * asks for it; tern_ws_unsubscribe. What follows the checks is the same
 * for a sink (sink.c): tern__ps_subscribe, tern__ps_unsubscribe. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "pubsub/pubsub.h"

int tern_ws_subscribe(tern_ws *ws, const char *name) {
    return tern_ws_subscribe_from(ws, name, 0, 0, NULL);
}

/* The route's verdict (its on_subscribe or on_publish) on ws's subscribe
 * or publish to name[0..len): 0 to go on, or a negative errno. Asked once
 * per call, never per delivered message. */
int tern__ps_authorize(tern_ws *ws, bool publishing, const char *name, size_t len) {
    const tern_ws_handlers *h = &ws->ep->h;
    int (*fn)(tern_ws *, const char *, size_t, void *) = publishing ? h->on_publish
                                                                    : h->on_subscribe;
    if (fn == NULL)
        return 0;
    int rc = fn(ws, name, len, ws->ep->user);
    return rc == 0 ? 0 : rc < 0 ? rc : -EACCES;
}

/* tern_ws_subscribe_from and tern_ws_subscribe_latest: where the
 * subscription starts is rq's (its in fields). */
static int subscribe_req(tern_ws *ws, const char *name, tern__ps_resume rq, tern_resume *out);

int tern_ws_subscribe_from(tern_ws *ws, const char *name, uint64_t epoch, uint64_t after,
                           tern_resume *out) {
    return subscribe_req(ws, name, (tern__ps_resume){.epoch = epoch, .after = after}, out);
}

int tern_ws_subscribe_latest(tern_ws *ws, const char *name, tern_resume *out) {
    return subscribe_req(ws, name, (tern__ps_resume){.latest = true}, out);
}

static int subscribe_req(tern_ws *ws, const char *name, tern__ps_resume rq, tern_resume *out) {
    size_t len;
    int err;
    if (ws == NULL)
        return -EINVAL;
    if ((err = tern__ps_check_topic(name, &len)) < 0)
        return err;
    if (!tern__ps_ws_open(ws))
        return -EPIPE;
    tern_server *srv = tern_ws_server(ws);
    if (srv == NULL)
        return -EINVAL;   /* a client's connection */
    if ((err = tern__ps_authorize(ws, false, name, len)) < 0)
        return err;
    if (!tern__ps_ws_open(ws))
        return -EPIPE;   /* the hook closed it */
    return tern__ps_subscribe(tern__ps_registry_of(srv, true), ws, NULL, name, len, rq, out);
}

int tern__ps_subscribe(tern__ps_registry *r, tern_ws *ws, tern_sink *sink, const char *name,
                       size_t len, tern__ps_resume rq, tern_resume *out) {
    if (r == NULL)
        return -ENOMEM;
    uint64_t h = tern__ps_hash_name(name, len);
    tern__ps_conn_subs *c = ws ? tern__ps_cfind(r, ws) : tern__ps_cfind_sink(r, sink);
    tern__ps_topic *t = tern__ps_tfind(r, name, len, h);
    if (c && t)
        for (uint32_t i = 0; i < c->nsubs; i++)
            if (c->subs[i]->t == t)
                return -EALREADY;
    if (c && c->nsubs >= r->g->opt.max_subscriptions)
        return -ENOSPC;
    /* Everything that may fail first, then nothing that can. */
    if (tern__ps_table_grow(&r->topics) < 0 || tern__ps_table_grow(&r->conns) < 0)
        return -ENOMEM;
    bool new_c = c == NULL, new_t = t == NULL;
    if (new_c) {
        if ((c = calloc(1, sizeof(*c))) == NULL)
            return -ENOMEM;
        c->n.hash = ws ? tern__ps_hash_ptr(ws) : tern__ps_hash_ptr(sink);
        c->ws = ws;
        c->sink = sink;
    }
    if (new_t) {
        if ((t = calloc(1, sizeof(*t) + len + 1)) == NULL)
            goto fail;
        t->n.hash = h;
        t->len = len;
        memcpy(t->name, name, len);
        t->o = tern__ps_topic_settings(r->g, name, len);
        t->rule = tern__ps_rule_slot(r->g, name, len);
    }
    tern__ps_sub *s = calloc(1, sizeof(*s));
    if (s == NULL)
        goto fail;
    if (c->nsubs == c->cap) {
        uint32_t cap = c->cap ? c->cap * 2 : 2;
        tern__ps_sub **p = realloc(c->subs, sizeof(*p) * cap);
        if (p == NULL)
            goto fail_s;
        c->subs = p;
        c->cap = cap;
    }
    if (t->nsubs == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 4;
        tern__ps_sub **p = realloc(t->subs, sizeof(*p) * cap);
        if (p == NULL)
            goto fail_s;
        t->subs = p;
        t->cap = cap;
    }
    s->compressed = ws && tern_ws_compressed(ws);
    if (tern__ps_gcount(r->g, name, len, h, +1, s->compressed, &rq) < 0)
        goto fail_s;
    s->ws = ws;
    s->sink = sink;
    s->t = t;
    s->index = t->nsubs;
    s->skip_upto = rq.out.seq;   /* the topic's seq, or a client's ahead of it */
    t->subs[t->nsubs++] = s;
    c->subs[c->nsubs++] = s;
    PS_ADD(r, subscribed, 1);
    RS_ADD(r, t->rule, subscribed, 1);
    if (new_c)
        tern__ps_table_add(&r->conns, &c->n);
    if (new_t)
        tern__ps_table_add(&r->topics, &t->n);
    uint64_t delivered = 0, rate = r->g->opt.replay_rate;
    if (rate && rq.n > 0)
        tern__ps_refill(r);
    for (long i = 0; i < rq.n; i++) {
        tern_ws_prepared *m = rq.msgs[i];
        size_t mlen = tern__ws_prepared_len(m);
        if (rate && (s->paced || r->tokens < mlen))
            tern__ps_paced_add(r, s);
        /* A sink's send is the user's callback, never called inside the
         * user's call: its whole replay waits in the queue, for the
         * sink's timer (sink.c) or, when paced, the pacing's. */
        bool held = (s->paced || sink) && tern__ps_queue_add(s, m, NULL, 0) == 0;
        if (held) {
            s->tail->replay = true;
            s->rbytes += mlen;
        }
        if (!(held && s->paced))   /* goes out unpaced */
            r->tokens -= mlen < r->tokens ? mlen : r->tokens;
        if (!held && sink)
            s->dropped++;   /* out of memory */
        else if (!held)
            tern__ps_send_replayed(s, m, &delivered);
        tern_ws_prepared_free(m);
    }
    free(rq.msgs);
    PS_ADD(r, delivered, delivered);
    RS_ADD(r, t->rule, delivered, delivered);
    RS_ADD(r, t->rule, replayed, rq.n);
    if (rq.epoch != 0 && rq.out.resumed)
        RS_ADD(r, t->rule, resumed, 1);
    else if (rq.epoch != 0)
        RS_ADD(r, t->rule, resumed_gap, 1);
    if (out)
        *out = rq.out;
    return 0;
fail_s:
    free(s);
fail:
    if (new_t && t) {
        free(t->subs);
        free(t);
    }
    if (new_c) {
        free(c->subs);
        free(c);
    }
    return -ENOMEM;
}

int tern_ws_unsubscribe(tern_ws *ws, const char *name) {
    size_t len;
    int err;
    if (ws == NULL)
        return -EINVAL;
    if ((err = tern__ps_check_topic(name, &len)) < 0)
        return err == -ENAMETOOLONG ? -ENOENT : err;
    tern__ps_registry *r = tern__ps_registry_of(tern_ws_server(ws), false);
    return tern__ps_unsubscribe(r, tern__ps_cfind(r, ws), name, len);
}

int tern__ps_unsubscribe(tern__ps_registry *r, tern__ps_conn_subs *c, const char *name,
                         size_t len) {
    tern__ps_topic *t = tern__ps_tfind(r, name, len, tern__ps_hash_name(name, len));
    if (c == NULL || t == NULL)
        return -ENOENT;
    for (uint32_t i = 0; i < c->nsubs; i++)
        if (c->subs[i]->t == t) {
            tern__ps_sub *s = c->subs[i];
            c->subs[i] = c->subs[--c->nsubs];
            tern__ps_sub_remove(r, s);
            if (c->nsubs == 0)
                tern__ps_conn_subs_free(r, c);
            return 0;
        }
    return -ENOENT;
}

