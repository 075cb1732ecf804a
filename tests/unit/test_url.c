/* tern_url_parse: the WebSocket URLs the client and tern load dial. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <string.h>

#include "tern/url.h"

static void splits_host_port_and_target(void **state) {
    (void)state;
    tern_url u;
    assert_int_equal(tern_url_parse("ws://example.com/chat?room=1", &u, NULL), 0);
    assert_false(u.tls);
    assert_false(u.unix_socket);
    assert_string_equal(u.host, "example.com");
    assert_int_equal(u.port, 80);
    assert_string_equal(u.authority, "example.com");
    assert_string_equal(u.target, "/chat?room=1");
    assert_string_equal(u.socket_path, "");

    assert_int_equal(tern_url_parse("WSS://127.0.0.1:8443", &u, NULL), 0);
    assert_true(u.tls);
    assert_string_equal(u.host, "127.0.0.1");
    assert_int_equal(u.port, 8443);
    assert_string_equal(u.authority, "127.0.0.1:8443");
    assert_string_equal(u.target, "/");

    /* A default port written is left out of the Host header. */
    assert_int_equal(tern_url_parse("wss://h:443/x", &u, NULL), 0);
    assert_int_equal(u.port, 443);
    assert_string_equal(u.authority, "h");

    assert_int_equal(tern_url_parse("ws://[::1]:9000/p", &u, NULL), 0);
    assert_string_equal(u.host, "::1");
    assert_int_equal(u.port, 9000);
    assert_string_equal(u.authority, "[::1]:9000");
}

static void unix_sockets(void **state) {
    (void)state;
    tern_url u;
    assert_int_equal(tern_url_parse("ws+unix:/run/t.sock:/ws?a=1", &u, NULL), 0);
    assert_true(u.unix_socket);
    assert_false(u.tls);
    assert_string_equal(u.socket_path, "/run/t.sock");
    assert_string_equal(u.target, "/ws?a=1");
    assert_string_equal(u.authority, "localhost");
    assert_int_equal(u.port, 0);
    assert_int_equal(tern_url_parse("wss+unix:/run/t.sock", &u, NULL), 0);
    assert_true(u.tls);
    assert_string_equal(u.target, "/");
}

static void refuses_with_a_reason(void **state) {
    (void)state;
    static const struct {
        const char *url, *why;
    } bad[] = {
        {"http://x/", "must start with ws://"},
        {"ws://", "no host"},
        {"ws://:80/", "no host"},
        {"ws://u@x/", "user info"},
        {"ws://x:0/", "bad port"},
        {"ws://x:65536/", "bad port"},
        {"ws://x:/", "bad port"},
        {"ws://x:8a/", "bad port"},
        {"ws://[::1/", "bad IPv6"},
        {"ws://[nope]/", "bad IPv6"},
        {"ws://x?q", "a query without a path"},
        {"ws://x/a b", "a fragment, a space"},
        {"ws://x/a#f", "a fragment, a space"},
        {"ws+unix:", "no socket path"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        tern_url u;
        const char *why = NULL;
        if (tern_url_parse(bad[i].url, &u, &why) != -EINVAL)
            fail_msg("%s: accepted", bad[i].url);
        if (why == NULL || strstr(why, bad[i].why) == NULL)
            fail_msg("%s: \"%s\", want \"%s\"", bad[i].url, why ? why : "(none)", bad[i].why);
    }
    char host[TERN_URL_HOST_MAX + 16] = "ws://";
    memset(host + 5, 'h', TERN_URL_HOST_MAX);
    tern_url u;
    assert_int_equal(tern_url_parse(host, &u, NULL), -EINVAL);
    assert_int_equal(tern_url_parse(NULL, &u, NULL), -EINVAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(splits_host_port_and_target),
        cmocka_unit_test(unix_sockets),
        cmocka_unit_test(refuses_with_a_reason),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
