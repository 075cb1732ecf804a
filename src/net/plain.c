/* The plain transport: the socket's bytes through recv/send/sendfile,
 * called when the loop reports readiness. Stateless: every plain
 * connection shares the one instance. */
#include <errno.h>
#include <sys/socket.h>

#include "net/conn.h"
#include "platform/platform.h"

static ssize_t plain_recv(tern__conn *c, char *buf, size_t len) {
    ssize_t r;
    do
        r = recv(c->io.fd, buf, len, 0);
    while (r < 0 && errno == EINTR);
    if (r < 0)
        return errno == EWOULDBLOCK ? -EAGAIN : -errno;
    return r;
}

static ssize_t plain_send(tern__conn *c, const struct iovec *iov, int iovcnt) {
    /* One buffer (a cork flush, the common case) goes by send(): the kernel
     * then has no msghdr and iovec to copy in and check. */
    if (iovcnt == 1)
        return tern__plat_send(c->io.fd, iov[0].iov_base, iov[0].iov_len);
    struct msghdr msg = {.msg_iov = (struct iovec *)iov, .msg_iovlen = iovcnt};
    return tern__plat_sendmsg(c->io.fd, &msg);
}

static ssize_t plain_send_file(tern__conn *c, int fd, off_t *off, size_t len) {
    return tern__plat_sendfile(c->io.fd, fd, off, len);
}

static int plain_shutdown(tern__conn *c) { return shutdown(c->io.fd, SHUT_WR) < 0 ? -errno : 0; }
static bool plain_pending(const tern__conn *c) { return false; }
static void plain_release(tern__conn *c) {}
static const char *plain_server_name(const tern__conn *c) { return NULL; }

static const tern__transport_ops plain_ops = {
    .recv = plain_recv,
    .send = plain_send,
    .send_file = plain_send_file,
    .shutdown = plain_shutdown,
    .pending = plain_pending,
    .release = plain_release,
    .server_name = plain_server_name,
};

tern__transport tern__plain_transport = {&plain_ops};
