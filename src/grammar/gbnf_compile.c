/* gbnf_compile.c - a GBNF grammar (gbnf.h) compiled into the constraint
 * automaton's node graph (constrain-impl.h), so that a `grammar` is
 * enforced by the same machine as a JSON schema.
 *
 * The regular parts become byte automata (regex.h): a rule that is not
 * recursive, and uses no rule that is, is written out as an ECMA pattern
 * (the rules it names inlined) and becomes one CS_RAW node, so a string or
 * a number costs one stack frame and one table lookup per byte. What is
 * left (the recursive rules and what contains them) becomes CS_SEQ, CS_REP
 * and CS_ANYOF nodes, run by constrain.c as a pushdown machine; the
 * regular elements inside them are again merged into automata where they
 * stand side by side. A part whose automaton would be too large falls
 * back to the same structural nodes over its pieces (a few times: every
 * failed attempt costs the regex compiler's work bound).
 *
 * Then, over the graph: each node's shortest text (a fixpoint, since rules
 * recurse) with the nodes that have none pruned from where they could be
 * entered, left recursion refused (the automaton would descend without
 * reading a byte; llama.cpp refuses it too), and the stack frames each
 * node's shortest text needs, so the automaton never enters a value it
 * could not finish under ENG_CS_MAX_DEPTH.
 */
#include "grammar/gbnf.h"

#include "common/alloc.h"
#include "grammar/constrain-impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Pattern text of one automaton, and of all together. */
#define GC_MAX_PATTERN (64 * 1024)
#define GC_MAX_PATTERN_TOTAL (8 * 1024 * 1024)
/* Automata that came out too large before the grammar is refused. */
#define GC_MAX_FAILURES 8
/* Nodes of the compiled graph, automaton states over all of them, and the
 * node visits the fixpoints may make. */
#define GC_MAX_NODES 100000
#define GC_MAX_STATES (1 << 18)
#define GC_MAX_WORK (1L << 26)

typedef struct gc_text {
    char *p;
    size_t n, cap;
    bool overflow; /* past GC_MAX_PATTERN */
} gc_text;

typedef struct gc {
    const eng_gbnf *gb;
    eng_grammar *g;
    sw_error *err;
    int rc;
    int32_t n_rules;
    char **rule_text;    /* a rule that can be inlined: its pattern (NULL: it cannot) */
    int32_t *rule_node;  /* a rule's node, -1 until made */
    int8_t *regular;     /* per syntax node: -1 unknown, 0 no, 1 all of it inlinable */
    int32_t *node_rule;  /* per graph node: the rule it is the body of, or -1 */
    size_t text_total;
    int failures;
    int64_t n_states;
} gc;

