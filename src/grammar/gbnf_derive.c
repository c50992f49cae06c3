/* gbnf_derive.c - the derivative of a GBNF grammar by a text: a grammar
 * of exactly the strings that may follow the text (gbnf.h).
 *
 * Another engine that takes a GBNF grammar but cannot be told the text a
 * stream already holds (llama-server's `grammar`, continued from a token
 * prompt) is given this grammar instead, and then allows exactly the
 * tokens the original would allow after the text.
 *
 * The text is run through a nondeterministic pushdown recognizer over the
 * parsed rules, as llama.cpp's own grammar runs: its state is a set of
 * stacks, each a list of items still to match (top last): a syntax node
 * whole, or a repetition with k matches done. A stack is expanded until a
 * character class is on top (or it is empty: the text may end there);
 * a code point pops the classes that take it and expands again. Expansion
 * remembers the stacks it has met, so a repetition of something that can
 * be empty ends; a left-recursive rule grows a stack without end and is
 * stopped by the depth bound. After the text, each stack is one
 * alternative of the new root: its items printed in order, a repetition
 * with the counts it has left, followed by every rule of the grammar under
 * its name (the old root renamed).
 *
 * Bounds: DV_MAX_STACKS stacks at once, DV_MAX_ITEMS items on one stack,
 * DV_MAX_VISITS stacks met in one expansion; past them SW_ERANGE. A text
 * that no string of the grammar begins with, or one that ends inside a
 * UTF-8 character (a grammar is over code points), is SW_EINVAL.
 */
#include "grammar/gbnf.h"

#include "common/alloc.h"
#include "grammar/gbnf-print.h"

#include <stdio.h>
#include <string.h>

#define DV_MAX_STACKS 256
#define DV_MAX_ITEMS 2048
#define DV_MAX_VISITS 20000
#define DV_INDEX 32768 /* a power of two above DV_MAX_VISITS */

/* A node to match whole (k < 0), or repetition node with k matches done. */
typedef struct dv_item {
    int32_t node, k;
} dv_item;

typedef struct dv_stack {
    int32_t n;
    dv_item *it; /* sw_malloc'd, n items, top at it[n - 1] */
} dv_stack;

typedef struct dv_set {
    int32_t n;
    dv_stack s[DV_MAX_STACKS];
} dv_set;

/* Stacks met during one expansion (the visit set) and the work list. */
typedef struct dv_work {
    const eng_gbnf *g;
    dv_stack *todo;
    int32_t n_todo, cap_todo;
    uint64_t *seen_hash;
    dv_stack *seen;
    int32_t n_seen;
    int32_t *index;       /* DV_INDEX slots: 1 + a seen stack's number, 0 free */
    int32_t *index_used;  /* the slots in use, to clear them */
    int rc;
    sw_error *err;
} dv_work;

static uint64_t stack_hash(const dv_stack *s)
{
    uint64_t h = 1469598103934665603ull ^ (uint64_t)s->n;
    for (int32_t i = 0; i < s->n; i++) {
        h = (h ^ (uint32_t)s->it[i].node) * 1099511628211ull;
        h = (h ^ (uint32_t)s->it[i].k) * 1099511628211ull;
    }
    return h;
}

static bool stack_equal(const dv_stack *a, const dv_stack *b)
{
    return a->n == b->n && (a->n == 0 || !memcmp(a->it, b->it, (size_t)a->n * sizeof *a->it));
}

static int dv_fail(dv_work *w, int code, const char *what)
{
    if (!w->rc) {
        w->rc = code;
        sw_error_set(w->err, code, "grammar: %s", what);
    }
    return code;
}

