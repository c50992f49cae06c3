/* unicode_tables.h - code point ranges of the Unicode categories that the
 * byte-level BPE pre-tokenizers need (\p{L}, \p{N}). The data is generated
 * once by scripts/gen_unicode_tables.py into unicode_tables.c, so the build
 * needs neither Python nor ICU. Lookups live with their only user,
 * tokenizer_bpe.c.
 */
#ifndef SPILLWAY_TEXT_UNICODE_TABLES_H
#define SPILLWAY_TEXT_UNICODE_TABLES_H

#include <stddef.h>
#include <stdint.h>

typedef struct eng_unicode_range {
    uint32_t first, last; /* inclusive */
} eng_unicode_range;

/* Sorted, non-overlapping. */
extern const eng_unicode_range eng_unicode_letters[]; /* L: Lu Ll Lt Lm Lo */
extern const size_t eng_unicode_letters_count;
extern const eng_unicode_range eng_unicode_numbers[]; /* N: Nd Nl No */
extern const size_t eng_unicode_numbers_count;

#endif
