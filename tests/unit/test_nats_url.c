/* tern__nats_url_parse: the NATS engine's URL (src/pubsub/nats_url.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "pubsub/nats_url.h"

static tern__nats_url u;

static void one_server_and_its_default_port(void **state) {
    (void)state;
    assert_int_equal(tern__nats_url_parse("nats://127.0.0.1", &u, NULL), 0);
    assert_int_equal(u.nservers, 1);
    assert_string_equal(u.servers[0], "nats://127.0.0.1:4222");
    assert_string_equal(u.hosts, "127.0.0.1:4222");
    assert_string_equal(u.user, "");
    assert_string_equal(u.token, "");
    assert_int_equal(tern__nats_url_parse("nats://[::1]:5000/", &u, NULL), 0);
    assert_string_equal(u.servers[0], "nats://[::1]:5000");
}

static void a_cluster_with_the_scheme_repeated_or_not(void **state) {
    (void)state;
    assert_int_equal(tern__nats_url_parse("nats://a:1,nats://b:2,c", &u, NULL), 0);
    assert_int_equal(u.nservers, 3);
    assert_string_equal(u.servers[0], "nats://a:1");
    assert_string_equal(u.servers[1], "nats://b:2");
    assert_string_equal(u.servers[2], "nats://c:4222");
    assert_string_equal(u.hosts, "a:1,b:2,c:4222");
}

static void credentials_decoded_and_kept_out_of_the_servers(void **state) {
    (void)state;
    assert_int_equal(tern__nats_url_parse("nats://me:p%40ss%3Aw@h:1,g", &u, NULL), 0);
    assert_string_equal(u.user, "me");
    assert_string_equal(u.pass, "p@ss:w");
    assert_string_equal(u.servers[0], "nats://h:1");
    assert_null(strstr(u.hosts, "me"));
    assert_int_equal(tern__nats_url_parse("nats://t%2Fok@h", &u, NULL), 0);
    assert_string_equal(u.token, "t/ok");
    assert_string_equal(u.user, "");
}

static void files_from_the_query(void **state) {
    (void)state;
    assert_int_equal(tern__nats_url_parse("nats://h/?creds=/etc/n%20s.creds", &u, NULL), 0);
    assert_string_equal(u.creds, "/etc/n s.creds");
    assert_int_equal(tern__nats_url_parse("nats://h?token_file=/t", &u, NULL), 0);
    assert_string_equal(u.token_file, "/t");
    assert_int_equal(tern__nats_url_parse("nats://me:@h?password_file=/p", &u, NULL), 0);
    assert_string_equal(u.user, "me");
    assert_string_equal(u.password_file, "/p");
}

static void tls_and_its_files(void **state) {
    (void)state;
    assert_int_equal(tern__nats_url_parse("tls://h:1,tls://g?ca=/ca.pem&cert=/c&key=/k", &u,
                                          NULL), 0);
    assert_true(u.tls);
    assert_int_equal(u.nservers, 2);
    assert_string_equal(u.servers[0], "tls://h:1");
    assert_string_equal(u.servers[1], "tls://g:4222");
    assert_string_equal(u.ca, "/ca.pem");
    assert_string_equal(u.cert, "/c");
    assert_string_equal(u.key, "/k");
    assert_int_equal(tern__nats_url_parse("nats://h", &u, NULL), 0);
    assert_false(u.tls);
}

static void refused_with_a_reason(void **state) {
    (void)state;
    static const char *const bad[] = {
        "redis://h", "nats://", "nats://h:0", "nats://h:65536", "nats://h:x", "nats://h:",
        "nats://h/path", "nats://h,", "nats://h,,g", "nats://h?what=1", "nats://h?creds=",
        "nats://u@h,v@g", "nats://me@h:1,g@x", "nats://me:@h", "nats://:pw@h",
        "nats://u:p@h?token_file=/t", "nats://tok@h?token_file=/t", "nats://h?password_file=/p",
        "nats://u:p@h?password_file=/p", "nats://[::1", "nats://%00@h", "nats://a b",
        "nats://h?ca=/ca", "tls://h?cert=/c", "tls://h?key=/k", "tls://h,nats://g",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const char *why = NULL;
        if (tern__nats_url_parse(bad[i], &u, &why) != -EINVAL)
            fail_msg("accepted: %s", bad[i]);
        assert_non_null(why);
    }
    const char *why = NULL;
    assert_int_equal(tern__nats_url_parse("nats://u:secret@h:0", &u, &why), -EINVAL);
    assert_null(strstr(why, "secret"));   /* the reason never quotes the URL */
}

static void at_most_sixteen_servers(void **state) {
    (void)state;
    char url[256] = "nats://h0";
    for (int i = 1; i < TERN__NATS_SERVERS_MAX; i++)
        snprintf(url + strlen(url), sizeof(url) - strlen(url), ",h%d", i);
    assert_int_equal(tern__nats_url_parse(url, &u, NULL), 0);
    assert_int_equal(u.nservers, TERN__NATS_SERVERS_MAX);
    strcat(url, ",one_more");
    assert_int_equal(tern__nats_url_parse(url, &u, NULL), -EINVAL);
}

static void replicas_from_the_query(void **state) {
    (void)state;
    assert_int_equal(tern__nats_url_parse("nats://h", &u, NULL), 0);
    assert_int_equal(u.replicas, 1);
    assert_int_equal(tern__nats_url_parse("nats://a,b,c?replicas=3", &u, NULL), 0);
    assert_int_equal(u.replicas, 3);
    const char *why = NULL;
    static const char *const bad[] = {"nats://h?replicas=0", "nats://h?replicas=6",
                                      "nats://h?replicas=", "nats://h?replicas=33"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(tern__nats_url_parse(bad[i], &u, &why), -EINVAL);
        assert_string_equal(why, "replicas is not a number from 1 to 5");
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(replicas_from_the_query),
        cmocka_unit_test(one_server_and_its_default_port),
        cmocka_unit_test(a_cluster_with_the_scheme_repeated_or_not),
        cmocka_unit_test(credentials_decoded_and_kept_out_of_the_servers),
        cmocka_unit_test(files_from_the_query),
        cmocka_unit_test(tls_and_its_files),
        cmocka_unit_test(refused_with_a_reason),
        cmocka_unit_test(at_most_sixteen_servers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
