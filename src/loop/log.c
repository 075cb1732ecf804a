/* The process-wide log hook, and its rate limit per kind of message.
 *
 * The hook is set once before the loops run; the loops only read it. The
 * rate limit is shared by every thread: a window of one second per kind,
 * with atomic counters, so two threads may let a line or two more through
 * at a window's edge, never a flood. */
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "loop/log.h"
#include "platform/platform.h"

#define TERN__LOG_BURST 10   /* lines per second per kind */

/* Invariant: count is the lines let through in second `sec`; suppressed the
 * lines of this kind refused since the last one let through. */
typedef struct log_window {
    _Atomic int64_t sec;
    atomic_uint count;
    atomic_uint suppressed;
} log_window;

static atomic_int log_level = -1;   /* -1: no hook */
static tern_log_fn log_fn;
static void *log_user;
static log_window windows[TERN__LOG_KINDS];

int tern_set_log(int level, tern_log_fn fn, void *user) {
    if (level < TERN_LOG_ERROR || level > TERN_LOG_DEBUG)
        return -EINVAL;
    atomic_store(&log_level, -1);
    log_fn = fn;
    log_user = user;
    atomic_store(&log_level, fn ? level : -1);
    return 0;
}

const char *tern_log_level_name(int level) {
    static const char *const names[] = {"error", "warn", "info", "debug"};
    return level >= TERN_LOG_ERROR && level <= TERN_LOG_DEBUG ? names[level] : NULL;
}

bool tern__log_on(int level) {
    return level <= atomic_load_explicit(&log_level, memory_order_relaxed);
}

void tern__log(int level, int kind, const char *fmt, ...) {
    if (!tern__log_on(level) || kind < 0 || kind >= TERN__LOG_KINDS)
        return;
    log_window *w = &windows[kind];
    int64_t sec = tern__plat_mono_sec();
    int64_t old = atomic_load(&w->sec);
    if (old != sec && atomic_compare_exchange_strong(&w->sec, &old, sec))
        atomic_store(&w->count, 0);
    if (atomic_fetch_add(&w->count, 1) >= TERN__LOG_BURST) {
        atomic_fetch_add(&w->suppressed, 1);
        return;
    }
    char msg[512];
    int n = 0;
    unsigned skipped = atomic_exchange(&w->suppressed, 0);
    if (skipped)
        n = snprintf(msg, sizeof(msg), "(%u similar lines suppressed) ", skipped);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg + n, sizeof(msg) - (size_t)n, fmt, ap);
    va_end(ap);
    tern_log_fn fn = log_fn;
    if (fn)
        fn(level, msg, log_user);
}
