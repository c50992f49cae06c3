/* gbnf_print.c - writing GBNF text (gbnf-print.h). */
#include "grammar/gbnf-print.h"

#include "common/alloc.h"

#include <stdio.h>
#include <string.h>

void eng__gb_put(eng__gb_out *o, const char *s, size_t n)
{
    if (o->failed)
        return;
    if (o->len + n + 1 > o->cap) {
        size_t c = o->cap ? o->cap : 256;
        while (c < o->len + n + 1)
            c *= 2;
        o->too_long = c > ENG_GB_MAX_OUT;
        char *q = o->too_long ? NULL : sw_realloc(o->p, c);
        if (!q) {
            o->failed = true;
            return;
        }
        o->p = q;
        o->cap = c;
    }
    memcpy(o->p + o->len, s, n);
    o->len += n;
    o->p[o->len] = 0;
}

void eng__gb_str(eng__gb_out *o, const char *s)
{
    eng__gb_put(o, s, strlen(s));
}

/* A code point inside "..." or [...]: printable ASCII other than the
 * quoting characters as itself, the rest of ASCII as \xHH (the escapes
 * both spillway's and llama.cpp's parsers read), others as UTF-8. */
void eng__gb_char(eng__gb_out *o, uint32_t cp)
{
    char b[8];
    if (cp < 0x80) {
        if (cp >= 0x20 && cp < 0x7F && !strchr("\"\\[]-^", (int)cp)) {
            b[0] = (char)cp;
            eng__gb_put(o, b, 1);
        } else {
            snprintf(b, sizeof b, "\\x%02X", (unsigned)cp);
            eng__gb_str(o, b);
        }
        return;
    }
    size_t n;
    if (cp < 0x800) {
        b[0] = (char)(0xC0 | cp >> 6);
        n = 1;
    } else if (cp < 0x10000) {
        b[0] = (char)(0xE0 | cp >> 12);
        b[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        n = 2;
    } else {
        b[0] = (char)(0xF0 | cp >> 18);
        b[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        b[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        n = 3;
    }
    b[n] = (char)(0x80 | (cp & 0x3F));
    eng__gb_put(o, b, n + 1);
}

