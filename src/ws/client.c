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
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/un.h>

#include <ares.h>

#include "http/parser.h"
#include "net/crypto.h"
#include "net/tls.h"
#include "tern/client.h"
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

/* One socket c-ares has open, as a loop watcher. */
typedef struct dns_sock {
    tern__io io;
    tern_ws_connecting *p;
    struct dns_sock *next;
} dns_sock;

/* A connect from tern_ws_connect to its on_open or on_connect_error (the
 * handle tern_ws_connect2 gives): the dial (its attempt under way, or,
 * while the host name resolves, waiting for addresses) and the name's
 * resolution.
 * The resolution is c-ares driven by the loop: the connect has a channel
 * of its own (so that ending a resolution is ares_destroy, and its servers
 * are the connect's option); c-ares says through its socket state
 * callback which sockets to watch (dns_sock), and its timeouts and the
 * connect's deadline share one precise timer.
 * A cancel (tern_ws_connect_cancel) only sets cancelled and the timer, at
 * once: the connect ends from the timer (connecting_cancel), so that its
 * on_connect_error comes from the loop, never from inside the cancel.
 * Invariants: chan is non-NULL exactly while the name resolves; socks has
 * a watcher for each socket c-ares has open on chan, none once chan is
 * gone; dial->p == this; started says the dial's connection is net's (an
 * attempt is under way); timer (NULL for a connect that resolved nothing,
 * until a cancel) is armed while resolving, at c-ares' next timeout or the
 * deadline, whichever is first, or at once when the answer is in or the
 * connect is cancelled; resolved says the answer is in (dns_status, and
 * the dial's addrs); once cancelled, the connect's one on_connect_error
 * says -ECANCELED, whatever ends it; the connect is on its loop's list
 * (connecting_list) until it is freed. */
struct tern_ws_connecting {
    tern_loop *loop;
    ws_dial *dial;
    tern_timer *timer;
    ares_channel chan;
    dns_sock *socks;
    tern_ws_connecting *next, *prev;
    int dns_status;
    bool resolved;
    bool started;
    bool cancelled;
};

/* The loop's pending connects (its TERN__SLOT_WS_CLIENT block), for
 * tern_loop_free to cancel. */
typedef struct connecting_list {
    tern_ws_connecting *head;
} connecting_list;

static pthread_once_t ares_once = PTHREAD_ONCE_INIT;
static int ares_init_status;

static void ares_init_once(void) { ares_init_status = ares_library_init(ARES_LIB_INIT_ALL); }

static void dns_io(tern__io *io, uint32_t revents);

/* c-ares opened a socket, changed what it waits for, or is closing it
 * (neither readable nor writable: it closes the descriptor itself). */
static void dns_sock_state(void *data, ares_socket_t fd, int readable, int writable) {
    tern_ws_connecting *p = data;
    dns_sock **link = &p->socks;
    while (*link && (*link)->io.fd != fd)
        link = &(*link)->next;
    dns_sock *s = *link;
    uint32_t ev = (readable ? TERN__IO_IN : 0) | (writable ? TERN__IO_OUT : 0);
    if (ev == 0) {
        if (s) {
            tern__io_set(p->loop, &s->io, 0);
            *link = s->next;
            free(s);
        }
        return;
    }
    if (s == NULL) {
        /* Out of memory: the socket goes unwatched, and the deadline (or
         * c-ares' own timeouts) ends the resolution. */
        if ((s = calloc(1, sizeof(*s))) == NULL)
            return;
        tern__io_init(&s->io, fd, dns_io);
        s->p = p;
        s->next = p->socks;
        p->socks = s;
    }
    tern__io_set(p->loop, &s->io, ev);
}

/* Ends the resolution, if one is under way: the channel and its watchers go. */
static void resolve_end(tern_ws_connecting *p) {
    if (p->chan) {
        ares_channel chan = p->chan;
        p->chan = NULL;
        ares_destroy(chan);   /* closes its sockets (dns_sock_state); dns_done sees EDESTRUCTION */
    }
    while (p->socks) {
        dns_sock *s = p->socks;
        p->socks = s->next;
        tern__io_set(p->loop, &s->io, 0);
        free(s);
    }
}

