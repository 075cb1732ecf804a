/* HTTP/2 (RFC 9113) on libnghttp2: the framing, HPACK and flow control
 * are the library's; tern owns the loop, the buffers and the mapping of
 * each stream onto a tern_http_req with its own tern__http_proto.
 *
 * An HTTP/1.1 connection whose first bytes are HTTP/2's preface (the
 * client chose "h2" by ALPN, or knows the plain port speaks h2c) is moved
 * into an h2_conn (tern__h2_start). Bytes read go to
 * nghttp2_session_mem_recv; what the session has to send is written to
 * the connection by h2_send, never from inside one of nghttp2's callbacks
 * (a handler runs inside one: its answer goes out when on_data's
 * mem_recv returns) nor inside a user's call (an answer given later goes
 * at the batch end, want_send). A request body is handed to its handler as it
 * arrives and only then consumed, so the stream's window opens as the
 * handler takes the bytes (the connection's as they arrive): a handler
 * that has not asked for its body yet holds its stream, not the others. */
#include <errno.h>
#include <nghttp2/nghttp2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "http/proto.h"
#include "http/server.h"
#include "net/tls.h"

#include "http/h2_internal.h"

/* ---- streams ---------------------------------------------------------- */

static void stream_unlink(h2_stream *st) {
    h2_conn *h2 = st->h2;
    if (st->prev)
        st->prev->next = st->next;
    else
        h2->streams = st->next;
    if (st->next)
        st->next->prev = st->prev;
    h2->nstreams--;
    if (h2->ng)
        nghttp2_session_set_stream_user_data(h2->ng, st->id, NULL);
    st->h2 = NULL;
    st->next = st->prev = NULL;
}

/* Frees what only the open stream needs; the request part stays for the
 * neutral code (tern__http_req_detach). */
static void stream_release(h2_stream *st) {
    tern__bytes_free(&st->hdr);
    tern__bytes_free(&st->pending);
    tern__bytes_free(&st->out);
    if (st->fd >= 0)
        close(st->fd);
    st->fd = -1;
    st->file_left = 0;
}

/* The stream is closed (err 0: both ends finished, else the peer reset
 * it or the connection went): its request is detached, which frees it
 * unless a handler still holds it (then the abort callback, or the
 * handler's answer, ends it). A tunnel's connection closes with it (the
 * peer's reset or the connection's end is a reset to the WebSocket). */
static void stream_gone(h2_stream *st, int err) {
    stream_unlink(st);
    stream_release(st);
    if (st->tunnel) {
        h2_tunnel *t = st->tunnel;
        st->tunnel = NULL;
        t->st = NULL;
        tern__conn_close(t->c, err);   /* its release frees t */
    }
    tern_http_req *req = &st->req;
    if (req->ended && !req->live) {
        tern__http_req_free(req);
        return;
    }
    tern__http_req_detach(req, err);
}

/* A stream whose request body is still to come, and whose answer may
 * still want it. */
static bool awaits_body(const h2_stream *st) {
    return st->headers_done && !st->req.body_done && !st->req.ended &&
           st->req.body_mode != TERN__BODY_DROP;
}

/* A stream with response bytes to send (or its end) that the peer's
 * window keeps from going. */
static bool window_shut(const h2_stream *st) {
    nghttp2_session *ng = st->h2->ng;
    /* A tunnel's window is its connection's to watch (net's send clock on
     * its backlog, the WebSocket's own clocks), not the connection's. */
    bool waiting = st->tunnel == NULL && st->has_data && !st->eof_given &&
                   (st->out.len > st->out_off || st->file_left || st->data_end);
    return waiting && (nghttp2_session_get_stream_remote_window_size(ng, st->id) <= 0 ||
                       nghttp2_session_get_remote_window_size(ng) <= 0);
}

static bool any_window_shut(const h2_conn *h2) {
    for (const h2_stream *st = h2->streams; st; st = st->next)
        if (window_shut(st))
            return true;
    return false;
}

/* The connection's clock: with no stream open, the idle timeout; with a
 * stream awaiting its body, the body timeout (as HTTP/1.1's, re-armed
 * only by 4 KiB of progress, so a trickle is cut off); with a response
 * held by a shut window, the send timeout (re-armed by 4 KiB sent, in
 * h2_send); else none (a handler's answer has no clock; net's send clock
 * runs while a backlog leaves). */
static void set_clock(h2_conn *h2) {
    const tern_server_options *o = &h2->srv->cfg->opt;
    uint64_t ms = h2->nstreams ? 0 : o->idle_timeout_ms;
    for (h2_stream *st = h2->streams; st && ms == 0; st = st->next)
        if (awaits_body(st))
            ms = o->body_timeout_ms;
    if (ms == 0 && h2->stalled)
        ms = o->send_timeout_ms;
    h2->body_mark = h2->body_bytes;
    h2->sent_mark = h2->sent_bytes;
    tern__conn_set_timeout(&h2->conn, ms);
}

/* ---- the request ------------------------------------------------------ */

/* The head of st's request in srv's scratch, with views into st->hdr: the
 * pseudo-fields as method, target, path and query, :authority as a Host
 * field (unless one came), the others as they came (lower case). */
