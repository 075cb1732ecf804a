/* The io_uring back end: completions, with readiness for those who ask.
 *
 * Three kinds of watcher live on the ring:
 * - A listener (tern__io_acceptor) has one multishot accept in flight
 *   while it wants TERN__IO_IN: each completion is a connection (or an
 *   error, which ends it), handed over by TERN__IO_IN and tern__io_accept
 *   at once; no accept system call per connection. A listener that asked
 *   for one at a time (near its descriptor reserve) has a single-shot
 *   accept instead, armed again after each connection.
 * - A poll watcher (the wake-up eventfd, signals, Redis)
 *   gets readiness as with epoll: a single-shot poll,
 *   re-armed after each report while it is still wanted, which is
 *   level-triggered (a poll that starts on a ready descriptor completes at
 *   once).
 * - A stream (a TCP connection, plain or under TLS: tern__io_stream) is served by
 *   completions: one multishot receive into the loop's provided-buffer
 *   ring while TERN__IO_IN is wanted, and one send in flight at a time,
 *   from a copy of the bytes (the caller's buffer is reused at once). Its
 *   watcher is told TERN__IO_IN when bytes (or the end) arrive, and reads
 *   them with tern__io_recv, so that net's connection logic is the same
 *   on both back ends; TERN__IO_OUT when its send has completed.
 *
 * Every change of interest is recorded and turned into submissions just
 * before the ring is entered, so that one io_uring_enter per iteration
 * submits the whole batch's work (receives to arm, every connection's
 * sends, cancellations) and waits for the next completions.
 *
 * Completions name a descriptor, not a watcher: user_data is the
 * descriptor's generation << 48 | fd << 3 | a tag, and the watcher is
 * looked up in a table by fd at dispatch. A poll watcher that goes away
 * (interest 0: its owner may close the descriptor and the number be
 * reused at once) has its work cancelled and the generation bumped, so
 * late completions of that work are recognised as stale. A stream with no
 * interest only stops reading; it ends with tern__io_close, which cancels
 * its receive and poll but lets its last send go (as close() leaves bytes
 * in a socket buffer), and closes the descriptor when its last completion
 * has come, so the number is not reused while completions naming it are
 * due. A send's user_data is its own buffer's address (8-aligned) |
 * TAG_SEND. */
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

static tern__uring *ur_of(tern_loop *loop) { return loop->backend; }

#define UD(u, fd, tag) ((uint64_t)(u)->fds[fd].gen << 48 | (uint64_t)(uint32_t)(fd) << 3 | (uint64_t)(tag))

/* ---- the rings -------------------------------------------------------- */

/* Can this kernel (and seccomp policy) give us what the back end uses?
 * A ring, and a provided-buffer ring registered on it (5.19 and later;
 * multishot receive came with 6.0, checked by the probe's opcode list
 * being new enough to know IORING_OP_SEND_ZC, 6.0 too). */
static int ur_probe(void) {
    struct io_uring t;
    int err = io_uring_queue_init(4, &t, 0);
    if (err < 0)
        return err;
    struct io_uring_probe *probe = io_uring_get_probe_ring(&t);
    if (probe == NULL || !io_uring_opcode_supported(probe, IORING_OP_SEND_ZC))
        err = -ENOSYS;
    io_uring_free_probe(probe);
    void *mem = NULL;
    if (err == 0 && (mem = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                                -1, 0)) == MAP_FAILED) {
        err = -errno;
        mem = NULL;
    }
    if (err == 0) {
        struct io_uring_buf_reg reg = {.ring_addr = (uint64_t)(uintptr_t)mem, .ring_entries = 1,
                                       .bgid = BUF_GROUP};
        err = io_uring_register_buf_ring(&t, &reg, 0);
    }
    if (mem)
        munmap(mem, 4096);
    io_uring_queue_exit(&t);
    return err;
}

static int ur_init(tern_loop *loop) {
    int err = ur_probe();
    if (err < 0)
        return err;
    tern__uring *u = calloc(1, sizeof(*u));
    if (u == NULL)
        return -ENOMEM;
    /* Disabled until the thread that runs the loop enables it: with
     * SINGLE_ISSUER, that thread is the one submitter (tern_run makes its
     * loops on one thread and runs each on another). DEFER_TASKRUN: the
     * kernel's completion work runs when we enter the ring to wait, in one
     * batch, not by interrupting us. */
    struct io_uring_params p = {
        .flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_R_DISABLED |
                 IORING_SETUP_SUBMIT_ALL,
    };
    err = io_uring_queue_init_params(RING_ENTRIES, &u->ring, &p);
    if (err < 0) {
        free(u);
        return err;
    }
    u->cur_fd = -1;
    u->acc_fd = -1;
    loop->backend = u;
    return 0;
}

/* Enables the ring and registers the receive buffers: on the loop's own
 * thread, at its first run. */
static int ur_enable(tern__uring *u) {
    /* liburing 2.3 declares io_uring_enable_rings but does not export it:
     * the system call itself. */
    if (syscall(__NR_io_uring_register, u->ring.ring_fd, IORING_REGISTER_ENABLE_RINGS, NULL, 0) < 0)
        return -errno;
    int err;
    size_t ring_bytes = BUF_COUNT * sizeof(struct io_uring_buf);
    void *mem = mmap(NULL, ring_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED)
        return -errno;
    u->br = mem;
    u->bufs = malloc((size_t)BUF_COUNT * BUF_SIZE);
    if (u->bufs == NULL)
        return -ENOMEM;
    struct io_uring_buf_reg reg = {
        .ring_addr = (uint64_t)(uintptr_t)u->br, .ring_entries = BUF_COUNT, .bgid = BUF_GROUP};
    if ((err = io_uring_register_buf_ring(&u->ring, &reg, 0)) < 0)
        return err;
    io_uring_buf_ring_init(u->br);
    int mask = io_uring_buf_ring_mask(BUF_COUNT);
    for (int i = 0; i < BUF_COUNT; i++)
        io_uring_buf_ring_add(u->br, u->bufs + (size_t)i * BUF_SIZE, BUF_SIZE, (unsigned short)i,
                              mask, i);
    io_uring_buf_ring_advance(u->br, BUF_COUNT);
    /* The ring's own descriptor registered: io_uring_enter then skips
     * looking it up (an fdget per iteration). Optional: fine without. */
    io_uring_register_ring_fd(&u->ring);
    u->enabled = true;
    return 0;
}

