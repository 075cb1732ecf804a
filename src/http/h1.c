/* HTTP/1.1 on the wire: status lines with the Date, header fields,
 * Content-Length or chunked framing, Connection, the interim 100, and
 * the answers that close a connection; the tern__http_proto of the
 * requests conn.c reads. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "http/proto.h"
#include "http/server.h"

/* A head's framing once HTTP/1.1 has chosen it: a Content-Length (>= 0),
 * TERN__HTTP_LEN_NONE, or one of these. */
enum { LEN_CHUNKED = -3, LEN_UNTIL_CLOSE = -4 };

static char *put(char *p, const char *s, size_t n) {
    if (n)  /* s may be NULL when n is 0 (an empty body) */
        memcpy(p, s, n);
    return p + n;
}

/* The Date line, formatted once a second (a static function here, so the
 * status line's writer inlines its check). */
static void update_date(tern_server *srv) {
    int64_t now = tern__loop_wall_sec(srv->loop);
    if (now == srv->date_sec)
        return;
    time_t t = (time_t)now;
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(srv->date, sizeof(srv->date), "Date: %a, %d %b %Y %H:%M:%S GMT\r\n", &tm);
    srv->date_sec = now;
}

const char *tern__http_date(tern_server *srv, size_t *len) {
    update_date(srv);
    *len = strlen(srv->date) - 8;   /* without "Date: " and the CRLF */
    return srv->date + 6;
}

size_t tern__http_status_room(const tern_server *srv, int status) {
    /* "HTTP/1.1 " + 3 digits + ' ' + reason + CRLF */
    size_t n = 15 + strlen(tern_http_reason(status));
    if (srv)
        n += srv->server_line_len + sizeof(srv->date);
    return n;
}

char *tern__http_put_status(char *p, tern_server *srv, int status) {
    const char *reason = tern_http_reason(status);
    p = put(p, "HTTP/1.1 ", 9);
    *p++ = (char)('0' + status / 100 % 10);
    *p++ = (char)('0' + status / 10 % 10);
    *p++ = (char)('0' + status % 10);
    *p++ = ' ';
    p = put(p, reason, strlen(reason));
    p = put(p, "\r\n", 2);
    if (srv) {
        update_date(srv);
        p = put(p, srv->server_line, srv->server_line_len);
        p = put(p, srv->date, strlen(srv->date));
    }
    return p;
}

/* The handler's fields of req as "Name: value\r\n" lines: at most
 * fields_room(req) bytes at p; returns the end of what put_fields wrote. */
static size_t fields_room(const tern_http_req *req) {
    /* Each field's two NULs become ": " and CRLF, two bytes more; a field
     * takes at least three bytes (a name of one), so twice its size holds
     * it, and no count of the fields needs keeping. */
    return 2 * req->fields.len;
}

static char *put_field(char *p, const tern__http_field *f) {
    p = put(p, f->name, f->name_len);
    p = put(p, ": ", 2);
    p = put(p, f->value, f->value_len);
    return put(p, "\r\n", 2);
}

static char *put_fields(char *p, const tern_http_req *req) {
    tern__http_field f;
    size_t pos = 0;
    while (tern__http_field_next(req->fields.data, req->fields.len, &pos, &f))
        p = put_field(p, &f);
    return p;
}

/* v in decimal at p; the end. Shared with h2's content-length. */
char *tern__http_put_u64(char *p, uint64_t v) {
    char tmp[24];
    int n = 0;
    do
        tmp[n++] = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    while (n)
        *p++ = tmp[--n];
    return p;
}

/* The framing of a streamed body: none for a status without one, chunked
 * for HTTP/1.1 (advertised to HEAD too, which gets no body), and for
 * HTTP/1.0, which has no chunked coding, the body ends with the
 * connection. */
static int64_t stream_framing(tern_http_req *req, int status) {
    if (req->is_head)
        return LEN_CHUNKED;
    if (status == 204 || status == 304)
        return TERN__HTTP_LEN_NONE;
    if (req->minor_version == 0) {
        req->h1.close_after = true;
        return LEN_UNTIL_CLOSE;
    }
    req->h1.chunked_out = true;
    return LEN_CHUNKED;
}

