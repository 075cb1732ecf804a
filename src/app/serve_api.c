/* tern serve's server API, on the admin listener beside POST
 * /publish/:topic and keyed as it is (Authorization: Bearer KEY, the
 * first line of --api-key-file; 403 without a key file, 401 otherwise).
 * JSON in (the body, one object, at most 1 MiB: 413 over it), JSON out;
 * bad input is answered 400 {"error":"..."}, an unknown field too.
 *
 *   POST /history      {"topic":T[,"from":N][,"limit":L][,"order":"oldest"|"newest"]
 *                       [,"epoch":E]}
 *     a page of T's history: oldest first from seq `from` (default: the
 *     oldest kept), or newest first from `from` down (default: the
 *     newest); L messages at most (1..1000, default 100). An epoch given
 *     that is not T's now: 409 {"error":"epoch changed","epoch":E2} (the
 *     seqs of the pages before mean nothing under E2).
 *     200 {"topic":T,"epoch":E|null,"first":F,"last":S,"messages":[...],
 *          "next":N|null}: E null when T does not exist (no subscriber, no
 *     history); F the oldest seq kept, S T's last; each message as
 *     /pubsub subscribers got it ({"topic":T,"seq":N,"data":D[,"key":K]});
 *     next: the `from` of the next page the same way, null at the end.
 *   POST /topics       {[,"prefix":P][,"after":A][,"limit":L]}
 *     the topics (with a subscriber or a history) whose names start with
 *     P, in byte order after A, L at most (1..1000, default 100):
 *     200 {"topics":[{"topic":T,"subscribers":N,"epoch":E,"seq":S,
 *          "history":B},...],"next":A2|null} (A2: the next page's after)
 *   POST /publish      {"topics":[T,...],"data":D[,"key":K]}
 *     D (a string) to each topic, 1 to 100 of them, no repeats; every one
 *     is checked before any is published (all or nothing), then published
 *     in order: 200 {"results":[{"topic":T,"seq":N,"subscribers":M} or
 *     {"topic":T,"error":"out of memory"},...]}
 *   POST /disconnect   {"user":U[,"code":C][,"reason":R]}
 *     closes every /pubsub connection whose token's sub is U, on every
 *     thread, with C (1000 or 3000..4999; default 4000) and R (up to 123
 *     bytes; default "disconnected"): 200 {"user":U,"disconnected":N}
 *   POST /unsubscribe  {"user":U,"topic":T}
 *     ends U's subscriptions to T on every thread; each connection is
 *     told with an event, {"event":"unsubscribed","topic":T} (not an
 *     "ok" ack, which a client pairs with a request it made):
 *     200 {"user":U,"topic":T,"unsubscribed":N}
 *
 * Users are the sub of /pubsub tokens (serve_tokens.c): without a token
 * flag no connection has one, and N is 0. Those two calls walk each
 * thread's open connections (posted to every loop, answered when the last
 * has run it): an operator's call, not a hot path. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/json.h"
#include "app/json_read.h"
#include "app/serve_ctx.h"

#define API_BODY_MAX (1u << 20)   /* a request body's bytes */
#define API_LIMIT_MAX 1000        /* history messages or topics in a page */
#define API_LIMIT_DEFAULT 100
#define API_BATCH_MAX 100         /* topics of one publish */
#define API_USER_MAX 256          /* a user's name (a token's sub) */
#define API_REASON_MAX 123        /* a close reason: a control frame's payload less the code */
#define API_KEY_NAME_MAX 32       /* a field's name */

/* ---- answers ------------------------------------------------------------- */

/* A growing answer. Invariants: len < cap once anything was put; oom
 * once an allocation failed (the answer is then a 500). */
typedef struct out_buf {
    char *p;
    size_t len, cap;
    bool oom;
} out_buf;

static bool room(out_buf *o, size_t more) {
    if (o->oom)
        return false;
    if (o->len + more < o->cap)
        return true;
    size_t cap = o->cap ? o->cap : 1024;
    while (cap <= o->len + more)
        cap *= 2;
    char *p = realloc(o->p, cap);
    if (p == NULL) {
        o->oom = true;
        return false;
    }
    o->p = p;
    o->cap = cap;
    return true;
}

static void put(out_buf *o, const char *s, size_t n) {
    if (room(o, n)) {
        memcpy(o->p + o->len, s, n);
        o->len += n;
    }
}

