/* raw-epoll: the "physical limit" peer for bench/run. One thread, one
 * level-triggered epoll loop, no library (not even tern): it does the least
 * a server can do for the same bytes on the wire.
 *
 * With -tls-cert and -tls-key it speaks TLS 1.2/1.3 through OpenSSL, the
 * least a TLS server can do with it: read-ahead, one SSL_read per record
 * until OpenSSL holds nothing more (no read that would only say EAGAIN),
 * all answers to one read in one SSL_write, OpenSSL's buffers kept for the
 * connection's life. That is the limit of the TLS suites.
 *
 * HTTP/1.1 (keep-alive, pipelining): GET /ping → "pong"; GET /echo?size=N →
 * N bytes; POST /echo → the body (Content-Length only, no chunked). Only what
 * the benchmark's clients send is understood; anything else gets a 400/404.
 *
 * WebSocket on any path: a GET with Sec-WebSocket-Key gets the 101; after it
 * every frame is echoed with the same first byte (FIN, opcode) and the mask
 * removed. Ping → pong, close → close then shut. No UTF-8 check, no
 * fragment reassembly (fragments are echoed one by one, which is still a
 * valid echo), no limits beyond 16 MiB a frame. It is not a WebSocket server
 * anyone should use; it is the ceiling a real one can be measured against.
 *
 * Reads go to one shared 256 KiB buffer and are parsed in place; only an
 * incomplete request or frame is copied into the connection. All answers to
 * one read are sent with one send(); what the kernel does not take waits in
 * the connection's out buffer, EPOLLOUT is armed and reading stops until it
 * drains. An idle connection owns its struct and its socket, nothing else.
 *
 *   cc -O2 -o raw bench/peers/raw-epoll/raw.c && ./raw -addr 127.0.0.1:9096
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#define MAX_FRAME (16u << 20)
#define READ_CHUNK (64u << 10)

/* ---- SHA-1 and base64, just for Sec-WebSocket-Accept ---------------------- */

static uint32_t rol(uint32_t x, int n) { return (x << n) | (x >> (32 - n)); }

static void sha1(const unsigned char *msg, size_t len, unsigned char out[20]) {
    uint32_t h[5] = {0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0};
    size_t total = ((len + 8) / 64 + 1) * 64;
    unsigned char *m = calloc(1, total);
    memcpy(m, msg, len);
    m[len] = 0x80;
    uint64_t bits = (uint64_t)len * 8;
    for (int i = 0; i < 8; i++)
        m[total - 1 - i] = (unsigned char)(bits >> (8 * i));
    for (size_t off = 0; off < total; off += 64) {
        uint32_t w[80];
        for (int i = 0; i < 16; i++)
            w[i] = (uint32_t)m[off + 4 * i] << 24 | (uint32_t)m[off + 4 * i + 1] << 16 |
                   (uint32_t)m[off + 4 * i + 2] << 8 | m[off + 4 * i + 3];
        for (int i = 16; i < 80; i++)
            w[i] = rol(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
        uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
        for (int i = 0; i < 80; i++) {
            uint32_t f, k;
            if (i < 20) { f = (b & c) | (~b & d); k = 0x5A827999; }
            else if (i < 40) { f = b ^ c ^ d; k = 0x6ED9EBA1; }
            else if (i < 60) { f = (b & c) | (b & d) | (c & d); k = 0x8F1BBCDC; }
            else { f = b ^ c ^ d; k = 0xCA62C1D6; }
            uint32_t t = rol(a, 5) + f + e + k + w[i];
            e = d; d = c; c = rol(b, 30); b = a; a = t;
        }
        h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e;
    }
    free(m);
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 4; j++)
            out[4 * i + j] = (unsigned char)(h[i] >> (24 - 8 * j));
}

static size_t base64(const unsigned char *in, size_t n, char *out) {
    static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < n ? (uint32_t)in[i + 1] << 8 : 0) |
                     (i + 2 < n ? in[i + 2] : 0);
        out[o++] = t[v >> 18 & 63];
        out[o++] = t[v >> 12 & 63];
        out[o++] = i + 1 < n ? t[v >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? t[v & 63] : '=';
    }
    out[o] = 0;
    return o;
}

/* ---- buffers and connections ---------------------------------------------- */

typedef struct {
    unsigned char *p;
    size_t len, cap;
} buf;

static void buf_reserve(buf *b, size_t extra) {
    if (b->len + extra <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra)
        cap *= 2;
    b->p = realloc(b->p, cap);
    if (b->p == NULL)
        abort();
    b->cap = cap;
}

