/* The checked build (CMake TERN_CHECKED, on in the sanitizer build): misuse
 * of the API that the release build cannot afford to see, or can only
 * answer with an error, aborts there with the call's name.
 *
 * - TERN__ASSERT(cond, what): in the checked build, when cond is false,
 *   prints "tern: CALL: what (file:line)" to stderr and aborts, CALL being
 *   the function the assertion is in (__func__: put it in the public call
 *   itself, so the name is the user's). In the release build it compiles
 *   to nothing and cond is not evaluated.
 * - Magic fields: an object the user frees (tern_tls, tern_ws_prepared,
 *   tern_timer, tern_server) holds a magic number of its kind from its
 *   creation; its free sets TERN__MAGIC_DEAD and gives the memory to
 *   tern__check_free. In the checked build that keeps the last
 *   TERN__QUARANTINE freed objects before really freeing them, so a second
 *   free (or a call on a freed object) finds the dead magic and is reported,
 *   rather than being undefined behaviour. In the release build it is
 *   free(): a call on a freed object stays undefined behaviour there.
 * - Loop threads: see tern__loop_thread_ok (loop.h). */
#ifndef TERN_LOOP_CHECK_H
#define TERN_LOOP_CHECK_H

#include <stdbool.h>
#include <stdint.h>

/* Per kind, so that a pointer to the wrong kind of object is caught too. */
enum {
    TERN__MAGIC_TLS = 0x746c7331u,      /* "tls1" */
    TERN__MAGIC_PREPARED = 0x70726531u, /* "pre1" */
    TERN__MAGIC_TIMER = 0x746d7231u,    /* "tmr1" */
    TERN__MAGIC_SERVER = 0x73727631u,   /* "srv1" */
    TERN__MAGIC_DEAD = 0xdeadf7eeu,
};

#ifdef TERN_CHECKED
__attribute__((noreturn)) void tern__check_fail(const char *call, const char *what,
                                                const char *file, int line);
#define TERN__ASSERT(cond, what) \
    ((cond) ? (void)0 : tern__check_fail(__func__, (what), __FILE__, __LINE__))
#else
/* sizeof: cond is not evaluated, but its variables count as used. */
#define TERN__ASSERT(cond, what) ((void)sizeof((cond) ? 1 : 0))
#endif

/* A mistake that loses nothing tern needs but is the caller's loss (data
 * tern was handed and cannot give back): in the checked build, one line
 * "tern: CALL: what" on stderr, and the program goes on; nothing in the
 * release build (the arguments are not evaluated). */
#ifdef TERN_CHECKED
void tern__check_warn(const char *call, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
#define TERN__WARN(call, ...) tern__check_warn((call), __VA_ARGS__)
#else
#define TERN__WARN(call, ...) ((void)0)
#endif

/* The assertion every call on a user-freed object makes on entry. */
#define TERN__ASSERT_MAGIC(obj, m, kind)                                          \
    TERN__ASSERT((obj)->magic == (m), (obj)->magic == TERN__MAGIC_DEAD            \
                                          ? "the " kind " was already freed"     \
                                          : "not a " kind " (corrupt or wrong pointer)")

/* free(p) in the release build; in the checked build p is kept (poisoned
 * by its owner) among the last freed objects and freed later. */
void tern__check_free(void *p);

#endif
