/* The loop proper, over whichever back end waits for I/O (epoll.c, ...):
 * dispatch, cross-thread posts, signals, the batch-end hooks. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "loop/check.h"
#include "loop/log.h"
#include "loop/loop_internal.h"
#include "platform/platform.h"

#define TERN__DEFAULT_RBUF (256 * 1024)
#define TERN__MIN_RBUF (64 * 1024)
#define TERN__DEFAULT_MAX_UNSENT ((size_t)256 << 20)

void tern__loop_update_time(tern_loop *loop) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    loop->now_ms = (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
    loop->wall_sec = tern__plat_wall_sec();
}

uint64_t tern_loop_now(const tern_loop *loop) { return loop ? loop->now_ms : 0; }
int64_t tern__loop_wall_sec(const tern_loop *loop) { return loop->wall_sec; }
char *tern__loop_rbuf(tern_loop *loop, size_t *cap) { *cap = loop->rbuf_cap; return loop->rbuf; }
size_t tern__loop_max_unsent(const tern_loop *loop) { return loop->max_unsent; }
void **tern__loop_slot(tern_loop *loop, int which) { return &loop->slots[which]; }

/* The lock of every range's first calls: taken once per user, never on
 * the way of a loop's work. */
static pthread_mutex_t key_lock = PTHREAD_MUTEX_INITIALIZER;

int tern__key_once(_Atomic int *key, int *next, int max, const char *what) {
    int k = atomic_load_explicit(key, memory_order_acquire);
    if (k > 0)
        return k - 1;
    pthread_mutex_lock(&key_lock);
    k = atomic_load_explicit(key, memory_order_relaxed);
    if (k == 0) {
        if (*next == max) {
            fprintf(stderr, "tern: more than %d %s: raise the maximum\n", max, what);
            abort();
        }
        k = ++*next;
        atomic_store_explicit(key, k, memory_order_release);
    }
    pthread_mutex_unlock(&key_lock);
    return k - 1;
}

static int loop_slots_used;

int tern__loop_slot_key(_Atomic int *key) {
    return tern__key_once(key, &loop_slots_used, TERN__LOOP_SLOTS_MAX, "loop slots");
}
void tern__loop_set_batch_end(tern_loop *loop, tern__loop_hook fn) { loop->batch_end = fn; }
void tern__loop_set_slot_hook(tern_loop *loop, int which, tern__loop_hook fn) {
    loop->slot_hooks[which] = fn;
}
void tern__loop_set_slot_close(tern_loop *loop, int which, tern__loop_hook fn) {
    loop->slot_close[which] = fn;
}

void tern__io_init(tern__io *io, int fd, tern__io_fn fn) {
    io->fd = fd;
    io->events = 0;
    io->fn = fn;
}

/* A watcher without a descriptor (fd < 0) is one whose readiness its
 * owner reports itself (a stream carried by a multiplexed connection,
 * net's tern__conn_ready): the back end never sees it, and its interest
 * is only recorded, for the owner to read. */
int tern__io_set(tern_loop *loop, tern__io *io, uint32_t events) {
    if (events == io->events)
        return 0;
    if (io->fd < 0) {
        io->events = events;
        return 0;
    }
    return loop->bk->io_set(loop, io, events);
}

int tern__io_moved(tern_loop *loop, tern__io *io) {
    return io->fd < 0 ? 0 : loop->bk->io_moved(loop, io);
}

void tern__io_close(tern_loop *loop, tern__io *io) {
    if (io->fd >= 0)
        loop->bk->io_close(loop, io);
}

void tern__io_close_dropping(tern_loop *loop, tern__io *io) {
    if (io->fd < 0)
        return;
    if (loop->bk->io_close_dropping)
        loop->bk->io_close_dropping(loop, io);
    else
        loop->bk->io_close(loop, io);
}

bool tern__io_acceptor(tern_loop *loop, tern__io *io, bool one_at_a_time) {
    return loop->bk->io_acceptor ? loop->bk->io_acceptor(loop, io, one_at_a_time) : false;
}
int tern__io_accept(tern_loop *loop, tern__io *io) {
    if (loop->bk->io_accept)
        return loop->bk->io_accept(loop, io);
    return tern__plat_accept(io->fd);
}

