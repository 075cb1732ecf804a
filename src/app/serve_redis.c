/* tern serve's --redis URL: its password kept out of every line tern
 * writes, and --redis-password-file's password put into it.
 *
 * The library takes the password inside the URL
 * (redis://[user]:password@host...), as Redis's own clients do; a password
 * on the command line is visible to every user of the machine (ps,
 * /proc), so --redis-password-file gives it from a file instead, and this
 * file writes it into the URL, percent-encoded, in memory only. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/app.h"

/* Where the userinfo starts (after the scheme's "://"). */
static const char *userinfo_start(const char *url) {
    const char *p = strstr(url, "://");
    return p ? p + 3 : url;
}

/* A NATS URL (nats://, or tls:// for NATS over TLS). */
static bool is_nats(const char *url) {
    return strncmp(url, "nats://", 7) == 0 || strncmp(url, "tls://", 6) == 0;
}

const char *app_serve_bridge_engine(const char *url) {
    return is_nats(url) ? "nats" : "redis";
}

/* Where the userinfo's '@' is (the last one before the path; for NATS,
 * before the first server's end: its ',' or the query too), or NULL. */
static const char *userinfo_end(const char *url) {
    bool nats = is_nats(url);
    const char *at = NULL;
    for (const char *p = userinfo_start(url); *p && *p != '/' && !(nats && strchr(",?", *p));
         p++)
        if (*p == '@')
            at = p;
    return at;
}

/* Appends len bytes of p to out (cap bytes, *n used), cut short when full:
 * the masked URL is shorter then, never shows more. */
static void append(char *out, size_t cap, size_t *n, const char *p, size_t len) {
    if (*n + 1 >= cap)
        return;
    if (len > cap - 1 - *n)
        len = cap - 1 - *n;
    memcpy(out + *n, p, len);
    *n += len;
    out[*n] = '\0';
}

/* Each server's secret masked: a NATS URL lists servers, and the engine
 * refuses credentials on any but the first, but a URL printed before it is
 * checked (--print-config, the error that says so) must not show them
 * either. */
void app_serve_redis_redact(const char *url, char *out, size_t cap) {
    bool nats = is_nats(url);
    size_t n = 0;
    if (cap == 0)
        return;
    out[0] = '\0';
    for (const char *s = url;;) {
        /* this server's end: for NATS its ',' (a ',' after the query is the query's) */
        const char *e = s + strlen(s);
        size_t k = strcspn(s, ",?");
        if (nats && s[k] == ',')
            e = s + k;
        const char *start = strstr(s, "://");
        start = start && start < e ? start + 3 : s;
        const char *at = NULL;
        for (const char *p = start; p < e && *p != '/' && !(nats && *p == '?'); p++)
            if (*p == '@')
                at = p;
        const char *colon = at ? memchr(start, ':', (size_t)(at - start)) : NULL;
        if (at && (colon || nats)) {
            /* user:password keeps its user; NATS's token is the whole userinfo */
            const char *kept = colon ? colon + 1 : start;
            append(out, cap, &n, s, (size_t)(kept - s));
            append(out, cap, &n, "****", 4);
            append(out, cap, &n, at, (size_t)(e - at));
        } else {
            append(out, cap, &n, s, (size_t)(e - s));
        }
        if (*e == '\0')
            return;
        append(out, cap, &n, ",", 1);
        s = e + 1;
    }
}

/* The password's bytes, percent-encoded but for RFC 3986's unreserved. */
static bool encode(const char *s, size_t len, char *out, size_t cap) {
    static const char hex[] = "0123456789ABCDEF";
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                     c == '-' || c == '.' || c == '_' || c == '~';
        if (n + (plain ? 1 : 3) >= cap)
            return false;
        if (plain) {
            out[n++] = (char)c;
        } else {
            out[n++] = '%';
            out[n++] = hex[c >> 4];
            out[n++] = hex[c & 15];
        }
    }
    out[n] = '\0';
    return true;
}

char *app_serve_redis_url(const char *url, const char *password_file) {
    if (password_file == NULL)
        return strdup(url);
    char shown[512];
    app_serve_redis_redact(url, shown, sizeof(shown));
    const char *at = userinfo_end(url);
    if (strncmp(url, "redis://", 8) != 0 || (at && memchr(url + 8, ':', (size_t)(at - url - 8)))) {
        fprintf(stderr, "tern serve: --redis-password-file needs a --bridge URL without a "
                        "password (redis://[user@]host[:port][/db]): %s\n", shown);
        return NULL;
    }
    FILE *f = fopen(password_file, "r");
    if (f == NULL) {
        fprintf(stderr, "tern serve: --redis-password-file %s: %s\n", password_file, strerror(errno));
        return NULL;
    }
    char line[512], enc[3 * sizeof(line)];
    bool got = fgets(line, sizeof(line), f) != NULL;
    fclose(f);
    size_t len = got ? strcspn(line, "\r\n") : 0;
    char *out = NULL;
    if (len == 0 || !encode(line, len, enc, sizeof(enc))) {
        fprintf(stderr, "tern serve: --redis-password-file %s: no password on its first line "
                        "(or one over %zu bytes)\n", password_file, sizeof(line) - 2);
    } else {
        /* redis:// [user] : password @ host... */
        const char *user = url + 8, *host = at ? at + 1 : user;
        size_t ulen = at ? (size_t)(at - user) : 0;
        size_t cap = strlen(url) + strlen(enc) + 3;
        if ((out = malloc(cap)) != NULL)
            snprintf(out, cap, "redis://%.*s:%s@%s", (int)ulen, user, enc, host);
        else
            fprintf(stderr, "tern serve: out of memory\n");
    }
    explicit_bzero(line, sizeof(line));
    explicit_bzero(enc, sizeof(enc));
    return out;
}