static int gc_fail(gc *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Records the first error (the message is prefixed "grammar: "); -1. */
static int gc_fail(gc *c, int code, const char *fmt, ...)
{
    if (!c->rc) {
        char msg[SW_ERROR_MESSAGE_MAX - 16];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        c->rc = code;
        sw_error_set(c->err, code, "grammar: %s", msg);
    }
    return -1;
}

/* ---- pattern text -------------------------------------------------------- */

static bool text_put(gc_text *t, const char *s, size_t n)
{
    if (t->overflow || t->n + n + 1 > GC_MAX_PATTERN)
        return !(t->overflow = true);
    if (t->n + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 256;
        while (cap < t->n + n + 1)
            cap *= 2;
        char *p = sw_realloc(t->p, cap);
        if (!p)
            return !(t->overflow = true);
        t->p = p;
        t->cap = cap;
    }
    memcpy(t->p + t->n, s, n);
    t->n += n;
    t->p[t->n] = 0;
    return true;
}

static bool text_str(gc_text *t, const char *s)
{
    return text_put(t, s, strlen(s));
}

/* One code point: letters and digits as themselves, the rest escaped. */
static bool text_cp(gc_text *t, uint32_t cp)
{
    char buf[16];
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9'))
        buf[0] = (char)cp, buf[1] = 0;
    else
        snprintf(buf, sizeof buf, "\\u{%X}", (unsigned)cp);
    return text_str(t, buf);
}

/* A class's ranges, the surrogates (never a character) left out. */
static bool text_class(gc_text *t, const eng_gbnf_node *nd, const eng_gbnf_range *ranges)
{
    if (!nd->negated && nd->n_ranges == 1 && ranges[0].lo == ranges[0].hi)
        return text_cp(t, ranges[0].lo);
    bool ok = text_str(t, nd->negated ? "[^" : "[");
    for (int32_t i = 0; ok && i < nd->n_ranges; i++) {
        uint32_t lo = ranges[i].lo, hi = ranges[i].hi;
        for (int part = 0; ok && part < 2; part++) {
            uint32_t a = part ? (lo > 0xE000 ? lo : 0xE000) : lo;
            uint32_t b = part ? hi : (hi < 0xD7FF ? hi : 0xD7FF);
            if (a > b || (part == 0 && a > 0xD7FF))
                continue;
            ok = text_cp(t, a) && (a == b || (text_str(t, "-") && text_cp(t, b)));
        }
    }
    return ok && text_str(t, "]");
}

/* Whether every rule under syntax node x can be inlined. */
static bool is_regular(gc *c, int32_t x)
{
    if (c->regular[x] >= 0)
        return c->regular[x];
    const eng_gbnf_node *nd = eng_gbnf_node_at(c->gb, x);
    bool r = true;
    if (nd->kind == ENG_GBNF_REF)
        r = c->rule_text[nd->rule] != NULL;
    for (int32_t k = nd->first; r && k >= 0; k = eng_gbnf_node_at(c->gb, k)->next)
        r = is_regular(c, k);
    c->regular[x] = r;
    return r;
}

/* The pattern of a regular syntax node (one that binds tighter than
 * concatenation, except a sequence, which the caller groups if need be). */
static bool text_node(gc *c, int32_t x, gc_text *t)
{
    const eng_gbnf_node *nd = eng_gbnf_node_at(c->gb, x);
    bool ok = true;
    switch (nd->kind) {
    case ENG_GBNF_CLASS: return text_class(t, nd, eng_gbnf_class_ranges(c->gb, nd));
    case ENG_GBNF_REF:
        return text_str(t, "(?:") && text_str(t, c->rule_text[nd->rule]) && text_str(t, ")");
    case ENG_GBNF_SEQ:
        for (int32_t k = nd->first; ok && k >= 0; k = eng_gbnf_node_at(c->gb, k)->next)
            ok = text_node(c, k, t);
        return ok;
    case ENG_GBNF_ALT:
        ok = text_str(t, "(?:");
        for (int32_t k = nd->first; ok && k >= 0; k = eng_gbnf_node_at(c->gb, k)->next)
            ok = (k == nd->first || text_str(t, "|")) && text_node(c, k, t);
        return ok && text_str(t, ")");
    case ENG_GBNF_REP: {
        char q[48];
        if (nd->max < 0)
            snprintf(q, sizeof q, nd->min == 0 ? "*" : nd->min == 1 ? "+" : "{%d,}", (int)nd->min);
        else if (nd->min == 0 && nd->max == 1)
            snprintf(q, sizeof q, "?");
        else if (nd->min == nd->max)
            snprintf(q, sizeof q, "{%d}", (int)nd->min);
        else
            snprintf(q, sizeof q, "{%d,%d}", (int)nd->min, (int)nd->max);
        return text_str(t, "(?:") && text_node(c, nd->first, t) && text_str(t, ")") &&
               text_str(t, q);
    }
    }
    return false;
}

/* ---- graph nodes --------------------------------------------------------- */

static void node_free_parts(cs_node *n)
{
    sw_free(n->seq);
    sw_free(n->seq_from);
    sw_free(n->alts);
    eng_regex_free(n->re);
    eng_regex_costs_free(n->re_costs);
}

/* Appends a node (moved in; freed on failure); slot >= 0 fills a reserved
 * one instead. Returns the index or -1. */
static int32_t gc_put(gc *c, cs_node *nd, int32_t slot)
{
    eng_grammar *g = c->g;
    if (slot >= 0) {
        g->nodes[slot] = *nd;
        return slot;
    }
    if (g->n_nodes >= GC_MAX_NODES) {
        node_free_parts(nd);
        return gc_fail(c, SW_ERANGE, "too large (more than %d automaton nodes)", GC_MAX_NODES);
    }
    if (g->n_nodes == g->cap_nodes) {
        int32_t cap = g->cap_nodes ? g->cap_nodes * 2 : 64;
        cs_node *p = sw_realloc(g->nodes, (size_t)cap * sizeof *p);
        int32_t *q = sw_realloc(c->node_rule, (size_t)cap * sizeof *q);
        if (p)
            g->nodes = p;
        if (q)
            c->node_rule = q;
        if (!p || !q) {
            node_free_parts(nd);
            return gc_fail(c, SW_ENOMEM, "out of memory");
        }
        g->cap_nodes = cap;
    }
    c->node_rule[g->n_nodes] = -1;
    g->nodes[g->n_nodes] = *nd;
    return g->n_nodes++;
}

/* A CS_RAW node of a pattern. -2: its automaton is too large and the
 * caller may build the part from its pieces instead (when may_fail). */
static int32_t gc_raw(gc *c, const gc_text *t, bool may_fail, int32_t slot)
{
    static uint8_t ones[256];
    if (!ones[0])
        memset(ones, 1, sizeof ones);
    if (t->overflow)
        return may_fail ? -2 : gc_fail(c, SW_ERANGE, "a part is too large");
    c->text_total += t->n;
    if (c->text_total > GC_MAX_PATTERN_TOTAL)
        return gc_fail(c, SW_ERANGE, "too large (its automata)");
    gc_text full = {0};
    text_str(&full, "^(?:");
    text_put(&full, t->p ? t->p : "", t->n);
    text_str(&full, ")$");
    if (full.overflow && !full.p) {
        sw_free(full.p);
        return gc_fail(c, SW_ENOMEM, "out of memory");
    }
    cs_node nd;
    memset(&nd, 0, sizeof nd);
    nd.kind = CS_RAW;
    sw_error e;
    int rc = full.overflow ? SW_ERANGE : eng_regex_compile_cached(full.p, full.n, &nd.re, &e);
    sw_free(full.p);
    if (rc == SW_ENOMEM)
        return gc_fail(c, rc, "out of memory");
    if (rc) {
        if (may_fail && c->failures < GC_MAX_FAILURES) {
            c->failures++;
            return -2;
        }
        return gc_fail(c, SW_ERANGE, "too complex (the automaton of a part has too many states)");
    }
    c->n_states += eng_regex_n_states(nd.re);
    if (c->n_states > GC_MAX_STATES) {
        node_free_parts(&nd);
        return gc_fail(c, SW_ERANGE, "too large (its automata)");
    }
    if ((rc = eng_regex_costs_build(nd.re, ones, 0, INT32_MAX, &nd.re_costs, &e))) {
        node_free_parts(&nd);
        return gc_fail(c, rc, "%s", e.message);
    }
    int64_t m = eng_regex_costs_get(nd.re_costs, eng_regex_start(nd.re), 0);
    nd.min_bytes = m < 0 || m > CS_LEN_CAP ? CS_LEN_CAP : (int32_t)m;
    nd.need_frames = 1;
    return gc_put(c, &nd, slot);
}

/* A sequence or an any-of of the nodes in list (owned by the node). */
static int32_t gc_list(gc *c, cs_kind kind, int32_t *list, int32_t n, int32_t slot)
{
    if (n == 1 && slot < 0) {
        int32_t only = list[0];
        sw_free(list);
        return only;
    }
    cs_node nd;
    memset(&nd, 0, sizeof nd);
    nd.kind = kind;
    if (kind == CS_SEQ) {
        nd.seq = list;
        nd.n_seq = n;
    } else {
        nd.alts = list;
        nd.n_alts = n;
    }
    return gc_put(c, &nd, slot);
}

static int32_t compile_node(gc *c, int32_t x, int32_t slot);

/* The node of a rule used where it is named. */
static int32_t rule_node(gc *c, int32_t r)
{
    if (c->rule_node[r] >= 0)
        return c->rule_node[r];
    /* inlinable, and named beside something that is not */
    gc_text t = {c->rule_text[r], strlen(c->rule_text[r]), 0, false};
    int32_t n = gc_raw(c, &t, true, -1);
    if (n == -2)
        n = compile_node(c, eng_gbnf_rule_body(c->gb, r), -1);
    return n < 0 ? -1 : (c->rule_node[r] = n);
}

/* Regular syntax nodes xs[0..n) as one automaton: their concatenation, or
 * (alt) their alternation. -2 when it comes out too large. */
static int32_t regular_node(gc *c, const int32_t *xs, int32_t n, bool alt, int32_t slot)
{
    gc_text t = {0};
    bool ok = !alt || text_str(&t, "(?:");
    for (int32_t i = 0; ok && i < n; i++)
        ok = (!alt || i == 0 || text_str(&t, "|")) && text_node(c, xs[i], &t);
    if (ok && alt)
        text_str(&t, ")");
    bool one_class = n == 1 && eng_gbnf_node_at(c->gb, xs[0])->kind == ENG_GBNF_CLASS;
    int32_t r = gc_raw(c, &t, !one_class, slot);
    sw_free(t.p);
    return r;
}

/* A sequence's or an alternation's children: the regular ones that stand
 * side by side in a sequence, or all regular alternatives (their order
 * does not matter), become one automaton where it fits; the others nodes
 * of their own. */
static int32_t compile_children(gc *c, const eng_gbnf_node *nd, bool alt, bool whole_failed,
                                int32_t slot)
{
    int32_t count = 0, n = 0, n_reg = 0;
    for (int32_t k = nd->first; k >= 0; k = eng_gbnf_node_at(c->gb, k)->next)
        count++;
    int32_t *list = sw_malloc(((size_t)count + 1) * sizeof *list);
    int32_t *reg = sw_malloc(((size_t)count + 1) * sizeof *reg);
    if (!list || !reg)
        goto oom;
    for (int32_t k = nd->first; k >= 0; k = eng_gbnf_node_at(c->gb, k)->next) {
        bool regular = is_regular(c, k);
        if (regular)
            reg[n_reg++] = k;
        int32_t next = eng_gbnf_node_at(c->gb, k)->next;
        bool flush = alt ? next < 0 : !regular || next < 0 || !is_regular(c, next);
        if (n_reg > 0 && flush) {
            /* all of them as one was tried already when whole_failed */
            bool tried = whole_failed && n_reg == count;
            int32_t m = n_reg > 1 && !tried ? regular_node(c, reg, n_reg, alt, -1) : -2;
            if (m == -1)
                goto fail;
            if (m >= 0)
                list[n++] = m;
            for (int32_t i = 0; m == -2 && i < n_reg; i++)
                if ((list[n++] = compile_node(c, reg[i], -1)) < 0)
                    goto fail;
            n_reg = 0;
        }
        if (!regular && (list[n++] = compile_node(c, k, -1)) < 0)
            goto fail;
    }
    sw_free(reg);
    return gc_list(c, alt ? CS_ANYOF : CS_SEQ, list, n, slot);
oom:
    gc_fail(c, SW_ENOMEM, "out of memory");
fail:
    sw_free(list);
    sw_free(reg);
    return -1;
}

/* Syntax node x as a graph node (into slot when >= 0). */
static int32_t compile_node(gc *c, int32_t x, int32_t slot)
{
    const eng_gbnf_node *nd = eng_gbnf_node_at(c->gb, x);
    if (nd->kind == ENG_GBNF_ALT && nd->first >= 0 && eng_gbnf_node_at(c->gb, nd->first)->next < 0)
        return compile_node(c, nd->first, slot); /* one alternative: the same language */
    bool failed = false;
    if (is_regular(c, x) && (nd->kind != ENG_GBNF_REF || slot >= 0)) {
        int32_t n = regular_node(c, &x, 1, false, slot);
        if (n != -2)
            return n;
        failed = true;
    }
    switch (nd->kind) {
    case ENG_GBNF_CLASS: return -1; /* regular_node failed for good */
    case ENG_GBNF_REF: {
        int32_t r = rule_node(c, nd->rule);
        if (r < 0 || slot < 0)
            return r;
        int32_t *one = sw_malloc(sizeof *one);
        if (!one)
            return gc_fail(c, SW_ENOMEM, "out of memory");
        one[0] = r;
        return gc_list(c, CS_SEQ, one, 1, slot);
    }
    case ENG_GBNF_SEQ: return compile_children(c, nd, false, failed, slot);
    case ENG_GBNF_ALT: return compile_children(c, nd, true, failed, slot);
    case ENG_GBNF_REP: {
        int32_t item = compile_node(c, nd->first, -1);
        if (item < 0)
            return -1;
        cs_node rep;
        memset(&rep, 0, sizeof rep);
        rep.kind = CS_REP;
        rep.item = item;
        rep.min_items = nd->min;
        rep.max_items = nd->max;
        return gc_put(c, &rep, slot);
    }
    }
    return -1;
}

/* ---- the rules ----------------------------------------------------------- */

/* The rules a syntax node names, appended to *out. */
static int collect_refs(const eng_gbnf *gb, int32_t x, int32_t **out, int32_t *n, int32_t *cap)
{
    const eng_gbnf_node *nd = eng_gbnf_node_at(gb, x);
    if (nd->kind == ENG_GBNF_REF) {
        if (*n == *cap) {
            int32_t nc = *cap ? *cap * 2 : 64;
            int32_t *p = sw_realloc(*out, (size_t)nc * sizeof *p);
            if (!p)
                return SW_ENOMEM;
            *out = p;
            *cap = nc;
        }
        (*out)[(*n)++] = nd->rule;
    }
    for (int32_t k = nd->first; k >= 0; k = eng_gbnf_node_at(gb, k)->next)
        if (collect_refs(gb, k, out, n, cap))
            return SW_ENOMEM;
    return SW_OK;
}

/* The rules reachable from root in post-order (a rule after those it
 * names), and which of them are recursive or name one that is: an
 * iterative depth-first walk (rules may be many). */
static int order_rules(gc *c, int32_t *order, int32_t *n_order, bool *cyclic)
{
    int32_t nr = c->n_rules, *edges = NULL, n_edges = 0, cap = 0;
    int32_t *first = sw_malloc(((size_t)nr + 1) * sizeof *first);
    int32_t *stack = sw_malloc(((size_t)nr + 1) * sizeof *stack);
    int32_t *cursor = sw_malloc(((size_t)nr + 1) * sizeof *cursor);
    uint8_t *color = sw_calloc((size_t)nr + 1, 1);
    int rc = SW_ENOMEM;
    if (!first || !stack || !cursor || !color)
        goto done;
    for (int32_t r = 0; r < nr; r++) {
        first[r] = n_edges;
        if (collect_refs(c->gb, eng_gbnf_rule_body(c->gb, r), &edges, &n_edges, &cap))
            goto done;
    }
    first[nr] = n_edges;
    int32_t sp = 0, root = eng_gbnf_rule(c->gb, "root");
    stack[sp++] = root;
    cursor[root] = first[root];
    color[root] = 1;
    *n_order = 0;
    while (sp > 0) {
        int32_t r = stack[sp - 1];
        if (cursor[r] < first[r + 1]) {
            int32_t s = edges[cursor[r]++];
            if (color[s] == 0) {
                color[s] = 1;
                cursor[s] = first[s];
                stack[sp++] = s;
            } else if (color[s] == 1 || cyclic[s]) {
                cyclic[r] = true; /* on a cycle, or naming a rule that is */
            }
            continue;
        }
        color[r] = 2;
        order[(*n_order)++] = r;
        if (--sp > 0 && cyclic[r])
            cyclic[stack[sp - 1]] = true;
    }
    rc = SW_OK;
done:
    sw_free(edges);
    sw_free(first);
    sw_free(stack);
    sw_free(cursor);
    sw_free(color);
    return rc;
}

/* ---- the graph ----------------------------------------------------------- */

static int32_t add_cap(int64_t a, int64_t b)
{
    return a + b >= CS_LEN_CAP ? CS_LEN_CAP : (int32_t)(a + b);
}

/* Shortest texts, to the fixpoint. */
static int min_lengths(gc *c)
{
    eng_grammar *g = c->g;
    for (int32_t i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].kind != CS_RAW)
            g->nodes[i].min_bytes = CS_LEN_CAP;
    long work = 0;
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t i = 0; i < g->n_nodes; i++) {
            cs_node *n = &g->nodes[i];
            int64_t m = 0;
            if (n->kind == CS_RAW)
                continue;
            if (n->kind == CS_SEQ) {
                for (int32_t k = 0; k < n->n_seq; k++)
                    m = add_cap(m, g->nodes[n->seq[k]].min_bytes);
                work += n->n_seq;
            } else if (n->kind == CS_REP) {
                int64_t item = g->nodes[n->item].min_bytes;
                m = n->min_items == 0 ? 0 : item >= CS_LEN_CAP ? CS_LEN_CAP
                                                               : add_cap(0, item * n->min_items);
            } else {
                m = CS_LEN_CAP;
                for (int32_t k = 0; k < n->n_alts; k++)
                    if (g->nodes[n->alts[k]].min_bytes < m)
                        m = g->nodes[n->alts[k]].min_bytes;
                work += n->n_alts;
            }
            if (m < n->min_bytes) {
                n->min_bytes = (int32_t)m;
                changed = true;
            }
        }
        if ((work += g->n_nodes) > GC_MAX_WORK)
            return gc_fail(c, SW_ERANGE, "too complex (its shortest texts)");
    }
    return 0;
}