/* The connect is over (reported, or open): what is left of it. */
static void connecting_free(tern_ws_connecting *p) {
    if (p == NULL)
        return;
    resolve_end(p);
    tern_timer_stop(p->timer);
    connecting_list *l = *tern__loop_slot(p->loop, TERN__SLOT_WS_CLIENT);
    if (p->prev)
        p->prev->next = p->next;
    else
        l->head = p->next;
    if (p->next)
        p->next->prev = p->prev;
    free(p);
}

/* The answer, from inside ares_getaddrinfo (a name in /etc/hosts), from
 * ares_process_fd, or from ares_destroy. It only takes the addresses:
 * what follows is the loop's (resolve_step), outside c-ares' calls. */
static void dns_done(void *arg, int status, int timeouts, struct ares_addrinfo *res) {
    tern_ws_connecting *p = arg;
    if (status != ARES_EDESTRUCTION) {
        p->resolved = true;
        p->dns_status = status;
        dial_addrs *a = p->dial->addrs;
        for (struct ares_addrinfo_node *n = res && status == ARES_SUCCESS ? res->nodes : NULL;
             n && a->n < DIAL_MAX_ADDRS; n = n->ai_next)
            if ((n->ai_family == AF_INET || n->ai_family == AF_INET6) &&
                n->ai_addrlen <= sizeof(a->ss[0])) {
                memcpy(&a->ss[a->n], n->ai_addr, n->ai_addrlen);
                a->len[a->n++] = n->ai_addrlen;
            }
    }
    if (res)
        ares_freeaddrinfo(res);
}

/* Sets the timer for what comes next: now when the answer is in, else
 * c-ares' next timeout or the deadline, whichever is first. */
static void resolve_arm(tern_ws_connecting *p) {
    uint64_t now = tern_loop_now(p->loop);
    uint64_t ms = p->dial->deadline > now ? p->dial->deadline - now : 0;
    struct timeval tv, *next = p->resolved ? NULL : ares_timeout(p->chan, NULL, &tv);
    if (p->resolved)
        ms = 0;
    else if (next && (uint64_t)next->tv_sec * 1000 + (uint64_t)(next->tv_usec + 999) / 1000 < ms)
        ms = (uint64_t)next->tv_sec * 1000 + (uint64_t)(next->tv_usec + 999) / 1000;
    tern_timer_again(p->timer, ms);
}

/* From the loop (a watcher or the timer): the answer is in, and the dial
 * starts or fails; or the deadline passed; or nothing yet. */
static void resolve_step(tern_ws_connecting *p) {
    ws_dial *d = p->dial;
    if (p->cancelled)
        return;   /* the timer, armed at once, ends it */
    if (!p->resolved && tern_loop_now(p->loop) < d->deadline) {
        resolve_arm(p);
        return;
    }
    resolve_end(p);
    int err;
    char msg[300];
    if (!p->resolved) {
        err = -ETIMEDOUT;
        snprintf(msg, sizeof(msg), "%s: the name did not resolve within %u ms", d->where,
                 d->timeout_ms);
    } else if (d->addrs->n == 0) {
        err = TERN_ENOHOST;
        snprintf(msg, sizeof(msg), "cannot resolve %s: %s", d->where,
                 ares_strerror(p->dns_status == ARES_SUCCESS ? ARES_ENODATA : p->dns_status));
    } else if ((err = dial_start(p->loop, d)) == 0) {
        p->started = true;
        return;   /* the connect goes on; its outcome comes from the dial */
    } else {
        snprintf(msg, sizeof(msg), "cannot connect to %s: %s", d->where, strerror(-err));
    }
    report(d, err, 0, "%s", msg);
    dial_free_unstarted(d);
}

