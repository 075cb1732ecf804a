/* The tern command's options: one table per command (app_opt), from
 * which come its command-line parser, its --help, and for tern serve the
 * configuration file, the environment (TERN_MAX_CONNECTIONS for
 * --max-connections) and --print-config. A command reads the parsed
 * values by the option's index in its table. */
#ifndef TERN_APP_OPTIONS_H
#define TERN_APP_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "tern/loop.h"   /* TERN_MUST_CHECK */

typedef enum app_opt_type {
    APP_OPT_FLAG,     /* no value on the command line; "on"/"off" in a file */
    APP_OPT_UINT,     /* a decimal integer from min to max */
    APP_OPT_SECONDS,  /* seconds, decimals allowed, up to a day; read as milliseconds */
    APP_OPT_REAL,     /* a decimal number from 0 to 1 */
    APP_OPT_CHOICE,   /* one of choices, "a|b|c" */
    APP_OPT_STRING,   /* any text, or what check accepts */
} app_opt_type;

enum {
    APP_OPT_REPEAT = 1u << 0,     /* each use adds a value, up to max_count */
    APP_OPT_SECRET = 1u << 1,     /* names a file holding a secret, never the secret */
    APP_OPT_CLI_ONLY = 1u << 2,   /* not in a file nor the environment (--help, --config) */
    APP_OPT_OPTARG = 1u << 3,     /* the value is optional: --name or --name=V */
    APP_OPT_ZERO_MIN = 1u << 4,   /* SECONDS: 0 is allowed */
};

struct app_opt_set;

/* Writes option i's value in s into field (see app_opt.put). */
typedef void app_opt_put_fn(const struct app_opt_set *s, int i, void *field);

/* One option. Invariants: name is unique in its table and is the long
 * flag (--name) and the file's key; a FLAG has no arg; def, when set, is a
 * value the option's own check accepts; only REPEAT options have a
 * max_count above 1; put is set when the command has a settings struct
 * (tern serve), and then field `to` of that struct has the type put
 * writes. */
typedef struct app_opt {
    const char *name;
    char short_name;                 /* -x, or 0 */
    app_opt_type type;
    const char *arg;                 /* the value's name in --help ("BYTES") */
    const char *def;                 /* the default as text; NULL: unset */
    unsigned long long min, max;     /* UINT */
    const char *choices;             /* CHOICE */
    /* STRING: NULL when v is good, else why not ("expected KEY=VALUE");
     * no check: anything is */
    const char *(*check)(const char *v);
    unsigned flags;
    int max_count;                   /* REPEAT: at most this many values (0: 64) */
    unsigned groups;                 /* a bit per group (tern load's modes) it belongs to; 0: all */
    const char *help;                /* lines of --help, '\n' between them */
    /* The value's destination: put writes it into the field `to` bytes
     * into the command's settings struct (app_opt_apply). NULL: the
     * command reads it itself (--help, --config). */
    size_t to;
    app_opt_put_fn *put;
    /* The command's group by which SIGHUP applies a changed value live,
     * after put has written it (tern serve's APP_SERVE_LIVE_*); 0: it
     * cannot, a change needs a restart (and is said to). */
    int live;
    /* How --print-config shows a value: writes it into out (cap bytes)
     * with any secret inside it masked (a password in a URL); NULL: as
     * it is. */
    void (*show)(const char *v, char *out, size_t cap);
} app_opt;

/* How an option's value applies: CLI_ONLY ones once, at start (--config,
 * --help: not in a file, so SIGHUP never sees them); those with a live
 * at start and again when SIGHUP finds them changed; the others at start,
 * and a SIGHUP that finds them changed says they need a restart. */
typedef enum app_opt_when {
    APP_OPT_AT_START,
    APP_OPT_ON_SIGHUP,
    APP_OPT_NEEDS_RESTART,
} app_opt_when;
app_opt_when app_opt_applies(const app_opt *o);

/* Where a value came from, in increasing precedence. */
enum { APP_OPT_FROM_DEFAULT, APP_OPT_FROM_FILE, APP_OPT_FROM_ENV, APP_OPT_FROM_FLAG };

/* The values of one option. Invariants: n values in v (text, owned);
 * n is 0 or 1 unless the option repeats; all values come from source. */
typedef struct app_opt_val {
    char **v;
    int n;
    int source;
    int line;            /* FROM_FILE: the line of the last value */
} app_opt_val;