/* Nodes without a finite text are never entered: dropped from any-ofs,
 * repetitions of them allow none. Then each sequence's suffix minima. */
static int prune(gc *c)
{
    eng_grammar *g = c->g;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        cs_node *n = &g->nodes[i];
        if (n->kind == CS_ANYOF) {
            int32_t k = 0;
            for (int32_t j = 0; j < n->n_alts; j++)
                if (g->nodes[n->alts[j]].min_bytes < CS_LEN_CAP)
                    n->alts[k++] = n->alts[j];
            n->n_alts = k;
        } else if (n->kind == CS_REP && g->nodes[n->item].min_bytes >= CS_LEN_CAP) {
            n->max_items = 0;
        } else if (n->kind == CS_SEQ) {
            if (!(n->seq_from = sw_malloc(((size_t)n->n_seq + 1) * sizeof *n->seq_from)))
                return gc_fail(c, SW_ENOMEM, "out of memory");
            n->seq_from[n->n_seq] = 0;
            for (int32_t k = n->n_seq - 1; k >= 0; k--)
                n->seq_from[k] = add_cap(n->seq_from[k + 1], g->nodes[n->seq[k]].min_bytes);
        }
    }
    return 0;
}

/* The nodes a node may enter before reading a byte (constrain.c's
 * enter): its first children up to one that cannot be empty. */
