/* The Autobahn|Testsuite client for tern's client side (wstest in
 * fuzzingserver mode; tests/autobahn/run-client drives it):
 *
 *     autobahn_client ws://127.0.0.1:PORT AGENT
 *
 * asks /getCaseCount, then connects to /runCase?case=N&agent=AGENT for
 * each case in turn and echoes every message back with its type (offering
 * permessage-deflate), then asks /updateReports?agent=AGENT so wstest
 * writes the reports. Only the public API: it is the library's client as
 * any program would use it. Exit status 0 when every connection opened,
 * 1 otherwise (the verdict on each case is in the reports). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tern/tern.h"

/* Invariants: step is what the connection now open (or opening) is for:
 * 0 the case count, 1..count the cases, count + 1 the report update. */
typedef struct run {
    tern_loop *loop;
    const char *base, *agent;
    int count;
    int step;
    int errors;
} run;

static void next(run *r);

static void on_message(tern_ws *ws, const char *data, size_t len, int opcode, void *user) {
    run *r = user;
    if (r->step == 0) {
        char n[16];   /* the count is text, "517", not NUL-terminated here */
        snprintf(n, sizeof(n), "%.*s", (int)(len < 15 ? len : 15), data);
        r->count = atoi(n);
        return;
    }
    tern_ws_send(ws, data, len, opcode);
}

/* The count's and the update's connections end when the server closes. */
static void on_close(tern_ws *ws, int code, const char *reason, size_t reason_len, void *user) {
    run *r = user;
    r->step++;
    next(r);
}

static void on_connect_error(const tern_ws_connect_error *e, void *user) {
    run *r = user;
    fprintf(stderr, "autobahn_client: step %d: %s\n", r->step, e->message);
    r->errors++;
    r->step++;
    next(r);
}

static void connect_to(run *r, const char *url);

/* The update goes a moment after the last case: wstest records a case
 * when it sees the TCP connection go, which may be after our on_close
 * (the close handshake); asked at once, the report could miss it. */
static void update_reports(tern_timer *t, void *user) {
    run *r = user;
    tern_timer_stop(t);
    char url[512];
    snprintf(url, sizeof(url), "%s/updateReports?agent=%s", r->base, r->agent);
    connect_to(r, url);
}

static void next(run *r) {
    char url[512];
    if (r->step == 0)
        snprintf(url, sizeof(url), "%s/getCaseCount", r->base);
    else if (r->step <= r->count)
        snprintf(url, sizeof(url), "%s/runCase?case=%d&agent=%s", r->base, r->step, r->agent);
    else if (r->step == r->count + 1) {
        tern_timer *t;
        if (tern_timer_start(r->loop, &t, 500, 0, update_reports, r) < 0) {
            r->errors++;
            tern_loop_stop(r->loop);
        }
        return;
    } else {
        tern_loop_stop(r->loop);
        return;
    }
    connect_to(r, url);
}

static void connect_to(run *r, const char *url) {
    static const tern_ws_handlers h = {
        .on_message = on_message, .on_close = on_close, .on_connect_error = on_connect_error};
    /* Case 9 sends messages of 16 MiB; 12 and 13 compress. */
    tern_ws_client_options opt = {.ws = {.max_message = 64u << 20, .compression = true,
                                         .compress_min = 1},
                                  .connect_timeout_ms = 30000};
    int err = tern_ws_connect(r->loop, url, &h, &opt, r);
    if (err < 0) {
        fprintf(stderr, "autobahn_client: %s: %s\n", url, tern_strerror(err));
        r->errors++;
        tern_loop_stop(r->loop);
    }
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: autobahn_client ws://HOST:PORT AGENT\n");
        return 2;
    }
    run r = {.base = argv[1], .agent = argv[2]};
    if (tern_loop_new(&r.loop, NULL) < 0)
        return 1;
    next(&r);
    if (tern_loop_run(r.loop) < 0)
        r.errors++;
    tern_loop_free(r.loop);
    printf("autobahn_client: %d case(s), %d connection error(s)\n", r.count, r.errors);
    return r.errors || r.count == 0 ? 1 : 0;
}
