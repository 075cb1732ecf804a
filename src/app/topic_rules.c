/* tern serve's topic rules (topic_rules.h). */
#include "app/topic_rules.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

bool app_policy_parse(const char *s, int *policy, uint16_t *close_code) {
    *close_code = 0;
    if (!strcmp(s, "drop"))
        *policy = TERN_PUBSUB_DROP;
    else if (!strcmp(s, "close"))
        *policy = TERN_PUBSUB_CLOSE;
    else if (!strcmp(s, "close-1013"))
        *policy = TERN_PUBSUB_CLOSE, *close_code = TERN_WS_TRY_AGAIN;
    else if (!strcmp(s, "conflate"))
        *policy = TERN_PUBSUB_CONFLATE;
    else
        return false;
    return true;
}

static bool access_parse(const char *s, size_t n, app_access *out) {
    if (n == 6 && !memcmp(s, "anyone", 6))
        *out = APP_ACCESS_ANYONE;
    else if (n == 5 && !memcmp(s, "token", 5))
        *out = APP_ACCESS_TOKEN;
    else if (n == 4 && !memcmp(s, "none", 4))
        *out = APP_ACCESS_NONE;
    else if (n == 4 && !memcmp(s, "user", 4))
        *out = APP_ACCESS_USER;
    else
        return false;
    return true;
}

static bool on_off(const char *s, size_t n, bool *out) {
    if (n == 2 && !memcmp(s, "on", 2))
        *out = true;
    else if (n == 3 && !memcmp(s, "off", 3))
        *out = false;
    else
        return false;
    return true;
}

