/* Precise timers: a binary min-heap ordered by deadline. */
#include <errno.h>
#include <stdlib.h>

#include "loop/check.h"
#include "loop/loop_internal.h"

/* Invariants: heap_index is the timer's position in loop->heap while it is
 * armed, and SIZE_MAX while it is idle (a one-shot that fired, or new);
 * magic is TERN__MAGIC_TIMER until the timer is freed (loop/check.h). */
struct tern_timer {
    uint32_t magic;
    tern_loop *loop;
    uint64_t deadline;
    uint64_t repeat;
    uint64_t seq;          /* ties broken by arming order */
    size_t heap_index;
    tern_timer_fn fn;
    void *user;
};

static bool before(const tern_timer *a, const tern_timer *b) {
    return a->deadline < b->deadline || (a->deadline == b->deadline && a->seq < b->seq);
}

static void heap_swap(tern_loop *loop, size_t i, size_t j) {
    tern_timer *t = loop->heap[i];
    loop->heap[i] = loop->heap[j];
    loop->heap[j] = t;
    loop->heap[i]->heap_index = i;
    loop->heap[j]->heap_index = j;
}

static void sift_up(tern_loop *loop, size_t i) {
    while (i > 0 && before(loop->heap[i], loop->heap[(i - 1) / 2])) {
        heap_swap(loop, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
}

static void sift_down(tern_loop *loop, size_t i) {
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < loop->heap_len && before(loop->heap[l], loop->heap[m]))
            m = l;
        if (r < loop->heap_len && before(loop->heap[r], loop->heap[m]))
            m = r;
        if (m == i)
            return;
        heap_swap(loop, i, m);
        i = m;
    }
}

static void heap_remove(tern_loop *loop, tern_timer *t) {
    size_t i = t->heap_index;
    size_t last = --loop->heap_len;
    if (i != last) {
        heap_swap(loop, i, last);
        sift_down(loop, i);
        sift_up(loop, i);
    }
    t->heap_index = SIZE_MAX;
}

static int heap_insert(tern_loop *loop, tern_timer *t) {
    if (loop->heap_len == loop->heap_cap) {
        size_t cap = loop->heap_cap ? loop->heap_cap * 2 : 16;
        tern_timer **h = realloc(loop->heap, cap * sizeof(*h));
        if (h == NULL)
            return -ENOMEM;
        loop->heap = h;
        loop->heap_cap = cap;
    }
    t->heap_index = loop->heap_len;
    loop->heap[loop->heap_len++] = t;
    sift_up(loop, t->heap_index);
    return 0;
}

static void arm(tern_timer *t, uint64_t timeout_ms) {
    /* The loop's cached time may be a whole batch old (or older, before
     * the loop first runs); a precise timer counts from now. */
    tern__loop_update_time(t->loop);
    t->deadline = t->loop->now_ms + timeout_ms;
    t->seq = t->loop->timer_seq++;
}

int tern_timer_start(tern_loop *loop, tern_timer **out, uint64_t timeout_ms, uint64_t repeat_ms,
                     tern_timer_fn fn, void *user) {
    if (loop == NULL || out == NULL || fn == NULL)
        return -EINVAL;
    if (!tern__loop_thread_ok(loop, __func__))
        return -EPERM;
    tern_timer *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return -ENOMEM;
    t->magic = TERN__MAGIC_TIMER;
    t->loop = loop;
    t->repeat = repeat_ms;
    t->fn = fn;
    t->user = user;
    arm(t, timeout_ms);
    int err = heap_insert(loop, t);
    if (err < 0) {
        free(t);
        return err;
    }
    *out = t;
    return 0;
}

int tern_timer_again(tern_timer *t, uint64_t timeout_ms) {
    if (t == NULL)
        return -EINVAL;
    TERN__ASSERT_MAGIC(t, TERN__MAGIC_TIMER, "timer");
    if (!tern__loop_thread_ok(t->loop, __func__))
        return -EPERM;
    TERN__ASSERT(t->heap_index == SIZE_MAX ||
                     (t->heap_index < t->loop->heap_len && t->loop->heap[t->heap_index] == t),
                 "heap_index is not the timer's place in the heap");
    if (t->heap_index != SIZE_MAX)
        heap_remove(t->loop, t);
    arm(t, timeout_ms);
    return heap_insert(t->loop, t);   /* fails (idle timer) only on -ENOMEM */
}

void tern_timer_stop(tern_timer *t) {
    if (t == NULL)
        return;
    TERN__ASSERT_MAGIC(t, TERN__MAGIC_TIMER, "timer");
    TERN__ASSERT_LOOP_THREAD(t->loop);
    if (t->heap_index != SIZE_MAX)
        heap_remove(t->loop, t);
    t->magic = TERN__MAGIC_DEAD;
    tern__check_free(t);
}

void tern__timers_run(tern_loop *loop) {
    /* Only the timers armed before this run: one a callback arms (or
     * re-arms) now, even at 0 ms, fires at the next turn, after the loop
     * has polled, so a timer that re-arms itself at 0 ms yields to I/O
     * instead of spinning here. */
    uint64_t first_new = loop->timer_seq;
    while (loop->heap_len > 0 && loop->heap[0]->deadline <= loop->now_ms &&
           loop->heap[0]->seq < first_new) {
        tern_timer *t = loop->heap[0];
        heap_remove(loop, t);
        if (t->repeat) {
            t->deadline += t->repeat;
            if (t->deadline <= loop->now_ms)   /* fell behind: don't fire in a burst */
                t->deadline = loop->now_ms + t->repeat;
            t->seq = t->loop->timer_seq++;
            heap_insert(loop, t);
        }
        /* Last: the callback may stop (free) or re-arm t. */
        t->fn(t, t->user);
    }
}

int tern__timers_timeout(const tern_loop *loop) {
    if (loop->heap_len == 0)
        return -1;
    uint64_t d = loop->heap[0]->deadline;
    if (d <= loop->now_ms)
        return 0;
    uint64_t ms = d - loop->now_ms;
    return ms > 1000000 ? 1000000 : (int)ms;
}

void tern__timers_free(tern_loop *loop) {
    /* Timers still armed go with their loop (a repeating one that nobody
     * stopped, such as a server's periodic job). */
    for (size_t i = 0; i < loop->heap_len; i++) {
        loop->heap[i]->magic = TERN__MAGIC_DEAD;
        tern__check_free(loop->heap[i]);
    }
    free(loop->heap);
    loop->heap = NULL;
    loop->heap_len = loop->heap_cap = 0;
}
