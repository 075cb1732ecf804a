/* Private side of WebSocket: endpoints, server routes, the connection. */
#ifndef TERN_WS_PRIVATE_H
#define TERN_WS_PRIVATE_H

#include <sys/socket.h>

#include "http/server.h"
#include "tern/client.h"
#include "tern/ws.h"
#include "ws/deflate.h"
#include "ws/frame.h"

/* Which end of the connection we are (RFC 6455 §5.1): a server reads
 * masked frames and writes unmasked ones; a client reads unmasked frames
 * and masks every frame it writes with a fresh key. */
enum tern__ws_role { TERN__WS_SERVER = 0, TERN__WS_CLIENT = 1 };

/* One end's configuration: handlers, options with the defaults filled
 * in, user data and role. A server route's endpoint is shared by all the
 * connections of the route (on every loop) and read-only while serving; a
 * client's endpoint (client.c) belongs to its one connection, and the
 * connection frees it (tern__ws_client_release) when it is over.
 * opt.subprotocols is the server's list, or the client's offer; a
 * connection's subprotocol indexes it either way. */
typedef struct tern__ws_endpoint {
    tern_ws_handlers h;
    tern_ws_options opt;
    tern__pmd_config pmd;
    void *user;
    uint8_t role;   /* enum tern__ws_role */
} tern__ws_endpoint;

/* A WebSocket route: a server endpoint on a path. pattern is the route's
 * own copy, for messages; dropped_said is set (any loop) once the checked
 * build has said that a refusal dropped a conn_user. */
typedef struct tern__ws_route {
    tern__ws_endpoint ep;
    char *pattern;
    atomic_bool dropped_said;
    struct tern__ws_route *next;
} tern__ws_route;

/* The ws module's routes of one host (vh->ws). */
typedef struct tern__ws_server {
    tern__router *router;
    tern__ws_route *routes;
} tern__ws_server;

enum tern__ws_state {
    TERN__WS_OPEN,        /* messages flow both ways */
    TERN__WS_CLOSE_SENT,  /* our close frame is out; waiting for the peer's */
    TERN__WS_DONE,        /* on_close has been called; only the TCP close remains */
};

/* Receive state that exists only while a frame or a message is split
 * across reads or frames (allocated then, freed when the message ends), so
 * an idle connection, or one whose messages each arrive whole, has none.
 * Invariants:
 * - in_frame: a data frame's header has been read and frame_left bytes of
 *   its payload are still to come, unmasked from key phase `phase`;
 * - msg.data[0..msg.len) holds the message's bytes so far when it is being
 *   assembled (or decompressed); msg_total counts every byte of it so far;
 * - utf8 is the validator's state over the text message so far. */
typedef struct tern__ws_rx {
    uint64_t frame_left;
    uint64_t msg_total;
    tern__bytes msg;
    uint32_t utf8;
    uint8_t mask[4];
    uint8_t phase;
    bool in_frame;
    bool frame_fin;
} tern__ws_rx;

/* permessage-deflate state, allocated at the upgrade when it was agreed.
 * The agreed parameters are kept as they apply to this end (the RFC names
 * them after the server and the client): what our compressor and our
 * decompressor may do. */
typedef struct tern__ws_pmd {
    int deflate_bits;        /* our compressor's window (8..15) */
    int inflate_bits;        /* the peer's window, for our decompressor */
    bool deflate_nct;        /* our compressor starts afresh for every message */
    bool inflate_nct;        /* so does the peer's: our decompressor keeps nothing */
    tern__pmd_inflater *inflater;   /* created at the first compressed message */
    tern__pmd_deflater *deflater;   /* created at the first compressed send */
} tern__ws_pmd;

/* The two optional parts of a connection in one block, so that the
 * connection holds one pointer for both (8 bytes of tern_ws, which the
 * reference count took). rx_on: rx is in use (a frame or a message is
 * split); pmd_on: permessage-deflate was agreed and pmd holds its state.
 * The block exists exactly while one of them is on: a compressed
 * connection keeps it for its life (and splits messages without an
 * allocation), any other only while a message is split. */
