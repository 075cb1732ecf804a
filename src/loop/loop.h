/* Private side of the loop: I/O watchers, the timer wheel, the hooks the
 * net layer uses. Only src/ includes this. */
#ifndef TERN_LOOP_PRIVATE_H
#define TERN_LOOP_PRIVATE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "tern/loop.h"

#define tern__container_of(ptr, type, member) \
    ((type *)((char *)(ptr) - offsetof(type, member)))

/* An fd registered with the loop's back end, which keeps a pointer here:
 * the watcher stays at a fixed address while registered (or says it moved).
 * Invariant: events is the interest the back end has for fd (0 = none). */
typedef struct tern__io tern__io;
typedef void (*tern__io_fn)(tern__io *io, uint32_t revents);
struct tern__io {
    int fd;
    uint32_t events;
    tern__io_fn fn;
};

/* Interest (what tern__io_set asks for) and readiness (what a watcher's fn
 * is told), in the loop's own names, so that nothing above the loop
 * depends on epoll and another back end can translate them. The epoll back
 * end uses epoll's values (checked in epoll.c), so they pass through as
 * they are. ERR and HUP are only ever reported, never asked for; what each
 * means to every back end (level-triggered; RDHUP without IN: the peer's
 * end, never bytes) is the back-end contract in loop_internal.h. */
enum {
    TERN__IO_IN = 0x001,      /* readable (or a listener: a connection waits) */
    TERN__IO_OUT = 0x004,     /* writable */
    TERN__IO_ERR = 0x008,     /* an error is pending on the socket */
    TERN__IO_HUP = 0x010,     /* both directions are closed */
    TERN__IO_RDHUP = 0x2000,  /* the peer shut its side (no more to read after what is queued) */
};

void tern__io_init(tern__io *io, int fd, tern__io_fn fn);
/* Sets the interest to `events` (TERN__IO_IN, TERN__IO_OUT, ...; 0 removes
 * the fd), telling the back end only when it changes. A watcher with no
 * descriptor (fd -1) only records it: its owner reports its readiness
 * itself (net's tern__conn_ready), and moving or closing it tells the
 * back end nothing. Removing also
 * drops the watcher's events still queued in the current batch, so the
 * caller may free the watcher right away. */
int tern__io_set(tern_loop *loop, tern__io *io, uint32_t events);

/* Tells the back end that a registered watcher now lives at a new address. */
TERN_MUST_CHECK
int tern__io_moved(tern_loop *loop, tern__io *io);

/* Closes the watcher's descriptor and forgets the watcher (as setting no
 * interest, then close()): a back end that holds the descriptor in work of
 * its own (io_uring) lets go of it. The caller may free the watcher. */
void tern__io_close(tern_loop *loop, tern__io *io);
/* As tern__io_close, for a peer that stopped reading (a send timeout):
 * what the back end took for a send and the kernel has not is dropped,
 * not sent. io_uring would otherwise give its send in flight
 * CLOSE_SEND_MS more, and the peer would see the cut that much late. A
 * back end that holds no sends of its own (epoll, poll) just closes. */
void tern__io_close_dropping(tern_loop *loop, tern__io *io);

/* Listeners: a listening socket's watcher asks tern__io_acceptor whether
 * the back end accepts its connections itself (io_uring's multishot
 * accept: no accept system call per connection); then TERN__IO_IN says
 * one (or an error) is in hand. Either way the watcher takes connections
 * with tern__io_accept until -EAGAIN, and asks again each time it sets
 * its interest after having set none.
 *
 * one_at_a_time: the back end takes no connection before the watcher has
 * taken the one before (io_uring: a single-shot accept, armed again after
 * each), so that a listener keeping a descriptor reserve sees every
 * descriptor number before the kernel hands out the next; without it the
 * back end may accept ahead, up to the process's limit. The watcher may
 * ask again with the other answer while accepting: the change takes
 * effect with the next connection the kernel takes. */
bool tern__io_acceptor(tern_loop *loop, tern__io *io, bool one_at_a_time);
/* As tern__plat_accept (non-blocking, close-on-exec, no peer address):
 * the new descriptor, -EAGAIN, or a negative errno (EMFILE, ...). */
TERN_MUST_CHECK
int tern__io_accept(tern_loop *loop, tern__io *io);

