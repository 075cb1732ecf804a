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
 * back by its completion handler: no message handler runs after it), one
 * for the worker thread (nats_stream.c; joined when the bridge is freed)
 * and one per job posted. `gone` (under mu) says the bridge has freed it:
 * a callback then posts nothing.
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
 * length (one byte; 0 for none) and the key, then the payload.
 *
 * Topics with a history are numbered by JetStream (nats_stream.c, whose
 * comment says how): each is one stream, whose sequence is the seq and
 * whose description holds the epoch; JetStream's calls run on a worker
 * thread, and a numbered message comes back to the loop as a job with
 * its number, here and, announced on core NATS, on every other node.
 *
 * A server without JetStream (asked after each connect) numbers nothing:
 * a topic with a history is then numbered by each node, as before the
 * numbering, its publishes announced with epoch and seq 0 (unnumbered)
 * and delivered here at once; a subscriber resumes only on its node. */
#include "pubsub/nats.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loop/counter.h"
#include "loop/log.h"
#include "loop/loop.h"
#include "platform/platform.h"
#include "pubsub/nats_internal.h"

static void bump(_Atomic uint64_t *c) { TERN__COUNTER_ADD(*c, 1); }

void tern__nats_hold(tern__nats *n) { atomic_fetch_add(&n->refs, 1); }

void tern__nats_release(tern__nats *n) {
    if (atomic_fetch_sub(&n->refs, 1) != 1)
        return;
    pthread_mutex_destroy(&n->mu);
    pthread_mutex_destroy(&n->wmu);
    pthread_cond_destroy(&n->wcv);
    explicit_bzero(&n->url, sizeof(n->url));
    free(n);
}

/* ---- jobs: what libnats's threads hand to the loop ----------------------- */

static void run_job(tern_loop *loop, void *user);

/* The job's connection, when it is a new one nobody took. */
static void job_free(nats_job *j) {
    if (j->kind == J_CONNECTED && j->nc)
        natsConnection_Destroy(j->nc);
    tern__nats *n = j->n;
    free(j);
    tern__nats_release(n);
}

static void drop_job(void *user) { job_free(user); }

/* From any thread: hands j to the loop, unless the engine is gone (then
 * j is freed, and a new connection in it destroyed). */
void tern__nats_post(tern__nats *n, nats_job *j) {
    j->n = n;
    tern__nats_hold(n);
    pthread_mutex_lock(&n->mu);
    bool ok = !n->gone && tern__loop_post_owned(n->loop, run_job, drop_job, j) == 0;
    pthread_mutex_unlock(&n->mu);
    if (!ok)
        job_free(j);
}

nats_job *tern__nats_job_new(enum job_kind kind, natsConnection *nc, size_t extra) {
    nats_job *j = calloc(1, sizeof(*j) + extra);
    if (j) {
        j->kind = kind;
        j->nc = nc;
    }
    return j;
}

/* libnats's last error on this thread, or its words for s; without the
 * "(conn.c:733): " libnats puts before it, which names its own source. */
void tern__nats_last_error(natsStatus s, char *out, size_t cap) {
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
    nats_job *j = tern__nats_job_new(kind, nc, 0);
    if (j == NULL)
        return;
    const char *t = NULL;
    natsStatus s = natsConnection_GetLastError(nc, &t);
    /* libnats keeps no words for a connection that broke (EOF, a reset) */
    snprintf(j->why, sizeof(j->why), "%s",
             t && t[0] ? t : s != NATS_OK ? natsStatus_GetText(s) : "the connection broke");
    j->auth = is_auth(s, j->why);
    tern__nats_post(n, j);
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
    tern__nats_release(n);
}

static void on_error(natsConnection *nc, natsSubscription *sub, natsStatus err, void *closure) {
    (void)sub;
    tern__nats *n = closure;
    nats_job *j = tern__nats_job_new(J_ERROR, nc, 0);
    if (j == NULL)
        return;
    const char *t = NULL;
    natsConnection_GetLastError(nc, &t);
    snprintf(j->why, sizeof(j->why), "%s", t && t[0] ? t : natsStatus_GetText(err));
    tern__nats_post(n, j);
}

