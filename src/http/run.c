/* tern_run: one loop and one server per thread, one shared configuration,
 * signals read on loop 0 and turned into posts to every loop. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#include "http/server.h"
#include "loop/log.h"
#include "tern/run.h"

#define TERN__RUN_MAX_THREADS 1024

/* What a loop was doing when asked to shut down: a shutdown the
 * application had already begun keeps its own done callback, run first. */
typedef struct tern__run_loop {
    struct tern__run *run;
    tern_server *srv;
    tern_server_done_fn app_done;
    void *app_user;
    int rc;
} tern__run_loop;

/* Invariants: loops[i] and per[i].srv are set for i < n once the threads
 * start, and stay until they have all been joined; stops counts the stop
 * requests (signals and tern_run_stop), the first graceful, later ones
 * immediate. live counts what loop 0 must outlive: its own shutdown and the
 * loops of the other threads; loop 0 reads the signals, so it ends last. */
typedef struct tern__run {
    int n;
    tern_thread_fn thread_init, teardown;
    void *user;                      /* tern_run's, for both */
    tern_loop **loops;
    tern__run_loop *per;
    pthread_t *threads;
    atomic_int stops;
    atomic_int live;
    /* The drain delay (loop 0's thread only): its length, and its timer
     * while a first signal waits on it. */
    uint32_t drain_delay_ms;
    tern_timer *delay;
} tern__run;

/* One of the things loop 0 waits for is over: the last one ends loop 0.
 * Until then loop 0 runs on, with its server shut down, only so that its
 * signal descriptor is read: a second SIGTERM must reach the loops still draining
 * (a signal blocked in every thread and read by no loop would wait for
 * the whole shutdown timeout). */
static void live_done(tern__run *run) {
    if (atomic_fetch_sub(&run->live, 1) != 1)
        return;
    if (tern__loop_current() == run->loops[0])
        tern_loop_stop(run->loops[0]);
    else
        tern_loop_stop_async(run->loops[0]);
}

/* Loop i's shutdown is over: loop 0 waits for the others' threads, the
 * others end now. */
static void loop_finished(tern__run_loop *pl, tern_loop *loop) {
    if (loop == pl->run->loops[0])
        live_done(pl->run);
    else
        tern_loop_stop(loop);
}

static void loop_done(tern_server *srv, void *user) {
    tern__run_loop *pl = user;
    if (pl->app_done)
        pl->app_done(srv, pl->app_user);
    loop_finished(pl, tern_server_loop(srv));
}

/* On loop i: the graceful shutdown of its server, then the loop ends. */
static void shutdown_post(tern_loop *loop, void *user) {
    tern__run_loop *pl = user;
    tern_server *srv = pl->srv;
    if (!srv->shutting_down) {
        tern_server_shutdown(srv, loop_done, pl);
    } else if (srv->done) {
        /* The application shut it down first: end the loop after its done. */
        pl->app_done = srv->done;
        pl->app_user = srv->done_user;
        srv->done = loop_done;
        srv->done_user = pl;
    } else {
        loop_finished(pl, loop);   /* its shutdown is over */
    }
}

static int run_stop(tern__run *run) {
    int err = 0;
    if (atomic_fetch_add(&run->stops, 1) == 0) {
        for (int i = 0; i < run->n; i++) {
            int e = tern_loop_post(run->loops[i], shutdown_post, &run->per[i]);
            if (e < 0 && (e = tern_loop_stop_async(run->loops[i])) < 0 && err == 0)
                err = e;
        }
    } else {
        for (int i = 0; i < run->n; i++) {
            int e = tern_loop_stop_async(run->loops[i]);
            if (e < 0 && err == 0)
                err = e;
        }
    }
    return err;
}

int tern_run_stop(tern_server *srv) {
    if (srv == NULL || srv->cfg->run == NULL)
        return -EINVAL;
    return run_stop(srv->cfg->run);
}

/* The drain delay is over: the graceful shutdown begins, unless a
 * tern_run_stop began it meanwhile (then it must not become a stop). */
static void delay_over(tern_timer *t, void *user) {
    tern__run *run = user;
    tern_timer_stop(t);
    run->delay = NULL;
    if (atomic_load(&run->stops) == 0)
        run_stop(run);
}

static void on_signal(tern_loop *loop, int signo, void *user) {
    tern__run *run = user;
    bool first = atomic_load(&run->stops) == 0;
    /* A first signal with a drain delay only starts the wait: the loops
     * keep accepting and serving while a load balancer that polls
     * readiness takes this node out. A second signal ends the wait. */
    if (first && run->drain_delay_ms && run->delay == NULL &&
        tern_timer_start(loop, &run->delay, run->drain_delay_ms, 0, delay_over, run) == 0) {
        tern__log(TERN_LOG_INFO, TERN__LOG_RUN, "run: signal %d, shutting down in %u ms", signo,
                  run->drain_delay_ms);
        return;
    }
    if (run->delay) {
        tern_timer_stop(run->delay);
        run->delay = NULL;
    }
    tern__log(TERN_LOG_INFO, TERN__LOG_RUN, "run: signal %d, %s", signo,
              first ? "shutting down" : "stopping now");
    run_stop(run);
}

