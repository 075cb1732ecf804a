/* Every public call with bad input: a clear error, never a crash (issue
 * #10). Runs a real loop for the calls that need a live request or
 * WebSocket. Each function's page in docs/api/ gives these errors in prose. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cmocka.h>

#include "tern/tern.h"

static void noop_handler(tern_http_req *req, void *user) {}
static void noop_timer(tern_timer *t, void *user) {}
static void noop_post(tern_loop *loop, void *user) {}
static void noop_signal(tern_loop *loop, int signo, void *user) {}

/* ---- without a loop running ------------------------------------------ */

static void loop_calls(void **state) {
    assert_int_equal(tern_loop_new(NULL, NULL), -EINVAL);
    tern_loop_free(NULL);
    assert_int_equal(tern_loop_run(NULL), -EINVAL);
    tern_loop_stop(NULL);
    assert_int_equal(tern_loop_stop_async(NULL), -EINVAL);
    assert_int_equal(tern_loop_post(NULL, noop_post, NULL), -EINVAL);
    assert_int_equal(tern_loop_now(NULL), 0);
    tern_loop *loop;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    assert_int_equal(tern_loop_post(loop, NULL, NULL), -EINVAL);
    tern_timer *t;
    assert_int_equal(tern_timer_start(NULL, &t, 1, 0, noop_timer, NULL), -EINVAL);
    assert_int_equal(tern_timer_start(loop, NULL, 1, 0, noop_timer, NULL), -EINVAL);
    assert_int_equal(tern_timer_start(loop, &t, 1, 0, NULL, NULL), -EINVAL);
    assert_int_equal(tern_timer_again(NULL, 1), -EINVAL);
    tern_timer_stop(NULL);
    assert_int_equal(tern_loop_on_signal(NULL, SIGUSR1, noop_signal, NULL), -EINVAL);
    assert_int_equal(tern_loop_on_signal(loop, SIGUSR1, NULL, NULL), -EINVAL);
    assert_int_equal(tern_loop_on_signal(loop, 0, noop_signal, NULL), -EINVAL);
    assert_int_equal(tern_loop_on_signal(loop, 999, noop_signal, NULL), -EINVAL);
    assert_int_equal(tern_loop_on_signal(loop, SIGKILL, noop_signal, NULL), -EINVAL);
    tern_loop_free(loop);
}

static void strerror_names_every_code(void **state) {
    static const int codes[] = {-EINVAL, -EALREADY, -ENOENT, -ERANGE, -ENOSPC, -EEXIST, -ENOMEM,
                                -EPIPE, -EBUSY, -ENOTCONN, -EBADF, -ENAMETOOLONG,
                                -EADDRINUSE, -EADDRNOTAVAIL, TERN_ENOHOST};
    for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++) {
        const char *s = tern_strerror(codes[i]);
        assert_non_null(s);
        assert_null(strstr(s, "Unknown error"));
    }
    assert_string_equal(tern_strerror(TERN_ENOHOST), "Host name does not resolve");
}

static void log_and_addr_calls(void **state) {
    assert_int_equal(tern_set_log(-1, NULL, NULL), -EINVAL);
    assert_int_equal(tern_set_log(4, NULL, NULL), -EINVAL);
    assert_int_equal(tern_set_log(TERN_LOG_DEBUG, NULL, NULL), 0);
    assert_null(tern_log_level_name(7));
    assert_string_equal(tern_log_level_name(TERN_LOG_WARN), "warn");

    char buf[TERN_ADDRSTRLEN];
    struct sockaddr_in in = {.sin_family = AF_INET, .sin_port = htons(80),
                             .sin_addr.s_addr = htonl(0x7f000001)};
    assert_int_equal(tern_addr_format(NULL, 0, buf, sizeof(buf)), -EINVAL);
    assert_int_equal(tern_addr_format((struct sockaddr *)&in, sizeof(in), NULL, 0), -EINVAL);
    assert_int_equal(tern_addr_format((struct sockaddr *)&in, 2, buf, sizeof(buf)), -EINVAL);
    assert_int_equal(tern_addr_format((struct sockaddr *)&in, sizeof(in), buf, 4), -ENOSPC);
    assert_int_equal(tern_addr_format((struct sockaddr *)&in, sizeof(in), buf, sizeof(buf)), 12);
    assert_string_equal(buf, "127.0.0.1:80");
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    assert_int_equal(tern_addr_format((struct sockaddr *)&un, sizeof(sa_family_t), buf,
                                      sizeof(buf)), 5);
    assert_string_equal(buf, "unix:");
    struct sockaddr bad = {.sa_family = AF_APPLETALK};
    assert_int_equal(tern_addr_format(&bad, sizeof(bad), buf, sizeof(buf)), -EINVAL);
}

