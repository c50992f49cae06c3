/* regex_look.c - lookahead (?= ) and (?! ): the lookahead's own DFA and
 * the product of the NFA that follows it with that DFA (see below).
 */
#include "grammar/regex-impl.h"

#include "common/alloc.h"

/* ---- lookahead ----------------------------------------------------------
 * (?=X) and (?!X) at a point of the pattern constrain the rest of the
 * string from there: some prefix of it matches X, or none does. X is
 * compiled on its own into a DFA (anchored at that point, any text after
 * it), and the part of the NFA that follows the lookahead (`next` and all
 * it reaches, the trailing loop included) is copied as a product with that
 * DFA: state (q, d) reads a byte as q does while d steps X's automaton over
 * it. Once d has matched for good (a positive lookahead holds) or can no
 * longer match (a negative one holds), the copy hands over to the original
 * q; the opposite outcomes drop the edge. At the end of the string ($, or
 * the match state) a pending lookahead is decided by whether d accepts
 * there. Built back to front like the rest, the continuation must be
 * complete: a lookahead inside an unbounded repetition (whose loop edge is
 * patched in after its body) is refused. */

static bool ast_has_bol(const re_parser *p, int32_t id)
{
    const re_ast *a = &p->nodes[id];
    if (a->kind == A_BOL)
        return true;
    for (int32_t c = a->first; c >= 0; c = p->nodes[c].next)
        if (ast_has_bol(p, c))
            return true;
    return false;
}

/* X (the AST node id) as a DFA of the strings that start with a match of
 * X; at_start: whether ^ inside it holds where it begins. */
static int look_dfa(const re_parser *p, int32_t id, bool at_start, int32_t *n_looks,
                    eng_regex **out)
{
    if (++*n_looks > RE_MAX_LOOKS)
        return SW_ERANGE;
    re_nfa m2 = {0};
    m2.n_looks = *n_looks;
    int32_t match = eng__rx_nfa_add(&m2, NS_MATCH, 0, 0, -1, -1);
    int32_t tail = eng__rx_emit_any_star(&m2, match);
    int32_t body = eng__rx_emit(&m2, p, id, tail);
    int rc = body < 0 ? (m2.rc ? m2.rc : SW_EINTERNAL) : SW_OK;
    eng_regex *re = NULL;
    if (!rc && !(re = sw_calloc(1, sizeof *re)))
        rc = SW_ENOMEM;
    if (!rc)
        rc = eng__rx_dfa_build_all(&m2, body, tail, re, at_start);
    *n_looks = m2.n_looks;
    eng__rx_nfa_free(&m2);
    if (rc) {
        eng_regex_free(re);
        return rc;
    }
    *out = re;
    return SW_OK;
}

typedef struct look_prod {
    re_nfa *m;
    const eng_regex *x;
    bool neg;
    int32_t fail;      /* an NS_FAIL state */
    int64_t *keys;     /* (q << 32 | d) + 1, 0: empty */
    int32_t *vals;
    size_t cap, n;
    int32_t (*work)[3]; /* (q, d, product state) still to fill */
    size_t n_work, cap_work;
} look_prod;

/* The product state of (q, d), made (and queued) on first use; the
 * original q where the lookahead is settled as holding, the fail state
 * where it is settled as failing; -1 when out of memory or past the
 * bounds (m->rc set). */
static int32_t look_pair(look_prod *lp, int32_t q, int32_t d)
{
    re_nfa *m = lp->m;
    if (m->rc)
        return -1;
    bool dead = d == ENG_REGEX_DEAD || !eng_regex_can_accept(lp->x, d);
    if (dead)
        return lp->neg ? q : lp->fail;
    if (eng_regex_universal(lp->x, d))
        return lp->neg ? lp->fail : q;
    if (lp->n * 2 >= lp->cap) {
        size_t cap = lp->cap ? lp->cap * 2 : 64;
        int64_t *keys = sw_calloc(cap, sizeof *keys);
        int32_t *vals = sw_malloc(cap * sizeof *vals);
        if (!keys || !vals) {
            sw_free(keys);
            sw_free(vals);
            m->rc = SW_ENOMEM;
            return -1;
        }
        for (size_t i = 0; i < lp->cap; i++) {
            if (!lp->keys[i])
                continue;
            size_t h = (size_t)((uint64_t)lp->keys[i] * 0x9E3779B97F4A7C15ull >> 20) & (cap - 1);
            while (keys[h])
                h = (h + 1) & (cap - 1);
            keys[h] = lp->keys[i];
            vals[h] = lp->vals[i];
        }
        sw_free(lp->keys);
        sw_free(lp->vals);
        lp->keys = keys;
        lp->vals = vals;
        lp->cap = cap;
    }
    int64_t key = ((int64_t)q << 32 | (uint32_t)d) + 1;
    size_t h = (size_t)((uint64_t)key * 0x9E3779B97F4A7C15ull >> 20) & (lp->cap - 1);
    while (lp->keys[h]) {
        if (lp->keys[h] == key)
            return lp->vals[h];
        h = (h + 1) & (lp->cap - 1);
    }
    if (lp->n_work == lp->cap_work) {
        size_t cap = lp->cap_work ? lp->cap_work * 2 : 256;
        void *w = sw_realloc(lp->work, cap * sizeof *lp->work);
        if (!w) {
            m->rc = SW_ENOMEM;
            return -1;
        }
        lp->work = w;
        lp->cap_work = cap;
    }
    int32_t st = eng__rx_nfa_add(m, NS_FAIL, 0, 0, -1, -1); /* filled in by look_fill */
    if (st < 0)
        return -1;
    lp->keys[h] = key;
    lp->vals[h] = st;
    lp->n++;
    lp->work[lp->n_work][0] = q;
    lp->work[lp->n_work][1] = d;
    lp->work[lp->n_work][2] = st;
    lp->n_work++;
    return st;
}

