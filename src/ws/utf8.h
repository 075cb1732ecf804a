/* Incremental UTF-8 validation (RFC 3629): a text message is checked as its
 * fragments arrive, so an invalid byte fails the connection at once (1007)
 * and a sequence may be split across frames and reads. */
#ifndef TERN_WS_UTF8_H
#define TERN_WS_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TERN__UTF8_ACCEPT 0u   /* between code points: the start state */
#define TERN__UTF8_REJECT 1u   /* invalid: sticky */

/* Feeds bytes to the validator whose state is *state (start at
 * TERN__UTF8_ACCEPT). Runs of ASCII are skipped several bytes at a time.
 * Returns false as soon as the input cannot be valid UTF-8 (overlong forms,
 * surrogates, code points above U+10FFFF, bad continuation bytes). */
bool tern__utf8_feed(uint32_t *state, const uint8_t *data, size_t len);

/* Is the whole input so far valid, ending on a code point boundary? */
static inline bool tern__utf8_complete(uint32_t state) { return state == TERN__UTF8_ACCEPT; }

/* One-shot check of a whole buffer. */
bool tern__utf8_valid(const uint8_t *data, size_t len);

#endif