/* A decimal number of at most 19 digits within [lo, hi]. */
static bool number(const char *s, size_t n, uint64_t lo, uint64_t hi, uint64_t *out) {
    if (n == 0 || n > 19)
        return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

/* One KEY=VALUE (n bytes at s) into r. */
static bool setting(app_topic_rule *r, const char *s, size_t n, const char **why) {
    const char *eq = memchr(s, '=', n);
    if (eq == NULL) {
        *why = "expected KEY=VALUE after the pattern";
        return false;
    }
    size_t kl = (size_t)(eq - s), vl = n - kl - 1;
    const char *v = eq + 1;
#define KEY(k) (kl == sizeof(k) - 1 && !memcmp(s, k, kl))
    uint64_t x;
    if (KEY("subscribe")) {
        if (access_parse(v, vl, &r->subscribe))
            return r->has_subscribe = true;
        *why = "subscribe= takes anyone, token, user or none";
    } else if (KEY("publish")) {
        if (access_parse(v, vl, &r->publish))
            return r->has_publish = true;
        *why = "publish= takes anyone, token, user or none";
    } else if (KEY("policy")) {
        char name[16];
        if (vl < sizeof(name)) {
            memcpy(name, v, vl);
            name[vl] = '\0';
            if (app_policy_parse(name, &r->policy, &r->close_code))
                return r->has_policy = true;
        }
        *why = "policy= takes drop, close, close-1013 or conflate";
    } else if (KEY("history")) {
        if (number(v, vl, 1, TERN_HISTORY_MAX, &x)) {
            r->history = (uint32_t)x;
            return r->has_history = true;
        }
        *why = "history= takes 1 to 65536 messages";
    } else if (KEY("history-age")) {
        if (number(v, vl, 1, UINT32_MAX / 1000, &x)) {
            r->history_ms = (uint32_t)(x * 1000);
            return r->has_history_age = true;
        }
        *why = "history-age= takes a number of seconds (1 to 4294967)";
    } else if (KEY("max-backlog")) {
        if (number(v, vl, 1, SIZE_MAX / 4, &x)) {
            r->max_backlog = (size_t)x;
            return r->has_backlog = true;
        }
        *why = "max-backlog= takes a number of bytes";
    } else if (KEY("presence")) {
        bool on;
        if (vl == 5 && memcmp(v, "stats", 5) == 0) {
            r->presence = APP_PRESENCE_STATS;
            return r->has_presence = true;
        }
        if (on_off(v, vl, &on)) {
            r->presence = on ? APP_PRESENCE_ON : APP_PRESENCE_OFF;
            return r->has_presence = true;
        }
        *why = "presence= takes on, stats or off";
    } else if (KEY("join-leave")) {
        if (on_off(v, vl, &r->join_leave))
            return r->has_join_leave = true;
        *why = "join-leave= takes on or off";
    } else if (KEY("throttle")) {
        if (number(v, vl, 1, TERN_WRITE_DELAY_MAX, &x)) {
            r->throttle_ms = (uint32_t)x;
            return r->has_throttle = true;
        }
        *why = "throttle= takes 1 to 1000 milliseconds";
    } else {
        *why = "unknown key (subscribe, publish, policy, history, history-age, max-backlog, "
               "presence, join-leave, throttle)";
    }
#undef KEY
    return false;
}

bool app_rules_user_named(const char *topic, size_t len, const char *sub) {
    size_t sl = sub ? strlen(sub) : 0;
    if (sl == 0)
        return false;
    size_t at = len;   /* one past the last '#' */
    while (at > 0 && topic[at - 1] != '#')
        at--;
    if (at == 0)
        return false;   /* not a user topic */
    /* each name between commas after it */
    for (size_t i = at; i <= len;) {
        size_t j = i;
        while (j < len && topic[j] != ',')
            j++;
        if (j - i == sl && memcmp(topic + i, sub, sl) == 0)
            return true;
        i = j + 1;
    }
    return false;
}

static bool is_space(char c) { return c == ' ' || c == '\t'; }

int app_rules_add(app_topic_rules *t, const char *spec, const char **why) {
    const char *p = spec;
    while (is_space(*p))
        p++;
    const char *end = p;
    while (*end && !is_space(*end))
        end++;
    size_t plen = (size_t)(end - p);
    bool prefix = plen > 0 && p[plen - 1] == '*';
    size_t len = prefix ? plen - 1 : plen;
    if (plen == 0) {
        *why = "expected a topic or a prefix ending in *";
        return -1;
    }
    if (len > TERN_TOPIC_MAX) {
        *why = "pattern longer than a topic (256 bytes)";
        return -1;
    }
    if (memchr(p, '*', len)) {
        *why = "* may only end a pattern";
        return -1;
    }
    /* The pattern's rule, or a new one; changed on a copy, so that a bad
     * key changes nothing. */
    int i = 0;
    while (i < t->n && !(t->r[i].len == len && t->r[i].prefix == prefix &&
                         !memcmp(t->r[i].pattern, p, len)))
        i++;
    if (i == t->n && t->n == APP_TOPIC_RULES_MAX) {
        *why = "too many rules (63)";
        return -1;
    }
    app_topic_rule r;
    if (i < t->n) {
        r = t->r[i];
    } else {
        r = (app_topic_rule){.len = len, .prefix = prefix};
        memcpy(r.pattern, p, len);
    }
    for (const char *s = end; *s;) {
        while (is_space(*s))
            s++;
        const char *e = s;
        while (*e && !is_space(*e))
            e++;
        if (e > s && !setting(&r, s, (size_t)(e - s), why))
            return -1;
        s = e;
    }
    t->r[i] = r;
    if (i == t->n)
        t->n++;
    return 0;
}

const app_topic_rule *app_rules_match(const app_topic_rules *t, const char *topic,
                                          size_t len) {
    const app_topic_rule *best = NULL;
    for (int i = 0; i < t->n; i++) {
        const app_topic_rule *r = &t->r[i];
        if (r->prefix ? r->len > len : r->len != len)
            continue;
        if (memcmp(r->pattern, topic, r->len) != 0)
            continue;
        if (!r->prefix)
            return r;
        if (best == NULL || r->len > best->len)
            best = r;
    }
    return best;
}

/* Whether prefix rule a covers rule r's pattern (a shorter prefix of it,
 * or as long when r is exact). */
static bool covers(const app_topic_rule *a, const app_topic_rule *r) {
    return a != r && a->prefix && (r->prefix ? a->len < r->len : a->len <= r->len) &&
           memcmp(a->pattern, r->pattern, a->len) == 0;
}

/* Less specific first: prefixes by length, then exact names. */
static bool before(const app_topic_rule *a, const app_topic_rule *b) {
    if (a->prefix != b->prefix)
        return a->prefix;
    return a->len < b->len;
}

void app_rules_resolve(app_topic_rules *t) {
    /* In order of specificity, so that a rule's covering rules have
     * inherited theirs before it inherits from them. */
    int order[APP_TOPIC_RULES_MAX];
    for (int i = 0; i < t->n; i++) {
        int j = i;
        while (j > 0 && before(&t->r[i], &t->r[order[j - 1]])) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }
    for (int k = 0; k < t->n; k++) {
        app_topic_rule *r = &t->r[order[k]];
        const app_topic_rule *a = NULL;
        for (int i = 0; i < t->n; i++)
            if (covers(&t->r[i], r) && (a == NULL || t->r[i].len > a->len))
                a = &t->r[i];
        if (a == NULL)
            continue;
#define INHERIT(flag, ...)                                                                     \
    do {                                                                                       \
        if (!r->flag && a->flag) {                                                             \
            r->flag = true;                                                                    \
            __VA_ARGS__;                                                                       \
        }                                                                                      \
    } while (0)
        INHERIT(has_subscribe, r->subscribe = a->subscribe);
        INHERIT(has_publish, r->publish = a->publish);
        INHERIT(has_policy, r->policy = a->policy, r->close_code = a->close_code);
        INHERIT(has_history, r->history = a->history);
        INHERIT(has_history_age, r->history_ms = a->history_ms);
        INHERIT(has_backlog, r->max_backlog = a->max_backlog);
        INHERIT(has_presence, r->presence = a->presence);
        INHERIT(has_join_leave, r->join_leave = a->join_leave);
        INHERIT(has_throttle, r->throttle_ms = a->throttle_ms);
#undef INHERIT
    }
}
