/* Counters written by one thread and read by any: a loop's statistics
 * (the server's, pub/sub's). */
#ifndef TERN_LOOP_COUNTER_H
#define TERN_LOOP_COUNTER_H

#include <stdatomic.h>
#include <stdint.h>

/* counter (an _Atomic uint64_t lvalue) += n. Its one writer is the loop
 * that owns it, so a relaxed load and a relaxed store do (plain moves, no
 * locked instruction); a reader on another thread sees each value whole,
 * never a torn one. */
#define TERN__COUNTER_ADD(counter, n)                                                         \
    atomic_store_explicit(&(counter),                                                        \
                          atomic_load_explicit(&(counter), memory_order_relaxed) +           \
                              (uint64_t)(n),                                                 \
                          memory_order_relaxed)

/* counter's value, read by any thread: each value whole, the counters of
 * one struct not a snapshot together. */
#define TERN__COUNTER_GET(counter) atomic_load_explicit(&(counter), memory_order_relaxed)

#endif
