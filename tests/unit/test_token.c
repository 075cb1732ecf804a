/* tern serve's JWT verifier (src/app/token.c): tokens made here with
 * OpenSSL (HMAC, EVP_DigestSign with generated RSA and EC keys). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/bio.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>

#include "app/token.h"

#define NOW 1700000000
static const char secret[] = "s3cret-for-the-tests";
static EVP_PKEY *rsa, *ec;

static size_t b64url(const void *in, size_t n, char *out) {
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    const unsigned char *p = in;
    size_t o = 0, i = 0;
    for (; i + 2 < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
        out[o++] = a[v >> 18], out[o++] = a[v >> 12 & 63], out[o++] = a[v >> 6 & 63],
        out[o++] = a[v & 63];
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)p[i] << 16;
        out[o++] = a[v >> 18], out[o++] = a[v >> 12 & 63];
    } else if (n - i == 2) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8;
        out[o++] = a[v >> 18], out[o++] = a[v >> 12 & 63], out[o++] = a[v >> 6 & 63];
    }
    out[o] = '\0';
    return o;
}

/* A token of header hdr and claims cl, signed with alg ("HS256" with key
 * bytes k[0..kn), "RS256"/"ES256" with pkey, "none": no signature). */
static char *make(const char *hdr, const char *cl, const char *alg, const void *k, size_t kn,
                  EVP_PKEY *pkey) {
    static char tok[20000];
    size_t o = b64url(hdr, strlen(hdr), tok);
    tok[o++] = '.';
    o += b64url(cl, strlen(cl), tok + o);
    size_t signed_len = o;
    tok[o++] = '.';
    unsigned char sig[512];
    size_t sl = 0;
    if (strcmp(alg, "HS256") == 0) {
        unsigned int ml;
        HMAC(EVP_sha256(), k, (int)kn, (unsigned char *)tok, signed_len, sig, &ml);
        sl = ml;
    } else if (strcmp(alg, "none") != 0) {
        EVP_MD_CTX *md = EVP_MD_CTX_new();
        unsigned char der[512];
        size_t dl = sizeof(der);
        assert_int_equal(EVP_DigestSignInit(md, NULL, EVP_sha256(), NULL, pkey), 1);
        assert_int_equal(EVP_DigestSign(md, der, &dl, (unsigned char *)tok, signed_len), 1);
        EVP_MD_CTX_free(md);
        if (strcmp(alg, "ES256") == 0) {   /* DER -> r || s */
            const unsigned char *p = der;
            ECDSA_SIG *es = d2i_ECDSA_SIG(NULL, &p, (long)dl);
            assert_non_null(es);
            BN_bn2binpad(ECDSA_SIG_get0_r(es), sig, 32);
            BN_bn2binpad(ECDSA_SIG_get0_s(es), sig + 32, 32);
            ECDSA_SIG_free(es);
            sl = 64;
        } else {
            memcpy(sig, der, dl);
            sl = dl;
        }
    }
    o += b64url(sig, sl, tok + o);
    tok[o] = '\0';
    return tok;
}

#define HS "{\"alg\":\"HS256\",\"typ\":\"JWT\"}"
#define GOOD "{\"sub\":\"alice\",\"exp\":1700003600,\"iat\":1700000000," \
             "\"tern\":{\"subscribe\":[\"orders.*\",\"news\"],\"publish\":[\"chat.*\"]}}"

static char *hs(const char *cl) {
    return make(HS, cl, "HS256", secret, strlen(secret), NULL);
}

static app_token_config *hmac_config(void) {
    app_token_config *c = app_token_config_new();
    assert_int_equal(app_token_config_hmac(c, secret, strlen(secret)), 0);
    return c;
}

