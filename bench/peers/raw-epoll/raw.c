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

#include "proto.h"

#define READ_CHUNK (64u << 10)

typedef struct {
    int fd;
    SSL *ssl;      /* NULL without TLS */
    raw_proto st;
    uint32_t events;
    buf in, out;
} conn;

static int ep;
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
    if (c->st.closing) {
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
    while (off < n && !c->st.closing) {
        long k = c->st.ws ? ws_one(&c->st, data + off, n - off, &cork)
                       : http_one(&c->st, data + off, n - off, &cork);
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
    } else if (c->st.closing) {
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
    raw_proto_init();
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
