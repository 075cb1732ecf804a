/* The client's opening handshake (RFC 6455 §4.1): the URL, the outbound
 * connection (TCP or Unix, with TLS for wss), the upgrade request, and
 * the checks on the server's answer, up to the switch to a tern_ws.
 *
 * From tern_ws_connect to the 101 the connection is a ws_dial, a protocol
 * of its own on net's connection; the 101 moves it into a tern_ws with a
 * client endpoint, as an HTTP server connection is moved after its 101, so
 * one frame reader and one writer serve both roles.
 *
 * A host name is resolved first, by c-ares on the loop (tern_ws_connecting
 * below): nothing here blocks. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/un.h>

#include "http/parser.h"
#include "net/crypto.h"
#include "net/resolve.h"
#include "net/tls.h"
#include "tern/client.h"
#include "tern/url.h"
#include "ws/handshake.h"
#include "ws/ws.h"

#define DIAL_MAX_HEAD 16384
#define DIAL_MAX_HEADERS 64
/* ALPN of a wss dial: the upgrade is an HTTP/1.1 request (RFC 6455 §4.1;
 * WebSocket over HTTP/2, RFC 8441, is not spoken). */
#define WS_CLIENT_ALPN "\x08http/1.1"
#define DIAL_MAX_ADDRS 8    /* addresses of one name tried, in the resolver's order */

/* A client's endpoint, and the copies of the strings it refers to. It
 * belongs to the dial until the 101, then to the tern_ws; whichever is
 * the last to hold it frees it (tern__ws_client_release). */
typedef struct ws_client {
    tern__ws_endpoint ep;   /* first: the tern_ws points here */
    char **subprotocols;    /* ep.opt.subprotocols, NULL-terminated; NULL when none */
} ws_client;

/* The addresses a URL's host resolved to, tried in turn until one
 * connects (a name such as localhost often resolves to ::1 before
 * 127.0.0.1, and a server may listen on only one of them). next: the one
 * to try after the current attempt. */
typedef struct dial_addrs {
    int n, next;
    socklen_t len[DIAL_MAX_ADDRS];
    struct sockaddr_storage ss[DIAL_MAX_ADDRS];
} dial_addrs;

/* A connection between tern_ws_connect and its 101 or its failure: one
 * attempt at one address; a connect that fails hands everything to a new
 * dial for the next address (dial_retry). While the host name resolves,
 * the dial waits unstarted, its addrs empty.
 * Invariants: p is the connect this dial is the attempt of (p->dial == the
 * dial), until the end is reported or the 101 opens the WebSocket (then
 * NULL); cl is owned here until tern__ws_open takes it; request is
 * the upgrade request until on_connect sends it (then NULL); reported is
 * set once on_connect_error has been called, and nothing is called after;
 * deadline (the loop's clock, ms) bounds all attempts and the handshake. */
typedef struct ws_dial {
    tern__conn conn;
    tern_ws_connecting *p;
    ws_client *cl;
    char *request;
    size_t request_len;
    size_t scanned;         /* tern__http_find_head_end's position */
    char *where;            /* "host:port" or "unix:path", for messages */
    dial_addrs *addrs;
    char *server_name;      /* wss: SNI and the name verified */
    tern__tls_client *tls;  /* wss: the context, freed with the dial */
    tern__tls_verify verify; /* wss: why a verification failed */
    uint32_t timeout_ms;
    int rcvbuf;             /* SO_RCVBUF for each attempt's socket; 0: the system's */
    uint64_t deadline;
    char accept[TERN__WS_ACCEPT_LEN + 1];
    bool pmd_offered;
    bool connected;
    bool reported;
} ws_dial;

void tern__ws_client_release(const tern__ws_endpoint *ep) {
    ws_client *cl = (ws_client *)ep;
    if (cl == NULL)
        return;
    for (size_t i = 0; cl->subprotocols && cl->subprotocols[i]; i++)
        free(cl->subprotocols[i]);
    free(cl->subprotocols);
    free(cl);
}

/* Frees what the dial holds besides the endpoint and the request (both
 * may have moved on); safe to call twice. */