static int32_t first_edges(const eng_grammar *g, const cs_node *n, int32_t k)
{
    if (n->kind == CS_ANYOF)
        return k < n->n_alts ? n->alts[k] : -1;
    if (n->kind == CS_REP)
        return k == 0 && n->max_items != 0 ? n->item : -1;
    if (n->kind == CS_SEQ && k < n->n_seq && (k == 0 || g->nodes[n->seq[k - 1]].min_bytes == 0))
        return n->seq[k];
    return -1;
}

/* Left recursion: a cycle of first_edges anywhere in the graph (an
 * iterative depth-first walk from every node not yet seen: a rule reached
 * only after a byte is entered as freshly as the root, so checking the
 * root's first nodes alone missed `root ::= . a`, `a ::= "x"* a | ...`). */
static int left_recursion(gc *c)
{
    eng_grammar *g = c->g;
    int32_t nn = g->n_nodes, sp = 0;
    int32_t *stack = sw_malloc((size_t)nn * sizeof *stack);
    int32_t *cursor = sw_calloc((size_t)nn, sizeof *cursor);
    uint8_t *color = sw_calloc((size_t)nn, 1);
    int rc = 0;
    if (!stack || !cursor || !color) {
        rc = gc_fail(c, SW_ENOMEM, "out of memory");
        goto done;
    }
    for (int32_t from = 0; from < nn && !rc; from++) {
        if (color[from])
            continue;
        stack[sp++] = from;
        color[from] = 1;
        while (sp > 0 && !rc) {
            int32_t x = stack[sp - 1];
            int32_t y = first_edges(g, &g->nodes[x], cursor[x]++);
            if (y < 0) {
                color[x] = 2;
                sp--;
            } else if (color[y] == 0) {
                color[y] = 1;
                stack[sp++] = y;
            } else if (color[y] == 1) {
                const char *name = "?";
                for (int32_t i = sp - 1; i >= 0; i--) {
                    if (c->node_rule[stack[i]] >= 0)
                        name = eng_gbnf_rule_name(c->gb, c->node_rule[stack[i]]);
                    if (stack[i] == y)
                        break;
                }
                rc = gc_fail(c, SW_EINVAL,
                             "grammar: rule '%.64s' is left-recursive (it can reach itself "
                             "before any character)", name);
            }
        }
    }
done:
    sw_free(stack);
    sw_free(cursor);
    sw_free(color);
    return rc;
}

