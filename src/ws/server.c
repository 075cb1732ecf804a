/* WebSocket routes and the opening handshake (RFC 6455 §4.2), and the
 * one-line server. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loop/log.h"
#include "tern/run.h"
#include "ws/handshake.h"
#include "ws/ws.h"

#define KIB 1024u

static int try_upgrade(tern_http_req *req, const tern__http_head *head, const char *rest,
                       size_t rest_len);
static const char *owns_path(const tern__vhost *vh, const char *path, size_t path_len);
static void free_ws_server(tern__vhost *vh);
static bool tern__ws_token(const char *s);

static const tern__upgrade_hook ws_hook = {try_upgrade, owns_path, free_ws_server};

/* The ws routes of the host srv adds routes to (made at the first). */
static tern__ws_server *ws_server(tern_server *srv) {
    tern__vhost *vh = srv->target;
    if (vh->ws == NULL) {
        tern__ws_server *w = calloc(1, sizeof(*w));
        if (w == NULL || (w->router = tern__router_new()) == NULL) {
            free(w);
            return NULL;
        }
        vh->ws = w;
        srv->cfg->upgrade = &ws_hook;
    }
    return vh->ws;
}

static void free_ws_server(tern__vhost *vh) {
    tern__ws_server *w = vh->ws;
    if (w == NULL)
        return;
    tern__router_free(w->router);
    while (w->routes) {
        tern__ws_route *r = w->routes;
        w->routes = r->next;
        free(r);
    }
    free(w);
    vh->ws = NULL;
}

int tern_ws_route(tern_server *srv, const char *pattern, const tern_ws_handlers *h,
                  const tern_ws_options *opt, void *user) {
    if (srv == NULL || h == NULL || pattern == NULL)
        return -EINVAL;
    if (srv->cfg->shared)
        return -EBUSY;
    /* Out-of-range options are refused rather than quietly replaced: a
     * typo should not become a server that runs with other limits. */
    if (opt && ((opt->slow_policy < TERN_WS_SLOW_CLOSE || opt->slow_policy > TERN_WS_SLOW_PAUSE) ||
                (opt->server_max_window_bits != 0 &&
                 (opt->server_max_window_bits < 9 || opt->server_max_window_bits > 15)) ||
                opt->compression_mem_level < 0 || opt->compression_mem_level > 9 ||
                (opt->backlog_soft && opt->backlog_hard && opt->backlog_soft > opt->backlog_hard)))
        return -EINVAL;
    for (size_t i = 0; opt && opt->subprotocols && opt->subprotocols[i]; i++)
        if (!tern__ws_token(opt->subprotocols[i]))
            return -EINVAL;
    tern__ws_server *w = ws_server(srv);
    if (w == NULL)
        return -ENOMEM;
    tern__ws_route *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return -ENOMEM;
    r->h = *h;
    if (opt)
        r->opt = *opt;
    tern_ws_options *o = &r->opt;
    if (!o->max_message) o->max_message = 16 * KIB * KIB;
    if (!o->idle_timeout_ms) o->idle_timeout_ms = 30000;
    if (!o->pong_timeout_ms) o->pong_timeout_ms = 30000;
    if (!o->close_timeout_ms) o->close_timeout_ms = 5000;
    if (!o->backlog_soft) o->backlog_soft = 256 * KIB;
    if (!o->backlog_grace_ms) o->backlog_grace_ms = 10000;
    if (!o->backlog_hard) o->backlog_hard = 1024 * KIB;
    if (!o->compress_min) o->compress_min = 64;
    size_t nsub = 0;
    while (o->subprotocols && o->subprotocols[nsub])
        nsub++;
    if (nsub >= TERN__WS_NO_SUBPROTOCOL) {   /* stored as a byte-sized index */
        free(r);
        return -EINVAL;
    }
    if (o->server_max_window_bits == 0)
        o->server_max_window_bits = 15;
    if (o->backlog_soft > o->backlog_hard)   /* one given, the other defaulted */
        o->backlog_hard = o->backlog_soft;
    r->pmd = (tern__pmd_config){
        .enabled = o->compression,
        .server_no_context_takeover = o->server_no_context_takeover,
        .client_no_context_takeover = o->client_no_context_takeover,
        .server_max_window_bits = o->server_max_window_bits,
        .mem_level = o->compression_mem_level,
    };
    r->user = user;
    int err = tern__router_add(w->router, NULL, pattern, r);
    if (err < 0) {
        free(r);
        return err;
    }
    r->next = w->routes;
    w->routes = r;
    return 0;
}