static void putf(out_buf *o, const char *fmt, ...) {
    char b[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b, sizeof(b), fmt, ap);
    va_end(ap);
    put(o, b, n < (int)sizeof(b) ? (size_t)n : sizeof(b) - 1);
}

/* s[0..n) as a JSON string, quotes included. */
static void put_str(out_buf *o, const char *s, size_t n) {
    if (!room(o, APP_JSON_ESCAPE_MAX * n + 3))
        return;
    o->p[o->len++] = '"';
    o->len += app_json_escape(o->p + o->len, APP_JSON_ESCAPE_MAX * n + 1, s, n);
    o->p[o->len++] = '"';
}

/* Ends the answer (status 200 unless out of memory) and frees it. */
static void send_out(tern_http_req *req, out_buf *o) {
    put(o, "}\n", 2);
    if (o->oom)
        tern_http_respond(req, 500, "application/json", "{\"error\":\"out of memory\"}\n", 26);
    else
        tern_http_respond(req, 200, "application/json", o->p, o->len);
    free(o->p);
}

/* {"error":why}: why may hold what the client sent (a field's name). */
static void fail(tern_http_req *req, int status, const char *why) {
    char b[64 + APP_JSON_ESCAPE_MAX * 128];
    size_t n = strnlen(why, 128), o = 10;
    memcpy(b, "{\"error\":\"", o);
    o += app_json_escape(b + o, sizeof(b) - o - 4, why, n);
    memcpy(b + o, "\"}\n", 3);
    tern_http_respond(req, status, "application/json", b, o + 3);
}

/* ---- requests ------------------------------------------------------------ */

/* The checks every call makes: the key, the body's size; then a reader
 * at the start of the body's object. false once answered. */
static bool begin(tern_http_req *req, serve_ctx *ctx, app_json_reader *r) {
    if (!app_serve_admin_key_ok(req, ctx, "the server API"))
        return false;
    size_t len;
    const char *body = tern_http_body(req, &len);
    if (len > API_BODY_MAX) {
        fail(req, 413, "body over 1 MiB");
        return false;
    }
    app_json_reader_init(r, body ? body : "", body ? len : 0);
    if (!app_json_object(r)) {
        fail(req, 400, "the body must be a JSON object");
        return false;
    }
    return true;
}

/* Reads one field's value: name is the field's, the reader at its value.
 * false once answered (a bad value, an unknown name). */
typedef bool (*field_fn)(tern_http_req *req, app_json_reader *r, const char *name, void *call);

/* Every field of the body's object, each given to fn, then the body's
 * end: true, or false once answered. */
static bool read_fields(tern_http_req *req, app_json_reader *r, field_fn fn, void *call) {
    char name[API_KEY_NAME_MAX];
    bool ok;
    while (app_json_member(r, name, sizeof(name), &ok))
        if (!fn(req, r, name, call))
            return false;
    if (!ok || !app_json_done(r)) {
        fail(req, 400, "bad JSON");
        return false;
    }
    return true;
}

/* A string field of 1 .. cap - 1 bytes: its length, or 0 once answered
 * naming it. */
static size_t text_field(tern_http_req *req, app_json_reader *r, const char *name, char *out,
                         size_t cap) {
    long n = app_json_string(r, out, cap);
    if (n > 0)
        return (size_t)n;
    char why[96];
    snprintf(why, sizeof(why), n == -2 ? "%s too long (%zu bytes at most)"
                               : n == 0 ? "%s is empty" : "%s: a string expected",
             name, cap - 1);
    fail(req, 400, why);
    return 0;
}

/* A whole-number field within lo..hi: true, or false once answered. */
static bool uint_field(tern_http_req *req, app_json_reader *r, const char *name, uint64_t lo,
                       uint64_t hi, uint64_t *out) {
    if (app_json_uint(r, out) && *out >= lo && *out <= hi)
        return true;
    char why[96];
    snprintf(why, sizeof(why), "%s: a whole number from %" PRIu64 " to %" PRIu64 " expected",
             name, lo, hi);
    fail(req, 400, why);
    return false;
}

static void unknown_field(tern_http_req *req, const char *name) {
    char why[96];
    snprintf(why, sizeof(why), "unknown field %s", name);
    fail(req, 400, why);
}

static void missing_field(tern_http_req *req, const char *name) {
    char why[64];
    snprintf(why, sizeof(why), "missing %s", name);
    fail(req, 400, why);
}