static void dial_release(ws_dial *d) {
    free(d->where);
    d->where = NULL;
    free(d->addrs);
    d->addrs = NULL;
    free(d->server_name);
    d->server_name = NULL;
    tern__tls_client_free(d->tls);
    d->tls = NULL;
}

/* A dial that never started a connection: all it holds. */
static void dial_free_unstarted(ws_dial *d) {
    free(d->request);
    dial_release(d);
    tern__ws_client_release(&d->cl->ep);
    free(d);
}

static bool dial_retry(ws_dial *d);
static int dial_start(tern_loop *loop, ws_dial *d);
static void connecting_cancel_all(tern_loop *loop);
static void report(ws_dial *d, int err, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---- the connect: the name's resolution ------------------------------- */

/* A connect from tern_ws_connect to its on_open or on_connect_error (the
 * handle tern_ws_connect2 gives): the dial (its attempt under way, or,
 * while the host name resolves, waiting for addresses) and the name's
 * resolution (net/resolve.h: c-ares on the loop, a channel per connect,
 * so that its servers are the connect's option).
 * A cancel (tern_ws_connect_cancel) only sets cancelled and the timer, at
 * once: the connect ends from the timer (connecting_cancel), so that its
 * on_connect_error comes from the loop, never from inside the cancel.
 * Invariants: q is non-NULL exactly while the name resolves; dial->p ==
 * this; started says the dial's connection is net's (an attempt is under
 * way); timer is NULL until a cancel, then armed at once (a cancel that
 * cannot have it ends with the resolution or the attempt); once
 * cancelled, the connect's one on_connect_error says -ECANCELED, whatever
 * ends it; the connect is on its loop's list (connecting_list) until it
 * is freed. */
struct tern_ws_connecting {
    tern_loop *loop;
    ws_dial *dial;
    tern_timer *timer;
    tern__resolve *q;
    tern_ws_connecting *next, *prev;
    bool started;
    bool cancelled;
};

/* The ws client's loop slot (its connecting_list), keyed at first use. */
static int client_slot(void) {
    static _Atomic int key;
    return tern__loop_slot_key(&key);
}

/* The loop's pending connects (its slot's block, client_slot), for
 * tern_loop_free to cancel. */
typedef struct connecting_list {
    tern_ws_connecting *head;
} connecting_list;

/* Ends the resolution, if one is under way. */
static void resolve_end(tern_ws_connecting *p) {
    tern__resolve_cancel(p->q);
    p->q = NULL;
}

/* The connect is over (reported, or open): what is left of it. */
static void connecting_free(tern_ws_connecting *p) {
    if (p == NULL)
        return;
    resolve_end(p);
    tern_timer_stop(p->timer);
    connecting_list *l = *tern__loop_slot(p->loop, client_slot());
    if (p->prev)
        p->prev->next = p->next;
    else
        l->head = p->next;
    if (p->next)
        p->next->prev = p->prev;
    free(p);
}

/* A cancelled connect ends here, from the loop: a resolution or a dial
 * not started is freed, an attempt under way closed (dial_close reports). */
static void connecting_cancel(tern_ws_connecting *p) {
    ws_dial *d = p->dial;
    if (p->started) {
        tern__conn_close(&d->conn, -ECANCELED);
        return;
    }
    resolve_end(p);
    report(d, -ECANCELED, 0, "the connect to %s was cancelled", d->where);
    dial_free_unstarted(d);
}

static void connecting_timer(tern_timer *t, void *user) {
    (void)t;
    connecting_cancel(user);
}

/* The name's answer, from the loop: the dial starts with its addresses,
 * or the connect fails. */
static void dns_answer(void *user, int err, const char *why, const struct sockaddr_storage *ss,
                       const socklen_t *len, int n) {
    tern_ws_connecting *p = user;
    ws_dial *d = p->dial;
    p->q = NULL;   /* over, and freed */
    if (p->cancelled) {
        connecting_cancel(p);
        return;
    }
    dial_addrs *a = d->addrs;
    for (int i = 0; i < n && a->n < DIAL_MAX_ADDRS; i++) {
        memcpy(&a->ss[a->n], &ss[i], len[i]);
        a->len[a->n++] = len[i];
    }
    char msg[300];
    if (err == -ETIMEDOUT) {
        snprintf(msg, sizeof(msg), "%s: the name did not resolve within %u ms", d->where,
                 d->timeout_ms);
    } else if (err < 0) {
        snprintf(msg, sizeof(msg), "cannot resolve %s: %s", d->where, why);
    } else if ((err = dial_start(p->loop, d)) == 0) {
        p->started = true;
        return;   /* the connect goes on; its outcome comes from the dial */
    } else {
        snprintf(msg, sizeof(msg), "cannot connect to %s: %s", d->where, strerror(-err));
    }
    report(d, err, 0, "%s", msg);
    dial_free_unstarted(d);
}

/* Starts resolving host (for port): 0, after which the loop carries it
 * on (dns_answer); or a negative error with nothing started. */
static int resolve_begin(tern_ws_connecting *p, const char *host, int port, const char *servers) {
    return tern__resolve_start(&p->q, p->loop, host, port, servers, p->dial->timeout_ms,
                               dns_answer, p);
}

/* ---- failure ---------------------------------------------------------- */

/* The one on_connect_error of a connect; the connect is over then. */
static void report(ws_dial *d, int err, int status, const char *fmt, ...) {
    if (d->reported)
        return;
    d->reported = true;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (d->p && d->p->cancelled) {
        /* Whatever ended it (a timeout, an answer in the same batch). */
        err = -ECANCELED;
        status = 0;
        snprintf(msg, sizeof(msg), "the connect to %s was cancelled", d->where);
    }
    connecting_free(d->p);
    d->p = NULL;
    tern_ws_connect_error e = {err, status, d->connected, msg};
    d->cl->ep.h.on_connect_error(&e, d->cl->ep.user);
}

/* Only from the dial's own events (the loop's callbacks). */
#define DIAL_FAIL(d, err, status, ...)                                                        \
    do {                                                                                      \
        report((d), (err), (status), __VA_ARGS__);                                            \
        tern__conn_close(&(d)->conn, (err));                                                  \
    } while (0)

/* ---- the server's answer ---------------------------------------------- */

static bool has_token(const tern__http_response_head *h, const char *name, const char *token) {
    for (size_t i = 0; i < h->num_headers; i++) {
        const tern__http_header *f = &h->headers[i];
        if (f->name_len == strlen(name) && strncasecmp(f->name, name, f->name_len) == 0 &&
            tern__http_has_token(f->value, f->value_len, token))
            return true;
    }
    return false;
}

/* Checks a complete response head (§4.1, the client's steps 1-6) and
 * switches to WebSocket. rest: the bytes after the head. */
static void on_answer(ws_dial *d, const tern__http_response_head *h, const char *rest,
                      size_t rest_len) {
    if (h->status != 101) {
        DIAL_FAIL(d, -EPROTO, h->status, "%s answered %d %.*s, not 101 Switching Protocols",
                  d->where, h->status, (int)(h->reason_len > 100 ? 100 : h->reason_len),
                  h->reason ? h->reason : "");
        return;
    }
    if (!has_token(h, "Upgrade", "websocket") || !has_token(h, "Connection", "upgrade")) {
        DIAL_FAIL(d, -EPROTO, 0, "%s answered 101 without Upgrade: websocket and Connection: Upgrade",
                  d->where);
        return;
    }
    const tern__http_header *acc = tern__http_response_header(h, "Sec-WebSocket-Accept");
    if (acc == NULL || acc->value_len != TERN__WS_ACCEPT_LEN ||
        memcmp(acc->value, d->accept, TERN__WS_ACCEPT_LEN) != 0) {
        DIAL_FAIL(d, -EPROTO, 0, "%s answered with a wrong Sec-WebSocket-Accept (%.*s, expected %s)",
                  d->where, acc ? (int)(acc->value_len > 64 ? 64 : acc->value_len) : 4,
                  acc ? acc->value : "none", d->accept);
        return;
    }
    if (d->p && d->p->cancelled) {   /* too late to open: the cancel's timer is due */
        DIAL_FAIL(d, -ECANCELED, 0, "the connect to %s was cancelled", d->where);
        return;
    }
    const tern__ws_endpoint *ep = &d->cl->ep;
    int sub = -1;
    const tern__http_header *proto = tern__http_response_header(h, "Sec-WebSocket-Protocol");
    if (proto) {
        for (int i = 0; ep->opt.subprotocols && ep->opt.subprotocols[i]; i++)
            if (strlen(ep->opt.subprotocols[i]) == proto->value_len &&
                memcmp(ep->opt.subprotocols[i], proto->value, proto->value_len) == 0)
                sub = i;
        if (sub < 0) {
            DIAL_FAIL(d, -EPROTO, 0, "%s chose the subprotocol %.*s, which was not offered",
                      d->where, (int)(proto->value_len > 64 ? 64 : proto->value_len), proto->value);
            return;
        }
    }
    tern__pmd_params pmd;
    bool pmd_on = false;
    const tern__http_header *ext = tern__http_response_header(h, "Sec-WebSocket-Extensions");
    if (ext && ext->value_len) {
        if (!d->pmd_offered ||
            tern__pmd_client_accept(ext->value, ext->value_len, &ep->pmd, &pmd) != 1) {
            DIAL_FAIL(d, -EPROTO, 0, "%s answered with extensions that were not offered: %.*s",
                      d->where, (int)(ext->value_len > 100 ? 100 : ext->value_len), ext->value);
            return;
        }
        pmd_on = true;
    }
    /* The endpoint goes with the connection; the dial is freed by net
     * without on_close. */
    ws_client *cl = d->cl;
    dial_release(d);   /* the session holds its own reference to the TLS context */
    connecting_free(d->p);   /* over: the connect is the WebSocket now */
    d->p = NULL;
    int err = tern__ws_open(&d->conn, &cl->ep, cl->ep.user, sub, pmd_on ? &pmd : NULL, rest,
                            rest_len, NULL);
    if (err < 0)
        DIAL_FAIL(d, err, 0, "out of memory opening the WebSocket");
}

/* ---- the dial's events ------------------------------------------------ */

static size_t dial_data(tern__conn *c, char *data, size_t len) {
    ws_dial *d = (ws_dial *)c;
    size_t end = tern__http_find_head_end(data, len, &d->scanned);
    if (end == 0) {
        if (len >= DIAL_MAX_HEAD)
            DIAL_FAIL(d, -EPROTO, 0, "%s sent a response head over %d bytes", d->where,
                      DIAL_MAX_HEAD);
        return 0;   /* kept, and handed again with what follows */
    }
    tern__http_header headers[DIAL_MAX_HEADERS];
    tern__http_response_head h;
    ssize_t n = tern__http_parse_response(data, end, DIAL_MAX_HEAD, &h, headers, DIAL_MAX_HEADERS);
    if (n <= 0) {
        DIAL_FAIL(d, -EPROTO, 0, "%s sent a malformed response head (%zd)", d->where, -n);
        return len;
    }
    on_answer(d, &h, data + n, len - (size_t)n);
    return len;
}

static void dial_connect(tern__conn *c) {
    ws_dial *d = (ws_dial *)c;
    d->connected = true;
    tern__conn_write(c, d->request, d->request_len);
    free(d->request);
    d->request = NULL;
}

static void dial_eof(tern__conn *c) {
    ws_dial *d = (ws_dial *)c;
    DIAL_FAIL(d, -ECONNRESET, 0, "%s closed the connection during the handshake", d->where);
}

static void dial_timeout(tern__conn *c) {
    ws_dial *d = (ws_dial *)c;
    DIAL_FAIL(d, -ETIMEDOUT, 0,
              d->connected ? "%s: no handshake answer within %u ms" : "%s: no connection within %u ms",
              d->where, d->timeout_ms);
}

static void dial_close(tern__conn *c, int err) {
    ws_dial *d = (ws_dial *)c;
    if (!d->reported && !d->connected && err != -ETIMEDOUT && !(d->p && d->p->cancelled) &&
        dial_retry(d))
        return;   /* the next address is being tried: it has everything */
    if (!d->reported) {
        /* A verification that failed inside a write reaches net as
         * -EKEYREJECTED; verify says what it was, whichever error came
         * first. */
        if (err == -EKEYREJECTED || d->verify != 0)
            report(d, -EKEYREJECTED, 0, "%s: TLS certificate verification failed: %s", d->where,
                   tern__tls_verify_string(d->verify));
        else if (err == -EPROTO && d->tls)
            report(d, err, 0, "%s: TLS handshake failed", d->where);
        else if (d->connected)
            report(d, err ? err : -ECONNRESET, 0, "%s: connection lost during the handshake: %s",
                   d->where, strerror(err ? -err : ECONNRESET));
        else
            report(d, err ? err : -ECONNRESET, 0, "cannot connect to %s: %s", d->where,
                   strerror(err ? -err : ECONNRESET));
    }
    free(d->request);
    dial_release(d);
    tern__ws_client_release(&d->cl->ep);
}

static void dial_nothing(tern__conn *c) { (void)c; }

static const tern__conn_proto dial_proto = {
    .on_data = dial_data,
    .on_eof = dial_eof,
    .on_drain = dial_nothing,
    .on_timeout = dial_timeout,
    .on_shutdown = dial_nothing,
    .on_close = dial_close,
    .on_connect = dial_connect,
};

/* ---- the URL and the request ------------------------------------------ */

/* A user's extra header: "Name: value", a token name, no line breaks,
 * and none of the headers the handshake itself sets. */
static bool header_ok(const char *hd) {
    static const char *const reserved[] = {"host", "upgrade", "connection", "content-length",
                                           "transfer-encoding", NULL};
    const char *colon = strchr(hd, ':');
    if (colon == NULL || colon == hd)
        return false;
    for (const char *p = hd; p < colon; p++)
        if ((unsigned char)*p <= 0x20 || (unsigned char)*p >= 0x7f ||
            strchr("()<>@,;:\\\"/[]?={}", *p))
            return false;
    for (const char *p = colon; *p; p++)
        if (*p == '\r' || *p == '\n' || *p == '\0')
            return false;
    size_t n = (size_t)(colon - hd);
    if (n >= 14 && strncasecmp(hd, "sec-websocket-", 14) == 0)
        return false;
    for (int i = 0; reserved[i]; i++)
        if (strlen(reserved[i]) == n && strncasecmp(hd, reserved[i], n) == 0)
            return false;
    return true;
}

/* Appends to a growing request; false when out of memory. */
static bool put(char **buf, size_t *len, size_t *cap, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(*buf ? *buf + *len : NULL, *buf ? *cap - *len : 0, fmt, ap);
        va_end(ap);
        if (n < 0)
            return false;
        if (*buf && (size_t)n < *cap - *len) {
            *len += (size_t)n;
            return true;
        }
        size_t want = (*cap ? *cap : 512) + (size_t)n + 1;
        char *b = realloc(*buf, want * 2);
        if (b == NULL)
            return false;
        *buf = b;
        *cap = want * 2;
    }
}

