/* One WebSocket connection: reading frames, assembling messages, the
 * closing handshake, keep-alive pings, and sending.
 *
 * Frames are parsed in place in the loop's read buffer and unmasked there.
 * A message that arrives whole in one read is handed to on_message as a
 * view of that buffer; only messages split across frames or reads (or
 * compressed ones) are gathered into the receive state's msg, freed once the
 * message is delivered, so an idle connection holds no buffer. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "loop/check.h"
#include "loop/log.h"
#include "ws/utf8.h"
#include "ws/ws.h"

/* An idle WebSocket is this struct and nothing else: its size is the
 * memory budget's (docs/ARCHITECTURE.md, the 18 000-connection test). */
_Static_assert(sizeof(struct tern_ws) <= 168, "tern_ws grew past 168 bytes");

/* The receive state of a split frame or message, or NULL; the
 * permessage-deflate state, or NULL (both live in ws->ext). */
static tern__ws_rx *rx_of(const tern_ws *ws) {
    return ws->ext && ws->ext->rx_on ? &ws->ext->rx : NULL;
}
static tern__ws_pmd *pmd_of(const tern_ws *ws) {
    return ws->ext && ws->ext->pmd_on ? &ws->ext->pmd : NULL;
}

static size_t on_data(tern__conn *c, char *data, size_t len);
static void on_eof(tern__conn *c);
static void on_drain(tern__conn *c);
static void on_timeout(tern__conn *c);
static void on_shutdown(tern__conn *c);
static void on_close(tern__conn *c, int err);
static void on_deferred(tern__conn *c);
static uint32_t send_timeout(const tern__conn *c);
static void on_free(tern__conn *c);

static const tern__conn_proto ws_proto = {
    .on_data = on_data,
    .on_eof = on_eof,
    .on_drain = on_drain,
    .on_timeout = on_timeout,
    .on_shutdown = on_shutdown,
    .on_close = on_close,
    .on_deferred = on_deferred,
    .send_timeout = send_timeout,
    .on_free = on_free,
};

/* The reason tern puts in the close frames it sends itself; on_close gets
 * the same code and reason. */
static const char *close_reason(int code) {
    switch (code) {
    case TERN_WS_PROTOCOL_ERROR: return "protocol error";
    case TERN_WS_INVALID_DATA: return "invalid UTF-8";
    case TERN_WS_POLICY:
    case TERN_WS_TRY_AGAIN: return "slow consumer";
    case TERN_WS_TOO_BIG: return "message too big";
    case TERN_WS_INTERNAL: return "internal error";
    default: return "";
    }
}

/* This loop's server (the route belongs to every loop's): the owner of
 * the list the connection is on, which net keeps known after the close.
 * NULL for a client's connection, which no server owns. */
static tern_server *srv_of(const tern_ws *ws) {
    return ws->conn.list ? tern__container_of(ws->conn.list, tern_server, conns) : NULL;
}

/* A server's counters; a client has none. */
#define WS_STAT_ADD(ws, field, n)                                                             \
    do {                                                                                      \
        tern_server *srv_ = srv_of(ws);                                                       \
        if (srv_)                                                                             \
            TERN__STAT_ADD(srv_, field, n);                                                   \
        if ((ws)->ext && (ws)->ext->acct)                                                     \
            (ws)->ext->acct->field += (n);                                                    \
    } while (0)

/* The session's first close frame, for the access log. */
static void acct_close(tern_ws *ws, int code, bool ours) {
    tern__ws_acct *a = ws->ext ? ws->ext->acct : NULL;
    if (a && a->close_code == 0) {
        a->close_code = code;
        a->close_by_server = ours;
    }
}

static bool gone(const tern_ws *ws) {
    return (ws->conn.flags & TERN__CONN_CLOSED) || ws->state == TERN__WS_DONE;
}

/* ---- sending ---------------------------------------------------------- */

/* A client's frame: masked with a fresh key (RFC 6455 §5.3), so the
 * payload is copied, into the cork buffer when it fits or else into a
 * buffer of its own, and masked as it is copied; the header is written
 * there directly. */
static int write_masked(tern_ws *ws, uint8_t opcode, bool fin, bool rsv1, const void *data,
                        size_t len) {
    uint8_t key[4];
    tern__ws_mask_key(key);
    size_t hl = tern__ws_header_len(len, true);
    char *dst = tern__conn_reserve(&ws->conn, hl + len);
    char *own = NULL;
    if (dst == NULL && (dst = own = malloc(hl + len)) == NULL)
        return -ENOMEM;
    tern__ws_write_header((uint8_t *)dst, fin, rsv1, opcode, len, key);
    if (len)
        tern__ws_mask_copy((uint8_t *)dst + hl, data, len, key);
    if (own == NULL) {
        tern__conn_commit(&ws->conn, hl + len);
        return TERN_SEND_OK;
    }
    int r = tern__conn_write(&ws->conn, own, hl + len);
    free(own);
    return r;
}

static int write_frame(tern_ws *ws, uint8_t opcode, bool fin, bool rsv1, const void *data,
                       size_t len) {
    if (ws->ep->role == TERN__WS_CLIENT)
        return write_masked(ws, opcode, fin, rsv1, data, len);
    uint8_t hdr[TERN__WS_MAX_HEADER];
    size_t hl = tern__ws_write_header(hdr, fin, rsv1, opcode, len, NULL);
    struct iovec iov[2] = {{hdr, hl}, {(void *)data, len}};
    WS_STAT_ADD(ws, bytes_out, hl + len);
    if (fin && opcode < 8)
        WS_STAT_ADD(ws, ws_out, 1);
    return tern__conn_writev(&ws->conn, iov, len ? 2 : 1);
}

/* The pub/sub layer forgets the connection's subscriptions (when it has
 * any registry on this loop): before on_close, and again (a no-op then)
 * when the connection is freed. */
static void pubsub_forget(tern_ws *ws) {
    tern_server *srv = srv_of(ws);
    if (srv)
        tern__srv_ws_closed(srv, ws);
}

static void notify_close(tern_ws *ws, int code, const char *reason, size_t reason_len) {
    if (ws->state == TERN__WS_DONE)
        return;
    ws->state = TERN__WS_DONE;
    ws->deadline_armed = false;
    pubsub_forget(ws);
    if (ws->ep->h.on_close)
        ws->ep->h.on_close(ws, code, reason, reason_len, ws->ep->user);
}

