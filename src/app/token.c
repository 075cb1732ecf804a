/* JWT verification for tern serve (token.h). */
#include "app/token.h"

#include <errno.h>
#include <stdatomic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "net/crypto.h"

#define TOPIC_MAX 256   /* as TERN_TOPIC_MAX (tern/pubsub.h): a longer right covers nothing */
#define FILE_MAX 65536

enum alg { ALG_HS256, ALG_RS256, ALG_ES256 };

struct app_token_config {
    uint64_t id;             /* never 0, never reused: the signature cache's key */
    unsigned char *secret;   /* HS256, when not NULL */
    size_t secret_len;
    tern__crypto_pubkey *key;   /* RS256 or ES256 (key_alg), when not NULL */
    enum alg key_alg;
    char *aud, *iss;
    int64_t leeway;          /* seconds, on exp and nbf */
};

app_token_config *app_token_config_new(void) {
    static _Atomic uint64_t ids;
    app_token_config *c = calloc(1, sizeof(app_token_config));
    if (c) {
        c->id = atomic_fetch_add(&ids, 1) + 1;
        c->leeway = TERN_TOKEN_LEEWAY;
    }
    return c;
}

void app_token_config_leeway(app_token_config *c, uint32_t seconds) {
    c->leeway = seconds;
}

void app_token_config_free(app_token_config *c) {
    if (c == NULL)
        return;
    if (c->secret)
        tern__crypto_wipe(c->secret, c->secret_len);
    free(c->secret);
    tern__crypto_pubkey_free(c->key);
    free(c->aud);
    free(c->iss);
    free(c);
}

int app_token_config_hmac(app_token_config *c, const void *secret, size_t len) {
    if (c == NULL || secret == NULL || len == 0)
        return -EINVAL;
    unsigned char *s = malloc(len);
    if (s == NULL)
        return -ENOMEM;
    memcpy(s, secret, len);
    free(c->secret);
    c->secret = s;
    c->secret_len = len;
    return 0;
}

int app_token_config_public_pem(app_token_config *c, const char *pem, size_t len) {
    if (c == NULL || pem == NULL || len == 0 || len > FILE_MAX)
        return -EINVAL;
    tern__crypto_pubkey *k = NULL;
    tern__crypto_sig sig = 0;
    int err = tern__crypto_pubkey_pem(pem, len, &k, &sig);
    if (err < 0)
        return err;
    tern__crypto_pubkey_free(c->key);
    c->key = k;
    c->key_alg = sig == TERN__CRYPTO_RS256 ? ALG_RS256 : ALG_ES256;
    return 0;
}

static int set_str(char **dst, const char *s) {
    char *d = NULL;
    if (s && (d = strdup(s)) == NULL)
        return -ENOMEM;
    free(*dst);
    *dst = d;
    return 0;
}

int app_token_config_audience(app_token_config *c, const char *aud) {
    return set_str(&c->aud, aud);
}

int app_token_config_issuer(app_token_config *c, const char *iss) {
    return set_str(&c->iss, iss);
}

/* The file's bytes (at most FILE_MAX) into a malloc'd buffer. */
static int read_file(const char *path, char **out, size_t *len, const char **why) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        *why = "cannot open";
        return errno ? -errno : -EIO;
    }
    char *b = malloc(FILE_MAX + 1);
    if (b == NULL) {
        fclose(f);
        *why = "out of memory";
        return -ENOMEM;
    }
    size_t n = fread(b, 1, FILE_MAX + 1, f);
    int bad = ferror(f);
    fclose(f);
    if (bad || n > FILE_MAX) {
        free(b);
        *why = bad ? "cannot read" : "over 64 KiB";
        return bad ? -EIO : -EFBIG;
    }
    b[n] = '\0';
    *out = b;
    *len = n;
    return 0;
}

int app_token_config_hmac_file(app_token_config *c, const char *path, const char **why) {
    char *b = NULL;
    size_t n = 0;
    int err = read_file(path, &b, &n, why);
    if (err < 0)
        return err;
    if (n > 0 && b[n - 1] == '\n')
        n--;
    if (n > 0 && b[n - 1] == '\r')
        n--;
    err = app_token_config_hmac(c, b, n);
    tern__crypto_wipe(b, n);
    free(b);
    if (err < 0)
        *why = err == -EINVAL ? "empty secret" : "out of memory";
    return err;
}

