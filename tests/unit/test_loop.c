/* The loop: precise timers, the timer wheel, cross-thread posts, signals. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <stddef.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <poll.h>

#include "loop/loop_internal.h"

static uint64_t mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ---- precise timers --------------------------------------------------- */

typedef struct order_log {
    int seen[16];
    int n;
    tern_loop *loop;
    int stop_after;
} order_log;

typedef struct tagged {
    order_log *log;
    int tag;
} tagged;

static void log_fire(tern_timer *t, void *user) {
    tagged *tg = user;
    tg->log->seen[tg->log->n++] = tg->tag;
    if (tg->log->n == tg->log->stop_after)
        tern_loop_stop(tg->log->loop);
}

static void timers_fire_in_deadline_order(void **state) {
    tern_loop *loop;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    order_log log = {.loop = loop, .stop_after = 4};
    tagged tags[4] = {{&log, 30}, {&log, 10}, {&log, 20}, {&log, 11}};
    tern_timer *t[4];
    uint64_t start = mono_ms();   /* before arming: the 30 ms count from here at the latest */
    assert_int_equal(tern_timer_start(loop, &t[0], 30, 0, log_fire, &tags[0]), 0);
    assert_int_equal(tern_timer_start(loop, &t[1], 10, 0, log_fire, &tags[1]), 0);
    assert_int_equal(tern_timer_start(loop, &t[2], 20, 0, log_fire, &tags[2]), 0);
    /* Same deadline as tag 10, armed later: fires after it. */
    assert_int_equal(tern_timer_start(loop, &t[3], 10, 0, log_fire, &tags[3]), 0);
    assert_int_equal(tern_loop_run(loop), 0);
    assert_true(mono_ms() - start >= 30);
    assert_int_equal(log.n, 4);
    assert_int_equal(log.seen[0], 10);
    assert_int_equal(log.seen[1], 11);
    assert_int_equal(log.seen[2], 20);
    assert_int_equal(log.seen[3], 30);
    for (int i = 0; i < 4; i++)
        tern_timer_stop(t[i]);
    tern_loop_free(loop);
}

typedef struct repeat_state {
    int count;
    tern_loop *loop;
} repeat_state;

static void repeat_fire(tern_timer *t, void *user) {
    repeat_state *r = user;
    if (++r->count == 5) {
        tern_timer_stop(t);   /* stopping (freeing) inside its own callback is allowed */
        tern_loop_stop(r->loop);
    }
}

static void repeating_timer_repeats_and_stops_itself(void **state) {
    tern_loop *loop;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    repeat_state r = {0, loop};
    tern_timer *t;
    uint64_t start = mono_ms();
    assert_int_equal(tern_timer_start(loop, &t, 5, 5, repeat_fire, &r), 0);
    assert_int_equal(tern_loop_run(loop), 0);
    assert_int_equal(r.count, 5);
    assert_true(mono_ms() - start >= 25);
    tern_loop_free(loop);
}

static void never_fire(tern_timer *t, void *user) { fail_msg("a stopped timer fired"); }
static void stop_loop_fire(tern_timer *t, void *user) { tern_loop_stop(user); }

static void stopped_timer_never_fires_and_again_rearms(void **state) {
    tern_loop *loop;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    tern_timer *a, *b;
    assert_int_equal(tern_timer_start(loop, &a, 5, 0, never_fire, NULL), 0);
    assert_int_equal(tern_timer_start(loop, &b, 1000, 0, stop_loop_fire, loop), 0);
    tern_timer_stop(a);
    /* Moved from 1 s to 20 ms. */
    assert_int_equal(tern_timer_again(b, 20), 0);
    uint64_t start = mono_ms();
    assert_int_equal(tern_loop_run(loop), 0);
    uint64_t took = mono_ms() - start;
    assert_true(took >= 20 && took < 900);
    tern_timer_stop(b);
    tern_loop_free(loop);
}

/* Timers armed at 0 ms wait in a FIFO beside the heap (timer.c): the
 * order is still a single heap's (an overdue timer before one armed at 0
 * ms after its deadline; 0 ms ones in arming order), a stopped one never
 * fires, and again() moves a timer between the two. */
