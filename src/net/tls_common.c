/* net/tls_common.h: the parts of the TLS files that are no TLS library's. */
#include "net/tls_common.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/x509v3.h>

#include "loop/log.h"

void tern__tls_names_free(tern__tls_names *nm) {
    for (int i = 0; i < nm->n; i++)
        free(nm->names[i]);
    nm->n = 0;
}

static void add_name(tern__tls_names *nm, const char *name, size_t len) {
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

void tern__tls_names_read(tern__tls_names *nm, X509 *x) {
    tern__tls_names_free(nm);
    GENERAL_NAMES *sans = X509_get_ext_d2i(x, NID_subject_alt_name, NULL, NULL);
    if (sans) {
        for (int i = 0; i < sk_GENERAL_NAME_num(sans); i++) {
            GENERAL_NAME *g = sk_GENERAL_NAME_value(sans, i);
            if (g->type == GEN_DNS)
                add_name(nm, (const char *)ASN1_STRING_get0_data(g->d.dNSName),
                         (size_t)ASN1_STRING_length(g->d.dNSName));
        }
        GENERAL_NAMES_free(sans);
    }
    if (nm->n == 0) {
        char cn[256];
        int n = X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, cn, sizeof(cn));
        if (n > 0)
            add_name(nm, cn, (size_t)n);
    }
    ERR_clear_error();
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

void tern__tls_subject(X509 *x, char *subject, size_t cap) {
    subject[0] = '\0';
    BIO *b = BIO_new(BIO_s_mem());
    if (b && X509_NAME_print_ex(b, X509_get_subject_name(x), 0, XN_FLAG_RFC2253) >= 0) {
        int n = BIO_read(b, subject, (int)(cap - 1 > INT_MAX ? INT_MAX : cap - 1));
        subject[n > 0 ? n : 0] = '\0';
    }
    BIO_free(b);
    ERR_clear_error();
}

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

int tern__tls_options_check(const tern_tls_options *opt) {
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
