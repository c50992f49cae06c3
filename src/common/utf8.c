/* utf8.c - see utf8.h. */
#include "common/utf8.h"

#include <stdint.h>
#include <string.h>

size_t sw_utf8_sequence(const char *s, size_t avail)
{
    const unsigned char *p = (const unsigned char *)s;
    if (avail == 0)
        return 0;
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
    if (len > avail)
        return 0;
    for (size_t k = 1; k < len; k++) {
        if ((p[k] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (p[k] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

void sw_utf8_repair(char *s)
{
    size_t left = strlen(s);
    while (left > 0) {
        size_t len = sw_utf8_sequence(s, left);
        if (len == 0)
            len = 1, *s = '?';
        s += len;
        left -= len;
    }
}

size_t sw_utf8_cut(const char *s, size_t len, size_t n)
{
    if (n >= len)
        return len;
    /* s[n], the first byte left out, must start a character */
    while (n > 0 && ((unsigned char)s[n] & 0xc0) == 0x80)
        n--;
    return n;
}
