/* constrain.c - the byte automaton over a compiled grammar and the token
 * masks built from it (see constrain.h for the contract).
 *
 * State: up to ENG_CS_MAX_ALTS stacks of frames. A frame is a node of the
 * grammar plus where in that node the text is (phase and counters); the
 * bottom frame is the root (phase 0: the value has not started; 1: it has).
 * Feeding a byte runs the top frame: it accepts the byte, refuses it, or
 * ends (a number or a literal ends at the first byte that cannot extend
 * it, which is then fed to the frame below). Expecting a value of an anyOf
 * node forks the stack, one copy per alternative that accepts the byte;
 * GBNF frames (gbnf_compile.c) fork also where they may end or go on.
 *
 * Minimum completion: every frame knows the fewest bytes that close it
 * from its phase (node minimum lengths come from json_schema.c and
 * gbnf_compile.c), and a
 * stack's minimum is the sum over its frames; the state's is the smallest
 * over its stacks. The budget rule compares it with the tokens left.
 */
#include "engine/constrain.h"

#include "common/alloc.h"
#include "engine/constrain-impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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
    cs_trie full;         /* every allowed token */
    cs_trie special;      /* allowed tokens that are not plain */
    cs_trie plain;        /* the plain tokens (pattern lists are built walking it) */
    int32_t max_len;
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
 * token (allocated with the constraint, so masks allocate nothing); the
 * least recently used is replaced. */
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
} cs_pat_cache;

struct eng_constraint {
    const eng_grammar *g;
    const eng_cs_vocab *v;
    cs_set state;
    cs_set *scratch;      /* max_len + 2 sets: the trie walk's states by depth */
    uint32_t *mask;       /* for eng_constraint_sample */
    cs_pat_cache *pcache; /* CS_PAT_SLOTS, when the grammar has patterns */
    uint64_t ptick;
};

/* Length of the UTF-8 character starting with lead byte c and the range
 * of its first continuation byte (RFC 3629: no overlong forms, no
 * surrogates, nothing above U+10FFFF); 0 for a byte that cannot lead. */
static int utf8_lead(uint8_t c, uint8_t *lo, uint8_t *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        return 1;
    if (c == 0xE0) {
        *lo = 0xA0;
        return 2;
    }
    if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF)
        return 2;
    if (c == 0xED) {
        *hi = 0x9F;
        return 2;
    }
    if (c == 0xF0) {
        *lo = 0x90;
        return 3;
    }
    if (c >= 0xF1 && c <= 0xF3)
        return 3;
    if (c == 0xF4) {
        *hi = 0x8F;
        return 3;
    }
    return 0;
}

/* Code points of a token made only of characters a JSON string may hold
 * unescaped (no '"', '\\', control bytes) in whole UTF-8 characters; -1
 * otherwise. */
static int32_t plain_chars(const uint8_t *p, int32_t n)
{
    int32_t chars = 0;
    for (int32_t i = 0; i < n;) {
        uint8_t c = p[i], lo, hi;
        if (c < 0x20 || c == '"' || c == '\\')
            return -1;
        chars++;
        if (c < 0x80) {
            i++;
            continue;
        }
        int k = utf8_lead(c, &lo, &hi);
        if (k == 0 || i + k >= n || p[i + 1] < lo || p[i + 1] > hi)
            return -1;
        for (int j = 2; j <= k; j++)
            if (p[i + j] < 0x80 || p[i + j] > 0xBF)
                return -1;
        i += k + 1;
    }
    return chars;
}

typedef struct cs_sort_item {
    const uint8_t *p;
    int32_t len;
    int32_t id;
} cs_sort_item;