static void dns_io(tern__io *io, uint32_t revents) {
    dns_sock *s = tern__container_of(io, dns_sock, io);
    tern_ws_connecting *p = s->p;
    ares_socket_t fd = io->fd;
    bool rd = revents & (TERN__IO_IN | TERN__IO_ERR | TERN__IO_HUP);
    bool wr = revents & (TERN__IO_OUT | TERN__IO_ERR);
    /* May close the socket, and free s. */
    ares_process_fd(p->chan, rd ? fd : ARES_SOCKET_BAD, wr ? fd : ARES_SOCKET_BAD);
    resolve_step(p);
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
    tern_ws_connecting *p = user;
    if (p->cancelled) {
        connecting_cancel(p);
        return;
    }
    if (!p->resolved)
        ares_process_fd(p->chan, ARES_SOCKET_BAD, ARES_SOCKET_BAD);   /* c-ares' timeouts */
    resolve_step(p);
}

/* Starts resolving host (for port): 0, after which the loop carries it
 * on (resolve_step); or a negative error with nothing started. */
static int resolve_begin(tern_ws_connecting *p, const char *host, int port, const char *servers) {
    pthread_once(&ares_once, ares_init_once);
    if (ares_init_status != ARES_SUCCESS)
        return -ENOMEM;
    struct ares_options o = {.sock_state_cb = dns_sock_state, .sock_state_cb_data = p};
    int st = ares_init_options(&p->chan, &o, ARES_OPT_SOCK_STATE_CB);
    if (st != ARES_SUCCESS) {
        p->chan = NULL;
        return st == ARES_ENOMEM ? -ENOMEM : TERN_ENOHOST;
    }
    if (servers && ares_set_servers_ports_csv(p->chan, servers) != ARES_SUCCESS)
        return -EINVAL;
    int err = tern_timer_start(p->loop, &p->timer, p->dial->timeout_ms, 0, connecting_timer, p);
    if (err < 0)
        return err;
    char service[8];
    snprintf(service, sizeof(service), "%d", port);
    struct ares_addrinfo_hints hints = {.ai_flags = ARES_AI_NUMERICSERV, .ai_family = AF_UNSPEC,
                                        .ai_socktype = SOCK_STREAM};
    ares_getaddrinfo(p->chan, host, service, &hints, dns_done, p);
    resolve_arm(p);
    return 0;
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
        /* A verification that failed inside a write reaches net as any
         * failed write (-EPIPE); verify says what it was. */
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

/* What a URL names. host is the name or address (no brackets); hostport
 * is the Host header's value. */
typedef struct ws_url {
    bool tls, unix_socket;
    char host[256];
    char hostport[300];
    int port;
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    const char *target;   /* within the URL, or "/" */
} ws_url;

static bool target_ok(const char *t) {
    for (; *t; t++)
        if ((unsigned char)*t <= 0x20 || (unsigned char)*t >= 0x7f || *t == '#')
            return false;   /* §3: no fragment; no spaces or controls in a request line */
    return true;
}

static int parse_url(const char *url, ws_url *u) {
    memset(u, 0, sizeof(*u));
    const char *p;
    if (strncasecmp(url, "ws://", 5) == 0)
        p = url + 5;
    else if (strncasecmp(url, "wss://", 6) == 0)
        p = url + 6, u->tls = true;
    else if (strncasecmp(url, "ws+unix:", 8) == 0)
        p = url + 8, u->unix_socket = true;
    else if (strncasecmp(url, "wss+unix:", 9) == 0)
        p = url + 9, u->tls = u->unix_socket = true;
    else
        return -EINVAL;
    if (u->unix_socket) {
        /* ws+unix:SOCKET[:/target] */
        if (*p == '\0')
            return -EINVAL;
        const char *t = strstr(p + 1, ":/");
        size_t n = t ? (size_t)(t - p) : strlen(p);
        if (n >= sizeof(u->path))
            return -EINVAL;
        memcpy(u->path, p, n);
        u->target = t ? t + 1 : "/";
        strcpy(u->host, "localhost");
        strcpy(u->hostport, "localhost");
        return target_ok(u->target) ? 0 : -EINVAL;
    }
    const char *auth = p;
    size_t alen = strcspn(auth, "/?#");
    const char *rest = auth + alen;
    if (alen == 0 || memchr(auth, '@', alen))
        return -EINVAL;   /* no host; userinfo is not for WebSocket URIs (§3) */
    const char *hend;
    const char *colon;
    if (auth[0] == '[') {
        const char *rb = memchr(auth, ']', alen);
        if (rb == NULL || rb == auth + 1)
            return -EINVAL;
        if ((size_t)(rb - auth - 1) >= sizeof(u->host))
            return -EINVAL;
        memcpy(u->host, auth + 1, (size_t)(rb - auth - 1));
        unsigned char a6[16];
        if (inet_pton(AF_INET6, u->host, a6) != 1)
            return -EINVAL;
        hend = rb + 1;
        colon = hend < auth + alen ? hend : NULL;
        if (colon && *colon != ':')
            return -EINVAL;
    } else {
        colon = memchr(auth, ':', alen);
        hend = colon ? colon : auth + alen;
        if (hend == auth || (size_t)(hend - auth) >= sizeof(u->host))
            return -EINVAL;
        memcpy(u->host, auth, (size_t)(hend - auth));
    }
    u->port = u->tls ? 443 : 80;
    bool explicit_port = false;
    if (colon) {
        const char *d = colon + 1;
        int port = 0;
        if (d == auth + alen)
            return -EINVAL;
        for (; d < auth + alen; d++) {
            if (*d < '0' || *d > '9' || port > 65535)
                return -EINVAL;
            port = port * 10 + (*d - '0');
        }
        if (port < 1 || port > 65535)
            return -EINVAL;
        u->port = port;
        explicit_port = true;
    }
    /* The Host header: the authority as given, without a default port. */
    snprintf(u->hostport, sizeof(u->hostport), "%.*s", (int)(hend - auth), auth);
    if (explicit_port && u->port != (u->tls ? 443 : 80))
        snprintf(u->hostport + strlen(u->hostport), sizeof(u->hostport) - strlen(u->hostport),
                 ":%d", u->port);
    u->target = *rest == '\0' ? "/" : rest;
    if (*rest == '?')
        return -EINVAL;   /* "ws://h?q": no path; ask for "ws://h/?q" */
    return target_ok(u->target) ? 0 : -EINVAL;
}

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
static int make_request(ws_dial *d, const ws_url *u, const tern_ws_client_options *opt) {
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
                  u->target, u->hostport, key);
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
        else
            tern_addr_format(sa, d->addrs->len[i], where, sizeof(where));
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
                      const tern_ws_client_options *opt, ws_url *u) {
    if (loop == NULL || url == NULL || h == NULL || h->on_connect_error == NULL ||
        (opt && opt->rcvbuf < 0))
        return -EINVAL;
    for (size_t i = 0; opt && opt->headers && opt->headers[i]; i++)
        if (!header_ok(opt->headers[i]))
            return -EINVAL;
    return parse_url(url, u);
}

