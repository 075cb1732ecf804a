/* The NATS engine (engine.h, filled by tern__nats_engine at the end):
 * libnats's threads, and everything handed to the loop through posts.
 *
 * Why threads and not libnats's event-loop adapter
 * (natsOptions_SetEventLoop): that adapter moves only the socket's reads
 * and writes onto the loop. libnats still connects (a blocking
 * getaddrinfo, connect and handshake) on the caller's thread, reconnects
 * on a thread of its own, and runs message handlers on its delivery
 * thread; and it calls the adapter's attach and detach from those threads
 * around a descriptor it closes on its own schedule, so a loop watcher
 * would race the number's reuse. So libnats keeps its threads (reader,
 * flusher, reconnect, one message-delivery thread for the process), and
 * this file's rule is that nothing libnats calls touches pub/sub or the
 * engine's loop-side state: each callback copies what it was told into a
 * job and posts it to the loop (tern__loop_post_owned), where it is acted
 * upon. The first connect (and each after libnats gives a connection up,
 * a refused login say) runs on a short-lived thread of this file's,
 * joined before the next starts and when the bridge is freed: a thread
 * still inside OpenSSL when the process exits would crash in its
 * clean-up, so the bridge's end waits for a connect under way (at most
 * CONNECT_TIMEOUT_MS for each server).
 *
 * The engine's state is reference counted, as libnats's threads may call
 * back after the bridge has freed it: one reference for the bridge, one
 * per connect thread running, per live connection (given back by its
 * closed handler, libnats's last call about it), per subscription (given
 * back by its completion handler: no message handler runs after it) and
 * per job posted. `gone` (under mu) says the bridge has freed it: a
 * callback then posts nothing.
 *
 * Ordering: one connection carries this node's publishes, in order; the
 * server echoes none of them back (no-echo), so no node id is needed; and
 * libnats delivers every subscription's messages on its one delivery
 * thread (the process-wide pool, whose default size is one), in the order
 * they arrived, which the posts keep.
 *
 * A publish is a call on the loop's thread: libnats appends it to its
 * write buffer (256 KiB here) for its flusher thread. Only when that
 * buffer is full does libnats write in place, waiting for the socket at
 * most the write deadline (WRITE_DEADLINE_MS), after which it drops the
 * link and reconnects: a broker that stops reading stalls the loop that
 * long, once.
 *
 * The message on the wire, binary-safe: the magic "tn1", the opcode (one
 * byte), seq_at (8 bytes, little-endian; all ones for none), the key's
 * length (one byte; 0 for none) and the key, then the payload. */
#include "pubsub/nats.h"

#include <errno.h>
#include <nats/nats.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loop/counter.h"
#include "loop/log.h"
#include "loop/loop.h"
#include "pubsub/nats_url.h"
#include "pubsub/pubsub.h"

#define SUBJECT_PREFIX "tern."
#define MAGIC "tn1"
#define MAGIC_LEN 3
#define HEAD_LEN (MAGIC_LEN + 1 + 8 + 1)   /* up to the key */
#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000
#define CONNECT_TIMEOUT_MS 2000
#define RECONNECT_WAIT_MS 100
#define WRITE_DEADLINE_MS 2000
#define IO_BUF_SIZE (256 * 1024)
/* A subject: the prefix and the topic, each byte escaped to at most 3 */
#define SUBJECT_MAX (sizeof(SUBJECT_PREFIX) + 3 * TERN_TOPIC_MAX)

typedef struct tern__nats tern__nats;

/* A topic this node follows: its subscription on the present connection. */
typedef struct nsub {
    tern__ps_node n;
    natsSubscription *s;
    size_t tlen;
    char topic[];
} nsub;

/* Invariants: on the loop's side (fields below `loop-side`, touched only
 * on its thread): nc is the connection libnats keeps up (reconnecting by
 * itself), or NULL while a connect thread runs (connecting) or the retry
 * is armed (retry_armed); subs holds one subscription on nc per topic
 * followed, and is empty while nc is NULL; why is the failure last
 * logged, empty once connected again. refs counts the holders named in
 * the file's comment; the struct is freed by the one that drops the last.
 * The counters are written on the loop's thread and read by any. */