/* Writes the status line and headers, and body[0..body_len) with them
 * when it is small, into one cork reservation. */
static int h1_head(tern_http_req *req, int status, const char *ctype, int64_t length,
                   const void *body, size_t body_len) {
    tern__conn *c = req->conn;
    tern_server *srv = req->srv;
    if (length == TERN__HTTP_LEN_STREAM)
        length = stream_framing(req, status);
    if (srv->shutting_down || !req->h1.keep_alive)
        req->h1.close_after = true;
    size_t clen = ctype ? strlen(ctype) : 0;
    size_t need = tern__http_status_room(srv, status) + (clen ? 16 + clen : 0) + 48 + 24 +
                  fields_room(req) + 2;

    bool inline_body = body_len <= 16384;
    size_t total = need + (inline_body ? body_len : 0);
    char *heap = NULL;
    char *start = tern__conn_reserve(c, total);
    if (start == NULL) {
        heap = malloc(total);
        if (heap == NULL)
            return -ENOMEM;
        start = heap;
    }
    char *p = tern__http_put_status(start, srv, status);
    if (clen) {
        p = put(p, "Content-Type: ", 14);
        p = put(p, ctype, clen);
        p = put(p, "\r\n", 2);
    }
    if (length >= 0) {
        p = put(p, "Content-Length: ", 16);
        p = tern__http_put_u64(p, (uint64_t)length);
        p = put(p, "\r\n", 2);
    } else if (length == LEN_CHUNKED) {
        p = put(p, "Transfer-Encoding: chunked\r\n", 28);
    }
    if (req->h1.close_after)
        p = put(p, "Connection: close\r\n", 19);
    else if (req->minor_version == 0)
        p = put(p, "Connection: keep-alive\r\n", 24);
    if (req->fields.len)
        p = put_fields(p, req);
    p = put(p, "\r\n", 2);
    if (inline_body && body_len)
        p = put(p, body, body_len);
    req->started = true;
    req->fields.len = 0;
    req->resp_status = status;
    TERN__STAT_STATUS(srv, status);

    TERN__STAT_ADD(srv, bytes_out, (size_t)(p - start) + (inline_body ? 0 : body_len));
    int r;
    if (heap == NULL) {
        tern__conn_commit(c, (size_t)(p - start));
        r = TERN_SEND_OK;
    } else {
        r = tern__conn_write(c, heap, (size_t)(p - start));
        free(heap);
    }
    if (r >= 0 && !inline_body && body_len)
        r = tern__conn_write(c, body, body_len);
    return r;
}

static int h1_body(tern_http_req *req, const void *data, size_t len) {
    if (!req->h1.chunked_out)
        return tern__conn_write(req->conn, data, len);
    /* The chunk's size line in hex, written by hand: snprintf cost 690
     * instructions a chunk, more than the rest of a small write (an SSE
     * event each: callgrind, /sse fan-out). */
    char size[24];
    size_t n = sizeof(size);
    size[--n] = '\n';
    size[--n] = '\r';
    size_t v = len;
    do {
        size[--n] = "0123456789abcdef"[v & 15];
        v >>= 4;
    } while (v);
    struct iovec iov[3] = {{size + n, sizeof(size) - n}, {(void *)data, len}, {"\r\n", 2}};
    return tern__conn_writev(req->conn, iov, 3);
}

static int h1_file(tern_http_req *req, int fd, off_t offset, size_t len) {
    return tern__conn_sendfile(req->conn, fd, offset, len);
}

static int h1_end(tern_http_req *req) {
    if (req->h1.chunked_out)
        return tern__conn_write(req->conn, "0\r\n\r\n", 5);
    return TERN_SEND_OK;
}

static size_t h1_buffered(const tern_http_req *req) {
    return tern__conn_backlog(req->conn);
}

/* The 101 of an upgrade: the status line (without Server and Date), the
 * Upgrade and Connection fields, the upgrade's fields, the handler's and
 * the blank line, in one write; the stream is the connection itself. The
 * part before the handler's fields is bounded (TUNNEL_HEAD_MAX: the
 * upgrade's fields are a key, a subprotocol and an extension offer), so a
 * subprotocol too long for it is refused rather than sent. */
