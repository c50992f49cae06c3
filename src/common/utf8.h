/* utf8.h - keeping text we send valid UTF-8.
 *
 * Error messages quote what a client or a peer sent ("'%.32s' is not a
 * token id"), cut to a length in bytes, and a cut can fall inside a
 * character; JSON encoders (jansson) refuse such a string outright, and
 * an error response that cannot be built is no response at all. The same
 * goes for any text cut to fit a buffer. */
#ifndef SPILLWAY_COMMON_UTF8_H
#define SPILLWAY_COMMON_UTF8_H

#include <stddef.h>

/* Length (1..4) of the well-formed UTF-8 sequence at p, which has avail
 * bytes (RFC 3629: no overlongs, no surrogates, at most U+10FFFF; a NUL
 * byte counts as a character), or 0 when there is none. */
size_t sw_utf8_sequence(const char *p, size_t avail);

/* Replaces, in place, every byte that is not part of a well-formed UTF-8
 * sequence (RFC 3629: no overlongs, no surrogates, at most U+10FFFF) with
 * '?'. The length does not change. */
void sw_utf8_repair(char *s);

/* Where to cut s (len bytes) to keep at most n bytes without splitting a
 * character: n, stepped back over continuation bytes, or len when n >= len. */
size_t sw_utf8_cut(const char *s, size_t len, size_t n);

#endif
