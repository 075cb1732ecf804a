/* net/tls.h and net/tls_lib.h on OpenSSL: a certificate's context (one
 * SSL_CTX per certificate and key, which net/tls.c keeps in its key
 * sets), the TLS transport, and the client's contexts. Nothing of OpenSSL
 * leaves this file (and net/crypto_openssl.c, net/tls_x509.c):
 * verification results are mapped to tern__tls_verify, contexts are
 * opaque.
 *
 * OpenSSL's records go through a BIO of ours (lower_bio below) to the
 * transport the connection had before TLS came on it: plain TCP on epoll,
 * the back end's stream on io_uring (its multishot receive and one send
 * in flight, no recv or send system call per record). The loop needs two
 * things from TLS that plain TCP does not:
 * - a read may leave decrypted bytes inside OpenSSL (or the lower
 *   transport may still hold received ones) when no event will come for
 *   them; `pending` reports them and net re-feeds the connection at the
 *   batch end;
 * - a read may have to write (handshake messages) and a write may have to
 *   read (a handshake not yet finished): the transport tells net, which
 *   waits for TERN__IO_OUT, or retries the write after the next read.
 *
 * A write that OpenSSL could not finish must be retried with the same
 * bytes: net's backlog always restarts at the first byte not taken, and
 * SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER allows that backlog to have moved.
 *
 * Record buffers are kept while a connection is in use and freed once it
 * has been idle a while (tls_loop below), not after every record. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>
#include <arpa/inet.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "loop/check.h"
#include "loop/log.h"
#include "net/tls_x509.h"

/* ---- certificates ------------------------------------------------------ */

/* One certificate chain and key as the SSL_CTX made of them, set up as
 * every other (versions, ALPN, the SNI callback, a PEM passphrase callback
 * that never prompts). names are its DNS names (lower-case), for SNI. A
 * handshake takes its own reference to the context it uses (SSL_new,
 * SSL_set_SSL_CTX), so a context a reload replaced lives on with the
 * connections that use it. */
struct tern__tls_key {
    SSL_CTX *ctx;
    tern__tls_names names;
};

static int tls_err(const char *what, const char *file) {
    unsigned long e = ERR_get_error();
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    tern__log(TERN_LOG_WARN, TERN__LOG_LISTEN, "tls: %s %s: %s", what, file ? file : "", buf);
    ERR_clear_error();
    return -EPROTO;
}

static int sni_cb(SSL *ssl, int *alert, void *arg);

/* Is the protocol name p (n bytes) in the wire-format list in (inlen)? */
static const unsigned char *alpn_find(const unsigned char *in, unsigned int inlen,
                                      const unsigned char *p, unsigned int n) {
    for (unsigned int i = 0; i < inlen;) {
        unsigned int len = in[i];
        if (i + 1 + len > inlen)
            break;
        if (len == n && memcmp(in + i + 1, p, n) == 0)
            return in + i + 1;
        i += 1 + len;
    }
    return NULL;
}

static const char *conn_alpn(SSL *ssl);

/* ALPN: the first of the connection's protocols (given by the protocol
 * above, its preference first) that the client offers. A client that
 * offers protocols but none of them is refused with an alert rather than
 * left to guess. */
static int alpn_cb(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                   const unsigned char *in, unsigned int inlen, void *arg) {
    (void)arg;
    const unsigned char *ours = (const unsigned char *)conn_alpn(ssl);
    size_t ourlen = strlen((const char *)ours);
    for (size_t i = 0; i < ourlen; i += 1 + (size_t)ours[i]) {
        const unsigned char *hit = alpn_find(in, inlen, ours + i + 1, ours[i]);
        if (hit) {
            *out = hit;
            *outlen = ours[i];
            return SSL_TLSEXT_ERR_OK;
        }
    }
    return SSL_TLSEXT_ERR_ALERT_FATAL;
}

/* ---- passphrases of encrypted keys ---------------------------------------
 *
 * Without a callback of its own, OpenSSL asks for a key's passphrase on
 * the terminal: tern_tls_new would block (and a reload on SIGHUP would
 * freeze a loop), or, with no terminal, fail with a "UI routines" error
 * that says nothing about the key. So every context gets pem_pass_cb,
 * which answers from the tern_tls's own source or not at all, and records
 * what happened so that a failed load can say why. */

/* What the PEM callback saw while one key loaded. */
typedef struct pass_state {
    const tern__tls_conf *conf;
    bool asked;     /* OpenSSL wanted a passphrase: the key is encrypted */
    bool given;     /* and one was supplied */
    int file_err;   /* the passphrase file could not be read (-errno) */
} pass_state;

/* The first line of the passphrase file into buf (at most size bytes,
 * OpenSSL's buffer, which it cleanses): its length, or -errno. Read at
 * each load, not kept: a renewal may change it, and no copy of the secret
 * stays in tern's memory. */