static tern__http_head *build_head(h2_stream *st) {
    tern_server *srv = st->req.srv;
    tern__http_head *head = &srv->scratch_head;
    memset(head, 0, sizeof(*head));
    head->headers = srv->scratch_headers;
    head->minor_version = 1;
    head->keep_alive = true;
    const char *authority = NULL;
    size_t authority_len = 0;
    tern__http_field f;
    size_t pos = 0;
    while (tern__http_field_next(st->hdr.data, st->hdr.len, &pos, &f)) {
        if (f.name[0] == ':') {
            /* the ones read here (nghttp2 checked them all: each once) */
            if (f.name_len == 7 && memcmp(f.name, ":method", 7) == 0) {
                head->method = f.value;
                head->method_len = f.value_len;
            } else if (f.name_len == 5 && memcmp(f.name, ":path", 5) == 0) {
                head->target = f.value;
                head->target_len = f.value_len;
            } else if (f.name_len == 10 && memcmp(f.name, ":authority", 10) == 0) {
                authority = f.value;
                authority_len = f.value_len;
            } else if (f.name_len == 9 && memcmp(f.name, ":protocol", 9) == 0) {
                head->protocol = f.value;   /* nghttp2 lets it through on CONNECT alone */
                head->protocol_len = f.value_len;
            }
            continue;
        }
        tern__http_header *h = &head->headers[head->num_headers++];
        h->name = f.name;
        h->name_len = f.name_len;
        h->value = f.value;
        h->value_len = f.value_len;
        if (f.name_len == 4 && memcmp(f.name, "host", 4) == 0) {
            head->host = f.value;
            head->host_len = f.value_len;
        }
        if (f.name_len == 6 && memcmp(f.name, "expect", 6) == 0 && f.value_len == 12 &&
            strncasecmp(f.value, "100-continue", 12) == 0)
            head->expect_continue = true;
    }
    if (head->host == NULL && authority) {
        /* room: too_large keeps the fields under max_headers (<= 256) */
        tern__http_header *h = &head->headers[head->num_headers++];
        *h = (tern__http_header){"host", 4, authority, authority_len};
        head->host = authority;
        head->host_len = authority_len;
    }
    if (head->target == NULL) {   /* CONNECT: no path; nothing routes it */
        head->target = "";
        head->target_len = 0;
    }
    const char *q = memchr(head->target, '?', head->target_len);
    head->path = head->target;
    head->path_len = q ? (size_t)(q - head->target) : head->target_len;
    if (q) {
        head->query = q + 1;
        head->query_len = head->target_len - head->path_len - 1;
    }
    if (head->method == NULL) {
        head->method = "";
        head->method_len = 0;
    }
    return head;
}

/* The request's routes by :authority (or Host), else by SNI. */
static const tern__vhost *pick_host(h2_stream *st, const tern__http_head *head) {
    tern_server *srv = st->req.srv;
    if (srv->cfg->hosts == NULL)
        return &srv->cfg->host;
    if (head->host)
        return tern__vhost_find(srv->cfg, head->host, head->host_len);
    const char *sni = st->h2->conn.tp->ops->server_name(&st->h2->conn);
    return sni ? tern__vhost_find(srv->cfg, sni, strlen(sni)) : &srv->cfg->host;
}

/* A 100 (Continue) head on st, once, while its request's body is awaited
 * and its answer has not started (RFC 9110 §10.1.1, RFC 9113 §8.1): a
 * client that asked for one holds its body until it comes (curl for a
 * second, then sends anyway), as over HTTP/1.1. */
static void send_continue(h2_stream *st) {
    if (!st->continue_due || st->req.started || st->req.body_done || !st->h2 || !st->h2->ng)
        return;
    st->continue_due = false;
    /* non-final: submit_headers, since submit_response would end our side */
    static const nghttp2_nv nv = {(uint8_t *)":status", (uint8_t *)"100", 7, 3,
                                  NGHTTP2_NV_FLAG_NONE};
    if (nghttp2_submit_headers(st->h2->ng, NGHTTP2_FLAG_NONE, st->id, NULL, &nv, 1, NULL) >= 0)
        tern__h2_want_send(st->h2);
}

/* The head is complete (end_stream: and there is no body): routes the
 * request and runs its handler, or, for a buffered body, waits for it. */
static void begin_request(h2_stream *st, bool end_stream) {
    h2_conn *h2 = st->h2;
    tern_server *srv = h2->srv;
    tern_http_req *req = &st->req;
    st->headers_done = true;
    tern__http_head *head = build_head(st);
    tern__route_params *params = &srv->scratch_params;
    req->host = pick_host(st, head);
    req->is_head = head->method_len == 4 && memcmp(head->method, "HEAD", 4) == 0;
    TERN__STAT_ADD(srv, requests, 1);
    const tern__http_route *route = NULL;
    int status = 0;
    if (st->too_large) {
        route = &tern__http_route_status;
        status = 431;
    } else if (head->target_len == 0 || head->target_len > srv->cfg->opt.max_uri) {
        route = &tern__http_route_status;
        status = head->target_len ? 414 : 400;
    }
    bool logged = route != NULL;
    if (route)
        tern__http_log_refusal(req->conn, status, head->method, head->method_len, head->target,
                               head->target_len, false);
    const tern__upgrade_hook *upgrade = srv->cfg->upgrade;
    if (route == NULL && head->protocol && upgrade) {
        /* RFC 8441's extended CONNECT: the WebSocket layer answers it and
         * takes the stream (tunnel), or refuses it (logged there). */
        req->live = true;
        req->head = head;
        int r = upgrade->try_upgrade(req, head, NULL, 0);
        req->live = false;
        req->head = NULL;
        if (r == 1)
            return;
        if (r < 0) {
            route = &tern__http_route_status;
            status = -r;
            logged = true;
        }
    }
    req->route = tern__http_pick_route(req, head, params, route, status, logged);
    st->continue_due = head->expect_continue && !end_stream;
    bool connect = head->method_len == 7 && memcmp(head->method, "CONNECT", 7) == 0;
    if (connect && !end_stream) {
        /* A CONNECT no tunnel took: its stream's bytes are no request
         * body to wait for; it is answered now, and they are dropped. */
        req->body_mode = TERN__BODY_DROP;
        tern__http_call_handler(req, head, params, "", 0);
    } else if (end_stream) {
        req->body_done = true;
        tern__http_call_handler(req, head, params, "", 0);
    } else if (req->route->stream) {
        req->body_mode = TERN__BODY_STREAM;
        tern__http_call_handler(req, head, params, NULL, 0);
    } else {
        req->body_mode = TERN__BODY_BUFFER;
        send_continue(st);   /* a streamed body's goes when its handler reads */
    }
}

