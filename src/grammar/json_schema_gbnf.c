/* json_schema_gbnf.c - a compiled JSON schema (json_schema.h) written as
 * a GBNF grammar of exactly the text the constraint automaton
 * (constrain.c) lets through: compact JSON, properties in their order,
 * the same string escapes and number digits.
 *
 * Why: an engine that takes GBNF but not spillway's schemas
 * (llama-server's `grammar`) then generates the language a spillway
 * worker generates, and gbnf.h's derivative of it continues a stream
 * another engine started under the same schema.
 *
 * One rule per node reached from the root (n<index>), with helper rules
 * for an object's properties from a place on (n<i>-f-<j> before any, and
 * n<i>-r-<j> after one: each property is written or, when optional,
 * skipped; a required one cannot be) and an array's items from a place
 * on (n<i>-a-<k>: the prefix items, then the repeated item with the
 * counts left). Numbers with bounds are written digit by digit (the
 * classic range-to-pattern split), pattern strings as their automaton
 * (a rule per state). Numbers with a multiple have no form here yet:
 * SW_EUNSUPPORTED names them, and what would be too large. The automaton's other
 * narrowing, at most ENG_CS_MAX_ALTS readings at once, is not written:
 * the grammar is the language without it.
 */
#include "grammar/json_schema.h"

#include "common/alloc.h"
#include "grammar/constrain-impl.h"
#include "grammar/gbnf-print.h"
#include "grammar/regex.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Counts the GBNF parsers take ({m,n} up to gbnf.h's ENG_GBNF_MAX_COUNT). */
#define JG_MAX_COUNT 10000

typedef struct jg_writer {
    const eng_grammar *g;
    eng__gb_out o;
    uint8_t *reached; /* n_nodes */
    int rc;
    sw_error *err;
} jg_writer;

static int jg_fail(jg_writer *w, int code, const char *what, int32_t node)
{
    if (!w->rc) {
        w->rc = code;
        sw_error_set(w->err, code, "grammar: %s (node %d) has no GBNF form", what, (int)node);
    }
    return code;
}

static void put_name(jg_writer *w, int32_t node, const char *suffix, int32_t j)
{
    char b[64];
    if (suffix)
        snprintf(b, sizeof b, "n%d-%s-%d", (int)node, suffix, (int)j);
    else
        snprintf(b, sizeof b, "n%d", (int)node);
    eng__gb_str(&w->o, b);
}

/* A JSON text (a key with its quotes and colon, a literal) as a GBNF
 * literal; its bytes must be UTF-8. */
static void put_literal(jg_writer *w, const char *s, int32_t len, int32_t node)
{
    eng__gb_str(&w->o, "\"");
    const uint8_t *p = (const uint8_t *)s;
    for (int32_t i = 0; i < len;) {
        uint32_t cp;
        int32_t k;
        if (p[i] < 0x80) {
            cp = p[i];
            k = 1;
        } else if (p[i] >= 0xC2 && p[i] <= 0xDF && i + 1 < len) {
            cp = (uint32_t)(p[i] & 0x1F) << 6 | (p[i + 1] & 0x3F);
            k = 2;
        } else if (p[i] >= 0xE0 && p[i] <= 0xEF && i + 2 < len) {
            cp = (uint32_t)(p[i] & 0x0F) << 12 | (uint32_t)(p[i + 1] & 0x3F) << 6 |
                 (p[i + 2] & 0x3F);
            k = 3;
        } else if (p[i] >= 0xF0 && p[i] <= 0xF4 && i + 3 < len) {
            cp = (uint32_t)(p[i] & 0x07) << 18 | (uint32_t)(p[i + 1] & 0x3F) << 12 |
                 (uint32_t)(p[i + 2] & 0x3F) << 6 | (p[i + 3] & 0x3F);
            k = 4;
        } else {
            jg_fail(w, SW_EUNSUPPORTED, "a literal that is not UTF-8", node);
            return;
        }
        eng__gb_char(&w->o, cp);
        i += k;
    }
    eng__gb_str(&w->o, "\"");
}

/* {lo,hi} after an element; hi < 0: unbounded. */
static void put_count(jg_writer *w, int64_t lo, int64_t hi, int32_t node)
{
    char b[48];
    if (lo > JG_MAX_COUNT || hi > JG_MAX_COUNT) {
        jg_fail(w, SW_EUNSUPPORTED, "a length or count bound above 10000", node);
        return;
    }
    if (hi < 0)
        snprintf(b, sizeof b, "{%d,}", (int)lo);
    else
        snprintf(b, sizeof b, "{%d,%d}", (int)lo, (int)hi);
    eng__gb_str(&w->o, b);
}

