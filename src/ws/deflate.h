/* permessage-deflate (RFC 7692) on zlib: negotiation and the per-message
 * compressor and decompressor. No global state: each deflater and
 * inflater belongs to one connection (one thread at a time). */
#ifndef TERN_WS_DEFLATE_H
#define TERN_WS_DEFLATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "tern/loop.h"   /* TERN_MUST_CHECK */

#include "loop/bytes.h"

/* What the server is willing to do (from tern_ws_options). */
typedef struct tern__pmd_config {
    bool enabled;
    bool server_no_context_takeover;  /* force it even when the client did not ask */
    bool client_no_context_takeover;  /* ask the client for it */
    int server_max_window_bits;       /* 8..15; 0 means 15 */
    int mem_level;                    /* zlib memLevel 1..9; 0 means 8 */
} tern__pmd_config;

/* What was agreed for one connection. */
typedef struct tern__pmd_params {
    bool server_no_context_takeover;
    bool client_no_context_takeover;
    int server_max_window_bits;       /* our deflate window: 8..15 (zlib 8 is used as 9) */
    int client_max_window_bits;       /* the client's window, for our inflater: 15 unless
                                         the client's offer named a value (then echoed) */
} tern__pmd_params;

/* Reads the client's Sec-WebSocket-Extensions header (possibly several
 * offers, comma-separated, each with ';' parameters) and accepts the first
 * permessage-deflate offer that is valid and compatible with cfg. Writes
 * the response extension value (NUL-terminated) into resp, e.g.
 * "permessage-deflate; server_no_context_takeover; client_max_window_bits=10".
 * Returns 1 when accepted, 0 when no acceptable offer (no extension is
 * used; offers with unknown, repeated or malformed parameters are declined,
 * as RFC 7692 §5 asks, and the next offer is tried), -ENOSPC when resp is
 * too small (the longest answer is under 130 bytes). *out is written only
 * on 1; resp is "" otherwise. Names are compared without case; a value
 * may be quoted. cfg->mem_level plays no part here: it is for the
 * deflater. */
TERN_MUST_CHECK
int tern__pmd_negotiate(const char *offer, size_t len, const tern__pmd_config *cfg,
                        tern__pmd_params *out, char *resp, size_t resp_cap);

/* The client's side of the negotiation. tern__pmd_client_offer writes
 * the offer for cfg into buf (NUL-terminated): permessage-deflate with
 * client_max_window_bits (the server may limit our window), and
 * client_no_context_takeover, server_no_context_takeover and
 * server_max_window_bits (when 9..14) as cfg asks. Returns its length or
 * -ENOSPC. tern__pmd_client_accept reads the server's answer to that
 * offer: 1 and *out (in the RFC's terms) when it is one valid
 * permessage-deflate response that fits the offer; -EPROTO when the
 * client must fail the connection (RFC 7692 §5: a malformed answer,
 * another extension, an unknown or repeated parameter, a server window
 * over the one asked for, a client window without a value). */
TERN_MUST_CHECK
int tern__pmd_client_offer(const tern__pmd_config *cfg, char *buf, size_t cap);
TERN_MUST_CHECK
int tern__pmd_client_accept(const char *resp, size_t len, const tern__pmd_config *cfg,
                            tern__pmd_params *out);

/* One direction of compression state, created when a connection first
 * compresses or decompresses a message. The object itself is small (a
 * z_stream); zlib's memory (about 256 KiB to deflate at 15 bits and memory
 * level 8, 39 KiB to inflate) is taken at the start of a message and given
 * back after it when the message was no_context_takeover, so a connection
 * that keeps no context holds no zlib memory while idle. */
typedef struct tern__pmd_deflater tern__pmd_deflater;
typedef struct tern__pmd_inflater tern__pmd_inflater;

/* window_bits 8..15 (0 means 15; others are clamped); 8 is compressed
 * with zlib's 9, which zlib keeps within 250 bytes of distance, so it
 * suits a peer that agreed to 8. mem_level 1..9, 0 means 8. NULL when out
 * of memory. Freeing NULL does nothing. */
tern__pmd_deflater *tern__pmd_deflater_new(int window_bits, int mem_level);
void tern__pmd_deflater_free(tern__pmd_deflater *d);
/* Compresses one whole message; the result (without the trailing
 * 00 00 FF FF, as §7.2.1 says; an empty message gives the one byte 00) is
 * returned in *out, a malloc'd buffer the caller releases with free().
 * When no_context_takeover, the next message starts afresh. A message
 * compressed with no_context_takeover stands alone, so it may be sent to
 * any peer whose agreed server_max_window_bits is at least this window.
 * Returns the length (> 0), or -ENOMEM (or -EIO if zlib ever broke its
 * contract); on error *out is NULL and the stream starts afresh. */
ssize_t tern__pmd_deflate(tern__pmd_deflater *d, const uint8_t *in, size_t len,
                          bool no_context_takeover, uint8_t **out);

/* window_bits: the client's agreed window (8..15, 0 means 15). NULL when
 * out of memory. Freeing NULL does nothing. */
tern__pmd_inflater *tern__pmd_inflater_new(int window_bits);
void tern__pmd_inflater_free(tern__pmd_inflater *i);
/* Decompresses one fragment of a compressed message, appending the output
 * to *out (grown as needed, never past max_len + 1 bytes; the caller frees
 * it with tern__bytes_free, also after an error). When last is set,
 * the 00 00 FF FF tail is fed too, the message must end between deflate
 * blocks, and the stream starts afresh afterwards if no_context_takeover.
 * max_len bounds out->len, bytes already in the buffer included, and is
 * enforced while inflating, so a bomb costs no more than max_len + 1 bytes.
 * Returns 0, -EMSGSIZE once out->len would pass max_len (the caller closes
 * with 1009), -EINVAL on corrupt or truncated data (the caller closes with
 * 1007), or -ENOMEM. After an error the output is partial and the stream
 * starts afresh; the connection is expected to close. A zero-length
 * non-last fragment is a no-op. */
TERN_MUST_CHECK
int tern__pmd_inflate(tern__pmd_inflater *i, const uint8_t *in, size_t len, bool last,
                      bool no_context_takeover, tern__bytes *out, size_t max_len);

#endif
