/* One loop per thread with tern_run: an HTTP server on 127.0.0.1:8087 (or
 * the port given as the second argument; 0: any free one) served by N
 * threads (the first argument; 0, the default: one per core). GET / says
 * which thread answered, GET /stats sums every thread's counters (any
 * thread may read a peer's statistics), POST /stop ends the run
 * gracefully from inside a handler (tern_run_stop). Per-thread state is
 * made in thread_init and found again from the request's server.
 * SIGINT or SIGTERM stop it too.
 *
 *   ./build/examples/threads 4 & curl localhost:8087/; curl -X POST localhost:8087/stop */
#include <stdio.h>
#include <stdlib.h>

#include <tern/tern.h>

#define MAX_THREADS 1024

/* Per-thread state: written by its own thread only. */
typedef struct worker {
    unsigned long answered;
} worker;

static worker workers[MAX_THREADS];

static void thread_init(tern_loop *loop, tern_server *srv, void *user) {
    (void)loop;
    (void)user;
    workers[tern_server_index(srv)].answered = 0;
}

static void who(tern_http_req *req, void *user) {
    (void)user;
    tern_server *srv = tern_http_req_server(req);
    worker *w = &workers[tern_server_index(srv)];
    char body[96];
    int n = snprintf(body, sizeof(body), "thread %d of %d (its answer %lu)\n",
                     tern_server_index(srv), tern_server_peer_count(srv), ++w->answered);
    tern_http_respond(req, 200, "text/plain", body, (size_t)n);
}

static void stats(tern_http_req *req, void *user) {
    (void)user;
    tern_server *srv = tern_http_req_server(req);
    unsigned long long requests = 0, open = 0;
    for (int i = 0; i < tern_server_peer_count(srv); i++) {
        tern_stats st;
        if (tern_server_stats(tern_server_peer(srv, i), &st) == 0) {
            requests += st.requests;
            open += st.connections;
        }
    }
    char body[96];
    int n = snprintf(body, sizeof(body), "requests %llu, connections %llu\n", requests, open);
    tern_http_respond(req, 200, "text/plain", body, (size_t)n);
}

static void stop(tern_http_req *req, void *user) {
    (void)user;
    tern_http_respond(req, 202, "text/plain", "stopping\n", 9);
    tern_run_stop(tern_http_req_server(req));   /* no callback runs inside it */
}

static int port;

static int setup(tern_server *srv, void *user) {
    (void)user;
    int err = tern_http_route(srv, "GET", "/", who, NULL);
    if (err == 0)
        err = tern_http_route(srv, "GET", "/stats", stats, NULL);
    if (err == 0)
        err = tern_http_route(srv, "POST", "/stop", stop, NULL);
    if (err == 0)
        err = tern_listen(srv, "127.0.0.1", port, NULL);
    if (err == 0)
        fprintf(stderr, "threads: http://127.0.0.1:%d/\n", tern_server_port(srv));
    return err;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 0;
    port = argc > 2 ? atoi(argv[2]) : 8087;
    if (n < 0 || n > MAX_THREADS)
        return 2;
    tern_run_options opt = {.thread_init = thread_init};
    int err = tern_run(n, &opt, setup, NULL);
    if (err < 0)
        fprintf(stderr, "threads: %s\n", tern_strerror(err));
    return err < 0;
}
