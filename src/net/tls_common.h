/* What both TLS files (net/tls_openssl.c, net/tls_rustls.c) share and
 * neither library does for them: a certificate's names for SNI and a
 * peer certificate's subject (X.509, read through libcrypto, which every
 * build links), the look at a server connection's first bytes that tells
 * plain HTTP from TLS, and the checks of tern_tls_options. */
#ifndef TERN_NET_TLS_COMMON_H
#define TERN_NET_TLS_COMMON_H

#include <openssl/x509.h>

#include "net/tls.h"

#define TERN__TLS_MAX_NAMES 32

/* A certificate's DNS names, lower-case: its subjectAltName entries, or
 * its CN when it has none; at most TERN__TLS_MAX_NAMES. */
typedef struct tern__tls_names {
    char *names[TERN__TLS_MAX_NAMES];
    int n;
} tern__tls_names;

/* Replaces nm's names by x's (none without memory). */
void tern__tls_names_read(tern__tls_names *nm, X509 *x);
void tern__tls_names_free(tern__tls_names *nm);
/* Does one of nm's names (maybe "*.example.com") cover name (len bytes)? */
bool tern__tls_names_match(const tern__tls_names *nm, const char *name, size_t len);

/* x's subject, RFC 2253, truncated to cap - 1 bytes, NUL-terminated
 * ("" when it cannot be had); cap > 0. */
void tern__tls_subject(X509 *x, char *subject, size_t cap);

/* The peer of c as text, "-" when it cannot be had. */
void tern__tls_peer_text(const tern__conn *c, char *buf, size_t cap);

/* A server connection's first bytes. Invariants: sniffed once they have
 * been read (a client's connection starts sniffed: a server's bytes are
 * its own business); buf[off..len) are those the TLS library has not
 * taken yet; failure_logged: the connection's failed handshake has been
 * said (or there was none to say: a probe that sent nothing, plain HTTP). */
typedef struct tern__tls_head {
    char buf[4];
    uint8_t off, len;
    bool sniffed;
    bool failure_logged;
} tern__tls_head;

/* Before a server's first read, over its lower transport: is the client
 * speaking plain HTTP to the TLS port? Then its request is read and
 * dropped (so that the close is a FIN, not a reset that could destroy the
 * answer), a 400 saying why is written in the clear, and the connection
 * fails. buf (len bytes) is scratch room. Returns 1 to go on with TLS,
 * -EAGAIN while nothing has come, 0 for an end before any byte, or the
 * error that closes the connection. */
ssize_t tern__tls_sniff(tern__conn *c, const tern__transport *lower, tern__tls_head *h, char *buf,
                        size_t len);
/* Takes up to len of the bytes h keeps into buf: how many. */
size_t tern__tls_head_take(tern__tls_head *h, char *buf, size_t len);

/* The checks of tern_tls_new_opt's options every library makes: 0, or
 * -EINVAL (two passphrase sources, a bad version or verify mode, a client
 * CA with no verification or the reverse), -ENOENT (a passphrase file or
 * client CA file that cannot be read; logged). */
TERN_MUST_CHECK
int tern__tls_options_check(const tern_tls_options *opt);

#endif
