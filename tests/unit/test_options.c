/* The tern command's option table and its parsers (src/app/options.c),
 * with tern serve's table (src/app/serve_options.c): the command line, a
 * configuration file, the environment, their precedence, --help and
 * --print-config. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app/options.h"
#include "app/serve_options.h"

static app_opt_set set;

static int setup(void **state) {
    assert_int_equal(app_opt_init(&set, "tern serve", app_serve_opts, SV_COUNT), 0);
    set.env_prefix = "TERN_";
    return 0;
}

static int teardown(void **state) {
    app_opt_free(&set);
    return 0;
}

static int parse(const char *first, ...) {
    char *argv[32] = {"serve"};
    int argc = 1;
    va_list ap;
    va_start(ap, first);
    for (const char *a = first; a; a = va_arg(ap, const char *))
        argv[argc++] = (char *)a;
    va_end(ap);
    return app_opt_parse_argv(&set, argc, argv);
}

/* A file of the given text, its path in path (a template's buffer). */
static void write_file(char *path, const char *text) {
    strcpy(path, "/tmp/tern-opt-XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

static void defaults_come_from_the_table(void **state) {
    assert_string_equal(app_opt_str(&set, SV_HOST), "127.0.0.1");
    assert_int_equal(app_opt_uint(&set, SV_PORT), 8080);
    assert_int_equal(app_opt_uint(&set, SV_MAX_CONNS), 10000);
    assert_false(app_opt_given(&set, SV_PORT));
    assert_null(app_opt_str(&set, SV_UNIX));
    assert_int_equal(app_opt_uint(&set, SV_QUIET), 0);
}

static void flags_take_values_both_ways(void **state) {
    assert_int_equal(parse("--port", "9000", "--host=::1", "--quiet", "--ws-async", NULL), 0);
    assert_int_equal(app_opt_uint(&set, SV_PORT), 9000);
    assert_string_equal(app_opt_str(&set, SV_HOST), "::1");
    assert_int_equal(app_opt_uint(&set, SV_QUIET), 1);
    assert_string_equal(app_opt_str(&set, SV_WS_ASYNC), "timer");   /* bare: the first choice */
    assert_int_equal(set.nargs, 0);
}

static void a_single_valued_flag_keeps_its_last_value(void **state) {
    assert_int_equal(parse("--port", "1", "--port", "2", NULL), 0);
    assert_int_equal(app_opt_uint(&set, SV_PORT), 2);
}

static void repeatable_flags_gather_in_order(void **state) {
    assert_int_equal(parse("--vhost", "a=/x", "--vhost", "b=/y", NULL), 0);
    assert_int_equal(set.vals[SV_VHOST].n, 2);
    assert_string_equal(set.vals[SV_VHOST].v[0], "a=/x");
    assert_string_equal(set.vals[SV_VHOST].v[1], "b=/y");
}

static void bad_values_are_named_with_their_range(void **state) {
    assert_int_equal(parse("--port", "65536", NULL), -EINVAL);
    assert_string_equal(set.err, "bad value for --port: 65536 (an integer from 0 to 65535)");
    assert_int_equal(parse("--max-connections", "-1", NULL), -EINVAL);
    assert_int_equal(parse("--pubsub-policy", "later", NULL), -EINVAL);
    assert_non_null(strstr(set.err, "one of drop|close|close-1013|conflate"));
    assert_int_equal(parse("--allowed-origin", "example.com", NULL), -EINVAL);
    assert_int_equal(parse("--admin-listen", "[::1]", NULL), -EINVAL);
    assert_int_equal(parse("--quiet=yes", NULL), -EINVAL);
    assert_int_equal(parse("--port", NULL), -EINVAL);
    assert_string_equal(set.err, "--port needs a value (P)");
    assert_int_equal(parse("--bogus", NULL), -EINVAL);
    assert_string_equal(set.err, "unknown option '--bogus'");
}

/* A check that says why: the message carries its reason. */
static void checks_say_why(void **state) {
    assert_int_equal(parse("--topic", "x publish", NULL), -EINVAL);
    assert_string_equal(set.err,
                        "bad value for --topic x publish: expected KEY=VALUE after the pattern");
    assert_int_equal(parse("--admin-listen", "9090", NULL), -EINVAL);
    assert_string_equal(set.err,
                        "bad value for --admin-listen 9090: expected HOST:PORT, [IPV6]:PORT or off");
    assert_int_equal(parse("--topic", "orders.* subscribe=anyone history=10", NULL), 0);
}

static void a_repeatable_flag_has_a_bound(void **state) {
    char *argv[20] = {"serve"};
    for (int i = 0; i < 9; i++)
        argv[1 + 2 * i] = "--tls-cert", argv[2 + 2 * i] = "c.pem";
    assert_int_equal(app_opt_parse_argv(&set, 19, argv), -EINVAL);
    assert_non_null(strstr(set.err, "at most 8"));
}

static void operands_and_the_double_dash(void **state) {
    assert_int_equal(parse("x", "--port", "1", "--", "--port", NULL), 0);
    assert_int_equal(set.nargs, 2);
    assert_string_equal(set.args[0], "x");
    assert_string_equal(set.args[1], "--port");
}

static void the_file_reads_names_values_and_comments(void **state) {
    char path[64];
    write_file(path, "# a comment\n"
                     "\n"
                     "max-connections 10000\n"
                     "  port   9001   # trailing comment\n"
                     "quiet\n"
                     "no-compression off\n"
                     "allowed-origin https://a.example\n"
                     "allowed-origin https://*.b.example\n");
    assert_int_equal(app_opt_parse_file(&set, path), 0);
    unlink(path);
    assert_int_equal(app_opt_uint(&set, SV_PORT), 9001);
    assert_int_equal(app_opt_uint(&set, SV_QUIET), 1);
    assert_int_equal(app_opt_uint(&set, SV_NO_PMD), 0);
    assert_int_equal(set.vals[SV_ALLOWED_ORIGIN].n, 2);
    assert_int_equal(set.vals[SV_PORT].source, APP_OPT_FROM_FILE);
}

static void file_errors_name_file_and_line(void **state) {
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"port 1\nporrt 2\n", ":2: unknown option 'porrt'"},
        {"port 1\n\nport 2\n", ":3: port given again (first on line 1"},
        {"# x\nmax-connections lots\n", ":2: bad value for max-connections: lots"},
        {"host\n", ":1: host needs a value"},
        {"quiet maybe\n", ":1: bad value for quiet: maybe (on or off)"},
        {"config other.conf\n", ":1: unknown option 'config'"},
        {"help\n", ":1: unknown option 'help'"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        app_opt_free(&set);
        setup(state);
        char path[64];
        write_file(path, cases[i].text);
        assert_int_equal(app_opt_parse_file(&set, path), -EINVAL);
        unlink(path);
        char want[256];
        snprintf(want, sizeof(want), "%s%s", path, cases[i].want);
        if (strncmp(set.err, want, strlen(want)) != 0)
            fail_msg("case %zu: got \"%s\", want \"%s...\"", i, set.err, want);
    }
    assert_int_equal(app_opt_parse_file(&set, "/nonexistent/tern.conf"), -ENOENT);
}

/* Flags over the environment over the file over the defaults, whatever
 * the order they are read in. */
static void precedence(void **state) {
    char path[64];
    write_file(path, "port 1\nmax-connections 2\nmax-head 3\nvhost f=/f\n");
    setenv("TERN_MAX_CONNECTIONS", "20", 1);
    setenv("TERN_MAX_HEAD", "30", 1);
    assert_int_equal(parse("--max-head", "300", "--vhost", "c=/c", NULL), 0);
    assert_int_equal(app_opt_parse_file(&set, path), 0);
    assert_int_equal(app_opt_parse_env(&set), 0);
    unsetenv("TERN_MAX_CONNECTIONS");
    unsetenv("TERN_MAX_HEAD");
    unlink(path);
    assert_int_equal(app_opt_uint(&set, SV_PORT), 1);
    assert_int_equal(app_opt_uint(&set, SV_MAX_CONNS), 20);
    assert_int_equal(app_opt_uint(&set, SV_MAX_HEAD), 300);
    assert_int_equal(app_opt_uint(&set, SV_MAX_BODY), 16777216);
    /* a repeatable option's list is the one of the strongest source */
    assert_int_equal(set.vals[SV_VHOST].n, 1);
    assert_string_equal(set.vals[SV_VHOST].v[0], "c=/c");
}

static void the_environment_is_checked_too(void **state) {
    setenv("TERN_PORT", "http", 1);
    assert_int_equal(app_opt_parse_env(&set), -EINVAL);
    unsetenv("TERN_PORT");
    assert_string_equal(set.err, "bad value for TERN_PORT (--port): http (an integer from 0 to 65535)");
    setenv("TERN_QUIET", "yes", 1);
    assert_int_equal(app_opt_parse_env(&set), 0);
    unsetenv("TERN_QUIET");
    assert_int_equal(app_opt_uint(&set, SV_QUIET), 1);
}

/* What --print-config prints, read back as a file, is the same
 * configuration. */
static void print_config_round_trip(void **state) {
    assert_int_equal(parse("--port", "7", "--tls-cert", "a.pem", "--tls-cert", "b.pem",
                           "--quiet", "--ws-async=post", "--pubsub-topic-policy", "t.=conflate",
                           NULL), 0);
    char path[64];
    write_file(path, "");
    FILE *f = fopen(path, "w");
    app_opt_print(&set, f);
    fclose(f);
    app_opt_set again;
    assert_int_equal(app_opt_init(&again, "tern serve", app_serve_opts, SV_COUNT), 0);
    int err = app_opt_parse_file(&again, path);
    if (err)
        fail_msg("%s", again.err);
    unlink(path);
    for (int i = 0; i < SV_COUNT; i++) {
        if (app_serve_opts[i].flags & APP_OPT_CLI_ONLY)
            continue;
        const app_opt_val *a = &set.vals[i], *b = &again.vals[i];
        const char *sa = app_opt_str(&set, i), *sb = app_opt_str(&again, i);
        if ((sa == NULL) != (sb == NULL) || (sa && strcmp(sa, sb) != 0) ||
            (a->n > 1 && a->n != b->n))
            fail_msg("--%s: %s then %s", app_serve_opts[i].name, sa ? sa : "(unset)",
                     sb ? sb : "(unset)");
    }
    assert_int_equal(again.vals[SV_TLS_CERT].n, 2);
    app_opt_free(&again);
}

/* --help lists every option of the table, with its default. */
static void help_lists_the_table(void **state) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    app_opt_help(&set, f);
    fclose(f);
    for (int i = 0; i < SV_COUNT; i++) {
        char flag[80];
        snprintf(flag, sizeof(flag), "  --%s", app_serve_opts[i].name);
        if (strstr(buf, flag) == NULL)
            fail_msg("--help has no %s", flag);
    }
    assert_non_null(strstr(buf, "--max-connections N "));
    assert_non_null(strstr(buf, "default 10000"));
    free(buf);
}

