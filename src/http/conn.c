/* One HTTP/1.1 connection: the request state machine.
 *
 * Bytes come in through on_data (a view of the loop's read buffer). Heads
 * are found and parsed in place; handlers get views into those bytes. A
 * body that arrives in the same read as its head is handed over in place
 * too; only a body that spans reads is gathered into the request's buffer.
 * Requests are handled one at a time: while a response is pending the
 * connection stops reading, and the bytes of pipelined requests behind it
 * wait in the connection (net keeps what on_data does not consume). */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "http/proto.h"
#include "http/server.h"
#include "net/tls.h"
#include "platform/platform.h"

enum { TERN__HTTP_CLOSING = 100 };   /* an error went out, or end() was called */

static size_t on_data(tern__conn *c, char *data, size_t len);
static void on_eof(tern__conn *c);
static void on_drain(tern__conn *c);
static void on_timeout(tern__conn *c);
static void on_shutdown(tern__conn *c);
static void on_close(tern__conn *c, int err);
static void on_hangup(tern__conn *c);
static void on_deferred(tern__conn *c);
static uint32_t send_timeout(const tern__conn *c);

static const tern__conn_proto http_proto = {
    .on_data = on_data,
    .on_eof = on_eof,
    .on_drain = on_drain,
    .on_timeout = on_timeout,
    .on_shutdown = on_shutdown,
    .on_close = on_close,
    .on_hangup = on_hangup,
    .on_deferred = on_deferred,
    .send_timeout = send_timeout,
};

static bool conn_gone(const tern__http_conn *hc) {
    return (hc->conn.flags & TERN__CONN_CLOSED) || hc->state == TERN__HTTP_CLOSING;
}

/* tls: over TLS (a refusal is a close: a plain 503 would mean nothing to
 * the client). */
static tern__http_conn *accept_conn(tern_server *srv, int fd, bool tls) {
    uint16_t tag;
    int refused = tern__http_admit(srv, fd, &tag);
    if (refused) {
        /* Before a byte is parsed or a struct allocated: a flood of
         * connections costs an accept, a send and a close each. */
        if (refused == 1)
            TERN__STAT_ADD(srv, refused_max, 1);
        else
            TERN__STAT_ADD(srv, refused_ip, 1);
        if (!tls)
            TERN__STAT_STATUS(srv, 503);
        tern__http_log_limit_refusal(refused == 1);
        tern__http_refuse(fd, tls);
        return NULL;
    }
    tern__http_conn *hc = calloc(1, sizeof(*hc));
    if (hc == NULL) {
        tern__http_release(srv, tag);
        close(fd);
        return NULL;
    }
    if (tern__conn_start(srv->loop, &hc->conn, fd, &http_proto, &srv->conns) < 0) {
        tern__http_release(srv, tag);
        close(fd);
        free(hc);
        return NULL;
    }
    hc->conn.owner_tag = tag;
    hc->srv = srv;
    hc->state = TERN__HTTP_IDLE;
    TERN__STAT_ADD(srv, accepted, 1);
    /* A fresh connection gets the head timeout, not the (longer) idle one:
     * a client that connects and says nothing is the slowloris shape. Over
     * TLS the handshake counts against it too. */
    tern__conn_set_timeout(&hc->conn, srv->cfg->opt.head_timeout_ms);
    return hc;
}

void tern__http_accept(void *user, int fd) {
    tern_server *srv = user;
    tern__http_conn *hc = accept_conn(srv, fd, false);
    if (hc)
        hc->h2_ok = srv->cfg->opt.http2 & TERN_HTTP2_CLEARTEXT;
}

/* ALPN on the TLS port: "h2" first when the server serves HTTP/2, then
 * HTTP/1.1 (a WebSocket upgrade is an HTTP/1.1 request). */
#define HTTPS_ALPN "\x08http/1.1"
#define HTTPS_ALPN_H2 "\x02h2\x08http/1.1"

void tern__https_accept(void *user, int fd) {
    tern__https_listener *l = user;
    tern__http_conn *hc = accept_conn(l->srv, fd, true);
    if (hc == NULL)
        return;
    hc->h2_ok = l->srv->cfg->opt.http2 & TERN_HTTP2_TLS;
    if (tern__tls_attach(&hc->conn, l->tls, hc->h2_ok ? HTTPS_ALPN_H2 : HTTPS_ALPN) < 0)
        tern__conn_close(&hc->conn, -ENOMEM);
}

/* HTTP/2's connection preface (RFC 9113 §3.4): a client that chose h2 by
 * ALPN, or knows the plain port speaks it (h2c with prior knowledge),
 * starts with it. */
