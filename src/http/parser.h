/* HTTP/1.1 request-head parser (RFC 9112), strict and allocation-free,
 * and the response-head parser of the WebSocket client beside it.
 *
 * The parser works on one contiguous buffer holding the request head and
 * hands back views into it: nothing is copied. Callers first look for the
 * end of the head with tern__http_find_head_end() as bytes arrive (cheap,
 * resumable, so a client trickling a head byte by byte costs O(n) in all)
 * and parse once the blank line is there, or once the buffer has grown past
 * a limit (the parser then says which limit). */
#ifndef TERN_HTTP_PARSER_H
#define TERN_HTTP_PARSER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct tern__http_header {
    const char *name;    /* as sent; compare case-insensitively */
    size_t name_len;
    const char *value;   /* leading and trailing whitespace trimmed */
    size_t value_len;
} tern__http_header;

typedef struct tern__http_limits {
    size_t max_head;     /* request line + headers + blank line; over it: 431 */
    size_t max_uri;      /* request-target; over it: 414 */
    size_t max_headers;  /* header lines; over it: 431 */
} tern__http_limits;

enum tern__http_body_kind {
    TERN__BODY_NONE = 0,     /* no Content-Length, no Transfer-Encoding */
    TERN__BODY_LENGTH = 1,   /* Content-Length: content_length bytes (may be 0) */
    TERN__BODY_CHUNKED = 2,  /* Transfer-Encoding: chunked */
};

/* A parsed request head. Every pointer points into the parsed buffer. */
typedef struct tern__http_head {
    const char *method;  size_t method_len;
    const char *target;  size_t target_len;  /* request-target as sent */
    const char *path;    size_t path_len;    /* target up to '?' (for absolute-form: after the authority) */
    const char *query;   size_t query_len;   /* after '?', without it; query_len 0 when absent */
    int minor_version;                       /* 0 for HTTP/1.0, 1 for 1.1 and above (1.2 ...) */
    tern__http_header *headers;              /* the caller's array, filled */
    size_t num_headers;
    int body_kind;                           /* enum tern__http_body_kind */
    uint64_t content_length;                 /* when body_kind == TERN__BODY_LENGTH */
    bool keep_alive;     /* 1.1 unless "Connection: close"; 1.0 only with "Connection: keep-alive" */
    bool expect_continue;/* "Expect: 100-continue" */
    bool upgrade;        /* an Upgrade header and "upgrade" among the Connection tokens */
    const char *host;    size_t host_len;    /* Host header value (required in 1.1) */
    /* HTTP/2's extended CONNECT (RFC 8441): its :protocol ("websocket"),
     * the upgrade it asks for; NULL for every other request (HTTP/1.1's
     * upgrade is the Upgrade field) */
    const char *protocol; size_t protocol_len;
} tern__http_head;

/* Returns the offset just past the first "\r\n\r\n" in buf[0..len), or 0
 * when there is none yet. *scanned carries the search position between
 * calls on a growing buffer (start it at 0). */
size_t tern__http_find_head_end(const char *buf, size_t len, size_t *scanned);

/* Parses the head at the start of buf[0..len).
 * Returns:
 *   > 0   the head is complete and valid: the number of bytes it took;
 *   0     more bytes are needed (and no limit is exceeded yet);
 *   < 0   the request is refused: minus the HTTP status to answer
 *         (-400 malformed or ambiguous framing, -414 URI too long,
 *          -431 head or header count too large, -417 unsupported Expect,
 *          -501 unsupported transfer coding, -505 unsupported version).
 * Every refusal closes the connection: the caller never reads the
 * message two ways. */
ssize_t tern__http_parse_head(const char *buf, size_t len, const tern__http_limits *lim,
                              tern__http_head *out, tern__http_header *headers,
                              size_t max_headers);

/* A parsed response head (a client reading a server's answer). Every
 * pointer points into the parsed buffer. */
typedef struct tern__http_response_head {
    int minor_version;                       /* 0 for HTTP/1.0, 1 for 1.1 and above */
    int status;                              /* 100..999 */
    const char *reason;  size_t reason_len;  /* as sent; may be empty */
    tern__http_header *headers;              /* the caller's array, filled */
    size_t num_headers;
} tern__http_response_head;

/* Parses a response head at the start of buf[0..len): the status line,
 * then field lines read exactly as a request's. Nothing is judged beyond
 * syntax (framing and meaning are the caller's). Returns:
 *   > 0   the head is complete: the number of bytes it took;
 *   0     more bytes are needed (and buf holds fewer than max_head);
 *   < 0   -400 malformed, -505 not HTTP/1.x, -431 the head is longer than
 *         max_head or has more than max_headers field lines. */
ssize_t tern__http_parse_response(const char *buf, size_t len, size_t max_head,
                                  tern__http_response_head *out, tern__http_header *headers,
                                  size_t max_headers);

/* Case-insensitive lookup among a response's headers; NULL when absent. */
const tern__http_header *tern__http_response_header(const tern__http_response_head *head,
                                                    const char *name);

/* Case-insensitive lookup among head->headers; NULL when absent. */
const tern__http_header *tern__http_find_header(const tern__http_head *head, const char *name);

/* Is `token` one of the comma-separated tokens of a header value
 * (case-insensitive, optional whitespace around commas)? */
bool tern__http_has_token(const char *value, size_t len, const char *token);

/* Query strings: finds `name` among the '&'-separated pairs of query and
 * returns a view of its raw (still percent-encoded) value, or NULL. A name
 * with no '=' has an empty value. */
const char *tern__query_find(const char *query, size_t query_len, const char *name,
                             size_t *value_len);

/* Percent-decodes src into dst ('+' becomes ' ' when plus_is_space).
 * Returns the decoded length, -EINVAL on a bad escape, -ENOSPC when dst is
 * too small. dst may equal src. */
ssize_t tern__url_decode(char *dst, size_t cap, const char *src, size_t len, bool plus_is_space);

#endif
