/* The tern command's options (options.h): parsing of the command line, a
 * configuration file and the environment against one table, and the
 * --help and --print-config made from it. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "app/options.h"

#define REPEAT_DEFAULT 64   /* a repeatable option's values when its max_count is 0 */

int app_opt_init(app_opt_set *s, const char *command, const app_opt *opts, int nopts) {
    memset(s, 0, sizeof(*s));
    s->command = command;
    s->opts = opts;
    s->nopts = nopts;
    s->vals = calloc((size_t)nopts, sizeof(*s->vals));
    return s->vals ? 0 : -ENOMEM;
}

static void val_clear(app_opt_val *v) {
    for (int k = 0; k < v->n; k++)
        free(v->v[k]);
    free(v->v);
    v->v = NULL;
    v->n = 0;
}

void app_opt_free(app_opt_set *s) {
    for (int i = 0; s->vals && i < s->nopts; i++)
        val_clear(&s->vals[i]);
    free(s->vals);
    free(s->args);
    s->vals = NULL;
    s->args = NULL;
}

static int fail(app_opt_set *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err, sizeof(s->err), fmt, ap);
    va_end(ap);
    return -EINVAL;
}

int app_opt_find(const app_opt_set *s, const char *name) {
    for (int i = 0; i < s->nopts; i++)
        if (strcmp(s->opts[i].name, name) == 0)
            return i;
    return -1;
}

/* Levenshtein distance of a and b, '_' equal to '-', case ignored; stops
 * counting at 32 letters (names are shorter). */
static int distance(const char *a, const char *b) {
    int la = (int)strlen(a), lb = (int)strlen(b);
    if (la > 32 || lb > 32)
        return 99;
    int d[33][33];
    for (int i = 0; i <= la; i++)
        d[i][0] = i;
    for (int j = 0; j <= lb; j++)
        d[0][j] = j;
    for (int i = 1; i <= la; i++)
        for (int j = 1; j <= lb; j++) {
            char x = (char)tolower((unsigned char)a[i - 1]), y = (char)tolower((unsigned char)b[j - 1]);
            x = x == '_' ? '-' : x;
            y = y == '_' ? '-' : y;
            int best = d[i - 1][j - 1] + (x != y);
            if (d[i - 1][j] + 1 < best)
                best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best)
                best = d[i][j - 1] + 1;
            d[i][j] = best;
        }
    return d[la][lb];
}

int app_opt_closest(const app_opt_set *s, const char *name, bool cli) {
    int best = -1, best_d = 0;
    for (int i = 0; i < s->nopts; i++) {
        if (!cli && (s->opts[i].flags & APP_OPT_CLI_ONLY))
            continue;
        int d = distance(name, s->opts[i].name);
        if (best < 0 || d < best_d)
            best = i, best_d = d;
    }
    /* A third of the letters wrong is a misspelling; more is another word. */
    return best >= 0 && best_d > 0 && best_d * 3 <= (int)strlen(s->opts[best].name) ? best : -1;
}

/* " (did you mean --NAME?)" for a misspelt option, or "". */
static const char *suggest(const app_opt_set *s, const char *name, size_t len, bool cli) {
    static char buf[128];
    char n[64];
    buf[0] = '\0';
    if (len >= sizeof(n))
        return buf;
    memcpy(n, name, len);
    n[len] = '\0';
    int i = app_opt_closest(s, n, cli);
    if (i >= 0)
        snprintf(buf, sizeof(buf), " (did you mean --%s?)", s->opts[i].name);
    return buf;
}

static bool parse_ull(const char *t, unsigned long long *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(t, &end, 10);
    if (errno || end == t || *end || !isdigit((unsigned char)t[0]))
        return false;
    *out = v;
    return true;
}

static bool parse_real(const char *t, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(t, &end);
    if (errno || end == t || *end || !(v >= lo && v <= hi))   /* also refuses NaN */
        return false;
    *out = v;
    return true;
}

/* A FLAG's value in a file or the environment: "on" or "off", or NULL. */
static const char *flag_word(const char *t) {
    static const char *const on[] = {"", "on", "yes", "true", "1"};
    static const char *const off[] = {"off", "no", "false", "0"};
    for (size_t k = 0; k < sizeof(on) / sizeof(on[0]); k++)
        if (strcasecmp(t, on[k]) == 0)
            return "on";
    for (size_t k = 0; k < sizeof(off) / sizeof(off[0]); k++)
        if (strcasecmp(t, off[k]) == 0)
            return "off";
    return NULL;
}

