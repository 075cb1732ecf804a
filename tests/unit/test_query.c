/* Query strings: finding a raw value by its raw name, and percent-decoding.
 * Inputs end at a PROT_NONE page (guard.h). Then a repeated parameter's
 * values on a live request (tern_http_query_param_next). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <string.h>

#include "client.h"
#include "guard.h"
#include "http/parser.h"
#include "tern/tern.h"

/* The value of name in query q, as a view; NULL when absent. */
static const char *find(const char *q, const char *name, size_t *len) {
    *len = 99;
    return tern__query_find(guarded(q, strlen(q)), strlen(q), name, len);
}

static void want_value(const char *q, const char *name, const char *want) {
    size_t len;
    const char *v = find(q, name, &len);
    if (v == NULL)
        fail_msg("\"%s\" in \"%s\": not found, want \"%s\"", name, q, want);
    if (len != strlen(want) || memcmp(v, want, len) != 0)
        fail_msg("\"%s\" in \"%s\": \"%.*s\", want \"%s\"", name, q, (int)len, v, want);
}

static void want_absent(const char *q, const char *name) {
    size_t len;
    if (find(q, name, &len) != NULL)
        fail_msg("\"%s\" found in \"%s\"", name, q);
    assert_int_equal(len, 0);
}

static void finds_values(void **state) {
    want_value("a=1&b=2&c=3", "a", "1");
    want_value("a=1&b=2&c=3", "b", "2");
    want_value("a=1&b=2&c=3", "c", "3");
    want_value("a=", "a", "");
    want_value("a=b=c", "a", "b=c");
    want_value("x=%41+b", "x", "%41+b");   /* raw */
}

static void first_match_wins(void **state) {
    want_value("a=1&a=2", "a", "1");
    want_value("b=0&a&a=2", "a", "");
}

static void name_without_equals_has_empty_value(void **state) {
    size_t len;
    const char *v = find("flag&x=1", "flag", &len);
    assert_non_null(v);
    assert_int_equal(len, 0);
    v = find("x=1&flag", "flag", &len);
    assert_non_null(v);
    assert_int_equal(len, 0);
}

static void names_match_exactly_and_raw(void **state) {
    want_absent("A=1", "a");
    want_absent("ab=1", "a");
    want_absent("a=1", "ab");
    want_absent("b=a", "a");
    want_value("a%20b=1", "a%20b", "1");
    want_absent("a%20b=1", "a b");
    want_absent("a+b=1", "a b");
}

static void empty_pairs_and_queries(void **state) {
    want_value("&&a=1&", "a", "1");
    want_absent("", "a");
    want_absent("&", "a");
    want_absent("&&", "");
    want_value("=v", "", "v");
    size_t len = 99;
    assert_null(tern__query_find(NULL, 0, "a", &len));
    assert_int_equal(len, 0);
}

/* ---- percent-decoding ------------------------------------------------- */

static ssize_t decode(char *dst, size_t cap, const char *src, bool plus) {
    return tern__url_decode(dst, cap, guarded(src, strlen(src)), strlen(src), plus);
}

static void want_decoded(const char *src, bool plus, const char *want) {
    char out[128];
    ssize_t n = decode(out, sizeof(out), src, plus);
    if (n != (ssize_t)strlen(want) || memcmp(out, want, (size_t)n) != 0)
        fail_msg("\"%s\" decoded to %zd \"%.*s\", want \"%s\"", src, n, n > 0 ? (int)n : 0, out,
                 want);
}

static void decodes(void **state) {
    want_decoded("", false, "");
    want_decoded("plain", false, "plain");
    want_decoded("%41%42%43", false, "ABC");
    want_decoded("%4a%4A%7e", false, "JJ~");
    want_decoded("a%2Fb", false, "a/b");
    want_decoded("%25", false, "%");
    want_decoded("%2541", false, "%41");   /* once, not twice */
    want_decoded("%c3%a9", false, "\xc3\xa9");
}

static void plus_is_space_only_when_asked(void **state) {
    want_decoded("a+b", true, "a b");
    want_decoded("a+b", false, "a+b");
    want_decoded("%2B+", true, "+ ");
}

static void nul_is_decoded_not_hidden(void **state) {
    char out[8];
    assert_int_equal(decode(out, sizeof(out), "a%00b", false), 3);
    assert_memory_equal(out, "a\0b", 3);
}