/* Marks the nodes the root reaches, with a work list ($ref recursion
 * makes the graph cyclic, and a recursive walk of a deep schema would
 * nest far). */
static int push_node(jg_writer *w, int32_t **todo, int32_t *n_todo, int32_t *cap, int32_t node)
{
    if (node >= 0 && node < w->g->n_nodes && w->reached[node])
        return SW_OK;
    if (*n_todo == *cap) {
        int32_t c = *cap ? *cap * 2 : 64;
        int32_t *t = sw_realloc(*todo, (size_t)c * sizeof *t);
        if (!t)
            return w->rc = sw_error_set(w->err, SW_ENOMEM, "grammar: out of memory");
        *todo = t;
        *cap = c;
    }
    (*todo)[(*n_todo)++] = node;
    return SW_OK;
}

static void reach_from(jg_writer *w, int32_t root)
{
    int32_t *todo = NULL, n_todo = 0, cap = 0;
    push_node(w, &todo, &n_todo, &cap, root);
    while (n_todo > 0 && !w->rc) {
        int32_t node = todo[--n_todo];
        if (node < 0 || node >= w->g->n_nodes) {
            jg_fail(w, SW_EINVAL, "a reference outside the grammar", node);
            break;
        }
        if (w->reached[node])
            continue;
        w->reached[node] = 1;
        const cs_node *n = &w->g->nodes[node];
        switch (n->kind) {
        case CS_OBJECT:
            for (int32_t i = 0; i < n->n_props; i++)
                push_node(w, &todo, &n_todo, &cap, n->children[i]);
            break;
        case CS_ANYOBJ:
            push_node(w, &todo, &n_todo, &cap, n->key_node);
            push_node(w, &todo, &n_todo, &cap, n->item);
            break;
        case CS_ARRAY:
            for (int32_t i = 0; i < n->n_prefix; i++)
                push_node(w, &todo, &n_todo, &cap, n->prefix[i]);
            if (n->item >= 0 && n->max_items > n->n_prefix)
                push_node(w, &todo, &n_todo, &cap, n->item);
            break;
        case CS_ANYOF:
            for (int32_t i = 0; i < n->n_alts; i++)
                push_node(w, &todo, &n_todo, &cap, n->alts[i]);
            break;
        default: break;
        }
    }
    sw_free(todo);
}

static void rule_head(jg_writer *w, int32_t node, const char *suffix, int32_t j)
{
    put_name(w, node, suffix, j);
    eng__gb_str(&w->o, " ::= ");
}

static void write_object(jg_writer *w, int32_t node, const cs_node *n)
{
    /* the object */
    rule_head(w, node, NULL, 0);
    eng__gb_str(&w->o, "\"{\" ");
    put_name(w, node, "f", 0);
    eng__gb_str(&w->o, " \"}\"\n");
    for (int32_t j = 0; j <= n->n_props && !w->rc; j++) {
        /* f: properties from j on, none written yet; r: after one */
        for (int first = 1; first >= 0; first--) {
            rule_head(w, node, first ? "f" : "r", j);
            if (j == n->n_props) {
                eng__gb_str(&w->o, "\"\"\n");
                continue;
            }
            if (!first)
                eng__gb_str(&w->o, "\",\" ");
            put_literal(w, n->keys[j], n->key_lens[j], node);
            eng__gb_str(&w->o, " ");
            put_name(w, n->children[j], NULL, 0);
            eng__gb_str(&w->o, " ");
            put_name(w, node, "r", j + 1);
            if (!n->required[j]) {
                eng__gb_str(&w->o, " | ");
                put_name(w, node, first ? "f" : "r", j + 1);
            }
            eng__gb_str(&w->o, "\n");
        }
    }
}