static const char h2_preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
#define H2_PREFACE_LEN (sizeof(h2_preface) - 1)

/* A fresh connection of a listener serving HTTP/2: 1 when data[0..len)
 * is the preface (the connection moved to h2.c, or closed), 0 when it
 * may still be (wait for more), -1 when it is HTTP/1.1. A client that
 * chose h2 by ALPN and sends no preface is closed unanswered (RFC 9113
 * §3.4): it asked for no HTTP/1.1. */
static int try_h2(tern__http_conn *hc, const char *data, size_t len) {
    size_t n = len < H2_PREFACE_LEN ? len : H2_PREFACE_LEN;
    if (memcmp(data, h2_preface, n) != 0) {
        hc->h2_ok = false;
        if (tern__tls_alpn_is(&hc->conn, "h2")) {
            tern__conn_close(&hc->conn, -EPROTO);
            return 1;
        }
        return -1;
    }
    if (n < H2_PREFACE_LEN)
        return 0;
    hc->h2_ok = false;
    if (tern__h2_start(hc, data, len) < 0)
        tern__conn_close(&hc->conn, -ENOMEM);
    return 1;
}

/* Sends an error response that closes the connection. */
static void fail_request(tern__http_conn *hc, int status) {
    if (conn_gone(hc))
        return;
    tern__http_error(hc, status);
    hc->state = TERN__HTTP_CLOSING;
}

/* The same for a request whose head was read: the access log and the
 * debug line name its method and target rather than "-". */
static void fail_request_for(tern__http_conn *hc, int status, const char *m, size_t ml,
                             const char *t, size_t tl) {
    if (conn_gone(hc))
        return;
    tern__http_error_for(hc, status, m, ml, t, tl);
    hc->state = TERN__HTTP_CLOSING;
}

/* The handler that just returned freed its own server (tern_server_free,
 * which closed the connection): the request it was handling cannot wait
 * for an answer given later, as an orphan without an abort callback
 * otherwise does, since its server goes at the end of this iteration and
 * nothing would ever free it. It ends here, its abort callback told. */
static void settle_with_server(tern_http_req *req) {
    if (req->dispatched && !req->ended && req->abort_fn)
        req->abort_fn(req, req->abort_user);
    tern__http_req_free(req);
}

/* ---- dispatch --------------------------------------------------------- */

/* tern__http_call_handler's body, static so that HTTP/1.1's calls on the
 * hot path stay calls within this file, as they were before HTTP/2's. */
static void call_handler(tern_http_req *req, const tern__http_head *head,
                         const tern__route_params *params, const char *body, size_t body_len) {
    req->live = true;
    req->dispatched = true;
    req->head = head;
    req->params = params;
    req->body = body;
    req->body_len = body_len;
    tern__http_access_begin(req);
    req->route->fn(req, req->route->user);
    tern__http_access_keep(req);
    req->live = false;
    req->head = NULL;
    req->params = NULL;
    req->body = NULL;
    req->body_len = 0;
    /* The connection may have gone during the handler: on_close left req
     * to us, since it was live. */
    if (req->conn == NULL) {
        if (req->srv->freeing)
            settle_with_server(req);
        else
            tern__http_req_settle(req);
    }
}

void tern__http_call_handler(tern_http_req *req, const tern__http_head *head,
                             const tern__route_params *params, const char *body, size_t body_len) {
    call_handler(req, head, params, body, body_len);
}

/* Re-parses the head kept in head_copy (for a body that spanned reads) and
 * runs the handler with the gathered body. */
static void dispatch_buffered(tern__http_conn *hc) {
    tern_server *srv = hc->srv;
    tern_http_req *req = hc->req;
    tern__http_head *head = &srv->scratch_head;
    tern__route_params *params = &srv->scratch_params;
    int status;
    tern__http_parse_head(req->head_copy, req->head_copy_len, &srv->cfg->limits, head,
                          srv->scratch_headers, srv->cfg->opt.max_headers);
    const char *m = req->is_head ? "GET" : head->method;
    size_t ml = req->is_head ? 3 : head->method_len;
    /* The same path decoded at the head: it cannot fail now (and the
     * scratch never shrinks). */
    if (!tern__router_match(req->host->router, m, ml, head->path, head->path_len, params, &status) ||
        tern__http_params_decode(srv, params, head->path_len) < 0)
        params->count = 0;
    hc->state = TERN__HTTP_WAIT;
    call_handler(req, head, params, req->body_buf.data ? req->body_buf.data : "",
                  req->body_buf.len);
}

