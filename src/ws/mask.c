/* Payload masking (RFC 6455 §5.3): every byte of a client frame's payload
 * is XORed with key[i % 4]. This is the one pass over every received byte
 * that cannot be avoided, so it runs as wide as the CPU allows.
 *
 * All variants work the same way: bytes one at a time until the data is
 * aligned for the wide loop, then the key repeated across a register
 * starting at the phase reached there (a multiple of 4 bytes later the
 * phase is the same again, so one register serves the whole loop), then
 * the tail one byte at a time. */
#include "ws/frame.h"
#include "ws/mask.h"

#include <stdatomic.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#define TERN__MASK_X86 1
#include <immintrin.h>
#endif

static size_t mask_bytes(uint8_t *data, size_t len, const uint8_t key[4], size_t phase) {
    for (size_t i = 0; i < len; i++)
        data[i] ^= key[(phase + i) & 3];
    return (phase + len) & 3;
}

/* pat[0..n) = the key as it applies from `phase` on; n is 8, 16 or 32.
 * Four bytes, then doubled: this runs once per call, also for tiny frames. */
static void key_pattern(uint8_t *pat, size_t n, const uint8_t key[4], size_t phase) {
    for (size_t i = 0; i < 4; i++)
        pat[i] = key[(phase + i) & 3];
    for (size_t i = 4; i < n; i *= 2)
        memcpy(pat + i, pat, i);
}

/* 8 bytes at a time through memcpy (any alignment), then the tail. Used
 * alone for short payloads, where a wide loop's alignment head and tail
 * would be the whole payload, done a byte at a time; and as the body of
 * the portable variant, after its head. */
static size_t mask_short(uint8_t *data, size_t len, const uint8_t key[4], size_t phase) {
    phase &= 3;
    uint8_t pat[8];
    key_pattern(pat, sizeof(pat), key, phase);
    uint64_t k;
    memcpy(&k, pat, 8);
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, data + i, 8);
        w ^= k;
        memcpy(data + i, &w, 8);
    }
    return mask_bytes(data + i, len - i, key, phase); /* i % 4 == 0: same phase */
}

/* Bytes before data + off reaches a multiple of `align`, capped at len. */
static size_t head_len(const uint8_t *data, size_t len, size_t align) {
    size_t mis = (uintptr_t)data & (align - 1);
    size_t head = mis ? align - mis : 0;
    return head < len ? head : len;
}

/* Aligned 8-byte words for CPUs where unaligned ones cost more. */
static size_t mask_portable(uint8_t *data, size_t len, const uint8_t key[4], size_t phase) {
    phase &= 3;
    size_t i = head_len(data, len, 8);
    mask_bytes(data, i, key, phase);
    return mask_short(data + i, len - i, key, (phase + i) & 3);
}

#ifdef TERN__MASK_X86

__attribute__((target("sse2")))
static size_t mask_sse2(uint8_t *data, size_t len, const uint8_t key[4], size_t phase) {
    phase &= 3;
    size_t i = head_len(data, len, 16);
    mask_bytes(data, i, key, phase);
    size_t ph = (phase + i) & 3;
    uint8_t pat[16];
    key_pattern(pat, sizeof(pat), key, ph);
    __m128i k = _mm_loadu_si128((const __m128i *)pat);
    for (; i + 32 <= len; i += 32) {
        __m128i a = _mm_load_si128((const __m128i *)(data + i));
        __m128i b = _mm_load_si128((const __m128i *)(data + i + 16));
        _mm_store_si128((__m128i *)(data + i), _mm_xor_si128(a, k));
        _mm_store_si128((__m128i *)(data + i + 16), _mm_xor_si128(b, k));
    }
    if (i + 16 <= len) {
        __m128i a = _mm_load_si128((const __m128i *)(data + i));
        _mm_store_si128((__m128i *)(data + i), _mm_xor_si128(a, k));
        i += 16;
    }
    return mask_bytes(data + i, len - i, key, ph);
}