static char *pem_of(EVP_PKEY *k, size_t *len) {
    BIO *b = BIO_new(BIO_s_mem());
    assert_int_equal(PEM_write_bio_PUBKEY(b, k), 1);
    char *p;
    long n = BIO_get_mem_data(b, &p);
    char *out = malloc((size_t)n + 1);
    memcpy(out, p, (size_t)n);
    out[n] = '\0';
    BIO_free(b);
    *len = (size_t)n;
    return out;
}

static app_token_config *key_config(EVP_PKEY *k) {
    app_token_config *c = app_token_config_new();
    size_t n;
    char *pem = pem_of(k, &n);
    assert_int_equal(app_token_config_public_pem(c, pem, n), 0);
    free(pem);
    return c;
}

/* Verifies t with c: 0 or -EACCES, and why it was refused. */
static int check(app_token_config *c, const char *t, const char **why) {
    app_token_rights r;
    const char *w = "";
    int err = app_token_verify(c, t, strlen(t), NOW, &r, &w);
    if (why)
        *why = w;
    app_token_rights_free(&r);
    return err;
}

static void refused(app_token_config *c, const char *t, const char *why) {
    const char *w;
    assert_int_equal(check(c, t, &w), -EACCES);
    if (why)
        assert_string_equal(w, why);
}

static void hs256_good(void **state) {
    (void)state;
    app_token_config *c = hmac_config();
    app_token_rights r;
    const char *why;
    const char *t = hs(GOOD);
    assert_int_equal(app_token_verify(c, t, strlen(t), NOW, &r, &why), 0);
    assert_string_equal(r.sub, "alice");
    assert_int_equal(r.exp, 1700003600);
    assert_int_equal(r.nsubscribe, 2);
    assert_int_equal(r.npublish, 1);
    assert_string_equal(r.publish[0], "chat.*");
    app_token_rights_free(&r);
    /* no rights at all: valid, grants nothing */
    t = hs("{\"sub\":\"bob\",\"exp\":1700000100.5}");
    assert_int_equal(app_token_verify(c, t, strlen(t), NOW, &r, &why), 0);
    assert_int_equal(r.nsubscribe + r.npublish, 0);
    app_token_rights_free(&r);
    app_token_config_free(c);
}

/* The info claim: kept as compact JSON for presence, whatever its type;
 * absent, NULL; over TERN_TOKEN_INFO_MAX bytes, the token is refused. */
static void info_claim(void **state) {
    (void)state;
    app_token_config *c = hmac_config();
    app_token_rights r;
    const char *why;
    const char *t = hs("{\"sub\":\"a\",\"exp\":1700003600,\"info\":{ \"name\" : \"A\", \"n\": [1, 2] }}");
    assert_int_equal(app_token_verify(c, t, strlen(t), NOW, &r, &why), 0);
    assert_string_equal(r.info, "{\"name\":\"A\",\"n\":[1,2]}");
    app_token_rights_free(&r);
    t = hs("{\"sub\":\"a\",\"exp\":1700003600,\"info\":\"hi\"}");
    assert_int_equal(app_token_verify(c, t, strlen(t), NOW, &r, &why), 0);
    assert_string_equal(r.info, "\"hi\"");
    app_token_rights_free(&r);
    t = hs(GOOD);
    assert_int_equal(app_token_verify(c, t, strlen(t), NOW, &r, &why), 0);
    assert_null(r.info);
    app_token_rights_free(&r);
    /* A string info of k bytes of x is k + 2 bytes of JSON. */
    char cl[TERN_TOKEN_INFO_MAX + 128];
    for (int k = TERN_TOKEN_INFO_MAX - 2; k <= TERN_TOKEN_INFO_MAX - 1; k++) {
        int n = snprintf(cl, sizeof(cl), "{\"sub\":\"a\",\"exp\":1700003600,\"info\":\"");
        memset(cl + n, 'x', (size_t)k);
        strcpy(cl + n + k, "\"}");
        if (k + 2 > TERN_TOKEN_INFO_MAX)
            refused(c, hs(cl), "info too large");
        else
            assert_int_equal(check(c, hs(cl), NULL), 0);
    }
    app_token_config_free(c);
}