/* A buffered body is complete: the handler runs with it. */
static void dispatch_buffered(h2_stream *st) {
    tern_http_req *req = &st->req;
    tern_server *srv = req->srv;
    tern__http_head *head = build_head(st);
    tern__route_params *params = &srv->scratch_params;
    int status;
    const char *m = req->is_head ? "GET" : head->method;
    size_t ml = req->is_head ? 3 : head->method_len;
    /* The same match as at the head: it cannot fail now. */
    if (req->route == &tern__http_route_status ||
        !tern__router_match(req->host->router, m, ml, head->path, head->path_len, params,
                            &status) ||
        tern__http_params_decode(srv, params, head->path_len) < 0) {
        params->count = 0;
        params->rest = NULL;
    }
    tern__http_call_handler(req, head, params, req->body_buf.data ? req->body_buf.data : "",
                            req->body_buf.len);
}

/* Answers st with status and the error page, unless its answer started. */
static void refuse(h2_stream *st, int status) {
    tern_http_req *req = &st->req;
    if (req->started || req->ended)
        return;
    char page[TERN__ERROR_PAGE_BUF];
    const char *ctype, *body;
    size_t len;
    tern__http_error_page(req->srv, status, page, &ctype, &body, &len);
    tern_http_respond(req, status, ctype, body, len);
}

/* n body bytes are done with: the peer may send as many more. */
static void consume(h2_stream *st, size_t n) {
    if (n && st->h2 && st->h2->ng)
        nghttp2_session_consume(st->h2->ng, st->id, n);
}

/* n bytes held for the handler (pending) are taken or dropped: the
 * stream's window opens by as much (the connection's opened when they
 * came). */
static void consume_held(h2_stream *st, size_t n) {
    if (n && st->h2 && st->h2->ng)
        nghttp2_session_consume_stream(st->h2->ng, st->id, n);
}

/* The body's end, for a handler reading it. */
static void body_end(h2_stream *st) {
    tern_http_req *req = &st->req;
    if (req->body_mode == TERN__BODY_BUFFER && !req->ended)
        dispatch_buffered(st);
    else if (req->body_mode == TERN__BODY_STREAM && req->body_fn && !req->ended)
        req->body_fn(req, "", 0, true, req->body_user);
}

/* ---- nghttp2's callbacks ---------------------------------------------- */

/* Every frame's header, before its payload: the peer's HEADERS ids
 * (peer_max, peer_used). An id it skipped ends the connection with
 * PROTOCOL_ERROR; ids further back than 64 streams are left to nghttp2
 * (a stream closed long ago may still see trailers sent before the
 * peer heard of its reset). */
static int on_begin_frame(nghttp2_session *ng, const nghttp2_frame_hd *hd, void *user) {
    h2_conn *h2 = user;
    int32_t id = hd->stream_id;
    if (hd->type != NGHTTP2_HEADERS || id % 2 == 0)
        return 0;
    if (id > h2->peer_max) {
        int32_t k = (id - h2->peer_max) / 2;
        h2->peer_used = k < 64 ? (h2->peer_used << k) | 1 : 1;
        h2->peer_max = id;
        return 0;
    }
    int32_t k = (h2->peer_max - id) / 2;
    if (k < 64 && !(h2->peer_used >> k & 1))
        nghttp2_session_terminate_session(ng, NGHTTP2_PROTOCOL_ERROR);
    return 0;
}

static int on_begin_headers(nghttp2_session *ng, const nghttp2_frame *frame, void *user) {
    h2_conn *h2 = user;
    if (h2->dead)   /* closed by a handler of this read: no new requests */
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    h2_stream *st = calloc(1, sizeof(*st));
    if (st == NULL)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;   /* the stream is reset */
    st->fd = -1;
    st->id = frame->hd.stream_id;
    st->h2 = h2;
    st->req.conn = &h2->conn;
    st->req.proto = &tern__h2_proto;
    st->req.srv = h2->srv;
    st->req.host = &h2->srv->cfg->host;
    st->req.minor_version = 1;
    st->req.tls = tern__tls_is(&h2->conn);
    st->next = h2->streams;
    if (h2->streams)
        h2->streams->prev = st;
    h2->streams = st;
    h2->nstreams++;
    nghttp2_session_set_stream_user_data(ng, st->id, st);
    set_clock(h2);
    return 0;
}

