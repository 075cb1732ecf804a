/* The poll(2) back end: readiness, level-triggered, POSIX alone.
 *
 * The portable build's back end (CMake TERN_PORTABLE), and a third choice
 * of the Linux build (TERN_IO=poll, tern serve --io poll), which runs the
 * same tests on it. Every wait hands the kernel the whole set, so a wait
 * costs O(watchers): right for the hundreds of connections of a system
 * without epoll, not for the tens of thousands epoll is for.
 *
 * TERN__IO_RDHUP without TERN__IO_IN (a paused connection: "the peer's
 * end, never bytes") has no poll event of its own in POSIX (POLLRDHUP is
 * Linux's), so it is asked as readability and the socket peeked at when
 * that is reported: nothing to read is the end, reported as RDHUP; bytes
 * (sent while paused) mute the watch until the interest changes, so the
 * end behind them is read on resume. One path on every system, so the
 * Linux build's tests on poll test the portable build's. */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "loop/loop_internal.h"

/* One report of the current batch: the watcher (NULL once it was
 * removed), its descriptor, what happened in the loop's flags. */
typedef struct tern__poll_ready {
    tern__io *io;
    int fd;
    uint32_t revents;
} tern__poll_ready;

/* Invariants:
 * - fds[0..len) are the registered descriptors and ios[i] the watcher of
 *   fds[i]; slot[fd] is that i for a registered fd, -1 for any other fd
 *   below slot_cap. fds, ios and ready have room for cap entries.
 * - ready[next..nready) are the current batch's reports still to run; a
 *   watcher removed meanwhile has its reports there cleared (io NULL), so
 *   a callback may free a watcher that has a report queued. */
typedef struct tern__poll {
    struct pollfd *fds;
    tern__io **ios;
    tern__poll_ready *ready;
    size_t len, cap;
    size_t next, nready;
    int *slot;
    size_t slot_cap;
} tern__poll;

static tern__poll *poll_of(tern_loop *loop) { return loop->backend; }

/* Watching for the peer's end alone (see the top of the file). */
static bool end_only(uint32_t events) {
    return (events & TERN__IO_RDHUP) && !(events & TERN__IO_IN);
}

static short to_poll(uint32_t events) {
    short ev = 0;
    if (events & (TERN__IO_IN | TERN__IO_RDHUP))
        ev |= POLLIN;
    if (events & TERN__IO_OUT)
        ev |= POLLOUT;
    return ev;
}

/* A descriptor closed under a watcher (POLLNVAL) is reported as an error
 * and a hang-up: the owner then closes it, instead of it being reported
 * in every wait. */
static uint32_t from_poll(short rev) {
    uint32_t ev = 0;
    if (rev & POLLIN)
        ev |= TERN__IO_IN;
    if (rev & POLLOUT)
        ev |= TERN__IO_OUT;
    if (rev & POLLERR)
        ev |= TERN__IO_ERR;
    if (rev & POLLHUP)
        ev |= TERN__IO_HUP;
    if (rev & POLLNVAL)
        ev |= TERN__IO_ERR | TERN__IO_HUP;
    return ev;
}

/* fds[i] watches for the peer's end alone and poll said readable: a peek
 * tells the end (RDHUP) from bytes (the watch is muted: no POLLIN until
 * the interest changes) and from an error (ERR). What the watcher is
 * told instead of IN. */
static uint32_t peek_end(struct pollfd *pfd, uint32_t ev) {
    char b;
    ssize_t n;
    do
        n = recv(pfd->fd, &b, 1, MSG_PEEK);
    while (n < 0 && errno == EINTR);
    ev &= ~(uint32_t)TERN__IO_IN;
    if (n == 0)
        return ev | TERN__IO_RDHUP;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
        return ev | TERN__IO_ERR;
    pfd->events &= (short)~POLLIN;
    return ev;
}

static int pl_init(tern_loop *loop) {
    tern__poll *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return -ENOMEM;
    loop->backend = p;
    return 0;
}

static void pl_free(tern_loop *loop) {
    tern__poll *p = poll_of(loop);
    free(p->fds);
    free(p->ios);
    free(p->ready);
    free(p->slot);
    free(p);
    loop->backend = NULL;
}