static void write_anyobj(jg_writer *w, int32_t node, const cs_node *n)
{
    /* an entry, then more after commas; counted: within min..max entries
     * (a key written twice counts twice, as the automaton counts) */
    bool bounded = n->counted && n->max_items < INT32_MAX;
    rule_head(w, node, "e", 0);
    put_name(w, n->key_node, NULL, 0);
    eng__gb_str(&w->o, " \":\" ");
    put_name(w, n->item, NULL, 0);
    eng__gb_str(&w->o, "\n");
    rule_head(w, node, NULL, 0);
    if (n->counted && n->max_items == 0) {
        eng__gb_str(&w->o, "\"{}\"\n");
        return;
    }
    eng__gb_str(&w->o, "\"{\" ");
    put_name(w, node, "e", 0);
    eng__gb_str(&w->o, " (\",\" ");
    put_name(w, node, "e", 0);
    eng__gb_str(&w->o, ")");
    put_count(w, 0, bounded ? n->max_items - 1 : -1, node);
    eng__gb_str(&w->o, " \"}\"");
    if (!n->counted || n->min_items == 0)
        eng__gb_str(&w->o, " | \"{}\"");
    eng__gb_str(&w->o, "\n");
}

static void write_array(jg_writer *w, int32_t node, const cs_node *n)
{
    int64_t max = n->max_items == INT32_MAX ? -1 : n->max_items;
    rule_head(w, node, NULL, 0);
    eng__gb_str(&w->o, "\"[\" ");
    put_name(w, node, "a", 0);
    eng__gb_str(&w->o, " \"]\"\n");
    /* a-k: the items after k of them */
    for (int32_t k = 0; k <= n->n_prefix && !w->rc; k++) {
        rule_head(w, node, "a", k);
        if (max >= 0 && k >= max) {
            eng__gb_str(&w->o, "\"\"\n");
            continue;
        }
        if (k < n->n_prefix) {
            if (k >= n->min_items)
                eng__gb_str(&w->o, "\"\" | ");
            if (k > 0)
                eng__gb_str(&w->o, "\",\" ");
            put_name(w, n->prefix[k], NULL, 0);
            eng__gb_str(&w->o, " ");
            put_name(w, node, "a", k + 1);
            eng__gb_str(&w->o, "\n");
            continue;
        }
        /* the repeated item, lo..hi more */
        int64_t lo = n->min_items > k ? n->min_items - k : 0;
        int64_t hi = max < 0 ? -1 : max - k;
        if (n->item < 0) {
            eng__gb_str(&w->o, "\"\"\n");
            continue;
        }
        if (k == 0) {
            /* item ("," item){lo - 1, hi - 1}, optional when lo is 0 */
            eng__gb_str(&w->o, lo == 0 ? "\"\" | " : "");
            put_name(w, n->item, NULL, 0);
            eng__gb_str(&w->o, " (\",\" ");
            put_name(w, n->item, NULL, 0);
            eng__gb_str(&w->o, ")");
            put_count(w, lo > 0 ? lo - 1 : 0, hi < 0 ? -1 : hi - 1, node);
        } else {
            eng__gb_str(&w->o, "(\",\" ");
            put_name(w, n->item, NULL, 0);
            eng__gb_str(&w->o, ")");
            put_count(w, lo, hi, node);
        }
        eng__gb_str(&w->o, "\n");
    }
}

/* ---- numbers ----
 * As constrain.c's step_number and constrain_number.c's bounded numbers
 * read them: an optional '-', a magnitude without leading zeros, no
 * exponent; with bounds, per sign, whole magnitudes in int_lo..int_hi and
 * integer parts in frac_lo..frac_hi that a fraction may follow (one with
 * a nonzero digit owed at exactly frac_lo when frac_nonzero). */

/* Magnitudes this long at most are written digit by digit (deeper ranges
 * would pass the GBNF parsers' nesting). */
#define JG_MAX_RANGE_DIGITS 40

/* The len-digit strings from a to b (a <= b, both len digits), as one
 * element: the digits they share, then at the first that differs the low
 * edge, the middle whole and the high edge. */