static int on_header(nghttp2_session *ng, const nghttp2_frame *frame, const uint8_t *name,
                     size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
                     void *user) {
    (void)flags;
    (void)user;
    h2_stream *st = nghttp2_session_get_stream_user_data(ng, frame->hd.stream_id);
    if (st == NULL || st->headers_done || st->too_large)
        return 0;   /* trailers are not kept; past a limit nothing more is */
    const tern_server_options *o = &st->req.srv->cfg->opt;
    st->hdr_bytes += namelen + valuelen + 32;
    /* one field more is kept for :authority's Host */
    if (st->hdr_bytes > o->max_head || st->nfields + 2 > o->max_headers ||
        memchr(value, '\0', valuelen)) {
        st->too_large = true;
        return 0;
    }
    if (tern__bytes_reserve(&st->hdr, namelen + valuelen + 2) < 0)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    char *p = st->hdr.data + st->hdr.len;
    memcpy(p, name, namelen);
    p[namelen] = '\0';
    memcpy(p + namelen + 1, value, valuelen);
    p[namelen + 1 + valuelen] = '\0';
    st->hdr.len += namelen + valuelen + 2;
    if (name[0] != ':')
        st->nfields++;
    return 0;
}

static int on_frame_recv(nghttp2_session *ng, const nghttp2_frame *frame, void *user) {
    (void)user;
    h2_stream *st = nghttp2_session_get_stream_user_data(ng, frame->hd.stream_id);
    if (st == NULL)
        return 0;
    bool end_stream = frame->hd.flags & NGHTTP2_FLAG_END_STREAM;
    if (frame->hd.type == NGHTTP2_HEADERS && !st->headers_done) {
        if (st->too_large && !end_stream)
            st->req.body_mode = TERN__BODY_DROP;
        begin_request(st, end_stream);
        if (st->h2)
            set_clock(st->h2);
        return 0;
    }
    if (st->tunnel) {
        /* The peer's end of a tunnel (on DATA, or trailers): read after
         * what came before it. */
        if ((frame->hd.type == NGHTTP2_DATA || frame->hd.type == NGHTTP2_HEADERS) && end_stream)
            st->tunnel->eof = st->req.body_done = true;
        return 0;
    }
    if ((frame->hd.type == NGHTTP2_DATA || frame->hd.type == NGHTTP2_HEADERS) && end_stream &&
        !st->req.body_done) {
        st->req.body_done = true;
        if (st->pending.len == 0)
            body_end(st);
        /* else: the end is told after the bytes held for the handler */
        if (st->h2)
            set_clock(st->h2);
    }
    return 0;
}

