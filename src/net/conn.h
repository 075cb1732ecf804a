/* Connections and listeners: the byte layer under http and ws.
 *
 * A connection reads into the loop's shared read buffer and hands the
 * bytes to its protocol; only what the protocol leaves unconsumed is copied
 * into the connection (conn->in). Writes go to the loop's cork buffer and
 * are flushed with one send() when another connection starts writing or
 * the batch of events ends; what the kernel does not take goes to the
 * connection's backlog (conn->out) and TERN__IO_OUT is armed until it drains. */
#ifndef TERN_NET_CONN_H
#define TERN_NET_CONN_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "loop/loop.h"
#include "tern/net.h"

typedef struct tern__conn tern__conn;

/* The byte I/O under a connection: plain TCP, or TLS (net/tls_openssl.c). The
 * protocols above never see which; net calls only these for the socket's
 * bytes. Every call is non-blocking. */
typedef struct tern__transport_ops {
    /* Reads into buf: bytes (> 0), 0 at the peer's end, -EAGAIN when there
     * is nothing now, or another negative errno (the connection is broken). */
    ssize_t (*recv)(tern__conn *c, char *buf, size_t len);
    /* Writes iov: bytes taken (>= 0, fewer than asked when the kernel is
     * full), -EAGAIN when none, or another negative errno. A retry after a
     * short write passes the same bytes first (TLS needs it). */
    ssize_t (*send)(tern__conn *c, const struct iovec *iov, int iovcnt);
    /* Sends up to len bytes of file fd from *off, advancing it: as send. */
    ssize_t (*send_file)(tern__conn *c, int fd, off_t *off, size_t len);
    /* Ends our side once everything is out (TLS: close_notify first). */
    int (*shutdown)(tern__conn *c);
    /* Input taken from the socket but not yet handed over (TLS records
     * decrypted ahead): the socket may be empty, so no readiness event
     * will come for it; net re-feeds such a connection at the batch end. */
    bool (*pending)(const tern__conn *c);
    /* The connection is closed (or was never started): free the state. */
    void (*release)(tern__conn *c);
    /* The host name the client asked for in its TLS handshake (SNI), or
     * NULL (plain TCP, or none given). */
    const char *(*server_name)(const tern__conn *c);
    /* The transport keeps what send takes until the loop's batch end and
     * sends it as one (the stream transport: the back end's send of this
     * iteration), so net writes to it directly: its cork would only copy
     * the bytes once more. */
    bool coalesces;
    /* Optional: the bytes the transport holds in a buffer of its own (the
     * stream transport: the back end's receive buffer), all handed over
     * without a copy, writable and valid during this read's callback; NULL
     * when it holds none that way (then recv). */
    char *(*take)(tern__conn *c, size_t *len);
    /* Optional: how many bytes a read would return now without waiting,
     * when the transport holds them itself (the stream transport). */
    size_t (*held)(const tern__conn *c);
    /* Optional: how many of the bytes send took the transport still holds
     * itself, not yet in the socket (the stream transport: the back end's
     * send in flight), for the send clock's view of the peer. */
    size_t (*unsent)(const tern__conn *c);
    /* Optional, for a carried connection (tern__conn_start_carried): c is
     * the struct the connection now lives in (tern__conn_move), which the
     * carrier reports readiness to from now on. */
    void (*moved)(tern__conn *c);
    /* Optional, for a carried connection: the connection that carries it,
     * whose peer and TLS facts are c's. */
    const tern__conn *(*carrier)(const tern__conn *c);
} tern__transport_ops;

/* A connection's transport: plain connections share one stateless
 * instance; a TLS connection has its own, which begins with this. */
typedef struct tern__transport {
    const tern__transport_ops *ops;
} tern__transport;

extern tern__transport tern__plain_transport;    /* net/plain.c: readiness, then recv/send */
extern tern__transport tern__stream_transport;   /* net/stream.c: the back end's completions */

