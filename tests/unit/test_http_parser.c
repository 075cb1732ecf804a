/* The request-head parser, against RFC 9112 and the project's limits.
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

#define MAX_HDRS 128

static const tern__http_limits defaults = {16384, 8192, 100};

static tern__http_head head;
static tern__http_header hdrs[MAX_HDRS];

static ssize_t parse_lim(const char *s, size_t len, const tern__http_limits *lim, size_t max_hdrs) {
    return tern__http_parse_head(guarded(s, len), len, lim, &head, hdrs, max_hdrs);
}

static ssize_t parse_n(const char *s, size_t len) {
    return parse_lim(s, len, &defaults, MAX_HDRS);
}

static ssize_t parse(const char *s) {
    return parse_n(s, strlen(s));
}

/* Feeds req one byte more at a time: every proper prefix must ask for
 * more, and find_head_end, fed the same way, must find the end exactly
 * when the parser does. */
static void check_prefixes(const char *req, size_t len, const tern__http_limits *lim,
                           size_t max_hdrs) {
    size_t scanned = 0;
    for (size_t k = 0; k < len; k++) {
        const char *b = guarded(req, k);
        ssize_t r = tern__http_parse_head(b, k, lim, &head, hdrs, max_hdrs);
        if (r != 0)
            fail_msg("prefix of %zu bytes gave %zd, want 0", k, r);
        assert_int_equal(tern__http_find_head_end(b, k, &scanned), 0);
    }
    const char *b = guarded(req, len);
    assert_int_equal(tern__http_find_head_end(b, len, &scanned), len);
}

/* A valid request: parsed in full (returns its length), then again one
 * byte at a time, then parsed for good so head describes it. */
static void accept_lim(const char *req, const tern__http_limits *lim, size_t max_hdrs) {
    size_t len = strlen(req);
    check_prefixes(req, len, lim, max_hdrs);
    ssize_t r = parse_lim(req, len, lim, max_hdrs);
    if (r != (ssize_t)len)
        fail_msg("parse gave %zd, want %zu for: %s", r, len, req);
}

static void accept_req(const char *req) {
    accept_lim(req, &defaults, MAX_HDRS);
}

/* A refused request: the full input gives -status, and no prefix of it is
 * ever taken as a request (each gives 0 or the same refusal). */
static void refuse_lim(const char *req, size_t len, int status, const tern__http_limits *lim,
                       size_t max_hdrs) {
    for (size_t k = 0; k < len; k++) {
        ssize_t r = parse_lim(req, k, lim, max_hdrs);
        if (r != 0 && r != -status)
            fail_msg("prefix of %zu bytes gave %zd, want 0 or %d", k, r, -status);
    }
    ssize_t r = parse_lim(req, len, lim, max_hdrs);
    if (r != -status)
        fail_msg("parse gave %zd, want %d for: %s", r, -status, req);
}

static void refuse_n(const char *req, size_t len, int status) {
    refuse_lim(req, len, status, &defaults, MAX_HDRS);
}

static void refuse(const char *req, int status) {
    refuse_n(req, strlen(req), status);
}

static void assert_view(const char *p, size_t len, const char *want) {
    size_t wl = strlen(want);
    if (len != wl || (wl && memcmp(p, want, wl) != 0))
        fail_msg("view \"%.*s\" != \"%s\"", (int)len, p ? p : "", want);
}

/* ---- the request line ------------------------------------------------ */

static void simple_get(void **state) {
    const char *req = "GET /index.html?a=1&b HTTP/1.1\r\nHost: example.com\r\n"
                      "User-Agent: t/1\r\n\r\n";
    accept_req(req);
    assert_view(head.method, head.method_len, "GET");
    assert_view(head.target, head.target_len, "/index.html?a=1&b");
    assert_view(head.path, head.path_len, "/index.html");
    assert_view(head.query, head.query_len, "a=1&b");
    assert_int_equal(head.minor_version, 1);
    assert_int_equal(head.num_headers, 2);
    assert_ptr_equal(head.headers, hdrs);
    assert_view(hdrs[0].name, hdrs[0].name_len, "Host");
    assert_view(hdrs[0].value, hdrs[0].value_len, "example.com");
    assert_view(hdrs[1].name, hdrs[1].name_len, "User-Agent");
    assert_view(hdrs[1].value, hdrs[1].value_len, "t/1");
    assert_view(head.host, head.host_len, "example.com");
    assert_int_equal(head.body_kind, TERN__BODY_NONE);
    assert_true(head.keep_alive);
    assert_false(head.expect_continue);
    assert_false(head.upgrade);
}

static void views_point_into_the_buffer(void **state) {
    const char *req = "POST /p?q HTTP/1.1\r\nHost: h\r\nX: y\r\n\r\n";
    size_t len = strlen(req);
    const char *b = guarded(req, len);
    assert_int_equal(tern__http_parse_head(b, len, &defaults, &head, hdrs, MAX_HDRS), len);
    assert_ptr_equal(head.method, b);
    assert_ptr_equal(head.target, b + 5);
    assert_ptr_equal(head.path, b + 5);
    assert_ptr_equal(head.query, b + 8);
    /* Offsets found in req: b has no NUL after it for strstr. */
    assert_ptr_equal(hdrs[1].name, b + (strstr(req, "X: y") - req));
    assert_ptr_equal(hdrs[1].value, b + (strstr(req, "y\r\n") - req));
}

