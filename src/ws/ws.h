/* Private side of the WebSocket server: routes and the connection. */
#ifndef TERN_WS_PRIVATE_H
#define TERN_WS_PRIVATE_H

#include "http/server.h"
#include "tern/ws.h"
#include "ws/deflate.h"
#include "ws/frame.h"

/* A WebSocket route: handlers and options with the defaults filled in. */
typedef struct tern__ws_route {
    tern_ws_handlers h;
    tern_ws_options opt;
    tern__pmd_config pmd;
    void *user;
    tern_server *srv;
    struct tern__ws_route *next;
} tern__ws_route;

/* The ws module's state on a server (srv->ws). */
typedef struct tern__ws_server {
    tern__router *router;
    tern__ws_route *routes;
} tern__ws_server;

enum tern__ws_state {
    TERN__WS_OPEN,        /* messages flow both ways */
    TERN__WS_CLOSE_SENT,  /* our close frame is out; waiting for the peer's */
    TERN__WS_DONE,        /* on_close has been called; only the TCP close remains */
};

/* Invariants:
 * - conn is first (net frees the struct with free()).
 * - in_frame: a data frame's header has been read and frame_left bytes of
 *   its payload are still to come, unmasked from key phase `phase`.
 * - msg_opcode is non-zero exactly while a data message is in progress;
 *   msg[0..msg_len) holds its bytes so far when it is being assembled
 *   (decompressed), and msg_total counts every byte of it received.
 * - utf8 is the validator's state over the text message so far.
 * - state only moves forward; on_close is called once, when it becomes
 *   DONE (or from net's on_close if the connection drops first). */
struct tern_ws {
    tern__conn conn;
    const tern__ws_route *route;
    void *user;
    uint8_t state;
    bool in_frame;
    bool frame_fin;
    uint8_t phase;
    uint8_t mask[4];
    uint64_t frame_left;
    uint8_t msg_opcode;
    bool msg_compressed;
    bool awaiting_pong;
    bool paused_by_policy;
    bool sending_fragments;    /* a fragmented message of ours is in progress */
    uint32_t utf8;
    uint64_t msg_total;
    char *msg;
    size_t msg_len, msg_cap;
    uint64_t soft_since;       /* when the backlog went over the soft limit; 0 if not */
    bool grace_wake;           /* the timeout is armed for the grace period's end */
    bool pmd_on;
    tern__pmd_params pmd;
    tern__pmd_inflater *inflater;
    tern__pmd_deflater *deflater;
    const char *subprotocol;   /* an entry of route->opt.subprotocols, or NULL */
};

/* conn.c */
int tern__ws_open(tern__http_conn *hc, const tern__ws_route *route, void *conn_user,
                    const char *subprotocol, const tern__pmd_params *pmd, bool pmd_on,
                    const char *rest, size_t rest_len);

#endif