static void put_digit_range(jg_writer *w, const char *a, const char *b, int len)
{
    char buf[64];
    if (len == 0) {
        eng__gb_str(&w->o, "\"\"");
        return;
    }
    if (len == 1 || a[0] == b[0]) {
        if (a[0] == b[0])
            snprintf(buf, sizeof buf, "\"%c\"", a[0]);
        else
            snprintf(buf, sizeof buf, "[%c-%c]", a[0], b[0]);
        eng__gb_str(&w->o, buf);
        if (len > 1) {
            eng__gb_str(&w->o, " ");
            put_digit_range(w, a + 1, b + 1, len - 1);
        }
        return;
    }
    char nines[JG_MAX_RANGE_DIGITS + 1], zeros[JG_MAX_RANGE_DIGITS + 1];
    memset(nines, '9', (size_t)len - 1);
    memset(zeros, '0', (size_t)len - 1);
    nines[len - 1] = zeros[len - 1] = 0;
    bool low_whole = !strcmp(a + 1, zeros), high_whole = !strcmp(b + 1, nines);
    int from = a[0] + !low_whole, to = b[0] - !high_whole;
    bool any = false;
    eng__gb_str(&w->o, "(");
    if (!low_whole) {
        snprintf(buf, sizeof buf, "\"%c\" ", a[0]);
        eng__gb_str(&w->o, buf);
        put_digit_range(w, a + 1, nines, len - 1);
        any = true;
    }
    if (from <= to) {
        snprintf(buf, sizeof buf, "%s[%c-%c] [0-9]{%d}", any ? " | " : "", from, to, len - 1);
        eng__gb_str(&w->o, buf);
        any = true;
    }
    if (!high_whole) {
        snprintf(buf, sizeof buf, "%s\"%c\" ", any ? " | " : "", b[0]);
        eng__gb_str(&w->o, buf);
        put_digit_range(w, zeros, b + 1, len - 1);
    }
    eng__gb_str(&w->o, ")");
}

/* Decimal magnitudes in lo..hi (hi NULL: none above), at most max_len
 * digits, without leading zeros (0 itself only when lo is "0"), as
 * alternatives each starting with " | " unless first (*any). */
static void put_magnitudes(jg_writer *w, const char *lo, const char *hi, int max_len,
                           const char *prefix, const char *suffix, bool *any, int32_t node)
{
    int ll = (int)strlen(lo), lh = hi ? (int)strlen(hi) : max_len;
    if (lh > max_len)
        lh = max_len, hi = NULL;
    if (lh > JG_MAX_RANGE_DIGITS) {
        if (hi || ll > JG_MAX_RANGE_DIGITS) {
            jg_fail(w, SW_EUNSUPPORTED, "a number bound over 40 digits", node);
            return;
        }
    }
    char a[JG_MAX_RANGE_DIGITS + 1], b[JG_MAX_RANGE_DIGITS + 1];
    for (int len = ll; len <= lh && !w->rc; len++) {
        if (!hi && len > ll) {
            /* every longer length whole, at once */
            char buf[96];
            snprintf(buf, sizeof buf, "%s%s[1-9] [0-9]{%d,%d}%s", *any ? " | " : "", prefix,
                     len - 1, lh - 1, suffix);
            eng__gb_str(&w->o, buf);
            *any = true;
            break;
        }
        if (len == ll) {
            memcpy(a, lo, (size_t)len + 1);
        } else {
            memset(a, '0', (size_t)len);
            a[0] = '1';
            a[len] = 0;
        }
        if (hi && len == lh) {
            memcpy(b, hi, (size_t)len + 1);
        } else {
            memset(b, '9', (size_t)len);
            b[len] = 0;
        }
        if (strcmp(a, b) > 0)
            continue;
        eng__gb_str(&w->o, *any ? " | " : "");
        eng__gb_str(&w->o, prefix);
        put_digit_range(w, a, b, len);
        eng__gb_str(&w->o, suffix);
        *any = true;
    }
}

/* s + 1, as a decimal string (into out, cap bytes). */
static void dec_inc(const char *s, char *out, size_t cap)
{
    size_t n = strlen(s);
    if (n + 2 > cap) {
        out[0] = 0;
        return;
    }
    memcpy(out + 1, s, n + 1);
    out[0] = '0';
    size_t i = n;
    while (out[i] == '9')
        out[i--] = '0';
    out[i]++;
    if (out[0] == '0')
        memmove(out, out + 1, n + 1);
}

