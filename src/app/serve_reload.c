/* tern serve's SIGHUP: --config's file read again (what may change live
 * applied, what may not named), the token keys and the certificates; and
 * what a reload swaps out, freed once no loop can be reading it. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/serve_ctx.h"

/* Something swapped out of use (origins, a token verifier), freed by
 * free_fn when the last loop has run its post. */
typedef struct retired {
    void *old;
    void (*free_fn)(void *);
    atomic_int left;
} retired;

static void retire_one(tern_loop *loop, void *user) {
    retired *r = user;
    if (atomic_fetch_sub(&r->left, 1) == 1) {
        r->free_fn(r->old);
        free(r);
    }
}

/* Frees old once no loop can be using it (on loop 0, from SIGHUP, after
 * the swap): a loop uses such a thing only within one callback, so once
 * each has run a post made after the swap, none is. The old thing is held
 * by one reference per loop, dropped by its post, and one of this
 * function's, dropped at its end (so the posts cannot free it under the
 * loop here). A loop that takes no post is stopping, and may still be in
 * a callback: its reference is never dropped, and the old thing stays
 * allocated rather than risk it. */
static void retire_after_loops(serve_ctx *ctx, void *old, void (*free_fn)(void *)) {
    retired *r = old ? malloc(sizeof(*r)) : NULL;
    if (r == NULL)
        return;   /* nothing, or out of memory: kept rather than freed under a reader */
    r->old = old;
    r->free_fn = free_fn;
    atomic_init(&r->left, ctx->nthreads + 1);
    for (int i = 0; i < ctx->nthreads; i++)
        tern_loop_post(tern_server_loop(tern_server_peer(ctx->first, i)), retire_one, r);
    retire_one(NULL, r);
}

static void origins_free_any(void *o) { tern__serve_origins_free(o); }
static void token_config_free_any(void *c) { tern__token_config_free(c); }

/* Publishes o to every loop's upgrade hook (on loop 0, from SIGHUP). */
static void origins_swap(serve_ctx *ctx, serve_origins *o) {
    serve_origins *old = atomic_exchange_explicit(&ctx->origins, o, memory_order_acq_rel);
    retire_after_loops(ctx, old, origins_free_any);
}

/* SIGHUP's token verifier: made again from s's files (a rotated key is
 * read), in *out; NULL when tokens are off, or when s would turn them on
 * or off (*toggle: that needs a restart, the hooks of /pubsub depend on
 * it). false once said why when the files do not load. */
static bool tokens_rebuild(const tern__opt_set *s, tern__token_config **out, bool *toggle) {
    tern__serve_token_flags tf = {.hmac_secret_file = tern__opt_str(s, SV_TOKEN_HMAC),
                                  .public_key_file = tern__opt_str(s, SV_TOKEN_PUBKEY),
                                  .audience = tern__opt_str(s, SV_TOKEN_AUD),
                                  .issuer = tern__opt_str(s, SV_TOKEN_ISS),
                                  .leeway = (uint32_t)tern__opt_uint(s, SV_TOKEN_LEEWAY)};
    bool want = tf.hmac_secret_file || tf.public_key_file;
    *toggle = want != tern__serve_tokens_on();
    *out = NULL;
    if (!want || *toggle)
        return true;
    *out = tern__serve_tokens_build(&tf, "tern: SIGHUP");
    return *out != NULL;
}

static bool is_token_option(int i) {
    return i == SV_TOKEN_HMAC || i == SV_TOKEN_PUBKEY || i == SV_TOKEN_AUD || i == SV_TOKEN_ISS ||
           i == SV_TOKEN_LEEWAY;
}

/* Whether a and b give every topic the same pub/sub settings (policy,
 * history, backlog: the library's, fixed once pub/sub runs), whatever
 * they say of who may subscribe and publish. */
