/* The HTTP server object: options, listeners, routes, graceful shutdown. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/server.h"
#include "loop/log.h"
#include "net/tls.h"

#define KIB 1024u

/* A Server header value: visible ASCII and spaces, short enough for the
 * line it goes in. */
static bool server_header_ok(const char *s) {
    if (strlen(s) > 60)
        return false;
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x7f)
            return false;
    return true;
}

static void vhost_clear(tern__vhost *vh) {
    tern__router_free(vh->router);
    vh->router = NULL;
    tern__http_static_free(vh);
    while (vh->routes) {
        tern__http_route *r = vh->routes;
        vh->routes = r->next;
        free(r);
    }
    free(vh->name);
    free(vh->handle);
}

void tern__config_ref(tern__server_config *cfg) { atomic_fetch_add(&cfg->refs, 1); }

void tern__config_unref(tern__server_config *cfg) {
    if (atomic_fetch_sub(&cfg->refs, 1) != 1)
        return;
    if (cfg->upgrade)
        cfg->upgrade->free(&cfg->host);
    while (cfg->hosts) {
        tern__vhost *vh = cfg->hosts;
        cfg->hosts = vh->next;
        if (cfg->upgrade)
            cfg->upgrade->free(vh);
        vhost_clear(vh);
        free(vh);
    }
    vhost_clear(&cfg->host);
    for (int i = 0; i < TERN__SRV_SLOTS_MAX; i++) {
        void *m = atomic_load(&cfg->slots[i]);
        if (m)
            atomic_load(&cfg->modules[i])->config_free(m);
    }
    free(cfg->peers);
    tern__http_admit_free(&cfg->admit);
    free(cfg);
}

static int srv_slots_used;

int tern__srv_slot_key(_Atomic int *key) {
    return tern__key_once(key, &srv_slots_used, TERN__SRV_SLOTS_MAX, "server module slots");
}

/* srv leaves cfg: its slot in peers says it is gone (a delivery still
 * posted to its loop reads that), then its reference goes. */
static void config_leave(tern__server_config *cfg, tern_server *srv) {
    if (srv->index < cfg->npeers && cfg->peers[srv->index] == srv)
        cfg->peers[srv->index] = NULL;
    tern__config_unref(cfg);
}

/* Adds srv to the configuration's peers (its index). */
static int add_peer(tern__server_config *cfg, tern_server *srv) {
    tern_server **p = realloc(cfg->peers, sizeof(*p) * (size_t)(cfg->npeers + 1));
    if (p == NULL)
        return -ENOMEM;
    cfg->peers = p;
    srv->index = cfg->npeers;
    p[cfg->npeers++] = srv;
    return 0;
}

/* A server on loop with cfg (a reference taken on success). */
static int server_make(tern_server **out, tern_loop *loop, tern__server_config *cfg) {
    tern_server *srv = calloc(1, sizeof(*srv));
    if (srv == NULL)
        return -ENOMEM;
    if (add_peer(cfg, srv) < 0) {
        free(srv);
        return -ENOMEM;
    }
    atomic_fetch_add(&cfg->refs, 1);
    srv->magic = TERN__MAGIC_SERVER;
    srv->loop = loop;
    tern__loop_hold(loop);   /* tern_loop_free waits for tern_server_free */
    srv->cfg = cfg;
    srv->target = &cfg->host;
    memcpy(srv->server_line, cfg->server_line, sizeof(srv->server_line));
    srv->server_line_len = cfg->server_line_len;
    srv->date_sec = -1;
    *out = srv;
    return 0;
}

