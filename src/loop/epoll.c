/* The epoll back end: readiness, level-triggered.
 *
 * A connection reads once per readiness report, so one busy peer cannot
 * starve the others, and nothing has to remember "there may be more to
 * read". TERN__IO_OUT is armed only while a connection has a backlog, so
 * the common case costs no epoll_ctl at all after the connection is
 * added. */
#include <errno.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "loop/loop_internal.h"

/* The loop's interest flags are epoll's own values: no translation. */
_Static_assert((int)TERN__IO_IN == (int)EPOLLIN && (int)TERN__IO_OUT == (int)EPOLLOUT &&
                   (int)TERN__IO_ERR == (int)EPOLLERR && (int)TERN__IO_HUP == (int)EPOLLHUP &&
                   (int)TERN__IO_RDHUP == (int)EPOLLRDHUP,
               "the loop's interest flags are epoll's values");

#define TERN__EVENTS_PER_WAIT 512

/* Invariant: events[next..len) are the current batch's reports still to
 * run; a watcher removed meanwhile has its reports there cleared (data.ptr
 * NULL), so a callback may free a watcher that has a report queued. */
typedef struct tern__epoll {
    int epfd;
    int next, len;
    struct epoll_event events[TERN__EVENTS_PER_WAIT];
} tern__epoll;

static tern__epoll *ep_of(tern_loop *loop) { return loop->backend; }

static int ep_init(tern_loop *loop) {
    tern__epoll *ep = calloc(1, sizeof(*ep));
    if (ep == NULL)
        return -ENOMEM;
    ep->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (ep->epfd < 0) {
        int err = -errno;
        free(ep);
        return err;
    }
    loop->backend = ep;
    return 0;
}

static void ep_free(tern_loop *loop) {
    tern__epoll *ep = ep_of(loop);
    close(ep->epfd);
    free(ep);
    loop->backend = NULL;
}

static int ep_io_set(tern_loop *loop, tern__io *io, uint32_t events) {
    tern__epoll *ep = ep_of(loop);
    struct epoll_event ev = {.events = events, .data.ptr = io};
    int op = io->events == 0 ? EPOLL_CTL_ADD : events == 0 ? EPOLL_CTL_DEL : EPOLL_CTL_MOD;
    if (epoll_ctl(ep->epfd, op, io->fd, &ev) < 0)
        return -errno;
    io->events = events;
    if (events == 0) {
        /* The watcher may be freed before the rest of this batch runs. */
        for (int i = ep->next; i < ep->len; i++)
            if (ep->events[i].data.ptr == io)
                ep->events[i].data.ptr = NULL;
    }
    return 0;
}

static int ep_io_moved(tern_loop *loop, tern__io *io) {
    struct epoll_event ev = {.events = io->events, .data.ptr = io};
    if (io->events && epoll_ctl(ep_of(loop)->epfd, EPOLL_CTL_MOD, io->fd, &ev) < 0)
        return -errno;
    return 0;
}

/* Closing the descriptor takes it out of epoll (no other descriptor
 * shares its file); its reports still queued in this batch are dropped. */
static void ep_io_close(tern_loop *loop, tern__io *io) {
    tern__epoll *ep = ep_of(loop);
    close(io->fd);
    io->events = 0;
    for (int i = ep->next; i < ep->len; i++)
        if (ep->events[i].data.ptr == io)
            ep->events[i].data.ptr = NULL;
}

static int ep_wait(tern_loop *loop, int timeout_ms) {
    tern__epoll *ep = ep_of(loop);
    int n = epoll_wait(ep->epfd, ep->events, TERN__EVENTS_PER_WAIT, timeout_ms);
    if (n < 0 && errno != EINTR)
        return -errno;
    tern__loop_update_time(loop);
    ep->len = n < 0 ? 0 : n;
    for (ep->next = 0; ep->next < ep->len;) {
        struct epoll_event *ev = &ep->events[ep->next++];
        tern__io *io = ev->data.ptr;
        if (io != NULL)  /* NULL: removed by an earlier callback */
            io->fn(io, ev->events);
    }
    ep->len = 0;
    return 0;
}

const tern__backend_ops tern__epoll_backend = {
    .name = "epoll",
    .init = ep_init,
    .free = ep_free,
    .io_set = ep_io_set,
    .io_moved = ep_io_moved,
    .io_close = ep_io_close,
    .wait = ep_wait,
};
