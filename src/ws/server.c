/* WebSocket routes and the opening handshake (RFC 6455 §4.2), and the
 * one-line server. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "http/proto.h"
#include "loop/log.h"
#include "tern/run.h"
#include "ws/handshake.h"
#include "ws/ws.h"

static int try_upgrade(tern_http_req *req, const tern__http_head *head, const char *rest,
                       size_t rest_len);
static const char *owns_path(const tern__vhost *vh, const char *path, size_t path_len);
static void free_ws_server(tern__vhost *vh);

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
        free(r->pattern);
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
    tern__ws_route *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return -ENOMEM;
    if ((r->pattern = strdup(pattern)) == NULL) {
        free(r);
        return -ENOMEM;
    }
    atomic_init(&r->dropped_said, false);
    int err = tern__ws_endpoint_init(&r->ep, h, opt, user, TERN__WS_SERVER);
    tern__ws_server *w = err ? NULL : ws_server(srv);
    if (w == NULL) {
        free(r->pattern);
        free(r);
        return err ? err : -ENOMEM;
    }
    err = tern__router_add(w->router, NULL, pattern, r);
    if (err < 0) {
        free(r->pattern);
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

static bool header_has_token(const tern__http_head *head, const char *name, const char *token) {
    for (size_t i = 0; i < head->num_headers; i++) {
        const tern__http_header *h = &head->headers[i];
        if (h->name_len == strlen(name) && strncasecmp(h->name, name, h->name_len) == 0 &&
            tern__http_has_token(h->value, h->value_len, token))
            return true;
    }
    return false;
}

/* on_upgrade ran and the connection will not open: what it set in
 * *conn_user goes back to the application, which owns it (ws.h: on_open
 * and on_close never see it). Without on_upgrade_failed, tern drops it:
 * the checked build says so, once per route (the program's code is
 * wrong, not its traffic; a refusal is the client's to repeat). */
static void upgrade_failed(tern__ws_route *route, void *conn_user, int status) {
    if (route->ep.h.on_upgrade && route->ep.h.on_upgrade_failed) {
        route->ep.h.on_upgrade_failed(conn_user, status, route->ep.user);
        return;
    }
#ifdef TERN_CHECKED
    if (conn_user != NULL && !atomic_exchange(&route->dropped_said, true))
        TERN__WARN("on_upgrade",
                   "route %s: the upgrade did not open (%d) and no on_upgrade_failed takes "
                   "back *conn_user: dropped (set on_upgrade_failed to free it)",
                   route->pattern, status);
#endif
}

/* try_upgrade's work; try_upgrade adds the log line for a refusal.
 * Past on_upgrade, every way out that does not open the connection goes
 * through upgrade_failed. */
/* The session's account for the access log (NULL without one, or out of
 * memory: the session is then not logged): method, target and peer
 * copied, and the clock started where the request's was. */
static tern__ws_acct *acct_new(tern_http_req *req) {
    tern_server *srv = req->srv;
    const tern__http_head *h = req->head;
    if (srv->cfg->access_fn == NULL || h == NULL)
        return NULL;
    char peer[TERN_ADDRSTRLEN] = "-";
    struct sockaddr_storage ss;
    socklen_t sl;
    if (tern__peer(req->conn, &ss, &sl) == 0 &&
        tern_addr_format((struct sockaddr *)&ss, sl, peer, sizeof(peer)) < 0)
        strcpy(peer, "-");
    size_t plen = strlen(peer);
    tern__ws_acct *a = calloc(1, sizeof(*a) + h->method_len + h->target_len + plen + 3);
    if (a == NULL)
        return NULL;
    a->start_ms = req->start_ms ? req->start_ms : tern_loop_now(srv->loop);
    a->status = h->protocol ? 200 : 101;   /* RFC 8441's answer is 200 */
    char *p = a->text;
    memcpy(p, h->method, h->method_len);
    p += h->method_len;
    *p++ = '\0';
    memcpy(p, h->target, h->target_len);
    p += h->target_len;
    *p++ = '\0';
    memcpy(p, peer, plen + 1);
    return a;
}

