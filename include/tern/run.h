/* tern_run: one loop per thread, serving one configuration.
 *
 *   static int setup(tern_server *srv, void *user) {
 *       tern_http_route(srv, "GET", "/", hello, NULL);
 *       return tern_listen(srv, "0.0.0.0", 8080, NULL);
 *   }
 *   int main(void) { return tern_run(0, NULL, setup, NULL) < 0; }
 *
 * tern_run makes a loop and a server, runs setup on them (on the calling
 * thread, once), then makes a clone of that server for each other thread
 * (tern_server_clone: the same routes, shared, not copied) and opens on it
 * the listeners setup opened: TCP ones on the same address and port (the
 * port the first got, also after port 0) with SO_REUSEPORT, so the kernel
 * spreads the connections over the threads; a Unix socket is shared (each
 * thread accepts from it). A fixed port another socket (another process)
 * already listens on is still refused (-EADDRINUSE), as a single loop's
 * bind would refuse it, unless the listener's options ask for reuseport
 * (a hand-over between processes, on purpose). The calling thread runs loop 0 and joins the
 * others: no thread to write besides setup (and, if per-thread state is
 * needed, the options' thread_init and teardown hooks).
 *
 * SIGINT and SIGTERM are blocked in every thread of the run and read by
 * loop 0 (a signalfd); the first shuts every loop down gracefully
 * (tern_server_shutdown on each: stop accepting, finish the responses in
 * flight, close idle connections), a second stops every loop at once.
 * With drain_delay_ms, the first only starts that wait (every loop keeps
 * accepting and serving; the application's own handler can turn its
 * readiness check to 503), the shutdown begins when it ends or at a second
 * signal, and a third stops every loop at once.
 * setup may add handlers for other signals (tern_loop_on_signal on its
 * server's loop): they are blocked in every thread too. The signals stay
 * blocked in the calling thread after tern_run returns.
 *
 * Threads reach each other through their servers: tern_server_peer(srv, i)
 * and tern_server_loop() give loop i, to tern_loop_post to. A post to a
 * loop of the run is always run, even if it arrives after that loop ended:
 * tern_run runs the waiting posts before it frees the loops (on its own
 * thread, with the servers still there), so what a post carries can be
 * freed by it. */
#ifndef TERN_RUN_H
#define TERN_RUN_H

#include "tern/http.h"
#include "tern/loop.h"

#ifdef __cplusplus
extern "C" {
#endif

#pragma GCC visibility push(default)

/* Configures the first server: routes, hosts, listeners, signal handlers.
 * Returns 0, or a negative error that tern_run then returns (after
 * freeing everything). */
typedef int (*tern_setup_fn)(tern_server *srv, void *user);

/* Per-thread hooks: loop i's loop and server, and tern_run's user. */
typedef void (*tern_thread_fn)(tern_loop *loop, tern_server *srv, void *user);

/* Zero (or a NULL pointer) means the defaults. */
typedef struct tern_run_options {
    tern_loop_options loop;        /* every loop's */
    tern_server_options server;    /* the configuration's */
    /* Runs on each loop's own thread (loop 0's: the calling one) just
     * before the loop runs, after setup and after every clone and its
     * listeners are made: per-thread state (a database connection, a
     * cache) is made here and found again from the server
     * (tern_server_index). NULL: none. */
    tern_thread_fn thread_init;
    /* Runs on each thread whose thread_init ran (with or without one),
     * once its loop has ended and before its server is freed: the loop
     * runs nothing more, the server's connections may still be open.
     * Posts that reach a loop after it ended run later, on the calling
     * thread (see above): what they touch must outlive teardown. */
    tern_thread_fn teardown;
    /* Milliseconds between the first SIGINT or SIGTERM and the graceful
     * shutdown, during which the listeners stay open, so that a load
     * balancer has time to see the node unready and take it out (0: no
     * wait). tern_run_stop does not wait. */
    uint32_t drain_delay_ms;
} tern_run_options;

/* The CPUs this process may use: those of its affinity mask (taskset,
 * a container's cpuset), no more than its cgroup's CPU quota allows
 * (cgroup v2 cpu.max, rounded up), at least 1. Any thread. */
int tern_cpu_count(void);

/* Runs n_threads loops (0: tern_cpu_count(), one per usable CPU) until they have all
 * ended. Returns 0; or -EINVAL (setup NULL, n_threads negative or over
 * 1024, bad server options), setup's error, an error of making a loop or
 * a clone's listeners (then nothing ran), or the first error a loop
 * returned. */
TERN_MUST_CHECK
int tern_run(int n_threads, const tern_run_options *opt, tern_setup_fn setup, void *user);

/* Shuts every loop of srv's run down, as SIGTERM does (a second call stops
 * them at once). Any thread, any time; never runs a callback inside the
 * call. Returns 0, -EINVAL when srv was not made by tern_run, -ENOMEM. */
int tern_run_stop(tern_server *srv);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
