/* The router: literal beats ":param" beats "*", per segment; methods,
 * 404 against 405; what a bad pattern gets. Paths end at a PROT_NONE page
 * (guard.h), the way they arrive: views without a terminating NUL. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "guard.h"
#include "http/router.h"

static tern__router *r;
static tern__route_params params;
static int status;

/* Distinct data pointers for the routes: the address of a tag. */
static char A, B, C, D, E, F;

static int setup(void **state) {
    r = tern__router_new();
    return r ? 0 : -1;
}

static int teardown(void **state) {
    tern__router_free(r);
    r = NULL;
    return 0;
}

static void add(const char *method, const char *pattern, void *data) {
    int err = tern__router_add(r, method, pattern, data);
    if (err)
        fail_msg("add %s %s: %d", method ? method : "(any)", pattern, err);
}

static void *match(const char *method, const char *path) {
    status = 0;
    memset(&params, 0xAB, sizeof(params));
    return tern__router_match(r, method, strlen(method), guarded(path, strlen(path)),
                              strlen(path), &params, &status);
}

static void expect_route(const char *method, const char *path, void *want) {
    void *got = match(method, path);
    if (got != want)
        fail_msg("%s %s: got %p, want %p (status %d)", method, path, got, want, status);
}

static void expect_status(const char *method, const char *path, int want) {
    void *got = match(method, path);
    if (got != NULL || status != want)
        fail_msg("%s %s: got %p status %d, want NULL %d", method, path, got, status, want);
    assert_int_equal(params.count, 0);
}

static void expect_param(size_t i, const char *name, const char *value) {
    assert_true(i < params.count);
    assert_int_equal(params.p[i].name_len, strlen(name));
    assert_memory_equal(params.p[i].name, name, strlen(name));
    assert_int_equal(params.p[i].value_len, strlen(value));
    assert_memory_equal(params.p[i].value, value, strlen(value));
}

static void expect_rest(const char *rest) {
    assert_non_null(params.rest);
    assert_int_equal(params.rest_len, strlen(rest));
    assert_memory_equal(params.rest, rest, strlen(rest));
}

/* ---- literal paths ---------------------------------------------------- */

static void exact_paths(void **state) {
    add("GET", "/", &A);
    add("GET", "/users", &B);
    add("GET", "/users/list", &C);
    expect_route("GET", "/", &A);
    expect_route("GET", "/users", &B);
    expect_route("GET", "/users/list", &C);
    assert_int_equal(status, 200);
    assert_int_equal(params.count, 0);
    assert_null(params.rest);
    expect_status("GET", "/user", 404);
    expect_status("GET", "/usersx", 404);
    expect_status("GET", "/users/list/x", 404);
    expect_status("GET", "//", 404);
}

static void trailing_slash_is_significant(void **state) {
    add("GET", "/a", &A);
    add("GET", "/b/", &B);
    expect_route("GET", "/a", &A);
    expect_status("GET", "/a/", 404);
    expect_route("GET", "/b/", &B);
    expect_status("GET", "/b", 404);
}

static void empty_segments_are_segments(void **state) {
    add("GET", "/a//b", &A);
    expect_route("GET", "/a//b", &A);
    expect_status("GET", "/a/b", 404);
}

static void no_percent_decoding(void **state) {
    add("GET", "/a%20b", &A);
    add("GET", "/x/:id", &B);
    expect_route("GET", "/a%20b", &A);   /* compared raw */
    expect_status("GET", "/a%2520b", 404);
    expect_route("GET", "/x/%2F%20", &B);
    expect_param(0, "id", "%2F%20");
}

static void paths_not_starting_with_a_slash(void **state) {
    add(NULL, "/*", &A);
    expect_status("OPTIONS", "*", 404);
    expect_status("CONNECT", "example.com:443", 404);
    expect_status("GET", "", 404);
}

/* ---- parameters ------------------------------------------------------- */

static void params_capture_segments(void **state) {
    add("GET", "/users/:id", &A);
    add("GET", "/users/:id/posts/:post", &B);
    expect_route("GET", "/users/42", &A);
    assert_int_equal(params.count, 1);
    expect_param(0, "id", "42");
    expect_route("GET", "/users/7/posts/hello-world", &B);
    assert_int_equal(params.count, 2);
    expect_param(0, "id", "7");
    expect_param(1, "post", "hello-world");
    assert_null(params.rest);
}

static void params_are_never_empty(void **state) {
    add("GET", "/users/:id", &A);
    expect_status("GET", "/users/", 404);
    expect_status("GET", "/users", 404);
    expect_status("GET", "/users//", 404);
}

static void names_are_the_routers_own(void **state) {
    /* The caller's pattern may be freed right after adding. */
    char *pattern = strdup("/u/:name/:other");
    assert_non_null(pattern);
    add("GET", pattern, &A);
    memset(pattern, 'X', strlen(pattern));
    free(pattern);
    expect_route("GET", "/u/ann/bob", &A);
    expect_param(0, "name", "ann");
    expect_param(1, "other", "bob");
}

