/* The admin API's JSON reader (src/app/json_read.c, compiled in): values
 * read by the type asked for, strings decoded and checked (UTF-8,
 * escapes, surrogate pairs, \u0000 only in a token passed on), numbers
 * whole and bounded, separators and the end of the document. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "app/json_read.h"

static app_json_reader at(const char *s) {
    app_json_reader r;
    app_json_reader_init(&r, s, strlen(s));
    return r;
}

static void objects_members_and_the_end(void **state) {
    (void)state;
    app_json_reader r = at(" { \"a\" : \"x\" , \"b\":[\"p\",\"q\"], \"c\":7 ,\"d\":true} ");
    char key[8], v[8];
    bool ok, b;
    uint64_t n;
    assert_int_equal(app_json_peek(&r), APP_JSON_OBJECT);
    assert_true(app_json_object(&r));
    assert_true(app_json_member(&r, key, sizeof(key), &ok));
    assert_string_equal(key, "a");
    assert_int_equal(app_json_string(&r, v, sizeof(v)), 1);
    assert_true(app_json_member(&r, key, sizeof(key), &ok));
    assert_string_equal(key, "b");
    assert_true(app_json_array(&r));
    const char *want[] = {"p", "q"};
    for (int i = 0; i < 2; i++) {
        assert_true(app_json_element(&r, &ok));
        assert_int_equal(app_json_string(&r, v, sizeof(v)), 1);
        assert_string_equal(v, want[i]);
    }
    assert_false(app_json_element(&r, &ok));
    assert_true(ok);
    assert_true(app_json_member(&r, key, sizeof(key), &ok));
    assert_int_equal(app_json_peek(&r), APP_JSON_NUMBER);
    assert_true(app_json_uint(&r, &n));
    assert_int_equal(n, 7);
    assert_true(app_json_member(&r, key, sizeof(key), &ok));
    assert_true(app_json_bool(&r, &b));
    assert_true(b);
    assert_false(app_json_member(&r, key, sizeof(key), &ok));
    assert_true(ok);
    assert_true(app_json_done(&r));
    /* empty containers; a missing or doubled comma */
    r = at("{}");
    assert_true(app_json_object(&r));
    assert_false(app_json_member(&r, key, sizeof(key), &ok));
    assert_true(ok && app_json_done(&r));
    r = at("[\"a\" \"b\"]");
    assert_true(app_json_array(&r));
    assert_true(app_json_element(&r, &ok));
    assert_int_equal(app_json_string(&r, v, sizeof(v)), 1);
    assert_false(app_json_element(&r, &ok));
    assert_false(ok);
    r = at("{,\"a\":1}");
    assert_true(app_json_object(&r));
    assert_false(app_json_member(&r, key, sizeof(key), &ok));
    assert_false(ok);
    /* an empty container is a value like any: a comma must follow it
     * before the next (fuzz_json_read found "[[] 1]" taken) */
    r = at("[[] 1]");
    assert_true(app_json_array(&r));
    assert_true(app_json_element(&r, &ok));
    assert_true(app_json_array(&r));
    assert_false(app_json_element(&r, &ok));
    assert_true(ok);
    assert_false(app_json_element(&r, &ok));
    assert_false(ok);
    r = at("{\"a\":{} \"b\":1}");
    assert_true(app_json_object(&r));
    assert_true(app_json_member(&r, key, sizeof(key), &ok));
    assert_true(app_json_object(&r));
    assert_false(app_json_member(&r, key, sizeof(key), &ok));
    assert_true(ok);
    assert_false(app_json_member(&r, key, sizeof(key), &ok));
    assert_false(ok);
    r = at("[[],{},1]");
    assert_true(app_json_array(&r));
    assert_true(app_json_element(&r, &ok) && app_json_array(&r));
    assert_false(app_json_element(&r, &ok));
    assert_true(app_json_element(&r, &ok) && app_json_object(&r));
    assert_false(app_json_member(&r, key, sizeof(key), &ok));
    assert_true(app_json_element(&r, &ok) && app_json_uint(&r, &n));
    assert_false(app_json_element(&r, &ok));
    assert_true(ok && app_json_done(&r));
    r = at("{\"longer than eight\":1}");   /* a name over the room given */
    assert_true(app_json_object(&r));
    assert_false(app_json_member(&r, key, sizeof(key), &ok));
    assert_false(ok);
}

