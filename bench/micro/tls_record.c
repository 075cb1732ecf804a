/* tls_record: what one TLS record costs the library, with no socket.
 *
 * A client and a server session are joined by two memory BIOs (one each
 * way, each the writer's wbio and the reader's rbio), finish a TLS 1.3
 * handshake, and then echo: the client writes a message, the server reads
 * it and writes it back, the client reads it. The figure is nanoseconds
 * per round trip (four record operations: two seals, two opens), for
 * 64 B, 1 KiB and 16 KiB messages (16 KiB is one full record), for each
 * cipher suite, and for the ways a server may drive OpenSSL:
 *
 *   plain      the session as tern sets it, minus the two below;
 *   release    SSL_MODE_RELEASE_BUFFERS: the record buffers are freed
 *              whenever empty and taken again for the next record;
 *   clear      ERR_clear_error() before every SSL_read / SSL_write;
 *   tern       both, as net/tls_openssl.c did before #28;
 *   peek       ERR_clear_error() only when ERR_peek_error() finds an
 *              entry, before every call (tern since #28);
 *   aead       no TLS at all: the same four seals/opens through EVP with
 *              one context per direction, the floor of OpenSSL's AEAD.
 *
 * Usage: tls_record [--rounds N] [--ms MS]
 * For each suite and size, a round measures every mode one after the
 * other for about MS ms of the thread's CPU time (default 100), and
 * there are N rounds (default 5), so a disturbance from the rest of the
 * machine falls on all modes alike. Printed: the median and range of ns
 * per round trip, and each mode's median ratio to plain within a round.
 * Built by CMake (build/bench/tls_record), never run by ctest: the
 * figures depend on the machine and its load. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#define MAX_MSG 16384

/* The thread's CPU time, not the wall clock: other processes on the
 * machine take the core away without counting against the echo. */
static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void die(const char *what) {
    fprintf(stderr, "tls_record: %s\n", what);
    ERR_print_errors_fp(stderr);
    exit(1);
}

/* A self-signed P-256 certificate made in memory: the handshake is not
 * measured, only that it completes. */
static void make_cert(EVP_PKEY **key_out, X509 **cert_out) {
    EVP_PKEY *key = EVP_EC_gen("P-256");
    X509 *x = X509_new();
    if (key == NULL || x == NULL)
        die("key");
    ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
    X509_gmtime_adj(X509_getm_notBefore(x), 0);
    X509_gmtime_adj(X509_getm_notAfter(x), 3600);
    X509_set_pubkey(x, key);
    X509_NAME *n = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(n, "CN", MBSTRING_ASC, (const unsigned char *)"bench", -1, -1, 0);
    X509_set_issuer_name(x, n);
    if (X509_sign(x, key, EVP_sha256()) == 0)
        die("sign");
    *key_out = key;
    *cert_out = x;
}

typedef enum { MODE_PLAIN, MODE_RELEASE, MODE_CLEAR, MODE_TERN, MODE_PEEK, MODE_AEAD } mode;
static const char *const mode_names[] = {"plain", "release", "clear", "tern", "peek", "aead"};

/* How the error queue is emptied before each call. */
typedef enum { ERRQ_NONE, ERRQ_CLEAR, ERRQ_PEEK } errq;

static void errq_empty(errq q) {
    if (q == ERRQ_CLEAR || (q == ERRQ_PEEK && ERR_peek_error() != 0))
        ERR_clear_error();
}

/* Invariant: after pair_new, both sessions have finished the handshake and
 * both BIOs are empty. */
typedef struct pair {
    SSL_CTX *sctx, *cctx;
    SSL *server, *client;
} pair;

static bool handshake_step(SSL *s) {
    int r = SSL_do_handshake(s);
    if (r == 1)
        return true;
    int e = SSL_get_error(s, r);
    if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE)
        die("handshake");
    return false;
}

