/* tern serve's /pubsub tokens (serve_tokens.c): a connection's rights
 * come from the token on its upgrade (?token= or Authorization: Bearer),
 * are replaced by {"op":"refresh","token":"..."}, and end at the token's
 * exp plus --token-leeway (close 4001 "token expired"). Off, and nothing changes, unless
 * --token-hmac-secret-file or --token-public-key-file is given. */
#ifndef TERN_APP_SERVE_TOKENS_H
#define TERN_APP_SERVE_TOKENS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "app/token.h"
#include "tern/tern.h"

#define TERN_WS_TOKEN_EXPIRED 4001

/* The command line's token flags; NULL when not given. */
typedef struct app_serve_token_flags {
    const char *hmac_secret_file, *public_key_file, *audience, *issuer;
    uint32_t leeway;   /* --token-leeway, seconds */
} app_serve_token_flags;

/* Once, before the server runs. 0 (tokens on when a secret or key file
 * was given) or -1 after a message on stderr. */
TERN_MUST_CHECK
int app_serve_tokens_setup(const app_serve_token_flags *f);
bool app_serve_tokens_on(void);
/* A verifier made from f's files (read now: SIGHUP's rotated keys), or
 * NULL once said why (who: the messages' prefix). */
app_token_config *app_serve_tokens_build(const app_serve_token_flags *f, const char *who);
/* Puts c in use for the verifies that follow (from any loop) and returns
 * the one it replaces, which a loop may still be using in the callback it
 * runs: freed by the caller once every loop has run another. Only while
 * tokens are on (they turn on or off only at start: the routes' hooks
 * depend on it). */
app_token_config *app_serve_tokens_swap(app_token_config *c);
void app_serve_tokens_cleanup(void);

typedef struct app_token_conn app_token_conn;

/* In on_upgrade: 0 and *out set (anonymous without a token), 401 for a
 * bad token, 503 out of memory. */
TERN_MUST_CHECK
int app_token_conn_upgrade(tern_http_req *req, app_token_conn **out);
/* In on_open: starts the expiry timer of a token's connection. */
void app_token_conn_open(app_token_conn *c, tern_ws *ws);
/* When c's rights end, in seconds of the wall clock (the token's exp plus
 * --token-leeway); 0 for none (NULL, or no token). */
int64_t app_token_conn_until(const app_token_conn *c);
/* In on_close or on_upgrade_failed (NULL: nothing). */
void app_token_conn_free(app_token_conn *c);
/* Whether the token's rights cover the topic: 0 or -EACCES. c NULL:
 * anonymous, never. (The topic rules decide first: topic_rules.h.) */
TERN_MUST_CHECK
int app_token_conn_may_subscribe(const app_token_conn *c, const char *topic, size_t len);
TERN_MUST_CHECK
int app_token_conn_may_publish(const app_token_conn *c, const char *topic, size_t len);
/* The token's sub and info claim (JSON text), or NULL: no token (c NULL
 * or anonymous), no info. Valid until the next refresh. */
const char *app_token_conn_sub(const app_token_conn *c);
const char *app_token_conn_info(const app_token_conn *c);
/* The backend proxy's connect answer (serve_proxy.h): user and info (JSON
 * text; each NULL: kept as it was) stand for the token's sub and info from now on
 * (presence, user topics, app_token_conns_of); rights, when not NULL,
 * has its subscribe and publish lists taken (left empty) as the
 * connection's. *c is made when the connection had none (tokens off),
 * and linked as app_token_conn_open does unless ws is NULL (an /sse
 * stream: not one of app_token_conns_of's). 0, or -ENOMEM with *c
 * unchanged. */
TERN_MUST_CHECK
int app_token_conn_set_user(app_token_conn **c, tern_ws *ws, const char *user, const char *info,
                            app_token_rights *rights);
/* On a loop's thread: fn(ws, user) for each open connection of this loop
 * whose token's sub is sub (fn may close it); returns how many. A walk
 * over the loop's open connections: for the admin API, not a hot path. */
size_t app_token_conns_of(const char *sub, void (*fn)(tern_ws *ws, void *user), void *user);
/* {"op":"refresh"}: NULL and the rights and expiry replaced, or why not
 * (the connection keeps what it had). *exp: the new expiry. */
const char *app_token_conn_refresh(app_token_conn *c, tern_ws *ws, const char *tok,
                                     size_t len, int64_t *exp);

#endif
