/* tern serve's JWT verifier (src/app/token.c), HS256 configured.
 *
 * Input: a first byte, then
 *   even: a token, verified as it is;
 *   odd: a header and claims (JSON, or not) split at the first NUL byte,
 *        which this target encodes and signs with the configured secret,
 *        so that the claims' checks are reached too.
 * Never crashes, never leaks; a token accepted has a sub, an exp after
 * now and at most TERN_TOKEN_RIGHTS_MAX rights. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "app/token.h"

#define NOW 1700000000
#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond))                                                                               \
            abort();                                                                               \
    } while (0)

static const char secret[] = "fuzz-secret";

static size_t b64url(const uint8_t *p, size_t n, char *out) {
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    size_t o = 0, i = 0;
    for (; i + 2 < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
        out[o++] = a[v >> 18], out[o++] = a[v >> 12 & 63], out[o++] = a[v >> 6 & 63],
        out[o++] = a[v & 63];
    }
    if (n - i >= 1) {
        uint32_t v = (uint32_t)p[i] << 16 | (n - i == 2 ? (uint32_t)p[i + 1] << 8 : 0);
        out[o++] = a[v >> 18], out[o++] = a[v >> 12 & 63];
        if (n - i == 2)
            out[o++] = a[v >> 6 & 63];
    }
    return o;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static app_token_config *c;
    if (c == NULL) {
        c = app_token_config_new();
        CHECK(app_token_config_hmac(c, secret, strlen(secret)) == 0);
        CHECK(app_token_config_audience(c, "tern") == 0);
    }
    if (size < 1)
        return 0;
    const char *tok = (const char *)data + 1;
    size_t len = size - 1;
    char *made = NULL;
    if (data[0] & 1) {
        const uint8_t *hdr = data + 1, *nul = memchr(hdr, 0, len);
        size_t hl = nul ? (size_t)(nul - hdr) : len;
        const uint8_t *cl = nul ? nul + 1 : hdr + len;
        size_t cll = nul ? len - hl - 1 : 0;
        made = malloc(2 * len + 64);
        size_t o = b64url(hdr, hl, made);
        made[o++] = '.';
        o += b64url(cl, cll, made + o);
        unsigned char mac[32];
        unsigned int ml;
        HMAC(EVP_sha256(), secret, (int)strlen(secret), (unsigned char *)made, o, mac, &ml);
        made[o++] = '.';
        o += b64url(mac, 32, made + o);
        tok = made;
        len = o;
    }
    /* the token in an allocation of its own size: ASan sees an over-read */
    char *t = malloc(len ? len : 1);
    memcpy(t, tok, len);
    app_token_rights r;
    const char *why = NULL;
    int err = app_token_verify(c, t, len, NOW, &r, &why);
    CHECK(err == 0 || err == -EACCES || err == -ENOMEM);
    if (err == 0) {
        CHECK(r.sub && r.sub[0] && r.exp > NOW);
        CHECK(r.nsubscribe + r.npublish <= TERN_TOKEN_RIGHTS_MAX);
        (void)app_token_allows(r.subscribe, r.nsubscribe, "market", 6);
        (void)app_token_allows(r.publish, r.npublish, "chat.room", 9);
    } else {
        CHECK(why != NULL && r.sub == NULL && r.nsubscribe == 0 && r.npublish == 0);
    }
    app_token_rights_free(&r);
    free(t);
    free(made);
    return 0;
}
