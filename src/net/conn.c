/* Connections: reading into the shared buffer, corked writes, backlog,
 * sendfile, graceful close. See conn.h for the data path. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include "loop/bytes.h"
#include "loop/log.h"
#include "net/conn.h"
#include "platform/platform.h"

#define TERN__CORK_CAP (128 * 1024)
/* Writes larger than this always go straight to a transport that coalesces. */
#define TERN__DIRECT_MIN 1024
#define TERN__LINGER_MS 2000
#define TERN__IN_MIN_ROOM 4096

/* The loop's net state.
 * Invariants: cork[0..cork_len) belongs to cork_owner (NULL iff cork_len
 * is 0 or nothing was written yet); pending is a list of connections
 * needing work at the batch end (re-feed, a deferred close, or a deferred
 * protocol notice); closed lists connections whose fd is closed, freed at
 * the batch end; unsent is the sum of every connection's buf_live(out). */
typedef struct tern__net {
    tern__conn *cork_owner;
    size_t cork_len;
    size_t unsent;
    tern__conn *pending;
    tern__conn *closed;
    /* The connection whose last write in this batch went straight to its
     * coalescing transport (only compared, never followed). */
    const tern__conn *direct_last;
    char cork[TERN__CORK_CAP];
} tern__net;

/* Close at the batch end: a send failed, or the connection's end was
 * decided inside a caller that must not see on_close. */
enum { TERN__CONN_FAILED = 1u << 9 };

/* The error kept for on_close shares out_limit's word so that an idle
 * connection stays this size (docs/ARCHITECTURE.md's budget). */
_Static_assert(sizeof(tern__conn) <= 128, "tern__conn grew past 128 bytes");

/* tern__conn.flags is 16 bits: the owner has the other 16 (owner_tag). */
_Static_assert(TERN__CONN_CONNECTING <= 0x8000, "the flags fit in tern__conn.flags");

static void conn_timeout(tern__wheel_entry *e);

/* net's loop slot (its tern__net), keyed at first use. */
static int net_slot(void) {
    static _Atomic int key;
    return tern__loop_slot_key(&key);
}

static tern__net *net_of(tern_loop *loop) {
    void **slot = tern__loop_slot(loop, net_slot());
    if (*slot == NULL) {
        tern__net *n = malloc(sizeof(*n));
        if (n == NULL)
            return NULL;
        n->cork_owner = NULL;
        n->cork_len = 0;
        n->unsent = 0;
        n->pending = n->closed = NULL;
        n->direct_last = NULL;
        *slot = n;
        tern__loop_set_batch_end(loop, tern__net_flush);
        tern__wheel_set_fn(loop, conn_timeout);
    }
    return *slot;
}

static void conn_io(tern__io *io, uint32_t revents);
static int flush_backlog(tern__conn *c);

/* ---- buffers ---------------------------------------------------------- */

static size_t buf_live(const tern__buf *b) { return b ? b->len - b->off : 0; }

/* Makes room for n more bytes at the end of *bp (allocating it), moving
 * live bytes to the front first when that is enough.
 * tern__buf is not a tern__bytes: its header and bytes are one allocation
 * that exists only while bytes wait, so an idle connection holds one NULL
 * pointer per direction (tern__conn stays 128 bytes). It grows by the same
 * policy, tern__bytes_grow_cap. */
static int buf_reserve(tern__buf **bp, size_t n) {
    tern__buf *b = *bp;
    if (b == NULL) {
        size_t cap = tern__bytes_grow_cap(0, n);
        if (cap > SIZE_MAX - sizeof(*b))
            return -ENOMEM;
        b = malloc(sizeof(*b) + cap);
        if (b == NULL)
            return -ENOMEM;
        b->off = b->len = 0;
        b->cap = cap;
        *bp = b;
        return 0;
    }
    if (b->cap - b->len >= n)
        return 0;
    if (b->off > 0) {
        memmove(b->data, b->data + b->off, b->len - b->off);
        b->len -= b->off;
        b->off = 0;
        if (b->cap - b->len >= n)
            return 0;
    }
    if (n > SIZE_MAX - sizeof(*b) - b->len)
        return -ENOMEM;
    size_t cap = tern__bytes_grow_cap(b->cap, b->len + n);
    if (cap > SIZE_MAX - sizeof(*b))
        return -ENOMEM;
    b = realloc(b, sizeof(*b) + cap);
    if (b == NULL)
        return -ENOMEM;
    b->cap = cap;
    *bp = b;
    return 0;
}

static int buf_append(tern__buf **bp, const void *data, size_t n) {
    if (n == 0)
        return 0;
    int err = buf_reserve(bp, n);
    if (err < 0)
        return err;
    memcpy((*bp)->data + (*bp)->len, data, n);
    (*bp)->len += n;
    return 0;
}

/* ---- the backlog ------------------------------------------------------ */

/* Appends to c's backlog within the loop's bound on all backlogs together:
 * -ENOBUFS past it (the caller fails the connection). */
