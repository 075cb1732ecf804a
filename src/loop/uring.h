/* The io_uring back end's private header: its types, the descriptor
 * table and the send ops (small functions both of its files use on every
 * send and receive, so kept inline), and the stream calls uring_stream.c
 * gives the back end's table (uring.c). See uring.c for how it works. */
#ifndef TERN_LOOP_URING_H
#define TERN_LOOP_URING_H

#include <errno.h>
#include <liburing.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "loop/loop_internal.h"

_Static_assert((int)TERN__IO_IN == POLLIN && (int)TERN__IO_OUT == POLLOUT &&
                   (int)TERN__IO_ERR == POLLERR && (int)TERN__IO_HUP == POLLHUP &&
                   (int)TERN__IO_RDHUP == POLLRDHUP,
               "the loop's interest flags are poll's values");

#define RING_ENTRIES 1024
#define CQES_PER_BATCH 512
#define BUF_GROUP 0
#define BUF_COUNT 128            /* provided receive buffers (a power of two) */
#define BUF_SIZE (32 * 1024)
/* Send ops of two sizes are kept for reuse, each on its own free list:
 * small ones (a handshake's answer, a small message's echo) and larger
 * ones. What the lists keep is bounded (FREE_SENDS_KEPT of each: 1 MiB
 * and 8 MiB at most), and kept small where most sends are small, so
 * that what a loop holds for reuse does not grow with the number of
 * answers in flight at once by 16 KiB each. */
#define SMALL_SEND (2 * 1024 - 64)
#define LARGE_SEND (16 * 1024 - 64)
#define BIG_SEND (1u << 20)      /* the most one send op copies */
#define FREE_SENDS_KEPT 512
#define CLOSE_SEND_MS 2000       /* how long a closed stream's last send may take */

enum {
    TAG_POLL = 1,      /* the single-shot poll of a descriptor */
    TAG_RECV = 2,      /* the multishot receive of a stream */
    TAG_IGNORE = 3,    /* poll updates and removals, cancellations: nothing to do */
    TAG_SEND = 4,      /* a send op (user_data is its address) */
    TAG_GUARD = 5,     /* the time a closed stream's send in flight is given */
    TAG_ACCEPT = 6,    /* the accept of a listener (multishot, or single-shot: ST_ONE) */
};

/* Per-descriptor state bits (st[fd]). */
enum {
    ST_POLL = 1u << 0,      /* a poll is in flight */
    ST_RECV = 1u << 1,      /* the multishot receive (or a listener's accept) is in flight */
    ST_SEND = 1u << 2,      /* tx[fd] is in flight */
    ST_STREAM = 1u << 3,    /* served by completions (tern__io_stream) */
    ST_DIRTY = 1u << 4,     /* on the dirty list: submissions to work out */
    ST_CLOSING = 1u << 5,   /* the watcher is gone: close once nothing is in flight */
    ST_EOF = 1u << 6,       /* the receive saw the peer's end (or an error, in the rest list) */
    ST_TOLD = 1u << 7,      /* tern__io_recv has returned the end */
    ST_SHUT = 1u << 8,      /* shutdown(SHUT_WR) once the send in flight completes */
    ST_ACCEPTOR = 1u << 8,  /* a listener (tern__io_acceptor; never a stream: it shares ST_SHUT's
                             * bit, so read it through is_acceptor) */
    ST_FULL = 1u << 9,      /* a sendfile found the socket full: TERN__IO_OUT waits for a poll */
    ST_ONE = 1u << 9,       /* a listener's accept is single-shot (one_at_a_time; a listener is
                             * never a stream, so it can share ST_FULL's bit) */
    ST_CANCEL = 1u << 10,   /* the receive's cancellation was asked */
    ST_UNPOLL = 1u << 11,   /* the poll's removal was asked */
    ST_TXQ = 1u << 12,      /* tx[fd] is being filled: submitted before the ring is entered */
    PM_SHIFT = 13,          /* bits 13..15: the in-flight poll's mask (IN, OUT, RDHUP) */
};
#define PM_MASK (7u << PM_SHIFT)

/* Bytes a stream received that its watcher has not read yet (it was
 * paused, or read less than arrived), and the error its receive ended
 * with. Rare, so kept in a list rather than per descriptor. */
typedef struct tern__rest {
    struct tern__rest *next;
    int fd;
    int err;                /* negative errno, or 0 */
    size_t off, len, cap;
    char *data;
} tern__rest;

/* A send: a copy of the bytes, so the caller's buffer (the cork) is free
 * at once. Filled by every send of one iteration, submitted before the
 * ring is entered, then in flight until it completes: data[off..len) is
 * what the kernel has not taken. */