bool tern__io_stream(tern_loop *loop, tern__io *io, bool on) {
    return loop->bk->io_stream && io->fd >= 0 ? loop->bk->io_stream(loop, io, on) : false;
}
ssize_t tern__io_recv(tern_loop *loop, tern__io *io, char *buf, size_t len) {
    return loop->bk->io_recv(loop, io, buf, len);
}
char *tern__io_take(tern_loop *loop, tern__io *io, size_t *len) {
    return loop->bk->io_take(loop, io, len);
}
bool tern__io_pending(tern_loop *loop, const tern__io *io) {
    return loop->bk->io_pending(loop, io);
}
size_t tern__io_held(tern_loop *loop, const tern__io *io) { return loop->bk->io_held(loop, io); }
size_t tern__io_unsent(tern_loop *loop, const tern__io *io) { return loop->bk->io_unsent(loop, io); }
ssize_t tern__io_send(tern_loop *loop, tern__io *io, const struct iovec *iov, int iovcnt) {
    return loop->bk->io_send(loop, io, iov, iovcnt);
}
ssize_t tern__io_send_file(tern_loop *loop, tern__io *io, int fd, off_t *off, size_t len) {
    return loop->bk->io_send_file(loop, io, fd, off, len);
}
int tern__io_shutdown(tern_loop *loop, tern__io *io) { return loop->bk->io_shutdown(loop, io); }

const char *tern_loop_backend(const tern_loop *loop) { return loop ? loop->bk->name : NULL; }

/* ---- cross-thread posts ---------------------------------------------- */

static void post_push(tern_loop *loop, tern__post *p) {
    atomic_store_explicit(&p->next, NULL, memory_order_relaxed);
    tern__post *prev = atomic_exchange_explicit(&loop->post_head, p, memory_order_acq_rel);
    atomic_store_explicit(&prev->next, p, memory_order_release);
}

/* Pops the oldest post, or NULL when the queue is empty or a producer is
 * between its two steps (its wake-up then follows, see tern_loop_post). */
static tern__post *post_pop(tern_loop *loop) {
    tern__post *tail = loop->post_tail;
    tern__post *next = atomic_load_explicit(&tail->next, memory_order_acquire);
    if (tail == &loop->post_sentinel) {
        if (next == NULL)
            return NULL;
        loop->post_tail = next;
        tail = next;
        next = atomic_load_explicit(&next->next, memory_order_acquire);
    }
    if (next != NULL) {
        loop->post_tail = next;
        return tail;
    }
    if (tail != atomic_load_explicit(&loop->post_head, memory_order_acquire))
        return NULL;
    post_push(loop, &loop->post_sentinel);
    next = atomic_load_explicit(&tail->next, memory_order_acquire);
    if (next != NULL) {
        loop->post_tail = next;
        return tail;
    }
    return NULL;
}

int tern_loop_post(tern_loop *loop, tern_post_fn fn, void *user) {
    return tern__loop_post_owned(loop, fn, NULL, user);
}

int tern__loop_post_owned(tern_loop *loop, tern_post_fn fn, void (*drop)(void *user), void *user) {
    if (loop == NULL || fn == NULL)
        return -EINVAL;
    tern__post *p = malloc(sizeof(*p));
    if (p == NULL)
        return -ENOMEM;
    p->fn = fn;
    p->drop = drop;
    p->user = user;
    post_push(loop, p);
    if (atomic_exchange(&loop->wake_pending, 1) == 0)
        tern__plat_wake_signal(&loop->wake);
    return 0;
}

static void on_wake(tern__io *io, uint32_t revents) {
    tern_loop *loop = tern__container_of(io, tern_loop, wake_io);
    tern__plat_wake_drain(&loop->wake);
    /* Cleared before draining: a post that lands during the drain either
     * is seen by it or wakes the loop again. */
    atomic_store(&loop->wake_pending, 0);
    tern__post *p;
    while ((p = post_pop(loop)) != NULL) {
        p->fn(loop, p->user);
        free(p);
    }
}

int tern__loop_run_posts(tern_loop *loop) {
    int n = 0;
    tern__post *p;
    while ((p = post_pop(loop)) != NULL) {
        p->fn(loop, p->user);
        free(p);
        n++;
    }
    return n;
}

static void stop_fn(tern_loop *loop, void *user) { loop->stopping = true; }

void tern_loop_stop(tern_loop *loop) {
    if (loop) {
        TERN__ASSERT_LOOP_THREAD(loop);
        loop->stopping = true;
    }
}
int tern_loop_stop_async(tern_loop *loop) { return tern_loop_post(loop, stop_fn, NULL); }

/* ---- signals ---------------------------------------------------------- */

static void on_signal(tern__io *io, uint32_t revents) {
    tern_loop *loop = tern__container_of(io, tern_loop, signal_io);
    int signo;
    while ((signo = tern__plat_signals_next(&loop->sig)) > 0) {
        for (int i = 0; i < loop->nsignals; i++)
            if (loop->signals[i].signo == signo)
                loop->signals[i].fn(loop, signo, loop->signals[i].user);
    }
}

