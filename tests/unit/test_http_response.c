/* The response-head parser (the WebSocket client's side of RFC 9112 §4).
 * Every input sits right before a PROT_NONE page (guard.h), so a read past
 * the given length crashes the test. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "guard.h"
#include "http/parser.h"

#define MAX_HDRS 16

static tern__http_response_head head;
static tern__http_header hdrs[MAX_HDRS];

static ssize_t parse_n(const char *s, size_t len, size_t max_head) {
    return tern__http_parse_response(guarded(s, len), len, max_head, &head, hdrs, MAX_HDRS);
}

static ssize_t parse(const char *s) { return parse_n(s, strlen(s), 16384); }

/* A valid head: every proper prefix asks for more; the whole is taken. */
static void accept_head(const char *s) {
    size_t len = strlen(s);
    for (size_t k = 0; k < len; k++) {
        ssize_t r = parse_n(s, k, 16384);
        if (r != 0)
            fail_msg("prefix of %zu bytes gave %zd, want 0", k, r);
    }
    assert_int_equal(parse(s), (ssize_t)len);
}

static void refuse(const char *s, ssize_t want) {
    ssize_t r = parse(s);
    if (r != want)
        fail_msg("gave %zd, want %zd for: %s", r, want, s);
}

static void switching_protocols(void **state) {
    const char *r = "HTTP/1.1 101 Switching Protocols\r\n"
                    "Upgrade: websocket\r\n"
                    "Connection: Upgrade\r\n"
                    "Sec-WebSocket-Accept:  s3pPLMBiTxaQ9kYGzzhZRbK+xOo= \r\n\r\n";
    accept_head(r);
    assert_int_equal(head.status, 101);
    assert_int_equal(head.minor_version, 1);
    assert_int_equal(head.reason_len, 19);
    assert_memory_equal(head.reason, "Switching Protocols", 19);
    assert_int_equal(head.num_headers, 3);
    const tern__http_header *a = tern__http_response_header(&head, "sec-websocket-accept");
    assert_non_null(a);
    assert_int_equal(a->value_len, 28);   /* trimmed */
    assert_memory_equal(a->value, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=", 28);
    assert_null(tern__http_response_header(&head, "Sec-WebSocket-Protocol"));
}

static void other_statuses_and_reasons(void **state) {
    accept_head("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
    assert_int_equal(head.status, 404);
    accept_head("HTTP/1.0 200 \r\n\r\n");   /* empty reason */
    assert_int_equal(head.status, 200);
    assert_int_equal(head.minor_version, 0);
    assert_int_equal(head.reason_len, 0);
    accept_head("HTTP/1.1 503\r\n\r\n");     /* the SP before an empty reason left out */
    assert_int_equal(head.status, 503);
    accept_head("HTTP/1.1 403 Forbidden \t\xc3\xa9\r\nX: y\r\n\r\n");   /* obs-text */
    assert_int_equal(head.reason_len, 13);
    assert_int_equal(head.num_headers, 1);
}

static void bytes_after_the_head_are_left(void **state) {
    const char *r = "HTTP/1.1 101 OK\r\nUpgrade: websocket\r\n\r\n\x81\x02hi";
    size_t len = strlen(r);
    assert_int_equal(parse_n(r, len, 16384), (ssize_t)(len - 4));
}

static void malformed(void **state) {
    refuse("HTTP/1.1 10 Short\r\n\r\n", -400);
    refuse("HTTP/1.1 1011 Long\r\n\r\n", -400);
    refuse("HTTP/1.1 abc Letters\r\n\r\n", -400);
    refuse("HTTP/1.1 099 Low\r\n\r\n", -400);
    refuse("HTTP/1.1  101 Two spaces\r\n\r\n", -400);
    refuse("HTTP/2.0 101 Two\r\n\r\n", -505);
    refuse("http/1.1 101 Lower\r\n\r\n", -400);
    refuse("HTTP/1.1 101 OK\nUpgrade: websocket\r\n\r\n", -400);        /* bare LF */
    refuse("HTTP/1.1 101 OK\r\n Folded: x\r\n\r\n", -400);             /* obs-fold */
    refuse("HTTP/1.1 101 OK\r\nNo colon\r\n\r\n", -400);
    refuse("HTTP/1.1 101 OK\r\nName : space\r\n\r\n", -400);
    refuse("HTTP/1.1 101 O\x01K\r\n\r\n", -400);                        /* control in reason */
    refuse("HTTP/1.1 101 OK\r\nX: a\x7f\r\n\r\n", -400);
    refuse("HTTP/1.1 101 OK\r\n\r\r\n", -400);
}

static void limits(void **state) {
    /* A head that has not ended within max_head is too large. */
    const char *r = "HTTP/1.1 101 OK\r\nX: 0123456789\r\n\r\n";
    assert_int_equal(parse_n(r, strlen(r), 20), -431);
    assert_int_equal(parse_n(r, 10, 20), 0);
    assert_int_equal(parse_n(r, strlen(r), strlen(r) + 1), (ssize_t)strlen(r));
    char many[2048] = "HTTP/1.1 101 OK\r\n";
    for (int i = 0; i <= MAX_HDRS; i++)
        strcat(many, "A: b\r\n");
    strcat(many, "\r\n");
    assert_int_equal(parse(many), -431);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(switching_protocols),
        cmocka_unit_test(other_statuses_and_reasons),
        cmocka_unit_test(bytes_after_the_head_are_left),
        cmocka_unit_test(malformed),
        cmocka_unit_test(limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
