/* A reader of one JSON document held in memory, for the admin API's
 * request bodies (serve_api.c): a cursor the caller moves value by value,
 * asking for the type it expects, so that a field of the wrong type is
 * an error naming it, and nothing is allocated. Strings must be UTF-8
 * (a text frame carries them on); a decoded one refuses \u0000 (names
 * are C strings), a token passed on as it is does not. Nesting is the caller's: it opens objects and arrays as it
 * meets them. */
#ifndef TERN_APP_JSON_READ_H
#define TERN_APP_JSON_READ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Invariants: p <= end; p is at the next value or separator, past any
 * whitespace after the last thing read; after a failure the reader is
 * not used again. first: no member or element read yet in the object or
 * array just opened. */
typedef struct app_json_reader {
    const char *p, *end;
    bool first;
} app_json_reader;

typedef enum app_json_type {
    APP_JSON_END,   /* nothing left, or not the start of a value */
    APP_JSON_STRING,
    APP_JSON_NUMBER,
    APP_JSON_BOOL,
    APP_JSON_NULL,
    APP_JSON_ARRAY,
    APP_JSON_OBJECT,
} app_json_type;

void app_json_reader_init(app_json_reader *r, const char *s, size_t n);
/* The type of the next value, without reading it. */
app_json_type app_json_peek(const app_json_reader *r);

/* Opens an object or array (false: not one). */
bool app_json_object(app_json_reader *r);
bool app_json_array(app_json_reader *r);
/* The next member of the open object: true and its name decoded into key
 * (NUL-terminated, cap bytes; a longer one is an error), the reader at
 * its value; false at the object's end (ok true) or on bad input (ok
 * false). */
bool app_json_member(app_json_reader *r, char *key, size_t cap, bool *ok);
/* Whether the open array has another element (the reader at it); false
 * at its end (ok true) or on bad input (ok false). */
bool app_json_element(app_json_reader *r, bool *ok);

/* A string decoded into out (cap bytes, NUL-terminated): its length, or
 * -1 (not a valid string, or holding \u0000), -2 (over cap - 1 bytes). */
long app_json_string(app_json_reader *r, char *out, size_t cap);
/* A string as it is written, quotes included, checked as above (but
 * \u0000 is allowed): the view in *s, *n (a JSON string token another
 * message can carry on). */
bool app_json_string_token(app_json_reader *r, const char **s, size_t *n);
/* A whole number 0 .. 2^63 - 1, written without fraction or exponent. */
bool app_json_uint(app_json_reader *r, uint64_t *out);
bool app_json_bool(app_json_reader *r, bool *out);

/* Whether only whitespace is left. */
bool app_json_done(const app_json_reader *r);

#endif