static int out_append(tern__conn *c, const void *data, size_t len) {
    tern__net *n = net_of(c->loop);
    if (len == 0)
        return 0;
    if (n->unsent + len > tern__loop_max_unsent(c->loop)) {
        tern__log(TERN_LOG_WARN, TERN__LOG_UNSENT,
                  "net: %zu bytes unsent on this loop, the bound: closing a connection", n->unsent);
        return -ENOBUFS;
    }
    bool fresh = c->out == NULL;
    int err = buf_append(&c->out, data, len);
    if (err < 0)
        return err;
    if (fresh)
        c->out->clock = (tern__send_clock){tern_loop_now(c->loop), -1, 0, 0};
    n->unsent += len;
    return 0;
}

/* The kernel took w bytes of the backlog: that is progress. */
static void out_taken(tern__conn *c, size_t w) {
    c->out->off += w;
    c->out->clock.stamp = tern_loop_now(c->loop);
    c->out->clock.taken += w;
    net_of(c->loop)->unsent -= w;
}

static void out_drop(tern__conn *c) {
    if (c->out)
        net_of(c->loop)->unsent -= buf_live(c->out);
    free(c->out);
    c->out = NULL;
}

/* ---- lifecycle -------------------------------------------------------- */

static void list_remove(tern__conn *c) {
    tern__conn_list *l = c->list;
    if (l == NULL)
        return;
    if (c->list_prev)
        c->list_prev->list_next = c->list_next;
    else
        l->head = c->list_next;
    if (c->list_next)
        c->list_next->list_prev = c->list_prev;
    l->count--;
    c->list = NULL;
    c->list_next = c->list_prev = NULL;
}

static void list_add(tern__conn *c, tern__conn_list *l) {
    c->list = l;
    c->list_prev = NULL;
    c->list_next = l ? l->head : NULL;
    if (l) {
        if (l->head)
            l->head->list_prev = c;
        l->head = c;
        l->count++;
    }
}

int tern__conn_start(tern_loop *loop, tern__conn *c, int fd, const tern__conn_proto *proto,
                     tern__conn_list *list) {
    if (net_of(loop) == NULL)
        return -ENOMEM;
    memset(c, 0, sizeof(*c));
    c->loop = loop;
    c->proto = proto;
    c->tp = &tern__plain_transport;
    tern__io_init(&c->io, fd, conn_io);
    tern__wheel_init_entry(&c->timeout);
    int err = tern__io_set(loop, &c->io, TERN__IO_IN | TERN__IO_RDHUP);
    if (err < 0)
        return err;
    /* On a completion back end the loop moves the bytes itself. */
    if (tern__io_stream(loop, &c->io, true))
        c->tp = &tern__stream_transport;
    list_add(c, list);
    tern__loop_hold(loop);   /* until release(): tern_loop_free waits for it */
    return 0;
}

int tern__conn_start_carried(tern_loop *loop, tern__conn *c, tern__transport *tp,
                             const tern__conn_proto *proto, tern__conn_list *list) {
    if (net_of(loop) == NULL)
        return -ENOMEM;
    memset(c, 0, sizeof(*c));
    c->loop = loop;
    c->proto = proto;
    c->tp = tp;
    tern__io_init(&c->io, -1, conn_io);
    tern__wheel_init_entry(&c->timeout);
    int err = tern__io_set(loop, &c->io, TERN__IO_IN | TERN__IO_RDHUP);   /* recorded only */
    if (err < 0)
        return err;
    list_add(c, list);
    tern__loop_hold(loop);   /* until release(), as a socket's */
    return 0;
}

static void add_pending(tern__conn *c) {
    if (c->flags & TERN__CONN_PENDING)
        return;
    tern__net *n = net_of(c->loop);
    c->flags |= TERN__CONN_PENDING;
    c->pending_next = n->pending;
    n->pending = c;
}

/* Frees what a connection holds besides its struct. */
static void release(tern__conn *c) {
    tern__net *n = net_of(c->loop);
    if (n->cork_owner == c) {
        n->cork_owner = NULL;
        n->cork_len = 0;
    }
    tern__wheel_set(c->loop, &c->timeout, 0);
    /* Off the owner's list, but the owner stays known: the protocol's
     * on_close finds its server through it. */
    tern__conn_list *owner = c->list;
    list_remove(c);
    c->list = owner;
    /* c->in stays until the batch end: the protocol may be reading it. */
    out_drop(c);
    if (c->file) {
        close(c->file->fd);
        free(c->file);
        c->file = NULL;
    }
    c->tp->ops->release(c);
    c->tp = &tern__plain_transport;
    c->flags |= TERN__CONN_CLOSED;
    tern__loop_release(c->loop);
    c->next_free = n->closed;
    n->closed = c;
}

/* tern__conn_close; dropping: the peer stopped reading, so what the back
 * end still holds to send is dropped rather than given time to go. */
static void close_conn(tern__conn *c, int err, bool dropping) {
    if (c->flags & TERN__CONN_CLOSED)
        return;
    /* A failure kept for the batch end came first: it is what went wrong
     * (a reset read after a failed send is its consequence). */
    if ((c->flags & TERN__CONN_FAILED) && c->err != 0)
        err = c->err;
    c->err = err;
    if (dropping)
        tern__io_close_dropping(c->loop, &c->io);
    else
        tern__io_close(c->loop, &c->io);
    release(c);
    c->proto->on_close(c, err);
}

void tern__conn_close(tern__conn *c, int err) { close_conn(c, err, false); }

