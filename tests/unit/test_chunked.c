/* The chunked transfer coding decoder (RFC 9112 §7.1): what it takes, what
 * it refuses, and that the data it hands out is the same however the body
 * is cut into reads. Inputs end at a PROT_NONE page (guard.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "guard.h"
#include "http/chunked.h"

#define TRAILER_MAX 64

/* What one decoding of a whole input gave. */
typedef struct outcome {
    int result;          /* DONE, ERROR or MORE (input used up) */
    size_t consumed;     /* bytes used in all */
    char data[4096];
    size_t data_len;
} outcome;

/* Decodes in[0..len) handed over in reads of `step` bytes (0: all at
 * once), each read in its own guarded buffer, the way a connection would
 * see them. Checks each DATA span lies inside its read. */
static outcome decode_steps(const char *in, size_t len, size_t step, size_t max_trailer) {
    outcome o;
    memset(&o, 0, sizeof(o));
    tern__chunked d;
    tern__chunked_init(&d);
    size_t pos = 0;
    int r = TERN__CHUNKED_MORE;
    while (pos < len || len == 0) {
        size_t n = step == 0 || len - pos < step ? len - pos : step;
        guard g;
        const char *b = guard_put(&g, in + pos, n);
        size_t off = 0;
        for (;;) {
            size_t used = 99;
            const char *data = (const char *)1;
            size_t data_len = 99;
            r = tern__chunked_decode(&d, b + off, n - off, &used, &data, &data_len, max_trailer);
            assert_true(used <= n - off);
            if (r == TERN__CHUNKED_DATA) {
                /* The span ends where consumption stops, inside this read. */
                assert_true(data >= b + off);
                assert_true(data_len > 0);
                assert_ptr_equal(data + data_len, b + off + used);
                assert_true(o.data_len + data_len <= sizeof(o.data));
                memcpy(o.data + o.data_len, data, data_len);
                o.data_len += data_len;
            } else {
                assert_null(data);
                assert_int_equal(data_len, 0);
            }
            off += used;
            if (r != TERN__CHUNKED_DATA)
                break;
        }
        guard_free(&g);
        pos += off;
        if (r == TERN__CHUNKED_DONE || r == TERN__CHUNKED_ERROR)
            break;
        assert_int_equal(off, n);   /* MORE: everything was used */
        if (len == 0)
            break;
    }
    o.result = r;
    o.consumed = pos;
    return o;
}

/* Decodes in every way: at once, one byte at a time, and cut in two at
 * every point; all must agree. Returns the outcome. */
static outcome decode_all_ways(const char *in, size_t len, size_t max_trailer) {
    outcome whole = decode_steps(in, len, 0, max_trailer);
    for (size_t step = 1; step <= 3; step++) {
        outcome o = decode_steps(in, len, step, max_trailer);
        assert_int_equal(o.result, whole.result);
        assert_int_equal(o.consumed, whole.consumed);
        assert_int_equal(o.data_len, whole.data_len);
        assert_memory_equal(o.data, whole.data, whole.data_len);
    }
    for (size_t cut = 1; cut < len; cut++) {
        /* Two reads: [0, cut) then [cut, len). */
        outcome o;
        memset(&o, 0, sizeof(o));
        tern__chunked d;
        tern__chunked_init(&d);
        size_t pos = 0;
        int r = TERN__CHUNKED_MORE;
        for (int part = 0; part < 2 && r != TERN__CHUNKED_DONE && r != TERN__CHUNKED_ERROR; part++) {
            size_t end = part == 0 ? cut : len;
            do {
                size_t used;
                const char *data;
                size_t dl;
                r = tern__chunked_decode(&d, in + pos, end - pos, &used, &data, &dl, max_trailer);
                if (r == TERN__CHUNKED_DATA) {
                    memcpy(o.data + o.data_len, data, dl);
                    o.data_len += dl;
                }
                pos += used;
            } while (r == TERN__CHUNKED_DATA);
        }
        assert_int_equal(r, whole.result);
        assert_int_equal(pos, whole.consumed);
        assert_int_equal(o.data_len, whole.data_len);
        assert_memory_equal(o.data, whole.data, whole.data_len);
    }
    return whole;
}