/* Room for one more watcher, and slot[] reaching fd. */
static int reserve(tern__poll *p, int fd) {
    if ((size_t)fd >= p->slot_cap) {
        size_t n = p->slot_cap ? p->slot_cap : 64;
        while (n <= (size_t)fd)
            n *= 2;
        int *slot = realloc(p->slot, n * sizeof(*slot));
        if (slot == NULL)
            return -ENOMEM;
        for (size_t i = p->slot_cap; i < n; i++)
            slot[i] = -1;
        p->slot = slot;
        p->slot_cap = n;
    }
    if (p->len == p->cap) {
        size_t n = p->cap ? p->cap * 2 : 64;
        struct pollfd *fds = realloc(p->fds, n * sizeof(*fds));
        if (fds == NULL)
            return -ENOMEM;
        p->fds = fds;
        tern__io **ios = realloc(p->ios, n * sizeof(*ios));
        if (ios == NULL)
            return -ENOMEM;
        p->ios = ios;
        tern__poll_ready *ready = realloc(p->ready, n * sizeof(*ready));
        if (ready == NULL)
            return -ENOMEM;
        p->ready = ready;
        p->cap = n;
    }
    return 0;
}

/* The watcher's reports still queued in this batch are dropped: it may be
 * freed before the rest of the batch runs. */
static void forget_reports(tern__poll *p, const tern__io *io) {
    for (size_t i = p->next; i < p->nready; i++)
        if (p->ready[i].io == io)
            p->ready[i].io = NULL;
}

/* Takes fds[slot[fd]] out of the set: the last entry fills its place. */
static void remove_fd(tern__poll *p, int fd) {
    int i = p->slot[fd];
    size_t last = p->len - 1;
    if ((size_t)i != last) {
        p->fds[i] = p->fds[last];
        p->ios[i] = p->ios[last];
        p->slot[p->fds[i].fd] = i;
    }
    p->slot[fd] = -1;
    p->len = last;
}

static int pl_io_set(tern_loop *loop, tern__io *io, uint32_t events) {
    tern__poll *p = poll_of(loop);
    if (io->fd < 0)
        return -EBADF;
    if (io->events == 0) {
        int err = reserve(p, io->fd);
        if (err < 0)
            return err;
        if (p->slot[io->fd] >= 0)
            return -EEXIST;   /* another watcher has it, as epoll says */
        p->fds[p->len] = (struct pollfd){.fd = io->fd, .events = to_poll(events)};
        p->ios[p->len] = io;
        p->slot[io->fd] = (int)p->len++;
    } else if (events == 0) {
        remove_fd(p, io->fd);
        forget_reports(p, io);
    } else {
        p->fds[p->slot[io->fd]].events = to_poll(events);
    }
    io->events = events;
    return 0;
}

/* The watcher of io->fd now lives at io: so do its queued reports. */
static int pl_io_moved(tern_loop *loop, tern__io *io) {
    tern__poll *p = poll_of(loop);
    if (io->events == 0)
        return 0;
    p->ios[p->slot[io->fd]] = io;
    for (size_t i = p->next; i < p->nready; i++)
        if (p->ready[i].io != NULL && p->ready[i].fd == io->fd)
            p->ready[i].io = io;
    return 0;
}

static void pl_io_close(tern_loop *loop, tern__io *io) {
    tern__poll *p = poll_of(loop);
    if (io->events != 0)
        remove_fd(p, io->fd);
    forget_reports(p, io);
    close(io->fd);
    io->events = 0;
}

static int pl_wait(tern_loop *loop, int timeout_ms) {
    tern__poll *p = poll_of(loop);
    int n = poll(p->fds, (nfds_t)p->len, timeout_ms);
    if (n < 0 && errno != EINTR)
        return -errno;
    tern__loop_update_time(loop);
    /* The reports are taken before any runs: a callback changes the set. */
    p->nready = 0;
    for (size_t i = 0; n > 0 && i < p->len; i++) {
        if (p->fds[i].revents == 0)
            continue;
        n--;
        uint32_t ev = from_poll(p->fds[i].revents);
        if ((ev & TERN__IO_IN) && end_only(p->ios[i]->events))
            ev = peek_end(&p->fds[i], ev);
        if (ev != 0)
            p->ready[p->nready++] = (tern__poll_ready){p->ios[i], p->fds[i].fd, ev};
    }
    for (p->next = 0; p->next < p->nready;) {
        tern__poll_ready r = p->ready[p->next++];
        if (r.io != NULL)  /* NULL: removed by an earlier callback */
            r.io->fn(r.io, r.revents);
    }
    p->nready = 0;
    return 0;
}

const tern__backend_ops tern__poll_backend = {
    .name = "poll",
    .init = pl_init,
    .free = pl_free,
    .io_set = pl_io_set,
    .io_moved = pl_io_moved,
    .io_close = pl_io_close,
    .wait = pl_wait,
};
