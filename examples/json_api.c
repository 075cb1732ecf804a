/* An HTTP JSON API that answers some requests later: from a worker thread,
 * from a timer, or at once.
 *
 *   GET /primes?below=N[&sleep_ms=M]  counted by the worker thread (M: the
 *                                     worker also waits M ms, standing in
 *                                     for a blocking call such as a query)
 *   GET /delay?ms=M                   answered by a timer after M ms
 *   GET /health                       answered at once: what is in flight
 *
 * On 127.0.0.1:8082, or the port given (0: any free one); the first line
 * on stderr says which. SIGINT or SIGTERM shuts down gracefully: answers
 * in flight are finished, then the worker thread is joined.
 *
 *   ./build/examples/json_api & curl 'localhost:8082/primes?below=100000'
 *
 * The rules this shows:
 * - A handler may keep its tern_http_req and answer later, but only on the
 *   loop's thread: the worker never touches the request, it posts its
 *   result back with tern_loop_post() and the loop thread responds.
 * - The request may go away before that (the connection is reset or
 *   fails, the client closes its side, the server is freed). The abort
 *   callback says so, on the loop thread, within one loop iteration;
 *   after it returns the request is gone. A worker job cannot be freed
 *   then (the worker has it), so it is marked aborted and freed when its
 *   result comes back; a timer can be stopped, so its state is freed at
 *   once. (A client that half-closes is taken to have gone, as nginx and
 *   Go's net/http take it: only answers given at once still reach it.)
 * - The strings a request hands out are views valid during the handler
 *   only: what an answer given later needs is copied (here: parsed) first. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tern/tern.h>

typedef struct job job;

/* Everything the example shares. The fields under "loop thread" are only
 * ever touched on the loop's thread; the queue only under mu. */
typedef struct app {
    tern_loop *loop;
    tern_server *srv;
    /* loop thread */
    unsigned jobs_out;       /* handed to the worker, result not yet back */
    unsigned timers_out;     /* /delay requests waiting for their timer */
    bool shutting_down;
    bool server_done;
    /* the worker's queue */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job *head, **tail;
    bool quit;
} app;

/* A request handed to the worker. The loop thread creates it, the worker
 * owns it from the queue until it posts it back, then the loop thread
 * responds (unless aborted) and frees it. */
struct job {
    app *app;
    job *next;                /* the queue's link, under app->mu */
    /* input, parsed from the request while it was valid */
    unsigned long below;
    unsigned sleep_ms;
    /* output, written by the worker */
    unsigned long count;
    /* loop thread only: set by the abort callback; req is gone then */
    bool aborted;
    tern_http_req *req;
};

/* A request waiting for its timer. Loop thread only. */
typedef struct delayed {
    app *app;
    tern_http_req *req;
    tern_timer *timer;
    unsigned ms;
} delayed;

static void respond_json(tern_http_req *req, int status, const char *json) {
    tern_http_respond(req, status, "application/json", json, strlen(json));
}

/* Reads an unsigned query parameter no greater than max; false when it is
 * missing (and required) or malformed. */
static bool query_uint(tern_http_req *req, const char *name, unsigned long max, bool required,
                       unsigned long *out) {
    char buf[32], *end;
    ssize_t n = tern_http_query_param(req, name, buf, sizeof(buf));
    if (n == -ENOENT && !required) {
        *out = 0;
        return true;
    }
    if (n <= 0 || buf[0] < '0' || buf[0] > '9')
        return false;
    errno = 0;
    unsigned long v = strtoul(buf, &end, 10);
    if (errno || *end || v > max)
        return false;
    *out = v;
    return true;
}

/* Once the server has let go of every connection and every worker result
 * has come back, nothing can refer to a request any more: stop the loop. */
static void maybe_stop(app *a) {
    if (a->server_done && a->jobs_out == 0)
        tern_loop_stop(a->loop);
}

/* ---- answered by the worker thread ------------------------------------ */