struct tern__nats {
    tern_loop *loop;
    tern__engine_hooks hooks;
    void *user;
    tern__nats_url url;   /* read by the connect threads too; never written after start */
    pthread_mutex_t mu;
    bool gone;            /* under mu */
    _Atomic unsigned refs;
    /* loop-side */
    natsConnection *nc;
    tern__ps_table subs;
    pthread_t thread;   /* the last connect thread, while joinable */
    bool joinable, connecting, retry_armed, ever_up;
    tern_timer *retry;
    uint32_t backoff_ms;
    unsigned seed;
    char why[256];
    _Atomic bool connected, auth_refused;
    _Atomic uint64_t reconnects, published, received, dropped;
};

static void bump(_Atomic uint64_t *c) { TERN__COUNTER_ADD(*c, 1); }

static void hold(tern__nats *n) { atomic_fetch_add(&n->refs, 1); }

static void release(tern__nats *n) {
    if (atomic_fetch_sub(&n->refs, 1) != 1)
        return;
    pthread_mutex_destroy(&n->mu);
    explicit_bzero(&n->url, sizeof(n->url));
    free(n);
}

/* ---- jobs: what libnats's threads hand to the loop ----------------------- */

enum job_kind { J_CONNECTED, J_FAILED, J_DISCONNECTED, J_RECONNECTED, J_CLOSED, J_ERROR, J_MSG };

/* A job. Invariants: nc is the connection it is about (J_CONNECTED: a new
 * one, which the job owns until the loop takes it); why is a NUL-ended
 * reason (libnats's words, no secret); for J_MSG, body holds topic, key
 * and payload, in this order. */
typedef struct job {
    tern__nats *n;
    enum job_kind kind;
    natsConnection *nc;
    bool auth;   /* J_FAILED, J_CLOSED: the server refused the credentials */
    char why[200];
    int opcode;
    uint64_t seq_at;
    size_t tlen, klen, len;
    char body[];
} job;

static void run_job(tern_loop *loop, void *user);

/* The job's connection, when it is a new one nobody took. */
static void job_free(job *j) {
    if (j->kind == J_CONNECTED && j->nc)
        natsConnection_Destroy(j->nc);
    tern__nats *n = j->n;
    free(j);
    release(n);
}

static void drop_job(void *user) { job_free(user); }

/* From any thread: hands j to the loop, unless the engine is gone (then
 * j is freed, and a new connection in it destroyed). */
static void post(tern__nats *n, job *j) {
    j->n = n;
    hold(n);
    pthread_mutex_lock(&n->mu);
    bool ok = !n->gone && tern__loop_post_owned(n->loop, run_job, drop_job, j) == 0;
    pthread_mutex_unlock(&n->mu);
    if (!ok)
        job_free(j);
}

static job *job_new(enum job_kind kind, natsConnection *nc, size_t extra) {
    job *j = calloc(1, sizeof(*j) + extra);
    if (j) {
        j->kind = kind;
        j->nc = nc;
    }
    return j;
}

/* libnats's last error on this thread, or its words for s; without the
 * "(conn.c:733): " libnats puts before it, which names its own source. */
static void last_error(natsStatus s, char *out, size_t cap) {
    natsStatus ls;
    const char *t = nats_GetLastError(&ls);
    const char *end = t && t[0] == '(' ? strstr(t, "): ") : NULL;
    if (end)
        t = end + 3;
    snprintf(out, cap, "%s", t && t[0] ? t : natsStatus_GetText(s));
}

static bool is_auth(natsStatus s, const char *why) {
    return s == NATS_CONNECTION_AUTH_FAILED || strstr(why, "uthorization") != NULL ||
           strstr(why, "uthentication") != NULL;
}

/* ---- libnats's callbacks (its threads) ----------------------------------- */

static void conn_event(tern__nats *n, natsConnection *nc, enum job_kind kind) {
    job *j = job_new(kind, nc, 0);
    if (j == NULL)
        return;
    const char *t = NULL;
    natsStatus s = natsConnection_GetLastError(nc, &t);
    /* libnats keeps no words for a connection that broke (EOF, a reset) */
    snprintf(j->why, sizeof(j->why), "%s",
             t && t[0] ? t : s != NATS_OK ? natsStatus_GetText(s) : "the connection broke");
    j->auth = is_auth(s, j->why);
    post(n, j);
}

static void on_disconnected(natsConnection *nc, void *closure) {
    conn_event(closure, nc, J_DISCONNECTED);
}

static void on_reconnected(natsConnection *nc, void *closure) {
    conn_event(closure, nc, J_RECONNECTED);
}