static int read_pass_file(const char *path, char *buf, int size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int len = 0;
    while (len < size) {
        ssize_t r = read(fd, buf + len, (size_t)(size - len));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int err = -errno;
            close(fd);
            return err;
        }
        if (r == 0)
            break;
        len += (int)r;
    }
    close(fd);
    char *nl = memchr(buf, '\n', (size_t)len);
    if (nl)
        len = (int)(nl - buf);
    if (len > 0 && buf[len - 1] == '\r')
        len--;
    return len;
}

/* OpenSSL's pem_password_cb. Returns the passphrase's length, or -1 for
 * none (0 would have OpenSSL try an empty passphrase). u is NULL outside
 * a load: nothing is ever asked for then. */
static int pem_pass_cb(char *buf, int size, int rwflag, void *u) {
    (void)rwflag;
    pass_state *ps = u;
    if (ps == NULL || size <= 0)
        return -1;
    ps->asked = true;
    const tern__tls_conf *conf = ps->conf;
    int n = -1;
    if (conf->passphrase) {
        n = conf->passphrase(buf, (size_t)size, conf->passphrase_user);
        if (n > size)
            n = -1;   /* it claims more than the buffer holds: not trusted */
    } else if (conf->passphrase_file) {
        n = read_pass_file(conf->passphrase_file, buf, size);
        if (n < 0) {
            ps->file_err = n;
            n = -1;
        }
    }
    if (n <= 0)
        return -1;
    ps->given = true;
    return n;
}

/* The private key in key_file into ctx, never prompting. Returns 0, or the error
 * (logged): -ENOKEY for an encrypted key with no passphrase, -EKEYREJECTED
 * for a wrong one, -ENOENT for an unreadable passphrase file, -EPROTO for
 * anything else OpenSSL refuses. */
static int key_load(const tern__tls_conf *conf, const char *key_file, SSL_CTX *ctx) {
    pass_state ps = {.conf = conf};
    SSL_CTX_set_default_passwd_cb_userdata(ctx, &ps);
    int ok = SSL_CTX_use_PrivateKey_file(ctx, key_file, SSL_FILETYPE_PEM);
    SSL_CTX_set_default_passwd_cb_userdata(ctx, NULL);   /* ps is gone after this call */
    if (ok == 1)
        return 0;
    if (!ps.asked)
        return tls_err("key", key_file);
    ERR_clear_error();
    if (ps.file_err) {
        tern__log(TERN_LOG_WARN, TERN__LOG_LISTEN,
                  "tls: the key in %s is encrypted and its passphrase file %s cannot be read: %s",
                  key_file, conf->passphrase_file, strerror(-ps.file_err));
        return -ENOENT;
    }
    if (!ps.given) {
        tern__log(TERN_LOG_WARN, TERN__LOG_LISTEN,
                  "tls: the key in %s is encrypted: give its passphrase "
                  "(tern_tls_options.passphrase or .passphrase_file; "
                  "tern serve --tls-key-passphrase-file)",
                  key_file);
        return -ENOKEY;
    }
    tern__log(TERN_LOG_WARN, TERN__LOG_LISTEN, "tls: wrong passphrase for the key in %s",
              key_file);
    return -EKEYREJECTED;
}

/* TERN_TLS_VERIFY_OPTIONAL: the chain is verified and the result kept
 * for the request (SSL_get_verify_result), but a failure does not end
 * the handshake. */
static int verify_keep_going(int ok, X509_STORE_CTX *store) {
    (void)ok;
    (void)store;
    return 1;
}

/* The protocol options of conf on ctx: versions, ciphers, client
 * certificates. 0, -EINVAL (a cipher string OpenSSL takes nothing of),
 * -ENOENT (the CA file has no CA OpenSSL can read); logged at warn. */