static void times(void **state) {
    (void)state;
    app_token_config *c = hmac_config();
    /* One leeway (30 s by default) on exp and nbf alike. */
    refused(c, hs("{\"sub\":\"a\",\"exp\":1699999970}"), "expired");
    assert_int_equal(check(c, hs("{\"sub\":\"a\",\"exp\":1699999971}"), NULL), 0);
    refused(c, hs("{\"sub\":\"a\",\"exp\":1699999960}"), "expired");
    app_token_config_leeway(c, 0);
    refused(c, hs("{\"sub\":\"a\",\"exp\":1699999999}"), "expired");
    refused(c, hs("{\"sub\":\"a\",\"exp\":1700000000}"), "expired");
    refused(c, hs("{\"sub\":\"a\",\"exp\":1700003600,\"nbf\":1700000001}"), "not yet valid");
    app_token_config_leeway(c, TERN_TOKEN_LEEWAY);
    refused(c, hs("{\"sub\":\"a\",\"exp\":1700003600,\"nbf\":1700000031}"), "not yet valid");
    assert_int_equal(check(c, hs("{\"sub\":\"a\",\"exp\":1700003600,\"nbf\":1700000030}"), NULL), 0);
    refused(c, hs("{\"sub\":\"a\",\"exp\":1700003600,\"nbf\":\"soon\"}"), "bad nbf or iat");
    refused(c, hs("{\"sub\":\"a\",\"exp\":1700003600,\"iat\":null}"), "bad nbf or iat");
    refused(c, hs("{\"sub\":\"a\"}"), "no exp");
    refused(c, hs("{\"sub\":\"a\",\"exp\":\"1700003600\"}"), "no exp");
    refused(c, hs("{\"exp\":1700003600}"), "no sub");
    refused(c, hs("{\"sub\":7,\"exp\":1700003600}"), "no sub");
    refused(c, hs("{\"sub\":\"\",\"exp\":1700003600}"), "no sub");
    app_token_config_free(c);
}

static void bad_signature(void **state) {
    (void)state;
    app_token_config *c = hmac_config();
    refused(c, make(HS, GOOD, "HS256", "other", 5, NULL), "bad signature");
    char *t = hs(GOOD);
    t[strlen(t) - 2] = t[strlen(t) - 2] == 'A' ? 'B' : 'A';
    refused(c, t, NULL);
    /* the claims changed under a good signature */
    char *good = strdup(hs(GOOD));
    char *forged = hs("{\"sub\":\"mallory\",\"exp\":1700003600}");
    char mix[4096];
    snprintf(mix, sizeof(mix), "%.*s%s", (int)(strrchr(forged, '.') - forged), forged,
             strrchr(good, '.'));
    refused(c, mix, NULL);
    free(good);
    app_token_config_free(c);
}

static void alg_none(void **state) {
    (void)state;
    app_token_config *c = hmac_config();
    refused(c, make("{\"alg\":\"none\"}", GOOD, "none", NULL, 0, NULL), "algorithm not accepted");
    refused(c, make("{\"alg\":\"hs256\"}", GOOD, "HS256", secret, strlen(secret), NULL),
            "algorithm not accepted");
    refused(c, make("{\"typ\":\"JWT\"}", GOOD, "HS256", secret, strlen(secret), NULL),
            "algorithm not accepted");
    /* RS256 with only a secret configured */
    refused(c, make("{\"alg\":\"RS256\"}", GOOD, "RS256", NULL, 0, rsa), "algorithm not accepted");
    refused(c, make("{\"alg\":\"HS256\",\"crit\":[\"x\"]}", GOOD, "HS256", secret, strlen(secret),
                    NULL),
            "crit header");
    app_token_config_free(c);
}