int tern_server_new(tern_server **out, tern_loop *loop, const tern_server_options *opt) {
    if (out == NULL || loop == NULL)
        return -EINVAL;
    if (opt && (opt->max_headers > 256 || (opt->server_header && !server_header_ok(opt->server_header)) ||
                (opt->shutdown_ws_code != 0 && opt->shutdown_ws_code != 1001 &&
                 opt->shutdown_ws_code != 1012) ||
                (opt->http2 & ~(unsigned)(TERN_HTTP2_TLS | TERN_HTTP2_CLEARTEXT))))
        return -EINVAL;
    tern__server_config *cfg = calloc(1, sizeof(*cfg));
    if (cfg == NULL)
        return -ENOMEM;
    atomic_init(&cfg->refs, 0);
    if (opt)
        cfg->opt = *opt;
    tern_server_options *o = &cfg->opt;
    if (!o->max_head) o->max_head = 16 * KIB;
    if (!o->max_uri) o->max_uri = 8 * KIB;
    if (!o->max_headers) o->max_headers = 100;
    if (!o->max_body) o->max_body = 16 * KIB * KIB;
    if (!o->head_timeout_ms) o->head_timeout_ms = 10000;
    if (!o->body_timeout_ms) o->body_timeout_ms = 10000;
    if (!o->idle_timeout_ms) o->idle_timeout_ms = 60000;
    if (!o->send_timeout_ms) o->send_timeout_ms = 60000;
    if (!o->shutdown_timeout_ms) o->shutdown_timeout_ms = 10000;
    if (!o->shutdown_ws_code) o->shutdown_ws_code = 1001;
    if (!o->max_connections) o->max_connections = 10000;
    if (!o->max_connections_per_ip) o->max_connections_per_ip = 50;
    if (!o->http2_max_streams) o->http2_max_streams = 100;
    pthread_mutex_init(&cfg->admit.lock, NULL);
    const char *name = o->server_header ? o->server_header : "tern";
    if (*name) {   /* fits: server_header_ok bounds it */
        int n = snprintf(cfg->server_line, sizeof(cfg->server_line), "Server: %s\r\n", name);
        cfg->server_line_len = (size_t)n;
    }
    o->server_header = NULL;   /* not kept: the caller's string may go */
    cfg->limits = (tern__http_limits){o->max_head, o->max_uri, o->max_headers};
    cfg->host.router = tern__router_new();
    int err = cfg->host.router ? server_make(out, loop, cfg) : -ENOMEM;
    if (err < 0) {
        tern__router_free(cfg->host.router);
        free(cfg->peers);
        tern__http_admit_free(&cfg->admit);
        free(cfg);
    }
    return err;
}

int tern_server_clone(tern_server **out, tern_loop *loop, tern_server *srv) {
    if (out == NULL || loop == NULL || srv == NULL || srv->loop == NULL)
        return -EINVAL;
    int err = server_make(out, loop, srv->cfg);
    if (err == 0)
        srv->cfg->shared = true;
    return err;
}

tern_loop *tern_server_loop(const tern_server *srv) { return srv ? srv->loop : NULL; }
size_t tern_server_connections(const tern_server *srv) {
    return srv && srv->loop ? srv->conns.count : 0;
}

int tern_server_index(const tern_server *srv) { return srv && srv->loop ? srv->index : -EINVAL; }
int tern_server_peer_count(const tern_server *srv) { return srv ? srv->cfg->npeers : -EINVAL; }
tern_server *tern_server_peer(const tern_server *srv, int index) {
    if (srv == NULL || index < 0 || index >= srv->cfg->npeers)
        return NULL;
    return srv->cfg->peers[index];
}

int tern_server_stats(const tern_server *srv, tern_stats *out) {
    if (srv == NULL || out == NULL || srv->loop == NULL)
        return -EINVAL;
#define LOAD(f) TERN__COUNTER_GET(srv->stats.f)
    uint64_t closed = LOAD(closed);
    out->accepted = LOAD(accepted);
    out->connections = out->accepted > closed ? out->accepted - closed : 0;
    out->requests = LOAD(requests);
    out->ws_messages_in = LOAD(ws_in);
    out->ws_messages_out = LOAD(ws_out);
    out->bytes_in = LOAD(bytes_in);
    out->bytes_out = LOAD(bytes_out);
    out->refused_max_connections = LOAD(refused_max);
    out->refused_per_ip = LOAD(refused_ip);
    out->listeners = LOAD(listeners);
    out->listeners_paused = LOAD(listeners_paused);
#undef LOAD
    return 0;
}

/* The listener just made at srv->listeners[srv->nlisteners] joins the
 * others, and the counters tern_server_stats reads. */