__attribute__((target("avx2")))
static size_t mask_avx2(uint8_t *data, size_t len, const uint8_t key[4], size_t phase) {
    phase &= 3;
    size_t i = head_len(data, len, 32);
    mask_bytes(data, i, key, phase);
    size_t ph = (phase + i) & 3;
    uint8_t pat[32];
    key_pattern(pat, sizeof(pat), key, ph);
    __m256i k = _mm256_loadu_si256((const __m256i *)pat);
    for (; i + 64 <= len; i += 64) {
        __m256i a = _mm256_load_si256((const __m256i *)(data + i));
        __m256i b = _mm256_load_si256((const __m256i *)(data + i + 32));
        _mm256_store_si256((__m256i *)(data + i), _mm256_xor_si256(a, k));
        _mm256_store_si256((__m256i *)(data + i + 32), _mm256_xor_si256(b, k));
    }
    if (i + 32 <= len) {
        __m256i a = _mm256_load_si256((const __m256i *)(data + i));
        _mm256_store_si256((__m256i *)(data + i), _mm256_xor_si256(a, k));
        i += 32;
    }
    if (i + 16 <= len) {
        __m128i k16 = _mm256_castsi256_si128(k);
        __m128i a = _mm_load_si128((const __m128i *)(data + i));
        _mm_store_si128((__m128i *)(data + i), _mm_xor_si128(a, k16));
        i += 16;
    }
    return mask_bytes(data + i, len - i, key, ph);
}

#endif /* TERN__MASK_X86 */

tern__ws_mask_fn tern__ws_mask_variant(enum tern__ws_mask_kind kind) {
    switch (kind) {
    case TERN__WS_MASK_PORTABLE:
        return mask_portable;
#ifdef TERN__MASK_X86
    case TERN__WS_MASK_SSE2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("sse2") ? mask_sse2 : NULL;
    case TERN__WS_MASK_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") ? mask_avx2 : NULL;
#endif
    default:
        return NULL;
    }
}

static tern__ws_mask_fn resolve(void) {
    tern__ws_mask_fn f = tern__ws_mask_variant(TERN__WS_MASK_AVX2);
    if (f == NULL)
        f = tern__ws_mask_variant(TERN__WS_MASK_SSE2);
    if (f == NULL)
        f = mask_portable;
    return f;
}

/* Resolved on first use. Threads racing there all compute the same
 * pointer, and it carries no other data with it, so relaxed order is
 * enough. */
static _Atomic(tern__ws_mask_fn) chosen;

size_t tern__ws_mask(uint8_t *data, size_t len, const uint8_t key[4], size_t phase) {
    /* Short payloads (most pings, chat messages, market ticks) are done
     * before a wide loop would have got past its alignment head. */
    if (len < 64)
        return mask_short(data, len, key, phase);
    tern__ws_mask_fn f = atomic_load_explicit(&chosen, memory_order_relaxed);
    if (f == NULL) {
        f = resolve();
        atomic_store_explicit(&chosen, f, memory_order_relaxed);
    }
    return f(data, len, key, phase);
}

void tern__ws_mask_copy(uint8_t *dst, const uint8_t *src, size_t len, const uint8_t key[4]) {
    uint32_t k4;
    memcpy(&k4, key, 4);
    size_t i = 0;
#if defined(__SSE2__)
    /* 16 bytes at a time, unaligned: the cork's write position has no
     * alignment, and an alignment head done byte by byte would cost more
     * than the whole of a small payload (SSE2 is part of x86-64). */
    __m128i k16 = _mm_set1_epi32((int)k4);
    for (; i + 16 <= len; i += 16) {
        __m128i w = _mm_loadu_si128((const __m128i *)(src + i));
        _mm_storeu_si128((__m128i *)(dst + i), _mm_xor_si128(w, k16));
    }
#endif
    uint64_t k = (uint64_t)k4 << 32 | k4;   /* the key twice: phase 0 at every 8th byte */
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, src + i, 8);
        w ^= k;
        memcpy(dst + i, &w, 8);
    }
    for (; i < len; i++)
        dst[i] = src[i] ^ key[i & 3];
}
