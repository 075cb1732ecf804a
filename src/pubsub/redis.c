/* The Redis bridge: hiredis's async API on a tern loop.
 *
 * hiredis asks for readiness through five hooks (add/del read/write,
 * cleanup); each of the bridge's two connections answers them with one
 * loop watcher (struct link). hiredis frees a context by itself after an
 * error or a lost connection, telling us through the cleanup hook (the
 * watcher goes) and the connect/disconnect callbacks (a reconnect is
 * scheduled). Nothing here blocks: connect(2) is non-blocking, and a
 * publish while Redis is away is counted and forgotten.
 *
 * The envelope on the wire, binary-safe: "tern1", the node's 16-byte id,
 * the opcode (one byte), seq_at (8 bytes, little-endian; all ones for
 * none), the key's length (one byte; 0 for none) and the key, then the
 * payload. A node drops envelopes carrying its own id: it
 * delivered those itself when they were published. */
#include "pubsub/redis.h"

#include <errno.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>

#include "loop/log.h"
#include "loop/loop.h"

#define CHANNEL_PREFIX "tern:"
#define MAGIC "tern1"
#define MAGIC_LEN 5
#define ID_LEN 16
#define HEAD_LEN (MAGIC_LEN + ID_LEN + 1 + 8 + 1)   /* up to the key's length */
#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000

/* One hiredis connection and its watcher. Invariant: ac is NULL or a live
 * context whose ev.data is this link; io is registered for `events`
 * (EPOLLIN/EPOLLOUT) and only while ac is set. */
typedef struct link {
    struct tern__redis *r;
    redisAsyncContext *ac;
    tern__io io;
    uint32_t events;
    bool up;            /* connected (onConnect said so) */
} link;

/* Invariants: both links up (connected), or connecting, or a retry armed
 * (retry_armed): a bridge never sits down with nothing to wake it, but
 * when the timer cannot be had (out of memory); counters are written by
 * the loop's thread and read by any. */
struct tern__redis {
    tern_loop *loop;
    char host[256];
    int port, db;
    uint8_t id[ID_LEN];
    link sub, pub;
    tern_timer *retry;
    uint32_t backoff_ms;
    unsigned seed;      /* the jitter's (rand_r: this loop's own sequence) */
    bool was_up;        /* both links are or were up since the last loss: a loss is logged */
    bool ever_up;       /* connected once: the next connection counts as a reconnect */
    bool freeing;       /* in tern__redis_free or resetting the links: callbacks do nothing */
    bool retry_armed;
    tern__redis_hooks hooks;
    void *user;
    _Atomic bool connected;
    _Atomic uint64_t reconnects, published, received, dropped;
};

static void bump(_Atomic uint64_t *c) {
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + 1,
                          memory_order_relaxed);
}

/* ---- the adapter: hiredis's hooks on a tern watcher -------------------- */

static void set_events(link *l, uint32_t ev) {
    if (l->events != ev && tern__io_set(l->r->loop, &l->io, ev) == 0)
        l->events = ev;
}
static void add_read(void *p) { link *l = p; set_events(l, l->events | EPOLLIN); }
static void del_read(void *p) { link *l = p; set_events(l, l->events & ~(uint32_t)EPOLLIN); }
static void add_write(void *p) { link *l = p; set_events(l, l->events | EPOLLOUT); }
static void del_write(void *p) { link *l = p; set_events(l, l->events & ~(uint32_t)EPOLLOUT); }
static void cleanup(void *p) {
    link *l = p;
    set_events(l, 0);
    l->ac = NULL;
    l->up = false;
}

static void on_io(tern__io *io, uint32_t revents) {
    link *l = tern__container_of(io, link, io);
    /* Reading may end the context (cleanup sets l->ac to NULL). */
    if (l->ac && (revents & (EPOLLIN | EPOLLERR | EPOLLHUP)))
        redisAsyncHandleRead(l->ac);
    if (l->ac && (revents & (EPOLLOUT | EPOLLERR)))
        redisAsyncHandleWrite(l->ac);
}

/* ---- connecting -------------------------------------------------------- */

static void connect_links(tern__redis *r);

static void on_retry(tern_timer *t, void *user) {
    (void)t;
    tern__redis *r = user;
    r->retry_armed = false;
    connect_links(r);
}

/* A link went down or could not come up: try again after the backoff. */
static void link_lost(tern__redis *r) {
    if (r->freeing || r->retry_armed)
        return;
    if (r->was_up)
        tern__log(TERN_LOG_WARN, TERN__LOG_RUN, "redis %s:%d lost; local delivery goes on, "
                  "reconnecting", r->host, r->port);
    r->was_up = false;
    atomic_store(&r->connected, false);
    /* jitter: +-25 %, so many nodes do not come back in step */
    uint32_t wait = r->backoff_ms - r->backoff_ms / 4 + (uint32_t)rand_r(&r->seed) % (r->backoff_ms / 2 + 1);
    r->backoff_ms = r->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : r->backoff_ms * 2;
    if (r->retry ? tern_timer_again(r->retry, wait) : tern_timer_start(r->loop, &r->retry, wait,
                                                                        0, on_retry, r))
        return;   /* out of memory: retried at the next loss of the other link, if any */
    r->retry_armed = true;
}