typedef struct tern__ws_ext {
    tern__ws_rx rx;
    tern__ws_pmd pmd;
    bool rx_on;
    bool pmd_on;
    struct tern__ws_acct *acct;   /* or NULL; while set, the block stays */
} tern__ws_ext;

/* A session's account for the server's access log, made at the upgrade
 * only when the server has one (so a connection pays for it only then,
 * and keeps ext for its life): what it moved (counted where the server's
 * own counters are, under the same names) and how it ended, given to the
 * log when the connection closes. text: the request's method, target and
 * the peer, each NUL-terminated, one after the other. */
typedef struct tern__ws_acct {
    uint64_t start_ms;
    uint64_t bytes_in, bytes_out, ws_in, ws_out;
    int close_code;          /* the first close frame's, sent or received; 0: none yet */
    bool close_by_server;
    uint16_t status;         /* the handshake's answer: 101 (HTTP/1.1), 200 (HTTP/2) */
    char text[];
} tern__ws_acct;

#define TERN__WS_NO_SUBPROTOCOL 0xFF

/* Kept small on purpose: an idle WebSocket is this struct and nothing else
 * (168 bytes on x86-64; see docs/ARCHITECTURE.md).
 * Invariants:
 * - conn is first (net frees the struct with free()).
 * - msg_opcode is non-zero exactly while a data message is in progress
 *   (msg_compressed says whether it is compressed); the receive state
 *   (ext->rx, with ext->rx_on) exists only while a frame or a message is
 *   split (see tern__ws_rx, tern__ws_ext).
 * - ext->pmd_on exactly when permessage-deflate was agreed.
 * - subprotocol indexes ep->opt.subprotocols, or is TERN__WS_NO_SUBPROTOCOL.
 * - ep->role fixes the masking; conn.list is the accepting server's list
 *   for a server connection, NULL for a client's.
 * - soft_since is the loop's clock (ms, truncated to 32 bits, never 0)
 *   when the backlog went over the soft limit, or 0 when it is not over.
 * - state only moves forward; on_close is called once, when it becomes
 *   DONE (or from net's on_close if the connection drops first), except
 *   that a close decided inside one of the user's calls (the slow-consumer
 *   policy, in a send) sets DONE and close_due, and on_close follows at
 *   the end of the batch (callbacks never run inside the user's calls);
 *   so does tern_ws_abort (close_abort: 1006).
 * - reading is paused in net exactly while paused_by_policy or
 *   paused_by_user holds.
 * - refs holds the connection's own reference (the TERN__WS_CONN_REF bit,
 *   from the open until net gives the struct back, on_free) and counts the
 *   user's below it (tern_ws_ref); the struct is freed when both are gone,
 *   so a user's reference keeps it valid, closed, past net's batch end. A
 *   bit rather than a count of 1, so that an unref past the user's count
 *   is seen (and ignored) instead of freeing an open connection. Loop
 *   thread only.
 * - deadline_armed: the wheel entry is armed for the user's deadline
 *   (tern_ws_set_deadline), which then stands in for the idle/pong clock
 *   and the grace wake (neither moves the entry while it is set); only
 *   while state is OPEN.
 * - going_away: the server's shutdown has given the connection a moment
 *   to be closed at (shutdown_ws_spread_ms); deadline_armed is set with
 *   it, so nothing else moves the entry, and the user's deadline is
 *   ignored from then on. */
