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
#include "loop/uring.h"

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

/* Closes io's descriptor once the kernel has let go of it. keep_send: the
 * send in flight or queued still goes, given CLOSE_SEND_MS; else it is
 * cancelled or dropped (the peer stopped reading). */
static void close_stream(tern_loop *loop, tern__io *io, bool keep_send) {
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
    if ((st & ST_SEND) && !keep_send && (sqe = get_sqe(u)) != NULL) {
        /* Its completion (-ECANCELED) lets settle_closing close fd. */
        io_uring_prep_cancel64(sqe, (uint64_t)(uintptr_t)tx_of(u, fd) | TAG_SEND, 0);
        io_uring_sqe_set_data64(sqe, UD(u, fd, TAG_IGNORE));
    } else if ((st & ST_SEND) && (sqe = get_sqe(u)) != NULL) {
        /* Given CLOSE_SEND_MS too, by a timer that cancels it (on_guard). */
        io_uring_prep_timeout(sqe, (struct __kernel_timespec *)&close_send_ts, 0, 0);
        io_uring_sqe_set_data64(sqe, UD(u, fd, TAG_GUARD));
    }
    if ((st & ST_TXQ) && !keep_send) {
        /* Never submitted: flush_dirty skips fd without ST_TXQ. */
        send_put(u, tx_of(u, fd));
        tx_set(u, fd, NULL);
        st &= ~ST_TXQ;
    } else if (st & ST_TXQ) {
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

static void ur_io_close(tern_loop *loop, tern__io *io) { close_stream(loop, io, true); }

static void ur_io_close_dropping(tern_loop *loop, tern__io *io) { close_stream(loop, io, false); }

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
    .io_close_dropping = ur_io_close_dropping,
    .wait = ur_wait,
    .flush = ur_flush,
    .io_acceptor = ur_io_acceptor,
    .io_accept = ur_io_accept,
    .io_stream = tern__ur_io_stream,
    .io_recv = tern__ur_io_recv,
    .io_take = tern__ur_io_take,
    .io_pending = tern__ur_io_pending,
    .io_held = tern__ur_io_held,
    .io_unsent = tern__ur_io_unsent,
    .io_send = tern__ur_io_send,
    .io_send_file = tern__ur_io_send_file,
    .io_shutdown = tern__ur_io_shutdown,
};
