/* constrain-impl.h - the compiled grammar that json_schema.c builds and
 * constrain.c runs: a small graph of value nodes (object, string, number,
 * literal set, array, any-of, ...) addressed by index.
 *
 * Why a node graph and not a flat DFA: JSON nests, so the automaton is a
 * pushdown machine whose stack frames point at these nodes (constrain.c).
 * Nesting is bounded at compile time (ENG_CS_MAX_DEPTH), so a state is a
 * fixed-size value that can be copied while walking the token trie.
 * Only the json_schema*.c, gbnf_compile.c and constrain*.c files include it.
 */
#ifndef SPILLWAY_GRAMMAR_CONSTRAIN_IMPL_H
#define SPILLWAY_GRAMMAR_CONSTRAIN_IMPL_H

#include "grammar/json_schema.h"
#include "grammar/regex.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Frames on one automaton stack (the root frame included): bounds the
 * nesting of a schema. */
#define ENG_CS_MAX_DEPTH 16
/* Alternative stacks followed at once (anyOf branches, or readings of an
 * ambiguous GBNF grammar, that agree on the bytes so far). More are
 * dropped, those with the longest completions first: every kept stack is
 * still completable, so dropping only narrows what may be generated, and
 * the shortest completion is never lost (the budget rule needs it). */
#define ENG_CS_MAX_ALTS 8
/* Longer tokens are never allowed: the mask walk keeps one state per byte
 * of the longest token (real vocabularies stay far below). */
#define ENG_CS_MAX_TOKEN_BYTES 512
/* anyOf inside anyOf, and the branches one value can fan out into: both
 * bound the work of feeding a byte. */
#define ENG_CS_MAX_ANYOF_NESTING 8
#define ENG_CS_MAX_BRANCHES 64
/* Digits of an integer part and of a fraction: 15 keeps every integer
 * exact in a double and in int64. */
#define ENG_CS_MAX_INT_DIGITS 15
/* A ranged integer part (no multipleOf) may be as long as its bounds, up to
 * this many digits: a maximum of 10^23 allows every integer up to it. */
#define ENG_CS_MAX_BIG_DIGITS 400
#define ENG_CS_MAX_FRAC_DIGITS 6
/* Nesting levels of free JSON under "json_object" and untyped schemas. */
#define ENG_CS_ANY_DEPTH 4

typedef enum cs_kind {
    CS_OBJECT = 0,   /* declared properties, in order; optional ones may be skipped */
    CS_ANYOBJ = 1,   /* any object: string keys, values of node `item` */
    CS_ARRAY = 2,    /* items of node `item`, min_items..max_items */
    CS_STRING = 3,   /* min_chars..max_chars code points */
    CS_NUMBER = 4,
    CS_INTEGER = 5,
    CS_LITERALS = 6, /* one of a set of fixed texts (enum, const, true/false, null) */
    CS_ANYOF = 7,    /* one of the nodes in alts */
    CS_PATTERN = 8,  /* a string whose content matches re, min_chars..max_chars */
    /* GBNF grammars (gbnf_compile.c): raw text, not JSON values. */
    CS_RAW = 9,      /* bytes that the automaton re matches as a whole (re_costs: unbounded) */
    CS_SEQ = 10,     /* the n_seq nodes seq[], one after the other */
    CS_REP = 11,     /* node item, min_items..max_items times (max_items -1: unbounded) */
} cs_kind;

/* Minimum lengths saturate here: a value this long can never be generated
 * anyway, and sums of several stay far from overflow. A GBNF node whose
 * minimum is CS_LEN_CAP has no finite text at all (gbnf_compile.c prunes
 * such nodes from every place they could be entered). */
#define CS_LEN_CAP (INT32_MAX / 8)