static void zero_ms_timers_fire_in_the_heaps_order(void **state) {
    tern_loop *loop;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    order_log log = {.loop = loop, .stop_after = 4};
    tagged tags[4] = {{&log, 1}, {&log, 2}, {&log, 3}, {&log, 4}};
    tern_timer *t[4], *gone, *moved;
    assert_int_equal(tern_timer_start(loop, &t[0], 2, 0, log_fire, &tags[0]), 0);
    usleep(5000);   /* t[0] is overdue now: due before the 0 ms ones armed next */
    assert_int_equal(tern_timer_start(loop, &t[1], 0, 0, log_fire, &tags[1]), 0);
    assert_int_equal(tern_timer_start(loop, &gone, 0, 0, never_fire, NULL), 0);
    assert_int_equal(tern_timer_start(loop, &moved, 0, 0, never_fire, NULL), 0);
    assert_int_equal(tern_timer_start(loop, &t[3], 60000, 0, log_fire, &tags[3]), 0);
    assert_int_equal(tern_timer_start(loop, &t[2], 0, 0, log_fire, &tags[2]), 0);
    tern_timer_stop(gone);                                /* out of the FIFO */
    assert_int_equal(tern_timer_again(moved, 60000), 0);  /* from the FIFO to the heap */
    assert_int_equal(tern_timer_again(t[3], 0), 0);       /* from the heap to the FIFO, last */
    assert_int_equal(tern_loop_run(loop), 0);
    assert_int_equal(log.n, 4);
    for (int i = 0; i < 4; i++)
        assert_int_equal(log.seen[i], i + 1);
    for (int i = 0; i < 4; i++)
        tern_timer_stop(t[i]);
    tern_timer_stop(moved);
    tern_loop_free(loop);
}

/* A timer re-armed at 0 ms from its own callback fires again only after
 * the loop has polled: a post made at its first firing runs before its
 * second (before, it spun through all its firings inside one run). */
typedef struct yielder {
    tern_loop *loop;
    int firings, fired_before_post;
} yielder;

static void yield_post(tern_loop *loop, void *user) {
    yielder *y = user;
    y->fired_before_post = y->firings;
}

static void yield_fire(tern_timer *t, void *user) {
    yielder *y = user;
    if (y->firings++ == 0)
        assert_int_equal(tern_loop_post(y->loop, yield_post, y), 0);
    if (y->firings < 100)
        assert_int_equal(tern_timer_again(t, 0), 0);
    else
        tern_loop_stop(y->loop);
}

static void timer_rearmed_at_zero_yields_to_io(void **state) {
    yielder y = {0};
    assert_int_equal(tern_loop_new(&y.loop, NULL), 0);
    tern_timer *t;
    assert_int_equal(tern_timer_start(y.loop, &t, 0, 0, yield_fire, &y), 0);
    assert_int_equal(tern_loop_run(y.loop), 0);
    assert_int_equal(y.firings, 100);
    assert_int_equal(y.fired_before_post, 1);
    tern_timer_stop(t);
    tern_loop_free(y.loop);
}

/* ---- the wheel -------------------------------------------------------- */

typedef struct wheel_probe {
    tern__wheel_entry e;
    uint64_t armed_at, fired_at;
    tern_loop *loop;
    int *remaining;
} wheel_probe;

static void probe_fire(tern__wheel_entry *e) {
    wheel_probe *p = tern__container_of(e, wheel_probe, e);
    p->fired_at = tern_loop_now(p->loop);
    if (--*p->remaining == 0)
        tern_loop_stop(p->loop);
}

static void wheel_fires_never_early_at_most_a_tick_late(void **state) {
    tern_loop *loop;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    enum { N = 6 };
    static const uint64_t delays[N] = {1, 50, 64, 100, 130, 300};
    wheel_probe p[N];
    int remaining = N;
    tern__wheel_set_fn(loop, probe_fire);
    for (int i = 0; i < N; i++) {
        p[i] = (wheel_probe){.loop = loop, .remaining = &remaining};
        tern__wheel_init_entry(&p[i].e);
        p[i].armed_at = tern_loop_now(loop);
        tern__wheel_set(loop, &p[i].e, delays[i]);
        assert_true(tern__wheel_armed(&p[i].e));
    }
    assert_int_equal(tern_loop_run(loop), 0);
    for (int i = 0; i < N; i++) {
        uint64_t waited = p[i].fired_at - p[i].armed_at;
        assert_true(waited >= delays[i]);
        assert_true(waited <= delays[i] + 2 * TERN__WHEEL_TICK_MS + 20);
        assert_false(tern__wheel_armed(&p[i].e));
    }
    tern_loop_free(loop);
}