static const char *owns_path(const tern__vhost *vh, const char *path, size_t path_len) {
    tern__ws_server *w = vh->ws;
    if (w == NULL)
        return NULL;   /* the ws routes are another host's */
    tern__route_params params;
    int status;
    return tern__router_match(w->router, "GET", 3, path, path_len, &params, &status)
               ? "websocket"
               : NULL;
}

/* A subprotocol is an HTTP token (RFC 6455 §4.1): non-empty, no spaces,
 * commas or other separators. */
static bool tern__ws_token(const char *s) {
    if (*s == '\0')
        return false;
    for (; *s; s++)
        if ((unsigned char)*s <= 0x20 || (unsigned char)*s >= 0x7f || strchr("()<>@,;:\\\"/[]?={}", *s))
            return false;
    return true;
}

static bool header_has_token(const tern__http_head *head, const char *name, const char *token) {
    for (size_t i = 0; i < head->num_headers; i++) {
        const tern__http_header *h = &head->headers[i];
        if (h->name_len == strlen(name) && strncasecmp(h->name, name, h->name_len) == 0 &&
            tern__http_has_token(h->value, h->value_len, token))
            return true;
    }
    return false;
}

/* try_upgrade's work; try_upgrade adds the log line for a refusal. */
static int upgrade(tern_http_req *req, const tern__http_head *head, const char *rest,
                   size_t rest_len) {
    tern__ws_server *w = req->host->ws;
    if (w == NULL)
        return 0;   /* no WebSocket routes on this host */
    tern__route_params params;
    int status;
    tern__ws_route *route = tern__router_match(w->router, "GET", 3, head->path, head->path_len,
                                               &params, &status);
    if (route == NULL || !header_has_token(head, "Upgrade", "websocket"))
        return 0;   /* not a WebSocket path, or another protocol: HTTP decides */
    if (head->method_len != 3 || memcmp(head->method, "GET", 3) != 0 || head->minor_version != 1)
        return -400;
    if (head->body_kind != TERN__BODY_NONE &&
        !(head->body_kind == TERN__BODY_LENGTH && head->content_length == 0))
        return -400;
    const tern__http_header *ver = tern__http_find_header(head, "Sec-WebSocket-Version");
    if (ver == NULL || ver->value_len != 2 || memcmp(ver->value, "13", 2) != 0) {
        tern_http_add_header(req, "Sec-WebSocket-Version", "13");
        return ver == NULL ? -400 : -426;
    }
    const tern__http_header *key = tern__http_find_header(head, "Sec-WebSocket-Key");
    if (key == NULL || !tern__ws_key_valid(key->value, key->value_len))
        return -400;

    void *conn_user = NULL;
    if (route->h.on_upgrade) {
        /* The hook may ask for the route's parameters ("/room/:room"):
         * they are views into this match, valid during the call only. */
        req->params = &params;
        int r = route->h.on_upgrade(req, &conn_user, route->user);
        req->params = NULL;
        if (r != 0)
            return r >= 400 && r <= 599 ? -r : -403;
    }

    int sub = -1;
    const tern__http_header *proto = tern__http_find_header(head, "Sec-WebSocket-Protocol");
    if (proto && route->opt.subprotocols)
        sub = tern__ws_pick_subprotocol(proto->value, proto->value_len, route->opt.subprotocols);
    const char *subprotocol = sub >= 0 ? route->opt.subprotocols[sub] : NULL;
    tern__pmd_params pmd = {0};
    char ext[160];
    bool pmd_on = false;
    const tern__http_header *exts = tern__http_find_header(head, "Sec-WebSocket-Extensions");
    if (exts && route->pmd.enabled)
        pmd_on = tern__pmd_negotiate(exts->value, exts->value_len, &route->pmd, &pmd, ext,
                                     sizeof(ext)) == 1;

    char accept[TERN__WS_ACCEPT_LEN + 1];
    tern__ws_accept(key->value, key->value_len, accept);
    tern__http_conn *hc = req->hc;
    tern__http_access_record(req, 101);   /* while the connection is still HTTP's */
    char buf[1024];
    char *p = tern__http_put_status(buf, NULL, 101);
    size_t room = sizeof(buf) - (size_t)(p - buf);
    int n = snprintf(p, room,
                     "Upgrade: websocket\r\n"
                     "Connection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n%s%s%s%s%s%s",
                     accept, subprotocol ? "Sec-WebSocket-Protocol: " : "",
                     subprotocol ? subprotocol : "", subprotocol ? "\r\n" : "",
                     pmd_on ? "Sec-WebSocket-Extensions: " : "", pmd_on ? ext : "",
                     pmd_on ? "\r\n" : "");
    if (n < 0 || (size_t)n >= room - 2)
        return -500;
    struct iovec iov[3] = {{buf, (size_t)(p - buf) + (size_t)n},
                           {req->extra.data, req->extra.len},
                           {"\r\n", 2}};
    tern__conn_writev(&hc->conn, iov, 3);
    req->extra.len = 0;
    if (tern__ws_open(hc, route, conn_user, sub, pmd_on ? &pmd : NULL, rest, rest_len) < 0) {
        tern__conn_close(&hc->conn, -ENOMEM);
        return 1;
    }
    return 1;
}

