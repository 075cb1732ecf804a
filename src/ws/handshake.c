/* The server side of the opening handshake (RFC 6455 §4.2.1, §4.2.2). */
#include "ws/handshake.h"

#include <string.h>

#include "net/crypto.h"

#define WS_GUID "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

static bool is_base64_char(char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
           c == '+' || c == '/';
}

/* 16 bytes are 128 bits: 21 full base64 digits, a 22nd carrying the last
 * 2 bits, then "==". The 4 unused bits of the 22nd digit are not checked
 * to be zero: common decoders ignore them, and the key is only ever hashed
 * as text, never decoded. */
bool tern__ws_key_valid(const char *key, size_t len) {
    if (key == NULL || len != 24 || key[22] != '=' || key[23] != '=')
        return false;
    for (size_t i = 0; i < 22; i++)
        if (!is_base64_char(key[i]))
            return false;
    return true;
}

/* On the one failure the library may have here (no memory), out is the
 * empty string: the client then refuses the handshake, which is the
 * honest outcome, and the interface stays void. */
void tern__ws_accept(const char *key, size_t len, char out[TERN__WS_ACCEPT_LEN + 1]) {
    uint8_t md[TERN__SHA1_LEN];
    out[0] = '\0';
    if (tern__crypto_sha1(key, len, WS_GUID, sizeof(WS_GUID) - 1, md) == 0)
        tern__crypto_base64(md, sizeof(md), out);   /* 28 chars and a NUL */
}

static bool is_ows(char c) { return c == ' ' || c == '\t'; }

/* The header is a comma-separated list (RFC 9110 §5.6.1): elements are
 * trimmed of optional whitespace, empty ones are skipped, and names are
 * compared exactly (RFC 6455 §11.5: subprotocol names are case-sensitive). */
int tern__ws_pick_subprotocol(const char *offer, size_t len, const char *const *supported) {
    if (offer == NULL || supported == NULL)
        return -1;
    size_t pos = 0;
    while (pos < len) {
        size_t start = pos;
        while (pos < len && offer[pos] != ',')
            pos++;
        size_t end = pos;
        pos++;   /* past the comma (or the end) */
        while (start < end && is_ows(offer[start]))
            start++;
        while (end > start && is_ows(offer[end - 1]))
            end--;
        if (start == end)
            continue;
        for (int i = 0; supported[i] != NULL; i++) {
            if (strlen(supported[i]) == end - start &&
                memcmp(supported[i], offer + start, end - start) == 0)
                return i;
        }
    }
    return -1;
}