/* The upgrade request (§4.1) and the accept value it calls for. */
static int make_request(ws_dial *d, const tern_url *u, const tern_ws_client_options *opt) {
    unsigned char nonce[16];
    char key[TERN__BASE64_SIZE(16)];
    if (tern__crypto_random(nonce, sizeof(nonce)) < 0)
        return -ENOMEM;
    tern__crypto_base64(nonce, sizeof(nonce), key);   /* 24 chars and a NUL */
    tern__ws_accept(key, 24, d->accept);
    const tern__ws_endpoint *ep = &d->cl->ep;
    char *b = NULL;
    size_t len = 0, cap = 0;
    bool ok = put(&b, &len, &cap,
                  "GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n",
                  u->target, u->authority, key);
    for (size_t i = 0; ok && ep->opt.subprotocols && ep->opt.subprotocols[i]; i++)
        ok = put(&b, &len, &cap, "%s%s", i ? ", " : "Sec-WebSocket-Protocol: ",
                 ep->opt.subprotocols[i]);
    if (ok && ep->opt.subprotocols && ep->opt.subprotocols[0])
        ok = put(&b, &len, &cap, "\r\n");
    if (ok && ep->pmd.enabled) {
        char offer[200];
        ok = tern__pmd_client_offer(&ep->pmd, offer, sizeof(offer)) > 0 &&
             put(&b, &len, &cap, "Sec-WebSocket-Extensions: %s\r\n", offer);
        d->pmd_offered = true;
    }
    for (size_t i = 0; ok && opt && opt->headers && opt->headers[i]; i++)
        ok = put(&b, &len, &cap, "%s\r\n", opt->headers[i]);
    if (ok)
        ok = put(&b, &len, &cap, "\r\n");
    if (!ok) {
        free(b);
        return -ENOMEM;
    }
    d->request = b;
    d->request_len = len;
    return 0;
}

