/* tern_url_parse: each URL given (or a few of our own) split into what a
 * WebSocket connection needs, or the reason it is refused; then a second
 * URL on the same server made from the parts, as tern load makes its
 * publisher's. Exits 1 when a URL given is refused.
 *
 *   ./build/examples/url_parse wss://example.com:8443/chat?room=1 ws://x/a#b */
#include <stdio.h>

#include <tern/tern.h>

/* url's server with another target: the scheme and where to connect kept. */
static void same_server(const tern_url *u, const char *target, char *out, size_t cap) {
    const char *scheme = u->tls ? "wss" : "ws";
    if (u->unix_socket)
        snprintf(out, cap, "%s+unix:%s:%s", scheme, u->socket_path, target);
    else
        snprintf(out, cap, "%s://%s%s", scheme, u->authority, target);
}

int main(int argc, char **argv) {
    static const char *const ours[] = {"ws://127.0.0.1:8080/ws", "wss://[::1]/feed?x=1",
                                       "ws+unix:/run/tern.sock:/ws", "ws://host?q"};
    const char *const *urls = argc > 1 ? (const char *const *)argv + 1 : ours;
    int n = argc > 1 ? argc - 1 : (int)(sizeof(ours) / sizeof(ours[0]));
    int status = 0;
    for (int i = 0; i < n; i++) {
        tern_url u;
        const char *why;
        if (tern_url_parse(urls[i], &u, &why) < 0) {
            printf("%s: refused: %s\n", urls[i], why);
            status = argc > 1;
            continue;
        }
        char other[TERN_URL_HOST_MAX + 64];
        same_server(&u, "/other", other, sizeof(other));
        if (u.unix_socket)
            printf("%s: %s, socket %s, target %s; beside it: %s\n", urls[i],
                   u.tls ? "TLS" : "plain", u.socket_path, u.target, other);
        else
            printf("%s: %s, host %s, port %d, Host: %s, target %s; beside it: %s\n", urls[i],
                   u.tls ? "TLS" : "plain", u.host, u.port, u.authority, u.target, other);
    }
    return status;
}