/* A command's table and its parsed values (vals[i] for opts[i]). */
typedef struct app_opt_set {
    const char *command;             /* "tern serve": in messages */
    const app_opt *opts;
    int nopts;
    const char *const *group_names;  /* "tern load echo"...; NULL: no groups */
    int group;                       /* the group being parsed */
    const char *env_prefix;          /* "TERN_", or NULL: no environment */
    app_opt_val *vals;
    char **args;                     /* the operands (not options), in order */
    int nargs;
    char err[512];                   /* why the last call failed */
} app_opt_set;

/* Makes the set for a table (every option at its default). 0 or -ENOMEM. */
TERN_MUST_CHECK
int app_opt_init(app_opt_set *s, const char *command, const app_opt *opts, int nopts);
void app_opt_free(app_opt_set *s);

/* argv[0] is the command's name (skipped). Returns 0 or -EINVAL with s->err
 * set ("bad value for --port: x"). Operands go to s->args. "--" ends the
 * options. A value from here replaces the file's and the environment's. */
TERN_MUST_CHECK
int app_opt_parse_argv(app_opt_set *s, int argc, char **argv);
/* The file's options (one "name value" a line, # comments): replaces only
 * defaults. -EINVAL with s->err naming file:line, or -errno (unreadable). */
TERN_MUST_CHECK
int app_opt_parse_file(app_opt_set *s, const char *path);
/* The environment's (TERN_NAME_WITH_UNDERSCORES), over the file's. */
TERN_MUST_CHECK
int app_opt_parse_env(app_opt_set *s);

/* The option named name's index, or -1. */
int app_opt_find(const app_opt_set *s, const char *name);
/* The last value of option i as text (its default when unset; NULL when
 * it has none). */
const char *app_opt_str(const app_opt_set *s, int i);
/* Option i given (by anything but the default). */
bool app_opt_given(const app_opt_set *s, int i);
/* UINT: the value; SECONDS: milliseconds; FLAG: 1 when on. 0 when unset. */
unsigned long long app_opt_uint(const app_opt_set *s, int i);
double app_opt_real(const app_opt_set *s, int i);
/* Sets option i's default (a value computed at run time: the CPUs). */
TERN_MUST_CHECK
int app_opt_set_default(app_opt_set *s, int i, const char *v);

/* Every option's value into its destination in settings (the struct the
 * table's `to` offsets are in), by its put; the strings stay s's. */
void app_opt_apply(const app_opt_set *s, void *settings);
/* Option i put into its destination in settings alone (a value SIGHUP
 * changed). */
void app_opt_apply_one(const app_opt_set *s, int i, void *settings);
/* The puts of the usual kinds of field: the value as text (const char *;
 * NULL when unset), as a number (uint32_t, size_t, uint64_t, int), as a
 * bool (a FLAG on, or a CHOICE "on"), and every value of a REPEAT option
 * (const app_opt_val *: s's, valid while s is). */
app_opt_put_fn app_opt_put_str, app_opt_put_u32, app_opt_put_size, app_opt_put_u64,
    app_opt_put_int, app_opt_put_bool, app_opt_put_vals;

/* The option whose name is nearest name (a misspelling: at most a third of
 * its letters wrong, '_' taken for '-', case ignored), or -1. CLI_ONLY
 * options are skipped when not cli. */
int app_opt_closest(const app_opt_set *s, const char *name, bool cli);
/* One warning line on f for each variable of the environment that starts
 * with s->env_prefix and is neither an option's (TERN_NAME) nor in known
 * (NULL-terminated; an entry ending in '*' is a prefix): a misspelt
 * variable would otherwise be ignored without a word. The number of
 * them. */
int app_opt_env_warn(const app_opt_set *s, const char *const *known, FILE *f);

/* --help's option list: each option, its value's name and help. */
void app_opt_help(const app_opt_set *s, FILE *f);
/* The option list as man(7) roff: a .TP paragraph per option (its flag,
 * its value's name, its help and what --help adds: default, repeatable,
 * SIGHUP), for a manual page's OPTIONS section. */
void app_opt_man(const app_opt_set *s, FILE *f);
/* Text as roff: backslashes escaped, '-' as \-, a line starting with '.'
 * or '\'' guarded. */
void app_roff(const char *text, FILE *f);

/* The effective configuration in the file's format; an unset option as a
 * comment. Options without CLI_ONLY only. */
void app_opt_print(const app_opt_set *s, FILE *f);

#endif