static void send_close_frame(tern_ws *ws, int code, const char *reason, size_t reason_len) {
    uint8_t payload[125];
    size_t n = 0;
    acct_close(ws, code, true);
    if (code != TERN_WS_NO_STATUS) {
        payload[0] = (uint8_t)(code >> 8);
        payload[1] = (uint8_t)code;
        if (reason_len > 123)
            reason_len = 123;
        if (reason_len)   /* reason may be NULL then (tern_ws_close's) */
            memcpy(payload + 2, reason, reason_len);
        n = 2 + reason_len;
    }
    write_frame(ws, TERN__WS_OP_CLOSE, true, false, payload, n);
}

/* The TCP end after the closing handshake (or a failure), from the
 * connection's own events. The server closes first (§7.1.1) but lingers
 * to read the client's last bytes. A client, which may close any time
 * after sending and receiving a close frame, closes as soon as its last
 * frame is flushed: nothing is left of its connection after the batch in
 * which on_close ran, so a program may stop and free its loop there. */
static void finish(tern_ws *ws) {
    tern__conn_end(&ws->conn);
    if (ws->ep->role == TERN__WS_CLIENT && (ws->conn.flags & TERN__CONN_LINGER))
        tern__conn_close(&ws->conn, 0);
}

/* Fails the connection (RFC 6455 §7.1.7): a close frame with the code,
 * on_close, then the TCP close once the frame is out. Only from the
 * connection's own events (never inside a user's call). */
static void fail(tern_ws *ws, int code) {
    if (gone(ws))
        return;
    const char *reason = close_reason(code);
    size_t rl = strlen(reason);
    if (ws->state == TERN__WS_OPEN)
        send_close_frame(ws, code, reason, rl);
    notify_close(ws, code, reason, rl);
    finish(ws);
}

/* The close policy: a close frame with 1008 goes after the backlog (past
 * the limit: it is small), and the connection ends when that is flushed,
 * or when the peer takes nothing of it for close_timeout_ms. This runs
 * inside the user's send (a broadcast loop, typically), so on_close is
 * not called here but at the end of the batch (on_deferred): the loop
 * may go on, and free what it likes in on_close afterwards. */
void tern__ws_policy_close(tern_ws *ws) { tern__ws_policy_close_code(ws, TERN_WS_POLICY); }

void tern__ws_policy_close_code(tern_ws *ws, int code) {
    if (gone(ws))
        return;
    tern__conn_set_out_limit(&ws->conn, 0);
    ws->close_1013 = code == TERN_WS_TRY_AGAIN;
    code = ws->close_1013 ? TERN_WS_TRY_AGAIN : TERN_WS_POLICY;
    if (ws->state == TERN__WS_OPEN)
        send_close_frame(ws, code, close_reason(code), 13);
    ws->state = TERN__WS_DONE;
    ws->deadline_armed = false;
    ws->close_due = true;
    tern__conn_defer(&ws->conn);
    tern__conn_end(&ws->conn);
}

static void on_deferred(tern__conn *c) {
    tern_ws *ws = (tern_ws *)c;
    if (ws->close_due) {
        ws->close_due = false;
        pubsub_forget(ws);
        int code = ws->close_abort ? TERN_WS_ABNORMAL
                   : ws->close_1013 ? TERN_WS_TRY_AGAIN : TERN_WS_POLICY;
        const char *reason = ws->close_abort ? "" : close_reason(code);
        if (ws->ep->h.on_close)
            ws->ep->h.on_close(ws, code, reason, strlen(reason), ws->ep->user);
        if (srv_of(ws) == NULL && (ws->conn.flags & TERN__CONN_CLOSED))
            tern__ws_client_release(ws->ep);   /* on_close (net's) came first and left it */
    }
}

/* Net's send clock runs for a WebSocket only once it is ending (its idle
 * clock runs otherwise): the close frame must go out within this. */
static uint32_t send_timeout(const tern__conn *c) {
    return ((const tern_ws *)c)->ep->opt.close_timeout_ms;
}

static void policy_pause(tern_ws *ws) {
    if (!ws->paused_by_policy) {
        ws->paused_by_policy = true;
        tern__conn_pause(&ws->conn);
    }
}

/* The loop's clock in ms, truncated: soft_since needs only differences
 * far shorter than the 49 days it takes to wrap. */
static uint32_t clock32(const tern_ws *ws) { return (uint32_t)tern_loop_now(ws->conn.loop); }

/* How long the backlog has been over the soft limit (ws->soft_since != 0). */
static uint32_t soft_spent(const tern_ws *ws) { return clock32(ws) - ws->soft_since; }

static const char *slow_policy_name(int policy) {
    switch (policy) {
    case TERN_WS_SLOW_DROP: return "drop";
    case TERN_WS_SLOW_PAUSE: return "pause";
    default: return "close";
    }
}

/* The info line of the policy acting on a slow consumer (logging.md),
 * with the policy's name: past the grace period, or at the hard limit
 * (a send dropped, or the connection closed for it). */
static void log_slow(const tern_ws *ws) {
    tern__log(TERN_LOG_INFO, TERN__LOG_WS_SLOW, "ws: slow consumer, %zu bytes behind: policy %s",
              tern__conn_buffered(&ws->conn), slow_policy_name(ws->ep->opt.slow_policy));
}

/* Over the soft limit past the grace period. */
static void apply_policy(tern_ws *ws) {
    log_slow(ws);
    switch (ws->ep->opt.slow_policy) {
    case TERN_WS_SLOW_CLOSE:
        tern__ws_policy_close(ws);
        break;
    case TERN_WS_SLOW_PAUSE:
        policy_pause(ws);
        break;
    default:   /* drop: dropping() refuses sends from now on */
        break;
    }
}

/* The connection's one wheel timeout serves the idle ping and the end of
 * the backlog's grace period, whichever comes first; grace_wake says which
 * it was armed for. */
static void arm_timeout(tern_ws *ws) {
    if (ws->deadline_armed)
        return;   /* the user's deadline holds the entry (tern_ws_set_deadline) */
    const tern_ws_options *o = &ws->ep->opt;
    uint64_t t = o->idle_timeout_ms;
    ws->grace_wake = false;
    if (ws->soft_since) {
        uint64_t spent = soft_spent(ws);
        if (spent < o->backlog_grace_ms && o->backlog_grace_ms - spent < t) {
            t = o->backlog_grace_ms - spent;
            ws->grace_wake = true;
        }
    }
    tern__conn_set_timeout(&ws->conn, t);
}

