/* The seam between a request and the protocol it came over: what the
 * public response calls (response.c) ask of the wire, as a table of
 * stream operations. HTTP/1.1 is one implementation (h1.c); a second
 * protocol plugs in by giving its requests another table. Nothing here
 * is public. */
#ifndef TERN_HTTP_PROTO_H
#define TERN_HTTP_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

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
 * called on the request's loop thread, with a request whose connection
 * is live (req->hc non-NULL), and returns a tern_send_result or a
 * negative error like the public call it serves.
 * head: the status, Content-Type (NULL: none), the handler's fields and
 *   the body's length (or TERN__HTTP_LEN_*); with a known length, the
 *   whole body body[0..body_len) too (body_len is 0 for HEAD). Marks the
 *   response started (resp_status, the status counter) and empties the
 *   fields, whose bytes it has written.
 * body: more of a streamed body (len > 0).
 * file: len bytes of fd from offset, as the body after a head of known
 *   length; owns fd (closes it when sent or on error).
 * end: the end of a streamed body.
 * buffered: the bytes accepted but not yet sent (back-pressure). */
typedef struct tern__http_proto {
    int (*head)(tern_http_req *req, int status, const char *ctype, int64_t length,
                const void *body, size_t body_len);
    int (*body)(tern_http_req *req, const void *data, size_t len);
    int (*file)(tern_http_req *req, int fd, off_t offset, size_t len);
    int (*end)(tern_http_req *req);
    size_t (*buffered)(const tern_http_req *req);
} tern__http_proto;

/* h1.c: HTTP/1.1's. */
extern const tern__http_proto tern__h1_proto;

#endif
