/* Listeners: TCP (IPv4, IPv6) and Unix sockets, a non-blocking accept loop,
 * a back-off when the process runs out of descriptors, and a reserve of
 * descriptors for the listeners that must answer even then. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "loop/log.h"
#include "net/conn.h"

#define TERN__ACCEPTS_PER_EVENT 64
#define TERN__EMFILE_BACKOFF_MS 100
#define TERN__EMFILE_LOG_MS 1000   /* at most one "Too many open files" line a second */

/* The descriptor reserve.
 *
 * Out of descriptors, every listener of the process would fail to accept,
 * the admin one too: /readyz and /metrics would go dark exactly when the
 * operator needs them. So a guarded listener (the default) takes no
 * descriptor numbered at or above its *line*, limit - reserve - guarded:
 * the kernel hands out the lowest free number, so a connection numbered
 * there means every number below is taken. That connection is parked
 * (one per listener: the "guarded" term of the line leaves room for all
 * of them) and the listener backs off as on EMFILE; the numbers above
 * the line stay for the listeners that may use them
 * (tern_listen_options.use_fd_reserve: the admin listener) and for the
 * process's own files (a log reopened, a static file, a certificate read
 * again). A back-off ends by moving the parked connection to the lowest
 * free number (F_DUPFD): below the line, it is served; else it waits
 * again. A parked client waits as it would in the accept queue, and is
 * the first served. The limit is read again at each back-off, so a
 * program that raises it is seen.
 *
 * A back end that accepts for the listener (io_uring's multishot accept)
 * would take every queued connection up to the limit before the loop saw
 * the first past the line. So near the line a guarded listener asks it
 * for one connection at a time (tern__io_acceptor's one_at_a_time), and
 * sees every number before the kernel hands out the next, as with
 * accept4. "Near" is within the listener's backlog and a margin: the most
 * a multishot may take at once is the accept queue, plus what arrives
 * before the loop has turned it off. Far below the line again (by
 * TERN__AHEAD_SLACK more) it lets the back end accept ahead. */
#define TERN__FD_RESERVE 16
#define TERN__AHEAD_MARGIN 256
#define TERN__AHEAD_SLACK 512

static atomic_int guarded_listeners;   /* open in the process, every loop's */

/* The soft RLIMIT_NOFILE, as an int. */
static int fd_limit(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > INT_MAX)
        return INT_MAX;
    return (int)rl.rlim_cur;
}

/* Invariants: io is registered for TERN__IO_IN except while backing off
 * (out of descriptors), when `backoff` is armed instead, and then *paused
 * (when set) counts this listener once. parked is a connection accepted
 * at or above the line, or -1; it is set only while backing off. */
struct tern__listener {
    tern__io io;
    tern_loop *loop;
    bool tcp;
    bool guarded;     /* kept out of the reserve (not use_fd_reserve) */
    bool multishot;   /* the back end accepts for it (tern__io_acceptor) */
    bool one;         /* ... one connection at a time (near the line) */
    int backlog;      /* listen()'s */
    int port;
    int limit;        /* fd_limit() when the listener started or last backed off */
    int parked;
    tern__accept_fn fn;
    void *user;
    tern_timer *backoff;
    _Atomic uint64_t *paused;
};

/* *l->paused += n: a plain load and store (the loop is its only writer,
 * others only read it), as the server's counters. */
static void paused_add(tern__listener *l, int n) {
    if (l->paused)
        atomic_store_explicit(l->paused,
                              atomic_load_explicit(l->paused, memory_order_relaxed) + (uint64_t)n,
                              memory_order_relaxed);
}

void tern__listener_count_pauses(tern__listener *l, _Atomic uint64_t *paused) {
    l->paused = paused;
}

static int reserve_of(int limit) {
    return limit / 4 < TERN__FD_RESERVE ? limit / 4 : TERN__FD_RESERVE;
}

/* The first descriptor number a guarded listener may not keep. */
static int line_of(const tern__listener *l) {
    return l->limit - reserve_of(l->limit) - atomic_load_explicit(&guarded_listeners,
                                                                  memory_order_relaxed);
}