/* One loop's life on its thread, between the per-thread hooks. */
static int run_loop(tern__run_loop *pl) {
    tern__run *run = pl->run;
    tern_loop *loop = tern_server_loop(pl->srv);
    if (run->thread_init)
        run->thread_init(loop, pl->srv, run->user);
    int rc = tern_loop_run(loop);
    if (run->teardown)
        run->teardown(loop, pl->srv, run->user);
    return rc;
}

static void *thread_main(void *arg) {
    tern__run_loop *pl = arg;
    pl->rc = run_loop(pl);
    live_done(pl->run);
    return NULL;
}

/* Frees what tern_run made: first the posts still waiting (they may carry
 * memory, and may post to each other), then servers, then loops. */
static void run_free(tern__run *run) {
    int ran;
    do {
        ran = 0;
        for (int i = 0; i < run->n; i++)
            if (run->loops[i])
                ran += tern__loop_run_posts(run->loops[i]);
    } while (ran);
    if (run->delay)
        tern_timer_stop(run->delay);
    for (int i = run->n - 1; i >= 0; i--)
        tern_server_free(run->per[i].srv);
    for (int i = 0; i < run->n; i++)
        tern_loop_free(run->loops[i]);
    free(run->loops);
    free(run->per);
    free(run->threads);
    free(run);
}

int tern_run(int n_threads, const tern_run_options *opt, tern_setup_fn setup, void *user) {
    if (setup == NULL || n_threads < 0 || n_threads > TERN__RUN_MAX_THREADS)
        return -EINVAL;
    if (n_threads == 0) {
        int cpus = tern_cpu_count();
        n_threads = cpus > TERN__RUN_MAX_THREADS ? TERN__RUN_MAX_THREADS : cpus;
    }
    tern_run_options defaults = {0};
    if (opt == NULL)
        opt = &defaults;
    tern__run *run = calloc(1, sizeof(*run));
    if (run == NULL)
        return -ENOMEM;
    atomic_init(&run->stops, 0);
    atomic_init(&run->live, 0);
    run->thread_init = opt->thread_init;
    run->teardown = opt->teardown;
    run->drain_delay_ms = opt->drain_delay_ms;
    run->user = user;
    run->loops = calloc((size_t)n_threads, sizeof(*run->loops));
    run->per = calloc((size_t)n_threads, sizeof(*run->per));
    run->threads = calloc((size_t)n_threads, sizeof(*run->threads));
    if (run->loops == NULL || run->per == NULL || run->threads == NULL) {
        run_free(run);
        return -ENOMEM;
    }
    /* n stays the number of loops made, so that run_free frees just them. */
    int err = tern_loop_new(&run->loops[0], &opt->loop);
    if (err < 0) {
        run_free(run);
        return err;
    }
    run->n = 1;
    run->per[0].run = run;
    if ((err = tern_server_new(&run->per[0].srv, run->loops[0], &opt->server)) < 0) {
        run_free(run);
        return err;
    }
    tern_server *first = run->per[0].srv;
    first->cfg->run = run;
    first->cfg->reuseport = n_threads > 1;
    first->cfg->nloops_planned = n_threads;
    /* Blocked here before any thread starts, so every thread inherits it. */
    if ((err = tern_loop_on_signal(run->loops[0], SIGINT, on_signal, run)) < 0 ||
        (err = tern_loop_on_signal(run->loops[0], SIGTERM, on_signal, run)) < 0 ||
        (err = setup(first, user)) < 0) {
        run_free(run);
        return err;
    }
    for (int i = 1; i < n_threads; i++) {
        if ((err = tern_loop_new(&run->loops[i], &opt->loop)) < 0)
            break;
        run->n = i + 1;
        run->per[i].run = run;
        if ((err = tern_server_clone(&run->per[i].srv, run->loops[i], first)) < 0 ||
            (err = tern__server_listen_like(run->per[i].srv, first)) < 0)
            break;
    }
    if (err < 0) {
        run_free(run);
        return err;
    }
    /* Loop 0's shutdown and every other loop, counted before any starts. */
    atomic_store(&run->live, run->n);
    int started = 1;
    for (int i = 1; i < run->n; i++) {
        if ((err = -pthread_create(&run->threads[i], NULL, thread_main, &run->per[i])) < 0)
            break;
        started++;
    }
    if (err < 0) {
        /* Those that started stop at once: nothing has been accepted that
         * a shutdown would have to finish... except what they accepted
         * already, so shut down politely anyway. */
        atomic_store(&run->stops, 0);
        for (int i = 1; i < started; i++)
            if (tern_loop_post(run->loops[i], shutdown_post, &run->per[i]) < 0)
                tern_loop_stop_async(run->loops[i]);   /* out of memory: stop, not politely */
    } else {
        run->per[0].rc = run_loop(&run->per[0]);
    }
    for (int i = 1; i < started; i++)
        pthread_join(run->threads[i], NULL);
    int rc = err;
    for (int i = 0; i < started && rc == 0; i++)
        rc = run->per[i].rc;
    run_free(run);
    return rc;
}
