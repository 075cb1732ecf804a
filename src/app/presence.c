/* tern serve's presence store (presence.h). */
#include "app/presence.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/hash_table.h"
#include "app/json.h"

typedef struct pres_topic pres_topic;

/* A user of a topic. Invariants: in `users` while clients > 0; name is
 * NUL-terminated; hash is of the topic and the name. */
typedef struct pres_user {
    app_hash_link link;
    pres_topic *topic;
    size_t clients;       /* entries of this user in the topic */
    char name[];
} pres_user;

/* A topic with presence. Invariants: in `topics` while clients > 0;
 * first..last are its clients in join order (clients of them); users
 * counts its pres_user entries. */
struct pres_topic {
    app_hash_link link;
    app_presence *first, *last;
    size_t clients, users;
    size_t len;
    char name[];          /* len bytes, NUL-terminated */
};

/* Invariants: in topic's list; user->topic == topic; info NULL or JSON
 * text, the caller's (borrowed until the leave); node NULL for this
 * node's entries, else the other node's (presence_nodes.c) that it came
 * from. 56 bytes on 64 bits. */
struct app_presence {
    app_presence *prev, *next;
    pres_topic *topic;
    pres_user *user;
    uint64_t client;
    const char *info;
    const void *node;
};
_Static_assert(sizeof(void *) != 8 || sizeof(app_presence) == 56, "presence entry: 56 bytes");

/* The store: its tables and what they hold, under `lock` alone. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static app_hash_table topics, users;

static uint64_t user_hash(const pres_topic *t, const char *name) {
    return app_hash_bytes(app_hash_bytes(APP_HASH_SEED, &t, sizeof(t)), name, strlen(name));
}

static pres_topic *topic_find(const char *name, size_t len, uint64_t h) {
    for (app_hash_link *l = app_hash_chain(&topics, h); l; l = l->next) {
        pres_topic *t = (pres_topic *)l;
        if (l->hash == h && t->len == len && memcmp(t->name, name, len) == 0)
            return t;
    }
    return NULL;
}

static pres_user *user_find(const pres_topic *t, const char *name, uint64_t h) {
    for (app_hash_link *l = app_hash_chain(&users, h); l; l = l->next) {
        pres_user *u = (pres_user *)l;
        if (l->hash == h && u->topic == t && strcmp(u->name, name) == 0)
            return u;
    }
    return NULL;
}

int app_presence_join(const char *topic, size_t tlen, uint64_t client, const char *user,
                      const char *info, app_presence **out) {
    return app_presence_join_node(topic, tlen, client, user, info, NULL, out);
}

int app_presence_join_node(const char *topic, size_t tlen, uint64_t client, const char *user,
                           const char *info, const void *node, app_presence **out) {
    app_presence *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return -ENOMEM;
    p->client = client;
    p->info = info;
    p->node = node;
    uint64_t th = app_hash_bytes(APP_HASH_SEED, topic, tlen);
    pthread_mutex_lock(&lock);
    /* Room in both tables first, so that nothing is half added. */
    if (!app_hash_room(&topics) || !app_hash_room(&users))
        goto fail;
    pres_topic *t = topic_find(topic, tlen, th);
    bool new_topic = t == NULL;
    if (new_topic) {
        if ((t = calloc(1, sizeof(*t) + tlen + 1)) == NULL)
            goto fail;
        t->link.hash = th;
        t->len = tlen;
        memcpy(t->name, topic, tlen);
    }
    uint64_t uh = user_hash(t, user);
    pres_user *u = new_topic ? NULL : user_find(t, user, uh);
    if (u == NULL) {
        size_t ul = strlen(user);
        if ((u = calloc(1, sizeof(*u) + ul + 1)) == NULL) {
            if (new_topic)
                free(t);
            goto fail;
        }
        u->link.hash = uh;
        u->topic = t;
        memcpy(u->name, user, ul + 1);
        app_hash_add(&users, &u->link);
        t->users++;
    }
    if (new_topic)
        app_hash_add(&topics, &t->link);
    u->clients++;
    p->topic = t;
    p->user = u;
    p->prev = t->last;
    if (t->last)
        t->last->next = p;
    else
        t->first = p;
    t->last = p;
    t->clients++;
    pthread_mutex_unlock(&lock);
    *out = p;
    return 0;
