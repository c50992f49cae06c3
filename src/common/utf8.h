/* utf8.h - keeping text we send valid UTF-8.
 *
 * Error messages quote what a client or a peer sent ("'%.32s' is not a
 * token id"), cut to a length in bytes, and a cut can fall inside a
 * character; JSON encoders (jansson) refuse such a string outright, and
 * an error response that cannot be built is no response at all. */
#ifndef SPILLWAY_COMMON_UTF8_H
#define SPILLWAY_COMMON_UTF8_H

#include <stddef.h>

/* Replaces, in place, every byte that is not part of a well-formed UTF-8
 * sequence (RFC 3629: no overlongs, no surrogates, at most U+10FFFF) with
 * '?'. The length does not change. */
void sw_utf8_repair(char *s);

#endif
