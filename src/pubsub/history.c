/* A topic's history: a ring of the last messages and a table of the
 * latest message per key (history.h says what for). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "pubsub/history.h"
#include "tern/pubsub.h"
#include "ws/ws.h"

typedef struct entry {
    uint64_t seq, ms;
    tern_ws_prepared *msg;
} entry;

/* A key's latest message; key == NULL marks a free slot. */
typedef struct latest {
    uint64_t hash, seq;
    tern_ws_prepared *msg;
    size_t klen;
    char *key;
} latest;

/* Invariants: ring[start .. start+count) (mod cap) holds the kept
 * messages, oldest first, seqs rising; count <= max_count, cap grows by
 * doubling up to max_count (so a quiet topic costs little). keys is an
 * open-addressing table of kcap slots (a power of 2, or 0) holding kcount
 * keys, at most TERN_CONFLATE_KEYS, never more than half full. bytes is
 * the frame bytes of the ring's messages plus the keys' (a message in
 * both counted twice), and is included in *total. */
struct tern__hist {
    entry *ring;
    uint32_t cap, start, count, max_count;
    uint64_t max_ms;
    latest *keys;
    uint32_t kcap, kcount;
    size_t bytes, *total;
};

tern__hist *tern__hist_new(uint32_t max_count, uint64_t max_ms, size_t *total) {
    if (max_count == 0)
        return NULL;
    tern__hist *h = calloc(1, sizeof(*h));
    if (h) {
        h->max_count = max_count;
        h->max_ms = max_ms;
        h->total = total;
    }
    return h;
}

static void count(tern__hist *h, const tern_ws_prepared *m) {
    size_t n = tern__ws_prepared_len(m);
    h->bytes += n;
    *h->total += n;
}

static void uncount(tern__hist *h, const tern_ws_prepared *m) {
    size_t n = tern__ws_prepared_len(m);
    h->bytes -= n;
    *h->total -= n;
}

size_t tern__hist_bytes(const tern__hist *h) { return h->bytes; }

uint32_t tern__hist_max_count(const tern__hist *h) { return h->max_count; }

static void release(tern__hist *h) {
    *h->total -= h->bytes;
    for (uint32_t i = 0; i < h->count; i++)
        tern_ws_prepared_free(h->ring[(h->start + i) % h->cap].msg);
    for (uint32_t i = 0; i < h->kcap; i++)
        if (h->keys[i].key) {
            tern_ws_prepared_free(h->keys[i].msg);
            free(h->keys[i].key);
        }
    free(h->ring);
    free(h->keys);
}

void tern__hist_free(tern__hist *h) {
    if (h == NULL)
        return;
    release(h);
    free(h);
}

void tern__hist_clear(tern__hist *h) {
    release(h);
    *h = (tern__hist){.max_count = h->max_count, .max_ms = h->max_ms, .total = h->total};
}

static void drop_oldest(tern__hist *h) {
    uncount(h, h->ring[h->start].msg);
    tern_ws_prepared_free(h->ring[h->start].msg);
    h->start = (h->start + 1) % h->cap;
    h->count--;
}

/* Room for one more in the ring: grows it, or drops the oldest at the
 * count limit (or when it cannot grow). */
static void ring_room(tern__hist *h) {
    if (h->count < h->cap)
        return;
    if (h->cap < h->max_count) {
        uint32_t cap = h->cap ? h->cap * 2 : 16;
        if (cap > h->max_count)
            cap = h->max_count;
        entry *r = malloc(sizeof(*r) * cap);
        if (r) {
            for (uint32_t i = 0; i < h->count; i++)
                r[i] = h->ring[(h->start + i) % h->cap];
            free(h->ring);
            h->ring = r;
            h->cap = cap;
            h->start = 0;
            return;
        }
    }
    if (h->count > 0)
        drop_oldest(h);
}

static uint64_t hash_key(const char *s, size_t n) {
    uint64_t x = 0xcbf29ce484222325ull;   /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        x = (x ^ (uint8_t)s[i]) * 0x100000001b3ull;
    return x;
}

static latest *key_slot(latest *keys, uint32_t kcap, uint64_t hash, const char *key,
                        size_t klen) {
    for (uint32_t i = (uint32_t)hash & (kcap - 1);; i = (i + 1) & (kcap - 1)) {
        latest *l = &keys[i];
        if (l->key == NULL || (l->hash == hash && l->klen == klen && memcmp(l->key, key, klen) == 0))
            return l;
    }
}