static void write_number(jg_writer *w, int32_t node, const cs_node *n)
{
    if (n->multiple_of > 0) {
        jg_fail(w, SW_EUNSUPPORTED, "a number with a multiple", node);
        return;
    }
    int32_t max_frac = n->max_frac > 0 ? n->max_frac : ENG_CS_MAX_FRAC_DIGITS;
    char frac[64], owed[512];
    snprintf(frac, sizeof frac, " \".\" [0-9]{1,%d}", (int)max_frac);
    /* a fraction with a nonzero digit: its zeros, the first nonzero, the
     * rest within max_frac */
    size_t at = (size_t)snprintf(owed, sizeof owed, " \".\" (");
    for (int32_t k = 0; k < max_frac && k <= 30 && at < sizeof owed - 64; k++) {
        at += (size_t)snprintf(owed + at, sizeof owed - at, "%s", k ? " | " : "");
        if (k)
            at += (size_t)snprintf(owed + at, sizeof owed - at, "\"%.*s\" ", (int)k,
                                   "000000000000000000000000000000");
        at += (size_t)snprintf(owed + at, sizeof owed - at, "[1-9]");
        if (max_frac - 1 - k > 0)
            at += (size_t)snprintf(owed + at, sizeof owed - at, " [0-9]{0,%d}",
                                   (int)(max_frac - 1 - k));
    }
    snprintf(owed + at, sizeof owed - at, ")");
    if (max_frac > 30) {
        jg_fail(w, SW_EUNSUPPORTED, "a number with over 30 fraction digits", node);
        return;
    }
    rule_head(w, node, NULL, 0);
    if (!n->ranged) {
        char b[96];
        snprintf(b, sizeof b, "\"-\"? (\"0\" | [1-9] [0-9]{0,%d})", ENG_CS_MAX_INT_DIGITS - 1);
        eng__gb_str(&w->o, b);
        if (n->kind == CS_NUMBER) {
            eng__gb_str(&w->o, " (");
            eng__gb_str(&w->o, frac + 1);
            eng__gb_str(&w->o, ")?");
        }
        eng__gb_str(&w->o, "\n");
        return;
    }
    int32_t int_len = n->int_digits > 0 ? n->int_digits : ENG_CS_MAX_INT_DIGITS;
    bool any = false;
    for (int s = 0; s < 2 && !w->rc; s++) {
        const char *sign = s ? "\"-\" " : "";
        if (n->int_ok[s] && n->int_lo[s])
            put_magnitudes(w, n->int_lo[s], n->int_hi[s], int_len, sign, "", &any, node);
        if (n->kind != CS_NUMBER || !n->frac_ok[s] || !n->frac_lo[s])
            continue;
        if (!n->frac_nonzero[s]) {
            put_magnitudes(w, n->frac_lo[s], n->frac_hi[s], ENG_CS_MAX_INT_DIGITS, sign, frac,
                           &any, node);
            continue;
        }
        /* exactly frac_lo owes a nonzero digit; above it, any fraction */
        put_magnitudes(w, n->frac_lo[s], n->frac_lo[s], ENG_CS_MAX_INT_DIGITS, sign, owed, &any,
                       node);
        char next[JG_MAX_RANGE_DIGITS + 2];
        dec_inc(n->frac_lo[s], next, sizeof next);
        if (next[0] && (!n->frac_hi[s] || strlen(next) < strlen(n->frac_hi[s]) ||
                        (strlen(next) == strlen(n->frac_hi[s]) && strcmp(next, n->frac_hi[s]) <= 0)))
            put_magnitudes(w, next, n->frac_hi[s], ENG_CS_MAX_INT_DIGITS, sign, frac, &any, node);
    }
    if (!any && !w->rc)
        jg_fail(w, SW_EUNSUPPORTED, "a number with no value in its bounds", node);
    eng__gb_str(&w->o, "\n");
}

/* ---- pattern strings ----
 * As constrain.c's eng__cs_step_pattern reads them: the content's decoded
 * bytes run the pattern's automaton (n->re) and must end in an accepting
 * state, within min_chars..max_chars code points; each byte written as
 * itself (printable, not '"' or '\\'), as a short escape (\" \\ \/ \b \f
 * \n \r \t) or, for the control bytes, as \u00XX. One rule per state of
 * the automaton reached (and, with a length bound, per count of code
 * points so far: n<i>-p<state>-<count>), whose alternatives are the code
 * points that lead to another state, grouped into one class per target,
 * the escapes, and the closing quote where the state accepts. */

/* Work allowed for one pattern: automaton steps and continuation ranges
 * kept. */
#define JG_PATTERN_STEPS ((int64_t)1 << 22)

typedef struct jg_prange {
    int32_t target; /* state * levels + count */
    uint32_t lo, hi;
} jg_prange;

/* What the continuation bytes of a UTF-8 sequence do from one state: the
 * ranges of their value bits (6 per byte) that lead to the same state.
 * Computed once per state and byte count: most states of a pattern treat
 * whole blocks of code points alike. */
typedef struct jg_crange {
    uint32_t lo, hi;
    int32_t state;
} jg_crange;

typedef struct jg_clist {
    bool done;
    int32_t n, cap;
    jg_crange *r;
} jg_clist;

