/* The tern command's one JSON string escaper: the JSON log lines
 * (serve_log.c), /pubsub's replies (serve_pubsub.c) and tern load's
 * --json results (load.c) all escape through it. What it escapes:
 * the quote, the backslash and the control bytes below 0x20 (as \u00XX);
 * every other byte is copied as it is (the strings are ASCII or UTF-8, and
 * JSON takes UTF-8 unescaped). */
#ifndef TERN_APP_JSON_H
#define TERN_APP_JSON_H

#include <stddef.h>
#include <stdio.h>

/* The escape of the byte c: at most 6 bytes. */
#define APP_JSON_ESCAPE_MAX 6

/* s[0..n) escaped, without quotes, into out (cap bytes, cap >= 1): as
 * many whole characters as fit with the final NUL, never a part of an
 * escape. Returns the length written (the NUL not counted); out is
 * NUL-terminated. Room for 6n + 1 bytes takes any s whole. */
size_t app_json_escape(char *out, size_t cap, const char *s, size_t n);

/* s (NUL-terminated) as a JSON string, quotes included, to f. */
void app_json_print_string(FILE *f, const char *s);

#endif
