/* constrain-state.h - what the files of the constraint automaton share:
 * its state (frames, stacks, sets), the vocabulary index and the
 * constraint (constrain.c runs the automaton, constrain_number.c its
 * bounded numbers, constrain_vocab.c indexes the vocabulary,
 * constrain_mask.c computes masks). Only those files include it.
 */
#ifndef SPILLWAY_ENGINE_CONSTRAIN_STATE_H
#define SPILLWAY_ENGINE_CONSTRAIN_STATE_H

#include "grammar/constrain.h"
#include "grammar/constrain-impl.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct cs_frame {
    int32_t node;   /* -1: the root */
    uint8_t phase;
    uint8_t pend;   /* string: UTF-8 continuation bytes still expected */
    uint8_t lo, hi; /* string: range of the next continuation byte */
    int32_t a, b, c;
} cs_frame;

typedef struct cs_stack {
    int32_t depth;
    cs_frame f[ENG_CS_MAX_DEPTH];
} cs_stack;

typedef struct cs_set {
    int32_t n;
    /* Written by eng__cs_set_step for the set it fills, and meaningful
     * only while it fills it (constrain.c, push_out): each stack's hash,
     * and once the set is full (have_min) each one's shortest completion. */
    bool have_min;
    uint64_t hash[ENG_CS_MAX_ALTS];
    int64_t min[ENG_CS_MAX_ALTS];
    cs_stack s[ENG_CS_MAX_ALTS];
} cs_set;

/* Phases. */
enum { S_START = 0, S_IN = 1, S_ESC = 2 };
enum { N_START = 0, N_NEG = 1, N_ZERO = 2, N_INT = 3, N_FRAC0 = 4, N_FRAC = 5 };
enum { O_START = 0, O_FIRST = 1, O_KEYSTART = 2, O_KEY = 3, O_VALUE = 4, O_AFTER = 5 };
enum { A_START = 0, A_FIRST = 1, A_COLON = 2, A_VALUE = 3, A_AFTER = 4, A_KEY = 5 };
enum { R_START = 0, R_FIRST = 1, R_AFTER = 2, R_NEXT = 3 };

#define CS_INF ((int64_t)1 << 40)

/* ---- the vocabulary ---------------------------------------------------- */

typedef struct cs_tnode {
    uint32_t first_child; /* 0: none (the root is never a child) */
    uint32_t next;        /* next sibling, 0: none */
    uint32_t tok_begin;   /* tokens ending here: ids[tok_begin .. +tok_count) */
    uint32_t tok_count;
    uint8_t byte;
} cs_tnode;

typedef struct cs_trie {
    cs_tnode *nodes;
    uint32_t n_nodes;
    int32_t *ids;         /* tokens sorted by bytes */
} cs_trie;

/* A trie laid out flat in depth-first order, for the pattern lists' walk
 * (constrain_mask.c): a linear scan over one array that jumps past the
 * subtree of a refused byte, instead of following child and sibling links
 * (a third of the time per node on qwen2's plain tokens). Node i's subtree
 * is nodes[i .. skip), the tokens ending at it are ids[tok_off .. nodes[i +
 * 1].tok_off), those below it ids[nodes[i + 1].tok_off .. nodes[skip]
 * .tok_off); nodes[n_nodes] is a sentinel holding the end of ids. The root
 * is not stored: the nodes at depth 1 are its children. */
typedef struct cs_flat_node {
    uint32_t skip;
    uint32_t tok_off;
    uint16_t depth;       /* bytes from the root, 1..ENG_CS_MAX_TOKEN_BYTES */
    uint8_t byte;
} cs_flat_node;

typedef struct cs_flat_trie {
    cs_flat_node *nodes;  /* n_nodes + 1 */
    uint32_t n_nodes;
    int32_t *ids;         /* tokens sorted by bytes */
} cs_flat_trie;

#define CS_UPTO_MASKS 17
/* Sets of pattern-list slots a vocabulary keeps for its next constraints
 * (eng_cs_vocab.pool): about 7 MB each on qwen2. */
#define CS_POOL_SETS 4

