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
    atomic_init(&r->left, ctx->set.threads + 1);
    for (int i = 0; i < ctx->set.threads; i++)
        if (tern_loop_post(tern_server_loop(tern_server_peer(ctx->first, i)), retire_one, r) < 0)
            fprintf(stderr, "tern serve: out of memory: the replaced configuration is kept\n");
    retire_one(NULL, r);   /* a loop that was not told never counts down: r is kept */
}

static void origins_free_any(void *o) { app_serve_origins_free(o); }
static void token_config_free_any(void *c) { app_token_config_free(c); }
static void rules_free_any(void *t) { free(t); }

/* SIGHUP's token verifier: made again from tf's files (a rotated key is
 * read), in *out; NULL when tokens are off, or when tf would turn them on
 * or off (*toggle: that needs a restart, the hooks of /pubsub depend on
 * it). false once said why when the files do not load. */
static bool tokens_rebuild(const app_serve_token_flags *tf, app_token_config **out,
                           bool *toggle) {
    bool want = tf->hmac_secret_file || tf->public_key_file;
    *toggle = want != app_serve_tokens_on();
    *out = NULL;
    if (!want || *toggle)
        return true;
    *out = app_serve_tokens_build(tf, "tern: SIGHUP");
    return *out != NULL;
}

/* Whether a and b give every topic the same pub/sub settings (policy,
 * history, backlog: the library's, fixed once pub/sub runs), whatever
 * they say of who may subscribe and publish. */
