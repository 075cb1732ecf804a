/* tern_url_parse (tern/url.h): the one parser of the URLs tern dials.
 *
 * Every URL is split the same way (RFC 3986 §3: scheme, user information,
 * host with IPv6 literals in brackets, port, path, query); what differs
 * between schemes is one row of schemes[] below: the default port, TLS,
 * whether user information is taken, and what the path means. The
 * WebSocket client (ws/client.c), tern load and the Redis engine
 * (pubsub/redis.c) parse with it; another scheme is one more row. */
#include "tern/url.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "loop/hex.h"

/* What a scheme's path means. */
enum url_path {
    URL_PATH_TARGET,   /* a request target, path and query (RFC 6455 §3) */
    URL_PATH_DB,       /* "/N" or nothing: a database number (Redis) */
};

/* One scheme's rules. A Unix-socket scheme has no host nor port, and its
 * target follows the socket's path (ws+unix:SOCKET:/PATH). */
typedef struct url_scheme {
    const char *prefix;    /* what the URL starts with, matched without regard to case */
    const char *name;      /* tern_url.scheme */
    int default_port;      /* 0 for a Unix socket */
    bool tls, unix_socket;
    bool userinfo;         /* USER[:PASSWORD]@ taken; else refused */
    enum url_path path;
} url_scheme;

static const url_scheme schemes[] = {
    {"ws://", "ws", 80, false, false, false, URL_PATH_TARGET},
    {"wss://", "wss", 443, true, false, false, URL_PATH_TARGET},
    {"ws+unix:", "ws+unix", 0, false, true, false, URL_PATH_TARGET},
    {"wss+unix:", "wss+unix", 0, true, true, false, URL_PATH_TARGET},
    {"redis://", "redis", 6379, false, false, true, URL_PATH_DB},
};

#define URL_DB_MAX 1000000   /* far above any Redis's databases, below int's range */

static int refuse(const char **why, const char *what) {
    if (why)
        *why = what;
    return -EINVAL;
}

/* §3: no fragment; no spaces or controls in a request line. */
static bool target_ok(const char *t) {
    for (; *t; t++)
        if ((unsigned char)*t <= 0x20 || (unsigned char)*t >= 0x7f || *t == '#')
            return false;
    return true;
}

/* Decodes len bytes of user information (%XX escapes) into out (cap
 * bytes with the NUL). False for a bad escape, a %00 (a C string cannot
 * hold it), or too long. */
static bool percent_decode(const char *s, size_t len, char *out, size_t cap) {
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        int c = (unsigned char)s[i];
        if (c == '%') {
            int hi = i + 2 < len ? tern__hex_value(s[i + 1]) : -1;
            int lo = i + 2 < len ? tern__hex_value(s[i + 2]) : -1;
            if (hi < 0 || lo < 0 || (hi | lo) == 0)
                return false;
            c = hi * 16 + lo;
            i += 2;
        }
        if (n + 1 >= cap)
            return false;
        out[n++] = (char)c;
    }
    out[n] = '\0';
    return true;
}

/* USER[:PASSWORD] (len bytes at p), percent-decoded into u. */
static int parse_userinfo(const char *p, size_t len, tern_url *u, const char **why) {
    const char *colon = memchr(p, ':', len);
    size_t ulen = colon ? (size_t)(colon - p) : len;
    if (!percent_decode(p, ulen, u->user, sizeof(u->user)))
        return refuse(why, "bad user (a bad %-escape, or too long)");
    if (colon && !percent_decode(colon + 1, len - ulen - 1, u->password, sizeof(u->password)))
        return refuse(why, "bad password (a bad %-escape, or too long)");
    u->userinfo = true;
    return 0;
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
    return target_ok(u->target) ? 0 : refuse(why, "a fragment, a space or a control "
                                                  "character in the path (percent-encode it)");
}

/* HOST[:PORT] (len bytes at auth, the user information already taken):
 * u's host, port and authority. */
static int parse_host_port(const char *auth, size_t len, int dflt, tern_url *u,
                           const char **why) {
    if (len == 0)
        return refuse(why, "no host");
    const char *end = auth + len, *hend, *colon;
    if (auth[0] == '[') {
        const char *rb = memchr(auth, ']', len);
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
        colon = hend < end ? hend : NULL;
        if (colon && *colon != ':')
            return refuse(why, "bad IPv6 address");
    } else {
        colon = memchr(auth, ':', len);
        hend = colon ? colon : end;
        if (hend == auth)
            return refuse(why, "no host");
        if ((size_t)(hend - auth) >= sizeof(u->host))
            return refuse(why, "host too long");
        memcpy(u->host, auth, (size_t)(hend - auth));
        u->host[hend - auth] = '\0';
    }
    u->port = dflt;
    if (colon) {
        const char *d = colon + 1;
        int port = 0;
        if (d == end)
            return refuse(why, "bad port");
        for (; d < end; d++) {
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
    return 0;
}

/* A Redis path: nothing, "/" or "/N" (N a database number), and no query. */
static int parse_db(const char *p, tern_url *u, const char **why) {
    if (*p == '/')
        p++;
    int db = 0;
    const char *d = p;
    for (; *d >= '0' && *d <= '9' && db <= URL_DB_MAX; d++)
        db = db * 10 + (*d - '0');
    if (*d != '\0' || db > URL_DB_MAX)
        return refuse(why, "a path other than /DB, a number up to 1000000, or a query");
    u->db = db;
    return 0;
}

/* [USER[:PASSWORD]@]HOST[:PORT][/PATH][?QUERY]: p is what follows the scheme. */
static int parse_inet(const char *p, const url_scheme *s, tern_url *u, const char **why) {
    /* The user information ends at the last '@' before the path, so that
     * a password keeps an '@', '?' or '#' written as is (RFC 3986 asks for
     * %40, but Redis's URLs have been taken so). */
    const char *at = NULL;
    for (const char *q = p; *q && *q != '/'; q++)
        if (*q == '@')
            at = q;
    if (at && !s->userinfo)
        return refuse(why, "user info is not for WebSocket URLs");
    int err;
    if (at && (err = parse_userinfo(p, (size_t)(at - p), u, why)) < 0)
        return err;
    const char *auth = at ? at + 1 : p;
    size_t alen = strcspn(auth, "/?#");
    if ((err = parse_host_port(auth, alen, s->default_port, u, why)) < 0)
        return err;
    const char *rest = auth + alen;
    if (s->path == URL_PATH_DB)
        return parse_db(rest, u, why);
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
    for (size_t i = 0; i < sizeof(schemes) / sizeof(schemes[0]); i++) {
        const url_scheme *s = &schemes[i];
        size_t n = strlen(s->prefix);
        if (strncasecmp(url, s->prefix, n) != 0)
            continue;
        u->scheme = s->name;
        u->tls = s->tls;
        u->unix_socket = s->unix_socket;
        return s->unix_socket ? parse_unix(url + n, u, why) : parse_inet(url + n, s, u, why);
    }
    return refuse(why, "it must start with ws://, wss://, ws+unix:, wss+unix: or redis://");
}
