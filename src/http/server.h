/* Private side of the HTTP server: the server, its connections, and the
 * request in flight. */
#ifndef TERN_HTTP_SERVER_H
#define TERN_HTTP_SERVER_H

#include <pthread.h>
#include <stdatomic.h>

#include "loop/check.h"
#include "loop/counter.h"
#include "http/chunked.h"
#include "http/parser.h"
#include "http/router.h"
#include "loop/bytes.h"
#include "net/conn.h"
#include "tern/http.h"
#include "tern/tls.h"

#define TERN__MAX_LISTENERS 8

/* What a route leads to. */
typedef struct tern__http_route {
    tern_http_handler fn;
    void *user;
    bool stream;                     /* the handler reads the body as a stream */
    struct tern__http_route *next;   /* the server's list, for freeing */
    char method[33];                 /* as registered; "" for any method */
} tern__http_route;

/* What a TLS listener's accepts need: the server, and the certificates
 * (a reference held until the server is freed, since handshakes still in
 * progress after the listener closed use it for SNI). */
typedef struct tern__https_listener {
    struct tern_server *srv;
    tern_tls *tls;
    int index;                       /* in srv->listeners */
} tern__https_listener;

typedef struct tern__vhost tern__vhost;

/* A protocol reached by upgrading an HTTP connection (WebSocket). */
typedef struct tern__upgrade_hook {
    /* Called for a request with upgrade headers, while req is live (its
     * host is req->host). Returns 1 when it took the connection (it sent
     * the response itself and moved the connection; rest is the bytes
     * after the head), 0 when the path is not its own (HTTP routing goes
     * on), or -status to refuse with that HTTP status (headers it added to
     * req go with it). */
    int (*try_upgrade)(tern_http_req *req, const tern__http_head *head, const char *rest,
                       size_t rest_len);
    /* For a plain request no HTTP route takes: the protocol's name when the
     * path is one of the host's routes (answered 426 with Upgrade: name),
     * or NULL. */
    const char *(*owns_path)(const tern__vhost *vh, const char *path, size_t path_len);
    void (*free)(tern__vhost *vh);   /* the host is being freed */
} tern__upgrade_hook;

/* What requests for one host name are routed by: the HTTP routes, static
 * roots, the not-found handler and the ws module's routes. The
 * configuration's default host takes the names no other host has. */
struct tern__vhost {
    char *name;                      /* lower case, without a port; NULL for the default */
    size_t name_len;
    tern__router *router;
    tern__http_route *routes;
    tern__http_route not_found;      /* tern_http_not_found(); fn NULL when unset */
    struct tern__static *statics;    /* static roots, closed with the configuration */
    void *ws;                        /* the ws module's routes of this host, or NULL */
    tern_server *handle;             /* tern_server_host()'s handle; NULL for the default */
    tern__vhost *next;
};

/* One address's (IPv4, or IPv6 /64) open connections, for
 * max_connections_per_ip. */
typedef struct tern__http_addr {
    uint64_t key;                    /* the IPv4 address, or the /64 prefix */
    uint32_t count;                  /* open connections from it; 0: on the free list */
    uint16_t next;                   /* the next on its bucket's chain or the free list; 0 ends */
    bool v6;
} tern__http_addr;

/* The connection limits of a configuration, counted over every loop that
 * shares it (admit.c). Invariants: open is the number of connections
 * admitted and not yet released; addrs[1..used) are each either on the
 * chain of their key's bucket (count > 0) or on the free list (count 0);
 * a connection's owner_tag is the index of its address in addrs, or 0
 * when it is not counted by address (Unix socket, table full); nbuckets
 * is cap, a power of two. lock guards everything but open. */
typedef struct tern__http_admission {
    _Atomic uint32_t open;
    pthread_mutex_t lock;
    tern__http_addr *addrs;
    uint16_t *buckets;
    uint32_t cap, used;
    uint16_t free_head;
} tern__http_admission;

/* Module slots: a layer above http (pub/sub) keeps its per-server and
 * per-configuration state in a slot it owns (srv->slots[which],
 * cfg->slots[which]), so http's structs name none of its fields, counters
 * or hooks. The owner takes its key at its first use
 * (tern__srv_slot_key), so http names none of the modules; it registers
 * its functions in cfg->modules[which] before it fills either slot; the
 * layers below call them through these, never by name. */