/* Keeps msg as key's latest, unless the key's latest is newer (a message
 * read back, tern__hist_insert). A key past TERN_CONFLATE_KEYS is not
 * followed, nor one that memory does not allow. */
static void key_set(tern__hist *h, uint64_t seq, tern_ws_prepared *msg, const char *key,
                    size_t klen) {
    uint64_t hash = hash_key(key, klen);
    if (h->kcap) {
        latest *l = key_slot(h->keys, h->kcap, hash, key, klen);
        if (l->key && l->seq > seq)
            return;
        if (l->key) {
            uncount(h, l->msg);
            tern_ws_prepared_free(l->msg);
            count(h, msg);
            l->msg = tern__ws_prepared_ref(msg);
            l->seq = seq;
            return;
        }
    }
    if (h->kcount >= TERN_CONFLATE_KEYS)
        return;
    if ((h->kcount + 1) * 2 > h->kcap) {
        uint32_t kcap = h->kcap ? h->kcap * 2 : 16;
        latest *k = calloc(kcap, sizeof(*k));
        if (k == NULL)
            return;
        for (uint32_t i = 0; i < h->kcap; i++)
            if (h->keys[i].key)
                *key_slot(k, kcap, h->keys[i].hash, h->keys[i].key, h->keys[i].klen) = h->keys[i];
        free(h->keys);
        h->keys = k;
        h->kcap = kcap;
    }
    char *copy = malloc(klen + 1);
    if (copy == NULL)
        return;
    memcpy(copy, key, klen);
    latest *l = key_slot(h->keys, h->kcap, hash, key, klen);
    *l = (latest){.hash = hash, .seq = seq, .msg = tern__ws_prepared_ref(msg), .klen = klen,
                  .key = copy};
    h->kcount++;
    count(h, msg);
}

/* Removes keys[i] from the open-addressing table: the entries after it
 * in its run are put back where a lookup will find them. */
static void key_remove(tern__hist *h, uint32_t i) {
    uint32_t mask = h->kcap - 1;
    uncount(h, h->keys[i].msg);
    tern_ws_prepared_free(h->keys[i].msg);
    free(h->keys[i].key);
    h->keys[i] = (latest){0};
    h->kcount--;
    for (uint32_t j = (i + 1) & mask; h->keys[j].key; j = (j + 1) & mask) {
        latest l = h->keys[j];
        h->keys[j] = (latest){0};
        *key_slot(h->keys, h->kcap, l.hash, l.key, l.klen) = l;
    }
}

size_t tern__hist_shed(tern__hist *h) {
    size_t before = h->bytes;
    if (h->count > 0) {
        drop_oldest(h);
    } else if (h->kcount > 0) {
        uint32_t oldest = UINT32_MAX;
        for (uint32_t i = 0; i < h->kcap; i++)
            if (h->keys[i].key && (oldest == UINT32_MAX || h->keys[i].seq < h->keys[oldest].seq))
                oldest = i;
        key_remove(h, oldest);
    }
    return before - h->bytes;
}

int tern__hist_add(tern__hist *h, uint64_t seq, uint64_t now_ms, tern_ws_prepared *msg,
                   const char *key, size_t klen) {
    key_set(h, seq, msg, key ? key : "", key ? klen : 0);
    ring_room(h);
    if (h->count == h->cap)
        return -ENOMEM;   /* no ring at all: nothing kept */
    h->ring[(h->start + h->count) % h->cap] =
        (entry){.seq = seq, .ms = now_ms, .msg = tern__ws_prepared_ref(msg)};
    h->count++;
    count(h, msg);
    return 0;
}

