/* bench/wrk/fresh_tls.c: makes wrk's every TLS connection a full handshake,
 * and counts them. Loaded into wrk with LD_PRELOAD by bench/run for the
 * https suite's new-connection cell.
 *
 * Why: wrk keeps one SSL object per connection slot and, when the server
 * closes (Connection: close), calls SSL_shutdown and SSL_clear on it, then
 * SSL_connect again. SSL_clear keeps a cleanly shut session, so the next
 * SSL_connect offers it and every server that issues tickets resumes it:
 * no certificate, no signature, a fraction of a full handshake's cost.
 * The cell measures full handshakes, so this wraps SSL_clear: it counts
 * whether the handshake that just ended was resumed (SSL_session_reused),
 * then forgets the session (SSL_set_session NULL) before wrk reconnects.
 * At exit it prints "FRESH_TLS {"full":N,"resumed":M}" on standard error,
 * which bench/run reads: a resumed handshake in the cell is an error.
 * With FRESH_TLS_KEEP set it only counts, to show what wrk does alone.
 *
 * Build: cc -O2 -shared -fPIC -o fresh_tls.so fresh_tls.c -ldl -lssl */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <openssl/ssl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

static atomic_ulong full, resumed;

int SSL_clear(SSL *s) {
    static int (*real)(SSL *);
    if (real == NULL)
        real = (int (*)(SSL *))dlsym(RTLD_NEXT, "SSL_clear");
    if (SSL_is_init_finished(s))   /* a handshake that completed, not a failed connect */
        atomic_fetch_add(SSL_session_reused(s) ? &resumed : &full, 1);
    int r = real(s);
    if (getenv("FRESH_TLS_KEEP") == NULL)   /* set: count only (to see wrk resume) */
        SSL_set_session(s, NULL);           /* the next SSL_connect offers no session */
    return r;
}

__attribute__((destructor)) static void report(void) {
    fprintf(stderr, "FRESH_TLS {\"full\":%lu,\"resumed\":%lu}\n", atomic_load(&full),
            atomic_load(&resumed));
}