static int on_data_chunk(nghttp2_session *ng, uint8_t flags, int32_t id, const uint8_t *data,
                         size_t len, void *user) {
    (void)flags;
    (void)user;
    h2_stream *st = nghttp2_session_get_stream_user_data(ng, id);
    if (st == NULL) {
        nghttp2_session_consume(ng, id, len);
        return 0;
    }
    if (st->tunnel) {
        /* Held, its stream's window unconsumed, until the tunnel's
         * connection reads it (tunnel_recv): the peer sends no more than
         * that window. The connection's window opens at once, so that a
         * WebSocket that stops reading holds back its own stream alone. */
        nghttp2_session_consume_connection(ng, len);
        if (tern__bytes_append(&st->pending, (const char *)data, len) < 0)
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;   /* the stream is reset */
        return 0;
    }
    tern_http_req *req = &st->req;
    req->body_read += len;
    st->h2->body_bytes += len;
    if (req->ended || req->body_mode == TERN__BODY_DROP) {
        consume(st, len);
        return 0;
    }
    if (req->body_read > req->srv->cfg->opt.max_body) {
        consume(st, len);
        req->body_mode = TERN__BODY_DROP;
        if (req->started)
            nghttp2_submit_rst_stream(ng, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
        else
            refuse(st, 413);
        return 0;
    }
    if (req->body_mode == TERN__BODY_BUFFER) {
        if (tern__bytes_append(&req->body_buf, (const char *)data, len) < 0) {
            consume(st, len);
            req->body_mode = TERN__BODY_DROP;
            refuse(st, 500);
            return 0;
        }
        consume(st, len);
        return 0;
    }
    /* Streamed: to the handler now if it asked and nothing waits before
     * these bytes; else held, unconsumed, so the stream's window closes.
     * The connection's opens at once (as a tunnel's): a handler that has
     * not asked for its body holds back its own stream, not the others'
     * (held bytes are bounded by the stream windows: 64 KiB a stream). */
    if (req->body_fn && st->pending.len == 0) {
        req->body_fn(req, (const char *)data, len, false, req->body_user);
        consume(st, len);
        return 0;
    }
    nghttp2_session_consume_connection(ng, len);
    if (tern__bytes_append(&st->pending, (const char *)data, len) < 0)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    return 0;
}

/* The answer's last frame went: a request still sending is reset. */
static int on_frame_send(nghttp2_session *ng, const nghttp2_frame *frame, void *user) {
    (void)user;
    if (!(frame->hd.flags & NGHTTP2_FLAG_END_STREAM) ||
        (frame->hd.type != NGHTTP2_DATA && frame->hd.type != NGHTTP2_HEADERS))
        return 0;
    h2_stream *st = nghttp2_session_get_stream_user_data(ng, frame->hd.stream_id);
    if (st && st->reset_when_sent && !st->req.body_done)
        nghttp2_submit_rst_stream(ng, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_NO_ERROR);
    return 0;
}

static int on_stream_close(nghttp2_session *ng, int32_t id, uint32_t error_code, void *user) {
    h2_conn *h2 = user;
    h2_stream *st = nghttp2_session_get_stream_user_data(ng, id);
    if (st == NULL)
        return 0;
    /* A tunnel ended well only when both ends sent END_STREAM. */
    bool ended = st->tunnel ? st->tunnel->eof && st->eof_given : st->req.ended;
    stream_gone(st, error_code == NGHTTP2_NO_ERROR && ended ? 0 : -ECONNRESET);
    set_clock(h2);
    return 0;
}

/* The response body's next bytes: what out holds, then the file. */
static ssize_t read_body(nghttp2_session *ng, int32_t id, uint8_t *buf, size_t length,
                         uint32_t *flags, nghttp2_data_source *source, void *user) {
    (void)ng;
    (void)id;
    (void)user;
    h2_stream *st = source->ptr;
    size_t avail = st->out.len - st->out_off;
    if (avail) {
        size_t n = avail < length ? avail : length;
        memcpy(buf, st->out.data + st->out_off, n);
        st->out_off += n;
        if (st->out_off == st->out.len) {
            st->out.len = st->out_off = 0;
            if (st->tunnel)   /* an idle WebSocket holds no buffer, as over HTTP/1.1 */
                tern__bytes_free(&st->out);
        }
        if (st->out.len == 0 && st->file_left == 0 && st->data_end) {
            *flags |= NGHTTP2_DATA_FLAG_EOF;
            st->eof_given = true;
        }
        return (ssize_t)n;
    }
    if (st->file_left) {
        size_t want = st->file_left < length ? st->file_left : length;
        ssize_t n = pread(st->fd, buf, want, st->file_off);
        if (n <= 0)
            return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;   /* the stream is reset */
        st->file_off += n;
        st->file_left -= (size_t)n;
        if (st->file_left == 0) {
            close(st->fd);
            st->fd = -1;
            if (st->data_end) {
                *flags |= NGHTTP2_DATA_FLAG_EOF;
                st->eof_given = true;
            }
        }
        return n;
    }
    if (st->data_end) {
        *flags |= NGHTTP2_DATA_FLAG_EOF;
        st->eof_given = true;
        return 0;
    }
    st->deferred = true;
    return NGHTTP2_ERR_DEFERRED;
}

/* ---- sending ---------------------------------------------------------- */

/* Leaves a session call: the session is freed now if the connection
 * closed inside it. */
static void leave(h2_conn *h2) {
    h2->in_session = false;
    if (h2->dead && h2->ng) {
        nghttp2_session_del(h2->ng);
        h2->ng = NULL;
    }
}

/* Writes what the session has to send, up to H2_BACKLOG_MAX in the
 * backlog; then the drain callbacks of the streams whose bytes left; and
 * ends the connection once the session wants nothing more (after a
 * GOAWAY). Not inside mem_recv: on_data calls it when that returns. */
static void h2_send(h2_conn *h2) {
    if (h2->in_session || h2->dead)
        return;
    h2->in_session = true;
    while (!h2->dead && tern__conn_backlog(&h2->conn) < H2_BACKLOG_MAX) {
        const uint8_t *p;
        ssize_t n = nghttp2_session_mem_send(h2->ng, &p);
        if (n <= 0 || tern__conn_write(&h2->conn, p, (size_t)n) < 0) {
            if (n < 0)   /* out of memory: the end (on_close at the batch end) */
                tern__conn_end(&h2->conn);
            break;
        }
        h2->sent_bytes += (uint64_t)n;
    }
    leave(h2);
    if (h2->dead)
        return;
    /* The stall clock starts when a window shuts on a response, and
     * again for each 4 KiB that still gets through; it stops when the
     * windows open. */
    bool stalled = h2->ng && any_window_shut(h2);
    if (stalled != h2->stalled || (stalled && h2->sent_bytes - h2->sent_mark >= 4096)) {
        h2->stalled = stalled;
        set_clock(h2);
    }
    for (h2_stream *st = h2->streams, *next; st && !h2->dead; st = next) {
        next = st->next;
        tern_http_req *req = &st->req;
        if (st->tunnel) {
            tern__h2_tunnel_ready(st);
            continue;
        }
        if (st->drain_due && st->out.len - st->out_off < H2_STREAM_SOFT) {
            st->drain_due = false;
            if (req->started && !req->ended && req->drain_fn)
                req->drain_fn(req, req->drain_user);
        }
    }
    if (h2->ng && !nghttp2_session_want_read(h2->ng) && !nghttp2_session_want_write(h2->ng))
        tern__conn_end(&h2->conn);
}

/* The session has something to send: it goes at the batch end
 * (on_deferred), never inside the user's call that submitted it, since
 * sending may close streams, and a stream's close frees its request and
 * may run an abort callback. Inside a session call, that call's end
 * sends it. */
void tern__h2_want_send(h2_conn *h2) {
    if (!h2->in_session)
        tern__conn_defer(&h2->conn);
}

/* The stream's provider has more to give. */
void tern__h2_resume(h2_stream *st) {
    if (st->deferred && st->h2 && st->h2->ng) {
        st->deferred = false;
        nghttp2_session_resume_data(st->h2->ng, st->id);
    }
    if (st->h2)
        tern__h2_want_send(st->h2);
}

/* ---- the stream operations (proto.h) ---------------------------------- */

int tern__h2_head(tern_http_req *req, int status, const char *ctype, int64_t length,
                   const void *body, size_t body_len) {
    h2_stream *st = tern__h2_stream_of(req);
    h2_conn *h2 = st->h2;
    tern_server *srv = req->srv;
    /* :status, server, date, content-type, content-length, the
     * handler's fields with their names in lower case (RFC 9113 §8.2.1) */
    size_t nfields = 0, pos = 0;
    tern__http_field f;
    while (tern__http_field_next(req->fields.data, req->fields.len, &pos, &f))
        nfields++;
    nghttp2_nv small_nv[16];
    char small_names[512];
    nghttp2_nv *nv = nfields + 5 <= 16 ? small_nv : malloc((nfields + 5) * sizeof(*nv));
    char *names = req->fields.len <= sizeof(small_names) ? small_names : malloc(req->fields.len);
    if (nv == NULL || names == NULL) {
        if (nv != small_nv)
            free(nv);
        if (names != small_names)
            free(names);
        return -ENOMEM;
    }
    size_t n = 0;
    char code[4] = {(char)('0' + status / 100 % 10), (char)('0' + status / 10 % 10),
                    (char)('0' + status % 10), '\0'};
    char clen[24];
    nv[n++] = (nghttp2_nv){(uint8_t *)":status", (uint8_t *)code, 7, 3, NGHTTP2_NV_FLAG_NONE};
    if (srv->server_line_len)   /* "Server: NAME\r\n" */
        nv[n++] = (nghttp2_nv){(uint8_t *)"server", (uint8_t *)srv->server_line + 8, 6,
                               srv->server_line_len - 10, NGHTTP2_NV_FLAG_NONE};
    size_t date_len;
    const char *date = tern__http_date(srv, &date_len);
    nv[n++] = (nghttp2_nv){(uint8_t *)"date", (uint8_t *)date, 4, date_len, NGHTTP2_NV_FLAG_NONE};
    if (ctype)
        nv[n++] = (nghttp2_nv){(uint8_t *)"content-type", (uint8_t *)ctype, 12, strlen(ctype),
                               NGHTTP2_NV_FLAG_NONE};
    if (length >= 0) {
        size_t l = (size_t)(tern__http_put_u64(clen, (uint64_t)length) - clen);
        nv[n++] = (nghttp2_nv){(uint8_t *)"content-length", (uint8_t *)clen, 14, l,
                               NGHTTP2_NV_FLAG_NONE};
    }
    pos = 0;
    char *np = names;
    while (tern__http_field_next(req->fields.data, req->fields.len, &pos, &f)) {
        for (size_t i = 0; i < f.name_len; i++)
            np[i] = (char)(f.name[i] >= 'A' && f.name[i] <= 'Z' ? f.name[i] + 32 : f.name[i]);
        nv[n++] = (nghttp2_nv){(uint8_t *)np, (uint8_t *)f.value, f.name_len, f.value_len,
                               NGHTTP2_NV_FLAG_NONE};
        np += f.name_len;
    }
    /* A body follows the head unless there is none to send. */
    bool no_body = length == TERN__HTTP_LEN_NONE || req->is_head || length == 0 ||
                   status == 204 || status == 304;
    int r = 0;
    if (!no_body && body_len && tern__bytes_append(&st->out, body, body_len) < 0)
        r = -ENOMEM;
    if (r == 0) {
        st->has_data = !no_body;
        st->data_end = no_body || (length >= 0 && body_len == (uint64_t)length && body_len);
        nghttp2_data_provider prd = {.source.ptr = st, .read_callback = read_body};
        r = nghttp2_submit_response(h2->ng, st->id, nv, n, no_body ? NULL : &prd) == 0 ? 0
                                                                                      : -EPROTO;
    }
    if (nv != small_nv)
        free(nv);
    if (names != small_names)
        free(names);
    if (r < 0)
        return r;
    req->started = true;
    req->fields.len = 0;
    req->resp_status = status;
    TERN__STAT_STATUS(srv, status);
    TERN__STAT_ADD(srv, bytes_out, no_body ? 0 : body_len);
    tern__h2_want_send(h2);
    return TERN_SEND_OK;
}

static int h2_body(tern_http_req *req, const void *data, size_t len) {
    h2_stream *st = tern__h2_stream_of(req);
    if (tern__bytes_append(&st->out, data, len) < 0)
        return -ENOMEM;
    bool over = st->out.len - st->out_off >= H2_STREAM_SOFT;
    tern__h2_resume(st);
    if (over && st->out.len - st->out_off >= H2_STREAM_SOFT) {
        st->drain_due = true;
        return TERN_SEND_BUFFERED;
    }
    return TERN_SEND_OK;
}

static int h2_file(tern_http_req *req, int fd, off_t offset, size_t len) {
    h2_stream *st = tern__h2_stream_of(req);
    st->fd = fd;
    st->file_off = offset;
    st->file_left = len;
    st->data_end = true;
    tern__h2_resume(st);
    return TERN_SEND_OK;
}

static int h2_end(tern_http_req *req) {
    h2_stream *st = tern__h2_stream_of(req);
    st->data_end = true;
    tern__h2_resume(st);
    return TERN_SEND_OK;
}

static size_t h2_buffered(const tern_http_req *req) {
    const h2_stream *st = tern__h2_stream_of(req);
    return st->out.len - st->out_off + st->file_left;
}

/* The response ended: whatever it promised is all there is. The stream
 * closes (and frees req) when the session has sent it and the peer's
 * side is done too. */
static void h2_ended(tern_http_req *req) {
    h2_stream *st = tern__h2_stream_of(req);
    if (st->has_data && !st->data_end) {
        st->data_end = true;
        tern__h2_resume(st);
    }
    if (!req->body_done && req->body_mode != TERN__BODY_DROP) {
        /* Answered before the body ended: the rest is dropped as it comes,
         * and what the handler never took is given back to the window. */
        req->body_mode = TERN__BODY_DROP;
        consume_held(st, st->pending.len);
        st->pending.len = 0;
    }
    if (!req->body_done)
        st->reset_when_sent = true;
    if (st->h2)
        set_clock(st->h2);
}

/* Pieces held before the handler asked go to it at the batch end
 * (on_deferred), never inside tern_http_read_body. */
static void h2_read_body(tern_http_req *req) {
    h2_stream *st = tern__h2_stream_of(req);
    send_continue(st);
    if (st->pending.len || req->body_done || req->body_mode != TERN__BODY_STREAM) {
        st->deliver_due = true;
        tern__conn_defer(&st->h2->conn);
    }
}

const tern__http_proto tern__h2_proto = {
    .head = tern__h2_head,
    .body = h2_body,
    .file = h2_file,
    .end = h2_end,
    .buffered = h2_buffered,
    .ended = h2_ended,
    .read_body = h2_read_body,
    .tunnel = tern__h2_open_tunnel,
};

/* ---- the connection --------------------------------------------------- */

static size_t on_data(tern__conn *c, char *data, size_t len) {
    h2_conn *h2 = (h2_conn *)c;
    if (h2->dead)
        return len;
    h2->in_session = true;
    ssize_t r = nghttp2_session_mem_recv(h2->ng, (const uint8_t *)data, len);
    leave(h2);
    TERN__STAT_ADD(h2->srv, bytes_in, len);
    if (h2->dead)   /* closed from inside (a handler freed its server) */
        return len;
    if (h2->body_bytes - h2->body_mark >= 4096)
        set_clock(h2);
    if (r < 0) {
        /* The session has queued its GOAWAY: it goes, then the end. A
         * flood has none queued (SETTINGS or PING acks past
         * max_outbound_ack unsent; CONTINUATION frames past
         * max_continuations for one header block): ENHANCE_YOUR_CALM
         * says why. */
        if (r == NGHTTP2_ERR_FLOODED || r == NGHTTP2_ERR_TOO_MANY_CONTINUATIONS)
            nghttp2_session_terminate_session(h2->ng, NGHTTP2_ENHANCE_YOUR_CALM);
        h2_send(h2);
        tern__conn_end(c);
        return len;
    }
    h2_send(h2);
    return len;
}

static void on_eof(tern__conn *c) {
    h2_conn *h2 = (h2_conn *)c;
    if (h2->nstreams)
        tern__conn_close(c, -ECONNRESET);   /* their requests can never complete */
    else
        tern__conn_end(c);
}

static void on_drain(tern__conn *c) {
    h2_send((h2_conn *)c);
}

static void on_timeout(tern__conn *c) {
    h2_conn *h2 = (h2_conn *)c;
    bool body_clock = false;
    for (h2_stream *st = h2->streams; st; st = st->next)
        body_clock = body_clock || awaits_body(st);
    if (!body_clock && any_window_shut(h2)) {
        /* The stall clock: the peer kept its window shut on an answer for
         * the send timeout (as a peer not reading over HTTP/1.1). */
        tern__conn_close(c, -ETIMEDOUT);
        return;
    }
    if (h2->nstreams) {
        /* The body clock: a body that stopped coming is answered 408
         * (reset once sent), or reset when its answer had started. */
        for (h2_stream *st = h2->streams, *next; st; st = next) {
            next = st->next;
            if (!awaits_body(st))
                continue;
            st->req.body_mode = TERN__BODY_DROP;
            consume_held(st, st->pending.len);
            st->pending.len = 0;
            /* A handler holding the request hears of it by the abort (the
             * reset closes the stream); else the server answers. */
            if (st->req.started || st->req.dispatched)
                nghttp2_submit_rst_stream(h2->ng, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_CANCEL);
            else
                refuse(st, 408);
        }
        h2_send(h2);
        set_clock(h2);
        return;
    }
    /* Idle: a GOAWAY says why, then the end. */
    nghttp2_submit_goaway(h2->ng, NGHTTP2_FLAG_NONE,
                          nghttp2_session_get_last_proc_stream_id(h2->ng), NGHTTP2_NO_ERROR,
                          NULL, 0);
    h2_send(h2);
    tern__conn_end(c);
}

/* The server's graceful shutdown: a GOAWAY naming the last stream taken;
 * the streams open finish, then the connection ends (h2_send). */
static void on_shutdown(tern__conn *c) {
    h2_conn *h2 = (h2_conn *)c;
    if (h2->goaway || h2->dead)
        return;
    h2->goaway = true;
    nghttp2_submit_goaway(h2->ng, NGHTTP2_FLAG_NONE,
                          nghttp2_session_get_last_proc_stream_id(h2->ng), NGHTTP2_NO_ERROR,
                          NULL, 0);
    if (h2->nstreams) {
        tern__h2_want_send(h2);   /* may be inside a user's call (tern_server_shutdown) */
        return;
    }
    h2_send(h2);   /* no stream to close: nothing of the user's runs */
    tern__conn_end(c);
}

static void on_close(tern__conn *c, int err) {
    h2_conn *h2 = (h2_conn *)c;
    while (h2->streams)
        stream_gone(h2->streams, err ? err : -ECONNRESET);
    h2->dead = true;
    if (!h2->in_session) {
        nghttp2_session_del(h2->ng);
        h2->ng = NULL;
    }
    tern__http_conn_closed_by_server(h2->srv, c);
}

/* The bodies held for handlers that asked for them meanwhile, then what
 * the session has to send (want_send). */
static void on_deferred(tern__conn *c) {
    h2_conn *h2 = (h2_conn *)c;
    for (h2_stream *st = h2->streams, *next; st; st = next) {
        next = st->next;
        if (!st->deliver_due)
            continue;
        st->deliver_due = false;
        tern_http_req *req = &st->req;
        if (req->ended || req->body_fn == NULL)
            continue;
        if (st->pending.len) {
            size_t n = st->pending.len;
            st->pending.len = 0;
            req->body_fn(req, st->pending.data, n, false, req->body_user);
            consume_held(st, n);
        }
        if (st->h2 && req->body_done && !req->ended)
            req->body_fn(req, "", 0, true, req->body_user);
    }
    h2_send(h2);
}

static uint32_t send_timeout(const tern__conn *c) {
    return ((const h2_conn *)c)->srv->cfg->opt.send_timeout_ms;
}

static const tern__conn_proto h2_conn_proto = {
    .on_data = on_data,
    .on_eof = on_eof,
    .on_drain = on_drain,
    .on_timeout = on_timeout,
    .on_shutdown = on_shutdown,
    .on_close = on_close,
    .on_deferred = on_deferred,
    .send_timeout = send_timeout,
};

static nghttp2_session *session_new(h2_conn *h2) {
    nghttp2_session_callbacks *cb;
    if (nghttp2_session_callbacks_new(&cb) != 0)
        return NULL;
    nghttp2_session_callbacks_set_on_begin_frame_callback(cb, on_begin_frame);
    nghttp2_session_callbacks_set_on_begin_headers_callback(cb, on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback(cb, on_header);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, on_frame_recv);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data_chunk);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb, on_stream_close);
    nghttp2_session_callbacks_set_on_frame_send_callback(cb, on_frame_send);
    nghttp2_option *opt;
    if (nghttp2_option_new(&opt) != 0) {
        nghttp2_session_callbacks_del(cb);
        return NULL;
    }
    /* Windows open as handlers take the bytes (consume), not as they
     * arrive. */
    nghttp2_option_set_no_auto_window_update(opt, 1);
    /* The floods' bounds, named though they are nghttp2's defaults: 32
     * entries in one SETTINGS frame, 1000 SETTINGS and PING acks unsent,
     * 8 CONTINUATION frames after one HEADERS (CVE-2024-27316's kin). */
    nghttp2_option_set_max_settings(opt, 32);
    nghttp2_option_set_max_outbound_ack(opt, 1000);
    nghttp2_option_set_max_continuations(opt, 8);
    nghttp2_session *ng = NULL;
    int r = nghttp2_session_server_new2(&ng, cb, h2, opt);
    nghttp2_option_del(opt);
    nghttp2_session_callbacks_del(cb);
    return r == 0 ? ng : NULL;
}

