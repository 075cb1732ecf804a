/* Test inputs that end right before a PROT_NONE page (picohttpparser's
 * habit): a parser reading even one byte past what it was given faults at
 * once, in every build, not only under AddressSanitizer. */
#ifndef TERN_TEST_GUARD_H
#define TERN_TEST_GUARD_H

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Invariant: when map is not NULL, map[0..map_len) is mapped, its last
 * page is PROT_NONE, and data[0..len) ends where that page starts. */
typedef struct guard {
    char *map;
    size_t map_len;
    char *data;
    size_t len;
} guard;

/* Copies src[0..len) so that it ends at a guard page; returns the copy.
 * Aborts when memory cannot be mapped: a test cannot go on without it. */
static inline char *guard_put(guard *g, const void *src, size_t len) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t body = (len + page - 1) / page * page;
    char *map = mmap(NULL, body + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                     -1, 0);
    if (map == MAP_FAILED || mprotect(map + body, page, PROT_NONE) != 0)
        abort();
    g->map = map;
    g->map_len = body + page;
    g->data = map + body - len;
    g->len = len;
    if (len)
        memcpy(g->data, src, len);
    return g->data;
}

static inline void guard_free(guard *g) {
    if (g->map)
        munmap(g->map, g->map_len);
    g->map = g->data = NULL;
    g->map_len = g->len = 0;
}

/* The common case: one guarded input at a time. The previous one is
 * unmapped, so views into it must not be used after the next call. */
static inline char *guarded(const void *src, size_t len) {
    static guard g;
    guard_free(&g);
    return guard_put(&g, src, len);
}

#endif