/* A subject's topic: its prefix (SUBJECT_PREFIX or ANN_PREFIX) dropped,
 * %XX escapes decoded. */
static size_t subject_topic(const char *subj, const char *prefix, char *out) {
    size_t pl = strlen(prefix), n = 0;
    if (strncmp(subj, prefix, pl) != 0)
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

static uint64_t get_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

void tern__nats_put_le64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* A J_MSG job for topic from an envelope without its magic (h, blen
 * bytes: opcode, seq_at, key, payload); NULL when it is not one of ours
 * or out of memory. */
nats_job *tern__nats_unpack(const char *topic, size_t tlen, const uint8_t *h, size_t blen) {
    const size_t head = HEAD_LEN - MAGIC_LEN;
    if (tlen == 0 || h == NULL || blen < head || h[head - 1] > TERN_KEY_MAX ||
        blen < head + (size_t)h[head - 1])
        return NULL;
    size_t klen = h[head - 1], len = blen - head - klen;
    uint64_t at = get_le64(h + 1);
    int opcode = h[0];
    if ((opcode != TERN_WS_TEXT && opcode != TERN_WS_BINARY) || (at != UINT64_MAX && at > len))
        return NULL;
    nats_job *j = tern__nats_job_new(J_MSG, NULL, tlen + klen + len);
    if (j) {
        j->opcode = opcode;
        j->seq_at = at;
        j->tlen = tlen;
        j->klen = klen;
        j->len = len;
        memcpy(j->body, topic, tlen);
        memcpy(j->body + tlen, h + head, klen + len);
    }
    return j;
}

/* A message (libnats's delivery thread): a topic's (SUBJECT_PREFIX), or
 * a numbered one's announcement (ANN_PREFIX); unpacked and posted. */
static void on_msg(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure) {
    (void)nc;
    (void)sub;
    tern__nats *n = closure;
    char topic[TERN_TOPIC_MAX];
    const char *subj = natsMsg_GetSubject(msg);
    const uint8_t *h = (const uint8_t *)natsMsg_GetData(msg);
    size_t blen = (size_t)natsMsg_GetDataLength(msg), tlen;
    nats_job *j = NULL;
    if ((tlen = subject_topic(subj, SUBJECT_PREFIX, topic)) > 0) {
        if (h && blen >= MAGIC_LEN && memcmp(h, MAGIC, MAGIC_LEN) == 0)
            j = tern__nats_unpack(topic, tlen, h + MAGIC_LEN, blen - MAGIC_LEN);
    } else if ((tlen = subject_topic(subj, ANN_PREFIX, topic)) > 0 && h &&
               blen >= NUM_HEAD_LEN && memcmp(h, MAGIC_NUM, MAGIC_LEN) == 0) {
        uint64_t epoch = get_le64(h + MAGIC_LEN), seq = get_le64(h + MAGIC_LEN + 8);
        /* both 0: a node's own numbering (no JetStream) */
        if ((epoch != 0) == (seq != 0) &&
            (j = tern__nats_unpack(topic, tlen, h + NUM_HEAD_LEN, blen - NUM_HEAD_LEN))) {
            j->announced = true;
            j->numbered = epoch != 0;
            j->num = (tern__engine_num){.epoch = epoch, .seq = seq};
        }
    }
    natsMsg_Destroy(msg);
    if (j)
        tern__nats_post(n, j);
}

/* A subscription's end: no message handler runs for it after this. */
static void on_sub_done(void *closure) { tern__nats_release(closure); }

/* topic's subject: prefix, then the topic with '.', '*', '>', '%' and
 * the bytes NATS would split on or refuse escaped as %XX, so that a topic
 * is one token and never a wildcard. */
void tern__nats_topic_subject(const char *prefix, const char *topic, size_t tlen, char *out) {
    static const char hex[] = "0123456789ABCDEF";
    size_t n = strlen(prefix);
    memcpy(out, prefix, n);
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

/* path can be opened for reading; else why says so. */
static bool readable(const char *path, char *why, size_t wcap) {
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        snprintf(why, wcap, "cannot read %.120s: %s", path, strerror(errno));
        return false;
    }
    fclose(f);
    return true;
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
    if (s == NATS_OK && u->creds[0]) {
        /* libnats reads it at the connect, and would say it only as a
         * failure to connect */
        s = readable(u->creds, why, wcap) ? natsOptions_SetUserCredentialsFromFiles(o, u->creds, NULL)
                                            : NATS_ERR;
    }
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
    nats_job *j = tern__nats_job_new(J_FAILED, NULL, 0);
    natsOptions *o = NULL;
    natsConnection *nc = NULL;
    char why[sizeof(j->why)] = "";
    /* The connection's reference, taken before libnats may call on_closed */
    tern__nats_hold(n);
    natsStatus s = make_options(n, &o, why, sizeof(why));
    bool ours = s != NATS_OK && why[0] != '\0';
    if (s == NATS_OK)
        s = natsConnection_Connect(&nc, o);
    natsOptions_Destroy(o);
    if (s != NATS_OK && why[0] == '\0')
        tern__nats_last_error(s, why, sizeof(why));
    if (s != NATS_OK)
        tern__nats_release(n);   /* no connection: no on_closed */
    if (j == NULL) {
        if (nc)
            natsConnection_Destroy(nc);
    } else {
        j->kind = s == NATS_OK ? J_CONNECTED : J_FAILED;
        j->nc = nc;
        j->auth = s != NATS_OK && is_auth(s, why);
        j->ours = ours;
        memcpy(j->why, why, sizeof(why));
        tern__nats_post(n, j);
    }
    tern__nats_release(n);   /* the thread's */
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
    tern__nats_hold(n);
    int err = pthread_create(&n->thread, NULL, connect_main, n);
    if (err != 0) {
        tern__nats_release(n);
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
            nats_sub *e = (nats_sub *)p;
            natsSubscription_Unsubscribe(e->s);
            natsSubscription_Destroy(e->s);
            free(e);
        }
    free(n->subs.b);
    n->subs = (tern__ps_table){0};
    if (n->ann) {
        natsSubscription_Unsubscribe(n->ann);
        natsSubscription_Destroy(n->ann);
        n->ann = NULL;
    }
}

/* Linked: the topics followed again (resubscribe); when the bridge
 * follows numbered topics (psubscribe), connected only once the worker
 * has seen the announcements' subscription confirmed (J_LISTENING):
 * until then a numbered publish would go by unheard here. */
static void set_connected(tern__nats *n) {
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
    n->nprefix = 0;
    n->listen_gen++;
    n->hooks.resubscribe(n->user);
    nats_work *w = n->nprefix > 0 ? tern__nats_work_new(W_LISTEN, "", 0, 0) : NULL;
    if (w) {
        w->a = n->listen_gen;
        if (tern__nats_work_post(n, w))
            return;   /* connected at J_LISTENING */
    }
    /* nothing numbered to wait for (or no memory to ask: taken as heard) */
    atomic_store(&n->connected, true);
    if (n->nprefix > 0)
        n->hooks.listening(n->user);
}

/* A numbered message's topic is one this node numbers (its prefixes). */
static bool numbers_topic(const tern__nats *n, const char *topic, size_t tlen) {
    for (int i = 0; i < n->nprefix; i++)
        if (n->plen[i] <= tlen && memcmp(n->prefix[i], topic, n->plen[i]) == 0)
            return true;
    return false;
}

static const char *credentials(const tern__nats *n) {
    return n->url.creds[0] ? "the credentials file"
           : n->url.user[0] ? "the user and password"
           : n->url.token[0] || n->url.token_file[0] ? "the token" : "a client without credentials";
}

static void run_job(tern_loop *loop, void *user) {
    (void)loop;
    nats_job *j = user;
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
        tern__nats_hand_context(n, n->nc);
        set_connected(n);
        break;
    case J_FAILED:
        n->connecting = false;
        atomic_store(&n->auth_refused, j->auth);
        if (j->ours)
            say(n, TERN_LOG_ERROR, "cannot connect: %s; local delivery goes on, retrying",
                j->why);
        else if (j->auth)
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
            tern__nats_hand_context(n, NULL);
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
        if (j->announced && !numbers_topic(n, j->body, j->tlen))
            break;
        bump(&n->received);
        n->hooks.message(n->user, j->body, j->tlen, j->body + j->tlen, j->klen,
                         j->body + j->tlen + j->klen, j->len, j->opcode,
                         j->seq_at == UINT64_MAX ? SIZE_MAX : (size_t)j->seq_at,
                         j->numbered ? &j->num : NULL);
        break;
    case J_LISTENING:
        if (j->num.epoch == n->listen_gen && n->nc && !atomic_load(&n->connected)) {
            atomic_store(&n->connected, true);
            n->hooks.listening(n->user);
        }
        break;
    case J_LAST:
        n->hooks.last(n->user, j->body, j->tlen, j->num.epoch, j->num.seq);
        break;
    case J_CLAIMED:
        n->hooks.claimed(n->user, j->body, j->tlen, j->num.epoch, j->num.seq);
        break;
    case J_WARN:
        say(n, TERN_LOG_WARN, "%s", j->why);
        break;
    }
    job_free(j);
}