/* Looks up the route; HEAD falls back to GET. When none, status says why:
 * 404, 405, or 501 for a method the server does not implement at all
 * (tern__http_method_known). */
static const tern__http_route *find_route(tern_http_req *req, const tern__http_head *head,
                                          tern__route_params *params, int *status) {
    tern_server *srv = req->srv;
    const tern__router *router = req->host->router;
    const tern__http_route *r = tern__router_match(router, head->method, head->method_len,
                                                   head->path, head->path_len, params, status);
    if (r == NULL && *status == 405 && head->method_len == 4 && memcmp(head->method, "HEAD", 4) == 0)
        r = tern__router_match(router, "GET", 3, head->path, head->path_len, params, status);
    if (r == NULL && !tern__http_method_known(srv, head->method, head->method_len))
        *status = 501;   /* RFC 9110 §9.1: a method we don't implement anywhere */
    return r;
}

/* Answers a request no handler takes: 404, 405 (with Allow), or the
 * status an upgrade refusal asked for. */
static void answer_status(tern_http_req *req, void *user) {
    int status = req->status;
    if (status == 405) {
        /* RFC 9110 §15.5.6: a 405 lists the methods the resource has. */
        static const char *const methods[] = {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH",
                                              "OPTIONS"};
        char allow[64] = "";
        size_t n = 0;
        for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++) {
            tern__route_params p;
            int st;
            const char *m = strcmp(methods[i], "HEAD") == 0 ? "GET" : methods[i];
            if (tern__router_match(req->host->router, m, strlen(m), req->head->path,
                                   req->head->path_len, &p, &st)) {
                size_t l = strlen(methods[i]);
                if (n + l + 3 < sizeof(allow)) {
                    if (n) {
                        memcpy(allow + n, ", ", 2);
                        n += 2;
                    }
                    memcpy(allow + n, methods[i], l + 1);
                    n += l;
                }
            }
        }
        if (n)
            tern_http_add_header(req, "Allow", allow);
    }
    char page[TERN__ERROR_PAGE_BUF];
    const char *ctype, *body;
    size_t len;
    tern__http_error_page(req->srv, status, page, &ctype, &body, &len);
    tern_http_respond(req, status, ctype, body, len);
}

const tern__http_route tern__http_route_status = {.fn = answer_status};

/* The body timeout bounds the pause between pieces of a body, but a piece
 * re-arms it only once TERN__BODY_PROGRESS bytes have come since the last
 * arming: a client trickling a byte now and then (slowloris) is cut off at
 * body_timeout, while one sending at least that much per period is not. */
#define TERN__BODY_PROGRESS 4096

static void arm_body_timeout(tern__http_conn *hc, bool progress_only) {
    tern_http_req *req = hc->req;
    if (progress_only && req->body_read - req->h1.body_mark < TERN__BODY_PROGRESS)
        return;
    req->h1.body_mark = req->body_read;
    tern__conn_set_timeout(&hc->conn, hc->srv->cfg->opt.body_timeout_ms);
}

/* tern__http_pick_route's body, static so that HTTP/1.1's call inlines it. */
static const tern__http_route *pick_route(tern_http_req *req, const tern__http_head *head,
                                          tern__route_params *params,
                                          const tern__http_route *route, int status,
                                          bool refused) {
    tern_server *srv = req->srv;
    const tern__upgrade_hook *upgrade = srv->cfg->upgrade;
    if (route == NULL) {
        route = find_route(req, head, params, &status);
        /* The parameters are handed over decoded: a path whose escapes do
         * not decode is a bad request, as Go's server takes it, rather
         * than a handler guessing what "%zz" meant. */
        int err = route ? tern__http_params_decode(srv, params, head->path_len) : 0;
        if (err < 0) {
            route = NULL;
            status = err == -ENOMEM ? 500 : 400;
        }
    }
    if (route == NULL && status == 404 && upgrade && !head->upgrade &&
        req->proto == &tern__h1_proto) {
        /* A WebSocket path asked for without the upgrade: RFC 9110 §15.5.22. */
        const char *proto = upgrade->owns_path(req->host, head->path, head->path_len);
        if (proto) {
            status = 426;
            tern_http_add_header(req, "Upgrade", proto);
        }
    }
    if (route == NULL && status == 404 && req->host->not_found.fn)
        route = &req->host->not_found;
    if (route == NULL)
        route = &tern__http_route_status;
    if (route == &tern__http_route_status) {
        params->count = 0;
        params->rest = NULL;   /* no "*" either: what matched is not this answer's */
        req->status = status;
        /* 404, 405, 501, 426, a 400 for a path that does not decode: the
         * server's own answers are logged like its other refusals. An
         * upgrade's refusal (status from try_upgrade) was logged by the
         * WebSocket layer already. */
        if (!refused)
            tern__http_log_refusal(req->conn, status, head->method, head->method_len, head->target,
                                   head->target_len, false);
    }
    return route;
}

