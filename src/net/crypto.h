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

#define TERN__SHA1_LEN 20
#define TERN__SHA256_LEN 32
/* The room base64 of len bytes takes, with its NUL. */
#define TERN__BASE64_SIZE(len) (((len) + 2) / 3 * 4 + 1)

/* SHA-1 of a then b (b may be NULL when blen is 0) into out. 0, or
 * -ENOMEM when the library could not do it (out is then untouched). */
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
/* Standard base64 (RFC 4648 §4, padded) of in into out, which has
 * TERN__BASE64_SIZE(len) bytes; NUL-terminated. Returns the length. */
size_t tern__crypto_base64(const void *in, size_t len, char *out);
/* len bytes from a cryptographically secure generator. 0, or -EIO. */
int tern__crypto_random(void *buf, size_t len);

#endif