/* ---- the engine's operations (the loop's thread) ------------------------- */

static nats_sub *find_sub(tern__nats *n, const char *topic, size_t tlen, uint64_t h) {
    if (n->subs.nb == 0)
        return NULL;
    for (tern__ps_node *p = *tern__ps_bucket(&n->subs, h); p; p = p->next) {
        nats_sub *e = (nats_sub *)p;
        if (p->hash == h && e->tlen == tlen && memcmp(e->topic, topic, tlen) == 0)
            return e;
    }
    return NULL;
}

static void nats_subscribe(void *state, const char *topic, size_t tlen, bool on) {
    tern__nats *n = state;
    uint64_t h = tern__ps_hash_name(topic, tlen);
    nats_sub *e = find_sub(n, topic, tlen, h);
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
    tern__nats_topic_subject(SUBJECT_PREFIX, topic, tlen, subj);
    tern__nats_hold(n);   /* the subscription's, given back by on_sub_done */
    natsStatus s = natsConnection_Subscribe(&e->s, n->nc, subj, on_msg, n);
    if (s != NATS_OK) {
        tern__nats_release(n);
        say(n, TERN_LOG_WARN, "cannot subscribe to %s: %s", subj, natsStatus_GetText(s));
        free(e);
        return;
    }
    /* Refused only when the subscription is closed already (its
     * connection went): then no completion will come to give it back. */
    if (natsSubscription_SetOnCompleteCB(e->s, on_sub_done, n) != NATS_OK)
        tern__nats_release(n);
    e->n.hash = h;
    e->tlen = tlen;
    memcpy(e->topic, topic, tlen);
    tern__ps_table_add(&n->subs, &e->n);
}