/* tern load's modes: an option of another mode is named as such. */
static void groups_name_their_members(void **state) {
    static const char *const names[] = {"tern load echo", "tern load pipeline",
                                        "tern load pubsub"};
    static const app_opt opts[] = {
        {"depth", 0, APP_OPT_UINT, "P", NULL, 1, 9, .groups = 1u << 1, .help = "x"},
        {"rate", 0, APP_OPT_UINT, "R", NULL, 1, 9, .groups = 1u << 0 | 1u << 2, .help = "x"},
    };
    app_opt_set s;
    assert_int_equal(app_opt_init(&s, "tern load", opts, 2), 0);
    s.group_names = names;
    s.group = 0;
    char *argv[] = {"echo", "--depth", "3"};
    assert_int_equal(app_opt_parse_argv(&s, 3, argv), -EINVAL);
    assert_string_equal(s.err, "--depth is an option of tern load pipeline");
    s.group = 1;
    char *argv2[] = {"pipeline", "--rate", "3"};
    assert_int_equal(app_opt_parse_argv(&s, 3, argv2), -EINVAL);
    assert_string_equal(s.err, "--rate is an option of tern load echo and pubsub");
    app_opt_free(&s);
}

/* Every option the server reads has a destination in its settings; only
 * the command line's own (--help, --config...) have none. */