static int proto_setup(const tern__tls_conf *conf, SSL_CTX *ctx) {
    SSL_CTX_set_min_proto_version(ctx, conf->min_version == 13 ? TLS1_3_VERSION : TLS1_2_VERSION);
    if (conf->ciphers && SSL_CTX_set_cipher_list(ctx, conf->ciphers) != 1) {
        ERR_clear_error();
        tern__log(TERN_LOG_WARN, TERN__LOG_LISTEN, "tls: no cipher in \"%s\"", conf->ciphers);
        return -EINVAL;
    }
    /* TLS 1.3's suites, when not given, in the order a server on AES-NI
     * wants (the server's order is chosen: SSL_OP_CIPHER_SERVER_PREFERENCE):
     * AES-128-GCM first, as fast as AES-256-GCM for small records and 5 %
     * faster for full ones, ChaCha20 last at 1.3-1.6x their cost
     * (bench/micro/tls_record). OpenSSL's own order puts AES-256-GCM first. */
    static const char suites[] =
        "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256";
    if (conf->ciphersuites == NULL && SSL_CTX_set_ciphersuites(ctx, suites) != 1)
        return tls_err("ciphersuites", NULL);
    if (conf->ciphersuites && SSL_CTX_set_ciphersuites(ctx, conf->ciphersuites) != 1) {
        ERR_clear_error();
        tern__log(TERN_LOG_WARN, TERN__LOG_LISTEN, "tls: no TLS 1.3 ciphersuite in \"%s\"",
                  conf->ciphersuites);
        return -EINVAL;
    }
    if (conf->client_verify == TERN_TLS_VERIFY_NONE)
        return 0;
    STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(conf->client_ca_file);
    if (names == NULL || SSL_CTX_load_verify_locations(ctx, conf->client_ca_file, NULL) != 1) {
        sk_X509_NAME_pop_free(names, X509_NAME_free);
        ERR_clear_error();
        tern__log(TERN_LOG_WARN, TERN__LOG_LISTEN, "tls: no CA certificate in %s",
                  conf->client_ca_file);
        return -ENOENT;
    }
    SSL_CTX_set_client_CA_list(ctx, names);   /* takes names */
    if (conf->client_verify == TERN_TLS_VERIFY_REQUIRE)
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
    else
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, verify_keep_going);
    return 0;
}

/* Makes the context of one certificate. */
int tern__tls_key_load(tern_tls *tls, const char *cert_file, const char *key_file,
                       tern__tls_key **out) {
    if (access(cert_file, R_OK) < 0 || access(key_file, R_OK) < 0) {
        tern__log(TERN_LOG_WARN, TERN__LOG_LISTEN, "tls: cannot read %s or %s", cert_file,
                  key_file);
        return -ENOENT;
    }
    const tern__tls_conf *conf = tern__tls_conf_of(tls);
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (ctx == NULL)
        return tls_err("context", NULL);
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    /* A TCP end without close_notify is taken as the end of the stream,
     * as on plain TCP (HTTP's own framing tells a cut body). */
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE |
                                 SSL_OP_NO_COMPRESSION | SSL_OP_IGNORE_UNEXPECTED_EOF);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    /* Read-ahead: one read() takes every record the socket holds, not a
     * record header and then its body (three reads per small message
     * without it, counting the one that finds the socket empty). */
    SSL_CTX_set_read_ahead(ctx, 1);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_SERVER);
    SSL_CTX_set_session_id_context(ctx, (const unsigned char *)"tern", 4);
    SSL_CTX_set_alpn_select_cb(ctx, alpn_cb, NULL);
    SSL_CTX_set_tlsext_servername_callback(ctx, sni_cb);
    SSL_CTX_set_tlsext_servername_arg(ctx, tls);
    /* Before any PEM is read: the certificate file is read with it too,
     * and with none OpenSSL would prompt on the terminal. */
    SSL_CTX_set_default_passwd_cb(ctx, pem_pass_cb);
    SSL_CTX_set_default_passwd_cb_userdata(ctx, NULL);
    int perr = proto_setup(conf, ctx);
    if (perr < 0) {
        SSL_CTX_free(ctx);
        return perr;
    }
    if (SSL_CTX_use_certificate_chain_file(ctx, cert_file) != 1) {
        SSL_CTX_free(ctx);
        return tls_err("certificate", cert_file);
    }
    int err = key_load(conf, key_file, ctx);
    if (err == 0 && SSL_CTX_check_private_key(ctx) != 1)
        err = tls_err("key", key_file);
    tern__tls_key *k = err ? NULL : calloc(1, sizeof(*k));
    if (k == NULL) {
        SSL_CTX_free(ctx);
        return err ? err : -ENOMEM;
    }
    tern__tls_x509_names(&k->names, SSL_CTX_get0_certificate(ctx));
    k->ctx = ctx;
    *out = k;
    return 0;
}

void tern__tls_key_free(tern__tls_key *k) {
    if (k == NULL)
        return;
    SSL_CTX_free(k->ctx);   /* sessions made from it hold their own reference */
    tern__tls_names_free(&k->names);
    free(k);
}

const tern__tls_names *tern__tls_key_names(const tern__tls_key *k) { return &k->names; }

/* OpenSSL keeps nothing per tern_tls beyond its keys' contexts. */
void tern__tls_lib_free(void *state) { (void)state; }

/* OpenSSL honours every option of tern_tls_options. */
int tern__tls_lib_check(const tern_tls_options *opt) {
    (void)opt;
    return 0;
}

/* SNI: switch the handshake to the certificate that names the host asked
 * for; the default one serves unknown names and clients that send none. */
