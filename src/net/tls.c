/* net/tls.c: tern_tls and the whole public TLS API (tern/tls.h), for
 * every TLS library: the options and their checks, the certificate files,
 * the key sets and their reload-and-swap, the reference count and the
 * lock. What the library does (load a key, attach a session, move
 * records) is behind net/tls_lib.h, in net/tls_<lib>.c. Also here: what
 * the library files' transports share and no library does for them (the
 * plain-HTTP check on a TLS port, SNI name matching, tern's words for a
 * verification result). */
#include "net/tls_lib.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "loop/check.h"
#include "loop/log.h"

/* ---- key sets --------------------------------------------------------- */

/* One certificate and key: the files it came from, for reloads, and the
 * library's key made of them. */
typedef struct tls_cert {
    char *cert_file, *key_file;
    tern__tls_key *key;
} tls_cert;

/* One generation of certificates (see tern__tls_keyset in tls_lib.h).
 * Invariants: certs[0] is the default; every certs[i].key is loaded.
 * refs counts who may still read a key of it: the tern_tls while it is
 * the present set, and each handshake that picked a key from it and has
 * not unpinned it yet. The last to let go frees it. */
struct tern__tls_keyset {
    atomic_int refs;
    int n;
    tls_cert *certs;
};

/* Invariants: lock guards set (the present key set, which tern_tls_reload
 * replaces while other threads handshake), the growth of set by
 * tern_tls_add_cert, and lib (the library's state, tern__tls_lib_state).
 * conf is set by tern_tls_new_opt and never changes, so it is read
 * unlocked. nsets counts the sets not yet freed: 1, plus those replaced
 * that a handshake still pins. refs counts the caller's reference and
 * each listener's (and, on rustls, each server session's). */
struct tern_tls {
    uint32_t magic;   /* TERN__MAGIC_TLS until freed (loop/check.h) */
    pthread_mutex_t lock;
    atomic_int refs;
    tern__tls_keyset *set;
    atomic_int nsets;
    void *lib;
    tern__tls_conf conf;
};

const tern__tls_conf *tern__tls_conf_of(const tern_tls *tls) { return &tls->conf; }

void **tern__tls_lib_state(tern_tls *tls) { return &tls->lib; }

void tern__tls_lock(tern_tls *tls) { pthread_mutex_lock(&tls->lock); }

void tern__tls_unlock(tern_tls *tls) { pthread_mutex_unlock(&tls->lock); }

static void cert_free(tls_cert *c) {
    tern__tls_key_free(c->key);
    free(c->cert_file);
    free(c->key_file);
}

/* A set of n certificates, zeroed, with one reference (its maker's),
 * counted in tls->nsets; NULL when out of memory. */
static tern__tls_keyset *keyset_new(tern_tls *tls, int n) {
    tern__tls_keyset *set = calloc(1, sizeof(*set));
    tls_cert *certs = n ? calloc((size_t)n, sizeof(*certs)) : NULL;
    if (set == NULL || (n && certs == NULL)) {
        free(set);
        free(certs);
        return NULL;
    }
    atomic_init(&set->refs, 1);
    set->n = n;
    set->certs = certs;
    atomic_fetch_add(&tls->nsets, 1);
    return set;
}

/* Lets go of one reference to set (NULL: nothing); the last frees it. */
static void keyset_put(tern_tls *tls, tern__tls_keyset *set) {
    if (set == NULL || atomic_fetch_sub(&set->refs, 1) != 1)
        return;
    for (int i = 0; i < set->n; i++)
        cert_free(&set->certs[i]);
    free(set->certs);
    free(set);
    atomic_fetch_sub(&tls->nsets, 1);
}

/* Adds a certificate to the present set. Called with tls->lock held (or
 * before anyone else knows tls): a handshake holds the library's key, not
 * a place in the array, so moving the array moves nothing it reads. */
static int cert_add(tern_tls *tls, const char *cert_file, const char *key_file) {
    if (cert_file == NULL || key_file == NULL)
        return -EINVAL;
    tls_cert c = {.cert_file = strdup(cert_file), .key_file = strdup(key_file)};
    int err = c.cert_file && c.key_file ? tern__tls_key_load(tls, cert_file, key_file, &c.key)
                                        : -ENOMEM;
    tern__tls_keyset *set = tls->set;
    tls_cert *certs = err ? NULL : realloc(set->certs, (size_t)(set->n + 1) * sizeof(*certs));
    if (certs == NULL) {
        cert_free(&c);
        return err ? err : -ENOMEM;
    }
    certs[set->n++] = c;
    set->certs = certs;
    return 0;
}

