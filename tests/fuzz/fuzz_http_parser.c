/* The request-head parser on arbitrary bytes.
 *
 * Checks, beyond "no crash, no out-of-bounds read" (ASan):
 *  - every view the parser returns lies inside the input;
 *  - a head it accepts ends with the blank line tern__http_find_head_end()
 *    finds, so the connection and the parser agree on where the body starts;
 *  - feeding the same bytes in two steps (a resumed head-end search) gives
 *    the same answer as feeding them at once;
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

static bool inside(const char *p, size_t n, const char *buf, size_t len) {
    return n == 0 || (p >= buf && p + n <= buf + len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* A copy of exactly `size` bytes, so ASan sees any read past the end. */
    char *buf = malloc(size ? size : 1);
    memcpy(buf, data, size);

    tern__http_limits lim = {.max_head = 4096, .max_uri = 1024, .max_headers = 16};
    tern__http_header headers[16];
    tern__http_head head;
    ssize_t r = tern__http_parse_head(buf, size, &lim, &head, headers, 16);

    size_t scanned = 0;
    size_t end_split = tern__http_find_head_end(buf, size / 2, &scanned);
    if (end_split == 0)
        end_split = tern__http_find_head_end(buf, size, &scanned);
    size_t scanned_once = 0;
    size_t end_once = tern__http_find_head_end(buf, size, &scanned_once);
    CHECK(end_split == end_once);

    if (r > 0) {
        CHECK((size_t)r <= size && (size_t)r <= lim.max_head);
        CHECK((size_t)r == end_once);
        CHECK(inside(head.method, head.method_len, buf, size) && head.method_len > 0);
        CHECK(inside(head.target, head.target_len, buf, size) && head.target_len > 0);
        CHECK(head.target_len <= lim.max_uri);
        CHECK(inside(head.path, head.path_len, buf, size));
        CHECK(inside(head.query, head.query_len, buf, size));
        CHECK(head.minor_version == 0 || head.minor_version == 1);
        CHECK(head.num_headers <= 16);
        for (size_t i = 0; i < head.num_headers; i++) {
            CHECK(inside(headers[i].name, headers[i].name_len, buf, size));
            CHECK(headers[i].name_len > 0);
            CHECK(inside(headers[i].value, headers[i].value_len, buf, size));
            CHECK(memchr(headers[i].value, '\r', headers[i].value_len) == NULL);
            CHECK(memchr(headers[i].value, '\n', headers[i].value_len) == NULL);
        }
        if (head.minor_version == 1)
            CHECK(head.host != NULL);
        if (head.body_kind != TERN__BODY_LENGTH)
            CHECK(head.content_length == 0);
        const tern__http_header *te = tern__http_find_header(&head, "transfer-encoding");
        if (te != NULL)
            CHECK(head.body_kind == TERN__BODY_CHUNKED);
    } else if (r < 0) {
        CHECK(r == -400 || r == -414 || r == -431 || r == -417 || r == -501 || r == -505);
    } else {
        /* "Need more" only while no blank line has been seen and no limit hit. */
        CHECK(end_once == 0 && size <= lim.max_head);
    }

    /* The helpers on the same bytes. */
    size_t vlen;
    const char *v = tern__query_find(buf, size, "a", &vlen);
    if (v)
        CHECK(inside(v, vlen, buf, size));
    (void)tern__http_has_token(buf, size, "close");
    char *dec = malloc(size ? size : 1);
    ssize_t d = tern__url_decode(dec, size, buf, size, size & 1);
    CHECK(d < 0 || (size_t)d <= size);
    free(dec);
    free(buf);
    return 0;
}
