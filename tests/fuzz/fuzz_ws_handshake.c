/* The opening handshake on arbitrary header values: key validation and
 * Sec-WebSocket-Accept, the subprotocol pick, and permessage-deflate
 * negotiation, whose answer must itself read as an acceptable offer that
 * agrees to the same thing.
 *
 * Input: an options byte (the server's deflate settings and the room for
 * the answer), then three header values separated by '\n': the key, the
 * extensions, the subprotocols. */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ws/deflate.h"
#include "ws/handshake.h"

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond))                                                                               \
            abort();                                                                               \
    } while (0)

/* The next '\n'-separated part, copied to an allocation of its own size. */
static char *next_part(const uint8_t **p, size_t *n, size_t *len) {
    const uint8_t *nl = memchr(*p, '\n', *n);
    *len = nl ? (size_t)(nl - *p) : *n;
    char *s = malloc(*len ? *len : 1);
    memcpy(s, *p, *len);
    *p += *len + (nl ? 1 : 0);
    *n -= *len + (nl ? 1 : 0);
    return s;
}

static bool is_b64(char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
           c == '+' || c == '/';
}

static const char *const protocols[] = {"chat", "superchat", "v2.json", "a", NULL};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    uint8_t opt = data[0];
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    size_t klen, elen, slen;
    char *key = next_part(&p, &n, &klen);
    char *ext = next_part(&p, &n, &elen);
    char *sub = next_part(&p, &n, &slen);

    /* Key and accept. */
    bool valid = tern__ws_key_valid(key, klen);
    if (valid) {
        CHECK(klen == 24 && key[22] == '=' && key[23] == '=');
        for (size_t i = 0; i < 22; i++)
            CHECK(is_b64(key[i]));
    }
    char acc[TERN__WS_ACCEPT_LEN + 1];
    tern__ws_accept(key, klen, acc);
    CHECK(strlen(acc) == TERN__WS_ACCEPT_LEN && acc[27] == '=');
    for (size_t i = 0; i < 27; i++)
        CHECK(is_b64(acc[i]));

    /* Subprotocol: an index into the list, naming an element of the offer. */
    int pick = tern__ws_pick_subprotocol(sub, slen, protocols);
    CHECK(pick >= -1 && pick < 4);
    if (pick >= 0) {
        size_t pl = strlen(protocols[pick]);
        bool found = false;
        for (size_t i = 0; i + pl <= slen && !found; i++) {
            if (memcmp(sub + i, protocols[pick], pl) != 0)
                continue;
            size_t a = i, b = i + pl;
            while (a > 0 && (sub[a - 1] == ' ' || sub[a - 1] == '\t'))
                a--;
            while (b < slen && (sub[b] == ' ' || sub[b] == '\t'))
                b++;
            found = (a == 0 || sub[a - 1] == ',') && (b == slen || sub[b] == ',');
        }
        CHECK(found);
    }

    /* permessage-deflate. */
    static const int bits_opt[] = {0, 8, 9, 10, 11, 12, 14, 15};
    tern__pmd_config cfg = {
        .enabled = true,
        .server_no_context_takeover = opt & 1,
        .client_no_context_takeover = opt & 2,
        .server_max_window_bits = bits_opt[(opt >> 2) & 7],
    };
    size_t cap = (opt & 0x20) ? (size_t)(opt >> 6) * 24 : 160;
    char *resp = malloc(cap ? cap : 1);
    tern__pmd_params prm;
    int r = tern__pmd_negotiate(ext, elen, &cfg, &prm, resp, cap);
    CHECK(r == 1 || r == 0 || r == -ENOSPC);
    if (r == 1) {
        size_t rl = strlen(resp);
        CHECK(rl < cap && strncmp(resp, "permessage-deflate", 18) == 0);
        int ours = cfg.server_max_window_bits ? cfg.server_max_window_bits : 15;
        CHECK(prm.server_max_window_bits >= 8 && prm.server_max_window_bits <= ours);
        CHECK(prm.client_max_window_bits >= 8 && prm.client_max_window_bits <= 15);
        CHECK(!cfg.server_no_context_takeover || prm.server_no_context_takeover);
        CHECK(!cfg.client_no_context_takeover || prm.client_no_context_takeover);
        /* Read back as an offer: accepted, the same answer, the same terms. */
        char *again = malloc(rl ? rl : 1);
        memcpy(again, resp, rl);
        char resp2[160];
        tern__pmd_params prm2;
        CHECK(tern__pmd_negotiate(again, rl, &cfg, &prm2, resp2, sizeof(resp2)) == 1);
        CHECK(strcmp(resp, resp2) == 0);
        CHECK(memcmp(&prm, &prm2, sizeof(prm)) == 0);
        free(again);
        /* The agreed terms work: a message each way. */
        tern__pmd_deflater *d = tern__pmd_deflater_new(prm.server_max_window_bits, 0);
        tern__pmd_inflater *inf = tern__pmd_inflater_new(prm.server_max_window_bits);
        uint8_t *z;
        ssize_t zn = tern__pmd_deflate(d, (const uint8_t *)ext, elen,
                                       prm.server_no_context_takeover, &z);
        CHECK(zn > 0);
        tern__bytes out = {0};
        CHECK(tern__pmd_inflate(inf, z, (size_t)zn, true, prm.server_no_context_takeover, &out,
                                elen) == 0);
        CHECK(out.len == elen && (elen == 0 || memcmp(out.data, ext, elen) == 0));
        tern__bytes_free(&out);
        free(z);
        tern__pmd_deflater_free(d);
        tern__pmd_inflater_free(inf);
    } else if (r == -ENOSPC) {
        /* Only for lack of room: with enough, it is accepted. */
        char big[160];
        tern__pmd_params prm2;
        CHECK(tern__pmd_negotiate(ext, elen, &cfg, &prm2, big, sizeof(big)) == 1);
        CHECK(strlen(big) + 1 > cap);
    }
    free(resp);
    free(key);
    free(ext);
    free(sub);
    return 0;
}
