/* The loop struct itself, shared by the files of src/loop/ only. */
#ifndef TERN_LOOP_INTERNAL_H
#define TERN_LOOP_INTERNAL_H

#include <signal.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "loop/loop.h"
#include "platform/platform.h"

/* A node of the cross-thread post queue (Vyukov's intrusive MPSC queue:
 * producers exchange the head, the loop thread alone pops at the tail).
 * drop, when not NULL, frees user if the loop is freed before fn ran. */
typedef struct tern__post {
    _Atomic(struct tern__post *) next;
    tern_post_fn fn;
    void (*drop)(void *user);
    void *user;
} tern__post;

typedef struct tern__signal {
    int signo;
    tern_signal_fn fn;
    void *user;
} tern__signal;

#define TERN__MAX_SIGNALS 8

/* A back end: how the loop waits for I/O and tells watchers. The loop
 * proper (posts, signals, timers, hooks) is the same over each; a back end
 * keeps its own state in loop->backend. What else differs between systems
 * (wake-up, signals, accept, sendfile...) is the platform's
 * (src/platform/platform.h), not the back end's.
 * - init makes that state (the loop's other fields are set, not yet the
 *   wake-up watcher); free undoes it, after every watcher is gone.
 * - io_set / io_moved / io_close are tern__io_set, tern__io_moved and
 *   tern__io_close (loop.h).
 * - wait blocks at most timeout_ms (-1: no limit) until some watcher is
 *   ready, reads the clock (tern__loop_update_time) and calls the ready
 *   watchers' fn; a negative errno only when the loop cannot go on.
 * - io_acceptor and io_accept serve listeners (loop.h); a back end that
 *   does not accept by itself leaves them NULL (tern__plat_accept is used).
 * - io_stream and the io_* after it serve streams (loop.h); a back end
 *   without streams leaves them NULL (io_stream then always says no).
 *
 * Interest, what every back end must honour (the flags are loop.h's):
 * - TERN__IO_IN and TERN__IO_OUT are level-triggered: reported in every
 *   wait while they hold (bytes or the peer's end to read, a connection
 *   to accept; room to write, a connect finished). Nobody has to drain a
 *   socket to hear of it again.
 * - TERN__IO_ERR and TERN__IO_HUP are never asked for: they are reported
 *   whenever they hold, whatever the interest, while the watcher is
 *   registered (events != 0). So a reset is heard even while not reading.
 * - TERN__IO_RDHUP asked for with TERN__IO_IN may come with it; nobody
 *   needs it there (the read returns 0).
 * - TERN__IO_RDHUP asked for without TERN__IO_IN (a paused connection:
 *   net stops reading but keeps listening for the peer) means "tell me
 *   when the peer's end comes, never of bytes". epoll has it
 *   (EPOLLRDHUP); io_uring polls for POLLRDHUP; a kqueue back end keeps
 *   EVFILT_READ registered with EV_CLEAR (edge: once per change) and
 *   reports only an event carrying EV_EOF, swallowing those of bytes.
 *   It may be reported again until the owner drops it (net does at the
 *   first report). A back end with no such report (poll(2): POLLRDHUP is
 *   Linux's) asks for readability and peeks when told: nothing to read
 *   is the end (RDHUP); bytes sent while paused mute the watch until the
 *   interest changes, so an end behind them is read on resume. So every
 *   back end reports an end that comes with no bytes before it, which is
 *   the case that matters: a client gone while its answer is prepared.
 *   Why not the other two ways: read interest kept level-triggered would
 *   report the unread bytes in every wait (a busy loop), and dropping
 *   read interest while paused would lose the early hang-up that HTTP
 *   answers with its probe (net's on_hangup) and its abort callback. */