static int sni_cb(SSL *ssl, int *alert, void *arg) {
    tern_tls *tls = arg;
    const char *name = SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name);
    if (name == NULL)
        return SSL_TLSEXT_ERR_OK;
    tern__tls_keyset *pin = NULL;
    const tern__tls_key *k = tern__tls_pick(tls, name, strlen(name), &pin);
    SSL_set_SSL_CTX(ssl, k->ctx);   /* takes its own reference: the set may go */
    tern__tls_unpin(tls, pin);
    return SSL_TLSEXT_ERR_OK;
}

/* ---- the transport ---------------------------------------------------- */

/* verify_out, for a client's connection while its handshake runs, is
 * where a failed handshake leaves the certificate verification's result
 * (the connection's own struct outlives the transport's release).
 */
typedef struct tls_loop tls_loop;

/* warm_*: on its loop's list of sessions that may hold record buffers
 * while tl is set; used is the tl->gen of its last read or write.
 * lower is the transport TLS came over; conn, the connection as of the
 * transport call under way (the struct moves on an upgrade, so lower_bio
 * learns it anew at each call); io_err, the lower transport's error (a
 * negative errno) that made the last call fail; eof, that its read
 * returned the end. h: the first bytes, read to tell plain HTTP from TLS. */
typedef struct tls_conn {
    tern__transport base;
    SSL *ssl;
    tern__transport *lower;
    tern__conn *conn;
    tls_loop *tl;
    struct tls_conn *warm_next, *warm_prev;
    uint32_t used;
    int io_err;
    const char *alpn;   /* a server's protocols (net/tls.h's format) */
    tern__tls_verify *verify_out;
    tern__tls_head h;
    bool eof;
} tls_conn;

/* ---- the BIO over the lower transport -------------------------------------
 *
 * OpenSSL reads and writes records through a BIO; this one calls the
 * connection's lower transport, so TLS works over whatever net moves the
 * bytes with. Its contract is the non-blocking socket's: a read of
 * nothing yet or a write the transport cannot take now says "retry"; a
 * read of 0 is the end (BIO_CTRL_EOF then says so, which is how OpenSSL
 * tells an end from an error); an error keeps the transport's errno in
 * io_err. A write the lower transport takes only in part is no harm:
 * OpenSSL keeps the rest of its record and writes it first next time. */

static int lower_bio_read(BIO *b, char *buf, int len) {
    tls_conn *t = BIO_get_data(b);
    BIO_clear_retry_flags(b);
    if (len <= 0)
        return 0;
    int n = 0;
    if (t->h.off < t->h.len) {
        n = (int)tern__tls_head_take(&t->h, buf, (size_t)len);
        if (n == len)
            return n;
    }
    ssize_t r = t->lower->ops->recv(t->conn, buf + n, (size_t)(len - n));
    if (r > 0)
        return n + (int)r;
    if (n > 0)
        return n;   /* the end or the error shows at the next read */
    if (r == -EAGAIN) {
        BIO_set_retry_read(b);
        return -1;
    }
    if (r == 0) {
        t->eof = true;
        return 0;
    }
    t->io_err = (int)r;
    return -1;
}

static int lower_bio_write(BIO *b, const char *buf, int len) {
    tls_conn *t = BIO_get_data(b);
    BIO_clear_retry_flags(b);
    if (len <= 0)
        return 0;
    struct iovec iov = {(void *)buf, (size_t)len};
    ssize_t w = t->lower->ops->send(t->conn, &iov, 1);
    if (w > 0)
        return (int)w;
    if (w == 0 || w == -EAGAIN) {
        BIO_set_retry_write(b);
        return -1;
    }
    t->io_err = (int)w;
    return -1;
}

static long lower_bio_ctrl(BIO *b, int cmd, long num, void *ptr) {
    (void)num;
    (void)ptr;
    switch (cmd) {
    case BIO_CTRL_FLUSH:
        return 1;   /* every write went to the transport already */
    case BIO_CTRL_EOF:
        return ((tls_conn *)BIO_get_data(b))->eof;
    default:
        return 0;
    }
}

static BIO_METHOD *lower_bio_method;
static pthread_once_t lower_bio_once = PTHREAD_ONCE_INIT;

static void lower_bio_init(void) {
    int index = BIO_get_new_index();
    BIO_METHOD *m = index < 0 ? NULL : BIO_meth_new(index | BIO_TYPE_SOURCE_SINK, "tern transport");
    if (m && BIO_meth_set_read(m, lower_bio_read) == 1 &&
        BIO_meth_set_write(m, lower_bio_write) == 1 && BIO_meth_set_ctrl(m, lower_bio_ctrl) == 1) {
        lower_bio_method = m;
        return;
    }
    BIO_meth_free(m);
}

/* Puts t's session on a BIO over c's present transport, which becomes
 * t's lower one. false without memory. */
