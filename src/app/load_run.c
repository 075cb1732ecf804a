/* tern load's runner: the connections, the phases of a run and its end,
 * on the tern loop (one thread); what a mode sends, checks and counts is
 * its own file's (load_mode_ops, load.h).
 *
 * It exists to measure the server on a small machine, where the client
 * shares the CPUs with it, so the client does as little as it can per
 * message. Its connections are the library's public WebSocket client
 * (tern_ws_connect, tern/client.h), with nothing of its own below the
 * messages:
 * - replies are delivered where they lie in the loop's one shared read
 *   buffer and checked (echo) or only counted (pipeline, fanout) there:
 *   nothing is allocated or copied per message on the way in;
 * - a send copies its payload into the loop's cork buffer and masks it
 *   there, with a fresh key per frame as RFC 6455 asks (a few hundred
 *   nanoseconds for 1 KiB, next to the kernel's microseconds); the sends
 *   of one batch of events (a pipeline's batch, a publisher's tick) leave
 *   in one write. The payload is one shared buffer per run: an echo's
 *   sequence number is written into it just before its send;
 * - one clock read per echo: the time the echo completed is also the time
 *   the next message is sent;
 * - what the modes need beyond sending and receiving is the client API's
 *   too: the market's slow readers pause and resume reading
 *   (tern_ws_pause) on a small receive buffer (the rcvbuf option), and
 *   pubsub's cut drops connections with a reset (tern_ws_abort).
 *
 * Any error ends the run at once (exit 1) with the first error's message;
 * the measurement is only printed after a clean run. */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "app/load.h"

/* ---- services to the modes ------------------------------------------------ */

uint64_t load_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The loop stops once nothing of any connection is left to come: at the
 * end of the run, or after a failure (see run_settle). */
static void maybe_stop(load_run *run) {
    if ((run->failed || run->phase == PH_CLOSE) && run->live == 0)
        tern_loop_stop(run->loop);
}

void load_fail(load_run *run, const char *fmt, ...) {
    if (run->failed)
        return;
    run->failed = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(run->error, sizeof(run->error), fmt, ap);
    va_end(ap);
    tern_loop_stop(run->loop);
}

unsigned load_conn_no(const load_conn *c) { return (unsigned)(c - c->run->conns); }

bool load_is_publisher(const load_conn *c) {
    return c->run->mode->pub != NULL && load_conn_no(c) == c->run->o->connections;
}

/* A close handshake at the end that went wrong: not an error of the
 * measurement, but worth a line. */