/* Frames of each node's shortest text, to the fixpoint (from above: a
 * shortest text is a finite tree, so the values come down to it). */
static int need_frames(gc *c)
{
    eng_grammar *g = c->g;
    const int32_t top = ENG_CS_MAX_DEPTH + 1;
    for (int32_t i = 0; i < g->n_nodes; i++)
        g->nodes[i].need_frames = g->nodes[i].kind == CS_RAW ? 1 : top;
    long work = 0;
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t i = 0; i < g->n_nodes; i++) {
            cs_node *n = &g->nodes[i];
            int32_t v = 1;
            if (n->kind == CS_RAW)
                continue;
            if (n->kind == CS_SEQ) {
                for (int32_t k = 0; k < n->n_seq; k++) {
                    const cs_node *ch = &g->nodes[n->seq[k]];
                    /* the last child replaces the sequence's frame */
                    int32_t d = ch->min_bytes == 0 ? 0 : ch->need_frames + (k + 1 < n->n_seq);
                    if (d > v)
                        v = d;
                }
                work += n->n_seq;
            } else if (n->kind == CS_REP) {
                if (n->min_items > 0 && g->nodes[n->item].min_bytes > 0)
                    v = 1 + g->nodes[n->item].need_frames;
            } else {
                v = top;
                for (int32_t k = 0; k < n->n_alts; k++) {
                    const cs_node *a = &g->nodes[n->alts[k]];
                    if (a->min_bytes == n->min_bytes && a->need_frames < v)
                        v = a->need_frames;
                }
                work += n->n_alts;
            }
            if (v > top)
                v = top;
            if (v < n->need_frames) {
                n->need_frames = v;
                changed = true;
            }
        }
        if ((work += g->n_nodes) > GC_MAX_WORK)
            return gc_fail(c, SW_ERANGE, "too complex (its nesting)");
    }
    return 0;
}

