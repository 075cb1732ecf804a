/* The access log: an entry per response, queued on the loop and handed to
 * the server's access function at the batch end, so the function never
 * runs inside a call the user made (a response ends inside
 * tern_http_respond). */
#include <stdlib.h>
#include <string.h>

#include "http/server.h"

/* Strings are offsets into the queue's text: it may move as it grows. */
typedef struct access_entry {
    tern_server *srv;          /* NULL once its server is gone: skipped */
    tern_http_access e;        /* its string pointers unset until the flush */
    size_t peer, method, target;
} access_entry;

/* The access log's loop slot (its access_queue), keyed at first use. */
static int access_slot(void) {
    static _Atomic int key;
    return tern__loop_slot_key(&key);
}

/* The loop's queue (its slot's block, access_slot). Invariant: e[0..n) wait
 * for the batch end, their strings NUL-terminated in text[0..text_len);
 * between batches n is 0 and e and text are freed, so the block alone is
 * what tern_loop_free has to free. */
typedef struct access_queue {
    access_entry *e;
    size_t n, cap;
    char *text;
    size_t text_len, text_cap;
} access_queue;

static void flush(tern_loop *loop) {
    access_queue *q = *tern__loop_slot(loop, access_slot());
    if (q == NULL || q->n == 0)
        return;
    /* An access function that makes a response (unusual) appends: the
     * loop picks those up too, re-reading e and text each time. */
    for (size_t i = 0; i < q->n; i++) {
        access_entry a = q->e[i];
        if (a.srv == NULL || a.srv->cfg->access_fn == NULL)
            continue;
        tern_http_access entry = a.e;
        entry.peer = q->text + a.peer;
        entry.method = q->text + a.method;
        entry.target = q->text + a.target;
        a.srv->cfg->access_fn(a.srv, &entry, a.srv->cfg->access_user);
    }
    free(q->e);
    free(q->text);
    memset(q, 0, sizeof(*q));
}

static size_t put_text(access_queue *q, const char *s, size_t len, bool *ok) {
    if (q->text_len + len + 1 > q->text_cap) {
        size_t cap = q->text_cap ? q->text_cap * 2 : 1024;
        while (cap < q->text_len + len + 1)
            cap *= 2;
        char *t = realloc(q->text, cap);
        if (t == NULL) {
            *ok = false;
            return 0;
        }
        q->text = t;
        q->text_cap = cap;
    }
    size_t off = q->text_len;
    memcpy(q->text + off, s, len);
    q->text[off + len] = '\0';
    q->text_len += len + 1;
    return off;
}

/* A credential in the query (`?token=`: browsers can give a WebSocket no
 * Authorization header) never reaches the log: the value of a parameter
 * named token or access_token becomes "-", in place (the string only
 * shrinks). */
static void redact_query(char *target) {
    char *p = strchr(target, '?');
    while (p) {
        char *name = p + 1, *eq = strchr(name, '='), *end = strchr(name, '&');
        if (eq && (end == NULL || eq < end)) {
            size_t nlen = (size_t)(eq - name);
            char *val = eq + 1, *vend = end ? end : val + strlen(val);
            if (((nlen == 5 && memcmp(name, "token", 5) == 0) ||
                 (nlen == 12 && memcmp(name, "access_token", 12) == 0)) && vend > val) {
                *val = '-';
                memmove(val + 1, vend, strlen(vend) + 1);
                end = end ? val + 1 : NULL;
            }
        }
        p = end;
    }
}

/* Queues e (its strings copied: peer NUL-terminated, method and target
 * of mlen and tlen bytes); an allocation failure loses the entry, nothing
 * else. */