static void bad_escapes(void **state) {
    static const char *const bad[] = {"%", "%4", "a%", "a%4", "%zz", "%g1", "%1g", "%%41", "% 41",
                                      "%+1", "%-1", "%0x"};
    char out[16];
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ssize_t n = decode(out, sizeof(out), bad[i], true);
        if (n != -EINVAL)
            fail_msg("\"%s\": %zd, want -EINVAL", bad[i], n);
    }
}

static void destination_too_small(void **state) {
    char out[8];
    assert_int_equal(decode(out, 3, "abc", false), 3);
    assert_int_equal(decode(out, 2, "abc", false), -ENOSPC);
    assert_int_equal(decode(out, 1, "%41%42", false), -ENOSPC);
    assert_int_equal(decode(out, 2, "%41%42", false), 2);
    assert_int_equal(decode(out, 0, "", false), 0);
    assert_int_equal(decode(out, 0, "a", false), -ENOSPC);
    /* A bad escape is the worse news, wherever it is. */
    assert_int_equal(decode(out, 1, "abc%zz", false), -EINVAL);
}

static void in_place(void **state) {
    char buf[] = "a%20b+c%41%";
    assert_int_equal(tern__url_decode(buf, sizeof(buf), buf, 10, true), 6);
    assert_memory_equal(buf, "a b cA", 6);
}

/* ---- a repeated parameter, on a live request ------------------------ */

static struct {
    char got[256];          /* each call's result, as "value|" or "<error>|" */
    ssize_t single;         /* tern_http_query_param of the same name */
    int null_at, ran;
} Q;

static void on_query(tern_http_req *req, void *user) {
    (void)user;
    char buf[6];
    size_t at = 0, o = 0;
    ssize_t n;
    int calls = 0;
    while ((n = tern_http_query_param_next(req, "topic", &at, buf, sizeof(buf))) != -ENOENT &&
           ++calls < 20)
        o += (size_t)snprintf(Q.got + o, sizeof(Q.got) - o, "%s|",
                              n >= 0 ? buf : n == -ENOSPC ? "<nospc>" : "<inval>");
    /* past the end stays past it */
    if (tern_http_query_param_next(req, "topic", &at, buf, sizeof(buf)) != -ENOENT)
        o += (size_t)snprintf(Q.got + o, sizeof(Q.got) - o, "<again>");
    Q.single = tern_http_query_param(req, "topic", buf, sizeof(buf));
    Q.null_at = (int)tern_http_query_param_next(req, "topic", NULL, buf, sizeof(buf));
    Q.ran = 1;
    tern_http_respond(req, 200, "text/plain", "ok", 2);
    tern_loop_stop(tern_http_req_loop(req));
}

static void repeated_parameter_values_in_order(void **state) {
    tern_loop *loop;
    tern_server *srv;
    assert_int_equal(tern_loop_new(&loop, NULL), 0);
    assert_int_equal(tern_server_new(&srv, loop, NULL), 0);
    assert_int_equal(tern_http_route(srv, "GET", "/q", on_query, NULL), 0);
    assert_int_equal(tern_listen(srv, "127.0.0.1", 0, NULL), 0);
    /* a value, another name, an escape and a plus, an empty one, one too
     * long for the 6-byte buffer, a bad escape, a name alone, a last one */
    int fd = client_send_rcvbuf(tern_server_port(srv), 0,
                                "GET /q?topic=a&x=1&topic=b%2Fc+d&topic=&topicx=no&"
                                "topic=toolong&topic=%zz&topic&topic=z HTTP/1.1\r\nHost: x\r\n\r\n");
    memset(&Q, 0, sizeof(Q));
    assert_int_equal(tern_loop_run(loop), 0);
    assert_int_equal(Q.ran, 1);
    assert_string_equal(Q.got, "a|b/c d||<nospc>|<inval>||z|");
    assert_int_equal(Q.single, 1);
    assert_int_equal(Q.null_at, -EINVAL);
    close(fd);
    tern_server_free(srv);
    assert_int_equal(tern_loop_free(loop), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(finds_values),
        cmocka_unit_test(first_match_wins),
        cmocka_unit_test(name_without_equals_has_empty_value),
        cmocka_unit_test(names_match_exactly_and_raw),
        cmocka_unit_test(empty_pairs_and_queries),
        cmocka_unit_test(decodes),
        cmocka_unit_test(plus_is_space_only_when_asked),
        cmocka_unit_test(nul_is_decoded_not_hidden),
        cmocka_unit_test(bad_escapes),
        cmocka_unit_test(destination_too_small),
        cmocka_unit_test(in_place),
        cmocka_unit_test(repeated_parameter_values_in_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
