/* The little cryptography the protocols need besides TLS: SHA-1 (the
 * WebSocket accept value), base64 and random bytes (the client's key, the
 * mask generator's seed). Implemented by the TLS library's file
 * (net/crypto_openssl.c), so a build links one library for both. */
#ifndef TERN_NET_CRYPTO_H
#define TERN_NET_CRYPTO_H

#include <stddef.h>
#include <stdint.h>

#include "tern/loop.h"   /* TERN_MUST_CHECK */

#define TERN__SHA1_LEN 20
/* The room base64 of len bytes takes, with its NUL. */
#define TERN__BASE64_SIZE(len) (((len) + 2) / 3 * 4 + 1)

/* SHA-1 of a then b (b may be NULL when blen is 0) into out. 0, or
 * -ENOMEM when the library could not do it (out is then untouched). */
TERN_MUST_CHECK
int tern__crypto_sha1(const void *a, size_t alen, const void *b, size_t blen,
                      uint8_t out[TERN__SHA1_LEN]);
/* Standard base64 (RFC 4648 §4, padded) of in into out, which has
 * TERN__BASE64_SIZE(len) bytes; NUL-terminated. Returns the length. */
size_t tern__crypto_base64(const void *in, size_t len, char *out);
/* len bytes from a cryptographically secure generator. 0, or -EIO. */
TERN_MUST_CHECK
int tern__crypto_random(void *buf, size_t len);

#endif
