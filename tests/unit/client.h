/* Raw clients for the C tests that drive a real server on the loop: a
 * connected socket, a request written whole, then non-blocking reads. */
#ifndef TERN_TEST_CLIENT_H
#define TERN_TEST_CLIENT_H

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Connects to 127.0.0.1:port (with a receive buffer of rcvbuf bytes when
 * rcvbuf > 0), writes req and makes the socket non-blocking. */
static inline int client_send_rcvbuf(int port, int rcvbuf, const char *req) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    if (rcvbuf > 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    fcntl(fd, F_SETFL, O_NONBLOCK);
    return fd;
}

/* A WebSocket upgrade to /ws; the 101 is left for the test to read (or,
 * for a client that never reads, to lie there). */
static inline int client_open(int port, int rcvbuf) {
    return client_send_rcvbuf(port, rcvbuf,
                              "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                              "Connection: Upgrade\r\n"
                              "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                              "Sec-WebSocket-Version: 13\r\n\r\n");
}

/* Reads and throws away whatever has arrived; returns the byte count. */
static inline size_t client_drain(int fd) {
    char buf[65536];
    size_t total = 0;
    ssize_t r;
    while ((r = read(fd, buf, sizeof(buf))) > 0)
        total += (size_t)r;
    return total;
}

/* Reads the answer to a request sent with Connection: close until the
 * server closes (2 KiB at most), closes fd, and copies the body (what
 * follows the head) into body; "" when there is no head. */
static inline void client_read_body(int fd, char *body, size_t cap) {
    char buf[2048];
    size_t len = 0;
    ssize_t r;
    while (len < sizeof(buf) - 1 && (r = read(fd, buf + len, sizeof(buf) - 1 - len)) > 0)
        len += (size_t)r;
    buf[len] = '\0';
    close(fd);
    const char *b = strstr(buf, "\r\n\r\n");
    snprintf(body, cap, "%s", b ? b + 4 : "");
}

#endif
