/* tern's log hook: one per process.
 *
 * The library writes nothing by itself. Give it a function and it reports
 * what an operator wants to know: descriptors running out (EMFILE back-off),
 * listener errors, refused requests and upgrades, connections closed by a
 * limit or a timeout, slow consumers. Each kind of message is limited to a
 * few lines per second; the first line after a quiet spell says how many
 * were suppressed.
 *
 * The hook is process-wide (every loop, every thread): set it before
 * starting the loops. fn may be called from any loop's thread, at the same
 * time from several; msg is valid during the call only. */
#ifndef TERN_LOG_H
#define TERN_LOG_H

#ifdef __cplusplus
extern "C" {
#endif

/* libtern.so exports what this header declares, and nothing else. */
#pragma GCC visibility push(default)

enum tern_log_level {
    TERN_LOG_ERROR = 0,   /* something is broken: a listener failed */
    TERN_LOG_WARN = 1,    /* the process is short of something: descriptors, memory */
    TERN_LOG_INFO = 2,    /* policy at work: slow consumers dropped or closed */
    TERN_LOG_DEBUG = 3,   /* every refusal: 4xx/5xx before a handler, refused upgrades,
                             failed TLS handshakes */
};

typedef void (*tern_log_fn)(int level, const char *msg, void *user);

/* Messages at level or more severe go to fn (fn NULL: none). Returns 0,
 * or -EINVAL for a level outside TERN_LOG_ERROR..TERN_LOG_DEBUG. */
int tern_set_log(int level, tern_log_fn fn, void *user);

/* "error", "warn", "info", "debug"; NULL for another value. */
const char *tern_log_level_name(int level);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