const tern__http_route *tern__http_pick_route(tern_http_req *req, const tern__http_head *head,
                                              tern__route_params *params,
                                              const tern__http_route *route, int status,
                                              bool refused) {
    return pick_route(req, head, params, route, status, refused);
}

/* A head is complete and valid: sets up the request and either runs the
 * handler right away or starts reading the body. rest is what follows the
 * head in this read. Returns the bytes of rest consumed, or -1 when the
 * connection is no longer ours (error sent, closed, or upgraded). */
static ssize_t begin_request(tern__http_conn *hc, const char *head_bytes, size_t head_len,
                             char *rest, size_t rest_len) {
    tern_server *srv = hc->srv;
    tern__http_head *head = &srv->scratch_head;
    tern__route_params *params = &srv->scratch_params;

    if (hc->req == NULL && (hc->req = calloc(1, sizeof(*hc->req))) == NULL) {
        fail_request(hc, 500);
        return -1;
    }
    tern_http_req *req = hc->req;
    tern__http_req_reset(req);
    req->conn = &hc->conn;
    req->proto = &tern__h1_proto;
    req->srv = srv;
    req->host = &srv->cfg->host;
    if (srv->cfg->hosts) {
        /* Virtual hosts: the Host header picks the routes; over TLS, a
         * request without one (HTTP/1.0) goes by the name the client gave
         * in its handshake (SNI). */
        const tern__http_header *h = tern__http_find_header(head, "Host");
        const char *sni = h ? NULL : hc->conn.tp->ops->server_name(&hc->conn);
        if (h)
            req->host = tern__vhost_find(srv->cfg, h->value, h->value_len);
        else if (sni)
            req->host = tern__vhost_find(srv->cfg, sni, strlen(sni));
    }
    TERN__STAT_ADD(srv, requests, 1);
    req->minor_version = (uint8_t)head->minor_version;
    req->tls = tern__tls_is(&hc->conn);
    req->h1.keep_alive = head->keep_alive;
    req->is_head = head->method_len == 4 && memcmp(head->method, "HEAD", 4) == 0;
    req->h1.expect_continue = head->expect_continue;
    req->h1.body_kind = head->body_kind;
    req->h1.body_left = head->body_kind == TERN__BODY_LENGTH ? head->content_length : 0;

    if (head->body_kind == TERN__BODY_LENGTH && head->content_length > srv->cfg->opt.max_body) {
        fail_request_for(hc, 413, head->method, head->method_len, head->target, head->target_len);
        return -1;
    }

    int status = 404;
    const tern__http_route *route = NULL;
    const tern__upgrade_hook *upgrade = srv->cfg->upgrade;
    bool upgrade_refused = false;   /* the WebSocket layer logged its refusal */
    if (head->upgrade && upgrade) {
        req->live = true;
        req->head = head;
        int r = upgrade->try_upgrade(req, head, rest, rest_len);
        req->live = false;
        req->head = NULL;
        if (r == 1) {
            /* The connection belongs to the new protocol now. */
            tern__http_req_free(req);
            hc->req = NULL;
            return -1;
        }
        if (r < 0) {
            status = -r;
            route = &tern__http_route_status;
            upgrade_refused = true;
        }
    }
    route = pick_route(req, head, params, route, status, upgrade_refused);
    req->route = route;
    bool has_body = head->body_kind == TERN__BODY_CHUNKED ||
                    (head->body_kind == TERN__BODY_LENGTH && head->content_length > 0);
    tern__conn_set_timeout(&hc->conn, 0);

    if (!has_body) {
        req->body_done = true;
        hc->state = TERN__HTTP_WAIT;
        call_handler(req, head, params, "", 0);
        return 0;
    }
    if (route->stream) {
        req->body_mode = TERN__BODY_STREAM;
        hc->state = TERN__HTTP_BODY;
        arm_body_timeout(hc, false);
        call_handler(req, head, params, NULL, 0);
        return 0;
    }
    if (head->body_kind == TERN__BODY_LENGTH && head->content_length <= rest_len) {
        /* The whole body is here: hand it over in place. */
        size_t n = (size_t)head->content_length;
        req->h1.body_left = 0;
        req->body_read = n;
        req->body_done = true;
        hc->state = TERN__HTTP_WAIT;
        call_handler(req, head, params, rest, n);
        return (ssize_t)n;
    }
    /* The body spans reads: keep the head, gather the body. */
    req->body_mode = TERN__BODY_BUFFER;
    req->head_copy = malloc(head_len);
    size_t want = head->body_kind == TERN__BODY_LENGTH ? (size_t)head->content_length : 4096;
    if (req->head_copy == NULL || tern__bytes_reserve(&req->body_buf, want) < 0) {
        fail_request(hc, 500);
        return -1;
    }
    memcpy(req->head_copy, head_bytes, head_len);
    req->head_copy_len = head_len;
    hc->state = TERN__HTTP_BODY;
    arm_body_timeout(hc, false);
    if (req->h1.expect_continue && rest_len == 0)
        tern__http_send_continue(req);
    return 0;
}

