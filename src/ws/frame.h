/* WebSocket frame codec (RFC 6455 §5): header parsing and writing, masking.
 * Pure functions over byte buffers; the connection state machine lives in
 * src/ws/conn.c. */
#ifndef TERN_WS_FRAME_H
#define TERN_WS_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tern/loop.h"   /* TERN_MUST_CHECK */

enum {
    TERN__WS_OP_CONT = 0x0,
    TERN__WS_OP_TEXT = 0x1,
    TERN__WS_OP_BINARY = 0x2,
    TERN__WS_OP_CLOSE = 0x8,
    TERN__WS_OP_PING = 0x9,
    TERN__WS_OP_PONG = 0xA,
};

#define TERN__WS_MAX_HEADER 14   /* 2 + 8 (64-bit length) + 4 (mask key) */

typedef struct tern__ws_header {
    bool fin;
    bool rsv1;             /* "compressed" with permessage-deflate */
    uint8_t opcode;
    bool masked;
    uint8_t mask[4];
    uint64_t payload_len;
    uint8_t header_len;    /* bytes the header took: 2..14 */
} tern__ws_header;

/* Parses a frame header at buf[0..len).
 * Returns header_len (> 0) when complete, 0 when more bytes are needed, or
 * -1002 for a protocol error: an unknown opcode (3-7, 0xB-0xF), RSV2 or
 * RSV3 set, RSV1 set when not allow_rsv1 or on a control or continuation
 * frame (RFC 7692 §6: only a message's first frame carries it), a
 * control frame that is fragmented or whose length is over 125, a 64-bit
 * length with the top bit set, and, when require_mask (server side), an
 * unmasked frame. A non-minimal length encoding is accepted (RFC 6455
 * allows it); the limit on control frames is on the decoded length.
 * Without require_mask, masked and unmasked frames are both accepted: a
 * client must refuse h->masked itself.
 * An error is reported as soon as the bytes that show it are there, and
 * feeding a header byte by byte gives the same answer as all at once.
 * *h is written only when the header is complete. */
TERN_MUST_CHECK
int tern__ws_parse_header(const uint8_t *buf, size_t len, bool require_mask, bool allow_rsv1,
                          tern__ws_header *h);

/* Writes a frame header into out (TERN__WS_MAX_HEADER bytes of room) and
 * returns its length. mask is NULL for an unmasked (server) frame. */
size_t tern__ws_write_header(uint8_t *out, bool fin, bool rsv1, uint8_t opcode,
                             uint64_t payload_len, const uint8_t *mask);

/* XORs data[0..len) in place with the 4-byte key, starting at key phase
 * `phase` (the payload offset of data[0], mod 4; larger values are taken
 * mod 4), so a payload split across reads unmasks piece by piece. Any
 * alignment, any length. Several bytes at a time: AVX2 or SSE2 when the
 * CPU has them (chosen once, at the first call; thread-safe), 8 bytes at a
 * time otherwise. Returns the phase after the last byte, (phase + len) % 4. */
size_t tern__ws_mask(uint8_t *data, size_t len, const uint8_t key[4], size_t phase);

/* dst[0..len) = src[0..len) masked with key from phase 0: a client's
 * send copies its payload into the cork and masks it in the same pass,
 * 16 bytes at a time with unaligned loads and stores (SSE2), then 8, then
 * bytes. dst and src do not overlap. */
void tern__ws_mask_copy(uint8_t *dst, const uint8_t *src, size_t len, const uint8_t key[4]);

/* The length of the header tern__ws_write_header writes. */
static inline size_t tern__ws_header_len(uint64_t payload_len, bool masked) {
    return 2 + (payload_len > 125 ? (payload_len > 65535 ? 8 : 2) : 0) + (masked ? 4 : 0);
}

/* Is this close code one a peer may send (RFC 6455 §7.4, IANA registry):
 * 1000-1003, 1007-1014, 3000-4999? (1004-1006 and 1015 are reserved for
 * reporting, never sent; 1012-1014 were registered after RFC 6455.) */
bool tern__ws_close_code_valid(unsigned code);

#endif
