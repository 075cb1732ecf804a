/* net/crypto.h on OpenSSL's libcrypto. */
#include "net/crypto.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>
#include <openssl/rand.h>

/* The digest md of a then b (b may be NULL when blen is 0) into out,
 * which takes want bytes. 0, or -ENOMEM (out untouched). */
static int digest(const EVP_MD *md, const void *a, size_t alen, const void *b, size_t blen,
                  uint8_t *out, unsigned int want) {
    unsigned char buf[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (ctx == NULL)
        return -ENOMEM;
    int ok = EVP_DigestInit_ex(ctx, md, NULL) == 1 && EVP_DigestUpdate(ctx, a, alen) == 1 &&
             (blen == 0 || EVP_DigestUpdate(ctx, b, blen) == 1) &&
             EVP_DigestFinal_ex(ctx, buf, &len) == 1 && len == want;
    EVP_MD_CTX_free(ctx);
    if (!ok) {
        ERR_clear_error();
        return -ENOMEM;
    }
    memcpy(out, buf, want);
    return 0;
}

int tern__crypto_sha1(const void *a, size_t alen, const void *b, size_t blen,
                      uint8_t out[TERN__SHA1_LEN]) {
    return digest(EVP_sha1(), a, alen, b, blen, out, TERN__SHA1_LEN);
}

int tern__crypto_sha256(const void *in, size_t len, uint8_t out[TERN__SHA256_LEN]) {
    return digest(EVP_sha256(), in, len, NULL, 0, out, TERN__SHA256_LEN);
}

bool tern__crypto_equal(const void *a, const void *b, size_t len) {
    return CRYPTO_memcmp(a, b, len) == 0;
}

void tern__crypto_wipe(void *buf, size_t len) { OPENSSL_cleanse(buf, len); }

int tern__crypto_hmac_sha256(const void *key, size_t klen, const void *msg, size_t mlen,
                             uint8_t out[TERN__SHA256_LEN]) {
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int ml = 0;
    if (klen > INT_MAX || HMAC(EVP_sha256(), key, (int)klen, msg, mlen, mac, &ml) == NULL ||
        ml != TERN__SHA256_LEN) {
        ERR_clear_error();
        return -ENOMEM;
    }
    memcpy(out, mac, TERN__SHA256_LEN);
    return 0;
}

/* Invariants: key is an RSA key of 2048 bits or more when alg is
 * TERN__CRYPTO_RS256, a P-256 key when TERN__CRYPTO_ES256. */
struct tern__crypto_pubkey {
    EVP_PKEY *key;
    tern__crypto_sig alg;
};

/* Which JWS algorithm k serves: 0 for none. */
static tern__crypto_sig sig_of(EVP_PKEY *k) {
    if (EVP_PKEY_is_a(k, "RSA"))
        return EVP_PKEY_get_bits(k) >= 2048 ? TERN__CRYPTO_RS256 : 0;
    if (!EVP_PKEY_is_a(k, "EC"))
        return 0;
    char group[64];
    size_t gl = 0;
    if (!EVP_PKEY_get_utf8_string_param(k, OSSL_PKEY_PARAM_GROUP_NAME, group, sizeof(group), &gl))
        return 0;
    return strcmp(group, "prime256v1") == 0 || strcmp(group, "P-256") == 0 ? TERN__CRYPTO_ES256
                                                                           : 0;
}

int tern__crypto_pubkey_pem(const char *pem, size_t len, tern__crypto_pubkey **out,
                            tern__crypto_sig *alg) {
    if (len > INT_MAX)
        return -EINVAL;
    BIO *bio = BIO_new_mem_buf(pem, (int)len);
    if (bio == NULL)
        return -ENOMEM;
    EVP_PKEY *k = PEM_read_bio_PUBKEY(bio, NULL, NULL, NULL);
    BIO_free(bio);
    tern__crypto_sig a = k ? sig_of(k) : 0;
    ERR_clear_error();
    if (a == 0) {
        EVP_PKEY_free(k);
        return -EINVAL;
    }
    tern__crypto_pubkey *pk = malloc(sizeof(*pk));
    if (pk == NULL) {
        EVP_PKEY_free(k);
        return -ENOMEM;
    }
    pk->key = k;
    pk->alg = a;
    *out = pk;
    *alg = a;
    return 0;
}

void tern__crypto_pubkey_free(tern__crypto_pubkey *k) {
    if (k == NULL)
        return;
    EVP_PKEY_free(k->key);
    free(k);
}

/* A JWS ES256 signature (r || s, 32 bytes each) as the DER OpenSSL
 * verifies, into der (cap bytes): its length, or 0. */
static size_t es256_der(const uint8_t *sig, unsigned char *der, size_t cap) {
    ECDSA_SIG *es = ECDSA_SIG_new();
    BIGNUM *r = BN_bin2bn(sig, 32, NULL), *s = BN_bin2bn(sig + 32, 32, NULL);
    if (es == NULL || r == NULL || s == NULL || !ECDSA_SIG_set0(es, r, s)) {
        BN_free(r);
        BN_free(s);
        ECDSA_SIG_free(es);
        return 0;
    }
    int dl = i2d_ECDSA_SIG(es, NULL);
    if (dl > 0 && (size_t)dl <= cap) {
        unsigned char *p = der;
        dl = i2d_ECDSA_SIG(es, &p);
    } else {
        dl = 0;
    }
    ECDSA_SIG_free(es);
    return dl > 0 ? (size_t)dl : 0;
}

bool tern__crypto_pubkey_verify(const tern__crypto_pubkey *k, const void *msg, size_t len,
                                const uint8_t *sig, size_t slen) {
    unsigned char der[80];
    if (k->alg == TERN__CRYPTO_ES256) {
        if (slen != 64 || (slen = es256_der(sig, der, sizeof(der))) == 0)
            return false;
        sig = der;
    }
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    bool ok = md && EVP_DigestVerifyInit(md, NULL, EVP_sha256(), NULL, k->key) == 1 &&
              EVP_DigestVerify(md, sig, slen, msg, len) == 1;
    EVP_MD_CTX_free(md);
    ERR_clear_error();
    return ok;
}

size_t tern__crypto_base64(const void *in, size_t len, char *out) {
    /* EVP_EncodeBlock takes an int; every caller here encodes a few bytes */
    if (len > INT_MAX / 4 * 3) {
        out[0] = '\0';
        return 0;
    }
    return (size_t)EVP_EncodeBlock((unsigned char *)out, in, (int)len);
}

int tern__crypto_random(void *buf, size_t len) {
    if (len > INT_MAX || RAND_bytes(buf, (int)len) != 1) {
        ERR_clear_error();
        return -EIO;
    }
    return 0;
}
