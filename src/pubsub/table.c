/* The chained hash table of pub/sub's topics, entries and connections
 * (pubsub.h's table: intrusive nodes, power-of-2 buckets). */
#include <errno.h>
#include <stdlib.h>

#include "pubsub/pubsub.h"

int tern__ps_table_grow(tern__ps_table *t) {
    if (t->count < t->nb)
        return 0;
    size_t nb = t->nb ? t->nb * 2 : 16;
    tern__ps_node **b = calloc(nb, sizeof(*b));
    if (b == NULL)
        return t->nb ? 0 : -ENOMEM;   /* a full table still works, only slower */
    for (size_t i = 0; i < t->nb; i++)
        for (tern__ps_node *n = t->b[i], *next; n; n = next) {
            next = n->next;
            n->next = b[n->hash & (nb - 1)];
            b[n->hash & (nb - 1)] = n;
        }
    free(t->b);
    t->b = b;
    t->nb = nb;
    return 0;
}

void tern__ps_table_add(tern__ps_table *t, tern__ps_node *n) {
    tern__ps_node **s = tern__ps_bucket(t, n->hash);
    n->next = *s;
    *s = n;
    t->count++;
}

void tern__ps_table_del(tern__ps_table *t, tern__ps_node *n) {
    for (tern__ps_node **p = tern__ps_bucket(t, n->hash); *p; p = &(*p)->next)
        if (*p == n) {
            *p = n->next;
            t->count--;
            return;
        }
}
