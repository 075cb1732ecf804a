/* The NATS engine's URL (nats_url.c): the brokers, and the credentials
 * to give them, parsed once when the bridge starts.
 *
 *     nats://[CREDENTIALS@]HOST[:PORT][,HOST[:PORT]...][/][?QUERY]
 *     tls://...  the same, over TLS (the servers' certificates verified
 *                against the system's CAs or ca=, and their host names)
 *
 * CREDENTIALS is user:password or a token (no ':'), percent-encoded.
 * Several HOSTs (a cluster; the scheme may be repeated before each) are
 * tried in turn by libnats. HOST is a name, an IPv4 address or an IPv6
 * one in brackets; PORT is 4222 unless written. QUERY names files read at
 * each connect, so that a secret is never on a command line:
 *   creds=PATH           a NATS credentials file (a user JWT and its seed)
 *   token_file=PATH      the token (its first line)
 *   password_file=PATH   the password of the URL's user (its first line)
 *   replicas=N           the copies (1..5) JetStream keeps of each stream tern
 *                        makes for a topic with a history (1 unless written;
 *                        a cluster's servers that may go away want 3)
 * and, with tls:// only:
 *   ca=PATH              the CAs (PEM) to verify the servers' certificates
 *                        with, instead of the system's
 *   cert=PATH&key=PATH   a client certificate (PEM) and its key, for a
 *                        server that asks for one
 * A file's PATH is percent-decoded; an unknown name is refused (a typo
 * would connect without the credentials meant). */
#ifndef TERN_PUBSUB_NATS_URL_H
#define TERN_PUBSUB_NATS_URL_H

#include <stdbool.h>
#include <stddef.h>

#include "tern/url.h"

#define TERN__NATS_SERVERS_MAX 16
#define TERN__NATS_PATH_MAX 4096

/* A parsed URL. Invariants: 1 <= nservers <= TERN__NATS_SERVERS_MAX, each
 * server "SCHEME://HOST:PORT" without credentials (tls: the scheme is
 * tls://); at most one of user
 * (with pass or password_file), token, token_file is given; hosts holds
 * the servers' HOST:PORT joined by ',' for log lines (no secret). */
typedef struct tern__nats_url {
    bool tls;   /* tls:// */
    int replicas;   /* 1..5: the JetStream streams' replicas */
    int nservers;
    char servers[TERN__NATS_SERVERS_MAX][TERN_URL_HOST_MAX + 16];
    char hosts[512];
    char user[256], pass[512], token[512];   /* decoded; "" for none. Never logged */
    char creds[TERN__NATS_PATH_MAX], token_file[TERN__NATS_PATH_MAX],
        password_file[TERN__NATS_PATH_MAX];  /* "" for none */
    char ca[TERN__NATS_PATH_MAX], cert[TERN__NATS_PATH_MAX], key[TERN__NATS_PATH_MAX];
                                             /* tls only; cert and key both or neither */
} tern__nats_url;

/* Parses url into *out. Returns 0, or -EINVAL with *why (when why is not
 * NULL) a static sentence saying what is wrong, never quoting the URL
 * (it may hold a password). Any thread. */
int tern__nats_url_parse(const char *url, tern__nats_url *out, const char **why);

#endif
