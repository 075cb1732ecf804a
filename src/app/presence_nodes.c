/* tern serve's presence across nodes (presence_nodes.h).
 *
 * A message on APP_PRNODES_TOPIC (binary, little-endian):
 *   "TPN1"  instance (8)  name length (1)  name
 *   kind (1): 'D' changes, or 'S' a snapshot's part, then its number (4)
 *             and whether it is the last part (1)
 *   records, to the end: 'J' or 'L' (1), client (8), topic length (2),
 *             topic; a 'J' then: user length (2), user, info length (4;
 *             0: none), info.
 * A snapshot has only joins; its last part removes what the node's
 * earlier entries the snapshot did not name (marked with an older
 * number). A join of a client already there and a leave of one that is
 * not are nothing, so that a change that crosses a snapshot does no harm. */
#include "app/presence_nodes.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/app.h"
#include "app/hash_table.h"
#include "app/presence.h"
#include "app/serve_options.h"
#include "app/serve_presence.h"
#include "app/topic_rules.h"
#include "net/crypto.h"

#define MAGIC "TPN1"
#define CHUNK_MAX (64 * 1024)   /* a message's bytes at most, but one record larger */

/* A message being written. Invariants: b[0..n) is a whole header and
 * whole records; n <= cap. */
typedef struct msgbuf {
    char *b;
    size_t n, cap;
} msgbuf;

/* Messages to publish, in order. Invariants: bytes counts what they hold. */
typedef struct msglist {
    msgbuf *m;
    size_t n, cap, bytes;
} msglist;

typedef struct pn_node pn_node;

/* Another node's entry. Invariants: in its node's table under the hash
 * of (topic, client); entry is its presence store entry (node == its
 * pn_node), whose info is ours (info, freed after the entry leaves). */
typedef struct pn_entry {
    app_hash_link link;
    app_presence *entry;
    uint64_t client;
    uint32_t mark;         /* the snapshot that last named it */
    char *info;            /* NULL: none */
    uint16_t tlen;
    char topic[];
} pn_entry;

/* Another node. Invariants: in `nodes` while alive (deadline not passed,
 * its instance the latest heard), else on `dead` until the next tick
 * takes its entries out; entries holds every pn_entry of it (at most
 * APP_PRNODES_ENTRIES). */
struct pn_node {
    pn_node *next_dead;
    char name[APP_NODE_NAME_MAX + 1];
    uint64_t instance;
    uint64_t deadline;     /* loop 0's clock, ms */
    uint32_t gen;          /* the snapshot being received or last received */
    bool full_logged;      /* "too many entries" said once */
    bool say_leaves;       /* once dropped: whether this node says its leaves */
    app_hash_table entries;
};

/* Everything under `lock`, but srv, loop, self, instance and the sink,
 * set before the sink subscribes and cleared after it ends (loop 0's). */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static bool started;
static tern_server *srv;
static tern_loop *loop;
static tern_timer *timer;
static tern_sink *sink;
static char self[APP_NODE_NAME_MAX + 1];
static uint64_t instance;
static msglist pending;        /* this node's changes since the last tick */
static bool pending_lost;      /* some were dropped: announce at the next tick */
static bool draining;          /* each change published at once */
static uint64_t next_announce; /* loop 0's clock */
static uint32_t gen;           /* this node's snapshots, numbered from 1 */
static bool quiet = true;      /* its last snapshot was empty (or none yet) */
static pn_node *nodes[APP_PRNODES_NODES];
static size_t n_nodes;
static pn_node *dead;

/* ---- writing ---------------------------------------------------------- */

static void put_u16(char *p, uint16_t v) {
    p[0] = (char)(v & 0xff);
    p[1] = (char)(v >> 8);
}

static void put_u32(char *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (char)((v >> (8 * i)) & 0xff);
}

static void put_u64(char *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (char)((v >> (8 * i)) & 0xff);
}

static bool msg_room(msgbuf *m, size_t more) {
    if (m->n + more <= m->cap)
        return true;
    size_t cap = m->cap ? m->cap : 1024;
    while (cap < m->n + more)
        cap *= 2;
    char *b = realloc(m->b, cap);
    if (b == NULL)
        return false;
    m->b = b;
    m->cap = cap;
    return true;
}

/* The header of a new message: kind 'D', or 'S' with its number (the
 * last-part flag is set once it is known, at byte n - 1). */