struct eng_cs_vocab {
    int32_t n_tokens;
    char *blob;           /* every token's bytes */
    size_t *off;          /* n_tokens */
    int32_t *len;         /* n_tokens; 0: never allowed */
    uint8_t *is_end;      /* n_tokens */
    int32_t *end_ids;
    int32_t n_end;
    int32_t *plain_ids;   /* tokens of ordinary string characters only */
    int32_t *plain_chars; /* their code points */
    int32_t n_plain;
    int32_t max_plain_chars;
    uint32_t *plain_bits; /* the plain tokens as a mask ((n_tokens + 31) / 32 words) */
    /* byte_plain[byte_plain_off[b] .. byte_plain_off[b + 1]): the plain
     * tokens (indices into plain_ids) holding byte b as a character's
     * first byte (pattern lists of states that nearly every character
     * keeps, cs_pat_cache.whole). */
    int32_t *byte_plain_off; /* 257 */
    int32_t *byte_plain;
    /* Plain tokens by their code points, for a string whose length bound
     * is near (constrain_mask.c, plain_by_chars): plain_upto holds
     * CS_UPTO_MASKS masks, mask k the plain tokens of at most k code points
     * (plain_upto_n[k] of them); the longer ones are listed, by_chars
     * (indices into plain_ids, fewest code points first) from
     * by_chars_off[k] on having k or more (max_plain_chars + 2 offsets). */
    uint32_t *plain_upto;
    int32_t plain_upto_n[CS_UPTO_MASKS];
    int32_t *by_chars;
    int32_t *by_chars_off;
    cs_trie full;         /* every allowed token */
    cs_trie special;      /* allowed tokens that are not plain */
    cs_flat_trie plain;   /* the plain tokens (pattern lists are built walking it) */
    int32_t max_len;
    /* The one part that changes after building, under pool_lock: the
     * pattern-list slots of finished constraints (CS_PAT_SLOTS each),
     * handed to the next ones, so a constraint's first lists are written
     * into memory already touched instead of faulting in a page per 4 KiB
     * (1-1.5 ms per 40000-entry list on the shared VM). */
    pthread_mutex_t pool_lock;
    bool pool_ready;
    int32_t n_pool;
    struct cs_pat_cache *pool[CS_POOL_SETS];
};

/* Pattern strings (CS_PATTERN): the plain tokens one automaton state lets
 * through, each with the state after it and its code points, so a mask in
 * a state met before is one pass over a list instead of a trie walk. A
 * state's list is built the first time it is met, by one walk of the plain
 * tokens' trie with the automaton alone (one table lookup per trie node, a
 * refused byte prunes every token under it), so building costs about what
 * one trie walk of the mask would. GBNF automata (CS_RAW) use the same
 * lists; there a token that passes an accepting state before its last byte
 * could also end the automaton and go on below, so its entry is undecided
 * (state CS_PAT_UNDECIDED) and the token is fed from the full state
 * instead. The slots are few because each holds room for every plain
 * token (taken with the constraint from the vocabulary's pool, or
 * allocated and touched then, so masks allocate nothing and fault in no
 * page); the least recently used is replaced. */
#define CS_PAT_SLOTS 4
#define CS_PAT_UNDECIDED (-2)

typedef struct cs_pat_entry {
    int32_t id, state, chars;
} cs_pat_entry;

typedef struct cs_pat_cache {
    int32_t node, state; /* -1: free */
    int32_t n;
    uint64_t used;
    cs_pat_entry *e;     /* n_plain entries allocated */
    /* The whole list as a mask, for the usual case where every entry fits:
     * fast when no entry is undecided and (CS_PATTERN) the length is
     * unbounded, so past min_chars an entry's cost is its state's alone;
     * bits then holds the n_bits entries whose cost is finite, the largest
     * of which is max_cost. */
    bool fast;
    int32_t n_bits;
    int64_t max_cost;
    uint32_t *bits;      /* (n_tokens + 31) / 32 words */
    /* A state that every plain character either keeps or refuses (inside
     * `.*` or a GBNF string, say): the list is not written out; it is
     * every plain token whose bit is set in bits (n of them), each with
     * this state after it and its own code points. fast and n_bits then
     * say whether bits is also the mask (n_bits 0: no entry fits). */
    bool whole;
} cs_pat_cache;

struct eng_constraint {
    const eng_grammar *g;
    const eng_cs_vocab *v;
    cs_set state;
    cs_set *scratch;      /* max_len + 2 sets: the trie walk's states by depth */
    uint32_t *mask;       /* eng_constraint_mask_buffer: for the engine's sampling step */
    cs_pat_cache *pcache; /* CS_PAT_SLOTS, when the grammar has patterns */
    uint64_t ptick;
};
enum { R_REJECT = 0, R_ACCEPT = 1, R_DONE = 2, R_END = 3 };

/* ---- shared between the files ---------------------------------------- */

void eng__cs_stack_copy(cs_stack *dst, const cs_stack *src);
/* Frees a set of CS_PAT_SLOTS slots (constrain_mask.c; NULL is fine). */
void eng__cs_slots_free(cs_pat_cache *slots);
int eng__cs_step_pattern(const cs_node *n, cs_frame *f, uint8_t ch);
int64_t eng__cs_pattern_min(const cs_node *n, const cs_frame *f);
void eng__cs_set_step(const eng_grammar *g, const cs_set *in, uint8_t ch, cs_set *out);
int64_t eng__cs_frame_min(const eng_grammar *g, const cs_frame *f);
int64_t eng__cs_stack_min(const eng_grammar *g, const cs_stack *st);
int64_t eng__cs_set_min(const eng_grammar *g, const cs_set *s);
bool eng__cs_set_complete(const eng_grammar *g, const cs_set *s);
int eng__cs_utf8_lead(uint8_t c, uint8_t *lo, uint8_t *hi);
bool eng__cs_num_bounded(const cs_node *n);
int eng__cs_step_bounded(const cs_node *n, cs_frame *f, uint8_t ch);
bool eng__cs_num_can_end(const cs_node *n, const cs_frame *f);
int64_t eng__cs_num_min(const cs_node *n, const cs_frame *f);

#endif
