/* The admin API's JSON reader (src/app/json_read.c), against jansson:
 * any bytes are read without harm, and a document the reader walks to
 * its end (every value read as what it is: strings both decoded and as
 * tokens, whole numbers, booleans, arrays, objects) is one jansson takes
 * too, so the reader never lets through what is not JSON. The walk stops
 * at what the reader does not read (null, fractions, negative numbers),
 * as the API's callers refuse them. */
#include <assert.h>
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "app/json_read.h"

enum { DEPTH_MAX = 64 };

/* Reads one value; false where the reader refused or the walk stops. */
static bool walk(app_json_reader *r, int depth, unsigned *turn) {
    bool ok;
    char buf[64];
    switch (app_json_peek(r)) {
    case APP_JSON_STRING:
        /* alternately decoded and taken as a token, both paths covered */
        if ((*turn)++ % 2) {
            const char *s;
            size_t n;
            if (!app_json_string_token(r, &s, &n))
                return false;
            assert(n >= 2 && s[0] == '"' && s[n - 1] == '"');
            return true;
        }
        return app_json_string(r, buf, sizeof(buf)) >= 0;
    case APP_JSON_NUMBER: {
        uint64_t v;
        return app_json_uint(r, &v) && v <= INT64_MAX;
    }
    case APP_JSON_BOOL: {
        bool b;
        return app_json_bool(r, &b);
    }
    case APP_JSON_ARRAY:
        if (depth >= DEPTH_MAX || !app_json_array(r))
            return false;
        while (app_json_element(r, &ok))
            if (!walk(r, depth + 1, turn))
                return false;
        return ok;
    case APP_JSON_OBJECT:
        if (depth >= DEPTH_MAX || !app_json_object(r))
            return false;
        while (app_json_member(r, buf, sizeof(buf), &ok)) {
            assert(memchr(buf, '\0', sizeof(buf)) != NULL);
            if (!walk(r, depth + 1, turn))
                return false;
        }
        return ok;
    default:
        return false;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    app_json_reader r;
    unsigned turn = 0;
    app_json_reader_init(&r, (const char *)data, size);
    if (!walk(&r, 0, &turn) || !app_json_done(&r))
        return 0;
    json_error_t err;
    json_t *j = json_loadb((const char *)data, size, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
    assert(j != NULL);   /* what the reader read whole, jansson takes */
    json_decref(j);
    return 0;
}
