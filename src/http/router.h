/* Request router: exact paths, ":name" parameters and a trailing "*".
 *
 * Patterns are split into '/'-separated segments. At each segment a literal
 * match beats a parameter, and a parameter beats "*", so "/users/me" wins
 * over "/users/:id" whatever the order of registration. "*" may only be the
 * last segment and matches the rest of the path (also the empty rest).
 * A method of NULL (or "*") matches any method. */
#ifndef TERN_HTTP_ROUTER_H
#define TERN_HTTP_ROUTER_H

#include <stdbool.h>
#include <stddef.h>

#include "tern/loop.h"   /* TERN_MUST_CHECK */

#define TERN__ROUTE_MAX_PARAMS 8

/* The router fills the raw views; tern__http_params_decode (server.h)
 * the decoded ones, which are the raw ones when there is no '%' in them. */
typedef struct tern__route_params {
    size_t count;
    struct {
        const char *name;  size_t name_len;   /* points into the pattern */
        const char *value; size_t value_len;  /* points into the matched path; raw */
        const char *dec;   size_t dec_len;    /* percent-decoded */
    } p[TERN__ROUTE_MAX_PARAMS];
    const char *rest; size_t rest_len;        /* what "*" matched (empty when none) */
    const char *rest_dec; size_t rest_dec_len;
} tern__route_params;

typedef struct tern__router tern__router;

tern__router *tern__router_new(void);
void tern__router_free(tern__router *r);

/* Adds a route. Returns 0, -EINVAL for a bad pattern (not starting with
 * '/', a '*' that is not the whole last segment, a byte no request path
 * holds: control, space, '?', '#', non-ASCII; an empty ":" name, a name
 * twice, more than TERN__ROUTE_MAX_PARAMS parameters) or a bad method
 * (not an upper-case token of 1 to 32 bytes), -EEXIST for the same method
 * and pattern twice, -ENOMEM. */
bool tern__router_method_valid(const char *method);
TERN_MUST_CHECK
int tern__router_add(tern__router *r, const char *method, const char *pattern, void *data);

/* Finds the route for (method, path). Returns its data, or NULL with
 * *status set to 404 (no pattern matches the path) or 405 (a pattern
 * matches, but not for this method). params is filled on a match. */
void *tern__router_match(const tern__router *r, const char *method, size_t method_len,
                         const char *path, size_t path_len, tern__route_params *params,
                         int *status);

#endif
