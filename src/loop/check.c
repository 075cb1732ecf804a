/* The checked build's helpers (check.h). */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "loop/check.h"

#ifdef TERN_CHECKED

void tern__check_fail(const char *call, const char *what, const char *file, int line) {
    fprintf(stderr, "tern: %s: %s (%s:%d)\n", call, what, file, line);
    fflush(stderr);
    abort();
}

void tern__check_warn(const char *call, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    fprintf(stderr, "tern: %s: %s\n", call, what);
    fflush(stderr);
}

/* The last freed objects, freed for real when pushed out. A global array:
 * what is in it at exit is still reachable, so no leak checker reports it.
 * Any thread may free (tern_tls_free, tern_ws_prepared_free). */
#define TERN__QUARANTINE 256
static _Atomic(void *) quarantine[TERN__QUARANTINE];
static atomic_uint quarantine_next;

void tern__check_free(void *p) {
    if (p == NULL)
        return;
    unsigned i = atomic_fetch_add(&quarantine_next, 1) % TERN__QUARANTINE;
    free(atomic_exchange(&quarantine[i], p));
}

#else

void tern__check_free(void *p) { free(p); }

#endif