static void pair_new(pair *p, EVP_PKEY *key, X509 *cert, const char *suite, mode m) {
    p->sctx = SSL_CTX_new(TLS_server_method());
    p->cctx = SSL_CTX_new(TLS_client_method());
    if (p->sctx == NULL || p->cctx == NULL)
        die("context");
    SSL_CTX_set_min_proto_version(p->sctx, TLS1_3_VERSION);
    SSL_CTX_set_min_proto_version(p->cctx, TLS1_3_VERSION);
    if (SSL_CTX_set_ciphersuites(p->sctx, suite) != 1 ||
        SSL_CTX_set_ciphersuites(p->cctx, suite) != 1)
        die("ciphersuite");
    if (SSL_CTX_use_certificate(p->sctx, cert) != 1 || SSL_CTX_use_PrivateKey(p->sctx, key) != 1)
        die("certificate");
    /* tern's server modes (net/tls_openssl.c), less RELEASE_BUFFERS unless
     * that is the mode measured */
    long modes = SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER;
    if (m == MODE_RELEASE || m == MODE_TERN)
        modes |= SSL_MODE_RELEASE_BUFFERS;
    SSL_CTX_set_mode(p->sctx, modes);
    SSL_CTX_set_mode(p->cctx, modes);
    SSL_CTX_set_read_ahead(p->sctx, 1);
    SSL_CTX_set_read_ahead(p->cctx, 1);
    SSL_CTX_set_options(p->sctx, SSL_OP_NO_TICKET);   /* no session tickets left in the pipe */
    p->server = SSL_new(p->sctx);
    p->client = SSL_new(p->cctx);
    BIO *c2s = BIO_new(BIO_s_mem()), *s2c = BIO_new(BIO_s_mem());
    if (p->server == NULL || p->client == NULL || c2s == NULL || s2c == NULL)
        die("session");
    BIO_set_mem_eof_return(c2s, -1);   /* empty: "try again", not the end */
    BIO_set_mem_eof_return(s2c, -1);
    BIO_up_ref(c2s);
    BIO_up_ref(s2c);
    SSL_set_bio(p->client, s2c, c2s);   /* reads s2c, writes c2s */
    SSL_set_bio(p->server, c2s, s2c);
    SSL_set_connect_state(p->client);
    SSL_set_accept_state(p->server);
    bool cdone = false, sdone = false;
    for (int i = 0; i < 100 && !(cdone && sdone); i++) {
        cdone = handshake_step(p->client) || cdone;
        sdone = handshake_step(p->server) || sdone;
    }
    if (!cdone || !sdone)
        die("handshake did not finish");
}

static void pair_free(pair *p) {
    SSL_free(p->client);
    SSL_free(p->server);
    SSL_CTX_free(p->cctx);
    SSL_CTX_free(p->sctx);
}

static void write_all(SSL *s, const char *buf, size_t len, errq clear) {
    size_t n = 0;
    errq_empty(clear);
    if (SSL_write_ex(s, buf, len, &n) != 1 || n != len)
        die("write");
}

static void read_all(SSL *s, char *buf, size_t len, errq clear) {
    size_t got = 0;
    while (got < len) {
        size_t n = 0;
        errq_empty(clear);
        if (SSL_read_ex(s, buf + got, len - got, &n) != 1)
            die("read");
        got += n;
    }
}

static char msg[MAX_MSG], srv_buf[MAX_MSG], cli_buf[MAX_MSG];

/* ns per echo over TLS, for about ms milliseconds. */
static double echo_tls(pair *p, size_t len, errq clear, int ms) {
    uint64_t n = 0, t0 = now_ns(), end = t0 + (uint64_t)ms * 1000000u, t;
    do {
        for (int i = 0; i < 256; i++) {
            write_all(p->client, msg, len, clear);
            read_all(p->server, srv_buf, len, clear);
            write_all(p->server, srv_buf, len, clear);
            read_all(p->client, cli_buf, len, clear);
        }
        n += 256;
    } while ((t = now_ns()) < end);
    if (memcmp(cli_buf, msg, len) != 0)
        die("echo changed the message");
    return (double)(t - t0) / (double)n;
}

