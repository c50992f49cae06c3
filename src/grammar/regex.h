/* regex.h - ECMA-262 regular expressions (as JSON Schema's `pattern` and
 * `format` use them) compiled into a deterministic automaton over the UTF-8
 * bytes of a string.
 *
 * Why a DFA over bytes: constrained decoding (constrain.c) feeds a string's
 * content one byte at a time and must know, after every byte, whether a
 * match is still reachable; a DFA answers that with one table lookup, and
 * the liveness is precomputed so generation never walks into a dead end.
 *
 * Semantics are JSON Schema's: a pattern is NOT anchored; it matches when
 * it matches somewhere in the string ("a" matches "xay"), unless ^ or $
 * anchor it to the ends of the string (no multiline mode, no flags).
 * Characters are Unicode code points (ECMA-262's "u" mode): `.` and
 * negated classes match whole code points, and the automaton accepts only
 * well-formed UTF-8 (RFC 3629: no surrogates, no overlong forms).
 *
 * Supported: literals; `.` (anything but \n \r U+2028 U+2029); classes
 * and ranges, negated ones, code points beyond ASCII; \d \w \s \D \W \S;
 * \p{L} \p{Letter} \p{N} \p{Number} and their \P negations (the tables of
 * unicode_tables.h); escapes \t \n \v \f \r \0 \cX \xHH \uHHHH (surrogate
 * pairs combined) \u{H..} and identity escapes of punctuation (\/ \. ...);
 * quantifiers * + ? {m} {m,} {m,n} (lazy ones are greedy: a DFA decides
 * whether a string matches, not which part); groups ( ), (?: ), (?<name> );
 * alternation; ^ and $ (at the ends of the string); lookahead (?= ) and
 * (?! ), ^ inside them included (regex_look.c: a product of what follows with
 * the lookahead's own automaton).
 * Refused with SW_EUNSUPPORTED: backreferences (\1, \k<name>),
 * lookbehind, a lookahead inside an unbounded repetition (* + {m,}) whose
 * verdict depends on the loop, \b \B, other \p properties, lone
 * surrogates.
 * SW_EINVAL: a malformed pattern. SW_ERANGE: a pattern whose automaton
 * would pass ENG_REGEX_MAX_STATES states, or whose construction passes a
 * fixed work bound (a hostile `(a|b)*a(a|b){20}` fails in milliseconds).
 */
#ifndef SPILLWAY_GRAMMAR_REGEX_H
#define SPILLWAY_GRAMMAR_REGEX_H

#include "common/error.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* States of one DFA, and of the Thompson NFA it is built from. The fuzz
 * build (SPILLWAY_FUZZ) defines smaller caps on the command line
 * (CMakeLists.txt): a compile's cost grows with the states. */
#ifndef ENG_REGEX_MAX_STATES
#define ENG_REGEX_MAX_STATES 8192
#endif
#ifndef ENG_REGEX_MAX_NFA_STATES
#define ENG_REGEX_MAX_NFA_STATES 200000
#endif
/* The state step() returns for a byte after which no match is reachable. */
#define ENG_REGEX_DEAD (-1)

/* Immutable once compiled: any thread may read it. */
typedef struct eng_regex eng_regex;

int eng_regex_compile(const char *pattern, size_t len, eng_regex **out, sw_error *err);
/* Releases one reference: the automaton is freed with the last. */
void eng_regex_free(eng_regex *re);
/* One more reference to re (released by eng_regex_free); re itself. */
eng_regex *eng_regex_ref(eng_regex *re);

/* eng_regex_compile through the process's cache of compiled patterns
 * (regex_cache.c): *out may be shared with other holders (it is
 * immutable), and a refusal other than SW_ENOMEM is remembered with its
 * message, so the same pattern is refused again without the work. */
int eng_regex_compile_cached(const char *pattern, size_t len, eng_regex **out, sw_error *err);
/* Empties the cache (tests; the allocation-failure sweep). */
void eng_regex_cache_clear(void);