/* ---- POST /history ------------------------------------------------------- */

/* What a page collects: the answer, and the seq of the last message put. */
typedef struct history_page {
    out_buf *o;
    size_t n;
    uint64_t last_seq;
} history_page;

static void put_message(const tern_history_msg *m, void *user) {
    history_page *pg = user;
    if (pg->n++)
        put(pg->o, ",", 1);
    pg->last_seq = m->seq;
    static const char ours[] = "{\"topic\":";
    /* tern serve's own messages (/pubsub, /publish) are JSON objects: as
     * they are. A --bench-routes /fanout/pub message is anything: said so. */
    if (m->opcode == TERN_WS_TEXT && m->len >= sizeof(ours) - 1 &&
        memcmp(m->data, ours, sizeof(ours) - 1) == 0)
        put(pg->o, m->data, m->len);
    else if (m->opcode == TERN_WS_TEXT) {
        putf(pg->o, "{\"seq\":%" PRIu64 ",\"text\":", m->seq);
        put_str(pg->o, m->data, m->len);
        put(pg->o, "}", 1);
    } else {
        putf(pg->o, "{\"seq\":%" PRIu64 ",\"binary\":%zu}", m->seq, m->len);
    }
}

/* What POST /history asks. */
typedef struct history_call {
    char topic[TERN_TOPIC_MAX + 1];
    uint64_t from, limit, epoch;
    bool newest;
} history_call;

static bool history_field(tern_http_req *req, app_json_reader *r, const char *name, void *call) {
    history_call *c = call;
    if (!strcmp(name, "topic"))
        return text_field(req, r, "topic", c->topic, sizeof(c->topic)) > 0;
    if (!strcmp(name, "from"))
        return uint_field(req, r, "from", 0, INT64_MAX, &c->from);
    if (!strcmp(name, "limit"))
        return uint_field(req, r, "limit", 1, API_LIMIT_MAX, &c->limit);
    if (!strcmp(name, "order")) {
        char order[8];
        if (app_json_string(r, order, sizeof(order)) < 0 ||
            (strcmp(order, "oldest") && strcmp(order, "newest"))) {
            fail(req, 400, "order: \"oldest\" or \"newest\" expected");
            return false;
        }
        c->newest = order[0] == 'n';
        return true;
    }
    if (!strcmp(name, "epoch")) {
        char e[20], *end;
        if (app_json_string(r, e, sizeof(e)) <= 0 || strlen(e) > 16 ||
            (c->epoch = strtoull(e, &end, 16)) == 0 || *end) {
            fail(req, 400, "epoch: 1 to 16 hex digits expected, not 0");
            return false;
        }
        return true;
    }
    unknown_field(req, name);
    return false;
}

static void on_history(tern_http_req *req, void *user) {
    serve_ctx *ctx = user;
    app_json_reader r;
    history_call c = {.limit = API_LIMIT_DEFAULT};
    if (!begin(req, ctx, &r) || !read_fields(req, &r, history_field, &c))
        return;
    if (!c.topic[0]) {
        missing_field(req, "topic");
        return;
    }
    out_buf o = {0};
    put(&o, "{\"topic\":", 9);
    put_str(&o, c.topic, strlen(c.topic));
    /* The messages go into a buffer of their own: the head, which says
     * the epoch, comes first but is known only after the read. */
    out_buf msgs = {0};
    history_page pg = {.o = &msgs};
    tern_history_info info;
    long n = tern_topic_history(ctx->first, c.topic, c.from, (size_t)c.limit, c.newest,
                                put_message, &pg, &info);
    if (n < 0 && n != -ENOENT) {
        free(o.p);
        free(msgs.p);
        fail(req, 500, tern_strerror((int)n));
        return;
    }
    if (c.epoch && c.epoch != info.epoch) {
        free(o.p);
        free(msgs.p);
        char b[96];
        int k = info.epoch
                    ? snprintf(b, sizeof(b),
                               "{\"error\":\"epoch changed\",\"epoch\":\"%016" PRIx64 "\"}\n",
                               info.epoch)
                    : snprintf(b, sizeof(b), "{\"error\":\"epoch changed\",\"epoch\":null}\n");
        tern_http_respond(req, 409, "application/json", b, (size_t)k);
        return;
    }
    if (info.epoch)
        putf(&o, ",\"epoch\":\"%016" PRIx64 "\"", info.epoch);
    else
        put(&o, ",\"epoch\":null", 13);
    putf(&o, ",\"first\":%" PRIu64 ",\"last\":%" PRIu64 ",\"messages\":[", info.first, info.last);
    put(&o, msgs.p ? msgs.p : "", msgs.len);
    o.oom |= msgs.oom;
    free(msgs.p);
    /* A full page may have a next one: from the seq after its last. */
    bool more = pg.n == c.limit && (c.newest ? pg.last_seq > info.first : pg.last_seq < info.last);
    if (more)
        putf(&o, "],\"next\":%" PRIu64, c.newest ? pg.last_seq - 1 : pg.last_seq + 1);
    else
        put(&o, "],\"next\":null", 13);
    send_out(req, &o);
}

