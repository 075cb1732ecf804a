/* The NATS engine's numbering (engine.h's optional operations) on
 * JetStream: the worker thread of nats.c's engine, and what it asks.
 *
 * Topics with a history are numbered by JetStream, so that every node
 * agrees on (epoch, seq): each is one stream (STREAM_PREFIX and the topic, escaped; its one subject
 * JS_PREFIX and the topic), whose sequence is the topic's seq and whose
 * description holds its epoch ("tern epoch " and 16 hex digits), chosen
 * at random by the node that makes the stream, or claimed before its
 * first message (claim): a stream made again (deleted, or a broker's
 * storage lost) has a new epoch. The stream keeps the topic's history
 * (max_msgs, max_age) and `replicas=` copies. JetStream's calls are
 * requests that wait for their answer, so they run on one worker thread
 * of this file's, in the order the loop asked for them (a node's
 * publishes stay in order): a numbered publish is stored in the stream
 * (js_Publish, with a message id, so that a publish tried again after a
 * lost answer, a stream's leader gone, is stored once), then delivered
 * on this node (a job with its number) and announced to the other nodes on
 * core NATS: ANN_PREFIX and the topic, "tn2", the epoch and the seq (8
 * bytes each, little-endian), then the envelope (nats.c's comment)
 * without its magic.
 * Every node follows ANN_PREFIX ">" (psubscribe); a node that missed
 * some (its link was down, or announcements of two nodes crossed) reads
 * them back from the stream (fill: js_GetMsg per seq).
 *
 * Nothing here touches the loop's side of the engine: what the worker
 * learns goes to the loop as a job (tern__nats_post); the loop hands it
 * requests (work, under wmu) and its JetStream context. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loop/counter.h"
#include "platform/platform.h"
#include "pubsub/nats_internal.h"

/* ---- the worker: JetStream's requests (a thread of this file's) ---------- */

/* topic's stream name: STREAM_PREFIX and the topic, every byte but
 * [A-Za-z0-9-] written _XX (JetStream refuses '.', '*', '>', spaces and
 * path separators in names, which are its storage's directory names);
 * over STREAM_NAME_MAX, STREAM_PREFIX "_h" and the topic's hash instead
 * ('h' is no hex digit: never an escaped name). */
static void stream_name(const char *topic, size_t tlen, char *out) {
    static const char hex[] = "0123456789ABCDEF";
    size_t n = sizeof(STREAM_PREFIX) - 1;
    memcpy(out, STREAM_PREFIX, n);
    for (size_t i = 0; i < tlen && n + 3 < STREAM_NAME_MAX; i++) {
        unsigned char c = (unsigned char)topic[i];
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-') {
            out[n++] = (char)c;
        } else {
            out[n++] = '_';
            out[n++] = hex[c >> 4];
            out[n++] = hex[c & 15];
        }
    }
    out[n] = '\0';
    if (n + 3 >= STREAM_NAME_MAX)   /* cut short: named by its hash */
        snprintf(out, STREAM_NAME_MAX, STREAM_PREFIX "_h%016llx",
                 (unsigned long long)tern__ps_hash_name(topic, tlen));
}

/* A job from the worker to the loop (J_LAST, J_CLAIMED, J_LISTENING,
 * J_WARN): topic in body, num's epoch and seq. */
static void post_result(tern__nats *n, enum job_kind kind, const char *topic, size_t tlen,
                        uint64_t epoch, uint64_t seq) {
    nats_job *j = tern__nats_job_new(kind, NULL, tlen);
    if (j == NULL)
        return;
    j->tlen = tlen;
    memcpy(j->body, topic, tlen);
    j->num = (tern__engine_num){.epoch = epoch, .seq = seq};
    tern__nats_post(n, j);
}

static void warn(tern__nats *n, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void warn(tern__nats *n, const char *fmt, ...) {
    nats_job *j = tern__nats_job_new(J_WARN, NULL, 0);
    if (j == NULL)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(j->why, sizeof(j->why), fmt, ap);
    va_end(ap);
    tern__nats_post(n, j);
}

/* Waits up to ms for the end (wstop) or for a new context; false at the
 * end. Under wmu. */
static bool wait_locked(tern__nats *n, uint32_t ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000;
    if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
    }
    if (!n->wstop && !n->js_set)
        pthread_cond_timedwait(&n->wcv, &n->wmu, &ts);
    return !n->wstop;
}

