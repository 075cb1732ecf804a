/* Host names resolved by c-ares, driven by the loop.
 *
 * Each resolution has a channel of its own (so that ending one is
 * ares_destroy, and its servers may be the caller's); c-ares says through
 * its socket state callback which sockets to watch (dns_sock), and its
 * timeouts and the caller's deadline share one precise timer. c-ares'
 * answer only records the addresses: the caller hears of them from the
 * loop (resolve_step), outside c-ares' calls, so that it may free or
 * start anything then. */
#include "net/resolve.h"

#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ares.h>

#include "loop/loop.h"

/* One socket c-ares has open, as a loop watcher. */
typedef struct dns_sock {
    tern__io io;
    tern__resolve *q;
    struct dns_sock *next;
} dns_sock;

/* Invariants: chan is live and socks has a watcher for each socket c-ares
 * has open on it, until the resolution ends (resolve_finish or
 * tern__resolve_cancel free the whole struct); timer is armed at c-ares'
 * next timeout or the deadline, whichever is first, or at once when the
 * answer is in; resolved says the answer is in (status, and the n
 * addresses). */
struct tern__resolve {
    tern_loop *loop;
    ares_channel chan;
    dns_sock *socks;
    tern_timer *timer;
    uint64_t deadline;   /* the loop's clock, ms */
    tern__resolve_cb cb;
    void *user;
    int status;
    bool resolved;
    int n;
    socklen_t len[TERN__RESOLVE_MAX];
    struct sockaddr_storage ss[TERN__RESOLVE_MAX];
};

static pthread_once_t ares_once = PTHREAD_ONCE_INIT;
static int ares_init_status;

static void ares_init_once(void) { ares_init_status = ares_library_init(ARES_LIB_INIT_ALL); }

static void dns_io(tern__io *io, uint32_t revents);

/* c-ares opened a socket, changed what it waits for, or is closing it
 * (neither readable nor writable: it closes the descriptor itself). */
static void dns_sock_state(void *data, ares_socket_t fd, int readable, int writable) {
    tern__resolve *q = data;
    dns_sock **link = &q->socks;
    while (*link && (*link)->io.fd != fd)
        link = &(*link)->next;
    dns_sock *s = *link;
    uint32_t ev = (readable ? TERN__IO_IN : 0) | (writable ? TERN__IO_OUT : 0);
    if (ev == 0) {
        if (s) {
            tern__io_set(q->loop, &s->io, 0);
            *link = s->next;
            free(s);
        }
        return;
    }
    if (s == NULL) {
        /* Out of memory: the socket goes unwatched, and the deadline (or
         * c-ares' own timeouts) ends the resolution. */
        if ((s = calloc(1, sizeof(*s))) == NULL)
            return;
        tern__io_init(&s->io, fd, dns_io);
        s->q = q;
        s->next = q->socks;
        q->socks = s;
    }
    tern__io_set(q->loop, &s->io, ev);
}

/* The channel, its watchers and the timer go; then q. */
static void resolve_free(tern__resolve *q) {
    if (q->chan)
        ares_destroy(q->chan);   /* closes its sockets (dns_sock_state); dns_done sees EDESTRUCTION */
    while (q->socks) {
        dns_sock *s = q->socks;
        q->socks = s->next;
        tern__io_set(q->loop, &s->io, 0);
        free(s);
    }
    tern_timer_stop(q->timer);
    free(q);
}

/* The answer, from inside ares_getaddrinfo (a name in /etc/hosts), from
 * ares_process_fd, or from ares_destroy. It only takes the addresses. */
static void dns_done(void *arg, int status, int timeouts, struct ares_addrinfo *res) {
    (void)timeouts;
    tern__resolve *q = arg;
    if (status != ARES_EDESTRUCTION) {
        q->resolved = true;
        q->status = status;
        for (struct ares_addrinfo_node *a = res && status == ARES_SUCCESS ? res->nodes : NULL;
             a && q->n < TERN__RESOLVE_MAX; a = a->ai_next)
            if ((a->ai_family == AF_INET || a->ai_family == AF_INET6) &&
                a->ai_addrlen <= sizeof(q->ss[0])) {
                memcpy(&q->ss[q->n], a->ai_addr, a->ai_addrlen);
                q->len[q->n++] = a->ai_addrlen;
            }
    }
    if (res)
        ares_freeaddrinfo(res);
}

/* Sets the timer for what comes next: now when the answer is in, else
 * c-ares' next timeout or the deadline, whichever is first. 0, or
 * -ENOMEM when the timer could not be armed (then nothing would come). */