/* A copy of s with room for extra more items. */
static int stack_copy(dv_work *w, const dv_stack *s, int32_t extra, dv_stack *out)
{
    out->n = s->n;
    out->it = NULL;
    if (s->n + extra > DV_MAX_ITEMS)
        return dv_fail(w, SW_ERANGE, "the text nests too deeply (or a rule is left-recursive)");
    out->it = sw_malloc((size_t)(s->n + extra + 1) * sizeof *out->it);
    if (!out->it)
        return dv_fail(w, SW_ENOMEM, "out of memory");
    if (s->n)
        memcpy(out->it, s->it, (size_t)s->n * sizeof *s->it);
    return SW_OK;
}

static void set_clear(dv_set *set)
{
    for (int32_t i = 0; i < set->n; i++)
        sw_free(set->s[i].it);
    set->n = 0;
}

/* Queues s (owned) unless it was met already in this expansion. */
static int push_todo(dv_work *w, dv_stack s)
{
    uint64_t h = stack_hash(&s);
    uint32_t slot = (uint32_t)h & (DV_INDEX - 1);
    for (; w->index[slot]; slot = (slot + 1) & (DV_INDEX - 1)) {
        int32_t i = w->index[slot] - 1;
        if (w->seen_hash[i] == h && stack_equal(&w->seen[i], &s)) {
            sw_free(s.it);
            return SW_OK;
        }
    }
    if (w->n_seen >= DV_MAX_VISITS) {
        sw_free(s.it);
        return dv_fail(w, SW_ERANGE, "the grammar is too ambiguous to continue");
    }
    dv_stack copy;
    if (stack_copy(w, &s, 0, &copy)) {
        sw_free(s.it);
        return w->rc;
    }
    w->seen_hash[w->n_seen] = h;
    w->index_used[w->n_seen] = (int32_t)slot;
    w->seen[w->n_seen++] = copy;
    w->index[slot] = w->n_seen;
    if (w->n_todo == w->cap_todo) {
        int32_t c = w->cap_todo ? w->cap_todo * 2 : 64;
        dv_stack *t = sw_realloc(w->todo, (size_t)c * sizeof *t);
        if (!t) {
            sw_free(s.it);
            return dv_fail(w, SW_ENOMEM, "out of memory");
        }
        w->todo = t;
        w->cap_todo = c;
    }
    w->todo[w->n_todo++] = s;
    return SW_OK;
}

/* Adds s (owned) to out unless it is there. */
static int add_result(dv_work *w, dv_set *out, dv_stack s)
{
    for (int32_t i = 0; i < out->n; i++) {
        if (stack_equal(&out->s[i], &s)) {
            sw_free(s.it);
            return SW_OK;
        }
    }
    if (out->n >= DV_MAX_STACKS) {
        sw_free(s.it);
        return dv_fail(w, SW_ERANGE, "the grammar is too ambiguous to continue");
    }
    out->s[out->n++] = s;
    return SW_OK;
}

static void push_item(dv_stack *s, int32_t node, int32_t k)
{
    s->it[s->n++] = (dv_item){node, k};
}

/* One step of expansion of s (owned): queues its successors, or adds it
 * to out when a class is on top or it is empty. */