/* ---- connecting ------------------------------------------------------- */

/* Starts d's connect to its next address, and to the ones after while a
 * connect fails at once (an IPv6 address without a route, say). 0: one
 * is under way, and its outcome comes from the loop; else the last
 * error, with nothing started. */
static int dial_start(tern_loop *loop, ws_dial *d) {
    int err = TERN_ENOHOST;
    while (d->addrs->next < d->addrs->n) {
        int i = d->addrs->next++;
        struct sockaddr *sa = (struct sockaddr *)&d->addrs->ss[i];
        char where[TERN_ADDRSTRLEN + 8];
        if (sa->sa_family == AF_UNIX)
            snprintf(where, sizeof(where), "unix:%s", ((struct sockaddr_un *)sa)->sun_path);
        else if (tern_addr_format(sa, d->addrs->len[i], where, sizeof(where)) < 0)
            snprintf(where, sizeof(where), "an address of family %d", sa->sa_family);
        char *w = strdup(where);
        if (w == NULL)
            return -ENOMEM;
        free(d->where);
        d->where = w;
        memset(&d->conn, 0, sizeof(d->conn));   /* as new: an attempt that failed may have used it */
        err = tern__conn_connect(loop, &d->conn, sa, d->addrs->len[i], d->rcvbuf, &dial_proto,
                                 NULL);
        if (err < 0)
            continue;
        if (d->tls && tern__tls_client_attach(&d->conn, d->tls, d->server_name, &d->verify) < 0) {
            d->addrs->next = d->addrs->n;   /* reported from the loop, no other address tried */
            tern__conn_close(&d->conn, -ENOMEM);
            return 0;
        }
        uint64_t now = tern_loop_now(loop);
        tern__conn_set_timeout(&d->conn, d->deadline > now ? (uint32_t)(d->deadline - now) : 1);
        return 0;
    }
    return err;
}

