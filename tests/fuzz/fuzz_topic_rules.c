/* tern serve's topic rules (src/app/topic_rules.c): the lines before the
 * first empty line are --topic specs, the lines after it topics. Every
 * spec is taken or refused without harm, and for every topic the rule
 * app_rules_match gives, and each setting of it after
 * app_rules_resolve, is the one a plain reading of the rules gives: the
 * exact rule, else the longest prefix; each setting from the most
 * specific matching rule that sets it. */
#include <assert.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "app/topic_rules.h"

static bool matches(const app_topic_rule *r, const char *t, size_t n) {
    return (r->prefix ? r->len <= n : r->len == n) && memcmp(r->pattern, t, r->len) == 0;
}

/* a more specific than b (both match the same topic) */
static bool more_specific(const app_topic_rule *a, const app_topic_rule *b) {
    if (a->prefix != b->prefix)
        return !a->prefix;
    return a->len > b->len;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static app_topic_rules raw, rules;
    memset(&rules, 0, sizeof(rules));
    char *buf = malloc(size + 1);
    if (buf == NULL)
        return 0;
    memcpy(buf, data, size);
    buf[size] = '\0';
    char *p = buf, *topics = NULL;
    while (p && *p) {
        char *nl = strchr(p, '\n');
        if (nl)
            *nl = '\0';
        if (*p == '\0') {
            topics = nl ? nl + 1 : NULL;
            break;
        }
        const char *why = NULL;
        int before = rules.n;
        if (app_rules_add(&rules, p, &why) < 0)
            assert(why != NULL && rules.n == before);
        else
            assert(rules.n == before || rules.n == before + 1);
        p = nl ? nl + 1 : NULL;
    }
    raw = rules;
    app_rules_resolve(&rules);
    for (p = topics; p && *p;) {
        char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        const app_topic_rule *got = app_rules_match(&rules, p, n);
        /* the reference, on the unresolved rules */
        const app_topic_rule *best = NULL;
        const app_topic_rule *sub = NULL, *pub = NULL, *pol = NULL;
        for (int i = 0; i < raw.n; i++) {
            const app_topic_rule *r = &raw.r[i];
            if (!matches(r, p, n))
                continue;
            if (best == NULL || more_specific(r, best))
                best = r;
            if (r->has_subscribe && (sub == NULL || more_specific(r, sub)))
                sub = r;
            if (r->has_publish && (pub == NULL || more_specific(r, pub)))
                pub = r;
            if (r->has_policy && (pol == NULL || more_specific(r, pol)))
                pol = r;
        }
        assert((got == NULL) == (best == NULL));
        if (got) {
            assert(got - rules.r == best - raw.r);
            assert(got->has_subscribe == (sub != NULL));
            assert(!sub || got->subscribe == sub->subscribe);
            assert(got->has_publish == (pub != NULL));
            assert(!pub || got->publish == pub->publish);
            assert(got->has_policy == (pol != NULL));
            assert(!pol || (got->policy == pol->policy && got->close_code == pol->close_code));
        }
        p = nl ? nl + 1 : NULL;
    }
    free(buf);
    return 0;
}
