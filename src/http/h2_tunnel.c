/* HTTP/2's tunnels (RFC 8441): a stream that an extended CONNECT turned
 * into a WebSocket, as a tern__conn of its own whose transport carries
 * the stream (h2_internal.h's h2_tunnel). */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "http/h2_internal.h"

static h2_tunnel *tunnel_of(const tern__conn *c) { return (h2_tunnel *)(void *)c->tp; }

/* Bytes the stream may take now: what the peer's windows (the stream's
 * and the connection's) leave beyond what out already holds, and no more
 * than H2_STREAM_SOFT held in out. */
static size_t tunnel_room(const h2_stream *st) {
    nghttp2_session *ng = st->h2->ng;
    int32_t sw = nghttp2_session_get_stream_remote_window_size(ng, st->id);
    int32_t cw = nghttp2_session_get_remote_window_size(ng);
    int64_t win = sw < cw ? sw : cw;
    if (win > H2_STREAM_SOFT)
        win = H2_STREAM_SOFT;
    int64_t held = (int64_t)(st->out.len - st->out_off);
    return win > held ? (size_t)(win - held) : 0;
}

/* The peer's DATA, read: the window opens by as much. */
static ssize_t tunnel_recv(tern__conn *c, char *buf, size_t len) {
    h2_tunnel *t = tunnel_of(c);
    h2_stream *st = t->st;
    if (st == NULL)
        return 0;
    size_t n = st->pending.len < len ? st->pending.len : len;
    if (n == 0)
        return t->eof ? 0 : -EAGAIN;
    memcpy(buf, st->pending.data, n);
    memmove(st->pending.data, st->pending.data + n, st->pending.len - n);
    st->pending.len -= n;
    if (st->pending.len == 0)
        tern__bytes_free(&st->pending);   /* no buffer while idle */
    if (st->h2->ng)   /* the stream's window; the connection's opened on arrival */
        nghttp2_session_consume_stream(st->h2->ng, st->id, n);
    tern__h2_want_send(st->h2);   /* the WINDOW_UPDATE */
    return (ssize_t)n;
}

/* As much of iov as the windows let go, as the stream's DATA; the rest
 * is net's backlog until the peer opens them (tunnel_ready). */
static ssize_t tunnel_send(tern__conn *c, const struct iovec *iov, int iovcnt) {
    h2_stream *st = tunnel_of(c)->st;
    if (st == NULL || st->h2->ng == NULL || st->data_end)
        return -EPIPE;
    size_t room = tunnel_room(st);
    if (room == 0)
        return -EAGAIN;
    size_t taken = 0;
    for (int i = 0; i < iovcnt && taken < room; i++) {
        size_t n = iov[i].iov_len < room - taken ? iov[i].iov_len : room - taken;
        if (n && tern__bytes_append(&st->out, iov[i].iov_base, n) < 0)
            return taken ? (ssize_t)taken : -ENOMEM;
        taken += n;
    }
    tern__h2_resume(st);
    return (ssize_t)taken;
}

static ssize_t tunnel_send_file(tern__conn *c, int fd, off_t *off, size_t len) {
    (void)c;
    (void)fd;
    (void)off;
    (void)len;
    return -EOPNOTSUPP;   /* a WebSocket sends no files */
}

/* Our end: END_STREAM after what out holds. */
static int tunnel_shutdown(tern__conn *c) {
    h2_stream *st = tunnel_of(c)->st;
    if (st == NULL)
        return -EPIPE;
    st->data_end = true;
    tern__h2_resume(st);
    return 0;
}

static bool tunnel_pending(const tern__conn *c) {
    const h2_tunnel *t = tunnel_of(c);
    return t->st && (t->st->pending.len || t->eof);
}

/* The connection closed. A stream still open: what was not read is
 * given back to the window; a connection that ended as asked has its
 * last bytes and END_STREAM still go when the session has not sent them
 * (a WebSocket's close frame), then the stream is reset unless the peer
 * ended too (on_frame_send); else it is reset now (NO_ERROR after our
 * END_STREAM, CANCEL for a failure). Its request is freed when the
 * session closes it. */
static void tunnel_release(tern__conn *c) {
    h2_tunnel *t = tunnel_of(c);
    h2_stream *st = t->st;
    if (st) {
        st->tunnel = NULL;
        h2_conn *h2 = st->h2;
        if (h2->ng && st->pending.len)
            nghttp2_session_consume_stream(h2->ng, st->id, st->pending.len);
        st->pending.len = 0;
        bool clean = c->err == 0;
        if (clean && !st->eof_given) {
            st->data_end = true;
            st->reset_when_sent = true;
            tern__h2_resume(st);
        } else if (h2->ng) {
            st->data_end = true;
            nghttp2_submit_rst_stream(h2->ng, NGHTTP2_FLAG_NONE, st->id,
                                      clean ? NGHTTP2_NO_ERROR : NGHTTP2_CANCEL);
            tern__h2_want_send(h2);
        }
    }
    free(t);
}

static const char *tunnel_server_name(const tern__conn *c) {
    const h2_stream *st = tunnel_of(c)->st;
    return st ? st->h2->conn.tp->ops->server_name(&st->h2->conn) : NULL;
}