static void key_confusion(void **state) {
    (void)state;
    app_token_config *c = key_config(rsa);
    size_t n;
    char *pem = pem_of(rsa, &n);
    /* HS256 "signed" with the public key's PEM bytes as the secret */
    refused(c, make(HS, GOOD, "HS256", pem, n, NULL), "algorithm not accepted");
    free(pem);
    /* ES256 when the key is RSA */
    refused(c, make("{\"alg\":\"ES256\"}", GOOD, "ES256", NULL, 0, ec), "algorithm not accepted");
    app_token_config_free(c);
}

static void rs256_good(void **state) {
    (void)state;
    app_token_config *c = key_config(rsa);
    assert_int_equal(check(c, make("{\"alg\":\"RS256\"}", GOOD, "RS256", NULL, 0, rsa), NULL), 0);
    app_token_config_free(c);
    /* both configured: either algorithm */
    c = key_config(rsa);
    assert_int_equal(app_token_config_hmac(c, secret, strlen(secret)), 0);
    assert_int_equal(check(c, hs(GOOD), NULL), 0);
    assert_int_equal(check(c, make("{\"alg\":\"RS256\"}", GOOD, "RS256", NULL, 0, rsa), NULL), 0);
    app_token_config_free(c);
}

static void es256_good(void **state) {
    (void)state;
    app_token_config *c = key_config(ec);
    assert_int_equal(check(c, make("{\"alg\":\"ES256\"}", GOOD, "ES256", NULL, 0, ec), NULL), 0);
    /* a DER signature (OpenSSL's form) is not JWS's r || s */
    char *t = make("{\"alg\":\"ES256\"}", GOOD, "ES256", NULL, 0, ec);
    t[strlen(t) - 3] = t[strlen(t) - 3] == 'A' ? 'B' : 'A';
    refused(c, t, NULL);
    refused(c, make("{\"alg\":\"RS256\"}", GOOD, "RS256", NULL, 0, rsa), "algorithm not accepted");
    app_token_config_free(c);
}

/* A public-key signature verified once is not verified again for the
 * same token and configuration (token.c's per-thread cache), but nothing
 * else is skipped: the claims are checked at every use (a remembered
 * token past its exp is refused), a token differing in one byte of its
 * signature is checked and refused, and another configuration (another
 * key) checks for itself. */
static void remembered_signatures_still_check_claims(void **state) {
    (void)state;
    app_token_config *c = key_config(rsa);
    char good[4096];
    snprintf(good, sizeof(good), "%s", make("{\"alg\":\"RS256\"}", GOOD, "RS256", NULL, 0, rsa));
    assert_int_equal(check(c, good, NULL), 0);
    assert_int_equal(check(c, good, NULL), 0);   /* remembered */
    app_token_rights r;
    const char *why = "";
    assert_int_equal(app_token_verify(c, good, strlen(good), 1700003600 + TERN_TOKEN_LEEWAY,
                                        &r, &why), -EACCES);
    assert_string_equal(why, "expired");
    char bad[4096];
    snprintf(bad, sizeof(bad), "%s", good);
    size_t n = strlen(bad);
    bad[n - 5] = bad[n - 5] == 'A' ? 'B' : 'A';
    refused(c, bad, "bad signature");
    /* the same key in a new configuration, and another key */
    app_token_config *again = key_config(rsa);
    assert_int_equal(check(again, good, NULL), 0);
    app_token_config_free(again);
    app_token_config *other = key_config(ec);
    refused(other, good, "algorithm not accepted");
    app_token_config_free(other);
    EVP_PKEY *rsa2 = EVP_RSA_gen(2048);
    assert_non_null(rsa2);
    other = key_config(rsa2);
    refused(other, good, "bad signature");
    app_token_config_free(other);
    EVP_PKEY_free(rsa2);
    app_token_config_free(c);
}