int app_token_config_public_key_file(app_token_config *c, const char *path,
                                       const char **why) {
    char *b = NULL;
    size_t n = 0;
    int err = read_file(path, &b, &n, why);
    if (err < 0)
        return err;
    err = app_token_config_public_pem(c, b, n);
    free(b);
    if (err < 0)
        *why = err == -EINVAL ? "not a PEM RSA (2048 bits or more) or P-256 public key"
                              : "out of memory";
    return err;
}

bool app_token_config_ready(const app_token_config *c) {
    return c && (c->secret || c->key);
}

/* ---- verification ------------------------------------------------------- */

static int b64val(unsigned char c) {
    return c >= 'A' && c <= 'Z'   ? c - 'A'
           : c >= 'a' && c <= 'z' ? c - 'a' + 26
           : c >= '0' && c <= '9' ? c - '0' + 52
           : c == '-'             ? 62
           : c == '_'             ? 63
                                  : -1;
}

/* base64url without padding (RFC 7515 section 2) into out, which has room
 * for len * 3 / 4 bytes. The unused low bits of the last character must be
 * zero, so one token has one encoding. Returns the length or -1. */
static long b64url_decode(const char *s, size_t len, unsigned char *out) {
    if (len % 4 == 1)
        return -1;
    size_t o = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < len; i++) {
        int v = b64val((unsigned char)s[i]);
        if (v < 0)
            return -1;
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (unsigned char)(acc >> bits);
            acc &= (1u << bits) - 1;
        }
    }
    if (acc != 0)
        return -1;
    return (long)o;
}

static bool verify_sig(const app_token_config *c, enum alg a, const char *signed_part,
                       size_t signed_len, const unsigned char *sig, size_t sig_len) {
    if (a == ALG_HS256) {
        uint8_t mac[TERN__SHA256_LEN];
        return sig_len == TERN__SHA256_LEN &&
               tern__crypto_hmac_sha256(c->secret, c->secret_len, signed_part, signed_len,
                                        mac) == 0 &&
               tern__crypto_equal(mac, sig, TERN__SHA256_LEN);
    }
    return tern__crypto_pubkey_verify(c->key, signed_part, signed_len, sig, sig_len);
}

/* ---- public-key signatures verified before ------------------------------
 * An RS256 or ES256 verification costs 17 or 61 us here (openssl speed),
 * as much as the whole connect-and-subscribe it guards, and a client that
 * reconnects brings the same token again. So each thread remembers the
 * last tokens whose signature it verified with a configuration: only that
 * exact token (compared whole, byte for byte) skips the signature check
 * again, and its header and claims are still read and checked each time,
 * exp included. Per thread, so no lock; direct-mapped by a hash of the
 * token; tokens over SIG_CACHE_TOKEN bytes are not remembered. HS256 is
 * not cached: its HMAC costs about a microsecond. */
#define SIG_CACHE 32
#define SIG_CACHE_TOKEN 1024

typedef struct sig_entry {
    uint64_t config_id;   /* 0: empty */
    uint32_t len;
    char tok[SIG_CACHE_TOKEN];
} sig_entry;

static _Thread_local sig_entry sig_cache[SIG_CACHE];

static sig_entry *sig_slot(const char *tok, size_t len) {
    uint64_t h = 0xcbf29ce484222325ull;   /* FNV-1a */
    for (size_t i = 0; i < len; i++)
        h = (h ^ (uint8_t)tok[i]) * 0x100000001b3ull;
    return &sig_cache[h % SIG_CACHE];
}

static bool sig_seen(const app_token_config *c, const char *tok, size_t len) {
    const sig_entry *e = sig_slot(tok, len);
    return e->config_id == c->id && e->len == len && memcmp(e->tok, tok, len) == 0;
}

static void sig_remember(const app_token_config *c, const char *tok, size_t len) {
    if (len > SIG_CACHE_TOKEN)
        return;
    sig_entry *e = sig_slot(tok, len);
    e->config_id = c->id;
    e->len = (uint32_t)len;
    memcpy(e->tok, tok, len);
}