typedef struct tern__usend {
    struct tern__usend *next_free;
    int fd;
    uint16_t gen;           /* the descriptor's generation when it was sent */
    size_t off, len, cap;
    char data[];
} tern__usend;

/* What the back end knows of one descriptor: 16 bytes, in a table indexed
 * by fd (the per-connection cost of this back end). */
typedef struct tern__ufd {
    tern__io *io;          /* its watcher, or NULL */
    uint16_t st;           /* ST_* and the in-flight poll's mask */
    uint16_t gen;          /* its generation, in every user_data naming it */
    uint32_t tx;           /* 1 + the index in sends[] of its send being filled
                            * (ST_TXQ) or in flight (ST_SEND); 0: none */
} tern__ufd;

/* Invariants:
 * - fds[0..cap) is the table, an anonymous mapping grown by mremap, so
 *   that entries cost memory only once used (no copy, no zeroing).
 * - sends[i] for i in [0, nsends) is a send op or NULL (free, its index
 *   on free_ix).
 * - dirty[0..ndirty) are the descriptors with ST_DIRTY, each once.
 * - txq[0..ntxq) are the descriptors whose send is being filled, in the
 *   order they began: each with ST_TXQ has its entry (an entry whose
 *   descriptor lost ST_TXQ since, by a close, is skipped). Kept apart from
 *   dirty so that a send, the common case, costs no look at interest.
 * - bufs holds BUF_COUNT buffers of BUF_SIZE, each either in the kernel's
 *   provided-buffer ring or, during one completion's dispatch only, cur.
 * - cur is the received buffer being dispatched (cur_fd -1 when none);
 *   tern__io_recv takes from it after that stream's rest. Likewise
 *   acc_res, the accept being dispatched, for tern__io_accept. */
typedef struct tern__uring {
    struct io_uring ring;
    bool enabled;            /* the ring was enabled by the thread that runs it */
    struct io_uring_buf_ring *br;
    char *bufs;
    tern__ufd *fds;
    int cap;
    tern__usend **sends;
    uint32_t nsends, sends_cap;
    uint32_t *free_ix;
    uint32_t nfree_ix;
    int *dirty;
    int ndirty, dirty_cap;
    int *txq;
    int ntxq, txq_cap;
    tern__rest *rests;
    tern__usend *free_sends[2];   /* [0]: SMALL_SEND ops, [1]: LARGE_SEND ones */
    int nfree_sends[2];
    tern__usend *orphans;    /* sends in flight whose watcher went away (next_free links) */
    uint64_t *ends;          /* streams whose end is to be told (fd << 16 | gen) */
    int nends, ends_cap;
    int cur_fd;
    char *cur;
    size_t cur_len;
    int acc_fd;              /* the listener whose accept is being dispatched, or -1 */
    int acc_res;             /* its connection (or negative errno), -EAGAIN once taken */
} tern__uring;

static inline tern__uring *ur_of(tern_loop *loop) { return loop->backend; }

#define UD(u, fd, tag) ((uint64_t)(u)->fds[fd].gen << 48 | (uint64_t)(uint32_t)(fd) << 3 | (uint64_t)(tag))

/* ---- the table -------------------------------------------------------- */

static inline int table_fit(tern__uring *u, int fd) {
    if (fd < u->cap)
        return 0;
    int cap = u->cap ? u->cap : 4096;
    while (cap <= fd)
        cap *= 2;
    size_t old = (size_t)u->cap * sizeof(tern__ufd), len = (size_t)cap * sizeof(tern__ufd);
    void *m = u->fds ? mremap(u->fds, old, len, MREMAP_MAYMOVE)
                     : mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return -ENOMEM;
    u->fds = m;
    u->cap = cap;
    return 0;
}

/* The send op of fd (tx), by its index. */
static inline tern__usend *tx_of(tern__uring *u, int fd) {
    uint32_t t = u->fds[fd].tx;
    return t ? u->sends[t - 1] : NULL;
}

static inline int tx_set(tern__uring *u, int fd, tern__usend *s) {
    uint32_t t = u->fds[fd].tx;
    if (s == NULL) {
        if (t) {
            u->sends[t - 1] = NULL;
            u->free_ix[u->nfree_ix++] = t - 1;
            u->fds[fd].tx = 0;
        }
        return 0;
    }
    if (t == 0) {
        if (u->nfree_ix == 0) {
            if (u->nsends == u->sends_cap) {
                uint32_t cap = u->sends_cap ? u->sends_cap * 2 : 256;
                tern__usend **v = realloc(u->sends, cap * sizeof(*v));
                if (v == NULL)
                    return -ENOMEM;
                u->sends = v;
                uint32_t *f = realloc(u->free_ix, cap * sizeof(*f));
                if (f == NULL)
                    return -ENOMEM;
                u->free_ix = f;
                u->sends_cap = cap;
            }
            u->free_ix[u->nfree_ix++] = u->nsends++;
        }
        t = u->free_ix[--u->nfree_ix] + 1;
        u->fds[fd].tx = t;
    }
    u->sends[t - 1] = s;
    return 0;
}

