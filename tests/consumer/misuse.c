/* A misuse an application might make, built by scripts/test-consumer.sh
 * against the installed checked library (pkg-config tern-checked): a
 * second tern_timer_stop, of a timer the first one freed. The checked
 * library aborts there, its first line on stderr naming the call
 * ("tern: tern_timer_stop: ..."). Against the release library it is
 * undefined behaviour: the script never runs it that way. */
#include <stdio.h>

#include <tern/tern.h>

static void never(tern_timer *timer, void *user) {
    (void)timer;
    (void)user;
}

int main(void) {
    tern_loop *loop;
    tern_timer *timer;
    if (tern_loop_new(&loop, NULL) < 0 || tern_timer_start(loop, &timer, 60000, 0, never, NULL) < 0) {
        fprintf(stderr, "misuse: setup failed\n");
        return 1;
    }
    tern_timer_stop(timer);
    tern_timer_stop(timer); /* the misuse */
    fprintf(stderr, "misuse: the second tern_timer_stop returned\n");
    tern_loop_free(loop);
    return 0;
}