/* ---- POST /topics -------------------------------------------------------- */

/* What POST /topics asks. */
typedef struct topics_call {
    char prefix[TERN_TOPIC_MAX + 1], after[TERN_TOPIC_MAX + 1];
    uint64_t limit;
} topics_call;

static bool topics_field(tern_http_req *req, app_json_reader *r, const char *name, void *call) {
    topics_call *c = call;
    if (!strcmp(name, "prefix") || !strcmp(name, "after")) {
        char why[64];
        long n = app_json_string(r, name[0] == 'p' ? c->prefix : c->after, TERN_TOPIC_MAX + 1);
        if (n >= 0)
            return true;   /* "" too: every topic, from the first */
        snprintf(why, sizeof(why), n == -2 ? "%s too long (256 bytes at most)"
                                           : "%s: a string expected", name);
        fail(req, 400, why);
        return false;
    }
    if (!strcmp(name, "limit"))
        return uint_field(req, r, "limit", 1, API_LIMIT_MAX, &c->limit);
    unknown_field(req, name);
    return false;
}

static void on_topics(tern_http_req *req, void *user) {
    serve_ctx *ctx = user;
    app_json_reader r;
    topics_call c = {.limit = API_LIMIT_DEFAULT};
    if (!begin(req, ctx, &r) || !read_fields(req, &r, topics_field, &c))
        return;
    tern_topic_info *v = malloc(sizeof(*v) * c.limit);
    bool more = false;
    long n = v ? tern_topic_list(ctx->first, c.prefix, c.after, v, (size_t)c.limit, &more)
               : -ENOMEM;
    if (n < 0) {
        free(v);
        fail(req, 500, tern_strerror((int)n));
        return;
    }
    out_buf o = {0};
    put(&o, "{\"topics\":[", 11);
    for (long i = 0; i < n; i++) {
        put(&o, i ? ",{\"topic\":" : "{\"topic\":", i ? 10 : 9);
        put_str(&o, v[i].name, v[i].len);
        putf(&o, ",\"subscribers\":%zu,\"epoch\":\"%016" PRIx64 "\",\"seq\":%" PRIu64
                 ",\"history\":%s}",
             v[i].subscribers, v[i].epoch, v[i].seq, v[i].history ? "true" : "false");
    }
    put(&o, "],\"next\":", 9);
    if (more)
        put_str(&o, v[n - 1].name, v[n - 1].len);
    else
        put(&o, "null", 4);
    free(v);
    send_out(req, &o);
}

/* ---- POST /publish: one message to several topics ------------------------ */

typedef char topic_name[TERN_TOPIC_MAX + 1];

/* The "topics" array into t (API_BATCH_MAX), checked whole: how many, or
 * 0 once answered. */
static size_t read_topics(tern_http_req *req, app_json_reader *r, topic_name *t) {
    bool ok;
    size_t n = 0;
    if (!app_json_array(r)) {
        fail(req, 400, "topics: an array of strings expected");
        return 0;
    }
    while (app_json_element(r, &ok)) {
        if (n == API_BATCH_MAX) {
            fail(req, 400, "topics: 100 at most");
            return 0;
        }
        if (!text_field(req, r, "a topic", t[n], sizeof(t[n])))
            return 0;
        for (size_t i = 0; i < n; i++)
            if (!strcmp(t[i], t[n])) {
                fail(req, 400, "topics: a topic is named twice");
                return 0;
            }
        n++;
    }
    if (!ok)
        fail(req, 400, "bad JSON");
    else if (n == 0)
        fail(req, 400, "topics: at least one expected");
    return ok ? n : 0;
}

