/* The growable byte buffer (see bytes.h). */
#include "loop/bytes.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { TERN__BYTES_MIN = 256 };

size_t tern__bytes_grow_cap(size_t cap, size_t need) {
    size_t n = cap <= SIZE_MAX / 2 ? cap * 2 : SIZE_MAX;
    if (n < need)
        n = need;
    return n < TERN__BYTES_MIN ? TERN__BYTES_MIN : n;
}

int tern__bytes_reserve(tern__bytes *b, size_t more) {
    if (b->cap - b->len >= more)
        return 0;
    if (more > SIZE_MAX - b->len)
        return -ENOMEM;
    size_t cap = tern__bytes_grow_cap(b->cap, b->len + more);
    char *d = realloc(b->data, cap);
    if (d == NULL)
        return -ENOMEM;
    b->data = d;
    b->cap = cap;
    return 0;
}

int tern__bytes_append(tern__bytes *b, const void *p, size_t n) {
    if (n == 0)
        return 0;
    int err = tern__bytes_reserve(b, n);
    if (err < 0)
        return err;
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

void tern__bytes_free(tern__bytes *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}