static void wheel_cancel_and_move(void **state) {
    tern_loop *loop;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    int remaining = 1;
    wheel_probe a = {.loop = loop, .remaining = &remaining};
    wheel_probe b = {.loop = loop, .remaining = &remaining};
    tern__wheel_set_fn(loop, probe_fire);
    tern__wheel_init_entry(&a.e);
    tern__wheel_init_entry(&b.e);
    tern__wheel_set(loop, &a.e, 50);
    tern__wheel_set(loop, &a.e, 0);   /* cancelled */
    assert_false(tern__wheel_armed(&a.e));
    tern__wheel_set(loop, &b.e, 10000);
    tern__wheel_set(loop, &b.e, 80);  /* moved earlier */
    b.armed_at = tern_loop_now(loop);
    tern_timer *guard;
    assert_int_equal(tern_timer_start(loop, &guard, 3000, 0, stop_loop_fire, loop), 0);
    assert_int_equal(tern_loop_run(loop), 0);
    assert_int_equal(a.fired_at, 0);
    assert_true(b.fired_at - b.armed_at >= 80 && b.fired_at - b.armed_at < 2000);
    tern_timer_stop(guard);
    tern_loop_free(loop);
}

/* A deadline beyond one turn of the wheel (65 s) must wait for its turn.
 * Drive the wheel by hand with a made-up clock rather than wait a minute. */
static void wheel_long_deadline_waits_for_its_turn(void **state) {
    tern_loop *loop;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    int remaining = 1;
    wheel_probe p = {.loop = loop, .remaining = &remaining};
    tern__wheel_set_fn(loop, probe_fire);
    tern__wheel_init_entry(&p.e);
    uint64_t span = (uint64_t)TERN__WHEEL_TICK_MS * TERN__WHEEL_SLOTS;
    uint64_t t0 = loop->now_ms;
    tern__wheel_set(loop, &p.e, span + 5000);
    /* One full turn later, its slot has come round once: not yet. */
    for (uint64_t t = t0; t <= t0 + span + 1000; t += 500) {
        loop->now_ms = t;
        tern__wheel_run(loop);
    }
    assert_int_equal(p.fired_at, 0);
    assert_true(tern__wheel_armed(&p.e));
    for (uint64_t t = t0 + span + 1000; t <= t0 + span + 5000 + 2 * TERN__WHEEL_TICK_MS; t += 16) {
        loop->now_ms = t;
        tern__wheel_run(loop);
    }
    assert_true(p.fired_at >= t0 + span + 5000);
    assert_false(tern__wheel_armed(&p.e));
    tern_loop_free(loop);
}

/* ---- posts ------------------------------------------------------------ */

enum { THREADS = 4, POSTS_PER_THREAD = 20000 };

typedef struct post_state {
    tern_loop *loop;
    int received;
    int last_seen[THREADS];
    int out_of_order;
} post_state;

typedef struct post_msg {
    post_state *st;
    int thread, seq;
} post_msg;

static void on_post(tern_loop *loop, void *user) {
    post_msg *m = user;
    post_state *st = m->st;
    if (m->seq != st->last_seen[m->thread] + 1)
        st->out_of_order++;
    st->last_seen[m->thread] = m->seq;
    free(m);
    if (++st->received == THREADS * POSTS_PER_THREAD)
        tern_loop_stop(loop);
}

typedef struct producer_arg {
    post_state *st;
    int thread;
} producer_arg;

static void *producer(void *arg) {
    producer_arg *a = arg;
    for (int i = 0; i < POSTS_PER_THREAD; i++) {
        post_msg *m = malloc(sizeof(*m));
        *m = (post_msg){a->st, a->thread, i};
        while (tern_loop_post(a->st->loop, on_post, m) != 0)
            ;
    }
    return NULL;
}

