/* tern_url_parse (tern/url.h): the WebSocket URLs tern dials, RFC 6455 §3.
 * The client (client.c) parses with it, and so does tern load. */
#include "tern/url.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* §3: no fragment; no spaces or controls in a request line. */
static bool target_ok(const char *t) {
    for (; *t; t++)
        if ((unsigned char)*t <= 0x20 || (unsigned char)*t >= 0x7f || *t == '#')
            return false;
    return true;
}

static int refuse(const char **why, const char *what) {
    if (why)
        *why = what;
    return -EINVAL;
}

/* ws+unix:SOCKET[:/target]: p is what follows the scheme. */
static int parse_unix(const char *p, tern_url *u, const char **why) {
    if (*p == '\0')
        return refuse(why, "no socket path");
    const char *t = strstr(p + 1, ":/");
    size_t n = t ? (size_t)(t - p) : strlen(p);
    if (n >= sizeof(u->socket_path))
        return refuse(why, "socket path too long");
    memcpy(u->socket_path, p, n);
    u->socket_path[n] = '\0';
    u->target = t ? t + 1 : "/";
    strcpy(u->host, "localhost");
    strcpy(u->authority, "localhost");
    u->port = 0;
    return target_ok(u->target) ? 0 : refuse(why, "a fragment, a space or a control "
                                                  "character in the path (percent-encode it)");
}

/* HOST[:PORT][/PATH][?QUERY]: p is what follows the scheme. */
static int parse_inet(const char *p, tern_url *u, const char **why) {
    const char *auth = p;
    size_t alen = strcspn(auth, "/?#");
    const char *rest = auth + alen;
    if (alen == 0)
        return refuse(why, "no host");
    if (memchr(auth, '@', alen))
        return refuse(why, "user info is not for WebSocket URLs");
    const char *hend, *colon;
    if (auth[0] == '[') {
        const char *rb = memchr(auth, ']', alen);
        if (rb == NULL || rb == auth + 1)
            return refuse(why, "bad IPv6 address");
        if ((size_t)(rb - auth - 1) >= sizeof(u->host))
            return refuse(why, "host too long");
        memcpy(u->host, auth + 1, (size_t)(rb - auth - 1));
        u->host[rb - auth - 1] = '\0';
        unsigned char a6[16];
        if (inet_pton(AF_INET6, u->host, a6) != 1)
            return refuse(why, "bad IPv6 address");
        hend = rb + 1;
        colon = hend < auth + alen ? hend : NULL;
        if (colon && *colon != ':')
            return refuse(why, "bad IPv6 address");
    } else {
        colon = memchr(auth, ':', alen);
        hend = colon ? colon : auth + alen;
        if (hend == auth)
            return refuse(why, "no host");
        if ((size_t)(hend - auth) >= sizeof(u->host))
            return refuse(why, "host too long");
        memcpy(u->host, auth, (size_t)(hend - auth));
        u->host[hend - auth] = '\0';
    }
    int dflt = u->tls ? 443 : 80;
    u->port = dflt;
    if (colon) {
        const char *d = colon + 1;
        int port = 0;
        if (d == auth + alen)
            return refuse(why, "bad port");
        for (; d < auth + alen; d++) {
            if (*d < '0' || *d > '9' || port > 65535)
                return refuse(why, "bad port");
            port = port * 10 + (*d - '0');
        }
        if (port < 1 || port > 65535)
            return refuse(why, "bad port");
        u->port = port;
    }
    /* The Host header: the authority as written, without a default port. */
    snprintf(u->authority, sizeof(u->authority), "%.*s", (int)(hend - auth), auth);
    if (u->port != dflt)
        snprintf(u->authority + strlen(u->authority),
                 sizeof(u->authority) - strlen(u->authority), ":%d", u->port);
    if (*rest == '?')
        return refuse(why, "a query without a path (write ws://HOST/?QUERY)");
    u->target = *rest == '\0' ? "/" : rest;
    return target_ok(u->target) ? 0 : refuse(why, "a fragment, a space or a control "
                                                  "character in the path (percent-encode it)");
}

int tern_url_parse(const char *url, tern_url *u, const char **why) {
    if (url == NULL || u == NULL)
        return refuse(why, "no URL");
    memset(u, 0, sizeof(*u));
    static const struct {
        const char *scheme;
        bool tls, unix_socket;
    } schemes[] = {
        {"ws://", false, false},
        {"wss://", true, false},
        {"ws+unix:", false, true},
        {"wss+unix:", true, true},
    };
    for (size_t i = 0; i < sizeof(schemes) / sizeof(schemes[0]); i++) {
        size_t n = strlen(schemes[i].scheme);
        if (strncasecmp(url, schemes[i].scheme, n) != 0)
            continue;
        u->tls = schemes[i].tls;
        u->unix_socket = schemes[i].unix_socket;
        return u->unix_socket ? parse_unix(url + n, u, why) : parse_inet(url + n, u, why);
    }
    return refuse(why, "it must start with ws://, wss://, ws+unix: or wss+unix:");
}
