/* A topic's history, for subscribers that come back: the last messages
 * published to it (references to their prepared frames, each with its seq
 * and the time it was published), bounded by a count and an age, and the
 * latest message of each key, for a subscriber whose resume point the
 * history no longer reaches.
 *
 * Not thread-safe: the pub/sub group's mutex guards every call. Nothing
 * here copies a frame; a reference handed out is the caller's to free
 * (tern_ws_prepared_free), outside the mutex if it likes. */
#ifndef TERN_PUBSUB_HISTORY_H
#define TERN_PUBSUB_HISTORY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tern/ws.h"

typedef struct tern__hist tern__hist;

/* Keeps at most max_count messages (>= 1), none older than max_ms (0: no
 * age limit). *total (shared by the histories of one group, guarded by
 * the same mutex) counts the bytes of the frames every history keeps: a
 * message once in the ring and once more as its key's latest. NULL when
 * out of memory. */
tern__hist *tern__hist_new(uint32_t max_count, uint64_t max_ms, size_t *total);
void tern__hist_free(tern__hist *h);
/* Forgets every message and key (a new epoch: none of them can be read
 * back under it). */
void tern__hist_clear(tern__hist *h);

/* Appends msg (taking a reference) as seq, published at now_ms, with its
 * key (NULL: none; the latest-per-key record then keeps it under the
 * empty key). seq must be above every seq added before. The oldest
 * message goes when the count is reached. Returns 0, or -ENOMEM (then the
 * history has lost messages: tern__hist_first says from where). */
int tern__hist_add(tern__hist *h, uint64_t seq, uint64_t now_ms, tern_ws_prepared *msg,
                   const char *key, size_t klen);

/* Puts msg (taking a reference) in its place by seq among those kept,
 * which may be before newer ones: a message read back from a broker
 * after this node had newer ones (pubsub's bridge). One already kept
 * under seq stays; one that would be the oldest of a full ring is not
 * kept. Its time is that of the message after it (now_ms when none), so
 * that the ring stays in time order for the age limit. Its key's latest
 * message changes only if it is newer. Returns 0, or -ENOMEM (then the
 * messages before seq may not be whole: tern__hist_forget_before). */
int tern__hist_insert(tern__hist *h, uint64_t seq, uint64_t now_ms, tern_ws_prepared *msg,
                      const char *key, size_t klen);
/* Forgets the messages kept whose seq is below seq (those before a gap
 * that nothing fills). */
void tern__hist_forget_before(tern__hist *h, uint64_t seq);

/* The most messages it keeps (max_count). */
uint32_t tern__hist_max_count(const tern__hist *h);
/* The bytes this history counts in *total. */
size_t tern__hist_bytes(const tern__hist *h);
/* Forgets the oldest message of the ring or, the ring empty, the key
 * with the oldest latest message: for a byte budget. Returns the bytes
 * that freed from the count (0: nothing left to forget). */
size_t tern__hist_shed(tern__hist *h);

/* Forgets the messages older than the age limit at now_ms. */
void tern__hist_prune(tern__hist *h, uint64_t now_ms);

/* The seq of the oldest message kept, and of the newest; 0 when empty. */
uint64_t tern__hist_first(const tern__hist *h);
uint64_t tern__hist_last(const tern__hist *h);
bool tern__hist_empty(const tern__hist *h);

/* The messages after seq `after`, oldest first, as references: a new
 * array in *out (NULL when there are none). Returns how many, or -ENOMEM. */
long tern__hist_since(const tern__hist *h, uint64_t after, tern_ws_prepared ***out);

/* One message of a page (tern__hist_page): its seq and a reference. */
typedef struct tern__hist_item {
    uint64_t seq;
    tern_ws_prepared *msg;
} tern__hist_item;

/* A page of at most max messages, as references in out: oldest first
 * from the first whose seq is at least from, or (newest_first) newest
 * first from the last whose seq is at most from (0: the newest). Returns
 * how many. */
uint32_t tern__hist_page(const tern__hist *h, uint64_t from, bool newest_first,
                         tern__hist_item *out, uint32_t max);

/* The latest message of each key (at most TERN_CONFLATE_KEYS keys are
 * followed; later ones are not), in seq order, as references: a new array
 * in *out. Returns how many, or -ENOMEM. */
long tern__hist_latest(const tern__hist *h, tern_ws_prepared ***out);

#endif