/* ---- bodies ----------------------------------------------------------- */


/* A 413 for a body that grew past max_body while it was read: the head is
 * gone from the read buffer by now, but a buffered body kept it
 * (head_copy, validated: "METHOD SP target SP ...") and a streamed one's
 * handler left its request line for the access log (access_copy). */
static void fail_body_too_large(tern__http_conn *hc) {
    tern_http_req *req = hc->req;
    const char *m = NULL, *t = NULL;
    size_t ml = 0, tl = 0;
    if (req->head_copy) {
        const char *h = req->head_copy, *end = h + req->head_copy_len;
        const char *sp = memchr(h, ' ', req->head_copy_len);
        const char *sp2 = sp ? memchr(sp + 1, ' ', (size_t)(end - sp - 1)) : NULL;
        if (sp2) {
            m = h;
            ml = (size_t)(sp - h);
            t = sp + 1;
            tl = (size_t)(sp2 - t);
        }
    } else if (req->access_copy) {
        m = req->access_copy;
        ml = strlen(m);
        t = m + ml + 1;
        tl = strlen(t);
    }
    if (m)
        fail_request_for(hc, 413, m, ml, t, tl);
    else
        fail_request(hc, 413);
}

/* Hands one piece of body to where it goes. Returns false when the
 * connection is no longer ours. */
static bool deliver(tern__http_conn *hc, const char *p, size_t n) {
    tern_http_req *req = hc->req;
    req->body_read += n;
    if (req->body_read > hc->srv->cfg->opt.max_body) {
        if (req->started)
            tern__conn_close(&hc->conn, -EMSGSIZE);   /* too late for a 413 */
        else
            fail_body_too_large(hc);
        return false;
    }
    switch (req->body_mode) {
    case TERN__BODY_BUFFER:
        if (tern__bytes_append(&req->body_buf, p, n) < 0) {
            fail_request(hc, 500);
            return false;
        }
        break;
    case TERN__BODY_STREAM:
        req->body_fn(req, p, n, false, req->body_user);
        break;
    default:
        break;
    }
    return !conn_gone(hc);
}

/* Reads body bytes from data[0..len). Returns the bytes consumed, or -1
 * when the connection is no longer ours. Sets req->body_done at the end of
 * the body. */
static ssize_t read_body(tern__http_conn *hc, char *data, size_t len) {
    tern_http_req *req = hc->req;
    size_t pos = 0;
    while (!req->body_done && pos < len) {
        /* A stream whose handler has not asked for the body yet: wait. */
        if (req->body_mode == TERN__BODY_STREAM && req->body_fn == NULL)
            break;
        const char *piece = NULL;
        size_t n = 0;
        if (req->h1.body_kind == TERN__BODY_LENGTH) {
            n = len - pos < req->h1.body_left ? len - pos : (size_t)req->h1.body_left;
            piece = data + pos;
            pos += n;
            req->h1.body_left -= n;
            if (req->h1.body_left == 0)
                req->body_done = true;
        } else {
            size_t used = 0;
            int r = tern__chunked_decode(&req->h1.chunked, data + pos, len - pos, &used, &piece, &n,
                                         hc->srv->cfg->opt.max_head);
            pos += used;
            if (r == TERN__CHUNKED_ERROR) {
                if (req->started)
                    tern__conn_close(&hc->conn, -EPROTO);
                else
                    fail_request(hc, 400);
                return -1;
            }
            if (r == TERN__CHUNKED_DONE)
                req->body_done = true;
            if (r != TERN__CHUNKED_DATA)
                n = 0;
        }
        if (n && !deliver(hc, piece, n))
            return -1;
        if (req->ended && req->body_mode == TERN__BODY_STREAM)
            return (ssize_t)pos;   /* answered mid-body: process() switches to dropping */
    }
    if (!req->body_done)
        return (ssize_t)pos;
    /* The body is complete. */
    tern__conn_set_timeout(&hc->conn, 0);
    switch (req->body_mode) {
    case TERN__BODY_BUFFER:
        dispatch_buffered(hc);
        break;
    case TERN__BODY_STREAM:
        hc->state = TERN__HTTP_WAIT;
        req->body_fn(req, "", 0, true, req->body_user);
        break;
    default:
        hc->state = TERN__HTTP_WAIT;
        break;
    }
    if (conn_gone(hc))
        return -1;
    hc->state = TERN__HTTP_WAIT;
    return (ssize_t)pos;
}

