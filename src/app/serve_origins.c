/* tern serve's WebSocket upgrades: the Origins an upgrade may come from
 * (--allowed-origin, --ws-origin; swapped by SIGHUP, serve_reload.c), and
 * the upgrade hook every WebSocket route shares. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "app/serve_ctx.h"

/* The thread whose loop runs this request. */
static serve_thread *thread_of(tern_http_req *req, serve_ctx *ctx) {
    int i = tern_server_index(tern_http_req_server(req));
    return &ctx->threads[i < 0 || i >= ctx->set.threads ? 0 : i];
}

/* Whether origin[0..len) is pattern: the same (case-insensitive, as
 * browsers serialize the scheme and host in lower case anyway), or, for
 * a pattern with "*." right after its scheme, scheme://NAME.rest with
 * NAME one or more labels (so not the bare domain, nor one with another
 * port or a path). */
static bool origin_matches(const char *pattern, const char *origin, size_t len) {
    const char *star = strstr(pattern, "://*.");
    if (star == NULL)
        return len == strlen(pattern) && strncasecmp(origin, pattern, len) == 0;
    size_t head = (size_t)(star - pattern) + 3;   /* "scheme://" */
    size_t tail = strlen(star + 4);               /* ".rest" */
    if (len <= head + tail || strncasecmp(origin, pattern, head) != 0 ||
        strncasecmp(origin + len - tail, star + 4, tail) != 0)
        return false;
    const char *name = origin + head;
    size_t nlen = len - head - tail;
    if (!app_serve_host_chars(name, nlen) || name[0] == '.' || name[nlen - 1] == '.')
        return false;
    for (size_t i = 0; i + 1 < nlen; i++)   /* no empty label: ".." */
        if (name[i] == '.' && name[i + 1] == '.')
            return false;
    return true;
}

/* The upgrade hook of every WebSocket route: an Origin check when
 * --allowed-origin is given (browsers send Origin, and a page elsewhere
 * must not reach a user's session here; other clients may send none, and
 * are let in: they can write any Origin anyway), and a connection number
 * in the 101 response. */
int app_serve_ws_upgrade(tern_http_req *req, void **conn_user, void *user) {
    serve_ctx *ctx = user;
    size_t olen;
    const char *origin = tern_http_header(req, "Origin", &olen);
    const serve_origins *os = atomic_load_explicit(&ctx->origins, memory_order_acquire);
    if (os->n && origin) {
        bool allowed = false;
        for (int i = 0; i < os->n && !allowed; i++)
            allowed = origin_matches(os->v[i], origin, olen);
        if (!allowed)
            return 403;
    }
    serve_thread *th = thread_of(req, ctx);
    char id[24];
    snprintf(id, sizeof(id), "%llu", (unsigned long long)++th->ws_conn_seq);
    tern_http_add_header(req, "X-Tern-Connection", id);
    *conn_user = NULL;
    return 0;
}
void app_serve_origins_free(serve_origins *o) {
    for (int i = 0; o && i < o->n; i++)
        free(o->v[i]);
    free(o);
}

/* The --allowed-origin and --ws-origin values of set together, copied;
 * NULL when they are more than ORIGINS_MAX (*too_many) or out of memory. */
serve_origins *app_serve_origins_new(const app_serve_settings *set, bool *too_many) {
    const app_opt_val *a = set->allowed_origins, *w = set->ws_origins;
    *too_many = a->n + w->n > ORIGINS_MAX;
    serve_origins *o = *too_many ? NULL : calloc(1, sizeof(*o));
    for (int i = 0; o && i < a->n + w->n; i++) {
        if ((o->v[o->n] = strdup(i < a->n ? a->v[i] : w->v[i - a->n])) == NULL) {
            app_serve_origins_free(o);
            return NULL;
        }
        o->n++;
    }
    return o;
}
