/* Incremental decoder of the chunked transfer coding (RFC 9112 §7.1).
 *
 * The decoder never copies: it walks the input and hands out views of the
 * chunk data in it. Chunk extensions are skipped (bounded), trailers are
 * read and dropped (bounded). Anything malformed, and any chunk size that
 * does not fit in 63 bits, is an error: the caller answers 400 and closes. */
#ifndef TERN_HTTP_CHUNKED_H
#define TERN_HTTP_CHUNKED_H

#include <stddef.h>
#include <stdint.h>

#include "tern/loop.h"   /* TERN_MUST_CHECK */

/* Invariant: state is one of the decoder's private states; remaining is the
 * number of data bytes left in the current chunk while in the data state;
 * count bounds the bytes spent in an extension or in the trailer section. */
typedef struct tern__chunked {
    uint8_t state;
    uint64_t remaining;
    uint32_t count;
} tern__chunked;

enum {
    TERN__CHUNKED_MORE = 0,   /* all input consumed; feed more */
    TERN__CHUNKED_DATA = 1,   /* (*data, *data_len) is a view of chunk data */
    TERN__CHUNKED_DONE = 2,   /* last chunk and trailers read: the body is over */
    TERN__CHUNKED_ERROR = -1, /* malformed: answer 400 and close */
};

/* Zero-initialising the struct is the start state too. */
void tern__chunked_init(tern__chunked *d);

/* Decodes from buf[0..len). Sets *consumed to the bytes used (always set).
 * On TERN__CHUNKED_DATA the span is inside buf and *consumed is just past
 * it; call again with the rest. On DONE, bytes after *consumed belong to
 * the next request. max_trailer bounds the trailer section (and each
 * extension) in bytes. */
TERN_MUST_CHECK
int tern__chunked_decode(tern__chunked *d, const char *buf, size_t len, size_t *consumed,
                         const char **data, size_t *data_len, size_t max_trailer);

#endif