enum { TUNNEL_HEAD_MAX = 1021 };

static tern__conn *h1_tunnel(tern_http_req *req, const char *protocol,
                             const tern__http_field *fields, size_t n) {
    size_t plen = strlen(protocol);
    size_t head = tern__http_status_room(NULL, 101) + 9 + plen + 23;
    for (size_t i = 0; i < n; i++)
        head += fields[i].name_len + fields[i].value_len + 4;
    if (head > TUNNEL_HEAD_MAX)
        return NULL;
    size_t room = head + fields_room(req) + 2;
    char small[1280];
    char *buf = room <= sizeof(small) ? small : malloc(room);
    if (buf == NULL)
        return NULL;
    char *p = tern__http_put_status(buf, NULL, 101);
    p = put(p, "Upgrade: ", 9);
    p = put(p, protocol, plen);
    p = put(p, "\r\nConnection: Upgrade\r\n", 23);
    for (size_t i = 0; i < n; i++)
        p = put_field(p, &fields[i]);
    p = put_fields(p, req);
    p = put(p, "\r\n", 2);
    tern__conn_write(req->conn, buf, (size_t)(p - buf));
    if (buf != small)
        free(buf);
    req->fields.len = 0;
    return req->conn;
}

const tern__http_proto tern__h1_proto = {
    .head = h1_head,
    .body = h1_body,
    .file = h1_file,
    .end = h1_end,
    .buffered = h1_buffered,
    .ended = tern__h1_ended,
    .read_body = tern__h1_read_body,
    .tunnel = h1_tunnel,
};

/* Sends a complete error response and ends the connection after it. Used
 * for requests refused before any handler saw them. m and t name the
 * request when its head was read (a 413), else m is NULL. */
void tern__http_error_for(tern__http_conn *hc, int status, const char *m, size_t ml,
                          const char *t, size_t tl) {
    tern_server *srv = hc->srv;
    char page[TERN__ERROR_PAGE_BUF];
    const char *ctype, *body;
    size_t body_len;
    tern__http_error_page(srv, status, page, &ctype, &body, &body_len);
    char buf[640];   /* the status lines, a Content-Type of at most 256 bytes, the rest */
    if (ctype && strlen(ctype) > 256)
        ctype = "text/plain";
    char *p = tern__http_put_status(buf, srv, status);
    size_t room = sizeof(buf) - (size_t)(p - buf);
    int n = snprintf(p, room, "%s%s%sContent-Length: %zu\r\nConnection: close\r\n\r\n",
                     ctype ? "Content-Type: " : "", ctype ? ctype : "", ctype ? "\r\n" : "",
                     body_len);
    if (n > 0 && (size_t)n < room) {
        size_t len = (size_t)(p - buf) + (size_t)n;
        TERN__STAT_ADD(srv, bytes_out, len + body_len);
        TERN__STAT_STATUS(srv, status);
        tern__conn_write(&hc->conn, buf, len);
        if (body_len)
            tern__conn_write(&hc->conn, body, body_len);
    }
    if (m)
        tern__http_access_record_error(srv, &hc->conn, status, body_len, m, ml, t, tl);
    else
        tern__http_access_record_error(srv, &hc->conn, status, body_len, "-", 1, "-", 1);
    tern__http_log_refusal(&hc->conn, status, m, ml, t, tl, true);
    tern__conn_end(&hc->conn);
}

void tern__http_error(tern__http_conn *hc, int status) {
    tern__http_error_for(hc, status, NULL, 0, NULL, 0);
}

void tern__http_send_continue(tern_http_req *req) {
    if (req->h1.continue_sent || req->started || req->conn == NULL)
        return;
    req->h1.continue_sent = true;
    char buf[32];
    char *p = tern__http_put_status(buf, NULL, 100);
    p = put(p, "\r\n", 2);
    tern__conn_write(req->conn, buf, (size_t)(p - buf));
}
