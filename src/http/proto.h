/* The seam between a request and the protocol it came over: what the
 * protocol-neutral code (the public response calls of response.c, the
 * body reads of request.c, the WebSocket upgrade of ws/server.c) asks of
 * the wire, as a table of stream operations. HTTP/1.1 is one
 * implementation (h1.c, with conn.c's state machine); a second protocol
 * plugs in by giving its requests another table and setting the
 * protocol-neutral fields of tern_http_req (server.h): conn, the
 * connection the request came over (its peer and TLS facts), and NULL
 * once its stream is gone (tern__http_req_detach, which fires the abort);
 * tls, minor_version, is_head, the body's mode and progress. Nothing here
 * is public. */
#ifndef TERN_HTTP_PROTO_H
#define TERN_HTTP_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

#include "net/conn.h"
#include "tern/http.h"

/* A response's body length as the head op is told it: a byte count (>= 0),
 * or one of these. */
enum {
    TERN__HTTP_LEN_NONE = -1,     /* no body at all (204, 304) */
    TERN__HTTP_LEN_STREAM = -2,   /* unknown: body ops follow, then end */
};

/* The header fields a handler added (tern_http_add_header), kept with the
 * request as name/value pairs until its protocol serializes them with the
 * head. Stored back to back as "name\0value\0": a name is a token and a
 * value has no NUL, so each ends at its NUL. Memory: the names' and
 * values' bytes plus two per field, in one buffer reused by the
 * connection's next request. */
typedef struct tern__http_field {
    const char *name, *value;
    size_t name_len, value_len;
} tern__http_field;

/* The field at *pos of the packed text t[0..len) into *f, and *pos moved
 * past it; false at the end. Start with *pos = 0. */
static inline bool tern__http_field_next(const char *t, size_t len, size_t *pos,
                                         tern__http_field *f) {
    if (*pos >= len)
        return false;
    f->name = t + *pos;
    f->name_len = strlen(f->name);
    f->value = f->name + f->name_len + 1;
    f->value_len = strlen(f->value);
    *pos = (size_t)(f->value + f->value_len + 1 - t);
    return true;
}

/* The operations of one protocol on the stream of a request. Each is
 * called on the request's loop thread, with a request whose stream is
 * live (req->conn non-NULL); those returning int return a
 * tern_send_result or a negative error like the public call they serve.
 * head: the status, Content-Type (NULL: none), the handler's fields and
 *   the body's length (or TERN__HTTP_LEN_*); with a known length, the
 *   whole body body[0..body_len) too (body_len is 0 for HEAD). Marks the
 *   response started (resp_status, the status counter) and empties the
 *   fields, whose bytes it has written.
 * body: more of a streamed body (len > 0).
 * file: len bytes of fd from offset, as the body after a head of known
 *   length; owns fd (closes it when sent or on error).
 * end: the end of a streamed body.
 * buffered: the bytes accepted but not yet sent (back-pressure).
 * ended: the response ended (respond, respond_file or end, once per
 *   request); the protocol moves on (HTTP/1.1: to the connection's next
 *   request, or its close).
 * read_body: the handler of a streaming route asked for the body
 *   (req->body_fn is set): from now on the protocol hands it the body's
 *   pieces as they arrive, never inside this call, and lets the peer send
 *   more as the handler takes them (HTTP/1.1: "100 Continue" if the client
 *   waits for it, reading resumed; a request without a body has its end
 *   told at the batch end).
 * tunnel: the upgrade of req to another protocol (a WebSocket) is
 *   accepted: answers it with the protocol's fields, then the
 *   upgrade's fields[0..n), then the handler's, and returns the byte
 *   stream the new protocol takes over (tern__conn_move), or NULL when
 *   it cannot answer (out of memory, or HTTP/1.1's 101 past its 1 KiB
 *   before the handler's fields): nothing was sent. HTTP/1.1 answers "101 Switching
 *   Protocols" with "Upgrade: protocol" and "Connection: Upgrade", and
 *   its stream is the connection itself. HTTP/2 answers RFC 8441's
 *   extended CONNECT "200" and its stream becomes a tern__conn of its
 *   own (net's carried connection, h2.c's h2_tunnel) whose transport
 *   carries the stream: send frames the bytes as the stream's DATA
 *   within its flow-control window (what the window refuses is the
 *   backlog, and on_drain comes when the peer opens it), received DATA
 *   is read from the stream with the window opened by what was read,
 *   pause and resume stop and restart that reading, shutdown ends the
 *   stream (END_STREAM), a close resets it (RST_STREAM) and the peer's
 *   reset closes the conn; peer and TLS facts are those of the
 *   connection under it (the transport's carrier); and its timeouts,
 *   send clock and memory count against that stream, not the
 *   connection, so an idle WebSocket costs a tern_ws plus the stream's
 *   state. */
typedef struct tern__http_proto {
    int (*head)(tern_http_req *req, int status, const char *ctype, int64_t length,
                const void *body, size_t body_len);
    int (*body)(tern_http_req *req, const void *data, size_t len);
    int (*file)(tern_http_req *req, int fd, off_t offset, size_t len);
    int (*end)(tern_http_req *req);
    size_t (*buffered)(const tern_http_req *req);
    void (*ended)(tern_http_req *req);
    void (*read_body)(tern_http_req *req);
    tern__conn *(*tunnel)(tern_http_req *req, const char *protocol, const tern__http_field *fields,
                          size_t n);
} tern__http_proto;

/* h1.c: HTTP/1.1's; h2.c: HTTP/2's. */
extern const tern__http_proto tern__h1_proto;
extern const tern__http_proto tern__h2_proto;

#endif
