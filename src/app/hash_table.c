/* A chained hash table of intrusive links (hash_table.h). */
#include "app/hash_table.h"

#include <stdlib.h>

uint64_t app_hash_bytes(uint64_t h, const void *p, size_t n) {
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 0x100000001b3ULL;
    return h;
}

bool app_hash_room(app_hash_table *t) {
    if (t->n < t->cap)
        return true;
    size_t cap = t->cap ? t->cap * 2 : 64;
    app_hash_link **b = calloc(cap, sizeof(*b));
    if (b == NULL)
        return false;
    for (size_t i = 0; i < t->cap; i++) {
        for (app_hash_link *l = t->b[i], *next; l; l = next) {
            next = l->next;
            l->next = b[l->hash & (cap - 1)];
            b[l->hash & (cap - 1)] = l;
        }
    }
    free(t->b);
    t->b = b;
    t->cap = cap;
    return true;
}

void app_hash_add(app_hash_table *t, app_hash_link *l) {
    app_hash_link **head = &t->b[l->hash & (t->cap - 1)];
    l->next = *head;
    *head = l;
    t->n++;
}

void app_hash_remove(app_hash_table *t, app_hash_link *l) {
    app_hash_link **p = &t->b[l->hash & (t->cap - 1)];
    while (*p != l)
        p = &(*p)->next;
    *p = l->next;
    t->n--;
}

app_hash_link *app_hash_chain(const app_hash_table *t, uint64_t h) {
    return t->cap ? t->b[h & (t->cap - 1)] : NULL;
}

void app_hash_free(app_hash_table *t) {
    free(t->b);
    *t = (app_hash_table){0};
}