static size_t header(char *out, char kind, uint32_t snap) {
    size_t nl = strlen(self), o = 0;
    memcpy(out, MAGIC, 4);
    put_u64(out + 4, instance);
    out[12] = (char)nl;
    memcpy(out + 13, self, nl);
    o = 13 + nl;
    out[o++] = kind;
    if (kind == 'S') {
        put_u32(out + o, snap);
        out[o + 4] = 0;
        o += 5;
    }
    return o;
}

static size_t record_size(bool join, size_t tlen, const char *user, const char *info) {
    return 11 + tlen + (join ? 6 + strlen(user) + (info ? strlen(info) : 0) : 0);
}

/* A new message at the list's end, its header of kind/snap written.
 * NULL: out of memory. */
static msgbuf *list_start(msglist *l, char kind, uint32_t snap) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        msgbuf *a = realloc(l->m, cap * sizeof(*a));
        if (a == NULL)
            return NULL;
        l->m = a;
        l->cap = cap;
    }
    msgbuf *m = &l->m[l->n];
    *m = (msgbuf){0};
    if (!msg_room(m, 32 + APP_NODE_NAME_MAX))
        return NULL;
    m->n = header(m->b, kind, snap);
    l->n++;
    l->bytes += m->n;
    return m;
}

/* Appends a record to the list's last message, or to a new one (of
 * kind/snap) when it would pass CHUNK_MAX. false: out of memory. */
static bool list_add(msglist *l, char kind, uint32_t snap, bool join, const char *topic,
                     size_t tlen, uint64_t client, const char *user, const char *info) {
    size_t rs = record_size(join, tlen, user, info);
    msgbuf *m = l->n ? &l->m[l->n - 1] : NULL;
    if ((m == NULL || m->n + rs > CHUNK_MAX) && (m = list_start(l, kind, snap)) == NULL)
        return false;
    if (!msg_room(m, rs))
        return false;
    char *o = m->b + m->n;
    *o++ = join ? 'J' : 'L';
    put_u64(o, client);
    put_u16(o + 8, (uint16_t)tlen);
    memcpy(o + 10, topic, tlen);
    o += 10 + tlen;
    if (join) {
        size_t ul = strlen(user), il = info ? strlen(info) : 0;
        put_u16(o, (uint16_t)ul);
        memcpy(o + 2, user, ul);
        put_u32(o + 2 + ul, (uint32_t)il);
        memcpy(o + 6 + ul, info ? info : "", il);
    }
    m->n += rs;
    l->bytes += rs;
    return true;
}

static void list_free(msglist *l) {
    for (size_t i = 0; i < l->n; i++)
        free(l->m[i].b);
    free(l->m);
    *l = (msglist){0};
}

void app_prnodes_changed(bool join, const char *topic, size_t tlen, uint64_t client,
                         const char *user, const char *info) {
    /* Past what a record can say (a user of 64 KiB): the next snapshot
     * leaves it out too, so the others never list it. */
    if (strlen(user) > UINT16_MAX)
        return;
    msglist now = {0};
    pthread_mutex_lock(&lock);
    if (started && draining) {
        /* Published below, outside the lock (our own sink hears it). */
        (void)list_add(&now, 'D', 0, join, topic, tlen, client, user, info);
    } else if (started && !pending_lost) {
        if (pending.bytes + record_size(join, tlen, user, info) > APP_PRNODES_PENDING ||
            !list_add(&pending, 'D', 0, join, topic, tlen, client, user, info)) {
            /* The snapshot at the next tick says it all instead. */
            list_free(&pending);
            pending_lost = true;
        }
    }
    tern_server *s = srv;
    pthread_mutex_unlock(&lock);
    for (size_t i = 0; i < now.n; i++)
        (void)tern_publish(s, APP_PRNODES_TOPIC, now.m[i].b, now.m[i].n, TERN_WS_BINARY);
    list_free(&now);
}

void app_prnodes_draining(void) {
    msglist out;
    pthread_mutex_lock(&lock);
    draining = true;
    out = pending;   /* what waited for the tick goes first */
    pending = (msglist){0};
    tern_server *s = started ? srv : NULL;
    pthread_mutex_unlock(&lock);
    for (size_t i = 0; s && i < out.n; i++)
        (void)tern_publish(s, APP_PRNODES_TOPIC, out.m[i].b, out.m[i].n, TERN_WS_BINARY);
    list_free(&out);
}