/* d's connect failed: the next address, in a new dial that takes over all
 * d holds (net frees d after this close). False when no address is left
 * or none could be started: then d reports its own failure. */
static bool dial_retry(ws_dial *d) {
    if (d->addrs == NULL || d->addrs->next >= d->addrs->n)
        return false;
    ws_dial *nd = calloc(1, sizeof(*nd));
    if (nd == NULL)
        return false;
    nd->p = d->p;
    nd->cl = d->cl;
    nd->request = d->request;
    nd->request_len = d->request_len;
    nd->addrs = d->addrs;
    nd->server_name = d->server_name;
    nd->tls = d->tls;
    nd->timeout_ms = d->timeout_ms;
    nd->rcvbuf = d->rcvbuf;
    nd->deadline = d->deadline;
    memcpy(nd->accept, d->accept, sizeof(nd->accept));
    nd->pmd_offered = d->pmd_offered;
    if (dial_start(d->conn.loop, nd) < 0) {
        free(nd->where);
        free(nd);
        return false;
    }
    if (nd->p)
        nd->p->dial = nd;
    free(d->where);   /* everything else is nd's now */
    return true;
}

/* The client's endpoint, with copies of the subprotocol names. */
static int make_client(ws_client **out, const tern_ws_handlers *h,
                       const tern_ws_client_options *opt, void *user) {
    ws_client *cl = calloc(1, sizeof(*cl));
    if (cl == NULL)
        return -ENOMEM;
    int err = tern__ws_endpoint_init(&cl->ep, h, opt ? &opt->ws : NULL, user, TERN__WS_CLIENT);
    if (err < 0) {
        free(cl);
        return err;
    }
    const char *const *subs = cl->ep.opt.subprotocols;
    size_t n = 0;
    while (subs && subs[n])
        n++;
    cl->ep.opt.subprotocols = NULL;
    if (n) {
        cl->subprotocols = calloc(n + 1, sizeof(char *));
        for (size_t i = 0; cl->subprotocols && i < n; i++)
            if ((cl->subprotocols[i] = strdup(subs[i])) == NULL)
                break;
        if (cl->subprotocols == NULL || cl->subprotocols[n - 1] == NULL) {
            tern__ws_client_release(&cl->ep);
            return -ENOMEM;
        }
        cl->ep.opt.subprotocols = (const char *const *)cl->subprotocols;
    }
    *out = cl;
    return 0;
}