static bool lower_attach(tern__conn *c, tls_conn *t) {
    pthread_once(&lower_bio_once, lower_bio_init);
    BIO *b = lower_bio_method ? BIO_new(lower_bio_method) : NULL;
    if (b == NULL)
        return false;
    BIO_set_data(b, t);
    BIO_set_init(b, 1);
    SSL_set_bio(t->ssl, b, b);   /* the session takes the one reference */
    t->lower = c->tp;
    t->conn = c;
    return true;
}

/* ---- record buffers: kept while used, freed when idle --------------------
 *
 * A session takes a read and a write buffer (about 17 KB each) the first
 * time it reads or writes. SSL_MODE_RELEASE_BUFFERS would free them each
 * time they are empty, that is after every record, and take them again for
 * the next one: 10 % of a 64 B echo's cost in OpenSSL
 * (bench/micro/tls_record). Instead each loop lists its sessions that may
 * hold buffers, and a sweep every TLS_IDLE_MS frees the buffers of those
 * not used since the sweep before (SSL_free_buffers; it refuses, and the
 * session stays listed, while a buffer holds bytes): a connection idle
 * for 25 to 50 ms holds no buffers, as before, and a busy one keeps its
 * own. The period is short because of connections opened in a burst: each
 * holds its buffers for its first 25-50 ms, and the heap keeps the peak;
 * at 100 ms, 5 000 WSS connections opened at once cost 6 % more RSS each
 * than with SSL_MODE_RELEASE_BUFFERS (bench/run idle), at 25 ms the same.
 * A sweep walks only the listed sessions. The sweep's timer runs only
 * while the list is not empty, so an idle loop is not woken. Should the
 * list or the timer not be had (no memory), the session falls back to
 * SSL_MODE_RELEASE_BUFFERS. */
#define TLS_IDLE_MS 25

/* TLS's loop slot (its tls_loop), keyed at first use. */
static int tls_slot(void) {
    static _Atomic int key;
    return tern__loop_slot_key(&key);
}

/* A loop's TLS slot block. Invariants: warm lists the sessions of
 * the loop that used a buffer since their last sweep (each with tl set);
 * timer runs exactly while warm is not empty; gen counts the sweeps. */
struct tls_loop {
    tls_conn *warm;
    tern_timer *timer;
    uint32_t gen;
};

static void warm_unlink(tls_conn *t) {
    tls_loop *tl = t->tl;
    if (t->warm_prev)
        t->warm_prev->warm_next = t->warm_next;
    else
        tl->warm = t->warm_next;
    if (t->warm_next)
        t->warm_next->warm_prev = t->warm_prev;
    t->warm_next = t->warm_prev = NULL;
    t->tl = NULL;
    if (tl->warm == NULL && tl->timer) {
        tern_timer_stop(tl->timer);
        tl->timer = NULL;
    }
}

static void sweep(tern_timer *timer, void *user) {
    (void)timer;
    tls_loop *tl = user;
    tls_conn *next;
    for (tls_conn *t = tl->warm; t; t = next) {
        next = t->warm_next;
        if (t->used != tl->gen)   /* not used since the sweep before */
            if (SSL_free_buffers(t->ssl) == 1)
                warm_unlink(t);   /* may stop this timer: the last one */
    }
    tl->gen++;
}

/* c's session is about to read or write: it is warm from now on. */
static void warm(tern__conn *c, tls_conn *t) {
    if (t->tl) {
        t->used = t->tl->gen;
        return;
    }
    void **slot = tern__loop_slot(c->loop, tls_slot());
    if (*slot == NULL)
        *slot = calloc(1, sizeof(tls_loop));
    tls_loop *tl = *slot;
    if (tl == NULL || (tl->timer == NULL &&
                       tern_timer_start(c->loop, &tl->timer, TLS_IDLE_MS, TLS_IDLE_MS, sweep, tl) < 0)) {
        SSL_set_mode(t->ssl, SSL_MODE_RELEASE_BUFFERS);
        return;
    }
    t->tl = tl;
    t->used = tl->gen;
    t->warm_prev = NULL;
    t->warm_next = tl->warm;
    if (tl->warm)
        tl->warm->warm_prev = t;
    tl->warm = t;
}

/* A server's handshake failed: said once, at debug, with the peer and
 * OpenSSL's reason, before the error queue is cleared (a connection closed
 * or reset before it sent anything, a port probe, is no failed handshake:
 * tern__tls_sniff marks it said). e is SSL_get_error's answer, sys the
 * errno of the failed call. */