/* libnats's last call about nc: its reference goes. */
static void on_closed(natsConnection *nc, void *closure) {
    tern__nats *n = closure;
    conn_event(n, nc, J_CLOSED);
    release(n);
}

static void on_error(natsConnection *nc, natsSubscription *sub, natsStatus err, void *closure) {
    (void)sub;
    tern__nats *n = closure;
    job *j = job_new(J_ERROR, nc, 0);
    if (j == NULL)
        return;
    const char *t = NULL;
    natsConnection_GetLastError(nc, &t);
    snprintf(j->why, sizeof(j->why), "%s", t && t[0] ? t : natsStatus_GetText(err));
    post(n, j);
}

/* A subject's topic: SUBJECT_PREFIX dropped, %XX escapes decoded. */
static size_t subject_topic(const char *subj, char *out) {
    size_t pl = sizeof(SUBJECT_PREFIX) - 1, n = 0;
    if (strncmp(subj, SUBJECT_PREFIX, pl) != 0)
        return 0;
    for (const char *p = subj + pl; *p; p++) {
        unsigned v;
        if (*p == '%' && sscanf(p + 1, "%2x", &v) == 1 && p[1] && p[2]) {
            p += 2;
        } else {
            v = (unsigned char)*p;
        }
        if (n == TERN_TOPIC_MAX)
            return 0;
        out[n++] = (char)v;
    }
    return n;
}

/* A message (libnats's delivery thread): unpacked and posted. */
static void on_msg(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure) {
    (void)nc;
    (void)sub;
    tern__nats *n = closure;
    char topic[TERN_TOPIC_MAX];
    size_t tlen = subject_topic(natsMsg_GetSubject(msg), topic);
    const uint8_t *h = (const uint8_t *)natsMsg_GetData(msg);
    size_t blen = (size_t)natsMsg_GetDataLength(msg);
    if (tlen == 0 || h == NULL || blen < HEAD_LEN || memcmp(h, MAGIC, MAGIC_LEN) != 0 ||
        h[HEAD_LEN - 1] > TERN_KEY_MAX || blen < HEAD_LEN + (size_t)h[HEAD_LEN - 1]) {
        natsMsg_Destroy(msg);
        return;
    }
    size_t klen = h[HEAD_LEN - 1], len = blen - HEAD_LEN - klen;
    uint64_t at = 0;
    for (int i = 7; i >= 0; i--)
        at = at << 8 | h[MAGIC_LEN + 1 + i];
    int opcode = h[MAGIC_LEN];
    job *j = NULL;
    if ((opcode == TERN_WS_TEXT || opcode == TERN_WS_BINARY) && (at == UINT64_MAX || at <= len))
        j = job_new(J_MSG, NULL, tlen + klen + len);
    if (j) {
        j->opcode = opcode;
        j->seq_at = at;
        j->tlen = tlen;
        j->klen = klen;
        j->len = len;
        memcpy(j->body, topic, tlen);
        memcpy(j->body + tlen, h + HEAD_LEN, klen + len);
    }
    natsMsg_Destroy(msg);
    if (j)
        post(n, j);
}

/* A subscription's end: no message handler runs for it after this. */
static void on_sub_done(void *closure) { release(closure); }

/* ---- connecting (a thread of this file's) -------------------------------- */

/* The first line of path into out (cap bytes), for a token or password. */
static bool read_secret(const char *path, char *out, size_t cap, char *why, size_t wcap) {
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        snprintf(why, wcap, "cannot read %s: %s", path, strerror(errno));
        return false;
    }
    bool got = fgets(out, (int)cap, f) != NULL;
    fclose(f);
    out[got ? strcspn(out, "\r\n") : 0] = '\0';
    if (out[0] == '\0')
        snprintf(why, wcap, "%s is empty", path);
    return out[0] != '\0';
}