static void posts_from_many_threads_all_arrive_in_order_per_thread(void **state) {
    tern_loop *loop;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    post_state st = {.loop = loop};
    for (int i = 0; i < THREADS; i++)
        st.last_seen[i] = -1;
    pthread_t th[THREADS];
    producer_arg args[THREADS];
    for (int i = 0; i < THREADS; i++) {
        args[i] = (producer_arg){&st, i};
        pthread_create(&th[i], NULL, producer, &args[i]);
    }
    assert_int_equal(tern_loop_run(loop), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(st.received, THREADS * POSTS_PER_THREAD);
    assert_int_equal(st.out_of_order, 0);
    tern_loop_free(loop);
}

static void *stopper(void *arg) {
    usleep(20000);
    tern_loop_stop_async(arg);
    return NULL;
}

static void stop_async_from_another_thread(void **state) {
    tern_loop *loop;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    pthread_t th;
    pthread_create(&th, NULL, stopper, loop);
    assert_int_equal(tern_loop_run(loop), 0);   /* returns: nothing else would stop it */
    pthread_join(th, NULL);
    tern_loop_free(loop);
}

/* ---- signals ---------------------------------------------------------- */

static void on_usr1(tern_loop *loop, int signo, void *user) {
    *(int *)user = signo;
    tern_loop_stop(loop);
}

static void signal_is_delivered_on_the_loop(void **state) {
    tern_loop *loop;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    int got = 0;
    assert_int_equal(tern_loop_on_signal(loop, SIGUSR1, on_usr1, &got), 0);
    kill(getpid(), SIGUSR1);
    assert_int_equal(tern_loop_run(loop), 0);
    assert_int_equal(got, SIGUSR1);
    tern_loop_free(loop);
}

/* ---- watchers removed mid-batch ---------------------------------------- */

/* Two ready eventfds in one batch; whichever callback runs first removes
 * and frees the other watcher. The other's queued event must not run
 * (under ASan a dispatch to it would be a use-after-free). */
typedef struct pair_watch {
    tern__io io;
    struct pair_watch **other;
    int *calls;
    tern_loop *loop;
} pair_watch;

static void pair_fired(tern__io *io, uint32_t revents) {
    (void)revents;
    pair_watch *w = tern__container_of(io, pair_watch, io);
    (*w->calls)++;
    pair_watch *o = *w->other;
    if (o != NULL) {
        tern__io_set(w->loop, &o->io, 0);
        close(o->io.fd);
        free(o);
        *w->other = NULL;
    }
    tern__io_set(w->loop, &w->io, 0);
    tern_loop_stop(w->loop);
}

static void removed_watcher_gets_no_queued_event(void **state) {
    (void)state;
    tern_loop *loop;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    int calls = 0;
    pair_watch *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));
    pair_watch *slot_a = a, *slot_b = b;
    a->other = &slot_b;  /* a frees b */
    b->other = &slot_a;  /* b frees a */
    pair_watch *ws[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        int fd = eventfd(1, EFD_NONBLOCK | EFD_CLOEXEC);
        assert_true(fd >= 0);
        tern__io_init(&ws[i]->io, fd, pair_fired);
        ws[i]->calls = &calls;
        ws[i]->loop = loop;
        assert_int_equal(tern__io_set(loop, &ws[i]->io, TERN__IO_IN), 0);
    }
    assert_int_equal(tern_loop_run(loop), 0);
    assert_int_equal(calls, 1);
    pair_watch *left = slot_a ? slot_a : slot_b;
    assert_non_null(left);
    assert_true(slot_a == NULL || slot_b == NULL);
    close(left->io.fd);
    free(left);
    tern_loop_free(loop);
}

/* ---- back ends ---------------------------------------------------------- */

/* The portable build has poll alone: asked for another, it uses poll. */
#ifdef TERN_PORTABLE
#define DEFAULT_BACKEND "poll"
#else
#define DEFAULT_BACKEND "epoll"
#endif

static void the_back_end_asked_for_is_used(void **state) {
    (void)state;
    tern_loop *loop;
    tern_loop_options opt = {.io = TERN_IO_EPOLL};
    assert_int_equal(tern_loop_new(&loop, &opt), 0);
    assert_string_equal(tern_loop_backend(loop), DEFAULT_BACKEND);
    tern_loop_free(loop);
    opt.io = TERN_IO_URING;
    assert_int_equal(tern_loop_new(&loop, &opt), 0);
#ifdef TERN_HAVE_URING
    assert_string_equal(tern_loop_backend(loop), "io_uring");
#else
    assert_string_equal(tern_loop_backend(loop), DEFAULT_BACKEND);
#endif
    tern_loop_free(loop);
    opt.io = TERN_IO_POLL;
    assert_int_equal(tern_loop_new(&loop, &opt), 0);
    assert_string_equal(tern_loop_backend(loop), "poll");
    tern_loop_free(loop);
}

static void post_stops(tern_loop *loop, void *user) {
    *(int *)user = 1;
    tern_loop_stop(loop);
}

/* Makes system calls a and b fail with EPERM in this process from now on,
 * as a container's seccomp policy would (for good: so only in a child). */
static int refuse_syscalls(int a, int b) {
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)a, 1, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)b, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {sizeof(filter) / sizeof(filter[0]), filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0)
        return -1;
    return 0;
}

/* As in a container whose seccomp policy refuses io_uring: the loop asked
 * for it runs on epoll (and says so in one log line). In a child, since a
 * seccomp filter cannot be taken back. */
