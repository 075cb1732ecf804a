/* tern connect: an interactive WebSocket client on the library's
 * tern_ws_connect, in the manner of websocat and wscat. Each line read
 * from stdin becomes a message (text, or binary with --binary), each
 * message received is printed on stdout followed by a newline. At the end
 * of stdin (or on SIGINT) the client closes with 1000 and waits for the
 * server's answer; the exit status says how the connection ended.
 *
 * stdin is read by a thread of its own, which posts each line to the
 * loop: a blocking read works on any stdin (a terminal, a pipe, a regular
 * file, which epoll cannot watch), and the loop stays the only place where
 * the connection is touched. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/app.h"
#include "app/options.h"
#include "tern/tern.h"

enum {
    EXIT_NORMAL = 0,      /* closed with 1000, by either side */
    EXIT_OTHER = 1,       /* out of memory, a thread that would not start */
    EXIT_USAGE = 2,
    EXIT_CONNECT = 3,     /* no connection: refused, unresolved, unreachable, timed out */
    EXIT_HANDSHAKE = 4,   /* connected, but no WebSocket: TLS, status, accept key, ... */
    EXIT_ABNORMAL = 5,    /* opened, then ended without a close frame or with another code */
};

/* A line from stdin, on its way to the loop; data NULL marks the end. */
typedef struct line {
    struct line *next;
    size_t len;
    char *data;
} line;

/* The client's state, touched on the loop's thread only (the reader
 * thread only posts). Invariants: pending holds the lines that came
 * before the connection opened, in order; ws is set from on_open to
 * on_close; exit_code is final once the loop stops. */
typedef struct client {
    tern_loop *loop;
    tern_ws *ws;
    line *pending, **pending_tail;
    int opcode;
    bool input_done;
    bool closing;
    int exit_code;
} client;

/* tern connect's options. */
enum { CO_BINARY, CO_HEADER, CO_SUBPROTOCOL, CO_INSECURE, CO_CA_FILE, CO_SERVER_NAME,
       CO_COMPRESS, CO_TIMEOUT, CO_DNS_SERVER, CO_HELP, CO_COUNT };
static const app_opt connect_opts[CO_COUNT] = {
    [CO_BINARY] = {"binary", 'b', APP_OPT_FLAG,
                   .help = "send lines as binary messages (default: text)"},
    [CO_HEADER] = {"header", 'H', APP_OPT_STRING, "'N: v'", .flags = APP_OPT_REPEAT,
                   .max_count = 1024,
                   .help = "an extra request header, e.g. Origin, Cookie,\nAuthorization"},
    [CO_SUBPROTOCOL] = {"subprotocol", 's', APP_OPT_STRING, "NAME", .flags = APP_OPT_REPEAT,
                        .max_count = 1024, .help = "offer a subprotocol (in order)"},
    [CO_INSECURE] = {"insecure", 'k', APP_OPT_FLAG,
                     .help = "wss: do not verify the server's certificate"},
    [CO_CA_FILE] = {"ca-file", 0, APP_OPT_STRING, "FILE",
                    .help = "wss: trust the CAs in FILE (PEM), not the system's"},
    [CO_SERVER_NAME] = {"server-name", 0, APP_OPT_STRING, "NAME",
                        .help = "wss: SNI and the name checked (unset: the host)"},
    [CO_COMPRESS] = {"compress", 'z', APP_OPT_FLAG, .help = "offer permessage-deflate"},
    [CO_TIMEOUT] = {"timeout", 't', APP_OPT_UINT, "MS", "10000", 1, 86400000,
                    .help = "connect and handshake within MS"},
    [CO_DNS_SERVER] = {"dns-server", 0, APP_OPT_STRING, "ADDR[:PORT]",
                       .help = "resolve the host with this DNS server (IPv6:\n"
                               "[ADDR]:PORT; comma-separated for several), not\n"
                               "the system's (/etc/resolv.conf); /etc/hosts is\n"
                               "read first either way"},
    [CO_HELP] = {"help", 'h', APP_OPT_FLAG, .flags = APP_OPT_CLI_ONLY, .help = "this text"},
};