static natsStatus make_options(tern__nats *n, natsOptions **out, char *why, size_t wcap) {
    const tern__nats_url *u = &n->url;
    natsOptions *o;
    natsStatus s = natsOptions_Create(&o);
    if (s != NATS_OK)
        return s;
    const char *servers[TERN__NATS_SERVERS_MAX];
    for (int i = 0; i < u->nservers; i++)
        servers[i] = u->servers[i];
    char name[64], secret[512];
    snprintf(name, sizeof(name), "tern-%ld", (long)getpid());
    s = natsOptions_SetServers(o, servers, u->nservers);
    if (s == NATS_OK)
        s = natsOptions_SetName(o, name);
    if (s == NATS_OK)   /* our own publishes are delivered here by publish.c */
        s = natsOptions_SetNoEcho(o, true);
    if (s == NATS_OK)
        s = natsOptions_SetTimeout(o, CONNECT_TIMEOUT_MS);
    if (s == NATS_OK)
        s = natsOptions_SetMaxReconnect(o, -1);   /* libnats keeps trying; never gives up */
    if (s == NATS_OK)
        s = natsOptions_SetReconnectWait(o, RECONNECT_WAIT_MS);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectJitter(o, RECONNECT_WAIT_MS, RECONNECT_WAIT_MS);
    if (s == NATS_OK)
        s = natsOptions_SetWriteDeadline(o, WRITE_DEADLINE_MS);
    if (s == NATS_OK)
        s = natsOptions_SetIOBufSize(o, IO_BUF_SIZE);
    if (s == NATS_OK)
        s = natsOptions_UseGlobalMessageDelivery(o, true);
    if (s == NATS_OK)
        s = natsOptions_SetDisconnectedCB(o, on_disconnected, n);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectedCB(o, on_reconnected, n);
    if (s == NATS_OK)
        s = natsOptions_SetClosedCB(o, on_closed, n);
    if (s == NATS_OK)
        s = natsOptions_SetErrorHandler(o, on_error, n);
    if (s == NATS_OK && u->user[0] && u->pass[0])
        s = natsOptions_SetUserInfo(o, u->user, u->pass);
    if (s == NATS_OK && u->password_file[0]) {
        s = read_secret(u->password_file, secret, sizeof(secret), why, wcap)
                ? natsOptions_SetUserInfo(o, u->user, secret) : NATS_ERR;
    }
    if (s == NATS_OK && u->token[0])
        s = natsOptions_SetToken(o, u->token);
    if (s == NATS_OK && u->token_file[0])
        s = read_secret(u->token_file, secret, sizeof(secret), why, wcap)
                ? natsOptions_SetToken(o, secret) : NATS_ERR;
    if (s == NATS_OK && u->creds[0])
        s = natsOptions_SetUserCredentialsFromFiles(o, u->creds, NULL);
    /* TLS: the certificate checked against the CAs and the URL's host
     * name (libnats's default once secure) */
    if (s == NATS_OK && u->tls)
        s = natsOptions_SetSecure(o, true);
    if (s == NATS_OK && u->ca[0])
        s = natsOptions_LoadCATrustedCertificates(o, u->ca);
    if (s == NATS_OK && u->cert[0])
        s = natsOptions_LoadCertificatesChain(o, u->cert, u->key);
    explicit_bzero(secret, sizeof(secret));
    if (s != NATS_OK) {
        natsOptions_Destroy(o);
        return s;
    }
    *out = o;
    return NATS_OK;
}

/* One connect, blocking this thread only; its outcome is posted. */
static void *connect_main(void *arg) {
    tern__nats *n = arg;
    job *j = job_new(J_FAILED, NULL, 0);
    natsOptions *o = NULL;
    natsConnection *nc = NULL;
    char why[sizeof(j->why)] = "";
    /* The connection's reference, taken before libnats may call on_closed */
    hold(n);
    natsStatus s = make_options(n, &o, why, sizeof(why));
    if (s == NATS_OK)
        s = natsConnection_Connect(&nc, o);
    natsOptions_Destroy(o);
    if (s != NATS_OK && why[0] == '\0')
        last_error(s, why, sizeof(why));
    if (s != NATS_OK)
        release(n);   /* no connection: no on_closed */
    if (j == NULL) {
        if (nc)
            natsConnection_Destroy(nc);
    } else {
        j->kind = s == NATS_OK ? J_CONNECTED : J_FAILED;
        j->nc = nc;
        j->auth = s != NATS_OK && is_auth(s, why);
        memcpy(j->why, why, sizeof(why));
        post(n, j);
    }
    release(n);   /* the thread's */
    nats_ReleaseThreadMemory();
    return NULL;
}

/* ---- the loop's side ------------------------------------------------------ */

/* Says why the bridge is not linked, unless that was the last thing said:
 * a NATS that stays away is said once, not at every retry. */