static void query_absent_and_empty(void **state) {
    accept_req("GET /a HTTP/1.1\r\nHost: h\r\n\r\n");
    assert_view(head.path, head.path_len, "/a");
    assert_int_equal(head.query_len, 0);
    accept_req("GET /a? HTTP/1.1\r\nHost: h\r\n\r\n");
    assert_view(head.path, head.path_len, "/a");
    assert_int_equal(head.query_len, 0);
    accept_req("GET /a?x?y=/z HTTP/1.1\r\nHost: h\r\n\r\n");
    assert_view(head.query, head.query_len, "x?y=/z");
}

static void method_tokens(void **state) {
    accept_req("PROPFIND /d HTTP/1.1\r\nHost: h\r\n\r\n");
    accept_req("M-SEARCH /x HTTP/1.1\r\nHost: h\r\n\r\n");
    accept_req("get / HTTP/1.1\r\nHost: h\r\n\r\n");   /* case-sensitive, but a token */
    assert_view(head.method, head.method_len, "get");
    accept_req("!#$%&'*+-.^_`|~09az / HTTP/1.1\r\nHost: h\r\n\r\n");
    refuse("GE(T / HTTP/1.1\r\nHost: h\r\n\r\n", 400);
    refuse("GE\"T / HTTP/1.1\r\nHost: h\r\n\r\n", 400);
    refuse("G\x01T / HTTP/1.1\r\nHost: h\r\n\r\n", 400);
    refuse(" / HTTP/1.1\r\nHost: h\r\n\r\n", 400);
    refuse("\xc3\xa9 / HTTP/1.1\r\nHost: h\r\n\r\n", 400);
}

static void method_length(void **state) {
    char req[128];
    char m[40];
    memset(m, 'M', 32);
    m[32] = '\0';
    snprintf(req, sizeof(req), "%s / HTTP/1.1\r\nHost: h\r\n\r\n", m);
    accept_req(req);
    assert_int_equal(head.method_len, 32);
    /* RFC 9112 §3: longer than any method implemented: 501. */
    m[32] = 'M';
    m[33] = '\0';
    snprintf(req, sizeof(req), "%s / HTTP/1.1\r\nHost: h\r\n\r\n", m);
    refuse(req, 501);
    assert_int_equal(parse_n(req, 33), -501);   /* known before the line ends */
}

static void request_line_spacing(void **state) {
    refuse("GET  / HTTP/1.1\r\nHost: h\r\n\r\n", 400);
    refuse("GET /  HTTP/1.1\r\nHost: h\r\n\r\n", 400);
    refuse("GET / HTTP/1.1 \r\nHost: h\r\n\r\n", 400);
    refuse("GET\t/ HTTP/1.1\r\nHost: h\r\n\r\n", 400);
    refuse("GET /\tHTTP/1.1\r\nHost: h\r\n\r\n", 400);
}

static void missing_parts(void **state) {
    refuse("GET\r\nHost: h\r\n\r\n", 400);
    refuse("GET /\r\nHost: h\r\n\r\n", 400);
    refuse("GET / \r\nHost: h\r\n\r\n", 400);
    refuse("GET  HTTP/1.1\r\nHost: h\r\n\r\n", 400);
    refuse("\r\n\r\n", 400);
    /* Empty lines before the request line are not skipped: the head is
     * what find_head_end delimits, and it would end at the first one. */
    refuse("\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n", 400);
}

static void versions(void **state) {
    accept_req("GET / HTTP/1.0\r\n\r\n");
    assert_int_equal(head.minor_version, 0);
    assert_false(head.keep_alive);
    accept_req("GET / HTTP/1.1\r\nHost: h\r\n\r\n");
    assert_int_equal(head.minor_version, 1);
    /* Well-formed, but not ours: 505. */
    refuse("GET / HTTP/2.0\r\nHost: h\r\n\r\n", 505);
    refuse("GET / HTTP/0.9\r\nHost: h\r\n\r\n", 505);
    refuse("GET / HTTP/9.9\r\n\r\n", 505);
    /* RFC 9112 §2.3: a higher 1.x minor is answered as 1.1. */
    accept_req("GET / HTTP/1.2\r\nHost: h\r\n\r\n");
    assert_int_equal(head.minor_version, 1);
    assert_true(head.keep_alive);
    accept_req("GET / HTTP/1.9\r\nHost: h\r\n\r\n");
    assert_int_equal(head.minor_version, 1);
    /* Not an HTTP-version at all: 400. */
    refuse("GET / http/1.1\r\nHost: h\r\n\r\n", 400);
    refuse("GET / HTTP/1.10\r\nHost: h\r\n\r\n", 400);
    refuse("GET / HTTP/1\r\nHost: h\r\n\r\n", 400);
    refuse("GET / HTTP/11\r\nHost: h\r\n\r\n", 400);
    refuse("GET / HTTP/a.1\r\nHost: h\r\n\r\n", 400);
    refuse("GET / HTTP/1.x\r\nHost: h\r\n\r\n", 400);
    refuse("GET / HTTP/1,1\r\nHost: h\r\n\r\n", 400);
    refuse("GET / HTTPS/1.1\r\nHost: h\r\n\r\n", 400);
    refuse("GET / FOO\r\nHost: h\r\n\r\n", 400);
}

/* ---- request-target forms (RFC 9112 §3.2) ----------------------------- */

static void origin_form(void **state) {
    accept_req("GET / HTTP/1.1\r\nHost: h\r\n\r\n");
    assert_view(head.path, head.path_len, "/");
    accept_req("GET //a/./../b%2F;p=1:@!$&'()*+,=~_- HTTP/1.1\r\nHost: h\r\n\r\n");
    assert_view(head.path, head.path_len, "//a/./../b%2F;p=1:@!$&'()*+,=~_-");
}

