/* The opening handshake (RFC 6455 §4.2): Sec-WebSocket-Key, -Accept and
 * the choice of a subprotocol. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "guard.h"
#include "ws/handshake.h"

static void accept_rfc_example(void **state) {
    /* RFC 6455 §1.3. */
    char out[TERN__WS_ACCEPT_LEN + 1];
    const char *key = "dGhlIHNhbXBsZSBub25jZQ==";
    assert_true(tern__ws_key_valid(key, strlen(key)));
    tern__ws_accept(key, strlen(key), out);
    assert_string_equal(out, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    assert_int_equal(strlen(out), TERN__WS_ACCEPT_LEN);
}

static void accept_other_keys(void **state) {
    char out[TERN__WS_ACCEPT_LEN + 1];
    /* The example in Wikipedia's WebSocket article (checked with
     * `openssl sha1 -binary | base64`). */
    tern__ws_accept("x3JJHMbDL1EzLkh9GBhXDw==", 24, out);
    assert_string_equal(out, "HSmrc0sMlYUkAGmm5OPpG2HaGWk=");
    /* Only len bytes of the key are hashed, and the key need not be
     * NUL-terminated: it is a view into the request. */
    guard gp;
    uint8_t *g = (uint8_t *)guard_put(&gp, "dGhlIHNhbXBsZSBub25jZQ==", 24);
    tern__ws_accept((const char *)g, 24, out);
    guard_free(&gp);
    assert_string_equal(out, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    const char *padded = "dGhlIHNhbXBsZSBub25jZQ==trailing";
    tern__ws_accept(padded, 24, out);
    assert_string_equal(out, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    /* Any input gives 28 characters of base64 (the empty key too). */
    tern__ws_accept("", 0, out);
    assert_int_equal(strlen(out), TERN__WS_ACCEPT_LEN);
    assert_int_equal(out[27], '=');
}

static void key_validity(void **state) {
    static const char *const good[] = {
        "dGhlIHNhbXBsZSBub25jZQ==",
        "AAAAAAAAAAAAAAAAAAAAAA==",
        "/////////////////////w==",
        "+/+/+/+/+/+/+/+/+/+/+A==",
        "x3JJHMbDL1EzLkh9GBhXDw==",
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        guard gp;
        uint8_t *g = (uint8_t *)guard_put(&gp, good[i], 24);
        assert_true(tern__ws_key_valid((const char *)g, 24));
        guard_free(&gp);
    }
    static const char *const bad[] = {
        "",
        "dGhlIHNhbXBsZSBub25jZQ=",      /* 23 */
        "dGhlIHNhbXBsZSBub25jZQ===",    /* 25 */
        "dGhlIHNhbXBsZSBub25jZQ",       /* no padding */
        "dGhlIHNhbXBsZSBub25jZQAA",     /* 24 chars, but 18 bytes */
        "dGhlIHNhbXBsZSBub25jZQA=",     /* 17 bytes */
        "dGhlIHNhbXBsZSBub25jZ===",     /* 15 bytes and a stray pad */
        "dGhlIHNhbXBsZSBub25j-Q==",     /* base64url, not base64 */
        "dGhlIHNhbXBsZSBub25j_Q==",
        "dGhlIHNhbXBsZSBu b25jZQ==",
        "dGhlIHNhbX=sZSBub25jZQ==",     /* padding in the middle */
        " GhlIHNhbXBsZSBub25jZQ==",
        "dGhlIHNhbXBsZSBub25jZQ\xc3\xa9",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_false(tern__ws_key_valid(bad[i], strlen(bad[i])));
    }
    /* A NUL inside: the length, not the terminator, decides. */
    assert_false(tern__ws_key_valid("dGhlIHNhbXBsZSBub25jZQ\0=", 24));
    /* The right text, but the length says otherwise. */
    assert_false(tern__ws_key_valid("dGhlIHNhbXBsZSBub25jZQ==", 23));
    assert_false(tern__ws_key_valid("dGhlIHNhbXBsZSBub25jZQ== ", 25));
    assert_false(tern__ws_key_valid(NULL, 24));
}

static const char *const server[] = {"chat", "superchat", "v2.json", NULL};

static int pick(const char *offer) {
    size_t n = strlen(offer);
    guard gp;
    uint8_t *g = (uint8_t *)guard_put(&gp, offer, n);
    int r = tern__ws_pick_subprotocol((const char *)g, n, server);
    guard_free(&gp);
    return r;
}

static void subprotocol_client_order(void **state) {
    assert_int_equal(pick("chat"), 0);
    assert_int_equal(pick("superchat"), 1);
    /* The client's preference wins, not the server's list order. */
    assert_int_equal(pick("superchat, chat"), 1);
    assert_int_equal(pick("chat, superchat"), 0);
    assert_int_equal(pick("unknown, v2.json, chat"), 2);
    assert_int_equal(pick("mqtt,wamp.2.json,superchat"), 1);
}

static void subprotocol_list_syntax(void **state) {
    assert_int_equal(pick(""), -1);
    assert_int_equal(pick("   "), -1);
    assert_int_equal(pick(",,,"), -1);
    assert_int_equal(pick(" , ,chat"), 0);
    assert_int_equal(pick("\tchat\t"), 0);
    assert_int_equal(pick("foo ,  superchat  , chat"), 1);
    assert_int_equal(pick("chat,"), 0);
    /* Exact names only: no case folding, no prefixes or extensions. */
    assert_int_equal(pick("Chat"), -1);
    assert_int_equal(pick("cha"), -1);
    assert_int_equal(pick("chatx"), -1);
    assert_int_equal(pick("chat x"), -1);
    assert_int_equal(pick("\"chat\""), -1);
    assert_int_equal(pick("v2json"), -1);
}

static void subprotocol_no_server_list(void **state) {
    static const char *const none[] = {NULL};
    assert_int_equal(tern__ws_pick_subprotocol("chat", 4, none), -1);
    assert_int_equal(tern__ws_pick_subprotocol("chat", 4, NULL), -1);
    assert_int_equal(tern__ws_pick_subprotocol(NULL, 0, server), -1);
    /* Only len bytes count. */
    assert_int_equal(tern__ws_pick_subprotocol("chatroom", 4, server), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(accept_rfc_example),
        cmocka_unit_test(accept_other_keys),
        cmocka_unit_test(key_validity),
        cmocka_unit_test(subprotocol_client_order),
        cmocka_unit_test(subprotocol_list_syntax),
        cmocka_unit_test(subprotocol_no_server_list),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