static bool choice_ok(const char *choices, const char *t) {
    size_t len = strlen(t);
    for (const char *c = choices; *c;) {
        size_t clen = strcspn(c, "|");
        if (clen == len && strncmp(c, t, len) == 0)
            return true;
        c += clen + (c[clen] == '|');
    }
    return false;
}

/* Whether t is a value option o accepts (a FLAG's: "on" or "off"); *why:
 * what its check said of a bad one, or NULL. */
static bool value_ok(const app_opt *o, const char *t, const char **why) {
    unsigned long long u;
    double d;
    switch (o->type) {
    case APP_OPT_FLAG: return strcmp(t, "on") == 0 || strcmp(t, "off") == 0;
    case APP_OPT_UINT: return parse_ull(t, &u) && u >= o->min && u <= o->max;
    case APP_OPT_SECONDS:
        return parse_real(t, 0, 86400, &d) &&
               ((o->flags & APP_OPT_ZERO_MIN) || (unsigned long long)(d * 1000 + 0.5) > 0);
    case APP_OPT_REAL: return parse_real(t, 0, 1, &d);
    case APP_OPT_CHOICE: return choice_ok(o->choices, t);
    case APP_OPT_STRING: return o->check == NULL || (*why = o->check(t)) == NULL;
    }
    return false;
}

/* What a bad value of o should have been, for the message. */
static void expected(const app_opt *o, char *buf, size_t cap) {
    switch (o->type) {
    case APP_OPT_UINT:
        snprintf(buf, cap, " (an integer from %llu to %llu)", o->min, o->max);
        break;
    case APP_OPT_CHOICE: snprintf(buf, cap, " (one of %s)", o->choices); break;
    case APP_OPT_FLAG: snprintf(buf, cap, " (on or off)"); break;
    case APP_OPT_SECONDS: snprintf(buf, cap, " (seconds, up to 86400)"); break;
    case APP_OPT_REAL: snprintf(buf, cap, " (a number from 0 to 1)"); break;
    default: buf[0] = '\0';
    }
}

/* Gives option i the value t from source. A value from a source of more
 * precedence than the option's present one replaces what it holds (all of
 * a repeatable option's values: the command line's list is the list); one
 * from less is dropped; from the same, a repeatable option gains a value
 * and another takes the last. where: "--port", "conf:3: port" (messages). */
static int set_value(app_opt_set *s, int i, const char *t, int source, int line,
                     const char *at, const char *where) {
    const app_opt *o = &s->opts[i];
    app_opt_val *v = &s->vals[i];
    const char *why = NULL;
    if (!value_ok(o, t, &why)) {
        if (why)   /* "--topic x publish: expected KEY=VALUE" */
            return fail(s, "%sbad value for %s %s: %s", at, where, t, why);
        char exp[96];
        expected(o, exp, sizeof(exp));
        return fail(s, "%sbad value for %s: %s%s", at, where, t, exp);
    }
    if (source < v->source)
        return 0;
    if (source > v->source || !(o->flags & APP_OPT_REPEAT)) {
        val_clear(v);
        v->source = source;
    }
    int max = o->max_count ? o->max_count : REPEAT_DEFAULT;
    if (v->n >= max)
        return fail(s, "%sbad value for %s: %s (at most %d of them)", at, where, t, max);
    char **nv = realloc(v->v, (size_t)(v->n + 1) * sizeof(*nv));
    char *copy = strdup(t);
    if (nv == NULL || copy == NULL) {
        free(copy);
        if (nv)
            v->v = nv;
        return fail(s, "out of memory");
    }
    v->v = nv;
    v->v[v->n++] = copy;
    v->line = line;
    return 0;
}

/* Whether option o may be given in group g. */
static int group_check(app_opt_set *s, const app_opt *o) {
    if (s->group_names == NULL || o->groups == 0 || (o->groups & 1u << s->group))
        return 0;
    char names[256] = "";
    size_t cut = strlen(s->command) + 1;   /* "tern load " after the first */
    int total = __builtin_popcount(o->groups), k = 0;
    for (int g = 0; g < 32 && k < total; g++) {
        if (!(o->groups & 1u << g))
            continue;
        const char *n = s->group_names[g];
        size_t len = strlen(names);
        snprintf(names + len, sizeof(names) - len, "%s%s", k ? n + cut : n,
                 total - k > 2 ? ", " : total - k == 2 ? " and " : "");
        k++;
    }
    return fail(s, "--%s is an option of %s", o->name, names);
}