/* A body that decodes to `want` and ends after `len` bytes. */
static void body_ok(const char *in, const char *want) {
    size_t len = strlen(in);
    outcome o = decode_all_ways(in, len, TRAILER_MAX);
    if (o.result != TERN__CHUNKED_DONE)
        fail_msg("result %d, want DONE for \"%s\"", o.result, in);
    assert_int_equal(o.consumed, len);
    assert_int_equal(o.data_len, strlen(want));
    assert_memory_equal(o.data, want, o.data_len);
}

static void body_bad_n(const char *in, size_t len, size_t max_trailer) {
    outcome o = decode_all_ways(in, len, max_trailer);
    if (o.result != TERN__CHUNKED_ERROR)
        fail_msg("result %d, want ERROR for \"%.*s\"", o.result, (int)len, in);
}

static void body_bad(const char *in) {
    body_bad_n(in, strlen(in), TRAILER_MAX);
}

static void body_incomplete(const char *in) {
    outcome o = decode_all_ways(in, strlen(in), TRAILER_MAX);
    if (o.result != TERN__CHUNKED_MORE)
        fail_msg("result %d, want MORE for \"%s\"", o.result, in);
    assert_int_equal(o.consumed, strlen(in));
}

/* ---- well-formed bodies ----------------------------------------------- */

static void one_chunk(void **state) {
    body_ok("5\r\nhello\r\n0\r\n\r\n", "hello");
}

static void several_chunks_and_hex(void **state) {
    body_ok("1\r\na\r\n2\r\nbc\r\nA\r\n0123456789\r\na\r\nABCDEFGHIJ\r\n0\r\n\r\n",
            "abc0123456789ABCDEFGHIJ");
    body_ok("1F\r\n0123456789012345678901234567890\r\n0\r\n\r\n",
            "0123456789012345678901234567890");
}

static void empty_body(void **state) {
    body_ok("0\r\n\r\n", "");
    body_ok("000\r\n\r\n", "");
}

static void data_may_hold_anything(void **state) {
    const char in[] = "6\r\n\r\n0\r\n\0\r\n0\r\n\r\n";
    outcome o = decode_all_ways(in, sizeof(in) - 1, TRAILER_MAX);
    assert_int_equal(o.result, TERN__CHUNKED_DONE);
    assert_int_equal(o.data_len, 6);
    assert_memory_equal(o.data, "\r\n0\r\n\0", 6);
}

static void leading_zeros_up_to_16_digits(void **state) {
    body_ok("0000000000000005\r\nhello\r\n0\r\n\r\n", "hello");
    body_ok("0000000000000000\r\n\r\n", "");
    body_bad("00000000000000005\r\nhello\r\n0\r\n\r\n");
    body_bad("00000000000000000\r\n\r\n");
}

static void largest_chunk_size(void **state) {
    /* 2^63 - 1 is taken; the data just is not all here. */
    tern__chunked d;
    tern__chunked_init(&d);
    const char *in = guarded("7fffffffffffffff\r\nabc", 21);
    size_t used;
    const char *data;
    size_t dl;
    assert_int_equal(tern__chunked_decode(&d, in, 21, &used, &data, &dl, 0), TERN__CHUNKED_DATA);
    assert_int_equal(used, 21);
    assert_int_equal(dl, 3);
    assert_int_equal(d.remaining, UINT64_C(0x7fffffffffffffff) - 3);
    body_bad("8000000000000000\r\n");
    body_bad("ffffffffffffffff\r\n");
    body_bad("10000000000000000\r\n");
}

static void bytes_after_the_body_are_left(void **state) {
    const char in[] = "3\r\nabc\r\n0\r\n\r\nGET / HTTP/1.1\r\n";
    outcome o = decode_all_ways(in, sizeof(in) - 1, TRAILER_MAX);
    assert_int_equal(o.result, TERN__CHUNKED_DONE);
    assert_int_equal(o.consumed, strlen("3\r\nabc\r\n0\r\n\r\n"));
    assert_int_equal(o.data_len, 3);
}