static int upgrade(tern_http_req *req, const tern__http_head *head, const char *rest,
                   size_t rest_len) {
    tern__ws_server *w = req->host->ws;
    if (w == NULL)
        return 0;   /* no WebSocket routes on this host */
    tern__route_params params;
    int status;
    tern__ws_route *route = tern__router_match(w->router, "GET", 3, head->path, head->path_len,
                                               &params, &status);
    /* HTTP/2's extended CONNECT (RFC 8441) asks with :protocol, HTTP/1.1
     * with Upgrade; the rest of the handshake is the same but the key,
     * which HTTP/2 has no use for (the stream is the connection's). */
    bool extended = head->protocol != NULL;
    bool asks = extended ? head->protocol_len == 9 &&
                               strncasecmp(head->protocol, "websocket", 9) == 0
                         : header_has_token(head, "Upgrade", "websocket");
    if (route == NULL || !asks)
        return 0;   /* not a WebSocket path, or another protocol: HTTP decides */
    if (extended) {
        if (head->method_len != 7 || memcmp(head->method, "CONNECT", 7) != 0)
            return -400;
    } else {
        if (head->method_len != 3 || memcmp(head->method, "GET", 3) != 0 ||
            head->minor_version != 1)
            return -400;
        if (head->body_kind != TERN__BODY_NONE &&
            !(head->body_kind == TERN__BODY_LENGTH && head->content_length == 0))
            return -400;
    }
    const tern__http_header *ver = tern__http_find_header(head, "Sec-WebSocket-Version");
    if (ver == NULL || ver->value_len != 2 || memcmp(ver->value, "13", 2) != 0) {
        tern_http_add_header(req, "Sec-WebSocket-Version", "13");
        return ver == NULL ? -400 : -426;
    }
    const tern__http_header *key = tern__http_find_header(head, "Sec-WebSocket-Key");
    if (!extended && (key == NULL || !tern__ws_key_valid(key->value, key->value_len)))
        return -400;

    /* Decoded for the hook, as an HTTP route's are: refused alike. */
    int derr = tern__http_params_decode(req->srv, &params, head->path_len);
    if (derr < 0)
        return derr == -ENOMEM ? -500 : -400;

    void *conn_user = NULL;
    if (route->ep.h.on_upgrade) {
        /* The hook may ask for the route's parameters ("/room/:room"):
         * they are views into this match, valid during the call only. */
        req->params = &params;
        int r = route->ep.h.on_upgrade(req, &conn_user, route->ep.user);
        req->params = NULL;
        if (r != 0) {
            int refusal = r >= 400 && r <= 599 ? r : 403;
            upgrade_failed(route, conn_user, refusal);
            return -refusal;
        }
    }

    int sub = -1;
    const tern__http_header *proto = tern__http_find_header(head, "Sec-WebSocket-Protocol");
    if (proto && route->ep.opt.subprotocols)
        sub = tern__ws_pick_subprotocol(proto->value, proto->value_len,
                                        route->ep.opt.subprotocols);
    const char *subprotocol = sub >= 0 ? route->ep.opt.subprotocols[sub] : NULL;
    tern__pmd_params pmd = {0};
    char ext[160];
    bool pmd_on = false;
    const tern__http_header *exts = tern__http_find_header(head, "Sec-WebSocket-Extensions");
    if (exts && route->ep.pmd.enabled)
        pmd_on = tern__pmd_negotiate(exts->value, exts->value_len, &route->ep.pmd, &pmd, ext,
                                     sizeof(ext)) == 1;

    char accept[TERN__WS_ACCEPT_LEN + 1];
    if (!extended)
        tern__ws_accept(key->value, key->value_len, accept);
    /* The access log's entry comes when the session ends, with what it
     * moved; what it needs of the request is copied now. */
    tern__ws_acct *acct = acct_new(req);
    /* The answer's fields, then the handler's (on_upgrade may add some):
     * the protocol under the request writes them its way and hands over
     * the byte stream (HTTP/1.1: a 101 on the connection itself; HTTP/2:
     * a 200 on the stream, which becomes a connection of its own). */
    tern__http_field f[3];
    size_t nf = 0;
    if (!extended)
        f[nf++] = (tern__http_field){"Sec-WebSocket-Accept", accept, 20, TERN__WS_ACCEPT_LEN};
    if (subprotocol)
        f[nf++] = (tern__http_field){"Sec-WebSocket-Protocol", subprotocol, 22,
                                     strlen(subprotocol)};
    if (pmd_on)
        f[nf++] = (tern__http_field){"Sec-WebSocket-Extensions", ext, 24, strlen(ext)};
    tern__conn *stream = req->proto->tunnel(req, "websocket", f, nf);
    if (stream == NULL) {
        free(acct);
        upgrade_failed(route, conn_user, 500);
        return -500;
    }
    if (tern__ws_open(stream, &route->ep, conn_user, sub, pmd_on ? &pmd : NULL, rest, rest_len,
                      acct) < 0) {
        /* No tern_ws was made: the 101 went out, the connection drops. */
        tern__conn_close(stream, -ENOMEM);
        upgrade_failed(route, conn_user, 500);
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
        if (tern_http_peer(req, &ss, &sl) < 0 ||
            tern_addr_format((struct sockaddr *)&ss, sl, peer, sizeof(peer)) < 0)
            snprintf(peer, sizeof(peer), "-");
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
