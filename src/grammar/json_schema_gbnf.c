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
 * counts left). Numbers are written by json_schema_gbnf_number.c (with
 * bounds digit by digit), pattern strings by json_schema_gbnf_pattern.c
 * (a rule per state of their automaton). Numbers with a multiple have no
 * form here yet: SW_EUNSUPPORTED names them, and what would be too large.
 * The automaton's other narrowing, at most ENG_CS_MAX_ALTS readings at
 * once, is not written: the grammar is the language without it.
 */
#include "grammar/json_schema.h"

#include "common/alloc.h"
#include "grammar/gbnf.h"
#include "grammar/json_schema_gbnf-impl.h"

#include <stdio.h>
#include <string.h>

/* Counts the GBNF parsers take ({m,n} up to gbnf.h's ENG_GBNF_MAX_COUNT). */
#define JG_MAX_COUNT 10000

int eng__jg_fail(jg_writer *w, int code, const char *what, int32_t node)
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
            eng__jg_fail(w, SW_EUNSUPPORTED, "a literal that is not UTF-8", node);
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
        eng__jg_fail(w, SW_EUNSUPPORTED, "a length or count bound above 10000", node);
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
            eng__jg_fail(w, SW_EINVAL, "a reference outside the grammar", node);
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

void eng__jg_rule_head(jg_writer *w, int32_t node, const char *suffix, int32_t j)
{
    put_name(w, node, suffix, j);
    eng__gb_str(&w->o, " ::= ");
}

static void write_object(jg_writer *w, int32_t node, const cs_node *n)
{
    /* the object */
    eng__jg_rule_head(w, node, NULL, 0);
    eng__gb_str(&w->o, "\"{\" ");
    put_name(w, node, "f", 0);
    eng__gb_str(&w->o, " \"}\"\n");
    for (int32_t j = 0; j <= n->n_props && !w->rc; j++) {
        /* f: properties from j on, none written yet; r: after one */
        for (int first = 1; first >= 0; first--) {
            eng__jg_rule_head(w, node, first ? "f" : "r", j);
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
    eng__jg_rule_head(w, node, "e", 0);
    put_name(w, n->key_node, NULL, 0);
    eng__gb_str(&w->o, " \":\" ");
    put_name(w, n->item, NULL, 0);
    eng__gb_str(&w->o, "\n");
    eng__jg_rule_head(w, node, NULL, 0);
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
    eng__jg_rule_head(w, node, NULL, 0);
    eng__gb_str(&w->o, "\"[\" ");
    put_name(w, node, "a", 0);
    eng__gb_str(&w->o, " \"]\"\n");
    /* a-k: the items after k of them */
    for (int32_t k = 0; k <= n->n_prefix && !w->rc; k++) {
        eng__jg_rule_head(w, node, "a", k);
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

static void write_node(jg_writer *w, int32_t node)
{
    const cs_node *n = &w->g->nodes[node];
    switch (n->kind) {
    case CS_OBJECT: write_object(w, node, n); return;
    case CS_ANYOBJ: write_anyobj(w, node, n); return;
    case CS_ARRAY: write_array(w, node, n); return;
    case CS_STRING:
        eng__jg_rule_head(w, node, NULL, 0);
        eng__gb_str(&w->o, "\"\\\"\" json-char");
        put_count(w, n->min_chars, n->max_chars == INT32_MAX ? -1 : n->max_chars, node);
        eng__gb_str(&w->o, " \"\\\"\"\n");
        return;
    case CS_NUMBER:
    case CS_INTEGER:
        eng__jg_write_number(w, node, n);
        return;
    case CS_LITERALS:
        eng__jg_rule_head(w, node, NULL, 0);
        for (int32_t i = 0; i < n->n_lits; i++) {
            if (i)
                eng__gb_str(&w->o, " | ");
            put_literal(w, n->lits[i], n->lit_lens[i], node);
        }
        eng__gb_str(&w->o, "\n");
        return;
    case CS_ANYOF:
        eng__jg_rule_head(w, node, NULL, 0);
        for (int32_t i = 0; i < n->n_alts; i++) {
            if (i)
                eng__gb_str(&w->o, " | ");
            put_name(w, n->alts[i], NULL, 0);
        }
        eng__gb_str(&w->o, "\n");
        return;
    case CS_PATTERN: eng__jg_write_pattern(w, node, n); return;
    case CS_RAW:
    case CS_SEQ:
    case CS_REP: eng__jg_fail(w, SW_EUNSUPPORTED, "a node of a GBNF grammar", node); return;
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
    for (int32_t i = 0; i < g->n_nodes && !w.rc && w.o.len <= ENG_GBNF_MAX_BYTES; i++)
        if (w.reached[i])
            write_node(&w, i);
    sw_free(w.reached);
    if (!w.rc && !w.o.failed && w.o.len > ENG_GBNF_MAX_BYTES)
        w.rc = sw_error_set(err, SW_ERANGE,
                            "grammar: the schema's GBNF form is longer than %d bytes (what a GBNF "
                            "parser here takes)",
                            ENG_GBNF_MAX_BYTES);
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

