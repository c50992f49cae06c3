/* regex_nfa.c - the syntax tree to a Thompson NFA over bytes (stage 2 of
 * regex.c's overview), built back to front; a class becomes the UTF-8
 * byte sequences of its ranges, shared as a trie.
 */
#include "grammar/regex-impl.h"

#include "common/alloc.h"

#include <string.h>

/* ---- the NFA ------------------------------------------------------------ */

int32_t eng__rx_nfa_add(re_nfa *m, uint8_t kind, uint8_t lo, uint8_t hi, int32_t out, int32_t out2)
{
    if (m->rc)
        return -1;
    if (m->n == m->cap) {
        int32_t cap = m->cap ? m->cap * 2 : 256;
        if (m->n >= ENG_REGEX_MAX_NFA_STATES) {
            m->rc = SW_ERANGE;
            return -1;
        }
        if (cap > ENG_REGEX_MAX_NFA_STATES)
            cap = ENG_REGEX_MAX_NFA_STATES;
        nfa_state *s = sw_realloc(m->s, (size_t)cap * sizeof *s);
        if (!s) {
            m->rc = SW_ENOMEM;
            return -1;
        }
        m->s = s;
        m->cap = cap;
    }
    m->s[m->n] = (nfa_state){kind, lo, hi, out, out2};
    return m->n++;
}

typedef struct byte_seq {
    int n;
    uint8_t lo[4], hi[4];
} byte_seq;

