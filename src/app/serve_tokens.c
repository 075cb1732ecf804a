/* tern serve's /pubsub tokens (serve_tokens.h). */
#include "app/serve_tokens.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "app/token.h"

/* The verifier: set in setup; a SIGHUP may swap it for one made from the
 * files read again (app_serve_tokens_swap). Read once per verify, within
 * one callback, so an old one can be freed once every loop has run a
 * callback after the swap. */
static _Atomic(app_token_config *) config;

static app_token_config *config_now(void) {
    return atomic_load_explicit(&config, memory_order_acquire);
}

/* Invariants: linked exactly from on_open to the free, on the list of
 * its loop's thread (open_conns), which only that thread touches. */
struct app_token_conn {
    app_token_rights rights;   /* empty for an anonymous connection */
    bool has_token;
    tern_ws *ws;                 /* from on_open */
    tern_timer *timer;           /* the expiry, while the connection is open */
    bool linked;
    struct app_token_conn *prev, *next;
    /* The backend proxy's answers (app_token_conn_set_user): the user
     * and the info that stand for the token's, each NULL while the
     * backend has given none. */
    char *user, *info;
};

/* This loop's open /pubsub connections, for the admin API's calls on a
 * user (app_token_conns_of): one list per loop thread, so no lock. */
static _Thread_local app_token_conn *open_conns;

app_token_config *app_serve_tokens_build(const app_serve_token_flags *f,
                                             const char *who) {
    app_token_config *c = app_token_config_new();
    const char *why = "out of memory";
    if (c == NULL)
        goto fail;
    if (f->hmac_secret_file && app_token_config_hmac_file(c, f->hmac_secret_file, &why) < 0) {
        fprintf(stderr, "%s: --token-hmac-secret-file %s: %s\n", who, f->hmac_secret_file, why);
        goto fail_quiet;
    }
    if (f->public_key_file &&
        app_token_config_public_key_file(c, f->public_key_file, &why) < 0) {
        fprintf(stderr, "%s: --token-public-key-file %s: %s\n", who, f->public_key_file, why);
        goto fail_quiet;
    }
    if (app_token_config_audience(c, f->audience) < 0 ||
        app_token_config_issuer(c, f->issuer) < 0)
        goto fail;
    app_token_config_leeway(c, f->leeway);
    return c;
fail:
    fprintf(stderr, "%s: tokens: %s\n", who, why);
fail_quiet:
    app_token_config_free(c);
    return NULL;
}

int app_serve_tokens_setup(const app_serve_token_flags *f) {
    if (f->hmac_secret_file == NULL && f->public_key_file == NULL) {
        if (f->audience || f->issuer) {
            fprintf(stderr, "tern serve: --token-audience and --token-issuer need "
                            "--token-hmac-secret-file or --token-public-key-file\n");
            return -1;
        }
        return 0;
    }
    app_token_config *c = app_serve_tokens_build(f, "tern serve");
    if (c == NULL)
        return -1;
    atomic_store(&config, c);
    return 0;
}

app_token_config *app_serve_tokens_swap(app_token_config *c) {
    return atomic_exchange_explicit(&config, c, memory_order_acq_rel);
}

bool app_serve_tokens_on(void) {
    return config_now() != NULL;
}

void app_serve_tokens_cleanup(void) {
    app_token_config_free(app_serve_tokens_swap(NULL));
}

static int64_t wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec;
}

int app_token_conn_upgrade(tern_http_req *req, app_token_conn **out) {
    static _Thread_local char tok[TERN_TOKEN_MAX + 2];
    size_t len = 0;
    bool given = false;
    ssize_t q = tern_http_query_param(req, "token", tok, sizeof(tok));
    if (q >= 0 || q == -ENOSPC || q == -EINVAL) {
        if (q < 0)
            return 401;   /* over TERN_TOKEN_MAX, or a bad escape */
        given = true;
        len = (size_t)q;
    } else {
        size_t hl;
        const char *h = tern_http_header(req, "Authorization", &hl);
        if (h) {
            if (hl < 7 || strncasecmp(h, "Bearer ", 7) != 0)
                return 401;
            h += 7, hl -= 7;
            while (hl > 0 && h[0] == ' ')
                h++, hl--;
            while (hl > 0 && h[hl - 1] == ' ')
                hl--;
            if (hl > TERN_TOKEN_MAX)
                return 401;
            memcpy(tok, h, hl);
            len = hl;
            given = true;
        }
    }
    app_token_conn *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return 503;
    if (given) {
        const char *why;
        int err = app_token_verify(config_now(), tok, len, wall_now(), &c->rights, &why);
        if (err < 0) {
            free(c);
            return err == -ENOMEM ? 503 : 401;
        }
        c->has_token = true;
    }
    *out = c;
    return 0;
}