static int add_arg(app_opt_set *s, char *a) {
    char **na = realloc(s->args, (size_t)(s->nargs + 1) * sizeof(*na));
    if (na == NULL)
        return fail(s, "out of memory");
    s->args = na;
    s->args[s->nargs++] = a;
    return 0;
}

/* The value a FLAG or an OPTARG option takes when given bare. */
static const char *bare_value(const app_opt *o) {
    static char first[64];
    if (o->type == APP_OPT_FLAG)
        return "on";
    size_t len = strcspn(o->choices, "|");   /* OPTARG: the first choice */
    snprintf(first, sizeof(first), "%.*s", (int)len, o->choices);
    return first;
}

int app_opt_parse_argv(app_opt_set *s, int argc, char **argv) {
    for (int a = 1; a < argc; a++) {
        char *arg = argv[a];
        if (strcmp(arg, "--") == 0) {
            for (a++; a < argc; a++)
                if (add_arg(s, argv[a]) < 0)
                    return -EINVAL;
            break;
        }
        if (arg[0] != '-' || arg[1] == '\0') {
            if (add_arg(s, arg) < 0)
                return -EINVAL;
            continue;
        }
        int i = -1;
        const char *val = NULL;
        char where[96];
        if (arg[1] == '-') {
            const char *name = arg + 2;
            size_t nlen = strcspn(name, "=");
            for (int k = 0; k < s->nopts && i < 0; k++)
                if (strlen(s->opts[k].name) == nlen && strncmp(s->opts[k].name, name, nlen) == 0)
                    i = k;
            if (i < 0)
                return fail(s, "unknown option '--%.*s'%s", (int)nlen, name,
                            suggest(s, name, nlen, true));
            if (name[nlen] == '=') {
                if (s->opts[i].type == APP_OPT_FLAG)
                    return fail(s, "--%s takes no value", s->opts[i].name);
                val = name + nlen + 1;
            }
        } else {
            for (int k = 0; k < s->nopts && i < 0; k++)
                if (s->opts[k].short_name == arg[1])
                    i = k;
            if (i < 0)
                return fail(s, "unknown option '-%c'", arg[1]);
            if (arg[2] != '\0') {
                if (s->opts[i].type == APP_OPT_FLAG)
                    return fail(s, "-%c takes no value", arg[1]);
                val = arg + 2;
            }
        }
        const app_opt *o = &s->opts[i];
        if (group_check(s, o) < 0)
            return -EINVAL;
        if (val == NULL) {
            if (o->type == APP_OPT_FLAG || (o->flags & APP_OPT_OPTARG))
                val = bare_value(o);
            else if (a + 1 < argc)
                val = argv[++a];
            else
                return fail(s, "--%s needs a value (%s)", o->name, o->arg ? o->arg : "");
        }
        snprintf(where, sizeof(where), "--%s", o->name);
        if (set_value(s, i, val, APP_OPT_FROM_FLAG, 0, "", where) < 0)
            return -EINVAL;
    }
    return 0;
}

/* Cuts a file line's trailing blanks and comment ("value  # why"). */
static void trim_value(char *v) {
    for (char *p = v; *p; p++)
        if (*p == '#' && (p == v || isspace((unsigned char)p[-1]))) {
            *p = '\0';
            break;
        }
    size_t n = strlen(v);
    while (n && isspace((unsigned char)v[n - 1]))
        v[--n] = '\0';
}

