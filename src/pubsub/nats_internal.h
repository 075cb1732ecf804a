/* The NATS engine's insides (nats.c and nats_stream.c, no other file):
 * its state, the jobs libnats's threads and the worker post to the loop,
 * the worker's requests, and the calls the two files share. nats.c's
 * comment says how the engine works; nats_stream.c holds the numbering
 * on JetStream (the worker thread). */
#ifndef TERN_PUBSUB_NATS_INTERNAL_H
#define TERN_PUBSUB_NATS_INTERNAL_H

#include <nats/nats.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pubsub/engine.h"
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
/* A subject: a prefix (the longest is JS_PREFIX) and the topic, each
 * byte escaped to at most 3 */
#define SUBJECT_MAX (sizeof("ternjs.") + 3 * TERN_TOPIC_MAX)

/* The numbering (JetStream) */
#define JS_PREFIX "ternjs."      /* a numbered topic's stream subject */
#define ANN_PREFIX "ternn."      /* a numbered message's announcement */
#define STREAM_PREFIX "tern_"    /* a stream's name */
#define STREAM_NAME_MAX 128      /* longer escaped names: the topic's hash */
#define EPOCH_DESC "tern epoch " /* a stream's description: this, then the epoch */
#define MAGIC_NUM "tn2"
#define NUM_HEAD_LEN (MAGIC_LEN + 8 + 8)   /* magic, epoch, seq: then the envelope */
#define JS_WAIT_MS 2000          /* a JetStream request's answer */
/* A numbered publish tried this long, then dropped (and a fill or a last
 * asked this long, unless a newer connect's listen waits). Long enough for a
 * JetStream leader lost in a cluster: nats-server 2.9's raft waits 4 to
 * 9 s before a follower campaigns, a split vote takes another round, and
 * the meta group and the stream's may both have to elect, slower on a
 * loaded machine; a user expects a failover to lose nothing. Shorter than
 * JetStream's duplicate window (2 min by default), so that a publish
 * tried again under its message id is still stored once. */
#define PUBLISH_TRY_MS 60000
#define TRY_AGAIN_MS 100         /* between tries */
/* The worker's queue holds at most WORK_MAX requests and WORK_BYTES_MAX
 * bytes of them (a failover holds it up to PUBLISH_TRY_MS, and messages
 * may be large); more are dropped. */
#define WORK_MAX 100000
#define WORK_BYTES_MAX (64u << 20)

typedef struct tern__nats tern__nats;

/* A request for the worker thread (JetStream): a numbered publish (topic
 * then envelope in body), a fill (a..b), a claim (epoch a, lifetime b
 * ms), a topic's last number, or the announcements' subscription to
 * confirm (generation a). */
enum work_kind { W_PUBLISH, W_FILL, W_CLAIM, W_LAST, W_LISTEN };
typedef struct nats_work {
    struct nats_work *next;
    enum work_kind kind;
    uint64_t a, b;
    uint32_t keep, keep_ms;   /* W_PUBLISH: the history's limits */
    size_t tlen, len;
    char body[];
} nats_work;

/* A stream the worker has used: its epoch and the last seq it saw. */
typedef struct nats_wstream {
    tern__ps_node n;
    uint64_t epoch, last;
    size_t tlen;
    char topic[];
} nats_wstream;

/* A topic this node follows: its subscription on the present connection. */
typedef struct nats_sub {
    tern__ps_node n;
    natsSubscription *s;
    size_t tlen;
    char topic[];
} nats_sub;

