/* The seam between net/tls.c, which owns tern_tls and the whole public
 * TLS API (tern/tls.h: reference count, lock, certificate files,
 * reload-and-swap, argument checks), and the one TLS library file a build
 * has (net/tls_openssl.c or net/tls_rustls.c, TERN_TLS in CMakeLists.txt).
 *
 * A library file implements the few calls marked "the library's" below
 * (load one certificate and key, free it, its names, its per-tern_tls
 * state, its checks of the options, its name) and net/tls.h's attach
 * calls and transport; it uses the rest, which net/tls.c implements (the
 * options as given, the key a handshake picks, the plain-HTTP check).
 * No type of any TLS library appears here. Only net/tls.c and the library
 * files include this header (and tests/unit/test_tls_retire.c). */
#ifndef TERN_NET_TLS_LIB_H
#define TERN_NET_TLS_LIB_H

#include "net/tls.h"

/* ---- what net/tls.c keeps for the library ------------------------------ */

/* tern_tls_options as the tern_tls keeps them: copied by tern_tls_new_opt
 * (strings duplicated), checked, never changed afterwards, so a library
 * reads them without the lock. Invariants: at most one of passphrase and
 * passphrase_file; min_version is 12 or 13; client_ca_file is set exactly
 * when client_verify is not TERN_TLS_VERIFY_NONE. */
typedef struct tern__tls_conf {
    int (*passphrase)(char *buf, size_t size, void *user);
    void *passphrase_user;
    char *passphrase_file;
    int min_version;                 /* 12 or 13 */
    char *ciphers, *ciphersuites;    /* NULL: the library's own */
    int client_verify;               /* TERN_TLS_VERIFY_* */
    char *client_ca_file;
} tern__tls_conf;

const tern__tls_conf *tern__tls_conf_of(const tern_tls *tls);

/* The library's state for one tern_tls beyond its keys (rustls: its
 * server configurations, one per ALPN list), NULL until the library makes
 * it; read and set under tern__tls_lock; freed with the tern_tls by
 * tern__tls_lib_free. tern__tls_lock guards nothing else a library may
 * touch. */
void **tern__tls_lib_state(tern_tls *tls);
void tern__tls_lock(tern_tls *tls);
void tern__tls_unlock(tern_tls *tls);

/* ---- certificates ------------------------------------------------------ */

#define TERN__TLS_MAX_NAMES 32

/* A certificate's DNS names, lower-case: its subjectAltName entries, or
 * its CN when it has none; at most TERN__TLS_MAX_NAMES. */
typedef struct tern__tls_names {
    char *names[TERN__TLS_MAX_NAMES];
    int n;
} tern__tls_names;

/* Adds name (len bytes, lower-cased) to nm: nothing when full, empty or
 * out of memory. */
void tern__tls_names_add(tern__tls_names *nm, const char *name, size_t len);
void tern__tls_names_free(tern__tls_names *nm);
/* Does one of nm's names (maybe "*.example.com") cover name (len bytes)? */
bool tern__tls_names_match(const tern__tls_names *nm, const char *name, size_t len);

/* One certificate chain and its key, loaded by the library (OpenSSL: a
 * context; rustls: a certified key), with its names. The library's. */
typedef struct tern__tls_key tern__tls_key;

/* The library's: loads cert_file (PEM chain, leaf first) and key_file
 * with tls's options (tern__tls_conf_of). 0 with *out set, or the error
 * tern/tls.h lists for tern_tls_new_opt, logged at warn. Called without
 * the lock: tern_tls_reload loads while handshakes run. */
int tern__tls_key_load(tern_tls *tls, const char *cert_file, const char *key_file,
                       tern__tls_key **out);
/* The library's: frees k (NULL: nothing). Sessions that took a reference
 * of their own to what k holds keep it. */
void tern__tls_key_free(tern__tls_key *k);
/* The library's: k's DNS names, for SNI; valid as long as k. */
const tern__tls_names *tern__tls_key_names(const tern__tls_key *k);
/* The library's: frees what *tern__tls_lib_state held (NULL: nothing). */
void tern__tls_lib_free(void *state);
/* The library's: refuses the options it cannot honour (-ENOTSUP, logged
 * saying why and what to do instead); 0 otherwise, and for NULL opt.
 * Asked before net/tls.c's own checks. */
int tern__tls_lib_check(const tern_tls_options *opt);
/* The library's: its name and version, for tern_tls_library. */
const char *tern__tls_lib_name(void);

/* The certificates of a tern_tls come in generations, one key set each
 * (tern_tls_new_opt and tern_tls_add_cert fill the first, each reload
 * makes the next). A handshake picks a key under the lock and pins its
 * set until the library has taken what it needs of the key (OpenSSL: the
 * new session, or the switch of context SNI makes, took a reference to
 * the context; rustls: the call that ran its ClientHello callback
 * returned). A set a reload replaced is freed by
 * the last to unpin it. */
typedef struct tern__tls_keyset tern__tls_keyset;

/* The key of tls's present set for SNI name (len bytes; 0 or no match:
 * the default, the first certificate), with its set pinned in *pin until
 * tern__tls_unpin(tls, *pin) (NULL: nothing). Any thread. */
const tern__tls_key *tern__tls_pick(tern_tls *tls, const char *name, size_t len,
                                    tern__tls_keyset **pin);
void tern__tls_unpin(tern_tls *tls, tern__tls_keyset *pin);
/* The sets not freed: 1 plus the replaced ones still pinned (tests). */
int tern__tls_sets_alive(tern_tls *tls);

/* ---- the transport's helpers -------------------------------------------- */

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

/* The transport's `send_file` for TLS (no sendfile through a library):
 * reads a piece of up to 16 KiB at *off and gives it to c's transport's
 * send, moving *off by what it took. A send not finished is retried with
 * the same piece, as the transport contract asks: the offset has not
 * moved past it. */
ssize_t tern__tls_send_file(tern__conn *c, int fd, off_t *off, size_t len);

/* The transport's `unsent` (net/conn.h) for a TLS connection whose
 * library cannot say what records it holds: what its lower transport
 * holds (the io_uring stream's send in flight), 0 for plain TCP. */
size_t tern__tls_lower_unsent(const tern__conn *c, const tern__transport *lower);

/* ---- the client's side (the library's) --------------------------------- */

/* A client context (net/tls.h's tern__tls_client_new says what it holds),
 * made and freed by the library; net/tls.c shares one between the
 * connections that ask for the same settings. */
typedef struct tern__tls_lib_client tern__tls_lib_client;
tern__tls_lib_client *tern__tls_lib_client_new(const char *ca_file, bool insecure,
                                               const char *alpn);
void tern__tls_lib_client_free(tern__tls_lib_client *cl);
TERN_MUST_CHECK
int tern__tls_lib_client_attach(tern__conn *c, tern__tls_lib_client *cl, const char *name,
                                tern__tls_verify *verify_out);

#endif