static void absolute_form(void **state) {
    accept_req("GET http://example.com/p/q?x=1 HTTP/1.1\r\nHost: example.com\r\n\r\n");
    assert_view(head.target, head.target_len, "http://example.com/p/q?x=1");
    assert_view(head.path, head.path_len, "/p/q");
    assert_view(head.query, head.query_len, "x=1");
    assert_view(head.host, head.host_len, "example.com");
    accept_req("GET http://example.com HTTP/1.1\r\nHost: example.com\r\n\r\n");
    assert_view(head.path, head.path_len, "/");
    assert_int_equal(head.query_len, 0);
    accept_req("GET HTTPS://example.com:8443?a HTTP/1.1\r\nHost: example.com\r\n\r\n");
    assert_view(head.path, head.path_len, "/");
    assert_view(head.query, head.query_len, "a");
    accept_req("GET http://[::1]:80/x HTTP/1.1\r\nHost: h\r\n\r\n");
    assert_view(head.path, head.path_len, "/x");
    refuse("GET http:// HTTP/1.1\r\nHost: h\r\n\r\n", 400);
    refuse("GET http:///p HTTP/1.1\r\nHost: h\r\n\r\n", 400);
    refuse("GET http://:80/p HTTP/1.1\r\nHost: h\r\n\r\n", 400);
    refuse("GET http://user@host/p HTTP/1.1\r\nHost: h\r\n\r\n", 400);
    refuse("GET http://a:b:c/p HTTP/1.1\r\nHost: h\r\n\r\n", 400);
    refuse("GET ftp://host/p HTTP/1.1\r\nHost: h\r\n\r\n", 400);
    refuse("GET http:/host/p HTTP/1.1\r\nHost: h\r\n\r\n", 400);
    refuse("GET example.com/p HTTP/1.1\r\nHost: h\r\n\r\n", 400);
    refuse("GET ?a HTTP/1.1\r\nHost: h\r\n\r\n", 400);
}

static void asterisk_form_only_with_options(void **state) {
    accept_req("OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n");
    assert_view(head.target, head.target_len, "*");
    assert_view(head.path, head.path_len, "*");
    refuse("GET * HTTP/1.1\r\nHost: h\r\n\r\n", 400);
    refuse("M-SEARCH * HTTP/1.1\r\nHost: h\r\n\r\n", 400);
    refuse("OPTIONS *a HTTP/1.1\r\nHost: h\r\n\r\n", 400);
    refuse("OPTIONS ** HTTP/1.1\r\nHost: h\r\n\r\n", 400);
}

static void authority_form_only_with_connect(void **state) {
    accept_req("CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n");
    assert_view(head.path, head.path_len, "example.com:443");
    assert_int_equal(head.query_len, 0);
    accept_req("CONNECT [2001:db8::1]:443 HTTP/1.1\r\nHost: h\r\n\r\n");
    refuse("CONNECT example.com HTTP/1.1\r\nHost: h\r\n\r\n", 400);
    refuse("CONNECT example.com: HTTP/1.1\r\nHost: h\r\n\r\n", 400);
    refuse("CONNECT :443 HTTP/1.1\r\nHost: h\r\n\r\n", 400);
    refuse("CONNECT / HTTP/1.1\r\nHost: h\r\n\r\n", 400);
    refuse("CONNECT http://example.com:443/ HTTP/1.1\r\nHost: h\r\n\r\n", 400);
    refuse("CONNECT a@example.com:443 HTTP/1.1\r\nHost: h\r\n\r\n", 400);
    refuse("GET example.com:443 HTTP/1.1\r\nHost: h\r\n\r\n", 400);
}

static void target_bytes_are_visible_ascii(void **state) {
    refuse("GET /a\x7f HTTP/1.1\r\nHost: h\r\n\r\n", 400);
    refuse("GET /a\x80 HTTP/1.1\r\nHost: h\r\n\r\n", 400);
    refuse("GET /\xc3\xa9 HTTP/1.1\r\nHost: h\r\n\r\n", 400);
    refuse("GET /a\x01 HTTP/1.1\r\nHost: h\r\n\r\n", 400);
    refuse("GET /a\rb HTTP/1.1\r\nHost: h\r\n\r\n", 400);
    refuse("GET /a\nb HTTP/1.1\r\nHost: h\r\n\r\n", 400);
    /* A fragment is never sent (RFC 9112 §3.2). */
    refuse("GET /a#f HTTP/1.1\r\nHost: h\r\n\r\n", 400);
    /* Bad bytes past the 16-byte vector scan, and within it. */
    refuse("GET /0123456789abcdefghij\x7f HTTP/1.1\r\nHost: h\r\n\r\n", 400);
    refuse("GET /0123456789abcdefghijklmnopqrst\x1f HTTP/1.1\r\nHost: h\r\n\r\n", 400);
    refuse("GET /0123456789abcdefghijklmnopqrst\xff HTTP/1.1\r\nHost: h\r\n\r\n", 400);
}

/* ---- line endings: CRLF and nothing else ------------------------------ */

static void bare_lf_refused(void **state) {
    refuse("GET / HTTP/1.1\nHost: h\r\n\r\n", 400);
    refuse("GET / HTTP/1.1\r\nHost: h\n\r\n", 400);
    refuse("GET / HTTP/1.1\r\nHost: h\r\n\n", 400);
    refuse("GET / HTTP/1.1\n\n", 400);
    refuse("GET / HTTP/1.1\r\nHost: h\r\nX: a\nY: b\r\n\r\n", 400);
    refuse("GET / HTTP/1.1\r\nHost: h\r\n\nX: a\r\n\r\n", 400);
}

