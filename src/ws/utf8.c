/* UTF-8 validation as a finite automaton (after Bjoern Hoehrmann's "Flexible
 * and Economical UTF-8 Decoder"): each byte maps to a class, and the class
 * moves the state. The state between calls is all there is to remember, so
 * a code point may be split across frames and reads at any byte.
 *
 * The classes and states below are spelled out from RFC 3629 §4 rather
 * than copied as opaque numbers, so each row can be checked against it:
 *
 *   U+0000..U+007F     00..7F
 *   U+0080..U+07FF     C2..DF  80..BF
 *   U+0800..U+0FFF     E0      A0..BF  80..BF     (E0 80..9F: overlong)
 *   U+1000..U+CFFF     E1..EC  80..BF  80..BF
 *   U+D000..U+D7FF     ED      80..9F  80..BF     (ED A0..BF: surrogates)
 *   U+E000..U+FFFF     EE..EF  80..BF  80..BF
 *   U+10000..U+3FFFF   F0      90..BF  80..BF  80..BF  (F0 80..8F: overlong)
 *   U+40000..U+FFFFF   F1..F3  80..BF  80..BF  80..BF
 *   U+100000..U+10FFFF F4      80..8F  80..BF  80..BF  (above: too big)
 *
 * C0, C1 (overlong two-byte forms) and F5..FF never appear.
 *
 * The transitions are stored as a "shift DFA": for each byte class one
 * 64-bit word holds the next state for every current state, 6 bits each,
 * and a state is the bit offset of its own field. A step is then a load
 * that does not depend on the state and a shift that does, so the chain
 * from one byte to the next is a cycle or two instead of a table lookup
 * indexed by the state (two to three times the speed on non-ASCII text). */
#include "ws/utf8.h"

#include <string.h>

enum {
    C_ASCII,    /* 00..7F */
    C_80_8F,    /* continuation, low */
    C_90_9F,    /* continuation, middle */
    C_A0_BF,    /* continuation, high */
    C_BAD,      /* C0, C1, F5..FF */
    C_LEAD2,    /* C2..DF */
    C_E0,
    C_LEAD3,    /* E1..EC, EE, EF */
    C_ED,
    C_F0,
    C_LEAD4,    /* F1..F3 */
    C_F4,
    N_CLASSES
};

/* The states, numbered 0..8; what the automaton carries is 6 times that
 * (the offset of the state's field in a row). ACCEPT is 0 either way. */
enum {
    S_ACCEPT,
    S_REJECT,
    S_NEED1,    /* one more continuation byte, any */
    S_NEED2,    /* two more, any */
    S_NEED3,    /* three more, any */
    S_E0,       /* after E0: A0..BF, then one more */
    S_ED,       /* after ED: 80..9F, then one more */
    S_F0,       /* after F0: 90..BF, then two more */
    S_F4,       /* after F4: 80..8F, then two more */
    N_STATES
};

#define OFF(st) ((uint64_t)(st) * 6)
#define OFF_ACCEPT OFF(S_ACCEPT)
#define OFF_REJECT OFF(S_REJECT)

_Static_assert(OFF_ACCEPT == TERN__UTF8_ACCEPT, "the start state is 0 inside and out");
_Static_assert(OFF(N_STATES) <= 64, "every state's field fits in a row");

/* The numbers below are the C_ classes in order: C_ASCII is 0, C_F4 is 11. */
_Static_assert(C_ASCII == 0 && C_80_8F == 1 && C_A0_BF == 3 && C_BAD == 4 && C_LEAD2 == 5 &&
                   C_E0 == 6 && C_LEAD3 == 7 && C_ED == 8 && C_F0 == 9 && C_LEAD4 == 10 && C_F4 == 11,
               "byte_class is written in these numbers");
static const uint8_t byte_class[256] = {
    /* 00..7F */
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    /* 80..8F */
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    /* 90..9F */
    2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
    /* A0..BF */
    3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3,
    3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3,
    /* C0, C1 bad; C2..DF lead two */
    4, 4, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5,
    5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5,
    /* E0; E1..EC; ED; EE, EF */
    6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 7,
    /* F0; F1..F3; F4; F5..FF bad */
    9, 10, 10, 10, 11, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4,
};

/* ROW(next state from ACCEPT, from REJECT, from NEED1, ...): the row of a
 * byte class, one column per current state. */