enum { TERN__SRV_SLOTS_MAX = 4 };
/* The key of the module slot of a module whose key variable is *key
 * (tern__key_once: 0 before the first call, from any thread). */
int tern__srv_slot_key(_Atomic int *key);

struct tern_ws;

typedef struct tern__srv_module {
    void (*ws_closed)(tern_server *srv, struct tern_ws *ws);   /* a WebSocket of srv ends */
    void (*ws_drained)(tern_server *srv, struct tern_ws *ws);  /* its backlog went out */
    void (*server_free)(tern_server *srv);     /* srv (whose slot is set) is being freed */
    void (*config_free)(void *slot);           /* the configuration (its slot) is */
} tern__srv_module;

/* The configuration: everything a server is told before it serves.
 * Shared, by reference, by every server made with tern_server_clone (one
 * per loop, under tern_run one per thread), and read-only while any of
 * them serves, so loops read it without locks (but for the modules'
 * slots, made at first use, atomically, by whichever thread). Invariants: once shared
 * is set, nothing in it changes until the last reference goes (adding
 * routes then fails with -EBUSY); peers[i] is the server of index i (NULL
 * once freed); peers is filled before the servers run on their threads. */
typedef struct tern__server_config {
    /* One per server using it, and one per tern__config_ref a module
     * holds (a message posted to a loop and not yet run or dropped, which
     * finds its server in peers). */
    _Atomic int refs;
    bool shared;                     /* a clone exists: frozen */
    tern_server_options opt;         /* defaults applied; server_header not kept */
    tern__http_limits limits;
    char server_line[80];            /* "Server: tern\r\n" or "" */
    size_t server_line_len;
    tern__http_admission admit;      /* max_connections, max_connections_per_ip (admit.c) */
    tern__vhost host;                /* the default host */
    tern__vhost *hosts;              /* the named hosts */
    const tern__upgrade_hook *upgrade;   /* set by the ws module when it has routes */
    tern_http_access_fn access_fn;   /* tern_server_set_access_log(); NULL when unset */
    void *access_user;
    tern_server **peers;             /* the servers sharing this configuration */
    int npeers;
    /* The loops tern_run makes (0 outside it), known before its setup runs
     * on the first: what a module sizing per-loop state then (pub/sub's
     * topics made in setup) must count, beyond npeers' one. */
    int nloops_planned;
    bool reuseport;                  /* tern_listen* set SO_REUSEPORT (under tern_run) */
    struct tern__run *run;           /* the tern_run that made the servers, or NULL */
    /* The modules' shared state (made at first use by whichever thread;
     * each module keeps its own lock) and their functions. */
    _Atomic(void *) slots[TERN__SRV_SLOTS_MAX];
    const tern__srv_module *_Atomic modules[TERN__SRV_SLOTS_MAX];
} tern__server_config;

/* One listener as it was asked for, so that tern_run can open the same
 * on the other loops (the bound port, after port 0). */
typedef struct tern__listen_spec {
    char *host;                      /* TCP: as given (NULL for any); Unix: the path */
    int port;                        /* TCP: the port bound; -1 for Unix */
    tern_tls *tls;                   /* TLS listeners: the certificates (the server's reference) */
    tern_listen_options opt;
} tern__listen_spec;

/* The loop's counters (tern_server_stats). Only the server's loop writes
 * them, with relaxed loads and stores (plain moves, no locked
 * instruction); any thread may read them. */
typedef struct tern__server_counters {
    _Atomic uint64_t refused_max, refused_ip;   /* accepted, then refused with 503 (admit.c) */
    _Atomic uint64_t accepted, closed, requests, ws_in, ws_out, bytes_in, bytes_out;
    /* listening sockets open, and of them those not accepting now */
    _Atomic uint64_t listeners, listeners_paused;
    /* tern_server_ws_sessions: ended sessions by bucket (not cumulative),
     * the sum of their lengths in ms, and their count */
    _Atomic uint64_t ws_len[TERN_HISTOGRAM_BUCKETS], ws_len_sum_ms, ws_len_count;
    /* tern_server_responses: by status, [status - TERN_HTTP_STATUS_MIN] */
    _Atomic uint64_t status[TERN_HTTP_STATUS_COUNT];
} tern__server_counters;


/* One of the loop's counters += n (loop/counter.h: the loop is its only
 * writer). */
#define TERN__STAT_ADD(srv, field, n) TERN__COUNTER_ADD((srv)->stats.field, n)

