/* textbuf.c - see textbuf.h. */
#include "common/textbuf.h"

#include <string.h>

void sw_tb_init(sw_tb *t, char *buf, size_t cap)
{
    t->p = buf;
    t->len = 0;
    t->cap = cap;
    t->over = cap == 0;
    if (cap)
        buf[0] = 0;
}

void sw_tb_put(sw_tb *t, const char *s, size_t n)
{
    if (t->cap == 0)
        return;
    size_t room = t->cap - 1 - t->len;
    if (n > room) {
        n = room;
        t->over = true;
    }
    memcpy(t->p + t->len, s, n);
    t->len += n;
    t->p[t->len] = 0;
}

void sw_tb_str(sw_tb *t, const char *s)
{
    sw_tb_put(t, s, strlen(s));
}

void sw_tb_u64_pad(sw_tb *t, uint64_t v, int width)
{
    char d[24];
    int n = 0;
    do {
        d[sizeof d - 1 - n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n < width && n < 20)
        d[sizeof d - 1 - n++] = '0';
    sw_tb_put(t, d + sizeof d - n, (size_t)n);
}

void sw_tb_u64(sw_tb *t, uint64_t v)
{
    sw_tb_u64_pad(t, v, 0);
}

void sw_tb_i64(sw_tb *t, int64_t v)
{
    if (v < 0) {
        sw_tb_put(t, "-", 1);
        sw_tb_u64(t, (uint64_t)0 - (uint64_t)v); /* INT64_MIN too */
        return;
    }
    sw_tb_u64(t, (uint64_t)v);
}

void sw_tb_hex(sw_tb *t, uint64_t v)
{
    static const char digits[] = "0123456789abcdef";
    char d[16];
    int n = 0;
    do {
        d[sizeof d - 1 - n++] = digits[v & 15];
        v >>= 4;
    } while (v);
    sw_tb_put(t, d + sizeof d - n, (size_t)n);
}
