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

#endif