int app_opt_parse_file(app_opt_set *s, const char *path) {
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        int e = errno;
        snprintf(s->err, sizeof(s->err), "--config %s: %s", path, strerror(e));
        return -e;
    }
    /* The line each single-valued option was first seen on, in this file. */
    int *seen = calloc((size_t)s->nopts, sizeof(*seen));
    char *line = NULL;
    size_t cap = 0;
    int lineno = 0, err = seen ? 0 : fail(s, "out of memory");
    while (err == 0 && getline(&line, &cap, f) >= 0) {
        lineno++;
        char *p = line;
        while (isspace((unsigned char)*p))
            p++;
        if (*p == '\0' || *p == '#')
            continue;
        char *key = p;
        while (*p && !isspace((unsigned char)*p))
            p++;
        if (*p)
            *p++ = '\0';
        while (isspace((unsigned char)*p))
            p++;
        trim_value(p);
        int i = app_opt_find(s, key);
        if (i < 0 || (s->opts[i].flags & APP_OPT_CLI_ONLY)) {
            err = fail(s, "%s:%d: unknown option '%s'%s", path, lineno, key,
                       suggest(s, key, strlen(key), false));
            break;
        }
        const app_opt *o = &s->opts[i];
        if (seen[i] && !(o->flags & APP_OPT_REPEAT)) {
            err = fail(s, "%s:%d: %s given again (first on line %d; it does not repeat)", path,
                       lineno, key, seen[i]);
            break;
        }
        seen[i] = lineno;
        const char *val = p;
        if (o->type == APP_OPT_FLAG) {
            val = flag_word(p);
            if (val == NULL)
                val = p;   /* refused below, naming it */
        } else if (*p == '\0') {
            if (!(o->flags & APP_OPT_OPTARG)) {
                err = fail(s, "%s:%d: %s needs a value (%s)", path, lineno, key,
                           o->arg ? o->arg : "");
                break;
            }
            val = bare_value(o);
        }
        char at[300];
        snprintf(at, sizeof(at), "%s:%d: ", path, lineno);
        err = set_value(s, i, val, APP_OPT_FROM_FILE, lineno, at, key);
    }
    if (err == 0 && ferror(f))   /* a directory, an I/O error: not an empty file */
        err = fail(s, "--config %s: %s", path, strerror(errno));
    free(line);
    free(seen);
    fclose(f);
    return err;
}

int app_opt_parse_env(app_opt_set *s) {
    if (s->env_prefix == NULL)
        return 0;
    for (int i = 0; i < s->nopts; i++) {
        const app_opt *o = &s->opts[i];
        if (o->flags & APP_OPT_CLI_ONLY)
            continue;
        char name[128];
        int n = snprintf(name, sizeof(name), "%s%s", s->env_prefix, o->name);
        for (int k = 0; k < n && k < (int)sizeof(name); k++)
            name[k] = name[k] == '-' ? '_' : (char)toupper((unsigned char)name[k]);
        const char *t = getenv(name);
        if (t == NULL || *t == '\0')
            continue;
        if (o->type == APP_OPT_FLAG && flag_word(t))
            t = flag_word(t);
        char where[192];
        snprintf(where, sizeof(where), "%s (--%s)", name, o->name);
        if (set_value(s, i, t, APP_OPT_FROM_ENV, 0, "", where) < 0)
            return -EINVAL;
    }
    return 0;
}

extern char **environ;

/* Whether the variable name (the part before '=' of an environ entry,
 * len bytes) is one of known's, or starts with a known entry ending in '*'. */
static bool env_known(const char *name, size_t len, const char *const *known) {
    for (; known && *known; known++) {
        size_t k = strlen(*known);
        if ((*known)[k - 1] == '*' ? len >= k - 1 && strncmp(name, *known, k - 1) == 0
                                   : len == k && strncmp(name, *known, k) == 0)
            return true;
    }
    return false;
}

int app_opt_env_warn(const app_opt_set *s, const char *const *known, FILE *f) {
    if (s->env_prefix == NULL)
        return 0;
    size_t plen = strlen(s->env_prefix);
    int n = 0;
    for (char **e = environ; e && *e; e++) {
        const char *var = *e;
        size_t len = strcspn(var, "=");
        if (len <= plen || strncmp(var, s->env_prefix, plen) != 0 || len - plen >= 64 ||
            env_known(var, len, known))
            continue;
        /* TERN_MAX_CONNECTIONS: the option max-connections */
        char opt[64];
        for (size_t k = 0; k < len - plen; k++)
            opt[k] = var[plen + k] == '_' ? '-' : (char)tolower((unsigned char)var[plen + k]);
        opt[len - plen] = '\0';
        int i = app_opt_find(s, opt);
        if (i >= 0 && !(s->opts[i].flags & APP_OPT_CLI_ONLY))
            continue;
        n++;
        if ((i = app_opt_closest(s, opt, false)) < 0) {
            fprintf(f, "%s: warning: %.*s is not an option's variable: ignored\n", s->command,
                    (int)len, var);
            continue;
        }
        char env[96];
        int m = snprintf(env, sizeof(env), "%s%s", s->env_prefix, s->opts[i].name);
        for (int k = 0; k < m && k < (int)sizeof(env); k++)
            env[k] = env[k] == '-' ? '_' : (char)toupper((unsigned char)env[k]);
        fprintf(f, "%s: warning: %.*s is not an option's variable: ignored (did you mean %s, "
                   "--%s?)\n", s->command, (int)len, var, env, s->opts[i].name);
    }
    return n;
}

