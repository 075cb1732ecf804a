/* net/tls.h and net/tls_lib.h on rustls (rustls-ffi): a certificate's
 * certified key (which net/tls.c keeps in its key sets), the server
 * configurations of a tern_tls, the TLS transport, and the client's
 * contexts. Nothing of rustls leaves this file: results are mapped to
 * errnos and tern__tls_verify. OpenSSL's libcrypto stays linked for what
 * rustls does not offer: reading a certificate's names (SNI) and a peer
 * certificate's subject (X.509 parsing, net/tls_x509.c), and
 * net/crypto.h.
 *
 * rustls moves records through two callbacks of ours (lower_read and
 * lower_write below) that call the connection's lower transport, plain
 * TCP on epoll or the back end's stream on io_uring, as OpenSSL's BIO
 * does in net/tls_openssl.c.
 *
 * Two of rustls's cryptography providers, each for what it does fastest
 * here (bench/HISTORY.md, "Handshakes per second"): *ring* for the
 * records (AES-GCM) and the key exchange, and AWS-LC (aws-lc-rs) for the
 * certificates' private keys, whose RSA signature is most of a full
 * handshake's cost and takes AWS-LC about half of *ring*'s time (it has
 * AVX-512 code for RSA, *ring* has not).
 *
 * What rustls cannot do as OpenSSL does is refused when the tern_tls is
 * made, with a message saying so: encrypted keys (no passphrase support)
 * OpenSSL's cipher strings, and TERN_TLS_VERIFY_OPTIONAL (rustls refuses
 * a client certificate that does not verify: it has no "verify, report,
 * go on").
 *
 * Writes: rustls takes plaintext at once and keeps the records it made
 * until the lower transport takes them. net must learn that some are
 * left (else it would wait for nothing), so when they are, one byte of
 * what rustls took is reported as not taken (`owed`): net keeps it, waits
 * until the socket is writable and sends again from it, and that send
 * first writes the records left, then skips the owed byte. This is the
 * contract OpenSSL's SSL_write has, which net's backlog already keeps. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
/* rustls.h declares the providers only when told they are built in
 * (third_party/rustls-ffi: features ring, aws-lc-rs, capi). */
#define DEFINE_RING 1
#define DEFINE_AWS_LC_RS 1
#include <rustls.h>

#include "loop/check.h"
#include "loop/log.h"
#include "net/crypto.h"
#include "net/tls_x509.h"

/* ---- certificates ------------------------------------------------------ */

#define TLS_MAX_ALPNS 4

/* One certificate chain and key as rustls's certified key; names are its
 * DNS names (lower-case), for SNI. rustls.h promises nothing about how
 * long it reads the key a ClientHello callback gives it; rustls-ffi
 * 0.15.7 copies it (a clone of the CertifiedKey: the chain and a
 * reference to the signing key) right after the callback returns, inside
 * rustls_connection_process_new_packets, and never reads ours again. So
 * the set a handshake picks from (tern__tls_pick) stays pinned until that
 * call returns: never freed while a handshake may still copy from it,
 * and never later than the end of the handshakes that chose it. */
struct tern__tls_key {
    const struct rustls_certified_key *ck;
    tern__tls_names names;
};

/* rustls's words for result r, logged at warn with what and file. */
static int rustls_err(const char *what, const char *file, rustls_result r) {
    char buf[256];
    size_t n = 0;
    rustls_error((unsigned)r, buf, sizeof(buf) - 1, &n);
    buf[n] = '\0';
    tern__log(TERN_LOG_WARN, TERN__LOG_LISTEN, "tls: %s %s: %s", what, file ? file : "", buf);
    return -EPROTO;
}

/* The names of the chain's first certificate (pem, len bytes). */
static void read_names(tern__tls_names *names, const char *pem, size_t len) {
    BIO *b = BIO_new_mem_buf(pem, (int)(len > INT_MAX ? INT_MAX : len));
    X509 *x = b ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
    BIO_free(b);
    if (x)
        tern__tls_x509_names(names, x);
    X509_free(x);
    ERR_clear_error();
}