/* ---- the public API ----------------------------------------------------- */

/* The checks of tern_tls_new_opt's options every library makes: 0, or
 * -EINVAL (two passphrase sources, a bad version or verify mode, a client
 * CA with no verification or the reverse), -ENOENT (a passphrase file or
 * client CA file that cannot be read; logged). */
static int options_check(const tern_tls_options *opt) {
    if (opt == NULL)
        return 0;
    if (opt->passphrase && opt->passphrase_file)
        return -EINVAL;   /* two sources: which one is meant? */
    if (opt->passphrase_file && access(opt->passphrase_file, R_OK) < 0) {
        /* Said now, not only when an encrypted key happens to need it. */
        tern__log(TERN_LOG_WARN, TERN__LOG_LISTEN, "tls: cannot read the passphrase file %s: %s",
                  opt->passphrase_file, strerror(errno));
        return -ENOENT;   /* as for a certificate or key that cannot be read */
    }
    if ((opt->min_version != 0 && opt->min_version != 12 && opt->min_version != 13) ||
        opt->client_verify < TERN_TLS_VERIFY_NONE || opt->client_verify > TERN_TLS_VERIFY_REQUIRE ||
        (opt->client_verify != TERN_TLS_VERIFY_NONE) != (opt->client_ca_file != NULL))
        return -EINVAL;   /* a CA with nothing asked, or asking with no CA: which was meant? */
    if (opt->client_ca_file && access(opt->client_ca_file, R_OK) < 0) {
        tern__log(TERN_LOG_WARN, TERN__LOG_LISTEN, "tls: cannot read the client CA file %s: %s",
                  opt->client_ca_file, strerror(errno));
        return -ENOENT;
    }
    return 0;
}

/* opt into conf (strings duplicated): 0 or -ENOMEM. */
static int conf_copy(tern__tls_conf *conf, const tern_tls_options *opt) {
    conf->min_version = 12;
    if (opt == NULL)
        return 0;
    conf->passphrase = opt->passphrase;
    conf->passphrase_user = opt->passphrase_user;
    conf->min_version = opt->min_version == 13 ? 13 : 12;
    conf->client_verify = opt->client_verify;
    if ((opt->passphrase_file && (conf->passphrase_file = strdup(opt->passphrase_file)) == NULL) ||
        (opt->ciphers && (conf->ciphers = strdup(opt->ciphers)) == NULL) ||
        (opt->ciphersuites && (conf->ciphersuites = strdup(opt->ciphersuites)) == NULL) ||
        (opt->client_ca_file && (conf->client_ca_file = strdup(opt->client_ca_file)) == NULL))
        return -ENOMEM;
    return 0;
}

int tern_tls_new_opt(tern_tls **out, const char *cert_file, const char *key_file,
                     const tern_tls_options *opt) {
    if (out == NULL)
        return -EINVAL;
    *out = NULL;
    int oerr = tern__tls_lib_check(opt);
    if (oerr == 0)
        oerr = options_check(opt);
    if (oerr < 0)
        return oerr;
    tern_tls *tls = calloc(1, sizeof(*tls));
    if (tls == NULL)
        return -ENOMEM;
    tls->magic = TERN__MAGIC_TLS;
    pthread_mutex_init(&tls->lock, NULL);
    atomic_init(&tls->refs, 1);
    atomic_init(&tls->nsets, 0);
    int err = conf_copy(&tls->conf, opt);
    if (err == 0 && (tls->set = keyset_new(tls, 0)) == NULL)
        err = -ENOMEM;
    if (err == 0)
        err = cert_add(tls, cert_file, key_file);
    if (err < 0) {
        tern_tls_free(tls);
        return err;
    }
    *out = tls;
    return 0;
}

int tern_tls_new(tern_tls **out, const char *cert_file, const char *key_file) {
    return tern_tls_new_opt(out, cert_file, key_file, NULL);
}

