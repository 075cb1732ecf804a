/* tern event loop: one per thread.
 *
 * A loop owns an epoll instance, the timers of its thread, a queue that
 * other threads post work into, and the shared read buffer every socket of
 * the loop reads into. Nothing here is thread-safe except tern_loop_post()
 * and tern_loop_stop_async(). */
#ifndef TERN_LOOP_H
#define TERN_LOOP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* libtern.so exports what this header declares, and nothing else. */
#pragma GCC visibility push(default)

/* Marks a call whose result must be looked at, because ignoring it is a
 * bug: a loop, server, route or listener that was not made, a post or
 * timer that will never run, an address left unwritten. GCC and Clang
 * warn where a caller drops the result. Sends, closes, statistics and
 * accessors are not marked: a failed send is followed by on_close or the
 * abort callback, statistics fail only for a NULL argument, and an
 * accessor's value is its whole purpose. */
#if defined(__GNUC__) || defined(__clang__)
#define TERN_MUST_CHECK __attribute__((warn_unused_result))
#else
#define TERN_MUST_CHECK
#endif

typedef struct tern_loop tern_loop;
typedef struct tern_timer tern_timer;

/* How a loop waits for I/O (tern_loop_options.io). */
typedef enum tern_io_backend {
    /* The environment's TERN_IO ("epoll" or "uring") if set, else epoll. */
    TERN_IO_DEFAULT = 0,
    TERN_IO_EPOLL,      /* readiness: epoll, then recv/send */
    /* Completions: io_uring (multishot receive into provided buffers,
     * sends submitted in one system call per loop iteration). Where the
     * kernel refuses it (ENOSYS, EPERM under seccomp, too old), the loop
     * uses epoll and logs one line saying so. */
    TERN_IO_URING,
} tern_io_backend;

typedef struct tern_loop_options {
    size_t read_buffer_size;  /* the one read buffer of the loop; 0: 256 KiB (min 64 KiB) */
    /* Bound on the bytes waiting in all the loop's connections' backlogs
     * (what the kernel would not take yet; 0: 256 MiB). A send that would
     * pass it closes its connection instead (an HTTP response is cut off,
     * a WebSocket ends with 1006), so peers that do not read cannot
     * exhaust memory together. */
    size_t max_unsent;
    tern_io_backend io;
} tern_loop_options;

/* Errors are negative errno values, and these of tern's own (outside the
 * errno range); tern_strerror and tern_err_name name both. */
enum {
    TERN_ENOHOST = -10001,   /* a host name did not resolve */
};
/* A sentence for a code tern returns: TERN_ENOHOST's ("Host name does not
 * resolve"), the tern_send_result values' (0 "Success", TERN_SEND_BUFFERED,
 * TERN_SEND_DROPPED: their own, not EPERM's and ENOENT's), a negative
 * errno's strerror text ("Invalid argument" for -EINVAL; a positive errno
 * other than 1 and 2 reads the same), and "Unknown error" for any other
 * code. The string is static: it never changes and is never freed, so any
 * thread may call this and keep what it returns. */
const char *tern_strerror(int err);
/* The code's name, like libuv's uv_err_name: "EAGAIN" for -EAGAIN,
 * "ECONNRESET", "TERN_ENOHOST", "TERN_SEND_BUFFERED", "TERN_SEND_DROPPED",
 * "OK" for 0, and "UNKNOWN" for a code nobody knows (also for every errno
 * value on a C library other than glibc 2.32 or later, which has no table
 * of names). Static, as tern_strerror's. */
const char *tern_err_name(int err);

TERN_MUST_CHECK
int tern_loop_new(tern_loop **out, const tern_loop_options *opt);
/* The back end the loop uses: "epoll" or "io_uring". */
const char *tern_loop_backend(const tern_loop *loop);
/* Frees the loop and returns 0. A WebSocket connect still pending
 * (tern/client.h) is cancelled first: its on_connect_error (-ECANCELED)
 * runs from inside this call. Every server and connection of it must be
 * gone: while one is alive (a server not yet tern_server_free'd, a client
 * connection still open), or while the loop runs, it frees nothing, logs
 * at error level and returns -EBUSY (as libuv's uv_loop_close), so free
 * the servers and call it again. Timers still armed are freed with it (an
 * idle one stays the caller's). Posts still queued never run (what a
 * tern_loop_post's user points to stays the caller's; tern's own posts
 * free theirs). NULL: 0. */
