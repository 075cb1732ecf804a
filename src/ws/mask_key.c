/* Masking keys for client frames (RFC 6455 §5.3, §10.3): "derived from a
 * strong source of entropy", a fresh one for every frame, so that a peer
 * or an intermediary cannot predict the bytes a frame puts on the wire.
 *
 * A client sends many small frames, so a system call or a locked library
 * generator per frame would cost more than the frame. Each thread keeps a
 * ChaCha20 generator (RFC 8439's block function) with fast key erasure: a
 * refill makes MASK_BLOCKS blocks with one key (counters 0, 1, ...), whose
 * first 32 bytes become the next key at once and whose other bytes serve
 * as masking keys (120 of them: a block is about a thousand instructions,
 * so a key costs under a hundred, where one block per 8 keys cost twice
 * that, a fifth of a small frame's cost to a client). The first key comes
 * from getrandom(). A key handed out is never in the state any more, and
 * the state never produces a key it produced before. */
#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include <openssl/rand.h>

#include "ws/ws.h"

#define MASK_BLOCKS 8
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

static uint32_t rotl(uint32_t x, int n) { return (x << n) | (x >> (32 - n)); }

#define QR(a, b, c, d)                                                                        \
    do {                                                                                      \
        a += b; d ^= a; d = rotl(d, 16);                                                      \
        c += d; b ^= c; b = rotl(b, 12);                                                      \
        a += b; d ^= a; d = rotl(d, 8);                                                       \
        c += d; b ^= c; b = rotl(b, 7);                                                       \
    } while (0)

/* One ChaCha20 block with nonce 0: each key is used for one refill only,
 * and the counter tells its blocks apart. */
static void chacha_block(const uint32_t key[8], uint32_t counter, uint32_t out[16]) {
    uint32_t in[16] = {0x61707865, 0x3320646e, 0x79622d32, 0x6b206574};
    memcpy(in + 4, key, 32);
    in[12] = counter;
    uint32_t x[16];
    memcpy(x, in, sizeof(x));
    for (int i = 0; i < 10; i++) {
        QR(x[0], x[4], x[8], x[12]);
        QR(x[1], x[5], x[9], x[13]);
        QR(x[2], x[6], x[10], x[14]);
        QR(x[3], x[7], x[11], x[15]);
        QR(x[0], x[5], x[10], x[15]);
        QR(x[1], x[6], x[11], x[12]);
        QR(x[2], x[7], x[8], x[13]);
        QR(x[3], x[4], x[9], x[14]);
    }
    for (int i = 0; i < 16; i++)
        out[i] = x[i] + in[i];
}

/* getrandom() blocks only before the kernel's pool is first initialised
 * (early boot), and fails only where it does not exist (ENOSYS, a kernel
 * older than 3.17, or a seccomp filter): OpenSSL's generator, which has
 * its own sources, seeds it then. */
static void seed(mask_rng *r) {
    uint8_t *p = (uint8_t *)r->key;
    size_t got = 0;
    while (got < sizeof(r->key)) {
        ssize_t n = getrandom(p + got, sizeof(r->key) - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            RAND_bytes(p, (int)sizeof(r->key));
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
        uint32_t block[MASK_BLOCKS][16];
        for (uint32_t b = 0; b < MASK_BLOCKS; b++)
            chacha_block(r->key, b, block[b]);
        memcpy(r->key, block[0], 32);
        memcpy(r->out, (uint8_t *)block + 32, sizeof(r->out));
        memset(block, 0, sizeof(block));
        r->used = 0;
    }
    memcpy(key, r->out + r->used, 4);
    memset(r->out + r->used, 0, 4);
    r->used += 4;
}