static void incomplete_bodies_ask_for_more(void **state) {
    body_incomplete("");
    body_incomplete("5");
    body_incomplete("5\r");
    body_incomplete("5\r\nhel");
    body_incomplete("5\r\nhello");
    body_incomplete("5\r\nhello\r");
    body_incomplete("5\r\nhello\r\n");
    body_incomplete("5;a=\"b");
    body_incomplete("0\r\n");
    body_incomplete("0\r\nX: y\r\n");
    body_incomplete("0\r\n\r");
}

/* ---- chunk extensions: parsed, skipped, bounded ----------------------- */

static void extensions_skipped(void **state) {
    body_ok("5;foo\r\nhello\r\n0\r\n\r\n", "hello");
    body_ok("5;foo=bar\r\nhello\r\n0;last=1\r\n\r\n", "hello");
    body_ok("5 ;foo\r\nhello\r\n0\r\n\r\n", "hello");
    body_ok("5\t; foo = bar ; baz\r\nhello\r\n0\r\n\r\n", "hello");
    body_ok("5;a=\"quoted; \\\" \\\\ string\";b\r\nhello\r\n0\r\n\r\n", "hello");
    body_ok("5;a=\"\"\r\nhello\r\n0\r\n\r\n", "hello");
    body_ok("5;a=\"\x80\xff\"\r\nhello\r\n0\r\n\r\n", "hello");
    body_ok("5;a=b;c=d;e\r\nhello\r\n0\r\n\r\n", "hello");
}

static void extensions_malformed(void **state) {
    body_bad("5;\r\nhello\r\n0\r\n\r\n");
    body_bad("5;;a\r\nhello\r\n0\r\n\r\n");
    body_bad("5;=b\r\nhello\r\n0\r\n\r\n");
    body_bad("5;a=\r\nhello\r\n0\r\n\r\n");
    body_bad("5;a b\r\nhello\r\n0\r\n\r\n");
    body_bad("5;a=b c\r\nhello\r\n0\r\n\r\n");
    body_bad("5;a=\"b\"c\r\nhello\r\n0\r\n\r\n");
    body_bad("5;a(\r\nhello\r\n0\r\n\r\n");
    body_bad("5;a=\"b\r\nhello\r\n0\r\n\r\n");   /* CR can't hide in a quoted string */
    body_bad("5;a=\"b\\\r\nhello\r\n0\r\n\r\n");
    body_bad("5;a\nhello\r\n0\r\n\r\n");
    body_bad("5;a=b\nhello\r\n0\r\n\r\n");
    body_bad("5;a\rhello\r\n0\r\n\r\n");
    body_bad("5;a=\x01\r\nhello\r\n0\r\n\r\n");
    body_bad("5;a=\"\x7f\"\r\nhello\r\n0\r\n\r\n");
}

static void extension_length_bounded(void **state) {
    /* Each extension (from the first byte past the size to the CR) may
     * have max_trailer bytes. */
    char in[256];
    int n = snprintf(in, sizeof(in), "5;%s\r\nhello\r\n0\r\n\r\n", "abcdefghi");   /* 10 */
    outcome o = decode_all_ways(in, (size_t)n, 10);
    assert_int_equal(o.result, TERN__CHUNKED_DONE);
    body_bad_n(in, (size_t)n, 9);
    /* The bound is per size line, not in all. */
    n = snprintf(in, sizeof(in), "5;abcdefghi\r\nhello\r\n5;abcdefghi\r\nworld\r\n0;abcdefghi\r\n\r\n");
    o = decode_all_ways(in, (size_t)n, 10);
    assert_int_equal(o.result, TERN__CHUNKED_DONE);
    assert_int_equal(o.data_len, 10);
    /* max_trailer 0: no extension at all, but plain sizes are fine. */
    body_bad_n("5;a\r\nhello\r\n0\r\n\r\n", 17, 0);
    o = decode_all_ways("5\r\nhello\r\n0\r\n\r\n", 15, 0);
    assert_int_equal(o.result, TERN__CHUNKED_DONE);
}

/* ---- chunk sizes and the CRLFs around data ---------------------------- */

