/* The loop struct itself, shared by the files of src/loop/ only. */
#ifndef TERN_LOOP_INTERNAL_H
#define TERN_LOOP_INTERNAL_H

#include <signal.h>
#include <sys/epoll.h>

#include "loop/loop.h"

/* A node of the cross-thread post queue (Vyukov's intrusive MPSC queue:
 * producers exchange the head, the loop thread alone pops at the tail). */
typedef struct tern__post {
    _Atomic(struct tern__post *) next;
    tern_post_fn fn;
    void *user;
} tern__post;

typedef struct tern__signal {
    int signo;
    tern_signal_fn fn;
    void *user;
} tern__signal;

#define TERN__MAX_SIGNALS 8

/* Invariants:
 * - now_ms is CLOCK_MONOTONIC read at the top of the current iteration;
 *   wheel_tick is the last tick whose slot has been run.
 * - heap[0..heap_len) is a binary min-heap on deadline, each timer's
 *   heap_index its position.
 * - post_tail/post_head/post_sentinel form the MPSC queue; wake_pending is 1
 *   from the first post after a drain until the loop drains again, so a
 *   burst of posts writes the eventfd once. */
struct tern_loop {
    int epfd;
    bool stopping;
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
    uint64_t timer_seq;               /* arming order, to break deadline ties */

    /* cross-thread posts */
    tern__io wake_io;                 /* eventfd */
    _Atomic(tern__post *) post_head;  /* producers push here */
    tern__post *post_tail;            /* the loop pops here */
    tern__post post_sentinel;
    atomic_int wake_pending;

    /* signals */
    tern__io signal_io;               /* signalfd, or fd -1 */
    sigset_t signal_set;
    tern__signal signals[TERN__MAX_SIGNALS];
    int nsignals;

    tern__loop_hook batch_end;
    void *slots[TERN__SLOT_COUNT];
    tern__loop_hook slot_hooks[TERN__SLOT_COUNT];

    /* The batch being dispatched: events [batch_next, batch_len) are still
     * to run. A watcher removed meanwhile has its pending events cleared
     * here, so a callback may free a watcher that has an event queued. */
    struct epoll_event *batch;
    int batch_next, batch_len;
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