/* The bytes each node's texts may begin with (the least fixpoint over
 * first_edges: an automaton's from its start state, a sequence's or an
 * any-of's the union of the nodes it may enter first), stored as their
 * complement in refused_first. Past the work bound nothing is ruled out,
 * which is only slower. */
static int first_bytes(gc *c)
{
    eng_grammar *g = c->g;
    int32_t nn = g->n_nodes;
    uint32_t(*first)[8] = sw_calloc((size_t)nn, sizeof *first);
    if (!first)
        return gc_fail(c, SW_ENOMEM, "out of memory");
    for (int32_t i = 0; i < nn; i++) {
        const cs_node *n = &g->nodes[i];
        if (n->kind != CS_RAW)
            continue;
        int32_t start = eng_regex_start(n->re);
        for (int b = 0; b < 256; b++)
            if (eng_regex_step(n->re, start, (uint8_t)b) >= 0)
                first[i][b >> 5] |= 1u << (b & 31);
    }
    long work = 0;
    bool changed = true;
    while (changed && work <= GC_MAX_WORK) {
        changed = false;
        for (int32_t i = 0; i < nn; i++) {
            const cs_node *n = &g->nodes[i];
            if (n->kind == CS_RAW)
                continue;
            for (int32_t k = 0, y; (y = first_edges(g, n, k)) >= 0; k++, work++)
                for (int w = 0; w < 8; w++) {
                    uint32_t v = first[i][w] | first[y][w];
                    changed |= v != first[i][w];
                    first[i][w] = v;
                }
        }
        work += nn;
    }
    for (int32_t i = 0; i < nn; i++)
        for (int w = 0; w < 8; w++)
            g->nodes[i].refused_first[w] = changed ? 0 : ~first[i][w];
    sw_free(first);
    return 0;
}

