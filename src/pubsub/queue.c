/* A subscriber's queue: what waits for a subscription that is behind
 * (references to shared frames), its key index under conflation, and the
 * sends after a drain. */
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "pubsub/pubsub.h"

/* ---- the key index of a conflating subscription ---- */

static tern__ps_queued *kindex_find(const tern__ps_sub *s, const char *key, size_t klen,
                                    uint64_t h) {
    for (tern__ps_queued *q = s->kb ? s->kb[h & (s->knb - 1)] : NULL; q; q = q->hnext)
        if (q->khash == h && q->klen == klen && memcmp(q->key, key, klen) == 0)
            return q;
    return NULL;
}

static void kindex_del(tern__ps_sub *s, tern__ps_queued *q) {
    for (tern__ps_queued **p = &s->kb[q->khash & (s->knb - 1)]; *p; p = &(*p)->hnext)
        if (*p == q) {
            *p = q->hnext;
            return;
        }
}

/* Indexes q (a keyed entry just queued); the index doubles when it would
 * be over half full. Returns -1 when out of memory (then q is not queued). */
static int kindex_add(tern__ps_sub *s, tern__ps_queued *q) {
    if (s->knb < 2 * (s->nkeys + 1)) {
        uint32_t nb = s->knb ? s->knb * 2 : 16;
        tern__ps_queued **b = calloc(nb, sizeof(*b));
        if (b == NULL)
            return -1;
        for (uint32_t i = 0; i < s->knb; i++)
            for (tern__ps_queued *e = s->kb[i], *next; e; e = next) {
                next = e->hnext;
                e->hnext = b[e->khash & (nb - 1)];
                b[e->khash & (nb - 1)] = e;
            }
        free(s->kb);
        s->kb = b;
        s->knb = nb;
    }
    q->hnext = s->kb[q->khash & (s->knb - 1)];
    s->kb[q->khash & (s->knb - 1)] = q;
    return 0;
}

/* ---- entries ---- */

/* Spare unkeyed entries, this thread's: most queued entries carry no key
 * and live one loop turn (every delivery to a sink waits in its queue for
 * the sink's turn; a WebSocket briefly behind), and a publish to a topic
 * of N sinks queues N of them at once, where malloc's own per-thread
 * cache keeps seven blocks of a size. At most SPARES_MAX are kept (64
 * bytes each). Thread-local, not the registry's, since entries are freed
 * where no registry is at hand, and after it too (a connection closing
 * at the shutdown publishes its presence leave): they go back to malloc
 * with the thread's registry, and at the thread's end (a key's
 * destructor, set once a thread keeps one) for those freed after it. */
#define SPARES_MAX 1024
static _Thread_local tern__ps_queued *spares;
static _Thread_local size_t nspares;
static _Thread_local bool spares_watched;   /* the key's destructor will run here */
static pthread_key_t spares_key;
static bool spares_key_ok;
static pthread_once_t spares_once = PTHREAD_ONCE_INIT;

static void spares_at_exit(void *unused) {
    (void)unused;
    spares_watched = false;
    tern__ps_queue_spares_free();
}

static void spares_key_make(void) { spares_key_ok = pthread_key_create(&spares_key, spares_at_exit) == 0; }

static tern__ps_queued *entry_new(size_t klen) {
    if (klen == 0 && spares) {
        tern__ps_queued *q = spares;
        spares = q->next;
        nspares--;
        return q;
    }
    return malloc(sizeof(tern__ps_queued) + klen);
}

void tern__ps_queued_free(tern__ps_queued *q) {
    if (q->klen == 0 && nspares < SPARES_MAX && !spares_watched) {
        pthread_once(&spares_once, spares_key_make);
        spares_watched = spares_key_ok && pthread_setspecific(spares_key, &spares) == 0;
    }
    if (q->klen == 0 && nspares < SPARES_MAX && spares_watched) {
        q->next = spares;
        spares = q;
        nspares++;
        return;
    }
    free(q);
}

void tern__ps_queue_spares_free(void) {
    while (spares) {
        tern__ps_queued *q = spares;
        spares = q->next;
        free(q);
    }
    nspares = 0;
}

/* ---- the queue ---- */

static void list_unlink(tern__ps_sub *s, tern__ps_queued *q) {
    *(q->prev ? &q->prev->next : &s->head) = q->next;
    *(q->next ? &q->next->prev : &s->tail) = q->prev;
}

static void list_push(tern__ps_sub *s, tern__ps_queued *q) {
    q->next = NULL;
    q->prev = s->tail;
    *(s->tail ? &s->tail->next : &s->head) = q;
    s->tail = q;
}

void tern__ps_queue_unlink(tern__ps_sub *s, tern__ps_queued *q) {
    list_unlink(s, q);
    if (q->klen && s->kb)
        kindex_del(s, q);
    s->nq--;
    s->nkeys -= q->klen > 0;
    s->qbytes -= tern__ws_prepared_len(q->msg);
    if (q->replay)
        s->rbytes -= tern__ws_prepared_len(q->msg);
}