static void handshake_failed(tern__conn *c, int e, int sys) {
    tls_conn *t = (tls_conn *)c->tp;
    if (t->h.failure_logged || !SSL_is_server(t->ssl) || SSL_is_init_finished(t->ssl))
        return;
    t->h.failure_logged = true;
    if (!tern__log_on(TERN_LOG_DEBUG))
        return;
    char why[256];
    unsigned long err = ERR_peek_error();
    if (err) {
        const char *r = ERR_reason_error_string(err);
        snprintf(why, sizeof(why), "%s", r ? r : "unknown reason");
    } else if (e == SSL_ERROR_ZERO_RETURN || (e == SSL_ERROR_SYSCALL && sys == 0)) {
        snprintf(why, sizeof(why), "the peer closed before it finished");
    } else if (e == SSL_ERROR_SYSCALL) {
        snprintf(why, sizeof(why), "%s", strerror(sys));
    } else {
        snprintf(why, sizeof(why), "error %d", e);
    }
    char peer[TERN_ADDRSTRLEN];
    tern__tls_peer_text(c, peer, sizeof(peer));
    tern__log(TERN_LOG_DEBUG, TERN__LOG_TLS_HANDSHAKE, "tls: handshake with %s failed: %s", peer,
              why);
}

/* OpenSSL's verification result in tern's words. */
static tern__tls_verify verify_of(long v) {
    switch (v) {
    case X509_V_OK:
        return TERN__TLS_VERIFY_OK;
    case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
    case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
    case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
    case X509_V_ERR_CERT_UNTRUSTED:
        return TERN__TLS_VERIFY_UNTRUSTED;
    case X509_V_ERR_HOSTNAME_MISMATCH:
    case X509_V_ERR_IP_ADDRESS_MISMATCH:
        return TERN__TLS_VERIFY_NAME_MISMATCH;
    case X509_V_ERR_CERT_HAS_EXPIRED:
        return TERN__TLS_VERIFY_EXPIRED;
    case X509_V_ERR_CERT_NOT_YET_VALID:
        return TERN__TLS_VERIFY_NOT_YET_VALID;
    default:
        return TERN__TLS_VERIFY_OTHER;
    }
}

/* A handshake of a client that verifies failed: was it the certificate?
 * Then the caller learns why (verify_out) and net sees -EKEYREJECTED. */
static int verify_failed(const tern__conn *c) {
    const tls_conn *t = (const tls_conn *)c->tp;
    if (t->verify_out == NULL || SSL_is_init_finished(t->ssl))
        return 0;
    tern__tls_verify v = verify_of(SSL_get_verify_result(t->ssl));
    if (v == TERN__TLS_VERIFY_OK)
        return 0;
    *t->verify_out = v;
    return -EKEYREJECTED;
}

/* SSL_get_error judges a failed call by the thread's error queue first:
 * any entry in it, even one left by other code (a failed EVP call of the
 * application's in a callback earlier in the batch), reads as the
 * session's own failure. So the queue must be empty before every call
 * whose failure is judged. Clearing it once per loop turn would not do:
 * user callbacks run between one connection's calls and the next's in the
 * same turn. ERR_peek_error is what SSL_get_error itself asks, and costs
 * about 18 ns here where ERR_clear_error costs 100 (OpenSSL 3.0 walks the
 * queue's 16 slots): clearing only a queue that holds something keeps the
 * guarantee at a fifth of the cost (bench/micro/tls_record, "peek"). */
static inline void err_empty(void) {
    if (ERR_peek_error() != 0)
        ERR_clear_error();
}

static SSL *ssl_of(const tern__conn *c) { return ((const tls_conn *)c->tp)->ssl; }

/* c's session, told where c is now (lower_bio calls the lower transport
 * with it) and with no lower error from an earlier call. */
static tls_conn *tls_enter(tern__conn *c) {
    tls_conn *t = (tls_conn *)c->tp;
    t->conn = c;
    t->io_err = 0;
    return t;
}

/* Does the lower transport hold bytes already received (a stream's
 * buffer), which the next read takes without waiting? */
static bool lower_holds(tern__conn *c, const tls_conn *t) {
    return t->lower->ops->held && t->lower->ops->held(c) > 0;
}

/* Reads records until len bytes are in or the lower transport has no
 * more now. */
static ssize_t tls_recv(tern__conn *c, char *buf, size_t len) {
    SSL *ssl = ssl_of(c);
    tls_conn *t = tls_enter(c);
    if (!t->h.sniffed) {
        ssize_t r = tern__tls_sniff(c, t->lower, &t->h, buf, len);
        if (r <= 0)
            return r;
    }
    warm(c, t);
    size_t got = 0;
    while (got < len) {
        size_t n = 0;
        err_empty();
        int r = SSL_read_ex(ssl, buf + got, len - got, &n);
        if (r == 1) {
            got += n;
            /* Nothing more inside OpenSSL or the lower transport: stop
             * rather than ask the socket again only to find it empty. If
             * it is not, level-triggered epoll says so at once. */
            if (SSL_has_pending(ssl) != 1 && !lower_holds(c, t))
                break;
            continue;
        }
        int e = SSL_get_error(ssl, r);
        if (e == SSL_ERROR_WANT_READ)
            break;
        if (e == SSL_ERROR_WANT_WRITE) {
            tern__conn_recv_wants_out(c);
            break;
        }
        if (got)
            break;   /* hand over what came; the end or error shows again next time */
        int sys = -t->io_err;
        handshake_failed(c, e, sys);
        if (e == SSL_ERROR_ZERO_RETURN)
            return 0;   /* close_notify, or the end without it (SSL_OP_IGNORE_UNEXPECTED_EOF) */
        ERR_clear_error();
        int vf = verify_failed(c);
        if (vf)
            return vf;
        if (e == SSL_ERROR_SYSCALL)
            return sys ? -sys : -ECONNRESET;
        return -EPROTO;   /* not TLS (bytes of another protocol), a failed handshake, a bad record */
    }
    return got ? (ssize_t)got : -EAGAIN;
}

