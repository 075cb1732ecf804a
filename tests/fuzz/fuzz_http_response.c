/* The response-head parser (the WebSocket client's) on arbitrary bytes.
 *
 * Checks, beyond "no crash, no out-of-bounds read" (ASan):
 *  - every view the parser returns lies inside the input;
 *  - a head it accepts ends with the blank line tern__http_find_head_end()
 *    finds, so the client and the parser agree on where frames begin;
 *  - every proper prefix of an accepted head asks for more (a head split
 *    across reads is never judged early), and a refusal of a prefix is a
 *    refusal of the whole;
 *  - a refusal is one of the statuses the parser documents. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "http/parser.h"

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond))                                                                               \
            abort();                                                                               \
    } while (0)

#define MAX_HEAD 4096

static bool inside(const char *p, size_t n, const char *buf, size_t len) {
    return n == 0 || (p >= buf && p + n <= buf + len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* A copy of exactly `size` bytes, so ASan sees any read past the end. */
    char *buf = malloc(size ? size : 1);
    memcpy(buf, data, size);
    tern__http_header headers[16];
    tern__http_response_head head;
    ssize_t r = tern__http_parse_response(buf, size, MAX_HEAD, &head, headers, 16);
    size_t scanned = 0;
    size_t end = tern__http_find_head_end(buf, size, &scanned);
    if (r > 0) {
        CHECK((size_t)r <= size && (size_t)r <= MAX_HEAD);
        CHECK((size_t)r == end);
        CHECK(head.status >= 100 && head.status <= 999);
        CHECK(head.minor_version == 0 || head.minor_version == 1);
        CHECK(inside(head.reason, head.reason_len, buf, size));
        CHECK(head.num_headers <= 16);
        for (size_t i = 0; i < head.num_headers; i++) {
            CHECK(inside(headers[i].name, headers[i].name_len, buf, size));
            CHECK(headers[i].name_len > 0);
            CHECK(inside(headers[i].value, headers[i].value_len, buf, size));
            CHECK(memchr(headers[i].value, '\r', headers[i].value_len) == NULL);
            CHECK(memchr(headers[i].value, '\n', headers[i].value_len) == NULL);
        }
        tern__http_response_head h2;
        tern__http_header hd2[16];
        size_t cut = size ? (size_t)data[0] % (size_t)r : 0;
        CHECK(tern__http_parse_response(buf, cut, MAX_HEAD, &h2, hd2, 16) == 0);
    } else if (r < 0) {
        CHECK(r == -400 || r == -431 || r == -505);
    } else {
        CHECK(end == 0 && size < MAX_HEAD);
    }
    free(buf);
    return 0;
}
