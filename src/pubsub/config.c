/* Pub/sub's configuration: its module slot in the server and
 * the configuration, setup's options and topic rules
 * (tern_pubsub_configure, tern_pubsub_topic_rule), and the group made
 * from them at pub/sub's first use, which freezes them. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "pubsub/history.h"
#include "pubsub/pubsub.h"

#define DEFAULT_MAX_BACKLOG (1u << 20)
#define DEFAULT_MAX_SUBS 1024u

/* Pub/sub's module slot of a server and of a configuration, keyed at
 * first use. */
int tern__ps_slot(void) {
    static _Atomic int key;
    return tern__srv_slot_key(&key);
}

static void group_free(void *p) {
    tern__ps_group *g = p;
    for (size_t i = 0; i < g->topics.nb; i++)
        for (tern__ps_node *n = g->topics.b[i], *next; n; n = next) {
            next = n->next;
            tern__hist_free(((tern__ps_gtopic *)n)->hist);
            tern__ps_order_unref(((tern__ps_gtopic *)n)->ord);
            free(n);
        }
    free(g->topics.b);
    free(g->conf);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

static void psconf_free(void *p) {
    tern__ps_config *pc = p;
    tern__ps_group *g = atomic_load(&pc->g);
    if (g)
        group_free(g);
    free(pc->setup);
    free(pc);
}

static const tern__srv_module module = {
    .ws_closed = tern__ps_ws_closed,
    .ws_drained = tern__ps_ws_drained,
    .server_free = tern__ps_registry_free,
    .config_free = psconf_free,
};

tern__ps_config *tern__ps_conf_slot(tern__server_config *cfg) {
    tern__ps_config *pc = atomic_load(&cfg->slots[tern__ps_slot()]);
    if (pc)
        return pc;
    if ((pc = calloc(1, sizeof(*pc))) == NULL)
        return NULL;
    atomic_store(&cfg->modules[tern__ps_slot()], &module);
    void *expected = NULL;
    if (!atomic_compare_exchange_strong(&cfg->slots[tern__ps_slot()], &expected, pc)) {
        free(pc);
        return expected;
    }
    return pc;
}

tern__ps_config *tern__ps_conf_peek(const tern__server_config *cfg) {
    return atomic_load(&((tern__server_config *)cfg)->slots[tern__ps_slot()]);
}

tern__ps_group *tern__ps_group_peek(const tern__server_config *cfg) {
    tern__ps_config *pc = tern__ps_conf_peek(cfg);
    return pc ? atomic_load(&pc->g) : NULL;
}

struct tern__ps_registry *tern__ps_reg(const tern_server *srv) {
    return atomic_load_explicit(&((tern_server *)srv)->slots[tern__ps_slot()],
                                memory_order_acquire);
}

static void apply_defaults(tern_pubsub_options *o) {
    if (o->max_backlog == 0)
        o->max_backlog = DEFAULT_MAX_BACKLOG;
    if (o->max_subscriptions == 0)
        o->max_subscriptions = DEFAULT_MAX_SUBS;
    if (o->close_code == 0)
        o->close_code = TERN_WS_POLICY;
}

/* The rule a topic named name follows: its exact rule, else the longest
 * rule whose prefix starts it; NULL: none (the server's settings). */
static const tern__ps_rule *topic_rule(const tern__ps_group *g, const char *name, size_t len) {
    const tern__ps_rule *best = NULL;
    for (size_t i = 0; g->conf && i < g->conf->nrules; i++) {
        const tern__ps_rule *r = &g->conf->rules[i];
        if (r->o.exact ? r->len != len : r->len > len)
            continue;
        if (memcmp(r->prefix, name, r->len) != 0)
            continue;
        if (r->o.exact)
            return r;
        if (best == NULL || r->len > best->len)
            best = r;
    }
    return best;
}

/* The slot of a topic's rule in the per-rule counters: 0 for none, else
 * 1 + the rule's index in g->conf. */
uint8_t tern__ps_rule_slot(const tern__ps_group *g, const char *name, size_t len) {
    const tern__ps_rule *r = topic_rule(g, name, len);
    return r ? (uint8_t)(r - g->conf->rules + 1) : 0;
}

/* The settings a topic named name gets: its rule's, else the server's. */
tern_topic_options tern__ps_topic_settings(const tern__ps_group *g, const char *name, size_t len) {
    const tern__ps_rule *r = topic_rule(g, name, len);
    if (r)
        return r->o;
    return (tern_topic_options){.max_backlog = g->opt.max_backlog, .policy = g->opt.policy,
                                .close_code = g->opt.close_code, .history = g->opt.history,
                                .history_ms = g->opt.history_ms};
}

/* The configuration's group, made at first use by whichever thread. */
tern__ps_group *tern__ps_group_of(tern_server *srv) {
    tern__server_config *cfg = srv->cfg;
    tern__ps_config *pc = tern__ps_conf_slot(cfg);
    if (pc == NULL)
        return NULL;
    tern__ps_group *g = atomic_load(&pc->g);
    if (g)
        return g;
    g = calloc(1, sizeof(*g));
    if (g == NULL)
        return NULL;
    pthread_mutex_init(&g->mu, NULL);
    g->cfg = cfg;
    const tern__ps_conf *c = pc->setup;
    if (c)
        g->opt = c->opt;
    apply_defaults(&g->opt);
    if (c && c->nrules) {
        size_t size = sizeof(*c) + c->nrules * sizeof(tern__ps_rule);
        if ((g->conf = malloc(size)) == NULL) {
            group_free(g);
            return NULL;
        }
        memcpy(g->conf, c, size);
        for (size_t i = 0; i < c->nrules; i++) {
            tern_topic_options *o = &g->conf->rules[i].o;
            if (o->max_backlog == 0)
                o->max_backlog = g->opt.max_backlog;
            if (o->close_code == 0)
                o->close_code = g->opt.close_code;
            if (o->history == 0)
                o->history = g->opt.history;
            if (o->history_ms == 0)
                o->history_ms = g->opt.history_ms;
        }
    }
    tern__ps_group *expected = NULL;
    if (!atomic_compare_exchange_strong(&pc->g, &expected, g)) {
        group_free(g);
        return expected;
    }
    return g;
}

static bool policy_ok(int policy, uint16_t close_code, uint32_t history) {
    return (policy == TERN_PUBSUB_DROP || policy == TERN_PUBSUB_CLOSE ||
            policy == TERN_PUBSUB_CONFLATE) &&
           (close_code == 0 || close_code == TERN_WS_POLICY || close_code == TERN_WS_TRY_AGAIN) &&
           history <= TERN_HISTORY_MAX;
}

/* Setup's conf block, made at the first call. */
static int setup_conf(tern_server *srv, tern__ps_conf **out) {
    if (srv->cfg->shared || tern__ps_group_peek(srv->cfg))
        return -EBUSY;
    tern__ps_config *pc = tern__ps_conf_slot(srv->cfg);
    if (pc == NULL || (pc->setup == NULL && (pc->setup = calloc(1, sizeof(tern__ps_conf))) == NULL))
        return -ENOMEM;
    *out = pc->setup;
    return 0;
}

int tern_pubsub_configure(tern_server *srv, const tern_pubsub_options *opt) {
    if (srv == NULL || opt == NULL || !policy_ok(opt->policy, opt->close_code, opt->history) ||
        opt->write_delay_ms > TERN_WRITE_DELAY_MAX)
        return -EINVAL;
    tern__ps_conf *c;
    int err = setup_conf(srv, &c);
    if (err == 0)
        c->opt = *opt;
    return err;
}

int tern_pubsub_topic_rule(tern_server *srv, const char *prefix, const tern_topic_options *opt) {
    if (srv == NULL || prefix == NULL || opt == NULL ||
        !policy_ok(opt->policy, opt->close_code, opt->history) ||
        opt->throttle_ms > TERN_WRITE_DELAY_MAX)
        return -EINVAL;
    size_t len = strnlen(prefix, TERN_TOPIC_MAX + 1);
    if (len > TERN_TOPIC_MAX)
        return -ENAMETOOLONG;
    tern__ps_conf *c;
    int err = setup_conf(srv, &c);
    if (err < 0)
        return err;
    size_t i = 0;
    while (i < c->nrules && !(c->rules[i].len == len && c->rules[i].o.exact == opt->exact &&
                              memcmp(c->rules[i].prefix, prefix, len) == 0))
        i++;
    if (i == c->nrules) {
        if (c->nrules == TERN_TOPIC_RULES_MAX)
            return -ENOSPC;
        tern__ps_conf *n = realloc(c, sizeof(*c) + (c->nrules + 1) * sizeof(tern__ps_rule));
        if (n == NULL)
            return -ENOMEM;
        ((tern__ps_config *)atomic_load(&srv->cfg->slots[tern__ps_slot()]))->setup = c = n;
        c->nrules++;
    }
    tern__ps_rule *r = &c->rules[i];
    memset(r, 0, sizeof(*r));
    r->len = len;
    memcpy(r->prefix, prefix, len);
    r->o = *opt;
    return 0;
}