/* The checks of tern_ws_connect's arguments, and its URL parsed into u. */
static int check_args(tern_loop *loop, const char *url, const tern_ws_handlers *h,
                      const tern_ws_client_options *opt, tern_url *u) {
    if (loop == NULL || url == NULL || h == NULL || h->on_connect_error == NULL ||
        (opt && opt->rcvbuf < 0))
        return -EINVAL;
    for (size_t i = 0; opt && opt->headers && opt->headers[i]; i++)
        if (!header_ok(opt->headers[i]))
            return -EINVAL;
    /* A URL of another scheme (redis://) has no request target. */
    return tern_url_parse(url, u, NULL) < 0 || u->target == NULL ? -EINVAL : 0;
}

/* The dial of a connect, everything but its connection: a becomes the
 * dial's. */
static int dial_make(ws_dial **out, tern_loop *loop, const tern_url *u, dial_addrs *a,
                     const tern_ws_handlers *h, const tern_ws_client_options *opt, void *user) {
    ws_dial *d = calloc(1, sizeof(*d));
    int err = d ? make_client(&d->cl, h, opt, user) : -ENOMEM;
    if (err < 0) {
        free(a);
        free(d);
        return err;
    }
    d->addrs = a;
    d->timeout_ms = opt && opt->connect_timeout_ms ? opt->connect_timeout_ms : 10000;
    d->rcvbuf = opt ? opt->rcvbuf : 0;
    d->deadline = tern_loop_now(loop) + d->timeout_ms;
    err = make_request(d, u, opt);
    if (err == 0) {
        char where[sizeof(u->host) + 8];
        snprintf(where, sizeof(where), "%s:%d", u->host, u->port);   /* until an address is tried */
        if ((d->where = strdup(where)) == NULL)
            err = -ENOMEM;
    }
    if (err == 0 && u->tls) {
        d->server_name = strdup(opt && opt->server_name ? opt->server_name : u->host);
        if (d->server_name == NULL)
            err = -ENOMEM;
        else if ((d->tls = tern__tls_client_new(opt ? opt->ca_file : NULL, opt && opt->insecure,
                                                WS_CLIENT_ALPN)) == NULL)
            err = -EPROTO;
    }
    if (err < 0) {
        dial_free_unstarted(d);
        return err;
    }
    *out = d;
    return 0;
}