static void say(tern__nats *n, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(tern__nats *n, int level, const char *fmt, ...) {
    char why[sizeof(n->why)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    if (strcmp(why, n->why) == 0)
        return;
    memcpy(n->why, why, sizeof(why));
    tern__log(level, TERN__LOG_RUN, "nats %s %s", n->url.hosts, why);
}

static void start_connect(tern__nats *n);

static void on_retry(tern_timer *t, void *user) {
    (void)t;
    tern__nats *n = user;
    n->retry_armed = false;
    start_connect(n);
}

/* No connection: a new connect after the backoff (jittered +-25 %, so
 * that many nodes do not come back in step). */
static void retry_later(tern__nats *n) {
    atomic_store(&n->connected, false);
    if (n->retry_armed)
        return;
    uint32_t b = n->backoff_ms;
    uint32_t wait = b - b / 4 + (uint32_t)rand_r(&n->seed) % (b / 2 + 1);
    n->backoff_ms = b * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : b * 2;
    tern__log(TERN_LOG_DEBUG, TERN__LOG_RUN, "nats %s next try in %u ms", n->url.hosts, wait);
    if (n->retry ? tern_timer_again(n->retry, wait)
                 : tern_timer_start(n->loop, &n->retry, wait, 0, on_retry, n))
        return;   /* out of memory: the bridge stays down */
    n->retry_armed = true;
}

/* The last connect thread gone (it has posted its outcome, or is about
 * to: this waits for its connect when the bridge is freed). */
static void join_connect(tern__nats *n) {
    if (n->joinable)
        pthread_join(n->thread, NULL);
    n->joinable = false;
}

static void start_connect(tern__nats *n) {
    if (n->connecting || n->nc)
        return;
    join_connect(n);
    hold(n);
    int err = pthread_create(&n->thread, NULL, connect_main, n);
    if (err != 0) {
        release(n);
        say(n, TERN_LOG_WARN, "cannot start a connect thread: %s; retrying", strerror(err));
        retry_later(n);
        return;
    }
    n->joinable = n->connecting = true;
}

/* Every subscription of the present connection dropped (it is going). */
static void drop_subs(tern__nats *n) {
    for (size_t i = 0; i < n->subs.nb; i++)
        for (tern__ps_node *p = n->subs.b[i], *next; p; p = next) {
            next = p->next;
            nsub *e = (nsub *)p;
            natsSubscription_Unsubscribe(e->s);
            natsSubscription_Destroy(e->s);
            free(e);
        }
    free(n->subs.b);
    n->subs = (tern__ps_table){0};
}

static void set_connected(tern__nats *n) {
    atomic_store(&n->connected, true);
    atomic_store(&n->auth_refused, false);
    n->backoff_ms = BACKOFF_MIN_MS;
    if (n->ever_up)
        bump(&n->reconnects);
    char url[TERN_URL_HOST_MAX + 16] = "";
    natsConnection_GetConnectedUrl(n->nc, url, sizeof(url));
    tern__log(n->why[0] ? TERN_LOG_WARN : TERN_LOG_INFO, TERN__LOG_RUN, "nats %s connected%s to %s",
              n->url.hosts, n->ever_up ? " again" : "", url);
    n->why[0] = '\0';
    n->ever_up = true;
    n->hooks.resubscribe(n->user);
}

static const char *credentials(const tern__nats *n) {
    return n->url.creds[0] ? "the credentials file"
           : n->url.user[0] ? "the user and password"
           : n->url.token[0] || n->url.token_file[0] ? "the token" : "a client without credentials";
}

static void run_job(tern_loop *loop, void *user) {
    (void)loop;
    job *j = user;
    tern__nats *n = j->n;
    if (n->gone) {
        job_free(j);
        return;
    }
    switch (j->kind) {
    case J_CONNECTED:
        n->connecting = false;
        n->nc = j->nc;
        j->nc = NULL;
        set_connected(n);
        break;
    case J_FAILED:
        n->connecting = false;
        atomic_store(&n->auth_refused, j->auth);
        if (j->auth)
            say(n, TERN_LOG_ERROR, "refused %s: %s; local delivery goes on, retrying",
                credentials(n), j->why);
        else
            say(n, TERN_LOG_WARN, "unreachable: %s; local delivery goes on, retrying", j->why);
        retry_later(n);
        break;
    case J_DISCONNECTED:
        if (j->nc == n->nc) {
            atomic_store(&n->connected, false);
            say(n, TERN_LOG_WARN, "lost: %s; local delivery goes on, reconnecting", j->why);
        }
        break;
    case J_RECONNECTED:
        if (j->nc == n->nc)
            set_connected(n);
        break;
    case J_CLOSED:
        /* libnats gave the connection up (it stops after a login refused
         * twice): a new one from scratch after the backoff */
        if (j->nc == n->nc) {
            drop_subs(n);
            natsConnection_Destroy(n->nc);
            n->nc = NULL;
            atomic_store(&n->auth_refused, j->auth);
            say(n, j->auth ? TERN_LOG_ERROR : TERN_LOG_WARN,
                "closed: %s%s; local delivery goes on, retrying", j->auth ? "refused " : "",
                j->auth ? credentials(n) : j->why);
            retry_later(n);
        }
        break;
    case J_ERROR:
        if (j->nc == n->nc)
            say(n, TERN_LOG_WARN, "error: %s", j->why);
        break;
    case J_MSG:
        bump(&n->received);
        n->hooks.message(n->user, j->body, j->tlen, j->body + j->tlen, j->klen,
                         j->body + j->tlen + j->klen, j->len, j->opcode,
                         j->seq_at == UINT64_MAX ? SIZE_MAX : (size_t)j->seq_at, NULL);
        break;
    }
    job_free(j);
}

/* ---- the engine's operations (the loop's thread) ------------------------- */

/* topic's subject: the prefix, then the topic with '.', '*', '>', '%' and
 * the bytes NATS would split on or refuse escaped as %XX, so that a topic
 * is one token and never a wildcard. */
static void topic_subject(const char *topic, size_t tlen, char *out) {
    static const char hex[] = "0123456789ABCDEF";
    size_t n = sizeof(SUBJECT_PREFIX) - 1;
    memcpy(out, SUBJECT_PREFIX, n);
    for (size_t i = 0; i < tlen; i++) {
        unsigned char c = (unsigned char)topic[i];
        if (c <= ' ' || c >= 0x7f || strchr(".*>%", c)) {
            out[n++] = '%';
            out[n++] = hex[c >> 4];
            out[n++] = hex[c & 15];
        } else {
            out[n++] = (char)c;
        }
    }
    out[n] = '\0';
}

static nsub *find_sub(tern__nats *n, const char *topic, size_t tlen, uint64_t h) {
    if (n->subs.nb == 0)
        return NULL;
    for (tern__ps_node *p = *tern__ps_bucket(&n->subs, h); p; p = p->next) {
        nsub *e = (nsub *)p;
        if (p->hash == h && e->tlen == tlen && memcmp(e->topic, topic, tlen) == 0)
            return e;
    }
    return NULL;
}

static void nats_subscribe(void *state, const char *topic, size_t tlen, bool on) {
    tern__nats *n = state;
    uint64_t h = tern__ps_hash_name(topic, tlen);
    nsub *e = find_sub(n, topic, tlen, h);
    if (!on) {
        if (e) {
            tern__ps_table_del(&n->subs, &e->n);
            natsSubscription_Unsubscribe(e->s);
            natsSubscription_Destroy(e->s);
            free(e);
        }
        return;
    }
    if (e || n->nc == NULL || tern__ps_table_grow(&n->subs) < 0)
        return;   /* followed; or the next connection's resubscribe covers it */
    e = malloc(sizeof(*e) + tlen);
    if (e == NULL)
        return;
    char subj[SUBJECT_MAX];
    topic_subject(topic, tlen, subj);
    hold(n);   /* the subscription's, given back by on_sub_done */
    natsStatus s = natsConnection_Subscribe(&e->s, n->nc, subj, on_msg, n);
    if (s != NATS_OK) {
        release(n);
        say(n, TERN_LOG_WARN, "cannot subscribe to %s: %s", subj, natsStatus_GetText(s));
        free(e);
        return;
    }
    /* Refused only when the subscription is closed already (its
     * connection went): then no completion will come to give it back. */
    if (natsSubscription_SetOnCompleteCB(e->s, on_sub_done, n) != NATS_OK)
        release(n);
    e->n.hash = h;
    e->tlen = tlen;
    memcpy(e->topic, topic, tlen);
    tern__ps_table_add(&n->subs, &e->n);
}

static void nats_publish(void *state, const char *topic, size_t tlen, const char *key,
                         size_t klen, const void *data, size_t len, int opcode, size_t seq_at) {
    tern__nats *n = state;
    /* libnats would keep it for after a reconnect: nothing is queued */
    uint8_t *m = NULL;
    if (!atomic_load(&n->connected) || natsConnection_Status(n->nc) != NATS_CONN_STATUS_CONNECTED ||
        HEAD_LEN + klen + len > INT32_MAX || (m = malloc(HEAD_LEN + klen + len)) == NULL) {
        bump(&n->dropped);
        return;
    }
    memcpy(m, MAGIC, MAGIC_LEN);
    m[MAGIC_LEN] = (uint8_t)opcode;
    uint64_t at = seq_at == SIZE_MAX ? UINT64_MAX : (uint64_t)seq_at;
    for (int i = 0; i < 8; i++)
        m[MAGIC_LEN + 1 + i] = (uint8_t)(at >> (8 * i));
    m[HEAD_LEN - 1] = (uint8_t)klen;   /* at most TERN_KEY_MAX (128) */
    if (klen)
        memcpy(m + HEAD_LEN, key, klen);
    if (len)
        memcpy(m + HEAD_LEN + klen, data, len);
    char subj[SUBJECT_MAX];
    topic_subject(topic, tlen, subj);
    if (natsConnection_Publish(n->nc, subj, m, (int)(HEAD_LEN + klen + len)) == NATS_OK)
        bump(&n->published);
    else
        bump(&n->dropped);
    free(m);
}

static bool nats_connected(const void *state) {
    return atomic_load(&((const tern__nats *)state)->connected);
}

static tern_loop *nats_loop(const void *state) { return ((const tern__nats *)state)->loop; }

static void nats_stats(const void *state, tern_bridge_counters *out) {
    const tern__nats *n = state;
    out->connected = atomic_load(&n->connected);
    out->reconnects = atomic_load(&n->reconnects);
    out->published = atomic_load(&n->published);
    out->received = atomic_load(&n->received);
    out->dropped = atomic_load(&n->dropped);
    out->fills = 0;
    out->auth_refused = atomic_load(&n->auth_refused);
}

/* The bridge's end: libnats's threads post nothing more; a connect thread
 * still running is waited for (it finds the engine gone and destroys what
 * it made); the connection goes (its closed handler, and the
 * subscriptions' completions, give their references back from libnats's
 * threads). */
static void nats_free(void *state) {
    tern__nats *n = state;
    if (n == NULL)
        return;
    pthread_mutex_lock(&n->mu);
    n->gone = true;
    pthread_mutex_unlock(&n->mu);
    if (n->retry)
        tern_timer_stop(n->retry);
    join_connect(n);
    drop_subs(n);
    if (n->nc)
        natsConnection_Destroy(n->nc);
    n->nc = NULL;
    atomic_store(&n->connected, false);
    release(n);
}

static const tern__engine_ops nats_ops = {
    .name = "nats",
    .free = nats_free,
    .loop = nats_loop,
    .connected = nats_connected,
    .subscribe = nats_subscribe,
    .publish = nats_publish,
    .stats = nats_stats,
};

int tern__nats_engine(tern__engine *out, tern_loop *loop, const char *url,
                      const tern__engine_hooks *hooks, void *user) {
    tern__nats *n = calloc(1, sizeof(*n));
    if (n == NULL)
        return -ENOMEM;
    const char *why;
    if (tern__nats_url_parse(url, &n->url, &why) < 0) {
        tern__log(TERN_LOG_ERROR, TERN__LOG_RUN, "nats bridge: a bad URL: %s", why);
        explicit_bzero(n, sizeof(*n));
        free(n);
        return -EINVAL;
    }
    pthread_mutex_init(&n->mu, NULL);
    atomic_init(&n->refs, 1);
    n->loop = loop;
    n->hooks = *hooks;
    n->user = user;
    n->backoff_ms = BACKOFF_MIN_MS;
    n->seed = (unsigned)getpid() ^ (unsigned)(uintptr_t)n;
    /* The first try from the loop, as every later one: what it says is
     * logged from there, not from inside the caller's call. */
    int err = tern_timer_start(loop, &n->retry, 0, 0, on_retry, n);
    if (err < 0) {
        release(n);
        return err;
    }
    n->retry_armed = true;
    *out = (tern__engine){.ops = &nats_ops, .state = n};
    return 0;
}