static void tunnel_moved(tern__conn *c) { tunnel_of(c)->c = c; }

static const tern__conn *tunnel_carrier(const tern__conn *c) {
    const h2_stream *st = tunnel_of(c)->st;
    return st ? &st->h2->conn : NULL;
}

static const tern__transport_ops tunnel_ops = {
    .recv = tunnel_recv,
    .send = tunnel_send,
    .send_file = tunnel_send_file,
    .shutdown = tunnel_shutdown,
    .pending = tunnel_pending,
    .release = tunnel_release,
    .server_name = tunnel_server_name,
    .moved = tunnel_moved,
    .carrier = tunnel_carrier,
};

/* The tunnel's connection before the WebSocket takes it over
 * (tern__conn_move): nothing reads or writes it, and a close (the
 * WebSocket could not be made) only resets the stream (release). */
static size_t idle_on_data(tern__conn *c, char *data, size_t len) {
    (void)c;
    (void)data;
    return len;
}
static void idle_on_eof(tern__conn *c) { tern__conn_end(c); }
static void idle_on_drain(tern__conn *c) { (void)c; }
static void idle_on_timeout(tern__conn *c) { tern__conn_close(c, -ETIMEDOUT); }
static void idle_on_shutdown(tern__conn *c) { tern__conn_end(c); }
static void idle_on_close(tern__conn *c, int err) {
    (void)err;
    /* the count h2_tunnel took for it goes back */
    tern__http_conn_closed_by_server(tern__container_of(c->list, tern_server, conns), c);
}

static const tern__conn_proto tunnel_idle_proto = {
    .on_data = idle_on_data,
    .on_eof = idle_on_eof,
    .on_drain = idle_on_drain,
    .on_timeout = idle_on_timeout,
    .on_shutdown = idle_on_shutdown,
    .on_close = idle_on_close,
};

/* Tells a tunnel's connection what it can do now: read (DATA or the end
 * arrived) and write (its backlog waits and the windows opened). Called
 * by h2_send once the session's bytes went, outside any session call. */
void tern__h2_tunnel_ready(h2_stream *st) {
    tern__conn *c = st->tunnel->c;
    uint32_t ev = 0;
    if (st->pending.len || st->tunnel->eof)
        ev |= TERN__IO_IN;
    if (tern__conn_backlog(c) && tunnel_room(st))
        ev |= TERN__IO_OUT;
    if (ev)
        tern__conn_ready(c, ev);
}

/* RFC 8441: the extended CONNECT is answered 200 with the upgrade's
 * fields, then the handler's (protocol is :protocol, already checked),
 * and the stream becomes a connection of its own (h2_tunnel). The
 * request is done with: the stream's request part stays until the
 * stream closes, holding nothing but the stream's state. */
tern__conn *tern__h2_open_tunnel(tern_http_req *req, const char *protocol,
                                 const tern__http_field *fields, size_t n) {
    (void)protocol;
    h2_stream *st = tern__h2_stream_of(req);
    h2_conn *h2 = st->h2;
    tern__bytes all = {0};
    for (size_t i = 0; i < n; i++)
        if (tern__bytes_append(&all, fields[i].name, fields[i].name_len + 1) < 0 ||
            tern__bytes_append(&all, fields[i].value, fields[i].value_len + 1) < 0) {
            tern__bytes_free(&all);
            return NULL;
        }
    if (req->fields.len && tern__bytes_append(&all, req->fields.data, req->fields.len) < 0) {
        tern__bytes_free(&all);
        return NULL;
    }
    h2_tunnel *t = calloc(1, sizeof(*t));
    tern__conn *c = calloc(1, sizeof(*c));
    if (t == NULL || c == NULL) {
        free(t);
        free(c);
        tern__bytes_free(&all);
        return NULL;
    }
    t->tp.ops = &tunnel_ops;
    t->c = c;
    if (tern__conn_start_carried(h2->conn.loop, c, &t->tp, &tunnel_idle_proto, h2->conn.list) <
        0) {
        free(t);
        free(c);
        tern__bytes_free(&all);
        return NULL;
    }
    /* The WebSocket counts as a connection of the server's (its close
     * gives one back, tern__http_conn_closed_by_server), as over
     * HTTP/1.1; it holds no per-address slot (owner_tag 0). */
    atomic_fetch_add_explicit(&req->srv->cfg->admit.open, 1, memory_order_relaxed);
    tern__bytes_free(&req->fields);
    req->fields = all;
    if (tern__h2_head(req, 200, NULL, TERN__HTTP_LEN_STREAM, NULL, 0) < 0) {
        tern__conn_close(c, -ENOMEM);   /* t has no stream: nothing is reset */
        return NULL;
    }
    t->st = st;
    st->tunnel = t;
    /* From here body_done says the peer's END_STREAM came (tunnel_release
     * and on_frame_send read it once the tunnel is gone). */
    req->ended = true;
    tern__bytes_free(&st->hdr);
    tern__bytes_free(&req->fields);
    return c;
}