int tern__conn_move(tern__conn *from, tern__conn *to, const tern__conn_proto *proto) {
    tern__net *n = net_of(from->loop);
    *to = *from;
    to->proto = proto;
    to->flags &= ~(TERN__CONN_PENDING | TERN__CONN_DEFERRED);
    to->in = NULL;
    to->list = NULL;
    to->list_next = to->list_prev = NULL;
    /* epoll must point at the new struct before anything else happens. */
    int err = tern__io_moved(from->loop, &to->io);
    if (err < 0)
        return err;
    tern__wheel_init_entry(&to->timeout);
    tern__wheel_set(from->loop, &from->timeout, 0);
    list_add(to, from->list);
    list_remove(from);
    if (n->cork_owner == from)
        n->cork_owner = to;
    if (to->tp->ops->moved)
        to->tp->ops->moved(to);   /* a carried stream: its carrier reports to `to` now */
    /* from keeps its own input buffer (the caller may be reading it) and
     * is freed at the batch end; its output now belongs to `to`. */
    from->out = NULL;
    from->file = NULL;
    from->tp = &tern__plain_transport;
    from->flags |= TERN__CONN_CLOSED;
    from->err = 0;   /* moved, not failed */
    from->next_free = n->closed;
    n->closed = from;
    return 0;
}

/* Hands bytes the protocol has not seen to a connection, for the moved-to
 * side of an upgrade: they are fed at the end of this batch. */
int tern__conn_inject(tern__conn *c, const char *data, size_t len) {
    if (len == 0)
        return 0;
    int err = buf_append(&c->in, data, len);
    if (err < 0)
        return err;
    add_pending(c);
    return 0;
}

/* A send failed, or a close was decided inside a caller: close at the
 * batch end, not inside the caller (which may be a user's call, or another
 * connection's protocol code, mid-parse). err (0 for a close decided, not
 * an error) is kept for on_close; a later failure does not replace it. */
static void fail(tern__conn *c, int err) {
    if (c->flags & (TERN__CONN_CLOSED | TERN__CONN_FAILED))
        return;
    c->flags |= TERN__CONN_FAILED;
    c->err = err;
    add_pending(c);
}

void tern__conn_set_out_limit(tern__conn *c, size_t bytes) {
    if (c->flags & (TERN__CONN_CLOSED | TERN__CONN_FAILED))
        return;
    c->out_limit = bytes > UINT32_MAX ? UINT32_MAX : (uint32_t)bytes;
}

int tern__conn_error(const tern__conn *c) {
    return (c->flags & (TERN__CONN_CLOSED | TERN__CONN_FAILED)) ? c->err : 0;
}

/* ---- writing ---------------------------------------------------------- */

static bool closing(const tern__conn *c) {
    return c->flags & (TERN__CONN_CLOSED | TERN__CONN_FAILED | TERN__CONN_FLUSH_CLOSE |
                       TERN__CONN_LINGER);
}

/* Bytes wait: TERN__IO_OUT tells when the kernel takes more, unless the
 * transport must read before it can write (then the next read retries). */
static void arm_out(tern__conn *c) {
    if (c->flags & TERN__CONN_SEND_WANTS_IN)
        return;
    int err = tern__io_set(c->loop, &c->io, c->io.events | TERN__IO_OUT);
    if (err < 0)
        fail(c, err);
}

/* The new transport (TLS) does its socket I/O through the one it
 * replaces (plain, or the back end's stream), which it took from c->tp
 * before this call: on io_uring a TLS connection keeps the completions. */
void tern__conn_set_transport(tern__conn *c, tern__transport *tp) { c->tp = tp; }

void tern__conn_recv_wants_out(tern__conn *c) {
    c->flags |= TERN__CONN_RECV_WANTS_OUT;
    int err = tern__io_set(c->loop, &c->io, c->io.events | TERN__IO_OUT);
    if (err < 0)
        fail(c, err);
}

void tern__conn_send_wants_in(tern__conn *c) { c->flags |= TERN__CONN_SEND_WANTS_IN; }

/* A backlog has just begun: unless the protocol has a clock of its own
 * running, the send clock watches it. */
static void backlog_started(tern__conn *c) {
    if (!tern__wheel_armed(&c->timeout))
        tern__conn_send_clock(c);
}

static size_t iov_bytes(const struct iovec *iov, int iovcnt) {
    size_t total = 0;
    for (int i = 0; i < iovcnt; i++)
        total += iov[i].iov_len;
    return total;
}

/* Writes iov to the socket now; what the kernel does not take goes to the
 * backlog. Returns TERN_SEND_OK or TERN_SEND_BUFFERED. */
static int send_now(tern__conn *c, const struct iovec *iov, int iovcnt) {
    size_t total = iov_bytes(iov, iovcnt);
    ssize_t w = c->tp->ops->send(c, iov, iovcnt);
    if (w < 0) {
        if (w != -EAGAIN) {
            fail(c, (int)w);
            return TERN_SEND_OK;   /* the close tells the protocol, once */
        }
        w = 0;
    }
    if ((size_t)w == total)
        return TERN_SEND_OK;
    size_t skip = (size_t)w;
    for (int i = 0; i < iovcnt; i++) {
        if (skip >= iov[i].iov_len) {
            skip -= iov[i].iov_len;
            continue;
        }
        int err = out_append(c, (char *)iov[i].iov_base + skip, iov[i].iov_len - skip);
        if (err < 0) {
            fail(c, err);
            return TERN_SEND_OK;
        }
        skip = 0;
    }
    arm_out(c);
    backlog_started(c);
    return TERN_SEND_BUFFERED;
}