static void bare_cr_refused(void **state) {
    refuse("GET / HTTP/1.1\rHost: h\r\n\r\n", 400);
    refuse("GET / HTTP/1.1\r\rHost: h\r\n\r\n", 400);
    refuse("GET / HTTP/1.1\r\nHost: h\rX: a\r\n\r\n", 400);
    refuse("GET / HTTP/1.1\r\nHost: h\r\nX: a\rb\r\n\r\n", 400);
    refuse("GET / HTTP/1.1\r\nHost: h\r\n\r\r\n", 400);
    refuse("GET / HTTP/1.1\r\nHost: h\r\n\rX", 400);
    refuse("GET / HTTP/1.1\r\nHost: h\r\nX: a\r\r\n\r\n", 400);
}

/* ---- field lines ------------------------------------------------------ */

static void obs_fold_refused(void **state) {
    refuse("GET / HTTP/1.1\r\nHost: h\r\nX: a\r\n b\r\n\r\n", 400);
    refuse("GET / HTTP/1.1\r\nHost: h\r\nX: a\r\n\tb\r\n\r\n", 400);
    /* A first field line starting with whitespace. */
    refuse("GET / HTTP/1.1\r\n Host: h\r\n\r\n", 400);
    refuse("GET / HTTP/1.1\r\n\tHost: h\r\n\r\n", 400);
}

static void field_name_syntax(void **state) {
    refuse("GET / HTTP/1.1\r\nHost : h\r\n\r\n", 400);
    refuse("GET / HTTP/1.1\r\nHost\t: h\r\n\r\n", 400);
    refuse("GET / HTTP/1.1\r\nHost: h\r\n: empty\r\n\r\n", 400);
    refuse("GET / HTTP/1.1\r\nHost: h\r\nX(y): z\r\n\r\n", 400);
    refuse("GET / HTTP/1.1\r\nHost: h\r\nX y: z\r\n\r\n", 400);
    refuse("GET / HTTP/1.1\r\nHost: h\r\nX\xc3\xa9: z\r\n\r\n", 400);
    refuse("GET / HTTP/1.1\r\nHost: h\r\nno-colon\r\n\r\n", 400);
    refuse("GET / HTTP/1.1\r\nHost: h\r\nX\x01: z\r\n\r\n", 400);
    accept_req("GET / HTTP/1.1\r\nHost: h\r\n!#$%&'*+-.^_`|~09az: v\r\n\r\n");
}

static void field_values(void **state) {
    accept_req("GET / HTTP/1.1\r\nHost: h\r\nA:   padded \t \r\nB:\r\nC: \t\r\n"
               "D:x\r\nE: in\tside  and \x80\xff obs-text\r\n\r\n");
    assert_int_equal(head.num_headers, 6);
    assert_view(hdrs[1].value, hdrs[1].value_len, "padded");
    assert_view(hdrs[2].value, hdrs[2].value_len, "");
    assert_view(hdrs[3].value, hdrs[3].value_len, "");
    assert_view(hdrs[4].value, hdrs[4].value_len, "x");
    assert_view(hdrs[5].value, hdrs[5].value_len, "in\tside  and \x80\xff obs-text");
    /* A long value, so the vector scan sees tabs, obs-text and the end. */
    accept_req("GET / HTTP/1.1\r\nHost: h\r\nLong: 0123456789abcdef\t0123456789abcdef"
               "\xfe\xfe 0123456789abcdef0123456789abcdef\t\r\n\r\n");
    assert_view(hdrs[1].value, hdrs[1].value_len,
                "0123456789abcdef\t0123456789abcdef\xfe\xfe 0123456789abcdef0123456789abcdef");
}

static void control_chars_in_values_refused(void **state) {
    static const char bad[] = {0x01, 0x08, 0x0b, 0x0c, 0x1b, 0x1f, 0x7f};
    for (size_t i = 0; i < sizeof(bad); i++) {
        char req[128];
        int n = snprintf(req, sizeof(req), "GET / HTTP/1.1\r\nHost: h\r\nX: a%cb\r\n\r\n", bad[i]);
        refuse_n(req, (size_t)n, 400);
        n = snprintf(req, sizeof(req),
                     "GET / HTTP/1.1\r\nHost: h\r\nX: 0123456789abcdef0123%c\r\n\r\n", bad[i]);
        refuse_n(req, (size_t)n, 400);
    }
}

static void nul_anywhere_refused(void **state) {
    const char req[] = "GET /p HTTP/1.1\r\nHost: h\r\nX: v\r\n\r\n";
    size_t len = sizeof(req) - 1;
    for (size_t i = 0; i < len; i++) {
        char copy[sizeof(req)];
        memcpy(copy, req, sizeof(req));
        copy[i] = '\0';
        ssize_t r = parse_n(copy, len);
        if (r != -400)
            fail_msg("NUL at %zu gave %zd", i, r);
    }
}

/* ---- framing: Content-Length and Transfer-Encoding -------------------- */

static void content_length(void **state) {
    accept_req("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 42\r\n\r\n");
    assert_int_equal(head.body_kind, TERN__BODY_LENGTH);
    assert_int_equal(head.content_length, 42);
    accept_req("POST / HTTP/1.1\r\nHost: h\r\ncontent-LENGTH:  0 \r\n\r\n");
    assert_int_equal(head.body_kind, TERN__BODY_LENGTH);
    assert_int_equal(head.content_length, 0);
    accept_req("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0007\r\n\r\n");
    assert_int_equal(head.content_length, 7);
    accept_req("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 9223372036854775807\r\n\r\n");
    assert_int_equal(head.content_length, UINT64_C(9223372036854775807));
    accept_req("POST / HTTP/1.0\r\nContent-Length: 3\r\n\r\n");
    assert_int_equal(head.body_kind, TERN__BODY_LENGTH);
}