/* What a protocol (http, ws) plugs into a connection. */
typedef struct tern__conn_proto {
    /* Bytes arrived: data[0..len) is writable and valid only during the
     * call. Returns how many were consumed; the rest is kept and handed
     * again, in front of new bytes, at the next call. May close c. */
    size_t (*on_data)(tern__conn *c, char *data, size_t len);
    /* The peer shut its side (read returned 0). */
    void (*on_eof)(tern__conn *c);
    /* The backlog was emptied (only after a send returned BUFFERED). */
    void (*on_drain)(tern__conn *c);
    /* The connection's wheel timeout fired. */
    void (*on_timeout)(tern__conn *c);
    /* The owner is shutting down: close now if idle, else finish what is
     * in flight and close then. */
    void (*on_shutdown)(tern__conn *c);
    /* The connection is gone (closed by us, reset, or error): release the
     * protocol's state. No sends from here on. Called exactly once. The
     * struct itself is freed by net after the current batch. err is the
     * first error the connection met, though the close came later (a
     * failed send closes at the batch end): -ECONNRESET for the peer's
     * reset, a send's own code (-EPIPE or -ECONNRESET, as the kernel
     * said), -ETIMEDOUT, -EPROTO or -EKEYREJECTED for TLS; 0 for a close
     * that was asked for. tern__conn_error(c) says the same. */
    void (*on_close)(tern__conn *c, int err);
    /* Optional. The peer shut its side while reading was paused (bytes it
     * sent before may still be unread): net has stopped watching for it,
     * and reads them, then the EOF, once resumed. */
    void (*on_hangup)(tern__conn *c);
    /* Optional. Runs at the end of the batch after tern__conn_defer(), even
     * if the connection was closed meanwhile (the struct is still there):
     * where a protocol tells its user what it decided inside a user's call
     * (callbacks never run from inside the user's own calls). */
    void (*on_deferred)(tern__conn *c);
    /* How long a send may make no progress (ms; 0: no limit): the clock
     * that runs while bytes are leaving and nothing else watches. */
    uint32_t (*send_timeout)(const tern__conn *c);
    /* Outbound connections only (tern__conn_connect): the connection is
     * established; reading starts now. A failed connect is on_close with
     * the error (-ECONNREFUSED, -ETIMEDOUT from the protocol's timeout...). */
    void (*on_connect)(tern__conn *c);
    /* Optional. The struct's memory, at the batch end after on_close
     * (c->in already freed): the protocol gives it back, now or later
     * (ws keeps a connection its user still holds a reference to). Net
     * calls free(c) when this is NULL. Net never touches c afterwards. */
    void (*on_free)(tern__conn *c);
} tern__conn_proto;

/* The send clock's record of a backlog or of a file being sent. stamp is
 * the loop time (ms) of the last progress: the kernel took bytes of it
 * (or it was made), or the peer acknowledged bytes the kernel held; the
 * send clock counts from there. unacked is what the peer had not
 * acknowledged (in the socket, or still in the transport) when the clock
 * last looked (at looked, every quarter of the timeout while it runs), -1
 * when unknown or the system cannot say; taken counts
 * what went to the transport since, so that unacked + taken - (what is
 * unacknowledged now) is what the peer acknowledged in between. Why: a
 * send buffer of megabytes drains at the reader's pace but frees room
 * for more only in large steps, so a steady slow reader may leave the
 * kernel taking nothing for longer than the send timeout. */
typedef struct tern__send_clock {
    uint64_t stamp;
    long unacked;
    size_t taken;     /* bytes the transport took since unacked was read */
    uint64_t looked;  /* loop time (ms) unacked was read */
} tern__send_clock;

/* A growable byte buffer with a read offset: data[off..len) is live.
 * For a backlog, clock is its send clock (unused for other buffers). */
typedef struct tern__buf {
    size_t off, len, cap;
    tern__send_clock clock;
    char data[];
} tern__buf;

/* The file part of a response sent with sendfile(), after the backlog;
 * clock as in tern__buf. */
typedef struct tern__sendfile {
    int fd;
    off_t off;
    size_t left;
    tern__send_clock clock;
} tern__sendfile;

