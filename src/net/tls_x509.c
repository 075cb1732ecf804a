/* net/tls_x509.h: certificates' names and subjects, on libcrypto. */
#include "net/tls_x509.h"

#include <limits.h>

#include <openssl/err.h>
#include <openssl/x509v3.h>

void tern__tls_x509_names(tern__tls_names *nm, X509 *x) {
    tern__tls_names_free(nm);
    GENERAL_NAMES *sans = X509_get_ext_d2i(x, NID_subject_alt_name, NULL, NULL);
    if (sans) {
        for (int i = 0; i < sk_GENERAL_NAME_num(sans); i++) {
            GENERAL_NAME *g = sk_GENERAL_NAME_value(sans, i);
            if (g->type == GEN_DNS)
                tern__tls_names_add(nm, (const char *)ASN1_STRING_get0_data(g->d.dNSName),
                                    (size_t)ASN1_STRING_length(g->d.dNSName));
        }
        GENERAL_NAMES_free(sans);
    }
    if (nm->n == 0) {
        char cn[256];
        int n = X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, cn, sizeof(cn));
        if (n > 0)
            tern__tls_names_add(nm, cn, (size_t)n);
    }
    ERR_clear_error();
}

void tern__tls_x509_subject(X509 *x, char *subject, size_t cap) {
    subject[0] = '\0';
    BIO *b = BIO_new(BIO_s_mem());
    if (b && X509_NAME_print_ex(b, X509_get_subject_name(x), 0, XN_FLAG_RFC2253) >= 0) {
        int n = BIO_read(b, subject, (int)(cap - 1 > INT_MAX ? INT_MAX : cap - 1));
        subject[n > 0 ? n : 0] = '\0';
    }
    BIO_free(b);
    ERR_clear_error();
}