/* Is a connection numbered fd near the line (or, with slack, not far
 * below it), where a back end must not accept ahead of us? */
static bool near_line(const tern__listener *l, int fd, int slack) {
    return (int64_t)fd + l->backlog + TERN__AHEAD_MARGIN + slack >= line_of(l);
}

/* Sets the listener's interest: accepting (the back end may accept for it,
 * tern__io_acceptor), or not (backing off). */
static int accepting(tern__listener *l, bool on) {
    if (!on)
        return tern__io_set(l->loop, &l->io, 0);
    l->multishot = tern__io_acceptor(l->loop, &l->io, l->one);
    return tern__io_set(l->loop, &l->io, TERN__IO_IN);
}

/* A guarded listener whose back end accepts for it: one at a time near
 * the line, ahead again once far below it. fd is the connection just
 * taken (the kernel hands out the lowest free number, so it says how many
 * are open). */
static void pace(tern__listener *l, int fd) {
    bool one = near_line(l, fd, l->one ? TERN__AHEAD_SLACK : 0);
    if (l->multishot && one != l->one) {
        l->one = one;
        l->multishot = tern__io_acceptor(l->loop, &l->io, one);
    }
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Out of descriptors, every listener of every loop backs off ten times a
 * second: one line a second at most, for the whole process, with the
 * back-offs counted since the line before. */
static _Atomic int64_t emfile_logged_ms;   /* 0: never */
static atomic_uint emfile_count;

static void log_out_of_fds(const tern__listener *l, int e) {
    atomic_fetch_add(&emfile_count, 1);
    int64_t now = now_ms(), last = atomic_load(&emfile_logged_ms);
    if ((last != 0 && now - last < TERN__EMFILE_LOG_MS) ||
        !atomic_compare_exchange_strong(&emfile_logged_ms, &last, now))
        return;
    unsigned n = atomic_exchange(&emfile_count, 0);
    char reserve[96] = "";
    if (l->guarded)
        snprintf(reserve, sizeof(reserve), " (limit %d, the last %d kept in reserve)", l->limit,
                 l->limit - line_of(l));
    tern__log(TERN_LOG_WARN, TERN__LOG_ACCEPT,
              "accept: %s%s: %u time%s since the last line; not accepting for %d ms at a time",
              strerror(e), reserve, n, n == 1 ? "" : "s", TERN__EMFILE_BACKOFF_MS);
}

static void serve_fd(tern__listener *l, int fd) {
    if (l->tcp) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    l->fn(l->user, fd);
}

static void resume_accepting(tern_timer *t, void *user);

/* Out of descriptors (e), or at the line with a connection parked: stop
 * accepting for a moment and keep serving the connections we have. The
 * pending clients wait in the kernel's accept queue meanwhile. */
static void back_off(tern__listener *l, int e) {
    l->limit = fd_limit();
    log_out_of_fds(l, e);
    if (l->backoff == NULL &&
        tern_timer_start(l->loop, &l->backoff, TERN__EMFILE_BACKOFF_MS, 0, resume_accepting,
                         l) == 0) {
        paused_add(l, 1);
        accepting(l, false);
    } else if (l->parked >= 0) {
        /* No timer to come back with (out of memory): served after all. */
        int fd = l->parked;
        l->parked = -1;
        serve_fd(l, fd);
    }
}

static void resume_accepting(tern_timer *t, void *user) {
    tern__listener *l = user;
    tern_timer_stop(t);
    l->backoff = NULL;
    paused_add(l, -1);
    l->limit = fd_limit();
    int fd = -1;
    if (l->parked >= 0) {
        /* The lowest free number: below the line once something closed. */
        fd = fcntl(l->parked, F_DUPFD_CLOEXEC, 0);
        if (fd < 0 || fd >= line_of(l)) {
            if (fd >= 0)
                close(fd);
            back_off(l, EMFILE);
            return;
        }
        close(l->parked);
        l->parked = -1;
    }
    accepting(l, true);
    if (fd >= 0)
        serve_fd(l, fd);
}

static void on_accept(tern__io *io, uint32_t revents) {
    tern__listener *l = tern__container_of(io, tern__listener, io);
    for (int i = 0; i < TERN__ACCEPTS_PER_EVENT; i++) {
        int fd = tern__io_accept(l->loop, io);
        if (fd < 0) {
            int e = -fd;
            if (e == EINTR || e == ECONNABORTED)
                continue;
            if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM)
                back_off(l, e);
            else if (e != EAGAIN)
                tern__log(TERN_LOG_ERROR, TERN__LOG_LISTEN, "accept: %s", strerror(e));
            return;
        }
        if (l->guarded && fd >= line_of(l)) {
            l->parked = fd;
            back_off(l, EMFILE);
            return;
        }
        if (l->guarded)
            pace(l, fd);
        serve_fd(l, fd);
    }
}