/* Applies the slow-consumer policy after a send. Returns the result the
 * caller should report. With the pause policy nothing is dropped: the
 * connection has no hard limit, and reading stops as soon as the backlog
 * passes it (so an echo's backlog is bounded by what one read brings). */
static int check_backlog(tern_ws *ws, int r) {
    const tern_ws_options *o = &ws->ep->opt;
    if (r == TERN_SEND_DROPPED) {
        /* The hard limit: dropped, and under the close policy closed. */
        log_slow(ws);
        if (o->slow_policy == TERN_WS_SLOW_CLOSE)
            tern__ws_policy_close(ws);
        return r;
    }
    if (r != TERN_SEND_BUFFERED)
        return r;
    size_t buffered = tern__conn_buffered(&ws->conn);
    if (o->slow_policy == TERN_WS_SLOW_PAUSE && buffered > o->backlog_hard) {
        policy_pause(ws);
        return r;
    }
    if (buffered <= o->backlog_soft)
        return r;
    if (ws->soft_since == 0) {
        /* The grace period starts; the connection's timeout now also
         * watches its end, in case no further send comes to check. */
        uint32_t now = clock32(ws);
        ws->soft_since = now ? now : 1;
        arm_timeout(ws);
        return r;
    }
    if (soft_spent(ws) >= o->backlog_grace_ms)
        apply_policy(ws);
    return r;
}

/* Pausing bounds only the answers to what the peer sends: a message the
 * server pushes on its own (not from this connection's on_message or
 * on_fragment) to a peer that does not read would queue without bound. So
 * under the pause policy a push that would take the backlog past the hard
 * limit closes the connection with 1008, as the close policy does. */
static bool push_refused(tern_ws *ws, size_t len) {
    const tern_ws_options *o = &ws->ep->opt;
    if (o->slow_policy != TERN_WS_SLOW_PAUSE || ws->in_delivery ||
        tern__conn_backlog(&ws->conn) + len <= o->backlog_hard)
        return false;
    log_slow(ws);
    tern__ws_policy_close(ws);
    return true;
}

/* The loop-thread rule of the calls that return int (loop.h,
 * tern__loop_thread_ok): made after the state's check, since a referenced
 * connection that closed may outlive its loop, and then answers -EPIPE
 * without reading it. */
#define WS_ON_THREAD(ws) tern__loop_thread_ok((ws)->conn.loop, __func__)

static bool may_send(const tern_ws *ws) {
    return ws->state == TERN__WS_OPEN && !(ws->conn.flags & TERN__CONN_CLOSED);
}

/* Over the soft limit past the grace period with the drop policy: new
 * messages are dropped until the backlog drains. */
static bool dropping(const tern_ws *ws) {
    const tern_ws_options *o = &ws->ep->opt;
    return o->slow_policy == TERN_WS_SLOW_DROP && ws->soft_since &&
           soft_spent(ws) >= o->backlog_grace_ms;
}

int tern_ws_send(tern_ws *ws, const void *data, size_t len, int opcode) {
    if (ws == NULL || (data == NULL && len > 0))
        return -EINVAL;
    if (opcode != TERN_WS_TEXT && opcode != TERN_WS_BINARY)
        return -EINVAL;
    if (!may_send(ws) || ws->sending_fragments)
        return ws->sending_fragments ? -EBUSY : -EPIPE;
    if (!WS_ON_THREAD(ws))
        return -EPERM;
    if (dropping(ws) || push_refused(ws, len))
        return TERN_SEND_DROPPED;
    int r;
    tern__ws_pmd *pmd = pmd_of(ws);
    if (pmd && len >= ws->ep->opt.compress_min) {
        if (pmd->deflater == NULL) {
            pmd->deflater = tern__pmd_deflater_new(pmd->deflate_bits, ws->ep->pmd.mem_level);
            if (pmd->deflater == NULL)
                return -ENOMEM;
        }
        uint8_t *out;
        ssize_t n = tern__pmd_deflate(pmd->deflater, data, len,
                                      pmd->deflate_nct, &out);
        if (n < 0)
            return (int)n;
        r = write_frame(ws, (uint8_t)opcode, true, true, out, (size_t)n);
        free(out);
    } else {
        r = write_frame(ws, (uint8_t)opcode, true, false, data, len);
    }
    return check_backlog(ws, r);
}

int tern_ws_send_fragment(tern_ws *ws, const void *data, size_t len, int opcode, bool fin) {
    if (ws == NULL || (data == NULL && len > 0))
        return -EINVAL;
    if (!may_send(ws))
        return -EPIPE;
    if (!WS_ON_THREAD(ws))
        return -EPERM;
    uint8_t op = TERN__WS_OP_CONT;
    if (!ws->sending_fragments) {
        if (opcode != TERN_WS_TEXT && opcode != TERN_WS_BINARY)
            return -EINVAL;
        op = (uint8_t)opcode;
    }
    if (push_refused(ws, len))
        return TERN_SEND_DROPPED;
    ws->sending_fragments = !fin;
    return check_backlog(ws, write_frame(ws, op, fin, false, data, len));
}

int tern_ws_ping(tern_ws *ws, const void *data, size_t len) {
    if (ws == NULL || len > 125 || (data == NULL && len > 0))
        return -EINVAL;
    if (!may_send(ws))
        return -EPIPE;
    if (!WS_ON_THREAD(ws))
        return -EPERM;
    return write_frame(ws, TERN__WS_OP_PING, true, false, data, len);
}

int tern_ws_close(tern_ws *ws, int code, const char *reason) {
    size_t rl = reason ? strlen(reason) : 0;
    if (ws == NULL || rl > 123 || !(code == TERN_WS_NO_STATUS || tern__ws_close_code_valid((unsigned)code)))
        return -EINVAL;
    if (!may_send(ws))
        return -EPIPE;
    if (!WS_ON_THREAD(ws))
        return -EPERM;
    send_close_frame(ws, code, reason, rl);
    ws->state = TERN__WS_CLOSE_SENT;
    ws->deadline_armed = false;
    tern__conn_set_timeout(&ws->conn, ws->ep->opt.close_timeout_ms);
    return 0;
}