static void refused_io_uring_falls_back_to_epoll(void **state) {
    (void)state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (refuse_syscalls(__NR_io_uring_setup, __NR_io_uring_setup) != 0)
            _exit(2);
        tern_loop *loop;
        tern_loop_options opt = {.io = TERN_IO_URING};
        if (tern_loop_new(&loop, &opt) != 0 ||
            strcmp(tern_loop_backend(loop), DEFAULT_BACKEND) != 0)
            _exit(3);
        int ran = 0;
        if (tern_loop_post(loop, post_stops, &ran) != 0 || tern_loop_run(loop) != 0 || !ran)
            _exit(4);
        tern_loop_free(loop);
        _exit(0);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

typedef struct reuse_watch {
    tern__io io;
    int calls;
    tern_loop *loop;
} reuse_watch;

static void reuse_fired(tern__io *io, uint32_t revents) {
    reuse_watch *w = tern__container_of(io, reuse_watch, io);
    w->calls++;
    tern__io_set(w->loop, &w->io, 0);
    tern_loop_stop(w->loop);
}

/* A watcher removed (interest 0), its descriptor closed by its owner and
 * the number taken at once by a new one: the new watcher gets its events,
 * and nothing of the old one's (io_uring names descriptors by number, so
 * work of the old one may still complete). */
static void a_reused_descriptor_number_serves_its_new_watcher(void **state) {
    (void)state;
    tern_loop *loop;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    reuse_watch old = {.loop = loop}, fresh = {.loop = loop};
    int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);   /* never readable */
    tern__io_init(&old.io, fd, reuse_fired);
    assert_int_equal(tern__io_set(loop, &old.io, TERN__IO_IN), 0);
    /* One turn, so the first watcher's wait is really in flight. */
    int ran = 0;
    assert_int_equal(tern_loop_post(loop, post_stops, &ran), 0);
    assert_int_equal(tern_loop_run(loop), 0);
    assert_int_equal(tern__io_set(loop, &old.io, 0), 0);
    close(fd);
    int fd2 = eventfd(1, EFD_NONBLOCK | EFD_CLOEXEC);   /* readable */
    assert_int_equal(fd2, fd);
    tern__io_init(&fresh.io, fd2, reuse_fired);
    assert_int_equal(tern__io_set(loop, &fresh.io, TERN__IO_IN), 0);
    assert_int_equal(tern_loop_run(loop), 0);
    assert_int_equal(fresh.calls, 1);
    assert_int_equal(old.calls, 0);
    close(fd2);
    tern_loop_free(loop);
}

/* ---- the peer's end alone (TERN__IO_RDHUP without TERN__IO_IN) --------- */

typedef struct end_watch {
    tern__io io;
    tern_loop *loop;
    uint32_t seen;
    int calls;
} end_watch;

static void end_fired(tern__io *io, uint32_t revents) {
    end_watch *w = tern__container_of(io, end_watch, io);
    w->seen |= revents;
    w->calls++;
    tern__io_set(w->loop, &w->io, 0);   /* told once: stop asking, as net does */
    tern_loop_stop(w->loop);
}

static void stop_timer(tern_timer *t, void *user) { tern_loop_stop(user); }

/* Watches one end of a fresh socket pair for the peer's end alone, lets
 * `peer` act on the other end, and runs the loop until the watcher is told
 * something or 200 ms pass. */
static end_watch watch_end(tern_loop *loop, void (*peer)(int fd)) {
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
    end_watch w = {.loop = loop};
    tern__io_init(&w.io, sv[0], end_fired);
    assert_int_equal(tern__io_set(loop, &w.io, TERN__IO_RDHUP), 0);
    peer(sv[1]);
    tern_timer *t;
    assert_int_equal(tern_timer_start(loop, &t, 200, 0, stop_timer, loop), 0);
    assert_int_equal(tern_loop_run(loop), 0);
    tern_timer_stop(t);
    tern__io_close(loop, &w.io);
    close(sv[1]);
    return w;
}

static void peer_writes(int fd) { assert_int_equal(write(fd, "x", 1), 1); }
static void peer_shuts(int fd) { assert_int_equal(shutdown(fd, SHUT_WR), 0); }

/* The back-end contract (loop_internal.h): a watcher asking for the peer's
 * end alone (a paused connection) is told of the end, and never of bytes,
 * on every back end (poll by a peek). */
static void the_peers_end_alone_is_told_and_bytes_are_not(void **state) {
    (void)state;
    tern_loop *loop;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    end_watch bytes = watch_end(loop, peer_writes);
    assert_int_equal(bytes.calls, 0);
    end_watch end = watch_end(loop, peer_shuts);
    assert_int_equal(end.calls, 1);
    assert_true(end.seen & TERN__IO_RDHUP);
    assert_false(end.seen & TERN__IO_IN);
    tern_loop_free(loop);
}

/* ---- listeners (tern__io_acceptor, tern__io_accept) -------------------- */

