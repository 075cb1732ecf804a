/* Endpoints: the handlers and options of one end of WebSocket
 * connections, checked and filled with the defaults the same way for a
 * server's route and a client's connection. */
#include <errno.h>
#include <string.h>

#include "ws/ws.h"

#define KIB 1024u

/* A subprotocol is an HTTP token (RFC 6455 §4.1): non-empty, no spaces,
 * commas or other separators. */
bool tern__ws_token(const char *s) {
    if (*s == '\0')
        return false;
    for (; *s; s++)
        if ((unsigned char)*s <= 0x20 || (unsigned char)*s >= 0x7f || strchr("()<>@,;:\\\"/[]?={}", *s))
            return false;
    return true;
}

int tern__ws_endpoint_init(tern__ws_endpoint *ep, const tern_ws_handlers *h,
                           const tern_ws_options *opt, void *user, int role) {
    /* Out-of-range options are refused rather than quietly replaced: a
     * typo should not become a server that runs with other limits. */
    if (opt && ((opt->slow_policy < TERN_WS_SLOW_CLOSE || opt->slow_policy > TERN_WS_SLOW_PAUSE) ||
                (opt->server_max_window_bits != 0 &&
                 (opt->server_max_window_bits < 9 || opt->server_max_window_bits > 15)) ||
                opt->compression_mem_level < 0 || opt->compression_mem_level > 9 ||
                (opt->backlog_soft && opt->backlog_hard && opt->backlog_soft > opt->backlog_hard)))
        return -EINVAL;
    size_t nsub = 0;
    for (; opt && opt->subprotocols && opt->subprotocols[nsub]; nsub++)
        if (!tern__ws_token(opt->subprotocols[nsub]))
            return -EINVAL;
    if (nsub >= TERN__WS_NO_SUBPROTOCOL)   /* stored as a byte-sized index */
        return -EINVAL;
    memset(ep, 0, sizeof(*ep));
    ep->h = *h;
    if (opt)
        ep->opt = *opt;
    tern_ws_options *o = &ep->opt;
    if (!o->max_message) o->max_message = 16 * KIB * KIB;
    if (!o->idle_timeout_ms) o->idle_timeout_ms = 30000;
    if (!o->pong_timeout_ms) o->pong_timeout_ms = 30000;
    if (!o->close_timeout_ms) o->close_timeout_ms = 5000;
    if (!o->backlog_soft) o->backlog_soft = 256 * KIB;
    if (!o->backlog_grace_ms) o->backlog_grace_ms = 10000;
    if (!o->backlog_hard) o->backlog_hard = 1024 * KIB;
    if (!o->compress_min) o->compress_min = 64;
    if (o->server_max_window_bits == 0)
        o->server_max_window_bits = 15;
    if (o->backlog_soft > o->backlog_hard)   /* one given, the other defaulted */
        o->backlog_hard = o->backlog_soft;
    ep->pmd = (tern__pmd_config){
        .enabled = o->compression,
        .server_no_context_takeover = o->server_no_context_takeover,
        .client_no_context_takeover = o->client_no_context_takeover,
        .server_max_window_bits = o->server_max_window_bits,
        .mem_level = o->compression_mem_level,
    };
    ep->user = user;
    ep->role = (uint8_t)role;
    return 0;
}