/* Fills product state st for (q, d). */
static void look_fill(look_prod *lp, int32_t q, int32_t d, int32_t st)
{
    re_nfa *m = lp->m;
    nfa_state orig = m->s[q];
    nfa_state made = {NS_FAIL, 0, 0, -1, -1};
    switch (orig.kind) {
    case NS_BYTE: {
        int32_t result = -1;
        for (int b = orig.lo; b <= orig.hi && !m->rc;) {
            int32_t to = eng_regex_step(lp->x, d, (uint8_t)b);
            int e = b;
            while (e + 1 <= orig.hi && eng_regex_step(lp->x, d, (uint8_t)(e + 1)) == to)
                e++;
            int32_t t = look_pair(lp, orig.out, to);
            if (t >= 0 && t != lp->fail) {
                int32_t edge = eng__rx_nfa_add(m, NS_BYTE, (uint8_t)b, (uint8_t)e, t, -1);
                result = result < 0 || edge < 0
                             ? edge
                             : eng__rx_nfa_add(m, NS_SPLIT, 0, 0, result, edge);
            }
            b = e + 1;
        }
        if (result >= 0)
            made = (nfa_state){NS_EPS, 0, 0, result, -1};
        break;
    }
    case NS_SPLIT:
        if (orig.out < 0 || orig.out2 < 0) {
            m->rc = SW_EUNSUPPORTED; /* inside a loop still being built */
            return;
        }
        made = (nfa_state){NS_SPLIT, 0, 0, look_pair(lp, orig.out, d), -1};
        made.out2 = look_pair(lp, orig.out2, d);
        break;
    case NS_EPS:
    case NS_BOL:
    case NS_NOTBOL:
        made = (nfa_state){orig.kind, 0, 0, look_pair(lp, orig.out, d), -1};
        break;
    case NS_EOL:
    case NS_MATCH:
        /* the end of the string: X's verdict on what it has read */
        if (eng_regex_accepting(lp->x, d) != lp->neg)
            made = (nfa_state){NS_EOL, 0, 0, orig.kind == NS_EOL ? orig.out : q, -1};
        break;
    default:
        break;
    }
    if (!m->rc)
        m->s[st] = made;
}

/* Copies next's continuation as the product with X's automaton x. */
static int32_t look_product(re_nfa *m, const eng_regex *x, bool neg, int32_t next)
{
    look_prod lp = {m, x, neg, -1, NULL, NULL, 0, 0, NULL, 0, 0};
    lp.fail = eng__rx_nfa_add(m, NS_FAIL, 0, 0, -1, -1);
    int32_t entry = lp.fail >= 0 ? look_pair(&lp, next, eng_regex_start(x)) : -1;
    while (lp.n_work > 0 && !m->rc) {
        lp.n_work--;
        look_fill(&lp, lp.work[lp.n_work][0], lp.work[lp.n_work][1], lp.work[lp.n_work][2]);
    }
    sw_free(lp.keys);
    sw_free(lp.vals);
    sw_free(lp.work);
    return m->rc ? -1 : entry;
}

int32_t eng__rx_emit_look(re_nfa *m, const re_parser *p, const re_ast *a, int32_t next)
{
    bool neg = a->min != 0;
    int32_t child = a->first, entry = -1;
    eng_regex *x = NULL;
    int rc = look_dfa(p, child, false, &m->n_looks, &x);
    if (!rc && (entry = look_product(m, x, neg, next)) >= 0 && ast_has_bol(p, child)) {
        /* ^ inside X: at the start X reads it as holding */
        eng_regex *xs = NULL;
        rc = look_dfa(p, child, true, &m->n_looks, &xs);
        int32_t at_start = rc ? -1 : look_product(m, xs, neg, next);
        eng_regex_free(xs);
        int32_t bol = at_start >= 0 ? eng__rx_nfa_add(m, NS_BOL, 0, 0, at_start, -1) : -1;
        int32_t notbol = bol >= 0 ? eng__rx_nfa_add(m, NS_NOTBOL, 0, 0, entry, -1) : -1;
        entry = notbol >= 0 ? eng__rx_nfa_add(m, NS_SPLIT, 0, 0, bol, notbol) : -1;
    }
    eng_regex_free(x);
    if (rc && !m->rc)
        m->rc = rc;
    return m->rc ? -1 : entry;
}