static void content_length_malformed(void **state) {
    static const char *const bad[] = {
        "", "+5", "-1", "5 5", "5,5", "5, 5", "0x10", "1e3", "5;", "\"5\"", "five",
        "9223372036854775808", "18446744073709551616", "99999999999999999999999",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char req[160];
        snprintf(req, sizeof(req), "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: %s\r\n\r\n",
                 bad[i]);
        refuse(req, 400);
    }
}

static void two_content_lengths_refused(void **state) {
    refuse("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", 400);
    refuse("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", 400);
    refuse("POST / HTTP/1.1\r\nContent-Length: 5\r\nHost: h\r\ncontent-length: 5\r\n\r\n", 400);
    /* Known as soon as the second line is read. */
    assert_int_equal(parse("POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n"), -400);
}

static void content_length_with_transfer_encoding_refused(void **state) {
    refuse("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n"
           "Transfer-Encoding: chunked\r\n\r\n", 400);
    refuse("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n"
           "Content-Length: 5\r\n\r\n", 400);
    refuse("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n"
           "Content-Length: 0\r\n\r\n", 400);
    refuse("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n"
           "Content-Length: 0\r\n\r\n", 400);
}

static void transfer_encoding_chunked(void **state) {
    accept_req("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n");
    assert_int_equal(head.body_kind, TERN__BODY_CHUNKED);
    accept_req("POST / HTTP/1.1\r\nHost: h\r\ntransfer-encoding:  CHUNKED \r\n\r\n");
    assert_int_equal(head.body_kind, TERN__BODY_CHUNKED);
}

static void transfer_encoding_final_not_chunked(void **state) {
    /* The length is unknowable: RFC 9112 §6.3. */
    static const char *const bad[] = {
        "gzip", "identity", "chunked, gzip", "chunked,gzip", "", "chunkedx", "xchunked",
        "chunked;q=1", "chunked, ", ", chunked", "chunked,,", "chunked chunked", "\"chunked\"",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char req[160];
        snprintf(req, sizeof(req), "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: %s\r\n\r\n",
                 bad[i]);
        refuse(req, 400);
    }
}