/* Invariants: on the loop's side (fields below `loop-side`, touched only
 * on its thread): nc is the connection libnats keeps up (reconnecting by
 * itself), or NULL while a connect thread runs (connecting) or the retry
 * is armed (retry_armed); subs holds one subscription on nc per topic
 * followed, and is empty while nc is NULL; why is the failure last
 * logged, empty once connected again. refs counts the holders named in
 * nats.c's comment; the struct is freed by the one that drops the last.
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
    natsSubscription *ann;   /* the announcements' (ANN_PREFIX ">") on nc, or NULL */
    /* the prefixes of the numbered topics (psubscribe since the last
     * connect); a numbered message of another topic is not delivered */
    char prefix[TERN_TOPIC_RULES_MAX + 1][TERN_TOPIC_MAX];
    size_t plen[TERN_TOPIC_RULES_MAX + 1];
    int nprefix;
    uint64_t listen_gen;   /* the W_LISTEN last asked; J_LISTENING of another is stale */
    /* the worker: a queue under wmu, and the JetStream context it is to
     * use next (js_next, when js_set) */
    pthread_mutex_t wmu;
    pthread_cond_t wcv;
    nats_work *whead, **wtail;
    size_t wcount, wbytes;   /* requests queued, and their bytes (tlen + len each) */
    bool wstop, js_set;
    jsCtx *js_next;
    natsConnection *nc_next;
    pthread_t worker;
    bool worker_started;
    /* the worker's own: its context (which holds its connection alive),
     * the streams it has used, the ids of its publishes */
    jsCtx *js;
    natsConnection *wnc;
    tern__ps_table streams;
    uint64_t msgid;
    bool failing;   /* the last numbered publish was dropped: the next are tried once */
    char node[17];
    _Atomic bool connected, auth_refused;
    _Atomic bool no_js;   /* the server has no JetStream (written by the worker) */
    _Atomic uint64_t reconnects, published, received, dropped;
    /* written by the worker only */
    _Atomic uint64_t w_published, w_dropped, w_fills;
};

enum job_kind {
    J_CONNECTED, J_FAILED, J_DISCONNECTED, J_RECONNECTED, J_CLOSED, J_ERROR, J_MSG,
    J_LISTENING, J_LAST, J_CLAIMED, J_WARN
};

/* A job. Invariants: nc is the connection it is about (J_CONNECTED: a new
 * one, which the job owns until the loop takes it); why is a NUL-ended
 * reason (libnats's words, no secret; J_WARN: the worker's line to log);
 * for J_MSG, body holds topic, key and payload, in this order, and
 * numbered says num is JetStream's number; J_LAST and J_CLAIMED: body
 * holds the topic, num its epoch and last seq; J_LISTENING: num.epoch is
 * the generation of the W_LISTEN it answers. */
typedef struct nats_job {
    tern__nats *n;
    enum job_kind kind;
    natsConnection *nc;
    bool auth;   /* J_FAILED, J_CLOSED: the server refused the credentials */
    bool ours;   /* J_FAILED: this node's failure (a file it cannot read), not NATS's */
    char why[200];
    int opcode;
    uint64_t seq_at;
    bool announced, numbered;   /* heard on ANN_PREFIX; with a number */
    tern__engine_num num;
    size_t tlen, klen, len;
    char body[];
} nats_job;

/* A reference to n taken and given back; the last frees it. Any thread. */
void tern__nats_hold(tern__nats *n);
void tern__nats_release(tern__nats *n);

/* From any thread: j handed to the loop (run there), unless the engine is
 * gone (then freed). */
void tern__nats_post(tern__nats *n, nats_job *j);

/* A new job of kind about nc, with extra bytes of body; NULL when out of
 * memory. */
nats_job *tern__nats_job_new(enum job_kind kind, natsConnection *nc, size_t extra);

/* A J_MSG job for topic from an envelope without its magic (h, blen
 * bytes); NULL when it is not one of ours or out of memory. */
nats_job *tern__nats_unpack(const char *topic, size_t tlen, const uint8_t *h, size_t blen);

/* topic's subject: prefix, then the topic escaped to one token. */
void tern__nats_topic_subject(const char *prefix, const char *topic, size_t tlen, char *out);

void tern__nats_put_le64(uint8_t *p, uint64_t v);

/* libnats's last error on this thread, or its words for s. */
void tern__nats_last_error(natsStatus s, char *out, size_t cap);

/* The worker (nats_stream.c): its thread's body (holding a reference to
 * n, given back when it ends at wstop); a request queued from the loop
 * (false, w freed, when it cannot be); a new request; the JetStream
 * context for nc handed over (NULL: none); an announcement sent. */
void *tern__nats_worker_main(void *arg);
bool tern__nats_work_post(tern__nats *n, nats_work *w);
nats_work *tern__nats_work_new(enum work_kind kind, const char *topic, size_t tlen, size_t extra);
void tern__nats_hand_context(tern__nats *n, natsConnection *nc);
natsStatus tern__nats_announce(natsConnection *nc, const char *topic, size_t tlen,
                               const uint8_t *env, size_t len, uint64_t epoch, uint64_t seq);

#endif