int tern_tls_add_cert(tern_tls *tls, const char *cert_file, const char *key_file) {
    if (tls == NULL)
        return -EINVAL;
    TERN__ASSERT_MAGIC(tls, TERN__MAGIC_TLS, "tern_tls");
    pthread_mutex_lock(&tls->lock);
    int err = cert_add(tls, cert_file, key_file);
    pthread_mutex_unlock(&tls->lock);
    return err;
}

int tern_tls_reload(tern_tls *tls) {
    if (tls == NULL)
        return -EINVAL;
    TERN__ASSERT_MAGIC(tls, TERN__MAGIC_TLS, "tern_tls");
    /* Load all first, outside the lock; swap only if every one loaded. */
    pthread_mutex_lock(&tls->lock);
    int n = tls->set->n;
    tern__tls_keyset *fresh = keyset_new(tls, n);
    int err = fresh ? 0 : -ENOMEM;
    for (int i = 0; i < n && err == 0; i++) {
        fresh->certs[i].cert_file = strdup(tls->set->certs[i].cert_file);
        fresh->certs[i].key_file = strdup(tls->set->certs[i].key_file);
        err = fresh->certs[i].cert_file && fresh->certs[i].key_file ? 0 : -ENOMEM;
    }
    pthread_mutex_unlock(&tls->lock);
    for (int i = 0; i < n && err == 0; i++)
        err = tern__tls_key_load(tls, fresh->certs[i].cert_file, fresh->certs[i].key_file,
                                 &fresh->certs[i].key);
    if (err < 0) {
        keyset_put(tls, fresh);
        return err;
    }
    pthread_mutex_lock(&tls->lock);
    tern__tls_keyset *old = tls->set;
    tls->set = fresh;
    pthread_mutex_unlock(&tls->lock);
    keyset_put(tls, old);   /* freed now, unless a handshake still pins it */
    return 0;
}

void tern__tls_ref(tern_tls *tls) { atomic_fetch_add(&tls->refs, 1); }

void tern_tls_free(tern_tls *tls) {
    if (tls == NULL)
        return;
    TERN__ASSERT_MAGIC(tls, TERN__MAGIC_TLS, "tern_tls");
    if (atomic_fetch_sub(&tls->refs, 1) != 1)
        return;
    keyset_put(tls, tls->set);   /* the last: no handshake holds tls any more */
    tern__tls_lib_free(tls->lib);
    free(tls->conf.passphrase_file);
    free(tls->conf.ciphers);
    free(tls->conf.ciphersuites);
    free(tls->conf.client_ca_file);
    pthread_mutex_destroy(&tls->lock);
    tls->magic = TERN__MAGIC_DEAD;
    tern__check_free(tls);
}

const char *tern_tls_library(void) { return tern__tls_lib_name(); }

/* ---- picking a key ------------------------------------------------------ */

const tern__tls_key *tern__tls_pick(tern_tls *tls, const char *name, size_t len,
                                    tern__tls_keyset **pin) {
    pthread_mutex_lock(&tls->lock);
    tern__tls_keyset *set = tls->set;
    const tern__tls_key *key = set->certs[0].key;
    for (int i = 1; len && i < set->n; i++)
        if (tern__tls_names_match(tern__tls_key_names(set->certs[i].key), name, len)) {
            key = set->certs[i].key;
            break;
        }
    atomic_fetch_add(&set->refs, 1);   /* under lock: a reload cannot free it first */
    pthread_mutex_unlock(&tls->lock);
    *pin = set;
    return key;
}

void tern__tls_unpin(tern_tls *tls, tern__tls_keyset *pin) { keyset_put(tls, pin); }

int tern__tls_sets_alive(tern_tls *tls) { return atomic_load(&tls->nsets); }

/* ---- names -------------------------------------------------------------- */

void tern__tls_names_add(tern__tls_names *nm, const char *name, size_t len) {
    if (nm->n == TERN__TLS_MAX_NAMES || len == 0)
        return;
    char *n = strndup(name, len);
    if (n == NULL)
        return;
    for (char *p = n; *p; p++)
        if (*p >= 'A' && *p <= 'Z')
            *p = (char)(*p - 'A' + 'a');
    nm->names[nm->n++] = n;
}

void tern__tls_names_free(tern__tls_names *nm) {
    for (int i = 0; i < nm->n; i++)
        free(nm->names[i]);
    nm->n = 0;
}