/* Counts a response with this status (tern_server_responses); one
 * relaxed add in the loop's own array, so writing a response takes no
 * lock. A status outside 100-599 is not counted. */
#define TERN__STAT_STATUS(srv, code)                                                      \
    do {                                                                                   \
        unsigned tern__i = (unsigned)((code) - TERN_HTTP_STATUS_MIN);                      \
        if (tern__i < TERN_HTTP_STATUS_COUNT)                                              \
            TERN__STAT_ADD(srv, status[tern__i], 1);                                       \
    } while (0)

/* The server of one loop: its listeners, connections, scratch space and
 * shutdown state, and a reference to the shared configuration (cfg).
 * Invariants: conns lists every live connection (HTTP or upgraded); once
 * shutting_down is set no listener is open; date holds the Date header for
 * wall second date_sec. The scratch_* fields are the views of the request
 * whose handler is running: one handler runs at a time per loop.
 * A host handle (tern_server_host) is a tern_server too, with loop NULL and
 * target its host: it only takes routes.
 * magic is TERN__MAGIC_SERVER from creation to tern_server_free
 * (loop/check.h). */
struct tern_server {
    uint32_t magic;
    tern_loop *loop;
    tern__server_config *cfg;
    tern__vhost *target;             /* where this handle's routes go */
    int index;                       /* in cfg->peers */
    tern__listener *listeners[TERN__MAX_LISTENERS];
    tern__listen_spec specs[TERN__MAX_LISTENERS];
    int nlisteners;
    tern__https_listener https[TERN__MAX_LISTENERS];   /* the TLS ones' accept contexts */
    int nhttps;
    tern__conn_list conns;
    tern__server_counters stats;
    /* The modules' state on this loop (cfg->modules), or NULL. Written by
     * the loop's thread alone (release), read by any (acquire): a module's
     * counters live there. */
    _Atomic(void *) slots[TERN__SRV_SLOTS_MAX];

    bool shutting_down;
    tern_server_done_fn done;
    void *done_user;
    tern_timer *shutdown_timer;
    /* tern_server_free called inside one of the loop's callbacks (its own
     * handler, say): the rest of the free, at the end of the iteration. */
    tern_timer *free_timer;
    /* Set by tern_server_free before it closes the connections: the
     * request whose handler called it ends when that handler returns. */
    bool freeing;

    int64_t date_sec;
    char date[40];                   /* "Date: Sun, 06 Nov 1994 08:49:37 GMT\r\n" */
    char server_line[80];            /* cfg's, copied next to the date */
    size_t server_line_len;

    tern__http_header scratch_headers[256];
    tern__http_head scratch_head;
    tern__route_params scratch_params;
    char *scratch_decoded;           /* the decoded route parameters (no longer than the path) */
    size_t scratch_decoded_cap;
};

enum tern__http_state {
    TERN__HTTP_IDLE,        /* between requests (or fresh): nothing of a request yet */
    TERN__HTTP_HEAD,        /* part of a head has arrived */
    TERN__HTTP_BODY,        /* reading a body: buffered, streamed or dropped (req.body_mode) */
    TERN__HTTP_WAIT,        /* head (and body) done; the response has not ended */
};

enum tern__body_mode { TERN__BODY_BUFFER, TERN__BODY_STREAM, TERN__BODY_DROP };

typedef struct tern__http_conn tern__http_conn;

/* HTTP/1.1's state of a request: its framing in both directions and
 * its connection's fate. Only h1.c and conn.c read it; a protocol that
 * frames its own way (a stream of a multiplexed connection) leaves it
 * zero. Reset with the request. */
typedef struct tern__h1_req {
    bool keep_alive;           /* the client asked to keep the connection */
    bool expect_continue;      /* client waits for "100 Continue" */
    bool continue_sent;
    bool chunked_out;          /* the response goes in the chunked coding */
    bool close_after;          /* Connection: close */
    int body_kind;             /* enum tern__http_body_kind */
    uint64_t body_left;        /* TERN__BODY_LENGTH: bytes still to read */
    uint64_t body_mark;        /* body_read when the body timeout was last armed */
    tern__chunked chunked;     /* the chunked body's decoder */
} tern__h1_req;