int tern_loop_on_signal(tern_loop *loop, int signo, tern_signal_fn fn, void *user) {
    /* SIGKILL and SIGSTOP cannot be caught: they would never be seen. */
    if (loop == NULL || fn == NULL || signo <= 0 || signo >= TERN__PLAT_NSIG ||
        signo == SIGKILL || signo == SIGSTOP)
        return -EINVAL;
    if (loop->nsignals == TERN__MAX_SIGNALS)
        return -ENOSPC;
    int err = tern__plat_signals_add(&loop->sig, signo);
    if (err < 0)
        return err;
    if (loop->signal_io.fd < 0) {
        tern__io_init(&loop->signal_io, loop->sig.fd, on_signal);
        if ((err = tern__io_set(loop, &loop->signal_io, TERN__IO_IN)) < 0)
            return err;
    }
    loop->signals[loop->nsignals++] = (tern__signal){signo, fn, user};
    return 0;
}

/* ---- the loop --------------------------------------------------------- */

/* The back ends, each with its name in TERN_IO and, where this build
 * lacks it, why (ops NULL); the first is the default. A new back end is
 * its file and its line here. */
static const struct {
    tern_io_backend id;
    const char *env, *name;
    const tern__backend_ops *ops;
    const char *missing;
} backends[] = {
#ifdef TERN_HAVE_EPOLL
    {TERN_IO_EPOLL, "epoll", "epoll", &tern__epoll_backend, NULL},
#endif
    {TERN_IO_POLL, "poll", "poll", &tern__poll_backend, NULL},
#ifndef TERN_HAVE_EPOLL
    {TERN_IO_EPOLL, "epoll", "epoll", NULL, "a portable build"},
#endif
#ifdef TERN_HAVE_URING
    {TERN_IO_URING, "uring", "io_uring", &tern__uring_backend, NULL},
#else
    {TERN_IO_URING, "uring", "io_uring", NULL, "built without liburing"},
#endif
};
#define TERN__BACKENDS (sizeof(backends) / sizeof(backends[0]))

/* The back end asked for (the environment's TERN_IO for the default); one
 * that cannot run (io_uring where the kernel refuses it, one this build
 * lacks) gives way to the default, with one log line. */
static int backend_init(tern_loop *loop, tern_io_backend want) {
    const char *env = want == TERN_IO_DEFAULT ? getenv("TERN_IO") : NULL;
    size_t i = 0;
    for (size_t j = 0; j < TERN__BACKENDS; j++)
        if (env ? strcmp(env, backends[j].env) == 0 : want == backends[j].id)
            i = j;
    loop->bk = backends[0].ops;
    if (i == 0)
        return loop->bk->init(loop);
    const char *why = backends[i].missing;
    int err = 0;
    if (backends[i].ops != NULL) {
        if ((err = backends[i].ops->init(loop)) == 0) {
            loop->bk = backends[i].ops;
            return 0;
        }
        why = strerror(-err);
    }
    tern__log(TERN_LOG_WARN, TERN__LOG_BACKEND, "loop: %s unavailable (%s): using %s",
              backends[i].name, why, loop->bk->name);
    return loop->bk->init(loop);
}

int tern_loop_new(tern_loop **out, const tern_loop_options *opt) {
    if (out == NULL)
        return -EINVAL;
    tern_loop *loop = calloc(1, sizeof(*loop));
    if (loop == NULL)
        return -ENOMEM;
    size_t cap = opt && opt->read_buffer_size ? opt->read_buffer_size : TERN__DEFAULT_RBUF;
    loop->rbuf_cap = cap < TERN__MIN_RBUF ? TERN__MIN_RBUF : cap;
    loop->max_unsent = opt && opt->max_unsent ? opt->max_unsent : TERN__DEFAULT_MAX_UNSENT;
    loop->rbuf = malloc(loop->rbuf_cap);
    int err = 0;
    bool bk_made = false, wake_made = false;
    if (loop->rbuf == NULL)
        err = -ENOMEM;
    else if ((err = tern__plat_wake_open(&loop->wake)) == 0)
        wake_made = true;
    if (err == 0 && (err = backend_init(loop, opt ? opt->io : TERN_IO_DEFAULT)) == 0)
        bk_made = true;
    if (err == 0) {
        tern__loop_update_time(loop);
        tern__wheel_init(loop);
        atomic_init(&loop->post_head, &loop->post_sentinel);
        atomic_init(&loop->post_sentinel.next, NULL);
        loop->post_tail = &loop->post_sentinel;
        atomic_init(&loop->wake_pending, 0);
        tern__plat_signals_init(&loop->sig);
        tern__io_init(&loop->signal_io, -1, on_signal);
        tern__io_init(&loop->wake_io, loop->wake.rfd, on_wake);
        err = tern__io_set(loop, &loop->wake_io, TERN__IO_IN);
    }
    if (err < 0) {
        if (wake_made) {
            close(loop->wake.rfd);
            tern__plat_wake_close(&loop->wake);
        }
        if (bk_made)
            loop->bk->free(loop);
        free(loop->rbuf);
        free(loop);
        return err;
    }
    *out = loop;
    return 0;
}

