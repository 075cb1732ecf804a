/* tern WebSocket client (RFC 6455 §4.1, permessage-deflate RFC 7692).
 *
 * tern_ws_connect opens a connection from a loop to a WebSocket server;
 * once the server has answered 101, it is a tern_ws like any a server
 * accepted: the same handlers (on_open, on_message, on_close, ...), the
 * same sends and send results, backpressure, pings and closing handshake.
 * The client masks every frame it sends with a fresh key and refuses
 * masked frames from the server. A connection that never opens ends in
 * on_connect_error instead, once, with no other callback.
 * tern_ws_connect2 also gives a handle to the pending connect, which
 * tern_ws_connect_cancel gives up (on_connect_error with -ECANCELED).
 *
 * No server owns a client's connection, so nothing closes it for you: a
 * program closes its connections (tern_ws_close) and runs the loop until
 * their on_close before it frees the loop. After the closing handshake
 * the client closes TCP as soon as its last frame is out (RFC 6455
 * §7.1.1 allows it): what remains of a connection is freed in the same
 * batch of events as its on_close, so on_close may stop the loop.
 *
 *     tern_ws_handlers h = {.on_open = hello, .on_message = got,
 *                           .on_close = gone, .on_connect_error = failed};
 *     tern_ws_connect(loop, "wss://example.com/chat", &h, NULL, user);
 *     tern_loop_run(loop);
 */
#ifndef TERN_CLIENT_H
#define TERN_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tern/loop.h"
#include "tern/ws.h"

#ifdef __cplusplus
extern "C" {
#endif

/* libtern.so exports what this header declares, and nothing else. */
#pragma GCC visibility push(default)

/* Zero means the default for every field. */
typedef struct tern_ws_client_options {
    /* Limits, timeouts and backlog policy as for a route. subprotocols
     * are offered in this order (tern_ws_subprotocol says which the
     * server chose; a choice not offered fails the handshake). With
     * compression, permessage-deflate is offered: client_no_context_takeover
     * promises that our compressor keeps no context, server_no_context_takeover
     * asks the server for the same, server_max_window_bits (9..14) asks
     * for a smaller server window; the server may also limit our window
     * (client_max_window_bits is always offered). compress_min and
     * compression_mem_level apply to our sends. */
    tern_ws_options ws;
    /* Extra request headers, each "Name: value" (Origin, Cookie,
     * Authorization, ...), NULL-terminated. Host, Upgrade, Connection and
     * the Sec-WebSocket-* headers are tern's and refused here. */
    const char *const *headers;
    /* The connect, the TLS handshake and the server's 101 must all be
     * done within this: 10 s. */
    uint32_t connect_timeout_ms;
    /* wss: PEM file of the CAs to trust instead of the system's. */
    const char *ca_file;
    /* wss: no certificate verification at all (tests, self-signed servers). */
    bool insecure;
    /* wss: the name sent as SNI and checked against the certificate;
     * default: the URL's host. */
    const char *server_name;
    /* The socket's receive buffer, SO_RCVBUF in bytes (Linux doubles it
     * and has a floor): a small one gives a reader a small TCP window, as
     * a slow link does (with tern_ws_pause, a slow reader for a test or a
     * load generator). Set before the connect, so even the first window
     * offered is that small. 0: the system's (autotuned). */
    int rcvbuf;
    /* The DNS servers asked for the URL's host name, as c-ares takes them:
     * "ADDR[:PORT],..." ("127.0.0.1:5353", "[::1]:53"); NULL: the
     * system's (/etc/resolv.conf). /etc/hosts is read first either way.
     * For tests, and programs that must ask a server of their own. */
    const char *dns_servers;
} tern_ws_client_options;

/* Why a connection never opened, for on_connect_error. */
typedef struct tern_ws_connect_error {
    /* -ECONNREFUSED, -ETIMEDOUT, -ENETUNREACH, ... (the connect, or the
     * whole handshake, took longer than connect_timeout_ms);
     * -ECONNRESET: the server closed the connection during the handshake;
     * -EPROTO: its answer was not a valid 101 (another status: see
     * status; a wrong Sec-WebSocket-Accept, a subprotocol or extension we
     * did not offer, a malformed head); -EKEYREJECTED: TLS certificate
     * verification failed; another negative errno otherwise. */
    int err;
    int status;          /* the HTTP status of a non-101 answer, else 0 */
    bool connected;      /* the TCP connection was made: the handshake failed */
    const char *message; /* one line saying what happened, for people */
} tern_ws_connect_error;

/* Connects to url: ws://host[:port][/path][?query], wss://..., with host
 * a name, an IPv4 address or an [IPv6] one; or ws+unix:SOCKET[:/path]
 * (wss+unix: with TLS) for a server on a Unix socket. A host name is
 * resolved by c-ares on the loop (/etc/hosts, then DNS; the loop never
 * waits for it), and its addresses (up to 8, in the resolver's order)
 * are tried in turn until one connects (localhost may be ::1 first, and
 * a server listen on 127.0.0.1 only); connect_timeout_ms bounds the
 * resolution and the attempts together. Returns 0, after which exactly
 * one of on_open or on_connect_error follows from the loop, never from
 * inside this call (a name that does not resolve: on_connect_error with
 * TERN_ENOHOST; no answer in time: -ETIMEDOUT); or a negative error and
 * no callback: -EINVAL (a bad URL, h NULL or without on_connect_error,
 * an option out of range such as a negative rcvbuf, a reserved header,
 * dns_servers c-ares refuses), -ENOMEM, -EPROTO (the TLS context could
 * not be made: the ca_file is not PEM, say), or the error of a connect to
 * an address in the URL that failed at once (-ENOENT, -ECONNREFUSED for
 * a Unix socket). The URL, options and strings are copied. The
 * connection's tern_ws_server() is NULL. */
TERN_MUST_CHECK
int tern_ws_connect(tern_loop *loop, const char *url, const tern_ws_handlers *h,
                    const tern_ws_client_options *opt, void *user);

/* A connect that has not opened yet, for tern_ws_connect_cancel. */
typedef struct tern_ws_connecting tern_ws_connecting;

/* tern_ws_connect, and *out a handle to the pending connect (set on
 * success; NULL otherwise). The handle is valid until on_open or
 * on_connect_error is called (it is freed just before either: do not
 * use it from inside them, or after); keep it only to cancel. -EINVAL
 * when out is NULL; otherwise as tern_ws_connect. */
TERN_MUST_CHECK
int tern_ws_connect2(tern_loop *loop, const char *url, const tern_ws_handlers *h,
                     const tern_ws_client_options *opt, void *user, tern_ws_connecting **out);

/* Gives up a pending connect, wherever it is: resolving the name,
 * connecting, or in the TLS or WebSocket handshake. As libuv does for a
 * cancelled request, the connect still ends with its one callback:
 * on_connect_error with err -ECANCELED (connected says whether TCP had
 * connected), from the loop, never from inside this call; on_open never
 * comes, not even for a 101 already on its way. A second cancel before
 * that callback does nothing; NULL does nothing. From the loop's thread
 * only.
 * tern_loop_free cancels the connects still pending the same way, but
 * their on_connect_error runs from inside tern_loop_free (there is no
 * later batch): it may free what user points to, and must not run the
 * loop. */
void tern_ws_connect_cancel(tern_ws_connecting *c);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
