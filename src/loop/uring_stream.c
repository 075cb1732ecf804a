/* The io_uring back end's streams (tern__io_stream and the io_* calls
 * after it, loop.h): reading what the multishot receive brought, and
 * filling the send of this iteration. See uring.c for the whole. */
#include "loop/uring.h"

/* ---- streams ---------------------------------------------------------- */

bool tern__ur_io_stream(tern_loop *loop, tern__io *io, bool on) {
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
ssize_t tern__ur_io_recv(tern_loop *loop, tern__io *io, char *buf, size_t len) {
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
char *tern__ur_io_take(tern_loop *loop, tern__io *io, size_t *len) {
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

/* What tern__ur_io_send took for io that the kernel has not: its send. */
size_t tern__ur_io_unsent(tern_loop *loop, const tern__io *io) {
    tern__usend *s = io->fd < ur_of(loop)->cap ? tx_of(ur_of(loop), io->fd) : NULL;
    return s ? s->len - s->off : 0;
}

size_t tern__ur_io_held(tern_loop *loop, const tern__io *io) {
    tern__uring *u = ur_of(loop);
    int fd = io->fd;
    size_t n = u->cur_fd == fd ? u->cur_len : 0;
    tern__rest *r = u->rests ? rest_find(u, fd, false) : NULL;
    return r ? n + (r->len - r->off) : n;
}

/* Input the watcher has not read: what it left, or the end not yet told. */
bool tern__ur_io_pending(tern_loop *loop, const tern__io *io) {
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
ssize_t tern__ur_io_send(tern_loop *loop, tern__io *io, const struct iovec *iov, int iovcnt) {
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
    } else if (want > s->cap && want <= LARGE_SEND) {
        /* A small op outgrown (pipelined answers): a large one from its
         * free list takes the bytes, and the small one goes back to its
         * own, rather than a realloc (a malloc and a free) each time. */
        tern__usend *g = send_get(u, want);
        if (g == NULL)
            return -EAGAIN;
        g->fd = s->fd;
        g->gen = s->gen;
        g->off = s->off;
        g->len = s->len;
        memcpy(g->data, s->data, s->len);
        tx_set(u, fd, g);
        send_put(u, s);
        s = g;
    } else if (want > s->cap) {
        size_t cap = s->cap * 2 > want ? s->cap * 2 : want;
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
ssize_t tern__ur_io_send_file(tern_loop *loop, tern__io *io, int fd, off_t *off, size_t len) {
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

int tern__ur_io_shutdown(tern_loop *loop, tern__io *io) {
    tern__uring *u = ur_of(loop);
    if (u->fds[io->fd].st & (ST_SEND | ST_TXQ)) {
        u->fds[io->fd].st |= ST_SHUT;   /* after the send */
        return 0;
    }
    return shutdown(io->fd, SHUT_WR) < 0 ? -errno : 0;
}
