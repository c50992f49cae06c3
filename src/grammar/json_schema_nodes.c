/* json_schema_nodes.c - the grammar's node store and the node makers the
 * schema compiler uses (constrain-impl.h has the nodes).
 */
#include "grammar/json_schema.h"

#include "common/alloc.h"
#include "common/json_big.h"
#include "grammar/constrain-impl.h"
#include "grammar/formats.h"
#include "grammar/json_schema-impl.h"

#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int32_t eng__sc_len_add(int64_t a, int64_t b)
{
    int64_t s = a + b;
    return s > CS_LEN_CAP ? CS_LEN_CAP : (int32_t)s;
}

static int32_t len_mul(int64_t a, int64_t b)
{
    if (a == 0 || b == 0)
        return 0;
    if (a > CS_LEN_CAP / b)
        return CS_LEN_CAP;
    return eng__sc_len_add(a * b, 0);
}

void eng__sc_node_clear(cs_node *n)
{
    for (int32_t i = 0; i < n->n_props; i++)
        sw_free(n->keys ? n->keys[i] : NULL);
    sw_free(n->keys);
    sw_free(n->key_lens);
    sw_free(n->children);
    sw_free(n->required);
    sw_free(n->req_from);
    sw_free(n->any_from);
    sw_free(n->next_req);
    for (int32_t i = 0; i < n->n_lits; i++)
        sw_free(n->lits ? n->lits[i] : NULL);
    sw_free(n->lits);
    sw_free(n->lit_lens);
    sw_free(n->alts);
    sw_free(n->prefix);
    sw_free(n->seq);
    sw_free(n->seq_from);
    eng_regex_free(n->re);
    eng_regex_costs_free(n->re_costs);
    for (int i = 0; i < 2; i++) {
        sw_free(n->int_lo[i]);
        sw_free(n->int_hi[i]);
        sw_free(n->frac_lo[i]);
        sw_free(n->frac_hi[i]);
    }
}

void eng_grammar_free(eng_grammar *g)
{
    if (!g)
        return;
    for (int32_t i = 0; i < g->n_nodes; i++)
        eng__sc_node_clear(&g->nodes[i]);
    sw_free(g->nodes);
    sw_free(g);
}

int64_t eng_grammar_min_bytes(const eng_grammar *g)
{
    return g->nodes[g->root].min_bytes;
}

eng_grammar *eng__sc_grammar_new(void)
{
    eng_grammar *g = sw_calloc(1, sizeof *g);
    if (!g)
        return NULL;
    for (int i = 0; i <= ENG_CS_ANY_DEPTH; i++)
        g->any_cache[i] = -1;
    g->any_key = -1;
    g->root = -1;
    return g;
}

/* Appends a node (moved in: on failure its arrays are freed). Returns its
 * index, or -1 out of memory. Children must already exist. */