static void both_up(tern__redis *r) {
    if (r->ever_up)
        bump(&r->reconnects);
    r->ever_up = true;
    r->backoff_ms = BACKOFF_MIN_MS;
    r->was_up = true;
    atomic_store(&r->connected, true);
    tern__log(TERN_LOG_INFO, TERN__LOG_RUN, "redis %s:%d connected", r->host, r->port);
    r->hooks.resubscribe(r->user);
}

static void on_connect(const redisAsyncContext *ac, int status) {
    link *l = ac->ev.data;
    tern__redis *r = l->r;
    if (r->freeing)
        return;
    if (status != REDIS_OK) {
        /* hiredis frees the context after this (cleanup clears l->ac) */
        link_lost(r);
        return;
    }
    l->up = true;
    if (r->sub.up && r->pub.up)
        both_up(r);
}

/* Either link lost: the next try starts both afresh (connect_links), so
 * that they come back together, and the subscriptions with them. */
static void on_disconnect(const redisAsyncContext *ac, int status) {
    (void)status;
    link *l = ac->ev.data;
    l->up = false;
    if (!l->r->freeing)
        link_lost(l->r);
}

static int link_connect(tern__redis *r, link *l) {
    redisAsyncContext *ac = redisAsyncConnect(r->host, r->port);
    if (ac == NULL)
        return -ENOMEM;
    if (ac->err) {
        redisAsyncFree(ac);
        return -ECONNREFUSED;
    }
    l->r = r;
    l->ac = ac;
    l->up = false;
    l->events = 0;
    tern__io_init(&l->io, ac->c.fd, on_io);
    ac->ev.data = l;
    ac->ev.addRead = add_read;
    ac->ev.delRead = del_read;
    ac->ev.addWrite = add_write;
    ac->ev.delWrite = del_write;
    ac->ev.cleanup = cleanup;
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    /* hiredis asks for writability itself (the connect's completion) when
     * the first command is queued; ask now, so that the connect completes
     * even when there is nothing to send. */
    add_write(l);
    if (r->db != 0)
        redisAsyncCommand(ac, NULL, NULL, "SELECT %d", r->db);
    return 0;
}

static void free_links(tern__redis *r) {
    bool was = r->freeing;
    r->freeing = true;
    if (r->sub.ac)
        redisAsyncFree(r->sub.ac);   /* cleanup clears sub.ac */
    if (r->pub.ac)
        redisAsyncFree(r->pub.ac);
    r->freeing = was;
}

static void connect_links(tern__redis *r) {
    free_links(r);   /* what is left of the last pair */
    if (link_connect(r, &r->sub) < 0 || link_connect(r, &r->pub) < 0) {
        free_links(r);
        link_lost(r);
    }
}

/* ---- the bridge --------------------------------------------------------- */

static int parse_url(tern__redis *r, const char *url) {
    const char *p = url;
    if (strncmp(p, "redis://", 8) != 0)
        return -EINVAL;
    p += 8;
    size_t hl = strcspn(p, ":/");
    if (hl == 0 || hl >= sizeof(r->host))
        return -EINVAL;
    memcpy(r->host, p, hl);
    r->host[hl] = '\0';
    p += hl;
    r->port = 6379;
    r->db = 0;
    char *end;
    if (*p == ':') {
        long v = strtol(p + 1, &end, 10);
        if (end == p + 1 || v < 1 || v > 65535)
            return -EINVAL;
        r->port = (int)v;
        p = end;
    }
    if (*p == '/' && p[1] != '\0') {
        long v = strtol(p + 1, &end, 10);
        if (end == p + 1 || v < 0 || v > 1000000 || *end != '\0')
            return -EINVAL;
        r->db = (int)v;
        p = end;
    } else if (*p == '/') {
        p++;
    }
    return *p == '\0' ? 0 : -EINVAL;
}

int tern__redis_new(tern__redis **out, tern_loop *loop, const char *url,
                    const tern__redis_hooks *hooks, void *user) {
    tern__redis *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return -ENOMEM;
    int err = parse_url(r, url);
    if (err < 0) {
        free(r);
        return err;
    }
    if (getrandom(r->id, sizeof(r->id), 0) != (ssize_t)sizeof(r->id)) {
        free(r);
        return -EAGAIN;
    }
    r->loop = loop;
    r->hooks = *hooks;
    r->user = user;
    r->backoff_ms = BACKOFF_MIN_MS;
    memcpy(&r->seed, r->id, sizeof(r->seed));
    connect_links(r);
    *out = r;
    return 0;
}

void tern__redis_free(tern__redis *r) {
    if (r == NULL)
        return;
    r->freeing = true;
    /* redisAsyncFree calls cleanup (the watcher goes) and the reply
     * callbacks with NULL, which do nothing. */
    free_links(r);
    if (r->retry)
        tern_timer_stop(r->retry);
    free(r);
}