typedef struct accept_watch {
    tern__io io;
    tern_loop *loop;
    int held[24];
    int taken, want;
    bool out_of_fds;
} accept_watch;

/* Keeps every connection open; out of descriptors, it stops wanting any,
 * as the listener's back-off does. */
static void accept_fired(tern__io *io, uint32_t revents) {
    accept_watch *w = tern__container_of(io, accept_watch, io);
    for (;;) {
        int fd = tern__io_accept(w->loop, io);
        if (fd == -EMFILE) {
            tern__io_set(w->loop, io, 0);
            w->out_of_fds = true;
            tern_loop_stop(w->loop);
            return;
        }
        if (fd < 0) {
            if (fd != -EAGAIN)
                _exit(10);
            return;
        }
        w->held[w->taken++] = fd;
        if (w->taken == w->want) {
            tern_loop_stop(w->loop);
            return;
        }
    }
}

/* A listener's connections come through the back end: on io_uring by its
 * multishot accept, so the child runs with accept and accept4 refused by
 * seccomp (on epoll, tern__io_accept is accept4). 20 connections wait in
 * the accept queue and the process may open only 8 more descriptors: the
 * listener takes 8, is told EMFILE and stops wanting any; with the limit
 * raised it asks again and takes the other 12, none lost. Then it closes
 * with one more waiting. */