static void audience_issuer(void **state) {
    (void)state;
    app_token_config *c = hmac_config();
    assert_int_equal(app_token_config_audience(c, "tern"), 0);
    assert_int_equal(app_token_config_issuer(c, "https://auth.example"), 0);
    const char *iss = ",\"iss\":\"https://auth.example\"}";
    char cl[512];
    snprintf(cl, sizeof(cl), "{\"sub\":\"a\",\"exp\":1700003600,\"aud\":\"tern\"%s", iss);
    assert_int_equal(check(c, hs(cl), NULL), 0);
    snprintf(cl, sizeof(cl), "{\"sub\":\"a\",\"exp\":1700003600,\"aud\":[\"x\",\"tern\"]%s", iss);
    assert_int_equal(check(c, hs(cl), NULL), 0);
    snprintf(cl, sizeof(cl), "{\"sub\":\"a\",\"exp\":1700003600,\"aud\":\"other\"%s", iss);
    refused(c, hs(cl), "wrong audience");
    snprintf(cl, sizeof(cl), "{\"sub\":\"a\",\"exp\":1700003600,\"aud\":[\"x\"]%s", iss);
    refused(c, hs(cl), "wrong audience");
    snprintf(cl, sizeof(cl), "{\"sub\":\"a\",\"exp\":1700003600%s", iss);
    refused(c, hs(cl), "wrong audience");
    refused(c, hs("{\"sub\":\"a\",\"exp\":1700003600,\"aud\":\"tern\",\"iss\":\"evil\"}"),
            "wrong issuer");
    refused(c, hs("{\"sub\":\"a\",\"exp\":1700003600,\"aud\":\"tern\"}"), "wrong issuer");
    app_token_config_free(c);
}

static void malformed(void **state) {
    (void)state;
    app_token_config *c = hmac_config();
    char *t = strdup(hs(GOOD));
    refused(c, "", "empty token");
    refused(c, "abc", "malformed");
    refused(c, "a.b", "malformed");
    refused(c, "a.b.c.d", "malformed");
    refused(c, "!!!.e30.", "malformed header");
    refused(c, "eyJhbGciOiJIUzI1NiJ9=.e30.", "malformed header");   /* padding */
    /* the header: not JSON, not an object, a duplicate key */
    char bad[256];
    snprintf(bad, sizeof(bad), "%s", make("{\"alg\":\"HS256\"", GOOD, "HS256", secret,
                                          strlen(secret), NULL));
    refused(c, bad, "malformed header");
    refused(c, make("[1]", GOOD, "HS256", secret, strlen(secret), NULL), "malformed header");
    refused(c, make("{\"alg\":\"none\",\"alg\":\"HS256\"}", GOOD, "HS256", secret, strlen(secret),
                    NULL),
            "malformed header");
    /* the claims, signed but not JSON */
    refused(c, hs("{\"sub\":\"a\",\"exp\":1700003600"), "malformed claims");
    refused(c, hs("\"just a string\""), "malformed claims");
    refused(c, hs("{\"sub\":\"a\\u0000b\",\"exp\":1700003600}"), "malformed claims");
    /* a bad character in the signature */
    t[strlen(t) - 1] = '*';
    refused(c, t, "malformed signature");
    free(t);
    app_token_config_free(c);
}

