/* Slot keys (tern__key_once, tern__loop_slot_key): a layer's key is
 * handed out at its first use, once, whichever thread asks first. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "loop/loop.h"

static void a_key_is_taken_once_and_kept(void **state) {
    (void)state;
    static _Atomic int a, b;
    int next = 0;
    int ka = tern__key_once(&a, &next, 4, "test keys");
    int kb = tern__key_once(&b, &next, 4, "test keys");
    assert_int_equal(ka, 0);
    assert_int_equal(kb, 1);
    assert_int_equal(tern__key_once(&a, &next, 4, "test keys"), ka);
    assert_int_equal(tern__key_once(&b, &next, 4, "test keys"), kb);
    assert_int_equal(next, 2);
}

static void loop_slot_keys_are_distinct_and_in_range(void **state) {
    (void)state;
    static _Atomic int a, b;
    int ka = tern__loop_slot_key(&a), kb = tern__loop_slot_key(&b);
    assert_int_not_equal(ka, kb);
    assert_in_range(ka, 0, TERN__LOOP_SLOTS_MAX - 1);
    assert_in_range(kb, 0, TERN__LOOP_SLOTS_MAX - 1);
    assert_int_equal(tern__loop_slot_key(&a), ka);
}

/* Threads racing for one fresh key all get the same one, and only one
 * key of the range is used. */
#define RACERS 8
static _Atomic int race_key;
static int race_next;
static _Atomic int race_go;

static void *racer(void *arg) {
    while (!atomic_load(&race_go))
        ;
    *(int *)arg = tern__key_once(&race_key, &race_next, 4, "test keys");
    return NULL;
}

static void racing_threads_share_one_key(void **state) {
    (void)state;
    pthread_t th[RACERS];
    int got[RACERS];
    for (int i = 0; i < RACERS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, racer, &got[i]), 0);
    atomic_store(&race_go, 1);
    for (int i = 0; i < RACERS; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < RACERS; i++)
        assert_int_equal(got[i], 0);
    assert_int_equal(race_next, 1);
}

/* Past the range's maximum the process aborts: the tables are sized by
 * it, so a layer added without raising it is found by the first test. */
static void a_key_past_the_maximum_aborts(void **state) {
    (void)state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        static _Atomic int a, b;
        int next = 0;
        close(STDERR_FILENO);   /* the message is expected */
        tern__key_once(&a, &next, 1, "test keys");
        tern__key_once(&b, &next, 1, "test keys");
        _exit(0);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGABRT);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_key_is_taken_once_and_kept),
        cmocka_unit_test(loop_slot_keys_are_distinct_and_in_range),
        cmocka_unit_test(racing_threads_share_one_key),
        cmocka_unit_test(a_key_past_the_maximum_aborts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