static int start(tern_loop *loop, int fd, bool tcp, const tern_listen_options *opt,
                 tern__accept_fn fn, void *user, tern__listener **out) {
    int backlog = opt && opt->backlog ? opt->backlog : 4096;
    /* Set on the listening socket, inherited by every accepted one. */
    if (opt && opt->sndbuf > 0 &&
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &opt->sndbuf, sizeof(opt->sndbuf)) < 0) {
        int err = -errno;
        close(fd);
        return err;
    }
    if (listen(fd, backlog) < 0) {
        int err = -errno;
        close(fd);
        return err;
    }
    tern__listener *l = calloc(1, sizeof(*l));
    if (l == NULL) {
        close(fd);
        return -ENOMEM;
    }
    l->loop = loop;
    l->tcp = tcp;
    l->guarded = !(opt && opt->use_fd_reserve);
    l->limit = fd_limit();
    l->backlog = backlog;
    /* The listening socket's own number tells how many are open. */
    l->one = l->guarded && near_line(l, fd, 0);
    l->parked = -1;
    l->fn = fn;
    l->user = user;
    tern__io_init(&l->io, fd, on_accept);
    if (tcp) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof(ss);
        getsockname(fd, (struct sockaddr *)&ss, &len);
        l->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                 : ((struct sockaddr_in *)&ss)->sin_port);
    }
    int err = accepting(l, true);
    if (err < 0) {
        close(fd);
        free(l);
        return err;
    }
    if (l->guarded)
        atomic_fetch_add(&guarded_listeners, 1);
    *out = l;
    return 0;
}

/* A socket of ai's family bound to its address, with SO_REUSEADDR (so a
 * port whose last connections are in TIME_WAIT can be bound again) and,
 * when reuseport, SO_REUSEPORT; or a negative errno. */
static int bound_socket(const struct addrinfo *ai, const tern_listen_options *opt, bool reuseport) {
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (reuseport)
        setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
    if (ai->ai_family == AF_INET6) {
        int v6only = opt && opt->ipv6_only;
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof(v6only));
    }
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
        int err = -errno;
        close(fd);
        return err;
    }
    return fd;
}

/* Is ai's address free for a socket of our own? With SO_REUSEPORT any
 * process of the same user may bind a port that is already listening and
 * silently take a share of its connections (a second `tern serve` started
 * by mistake). A probe bound without SO_REUSEPORT fails with EADDRINUSE
 * exactly when a socket listens there (TIME_WAIT does not count: it has
 * SO_REUSEADDR); it is closed at once. Returns 0 or the bind's error. */
static int probe_free(const struct addrinfo *ai, const tern_listen_options *opt) {
    int fd = bound_socket(ai, opt, false);
    if (fd < 0)
        return fd;
    close(fd);
    return 0;
}