/* Streams: a connected socket whose bytes the back end moves itself, by
 * completions (io_uring), instead of telling readiness for the owner to
 * call recv/send. The watcher still gets TERN__IO_IN (bytes or the end
 * arrived: tern__io_recv them) and TERN__IO_OUT (the send in flight is
 * done), so the owner's logic is the same; the bytes go through these
 * calls, which keep the socket's order.
 * tern__io_stream asks for it (on) or takes it back (off, only in the
 * callback that started the watcher: before anything was submitted);
 * returns whether the watcher is a stream (false on readiness back ends). */
bool tern__io_stream(tern_loop *loop, tern__io *io, bool on);
/* As recv(): bytes, 0 at the end, -EAGAIN, or a negative errno. */
ssize_t tern__io_recv(tern_loop *loop, tern__io *io, char *buf, size_t len);
/* The bytes in hand, without a copy: all of them, in the back end's own
 * buffer, writable and valid until the report that told TERN__IO_IN
 * returns; *len is their count. NULL when none are held that way (bytes
 * left over from an earlier report, or the end): then tern__io_recv. */
char *tern__io_take(tern_loop *loop, tern__io *io, size_t *len);
/* How many bytes tern__io_recv would return now. */
size_t tern__io_held(tern_loop *loop, const tern__io *io);
/* Bytes a send took that the kernel has not taken yet (in flight). */
size_t tern__io_unsent(tern_loop *loop, const tern__io *io);
/* Input the watcher has not read (bytes left over, or the end): no
 * report will come for it; read it from the batch end. */
bool tern__io_pending(tern_loop *loop, const tern__io *io);
/* Takes (a copy of) up to all of iov: bytes taken, -EAGAIN while a send is
 * in flight (TERN__IO_OUT follows its completion), or a negative errno. */
ssize_t tern__io_send(tern_loop *loop, tern__io *io, const struct iovec *iov, int iovcnt);
ssize_t tern__io_send_file(tern_loop *loop, tern__io *io, int fd, off_t *off, size_t len);
/* shutdown(SHUT_WR), after the send in flight. */
int tern__io_shutdown(tern_loop *loop, tern__io *io);

/* Timer wheel: for the many timeouts that are set, moved and cancelled far
 * more often than they fire (head, idle, ping). Resolution is one tick
 * (TERN__WHEEL_TICK_MS); a deadline is never early, at most a tick late.
 * Invariant: an entry is linked (prev != NULL) exactly while it is armed,
 * in the slot of its deadline tick modulo the wheel size. */
#define TERN__WHEEL_TICK_MS 64
#define TERN__WHEEL_SLOTS 1024   /* 65 s per turn; longer deadlines go round */

typedef struct tern__wheel_entry tern__wheel_entry;
typedef void (*tern__wheel_fn)(tern__wheel_entry *e);
struct tern__wheel_entry {
    tern__wheel_entry *next, *prev;
    uint64_t deadline_tick;
};

/* Every entry of a loop's wheel fires the same function (the wheel serves
 * connections only), so entries carry no function pointer: 8 bytes less
 * per connection. */
void tern__wheel_set_fn(tern_loop *loop, tern__wheel_fn fn);
void tern__wheel_init_entry(tern__wheel_entry *e);
/* Arms (or re-arms) e to fire after ms milliseconds; 0 disarms it. */
void tern__wheel_set(tern_loop *loop, tern__wheel_entry *e, uint64_t ms);
static inline bool tern__wheel_armed(const tern__wheel_entry *e) { return e->prev != NULL; }

/* Hooks: a deferred-work list the net layer drains once per iteration
 * (connections to re-feed, connections to free), and a function called at
 * the end of every batch of callbacks (the cork flush). */
typedef void (*tern__loop_hook)(tern_loop *loop);
void tern__loop_set_batch_end(tern_loop *loop, tern__loop_hook fn);

/* The shared read buffer. */
char *tern__loop_rbuf(tern_loop *loop, size_t *cap);
/* The bound on all the loop's backlogs together (tern_loop_options). */
size_t tern__loop_max_unsent(const tern_loop *loop);

/* Per-loop slots for the upper layers' singletons (the net layer's cork
 * and pending lists, TLS's sessions holding record buffers, the http
 * layer's queue of access-log entries), so the loop needs to know nothing
 * of them. Each is one malloc'd block;
 * tern_loop_free() frees it. A layer takes its slot's key at its first
 * use (tern__loop_slot_key; h2o's configurator slots are the model), so
 * the loop names none of the layers above it. */