static unsigned long count_primes(unsigned long below) {
    unsigned long count = 0;
    for (unsigned long n = 2; n < below; n++) {
        bool prime = true;
        for (unsigned long d = 2; d * d <= n; d++)
            if (n % d == 0) {
                prime = false;
                break;
            }
        count += prime;
    }
    return count;
}

/* Loop thread: the worker's result is back. */
static void job_done(tern_loop *loop, void *user) {
    job *j = user;
    app *a = j->app;
    if (!j->aborted) {
        char body[96];
        snprintf(body, sizeof(body), "{\"below\":%lu,\"primes\":%lu}", j->below, j->count);
        respond_json(j->req, 200, body);
    }
    free(j);
    a->jobs_out--;
    maybe_stop(a);
}

/* Loop thread: the client left before the answer. The worker still holds
 * the job, so it is only marked; job_done frees it. */
static void job_abort(tern_http_req *req, void *user) {
    job *j = user;
    j->aborted = true;
    j->req = NULL;
}

static void *worker(void *user) {
    app *a = user;
    for (;;) {
        pthread_mutex_lock(&a->mu);
        while (a->head == NULL && !a->quit)
            pthread_cond_wait(&a->cv, &a->mu);
        job *j = a->head;
        if (j == NULL) {   /* quit, and nothing left */
            pthread_mutex_unlock(&a->mu);
            return NULL;
        }
        if ((a->head = j->next) == NULL)
            a->tail = &a->head;
        pthread_mutex_unlock(&a->mu);

        /* Only the job's own input and output fields: j->req and
         * j->aborted belong to the loop thread. */
        if (j->sleep_ms) {
            struct timespec ts = {j->sleep_ms / 1000, (long)(j->sleep_ms % 1000) * 1000000L};
            while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
                ;
        }
        j->count = count_primes(j->below);
        /* A post fails only for want of memory; the loop is waiting for
         * this result (jobs_out), so try again rather than lose it. */
        while (tern_loop_post(a->loop, job_done, j) < 0)
            nanosleep(&(struct timespec){0, 1000000L}, NULL);
    }
}

static void primes(tern_http_req *req, void *user) {
    app *a = user;
    unsigned long below, sleep_ms;
    if (!query_uint(req, "below", 10000000, true, &below) ||
        !query_uint(req, "sleep_ms", 10000, false, &sleep_ms)) {
        respond_json(req, 400, "{\"error\":\"want below=0..10000000 and sleep_ms=0..10000\"}");
        return;
    }
    job *j = calloc(1, sizeof(*j));
    if (j == NULL) {
        respond_json(req, 503, "{\"error\":\"out of memory\"}");
        return;
    }
    j->app = a;
    j->req = req;
    j->below = below;
    j->sleep_ms = (unsigned)sleep_ms;
    tern_http_on_abort(req, job_abort, j);
    a->jobs_out++;
    pthread_mutex_lock(&a->mu);
    *a->tail = j;
    a->tail = &j->next;
    pthread_cond_signal(&a->cv);
    pthread_mutex_unlock(&a->mu);
    /* The handler returns without answering: req stays valid until
     * job_done responds, or until job_abort runs. */
}

/* ---- answered by a timer ----------------------------------------------- */

static void delay_fire(tern_timer *timer, void *user) {
    delayed *d = user;
    char body[48];
    snprintf(body, sizeof(body), "{\"delayed_ms\":%u}", d->ms);
    respond_json(d->req, 200, body);   /* ends the response: req is gone now */
    d->app->timers_out--;
    tern_timer_stop(timer);            /* frees the timer; allowed from its own callback */
    free(d);
}

/* The client left first: the timer is stopped, so nothing will look at d
 * again, and it is freed here. */
static void delay_abort(tern_http_req *req, void *user) {
    delayed *d = user;
    d->app->timers_out--;
    tern_timer_stop(d->timer);
    free(d);
}