static void transfer_encoding_not_implemented(void **state) {
    refuse("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501);
    refuse("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", 501);
    refuse("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: deflate , chunked\r\n\r\n", 501);
    /* Several lines make one list (RFC 9110 §5.3). */
    refuse("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n"
           "Transfer-Encoding: chunked\r\n\r\n", 501);
    refuse("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n"
           "Transfer-Encoding: chunked\r\n\r\n", 501);
    refuse("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n"
           "Transfer-Encoding: gzip\r\n\r\n", 400);
}

static void transfer_encoding_in_http10_refused(void **state) {
    refuse("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400);
    refuse("POST / HTTP/1.0\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n", 400);
}

/* ---- Host ------------------------------------------------------------- */

static void host_required_once_in_http11(void **state) {
    refuse("GET / HTTP/1.1\r\n\r\n", 400);
    refuse("GET / HTTP/1.1\r\nX: y\r\n\r\n", 400);
    refuse("GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n", 400);
    refuse("GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n", 400);
    refuse("GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n", 400);
    accept_req("GET / HTTP/1.0\r\n\r\n");
    assert_null(head.host);
    /* An empty Host is what a target without authority sends. */
    accept_req("GET / HTTP/1.1\r\nHost:\r\n\r\n");
    assert_non_null(head.host);
    assert_int_equal(head.host_len, 0);
}

static void host_syntax(void **state) {
    accept_req("GET / HTTP/1.1\r\nHost: example.com:8080\r\n\r\n");
    assert_view(head.host, head.host_len, "example.com:8080");
    accept_req("GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n");
    accept_req("GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    accept_req("GET / HTTP/1.1\r\nHost: xn--bcher-kva.example\r\n\r\n");
    refuse("GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400);
    refuse("GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", 400);
    refuse("GET / HTTP/1.1\r\nHost: user@a\r\n\r\n", 400);
    refuse("GET / HTTP/1.1\r\nHost: a:b\r\n\r\n", 400);
    refuse("GET / HTTP/1.1\r\nHost: :80\r\n\r\n", 400);
    refuse("GET / HTTP/1.1\r\nHost: [::1\r\n\r\n", 400);
    refuse("GET / HTTP/1.1\r\nHost: a,b\r\nHost: c\r\n\r\n", 400);
}

/* ---- Connection, Upgrade, Expect -------------------------------------- */

static void keep_alive(void **state) {
    accept_req("GET / HTTP/1.1\r\nHost: h\r\n\r\n");
    assert_true(head.keep_alive);
    accept_req("GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n");
    assert_false(head.keep_alive);
    accept_req("GET / HTTP/1.1\r\nHost: h\r\nConnection: Keep-Alive, CLOSE\r\n\r\n");
    assert_false(head.keep_alive);
    accept_req("GET / HTTP/1.1\r\nHost: h\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n");
    assert_false(head.keep_alive);
    accept_req("GET / HTTP/1.1\r\nHost: h\r\nConnection: closed\r\n\r\n");
    assert_true(head.keep_alive);
    accept_req("GET / HTTP/1.0\r\n\r\n");
    assert_false(head.keep_alive);
    accept_req("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    assert_true(head.keep_alive);
    accept_req("GET / HTTP/1.0\r\nConnection: foo ,\tKEEP-ALIVE\r\n\r\n");
    assert_true(head.keep_alive);
    accept_req("GET / HTTP/1.0\r\nConnection: keep-alive, close\r\n\r\n");
    assert_false(head.keep_alive);
}

static void upgrade(void **state) {
    accept_req("GET / HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n");
    assert_true(head.upgrade);
    assert_true(head.keep_alive);
    accept_req("GET / HTTP/1.1\r\nHost: h\r\nConnection: keep-alive, upgrade\r\n"
               "Upgrade: websocket\r\n\r\n");
    assert_true(head.upgrade);
    accept_req("GET / HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\n\r\n");
    assert_false(head.upgrade);
    accept_req("GET / HTTP/1.1\r\nHost: h\r\nConnection: upgrade\r\n\r\n");
    assert_false(head.upgrade);
    accept_req("GET / HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: upgraded\r\n\r\n");
    assert_false(head.upgrade);
}

static void expect(void **state) {
    accept_req("PUT / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n");
    assert_true(head.expect_continue);
    accept_req("PUT / HTTP/1.1\r\nHost: h\r\nexpect:  100-Continue \r\n\r\n");
    assert_true(head.expect_continue);
    accept_req("PUT / HTTP/1.1\r\nHost: h\r\n\r\n");
    assert_false(head.expect_continue);
    /* RFC 9110 §10.1.1: ignored from an HTTP/1.0 client. */
    accept_req("PUT / HTTP/1.0\r\nExpect: 100-continue\r\n\r\n");
    assert_false(head.expect_continue);
    refuse("PUT / HTTP/1.1\r\nHost: h\r\nExpect: 200-ok\r\n\r\n", 417);
    refuse("PUT / HTTP/1.1\r\nHost: h\r\nExpect:\r\n\r\n", 417);
    refuse("PUT / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue, x\r\n\r\n", 417);
    refuse("PUT / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nExpect: x\r\n\r\n", 417);
}

/* ---- limits: exactly at the limit is accepted, one over is refused ---- */

/* A request whose target has exactly n bytes. */
static char *with_target(size_t n) {
    char *req = malloc(n + 64);
    assert_non_null(req);
    memcpy(req, "GET /", 5);
    memset(req + 5, 'a', n - 1);
    strcpy(req + 4 + n, " HTTP/1.1\r\nHost: h\r\n\r\n");
    return req;
}

static void uri_limit(void **state) {
    tern__http_limits lim = {16384, 100, 100};
    char *req = with_target(100);
    ssize_t r = parse_lim(req, strlen(req), &lim, MAX_HDRS);
    assert_int_equal(r, strlen(req));
    assert_int_equal(head.target_len, 100);
    free(req);

    req = with_target(101);
    assert_int_equal(parse_lim(req, strlen(req), &lim, MAX_HDRS), -414);
    /* Refused as soon as the 101st target byte is in, and not before. */
    assert_int_equal(parse_lim(req, 4 + 100, &lim, MAX_HDRS), 0);
    assert_int_equal(parse_lim(req, 4 + 101, &lim, MAX_HDRS), -414);
    free(req);

    /* At the default 8 KiB too, with the whole line at once. */
    req = with_target(8192);
    accept_req(req);
    free(req);
    req = with_target(8193);
    refuse(req, 414);
    free(req);
}

/* A request with n field lines (Host among them). */
static char *with_headers(size_t n) {
    char *req = malloc(64 + n * 16);
    assert_non_null(req);
    size_t len = (size_t)sprintf(req, "GET / HTTP/1.1\r\nHost: h\r\n");
    for (size_t i = 1; i < n; i++)
        len += (size_t)sprintf(req + len, "X-%zu: v\r\n", i);
    strcpy(req + len, "\r\n");
    return req;
}

static void header_count_limit(void **state) {
    tern__http_limits lim = {16384, 8192, 10};
    char *req = with_headers(10);
    accept_lim(req, &lim, MAX_HDRS);
    assert_int_equal(head.num_headers, 10);
    free(req);
    req = with_headers(11);
    refuse_lim(req, strlen(req), 431, &lim, MAX_HDRS);
    free(req);

    /* The caller's array is the other bound; the smaller one counts. */
    req = with_headers(5);
    accept_lim(req, &lim, 5);
    free(req);
    req = with_headers(6);
    refuse_lim(req, strlen(req), 431, &lim, 5);
    free(req);

    /* The default 100. */
    req = with_headers(100);
    accept_req(req);
    assert_int_equal(head.num_headers, 100);
    free(req);
    req = with_headers(101);
    refuse(req, 431);
    free(req);

    /* No room at all. */
    refuse_lim("GET / HTTP/1.1\r\nHost: h\r\n\r\n", 27, 431, &lim, 0);
    assert_int_equal(parse_lim("GET / HTTP/1.0\r\n\r\n", 18, &lim, 0), 18);
}

/* A request whose head has exactly n bytes (n >= 40). */
static char *with_head_size(size_t n) {
    char *req = malloc(n + 1);
    assert_non_null(req);
    size_t len = (size_t)sprintf(req, "GET / HTTP/1.1\r\nHost: h\r\nX: ");
    size_t pad = n - len - 4;
    memset(req + len, 'v', pad);
    strcpy(req + len + pad, "\r\n\r\n");
    assert_int_equal(strlen(req), n);
    return req;
}

static void head_size_limit(void **state) {
    tern__http_limits lim = {200, 8192, 100};
    char *req = with_head_size(200);
    accept_lim(req, &lim, MAX_HDRS);
    free(req);

    req = with_head_size(201);
    assert_int_equal(parse_lim(req, 201, &lim, MAX_HDRS), -431);
    /* Incomplete: more below the limit, refused once it is reached,
     * since the rest could only make the head longer. */
    assert_int_equal(parse_lim(req, 199, &lim, MAX_HDRS), 0);
    assert_int_equal(parse_lim(req, 200, &lim, MAX_HDRS), -431);
    free(req);

    /* A head within the limit with a body after it: the body is not the
     * head's business, however long. */
    char buf[600];
    int n = snprintf(buf, sizeof(buf), "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 400\r\n\r\n");
    memset(buf + n, 'b', 400);
    assert_int_equal(parse_lim(buf, (size_t)n + 400, &lim, MAX_HDRS), n);

    /* The default 16 KiB. */
    req = with_head_size(16384);
    accept_req(req);
    free(req);
    req = with_head_size(16385);
    assert_int_equal(parse_n(req, 16385), -431);
    free(req);
}

static void incomplete_over_a_limit(void **state) {
    tern__http_limits lim = {100, 20, 100};
    /* A target longer than max_uri, its end not in yet: 414. */
    char line[64] = "GET /";
    memset(line + 5, 'a', 30);
    assert_int_equal(parse_lim(line, 4 + 20, &lim, MAX_HDRS), 0);
    assert_int_equal(parse_lim(line, 4 + 21, &lim, MAX_HDRS), -414);
    assert_int_equal(parse_lim(line, 4 + 30, &lim, MAX_HDRS), -414);
    /* Field lines never ending: 431 at max_head bytes. */
    char buf[200];
    int n = snprintf(buf, sizeof(buf), "GET / HTTP/1.1\r\nHost: h\r\nX: ");
    memset(buf + n, 'x', sizeof(buf) - (size_t)n);
    assert_int_equal(parse_lim(buf, 99, &lim, MAX_HDRS), 0);
    assert_int_equal(parse_lim(buf, 100, &lim, MAX_HDRS), -431);
    assert_int_equal(parse_lim(buf, 200, &lim, MAX_HDRS), -431);
}

static void null_limits_are_the_defaults(void **state) {
    const char *req = "GET / HTTP/1.1\r\nHost: h\r\n\r\n";
    const char *b = guarded(req, strlen(req));
    assert_int_equal(tern__http_parse_head(b, strlen(req), NULL, &head, hdrs, MAX_HDRS),
                     strlen(req));
}

/* ---- incomplete input -------------------------------------------------- */

static void refused_early(void **state) {
    /* Bytes no continuation can make valid are refused before the head
     * ends, so garbage need not wait for the head timeout. */
    assert_int_equal(parse("G\x01"), -400);
    assert_int_equal(parse("GET /\x01"), -400);
    assert_int_equal(parse("GET / HTTX"), -400);
    assert_int_equal(parse("GET / HTTP/1.1\n"), -400);
    assert_int_equal(parse("GET / HTTP/1.1\r\nHost: h\x01"), -400);
    assert_int_equal(parse("GET / HTTP/1.1\r\nHost: h\r\n X"), -400);
    assert_int_equal(parse("GET / HTTP/1.1\r\nHost : h"), -400);
    assert_int_equal(parse("GET / HTTP/1.1\r\nHost: h\r\nHost: h\r\n"), -400);
    assert_int_equal(parse("GET / HTTP/1.1\r\nExpect: nope\r\n"), -417);
    assert_int_equal(parse("GET / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n"), -400);
    /* ...but valid prefixes just ask for more. */
    assert_int_equal(parse(""), 0);
    assert_int_equal(parse("G"), 0);
    assert_int_equal(parse("GET / HTTP/1.1\r"), 0);
    assert_int_equal(parse("GET / HTTP/1.1\r\nHost: h\r\n\r"), 0);
}

static void byte_at_a_time(void **state) {
    /* accept_req already feeds each request byte by byte; these are the
     * shapes where a split lands somewhere interesting. */
    accept_req("GET / HTTP/1.1\r\nHost: h\r\n\r\n");
    accept_req("OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n");
    accept_req("POST /upload?x=1 HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n"
               "Expect: 100-continue\r\nConnection: keep-alive\r\n\r\n");
    accept_req("GET http://h HTTP/1.0\r\nA:\r\nB: \t \r\n\r\n");
}

static void pipelined(void **state) {
    const char *r1 = "GET /1 HTTP/1.1\r\nHost: h\r\n\r\n";
    const char *r2 = "POST /2 HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\n";
    const char *r3 = "GET /3 HTTP/1.1\r\nHost: h\r\n\r\n";
    char reqs[256];
    snprintf(reqs, sizeof(reqs), "%s%sabc%s", r1, r2, r3);
    size_t len = strlen(reqs);
    const char *b = guarded(reqs, len);
    size_t pos = 0;
    ssize_t r = tern__http_parse_head(b, len, &defaults, &head, hdrs, MAX_HDRS);
    assert_int_equal(r, strlen(r1));
    assert_view(head.path, head.path_len, "/1");
    pos += (size_t)r;
    r = tern__http_parse_head(b + pos, len - pos, &defaults, &head, hdrs, MAX_HDRS);
    assert_int_equal(r, strlen(r2));
    assert_view(head.path, head.path_len, "/2");
    assert_int_equal(head.content_length, 3);
    pos += (size_t)r + 3;
    r = tern__http_parse_head(b + pos, len - pos, &defaults, &head, hdrs, MAX_HDRS);
    assert_int_equal(r, strlen(r3));
    assert_view(head.path, head.path_len, "/3");
    assert_int_equal(pos + (size_t)r, len);
}

/* ---- find_head_end ----------------------------------------------------- */

static void find_head_end_whole_and_split(void **state) {
    const char *req = "GET / HTTP/1.1\r\nHost: h\r\n\r\nBODY\r\n\r\n";
    size_t end = 27, len = strlen(req);
    size_t scanned = 0;
    assert_int_equal(tern__http_find_head_end(guarded(req, len), len, &scanned), end);
    /* Fed in two parts, split everywhere, the terminator split too. */
    for (size_t k = 0; k <= len; k++) {
        scanned = 0;
        size_t first = tern__http_find_head_end(guarded(req, k), k, &scanned);
        if (k < end) {
            assert_int_equal(first, 0);
            assert_int_equal(scanned, k);
            assert_int_equal(tern__http_find_head_end(guarded(req, len), len, &scanned), end);
        } else {
            assert_int_equal(first, end);
        }
    }
}

static void find_head_end_needs_crlfcrlf(void **state) {
    size_t scanned = 0;
    const char *s = "GET / HTTP/1.1\n\nHost: h\r\n\n\r\n\r\r\n";
    assert_int_equal(tern__http_find_head_end(guarded(s, strlen(s)), strlen(s), &scanned), 0);
    assert_int_equal(scanned, strlen(s));
    scanned = 0;
    assert_int_equal(tern__http_find_head_end(guarded("", 0), 0, &scanned), 0);
    scanned = 0;
    assert_int_equal(tern__http_find_head_end(guarded("\r\n\r\n", 4), 4, &scanned), 4);
    scanned = 0;
    assert_int_equal(tern__http_find_head_end(guarded("\n\r\n\r\n", 5), 5, &scanned), 5);
}

/* ---- helpers ----------------------------------------------------------- */

static void find_header(void **state) {
    accept_req("GET / HTTP/1.1\r\nHost: h\r\nX-One: 1\r\nx-one: 2\r\n\r\n");
    const tern__http_header *h = tern__http_find_header(&head, "X-ONE");
    assert_non_null(h);
    assert_view(h->value, h->value_len, "1");
    assert_non_null(tern__http_find_header(&head, "host"));
    assert_null(tern__http_find_header(&head, "X-On"));
    assert_null(tern__http_find_header(&head, "X-One-Two"));
}

static void has_token(void **state) {
    const char *v = "keep-alive, Upgrade ,\tfoo\t,, bar baz ,";
    size_t n = strlen(v);
    assert_true(tern__http_has_token(v, n, "keep-alive"));
    assert_true(tern__http_has_token(v, n, "upgrade"));
    assert_true(tern__http_has_token(v, n, "FOO"));
    assert_true(tern__http_has_token(v, n, "bar baz"));
    assert_false(tern__http_has_token(v, n, "bar"));
    assert_false(tern__http_has_token(v, n, "keep"));
    assert_false(tern__http_has_token(v, n, "alive"));
    assert_false(tern__http_has_token(v, n, "close"));
    assert_false(tern__http_has_token("", 0, "close"));
    assert_true(tern__http_has_token("close", 5, "close"));
    assert_false(tern__http_has_token("closed", 6, "close"));
    assert_false(tern__http_has_token("close", 4, "close"));
    /* The value is a view: nothing past len is read. */
    const char *g = guarded("close", 5);
    assert_true(tern__http_has_token(g, 5, "close"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(simple_get),
        cmocka_unit_test(views_point_into_the_buffer),
        cmocka_unit_test(query_absent_and_empty),
        cmocka_unit_test(method_tokens),
        cmocka_unit_test(method_length),
        cmocka_unit_test(request_line_spacing),
        cmocka_unit_test(missing_parts),
        cmocka_unit_test(versions),
        cmocka_unit_test(origin_form),
        cmocka_unit_test(absolute_form),
        cmocka_unit_test(asterisk_form_only_with_options),
        cmocka_unit_test(authority_form_only_with_connect),
        cmocka_unit_test(target_bytes_are_visible_ascii),
        cmocka_unit_test(bare_lf_refused),
        cmocka_unit_test(bare_cr_refused),
        cmocka_unit_test(obs_fold_refused),
        cmocka_unit_test(field_name_syntax),
        cmocka_unit_test(field_values),
        cmocka_unit_test(control_chars_in_values_refused),
        cmocka_unit_test(nul_anywhere_refused),
        cmocka_unit_test(content_length),
        cmocka_unit_test(content_length_malformed),
        cmocka_unit_test(two_content_lengths_refused),
        cmocka_unit_test(content_length_with_transfer_encoding_refused),
        cmocka_unit_test(transfer_encoding_chunked),
        cmocka_unit_test(transfer_encoding_final_not_chunked),
        cmocka_unit_test(transfer_encoding_not_implemented),
        cmocka_unit_test(transfer_encoding_in_http10_refused),
        cmocka_unit_test(host_required_once_in_http11),
        cmocka_unit_test(host_syntax),
        cmocka_unit_test(keep_alive),
        cmocka_unit_test(upgrade),
        cmocka_unit_test(expect),
        cmocka_unit_test(uri_limit),
        cmocka_unit_test(header_count_limit),
        cmocka_unit_test(head_size_limit),
        cmocka_unit_test(incomplete_over_a_limit),
        cmocka_unit_test(null_limits_are_the_defaults),
        cmocka_unit_test(refused_early),
        cmocka_unit_test(byte_at_a_time),
        cmocka_unit_test(pipelined),
        cmocka_unit_test(find_head_end_whole_and_split),
        cmocka_unit_test(find_head_end_needs_crlfcrlf),
        cmocka_unit_test(find_header),
        cmocka_unit_test(has_token),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
