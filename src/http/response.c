/* Responses: heads, fixed and chunked bodies, files, errors, the Date. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "http/chars.h"
#include "loop/log.h"
#include "http/server.h"

const char *tern_http_reason(int status) {
    switch (status) {
    case 100: return "Continue";
    case 101: return "Switching Protocols";
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 206: return "Partial Content";
    case 301: return "Moved Permanently";
    case 302: return "Found";
    case 303: return "See Other";
    case 304: return "Not Modified";
    case 307: return "Temporary Redirect";
    case 308: return "Permanent Redirect";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 426: return "Upgrade Required";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
    }
}

void tern__http_update_date(tern_server *srv) {
    int64_t now = tern__loop_wall_sec(srv->loop);
    if (now == srv->date_sec)
        return;
    time_t t = (time_t)now;
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(srv->date, sizeof(srv->date), "Date: %a, %d %b %Y %H:%M:%S GMT\r\n", &tm);
    srv->date_sec = now;
}

void tern__http_req_reset(tern_http_req *req) {
    tern__bytes extra = req->extra;
    free(req->head_copy);
    tern__bytes_free(&req->body_buf);
    free(req->access_copy);
    memset(req, 0, sizeof(*req));
    /* The header scratch is kept for the next request of the connection. */
    req->extra.data = extra.data;
    req->extra.cap = extra.cap;
}

/* ---- heads ------------------------------------------------------------ */

enum { LEN_NONE = -1, LEN_CHUNKED = -2, LEN_UNTIL_CLOSE = -3 };

static char *put(char *p, const char *s, size_t n) {
    if (n)  /* s may be NULL when n is 0 (an empty body) */
        memcpy(p, s, n);
    return p + n;
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
        tern__http_update_date(srv);
        p = put(p, srv->server_line, srv->server_line_len);
        p = put(p, srv->date, strlen(srv->date));
    }
    return p;
}

static char *put_u64(char *p, uint64_t v) {
    char tmp[24];
    int n = 0;
    do
        tmp[n++] = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    while (n)
        *p++ = tmp[--n];
    return p;
}

/* Writes the status line and headers, and body[0..body_len) with them
 * when it is small, into one cork reservation. `length` is the
 * Content-Length, or one of LEN_*. Returns a tern_send_result for the
 * whole, or a negative error. */
static int write_head(tern_http_req *req, int status, const char *ctype, int64_t length,
                      const void *body, size_t body_len) {
    tern__http_conn *hc = req->hc;
    tern_server *srv = req->srv;
    if (srv->shutting_down || !req->keep_alive)
        req->close_after = true;
    size_t clen = ctype ? strlen(ctype) : 0;
    size_t need = tern__http_status_room(srv, status) + (clen ? 16 + clen : 0) + 48 + 24 +
                  req->extra.len + 2;

    bool inline_body = body_len <= 16384;
    size_t total = need + (inline_body ? body_len : 0);
    char *heap = NULL;
    char *start = tern__conn_reserve(&hc->conn, total);
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
        p = put_u64(p, (uint64_t)length);
        p = put(p, "\r\n", 2);
    } else if (length == LEN_CHUNKED) {
        p = put(p, "Transfer-Encoding: chunked\r\n", 28);
    }
    if (req->close_after)
        p = put(p, "Connection: close\r\n", 19);
    else if (req->minor_version == 0)
        p = put(p, "Connection: keep-alive\r\n", 24);
    p = put(p, req->extra.data, req->extra.len);
    p = put(p, "\r\n", 2);
    if (inline_body && body_len)
        p = put(p, body, body_len);
    req->started = true;
    req->extra.len = 0;
    req->resp_status = status;
    TERN__STAT_STATUS(srv, status);

    TERN__STAT_ADD(srv, bytes_out, (size_t)(p - start) + (inline_body ? 0 : body_len));
    int r;
    if (heap == NULL) {
        tern__conn_commit(&hc->conn, (size_t)(p - start));
        r = TERN_SEND_OK;
    } else {
        r = tern__conn_write(&hc->conn, heap, (size_t)(p - start));
        free(heap);
    }
    if (r >= 0 && !inline_body && body_len)
        r = tern__conn_write(&hc->conn, body, body_len);
    return r;
}

static bool value_ok(const char *v);

void tern__http_error_page(const tern_server *srv, int status, char *buf, const char **ctype,
                           const char **body, size_t *len) {
    const char *reason = tern_http_reason(status);
    size_t n = strlen(reason);   /* at most 31: the reasons are short */
    memcpy(buf, reason, n);
    buf[n++] = '\n';
    *ctype = "text/plain";
    *body = buf;
    *len = n;
    const tern_server_options *o = &srv->cfg->opt;
    if (o->error_page == NULL)
        return;
    const char *c = *ctype, *b = *body;
    size_t l = *len;
    o->error_page(status, &c, &b, &l, o->error_page_user);
    /* What the hook gave is checked like a handler's Content-Type: a CR
     * or LF in it would split the answer. */
    if (c == NULL || value_ok(c))
        *ctype = c;
    if (b != NULL || l == 0) {
        *body = b ? b : "";
        *len = l;
    }
}

