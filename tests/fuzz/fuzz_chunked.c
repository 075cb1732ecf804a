/* The chunked-body decoder on arbitrary bytes.
 *
 * The decoder is incremental, so the property that matters is that the
 * split of the input into reads changes nothing: decoding all at once and
 * decoding in pieces (sizes taken from the first input byte) must give the
 * same data, the same outcome and the same end offset. Data views must lie
 * inside the piece they came from. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "http/chunked.h"

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond))                                                                               \
            abort();                                                                               \
    } while (0)

typedef struct outcome {
    int result;       /* DONE, ERROR, or MORE when the input ran out */
    size_t end;       /* offset just past the body on DONE */
    uint8_t *data;    /* the decoded body */
    size_t data_len;
} outcome;

static void decode(const uint8_t *in, size_t len, size_t step, outcome *o) {
    tern__chunked d;
    tern__chunked_init(&d);
    o->data = malloc(len ? len : 1);
    o->data_len = 0;
    o->result = TERN__CHUNKED_MORE;
    size_t off = 0;
    while (off < len) {
        size_t n = len - off < step ? len - off : step;
        /* Each piece in its own allocation: reads past it are caught. */
        char *piece = malloc(n);
        memcpy(piece, in + off, n);
        size_t pos = 0;
        int r;
        do {
            size_t used;
            const char *data;
            size_t data_len;
            r = tern__chunked_decode(&d, piece + pos, n - pos, &used, &data, &data_len, 256);
            CHECK(used <= n - pos);
            if (r == TERN__CHUNKED_DATA) {
                CHECK(data >= piece + pos && data + data_len <= piece + pos + used);
                CHECK(data_len > 0);
                memcpy(o->data + o->data_len, data, data_len);
                o->data_len += data_len;
            }
            pos += used;
        } while (r == TERN__CHUNKED_DATA && pos < n);
        free(piece);
        if (r == TERN__CHUNKED_DONE || r == TERN__CHUNKED_ERROR) {
            o->result = r;
            o->end = off + pos;
            return;
        }
        if (r == TERN__CHUNKED_MORE)
            CHECK(pos == n);
        off += n;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    size_t step = (size_t)data[0] % 17 + 1;
    data++;
    size--;
    outcome whole, pieces;
    decode(data, size, size ? size : 1, &whole);
    decode(data, size, step, &pieces);
    CHECK(whole.result == pieces.result);
    if (whole.result != TERN__CHUNKED_ERROR) {
        CHECK(whole.data_len == pieces.data_len);
        CHECK(memcmp(whole.data, pieces.data, whole.data_len) == 0);
    }
    if (whole.result == TERN__CHUNKED_DONE)
        CHECK(whole.end == pieces.end);
    free(whole.data);
    free(pieces.data);
    return 0;
}