enum {
    TERN__CONN_CLOSED = 1u << 0,       /* fd closed; struct waits for the batch end */
    TERN__CONN_PAUSED = 1u << 1,       /* the protocol asked not to read */
    TERN__CONN_FLUSH_CLOSE = 1u << 2,  /* close once the backlog is flushed */
    TERN__CONN_LINGER = 1u << 3,       /* write side shut; reading to EOF before close */
    TERN__CONN_PENDING = 1u << 4,      /* on the loop's re-feed list */
    TERN__CONN_EOF = 1u << 5,          /* read returned 0 */
    TERN__CONN_RDHUP = 1u << 6,        /* the peer's FIN was seen while paused; not watched now */
    TERN__CONN_DEFERRED = 1u << 7,     /* proto->on_deferred is due at the batch end */
    TERN__CONN_SEND_CLOCK = 1u << 8,   /* the timeout is net's send clock, not the protocol's */
    /* The transport's read must write before it can go on (a TLS
     * handshake message the kernel did not take): TERN__IO_OUT is armed for it. */
    TERN__CONN_RECV_WANTS_OUT = 1u << 10,
    /* The transport's write must read first (TLS): the backlog is retried
     * after the next read rather than on TERN__IO_OUT. */
    TERN__CONN_SEND_WANTS_IN = 1u << 11,
    /* An outbound connect is in flight: only TERN__IO_OUT is watched, and its
     * event ends the connect (proto->on_connect, or on_close on error). */
    TERN__CONN_CONNECTING = 1u << 12,
};

/* Invariants:
 * - every connection is watched for the peer's reset (its fd stays
 *   registered: a paused one still asks for TERN__IO_RDHUP until the FIN
 *   is seen; a carried one, io.fd -1, is closed by its carrier on the
 *   stream's reset),
 *   or has its timeout armed (protocol clock, or the send clock while a
 *   backlog is leaving and the protocol armed none).
 * - io.fd is open until TERN__CONN_CLOSED is set; after that nothing but
 *   net touches the struct, and net frees it at the end of the batch.
 * - in holds only bytes the protocol has not consumed; NULL when none.
 * - out holds bytes the kernel has not taken, in order, before anything
 *   corked later for this connection; NULL when empty. TERN__IO_OUT is in
 *   io.events exactly while out or file is non-empty.
 * - the connection is on its owner's list (list_next/prev) until closed;
 *   only then is next_free, which shares their room, used. */
struct tern__conn {
    tern__io io;
    uint16_t flags;
    /* The owner's own 16 bits, kept through tern__conn_move and never
     * read by net (http: the connection's slot in the per-address count,
     * 0 for none). */
    uint16_t owner_tag;
    /* One word, two uses, so that tern__conn stays 128 bytes (tern_ws
     * 168): while the connection may send, out_limit is its backlog's
     * hard limit in bytes (0: none); once it has failed or closed
     * (TERN__CONN_FAILED, TERN__CONN_CLOSED: nothing is sent again) err
     * is the first error it met, the one on_close gets. Written through
     * tern__conn_set_out_limit, which leaves err alone. */
    union {
        uint32_t out_limit;
        int32_t err;
    };
    tern_loop *loop;
    const tern__conn_proto *proto;
    tern__transport *tp;               /* &tern__plain_transport, or a TLS connection's */
    tern__wheel_entry timeout;
    tern__buf *in;
    tern__buf *out;
    tern__sendfile *file;
    tern__conn *pending_next;          /* on the loop's re-feed list */
    struct tern__conn_list *list;      /* the owner's list (server), or NULL; kept once closed */
    union {
        struct {
            tern__conn *list_next, *list_prev;   /* while on the owner's list */
        };
        tern__conn *next_free;         /* once closed (off the list): the loop's free list */
    };
};

/* An intrusive list of connections, for the owner (a server) to walk. */
typedef struct tern__conn_list {
    tern__conn *head;
    size_t count;
} tern__conn_list;

/* Takes a connected, non-blocking socket. c is the protocol's own struct
 * (which begins with, or embeds, a tern__conn) and is freed with free() at
 * the batch end after on_close (or handed to proto->on_free). */
TERN_MUST_CHECK
int tern__conn_start(tern_loop *loop, tern__conn *c, int fd, const tern__conn_proto *proto,
                     tern__conn_list *list);