static void listener_added(tern_server *srv) {
    tern__listener_count_pauses(srv->listeners[srv->nlisteners], &srv->stats.listeners_paused);
    srv->nlisteners++;
    TERN__STAT_ADD(srv, listeners, 1);
}

/* The session-length histogram's upper bounds, in microseconds: 0.1 s,
 * 0.5 s, 1 s, 5 s, 10 s, 30 s, 1 min, 5 min, 10 min, 30 min, 1 h, 3 h,
 * 6 h, 12 h, 1 day. */
static const uint64_t ws_len_le_us[TERN_HISTOGRAM_BUCKETS] = {
    100000ull, 500000ull, 1000000ull, 5000000ull, 10000000ull, 30000000ull, 60000000ull,
    300000000ull, 600000000ull, 1800000000ull, 3600000000ull, 10800000000ull,
    21600000000ull, 43200000000ull, 86400000000ull};

void tern__server_ws_session_ended(tern_server *srv, uint64_t ms) {
    size_t i = tern_histogram_bucket(ws_len_le_us, TERN_HISTOGRAM_BUCKETS, ms * 1000);
    if (i < TERN_HISTOGRAM_BUCKETS)
        TERN__STAT_ADD(srv, ws_len[i], 1);
    TERN__STAT_ADD(srv, ws_len_sum_ms, ms);
    TERN__STAT_ADD(srv, ws_len_count, 1);
}

int tern_server_ws_sessions(const tern_server *srv, tern_histogram *out) {
    if (srv == NULL || out == NULL || srv->loop == NULL)
        return -EINVAL;
    *out = (tern_histogram){0};
    uint64_t below = 0;
    for (size_t i = 0; i < TERN_HISTOGRAM_BUCKETS; i++) {
        below += atomic_load_explicit(&srv->stats.ws_len[i], memory_order_relaxed);
        out->le_us[i] = ws_len_le_us[i];
        out->below[i] = below;
    }
    out->sum_us = atomic_load_explicit(&srv->stats.ws_len_sum_ms, memory_order_relaxed) * 1000;
    out->count = atomic_load_explicit(&srv->stats.ws_len_count, memory_order_relaxed);
    /* Read while the loop counts: a bucket may be ahead of the count. */
    if (out->count < below)
        out->count = below;
    return 0;
}

int tern_server_responses(const tern_server *srv, uint64_t out[TERN_HTTP_STATUS_COUNT]) {
    if (srv == NULL || out == NULL || srv->loop == NULL)
        return -EINVAL;
    for (size_t i = 0; i < TERN_HTTP_STATUS_COUNT; i++)
        out[i] = atomic_load_explicit(&srv->stats.status[i], memory_order_relaxed);
    return 0;
}

static void close_listeners(tern_server *srv) {
    for (int i = 0; i < srv->nlisteners; i++)
        tern__listener_close(srv->listeners[i]);
    srv->nlisteners = 0;
    atomic_store_explicit(&srv->stats.listeners, 0, memory_order_relaxed);
}

static void close_all(tern_server *srv) {
    while (srv->conns.head)
        tern__conn_close(srv->conns.head, -ECANCELED);
}

/* The rest of tern_server_free, once no callback of the loop is running. */
static void server_finish_free(tern_server *srv) {
    /* The closed connections' structs are freed at the batch end; run it
     * now, since the loop may not iterate again. */
    tern__net_flush(srv->loop);
    for (int i = 0; i < TERN__SRV_SLOTS_MAX; i++)
        if (atomic_load(&srv->slots[i]))
            atomic_load(&srv->cfg->modules[i])->server_free(srv);
    tern_timer_stop(srv->shutdown_timer);
    tern_timer_stop(srv->free_timer);
    for (int i = 0; i < srv->nhttps; i++)
        tern_tls_free(srv->https[i].tls);
    for (int i = 0; i < TERN__MAX_LISTENERS; i++)
        free(srv->specs[i].host);
    tern__http_access_drop(srv);
    free(srv->scratch_decoded);
    config_leave(srv->cfg, srv);
    tern__loop_release(srv->loop);
    srv->magic = TERN__MAGIC_DEAD;
    tern__check_free(srv);
}