/* ---- answering later: references and the deadline --------------------- */

void tern_ws_ref(tern_ws *ws) {
    if (ws == NULL)
        return;
    if (ws->refs & TERN__WS_CONN_REF)   /* open: its loop exists */
        TERN__ASSERT_LOOP_THREAD(ws->conn.loop);
    ws->refs++;
}

static void ws_free_if_done(tern_ws *ws) {
    if (ws->refs == 0)
        free(ws);   /* ext and the endpoint's share went at on_close */
}

void tern_ws_unref(tern_ws *ws) {
    if (ws == NULL)
        return;
    /* An unref nobody's ref matches would drop the connection's own
     * reference, and free a connection net still runs. */
    TERN__ASSERT((ws->refs & ~TERN__WS_CONN_REF) > 0, "more unrefs than refs");
    if ((ws->refs & ~TERN__WS_CONN_REF) == 0) {
        static atomic_bool said;
        if (!atomic_exchange(&said, true))
            tern__log(TERN_LOG_ERROR, TERN__LOG_MISUSE,
                      "tern_ws_unref: more unrefs than refs (ignored)");
        return;
    }
    ws->refs--;
    ws_free_if_done(ws);
}

bool tern_ws_is_open(const tern_ws *ws) { return ws && may_send(ws); }

/* Net keeps the connection's first error in the struct until it is freed,
 * which for a tern_ws is after on_close and the last reference. */
int tern_ws_close_error(const tern_ws *ws) { return ws ? tern__conn_error(&ws->conn) : 0; }

/* Net is done with the struct (after on_close, at the batch end): it
 * drops the connection's own reference; the user's keep it. */
static void on_free(tern__conn *c) {
    tern_ws *ws = (tern_ws *)c;
    ws->refs &= ~TERN__WS_CONN_REF;
    ws_free_if_done(ws);
}

int tern_ws_set_deadline(tern_ws *ws, uint32_t ms) {
    if (ws == NULL)
        return -EINVAL;
    if (!may_send(ws))
        return -EPIPE;
    if (!WS_ON_THREAD(ws))
        return -EPERM;
    if (ws->going_away)
        return 0;   /* the shutdown's close holds the clock */
    if (ms == 0) {
        if (ws->deadline_armed) {
            ws->deadline_armed = false;
            arm_timeout(ws);   /* the idle clock, from now */
        }
        return 0;
    }
    /* The deadline replaces the idle/pong clock (see tern_ws_set_deadline):
     * a ping in flight is forgotten, the deadline watches the peer now. */
    ws->deadline_armed = true;
    ws->awaiting_pong = false;
    ws->grace_wake = false;
    tern__conn_set_timeout(&ws->conn, ms);
    return 0;
}

/* The wheel fired for the user's deadline. */
static void deadline_passed(tern_ws *ws) {
    const tern_ws_options *o = &ws->ep->opt;
    ws->deadline_armed = false;
    if (ws->going_away) {   /* the shutdown's moment for this connection */
        tern_server *srv = srv_of(ws);
        tern_ws_close(ws, srv ? srv->cfg->opt.shutdown_ws_code : TERN_WS_GOING_AWAY,
                      "server shutting down");
        return;
    }
    /* No grace wake ran while the deadline held the clock: a backlog over
     * the soft limit past its grace gets the policy now. */
    if (ws->soft_since && tern__conn_buffered(&ws->conn) > o->backlog_soft &&
        soft_spent(ws) >= o->backlog_grace_ms) {
        apply_policy(ws);
        if (!may_send(ws))
            return;
    }
    arm_timeout(ws);   /* the idle clock again, unless the handler sets a new deadline */
    if (ws->ep->h.on_deadline)
        ws->ep->h.on_deadline(ws, ws->ep->user);
    else
        tern_ws_close(ws, TERN_WS_POLICY, "deadline");
}

size_t tern_ws_buffered(const tern_ws *ws) { return ws ? tern__conn_backlog(&ws->conn) : 0; }

int tern_ws_pause(tern_ws *ws) {
    if (ws == NULL)
        return -EINVAL;
    if (gone(ws))
        return -EPIPE;
    if (!WS_ON_THREAD(ws))
        return -EPERM;
    ws->paused_by_user = true;
    tern__conn_pause(&ws->conn);
    return 0;
}

int tern_ws_resume(tern_ws *ws) {
    if (ws == NULL)
        return -EINVAL;
    if (gone(ws))
        return -EPIPE;
    if (!WS_ON_THREAD(ws))
        return -EPERM;
    ws->paused_by_user = false;
    /* net re-feeds what waited at the end of the batch, not here. */
    if (!ws->paused_by_policy)
        tern__conn_resume(&ws->conn);
    return 0;
}

/* The close is net's at once (the reset must go now, not after a flush);
 * on_close waits for the batch end, as the policy close's does, since this
 * runs inside the user's call. */