static void buf_put(buf *b, const void *p, size_t n) {
    buf_reserve(b, n);
    memcpy(b->p + b->len, p, n);
    b->len += n;
}

typedef struct {
    int fd;
    SSL *ssl;      /* NULL without TLS */
    int ws;        /* 1 after the upgrade */
    int closing;   /* shut after the out buffer drains */
    uint32_t events;
    buf in, out;
} conn;

static int ep;
static unsigned char xs[1 << 20];
static SSL_CTX *tls;   /* NULL: plain TCP */

static void conn_free(conn *c) {
    SSL_free(c->ssl);
    close(c->fd);
    free(c->in.p);
    free(c->out.p);
    free(c);
}

static void set_events(conn *c, uint32_t ev) {
    if (ev == c->events)
        return;
    struct epoll_event e = {.events = ev, .data.ptr = c};
    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &e);
    c->events = ev;
}

/* recv() or SSL_read(): bytes read, 0 at the end, -1 with errno EAGAIN
 * when there is nothing yet (or the handshake wants more), -1 on errors. */
static ssize_t io_recv(conn *c, void *p, size_t n) {
    if (c->ssl == NULL)
        return recv(c->fd, p, n, 0);
    int r = SSL_read(c->ssl, p, n > 1u << 30 ? 1 << 30 : (int)n);
    if (r > 0)
        return r;
    int e = SSL_get_error(c->ssl, r);
    ERR_clear_error();
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        errno = EAGAIN;
        return -1;
    }
    if (e == SSL_ERROR_ZERO_RETURN)
        return 0;
    errno = EIO;
    return -1;
}

/* send() or SSL_write(), the same way. */
static ssize_t io_send(conn *c, const void *p, size_t n) {
    if (c->ssl == NULL)
        return send(c->fd, p, n, MSG_NOSIGNAL);
    int r = SSL_write(c->ssl, p, n > 1u << 30 ? 1 << 30 : (int)n);
    if (r > 0)
        return r;
    int e = SSL_get_error(c->ssl, r);
    ERR_clear_error();
    errno = e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE ? EAGAIN : EIO;
    return -1;
}

/* Finds header `name` (lower case, with the colon) in head[0..n); returns
 * its value (spaces skipped) and sets *vl, or NULL. */
static const char *header(const char *head, size_t n, const char *name, size_t *vl) {
    size_t nl = strlen(name);
    const char *end = head + n;
    for (const char *l = memchr(head, '\n', n); l != NULL && l + 1 + nl < end;
         l = memchr(l + 1, '\n', (size_t)(end - l - 1))) {
        if (strncasecmp(l + 1, name, nl) == 0) {
            const char *v = l + 1 + nl;
            while (v < end && *v == ' ')
                v++;
            const char *e = v;
            while (e < end && *e != '\r' && *e != '\n')
                e++;
            *vl = (size_t)(e - v);
            return v;
        }
    }
    return NULL;
}

static void http_reply(buf *out, const char *status, const char *type, const void *body,
                       size_t n) {
    char h[160];
    int hl = snprintf(h, sizeof(h), "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n\r\n",
                      status, type, n);
    buf_reserve(out, (size_t)hl + n);
    memcpy(out->p + out->len, h, (size_t)hl);
    memcpy(out->p + out->len + hl, body, n);
    out->len += (size_t)hl + n;
}

/* Handles one HTTP request at the front of data[0..n), answering into out;
 * returns bytes consumed, 0 when incomplete, -1 to close. */