struct tern_ws {
    tern__conn conn;
    const tern__ws_endpoint *ep;
    void *user;
    tern__ws_ext *ext;   /* receive state and permessage-deflate state, when needed */
    uint32_t soft_since;
    /* A nibble each (states and opcodes are under 16), so that the flags
     * below fit the struct's last word: 168 bytes, not 176. */
    uint8_t state : 4;
    uint8_t msg_opcode : 4;
    uint8_t subprotocol;
    bool msg_compressed : 1;
    bool awaiting_pong : 1;
    bool paused_by_policy : 1;
    bool sending_fragments : 1;   /* a fragmented message of ours is in progress */
    bool grace_wake : 1;          /* the timeout is armed for the grace period's end */
    bool close_due : 1;           /* on_close(1008 or 1013, "slow consumer") is due at the batch end */
    bool close_1013 : 1;          /* the policy close uses 1013 (pub/sub's choice), not 1008 */
    bool in_delivery : 1;         /* inside this connection's on_message/on_fragment */
    bool paused_by_user : 1;      /* tern_ws_pause: nothing is read or delivered */
    bool close_abort : 1;         /* with close_due: tern_ws_abort's on_close(1006) */
    bool deadline_armed : 1;      /* the wheel entry is armed for the user's deadline */
    bool going_away : 1;          /* ... or for the shutdown's close (spread over time) */
    /* In the room made by holding rx and pmd behind one pointer (ext):
     * the count has to live with the connection (net gives the struct
     * back, ws frees it when the count says so). */
    uint32_t refs;
    /* The loop's clock at the switch, in tenths of a second (mod 2^32:
     * sessions under 13 years measure right), for the session-length
     * histogram: in the struct's last padding. */
    uint32_t opened_ds;
};

#define TERN__WS_CONN_REF 0x80000000u

/* conn.c */
/* The slow-consumer close (1008), from inside a user's call: the close
 * frame follows the backlog, on_close comes at the end of the batch. */
void tern__ws_policy_close(tern_ws *ws);
/* The same with code 1008 or 1013 (try again later). */
void tern__ws_policy_close_code(tern_ws *ws, int code);
/* Another reference to a prepared message (tern_ws_prepared_free drops
 * one; any thread); the length of its plain frame. */
tern_ws_prepared *tern__ws_prepared_ref(tern_ws_prepared *m);
size_t tern__ws_prepared_len(const tern_ws_prepared *m);
/* The unmasked, uncompressed frame (tern__ws_prepared_len bytes). */
const uint8_t *tern__ws_prepared_bytes(const tern_ws_prepared *m);
/* The switch to WebSocket of a live connection (an HTTP server
 * connection after the 101 it sent, or a client's after the 101 it read):
 * the connection moves into a new tern_ws and on_open is called.
 * subprotocol: an index into ep->opt.subprotocols, or -1; pmd: the agreed
 * permessage-deflate parameters (in the RFC's terms), or NULL; rest: bytes
 * that came after the handshake, fed to the new connection at the end of
 * the batch; acct: the session's account (taken in every case), or NULL.
 * 0, or a negative errno with `from` untouched. */
TERN_MUST_CHECK
int tern__ws_open(tern__conn *from, const tern__ws_endpoint *ep, void *conn_user,
                  int subprotocol, const tern__pmd_params *pmd, const char *rest,
                  size_t rest_len, tern__ws_acct *acct);

/* endpoint.c */
/* Checks opt (NULL: all defaults) and fills ep with h, the options with
 * their defaults, user and role. 0, or -EINVAL for an option out of its
 * range (tern_ws_route lists them); ep is written only on 0. */
TERN_MUST_CHECK
int tern__ws_endpoint_init(tern__ws_endpoint *ep, const tern_ws_handlers *h,
                           const tern_ws_options *opt, void *user, int role);
/* Is s an HTTP token, as a subprotocol must be? */
bool tern__ws_token(const char *s);

/* mask_key.c */
/* A fresh masking key (RFC 6455 §5.3: unpredictable, one per frame),
 * from a ChaCha20 generator per thread seeded by the system's generator. */
void tern__ws_mask_key(uint8_t key[4]);

/* client.c */
/* The connection of a client endpoint is over: frees the endpoint. */
void tern__ws_client_release(const tern__ws_endpoint *ep);
/* tern_ws_connect to these n (1..8) addresses, tried in order, instead of
 * those the URL's host resolves to (the URL gives the rest: Host, path,
 * TLS): how the tests give one name several addresses. */
TERN_MUST_CHECK
int tern__ws_connect_to(tern_loop *loop, const char *url, const struct sockaddr *const *addrs,
                        const socklen_t *lens, int n, const tern_ws_handlers *h,
                        const tern_ws_client_options *opt, void *user,
                        tern_ws_connecting **out);

#endif
