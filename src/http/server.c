/* The HTTP server object: options, listeners, routes, graceful shutdown. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/server.h"
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

int tern_server_new(tern_server **out, tern_loop *loop, const tern_server_options *opt) {
    if (out == NULL || loop == NULL)
        return -EINVAL;
    if (opt && (opt->max_headers > 256 || (opt->server_header && !server_header_ok(opt->server_header))))
        return -EINVAL;
    tern_server *srv = calloc(1, sizeof(*srv));
    if (srv == NULL)
        return -ENOMEM;
    srv->loop = loop;
    if (opt)
        srv->opt = *opt;
    tern_server_options *o = &srv->opt;
    if (!o->max_head) o->max_head = 16 * KIB;
    if (!o->max_uri) o->max_uri = 8 * KIB;
    if (!o->max_headers) o->max_headers = 100;
    if (!o->max_body) o->max_body = 16 * KIB * KIB;
    if (!o->head_timeout_ms) o->head_timeout_ms = 10000;
    if (!o->body_timeout_ms) o->body_timeout_ms = 10000;
    if (!o->idle_timeout_ms) o->idle_timeout_ms = 60000;
    if (!o->send_timeout_ms) o->send_timeout_ms = 60000;
    if (!o->shutdown_timeout_ms) o->shutdown_timeout_ms = 10000;
    const char *name = o->server_header ? o->server_header : "tern";
    if (*name) {   /* fits: server_header_ok bounds it */
        int n = snprintf(srv->server_line, sizeof(srv->server_line), "Server: %s\r\n", name);
        srv->server_line_len = (size_t)n;
    }
    o->server_header = NULL;   /* not kept: the caller's string may go */
    srv->limits = (tern__http_limits){o->max_head, o->max_uri, o->max_headers};
    srv->router = tern__router_new();
    if (srv->router == NULL) {
        free(srv);
        return -ENOMEM;
    }
    srv->date_sec = -1;
    *out = srv;
    return 0;
}

tern_loop *tern_server_loop(const tern_server *srv) { return srv ? srv->loop : NULL; }
size_t tern_server_connections(const tern_server *srv) { return srv ? srv->conns.count : 0; }

static void close_listeners(tern_server *srv) {
    for (int i = 0; i < srv->nlisteners; i++)
        tern__listener_close(srv->listeners[i]);
    srv->nlisteners = 0;
}

static void close_all(tern_server *srv) {
    while (srv->conns.head)
        tern__conn_close(srv->conns.head, -ECANCELED);
}

void tern_server_free(tern_server *srv) {
    if (srv == NULL)
        return;
    close_listeners(srv);
    srv->done = NULL;
    close_all(srv);
    /* The closed connections' structs are freed at the batch end; run it
     * now, since the loop may not iterate again. */
    tern__net_flush(srv->loop);
    tern_timer_stop(srv->shutdown_timer);
    for (int i = 0; i < srv->nhttps; i++)
        tern_tls_free(srv->https[i].tls);
    tern__router_free(srv->router);
    tern__http_access_drop(srv);
    tern__http_static_free(srv);
    if (srv->upgrade)
        srv->upgrade->free(srv);
    while (srv->routes) {
        tern__http_route *r = srv->routes;
        srv->routes = r->next;
        free(r);
    }
    free(srv);
}

static bool listen_options_ok(const tern_listen_options *opt) {
    return opt == NULL || opt->backlog >= 0;
}

int tern_listen(tern_server *srv, const char *host, int port, const tern_listen_options *opt) {
    if (srv == NULL || port < 0 || port > 65535 || !listen_options_ok(opt))
        return -EINVAL;
    if (srv->nlisteners == TERN__MAX_LISTENERS || srv->shutting_down)
        return -ENOSPC;
    int err = tern__listener_tcp(srv->loop, host, port, opt, tern__http_accept, srv,
                                 &srv->listeners[srv->nlisteners]);
    if (err == 0)
        srv->nlisteners++;
    return err;
}

