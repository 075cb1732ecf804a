/* Payload masking (RFC 6455 §5.3): every byte of a client frame's payload
 * is XORed with key[i % 4]. This is the one pass over every received byte
 * that cannot be avoided, so it runs as wide as the CPU allows.
 *
 * The wide variants (SSE2, AVX2) repeat the key across a register,
 * starting at the given phase (every 4 bytes the phase is the same again,
 * so one register serves the whole loop), and what is left under 16 bytes
 * goes 8 bytes at a time, then a byte at a time. They load and store
 * unaligned from the first byte of a short payload: it follows a 2 to 14
 * byte header, so it is almost never aligned, and an alignment head cost
 * more than the rest of a 64-byte payload (callgrind: 257 instructions a
 * 64 B frame with a head done a byte at a time, about 50 without). A long
 * payload is first brought to the register's alignment (ALIGN_FROM). The
 * portable variant aligns first, for CPUs where unaligned words cost
 * more. */
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

/* The key as it applies from `phase` on, as four bytes in memory order:
 * repeated across a wider word or register (the same four bytes again
 * and again in either byte order), it masks any multiple of 4 bytes that
 * starts at that phase. */
static uint32_t key_word(const uint8_t key[4], size_t phase) {
    uint8_t pat[4] = {key[phase & 3], key[(phase + 1) & 3], key[(phase + 2) & 3],
                      key[(phase + 3) & 3]};
    uint32_t w;
    memcpy(&w, pat, 4);
    return w;
}

/* 8 bytes at a time through memcpy (any alignment), then the tail.
 * Alone for short payloads; the head and the tail of the wide variants;
 * the body of the portable one. Returns the phase after data[len). */
static size_t mask_short(uint8_t *data, size_t len, const uint8_t key[4], size_t phase) {
    phase &= 3;
    if (len == 0)
        return phase;
    uint32_t w4 = key_word(key, phase);
    uint64_t k = (uint64_t)w4 << 32 | w4;
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

/* From this length on the wide variants first bring the data to their
 * register's alignment (the head by mask_short): unaligned stores that
 * straddle cache lines cost about a fifth more on a 1 MiB payload here,
 * while below it the head costs more than it saves. */
#define ALIGN_FROM 1024

__attribute__((target("sse2")))
static size_t mask_sse2(uint8_t *data, size_t len, const uint8_t key[4], size_t phase) {
    size_t i = len >= ALIGN_FROM ? head_len(data, len, 16) : 0;
    phase = mask_short(data, i, key, phase);
    __m128i k = _mm_set1_epi32((int)key_word(key, phase));
    for (; i + 32 <= len; i += 32) {
        __m128i a = _mm_loadu_si128((const __m128i *)(data + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(data + i + 16));
        _mm_storeu_si128((__m128i *)(data + i), _mm_xor_si128(a, k));
        _mm_storeu_si128((__m128i *)(data + i + 16), _mm_xor_si128(b, k));
    }
    if (i + 16 <= len) {
        __m128i a = _mm_loadu_si128((const __m128i *)(data + i));
        _mm_storeu_si128((__m128i *)(data + i), _mm_xor_si128(a, k));
        i += 16;
    }
    return mask_short(data + i, len - i, key, phase);
}

__attribute__((target("avx2")))
static size_t mask_avx2(uint8_t *data, size_t len, const uint8_t key[4], size_t phase) {
    size_t i = len >= ALIGN_FROM ? head_len(data, len, 32) : 0;
    phase = mask_short(data, i, key, phase);
    __m256i k = _mm256_set1_epi32((int)key_word(key, phase));
    for (; i + 64 <= len; i += 64) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(data + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(data + i + 32));
        _mm256_storeu_si256((__m256i *)(data + i), _mm256_xor_si256(a, k));
        _mm256_storeu_si256((__m256i *)(data + i + 32), _mm256_xor_si256(b, k));
    }
    if (i + 32 <= len) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(data + i));
        _mm256_storeu_si256((__m256i *)(data + i), _mm256_xor_si256(a, k));
        i += 32;
    }
    if (i + 16 <= len) {
        __m128i a = _mm_loadu_si128((const __m128i *)(data + i));
        _mm_storeu_si128((__m128i *)(data + i), _mm_xor_si128(a, _mm256_castsi256_si128(k)));
        i += 16;
    }
    return mask_short(data + i, len - i, key, phase);
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
    /* Short payloads (most pings, chat messages, market ticks): a wide
     * register's key pattern costs more than 8-byte words. */
    if (len < 32)
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
