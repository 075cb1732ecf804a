/* tern URLs: the one parser of the URLs tern dials.
 *
 * tern_url_parse splits a ws://, wss://, ws+unix:, wss+unix: or redis://
 * URL into what a connection needs: TLS or not, where to connect (a host
 * and port, or a Unix socket), the Host header and the request target of
 * a WebSocket, the user, password and database of Redis. It is the parser
 * tern_ws_connect and the Redis bridge use, public so that a program
 * (tern load, say) takes exactly the URLs the library takes and can build
 * more from the same parts.
 *
 *     tern_url u;
 *     const char *why;
 *     if (tern_url_parse("wss://example.com:8443/chat?room=1", &u, &why) < 0)
 *         fprintf(stderr, "bad URL: %s\n", why);
 *     // u.scheme "wss", u.tls, u.host "example.com", u.port 8443,
 *     // u.authority "example.com:8443", u.target "/chat?room=1"
 */
#ifndef TERN_URL_H
#define TERN_URL_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#pragma GCC visibility push(default)

#define TERN_URL_HOST_MAX 256        /* host's bytes with the NUL */
#define TERN_URL_SOCKET_MAX 108      /* a Unix socket's path with the NUL (sun_path) */
#define TERN_URL_USER_MAX 256        /* a user's bytes, decoded, with the NUL */
#define TERN_URL_PASSWORD_MAX 512    /* a password's bytes, decoded, with the NUL */

/* A parsed URL. Every field is filled by tern_url_parse; target points
 * into the URL parsed (or at a static "/") and is valid as long as it.
 * The password is a copy: wipe it (explicit_bzero) once used. */
typedef struct tern_url {
    const char *scheme;               /* "ws", "wss", "ws+unix", "wss+unix" or
                                         "redis": lower case, static */
    bool tls;                         /* wss:// or wss+unix: */
    bool unix_socket;                 /* ws+unix: or wss+unix: */
    char host[TERN_URL_HOST_MAX];     /* name or address, IPv6 without brackets;
                                         "localhost" for a Unix socket */
    char authority[TERN_URL_HOST_MAX + 48];  /* the Host header: host[:port] as
                                         written (IPv6 in brackets), without
                                         the scheme's default port */
    int port;                         /* as written, else 80 (ws), 443 (wss) or
                                         6379 (redis); 0 for a Unix socket */
    char socket_path[TERN_URL_SOCKET_MAX];   /* the Unix socket's path; "" else */
    const char *target;               /* WebSocket's request target: path and
                                         query, "/" when the URL has no path;
                                         NULL for redis:// */
    bool userinfo;                    /* USER[:PASSWORD]@ written (redis:// only) */
    char user[TERN_URL_USER_MAX];     /* percent-decoded; "" when none */
    char password[TERN_URL_PASSWORD_MAX];    /* percent-decoded; "" when none */
    int db;                           /* redis://HOST/DB's database; 0 when not written */
} tern_url;

/* Parses url:
 *   ws://HOST[:PORT][/PATH][?QUERY]      wss://... the same, over TLS
 *   ws+unix:SOCKET[:/PATH[?QUERY]]       wss+unix:... the same, over TLS
 *   redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]
 * HOST is a name, an IPv4 address or an IPv6 one in brackets. The scheme
 * is matched without regard to case. Refused: a port outside 1..65535, a
 * host or socket path too long; for WebSocket (RFC 6455 §3) user
 * information, a fragment, a query without a path ("ws://h?q": write
 * "ws://h/?q"), a target with a space, a control or a byte over 0x7E; for
 * Redis a query, a DB that is not a number up to 1000000, a %-escape that
 * is bad or %00 in the user or password, or one too long. The user
 * information ends at the last '@' before the path.
 * Returns 0, or -EINVAL with *why (when why is not NULL) a static
 * sentence saying what is wrong; out is then undefined. Any thread. */
int tern_url_parse(const char *url, tern_url *out, const char **why);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif

#endif