static void server_free_due(tern_timer *t, void *user) { server_finish_free(user); }

void tern_server_free(tern_server *srv) {
    if (srv == NULL)
        return;
    TERN__ASSERT_MAGIC(srv, TERN__MAGIC_SERVER, "server");
    if (srv->loop == NULL)
        return;   /* a host handle goes with its configuration */
    TERN__ASSERT_LOOP_THREAD(srv->loop);
    if (srv->free_timer)
        return;   /* freed already, inside a callback: the rest is due */
    srv->freeing = true;
    close_listeners(srv);
    srv->done = NULL;
    close_all(srv);
    /* Inside a callback of the running loop (one of srv's own handlers,
     * typically), the request being handled, its connection and its route
     * are still in use by the code that called the handler: the server
     * struct and its configuration go once it has returned, from a 0 ms
     * timer (which fires in this iteration, after the batch end). Without
     * memory for the timer, the server stays (closed) and is not freed. */
    if (tern__loop_current() == srv->loop) {
        if (tern_timer_start(srv->loop, &srv->free_timer, 0, 0, server_free_due, srv) < 0)
            tern__log(TERN_LOG_ERROR, TERN__LOG_MISUSE,
                      "tern_server_free: out of memory inside a callback: the server leaks");
        return;
    }
    server_finish_free(srv);
}

static bool listen_options_ok(const tern_listen_options *opt) {
    return opt == NULL || (opt->backlog >= 0 && opt->sndbuf >= 0);
}

/* The options a listener of srv gets: under tern_run with several loops,
 * SO_REUSEPORT, so that every loop can listen on the same address. */
static tern_listen_options listen_opt(const tern_server *srv, const tern_listen_options *opt) {
    tern_listen_options o = opt ? *opt : (tern_listen_options){0};
    if (srv->cfg->reuseport)
        o.reuseport = 1;
    return o;
}

/* Refuses what a listen call may not do: a host handle, or no room. */
static int listen_check(const tern_server *srv) {
    if (srv->loop == NULL)
        return -EINVAL;
    if (srv->nlisteners == TERN__MAX_LISTENERS || srv->shutting_down)
        return -ENOSPC;
    return 0;
}

/* Remembers what listener i was opened with (see tern__listen_spec). */
static void keep_spec(tern_server *srv, int i, const char *host, int port, tern_tls *tls,
                      const tern_listen_options *o) {
    tern__listen_spec *sp = &srv->specs[i];
    free(sp->host);
    sp->host = host ? strdup(host) : NULL;   /* NULL on ENOMEM: then "any", as tern_listen's NULL */
    sp->port = port;
    sp->tls = tls;
    sp->opt = *o;
}

/* tern_listen and tern_listen_tls (tls set), and their repeats on
 * tern_run's other loops (exclusive false). A listener whose SO_REUSEPORT
 * only tern_run asked for is exclusive: the first loop's refuses a port
 * another socket listens on; one the caller asked to share
 * (opt->reuseport) is not. */
static int listen_tcp(tern_server *srv, const char *host, int port, tern_tls *tls,
                      const tern_listen_options *opt, bool exclusive) {
    if (srv == NULL || port < 0 || port > 65535 || !listen_options_ok(opt))
        return -EINVAL;
    int err = listen_check(srv);
    if (err < 0)
        return err;
    tern_listen_options o = listen_opt(srv, opt);
    exclusive = exclusive && !(opt && opt->reuseport);
    int i = srv->nlisteners;
    tern__https_listener *l = tls ? &srv->https[srv->nhttps] : NULL;
    if (l)
        *l = (tern__https_listener){.srv = srv, .tls = tls, .index = i};
    err = tern__listener_tcp(srv->loop, host, port, &o, exclusive,
                             l ? tern__https_accept : tern__http_accept,
                             l ? (void *)l : (void *)srv, &srv->listeners[i]);
    if (err == 0) {
        if (tls) {
            tern__tls_ref(tls);
            srv->nhttps++;
        }
        keep_spec(srv, i, host, tern__listener_port(srv->listeners[i]), tls, &o);
        listener_added(srv);
    }
    return err;
}