static void cork_flush(tern__net *n) {
    tern__conn *c = n->cork_owner;
    if (c == NULL)
        return;
    n->cork_owner = NULL;
    if (n->cork_len == 0)
        return;
    struct iovec iov = {n->cork, n->cork_len};
    n->cork_len = 0;
    send_now(c, &iov, 1);
    if ((c->flags & TERN__CONN_FLUSH_CLOSE) && c->out == NULL && c->file == NULL)
        add_pending(c);
}

/* Makes c the owner of n's cork (n: c's loop's), flushing the previous
 * owner's bytes. */
static void cork_take(tern__net *n, tern__conn *c) {
    if (n->cork_owner != c) {
        cork_flush(n);
        n->cork_owner = c;
    }
}

/* tern__conn_buffered with c's loop's net already at hand. */
static size_t buffered(const tern__net *n, const tern__conn *c) {
    size_t b = tern__conn_backlog(c);
    if (n && n->cork_owner == c)
        b += n->cork_len;
    return b;
}

int tern__conn_writev(tern__conn *c, const struct iovec *iov, int iovcnt) {
    if (closing(c))
        return -EPIPE;
    /* A transport that gathers the batch's writes itself (the stream
     * transport) is written to directly, without the cork, which would
     * only copy the bytes once more; what the cork holds for c goes
     * first. Except a small write that follows one of c's in the same
     * batch (pipelined answers): copying a few bytes into the cork costs
     * less than the way down to the transport, which the cork's flush
     * then takes once for all of them. The loop's net is looked up once,
     * here, for every path below (a write per message). */
    tern__net *net = net_of(c->loop);
    bool direct = c->tp->ops->coalesces &&
                  (net->direct_last != c || iov_bytes(iov, iovcnt) > TERN__DIRECT_MIN);
    if (direct && net->cork_owner == c) {
        cork_flush(net);
        if (closing(c))
            return -EPIPE;
    }
    if (c->out || c->file) {
        /* Already behind: keep order by queueing after the backlog. */
        if (c->out_limit && buffered(net, c) + iov_bytes(iov, iovcnt) > c->out_limit)
            return TERN_SEND_DROPPED;
        for (int i = 0; i < iovcnt; i++) {
            int err = out_append(c, iov[i].iov_base, iov[i].iov_len);
            if (err < 0) {
                fail(c, err);
                return err;
            }
        }
        return TERN_SEND_BUFFERED;
    }
    if (direct) {
        net->direct_last = c;
        return send_now(c, iov, iovcnt);   /* which counts the bytes itself */
    }
    cork_take(net, c);
    if (net->cork_len + iov_bytes(iov, iovcnt) <= TERN__CORK_CAP) {
        for (int i = 0; i < iovcnt; i++) {
            if (iov[i].iov_len == 0)  /* iov_base may be NULL then */
                continue;
            memcpy(net->cork + net->cork_len, iov[i].iov_base, iov[i].iov_len);
            net->cork_len += iov[i].iov_len;
        }
        return TERN_SEND_OK;
    }
    /* Too big for the cork: one sendmsg of the cork and the data. */
    struct iovec v[9];
    if (iovcnt > 8)
        return -EINVAL;
    v[0] = (struct iovec){net->cork, net->cork_len};
    memcpy(v + 1, iov, (size_t)iovcnt * sizeof(*iov));
    net->cork_owner = NULL;
    net->cork_len = 0;
    return send_now(c, v, iovcnt + 1);
}

int tern__conn_write(tern__conn *c, const void *data, size_t len) {
    struct iovec iov = {(void *)data, len};
    return tern__conn_writev(c, &iov, 1);
}

char *tern__conn_reserve(tern__conn *c, size_t n) {
    if (closing(c) || c->out || c->file || n > TERN__CORK_CAP)
        return NULL;
    tern__net *net = net_of(c->loop);
    cork_take(net, c);
    if (net->cork_len + n > TERN__CORK_CAP) {
        cork_flush(net);
        if (c->out || c->flags & TERN__CONN_FAILED)
            return NULL;
        net->cork_owner = c;
    }
    return net->cork + net->cork_len;
}

void tern__conn_commit(tern__conn *c, size_t n) {
    net_of(c->loop)->cork_len += n;
}

size_t tern__conn_backlog(const tern__conn *c) {
    return buf_live(c->out) + (c->file ? c->file->left : 0);
}

size_t tern__conn_buffered(const tern__conn *c) {
    return buffered(*tern__loop_slot(c->loop, net_slot()), c);
}

/* Sends as much of the file as the kernel takes. 0 when done, 1 when the
 * socket is full, negative on error. */
static int send_file(tern__conn *c) {
    tern__sendfile *f = c->file;
    while (f->left > 0) {
        ssize_t w = c->tp->ops->send_file(c, f->fd, &f->off,
                                          f->left > (1u << 30) ? (1u << 30) : f->left);
        if (w < 0)
            return w == -EAGAIN ? 1 : (int)w;
        if (w == 0)
            return -EIO;   /* the file shrank under us */
        f->left -= (size_t)w;
        f->clock.stamp = tern_loop_now(c->loop);
        f->clock.taken += (size_t)w;
    }
    close(f->fd);
    free(f);
    c->file = NULL;
    return 0;
}