/* Does pattern (a certificate name, maybe "*.example.com") cover name? */
static bool name_matches(const char *pattern, const char *name, size_t len) {
    size_t pl = strlen(pattern);
    if (pl == len && strncasecmp(pattern, name, len) == 0)
        return true;
    if (pl > 2 && pattern[0] == '*' && pattern[1] == '.') {
        const char *dot = memchr(name, '.', len);
        size_t rest = dot ? len - (size_t)(dot - name) : 0;
        return dot && dot != name && rest == pl - 1 && strncasecmp(dot, pattern + 1, rest) == 0;
    }
    return false;
}

bool tern__tls_names_match(const tern__tls_names *nm, const char *name, size_t len) {
    for (int i = 0; i < nm->n; i++)
        if (name_matches(nm->names[i], name, len))
            return true;
    return false;
}

/* ---- the transports' helpers -------------------------------------------- */

void tern__tls_peer_text(const tern__conn *c, char *buf, size_t cap) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getpeername(c->io.fd, (struct sockaddr *)&ss, &sl) < 0 ||
        tern_addr_format((struct sockaddr *)&ss, sl, buf, cap) < 0)
        snprintf(buf, cap, "-");
}

/* Does a connection's first bytes (n of them, 1 to 4) start a plain HTTP
 * request rather than a TLS record (content type 22, handshake)? The
 * methods a browser, curl or a script would send. */
static bool looks_like_http(const char *p, size_t n) {
    static const char methods[][5] = {"GET ", "POST", "HEAD", "PUT ",
                                      "OPTI", "DELE", "PATC", "CONN"};
    for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++)
        if (memcmp(p, methods[i], n) == 0)
            return true;
    return false;
}

/* The answer nginx gives, so the person at the browser learns what to do
 * instead of seeing a connection reset. */
#define PLAIN_HTTP_BODY \
    "The plain HTTP request was sent to HTTPS port: this port expects TLS (https://).\n"
static const char plain_http_answer[] = "HTTP/1.1 400 Bad Request\r\n"
                                        "Content-Type: text/plain\r\n"
                                        "Content-Length: 81\r\n"
                                        "Connection: close\r\n"
                                        "\r\n" PLAIN_HTTP_BODY;
_Static_assert(sizeof(PLAIN_HTTP_BODY) - 1 == 81, "Content-Length is the body's");

ssize_t tern__tls_sniff(tern__conn *c, const tern__transport *lower, tern__tls_head *h, char *buf,
                        size_t len) {
    const tern__transport_ops *low = lower->ops;
    /* The first bytes, kept in h for the TLS library (tern__tls_head_take). */
    ssize_t n = low->recv(c, h->buf, sizeof(h->buf));
    if (n == -EAGAIN)
        return -EAGAIN;
    h->sniffed = true;
    if (n <= 0) {
        h->failure_logged = true;   /* closed or reset having sent nothing: a probe, no handshake */
        return n;
    }
    h->len = (uint8_t)n;
    /* A TLS record: TLS. A request cut before its 4th byte is judged on
     * what came: waiting for more would spin on a level-triggered readable
     * socket. */
    if (h->buf[0] == 0x16 || !looks_like_http(h->buf, (size_t)n))
        return 1;
    h->failure_logged = true;
    /* What has come, bounded: a sender that never stops is not waited for. */
    for (int i = 0; i < 4 && low->recv(c, buf, len) == (ssize_t)len; i++)
        ;
    struct iovec answer = {(void *)plain_http_answer, sizeof(plain_http_answer) - 1};
    (void)low->send(c, &answer, 1);
    if (tern__log_on(TERN_LOG_DEBUG)) {
        char peer[TERN_ADDRSTRLEN];
        tern__tls_peer_text(c, peer, sizeof(peer));
        tern__log(TERN_LOG_DEBUG, TERN__LOG_TLS_HANDSHAKE,
                  "tls: plain HTTP from %s on the TLS port: 400, closing", peer);
    }
    return -EPROTO;
}

size_t tern__tls_head_take(tern__tls_head *h, char *buf, size_t len) {
    size_t n = (size_t)(h->len - h->off) < len ? (size_t)(h->len - h->off) : len;
    memcpy(buf, h->buf + h->off, n);
    h->off = (uint8_t)(h->off + n);
    return n;
}