/* Fills a with u's Unix socket or numeric address; false when u's host is
 * a name, to be resolved. */
static bool literal_addr(const tern_url *u, dial_addrs *a) {
    if (u->unix_socket) {
        struct sockaddr_un *un = (struct sockaddr_un *)&a->ss[0];
        un->sun_family = AF_UNIX;
        memcpy(un->sun_path, u->socket_path, strlen(u->socket_path));
        a->len[0] = (socklen_t)sizeof(*un);
        a->n = 1;
        return true;
    }
    struct sockaddr_in *in = (struct sockaddr_in *)&a->ss[0];
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&a->ss[0];
    if (inet_pton(AF_INET, u->host, &in->sin_addr) == 1) {
        in->sin_family = AF_INET;
        in->sin_port = htons((uint16_t)u->port);
        a->len[0] = (socklen_t)sizeof(*in);
    } else if (inet_pton(AF_INET6, u->host, &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((uint16_t)u->port);
        a->len[0] = (socklen_t)sizeof(*in6);
    } else {
        return false;
    }
    a->n = 1;
    return true;
}

/* tern_ws_connect, and tern__ws_connect_to with addrs (n of them) instead
 * of the URL's host. */
static int connect_start(tern_loop *loop, const char *url, const struct sockaddr *const *addrs,
                         const socklen_t *lens, int n, const tern_ws_handlers *h,
                         const tern_ws_client_options *opt, void *user,
                         tern_ws_connecting **out) {
    tern_url u;
    int err = check_args(loop, url, h, opt, &u);
    if (err < 0)
        return err;
    if (addrs && (n < 1 || n > DIAL_MAX_ADDRS))
        return -EINVAL;
    dial_addrs *a = calloc(1, sizeof(*a));
    if (a == NULL)
        return -ENOMEM;
    bool resolved = true;
    if (addrs) {
        for (int i = 0; i < n; i++) {
            if (lens[i] > sizeof(a->ss[0])) {
                free(a);
                return -EINVAL;
            }
            memcpy(&a->ss[i], addrs[i], lens[i]);
            a->len[i] = lens[i];
        }
        a->n = n;
    } else {
        resolved = literal_addr(&u, a);
    }
    ws_dial *d;
    if ((err = dial_make(&d, loop, &u, a, h, opt, user)) < 0)
        return err;
    void **slot = tern__loop_slot(loop, client_slot());
    if (*slot == NULL) {
        if ((*slot = calloc(1, sizeof(connecting_list))) == NULL) {
            dial_free_unstarted(d);
            return -ENOMEM;
        }
        tern__loop_set_slot_close(loop, client_slot(), connecting_cancel_all);
    }
    tern_ws_connecting *p = calloc(1, sizeof(*p));
    if (p == NULL) {
        dial_free_unstarted(d);
        return -ENOMEM;
    }
    p->loop = loop;
    p->dial = d;
    d->p = p;
    connecting_list *l = *slot;
    p->next = l->head;
    if (l->head)
        l->head->prev = p;
    l->head = p;
    /* Once started, the connection is net's: failures go through dial_close. */
    if (resolved)
        err = dial_start(loop, d);
    else
        err = resolve_begin(p, u.host, u.port, opt ? opt->dns_servers : NULL);
    if (err < 0) {
        connecting_free(p);
        dial_free_unstarted(d);
        return err;
    }
    p->started = resolved;
    if (out)
        *out = p;
    return 0;
}

int tern_ws_connect(tern_loop *loop, const char *url, const tern_ws_handlers *h,
                    const tern_ws_client_options *opt, void *user) {
    return connect_start(loop, url, NULL, NULL, 0, h, opt, user, NULL);
}

int tern_ws_connect2(tern_loop *loop, const char *url, const tern_ws_handlers *h,
                     const tern_ws_client_options *opt, void *user, tern_ws_connecting **out) {
    if (out == NULL)
        return -EINVAL;
    *out = NULL;
    return connect_start(loop, url, NULL, NULL, 0, h, opt, user, out);
}

void tern_ws_connect_cancel(tern_ws_connecting *p) {
    if (p == NULL || p->cancelled)
        return;
    p->cancelled = true;
    /* Out of memory for the timer: the cancel stays recorded, and the
     * connect's end (at the latest its deadline) says -ECANCELED. */
    int err = p->timer ? tern_timer_again(p->timer, 0)
                       : tern_timer_start(p->loop, &p->timer, 0, 0, connecting_timer, p);
    (void)err;   /* either way: see above */
}

/* tern_loop_free with connects still pending: each is cancelled now (its
 * on_connect_error runs from inside tern_loop_free; there is no later
 * batch). One that on_connect_error starts is cancelled in turn. */
static void connecting_cancel_all(tern_loop *loop) {
    connecting_list *l = *tern__loop_slot(loop, client_slot());
    while (l->head) {
        l->head->cancelled = true;
        connecting_cancel(l->head);   /* frees it, off the list */
    }
}

int tern__ws_connect_to(tern_loop *loop, const char *url, const struct sockaddr *const *addrs,
                        const socklen_t *lens, int n, const tern_ws_handlers *h,
                        const tern_ws_client_options *opt, void *user,
                        tern_ws_connecting **out) {
    if (addrs == NULL || lens == NULL)
        return -EINVAL;
    return connect_start(loop, url, addrs, lens, n, h, opt, user, out);
}