int tern__conn_sendfile(tern__conn *c, int fd, off_t off, size_t len) {
    if (closing(c)) {
        close(fd);
        return -EPIPE;
    }
    tern__sendfile *f = malloc(sizeof(*f));
    if (f == NULL) {
        close(fd);
        return -ENOMEM;
    }
    *f = (tern__sendfile){fd, off, len, {tern_loop_now(c->loop), -1, 0, 0}};
    tern__net *n = net_of(c->loop);
    if (n->cork_owner == c)
        cork_flush(n);
    c->file = f;
    if (c->out)
        return TERN_SEND_BUFFERED;   /* sent after the backlog, from TERN__IO_OUT */
    int r = send_file(c);
    if (r < 0) {
        fail(c, r);
        return TERN_SEND_OK;
    }
    if (r == 1) {
        arm_out(c);
        backlog_started(c);
        return TERN_SEND_BUFFERED;
    }
    return TERN_SEND_OK;
}

/* Writes the backlog, then the file. 0 when all is out, 1 when the kernel
 * is full again, negative when c was closed. */
static int flush_backlog(tern__conn *c) {
    tern__buf *b = c->out;
    c->flags &= ~TERN__CONN_SEND_WANTS_IN;
    while (b && b->off < b->len) {
        struct iovec iov = {b->data + b->off, b->len - b->off};
        ssize_t w = c->tp->ops->send(c, &iov, 1);
        if (w < 0) {
            if (w == -EAGAIN)
                return 1;
            tern__conn_close(c, (int)w);
            return -1;
        }
        out_taken(c, (size_t)w);
    }
    out_drop(c);
    if (c->file) {
        c->file->clock.stamp = tern_loop_now(c->loop);   /* the backlog before it went */
        int r = send_file(c);
        if (r < 0) {
            tern__conn_close(c, r);
            return -1;
        }
        if (r == 1)
            return 1;
    }
    return 0;
}

/* ---- graceful close --------------------------------------------------- */

/* Everything is out: shut the write side and read to EOF. A connection
 * whose peer is already gone is closed at the batch end (this may run
 * inside a user's call, through tern__conn_end). */
static void start_linger(tern__conn *c) {
    c->flags &= ~(TERN__CONN_FLUSH_CLOSE | TERN__CONN_SEND_CLOCK);
    c->flags |= TERN__CONN_LINGER;
    if (c->tp->ops->shutdown(c) < 0 || (c->flags & TERN__CONN_EOF)) {
        fail(c, 0);
        return;
    }
    c->flags &= ~TERN__CONN_PAUSED;
    free(c->in);
    c->in = NULL;
    int err = tern__io_set(c->loop, &c->io, TERN__IO_IN | TERN__IO_RDHUP);
    if (err < 0) {
        fail(c, err);
        return;
    }
    tern__wheel_set(c->loop, &c->timeout, TERN__LINGER_MS);
}

void tern__conn_end(tern__conn *c) {
    if (closing(c))
        return;
    tern__net *n = net_of(c->loop);
    if (n->cork_owner == c)
        cork_flush(n);
    if (c->flags & TERN__CONN_FAILED)
        return;
    if (c->out || c->file) {
        c->flags |= TERN__CONN_FLUSH_CLOSE;
        tern__conn_send_clock(c);
        return;
    }
    start_linger(c);
}

/* What c's peer has not acknowledged of what the transport took (bytes):
 * in the socket, sent or not, and still in the transport; -1 where the
 * system cannot say. */
static long peer_unacked(const tern__conn *c) {
    long q = tern__plat_tcp_unacked_bytes(c->io.fd);
    if (q < 0)
        return -1;
    return q + (long)(c->tp->ops->unsent ? c->tp->ops->unsent(c) : 0);
}

/* The clock of what c is sending: the backlog's, else the file's. */
static tern__send_clock *send_clock_of(tern__conn *c) {
    return c->out ? &c->out->clock : c->file ? &c->file->clock : NULL;
}

bool tern__conn_send_clock(tern__conn *c) {
    if (c->flags & (TERN__CONN_CLOSED | TERN__CONN_LINGER))
        return false;
    tern__send_clock *k = send_clock_of(c);
    if (k == NULL)
        return false;
    uint64_t now = tern_loop_now(c->loop);
    k->unacked = peer_unacked(c);
    k->taken = 0;
    k->looked = now;
    uint32_t limit = c->proto->send_timeout ? c->proto->send_timeout(c) : 0;
    uint64_t spent = now - k->stamp;
    uint64_t left = limit == 0 ? 0 : spent >= limit ? 1 : limit - spent;
    /* Where the peer's acknowledgements can be seen, look every quarter
     * of the timeout, so that the last one is known to within a quarter. */
    uint64_t look = limit / 4 ? limit / 4 : 1;
    c->flags |= TERN__CONN_SEND_CLOCK;
    tern__wheel_set(c->loop, &c->timeout, k->unacked >= 0 && left > look ? look : left);
    return true;
}

void tern__conn_defer(tern__conn *c) {
    c->flags |= TERN__CONN_DEFERRED;
    add_pending(c);
}

