/* Delivery on one loop: a message offered to each subscriber of its
 * topic (sent, queued, conflated, dropped or closed by the topic's
 * policy), the counters of a pass, and the deliveries posted to the loop
 * (into the topic's batch, or at once). */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "loop/log.h"
#include "pubsub/pubsub.h"

void tern__ps_pub_unref(tern__ps_pub *p) {
    if (atomic_fetch_sub(&p->refs, 1) == 1) {
        tern_ws_prepared_free(p->msg);
        tern__ps_order_unref(p->ord);
        free(p);
    }
}

static const char *policy_name(int policy) {
    switch (policy) {
    case TERN_PUBSUB_CLOSE: return "close";
    case TERN_PUBSUB_CONFLATE: return "conflate";
    default: return "drop";
    }
}

/* The info line of a slow subscriber the topic's policy acted on: a
 * message dropped for it, or its connection closed (logging.md: "slow
 * consumers dropped or closed"). Rate-limited as every kind is: a
 * subscriber that misses every message does not flood the log. */
static void log_slow(const tern__ps_sub *s, size_t behind, bool closed) {
    if (!tern__log_on(TERN_LOG_INFO))
        return;
    const tern_topic_options *o = &s->t->o;
    char peer[TERN_ADDRSTRLEN] = "-";
    struct sockaddr_storage ss;
    socklen_t sl;
    if (s->ws && tern_ws_peer(s->ws, &ss, &sl) == 0 &&
        tern_addr_format((struct sockaddr *)&ss, sl, peer, sizeof(peer)) < 0)
        strcpy(peer, "-");
    int tl = s->t->len > 128 ? 128 : (int)s->t->len;
    if (closed)
        tern__log(TERN_LOG_INFO, TERN__LOG_PUBSUB_SLOW,
                  "pubsub: slow consumer %s on topic %.*s, %zu bytes behind: policy %s, closed "
                  "with %d", peer, tl, s->t->name, behind, policy_name(o->policy),
                  o->close_code ? o->close_code : TERN_WS_POLICY);
    else
        tern__log(TERN_LOG_INFO, TERN__LOG_PUBSUB_SLOW,
                  "pubsub: slow consumer %s on topic %.*s, %zu bytes behind: policy %s, message "
                  "dropped", peer, tl, s->t->name, behind, policy_name(o->policy));
}

/* Offers msg (numbered seq, with its key) to s: sent (through the loop's
 * cork, so that what one subscriber is offered in a row leaves in one
 * write), queued behind what s waits for, or dropped or closed by the
 * topic's policy. */
void tern__ps_offer(tern__ps_sub *s, tern_ws_prepared *msg, uint64_t seq,
                    const tern_ws *except, const char *key, size_t klen, tern__ps_tally *n) {
    const tern_topic_options *o = &s->t->o;
    if ((s->ws == except && except) || seq <= s->skip_upto)
        return;
    size_t mlen = tern__ws_prepared_len(msg);
    size_t backlog = tern__ps_sub_buffered(s);
    int q;
    if (s->head || backlog > 0 || (s->sink && (!s->sink->ops.send_at_once || n->in_call))) {
        /* Behind: the message waits in s's queue, behind older ones, as a
         * reference; unless what waits would pass the limit. A sink's
         * too: its send is the user's callback, which must not run inside
         * the user's publish that offers it, nor, unless it only writes
         * (send_at_once), inside any delivery; its timer sends the queue
         * at the loop's next iteration. */
        if (s->sink)
            (void)tern__ps_sink_defer(s->sink);   /* out of memory: at its next drain */
        if (o->policy == TERN_PUBSUB_CONFLATE && key != NULL) {
            if ((q = tern__ps_conflate(s, msg, key, klen)) >= 0) {
                n->conflated += (uint64_t)q;
                n->qmax = s->nq > n->qmax ? s->nq : n->qmax;
                return;
            }
        } else if (backlog + s->qbytes - s->rbytes + mlen <= o->max_backlog) {
            if (tern__ps_queue_add(s, msg, key, klen) == 0) {
                n->qmax = s->nq > n->qmax ? s->nq : n->qmax;
                return;
            }
        } else if (o->policy == TERN_PUBSUB_CLOSE) {
            if (tern__ps_sub_open(s)) {
                log_slow(s, backlog + s->qbytes, true);
                tern__ps_sub_close(s, o->close_code);
                n->closed++;
            }
            return;
        }
        log_slow(s, backlog + s->qbytes, false);
        s->dropped++;
        n->dropped++;
        return;
    }
    /* It could never wait: the policy now. But not for a keyed message
     * under conflation, which the byte limit never drops while the
     * subscriber is behind (its keys bound that): dropped here, for a
     * subscriber with nothing waiting, that key's latest value would never
     * arrive. */
    if (mlen > o->max_backlog && !(o->policy == TERN_PUBSUB_CONFLATE && key != NULL)) {
        if (o->policy == TERN_PUBSUB_CLOSE) {
            if (tern__ps_sub_open(s)) {
                log_slow(s, backlog, true);
                tern__ps_sub_close(s, o->close_code);
                n->closed++;
            }
        } else {
            log_slow(s, backlog, false);
            s->dropped++;
            n->dropped++;
        }
        return;
    }
    if (tern__ps_sub_send(s, msg) == TERN_SEND_DROPPED) {
        s->dropped++;
        n->dropped++;
    } else {
        n->delivered++;
    }
}