#define ROW(acc, rej, n1, n2, n3, e0, ed, f0, f4)                                               \
    (OFF(acc) << OFF(S_ACCEPT) | OFF(rej) << OFF(S_REJECT) | OFF(n1) << OFF(S_NEED1) |           \
     OFF(n2) << OFF(S_NEED2) | OFF(n3) << OFF(S_NEED3) | OFF(e0) << OFF(S_E0) |                   \
     OFF(ed) << OFF(S_ED) | OFF(f0) << OFF(S_F0) | OFF(f4) << OFF(S_F4))

#define A S_ACCEPT
#define R S_REJECT
static const uint64_t class_row[N_CLASSES] = {
    /*        from: ACCEPT   REJECT NEED1    NEED2    NEED3    E0       ED       F0       F4 */
    [C_ASCII] = ROW(A,       R,     R,       R,       R,       R,       R,       R,       R),
    [C_80_8F] = ROW(R,       R,     A,       S_NEED1, S_NEED2, R,       S_NEED1, R,       S_NEED2),
    [C_90_9F] = ROW(R,       R,     A,       S_NEED1, S_NEED2, R,       S_NEED1, S_NEED2, R),
    [C_A0_BF] = ROW(R,       R,     A,       S_NEED1, S_NEED2, S_NEED1, R,       S_NEED2, R),
    [C_BAD]   = ROW(R,       R,     R,       R,       R,       R,       R,       R,       R),
    [C_LEAD2] = ROW(S_NEED1, R,     R,       R,       R,       R,       R,       R,       R),
    [C_E0]    = ROW(S_E0,    R,     R,       R,       R,       R,       R,       R,       R),
    [C_LEAD3] = ROW(S_NEED2, R,     R,       R,       R,       R,       R,       R,       R),
    [C_ED]    = ROW(S_ED,    R,     R,       R,       R,       R,       R,       R,       R),
    [C_F0]    = ROW(S_F0,    R,     R,       R,       R,       R,       R,       R,       R),
    [C_LEAD4] = ROW(S_NEED3, R,     R,       R,       R,       R,       R,       R,       R),
    [C_F4]    = ROW(S_F4,    R,     R,       R,       R,       R,       R,       R,       R),
};
#undef A
#undef R

#define HIGH_BITS 0x8080808080808080ull

/* The header's REJECT is 1, which is no field offset: it is translated at
 * the door. Any other value is an offset this file handed out. */
static uint64_t state_in(uint32_t ext) {
    if (ext == TERN__UTF8_REJECT || ext % 6 != 0 || ext >= OFF(N_STATES))
        return OFF_REJECT;   /* REJECT, or not a state this file made: refuse it */
    return ext;
}

static uint32_t state_out(uint64_t s) { return s == OFF_REJECT ? TERN__UTF8_REJECT : (uint32_t)s; }

bool tern__utf8_feed(uint32_t *state, const uint8_t *data, size_t len) {
    uint64_t s = state_in(*state);
    size_t i = 0;
    while (i < len && s != OFF_REJECT) {
        /* Between code points, whole words of ASCII need no automaton. */
        if (s == OFF_ACCEPT) {
            while (len - i >= 16) {
                uint64_t a, b;
                memcpy(&a, data + i, 8);
                memcpy(&b, data + i + 8, 8);
                if ((a | b) & HIGH_BITS)
                    break;
                i += 16;
            }
            if (len - i >= 8) {
                uint64_t a;
                memcpy(&a, data + i, 8);
                if ((a & HIGH_BITS) == 0)
                    i += 8;
            }
            if (i == len)
                break;
        }
        /* Then 16 bytes (or what is left) through the automaton before
         * trying the word check again, so text that is mostly multi-byte
         * does not pay for a failed check at every code point. REJECT
         * is sticky, so it is enough to look for it once per block. */
        size_t end = len - i > 16 ? i + 16 : len;
        for (; i < end; i++)
            s = (class_row[byte_class[data[i]]] >> s) & 63;
    }
    *state = state_out(s);
    return s != OFF_REJECT;
}

bool tern__utf8_valid(const uint8_t *data, size_t len) {
    uint32_t s = TERN__UTF8_ACCEPT;
    return tern__utf8_feed(&s, data, len) && tern__utf8_complete(s);
}
