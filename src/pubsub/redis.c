/* The Redis engine (engine.h, filled by tern__redis_engine at the end):
 * hiredis's async API on a tern loop.
 *
 * hiredis asks for readiness through five hooks (add/del read/write,
 * cleanup); each of the bridge's two connections answers them with one
 * loop watcher (struct rlink). hiredis frees a context by itself after an
 * error or a lost connection, telling us through the cleanup hook (the
 * watcher goes) and the connect/disconnect callbacks (a reconnect is
 * scheduled). Nothing here blocks: a host name is resolved by c-ares on
 * the loop (net/resolve.h) and hiredis is given an address, connect(2) is
 * non-blocking, and a publish while Redis is away is counted and
 * forgotten.
 *
 * Every failure is logged with its reason (the resolver's, connect(2)'s,
 * Redis's error reply, hiredis's words for a lost link), once per change
 * of reason: a Redis that stays away is said once, not at every retry;
 * and once the bridge is linked again, that too is said once. The backoff
 * starts again from its minimum only after the links have stayed up for
 * STABLE_MS: a link refused at its first commands (a password, an ACL
 * without the rights) keeps backing off.
 *
 * The envelope on the wire, binary-safe: "tern1", the node's 16-byte id,
 * the opcode (one byte), seq_at (8 bytes, little-endian; all ones for
 * none), the key's length (one byte; 0 for none) and the key, then the
 * payload. A node drops envelopes carrying its own id: it
 * delivered those itself when they were published.
 *
 * A topic with a history is numbered by Redis instead, so that every node
 * agrees on its offsets: a script counts the message, keeps it in the
 * topic's stream and publishes it as "tern2", the epoch (16 hex digits),
 * the seq (20 decimal digits), then the envelope; every node, the
 * publisher too, delivers it when it hears it (through a pattern
 * subscription), and one that missed some (its link was down) reads them
 * back from the stream (XRANGE) before going on. */
#include "pubsub/redis.h"

#include <arpa/inet.h>
#include <errno.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loop/counter.h"
#include "loop/log.h"
#include "loop/loop.h"
#include "net/resolve.h"
#include "platform/platform.h"
#include "tern/url.h"

#define CHANNEL_PREFIX "tern:"
#define MAGIC "tern1"
#define MAGIC_LEN 5
#define ID_LEN 16
#define MAGIC_NUM "tern2"   /* a message numbered by Redis */
#define NUM_HEAD_LEN (MAGIC_LEN + 16 + 20)   /* magic, epoch (hex), seq (decimal) */
#define ENV_LEN (ID_LEN + 1 + 8 + 1)         /* the envelope up to the key's length */
#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000
#define STABLE_MS 3000        /* linked this long: the next loss starts the backoff afresh */
#define RESOLVE_TIMEOUT_MS 5000

typedef struct tern__redis tern__redis;

/* One hiredis connection and its watcher. Invariant: ac is NULL or a live
 * context whose ev.data is this link; io is registered for `events`
 * (TERN__IO_IN/TERN__IO_OUT) and only while ac is set. */
typedef struct rlink {
    struct tern__redis *r;
    redisAsyncContext *ac;
    tern__io io;
    uint32_t events;
    bool up;            /* connected (onConnect said so) and, with a password, AUTH accepted */
} rlink;

/* Invariants: both links up (connected), or connecting (the host name
 * resolving: q set; or the links' connects under way), or a retry armed
 * (retry_armed): a bridge never sits down with nothing to wake it, but
 * when the timer cannot be had (out of memory); why is the failure last
 * logged, empty once the bridge is linked again; counters are written by
 * the loop's thread and read by any. */
struct tern__redis {
    tern_loop *loop;
    char host[TERN_URL_HOST_MAX];
    int port, db;
    bool host_is_name;   /* host is not an IP address: resolved before each try */
    tern__resolve *q;    /* the name's resolution under way */
    unsigned addr_next;  /* of the name's addresses, the one to try (the next after a refusal) */
    char ip[INET6_ADDRSTRLEN];   /* the address the links are made to */
    char why[256];
    /* The URL's user and password, percent-decoded (empty: none; a user
     * needs a password). Never logged; wiped when the bridge is freed. */
    char auth_user[TERN_URL_USER_MAX], auth_pass[TERN_URL_PASSWORD_MAX];
    _Atomic bool auth_refused;   /* Redis refused them at the last try */
    uint8_t id[ID_LEN];
    rlink sub, pub;
    tern_timer *retry;
    uint32_t backoff_ms;
    uint64_t up_since;  /* the loop's clock when the bridge last became connected */
    unsigned seed;      /* the jitter's (rand_r: this loop's own sequence) */
    bool ever_up;       /* connected once: the next connection counts as a reconnect */
    bool freeing;       /* in redis_free or resetting the links: callbacks do nothing */
    bool retry_armed;
    /* PSUBSCRIBEs sent on this sub link and not yet confirmed (counted
     * afresh by each both_up): until they are, messages Redis numbers would
     * go by unheard, so the bridge does not say it is connected (and a
     * publish is not sent to be numbered). */
    int psub_waiting;
    /* The numbering script's SHA1 as Redis gave it (SCRIPT LOAD on each
     * new publishing link); empty until then: EVAL with its text. */
    char sha[41];
    tern__engine_hooks hooks;
    void *user;
    _Atomic bool connected;
    _Atomic uint64_t reconnects, published, received, dropped, fills;
};