static void queue_push(tern__ps_sub *s, tern__ps_queued *q) {
    list_push(s, q);
    s->nq++;
    s->nkeys += q->klen > 0;
    s->qbytes += tern__ws_prepared_len(q->msg);
}

void tern__ps_queue_free(tern__ps_sub *s) {
    for (tern__ps_queued *q = s->head, *next; q; q = next) {
        next = q->next;
        tern_ws_prepared_free(q->msg);
        tern__ps_queued_free(q);
    }
    s->head = s->tail = NULL;
    s->nq = s->nkeys = 0;
    s->qbytes = 0;
    s->rbytes = 0;
    free(s->kb);
    s->kb = NULL;
    s->knb = 0;
}

/* msg joins s's queue (a reference, with its key; indexed by it when s's
 * topic conflates). Returns 0, or -1 when out of memory. */
int tern__ps_queue_add(tern__ps_sub *s, tern_ws_prepared *msg, const char *key, size_t klen) {
    tern__ps_queued *q = entry_new(klen);
    if (q == NULL)
        return -1;
    q->klen = klen;
    q->replay = false;
    q->khash = klen ? tern__ps_hash_name(key, klen) : 0;
    if (klen)
        memcpy(q->key, key, klen);
    if (klen && s->t->o.policy == TERN_PUBSUB_CONFLATE && kindex_add(s, q) < 0) {
        tern__ps_queued_free(q);
        return -1;
    }
    q->msg = tern__ws_prepared_ref(msg);
    queue_push(s, q);
    return 0;
}

/* A subscriber of a conflating topic that is behind: msg replaces the
 * queued entry of the same key, which moves to the tail (its latest update
 * is now the newest). Returns 1 when it replaced one, 0 when it joined the
 * queue, -1 when it cannot wait that way (no key, TERN_CONFLATE_KEYS keys
 * already, out of memory). */
int tern__ps_conflate(tern__ps_sub *s, tern_ws_prepared *msg, const char *key, size_t klen) {
    if (key == NULL)
        return -1;
    tern__ps_queued *q = kindex_find(s, key, klen, tern__ps_hash_name(key, klen));
    if (q) {
        s->qbytes += tern__ws_prepared_len(msg) - tern__ws_prepared_len(q->msg);
        tern_ws_prepared_free(q->msg);
        q->msg = tern__ws_prepared_ref(msg);
        list_unlink(s, q);   /* its key's latest update is now the newest */
        list_push(s, q);
        s->conflated++;
        return 1;
    }
    if (s->nkeys >= TERN_CONFLATE_KEYS)
        return -1;
    return tern__ps_queue_add(s, msg, key, klen);
}

/* After a drain: sends what s's queue holds until the kernel refuses some
 * (the connection has a backlog again) or the queue is empty. The frames
 * go through the loop's cork, so several leave in one write, and only the
 * part of one write that the kernel refused is ever copied. */
static void queue_flush(tern__ps_sub *s, uint64_t *delivered, uint64_t *dropped) {
    while (s->head) {
        tern__ps_queued *q = s->head;
        if (tern__ps_sub_buffered(s) > 0)
            return;   /* the rest waits for the next drain */
        tern__ps_queue_unlink(s, q);
        int r = tern__ps_sub_send(s, q->msg);
        if (r < 0 || r == TERN_SEND_DROPPED) {
            s->dropped++;
            s->t->dropped++;
            (*dropped)++;
        } else {
            (*delivered)++;
        }
        tern_ws_prepared_free(q->msg);
        tern__ps_queued_free(q);
    }
}

/* What waits for c's subscriptions is sent, until the stream is behind
 * again (a WebSocket's or a sink's drain). */
void tern__ps_conn_drained(tern__ps_registry *r, tern__ps_conn_subs *c) {
    if (c == NULL)
        return;
    uint64_t delivered = 0, dropped = 0;
    for (uint32_t i = 0; i < c->nsubs; i++) {
        tern__ps_sub *s = c->subs[i];
        if (s->head && !s->paced) {   /* a paced one waits for its timer */
            uint64_t d = delivered, x = dropped;
            queue_flush(s, &delivered, &dropped);
            RS_ADD(r, s->t->rule, delivered, delivered - d);
            RS_ADD(r, s->t->rule, dropped, dropped - x);
        }
    }
    PS_ADD(r, delivered, delivered);
    PS_ADD(r, dropped, dropped);
}


void tern__ps_ws_drained(tern_server *srv, tern_ws *ws) {
    tern__ps_registry *r = tern__ps_reg(srv);
    tern__ps_conn_drained(r, tern__ps_cfind(r, ws));
}