static bool rules_same_settings(const app_topic_rules *a, const app_topic_rules *b) {
    if (a->n != b->n)
        return false;
    for (int i = 0; i < a->n; i++) {
        const app_topic_rule *x = &a->r[i], *y = NULL;
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

/* How a group of options takes effect (an option's `live` in the table,
 * serve_options.c): at start-up, start applies them as ctx->set holds
 * them. A SIGHUP first makes what every group whose options changed
 * needs, from the new settings, before anything changes; only when all
 * are made does it put the new values in the running settings and each
 * group's made thing in use. Invariants: make leaves *made NULL when it
 * fails or has nothing to put in use; use takes *made (NULL included) and
 * is called once the settings hold the new values; drop frees a made
 * thing that is not used (the configuration kept). */
typedef struct serve_live {
    /* At start-up: 0, or the command's exit status once said why. NULL:
     * nothing to start (what uses the values reads ctx->set). */
    int (*start)(serve_ctx *ctx);
    /* Made on every SIGHUP, its options changed or not: the token key
     * files are read again (a rotated key). */
    bool every_sighup;
    /* NULL, or why the configuration is kept ("": said already); *restart
     * when this change cannot be applied live after all (its options are
     * then named as needing a restart). NULL make: nothing to make. */
    const char *(*make)(serve_ctx *ctx, const app_serve_settings *next, void **made,
                        bool *restart);
    void (*use)(serve_ctx *ctx, void *made);
    void (*drop)(void *made);
} serve_live;

/* --allowed-origin, --ws-origin: a new list, published to every loop's
 * upgrade hook. */
static const char *origins_make(serve_ctx *ctx, const app_serve_settings *next, void **made,
                                bool *restart) {
    (void)ctx;
    (void)restart;
    bool too_many = false;
    if ((*made = app_serve_origins_new(next, &too_many)) == NULL)
        return too_many ? "more than " ORIGINS_MAX_TEXT " origins" : "out of memory";
    return NULL;
}

static int origins_start(serve_ctx *ctx) {
    bool too_many;   /* counted already: serve_main refuses more */
    serve_origins *o = app_serve_origins_new(&ctx->set, &too_many);
    if (o == NULL) {
        fprintf(stderr, "tern serve: out of memory\n");
        return 1;
    }
    atomic_store(&ctx->origins, o);
    return 0;
}

static void origins_use(serve_ctx *ctx, void *made) {
    serve_origins *old = atomic_exchange_explicit(&ctx->origins, made, memory_order_acq_rel);
    retire_after_loops(ctx, old, origins_free_any);
}

/* --topic: who may subscribe and publish changes live; the settings the
 * library has (policy, history, backlog) need a restart, and then the
 * rules stay as they are, whole. The first rules live in ctx. */
static int rules_start(serve_ctx *ctx) {
    return app_serve_rules_build(&ctx->set, &ctx->rules) < 0 ? 2 : 0;   /* said why */
}

static const char *rules_make(serve_ctx *ctx, const app_serve_settings *next, void **made,
                              bool *restart) {
    app_topic_rules *r = malloc(sizeof(*r));
    if (r == NULL)
        return "out of memory";
    if (app_serve_rules_build(next, r) < 0) {
        free(r);
        return "the topic rules";
    }
    *restart = !rules_same_settings(r, &ctx->rules);
    if (*restart)
        free(r);
    else
        *made = r;
    return NULL;
}

static void rules_use(serve_ctx *ctx, void *made) {
    if (made == NULL)
        return;
    const app_topic_rules *old = app_serve_pubsub_swap_rules(made);
    if (old != &ctx->rules)   /* the first ones live in ctx */
        retire_after_loops(ctx, (void *)old, rules_free_any);
}

/* --token-*: the verifier made again, its key files read; turning tokens
 * on or off needs a restart. */
static int tokens_start(serve_ctx *ctx) {
    return app_serve_tokens_setup(&ctx->set.tokens) < 0 ? 2 : 0;   /* said why */
}

static const char *tokens_make(serve_ctx *ctx, const app_serve_settings *next, void **made,
                               bool *restart) {
    (void)ctx;
    app_token_config *c;
    if (!tokens_rebuild(&next->tokens, &c, restart))
        return "";
    *made = c;
    return NULL;
}

static void tokens_use(serve_ctx *ctx, void *made) {
    if (made == NULL)
        return;
    retire_after_loops(ctx, app_serve_tokens_swap(made), token_config_free_any);
    if (!ctx->set.quiet)
        app_serve_log(stderr, TERN_LOG_INFO, "SIGHUP, token keys read again");
}

/* --log-level: the library's log. */
static void log_use(serve_ctx *ctx, void *made) {
    (void)made;
    if (!ctx->set.quiet)
        app_serve_log_library(ctx->set.log_level);
}

static int log_start(serve_ctx *ctx) {
    log_use(ctx, NULL);
    return 0;
}

/* --pubsub-rate: every /pubsub connection's (at start-up, the /pubsub
 * routes take it from ctx->set). */
static void rate_use(serve_ctx *ctx, void *made) {
    (void)made;
    app_serve_pubsub_set_rate(ctx->set.ps_limits.rate);
}

/* The groups, by their APP_SERVE_LIVE_* (the order start-up and a SIGHUP
 * run them); every one but NONE has a use. */
static const serve_live lives[APP_SERVE_LIVE_COUNT] = {
    [APP_SERVE_LIVE_RULES] = {.start = rules_start, .make = rules_make, .use = rules_use,
                              .drop = rules_free_any},
    [APP_SERVE_LIVE_TOKENS] = {.start = tokens_start, .every_sighup = true, .make = tokens_make,
                               .use = tokens_use, .drop = token_config_free_any},
    [APP_SERVE_LIVE_ORIGINS] = {.start = origins_start, .make = origins_make,
                                .use = origins_use, .drop = origins_free_any},
    [APP_SERVE_LIVE_LOG] = {.start = log_start, .use = log_use},
    [APP_SERVE_LIVE_RATE] = {.use = rate_use},
};

int app_serve_live_start(serve_ctx *ctx) {
    for (int k = APP_SERVE_LIVE_NONE + 1; k < APP_SERVE_LIVE_COUNT; k++) {
        int status = lives[k].start ? lives[k].start(ctx) : 0;
        if (status != 0)
            return status;
    }
    return 0;
}

/* Whether option i has the same values in a and b. */
static bool same_values(const app_opt_set *a, const app_opt_set *b, int i) {
    const app_opt_val *va = &a->vals[i], *vb = &b->vals[i];
    if (va->n != vb->n)
        return va->n + vb->n == 1 && strcmp(app_opt_str(a, i) ? app_opt_str(a, i) : "",
                                            app_opt_str(b, i) ? app_opt_str(b, i) : "") == 0;
    for (int k = 0; k < va->n; k++)
        if (strcmp(va->v[k], vb->v[k]) != 0)
            return false;
    return true;
}

/* A name added to a list of them ("a, b"), cut at the buffer's end. */
static void name_add(char *list, size_t cap, size_t *len, const char *name) {
    *len += (size_t)snprintf(list + *len, cap - *len, "%s%s", *len ? ", " : "", name);
    *len = *len < cap ? *len : cap - 1;
}

/* SIGHUP with --config: the file read again, with the same command line
 * and the environment over it. What may change live (the options with a
 * live group) is applied; what may not is named and left as it is; a
 * file that does not parse changes nothing. One line says which. false
 * when the configuration was kept. */
static bool reload_config(serve_ctx *ctx) {
    app_opt_set n;
    bool due[APP_SERVE_LIVE_COUNT] = {false}, restart[APP_SERVE_LIVE_COUNT] = {false};
    void *made[APP_SERVE_LIVE_COUNT] = {NULL};
    const char *kept_why = NULL;
    if (app_opt_init(&n, "tern serve", app_serve_opts, SV_COUNT) < 0) {
        kept_why = "out of memory";
        goto out;
    }
    n.env_prefix = "TERN_";
    if (app_opt_parse_argv(&n, ctx->argc, ctx->argv) < 0 ||
        app_opt_parse_file(&n, ctx->config_path) < 0 || app_opt_parse_env(&n) < 0) {
        kept_why = n.err;
        goto out;
    }
    /* The new values where they go, as at start: the same table. */
    app_serve_settings next = {0};
    app_opt_apply(&n, &next);
    /* What each group whose options changed needs, made before anything
     * changes: one that cannot be made keeps the whole configuration. */
    for (int i = 0; i < SV_COUNT; i++)
        if (!same_values(ctx->opts, &n, i))
            due[app_serve_opts[i].live] = true;
    for (int k = APP_SERVE_LIVE_NONE + 1; k < APP_SERVE_LIVE_COUNT; k++) {
        due[k] = due[k] || lives[k].every_sighup;
        if (due[k] && lives[k].make &&
            (kept_why = lives[k].make(ctx, &next, &made[k], &restart[k])) != NULL)
            goto out;
    }
    char applied[1024] = "", kept[1024] = "";
    size_t alen = 0, klen = 0;
    for (int i = 0; i < SV_COUNT; i++) {
        const app_opt *o = &app_serve_opts[i];
        app_opt_when when = app_opt_applies(o);
        if (when == APP_OPT_AT_START || same_values(ctx->opts, &n, i))
            continue;
        if (when == APP_OPT_ON_SIGHUP && !restart[o->live]) {
            name_add(applied, sizeof(applied), &alen, o->name);
            /* The running set takes the new values, and its settings
             * with them: the next SIGHUP compares with what is live. The
             * others keep the values the server started with (and points
             * into). */
            app_opt_val t = ctx->opts->vals[i];
            ctx->opts->vals[i] = n.vals[i];
            n.vals[i] = t;
            app_opt_apply_one(ctx->opts, i, &ctx->set);
        } else {
            name_add(kept, sizeof(kept), &klen, o->name);
        }
    }
    for (int k = APP_SERVE_LIVE_NONE + 1; k < APP_SERVE_LIVE_COUNT; k++) {
        if (due[k] && !restart[k])
            lives[k].use(ctx, made[k]);
        made[k] = NULL;   /* in use now (or nothing) */
    }
    app_serve_log(stderr, TERN_LOG_INFO, "SIGHUP: %s read: %s%s%s%s%s%s", ctx->config_path,
            alen ? "applied " : "", applied, alen && klen ? "; " : "",
            klen ? "not applied (they need a restart): " : "", kept,
            alen || klen ? "" : "no option changed");
out:
    if (kept_why)
        app_serve_log(stderr, TERN_LOG_ERROR, "SIGHUP: %s%sthe configuration is kept as it was",
                        kept_why, kept_why[0] ? ": " : "");
    for (int k = APP_SERVE_LIVE_NONE + 1; k < APP_SERVE_LIVE_COUNT; k++)
        if (made[k])
            lives[k].drop(made[k]);
    app_opt_free(&n);
    return kept_why == NULL;
}

/* The reload itself: the file (with --config), the token keys, the
 * certificates. */
static void reload(serve_ctx *ctx) {
    if (ctx->config_path && !reload_config(ctx))
        return;   /* a file that does not parse changes nothing, certificates included */
    if (!ctx->config_path) {
        /* The token files read again (a rotated key), as the certificates. */
        app_token_config *tok;
        bool toggle;
        if (!tokens_rebuild(&ctx->set.tokens, &tok, &toggle))
            app_serve_log(stderr, TERN_LOG_ERROR,
                            "SIGHUP: the token keys are kept as they were");
        else if (tok)
            retire_after_loops(ctx, app_serve_tokens_swap(tok), token_config_free_any);
    }
    if (ctx->tls == NULL)
        return;   /* no certificates: none to speak of */
    /* Renewed certificates: new handshakes use them. */
    int err = tern_tls_reload(ctx->tls);
    if (!ctx->set.quiet || err < 0)
        app_serve_log(stderr, err < 0 ? TERN_LOG_ERROR : TERN_LOG_INFO,
                        "SIGHUP, certificates %s%s", err < 0 ? "kept: " : "reloaded",
                err < 0 ? tern_strerror(err) : "");
}

/* SIGHUP: systemd (Type=notify-reload) is told a reload runs, and when it
 * is over, whether it applied or kept the old configuration. */
void app_serve_on_sighup(tern_loop *loop, int signo, void *user) {
    serve_ctx *ctx = user;
    app_serve_sd_reloading();
    reload(ctx);
    app_serve_sd_reloaded();
}