void tern__h1_read_body(tern_http_req *req) {
    tern__http_conn *hc = tern__h1_conn(req);
    if (req->body_mode != TERN__BODY_STREAM) {
        /* No body at all: its end is told at the end of this batch (not
         * inside this call, which may be the handler's). */
        req->body_end_due = true;
        tern__conn_defer(&hc->conn);
        return;
    }
    if (req->h1.expect_continue)
        tern__http_send_continue(req);
    if (!hc->in_data)
        tern__conn_resume(&hc->conn);
}

/* ---- the end of a response -------------------------------------------- */

/* The response has ended: decides what comes next. Returns false when the
 * connection is closing. */
static bool next_request(tern__http_conn *hc) {
    tern_http_req *req = hc->req;
    tern_server *srv = hc->srv;
    hc->probe_wait_ms = 0;   /* answered: no more looking for the probe's reset */
    if (!req->body_done) {
        /* Answered before the body was read (a stream route, or 404 to a
         * POST): read and drop the rest, unless the client is still waiting
         * for "100 Continue" and may never send it. */
        if (req->h1.expect_continue && !req->h1.continue_sent)
            req->h1.close_after = true;
        req->body_mode = TERN__BODY_DROP;
        req->body_fn = NULL;
    }
    if (req->h1.close_after || !req->h1.keep_alive || srv->shutting_down) {
        hc->state = TERN__HTTP_CLOSING;
        tern__conn_end(&hc->conn);
        return false;
    }
    if (!req->body_done) {
        hc->state = TERN__HTTP_BODY;
        arm_body_timeout(hc, false);
        return true;
    }
    hc->state = TERN__HTTP_IDLE;
    hc->scanned = 0;
    /* Idle means nothing asked and nothing to send: while the response is
     * still leaving, the send clock runs instead (on_drain starts idle). */
    tern__conn_set_timeout(&hc->conn, 0);
    if (!tern__conn_send_clock(&hc->conn))
        tern__conn_set_timeout(&hc->conn, srv->cfg->opt.idle_timeout_ms);
    return true;
}

void tern__h1_ended(tern_http_req *req) {
    tern__http_conn *hc = tern__h1_conn(req);
    if (hc->in_data || hc->state != TERN__HTTP_WAIT) {
        /* Inline in a handler or a body callback: on_data goes on by itself
         * (or, for a stream still in BODY, next_request runs when the body
         * loop sees the response ended). */
        if (!hc->in_data && hc->state == TERN__HTTP_BODY) {
            if (next_request(hc))
                tern__conn_resume(&hc->conn);
        }
        return;
    }
    /* Answered later: pick up the pipelined bytes that waited. */
    if (next_request(hc))
        tern__conn_resume(&hc->conn);
}

/* ---- the state machine ------------------------------------------------ */

