/* platform.h on Linux: eventfd, signalfd, accept4, sendfile, getrandom,
 * openat2(RESOLVE_BENEATH), TCP_INFO and SIOCOUTQ, sched_getaffinity, the
 * coarse clocks. The default build's platform file. */
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <linux/sockios.h>   /* SIOCOUTQ */
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/sendfile.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "platform/platform.h"

#define TERN__PATH_MAX 4096

/* ---- wake-up: an eventfd, both ends in one ------------------------------- */

int tern__plat_wake_open(tern__plat_wake *w) {
    int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0)
        return -errno;
    w->rfd = w->wfd = fd;
    return 0;
}

void tern__plat_wake_signal(const tern__plat_wake *w) {
    uint64_t one = 1;
    ssize_t r;
    do
        r = write(w->wfd, &one, sizeof(one));
    while (r < 0 && errno == EINTR);
    /* EAGAIN means the counter is already non-zero: the loop will wake. */
}

void tern__plat_wake_drain(const tern__plat_wake *w) {
    uint64_t v;
    while (read(w->rfd, &v, sizeof(v)) < 0 && errno == EINTR)
        ;
}

void tern__plat_wake_close(tern__plat_wake *w) { w->wfd = -1; }

/* ---- signals: a signalfd of the blocked signals ------------------------- */

void tern__plat_signals_init(tern__plat_signals *s) {
    s->fd = -1;
    s->wfd = -1;
    sigemptyset(&s->set);
}

int tern__plat_signals_add(tern__plat_signals *s, int signo) {
    sigaddset(&s->set, signo);
    int err = pthread_sigmask(SIG_BLOCK, &s->set, NULL);
    if (err != 0)
        return -err;
    int fd = signalfd(s->fd, &s->set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (fd < 0)
        return -errno;
    s->fd = fd;
    return 0;
}

int tern__plat_signals_next(tern__plat_signals *s) {
    struct signalfd_siginfo si;
    if (read(s->fd, &si, sizeof(si)) != (ssize_t)sizeof(si))
        return 0;
    return (int)si.ssi_signo;
}

/* The signals stay blocked: one that comes later waits, as it would have
 * before the loop asked for it. */
void tern__plat_signals_close(tern__plat_signals *s) { s->fd = -1; }

/* ---- sockets ------------------------------------------------------------ */

int tern__plat_socket(int domain, int type) {
    int fd = socket(domain, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    return fd < 0 ? -errno : fd;
}

int tern__plat_accept(int lfd) {
    int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    return fd < 0 ? -errno : fd;
}

int tern__plat_socket_domain(int fd) {
    int domain;
    socklen_t len = sizeof(domain);
    return getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) < 0 ? -errno : domain;
}

ssize_t tern__plat_send(int fd, const void *buf, size_t len) {
    ssize_t w;
    do
        w = send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (w < 0 && errno == EINTR);
    if (w < 0)
        return errno == EWOULDBLOCK ? -EAGAIN : -errno;
    return w;
}

ssize_t tern__plat_sendmsg(int fd, const struct msghdr *msg) {
    ssize_t w;
    do
        w = sendmsg(fd, msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (w < 0 && errno == EINTR);
    if (w < 0)
        return errno == EWOULDBLOCK ? -EAGAIN : -errno;
    return w;
}

ssize_t tern__plat_sendfile(int out, int in, off_t *off, size_t len) {
    ssize_t w;
    do
        w = sendfile(out, in, off, len);
    while (w < 0 && errno == EINTR);
    if (w < 0)
        return errno == EWOULDBLOCK ? -EAGAIN : -errno;
    return w;
}

/* ---- TCP facts ---------------------------------------------------------- */

long tern__plat_tcp_unacked_bytes(int fd) {
    int q;
    return ioctl(fd, SIOCOUTQ, &q) == 0 ? q : -1;
}

long tern__plat_tcp_unacked_segments(int fd) {
    struct tcp_info ti;
    socklen_t tl = sizeof(ti);
    return getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) < 0 ? -1 : (long)ti.tcpi_unacked;
}

/* ---- files -------------------------------------------------------------- */

int tern__plat_open_root(const char *path) {
    int fd = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
    return fd < 0 ? -errno : fd;
}

/* The kernel resolves the path, so there is no window between a check and
 * the open. RESOLVE_BENEATH also refuses absolute symlinks that point back
 * inside the root (EXDEV): tern__plat_open_checked is for those. */
int tern__plat_open_beneath(int dirfd, const char *path) {
    struct open_how how = {
        /* O_NONBLOCK: opening a FIFO must not wait for a writer (it is
         * refused as not a regular file right after); for regular files
         * it changes nothing, sendfile included. */
        .flags = O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK,
        .resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
    };
    int fd = (int)syscall(SYS_openat2, dirfd, path, &how, sizeof(how));
    return fd < 0 ? -errno : fd;
}

/* Opens without RESOLVE_BENEATH (O_NONBLOCK so a FIFO cannot stall the
 * loop), then asks the kernel where the descriptor lives. */
int tern__plat_open_checked(int dirfd, const char *path, const char *root_path) {
    int fd = openat(dirfd, path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0)
        return -errno;
    char link[64], real[TERN__PATH_MAX];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, real, sizeof(real) - 1);
    size_t rlen = strlen(root_path);
    bool inside = n > 0 && (size_t)n > rlen && memcmp(real, root_path, rlen) == 0 &&
                  (real[rlen] == '/' || (rlen == 1 && root_path[0] == '/'));
    if (!inside) {
        close(fd);
        return -EXDEV;
    }
    return fd;
}

/* ---- errno's words: glibc's own table ----------------------------------- */

#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
const char *tern__plat_errno_text(int e) { return strerrordesc_np(e); }
const char *tern__plat_errno_name(int e) { return strerrorname_np(e); }
#else
/* musl's strerror returns its constant table's strings (an unknown code
 * gets a constant "No error information"); it has no names. */
const char *tern__plat_errno_text(int e) { return strerror(e); }
const char *tern__plat_errno_name(int e) {
    (void)e;
    return NULL;
}
#endif

/* ---- random, CPUs, clocks ----------------------------------------------- */

/* getrandom() blocks only before the kernel's pool is first initialised
 * (early boot), and fails only where it does not exist (ENOSYS, a kernel
 * older than 3.17, or a seccomp filter). */
int tern__plat_random(void *buf, size_t len, bool block) {
    unsigned char *p = buf;
    size_t got = 0;
    while (got < len) {
        ssize_t n = getrandom(p + got, len - got, block ? 0 : GRND_NONBLOCK);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        got += (size_t)n;
    }
    return 0;
}

int tern__plat_affinity_cpus(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) != 0)
        return 0;
    return CPU_COUNT(&set);
}

int64_t tern__plat_wall_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME_COARSE, &ts);
    return ts.tv_sec;
}

int64_t tern__plat_mono_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return ts.tv_sec;
}
