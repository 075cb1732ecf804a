/* Responses: the public calls (respond, start, write, end, files), the
 * reason phrases and error pages. Whatever goes on the wire goes
 * through the request's protocol (proto.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "http/chars.h"
#include "http/proto.h"
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

void tern__http_req_reset(tern_http_req *req) {
    tern__bytes fields = req->fields;
    free(req->head_copy);
    tern__bytes_free(&req->body_buf);
    free(req->access_copy);
    memset(req, 0, sizeof(*req));
    /* The header scratch is kept for the next request of the connection. */
    req->fields.data = fields.data;
    req->fields.cap = fields.cap;
}

void tern__http_req_free(tern_http_req *req) {
    free(req->head_copy);
    tern__bytes_free(&req->body_buf);
    tern__bytes_free(&req->fields);
    free(req->access_copy);
    free(req);
}

void tern__http_req_settle(tern_http_req *req) {
    if (!req->dispatched || req->ended) {
        tern__http_req_free(req);
    } else if (req->abort_fn) {
        req->abort_fn(req, req->abort_user);
        tern__http_req_free(req);
    }
}

void tern__http_req_detach(tern_http_req *req, int err) {
    req->conn = NULL;
    req->close_err = err;   /* for the abort callback, or a response ended later */
    if (!req->live)   /* a running handler settles it when it returns */
        tern__http_req_settle(req);
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
void tern__http_log_refusal(const tern__conn *c, int status, const char *m, size_t ml,
                            const char *t, size_t tl, bool closing) {
    if (!tern__log_on(TERN_LOG_DEBUG))
        return;
    char peer[TERN_ADDRSTRLEN] = "-";
    struct sockaddr_storage ss;
    socklen_t sl;
    if (tern__peer(c, &ss, &sl) == 0 &&
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

/* ---- the public response calls ---------------------------------------- */

static void end_response(tern_http_req *req) {
    req->ended = true;
    if (req->started)   /* else: the connection was gone, nothing was sent */
        tern__http_access_record(req, req->resp_status);
    if (req->conn)
        req->proto->ended(req);
    else if (!req->live)   /* its stream went before: req was kept for this */
        tern__http_req_free(req);
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
#define REQ_ON_THREAD(req, call) ((req)->conn == NULL || tern__loop_thread_ok((req)->srv->loop, call))

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
    if (req->conn == NULL) {   /* the stream is gone: this ends the request */
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
    /* kept as "name\0value\0" (proto.h) until the protocol writes the head */
    size_t nl = strlen(name) + 1, vl = strlen(value) + 1;
    if (tern__bytes_reserve(&req->fields, nl + vl) < 0)
        return -ENOMEM;
    memcpy(req->fields.data + req->fields.len, name, nl);
    memcpy(req->fields.data + req->fields.len + nl, value, vl);
    req->fields.len += nl + vl;
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
        r = req->proto->head(req, status, content_type, TERN__HTTP_LEN_NONE, NULL, 0);
    } else {
        r = req->proto->head(req, status, content_type, (int64_t)len, body,
                             req->is_head ? 0 : len);
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
    /* The protocol frames a body of unknown length its own way. */
    int r = req->proto->head(req, status, content_type, TERN__HTTP_LEN_STREAM, NULL, 0);
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
    if (req->conn == NULL)
        return -EPIPE;
    if (req->is_head || len == 0)   /* a zero-size chunk would end the body */
        return TERN_SEND_OK;
    req->bytes_out += len;
    TERN__STAT_ADD(req->srv, bytes_out, len);
    return req->proto->body(req, data, len);
}

int tern_http_end(tern_http_req *req) {
    if (req == NULL || !req->started)
        return -EINVAL;
    if (!REQ_ON_THREAD(req, __func__))
        return -EPERM;
    if (req->ended)
        return -EALREADY;
    if (req->conn == NULL) {
        end_response(req);
        return -EPIPE;
    }
    int r = req->proto->end(req);
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
    int r = req->proto->head(req, status, content_type, (int64_t)len, NULL, 0);
    if (r >= 0 && !req->is_head && len > 0) {
        r = req->proto->file(req, fd, offset, len);
        req->bytes_out = len;
        TERN__STAT_ADD(req->srv, bytes_out, len);
    }
    else
        close(fd);
    end_response(req);
    return r;
}

size_t tern_http_buffered(const tern_http_req *req) {
    return req && req->conn ? req->proto->buffered(req) : 0;
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
