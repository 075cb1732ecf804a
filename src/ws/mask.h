/* The implementations behind tern__ws_mask (frame.h), one per instruction
 * set, exposed so the tests can hold each against a byte-by-byte reference
 * on any machine that has it. Callers use tern__ws_mask. */
#ifndef TERN_WS_MASK_H
#define TERN_WS_MASK_H

#include <stddef.h>
#include <stdint.h>

typedef size_t (*tern__ws_mask_fn)(uint8_t *data, size_t len, const uint8_t key[4], size_t phase);

enum tern__ws_mask_kind {
    TERN__WS_MASK_PORTABLE,   /* 8 bytes at a time, any CPU */
    TERN__WS_MASK_SSE2,       /* 16 bytes at a time (x86) */
    TERN__WS_MASK_AVX2,       /* 32 bytes at a time (x86) */
};

/* The implementation of that kind, or NULL when this build or this CPU
 * does not have it. Each one has tern__ws_mask's contract. */
tern__ws_mask_fn tern__ws_mask_variant(enum tern__ws_mask_kind kind);

#endif
