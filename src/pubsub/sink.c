/* Sinks: subscribers that are not WebSockets (tern_sink_new), an
 * application's stream behind tern_sink_ops. A sink is registered like a
 * connection (the registry's conns, keyed by its address) and its
 * subscriptions are ordinary ones with sink set instead of ws, so that
 * delivery, queues, pacing and policies treat it as they treat a
 * WebSocket (pubsub.h's subscriber seam). Its operations are the user's
 * callbacks: a subscribe's replay, a drain's queue, a publish's message
 * and the close policy go out from the sink's 0 ms timer, never inside a
 * call the user made (DESIGN.md's no re-entrancy); except a live message
 * for a sink whose send only writes (ops.send_at_once), which goes at
 * once in pub/sub's own pass, as a WebSocket's does (deliver.c). */
#include <errno.h>
#include <stdlib.h>

#include "pubsub/pubsub.h"

int tern_sink_new(tern_server *srv, const tern_sink_ops *ops, void *user, tern_sink **out) {
    if (srv == NULL || ops == NULL || out == NULL || ops->send == NULL || ops->buffered == NULL ||
        ops->close == NULL || srv->loop == NULL)
        return -EINVAL;
    tern_sink *k = calloc(1, sizeof(*k));
    if (k == NULL)
        return -ENOMEM;
    *k = (tern_sink){.ops = *ops, .user = user, .srv = srv};
    *out = k;
    return 0;
}

void tern_sink_free(tern_sink *sink) {
    if (sink == NULL)
        return;
    tern__ps_registry *r = tern__ps_registry_of(sink->srv, false);
    tern__ps_conn_gone(r, tern__ps_cfind_sink(r, sink));
    if (sink->due)
        tern_timer_stop(sink->due);
    free(sink);
}

/* The loop's next iteration after a subscribe, a drain, a publish or the
 * close policy: the close is told first (and nothing more is sent), else
 * what waits in the sink's queues goes, as far as its stream takes it (a
 * paced replay waits for the pacing's timer). k is not touched after a
 * callback, which may free it. */
static void sink_due(tern_timer *t, void *user) {
    (void)t;
    tern_sink *k = user;
    k->due_armed = false;
    if (k->closing) {
        if (!k->close_told) {
            k->close_told = true;
            k->ops.close(k->user, k->close_code);
        }
        return;
    }
    tern__ps_registry *r = tern__ps_registry_of(k->srv, false);
    tern__ps_conn_drained(r, tern__ps_cfind_sink(r, k));
}

int tern__ps_sink_defer(tern_sink *k) {
    if (k->due_armed)
        return 0;
    int err = k->due ? tern_timer_again(k->due, 0)
                     : tern_timer_start(tern_server_loop(k->srv), &k->due, 0, 0, sink_due, k);
    if (err == 0)
        k->due_armed = true;
    return err;
}

/* Where a sink's subscription starts is rq's (as subscribe.c's). */
static int sink_subscribe(tern_sink *sink, const char *name, tern__ps_resume rq,
                          tern_resume *out) {
    size_t len;
    int err;
    if (sink == NULL)
        return -EINVAL;
    if ((err = tern__ps_check_topic(name, &len)) < 0)
        return err;
    if (sink->closing)
        return -EPIPE;
    /* Armed first, so that a subscribe that replays cannot leave its
     * replay without a timer to send it. */
    if ((err = tern__ps_sink_defer(sink)) < 0)
        return err;
    return tern__ps_subscribe(tern__ps_registry_of(sink->srv, true), NULL, sink, name, len, rq,
                              out);
}

int tern_sink_subscribe_from(tern_sink *sink, const char *topic, uint64_t epoch, uint64_t after,
                             tern_resume *out) {
    return sink_subscribe(sink, topic, (tern__ps_resume){.epoch = epoch, .after = after}, out);
}

int tern_sink_subscribe_latest(tern_sink *sink, const char *topic, tern_resume *out) {
    return sink_subscribe(sink, topic, (tern__ps_resume){.latest = true}, out);
}

int tern_sink_unsubscribe(tern_sink *sink, const char *topic) {
    size_t len;
    int err;
    if (sink == NULL)
        return -EINVAL;
    if ((err = tern__ps_check_topic(topic, &len)) < 0)
        return err == -ENAMETOOLONG ? -ENOENT : err;
    tern__ps_registry *r = tern__ps_registry_of(sink->srv, false);
    return tern__ps_unsubscribe(r, tern__ps_cfind_sink(r, sink), topic, len);
}

void tern_sink_drained(tern_sink *sink) {
    if (sink == NULL)
        return;
    /* Out of memory: what waits goes at the sink's next drain or
     * subscribe instead. */
    (void)tern__ps_sink_defer(sink);
}

/* The message's payload is its plain frame past the header: a server's
 * frame is unmasked, its length field 1, 3 or 9 bytes (RFC 6455 5.2). */
int tern__ps_sink_send(tern_sink *k, const tern__ps_topic *t, tern_ws_prepared *msg) {
    if (k->closing)
        return TERN_SEND_DROPPED;
    const uint8_t *f = tern__ws_prepared_bytes(msg);
    size_t n = tern__ws_prepared_len(msg);
    uint8_t l7 = f[1] & 0x7F;
    size_t head = l7 == 127 ? 10 : l7 == 126 ? 4 : 2;
    return k->ops.send(k->user, t->name, t->len, f[0] & 0x0F, f + head, n - head);
}

void tern__ps_sink_close(tern_sink *k, int code) {
    if (k->closing)
        return;
    k->closing = true;
    k->close_code = code;
    if (tern__ps_sink_defer(k) < 0) {
        /* Out of memory for the timer: told now rather than never. */
        k->close_told = true;
        k->ops.close(k->user, code);
    }
}