static int utf8_encode(uint32_t cp, uint8_t *b)
{
    if (cp < 0x80) {
        b[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        b[0] = (uint8_t)(0xC0 | cp >> 6);
        b[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        b[0] = (uint8_t)(0xE0 | cp >> 12);
        b[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        b[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    b[0] = (uint8_t)(0xF0 | cp >> 18);
    b[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
    b[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
    b[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* A class as bytes: the UTF-8 sequences of its ranges, in code point
 * order, form a trie whose sibling byte ranges are disjoint (the
 * sequences are aligned rectangles of disjoint code points); it is emitted
 * bottom-up with equal subtrees shared. The class is then deterministic
 * in the NFA: after any prefix exactly one of its states is live, so the
 * subset construction gains no states from it (\p{L} would otherwise
 * produce thousands). */
typedef struct cls_edge {
    uint8_t lo, hi;
    int32_t child; /* trie node, or -1: the class ends here */
    int32_t next;  /* sibling edge, or -1 */
    int32_t state; /* the child's NFA state, once emitted */
} cls_edge;

typedef struct cls_node {
    int32_t first, last; /* edges */
} cls_node;

typedef struct cls_memo {
    uint32_t hash;
    int32_t n_edges;
    int32_t key;   /* offset of 3 * n_edges ints in keys */
    int32_t state; /* the NFA state, -1: empty slot */
} cls_memo;

typedef struct cls_build {
    re_nfa *m;
    int32_t next;
    cls_node *nodes;
    int32_t n_nodes, cap_nodes;
    cls_edge *edges;
    int32_t n_edges, cap_edges;
    byte_seq prev;
    int32_t path[5];
    cls_memo *memo;
    int32_t memo_cap;
    int32_t *keys;
    int32_t n_keys;
} cls_build;

static int grow(void **p, int32_t *cap, int32_t need, size_t size)
{
    if (need <= *cap)
        return SW_OK;
    int32_t c = *cap ? *cap : 16;
    while (c < need) {
        if (c > ENG_REGEX_MAX_NFA_STATES)
            return SW_ERANGE;
        c *= 2;
    }
    void *q = sw_realloc(*p, (size_t)c * size);
    if (!q)
        return SW_ENOMEM;
    *p = q;
    *cap = c;
    return SW_OK;
}

static int32_t cls_new_node(cls_build *b)
{
    int rc = grow((void **)&b->nodes, &b->cap_nodes, b->n_nodes + 1, sizeof *b->nodes);
    if (rc) {
        b->m->rc = rc;
        return -1;
    }
    b->nodes[b->n_nodes] = (cls_node){-1, -1};
    return b->n_nodes++;
}

static int32_t cls_new_edge(cls_build *b, int32_t node, uint8_t lo, uint8_t hi)
{
    int rc = grow((void **)&b->edges, &b->cap_edges, b->n_edges + 1, sizeof *b->edges);
    if (rc) {
        b->m->rc = rc;
        return -1;
    }
    int32_t e = b->n_edges++;
    b->edges[e] = (cls_edge){lo, hi, -1, -1, -1};
    if (b->nodes[node].last < 0)
        b->nodes[node].first = e;
    else
        b->edges[b->nodes[node].last].next = e;
    b->nodes[node].last = e;
    return e;
}

static void seq_out(cls_build *b, const byte_seq *q)
{
    if (b->m->rc)
        return;
    int l = 0;
    if (b->prev.n == q->n)
        while (l < q->n - 1 && b->prev.lo[l] == q->lo[l] && b->prev.hi[l] == q->hi[l])
            l++;
    int32_t node = b->path[l];
    for (int i = l; i < q->n; i++) {
        int32_t e = cls_new_edge(b, node, q->lo[i], q->hi[i]);
        if (e < 0)
            return;
        if (i + 1 < q->n) {
            int32_t child = cls_new_node(b);
            if (child < 0)
                return;
            b->edges[e].child = child;
            b->path[i + 1] = child;
            node = child;
        }
    }
    b->prev = *q;
}

/* Emits the UTF-8 sequences of code points lo..hi (surrogates skipped). */
static void seq_range(cls_build *e, uint32_t lo, uint32_t hi)
{
    if (e->m->rc || lo > hi)
        return;
    if (lo <= 0xDFFF && hi >= 0xD800) {
        if (lo < 0xD800)
            seq_range(e, lo, 0xD7FF);
        if (hi > 0xDFFF)
            seq_range(e, 0xE000, hi);
        return;
    }
    static const uint32_t bounds[] = {0x7F, 0x7FF, 0xFFFF};
    for (int i = 0; i < 3; i++) {
        if (lo <= bounds[i] && hi > bounds[i]) {
            seq_range(e, lo, bounds[i]);
            seq_range(e, bounds[i] + 1, hi);
            return;
        }
    }
    uint8_t a[4], b[4];
    int n = utf8_encode(lo, a);
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                seq_range(e, lo, lo | m);
                seq_range(e, (lo | m) + 1, hi);
                return;
            }
            if ((hi & m) != m) {
                seq_range(e, lo, (hi & ~m) - 1);
                seq_range(e, hi & ~m, hi);
                return;
            }
        }
    }
    utf8_encode(hi, b);
    byte_seq q = {n, {0}, {0}};
    for (int i = 0; i < n; i++) {
        q.lo[i] = a[i];
        q.hi[i] = b[i];
    }
    seq_out(e, &q);
}

/* The NFA state of trie node `node`: its edges, each to its child's
 * state (or to next), shared with an equal node emitted before. */
static int32_t cls_emit(cls_build *b, int32_t node)
{
    int32_t n = 0;
    for (int32_t e = b->nodes[node].first; e >= 0; e = b->edges[e].next) {
        b->edges[e].state = b->edges[e].child < 0 ? b->next : cls_emit(b, b->edges[e].child);
        if (b->edges[e].state < 0)
            return -1;
        n++;
    }
    /* keys has room for every edge (emit_set); a node's key is written
     * after its children's, so they do not overlap. */
    int32_t base = b->n_keys, k = base;
    uint32_t h = 2166136261u;
    for (int32_t e = b->nodes[node].first; e >= 0; e = b->edges[e].next) {
        b->keys[k++] = b->edges[e].lo;
        b->keys[k++] = b->edges[e].hi;
        b->keys[k++] = b->edges[e].state;
    }
    for (int32_t i = base; i < k; i++) {
        h ^= (uint32_t)b->keys[i];
        h *= 16777619u;
    }
    uint32_t slot = h & (uint32_t)(b->memo_cap - 1);
    for (;; slot = (slot + 1) & (uint32_t)(b->memo_cap - 1)) {
        cls_memo *mm = &b->memo[slot];
        if (mm->state < 0)
            break;
        if (mm->hash == h && mm->n_edges == n &&
            memcmp(b->keys + mm->key, b->keys + base, (size_t)(3 * n) * sizeof *b->keys) == 0) {
            b->n_keys = base; /* not kept */
            return mm->state;
        }
    }
    int32_t t = -1;
    for (int32_t i = 0; i < n; i++) {
        const int32_t *kk = b->keys + base + 3 * i;
        int32_t s = eng__rx_nfa_add(b->m, NS_BYTE, (uint8_t)kk[0], (uint8_t)kk[1], kk[2], -1);
        t = t < 0 ? s : eng__rx_nfa_add(b->m, NS_SPLIT, 0, 0, t, s);
    }
    if (b->m->rc)
        return -1;
    b->n_keys = k;
    b->memo[slot] = (cls_memo){h, n, base, t};
    return t;
}

void eng__rx_nfa_free(re_nfa *m)
{
    sw_free(m->s);
    sw_free(m->cls_nodes);
    sw_free(m->cls_edges);
    sw_free(m->cls_memo);
    sw_free(m->cls_keys);
    m->s = NULL;
    m->cls_nodes = m->cls_edges = m->cls_memo = NULL;
    m->cls_keys = NULL;
}

/* Room for need entries of size bytes in *p (a buffer kept between
 * classes): no bound of its own, the trie's is grow()'s. */
static int reserve(void **p, int32_t *cap, int32_t need, size_t size)
{
    if (need <= *cap)
        return SW_OK;
    void *q = sw_realloc(*p, (size_t)need * size);
    if (!q)
        return SW_ENOMEM;
    *p = q;
    *cap = need;
    return SW_OK;
}

static int32_t emit_set(re_nfa *m, const re_range *r, int32_t n, int32_t next)
{
    cls_build b = {0};
    b.m = m;
    b.next = next;
    /* the buffers of the classes before (re_nfa keeps them) */
    b.nodes = m->cls_nodes;
    b.cap_nodes = m->cap_cls_nodes;
    b.edges = m->cls_edges;
    b.cap_edges = m->cap_cls_edges;
    int32_t out = -1;
    if (cls_new_node(&b) < 0)
        goto done;
    for (int32_t i = 0; i < n; i++)
        seq_range(&b, r[i].lo, r[i].hi);
    if (m->rc)
        goto done;
    if (b.n_edges == 0) {
        out = eng__rx_nfa_add(m, NS_FAIL, 0, 0, -1, -1);
        goto done;
    }
    b.memo_cap = 16;
    while (b.memo_cap < 2 * b.n_nodes)
        b.memo_cap *= 2;
    if (reserve(&m->cls_memo, &m->cap_cls_memo, b.memo_cap, sizeof *b.memo) ||
        reserve((void **)&m->cls_keys, &m->cap_cls_keys, 3 * b.n_edges + 1, sizeof *b.keys)) {
        m->rc = SW_ENOMEM;
        goto done;
    }
    b.memo = m->cls_memo;
    b.keys = m->cls_keys;
    for (int32_t i = 0; i < b.memo_cap; i++)
        b.memo[i].state = -1;
    out = cls_emit(&b, 0);
done:
    m->cls_nodes = b.nodes;
    m->cap_cls_nodes = b.cap_nodes;
    m->cls_edges = b.edges;
    m->cap_cls_edges = b.cap_edges;
    return m->rc ? -1 : out;
}

static const re_range any_char[] = {{0, RE_MAX_CP}};

/* A loop over any code point, then next; the loop's split state. */
int32_t eng__rx_emit_any_star(re_nfa *m, int32_t next)
{
    int32_t s = eng__rx_nfa_add(m, NS_SPLIT, 0, 0, -1, next);
    int32_t body = emit_set(m, any_char, 1, s);
    if (body < 0)
        return -1;
    m->s[s].out = body;
    return s;
}

int32_t eng__rx_emit(re_nfa *m, const re_parser *p, int32_t id, int32_t next)
{
    if (m->rc || next < 0)
        return -1;
    const re_ast *a = &p->nodes[id];
    switch (a->kind) {
    case A_EMPTY:
        return next;
    case A_SET:
        /* an empty class ([]) may come before any range exists: no pointer
         * arithmetic on the pool's NULL */
        return emit_set(m, a->set_n ? p->pool.r + a->set_off : NULL, a->set_n, next);
    case A_BOL:
        return eng__rx_nfa_add(m, NS_BOL, 0, 0, next, -1);
    case A_EOL:
        return eng__rx_nfa_add(m, NS_EOL, 0, 0, next, -1);
    case A_LOOK:
        return eng__rx_emit_look(m, p, a, next);
    case A_CAT: {
        if (a->n_children == 0)
            return next;
        /* the children back to front; most concatenations are short */
        int32_t few[16];
        int32_t *kids = a->n_children <= 16 ? few
                                             : sw_malloc((size_t)a->n_children * sizeof *kids);
        if (!kids) {
            m->rc = SW_ENOMEM;
            return -1;
        }
        int32_t k = 0;
        for (int32_t c = a->first; c >= 0; c = p->nodes[c].next)
            kids[k++] = c;
        int32_t t = next;
        for (int32_t i = k - 1; i >= 0 && t >= 0; i--)
            t = eng__rx_emit(m, p, kids[i], t);
        if (kids != few)
            sw_free(kids);
        return t;
    }
    case A_ALT: {
        int32_t t = -1;
        for (int32_t c = a->first; c >= 0; c = p->nodes[c].next) {
            int32_t s = eng__rx_emit(m, p, c, next);
            if (s < 0)
                return -1;
            t = t < 0 ? s : eng__rx_nfa_add(m, NS_SPLIT, 0, 0, t, s);
        }
        return t;
    }
    case A_REP: {
        int32_t t = next;
        if (a->max < 0) {
            int32_t s = eng__rx_nfa_add(m, NS_SPLIT, 0, 0, -1, next);
            if (s < 0)
                return -1;
            int32_t body = eng__rx_emit(m, p, a->first, s);
            if (body < 0)
                return -1;
            m->s[s].out = body;
            t = s;
        } else {
            for (int32_t i = a->min; i < a->max && t >= 0; i++) {
                int32_t body = eng__rx_emit(m, p, a->first, t);
                t = eng__rx_nfa_add(m, NS_SPLIT, 0, 0, body, next);
            }
        }
        for (int32_t i = 0; i < a->min && t >= 0; i++)
            t = eng__rx_emit(m, p, a->first, t);
        return t;
    }
    }
    return -1;
}
