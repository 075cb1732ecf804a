/* Publishing: a message numbered, framed, recorded in the history and
 * posted to every loop of the group under the group's mutex; the public
 * tern_publish* calls. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pubsub/history.h"
#include "pubsub/pubsub.h"

/* Under the mutex: posts p to every loop of the group, in the order the
 * mutex gives (so in seq order). Returns true when srv's own loop (the
 * caller's) is to deliver it now, after the mutex: nothing of the topic is
 * on its way to it. */
static bool post_all(tern_server *srv, tern__ps_pub *p, bool here, const tern_ws *except) {
    tern__server_config *cfg = srv->cfg;
    int n = cfg->npeers ? cfg->npeers : 1;
    bool now = false;
    for (int i = 0; i < n; i++) {
        tern_server *peer = cfg->npeers ? cfg->peers[i] : srv;
        if (peer == NULL)
            continue;
        bool ordered = p->ord && i < p->ord->n;
        if (here && peer == srv && (!ordered || atomic_load(&p->ord->inflight[i]) == 0)) {
            now = true;
            continue;
        }
        tern__ps_delivery *d = malloc(sizeof(*d));
        if (d == NULL)
            continue;   /* that loop misses it: out of memory */
        *d = (tern__ps_delivery){.p = p, .cfg = cfg, .idx = i,
                        .except = peer == srv ? (uintptr_t)except : 0};
        atomic_fetch_add(&p->refs, 1);
        tern__config_ref(cfg);
        if (ordered)
            atomic_fetch_add(&p->ord->inflight[i], 1);
        if (tern__loop_post_owned(peer->loop, tern__ps_deliver_post, tern__ps_delivery_free,
                                  d) < 0) {
            if (ordered)
                atomic_fetch_sub(&p->ord->inflight[i], 1);
            atomic_fetch_sub(&p->refs, 1);
            tern__config_unref(cfg);
            free(d);
        }
    }
    return now;
}

/* The frame of a message numbered seq, with seq spliced in at seq_at
 * (SIZE_MAX: nowhere). NULL when out of memory. */
static tern_ws_prepared *prepare(const void *data, size_t len, int opcode, bool compress,
                                 uint64_t seq, size_t seq_at) {
    if (seq_at == SIZE_MAX)
        return tern_ws_prepare(data, len, opcode, compress);
    char num[24];
    int nl = snprintf(num, sizeof(num), "%" PRIu64, seq);
    char *buf = malloc(len + (size_t)nl);
    if (buf == NULL)
        return NULL;
    if (data == NULL)   /* no data (len 0): the message is the seq alone */
        data = "";
    memcpy(buf, data, seq_at);
    memcpy(buf + seq_at, num, (size_t)nl);
    memcpy(buf + seq_at + nl, (const char *)data + seq_at, len - seq_at);
    tern_ws_prepared *msg = tern_ws_prepare(buf, len + (size_t)nl, opcode, compress);
    free(buf);
    return msg;
}

/* Under the mutex: m, numbered seq by the engine and read back from it
 * (tern__ps_bridge_backfills), into gt's history alone: older than what
 * gt's subscribers have had, it is for resumes only. Failing (out of
 * memory), the history forgets what came before it, which a hole would
 * make useless. */
static void keep_read_back(tern__ps_group *g, tern__ps_gtopic *gt, const tern__ps_msg *m,
                           size_t klen, uint64_t seq) {
    tern_ws_prepared *msg = prepare(m->data, m->len, m->opcode,
                                    gt->compressed > 0 && m->len >= 64, seq, m->seq_at);
    if (msg == NULL ||
        tern__hist_insert(gt->hist, seq, tern__ps_mono_ms(), msg, m->key, klen) < 0)
        tern__hist_forget_before(gt->hist, seq + 1);
    tern__ps_hist_budget(g, gt);
    tern_ws_prepared_free(msg);
}

