/* X.509 reading, through OpenSSL's libcrypto, for the TLS library files
 * only (net/tls_openssl.c, net/tls_rustls.c: rustls parses no
 * certificate for us): a certificate's names for SNI and a peer
 * certificate's subject. Nothing else includes it. */
#ifndef TERN_NET_TLS_X509_H
#define TERN_NET_TLS_X509_H

#include <openssl/x509.h>

#include "net/tls_lib.h"

/* Replaces nm's names by x's (none without memory). */
void tern__tls_x509_names(tern__tls_names *nm, X509 *x);

/* x's subject, RFC 2253, truncated to cap - 1 bytes, NUL-terminated
 * ("" when it cannot be had); cap > 0. */
void tern__tls_x509_subject(X509 *x, char *subject, size_t cap);

#endif