const char *app_opt_str(const app_opt_set *s, int i) {
    const app_opt_val *v = &s->vals[i];
    if (v->n)
        return v->v[v->n - 1];
    return s->opts[i].def || s->opts[i].type != APP_OPT_FLAG ? s->opts[i].def : "off";
}

bool app_opt_given(const app_opt_set *s, int i) {
    return s->vals[i].n > 0;
}

unsigned long long app_opt_uint(const app_opt_set *s, int i) {
    const char *t = app_opt_str(s, i);
    unsigned long long u = 0;
    double d = 0;
    if (t == NULL)
        return 0;
    switch (s->opts[i].type) {
    case APP_OPT_FLAG: return strcmp(t, "on") == 0;
    case APP_OPT_UINT: return parse_ull(t, &u) ? u : 0;
    case APP_OPT_SECONDS:
        return parse_real(t, 0, 86400, &d) ? (unsigned long long)(d * 1000 + 0.5) : 0;
    default: return 0;
    }
}

double app_opt_real(const app_opt_set *s, int i) {
    const char *t = app_opt_str(s, i);
    double d = 0;
    return t && parse_real(t, 0, 1, &d) ? d : 0;
}

int app_opt_set_default(app_opt_set *s, int i, const char *t) {
    if (s->vals[i].n)
        return 0;
    return set_value(s, i, t, APP_OPT_FROM_DEFAULT, 0, "", "the default");
}

app_opt_when app_opt_applies(const app_opt *o) {
    if (o->flags & APP_OPT_CLI_ONLY)
        return APP_OPT_AT_START;
    return o->live != 0 ? APP_OPT_ON_SIGHUP : APP_OPT_NEEDS_RESTART;
}

void app_opt_apply_one(const app_opt_set *s, int i, void *settings) {
    const app_opt *o = &s->opts[i];
    if (o->put)
        o->put(s, i, (char *)settings + o->to);
}

void app_opt_apply(const app_opt_set *s, void *settings) {
    for (int i = 0; i < s->nopts; i++)
        app_opt_apply_one(s, i, settings);
}

void app_opt_put_str(const app_opt_set *s, int i, void *field) {
    *(const char **)field = app_opt_str(s, i);
}

void app_opt_put_u32(const app_opt_set *s, int i, void *field) {
    *(uint32_t *)field = (uint32_t)app_opt_uint(s, i);
}

void app_opt_put_size(const app_opt_set *s, int i, void *field) {
    *(size_t *)field = (size_t)app_opt_uint(s, i);
}

void app_opt_put_u64(const app_opt_set *s, int i, void *field) {
    *(uint64_t *)field = app_opt_uint(s, i);
}

void app_opt_put_int(const app_opt_set *s, int i, void *field) {
    *(int *)field = (int)app_opt_uint(s, i);
}

void app_opt_put_bool(const app_opt_set *s, int i, void *field) {
    const char *t = app_opt_str(s, i);
    *(bool *)field = t && strcmp(t, "on") == 0;
}

void app_opt_put_vals(const app_opt_set *s, int i, void *field) {
    *(const app_opt_val **)field = &s->vals[i];
}

