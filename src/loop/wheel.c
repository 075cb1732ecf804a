/* Hashed timer wheel for connection timeouts.
 *
 * Arming, moving and cancelling are O(1) list operations, which matters
 * because every request moves its connection's timeout and almost none
 * fire. Each slot is a circular list with a sentinel in loop->wheel. */
#include "loop/loop_internal.h"

static uint64_t tick_of(uint64_t ms) { return ms / TERN__WHEEL_TICK_MS; }

static void unlink_entry(tern__wheel_entry *e) {
    e->prev->next = e->next;
    e->next->prev = e->prev;
    e->next = e->prev = NULL;
}

static void link_entry(tern_loop *loop, tern__wheel_entry *e) {
    tern__wheel_entry *head = &loop->wheel[e->deadline_tick % TERN__WHEEL_SLOTS];
    e->next = head;
    e->prev = head->prev;
    head->prev->next = e;
    head->prev = e;
}

void tern__wheel_init(tern_loop *loop) {
    for (size_t i = 0; i < TERN__WHEEL_SLOTS; i++)
        loop->wheel[i].next = loop->wheel[i].prev = &loop->wheel[i];
    loop->wheel_tick = tick_of(loop->now_ms);
    loop->wheel_count = 0;
}

void tern__wheel_set_fn(tern_loop *loop, tern__wheel_fn fn) { loop->wheel_fn = fn; }

void tern__wheel_init_entry(tern__wheel_entry *e) {
    e->next = e->prev = NULL;
    e->deadline_tick = 0;
}

void tern__wheel_set(tern_loop *loop, tern__wheel_entry *e, uint64_t ms) {
    if (ms == 0) {
        if (e->prev) {
            unlink_entry(e);
            loop->wheel_count--;
        }
        return;
    }
    /* Rounded up so that a timeout never fires early. */
    uint64_t deadline = tick_of(loop->now_ms + ms + TERN__WHEEL_TICK_MS - 1);
    if (deadline <= loop->wheel_tick)
        deadline = loop->wheel_tick + 1;
    if (e->prev) {
        if (e->deadline_tick == deadline)
            return;
        unlink_entry(e);
        loop->wheel_count--;
    }
    e->deadline_tick = deadline;
    link_entry(loop, e);
    loop->wheel_count++;
}

/* Runs every slot from the last tick run up to now. An entry whose
 * deadline is a later turn of the wheel goes back into its slot. */
void tern__wheel_run(tern_loop *loop) {
    uint64_t now = tick_of(loop->now_ms);
    if (loop->wheel_count == 0) {
        loop->wheel_tick = now;
        return;
    }
    /* After a long sleep, one turn covers every slot. */
    if (now - loop->wheel_tick > TERN__WHEEL_SLOTS)
        loop->wheel_tick = now - TERN__WHEEL_SLOTS;
    while (loop->wheel_tick < now) {
        loop->wheel_tick++;
        tern__wheel_entry *head = &loop->wheel[loop->wheel_tick % TERN__WHEEL_SLOTS];
        if (head->next == head)
            continue;
        /* Move the slot onto a local list first: callbacks may arm entries
         * into this slot (for a later turn) or cancel entries still on the
         * local list, and both stay correct on separate lists. */
        tern__wheel_entry local = {.next = head->next, .prev = head->prev};
        local.next->prev = &local;
        local.prev->next = &local;
        head->next = head->prev = head;
        while (local.next != &local) {
            tern__wheel_entry *e = local.next;
            unlink_entry(e);
            if (e->deadline_tick > now) {
                link_entry(loop, e);
                continue;
            }
            loop->wheel_count--;
            loop->wheel_fn(e);
        }
    }
}

/* Milliseconds until the next tick when anything is armed, else -1. */
int tern__wheel_timeout(const tern_loop *loop) {
    if (loop->wheel_count == 0)
        return -1;
    uint64_t next_ms = (tick_of(loop->now_ms) + 1) * TERN__WHEEL_TICK_MS;
    return (int)(next_ms - loop->now_ms);
}