/* ---- reading ---------------------------------------------------------- */

/* Hands data to the protocol and keeps what it leaves. from_in says data
 * lives in c->in (data == c->in->data + c->in->off). */
static void feed(tern__conn *c, char *data, size_t len, bool from_in) {
    size_t used = c->proto->on_data(c, data, len);
    /* Closed, or ended and lingering (which dropped c->in): the rest of
     * the input is of no use. */
    if (c->flags & (TERN__CONN_CLOSED | TERN__CONN_LINGER))
        return;
    if (from_in) {
        c->in->off += used;
        if (c->in->off == c->in->len) {
            free(c->in);
            c->in = NULL;
        }
    } else if (used < len) {
        if (buf_append(&c->in, data + used, len - used) < 0)
            tern__conn_close(c, -ENOMEM);
    }
}

/* Input the transport holds that the socket no longer shows (TLS records
 * decrypted ahead, what a stream's protocol did not read): no event will
 * come for it, so it is re-fed at the batch end. */
static void check_pending(tern__conn *c) {
    if (!(c->flags & (TERN__CONN_CLOSED | TERN__CONN_PAUSED | TERN__CONN_LINGER)) &&
        c->tp->ops->pending(c))
        add_pending(c);
}

static void conn_read(tern__conn *c) {
    char *dst;
    size_t room;
    if (c->in == NULL && c->tp->ops->take && !(c->flags & TERN__CONN_LINGER)) {
        /* The transport has the bytes in a buffer of its own: the protocol
         * parses them there (what it leaves is copied to c->in). */
        size_t len;
        char *data = c->tp->ops->take(c, &len);
        if (data) {
            feed(c, data, len, false);
            check_pending(c);
            return;
        }
    }
    if (c->in) {
        /* A partial request or frame is waiting: read behind it, so the
         * protocol sees it whole and nothing is copied twice. */
        size_t cap;
        tern__loop_rbuf(c->loop, &cap);
        size_t want = buf_live(c->in) < cap / 2 ? TERN__IN_MIN_ROOM : cap / 4;
        /* Room for all a transport already holds (a completion back end
         * has the bytes in hand), so they are taken in one read. */
        size_t held = c->tp->ops->held ? c->tp->ops->held(c) : 0;
        if (held > want)
            want = held < cap ? held : cap;
        if (buf_reserve(&c->in, want) < 0) {
            tern__conn_close(c, -ENOMEM);
            return;
        }
        dst = c->in->data + c->in->len;
        room = c->in->cap - c->in->len;
    } else {
        dst = tern__loop_rbuf(c->loop, &room);
    }
    ssize_t r = c->tp->ops->recv(c, dst, room);
    if (c->flags & TERN__CONN_SEND_WANTS_IN) {
        /* The transport's write waited for this read: retry it. */
        c->flags &= ~TERN__CONN_SEND_WANTS_IN;
        if (c->out || c->file)
            arm_out(c);
    }
    if (r < 0) {
        if (r != -EAGAIN)
            tern__conn_close(c, (int)r);
        return;
    }
    if (c->flags & TERN__CONN_LINGER) {
        if (r == 0)
            tern__conn_close(c, 0);
        else if (c->in) {
            free(c->in);
            c->in = NULL;
        }
        return;
    }
    if (r == 0) {
        c->flags |= TERN__CONN_EOF;
        /* No more TERN__IO_IN/RDHUP reports wanted: they would repeat forever. */
        int err = tern__io_set(c->loop, &c->io, c->io.events & TERN__IO_OUT);
        if (err < 0) {
            tern__conn_close(c, err);
            return;
        }
        if (c->in)
            add_pending(c);   /* what came before the end goes to the protocol first */
        else
            c->proto->on_eof(c);
        return;
    }
    if (c->in) {
        c->in->len += (size_t)r;
        feed(c, c->in->data + c->in->off, buf_live(c->in), true);
    } else {
        feed(c, dst, (size_t)r, false);
    }
    check_pending(c);
}