enum { TERN__LOOP_SLOTS_MAX = 8 };
void **tern__loop_slot(tern_loop *loop, int which);

/* Keys handed out from a fixed range, once per user: *key is the user's
 * own variable (0 before its first call; the key + 1 after), *next the
 * range's counter (guarded by one lock in loop.c). The first call from
 * any thread takes the next key, every later one returns it: one acquire
 * load. Past max keys it aborts: the tables are sized by max, and the
 * users are known when the library is built, so the first test that runs
 * meets the mistake. what names the range in the message. */
int tern__key_once(_Atomic int *key, int *next, int max, const char *what);
/* The key of the loop slot of a layer whose key variable is *key. */
int tern__loop_slot_key(_Atomic int *key);
/* A function of a slot's owner run first thing in tern_loop_free, while
 * the loop is whole: where it ends what it still has going on the loop
 * (the ws client cancels its pending connects, whose on_connect_error
 * runs from there). A batch end follows, for net to free what it closed. */
void tern__loop_set_slot_close(tern_loop *loop, int which, tern__loop_hook fn);
/* A function of a slot's owner run at every batch end, before the one set
 * with tern__loop_set_batch_end (so what it writes is flushed with the
 * batch): where callbacks deferred out of the user's calls are made. */
void tern__loop_set_slot_hook(tern_loop *loop, int which, tern__loop_hook fn);

/* Wall clock, for Date headers: seconds since the epoch, read once per
 * iteration alongside the monotonic clock. */
int64_t tern__loop_wall_sec(const tern_loop *loop);

/* Runs the posts waiting in loop's queue (on the calling thread, which
 * must be the only one using the loop: it has stopped). Returns how many
 * ran. tern_run's, so that no post is lost to a loop that ended first. */
int tern__loop_run_posts(tern_loop *loop);

/* tern_loop_post for a post that owns memory: when the loop is freed with
 * the post still queued, drop(user) runs instead of fn (on the freeing
 * thread), so what user holds is released rather than leaked. drop must
 * not call back into the application. */
TERN_MUST_CHECK
int tern__loop_post_owned(tern_loop *loop, tern_post_fn fn, void (*drop)(void *user), void *user);

/* The loop whose tern_loop_run is running on the calling thread, or NULL. */
tern_loop *tern__loop_current(void);

/* The loop whose tern_loop_run is running on the calling thread, or NULL:
 * what tern__loop_current answers, read inline by tern__loop_thread_ok.
 * initial-exec: one load from the thread pointer, not a call to
 * __tls_get_addr per check as the shared library's default model would
 * make (a pointer of tern's own fits the static TLS a library loaded by
 * dlopen may take). */
extern _Thread_local tern_loop *tern__loop_here __attribute__((tls_model("initial-exec")));

/* tern__loop_thread_ok's answer when loop is not running on this thread. */
bool tern__loop_thread_slow(const tern_loop *loop, const char *call);

/* Whether the calling thread may use loop now: it is not running (set-up
 * before, tear-down after, a thread handing it over), or it is running on
 * this thread. Otherwise, in the checked build, aborts naming call; in the
 * release build logs once at error level and answers false, and the
 * loop-thread-only calls that return int refuse with -EPERM. Inline: the
 * usual case, a call from its own loop's callback (every message sent),
 * is one compare with a thread-local; the rest is a call. */
static inline bool tern__loop_thread_ok(const tern_loop *loop, const char *call) {
    return loop == tern__loop_here || tern__loop_thread_slow(loop, call);
}
/* For loop-thread-only calls that cannot return an error: checked build
 * only. */
#ifdef TERN_CHECKED
#define TERN__ASSERT_LOOP_THREAD(loop) ((void)tern__loop_thread_ok((loop), __func__))
#else
#define TERN__ASSERT_LOOP_THREAD(loop) ((void)0)
#endif

/* What keeps a loop from being freed: a server (from tern_server_new to
 * tern_server_free) and a connection (from its start to its close) each
 * hold it once; tern_loop_free refuses (-EBUSY) while anything does. Loop
 * thread. */
void tern__loop_hold(tern_loop *loop);
void tern__loop_release(tern_loop *loop);

#endif