static void buf_recycle(tern__uring *u, unsigned bid) {
    io_uring_buf_ring_add(u->br, u->bufs + (size_t)bid * BUF_SIZE, BUF_SIZE, (unsigned short)bid,
                          io_uring_buf_ring_mask(BUF_COUNT), 0);
    io_uring_buf_ring_advance(u->br, 1);
}

static void ur_free(tern_loop *loop) {
    tern__uring *u = ur_of(loop);
    io_uring_queue_exit(&u->ring);
    /* Descriptors still waiting for their completions to close. */
    for (int fd = 0; fd < u->cap; fd++)
        if (u->fds[fd].st & ST_CLOSING)
            close(fd);
    if (u->br)
        munmap(u->br, BUF_COUNT * sizeof(struct io_uring_buf));
    free(u->bufs);
    while (u->rests) {
        tern__rest *r = u->rests;
        u->rests = r->next;
        free(r->data);
        free(r);
    }
    /* The ring is gone: so is the kernel's hold on the sends. */
    for (uint32_t i = 0; i < u->nsends; i++)
        free(u->sends[i]);
    while (u->orphans) {
        tern__usend *s = u->orphans;
        u->orphans = s->next_free;
        free(s);
    }
    for (int k = 0; k < 2; k++)
        while (u->free_sends[k]) {
            tern__usend *s = u->free_sends[k];
            u->free_sends[k] = s->next_free;
            free(s);
        }
    if (u->fds)
        munmap(u->fds, (size_t)u->cap * sizeof(tern__ufd));
    free(u->sends);
    free(u->free_ix);
    free(u->ends);
    free(u->dirty);
    free(u->txq);
    free(u);
    loop->backend = NULL;
}

/* A submission slot; when the queue is full, what is in it goes first. */
static struct io_uring_sqe *get_sqe(tern__uring *u) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
    if (sqe == NULL) {
        io_uring_submit(&u->ring);
        sqe = io_uring_get_sqe(&u->ring);
    }
    return sqe;
}

/* ---- the table -------------------------------------------------------- */

