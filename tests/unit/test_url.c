/* tern_url_parse: the WebSocket URLs the client and tern load dial, and
 * the Redis URLs of the pub/sub bridge. */
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
    assert_string_equal(u.scheme, "ws");
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

static void redis_urls(void **state) {
    (void)state;
    tern_url u;
    /* No port, no user information, no database: the defaults. */
    assert_int_equal(tern_url_parse("redis://cache.example", &u, NULL), 0);
    assert_string_equal(u.scheme, "redis");
    assert_false(u.tls);
    assert_null(u.target);
    assert_string_equal(u.host, "cache.example");
    assert_int_equal(u.port, 6379);
    assert_false(u.userinfo);
    assert_string_equal(u.user, "");
    assert_string_equal(u.password, "");
    assert_int_equal(u.db, 0);

    /* A password percent-encoded ('@', ':' and '/' in it), a database. */
    assert_int_equal(tern_url_parse("redis://app:p%40ss%3Aw%2Fd@10.0.0.5:6380/3", &u, NULL), 0);
    assert_true(u.userinfo);
    assert_string_equal(u.user, "app");
    assert_string_equal(u.password, "p@ss:w/d");
    assert_string_equal(u.host, "10.0.0.5");
    assert_int_equal(u.port, 6380);
    assert_int_equal(u.db, 3);

    /* A password alone; an '@' in it as written (the last '@' ends it). */
    assert_int_equal(tern_url_parse("redis://:a@b@h/", &u, NULL), 0);
    assert_string_equal(u.user, "");
    assert_string_equal(u.password, "a@b");
    assert_string_equal(u.host, "h");
    assert_int_equal(u.db, 0);

    /* IPv6 literals, with and without a port. */
    assert_int_equal(tern_url_parse("redis://[::1]:7000/15", &u, NULL), 0);
    assert_string_equal(u.host, "::1");
    assert_int_equal(u.port, 7000);
    assert_int_equal(u.db, 15);
    assert_int_equal(tern_url_parse("redis://:pw@[fe80::1]", &u, NULL), 0);
    assert_string_equal(u.host, "fe80::1");
    assert_int_equal(u.port, 6379);
    assert_string_equal(u.password, "pw");
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
        {"redis://", "no host"},
        {"redis://:pw@", "no host"},
        {"redis://h:0", "bad port"},
        {"redis://h:65536", "bad port"},
        {"redis://h:6379x", "bad port"},
        {"redis://[::1", "bad IPv6"},
        {"redis://[::1]x", "bad IPv6"},
        {"redis://h/x", "a path other than /DB"},
        {"redis://h/-1", "a path other than /DB"},
        {"redis://h/1/2", "a path other than /DB"},
        {"redis://h/1000001", "a path other than /DB"},
        {"redis://h/0?x", "a path other than /DB"},
        {"redis://h?x", "a path other than /DB"},
        {"redis://:p%4@h", "bad password"},
        {"redis://:p%zz@h", "bad password"},
        {"redis://:p%00@h", "bad password"},
        {"redis://u%GG:p@h", "bad user"},
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

    /* A password that does not fit, decoded, with its NUL. */
    char pass[16 + TERN_URL_PASSWORD_MAX + 8] = "redis://:";
    memset(pass + 9, 'p', TERN_URL_PASSWORD_MAX);
    strcpy(pass + 9 + TERN_URL_PASSWORD_MAX, "@h");
    const char *why = NULL;
    assert_int_equal(tern_url_parse(pass, &u, &why), -EINVAL);
    assert_non_null(strstr(why, "bad password"));
    strcpy(pass + 9 + TERN_URL_PASSWORD_MAX - 1, "@h");   /* one byte less: it fits */
    assert_int_equal(tern_url_parse(pass, &u, NULL), 0);
    assert_int_equal(strlen(u.password), TERN_URL_PASSWORD_MAX - 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(splits_host_port_and_target),
        cmocka_unit_test(unix_sockets),
        cmocka_unit_test(redis_urls),
        cmocka_unit_test(refuses_with_a_reason),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
