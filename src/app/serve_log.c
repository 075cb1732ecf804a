/* tern serve's log lines (--log-format text|json): the library's log and
 * the server's own lines on stderr, and the access log, each line with an
 * RFC 3339 timestamp (UTC, milliseconds) and a level, so that a collector
 * (journald, Loki, Elasticsearch...) parses them without a pattern of its
 * own.
 *
 *   text: 2026-11-26T17:33:00.123Z tern: [warn] MESSAGE
 *   json: {"ts":"2026-11-26T17:33:00.123Z","level":"warn","msg":"MESSAGE"}
 *
 * Access records: text keeps its fields after the timestamp (peer method
 * target status bytes ms), json names them. A WebSocket session is one
 * record at its end: status 101, bytes sent, its length, then (text)
 * "ws in=BYTES msgs=IN/OUT close=CODE/server|client" or (json) type
 * "websocket" with bytes_in, messages_in, messages_out, close_code and
 * closed_by. A line is written with one
 * fprintf on a line-buffered stream, so lines from different threads
 * never interleave (stdio locks the stream per call). */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "app/app.h"
#include "app/json.h"

static int log_format = TERN_SERVE_LOG_TEXT;   /* set once, before the threads start */

void app_serve_log_format(int format) { log_format = format; }

bool app_serve_log_json(void) { return log_format == TERN_SERVE_LOG_JSON; }

/* Now, as 2026-11-26T17:33:00.123Z. */
static void timestamp(char out[32]) {
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(out, 32, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + n, 32 - n, ".%03ldZ", ts.tv_nsec / 1000000);
}

void app_serve_log(FILE *f, int level, const char *fmt, ...) {
    char msg[2048], ts[32];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    timestamp(ts);
    if (log_format == TERN_SERVE_LOG_JSON) {
        char esc[6 * sizeof(msg) + 8];
        app_json_escape(esc, sizeof(esc), msg, strlen(msg));
        fprintf(f, "{\"ts\":\"%s\",\"level\":\"%s\",\"msg\":\"%s\"}\n", ts,
                tern_log_level_name(level), esc);
    } else {
        fprintf(f, "%s tern: [%s] %s\n", ts, tern_log_level_name(level), msg);
    }
}

void app_serve_log_access(FILE *f, const tern_http_access *a) {
    char ts[32];
    timestamp(ts);
    const char *side = a->close_code == TERN_WS_ABNORMAL ? "none"
                       : a->closed_by_server                ? "server"
                                                            : "client";
    if (log_format == TERN_SERVE_LOG_JSON) {
        char method[64], target[3 * 8192], ws[256] = "";
        app_json_escape(method, sizeof(method), a->method, strlen(a->method));
        app_json_escape(target, sizeof(target), a->target, strlen(a->target));
        if (a->websocket)
            snprintf(ws, sizeof(ws), ",\"bytes_in\":%llu,\"messages_in\":%llu,"
                                     "\"messages_out\":%llu,\"close_code\":%d,\"closed_by\":\"%s\"",
                     (unsigned long long)a->bytes_in, (unsigned long long)a->messages_in,
                     (unsigned long long)a->messages_out, a->close_code, side);
        fprintf(f, "{\"ts\":\"%s\",\"level\":\"info\",\"type\":\"%s\",\"peer\":\"%s\","
                   "\"method\":\"%s\",\"target\":\"%s\",\"status\":%d,\"bytes\":%llu,\"ms\":%llu%s}\n",
                ts, a->websocket ? "websocket" : "access", a->peer, method, target, a->status,
                (unsigned long long)a->bytes, (unsigned long long)a->duration_ms, ws);
    } else if (a->websocket) {
        fprintf(f, "%s %s %s %s %d %llu %llums ws in=%llu msgs=%llu/%llu close=%d/%s\n", ts,
                a->peer, a->method, a->target, a->status, (unsigned long long)a->bytes,
                (unsigned long long)a->duration_ms, (unsigned long long)a->bytes_in,
                (unsigned long long)a->messages_in, (unsigned long long)a->messages_out,
                a->close_code, side);
    } else {
        fprintf(f, "%s %s %s %s %d %llu %llums\n", ts, a->peer, a->method, a->target, a->status,
                (unsigned long long)a->bytes, (unsigned long long)a->duration_ms);
    }
}

/* The new file is opened first, so a failure (permissions, no room for a
 * descriptor) leaves the old one in use; then, under the stream's lock
 * (the loops' threads write through it, one locked fprintf a line), what
 * is buffered goes to the old file and dup2 puts the new one under the
 * same descriptor number, so the FILE and its users never change. */
int app_serve_log_reopen(FILE *f, const char *path) {
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    flockfile(f);
    fflush(f);
    int err = dup2(fd, fileno(f)) < 0 ? -errno : 0;
    funlockfile(f);
    close(fd);
    return err;
}

/* --log-level's lines of the library, on stderr as the server's own. */
static void library_line(int level, const char *msg, void *user) {
    app_serve_log(stderr, level, "%s", msg);
}

void app_serve_log_library(const char *level) {
    int l = TERN_LOG_WARN;
    for (int k = TERN_LOG_ERROR; k <= TERN_LOG_DEBUG; k++)
        if (strcmp(level, tern_log_level_name(k)) == 0)
            l = k;
    tern_set_log(l, library_line, NULL);
}