int tern_listen(tern_server *srv, const char *host, int port, const tern_listen_options *opt) {
    return listen_tcp(srv, host, port, NULL, opt, true);
}

int tern_listen_tls(tern_server *srv, const char *host, int port, tern_tls *tls,
                    const tern_listen_options *opt) {
    if (tls == NULL)
        return -EINVAL;
    return listen_tcp(srv, host, port, tls, opt, true);
}

int tern_listen_unix(tern_server *srv, const char *path, const tern_listen_options *opt) {
    if (srv == NULL || path == NULL || *path == '\0' || !listen_options_ok(opt))
        return -EINVAL;
    int err = listen_check(srv);
    if (err < 0)
        return err;
    int i = srv->nlisteners;
    err = tern__listener_unix(srv->loop, path, opt, tern__http_accept, srv, &srv->listeners[i]);
    if (err == 0) {
        tern_listen_options o = opt ? *opt : (tern_listen_options){0};
        keep_spec(srv, i, path, -1, NULL, &o);
        listener_added(srv);
    }
    return err;
}

int tern_listen_fd(tern_server *srv, int fd, tern_tls *tls, const tern_listen_options *opt) {
    if (srv == NULL || fd < 0 || !listen_options_ok(opt))
        return -EINVAL;
    int err = listen_check(srv);
    if (err < 0)
        return err;
    tern_listen_options o = listen_opt(srv, opt);
    int i = srv->nlisteners;
    tern__https_listener *l = tls ? &srv->https[srv->nhttps] : NULL;
    if (l)
        *l = (tern__https_listener){.srv = srv, .tls = tls, .index = i};
    err = tern__listener_fd(srv->loop, fd, &o, l ? tern__https_accept : tern__http_accept,
                            l ? (void *)l : (void *)srv, &srv->listeners[i]);
    if (err == 0) {
        if (tls) {
            tern__tls_ref(tls);
            srv->nhttps++;
        }
        keep_spec(srv, i, NULL, -1, tls, &o);   /* -1: clones share the socket */
        listener_added(srv);
    }
    return err;
}

/* Opens on clone the listeners srv has: TCP ones on the same address and
 * the port srv got (SO_REUSEPORT: each loop has its own accept queue);
 * Unix ones and inherited ones (tern_listen_fd) share srv's socket (a
 * Unix socket has no SO_REUSEPORT balancing, and binding the path again
 * would take it from srv; an inherited one is not ours to bind again). */
int tern__server_listen_like(tern_server *clone, const tern_server *srv) {
    for (int i = 0; i < srv->nlisteners; i++) {
        const tern__listen_spec *sp = &srv->specs[i];
        int err, j = clone->nlisteners;
        if (sp->port < 0) {
            tern__https_listener *l = sp->tls ? &clone->https[clone->nhttps] : NULL;
            if (l)
                *l = (tern__https_listener){.srv = clone, .tls = sp->tls, .index = j};
            err = tern__listener_dup(clone->loop, srv->listeners[i], &sp->opt,
                                     l ? tern__https_accept : tern__http_accept,
                                     l ? (void *)l : (void *)clone, &clone->listeners[j]);
            if (err == 0) {
                if (l) {
                    tern__tls_ref(sp->tls);
                    clone->nhttps++;
                }
                keep_spec(clone, j, sp->host, -1, sp->tls, &sp->opt);
                listener_added(clone);
            }
        } else {
            err = listen_tcp(clone, sp->host, sp->port, sp->tls, &sp->opt, false);
        }
        if (err < 0)
            return err;
    }
    return 0;
}

int tern_server_tls_port(const tern_server *srv) {
    if (srv == NULL)
        return -EINVAL;
    for (int i = 0; i < srv->nhttps; i++) {
        int p = tern__listener_port(srv->listeners[srv->https[i].index]);
        if (p > 0)
            return p;
    }
    return -ENOENT;
}

/* The first plain TCP listener's port: TLS ones are tern_server_tls_port's
 * (a server listening TLS first would otherwise hide its plain port), Unix
 * ones have none (port 0). */
