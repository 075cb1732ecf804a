/* Precise timers: a binary min-heap ordered by deadline, and beside it a
 * FIFO of the timers armed at 0 ms ("at the next turn": a sink's
 * delivery, a batch's next chunk, a deferred call), which would otherwise
 * cost a sift to the heap's top and back on every arm. The FIFO is
 * ordered as the heap is, by deadline then arming order, since a 0 ms
 * timer's deadline is the (monotonic) time it was armed at; a run takes
 * the earlier of the two heads each time, so the firing order is the
 * one a single heap would give. */
#include <errno.h>
#include <stdlib.h>

#include "loop/check.h"
#include "loop/loop_internal.h"

/* Invariants: heap_index is the timer's position in loop->heap while it is
 * armed there, IN_NOW while it is in loop's 0 ms FIFO (linked by
 * now_prev/now_next), and SIZE_MAX while it is idle (a one-shot that
 * fired, or new); magic is TERN__MAGIC_TIMER until the timer is freed
 * (loop/check.h). */
struct tern_timer {
    uint32_t magic;
    tern_loop *loop;
    uint64_t deadline;
    uint64_t repeat;
    uint64_t seq;          /* ties broken by arming order */
    size_t heap_index;
    tern_timer *now_prev, *now_next;
    tern_timer_fn fn;
    void *user;
};

#define IN_NOW (SIZE_MAX - 1)

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

static void now_append(tern_loop *loop, tern_timer *t) {
    t->heap_index = IN_NOW;
    t->now_next = NULL;
    t->now_prev = loop->now_tail;
    if (loop->now_tail)
        loop->now_tail->now_next = t;
    else
        loop->now_head = t;
    loop->now_tail = t;
}

static void now_remove(tern_loop *loop, tern_timer *t) {
    if (t->now_prev)
        t->now_prev->now_next = t->now_next;
    else
        loop->now_head = t->now_next;
    if (t->now_next)
        t->now_next->now_prev = t->now_prev;
    else
        loop->now_tail = t->now_prev;
    t->now_prev = t->now_next = NULL;
    t->heap_index = SIZE_MAX;
}

/* Takes an armed t out of the heap or the FIFO. */
static void disarm(tern_loop *loop, tern_timer *t) {
    if (t->heap_index == IN_NOW)
        now_remove(loop, t);
    else if (t->heap_index != SIZE_MAX)
        heap_remove(loop, t);
}

/* Arms t, armed with arm(): at 0 ms in the FIFO, else in the heap. */
static int insert(tern_loop *loop, tern_timer *t, uint64_t timeout_ms) {
    if (timeout_ms == 0) {
        now_append(loop, t);
        return 0;
    }
    return heap_insert(loop, t);
}

static void arm(tern_timer *t, uint64_t timeout_ms) {
    /* The loop's cached time may be a whole batch old (or older, before
     * the loop first runs); a precise timer counts from now. (At 0 ms too:
     * its deadline orders it against the heap's overdue timers.) */
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
    int err = insert(loop, t, timeout_ms);
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
    TERN__ASSERT(t->heap_index == SIZE_MAX || t->heap_index == IN_NOW ||
                     (t->heap_index < t->loop->heap_len && t->loop->heap[t->heap_index] == t),
                 "heap_index is not the timer's place in the heap");
    disarm(t->loop, t);
    arm(t, timeout_ms);
    return insert(t->loop, t, timeout_ms);   /* fails (idle timer) only on -ENOMEM */
}

void tern_timer_stop(tern_timer *t) {
    if (t == NULL)
        return;
    TERN__ASSERT_MAGIC(t, TERN__MAGIC_TIMER, "timer");
    TERN__ASSERT_LOOP_THREAD(t->loop);
    disarm(t->loop, t);
    t->magic = TERN__MAGIC_DEAD;
    tern__check_free(t);
}

/* The timer that fires next if it is due and was armed before the run
 * began (seq below first_new): the earlier of the heap's top and the
 * FIFO's head, or NULL. */
static tern_timer *next_due(tern_loop *loop, uint64_t first_new) {
    tern_timer *h = loop->heap_len > 0 && loop->heap[0]->deadline <= loop->now_ms &&
                            loop->heap[0]->seq < first_new
                        ? loop->heap[0]
                        : NULL;
    tern_timer *n = loop->now_head && loop->now_head->seq < first_new ? loop->now_head : NULL;
    if (h && n)
        return before(h, n) ? h : n;
    return h ? h : n;
}

void tern__timers_run(tern_loop *loop) {
    /* Only the timers armed before this run: one a callback arms (or
     * re-arms) now, even at 0 ms, fires at the next turn, after the loop
     * has polled, so a timer that re-arms itself at 0 ms yields to I/O
     * instead of spinning here. */
    uint64_t first_new = loop->timer_seq;
    tern_timer *t;
    while ((t = next_due(loop, first_new)) != NULL) {
        disarm(loop, t);
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
    if (loop->now_head)
        return 0;
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
    while (loop->now_head) {
        tern_timer *t = loop->now_head;
        now_remove(loop, t);
        t->magic = TERN__MAGIC_DEAD;
        tern__check_free(t);
    }
    free(loop->heap);
    loop->heap = NULL;
    loop->heap_len = loop->heap_cap = 0;
}
