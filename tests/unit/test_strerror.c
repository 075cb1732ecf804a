/* tern_strerror and tern_err_name (issue #25): tern's own codes have their
 * own text, and every string returned is static, so two results read in one
 * printf are both still there. */
#include <errno.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "tern/tern.h"

/* glibc gave strerror's per-thread buffer for unknown codes: the second
 * call overwrote the first's text. */
static void results_stay_valid(void **state) {
    const char *a = tern_strerror(-123456);
    const char *b = tern_strerror(-654321);
    assert_non_null(a);
    assert_non_null(b);
    assert_string_equal(a, "Unknown error");
    assert_ptr_equal(a, b);   /* one fixed string, not a buffer filled per call */
    const char *inval = tern_strerror(-EINVAL);
    const char *pipe = tern_strerror(-EPIPE);
    assert_string_equal(inval, "Invalid argument");
    assert_string_equal(pipe, "Broken pipe");
    /* the same pointer every time: static storage, not a buffer */
    assert_ptr_equal(tern_strerror(-EINVAL), inval);
    assert_ptr_equal(tern_strerror(-EPIPE), pipe);
    assert_string_equal(inval, "Invalid argument");
    /* a positive errno (errno itself) reads as its negative */
    assert_ptr_equal(tern_strerror(EPIPE), pipe);
    assert_string_equal(tern_strerror(INT_MIN), "Unknown error");
    assert_string_equal(tern_strerror(INT_MAX), "Unknown error");
}

/* TERN_SEND_BUFFERED (1) and TERN_SEND_DROPPED (2) read as EPERM's and
 * ENOENT's text ("Operation not permitted"). */
static void tern_codes_have_their_own_text(void **state) {
    const char *buffered = tern_strerror(TERN_SEND_BUFFERED);
    const char *dropped = tern_strerror(TERN_SEND_DROPPED);
    const char *nohost = tern_strerror(TERN_ENOHOST);
    assert_string_not_equal(buffered, "Operation not permitted");
    assert_string_not_equal(dropped, "No such file or directory");
    assert_non_null(strstr(buffered, "backlog"));
    assert_non_null(strstr(dropped, "dropped"));
    assert_string_equal(nohost, "Host name does not resolve");
    assert_string_equal(tern_strerror(TERN_SEND_OK), "Success");
    /* all still as they were after the calls that followed */
    assert_non_null(strstr(buffered, "backlog"));
    assert_string_not_equal(buffered, dropped);
    /* their errno twins keep errno's text */
    assert_string_equal(tern_strerror(-EPERM), "Operation not permitted");
    assert_string_equal(tern_strerror(-ENOENT), "No such file or directory");
}

static void names(void **state) {
    assert_string_equal(tern_err_name(-EAGAIN), "EAGAIN");
    assert_string_equal(tern_err_name(-ECONNRESET), "ECONNRESET");
    assert_string_equal(tern_err_name(-EINVAL), "EINVAL");
    assert_string_equal(tern_err_name(EPIPE), "EPIPE");
    assert_string_equal(tern_err_name(TERN_ENOHOST), "TERN_ENOHOST");
    assert_string_equal(tern_err_name(TERN_SEND_OK), "OK");
    assert_string_equal(tern_err_name(TERN_SEND_BUFFERED), "TERN_SEND_BUFFERED");
    assert_string_equal(tern_err_name(TERN_SEND_DROPPED), "TERN_SEND_DROPPED");
    assert_string_equal(tern_err_name(-123456), "UNKNOWN");
    assert_string_equal(tern_err_name(INT_MIN), "UNKNOWN");
    const char *a = tern_err_name(-EAGAIN), *b = tern_err_name(-EPIPE);
    assert_string_equal(a, "EAGAIN");
    assert_string_equal(b, "EPIPE");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(results_stay_valid),
        cmocka_unit_test(tern_codes_have_their_own_text),
        cmocka_unit_test(names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