int tern_listen_tls(tern_server *srv, const char *host, int port, tern_tls *tls,
                    const tern_listen_options *opt) {
    if (srv == NULL || tls == NULL || port < 0 || port > 65535 || !listen_options_ok(opt))
        return -EINVAL;
    if (srv->nlisteners == TERN__MAX_LISTENERS || srv->shutting_down)
        return -ENOSPC;
    tern__https_listener *l = &srv->https[srv->nhttps];
    l->srv = srv;
    l->tls = tls;
    l->index = srv->nlisteners;
    int err = tern__listener_tcp(srv->loop, host, port, opt, tern__https_accept, l,
                                 &srv->listeners[srv->nlisteners]);
    if (err == 0) {
        tern__tls_ref(tls);
        srv->nhttps++;
        srv->nlisteners++;
    }
    return err;
}

int tern_listen_unix(tern_server *srv, const char *path, const tern_listen_options *opt) {
    if (srv == NULL || path == NULL || *path == '\0' || !listen_options_ok(opt))
        return -EINVAL;
    if (srv->nlisteners == TERN__MAX_LISTENERS || srv->shutting_down)
        return -ENOSPC;
    int err = tern__listener_unix(srv->loop, path, opt, tern__http_accept, srv,
                                  &srv->listeners[srv->nlisteners]);
    if (err == 0)
        srv->nlisteners++;
    return err;
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

int tern_server_port(const tern_server *srv) {
    if (srv == NULL)
        return -EINVAL;
    for (int i = 0; i < srv->nlisteners; i++) {
        int p = tern__listener_port(srv->listeners[i]);
        if (p > 0)
            return p;
    }
    return -ENOENT;
}

static int add_route(tern_server *srv, const char *method, const char *pattern,
                     tern_http_handler fn, void *user, bool stream) {
    if (srv == NULL || fn == NULL || pattern == NULL)
        return -EINVAL;
    tern__http_route *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return -ENOMEM;
    r->fn = fn;
    r->user = user;
    r->stream = stream;
    if (method && strcmp(method, "*") != 0 && strlen(method) < sizeof(r->method))
        strcpy(r->method, method);
    int err = tern__router_add(srv->router, method, pattern, r);
    if (err < 0) {
        free(r);
        return err;
    }
    r->next = srv->routes;
    srv->routes = r;
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
    if (srv == NULL)
        return -EINVAL;
    srv->not_found.fn = fn;
    srv->not_found.user = user;
    return 0;
}

int tern_server_set_access_log(tern_server *srv, tern_http_access_fn fn, void *user) {
    if (srv == NULL)
        return -EINVAL;
    srv->access_fn = fn;
    srv->access_user = user;
    return 0;
}

bool tern__http_method_known(const tern_server *srv, const char *m, size_t len) {
    static const char *const standard[] = {"GET", "HEAD", "POST", "PUT", "DELETE",
                                           "CONNECT", "OPTIONS", "TRACE", "PATCH"};
    for (size_t i = 0; i < sizeof(standard) / sizeof(standard[0]); i++)
        if (strlen(standard[i]) == len && memcmp(standard[i], m, len) == 0)
            return true;
    for (const tern__http_route *r = srv->routes; r; r = r->next)
        if (strlen(r->method) == len && memcmp(r->method, m, len) == 0)
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

/* Called by the connections' on_close. */
void tern__http_conn_closed_by_server(tern_server *srv) {
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
    if (srv == NULL || srv->shutting_down)
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
    uint64_t wait = srv->conns.count == 0 ? 0 : srv->opt.shutdown_timeout_ms;
    if (tern_timer_start(srv->loop, &srv->shutdown_timer, wait, 0, shutdown_timeout, srv) < 0) {
        srv->shutdown_timer = NULL;
        if (srv->conns.count == 0)
            shutdown_finished(srv);   /* out of memory: better now than never */
    }
}