static int table_fit(tern__uring *u, int fd) {
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
static tern__usend *tx_of(tern__uring *u, int fd) {
    uint32_t t = u->fds[fd].tx;
    return t ? u->sends[t - 1] : NULL;
}

static int tx_set(tern__uring *u, int fd, tern__usend *s) {
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
static int fd_list_fit(int **v, int n, int *cap) {
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

static void mark_dirty(tern__uring *u, int fd) {
    if (u->fds[fd].st & ST_DIRTY)
        return;
    if (fd_list_fit(&u->dirty, u->ndirty, &u->dirty_cap) < 0)
        return;   /* the descriptor is re-examined at its next change */
    u->fds[fd].st |= ST_DIRTY;
    u->dirty[u->ndirty++] = fd;
}

static tern__rest *rest_find(tern__uring *u, int fd, bool make) {
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

static void rest_drop(tern__uring *u, int fd) {
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
static void rest_keep(tern__uring *u, int fd, const char *data, size_t len) {
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
static size_t send_class(size_t want) {
    return want <= SMALL_SEND ? SMALL_SEND : want <= LARGE_SEND ? LARGE_SEND : want;
}

static tern__usend *send_get(tern__uring *u, size_t want) {
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

static void send_put(tern__uring *u, tern__usend *s) {
    int k = s->cap == SMALL_SEND ? 0 : s->cap == LARGE_SEND ? 1 : -1;
    if (k >= 0 && u->nfree_sends[k] < FREE_SENDS_KEPT) {
        s->next_free = u->free_sends[k];
        u->free_sends[k] = s;
        u->nfree_sends[k]++;
        return;
    }
    free(s);
}

static struct io_uring_sqe *submit_send(tern__uring *u, tern__usend *s) {
    struct io_uring_sqe *sqe = get_sqe(u);
    io_uring_prep_send(sqe, s->fd, s->data + s->off, s->len - s->off, MSG_NOSIGNAL);
    io_uring_sqe_set_data64(sqe, (uint64_t)(uintptr_t)s | TAG_SEND);
    return sqe;
}

/* ---- working out what to submit ---------------------------------------- */

static unsigned poll_mask_of(uint32_t st) { return (st & PM_MASK) >> PM_SHIFT; }
/* IN, OUT, RDHUP as three bits, and back. */
static unsigned pm_pack(uint32_t ev) {
    return (ev & TERN__IO_IN ? 1u : 0) | (ev & TERN__IO_OUT ? 2u : 0) | (ev & TERN__IO_RDHUP ? 4u : 0);
}
static uint32_t pm_unpack(unsigned m) {
    return (m & 1 ? TERN__IO_IN : 0) | (m & 2 ? TERN__IO_OUT : 0) | (m & 4 ? TERN__IO_RDHUP : 0);
}

static void arm_poll(tern__uring *u, int fd, uint32_t want) {
    uint32_t st = u->fds[fd].st;
    unsigned m = pm_pack(want);
    if (st & ST_POLL) {
        if (st & ST_UNPOLL)
            return;   /* its completion comes, then we look again */
        struct io_uring_sqe *sqe;
        if (m == 0) {
            if ((sqe = get_sqe(u)) == NULL)
                return;
            io_uring_prep_poll_remove(sqe, UD(u, fd, TAG_POLL));
            io_uring_sqe_set_data64(sqe, UD(u, fd, TAG_IGNORE));
            u->fds[fd].st |= ST_UNPOLL;
        } else if (m != poll_mask_of(st)) {
            if ((sqe = get_sqe(u)) == NULL)
                return;
            /* new_user_data 0: the kernel refuses one without
             * IORING_POLL_UPDATE_USER_DATA. */
            io_uring_prep_poll_update(sqe, UD(u, fd, TAG_POLL), 0, pm_unpack(m),
                                      IORING_POLL_UPDATE_EVENTS);
            io_uring_sqe_set_data64(sqe, UD(u, fd, TAG_IGNORE));
            u->fds[fd].st = ((st & ~PM_MASK) | m << PM_SHIFT);
        }
        return;
    }
    if (m == 0)
        return;
    struct io_uring_sqe *sqe = get_sqe(u);
    if (sqe == NULL)
        return;
    io_uring_prep_poll_add(sqe, fd, pm_unpack(m));
    io_uring_sqe_set_data64(sqe, UD(u, fd, TAG_POLL));
    u->fds[fd].st = ((st & ~PM_MASK) | ST_POLL | m << PM_SHIFT);
}

/* The tag of a descriptor's multishot (ST_RECV): a listener's accept or
 * a stream's receive. */
static bool is_acceptor(uint32_t st) { return (st & (ST_ACCEPTOR | ST_STREAM)) == ST_ACCEPTOR; }
static int multishot_tag(uint32_t st) { return is_acceptor(st) ? TAG_ACCEPT : TAG_RECV; }

/* Arms or cancels the multishot of a stream (its receive) or a listener
 * (its accept). */
static void arm_multishot(tern__uring *u, int fd, bool want) {
    uint32_t st = u->fds[fd].st;
    struct io_uring_sqe *sqe;
    if (want && !(st & (ST_RECV | ST_EOF))) {
        if ((sqe = get_sqe(u)) == NULL)
            return;
        if (is_acceptor(st) && (st & ST_ONE)) {
            /* Completes without IORING_CQE_F_MORE: armed again (flush_dirty)
             * once the listener took its connection. */
            io_uring_prep_accept(sqe, fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        } else if (is_acceptor(st)) {
            io_uring_prep_multishot_accept(sqe, fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        } else {
            io_uring_prep_recv_multishot(sqe, fd, NULL, 0, 0);
            sqe->flags |= IOSQE_BUFFER_SELECT;
            sqe->buf_group = BUF_GROUP;
        }
        io_uring_sqe_set_data64(sqe, UD(u, fd, multishot_tag(st)));
        u->fds[fd].st = (st | ST_RECV);
    } else if (!want && (st & ST_RECV) && !(st & ST_CANCEL)) {
        if ((sqe = get_sqe(u)) == NULL)
            return;
        io_uring_prep_cancel64(sqe, UD(u, fd, multishot_tag(st)), 0);
        io_uring_sqe_set_data64(sqe, UD(u, fd, TAG_IGNORE));
        u->fds[fd].st = (st | ST_CANCEL);
    }
}

/* A closing descriptor (tern__io_close) is closed once nothing of it is
 * in flight any more. */
static void settle_closing(tern__uring *u, int fd) {
    if (u->fds[fd].st & (ST_POLL | ST_RECV | ST_SEND))
        return;
    close(fd);
    u->fds[fd].st = 0;
    u->fds[fd].gen++;
    rest_drop(u, fd);
}

/* Submits the sends filled since the ring was last entered, then turns
 * each dirty descriptor's wishes into submissions (a stream's send is
 * then in flight, which they depend on). */
static void flush_dirty(tern__uring *u) {
    for (int i = 0; i < u->ntxq; i++) {
        int fd = u->txq[i];
        uint32_t st = u->fds[fd].st;
        if (!(st & ST_TXQ))
            continue;
        u->fds[fd].st = (st & ~ST_TXQ) | ST_SEND;
        submit_send(u, tx_of(u, fd));
    }
    u->ntxq = 0;
    for (int i = 0; i < u->ndirty; i++) {
        int fd = u->dirty[i];
        u->fds[fd].st &= ~ST_DIRTY;
        uint32_t st = u->fds[fd].st;
        if (st & ST_CLOSING) {
            settle_closing(u, fd);
            continue;
        }
        tern__io *io = u->fds[fd].io;
        uint32_t want = io ? io->events : 0;
        if (is_acceptor(st)) {
            arm_multishot(u, fd, (want & TERN__IO_IN) != 0);
            continue;
        }
        if (!(st & ST_STREAM)) {
            arm_poll(u, fd, want & (TERN__IO_IN | TERN__IO_OUT | TERN__IO_RDHUP));
            continue;
        }
        /* A stream: reading by the multishot receive, and a poll watches
         * for the peer's end (its FIN or reset): while paused, to tell the
         * watcher; while reading, to kick the receive (on_poll), except
         * while a kick is under way (ST_CANCEL: the poll would only fire
         * again). Writing waits for a poll only when a sendfile found the
         * socket full (or nothing is in flight to complete: the socket's
         * state tells). */
        arm_multishot(u, fd, (want & TERN__IO_IN) != 0);
        st = u->fds[fd].st;
        uint32_t pw = 0;
        if ((want & TERN__IO_RDHUP) && !(st & ST_EOF) &&
            (!(want & TERN__IO_IN) || !(st & ST_CANCEL)))
            pw |= TERN__IO_RDHUP;
        if ((want & TERN__IO_OUT) && ((st & ST_FULL) || !(st & ST_SEND)))
            pw |= TERN__IO_OUT;
        arm_poll(u, fd, pw);
    }
    u->ndirty = 0;
}

/* ---- interest --------------------------------------------------------- */

/* The watcher of fd goes away without closing it (its owner closes the
 * descriptor itself, maybe at once): cancel its work now, under the
 * generation it was submitted with, and start a new generation, so that
 * what completes later is not taken for a new watcher's. */
static void depart(tern__uring *u, int fd) {
    uint32_t st = u->fds[fd].st;
    struct io_uring_sqe *sqe;
    if ((st & ST_POLL) && !(st & ST_UNPOLL) && (sqe = get_sqe(u)) != NULL) {
        io_uring_prep_poll_remove(sqe, UD(u, fd, TAG_POLL));
        io_uring_sqe_set_data64(sqe, UD(u, fd, TAG_IGNORE));
    }
    if ((st & ST_RECV) && !(st & ST_CANCEL) && (sqe = get_sqe(u)) != NULL) {
        io_uring_prep_cancel64(sqe, UD(u, fd, multishot_tag(st)), 0);
        io_uring_sqe_set_data64(sqe, UD(u, fd, TAG_IGNORE));
    }
    if (st & ST_TXQ) {
        send_put(u, tx_of(u, fd));   /* never submitted */
    } else if (st & ST_SEND) {
        /* In flight: completes as stale, and is freed then (or with the
         * loop). */
        tern__usend *s = tx_of(u, fd);
        s->next_free = u->orphans;
        u->orphans = s;
    }
    tx_set(u, fd, NULL);
    u->fds[fd].gen++;
    u->fds[fd].st = st & ST_DIRTY;
    u->fds[fd].io = NULL;
    rest_drop(u, fd);
}

static int ur_io_set(tern_loop *loop, tern__io *io, uint32_t events) {
    tern__uring *u = ur_of(loop);
    int fd = io->fd;
    int err = table_fit(u, fd);
    if (err < 0)
        return err;
    if (u->fds[fd].st & ST_CLOSING)
        return -EBADF;
    if (events == 0 && !(u->fds[fd].st & ST_STREAM)) {
        /* A poll watcher with no interest is gone (its owner may free it
         * and close the descriptor). A stream with none only stops
         * reading (at its end, say): its sends go on, and it ends by
         * tern__io_close. */
        if (u->fds[fd].io == io)
            depart(u, fd);
        io->events = 0;
        return 0;
    }
    if (u->fds[fd].io != io) {
        /* A new watcher here. One still registered means the descriptor
         * was closed and its number reused without telling us. */
        if (u->fds[fd].io != NULL || (u->fds[fd].st & (ST_POLL | ST_RECV | ST_SEND | ST_TXQ)))
            depart(u, fd);
        u->fds[fd].io = io;
    }
    io->events = events;
    mark_dirty(u, fd);
    return 0;
}

static int ur_io_moved(tern_loop *loop, tern__io *io) {
    tern__uring *u = ur_of(loop);
    if (io->fd < u->cap && u->fds[io->fd].io != NULL)
        u->fds[io->fd].io = io;
    return 0;
}

/* What the kernel holds of the descriptor is cancelled, except its send:
 * as bytes a close leaves in a socket buffer, it still goes (a close frame
 * before a protocol error's close, say), given at most CLOSE_SEND_MS. The
 * descriptor is closed when the last completion has come
 * (settle_closing). */
static const struct __kernel_timespec close_send_ts = {.tv_sec = CLOSE_SEND_MS / 1000,
                                                       .tv_nsec = CLOSE_SEND_MS % 1000 * 1000000L};

static void submit_last_send(tern__uring *u, tern__usend *s) {
    submit_send(u, s)->flags |= IOSQE_IO_LINK;
    struct io_uring_sqe *sqe = get_sqe(u);
    io_uring_prep_link_timeout(sqe, (struct __kernel_timespec *)&close_send_ts, 0);
    io_uring_sqe_set_data64(sqe, UD(u, s->fd, TAG_IGNORE));
}

static void ur_io_close(tern_loop *loop, tern__io *io) {
    tern__uring *u = ur_of(loop);
    int fd = io->fd;
    io->events = 0;
    if (fd >= u->cap) {
        close(fd);
        return;
    }
    u->fds[fd].io = NULL;
    if (u->cur_fd == fd)
        u->cur_fd = -1;
    rest_drop(u, fd);
    uint32_t st = u->fds[fd].st;
    struct io_uring_sqe *sqe;
    if ((st & ST_SEND) && (sqe = get_sqe(u)) != NULL) {
        /* Given CLOSE_SEND_MS too, by a timer that cancels it (on_guard). */
        io_uring_prep_timeout(sqe, (struct __kernel_timespec *)&close_send_ts, 0, 0);
        io_uring_sqe_set_data64(sqe, UD(u, fd, TAG_GUARD));
    }
    if (st & ST_TXQ) {
        submit_last_send(u, tx_of(u, fd));
        st = (st & ~ST_TXQ) | ST_SEND;
    }
    if ((st & ST_POLL) && !(st & ST_UNPOLL) && (sqe = get_sqe(u)) != NULL) {
        io_uring_prep_poll_remove(sqe, UD(u, fd, TAG_POLL));
        io_uring_sqe_set_data64(sqe, UD(u, fd, TAG_IGNORE));
        st |= ST_UNPOLL;
    }
    if ((st & ST_RECV) && !(st & ST_CANCEL) && (sqe = get_sqe(u)) != NULL) {
        io_uring_prep_cancel64(sqe, UD(u, fd, multishot_tag(st)), 0);
        io_uring_sqe_set_data64(sqe, UD(u, fd, TAG_IGNORE));
        st |= ST_CANCEL;
    }
    /* ST_STREAM stays: with it, ST_SHUT (a stream's) is not read as
     * ST_ACCEPTOR (a listener's) by the completions still to come. */
    u->fds[fd].st = (st & (ST_POLL | ST_RECV | ST_SEND | ST_DIRTY | ST_UNPOLL | ST_CANCEL |
                           ST_ACCEPTOR | ST_STREAM)) |
                    ST_CLOSING;
    settle_closing(u, fd);
}

/* ---- listeners -------------------------------------------------------- */

/* A change between the multishot and the single-shot accept cancels the
 * multishot in flight; its last completion (no IORING_CQE_F_MORE) marks
 * the listener dirty, and flush_dirty arms the accept of the new kind. A
 * single-shot in flight just completes. */
static bool ur_io_acceptor(tern_loop *loop, tern__io *io, bool one_at_a_time) {
    tern__uring *u = ur_of(loop);
    int fd = io->fd;
    if (table_fit(u, fd) < 0 || (u->fds[fd].st & (ST_STREAM | ST_POLL)))
        return false;
    uint32_t st = u->fds[fd].st;
    bool was_one = (st & ST_ACCEPTOR) && (st & ST_ONE);
    st |= ST_ACCEPTOR;
    st = one_at_a_time ? st | ST_ONE : st & ~ST_ONE;
    u->fds[fd].st = (uint16_t)st;
    if (one_at_a_time && !was_one && (st & ST_RECV))
        arm_multishot(u, fd, false);
    return true;
}

/* The connection being dispatched, once; a listener on a poll (it was
 * refused the table) accepts itself. */
static int ur_io_accept(tern_loop *loop, tern__io *io) {
    tern__uring *u = ur_of(loop);
    if (u->acc_fd == io->fd) {
        int r = u->acc_res;
        u->acc_res = -EAGAIN;
        return r;
    }
    if (io->fd < u->cap && is_acceptor(u->fds[io->fd].st))
        return -EAGAIN;
    int fd = accept4(io->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    return fd < 0 ? -errno : fd;
}

/* ---- streams ---------------------------------------------------------- */

static bool ur_io_stream(tern_loop *loop, tern__io *io, bool on) {
    tern__uring *u = ur_of(loop);
    if (table_fit(u, io->fd) < 0)
        return !on;
    /* Nothing is armed before the next submission, so a watcher can still
     * change its mind in the callback that started it. */
    if (u->fds[io->fd].st & (ST_RECV | ST_SEND | ST_TXQ))
        return (u->fds[io->fd].st & ST_STREAM) != 0;
    if (on)
        u->fds[io->fd].st |= ST_STREAM;
    else
        u->fds[io->fd].st &= ~ST_STREAM;
    return on;
}

/* Reads what a stream received: first what an earlier report left, then
 * the buffer being dispatched; then the end, once. */
static ssize_t ur_io_recv(tern_loop *loop, tern__io *io, char *buf, size_t len) {
    tern__uring *u = ur_of(loop);
    int fd = io->fd;
    size_t n = 0;
    tern__rest *r = u->rests ? rest_find(u, fd, false) : NULL;
    if (r && r->off < r->len) {
        n = r->len - r->off < len ? r->len - r->off : len;
        memcpy(buf, r->data + r->off, n);
        r->off += n;
    }
    if (u->cur_fd == fd && n < len && u->cur_len > 0) {
        size_t m = u->cur_len < len - n ? u->cur_len : len - n;
        memcpy(buf + n, u->cur, m);
        u->cur += m;
        u->cur_len -= m;
        n += m;
    }
    if (r && r->off == r->len && r->err == 0 && !(u->fds[fd].st & ST_EOF))
        rest_drop(u, fd);
    if (n > 0)
        return (ssize_t)n;
    if ((u->fds[fd].st & ST_EOF) && !(u->cur_fd == fd && u->cur_len > 0)) {
        u->fds[fd].st |= ST_TOLD;
        r = rest_find(u, fd, false);
        return r && r->err ? r->err : 0;
    }
    return -EAGAIN;
}

/* The buffer being dispatched, handed over whole, when nothing an earlier
 * report left comes before it. */
static char *ur_io_take(tern_loop *loop, tern__io *io, size_t *len) {
    tern__uring *u = ur_of(loop);
    int fd = io->fd;
    if (u->cur_fd != fd || u->cur_len == 0 || (u->rests && rest_find(u, fd, false)))
        return NULL;
    char *p = u->cur;
    *len = u->cur_len;
    u->cur += u->cur_len;
    u->cur_len = 0;
    return p;
}

/* What ur_io_send took for io that the kernel has not: its send. */
static size_t ur_io_unsent(tern_loop *loop, const tern__io *io) {
    tern__usend *s = io->fd < ur_of(loop)->cap ? tx_of(ur_of(loop), io->fd) : NULL;
    return s ? s->len - s->off : 0;
}

static size_t ur_io_held(tern_loop *loop, const tern__io *io) {
    tern__uring *u = ur_of(loop);
    int fd = io->fd;
    size_t n = u->cur_fd == fd ? u->cur_len : 0;
    tern__rest *r = u->rests ? rest_find(u, fd, false) : NULL;
    return r ? n + (r->len - r->off) : n;
}

/* Input the watcher has not read: what it left, or the end not yet told. */
static bool ur_io_pending(tern_loop *loop, const tern__io *io) {
    tern__uring *u = ur_of(loop);
    int fd = io->fd;
    if (fd >= u->cap)
        return false;
    if ((u->fds[fd].st & (ST_EOF | ST_TOLD)) == ST_EOF)
        return true;
    if (u->cur_fd == fd && u->cur_len > 0)
        return true;   /* kept in the rest list once its report returns */
    tern__rest *r = u->rests ? rest_find(u, fd, false) : NULL;
    return r && r->off < r->len;
}

/* Takes a copy of iov into the descriptor's send of this iteration (as a
 * socket buffer takes bytes: all of them, up to BIG_SEND waiting). While
 * a send is in flight the kernel has not taken the last one yet (the
 * socket is full): -EAGAIN, and TERN__IO_OUT when it completes. One send
 * is in flight at a time, so bytes never reorder. */
static ssize_t ur_io_send(tern_loop *loop, tern__io *io, const struct iovec *iov, int iovcnt) {
    tern__uring *u = ur_of(loop);
    int fd = io->fd;
    if (u->fds[fd].st & (ST_SEND | ST_FULL))
        return -EAGAIN;
    if ((u->fds[fd].st & ST_EOF)) {
        tern__rest *r = rest_find(u, fd, false);
        if (r && r->err)
            return r->err;
    }
    size_t total = 0;
    for (int i = 0; i < iovcnt; i++)
        total += iov[i].iov_len;
    if (total == 0)
        return 0;
    tern__usend *s = tx_of(u, fd);
    size_t have = s ? s->len : 0;
    if (have >= BIG_SEND)
        return -EAGAIN;
    size_t want = have + total < BIG_SEND ? have + total : BIG_SEND;
    if (s == NULL) {
        if (fd_list_fit(&u->txq, u->ntxq, &u->txq_cap) < 0 || (s = send_get(u, want)) == NULL)
            return -ENOMEM;
        s->fd = fd;
        s->gen = u->fds[fd].gen;
        s->off = s->len = 0;
        if (tx_set(u, fd, s) < 0) {
            send_put(u, s);
            return -ENOMEM;
        }
        u->fds[fd].st |= ST_TXQ;
        u->txq[u->ntxq++] = fd;
    } else if (want > s->cap) {
        size_t cap = want <= LARGE_SEND ? LARGE_SEND : s->cap * 2 > want ? s->cap * 2 : want;
        cap = cap < BIG_SEND ? cap : BIG_SEND;
        tern__usend *g = realloc(s, sizeof(*s) + cap);
        if (g == NULL)
            return -EAGAIN;
        g->cap = cap;
        tx_set(u, fd, g);
        s = g;
    }
    size_t taken = 0;
    for (int i = 0; i < iovcnt && s->len < s->cap; i++) {
        size_t n = iov[i].iov_len < s->cap - s->len ? iov[i].iov_len : s->cap - s->len;
        if (n == 0)
            continue;   /* an empty piece's iov_base may be NULL */
        memcpy(s->data + s->len, iov[i].iov_base, n);
        s->len += n;
        taken += n;
    }
    return (ssize_t)taken;
}

/* sendfile() from the loop's thread, when no send is in flight (so the
 * order holds); a full socket is then watched by a poll. */
static ssize_t ur_io_send_file(tern_loop *loop, tern__io *io, int fd, off_t *off, size_t len) {
    tern__uring *u = ur_of(loop);
    if (u->fds[io->fd].st & (ST_SEND | ST_TXQ))
        return -EAGAIN;   /* after those bytes: TERN__IO_OUT follows */
    ssize_t w;
    do
        w = sendfile(io->fd, fd, off, len);
    while (w < 0 && errno == EINTR);
    if (w < 0) {
        if (errno != EAGAIN)
            return -errno;
        u->fds[io->fd].st |= ST_FULL;
        mark_dirty(u, io->fd);
        return -EAGAIN;
    }
    return w;
}

static int ur_io_shutdown(tern_loop *loop, tern__io *io) {
    tern__uring *u = ur_of(loop);
    if (u->fds[io->fd].st & (ST_SEND | ST_TXQ)) {
        u->fds[io->fd].st |= ST_SHUT;   /* after the send */
        return 0;
    }
    return shutdown(io->fd, SHUT_WR) < 0 ? -errno : 0;
}

/* ---- completions ------------------------------------------------------ */

static void ends_add(tern__uring *u, int fd) {
    if (u->nends == u->ends_cap) {
        int cap = u->ends_cap ? u->ends_cap * 2 : 64;
        uint64_t *e = realloc(u->ends, (size_t)cap * sizeof(*e));
        if (e == NULL)
            return;   /* told when the watcher next reads (tern__io_pending) */
        u->ends = e;
        u->ends_cap = cap;
    }
    u->ends[u->nends++] = (uint64_t)(uint32_t)fd << 16 | u->fds[fd].gen;
}

/* Tells the ends the last batch's receives saw, to watchers still there
 * and still asking (a paused one finds it when it resumes). */
static void ends_tell(tern__uring *u) {
    int n = u->nends;
    u->nends = 0;
    for (int i = 0; i < n; i++) {
        int fd = (int)(u->ends[i] >> 16);
        tern__io *io = u->fds[fd].io;
        if ((uint16_t)u->ends[i] != u->fds[fd].gen || io == NULL ||
            (u->fds[fd].st & (ST_CLOSING | ST_TOLD)) ||
            !(io->events & (TERN__IO_IN | TERN__IO_RDHUP)))
            continue;
        tern__rest *r = u->rests ? rest_find(u, fd, false) : NULL;
        io->fn(io, (io->events & TERN__IO_IN ? TERN__IO_IN : 0) | TERN__IO_RDHUP |
                       (r && r->err ? TERN__IO_ERR : 0));
    }
}

/* The poll watcher fires; a stream's poll is for its paused end or a full
 * socket. Re-armed (from flush_dirty) while still wanted. */
static void on_poll(tern__uring *u, int fd, int res) {
    u->fds[fd].st &= ~(ST_POLL | ST_UNPOLL | PM_MASK);
    tern__io *io = u->fds[fd].io;
    if (u->fds[fd].st & ST_CLOSING) {
        mark_dirty(u, fd);
        return;
    }
    if (io == NULL || res == -ECANCELED)
        return;
    mark_dirty(u, fd);
    uint32_t revents = res < 0 ? TERN__IO_ERR : (uint32_t)res;
    uint32_t st = u->fds[fd].st;
    if (st & ST_STREAM) {
        if (revents & TERN__IO_OUT)
            u->fds[fd].st &= ~ST_FULL;
        if (st & (ST_RECV | ST_EOF)) {
            /* The end is the receive's to report, after the bytes before
             * it: one is in flight, or has seen the end already (a
             * watcher that paused since finds it then). Told here, it
             * would overtake them (a request and its FIN: the request
             * aborted, not answered). But the kernel (6.18 seen) may leave
             * a multishot receive that has just returned bytes waiting for
             * ever when the peer's reset comes at that moment; so the
             * receive is cancelled and armed again (flush_dirty), and the
             * new one reads what is left, then the end. Without this a
             * reset connection stayed open until its timeout. */
            if ((revents & (TERN__IO_RDHUP | TERN__IO_HUP | TERN__IO_ERR)) && (st & ST_RECV))
                arm_multishot(u, fd, false);
            revents &= TERN__IO_OUT;
            if (revents == 0)
                return;
        }
    }
    io->fn(io, revents);
}

static void on_recv(tern__uring *u, int fd, int res, uint32_t flags) {
    if (!(flags & IORING_CQE_F_MORE)) {
        u->fds[fd].st &= ~(ST_RECV | ST_CANCEL);
        mark_dirty(u, fd);   /* armed again if still wanted (ENOBUFS, a cancel undone) */
    }
    bool has_buf = (flags & IORING_CQE_F_BUFFER) != 0;
    unsigned bid = flags >> IORING_CQE_BUFFER_SHIFT;
    tern__io *io = (u->fds[fd].st & ST_CLOSING) ? NULL : u->fds[fd].io;
    if (res == -ENOBUFS || res == -ECANCELED || io == NULL) {
        if (has_buf)
            buf_recycle(u, bid);
        return;
    }
    if (res <= 0) {
        /* The end: 0, or an error (a reset) for the reader to find. */
        u->fds[fd].st |= ST_EOF;
        if (res < 0) {
            tern__rest *r = rest_find(u, fd, true);
            if (r)
                r->err = res;
        }
        /* Told in the next iteration, not now: what the bytes before it
         * made the watcher write (an echo in the cork) is flushed at the
         * end of this batch and must leave before a close the end may
         * bring. (epoll reports the end in a read of its own, after.) */
        ends_add(u, fd);
        return;
    }
    char *data = u->bufs + (size_t)bid * BUF_SIZE;
    if (io->events & TERN__IO_IN) {
        u->cur_fd = fd;
        u->cur = data;
        u->cur_len = (size_t)res;
        io->fn(io, TERN__IO_IN);
        /* What the watcher did not read (it paused, or had less room) is
         * kept for its next read. */
        if (u->cur_fd == fd && u->cur_len > 0 && u->fds[fd].io != NULL)
            rest_keep(u, fd, u->cur, u->cur_len);
        u->cur_fd = -1;
    } else {
        rest_keep(u, fd, data, (size_t)res);   /* arrived while paused */
    }
    buf_recycle(u, bid);
}

static void on_send(tern__uring *u, tern__usend *s, int res) {
    int fd = s->fd;
    if (fd >= u->cap || s->gen != u->fds[fd].gen) {
        /* Its watcher went away. */
        for (tern__usend **p = &u->orphans; *p; p = &(*p)->next_free)
            if (*p == s) {
                *p = s->next_free;
                break;
            }
        send_put(u, s);
        return;
    }
    bool closing = (u->fds[fd].st & ST_CLOSING) != 0;
    tern__io *io = closing ? NULL : u->fds[fd].io;
    if (res > 0 && s->off + (size_t)res < s->len && (io != NULL || closing)) {
        s->off += (size_t)res;   /* a short send: the rest goes first */
        if (closing)
            submit_last_send(u, s);
        else
            submit_send(u, s);
        return;
    }
    send_put(u, s);
    tx_set(u, fd, NULL);
    u->fds[fd].st &= ~ST_SEND;
    if (io == NULL) {
        if (u->fds[fd].st & ST_CLOSING) {
            /* A shutdown asked before the close (TLS's, after its
             * close_notify): the FIN goes now, ahead of the close. */
            if ((u->fds[fd].st & (ST_STREAM | ST_SHUT)) == (ST_STREAM | ST_SHUT) && res >= 0)
                shutdown(fd, SHUT_WR);
            mark_dirty(u, fd);
        }
        return;
    }
    if (res < 0) {
        u->fds[fd].st |= ST_EOF;
        tern__rest *r = rest_find(u, fd, true);
        if (r && r->err == 0)
            r->err = res;
        io->fn(io, TERN__IO_ERR | TERN__IO_IN);
        return;
    }
    if (u->fds[fd].st & ST_SHUT) {
        u->fds[fd].st &= ~ST_SHUT;
        shutdown(fd, SHUT_WR);
    }
    if (io->events & TERN__IO_OUT)
        io->fn(io, TERN__IO_OUT);
}

/* A closed stream's send is still in flight at the end of its time: the
 * peer does not read; cancel it (then the descriptor closes). */
static void on_guard(tern__uring *u, int fd) {
    struct io_uring_sqe *sqe;
    if ((u->fds[fd].st & (ST_CLOSING | ST_SEND)) == (ST_CLOSING | ST_SEND) &&
        (sqe = get_sqe(u)) != NULL) {
        io_uring_prep_cancel64(sqe, (uint64_t)(uintptr_t)tx_of(u, fd) | TAG_SEND, 0);
        io_uring_sqe_set_data64(sqe, UD(u, fd, TAG_IGNORE));
    }
}

/* A listener's accept completed: a connection, or an error (which ends
 * the multishot; it is armed again while wanted). A connection nobody
 * takes (the listener went, or stopped accepting meanwhile) is closed:
 * its client sees a reset, as the accept queue's would at the close. */
static void on_accept(tern__uring *u, int fd, int res, uint32_t flags) {
    if (!(flags & IORING_CQE_F_MORE)) {
        u->fds[fd].st &= ~(ST_RECV | ST_CANCEL);
        mark_dirty(u, fd);
    }
    tern__io *io = (u->fds[fd].st & ST_CLOSING) ? NULL : u->fds[fd].io;
    if (res == -ECANCELED)
        return;
    if (io == NULL || !(io->events & TERN__IO_IN)) {
        if (res >= 0)
            close(res);
        return;
    }
    u->acc_fd = fd;
    u->acc_res = res;
    io->fn(io, TERN__IO_IN);
    if (u->acc_fd == fd && u->acc_res >= 0)
        close(u->acc_res);   /* not taken */
    u->acc_fd = -1;
}

static void dispatch(tern__uring *u, uint64_t ud, int res, uint32_t flags) {
    int tag = (int)(ud & 7);
    if (tag == TAG_SEND) {
        on_send(u, (tern__usend *)(uintptr_t)(ud & ~(uint64_t)7), res);
        return;
    }
    int fd = (int)(uint32_t)(ud >> 3);
    if (fd >= u->cap || (uint16_t)(ud >> 48) != u->fds[fd].gen) {
        /* Stale: its watcher went away. Only a buffer to give back. */
        if (tag == TAG_RECV && (flags & IORING_CQE_F_BUFFER))
            buf_recycle(u, flags >> IORING_CQE_BUFFER_SHIFT);
        else if (tag == TAG_ACCEPT && res >= 0)
            close(res);   /* a connection for a listener that went */
        return;
    }
    if (tag == TAG_POLL)
        on_poll(u, fd, res);
    else if (tag == TAG_GUARD)
        on_guard(u, fd);
    else if (tag == TAG_RECV)
        on_recv(u, fd, res, flags);
    else if (tag == TAG_ACCEPT)
        on_accept(u, fd, res, flags);
}

static int ur_wait(tern_loop *loop, int timeout_ms) {
    tern__uring *u = ur_of(loop);
    if (!u->enabled) {
        int err = ur_enable(u);
        if (err < 0)
            return err;
    }
    flush_dirty(u);
    int r;
    if (timeout_ms == 0 || u->nends > 0) {
        r = io_uring_submit_and_get_events(&u->ring);
    } else {
        struct io_uring_cqe *cqe;
        struct __kernel_timespec ts = {.tv_sec = timeout_ms / 1000,
                                       .tv_nsec = (long long)(timeout_ms % 1000) * 1000000};
        r = io_uring_submit_and_wait_timeout(&u->ring, &cqe, 1, timeout_ms < 0 ? NULL : &ts, NULL);
    }
    if (r < 0 && r != -ETIME && r != -EINTR && r != -EAGAIN && r != -EBUSY)
        return r;
    tern__loop_update_time(loop);
    /* Copied out and released first: callbacks submit (a full queue
     * submits at once), and completions of this batch stay valid. */
    struct io_uring_cqe *cqes[CQES_PER_BATCH];
    struct { uint64_t ud; int res; uint32_t flags; } batch[CQES_PER_BATCH];
    unsigned n = io_uring_peek_batch_cqe(&u->ring, cqes, CQES_PER_BATCH);
    for (unsigned i = 0; i < n; i++) {
        batch[i].ud = cqes[i]->user_data;
        batch[i].res = cqes[i]->res;
        batch[i].flags = cqes[i]->flags;
    }
    io_uring_cq_advance(&u->ring, n);
    ends_tell(u);
    for (unsigned i = 0; i < n; i++)
        dispatch(u, batch[i].ud, batch[i].res, batch[i].flags);
    return 0;
}

static void ur_flush(tern_loop *loop) {
    tern__uring *u = ur_of(loop);
    if (!u->enabled)
        return;
    flush_dirty(u);
    io_uring_submit(&u->ring);
}

const tern__backend_ops tern__uring_backend = {
    .name = "io_uring",
    .init = ur_init,
    .free = ur_free,
    .io_set = ur_io_set,
    .io_moved = ur_io_moved,
    .io_close = ur_io_close,
    .wait = ur_wait,
    .flush = ur_flush,
    .io_acceptor = ur_io_acceptor,
    .io_accept = ur_io_accept,
    .io_stream = ur_io_stream,
    .io_recv = ur_io_recv,
    .io_take = ur_io_take,
    .io_pending = ur_io_pending,
    .io_held = ur_io_held,
    .io_unsent = ur_io_unsent,
    .io_send = ur_io_send,
    .io_send_file = ur_io_send_file,
    .io_shutdown = ur_io_shutdown,
};