/* The context the loop handed over, taken (the old one destroyed: the
 * connection it held alive goes with it when the loop has let it go);
 * false at the end. */
static bool take_context(tern__nats *n) {
    pthread_mutex_lock(&n->wmu);
    bool on = !n->wstop;
    jsCtx *old = NULL;
    if (n->js_set) {
        old = n->js;
        n->js = n->js_next;
        n->wnc = n->nc_next;
        n->js_next = NULL;
        n->nc_next = NULL;
        n->js_set = false;
    }
    pthread_mutex_unlock(&n->wmu);
    if (old)
        jsCtx_Destroy(old);
    return on;
}

/* A pause between two tries; false at the end. */
static bool pause_worker(tern__nats *n) {
    pthread_mutex_lock(&n->wmu);
    bool on = wait_locked(n, TRY_AGAIN_MS);
    pthread_mutex_unlock(&n->wmu);
    return on && take_context(n);
}

/* A newer connect's listen waits (first in the queue, where a W_LISTEN
 * goes): what the worker tries again for the link it had gives way. */
static bool listen_waiting(tern__nats *n) {
    pthread_mutex_lock(&n->wmu);
    bool waiting = n->whead != NULL && n->whead->kind == W_LISTEN;
    pthread_mutex_unlock(&n->wmu);
    return waiting;
}

/* After a read of JetStream's (a fill's, a last's) failed: a pause, then
 * true to ask again, while a cluster elects the leader that answers;
 * false once `until` has passed, at the end, or when a newer connect's
 * listen waits (it asks every topic's last again, which fills what is
 * missing). */
static bool read_again(tern__nats *n, int64_t until) {
    return nats_Now() < until && pause_worker(n) && !listen_waiting(n);
}

static void forget_streams(tern__nats *n) {
    for (size_t i = 0; i < n->streams.nb; i++)
        for (tern__ps_node *p = n->streams.b[i], *next; p; p = next) {
            next = p->next;
            free(p);
        }
    free(n->streams.b);
    n->streams = (tern__ps_table){0};
}

static nats_wstream *find_stream(tern__nats *n, const char *topic, size_t tlen, uint64_t h) {
    if (n->streams.nb == 0)
        return NULL;
    for (tern__ps_node *p = *tern__ps_bucket(&n->streams, h); p; p = p->next) {
        nats_wstream *e = (nats_wstream *)p;
        if (p->hash == h && e->tlen == tlen && memcmp(e->topic, topic, tlen) == 0)
            return e;
    }
    return NULL;
}

/* The epoch a stream's description holds; 0 for none (not tern's). */
static uint64_t info_epoch(const jsStreamInfo *si) {
    const char *d = si->Config ? si->Config->Description : NULL;
    size_t pl = sizeof(EPOCH_DESC) - 1;
    unsigned long long e = 0;
    char end;
    if (d == NULL || strncmp(d, EPOCH_DESC, pl) != 0 || strlen(d + pl) != 16 ||
        sscanf(d + pl, "%16llx%c", &e, &end) != 1)
        return 0;
    return (uint64_t)e;
}

/* topic's stream as JetStream has it: NATS_OK (*si to destroy),
 * NATS_NOT_FOUND when there is none, NATS_MISMATCH when it is not tern's
 * (no epoch), or the failure (no answer: perhaps no leader yet). */
static natsStatus stream_info(tern__nats *n, const char *topic, size_t tlen, jsStreamInfo **si) {
    char name[STREAM_NAME_MAX];
    stream_name(topic, tlen, name);
    jsErrCode jerr = 0;
    *si = NULL;
    if (n->js == NULL)
        return NATS_CONNECTION_CLOSED;
    natsStatus s = js_GetStreamInfo(si, n->js, name, NULL, &jerr);
    if (s == NATS_OK && info_epoch(*si) == 0) {
        warn(n, "stream %s holds no tern epoch in its description: not used", name);
        jsStreamInfo_Destroy(*si);
        *si = NULL;
        return NATS_MISMATCH;
    }
    return s == NATS_OK ? NATS_OK : jerr == JSStreamNotFoundErr ? NATS_NOT_FOUND : s;
}

/* stream_info, asked again (read_again) while JetStream does not answer. */
static natsStatus stream_info_again(tern__nats *n, const char *topic, size_t tlen,
                                    jsStreamInfo **si, int64_t until) {
    for (;;) {
        natsStatus s = stream_info(n, topic, tlen, si);
        if (s == NATS_OK || s == NATS_NOT_FOUND || s == NATS_MISMATCH || !read_again(n, until))
            return s;
    }
}

