/* The NATS engine's URL (nats_url.h): servers, credentials and the files
 * that hold them. Percent-decoding and the query's pairs are http's
 * (tern__url_decode, tern__query_find), so that every URL tern reads
 * decodes alike. */
#include "pubsub/nats_url.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "http/parser.h"

#define SCHEME "nats://"
#define SCHEME_TLS "tls://"
#define DEFAULT_PORT 4222

/* Decodes len bytes of src into out (cap bytes with the NUL); a NUL byte
 * is refused, as a C string would end there. */
static bool decode(const char *src, size_t len, char *out, size_t cap) {
    ssize_t n = tern__url_decode(out, cap - 1, src, len, false);
    if (n < 0 || memchr(out, '\0', (size_t)n))
        return false;
    out[n] = '\0';
    return true;
}

/* The credentials before '@': user:password, or a token. */
static int parse_userinfo(tern__nats_url *u, const char *p, size_t len, const char **why) {
    const char *colon = memchr(p, ':', len);
    if (colon == NULL) {
        if (len == 0 || !decode(p, len, u->token, sizeof(u->token)))
            return *why = "a bad token before '@'", -EINVAL;
        return 0;
    }
    size_t ul = (size_t)(colon - p);
    if (ul == 0 || !decode(p, ul, u->user, sizeof(u->user)) ||
        !decode(colon + 1, len - ul - 1, u->pass, sizeof(u->pass)))
        return *why = "bad credentials before '@' (user:password, percent-encoded)", -EINVAL;
    return 0;
}

/* One server, HOST[:PORT], len bytes at p: into u->servers and u->hosts. */
static int parse_server(tern__nats_url *u, const char *p, size_t len, const char **why) {
    if (u->nservers == TERN__NATS_SERVERS_MAX)
        return *why = "too many servers", -EINVAL;
    size_t hl;
    if (len > 0 && p[0] == '[') {   /* an IPv6 address */
        const char *close = memchr(p, ']', len);
        if (close == NULL)
            return *why = "an IPv6 address without its ']'", -EINVAL;
        hl = (size_t)(close - p) + 1;
    } else {
        const char *colon = memchr(p, ':', len);
        hl = colon ? (size_t)(colon - p) : len;
    }
    if (hl == 0 || hl >= TERN_URL_HOST_MAX || memchr(p, '@', len))
        return *why = "a server without a host, or credentials on a server but the first", -EINVAL;
    for (size_t i = 0; i < hl; i++)
        if ((unsigned char)p[i] <= ' ' || (unsigned char)p[i] >= 0x7f)
            return *why = "a host with a space or a control byte", -EINVAL;
    long port = DEFAULT_PORT;
    if (hl < len) {
        if (p[hl] != ':' || hl + 1 == len)
            return *why = "a bad port", -EINVAL;
        port = 0;
        for (size_t i = hl + 1; i < len; i++) {
            if (p[i] < '0' || p[i] > '9' || port > 65535)
                return *why = "a bad port", -EINVAL;
            port = port * 10 + (p[i] - '0');
        }
        if (port < 1 || port > 65535)
            return *why = "a port outside 1..65535", -EINVAL;
    }
    snprintf(u->servers[u->nservers], sizeof(u->servers[0]), "%s%.*s:%ld",
             u->tls ? SCHEME_TLS : SCHEME, (int)hl, p, port);
    size_t used = strlen(u->hosts);
    snprintf(u->hosts + used, sizeof(u->hosts) - used, "%s%.*s:%ld", used ? "," : "", (int)hl, p,
             port);
    u->nservers++;
    return 0;
}

/* A file's path from the query (name=PATH), decoded into out; "" when
 * the name is absent. */
static int query_path(const char *q, size_t qlen, const char *name, char *out, size_t cap,
                      const char **why) {
    size_t vl;
    const char *v = tern__query_find(q, qlen, name, &vl);
    out[0] = '\0';
    if (v && (vl == 0 || !decode(v, vl, out, cap)))
        return *why = "an empty or badly encoded file name in the query", -EINVAL;
    return 0;
}

/* Every pair of the query is one this file knows. */
static bool query_known(const char *q, size_t qlen) {
    static const char *const names[] = {"creds", "token_file", "password_file", "ca", "cert",
                                        "key", "replicas"};
    for (size_t i = 0; i < qlen;) {
        size_t pl = strcspn(q + i, "&");
        pl = pl > qlen - i ? qlen - i : pl;
        size_t nl = strcspn(q + i, "=&");
        nl = nl > pl ? pl : nl;
        bool known = false;
        for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++)
            known |= strlen(names[k]) == nl && memcmp(q + i, names[k], nl) == 0;
        if (!known)
            return false;
        i += pl + 1;
    }
    return true;
}