static void bump(_Atomic uint64_t *c) { TERN__COUNTER_ADD(*c, 1); }

/* ---- the adapter: hiredis's hooks on a tern watcher -------------------- */

static void set_events(rlink *l, uint32_t ev) {
    if (l->events != ev && tern__io_set(l->r->loop, &l->io, ev) == 0)
        l->events = ev;
}
static void add_read(void *p) { rlink *l = p; set_events(l, l->events | TERN__IO_IN); }
static void del_read(void *p) { rlink *l = p; set_events(l, l->events & ~(uint32_t)TERN__IO_IN); }
static void add_write(void *p) { rlink *l = p; set_events(l, l->events | TERN__IO_OUT); }
static void del_write(void *p) { rlink *l = p; set_events(l, l->events & ~(uint32_t)TERN__IO_OUT); }
static void cleanup(void *p) {
    rlink *l = p;
    set_events(l, 0);
    l->ac = NULL;
    l->up = false;
}

static void on_io(tern__io *io, uint32_t revents) {
    rlink *l = tern__container_of(io, rlink, io);
    /* Reading may end the context (cleanup sets l->ac to NULL). */
    if (l->ac && (revents & (TERN__IO_IN | TERN__IO_ERR | TERN__IO_HUP)))
        redisAsyncHandleRead(l->ac);
    if (l->ac && (revents & (TERN__IO_OUT | TERN__IO_ERR)))
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

/* Says why the bridge is not linked (or a command failed), unless that
 * was the last thing said: a Redis that stays away is said once, not at
 * every retry. set_connected forgets it, so the next failure is said. */
static void say(tern__redis *r, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void say(tern__redis *r, int level, const char *fmt, ...) {
    char why[sizeof(r->why)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    if (strcmp(why, r->why) == 0)
        return;
    memcpy(r->why, why, sizeof(why));
    tern__log(level, TERN__LOG_RUN, "redis %s:%d %s", r->host, r->port, why);
}

/* A link went down or could not come up (its reason said by the caller):
 * try again after the backoff. The backoff starts afresh only when the
 * bridge had stayed connected for STABLE_MS: a link that Redis drops at
 * its first commands comes up every time, and must not be retried at
 * the minimum forever. */
static void link_lost(tern__redis *r) {
    if (r->freeing || r->retry_armed)
        return;
    if (atomic_load(&r->connected) && tern_loop_now(r->loop) - r->up_since >= STABLE_MS)
        r->backoff_ms = BACKOFF_MIN_MS;
    atomic_store(&r->connected, false);
    /* jitter: +-25 %, so many nodes do not come back in step */
    uint32_t wait = r->backoff_ms - r->backoff_ms / 4 + (uint32_t)rand_r(&r->seed) % (r->backoff_ms / 2 + 1);
    r->backoff_ms = r->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : r->backoff_ms * 2;
    /* every try, at debug level only: the reason was said once */
    tern__log(TERN_LOG_DEBUG, TERN__LOG_RUN, "redis %s:%d next try in %u ms", r->host, r->port,
              wait);
    if (r->retry ? tern_timer_again(r->retry, wait) : tern_timer_start(r->loop, &r->retry, wait,
                                                                        0, on_retry, r))
        return;   /* out of memory: retried at the next loss of the other link, if any */
    r->retry_armed = true;
}

/* Linked (both links up, the patterns confirmed). A recovery from a
 * failure that was said is said at the failure's level, so that whoever
 * saw the one sees the other. */
static void set_connected(tern__redis *r) {
    atomic_store(&r->connected, true);
    r->up_since = tern_loop_now(r->loop);
    tern__log(r->why[0] ? TERN_LOG_WARN : TERN_LOG_INFO, TERN__LOG_RUN, "redis %s:%d connected%s",
              r->host, r->port, r->why[0] ? " again" : "");
    r->why[0] = '\0';
}

static void both_up(tern__redis *r) {
    if (r->ever_up)
        bump(&r->reconnects);
    r->ever_up = true;
    r->psub_waiting = 0;
    r->hooks.resubscribe(r->user);
    /* connected now, or when the last pattern subscription is confirmed */
    if (r->psub_waiting == 0)
        set_connected(r);
}

static void link_up(rlink *l) {
    tern__redis *r = l->r;
    l->up = true;
    if (r->sub.up && r->pub.up)
        both_up(r);
}

/* The answer to a link's first command, AUTH with a password, PING
 * without (a Redis with requirepass answers NOAUTH): the link is up only
 * once it is accepted. A refusal is said once (Redis's own words, which
 * never hold the password) until a try succeeds, and the link is dropped
 * to be tried again after the backoff, as after a loss: the password may
 * be fixed on the Redis side meanwhile. */
static void on_auth(redisAsyncContext *ac, void *reply, void *priv) {
    tern__redis *r = priv;
    redisReply *m = reply;
    if (m == NULL || r->freeing)
        return;   /* the link went, or is being freed */
    rlink *l = ac->ev.data;
    if (m->type == REDIS_REPLY_ERROR) {
        say(r, TERN_LOG_ERROR, "refused %s%s%s: %.*s",
            r->auth_pass[0] ? "the password" : "a client without a password",
            r->auth_user[0] ? " of user " : "", r->auth_user,
            (int)(m->len > 160 ? 160 : m->len), m->str);
        atomic_store(&r->auth_refused, true);
        redisAsyncDisconnect(ac);   /* on_disconnect: link_lost, the backoff */
        return;
    }
    atomic_store(&r->auth_refused, false);
    link_up(l);
}

static void on_connect(const redisAsyncContext *ac, int status) {
    rlink *l = ac->ev.data;
    tern__redis *r = l->r;
    if (r->freeing)
        return;
    if (status != REDIS_OK) {
        /* hiredis frees the context after this (cleanup clears l->ac) */
        say(r, TERN_LOG_WARN, "unreachable: connect to %s: %s; local delivery goes on, retrying",
            r->ip, ac->errstr);
        if (l == &r->sub)
            r->addr_next++;   /* a name's next address at the next try, if it has more */
        link_lost(r);
        return;
    }
    /* up in on_auth, when Redis has answered the first command */
}

/* Either link lost: the next try starts both afresh (connect_links), so
 * that they come back together, and the subscriptions with them. */
static void on_disconnect(const redisAsyncContext *ac, int status) {
    rlink *l = ac->ev.data;
    tern__redis *r = l->r;
    l->up = false;
    if (r->freeing)
        return;
    /* REDIS_OK: our own redisAsyncDisconnect, its reason said already.
     * REDIS_ERR_OTHER: an error reply hiredis had no command for (a
     * refused SUBSCRIBE or PSUBSCRIBE: NOPERM), on which it drops the
     * link; else the link itself failed (EOF, a reset). */
    if (status != REDIS_OK && ac->err == REDIS_ERR_OTHER)
        say(r, TERN_LOG_WARN, "dropped the %s link after an error reply: %s",
            l == &r->sub ? "subscribing" : "publishing", ac->errstr);
    else if (status != REDIS_OK)
        say(r, TERN_LOG_WARN, "lost: %s; local delivery goes on, reconnecting", ac->errstr);
    link_lost(r);
}

/* An error reply to what, on ac's link: said (Redis's words: NOPERM
 * names the right that is missing), but on a link whose first command was
 * refused: what follows it is refused for that reason (NOAUTH), said
 * already. True when m is one. */
static bool reply_error(tern__redis *r, const redisAsyncContext *ac, const char *what,
                        const redisReply *m) {
    if (m == NULL || r->freeing || m->type != REDIS_REPLY_ERROR)
        return false;
    const rlink *l = ac->ev.data;
    if (l->up)
        say(r, TERN_LOG_WARN, "refused %s: %.*s", what, (int)(m->len > 160 ? 160 : m->len), m->str);
    return true;
}

/* SELECT refused: the link is dropped, as after a refused AUTH (it would
 * number topics in database 0), and tried again after the backoff. */
static void on_select(redisAsyncContext *ac, void *reply, void *priv) {
    if (reply_error(priv, ac, "SELECT", reply))
        redisAsyncDisconnect(ac);
}

/* CLIENT SETNAME refused: only said (the name is for CLIENT LIST). */
static void on_setname(redisAsyncContext *ac, void *reply, void *priv) {
    reply_error(priv, ac, "CLIENT SETNAME", reply);
}

/* KEYS: the topic's hash, its stream, its channel. ARGV: an epoch for a
 * count that starts again (16 hex digits), the stream's length, the
 * envelope, the keys' lifetime in ms (0: none). A missing or reset count
 * starts a new epoch and an empty stream, so a seq is never read back
 * under an epoch it was not published in; but an epoch claimed before
 * the first message (CLAIM_SCRIPT: a hash with e and no s) is kept, as
 * subscribers were given it. */
static const char NUMBER_SCRIPT[] =
    "local s = redis.call('HINCRBY', KEYS[1], 's', 1)\n"
    "local e = redis.call('HGET', KEYS[1], 'e')\n"
    "if s == 1 or not e then\n"
    "  s = 1\n"
    "  e = e or ARGV[1]\n"
    "  redis.call('HSET', KEYS[1], 's', 1, 'e', e)\n"
    "  redis.call('DEL', KEYS[2])\n"
    "end\n"
    "local m = '" MAGIC_NUM "' .. e .. string.format('%020d', s) .. ARGV[3]\n"
    "redis.call('XADD', KEYS[2], 'MAXLEN', ARGV[2], string.format('0-%d', s), 'm', m)\n"
    "if ARGV[4] ~= '0' then\n"
    "  redis.call('PEXPIRE', KEYS[1], ARGV[4])\n"
    "  redis.call('PEXPIRE', KEYS[2], ARGV[4])\n"
    "end\n"
    "redis.call('PUBLISH', KEYS[3], m)\n"
    "return s\n";

/* SCRIPT LOAD's reply: the numbering script's SHA1, for EVALSHA. */
static void on_script(redisAsyncContext *ac, void *reply, void *priv) {
    tern__redis *r = priv;
    redisReply *m = reply;
    if (m && !r->freeing && m->type == REDIS_REPLY_STRING && m->len == 40) {
        memcpy(r->sha, m->str, 40);
        r->sha[40] = '\0';
    }
    reply_error(r, ac, "SCRIPT LOAD", m);
}

/* Starts l's connect to r->ip: 0, the outcome from the loop; or a
 * negative error, said. */
static int link_connect(tern__redis *r, rlink *l) {
    redisAsyncContext *ac = redisAsyncConnect(r->ip, r->port);
    if (ac == NULL)
        return -ENOMEM;
    if (ac->err) {
        say(r, TERN_LOG_WARN, "unreachable: connect to %s: %s; local delivery goes on, retrying",
            r->ip, ac->errstr);
        if (l == &r->sub)
            r->addr_next++;   /* as in on_connect */
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
    /* First: every command after it is refused (NOAUTH) without it. */
    if (r->auth_user[0])
        redisAsyncCommand(ac, on_auth, r, "AUTH %s %s", r->auth_user, r->auth_pass);
    else if (r->auth_pass[0])
        redisAsyncCommand(ac, on_auth, r, "AUTH %s", r->auth_pass);
    else
        redisAsyncCommand(ac, on_auth, r, "PING");
    if (r->db != 0)
        redisAsyncCommand(ac, on_select, r, "SELECT %d", r->db);
    /* CLIENT LIST tells an operator which node and which link it is */
    redisAsyncCommand(ac, on_setname, r, "CLIENT SETNAME tern-%ld-%s", (long)getpid(),
                      l == &r->sub ? "sub" : "pub");
    if (l == &r->pub) {   /* before any EVALSHA on this connection: they find it loaded */
        r->sha[0] = '\0';
        redisAsyncCommand(ac, on_script, r, "SCRIPT LOAD %s", NUMBER_SCRIPT);
    }
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

/* Both links to r->ip. */
static void open_links(tern__redis *r) {
    if (link_connect(r, &r->sub) < 0 || link_connect(r, &r->pub) < 0) {
        free_links(r);
        link_lost(r);
    }
}

/* The host name's answer, from the loop: the links are made to one of its
 * addresses (the next one after a refused connect), or the failure is
 * said and tried again after the backoff. */
static void on_resolved(void *user, int err, const char *why, const struct sockaddr_storage *ss,
                        const socklen_t *len, int n) {
    (void)len;
    tern__redis *r = user;
    r->q = NULL;
    if (err < 0) {
        say(r, TERN_LOG_WARN, "unreachable: cannot resolve %s: %s; local delivery goes on, "
            "retrying", r->host, why);
        link_lost(r);
        return;
    }
    const struct sockaddr_storage *a = &ss[r->addr_next % (unsigned)n];
    if (a->ss_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)a)->sin6_addr, r->ip, sizeof(r->ip));
    else
        inet_ntop(AF_INET, &((const struct sockaddr_in *)a)->sin_addr, r->ip, sizeof(r->ip));
    open_links(r);
}

/* A try: both links afresh, after the host name's resolution when it is
 * one (again at every try: its addresses may have changed). */
static void connect_links(tern__redis *r) {
    free_links(r);   /* what is left of the last pair */
    if (!r->host_is_name) {
        open_links(r);
        return;
    }
    if (r->q)
        return;   /* a resolution is under way already */
    int err = tern__resolve_start(&r->q, r->loop, r->host, r->port, NULL, RESOLVE_TIMEOUT_MS,
                                  on_resolved, r);
    if (err < 0) {
        say(r, TERN_LOG_WARN, "unreachable: cannot resolve %s: %s; local delivery goes on, "
            "retrying", r->host, tern_strerror(err));
        link_lost(r);
    }
}

/* ---- the engine: its URL, start and end --------------------------------- */

/* The URL's parts (tern_url_parse: redis://[[user]:password@]host[:port][/db]),
 * with the engine's own rule: a user needs a password (AUTH takes both
 * or the password alone). */
static int parse_url(tern__redis *r, const char *url) {
    tern_url u;
    int err = tern_url_parse(url, &u, NULL);
    if (err == 0 && strcmp(u.scheme, "redis") != 0)
        err = -EINVAL;
    if (err == 0 && u.userinfo && u.password[0] == '\0')
        err = -EINVAL;
    if (err == 0) {
        memcpy(r->host, u.host, sizeof(r->host));
        memcpy(r->auth_user, u.user, sizeof(r->auth_user));
        memcpy(r->auth_pass, u.password, sizeof(r->auth_pass));
        r->port = u.port;
        r->db = u.db;
        struct in6_addr bin;
        int family = inet_pton(AF_INET, r->host, &bin) == 1    ? AF_INET
                     : inet_pton(AF_INET6, r->host, &bin) == 1 ? AF_INET6 : 0;
        r->host_is_name = family == 0;
        if (family)
            inet_ntop(family, &bin, r->ip, sizeof(r->ip));
    }
    explicit_bzero(&u, sizeof(u));
    return err;
}

static int redis_new(tern__redis **out, tern_loop *loop, const char *url,
                     const tern__engine_hooks *hooks, void *user) {
    tern__redis *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return -ENOMEM;
    int err = parse_url(r, url);
    if (err < 0) {
        explicit_bzero(r, sizeof(*r));
        free(r);
        return err;
    }
    if (tern__plat_random(r->id, sizeof(r->id), true) < 0) {
        free(r);
        return -EAGAIN;
    }
    r->loop = loop;
    r->hooks = *hooks;
    r->user = user;
    r->backoff_ms = BACKOFF_MIN_MS;
    memcpy(&r->seed, r->id, sizeof(r->seed));
    /* The first try from the loop, as every later one: what it says is
     * logged from there, not from inside the caller's call. */
    err = tern_timer_start(loop, &r->retry, 0, 0, on_retry, r);
    if (err < 0) {
        explicit_bzero(r, sizeof(*r));
        free(r);
        return err;
    }
    r->retry_armed = true;
    *out = r;
    return 0;
}

static void redis_free(void *state) {
    tern__redis *r = state;
    if (r == NULL)
        return;
    r->freeing = true;
    /* redisAsyncFree calls cleanup (the watcher goes) and the reply
     * callbacks with NULL, which do nothing. */
    free_links(r);
    tern__resolve_cancel(r->q);
    if (r->retry)
        tern_timer_stop(r->retry);
    explicit_bzero(r->auth_pass, sizeof(r->auth_pass));
    free(r);
}

static tern_loop *redis_loop(const void *state) { return ((const tern__redis *)state)->loop; }

/* ---- envelopes ---------------------------------------------------------- */

/* The envelope after its magic: the node's id, the opcode, seq_at, the
 * key's length and the key, then the payload. Returns its length in a new
 * buffer (*out), 0 when out of memory. */
static size_t envelope(const tern__redis *r, const char *key, size_t klen, const void *data,
                       size_t len, int opcode, size_t seq_at, char **out) {
    size_t n = ENV_LEN + klen + len;
    uint8_t *m = malloc(n);
    if ((*out = (char *)m) == NULL)
        return 0;
    memcpy(m, r->id, ID_LEN);
    m[ID_LEN] = (uint8_t)opcode;
    uint64_t at = seq_at == SIZE_MAX ? UINT64_MAX : (uint64_t)seq_at;
    for (int i = 0; i < 8; i++)
        m[ID_LEN + 1 + i] = (uint8_t)(at >> (8 * i));
    m[ENV_LEN - 1] = (uint8_t)klen;   /* at most TERN_KEY_MAX (128) */
    if (klen)
        memcpy(m + ENV_LEN, key, klen);
    if (len)
        memcpy(m + ENV_LEN + klen, data, len);
    return n;
}

static bool parse_u64(const char *p, size_t n, int base, uint64_t *out) {
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        int d = p[i] >= '0' && p[i] <= '9' ? p[i] - '0'
              : base == 16 && p[i] >= 'a' && p[i] <= 'f' ? p[i] - 'a' + 10 : -1;
        if (d < 0 || v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base)
            return false;
        v = v * (uint64_t)base + (uint64_t)d;
    }
    *out = v;
    return true;
}

/* One message of channel ch (tern:TOPIC), live or from a fill: unpacked
 * and handed to pub/sub, or ignored when it is not ours to deliver. */
static void dispatch(tern__redis *r, const char *ch, size_t clen, const char *body, size_t blen,
                     bool fill, bool by_pattern) {
    size_t plen = sizeof(CHANNEL_PREFIX) - 1;
    if (clen <= plen || clen - plen > TERN_TOPIC_MAX || blen < MAGIC_LEN)
        return;
    tern__engine_num num = {.fill = fill}, *nump = NULL;
    const uint8_t *h = (const uint8_t *)body;
    if (memcmp(h, MAGIC, MAGIC_LEN) == 0) {
        /* ours: delivered when it was published; by a pattern: a topic
         * with no history, heard through SUBSCRIBE (its own channel) too */
        if (fill || by_pattern || blen < MAGIC_LEN + ENV_LEN ||
            memcmp(h + MAGIC_LEN, r->id, ID_LEN) == 0)
            return;
        h += MAGIC_LEN;
    } else if (memcmp(h, MAGIC_NUM, MAGIC_LEN) == 0) {
        if (blen < NUM_HEAD_LEN + ENV_LEN ||
            !parse_u64(body + MAGIC_LEN, 16, 16, &num.epoch) ||
            !parse_u64(body + MAGIC_LEN + 16, 20, 10, &num.seq) || num.epoch == 0 || num.seq == 0)
            return;
        h += NUM_HEAD_LEN;
        nump = &num;
    } else {
        return;
    }
    size_t rest = blen - (size_t)((const char *)h - body);
    int opcode = h[ID_LEN];
    uint64_t at = 0;
    for (int i = 7; i >= 0; i--)
        at = at << 8 | h[ID_LEN + 1 + i];
    size_t klen = h[ENV_LEN - 1];
    if (klen > TERN_KEY_MAX || rest < ENV_LEN + klen)
        return;
    size_t len = rest - ENV_LEN - klen;
    if ((opcode != TERN_WS_TEXT && opcode != TERN_WS_BINARY) || (at != UINT64_MAX && at > len))
        return;
    bump(&r->received);
    const char *key = (const char *)h + ENV_LEN;
    r->hooks.message(r->user, ch + plen, clen - plen, key, klen, key + klen, len, opcode,
                     at == UINT64_MAX ? SIZE_MAX : (size_t)at, nump);
}

static void on_message(redisAsyncContext *ac, void *reply, void *priv) {
    (void)ac;
    tern__redis *r = priv;
    redisReply *m = reply;
    if (m == NULL || r->freeing || m->type != REDIS_REPLY_ARRAY || m->elements < 3 ||
        m->element[0]->type != REDIS_REPLY_STRING)
        return;
    /* ["message", channel, body] or ["pmessage", pattern, channel, body];
     * else a subscribe confirmation */
    if (strcmp(m->element[0]->str, "psubscribe") == 0) {
        if (r->psub_waiting > 0 && --r->psub_waiting == 0 && r->sub.up && r->pub.up &&
            !atomic_load(&r->connected))
            set_connected(r);
        r->hooks.listening(r->user);
        return;
    }
    size_t first = strcmp(m->element[0]->str, "message") == 0 && m->elements == 3 ? 1
                 : strcmp(m->element[0]->str, "pmessage") == 0 && m->elements == 4 ? 2 : 0;
    if (first == 0 || m->element[first]->type != REDIS_REPLY_STRING ||
        m->element[first + 1]->type != REDIS_REPLY_STRING)
        return;
    const redisReply *ch = m->element[first], *body = m->element[first + 1];
    dispatch(r, ch->str, ch->len, body->str, body->len, false, first == 2);
}

static void redis_subscribe(void *state, const char *topic, size_t tlen, bool on) {
    tern__redis *r = state;
    if (!r->sub.up)
        return;   /* the resubscribe after the reconnect covers it */
    redisAsyncCommand(r->sub.ac, on ? on_message : NULL, on ? r : NULL,
                      on ? "SUBSCRIBE " CHANNEL_PREFIX "%b" : "UNSUBSCRIBE " CHANNEL_PREFIX "%b",
                      topic, tlen);
}

static void redis_psubscribe(void *state, const char *prefix, size_t plen) {
    tern__redis *r = state;
    if (!r->sub.up)
        return;
    /* the prefix taken literally: glob's special characters escaped */
    char pat[sizeof(CHANNEL_PREFIX) + 2 * TERN_TOPIC_MAX + 1];
    size_t n = sizeof(CHANNEL_PREFIX) - 1;
    memcpy(pat, CHANNEL_PREFIX, n);
    for (size_t i = 0; i < plen && i < TERN_TOPIC_MAX; i++) {
        if (strchr("*?[]\\", prefix[i]) && prefix[i] != '\0')
            pat[n++] = '\\';
        pat[n++] = prefix[i];
    }
    pat[n++] = '*';
    if (redisAsyncCommand(r->sub.ac, on_message, r, "PSUBSCRIBE %b", pat, n) == REDIS_OK)
        r->psub_waiting++;
}

static void redis_publish(void *state, const char *topic, size_t tlen, const char *key,
                          size_t klen, const void *data, size_t len, int opcode, size_t seq_at) {
    tern__redis *r = state;
    char *env;
    size_t n;
    if (!r->pub.up || (n = envelope(r, key, klen, data, len, opcode, seq_at, &env)) == 0) {
        bump(&r->dropped);
        return;
    }
    char chan[sizeof(CHANNEL_PREFIX) + TERN_TOPIC_MAX];
    memcpy(chan, CHANNEL_PREFIX, sizeof(CHANNEL_PREFIX) - 1);
    memcpy(chan + sizeof(CHANNEL_PREFIX) - 1, topic, tlen);
    /* One command, with the magic and the envelope as binary-safe pieces. */
    if (redisAsyncCommand(r->pub.ac, NULL, NULL, "PUBLISH %b " MAGIC "%b", chan,
                          sizeof(CHANNEL_PREFIX) - 1 + tlen, env, n) == REDIS_OK)
        bump(&r->published);
    else
        bump(&r->dropped);
    free(env);
}


/* The topic's three names: tern:n:T, tern:s:T, tern:T. */
typedef struct names {
    char hash[sizeof(CHANNEL_PREFIX) + 2 + TERN_TOPIC_MAX];
    char stream[sizeof(CHANNEL_PREFIX) + 2 + TERN_TOPIC_MAX];
    char chan[sizeof(CHANNEL_PREFIX) + TERN_TOPIC_MAX];
    size_t hlen, clen;
} names;

static void topic_names(names *n, const char *topic, size_t tlen) {
    size_t pl = sizeof(CHANNEL_PREFIX) - 1;
    memcpy(n->hash, CHANNEL_PREFIX "n:", pl + 2);
    memcpy(n->hash + pl + 2, topic, tlen);
    memcpy(n->stream, CHANNEL_PREFIX "s:", pl + 2);
    memcpy(n->stream + pl + 2, topic, tlen);
    memcpy(n->chan, CHANNEL_PREFIX, pl);
    memcpy(n->chan + pl, topic, tlen);
    n->hlen = pl + 2 + tlen;
    n->clen = pl + tlen;
}

/* A numbered publish's reply: the seq, or an error (counted as dropped;
 * NOSCRIPT: someone flushed the scripts, so load it again). */
static void on_numbered(redisAsyncContext *ac, void *reply, void *priv) {
    tern__redis *r = priv;
    redisReply *m = reply;
    if (m == NULL || r->freeing || m->type != REDIS_REPLY_ERROR)
        return;
    bump(&r->dropped);
    if (strncmp(m->str, "NOSCRIPT", 8) == 0 && r->sha[0]) {
        r->sha[0] = '\0';
        redisAsyncCommand(ac, on_script, r, "SCRIPT LOAD %s", NUMBER_SCRIPT);
        return;   /* not a failure: the next publish finds it loaded */
    }
    reply_error(r, ac, "a numbered publish (EVAL)", m);
}

static void redis_publish_numbered(void *state, const char *topic, size_t tlen,
                                   const char *key, size_t klen, const void *data, size_t len,
                                   int opcode, size_t seq_at, uint32_t keep, uint32_t keep_ms) {
    tern__redis *r = state;
    char *env;
    size_t n;
    if (!r->pub.up || (n = envelope(r, key, klen, data, len, opcode, seq_at, &env)) == 0) {
        bump(&r->dropped);
        return;
    }
    uint64_t e = 0;
    while (e == 0 && tern__plat_random(&e, sizeof(e), true) == 0) {
    }
    if (e == 0)
        e = ((uint64_t)rand_r(&r->seed) << 32 | (uint64_t)rand_r(&r->seed)) | 1;
    char epoch[17], count[12], ms[12];
    snprintf(epoch, sizeof(epoch), "%016llx", (unsigned long long)e);
    snprintf(count, sizeof(count), "%u", keep ? keep : 1u);
    snprintf(ms, sizeof(ms), "%u", keep_ms);
    names nm;
    topic_names(&nm, topic, tlen);
    bool sha = r->sha[0] != '\0';
    const char *argv[] = {sha ? "EVALSHA" : "EVAL", sha ? r->sha : NUMBER_SCRIPT, "3", nm.hash,
                          nm.stream, nm.chan, epoch, count, env, ms};
    size_t argl[] = {sha ? 7 : 4, sha ? 40 : sizeof(NUMBER_SCRIPT) - 1, 1, nm.hlen, nm.hlen,
                     nm.clen, 16, strlen(count), n, strlen(ms)};
    if (redisAsyncCommandArgv(r->pub.ac, on_numbered, r, 10, argv, argl) == REDIS_OK)
        bump(&r->published);
    else
        bump(&r->dropped);
    free(env);
}

/* A fill's reply: XRANGE's [[id, ["m", message]], ...]. */
typedef struct fill_req {
    tern__redis *r;
    size_t clen;
    char chan[];
} fill_req;

static void on_fill(redisAsyncContext *ac, void *reply, void *priv) {
    fill_req *f = priv;
    redisReply *m = reply;
    reply_error(f->r, ac, "a fill (XRANGE)", m);
    if (m && !f->r->freeing && m->type == REDIS_REPLY_ARRAY)
        for (size_t i = 0; i < m->elements; i++) {
            const redisReply *e = m->element[i];
            if (e->type != REDIS_REPLY_ARRAY || e->elements != 2 ||
                e->element[1]->type != REDIS_REPLY_ARRAY || e->element[1]->elements != 2 ||
                e->element[1]->element[1]->type != REDIS_REPLY_STRING)
                continue;
            const redisReply *body = e->element[1]->element[1];
            dispatch(f->r, f->chan, f->clen, body->str, body->len, true, false);
        }
    free(f);   /* hiredis calls back with NULL when the link goes */
}

/* A request about topic for the publishing link (NULL while it is down or
 * out of memory): its names in *nm, its channel kept for the reply. */
static fill_req *topic_req(tern__redis *r, const char *topic, size_t tlen, names *nm) {
    if (!r->pub.up)
        return NULL;
    topic_names(nm, topic, tlen);
    fill_req *f = malloc(sizeof(*f) + nm->clen);
    if (f == NULL)
        return NULL;
    f->r = r;
    f->clen = nm->clen;
    memcpy(f->chan, nm->chan, nm->clen);
    return f;
}

static void redis_fill(void *state, const char *topic, size_t tlen, uint64_t from,
                       uint64_t to) {
    tern__redis *r = state;
    names nm;
    fill_req *f = topic_req(r, topic, tlen, &nm);
    if (f == NULL)
        return;
    if (redisAsyncCommand(r->pub.ac, on_fill, f, "XRANGE %b 0-%llu 0-%llu", nm.stream, nm.hlen,
                          (unsigned long long)from, (unsigned long long)to) != REDIS_OK)
        free(f);
    else
        bump(&r->fills);
}

/* KEYS: the topic's hash. ARGV: this node's epoch for the topic (16 hex
 * digits), the lifetime in ms of a claim no message has followed yet.
 * The first node to claim a topic's epoch makes it Redis's (the numbering
 * script keeps it); the reply is the epoch that holds, and the last seq
 * (nil: nothing numbered yet). */
static const char CLAIM_SCRIPT[] =
    "redis.call('HSETNX', KEYS[1], 'e', ARGV[1])\n"
    "if redis.call('HEXISTS', KEYS[1], 's') == 0 then\n"
    "  redis.call('PEXPIRE', KEYS[1], ARGV[2])\n"
    "end\n"
    "return redis.call('HMGET', KEYS[1], 'e', 's')\n";

/* CLAIM_SCRIPT's reply: [epoch, seq or nil]. */
static void on_claim(redisAsyncContext *ac, void *reply, void *priv) {
    fill_req *f = priv;
    redisReply *m = reply;
    uint64_t e, seq = 0;
    size_t plen = sizeof(CHANNEL_PREFIX) - 1;
    reply_error(f->r, ac, "an epoch's claim (EVAL)", m);
    if (m && !f->r->freeing && m->type == REDIS_REPLY_ARRAY && m->elements == 2 &&
        m->element[0]->type == REDIS_REPLY_STRING && m->element[0]->len == 16 &&
        parse_u64(m->element[0]->str, 16, 16, &e) &&
        (m->element[1]->type == REDIS_REPLY_NIL ||
         (m->element[1]->type == REDIS_REPLY_STRING &&
          parse_u64(m->element[1]->str, m->element[1]->len, 10, &seq))))
        f->r->hooks.claimed(f->r->user, f->chan + plen, f->clen - plen, e, seq);
    free(f);
}

static void redis_claim(void *state, const char *topic, size_t tlen, uint64_t epoch,
                        uint64_t keep_ms) {
    tern__redis *r = state;
    names nm;
    fill_req *f = topic_req(r, topic, tlen, &nm);
    if (f == NULL)
        return;
    char e[17], ms[24];
    snprintf(e, sizeof(e), "%016llx", (unsigned long long)epoch);
    snprintf(ms, sizeof(ms), "%llu", (unsigned long long)keep_ms);
    if (redisAsyncCommand(r->pub.ac, on_claim, f, "EVAL %s 1 %b %s %s", CLAIM_SCRIPT, nm.hash,
                          nm.hlen, e, ms) != REDIS_OK)
        free(f);
}

/* HMGET's reply: [epoch, seq], both nil when Redis has no count. */
static void on_last(redisAsyncContext *ac, void *reply, void *priv) {
    fill_req *f = priv;
    redisReply *m = reply;
    uint64_t e, seq;
    size_t plen = sizeof(CHANNEL_PREFIX) - 1;
    reply_error(f->r, ac, "a topic's last number (HMGET)", m);
    if (m && !f->r->freeing && m->type == REDIS_REPLY_ARRAY && m->elements == 2 &&
        m->element[0]->type == REDIS_REPLY_STRING && m->element[0]->len == 16 &&
        m->element[1]->type == REDIS_REPLY_STRING &&
        parse_u64(m->element[0]->str, 16, 16, &e) &&
        parse_u64(m->element[1]->str, m->element[1]->len, 10, &seq))
        f->r->hooks.last(f->r->user, f->chan + plen, f->clen - plen, e, seq);
    free(f);
}

static void redis_last(void *state, const char *topic, size_t tlen) {
    tern__redis *r = state;
    names nm;
    fill_req *f = topic_req(r, topic, tlen, &nm);
    if (f == NULL)
        return;
    if (redisAsyncCommand(r->pub.ac, on_last, f, "HMGET %b e s", nm.hash, nm.hlen) != REDIS_OK)
        free(f);
}

static bool redis_connected(const void *state) {
    return atomic_load(&((const tern__redis *)state)->connected);
}

static void redis_stats(const void *state, tern_bridge_counters *out) {
    const tern__redis *r = state;
    out->connected = atomic_load(&r->connected);
    out->reconnects = atomic_load(&r->reconnects);
    out->published = atomic_load(&r->published);
    out->received = atomic_load(&r->received);
    out->dropped = atomic_load(&r->dropped);
    out->fills = atomic_load(&r->fills);
    out->auth_refused = atomic_load(&r->auth_refused);
}

static const tern__engine_ops redis_ops = {
    .name = "redis",
    .free = redis_free,
    .loop = redis_loop,
    .connected = redis_connected,
    .subscribe = redis_subscribe,
    .publish = redis_publish,
    .publish_numbered = redis_publish_numbered,
    .psubscribe = redis_psubscribe,
    .fill = redis_fill,
    .claim = redis_claim,
    .last = redis_last,
    .stats = redis_stats,
};

int tern__redis_engine(tern__engine *out, tern_loop *loop, const char *url,
                       const tern__engine_hooks *hooks, void *user) {
    tern__redis *r;
    int err = redis_new(&r, loop, url, hooks, user);
    if (err < 0)
        return err;
    *out = (tern__engine){.ops = &redis_ops, .state = r};
    return 0;
}