/* The envelope (the file's comment) into m (HEAD_LEN + klen + len bytes). */
static void envelope(uint8_t *m, const char *key, size_t klen, const void *data, size_t len,
                     int opcode, size_t seq_at) {
    memcpy(m, MAGIC, MAGIC_LEN);
    m[MAGIC_LEN] = (uint8_t)opcode;
    tern__nats_put_le64(m + MAGIC_LEN + 1, seq_at == SIZE_MAX ? UINT64_MAX : (uint64_t)seq_at);
    m[HEAD_LEN - 1] = (uint8_t)klen;   /* at most TERN_KEY_MAX (128) */
    if (klen)
        memcpy(m + HEAD_LEN, key, klen);
    if (len)
        memcpy(m + HEAD_LEN + klen, data, len);
}

/* Linked now (libnats may know it lost the link before its callback has
 * reached the loop): a publish meanwhile is dropped, not queued. */
static bool linked(const tern__nats *n) {
    return atomic_load(&n->connected) && natsConnection_Status(n->nc) == NATS_CONN_STATUS_CONNECTED;
}

static void nats_publish(void *state, const char *topic, size_t tlen, const char *key,
                         size_t klen, const void *data, size_t len, int opcode, size_t seq_at) {
    tern__nats *n = state;
    /* libnats would keep it for after a reconnect: nothing is queued */
    uint8_t *m = NULL;
    if (!linked(n) || HEAD_LEN + klen + len > INT32_MAX ||
        (m = malloc(HEAD_LEN + klen + len)) == NULL) {
        bump(&n->dropped);
        return;
    }
    envelope(m, key, klen, data, len, opcode, seq_at);
    char subj[SUBJECT_MAX];
    tern__nats_topic_subject(SUBJECT_PREFIX, topic, tlen, subj);
    if (natsConnection_Publish(n->nc, subj, m, (int)(HEAD_LEN + klen + len)) == NATS_OK)
        bump(&n->published);
    else
        bump(&n->dropped);
    free(m);
}

