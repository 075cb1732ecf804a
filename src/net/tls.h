/* Private side of TLS: what the protocols above net need of it, in terms
 * of no TLS library. One file per library implements it (chosen at build
 * time, TERN_TLS in CMakeLists.txt): net/tls_openssl.c or
 * net/tls_rustls.c, behind net/tls_lib.h; tern_tls itself is net/tls.c's.
 * No type or error code of the library appears here, so http and ws
 * compile the same against any of them. */
#ifndef TERN_NET_TLS_H
#define TERN_NET_TLS_H

#include "net/conn.h"
#include "tern/tls.h"

/* What became of the peer's certificate chain, in tern's words: each
 * library maps its own codes onto these. TERN__TLS_VERIFY_OK is 0. */
typedef enum tern__tls_verify {
    TERN__TLS_VERIFY_OK = 0,
    TERN__TLS_VERIFY_UNTRUSTED,      /* no chain to a trusted CA (self-signed, unknown issuer) */
    TERN__TLS_VERIFY_NAME_MISMATCH,  /* the certificate does not carry the name or address asked */
    TERN__TLS_VERIFY_EXPIRED,
    TERN__TLS_VERIFY_NOT_YET_VALID,
    TERN__TLS_VERIFY_OTHER,          /* any other failure (bad signature, purpose, ...) */
} tern__tls_verify;

/* tern's words for a verification result. */
const char *tern__tls_verify_string(tern__tls_verify v);

/* ALPN lists are given by the protocol above in the wire format
 * (RFC 7301 §3.1: each name preceded by its length byte), as a C string:
 * names are never empty, so no length byte is 0. The string must outlive
 * every connection it is given to (a literal). */

/* Puts a TLS server session on a started connection (its accepted
 * socket), with tls's default certificate until SNI picks another. alpn
 * is the protocols the connection speaks, most preferred first: a client
 * that offers ALPN but none of them is refused with an alert. 0 or
 * -ENOMEM; the connection owns the session from then on. */
TERN_MUST_CHECK
int tern__tls_attach(tern__conn *c, tern_tls *tls, const char *alpn);
/* Takes a reference (a listener's); tern_tls_free drops one. */
void tern__tls_ref(tern_tls *tls);
/* Is c's transport TLS (a server's or a client's session)? */
bool tern__tls_is(const tern__conn *c);
/* Did c's handshake choose proto (a name, "h2") by ALPN? false when it
 * chose another, none, or c is not TLS. */
bool tern__tls_alpn_is(const tern__conn *c, const char *proto);
/* The certificate the peer of c sent: 0 when none (or c is not TLS); 1
 * with *verify its chain's result and, when cap > 0, its subject (RFC
 * 2253, truncated, NUL-terminated) in subject ("" when none). */
TERN_MUST_CHECK
int tern__tls_peer_cert(const tern__conn *c, char *subject, size_t cap, tern__tls_verify *verify);

/* The client's side (wss). A context for outbound connections: TLS 1.2+,
 * the ALPN list alpn, and unless insecure, verification against ca_file
 * (PEM) or the system's CAs. NULL on error (logged at warn). Sessions
 * made from it keep what they need of it: it may be freed before them.
 * Shared: while one is held, another asked with the same settings is the
 * same context (loading the CA store is the costly part: see tls.c), and
 * free releases it; a context asked after the last free reads the CA file
 * afresh. Any thread. */
typedef struct tern__tls_client tern__tls_client;
tern__tls_client *tern__tls_client_new(const char *ca_file, bool insecure, const char *alpn);
void tern__tls_client_free(tern__tls_client *ctx);
/* Puts a TLS client session on an outbound connection (after
 * tern__conn_connect): name is sent as SNI (unless an address) and, when
 * the context verifies, checked against the certificate. If verification
 * fails during the handshake, the connection closes with -EKEYREJECTED
 * and *verify_out holds the reason. 0 or -ENOMEM. */
TERN_MUST_CHECK
int tern__tls_client_attach(tern__conn *c, tern__tls_client *ctx, const char *name,
                            tern__tls_verify *verify_out);

#endif