typedef struct cs_node {
    cs_kind kind;
    int32_t min_bytes;       /* shortest serialization of a value */
    /* CS_OBJECT: n_props keys serialized as "\"name\":" (keys[i], key_lens[i]) */
    int32_t n_props;
    char **keys;
    int32_t *key_lens;
    int32_t *children;       /* value node of each property */
    bool *required;
    int32_t *req_from;       /* n_props + 1: bytes the required properties >= i need,
                                each with its comma: sum of 1 + key + value minimum */
    int32_t *any_from;       /* n_props + 1: min over j >= i of key + value minimum
                                (INT32_MAX / 4 past the end) */
    int32_t *next_req;       /* n_props + 1: first required index >= i, or n_props */
    /* CS_ARRAY, CS_ANYOBJ (values), CS_ANYOBJ also uses key_node */
    int32_t item;
    int32_t key_node;
    int32_t min_items, max_items;
    bool counted;            /* CS_ANYOBJ: min_items..max_items entries (min at most 1: a key
                                may be written twice, so only "some entry" is sure) */
    int32_t n_prefix;        /* CS_ARRAY: items 0..n_prefix-1 are of prefix[i] (prefixItems), */
    int32_t *prefix;         /* later ones of item */
    /* CS_STRING */
    int32_t min_chars, max_chars;
    /* CS_LITERALS */
    int32_t n_lits;
    char **lits;
    int32_t *lit_lens;
    /* CS_NUMBER, CS_INTEGER: bounds and multiples (ranged false: any value
     * the digit limits allow). Per sign ([0] non-negative, [1] negative),
     * ranges of the integer part's magnitude, inclusive, as decimal digits
     * without leading zeros (a NULL upper end: no bound): a whole value
     * ends in int_lo..int_hi, a fraction may follow an integer part in
     * frac_lo..frac_hi (CS_NUMBER), so every digit after it keeps the
     * value in bounds; frac_nonzero: at frac_lo itself the fraction must
     * not be all zeros (exclusiveMinimum 0 allows 0.5, not 0.0). */
    bool ranged;
    bool int_ok[2], frac_ok[2], frac_nonzero[2];
    char *int_lo[2], *int_hi[2], *frac_lo[2], *frac_hi[2];
    int32_t int_digits;      /* ranged: the integer part's most digits; 0: ENG_CS_MAX_INT_DIGITS */
    int32_t multiple_of;     /* CS_INTEGER, > 0: a multiple of it */
    int32_t max_frac;        /* CS_NUMBER: fraction digits; 0: ENG_CS_MAX_FRAC_DIGITS */
    /* CS_ANYOF */
    int32_t n_alts;
    int32_t *alts;
    int32_t n_branches;      /* non-anyOf nodes reachable through nested anyOfs (1 for others) */
    /* CS_PATTERN (owned): the content's automaton over its decoded UTF-8
     * bytes (pattern and format), and its completion costs in JSON bytes
     * under min_chars..max_chars; min_bytes is set by the maker. */
    eng_regex *re;
    eng_regex_costs *re_costs;
    /* CS_SEQ: seq_from[i] (n_seq + 1 entries) is the sum of the minimum
     * lengths of seq[i..]. */
    int32_t n_seq;
    int32_t *seq;
    int32_t *seq_from;
    /* GBNF nodes: stack frames the node's shortest text needs, its own
     * included (0, as JSON nodes have it: one). A value is entered only
     * where its shortest text still fits under ENG_CS_MAX_DEPTH, so the
     * minimum completion is always reachable and the budget stays exact. */
    int32_t need_frames;
    /* GBNF nodes: bit b set when no text of the node begins with byte b
     * (gbnf_compile.c), so the automaton enters the node for that byte
     * not at all (it would push and fork frames only to refuse the byte).
     * All clear, as JSON nodes have it: nothing is ruled out. */
    uint32_t refused_first[8];
} cs_node;

struct eng_grammar {
    cs_node *nodes;
    int32_t n_nodes, cap_nodes;
    int32_t root;
    int32_t any_cache[ENG_CS_ANY_DEPTH + 1]; /* "any value" node per depth, or -1 */
    int32_t any_key;                         /* unbounded string node for keys, or -1 */
};

#endif
