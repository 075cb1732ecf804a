/* The shared table read for operators, from any thread: the topics with
 * their subscriber counts (tern_topic_list) and a page of a topic's
 * history (tern_topic_history). Both take the group's mutex, as a
 * publish does, and copy out what they need under it: the names, or
 * references to the history's frames, read once the mutex is released. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "pubsub/history.h"
#include "pubsub/pubsub.h"

/* A name argument that may be NULL or "": its length, or -ENAMETOOLONG. */
static long optional_name(const char *s) {
    size_t n = s ? strnlen(s, TERN_TOPIC_MAX + 1) : 0;
    return n > TERN_TOPIC_MAX ? -ENAMETOOLONG : (long)n;
}

/* Byte order of two names, a prefix of a longer one before it. */
static int name_cmp(const char *a, size_t al, const char *b, size_t bl) {
    int c = memcmp(a, b, al < bl ? al : bl);
    return c ? c : (al > bl) - (al < bl);
}

static int by_name(const void *x, const void *y) {
    const tern__ps_gtopic *a = *(tern__ps_gtopic *const *)x, *b = *(tern__ps_gtopic *const *)y;
    return name_cmp(a->name, a->len, b->name, b->len);
}

long tern_topic_list(tern_server *srv, const char *prefix, const char *after,
                     tern_topic_info *out, size_t max, bool *more) {
    if (more)
        *more = false;
    if (srv == NULL || srv->loop == NULL || (out == NULL && max > 0))
        return -EINVAL;
    long pl = optional_name(prefix), al = optional_name(after);
    if (pl < 0 || al < 0)
        return -ENAMETOOLONG;
    prefix = prefix ? prefix : "";   /* memcmp is given no NULL, even for 0 bytes */
    after = after ? after : "";
    tern__ps_group *g = tern__ps_group_peek(srv->cfg);
    if (g == NULL)
        return 0;   /* pub/sub never used: no topic */
    pthread_mutex_lock(&g->mu);
    /* The matching entries after `after`, sorted, then the first max. */
    tern__ps_gtopic **v = g->topics.count ? malloc(sizeof(*v) * g->topics.count) : NULL;
    if (g->topics.count && v == NULL) {
        pthread_mutex_unlock(&g->mu);
        return -ENOMEM;
    }
    size_t n = 0;
    for (size_t i = 0; i < g->topics.nb; i++)
        for (tern__ps_node *node = g->topics.b[i]; node; node = node->next) {
            tern__ps_gtopic *t = (tern__ps_gtopic *)node;
            if (t->len >= (size_t)pl && memcmp(t->name, prefix, (size_t)pl) == 0 &&
                name_cmp(t->name, t->len, after, (size_t)al) > 0)
                v[n++] = t;
        }
    if (n > 1)
        qsort(v, n, sizeof(*v), by_name);
    size_t k = n < max ? n : max;
    for (size_t i = 0; i < k; i++) {
        const tern__ps_gtopic *t = v[i];
        out[i] = (tern_topic_info){.len = t->len, .subscribers = t->subs, .epoch = t->epoch,
                                   .seq = t->seq, .history = t->hist != NULL};
        memcpy(out[i].name, t->name, t->len);
        out[i].name[t->len] = '\0';
    }
    pthread_mutex_unlock(&g->mu);
    free(v);
    if (more)
        *more = n > k;
    return (long)k;
}

/* Where the payload of a plain server frame starts (no mask, one frame):
 * after the 2 bytes of its head and its extended length, if any. */
static size_t payload_at(const uint8_t *frame) {
    uint8_t len7 = frame[1] & 0x7f;
    return len7 < 126 ? 2 : len7 == 126 ? 4 : 10;
}

long tern_topic_history(tern_server *srv, const char *topic, uint64_t from, size_t limit,
                        bool newest_first, tern_history_fn fn, void *user,
                        tern_history_info *info) {
    size_t len;
    int err;
    if (info)
        *info = (tern_history_info){0};
    if (srv == NULL || srv->loop == NULL || fn == NULL)
        return -EINVAL;
    if ((err = tern__ps_check_topic(topic, &len)) < 0)
        return err;
    if (limit > TERN_HISTORY_MAX)
        limit = TERN_HISTORY_MAX;
    tern__ps_group *g = tern__ps_group_peek(srv->cfg);
    if (g == NULL)
        return -ENOENT;
    tern__hist_item *items = limit ? malloc(sizeof(*items) * limit) : NULL;
    if (limit && items == NULL)
        return -ENOMEM;
    pthread_mutex_lock(&g->mu);
    tern__ps_gtopic *t = tern__ps_gfind(g, topic, len, tern__ps_hash_name(topic, len));
    if (t == NULL) {
        pthread_mutex_unlock(&g->mu);
        free(items);
        return -ENOENT;
    }
    uint32_t n = 0;
    tern_history_info at = {.epoch = t->epoch, .last = t->seq};
    if (t->hist) {
        tern__hist_prune(t->hist, tern__ps_mono_ms());
        at.first = tern__hist_first(t->hist);
        n = tern__hist_page(t->hist, from, newest_first, items, (uint32_t)limit);
    }
    pthread_mutex_unlock(&g->mu);
    if (info)
        *info = at;
    /* The frames are the references taken under the mutex: read and
     * released outside it, so that a slow callback holds up no publish. */
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *frame = tern__ws_prepared_bytes(items[i].msg);
        size_t at_payload = payload_at(frame);
        tern_history_msg m = {.seq = items[i].seq, .opcode = frame[0] & 0x0f,
                              .data = frame + at_payload,
                              .len = tern__ws_prepared_len(items[i].msg) - at_payload};
        fn(&m, user);
        tern_ws_prepared_free(items[i].msg);
    }
    free(items);
    return (long)n;
}
