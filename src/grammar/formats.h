/* formats.h - JSON Schema `format` values as regular expressions
 * (regex.h), so that constrained decoding can enforce them like `pattern`.
 *
 * Each known format is an anchored ECMA-262 pattern that accepts only
 * valid values: exact where a regular language can be (dates with each
 * month's days and February 29 only in leap years, IPv4 without leading
 * zeros, IPv6 with every :: placement, URIs per the RFC 3986 ABNF), a
 * subset where it cannot; the narrowings are listed in formats.c and in
 * docs/internals/grammar.md. For any other name the answer is NULL: the
 * schema compiler refuses the formats JSON Schema defines that have no
 * pattern here (idn-hostname, uri-template, regex) and takes the rest as
 * annotations.
 */
#ifndef SPILLWAY_GRAMMAR_FORMATS_H
#define SPILLWAY_GRAMMAR_FORMATS_H

#include "common/error.h"

#include <stdint.h>

/* The pattern of a format's values, or NULL (not enforced). *max_chars
 * receives a bound on the value's length in code points that the format
 * adds (hostname: 253), INT32_MAX when none. */
const char *eng_format_pattern(const char *name, int32_t *max_chars);

/* The compiled automaton of a format's pattern, shared: compiled once per
 * process on first use (the formats' DFAs take milliseconds each, and the
 * router validates every tool call), kept until exit, read-only, any
 * thread. *out NULL (SW_OK) when the format has no pattern; an error only
 * when compiling fails (out of memory). */
struct eng_regex;
int eng_format_regex(const char *name, const struct eng_regex **out, int32_t *max_chars,
                     sw_error *err);

#endif