static void bad_chunk_sizes(void **state) {
    body_bad("\r\nhello\r\n0\r\n\r\n");      /* empty size */
    body_bad("0x5\r\nhello\r\n0\r\n\r\n");
    body_bad("x5\r\nhello\r\n0\r\n\r\n");
    body_bad("-5\r\nhello\r\n0\r\n\r\n");
    body_bad("+5\r\nhello\r\n0\r\n\r\n");
    body_bad(" 5\r\nhello\r\n0\r\n\r\n");    /* no leading whitespace */
    body_bad("\t5\r\nhello\r\n0\r\n\r\n");
    body_bad("5 \r\nhello\r\n0\r\n\r\n");    /* BWS only before ';' */
    body_bad("5 5\r\nhello\r\n0\r\n\r\n");
    body_bad("5g\r\nhello\r\n0\r\n\r\n");
    body_bad("g\r\n");
    body_bad("5.0\r\nhello\r\n0\r\n\r\n");
    body_bad("5,5\r\nhello\r\n0\r\n\r\n");
    body_bad("\xff\r\n");
}

static void size_line_needs_crlf(void **state) {
    body_bad("5\nhello\r\n0\r\n\r\n");
    body_bad("5\rhello\r\n0\r\n\r\n");
    body_bad("5\r\rhello\r\n0\r\n\r\n");
    body_bad("0\n\r\n");
}

static void data_must_be_followed_by_crlf(void **state) {
    body_bad("5\r\nhelloX\r\n0\r\n\r\n");       /* longer than announced */
    body_bad("5\r\nhell\r\n0\r\n\r\n");         /* shorter: "\r" is the 5th byte, '\n' not CR */
    body_bad("5\r\nhello\n0\r\n\r\n");
    body_bad("5\r\nhello\r0\r\n\r\n");
    body_bad("5\r\nhello\r\r\n0\r\n\r\n");
    body_bad("5\r\nhello0\r\n\r\n");
}

/* ---- the last chunk and trailers -------------------------------------- */

static void trailers_skipped(void **state) {
    body_ok("3\r\nabc\r\n0\r\nX-Sum: 1\r\n\r\n", "abc");
    body_ok("0\r\nA: 1\r\nB:\r\nC:  x\ty \x80\r\n\r\n", "");
}

static void trailers_malformed(void **state) {
    body_bad("0\r\n X: y\r\n\r\n");          /* obs-fold */
    body_bad("0\r\nX: y\r\n\tz\r\n\r\n");
    body_bad("0\r\nX y\r\n\r\n");            /* no colon */
    body_bad("0\r\nX : y\r\n\r\n");
    body_bad("0\r\n: y\r\n\r\n");
    body_bad("0\r\nX: y\n\r\n");             /* bare LF */
    body_bad("0\r\nX: y\r\n\n");
    body_bad("0\r\n\n");
    body_bad("0\r\nX: y\rz\r\n\r\n");        /* bare CR */
    body_bad("0\r\n\rX");
    body_bad("0\r\nX: \x01\r\n\r\n");
    body_bad("0\r\nX: \x7f\r\n\r\n");
    body_bad_n("0\r\nX: \0\r\n\r\n", 11, TRAILER_MAX);
}

static void trailer_section_bounded(void **state) {
    /* The field lines, CRLFs included, are bounded; the final CRLF is not
     * counted. "A: 123\r\n" is 8 bytes. */
    const char *in = "0\r\nA: 123\r\nB: 456\r\n\r\n";
    outcome o = decode_all_ways(in, strlen(in), 16);
    assert_int_equal(o.result, TERN__CHUNKED_DONE);
    body_bad_n(in, strlen(in), 15);
    o = decode_all_ways("0\r\n\r\n", 5, 0);
    assert_int_equal(o.result, TERN__CHUNKED_DONE);
    body_bad_n("0\r\nA:\r\n\r\n", 9, 3);
}

/* ---- the decoder's contract ------------------------------------------- */

static void zeroed_struct_is_the_start_state(void **state) {
    tern__chunked d;
    memset(&d, 0, sizeof(d));
    const char *in = guarded("0\r\n\r\n", 5);
    size_t used;
    const char *data;
    size_t dl;
    assert_int_equal(tern__chunked_decode(&d, in, 5, &used, &data, &dl, 0), TERN__CHUNKED_DONE);
    assert_int_equal(used, 5);
}

