/* tern serve's /fanout routes (with --bench-routes), beside /pubsub
 * (serve_pubsub.c):
 *
 *   GET  /fanout          WebSocket: each message received is answered with
 *                         10 binary messages of 10 000 bytes
 *   GET  /fanout/sub      WebSocket subscribed to topic "fanout" while open;
 *                         ?ack=1: the first text message says where the
 *                         subscription starts, {"epoch":"E","seq":N};
 *                         ?epoch=E&after=N: resumes after message N of
 *                         epoch E (the messages missed, then that text
 *                         message with ,"resumed":B,"replayed":K)
 *                         (bench/run market's cut-and-resume cells)
 *   GET  /fanout/pub      WebSocket: each message received is published, as
 *                         it is (opcode and bytes), to topic "fanout"
 *                         (bench/run fanout's one-publisher cells)
 *   GET  /fanout/pub-keyed  the same, with a key: a message starts with
 *                         its key's length L (1..128) and L bytes of key
 *                         (no NUL), and is published whole with that key
 *                         (bench/run market; 1007 for anything else)
 */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/app.h"
#include "tern/tern.h"

static void fanout_message(tern_ws *ws, const char *data, size_t len, int opcode, void *user) {
    (void)data, (void)len, (void)opcode, (void)user;
    static char block[10000];
    for (int i = 0; i < 10; i++)
        tern_ws_send(ws, block, sizeof(block), TERN_WS_BINARY);
}

/* /fanout/sub and /fanout/pub: the library's pub/sub with nothing of the
 * JSON protocol around it, so that bench/run compares fan-out, not JSON. */

/* What a /fanout/sub query asked for, from the upgrade to the open. */
typedef struct fanout_start {
    uint64_t epoch, after;
} fanout_start;

static int (*fanout_upgrade_next)(tern_http_req *, void **, void *);

static int fanout_sub_upgrade(tern_http_req *req, void **conn_user, void *user) {
    int r = fanout_upgrade_next(req, conn_user, user);
    char e[24], a[24], k[4];
    bool has_e = tern_http_query_param(req, "epoch", e, sizeof(e)) > 0;
    bool has_a = tern_http_query_param(req, "after", a, sizeof(a)) > 0;
    bool ack = tern_http_query_param(req, "ack", k, sizeof(k)) > 0;
    if (r != 0 || (!has_e && !has_a && !ack))
        return r;
    fanout_start st = {0, 0};
    char *end;
    if (has_e != has_a)
        return 400;
    if (has_e) {
        errno = 0;
        st.epoch = strtoull(e, &end, 16);
        if (errno || *end || st.epoch == 0)
            return 400;
        st.after = strtoull(a, &end, 10);
        if (errno || *end || a[0] == '-')
            return 400;
    }
    fanout_start *p = malloc(sizeof(*p));
    if (p == NULL)
        return 503;
    *p = st;
    *conn_user = p;
    return 0;
}

/* The upgrade did not open the connection after fanout_sub_upgrade
 * accepted it: its start point comes back here, not to fanout_sub_open. */
static void fanout_sub_upgrade_failed(void *conn_user, int status, void *user) {
    (void)status, (void)user;
    free(conn_user);
}

static void fanout_sub_open(tern_ws *ws, void *user) {
    (void)user;
    fanout_start *st = tern_ws_user(ws);
    if (st == NULL) {
        int err = tern_ws_subscribe(ws, "fanout");
        if (err < 0)
            tern_ws_close(ws, TERN_WS_INTERNAL, tern_strerror(err));
        return;
    }
    tern_ws_set_user(ws, NULL);
    tern_resume r;
    int err = tern_ws_subscribe_from(ws, "fanout", st->epoch, st->after, &r);
    bool resuming = st->epoch != 0;
    free(st);
    if (err < 0) {
        tern_ws_close(ws, TERN_WS_INTERNAL, tern_strerror(err));
        return;
    }
    char out[160];
    int n = snprintf(out, sizeof(out), "{\"epoch\":\"%016" PRIx64 "\",\"seq\":%" PRIu64, r.epoch,
                     r.seq);
    if (resuming)
        n += snprintf(out + n, sizeof(out) - (size_t)n, ",\"resumed\":%s,\"replayed\":%" PRIu64,
                      r.resumed ? "true" : "false", r.replayed);
    out[n++] = '}';
    tern_ws_send(ws, out, (size_t)n, TERN_WS_TEXT);
}

/* What the upgrade allocated, when on_open never took it. */
static void fanout_sub_close(tern_ws *ws, int code, const char *reason, size_t len, void *user) {
    (void)code, (void)reason, (void)len, (void)user;
    free(tern_ws_user(ws));
}

static void fanout_pub_message(tern_ws *ws, const char *data, size_t len, int opcode,
                               void *user) {
    (void)user;
    tern_ws_publish(ws, "fanout", NULL, data, len, opcode, SIZE_MAX);   /* a client's: its hook */
}

static void fanout_pub_keyed(tern_ws *ws, const char *data, size_t len, int opcode,
                             void *user) {
    (void)user;
    char key[TERN_KEY_MAX + 1];
    size_t kl = len > 0 ? (uint8_t)data[0] : 0;
    if (kl == 0 || kl > TERN_KEY_MAX || 1 + kl > len || memchr(data + 1, '\0', kl)) {
        tern_ws_close(ws, TERN_WS_INVALID_DATA, "no key prefix");
        return;
    }
    memcpy(key, data + 1, kl);
    key[kl] = '\0';
    tern_ws_publish(ws, "fanout", key, data, len, opcode, SIZE_MAX);
}

int app_serve_fanout_routes(tern_server *srv, const tern_ws_options *o, const tern_ws_options *wo,
                            int (*on_upgrade)(tern_http_req *, void **, void *), void *user) {
    int err;
    static tern_ws_handlers fo;
    fo = (tern_ws_handlers){.on_upgrade = on_upgrade, .on_message = fanout_message};
    tern_ws_options f = *wo;
    f.subprotocols = NULL;
    if ((err = tern_ws_route(srv, "/fanout", &fo, &f, user)) < 0)
        return err;
    static tern_ws_handlers fs, fp, fk;
    fanout_upgrade_next = on_upgrade;
    fs = (tern_ws_handlers){.on_upgrade = fanout_sub_upgrade, .on_open = fanout_sub_open,
                            .on_close = fanout_sub_close,
                            .on_upgrade_failed = fanout_sub_upgrade_failed};
    fp = (tern_ws_handlers){.on_upgrade = on_upgrade, .on_message = fanout_pub_message};
    fk = (tern_ws_handlers){.on_upgrade = on_upgrade, .on_message = fanout_pub_keyed};
    if ((err = tern_ws_route(srv, "/fanout/sub", &fs, o, user)) < 0 ||
        (err = tern_ws_route(srv, "/fanout/pub", &fp, &f, user)) < 0)
        return err;
    return tern_ws_route(srv, "/fanout/pub-keyed", &fk, &f, user);
}