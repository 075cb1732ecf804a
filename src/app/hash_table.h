/* A chained hash table of intrusive links, for tern serve's stores (the
 * presence store, the other nodes' presence): what it holds begins with
 * an app_hash_link, and the holder compares its own keys while walking a
 * chain (app_hash_chain). No allocation per entry; the bucket array
 * doubles when full, so an add is amortized O(1).
 *
 * Not thread-safe: each table is under its owner's lock. */
#ifndef TERN_APP_HASH_TABLE_H
#define TERN_APP_HASH_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A chain link: the first member of what a table holds. */
typedef struct app_hash_link {
    struct app_hash_link *next;
    uint64_t hash;
} app_hash_link;

/* Invariants: cap is 0 or a power of two; n links are chained from
 * b[hash & (cap - 1)]; n <= cap (it doubles first). Zeroed: empty. */
typedef struct app_hash_table {
    app_hash_link **b;
    size_t n, cap;
} app_hash_table;

#define APP_HASH_SEED 0xcbf29ce484222325ULL

/* FNV-1a of p[0..n), from h (APP_HASH_SEED, or another hash to combine). */
uint64_t app_hash_bytes(uint64_t h, const void *p, size_t n);
/* Room for one more link: doubles t (from 64) when full. false when out
 * of memory (then t is as it was). */
bool app_hash_room(app_hash_table *t);
/* Adds l (its hash set), after app_hash_room. */
void app_hash_add(app_hash_table *t, app_hash_link *l);
/* Removes l, which is in t. */
void app_hash_remove(app_hash_table *t, app_hash_link *l);
/* The chain where links of hash h are (NULL when t is empty). */
app_hash_link *app_hash_chain(const app_hash_table *t, uint64_t h);
/* Frees the bucket array (not what the links belong to): t is empty. */
void app_hash_free(app_hash_table *t);

#endif
