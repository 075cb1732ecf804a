/* The value of one hexadecimal digit: the one reader of hex digits that
 * every layer shares (chunk sizes, %XX escapes, JSON's \uXXXX, session
 * ids and epochs). The loop is the bottom layer, so every module may use
 * it. */
#ifndef TERN_HEX_H
#define TERN_HEX_H

/* 0-15 for '0'-'9', 'a'-'f' and 'A'-'F'; -1 for any other byte. */
static inline int tern__hex_value(unsigned char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

#endif