static int expand_one(dv_work *w, dv_stack s, dv_set *out)
{
    const eng_gbnf *g = w->g;
    if (s.n == 0)
        return add_result(w, out, s);
    dv_item top = s.it[s.n - 1];
    const eng_gbnf_node *nd = eng_gbnf_node_at(g, top.node);
    if (top.k < 0 && nd->kind == ENG_GBNF_CLASS)
        return add_result(w, out, s);
    s.n--;
    if (top.k < 0 && nd->kind == ENG_GBNF_SEQ) {
        int32_t n_children = 0;
        for (int32_t c = nd->first; c >= 0; c = eng_gbnf_node_at(g, c)->next)
            n_children++;
        dv_stack t;
        if (stack_copy(w, &s, n_children, &t)) {
            sw_free(s.it);
            return w->rc;
        }
        sw_free(s.it);
        /* children pushed last first, so the first is on top */
        int32_t base = t.n;
        t.n += n_children;
        int32_t i = 0;
        for (int32_t c = nd->first; c >= 0; c = eng_gbnf_node_at(g, c)->next, i++)
            t.it[base + n_children - 1 - i] = (dv_item){c, -1};
        return push_todo(w, t);
    }
    if (top.k < 0 && nd->kind == ENG_GBNF_ALT) {
        for (int32_t c = nd->first; c >= 0 && !w->rc; c = eng_gbnf_node_at(g, c)->next) {
            dv_stack t;
            if (stack_copy(w, &s, 1, &t))
                break;
            push_item(&t, c, -1);
            push_todo(w, t);
        }
        sw_free(s.it);
        return w->rc;
    }
    if (top.k < 0 && nd->kind == ENG_GBNF_REF) {
        dv_stack t;
        if (stack_copy(w, &s, 1, &t)) {
            sw_free(s.it);
            return w->rc;
        }
        sw_free(s.it);
        push_item(&t, eng_gbnf_rule_body(g, nd->rule), -1);
        return push_todo(w, t);
    }
    /* a repetition: node REP whole (k 0) or with top.k matches done */
    int32_t k = top.k < 0 ? 0 : top.k;
    int32_t child = nd->first;
    if (nd->max >= 0 && k >= nd->max)
        return push_todo(w, s); /* nothing left of it */
    if (k >= nd->min) {
        /* it may end here */
        dv_stack t;
        if (stack_copy(w, &s, 0, &t)) {
            sw_free(s.it);
            return w->rc;
        }
        if (push_todo(w, t)) {
            sw_free(s.it);
            return w->rc;
        }
    }
    /* one more match of the child, then the repetition's rest; an
     * unbounded one counts no further than its minimum, so its states
     * repeat and expansion ends */
    int32_t next = k + 1;
    if (nd->max < 0 && next > nd->min)
        next = nd->min;
    dv_stack t;
    if (stack_copy(w, &s, 2, &t)) {
        sw_free(s.it);
        return w->rc;
    }
    sw_free(s.it);
    if (nd->max < 0 || next < nd->max)
        push_item(&t, top.node, next);
    push_item(&t, child, -1);
    return push_todo(w, t);
}

/* Expands the stacks queued in w into out (classes on top, or empty). */
static int expand_all(dv_work *w, dv_set *out)
{
    while (w->n_todo > 0 && !w->rc) {
        dv_stack s = w->todo[--w->n_todo];
        expand_one(w, s, out);
    }
    while (w->n_todo > 0)
        sw_free(w->todo[--w->n_todo].it);
    for (int32_t i = 0; i < w->n_seen; i++) {
        sw_free(w->seen[i].it);
        w->index[w->index_used[i]] = 0;
    }
    w->n_seen = 0;
    return w->rc;
}

static bool class_has(const eng_gbnf *g, const eng_gbnf_node *nd, uint32_t cp)
{
    const eng_gbnf_range *r = eng_gbnf_class_ranges(g, nd);
    bool in = false;
    for (int32_t i = 0; i < nd->n_ranges && !in; i++)
        in = cp >= r[i].lo && cp <= r[i].hi;
    return in != nd->negated;
}

/* Decodes one UTF-8 code point at s (avail bytes); its length, 0 when
 * malformed or cut. */
static size_t utf8_decode(const uint8_t *s, size_t avail, uint32_t *cp)
{
    size_t k;
    uint32_t v;
    if (s[0] < 0x80) {
        *cp = s[0];
        return 1;
    }
    if (s[0] >= 0xC2 && s[0] <= 0xDF)
        k = 2, v = s[0] & 0x1F;
    else if (s[0] >= 0xE0 && s[0] <= 0xEF)
        k = 3, v = s[0] & 0x0F;
    else if (s[0] >= 0xF0 && s[0] <= 0xF4)
        k = 4, v = s[0] & 0x07;
    else
        return 0;
    if (avail < k)
        return 0;
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        v = v << 6 | (s[i] & 0x3F);
    }
    if ((k == 3 && v < 0x800) || (k == 4 && (v < 0x10000 || v > 0x10FFFF)) ||
        (v >= 0xD800 && v <= 0xDFFF))
        return 0;
    *cp = v;
    return k;
}