/* topic's stream made, under epoch, keeping keep messages (0: no limit)
 * for keep_ms (0: for good); NATS_OK too when another node made it
 * first (its epoch holds). */
static natsStatus make_stream(tern__nats *n, const char *topic, size_t tlen, uint64_t epoch,
                              uint32_t keep, uint64_t keep_ms) {
    char name[STREAM_NAME_MAX], subj[SUBJECT_MAX], desc[sizeof(EPOCH_DESC) + 16];
    stream_name(topic, tlen, name);
    tern__nats_topic_subject(JS_PREFIX, topic, tlen, subj);
    snprintf(desc, sizeof(desc), EPOCH_DESC "%016llx", (unsigned long long)epoch);
    const char *subjects[1] = {subj};
    jsStreamConfig c;
    jsStreamConfig_Init(&c);
    c.Name = name;
    c.Description = desc;
    c.Subjects = subjects;
    c.SubjectsLen = 1;
    c.Storage = js_FileStorage;
    c.Retention = js_LimitsPolicy;
    c.Discard = js_DiscardOld;
    c.MaxMsgs = keep ? (int64_t)keep : -1;
    c.MaxAge = (int64_t)keep_ms * 1000000;   /* ns */
    c.Replicas = n->url.replicas;
    jsErrCode jerr = 0;
    jsStreamInfo *si = NULL;
    if (n->js == NULL)
        return NATS_CONNECTION_CLOSED;
    natsStatus s = js_AddStream(&si, n->js, &c, NULL, &jerr);
    jsStreamInfo_Destroy(si);
    if (s != NATS_OK && jerr != JSStreamNameExistErr) {
        char why[160];
        tern__nats_last_error(s, why, sizeof(why));
        warn(n, "cannot make stream %s: %s", name, why);
        return s;
    }
    return NATS_OK;
}

/* The history's limits on a stream used for the first time here: what
 * this node's rule says (a rule changed, or a claim that made the stream
 * without them). */
static void fit_limits(tern__nats *n, jsStreamInfo *si, uint32_t keep, uint32_t keep_ms) {
    jsStreamConfig *c = si->Config;
    int64_t msgs = keep ? (int64_t)keep : -1, age = (int64_t)keep_ms * 1000000;
    if (c == NULL || (c->MaxMsgs == msgs && c->MaxAge == age))
        return;
    c->MaxMsgs = msgs;
    c->MaxAge = age;
    jsStreamInfo *out = NULL;
    jsErrCode jerr = 0;
    if (js_UpdateStream(&out, n->js, c, NULL, &jerr) != NATS_OK)
        warn(n, "cannot set stream %s's limits (%d)", c->Name, (int)jerr);
    jsStreamInfo_Destroy(out);
}

/* topic's stream for a publish: known here, or read (made when there is
 * none, under a random epoch); NULL when JetStream did not answer. */
static nats_wstream *use_stream(tern__nats *n, const char *topic, size_t tlen, uint32_t keep,
                           uint32_t keep_ms) {
    uint64_t h = tern__ps_hash_name(topic, tlen);
    nats_wstream *e = find_stream(n, topic, tlen, h);
    if (e)
        return e;
    jsStreamInfo *si;
    natsStatus s = stream_info(n, topic, tlen, &si);
    if (s == NATS_NOT_FOUND) {
        uint64_t epoch = 0;
        while (epoch == 0 && tern__plat_random(&epoch, sizeof(epoch), true) == 0) {
        }
        if (epoch == 0)
            epoch = ((uint64_t)nats_NowInNanoSeconds() << 1) | 1;
        if (make_stream(n, topic, tlen, epoch, keep, keep_ms) == NATS_OK)
            s = stream_info(n, topic, tlen, &si);
    }
    if (s != NATS_OK)
        return NULL;
    fit_limits(n, si, keep, keep_ms);
    e = tern__ps_table_grow(&n->streams) < 0 ? NULL : malloc(sizeof(*e) + tlen);
    if (e) {
        e->n.hash = h;
        e->epoch = info_epoch(si);
        e->last = si->State.LastSeq;
        e->tlen = tlen;
        memcpy(e->topic, topic, tlen);
        tern__ps_table_add(&n->streams, &e->n);
    }
    jsStreamInfo_Destroy(si);
    return e;
}