int tern_loop_free(tern_loop *loop);

/* Runs until tern_loop_stop(). Returns 0, or a negative errno if epoll
 * failed. -EBUSY, without running, when called from inside a callback of a
 * loop running on this thread (this one or another: a loop is never run
 * inside another's callback) or for a loop already running on another
 * thread.
 *
 * Threads: a loop runs on one thread at a time. While it runs, the calls
 * documented "loop thread" (responses, WebSocket calls, timers, ...) must
 * be made on that thread; made from another one, those that return int
 * refuse with -EPERM and log once at error level (the checked build,
 * TERN_CHECKED, aborts naming the call instead), and the others are
 * undefined behaviour. Hand work over with tern_loop_post. Before the loop
 * runs and after it returns, the thread that owns it may make them. */
TERN_MUST_CHECK
int tern_loop_run(tern_loop *loop);
/* Makes tern_loop_run() return after the current iteration (loop thread). */
void tern_loop_stop(tern_loop *loop);
/* The same, from any thread. */
int tern_loop_stop_async(tern_loop *loop);

/* Runs fn(loop, user) on the loop's thread at its next iteration. Any
 * thread may call it; posts from one thread run in the order posted.
 * Returns 0 or -ENOMEM (then fn never runs). */
typedef void (*tern_post_fn)(tern_loop *loop, void *user);
TERN_MUST_CHECK
int tern_loop_post(tern_loop *loop, tern_post_fn fn, void *user);

/* The loop's clock: CLOCK_MONOTONIC in milliseconds, read once per
 * iteration. */
uint64_t tern_loop_now(const tern_loop *loop);

/* Precise timers (a heap; for the few). Connection timeouts use the loop's
 * internal timer wheel instead. A timer fires after timeout_ms, then every
 * repeat_ms if that is non-zero. *out belongs to the caller until
 * tern_timer_stop(), which frees it and may be called from its own
 * callback; a one-shot timer that has fired stays allocated, idle, and can
 * be re-armed with tern_timer_again(). */
typedef void (*tern_timer_fn)(tern_timer *timer, void *user);
TERN_MUST_CHECK
int tern_timer_start(tern_loop *loop, tern_timer **out, uint64_t timeout_ms, uint64_t repeat_ms,
                     tern_timer_fn fn, void *user);
/* Re-arms a timer, armed or idle (also from its callback). 0 or -ENOMEM.
 * A timer armed from a timer callback fires at the loop's next iteration
 * at the earliest, after it has polled (even at 0 ms), so one that re-arms
 * itself at 0 ms yields to I/O between firings.
 * Timer calls are loop-thread calls (tern_loop_run): start and again
 * return -EPERM on another thread while the loop runs. */
TERN_MUST_CHECK
int tern_timer_again(tern_timer *timer, uint64_t timeout_ms);
/* A stopped timer is freed: stopping it again is undefined behaviour (the
 * checked build reports it, naming tern_timer_stop). So is stopping an
 * armed timer after tern_loop_free, which freed it; stop idle timers
 * before tern_loop_free too (the checked build reads the timer's loop). */
void tern_timer_stop(tern_timer *timer);

/* Delivers signo (SIGINT, SIGTERM, SIGHUP, ...) to fn on this loop's thread
 * through a signalfd. The signal is blocked in the calling thread: call it
 * before starting other threads so they inherit the mask. Returns 0,
 * -EINVAL (loop or fn NULL, signo 0 or not below NSIG, SIGKILL, SIGSTOP),
 * -ENOSPC (8 handlers on the loop already), or the errno of
 * pthread_sigmask or signalfd. */
typedef void (*tern_signal_fn)(tern_loop *loop, int signo, void *user);
TERN_MUST_CHECK
int tern_loop_on_signal(tern_loop *loop, int signo, tern_signal_fn fn, void *user);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