/* A numbered publish to a server without JetStream: delivered here (a
 * job, with no number: this node numbers it) and announced unnumbered. */
static void no_numbering(tern__nats *n, const char *topic, size_t tlen, const char *key,
                         size_t klen, const void *data, size_t len, int opcode, size_t seq_at) {
    uint8_t *m = NULL;
    if (HEAD_LEN + klen + len > INT32_MAX || (m = malloc(HEAD_LEN + klen + len)) == NULL) {
        bump(&n->dropped);
        return;
    }
    envelope(m, key, klen, data, len, opcode, seq_at);
    nats_job *j = tern__nats_unpack(topic, tlen, m + MAGIC_LEN, HEAD_LEN + klen + len - MAGIC_LEN);
    if (j)
        tern__nats_post(n, j);
    if (linked(n) &&
        tern__nats_announce(n->nc, topic, tlen, m, HEAD_LEN + klen + len, 0, 0) == NATS_OK)
        bump(&n->published);
    else
        bump(&n->dropped);
    free(m);
}

/* Numbered by JetStream on the worker thread (the file's comment), which
 * delivers it here with its number. */
static void nats_publish_numbered(void *state, const char *topic, size_t tlen, const char *key,
                                  size_t klen, const void *data, size_t len, int opcode,
                                  size_t seq_at, uint32_t keep, uint32_t keep_ms) {
    tern__nats *n = state;
    nats_work *w = NULL;
    if (atomic_load(&n->no_js)) {
        no_numbering(n, topic, tlen, key, klen, data, len, opcode, seq_at);
        return;
    }
    if (!linked(n) || HEAD_LEN + klen + len > INT32_MAX ||
        (w = tern__nats_work_new(W_PUBLISH, topic, tlen, HEAD_LEN + klen + len)) == NULL) {
        bump(&n->dropped);
        return;
    }
    envelope((uint8_t *)w->body + tlen, key, klen, data, len, opcode, seq_at);
    w->len = HEAD_LEN + klen + len;
    w->keep = keep;
    w->keep_ms = keep_ms;
    if (!tern__nats_work_post(n, w))
        bump(&n->dropped);
}

/* Every topic's announcements are heard (one subscription, ANN_PREFIX
 * ">": the escaped topic is one token, which no wildcard could match by
 * its start); those under none of the prefixes are not delivered. */
static void nats_psubscribe(void *state, const char *prefix, size_t plen) {
    tern__nats *n = state;
    if (n->nc == NULL || n->nprefix > TERN_TOPIC_RULES_MAX || plen > TERN_TOPIC_MAX)
        return;
    memcpy(n->prefix[n->nprefix], prefix, plen);
    n->plen[n->nprefix++] = plen;
    if (n->ann)
        return;
    tern__nats_hold(n);   /* the subscription's, given back by on_sub_done */
    natsStatus s = natsConnection_Subscribe(&n->ann, n->nc, ANN_PREFIX ">", on_msg, n);
    if (s != NATS_OK) {
        tern__nats_release(n);
        n->ann = NULL;
        say(n, TERN_LOG_WARN, "cannot subscribe to %s>: %s", ANN_PREFIX, natsStatus_GetText(s));
        return;
    }
    if (natsSubscription_SetOnCompleteCB(n->ann, on_sub_done, n) != NATS_OK)
        tern__nats_release(n);
}

