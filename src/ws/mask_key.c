/* Masking keys for client frames (RFC 6455 §5.3, §10.3): "derived from a
 * strong source of entropy", a fresh one for every frame, so that a peer
 * or an intermediary cannot predict the bytes a frame puts on the wire.
 *
 * A client sends many small frames, so a system call or a locked library
 * generator per frame would cost more than the frame. Each thread keeps a
 * ChaCha20 generator (RFC 8439's block function) with fast key erasure: a
 * refill makes MASK_BLOCKS blocks under one key (counters 0, 1, ...),
 * four at a time side by side in vector registers; their first 32 bytes
 * become the next key at once and the other 992 serve as 248 masking
 * keys. A key costs about 65 instructions (one scalar block per 8 keys
 * cost 170, a fifth of what a 16-byte frame costs a client such as tern
 * load). The first key comes from getrandom(). A key handed out is never
 * in the state any more, and the state never produces a key it produced
 * before. */
#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include "loop/log.h"
#include "net/crypto.h"

#include "ws/ws.h"

#define MASK_LANES 4                         /* blocks side by side: one SSE2 register a word */
#define MASK_GROUPS 4                        /* of MASK_LANES blocks each, one after another */
#define MASK_BLOCKS (MASK_LANES * MASK_GROUPS)
#define MASK_OUT (MASK_BLOCKS * 64 - 32)   /* a refill's bytes that are not the next key */

/* Invariant: out[used..MASK_OUT) are masking-key bytes not yet handed
 * out; key is the ChaCha20 key of the next refill (seeded once seeded is
 * set). */
typedef struct mask_rng {
    uint32_t key[8];
    uint8_t out[MASK_OUT];
    uint16_t used;
    bool seeded;
} mask_rng;

static _Thread_local mask_rng rng = {.used = MASK_OUT};

/* One word of each of MASK_LANES blocks (GCC's and Clang's vector
 * extension: an SSE2 register on x86-64, plain words where there is no
 * vector unit). */
typedef uint32_t mask_vec __attribute__((vector_size(4 * MASK_LANES)));

#define QRV(a, b, c, d)                                                                       \
    do {                                                                                      \
        a += b; d ^= a; d = (d << 16) | (d >> 16);                                            \
        c += d; b ^= c; b = (b << 12) | (b >> 20);                                            \
        a += b; d ^= a; d = (d << 8) | (d >> 24);                                             \
        c += d; b ^= c; b = (b << 7) | (b >> 25);                                             \
    } while (0)

/* MASK_LANES ChaCha20 blocks with nonce 0 and counters first, first + 1,
 * ...: each key is used for one refill only, and the counter tells its
 * blocks apart. The blocks are computed side by side, one vector per word,
 * so each step of the rounds is one instruction for all of them (sixteen
 * words fill the sixteen SSE2 registers). out gets the words word-major
 * (word 0 of every block, then word 1, ...): the same keystream, permuted. */
static void chacha_lanes(const uint32_t key[8], uint32_t first, mask_vec out[16]) {
    static const uint32_t sigma[4] = {0x61707865, 0x3320646e, 0x79622d32, 0x6b206574};
    static const mask_vec lane = {0, 1, 2, 3};
    _Static_assert(MASK_LANES == 4, "lane numbers the blocks of a vector");
    mask_vec in[16], x[16];
    for (int w = 0; w < 16; w++) {
        uint32_t v = w < 4 ? sigma[w] : w < 12 ? key[w - 4] : 0;
        in[w] = (mask_vec){0} + v;   /* v in every lane */
    }
    in[12] += lane + first;          /* the block counters */
    for (int w = 0; w < 16; w++)
        x[w] = in[w];
    for (int i = 0; i < 10; i++) {
        QRV(x[0], x[4], x[8], x[12]);
        QRV(x[1], x[5], x[9], x[13]);
        QRV(x[2], x[6], x[10], x[14]);
        QRV(x[3], x[7], x[11], x[15]);
        QRV(x[0], x[5], x[10], x[15]);
        QRV(x[1], x[6], x[11], x[12]);
        QRV(x[2], x[7], x[8], x[13]);
        QRV(x[3], x[4], x[9], x[14]);
    }
    for (int w = 0; w < 16; w++)
        out[w] = x[w] + in[w];
}

/* getrandom() blocks only before the kernel's pool is first initialised
 * (early boot), and fails only where it does not exist (ENOSYS, a kernel
 * older than 3.17, or a seccomp filter): the TLS library's generator, which has
 * its own sources, seeds it then. */
static void seed(mask_rng *r) {
    uint8_t *p = (uint8_t *)r->key;
    size_t got = 0;
    while (got < sizeof(r->key)) {
        ssize_t n = getrandom(p + got, sizeof(r->key) - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            if (tern__crypto_random(p + got, sizeof(r->key) - got) < 0)
                tern__log(TERN_LOG_ERROR, TERN__LOG_RANDOM,
                          "ws: no random bytes for the masking keys: they are predictable");
            break;
        }
        got += (size_t)n;
    }
    r->seeded = true;
}

void tern__ws_mask_key(uint8_t key[4]) {
    mask_rng *r = &rng;
    if (r->used == sizeof(r->out)) {
        if (!r->seeded)
            seed(r);
        mask_vec block[MASK_GROUPS][16];
        for (int g = 0; g < MASK_GROUPS; g++)
            chacha_lanes(r->key, (uint32_t)(g * MASK_LANES), block[g]);
        memcpy(r->key, block, 32);
        memcpy(r->out, (uint8_t *)block + 32, sizeof(r->out));
        memset(block, 0, sizeof(block));
        r->used = 0;
    }
    memcpy(key, r->out + r->used, 4);
    memset(r->out + r->used, 0, 4);
    r->used += 4;
}