tern_loop *tern__redis_loop(const tern__redis *r) { return r->loop; }

static void on_message(redisAsyncContext *ac, void *reply, void *priv) {
    (void)ac;
    tern__redis *r = priv;
    redisReply *m = reply;
    if (m == NULL || r->freeing || m->type != REDIS_REPLY_ARRAY || m->elements != 3 ||
        m->element[0]->type != REDIS_REPLY_STRING || strcmp(m->element[0]->str, "message") != 0 ||
        m->element[2]->type != REDIS_REPLY_STRING)
        return;   /* a subscribe/unsubscribe confirmation, or not ours */
    const redisReply *ch = m->element[1], *body = m->element[2];
    size_t plen = sizeof(CHANNEL_PREFIX) - 1;
    if (ch->len <= plen || ch->len - plen > TERN_TOPIC_MAX || body->len < HEAD_LEN ||
        memcmp(body->str, MAGIC, MAGIC_LEN) != 0)
        return;
    const uint8_t *h = (const uint8_t *)body->str;
    if (memcmp(h + MAGIC_LEN, r->id, ID_LEN) == 0)
        return;   /* ours: delivered when it was published */
    int opcode = h[MAGIC_LEN + ID_LEN];
    uint64_t at = 0;
    for (int i = 7; i >= 0; i--)
        at = at << 8 | h[MAGIC_LEN + ID_LEN + 1 + i];
    size_t klen = h[HEAD_LEN - 1];
    if (klen > TERN_KEY_MAX || body->len < HEAD_LEN + klen)
        return;
    size_t len = body->len - HEAD_LEN - klen;
    if ((opcode != TERN_WS_TEXT && opcode != TERN_WS_BINARY) || (at != UINT64_MAX && at > len))
        return;
    bump(&r->received);
    r->hooks.message(r->user, ch->str + plen, ch->len - plen, body->str + HEAD_LEN, klen,
                     body->str + HEAD_LEN + klen, len, opcode,
                     at == UINT64_MAX ? SIZE_MAX : (size_t)at);
}

void tern__redis_subscribe(tern__redis *r, const char *topic, size_t tlen, bool on) {
    if (!r->sub.up)
        return;   /* the resubscribe after the reconnect covers it */
    redisAsyncCommand(r->sub.ac, on ? on_message : NULL, on ? r : NULL,
                      on ? "SUBSCRIBE " CHANNEL_PREFIX "%b" : "UNSUBSCRIBE " CHANNEL_PREFIX "%b",
                      topic, tlen);
}

void tern__redis_publish(tern__redis *r, const char *topic, size_t tlen, const char *key,
                         size_t klen, const void *data, size_t len, int opcode, size_t seq_at) {
    if (!r->pub.up) {
        bump(&r->dropped);
        return;
    }
    uint8_t head[HEAD_LEN];
    memcpy(head, MAGIC, MAGIC_LEN);
    memcpy(head + MAGIC_LEN, r->id, ID_LEN);
    head[MAGIC_LEN + ID_LEN] = (uint8_t)opcode;
    uint64_t at = seq_at == SIZE_MAX ? UINT64_MAX : (uint64_t)seq_at;
    for (int i = 0; i < 8; i++)
        head[MAGIC_LEN + ID_LEN + 1 + i] = (uint8_t)(at >> (8 * i));
    head[HEAD_LEN - 1] = (uint8_t)klen;   /* at most TERN_KEY_MAX (128) */
    /* One command, with the envelope as two binary-safe pieces. */
    const char *argv[3] = {"PUBLISH", NULL, NULL};
    size_t argl[3] = {7, 0, 0};
    char chan[sizeof(CHANNEL_PREFIX) + TERN_TOPIC_MAX];
    memcpy(chan, CHANNEL_PREFIX, sizeof(CHANNEL_PREFIX) - 1);
    memcpy(chan + sizeof(CHANNEL_PREFIX) - 1, topic, tlen);
    argv[1] = chan;
    argl[1] = sizeof(CHANNEL_PREFIX) - 1 + tlen;
    char *msg = malloc(HEAD_LEN + klen + len);
    if (msg == NULL) {
        bump(&r->dropped);
        return;
    }
    memcpy(msg, head, HEAD_LEN);
    if (klen)
        memcpy(msg + HEAD_LEN, key, klen);
    if (len)
        memcpy(msg + HEAD_LEN + klen, data, len);
    argv[2] = msg;
    argl[2] = HEAD_LEN + klen + len;
    if (redisAsyncCommandArgv(r->pub.ac, NULL, NULL, 3, argv, argl) == REDIS_OK)
        bump(&r->published);
    else
        bump(&r->dropped);
    free(msg);
}

void tern__redis_stats(const tern__redis *r, tern_redis_counters *out) {
    out->connected = atomic_load(&r->connected);
    out->reconnects = atomic_load(&r->reconnects);
    out->published = atomic_load(&r->published);
    out->received = atomic_load(&r->received);
    out->dropped = atomic_load(&r->dropped);
}