static bool rules_same_settings(const tern__topic_rules *a, const tern__topic_rules *b) {
    if (a->n != b->n)
        return false;
    for (int i = 0; i < a->n; i++) {
        const tern__topic_rule *x = &a->r[i], *y = NULL;
        for (int k = 0; k < b->n && !y; k++)
            if (b->r[k].prefix == x->prefix && b->r[k].len == x->len &&
                memcmp(b->r[k].pattern, x->pattern, x->len) == 0)
                y = &b->r[k];
        if (y == NULL || x->has_policy != y->has_policy || x->policy != y->policy ||
            x->close_code != y->close_code || x->has_history != y->has_history ||
            x->history != y->history || x->has_history_age != y->has_history_age ||
            x->history_ms != y->history_ms || x->has_backlog != y->has_backlog ||
            x->max_backlog != y->max_backlog)
            return false;
    }
    return true;
}

static void rules_free_any(void *t) { free(t); }

/* Whether option i has the same values in a and b. */
static bool same_values(const tern__opt_set *a, const tern__opt_set *b, int i) {
    const tern__opt_val *va = &a->vals[i], *vb = &b->vals[i];
    if (va->n != vb->n)
        return va->n + vb->n == 1 && strcmp(tern__opt_str(a, i) ? tern__opt_str(a, i) : "",
                                            tern__opt_str(b, i) ? tern__opt_str(b, i) : "") == 0;
    for (int k = 0; k < va->n; k++)
        if (strcmp(va->v[k], vb->v[k]) != 0)
            return false;
    return true;
}

/* SIGHUP with --config: the file read again, with the same command line
 * and the environment over it. What may change live (the table's RELOAD
 * options) is applied; what may not is named and left as it is; a file
 * that does not parse changes nothing. One line says which. false when
 * the file did not parse. */
static bool reload_config(serve_ctx *ctx) {
    tern__opt_set n;
    if (tern__opt_init(&n, "tern serve", tern__serve_opts, SV_COUNT) < 0) {
        tern__serve_log(stderr, TERN_LOG_ERROR,
                        "SIGHUP: out of memory: the configuration is kept as it was");
        return false;
    }
    n.env_prefix = "TERN_";
    if (tern__opt_parse_argv(&n, ctx->argc, ctx->argv) < 0 ||
        tern__opt_parse_file(&n, ctx->config_path) < 0 || tern__opt_parse_env(&n) < 0) {
        tern__serve_log(stderr, TERN_LOG_ERROR, "SIGHUP: %s: the configuration is kept as it was",
                        n.err);
        tern__opt_free(&n);
        return false;
    }
    tern__token_config *tok;
    bool toggle;
    if (!tokens_rebuild(&n, &tok, &toggle)) {
        tern__serve_log(stderr, TERN_LOG_ERROR, "SIGHUP: the configuration is kept as it was");
        tern__opt_free(&n);
        return false;
    }
    /* Topic rules: who may subscribe and publish changes live; the
     * settings the library has (policy, history, backlog) need a restart,
     * and then the rules stay as they are, whole. */
    tern__topic_rules *rules = NULL;
    bool rules_fixed = false;
    if (!same_values(ctx->opts, &n, SV_TOPIC) || !same_values(ctx->opts, &n, SV_PS_TOPIC)) {
        if ((rules = malloc(sizeof(*rules))) == NULL || tern__serve_rules_build(&n, rules) < 0) {
            tern__serve_log(stderr, TERN_LOG_ERROR, "SIGHUP: %s: the configuration is kept as it was",
                    rules ? "the topic rules" : "out of memory");
            free(rules);
            tern__token_config_free(tok);
            tern__opt_free(&n);
            return false;
        }
        if (!rules_same_settings(rules, &ctx->rules)) {
            rules_fixed = true;
            free(rules);
            rules = NULL;
        }
    }
    bool too_many = false;
    serve_origins *origins = NULL;
    if (!same_values(ctx->opts, &n, SV_ALLOWED_ORIGIN) || !same_values(ctx->opts, &n, SV_WS_ORIGIN)) {
        if ((origins = tern__serve_origins_new(&n, &too_many)) == NULL) {
            tern__serve_log(stderr, TERN_LOG_ERROR, "SIGHUP: %s: the configuration is kept as it was",
                    too_many ? "more than " ORIGINS_MAX_TEXT " origins" : "out of memory");
            tern__token_config_free(tok);
            free(rules);
            tern__opt_free(&n);
            return false;
        }
    }
    char applied[1024] = "", kept[1024] = "";
    size_t alen = 0, klen = 0;
    for (int i = 0; i < SV_COUNT; i++) {
        const tern__opt *o = &tern__serve_opts[i];
        if ((o->flags & TERN__OPT_CLI_ONLY) || same_values(ctx->opts, &n, i))
            continue;
        bool fixed = (toggle && is_token_option(i)) ||
                     (rules_fixed && (i == SV_TOPIC || i == SV_PS_TOPIC));
        if ((o->flags & TERN__OPT_RELOAD) && !fixed) {
            alen += (size_t)snprintf(applied + alen, sizeof(applied) - alen, "%s%s",
                                     alen ? ", " : "", o->name);
            /* The running set takes the new values: the next SIGHUP
             * compares with what is live. The others keep the values the
             * server started with (and points into). */
            tern__opt_val t = ctx->opts->vals[i];
            ctx->opts->vals[i] = n.vals[i];
            n.vals[i] = t;
        } else {
            klen += (size_t)snprintf(kept + klen, sizeof(kept) - klen, "%s%s",
                                     klen ? ", " : "", o->name);
        }
        alen = alen < sizeof(applied) ? alen : sizeof(applied) - 1;
        klen = klen < sizeof(kept) ? klen : sizeof(kept) - 1;
    }
    if (origins)
        origins_swap(ctx, origins);
    if (rules) {
        const tern__topic_rules *old = tern__serve_pubsub_swap_rules(rules);
        if (old != &ctx->rules)   /* the first ones live in ctx */
            retire_after_loops(ctx, (void *)old, rules_free_any);
    }
    if (tok) {
        retire_after_loops(ctx, tern__serve_tokens_swap(tok), token_config_free_any);
        if (!ctx->quiet)
            tern__serve_log(stderr, TERN_LOG_INFO, "SIGHUP, token keys read again");
    }
    if (!ctx->quiet)
        tern__serve_log_library(tern__opt_str(ctx->opts, SV_LOG_LEVEL));
    tern__serve_pubsub_set_rate((uint32_t)tern__opt_uint(ctx->opts, SV_PS_RATE));
    tern__serve_log(stderr, TERN_LOG_INFO, "SIGHUP: %s read: %s%s%s%s%s%s", ctx->config_path,
            alen ? "applied " : "", applied, alen && klen ? "; " : "",
            klen ? "not applied (they need a restart): " : "", kept,
            alen || klen ? "" : "no option changed");
    tern__opt_free(&n);
    return true;
}