typedef struct tern__backend_ops {
    const char *name;
    int (*init)(tern_loop *loop);
    void (*free)(tern_loop *loop);
    int (*io_set)(tern_loop *loop, tern__io *io, uint32_t events);
    int (*io_moved)(tern_loop *loop, tern__io *io);
    void (*io_close)(tern_loop *loop, tern__io *io);
    /* Optional (a back end that holds sends): tern__io_close_dropping. */
    void (*io_close_dropping)(tern_loop *loop, tern__io *io);
    int (*wait)(tern_loop *loop, int timeout_ms);
    /* Optional: hands the kernel what is waiting to be submitted, without
     * waiting (when tern_loop_run returns: what was written is then on its
     * way, as a send() would have it). */
    void (*flush)(tern_loop *loop);
    bool (*io_acceptor)(tern_loop *loop, tern__io *io, bool one_at_a_time);
    int (*io_accept)(tern_loop *loop, tern__io *io);
    bool (*io_stream)(tern_loop *loop, tern__io *io, bool on);
    ssize_t (*io_recv)(tern_loop *loop, tern__io *io, char *buf, size_t len);
    char *(*io_take)(tern_loop *loop, tern__io *io, size_t *len);
    bool (*io_pending)(tern_loop *loop, const tern__io *io);
    size_t (*io_held)(tern_loop *loop, const tern__io *io);
    size_t (*io_unsent)(tern_loop *loop, const tern__io *io);
    ssize_t (*io_send)(tern_loop *loop, tern__io *io, const struct iovec *iov, int iovcnt);
    ssize_t (*io_send_file)(tern_loop *loop, tern__io *io, int fd, off_t *off, size_t len);
    int (*io_shutdown)(tern_loop *loop, tern__io *io);
} tern__backend_ops;

extern const tern__backend_ops tern__epoll_backend;
extern const tern__backend_ops tern__poll_backend;
#ifdef TERN_HAVE_URING
extern const tern__backend_ops tern__uring_backend;
#endif

/* Invariants:
 * - now_ms is CLOCK_MONOTONIC read at the top of the current iteration;
 *   wheel_tick is the last tick whose slot has been run.
 * - heap[0..heap_len) is a binary min-heap on deadline, each timer's
 *   heap_index its position; now_head..now_tail lists the timers armed at
 *   0 ms, in arming order (timer.c).
 * - post_tail/post_head/post_sentinel form the MPSC queue; wake_pending is 1
 *   from the first post after a drain until the loop drains again, so a
 *   burst of posts wakes the loop once.
 * - running is true exactly while tern_loop_run runs it (on one thread:
 *   the tern__loop_current of that thread is this loop); atomic because
 *   other threads read it to be told they may not use the loop.
 * - holds counts the servers and connections alive on the loop
 *   (tern__loop_hold); tern_loop_free needs 0. */
struct tern_loop {
    const tern__backend_ops *bk;
    void *backend;                    /* the back end's state */
    bool stopping;
    atomic_bool running;
    size_t holds;
    uint64_t now_ms;
    int64_t wall_sec;

    char *rbuf;
    size_t rbuf_cap;
    size_t max_unsent;                /* tern_loop_options.max_unsent, default applied */

    /* timer wheel */
    tern__wheel_entry wheel[TERN__WHEEL_SLOTS];  /* sentinel heads of circular lists */
    uint64_t wheel_tick;
    size_t wheel_count;
    tern__wheel_fn wheel_fn;              /* what every entry fires */

    /* precise timers */
    tern_timer **heap;
    size_t heap_len, heap_cap;
    tern_timer *now_head, *now_tail;  /* the 0 ms FIFO */
    uint64_t timer_seq;               /* arming order, to break deadline ties */

    /* cross-thread posts */
    tern__plat_wake wake;             /* written by posters */
    tern__io wake_io;                 /* watches wake.rfd */
    _Atomic(tern__post *) post_head;  /* producers push here */
    tern__post *post_tail;            /* the loop pops here */
    tern__post post_sentinel;
    atomic_int wake_pending;

    /* signals */
    tern__plat_signals sig;           /* the signals asked for */
    tern__io signal_io;               /* watches sig.fd, or fd -1 */
    tern__signal signals[TERN__MAX_SIGNALS];
    int nsignals;

    tern__loop_hook batch_end;
    void *slots[TERN__LOOP_SLOTS_MAX];
    tern__loop_hook slot_hooks[TERN__LOOP_SLOTS_MAX];
    tern__loop_hook slot_close[TERN__LOOP_SLOTS_MAX];   /* tern__loop_set_slot_close */
};

/* wheel.c */
/* loop.c: reads the clocks into now_ms and wall_sec (once per iteration,
 * and when a precise timer is armed). */
void tern__loop_update_time(tern_loop *loop);

void tern__wheel_init(tern_loop *loop);
void tern__wheel_run(tern_loop *loop);
int tern__wheel_timeout(const tern_loop *loop);

/* timer.c */
void tern__timers_run(tern_loop *loop);
int tern__timers_timeout(const tern_loop *loop);
void tern__timers_free(tern_loop *loop);

#endif
