/* tern_url_parse (src/net/url.c), the one parser of every URL tern dials:
 * any bytes are taken or refused without harm; a refusal says why; what
 * it takes is whole: a scheme it knows, a port in range (0 only for a
 * Unix socket), NUL-terminated fields within their sizes, a WebSocket
 * target that starts with '/' and holds no space or control byte, no
 * user information outside redis://. */
#include <assert.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tern/url.h"

static void terminated(const char *s, size_t cap) { assert(memchr(s, '\0', cap) != NULL); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *url = malloc(size + 1);
    if (url == NULL)
        return 0;
    memcpy(url, data, size);
    url[size] = '\0';
    tern_url u;
    const char *why = NULL;
    int rc = tern_url_parse(url, &u, &why);
    if (rc < 0) {
        assert(rc == -22 /* -EINVAL */ && why != NULL && *why != '\0');
        free(url);
        return 0;
    }
    assert(rc == 0);
    terminated(u.host, sizeof(u.host));
    terminated(u.authority, sizeof(u.authority));
    terminated(u.socket_path, sizeof(u.socket_path));
    terminated(u.user, sizeof(u.user));
    terminated(u.password, sizeof(u.password));
    bool redis = strcmp(u.scheme, "redis") == 0;
    assert(redis || strcmp(u.scheme, "ws") == 0 || strcmp(u.scheme, "wss") == 0 ||
           strcmp(u.scheme, "ws+unix") == 0 || strcmp(u.scheme, "wss+unix") == 0);
    if (u.unix_socket) {
        assert(u.port == 0 && u.socket_path[0] != '\0' && !redis);
    } else {
        assert(u.port >= 1 && u.port <= 65535 && u.socket_path[0] == '\0');
    }
    if (redis) {
        assert(u.target == NULL && !u.tls && u.db >= 0 && u.db <= 1000000);
    } else {
        assert(u.target != NULL && u.target[0] == '/' && !u.userinfo);
        assert(u.user[0] == '\0' && u.password[0] == '\0');
        for (const char *p = u.target; *p; p++)
            assert((unsigned char)*p > 0x20 && (unsigned char)*p < 0x7F);
    }
    free(url);
    return 0;
}
