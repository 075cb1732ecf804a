/* The key sets of a tern_tls (net/tls.c) across reloads: a key handed to
 * a handshake stays alive until the handshake lets go of it, however many
 * reloads come meanwhile, and a set a reload replaced is freed as soon as
 * nothing holds it (no growth with reloads). Every TLS library's keys
 * live in these sets; rustls relies on the rule (it copies a key after
 * its ClientHello callback returns). */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tern/tern.h"

#include "net/tls_lib.h"

#include "cert.h"

static char dir[] = "/tmp/tern-tls-retire-XXXXXX";
static char cert[TEST_CERT_PATH_MAX], key[TEST_CERT_PATH_MAX];

static int setup(void **state) {
    (void)state;
    /* P-256: cheap to load a thousand times */
    return test_cert_make(dir, TEST_CERT_P256, true, cert, key);
}

static int teardown(void **state) {
    (void)state;
    return test_cert_remove(dir);
}

/* Does key k, read through the library's own object, still name
 * localhost? Under ASan a freed key is a use after free here. */
static bool key_alive(const tern__tls_key *k) {
    const tern__tls_names *nm = tern__tls_key_names(k);
    return nm->n == 1 && strcmp(nm->names[0], "localhost") == 0;
}

static void a_picked_key_outlives_reloads(void **state) {
    (void)state;
    tern_tls *tls = NULL;
    assert_int_equal(tern_tls_new(&tls, cert, key), 0);
    assert_int_equal(tern__tls_sets_alive(tls), 1);
    tern__tls_keyset *pin = NULL;
    const tern__tls_key *k = tern__tls_pick(tls, "localhost", 9, &pin);
    assert_non_null(k);
    assert_true(key_alive(k));
    /* Two reloads while "rustls copies": the picked set must survive both
     * (the window of issue #28's retire edge, made as wide as it gets). */
    assert_int_equal(tern_tls_reload(tls), 0);
    assert_int_equal(tern_tls_reload(tls), 0);
    assert_int_equal(tern__tls_sets_alive(tls), 2);   /* the pinned one, and the present */
    assert_true(key_alive(k));                         /* under ASan: no use after free */
    tern__tls_unpin(tls, pin);
    assert_int_equal(tern__tls_sets_alive(tls), 1);    /* freed as the handshake let go */
    tern_tls_free(tls);
}

typedef struct picker {
    tern_tls *tls;
    atomic_bool stop;
    unsigned long picks;
} picker;

/* What handshakes do to the sets: pick, read the key, let go. */
static void *pick_loop(void *arg) {
    picker *p = arg;
    while (!atomic_load(&p->stop)) {
        tern__tls_keyset *pin = NULL;
        const tern__tls_key *k = tern__tls_pick(p->tls, NULL, 0, &pin);
        if (!key_alive(k))
            fail_msg("a picked key lost its certificate");
        tern__tls_unpin(p->tls, pin);
        p->picks++;
    }
    return NULL;
}

static void a_thousand_reloads_leave_one_set(void **state) {
    (void)state;
    tern_tls *tls = NULL;
    assert_int_equal(tern_tls_new(&tls, cert, key), 0);
    picker p = {.tls = tls};
    atomic_init(&p.stop, false);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, pick_loop, &p), 0);
    for (int i = 0; i < 1000; i++) {
        assert_int_equal(tern_tls_reload(tls), 0);
        assert_true(tern__tls_sets_alive(tls) <= 2);   /* at most the one being picked */
    }
    atomic_store(&p.stop, true);
    pthread_join(th, NULL);
    assert_true(p.picks > 0);
    assert_int_equal(tern__tls_sets_alive(tls), 1);
    tern_tls_free(tls);
}

/* Client contexts are shared while held (loading the system's CAs once
 * for a hundred wss connections, not a hundred times), by their settings,
 * and made afresh after the last is let go. */
static void client_contexts_are_shared_while_held(void **state) {
    (void)state;
    tern__tls_client *a = tern__tls_client_new(NULL, false, "\x08http/1.1");
    tern__tls_client *b = tern__tls_client_new(NULL, false, "\x08http/1.1");
    tern__tls_client *insecure = tern__tls_client_new(NULL, true, "\x08http/1.1");
    tern__tls_client *other_alpn = tern__tls_client_new(NULL, false, "\x02h2");
    assert_non_null(a);
    assert_ptr_equal(a, b);
    assert_non_null(insecure);
    assert_ptr_not_equal(a, insecure);
    assert_non_null(other_alpn);
    assert_ptr_not_equal(a, other_alpn);
    assert_null(tern__tls_client_new("/nonexistent/ca.pem", false, "\x08http/1.1"));
    tern__tls_client_free(a);
    tern__tls_client *c = tern__tls_client_new(NULL, false, "\x08http/1.1");
    assert_ptr_equal(c, b);                      /* b still holds it */
    tern__tls_client_free(b);
    tern__tls_client_free(c);
    tern__tls_client_free(insecure);
    tern__tls_client_free(other_alpn);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_picked_key_outlives_reloads),
        cmocka_unit_test(a_thousand_reloads_leave_one_set),
        cmocka_unit_test(client_contexts_are_shared_while_held),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