static ssize_t tls_send(tern__conn *c, const struct iovec *iov, int iovcnt) {
    SSL *ssl = ssl_of(c);
    tls_conn *t = tls_enter(c);
    warm(c, t);
    size_t total = 0;
    for (int i = 0; i < iovcnt; i++) {
        size_t done = 0;
        while (done < iov[i].iov_len) {
            size_t n = 0;
            err_empty();
            int r = SSL_write_ex(ssl, (const char *)iov[i].iov_base + done, iov[i].iov_len - done, &n);
            if (r == 1) {
                done += n;
                total += n;
                continue;
            }
            int e = SSL_get_error(ssl, r);
            if (e == SSL_ERROR_WANT_READ)
                tern__conn_send_wants_in(c);
            if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
                return total ? (ssize_t)total : -EAGAIN;
            handshake_failed(c, e, -t->io_err);
            ERR_clear_error();
            /* As tls_recv says it: the verification's verdict, the lower
             * transport's error, or OpenSSL's refusal (a TLS failure). */
            int vf = verify_failed(c);
            int err = vf ? vf : t->io_err ? t->io_err : e == SSL_ERROR_SSL ? -EPROTO : -EPIPE;
            return total ? (ssize_t)total : err;
        }
    }
    return (ssize_t)total;
}

/* close_notify, then the lower transport's shutdown (on a stream, after
 * its send in flight). close_notify goes when the lower transport takes it
 * now, as a socket with room does; one that cannot (a full socket, a
 * stream's send still in flight) ends with the TCP end alone. The peer's
 * close_notify is read while lingering. */
static int tls_shutdown(tern__conn *c) {
    tls_conn *t = tls_enter(c);
    err_empty();
    SSL_shutdown(t->ssl);
    ERR_clear_error();
    return t->lower->ops->shutdown(c);
}

/* Decrypted bytes in OpenSSL, bytes kept from the sniff, or what the
 * lower transport holds (a stream's received bytes or end). */
static bool tls_pending(const tern__conn *c) {
    const tls_conn *t = (const tls_conn *)c->tp;
    return SSL_has_pending(t->ssl) == 1 || t->h.off < t->h.len ||
           t->lower->ops->pending(c);
}

/* What the lower transport holds of what it took (OpenSSL cannot say
 * what it keeps of a record the lower transport took in part). */
static size_t tls_unsent(const tern__conn *c) {
    return tern__tls_lower_unsent(c, ((const tls_conn *)c->tp)->lower);
}

static const char *tls_server_name(const tern__conn *c) {
    return SSL_get_servername(ssl_of(c), TLSEXT_NAMETYPE_host_name);
}

static void tls_release(tern__conn *c) {
    tls_conn *t = (tls_conn *)c->tp;
    if (t->tl)
        warm_unlink(t);
    SSL_free(t->ssl);
    t->lower->ops->release(c);
    free(t);
}

static const tern__transport_ops tls_ops = {
    .recv = tls_recv,
    .send = tls_send,
    .send_file = tern__tls_send_file,
    .shutdown = tls_shutdown,
    .pending = tls_pending,
    .release = tls_release,
    .server_name = tls_server_name,
    .unsent = tls_unsent,
};

bool tern__tls_is(const tern__conn *c) { return c->tp && c->tp->ops == &tls_ops; }

bool tern__tls_alpn_is(const tern__conn *c, const char *proto) {
    if (!tern__tls_is(c))
        return false;
    const unsigned char *p = NULL;
    unsigned int n = 0;
    SSL_get0_alpn_selected(ssl_of(c), &p, &n);
    return p && n == strlen(proto) && memcmp(p, proto, n) == 0;
}

int tern__tls_peer_cert(const tern__conn *c, char *subject, size_t cap, tern__tls_verify *verify) {
    if (cap)
        subject[0] = '\0';
    if (!tern__tls_is(c))
        return 0;
    SSL *ssl = ssl_of(c);
    X509 *x = SSL_get0_peer_certificate(ssl);
    if (x == NULL)
        return 0;
    *verify = verify_of(SSL_get_verify_result(ssl));
    if (cap)
        tern__tls_x509_subject(x, subject, cap);
    return 1;
}