static int compile(gc *c)
{
    int32_t nr = c->n_rules, n_order = 0;
    int32_t *order = sw_malloc((size_t)nr * sizeof *order);
    bool *cyclic = sw_calloc((size_t)nr, sizeof *cyclic);
    int rc = SW_ENOMEM;
    if (!order || !cyclic || order_rules(c, order, &n_order, cyclic)) {
        gc_fail(c, SW_ENOMEM, "out of memory");
        goto done;
    }
    /* patterns of the rules that can be inlined, each after those it names */
    for (int32_t i = 0; i < n_order; i++) {
        int32_t r = order[i], body = eng_gbnf_rule_body(c->gb, r);
        if (cyclic[r] || !is_regular(c, body))
            continue;
        gc_text t = {0};
        if (text_node(c, body, &t) && !t.overflow)
            c->rule_text[r] = t.p ? t.p : sw_strdup("");
        else
            sw_free(t.p);
        if (!c->rule_text[r] && !t.overflow) {
            gc_fail(c, SW_ENOMEM, "out of memory");
            goto done;
        }
    }
    /* a node reserved for every other rule, so recursion can name it */
    cs_node empty;
    memset(&empty, 0, sizeof empty);
    empty.kind = CS_SEQ;
    for (int32_t i = 0; i < n_order; i++) {
        int32_t r = order[i];
        if (c->rule_text[r])
            continue;
        if ((c->rule_node[r] = gc_put(c, &empty, -1)) < 0)
            goto done;
        c->node_rule[c->rule_node[r]] = r;
    }
    for (int32_t i = 0; i < n_order; i++) {
        int32_t r = order[i];
        if (!c->rule_text[r] && compile_node(c, eng_gbnf_rule_body(c->gb, r), c->rule_node[r]) < 0)
            goto done;
    }
    int32_t root = eng_gbnf_rule(c->gb, "root");
    if ((c->g->root = rule_node(c, root)) < 0 || min_lengths(c))
        goto done;
    if (c->g->nodes[c->g->root].min_bytes >= CS_LEN_CAP) {
        gc_fail(c, SW_EINVAL, "'root' has no finite text (its rules recurse without a way out)");
        goto done;
    }
    if (prune(c) || left_recursion(c) || need_frames(c) || first_bytes(c))
        goto done;
    if (c->g->nodes[c->g->root].need_frames + 1 > ENG_CS_MAX_DEPTH) {
        gc_fail(c, SW_ERANGE, "nested too deeply (its shortest text needs more than the "
                "automaton's %d levels)", ENG_CS_MAX_DEPTH - 1);
        goto done;
    }
    rc = SW_OK;
done:
    sw_free(order);
    sw_free(cyclic);
    return rc ? (c->rc ? c->rc : rc) : SW_OK;
}