static void server_calls(void **state) {
    tern_loop *loop;
    tern_server *srv;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    assert_int_equal(tern_server_new(NULL, loop, NULL), -EINVAL);
    assert_int_equal(tern_server_new(&srv, NULL, NULL), -EINVAL);
    assert_int_equal(tern_server_new(&srv, loop, &(tern_server_options){.max_headers = 257}), -EINVAL);
    assert_int_equal(tern_server_new(&srv, loop, &(tern_server_options){.server_header = "a\r\nb"}),
                     -EINVAL);
    char longname[80];
    memset(longname, 'n', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    assert_int_equal(tern_server_new(&srv, loop, &(tern_server_options){.server_header = longname}),
                     -EINVAL);
    tern_server_free(NULL);
    assert_null(tern_server_loop(NULL));
    assert_int_equal(tern_server_port(NULL), -EINVAL);
    assert_int_equal(tern_server_connections(NULL), 0);
    tern_server_shutdown(NULL, NULL, NULL);
    assert_int_equal(tern_server_new(&srv, loop, NULL), 0);

    /* listening */
    assert_int_equal(tern_listen(NULL, "127.0.0.1", 0, NULL), -EINVAL);
    assert_int_equal(tern_listen(srv, "127.0.0.1", -1, NULL), -EINVAL);
    assert_int_equal(tern_listen(srv, "127.0.0.1", 65536, NULL), -EINVAL);
    assert_int_equal(tern_listen(srv, "127.0.0.1", 0, &(tern_listen_options){.backlog = -1}), -EINVAL);
    assert_int_equal(tern_listen(srv, "127.0.0.1", 0, &(tern_listen_options){.sndbuf = -1}), -EINVAL);
    assert_int_equal(tern_listen(srv, "no-such-host.invalid", 0, NULL), TERN_ENOHOST);
    assert_int_equal(tern_listen(srv, "192.0.2.1", 0, NULL), -EADDRNOTAVAIL);   /* not ours */
    assert_int_equal(tern_server_port(srv), -ENOENT);
    assert_int_equal(tern_listen_unix(NULL, "/tmp/x.sock", NULL), -EINVAL);
    assert_int_equal(tern_listen_unix(srv, NULL, NULL), -EINVAL);
    assert_int_equal(tern_listen_unix(srv, "", NULL), -EINVAL);
    char longpath[200];
    memset(longpath, 'p', sizeof(longpath) - 1);
    longpath[0] = '/';
    longpath[sizeof(longpath) - 1] = '\0';
    assert_int_equal(tern_listen_unix(srv, longpath, NULL), -ENAMETOOLONG);

    /* routes */
    assert_int_equal(tern_http_route(NULL, "GET", "/a", noop_handler, NULL), -EINVAL);
    assert_int_equal(tern_http_route(srv, "GET", NULL, noop_handler, NULL), -EINVAL);
    assert_int_equal(tern_http_route(srv, "GET", "/a", NULL, NULL), -EINVAL);
    static const char *const bad_patterns[] = {"", "a", "/q?x=1", "/star*", "/*/x", "/a#b",
                                               "/a b", "/:", "/:a/:a", "/caf\xc3\xa9"};
    for (size_t i = 0; i < sizeof(bad_patterns) / sizeof(bad_patterns[0]); i++)
        assert_int_equal(tern_http_route(srv, "GET", bad_patterns[i], noop_handler, NULL), -EINVAL);
    static const char *const bad_methods[] = {"", "get", "G T", "GET\r\n", "G(T",
                                              "ABCDEFGHIJKLMNOPQRSTUVWXYZABCDEFG"};
    for (size_t i = 0; i < sizeof(bad_methods) / sizeof(bad_methods[0]); i++)
        assert_int_equal(tern_http_route(srv, bad_methods[i], "/a", noop_handler, NULL), -EINVAL);
    assert_int_equal(tern_http_route(srv, "GET", "/a", noop_handler, NULL), 0);
    assert_int_equal(tern_http_route(srv, "GET", "/a", noop_handler, NULL), -EEXIST);
    assert_int_equal(tern_http_route_stream(NULL, "POST", "/a", noop_handler, NULL), -EINVAL);
    assert_int_equal(tern_http_route_stream(srv, "post", "/a", noop_handler, NULL), -EINVAL);
    assert_int_equal(tern_http_static(NULL, "/", "."), -EINVAL);
    assert_int_equal(tern_http_static(srv, NULL, "."), -EINVAL);
    assert_int_equal(tern_http_static(srv, "/", NULL), -EINVAL);
    assert_int_equal(tern_http_static(srv, "files", "."), -EINVAL);
    assert_int_equal(tern_http_static(srv, "/s", "/no/such/dir"), -ENOENT);
    assert_int_equal(tern_http_not_found(NULL, noop_handler, NULL), -EINVAL);
    assert_int_equal(tern_server_set_access_log(NULL, NULL, NULL), -EINVAL);

    /* WebSocket routes and their options */
    tern_ws_handlers h = {0};
    assert_int_equal(tern_ws_route(NULL, "/ws", &h, NULL, NULL), -EINVAL);
    assert_int_equal(tern_ws_route(srv, NULL, &h, NULL, NULL), -EINVAL);
    assert_int_equal(tern_ws_route(srv, "/ws", NULL, NULL, NULL), -EINVAL);
    assert_int_equal(tern_ws_route(srv, "/ws?x", &h, NULL, NULL), -EINVAL);
    static const char *const empty_proto[] = {"ok", "", NULL};
    static const char *const spaced_proto[] = {"a b", NULL};
    const tern_ws_options bad_opts[] = {
        {.slow_policy = 42},
        {.slow_policy = -1},
        {.server_max_window_bits = 3},
        {.server_max_window_bits = 16},
        {.compression_mem_level = 12},
        {.compression_mem_level = -1},
        {.backlog_soft = 2048, .backlog_hard = 1024},
        {.subprotocols = empty_proto},
        {.subprotocols = spaced_proto},
    };
    for (size_t i = 0; i < sizeof(bad_opts) / sizeof(bad_opts[0]); i++)
        if (tern_ws_route(srv, "/ws", &h, &bad_opts[i], NULL) != -EINVAL)
            fail_msg("ws option set %zu taken", i);
    assert_int_equal(tern_ws_route(srv, "/ws", &h, &(tern_ws_options){.server_max_window_bits = 9,
                                                   .compression_mem_level = 9}, NULL), 0);
    assert_int_equal(tern_ws_serve("127.0.0.1", 0, NULL, NULL), -EINVAL);
    assert_int_equal(tern_ws_serve("127.0.0.1", 70000, &h, NULL), -EINVAL);

    /* prepared messages */
    assert_null(tern_ws_prepare(NULL, 5, TERN_WS_TEXT, false));
    assert_null(tern_ws_prepare("x", 1, 9, false));
    tern_ws_prepared_free(NULL);

    /* answering later, deadlines */
    tern_ws_ref(NULL);
    tern_ws_unref(NULL);
    assert_false(tern_ws_is_open(NULL));
    assert_int_equal(tern_ws_close_error(NULL), 0);
    assert_int_equal(tern_http_close_error(NULL), 0);
    assert_int_equal(tern_ws_set_deadline(NULL, 100), -EINVAL);

    tern_server_free(srv);
    tern_loop_free(loop);
}

/* ---- on a live request ------------------------------------------------- */

/* What the handler saw; checked after the loop returns. */
static struct {
    int ran;
    int add_null_name, add_null_value, add_crlf_value, add_nul_split, add_bad_name, add_colon_name;
    int respond_null, respond_status_99, respond_status_1000, respond_null_body, respond_ctype_crlf;
    int start_null, write_null, write_before_start, end_before_start, end_null;
    int param_int_null, param_int_missing, query_param_null_buf, query_param_null_name;
    int peer_null_addr, peer_null_req;
    int respond_ok, respond_again, start_again, file_again, add_after;
    int write_after, end_after;
    const char *null_views;
    int file_bad_fd;
} R;

static void bad_handler(tern_http_req *req, void *user) {
    R.ran = 1;
    /* accessors: NULL req, NULL len */
    size_t len = 99;
    if (tern_http_method(NULL, &len) || len != 0 || tern_http_path(NULL, NULL) ||
        tern_http_query(NULL, NULL) || tern_http_header(NULL, "Host", NULL) ||
        tern_http_header(req, NULL, &len) || tern_http_param(NULL, "x", NULL) ||
        tern_http_param(req, NULL, NULL) || tern_http_header_count(NULL) != 0 ||
        tern_http_req_loop(NULL) || tern_http_req_server(NULL) || tern_http_req_user(NULL) ||
        tern_http_buffered(NULL) != 0 || tern_http_minor_version(NULL) != -EINVAL ||
        tern_http_peer_cert(NULL, NULL, 0) != -EINVAL ||
        tern_http_peer_cert(req, NULL, 8) != -EINVAL || tern_http_peer_cert(req, NULL, 0) != 0 ||
        tern_http_is_tls(NULL) || tern_http_is_tls(req) || tern_http_sni(NULL, &len) ||
        len != 0 || tern_http_sni(req, NULL) || tern_http_sni(req, &len) || len != 0)
        R.null_views = "a NULL req or name gave something";
    /* The views are not NUL-terminated (the param "x" runs on into
     * "?q=1 HTTP/1.1..."): a NULL len gets NULL, never a view that %s
     * would read past its end (issue #25). */
    if (tern_http_method(req, NULL) || tern_http_path(req, NULL) || tern_http_query(req, NULL) ||
        tern_http_header(req, "Host", NULL) || tern_http_param(req, "id", NULL) ||
        tern_http_body(req, NULL))
        R.null_views = "a NULL len got a view that is not NUL-terminated";
    const char *pv = tern_http_param(req, "id", &len);
    if (pv == NULL || len != 1 || pv[0] != 'x' || tern_http_header(req, "Host", &len) == NULL ||
        len != 1 || tern_http_query(req, &len) == NULL || len != 3)
        R.null_views = "a len given lost the view";
    const char *hn = "?", *hv = "?";
    size_t hnl = 99, hvl = 99;
    tern_http_header_at(req, 0, &hn, NULL, &hv, NULL);
    if (hn != NULL || hv != NULL)
        R.null_views = "tern_http_header_at with NULL lengths gave views";
    tern_http_header_at(req, 0, &hn, &hnl, &hv, &hvl);
    if (hn == NULL || hnl != 4 || hv == NULL || hvl != 1)
        R.null_views = "tern_http_header_at with lengths lost the views";
    tern_http_header_at(NULL, 0, &hn, NULL, &hv, NULL);
    tern_http_header_at(req, 999, NULL, NULL, NULL, NULL);
    tern_http_req_set_user(NULL, NULL);
    tern_http_on_abort(NULL, NULL, NULL);
    tern_http_on_drain(NULL, NULL, NULL);
    tern_http_read_body(NULL, NULL, NULL);
    tern_http_read_body(req, NULL, NULL);
    int64_t v;
    R.param_int_null = tern_http_param_int(NULL, "id", &v) == -EINVAL &&
                       tern_http_param_int(req, NULL, &v) == -EINVAL &&
                       tern_http_param_int(req, "id", NULL) == -EINVAL;
    R.param_int_missing = tern_http_param_int(req, "nope", &v);
    char buf[8];
    R.query_param_null_buf = (int)tern_http_query_param(req, "q", NULL, 8);
    R.query_param_null_name = (int)tern_http_query_param(req, NULL, buf, sizeof(buf));
    struct sockaddr_storage ss;
    socklen_t sl;
    R.peer_null_addr = tern_http_peer(req, NULL, &sl);
    R.peer_null_req = tern_http_peer(NULL, &ss, &sl);

    /* headers */
    R.add_null_name = tern_http_add_header(req, NULL, "v");
    R.add_null_value = tern_http_add_header(req, "X-A", NULL);
    R.add_crlf_value = tern_http_add_header(req, "X-A", "v\r\nSet-Cookie: evil");
    R.add_nul_split = tern_http_add_header(req, "X-A", "v\x01");
    R.add_bad_name = tern_http_add_header(req, "X A", "v");
    R.add_colon_name = tern_http_add_header(req, "X:A", "v");

    /* the response: bad arguments first, then order */
    R.respond_null = tern_http_respond(NULL, 200, NULL, "", 0);
    R.respond_status_99 = tern_http_respond(req, 99, NULL, "", 0);
    R.respond_status_1000 = tern_http_respond(req, 1000, NULL, "", 0);
    R.respond_null_body = tern_http_respond(req, 200, NULL, NULL, 5);
    R.respond_ctype_crlf = tern_http_respond(req, 200, "text/plain\r\nX: y", "", 0);
    R.start_null = tern_http_start(NULL, 200, NULL);
    R.write_null = tern_http_write(NULL, "x", 1);
    R.write_before_start = tern_http_write(req, "x", 1);
    R.end_before_start = tern_http_end(req);
    R.end_null = tern_http_end(NULL);
    R.file_bad_fd = tern_http_respond_file(req, 200, NULL, -1, 0, 0);

    R.respond_ok = tern_http_respond(req, 200, "text/plain", "ok", 2);
    R.respond_again = tern_http_respond(req, 200, NULL, "", 0);
    R.start_again = tern_http_start(req, 200, NULL);
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    R.file_again = tern_http_respond_file(req, 200, NULL, fd, 0, 0);   /* takes fd */
    R.add_after = tern_http_add_header(req, "X-Late", "v");
    R.write_after = tern_http_write(req, "x", 1);
    R.end_after = tern_http_end(req);
    tern_loop_stop(tern_http_req_loop(req));
}

static int connect_to(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(0x7f000001)};
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

static void request_calls(void **state) {
    tern_loop *loop;
    tern_server *srv;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    assert_int_equal(tern_server_new(&srv, loop, NULL), 0);
    assert_int_equal(tern_http_route(srv, "GET", "/r/:id", bad_handler, NULL), 0);
    assert_int_equal(tern_listen(srv, "127.0.0.1", 0, NULL), 0);
    int fd = connect_to(tern_server_port(srv));
    const char req[] = "GET /r/x?q=1 HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_int_equal(write(fd, req, sizeof(req) - 1), (ssize_t)sizeof(req) - 1);
    memset(&R, 0, sizeof(R));
    assert_int_equal(tern_loop_run(loop), 0);
    assert_int_equal(R.ran, 1);
    if (R.null_views)
        fail_msg("%s", R.null_views);
    assert_true(R.param_int_null);
    assert_int_equal(R.param_int_missing, -ENOENT);
    assert_int_equal(R.query_param_null_buf, -EINVAL);
    assert_int_equal(R.query_param_null_name, -EINVAL);
    assert_int_equal(R.peer_null_addr, -EINVAL);
    assert_int_equal(R.peer_null_req, -EINVAL);
    assert_int_equal(R.add_null_name, -EINVAL);
    assert_int_equal(R.add_null_value, -EINVAL);
    assert_int_equal(R.add_crlf_value, -EINVAL);
    assert_int_equal(R.add_nul_split, -EINVAL);
    assert_int_equal(R.add_bad_name, -EINVAL);
    assert_int_equal(R.add_colon_name, -EINVAL);
    assert_int_equal(R.respond_null, -EINVAL);
    assert_int_equal(R.respond_status_99, -EINVAL);
    assert_int_equal(R.respond_status_1000, -EINVAL);
    assert_int_equal(R.respond_null_body, -EINVAL);
    assert_int_equal(R.respond_ctype_crlf, -EINVAL);
    assert_int_equal(R.start_null, -EINVAL);
    assert_int_equal(R.write_null, -EINVAL);
    assert_int_equal(R.write_before_start, -EINVAL);
    assert_int_equal(R.end_before_start, -EINVAL);
    assert_int_equal(R.end_null, -EINVAL);
    assert_int_equal(R.file_bad_fd, -EBADF);
    assert_true(R.respond_ok >= 0);
    assert_int_equal(R.respond_again, -EALREADY);
    assert_int_equal(R.start_again, -EALREADY);
    assert_int_equal(R.file_again, -EALREADY);
    assert_int_equal(R.add_after, -EALREADY);
    assert_int_equal(R.write_after, -EALREADY);
    assert_int_equal(R.end_after, -EALREADY);
    close(fd);
    tern_server_free(srv);
    tern_loop_free(loop);
}

/* ---- on a live WebSocket ------------------------------------------------ */

static struct {
    int ran;
    int send_null_ws, send_null_data, send_bad_opcode, frag_null, frag_bad_opcode;
    int ping_null, ping_long, ping_null_data, close_null, close_bad_code, close_long_reason;
    int prepared_null_ws, prepared_null_msg, peer_null;
    const char *accessors;
} W;

static void ws_open(tern_ws *ws, void *user) {
    W.ran = 1;
    W.send_null_ws = tern_ws_send(NULL, "x", 1, TERN_WS_TEXT);
    W.send_null_data = tern_ws_send(ws, NULL, 3, TERN_WS_TEXT);
    W.send_bad_opcode = tern_ws_send(ws, "x", 1, 9);
    W.frag_null = tern_ws_send_fragment(NULL, "x", 1, TERN_WS_TEXT, true);
    W.frag_bad_opcode = tern_ws_send_fragment(ws, "x", 1, 0, true);
    W.ping_null = tern_ws_ping(NULL, NULL, 0);
    char big[200] = {0};
    W.ping_long = tern_ws_ping(ws, big, sizeof(big));
    W.ping_null_data = tern_ws_ping(ws, NULL, 4);
    W.close_null = tern_ws_close(NULL, 1000, NULL);
    W.close_bad_code = tern_ws_close(ws, 999, NULL);
    char reason[130];
    memset(reason, 'r', sizeof(reason) - 1);
    reason[sizeof(reason) - 1] = '\0';
    W.close_long_reason = tern_ws_close(ws, 1000, reason);
    tern_ws_prepared *m = tern_ws_prepare("x", 1, TERN_WS_TEXT, false);
    W.prepared_null_ws = tern_ws_send_prepared(NULL, m);
    W.prepared_null_msg = tern_ws_send_prepared(ws, NULL);
    tern_ws_prepared_free(m);
    struct sockaddr_storage ss;
    socklen_t sl;
    W.peer_null = tern_ws_peer(NULL, &ss, &sl);
    tern_ws_set_user(NULL, NULL);
    if (tern_ws_buffered(NULL) || tern_ws_user(NULL) || tern_ws_subprotocol(NULL) ||
        tern_ws_compressed(NULL) || tern_ws_loop(NULL))
        W.accessors = "an accessor of a NULL ws gave something";
    if (tern_ws_peer(ws, &ss, &sl) != 0 || ss.ss_family != AF_INET)
        W.accessors = "no peer";
    tern_loop_stop(tern_ws_loop(ws));
}

static void ws_calls(void **state) {
    tern_loop *loop;
    tern_server *srv;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    assert_int_equal(tern_server_new(&srv, loop, NULL), 0);
    tern_ws_handlers h = {.on_open = ws_open};
    assert_int_equal(tern_ws_route(srv, "/ws", &h, NULL, NULL), 0);
    assert_int_equal(tern_listen(srv, "127.0.0.1", 0, NULL), 0);
    int fd = connect_to(tern_server_port(srv));
    const char req[] = "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                       "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                       "Sec-WebSocket-Version: 13\r\n\r\n";
    assert_int_equal(write(fd, req, sizeof(req) - 1), (ssize_t)sizeof(req) - 1);
    memset(&W, 0, sizeof(W));
    assert_int_equal(tern_loop_run(loop), 0);
    assert_int_equal(W.ran, 1);
    if (W.accessors)
        fail_msg("%s", W.accessors);
    assert_int_equal(W.send_null_ws, -EINVAL);
    assert_int_equal(W.send_null_data, -EINVAL);
    assert_int_equal(W.send_bad_opcode, -EINVAL);
    assert_int_equal(W.frag_null, -EINVAL);
    assert_int_equal(W.frag_bad_opcode, -EINVAL);
    assert_int_equal(W.ping_null, -EINVAL);
    assert_int_equal(W.ping_long, -EINVAL);
    assert_int_equal(W.ping_null_data, -EINVAL);
    assert_int_equal(W.close_null, -EINVAL);
    assert_int_equal(W.close_bad_code, -EINVAL);
    assert_int_equal(W.close_long_reason, -EINVAL);
    assert_int_equal(W.prepared_null_ws, -EINVAL);
    assert_int_equal(W.prepared_null_msg, -EINVAL);
    assert_int_equal(W.peer_null, -EINVAL);
    close(fd);
    tern_server_free(srv);
    tern_loop_free(loop);
}

/* ---- TLS and tern_run -------------------------------------------------- */

static int setup_nothing(tern_server *srv, void *user) { return 0; }

static void noop_connect_error(const tern_ws_connect_error *e, void *user) {}

static void client_calls(void **state) {
    tern_loop *loop;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    tern_ws_handlers h = {.on_connect_error = noop_connect_error};
    const char *url = "ws://127.0.0.1:1/";
    assert_int_equal(tern_ws_connect(NULL, url, &h, NULL, NULL), -EINVAL);
    assert_int_equal(tern_ws_connect(loop, NULL, &h, NULL, NULL), -EINVAL);
    assert_int_equal(tern_ws_connect(loop, url, NULL, NULL, NULL), -EINVAL);
    tern_ws_handlers none = {0};
    assert_int_equal(tern_ws_connect(loop, url, &none, NULL, NULL), -EINVAL);
    assert_int_equal(tern_ws_connect(loop, "http://127.0.0.1/", &h, NULL, NULL), -EINVAL);
    tern_ws_client_options o = {.ws = {.slow_policy = 42}};
    assert_int_equal(tern_ws_connect(loop, url, &h, &o, NULL), -EINVAL);
    const char *const bad_sub[] = {"a b", NULL};
    o = (tern_ws_client_options){.ws = {.subprotocols = bad_sub}};
    assert_int_equal(tern_ws_connect(loop, url, &h, &o, NULL), -EINVAL);
    const char *const reserved[] = {"Host: x", NULL};
    o = (tern_ws_client_options){.headers = reserved};
    assert_int_equal(tern_ws_connect(loop, url, &h, &o, NULL), -EINVAL);
    o = (tern_ws_client_options){.ca_file = "/nonexistent/ca.pem"};
    assert_int_equal(tern_ws_connect(loop, "wss://127.0.0.1:1/", &h, &o, NULL), -EPROTO);
    assert_int_equal(tern_ws_connect(loop, "ws+unix:/nonexistent/t.sock", &h, NULL, NULL),
                     -ENOENT);
    o = (tern_ws_client_options){.dns_servers = "not an address"};
    assert_int_equal(tern_ws_connect(loop, "ws://example.invalid/", &h, &o, NULL), -EINVAL);
    tern_ws_connecting *c = (tern_ws_connecting *)1;
    assert_int_equal(tern_ws_connect2(loop, url, &h, NULL, NULL, NULL), -EINVAL);
    assert_int_equal(tern_ws_connect2(loop, "http://127.0.0.1/", &h, NULL, NULL, &c), -EINVAL);
    assert_null(c);
    tern_ws_connect_cancel(NULL);
    tern_loop_free(loop);
}

static void tls_and_run_calls(void **state) {
    tern_tls *tls = (tern_tls *)1;
    assert_int_equal(tern_tls_new(NULL, "c", "k"), -EINVAL);
    assert_int_equal(tern_tls_new(&tls, NULL, "k"), -EINVAL);
    assert_null(tls);
    assert_int_equal(tern_tls_new(&tls, "/nonexistent/cert.pem", "/nonexistent/key.pem"), -ENOENT);
    assert_null(tls);
    /* Readable files that are no PEM certificate: OpenSSL refuses them. */
    char junk[] = "/tmp/tern-api-errors-XXXXXX";
    int fd = mkstemp(junk);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "not a certificate\n", 18), 18);
    close(fd);
    assert_int_equal(tern_tls_new(&tls, junk, junk), -EPROTO);
    unlink(junk);
    /* Options: one passphrase source at most; a passphrase file that
     * cannot be read is said at once. */
    tern_tls_options to = {.passphrase = (int (*)(char *, size_t, void *))1,
                           .passphrase_file = "/nonexistent/pass"};
    assert_int_equal(tern_tls_new_opt(NULL, "c", "k", NULL), -EINVAL);
    assert_int_equal(tern_tls_new_opt(&tls, "c", "k", &to), -EINVAL);
    assert_null(tls);
    to.passphrase = NULL;
    assert_int_equal(tern_tls_new_opt(&tls, "c", "k", &to), -ENOENT);
    assert_null(tls);
    assert_int_equal(tern_tls_add_cert(NULL, "c", "k"), -EINVAL);
    assert_int_equal(tern_tls_reload(NULL), -EINVAL);
    tern_tls_free(NULL);

    tern_loop *loop;
    tern_server *srv;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    assert_int_equal(tern_server_new(&srv, loop, NULL), 0);
    assert_int_equal(tern_listen_tls(NULL, "127.0.0.1", 0, (tern_tls *)1, NULL), -EINVAL);
    assert_int_equal(tern_listen_tls(srv, "127.0.0.1", 0, NULL, NULL), -EINVAL);
    assert_int_equal(tern_listen_tls(srv, "127.0.0.1", 70000, (tern_tls *)1, NULL), -EINVAL);
    assert_int_equal(tern_server_tls_port(NULL), -EINVAL);
    assert_int_equal(tern_server_tls_port(srv), -ENOENT);
    tern_server_free(srv);
    tern_loop_free(loop);

    assert_int_equal(tern_run(1, NULL, NULL, NULL), -EINVAL);
    assert_int_equal(tern_run(-1, NULL, setup_nothing, NULL), -EINVAL);
    assert_int_equal(tern_run(100000, NULL, setup_nothing, NULL), -EINVAL);
    assert_int_equal(tern_run_stop(NULL), -EINVAL);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(loop_calls),
        cmocka_unit_test(strerror_names_every_code),
        cmocka_unit_test(log_and_addr_calls),
        cmocka_unit_test(server_calls),
        cmocka_unit_test(request_calls),
        cmocka_unit_test(ws_calls),
        cmocka_unit_test(client_calls),
        cmocka_unit_test(tls_and_run_calls),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