/* What POST /publish asks: topics[0 .. nt), data a JSON string token
 * (NULL: not given), key ("" none). */
typedef struct batch_call {
    topic_name *topics;
    size_t nt;
    const char *data;
    size_t dlen;
    char key[TERN_KEY_MAX + 1];
} batch_call;

static bool batch_field(tern_http_req *req, app_json_reader *r, const char *name, void *call) {
    batch_call *c = call;
    if (!strcmp(name, "topics"))
        return (c->nt = read_topics(req, r, c->topics)) > 0;
    if (!strcmp(name, "data")) {
        if (app_json_string_token(r, &c->data, &c->dlen))
            return true;
        fail(req, 400, "data: a string expected");
        return false;
    }
    if (!strcmp(name, "key"))
        return text_field(req, r, "key", c->key, sizeof(c->key)) > 0;
    unknown_field(req, name);
    return false;
}

static void on_publish_batch(tern_http_req *req, void *user) {
    serve_ctx *ctx = user;
    app_json_reader r;
    if (!begin(req, ctx, &r))
        return;
    batch_call c = {.topics = malloc(sizeof(topic_name) * API_BATCH_MAX)};
    if (c.topics == NULL) {
        fail(req, 500, "out of memory");
        return;
    }
    bool read = read_fields(req, &r, batch_field, &c);
    if (read && (c.nt == 0 || c.data == NULL))
        missing_field(req, c.nt == 0 ? "topics" : "data");
    if (!read || c.nt == 0 || c.data == NULL) {
        free(c.topics);
        return;
    }
    const char *key = c.key[0] ? c.key : NULL;
    out_buf o = {0};
    put(&o, "{\"results\":[", 12);
    for (size_t i = 0; i < c.nt; i++) {
        size_t tl = strlen(c.topics[i]);
        int64_t seq = app_serve_publish_data(ctx->first, c.topics[i], tl, key, c.data, c.dlen);
        put(&o, i ? ",{\"topic\":" : "{\"topic\":", i ? 10 : 9);
        put_str(&o, c.topics[i], tl);
        if (seq < 0)
            putf(&o, ",\"error\":\"%s\"}", tern_strerror((int)seq));
        else
            putf(&o, ",\"seq\":%" PRId64 ",\"subscribers\":%zu}", seq,
                 tern_topic_subscribers_all(ctx->first, c.topics[i]));
    }
    put(&o, "]", 1);
    free(c.topics);
    send_out(req, &o);
}

/* ---- POST /disconnect, POST /unsubscribe: a user's connections ----------- */

/* A call on a user's connections, posted to every loop and answered on
 * the admin loop (home) once the last loop has run it. Invariants:
 * pending counts the loops yet to run it; req is NULL once its client has
 * gone (the abort, on home); answer() frees it, once, on home. */
typedef struct user_job {
    tern_http_req *req;
    tern_loop *home;
    bool unsubscribe;
    int code;
    char user[API_USER_MAX + 1], topic[TERN_TOPIC_MAX + 1], reason[API_REASON_MAX + 1];
    char event[48 + APP_JSON_ESCAPE_MAX * TERN_TOPIC_MAX];   /* the unsubscribed event */
    size_t event_len;
    atomic_int pending;
    atomic_size_t done;   /* connections closed or unsubscribed */
} user_job;

static void job_aborted(tern_http_req *req, void *user) {
    (void)req;
    ((user_job *)user)->req = NULL;
}

static void answer(tern_loop *loop, void *user) {
    (void)loop;
    user_job *job = user;
    if (job->req) {
        out_buf o = {0};
        put(&o, "{\"user\":", 8);
        put_str(&o, job->user, strlen(job->user));
        if (job->unsubscribe) {
            put(&o, ",\"topic\":", 9);
            put_str(&o, job->topic, strlen(job->topic));
        }
        putf(&o, ",\"%s\":%zu", job->unsubscribe ? "unsubscribed" : "disconnected",
             atomic_load(&job->done));
        send_out(job->req, &o);
    }
    free(job);
}

/* One loop is done with the job; the last one has it answered on home. */
static void job_ran(user_job *job, tern_loop *loop) {
    if (atomic_fetch_sub(&job->pending, 1) != 1)
        return;
    if (loop == job->home || tern_loop_post(job->home, answer, job) < 0)
        answer(job->home, job);   /* on home; or, out of memory, never answered elsewhere */
}