static void note_unclean(load_conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note_unclean(load_conn *c, const char *fmt, ...) {
    load_run *run = c->run;
    if (run->unclean++ == 0) {
        int n = snprintf(run->unclean_why, sizeof(run->unclean_why), "connection %u: ",
                         load_conn_no(c));
        va_list ap;
        va_start(ap, fmt);
        if (n > 0 && (size_t)n < sizeof(run->unclean_why))
            vsnprintf(run->unclean_why + n, sizeof(run->unclean_why) - (size_t)n, fmt, ap);
        va_end(ap);
    }
}

uint64_t load_get_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

void load_put_le64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

size_t load_server_header_len(uint64_t len) { return len < 126 ? 2 : len < 65536 ? 4 : 10; }

/* A refusal ends the run: tern load's sends never pass the backlog limits
 * it sets (run_prepare), so a drop would be a bug. */
bool load_send(load_conn *c, const void *data, size_t len) {
    int r = tern_ws_send(c->ws, data, len, TERN_WS_BINARY);
    if (r == TERN_SEND_OK || r == TERN_SEND_BUFFERED)
        return true;
    load_fail(c->run, "connection %u: send: %s", load_conn_no(c),
              r == TERN_SEND_DROPPED ? "dropped over the backlog limit" : tern_strerror(r));
    return false;
}

void load_set_paused(load_conn *c, bool paused) {
    c->paused = paused;
    int err = paused ? tern_ws_pause(c->ws) : tern_ws_resume(c->ws);
    if (err < 0)
        load_fail(c->run, "connection %u: %s reading: %s", load_conn_no(c),
                  paused ? "pausing" : "resuming", tern_strerror(err));
}

/* ---- the library's callbacks ---------------------------------------------- */

/* Every connection is open: the mode's messages start. */
static void begin(load_run *run) {
    run->open_ns = load_now_ns();
    run->mode->begin(run);
}

static void on_message(tern_ws *ws, const char *data, size_t len, int opcode, void *user) {
    (void)ws;
    load_conn *c = user;
    load_run *run = c->run;
    /* After our close frame (the echo in flight, a last publish), or once
     * the run failed: nothing more is counted. */
    if (run->failed || c->state != CS_OPEN)
        return;
    run->progress++;
    const uint8_t *p = (const uint8_t *)data;
    run->mode->on_message(c, p, len, opcode);
}

static void on_open(tern_ws *ws, void *user) {
    load_conn *c = user;
    load_run *run = c->run;
    c->ws = ws;
    c->state = CS_OPEN;
    run->handshaking--;
    if (run->failed) {   /* settling: it only has to go */
        tern_ws_abort(ws);
        return;
    }
    run->opened += !c->resuming;   /* else back after the cut */
    run->progress++;
    if (c->resuming) {
        load_restart_more(run);
        return;
    }
    if (run->opened == run->nconns)
        begin(run);
    else
        load_start_more(run);
}

static void on_close(tern_ws *ws, int code, const char *reason, size_t reason_len, void *user) {
    (void)ws;
    load_conn *c = user;
    load_run *run = c->run;
    int was = c->state;
    c->ws = NULL;
    c->state = CS_DONE;
    c->paused = false;
    run->live--;
    int rlen = (int)(reason_len > 100 ? 100 : reason_len);
    if (c->cut) {   /* pubsub's cut: back to NEW, to connect again when it ends */
        c->cut = false;
        c->state = CS_NEW;
    } else if (run->failed) {
        /* settling after the error already reported */
    } else if (was == CS_OPEN && run->mode->closed_is_figure && run->mode->closed_is_figure(c)) {
        /* a figure of the run (market's disconnects), not its end */
    } else if (was == CS_OPEN) {
        if (code == TERN_WS_ABNORMAL)
            load_fail(run, "connection %u: the connection dropped during the run (no close frame)",
                      load_conn_no(c));
        else
            load_fail(run, "connection %u: the server closed the connection during the run: "
                           "%d%s%.*s",
                      load_conn_no(c), code, rlen ? " " : "", rlen, reason);
    } else if (code == TERN_WS_ABNORMAL) {
        note_unclean(c, "no close frame from the server within %d ms", LOAD_CLOSE_MS);
    } else if (code != TERN_WS_NORMAL) {
        note_unclean(c, "the server answered our close 1000 with %d%s%.*s", code,
                     rlen ? " " : "", rlen, reason);
    }
    maybe_stop(run);
}

static void on_connect_error(const tern_ws_connect_error *e, void *user) {
    load_conn *c = user;
    load_run *run = c->run;
    c->state = CS_DONE;
    run->handshaking--;
    run->live--;
    if (!e->connected)
        load_fail(run, "connect to %s: %s", run->o->where.authority,
                  e->err == -ETIMEDOUT ? "timed out" : tern_strerror(e->err));
    else if (e->status)
        load_fail(run, "connection %u: handshake refused: %s (is %s a WebSocket route?)",
                  load_conn_no(c), e->message,
                  load_is_publisher(c) ? run->o->pub_path : run->o->where.target);
    else
        load_fail(run, "connection %u: handshake: %s", load_conn_no(c), e->message);
    maybe_stop(run);
}

/* ---- opening ---------------------------------------------------------- */

/* The URL of connection c: the publisher's path or the subscribers', and
 * with a cut, the subscriber asks where it starts (ack=1) or, resuming,
 * for what came after the last message it got. */
static void conn_url(const load_conn *c, char *url, size_t cap) {
    const load_run *run = c->run;
    const tern_url *w = &run->o->where;
    const char *target = load_is_publisher(c) ? run->o->pub_path : w->target;
    int n = w->unix_socket ? snprintf(url, cap, "%s+unix:%s:%s", w->tls ? "wss" : "ws",
                                      w->socket_path, target)
                           : snprintf(url, cap, "%s://%s%s", w->tls ? "wss" : "ws",
                                      w->authority, target);
    if (n < 0 || (size_t)n >= cap || load_is_publisher(c) || !run->o->cut_for_ms)
        return;
    load_sub_query(c, strchr(target, '?') ? '&' : '?', url + n, cap - (size_t)n);
}

static void conn_start(load_conn *c) {
    load_run *run = c->run;
    char url[LOAD_PATH_MAX + sizeof(run->o->where.authority) + 96];
    conn_url(c, url, sizeof(url));
    tern_ws_client_options opt = run->copt;
    if (c->slow)
        opt.rcvbuf = 16384;   /* a small window, as a reader on a slow link has */
    int err = tern_ws_connect(run->loop, url, &run->handlers, &opt, c);
    if (err < 0) {
        if (err == TERN_ENOHOST)
            load_fail(run, "cannot resolve %s", run->o->where.host);
        else
            load_fail(run, "connection %u: connect to %s: %s%s", load_conn_no(c),
                      run->o->where.authority,
                      tern_strerror(err), err == -EMFILE ? " (raise ulimit -n)" : "");
        return;
    }
    c->state = CS_CONNECTING;
    run->handshaking++;
    run->live++;
}

/* Keeps up to LOAD_MAX_HANDSHAKES connections being opened at once. */
void load_start_more(load_run *run) {
    while (!run->failed && run->handshaking < LOAD_MAX_HANDSHAKES &&
           run->next_start < run->nconns)
        conn_start(&run->conns[run->next_start++]);
}

/* After pubsub's cut: the subscribers that were cut connect again, as
 * many at once as load_start_more opens. */
void load_restart_more(load_run *run) {
    while (!run->failed && run->cut.reconnect_ns && run->handshaking < LOAD_MAX_HANDSHAKES &&
           run->cut.next_restart < run->o->connections) {
        load_conn *c = &run->conns[run->cut.next_restart++];
        if (c->resuming && c->state == CS_NEW)
            conn_start(c);
    }
}

/* After a failure: every open connection is dropped, and the loop runs
 * until each has had its on_close and each connect under way its outcome,
 * so that nothing of a connection is left when the loop is freed. */
static void run_settle(load_run *run) {
    for (uint32_t i = 0; i < run->nconns; i++) {
        load_conn *c = &run->conns[i];
        if (c->state == CS_OPEN || c->state == CS_CLOSING) {
            c->cut = false;
            tern_ws_abort(c->ws);
        }
    }
    int err = run->live > 0 ? tern_loop_run(run->loop) : 0;
    if (err < 0)
        fprintf(stderr, "tern load: the loop: %s\n", tern_strerror(err));
}


/* ---- phases ------------------------------------------------------------- */

static void on_phase_timer(tern_timer *t, void *user);

void load_arm_phase(load_run *run, uint64_t ms) {
    int err = run->phase_timer ? tern_timer_again(run->phase_timer, ms)
                               : tern_timer_start(run->loop, &run->phase_timer, ms, 0,
                                                  on_phase_timer, run);
    if (err < 0)
        load_fail(run, "timer: %s", tern_strerror(err));
}

void load_begin_timed(load_run *run) {
    const load_opts *o = run->o;
    run->phase = o->warmup_ms ? PH_WARMUP : PH_MEASURE;
    run->t0_ns = run->open_ns;
    load_arm_phase(run, o->warmup_ms ? o->warmup_ms : o->duration_ms);
}

void load_start_tick(load_run *run, void (*fn)(tern_timer *, void *)) {
    int err = tern_timer_start(run->loop, &run->tick, 1, 1, fn, run);
    if (err < 0)
        load_fail(run, "timer: %s", tern_strerror(err));
}

/* The end: every connection says goodbye with a close frame (1000); the
 * library gives the rest of the close handshake LOAD_CLOSE_MS (its
 * close_timeout_ms), and the phase timer a little more, in case. */
void load_close_all(load_run *run) {
    run->phase = PH_CLOSE;
    load_arm_phase(run, LOAD_CLOSE_MS + 1000);
    for (uint32_t i = 0; i < run->nconns && !run->failed; i++) {
        load_conn *c = &run->conns[i];
        if (c->state != CS_OPEN)
            continue;
        c->state = CS_CLOSING;
        if (c->paused)
            load_set_paused(c, false);   /* the server's close frame must be read */
        tern_ws_close(c->ws, TERN_WS_NORMAL, NULL);
    }
    maybe_stop(run);
}

/* The phase timer: the warm-up's end (not the pipeline's: its phases end
 * by count), the measured time's, the drain's, and the close's. */
static void on_phase_timer(tern_timer *t, void *user) {
    load_run *run = user;
    if (run->failed)
        return;
    switch (run->phase) {
    case PH_WARMUP:
        run->phase = PH_MEASURE;
        run->t0_ns = load_now_ns();
        memset(&run->m, 0, sizeof(run->m));
        load_hist_reset(&run->m.hist);
        load_hist_reset(&run->m.slow_hist);
        load_arm_phase(run, run->o->duration_ms);
        if (run->mode->measure_begin)
            run->mode->measure_begin(run);
        return;
    case PH_MEASURE:
        run->t1_ns = load_now_ns();
        if (run->mode->measure_end)
            run->mode->measure_end(run);
        else
            load_close_all(run);
        return;
    case PH_DRAIN:
        run->mode->drain_end(run);
        return;
    case PH_CLOSE:
        /* The library's close timeout should have ended every one. */
        for (uint32_t i = 0; i < run->nconns; i++) {
            load_conn *c = &run->conns[i];
            if (c->state != CS_OPEN && c->state != CS_CLOSING)
                continue;
            note_unclean(c, "close handshake not done after %d ms", LOAD_CLOSE_MS + 1000);
            tern_ws_abort(c->ws);
        }
        return;
    default:
        return;
    }
}

static void on_watchdog(tern_timer *t, void *user) {
    load_run *run = user;
    if (run->failed || run->phase == PH_CLOSE)
        return;
    if (run->progress != run->progress_seen) {
        run->progress_seen = run->progress;
        run->stalled_ms = 0;
        return;
    }
    run->stalled_ms += 1000;
    if (run->stalled_ms < LOAD_STALL_MS)
        return;
    if (run->phase == PH_CONNECT)
        load_fail(run, "stuck opening connections: %u of %u open, no progress for %d s",
                  run->opened, run->nconns, LOAD_STALL_MS / 1000);
    else
        load_fail(run, "the server stopped answering: nothing received for %d s",
                  LOAD_STALL_MS / 1000);
}

/* ---- the run -------------------------------------------------------------- */

/* The connections' options and the payload's room, made once; then the
 * mode's own. */
static int run_prepare(load_run *run) {
    const load_opts *o = run->o;
    run->handlers = (tern_ws_handlers){.on_open = on_open, .on_message = on_message,
                                       .on_close = on_close,
                                       .on_connect_error = on_connect_error};
    run->headers[0] = "User-Agent: tern-load/" TERN_VERSION;
    run->headers[1] = NULL;
    /* No backlog limit that tern load's own sends could pass (a pipeline
     * batch may be up to LOAD_MAX_BATCH bytes): the run reads as it writes,
     * so its backlog is bounded by what it sends. The close handshake at
     * the end gets LOAD_CLOSE_MS. */
    size_t biggest = o->size > o->reply_size ? (size_t)o->size : (size_t)o->reply_size;
    run->copt = (tern_ws_client_options){
        .headers = run->headers,
        .ca_file = o->ca_file,
        .insecure = o->insecure,
        .ws = {.max_message = biggest > (16u << 20) ? biggest : 0,
               .close_timeout_ms = LOAD_CLOSE_MS,
               .backlog_soft = (size_t)LOAD_MAX_BATCH * 2,
               .backlog_hard = (size_t)LOAD_MAX_BATCH * 2},
    };
    run->payload = malloc(o->size + 1);
    if (run->payload == NULL)
        return -ENOMEM;
    return run->mode->prepare(run);
}

/* Enough descriptors for the connections, raising the soft limit when the
 * hard one allows. */
static bool ensure_fds(uint32_t n) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
        return true;   /* socket() will say so */
    rlim_t need = (rlim_t)n + 32;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > need ? need : rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
        if (rl.rlim_cur < need) {
            fprintf(stderr, "tern load: %u connections need %llu file descriptors; "
                            "the limit is %llu (ulimit -Hn)\n",
                    n, (unsigned long long)need, (unsigned long long)rl.rlim_max);
            return false;
        }
    }
    return true;
}