static void delay(tern_http_req *req, void *user) {
    app *a = user;
    unsigned long ms;
    if (!query_uint(req, "ms", 60000, true, &ms)) {
        respond_json(req, 400, "{\"error\":\"want ms=0..60000\"}");
        return;
    }
    delayed *d = calloc(1, sizeof(*d));
    if (d == NULL || tern_timer_start(a->loop, &d->timer, ms, 0, delay_fire, d) < 0) {
        free(d);
        respond_json(req, 503, "{\"error\":\"out of memory\"}");
        return;
    }
    d->app = a;
    d->req = req;
    d->ms = (unsigned)ms;
    a->timers_out++;
    tern_http_on_abort(req, delay_abort, d);
}

/* ---- answered at once --------------------------------------------------- */

static void health(tern_http_req *req, void *user) {
    app *a = user;
    char body[96];
    snprintf(body, sizeof(body), "{\"ok\":true,\"jobs\":%u,\"timers\":%u}", a->jobs_out,
             a->timers_out);
    respond_json(req, 200, body);
}

/* ---- shutdown ------------------------------------------------------------ */

static void server_done(tern_server *srv, void *user) {
    app *a = user;
    a->server_done = true;
    maybe_stop(a);
}

static void on_signal(tern_loop *loop, int signo, void *user) {
    app *a = user;
    if (a->shutting_down) {   /* a second Ctrl-C: don't wait any longer */
        tern_loop_stop(loop);
        return;
    }
    a->shutting_down = true;
    /* Stops accepting; the responses in flight still go out (the worker
     * keeps working meanwhile), then server_done runs. */
    tern_server_shutdown(a->srv, server_done, a);
}

int main(int argc, char **argv) {
    static app a = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    int port = argc > 1 ? atoi(argv[1]) : 8082;
    pthread_t worker_thread;
    int err;
    a.tail = &a.head;
    signal(SIGPIPE, SIG_IGN);
    if ((err = tern_loop_new(&a.loop, NULL)) < 0 ||
        (err = tern_server_new(&a.srv, a.loop, NULL)) < 0) {
        fprintf(stderr, "json_api: %s\n", tern_strerror(err));
        return 1;
    }
    if ((err = tern_http_route(a.srv, "GET", "/primes", primes, &a)) < 0 ||
        (err = tern_http_route(a.srv, "GET", "/delay", delay, &a)) < 0 ||
        (err = tern_http_route(a.srv, "GET", "/health", health, &a)) < 0) {
        fprintf(stderr, "json_api: routes: %s\n", tern_strerror(err));
        return 1;
    }
    if ((err = tern_listen(a.srv, "127.0.0.1", port, NULL)) < 0) {
        fprintf(stderr, "json_api: listen: %s\n", tern_strerror(err));
        return 1;
    }
    /* Signals first: they are blocked in this thread, and the worker
     * started next inherits the mask, so they all come to the loop. */
    if ((err = tern_loop_on_signal(a.loop, SIGINT, on_signal, &a)) < 0 ||
        (err = tern_loop_on_signal(a.loop, SIGTERM, on_signal, &a)) < 0) {
        fprintf(stderr, "json_api: signals: %s\n", tern_strerror(err));
        return 1;
    }
    if ((err = pthread_create(&worker_thread, NULL, worker, &a)) != 0) {
        fprintf(stderr, "json_api: pthread_create: %s\n", strerror(err));
        return 1;
    }
    fprintf(stderr, "json_api: listening on http://127.0.0.1:%d/\n", tern_server_port(a.srv));

    err = tern_loop_run(a.loop);

    /* The queue is empty unless a second signal cut the wait short; the
     * worker finishes what is left and exits (results it posts now are
     * never run: a forced exit does not wait for them). */
    pthread_mutex_lock(&a.mu);
    a.quit = true;
    pthread_cond_signal(&a.cv);
    pthread_mutex_unlock(&a.mu);
    pthread_join(worker_thread, NULL);
    tern_server_free(a.srv);
    tern_loop_free(a.loop);
    return err < 0;
}
