/* tern TLS (HTTPS, WSS) with OpenSSL 3: certificates for tern_listen_tls.
 *
 * A tern_tls holds one or more certificate chains with their keys. The
 * first is the default; the others are chosen by the server name the
 * client asks for (SNI), matched against each certificate's DNS names
 * (subjectAltName, or the common name when it has none; "*.example.com"
 * matches one label). TLS 1.2 and 1.3 only; ALPN "http/1.1" (a client
 * offering only other protocols, such as just "h2", gets a
 * no_application_protocol alert); renegotiation refused; session
 * resumption with tickets (TLS 1.3) and session IDs; close_notify sent when
 * tern closes and honoured as the end of the stream. Idle connections
 * release their TLS buffers (SSL_MODE_RELEASE_BUFFERS).
 *
 * The handshake counts against the server's head_timeout_ms: a client
 * that does not finish it, and send a request head, in that time is
 * closed. Static files go out read-and-encrypt (no sendfile over TLS).
 *
 * One tern_tls may serve any number of listeners, servers and threads: it
 * is read-only while serving except for tern_tls_reload, which any thread
 * may call. */
#ifndef TERN_TLS_H
#define TERN_TLS_H

#include "tern/net.h"

#ifdef __cplusplus
extern "C" {
#endif

/* libtern.so exports what this header declares, and nothing else. */
#pragma GCC visibility push(default)

typedef struct tern_tls tern_tls;
typedef struct tern_server tern_server;

/* Loads the default certificate chain (PEM, leaf first) and its private
 * key (PEM). Returns 0, -EINVAL for NULL arguments, -ENOENT when a file
 * cannot be read, -EPROTO when OpenSSL refuses the contents (not PEM, the
 * key does not match the certificate); tern's log says why at warn. */
int tern_tls_new(tern_tls **out, const char *cert_file, const char *key_file);
/* Adds a certificate chosen by SNI. Errors as tern_tls_new. Before the
 * tern_tls is used by a listener. */
int tern_tls_add_cert(tern_tls *tls, const char *cert_file, const char *key_file);
/* Reads every certificate and key again (after a renewal; tern serve does
 * it on SIGHUP). New handshakes use the new ones; connections already open
 * keep theirs. On an error nothing changes and the error is returned. */
int tern_tls_reload(tern_tls *tls);
/* Drops the caller's reference; listeners hold their own. */
void tern_tls_free(tern_tls *tls);

/* Listens for TLS connections: like tern_listen, with tls's certificates.
 * The server takes a reference to tls. */
int tern_listen_tls(tern_server *srv, const char *host, int port, tern_tls *tls,
                    const tern_listen_options *opt);
/* The port the first TLS listener got (tern_server_port is the first
 * plain one's). -ENOENT when there is no TLS listener, -EINVAL for a NULL
 * srv. */
int tern_server_tls_port(const tern_server *srv);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