/* A snapshot's record, from the store's walk (under both locks). */
static void snapshot_entry(void *arg, const char *topic, size_t tlen, uint64_t client,
                           const char *user, const char *info) {
    msglist *l = arg;
    if (strlen(user) <= UINT16_MAX)
        (void)list_add(l, 'S', gen, true, topic, tlen, client, user, info);
}

/* ---- reading ---------------------------------------------------------- */

/* A cursor over a received message. Invariants: p <= end. */
typedef struct reader {
    const unsigned char *p, *end;
} reader;

static bool get(reader *r, void *out, size_t n) {
    if ((size_t)(r->end - r->p) < n)
        return false;
    memcpy(out, r->p, n);
    r->p += n;
    return true;
}

static bool get_uint(reader *r, size_t n, uint64_t *out) {
    unsigned char b[8];
    if (!get(r, b, n))
        return false;
    *out = 0;
    for (size_t i = 0; i < n; i++)
        *out |= (uint64_t)b[i] << (8 * i);
    return true;
}

/* n bytes in place (not copied). */
static bool get_view(reader *r, size_t n, const char **out) {
    if ((size_t)(r->end - r->p) < n)
        return false;
    *out = (const char *)r->p;
    r->p += n;
    return true;
}

static uint64_t entry_hash(const char *topic, size_t tlen, uint64_t client) {
    return app_hash_bytes(app_hash_bytes(APP_HASH_SEED, &client, sizeof(client)), topic, tlen);
}

static pn_entry *entry_find(const pn_node *n, const char *topic, size_t tlen, uint64_t client,
                            uint64_t h) {
    for (app_hash_link *l = app_hash_chain(&n->entries, h); l; l = l->next) {
        pn_entry *e = (pn_entry *)l;
        if (l->hash == h && e->client == client && e->tlen == tlen &&
            memcmp(e->topic, topic, tlen) == 0)
            return e;
    }
    return NULL;
}

/* Out of the store and freed (the caller unlinks it first). */
static void entry_free(pn_entry *e) {
    app_presence_leave(e->entry);
    free(e->info);
    free(e);
}

/* A join: added unless there (then marked as named by snapshot mark). */
static void node_join(pn_node *n, uint32_t mark, const char *topic, size_t tlen,
                      uint64_t client, const char *user, const char *info) {
    uint64_t h = entry_hash(topic, tlen, client);
    pn_entry *e = entry_find(n, topic, tlen, client, h);
    if (e) {
        e->mark = mark;
        return;
    }
    if (n->entries.n >= APP_PRNODES_ENTRIES) {
        if (!n->full_logged)
            app_serve_log(stderr, TERN_LOG_WARN,
                          "presence: node %s has more than %d entries: the rest are left out",
                          n->name, APP_PRNODES_ENTRIES);
        n->full_logged = true;
        return;
    }
    if (!app_hash_room(&n->entries) || (e = calloc(1, sizeof(*e) + tlen + 1)) == NULL)
        return;   /* out of memory: the next snapshot tries again */
    e->link.hash = h;
    e->client = client;
    e->mark = mark;
    e->tlen = (uint16_t)tlen;
    memcpy(e->topic, topic, tlen);
    if ((info && (e->info = strdup(info)) == NULL) ||
        app_presence_join_node(topic, tlen, client, user, e->info, n, &e->entry) < 0) {
        free(e->info);
        free(e);
        return;
    }
    app_hash_add(&n->entries, &e->link);
}

static void node_leave(pn_node *n, const char *topic, size_t tlen, uint64_t client) {
    pn_entry *e = entry_find(n, topic, tlen, client, entry_hash(topic, tlen, client));
    if (e) {
        app_hash_remove(&n->entries, &e->link);
        entry_free(e);
    }
}

/* A snapshot's last part: what it did not name goes. */
static void node_sweep(pn_node *n) {
    for (size_t i = 0; i < n->entries.cap; i++) {
        for (app_hash_link **p = &n->entries.b[i]; *p;) {
            pn_entry *e = (pn_entry *)*p;
            if (e->mark == n->gen) {
                p = &(*p)->next;
                continue;
            }
            *p = e->link.next;
            n->entries.n--;
            entry_free(e);
        }
    }
}

/* Moves nodes[i] to `dead` (its entries leave at the next tick). */
static void node_drop(size_t i) {
    pn_node *n = nodes[i];
    nodes[i] = nodes[--n_nodes];
    n->next_dead = dead;
    dead = n;
}