/* The debug line of an answer the server made itself, before or instead of
 * a handler (logging.md: "every refusal"). The request is named by method
 * and path when its head was read (m non-NULL): the query is left out, as
 * it may carry a credential (?token=). */
void tern__http_log_refusal(tern__http_conn *hc, int status, const char *m, size_t ml,
                            const char *t, size_t tl, bool closing) {
    if (!tern__log_on(TERN_LOG_DEBUG))
        return;
    char peer[TERN_ADDRSTRLEN] = "-";
    struct sockaddr_storage ss;
    socklen_t sl;
    if (tern__peer(&hc->conn, &ss, &sl) == 0 &&
        tern_addr_format((struct sockaddr *)&ss, sl, peer, sizeof(peer)) < 0)
        strcpy(peer, "-");
    const char *reason = tern_http_reason(status);
    const char *end = ", closing";
    if (!closing)
        end = "";
    if (m == NULL) {
        tern__log(TERN_LOG_DEBUG, TERN__LOG_HTTP_REFUSED, "http: %d %s to %s%s", status, reason,
                  peer, end);
        return;
    }
    const char *q = memchr(t, '?', tl);
    size_t pl = q ? (size_t)(q - t) : tl;
    if (pl > 256)
        pl = 256;   /* a line, not a dump: the log's lines are 512 bytes */
    tern__log(TERN_LOG_DEBUG, TERN__LOG_HTTP_REFUSED, "http: %d %s for %.*s %.*s to %s%s", status,
              reason, (int)ml, m, (int)pl, t, peer, end);
}

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
        tern__http_access_record_error(hc, status, body_len, m, ml, t, tl);
    else
        tern__http_access_record_error(hc, status, body_len, "-", 1, "-", 1);
    tern__http_log_refusal(hc, status, m, ml, t, tl, true);
    tern__conn_end(&hc->conn);
}

void tern__http_error(tern__http_conn *hc, int status) {
    tern__http_error_for(hc, status, NULL, 0, NULL, 0);
}

void tern__http_send_continue(tern_http_req *req) {
    if (req->continue_sent || req->started || req->hc == NULL)
        return;
    req->continue_sent = true;
    char buf[32];
    char *p = tern__http_put_status(buf, NULL, 100);
    p = put(p, "\r\n", 2);
    tern__conn_write(&req->hc->conn, buf, (size_t)(p - buf));
}

/* ---- the public response calls ---------------------------------------- */

static void end_response(tern_http_req *req) {
    req->ended = true;
    if (req->started)   /* else: the connection was gone, nothing was sent */
        tern__http_access_record(req, req->resp_status);
    tern__http_response_ended(req);
}

/* A header value (or Content-Type) may hold visible ASCII, obs-text,
 * spaces and tabs (RFC 9110 §5.5): a CR or LF would let the caller's text
 * split the response, and other controls are no field's business. */
static bool value_ok(const char *v) {
    for (; *v; v++)
        if (((unsigned char)*v < 0x20 && *v != '\t') || *v == 0x7f)
            return false;
    return true;
}

/* A header name is a token (RFC 9110 §5.1). */
static bool name_ok(const char *n) {
    if (*n == '\0')
        return false;
    for (; *n; n++)
        if (!tern__http_is((unsigned char)*n, TERN__C_TCHAR))
            return false;
    return true;
}

/* The loop-thread rule (loop.h, tern__loop_thread_ok) for a request whose
 * connection is live; one that is gone never reads its loop. */
#define REQ_ON_THREAD(req, call) ((req)->hc == NULL || tern__loop_thread_ok((req)->srv->loop, call))

/* Checks common to every call that starts a response. 0 when it may. */
static int check_start(tern_http_req *req, int status, const char *call) {
    if (req == NULL)
        return -EINVAL;
    if (!REQ_ON_THREAD(req, call))
        return -EPERM;
    if (req->started || req->ended)
        return -EALREADY;
    if (status < 200 || status > 999)
        return -EINVAL;
    if (req->hc == NULL) {   /* the connection is gone: this ends the request */
        end_response(req);
        return -EPIPE;
    }
    return 0;
}

static bool bodiless(const tern_http_req *req, int status) {
    return req->is_head || status == 204 || status == 304;
}

