/* Request accessors: views of the request whose handler is running. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "http/proto.h"
#include "http/server.h"
#include "net/tls.h"

/* Every accessor takes a NULL req: it answers as for a request that is
 * not live. */
static bool is_live(const tern_http_req *req) { return req != NULL && req->live; }

/* The views point into the connection's buffer and are not NUL-terminated:
 * without its length a view would be read with %s past its end, into the
 * rest of the request (issue #25). So a NULL len gets NULL, never the view. */
static const char *view(const char *p, size_t n, size_t *len) {
    if (len == NULL)
        return NULL;
    *len = p ? n : 0;
    return p;
}

const char *tern_http_method(const tern_http_req *req, size_t *len) {
    if (!is_live(req))
        return view(NULL, 0, len);
    return view(req->head->method, req->head->method_len, len);
}

const char *tern_http_path(const tern_http_req *req, size_t *len) {
    if (!is_live(req))
        return view(NULL, 0, len);
    return view(req->head->path, req->head->path_len, len);
}

const char *tern_http_query(const tern_http_req *req, size_t *len) {
    if (!is_live(req))
        return view(NULL, 0, len);
    return view(req->head->query_len ? req->head->query : "", req->head->query_len, len);
}

int tern_http_minor_version(const tern_http_req *req) { return req ? req->minor_version : -EINVAL; }

const char *tern_http_header(const tern_http_req *req, const char *name, size_t *len) {
    const tern__http_header *h =
        is_live(req) && name ? tern__http_find_header(req->head, name) : NULL;
    return h ? view(h->value, h->value_len, len) : view(NULL, 0, len);
}

size_t tern_http_header_count(const tern_http_req *req) {
    return is_live(req) ? req->head->num_headers : 0;
}

void tern_http_header_at(const tern_http_req *req, size_t i, const char **name, size_t *name_len,
                         const char **value, size_t *value_len) {
    const tern__http_header *h =
        is_live(req) && i < req->head->num_headers ? &req->head->headers[i] : NULL;
    const char *n = view(h ? h->name : NULL, h ? h->name_len : 0, name_len);
    const char *v = view(h ? h->value : NULL, h ? h->value_len : 0, value_len);
    if (name)
        *name = n;
    if (value)
        *value = v;
}

/* One decoded value: the raw view itself when it has no escape (most),
 * else its bytes decoded at *out, which moves past them. */
static int decode_one(const char *raw, size_t raw_len, char **out, const char **dec,
                      size_t *dec_len) {
    if (raw == NULL || memchr(raw, '%', raw_len) == NULL) {
        *dec = raw;
        *dec_len = raw_len;
        return 0;
    }
    /* Path segments: '+' is a plus (only forms make it a space). */
    ssize_t n = tern__url_decode(*out, raw_len, raw, raw_len, false);
    if (n < 0 || memchr(*out, '\0', (size_t)n))
        return -EINVAL;   /* a NUL is no name's: C strings would stop at it */
    *dec = *out;
    *dec_len = (size_t)n;
    *out += n;
    return 0;
}

int tern__http_params_decode(tern_server *srv, tern__route_params *p, size_t path_len) {
    /* The values are pieces of the path, none overlapping: their decoded
     * forms, never longer, fit in path_len bytes. */
    if (path_len + 1 > srv->scratch_decoded_cap) {
        char *b = realloc(srv->scratch_decoded, path_len + 1);
        if (b == NULL)
            return -ENOMEM;
        srv->scratch_decoded = b;
        srv->scratch_decoded_cap = path_len + 1;
    }
    char *out = srv->scratch_decoded;
    for (size_t i = 0; i < p->count; i++)
        if (decode_one(p->p[i].value, p->p[i].value_len, &out, &p->p[i].dec, &p->p[i].dec_len) < 0)
            return -EINVAL;
    return decode_one(p->rest, p->rest_len, &out, &p->rest_dec, &p->rest_dec_len);
}

/* A parameter's view: decoded, or as the path has it. */
static const char *param(const tern_http_req *req, const char *name, size_t *len, bool raw) {
    if (!is_live(req) || req->params == NULL || name == NULL)
        return view(NULL, 0, len);
    const tern__route_params *p = req->params;
    if (strcmp(name, "*") == 0) {
        /* rest NULL: no "*" matched (rest_dec is then not this match's) */
        const char *v = p->rest == NULL ? NULL : raw ? p->rest : p->rest_dec;
        return view(v ? v : "", raw ? p->rest_len : p->rest_dec_len, len);
    }
    size_t nl = strlen(name);
    for (size_t i = 0; i < p->count; i++)
        if (p->p[i].name_len == nl && memcmp(p->p[i].name, name, nl) == 0)
            return raw ? view(p->p[i].value, p->p[i].value_len, len)
                       : view(p->p[i].dec, p->p[i].dec_len, len);
    return view(NULL, 0, len);
}

const char *tern_http_param(const tern_http_req *req, const char *name, size_t *len) {
    return param(req, name, len, false);
}