/* The reload itself: the file (with --config), the token keys, the
 * certificates. */
static void reload(serve_ctx *ctx) {
    if (ctx->config_path && !reload_config(ctx))
        return;   /* a file that does not parse changes nothing, certificates included */
    if (!ctx->config_path) {
        /* The token files read again (a rotated key), as the certificates. */
        tern__token_config *tok;
        bool toggle;
        if (!tokens_rebuild(ctx->opts, &tok, &toggle))
            tern__serve_log(stderr, TERN_LOG_ERROR,
                            "SIGHUP: the token keys are kept as they were");
        else if (tok)
            retire_after_loops(ctx, tern__serve_tokens_swap(tok), token_config_free_any);
    }
    if (ctx->tls == NULL)
        return;   /* no certificates: none to speak of */
    /* Renewed certificates: new handshakes use them. */
    int err = tern_tls_reload(ctx->tls);
    if (!ctx->quiet || err < 0)
        tern__serve_log(stderr, err < 0 ? TERN_LOG_ERROR : TERN_LOG_INFO,
                        "SIGHUP, certificates %s%s", err < 0 ? "kept: " : "reloaded",
                err < 0 ? tern_strerror(err) : "");
}

/* SIGHUP: systemd (Type=notify-reload) is told a reload runs, and when it
 * is over, whether it applied or kept the old configuration. */
void tern__serve_on_sighup(tern_loop *loop, int signo, void *user) {
    serve_ctx *ctx = user;
    tern__serve_sd_reloading();
    reload(ctx);
    tern__serve_sd_reloaded();
}