/* The request in flight on a stream (over HTTP/1.1: the connection's one
 * at a time). Its views (head, params, body) are set only while the
 * handler runs (live). The rest is what the protocol needs until the
 * response ends.
 * Invariant: conn is the connection the request came over while its
 * stream lives, and NULL once the stream is gone (detached: the
 * connection closed, or the peer reset the stream); the struct is then
 * freed when the response ends (tern__http_req_detach). The peer and TLS
 * facts are the connection's (tern__peer, tern__tls_*). proto is set with
 * conn; the response calls reach the wire only through it, and only
 * while conn is set. fields holds the handler's headers until proto
 * writes the head (then it is emptied, its buffer kept for the next
 * request). h1 is HTTP/1.1's alone (zero under another protocol). */
struct tern_http_req {
    tern__conn *conn;
    const struct tern__http_proto *proto;   /* how its response goes on the wire (proto.h) */
    tern_server *srv;
    const tern__vhost *host;   /* what routed it (the Host header's) */
    const tern__http_route *route;
    int status;                /* for the server's own answers (404, 405, refusals) */

    /* views, while live */
    bool live;                 /* its handler is running */
    bool dispatched;           /* the handler has it: only the response ends it */
    const tern__http_head *head;
    const tern__route_params *params;
    const char *body;
    size_t body_len;

    /* what is known of the request */
    uint8_t minor_version;     /* tern_http_minor_version: HTTP/1.x's x */
    bool tls;                  /* it came over TLS */
    bool is_head;              /* HEAD: no body in the response */
    uint64_t body_read;        /* bytes of body read so far (decoded) */
    uint8_t body_mode;         /* enum tern__body_mode */
    bool body_done;
    tern__h1_req h1;

    /* buffered body (non-streaming routes, when it spans reads) */
    char *head_copy;           /* the head bytes, re-parsed at dispatch */
    size_t head_copy_len;
    tern__bytes body_buf;

    /* streamed body */
    tern_http_body_fn body_fn;
    void *body_user;
    bool body_end_due;         /* no body, but a reader asked: its end is told at the batch end */

    /* response */
    bool started;              /* head sent */
    bool ended;
    tern__bytes fields;        /* added headers, "name\0value\0"... (proto.h) */

    int close_err;             /* the error its connection went with: tern_http_close_error */
    tern_http_abort_fn abort_fn;
    void *abort_user;
    tern_http_drain_fn drain_fn;
    void *drain_user;
    void *user;                /* tern_http_req_set_user */

    /* access log */
    uint64_t start_ms;         /* the loop's clock when the handler started */
    uint64_t bytes_out;        /* body bytes of the response */
    int resp_status;           /* the status sent */
    char *access_copy;         /* "METHOD\0TARGET\0", kept for an answer given later */
};

/* Invariants: conn is first (net frees the struct with free()); req is in
 * use from the first byte of a request (state HEAD) to the end of its
 * response; scanned is find_head_end's progress over the partial head. */
struct tern__http_conn {
    tern__conn conn;
    tern_server *srv;
    uint8_t state;             /* enum tern__http_state */
    bool waiting_drain;        /* paused until the backlog drains */
    bool in_data;              /* inside on_data: the state machine runs itself */
    bool peer_probed;          /* the FIN came with an answer pending: the 100 probe went */
    bool h2_ok;                /* fresh, on a listener serving HTTP/2: its preface moves it to h2.c */
    uint16_t probe_wait_ms;    /* the next look for the probe's reset (0: no longer looking) */
    size_t scanned;
    tern_http_req *req;        /* allocated at the first request, reused */
};

/* The HTTP/1.1 connection of a request whose proto is tern__h1_proto and
 * whose connection lives (req->conn, the first member of its
 * tern__http_conn). */
static inline tern__http_conn *tern__h1_conn(const tern_http_req *req) {
    return (tern__http_conn *)req->conn;
}

/* Tells each module with state on srv that ws ended (closed) or that
 * its backlog went out (drained). A loop where no module has state pays
 * a NULL check per slot. */
static inline void tern__srv_ws_closed(tern_server *srv, struct tern_ws *ws) {
    for (int i = 0; i < TERN__SRV_SLOTS_MAX; i++)
        if (atomic_load_explicit(&srv->slots[i], memory_order_relaxed))
            atomic_load(&srv->cfg->modules[i])->ws_closed(srv, ws);
}
static inline void tern__srv_ws_drained(tern_server *srv, struct tern_ws *ws) {
    for (int i = 0; i < TERN__SRV_SLOTS_MAX; i++)
        if (atomic_load_explicit(&srv->slots[i], memory_order_relaxed))
            atomic_load(&srv->cfg->modules[i])->ws_drained(srv, ws);
}