/* ---- printing ------------------------------------------------------------ */

static bool is_single(const eng_gbnf *g, const eng_gbnf_node *nd)
{
    return nd->kind == ENG_GBNF_CLASS && !nd->negated && nd->n_ranges == 1 &&
           eng_gbnf_class_ranges(g, nd)[0].lo == eng_gbnf_class_ranges(g, nd)[0].hi;
}

typedef struct dv_print {
    const eng_gbnf *g;
    const char *root_name; /* what the grammar's root is called in the output */
    eng__gb_out *o;
} dv_print;

static void print_rule_name(const dv_print *pr, int32_t rule)
{
    eng__gb_str(pr->o, rule == eng_gbnf_rule(pr->g, "root") ? pr->root_name
                                                        : eng_gbnf_rule_name(pr->g, rule));
}

static void print_node(const dv_print *pr, int32_t node, int depth);

static void print_count(eng__gb_out *o, int32_t lo, int32_t hi)
{
    char b[40];
    if (lo == 0 && hi < 0)
        eng__gb_str(o, "*");
    else if (lo == 1 && hi < 0)
        eng__gb_str(o, "+");
    else if (lo == 0 && hi == 1)
        eng__gb_str(o, "?");
    else if (lo == hi)
        snprintf(b, sizeof b, "{%d}", (int)lo), eng__gb_str(o, b);
    else if (hi < 0)
        snprintf(b, sizeof b, "{%d,}", (int)lo), eng__gb_str(o, b);
    else
        snprintf(b, sizeof b, "{%d,%d}", (int)lo, (int)hi), eng__gb_str(o, b);
}

/* Consecutive single characters of a sequence as one literal. */
static void print_seq(const dv_print *pr, int32_t first, int depth)
{
    const eng_gbnf *g = pr->g;
    bool any = false, in_lit = false;
    for (int32_t c = first; c >= 0; c = eng_gbnf_node_at(g, c)->next) {
        const eng_gbnf_node *nd = eng_gbnf_node_at(g, c);
        if (is_single(g, nd)) {
            if (!in_lit)
                eng__gb_str(pr->o, any ? " \"" : "\"");
            eng__gb_char(pr->o, eng_gbnf_class_ranges(g, nd)[0].lo);
            in_lit = true;
        } else {
            if (in_lit)
                eng__gb_str(pr->o, "\"");
            in_lit = false;
            if (any)
                eng__gb_str(pr->o, " ");
            print_node(pr, c, depth + 1);
        }
        any = true;
    }
    if (in_lit)
        eng__gb_str(pr->o, "\"");
    if (!any)
        eng__gb_str(pr->o, "\"\"");
}

/* The parts a sequence prints as: a run of single characters is one. */
static int32_t seq_parts(const eng_gbnf *g, int32_t first)
{
    int32_t n = 0;
    bool in_lit = false;
    for (int32_t c = first; c >= 0; c = eng_gbnf_node_at(g, c)->next) {
        bool single = is_single(g, eng_gbnf_node_at(g, c));
        n += !(single && in_lit);
        in_lit = single;
    }
    return n;
}

