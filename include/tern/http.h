/* tern HTTP/1.1 server: routes, requests, responses.
 *
 * A handler is called once the request head (and, unless the route streams
 * its body, the whole body) has arrived. It answers inline, or keeps the
 * request and answers later from any callback of the same loop (from other
 * threads, post to the loop first). Pipelined requests are answered in
 * order: the next one is not read until the current response has ended.
 *
 * Lifetimes: the tern_http_req stays valid until its response ends
 * (tern_http_respond, tern_http_end, tern_http_respond_file) or until its
 * abort callback runs. The strings it hands out (method, path, headers,
 * params, body) are views valid during the handler call only; copy what an
 * answer given later needs. */
#ifndef TERN_HTTP_H
#define TERN_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "tern/loop.h"
#include "tern/net.h"

#ifdef __cplusplus
extern "C" {
#endif

/* libtern.so exports what this header declares, and nothing else. */
#pragma GCC visibility push(default)

typedef struct tern_server tern_server;
typedef struct tern_http_req tern_http_req;

/* The body of an answer the server makes itself: its refusals (400, 408,
 * 413, 414, 431, 500 ...), the answers no handler gives (404, 405, 426,
 * 501, an upgrade's refusal) and tern_http_static's (403, 404, ...).
 * Called with the defaults in place (*content_type "text/plain", *body
 * the reason phrase and a newline, *len its length); it may point them at
 * other bytes, which must stay valid until it returns to the next call
 * (tern copies them at once: a static string, or the hook's own
 * per-thread buffer). *content_type NULL sends none; one with a control
 * character (CR, LF ...) is not sent and the default goes instead, as for
 * a NULL *body with a non-zero *len. The status line, Allow (405),
 * Upgrade (426) and Connection headers stay tern's. The hook is the
 * configuration's: under tern_run it runs on every loop's thread, maybe
 * at once. It must not call tern. */
typedef void (*tern_http_error_page_fn)(int status, const char **content_type,
                                        const char **body, size_t *len, void *user);

/* Zero means the default for every field. */
typedef struct tern_server_options {
    size_t max_head;               /* request line + headers: 16 KiB (431) */
    size_t max_uri;                /* request-target: 8 KiB (414) */
    size_t max_headers;            /* header lines: 100 (431) */
    size_t max_body;               /* request body: 16 MiB (413) */
    uint32_t head_timeout_ms;      /* from the first byte to the end of the head: 10 s (408) */
    uint32_t body_timeout_ms;      /* a body must bring 4 KiB (or its end) per this: 10 s (408) */
    uint32_t idle_timeout_ms;      /* keep-alive, nothing asked and nothing to send: 60 s (close) */
    uint32_t send_timeout_ms;      /* a response the client takes nothing of for this long: 60 s (close) */
    uint32_t shutdown_timeout_ms;  /* graceful shutdown, then everything is closed: 10 s */
    /* A graceful shutdown closes each open WebSocket (shutdown_ws_code, "server
     * shutting down") at a random moment within this many ms of its start,
     * so that their clients do not all reconnect (somewhere else) at the
     * same instant; keep it under shutdown_timeout_ms, which closes what
     * is left. 0 (the default): all at once, when the shutdown starts. */
    uint32_t shutdown_ws_spread_ms;
    /* The close code of those closes: TERN_WS_GOING_AWAY (1001, the
     * default) or TERN_WS_SERVICE_RESTART (1012: the server will be back,
     * or another takes its place; clients are invited to reconnect).
     * Anything else is -EINVAL. */
    uint16_t shutdown_ws_code;
    const char *server_header;     /* "Server:" value: "tern"; "" sends none */
    tern_http_error_page_fn error_page;   /* the server's own answers' bodies: the reason phrase */
    void *error_page_user;
    /* Connection limits, counted over every server sharing the
     * configuration (tern_server_clone; under tern_run the whole process).
     * A connection over one is answered "503 Service Unavailable" with
     * Retry-After: 1 and Connection: close as soon as it is accepted,
     * before any byte of it is read (over TLS it is only closed), and
     * counted in tern_stats. TERN_UNLIMITED for no limit. */
    uint32_t max_connections;         /* open at once: 10000 */
    /* Open at once from one IPv4 address or one IPv6 /64 (an IPv4-mapped
     * address is its IPv4 one); Unix-socket connections are not counted:
     * 50. At most 65535 addresses are told apart at once: a connection from
     * an address beyond those is not counted against this limit. */
    uint32_t max_connections_per_ip;
    /* HTTP/2 (RFC 9113), TERN_HTTP2_* bits: TLS offers "h2" before
     * "http/1.1" by ALPN on the TLS listeners; CLEARTEXT serves HTTP/2
     * with prior knowledge on the plain ones (h2c: a connection whose
     * first bytes are HTTP/2's preface). 0 (the default): HTTP/1.1 alone.
     * "Upgrade: h2c" is never answered. A handler's code is the same
     * under both protocols; tern_http_minor_version says 1 for HTTP/2.
     * Other bits are -EINVAL. */
    unsigned http2;
    /* HTTP/2 streams a client may have open at once on one connection
     * (SETTINGS_MAX_CONCURRENT_STREAMS): 100. A stream past it is
     * refused (REFUSED_STREAM) before the client acknowledged the limit,
     * and ends the connection (GOAWAY, PROTOCOL_ERROR) after. The header
     * list of a request is bounded by max_head and max_headers, as
     * HTTP/1.1's head is (431). */
    uint32_t http2_max_streams;
} tern_server_options;

/* The bits of tern_server_options.http2. */
enum { TERN_HTTP2_TLS = 1, TERN_HTTP2_CLEARTEXT = 2 };

/* A limit of tern_server_options that is not applied at all. */
#define TERN_UNLIMITED UINT32_MAX

/* Returns 0, or -EINVAL (out or loop NULL, max_headers over 256, a
 * server_header over 60 bytes or with control characters, a
 * shutdown_ws_code other than 0, 1001 or 1012, an unknown http2 bit),
 * -ENOMEM. */
TERN_MUST_CHECK
int tern_server_new(tern_server **out, tern_loop *loop, const tern_server_options *opt);
/* Closes every listener and connection at once and frees the server.
 * Inside one of its own handlers: the struct goes at the end of the
 * iteration, and that handler's request ends when the handler returns. */
void tern_server_free(tern_server *srv);
tern_loop *tern_server_loop(const tern_server *srv);

/* ---- configuration and loops ------------------------------------------
 *
 * A server is two things: its configuration (options, routes, static
 * roots, WebSocket routes, hosts, the not-found handler, the access log),
 * built before it serves and read-only after, and the state of one loop
 * (listeners, connections, statistics, shutdown). tern_server_clone makes
 * another server, for another loop, that shares the configuration: N loops
 * (threads) serve the same routes without copying them or taking a lock.
 * Once a clone exists, the configuration is frozen: the calls that change
 * it (tern_http_route, tern_http_route_stream, tern_http_static,
 * tern_http_not_found, tern_ws_route, tern_server_host,
 * tern_server_set_access_log) return -EBUSY on every server sharing it.
 * tern_run (tern/run.h) does all of this for one loop per thread.
 *
 * Handlers' user pointers are shared by every loop: per-loop state of the
 * application is best found from the request's server
 * (tern_http_req_server, tern_server_index). */

/* A new server on loop with srv's configuration (a reference: it lives
 * until the last server using it is freed). It has no listeners: listen
 * on it (with SO_REUSEPORT on both, for the same port). Make the clones
 * before any of the servers runs on another thread. Returns 0, -EINVAL
 * (a NULL argument, a host handle), -ENOMEM. */
TERN_MUST_CHECK
int tern_server_clone(tern_server **out, tern_loop *loop, tern_server *srv);
/* The servers sharing srv's configuration, numbered from 0 (the first
 * made) in the order made: tern_server_index is srv's number,
 * tern_server_peer_count how many were made, tern_server_peer the one
 * numbered index (NULL when out of range or freed). Any thread may call
 * these while the servers run (the list is fixed by then); what a peer
 * may be asked from another thread is its loop (to post to it) and its
 * statistics. */
int tern_server_index(const tern_server *srv);
int tern_server_peer_count(const tern_server *srv);
tern_server *tern_server_peer(const tern_server *srv, int index);

/* A server's counters since it was made. Each is written by the server's
 * loop alone (a plain increment, no lock) and may be read from any thread:
 * every value is exact as of some recent moment, the set is not one
 * snapshot. */
typedef struct tern_stats {
    uint64_t connections;       /* open now (HTTP and WebSocket) */
    uint64_t accepted;          /* connections accepted in all */
    uint64_t requests;          /* HTTP requests whose head was read (an upgrade counts) */
    uint64_t ws_messages_in;    /* whole WebSocket messages received */
    uint64_t ws_messages_out;   /* WebSocket messages sent (a prepared one once per connection) */
    uint64_t bytes_in;          /* bytes of requests and frames the server consumed */
    uint64_t bytes_out;         /* response heads and bodies, frames, handed to the connections
                                   (chunk framing not counted) */
    uint64_t refused_max_connections;   /* accepted, then refused (503): max_connections */
    uint64_t refused_per_ip;            /* the same for max_connections_per_ip */
    uint64_t listeners;          /* listening sockets open (0 once shutting down) */
    uint64_t listeners_paused;   /* of them, not accepting now: out of descriptors, they
                                    back off for 100 ms at a time */
} tern_stats;
/* Returns 0, or -EINVAL for a NULL argument or a host handle. */
int tern_server_stats(const tern_server *srv, tern_stats *out);

/* Responses by status code: out[i] counts the responses srv wrote with
 * status TERN_HTTP_STATUS_MIN + i (100 to 599), from its handlers, its
 * refusals before any handler (4xx, 5xx) and its 503s to connections over
 * a limit (plain HTTP; TLS ones are closed). Interim responses (100
 * Continue, 101 of an upgrade) are not counted. Counted by the loop in a
 * fixed array, no lock; any thread may read it. Returns 0, or -EINVAL for
 * a NULL argument or a host handle. */
#define TERN_HTTP_STATUS_MIN 100
#define TERN_HTTP_STATUS_COUNT 500
int tern_server_responses(const tern_server *srv, uint64_t out[TERN_HTTP_STATUS_COUNT]);

#define TERN_HISTOGRAM_BUCKETS 15

/* A histogram of durations as Prometheus takes it: below[i] observations
 * took at most le_us[i] microseconds (cumulative, as its _bucket{le=}),
 * count all of them (the +Inf bucket), sum_us their total. */
typedef struct tern_histogram {
    uint64_t le_us[TERN_HISTOGRAM_BUCKETS];
    uint64_t below[TERN_HISTOGRAM_BUCKETS];
    uint64_t count;
    uint64_t sum_us;
} tern_histogram;

/* The one histogram logic of tern, its layout the caller's: values
 * counted in buckets with fixed, ascending upper bounds le[0..n). The
 * library counts its histograms so (tern_server_ws_sessions,
 * tern_pubsub_latency, with TERN_HISTOGRAM_BUCKETS bounds), and tern load
 * its latencies (thousands of log-linear bounds).
 *
 * tern_histogram_bucket: the bucket of v, the first i with v <= le[i]; n
 * when v is over them all. O(log n). */
size_t tern_histogram_bucket(const uint64_t *le, size_t n, uint64_t v);

/* The value at quantile q (0 < q <= 1) of what counts[0..n] counted
 * (counts[i]: the values in bucket i, not cumulative; counts[n]: those
 * over le[n-1]): the middle of its bucket, which runs from le[i-1] + 1
 * (0 for the first) to le[i]. 0 when nothing was counted; UINT64_MAX when
 * it is over the bounds (the caller may know the largest value). */
uint64_t tern_histogram_quantile(const uint64_t *le, const uint64_t *counts, size_t n, double q);

/* The lengths of srv's WebSocket sessions that ended, from the 101 to
 * the close (to a tenth of a second), bounds from 0.1 s to a day. Counted
 * by the loop in a fixed array; any thread may read it. Returns 0, or
 * -EINVAL for a NULL argument or a host handle. */
int tern_server_ws_sessions(const tern_server *srv, tern_histogram *out);

/* ---- virtual hosts -----------------------------------------------------
 *
 * Requests are routed by their Host header: tern_server_host gives a
 * handle for one host name, and the routes added through it
 * (tern_http_route, tern_http_route_stream, tern_http_static,
 * tern_http_not_found, tern_ws_route) answer only requests for that name.
 * The routes added on the server itself are the default host's: they
 * answer every name no host has, and requests without a Host (HTTP/1.0).
 * A host does not fall back to the default host's routes: its paths are
 * its own. Names match case-insensitively, without the port
 * ("Example.COM:8080" is example.com) or a final dot. With no host made,
 * the Host header is not even looked at. */

/* The handle for host name (made at the first call, the same one after),
 * owned by the configuration: valid until the last server sharing it is
 * freed, never to be freed itself. It takes routes only: listening, stats,
 * shutdown and clone calls refuse it (-EINVAL, or nothing for the void
 * ones). Returns 0, -EINVAL (a NULL argument; a name that is empty, over
 * 253 bytes, or has bytes other than letters, digits, '-', '_' and '.'),
 * -EBUSY for a new host once the configuration is shared, -ENOMEM. */
TERN_MUST_CHECK
int tern_server_host(tern_server *srv, const char *name, tern_server **out);

/* Returns 0, or: -EINVAL (srv NULL, port outside 0..65535, a negative
 * backlog; for Unix, path NULL or ""), TERN_ENOHOST (host does not
 * resolve), -ENAMETOOLONG (Unix path over 107 bytes), -EADDRINUSE for a
 * Unix path a server listens on (a stale socket file is removed; a live
 * one only when opt->reuseport asks to take it over), -ENOSPC (8
 * listeners already, or shutting down), or the errno of socket/bind/listen:
 * -EADDRINUSE, -EADDRNOTAVAIL (an address that is not this machine's),
 * -EACCES (a port under 1024). Under tern_run with more than one thread
 * every TCP listener gets SO_REUSEPORT, and the first loop's still
 * refuses (-EADDRINUSE) a port another socket listens on, unless
 * tern_listen_options.reuseport asks to share it. */
TERN_MUST_CHECK
int tern_listen(tern_server *srv, const char *host, int port, const tern_listen_options *opt);
TERN_MUST_CHECK
int tern_listen_unix(tern_server *srv, const char *path, const tern_listen_options *opt);
/* The port the first plain (non-TLS) TCP listener got, useful after
 * listening on port 0; TLS listeners are tern_server_tls_port's (tern/tls.h)
 * and Unix ones have none. -ENOENT when there is no plain TCP listener
 * (only TLS or Unix ones, or none), -EINVAL for a NULL srv. */
int tern_server_port(const tern_server *srv);

/* The access log: fn gets one entry per response the server sends (also
 * its own 404/405/501 answers and refusals such as 400, 413 or 431; method
 * and target "-" for a refusal before the head was read). A WebSocket session has one entry, status 101,
 * given when it ends (not at the upgrade): websocket set, its duration,
 * the bytes of frames each way, its messages and how it closed. Entries are
 * delivered at the end of the loop's batch of events, never from inside a
 * tern call; the strings are valid during the call only. fn NULL stops
 * it. The same log serves every server sharing the configuration (fn gets
 * the server of the loop the response went out on, and may run on any of
 * their threads). Returns 0, -EINVAL for a NULL srv, -EBUSY once the
 * configuration is shared. */
typedef struct tern_http_access {
    const char *peer;      /* tern_addr_format() of the peer, or "-" once it is gone */
    const char *method;    /* as sent, or "-" */
    const char *target;    /* the request-target as sent (path and query), or "-" */
    int status;
    uint64_t bytes;        /* body bytes of the response */
    uint64_t duration_ms;  /* from the handler's start to the response's end (loop clock);
                              a WebSocket: from its upgrade to its end */
    /* A WebSocket session's (websocket true; zero otherwise): bytes above
     * is what the server sent (frames), bytes_in what it read. */
    bool websocket;
    uint64_t bytes_in;
    uint64_t messages_in, messages_out;
    int close_code;        /* of the first close frame, sent or received; 1006: none */
    bool closed_by_server; /* that first close frame was the server's */
} tern_http_access;
typedef void (*tern_http_access_fn)(tern_server *srv, const tern_http_access *entry, void *user);
TERN_MUST_CHECK
int tern_server_set_access_log(tern_server *srv, tern_http_access_fn fn, void *user);

/* Graceful shutdown: stops accepting, closes idle connections, lets the
 * responses in flight finish (each then closes its connection), and calls
 * done once no connection is left, or when shutdown_timeout_ms has passed
 * and the rest were closed. */
typedef void (*tern_server_done_fn)(tern_server *srv, void *user);
void tern_server_shutdown(tern_server *srv, tern_server_done_fn done, void *user);
size_t tern_server_connections(const tern_server *srv);

/* ---- routes ----------------------------------------------------------- */

typedef void (*tern_http_handler)(tern_http_req *req, void *user);

/* method: "GET", "POST", ... or NULL for any. pattern: exact segments,
 * ":name" parameters, and a trailing "*". HEAD requests use the GET route
 * when no HEAD route exists; the body is left out for them. The handler
 * runs when the whole body is in (up to max_body).
 * Returns 0, -EEXIST for the same method and pattern twice, -ENOMEM, or
 * -EINVAL: srv, pattern or fn NULL; a method that is not an upper-case
 * token of 1 to 32 bytes ("get", "G T"); a pattern no request path can
 * match: not starting with '/', a '?' or '#', a space, control or non-ASCII
 * byte, a '*' that is not the whole last segment ("/star*", "/ * /x"), an
 * empty or repeated ":name", more than 8 parameters; -EBUSY once the
 * configuration is shared (tern_server_clone). */
TERN_MUST_CHECK
int tern_http_route(tern_server *srv, const char *method, const char *pattern,
                    tern_http_handler fn, void *user);
/* The same, but the handler runs as soon as the head is in, and reads the
 * body as a stream with tern_http_read_body(). */
TERN_MUST_CHECK
int tern_http_route_stream(tern_server *srv, const char *method, const char *pattern,
                           tern_http_handler fn, void *user);

/* The handler for requests whose path no route has (instead of the plain
 * 404). A path some route has for other methods still gets 405 with
 * Allow, and a method the server does not recognise (none of RFC 9110's,
 * nor PATCH, nor any route's) gets 501 (RFC 9110 §15.6.2): unlike a
 * catch-all route ("*" for any method) this does not swallow those. A
 * standard method no route has (PUT, DELETE, ...) gets 404 or 405.
 * fn NULL removes it. Returns 0, -EINVAL for a NULL srv, -EBUSY once the
 * configuration is shared. */
TERN_MUST_CHECK
int tern_http_not_found(tern_server *srv, tern_http_handler fn, void *user);

/* Serves files under dir for GET and HEAD requests of prefix + "*"
 * (prefix "/" serves everything no other route takes). Content-Type from
 * the extension, Last-Modified and If-Modified-Since (304), index.html for
 * directories, 404 for what is not there, 403 for what may not be read or
 * would lead out of dir (.., symlinks out). The body goes out with
 * sendfile(). Returns 0, -EINVAL (srv, prefix or dir NULL, a prefix not
 * starting with '/'), the errno of opening dir (-ENOENT when it is
 * missing), tern_http_route's errors (-EEXIST for a prefix served
 * already, -EBUSY once the configuration is shared), -ENOMEM. */
TERN_MUST_CHECK
int tern_http_static(tern_server *srv, const char *prefix, const char *dir);

/* ---- the request ------------------------------------------------------
 *
 * The views (method, path, query, headers, params, body) are not
 * NUL-terminated: use them with their length ("%.*s"). Each getter stores
 * the length in *len; len NULL is refused and the getter returns NULL (for
 * tern_http_header_at, a NULL name_len or value_len makes *name or *value
 * NULL), since a view without its length would be read past its end. A
 * NULL req, or one that is not live, gives NULL (tern_http_query and
 * tern_http_body: "") with *len 0. */

const char *tern_http_method(const tern_http_req *req, size_t *len);
const char *tern_http_path(const tern_http_req *req, size_t *len);     /* raw, without the query */
const char *tern_http_query(const tern_http_req *req, size_t *len);    /* raw, after '?'; "" if none */
int tern_http_minor_version(const tern_http_req *req);                 /* 0, or 1 for 1.1 and above */
/* Case-insensitive; the first header of that name, or NULL. */
const char *tern_http_header(const tern_http_req *req, const char *name, size_t *len);
size_t tern_http_header_count(const tern_http_req *req);
/* Header i (from 0, in the order received): its name and value views and
 * their lengths; NULL views and 0 lengths past the end. */
void tern_http_header_at(const tern_http_req *req, size_t i, const char **name, size_t *name_len,
                         const char **value, size_t *value_len);
/* A ":name" route parameter, percent-decoded ("/u/:name" on "/u/a%20b%2Fc"
 * gives "a b/c"; '+' stays a plus), or NULL. "*" is available as "*",
 * decoded too. The decoded bytes are the server's, valid during the
 * handler call like the other views. A path whose parameters do not
 * decode (a malformed escape such as "%zz" or "%4", or one that gives a
 * NUL byte, "%00") never reaches the handler: the server answers 400
 * (a WebSocket route's upgrade too). */
const char *tern_http_param(const tern_http_req *req, const char *name, size_t *len);
/* The same parameter as the path has it, escapes and all. */
const char *tern_http_param_raw(const tern_http_req *req, const char *name, size_t *len);
/* Decoded value of a query parameter into buf (NUL-terminated). Returns
 * its length, -ENOENT when absent, -ENOSPC when buf is too small, -EINVAL
 * for a bad %-escape. */
ssize_t tern_http_query_param(const tern_http_req *req, const char *name, char *buf, size_t cap);
/* The same for a parameter that may come several times ("?topic=a&topic=b"),
 * one value a call, in order: *at is 0 for the first and is moved past the
 * value the call looked at (whatever it returned but -ENOENT, so that a
 * caller may skip a bad one). Returns as tern_http_query_param, -ENOENT
 * after the last. */
ssize_t tern_http_query_param_next(const tern_http_req *req, const char *name, size_t *at,
                                   char *buf, size_t cap);
/* The whole body of a non-streaming route (empty when none). */
const char *tern_http_body(const tern_http_req *req, size_t *len);

/* Streaming bodies (routes made with tern_http_route_stream). fn gets each
 * piece as it arrives (a view valid during the call), then once with
 * last = true (len may be 0; a request without a body gets just that). fn
 * never runs inside tern_http_read_body itself: at the earliest, after the
 * calling handler or callback has returned. The first call to
 * tern_http_read_body() also sends "100 Continue" when the client waits
 * for it. A response may be started or ended before the body is over; the
 * rest of the body is then read and dropped (or the connection closed, if
 * the client was still waiting for 100 Continue). */
typedef void (*tern_http_body_fn)(tern_http_req *req, const char *data, size_t len, bool last,
                                  void *user);
void tern_http_read_body(tern_http_req *req, tern_http_body_fn fn, void *user);

/* Called if the connection goes away before the response has ended; req
 * is invalid after it returns. Without one, a request whose connection is
 * gone stays valid until the handler ends its response (which then returns
 * -EPIPE). While a response is pending the connection is watched: a reset
 * closes it and fires the abort within one loop iteration. A FIN alone is
 * not a departure: a client that half-closes after its requests
 * (shutdown(SHUT_WR), nc -N) still reads, and gets every answer, the later
 * ones too, as Go's net/http gives them; then the connection closes. To
 * tell it from a client that closed altogether, an HTTP/1.1 client is sent
 * an interim "100 Continue" when its FIN comes with an answer pending (RFC
 * 9110 lets a server send a 1xx at any time before the answer, and clients
 * skip one they did not ask for): a closed client's kernel resets, and the
 * abort fires within about 130 ms. An HTTP/1.0 client that has gone is
 * noticed only when its answer is written. The callback never runs inside
 * one of your own calls. */
typedef void (*tern_http_abort_fn)(tern_http_req *req, void *user);
void tern_http_on_abort(tern_http_req *req, tern_http_abort_fn fn, void *user);
/* Why the request's connection went, for the abort callback (and a
 * response ended later, which returns -EPIPE): the first error the
 * connection met, though the close came later: -ECONNRESET (the client
 * reset it, or the probe above found it gone), -EPIPE or -ECONNRESET (a
 * send to a client that had gone, as the kernel said it), -ETIMEDOUT (a
 * send made no progress), -EPROTO (a TLS failure). 0 while the connection
 * is there, when it ended without an error (the server's shutdown, its
 * free), and for NULL. */
int tern_http_close_error(const tern_http_req *req);

/* Whether the request came over TLS (a tern_listen_tls listener); false
 * for a NULL req. Valid for the request's whole life. */
bool tern_http_is_tls(const tern_http_req *req);
/* The host name the client sent in its TLS handshake (SNI), a view like
 * the others (not the Host header, which may differ: compare them if it
 * matters). NULL, *len 0 when there is none: plain TCP, a client that
 * sent no name (an address, or an old client), or outside the handler
 * call. */
const char *tern_http_sni(const tern_http_req *req, size_t *len);

/* The client certificate of a request over TLS (asked for with
 * tern_tls_options.client_verify, tern/tls.h). Returns 1 when the client
 * sent one that verified against the client CA file, 0 when it sent none
 * (or the request came over plain TCP), -EKEYREJECTED when it sent one
 * that did not verify (only TERN_TLS_VERIFY_OPTIONAL lets such a client
 * in: the handler decides), -EINVAL for a NULL req (or a NULL subject
 * with cap > 0), -ENOTCONN once the connection is gone. With cap > 0 the
 * certificate's subject, RFC 2253 ("CN=alice,O=Example"), is written to
 * subject NUL-terminated (cut to cap - 1 bytes), "" when there is none. */
TERN_MUST_CHECK
int tern_http_peer_cert(const tern_http_req *req, char *subject, size_t cap);

/* What the request belongs to. NULL for a NULL req. */
tern_loop *tern_http_req_loop(const tern_http_req *req);
tern_server *tern_http_req_server(const tern_http_req *req);

/* The application's own pointer for this request (NULL at first), for
 * answers given later. tern never frees it: free it when the response
 * ends, or in the abort callback. */
void *tern_http_req_user(const tern_http_req *req);
void tern_http_req_set_user(tern_http_req *req, void *user);

/* The peer's address (getpeername of the connection), for a request whose
 * connection is still there. *len is the room in addr on the way in (any
 * value; sizeof(*addr) is assumed) and the address's length on the way
 * out. A Unix-socket peer has family AF_UNIX, usually without a path
 * (format it with tern_addr_format: "unix:"). Behind a proxy this is the
 * proxy. Returns 0, -EINVAL for a NULL argument, -ENOTCONN when the
 * connection is gone. */
TERN_MUST_CHECK
int tern_http_peer(const tern_http_req *req, struct sockaddr_storage *addr, socklen_t *len);

/* A ":name" route parameter (decoded) read as a decimal integer (an optional '-',
 * then digits, nothing else). Returns 0 with *out set, -ENOENT when the
 * route has no such parameter (or outside the handler call), -EINVAL when
 * it is not a number (or req, name or out is NULL), -ERANGE when it does
 * not fit in int64_t. */
TERN_MUST_CHECK
int tern_http_param_int(const tern_http_req *req, const char *name, int64_t *out);

/* ---- the response ----------------------------------------------------- */

/* Errors of the response calls below: -EINVAL for a NULL req, a NULL
 * pointer with a non-zero length, a status outside 200..999, a
 * Content-Type or header value with a control character (CR, LF, ...), a
 * header name that is not a token; -EALREADY when the response head has
 * already gone out (a second respond or start, a header added after it,
 * a write or end after the end); -EINVAL for a write or end before
 * tern_http_start; -EPIPE when the connection is gone (the response then
 * counts as ended). */

/* Adds a response header (copied). Before the response starts. */
int tern_http_add_header(tern_http_req *req, const char *name, const char *value);

/* A whole response: status, Content-Type (NULL for none), body. Ends it. */
int tern_http_respond(tern_http_req *req, int status, const char *content_type, const void *body,
                      size_t len);

/* A streamed response: chunked for HTTP/1.1; for HTTP/1.0 the body ends
 * with the connection. tern_http_write returns a tern_send_result. */
int tern_http_start(tern_http_req *req, int status, const char *content_type);
int tern_http_write(tern_http_req *req, const void *data, size_t len);
int tern_http_end(tern_http_req *req);

/* A response whose body is len bytes of fd from offset, sent with
 * sendfile(). Takes fd (closes it, also on every error). Ends the
 * response. -EBADF for a negative fd. */
int tern_http_respond_file(tern_http_req *req, int status, const char *content_type, int fd,
                           off_t offset, size_t len);

/* Bytes of the response the kernel has not taken and that will still be
 * waiting after this batch's sends are flushed; on_drain-style flow control
 * for long streams: fn runs when they have all gone out. A client that takes
 * nothing for send_timeout_ms is closed. */
size_t tern_http_buffered(const tern_http_req *req);
typedef void (*tern_http_drain_fn)(tern_http_req *req, void *user);
void tern_http_on_drain(tern_http_req *req, tern_http_drain_fn fn, void *user);

/* The standard reason phrase ("Not Found"), or "Unknown". */
const char *tern_http_reason(int status);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