/* One AEAD direction: a context keyed once, a fresh nonce per record as
 * TLS 1.3 makes it (the sequence number into the IV). */
typedef struct aead {
    EVP_CIPHER_CTX *enc, *dec;
    unsigned char iv[12];
    uint64_t seq;
} aead;

static void aead_init(aead *a, const EVP_CIPHER *c) {
    unsigned char key[32] = {1};
    a->enc = EVP_CIPHER_CTX_new();
    a->dec = EVP_CIPHER_CTX_new();
    if (EVP_EncryptInit_ex(a->enc, c, NULL, key, NULL) != 1 ||
        EVP_DecryptInit_ex(a->dec, c, NULL, key, NULL) != 1)
        die("aead");
    memset(a->iv, 7, sizeof(a->iv));
    a->seq = 0;
}

static void aead_free(aead *a) {
    EVP_CIPHER_CTX_free(a->enc);
    EVP_CIPHER_CTX_free(a->dec);
}

static void nonce(aead *a, unsigned char out[12]) {
    memcpy(out, a->iv, 12);
    for (int i = 0; i < 8; i++)
        out[11 - i] ^= (unsigned char)(a->seq >> (8 * i));
    a->seq++;
}

static unsigned char sealed[MAX_MSG + 32];

/* Seals in into sealed and opens it into out, as a record's two ends do. */
static void seal_open(aead *a, const char *in, char *out, size_t len) {
    unsigned char iv[12], tag[16], hdr[5] = {23, 3, 3, 0, 0};
    int n = 0, f = 0;
    nonce(a, iv);
    if (EVP_EncryptInit_ex(a->enc, NULL, NULL, NULL, iv) != 1 ||
        EVP_EncryptUpdate(a->enc, NULL, &n, hdr, sizeof(hdr)) != 1 ||
        EVP_EncryptUpdate(a->enc, sealed, &n, (const unsigned char *)in, (int)len) != 1 ||
        EVP_EncryptFinal_ex(a->enc, sealed + n, &f) != 1 ||
        EVP_CIPHER_CTX_ctrl(a->enc, EVP_CTRL_AEAD_GET_TAG, 16, tag) != 1)
        die("seal");
    if (EVP_DecryptInit_ex(a->dec, NULL, NULL, NULL, iv) != 1 ||
        EVP_DecryptUpdate(a->dec, NULL, &n, hdr, sizeof(hdr)) != 1 ||
        EVP_DecryptUpdate(a->dec, (unsigned char *)out, &n, sealed, (int)len) != 1 ||
        EVP_CIPHER_CTX_ctrl(a->dec, EVP_CTRL_AEAD_SET_TAG, 16, tag) != 1 ||
        EVP_DecryptFinal_ex(a->dec, (unsigned char *)out + n, &f) != 1)
        die("open");
}