static const char *conn_alpn(SSL *ssl) { return ((const tls_conn *)SSL_get_app_data(ssl))->alpn; }

int tern__tls_attach(tern__conn *c, tern_tls *tls, const char *alpn) {
    tls_conn *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return -ENOMEM;
    t->alpn = alpn;
    tern__tls_keyset *pin = NULL;
    const tern__tls_key *k = tern__tls_pick(tls, NULL, 0, &pin);
    t->ssl = SSL_new(k->ctx);   /* takes its own reference: the set may go */
    tern__tls_unpin(tls, pin);
    if (t->ssl == NULL || !lower_attach(c, t)) {
        SSL_free(t->ssl);
        free(t);
        ERR_clear_error();
        return -ENOMEM;
    }
    SSL_set_app_data(t->ssl, t);   /* for alpn_cb */
    SSL_set_accept_state(t->ssl);
    t->base.ops = &tls_ops;
    tern__conn_set_transport(c, &t->base);
    return 0;
}

/* ---- the client's side ------------------------------------------------ */

/* The opaque client context is OpenSSL's SSL_CTX itself. */
struct tern__tls_lib_client {
    SSL_CTX *ctx;
};

tern__tls_lib_client *tern__tls_lib_client_new(const char *ca_file, bool insecure, const char *alpn) {
    tern__tls_lib_client *cl = malloc(sizeof(*cl));
    if (cl == NULL)
        return NULL;
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (ctx == NULL) {
        free(cl);
        tls_err("client context", NULL);
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION |
                                 SSL_OP_IGNORE_UNEXPECTED_EOF);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    SSL_CTX_set_read_ahead(ctx, 1);
    /* 0 is success here, unlike everywhere else in OpenSSL */
    if (SSL_CTX_set_alpn_protos(ctx, (const unsigned char *)alpn, (unsigned)strlen(alpn)) != 0) {
        SSL_CTX_free(ctx);
        free(cl);
        tls_err("client ALPN", NULL);
        return NULL;
    }
    SSL_CTX_set_verify(ctx, insecure ? SSL_VERIFY_NONE : SSL_VERIFY_PEER, NULL);
    int ok = insecure ? 1
             : ca_file ? SSL_CTX_load_verify_locations(ctx, ca_file, NULL)
                       : SSL_CTX_set_default_verify_paths(ctx);
    if (ok != 1) {
        SSL_CTX_free(ctx);
        free(cl);
        tls_err("CA file", ca_file);
        return NULL;
    }
    cl->ctx = ctx;
    return cl;
}

void tern__tls_lib_client_free(tern__tls_lib_client *cl) {
    if (cl == NULL)
        return;
    SSL_CTX_free(cl->ctx);   /* sessions made from it hold their own reference */
    free(cl);
}

int tern__tls_lib_client_attach(tern__conn *c, tern__tls_lib_client *cl, const char *name,
                            tern__tls_verify *verify_out) {
    tls_conn *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return -ENOMEM;
    t->ssl = SSL_new(cl->ctx);
    if (t->ssl == NULL || !lower_attach(c, t))
        goto fail;
    if (name && name[0]) {
        /* SNI carries host names only (RFC 6066 §3); an address is
         * checked against the certificate's IP entries instead. */
        unsigned char ip[16];
        bool is_ip = inet_pton(AF_INET, name, ip) == 1 || inet_pton(AF_INET6, name, ip) == 1;
        if (!is_ip && SSL_set_tlsext_host_name(t->ssl, name) != 1)
            goto fail;
        if (SSL_get_verify_mode(t->ssl) != SSL_VERIFY_NONE) {
            X509_VERIFY_PARAM *vp = SSL_get0_param(t->ssl);
            if ((is_ip ? X509_VERIFY_PARAM_set1_ip_asc(vp, name)
                       : X509_VERIFY_PARAM_set1_host(vp, name, 0)) != 1)
                goto fail;
            t->verify_out = verify_out;
        }
    }
    SSL_set_connect_state(t->ssl);
    t->h.sniffed = true;   /* a server's first bytes are its own business */
    t->base.ops = &tls_ops;
    tern__conn_set_transport(c, &t->base);
    return 0;
fail:
    SSL_free(t->ssl);
    free(t);
    ERR_clear_error();
    return -ENOMEM;
}

/* "OpenSSL " and the version number OpenSSL gives, made once. */
static char library_name[64];
static pthread_once_t library_once = PTHREAD_ONCE_INIT;

static void library_make(void) {
    snprintf(library_name, sizeof(library_name), "OpenSSL %s", OpenSSL_version(OPENSSL_VERSION_STRING));
}

const char *tern__tls_lib_name(void) {
    pthread_once(&library_once, library_make);
    return library_name;
}