static long http_one(conn *c, const unsigned char *data, size_t n, buf *out) {
    const char *p = (const char *)data;
    const char *eoh = memmem(p, n, "\r\n\r\n", 4);
    if (eoh == NULL)
        return n > 65536 ? -1 : 0;
    size_t hl = (size_t)(eoh - p) + 4;
    size_t vl;
    const char *key = header(p, hl, "sec-websocket-key:", &vl);
    if (key != NULL && strncmp(p, "GET ", 4) == 0) {
        char cat[128];
        if (vl > 60)
            return -1;
        memcpy(cat, key, vl);
        memcpy(cat + vl, "258EAFA5-E914-47DA-95CA-C5AB0DC85B11", 36);
        unsigned char d[20];
        char acc[32];
        sha1((unsigned char *)cat, vl + 36, d);
        base64(d, 20, acc);
        char r[256];
        int rl = snprintf(r, sizeof(r),
                          "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                          "Connection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n", acc);
        buf_put(out, r, (size_t)rl);
        c->ws = 1;
        return (long)hl;
    }
    size_t body = 0;
    const char *cl = header(p, hl, "content-length:", &vl);
    if (cl != NULL)
        body = strtoul(cl, NULL, 10);
    if (body > MAX_FRAME)
        return -1;
    if (n < hl + body)
        return 0;
    if (strncmp(p, "GET /ping ", 10) == 0) {
        http_reply(out, "200 OK", "text/plain", "pong", 4);
    } else if (strncmp(p, "GET /echo?size=", 15) == 0) {
        size_t sz = strtoul(p + 15, NULL, 10);
        if (sz > sizeof(xs))
            http_reply(out, "400 Bad Request", "text/plain", "bad size", 8);
        else
            http_reply(out, "200 OK", "application/octet-stream", xs, sz);
    } else if (strncmp(p, "POST /echo ", 11) == 0) {
        http_reply(out, "200 OK", "application/octet-stream", p + hl, body);
    } else {
        http_reply(out, "404 Not Found", "text/plain", "not found", 9);
    }
    return (long)(hl + body);
}

/* Echoes one frame at the front of p[0..n) into out; returns bytes consumed,
 * 0 when incomplete, -1 to close. */
static long ws_one(conn *c, const unsigned char *p, size_t n, buf *out) {
    if (n < 2)
        return 0;
    uint64_t len = p[1] & 0x7f;
    size_t h = 2;
    if (len == 126) {
        if (n < 4)
            return 0;
        len = (uint64_t)p[2] << 8 | p[3];
        h = 4;
    } else if (len == 127) {
        if (n < 10)
            return 0;
        len = 0;
        for (int i = 0; i < 8; i++)
            len = len << 8 | p[2 + i];
        h = 10;
    }
    if (len > MAX_FRAME || !(p[1] & 0x80))
        return -1;   /* clients must mask */
    if (n < h + 4 + len)
        return 0;
    const unsigned char *mask = p + h;
    const unsigned char *pay = p + h + 4;
    unsigned char b0 = p[0], op = b0 & 0x0f;
    if (op == 0x9)
        b0 = (b0 & 0xf0) | 0xA;   /* ping → pong */
    if (op == 0xA)
        return (long)(h + 4 + len);   /* unsolicited pong: nothing */
    buf_reserve(out, 10 + len);
    unsigned char *o = out->p + out->len;
    o[0] = b0;
    size_t oh;
    if (len < 126) {
        o[1] = (unsigned char)len;
        oh = 2;
    } else if (len < 65536) {
        o[1] = 126;
        o[2] = (unsigned char)(len >> 8);
        o[3] = (unsigned char)len;
        oh = 4;
    } else {
        o[1] = 127;
        for (int i = 0; i < 8; i++)
            o[2 + i] = (unsigned char)(len >> (56 - 8 * i));
        oh = 10;
    }
    unsigned char *d = o + oh;
    uint64_t m8;
    uint32_t m4;
    memcpy(&m4, mask, 4);
    m8 = (uint64_t)m4 << 32 | m4;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t v;
        memcpy(&v, pay + i, 8);
        v ^= m8;
        memcpy(d + i, &v, 8);
    }
    for (; i < len; i++)
        d[i] = pay[i] ^ mask[i & 3];
    out->len += oh + len;
    if (op == 0x8)
        c->closing = 1;
    return (long)(h + 4 + len);
}

/* Sends what is in out; returns -1 on error. Re-arms interest. */
static int flush_out(conn *c) {
    size_t off = 0;
    while (off < c->out.len) {
        ssize_t w = io_send(c, c->out.p + off, c->out.len - off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN)
                break;
            return -1;
        }
        off += (size_t)w;
    }
    memmove(c->out.p, c->out.p + off, c->out.len - off);
    c->out.len -= off;
    if (c->out.len) {
        set_events(c, EPOLLOUT);   /* stop reading until the peer takes our bytes */
        return 0;
    }
    if (c->closing) {
        if (c->ssl)
            SSL_shutdown(c->ssl);
        shutdown(c->fd, SHUT_WR);
        return -1;
    }
    set_events(c, EPOLLIN);
    return 0;
}

/* One read: into the shared read buffer when nothing is pending (the common
 * case: no copy, no per-connection memory), else behind the pending bytes in
 * the connection's own buffer. Only an incomplete request or frame left at
 * the end is copied into the connection. Answers go to the shared cork and
 * out with one send; what the kernel does not take is kept in c->out. */
static unsigned char rbuf[256u << 10];
static buf cork;