static void print_node(const dv_print *pr, int32_t node, int depth)
{
    const eng_gbnf *g = pr->g;
    const eng_gbnf_node *nd = eng_gbnf_node_at(g, node);
    if (depth > ENG_GBNF_MAX_DEPTH * 4) {
        pr->o->failed = pr->o->too_long = true; /* the parser's nesting bound keeps far below */
        return;
    }
    switch (nd->kind) {
    case ENG_GBNF_SEQ: {
        bool bare = seq_parts(g, nd->first) <= 1;
        if (!bare)
            eng__gb_str(pr->o, "(");
        print_seq(pr, nd->first, depth);
        if (!bare)
            eng__gb_str(pr->o, ")");
        return;
    }
    case ENG_GBNF_ALT:
        if (nd->first >= 0 && eng_gbnf_node_at(g, nd->first)->next < 0) {
            print_node(pr, nd->first, depth + 1);
            return;
        }
        eng__gb_str(pr->o, "(");
        for (int32_t c = nd->first; c >= 0; c = eng_gbnf_node_at(g, c)->next) {
            if (c != nd->first)
                eng__gb_str(pr->o, " | ");
            print_node(pr, c, depth + 1);
        }
        eng__gb_str(pr->o, ")");
        return;
    case ENG_GBNF_REP:
        eng__gb_str(pr->o, "(");
        print_node(pr, nd->first, depth + 1);
        eng__gb_str(pr->o, ")");
        print_count(pr->o, nd->min, nd->max);
        return;
    case ENG_GBNF_REF:
        print_rule_name(pr, nd->rule);
        return;
    case ENG_GBNF_CLASS: {
        const eng_gbnf_range *r = eng_gbnf_class_ranges(g, nd);
        if (is_single(g, nd)) {
            eng__gb_str(pr->o, "\"");
            eng__gb_char(pr->o, r[0].lo);
            eng__gb_str(pr->o, "\"");
            return;
        }
        if (!nd->negated && nd->n_ranges == 1 && r[0].lo == 0 && r[0].hi == 0x10FFFF) {
            eng__gb_str(pr->o, ".");
            return;
        }
        eng__gb_str(pr->o, nd->negated ? "[^" : "[");
        for (int32_t i = 0; i < nd->n_ranges; i++) {
            eng__gb_char(pr->o, r[i].lo);
            if (r[i].hi != r[i].lo) {
                eng__gb_str(pr->o, "-");
                eng__gb_char(pr->o, r[i].hi);
            }
        }
        eng__gb_str(pr->o, "]");
        return;
    }
    }
}

/* A rule's body (an alternation of sequences) without parentheses. */
static void print_body(const dv_print *pr, int32_t node)
{
    const eng_gbnf_node *nd = eng_gbnf_node_at(pr->g, node);
    if (nd->kind != ENG_GBNF_ALT) {
        print_node(pr, node, 0);
        return;
    }
    for (int32_t c = nd->first; c >= 0; c = eng_gbnf_node_at(pr->g, c)->next) {
        if (c != nd->first)
            eng__gb_str(pr->o, " | ");
        const eng_gbnf_node *cn = eng_gbnf_node_at(pr->g, c);
        if (cn->kind == ENG_GBNF_SEQ)
            print_seq(pr, cn->first, 1);
        else
            print_node(pr, c, 1);
    }
}

/* One stack as a sequence, top first. */
static void print_stack(const dv_print *pr, const dv_stack *s)
{
    if (s->n == 0) {
        eng__gb_str(pr->o, "\"\"");
        return;
    }
    for (int32_t i = s->n - 1; i >= 0; i--) {
        const dv_item *it = &s->it[i];
        if (i != s->n - 1)
            eng__gb_str(pr->o, " ");
        if (it->k < 0) {
            print_node(pr, it->node, 0);
            continue;
        }
        const eng_gbnf_node *nd = eng_gbnf_node_at(pr->g, it->node);
        int32_t lo = nd->min > it->k ? nd->min - it->k : 0;
        int32_t hi = nd->max < 0 ? -1 : nd->max - it->k;
        eng__gb_str(pr->o, "(");
        print_node(pr, nd->first, 1);
        eng__gb_str(pr->o, ")");
        print_count(pr->o, lo, hi);
    }
}

