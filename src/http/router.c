/* Request router: a trie of path segments, see router.h.
 *
 * Each node stands for a prefix of segments; its children are the literal
 * segments that may follow (sorted, found by binary search), at most one
 * ":param" child and at most one "*" child. Routes hang off the node where
 * their pattern ends, one per method. Matching walks the trie depth first,
 * literal before parameter before "*", and backs up when a branch ends
 * without a route for the method, so the first route found is the most
 * specific. Each node is reached by one chain of segments only, so a match
 * visits every node at most once: its cost is bounded by the trie's size
 * and, in practice, by the path's segment count. */
#include "http/router.h"

#include "http/chars.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* One method's route at the node where its pattern ends. Invariant:
 * names[i] points into pattern, which the router owns. */
typedef struct route {
    struct route *next;
    char *method;        /* NULL: any method */
    size_t method_len;
    char *pattern;
    size_t nparams;
    struct {
        const char *s;
        size_t len;
    } names[TERN__ROUTE_MAX_PARAMS];
    void *data;
} route;

/* Invariant: children[0..nchildren) have distinct segments, sorted by
 * length then bytes; wild has no children of its own, since "*" is last. */
typedef struct node {
    char *seg;           /* this literal segment (unused for param and wild) */
    size_t seg_len;
    struct node **children;
    size_t nchildren, cap;
    struct node *param;
    struct node *wild;
    route *routes;
} node;

struct tern__router {
    node root;
};

tern__router *tern__router_new(void) {
    return calloc(1, sizeof(tern__router));
}

static void node_free_children(node *n) {
    for (size_t i = 0; i < n->nchildren; i++) {
        node_free_children(n->children[i]);
        free(n->children[i]);
    }
    free(n->children);
    if (n->param) {
        node_free_children(n->param);
        free(n->param);
    }
    if (n->wild) {
        node_free_children(n->wild);
        free(n->wild);
    }
    route *r = n->routes;
    while (r) {
        route *next = r->next;
        free(r->method);
        free(r->pattern);
        free(r);
        r = next;
    }
    free(n->seg);
}

void tern__router_free(tern__router *r) {
    if (r == NULL)
        return;
    node_free_children(&r->root);
    free(r);
}

static int seg_cmp(const char *a, size_t alen, const char *b, size_t blen) {
    if (alen != blen)
        return alen < blen ? -1 : 1;
    return memcmp(a, b, alen);
}

/* Index of the literal child seg, or of where it would go (*found false). */
static size_t find_child(const node *n, const char *seg, size_t len, bool *found) {
    size_t lo = 0, hi = n->nchildren;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const node *c = n->children[mid];
        int cmp = seg_cmp(c->seg, c->seg_len, seg, len);
        if (cmp == 0) {
            *found = true;
            return mid;
        }
        if (cmp < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = false;
    return lo;
}

static node *literal_child(node *n, const char *seg, size_t len) {
    bool found;
    size_t i = find_child(n, seg, len, &found);
    if (found)
        return n->children[i];
    if (n->nchildren == n->cap) {
        size_t cap = n->cap ? n->cap * 2 : 4;
        node **c = realloc(n->children, cap * sizeof(*c));
        if (c == NULL)
            return NULL;
        n->children = c;
        n->cap = cap;
    }
    node *c = calloc(1, sizeof(*c));
    char *s = malloc(len + 1);
    if (c == NULL || s == NULL) {
        free(c);
        free(s);
        return NULL;
    }
    memcpy(s, seg, len);
    s[len] = '\0';
    c->seg = s;
    c->seg_len = len;
    memmove(&n->children[i + 1], &n->children[i], (n->nchildren - i) * sizeof(*n->children));
    n->children[i] = c;
    n->nchildren++;
    return c;
}

static node *special_child(node **slot) {
    if (*slot == NULL)
        *slot = calloc(1, sizeof(node));
    return *slot;
}

/* Checks the whole pattern before the trie is touched, so a bad pattern
 * leaves no trace; collects the parameter names (views into pattern). */
static int check_pattern(route *rt) {
    const char *p = rt->pattern;
    if (p[0] != '/')
        return -EINVAL;
    /* Only bytes a request path can hold (visible ASCII; no '?', which
     * starts the query, nor '#'): a pattern with others never matches. A
     * '*' is only ever a whole last segment. */
    for (const char *q = p; *q; q++)
        if (!tern__http_is((unsigned char)*q, TERN__C_TARGET) || *q == '?' ||
            (*q == '*' && (q[-1] != '/' || q[1] != '\0')))
            return -EINVAL;
    p++;
    for (;;) {
        const char *slash = strchr(p, '/');
        size_t len = slash ? (size_t)(slash - p) : strlen(p);
        if (len == 1 && p[0] == '*') {
            if (slash)
                return -EINVAL;
        } else if (len > 0 && p[0] == ':') {
            if (len == 1 || rt->nparams == TERN__ROUTE_MAX_PARAMS)
                return -EINVAL;
            for (size_t i = 0; i < rt->nparams; i++)
                if (rt->names[i].len == len - 1 && memcmp(rt->names[i].s, p + 1, len - 1) == 0)
                    return -EINVAL;
            rt->names[rt->nparams].s = p + 1;
            rt->names[rt->nparams].len = len - 1;
            rt->nparams++;
        }
        if (slash == NULL)
            return 0;
        p = slash + 1;
    }
}

/* A method is a token (RFC 9110 §9.1) the parser would take: at most 32
 * bytes, and upper case, since methods are case-sensitive and a "get"
 * route is never what was meant. */
bool tern__router_method_valid(const char *m) {
    size_t n = strlen(m);
    if (n == 0 || n > 32)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!tern__http_is((unsigned char)m[i], TERN__C_TCHAR) || (m[i] >= 'a' && m[i] <= 'z'))
            return false;
    return true;
}