static void strings_are_decoded_and_checked(void **state) {
    (void)state;
    char v[16];
    struct { const char *in; long len; const char *out; } cases[] = {
        {"\"a\\\"\\\\\\/\\b\\f\\n\\r\\t\"", 9, "a\"\\/\b\f\n\r\t"},
        {"\"\\u00e9\\u20ac\"", 5, "\xc3\xa9\xe2\x82\xac"},
        {"\"\\ud83d\\ude00\"", 4, "\xf0\x9f\x98\x80"},   /* a surrogate pair */
        {"\"\xc3\xa9\"", 2, "\xc3\xa9"},
        {"\"\"", 0, ""},
        {"\"\\u0000\"", -1, NULL},              /* not in a C string */
        {"\"\\ud83d\"", -1, NULL},              /* a lone high surrogate */
        {"\"\\ude00\"", -1, NULL},              /* a lone low one */
        {"\"\\x\"", -1, NULL},                  /* no such escape */
        {"\"\\u12g4\"", -1, NULL},
        {"\"\x01\"", -1, NULL},                 /* a raw control byte */
        {"\"\xff\"", -1, NULL},                 /* not UTF-8 */
        {"\"\xc0\xaf\"", -1, NULL},             /* overlong */
        {"\"\xed\xa0\x80\"", -1, NULL},         /* a surrogate in UTF-8 */
        {"\"open", -1, NULL},
        {"\"0123456789abcdef\"", -2, NULL},     /* over the room */
        {"7", -1, NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        app_json_reader r = at(cases[i].in);
        long n = app_json_string(&r, v, sizeof(v));
        assert_int_equal(n, cases[i].len);
        if (n >= 0) {
            assert_memory_equal(v, cases[i].out, (size_t)n + 1);
            assert_true(app_json_done(&r));
        }
    }
    /* a token is the string as written; \u0000 passes there */
    app_json_reader r = at("\"a\\u0000b\"  ");
    const char *s;
    size_t n;
    assert_true(app_json_string_token(&r, &s, &n));
    assert_int_equal(n, 10);
    assert_memory_equal(s, "\"a\\u0000b\"", n);
    assert_true(app_json_done(&r));
    r = at("\"\\ud800\"");
    assert_false(app_json_string_token(&r, &s, &n));
}

static void numbers_are_whole_and_bounded(void **state) {
    (void)state;
    struct { const char *in; bool ok; uint64_t v; } cases[] = {
        {"0", true, 0}, {"42 ", true, 42}, {"9223372036854775807", true, INT64_MAX},
        {"9223372036854775808", false, 0}, {"-1", false, 0}, {"1.5", false, 0},
        {"1e3", false, 0}, {"01", false, 0}, {"\"5\"", false, 0}, {"", false, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        app_json_reader r = at(cases[i].in);
        uint64_t v = 99;
        assert_int_equal(app_json_uint(&r, &v), cases[i].ok);
        if (cases[i].ok) {
            assert_int_equal(v, cases[i].v);
            assert_true(app_json_done(&r));
        }
    }
    app_json_reader r = at("nope");
    bool b;
    assert_false(app_json_bool(&r, &b));
    assert_int_equal(app_json_peek(&r), APP_JSON_NULL);   /* 'n': what it would be */
    r = at("  ");
    assert_int_equal(app_json_peek(&r), APP_JSON_END);
    assert_true(app_json_done(&r));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(objects_members_and_the_end),
        cmocka_unit_test(strings_are_decoded_and_checked),
        cmocka_unit_test(numbers_are_whole_and_bounded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