int tern__listener_tcp(tern_loop *loop, const char *host, int port, const tern_listen_options *opt,
                       bool exclusive, tern__accept_fn fn, void *user, tern__listener **out) {
    if (port < 0 || port > 65535)
        return -EINVAL;
    char service[8];
    snprintf(service, sizeof(service), "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res;
    int gai = getaddrinfo(host && *host ? host : NULL, service, &hints, &res);
    if (gai != 0) {
        /* Not a bind error: the name did not resolve. */
        if (gai == EAI_MEMORY)
            return -ENOMEM;
        if (gai == EAI_SYSTEM)
            return errno ? -errno : TERN_ENOHOST;
        return TERN_ENOHOST;
    }
    bool reuseport = opt && opt->reuseport;
    int err = -EADDRNOTAVAIL;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        /* Port 0 needs no probe: the kernel picks a port nobody holds. */
        if (reuseport && exclusive && port != 0 && (err = probe_free(ai, opt)) < 0)
            continue;   /* as a failed bind */
        int fd = bound_socket(ai, opt, reuseport);
        if (fd < 0) {
            err = fd;
            continue;
        }
        err = start(loop, fd, true, opt, fn, user, out);
        break;
    }
    freeaddrinfo(res);
    return err;
}

/* Whether a server listens on sun: a connection is accepted, or waits
 * (EAGAIN: its queue is full). A stale file refuses it (ECONNREFUSED). */
static bool unix_listening(const struct sockaddr_un *sun) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return false;
    bool live = connect(fd, (const struct sockaddr *)sun, sizeof(*sun)) == 0 || errno == EAGAIN;
    close(fd);
    return live;
}

int tern__listener_unix(tern_loop *loop, const char *path, const tern_listen_options *opt,
                        tern__accept_fn fn, void *user, tern__listener **out) {
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    if (path == NULL || *path == '\0')
        return -EINVAL;
    if (strlen(path) >= sizeof(sun.sun_path))
        return -ENAMETOOLONG;
    strcpy(sun.sun_path, path);
    /* A socket file left by a previous run would make bind fail; remove
     * it, but never anything that is not a socket, nor one a server still
     * listens on (a second process would take every new connection from
     * it), unless reuseport asks for that (a hand-over). */
    struct stat st;
    if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode)) {
        if (!(opt && opt->reuseport) && unix_listening(&sun))
            return -EADDRINUSE;
        unlink(path);
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    if (bind(fd, (struct sockaddr *)&sun, sizeof(sun)) < 0) {
        int err = -errno;
        close(fd);
        return err;
    }
    return start(loop, fd, false, opt, fn, user, out);
}

int tern__listener_dup(tern_loop *loop, const tern__listener *l, const tern_listen_options *opt,
                       tern__accept_fn fn, void *user, tern__listener **out) {
    int fd = fcntl(l->io.fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    /* listen() again on a listening socket only sets its backlog. */
    int err = start(loop, fd, l->tcp, opt, fn, user, out);
    if (err == 0)
        (*out)->port = l->port;
    return err;
}

int tern__listener_fd(tern_loop *loop, int fd, const tern_listen_options *opt,
                      tern__accept_fn fn, void *user, tern__listener **out) {
    int type = 0, on = 0, domain = 0;
    socklen_t len = sizeof(type);
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) < 0)
        return -errno;   /* EBADF, ENOTSOCK */
    len = sizeof(on);
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &on, &len) < 0)
        return -errno;
    len = sizeof(domain);
    if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) < 0)
        return -errno;
    if (type != SOCK_STREAM || !on ||
        (domain != AF_INET && domain != AF_INET6 && domain != AF_UNIX))
        return -EINVAL;
    /* Ours is a duplicate: the caller's descriptor stays the caller's. */
    int dup = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dup < 0)
        return -errno;
    int flags = fcntl(dup, F_GETFL);
    if (flags < 0 || fcntl(dup, F_SETFL, flags | O_NONBLOCK) < 0) {
        int err = -errno;
        close(dup);
        return err;
    }
    return start(loop, dup, domain != AF_UNIX, opt, fn, user, out);
}

int tern__listener_port(const tern__listener *l) { return l->port; }

void tern__listener_close(tern__listener *l) {
    if (l == NULL)
        return;
    if (l->backoff) {
        tern_timer_stop(l->backoff);
        paused_add(l, -1);
    }
    if (l->parked >= 0)
        close(l->parked);   /* as a client left in the accept queue: a reset */
    if (l->guarded)
        atomic_fetch_sub(&guarded_listeners, 1);
    tern__io_close(l->loop, &l->io);   /* after what the back end holds of it */
    free(l);
}