static void nats_fill(void *state, const char *topic, size_t tlen, uint64_t from, uint64_t to) {
    nats_work *w = tern__nats_work_new(W_FILL, topic, tlen, 0);
    if (w) {
        w->a = from;
        w->b = to;
        tern__nats_work_post(state, w);
    }
}

static void nats_claim(void *state, const char *topic, size_t tlen, uint64_t epoch,
                       uint64_t keep_ms) {
    nats_work *w = tern__nats_work_new(W_CLAIM, topic, tlen, 0);
    if (w) {
        w->a = epoch;
        w->b = keep_ms;
        tern__nats_work_post(state, w);
    }
}

static void nats_last(void *state, const char *topic, size_t tlen) {
    nats_work *w = tern__nats_work_new(W_LAST, topic, tlen, 0);
    if (w)
        tern__nats_work_post(state, w);
}

static bool nats_connected(const void *state) {
    return atomic_load(&((const tern__nats *)state)->connected);
}

static tern_loop *nats_loop(const void *state) { return ((const tern__nats *)state)->loop; }

static void nats_stats(const void *state, tern_bridge_counters *out) {
    const tern__nats *n = state;
    out->connected = atomic_load(&n->connected);
    out->reconnects = atomic_load(&n->reconnects);
    out->published = atomic_load(&n->published) + atomic_load(&n->w_published);
    out->received = atomic_load(&n->received);
    out->dropped = atomic_load(&n->dropped) + atomic_load(&n->w_dropped);
    out->fills = atomic_load(&n->w_fills);
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
    /* the worker told to stop; the connection closed first, which ends a
     * JetStream request it waits on */
    pthread_mutex_lock(&n->wmu);
    n->wstop = true;
    pthread_cond_signal(&n->wcv);
    pthread_mutex_unlock(&n->wmu);
    if (n->nc)
        natsConnection_Destroy(n->nc);
    n->nc = NULL;
    if (n->worker_started)
        pthread_join(n->worker, NULL);
    for (nats_work *w = n->whead, *next; w; w = next) {
        next = w->next;
        free(w);
    }
    if (n->js_next)
        jsCtx_Destroy(n->js_next);
    atomic_store(&n->connected, false);
    tern__nats_release(n);
}

static const tern__engine_ops nats_ops = {
    .name = "nats",
    .free = nats_free,
    .loop = nats_loop,
    .connected = nats_connected,
    .subscribe = nats_subscribe,
    .publish = nats_publish,
    .publish_numbered = nats_publish_numbered,
    .psubscribe = nats_psubscribe,
    .fill = nats_fill,
    .claim = nats_claim,
    .last = nats_last,
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
    pthread_mutex_init(&n->wmu, NULL);
    pthread_cond_init(&n->wcv, NULL);
    n->wtail = &n->whead;
    atomic_init(&n->refs, 1);
    n->loop = loop;
    /* this node's message ids (JetStream's duplicate window) */
    uint64_t id = 0;
    if (tern__plat_random(&id, sizeof(id), true) < 0)
        id = (uint64_t)getpid() << 32 ^ (uint64_t)(uintptr_t)n;
    snprintf(n->node, sizeof(n->node), "%016llx", (unsigned long long)id);
    n->hooks = *hooks;
    n->user = user;
    n->backoff_ms = BACKOFF_MIN_MS;
    n->seed = (unsigned)getpid() ^ (unsigned)(uintptr_t)n;
    /* The first try from the loop, as every later one: what it says is
     * logged from there, not from inside the caller's call. */
    tern__nats_hold(n);   /* the worker's */
    int err = -pthread_create(&n->worker, NULL, tern__nats_worker_main, n);
    if (err < 0) {
        tern__nats_release(n);
        tern__nats_release(n);
        return err;
    }
    n->worker_started = true;
    err = tern_timer_start(loop, &n->retry, 0, 0, on_retry, n);
    if (err < 0) {
        nats_free(n);
        return err;
    }
    n->retry_armed = true;
    *out = (tern__engine){.ops = &nats_ops, .state = n};
    return 0;
}
