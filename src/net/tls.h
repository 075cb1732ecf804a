/* Private side of TLS: what the HTTP server's accept path needs. */
#ifndef TERN_NET_TLS_H
#define TERN_NET_TLS_H

#include "net/conn.h"
#include "tern/tls.h"

/* Puts a TLS server session on a started connection (its accepted
 * socket), with tls's default certificate until SNI picks another.
 * 0 or -ENOMEM; the connection owns the session from then on. */
int tern__tls_attach(tern__conn *c, tern_tls *tls);
/* Takes a reference (a listener's); tern_tls_free drops one. */
void tern__tls_ref(tern_tls *tls);
/* Is c's transport TLS (a server's or a client's session)? */
bool tern__tls_is(const tern__conn *c);
/* The certificate the peer of c sent: 0 when none (or c is not TLS); 1
 * with *verify its X509_V_* result and, when cap > 0, its subject (RFC
 * 2253, truncated, NUL-terminated) in subject ("" when none). */
int tern__tls_peer_cert(const tern__conn *c, char *subject, size_t cap, long *verify);

/* The client's side (wss). A context for outbound connections: TLS 1.2+,
 * ALPN http/1.1, and unless insecure, verification against ca_file (PEM)
 * or the system's CAs. NULL on error (logged at warn). One per client
 * connection here; SSL sessions hold their own reference. */
typedef struct ssl_ctx_st SSL_CTX;
SSL_CTX *tern__tls_client_ctx(const char *ca_file, bool insecure);
void tern__tls_client_ctx_free(SSL_CTX *ctx);
/* Puts a TLS client session on an outbound connection (after
 * tern__conn_connect): name is sent as SNI (unless an address) and, when
 * the context verifies, checked against the certificate. If verification
 * fails during the handshake, the connection closes with -EKEYREJECTED
 * and *verify_out holds the X509_V_ERR_* reason. 0 or -ENOMEM. */
int tern__tls_client_attach(tern__conn *c, SSL_CTX *ctx, const char *name, long *verify_out);
/* OpenSSL's words for a verification result. */
const char *tern__tls_verify_string(long result);

#endif