int tern_server_port(const tern_server *srv) {
    if (srv == NULL)
        return -EINVAL;
    for (int i = 0; i < srv->nlisteners; i++) {
        if (srv->specs[i].tls != NULL)
            continue;
        int p = tern__listener_port(srv->listeners[i]);
        if (p > 0)
            return p;
    }
    return -ENOENT;
}

/* Whether srv's configuration may still change: not once a clone shares
 * it (other loops may be reading it). */
static int config_open(const tern_server *srv) {
    if (srv == NULL)
        return -EINVAL;
    return srv->cfg->shared ? -EBUSY : 0;
}

static int add_route(tern_server *srv, const char *method, const char *pattern,
                     tern_http_handler fn, void *user, bool stream) {
    if (srv == NULL || fn == NULL || pattern == NULL)
        return -EINVAL;
    int err = config_open(srv);
    if (err < 0)
        return err;
    tern__vhost *vh = srv->target;
    tern__http_route *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return -ENOMEM;
    r->fn = fn;
    r->user = user;
    r->stream = stream;
    if (method && strcmp(method, "*") != 0 && strlen(method) < sizeof(r->method))
        strcpy(r->method, method);
    err = tern__router_add(vh->router, method, pattern, r);
    if (err < 0) {
        free(r);
        return err;
    }
    r->next = vh->routes;
    vh->routes = r;
    return 0;
}

int tern_http_route(tern_server *srv, const char *method, const char *pattern,
                    tern_http_handler fn, void *user) {
    return add_route(srv, method, pattern, fn, user, false);
}

int tern_http_route_stream(tern_server *srv, const char *method, const char *pattern,
                           tern_http_handler fn, void *user) {
    return add_route(srv, method, pattern, fn, user, true);
}

int tern_http_not_found(tern_server *srv, tern_http_handler fn, void *user) {
    int err = config_open(srv);
    if (err < 0)
        return err;
    srv->target->not_found.fn = fn;
    srv->target->not_found.user = user;
    return 0;
}

int tern_server_set_access_log(tern_server *srv, tern_http_access_fn fn, void *user) {
    int err = config_open(srv);
    if (err < 0)
        return err;
    srv->cfg->access_fn = fn;
    srv->cfg->access_user = user;
    return 0;
}

/* ---- hosts -------------------------------------------------------------- */

/* A host name as tern_server_host takes it: letters, digits, '-', '_'
 * and '.', 1 to 253 bytes (an IPv4 address is one too). */
static bool host_name_ok(const char *s, size_t len) {
    if (len == 0 || len > 253)
        return false;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.'))
            return false;
    }
    return true;
}

static bool name_eq(const char *a, const char *b, size_t len) {
    for (size_t i = 0; i < len; i++) {
        unsigned char x = (unsigned char)a[i], y = (unsigned char)b[i];
        if (x >= 'A' && x <= 'Z') x += 32;
        if (y >= 'A' && y <= 'Z') y += 32;
        if (x != y)
            return false;
    }
    return true;
}

const tern__vhost *tern__vhost_find(const tern__server_config *cfg, const char *name, size_t len) {
    if (cfg->hosts == NULL || name == NULL)
        return &cfg->host;
    if (len && name[0] == '[') {   /* an IPv6 literal: its port follows the ']' */
        const char *e = memchr(name, ']', len);
        if (e)
            len = (size_t)(e - name) + 1;
    } else {
        const char *colon = memchr(name, ':', len);
        if (colon)
            len = (size_t)(colon - name);
    }
    while (len && name[len - 1] == '.')   /* "example.com." is example.com */
        len--;
    for (const tern__vhost *vh = cfg->hosts; vh; vh = vh->next)
        if (vh->name_len == len && name_eq(vh->name, name, len))
            return vh;
    return &cfg->host;
}

