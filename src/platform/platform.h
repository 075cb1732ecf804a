/* The platform: every call the library makes that differs between
 * systems, behind one interface, so that the layers above use POSIX calls
 * and these alone (libuv's split of src/unix/ and linux.c is the model).
 * One file implements it per platform: linux.c (the default build) or
 * posix.c (the portable build, CMake TERN_PORTABLE: POSIX.1-2008 alone);
 * CMake compiles exactly one. The multiplexer is not here: it is the loop's back end
 * (src/loop/loop_internal.h).
 *
 * Every call returns a negative errno on failure, never -1 with errno,
 * unless it says otherwise; those marked TERN_MUST_CHECK must be looked
 * at. */
#ifndef TERN_PLATFORM_H
#define TERN_PLATFORM_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "tern/loop.h"   /* TERN_MUST_CHECK */

/* ---- wake-up ------------------------------------------------------------
 * A descriptor another thread makes readable: the loop's post queue.
 * Invariant: rfd is watched by the loop; wfd is written by the poster.
 * They are one descriptor where the system has a counter (eventfd) and a
 * pipe's two ends elsewhere. */
typedef struct tern__plat_wake {
    int rfd, wfd;
} tern__plat_wake;

TERN_MUST_CHECK
int tern__plat_wake_open(tern__plat_wake *w);
/* Makes rfd readable (any thread); a wake-up already pending is enough. */
void tern__plat_wake_signal(const tern__plat_wake *w);
/* Makes rfd not readable again (the loop's thread, in rfd's callback). */
void tern__plat_wake_drain(const tern__plat_wake *w);
/* Closes wfd when it is a descriptor of its own: rfd is the loop's to
 * close (tern__io_close), as every watched descriptor. */
void tern__plat_wake_close(tern__plat_wake *w);

/* ---- signals ------------------------------------------------------------
 * Signals as a readable descriptor, read on the loop like any other
 * (signalfd, or a self-pipe written by a handler).
 * Invariant: fd is -1 until the first tern__plat_signals_add, then the
 * descriptor to watch; set holds the signals added. */
typedef struct tern__plat_signals {
    int fd;
    int wfd;       /* the self-pipe's write end; -1 where fd is a signalfd */
    sigset_t set;
} tern__plat_signals;

/* Signal numbers are below this: NSIG where the system says (POSIX does
 * not), else 65, above every system's real-time signals. */
#ifdef NSIG
#define TERN__PLAT_NSIG NSIG
#else
#define TERN__PLAT_NSIG 65
#endif

void tern__plat_signals_init(tern__plat_signals *s);
/* Starts delivering signo through fd (made on the first call). */
TERN_MUST_CHECK
int tern__plat_signals_add(tern__plat_signals *s, int signo);
/* The next signal that came, 0 when none is waiting (fd's callback reads
 * until 0). */
int tern__plat_signals_next(tern__plat_signals *s);
/* Stops delivering to s (its fd is the loop's to close, as the wake-up's). */
void tern__plat_signals_close(tern__plat_signals *s);

/* ---- sockets ------------------------------------------------------------ */
/* socket(), non-blocking and close-on-exec. */
TERN_MUST_CHECK
int tern__plat_socket(int domain, int type);
/* accept() of a waiting connection, non-blocking and close-on-exec,
 * without the peer's address: the descriptor, -EAGAIN, or -errno. */
TERN_MUST_CHECK
int tern__plat_accept(int lfd);
/* The address family of a socket (AF_INET, AF_INET6, AF_UNIX), or -errno. */
TERN_MUST_CHECK
int tern__plat_socket_domain(int fd);
/* send() and sendmsg() that never block and never raise SIGPIPE: bytes
 * taken, -EAGAIN, or -errno (EINTR retried). */
TERN_MUST_CHECK
ssize_t tern__plat_send(int fd, const void *buf, size_t len);
TERN_MUST_CHECK
ssize_t tern__plat_sendmsg(int fd, const struct msghdr *msg);
/* Up to len bytes of file `in` from *off onto socket `out` (advancing
 * *off): the kernel's sendfile where there is one, else read and send. */
TERN_MUST_CHECK
ssize_t tern__plat_sendfile(int out, int in, off_t *off, size_t len);

/* ---- TCP facts ----------------------------------------------------------
 * Both answer -1 where the system cannot say. */
/* Bytes in the socket the peer has not acknowledged (SIOCOUTQ). */
long tern__plat_tcp_unacked_bytes(int fd);
/* Segments sent and not acknowledged (TCP_INFO's unacked). */
long tern__plat_tcp_unacked_segments(int fd);

/* ---- files ---------------------------------------------------------------
 * A directory to open files beneath (static files' root): a descriptor for
 * openat only (O_PATH where there is one). */
TERN_MUST_CHECK
int tern__plat_open_root(const char *path);
/* Opens path (relative) for reading beneath dirfd, with no way out of it:
 * neither ".." nor a symbolic link leads above dirfd. -EXDEV when the
 * system cannot resolve it beneath (an absolute symbolic link: then
 * tern__plat_open_checked may still open it). Non-blocking, so a FIFO
 * cannot stall the loop. */
TERN_MUST_CHECK
int tern__plat_open_beneath(int dirfd, const char *path);
/* Opens path beneath dirfd (the descriptor of root_path, the root's real
 * path) following every link, and keeps the file only if where it lives
 * is under root_path: -EXDEV otherwise. */
TERN_MUST_CHECK
int tern__plat_open_checked(int dirfd, const char *path, const char *root_path);

/* ---- errno's words -------------------------------------------------------
 * The sentence and the name (EPIPE) of an errno value: static strings that
 * never change, NULL where the system gives none. */
const char *tern__plat_errno_text(int e);
const char *tern__plat_errno_name(int e);

/* ---- random, CPUs, clocks ------------------------------------------------ */
/* len bytes from the system's generator. block false: fail with -EAGAIN
 * rather than wait for a generator not yet seeded (early boot). */
TERN_MUST_CHECK
int tern__plat_random(void *buf, size_t len, bool block);
/* The CPUs this process may run on (its affinity mask), 0 when the
 * system cannot say (then the caller counts the online ones). */
int tern__plat_affinity_cpus(void);
/* Whole seconds of the wall clock and of the monotonic clock, read
 * cheaply (a coarse clock where there is one: a log line's rate limit and
 * a Date header need no precision). */
int64_t tern__plat_wall_sec(void);
int64_t tern__plat_mono_sec(void);

#endif
