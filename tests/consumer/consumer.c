/* A program that uses tern the way an application does: only the installed
 * public headers and the library, built by scripts/test-consumer.sh through
 * pkg-config (shared and static), find_package(tern) and add_subdirectory.
 *
 * It serves GET /ping on 127.0.0.1 (port 0), asks for it itself over a raw
 * socket (connected before the loop runs; a timer polls for the answer),
 * checks the answer and exits 0. */
#define _POSIX_C_SOURCE 200809L
#ifdef _GNU_SOURCE
#error "_GNU_SOURCE leaked from tern's build into the consumer"
#endif

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <tern/tern.h>

struct client {
    int fd;
    char buf[1024];
    size_t len;
    int ticks;
    int ok;
    tern_loop *loop;
};

static void ping(tern_http_req *req, void *user) {
    (void)user;
    tern_http_respond(req, 200, "text/plain", "pong", 4);
}

/* Every 10 ms: read what came; stop once the whole answer is in, or after 5 s. */
static void poll_answer(tern_timer *timer, void *user) {
    struct client *c = user;
    ssize_t n = recv(c->fd, c->buf + c->len, sizeof(c->buf) - 1 - c->len, MSG_DONTWAIT);
    if (n > 0) {
        c->len += (size_t)n;
        c->buf[c->len] = '\0';
    }
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) || ++c->ticks > 500 ||
        strstr(c->buf, "\r\n\r\npong")) {
        c->ok = strncmp(c->buf, "HTTP/1.1 200 ", 13) == 0 && strstr(c->buf, "\r\n\r\npong") != NULL;
        tern_timer_stop(timer);
        tern_loop_stop(c->loop);
    }
}

static int fail(const char *what, int err) {
    fprintf(stderr, "consumer: %s: %s\n", what, tern_strerror(err));
    return 1;
}

int main(void) {
    tern_loop *loop;
    tern_server *srv;
    tern_timer *timer;
    struct client c = {.fd = -1};
    int err, port;

    if (strcmp(tern_strerror(-EINVAL), "") == 0)
        return fail("tern_strerror", -EINVAL);
    if ((err = tern_loop_new(&loop, NULL)) < 0)
        return fail("tern_loop_new", err);
    if ((err = tern_server_new(&srv, loop, NULL)) < 0)
        return fail("tern_server_new", err);
    if ((err = tern_http_route(srv, "GET", "/ping", ping, NULL)) < 0)
        return fail("tern_http_route", err);
    if ((err = tern_listen(srv, "127.0.0.1", 0, NULL)) < 0)
        return fail("tern_listen", err);
    if ((port = tern_server_port(srv)) <= 0)
        return fail("tern_server_port", port);

    /* The kernel completes the handshake and keeps the request until the
     * loop accepts it. */
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    static const char req[] = "GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    c.fd = socket(AF_INET, SOCK_STREAM, 0);
    if (c.fd < 0 || connect(c.fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
        send(c.fd, req, sizeof(req) - 1, 0) != (ssize_t)(sizeof(req) - 1)) {
        perror("consumer: client");
        return 1;
    }
    c.loop = loop;
    if ((err = tern_timer_start(loop, &timer, 10, 10, poll_answer, &c)) < 0)
        return fail("tern_timer_start", err);
    if ((err = tern_loop_run(loop)) < 0)
        return fail("tern_loop_run", err);
    close(c.fd);
    tern_server_free(srv);
    tern_loop_free(loop);
    if (!c.ok) {
        fprintf(stderr, "consumer: unexpected answer:\n%s\n", c.buf);
        return 1;
    }
    printf("consumer: tern %s on port %d answered pong\n", TERN_VERSION, port);
    return 0;
}