static void drop_stream(tern__nats *n, nats_wstream *e) {
    tern__ps_table_del(&n->streams, &e->n);
    free(e);
}

/* The announcement of a numbered message (epoch and seq 0: numbered by
 * its node) to the other nodes: "tn2", epoch, seq, then env (len bytes)
 * without its magic. Any thread. */
natsStatus tern__nats_announce(natsConnection *nc, const char *topic, size_t tlen, const uint8_t *env,
                           size_t len, uint64_t epoch, uint64_t seq) {
    size_t alen = NUM_HEAD_LEN + len - MAGIC_LEN;
    uint8_t *a = malloc(alen);
    if (a == NULL)
        return NATS_NO_MEMORY;
    memcpy(a, MAGIC_NUM, MAGIC_LEN);
    tern__nats_put_le64(a + MAGIC_LEN, epoch);
    tern__nats_put_le64(a + MAGIC_LEN + 8, seq);
    memcpy(a + NUM_HEAD_LEN, env + MAGIC_LEN, len - MAGIC_LEN);
    char subj[SUBJECT_MAX];
    tern__nats_topic_subject(ANN_PREFIX, topic, tlen, subj);
    natsStatus s = natsConnection_Publish(nc, subj, a, (int)alen);
    free(a);
    return s;
}

/* A numbered publish: stored in its stream (tried again with the same
 * message id until PUBLISH_TRY_MS: JetStream keeps one copy), delivered
 * here with its number, announced to the other nodes.
 *
 * Across a JetStream failover (a stream's or the meta group's leader
 * lost) the publish waits, and those queued behind it wait in order,
 * until a new leader stores it: a bridge that dropped it after a few
 * seconds would lose messages every subscriber of every node would
 * miss, in a failover the cluster was made to survive. What JetStream
 * has not stored in PUBLISH_TRY_MS is dropped (counted, and said), and
 * later ones are tried once until one is stored, so that a stream gone
 * for good (its one server lost) does not hold every topic's publishes
 * PUBLISH_TRY_MS each. */
static void w_publish(tern__nats *n, const nats_work *w) {
    const char *topic = w->body;
    const uint8_t *env = (const uint8_t *)w->body + w->tlen;
    char subj[SUBJECT_MAX], id[48];
    tern__nats_topic_subject(JS_PREFIX, topic, w->tlen, subj);
    snprintf(id, sizeof(id), "%s-%llu", n->node, (unsigned long long)++n->msgid);
    /* tried again for PUBLISH_TRY_MS, unless the last one was dropped:
     * then once, so that a stream that stays away (its one server gone)
     * holds each request behind it a moment, not PUBLISH_TRY_MS */
    int64_t until = nats_Now() + (n->failing ? 0 : PUBLISH_TRY_MS);
    jsPubAck *pa = NULL;
    nats_wstream *e = NULL;
    const char *why = "its stream not read";   /* the last try's failure */
    for (;;) {
        e = use_stream(n, topic, w->tlen, w->keep, w->keep_ms);
        if (e) {
            jsPubOptions po;
            jsPubOptions_Init(&po);
            po.MsgId = id;
            jsErrCode jerr = 0;
            natsStatus s = js_Publish(&pa, n->js, subj, env, (int)w->len, &po, &jerr);
            if (s == NATS_OK)
                break;
            why = natsStatus_GetText(s);
            if (s == NATS_NO_RESPONDERS)   /* the stream is gone: made again at the next try */
                drop_stream(n, e);
        }
        if (nats_Now() >= until || !pause_worker(n)) {
            TERN__COUNTER_ADD(n->w_dropped, 1);
            if (!n->failing)
                warn(n, "numbered publishes dropped: JetStream stored none in %d s (%s)",
                     PUBLISH_TRY_MS / 1000, why);
            n->failing = true;
            return;
        }
    }
    n->failing = false;
    uint64_t seq = pa->Sequence;
    jsPubAck_Destroy(pa);
    if (seq <= e->last) {
        /* numbered from the start again: the stream was made anew (its
         * epoch read again) */
        drop_stream(n, e);
        if ((e = use_stream(n, topic, w->tlen, w->keep, w->keep_ms)) == NULL) {
            TERN__COUNTER_ADD(n->w_dropped, 1);
            return;
        }
    }
    e->last = seq;
    TERN__COUNTER_ADD(n->w_published, 1);
    nats_job *j = tern__nats_unpack(topic, w->tlen, env + MAGIC_LEN, w->len - MAGIC_LEN);
    if (j) {
        j->announced = j->numbered = true;
        j->num = (tern__engine_num){.epoch = e->epoch, .seq = seq};
        tern__nats_post(n, j);
    }
    tern__nats_announce(n->wnc, topic, w->tlen, env, w->len, e->epoch, seq);
}