static int resolve_arm(tern__resolve *q) {
    uint64_t now = tern_loop_now(q->loop);
    uint64_t ms = q->deadline > now ? q->deadline - now : 0;
    struct timeval tv, *next = q->resolved ? NULL : ares_timeout(q->chan, NULL, &tv);
    if (q->resolved)
        ms = 0;
    else if (next && (uint64_t)next->tv_sec * 1000 + (uint64_t)(next->tv_usec + 999) / 1000 < ms)
        ms = (uint64_t)next->tv_sec * 1000 + (uint64_t)(next->tv_usec + 999) / 1000;
    return tern_timer_again(q->timer, ms);
}

/* From the loop (a watcher or the timer): the answer is in, or the
 * deadline passed, and the caller hears of it; or nothing yet. */
static void resolve_step(tern__resolve *q) {
    int armed = 0;
    if (!q->resolved && tern_loop_now(q->loop) < q->deadline && (armed = resolve_arm(q)) == 0)
        return;   /* not yet */
    /* Copied out: q is freed before the call, which may start another. */
    tern__resolve_cb cb = q->cb;
    void *user = q->user;
    int n = q->n, err = 0;
    socklen_t len[TERN__RESOLVE_MAX];
    struct sockaddr_storage ss[TERN__RESOLVE_MAX];
    memcpy(len, q->len, sizeof(len));
    memcpy(ss, q->ss, sizeof(ss));
    const char *why;
    if (armed < 0) {
        err = armed;   /* no timer to wait with: the caller hears of it now */
        why = "out of memory";
    } else if (!q->resolved) {
        err = -ETIMEDOUT;
        why = "no answer in time";
    } else if (n == 0) {
        err = q->status == ARES_ENOMEM ? -ENOMEM : TERN_ENOHOST;
        why = ares_strerror(q->status == ARES_SUCCESS ? ARES_ENODATA : q->status);
    } else {
        why = "resolved";
    }
    resolve_free(q);
    cb(user, err, why, ss, len, n);
}

static void dns_io(tern__io *io, uint32_t revents) {
    dns_sock *s = tern__container_of(io, dns_sock, io);
    tern__resolve *q = s->q;
    ares_socket_t fd = io->fd;
    bool rd = revents & (TERN__IO_IN | TERN__IO_ERR | TERN__IO_HUP);
    bool wr = revents & (TERN__IO_OUT | TERN__IO_ERR);
    /* May close the socket, and free s. */
    ares_process_fd(q->chan, rd ? fd : ARES_SOCKET_BAD, wr ? fd : ARES_SOCKET_BAD);
    resolve_step(q);
}

static void resolve_timer(tern_timer *t, void *user) {
    (void)t;
    tern__resolve *q = user;
    if (!q->resolved)
        ares_process_fd(q->chan, ARES_SOCKET_BAD, ARES_SOCKET_BAD);   /* c-ares' timeouts */
    resolve_step(q);
}

int tern__resolve_start(tern__resolve **out, tern_loop *loop, const char *host, int port,
                        const char *servers, uint32_t timeout_ms, tern__resolve_cb cb,
                        void *user) {
    pthread_once(&ares_once, ares_init_once);
    if (ares_init_status != ARES_SUCCESS)
        return -ENOMEM;
    tern__resolve *q = calloc(1, sizeof(*q));
    if (q == NULL)
        return -ENOMEM;
    q->loop = loop;
    q->cb = cb;
    q->user = user;
    q->deadline = tern_loop_now(loop) + timeout_ms;
    struct ares_options o = {.sock_state_cb = dns_sock_state, .sock_state_cb_data = q};
    int st = ares_init_options(&q->chan, &o, ARES_OPT_SOCK_STATE_CB);
    if (st != ARES_SUCCESS) {
        q->chan = NULL;
        resolve_free(q);
        return st == ARES_ENOMEM ? -ENOMEM : TERN_ENOHOST;
    }
    int err = servers && ares_set_servers_ports_csv(q->chan, servers) != ARES_SUCCESS ? -EINVAL : 0;
    if (err == 0)
        err = tern_timer_start(loop, &q->timer, timeout_ms, 0, resolve_timer, q);
    if (err < 0) {
        resolve_free(q);
        return err;
    }
    char service[8];
    snprintf(service, sizeof(service), "%d", port);
    struct ares_addrinfo_hints hints = {.ai_flags = ARES_AI_NUMERICSERV, .ai_family = AF_UNSPEC,
                                        .ai_socktype = SOCK_STREAM};
    ares_getaddrinfo(q->chan, host, service, &hints, dns_done, q);
    if ((err = resolve_arm(q)) < 0) {
        resolve_free(q);
        return err;
    }
    *out = q;
    return 0;
}

void tern__resolve_cancel(tern__resolve *q) {
    if (q)
        resolve_free(q);
}