int32_t eng__sc_add_node(eng_grammar *g, cs_node *n)
{
    if (g->n_nodes == g->cap_nodes) {
        int32_t cap = g->cap_nodes ? g->cap_nodes * 2 : 16;
        cs_node *p = sw_realloc(g->nodes, (size_t)cap * sizeof *p);
        if (!p) {
            eng__sc_node_clear(n);
            return -1;
        }
        g->nodes = p;
        g->cap_nodes = cap;
    }
    /* The minimum serialized length. */
    int64_t m = 0;
    switch (n->kind) {
    case CS_OBJECT:
        m = 2 + (n->next_req[0] < n->n_props ? n->req_from[0] - 1 : 0);
        break;
    case CS_ANYOBJ:
        m = 2;
        if (n->counted && n->min_items > 0)
            m = eng__sc_len_add(eng__sc_len_add(3, g->nodes[n->key_node].min_bytes),
                                g->nodes[n->item].min_bytes);
        break;
    case CS_ARRAY: {
        /* prefixItems first, then item; a comma between two */
        int64_t k = n->min_items < n->n_prefix ? n->min_items : n->n_prefix;
        m = 2 + (n->min_items > 0 ? n->min_items - 1 : 0);
        for (int64_t i = 0; i < k; i++)
            m = eng__sc_len_add(m, g->nodes[n->prefix[i]].min_bytes);
        m = eng__sc_len_add(m, len_mul(n->min_items - k, g->nodes[n->item].min_bytes));
        break;
    }
    case CS_STRING: m = eng__sc_len_add(2, n->min_chars); break;
    case CS_PATTERN: m = n->min_bytes; break; /* make_pattern's */
    case CS_NUMBER:
    case CS_INTEGER:
        m = 1;
        if (n->ranged) {
            /* the shortest of int_lo and frac_lo + ".d", per sign */
            m = CS_LEN_CAP;
            for (int sign = 0; sign < 2; sign++) {
                if (n->int_ok[sign] && sign + (int64_t)strlen(n->int_lo[sign]) < m)
                    m = sign + (int64_t)strlen(n->int_lo[sign]);
                if (n->frac_ok[sign] && sign + (int64_t)strlen(n->frac_lo[sign]) + 2 < m)
                    m = sign + (int64_t)strlen(n->frac_lo[sign]) + 2;
            }
        }
        break;
    case CS_LITERALS:
        m = CS_LEN_CAP;
        for (int32_t i = 0; i < n->n_lits; i++)
            if (n->lit_lens[i] < m)
                m = n->lit_lens[i];
        break;
    case CS_ANYOF:
        m = CS_LEN_CAP;
        for (int32_t i = 0; i < n->n_alts; i++)
            if (g->nodes[n->alts[i]].min_bytes < m)
                m = g->nodes[n->alts[i]].min_bytes;
        break;
    case CS_RAW:
    case CS_SEQ:
    case CS_REP: break; /* GBNF's (gbnf_compile.c), never made here */
    }
    n->min_bytes = eng__sc_len_add(m, 0);
    n->n_branches = 1;
    if (n->kind == CS_ANYOF) {
        int64_t b = 0;
        for (int32_t i = 0; i < n->n_alts; i++)
            b += g->nodes[n->alts[i]].n_branches;
        n->n_branches = b > INT32_MAX ? INT32_MAX : (int32_t)b;
    }
    g->nodes[g->n_nodes] = *n;
    return g->n_nodes++;
}

/* ---- node makers ---------------------------------------------------------- */

int32_t eng__sc_make_literals(eng_grammar *g, const json_t *const *vals, size_t n)
{
    cs_node nd;
    memset(&nd, 0, sizeof nd);
    nd.kind = CS_LITERALS;
    nd.lits = sw_calloc(n ? n : 1, sizeof *nd.lits);
    nd.lit_lens = sw_calloc(n ? n : 1, sizeof *nd.lit_lens);
    if (!nd.lits || !nd.lit_lens) {
        eng__sc_node_clear(&nd);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        double d = json_is_real(vals[i]) ? json_real_value(vals[i]) : 0.5;
        if (d == floor(d) && fabs(d) < 1e15) {
            /* 2.0 is written 2: also a valid "integer" */
            char t[32];
            snprintf(t, sizeof t, "%.0f", d == 0 ? 0.0 : d);
            nd.lits[i] = sw_strdup(t);
            nd.lit_lens[i] = nd.lits[i] ? (int32_t)strlen(t) : 0;
        } else {
            nd.lits[i] = eng__sc_dump_value(vals[i], &nd.lit_lens[i]);
        }
        nd.n_lits = (int32_t)i + 1;
        if (!nd.lits[i]) {
            eng__sc_node_clear(&nd);
            return -1;
        }
    }
    return eng__sc_add_node(g, &nd);
}

static int32_t make_simple(eng_grammar *g, cs_kind kind)
{
    cs_node nd;
    memset(&nd, 0, sizeof nd);
    nd.kind = kind;
    return eng__sc_add_node(g, &nd);
}