/* A JSON number as whole seconds (fractions dropped, clamped to +-2^53). */
static bool num_claim(json_t *o, const char *name, bool required, int64_t *out, bool *present) {
    json_t *v = json_object_get(o, name);
    *present = v != NULL;
    if (v == NULL)
        return !required;
    if (!json_is_number(v))
        return false;
    double d = json_number_value(v);
    if (!isfinite(d))
        return false;
    if (d > 9007199254740992.0)
        d = 9007199254740992.0;
    if (d < -9007199254740992.0)
        d = -9007199254740992.0;
    int64_t t = (int64_t)d;   /* toward zero; floor for a negative fraction */
    *out = (double)t > d ? t - 1 : t;
    return true;
}

static bool aud_ok(json_t *aud, const char *want) {
    if (json_is_string(aud))
        return strcmp(json_string_value(aud), want) == 0;
    if (!json_is_array(aud))
        return false;
    size_t i;
    json_t *v;
    json_array_foreach(aud, i, v) {
        if (json_is_string(v) && strcmp(json_string_value(v), want) == 0)
            return true;
    }
    return false;
}

/* list: an array of topics or prefixes, or absent. */
static int take_rights(json_t *list, char **dst, size_t *n, size_t *total, const char **why) {
    if (list == NULL)
        return 0;
    if (!json_is_array(list)) {
        *why = "bad rights";
        return -EACCES;
    }
    size_t i;
    json_t *v;
    json_array_foreach(list, i, v) {
        if (!json_is_string(v) || json_string_length(v) == 0 ||
            json_string_length(v) > TOPIC_MAX + 1) {
            *why = "bad rights";
            return -EACCES;
        }
        if (++*total > TERN_TOKEN_RIGHTS_MAX) {
            *why = "too many rights";
            return -EACCES;
        }
        if ((dst[*n] = strdup(json_string_value(v))) == NULL)
            return -ENOMEM;
        ++*n;
    }
    return 0;
}

int app_token_rights_take(json_t *tern, app_token_rights *r, const char **why) {
    size_t total = 0;
    int err;
    if (tern && !json_is_object(tern)) {
        *why = "bad rights";
        return -EACCES;
    }
    if ((err = take_rights(json_object_get(tern, "subscribe"), r->subscribe, &r->nsubscribe,
                           &total, why)) < 0 ||
        (err = take_rights(json_object_get(tern, "publish"), r->publish, &r->npublish, &total,
                           why)) < 0) {
        for (size_t i = 0; i < r->nsubscribe; i++)
            free(r->subscribe[i]);
        for (size_t i = 0; i < r->npublish; i++)
            free(r->publish[i]);
        r->nsubscribe = r->npublish = 0;
        return err;
    }
    return 0;
}

void app_token_rights_free(app_token_rights *r) {
    if (r == NULL)
        return;
    free(r->sub);
    free(r->info);
    for (size_t i = 0; i < r->nsubscribe; i++)
        free(r->subscribe[i]);
    for (size_t i = 0; i < r->npublish; i++)
        free(r->publish[i]);
    memset(r, 0, sizeof(*r));
}

static json_t *decode_json(const char *s, size_t len, unsigned char *buf) {
    long n = b64url_decode(s, len, buf);
    if (n < 0)
        return NULL;
    json_error_t e;
    json_t *j = json_loadb((const char *)buf, (size_t)n, JSON_REJECT_DUPLICATES, &e);
    if (j && !json_is_object(j)) {
        json_decref(j);
        return NULL;
    }
    return j;
}

