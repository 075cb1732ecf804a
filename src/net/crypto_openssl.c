/* net/crypto.h on OpenSSL's libcrypto. */
#include "net/crypto.h"

#include <errno.h>
#include <limits.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
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