/* Starts a connection with no descriptor of its own: a stream carried by
 * another connection (an HTTP/2 stream), whose transport tp moves the
 * stream's bytes. Its watcher (io.fd -1) is never the back end's: the
 * carrier reports readiness with tern__conn_ready, and everything else
 * (cork, backlog, pause, clocks, end and close, tern__conn_move) is as
 * for a socket's. The send clock cannot see a peer's acknowledgements
 * and counts only the transport taking bytes. */
TERN_MUST_CHECK
int tern__conn_start_carried(tern_loop *loop, tern__conn *c, tern__transport *tp,
                             const tern__conn_proto *proto, tern__conn_list *list);

/* For the carrier of c: the stream can be read (TERN__IO_IN: the
 * transport holds bytes, or the end) or written (TERN__IO_OUT: the
 * transport takes bytes again). Acted on only as far as c asks for it
 * (io.events: not read while paused); runs the protocol's callbacks, so
 * never from inside a user's call. */
void tern__conn_ready(tern__conn *c, uint32_t revents);

/* Starts an outbound connection to addr (TCP v4/v6 or Unix): a
 * non-blocking socket and connect(). Returns 0, after which exactly one
 * of proto->on_connect or proto->on_close follows from the loop (never
 * from inside this call); or a negative errno with nothing started (the
 * socket could not be made, or connect() failed at once, as a Unix path
 * with no listener does). The protocol arms its own timeout for the
 * connect (tern__conn_set_timeout): on_timeout fires while connecting
 * too. Nothing may be written before on_connect. rcvbuf > 0: the
 * socket's SO_RCVBUF, set before connect() so that even the first window
 * offered to the peer is that small. */
TERN_MUST_CHECK
int tern__conn_connect(tern_loop *loop, tern__conn *c, const struct sockaddr *addr,
                       socklen_t len, int rcvbuf, const tern__conn_proto *proto,
                       tern__conn_list *list);

/* Gives a started connection another transport, layered over the one it
 * has (TLS over plain TCP or the back end's stream: it reads c->tp first,
 * keeps it as its lower transport, does every byte of socket I/O through
 * it, and releases it with itself); net releases tp when the connection
 * closes. */
void tern__conn_set_transport(tern__conn *c, tern__transport *tp);

/* For a transport: its read needs the socket to be writable first
 * (TLS handshake output the kernel did not take). */
void tern__conn_recv_wants_out(tern__conn *c);
/* For a transport: its write needs a read first (TLS). */
void tern__conn_send_wants_in(tern__conn *c);

/* Moves a live connection into another struct (a protocol switch: http to
 * ws). `to` gets the fd, buffers, transport and timeout; `from` is freed
 * at the batch end without on_close. */
TERN_MUST_CHECK
int tern__conn_move(tern__conn *from, tern__conn *to, const tern__conn_proto *proto);

/* Queues bytes the protocol has not seen yet (those that came after an
 * upgrade request) to be fed to c at the end of this batch. */
TERN_MUST_CHECK
int tern__conn_inject(tern__conn *c, const char *data, size_t len);

/* Sending. Returns a tern_send_result, or -EPIPE when c is closing. */
int tern__conn_write(tern__conn *c, const void *data, size_t len);
int tern__conn_writev(tern__conn *c, const struct iovec *iov, int iovcnt);
/* Room for n bytes in the cork buffer, to format into directly; NULL when
 * n does not fit (use tern__conn_write). Follow with tern__conn_commit. */
char *tern__conn_reserve(tern__conn *c, size_t n);
void tern__conn_commit(tern__conn *c, size_t n);
/* Sends len bytes of file fd from off after everything written before.
 * Takes the fd (closes it when done or on error). */
int tern__conn_sendfile(tern__conn *c, int fd, off_t off, size_t len);
/* Bytes written but not yet taken by the kernel (corked + backlog + file). */
size_t tern__conn_buffered(const tern__conn *c);
/* The same without the cork: what will still be waiting once this batch
 * has been flushed (what users see as "buffered"). */