int64_t tern__ps_publish(tern_server *srv, const tern__ps_msg *m, const tern_ws *except,
                         int flags, const tern__engine_num *num) {
    const char *name = m->topic, *key = m->key;
    const void *data = m->data;
    size_t len = m->len, seq_at = m->seq_at, tlen, klen = 0;
    int opcode = m->opcode, err;
    if (srv == NULL || srv->loop == NULL || (data == NULL && len > 0) ||
        (opcode != TERN_WS_TEXT && opcode != TERN_WS_BINARY) ||
        (seq_at != SIZE_MAX && seq_at > len))
        return -EINVAL;
    if ((err = tern__ps_check_topic(name, &tlen)) < 0)
        return err;
    if (key && ((klen = strnlen(key, TERN_KEY_MAX + 1)) == 0 || klen > TERN_KEY_MAX))
        return -EINVAL;
    tern__ps_group *g = tern__ps_group_of(srv);
    if (g == NULL)
        return -ENOMEM;
    if (flags & TERN__PS_FORWARD) {   /* made here, not heard from another node */
        atomic_fetch_add_explicit(&g->published[tern__ps_rule_slot(g, name, tlen)], 1,
                                  memory_order_relaxed);
        if (tern__ps_bridge_forward(g, m, tlen, klen))
            return 0;   /* numbered by the engine: delivered when heard back */
    }
    uint64_t h = tern__ps_hash_name(name, tlen);
    /* later: this loop's subscribers too by a post, behind what the
     * caller writes now */
    /* With a write delay, a publish on this loop's thread joins its
     * topic's batch by a post too: delivering it now would end the batch
     * early (it must not pass it), defeating the delay. So does one on a
     * throttled topic (gt->throttled, under the mutex below). */
    bool here = !(flags & TERN__PS_LATER) && g->opt.write_delay_ms == 0 &&
                tern__loop_current() == srv->loop;
    tern__ps_pub *p = malloc(sizeof(*p) + tlen + 1 + klen);
    if (p == NULL)
        return -ENOMEM;
    atomic_init(&p->refs, 1);
    p->ord = NULL;
    p->msg = NULL;
    p->len = tlen;
    memcpy(p->name, name, tlen);
    p->name[tlen] = '\0';
    p->key = key ? memcpy(p->name + tlen + 1, key, klen) : NULL;
    p->klen = klen;
    p->born_ns = tern__ps_mono_ns();
    /* Numbered, framed, recorded and posted under the mutex: every loop
     * gets a topic's messages in seq order, the history stays in that
     * order, and a resume that reads it sees every seq it numbers. (The
     * price: publishers of one group on several threads take turns for
     * the framing, and the compression, of each other's messages.) */
    pthread_mutex_lock(&g->mu);
    tern__ps_gtopic *gt = tern__ps_gfind(g, name, tlen, h);
    if (gt == NULL && tern__ps_topic_settings(g, name, tlen).history > 0) {
        gt = tern__ps_gtopic_new(g, name, tlen, h);   /* numbered and kept with no one listening */
        if (gt && gt->hist == NULL && tern__ps_gtopic_maybe_free(g, gt, false))
            gt = NULL;   /* no room for another history: like any topic no one hears */
    }
    bool keep;
    if (gt && num && tern__ps_bridge_backfills(gt, num, &keep)) {
        if (keep)
            keep_read_back(g, gt, m, klen, num->seq);
        pthread_mutex_unlock(&g->mu);
        free(p);
        return 0;
    }
    uint64_t before = gt ? gt->seq : 0, fill_from = 0, fill_to = 0;
    if (gt && num && !tern__ps_bridge_numbered(gt, num, &fill_from, &fill_to))
        gt = NULL;
    if (gt == NULL) {
        pthread_mutex_unlock(&g->mu);
        free(p);
        if (fill_from)
            tern__ps_bridge_fill(g, name, tlen, fill_from, fill_to);
        return 0;
    }
    if (num == NULL)
        tern__ps_bridge_local(gt);
    p->seq = num ? num->seq : ++gt->seq;
    p->msg = prepare(data, len, opcode, gt->compressed > 0 && len >= 64, p->seq, seq_at);
    if (p->msg == NULL) {
        gt->seq = before;   /* not published: the number is free again */
        pthread_mutex_unlock(&g->mu);
        free(p);
        return -ENOMEM;
    }
    if (gt->hist) {
        uint64_t now = tern__ps_mono_ms();
        tern__hist_prune(gt->hist, now);
        tern__hist_add(gt->hist, p->seq, now, p->msg, key, klen);
        tern__ps_hist_budget(g, gt);
    }
    bool now = false;
    if (gt->subs > 0) {   /* else kept for later: no one to send it to now */
        if (gt->ord) {
            p->ord = gt->ord;
            atomic_fetch_add(&p->ord->refs, 1);
        }
        now = post_all(srv, p, here && !gt->throttled, except);
    }
    pthread_mutex_unlock(&g->mu);
    if (fill_from)   /* what the engine numbered before the one adopted */
        tern__ps_bridge_fill(g, name, tlen, fill_from, fill_to);
    int64_t seq = (int64_t)p->seq;
    if (now && tern__ps_reg(srv))
        tern__ps_deliver(srv, name, tlen, p->seq, p->msg, except, p->key, klen, p->born_ns, true);
    tern__ps_pub_unref(p);
    return seq;
}

