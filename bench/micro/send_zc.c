/* Does io_uring's zero-copy send (IORING_OP_SEND_ZC) pay for tern's
 * sends? One TCP connection over loopback: a thread receives and discards,
 * the main thread sends messages of one size through io_uring, one in
 * flight (as tern's back end does), either IORING_OP_SEND (the kernel
 * copies the bytes) or IORING_OP_SEND_ZC (the pages are lent to the
 * socket; the buffer is reused only after the kernel's notification).
 * Prints the sending thread's CPU per MiB and the rate, for each size.
 *
 *   cc -O2 -o /tmp/send_zc bench/micro/send_zc.c -luring -lpthread
 *   taskset -c 0 /tmp/send_zc [seconds per cell, default 3]
 *
 * (The receiver is left unpinned, as a peer on another core would be.) */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <liburing.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *drain(void *arg) {
    int fd = *(int *)arg;
    static char buf[1 << 20];
    while (recv(fd, buf, sizeof(buf), 0) > 0)
        ;
    return NULL;
}

static void die(const char *what) {
    perror(what);
    exit(1);
}

/* Sends for `secs` seconds; returns bytes sent, and the thread's CPU. */
static double run(size_t size, int zc, double secs, double *cpu) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    if (bind(l, (struct sockaddr *)&a, sizeof(a)) || listen(l, 1) ||
        getsockname(l, (struct sockaddr *)&a, &al))
        die("listen");
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (struct sockaddr *)&a, sizeof(a)))
        die("connect");
    int s = accept(l, NULL, NULL);
    pthread_t t;
    pthread_create(&t, NULL, drain, &s);

    struct io_uring ring;
    if (io_uring_queue_init(8, &ring, 0) < 0)
        die("ring");
    char *buf = malloc(size);
    memset(buf, 'x', size);
    double sent = 0, t0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_THREAD_CPUTIME_ID);
    while (now(CLOCK_MONOTONIC) - t0 < secs) {
        size_t off = 0;
        while (off < size) {
            struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
            if (zc)
                io_uring_prep_send_zc(sqe, c, buf + off, size - off, MSG_NOSIGNAL, 0);
            else
                io_uring_prep_send(sqe, c, buf + off, size - off, MSG_NOSIGNAL);
            io_uring_submit(&ring);
            /* The result; with SEND_ZC a notification follows (F_MORE),
             * after which the buffer may be written again. */
            int res = 0;
            int got_res = 0, want_notif = 0, got_notif = 0;
            do {
                struct io_uring_cqe *cqe;
                if (io_uring_wait_cqe(&ring, &cqe) < 0)
                    die("wait");
                if (cqe->flags & IORING_CQE_F_NOTIF) {
                    got_notif = 1;
                } else {
                    res = cqe->res;
                    got_res = 1;
                    want_notif = (cqe->flags & IORING_CQE_F_MORE) != 0;
                }
                io_uring_cqe_seen(&ring, cqe);
            } while (!got_res || (want_notif && !got_notif));
            if (res < 0) {
                fprintf(stderr, "send: %s\n", strerror(-res));
                exit(1);
            }
            off += (size_t)res;
        }
        sent += size;
    }
    *cpu = now(CLOCK_THREAD_CPUTIME_ID) - c0;
    double wall = now(CLOCK_MONOTONIC) - t0;
    shutdown(c, SHUT_WR);
    pthread_join(t, NULL);
    io_uring_queue_exit(&ring);
    close(c);
    close(s);
    close(l);
    free(buf);
    return sent / wall;
}

int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 3.0;
    size_t sizes[] = {4096, 16384, 65536, 262144, 1 << 20};
    printf("| message | send: µs CPU/MiB | send: MiB/s | send_zc: µs CPU/MiB | send_zc: MiB/s "
           "| zc ÷ send (CPU) |\n|---:|---:|---:|---:|---:|---:|\n");
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        double cpu[2], rate[2];
        for (int zc = 0; zc < 2; zc++)
            rate[zc] = run(sizes[i], zc, secs, &cpu[zc]) / (1 << 20);
        double per[2] = {cpu[0] * 1e6 / (rate[0] * secs), cpu[1] * 1e6 / (rate[1] * secs)};
        printf("| %zu KiB | %.1f | %.0f | %.1f | %.0f | %.2f |\n", sizes[i] / 1024, per[0], rate[0],
               per[1], rate[1], per[1] / per[0]);
    }
    return 0;
}