int load_run_main(const load_opts *o) {
    if (!ensure_fds(o->connections + 1))
        return 1;
    signal(SIGPIPE, SIG_IGN);

    load_run *run = calloc(1, sizeof(*run));
    if (run == NULL) {
        fprintf(stderr, "tern load: out of memory\n");
        return 1;
    }
    run->o = o;
    run->mode = load_modes[o->mode];
    run->nconns = o->connections + (run->mode->pub != NULL);   /* and the publisher */
    load_hist_reset(&run->m.hist);
    load_hist_reset(&run->m.slow_hist);
    int err = tern_loop_new(&run->loop, NULL);
    if (err == 0) {
        run->conns = calloc(run->nconns, sizeof(*run->conns));
        for (uint32_t i = 0; run->conns && i < run->nconns; i++)
            run->conns[i].run = run;
        err = run->conns ? run_prepare(run) : -ENOMEM;
    }
    if (err == 0)
        err = tern_timer_start(run->loop, &run->watchdog, 1000, 1000, on_watchdog, run);
    int status = 0;
    if (err < 0) {
        fprintf(stderr, "tern load: %s\n", tern_strerror(err));
        status = 1;
    } else {
        run->start_ns = load_now_ns();
        load_start_more(run);
        if (!run->failed && (err = tern_loop_run(run->loop)) < 0)
            load_fail(run, "epoll: %s", tern_strerror(err));
        if (run->failed) {
            run_settle(run);
            fprintf(stderr, "tern load: %s\n", run->error);
            status = 1;
        } else {
            load_stats_print(run);
        }
    }
    for (uint32_t i = 0; run->conns && i < run->nconns; i++)
        free(run->conns[i].last_key);
    free(run->market.last_pub);
    if (run->phase_timer)
        tern_timer_stop(run->phase_timer);
    if (run->tick)
        tern_timer_stop(run->tick);
    if (run->cut.timer)
        tern_timer_stop(run->cut.timer);
    if (run->watchdog)
        tern_timer_stop(run->watchdog);
    free(run->conns);
    free(run->payload);
    if (run->loop)
        tern_loop_free(run->loop);
    free(run);
    return status;
}
