/* tern serve's shared context: what its files (serve.c, serve_bench.c,
 * serve_admin.c, serve_api.c, serve_origins.c, serve_reload.c) share, private to them. */
#ifndef TERN_APP_SERVE_CTX_H
#define TERN_APP_SERVE_CTX_H

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "app/app.h"
#include "app/serve_options.h"
#include "app/serve_tokens.h"
#include "app/topic_rules.h"
#include "tern/tern.h"

#define ORIGINS_MAX 32             /* --allowed-origin values */
#define ORIGINS_MAX_TEXT "32"

/* Setup fails with this once it has said why. */
#define SETUP_FAILED (-ESRCH)

typedef struct serve_thread serve_thread;

/* A connection of /ws/broadcast (serve_bench.c). */
typedef struct bcast_member bcast_member;

/* What belongs to one thread (loop): only that loop touches it. */
struct serve_thread {
    struct serve_ctx *ctx;
    int index;
    uint64_t ws_conn_seq;      /* numbers the WebSocket connections (with the thread) */
    bcast_member *members;     /* /ws/broadcast connections of this loop */
    /* /ws/broadcast messages posted to this loop and not yet delivered
     * there: raised under ctx->bcast_lock by whichever thread posts,
     * lowered by this loop once it has delivered one. */
    atomic_uint bcast_inflight;
    /* --ws-async: the messages waiting for their echo, later_msg after
     * later_msg in arrival order in one buffer (no allocation per message
     * once it has grown), and whether the flush that echoes them is due
     * (its timer, in timer mode, armed; or its post made). */
    char *later;
    size_t later_len, later_cap;
    bool later_due;
};

/* --allowed-origin (and --ws-origin): the Origins a WebSocket upgrade may
 * come from, exact or a wildcard subdomain ("*." after the scheme); none:
 * any. Invariants: never changed once published in serve_ctx.origins; a
 * SIGHUP publishes a new one, and the old one is freed once every loop
 * has run a post made after the swap (an upgrade hook reads it only
 * within one callback, so none can be reading it then). */
typedef struct serve_origins {
    int n;
    char *v[ORIGINS_MAX];
} serve_origins;

/* Shared by every thread: set before they start, read-only after, but for
 * what SIGHUP changes (origins, through its pointer; the options' set and
 * the settings SIGHUP applies, only on loop 0, which handles the signal). */
typedef struct serve_ctx {
    /* The options the server runs with, and how to read them again on
     * SIGHUP: the same command line, --config's file (NULL: none) and the
     * environment; set: their values where they go (its strings are opts'). */
    app_opt_set *opts;
    int argc;
    char **argv;
    const char *config_path;
    app_serve_settings set;
    _Atomic(serve_origins *) origins;
    app_topic_rules rules;   /* --topic, --pubsub-topic-policy, and the feed's topics */
    FILE *access_log;          /* --access-log, or NULL (stdio locks each line) */
    const char *access_path;   /* its file, reopened on SIGUSR1; NULL for stdout */
    tern_tls *tls;             /* --tls-cert/--tls-key, or NULL */
    serve_thread *threads;     /* set.threads of them */
    /* --bridge URL (or --redis's, its older name; with
     * --redis-password-file's password put in), or NULL; shown only
     * through app_serve_redis_redact */
    char *bridge;
    const char *bridge_flag;   /* which of the two gave it: "--bridge" or "--redis" */
    tern_server *first;        /* thread 0's server (setup's) */
    /* Sockets systemd passed, served instead of binding (closed once
     * served: the servers hold duplicates); -1 each when none. */
    app_sd_sockets sd;
    /* The admin listener's server (set.admin.host "": none): /publish and
     * /stats on a server of their own, on loop 0 (freed by serve_teardown) */
    tern_server *admin;
    tern_timer *watchdog;      /* systemd's WatchdogSec: WATCHDOG=1 from loop 0, or NULL */
    /* RLIMIT_NOFILE once raised to the hard limit, for the warning at start */
    unsigned long long fd_limit;
    /* --api-key-file: its first line, or NULL (then POST /publish is 403) */
    char *api_key;
    /* /ws/broadcast's sequencer: a message is given its place (posted to
     * every other loop, and to its own when that one has posts of it in
     * flight) under this lock, so every loop's FIFO post queue holds the
     * messages in one order. */
    pthread_mutex_t bcast_lock;
    /* Set by the first SIGTERM or SIGINT (on loop 0), read by the admin
     * routes: from then on the server only finishes what it has. */
    atomic_bool draining;
} serve_ctx;

/* serve.c: the 404 of every server (the admin one's too), and what a
 * refused port means, after tern_strerror's "Address already in use". */
void app_serve_not_found(tern_http_req *req, void *user);
const char *app_serve_in_use_hint(int err);
/* The topic rules of set into t (zeroed, resolved): -1 once said why. */
int app_serve_rules_build(const app_serve_settings *set, app_topic_rules *t);

/* serve_origins.c: --allowed-origin and --ws-origin, and the upgrade hook
 * of every WebSocket route (user: the serve_ctx). */
serve_origins *app_serve_origins_new(const app_serve_settings *set, bool *too_many);
void app_serve_origins_free(serve_origins *o);
int app_serve_ws_upgrade(tern_http_req *req, void **conn_user, void *user);

/* serve_bench.c: the --bench-routes routes on srv (wo: the WebSocket
 * options of the other routes): 0, or the first registration's error; and
 * the end of a thread's --ws-async queue, after its loop has ended. */
int app_serve_bench_routes(tern_server *srv, serve_ctx *ctx, const tern_ws_options *wo);
void app_serve_later_free(serve_thread *th);

/* serve_admin.c: the admin listener, made on loop (SETUP_FAILED once said
 * why); --api-key-file's key (NULL once said why); the check of an
 * --admin-listen other than loopback (-1 once said why). */
int app_serve_admin_setup(serve_ctx *ctx, tern_loop *loop);
char *app_serve_read_api_key(const char *path);
int app_serve_admin_exposed(const app_opt_set *s);
/* Whether req carries the --api-key-file key; if not, it has been
 * answered (403 without a key file, 401 with a wrong or no key; route:
 * what the answer names, "POST /publish" say). */
bool app_serve_admin_key_ok(tern_http_req *req, const serve_ctx *ctx, const char *route);

/* serve_api.c: the server API's routes on the admin server (ctx->admin):
 * 0, or the first registration's error. */
int app_serve_api_routes(serve_ctx *ctx);

/* serve_reload.c: start-up's application of the option groups SIGHUP
 * applies again (the topic rules, the token verifier, the origins, the
 * library's log level), from ctx->set: 0, or the exit status once said
 * why (ctx->origins, when set, is then the caller's to free); SIGHUP
 * (user: the serve_ctx). */
int app_serve_live_start(serve_ctx *ctx);
void app_serve_on_sighup(tern_loop *loop, int signo, void *user);

#endif
