/* regex-impl.h - what the regex*.c files share: the bounds, the syntax
 * tree and its parser, the NFA, the compiled automaton's layout, and the
 * helpers one file calls in another. Private to src/grammar/regex*.c.
 */
#ifndef SPILLWAY_GRAMMAR_REGEX_IMPL_H
#define SPILLWAY_GRAMMAR_REGEX_IMPL_H

#include "grammar/regex.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RE_MAX_DEPTH 128
#define RE_MAX_COUNT 100000     /* largest {m,n} bound */
/* NFA states visited by the subset construction; the fuzz build defines a
 * smaller bound on the command line (CMakeLists.txt) */
#ifndef RE_WORK_MAX
#define RE_WORK_MAX (1L << 25)
#endif
#define RE_MAX_CP 0x10FFFFu
/* Lookahead automata per pattern, nested and {m,n} copies counted: each is
 * a construction of its own, so this bounds the work a pattern can ask for
 * (RE_WORK_MAX each). */
#define RE_MAX_LOOKS 16

typedef struct re_range {
    uint32_t lo, hi;
} re_range;

typedef struct re_set {
    re_range *r;
    int32_t n, cap;
} re_set;

enum { A_EMPTY, A_SET, A_CAT, A_ALT, A_REP, A_BOL, A_EOL, A_LOOK };

typedef struct re_ast {
    uint8_t kind;
    int32_t first, last; /* A_CAT, A_ALT, A_REP: children (linked by next) */
    int32_t next;
    int32_t n_children;
    int32_t min, max;    /* A_REP: max -1 = unbounded; A_LOOK: min 1 = negative */
    int32_t set_off, set_n; /* A_SET: ranges in the parser's pool */
} re_ast;

typedef struct re_parser {
    const uint8_t *p;
    size_t len, pos;
    re_ast *nodes;
    int32_t n_nodes, cap_nodes;
    re_set pool; /* every class's ranges, normalized, back to back */
    int depth;
    int rc;
    sw_error *err;
} re_parser;

/* NS_NOTBOL: an epsilon edge taken everywhere but at the start (a
 * lookahead holding ^ follows one reading at the start, another after). */
enum { NS_BYTE, NS_SPLIT, NS_EPS, NS_BOL, NS_EOL, NS_MATCH, NS_FAIL, NS_NOTBOL };

typedef struct nfa_state {
    uint8_t kind;
    uint8_t lo, hi; /* NS_BYTE */
    int32_t out, out2;
} nfa_state;

typedef struct re_nfa {
    nfa_state *s;
    int32_t n, cap;
    int rc;
    int32_t n_looks; /* lookahead automata compiled for the pattern (RE_MAX_LOOKS) */
    /* a class's trie and memo (regex_nfa.c), kept from one class to the
     * next: a pattern has many classes, each would allocate them anew */
    void *cls_nodes, *cls_edges, *cls_memo;
    int32_t *cls_keys;
    int32_t cap_cls_nodes, cap_cls_edges, cap_cls_memo, cap_cls_keys;
} re_nfa;

/* A DFA state's number in the transition table: 16 bits, since a pattern
 * has at most ENG_REGEX_MAX_STATES states; half the table's memory (and
 * of what a compile allocates, copies and walks) of 32-bit entries. */
typedef int16_t re_state_id;
_Static_assert(ENG_REGEX_MAX_STATES <= INT16_MAX, "a DFA state must fit re_state_id");

struct eng_regex {
    atomic_int refs; /* references besides the first (0 when allocated) */
    int32_t n_states, n_classes;
    int32_t start;
    uint8_t class_of[256];
    re_state_id *trans; /* n_states * n_classes: a state or ENG_REGEX_DEAD */
    uint8_t *accept;   /* n_states */
    uint8_t *live;     /* n_states */
    uint8_t *pend;     /* n_states */
    uint8_t *universal; /* n_states: every well-formed continuation matches */
};

#define RE_HTAB (ENG_REGEX_MAX_STATES * 4)

/* regex_parse.c */
int32_t eng__rx_p_fail(re_parser *p, int code, const char *what);
int32_t eng__rx_p_disjunction(re_parser *p);

/* regex_nfa.c */
void eng__rx_nfa_free(re_nfa *m); /* its states and buffers; m itself is the caller's */
int32_t eng__rx_nfa_add(re_nfa *m, uint8_t kind, uint8_t lo, uint8_t hi, int32_t out, int32_t out2);
int32_t eng__rx_emit_any_star(re_nfa *m, int32_t next);
int32_t eng__rx_emit(re_nfa *m, const re_parser *p, int32_t id, int32_t next);

/* regex_dfa.c */
int eng__rx_utf8_role(uint8_t c);
int eng__rx_dfa_finish(eng_regex *re);
int eng__rx_dfa_build_all(const re_nfa *m, int32_t head, int32_t tail, eng_regex *re,
                          bool at_start);

/* regex_rows.c: an automaton's rows while it is built, in blocks; block
 * b holds the rows of states first[b] .. (first[b + 1] or end) - 1 */
typedef struct re_rows {
    int32_t n_classes, max_rows; /* max_rows: a block's most */
    re_state_id **block;
    int32_t *first;
    int32_t n_block, cap_block;
    int32_t end; /* the rows the blocks have room for */
} re_rows;
void eng__rx_rows_init(re_rows *r, int32_t n_classes);
/* State's row (n_classes entries), its block allocated when state is the
 * first of it; rows are asked for in increasing order. NULL: out of memory. */
re_state_id *eng__rx_rows_at(re_rows *r, int32_t state);
/* The rows of states 0..n_states-1 as one table (*out, the caller's);
 * the blocks are freed. */
int eng__rx_rows_join(re_rows *r, int32_t n_states, re_state_id **out);
void eng__rx_rows_free(re_rows *r);
/* re->accept and re->universal for at least n_states states (*cap of
 * them allocated now; the new entries are unset). */
int eng__rx_flags_reserve(eng_regex *re, int32_t *cap, int32_t n_states);

/* regex_look.c */
int32_t eng__rx_emit_look(re_nfa *m, const re_parser *p, const re_ast *a, int32_t next);

#endif
