/* A self-signed certificate for "localhost" in a directory of its own,
 * made with the openssl command, for the unit tests that serve TLS: the
 * one place they make it (a cmocka group's setup and teardown). */
#ifndef TERN_TEST_CERT_H
#define TERN_TEST_CERT_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#define TEST_CERT_PATH_MAX 64   /* cert's and key's buffers */

/* The key kinds of test_cert_make: RSA as a server usually has; P-256,
 * cheap to load a thousand times. */
#define TEST_CERT_RSA "rsa:2048"
#define TEST_CERT_P256 "ec -pkeyopt ec_paramgen_curve:P-256"

/* Makes the directory dir (a mkdtemp template, "/tmp/tern-x-XXXXXX",
 * filled in) and in it k.pem, a new key of kind newkey (TEST_CERT_*), and
 * c.pem, its certificate for CN=localhost, two days long, with
 * subjectAltName DNS:localhost when san; their paths into cert and key
 * (TEST_CERT_PATH_MAX bytes each). 0, or -1 (a setup's failure). */
static inline int test_cert_make(char *dir, const char *newkey, bool san, char *cert,
                                 char *key) {
    if (mkdtemp(dir) == NULL)
        return -1;
    snprintf(cert, TEST_CERT_PATH_MAX, "%s/c.pem", dir);
    snprintf(key, TEST_CERT_PATH_MAX, "%s/k.pem", dir);
    char cmd[512];
    snprintf(cmd, sizeof(cmd),
             "openssl req -x509 -newkey %s -nodes -keyout %s -out %s -days 2 "
             "-subj /CN=localhost%s >/dev/null 2>&1",
             newkey, key, cert, san ? " -addext subjectAltName=DNS:localhost" : "");
    return system(cmd) == 0 ? 0 : -1;
}

/* Removes dir and what is in it. 0, or -1 (a teardown's failure). */
static inline int test_cert_remove(const char *dir) {
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

#endif