int tern_ws_peer(const tern_ws *ws, struct sockaddr_storage *addr, socklen_t *len) {
    if (ws == NULL)
        return -EINVAL;
    return tern__peer(&ws->conn, addr, len);
}

static int try_upgrade(tern_http_req *req, const tern__http_head *head, const char *rest,
                       size_t rest_len) {
    int r = upgrade(req, head, rest, rest_len);
    if (r < 0 && tern__log_on(TERN_LOG_DEBUG)) {
        char peer[TERN_ADDRSTRLEN] = "-";
        struct sockaddr_storage ss;
        socklen_t sl;
        if (tern_http_peer(req, &ss, &sl) == 0)
            tern_addr_format((struct sockaddr *)&ss, sl, peer, sizeof(peer));
        tern__log(TERN_LOG_DEBUG, TERN__LOG_WS_REFUSED, "ws: upgrade of %.*s from %s refused: %d",
                  head->path_len > 200 ? 200 : (int)head->path_len, head->path, peer, -r);
    }
    return r;
}

/* ---- the one-line server ---------------------------------------------- */

typedef struct serve_args {
    const char *host;
    int port;
    const tern_ws_handlers *h;
    void *user;
} serve_args;

static int serve_setup(tern_server *srv, void *user) {
    serve_args *a = user;
    int err = tern_ws_route(srv, "/*", a->h, NULL, a->user);
    return err < 0 ? err : tern_listen(srv, a->host, a->port, NULL);
}

/* One thread of tern_run: its SIGINT/SIGTERM handling (the first shuts
 * down gracefully, a second stops at once) is the library's only one. */
int tern_ws_serve(const char *host, int port, const tern_ws_handlers *h, void *user) {
    if (h == NULL || port < 0 || port > 65535)
        return -EINVAL;
    signal(SIGPIPE, SIG_IGN);
    serve_args a = {host, port, h, user};
    return tern_run(1, NULL, serve_setup, &a);
}