int tern_server_host(tern_server *srv, const char *name, tern_server **out) {
    if (srv == NULL || name == NULL || out == NULL)
        return -EINVAL;
    size_t len = strlen(name);
    while (len && name[len - 1] == '.')
        len--;
    if (!host_name_ok(name, len))
        return -EINVAL;
    tern__server_config *cfg = srv->cfg;
    for (tern__vhost *vh = cfg->hosts; vh; vh = vh->next)
        if (vh->name_len == len && name_eq(vh->name, name, len)) {
            *out = vh->handle;
            return 0;
        }
    int err = config_open(srv);
    if (err < 0)
        return err;
    tern__vhost *vh = calloc(1, sizeof(*vh));
    tern_server *h = calloc(1, sizeof(*h));
    char *copy = malloc(len + 1);
    tern__router *router = tern__router_new();
    if (vh == NULL || h == NULL || copy == NULL || router == NULL) {
        free(vh);
        free(h);
        free(copy);
        tern__router_free(router);
        return -ENOMEM;
    }
    for (size_t i = 0; i < len; i++)
        copy[i] = (char)(name[i] >= 'A' && name[i] <= 'Z' ? name[i] + 32 : name[i]);
    copy[len] = '\0';
    h->magic = TERN__MAGIC_SERVER;
    vh->name = copy;
    vh->name_len = len;
    vh->router = router;
    vh->handle = h;
    h->cfg = cfg;       /* loop NULL: a handle that only takes routes */
    h->target = vh;
    h->index = -1;
    vh->next = cfg->hosts;
    cfg->hosts = vh;
    *out = h;
    return 0;
}

bool tern__http_method_known(const tern_server *srv, const char *m, size_t len) {
    static const char *const standard[] = {"GET", "HEAD", "POST", "PUT", "DELETE",
                                           "CONNECT", "OPTIONS", "TRACE", "PATCH"};
    for (size_t i = 0; i < sizeof(standard) / sizeof(standard[0]); i++)
        if (strlen(standard[i]) == len && memcmp(standard[i], m, len) == 0)
            return true;
    const tern__server_config *cfg = srv->cfg;
    for (const tern__vhost *vh = &cfg->host; vh; vh = vh == &cfg->host ? cfg->hosts : vh->next)
        for (const tern__http_route *r = vh->routes; r; r = r->next)
            if (r->method[0] == '\0' ||   /* an any-method route implements every one */
                (strlen(r->method) == len && memcmp(r->method, m, len) == 0))
                return true;
    return false;
}

/* ---- graceful shutdown ------------------------------------------------ */

static void shutdown_finished(tern_server *srv) {
    tern_server_done_fn done = srv->done;
    srv->done = NULL;
    tern_timer_stop(srv->shutdown_timer);
    srv->shutdown_timer = NULL;
    if (done)
        done(srv, srv->done_user);
}

/* Called by the connections' on_close (every accepted connection's, once). */
void tern__http_conn_closed_by_server(tern_server *srv, const tern__conn *c) {
    /* A stream carried by a connection (a WebSocket over HTTP/2, no
     * descriptor of its own) was never accepted: "connections" counts
     * sockets. */
    if (c->io.fd >= 0)
        TERN__STAT_ADD(srv, closed, 1);
    tern__http_release(srv, c->owner_tag);
    if (srv->shutting_down && srv->conns.count == 0 && srv->done)
        shutdown_finished(srv);
}

static void shutdown_timeout(tern_timer *t, void *user) {
    tern_server *srv = user;
    close_all(srv);
    if (srv->done)
        shutdown_finished(srv);
}

void tern_server_shutdown(tern_server *srv, tern_server_done_fn done, void *user) {
    if (srv == NULL || srv->loop == NULL || srv->shutting_down)
        return;
    srv->shutting_down = true;
    close_listeners(srv);
    /* Idle connections go now; busy ones close when their response ends
     * (the connection layer sees shutting_down). done is set only after
     * this, so that it never runs inside this call: when nothing is left,
     * it follows from a timer that fires at once. */
    tern__conn *c = srv->conns.head;
    while (c) {
        tern__conn *next = c->list_next;
        c->proto->on_shutdown(c);
        c = next;
    }
    srv->done = done;
    srv->done_user = user;
    uint64_t wait = srv->conns.count == 0 ? 0 : srv->cfg->opt.shutdown_timeout_ms;
    if (tern_timer_start(srv->loop, &srv->shutdown_timer, wait, 0, shutdown_timeout, srv) < 0) {
        srv->shutdown_timer = NULL;
        if (srv->conns.count == 0)
            shutdown_finished(srv);   /* out of memory: better now than never */
    }
}