static void a_listener_takes_its_connections_through_the_back_end(void **state) {
    (void)state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        tern_loop *loop;
        if (tern_loop_new(&loop, NULL) != 0)
            _exit(2);
        bool uring = strcmp(tern_loop_backend(loop), "io_uring") == 0;
        int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t alen = sizeof(a);
        if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(lfd, 64) != 0 ||
            getsockname(lfd, (struct sockaddr *)&a, &alen) != 0)
            _exit(3);
        if (uring && refuse_syscalls(__NR_accept4, __NR_accept) != 0)
            _exit(4);
        int clients[21], top = lfd;
        for (int i = 0; i < 20; i++) {
            clients[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (clients[i] < 0 || connect(clients[i], (struct sockaddr *)&a, sizeof(a)) != 0)
                _exit(5);
            top = clients[i] > top ? clients[i] : top;
        }
        /* One turn first: the ring and its buffers exist once it runs. */
        int ran = 0;
        if (tern_loop_post(loop, post_stops, &ran) != 0 || tern_loop_run(loop) != 0)
            _exit(7);
        /* Room for 8 more descriptors. */
        struct rlimit was, low;
        getrlimit(RLIMIT_NOFILE, &was);
        low = was;
        low.rlim_cur = (rlim_t)top + 1 + 8;
        accept_watch w = {.loop = loop, .want = 20};
        tern__io_init(&w.io, lfd, accept_fired);
        if (tern__io_acceptor(loop, &w.io, false) != uring || tern__io_set(loop, &w.io, TERN__IO_IN) != 0)
            _exit(6);
        if (setrlimit(RLIMIT_NOFILE, &low) != 0 || tern_loop_run(loop) != 0 || !w.out_of_fds ||
            w.taken != 8)
            _exit(8);
        int before = w.taken;
        if (setrlimit(RLIMIT_NOFILE, &was) != 0)
            _exit(9);
        /* Nothing is taken while it wants nothing. */
        ran = 0;
        if (tern_loop_post(loop, post_stops, &ran) != 0 || tern_loop_run(loop) != 0 ||
            w.taken != before)
            _exit(11);
        tern__io_acceptor(loop, &w.io, false);
        if (tern__io_set(loop, &w.io, TERN__IO_IN) != 0 || tern_loop_run(loop) != 0 || w.taken != 20)
            _exit(12);
        clients[20] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (connect(clients[20], (struct sockaddr *)&a, sizeof(a)) != 0)
            _exit(13);
        tern__io_close(loop, &w.io);
        ran = 0;
        if (tern_loop_post(loop, post_stops, &ran) != 0 || tern_loop_run(loop) != 0 || w.taken != 20)
            _exit(14);
        tern_loop_free(loop);
        for (int i = 0; i < 21; i++)
            close(clients[i]);
        for (int i = 0; i < w.taken; i++)
            close(w.held[i]);
        _exit(0);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* Takes one connection, then wants none: a listener parking a connection
 * at its descriptor line. */
static void accept_one_fired(tern__io *io, uint32_t revents) {
    (void)revents;
    accept_watch *w = tern__container_of(io, accept_watch, io);
    int fd = tern__io_accept(w->loop, io);
    if (fd < 0)
        return;
    w->held[w->taken++] = fd;
    tern__io_set(w->loop, io, 0);
    tern_loop_stop(w->loop);
}

/* one_at_a_time (a listener near its descriptor reserve): the back end
 * takes no connection before the watcher took the one before. Nine wait
 * in the accept queue; the watcher takes one and stops wanting any: the
 * others are still in the kernel's queue (accept4 takes three of them),
 * none taken ahead by the back end and closed. Then, allowed to take
 * ahead again (one_at_a_time off), the back end hands over the last five. */
static void one_at_a_time_takes_none_ahead(void **state) {
    (void)state;
    tern_loop *loop;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof(a);
    assert_true(lfd >= 0);
    assert_int_equal(bind(lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(lfd, 64), 0);
    assert_int_equal(getsockname(lfd, (struct sockaddr *)&a, &alen), 0);
    int clients[9];
    for (int i = 0; i < 9; i++) {
        clients[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        assert_true(clients[i] >= 0);
        assert_int_equal(connect(clients[i], (struct sockaddr *)&a, sizeof(a)), 0);
    }
    accept_watch w = {.loop = loop, .want = 9};
    tern__io_init(&w.io, lfd, accept_one_fired);
    tern__io_acceptor(loop, &w.io, true);
    assert_int_equal(tern__io_set(loop, &w.io, TERN__IO_IN), 0);
    assert_int_equal(tern_loop_run(loop), 0);
    assert_int_equal(w.taken, 1);
    /* A turn more: whatever the back end still had in flight completes. */
    int ran = 0;
    assert_int_equal(tern_loop_post(loop, post_stops, &ran), 0);
    assert_int_equal(tern_loop_run(loop), 0);
    int queued = 0, fd;
    while (queued < 3 && (fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC)) >= 0) {
        close(fd);
        queued++;
    }
    assert_int_equal(queued, 3);   /* still in the queue, not closed */
    /* And the rest come through the back end, taking them ahead or not. */
    w.io.fn = accept_fired;
    w.want = w.taken + 5;
    tern__io_acceptor(loop, &w.io, false);
    assert_int_equal(tern__io_set(loop, &w.io, TERN__IO_IN), 0);
    assert_int_equal(tern_loop_run(loop), 0);
    assert_int_equal(w.taken, 6);
    tern__io_close(loop, &w.io);
    tern_loop_free(loop);
    for (int i = 0; i < 9; i++)
        close(clients[i]);
    for (int i = 0; i < w.taken; i++)
        close(w.held[i]);
}

/* ---- streams: the provided buffers run out ------------------------------ */

#define NSTREAMS 200
#define PER_STREAM (96 * 1024)

typedef struct stream_watch {
    tern__io io;
    tern_loop *loop;
    size_t got;
    int *done;
    bool stream;   /* served by the back end (io_uring); else read with recv */
} stream_watch;

static ssize_t stream_read(stream_watch *w, char *buf, size_t len) {
    if (w->stream)
        return tern__io_recv(w->loop, &w->io, buf, len);
    ssize_t n = recv(w->io.fd, buf, len, 0);
    return n < 0 ? -errno : n;
}

static void stream_fired(tern__io *io, uint32_t revents) {
    stream_watch *w = tern__container_of(io, stream_watch, io);
    char buf[16384];
    ssize_t n;
    while ((n = stream_read(w, buf, sizeof(buf))) > 0)
        w->got += (size_t)n;
    if (n == 0 || (n < 0 && n != -EAGAIN)) {
        tern__io_set(w->loop, io, 0);
        if (++*w->done == NSTREAMS)
            tern_loop_stop(w->loop);
    }
}

/* 200 streams whose peers wrote 96 KiB each and closed before the loop
 * first runs: on io_uring every receive completes at once and together
 * they want 600 of the loop's 128 provided buffers. The receives that
 * find none end (ENOBUFS) and are armed again; every byte and every end
 * arrives. (On epoll: the same reads, by readiness.) */
static void streams_outrunning_the_provided_buffers_get_every_byte(void **state) {
    (void)state;
    tern_loop *loop;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    static stream_watch w[NSTREAMS];
    static char data[PER_STREAM];
    memset(data, 'z', sizeof(data));
    int done = 0;
    int peers[NSTREAMS];
    for (int i = 0; i < NSTREAMS; i++) {
        int sv[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
        int big = 256 * 1024;
        setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
        setsockopt(sv[0], SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
        w[i] = (stream_watch){.loop = loop, .done = &done};
        tern__io_init(&w[i].io, sv[0], stream_fired);
        w[i].stream = tern__io_stream(loop, &w[i].io, true);
        assert_int_equal(tern__io_set(loop, &w[i].io, TERN__IO_IN), 0);
        peers[i] = sv[1];
    }
    /* Written and closed before the loop runs. */
    for (int i = 0; i < NSTREAMS; i++) {
        size_t off = 0;
        while (off < sizeof(data)) {
            ssize_t n = write(peers[i], data + off, sizeof(data) - off);
            if (n < 0)
                break;
            off += (size_t)n;
        }
        assert_int_equal(off, sizeof(data));
        close(peers[i]);
    }
    assert_int_equal(tern_loop_run(loop), 0);
    for (int i = 0; i < NSTREAMS; i++) {
        assert_int_equal(w[i].got, PER_STREAM);
        tern__io_close(loop, &w[i].io);
    }
    tern_loop_free(loop);
}

/* ---- streams: a close for a peer that stopped reading ------------------ */

static void quiet_fired(tern__io *io, uint32_t revents) {
    (void)io;
    (void)revents;
}

/* Whether the peer of fd sees its end: fd's descriptor is closed. */
static bool peer_sees_end(int peer) {
    struct pollfd p = {.fd = peer, .events = POLLIN};
    return poll(&p, 1, 0) == 1 && (p.revents & POLLHUP);
}

/* A stream whose peer never reads, with a send in flight that the socket
 * cannot take, closed dropping what it holds (net's send timeout): the
 * descriptor closes within a few turns, not after the CLOSE_SEND_MS
 * io_uring gives the last send of an ordinary close (the peer would see
 * the cut that late). Epoll holds no sends: its close is at once. */
static void a_close_dropping_unsent_bytes_ends_at_once(void **state) {
    (void)state;
    tern_loop *loop;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
    tern__io io;
    tern__io_init(&io, sv[0], quiet_fired);
    if (tern__io_stream(loop, &io, true)) {
        assert_int_equal(tern__io_set(loop, &io, TERN__IO_IN), 0);
        static char data[1 << 20];
        struct iovec iov = {data, sizeof(data)};
        assert_true(tern__io_send(loop, &io, &iov, 1) > 0);
        /* A turn: the send is submitted, and stays in flight (the socket
         * holds far less than 1 MiB and nobody reads). */
        int ran = 0;
        assert_int_equal(tern_loop_post(loop, post_stops, &ran), 0);
        assert_int_equal(tern_loop_run(loop), 0);
        assert_true(tern__io_unsent(loop, &io) > 0);
    }
    uint64_t start = tern_loop_now(loop);
    tern__io_close_dropping(loop, &io);
    /* Turns until the peer sees the end, for at most half CLOSE_SEND_MS:
     * a cancel takes a turn or two; an ordinary close would take 2 s. */
    while (!peer_sees_end(sv[1]) && tern_loop_now(loop) - start < 1000) {
        int ran = 0;
        assert_int_equal(tern_loop_post(loop, post_stops, &ran), 0);
        assert_int_equal(tern_loop_run(loop), 0);
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    assert_true(peer_sees_end(sv[1]));
    tern_loop_free(loop);
    close(sv[1]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(timers_fire_in_deadline_order),
        cmocka_unit_test(streams_outrunning_the_provided_buffers_get_every_byte),
        cmocka_unit_test(a_listener_takes_its_connections_through_the_back_end),
        cmocka_unit_test(one_at_a_time_takes_none_ahead),
        cmocka_unit_test(repeating_timer_repeats_and_stops_itself),
        cmocka_unit_test(stopped_timer_never_fires_and_again_rearms),
        cmocka_unit_test(zero_ms_timers_fire_in_the_heaps_order),
        cmocka_unit_test(timer_rearmed_at_zero_yields_to_io),
        cmocka_unit_test(wheel_fires_never_early_at_most_a_tick_late),
        cmocka_unit_test(wheel_cancel_and_move),
        cmocka_unit_test(wheel_long_deadline_waits_for_its_turn),
        cmocka_unit_test(posts_from_many_threads_all_arrive_in_order_per_thread),
        cmocka_unit_test(stop_async_from_another_thread),
        cmocka_unit_test(signal_is_delivered_on_the_loop),
        cmocka_unit_test(removed_watcher_gets_no_queued_event),
        cmocka_unit_test(the_back_end_asked_for_is_used),
        cmocka_unit_test(refused_io_uring_falls_back_to_epoll),
        cmocka_unit_test(the_peers_end_alone_is_told_and_bytes_are_not),
        cmocka_unit_test(a_reused_descriptor_number_serves_its_new_watcher),
        cmocka_unit_test(a_close_dropping_unsent_bytes_ends_at_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