/* conn.c */
void tern__http_accept(void *srv, int fd);
/* The same for a TLS listener; user is its tern__https_listener. */
void tern__https_accept(void *user, int fd);
/* Every accepted connection's on_close calls it once (c: the connection,
 * for its place in the limits' counts). */
void tern__http_conn_closed_by_server(tern_server *srv, const tern__conn *c);
/* Runs the route's handler of req (req->route) with the views head,
 * params and the body (NULL for a streamed one), live while it runs; a
 * request whose stream went during the handler is settled when it
 * returns. Any protocol's. */
void tern__http_call_handler(tern_http_req *req, const tern__http_head *head,
                             const tern__route_params *params, const char *body, size_t body_len);
/* The route of req (its host set) for head, which no upgrade took: route
 * when an upgrade refused it already (tern__http_route_status with
 * status; refused: the WebSocket layer logged it), else a handler's
 * (params decoded), the host's not-found handler, or
 * tern__http_route_status with the server's own answer in req->status
 * (404, 405, 501, 400 for a path that does not decode, 426 for a
 * WebSocket path over HTTP/1.1 without the upgrade), logged as a
 * refusal. Any protocol's. */
const tern__http_route *tern__http_pick_route(tern_http_req *req, const tern__http_head *head,
                                              tern__route_params *params,
                                              const tern__http_route *route, int status,
                                              bool refused);
/* The route that answers req->status with the error page (405 with
 * Allow). */
extern const tern__http_route tern__http_route_status;

/* admit.c: the connection limits. admit decides on a connection just
 * accepted on fd (a Unix socket's is not counted by address): 0
 * (admitted; *tag goes into its owner_tag, and tern__http_release undoes
 * it when it closes), or 1 over max_connections, 2 over max_connections_per_ip (nothing is
 * counted; the caller refuses it with tern__http_refuse, which answers
 * 503 when plain, and closes fd). Any loop's thread. */
TERN_MUST_CHECK
int tern__http_admit(tern_server *srv, int fd, uint16_t *tag);
void tern__http_release(tern_server *srv, uint16_t tag);
void tern__http_refuse(int fd, bool tls);
/* Logs a refusal by a connection limit (max: max_connections, else per
 * address) at warning level: at most one line a second for the whole
 * process, counting the refusals since the previous line, so a flood
 * neither fills the log nor goes unseen. Any loop's thread. */
void tern__http_log_limit_refusal(bool max);
void tern__http_admit_free(tern__http_admission *a);

/* server.c */
/* Opens on clone (a server sharing srv's configuration, on another loop)
 * the listeners srv has; tern_run's. 0 or the first error. */
TERN_MUST_CHECK
int tern__server_listen_like(tern_server *clone, const tern_server *srv);

/* A reference to a configuration held by something other than a server
 * (a module's message on its way to a loop), so that cfg, and peers[] in
 * it, can still be read after the servers are freed. Any thread; the last
 * unref frees the configuration. */
void tern__config_ref(tern__server_config *cfg);
void tern__config_unref(tern__server_config *cfg);
/* The host whose name is name[0..len) (case-insensitive, no port), or the
 * default host. For the TLS layer too (SNI), once a connection knows its
 * server. Read-only: any loop may call it while serving. */
const tern__vhost *tern__vhost_find(const tern__server_config *cfg, const char *name, size_t len);
/* Does the server implement this method at all: a standard one (RFC 9110
 * §9 and PATCH) or one some route was registered with (an any-method
 * route: every one)? The others get 501 (RFC 9110 §15.6.2); a standard
 * method no route has is recognised, so it gets 404 or 405. */
bool tern__http_method_known(const tern_server *srv, const char *m, size_t len);

/* request.c: percent-decodes the parameters the router matched in path
 * (of path_len bytes) into srv's scratch (valid until the next call on
 * this loop). Returns 0; -EINVAL for a malformed escape ("%zz", "%4") or
 * one that decodes to a NUL byte (the route then answers 400); -ENOMEM. */
TERN_MUST_CHECK
int tern__http_params_decode(tern_server *srv, tern__route_params *p, size_t path_len);
/* request.c: getpeername of c; -ENOTCONN when c is NULL or closed. */
TERN_MUST_CHECK
int tern__peer(const tern__conn *c, struct sockaddr_storage *addr, socklen_t *len);

