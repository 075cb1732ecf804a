/* The router on arbitrary patterns and paths.
 *
 * Input: lines. Every line but the last is "METHOD PATTERN" to add (a bad
 * pattern must be refused, not crash); the last line is "METHOD PATH" to
 * match. Checks that a match returns the data of a route that was added,
 * that every parameter and the rest are views inside the path, that no
 * parameter value holds a '/', and that a miss says 404 or 405. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "http/router.h"

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond))                                                                               \
            abort();                                                                               \
    } while (0)

#define MAX_ROUTES 32

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = '\0';
    tern__router *r = tern__router_new();
    CHECK(r != NULL);
    int ids[MAX_ROUTES];
    int nroutes = 0;
    char *line = text, *last = NULL;
    for (;;) {
        char *nl = strchr(line, '\n');
        if (nl == NULL) {
            last = line;
            break;
        }
        *nl = '\0';
        char *sp = strchr(line, ' ');
        if (sp && nroutes < MAX_ROUTES) {
            *sp = '\0';
            ids[nroutes] = nroutes;
            const char *method = strcmp(line, "*") == 0 ? NULL : line;
            if (tern__router_add(r, method, sp + 1, &ids[nroutes]) == 0)
                nroutes++;
        }
        line = nl + 1;
    }
    char *sp = strchr(last, ' ');
    if (sp) {
        *sp = '\0';
        const char *path = sp + 1;
        size_t plen = strlen(path);
        /* The path in an allocation of its own size: over-reads fault. */
        char *p = malloc(plen ? plen : 1);
        memcpy(p, path, plen);
        tern__route_params params;
        int status = 0;
        int *hit = tern__router_match(r, last, strlen(last), p, plen, &params, &status);
        if (hit) {
            CHECK(hit >= ids && hit < ids + nroutes);
            CHECK(params.count <= TERN__ROUTE_MAX_PARAMS);
            for (size_t i = 0; i < params.count; i++) {
                CHECK(params.p[i].value_len == 0 ||
                      (params.p[i].value >= p && params.p[i].value + params.p[i].value_len <= p + plen));
                CHECK(memchr(params.p[i].value, '/', params.p[i].value_len) == NULL);
            }
            CHECK(params.rest_len == 0 ||
                  (params.rest >= p && params.rest + params.rest_len <= p + plen));
        } else {
            CHECK(status == 404 || status == 405);
        }
        free(p);
    }
    tern__router_free(r);
    free(text);
    return 0;
}
