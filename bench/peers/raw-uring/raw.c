/* raw-uring: raw-epoll's io_uring twin, the io_uring floor for bench/run. One
 * thread, one ring, no library (not even tern; liburing only for the ring's
 * plumbing): the least an io_uring server can do for the same bytes on the
 * wire, to set beside raw-epoll's epoll limit. Plain TCP only: -tls-cert is
 * refused.
 *
 * The protocol is raw-epoll's, with the same parser. HTTP/1.1 (keep-alive,
 * pipelining): GET /ping → "pong"; GET /echo?size=N → N bytes; POST /echo →
 * the body (Content-Length only, no chunked); anything else gets a 400/404.
 * WebSocket on any path: a GET with Sec-WebSocket-Key gets the 101; after it
 * every frame is echoed with the same first byte (FIN, opcode) and the mask
 * removed. Ping → pong, close → close then shut. No UTF-8 check, no fragment
 * reassembly, no limits beyond 16 MiB a frame. It is not a server anyone
 * should use; it is the floor a real io_uring one can be measured against.
 *
 * The ring is SINGLE_ISSUER | DEFER_TASKRUN (no flags where the kernel
 * refuses them), 4096 entries, its fd registered. One multishot accept on
 * the listener; per connection one multishot recv that picks from a ring of
 * 256 provided 32 KiB buffers, each handed back as soon as its completion is
 * parsed (the recv is re-armed after -ENOBUFS or whenever the kernel ends
 * it). Requests and frames are parsed in place in the provided buffer; only
 * an incomplete one is copied into the connection. Answers pile up in the
 * connection's out buffer; at most one send is in flight per connection, and
 * at the end of each batch of completions what piled up goes in one send (a
 * short send re-sends its rest first). With 1 MiB waiting behind a send the
 * recv is cancelled until the send completes (raw-epoll's "stop reading until
 * it drains"). Each turn of the loop is one io_uring_submit_and_wait(1), then
 * every completion there is, in batches. A connection ends with one cancel
 * of everything on its fd; the socket is closed and the struct freed when the
 * last of its operations has completed.
 *
 *   cc -O2 -o raw-uring bench/peers/raw-uring/raw.c -luring &&
 *   ./raw-uring -addr 127.0.0.1:9096
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <liburing.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../raw-epoll/proto.h"

#define NBUF 256                  /* provided buffers: a power of two */
#define BUFSZ (32u << 10)         /* each */
#define BGID 0                    /* their group */
#define OUT_PAUSE (1u << 20)      /* stop receiving with this much unsent */

/* user_data: the connection's address with one of these in its low 3 bits */
enum { T_ACCEPT = 1, T_RECV = 2, T_SEND = 3, T_IGNORE = 4 };
#define TAG_BITS 7u

typedef struct conn {
    int fd;
    raw_proto st;    /* ws, closing */
    int pending;     /* operations in flight: the recv, the send */
    unsigned char dead;      /* ending: cancelled, freed once pending is 0 */
    unsigned char recving;   /* the multishot recv is armed */
    unsigned char paused;    /* recv cancelled until the send completes */
    unsigned char queued;    /* on the flush list */
    struct conn *next;       /* on the flush list */
    size_t sent;             /* of snd, while a send is in flight */
    buf in, out, snd;        /* snd: the bytes of the send in flight */
} conn;

static struct io_uring ring;
static struct io_uring_buf_ring *br;
static unsigned char bufs[NBUF][BUFSZ];
static conn *flush_list;   /* connections with answers to send this turn */


/* ---- the ring ------------------------------------------------------------- */

static struct io_uring_sqe *sqe_get(void) {
    struct io_uring_sqe *s = io_uring_get_sqe(&ring);
    while (s == NULL) {   /* the SQ is full: hand it to the kernel now */
        io_uring_submit(&ring);
        s = io_uring_get_sqe(&ring);
    }
    return s;
}

static void arm_accept(int lfd) {
    struct io_uring_sqe *s = sqe_get();
    io_uring_prep_multishot_accept(s, lfd, NULL, NULL, SOCK_CLOEXEC);
    io_uring_sqe_set_data64(s, T_ACCEPT);
}

static void arm_recv(conn *c) {
    struct io_uring_sqe *s = sqe_get();
    io_uring_prep_recv_multishot(s, c->fd, NULL, 0, 0);
    s->flags |= IOSQE_BUFFER_SELECT;
    s->buf_group = BGID;
    io_uring_sqe_set_data64(s, (uint64_t)(uintptr_t)c | T_RECV);
    c->recving = 1;
    c->pending++;
}

