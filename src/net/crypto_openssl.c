/* net/crypto.h on OpenSSL's libcrypto. */
#include "net/crypto.h"

#include <errno.h>
#include <limits.h>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

int tern__crypto_sha1(const void *a, size_t alen, const void *b, size_t blen,
                      uint8_t out[TERN__SHA1_LEN]) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int md_len = 0;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (ctx == NULL)
        return -ENOMEM;
    int ok = EVP_DigestInit_ex(ctx, EVP_sha1(), NULL) == 1 && EVP_DigestUpdate(ctx, a, alen) == 1 &&
             (blen == 0 || EVP_DigestUpdate(ctx, b, blen) == 1) &&
             EVP_DigestFinal_ex(ctx, md, &md_len) == 1 && md_len == TERN__SHA1_LEN;
    EVP_MD_CTX_free(ctx);
    if (!ok) {
        ERR_clear_error();
        return -ENOMEM;
    }
    for (int i = 0; i < TERN__SHA1_LEN; i++)
        out[i] = md[i];
    return 0;
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