static void on_readable(conn *c) {
    const unsigned char *data;
    size_t n;
    ssize_t r;
    if (c->in.len == 0) {
        r = io_recv(c, rbuf, sizeof(rbuf));
        /* TLS: the rest of what read-ahead took in, a record at a time */
        while (r > 0 && c->ssl && SSL_has_pending(c->ssl) && (size_t)r < sizeof(rbuf)) {
            ssize_t k = io_recv(c, rbuf + r, sizeof(rbuf) - (size_t)r);
            if (k <= 0)
                break;
            r += k;
        }
        data = rbuf;
    } else {
        buf_reserve(&c->in, READ_CHUNK);
        r = io_recv(c, c->in.p + c->in.len, c->in.cap - c->in.len);
        data = c->in.p;
    }
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
        conn_free(c);
        return;
    }
    if (r < 0)
        return;
    if (data == rbuf)
        n = (size_t)r;
    else
        n = c->in.len += (size_t)r;
    cork.len = 0;
    size_t off = 0;
    while (off < n && !c->closing) {
        long k = c->ws ? ws_one(c, data + off, n - off, &cork)
                       : http_one(c, data + off, n - off, &cork);
        if (k < 0) {
            conn_free(c);
            return;
        }
        if (k == 0)
            break;
        off += (size_t)k;
    }
    if (data == rbuf) {
        if (off < n)
            buf_put(&c->in, rbuf + off, n - off);
    } else {
        memmove(c->in.p, c->in.p + off, c->in.len - off);
        c->in.len -= off;
    }
    if (cork.len == 0)
        return;
    size_t sent = 0;
    while (sent < cork.len) {
        ssize_t w = io_send(c, cork.p + sent, cork.len - sent);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN)
                break;
            conn_free(c);
            return;
        }
        sent += (size_t)w;
    }
    if (sent < cork.len) {
        buf_put(&c->out, cork.p + sent, cork.len - sent);
        set_events(c, EPOLLOUT);   /* stop reading until the peer takes our bytes */
    } else if (c->closing) {
        if (c->ssl)
            SSL_shutdown(c->ssl);
        shutdown(c->fd, SHUT_WR);
        conn_free(c);
    } else if (c->ssl && SSL_has_pending(c->ssl)) {
        on_readable(c);   /* OpenSSL holds more records than fitted: no event will say so */
    }
}

int main(int argc, char **argv) {
    const char *addr = "127.0.0.1:9096", *cert = NULL, *key = NULL;
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "-addr") == 0)
            addr = argv[++i];
        else if (strcmp(argv[i], "-tls-cert") == 0)
            cert = argv[++i];
        else if (strcmp(argv[i], "-tls-key") == 0)
            key = argv[++i];
    if (cert && key) {
        tls = SSL_CTX_new(TLS_server_method());
        if (tls == NULL || !SSL_CTX_set_min_proto_version(tls, TLS1_2_VERSION) ||
            SSL_CTX_use_certificate_chain_file(tls, cert) != 1 ||
            SSL_CTX_use_PrivateKey_file(tls, key, SSL_FILETYPE_PEM) != 1) {
            ERR_print_errors_fp(stderr);
            return 1;
        }
        SSL_CTX_set_mode(tls, SSL_MODE_ENABLE_PARTIAL_WRITE |
                                  SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
        SSL_CTX_set_read_ahead(tls, 1);
    }
    char host[64];
    const char *colon = strrchr(addr, ':');
    if (colon == NULL || (size_t)(colon - addr) >= sizeof(host)) {
        fprintf(stderr, "raw: bad -addr %s\n", addr);
        return 2;
    }
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = 0;
    memset(xs, 'x', sizeof(xs));
    signal(SIGPIPE, SIG_IGN);

    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1 ||
        bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(lfd, 4096) < 0) {
        perror("raw: listen");
        return 1;
    }
    ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event le = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &le);
    struct epoll_event evs[512];
    for (;;) {
        int n = epoll_wait(ep, evs, 512, -1);
        for (int i = 0; i < n; i++) {
            conn *c = evs[i].data.ptr;
            if (c == NULL) {
                for (;;) {
                    int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                    if (fd < 0)
                        break;
                    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
                    conn *nc = calloc(1, sizeof(*nc));
                    nc->fd = fd;
                    nc->events = EPOLLIN;
                    if (tls) {   /* the handshake runs inside the first SSL_read */
                        nc->ssl = SSL_new(tls);
                        SSL_set_fd(nc->ssl, fd);
                        SSL_set_accept_state(nc->ssl);
                    }
                    struct epoll_event e = {.events = EPOLLIN, .data.ptr = nc};
                    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e);
                }
            } else if (evs[i].events & EPOLLOUT) {
                if (flush_out(c) < 0)
                    conn_free(c);
            } else {
                on_readable(c);
            }
        }
    }
}