static double echo_aead(const EVP_CIPHER *c, size_t len, int ms) {
    aead up, down;
    aead_init(&up, c);
    aead_init(&down, c);
    uint64_t n = 0, t0 = now_ns(), end = t0 + (uint64_t)ms * 1000000u, t;
    do {
        for (int i = 0; i < 256; i++) {
            seal_open(&up, msg, srv_buf, len);
            seal_open(&down, srv_buf, cli_buf, len);
        }
        n += 256;
    } while ((t = now_ns()) < end);
    aead_free(&up);
    aead_free(&down);
    if (memcmp(cli_buf, msg, len) != 0)
        die("aead changed the message");
    return (double)(t - t0) / (double)n;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int rounds = 5, ms = 100;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (strcmp(argv[i], "--ms") == 0 && i + 1 < argc)
            ms = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: tls_record [--rounds N] [--ms MS]\n");
            return 2;
        }
    }
    if (rounds < 1 || rounds > 100 || ms < 1) {
        fprintf(stderr, "tls_record: --rounds 1..100, --ms > 0\n");
        return 2;
    }
    static const struct {
        const char *suite;
        const char *cipher;
    } suites[] = {
        {"TLS_AES_128_GCM_SHA256", "AES-128-GCM"},
        {"TLS_AES_256_GCM_SHA384", "AES-256-GCM"},
        {"TLS_CHACHA20_POLY1305_SHA256", "ChaCha20-Poly1305"},
    };
    static const size_t sizes[] = {64, 1024, 16384};
    for (size_t i = 0; i < sizeof(msg); i++)
        msg[i] = (char)(i * 31 + 7);
    EVP_PKEY *key;
    X509 *cert;
    make_cert(&key, &cert);
    printf("# %s; ns per round trip (2 seals + 2 opens) of thread CPU time: median [min-max] "
           "of %d rounds of %d ms, (ratio to plain)\n",
           OpenSSL_version(OPENSSL_VERSION), rounds, ms);
    printf("%-30s %-8s %29s %29s %29s\n", "suite", "mode", "64 B", "1 KiB", "16 KiB");
    enum { NMODES = MODE_AEAD + 1, NSIZES = sizeof(sizes) / sizeof(sizes[0]) };
    double *r = calloc((size_t)rounds * NMODES * 2, sizeof(*r));
    if (r == NULL)
        die("memory");
    char cells[NMODES][NSIZES][64];
    for (size_t s = 0; s < sizeof(suites) / sizeof(suites[0]); s++) {
        EVP_CIPHER *c = EVP_CIPHER_fetch(NULL, suites[s].cipher, NULL);
        if (c == NULL)
            die("cipher");
        for (size_t z = 0; z < NSIZES; z++) {
            /* r[m * rounds + k]: ns; r[(NMODES + m) * rounds + k]: ratio to plain */
            for (int k = 0; k < rounds; k++) {
                for (int m = MODE_PLAIN; m < NMODES; m++) {
                    double ns;
                    if (m == MODE_AEAD) {
                        ns = echo_aead(c, sizes[z], ms);
                    } else {
                        pair p;
                        pair_new(&p, key, cert, suites[s].suite, (mode)m);
                        ns = echo_tls(&p, sizes[z],
                                      m == MODE_CLEAR || m == MODE_TERN ? ERRQ_CLEAR
                                      : m == MODE_PEEK                  ? ERRQ_PEEK
                                                                        : ERRQ_NONE,
                                      ms);
                        pair_free(&p);
                    }
                    r[m * rounds + k] = ns;
                }
                for (int m = MODE_PLAIN; m < NMODES; m++)
                    r[(NMODES + m) * rounds + k] = r[m * rounds + k] / r[MODE_PLAIN * rounds + k];
            }
            for (int m = MODE_PLAIN; m < NMODES; m++) {
                double *ns = r + m * rounds, *ratio = r + (NMODES + m) * rounds;
                qsort(ns, (size_t)rounds, sizeof(*ns), cmp_double);
                qsort(ratio, (size_t)rounds, sizeof(*ratio), cmp_double);
                snprintf(cells[m][z], sizeof(cells[m][z]), "%.0f [%.0f-%.0f] (%.2f)",
                         ns[rounds / 2], ns[0], ns[rounds - 1], ratio[rounds / 2]);
            }
        }
        EVP_CIPHER_free(c);
        for (int m = MODE_PLAIN; m < NMODES; m++) {
            printf("%-30s %-8s", suites[s].suite, mode_names[m]);
            for (size_t z = 0; z < NSIZES; z++)
                printf(" %29s", cells[m][z]);
            printf("\n");
        }
        fflush(stdout);
    }
    free(r);
    X509_free(cert);
    EVP_PKEY_free(key);
    return 0;
}
