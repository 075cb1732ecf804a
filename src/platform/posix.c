/* platform.h on POSIX.1-2008 alone: the portable build's platform file
 * (CMake TERN_PORTABLE), compiled with _POSIX_C_SOURCE=200809L and no
 * system's own header. What Linux does in one call takes two or three
 * here: a pipe for the wake-up, a self-pipe written by a signal handler,
 * accept or socket then fcntl, read then send for files, an open walked
 * one name at a time for the static root, /dev/urandom for random bytes.
 * The TCP facts have no POSIX form: both answer "cannot say". */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "platform/platform.h"

#define TERN__PATH_MAX 4096
#define TERN__FILE_CHUNK (64 * 1024)   /* bytes of a file read per send */

/* Sends raise no SIGPIPE: MSG_NOSIGNAL where the system has it (POSIX.1-
 * 2008 names it), else the socket's SO_NOSIGPIPE (set at its creation). */
#ifdef MSG_NOSIGNAL
#define TERN__SEND_FLAGS MSG_NOSIGNAL
#else
#define TERN__SEND_FLAGS 0
#endif

/* Makes fd non-blocking and close-on-exec (and, where sends cannot say
 * MSG_NOSIGNAL, a socket that raises no SIGPIPE): 0 or -errno. */
static int set_flags(int fd, bool is_socket) {
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) < 0)
        return -errno;
#if !defined(MSG_NOSIGNAL) && defined(SO_NOSIGPIPE)
    int one = 1;
    if (is_socket)
        setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof(one));
#else
    (void)is_socket;
#endif
    return 0;
}

/* A pipe, both ends non-blocking and close-on-exec. */
static int open_pipe(int fds[2]) {
    if (pipe(fds) < 0)
        return -errno;
    int err = set_flags(fds[0], false);
    if (err == 0)
        err = set_flags(fds[1], false);
    if (err < 0) {
        close(fds[0]);
        close(fds[1]);
    }
    return err;
}

/* ---- wake-up: a pipe ----------------------------------------------------- */

int tern__plat_wake_open(tern__plat_wake *w) {
    int fds[2];
    int err = open_pipe(fds);
    if (err < 0)
        return err;
    w->rfd = fds[0];
    w->wfd = fds[1];
    return 0;
}

void tern__plat_wake_signal(const tern__plat_wake *w) {
    char one = 1;
    ssize_t r;
    do
        r = write(w->wfd, &one, 1);
    while (r < 0 && errno == EINTR);
    /* EAGAIN means the pipe is full of wake-ups: the loop will wake. */
}

void tern__plat_wake_drain(const tern__plat_wake *w) {
    char buf[64];
    ssize_t r;
    do
        r = read(w->rfd, buf, sizeof(buf));
    while (r > 0 || (r < 0 && errno == EINTR));
}

void tern__plat_wake_close(tern__plat_wake *w) {
    if (w->wfd >= 0)
        close(w->wfd);
    w->wfd = -1;
}

/* ---- signals: a self-pipe ------------------------------------------------
 * The handler writes the signal's number into the pipe of the loop that
 * asked for it; the loop reads the numbers. Signals are process-wide, so
 * the pipes are found in a process-wide table, read by the handler on
 * whichever thread the signal lands. */

/* Per signal number: the write end of its loop's pipe, plus one (0: none).
 * Lock-free atomics, the one kind of object a handler may read. */
static _Atomic int signal_pipe[TERN__PLAT_NSIG];

static void on_signal(int signo) {
    int saved = errno;
    int fd = atomic_load(&signal_pipe[signo]) - 1;
    if (fd >= 0) {
        unsigned char b = (unsigned char)signo;
        ssize_t w = write(fd, &b, 1);
        (void)w;   /* a full pipe already holds signals to read */
    }
    errno = saved;
}

void tern__plat_signals_init(tern__plat_signals *s) {
    s->fd = -1;
    s->wfd = -1;
    sigemptyset(&s->set);
}

int tern__plat_signals_add(tern__plat_signals *s, int signo) {
    if (s->fd < 0) {
        int fds[2];
        int err = open_pipe(fds);
        if (err < 0)
            return err;
        s->fd = fds[0];
        s->wfd = fds[1];
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;   /* the other threads' calls go on */
    sigemptyset(&sa.sa_mask);
    atomic_store(&signal_pipe[signo], s->wfd + 1);
    if (sigaction(signo, &sa, NULL) < 0)
        return -errno;
    sigaddset(&s->set, signo);
    /* The signal may have been blocked for signalfd's sake by someone
     * else; here a handler must be free to run on this thread. */
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, signo);
    int err = pthread_sigmask(SIG_UNBLOCK, &one, NULL);
    return -err;
}

