/* gbnf.h - GBNF grammars, llama.cpp's (the `grammar` field llama-server
 * takes), parsed into rules.
 *
 * The parser, a reference matcher for tests, and the compiler into the
 * constraint automaton (gbnf_compile.c) that enforces a request's
 * `grammar` as constrain.h enforces a JSON schema. The syntax: `name ::= alternatives`, one rule per line (a rule continues on
 * the next line after `|` or inside parentheses), `# comments`; elements
 * are "literals" (escapes \n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH),
 * [character classes] with ranges and ^ negation, `.` (any character),
 * rule names, ( groups ), each with * + ? {m} {m,} {m,n}. Characters are
 * code points; the text is UTF-8. A grammar needs a `root` rule, and every
 * rule it names must be defined. Bounds: ENG_GBNF_MAX_BYTES of text,
 * ENG_GBNF_MAX_NODES syntax nodes, nesting ENG_GBNF_MAX_DEPTH, counts up
 * to ENG_GBNF_MAX_COUNT; past them SW_ERANGE, malformed text SW_EINVAL
 * with the line and column.
 */
#ifndef SPILLWAY_GRAMMAR_GBNF_H
#define SPILLWAY_GRAMMAR_GBNF_H

#include "common/error.h"
#include "grammar/json_schema.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ENG_GBNF_MAX_BYTES (1 << 20)
#define ENG_GBNF_MAX_NODES 200000
#define ENG_GBNF_MAX_DEPTH 64
#define ENG_GBNF_MAX_COUNT 10000

typedef enum eng_gbnf_kind {
    ENG_GBNF_SEQ = 0,   /* children in order (empty: the empty string) */
    ENG_GBNF_ALT = 1,   /* one of the children */
    ENG_GBNF_REP = 2,   /* the one child, min..max times (max -1: unbounded) */
    ENG_GBNF_CLASS = 3, /* one code point in the ranges (negated: not in them) */
    ENG_GBNF_REF = 4,   /* the rule `rule` */
} eng_gbnf_kind;

typedef struct eng_gbnf_range {
    uint32_t lo, hi;
} eng_gbnf_range;

typedef struct eng_gbnf_node {
    eng_gbnf_kind kind;
    int32_t first, next;     /* children: first child, then each child's next; -1 ends */
    int32_t min, max;        /* ENG_GBNF_REP */
    int32_t rule;            /* ENG_GBNF_REF */
    bool negated;            /* ENG_GBNF_CLASS */
    int32_t range_off, n_ranges; /* ENG_GBNF_CLASS: eng_gbnf_class_ranges() */
} eng_gbnf_node;

/* Immutable once parsed. */
typedef struct eng_gbnf eng_gbnf;

int eng_gbnf_parse(const char *text, size_t len, eng_gbnf **out, sw_error *err);
void eng_gbnf_free(eng_gbnf *g);

/* Parses and compiles a grammar into the automaton constrain.h runs (the
 * text generated is exactly a string of root's language, UTF-8). Errors:
 * the parser's (SW_EINVAL with the line and column, SW_ERANGE), and
 * SW_EINVAL for a left-recursive rule (named) or a root without any
 * finite text, SW_ERANGE for a grammar whose automata or nesting pass the
 * bounds (gbnf_compile.c). Bounded in time and memory on any input. */
int eng_grammar_from_gbnf(const char *text, size_t len, eng_grammar **out, sw_error *err);

int32_t eng_gbnf_n_rules(const eng_gbnf *g);
int32_t eng_gbnf_n_nodes(const eng_gbnf *g);
/* Index of a rule by name, or -1. */
int32_t eng_gbnf_rule(const eng_gbnf *g, const char *name);
const char *eng_gbnf_rule_name(const eng_gbnf *g, int32_t rule);
/* The syntax node of a rule's body. */
int32_t eng_gbnf_rule_body(const eng_gbnf *g, int32_t rule);
const eng_gbnf_node *eng_gbnf_node_at(const eng_gbnf *g, int32_t node);
/* A class node's n_ranges ranges (NULL when it has none, as `[]` does). */
const eng_gbnf_range *eng_gbnf_class_ranges(const eng_gbnf *g, const eng_gbnf_node *nd);

/* The grammar of what may follow text (UTF-8) under g, as GBNF text
 * (*out, sw_free): a string w is in its root's language exactly when
 * text w is in g's (gbnf_derive.c). For an engine that takes a grammar but
 * not the text a stream already holds. SW_EINVAL when no string of g
 * begins with text, or text ends inside a UTF-8 character; SW_ERANGE past
 * the recognizer's bounds (too ambiguous, nested too deeply, a
 * left-recursive rule met); SW_ENOMEM. */
int eng_gbnf_derive(const eng_gbnf *g, const char *text, size_t len, char **out, sw_error *err);

/* Whether text (UTF-8) is in the language of `root`: a reference matcher
 * for tests (memoized, exponential in the worst case; short texts only;
 * left-recursive rules match nothing through the recursion). */
bool eng_gbnf_match(const eng_gbnf *g, const char *text, size_t len);

#endif