typedef struct jg_pattern {
    jg_writer *w;
    const cs_node *n;
    int32_t node, levels, n_states;
    uint8_t *reached;   /* n_states * levels */
    int32_t *todo;      /* worklist of state * levels + count */
    int32_t n_todo;
    jg_prange *r;       /* the ranges of the state being written */
    int32_t n_r, cap_r;
    jg_clist *cont;     /* 3 * n_states: continuation lists by byte count - 1 */
    int64_t steps;
} jg_pattern;

static void put_pstate(jg_pattern *p, int32_t key)
{
    char b[64];
    if (p->levels > 1)
        snprintf(b, sizeof b, "n%d-p%d-%d", (int)p->node, (int)(key / p->levels),
                 (int)(key % p->levels));
    else
        snprintf(b, sizeof b, "n%d-p%d", (int)p->node, (int)key);
    eng__gb_str(&p->w->o, b);
}

static bool pattern_spend(jg_pattern *p)
{
    if (++p->steps <= JG_PATTERN_STEPS)
        return true;
    jg_fail(p->w, SW_EUNSUPPORTED, "a pattern too large to write out", p->node);
    return false;
}

/* The state and count after one more code point, as a key, or -1 when no
 * completion within the bounds follows. */
static int32_t pattern_key(jg_pattern *p, int32_t state, int32_t count)
{
    int64_t next = (int64_t)count + 1;
    if (p->n->max_chars != INT32_MAX && next > p->n->max_chars)
        return -1;
    if (eng_regex_costs_get(p->n->re_costs, state, next) < 0)
        return -1;
    if (next > p->levels - 1)
        next = p->levels - 1; /* unbounded above: counted up to min_chars */
    int32_t key = state * p->levels + (int32_t)next;
    if (!p->reached[key]) {
        p->reached[key] = 1;
        p->todo[p->n_todo++] = key;
    }
    return key;
}

static void add_range(jg_pattern *p, int32_t target, uint32_t lo, uint32_t hi)
{
    if (p->w->rc)
        return;
    if (p->n_r > 0 && p->r[p->n_r - 1].target == target && p->r[p->n_r - 1].hi + 1 == lo) {
        p->r[p->n_r - 1].hi = hi;
        return;
    }
    if (p->n_r == p->cap_r) {
        int32_t c = p->cap_r ? p->cap_r * 2 : 256;
        jg_prange *t = sw_realloc(p->r, (size_t)c * sizeof *t);
        if (!t) {
            p->w->rc = sw_error_set(p->w->err, SW_ENOMEM, "grammar: out of memory");
            return;
        }
        p->r = t;
        p->cap_r = c;
    }
    p->r[p->n_r++] = (jg_prange){target, lo, hi};
}

static void clist_add(jg_pattern *p, jg_clist *l, uint32_t lo, uint32_t hi, int32_t state)
{
    if (p->w->rc || !pattern_spend(p))
        return;
    if (l->n > 0 && l->r[l->n - 1].state == state && l->r[l->n - 1].hi + 1 == lo) {
        l->r[l->n - 1].hi = hi;
        return;
    }
    if (l->n == l->cap) {
        int32_t c = l->cap ? l->cap * 2 : 4;
        jg_crange *t = sw_realloc(l->r, (size_t)c * sizeof *t);
        if (!t) {
            p->w->rc = sw_error_set(p->w->err, SW_ENOMEM, "grammar: out of memory");
            return;
        }
        l->r = t;
        l->cap = c;
    }
    l->r[l->n++] = (jg_crange){lo, hi, state};
}

/* The continuation list of more bytes from state (a lead byte read). */
static const jg_clist *cont_list(jg_pattern *p, int32_t state, int more)
{
    jg_clist *l = &p->cont[(size_t)(more - 1) * (size_t)p->n_states + (size_t)state];
    if (l->done)
        return l;
    l->done = true;
    for (int b = 0x80; b <= 0xBF && !p->w->rc; b++) {
        if (!pattern_spend(p))
            break;
        int32_t t = eng_regex_step(p->n->re, state, (uint8_t)b);
        if (t == ENG_REGEX_DEAD)
            continue;
        uint32_t hi_bits = (uint32_t)(b & 0x3F) << (6 * (more - 1));
        if (more == 1) {
            clist_add(p, l, hi_bits, hi_bits, t);
            continue;
        }
        const jg_clist *sub = cont_list(p, t, more - 1);
        for (int32_t i = 0; i < sub->n && !p->w->rc; i++)
            clist_add(p, l, hi_bits | sub->r[i].lo, hi_bits | sub->r[i].hi, sub->r[i].state);
    }
    return l;
}

