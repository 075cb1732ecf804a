/* The JSON string escaper (json.h). */
#include "app/json.h"

#include <string.h>

size_t app_json_escape(char *out, size_t cap, const char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        size_t need = c == '"' || c == '\\' ? 2 : c < 0x20 ? 6 : 1;
        if (o + need + 1 > cap)
            break;   /* cut before a character that does not fit whole */
        if (need == 2) {
            out[o++] = '\\';
            out[o++] = (char)c;
        } else if (need == 6) {
            memcpy(out + o, "\\u00", 4);
            out[o + 4] = hex[c >> 4];
            out[o + 5] = hex[c & 0xf];
            o += 6;
        } else {
            out[o++] = (char)c;
        }
    }
    out[o] = '\0';
    return o;
}

void app_json_print_string(FILE *f, const char *s) {
    /* A slice at a time, through a buffer that takes any slice whole. */
    enum { SLICE = 256 };
    char buf[SLICE * APP_JSON_ESCAPE_MAX + 1];
    size_t left = strlen(s);
    fputc('"', f);
    while (left > 0) {
        size_t k = left < SLICE ? left : SLICE;
        fwrite(buf, 1, app_json_escape(buf, sizeof(buf), s, k), f);
        s += k;
        left -= k;
    }
    fputc('"', f);
}