/* A rule name the grammar does not use, for its old root. */
static void fresh_root_name(const eng_gbnf *g, char *name, size_t cap)
{
    snprintf(name, cap, "root-whole");
    for (int i = 1; eng_gbnf_rule(g, name) >= 0; i++)
        snprintf(name, cap, "root-whole-%d", i);
}

int eng_gbnf_derive(const eng_gbnf *g, const char *text, size_t len, char **out, sw_error *err)
{
    *out = NULL;
    dv_work w = {.g = g, .err = err};
    dv_set *cur = sw_calloc(1, sizeof *cur), *next = sw_calloc(1, sizeof *next);
    w.seen_hash = sw_malloc(DV_MAX_VISITS * sizeof *w.seen_hash);
    w.seen = sw_malloc(DV_MAX_VISITS * sizeof *w.seen);
    w.index = sw_calloc(DV_INDEX, sizeof *w.index);
    w.index_used = sw_malloc(DV_MAX_VISITS * sizeof *w.index_used);
    eng__gb_out o = {0};
    if (!cur || !next || !w.seen_hash || !w.seen || !w.index || !w.index_used) {
        dv_fail(&w, SW_ENOMEM, "out of memory");
        goto done;
    }
    dv_stack start = {0, sw_malloc(sizeof *start.it)};
    if (!start.it) {
        dv_fail(&w, SW_ENOMEM, "out of memory");
        goto done;
    }
    push_item(&start, eng_gbnf_rule_body(g, eng_gbnf_rule(g, "root")), -1);
    push_todo(&w, start);
    if (expand_all(&w, cur))
        goto done;
    const uint8_t *p = (const uint8_t *)text;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t k = utf8_decode(p + i, len - i, &cp);
        if (!k) {
            dv_fail(&w, SW_EINVAL, len - i < 4 && p[i] >= 0xC2
                                       ? "the text ends inside a UTF-8 character"
                                       : "the text is not UTF-8");
            goto done;
        }
        i += k;
        for (int32_t s = 0; s < cur->n && !w.rc; s++) {
            dv_stack *st = &cur->s[s];
            if (st->n == 0 || !class_has(g, eng_gbnf_node_at(g, st->it[st->n - 1].node), cp))
                continue;
            dv_stack t;
            if (stack_copy(&w, st, 0, &t))
                break;
            t.n--;
            push_todo(&w, t);
        }
        if (expand_all(&w, next))
            goto done;
        set_clear(cur);
        dv_set *swap = cur;
        cur = next;
        next = swap;
        if (cur->n == 0) {
            char what[96];
            snprintf(what, sizeof what, "the text leaves the grammar at byte %zu", i - k);
            dv_fail(&w, SW_EINVAL, what);
            goto done;
        }
    }
    char root_name[64];
    fresh_root_name(g, root_name, sizeof root_name);
    dv_print pr = {g, root_name, &o};
    eng__gb_str(&o, "root ::= ");
    for (int32_t s = 0; s < cur->n; s++) {
        if (s)
            eng__gb_str(&o, " | ");
        print_stack(&pr, &cur->s[s]);
    }
    eng__gb_str(&o, "\n");
    for (int32_t r = 0; r < eng_gbnf_n_rules(g); r++) {
        print_rule_name(&pr, r);
        eng__gb_str(&o, " ::= ");
        print_body(&pr, eng_gbnf_rule_body(g, r));
        eng__gb_str(&o, "\n");
    }
    if (o.failed) {
        dv_fail(&w, o.too_long ? SW_ERANGE : SW_ENOMEM,
                o.too_long ? "the continued grammar is too long" : "out of memory");
        goto done;
    }
    *out = o.p;
    o.p = NULL;
done:
    sw_free(o.p);
    if (cur)
        set_clear(cur);
    if (next)
        set_clear(next);
    sw_free(cur);
    sw_free(next);
    sw_free(w.todo);
    sw_free(w.seen_hash);
    sw_free(w.seen);
    sw_free(w.index);
    sw_free(w.index_used);
    return w.rc;
}
