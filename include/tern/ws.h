/* tern WebSocket server (RFC 6455, permessage-deflate RFC 7692).
 *
 * A WebSocket route is a path on a tern_server; a GET with the upgrade
 * headers to that path becomes a tern_ws. Messages arrive whole (on_message)
 * or, for routes that set on_fragment, piece by piece as they come off the
 * wire. Data handed to callbacks is a view valid during the call only.
 *
 * One line for the common case:
 *     tern_ws_serve("0.0.0.0", 9090, &handlers, user);
 */
#ifndef TERN_WS_H
#define TERN_WS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tern/http.h"

#ifdef __cplusplus
extern "C" {
#endif

/* libtern.so exports what this header declares, and nothing else. */
#pragma GCC visibility push(default)

typedef struct tern_ws tern_ws;
struct tern_ws_connect_error;

enum tern_ws_opcode { TERN_WS_TEXT = 1, TERN_WS_BINARY = 2 };

/* Close codes tern sends itself. */
enum tern_ws_close_code {
    TERN_WS_NORMAL = 1000,
    TERN_WS_GOING_AWAY = 1001,        /* server shutdown */
    TERN_WS_PROTOCOL_ERROR = 1002,
    TERN_WS_NO_STATUS = 1005,         /* received: the close frame had no code */
    TERN_WS_ABNORMAL = 1006,          /* received: the connection dropped without a close */
    TERN_WS_INVALID_DATA = 1007,      /* text that is not UTF-8 */
    TERN_WS_POLICY = 1008,            /* a slow consumer over its backlog limit */
    TERN_WS_TOO_BIG = 1009,           /* message over max_message */
    TERN_WS_INTERNAL = 1011,
    TERN_WS_SERVICE_RESTART = 1012,   /* a drain that invites clients back (IANA's registry) */
    TERN_WS_TRY_AGAIN = 1013,         /* a slow pub/sub subscriber, when its policy asks for it */
};

/* What to do with a connection whose backlog stays over the soft limit
 * past the grace period, or passes the hard limit. */
enum tern_ws_slow_policy {
    /* Close (default): a send that would pass the hard limit is dropped and
     * the connection closed with 1008 (the close frame follows the backlog;
     * the TCP close comes when it is flushed or after close_timeout_ms). */
    TERN_WS_SLOW_CLOSE = 0,
    /* Drop: sends are dropped (TERN_SEND_DROPPED) while over the limit;
     * the connection stays (pub/sub feeds, where the next tick matters). */
    TERN_WS_SLOW_DROP = 1,
    /* Pause: reading from the peer stops while the backlog is over the
     * hard limit (or the soft one past its grace) and resumes when it
     * drains; answers sent from this connection's own on_message or
     * on_fragment are never dropped. For request/response use, such as
     * echo. Pausing cannot slow a peer that sends nothing, so a message
     * pushed from anywhere else that would take the backlog past the hard
     * limit is refused (TERN_SEND_DROPPED) and the connection closed with
     * 1008, as under the close policy. An answer sent later (from a timer,
     * a post, another thread's result) is such a push: a handler that
     * answers later holds its peer back itself, with tern_ws_pause while
     * its answers are behind (tern_ws_buffered, or its own queue, high)
     * and tern_ws_resume from on_drain, as `tern serve --ws-async` does. */
    TERN_WS_SLOW_PAUSE = 2,
};

typedef struct tern_ws_handlers {
    /* Before answering the handshake: inspect the request (Origin, cookies,
     * the path), add response headers with tern_http_add_header, set the
     * connection's user data. Return 0 to accept, or an HTTP status (403,
     * 401, ...) to refuse (anything else outside 400..599 refuses with
     * 403). Optional.
     *
     * Who frees *conn_user: once on_upgrade has run, exactly one of two
     * things follows for the request. Either the connection opens, and
     * on_open, later on_close, see conn_user as tern_ws_user (free it in
     * on_close); or it does not (on_upgrade refused, or the handshake
     * failed after it accepted), and on_upgrade_failed gets conn_user
     * back. So a handler that allocates here and sets on_upgrade_failed
     * never leaks; without on_upgrade_failed, tern forgets conn_user when
     * the connection does not open (the checked build says so on stderr,
     * once per route, when it was not NULL). */
    int (*on_upgrade)(tern_http_req *req, void **conn_user, void *user);
    void (*on_open)(tern_ws *ws, void *user);
    /* A whole message. opcode is TERN_WS_TEXT (valid UTF-8) or TERN_WS_BINARY. */
    void (*on_message)(tern_ws *ws, const char *data, size_t len, int opcode, void *user);
    /* Streaming form, used instead of on_message when set: the pieces of a
     * message as they arrive (decompressed); last marks the message's end.
     * Text is UTF-8-checked as it goes. */
    void (*on_fragment)(tern_ws *ws, const char *data, size_t len, int opcode, bool last,
                        void *user);
    /* The backlog has been sent (after a send said TERN_SEND_BUFFERED). */
    void (*on_drain)(tern_ws *ws, void *user);
    /* The connection is over: code and reason from the peer's close frame,
     * or the code and reason tern sent when it closed (1008 "slow consumer",
     * 1009 "message too big", 1011 "no pong", ...), or 1006 when it just
     * dropped (tern_ws_close_error says why: -ECONNRESET, -EPIPE,
     * -EPROTO...). Called once; ws is invalid after it returns, unless a
     * reference is held (tern_ws_ref: then ws stays valid, closed, until
     * the last tern_ws_unref). Never called
     * from inside one of your own calls: a close the slow-consumer policy
     * decides inside tern_ws_send* is reported at the end of the current
     * batch of events, so a loop over connections that frees per-connection
     * data here may go on to the next one. (tern_server_free is the one
     * exception: it reports the connections it closes before returning.) */
    void (*on_close)(tern_ws *ws, int code, const char *reason, size_t reason_len, void *user);
    void (*on_ping)(tern_ws *ws, const char *data, size_t len, void *user);   /* pong is automatic */
    void (*on_pong)(tern_ws *ws, const char *data, size_t len, void *user);
    /* A client's connection (tern_ws_connect, tern/client.h) that never
     * opened: why. Called once, instead of on_open; nothing follows.
     * Required for a client, unused by a server. */
    void (*on_connect_error)(const struct tern_ws_connect_error *e, void *user);
    /* The deadline set with tern_ws_set_deadline passed without being set
     * again or cleared. It is cleared when this runs (set it again here to
     * go on watching). Optional: without it tern starts the closing
     * handshake with 1008 "deadline". */
    void (*on_deadline)(tern_ws *ws, void *user);
    /* on_upgrade ran but the connection will not open: conn_user is what
     * it left in *conn_user (NULL when it set nothing), to free here.
     * status is what the client was answered: on_upgrade's refusal (as it
     * returned it, or 403), or 500 when the handshake failed after
     * on_upgrade accepted (the 101 could not be built, or out of memory:
     * the client then gets a 500, or the 101 and a dropped connection).
     * Runs once, on the loop, right after on_upgrade's refusal or the
     * failure; neither on_open nor on_close follows for that request.
     * Optional; unused by a client. */
    void (*on_upgrade_failed)(void *conn_user, int status, void *user);
    /* Authorization (tern/pubsub.h): asked once when a connection of this
     * route subscribes (tern_ws_subscribe, tern_ws_subscribe_from) or
     * publishes on its own behalf (tern_ws_publish) to topic[0..len)
     * (NUL-terminated too), never per delivered message, so fan-out pays
     * nothing for them. Return 0 to allow, or a negative errno (-EACCES,
     * typically) to refuse: the call then returns it and does nothing
     * (a positive value refuses with -EACCES). On ws's loop, inside the
     * call that asked. NULL: allowed. Unused by a client. */
    int (*on_subscribe)(tern_ws *ws, const char *topic, size_t len, void *user);
    int (*on_publish)(tern_ws *ws, const char *topic, size_t len, void *user);
} tern_ws_handlers;

/* Zero means the default for every field. */
typedef struct tern_ws_options {
    size_t max_message;            /* 16 MiB; over it: close 1009 */
    uint32_t idle_timeout_ms;      /* ping after this long without a byte from the peer: 30 s */
    uint32_t pong_timeout_ms;      /* then close if nothing comes back: 30 s */
    uint32_t close_timeout_ms;     /* wait for the peer's close frame: 5 s */
    size_t backlog_soft;           /* 256 KiB ... */
    uint32_t backlog_grace_ms;     /* ... for 10 s */
    size_t backlog_hard;           /* 1 MiB */
    int slow_policy;               /* enum tern_ws_slow_policy */
    /* permessage-deflate. Its memory per connection is the budget to watch:
     * with context takeover our compressor holds about
     * 2^(server_max_window_bits+2) + 2^(compression_mem_level+9) bytes
     * (256 KiB at the defaults) and the decompressor 2^window + 7 KiB
     * between messages. With server_no_context_takeover the compressor,
     * with client_no_context_takeover the decompressor, holds nothing
     * between messages. */
    bool compression;              /* offer permessage-deflate */
    bool server_no_context_takeover;  /* no compression memory kept between messages */
    bool client_no_context_takeover;  /* ask clients the same, so inflate keeps none */
    int server_max_window_bits;    /* 9..15 (0: 15) */
    int compression_mem_level;     /* zlib memLevel 1..9 (0: 8) */
    size_t compress_min;           /* don't compress messages shorter than this: 64 */
    const char *const *subprotocols;  /* NULL-terminated, in the server's order */
} tern_ws_options;

/* Returns 0, -EEXIST, -ENOMEM, or -EINVAL: srv, pattern or h NULL, a bad
 * pattern (as tern_http_route), or an option out of its range
 * (slow_policy not a tern_ws_slow_policy, server_max_window_bits not 0 or
 * 9..15, compression_mem_level not 0..9, backlog_soft over backlog_hard,
 * a subprotocol that is empty or not a token, 255 or more of them): a
 * typo is refused, not quietly replaced by a default. */
TERN_MUST_CHECK
int tern_ws_route(tern_server *srv, const char *pattern, const tern_ws_handlers *h,
                  const tern_ws_options *opt, void *user);

/* Sends one message. Returns a tern_send_result or a negative error:
 * -EPIPE once a close was sent or received, -EINVAL for a bad opcode, a
 * NULL ws or NULL data with a non-zero len,
 * -EBUSY while a fragmented message of ours is unfinished. Text is not
 * checked for UTF-8: the caller vouches for its bytes. */
int tern_ws_send(tern_ws *ws, const void *data, size_t len, int opcode);
/* Sends one fragment: the first with opcode TEXT or BINARY, the next ones
 * with any opcode (it is ignored), the last with fin set. Fragments of one
 * message are never compressed. */
int tern_ws_send_fragment(tern_ws *ws, const void *data, size_t len, int opcode, bool fin);
/* A ping with len <= 125 bytes of data. Returns a tern_send_result, or
 * -EINVAL (NULL ws, len over 125, NULL data with a non-zero len), -EPIPE
 * once a close was sent or received. */
int tern_ws_ping(tern_ws *ws, const void *data, size_t len);
/* Starts the closing handshake: sends a close frame with code (1000,
 * 3000-4999, ...) and a reason of at most 123 bytes; on_close follows when
 * the peer answers or after close_timeout_ms. Returns 0, -EINVAL (NULL ws,
 * a code not valid in a close frame, a longer reason), -EPIPE once a close
 * was sent or received. */
int tern_ws_close(tern_ws *ws, int code, const char *reason);

/* ---- answering later ----------------------------------------------
 *
 * A handler may keep a message and answer it later: from a timer, a post
 * (tern_loop_post), or work done on another thread. It then holds a
 * reference to the connection: tern_ws_ref keeps the tern_ws valid (its
 * memory, not the connection itself) until the matching tern_ws_unref,
 * also past on_close. Before sending, tern_ws_is_open says whether the
 * connection can still take messages; a send to one that closed returns
 * -EPIPE, so checking first is only to skip work. Once closed, a
 * referenced ws answers tern_ws_is_open, tern_ws_send*, tern_ws_ping,
 * tern_ws_close, tern_ws_set_deadline (-EPIPE), tern_ws_user,
 * tern_ws_set_user, tern_ws_loop and tern_ws_unref; nothing else.
 * Typical use: copy the message, tern_ws_ref, hand both over; later, on
 * the loop: send if tern_ws_is_open, then tern_ws_unref.
 *
 * Threads: like every tern_ws call, these three run on the connection's
 * loop thread only (the count is not atomic: that is what keeps it as
 * cheap as an increment). Work done on another thread takes its reference
 * on the loop thread before it is handed over, and comes back with
 * tern_loop_post(tern_ws_loop(ws), fn, job) (thread-safe; the loop of a
 * referenced connection never changes, so tern_ws_loop may be read from
 * any thread while the reference is held); fn runs on the loop, sends and
 * unrefs. A reference may outlive the loop: the last tern_ws_unref only
 * frees memory. Every tern_ws_ref needs one tern_ws_unref, or the struct
 * leaks. */
void tern_ws_ref(tern_ws *ws);
void tern_ws_unref(tern_ws *ws);
/* True while messages can be sent: open, no close sent or received. */
bool tern_ws_is_open(const tern_ws *ws);

/* A deadline for the connection: on_deadline runs once, ms milliseconds
 * from now, unless it is set again first (which moves it) or cleared with
 * ms = 0. Setting it is one move of the connection's timer-wheel entry:
 * O(1), no allocation, cheap enough to do on every message. The usual
 * use: set it on every message (and on every answer, for a handler that
 * answers later), so it fires when the peer went quiet or an answer is
 * late. It fires no earlier than ms, and at most one wheel tick (64 ms)
 * later.
 *
 * While set, the deadline is the connection's clock instead of the idle
 * ping (idle_timeout_ms, pong_timeout_ms): tern sends no pings of its own,
 * the deadline watches the peer; when it fires or is cleared the idle
 * clock starts again. The backlog's grace period (backlog_grace_ms) is
 * then checked at each send and when the deadline fires rather than by a
 * timer of its own. Once a graceful shutdown has given the connection its
 * moment to be closed (tern_server_options.shutdown_ws_spread_ms), that
 * moment holds the clock: setting a deadline returns 0 and changes nothing.
 * Returns 0, -EINVAL for a NULL ws, -EPIPE once a close was sent or
 * received. */
int tern_ws_set_deadline(tern_ws *ws, uint32_t ms);

/* Bytes of this connection's messages the kernel has not taken and that
 * will still be waiting after this batch's sends are flushed: 0 while every
 * send has said TERN_SEND_OK. For flow control: stop pushing while it is
 * high, go on from on_drain. */
size_t tern_ws_buffered(const tern_ws *ws);

/* Flow control of what the peer sends, for a reader that takes messages at
 * its own pace (a slow subscriber, a load generator's throttled reader).
 * tern_ws_pause stops delivery at once: no callback of this connection
 * runs after it returns (messages already read wait in the connection,
 * in order) and nothing more is read from the socket, so the kernel's
 * receive buffer fills and TCP's window holds the peer back.
 * tern_ws_resume starts again; what waited is delivered from the loop at
 * the end of the current batch, never inside the call. Sending goes on
 * while paused. Nothing is read while paused, the peer's pong neither: a
 * connection paused for longer than idle_timeout_ms + pong_timeout_ms is
 * closed (1011). Independent of the pause slow-consumer policy: reading
 * goes on only when neither holds it. Both return 0, or -EPIPE once the
 * connection is closing (-EINVAL for NULL). */
int tern_ws_pause(tern_ws *ws);
int tern_ws_resume(tern_ws *ws);

/* Drops the connection at once, without the closing handshake: the socket
 * is closed with a reset (SO_LINGER 0), what was buffered is discarded.
 * The peer sees what a crashed process or a failed network shows it. For
 * tests and load generators that simulate such failures; tern_ws_close is
 * the polite end. on_close(1006) follows at the end of the current batch,
 * never inside the call. Returns 0, -EPIPE when on_close has come or is
 * due, -EINVAL for NULL. */
int tern_ws_abort(tern_ws *ws);

void *tern_ws_user(const tern_ws *ws);
void tern_ws_set_user(tern_ws *ws, void *conn_user);
const char *tern_ws_subprotocol(const tern_ws *ws);   /* NULL when none was agreed */
bool tern_ws_compressed(const tern_ws *ws);           /* permessage-deflate agreed */
tern_loop *tern_ws_loop(const tern_ws *ws);
/* The server (of this loop) that accepted the connection; NULL for a
 * client's (tern_ws_connect). */
tern_server *tern_ws_server(const tern_ws *ws);
/* The peer's address, as tern_http_peer(). -ENOTCONN once the connection
 * is closed (also inside on_close). */
TERN_MUST_CHECK
int tern_ws_peer(const tern_ws *ws, struct sockaddr_storage *addr, socklen_t *len);
/* Why the connection dropped, for on_close(1006) and after (while
 * referenced): the first error it met, though on_close came later:
 * -ECONNRESET (the peer reset it), -EPIPE or -ECONNRESET (a send to a peer
 * that had gone, as the kernel said it), -ETIMEDOUT (a send made no
 * progress for close_timeout_ms), -EPROTO (a TLS failure: not TLS, a bad
 * record), -ENOBUFS (the loop's max_unsent). 0 while open, after a
 * closing handshake, and for an end tern or the program decided (the
 * slow-consumer policy, tern_ws_abort); 0 for NULL. */
int tern_ws_close_error(const tern_ws *ws);

/* A message framed once and sent to many connections (fan-out): the
 * header is built once and, with compress, the payload is compressed once
 * for all the connections that agreed to no context takeover with a full
 * window (the others get it compressed by their own compressor).
 * tern_ws_prepare copies data. The caller owns the prepared message and
 * frees it with tern_ws_prepared_free, which it may do right after its
 * last tern_ws_send_prepared: each send copies the frame into that
 * connection's output (the loop's cork buffer, or the connection's backlog
 * for what the kernel does not take at once), so nothing queued refers to
 * the message's bytes. */
typedef struct tern_ws_prepared tern_ws_prepared;
tern_ws_prepared *tern_ws_prepare(const void *data, size_t len, int opcode, bool compress);
int tern_ws_send_prepared(tern_ws *ws, tern_ws_prepared *msg);
void tern_ws_prepared_free(tern_ws_prepared *msg);

/* The one-line server: a loop, a server on host:port with a WebSocket
 * route at every path, run until SIGINT or SIGTERM (graceful), then freed.
 * Returns 0, or a negative errno when it could not start. */
TERN_MUST_CHECK
int tern_ws_serve(const char *host, int port, const tern_ws_handlers *h, void *user);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
