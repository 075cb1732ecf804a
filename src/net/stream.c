/* The stream transport: a plain connection whose bytes the loop's back end
 * moves by completions (io_uring; tern__io_stream). net's connection
 * logic is the same as over the plain transport: the back end reports
 * TERN__IO_IN and TERN__IO_OUT, and the bytes pass through these calls.
 * Stateless: the state is the back end's, per descriptor. */
#include "net/conn.h"

static ssize_t stream_recv(tern__conn *c, char *buf, size_t len) {
    return tern__io_recv(c->loop, &c->io, buf, len);
}

static char *stream_take(tern__conn *c, size_t *len) { return tern__io_take(c->loop, &c->io, len); }

static ssize_t stream_send(tern__conn *c, const struct iovec *iov, int iovcnt) {
    return tern__io_send(c->loop, &c->io, iov, iovcnt);
}

static ssize_t stream_send_file(tern__conn *c, int fd, off_t *off, size_t len) {
    return tern__io_send_file(c->loop, &c->io, fd, off, len);
}

static int stream_shutdown(tern__conn *c) { return tern__io_shutdown(c->loop, &c->io); }

/* Bytes the back end received that the protocol has not been given (it
 * was paused, or they did not fit), or the end not yet told: the socket
 * will not report them again, so net re-feeds at the batch end. */
static bool stream_pending(const tern__conn *c) { return tern__io_pending(c->loop, &c->io); }

static size_t stream_held(const tern__conn *c) { return tern__io_held(c->loop, &c->io); }

static size_t stream_unsent(const tern__conn *c) { return tern__io_unsent(c->loop, &c->io); }

static void stream_release(tern__conn *c) {}
static const char *stream_server_name(const tern__conn *c) { return NULL; }

static const tern__transport_ops stream_ops = {
    .recv = stream_recv,
    .send = stream_send,
    .send_file = stream_send_file,
    .shutdown = stream_shutdown,
    .pending = stream_pending,
    .release = stream_release,
    .server_name = stream_server_name,
    .held = stream_held,
    .unsent = stream_unsent,
    .take = stream_take,
    .coalesces = true,
};

tern__transport tern__stream_transport = {&stream_ops};
