/* tern_tls with encrypted private keys (issue #25): the passphrase comes
 * from the options (a callback or a file) or not at all; OpenSSL never
 * asks on a terminal, and each way of failing has its own error. The keys
 * are made here with the openssl command. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "tern/tern.h"

static char dir[] = "/tmp/tern-tls-XXXXXX";
static char cert[64], key[64], enc_key[64], pass_file[64];

static void path(char *out, const char *name) { snprintf(out, 64, "%s/%s", dir, name); }

static void write_file(const char *p, const char *text) {
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int setup(void **state) {
    if (mkdtemp(dir) == NULL)
        return -1;
    path(cert, "c.pem");
    path(key, "k.pem");
    path(enc_key, "ek.pem");
    path(pass_file, "pass");
    char cmd[512];
    snprintf(cmd, sizeof(cmd),
             "openssl req -x509 -newkey rsa:2048 -nodes -keyout %s -out %s -days 2 "
             "-subj /CN=localhost >/dev/null 2>&1 && "
             "openssl pkey -in %s -out %s -aes256 -passout pass:secret >/dev/null 2>&1",
             key, cert, key, enc_key);
    return system(cmd) == 0 ? 0 : -1;
}

static int teardown(void **state) {
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Log lines, to check what tern says about a key. */
static char logged[4096];
static void log_fn(int level, const char *msg, void *user) {
    size_t n = strlen(logged);
    snprintf(logged + n, sizeof(logged) - n, "%s\n", msg);
}

typedef struct pass_cb_state {
    const char *pass;
    int calls;
} pass_cb_state;

static int pass_cb(char *buf, size_t size, void *user) {
    pass_cb_state *s = user;
    s->calls++;
    size_t n = strlen(s->pass);
    if (n > size)
        return -1;
    memcpy(buf, s->pass, n);
    return (int)n;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void encrypted_key_without_passphrase_is_refused_at_once(void **state) {
    logged[0] = 0;
    tern_set_log(TERN_LOG_WARN, log_fn, NULL);
    tern_tls *tls = (tern_tls *)1;
    /* No prompt: stdin and the terminal are never read (a prompt would
     * block here, or fail as a "UI routines" error with no terminal). */
    double t0 = now_s();
    assert_int_equal(tern_tls_new(&tls, cert, enc_key), -ENOKEY);
    assert_true(now_s() - t0 < 2.0);
    assert_null(tls);
    char want[160];
    snprintf(want, sizeof(want), "the key in %s is encrypted: give its passphrase", enc_key);
    assert_non_null(strstr(logged, want));
    assert_null(strstr(logged, "UI routines"));
    /* A callback that has nothing to give is the same. */
    pass_cb_state s = {.pass = ""};
    tern_tls_options o = {.passphrase = pass_cb, .passphrase_user = &s};
    assert_int_equal(tern_tls_new_opt(&tls, cert, enc_key, &o), -ENOKEY);
    assert_true(s.calls >= 1);
    tern_set_log(TERN_LOG_WARN, NULL, NULL);
}

static void wrong_passphrase_is_said(void **state) {
    logged[0] = 0;
    tern_set_log(TERN_LOG_WARN, log_fn, NULL);
    tern_tls *tls = (tern_tls *)1;
    pass_cb_state s = {.pass = "not the secret"};
    tern_tls_options o = {.passphrase = pass_cb, .passphrase_user = &s};
    assert_int_equal(tern_tls_new_opt(&tls, cert, enc_key, &o), -EKEYREJECTED);
    assert_null(tls);
    assert_non_null(strstr(logged, "wrong passphrase"));
    write_file(pass_file, "wrong\n");
    o = (tern_tls_options){.passphrase_file = pass_file};
    assert_int_equal(tern_tls_new_opt(&tls, cert, enc_key, &o), -EKEYREJECTED);
    tern_set_log(TERN_LOG_WARN, NULL, NULL);
}

static void passphrase_callback_serves_every_load(void **state) {
    pass_cb_state s = {.pass = "secret"};
    tern_tls_options o = {.passphrase = pass_cb, .passphrase_user = &s};
    tern_tls *tls;
    /* An unencrypted key never calls it. */
    assert_int_equal(tern_tls_new_opt(&tls, cert, key, &o), 0);
    assert_int_equal(s.calls, 0);
    /* An encrypted one added, then both reloaded: once per encrypted key. */
    assert_int_equal(tern_tls_add_cert(tls, cert, enc_key), 0);
    assert_int_equal(s.calls, 1);
    assert_int_equal(tern_tls_reload(tls), 0);
    assert_int_equal(s.calls, 2);
    /* A reload with a passphrase now wrong keeps what is in use. */
    s.pass = "changed";
    assert_int_equal(tern_tls_reload(tls), -EKEYREJECTED);
    tern_tls_free(tls);
}

static void passphrase_file_first_line(void **state) {
    tern_tls *tls;
    tern_tls_options o = {.passphrase_file = pass_file};
    write_file(pass_file, "secret\r\nthe rest is not the passphrase\n");
    assert_int_equal(tern_tls_new_opt(&tls, cert, enc_key, &o), 0);
    /* Read again at a reload: a changed file counts. */
    write_file(pass_file, "wrong");
    assert_int_equal(tern_tls_reload(tls), -EKEYREJECTED);
    write_file(pass_file, "secret");
    assert_int_equal(tern_tls_reload(tls), 0);
    unlink(pass_file);
    assert_int_equal(tern_tls_reload(tls), -ENOENT);
    tern_tls_free(tls);
    /* Unreadable from the start: said at once, even for a plain key. */
    tls = (tern_tls *)1;
    assert_int_equal(tern_tls_new_opt(&tls, cert, key, &o), -ENOENT);
    assert_null(tls);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(encrypted_key_without_passphrase_is_refused_at_once),
        cmocka_unit_test(wrong_passphrase_is_said),
        cmocka_unit_test(passphrase_callback_serves_every_load),
        cmocka_unit_test(passphrase_file_first_line),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
