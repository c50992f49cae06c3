/* units.h - byte sizes as people write and read them ("512MiB", "1.5 GiB").
 *
 * The library needs the same size syntax as the command line (SPILLWAY_FAULT
 * takes alloc_fail_over:512MiB), but src/cli is not part of the library, so
 * the parser lives here. Binary suffixes (K, KiB, M, MiB, G, GiB, T, TiB) are
 * powers of 1024, decimal ones (KB, MB, GB, TB) powers of 1000; case does not
 * matter; no suffix or "B" means bytes.
 */
#ifndef SPILLWAY_COMMON_UNITS_H
#define SPILLWAY_COMMON_UNITS_H

#include <stddef.h>
#include <stdint.h>

/* Parses a whole string: digits, then an optional suffix, nothing else (no
 * sign, no spaces, no fraction). SW_OK, or SW_EINVAL (syntax) / SW_ERANGE
 * (does not fit in 64 bits); *out is written only on success. */
int sw_parse_bytes(const char *text, uint64_t *out);

/* Human-readable form with one decimal in the largest binary unit that keeps
 * the number >= 1 ("512 B", "1.5 KiB", "3.0 GiB"). Writes into buf (cap >=
 * SW_BYTES_STR_MAX is always enough) and returns buf. */
#define SW_BYTES_STR_MAX 24
char *sw_format_bytes(uint64_t bytes, char *buf, size_t cap);

#endif