int tern__h2_start(tern__http_conn *hc, const char *rest, size_t len) {
    tern_server *srv = hc->srv;
    h2_conn *h2 = calloc(1, sizeof(*h2));
    if (h2 == NULL)
        return -ENOMEM;
    h2->srv = srv;
    h2->ng = session_new(h2);
    const tern_server_options *o = &srv->cfg->opt;
    /* RFC 8441's extended CONNECT is offered where there are WebSocket
     * routes to take it (the last entry, left out without them). */
    nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, o->http2_max_streams},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, (uint32_t)o->max_head},
        {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
        {NGHTTP2_SETTINGS_ENABLE_CONNECT_PROTOCOL, 1},
    };
    size_t niv = sizeof(iv) / sizeof(iv[0]) - (srv->cfg->upgrade ? 0 : 1);
    int err = h2->ng ? 0 : -ENOMEM;
    if (err == 0 && nghttp2_submit_settings(h2->ng, NGHTTP2_FLAG_NONE, iv, niv) != 0)
        err = -ENOMEM;
    if (err == 0)
        err = tern__conn_move(&hc->conn, &h2->conn, &h2_conn_proto);
    if (err < 0) {
        if (h2->ng)
            nghttp2_session_del(h2->ng);
        free(h2);
        return err;
    }
    set_clock(h2);
    /* The preface and what came with it, fed at the batch end. */
    if (tern__conn_inject(&h2->conn, rest, len) < 0)
        tern__conn_close(&h2->conn, -ENOMEM);
    return 0;
}
