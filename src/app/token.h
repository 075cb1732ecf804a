/* JWT access tokens for tern serve's /pubsub (project issue #26).
 *
 * token.c verifies a compact JWS (header.claims.signature, base64url) with
 * the algorithm the configuration pins: HS256 with a shared secret
 * (--token-hmac-secret-file), and/or RS256 or ES256 with a public key
 * (--token-public-key-file; which one follows from the key's type). A
 * token naming any other algorithm ("none", or HS256 when only a public
 * key is configured) is refused. Header and claims are parsed with
 * jansson. Claims: sub (string, required), exp (number, required; a token
 * is refused from exp plus the leeway on), nbf and iat (numbers when
 * present; nbf more than the leeway ahead is refused), aud and iss (checked
 * when the configuration names them), and the rights,
 *     "tern": {"subscribe": ["T", "P*", ...], "publish": [...]}
 * each entry a topic, or a prefix ending in '*'; and info (any JSON value,
 * at most TERN_TOKEN_INFO_MAX bytes once compacted), what presence shows
 * of the connection beside its sub (presence.h).
 *
 * serve_tokens.c applies them to the /pubsub route's connections. */
#ifndef TERN_APP_TOKEN_H
#define TERN_APP_TOKEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tern/loop.h"   /* TERN_MUST_CHECK */

#define TERN_TOKEN_MAX 8192          /* bytes of a token */
#define TERN_TOKEN_RIGHTS_MAX 64     /* subscribe + publish entries */
#define TERN_TOKEN_INFO_MAX 1024     /* bytes of the info claim, as compact JSON */
/* Seconds of clock difference between the issuer and us allowed on both
 * exp and nbf (the default of --token-leeway), as most JWT libraries do:
 * one leeway, so a token is not refused for a skew in one direction and
 * let in for the same skew in the other. */
#define TERN_TOKEN_LEEWAY 30

typedef struct app_token_config app_token_config;

/* What a valid token grants. Strings are the rights' own copies. */
typedef struct app_token_rights {
    char *sub;
    char *info;                      /* the info claim as compact JSON, or NULL */
    int64_t exp;                     /* the exp claim, seconds since the epoch */
    int64_t until;                   /* exp plus the leeway: refused from then on */
    size_t nsubscribe, npublish;
    char *subscribe[TERN_TOKEN_RIGHTS_MAX];
    char *publish[TERN_TOKEN_RIGHTS_MAX];
} app_token_rights;

app_token_config *app_token_config_new(void);
void app_token_config_free(app_token_config *c);
/* The HS256 secret (copied; not empty). 0 or -EINVAL/-ENOMEM. */
TERN_MUST_CHECK
int app_token_config_hmac(app_token_config *c, const void *secret, size_t len);
/* A PEM public key: RSA (RS256, at least 2048 bits) or EC P-256 (ES256).
 * 0, -EINVAL (not such a key), -ENOMEM. */
TERN_MUST_CHECK
int app_token_config_public_pem(app_token_config *c, const char *pem, size_t len);
/* Copied; NULL: not checked. 0 or -ENOMEM. */
TERN_MUST_CHECK
int app_token_config_audience(app_token_config *c, const char *aud);
TERN_MUST_CHECK
int app_token_config_issuer(app_token_config *c, const char *iss);
/* Seconds allowed past exp and before nbf (TERN_TOKEN_LEEWAY unless set). */
void app_token_config_leeway(app_token_config *c, uint32_t seconds);
/* Reads a file of at most 64 KiB: the secret (one trailing newline
 * stripped) or the public key. 0 or a negative errno; *why says what. */
TERN_MUST_CHECK
int app_token_config_hmac_file(app_token_config *c, const char *path, const char **why);
TERN_MUST_CHECK
int app_token_config_public_key_file(app_token_config *c, const char *path,
                                       const char **why);
/* True once a secret or a key is set. */
bool app_token_config_ready(const app_token_config *c);

/* Verifies tok[0..len) at time now (seconds since the epoch). 0 and *out
 * filled (free it with app_token_rights_free), or -EACCES (refused:
 * *why, a static string, says why; *out is left empty) or -ENOMEM. */
TERN_MUST_CHECK
int app_token_verify(const app_token_config *c, const char *tok, size_t len, int64_t now,
                       app_token_rights *out, const char **why);
void app_token_rights_free(app_token_rights *r);
/* The rights of a "tern" object, {"subscribe":[...],"publish":[...]} as
 * the claim holds them (NULL: none), into r's lists, empty before: 0,
 * -EACCES (*why says what is wrong) or -ENOMEM; r's lists are left empty
 * on an error. The token's claim and the backend proxy's connect answer
 * (serve_proxy.c) both go through here. */
struct json_t;
TERN_MUST_CHECK
int app_token_rights_take(struct json_t *tern, app_token_rights *r, const char **why);
/* Whether one of list's n entries covers topic[0..len): equal to it, or,
 * for an entry ending in '*', a prefix of it ("*" alone: every topic). */
bool app_token_allows(char *const *list, size_t n, const char *topic, size_t len);

#endif