int tern_ws_abort(tern_ws *ws) {
    if (ws == NULL)
        return -EINVAL;
    if (gone(ws))
        return -EPIPE;
    if (!WS_ON_THREAD(ws))
        return -EPERM;
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    setsockopt(ws->conn.io.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    ws->state = TERN__WS_DONE;
    ws->close_due = true;
    ws->close_abort = true;
    tern__conn_defer(&ws->conn);
    tern__conn_close(&ws->conn, -ECONNABORTED);
    return 0;
}
void *tern_ws_user(const tern_ws *ws) { return ws ? ws->user : NULL; }
void tern_ws_set_user(tern_ws *ws, void *conn_user) { if (ws) ws->user = conn_user; }
const char *tern_ws_subprotocol(const tern_ws *ws) {
    return ws == NULL || ws->subprotocol == TERN__WS_NO_SUBPROTOCOL
               ? NULL
               : ws->ep->opt.subprotocols[ws->subprotocol];
}
bool tern_ws_compressed(const tern_ws *ws) { return ws && pmd_of(ws) != NULL; }
tern_loop *tern_ws_loop(const tern_ws *ws) { return ws ? ws->conn.loop : NULL; }
tern_server *tern_ws_server(const tern_ws *ws) { return ws ? srv_of(ws) : NULL; }

/* ---- prepared messages ------------------------------------------------ */

/* Invariant: plain is a whole unmasked frame (header + payload at
 * plain + plain_hdr); deflated, when not NULL, a whole frame with RSV1 set
 * whose payload was compressed with a fresh context and a 32 KiB window. */
struct tern_ws_prepared {
    uint32_t magic;   /* TERN__MAGIC_PREPARED until freed (loop/check.h) */
    _Atomic int refs;
    uint8_t *plain;
    size_t plain_len, plain_hdr;
    uint8_t *deflated;
    size_t deflated_len;
    int opcode;
};

static uint8_t *frame_copy(uint8_t opcode, bool rsv1, const void *data, size_t len,
                           size_t *out_len, size_t *hdr_len) {
    uint8_t hdr[TERN__WS_MAX_HEADER];
    size_t hl = tern__ws_write_header(hdr, true, rsv1, opcode, len, NULL);
    uint8_t *f = malloc(hl + len + 1);
    if (f == NULL)
        return NULL;
    memcpy(f, hdr, hl);
    if (len)
        memcpy(f + hl, data, len);
    *out_len = hl + len;
    if (hdr_len)
        *hdr_len = hl;
    return f;
}

tern_ws_prepared *tern_ws_prepare(const void *data, size_t len, int opcode, bool compress) {
    if ((opcode != TERN_WS_TEXT && opcode != TERN_WS_BINARY) || (data == NULL && len > 0))
        return NULL;
    tern_ws_prepared *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return NULL;
    m->magic = TERN__MAGIC_PREPARED;
    atomic_init(&m->refs, 1);
    m->opcode = opcode;
    m->plain = frame_copy((uint8_t)opcode, false, data, len, &m->plain_len, &m->plain_hdr);
    if (m->plain == NULL) {
        free(m);
        return NULL;
    }
    if (compress) {
        tern__pmd_deflater *d = tern__pmd_deflater_new(15, 0);
        uint8_t *out = NULL;
        ssize_t n = d ? tern__pmd_deflate(d, data, len, true, &out) : -ENOMEM;
        if (n >= 0)
            m->deflated = frame_copy((uint8_t)opcode, true, out, (size_t)n, &m->deflated_len, NULL);
        free(out);
        tern__pmd_deflater_free(d);
    }
    return m;
}

int tern_ws_send_prepared(tern_ws *ws, tern_ws_prepared *m) {
    if (ws == NULL || m == NULL)
        return -EINVAL;
    TERN__ASSERT_MAGIC(m, TERN__MAGIC_PREPARED, "prepared message");
    if (!may_send(ws))
        return -EPIPE;
    if (!WS_ON_THREAD(ws))
        return -EPERM;
    if (ws->sending_fragments)
        return -EBUSY;
    if (ws->ep->role == TERN__WS_CLIENT)   /* masked per frame: nothing to share */
        return tern_ws_send(ws, m->plain + m->plain_hdr, m->plain_len - m->plain_hdr, m->opcode);
    if (dropping(ws) || push_refused(ws, m->plain_len))
        return TERN_SEND_DROPPED;
    tern__ws_pmd *pmd = pmd_of(ws);
    if (pmd) {
        /* The shared compressed frame fits only a connection whose
         * compressor keeps no context: with context takeover, the peer's
         * window would hold bytes our own compressor never saw. */
        if (m->deflated && pmd->deflate_nct && pmd->deflate_bits >= 15) {
            WS_STAT_ADD(ws, bytes_out, m->deflated_len);
            WS_STAT_ADD(ws, ws_out, 1);
            return check_backlog(ws, tern__conn_write(&ws->conn, m->deflated, m->deflated_len));
        }
        return tern_ws_send(ws, m->plain + m->plain_hdr, m->plain_len - m->plain_hdr, m->opcode);
    }
    WS_STAT_ADD(ws, bytes_out, m->plain_len);
    WS_STAT_ADD(ws, ws_out, 1);
    return check_backlog(ws, tern__conn_write(&ws->conn, m->plain, m->plain_len));
}

tern_ws_prepared *tern__ws_prepared_ref(tern_ws_prepared *m) {
    atomic_fetch_add(&m->refs, 1);
    return m;
}

size_t tern__ws_prepared_len(const tern_ws_prepared *m) { return m->plain_len; }

const uint8_t *tern__ws_prepared_bytes(const tern_ws_prepared *m) { return m->plain; }

void tern_ws_prepared_free(tern_ws_prepared *m) {
    if (m == NULL)
        return;
    TERN__ASSERT_MAGIC(m, TERN__MAGIC_PREPARED, "prepared message");
    if (atomic_fetch_sub(&m->refs, 1) == 1) {
        free(m->plain);
        free(m->deflated);
        m->magic = TERN__MAGIC_DEAD;
        tern__check_free(m);
    }
}

/* ---- receiving -------------------------------------------------------- */

/* The message is over (delivered, or dropped while closing): its receive
 * state and buffer are given back, so idle connections hold none. */
static void message_reset(tern_ws *ws) {
    ws->msg_opcode = 0;
    tern__ws_ext *x = ws->ext;
    if (x && x->rx_on) {
        tern__bytes_free(&x->rx.msg);
        memset(&x->rx, 0, sizeof(x->rx));
        x->rx_on = false;
        if (!x->pmd_on && x->acct == NULL) {
            free(x);
            ws->ext = NULL;
        }
    }
}

static tern__ws_rx *rx_get(tern_ws *ws) {
    if (ws->ext == NULL && (ws->ext = calloc(1, sizeof(*ws->ext))) == NULL)
        return NULL;
    if (!ws->ext->rx_on) {
        ws->ext->rx_on = true;
        ws->ext->rx.utf8 = TERN__UTF8_ACCEPT;
    }
    return &ws->ext->rx;
}

/* Delivers text or binary: streamed pieces or the whole message. */
static void deliver(tern_ws *ws, const char *p, size_t n, bool last) {
    const tern__ws_endpoint *r = ws->ep;
    ws->in_delivery = true;   /* sends now are answers (see push_refused) */
    if (last)
        WS_STAT_ADD(ws, ws_in, 1);
    if (r->h.on_fragment)
        r->h.on_fragment(ws, p, n, ws->msg_opcode, last, r->user);
    else if (last && r->h.on_message)
        r->h.on_message(ws, p, n, ws->msg_opcode, r->user);
    ws->in_delivery = false;
}

/* Decompresses a piece of a compressed message into rx->msg. */
static bool inflate_piece(tern_ws *ws, tern__ws_rx *rx, const char *p, size_t n, bool last) {
    tern__ws_pmd *pmd = pmd_of(ws);
    if (pmd->inflater == NULL) {
        pmd->inflater = tern__pmd_inflater_new(pmd->inflate_bits);
        if (pmd->inflater == NULL) {
            fail(ws, TERN_WS_INTERNAL);
            return false;
        }
    }
    /* The limit counts what is already in the buffer; bytes delivered
     * earlier (streamed, so no longer in it) are subtracted here. */
    size_t before = rx->msg.len;
    int r = tern__pmd_inflate(pmd->inflater, (const uint8_t *)p, n, last,
                              pmd->inflate_nct, &rx->msg,
                              ws->ep->opt.max_message - (rx->msg_total - before));
    if (r == -EMSGSIZE) {
        fail(ws, TERN_WS_TOO_BIG);
        return false;
    }
    if (r < 0) {
        fail(ws, r == -ENOMEM ? TERN_WS_INTERNAL : TERN_WS_INVALID_DATA);
        return false;
    }
    rx->msg_total += rx->msg.len - before;
    if (ws->msg_opcode == TERN_WS_TEXT &&
        !tern__utf8_feed(&rx->utf8, (const uint8_t *)rx->msg.data + before,
                         rx->msg.len - before)) {
        fail(ws, TERN_WS_INVALID_DATA);
        return false;
    }
    return true;
}

/* A piece of a data frame's payload, already unmasked, when the frame or
 * the message is split (rx_of(ws) is set). Returns false when the connection
 * is no longer open for reading. */
static bool on_payload(tern_ws *ws, char *p, size_t n, bool msg_end) {
    const tern__ws_endpoint *r = ws->ep;
    tern__ws_rx *rx = rx_of(ws);
    /* After our close frame the peer may still send what it sent before
     * seeing it (§5.5.1): that is delivered; after on_close nothing is. */
    if (ws->state == TERN__WS_DONE) {
        if (msg_end)
            message_reset(ws);
        return true;
    }
    if (ws->msg_compressed) {
        if (!inflate_piece(ws, rx, p, n, msg_end))
            return false;
        if (msg_end && !tern__utf8_complete(rx->utf8) && ws->msg_opcode == TERN_WS_TEXT) {
            fail(ws, TERN_WS_INVALID_DATA);
            return false;
        }
        if (r->h.on_fragment) {
            deliver(ws, rx->msg.data ? rx->msg.data : "", rx->msg.len, msg_end);
            if (rx_of(ws))
                rx_of(ws)->msg.len = 0;   /* streamed: the buffer is reused piece by piece */
        } else if (msg_end) {
            deliver(ws, rx->msg.data ? rx->msg.data : "", rx->msg.len, true);
        }
    } else {
        if (ws->msg_opcode == TERN_WS_TEXT &&
            (!tern__utf8_feed(&rx->utf8, (const uint8_t *)p, n) ||
             (msg_end && !tern__utf8_complete(rx->utf8)))) {
            fail(ws, TERN_WS_INVALID_DATA);
            return false;
        }
        rx->msg_total += n;
        if (r->h.on_fragment) {
            if (n || msg_end)
                deliver(ws, p, n, msg_end);   /* in place: no copy */
        } else {
            if (tern__bytes_append(&rx->msg, p, n) < 0) {
                fail(ws, TERN_WS_INTERNAL);
                return false;
            }
            if (msg_end)
                deliver(ws, rx->msg.data ? rx->msg.data : "", rx->msg.len, true);
        }
    }
    if (gone(ws))
        return false;
    if (msg_end)
        message_reset(ws);
    return true;
}

/* The common case: an uncompressed, unfragmented message whose frame is
 * all in this read. It is unmasked and delivered in place; no receive
 * state is needed. Returns false when the connection is no longer open
 * for reading. */
static bool on_whole_message(tern_ws *ws, char *p, size_t n, const uint8_t mask[4]) {
    if (ws->ep->role == TERN__WS_SERVER)
        tern__ws_mask((uint8_t *)p, n, mask, 0);
    if (ws->state != TERN__WS_DONE) {
        if (ws->msg_opcode == TERN_WS_TEXT && !tern__utf8_valid((const uint8_t *)p, n)) {
            fail(ws, TERN_WS_INVALID_DATA);
            return false;
        }
        deliver(ws, p, n, true);
        if (gone(ws))
            return false;
    }
    ws->msg_opcode = 0;
    return true;
}

/* A whole control frame, unmasked. Returns false when the connection is
 * no longer open for reading. */
static bool on_control(tern_ws *ws, uint8_t opcode, const char *p, size_t n) {
    const tern__ws_endpoint *r = ws->ep;
    switch (opcode) {
    case TERN__WS_OP_CLOSE: {
        int code = TERN_WS_NO_STATUS;
        const char *reason = "";
        size_t rl = 0;
        if (n == 1) {
            fail(ws, TERN_WS_PROTOCOL_ERROR);
            return false;
        }
        if (n >= 2) {
            code = ((uint8_t)p[0] << 8) | (uint8_t)p[1];
            reason = p + 2;
            rl = n - 2;
            if (!tern__ws_close_code_valid((unsigned)code)) {
                fail(ws, TERN_WS_PROTOCOL_ERROR);
                return false;
            }
            if (!tern__utf8_valid((const uint8_t *)reason, rl)) {
                fail(ws, TERN_WS_INVALID_DATA);
                return false;
            }
        }
        acct_close(ws, code, false);
        /* Echo the code (RFC 6455 §5.5.1), unless we already sent ours. */
        if (ws->state == TERN__WS_OPEN)
            send_close_frame(ws, code, "", 0);
        notify_close(ws, code, reason, rl);
        finish(ws);
        return false;
    }
    case TERN__WS_OP_PING:
        if (ws->state == TERN__WS_OPEN) {
            write_frame(ws, TERN__WS_OP_PONG, true, false, p, n);
            if (r->h.on_ping)
                r->h.on_ping(ws, p, n, r->user);
        }
        return !gone(ws);
    case TERN__WS_OP_PONG:
        ws->awaiting_pong = false;
        if (ws->state == TERN__WS_OPEN && r->h.on_pong)
            r->h.on_pong(ws, p, n, r->user);
        return !gone(ws);
    default:
        fail(ws, TERN_WS_PROTOCOL_ERROR);
        return false;
    }
}

static size_t read_frames(tern_ws *ws, char *data, size_t len);

static size_t on_data(tern__conn *c, char *data, size_t len) {
    tern_ws *ws = (tern_ws *)c;
    size_t used = read_frames(ws, data, len);
    WS_STAT_ADD(ws, bytes_in, used);
    return used;
}

/* on_data's work: parses and delivers; returns the bytes consumed. */
static size_t read_frames(tern_ws *ws, char *data, size_t len) {
    const tern_ws_options *o = &ws->ep->opt;
    /* A server requires masked frames, a client unmasked ones (§5.1). */
    const bool server = ws->ep->role == TERN__WS_SERVER;
    size_t pos = 0;
    if (ws->state == TERN__WS_OPEN) {
        /* Any byte from the peer shows it is alive. */
        ws->awaiting_pong = false;
        arm_timeout(ws);
    }
    while (pos < len) {
        if (gone(ws))
            return len;
        if (ws->paused_by_user)
            return pos;   /* net keeps the rest for tern_ws_resume */
        tern__ws_rx *cur = rx_of(ws);
        if (cur == NULL || !cur->in_frame) {
            tern__ws_header h;
            int r = tern__ws_parse_header((const uint8_t *)data + pos, len - pos, server,
                                          pmd_of(ws) != NULL, &h);
            if (r == 0)
                return pos;
            if (r < 0 || h.masked != server) {
                fail(ws, TERN_WS_PROTOCOL_ERROR);
                return len;
            }
            size_t avail = len - pos - (size_t)r;
            if (h.opcode >= 8) {
                /* Control frames are small (<= 125 bytes): wait for all of it. */
                if (avail < h.payload_len)
                    return pos;
                char *p = data + pos + r;
                if (server)
                    tern__ws_mask((uint8_t *)p, (size_t)h.payload_len, h.mask, 0);
                pos += (size_t)r + (size_t)h.payload_len;
                if (!on_control(ws, h.opcode, p, (size_t)h.payload_len))
                    return len;
                continue;
            }
            if (h.opcode == TERN__WS_OP_CONT) {
                if (ws->msg_opcode == 0) {
                    fail(ws, TERN_WS_PROTOCOL_ERROR);   /* a continuation of nothing */
                    return len;
                }
            } else {
                if (ws->msg_opcode != 0) {
                    fail(ws, TERN_WS_PROTOCOL_ERROR);   /* a new message inside a fragmented one */
                    return len;
                }
                ws->msg_opcode = h.opcode;
                ws->msg_compressed = h.rsv1;
            }
            uint64_t so_far = cur ? cur->msg_total : 0;
            if (!ws->msg_compressed && so_far + h.payload_len > o->max_message) {
                fail(ws, TERN_WS_TOO_BIG);
                return len;
            }
            if (h.fin && cur == NULL && !ws->msg_compressed && avail >= h.payload_len) {
                char *p = data + pos + r;
                pos += (size_t)r + (size_t)h.payload_len;
                if (!on_whole_message(ws, p, (size_t)h.payload_len, h.mask))
                    return len;
                continue;
            }
            tern__ws_rx *rx = rx_get(ws);
            if (rx == NULL) {
                fail(ws, TERN_WS_INTERNAL);
                return len;
            }
            rx->in_frame = true;
            rx->frame_fin = h.fin;
            rx->frame_left = h.payload_len;
            rx->phase = 0;
            memcpy(rx->mask, h.mask, 4);
            pos += (size_t)r;
        }
        tern__ws_rx *rx = rx_of(ws);
        size_t n = len - pos < rx->frame_left ? len - pos : (size_t)rx->frame_left;
        char *p = data + pos;
        if (server)
            rx->phase = (uint8_t)tern__ws_mask((uint8_t *)p, n, rx->mask, rx->phase);
        pos += n;
        rx->frame_left -= n;
        bool frame_end = rx->frame_left == 0;
        if (frame_end)
            rx->in_frame = false;
        if (!on_payload(ws, p, n, frame_end && rx->frame_fin))
            return len;
    }
    return pos;
}

static void on_eof(tern__conn *c) {
    tern_ws *ws = (tern_ws *)c;
    /* The peer closed TCP: after its close frame that is normal; without
     * one it is 1006 (on_close says so). */
    tern__conn_close(&ws->conn, 0);
}

static void on_drain(tern__conn *c) {
    tern_ws *ws = (tern_ws *)c;
    ws->soft_since = 0;
    if (ws->paused_by_policy) {
        ws->paused_by_policy = false;
        if (!ws->paused_by_user)
            tern__conn_resume(c);
    }
    tern_server *srv = srv_of(ws);
    if (ws->state == TERN__WS_OPEN && srv)   /* pub/sub's conflated updates first */
        tern__srv_ws_drained(srv, ws);
    if (ws->state == TERN__WS_OPEN && ws->ep->h.on_drain)
        ws->ep->h.on_drain(ws, ws->ep->user);
}

static void on_timeout(tern__conn *c) {
    tern_ws *ws = (tern_ws *)c;
    if (ws->state != TERN__WS_OPEN) {
        /* The peer never answered our close frame. */
        tern__conn_close(c, -ETIMEDOUT);
        return;
    }
    if (ws->deadline_armed) {
        deadline_passed(ws);
        return;
    }
    if (ws->grace_wake) {
        /* The backlog's grace period is over, not the idle time. */
        const tern_ws_options *o = &ws->ep->opt;
        if (ws->soft_since && tern__conn_buffered(c) > o->backlog_soft)
            apply_policy(ws);
        if (!gone(ws))
            arm_timeout(ws);
        return;
    }
    if (ws->awaiting_pong) {
        /* Idle, pinged, and still silent: the peer is gone. */
        send_close_frame(ws, TERN_WS_INTERNAL, "no pong", 7);
        notify_close(ws, TERN_WS_INTERNAL, "no pong", 7);
        tern__conn_close(c, -ETIMEDOUT);
        return;
    }
    write_frame(ws, TERN__WS_OP_PING, true, false, NULL, 0);
    ws->awaiting_pong = true;
    tern__conn_set_timeout(c, ws->ep->opt.pong_timeout_ms);
}

/* The server's graceful shutdown: close now, or at a random moment of the
 * spread (shutdown_ws_spread_ms) on the connection's own wheel entry, so
 * that a drain costs no timer or list of its own. Uniform over the
 * spread: the clients' reconnects arrive at an even rate, as "full
 * jitter" backoff spreads them. */
static void on_shutdown(tern__conn *c) {
    tern_ws *ws = (tern_ws *)c;
    tern_server *srv = srv_of(ws);
    uint32_t spread = srv ? srv->cfg->opt.shutdown_ws_spread_ms : 0;
    if (ws->state != TERN__WS_OPEN)
        return;
    if (spread == 0) {
        tern_ws_close(ws, srv ? srv->cfg->opt.shutdown_ws_code : TERN_WS_GOING_AWAY,
                      "server shutting down");
        return;
    }
    uint8_t r[4];
    tern__ws_mask_key(r);
    /* 1 to spread: a timeout of 0 would disarm the entry, and the
     * connection would wait for the shutdown's end instead. */
    uint32_t at = 1 + ((uint32_t)r[0] << 24 | (uint32_t)r[1] << 16 | (uint32_t)r[2] << 8 | r[3]) % spread;
    ws->going_away = true;
    ws->deadline_armed = true;
    ws->awaiting_pong = false;
    ws->grace_wake = false;
    tern__conn_set_timeout(&ws->conn, at);
}

static void on_close(tern__conn *c, int err) {
    tern_ws *ws = (tern_ws *)c;
    tern_server *srv = srv_of(ws);
    notify_close(ws, TERN_WS_ABNORMAL, "", 0);
    pubsub_forget(ws);
    message_reset(ws);
    if (srv)
        tern__server_ws_session_ended(
            srv, (uint64_t)((uint32_t)(tern_loop_now(srv->loop) / 100) - ws->opened_ds) * 100);
    /* The session's access entry: the strings are copied by the queue. */
    if (srv && ws->ext && ws->ext->acct) {
        tern__ws_acct *a = ws->ext->acct;
        uint64_t now = tern_loop_now(srv->loop);
        const char *method = a->text, *target = method + strlen(method) + 1;
        tern_http_access e = {.peer = target + strlen(target) + 1, .method = method,
                              .target = target, .status = a->status, .bytes = a->bytes_out,
                              .duration_ms = now > a->start_ms ? now - a->start_ms : 0,
                              .websocket = true, .bytes_in = a->bytes_in,
                              .messages_in = a->ws_in, .messages_out = a->ws_out,
                              .close_code = a->close_code ? a->close_code : TERN_WS_ABNORMAL,
                              .closed_by_server = a->close_by_server};
        tern__http_access_record_entry(srv, &e);
    }
    if (ws->ext) {   /* message_reset gave back the receive state */
        tern__pmd_inflater_free(ws->ext->pmd.inflater);
        tern__pmd_deflater_free(ws->ext->pmd.deflater);
        free(ws->ext->acct);
        free(ws->ext);
        ws->ext = NULL;
    }
    if (srv)
        tern__http_conn_closed_by_server(srv, c);
    else if (!ws->close_due)   /* else on_deferred, still to come, needs it */
        tern__ws_client_release(ws->ep);
}

/* ---- the switch from HTTP --------------------------------------------- */

int tern__ws_open(tern__conn *from, const tern__ws_endpoint *ep, void *conn_user,
                  int subprotocol, const tern__pmd_params *pmd, const char *rest,
                  size_t rest_len, tern__ws_acct *acct) {
    tern_ws *ws = calloc(1, sizeof(*ws));
    if (ws == NULL) {
        free(acct);
        return -ENOMEM;
    }
    if ((pmd || acct) && (ws->ext = calloc(1, sizeof(*ws->ext))) == NULL) {
        free(acct);
        free(ws);
        return -ENOMEM;
    }
    int err = tern__conn_move(from, &ws->conn, &ws_proto);
    if (err < 0) {
        free(acct);
        free(ws->ext);
        free(ws);
        return err;
    }
    if (acct)
        ws->ext->acct = acct;
    ws->ep = ep;
    ws->user = conn_user;
    ws->opened_ds = (uint32_t)(tern_loop_now(ws->conn.loop) / 100);
    ws->refs = TERN__WS_CONN_REF;   /* the connection's own, dropped by on_free */
    ws->state = TERN__WS_OPEN;
    ws->subprotocol = subprotocol < 0 ? TERN__WS_NO_SUBPROTOCOL : (uint8_t)subprotocol;
    if (pmd) {
        /* The RFC's names are the server's and the client's: ours are the
         * server's when we are the server. */
        ws->ext->pmd_on = true;
        bool server = ep->role == TERN__WS_SERVER;
        ws->ext->pmd.deflate_bits = server ? pmd->server_max_window_bits : pmd->client_max_window_bits;
        ws->ext->pmd.inflate_bits = server ? pmd->client_max_window_bits : pmd->server_max_window_bits;
        ws->ext->pmd.deflate_nct =
            server ? pmd->server_no_context_takeover : pmd->client_no_context_takeover;
        ws->ext->pmd.inflate_nct =
            server ? pmd->client_no_context_takeover : pmd->server_no_context_takeover;
    }
    /* Under the pause policy net enforces no limit: answers to the peer's
     * own messages are never dropped (reading stops instead), and pushes
     * are checked by push_refused(). */
    size_t hard = ep->opt.slow_policy == TERN_WS_SLOW_PAUSE ? 0 : ep->opt.backlog_hard;
    tern__conn_set_out_limit(&ws->conn, hard);
    tern__conn_set_timeout(&ws->conn, ep->opt.idle_timeout_ms);
    /* The connection is made: on_open runs whatever follows, so that
     * on_close never comes without it (a program unlinks there what
     * on_open linked). Bytes that came after the handshake and cannot be
     * kept (out of memory) fail it at once, with 1011. */
    bool lost = rest_len && tern__conn_inject(&ws->conn, rest, rest_len) < 0;
    if (ep->h.on_open)
        ep->h.on_open(ws, ep->user);
    if (lost)
        fail(ws, TERN_WS_INTERNAL);
    return 0;
}