void tern__ps_tally_add(tern__ps_registry *r, tern__ps_topic *t, const tern__ps_tally *n,
                        uint64_t messages) {
    t->dropped += n->dropped;
    t->conflated += n->conflated;
    PS_ADD(r, conflated, n->conflated);
    PS_ADD(r, messages, messages);
    PS_ADD(r, delivered, n->delivered);
    PS_ADD(r, dropped, n->dropped);
    PS_ADD(r, closed, n->closed);
    RS_ADD(r, t->rule, conflated, n->conflated);
    RS_ADD(r, t->rule, delivered, n->delivered);
    RS_ADD(r, t->rule, dropped, n->dropped);
    if (n->qmax > atomic_load_explicit(&r->stats.queue_max, memory_order_relaxed))
        atomic_store_explicit(&r->stats.queue_max, n->qmax, memory_order_relaxed);
}

/* Sends msg to the subscribers of the topic on srv's loop now, after the
 * topic's batch (so in seq order). */
void tern__ps_deliver(tern_server *srv, const char *name, size_t len, uint64_t seq,
                      tern_ws_prepared *msg, const tern_ws *except, const char *key,
                      size_t klen, uint64_t born_ns, bool in_call) {
    tern__ps_registry *r = tern__ps_reg(srv);
    tern__ps_topic *t = tern__ps_tfind(r, name, len, tern__ps_hash_name(name, len));
    if (t == NULL)
        return;
    tern__ps_latency_observe(r, born_ns);
    tern__ps_tally n = {.in_call = in_call};
    t->busy++;
    if (t->nds > 0)
        tern__ps_batch_finish(r, t);
    for (size_t i = 0; i < t->nsubs; i++)
        if (t->subs[i])
            tern__ps_offer(t->subs[i], msg, seq, except, key, klen, &n);
    tern__ps_tally_add(r, t, &n, 1);
    t->busy--;
    tern__ps_topic_maybe_free(r, t);
}

/* Releases what d holds, whether it was delivered or not (the loop was
 * freed first: then as its drop hook). */
void tern__ps_delivery_free(void *user) {
    tern__ps_delivery *d = user;
    if (d->p->ord && d->idx < d->p->ord->n)   /* counted by post_all */
        atomic_fetch_sub(&d->p->ord->inflight[d->idx], 1);
    tern__ps_pub_unref(d->p);
    tern__config_unref(d->cfg);
    free(d);
}

/* A message posted to this loop joins its topic's batch; the delivery
 * (and so the topic's count of posts in flight to this loop, which makes
 * a publish here post behind it) lives until the batch has sent it. */
void tern__ps_deliver_post(tern_loop *loop, void *user) {
    (void)loop;
    tern__ps_delivery *d = user;
    tern_server *srv = d->idx < d->cfg->npeers ? d->cfg->peers[d->idx] : NULL;
    tern__ps_registry *r = srv ? tern__ps_reg(srv) : NULL;
    tern__ps_pub *p = d->p;
    uint64_t h = tern__ps_hash_name(p->name, p->len);
    tern__ps_topic *t = r ? tern__ps_tfind(r, p->name, p->len, h) : NULL;
    if (t && tern__ps_batch_add(r, t, d) == 0)
        return;
    if (t)
        tern__ps_deliver(srv, p->name, p->len, p->seq, p->msg, (const tern_ws *)d->except,
                         p->key, p->klen, p->born_ns, false);
    tern__ps_delivery_free(d);
}