void app_opt_help(const app_opt_set *s, FILE *f) {
    bool shorts = false;
    for (int i = 0; i < s->nopts; i++)
        shorts |= s->opts[i].short_name != 0;
    for (int i = 0; i < s->nopts; i++) {
        const app_opt *o = &s->opts[i];
        char left[128];
        int n;
        if (o->short_name)
            n = snprintf(left, sizeof(left), "  -%c, --%s", o->short_name, o->name);
        else
            n = snprintf(left, sizeof(left), "  %s--%s", shorts ? "    " : "", o->name);
        if (o->arg)
            n += snprintf(left + n, sizeof(left) - (size_t)n,
                          (o->flags & APP_OPT_OPTARG) ? "[=%s]" : " %s", o->arg);
        /* The help's lines, then what the table says of it. */
        char more[160] = "";
        size_t m = 0;
        if (o->def && o->type != APP_OPT_FLAG)
            m += (size_t)snprintf(more + m, sizeof(more) - m, "default %s", o->def);
        if (o->flags & APP_OPT_REPEAT)
            m += (size_t)snprintf(more + m, sizeof(more) - m, "%srepeatable", m ? "; " : "");
        if (app_opt_applies(o) == APP_OPT_ON_SIGHUP)
            m += (size_t)snprintf(more + m, sizeof(more) - m, "%sSIGHUP applies it", m ? "; " : "");
        if (s->group_names && o->groups) {
            m += (size_t)snprintf(more + m, sizeof(more) - m, "%s", m ? "; " : "");
            for (int g = 0, k = 0; g < 32; g++)
                if (o->groups & 1u << g)
                    m += (size_t)snprintf(more + m, sizeof(more) - m, "%s%s", k++ ? ", " : "",
                                          s->group_names[g] + strlen(s->command) + 1);
        }
        fputs(left, f);
        int col = n;
        const char *h = o->help;
        for (bool first = true;; first = false) {
            size_t len = strcspn(h, "\n");
            if (!first)
                col = fprintf(f, "\n%24s", "") - 1;
            else if (col <= 22)
                col += fprintf(f, "%*s", 24 - col, "");
            else if (col + 2 + (int)len <= 80)
                col += fprintf(f, "  ");
            else
                col = fprintf(f, "\n%24s", "") - 1;
            fwrite(h, 1, len, f);
            col += (int)len;
            if (h[len] != '\n')
                break;
            h += len + 1;
        }
        if (m) {
            if (col + 3 + (int)m <= 90)
                fprintf(f, " (%s)", more);
            else
                fprintf(f, "\n%24s(%s)", "", more);
        }
        fputs("\n", f);
    }
}

void app_roff(const char *t, FILE *f) {
    for (const char *p = t; *p; p++) {
        if ((p == t || p[-1] == '\n') && (*p == '.' || *p == '\''))
            fputs("\\&", f);   /* not a request */
        if (*p == '\\')
            fputs("\\e", f);
        else if (*p == '-')
            fputs("\\-", f);   /* a minus, which man pages keep as typed */
        else
            fputc(*p, f);
    }
}

void app_opt_man(const app_opt_set *s, FILE *f) {
    for (int i = 0; i < s->nopts; i++) {
        const app_opt *o = &s->opts[i];
        fputs(".TP\n\\fB", f);
        if (o->short_name)
            fprintf(f, "\\-%c\\fR, \\fB", o->short_name);
        fputs("\\-\\-", f);
        app_roff(o->name, f);
        fputs("\\fR", f);
        if (o->arg) {
            fputs((o->flags & APP_OPT_OPTARG) ? "[=\\fI" : " \\fI", f);
            app_roff(o->arg, f);
            fputs((o->flags & APP_OPT_OPTARG) ? "\\fR]" : "\\fR", f);
        }
        fputs("\n", f);
        app_roff(o->help, f);
        fputs("\n", f);
        bool more = false;
        if (o->def && o->type != APP_OPT_FLAG) {
            fputs("(default ", f);
            app_roff(o->def, f);
            more = true;
        }
        if (o->flags & APP_OPT_REPEAT) {
            fputs(more ? "; repeatable" : "(repeatable", f);
            more = true;
        }
        if (app_opt_applies(o) == APP_OPT_ON_SIGHUP) {
            fputs(more ? "; SIGHUP applies it" : "(SIGHUP applies it", f);
            more = true;
        }
        if (more)
            fputs(")\n", f);
    }
}

void app_opt_print(const app_opt_set *s, FILE *f) {
    static const char *const from[] = {"default", "file", "environment", "command line"};
    for (int i = 0; i < s->nopts; i++) {
        const app_opt *o = &s->opts[i];
        const app_opt_val *v = &s->vals[i];
        if (o->flags & APP_OPT_CLI_ONLY)
            continue;
        const char *def = o->def ? o->def : o->type == APP_OPT_FLAG ? "off" : NULL;
        if (v->n == 0 && def == NULL) {
            fprintf(f, "# %s (unset)\n", o->name);
            continue;
        }
        for (int k = 0; k < (v->n ? v->n : 1); k++) {
            const char *t = v->n ? v->v[k] : def;
            char shown[1024];
            if (o->show) {
                o->show(t, shown, sizeof(shown));
                t = shown;
            }
            if (v->source == APP_OPT_FROM_FILE || v->source == APP_OPT_FROM_DEFAULT)
                fprintf(f, "%s %s\n", o->name, t);
            else
                fprintf(f, "%s %s  # %s\n", o->name, t, from[v->source]);
        }
    }
}