static bool same_method(const route *r, const char *m, size_t len) {
    if (r->method == NULL || m == NULL)
        return r->method == NULL && m == NULL;
    return r->method_len == len && memcmp(r->method, m, len) == 0;
}

int tern__router_add(tern__router *r, const char *method, const char *pattern, void *data) {
    if (r == NULL || pattern == NULL)
        return -EINVAL;
    if (method != NULL && strcmp(method, "*") == 0)
        method = NULL;
    if (method != NULL && !tern__router_method_valid(method))
        return -EINVAL;
    route *rt = calloc(1, sizeof(*rt));
    if (rt == NULL)
        return -ENOMEM;
    rt->data = data;
    rt->pattern = strdup(pattern);
    rt->method = method ? strdup(method) : NULL;
    if (rt->pattern == NULL || (method && rt->method == NULL)) {
        free(rt->pattern);
        free(rt->method);
        free(rt);
        return -ENOMEM;
    }
    rt->method_len = method ? strlen(method) : 0;
    int err = check_pattern(rt);
    if (err)
        goto fail;
    /* Nodes made before an allocation fails stay, routeless: harmless,
     * since only a node with routes matches. */
    err = -ENOMEM;
    node *n = &r->root;
    const char *p = rt->pattern + 1;
    for (;;) {
        const char *slash = strchr(p, '/');
        size_t len = slash ? (size_t)(slash - p) : strlen(p);
        if (len == 1 && p[0] == '*')
            n = special_child(&n->wild);
        else if (len > 0 && p[0] == ':')
            n = special_child(&n->param);
        else
            n = literal_child(n, p, len);
        if (n == NULL)
            goto fail;
        if (slash == NULL)
            break;
        p = slash + 1;
    }
    for (route *o = n->routes; o; o = o->next)
        if (same_method(o, rt->method, rt->method_len)) {
            err = -EEXIST;
            goto fail;
        }
    rt->next = n->routes;
    n->routes = rt;
    return 0;
fail:
    free(rt->pattern);
    free(rt->method);
    free(rt);
    return err;
}

typedef struct match {
    const char *method;
    size_t method_len;
    const char *path;
    size_t path_len;
    const char *values[TERN__ROUTE_MAX_PARAMS];
    size_t value_lens[TERN__ROUTE_MAX_PARAMS];
    size_t nvalues;
    const char *rest;
    size_t rest_len;
    bool path_matched;   /* some route's pattern matched: 405 rather than 404 */
} match;

/* The route of node n for the method: a method's own beats any-method. */
static const route *pick(const node *n, match *m) {
    if (n->routes == NULL)
        return NULL;
    m->path_matched = true;
    const route *any = NULL;
    for (const route *r = n->routes; r; r = r->next) {
        if (r->method == NULL)
            any = r;
        else if (r->method_len == m->method_len && memcmp(r->method, m->method, m->method_len) == 0)
            return r;
    }
    return any;
}

/* Matches the segments from pos (just past a '/') against n's children. */
static const route *walk(const node *n, size_t pos, match *m) {
    const char *seg = m->path + pos;
    const char *slash = memchr(seg, '/', m->path_len - pos);
    size_t len = slash ? (size_t)(slash - seg) : m->path_len - pos;
    const route *r;
    if (n->nchildren) {
        bool found;
        size_t i = find_child(n, seg, len, &found);
        if (found) {
            const node *c = n->children[i];
            r = slash ? walk(c, pos + len + 1, m) : pick(c, m);
            if (r)
                return r;
        }
    }
    /* A parameter takes a non-empty segment. The trie is never deeper in
     * parameters than TERN__ROUTE_MAX_PARAMS, so values has room. */
    if (n->param && len > 0) {
        m->values[m->nvalues] = seg;
        m->value_lens[m->nvalues] = len;
        m->nvalues++;
        r = slash ? walk(n->param, pos + len + 1, m) : pick(n->param, m);
        if (r)
            return r;
        m->nvalues--;
    }
    if (n->wild) {
        r = pick(n->wild, m);
        if (r) {
            m->rest = seg;
            m->rest_len = m->path_len - pos;
            return r;
        }
    }
    return NULL;
}

void *tern__router_match(const tern__router *r, const char *method, size_t method_len,
                         const char *path, size_t path_len, tern__route_params *params,
                         int *status) {
    match m;
    m.method = method ? method : "";
    m.method_len = method ? method_len : 0;
    m.path = path;
    m.path_len = path_len;
    m.nvalues = 0;
    m.rest = NULL;
    m.rest_len = 0;
    m.path_matched = false;
    const route *rt = NULL;
    if (r != NULL && path_len > 0 && path[0] == '/')
        rt = walk(&r->root, 1, &m);
    if (rt == NULL) {
        if (status)
            *status = m.path_matched ? 405 : 404;
        if (params) {
            params->count = 0;
            params->rest = NULL;
            params->rest_len = 0;
        }
        return NULL;
    }
    if (params) {
        params->count = rt->nparams;
        for (size_t i = 0; i < rt->nparams; i++) {
            params->p[i].name = rt->names[i].s;
            params->p[i].name_len = rt->names[i].len;
            params->p[i].value = m.values[i];
            params->p[i].value_len = m.value_lens[i];
        }
        params->rest = m.rest;
        params->rest_len = m.rest_len;
    }
    if (status)
        *status = 200;
    return rt->data;
}