/* A fill: seqs a..b of the topic's stream, those it still has, each
 * delivered with its number, in order. Asked again while JetStream does
 * not answer (read_again): the bridge counts on a fill it asked for (the
 * seqs up to b come from it, not again from the announcements), so one
 * given up during a failover would leave its subscribers a gap. */
static void w_fill(tern__nats *n, const nats_work *w) {
    int64_t until = nats_Now() + PUBLISH_TRY_MS;
    jsStreamInfo *si;
    if (stream_info_again(n, w->body, w->tlen, &si, until) != NATS_OK)
        return;
    uint64_t epoch = info_epoch(si), first = si->State.FirstSeq, last = si->State.LastSeq;
    jsStreamInfo_Destroy(si);
    char name[STREAM_NAME_MAX];
    stream_name(w->body, w->tlen, name);
    TERN__COUNTER_ADD(n->w_fills, 1);
    for (uint64_t seq = w->a > first ? w->a : first; seq <= w->b && seq <= last; seq++) {
        natsMsg *m = NULL;
        jsErrCode jerr;
        natsStatus s;
        for (;;) {
            jerr = 0;
            s = js_GetMsg(&m, n->js, name, seq, NULL, &jerr);
            if (s == NATS_OK || jerr == JSNoMessageFoundErr || jerr == JSStreamNotFoundErr)
                break;
            if (!read_again(n, until))
                return;   /* a newer connect's listen asks again */
        }
        if (s != NATS_OK && jerr == JSNoMessageFoundErr)
            continue;     /* gone by the limits: the bridge sees the gap */
        if (s != NATS_OK)
            return;       /* the stream deleted: the next message names its new epoch */
        const uint8_t *h = (const uint8_t *)natsMsg_GetData(m);
        size_t len = (size_t)natsMsg_GetDataLength(m);
        nats_job *j = h && len >= MAGIC_LEN && memcmp(h, MAGIC, MAGIC_LEN) == 0
                     ? tern__nats_unpack(w->body, w->tlen, h + MAGIC_LEN, len - MAGIC_LEN) : NULL;
        natsMsg_Destroy(m);
        if (j) {
            j->announced = j->numbered = true;
            j->num = (tern__engine_num){.epoch = epoch, .seq = seq, .fill = true};
            tern__nats_post(n, j);
        }
    }
}

/* A claim: the stream made under the claimed epoch unless it is there;
 * the epoch that holds and its last seq answered. */
static void w_claim(tern__nats *n, const nats_work *w) {
    jsStreamInfo *si;
    natsStatus s = stream_info(n, w->body, w->tlen, &si);
    if (s == NATS_NOT_FOUND && make_stream(n, w->body, w->tlen, w->a, 0, w->b) == NATS_OK)
        s = stream_info(n, w->body, w->tlen, &si);
    if (s != NATS_OK)
        return;
    post_result(n, J_CLAIMED, w->body, w->tlen, info_epoch(si), si->State.LastSeq);
    jsStreamInfo_Destroy(si);
}

/* A topic's last number: asked again while JetStream does not answer,
 * as a node that moved to another server during a failover asks it to
 * read back what it missed, which no later message may ask for. */
static void w_last(tern__nats *n, const nats_work *w) {
    jsStreamInfo *si;
    if (stream_info_again(n, w->body, w->tlen, &si, nats_Now() + PUBLISH_TRY_MS) != NATS_OK)
        return;
    post_result(n, J_LAST, w->body, w->tlen, info_epoch(si), si->State.LastSeq);
    jsStreamInfo_Destroy(si);
}

/* The announcements' subscription confirmed (the server answered a PING
 * sent after it): every numbered message is heard from now on. The
 * streams are read afresh after each connect (one may have been made
 * anew meanwhile). The PING is sent again until it is answered or a
 * newer connect's listen waits: the bridge is not connected before, so
 * a listen given up on a link that stays (its server stalled, as in a
 * failover on a loaded machine) would leave it down for good. */