const char *tern__tls_verify_string(tern__tls_verify v) {
    switch (v) {
    case TERN__TLS_VERIFY_OK:
        return "the certificate is valid";
    case TERN__TLS_VERIFY_UNTRUSTED:
        return "the certificate is not signed by a trusted CA (self-signed or unknown issuer)";
    case TERN__TLS_VERIFY_NAME_MISMATCH:
        return "the certificate does not carry the server's name";
    case TERN__TLS_VERIFY_EXPIRED:
        return "the certificate has expired";
    case TERN__TLS_VERIFY_NOT_YET_VALID:
        return "the certificate is not valid yet";
    case TERN__TLS_VERIFY_OTHER:
        break;
    }
    return "the certificate was refused";
}

ssize_t tern__tls_send_file(tern__conn *c, int fd, off_t *off, size_t len) {
    static _Thread_local char piece[16384];
    ssize_t r = pread(fd, piece, len < sizeof(piece) ? len : sizeof(piece), *off);
    if (r < 0)
        return -errno;
    if (r == 0)
        return 0;
    struct iovec iov = {piece, (size_t)r};
    ssize_t w = c->tp->ops->send(c, &iov, 1);
    if (w > 0)
        *off += w;
    return w;
}

size_t tern__tls_lower_unsent(const tern__conn *c, const tern__transport *lower) {
    return lower->ops->unsent ? lower->ops->unsent(c) : 0;
}

/* ---- client contexts, shared ------------------------------------------- */

/* A client context and the settings it was made with. Making one loads
 * the CA store (the system's: a hundred-odd certificates parsed, tens of
 * milliseconds, more on a busy machine) on the caller's loop, so the
 * connections that ask for the same settings share one: `tern load`'s
 * hundred wss connections made a context each, and the loop spent
 * seconds before it read the first answer, past the first connection's
 * handshake deadline. Invariants: on `shared` while refs > 0, under
 * shared_lock; alpn is the caller's constant string; ca_file a copy. */
struct tern__tls_client {
    struct tern__tls_client *next;
    tern__tls_lib_client *lib;
    char *ca_file;          /* NULL: the system's CAs */
    bool insecure;
    const char *alpn;
    unsigned refs;
};

static pthread_mutex_t shared_lock = PTHREAD_MUTEX_INITIALIZER;
static tern__tls_client *shared;

static bool same_file(const char *a, const char *b) {
    return a == b || (a && b && strcmp(a, b) == 0);
}

tern__tls_client *tern__tls_client_new(const char *ca_file, bool insecure, const char *alpn) {
    pthread_mutex_lock(&shared_lock);
    tern__tls_client *cl = shared;
    while (cl && !(cl->insecure == insecure && strcmp(cl->alpn, alpn) == 0 &&
                   (insecure || same_file(cl->ca_file, ca_file))))
        cl = cl->next;
    if (cl) {
        cl->refs++;
        pthread_mutex_unlock(&shared_lock);
        return cl;
    }
    /* Made under the lock: two loops asking at once load the store once. */
    cl = calloc(1, sizeof(*cl));
    if (cl && (!ca_file || insecure || (cl->ca_file = strdup(ca_file)) != NULL) &&
        (cl->lib = tern__tls_lib_client_new(ca_file, insecure, alpn)) != NULL) {
        cl->insecure = insecure;
        cl->alpn = alpn;
        cl->refs = 1;
        cl->next = shared;
        shared = cl;
    } else if (cl) {
        free(cl->ca_file);
        free(cl);
        cl = NULL;
    }
    pthread_mutex_unlock(&shared_lock);
    return cl;
}

void tern__tls_client_free(tern__tls_client *cl) {
    if (cl == NULL)
        return;
    pthread_mutex_lock(&shared_lock);
    bool last = --cl->refs == 0;
    if (last) {
        tern__tls_client **p = &shared;
        while (*p != cl)
            p = &(*p)->next;
        *p = cl->next;
    }
    pthread_mutex_unlock(&shared_lock);
    if (last) {
        tern__tls_lib_client_free(cl->lib);   /* sessions hold their own reference */
        free(cl->ca_file);
        free(cl);
    }
}

int tern__tls_client_attach(tern__conn *c, tern__tls_client *cl, const char *name,
                            tern__tls_verify *verify_out) {
    return tern__tls_lib_client_attach(c, cl->lib, name, verify_out);
}