static void batch_end(tern_loop *loop);

void tern__loop_hold(tern_loop *loop) { loop->holds++; }

void tern__loop_release(tern_loop *loop) {
    TERN__ASSERT(loop->holds > 0, "released more than held");
    if (loop->holds > 0)
        loop->holds--;
}

int tern_loop_free(tern_loop *loop) {
    if (loop == NULL)
        return 0;
    if (atomic_load(&loop->running)) {
        tern__log(TERN_LOG_ERROR, TERN__LOG_MISUSE, "tern_loop_free: the loop runs: not freed");
        return -EBUSY;
    }
    /* The upper layers end what they still have going (pending connects),
     * with the loop whole; what that closed is freed by a batch end. */
    bool closed = false;
    for (int i = 0; i < TERN__LOOP_SLOTS_MAX; i++)
        if (loop->slot_close[i]) {
            loop->slot_close[i](loop);
            closed = true;
        }
    if (closed)
        batch_end(loop);
    /* What is still alive on the loop would point into freed memory (and
     * free its own parts through it later); as uv_loop_close, refuse and
     * let the caller free them first. */
    if (loop->holds > 0) {
        tern__log(TERN_LOG_ERROR, TERN__LOG_MISUSE,
                  "tern_loop_free: %zu servers and connections still alive: not freed",
                  loop->holds);
        return -EBUSY;
    }
    /* Posts nobody ran are dropped: their owners are gone with the loop.
     * One that owns memory (tern__loop_post_owned) releases it. */
    tern__post *p;
    while ((p = post_pop(loop)) != NULL) {
        if (p->drop)
            p->drop(p->user);
        free(p);
    }
    tern__timers_free(loop);
    for (int i = 0; i < TERN__LOOP_SLOTS_MAX; i++)
        free(loop->slots[i]);
    if (loop->signal_io.fd >= 0) {
        tern__io_close(loop, &loop->signal_io);
        tern__plat_signals_close(&loop->sig);
    }
    tern__io_close(loop, &loop->wake_io);
    tern__plat_wake_close(&loop->wake);
    loop->bk->free(loop);
    free(loop->rbuf);
    free(loop);
    return 0;
}

static void batch_end(tern_loop *loop) {
    for (int i = 0; i < TERN__LOOP_SLOTS_MAX; i++)
        if (loop->slot_hooks[i])
            loop->slot_hooks[i](loop);
    if (loop->batch_end)
        loop->batch_end(loop);
}

_Thread_local tern_loop *tern__loop_here;

tern_loop *tern__loop_current(void) { return tern__loop_here; }

bool tern__loop_thread_slow(const tern_loop *loop, const char *call) {
    if (!atomic_load_explicit(&loop->running, memory_order_relaxed) || tern__loop_here == loop)
        return true;
#ifdef TERN_CHECKED
    tern__check_fail(call, "called on a thread other than its loop's, while the loop runs",
                     __FILE__, __LINE__);
#else
    /* Once: the caller's code is wrong, not its traffic. */
    static atomic_bool said;
    if (!atomic_exchange(&said, true))
        tern__log(TERN_LOG_ERROR, TERN__LOG_MISUSE,
                  "%s: called on a thread other than its loop's, while the loop runs: refused "
                  "(use tern_loop_post)", call);
    return false;
#endif
}

static int loop_run(tern_loop *loop);

int tern_loop_run(tern_loop *loop) {
    if (loop == NULL)
        return -EINVAL;
    /* A run inside a callback (of this loop or another on this thread)
     * would dispatch callbacks inside callbacks, and the outer batch's
     * state (the cork, deferred frees) under it; a loop running on another
     * thread would be run by two. Neither runs. */
    bool was = false;
    if (tern__loop_here != NULL || !atomic_compare_exchange_strong(&loop->running, &was, true))
        return -EBUSY;
    tern__loop_here = loop;
    int r = loop_run(loop);
    tern__loop_here = NULL;
    atomic_store(&loop->running, false);
    return r;
}

static int loop_run(tern_loop *loop) {
    loop->stopping = false;
    while (!loop->stopping) {
        int timeout = tern__timers_timeout(loop);
        int wt = tern__wheel_timeout(loop);
        if (timeout < 0 || (wt >= 0 && wt < timeout))
            timeout = wt;
        int err = loop->bk->wait(loop, timeout);
        if (err < 0)
            return err;
        batch_end(loop);
        tern__wheel_run(loop);
        tern__timers_run(loop);
        batch_end(loop);
    }
    if (loop->bk->flush)
        loop->bk->flush(loop);
    return 0;
}