static void usage(FILE *f) {
    fprintf(f,
            "usage: tern connect [options] URL\n"
            "\n"
            "An interactive WebSocket client: each line of stdin is sent as a message,\n"
            "each message received is printed on its own line. At the end of stdin\n"
            "(Ctrl-D) or on Ctrl-C it closes the connection with 1000 and waits for the\n"
            "server's close.\n"
            "\n"
            "URL: ws://host[:port]/path, wss://... (TLS), ws+unix:SOCKET[:/path]\n"
            "\n"
            "options:\n");
    app_opt_set s;
    if (app_opt_init(&s, "tern connect", connect_opts, CO_COUNT) == 0) {
        app_opt_help(&s, f);
        app_opt_free(&s);
    }
    fprintf(f,
            "\n"
            "exit status:\n"
            "  0  the connection closed normally (code 1000, from either side)\n"
            "  1  another error (out of memory)\n"
            "  2  bad usage (options, URL, header)\n"
            "  3  no connection: refused, name not resolved, unreachable, timed out\n"
            "  4  connected but the handshake failed: TLS (certificate verification),\n"
            "     an HTTP status other than 101, a wrong Sec-WebSocket-Accept, the\n"
            "     server closing or not answering during the handshake\n"
            "  5  the connection ended abnormally: without a close frame (1006), or\n"
            "     with a close code other than 1000\n");
}

/* ---- the connection --------------------------------------------------- */

static void send_line(client *cl, line *l) {
    if (cl->ws && !cl->closing)
        tern_ws_send(cl->ws, l->data, l->len, cl->opcode);
    free(l->data);
    free(l);
}

static void start_close(client *cl) {
    if (cl->ws && !cl->closing) {
        cl->closing = true;
        tern_ws_close(cl->ws, TERN_WS_NORMAL, NULL);
    }
}

static void on_open(tern_ws *ws, void *user) {
    client *cl = user;
    cl->ws = ws;
    const char *sub = tern_ws_subprotocol(ws);
    fprintf(stderr, "tern connect: open%s%s%s%s\n", sub ? " (subprotocol " : "", sub ? sub : "",
            sub ? ")" : "", tern_ws_compressed(ws) ? " (permessage-deflate)" : "");
    while (cl->pending) {
        line *l = cl->pending;
        cl->pending = l->next;
        send_line(cl, l);
    }
    cl->pending_tail = &cl->pending;
    if (cl->input_done)
        start_close(cl);
}

static void on_message(tern_ws *ws, const char *data, size_t len, int opcode, void *user) {
    fwrite(data, 1, len, stdout);
    fputc('\n', stdout);
    fflush(stdout);
}

static void on_close(tern_ws *ws, int code, const char *reason, size_t reason_len, void *user) {
    client *cl = user;
    cl->ws = NULL;
    cl->exit_code = code == TERN_WS_NORMAL ? EXIT_NORMAL : EXIT_ABNORMAL;
    fprintf(stderr, "tern connect: closed %d%s%.*s\n", code, reason_len ? " " : "",
            (int)reason_len, reason);
    tern_loop_stop(cl->loop);
}

static void on_connect_error(const tern_ws_connect_error *e, void *user) {
    client *cl = user;
    cl->exit_code = e->connected ? EXIT_HANDSHAKE : EXIT_CONNECT;
    fprintf(stderr, "tern connect: %s\n", e->message);
    tern_loop_stop(cl->loop);
}

/* ---- stdin ------------------------------------------------------------ */

/* The client, for the posted lines, and its loop: once the reader
 * thread runs, the loop lives as long as the process (the thread may be
 * blocked in stdin, and post, until the very end). */
static client *the_client;
static tern_loop *the_loop;

static void take_line(tern_loop *loop, void *user) {
    line *l = user;
    client *cl = the_client;
    if (l->data == NULL) {
        free(l);
        cl->input_done = true;
        start_close(cl);
        return;
    }
    if (cl->ws) {
        send_line(cl, l);
        return;
    }
    l->next = NULL;
    *cl->pending_tail = l;
    cl->pending_tail = &l->next;
}

static void *read_stdin(void *arg) {
    tern_loop *loop = arg;
    char *buf = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&buf, &cap, stdin)) >= 0) {
        if (n > 0 && buf[n - 1] == '\n')
            n--;
        line *l = calloc(1, sizeof(*l));
        char *copy = malloc((size_t)n + 1);
        if (l == NULL || copy == NULL) {
            free(l);
            free(copy);
            break;
        }
        memcpy(copy, buf, (size_t)n);
        l->data = copy;
        l->len = (size_t)n;
        if (tern_loop_post(loop, take_line, l) < 0) {
            free(copy);
            free(l);
            break;
        }
    }
    free(buf);
    line *end = calloc(1, sizeof(*end));
    if (end && tern_loop_post(loop, take_line, end) < 0)
        free(end);
    return NULL;
}