size_t tern__conn_backlog(const tern__conn *c);

/* Arms the send clock: while a backlog waits, the connection closes with
 * -ETIMEDOUT once the kernel has taken nothing of it for
 * proto->send_timeout(c). Replaces the protocol's timeout; net disarms it
 * when the backlog drains (before on_drain, which may arm the protocol's
 * clock again). Returns false when nothing is waiting (nothing armed). */
bool tern__conn_send_clock(tern__conn *c);

/* Sets the backlog's hard limit (bytes; 0: none), as c->out_limit says.
 * Does nothing once c has failed or closed: the word holds its error. */
void tern__conn_set_out_limit(tern__conn *c, size_t bytes);

/* The error c ended with: 0 while it is open or when it ended as asked
 * (a close with 0, a linger that saw the peer's end), else the first
 * error it met (-ECONNRESET from the peer's reset, what the kernel said
 * of a send, -ETIMEDOUT, -EPROTO for a TLS failure...), even when the
 * close came later, at the batch end. Valid until the struct is freed. */
int tern__conn_error(const tern__conn *c);

/* Has proto->on_deferred(c) called at the end of this batch. */
void tern__conn_defer(tern__conn *c);

/* Stops or restarts reading. Restarting re-feeds bytes kept in c->in at
 * the end of this iteration, even if no new bytes arrive. */
void tern__conn_pause(tern__conn *c);
void tern__conn_resume(tern__conn *c);

void tern__conn_set_timeout(tern__conn *c, uint64_t ms);

/* Closes now: backlog dropped, on_close(c, err) called. Never from inside
 * a user's call (on_close may run user callbacks): from there, end or
 * defer. */
void tern__conn_close(tern__conn *c, int err);
/* Closes after everything written is flushed (under the send clock); then
 * shuts the write side and reads to EOF (bounded) before closing, so the
 * peer gets the last response rather than a reset caused by bytes it sent
 * that we never read. Never calls on_close from inside: a close it decides
 * happens at the batch end. */
void tern__conn_end(tern__conn *c);

/* The loop's net state: the cork, the re-feed list, deferred frees. */
void tern__net_flush(tern_loop *loop);

/* Listeners. */
typedef struct tern__listener tern__listener;
/* A connection accepted (its descriptor non-blocking and close-on-exec). */
typedef void (*tern__accept_fn)(void *user, int fd);
/* exclusive: refuse (-EADDRINUSE) an address a listening socket already
 * holds, even when opt->reuseport lets this one share it: the first
 * listener of a port that tern_run's other loops will share (a second
 * process would otherwise take a share of its connections). */
TERN_MUST_CHECK
int tern__listener_tcp(tern_loop *loop, const char *host, int port, const tern_listen_options *opt,
                       bool exclusive, tern__accept_fn fn, void *user, tern__listener **out);
TERN_MUST_CHECK
int tern__listener_unix(tern_loop *loop, const char *path, const tern_listen_options *opt,
                        tern__accept_fn fn, void *user, tern__listener **out);
/* A listener on loop for the socket l listens on (a dup of it): another
 * loop accepting from the same queue (for Unix sockets, which have no
 * SO_REUSEPORT balancing). */
TERN_MUST_CHECK
int tern__listener_dup(tern_loop *loop, const tern__listener *l, const tern_listen_options *opt,
                       tern__accept_fn fn, void *user, tern__listener **out);
/* A listener on a socket already listening (inherited: systemd's socket
 * activation), TCP or Unix, through a duplicate of fd (the caller keeps
 * fd). -EINVAL when fd is not a listening stream socket of those
 * families; -EBADF, -ENOTSOCK. */
TERN_MUST_CHECK
int tern__listener_fd(tern_loop *loop, int fd, const tern_listen_options *opt,
                      tern__accept_fn fn, void *user, tern__listener **out);
int tern__listener_port(const tern__listener *l);
/* *paused counts l while it backs off (out of descriptors: not accepting
 * for a moment); written by l's loop only. */
void tern__listener_count_pauses(tern__listener *l, _Atomic uint64_t *paused);
void tern__listener_close(tern__listener *l);

#endif