int tern__plat_signals_next(tern__plat_signals *s) {
    unsigned char b;
    ssize_t r;
    do
        r = read(s->fd, &b, 1);
    while (r < 0 && errno == EINTR);
    return r == 1 ? (int)b : 0;
}

/* The handler stays installed and writes nowhere: a signal that comes
 * later is dropped, as Linux's build leaves it blocked. */
void tern__plat_signals_close(tern__plat_signals *s) {
    for (int signo = 1; signo < TERN__PLAT_NSIG; signo++) {
        int mine = s->wfd + 1;
        atomic_compare_exchange_strong(&signal_pipe[signo], &mine, 0);
    }
    if (s->wfd >= 0)
        close(s->wfd);
    s->fd = s->wfd = -1;
}

/* ---- sockets ------------------------------------------------------------ */

int tern__plat_socket(int domain, int type) {
    int fd = socket(domain, type, 0);
    if (fd < 0)
        return -errno;
    int err = set_flags(fd, true);
    if (err < 0) {
        close(fd);
        return err;
    }
    return fd;
}

int tern__plat_accept(int lfd) {
    int fd = accept(lfd, NULL, NULL);
    if (fd < 0)
        return errno == EWOULDBLOCK ? -EAGAIN : -errno;
    int err = set_flags(fd, true);
    if (err < 0) {
        close(fd);
        return err;
    }
    return fd;
}

int tern__plat_socket_domain(int fd) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    if (getsockname(fd, (struct sockaddr *)&ss, &len) < 0)
        return -errno;
    return ss.ss_family;
}

ssize_t tern__plat_send(int fd, const void *buf, size_t len) {
    ssize_t w;
    do
        w = send(fd, buf, len, TERN__SEND_FLAGS);
    while (w < 0 && errno == EINTR);
    if (w < 0)
        return errno == EWOULDBLOCK ? -EAGAIN : -errno;
    return w;
}

ssize_t tern__plat_sendmsg(int fd, const struct msghdr *msg) {
    ssize_t w;
    do
        w = sendmsg(fd, msg, TERN__SEND_FLAGS);
    while (w < 0 && errno == EINTR);
    if (w < 0)
        return errno == EWOULDBLOCK ? -EAGAIN : -errno;
    return w;
}

/* A chunk read at *off and sent; *off moves by what the socket took, so
 * the rest is read again on the next call (a page-cache read, cheap next
 * to a send). */
ssize_t tern__plat_sendfile(int out, int in, off_t *off, size_t len) {
    char buf[TERN__FILE_CHUNK];
    ssize_t n;
    do
        n = pread(in, buf, len < sizeof(buf) ? len : sizeof(buf), *off);
    while (n < 0 && errno == EINTR);
    if (n <= 0)
        return n < 0 ? -errno : 0;
    ssize_t w = tern__plat_send(out, buf, (size_t)n);
    if (w > 0)
        *off += w;
    return w;
}

/* ---- TCP facts: POSIX has none ------------------------------------------ */

long tern__plat_tcp_unacked_bytes(int fd) {
    (void)fd;
    return -1;
}

long tern__plat_tcp_unacked_segments(int fd) {
    (void)fd;
    return -1;
}

/* ---- files: one name at a time ------------------------------------------ */

int tern__plat_open_root(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    return fd < 0 ? -errno : fd;
}

/* Opens path beneath dirfd one name at a time, following no symbolic
 * link (O_NOFOLLOW at every step) and refusing "..": what is opened is
 * beneath dirfd. A link or a ".." gives -EXDEV, for the caller's
 * tern__plat_open_checked. */
static int walk(int dirfd, const char *path) {
    char buf[TERN__PATH_MAX];
    if (snprintf(buf, sizeof(buf), "%s", path) >= (int)sizeof(buf))
        return -ENAMETOOLONG;
    int cur = dirfd;
    char *save = NULL;
    char *name = strtok_r(buf, "/", &save);
    if (name == NULL)
        name = ".";
    for (;;) {
        char *next = strtok_r(NULL, "/", &save);
        if (strcmp(name, "..") == 0) {
            if (cur != dirfd)
                close(cur);
            return -EXDEV;
        }
        int flags = O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW;
        /* The last name: O_NONBLOCK, so opening a FIFO cannot wait for a
         * writer (it is refused as not a regular file right after). */
        flags |= next ? O_DIRECTORY : O_NONBLOCK;
        int fd = openat(cur, name, flags);
        int err = fd < 0 ? errno : 0;
        if (cur != dirfd)
            close(cur);
        if (fd < 0)   /* a link refused by O_NOFOLLOW: ELOOP (EMLINK on some) */
            return err == ELOOP || err == EMLINK ? -EXDEV : -err;
        if (next == NULL)
            return fd;
        cur = fd;
        name = next;
    }
}