int tern__hist_insert(tern__hist *h, uint64_t seq, uint64_t now_ms, tern_ws_prepared *msg,
                      const char *key, size_t klen) {
    uint32_t k = 0;   /* where it goes: after the k messages older than it */
    while (k < h->count && h->ring[(h->start + k) % h->cap].seq < seq)
        k++;
    if (k == h->count)
        return tern__hist_add(h, seq, now_ms, msg, key, klen);
    if (h->ring[(h->start + k) % h->cap].seq == seq)
        return 0;   /* kept already */
    key_set(h, seq, msg, key ? key : "", key ? klen : 0);
    if (k == 0 && h->count == h->max_count)
        return 0;   /* it would be the oldest of a full ring: the first to go */
    uint32_t before = h->count;
    ring_room(h);
    if (h->count == h->cap)
        return -ENOMEM;   /* no room made */
    if (h->count < before && k == 0)
        return -ENOMEM;   /* the ring could not grow, and all it kept is newer */
    if (h->count < before)
        k--;   /* the oldest went to make room (older than seq) */
    uint64_t ms = h->ring[(h->start + k) % h->cap].ms;
    for (uint32_t i = h->count; i > k; i--)   /* the newer ones move up one */
        h->ring[(h->start + i) % h->cap] = h->ring[(h->start + i - 1) % h->cap];
    h->ring[(h->start + k) % h->cap] =
        (entry){.seq = seq, .ms = ms < now_ms ? ms : now_ms, .msg = tern__ws_prepared_ref(msg)};
    h->count++;
    count(h, msg);
    return 0;
}

void tern__hist_forget_before(tern__hist *h, uint64_t seq) {
    while (h->count > 0 && h->ring[h->start].seq < seq)
        drop_oldest(h);
}

void tern__hist_prune(tern__hist *h, uint64_t now_ms) {
    if (h->max_ms == 0)
        return;
    while (h->count > 0 && now_ms - h->ring[h->start].ms > h->max_ms)
        drop_oldest(h);
}

uint64_t tern__hist_first(const tern__hist *h) {
    return h->count ? h->ring[h->start].seq : 0;
}

uint64_t tern__hist_last(const tern__hist *h) {
    return h->count ? h->ring[(h->start + h->count - 1) % h->cap].seq : 0;
}

bool tern__hist_empty(const tern__hist *h) { return h->count == 0; }

long tern__hist_since(const tern__hist *h, uint64_t after, tern_ws_prepared ***out) {
    *out = NULL;
    uint32_t i = 0;
    while (i < h->count && h->ring[(h->start + i) % h->cap].seq <= after)
        i++;
    uint32_t n = h->count - i;
    if (n == 0)
        return 0;
    tern_ws_prepared **v = malloc(sizeof(*v) * n);
    if (v == NULL)
        return -ENOMEM;
    for (uint32_t k = 0; k < n; k++)
        v[k] = tern__ws_prepared_ref(h->ring[(h->start + i + k) % h->cap].msg);
    *out = v;
    return n;
}

uint32_t tern__hist_page(const tern__hist *h, uint64_t from, bool newest_first,
                         tern__hist_item *out, uint32_t max) {
    uint32_t n = 0;
    if (newest_first) {
        uint32_t i = h->count;   /* one past the next message to give */
        while (i > 0 && from != 0 && h->ring[(h->start + i - 1) % h->cap].seq > from)
            i--;
        for (; i > 0 && n < max; i--, n++) {
            const entry *e = &h->ring[(h->start + i - 1) % h->cap];
            out[n] = (tern__hist_item){.seq = e->seq, .msg = tern__ws_prepared_ref(e->msg)};
        }
        return n;
    }
    uint32_t i = 0;
    while (i < h->count && h->ring[(h->start + i) % h->cap].seq < from)
        i++;
    for (; i < h->count && n < max; i++, n++) {
        const entry *e = &h->ring[(h->start + i) % h->cap];
        out[n] = (tern__hist_item){.seq = e->seq, .msg = tern__ws_prepared_ref(e->msg)};
    }
    return n;
}

static int by_seq(const void *a, const void *b) {
    uint64_t x = ((const latest *)a)->seq, y = ((const latest *)b)->seq;
    return x < y ? -1 : x > y;
}

long tern__hist_latest(const tern__hist *h, tern_ws_prepared ***out) {
    *out = NULL;
    if (h->kcount == 0)
        return 0;
    latest *all = malloc(sizeof(*all) * h->kcount);
    tern_ws_prepared **v = malloc(sizeof(*v) * h->kcount);
    if (all == NULL || v == NULL) {
        free(all);
        free(v);
        return -ENOMEM;
    }
    uint32_t n = 0;
    for (uint32_t i = 0; i < h->kcap; i++)
        if (h->keys[i].key)
            all[n++] = h->keys[i];
    qsort(all, n, sizeof(*all), by_seq);
    for (uint32_t i = 0; i < n; i++)
        v[i] = tern__ws_prepared_ref(all[i].msg);
    free(all);
    *out = v;
    return n;
}