/* What the cache holds and has done since the process started. */
typedef struct eng_regex_cache_stats {
    uint64_t hits, misses; /* lookups: found, compiled */
    uint64_t evictions;
    size_t entries, bytes; /* held now: patterns, and their bytes */
    size_t max_entries, max_bytes;
} eng_regex_cache_stats;
void eng_regex_cache_stats_get(eng_regex_cache_stats *out);
/* Bounds the cache (at most ENG_REGEX_CACHE_ENTRIES entries; 0 keeps a
 * bound as it is), evicting at once what no longer fits; tests. The
 * defaults: ENG_REGEX_CACHE_ENTRIES patterns, ENG_REGEX_CACHE_BYTES. */
#ifndef ENG_REGEX_CACHE_ENTRIES /* the fuzz build holds more (CMakeLists.txt) */
#define ENG_REGEX_CACHE_ENTRIES 1024
#endif
#ifndef ENG_REGEX_CACHE_BYTES
#define ENG_REGEX_CACHE_BYTES ((size_t)32 << 20)
#endif
void eng_regex_cache_limit(size_t max_entries, size_t max_bytes);

int32_t eng_regex_start(const eng_regex *re);
/* The state after one more byte, or ENG_REGEX_DEAD when no string with
 * this prefix matches. Every state step() returns can still reach a
 * match. state must not be ENG_REGEX_DEAD. */
int32_t eng_regex_step(const eng_regex *re, int32_t state, uint8_t byte);
/* The bytes so far match. */
bool eng_regex_accepting(const eng_regex *re, int32_t state);
/* A match is reachable from state (false only for the start state of a
 * pattern that matches nothing, such as "[]" or "a^"). */
bool eng_regex_can_accept(const eng_regex *re, int32_t state);
/* UTF-8 continuation bytes the state still expects (0: between code
 * points). */
int eng_regex_pending(const eng_regex *re, int32_t state);
/* Matched for good: every well-formed UTF-8 continuation matches (a
 * pattern that is not anchored at the end, once it has matched). The
 * constraint decides plain tokens by their length alone there. */
bool eng_regex_universal(const eng_regex *re, int32_t state);
int32_t eng_regex_n_states(const eng_regex *re);

/* Whether s (n bytes) matches. */
bool eng_regex_match(const eng_regex *re, const char *s, size_t n);

/* A copy (an automaton shared between threads, made owned). */
int eng_regex_clone(const eng_regex *re, eng_regex **out, sw_error *err);

/* The strings both a and b match (a `pattern` beside a `format`): the
 * product automaton, SW_ERANGE past ENG_REGEX_MAX_STATES. */
int eng_regex_intersect(const eng_regex *a, const eng_regex *b, eng_regex **out, sw_error *err);

/* The fewest bytes of a completion, for a string whose length is bounded
 * in code points: get(state, chars) is the least total cost of bytes that
 * take `state` (reached after `chars` code points) to an accepting state
 * with a length in [min_chars, max_chars], or -1 when there is none.
 * byte_cost[b] is what byte b costs (its escaped length in JSON, say).
 * Memory is n_states * (levels) int32s, levels = max_chars + 1 (or
 * min_chars + 1 when max_chars is INT32_MAX, "unbounded"); SW_ERANGE past
 * ENG_REGEX_MAX_COST_CELLS. */
#define ENG_REGEX_MAX_COST_CELLS (1 << 21)
typedef struct eng_regex_costs eng_regex_costs;

int eng_regex_costs_build(const eng_regex *re, const uint8_t byte_cost[256], int32_t min_chars,
                          int32_t max_chars, eng_regex_costs **out, sw_error *err);
int64_t eng_regex_costs_get(const eng_regex_costs *t, int32_t state, int64_t chars);
void eng_regex_costs_free(eng_regex_costs *t);

#endif
