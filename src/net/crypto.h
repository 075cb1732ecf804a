/* The little cryptography the protocols need besides TLS: SHA-1 (the
 * WebSocket accept value), base64 and random bytes (the client's key, the
 * mask generator's seed); and what tern serve needs to keep a secret
 * (SHA-256, a constant-time compare, a wipe the compiler keeps), so that
 * no file outside net/tls_*.c and net/crypto_*.c names a cryptography
 * library. Implemented on libcrypto (net/crypto_openssl.c), which every
 * build links. */
#ifndef TERN_NET_CRYPTO_H
#define TERN_NET_CRYPTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tern/loop.h"   /* TERN_MUST_CHECK */

#define TERN__SHA1_LEN 20
#define TERN__SHA256_LEN 32
/* The room base64 of len bytes takes, with its NUL. */
#define TERN__BASE64_SIZE(len) (((len) + 2) / 3 * 4 + 1)

/* SHA-1 of a then b (b may be NULL when blen is 0) into out. 0, or
 * -ENOMEM when the library could not do it (out is then untouched). */
TERN_MUST_CHECK
int tern__crypto_sha1(const void *a, size_t alen, const void *b, size_t blen,
                      uint8_t out[TERN__SHA1_LEN]);
/* SHA-256 of in (len bytes) into out. 0, or -ENOMEM when the library
 * could not do it (out is then untouched). */
int tern__crypto_sha256(const void *in, size_t len, uint8_t out[TERN__SHA256_LEN]);
/* Are a and b (len bytes each) equal? In a time that depends on len
 * only, not on where they differ: for comparing secrets. */
bool tern__crypto_equal(const void *a, const void *b, size_t len);
/* Overwrites buf (len bytes) with zeros in a way the compiler does not
 * remove as a dead store: a secret's memory before it is freed. */
void tern__crypto_wipe(void *buf, size_t len);
/* HMAC-SHA-256 of msg (mlen bytes) with key (klen bytes) into out. 0, or
 * -ENOMEM when the library could not do it. */
int tern__crypto_hmac_sha256(const void *key, size_t klen, const void *msg, size_t mlen,
                             uint8_t out[TERN__SHA256_LEN]);

/* A public key that verifies JWS signatures (RFC 7518 §3.3, §3.4), for
 * tern serve's tokens: RSA of 2048 bits or more (RS256, RSASSA-PKCS1-v1_5
 * with SHA-256) or ECDSA on P-256 (ES256, SHA-256, the signature r || s
 * of 32 bytes each). */
typedef struct tern__crypto_pubkey tern__crypto_pubkey;
typedef enum tern__crypto_sig {
    TERN__CRYPTO_RS256 = 1,
    TERN__CRYPTO_ES256,
} tern__crypto_sig;

/* Reads a PEM public key (SubjectPublicKeyInfo, len bytes). 0 with *out
 * and *alg set; -EINVAL (not a PEM public key, or one of another kind or
 * size), -ENOMEM. */
int tern__crypto_pubkey_pem(const char *pem, size_t len, tern__crypto_pubkey **out,
                            tern__crypto_sig *alg);
/* Does sig (slen bytes) verify msg (len bytes) under k, with k's
 * algorithm? false for any failure. */
bool tern__crypto_pubkey_verify(const tern__crypto_pubkey *k, const void *msg, size_t len,
                                const uint8_t *sig, size_t slen);
void tern__crypto_pubkey_free(tern__crypto_pubkey *k);

/* Standard base64 (RFC 4648 §4, padded) of in into out, which has
 * TERN__BASE64_SIZE(len) bytes; NUL-terminated. Returns the length. */
size_t tern__crypto_base64(const void *in, size_t len, char *out);
/* len bytes from a cryptographically secure generator. 0, or -EIO. */
TERN_MUST_CHECK
int tern__crypto_random(void *buf, size_t len);

#endif
