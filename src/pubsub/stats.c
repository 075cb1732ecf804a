/* Pub/sub's counters and latency histogram: written by each loop alone
 * (PS_ADD, RS_ADD), read by any thread (tern_pubsub_stats,
 * tern_pubsub_latency, tern_pubsub_rule_stats). */
#include <errno.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "pubsub/pubsub.h"

/* The latency histogram's upper bounds, in microseconds. */
const uint64_t tern__ps_latency_le_us[TERN_HISTOGRAM_BUCKETS] = {
    50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000,
    1000000, 2500000};

/* One of r's counters of rule slot i += n, as PS_ADD. */
int tern_pubsub_stats(const tern_server *srv, tern_pubsub_counters *out) {
    if (srv == NULL || out == NULL || srv->loop == NULL)
        return -EINVAL;
    /* No registry yet: nothing counted on this loop. The registry lives
     * as long as the server, so the counters outlive nothing they count. */
    const tern__ps_registry *r = tern__ps_reg(srv);
    *out = (tern_pubsub_counters){0};
    if (r == NULL)
        return 0;
#define LOAD(f) TERN__COUNTER_GET(r->stats.f)
    out->messages = LOAD(messages);
    out->delivered = LOAD(delivered);
    out->dropped = LOAD(dropped);
    out->closed = LOAD(closed);
    out->conflated = LOAD(conflated);
    out->queue_max = LOAD(queue_max);
    uint64_t in = LOAD(subscribed), gone = LOAD(unsubscribed);
    out->subscriptions = in > gone ? in - gone : 0;
#undef LOAD
    return 0;
}

int tern_pubsub_latency(const tern_server *srv, tern_histogram *out) {
    if (srv == NULL || out == NULL || srv->loop == NULL)
        return -EINVAL;
    *out = (tern_histogram){0};
    const tern__ps_registry *r = tern__ps_reg(srv);
    uint64_t below = 0;
    for (size_t i = 0; i < TERN_HISTOGRAM_BUCKETS; i++) {
        if (r)
            below += atomic_load_explicit(&r->stats.lat[i], memory_order_relaxed);
        out->le_us[i] = tern__ps_latency_le_us[i];
        out->below[i] = below;
    }
    if (r) {
        out->sum_us = atomic_load_explicit(&r->stats.lat_sum_us, memory_order_relaxed);
        out->count = atomic_load_explicit(&r->stats.lat_count, memory_order_relaxed);
    }
    /* Read while the loop counts: a bucket may be ahead of the count. */
    if (out->count < below)
        out->count = below;
    return 0;
}

int tern_pubsub_rule_stats(const tern_server *srv, const char *prefix, bool exact,
                           tern_pubsub_rule_counters *out) {
    if (srv == NULL || prefix == NULL || out == NULL || srv->loop == NULL)
        return -EINVAL;
    *out = (tern_pubsub_rule_counters){0};
    size_t len = strnlen(prefix, TERN_TOPIC_MAX + 1);
    const tern__server_config *cfg = srv->cfg;
    tern__ps_config *pc = tern__ps_conf_peek(cfg);
    tern__ps_group *g = pc ? atomic_load(&pc->g) : NULL;
    /* Before pub/sub's first use the rules are setup's, and nothing is
     * counted yet; after it the group's copy, in the same order. */
    const tern__ps_conf *c = g ? g->conf : pc ? pc->setup : NULL;
    size_t i = 0;
    while (c && i < c->nrules && !(c->rules[i].len == len && c->rules[i].o.exact == exact &&
                                   memcmp(c->rules[i].prefix, prefix, len) == 0))
        i++;
    if (c == NULL || i == c->nrules)
        return -ENOENT;
    if (g == NULL)
        return 0;
    size_t slot = i + 1;
    out->published = atomic_load_explicit(&g->published[slot], memory_order_relaxed);
    uint64_t in = 0, gone = 0;
    int n = cfg->npeers ? cfg->npeers : 1;
    for (int k = 0; k < n; k++) {
        const tern_server *peer = cfg->npeers ? cfg->peers[k] : srv;
        const tern__ps_registry *r = peer ? tern__ps_reg(peer) : NULL;
        if (r == NULL)
            continue;
#define LOAD(f) TERN__COUNTER_GET(r->rstats[slot].f)
        in += LOAD(subscribed);
        gone += LOAD(unsubscribed);
        out->delivered += LOAD(delivered);
        out->dropped += LOAD(dropped);
        out->conflated += LOAD(conflated);
        out->replayed += LOAD(replayed);
        out->resumed += LOAD(resumed);
        out->resumed_gap += LOAD(resumed_gap);
#undef LOAD
    }
    out->subscriptions = in > gone ? in - gone : 0;
    return 0;
}

uint64_t tern__ps_mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* One observation of the publish-to-delivery latency on r's loop: a
 * bucket (not cumulative; tern_pubsub_latency sums them up), the sum and
 * the count, each a plain store by the loop. */
void tern__ps_latency_observe(tern__ps_registry *r, uint64_t born_ns) {
    uint64_t now = tern__ps_mono_ns(), us = now > born_ns ? (now - born_ns) / 1000 : 0;
    size_t i = tern_histogram_bucket(tern__ps_latency_le_us, TERN_HISTOGRAM_BUCKETS, us);
    if (i < TERN_HISTOGRAM_BUCKETS)
        PS_ADD(r, lat[i], 1);
    PS_ADD(r, lat_sum_us, us);
    PS_ADD(r, lat_count, 1);
}