static void expired(tern_timer *t, void *user) {
    (void)t;
    app_token_conn *c = user;
    int64_t left = c->rights.until - wall_now();
    /* The wall clock went back: wait the rest (out of memory for the
     * timer: the token ends now). */
    if (left > 0 && tern_timer_again(c->timer, (uint64_t)left * 1000) == 0)
        return;
    tern_ws_close(c->ws, TERN_WS_TOKEN_EXPIRED, "token expired");
}

/* (Re)arms the expiry timer for the token's end: its exp plus the leeway,
 * the moment verify would refuse it. */
static void arm(app_token_conn *c) {
    int64_t left = c->rights.until - wall_now();
    uint64_t ms = left > 0 ? (uint64_t)left * 1000 : 0;
    int err = c->timer ? tern_timer_again(c->timer, ms)
                       : tern_timer_start(tern_ws_loop(c->ws), &c->timer, ms, 0, expired, c);
    if (err < 0) {
        /* Without a timer the expiry cannot be kept: close now rather
         * than let the rights outlive the token. */
        tern_ws_close(c->ws, TERN_WS_INTERNAL, "out of memory");
    }
}

void app_token_conn_open(app_token_conn *c, tern_ws *ws) {
    if (c == NULL)
        return;
    c->ws = ws;
    c->linked = true;
    c->next = open_conns;
    if (open_conns)
        open_conns->prev = c;
    open_conns = c;
    if (c->has_token)
        arm(c);
}

int64_t app_token_conn_until(const app_token_conn *c) {
    return c && c->has_token ? c->rights.until : 0;
}

void app_token_conn_free(app_token_conn *c) {
    if (c == NULL)
        return;
    if (c->linked) {
        if (c->prev)
            c->prev->next = c->next;
        else
            open_conns = c->next;
        if (c->next)
            c->next->prev = c->prev;
    }
    if (c->timer)
        tern_timer_stop(c->timer);
    app_token_rights_free(&c->rights);
    free(c->user);
    free(c->info);
    free(c);
}

int app_token_conn_set_user(app_token_conn **c, tern_ws *ws, const char *user, const char *info,
                            app_token_rights *rights) {
    char *u = user ? strdup(user) : NULL, *i = info ? strdup(info) : NULL;
    app_token_conn *made = *c ? NULL : calloc(1, sizeof(**c));
    if ((user && u == NULL) || (info && i == NULL) || (*c == NULL && made == NULL)) {
        free(u);
        free(i);
        free(made);
        return -ENOMEM;
    }
    if (made) {
        if (ws)   /* an /sse stream (no ws) is no connection the server API acts on */
            app_token_conn_open(made, ws);
        *c = made;
    }
    if (u) {
        free((*c)->user);
        (*c)->user = u;
    }
    if (i) {
        free((*c)->info);
        (*c)->info = i;
    }
    if (rights) {
        app_token_rights *to = &(*c)->rights;
        for (size_t k = 0; k < to->nsubscribe; k++)
            free(to->subscribe[k]);
        for (size_t k = 0; k < to->npublish; k++)
            free(to->publish[k]);
        memcpy(to->subscribe, rights->subscribe, rights->nsubscribe * sizeof(char *));
        memcpy(to->publish, rights->publish, rights->npublish * sizeof(char *));
        to->nsubscribe = rights->nsubscribe;
        to->npublish = rights->npublish;
        rights->nsubscribe = rights->npublish = 0;
    }
    return 0;
}

int app_token_conn_may_subscribe(const app_token_conn *c, const char *topic, size_t len) {
    if (c && app_token_allows(c->rights.subscribe, c->rights.nsubscribe, topic, len))
        return 0;
    return -EACCES;
}

int app_token_conn_may_publish(const app_token_conn *c, const char *topic, size_t len) {
    if (c && app_token_allows(c->rights.publish, c->rights.npublish, topic, len))
        return 0;
    return -EACCES;
}

const char *app_token_conn_sub(const app_token_conn *c) {
    if (c && c->user)
        return c->user;   /* the backend's word */
    return c && c->has_token ? c->rights.sub : NULL;
}

const char *app_token_conn_info(const app_token_conn *c) {
    if (c && c->info)
        return c->info;
    return c && c->has_token ? c->rights.info : NULL;
}

size_t app_token_conns_of(const char *sub, void (*fn)(tern_ws *ws, void *user), void *user) {
    size_t n = 0;
    for (app_token_conn *c = open_conns, *next; c; c = next) {
        next = c->next;   /* fn may close c's connection */
        const char *s = app_token_conn_sub(c);
        if (s && strcmp(s, sub) == 0) {
            fn(c->ws, user);
            n++;
        }
    }
    return n;
}

const char *app_token_conn_refresh(app_token_conn *c, tern_ws *ws, const char *tok,
                                     size_t len, int64_t *exp) {
    if (c == NULL)
        return "no token";
    app_token_rights r;
    const char *why;
    if (app_token_verify(config_now(), tok, len, wall_now(), &r, &why) < 0)
        return why;
    app_token_rights_free(&c->rights);
    c->rights = r;
    c->has_token = true;
    c->ws = ws;
    *exp = r.exp;
    arm(c);
    return NULL;
}