int app_token_verify(const app_token_config *c, const char *tok, size_t len, int64_t now,
                       app_token_rights *out, const char **why) {
    memset(out, 0, sizeof(*out));
    if (!app_token_config_ready(c)) {
        *why = "no key";
        return -EACCES;
    }
    if (tok == NULL || len == 0 || len > TERN_TOKEN_MAX) {
        *why = len ? "token too long" : "empty token";
        return -EACCES;
    }
    const char *d1 = memchr(tok, '.', len);
    const char *d2 = d1 ? memchr(d1 + 1, '.', len - (size_t)(d1 + 1 - tok)) : NULL;
    if (d2 == NULL || memchr(d2 + 1, '.', len - (size_t)(d2 + 1 - tok))) {
        *why = "malformed";
        return -EACCES;
    }
    unsigned char buf[TERN_TOKEN_MAX];   /* any part decodes to fewer bytes than the token */
    int err = -EACCES;
    json_t *hdr = NULL, *cl = NULL;

    /* The header: the algorithm must be one the configuration pins. */
    if ((hdr = decode_json(tok, (size_t)(d1 - tok), buf)) == NULL) {
        *why = "malformed header";
        goto out;
    }
    const char *alg = json_string_value(json_object_get(hdr, "alg"));
    enum alg a;
    if (alg && strcmp(alg, "HS256") == 0 && c->secret)
        a = ALG_HS256;
    else if (alg && c->key && strcmp(alg, c->key_alg == ALG_RS256 ? "RS256" : "ES256") == 0)
        a = ALG_RS256 + (c->key_alg == ALG_ES256);
    else {
        *why = "algorithm not accepted";
        goto out;
    }
    if (json_object_get(hdr, "crit")) {   /* extensions we would have to understand */
        *why = "crit header";
        goto out;
    }

    long sl = b64url_decode(d2 + 1, len - (size_t)(d2 + 1 - tok), buf);
    if (sl < 0) {
        *why = "malformed signature";
        goto out;
    }
    if (!(a != ALG_HS256 && sig_seen(c, tok, len)) &&
        !verify_sig(c, a, tok, (size_t)(d2 - tok), buf, (size_t)sl)) {
        *why = "bad signature";
        goto out;
    }
    if (a != ALG_HS256)
        sig_remember(c, tok, len);

    /* The claims, signed: now they mean something. */
    if ((cl = decode_json(d1 + 1, (size_t)(d2 - d1 - 1), buf)) == NULL) {
        *why = "malformed claims";
        goto out;
    }
    json_t *sub = json_object_get(cl, "sub");
    if (!json_is_string(sub) || json_string_length(sub) == 0) {
        *why = "no sub";
        goto out;
    }
    int64_t exp = 0, nbf = 0, iat = 0;
    bool has;
    if (!num_claim(cl, "exp", true, &exp, &has)) {
        *why = "no exp";
        goto out;
    }
    if (!num_claim(cl, "nbf", false, &nbf, &has) || !num_claim(cl, "iat", false, &iat, &has)) {
        *why = "bad nbf or iat";
        goto out;
    }
    if (now >= exp + c->leeway) {
        *why = "expired";
        goto out;
    }
    if (json_object_get(cl, "nbf") && nbf > now + c->leeway) {
        *why = "not yet valid";
        goto out;
    }
    if (c->aud && !aud_ok(json_object_get(cl, "aud"), c->aud)) {
        *why = "wrong audience";
        goto out;
    }
    if (c->iss) {
        const char *iss = json_string_value(json_object_get(cl, "iss"));
        if (iss == NULL || strcmp(iss, c->iss) != 0) {
            *why = "wrong issuer";
            goto out;
        }
    }
    json_t *rights = json_object_get(cl, "tern");
    if (rights && !json_is_object(rights)) {
        *why = "bad rights";
        goto out;
    }
    json_t *info = json_object_get(cl, "info");
    if (info && (out->info = json_dumps(info, JSON_COMPACT | JSON_ENCODE_ANY)) == NULL) {
        err = -ENOMEM;
        *why = "out of memory";
        goto out;
    }
    if (out->info && strlen(out->info) > TERN_TOKEN_INFO_MAX) {
        *why = "info too large";
        app_token_rights_free(out);
        goto out;
    }
    err = 0;
    if ((out->sub = strdup(json_string_value(sub))) == NULL ||
        (err = app_token_rights_take(rights, out, why)) < 0) {
        if (err != -EACCES) {
            err = -ENOMEM;
            *why = "out of memory";
        }
        app_token_rights_free(out);
        goto out;
    }
    out->exp = exp;
    out->until = exp + c->leeway;
    err = 0;
out:
    json_decref(hdr);
    json_decref(cl);
    tern__crypto_wipe(buf, sizeof(buf));
    return err;
}

bool app_token_allows(char *const *list, size_t n, const char *topic, size_t len) {
    for (size_t i = 0; i < n; i++) {
        size_t el = strlen(list[i]);
        if (el > 0 && list[i][el - 1] == '*') {
            if (len >= el - 1 && memcmp(list[i], topic, el - 1) == 0)
                return true;
        } else if (el == len && memcmp(list[i], topic, len) == 0) {
            return true;
        }
    }
    return false;
}