static void names_belong_to_each_route(void **state) {
    /* One trie position, one name per route: methods may differ. */
    add("GET", "/u/:id", &A);
    add("DELETE", "/u/:uid", &B);
    expect_route("GET", "/u/1", &A);
    expect_param(0, "id", "1");
    expect_route("DELETE", "/u/1", &B);
    expect_param(0, "uid", "1");
}

static void eight_params(void **state) {
    add("GET", "/:a/:b/:c/:d/:e/:f/:g/:h", &A);
    expect_route("GET", "/1/2/3/4/5/6/7/8", &A);
    assert_int_equal(params.count, 8);
    expect_param(0, "a", "1");
    expect_param(7, "h", "8");
}

/* ---- "*" -------------------------------------------------------------- */

static void star_takes_the_rest(void **state) {
    add("GET", "/static/*", &A);
    expect_route("GET", "/static/app.js", &A);
    expect_rest("app.js");
    expect_route("GET", "/static/css/site.css", &A);
    expect_rest("css/site.css");
    expect_route("GET", "/static/a//b/", &A);
    expect_rest("a//b/");
    /* The empty rest: "/static/" itself. */
    expect_route("GET", "/static/", &A);
    expect_rest("");
    /* "/static" has no "/static/" prefix: not matched (register it
     * separately, e.g. to redirect to "/static/"). */
    expect_status("GET", "/static", 404);
    expect_status("GET", "/staticx/a", 404);
}

static void root_star_takes_everything(void **state) {
    add("GET", "/*", &A);
    expect_route("GET", "/", &A);
    expect_rest("");
    expect_route("GET", "/a/b/c", &A);
    expect_rest("a/b/c");
}

static void star_after_params(void **state) {
    add("GET", "/u/:id/*", &A);
    expect_route("GET", "/u/9/files/x.txt", &A);
    expect_param(0, "id", "9");
    expect_rest("files/x.txt");
}

/* ---- precedence ------------------------------------------------------- */

static void literal_beats_param_beats_star(void **state) {
    /* Registered least specific first: order does not matter. */
    add("GET", "/users/*", &C);
    add("GET", "/users/:id", &B);
    add("GET", "/users/me", &A);
    expect_route("GET", "/users/me", &A);
    assert_int_equal(params.count, 0);
    expect_route("GET", "/users/42", &B);
    expect_param(0, "id", "42");
    expect_route("GET", "/users/42/x", &C);
    expect_rest("42/x");
    expect_route("GET", "/users/", &C);
    expect_rest("");
}

static void precedence_backs_up(void **state) {
    /* "/a/b" goes the literal way first, finds no "/d" there, and comes
     * back for the parameter. */
    add("GET", "/a/b/c", &A);
    add("GET", "/a/:x/d", &B);
    add("GET", "/a/*", &C);
    expect_route("GET", "/a/b/c", &A);
    expect_route("GET", "/a/b/d", &B);
    expect_param(0, "x", "b");
    expect_route("GET", "/a/b/e", &C);
    expect_rest("b/e");
    assert_int_equal(params.count, 0);   /* the parameter tried on the way is not kept */
}

static void deeper_literals_do_not_outrank(void **state) {
    add("GET", "/:x/y", &A);
    add("GET", "/p/:z", &B);
    /* Segment by segment: "p" is a literal match at the first one. */
    expect_route("GET", "/p/y", &B);
    expect_param(0, "z", "y");
    expect_route("GET", "/q/y", &A);
}

/* ---- methods, 404 and 405 --------------------------------------------- */

static void methods(void **state) {
    add("GET", "/r", &A);
    add("POST", "/r", &B);
    expect_route("GET", "/r", &A);
    expect_route("POST", "/r", &B);
    expect_status("PUT", "/r", 405);
    expect_status("get", "/r", 405);   /* methods are case-sensitive */
    expect_status("GET", "/s", 404);
}

static void any_method(void **state) {
    add(NULL, "/any", &A);
    add("*", "/star", &B);
    expect_route("GET", "/any", &A);
    expect_route("BREW", "/any", &A);
    expect_route("DELETE", "/star", &B);
}

static void own_method_beats_any_method(void **state) {
    add(NULL, "/r", &A);
    add("POST", "/r", &B);
    expect_route("POST", "/r", &B);
    expect_route("GET", "/r", &A);
    /* Whatever the order of registration. */
    add("POST", "/s", &C);
    add(NULL, "/s", &D);
    expect_route("POST", "/s", &C);
    expect_route("PUT", "/s", &D);
}

static void method_found_further_down(void **state) {
    /* The literal pattern has no GET: the parameter's GET is the answer,
     * not 405. */
    add("POST", "/a/b", &A);
    add("GET", "/a/:x", &B);
    expect_route("GET", "/a/b", &B);
    expect_route("POST", "/a/b", &A);
    expect_status("PUT", "/a/b", 405);
    expect_status("PUT", "/b", 404);
}