static void on_signal(tern_loop *loop, int signo, void *user) {
    client *cl = user;
    cl->input_done = true;
    if (cl->ws)
        start_close(cl);
    else {
        cl->exit_code = EXIT_ABNORMAL;
        tern_loop_stop(loop);
    }
}

/* ---- the command ------------------------------------------------------ */

int tern_app_connect(int argc, char **argv) {
    app_opt_set s;
    if (app_opt_init(&s, "tern connect", connect_opts, CO_COUNT) < 0)
        return EXIT_OTHER;
    tern_ws_client_options opt = {0};
    client cl = {.opcode = TERN_WS_TEXT, .exit_code = EXIT_ABNORMAL};
    cl.pending_tail = &cl.pending;
    int code = -1;
    const char *url = NULL;
    const char **headers = NULL, **subs = NULL;
    if (app_opt_parse_argv(&s, argc, argv) < 0) {
        fprintf(stderr, "tern connect: %s\n", s.err);
        usage(stderr);
        code = EXIT_USAGE;
    } else if (app_opt_uint(&s, CO_HELP)) {
        usage(stdout);
        code = EXIT_NORMAL;
    } else if (s.nargs != 1) {
        usage(stderr);
        code = EXIT_USAGE;
    } else {
        url = s.args[0];
        cl.opcode = app_opt_uint(&s, CO_BINARY) ? TERN_WS_BINARY : TERN_WS_TEXT;
        opt.insecure = app_opt_uint(&s, CO_INSECURE);
        opt.ca_file = app_opt_str(&s, CO_CA_FILE);
        opt.server_name = app_opt_str(&s, CO_SERVER_NAME);
        opt.ws.compression = app_opt_uint(&s, CO_COMPRESS);
        opt.dns_servers = app_opt_str(&s, CO_DNS_SERVER);
        opt.connect_timeout_ms = (uint32_t)app_opt_uint(&s, CO_TIMEOUT);
        /* NULL-terminated lists; the strings stay in s. */
        const app_opt_val *h = &s.vals[CO_HEADER], *p = &s.vals[CO_SUBPROTOCOL];
        headers = calloc((size_t)h->n + 1, sizeof(char *));
        subs = calloc((size_t)p->n + 1, sizeof(char *));
        if (headers == NULL || subs == NULL)
            code = EXIT_OTHER;
        for (int i = 0; code < 0 && i < h->n; i++)
            headers[i] = h->v[i];
        for (int i = 0; code < 0 && i < p->n; i++)
            subs[i] = p->v[i];
        opt.headers = h->n ? headers : NULL;
        opt.ws.subprotocols = p->n ? subs : NULL;
    }
    tern_loop *loop = NULL;
    if (code < 0 && tern_loop_new(&loop, NULL) < 0)
        code = EXIT_OTHER;
    the_loop = loop;
    if (code < 0) {
        signal(SIGPIPE, SIG_IGN);
        cl.loop = loop;
        the_client = &cl;
        tern_ws_handlers h = {.on_open = on_open,
                              .on_message = on_message,
                              .on_close = on_close,
                              .on_connect_error = on_connect_error};
        int err = tern_loop_on_signal(loop, SIGINT, on_signal, &cl);
        if (err < 0) {
            fprintf(stderr, "tern connect: SIGINT: %s\n", tern_strerror(err));
            code = EXIT_OTHER;
        } else if ((err = tern_ws_connect(loop, url, &h, &opt, &cl)) < 0) {
            fprintf(stderr, "tern connect: %s: %s\n", url, tern_strerror(err));
            code = err == -EINVAL ? EXIT_USAGE
                 : err == -ENOMEM ? EXIT_OTHER
                 : err == -EPROTO ? EXIT_USAGE   /* the CA file */
                                  : EXIT_CONNECT;
        }
    }
    bool reading = false;
    if (code < 0) {
        pthread_t t;
        reading = pthread_create(&t, NULL, read_stdin, loop) == 0;
        if (reading)
            pthread_detach(t);
        else
            code = EXIT_OTHER;
    }
    if (code < 0) {
        int err = tern_loop_run(loop);
        code = err < 0 ? EXIT_OTHER : cl.exit_code;
    }
    if (!reading && loop) {
        tern_loop_free(loop);
        the_loop = NULL;
    }
    fflush(stdout);
    /* The reader thread may still be blocked in stdin and post into the
     * loop: the loop is not freed, the process ends here. */
    free(headers);
    free(subs);
    app_opt_free(&s);
    while (cl.pending) {
        line *l = cl.pending;
        cl.pending = l->next;
        free(l->data);
        free(l);
    }
    return code;
}