/* The first event of an outbound connection: the connect's outcome. */
static void connect_done(tern__conn *c) {
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(c->io.fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
        err = errno;
    if (err == 0)
        err = -tern__io_set(c->loop, &c->io, TERN__IO_IN | TERN__IO_RDHUP);
    if (err) {
        tern__conn_close(c, -err);
        return;
    }
    c->flags &= ~TERN__CONN_CONNECTING;
    c->proto->on_connect(c);
}

int tern__conn_connect(tern_loop *loop, tern__conn *c, const struct sockaddr *addr,
                       socklen_t len, int rcvbuf, const tern__conn_proto *proto,
                       tern__conn_list *list) {
    int fd = tern__plat_socket(addr->sa_family, SOCK_STREAM);
    if (fd < 0)
        return fd;
    if (rcvbuf > 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    if (addr->sa_family != AF_UNIX) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    int r;
    do
        r = connect(fd, addr, len);
    while (r < 0 && errno == EINTR);
    /* A Unix socket connects (or fails) at once; TCP says EINPROGRESS.
     * Either way the outcome is reported from the loop: the socket is
     * writable at once when already connected. */
    if (r < 0 && errno != EINPROGRESS && errno != EAGAIN) {
        int err = -errno;
        close(fd);
        return err;
    }
    int err = tern__conn_start(loop, c, fd, proto, list);
    if (err == 0 && (err = tern__io_set(loop, &c->io, TERN__IO_OUT)) < 0)
        tern__loop_release(loop);   /* started: undo its hold */
    if (err < 0) {
        list_remove(c);
        tern__io_close(loop, &c->io);
        return err;
    }
    c->flags |= TERN__CONN_CONNECTING;
    return 0;
}

static void conn_io(tern__io *io, uint32_t revents) {
    tern__conn *c = tern__container_of(io, tern__conn, io);
    /* One test for both rare states keeps the common path as it was. */
    if (c->flags & (TERN__CONN_CLOSED | TERN__CONN_CONNECTING)) {
        if (!(c->flags & TERN__CONN_CLOSED))
            connect_done(c);
        return;
    }
    bool recv_waited = false;
    if ((revents & TERN__IO_OUT) && (c->flags & TERN__CONN_RECV_WANTS_OUT)) {
        /* The transport's read could not write; now it can (below). */
        c->flags &= ~TERN__CONN_RECV_WANTS_OUT;
        recv_waited = true;
        int err = c->out || c->file
                      ? 0
                      : tern__io_set(c->loop, &c->io, c->io.events & ~(uint32_t)TERN__IO_OUT);
        if (err < 0) {
            tern__conn_close(c, err);
            return;
        }
    }
    if ((revents & TERN__IO_OUT) && (c->out || c->file)) {
        int r = flush_backlog(c);
        if (r < 0)
            return;
        /* Done, or the next read retries: TERN__IO_OUT would be reported
         * again and again. */
        int err = r == 0 || (c->flags & TERN__CONN_SEND_WANTS_IN)
                      ? tern__io_set(c->loop, &c->io, c->io.events & ~(uint32_t)TERN__IO_OUT)
                      : 0;
        if (err < 0) {
            tern__conn_close(c, err);
            return;
        }
        if (r == 0) {
            if (c->flags & TERN__CONN_SEND_CLOCK) {
                c->flags &= ~TERN__CONN_SEND_CLOCK;
                tern__wheel_set(c->loop, &c->timeout, 0);
            }
            if (c->flags & TERN__CONN_FLUSH_CLOSE)
                start_linger(c);
            else if (!(c->flags & TERN__CONN_FAILED))
                c->proto->on_drain(c);
            if (c->flags & TERN__CONN_CLOSED)
                return;
        }
    }
    if (((revents & TERN__IO_ERR) && !(revents & TERN__IO_IN)) ||
        ((revents & TERN__IO_HUP) && (c->flags & (TERN__CONN_PAUSED | TERN__CONN_EOF)))) {
        /* Reset, or both directions down while we are not reading: level-
         * triggered HUP would otherwise be reported again and again. */
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(io->fd, SOL_SOCKET, SO_ERROR, &err, &len);
        tern__conn_close(c, err ? -err : -ECONNRESET);
        return;
    }
    if ((revents & TERN__IO_RDHUP) && (c->flags & TERN__CONN_PAUSED)) {
        /* The FIN of a peer we are not reading from: stop asking (it would
         * be reported again and again) and let the protocol decide. */
        c->flags |= TERN__CONN_RDHUP;
        int err = tern__io_set(c->loop, &c->io, c->io.events & ~(uint32_t)TERN__IO_RDHUP);
        if (err < 0) {
            tern__conn_close(c, err);
            return;
        }
        if (c->proto->on_hangup)
            c->proto->on_hangup(c);
        return;
    }
    if ((recv_waited || (revents & (TERN__IO_IN | TERN__IO_HUP | TERN__IO_RDHUP))) &&
        !(c->flags & (TERN__CONN_PAUSED | TERN__CONN_EOF)))
        conn_read(c);
}

void tern__conn_ready(tern__conn *c, uint32_t revents) {
    revents &= c->io.events;
    if (revents && !(c->flags & TERN__CONN_CLOSED))
        conn_io(&c->io, revents);
}

/* A paused connection stays registered asking for TERN__IO_RDHUP only
 * (until the FIN is seen): a reset (TERN__IO_ERR, TERN__IO_HUP, always
 * reported) or the peer's close is noticed while we read nothing. On a
 * back end with no report of the FIN alone (poll), a FIN behind bytes
 * sent while paused is read on resume (loop_internal.h's contract). */
void tern__conn_pause(tern__conn *c) {
    if (c->flags & (TERN__CONN_PAUSED | TERN__CONN_CLOSED | TERN__CONN_LINGER))
        return;
    c->flags |= TERN__CONN_PAUSED;
    uint32_t ev = c->io.events & TERN__IO_OUT;
    if (!(c->flags & (TERN__CONN_EOF | TERN__CONN_RDHUP)))
        ev |= TERN__IO_RDHUP;
    int err = tern__io_set(c->loop, &c->io, ev);
    if (err < 0)
        fail(c, err);
}

void tern__conn_resume(tern__conn *c) {
    if (!(c->flags & TERN__CONN_PAUSED) || (c->flags & TERN__CONN_CLOSED))
        return;
    c->flags &= ~TERN__CONN_PAUSED;
    uint32_t ev = c->io.events & TERN__IO_OUT;
    if (!(c->flags & TERN__CONN_EOF))
        ev |= TERN__IO_IN | TERN__IO_RDHUP;
    int err = tern__io_set(c->loop, &c->io, ev);
    if (err < 0)
        fail(c, err);
    if (c->in || (c->flags & TERN__CONN_EOF) || c->tp->ops->pending(c))
        add_pending(c);
}

void tern__conn_set_timeout(tern__conn *c, uint64_t ms) {
    if (c->flags & (TERN__CONN_CLOSED | TERN__CONN_LINGER | TERN__CONN_FLUSH_CLOSE))
        return;
    c->flags &= ~TERN__CONN_SEND_CLOCK;
    tern__wheel_set(c->loop, &c->timeout, ms);
}

static void conn_timeout(tern__wheel_entry *e) {
    tern__conn *c = tern__container_of(e, tern__conn, timeout);
    if (c->flags & TERN__CONN_CLOSED)
        return;
    if (c->flags & TERN__CONN_LINGER) {
        tern__conn_close(c, -ETIMEDOUT);
        return;
    }
    if (c->flags & (TERN__CONN_SEND_CLOCK | TERN__CONN_FLUSH_CLOSE)) {
        /* The send clock: close only if neither the kernel took bytes
         * nor the peer acknowledged any for the whole send timeout;
         * progress since the arming re-arms it. An acknowledgement seen
         * now came after the last look: progress from then on (not from
         * now, or a peer that took a last few KiB into its receive buffer
         * right after the look would be cut a whole timeout late). */
        c->flags &= ~TERN__CONN_SEND_CLOCK;
        tern__send_clock *k = send_clock_of(c);
        uint32_t limit = c->proto->send_timeout ? c->proto->send_timeout(c) : 0;
        uint64_t now = tern_loop_now(c->loop);
        if (k && k->unacked >= 0 && k->looked > k->stamp) {
            long q = peer_unacked(c);
            /* The peer is reading what the kernel holds. Looks come a
             * quarter of the timeout apart; one that comes later (this
             * loop was descheduled: a busy machine) cannot say the
             * progress was older than a quarter, and must not cut a peer
             * seen reading. */
            uint64_t quarter = limit / 4;
            if (q >= 0 && q < k->unacked + (long)k->taken)
                k->stamp = now - k->looked > quarter ? now - quarter : k->looked;
        }
        else if (k && k->unacked < 0 && limit && now - k->stamp >= limit) {
            /* Where the peer's acknowledgements cannot be seen (the
             * portable build), the kernel's taking bytes is the only sign
             * of progress, and a back end reports room only once much of
             * a grown send buffer is free (Linux: a third), while a send
             * takes bytes as soon as any is. Try one before judging: a
             * steady slow reader frees some room within the timeout. */
            conn_io(&c->io, TERN__IO_OUT);
            if (c->flags & TERN__CONN_CLOSED)
                return;
            k = send_clock_of(c);
            if (k == NULL)
                return;   /* all out: conn_io went on (linger or on_drain) */
        }
        if (k == NULL || (limit && now - k->stamp >= limit)) {
            tern__log(TERN_LOG_INFO, TERN__LOG_SEND_TIMEOUT,
                      "net: send timeout, %zu bytes the peer did not take", tern__conn_backlog(c));
            close_conn(c, -ETIMEDOUT, true);
        }
        else
            tern__conn_send_clock(c);
        return;
    }
    c->proto->on_timeout(c);
}

/* ---- the batch end ---------------------------------------------------- */

void tern__net_flush(tern_loop *loop) {
    tern__net *n = *tern__loop_slot(loop, net_slot());
    if (n == NULL)
        return;
    cork_flush(n);
    n->direct_last = NULL;
    while (n->pending) {
        tern__conn *c = n->pending;
        n->pending = c->pending_next;
        c->flags &= ~TERN__CONN_PENDING;
        if (c->flags & TERN__CONN_DEFERRED) {
            c->flags &= ~TERN__CONN_DEFERRED;
            c->proto->on_deferred(c);
        }
        if (c->flags & TERN__CONN_CLOSED)
            continue;
        if (c->flags & TERN__CONN_FAILED) {
            /* With the error it failed with (0 for a lingering connection
             * whose peer had gone: it ends normally). */
            tern__conn_close(c, c->err);
        } else if ((c->flags & TERN__CONN_FLUSH_CLOSE) && !c->out && !c->file) {
            start_linger(c);
        } else if (!(c->flags & TERN__CONN_PAUSED)) {
            if (c->tp->ops->pending(c))
                conn_read(c);   /* behind what c->in holds, feeding both */
            else if (c->in)
                feed(c, c->in->data + c->in->off, buf_live(c->in), true);
            /* The end, once the protocol has had everything before it (what
             * it left unconsumed can never be completed now). Not yet if
             * the read above found the end behind c->in and queued c again
             * to feed it first. */
            if ((c->flags & (TERN__CONN_EOF | TERN__CONN_CLOSED | TERN__CONN_PAUSED |
                             TERN__CONN_LINGER | TERN__CONN_PENDING)) == TERN__CONN_EOF)
                c->proto->on_eof(c);
        }
        cork_flush(n);
    }
    while (n->closed) {
        tern__conn *c = n->closed;
        n->closed = c->next_free;
        free(c->in);
        c->in = NULL;
        if (c->proto->on_free)
            c->proto->on_free(c);
        else
            free(c);
    }
}
