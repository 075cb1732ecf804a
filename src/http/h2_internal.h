/* HTTP/2's private types (h2.c), shared with its tunnels (h2_tunnel.c,
 * RFC 8441's WebSocket streams): the connection, the stream and the
 * tunnel, and the few calls each file makes into the other. */
#ifndef TERN_HTTP_H2_INTERNAL_H
#define TERN_HTTP_H2_INTERNAL_H

#include <nghttp2/nghttp2.h>

#include "http/proto.h"
#include "http/server.h"

/* What h2_send leaves in the connection's backlog before it stops asking
 * the session for more (on_drain asks again): a client that does not
 * read holds this much of ours, not every stream's whole body. */
#define H2_BACKLOG_MAX (256 * 1024)
/* A streamed response's bytes held for a stream beyond which tern_http_write
 * says TERN_SEND_BUFFERED (and the drain callback follows). */
#define H2_STREAM_SOFT (64 * 1024)

typedef struct h2_stream h2_stream;
typedef struct h2_tunnel h2_tunnel;

/* One HTTP/2 connection. Invariants: conn is first (net frees the
 * struct with free()); streams lists every stream that has a request
 * struct (from its HEADERS to its close); ng is NULL once the connection
 * closed (dead), and freed when the session call under way returns when
 * the close came from inside one (in_session). */
typedef struct h2_conn {
    tern__conn conn;
    tern_server *srv;
    nghttp2_session *ng;
    h2_stream *streams;
    size_t nstreams;
    /* inside nghttp2_session_mem_recv or _mem_send, whose callbacks may
     * reach h2_send again (a handler answering): it sends nothing then */
    bool in_session;
    bool dead;                 /* closed: ng is freed once in_session ends */
    bool goaway;               /* the shutdown's GOAWAY was submitted */
    /* Body bytes read on every stream, and their count when the body
     * clock was last armed (clock). */
    uint64_t body_bytes, body_mark;
    /* A response waits on a window the peer keeps shut (stalled, as
     * h2_send last saw it), and the bytes written when the stall clock
     * was last armed: a window held at zero is slowloris over h2, and
     * net's send clock never sees it (nothing waits in the backlog). */
    bool stalled;
    uint64_t sent_bytes, sent_mark;
    /* The highest stream id the peer sent HEADERS on, and which of the 64
     * ids below it (bit k: peer_max - 2k) it used: HEADERS on one it
     * skipped, a stream idle then implicitly closed (RFC 9113 §5.1.1),
     * is a connection error nghttp2 lets pass (it keeps no record). */
    int32_t peer_max;
    uint64_t peer_used;
} h2_conn;

/* One stream's request. Invariants: req is first (the neutral code frees
 * a settled request with free(), tern__http_req_free); h2 is set while
 * the stream is open, and req.conn with it; hdr holds the request's
 * fields as "name\0value\0" (pseudo-fields with their ':'), out the
 * response bytes the session has not taken (from out_off), file the
 * file range after them (fd -1: none). */
struct h2_stream {
    tern_http_req req;
    h2_conn *h2;
    h2_stream *next, *prev;
    int32_t id;
    tern__bytes hdr;
    size_t hdr_bytes;          /* name and value bytes plus 32 per field (RFC 9113 §6.5.2) */
    size_t nfields;
    bool too_large;            /* past max_head or max_headers: answered 431 */
    bool headers_done;
    tern__bytes pending;       /* body bytes the handler has not asked for yet (their stream's window not reopened) */
    bool deliver_due;          /* pending (or the body's end) goes to body_fn at the batch end */
    tern__bytes out;
    size_t out_off;
    int fd;
    off_t file_off;
    size_t file_left;
    bool has_data;             /* the response was submitted with a data provider */
    bool data_end;             /* no more body will be added */
    bool eof_given;            /* read_body gave the session the body's end */
    bool deferred;             /* the provider said NGHTTP2_ERR_DEFERRED: resume on more */
    bool drain_due;            /* a write was told TERN_SEND_BUFFERED: tell on_drain */
    /* answered before the request's end: reset (NO_ERROR) once the answer
     * is sent, so a client still sending frees the stream (RFC 9113 §8.1) */
    bool reset_when_sent;
    /* the request asked "Expect: 100-continue" and no 100 went yet */
    bool continue_due;
    /* The stream carries a WebSocket (RFC 8441): its bytes are tunnel's
     * connection's, not a request's body and response (NULL: a request) */
    h2_tunnel *tunnel;
};

/* A stream that carries another protocol (RFC 8441's extended CONNECT,
 * answered 200), as a tern__conn of its own (net's carried connection)
 * whose transport is this: what the WebSocket sends goes as the stream's
 * DATA, what the peer sends on the stream is read from it. Invariants: tp
 * is first (c->tp points here, and net releases it with c); c is the
 * connection it carries for (tern__conn_move tells the new one, moved);
 * st is the stream while it is open, NULL once it is gone (then reads
 * see the end and sends fail). The stream's `pending` holds the DATA
 * received and not yet read, unconsumed, so the peer's window shuts on a
 * reader that stops (a paused WebSocket); its `out` what the session's
 * data provider has not taken, at most H2_STREAM_SOFT and never more than
 * the peer's windows allow; the rest waits in c's backlog. */
struct h2_tunnel {
    tern__transport tp;
    tern__conn *c;
    h2_stream *st;
    bool eof;   /* the peer's END_STREAM: reads end once pending is read */
};

/* The stream a request of HTTP/2's is (its request struct is the
 * stream's first member). */
static inline h2_stream *tern__h2_stream_of(const tern_http_req *req) {
    return (h2_stream *)(void *)req;
}

/* h2.c: what the session has to send goes at the batch end (never from
 * inside a session call); a stream's provider is asked again for more. */
void tern__h2_want_send(h2_conn *h2);
void tern__h2_resume(h2_stream *st);
/* h2.c: the proto's head op (proto.h), which a tunnel's 200 goes through. */
int tern__h2_head(tern_http_req *req, int status, const char *ctype, int64_t length,
                  const void *body, size_t body_len);

/* h2_tunnel.c: the proto's tunnel op (proto.h); and what a tunnel's
 * connection can do now, told by h2_send once the session's bytes went. */
tern__conn *tern__h2_open_tunnel(tern_http_req *req, const char *protocol,
                                 const tern__http_field *fields, size_t n);
void tern__h2_tunnel_ready(h2_stream *st);

#endif
