/* The server side of the WebSocket opening handshake (RFC 6455 §4.2). */
#ifndef TERN_WS_HANDSHAKE_H
#define TERN_WS_HANDSHAKE_H

#include <stdbool.h>
#include <stddef.h>

#include "tern/loop.h"   /* TERN_MUST_CHECK */

#define TERN__WS_ACCEPT_LEN 28   /* base64 of a 20-byte SHA-1 */

/* Is key a valid Sec-WebSocket-Key: base64 of exactly 16 bytes (24 chars
 * of the standard alphabet, the last two "==")? No whitespace is trimmed. */
bool tern__ws_key_valid(const char *key, size_t len);

/* Sec-WebSocket-Accept for a key: base64(SHA-1(key + GUID)), written to
 * out with a terminating NUL (TERN__WS_ACCEPT_LEN + 1 bytes). net/crypto.h
 * does the SHA-1 and the base64. Should it fail (out of memory), out is
 * the empty string, which any client refuses. */
void tern__ws_accept(const char *key, size_t len, char out[TERN__WS_ACCEPT_LEN + 1]);

/* Picks the first protocol of the client's Sec-WebSocket-Protocol list
 * (comma-separated, in the client's order of preference) that is in the
 * server's NULL-terminated list. Elements are trimmed of spaces and tabs
 * and compared exactly (names are case-sensitive). Returns its index in
 * the server's list, or -1 when none is shared (or supported is NULL). */
TERN_MUST_CHECK
int tern__ws_pick_subprotocol(const char *offer, size_t len, const char *const *supported);

#endif