int eng_grammar_from_gbnf(const char *text, size_t len, eng_grammar **out, sw_error *err)
{
    *out = NULL;
    eng_gbnf *gb = NULL;
    int rc = eng_gbnf_parse(text, len, &gb, err);
    if (rc)
        return rc;
    gc c;
    memset(&c, 0, sizeof c);
    c.gb = gb;
    c.err = err;
    c.n_rules = eng_gbnf_n_rules(gb);
    c.g = sw_calloc(1, sizeof *c.g);
    c.rule_text = sw_calloc((size_t)c.n_rules, sizeof *c.rule_text);
    c.rule_node = sw_malloc((size_t)c.n_rules * sizeof *c.rule_node);
    c.regular = sw_malloc((size_t)eng_gbnf_n_nodes(gb));
    if (!c.g || !c.rule_text || !c.rule_node || !c.regular) {
        rc = sw_error_set(err, SW_ENOMEM, "grammar: out of memory");
    } else {
        for (int i = 0; i <= ENG_CS_ANY_DEPTH; i++)
            c.g->any_cache[i] = -1;
        c.g->any_key = -1;
        c.g->root = -1;
        for (int32_t r = 0; r < c.n_rules; r++)
            c.rule_node[r] = -1;
        memset(c.regular, 0xFF, (size_t)eng_gbnf_n_nodes(gb));
        rc = compile(&c);
    }
    for (int32_t r = 0; c.rule_text && r < c.n_rules; r++)
        sw_free(c.rule_text[r]);
    sw_free(c.rule_text);
    sw_free(c.rule_node);
    sw_free(c.regular);
    sw_free(c.node_rule);
    eng_gbnf_free(gb);
    if (rc) {
        eng_grammar_free(c.g);
        return rc;
    }
    *out = c.g;
    return SW_OK;
}