/* The length of the scheme at p ("nats://", or "tls://" when tls), 0 for
 * another. */
static size_t scheme_len(const char *p, bool tls) {
    const char *s = tls ? SCHEME_TLS : SCHEME;
    return strncmp(p, s, strlen(s)) == 0 ? strlen(s) : 0;
}

/* The length of the server list at p: up to its '/' or '?', the scheme
 * written again after a ',' being part of it. */
static size_t servers_len(const char *p, bool tls) {
    size_t n = 0;
    for (; p[n] && p[n] != '/' && p[n] != '?'; n++)
        if (p[n] == ',')
            n += scheme_len(p + n + 1, tls);
    return n;
}

int tern__nats_url_parse(const char *url, tern__nats_url *u, const char **why) {
    const char *ignored;
    if (why == NULL)
        why = &ignored;
    memset(u, 0, sizeof(*u));
    size_t scheme = url ? scheme_len(url, false) : 0;
    if (url && scheme == 0 && (scheme = scheme_len(url, true)) > 0)
        u->tls = true;
    if (scheme == 0)
        return *why = "not a nats:// or tls:// URL", -EINVAL;
    const char *p = url + scheme;
    size_t rest = servers_len(p, u->tls);
    const char *q = p[rest] == '/' ? p + rest + 1 : p + rest;
    if (*q != '\0' && *q != '?')
        return *why = "a path after the servers (only '/' and a query may follow)", -EINVAL;
    const char *query = *q == '?' ? q + 1 : q;
    size_t qlen = strlen(query);
    /* The first server's credentials: the last '@' before its ',' */
    size_t first = strcspn(p, ",/?");
    const char *at = NULL;
    for (const char *c = p; c < p + first; c++)
        if (*c == '@')
            at = c;
    if (at) {
        if (parse_userinfo(u, p, (size_t)(at - p), why) < 0)
            return -EINVAL;
        rest -= (size_t)(at + 1 - p);
        p = at + 1;
    }
    while (rest > 0 || u->nservers == 0) {
        size_t sl = strcspn(p, ",/?");
        sl = sl > rest ? rest : sl;
        if (parse_server(u, p, sl, why) < 0)
            return -EINVAL;
        if (sl == rest)
            break;
        p += sl + 1;
        rest -= sl + 1;
        size_t again = scheme_len(p, u->tls);
        p += again;
        rest -= again;
        if (rest == 0)
            return *why = "an empty server after ','", -EINVAL;
    }
    if (!query_known(query, qlen))
        return *why = "an unknown name in the query (known: creds, token_file, password_file, "
                      "replicas, ca, cert, key)",
               -EINVAL;
    if (query_path(query, qlen, "creds", u->creds, sizeof(u->creds), why) < 0 ||
        query_path(query, qlen, "token_file", u->token_file, sizeof(u->token_file), why) < 0 ||
        query_path(query, qlen, "password_file", u->password_file, sizeof(u->password_file),
                   why) < 0 ||
        query_path(query, qlen, "ca", u->ca, sizeof(u->ca), why) < 0 ||
        query_path(query, qlen, "cert", u->cert, sizeof(u->cert), why) < 0 ||
        query_path(query, qlen, "key", u->key, sizeof(u->key), why) < 0)
        return -EINVAL;
    size_t rl;
    const char *r = tern__query_find(query, qlen, "replicas", &rl);
    u->replicas = 1;
    if (r && (rl != 1 || r[0] < '1' || r[0] > '5'))
        return *why = "replicas is not a number from 1 to 5", -EINVAL;
    if (r)
        u->replicas = r[0] - '0';
    if (!u->tls && (u->ca[0] || u->cert[0] || u->key[0]))
        return *why = "ca, cert and key need a tls:// URL", -EINVAL;
    if (!u->cert[0] != !u->key[0])
        return *why = "cert without key, or key without cert", -EINVAL;
    if (u->password_file[0] && (u->user[0] == '\0' || u->pass[0]))
        return *why = "password_file needs a user and no password in the URL (nats://user:@host)",
               -EINVAL;
    if (u->token_file[0] && (u->token[0] || u->user[0]))
        return *why = "token_file with credentials in the URL too", -EINVAL;
    if (u->user[0] && u->pass[0] == '\0' && u->password_file[0] == '\0')
        return *why = "a user without a password", -EINVAL;
    return 0;
}
