/* gbnf-print.h - writing GBNF text, shared by the files that print
 * grammars (gbnf_derive.c, json_schema_gbnf.c): a growing buffer and the
 * escaping of characters that both spillway's parser (gbnf.c) and
 * llama.cpp's read back as written. Private to src/grammar.
 */
#ifndef SPILLWAY_GRAMMAR_GBNF_PRINT_H
#define SPILLWAY_GRAMMAR_GBNF_PRINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The most a printed grammar may hold. */
#define ENG_GB_MAX_OUT ((size_t)8 << 20)

/* Zero-initialised; p (sw_free) holds the text, NUL-terminated. failed:
 * out of memory, or (too_long) past ENG_GB_MAX_OUT. */
typedef struct eng__gb_out {
    char *p;
    size_t len, cap;
    bool failed, too_long;
} eng__gb_out;

void eng__gb_put(eng__gb_out *o, const char *s, size_t n);
void eng__gb_str(eng__gb_out *o, const char *s);
/* One code point inside "..." or [...]. */
void eng__gb_char(eng__gb_out *o, uint32_t cp);

#endif