const char *tern_http_param_raw(const tern_http_req *req, const char *name, size_t *len) {
    return param(req, name, len, true);
}

ssize_t tern_http_query_param(const tern_http_req *req, const char *name, char *buf, size_t cap) {
    size_t at = 0;
    return tern_http_query_param_next(req, name, &at, buf, cap);
}

ssize_t tern_http_query_param_next(const tern_http_req *req, const char *name, size_t *at,
                                   char *buf, size_t cap) {
    if (req == NULL || name == NULL || at == NULL || (buf == NULL && cap > 0))
        return -EINVAL;
    if (!req->live)
        return -ENOENT;
    const char *q = req->head->query;
    size_t qlen = req->head->query_len, vlen;
    if (*at >= qlen)
        return -ENOENT;
    const char *v = tern__query_find(q + *at, qlen - *at, name, &vlen);
    if (v == NULL) {
        *at = qlen;
        return -ENOENT;
    }
    *at = (size_t)(v - q) + vlen + 1;   /* past the value and its '&' */
    if (cap == 0)
        return -ENOSPC;
    ssize_t n = tern__url_decode(buf, cap - 1, v, vlen, true);
    if (n >= 0)
        buf[n] = '\0';
    return n;
}

void tern_http_read_body(tern_http_req *req, tern_http_body_fn fn, void *user) {
    if (req == NULL || fn == NULL)
        return;
    if (req->conn == NULL || !req->route->stream || req->ended || req->body_fn)
        return;
    req->body_fn = fn;
    req->body_user = user;
    req->proto->read_body(req);
}

const char *tern_http_body(const tern_http_req *req, size_t *len) {
    if (!is_live(req) || req->body == NULL)
        return view("", 0, len);
    return view(req->body, req->body_len, len);
}

bool tern_http_is_tls(const tern_http_req *req) { return req != NULL && req->tls; }

const char *tern_http_sni(const tern_http_req *req, size_t *len) {
    /* OpenSSL's copy of the name lives with the session: as long as the
     * connection, which a live request has. */
    const char *name = NULL;
    if (is_live(req) && req->conn && req->tls)
        name = req->conn->tp->ops->server_name(req->conn);
    return view(name, name ? strlen(name) : 0, len);
}

int tern_http_peer_cert(const tern_http_req *req, char *subject, size_t cap) {
    if (req == NULL || (subject == NULL && cap > 0))
        return -EINVAL;
    if (cap)
        subject[0] = '\0';
    if (req->conn == NULL || (req->conn->flags & TERN__CONN_CLOSED))
        return -ENOTCONN;
    tern__tls_verify verify = TERN__TLS_VERIFY_OK;
    if (tern__tls_peer_cert(req->conn, subject, cap, &verify) == 0)
        return 0;
    return verify == TERN__TLS_VERIFY_OK ? 1 : -EKEYREJECTED;
}

tern_loop *tern_http_req_loop(const tern_http_req *req) { return req ? req->srv->loop : NULL; }
tern_server *tern_http_req_server(const tern_http_req *req) { return req ? req->srv : NULL; }
void *tern_http_req_user(const tern_http_req *req) { return req ? req->user : NULL; }

void tern_http_req_set_user(tern_http_req *req, void *user) {
    if (req)
        req->user = user;
}

int tern__peer(const tern__conn *c, struct sockaddr_storage *addr, socklen_t *len) {
    if (addr == NULL || len == NULL)
        return -EINVAL;
    if (c == NULL || (c->flags & TERN__CONN_CLOSED))
        return -ENOTCONN;
    if (c->tp->ops->carrier && (c = c->tp->ops->carrier(c)) == NULL)
        return -ENOTCONN;   /* a stream (WebSocket over HTTP/2) whose connection is gone */
    *len = sizeof(*addr);
    if (getpeername(c->io.fd, (struct sockaddr *)addr, len) < 0)
        return -errno;
    return 0;
}

int tern_http_peer(const tern_http_req *req, struct sockaddr_storage *addr, socklen_t *len) {
    if (req == NULL)
        return -EINVAL;
    return tern__peer(req->conn, addr, len);
}

int tern_http_param_int(const tern_http_req *req, const char *name, int64_t *out) {
    if (req == NULL || name == NULL || out == NULL)
        return -EINVAL;
    size_t len;
    const char *v = tern_http_param(req, name, &len);
    if (v == NULL)
        return -ENOENT;
    size_t i = 0;
    bool neg = len > 0 && v[0] == '-';
    if (neg)
        i++;
    if (i == len)
        return -EINVAL;
    /* Accumulated as a negative number, whose range is the larger. */
    int64_t n = 0;
    for (; i < len; i++) {
        if (v[i] < '0' || v[i] > '9')
            return -EINVAL;
        int d = v[i] - '0';
        if (n < (INT64_MIN + d) / 10)
            return -ERANGE;
        n = n * 10 - d;
    }
    if (!neg && n == INT64_MIN)
        return -ERANGE;
    *out = neg ? n : -n;
    return 0;
}