static void w_listen(tern__nats *n, const nats_work *w) {
    forget_streams(n);
    n->failing = false;
    while (n->wnc == NULL || natsConnection_FlushTimeout(n->wnc, JS_WAIT_MS) != NATS_OK)
        if (!pause_worker(n) || listen_waiting(n))
            return;   /* the end, or the next connect asks instead */
    /* JetStream there? (no responders: not enabled on this server) */
    jsAccountInfo *ai = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_GetAccountInfo(&ai, n->js, NULL, &jerr);
    jsAccountInfo_Destroy(ai);
    bool none = s == NATS_NO_RESPONDERS || jerr == JSNotEnabledErr ||
                jerr == JSNotEnabledForAccountErr;
    if (s == NATS_OK || none)
        atomic_store(&n->no_js, none);
    if (none)
        warn(n, "has no JetStream: topics with a history are numbered by each node (a "
                "subscriber resumes only on the node it left)");
    post_result(n, J_LISTENING, "", 0, w->a, 0);
}

void *tern__nats_worker_main(void *arg) {
    tern__nats *n = arg;
    for (;;) {
        pthread_mutex_lock(&n->wmu);
        while (!n->wstop && !n->js_set && n->whead == NULL)
            pthread_cond_wait(&n->wcv, &n->wmu);
        nats_work *w = n->wstop ? NULL : n->whead;
        if (w) {
            n->whead = w->next;
            if (n->whead == NULL)
                n->wtail = &n->whead;
            n->wcount--;
            n->wbytes -= w->tlen + w->len;
        }
        bool stop = n->wstop;
        pthread_mutex_unlock(&n->wmu);
        if (stop || !take_context(n)) {
            free(w);
            break;
        }
        if (w && w->kind == W_PUBLISH)
            w_publish(n, w);
        else if (w && w->kind == W_FILL)
            w_fill(n, w);
        else if (w && w->kind == W_CLAIM)
            w_claim(n, w);
        else if (w && w->kind == W_LAST)
            w_last(n, w);
        else if (w)
            w_listen(n, w);
        free(w);
    }
    forget_streams(n);
    if (n->js)
        jsCtx_Destroy(n->js);
    n->js = NULL;
    tern__nats_release(n);   /* the worker's */
    nats_ReleaseThreadMemory();
    return NULL;
}

/* From the loop: w queued for the worker (false, w freed, when the queue
 * is full or the worker is not there). */
bool tern__nats_work_post(tern__nats *n, nats_work *w) {
    pthread_mutex_lock(&n->wmu);
    bool ok = n->worker_started && !n->wstop && n->wcount < WORK_MAX &&
              n->wbytes + w->tlen + w->len <= WORK_BYTES_MAX;
    if (ok)
        n->wbytes += w->tlen + w->len;
    if (ok && w->kind == W_LISTEN) {
        /* first: a new connection's, not behind publishes tried on the
         * last one */
        w->next = n->whead;
        n->whead = w;
        if (n->wtail == &n->whead)
            n->wtail = &w->next;
        n->wcount++;
        pthread_cond_signal(&n->wcv);
    } else if (ok) {
        w->next = NULL;
        *n->wtail = w;
        n->wtail = &w->next;
        n->wcount++;
        pthread_cond_signal(&n->wcv);
    }
    pthread_mutex_unlock(&n->wmu);
    if (!ok)
        free(w);
    return ok;
}

nats_work *tern__nats_work_new(enum work_kind kind, const char *topic, size_t tlen, size_t extra) {
    nats_work *w = calloc(1, sizeof(*w) + tlen + extra);
    if (w) {
        w->kind = kind;
        w->tlen = tlen;
        memcpy(w->body, topic, tlen);
    }
    return w;
}

/* From the loop: the worker's context for nc from now on (NULL: none,
 * the connection gone). */
void tern__nats_hand_context(tern__nats *n, natsConnection *nc) {
    jsCtx *js = NULL;
    jsOptions o;
    jsOptions_Init(&o);
    o.Wait = JS_WAIT_MS;
    if (nc && natsConnection_JetStream(&js, nc, &o) != NATS_OK)
        js = NULL;
    pthread_mutex_lock(&n->wmu);
    jsCtx *old = n->js_set ? n->js_next : NULL;   /* never taken: the worker never used it */
    n->js_next = js;
    n->nc_next = js ? nc : NULL;
    n->js_set = true;
    pthread_cond_signal(&n->wcv);
    pthread_mutex_unlock(&n->wmu);
    if (old)
        jsCtx_Destroy(old);
}