/* The dial of a connect, everything but its connection: a becomes the
 * dial's. */
static int dial_make(ws_dial **out, tern_loop *loop, const ws_url *u, dial_addrs *a,
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
static bool literal_addr(const ws_url *u, dial_addrs *a) {
    if (u->unix_socket) {
        struct sockaddr_un *un = (struct sockaddr_un *)&a->ss[0];
        un->sun_family = AF_UNIX;
        memcpy(un->sun_path, u->path, strlen(u->path));
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
    ws_url u;
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
    void **slot = tern__loop_slot(loop, TERN__SLOT_WS_CLIENT);
    if (*slot == NULL) {
        if ((*slot = calloc(1, sizeof(connecting_list))) == NULL) {
            dial_free_unstarted(d);
            return -ENOMEM;
        }
        tern__loop_set_slot_close(loop, TERN__SLOT_WS_CLIENT, connecting_cancel_all);
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
    if (p->timer)
        tern_timer_again(p->timer, 0);
    else
        tern_timer_start(p->loop, &p->timer, 0, 0, connecting_timer, p);
}

/* tern_loop_free with connects still pending: each is cancelled now (its
 * on_connect_error runs from inside tern_loop_free; there is no later
 * batch). One that on_connect_error starts is cancelled in turn. */
static void connecting_cancel_all(tern_loop *loop) {
    connecting_list *l = *tern__loop_slot(loop, TERN__SLOT_WS_CLIENT);
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