/* The node a message names, made when new (NULL: no room, or memory). */
static pn_node *node_get(const char *name, size_t nl, uint64_t inst) {
    for (size_t i = 0; i < n_nodes; i++) {
        pn_node *n = nodes[i];
        if (strlen(n->name) != nl || memcmp(n->name, name, nl) != 0)
            continue;
        if (n->instance == inst)
            return n;
        node_drop(i);   /* it restarted: what it had is gone */
        break;
    }
    if (n_nodes == APP_PRNODES_NODES)
        return NULL;
    pn_node *n = calloc(1, sizeof(*n));
    if (n == NULL)
        return NULL;
    memcpy(n->name, name, nl);
    n->instance = inst;
    nodes[n_nodes++] = n;
    return n;
}

/* n bytes of a message as a C string. Not strndup, which may look for a
 * NUL past the n bytes (the message's payload is not NUL-terminated, and
 * ASan's strict string checks report the read beyond it). */
static char *bytes_dup(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

/* The records of a message from node n (under the lock). A record that
 * does not parse ends the message (the rest is not trusted). */
static void apply(pn_node *n, reader *r, uint32_t mark) {
    while (r->p < r->end) {
        char op;
        uint64_t client, tl, ul, il;
        const char *topic, *user, *info;
        if (!get(r, &op, 1) || (op != 'J' && op != 'L') || !get_uint(r, 8, &client) ||
            !get_uint(r, 2, &tl) || tl == 0 || tl > TERN_TOPIC_MAX || !get_view(r, tl, &topic))
            return;
        if (op == 'L') {
            node_leave(n, topic, tl, client);
            continue;
        }
        if (!get_uint(r, 2, &ul) || !get_view(r, ul, &user) || !get_uint(r, 4, &il) ||
            !get_view(r, il, &info))
            return;
        /* The store takes NUL-terminated strings. */
        char *u = bytes_dup(user, ul), *in = il ? bytes_dup(info, il) : NULL;
        if (u && (il == 0 || in))
            node_join(n, mark, topic, tl, client, u, in);
        free(u);
        free(in);
    }
}

/* The sink's delivery of a message on the hidden topic, on loop 0. */
static int on_message(void *user, const char *topic, size_t tlen, int opcode, const void *data,
                      size_t len) {
    (void)user, (void)topic, (void)tlen, (void)opcode;
    reader r = {data, (const unsigned char *)data + len};
    char magic[4], kind, name[APP_NODE_NAME_MAX + 1];
    uint64_t inst, nl, snap = 0, last = 0;
    if (!get(&r, magic, 4) || memcmp(magic, MAGIC, 4) != 0 || !get_uint(&r, 8, &inst) ||
        inst == instance || !get_uint(&r, 1, &nl) || nl == 0 || nl > APP_NODE_NAME_MAX ||
        !get(&r, name, nl) || !get(&r, &kind, 1) || (kind != 'D' && kind != 'S') ||
        (kind == 'S' && (!get_uint(&r, 4, &snap) || !get_uint(&r, 1, &last))))
        return TERN_SEND_OK;   /* ours, or not one of ours: nothing to do */
    pthread_mutex_lock(&lock);
    pn_node *n = node_get(name, nl, inst);
    if (n) {
        n->deadline = tern_loop_now(loop) + APP_PRNODES_EXPIRY_MS;
        if (kind == 'S')
            n->gen = (uint32_t)snap;
        apply(n, &r, n->gen);
        if (kind == 'S' && last)
            node_sweep(n);
    }
    pthread_mutex_unlock(&lock);
    return TERN_SEND_OK;
}

static size_t sink_buffered(void *user) {
    (void)user;
    return 0;   /* taken at once: never behind, never dropped */
}

static void sink_close(void *user, int code) {
    (void)user, (void)code;   /* never behind: the close policy never acts */
}

/* ---- the tick ----------------------------------------------------------- */

/* Whether this node says the leaves of the dropped node d: the lowest
 * instance among the live ones that may hold its entries, so not d's
 * next instance (a restart), which never heard of them (under the lock). */
static bool says_leaves(const pn_node *d) {
    for (size_t i = 0; i < n_nodes; i++) {
        if (nodes[i]->instance < instance && strcmp(nodes[i]->name, d->name) != 0)
            return false;
    }
    return true;
}

/* A dropped node's entries out of the store, each one's leave said first
 * on its topic's events topic when asked and the rule says join-leave=on. */
static void node_end(pn_node *n, bool leaves) {
    const app_topic_rules *rules = leaves ? app_serve_pubsub_rules() : NULL;
    for (size_t i = 0; i < n->entries.cap; i++) {
        for (app_hash_link *l = n->entries.b[i], *next; l; l = next) {
            next = l->next;
            pn_entry *e = (pn_entry *)l;
            const app_topic_rule *r = rules ? app_rules_match(rules, e->topic, e->tlen) : NULL;
            if (r && r->join_leave)
                app_presence_push(srv, "leave", e->client, e->topic, e->tlen,
                                  app_presence_user(e->entry), e->info);
            entry_free(e);
        }
    }
    app_hash_free(&n->entries);
    free(n);
}

static void on_tick(tern_timer *t, void *user) {
    (void)t, (void)user;
    uint64_t now = tern_loop_now(loop);
    msglist out = {0};
    pthread_mutex_lock(&lock);
    if (now >= next_announce || pending_lost) {
        /* The snapshot says everything the changes would have. */
        list_free(&pending);
        pending_lost = false;
        next_announce = now + APP_PRNODES_ANNOUNCE_MS;
        gen++;
        app_presence_each_local(snapshot_entry, &out);
        /* With no entry, one empty snapshot empties what the others keep
         * of this node; then it says nothing (no traffic from a node
         * without presence: the others hold nothing of it to expire). */
        bool empty = out.n == 0;
        if ((!empty || !quiet) && (out.n || list_start(&out, 'S', gen))) {
            /* The last part says so: its header's last byte. */
            out.m[out.n - 1].b[13 + strlen(self) + 5] = 1;
        }
        quiet = empty;
    } else {
        out = pending;
        pending = (msglist){0};
    }
    for (size_t i = 0; i < n_nodes;) {
        if (nodes[i]->deadline <= now)
            node_drop(i);
        else
            i++;
    }
    pn_node *ended = dead;
    dead = NULL;
    for (pn_node *n = ended; n; n = n->next_dead)
        n->say_leaves = says_leaves(n);
    pthread_mutex_unlock(&lock);
    /* Published outside the lock: our own sink hears it inside the call. */
    for (size_t i = 0; i < out.n; i++)
        (void)tern_publish(srv, APP_PRNODES_TOPIC, out.m[i].b, out.m[i].n, TERN_WS_BINARY);
    list_free(&out);
    while (ended) {
        pn_node *n = ended;
        ended = n->next_dead;
        node_end(n, n->say_leaves);
    }
}

/* Loop 0's first post, once tern_run has made every loop: a topic first
 * subscribed before then (in setup) would be sized for one loop. */
static void begin(tern_loop *l, void *user) {
    (void)user;
    static const tern_sink_ops ops = {
        .send = on_message, .buffered = sink_buffered, .close = sink_close};
    tern_resume res;
    int err = tern_sink_new(srv, &ops, NULL, &sink);
    if (err == 0 && (err = tern_sink_subscribe_latest(sink, APP_PRNODES_TOPIC, &res)) >= 0)
        err = tern_timer_start(l, &timer, APP_PRNODES_FLUSH_MS, APP_PRNODES_FLUSH_MS, on_tick,
                               NULL);
    if (err < 0) {
        app_serve_log(stderr, TERN_LOG_ERROR, "presence across nodes: %s: this node's "
                      "presence stays its own", tern_strerror(err));
        app_prnodes_stop();
    }
}

int app_prnodes_start(tern_server *s, const char *node) {
    uint64_t inst = 0;
    if (tern__crypto_random(&inst, sizeof(inst)) < 0)
        return -EIO;
    pthread_mutex_lock(&lock);
    srv = s;
    loop = tern_server_loop(s);
    snprintf(self, sizeof(self), "%s", node);
    instance = inst;
    next_announce = 0;   /* at the first tick */
    started = true;
    pthread_mutex_unlock(&lock);
    int err = tern_loop_post(loop, begin, NULL);
    if (err < 0)
        app_prnodes_stop();
    return err;
}

void app_prnodes_stop(void) {
    if (timer)
        tern_timer_stop(timer);
    timer = NULL;
    tern_sink_free(sink);
    sink = NULL;
    pthread_mutex_lock(&lock);
    started = false;
    draining = false;
    quiet = true;
    list_free(&pending);
    while (n_nodes)
        node_drop(n_nodes - 1);
    pn_node *ended = dead;
    dead = NULL;
    pthread_mutex_unlock(&lock);
    while (ended) {
        pn_node *n = ended;
        ended = n->next_dead;
        node_end(n, false);
    }
}