static void queue(tern_server *srv, const tern_http_access *e, const char *peer,
                  const char *method, size_t mlen, const char *target, size_t tlen) {
    void **slot = tern__loop_slot(srv->loop, access_slot());
    if (*slot == NULL) {
        if ((*slot = calloc(1, sizeof(access_queue))) == NULL)
            return;
        tern__loop_set_slot_hook(srv->loop, access_slot(), flush);
    }
    access_queue *q = *slot;
    if (q->n == q->cap) {
        size_t cap = q->cap ? q->cap * 2 : 16;
        access_entry *grown = realloc(q->e, cap * sizeof(*grown));
        if (grown == NULL)
            return;
        q->e = grown;
        q->cap = cap;
    }
    bool ok = true;
    access_entry *a = &q->e[q->n];
    a->srv = srv;
    a->e = *e;
    a->peer = put_text(q, peer, strlen(peer), &ok);
    a->method = put_text(q, method, mlen, &ok);
    a->target = put_text(q, target, tlen, &ok);
    if (ok) {
        redact_query(q->text + a->target);
        q->n++;
    }
}

/* An entry of a response on conn (NULL: none left). */
static void record(tern_server *srv, const tern__conn *conn, const char *method, size_t mlen,
                   const char *target, size_t tlen, int status, uint64_t bytes,
                   uint64_t duration_ms) {
    char peer[TERN_ADDRSTRLEN] = "-";
    struct sockaddr_storage ss;
    socklen_t sl;
    if (conn && tern__peer(conn, &ss, &sl) == 0 &&
        tern_addr_format((struct sockaddr *)&ss, sl, peer, sizeof(peer)) < 0)
        strcpy(peer, "-");
    tern_http_access e = {.status = status, .bytes = bytes, .duration_ms = duration_ms};
    queue(srv, &e, peer, method, mlen, target, tlen);
}

void tern__http_access_record_entry(tern_server *srv, const tern_http_access *e) {
    if (srv->cfg->access_fn)
        queue(srv, e, e->peer, e->method, strlen(e->method), e->target, strlen(e->target));
}

void tern__http_access_begin(tern_http_req *req) {
    if (req->srv->cfg->access_fn)
        req->start_ms = tern_loop_now(req->srv->loop);
}

void tern__http_access_keep(tern_http_req *req) {
    const tern__http_head *h = req->head;
    if (req->srv->cfg->access_fn == NULL || req->ended || h == NULL || req->access_copy)
        return;
    char *c = malloc(h->method_len + h->target_len + 2);
    if (c == NULL)
        return;
    memcpy(c, h->method, h->method_len);
    c[h->method_len] = '\0';
    memcpy(c + h->method_len + 1, h->target, h->target_len);
    c[h->method_len + 1 + h->target_len] = '\0';
    req->access_copy = c;
}

void tern__http_access_record(tern_http_req *req, int status) {
    tern_server *srv = req->srv;
    if (srv->cfg->access_fn == NULL)
        return;
    const char *m = "-", *t = "-";
    size_t ml = 1, tl = 1;
    if (req->live && req->head) {
        m = req->head->method;
        ml = req->head->method_len;
        t = req->head->target;
        tl = req->head->target_len;
    } else if (req->access_copy) {
        m = req->access_copy;
        ml = strlen(m);
        t = m + ml + 1;
        tl = strlen(t);
    }
    uint64_t now = tern_loop_now(srv->loop);
    record(srv, req->conn, m, ml, t, tl, status, req->bytes_out,
           req->start_ms && now > req->start_ms ? now - req->start_ms : 0);
}

void tern__http_access_record_error(tern_server *srv, const tern__conn *c, int status,
                                    uint64_t bytes, const char *m, size_t ml, const char *t,
                                    size_t tl) {
    if (srv->cfg->access_fn)
        record(srv, c, m, ml, t, tl, status, bytes, 0);
}

void tern__http_access_drop(tern_server *srv) {
    access_queue *q = *tern__loop_slot(srv->loop, access_slot());
    if (q == NULL)
        return;
    for (size_t i = 0; i < q->n; i++)
        if (q->e[i].srv == srv)
            q->e[i].srv = NULL;
    /* The loop may not run again: free what only dropped entries hold. */
    bool any = false;
    for (size_t i = 0; i < q->n; i++)
        any |= q->e[i].srv != NULL;
    if (!any) {
        free(q->e);
        free(q->text);
        memset(q, 0, sizeof(*q));
    }
}
