/* textbuf.h - appending text to a caller's fixed buffer without printf.
 *
 * For the paths that run for every request (HTTP heads, log lines), where
 * snprintf's format parsing was a quarter of the router's instructions.
 * Running out of room is sticky: the text stays NUL-terminated and cut,
 * and sw_tb_ok says whether all of it fit.
 */
#ifndef SPILLWAY_COMMON_TEXTBUF_H
#define SPILLWAY_COMMON_TEXTBUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct sw_tb {
    char *p;
    size_t len, cap; /* cap includes the terminating NUL */
    bool over;       /* something did not fit */
} sw_tb;

/* buf of cap >= 1 bytes, empty. */
void sw_tb_init(sw_tb *t, char *buf, size_t cap);
void sw_tb_put(sw_tb *t, const char *s, size_t n);
void sw_tb_str(sw_tb *t, const char *s);
void sw_tb_u64(sw_tb *t, uint64_t v);
void sw_tb_i64(sw_tb *t, int64_t v);
/* v in decimal with leading zeros to at least width digits (width <= 20). */
void sw_tb_u64_pad(sw_tb *t, uint64_t v, int width);
/* v in lower-case hexadecimal, no prefix. */
void sw_tb_hex(sw_tb *t, uint64_t v);
/* A string literal, its length from sizeof. */
#define SW_TB_LIT(t, lit) sw_tb_put((t), "" lit, sizeof(lit) - 1)
static inline bool sw_tb_ok(const sw_tb *t) { return !t->over; }

#endif