static void done_and_error_stay(void **state) {
    tern__chunked d;
    tern__chunked_init(&d);
    size_t used = 99;
    const char *data;
    size_t dl;
    const char *in = guarded("0\r\n\r\nmore", 9);
    assert_int_equal(tern__chunked_decode(&d, in, 9, &used, &data, &dl, 0), TERN__CHUNKED_DONE);
    assert_int_equal(used, 5);
    assert_int_equal(tern__chunked_decode(&d, in + 5, 4, &used, &data, &dl, 0), TERN__CHUNKED_DONE);
    assert_int_equal(used, 0);

    tern__chunked_init(&d);
    in = guarded("5x\r\n", 4);
    assert_int_equal(tern__chunked_decode(&d, in, 4, &used, &data, &dl, 0), TERN__CHUNKED_ERROR);
    assert_int_equal(used, 1);   /* the bad byte is not consumed */
    in = guarded("0\r\n\r\n", 5);
    assert_int_equal(tern__chunked_decode(&d, in, 5, &used, &data, &dl, 0), TERN__CHUNKED_ERROR);
    assert_int_equal(used, 0);
}

static void empty_input(void **state) {
    tern__chunked d;
    tern__chunked_init(&d);
    size_t used = 99;
    const char *data;
    size_t dl;
    assert_int_equal(tern__chunked_decode(&d, guarded("", 0), 0, &used, &data, &dl, 0),
                     TERN__CHUNKED_MORE);
    assert_int_equal(used, 0);
    /* Also in the middle of data. */
    assert_int_equal(tern__chunked_decode(&d, guarded("3\r\n", 3), 3, &used, &data, &dl, 0),
                     TERN__CHUNKED_MORE);
    assert_int_equal(tern__chunked_decode(&d, guarded("", 0), 0, &used, &data, &dl, 0),
                     TERN__CHUNKED_MORE);
    assert_int_equal(used, 0);
}

static void data_spans_cover_the_data_exactly(void **state) {
    /* Chunks of many sizes, cut in many ways: decode_all_ways compares
     * every cut with the whole. */
    char in[4096], want[2048];
    size_t len = 0, wl = 0;
    for (size_t size = 1; size <= 40; size += 3) {
        len += (size_t)sprintf(in + len, "%zx\r\n", size);
        for (size_t i = 0; i < size; i++) {
            char c = (char)('a' + (wl + i) % 26);
            in[len + i] = c;
            want[wl + i] = c;
        }
        len += size;
        wl += size;
        memcpy(in + len, "\r\n", 2);
        len += 2;
    }
    memcpy(in + len, "0\r\n\r\n", 5);
    len += 5;
    outcome o = decode_all_ways(in, len, TRAILER_MAX);
    assert_int_equal(o.result, TERN__CHUNKED_DONE);
    assert_int_equal(o.consumed, len);
    assert_int_equal(o.data_len, wl);
    assert_memory_equal(o.data, want, wl);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(one_chunk),
        cmocka_unit_test(several_chunks_and_hex),
        cmocka_unit_test(empty_body),
        cmocka_unit_test(data_may_hold_anything),
        cmocka_unit_test(leading_zeros_up_to_16_digits),
        cmocka_unit_test(largest_chunk_size),
        cmocka_unit_test(bytes_after_the_body_are_left),
        cmocka_unit_test(incomplete_bodies_ask_for_more),
        cmocka_unit_test(extensions_skipped),
        cmocka_unit_test(extensions_malformed),
        cmocka_unit_test(extension_length_bounded),
        cmocka_unit_test(bad_chunk_sizes),
        cmocka_unit_test(size_line_needs_crlf),
        cmocka_unit_test(data_must_be_followed_by_crlf),
        cmocka_unit_test(trailers_skipped),
        cmocka_unit_test(trailers_malformed),
        cmocka_unit_test(trailer_section_bounded),
        cmocka_unit_test(zeroed_struct_is_the_start_state),
        cmocka_unit_test(done_and_error_stay),
        cmocka_unit_test(empty_input),
        cmocka_unit_test(data_spans_cover_the_data_exactly),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