int tern__plat_open_beneath(int dirfd, const char *path) { return walk(dirfd, path); }

/* Where the path leads, links and ".." resolved by realpath(); kept only
 * if that lies under root_path, and then opened by the walk, which
 * follows no link: a link changed in between is refused, never
 * followed. */
int tern__plat_open_checked(int dirfd, const char *path, const char *root_path) {
    char joined[TERN__PATH_MAX];
    if (snprintf(joined, sizeof(joined), "%s/%s", root_path, path) >= (int)sizeof(joined))
        return -ENAMETOOLONG;
    char *real = realpath(joined, NULL);
    if (real == NULL)
        return -errno;
    size_t rlen = strlen(root_path);
    bool root_is_slash = rlen == 1 && root_path[0] == '/';
    bool inside = strlen(real) > rlen && memcmp(real, root_path, rlen) == 0 &&
                  (real[rlen] == '/' || root_is_slash);
    int fd = inside ? walk(dirfd, real + (root_is_slash ? 1 : rlen + 1)) : -EXDEV;
    free(real);
    return fd;
}

/* ---- errno's words: POSIX's codes ---------------------------------------
 * The names of the codes POSIX.1-2008 defines; the sentences are the C
 * library's strerror() of those, which every C library keeps in a
 * constant table (only unknown codes are written into a buffer). */

#define E(code) {code, #code}
static const struct {
    int code;
    const char *name;
} errno_names[] = {
    E(E2BIG), E(EACCES), E(EADDRINUSE), E(EADDRNOTAVAIL), E(EAFNOSUPPORT), E(EAGAIN),
    E(EALREADY), E(EBADF), E(EBADMSG), E(EBUSY), E(ECANCELED), E(ECHILD), E(ECONNABORTED),
    E(ECONNREFUSED), E(ECONNRESET), E(EDEADLK), E(EDESTADDRREQ), E(EDOM), E(EDQUOT),
    E(EEXIST), E(EFAULT), E(EFBIG), E(EHOSTUNREACH), E(EIDRM), E(EILSEQ), E(EINPROGRESS),
    E(EINTR), E(EINVAL), E(EIO), E(EISCONN), E(EISDIR), E(ELOOP), E(EMFILE), E(EMLINK),
    E(EMSGSIZE), E(EMULTIHOP), E(ENAMETOOLONG), E(ENETDOWN), E(ENETRESET), E(ENETUNREACH),
    E(ENFILE), E(ENOBUFS), E(ENODEV), E(ENOENT), E(ENOEXEC), E(ENOLCK), E(ENOLINK),
    E(ENOMEM), E(ENOMSG), E(ENOPROTOOPT), E(ENOSPC), E(ENOSYS), E(ENOTCONN), E(ENOTDIR),
    E(ENOTEMPTY), E(ENOTRECOVERABLE), E(ENOTSOCK), E(ENOTSUP), E(ENOTTY), E(ENXIO),
    E(EOVERFLOW), E(EOWNERDEAD), E(EPERM), E(EPIPE), E(EPROTO), E(EPROTONOSUPPORT),
    E(EPROTOTYPE), E(ERANGE), E(EROFS), E(ESPIPE), E(ESRCH), E(ESTALE), E(ETIMEDOUT),
    E(ETXTBSY), E(EXDEV),
};
#undef E

/* The first name of a code (EAGAIN before EWOULDBLOCK, ENOTSUP before
 * EOPNOTSUPP, where a system gives both one value). */
const char *tern__plat_errno_name(int e) {
    for (size_t i = 0; i < sizeof(errno_names) / sizeof(errno_names[0]); i++)
        if (errno_names[i].code == e)
            return errno_names[i].name;
    return NULL;
}

const char *tern__plat_errno_text(int e) {
    return tern__plat_errno_name(e) ? strerror(e) : NULL;
}

/* ---- random, CPUs, clocks ----------------------------------------------- */

/* /dev/urandom never blocks; block is moot here. */
int tern__plat_random(void *buf, size_t len, bool block) {
    (void)block;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    unsigned char *p = buf;
    size_t got = 0;
    int err = 0;
    while (got < len) {
        ssize_t n = read(fd, p + got, len - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            err = n < 0 ? -errno : -EIO;
            break;
        }
        got += (size_t)n;
    }
    close(fd);
    return err;
}

/* POSIX has no affinity mask: the caller counts the online CPUs. */
int tern__plat_affinity_cpus(void) { return 0; }

int64_t tern__plat_wall_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec;
}

int64_t tern__plat_mono_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec;
}