static int cmp_prange(const void *a, const void *b)
{
    const jg_prange *x = a, *y = b;
    if (x->target != y->target)
        return x->target < y->target ? -1 : 1;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* An escape (ASCII text) as a literal, then the target's rule. */
static void put_escape(jg_pattern *p, const char *esc, int32_t key, bool *any)
{
    eng__gb_str(&p->w->o, *any ? " | \"" : "\"");
    for (const char *c = esc; *c; c++)
        eng__gb_char(&p->w->o, (uint8_t)*c);
    eng__gb_str(&p->w->o, "\" ");
    put_pstate(p, key);
    *any = true;
}

static void write_pstate(jg_pattern *p, int32_t key)
{
    jg_writer *w = p->w;
    const cs_node *n = p->n;
    int32_t state = key / p->levels, count = key % p->levels;
    p->n_r = 0;
    put_pstate(p, key);
    eng__gb_str(&w->o, " ::= ");
    bool any = false;
    if (eng_regex_accepting(n->re, state) && count >= n->min_chars) {
        eng__gb_str(&w->o, "\"\\\"\"");
        any = true;
    }
    static const char short_from[] = "\"\\/bfnrt", short_to[] = "\"\\/\b\f\n\r\t";
    for (int b = 0; b < 0x80 && !w->rc && pattern_spend(p); b++) {
        int32_t t = eng_regex_step(n->re, state, (uint8_t)b);
        int32_t k = t == ENG_REGEX_DEAD ? -1 : pattern_key(p, t, count);
        if (k < 0)
            continue;
        if (b >= 0x20 && b != '"' && b != '\\')
            add_range(p, k, (uint32_t)b, (uint32_t)b);
        const char *e = b ? memchr(short_to, b, sizeof short_to - 1) : NULL;
        if (e) {
            char esc[3] = {'\\', short_from[e - short_to], 0};
            put_escape(p, esc, k, &any);
        }
        if (b < 0x20) {
            /* \u00XX, the last digit in either case */
            static const char hex[] = "0123456789abcdef";
            char esc[8] = {'\\', 'u', '0', '0', hex[b >> 4], hex[b & 15], 0};
            put_escape(p, esc, k, &any);
            if ((b & 15) >= 10) {
                esc[5] = (char)(hex[b & 15] - 'a' + 'A');
                put_escape(p, esc, k, &any);
            }
        }
    }
    for (int lead = 0xC2; lead <= 0xF4 && !w->rc && pattern_spend(p); lead++) {
        int32_t t = eng_regex_step(n->re, state, (uint8_t)lead);
        if (t == ENG_REGEX_DEAD)
            continue;
        int more = lead < 0xE0 ? 1 : lead < 0xF0 ? 2 : 3;
        uint32_t lead_bits = (uint32_t)(lead & (0x3F >> more)) << (6 * more);
        const jg_clist *l = cont_list(p, t, more);
        for (int32_t i = 0; i < l->n && !w->rc; i++) {
            int32_t k = pattern_key(p, l->r[i].state, count);
            if (k >= 0)
                add_range(p, k, lead_bits | l->r[i].lo, lead_bits | l->r[i].hi);
        }
    }
    if (w->rc)
        return;
    qsort(p->r, (size_t)p->n_r, sizeof *p->r, cmp_prange);
    for (int32_t i = 0; i < p->n_r;) {
        int32_t j = i;
        eng__gb_str(&w->o, any ? " | [" : "[");
        for (; j < p->n_r && p->r[j].target == p->r[i].target; j++) {
            eng__gb_char(&w->o, p->r[j].lo);
            if (p->r[j].hi != p->r[j].lo) {
                eng__gb_str(&w->o, "-");
                eng__gb_char(&w->o, p->r[j].hi);
            }
        }
        eng__gb_str(&w->o, "] ");
        put_pstate(p, p->r[i].target);
        any = true;
        i = j;
    }
    if (!any)
        jg_fail(w, SW_EINVAL, "a pattern state with no way on", p->node);
    eng__gb_str(&w->o, "\n");
}

static void write_pattern(jg_writer *w, int32_t node, const cs_node *n)
{
    jg_pattern p = {.w = w, .n = n, .node = node};
    int32_t n_states = eng_regex_n_states(n->re);
    int64_t levels = n->max_chars != INT32_MAX ? (int64_t)n->max_chars + 1
                                               : (int64_t)n->min_chars + 1;
    if (levels * n_states > (1 << 20)) {
        jg_fail(w, SW_EUNSUPPORTED, "a pattern string with too long a length bound", node);
        return;
    }
    p.levels = (int32_t)levels;
    int32_t start = eng_regex_start(n->re);
    if (start == ENG_REGEX_DEAD || eng_regex_costs_get(n->re_costs, start, 0) < 0) {
        jg_fail(w, SW_EUNSUPPORTED, "a pattern string that matches nothing", node);
        return;
    }
    p.n_states = n_states;
    p.reached = sw_calloc((size_t)(levels * n_states), 1);
    p.todo = sw_malloc((size_t)(levels * n_states) * sizeof *p.todo);
    p.cont = sw_calloc((size_t)n_states * 3, sizeof *p.cont);
    if (!p.reached || !p.todo || !p.cont) {
        w->rc = sw_error_set(w->err, SW_ENOMEM, "grammar: out of memory");
        goto done;
    }
    rule_head(w, node, NULL, 0);
    eng__gb_str(&w->o, "\"\\\"\" ");
    p.reached[start * p.levels] = 1;
    p.todo[p.n_todo++] = start * p.levels;
    put_pstate(&p, start * p.levels);
    eng__gb_str(&w->o, "\n");
    while (p.n_todo > 0 && !w->rc && !w->o.failed)
        write_pstate(&p, p.todo[--p.n_todo]);
done:
    for (int32_t i = 0; p.cont && i < n_states * 3; i++)
        sw_free(p.cont[i].r);
    sw_free(p.cont);
    sw_free(p.reached);
    sw_free(p.todo);
    sw_free(p.r);
}

static void write_node(jg_writer *w, int32_t node)
{
    const cs_node *n = &w->g->nodes[node];
    switch (n->kind) {
    case CS_OBJECT: write_object(w, node, n); return;
    case CS_ANYOBJ: write_anyobj(w, node, n); return;
    case CS_ARRAY: write_array(w, node, n); return;
    case CS_STRING:
        rule_head(w, node, NULL, 0);
        eng__gb_str(&w->o, "\"\\\"\" json-char");
        put_count(w, n->min_chars, n->max_chars == INT32_MAX ? -1 : n->max_chars, node);
        eng__gb_str(&w->o, " \"\\\"\"\n");
        return;
    case CS_NUMBER:
    case CS_INTEGER:
        write_number(w, node, n);
        return;
    case CS_LITERALS:
        rule_head(w, node, NULL, 0);
        for (int32_t i = 0; i < n->n_lits; i++) {
            if (i)
                eng__gb_str(&w->o, " | ");
            put_literal(w, n->lits[i], n->lit_lens[i], node);
        }
        eng__gb_str(&w->o, "\n");
        return;
    case CS_ANYOF:
        rule_head(w, node, NULL, 0);
        for (int32_t i = 0; i < n->n_alts; i++) {
            if (i)
                eng__gb_str(&w->o, " | ");
            put_name(w, n->alts[i], NULL, 0);
        }
        eng__gb_str(&w->o, "\n");
        return;
    case CS_PATTERN: write_pattern(w, node, n); return;
    case CS_RAW:
    case CS_SEQ:
    case CS_REP: jg_fail(w, SW_EUNSUPPORTED, "a node of a GBNF grammar", node); return;
    }
}

int eng_grammar_to_gbnf(const eng_grammar *g, char **out, sw_error *err)
{
    *out = NULL;
    jg_writer w = {.g = g, .err = err};
    w.reached = sw_calloc(g->n_nodes > 0 ? (size_t)g->n_nodes : 1, 1);
    if (!w.reached)
        return sw_error_set(err, SW_ENOMEM, "grammar: out of memory");
    reach_from(&w, g->root);
    eng__gb_str(&w.o, "root ::= ");
    put_name(&w, g->root, NULL, 0);
    eng__gb_str(&w.o, "\njson-char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" [\"\\\\/bfnrt]\n");
    for (int32_t i = 0; i < g->n_nodes && !w.rc; i++)
        if (w.reached[i])
            write_node(&w, i);
    sw_free(w.reached);
    if (!w.rc && w.o.failed)
        sw_error_set(err, w.rc = w.o.too_long ? SW_ERANGE : SW_ENOMEM,
                     w.o.too_long ? "grammar: the schema's GBNF form is too long"
                                  : "grammar: out of memory");
    if (w.rc) {
        sw_free(w.o.p);
        return w.rc;
    }
    *out = w.o.p;
    return SW_OK;
}