static int cs_sort_cmp(const void *pa, const void *pb)
{
    const cs_sort_item *a = pa, *b = pb;
    int32_t n = a->len < b->len ? a->len : b->len;
    int c = memcmp(a->p, b->p, (size_t)n);
    if (c)
        return c;
    if (a->len != b->len)
        return a->len < b->len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static void trie_free(cs_trie *t)
{
    sw_free(t->nodes);
    sw_free(t->ids);
    memset(t, 0, sizeof *t);
}

/* Builds a trie of the given items (sorted here). */
static int trie_build(cs_trie *t, cs_sort_item *items, int32_t n, int32_t max_len)
{
    size_t cap = 1;
    for (int32_t i = 0; i < n; i++)
        cap += (size_t)items[i].len;
    memset(t, 0, sizeof *t);
    t->nodes = sw_calloc(cap, sizeof *t->nodes);
    t->ids = sw_malloc((size_t)(n ? n : 1) * sizeof *t->ids);
    uint32_t *path = sw_calloc((size_t)max_len + 2, sizeof *path);
    if (!t->nodes || !t->ids || !path) {
        sw_free(path);
        trie_free(t);
        return SW_ENOMEM;
    }
    qsort(items, (size_t)n, sizeof *items, cs_sort_cmp);
    t->n_nodes = 1; /* the root */
    path[0] = 0;
    const cs_sort_item *prev = NULL;
    for (int32_t i = 0; i < n; i++) {
        const cs_sort_item *it = &items[i];
        int32_t lcp = 0;
        if (prev) {
            int32_t m = prev->len < it->len ? prev->len : it->len;
            while (lcp < m && prev->p[lcp] == it->p[lcp])
                lcp++;
        }
        for (int32_t d = lcp; d < it->len; d++) {
            uint32_t node = t->n_nodes++;
            t->nodes[node].byte = it->p[d];
            /* Sorted input: a new child goes after the children made so
             * far, the last of which is on the previous string's path. */
            if (d == lcp && prev && prev->len > d)
                t->nodes[path[d + 1]].next = node;
            else
                t->nodes[path[d]].first_child = node;
            path[d + 1] = node;
        }
        cs_tnode *end = &t->nodes[path[it->len]];
        if (end->tok_count == 0)
            end->tok_begin = (uint32_t)i;
        end->tok_count++;
        t->ids[i] = it->id;
        prev = it;
    }
    sw_free(path);
    /* Shared prefixes left part of the worst-case allocation unused. */
    cs_tnode *fit = sw_realloc(t->nodes, (size_t)t->n_nodes * sizeof *fit);
    if (fit)
        t->nodes = fit;
    return SW_OK;
}

void eng_cs_vocab_free(eng_cs_vocab *v)
{
    if (!v)
        return;
    sw_free(v->blob);
    sw_free(v->off);
    sw_free(v->len);
    sw_free(v->is_end);
    sw_free(v->end_ids);
    sw_free(v->plain_ids);
    sw_free(v->plain_chars);
    sw_free(v->plain_bits);
    trie_free(&v->full);
    trie_free(&v->special);
    trie_free(&v->plain);
    sw_free(v);
}

int32_t eng_cs_vocab_n_tokens(const eng_cs_vocab *v)
{
    return v->n_tokens;
}

/* The shared part of both constructors: v->blob/off/len/is_end are set. */
static int vocab_finish(eng_cs_vocab *v, sw_error *err)
{
    int32_t n = v->n_tokens, n_special = 0;
    cs_sort_item *all = sw_malloc((size_t)(n ? n : 1) * sizeof *all);
    cs_sort_item *spec = sw_malloc((size_t)(n ? n : 1) * sizeof *spec);
    cs_sort_item *plain = sw_malloc((size_t)(n ? n : 1) * sizeof *plain);
    v->plain_ids = sw_malloc((size_t)(n ? n : 1) * sizeof *v->plain_ids);
    v->plain_chars = sw_malloc((size_t)(n ? n : 1) * sizeof *v->plain_chars);
    v->plain_bits = sw_calloc(((size_t)n + 31) / 32 + 1, sizeof *v->plain_bits);
    int32_t n_all = 0;
    int rc = SW_OK;
    if (!all || !spec || !plain || !v->plain_ids || !v->plain_chars || !v->plain_bits) {
        rc = sw_error_set(err, SW_ENOMEM, "out of memory indexing the vocabulary");
        goto done;
    }
    for (int32_t id = 0; id < n; id++) {
        if (v->len[id] <= 0)
            continue;
        const uint8_t *p = (const uint8_t *)v->blob + v->off[id];
        all[n_all++] = (cs_sort_item){p, v->len[id], id};
        if (v->len[id] > v->max_len)
            v->max_len = v->len[id];
        int32_t chars = plain_chars(p, v->len[id]);
        if (chars >= 0) {
            plain[v->n_plain] = (cs_sort_item){p, v->len[id], id};
            v->plain_ids[v->n_plain] = id;
            v->plain_chars[v->n_plain++] = chars;
            v->plain_bits[id >> 5] |= 1u << (id & 31);
            if (chars > v->max_plain_chars)
                v->max_plain_chars = chars;
        } else {
            spec[n_special++] = (cs_sort_item){p, v->len[id], id};
        }
    }
    if (trie_build(&v->full, all, n_all, v->max_len) ||
        trie_build(&v->special, spec, n_special, v->max_len) ||
        trie_build(&v->plain, plain, v->n_plain, v->max_len))
        rc = sw_error_set(err, SW_ENOMEM, "out of memory indexing the vocabulary");
done:
    sw_free(all);
    sw_free(spec);
    sw_free(plain);
    return rc;
}

int eng_cs_vocab_create(const eng_tokenizer *tok, eng_cs_vocab **out, sw_error *err)
{
    int32_t n = eng_tokenizer_n_vocab(tok);
    eng_cs_vocab *v = sw_calloc(1, sizeof *v);
    size_t total = 0;
    int rc;
    if (!v)
        return sw_error_set(err, SW_ENOMEM, "out of memory indexing the vocabulary");
    v->n_tokens = n;
    v->off = sw_calloc((size_t)n, sizeof *v->off);
    v->len = sw_calloc((size_t)n, sizeof *v->len);
    v->is_end = sw_calloc((size_t)n, sizeof *v->is_end);
    v->end_ids = sw_calloc((size_t)n, sizeof *v->end_ids);
    if (!v->off || !v->len || !v->is_end || !v->end_ids) {
        rc = sw_error_set(err, SW_ENOMEM, "out of memory indexing the vocabulary");
        goto fail;
    }
    for (int32_t id = 0; id < n; id++) {
        eng_token_type t = eng_token_get_type(tok, id);
        if (eng_tokenizer_is_eog(tok, id)) {
            v->is_end[id] = 1;
            v->end_ids[v->n_end++] = id;
        }
        if (t == ENG_TOKEN_CONTROL || t == ENG_TOKEN_UNKNOWN || t == ENG_TOKEN_UNUSED ||
            v->is_end[id])
            continue;
        size_t len = eng_token_to_bytes(tok, id, NULL, 0);
        if (len > ENG_CS_MAX_TOKEN_BYTES)
            continue; /* no real token is this long; never allowed */
        v->off[id] = total;
        v->len[id] = (int32_t)len;
        total += len;
    }
    v->blob = sw_malloc(total ? total : 1);
    if (!v->blob) {
        rc = sw_error_set(err, SW_ENOMEM, "out of memory indexing the vocabulary");
        goto fail;
    }
    for (int32_t id = 0; id < n; id++)
        if (v->len[id] > 0)
            eng_token_to_bytes(tok, id, v->blob + v->off[id], (size_t)v->len[id]);
    if ((rc = vocab_finish(v, err)))
        goto fail;
    *out = v;
    return SW_OK;
fail:
    eng_cs_vocab_free(v);
    return rc;
}

int eng_cs_vocab_create_from_pieces(const char *const *pieces, const size_t *lens, int32_t n,
                                    const int32_t *end_ids, int32_t n_end, eng_cs_vocab **out,
                                    sw_error *err)
{
    eng_cs_vocab *v = sw_calloc(1, sizeof *v);
    size_t total = 0;
    int rc;
    if (!v || n <= 0)
        return v ? (sw_free(v), sw_error_set(err, SW_EINVAL, "an empty vocabulary"))
                 : sw_error_set(err, SW_ENOMEM, "out of memory indexing the vocabulary");
    v->n_tokens = n;
    v->off = sw_calloc((size_t)n, sizeof *v->off);
    v->len = sw_calloc((size_t)n, sizeof *v->len);
    v->is_end = sw_calloc((size_t)n, sizeof *v->is_end);
    v->end_ids = sw_calloc((size_t)n, sizeof *v->end_ids);
    if (!v->off || !v->len || !v->is_end || !v->end_ids) {
        rc = sw_error_set(err, SW_ENOMEM, "out of memory indexing the vocabulary");
        goto fail;
    }
    for (int32_t i = 0; i < n_end; i++) {
        if (end_ids[i] < 0 || end_ids[i] >= n || v->is_end[end_ids[i]])
            continue;
        v->is_end[end_ids[i]] = 1;
        v->end_ids[v->n_end++] = end_ids[i];
    }
    for (int32_t id = 0; id < n; id++) {
        if (!pieces[id] || lens[id] == 0 || lens[id] > ENG_CS_MAX_TOKEN_BYTES || v->is_end[id])
            continue;
        v->off[id] = total;
        v->len[id] = (int32_t)lens[id];
        total += lens[id];
    }
    v->blob = sw_malloc(total ? total : 1);
    if (!v->blob) {
        rc = sw_error_set(err, SW_ENOMEM, "out of memory indexing the vocabulary");
        goto fail;
    }
    for (int32_t id = 0; id < n; id++)
        if (v->len[id] > 0)
            memcpy(v->blob + v->off[id], pieces[id], (size_t)v->len[id]);
    if ((rc = vocab_finish(v, err)))
        goto fail;
    *out = v;
    return SW_OK;
fail:
    eng_cs_vocab_free(v);
    return rc;
}

/* ---- the automaton ------------------------------------------------------- */

static void stack_copy(cs_stack *dst, const cs_stack *src)
{
    dst->depth = src->depth;
    memcpy(dst->f, src->f, (size_t)src->depth * sizeof src->f[0]);
}

static int64_t stack_min(const eng_grammar *g, const cs_stack *st);

/* Adds a stack to the set unless it is there already (two paths to the
 * same stack are common in ambiguous GBNF grammars; frames are zeroed
 * when pushed, so equal stacks compare equal byte for byte). A full set
 * keeps the stacks with the shortest completions: the one with the
 * longest gives way, so the state's minimum is never lost and the budget
 * rule (some token always shortens it) holds however many are dropped. */
static void push_out(const eng_grammar *g, cs_set *out, const cs_stack *st)
{
    for (int32_t i = 0; i < out->n; i++)
        if (out->s[i].depth == st->depth &&
            memcmp(out->s[i].f, st->f, (size_t)st->depth * sizeof st->f[0]) == 0)
            return;
    if (out->n < ENG_CS_MAX_ALTS) {
        stack_copy(&out->s[out->n++], st);
        return;
    }
    int64_t mine = stack_min(g, st), worst = -1;
    int32_t at = -1;
    for (int32_t i = 0; i < out->n; i++) {
        int64_t m = stack_min(g, &out->s[i]);
        if (m > worst) {
            worst = m;
            at = i;
        }
    }
    if (mine < worst)
        stack_copy(&out->s[at], st);
}

enum { R_REJECT = 0, R_ACCEPT = 1, R_DONE = 2, R_END = 3 };

static int step_string(const cs_node *n, cs_frame *f, uint8_t ch)
{
    switch (f->phase) {
    case S_START:
        if (ch != '"')
            return R_REJECT;
        f->phase = S_IN;
        return R_ACCEPT;
    case S_ESC:
        if (!strchr("\"\\/bfnrt", ch) || ch == 0)
            return R_REJECT;
        f->phase = S_IN;
        return R_ACCEPT;
    default:
        break;
    }
    if (f->pend) {
        if (ch < f->lo || ch > f->hi)
            return R_REJECT;
        f->pend--;
        f->lo = 0x80;
        f->hi = 0xBF;
        return R_ACCEPT;
    }
    if (ch == '"')
        return f->a >= n->min_chars ? R_DONE : R_REJECT;
    if (ch < 0x20 || f->a >= n->max_chars)
        return R_REJECT;
    if (ch == '\\') {
        f->a++;
        f->phase = S_ESC;
        return R_ACCEPT;
    }
    if (ch >= 0x80) {
        uint8_t lo, hi;
        int k = utf8_lead(ch, &lo, &hi);
        if (k == 0)
            return R_REJECT;
        f->pend = (uint8_t)k;
        f->lo = lo;
        f->hi = hi;
    }
    f->a++;
    return R_ACCEPT;
}

/* Pattern strings (CS_PATTERN): the content's decoded bytes run the node's
 * automaton (frame b: its state; a: code points so far; c: a \u escape's
 * value so far). Escapes: the short ones, and \u00XX for the control
 * characters that have none; any other character is written as itself,
 * so every escape decodes to one byte. A byte is taken only when the
 * automaton can still reach a match within the length bounds
 * (re_costs), so generation never walks into a dead end. */
enum { S_U0 = 3, S_U1 = 4, S_U2 = 5, S_U3 = 6 }; /* after \u, \u0, \u00, \u00X */

/* The automaton's state after content byte d, or -1 when no completion
 * follows; *chars receives the code points then. */
static int32_t pattern_next(const cs_node *n, const cs_frame *f, uint8_t d, int64_t *chars)
{
    int32_t t = eng_regex_step(n->re, f->b, d);
    int64_t a = f->a + ((d & 0xC0) != 0x80);
    if (t < 0 || eng_regex_costs_get(n->re_costs, t, a) < 0)
        return -1;
    *chars = a;
    return t;
}

/* The fewest bytes that complete an escape whose value will be one of
 * lo..hi, rest bytes of it still unwritten (the closing quote included),
 * or CS_INF. */
static int64_t pattern_ctrl_min(const cs_node *n, const cs_frame *f, int lo, int hi, int rest)
{
    int64_t best = CS_INF, a;
    for (int d = lo; d <= hi; d++) {
        int32_t t = pattern_next(n, f, (uint8_t)d, &a);
        int64_t m = t < 0 ? CS_INF : rest + eng_regex_costs_get(n->re_costs, t, a) + 1;
        if (m < best)
            best = m;
    }
    return best;
}

static int hex_digit(uint8_t ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if ((ch | 0x20) >= 'a' && (ch | 0x20) <= 'f')
        return (ch | 0x20) - 'a' + 10;
    return -1;
}

static const char pattern_esc_from[] = "\"\\/bfnrt";
static const char pattern_esc_to[] = "\"\\/\b\f\n\r\t";

static int64_t pattern_min(const cs_node *n, const cs_frame *f);

static int step_pattern(const cs_node *n, cs_frame *f, uint8_t ch)
{
    int64_t a;
    int32_t t;
    switch (f->phase) {
    case S_START:
        if (ch != '"' || eng_regex_costs_get(n->re_costs, eng_regex_start(n->re), 0) < 0)
            return R_REJECT;
        f->phase = S_IN;
        f->a = 0;
        f->b = eng_regex_start(n->re);
        return R_ACCEPT;
    case S_ESC: {
        if (ch == 'u') {
            if (pattern_ctrl_min(n, f, 0, 0x1F, 0) >= CS_INF)
                return R_REJECT;
            f->phase = S_U0;
            return R_ACCEPT;
        }
        const char *p = ch ? strchr(pattern_esc_from, ch) : NULL;
        if (!p || (t = pattern_next(n, f, (uint8_t)pattern_esc_to[p - pattern_esc_from], &a)) < 0)
            return R_REJECT;
        f->b = t;
        f->a = (int32_t)a;
        f->phase = S_IN;
        return R_ACCEPT;
    }
    case S_U0:
    case S_U1:
        if (ch != '0')
            return R_REJECT;
        f->phase++;
        return R_ACCEPT;
    case S_U2:
        if ((ch != '0' && ch != '1') ||
            pattern_ctrl_min(n, f, (ch - '0') * 16, (ch - '0') * 16 + 15, 0) >= CS_INF)
            return R_REJECT;
        f->c = (ch - '0') * 16;
        f->phase = S_U3;
        return R_ACCEPT;
    case S_U3:
        if (hex_digit(ch) < 0 || (t = pattern_next(n, f, (uint8_t)(f->c + hex_digit(ch)), &a)) < 0)
            return R_REJECT;
        f->b = t;
        f->a = (int32_t)a;
        f->phase = S_IN;
        return R_ACCEPT;
    default:
        break;
    }
    bool boundary = eng_regex_pending(n->re, f->b) == 0;
    if (ch == '"')
        return boundary && eng_regex_accepting(n->re, f->b) && f->a >= n->min_chars &&
                       f->a <= n->max_chars
                   ? R_DONE
                   : R_REJECT;
    if (ch == '\\') {
        /* only when some escape can follow: the mask refuses a backslash
         * that leads nowhere, and feeding must agree with it */
        cs_frame e = *f;
        e.phase = S_ESC;
        if (!boundary || pattern_min(n, &e) >= CS_INF)
            return R_REJECT;
        f->phase = S_ESC;
        return R_ACCEPT;
    }
    if (ch < 0x20 || (t = pattern_next(n, f, ch, &a)) < 0)
        return R_REJECT;
    f->b = t;
    f->a = (int32_t)a;
    return R_ACCEPT;
}

/* The fewest bytes that close a pattern frame. */
static int64_t pattern_min(const cs_node *n, const cs_frame *f)
{
    int64_t best = CS_INF, a;
    switch (f->phase) {
    case S_START: return n->min_bytes;
    case S_ESC:
        for (const char *p = pattern_esc_from; *p; p++) {
            int32_t t = pattern_next(n, f, (uint8_t)pattern_esc_to[p - pattern_esc_from], &a);
            int64_t m = t < 0 ? CS_INF : 1 + eng_regex_costs_get(n->re_costs, t, a) + 1;
            if (m < best)
                best = m;
        }
        a = pattern_ctrl_min(n, f, 0, 0x1F, 5);
        return a < best ? a : best;
    case S_U0: return pattern_ctrl_min(n, f, 0, 0x1F, 4);
    case S_U1: return pattern_ctrl_min(n, f, 0, 0x1F, 3);
    case S_U2: return pattern_ctrl_min(n, f, 0, 0x1F, 2);
    case S_U3: return pattern_ctrl_min(n, f, f->c, f->c + 15, 1);
    default: {
        int64_t m = eng_regex_costs_get(n->re_costs, f->b, f->a);
        return m < 0 ? CS_INF : m + 1;
    }
    }
}

static int step_number(bool integer, cs_frame *f, uint8_t ch)
{
    bool digit = ch >= '0' && ch <= '9';
    switch (f->phase) {
    case N_START:
    case N_NEG:
        if (ch == '-' && f->phase == N_START) {
            f->phase = N_NEG;
            return R_ACCEPT;
        }
        if (ch == '0') {
            f->phase = N_ZERO;
            return R_ACCEPT;
        }
        if (digit) {
            f->phase = N_INT;
            f->a = 1;
            return R_ACCEPT;
        }
        return R_REJECT;
    case N_ZERO:
    case N_INT:
        if (digit && f->phase == N_INT && f->a < ENG_CS_MAX_INT_DIGITS) {
            f->a++;
            return R_ACCEPT;
        }
        if (ch == '.' && !integer) {
            f->phase = N_FRAC0;
            return R_ACCEPT;
        }
        return R_END;
    case N_FRAC0:
        if (!digit)
            return R_REJECT;
        f->phase = N_FRAC;
        f->a = 1;
        return R_ACCEPT;
    default: /* N_FRAC */
        if (digit && f->a < ENG_CS_MAX_FRAC_DIGITS) {
            f->a++;
            return R_ACCEPT;
        }
        return R_END;
    }
}

/* ---- numbers with bounds or multiples ----
 * A bounded number node (ranged, multiple_of or max_frac set) keeps in its
 * frame: pend = the sign (0, 1 after '-'), a = the digits so far, lo / hi
 * = how those digits compare with the same-length prefix of int_lo /
 * int_hi (C_EQ, C_LT, C_GT), c = the same for frac_lo (bits 0-1) and
 * frac_hi (bits 2-3), b = the value so far modulo multiple_of, or, in the
 * fraction, 1 while a nonzero digit is still owed. A digit is accepted only
 * when some completion stays in bounds, so no accepted prefix is a dead
 * end. */
enum { C_EQ = 0, C_LT = 1, C_GT = 2 };

static bool num_bounded(const cs_node *n)
{
    return n->ranged || n->multiple_of > 0 || n->max_frac > 0;
}

static uint8_t cmp_digit(uint8_t state, int32_t k, const char *bound, uint8_t d)
{
    if (!bound || state != C_EQ || k > (int32_t)strlen(bound))
        return state;
    return d < (uint8_t)bound[k - 1] ? C_LT : d > (uint8_t)bound[k - 1] ? C_GT : C_EQ;
}

/* The fewest digits to append to k digits (comparing st_lo / st_hi with
 * lo / hi) so the magnitude ends in lo..hi (and a multiple of mult, from
 * the remainder rem), or -1 when none can. */
static int32_t range_more(int32_t k, int32_t max_digits, const char *lo, uint8_t st_lo,
                          const char *hi, uint8_t st_hi, int32_t mult, int32_t rem)
{
    int32_t ll = lo ? (int32_t)strlen(lo) : 1, lh = hi ? (int32_t)strlen(hi) : INT32_MAX;
    int64_t pow10 = 1; /* used with mult only, which keeps to 15 digits */
    for (int32_t e = 0; k + e <= max_digits;
         e++, pow10 = pow10 <= INT64_MAX / 10 ? pow10 * 10 : pow10) {
        int32_t len = k + e;
        if (len < ll)
            continue;
        if (len > lh)
            break;
        if (lo && len == ll && st_lo == C_LT)
            continue;
        if (len == lh && st_hi == C_GT)
            continue;
        if (mult > 0) {
            int64_t t = rem;
            for (int32_t i = 0; i < e; i++)
                t = t * 10 % mult;
            if ((mult - t) % mult >= pow10)
                continue;
        }
        return e;
    }
    return -1;
}

/* Bounds and a multiple together (integers only, every bound within the
 * 15 digits, so int64 holds them): the magnitude so far is kept whole in
 * b (low 32 bits) and c (high), and each length of completion is checked
 * for a multiple inside its interval. */
static int64_t num_value(const cs_frame *f)
{
    return (int64_t)(uint32_t)f->b | (int64_t)f->c << 32;
}

static int32_t ranged_multiple_more(const cs_node *n, const cs_frame *f)
{
    int s = f->pend;
    const char *lo = n->int_lo[s], *hi = n->int_hi[s];
    int32_t ll = (int32_t)strlen(lo), lh = hi ? (int32_t)strlen(hi) : INT32_MAX;
    int64_t lv = strtoll(lo, NULL, 10), hv = hi ? strtoll(hi, NULL, 10) : INT64_MAX;
    int64_t p = num_value(f), m = n->multiple_of, pow10 = 1;
    for (int32_t e = 0; f->a + e <= ENG_CS_MAX_INT_DIGITS; e++, pow10 *= 10) {
        int32_t len = f->a + e;
        if (len < ll)
            continue;
        if (len > lh)
            break;
        int64_t a = p * pow10, b = a + pow10 - 1;
        if (len == ll && a < lv)
            a = lv;
        if (len == lh && b > hv)
            b = hv;
        if (a <= b && (a + m - 1) / m * m <= b)
            return e;
    }
    return -1;
}

/* The integer part's most digits. */
static int32_t int_digits(const cs_node *n)
{
    return n->int_digits > 0 ? n->int_digits : ENG_CS_MAX_INT_DIGITS;
}

static int32_t int_more(const cs_node *n, const cs_frame *f)
{
    int s = f->pend;
    if (!n->ranged)
        return range_more(f->a, ENG_CS_MAX_INT_DIGITS, NULL, C_EQ, NULL, C_EQ, n->multiple_of,
                          f->b);
    if (!n->int_ok[s])
        return -1;
    if (n->multiple_of > 0)
        return ranged_multiple_more(n, f);
    return range_more(f->a, int_digits(n), n->int_lo[s], f->lo, n->int_hi[s], f->hi, 0, 0);
}

static int32_t frac_more(const cs_node *n, const cs_frame *f)
{
    int s = f->pend;
    if (n->kind != CS_NUMBER || n->multiple_of > 0)
        return -1;
    if (!n->ranged)
        return range_more(f->a, ENG_CS_MAX_INT_DIGITS, NULL, C_EQ, NULL, C_EQ, 0, 0);
    if (!n->frac_ok[s])
        return -1;
    return range_more(f->a, ENG_CS_MAX_INT_DIGITS, n->frac_lo[s], (uint8_t)(f->c & 3),
                      n->frac_hi[s], (uint8_t)(f->c >> 2 & 3), 0, 0);
}

/* The magnitude 0 may start a value of this sign: as a whole value, or as
 * the integer part of a fraction. */
static bool zero_ok(const cs_node *n, int s, bool *as_frac)
{
    *as_frac = n->kind == CS_NUMBER && n->multiple_of == 0 &&
               (!n->ranged || (n->frac_ok[s] && strcmp(n->frac_lo[s], "0") == 0));
    bool whole = !n->ranged || (n->int_ok[s] && strcmp(n->int_lo[s], "0") == 0);
    return whole || *as_frac;
}

static void num_digit(const cs_node *n, cs_frame *f, uint8_t d)
{
    int s = f->pend;
    int32_t k = f->a + 1;
    if (n->ranged && n->multiple_of > 0) {
        int64_t v = num_value(f) * 10 + (d - '0');
        f->b = (int32_t)(uint32_t)(v & 0xFFFFFFFF);
        f->c = (int32_t)(v >> 32);
    } else if (n->ranged) {
        f->lo = cmp_digit(f->lo, k, n->int_lo[s], d);
        f->hi = cmp_digit(f->hi, k, n->int_hi[s], d);
        uint8_t flo = cmp_digit((uint8_t)(f->c & 3), k, n->frac_lo[s], d);
        uint8_t fhi = cmp_digit((uint8_t)(f->c >> 2 & 3), k, n->frac_hi[s], d);
        f->c = flo | fhi << 2;
    } else if (n->multiple_of > 0) {
        f->b = (int32_t)(((int64_t)f->b * 10 + (d - '0')) % n->multiple_of);
    }
    f->a = k;
}

/* Entering the fraction after the integer part so far (zero: "0"). */
static bool num_enter_frac(const cs_node *n, cs_frame *f, bool zero)
{
    int s = f->pend;
    bool owed = false;
    if (zero) {
        bool as_frac;
        zero_ok(n, s, &as_frac);
        if (!as_frac)
            return false;
        owed = n->ranged && n->frac_nonzero[s];
    } else {
        if (frac_more(n, f) != 0)
            return false;
        /* exactly frac_lo: the fraction must be nonzero */
        owed = n->ranged && n->frac_nonzero[s] && f->a == (int32_t)strlen(n->frac_lo[s]) &&
               (f->c & 3) == C_EQ;
    }
    f->phase = N_FRAC0;
    f->a = 0;
    f->b = owed;
    return true;
}

static int step_bounded(const cs_node *n, cs_frame *f, uint8_t ch)
{
    bool digit = ch >= '0' && ch <= '9';
    int32_t max_frac = n->max_frac > 0 ? n->max_frac : ENG_CS_MAX_FRAC_DIGITS;
    switch (f->phase) {
    case N_START:
    case N_NEG:
        if (ch == '-' && f->phase == N_START) {
            if (n->ranged && !n->int_ok[1] && !n->frac_ok[1])
                return R_REJECT;
            f->phase = N_NEG;
            f->pend = 1;
            return R_ACCEPT;
        }
        if (!digit)
            return R_REJECT;
        if (ch == '0') {
            bool as_frac;
            if (!zero_ok(n, f->pend, &as_frac))
                return R_REJECT;
            f->phase = N_ZERO;
            return R_ACCEPT;
        }
        num_digit(n, f, ch);
        if (int_more(n, f) < 0 && frac_more(n, f) < 0)
            return R_REJECT;
        f->phase = N_INT;
        return R_ACCEPT;
    case N_ZERO: {
        if (ch == '.' && num_enter_frac(n, f, true))
            return R_ACCEPT;
        bool whole = !n->ranged || (n->int_ok[f->pend] && strcmp(n->int_lo[f->pend], "0") == 0);
        return whole ? R_END : R_REJECT;
    }
    case N_INT:
        if (digit && f->a < (n->ranged ? int_digits(n) : ENG_CS_MAX_INT_DIGITS)) {
            cs_frame next = *f;
            num_digit(n, &next, ch);
            if (int_more(n, &next) >= 0 || frac_more(n, &next) >= 0) {
                *f = next;
                return R_ACCEPT;
            }
        }
        if (ch == '.' && num_enter_frac(n, f, false))
            return R_ACCEPT;
        return int_more(n, f) == 0 ? R_END : R_REJECT;
    case N_FRAC0:
    default: /* N_FRAC */
        if (digit && f->a < max_frac) {
            /* the last place left must pay an owed nonzero digit */
            if (f->b && ch == '0' && f->a + 1 >= max_frac)
                return R_REJECT;
            if (ch != '0')
                f->b = 0;
            f->phase = N_FRAC;
            f->a++;
            return R_ACCEPT;
        }
        if (f->phase == N_FRAC0 || f->b)
            return R_REJECT;
        return R_END;
    }
}

static bool num_can_end(const cs_node *n, const cs_frame *f)
{
    if (!num_bounded(n))
        return f->phase == N_ZERO || f->phase == N_INT || f->phase == N_FRAC;
    switch (f->phase) {
    case N_ZERO: return !n->ranged || (n->int_ok[f->pend] && strcmp(n->int_lo[f->pend], "0") == 0);
    case N_INT: return int_more(n, f) == 0;
    case N_FRAC: return f->b == 0;
    default: return false;
    }
}

static int64_t num_min(const cs_node *n, const cs_frame *f)
{
    if (!num_bounded(n))
        return f->phase == N_START || f->phase == N_NEG || f->phase == N_FRAC0 ? 1 : 0;
    switch (f->phase) {
    case N_START: return n->min_bytes;
    case N_NEG: {
        /* as in json_schema.c's node minimum, for the negative side */
        int64_t best = CS_INF;
        if (!n->ranged || n->int_ok[1])
            best = n->ranged ? (int64_t)strlen(n->int_lo[1]) : 1;
        if (n->ranged && n->frac_ok[1] && (int64_t)strlen(n->frac_lo[1]) + 2 < best)
            best = (int64_t)strlen(n->frac_lo[1]) + 2;
        return best;
    }
    case N_ZERO: return num_can_end(n, f) ? 0 : 2;
    case N_INT: {
        int32_t i = int_more(n, f), r = frac_more(n, f);
        int64_t best = i >= 0 ? i : CS_INF;
        if (r >= 0 && r + 2 < best)
            best = r + 2;
        return best;
    }
    case N_FRAC0: return 1;
    default: return f->b ? 1 : 0;
    }
}

static bool same_prefix(const cs_node *n, int32_t j, int32_t c, int32_t b)
{
    return j == c || (n->lit_lens[j] >= b && memcmp(n->lits[j], n->lits[c], (size_t)b) == 0);
}

static int step_literal(const cs_node *n, cs_frame *f, uint8_t ch)
{
    int32_t b = f->b;
    bool can_end = false;
    for (int32_t j = 0; j < n->n_lits; j++) {
        if (!same_prefix(n, j, f->a, b))
            continue;
        if (n->lit_lens[j] == b) {
            can_end = true;
        } else if ((uint8_t)n->lits[j][b] == ch) {
            f->a = j;
            f->b = b + 1;
            return R_ACCEPT;
        }
    }
    return can_end ? R_END : R_REJECT;
}

static bool literal_can_end(const cs_node *n, const cs_frame *f)
{
    for (int32_t j = 0; j < n->n_lits; j++)
        if (n->lit_lens[j] == f->b && same_prefix(n, j, f->a, f->b))
            return true;
    return false;
}

/* The last key candidate in an object frame: keys a..(first required). */
static int32_t key_hi(const cs_node *n, int32_t a)
{
    int32_t r = n->next_req[a];
    return r < n->n_props ? r : n->n_props - 1;
}

static int64_t sat(int64_t x);

/* The node of an array's item i (prefixItems first). */
static int32_t array_item(const cs_node *n, int64_t i)
{
    return i < n->n_prefix ? n->prefix[i] : n->item;
}

/* Bytes of items from..to-1 at their shortest, each with its comma. */
static int64_t array_tail(const eng_grammar *g, const cs_node *n, int64_t from, int64_t to)
{
    int64_t sum = 0;
    for (; from < to && from < n->n_prefix; from++)
        sum = sat(sum + 1 + g->nodes[n->prefix[from]].min_bytes);
    if (from < to)
        sum = sat(sum + (to - from) * (1 + (int64_t)g->nodes[n->item].min_bytes));
    return sum;
}

static void run(const eng_grammar *g, cs_stack *st, uint8_t ch, cs_set *out);

/* A value of node starts with ch on top of st. */
static void enter(const eng_grammar *g, cs_stack *st, int32_t node, uint8_t ch, cs_set *out)
{
    const cs_node *n = &g->nodes[node];
    if (n->kind == CS_ANYOF) {
        for (int32_t i = 0; i < n->n_alts; i++) {
            cs_stack copy;
            stack_copy(&copy, st);
            enter(g, &copy, n->alts[i], ch, out);
        }
        return;
    }
    if (st->depth + (n->need_frames > 0 ? n->need_frames : 1) > ENG_CS_MAX_DEPTH)
        return;
    cs_frame *f = &st->f[st->depth++];
    memset(f, 0, sizeof *f);
    f->node = node;
    run(g, st, ch, out);
}

/* GBNF frames (gbnf_compile.c). CS_RAW: b is the automaton's state.
 * CS_SEQ: a is the child to come. CS_REP: a counts the iterations begun.
 * phase 0: just entered, so the byte must start a non-empty match (an
 * empty one is the parent's choice: a child with minimum 0 may be
 * skipped); 1: under way. Where the frame may end and also go on, the
 * stack forks. */

/* The frame ends and the byte goes to the frame below, on a copy. */
static void fork_end(const eng_grammar *g, const cs_stack *st, uint8_t ch, cs_set *out)
{
    cs_stack copy;
    stack_copy(&copy, st);
    copy.depth--;
    run(g, &copy, ch, out);
}

/* A copy of st whose top frame moved on to (phase 1, a) enters node;
 * tail: the frame has nothing left after it, so it is popped first. */
static void fork_enter(const eng_grammar *g, const cs_stack *st, int32_t a, bool tail,
                       int32_t node, uint8_t ch, cs_set *out)
{
    cs_stack copy;
    stack_copy(&copy, st);
    cs_frame *f = &copy.f[copy.depth - 1];
    f->phase = 1;
    f->a = a;
    if (tail)
        copy.depth--;
    enter(g, &copy, node, ch, out);
}

/* Returns true when the byte goes on to the frame below (st popped). */
static bool run_gbnf(const eng_grammar *g, const cs_node *n, cs_stack *st, uint8_t ch,
                     cs_set *out)
{
    cs_frame *f = &st->f[st->depth - 1];
    bool fresh = f->phase == 0;
    switch (n->kind) {
    case CS_RAW: {
        int32_t from = fresh ? eng_regex_start(n->re) : f->b;
        int32_t to = eng_regex_step(n->re, from, ch);
        if (!fresh && eng_regex_accepting(n->re, from)) {
            if (to < 0) {
                st->depth--;
                return true;
            }
            fork_end(g, st, ch, out);
        }
        if (to < 0)
            return false;
        f->phase = 1;
        f->b = to;
        push_out(g, out, st);
        return false;
    }
    case CS_SEQ:
        for (int32_t i = f->a; i < n->n_seq; i++) {
            fork_enter(g, st, i + 1, i + 1 == n->n_seq, n->seq[i], ch, out);
            if (g->nodes[n->seq[i]].min_bytes > 0)
                return false;
        }
        if (fresh)
            return false;
        st->depth--; /* the rest may be empty */
        return true;
    case CS_REP:
        if (n->max_items < 0 || f->a < n->max_items)
            fork_enter(g, st, f->a + 1, f->a + 1 == n->max_items, n->item, ch, out);
        if (fresh || (f->a < n->min_items && g->nodes[n->item].min_bytes > 0))
            return false;
        st->depth--;
        return true;
    default: return false;
    }
}

static void run(const eng_grammar *g, cs_stack *st, uint8_t ch, cs_set *out)
{
    for (;;) {
        if (st->depth <= 0)
            return;
        cs_frame *f = &st->f[st->depth - 1];
        if (f->node < 0) {
            if (f->phase == 0) {
                f->phase = 1;
                enter(g, st, g->root, ch, out);
            }
            return;
        }
        const cs_node *n = &g->nodes[f->node];
        int r;
        switch (n->kind) {
        case CS_STRING:
        case CS_PATTERN:
            r = n->kind == CS_PATTERN ? step_pattern(n, f, ch) : step_string(n, f, ch);
            if (r == R_REJECT)
                return;
            if (r == R_DONE)
                st->depth--;
            push_out(g, out, st);
            return;
        case CS_NUMBER:
        case CS_INTEGER:
        case CS_LITERALS:
            r = n->kind == CS_LITERALS ? step_literal(n, f, ch)
                : num_bounded(n)       ? step_bounded(n, f, ch)
                                       : step_number(n->kind == CS_INTEGER, f, ch);
            if (r == R_REJECT)
                return;
            if (r == R_ACCEPT) {
                push_out(g, out, st);
                return;
            }
            st->depth--; /* R_END: the byte belongs to the frame below */
            continue;
        case CS_OBJECT:
            switch (f->phase) {
            case O_START:
                if (ch == '{') {
                    f->phase = O_FIRST;
                    push_out(g, out, st);
                }
                return;
            case O_FIRST:
            case O_KEYSTART:
                if (ch == '}' && f->phase == O_FIRST) {
                    if (n->next_req[0] == n->n_props) {
                        st->depth--;
                        push_out(g, out, st);
                    }
                    return;
                }
                if (ch != '"' || f->a >= n->n_props)
                    return;
                f->phase = O_KEY;
                f->c = f->a;
                f->b = 1;
                push_out(g, out, st);
                return;
            case O_KEY: {
                int32_t hi = key_hi(n, f->a), b = f->b;
                for (int32_t j = f->a; j <= hi; j++) {
                    if (n->key_lens[j] <= b || (uint8_t)n->keys[j][b] != ch ||
                        (j != f->c && memcmp(n->keys[j], n->keys[f->c], (size_t)b) != 0))
                        continue;
                    f->c = j;
                    f->b = b + 1;
                    if (f->b == n->key_lens[j])
                        f->phase = O_VALUE;
                    push_out(g, out, st);
                    return;
                }
                return;
            }
            case O_VALUE:
                f->phase = O_AFTER;
                f->a = f->c + 1;
                enter(g, st, n->children[f->c], ch, out);
                return;
            default: /* O_AFTER */
                if (ch == ',' && f->a < n->n_props) {
                    f->phase = O_KEYSTART;
                    push_out(g, out, st);
                } else if (ch == '}' && n->next_req[f->a] == n->n_props) {
                    st->depth--;
                    push_out(g, out, st);
                }
                return;
            }
        case CS_ANYOBJ:
            switch (f->phase) {
            case A_START:
                if (ch == '{') {
                    f->phase = A_FIRST;
                    push_out(g, out, st);
                }
                return;
            case A_FIRST:
            case A_KEY:
                if (ch == '}' && f->phase == A_FIRST) {
                    if (!n->counted || n->min_items == 0) {
                        st->depth--;
                        push_out(g, out, st);
                    }
                    return;
                }
                if (n->counted && f->b >= n->max_items)
                    return;
                f->phase = A_COLON;
                f->b++; /* entries begun */
                enter(g, st, n->key_node, ch, out);
                return;
            case A_COLON:
                if (ch == ':') {
                    f->phase = A_VALUE;
                    push_out(g, out, st);
                }
                return;
            case A_VALUE:
                f->phase = A_AFTER;
                enter(g, st, n->item, ch, out);
                return;
            default: /* A_AFTER */
                if (ch == ',' && (!n->counted || f->b < n->max_items)) {
                    f->phase = A_KEY;
                    push_out(g, out, st);
                } else if (ch == '}') {
                    st->depth--;
                    push_out(g, out, st);
                }
                return;
            }
        case CS_ARRAY:
            switch (f->phase) {
            case R_START:
                if (ch == '[') {
                    f->phase = R_FIRST;
                    push_out(g, out, st);
                }
                return;
            case R_FIRST:
                if (ch == ']') {
                    if (n->min_items == 0) {
                        st->depth--;
                        push_out(g, out, st);
                    }
                    return;
                }
                if (n->max_items == 0)
                    return;
                f->phase = R_AFTER;
                f->a = 1;
                enter(g, st, array_item(n, 0), ch, out);
                return;
            case R_NEXT:
                f->phase = R_AFTER;
                f->a++;
                enter(g, st, array_item(n, f->a - 1), ch, out);
                return;
            default: /* R_AFTER */
                if (ch == ',' && f->a < n->max_items) {
                    f->phase = R_NEXT;
                    push_out(g, out, st);
                } else if (ch == ']' && f->a >= n->min_items) {
                    st->depth--;
                    push_out(g, out, st);
                }
                return;
            }
        case CS_RAW:
        case CS_SEQ:
        case CS_REP:
            if (run_gbnf(g, n, st, ch, out))
                continue;
            return;
        case CS_ANYOF:
            return; /* never on a stack: enter() forks instead */
        }
        return;
    }
}

static void set_step(const eng_grammar *g, const cs_set *in, uint8_t ch, cs_set *out)
{
    out->n = 0;
    for (int32_t i = 0; i < in->n; i++) {
        cs_stack tmp;
        stack_copy(&tmp, &in->s[i]);
        run(g, &tmp, ch, out);
    }
}

static int64_t sat(int64_t x)
{
    return x > CS_INF ? CS_INF : x;
}

static int64_t frame_min(const eng_grammar *g, const cs_frame *f)
{
    if (f->node < 0)
        return f->phase == 0 ? g->nodes[g->root].min_bytes : 0;
    const cs_node *n = &g->nodes[f->node];
    switch (n->kind) {
    case CS_STRING: {
        int64_t need = n->min_chars > f->a ? n->min_chars - f->a : 0;
        if (f->phase == S_START)
            return 2 + (int64_t)n->min_chars;
        if (f->phase == S_ESC)
            return 1 + need + 1;
        return f->pend + need + 1;
    }
    case CS_NUMBER:
    case CS_INTEGER:
        return num_min(n, f);
    case CS_LITERALS: {
        int64_t best = CS_INF;
        for (int32_t j = 0; j < n->n_lits; j++)
            if (n->lit_lens[j] >= f->b && same_prefix(n, j, f->a, f->b) &&
                n->lit_lens[j] - f->b < best)
                best = n->lit_lens[j] - f->b;
        return best;
    }
    case CS_OBJECT: {
        int32_t a = f->a;
        switch (f->phase) {
        case O_START: return n->min_bytes;
        case O_FIRST: return (n->next_req[a] < n->n_props ? n->req_from[a] - 1 : 0) + 1;
        case O_KEYSTART:
            return (n->next_req[a] < n->n_props ? n->req_from[a] - 1 : n->any_from[a]) + 1;
        case O_KEY: {
            int64_t best = CS_INF;
            int32_t hi = key_hi(n, a);
            for (int32_t j = a; j <= hi; j++) {
                if (n->key_lens[j] < f->b ||
                    (j != f->c && memcmp(n->keys[j], n->keys[f->c], (size_t)f->b) != 0))
                    continue;
                int64_t m = (int64_t)(n->key_lens[j] - f->b) +
                            g->nodes[n->children[j]].min_bytes + n->req_from[j + 1];
                if (m < best)
                    best = m;
            }
            return sat(best + 1);
        }
        case O_VALUE:
            return (int64_t)g->nodes[n->children[f->c]].min_bytes + n->req_from[f->c + 1] + 1;
        default: return (int64_t)n->req_from[a] + 1;
        }
    }
    case CS_ANYOBJ: {
        int64_t im = g->nodes[n->item].min_bytes;
        switch (f->phase) {
        case A_START: return n->min_bytes;
        case A_FIRST:
            /* one entry owed: a key, ':', a value, '}' */
            return n->counted && n->min_items > 0
                       ? sat((int64_t)g->nodes[n->key_node].min_bytes + 1 + im + 1)
                       : 1;
        case A_COLON: return 1 + im + 1;
        case A_VALUE: return im + 1;
        case A_AFTER: return 1;
        default: /* A_KEY: a key of key_node (propertyNames may make it long) */
            return sat((int64_t)g->nodes[n->key_node].min_bytes + 1 + im + 1);
        }
    }
    case CS_ARRAY: {
        int64_t lo = n->min_items;
        switch (f->phase) {
        case R_START: return n->min_bytes;
        case R_FIRST: return lo == 0 ? 1 : sat(array_tail(g, n, 0, lo) - 1 + 1);
        case R_AFTER: return sat(array_tail(g, n, f->a, lo) + 1);
        default: /* R_NEXT: item f->a is next, its comma written */
            return sat(g->nodes[array_item(n, f->a)].min_bytes +
                       array_tail(g, n, f->a + 1, lo) + 1);
        }
    }
    case CS_PATTERN: return pattern_min(n, f);
    case CS_RAW: return f->phase ? eng_regex_costs_get(n->re_costs, f->b, 0) : n->min_bytes;
    case CS_SEQ: return n->seq_from[f->a];
    case CS_REP:
        return f->a < n->min_items
                   ? sat((int64_t)(n->min_items - f->a) * g->nodes[n->item].min_bytes)
                   : 0;
    case CS_ANYOF: break;
    }
    return 0;
}

static int64_t stack_min(const eng_grammar *g, const cs_stack *st)
{
    int64_t m = 0;
    for (int32_t i = 0; i < st->depth; i++)
        m = sat(m + frame_min(g, &st->f[i]));
    return m;
}

static int64_t set_min(const eng_grammar *g, const cs_set *s)
{
    int64_t best = CS_INF;
    for (int32_t i = 0; i < s->n; i++) {
        int64_t m = stack_min(g, &s->s[i]);
        if (m < best)
            best = m;
    }
    return best;
}

static bool stack_complete(const eng_grammar *g, const cs_stack *st)
{
    int32_t d = st->depth;
    while (d > 1) {
        const cs_frame *f = &st->f[d - 1];
        const cs_node *n = &g->nodes[f->node];
        bool can_end = false;
        if (n->kind == CS_LITERALS)
            can_end = literal_can_end(n, f);
        else if (n->kind == CS_NUMBER || n->kind == CS_INTEGER)
            can_end = num_can_end(n, f);
        else if (n->kind == CS_RAW)
            can_end = eng_regex_accepting(n->re, f->b);
        else if (n->kind == CS_SEQ || n->kind == CS_REP)
            can_end = frame_min(g, f) == 0;
        if (!can_end)
            return false;
        d--;
    }
    /* the root done, or not begun with a grammar that allows nothing */
    return d == 1 && (st->f[0].phase == 1 || g->nodes[g->root].min_bytes == 0);
}

static bool set_complete(const eng_grammar *g, const cs_set *s)
{
    for (int32_t i = 0; i < s->n; i++)
        if (stack_complete(g, &s->s[i]))
            return true;
    return false;
}

/* ---- the constraint ------------------------------------------------------ */

/* Allocated up front, so masks allocate nothing. */
static int pat_cache_create(eng_constraint *c)
{
    bool patterns = false;
    for (int32_t i = 0; i < c->g->n_nodes; i++)
        patterns |= c->g->nodes[i].kind == CS_PATTERN || c->g->nodes[i].kind == CS_RAW;
    if (!patterns || c->v->n_plain == 0)
        return SW_OK;
    if (!(c->pcache = sw_calloc(CS_PAT_SLOTS, sizeof *c->pcache)))
        return SW_ENOMEM;
    size_t words = ((size_t)c->v->n_tokens + 31) / 32;
    for (int i = 0; i < CS_PAT_SLOTS; i++) {
        c->pcache[i].node = -1;
        if (!(c->pcache[i].e = sw_malloc((size_t)c->v->n_plain * sizeof *c->pcache[i].e)) ||
            !(c->pcache[i].bits = sw_malloc(words * sizeof *c->pcache[i].bits)))
            return SW_ENOMEM;
    }
    return SW_OK;
}

static void pat_cache_free(eng_constraint *c)
{
    for (int i = 0; c->pcache && i < CS_PAT_SLOTS; i++) {
        sw_free(c->pcache[i].e);
        sw_free(c->pcache[i].bits);
    }
    sw_free(c->pcache);
}

typedef struct list_walk {
    const cs_trie *t;
    const eng_regex *re;
    bool raw;
    cs_pat_cache *slot;
} list_walk;

/* Every token under trie node `node` (itself excluded) as undecided. */
static void list_undecided(list_walk *lw, uint32_t node)
{
    const cs_trie *t = lw->t;
    for (uint32_t ch = t->nodes[node].first_child; ch; ch = t->nodes[ch].next) {
        const cs_tnode *tn = &t->nodes[ch];
        for (uint32_t k = 0; k < tn->tok_count; k++)
            lw->slot->e[lw->slot->n++] = (cs_pat_entry){t->ids[tn->tok_begin + k],
                                                        CS_PAT_UNDECIDED, 0};
        list_undecided(lw, ch);
    }
}

/* The plain tokens under trie node `node`, reached in automaton state
 * `state` after `bytes` bytes and `chars` code points. */
static void list_walk_node(list_walk *lw, uint32_t node, int32_t state, int32_t bytes,
                           int32_t chars)
{
    if (lw->raw && bytes > 0 && eng_regex_accepting(lw->re, state)) {
        list_undecided(lw, node);
        return;
    }
    const cs_trie *t = lw->t;
    for (uint32_t ch = t->nodes[node].first_child; ch; ch = t->nodes[ch].next) {
        const cs_tnode *tn = &t->nodes[ch];
        int32_t to = eng_regex_step(lw->re, state, tn->byte);
        if (to < 0)
            continue;
        int32_t c2 = chars + ((tn->byte & 0xC0) != 0x80);
        for (uint32_t k = 0; k < tn->tok_count; k++)
            lw->slot->e[lw->slot->n++] = (cs_pat_entry){t->ids[tn->tok_begin + k], to, c2};
        if (tn->first_child)
            list_walk_node(lw, ch, to, bytes + 1, c2);
    }
}

/* The slot's mask (cs_pat_cache.fast), after its list is built. */
static void pat_cache_bits(const eng_constraint *c, const cs_node *n, cs_pat_cache *slot)
{
    slot->fast = n->kind == CS_RAW || n->max_chars == INT32_MAX;
    slot->n_bits = 0;
    slot->max_cost = 0;
    if (!slot->fast)
        return;
    memset(slot->bits, 0, ((size_t)c->v->n_tokens + 31) / 32 * sizeof *slot->bits);
    for (int32_t i = 0; i < slot->n; i++) {
        const cs_pat_entry *e = &slot->e[i];
        if (e->state == CS_PAT_UNDECIDED) {
            slot->fast = false;
            return;
        }
        int64_t m = eng_regex_costs_get(n->re_costs, e->state, n->kind == CS_RAW ? 0 : n->min_chars);
        if (m < 0)
            continue;
        slot->bits[e->id >> 5] |= 1u << (e->id & 31);
        slot->n_bits++;
        if (m > slot->max_cost)
            slot->max_cost = m;
    }
}

/* ORs a slot's mask into mask. */
static void pat_cache_or(const eng_constraint *c, const cs_pat_cache *slot, uint32_t *mask,
                         int32_t *count)
{
    size_t words = ((size_t)c->v->n_tokens + 31) / 32;
    for (size_t i = 0; i < words; i++)
        mask[i] |= slot->bits[i];
    *count += slot->n_bits;
}

/* The list for (node, state), built the first time it is asked for. */
static const cs_pat_cache *pat_cache_get(eng_constraint *c, int32_t node, int32_t state)
{
    cs_pat_cache *slot = NULL, *lru = &c->pcache[0];
    for (int i = 0; i < CS_PAT_SLOTS; i++) {
        if (c->pcache[i].node == node && c->pcache[i].state == state)
            slot = &c->pcache[i];
        if (c->pcache[i].used < lru->used)
            lru = &c->pcache[i];
    }
    if (!slot) {
        slot = lru;
        slot->node = node;
        slot->state = state;
        slot->n = 0;
        const cs_node *n = &c->g->nodes[node];
        list_walk lw = {&c->v->plain, n->re, n->kind == CS_RAW, slot};
        list_walk_node(&lw, 0, state, 0, 0);
        pat_cache_bits(c, n, slot);
    }
    slot->used = ++c->ptick;
    return slot;
}

/* The plain tokens of a pattern frame from its state's list; false when
 * the frame is inside a character (or there are no lists): walk them. */
static bool pattern_plain_mask(eng_constraint *c, const cs_frame *f, int64_t base_rest,
                               int64_t budget_after, uint32_t *mask, int32_t *count)
{
    const cs_node *n = &c->g->nodes[f->node];
    if (!c->pcache || eng_regex_pending(n->re, f->b) != 0)
        return false;
    const cs_pat_cache *slot = pat_cache_get(c, f->node, f->b);
    if (slot->fast && f->a >= n->min_chars && base_rest + slot->max_cost + 1 <= budget_after) {
        pat_cache_or(c, slot, mask, count);
        return true;
    }
    for (int32_t i = 0; i < slot->n; i++) {
        const cs_pat_entry *e = &slot->e[i];
        int64_t a = (int64_t)f->a + e->chars;
        if (a > n->max_chars)
            continue;
        int64_t m = eng_regex_costs_get(n->re_costs, e->state, a);
        if (m < 0 || base_rest + m + 1 > budget_after)
            continue;
        mask[e->id >> 5] |= 1u << (e->id & 31);
        (*count)++;
    }
    return true;
}

int eng_constraint_create(const eng_grammar *g, const eng_cs_vocab *v, eng_constraint **out,
                          sw_error *err)
{
    if (!g || !v || !out || g->root < 0)
        return sw_error_set(err, SW_EINVAL, "eng_constraint_create: NULL argument");
    eng_constraint *c = sw_calloc(1, sizeof *c);
    if (!c)
        return sw_error_set(err, SW_ENOMEM, "out of memory starting a constraint");
    c->g = g;
    c->v = v;
    c->scratch = sw_malloc(((size_t)v->max_len + 2) * sizeof *c->scratch);
    c->mask = sw_calloc(((size_t)v->n_tokens + 31) / 32, sizeof *c->mask);
    if (!c->scratch || !c->mask || pat_cache_create(c)) {
        eng_constraint_free(c);
        return sw_error_set(err, SW_ENOMEM, "out of memory starting a constraint");
    }
    c->state.n = 1;
    c->state.s[0].depth = 1;
    memset(&c->state.s[0].f[0], 0, sizeof c->state.s[0].f[0]);
    c->state.s[0].f[0].node = -1;
    *out = c;
    return SW_OK;
}

void eng_constraint_free(eng_constraint *c)
{
    if (!c)
        return;
    sw_free(c->scratch);
    sw_free(c->mask);
    pat_cache_free(c);
    sw_free(c);
}

bool eng_constraint_feed(eng_constraint *c, const char *bytes, size_t n)
{
    /* scratch[0] and [1] alternate; the state changes only on success. */
    const cs_set *cur = &c->state;
    for (size_t i = 0; i < n; i++) {
        cs_set *next = &c->scratch[i & 1];
        set_step(c->g, cur, (uint8_t)bytes[i], next);
        if (next->n == 0)
            return false;
        cur = next;
    }
    if (cur != &c->state) {
        c->state.n = cur->n;
        for (int32_t i = 0; i < cur->n; i++)
            stack_copy(&c->state.s[i], &cur->s[i]);
    }
    return true;
}

bool eng_constraint_is_end_token(const eng_constraint *c, int32_t token)
{
    return token >= 0 && token < c->v->n_tokens && c->v->is_end[token];
}

bool eng_constraint_accept_token(eng_constraint *c, int32_t token)
{
    if (token < 0 || token >= c->v->n_tokens)
        return false;
    if (c->v->is_end[token])
        return eng_constraint_is_complete(c);
    if (c->v->len[token] <= 0)
        return false;
    return eng_constraint_feed(c, c->v->blob + c->v->off[token], (size_t)c->v->len[token]);
}

bool eng_constraint_is_complete(const eng_constraint *c)
{
    return set_complete(c->g, &c->state);
}

bool eng_constraint_is_closed(const eng_constraint *c)
{
    if (!set_complete(c->g, &c->state))
        return false;
    for (int ch = 0; ch < 256; ch++) {
        set_step(c->g, &c->state, (uint8_t)ch, &c->scratch[0]);
        if (c->scratch[0].n > 0)
            return false;
    }
    return true;
}

int64_t eng_constraint_min_bytes(const eng_constraint *c)
{
    return set_complete(c->g, &c->state) ? 0 : set_min(c->g, &c->state);
}

typedef struct walk_ctx {
    eng_constraint *c;
    const cs_trie *t;
    int64_t budget_after;
    uint32_t *mask;
    int32_t count;
} walk_ctx;

/* Every token that ends at trie node tn goes into the mask. */
static inline void allow_tokens(walk_ctx *w, const cs_tnode *tn)
{
    for (uint32_t k = 0; k < tn->tok_count; k++) {
        int32_t id = w->t->ids[tn->tok_begin + k];
        w->mask[id >> 5] |= 1u << (id & 31);
        w->count++;
    }
}

static void walk(walk_ctx *w, uint32_t node, int32_t depth)
{
    const cs_trie *t = w->t;
    const cs_set *cur = &w->c->scratch[depth];
    cs_set *next = &w->c->scratch[depth + 1];
    for (uint32_t ch = t->nodes[node].first_child; ch; ch = t->nodes[ch].next) {
        const cs_tnode *tn = &t->nodes[ch];
        set_step(w->c->g, cur, tn->byte, next);
        if (next->n == 0)
            continue;
        if (tn->tok_count && set_min(w->c->g, next) <= w->budget_after)
            allow_tokens(w, tn);
        if (tn->first_child)
            walk(w, ch, depth + 1);
    }
}

/* Plain tokens (ordinary string characters) decided by their length alone:
 * in a string, or in a pattern string that has matched for good. */
static bool plain_by_length(const cs_node *n, const cs_frame *top)
{
    if (n->kind == CS_STRING)
        return top->phase == S_IN && top->pend == 0;
    return n->kind == CS_PATTERN && top->phase == S_IN && eng_regex_pending(n->re, top->b) == 0 &&
           eng_regex_universal(n->re, top->b);
}

/* Inside a pattern string (one stack, its top frame CS_PATTERN in S_IN):
 * the trie is walked with a copy of that frame alone while the bytes are
 * content (no stack copies per byte); a quote or a backslash goes back to
 * the general walk, from the full state rebuilt at that trie node.
 * base_rest: the shortest completion of the frames below. */
static void walk_pattern(walk_ctx *w, uint32_t node, int32_t depth, const cs_frame *f,
                         int64_t base_rest)
{
    const cs_trie *t = w->t;
    const cs_node *n = &w->c->g->nodes[f->node];
    for (uint32_t ch = t->nodes[node].first_child; ch; ch = t->nodes[ch].next) {
        const cs_tnode *tn = &t->nodes[ch];
        if (tn->byte == '"' || tn->byte == '\\') {
            cs_set *cur = &w->c->scratch[depth], *next = &w->c->scratch[depth + 1];
            cur->n = 1;
            stack_copy(&cur->s[0], &w->c->state.s[0]);
            cur->s[0].f[cur->s[0].depth - 1] = *f;
            set_step(w->c->g, cur, tn->byte, next);
            if (next->n == 0)
                continue;
            if (tn->tok_count && set_min(w->c->g, next) <= w->budget_after)
                allow_tokens(w, tn);
            if (tn->first_child)
                walk(w, ch, depth + 1);
            continue;
        }
        cs_frame f2 = *f;
        if (step_pattern(n, &f2, tn->byte) != R_ACCEPT)
            continue;
        if (tn->tok_count && base_rest + pattern_min(n, &f2) <= w->budget_after)
            allow_tokens(w, tn);
        if (tn->first_child)
            walk_pattern(w, ch, depth + 1, &f2, base_rest);
    }
}

/* Whether token id (not an end token) is accepted from the state with
 * its shortest completion within budget_after: fed through the full
 * state (scratch[0] and [1]). */
static bool token_fits(eng_constraint *c, int32_t id, int64_t budget_after)
{
    const cs_set *cur = &c->state;
    const uint8_t *p = (const uint8_t *)c->v->blob + c->v->off[id];
    for (int32_t k = 0; k < c->v->len[id]; k++) {
        cs_set *next = &c->scratch[k & 1];
        set_step(c->g, cur, p[k], next);
        if (next->n == 0)
            return false;
        cur = next;
    }
    return set_min(c->g, cur) <= budget_after;
}

/* The plain tokens of a CS_RAW frame that cannot end here, from its
 * state's list; false where it could end (or there are no lists): walk
 * them. */
static bool raw_plain_mask(eng_constraint *c, const cs_frame *f, int64_t base_rest,
                           int64_t budget_after, uint32_t *mask, int32_t *count)
{
    const cs_node *n = &c->g->nodes[f->node];
    if (!c->pcache || eng_regex_accepting(n->re, f->b))
        return false;
    const cs_pat_cache *slot = pat_cache_get(c, f->node, f->b);
    if (slot->fast && base_rest + slot->max_cost <= budget_after) {
        pat_cache_or(c, slot, mask, count);
        return true;
    }
    for (int32_t i = 0; i < slot->n; i++) {
        const cs_pat_entry *e = &slot->e[i];
        bool ok = e->state == CS_PAT_UNDECIDED
                      ? token_fits(c, e->id, budget_after)
                      : base_rest + eng_regex_costs_get(n->re_costs, e->state, 0) <= budget_after;
        if (ok) {
            mask[e->id >> 5] |= 1u << (e->id & 31);
            (*count)++;
        }
    }
    return true;
}

/* Inside a GBNF automaton (one stack, its top frame CS_RAW): while the
 * automaton cannot end there, a byte only steps it, so the trie is walked
 * with a copy of that frame alone (one table lookup per trie node, no
 * stack copies); where it could end (the byte may belong to the frames
 * below) the general walk takes over from the full state. */
static void walk_raw(walk_ctx *w, uint32_t node, int32_t depth, const cs_frame *f,
                     int64_t base_rest)
{
    const cs_node *n = &w->c->g->nodes[f->node];
    if (eng_regex_accepting(n->re, f->b)) {
        cs_set *cur = &w->c->scratch[depth];
        cur->n = 1;
        stack_copy(&cur->s[0], &w->c->state.s[0]);
        cur->s[0].f[cur->s[0].depth - 1] = *f;
        walk(w, node, depth);
        return;
    }
    const cs_trie *t = w->t;
    for (uint32_t ch = t->nodes[node].first_child; ch; ch = t->nodes[ch].next) {
        const cs_tnode *tn = &t->nodes[ch];
        int32_t to = eng_regex_step(n->re, f->b, tn->byte);
        if (to < 0)
            continue;
        cs_frame f2 = *f;
        f2.b = to;
        if (tn->tok_count && base_rest + eng_regex_costs_get(n->re_costs, to, 0) <= w->budget_after)
            allow_tokens(w, tn);
        if (tn->first_child)
            walk_raw(w, ch, depth + 1, &f2, base_rest);
    }
}

int32_t eng_constraint_mask(eng_constraint *c, int64_t remaining_tokens, uint32_t *mask)
{
    const eng_cs_vocab *v = c->v;
    const eng_grammar *g = c->g;
    memset(mask, 0, ((size_t)v->n_tokens + 31) / 32 * sizeof *mask);
    walk_ctx w = {c, &v->full, remaining_tokens - 1, mask, 0};
    if (remaining_tokens > 0) {
        cs_set *s0 = &c->scratch[0];
        s0->n = c->state.n;
        for (int32_t i = 0; i < c->state.n; i++)
            stack_copy(&s0->s[i], &c->state.s[i]);
        const cs_stack *only = &c->state.s[0];
        const cs_frame *top = &only->f[only->depth - 1];
        if (c->state.n == 1 && top->node >= 0 && plain_by_length(&g->nodes[top->node], top)) {
            /* Inside a string: ordinary characters keep it open; decide
             * those tokens by their length alone, walk the others. */
            const cs_node *n = &g->nodes[top->node];
            int64_t room = (int64_t)n->max_chars - top->a;
            int64_t need = n->min_chars > top->a ? n->min_chars - top->a : 0;
            int64_t base = stack_min(g, only);
            if (room >= v->max_plain_chars && need == 0 && base <= w.budget_after) {
                /* every plain token fits: the precomputed mask */
                size_t words = ((size_t)v->n_tokens + 31) / 32;
                for (size_t i = 0; i < words; i++)
                    mask[i] |= v->plain_bits[i];
                w.count += v->n_plain;
            } else {
                for (int32_t i = 0; i < v->n_plain; i++) {
                    int64_t k = v->plain_chars[i];
                    if (k > room || base - (k < need ? k : need) > w.budget_after)
                        continue;
                    int32_t id = v->plain_ids[i];
                    mask[id >> 5] |= 1u << (id & 31);
                    w.count++;
                }
            }
            w.t = &v->special;
        }
        if (c->state.n == 1 && top->node >= 0 && g->nodes[top->node].kind == CS_PATTERN &&
            top->phase == S_IN && w.t == &v->full) {
            int64_t rest = stack_min(g, only) - frame_min(g, top);
            if (pattern_plain_mask(c, top, rest, w.budget_after, mask, &w.count))
                w.t = &v->special;
            walk_pattern(&w, 0, 0, top, rest);
        } else if (c->state.n == 1 && top->node >= 0 && g->nodes[top->node].kind == CS_RAW) {
            int64_t rest = stack_min(g, only) - frame_min(g, top);
            if (raw_plain_mask(c, top, rest, w.budget_after, mask, &w.count))
                w.t = &v->special;
            walk_raw(&w, 0, 0, top, rest);
        } else {
            walk(&w, 0, 0);
        }
    }
    if (set_complete(g, &c->state)) {
        for (int32_t i = 0; i < v->n_end; i++) {
            int32_t id = v->end_ids[i];
            mask[id >> 5] |= 1u << (id & 31);
            w.count++;
        }
    }
    return w.count;
}

int eng_constraint_sample(eng_constraint *c, eng_sampler *s, float *logits, int32_t n_logits,
                          const int32_t *history, size_t n_history, int64_t remaining_tokens,
                          int32_t *token_out, bool *is_end, sw_error *err)
{
    const eng_cs_vocab *v = c->v;
    int32_t allowed = eng_constraint_mask(c, remaining_tokens, c->mask);
    if (allowed == 0)
        return sw_error_set(err, SW_EINVAL,
                            "no token can continue the constrained output within the budget");
    eng_sampler_mask_logits(logits, n_logits, c->mask, v->n_tokens);
    int32_t tok = eng_sampler_sample(s, logits, history, n_history);
    if (tok < 0 || tok >= v->n_tokens || !(c->mask[tok >> 5] >> (tok & 31) & 1u)) {
        /* Only possible with non-finite logits everywhere: the first
         * allowed token keeps the output valid. */
        for (tok = 0; tok < v->n_tokens; tok++)
            if (c->mask[tok >> 5] >> (tok & 31) & 1u)
                break;
    }
    bool end = v->is_end[tok] != 0;
    if (!eng_constraint_accept_token(c, tok))
        return sw_error_set(err, SW_EINTERNAL, "an allowed token was refused by the automaton");
    *token_out = tok;
    if (is_end)
        *is_end = end;
    return SW_OK;
}