fail:
    pthread_mutex_unlock(&lock);
    free(p);
    return -ENOMEM;
}

void app_presence_leave(app_presence *p) {
    if (p == NULL)
        return;
    pthread_mutex_lock(&lock);
    pres_topic *t = p->topic;
    pres_user *u = p->user;
    if (p->prev)
        p->prev->next = p->next;
    else
        t->first = p->next;
    if (p->next)
        p->next->prev = p->prev;
    else
        t->last = p->prev;
    t->clients--;
    if (--u->clients == 0) {
        app_hash_remove(&users, &u->link);
        t->users--;
        free(u);
    }
    if (t->clients == 0) {
        app_hash_remove(&topics, &t->link);
        free(t);
    }
    pthread_mutex_unlock(&lock);
    free(p);
}

void app_presence_stats_get(const char *topic, size_t tlen, app_presence_stats *out) {
    pthread_mutex_lock(&lock);
    const pres_topic *t = topic_find(topic, tlen, app_hash_bytes(APP_HASH_SEED, topic, tlen));
    *out = t ? (app_presence_stats){t->clients, t->users} : (app_presence_stats){0, 0};
    pthread_mutex_unlock(&lock);
}

void app_presence_client_text(uint64_t client, char out[17]) {
    snprintf(out, 17, "%016" PRIx64, client);
}

/* One entry as JSON at out + o (room enough: see app_presence_list). */
static size_t put_entry(char *out, size_t o, const app_presence *p) {
    char id[17];
    app_presence_client_text(p->client, id);
    o += (size_t)sprintf(out + o, "{\"client\":\"%s\",\"user\":\"", id);
    size_t ul = strlen(p->user->name);
    o += app_json_escape(out + o, APP_JSON_ESCAPE_MAX * ul + 1, p->user->name, ul);
    out[o++] = '"';
    if (p->info) {
        size_t il = strlen(p->info);
        memcpy(out + o, ",\"info\":", 8);
        memcpy(out + o + 8, p->info, il);
        o += 8 + il;
    }
    out[o++] = '}';
    return o;
}

/* An entry's bytes at most: the fixed text, the escaped user, the info. */
static size_t entry_max(const app_presence *p) {
    return 48 + APP_JSON_ESCAPE_MAX * strlen(p->user->name) + (p->info ? 8 + strlen(p->info) : 0);
}

char *app_presence_list(const char *topic, size_t tlen, size_t limit, size_t *len,
                        app_presence_stats *stats) {
    pthread_mutex_lock(&lock);
    const pres_topic *t = topic_find(topic, tlen, app_hash_bytes(APP_HASH_SEED, topic, tlen));
    *stats = t ? (app_presence_stats){t->clients, t->users} : (app_presence_stats){0, 0};
    /* Measured first, so that the one allocation holds it all. */
    size_t cap = 1, k = 0;
    for (const app_presence *p = t ? t->first : NULL; p && k < limit; p = p->next, k++)
        cap += entry_max(p) + 1;
    char *out = malloc(cap);
    size_t o = 0;
    k = 0;
    for (const app_presence *p = t ? t->first : NULL; out && p && k < limit; p = p->next, k++) {
        if (k)
            out[o++] = ',';
        o = put_entry(out, o, p);
    }
    pthread_mutex_unlock(&lock);
    if (out) {
        out[o] = '\0';
        *len = o;
    }
    return out;
}

const char *app_presence_user(const app_presence *p) {
    return p->user->name;   /* unchanged while p is in the store: no lock */
}

void app_presence_each_local(app_presence_visit *visit, void *arg) {
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < topics.cap; i++) {
        for (const app_hash_link *l = topics.b[i]; l; l = l->next) {
            const pres_topic *t = (const pres_topic *)l;
            for (const app_presence *p = t->first; p; p = p->next) {
                if (p->node == NULL)
                    visit(arg, t->name, t->len, p->client, p->user->name, p->info);
            }
        }
    }
    pthread_mutex_unlock(&lock);
}
