/* WebSocket frame headers (RFC 6455 §5.2) and close codes (§7.4). */
#include "ws/frame.h"

#include <string.h>

static bool opcode_known(uint8_t op) {
    return op <= TERN__WS_OP_BINARY || (op >= TERN__WS_OP_CLOSE && op <= TERN__WS_OP_PONG);
}

/* Every check looks only at bytes already present, so an error is reported
 * as soon as the bytes that show it have arrived, and a header that fails
 * on a prefix fails the same way on the whole: a caller may feed it piece
 * by piece or all at once and get the same answer. */
int tern__ws_parse_header(const uint8_t *buf, size_t len, bool require_mask, bool allow_rsv1,
                          tern__ws_header *h) {
    if (len < 1)
        return 0;
    uint8_t b0 = buf[0];
    bool fin = (b0 & 0x80) != 0;
    bool rsv1 = (b0 & 0x40) != 0;
    uint8_t opcode = b0 & 0x0F;
    bool control = (opcode & 0x08) != 0;

    if (b0 & 0x30)                   /* RSV2, RSV3: no extension of ours uses them */
        return -1002;
    if (!opcode_known(opcode))
        return -1002;
    if (control && !fin)             /* §5.5: control frames are never fragmented */
        return -1002;
    /* RFC 7692 §6: only the first frame of a data message carries RSV1. */
    if (rsv1 && (!allow_rsv1 || control || opcode == TERN__WS_OP_CONT))
        return -1002;

    if (len < 2)
        return 0;
    uint8_t b1 = buf[1];
    bool masked = (b1 & 0x80) != 0;
    uint8_t len7 = b1 & 0x7F;
    if (require_mask && !masked)     /* §5.1: a client masks every frame */
        return -1002;

    size_t ext = len7 == 126 ? 2 : len7 == 127 ? 8 : 0;
    size_t need = 2 + ext + (masked ? 4 : 0);
    uint64_t plen = len7;
    if (len7 == 127) {
        if (len < 3)
            return 0;
        if (buf[2] & 0x80)           /* §5.2: the most significant bit must be 0 */
            return -1002;
    }
    if (len < 2 + ext)
        return 0;
    if (ext) {
        plen = 0;
        for (size_t i = 0; i < ext; i++)
            plen = (plen << 8) | buf[2 + i];
    }
    /* The decoded length is what §5.5 limits: a non-minimal encoding of a
     * short control payload is as acceptable as it is for data frames. */
    if (control && plen > 125)
        return -1002;
    if (len < need)
        return 0;

    h->fin = fin;
    h->rsv1 = rsv1;
    h->opcode = opcode;
    h->masked = masked;
    if (masked)
        memcpy(h->mask, buf + 2 + ext, 4);
    else
        memset(h->mask, 0, 4);
    h->payload_len = plen;
    h->header_len = (uint8_t)need;
    return (int)need;
}

size_t tern__ws_write_header(uint8_t *out, bool fin, bool rsv1, uint8_t opcode,
                             uint64_t payload_len, const uint8_t *mask) {
    size_t n = 0;
    out[n++] = (uint8_t)((fin ? 0x80 : 0) | (rsv1 ? 0x40 : 0) | (opcode & 0x0F));
    uint8_t mbit = mask ? 0x80 : 0;
    if (payload_len <= 125) {
        out[n++] = (uint8_t)(mbit | payload_len);
    } else if (payload_len <= 0xFFFF) {
        out[n++] = (uint8_t)(mbit | 126);
        out[n++] = (uint8_t)(payload_len >> 8);
        out[n++] = (uint8_t)payload_len;
    } else {
        out[n++] = (uint8_t)(mbit | 127);
        for (int shift = 56; shift >= 0; shift -= 8)
            out[n++] = (uint8_t)(payload_len >> shift);
    }
    if (mask) {
        memcpy(out + n, mask, 4);
        n += 4;
    }
    return n;
}

/* 1004-1006 and 1015 are reserved for reporting and never go on the wire;
 * 1012-1014 were registered with IANA after RFC 6455 (service restart, try
 * again later, bad gateway) and the current Autobahn suite accepts them.
 * 0-999, 1016-2999 are unassigned, 3000-4999 belong to libraries and
 * applications. */
bool tern__ws_close_code_valid(unsigned code) {
    return (code >= 1000 && code <= 1003) || (code >= 1007 && code <= 1014) ||
           (code >= 3000 && code <= 4999);
}
