/* The one growable byte buffer, and the one growth policy, of the library.
 * The loop is the bottom layer, so every module may use it. */
#ifndef TERN_BYTES_H
#define TERN_BYTES_H

#include <stddef.h>

#include "tern/loop.h"   /* TERN_MUST_CHECK */

/* data[0..len) holds the bytes; data is malloc'd, or NULL while cap is 0.
 * A zeroed struct is an empty buffer. */
typedef struct tern__bytes {
    char *data;
    size_t len, cap;
} tern__bytes;

/* The capacity to grow to when `need` bytes must fit and `cap` are there:
 * doubling (so n appends cost O(n) copies in all), at least `need`, and at
 * least 256 bytes (so small buffers do not realloc for every piece).
 * SIZE_MAX when doubling would overflow; the caller's allocation then
 * fails. Buffers that are not a tern__bytes (net's, which carries its
 * bytes in the same allocation) grow by this too. */
size_t tern__bytes_grow_cap(size_t cap, size_t need);

/* Makes room for `more` bytes after data[len). 0, or -ENOMEM (the buffer
 * is then unchanged). Reserving 0 bytes allocates nothing. */
TERN_MUST_CHECK
int tern__bytes_reserve(tern__bytes *b, size_t more);
/* Appends p[0..n) (p may be NULL when n is 0). 0, or -ENOMEM. */
TERN_MUST_CHECK
int tern__bytes_append(tern__bytes *b, const void *p, size_t n);
/* Frees the bytes; b is then an empty buffer again. */
void tern__bytes_free(tern__bytes *b);

#endif