/* access.c: the access log. begin at the handler's start; keep after it
 * returns (copies what a later answer's entry needs); record when a
 * response goes out (status 101 for an upgrade); record_error for the
 * refusals sent without a handler (method and target "-" when the head
 * was not read); drop when the server goes. */
void tern__http_access_begin(tern_http_req *req);
void tern__http_access_keep(tern_http_req *req);
void tern__http_access_record(tern_http_req *req, int status);
void tern__http_access_record_error(tern_server *srv, const tern__conn *c, int status,
                                    uint64_t bytes, const char *m, size_t ml, const char *t,
                                    size_t tl);
void tern__http_access_drop(tern_server *srv);
/* An entry made by a layer above (a WebSocket session at its end): e's
 * strings NUL-terminated, copied. */
void tern__http_access_record_entry(tern_server *srv, const tern_http_access *e);
/* A WebSocket session of srv ended after ms (server.c: the histogram of
 * tern_server_ws_sessions). Loop thread. */
void tern__server_ws_session_ended(tern_server *srv, uint64_t ms);

/* static.c */
void tern__http_static_free(tern__vhost *vh);

/* response.c: a request's life, the same under every protocol. reset
 * empties req for the next request of its stream (keeping the fields'
 * buffer); free frees it. */
void tern__http_req_reset(tern_http_req *req);
void tern__http_req_free(tern_http_req *req);
/* The stream of req is gone (its connection closed, or the peer reset
 * it) with err (tern_http_close_error): conn becomes NULL, and unless a
 * handler is running (it settles req when it returns, with
 * tern__http_req_settle) req is settled now. */
void tern__http_req_detach(tern_http_req *req, int err);
/* A request whose stream is gone and whose handler is not running: freed
 * when nothing will answer it (never dispatched, or ended), or when a
 * handler holds it, its abort callback is told and it is freed; without
 * an abort callback it waits for the handler's answer, which frees it. */
void tern__http_req_settle(tern_http_req *req);
/* The Content-Type and body of an answer the server makes itself for
 * status: the reason phrase and a newline, written into buf (room for
 * TERN__ERROR_PAGE_BUF bytes), or what the configuration's error_page
 * hook gives. The views are valid until the next call. */
#define TERN__ERROR_PAGE_BUF 64
void tern__http_error_page(const tern_server *srv, int status, char *buf, const char **ctype,
                           const char **body, size_t *len);
/* The debug log line of an answer the server made itself instead of a
 * handler (tern__http_error_for's; m NULL: the head was not read);
 * closing: the connection ends after it. */
void tern__http_log_refusal(const tern__conn *c, int status, const char *m, size_t ml,
                            const char *t, size_t tl, bool closing);

/* h1.c: HTTP/1.1's wire format, beyond its tern__h1_proto (proto.h). */
/* An error response that closes the connection, for a request no handler
 * saw; _for names the request (its head was read: method m, target t). */
void tern__http_error(tern__http_conn *hc, int status);
void tern__http_error_for(tern__http_conn *hc, int status, const char *m, size_t ml,
                          const char *t, size_t tl);
/* The interim "100 Continue", once, before the response starts. */
void tern__http_send_continue(tern_http_req *req);
/* h2.c: moves hc, whose first bytes are HTTP/2's preface (rest[0..len),
 * fed to the new connection at the batch end), into an HTTP/2
 * connection. 0, or a negative error with hc untouched. */
TERN_MUST_CHECK
int tern__h2_start(tern__http_conn *hc, const char *rest, size_t len);
/* conn.c's parts of tern__h1_proto (proto.h): the response of req ended,
 * and its handler asked for the body. */
void tern__h1_ended(tern_http_req *req);
void tern__h1_read_body(tern_http_req *req);
/* The one writer of a status line: "HTTP/1.1 NNN Reason\r\n" at p, then,
 * when srv is given, its Server and Date lines (final responses carry
 * them; the interim 100 and the 101 of an upgrade are sent without).
 * Writes at most tern__http_status_room(srv, status) bytes; returns the
 * end of what it wrote. */
char *tern__http_put_status(char *p, tern_server *srv, int status);
/* v in decimal at p (at most 20 bytes); returns the end. */
char *tern__http_put_u64(char *p, uint64_t v);
/* The Date field's value now (formatted once a second), *len bytes; for
 * a protocol that writes its fields its own way (HTTP/2). */
const char *tern__http_date(tern_server *srv, size_t *len);
size_t tern__http_status_room(const tern_server *srv, int status);

#endif