static void status_405_from_star(void **state) {
    add("GET", "/f/*", &A);
    expect_status("POST", "/f/x", 405);
    expect_status("POST", "/f", 404);
}

/* ---- adding ----------------------------------------------------------- */

static void bad_patterns(void **state) {
    static const char *const bad[] = {
        "", "a", "a/b", "*", "/a/*/b", "/*/", "/*/*", "/:", "/a/:/b", "/:a/:a",
        "/:a/:b/:c/:d/:e/:f/:g/:h/:i",
        /* never matched by any request path (issue #10) */
        "/q?x=1", "/star*", "/*x", "/a*/b", "/a#b", "/a b", "/a\tb", "/caf\xc3\xa9", "/a\x7f",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int err = tern__router_add(r, "GET", bad[i], &A);
        if (err != -EINVAL)
            fail_msg("pattern \"%s\": %d, want -EINVAL", bad[i], err);
    }
    assert_int_equal(tern__router_add(r, "", "/a", &A), -EINVAL);
    /* Methods: upper-case tokens of at most 32 bytes. */
    static const char *const bad_methods[] = {
        "get", "Get", "G T", "GET ", "GET\r\n", "GE(T", "ABCDEFGHIJKLMNOPQRSTUVWXYZABCDEFG",
    };
    for (size_t i = 0; i < sizeof(bad_methods) / sizeof(bad_methods[0]); i++)
        if (tern__router_add(r, bad_methods[i], "/a", &A) != -EINVAL)
            fail_msg("method \"%s\" taken", bad_methods[i]);
    add("M-SEARCH", "/m", &A);
    add("ABCDEFGHIJKLMNOPQRSTUVWXYZABCDEF", "/m", &B);
    assert_int_equal(tern__router_add(r, "GET", NULL, &A), -EINVAL);
    /* Nothing of them was kept. */
    expect_status("GET", "/a", 404);
    expect_status("GET", "/a/x/b", 404);
}

/* A ':' inside a segment is literal; a '*' anywhere but as the whole last
 * segment is refused (see bad_patterns). */
static void colon_inside_a_segment_is_literal(void **state) {
    add("GET", "/b:c", &B);
    expect_route("GET", "/b:c", &B);
    expect_status("GET", "/bxc", 404);
}

static void duplicates(void **state) {
    add("GET", "/d", &A);
    assert_int_equal(tern__router_add(r, "GET", "/d", &B), -EEXIST);
    add("POST", "/d", &B);
    add(NULL, "/d", &C);
    assert_int_equal(tern__router_add(r, "*", "/d", &D), -EEXIST);
    assert_int_equal(tern__router_add(r, NULL, "/d", &D), -EEXIST);
    /* Parameter names do not make patterns different. */
    add("GET", "/u/:id", &E);
    assert_int_equal(tern__router_add(r, "GET", "/u/:name", &F), -EEXIST);
    expect_route("GET", "/d", &A);
    expect_route("GET", "/u/1", &E);
    expect_param(0, "id", "1");
}

static void many_routes(void **state) {
    /* Enough literal siblings to exercise the sorted child arrays. */
    static char tags[500];
    char pattern[32];
    for (int i = 0; i < 500; i++) {
        snprintf(pattern, sizeof(pattern), "/k/%d/v", (i * 7919) % 500);
        add("GET", pattern, &tags[(i * 7919) % 500]);
    }
    for (int i = 0; i < 500; i++) {
        snprintf(pattern, sizeof(pattern), "/k/%d/v", i);
        expect_route("GET", pattern, &tags[i]);
    }
    expect_status("GET", "/k/500/v", 404);
    expect_status("GET", "/k/1", 404);
}

static void null_params_and_status(void **state) {
    add("GET", "/x/:y", &A);
    const char *p = guarded("/x/1", 4);
    assert_ptr_equal(tern__router_match(r, "GET", 3, p, 4, NULL, NULL), &A);
    assert_null(tern__router_match(r, "GET", 3, p, 2, NULL, NULL));
    tern__router_free(NULL);
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void) {
    const struct CMUnitTest tests[] = {
        T(exact_paths),
        T(trailing_slash_is_significant),
        T(empty_segments_are_segments),
        T(no_percent_decoding),
        T(paths_not_starting_with_a_slash),
        T(params_capture_segments),
        T(params_are_never_empty),
        T(names_are_the_routers_own),
        T(names_belong_to_each_route),
        T(eight_params),
        T(star_takes_the_rest),
        T(root_star_takes_everything),
        T(star_after_params),
        T(literal_beats_param_beats_star),
        T(precedence_backs_up),
        T(deeper_literals_do_not_outrank),
        T(methods),
        T(any_method),
        T(own_method_beats_any_method),
        T(method_found_further_down),
        T(status_405_from_star),
        T(bad_patterns),
        T(colon_inside_a_segment_is_literal),
        T(duplicates),
        T(many_routes),
        T(null_params_and_status),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