static void every_option_has_a_destination(void **state) {
    for (int i = 0; i < SV_COUNT; i++) {
        const app_opt *o = &app_serve_opts[i];
        bool cli = o->flags & APP_OPT_CLI_ONLY;
        if ((o->put == NULL) != cli)
            fail_msg("--%s: a put %s", o->name, cli ? "it should not have" : "missing");
        assert_true(o->to < sizeof(app_serve_settings));
    }
}

static void apply_puts_each_value_where_it_goes(void **state) {
    assert_int_equal(parse("--port", "9000", "--max-connections", "0", "--max-head", "1000",
                           "--pubsub-history-age", "5", "--ws-async=post", "--no-compression",
                           "--threads", "3", "--tls-min-version", "1.3",
                           "--pubsub-policy", "close-1013", "--admin-listen", "[::1]:99",
                           "--vhost", "a=/x", "--vhost", "b=/y", "--quiet", "--feed", "off",
                           "--pubsub-replay-rate", "5000000000", "--io", "epoll", NULL), 0);
    app_serve_settings st;
    memset(&st, 0xa5, sizeof(st));   /* every field written, none left as found */
    app_opt_apply(&set, &st);
    assert_int_equal(st.port, 9000);
    assert_string_equal(st.host, "127.0.0.1");
    assert_null(st.unix_path);
    assert_int_equal(st.run.server.max_connections, TERN_UNLIMITED);
    assert_int_equal(st.run.server.max_connections_per_ip, 50);
    assert_int_equal(st.run.server.max_head, 1000);
    assert_int_equal(st.run.server.shutdown_ws_spread_ms, 8000);   /* 4/5 of --shutdown-timeout */
    assert_int_equal(st.pubsub.history_ms, 5000);
    assert_int_equal(st.pubsub.policy, TERN_PUBSUB_CLOSE);
    assert_int_equal(st.pubsub.close_code, 1013);
    assert_true(st.pubsub.replay_rate == 5000000000ull);
    assert_int_equal(st.ws_async, APP_SERVE_ASYNC_POST);
    assert_false(st.ws.compression);
    assert_int_equal(st.ws.slow_policy, TERN_WS_SLOW_PAUSE);
    assert_int_equal(st.threads, 3);
    assert_int_equal(st.tls.min_version, 13);
    assert_int_equal(st.tls.client_verify, 0);   /* unset */
    assert_null(st.tls.ciphers);
    assert_string_equal(st.admin.host, "::1");
    assert_int_equal(st.admin.port, 99);
    assert_int_equal(st.vhosts->n, 2);
    assert_string_equal(st.vhosts->v[1], "b=/y");
    assert_true(st.quiet);
    assert_false(st.feed);
    assert_true(st.page);
    assert_int_equal(st.run.loop.io, TERN_IO_EPOLL);
    assert_int_equal(st.log_format, TERN_SERVE_LOG_TEXT);
    assert_true(st.node[0] != '\0');   /* HOSTNAME:PID */
}