/* Room for one more descriptor in a list (dirty, txq). */
static inline int fd_list_fit(int **v, int n, int *cap) {
    if (n < *cap)
        return 0;
    int c = *cap ? *cap * 2 : 256;
    int *d = realloc(*v, (size_t)c * sizeof(*d));
    if (d == NULL)
        return -ENOMEM;
    *v = d;
    *cap = c;
    return 0;
}

static inline void mark_dirty(tern__uring *u, int fd) {
    if (u->fds[fd].st & ST_DIRTY)
        return;
    if (fd_list_fit(&u->dirty, u->ndirty, &u->dirty_cap) < 0)
        return;   /* the descriptor is re-examined at its next change */
    u->fds[fd].st |= ST_DIRTY;
    u->dirty[u->ndirty++] = fd;
}

static inline tern__rest *rest_find(tern__uring *u, int fd, bool make) {
    for (tern__rest *r = u->rests; r; r = r->next)
        if (r->fd == fd)
            return r;
    if (!make)
        return NULL;
    tern__rest *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return NULL;
    r->fd = fd;
    r->next = u->rests;
    u->rests = r;
    return r;
}

static inline void rest_drop(tern__uring *u, int fd) {
    for (tern__rest **p = &u->rests; *p; p = &(*p)->next) {
        if ((*p)->fd == fd) {
            tern__rest *r = *p;
            *p = r->next;
            free(r->data);
            free(r);
            return;
        }
    }
}

/* Keeps bytes a stream's watcher did not read. */
static inline void rest_keep(tern__uring *u, int fd, const char *data, size_t len) {
    tern__rest *r = rest_find(u, fd, true);
    if (r == NULL)
        return;
    if (r->off > 0 && r->off == r->len)
        r->off = r->len = 0;
    if (r->len + len > r->cap) {
        size_t cap = r->cap ? r->cap : BUF_SIZE;
        while (cap < r->len + len)
            cap *= 2;
        char *d = realloc(r->data, cap);
        if (d == NULL) {
            r->err = -ENOMEM;
            u->fds[fd].st |= ST_EOF;
            return;
        }
        r->data = d;
        r->cap = cap;
    }
    memcpy(r->data + r->len, data, len);
    r->len += len;
}

/* ---- sends ------------------------------------------------------------ */

/* The size class of a send op that must hold want bytes: SMALL_SEND,
 * LARGE_SEND, or want itself (not kept). */
static inline size_t send_class(size_t want) {
    return want <= SMALL_SEND ? SMALL_SEND : want <= LARGE_SEND ? LARGE_SEND : want;
}

static inline tern__usend *send_get(tern__uring *u, size_t want) {
    size_t cap = send_class(want);
    int k = cap == SMALL_SEND ? 0 : 1;
    tern__usend *s;
    if (cap <= LARGE_SEND && u->free_sends[k]) {
        s = u->free_sends[k];
        u->free_sends[k] = s->next_free;
        u->nfree_sends[k]--;
        return s;
    }
    s = malloc(sizeof(*s) + cap);
    if (s)
        s->cap = cap;
    return s;
}

static inline void send_put(tern__uring *u, tern__usend *s) {
    int k = s->cap == SMALL_SEND ? 0 : s->cap == LARGE_SEND ? 1 : -1;
    if (k >= 0 && u->nfree_sends[k] < FREE_SENDS_KEPT) {
        s->next_free = u->free_sends[k];
        u->free_sends[k] = s;
        u->nfree_sends[k]++;
        return;
    }
    free(s);
}

/* ---- the stream calls (uring_stream.c) ---------------------------------- */

bool tern__ur_io_stream(tern_loop *loop, tern__io *io, bool on);
ssize_t tern__ur_io_recv(tern_loop *loop, tern__io *io, char *buf, size_t len);
char *tern__ur_io_take(tern_loop *loop, tern__io *io, size_t *len);
size_t tern__ur_io_held(tern_loop *loop, const tern__io *io);
bool tern__ur_io_pending(tern_loop *loop, const tern__io *io);
ssize_t tern__ur_io_send_file(tern_loop *loop, tern__io *io, int fd, off_t *off, size_t len);
ssize_t tern__ur_io_send(tern_loop *loop, tern__io *io, const struct iovec *iov, int iovcnt);
int tern__ur_io_shutdown(tern_loop *loop, tern__io *io);
size_t tern__ur_io_unsent(tern_loop *loop, const tern__io *io);

#endif
