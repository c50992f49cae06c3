/* utf8.c - see utf8.h. */
#include "common/utf8.h"

#include <stdint.h>

/* Length of the well-formed sequence at p (1..4), or 0. */
static size_t sequence_length(const unsigned char *p)
{
    unsigned c = p[0];
    if (c < 0x80)
        return 1;
    size_t len;
    uint32_t cp, min;
    if ((c & 0xe0) == 0xc0)
        len = 2, cp = c & 0x1f, min = 0x80;
    else if ((c & 0xf0) == 0xe0)
        len = 3, cp = c & 0x0f, min = 0x800;
    else if ((c & 0xf8) == 0xf0)
        len = 4, cp = c & 0x07, min = 0x10000;
    else
        return 0;
    for (size_t k = 1; k < len; k++) {
        if ((p[k] & 0xc0) != 0x80) /* also stops at the terminating NUL */
            return 0;
        cp = cp << 6 | (p[k] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

void sw_utf8_repair(char *s)
{
    unsigned char *p = (unsigned char *)s;
    while (*p) {
        size_t len = sequence_length(p);
        if (len == 0)
            *p++ = '?';
        else
            p += len;
    }
}