static void close_one(tern_ws *ws, void *user) {
    user_job *job = user;
    tern_ws_close(ws, job->code, job->reason);
    atomic_fetch_add(&job->done, 1);
}

static void unsubscribe_one(tern_ws *ws, void *user) {
    user_job *job = user;
    if (tern_ws_unsubscribe(ws, job->topic) == 0) {
        tern_ws_send(ws, job->event, job->event_len, TERN_WS_TEXT);
        atomic_fetch_add(&job->done, 1);
    }
}

static void job_run(tern_loop *loop, void *user) {
    user_job *job = user;
    app_token_conns_of(job->user, job->unsubscribe ? unsubscribe_one : close_one, job);
    job_ran(job, loop);
}

/* Posts job to every loop of the public servers (loop 0's, this one, too). */
static void job_start(tern_http_req *req, serve_ctx *ctx, user_job *job) {
    int n = tern_server_peer_count(ctx->first);
    job->req = req;
    job->home = tern_http_req_loop(req);
    atomic_init(&job->pending, n);
    atomic_init(&job->done, 0);
    tern_http_on_abort(req, job_aborted, job);
    for (int i = 0; i < n; i++)
        if (tern_loop_post(tern_server_loop(tern_server_peer(ctx->first, i)), job_run, job) < 0)
            job_ran(job, job->home);   /* that loop's connections are not reached */
}

/* The fields of both calls, read into the job. */
static bool user_field(tern_http_req *req, app_json_reader *r, const char *name, void *call) {
    user_job *job = call;
    uint64_t code;
    if (!strcmp(name, "user"))
        return text_field(req, r, "user", job->user, sizeof(job->user)) > 0;
    if (job->unsubscribe && !strcmp(name, "topic"))
        return text_field(req, r, "topic", job->topic, sizeof(job->topic)) > 0;
    if (!job->unsubscribe && !strcmp(name, "code")) {
        if (!app_json_uint(r, &code) || (code != 1000 && (code < 3000 || code > 4999))) {
            fail(req, 400, "code: 1000, or 3000 to 4999 expected");
            return false;
        }
        job->code = (int)code;
        return true;
    }
    if (!job->unsubscribe && !strcmp(name, "reason")) {
        if (app_json_string(r, job->reason, sizeof(job->reason)) >= 0)
            return true;
        fail(req, 400, "reason: a string of 123 bytes at most expected");
        return false;
    }
    unknown_field(req, name);
    return false;
}

static void on_user_call(tern_http_req *req, serve_ctx *ctx, bool unsubscribe) {
    app_json_reader r;
    if (!begin(req, ctx, &r))
        return;
    user_job *job = calloc(1, sizeof(*job));
    if (job == NULL) {
        fail(req, 500, "out of memory");
        return;
    }
    job->unsubscribe = unsubscribe;
    job->code = 4000;
    strcpy(job->reason, "disconnected");
    if (!read_fields(req, &r, user_field, job)) {
        free(job);
        return;
    }
    if (!job->user[0] || (unsubscribe && !job->topic[0])) {
        missing_field(req, job->user[0] ? "topic" : "user");
        free(job);
        return;
    }
    if (unsubscribe) {
        size_t tl = strlen(job->topic);
        memcpy(job->event, "{\"event\":\"unsubscribed\",\"topic\":\"", 33);
        size_t o = 33 + app_json_escape(job->event + 33, sizeof(job->event) - 36, job->topic, tl);
        memcpy(job->event + o, "\"}", 2);
        job->event_len = o + 2;
    }
    job_start(req, ctx, job);
}

static void on_disconnect(tern_http_req *req, void *user) { on_user_call(req, user, false); }
static void on_unsubscribe(tern_http_req *req, void *user) { on_user_call(req, user, true); }

int app_serve_api_routes(serve_ctx *ctx) {
    int err;
    if ((err = tern_http_route(ctx->admin, "POST", "/history", on_history, ctx)) < 0 ||
        (err = tern_http_route(ctx->admin, "POST", "/topics", on_topics, ctx)) < 0 ||
        (err = tern_http_route(ctx->admin, "POST", "/publish", on_publish_batch, ctx)) < 0 ||
        (err = tern_http_route(ctx->admin, "POST", "/disconnect", on_disconnect, ctx)) < 0)
        return err;
    return tern_http_route(ctx->admin, "POST", "/unsubscribe", on_unsubscribe, ctx);
}