static void each_option_says_how_it_applies(void **state) {
    assert_int_equal(app_opt_applies(&app_serve_opts[SV_PS_RATE]), APP_OPT_ON_SIGHUP);
    assert_int_equal(app_opt_applies(&app_serve_opts[SV_TOPIC]), APP_OPT_ON_SIGHUP);
    assert_int_equal(app_opt_applies(&app_serve_opts[SV_PORT]), APP_OPT_NEEDS_RESTART);
    assert_int_equal(app_opt_applies(&app_serve_opts[SV_CONFIG]), APP_OPT_AT_START);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(defaults_come_from_the_table, setup, teardown),
        cmocka_unit_test_setup_teardown(flags_take_values_both_ways, setup, teardown),
        cmocka_unit_test_setup_teardown(a_single_valued_flag_keeps_its_last_value, setup, teardown),
        cmocka_unit_test_setup_teardown(repeatable_flags_gather_in_order, setup, teardown),
        cmocka_unit_test_setup_teardown(bad_values_are_named_with_their_range, setup, teardown),
        cmocka_unit_test_setup_teardown(checks_say_why, setup, teardown),
        cmocka_unit_test_setup_teardown(a_repeatable_flag_has_a_bound, setup, teardown),
        cmocka_unit_test_setup_teardown(operands_and_the_double_dash, setup, teardown),
        cmocka_unit_test_setup_teardown(the_file_reads_names_values_and_comments, setup, teardown),
        cmocka_unit_test_setup_teardown(file_errors_name_file_and_line, setup, teardown),
        cmocka_unit_test_setup_teardown(precedence, setup, teardown),
        cmocka_unit_test_setup_teardown(the_environment_is_checked_too, setup, teardown),
        cmocka_unit_test_setup_teardown(print_config_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(help_lists_the_table, setup, teardown),
        cmocka_unit_test_setup_teardown(groups_name_their_members, setup, teardown),
        cmocka_unit_test_setup_teardown(every_option_has_a_destination, setup, teardown),
        cmocka_unit_test_setup_teardown(apply_puts_each_value_where_it_goes, setup, teardown),
        cmocka_unit_test_setup_teardown(each_option_says_how_it_applies, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