int32_t eng__sc_make_string(eng_grammar *g, int32_t min_chars, int32_t max_chars)
{
    cs_node nd;
    memset(&nd, 0, sizeof nd);
    nd.kind = CS_STRING;
    nd.min_chars = min_chars;
    nd.max_chars = max_chars;
    return eng__sc_add_node(g, &nd);
}

int32_t eng__sc_make_anyof(eng_grammar *g, const int32_t *alts, int32_t n)
{
    cs_node nd;
    memset(&nd, 0, sizeof nd);
    nd.kind = CS_ANYOF;
    nd.alts = sw_malloc((size_t)(n ? n : 1) * sizeof *nd.alts);
    if (!nd.alts)
        return -1;
    memcpy(nd.alts, alts, (size_t)n * sizeof *alts);
    nd.n_alts = n;
    return eng__sc_add_node(g, &nd);
}

int32_t eng__sc_make_bool(eng_grammar *g)
{
    json_t *t = json_true(), *f = json_false();
    const json_t *v[2] = {t, f};
    return eng__sc_make_literals(g, v, 2);
}

/* Any JSON value nested at most `levels` deep (objects and arrays at
 * levels > 0 only), cached per level. */
int32_t eng__sc_make_any(eng_grammar *g, int32_t levels)
{
    if (levels < 0)
        levels = 0;
    if (levels > ENG_CS_ANY_DEPTH)
        levels = ENG_CS_ANY_DEPTH;
    if (g->any_cache[levels] >= 0)
        return g->any_cache[levels];
    int32_t alts[5], n = 0;
    if (levels > 0) {
        int32_t inner = eng__sc_make_any(g, levels - 1);
        if (inner < 0)
            return -1;
        if (g->any_key < 0 && (g->any_key = eng__sc_make_string(g, 0, INT32_MAX)) < 0)
            return -1;
        cs_node obj;
        memset(&obj, 0, sizeof obj);
        obj.kind = CS_ANYOBJ;
        obj.item = inner;
        obj.key_node = g->any_key;
        if ((alts[n++] = eng__sc_add_node(g, &obj)) < 0)
            return -1;
        cs_node arr;
        memset(&arr, 0, sizeof arr);
        arr.kind = CS_ARRAY;
        arr.item = inner;
        arr.max_items = INT32_MAX;
        if ((alts[n++] = eng__sc_add_node(g, &arr)) < 0)
            return -1;
    }
    if ((alts[n++] = eng__sc_make_string(g, 0, INT32_MAX)) < 0 ||
        (alts[n++] = make_simple(g, CS_NUMBER)) < 0)
        return -1;
    json_t *t = json_true(), *f = json_false(), *z = json_null();
    const json_t *lits[3] = {t, f, z};
    if ((alts[n++] = eng__sc_make_literals(g, lits, 3)) < 0)
        return -1;
    int32_t any = eng__sc_make_anyof(g, alts, n);
    if (any >= 0)
        g->any_cache[levels] = any;
    return any;
}

/* An object with levels of nesting below it (json_object mode, schemas
 * with type object and no properties). */
int32_t eng__sc_make_any_object(eng_grammar *g, int32_t levels)
{
    int32_t inner = eng__sc_make_any(g, levels - 1);
    if (inner < 0)
        return -1;
    if (g->any_key < 0 && (g->any_key = eng__sc_make_string(g, 0, INT32_MAX)) < 0)
        return -1;
    cs_node obj;
    memset(&obj, 0, sizeof obj);
    obj.kind = CS_ANYOBJ;
    obj.item = inner;
    obj.key_node = g->any_key;
    return eng__sc_add_node(g, &obj);
}

/* Levels of free nesting that fit below a value in frame `depth`: each
 * level takes a frame, and an object's key string one more. */
int32_t eng__sc_any_levels(int32_t depth)
{
    int32_t room = ENG_CS_MAX_DEPTH - depth - 2;
    if (room > ENG_CS_ANY_DEPTH)
        room = ENG_CS_ANY_DEPTH;
    return room < 0 ? 0 : room;
}
