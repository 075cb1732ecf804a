/* Timers on a loop, and a loop that ends by itself: a repeating timer
 * ticks three times and stops itself; a one-shot timer fires, is re-armed
 * once with tern_timer_again (a fired one-shot timer is still the
 * caller's, idle), and is freed with tern_timer_stop when done. The loop
 * is stopped once both are finished; the program exits 0.
 *
 *   ./build/examples/timers */
#include <stdio.h>

#include <tern/tern.h>

typedef struct state {
    tern_loop *loop;
    int ticks;       /* of the repeating timer */
    int shots;       /* of the one-shot timer */
    int finished;    /* timers done: the loop stops at 2 */
} state;

static void finish(state *s) {
    if (++s->finished == 2)
        tern_loop_stop(s->loop);
}

static void tick(tern_timer *t, void *user) {
    state *s = user;
    printf("tick %d at %llu ms\n", ++s->ticks, (unsigned long long)tern_loop_now(s->loop));
    if (s->ticks == 3) {
        tern_timer_stop(t);   /* frees it: allowed from its own callback */
        finish(s);
    }
}

static void shot(tern_timer *t, void *user) {
    state *s = user;
    printf("shot %d\n", ++s->shots);
    /* Idle after firing, so it can be re-armed (which fails only out of
     * memory: then it ends here). */
    if (s->shots == 1 && tern_timer_again(t, 50) == 0)
        return;
    tern_timer_stop(t);
    finish(s);
}

int main(void) {
    state s = {0};
    tern_timer *repeating, *once;
    int err = tern_loop_new(&s.loop, NULL);
    if (err == 0)
        err = tern_timer_start(s.loop, &repeating, 20, 20, tick, &s);
    if (err == 0)
        err = tern_timer_start(s.loop, &once, 30, 0, shot, &s);
    if (err == 0)
        err = tern_loop_run(s.loop);
    if (err < 0)
        fprintf(stderr, "timers: %s\n", tern_strerror(err));
    tern_loop_free(s.loop);
    return err < 0;
}
