/* tern serve's shared context: what its files (serve.c, serve_bench.c,
 * serve_admin.c, serve_origins.c, serve_reload.c) share, private to them. */
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

/* --ws-async's modes (serve_ctx.ws_async). */
enum { WS_ASYNC_NONE, WS_ASYNC_TIMER, WS_ASYNC_POST };

/* Setup fails with this once it has said why. */
#define SETUP_FAILED (-ESRCH)

typedef struct serve_thread serve_thread;

/* A connection of /ws/broadcast, on its thread's list while open. */
typedef struct bcast_member {
    tern_ws *ws;
    serve_thread *th;
    struct bcast_member *next, *prev;
} bcast_member;

/* A /ws message kept by --ws-async to be echoed later: the connection
 * (referenced), then len bytes of payload, padded to keep the next entry
 * aligned. */
typedef struct later_msg {
    tern_ws *ws;
    uint32_t len;
    int opcode;
    char data[];
} later_msg;

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
 * what SIGHUP changes (origins, through its pointer; the options' set,
 * only on loop 0, which handles the signal). */
typedef struct serve_ctx {
    bool quiet;
    _Atomic(serve_origins *) origins;
    /* The options the server runs with, and how to read them again on
     * SIGHUP: the same command line, --config's file (NULL: none) and the
     * environment. */
    tern__opt_set *opts;
    int argc;
    char **argv;
    const char *config_path;
    FILE *access_log;          /* --access-log, or NULL (stdio locks each line) */
    const char *access_path;   /* its file, reopened on SIGUSR1; NULL for stdout */
    tern_tls *tls;             /* --tls-cert/--tls-key, or NULL */
    int nthreads;
    serve_thread *threads;
    /* what setup needs */
    const char *host, *unix_path, *root;
    int port, tls_port;
    const char **vhosts;       /* --vhost NAME=ROOT */
    int nvhosts;
    tern_ws_options wo;
    tern_pubsub_options po;    /* --pubsub-max-backlog, --pubsub-policy, --pubsub-history* */
    tern__serve_pubsub_limits ps_limits;   /* --pubsub-max-message, --pubsub-rate */
    tern__serve_token_flags token_flags;   /* --token-* (serve_tokens.c) */
    tern__topic_rules rules;   /* --topic, --pubsub-topic-policy, and the feed's topics */
    /* --redis URL (with --redis-password-file's password put in), or NULL;
     * shown only through tern__serve_redis_redact */
    char *redis;
    bool feed;                 /* --feed on|off (on) */
    tern_listen_options listen;   /* --sndbuf */
    int ws_async;              /* --ws-async[=timer|post]: /ws echoes each message later */
    uint32_t ws_deadline_ms;   /* --ws-deadline-ms: /ws's deadline, moved by every message */
    unsigned feed_rate;        /* --feed-rate N: market updates a second */
    bool page;                 /* --page on|off (on) */
    char node[TERN__NODE_NAME_MAX + 1];   /* --node-name, or HOSTNAME:PID */
    tern_server *first;        /* thread 0's server (setup's) */
    /* Sockets systemd passed, served instead of binding (closed once
     * served: the servers hold duplicates); -1 each when none. */
    tern__sd_sockets sd;
    bool bench_routes;         /* --bench-routes: /echo, /ws, /fanout... registered */
    /* --admin-listen HOST:PORT (admin_host NULL: off): /publish and /stats
     * on a server of their own, on loop 0 (admin, freed by serve_teardown) */
    const char *admin_host;
    int admin_port;
    char admin_host_buf[256];
    tern_server *admin;
    tern_server_options server_options;   /* the admin server's too */
    tern_timer *watchdog;      /* systemd's WatchdogSec: WATCHDOG=1 from loop 0, or NULL */
    /* RLIMIT_NOFILE once raised to the hard limit, and --max-connections
     * (TERN_UNLIMITED for 0), for the warning at start */
    unsigned long long fd_limit;
    uint32_t max_connections;
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
void tern__serve_not_found(tern_http_req *req, void *user);
const char *tern__serve_in_use_hint(int err);
/* The topic rules of s into t (zeroed, resolved): -1 once said why. */
int tern__serve_rules_build(const tern__opt_set *s, tern__topic_rules *t);

/* serve_origins.c: --allowed-origin and --ws-origin, and the upgrade hook
 * of every WebSocket route (user: the serve_ctx). */
serve_origins *tern__serve_origins_new(const tern__opt_set *s, bool *too_many);
void tern__serve_origins_free(serve_origins *o);
int tern__serve_ws_upgrade(tern_http_req *req, void **conn_user, void *user);

/* serve_bench.c: the --bench-routes routes on srv (wo: the WebSocket
 * options of the other routes): 0, or the first registration's error; and
 * the end of a thread's --ws-async queue, after its loop has ended. */
int tern__serve_bench_routes(tern_server *srv, serve_ctx *ctx, const tern_ws_options *wo);
void tern__serve_later_free(serve_thread *th);

/* serve_admin.c: the admin listener, made on loop (SETUP_FAILED once said
 * why); --api-key-file's key (NULL once said why); the check of an
 * --admin-listen other than loopback (-1 once said why). */
int tern__serve_admin_setup(serve_ctx *ctx, tern_loop *loop);
char *tern__serve_read_api_key(const char *path);
int tern__serve_admin_exposed(const tern__opt_set *s);

/* serve_reload.c: SIGHUP (user: the serve_ctx). */
void tern__serve_on_sighup(tern_loop *loop, int signo, void *user);

#endif