/* The whole of a (small) file, NUL-terminated; NULL and errno on error. */
static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rbe");
    if (f == NULL)
        return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n < cap - 1 || cap > (1u << 24))
            break;
        char *more = realloc(buf, cap *= 2);
        if (more == NULL)
            free(buf);
        buf = more;
    }
    bool bad = ferror(f);
    fclose(f);
    if (buf == NULL || bad) {
        free(buf);
        errno = bad ? EIO : ENOMEM;
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* AWS-LC's provider, for loading private keys (their signatures are
 * AWS-LC's then): made once, kept for the program's life. */
static const struct rustls_crypto_provider *keys;
static pthread_once_t keys_once = PTHREAD_ONCE_INIT;

static void keys_make(void) { keys = rustls_aws_lc_rs_crypto_provider(); }

static const struct rustls_crypto_provider *key_provider(void) {
    pthread_once(&keys_once, keys_make);
    return keys;
}

/* Makes the certified key of one certificate. Returns 0, or the error
 * (logged): -ENOENT (unreadable), -ENOKEY (an encrypted key, which rustls
 * cannot read), -EPROTO (anything else rustls refuses). */
int tern__tls_key_load(tern_tls *tls, const char *cert_file, const char *key_file,
                       tern__tls_key **out) {
    (void)tls;   /* rustls reads no option of tls's when loading */
    size_t clen = 0, klen = 0;
    char *chain = slurp(cert_file, &clen);
    char *key = chain ? slurp(key_file, &klen) : NULL;
    if (key == NULL) {
        tern__log(TERN_LOG_WARN, TERN__LOG_LISTEN, "tls: cannot read %s or %s", cert_file,
                  key_file);
        free(chain);
        return -ENOENT;
    }
    int err = 0;
    if (strstr(key, "ENCRYPTED")) {   /* PKCS#8 "ENCRYPTED PRIVATE KEY", or "Proc-Type: 4,ENCRYPTED" */
        tern__log(TERN_LOG_WARN, TERN__LOG_LISTEN,
                  "tls: the key in %s is encrypted, which this build's TLS library (rustls) "
                  "cannot read: decrypt it (openssl pkey -in key.pem -out plain.pem) or use a "
                  "build with TERN_TLS=openssl",
                  key_file);
        err = -ENOKEY;
    }
    const struct rustls_certified_key *ck = NULL;
    struct rustls_signing_key *sk = NULL;
    rustls_result r = err ? RUSTLS_RESULT_OK
                          : rustls_crypto_provider_load_key(key_provider(), (const uint8_t *)key,
                                                            klen, &sk);
    tern__crypto_wipe(key, klen);   /* the private key's text, before it is freed */
    free(key);
    if (err == 0 && r == RUSTLS_RESULT_OK)   /* takes sk, whatever it returns */
        r = rustls_certified_key_build_with_signing_key((const uint8_t *)chain, clen, sk, &ck);
    if (err == 0 && r != RUSTLS_RESULT_OK)
        err = rustls_err("certificate and key", cert_file, r);
    tern__tls_key *k = err ? NULL : calloc(1, sizeof(*k));
    if (k) {
        read_names(&k->names, chain, clen);
        k->ck = ck;
        *out = k;
    } else {
        rustls_certified_key_free(ck);
        err = err ? err : -ENOMEM;
    }
    free(chain);
    return err;
}

void tern__tls_key_free(tern__tls_key *k) {
    if (k == NULL)
        return;
    rustls_certified_key_free(k->ck);   /* handshakes hold their own copies */
    tern__tls_names_free(&k->names);
    free(k);
}

const tern__tls_names *tern__tls_key_names(const tern__tls_key *k) { return &k->names; }

/* What rustls cannot do as OpenSSL does, refused with a message saying
 * what to do instead. */
int tern__tls_lib_check(const tern_tls_options *opt) {
    if (opt && (opt->passphrase || opt->passphrase_file)) {
        tern__log(TERN_LOG_WARN, TERN__LOG_LISTEN,
                  "tls: this build's TLS library (rustls) cannot read encrypted keys: "
                  "give a decrypted key, or use a build with TERN_TLS=openssl");
        return -ENOTSUP;
    }
    if (opt && (opt->ciphers || opt->ciphersuites)) {
        tern__log(TERN_LOG_WARN, TERN__LOG_LISTEN,
                  "tls: cipher lists are OpenSSL's syntax, which this build's TLS library "
                  "(rustls) does not take: leave them out (rustls offers AES-GCM and "
                  "ChaCha20-Poly1305 only), or use a build with TERN_TLS=openssl");
        return -ENOTSUP;
    }
    if (opt && opt->client_verify == TERN_TLS_VERIFY_OPTIONAL) {
        tern__log(TERN_LOG_WARN, TERN__LOG_LISTEN,
                  "tls: optional client certificates (verified, but a failure let in) are "
                  "not possible with this build's TLS library (rustls), which refuses a "
                  "certificate that does not verify: require them, or use a build with "
                  "TERN_TLS=openssl");
        return -ENOTSUP;
    }
    return 0;
}

/* The server configurations a tern_tls has (its tern__tls_lib_state):
 * one per ALPN list the protocols above have attached with (a literal,
 * compared by address), made on first use under the tern_tls's lock and
 * kept until it is freed: each has its session cache (resumption), which
 * a reload keeps. Invariants: cfgs[0..n) are built. */
typedef struct tls_cfgs {
    struct {
        const char *alpn;
        const struct rustls_server_config *cfg;
    } cfgs[TLS_MAX_ALPNS];
    int n;
} tls_cfgs;

void tern__tls_lib_free(void *state) {
    tls_cfgs *cs = state;
    if (cs == NULL)
        return;
    for (int i = 0; i < cs->n; i++)
        rustls_server_config_free(cs->cfgs[i].cfg);   /* connections hold their own reference */
    free(cs);
}

/* ---- the transport ---------------------------------------------------- */

/* lower is the transport TLS came over; conn, the connection as of the
 * transport call under way (the struct moves on an upgrade); io_err, the
 * lower transport's error (a negative errno) that made the last call
 * fail; eof, that its read returned the end; h, the first bytes, read to
 * tell plain HTTP from TLS. owed:
 * bytes rustls has taken that the last send reported as not taken (see
 * the top). more: the last read stopped with its buffer full, so rustls
 * may hold decrypted bytes. drained: the lower transport's last read
 * returned less than rustls asked for, so the socket had nothing more
 * then. tls (a server's) chooses the certificate in
 * hello_cb; sni is the name the client asked for. pinned: the set of the
 * key hello_cb handed to rustls, held until the call that ran it returns
 * (see struct tern__tls_key). verify_out, for a client that verifies, is
 * where a failed handshake leaves why. */
typedef struct tls_conn {
    tern__transport base;
    struct rustls_connection *rc;
    tern__transport *lower;
    tern__conn *conn;
    tern_tls *tls;
    tern__tls_keyset *pinned;
    tern__tls_verify *verify_out;
    int io_err;
    size_t owed;
    tern__tls_head h;
    bool eof;
    bool more;
    bool drained;
    char sni[256];
} tls_conn;

static rustls_io_result lower_read(void *user, uint8_t *buf, size_t len, size_t *out_n) {
    tls_conn *t = user;
    *out_n = 0;
    if (t->h.off < t->h.len) {
        *out_n = tern__tls_head_take(&t->h, (char *)buf, len);
        return 0;
    }
    ssize_t r = t->lower->ops->recv(t->conn, (char *)buf, len);
    if (r > 0) {
        *out_n = (size_t)r;
        t->drained = (size_t)r < len;
        return 0;
    }
    if (r == 0) {
        t->eof = true;
        return 0;
    }
    if (r != -EAGAIN)
        t->io_err = (int)r;
    return (rustls_io_result)-r;
}

static rustls_io_result lower_write(void *user, const uint8_t *buf, size_t len, size_t *out_n) {
    tls_conn *t = user;
    struct iovec iov = {(void *)buf, len};
    ssize_t w = t->lower->ops->send(t->conn, &iov, 1);
    *out_n = 0;
    if (w > 0) {
        *out_n = (size_t)w;
        return 0;
    }
    if (w == 0 || w == -EAGAIN)
        return EAGAIN;
    t->io_err = (int)w;
    return (rustls_io_result)-w;
}

/* Writes the records rustls holds to the lower transport: 0 when all are
 * out, -EAGAIN when it takes no more now, or its error. */
static int flush(tls_conn *t) {
    while (rustls_connection_wants_write(t->rc)) {
        size_t n = 0;
        rustls_io_result e = rustls_connection_write_tls(t->rc, lower_write, t, &n);
        if (e == EAGAIN)
            return -EAGAIN;
        if (e != 0)
            return t->io_err ? t->io_err : -e;
        if (n == 0)
            return -EAGAIN;
    }
    return 0;
}

/* A server's handshake failed: said once, at debug, with the peer and
 * rustls's reason. */
static void handshake_failed(tern__conn *c, tls_conn *t, rustls_result r) {
    if (t->h.failure_logged || t->tls == NULL || !rustls_connection_is_handshaking(t->rc))
        return;
    t->h.failure_logged = true;
    if (!tern__log_on(TERN_LOG_DEBUG))
        return;
    char why[256];
    size_t n = 0;
    if (r == RUSTLS_RESULT_OK) {
        snprintf(why, sizeof(why), "the peer closed before it finished");
    } else {
        rustls_error((unsigned)r, why, sizeof(why) - 1, &n);
        why[n] = '\0';
    }
    char peer[TERN_ADDRSTRLEN];
    tern__tls_peer_text(c, peer, sizeof(peer));
    tern__log(TERN_LOG_DEBUG, TERN__LOG_TLS_HANDSHAKE, "tls: handshake with %s failed: %s", peer,
              why);
}

/* rustls's certificate errors in tern's words. */
static tern__tls_verify verify_of(rustls_result r) {
    switch (r) {
    case RUSTLS_RESULT_CERT_UNKNOWN_ISSUER:
        return TERN__TLS_VERIFY_UNTRUSTED;
    case RUSTLS_RESULT_CERT_NOT_VALID_FOR_NAME:
        return TERN__TLS_VERIFY_NAME_MISMATCH;
    case RUSTLS_RESULT_CERT_EXPIRED:
        return TERN__TLS_VERIFY_EXPIRED;
    case RUSTLS_RESULT_CERT_NOT_YET_VALID:
        return TERN__TLS_VERIFY_NOT_YET_VALID;
    default:
        return TERN__TLS_VERIFY_OTHER;
    }
}

/* c's session, told where c is now and with no lower error from an
 * earlier call. */
static tls_conn *tls_enter(tern__conn *c) {
    tls_conn *t = (tls_conn *)c->tp;
    t->conn = c;
    t->io_err = 0;
    return t;
}

/* rustls refused what the peer sent (r): its alert goes out if the lower
 * transport takes it now; the error for net. */
static ssize_t failed(tern__conn *c, tls_conn *t, rustls_result r) {
    handshake_failed(c, t, r);
    (void)flush(t);
    if (t->verify_out && rustls_result_is_cert_error((unsigned)r)) {
        *t->verify_out = verify_of(r);
        return -EKEYREJECTED;
    }
    return -EPROTO;
}

/* Reads records until len bytes are in or the lower transport has no
 * more now. */
static ssize_t tls_recv(tern__conn *c, char *buf, size_t len) {
    tls_conn *t = tls_enter(c);
    if (!t->h.sniffed) {
        ssize_t r = tern__tls_sniff(c, t->lower, &t->h, buf, len);
        if (r <= 0)
            return r;
    }
    /* Records a recv that wanted the socket writable left (handshake
     * messages, or plaintext taken during the handshake), first. */
    int f = flush(t);
    if (f == -EAGAIN)
        tern__conn_recv_wants_out(c);
    else if (f < 0)
        return f;
    size_t got = 0;
    bool read_once = false;
    t->more = false;
    while (got < len) {
        size_t n = 0;
        rustls_result r = rustls_connection_read(t->rc, (uint8_t *)buf + got, len - got, &n);
        if (r == RUSTLS_RESULT_OK && n > 0) {
            got += n;
            continue;
        }
        if (r == RUSTLS_RESULT_OK || r == RUSTLS_RESULT_UNEXPECTED_EOF) {
            /* close_notify, or the end without it: the end of the stream,
             * as on plain TCP (HTTP's own framing tells a cut body) */
            if (got)
                return (ssize_t)got;
            handshake_failed(c, t, RUSTLS_RESULT_OK);
            return 0;
        }
        if (r != RUSTLS_RESULT_PLAINTEXT_EMPTY)
            return got ? (ssize_t)got : failed(c, t, r);
        if (t->eof)
            return got ? (ssize_t)got : (handshake_failed(c, t, RUSTLS_RESULT_OK), 0);
        /* A read that found less than it asked for drained the socket: one
         * more would only return EAGAIN (a system call per message). The
         * loop's readiness is level-triggered, so bytes that come later
         * bring another call. */
        if (read_once && t->drained)
            break;
        read_once = true;
        size_t in = 0;
        rustls_io_result e = rustls_connection_read_tls(t->rc, lower_read, t, &in);
        if (e == EAGAIN)
            break;
        if (e != 0)
            return got ? (ssize_t)got : t->io_err ? t->io_err : -e;
        if (in == 0 && !t->eof)
            break;
        rustls_result p = rustls_connection_process_new_packets(t->rc);
        if (t->pinned) {   /* hello_cb ran in that call: rustls has its copy of the key */
            tern__tls_unpin(t->tls, t->pinned);
            t->pinned = NULL;
        }
        if (p != RUSTLS_RESULT_OK)
            return got ? (ssize_t)got : failed(c, t, p);
        /* Handshake messages, or records made of plaintext taken while
         * the handshake ran: out now, or when the socket is writable. */
        f = flush(t);
        if (f == -EAGAIN)
            tern__conn_recv_wants_out(c);
        else if (f < 0)
            return got ? (ssize_t)got : f;
    }
    t->more = got == len;
    return got ? (ssize_t)got : -EAGAIN;
}

static ssize_t tls_send(tern__conn *c, const struct iovec *iov, int iovcnt) {
    tls_conn *t = tls_enter(c);
    int f = flush(t);   /* the records left by the last call first */
    if (f < 0)
        return f;
    size_t total = 0;
    for (int i = 0; i < iovcnt; i++) {
        const uint8_t *p = iov[i].iov_base;
        size_t left = iov[i].iov_len;
        size_t skip = t->owed < left ? t->owed : left;   /* taken already (see the top) */
        t->owed -= skip;
        total += skip;
        p += skip;
        left -= skip;
        if (left == 0)
            continue;
        size_t n = 0;
        rustls_result r = rustls_connection_write(t->rc, p, left, &n);
        if (r != RUSTLS_RESULT_OK)   /* the session cannot take plaintext: a TLS failure */
            return total ? (ssize_t)total : -EPROTO;
        total += n;
        if (n < left)
            break;   /* rustls's buffer limit */
    }
    /* Plaintext taken while the handshake runs waits inside rustls, made
     * into records when it ends (tls_recv writes them). */
    f = flush(t);
    if (f == -EAGAIN && total > 0) {
        t->owed = 1;   /* records are left: net keeps one byte and comes back */
        return total - 1 ? (ssize_t)(total - 1) : -EAGAIN;
    }
    if (f < 0 && f != -EAGAIN)
        return total ? (ssize_t)total : f;
    return total ? (ssize_t)total : -EAGAIN;
}

/* close_notify, then the lower transport's shutdown. close_notify goes
 * when the lower transport takes it now; one that cannot ends with the
 * TCP end alone. */
static int tls_shutdown(tern__conn *c) {
    tls_conn *t = tls_enter(c);
    rustls_connection_send_close_notify(t->rc);
    (void)flush(t);
    return t->lower->ops->shutdown(c);
}

/* Decrypted bytes rustls may hold, bytes kept from the sniff, or what the
 * lower transport holds. */
static bool tls_pending(const tern__conn *c) {
    const tls_conn *t = (const tls_conn *)c->tp;
    return t->more || t->h.off < t->h.len || t->lower->ops->pending(c);
}

/* What the lower transport holds of what it took (rustls says only
 * whether it holds records, not how many bytes: net learns of those by
 * the owed byte). */
static size_t tls_unsent(const tern__conn *c) {
    return tern__tls_lower_unsent(c, ((const tls_conn *)c->tp)->lower);
}

static const char *tls_server_name(const tern__conn *c) {
    const tls_conn *t = (const tls_conn *)c->tp;
    return t->sni[0] ? t->sni : NULL;
}

static void tls_release(tern__conn *c) {
    tls_conn *t = (tls_conn *)c->tp;
    rustls_connection_free(t->rc);
    if (t->pinned)   /* only if the call that ran hello_cb never returned here */
        tern__tls_unpin(t->tls, t->pinned);
    if (t->tls)
        tern_tls_free(t->tls);
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
    const tls_conn *t = (const tls_conn *)c->tp;
    const uint8_t *p = NULL;
    size_t n = 0;
    rustls_connection_get_alpn_protocol(t->rc, &p, &n);
    return p && n == strlen(proto) && memcmp(p, proto, n) == 0;
}

int tern__tls_peer_cert(const tern__conn *c, char *subject, size_t cap, tern__tls_verify *verify) {
    if (cap)
        subject[0] = '\0';
    if (!tern__tls_is(c))
        return 0;
    const tls_conn *t = (const tls_conn *)c->tp;
    const struct rustls_certificate *cert = rustls_connection_get_peer_certificate(t->rc, 0);
    const uint8_t *der = NULL;
    size_t dlen = 0;
    if (cert == NULL || rustls_certificate_get_der(cert, &der, &dlen) != RUSTLS_RESULT_OK)
        return 0;
    /* rustls verified the chain before the handshake could finish. */
    *verify = TERN__TLS_VERIFY_OK;
    if (cap) {
        X509 *x = d2i_X509(NULL, &der, (long)(dlen > LONG_MAX ? LONG_MAX : dlen));
        if (x)
            tern__tls_x509_subject(x, subject, cap);
        X509_free(x);
        ERR_clear_error();
    }
    return 1;
}

/* SNI: the certificate that names the host asked for; the default one
 * serves unknown names and clients that send none. rustls copies the key
 * after this returns: its set stays pinned until tls_recv sees
 * rustls_connection_process_new_packets return. */
static const struct rustls_certified_key *hello_cb(void *user, const rustls_client_hello *hello) {
    tls_conn *t = user;
    const char *name = hello->server_name.data;
    size_t len = hello->server_name.len;
    if (len && len < sizeof(t->sni)) {
        memcpy(t->sni, name, len);
        t->sni[len] = '\0';
    }
    /* Called again before the pin was dropped (a second ClientHello in
     * one call): the first key was copied as that callback returned. */
    tern__tls_unpin(t->tls, t->pinned);
    return tern__tls_pick(t->tls, name, len, &t->pinned)->ck;
}

/* ALPN lists (net/tls.h's wire format) as rustls's slices; n of them. */
static size_t alpn_slices(const char *alpn, struct rustls_slice_bytes *out, size_t cap) {
    size_t n = 0, len = strlen(alpn);
    for (size_t i = 0; i < len && n < cap; i += 1 + (size_t)(unsigned char)alpn[i])
        out[n++] = (struct rustls_slice_bytes){(const uint8_t *)alpn + i + 1,
                                               (size_t)(unsigned char)alpn[i]};
    return n;
}

/* *ring*, for the records and the key exchange, with TLS 1.3's suites in
 * the order a server on AES-NI wants, as net/tls_openssl.c has them (the
 * server's order is chosen: ignore_client_order): AES-128-GCM first, as
 * fast as AES-256-GCM for small records and 5 % faster for full ones,
 * ChaCha20 last; TLS 1.2's in *ring*'s order after them. *ring*'s own order puts AES-256-GCM first.
 * Made once, kept for the program's life; without memory, *ring*'s own. */
static const struct rustls_crypto_provider *ordered;
static pthread_once_t ordered_once = PTHREAD_ONCE_INIT;

static void ordered_make(void) {
    const struct rustls_crypto_provider *ring = rustls_ring_crypto_provider();
    static const uint16_t first[] = {0x1301, 0x1302, 0x1303};   /* RFC 8446 B.4 */
    const struct rustls_supported_ciphersuite *suites[32];
    size_t n = 0, all = rustls_crypto_provider_ciphersuites_len(ring);
    for (size_t f = 0; f <= 3; f++)
        for (size_t i = 0; i < all && n < 32; i++) {
            const struct rustls_supported_ciphersuite *cs =
                rustls_crypto_provider_ciphersuites_get(ring, i);
            uint16_t id = rustls_supported_ciphersuite_get_suite(cs);
            bool is_first = id == first[0] || id == first[1] || id == first[2];
            if ((f < 3 && id == first[f]) || (f == 3 && !is_first))
                suites[n++] = cs;
        }
    struct rustls_crypto_provider_builder *b = rustls_crypto_provider_builder_new_with_base(ring);
    if (b == NULL || rustls_crypto_provider_builder_set_cipher_suites(b, suites, n) != RUSTLS_RESULT_OK ||
        rustls_crypto_provider_builder_build(b, &ordered) != RUSTLS_RESULT_OK)
        ordered = NULL;
    rustls_crypto_provider_builder_free(b);
    if (ordered == NULL)
        ordered = ring;   /* kept for the program's life, as the ordered one */
    else
        rustls_crypto_provider_free(ring);
}

static const struct rustls_crypto_provider *provider(void) {
    pthread_once(&ordered_once, ordered_make);
    return ordered;
}

/* The protocol versions min_version allows, for a config builder. */
static size_t versions(int min_version, uint16_t v[2]) {
    v[0] = RUSTLS_TLS_VERSION_TLSV1_3;
    v[1] = RUSTLS_TLS_VERSION_TLSV1_2;
    return min_version == 13 ? 1 : 2;
}

/* The server configuration of tls for the ALPN list alpn: made once.
 * Called with tls's lock held (tern__tls_lock). NULL on error (logged).
 * rustls refuses, with the no_application_protocol alert, a client that
 * offers ALPN but none of ours. */
static const struct rustls_server_config *server_config(tern_tls *tls, const char *alpn) {
    void **state = tern__tls_lib_state(tls);
    if (*state == NULL && (*state = calloc(1, sizeof(tls_cfgs))) == NULL)
        return NULL;
    tls_cfgs *cs = *state;
    for (int i = 0; i < cs->n; i++)
        if (cs->cfgs[i].alpn == alpn)
            return cs->cfgs[i].cfg;
    if (cs->n == TLS_MAX_ALPNS)
        return NULL;
    const tern__tls_conf *conf = tern__tls_conf_of(tls);
    uint16_t v[2];
    struct rustls_server_config_builder *b = NULL;
    rustls_result r = rustls_server_config_builder_new_custom(
        provider(), v, versions(conf->min_version, v), &b);
    if (r == RUSTLS_RESULT_OK)
        r = rustls_server_config_builder_set_ignore_client_order(b, true);
    struct rustls_slice_bytes protos[16];
    size_t np = alpn_slices(alpn, protos, 16);
    if (r == RUSTLS_RESULT_OK)
        r = rustls_server_config_builder_set_alpn_protocols(b, protos, np);
    if (r == RUSTLS_RESULT_OK)
        r = rustls_server_config_builder_set_hello_callback(b, hello_cb);
    if (r == RUSTLS_RESULT_OK && conf->client_verify != TERN_TLS_VERIFY_NONE) {
        struct rustls_root_cert_store_builder *sb = rustls_root_cert_store_builder_new();
        const struct rustls_root_cert_store *store = NULL;
        r = rustls_root_cert_store_builder_load_roots_from_file(sb, conf->client_ca_file, true);
        if (r == RUSTLS_RESULT_OK)
            r = rustls_root_cert_store_builder_build(sb, &store);
        rustls_root_cert_store_builder_free(sb);
        struct rustls_web_pki_client_cert_verifier_builder *vb =
            r == RUSTLS_RESULT_OK
                ? rustls_web_pki_client_cert_verifier_builder_new_with_provider(provider(), store)
                : NULL;
        struct rustls_client_cert_verifier *verifier = NULL;
        if (vb)
            r = rustls_web_pki_client_cert_verifier_builder_build(vb, &verifier);
        rustls_web_pki_client_cert_verifier_builder_free(vb);
        rustls_root_cert_store_free(store);
        if (r == RUSTLS_RESULT_OK)
            rustls_server_config_builder_set_client_verifier(b, verifier);
        rustls_client_cert_verifier_free(verifier);
    }
    const struct rustls_server_config *cfg = NULL;
    if (r == RUSTLS_RESULT_OK) {
        r = rustls_server_config_builder_build(b, &cfg);
        b = NULL;   /* consumed, built or not */
    }
    rustls_server_config_builder_free(b);
    if (r != RUSTLS_RESULT_OK) {
        rustls_err("server configuration", conf->client_ca_file, r);
        return NULL;
    }
    cs->cfgs[cs->n].alpn = alpn;
    cs->cfgs[cs->n++].cfg = cfg;
    return cfg;
}

/* Puts t on c's present transport, which becomes t's lower one. */
static void lower_attach(tern__conn *c, tls_conn *t) {
    t->lower = c->tp;
    t->conn = c;
    rustls_connection_set_userdata(t->rc, t);
    t->base.ops = &tls_ops;
    tern__conn_set_transport(c, &t->base);
}

int tern__tls_attach(tern__conn *c, tern_tls *tls, const char *alpn) {
    tls_conn *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return -ENOMEM;
    tern__tls_lock(tls);
    const struct rustls_server_config *cfg = server_config(tls, alpn);
    tern__tls_unlock(tls);
    if (cfg == NULL || rustls_server_connection_new(cfg, &t->rc) != RUSTLS_RESULT_OK) {
        free(t);
        return -ENOMEM;
    }
    tern__tls_ref(tls);
    t->tls = tls;
    lower_attach(c, t);
    return 0;
}

/* ---- the client's side ------------------------------------------------ */

/* The opaque client context is rustls's client configuration. */
struct tern__tls_lib_client {
    const struct rustls_client_config *cfg;
};

/* --insecure: every server certificate is taken. */
static uint32_t accept_any(void *user, const struct rustls_verify_server_cert_params *params) {
    (void)user;
    (void)params;
    return RUSTLS_RESULT_OK;
}

/* The system's CA bundle (Debian's ca-certificates), when no CA file is
 * given. */
#define SYSTEM_CA_FILE "/etc/ssl/certs/ca-certificates.crt"

tern__tls_lib_client *tern__tls_lib_client_new(const char *ca_file, bool insecure, const char *alpn) {
    tern__tls_lib_client *cl = malloc(sizeof(*cl));
    if (cl == NULL)
        return NULL;
    uint16_t v[2];
    struct rustls_client_config_builder *b = NULL;
    rustls_result r = rustls_client_config_builder_new_custom(provider(), v,
                                                              versions(12, v), &b);
    struct rustls_slice_bytes protos[16];
    size_t np = alpn_slices(alpn, protos, 16);
    if (r == RUSTLS_RESULT_OK)
        r = rustls_client_config_builder_set_alpn_protocols(b, protos, np);
    const char *file = ca_file ? ca_file : SYSTEM_CA_FILE;
    if (r == RUSTLS_RESULT_OK && insecure) {
        r = rustls_client_config_builder_dangerous_set_certificate_verifier(b, accept_any);
    } else if (r == RUSTLS_RESULT_OK) {
        struct rustls_root_cert_store_builder *sb = rustls_root_cert_store_builder_new();
        const struct rustls_root_cert_store *store = NULL;
        r = rustls_root_cert_store_builder_load_roots_from_file(sb, file, ca_file != NULL);
        if (r == RUSTLS_RESULT_OK)
            r = rustls_root_cert_store_builder_build(sb, &store);
        rustls_root_cert_store_builder_free(sb);
        struct rustls_web_pki_server_cert_verifier_builder *vb =
            r == RUSTLS_RESULT_OK
                ? rustls_web_pki_server_cert_verifier_builder_new_with_provider(provider(), store)
                : NULL;
        struct rustls_server_cert_verifier *verifier = NULL;
        if (vb)
            r = rustls_web_pki_server_cert_verifier_builder_build(vb, &verifier);
        rustls_web_pki_server_cert_verifier_builder_free(vb);
        rustls_root_cert_store_free(store);
        if (r == RUSTLS_RESULT_OK)
            rustls_client_config_builder_set_server_verifier(b, verifier);
        rustls_server_cert_verifier_free(verifier);
    }
    const struct rustls_client_config *cfg = NULL;
    if (r == RUSTLS_RESULT_OK) {
        r = rustls_client_config_builder_build(b, &cfg);
        b = NULL;   /* consumed, built or not */
    }
    rustls_client_config_builder_free(b);
    if (r != RUSTLS_RESULT_OK) {
        rustls_err("client context, CA file", insecure ? NULL : file, r);
        free(cl);
        return NULL;
    }
    cl->cfg = cfg;
    return cl;
}

void tern__tls_lib_client_free(tern__tls_lib_client *cl) {
    if (cl == NULL)
        return;
    rustls_client_config_free(cl->cfg);   /* connections hold their own reference */
    free(cl);
}

int tern__tls_lib_client_attach(tern__conn *c, tern__tls_lib_client *cl, const char *name,
                            tern__tls_verify *verify_out) {
    tls_conn *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return -ENOMEM;
    /* rustls sends SNI for a host name only (RFC 6066 §3) and checks an
     * address against the certificate's IP entries. */
    if (rustls_client_connection_new(cl->cfg, name && name[0] ? name : "localhost", &t->rc) !=
        RUSTLS_RESULT_OK) {
        free(t);
        return -ENOMEM;
    }
    t->verify_out = verify_out;
    t->h.sniffed = true;   /* a server's first bytes are its own business */
    lower_attach(c, t);
    return 0;
}

/* rustls's version string is not NUL-terminated: copied once. */
static char library_name[128];
static pthread_once_t library_once = PTHREAD_ONCE_INIT;

/* rustls-ffi's version ("rustls-ffi/0.15.7/rustls/0.23.46/aws-lc-rs"),
 * whose last part names one provider, said as tern uses the two. */
static void library_copy(void) {
    struct rustls_str v = rustls_version();
    int n = (int)v.len;
    const char *slash = memrchr(v.data, '/', v.len);
    size_t tail = slash ? v.len - (size_t)(slash - v.data) : 0;
    if ((tail == 10 && memcmp(slash, "/aws-lc-rs", 10) == 0) ||
        (tail == 5 && memcmp(slash, "/ring", 5) == 0))
        n = (int)(slash - v.data);
    snprintf(library_name, sizeof(library_name), "%.*s; ring for records, aws-lc-rs for keys", n,
             v.data);
}

const char *tern__tls_lib_name(void) {
    pthread_once(&library_once, library_copy);
    return library_name;
}
