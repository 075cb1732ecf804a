/* permessage-deflate decompression of anything a peer might send, in
 * fragments and messages, under a small size limit: the output never
 * passes the limit, the buffer never grows past it, errors are the
 * documented ones. And compression of the same bytes round-trips.
 *
 * Input: an options byte (window, context takeover), a limit byte, then
 * fragments, each a length byte and that many bytes (the high bit of the
 * length byte ends the message). */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ws/deflate.h"

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond))                                                                               \
            abort();                                                                               \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2)
        return 0;
    uint8_t opt = data[0];
    int bits = 8 + (opt & 7);
    bool nct = opt & 8;
    size_t max_len = (size_t)data[1] * 64;   /* 0 .. 16320 */
    const uint8_t *p = data + 2;
    size_t n = size - 2;

    tern__pmd_inflater *inf = tern__pmd_inflater_new(bits + (opt >> 7));
    CHECK(inf != NULL);
    tern__bytes out = {0};
    while (n > 0) {
        size_t k = p[0] & 0x7F;
        bool last = (p[0] & 0x80) || n == 1;
        p++;
        n--;
        if (k > n)
            k = n;
        /* The fragment in its own allocation, for ASan's sake. */
        uint8_t *frag = malloc(k ? k : 1);
        memcpy(frag, p, k);
        int r = tern__pmd_inflate(inf, frag, k, last, nct, &out, max_len);
        free(frag);
        CHECK(r == 0 || r == -EINVAL || r == -EMSGSIZE || r == -ENOMEM);
        CHECK(out.len <= max_len + (r == -EMSGSIZE ? 1 : 0));
        CHECK(out.cap <= max_len + 1 || out.cap == 0);
        p += k;
        n -= k;
        if (r != 0 || last)
            out.len = 0;   /* a new message, or after an error a new stream */
    }
    tern__bytes_free(&out);
    tern__pmd_inflater_free(inf);

    /* The input as a message: compressed and back, in two fragments. */
    size_t whole = size - 2;
    tern__pmd_deflater *d = tern__pmd_deflater_new(bits, 1 + (opt >> 4) % 9);
    CHECK(d != NULL);
    uint8_t *z;
    ssize_t zn = tern__pmd_deflate(d, data + 2, whole, nct, &z);
    CHECK(zn > 0);
    inf = tern__pmd_inflater_new(bits);
    size_t cut = (size_t)data[1] % ((size_t)zn + 1);
    CHECK(tern__pmd_inflate(inf, z, cut, false, nct, &out, whole) == 0);
    CHECK(tern__pmd_inflate(inf, z + cut, (size_t)zn - cut, true, nct, &out, whole) == 0);
    CHECK(out.len == whole && (whole == 0 || memcmp(out.data, data + 2, whole) == 0));
    free(z);
    tern__bytes_free(&out);
    tern__pmd_deflater_free(d);
    tern__pmd_inflater_free(inf);
    return 0;
}