static void too_long(void **state) {
    (void)state;
    app_token_config *c = hmac_config();
    char cl[9000];
    int n = snprintf(cl, sizeof(cl), "{\"sub\":\"a\",\"exp\":1700003600,\"pad\":\"");
    memset(cl + n, 'x', 6500);
    strcpy(cl + n + 6500, "\"}");
    const char *t = hs(cl);
    assert_true(strlen(t) > TERN_TOKEN_MAX);
    refused(c, t, "token too long");
    /* rights: 64 entries at most, strings, in arrays */
    char big[4096];
    n = snprintf(big, sizeof(big), "{\"sub\":\"a\",\"exp\":1700003600,\"tern\":{\"subscribe\":[");
    for (int i = 0; i < 40; i++)
        n += snprintf(big + n, sizeof(big) - (size_t)n, "%s\"t%d\"", i ? "," : "", i);
    n += snprintf(big + n, sizeof(big) - (size_t)n, "],\"publish\":[");
    for (int i = 0; i < 24; i++)
        n += snprintf(big + n, sizeof(big) - (size_t)n, "%s\"p%d\"", i ? "," : "", i);
    snprintf(big + n, sizeof(big) - (size_t)n, "]}}");
    assert_int_equal(check(c, hs(big), NULL), 0);
    strcpy(big + n, ",\"p99\"]}}");
    refused(c, hs(big), "too many rights");
    refused(c, hs("{\"sub\":\"a\",\"exp\":1700003600,\"tern\":{\"publish\":\"chat\"}}"),
            "bad rights");
    refused(c, hs("{\"sub\":\"a\",\"exp\":1700003600,\"tern\":{\"publish\":[1]}}"), "bad rights");
    refused(c, hs("{\"sub\":\"a\",\"exp\":1700003600,\"tern\":{\"publish\":[\"\"]}}"),
            "bad rights");
    refused(c, hs("{\"sub\":\"a\",\"exp\":1700003600,\"tern\":[]}"), "bad rights");
    app_token_config_free(c);
}

static void rights_match(void **state) {
    (void)state;
    char *list[] = {"news", "orders.*", "x*"};
    assert_true(app_token_allows(list, 3, "news", 4));
    assert_false(app_token_allows(list, 3, "news2", 5));
    assert_false(app_token_allows(list, 3, "new", 3));
    assert_true(app_token_allows(list, 3, "orders.1", 8));
    assert_true(app_token_allows(list, 3, "orders.", 7));
    assert_false(app_token_allows(list, 3, "orders", 6));
    assert_false(app_token_allows(list, 3, "orderz.1", 8));
    assert_true(app_token_allows(list, 3, "x", 1));
    assert_true(app_token_allows(list, 3, "xyz", 3));
    assert_false(app_token_allows(list, 3, "market", 6));
    assert_false(app_token_allows(list, 0, "news", 4));
    char *all[] = {"*"};
    assert_true(app_token_allows(all, 1, "anything", 8));
}

static void config_errors(void **state) {
    (void)state;
    app_token_config *c = app_token_config_new();
    assert_false(app_token_config_ready(c));
    refused(c, hs(GOOD), "no key");
    assert_int_equal(app_token_config_hmac(c, "", 0), -EINVAL);
    assert_int_equal(app_token_config_public_pem(c, "not a key", 9), -EINVAL);
    const char *why;
    assert_true(app_token_config_hmac_file(c, "/nonexistent/secret", &why) < 0);
    /* the secret file: one trailing newline stripped */
    char path[] = "/tmp/tern-token-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "%s\n", secret);
    fclose(f);
    assert_int_equal(app_token_config_hmac_file(c, path, &why), 0);
    unlink(path);
    assert_int_equal(check(c, hs(GOOD), NULL), 0);
    app_token_config_free(c);
}

static int setup(void **state) {
    (void)state;
    rsa = EVP_RSA_gen(2048);
    ec = EVP_EC_gen("P-256");
    return rsa && ec ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    EVP_PKEY_free(rsa);
    EVP_PKEY_free(ec);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(hs256_good),    cmocka_unit_test(times),
        cmocka_unit_test(bad_signature), cmocka_unit_test(alg_none),
        cmocka_unit_test(key_confusion), cmocka_unit_test(rs256_good),
        cmocka_unit_test(es256_good),    cmocka_unit_test(info_claim),
        cmocka_unit_test(remembered_signatures_still_check_claims),    cmocka_unit_test(audience_issuer),
        cmocka_unit_test(malformed),     cmocka_unit_test(too_long),
        cmocka_unit_test(rights_match),  cmocka_unit_test(config_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
