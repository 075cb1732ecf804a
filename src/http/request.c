/* Request accessors: views of the request whose handler is running. */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "http/server.h"

const char *tern_http_method(const tern_http_req *req, size_t *len) {
    if (!req->live) { *len = 0; return NULL; }
    *len = req->head->method_len;
    return req->head->method;
}

const char *tern_http_path(const tern_http_req *req, size_t *len) {
    if (!req->live) { *len = 0; return NULL; }
    *len = req->head->path_len;
    return req->head->path;
}

const char *tern_http_query(const tern_http_req *req, size_t *len) {
    if (!req->live) { *len = 0; return NULL; }
    *len = req->head->query_len;
    return req->head->query_len ? req->head->query : "";
}

int tern_http_minor_version(const tern_http_req *req) { return req->minor_version; }

const char *tern_http_header(const tern_http_req *req, const char *name, size_t *len) {
    const tern__http_header *h = req->live ? tern__http_find_header(req->head, name) : NULL;
    *len = h ? h->value_len : 0;
    return h ? h->value : NULL;
}

size_t tern_http_header_count(const tern_http_req *req) {
    return req->live ? req->head->num_headers : 0;
}

void tern_http_header_at(const tern_http_req *req, size_t i, const char **name, size_t *name_len,
                         const char **value, size_t *value_len) {
    if (!req->live || i >= req->head->num_headers) {
        *name = *value = NULL;
        *name_len = *value_len = 0;
        return;
    }
    const tern__http_header *h = &req->head->headers[i];
    *name = h->name;
    *name_len = h->name_len;
    *value = h->value;
    *value_len = h->value_len;
}

const char *tern_http_param(const tern_http_req *req, const char *name, size_t *len) {
    *len = 0;
    if (!req->live || req->params == NULL)
        return NULL;
    const tern__route_params *p = req->params;
    if (strcmp(name, "*") == 0) {
        *len = p->rest_len;
        return p->rest ? p->rest : "";
    }
    size_t nl = strlen(name);
    for (size_t i = 0; i < p->count; i++)
        if (p->p[i].name_len == nl && memcmp(p->p[i].name, name, nl) == 0) {
            *len = p->p[i].value_len;
            return p->p[i].value;
        }
    return NULL;
}

ssize_t tern_http_query_param(const tern_http_req *req, const char *name, char *buf, size_t cap) {
    if (!req->live)
        return -ENOENT;
    size_t vlen;
    const char *v = tern__query_find(req->head->query, req->head->query_len, name, &vlen);
    if (v == NULL)
        return -ENOENT;
    if (cap == 0)
        return -ENOSPC;
    ssize_t n = tern__url_decode(buf, cap - 1, v, vlen, true);
    if (n >= 0)
        buf[n] = '\0';
    return n;
}

const char *tern_http_body(const tern_http_req *req, size_t *len) {
    if (!req->live || req->body == NULL) {
        *len = 0;
        return "";
    }
    *len = req->body_len;
    return req->body;
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
    *len = sizeof(*addr);
    if (getpeername(c->io.fd, (struct sockaddr *)addr, len) < 0)
        return -errno;
    return 0;
}

int tern_http_peer(const tern_http_req *req, struct sockaddr_storage *addr, socklen_t *len) {
    if (req == NULL)
        return -EINVAL;
    return tern__peer(req->hc ? &req->hc->conn : NULL, addr, len);
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