int64_t tern_publish_ex(tern_server *srv, const char *topic, const void *data, size_t len,
                        int opcode, const tern_ws *except, size_t seq_at) {
    tern__ps_msg m = {.topic = topic, .data = data, .len = len, .seq_at = seq_at,
                      .opcode = opcode};
    return tern__ps_publish(srv, &m, except, TERN__PS_FORWARD, NULL);
}

int64_t tern_publish_key(tern_server *srv, const char *topic, const char *key, const void *data,
                         size_t len, int opcode, size_t seq_at) {
    tern__ps_msg m = {.topic = topic, .key = key, .data = data, .len = len, .seq_at = seq_at,
                      .opcode = opcode};
    return tern__ps_publish(srv, &m, NULL, TERN__PS_FORWARD, NULL);
}

int64_t tern_publish_later(tern_server *srv, const char *topic, const char *key,
                           const void *data, size_t len, int opcode, size_t seq_at) {
    tern__ps_msg m = {.topic = topic, .key = key, .data = data, .len = len, .seq_at = seq_at,
                      .opcode = opcode};
    return tern__ps_publish(srv, &m, NULL, TERN__PS_FORWARD | TERN__PS_LATER, NULL);
}

int64_t tern_ws_publish(tern_ws *ws, const char *topic, const char *key, const void *data,
                        size_t len, int opcode, size_t seq_at) {
    size_t tlen;
    int err;
    if (ws == NULL)
        return -EINVAL;
    tern_server *srv = tern_ws_server(ws);
    if (srv == NULL)
        return -EINVAL;   /* a client's connection */
    /* A bad topic is refused as tern_publish_key would, before the hook
     * sees it. */
    if ((err = tern__ps_check_topic(topic, &tlen)) < 0)
        return err;
    if ((err = tern__ps_authorize(ws, true, topic, tlen)) < 0)
        return err;
    return tern_publish_key(srv, topic, key, data, len, opcode, seq_at);
}

int64_t tern_publish(tern_server *srv, const char *topic, const void *data, size_t len,
                     int opcode) {
    return tern_publish_ex(srv, topic, data, len, opcode, NULL, SIZE_MAX);
}

int64_t tern_publish_except(tern_server *srv, const char *topic, const void *data, size_t len,
                            int opcode, const tern_ws *except) {
    return tern_publish_ex(srv, topic, data, len, opcode, except, SIZE_MAX);
}