int tern_http_add_header(tern_http_req *req, const char *name, const char *value) {
    if (req == NULL || name == NULL || value == NULL)
        return -EINVAL;
    if (!REQ_ON_THREAD(req, __func__))
        return -EPERM;
    if (req->started || req->ended)
        return -EALREADY;
    if (!name_ok(name) || !value_ok(value))
        return -EINVAL;
    size_t nl = strlen(name), vl = strlen(value);
    if (tern__bytes_reserve(&req->extra, nl + vl + 4) < 0)
        return -ENOMEM;
    char *p = req->extra.data + req->extra.len;
    p = put(p, name, nl);
    p = put(p, ": ", 2);
    p = put(p, value, vl);
    p = put(p, "\r\n", 2);
    req->extra.len = (size_t)(p - req->extra.data);
    return 0;
}

int tern_http_respond(tern_http_req *req, int status, const char *content_type, const void *body,
                      size_t len) {
    int err = check_start(req, status, __func__);
    if (err == 0 && ((body == NULL && len > 0) || (content_type && !value_ok(content_type))))
        err = -EINVAL;
    if (err)
        return err;
    int r;
    if (status == 204 || status == 304) {
        r = write_head(req, status, content_type, LEN_NONE, NULL, 0);
    } else {
        r = write_head(req, status, content_type, (int64_t)len, body, req->is_head ? 0 : len);
        req->bytes_out = req->is_head ? 0 : len;
    }
    end_response(req);
    return r;
}

int tern_http_start(tern_http_req *req, int status, const char *content_type) {
    int err = check_start(req, status, __func__);
    if (err == 0 && content_type && !value_ok(content_type))
        err = -EINVAL;
    if (err)
        return err;
    int64_t framing = LEN_CHUNKED;
    if (bodiless(req, status))
        framing = req->is_head ? LEN_CHUNKED : LEN_NONE;
    else if (req->minor_version == 0) {
        /* HTTP/1.0 has no chunked coding: the body ends with the connection. */
        req->close_after = true;
        framing = LEN_UNTIL_CLOSE;
    }
    req->chunked_out = framing == LEN_CHUNKED && !req->is_head;
    int r = write_head(req, status, content_type, framing, NULL, 0);
    if (bodiless(req, status))
        req->is_head = true;   /* later writes send nothing */
    return r;
}

int tern_http_write(tern_http_req *req, const void *data, size_t len) {
    if (req == NULL || !req->started || (data == NULL && len > 0))
        return -EINVAL;
    if (!REQ_ON_THREAD(req, __func__))
        return -EPERM;
    if (req->ended)
        return -EALREADY;
    if (req->hc == NULL)
        return -EPIPE;
    if (req->is_head || len == 0)   /* a zero-size chunk would end the body */
        return TERN_SEND_OK;
    req->bytes_out += len;
    TERN__STAT_ADD(req->srv, bytes_out, len);
    if (!req->chunked_out)
        return tern__conn_write(&req->hc->conn, data, len);
    char size[24];
    int n = snprintf(size, sizeof(size), "%zx\r\n", len);
    struct iovec iov[3] = {{size, (size_t)n}, {(void *)data, len}, {"\r\n", 2}};
    return tern__conn_writev(&req->hc->conn, iov, 3);
}

int tern_http_end(tern_http_req *req) {
    if (req == NULL || !req->started)
        return -EINVAL;
    if (!REQ_ON_THREAD(req, __func__))
        return -EPERM;
    if (req->ended)
        return -EALREADY;
    if (req->hc == NULL) {
        end_response(req);
        return -EPIPE;
    }
    int r = TERN_SEND_OK;
    if (req->chunked_out)
        r = tern__conn_write(&req->hc->conn, "0\r\n\r\n", 5);
    end_response(req);
    return r;
}

int tern_http_respond_file(tern_http_req *req, int status, const char *content_type, int fd,
                           off_t offset, size_t len) {
    int err = check_start(req, status, __func__);
    if (err == 0 && (fd < 0 || offset < 0 || (content_type && !value_ok(content_type))))
        err = fd < 0 ? -EBADF : -EINVAL;
    if (err) {
        if (fd >= 0)
            close(fd);
        return err;
    }
    int r = write_head(req, status, content_type, (int64_t)len, NULL, 0);
    if (r >= 0 && !req->is_head && len > 0) {
        r = tern__conn_sendfile(&req->hc->conn, fd, offset, len);
        req->bytes_out = len;
        TERN__STAT_ADD(req->srv, bytes_out, len);
    }
    else
        close(fd);
    end_response(req);
    return r;
}

size_t tern_http_buffered(const tern_http_req *req) {
    return req && req->hc ? tern__conn_backlog(&req->hc->conn) : 0;
}

void tern_http_on_drain(tern_http_req *req, tern_http_drain_fn fn, void *user) {
    if (req == NULL)
        return;
    req->drain_fn = fn;
    req->drain_user = user;
}

void tern_http_on_abort(tern_http_req *req, tern_http_abort_fn fn, void *user) {
    if (req == NULL)
        return;
    req->abort_fn = fn;
    req->abort_user = user;
}

int tern_http_close_error(const tern_http_req *req) { return req ? req->close_err : 0; }