/* Sends what is left of snd from c->sent on. */
static void send_rest(conn *c) {
    struct io_uring_sqe *s = sqe_get();
    io_uring_prep_send(s, c->fd, c->snd.p + c->sent, c->snd.len - c->sent, MSG_NOSIGNAL);
    io_uring_sqe_set_data64(s, (uint64_t)(uintptr_t)c | T_SEND);
    c->pending++;
}

static void give_back(unsigned bid) {
    io_uring_buf_ring_add(br, bufs[bid], BUFSZ, (unsigned short)bid,
                          io_uring_buf_ring_mask(NBUF), 0);
    io_uring_buf_ring_advance(br, 1);
}

static void want_flush(conn *c) {
    if (!c->queued) {
        c->queued = 1;
        c->next = flush_list;
        flush_list = c;
    }
}

static void maybe_free(conn *c) {
    if (!c->dead || c->pending || c->queued)
        return;
    close(c->fd);
    free(c->in.p);
    free(c->out.p);
    free(c->snd.p);
    free(c);
}

/* Ends c: one cancel for all its operations in flight; the socket and the
 * struct go when the last of them has completed. c may be gone after. */
static void conn_end(conn *c) {
    if (!c->dead) {
        c->dead = 1;
        if (c->pending) {
            struct io_uring_sqe *s = sqe_get();
            io_uring_prep_cancel_fd(s, c->fd, IORING_ASYNC_CANCEL_ALL);
            io_uring_sqe_set_data64(s, T_IGNORE);
        }
    }
    maybe_free(c);
}

/* End of a batch: one send for each connection whose answers piled up and
 * that has none in flight. */
static void flush_all(void) {
    while (flush_list != NULL) {
        conn *c = flush_list;
        flush_list = c->next;
        c->queued = 0;
        if (c->dead) {
            maybe_free(c);
            continue;
        }
        if (c->snd.len == 0 && c->out.len) {
            buf t = c->snd;
            c->snd = c->out;
            c->out = t;
            c->sent = 0;
            send_rest(c);
        }
    }
}

/* One received chunk p[0..n), still in its provided buffer: parsed in place
 * when nothing is pending, else behind the pending bytes in c->in. Only an
 * incomplete request or frame left at the end is copied into c->in. Returns
 * -1 to close. */
static int on_data(conn *c, const unsigned char *p, size_t n) {
    const unsigned char *data = p;
    if (c->in.len) {
        buf_put(&c->in, p, n);
        data = c->in.p;
        n = c->in.len;
    }
    size_t off = 0;
    while (off < n && !c->st.closing) {
        long k = c->st.ws ? ws_one(&c->st, data + off, n - off, &c->out)
                       : http_one(&c->st, data + off, n - off, &c->out);
        if (k < 0)
            return -1;
        if (k == 0)
            break;
        off += (size_t)k;
    }
    if (data == p) {
        if (off < n)
            buf_put(&c->in, p + off, n - off);
    } else {
        memmove(c->in.p, c->in.p + off, c->in.len - off);
        c->in.len -= off;
    }
    if (c->out.len) {
        want_flush(c);
        if (c->out.len >= OUT_PAUSE && c->recving && !c->paused) {
            /* stop reading until the peer takes our bytes */
            struct io_uring_sqe *s = sqe_get();
            io_uring_prep_cancel64(s, (uint64_t)(uintptr_t)c | T_RECV, 0);
            io_uring_sqe_set_data64(s, T_IGNORE);
            c->paused = 1;
        }
    }
    return 0;
}

static void on_recv(conn *c, const struct io_uring_cqe *cqe) {
    int r = cqe->res;
    if (!(cqe->flags & IORING_CQE_F_MORE)) {
        c->recving = 0;
        c->pending--;
    }
    if (r > 0) {
        unsigned bid = cqe->flags >> IORING_CQE_BUFFER_SHIFT;
        int bad = !c->dead && !c->st.closing && on_data(c, bufs[bid], (size_t)r) < 0;
        give_back(bid);
        if (bad) {
            conn_end(c);
            return;
        }
    } else if (r == 0 && !c->dead && (c->out.len || c->snd.len)) {
        c->st.closing = 1;   /* the peer is done sending: answer what it sent, then shut */
    } else if (r != -ENOBUFS && r != -ECANCELED) {
        conn_end(c);
        return;
    }
    if (c->dead)
        maybe_free(c);
    else if (!c->recving && !c->paused && !c->st.closing)
        arm_recv(c);
}

