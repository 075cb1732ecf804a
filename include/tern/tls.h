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
 * tern closes and honoured as the end of the stream. A connection idle
 * for 25 to 50 ms releases its TLS record buffers.
 *
 * The handshake counts against the server's head_timeout_ms: a client
 * that does not finish it, and send a request head, in that time is
 * closed. A failed handshake is logged once at TERN_LOG_DEBUG with the
 * peer's address and OpenSSL's reason. A client that sends plain HTTP
 * (its first bytes a method such as "GET " rather than a TLS record) is
 * answered "400 Bad Request" in the clear, its body saying the port
 * expects TLS, and closed. Static files go out read-and-encrypt (no
 * sendfile over TLS). A handler learns that its request came over TLS,
 * and the name the client asked for, with tern_http_is_tls and
 * tern_http_sni (tern/http.h).
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

/* Client certificates (tern_tls_options.client_verify). */
enum {
    TERN_TLS_VERIFY_NONE = 0,      /* none asked for (the default) */
    TERN_TLS_VERIFY_OPTIONAL = 1,  /* asked for; a client without one, or with one that does not
                                      verify, is still served: the handler decides
                                      (tern_http_peer_cert) */
    TERN_TLS_VERIFY_REQUIRE = 2,   /* the handshake fails without one that verifies */
};

/* A tern_tls's options; zero for every field is the default. The
 * passphrase part: how a tern_tls gets the passphrase of encrypted
 * private keys. tern never asks on a terminal: with neither source, an
 * encrypted key is refused (-ENOKEY). Give one source at most; it serves
 * every key of the tern_tls (tern_tls_add_cert, tern_tls_reload too).
 * The protocol part applies to every certificate of the tern_tls, and to
 * every reload. */
typedef struct tern_tls_options {
    /* Writes the passphrase into buf (at most size bytes, no terminating
     * NUL needed) and returns its length; 0 or less: none. Called only
     * when a key is encrypted, on the thread loading it (tern_tls_new_opt,
     * tern_tls_add_cert, tern_tls_reload); user is passphrase_user. */
    int (*passphrase)(char *buf, size_t size, void *user);
    void *passphrase_user;
    /* Or a file whose first line is the passphrase (a trailing CR/LF is
     * not part of it). Read again at each load, so a reload after a
     * renewal takes a changed passphrase; tern keeps no copy. Keep it
     * private (mode 0600): it is the key's secret. */
    const char *passphrase_file;

    /* The oldest protocol served: 0 or 12 for TLS 1.2 (the default), 13
     * for TLS 1.3 only (a TLS 1.2 client gets a protocol_version alert). */
    int min_version;
    /* OpenSSL cipher strings: ciphers for TLS 1.2 ("ECDHE+AESGCM"),
     * ciphersuites for TLS 1.3 ("TLS_AES_256_GCM_SHA384:..."). The server's
     * order is chosen. NULL keeps OpenSSL's defaults, except that TLS 1.3
     * puts AES-128-GCM first (TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:
     * TLS_CHACHA20_POLY1305_SHA256): as fast as AES-256-GCM on small
     * records, faster on full ones. A string OpenSSL takes nothing from is
     * -EINVAL. */
    const char *ciphers;
    const char *ciphersuites;
    /* Client certificates: client_verify is one of TERN_TLS_VERIFY_*,
     * client_ca_file (PEM) the CAs they are verified against, and whose
     * names are sent to the client as acceptable. Both, or neither. The
     * result is on each request: tern_http_peer_cert (tern/http.h). */
    int client_verify;
    const char *client_ca_file;
} tern_tls_options;

/* Loads the default certificate chain (PEM, leaf first) and its private
 * key (PEM, maybe encrypted: see tern_tls_options; opt may be NULL).
 * Returns 0, or a negative errno with *out NULL; tern's log says why at
 * warn:
 *   -EINVAL  NULL out, cert or key; both passphrase sources given;
 *            min_version not 0, 12 or 13; client_verify not one of
 *            TERN_TLS_VERIFY_* or without client_ca_file (or the other
 *            way round); ciphers or ciphersuites OpenSSL takes nothing of
 *   -ENOENT  ... or client_ca_file cannot be read (or holds no CA)
 *   -ENOENT  a file cannot be read (certificate, key, passphrase file)
 *   -ENOKEY  the key is encrypted and no passphrase was given (log: "the
 *            key in FILE is encrypted: give its passphrase (...)")
 *   -EKEYREJECTED  the passphrase given is wrong (log: "wrong passphrase
 *            for the key in FILE")
 *   -EPROTO  OpenSSL refuses the contents (not PEM, the key does not
 *            match the certificate) */
TERN_MUST_CHECK
int tern_tls_new_opt(tern_tls **out, const char *cert_file, const char *key_file,
                     const tern_tls_options *opt);
/* tern_tls_new_opt with no options: an encrypted key gets -ENOKEY. */
TERN_MUST_CHECK
int tern_tls_new(tern_tls **out, const char *cert_file, const char *key_file);
/* Adds a certificate chosen by SNI, its key decrypted with the passphrase
 * source tls was made with. Errors as tern_tls_new_opt. Before the
 * tern_tls is used by a listener. */
TERN_MUST_CHECK
int tern_tls_add_cert(tern_tls *tls, const char *cert_file, const char *key_file);
/* Reads every certificate and key again (after a renewal; tern serve does
 * it on SIGHUP), encrypted keys with the passphrase source tls was made
 * with (never a prompt: a loop calling this does not block on a
 * terminal). New handshakes use the new ones; connections already open
 * keep theirs. On an error (as tern_tls_new_opt's) nothing changes and
 * the error is returned. */
TERN_MUST_CHECK
int tern_tls_reload(tern_tls *tls);
/* Drops the caller's reference; listeners hold their own. */
void tern_tls_free(tern_tls *tls);
/* The TLS library this build uses, with its version, for logs and
 * --help: "OpenSSL 3.0.17" or "rustls-ffi/0.15.7/rustls/0.23.46/ring".
 * A string of the library's, valid for the program's life. */
const char *tern_tls_library(void);

/* Listens for TLS connections: like tern_listen, with tls's certificates.
 * The server takes a reference to tls. */
TERN_MUST_CHECK
int tern_listen_tls(tern_server *srv, const char *host, int port, tern_tls *tls,
                    const tern_listen_options *opt);
/* Serves a socket that is already listening (TCP or Unix, inherited from
 * systemd's socket activation, say): with tls, HTTPS on it. The server
 * listens on a duplicate of fd, and so does every loop of tern_run: the
 * caller keeps fd (close it when you like). Returns 0, -EINVAL (NULL srv,
 * a host handle, fd < 0 or not a listening stream socket of those
 * families, bad options), -EBADF, -ENOTSOCK, -ENOSPC (the listener
 * limit, or shutting down), -EMFILE, -ENOMEM. */
TERN_MUST_CHECK
int tern_listen_fd(tern_server *srv, int fd, tern_tls *tls, const tern_listen_options *opt);
/* The port the first TLS listener got (tern_server_port is the first
 * plain one's). -ENOENT when there is no TLS listener, -EINVAL for a NULL
 * srv. */
int tern_server_tls_port(const tern_server *srv);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