static size_t process(tern__http_conn *hc, char *data, size_t len) {
    tern_server *srv = hc->srv;
    size_t pos = 0;
    for (;;) {
        if (conn_gone(hc))
            return len;
        tern_http_req *req = hc->req;
        switch (hc->state) {
        case TERN__HTTP_WAIT:
            if (!req->ended) {
                tern__conn_pause(&hc->conn);
                return pos;
            }
            if (!next_request(hc))
                return len;
            continue;

        case TERN__HTTP_BODY: {
            if (req->ended && req->body_mode != TERN__BODY_DROP) {
                if (!next_request(hc))
                    return len;
                continue;
            }
            if (req->body_mode == TERN__BODY_STREAM && req->body_fn == NULL) {
                tern__conn_pause(&hc->conn);
                return pos;
            }
            if (pos == len)
                return pos;
            ssize_t n = read_body(hc, data + pos, len - pos);
            if (n < 0)
                return len;
            pos += (size_t)n;
            if (!req->body_done && pos == len) {
                arm_body_timeout(hc, true);
                return pos;
            }
            continue;
        }

        case TERN__HTTP_IDLE:
            if (pos == len)
                return pos;
            if (hc->h2_ok) {
                int h2 = try_h2(hc, data + pos, len - pos);
                if (h2 >= 0)
                    return h2 ? len : pos;
            }
            /* Don't answer more while the kernel is not taking what we
             * sent: a client that pipelines without reading would make the
             * backlog grow without bound. on_drain resumes. */
            if (tern__conn_backlog(&hc->conn)) {
                hc->waiting_drain = true;
                tern__conn_pause(&hc->conn);
                return pos;
            }
            hc->state = TERN__HTTP_HEAD;
            hc->scanned = 0;
            tern__conn_set_timeout(&hc->conn, srv->cfg->opt.head_timeout_ms);
            /* fall through */
        case TERN__HTTP_HEAD: {
            size_t avail = len - pos;
            size_t from = hc->scanned;
            size_t end = tern__http_find_head_end(data + pos, avail, &hc->scanned);
            tern__http_head *head = &srv->scratch_head;
            if (end == 0) {
                /* Not complete. Parse what is here when a limit is passed
                 * or a new line ended, so garbage and oversize heads are
                 * refused now rather than at the timeout. */
                bool new_line = memchr(data + pos + from, '\n', avail - from) != NULL;
                if (avail >= srv->cfg->opt.max_head || new_line) {
                    ssize_t r = tern__http_parse_head(data + pos, avail, &srv->cfg->limits, head,
                                                      srv->scratch_headers, srv->cfg->opt.max_headers);
                    if (r < 0 || avail >= srv->cfg->opt.max_head) {
                        fail_request(hc, r < 0 ? (int)-r : 431);
                        return len;
                    }
                }
                return pos;
            }
            ssize_t r = tern__http_parse_head(data + pos, end, &srv->cfg->limits, head,
                                              srv->scratch_headers, srv->cfg->opt.max_headers);
            if (r <= 0) {
                fail_request(hc, r < 0 ? (int)-r : 400);
                return len;
            }
            const char *head_bytes = data + pos;
            pos += (size_t)r;
            ssize_t used = begin_request(hc, head_bytes, (size_t)r, data + pos, len - pos);
            if (used < 0)
                return len;
            pos += (size_t)used;
            continue;
        }

        default:
            return len;
        }
    }
}

static size_t on_data(tern__conn *c, char *data, size_t len) {
    tern__http_conn *hc = (tern__http_conn *)c;
    tern_server *srv = hc->srv;
    hc->in_data = true;
    size_t used = process(hc, data, len);
    hc->in_data = false;
    TERN__STAT_ADD(srv, bytes_in, used);
    return used;
}

static void on_eof(tern__conn *c) {
    tern__http_conn *hc = (tern__http_conn *)c;
    /* A client may half-close after its last request and still read the
     * answers: a pending one is given when the handler answers (on_hangup
     * says how a client that closed altogether is told apart). */
    if (hc->state == TERN__HTTP_WAIT && hc->req && !hc->req->ended) {
        on_hangup(c);
        return;
    }
    if (hc->state == TERN__HTTP_BODY || hc->state == TERN__HTTP_HEAD) {
        tern__conn_close(c, -ECONNRESET);   /* the request can never complete */
        return;
    }
    tern__conn_end(c);
    hc->state = TERN__HTTP_CLOSING;
}

static void on_drain(tern__conn *c) {
    tern__http_conn *hc = (tern__http_conn *)c;
    if (hc->state == TERN__HTTP_IDLE)   /* the last response is out: now idle */
        tern__conn_set_timeout(c, hc->srv->cfg->opt.idle_timeout_ms);
    if (hc->waiting_drain) {
        hc->waiting_drain = false;
        tern__conn_resume(c);
    }
    tern_http_req *req = hc->req;
    if (req && req->started && !req->ended && req->drain_fn)
        req->drain_fn(req, req->drain_user);
}

/* After the probe (on_hangup): has the client answered it with a reset?
 * Net no longer watches a paused connection once its FIN is in, so it is
 * looked at on a clock instead, with poll(): a reset socket reports an
 * error and HUP, a half-closed one neither. The looks stop once the probe
 * is acknowledged (tern__plat_tcp_unacked_segments, TCP_INFO's unacked:
 * a client that acks is there; where the system cannot say, at the first
 * look) or after a few seconds, and whenever the answer starts. */