static void on_send(conn *c, int r) {
    c->pending--;
    if (c->dead) {
        maybe_free(c);
        return;
    }
    if (r <= 0) {
        conn_end(c);
        return;
    }
    c->sent += (size_t)r;
    if (c->sent < c->snd.len) {
        send_rest(c);   /* a short send: the rest first */
        return;
    }
    c->snd.len = 0;
    if (c->paused) {
        c->paused = 0;
        if (!c->recving && !c->st.closing)
            arm_recv(c);
    }
    if (c->out.len) {
        want_flush(c);
    } else if (c->st.closing) {
        shutdown(c->fd, SHUT_WR);
        conn_end(c);
    }
}

int main(int argc, char **argv) {
    const char *addr = "127.0.0.1:9096";
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "-addr") == 0) {
            addr = argv[++i];
        } else if (strcmp(argv[i], "-tls-cert") == 0 || strcmp(argv[i], "-tls-key") == 0) {
            fprintf(stderr, "raw-uring: no TLS here (plain TCP only); raw-epoll has %s\n",
                    argv[i]);
            return 2;
        }
    char host[64];
    const char *colon = strrchr(addr, ':');
    if (colon == NULL || (size_t)(colon - addr) >= sizeof(host)) {
        fprintf(stderr, "raw-uring: bad -addr %s\n", addr);
        return 2;
    }
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = 0;
    raw_proto_init();
    signal(SIGPIPE, SIG_IGN);

    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1 ||
        bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(lfd, 4096) < 0) {
        perror("raw-uring: listen");
        return 1;
    }

    struct io_uring_params p = {.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN};
    int e = io_uring_queue_init_params(4096, &ring, &p);
    if (e < 0) {   /* an older kernel: no flags */
        memset(&p, 0, sizeof(p));
        e = io_uring_queue_init_params(4096, &ring, &p);
    }
    if (e < 0) {
        fprintf(stderr, "raw-uring: io_uring_queue_init: %s\n", strerror(-e));
        return 1;
    }
    io_uring_register_ring_fd(&ring);   /* best effort: saves an fd lookup per enter */

    br = mmap(NULL, NBUF * sizeof(struct io_uring_buf), PROT_READ | PROT_WRITE,
              MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (br == MAP_FAILED) {
        perror("raw-uring: mmap");
        return 1;
    }
    struct io_uring_buf_reg reg = {.ring_addr = (uint64_t)(uintptr_t)br, .ring_entries = NBUF,
                                   .bgid = BGID};
    e = io_uring_register_buf_ring(&ring, &reg, 0);
    if (e < 0) {
        fprintf(stderr, "raw-uring: io_uring_register_buf_ring: %s\n", strerror(-e));
        return 1;
    }
    io_uring_buf_ring_init(br);
    for (unsigned i = 0; i < NBUF; i++)
        io_uring_buf_ring_add(br, bufs[i], BUFSZ, (unsigned short)i, io_uring_buf_ring_mask(NBUF),
                              (int)i);
    io_uring_buf_ring_advance(br, NBUF);

    arm_accept(lfd);
    struct io_uring_cqe *cqes[512];
    for (;;) {
        e = io_uring_submit_and_wait(&ring, 1);
        if (e < 0 && e != -EINTR && e != -EAGAIN && e != -EBUSY) {
            fprintf(stderr, "raw-uring: io_uring_submit_and_wait: %s\n", strerror(-e));
            return 1;
        }
        unsigned n;
        while ((n = io_uring_peek_batch_cqe(&ring, cqes, 512)) > 0) {
            for (unsigned i = 0; i < n; i++) {
                const struct io_uring_cqe *cqe = cqes[i];
                uint64_t ud = io_uring_cqe_get_data64(cqe);
                conn *c = (conn *)(uintptr_t)(ud & ~(uint64_t)TAG_BITS);
                switch (ud & TAG_BITS) {
                case T_ACCEPT:
                    if (cqe->res >= 0) {
                        setsockopt(cqe->res, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
                        conn *nc = calloc(1, sizeof(*nc));
                        nc->fd = cqe->res;
                        arm_recv(nc);
                    }
                    if (!(cqe->flags & IORING_CQE_F_MORE))
                        arm_accept(lfd);
                    break;
                case T_RECV:
                    on_recv(c, cqe);
                    break;
                case T_SEND:
                    on_send(c, cqe->res);
                    break;
                default:   /* T_IGNORE: a cancel's own completion */
                    break;
                }
            }
            io_uring_cq_advance(&ring, n);
        }
        flush_all();
    }
}