static void probe_look(tern__http_conn *hc) {
    tern__conn *c = &hc->conn;
    struct pollfd pfd = {.fd = c->io.fd, .events = 0};
    if (poll(&pfd, 1, 0) == 1 && (pfd.revents & (POLLERR | POLLHUP))) {
        tern__conn_close(c, -ECONNRESET);   /* on_close fires the abort */
        return;
    }
    bool acked = tern__plat_tcp_unacked_segments(c->io.fd) <= 0;
    if (acked || hc->probe_wait_ms >= 2048) {
        hc->probe_wait_ms = 0;   /* it is there, reading: the answer will find it */
        return;
    }
    hc->probe_wait_ms *= 2;
    tern__conn_set_timeout(c, hc->probe_wait_ms);
}

static void on_timeout(tern__conn *c) {
    tern__http_conn *hc = (tern__http_conn *)c;
    if (hc->state == TERN__HTTP_WAIT && hc->probe_wait_ms && hc->req && !hc->req->started) {
        probe_look(hc);
        return;
    }
    switch (hc->state) {
    case TERN__HTTP_HEAD:
        fail_request(hc, 408);
        break;
    case TERN__HTTP_BODY:
        if (hc->req && hc->req->started)
            tern__conn_close(c, -ETIMEDOUT);
        else
            fail_request(hc, 408);
        break;
    default:
        /* Idle (fresh or keep-alive): nothing was asked, nothing to say. */
        tern__conn_close(c, -ETIMEDOUT);
        break;
    }
}

/* The client sent its FIN while we were not reading (a response is
 * pending, or we wait for a backlog to drain). The bytes before the FIN
 * are still read once we resume, and every request in them answered, as
 * Go's net/http does: a client that half-closes after its requests (nc
 * -N, shutdown(SHUT_WR)) is still reading. But TCP does not tell that
 * client from one that closed altogether until data reaches it: the
 * latter's kernel answers data with a reset. So with an answer pending
 * and not started, an HTTP/1.1 client gets an interim "100 Continue" now
 * (RFC 9110 §15.2: a client must accept a 1xx it did not ask for; HTTP/1.0
 * ones may not be sent one), and a client that has gone resets: net
 * closes the connection and the abort callback fires within a round trip,
 * not when the handler answers. A started response (a stream) needs no
 * probe: its next write is one. An HTTP/1.0 client that has gone is
 * noticed only when its answer is written. */
static void on_hangup(tern__conn *c) {
    tern__http_conn *hc = (tern__http_conn *)c;
    tern_http_req *req = hc->req;
    if (hc->state != TERN__HTTP_WAIT || req == NULL || req->ended)
        return;
    if (hc->peer_probed || req->started || req->minor_version == 0)
        return;
    hc->peer_probed = true;
    char buf[32];
    char *p = tern__http_put_status(buf, NULL, 100);
    memcpy(p, "\r\n", 2);
    tern__conn_write(c, buf, (size_t)(p + 2 - buf));
    /* The probe leaves at the batch end; its reset comes a round trip
     * later. A handler's answer before then takes the clock over. */
    hc->probe_wait_ms = 64;   /* a wheel tick: none is shorter */
    tern__conn_set_timeout(c, hc->probe_wait_ms);
}

/* A stream route's handler asked for a body there is none of: its end. */
static void on_deferred(tern__conn *c) {
    tern__http_conn *hc = (tern__http_conn *)c;
    tern_http_req *req = hc->req;
    if (req == NULL || !req->body_end_due)
        return;
    req->body_end_due = false;
    if (req->ended || (c->flags & TERN__CONN_CLOSED))
        return;
    req->body_fn(req, "", 0, true, req->body_user);
}

static uint32_t send_timeout(const tern__conn *c) {
    return ((const tern__http_conn *)c)->srv->cfg->opt.send_timeout_ms;
}

static void on_shutdown(tern__conn *c) {
    tern__http_conn *hc = (tern__http_conn *)c;
    if (hc->state == TERN__HTTP_IDLE && !tern__conn_backlog(c))
        tern__conn_close(c, 0);
    /* Otherwise the response in flight ends with "Connection: close" (the
     * response code sees srv->shutting_down) and next_request() closes. */
}

static void on_close(tern__conn *c, int err) {
    tern__http_conn *hc = (tern__http_conn *)c;
    tern_server *srv = hc->srv;
    tern_http_req *req = hc->req;
    hc->req = NULL;
    if (req)
        tern__http_req_detach(req, err);
    tern__http_conn_closed_by_server(srv, c);
}
