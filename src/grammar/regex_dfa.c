/* regex_dfa.c - the subset construction (stage 3 of regex.c's overview):
 * byte classes, epsilon closures, the DFA states' sets, then liveness,
 * pruning and pending continuation bytes (eng__rx_dfa_finish).
 */
#include "grammar/regex-impl.h"

#include "common/alloc.h"

#include <stdlib.h>
#include <string.h>

/* ---- the DFA ------------------------------------------------------------ */

typedef struct dfa_build {
    const re_nfa *m;
    int32_t tail;      /* the trailing loop's split state */
    /* closure scratch */
    uint32_t *mark;    /* m->n: generation of the last visit */
    uint32_t gen;
    int32_t *stack;    /* m->n */
    int32_t *tmp;      /* m->n: the closure being built */
    int32_t n_tmp;
    bool collapsed;    /* the last closure matched for good */
    long work;
    /* the sets of the DFA states */
    int32_t *pool;
    size_t n_pool, cap_pool;
    size_t *set_off;
    int32_t *set_len;
    int32_t *htab;     /* open addressing, RE_HTAB entries: state or -1 */
    int rc;
} dfa_build;

#define RE_MAX_POOL ((size_t)1 << 24)

static int int_cmp(const void *pa, const void *pb)
{
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    return a < b ? -1 : a > b;
}

/* Closes the seeds (in b->tmp, b->n_tmp of them) over epsilon edges:
 * splits always, ^ only at the start, $ never (acceptance decides it).
 * Keeps the states that matter for a set: bytes, $, the match. */
static void closure(dfa_build *b, bool at_start)
{
    const nfa_state *s = b->m->s;
    int32_t sp = 0, out = 0;
    if (++b->gen == 0) {
        memset(b->mark, 0, (size_t)b->m->n * sizeof *b->mark);
        b->gen = 1;
    }
    for (int32_t i = 0; i < b->n_tmp; i++) {
        int32_t x = b->tmp[i];
        if (b->mark[x] != b->gen) {
            b->mark[x] = b->gen;
            b->stack[sp++] = x;
        }
    }
    bool matched = false;
    while (sp > 0) {
        int32_t x = b->stack[--sp];
        b->work++;
        if (x == b->tail)
            matched = true;
        const nfa_state *st = &s[x];
        int32_t nx[2] = {-1, -1};
        switch (st->kind) {
        case NS_BYTE:
        case NS_EOL:
        case NS_MATCH:
            b->tmp[out++] = x;
            break;
        case NS_SPLIT:
            nx[0] = st->out;
            nx[1] = st->out2;
            break;
        case NS_EPS:
            nx[0] = st->out;
            break;
        case NS_BOL:
            if (at_start)
                nx[0] = st->out;
            break;
        case NS_NOTBOL:
            if (!at_start)
                nx[0] = st->out;
            break;
        default:
            break;
        }
        for (int k = 0; k < 2; k++) {
            if (nx[k] >= 0 && b->mark[nx[k]] != b->gen) {
                b->mark[nx[k]] = b->gen;
                b->stack[sp++] = nx[k];
            }
        }
    }
    b->n_tmp = out;
    b->collapsed = matched;
    if (matched) {
        /* Matched for good: every continuation is accepted. One state:
         * the trailing loop's closure alone. */
        sp = out = 0;
        ++b->gen;
        b->mark[b->tail] = b->gen;
        b->stack[sp++] = b->tail;
        while (sp > 0) {
            int32_t x = b->stack[--sp];
            const nfa_state *st = &s[x];
            if (st->kind == NS_BYTE || st->kind == NS_MATCH) {
                b->tmp[out++] = x;
            } else if (st->kind == NS_SPLIT) {
                int32_t nx[2] = {st->out, st->out2};
                for (int k = 0; k < 2; k++)
                    if (nx[k] >= 0 && b->mark[nx[k]] != b->gen) {
                        b->mark[nx[k]] = b->gen;
                        b->stack[sp++] = nx[k];
                    }
            }
        }
        b->n_tmp = out;
    }
    qsort(b->tmp, (size_t)b->n_tmp, sizeof *b->tmp, int_cmp);
}

/* Whether a set accepts at the end of the string: the match is in it, or
 * reachable through $ (and further epsilons; ^ too at the start). */
static bool set_accepts(dfa_build *b, const int32_t *set, int32_t n, bool at_start)
{
    const nfa_state *s = b->m->s;
    int32_t sp = 0;
    ++b->gen;
    for (int32_t i = 0; i < n; i++) {
        if (s[set[i]].kind == NS_MATCH)
            return true;
        if (s[set[i]].kind == NS_EOL && b->mark[s[set[i]].out] != b->gen) {
            b->mark[s[set[i]].out] = b->gen;
            b->stack[sp++] = s[set[i]].out;
        }
    }
    while (sp > 0) {
        int32_t x = b->stack[--sp];
        b->work++;
        const nfa_state *st = &s[x];
        int32_t nx[2] = {-1, -1};
        switch (st->kind) {
        case NS_MATCH: return true;
        case NS_SPLIT: nx[0] = st->out; nx[1] = st->out2; break;
        case NS_EPS:
        case NS_EOL: nx[0] = st->out; break;
        case NS_BOL: if (at_start) nx[0] = st->out; break;
        case NS_NOTBOL: if (!at_start) nx[0] = st->out; break;
        default: break;
        }
        for (int k = 0; k < 2; k++)
            if (nx[k] >= 0 && b->mark[nx[k]] != b->gen) {
                b->mark[nx[k]] = b->gen;
                b->stack[sp++] = nx[k];
            }
    }
    return false;
}

static uint32_t set_hash(const int32_t *set, int32_t n, bool initial)
{
    uint32_t h = 2166136261u ^ (initial ? 0x9E3779B9u : 0);
    for (int32_t i = 0; i < n; i++) {
        h ^= (uint32_t)set[i];
        h *= 16777619u;
    }
    return h;
}

/* The DFA state of the set in b->tmp: found, or added (with its
 * acceptance). -1 with b->rc on a bound or out of memory. */
static int32_t dfa_state(dfa_build *b, eng_regex *re, bool initial)
{
    const int32_t *set = b->tmp;
    int32_t n = b->n_tmp;
    uint32_t h = set_hash(set, n, initial) & (RE_HTAB - 1);
    for (;; h = (h + 1) & (RE_HTAB - 1)) {
        int32_t id = b->htab[h];
        if (id < 0)
            break;
        if ((id == re->start) == initial && b->set_len[id] == n &&
            memcmp(b->pool + b->set_off[id], set, (size_t)n * sizeof *set) == 0)
            return id;
    }
    if (re->n_states >= ENG_REGEX_MAX_STATES) {
        b->rc = SW_ERANGE;
        return -1;
    }
    if (b->n_pool + (size_t)n > b->cap_pool) {
        size_t cap = b->cap_pool ? b->cap_pool * 2 : 4096;
        while (cap < b->n_pool + (size_t)n)
            cap *= 2;
        if (cap > RE_MAX_POOL) {
            b->rc = SW_ERANGE;
            return -1;
        }
        int32_t *pool = sw_realloc(b->pool, cap * sizeof *pool);
        if (!pool) {
            b->rc = SW_ENOMEM;
            return -1;
        }
        b->pool = pool;
        b->cap_pool = cap;
    }
    int32_t id = re->n_states++;
    memcpy(b->pool + b->n_pool, set, (size_t)n * sizeof *set);
    b->set_off[id] = b->n_pool;
    b->set_len[id] = n;
    b->n_pool += (size_t)n;
    b->htab[h] = id;
    re->accept[id] = set_accepts(b, set, n, initial);
    re->universal[id] = b->collapsed;
    return id;
}

void eng_regex_free(eng_regex *re)
{
    if (!re)
        return;
    sw_free(re->trans);
    sw_free(re->accept);
    sw_free(re->live);
    sw_free(re->pend);
    sw_free(re->universal);
    sw_free(re);
}

int eng__rx_utf8_role(uint8_t c)
{
    if (c < 0x80)
        return 0; /* a whole character */
    if (c < 0xC0)
        return -1; /* a continuation */
    if (c < 0xE0)
        return 1;
    if (c < 0xF0)
        return 2;
    return 3;
}

/* Liveness (reverse reachability from the accepting states), pruning of
 * the transitions into dead states, pending continuation bytes. */
int eng__rx_dfa_finish(eng_regex *re)
{
    int32_t ns = re->n_states, nc = re->n_classes;
    size_t edges = (size_t)ns * (size_t)nc;
    int32_t *count = sw_calloc((size_t)ns + 1, sizeof *count);
    int32_t *rev = sw_malloc((edges ? edges : 1) * sizeof *rev);
    int32_t *queue = sw_malloc((size_t)ns * sizeof *queue);
    re->live = sw_calloc((size_t)ns, 1);
    re->pend = sw_calloc((size_t)ns, 1);
    uint8_t *seen = sw_calloc((size_t)ns, 1);
    int rc = SW_OK;
    if (!count || !rev || !queue || !re->live || !re->pend || !seen) {
        rc = SW_ENOMEM;
        goto done;
    }
    for (size_t e = 0; e < edges; e++)
        if (re->trans[e] >= 0)
            count[re->trans[e] + 1]++;
    for (int32_t i = 0; i < ns; i++)
        count[i + 1] += count[i];
    int32_t *fill = queue; /* reused as a cursor first */
    for (int32_t i = 0; i < ns; i++)
        fill[i] = count[i];
    for (size_t e = 0; e < edges; e++)
        if (re->trans[e] >= 0)
            rev[fill[re->trans[e]]++] = (int32_t)(e / (size_t)nc);
    int32_t qh = 0, qt = 0;
    for (int32_t i = 0; i < ns; i++)
        if (re->accept[i]) {
            re->live[i] = 1;
            queue[qt++] = i;
        }
    while (qh < qt) {
        int32_t t = queue[qh++];
        for (int32_t k = count[t]; k < count[t + 1]; k++) {
            int32_t s = rev[k];
            if (!re->live[s]) {
                re->live[s] = 1;
                queue[qt++] = s;
            }
        }
    }
    for (size_t e = 0; e < edges; e++)
        if (re->trans[e] >= 0 && !re->live[re->trans[e]])
            re->trans[e] = ENG_REGEX_DEAD;
    /* Pending bytes, breadth first from the start. */
    uint8_t rep[256];
    for (int b = 255; b >= 0; b--)
        rep[re->class_of[b]] = (uint8_t)b;
    qh = qt = 0;
    queue[qt++] = re->start;
    seen[re->start] = 1;
    while (qh < qt) {
        int32_t s = queue[qh++];
        for (int32_t c = 0; c < nc; c++) {
            int32_t t = re->trans[(size_t)s * (size_t)nc + (size_t)c];
            if (t < 0 || seen[t])
                continue;
            int role = eng__rx_utf8_role(rep[c]);
            re->pend[t] = (uint8_t)(re->pend[s] > 0 ? re->pend[s] - 1 : (role > 0 ? role : 0));
            seen[t] = 1;
            queue[qt++] = t;
        }
    }
done:
    sw_free(count);
    sw_free(rev);
    sw_free(queue);
    sw_free(seen);
    return rc;
}

int eng__rx_dfa_build_all(const re_nfa *m, int32_t head, int32_t tail, eng_regex *re,
                          bool at_start)
{
    dfa_build b = {0};
    b.m = m;
    b.tail = tail;
    int rc = SW_OK;
    /* Byte classes: bytes between the same NFA range boundaries. */
    uint8_t cut[257] = {0};
    for (int32_t i = 0; i < m->n; i++)
        if (m->s[i].kind == NS_BYTE) {
            cut[m->s[i].lo] = 1;
            cut[m->s[i].hi + 1] = 1;
        }
    int32_t nc = 0;
    uint8_t rep[256];
    for (int c = 0; c < 256; c++) {
        if (c > 0 && cut[c])
            nc++;
        re->class_of[c] = (uint8_t)nc;
        if (c == 0 || cut[c])
            rep[nc] = (uint8_t)c;
    }
    re->n_classes = ++nc;
    b.mark = sw_calloc((size_t)m->n, sizeof *b.mark);
    b.stack = sw_malloc((size_t)m->n * sizeof *b.stack);
    b.tmp = sw_malloc((size_t)m->n * sizeof *b.tmp);
    b.set_off = sw_malloc(ENG_REGEX_MAX_STATES * sizeof *b.set_off);
    b.set_len = sw_malloc(ENG_REGEX_MAX_STATES * sizeof *b.set_len);
    b.htab = sw_malloc(RE_HTAB * sizeof *b.htab);
    /* allocated up front: a state's set may be empty (a lookahead whose ^
     * is read after the start), and pointer arithmetic on NULL is not C */
    b.cap_pool = 4096;
    b.pool = sw_malloc(b.cap_pool * sizeof *b.pool);
    re->accept = sw_calloc(ENG_REGEX_MAX_STATES, 1);
    re->universal = sw_calloc(ENG_REGEX_MAX_STATES, 1);
    size_t cap_trans = 64 * (size_t)nc;
    re->trans = sw_malloc(cap_trans * sizeof *re->trans);
    if (!b.mark || !b.stack || !b.tmp || !b.set_off || !b.set_len || !b.htab || !b.pool ||
        !re->accept || !re->universal || !re->trans) {
        rc = SW_ENOMEM;
        goto done;
    }
    memset(b.htab, 0xFF, RE_HTAB * sizeof *b.htab);
    re->start = -1;
    b.tmp[0] = head;
    b.n_tmp = 1;
    closure(&b, at_start);
    re->start = dfa_state(&b, re, at_start);
    if (re->start < 0) {
        rc = b.rc;
        goto done;
    }
    int32_t *seed = sw_malloc((size_t)m->n * sizeof *seed);
    if (!seed) {
        rc = SW_ENOMEM;
        goto done;
    }
    for (int32_t s = 0; s < re->n_states; s++) {
        while ((size_t)re->n_states * (size_t)nc > cap_trans) {
            size_t cap = cap_trans * 2;
            int32_t *t = sw_realloc(re->trans, cap * sizeof *t);
            if (!t) {
                rc = SW_ENOMEM;
                break;
            }
            re->trans = t;
            cap_trans = cap;
        }
        for (int32_t c = 0; c < nc; c++) {
            /* Reread: dfa_state() may move the pool. */
            const int32_t *set = b.pool + b.set_off[s];
            int32_t n = b.set_len[s], n_seed = 0;
            uint8_t r = rep[c];
            for (int32_t i = 0; i < n; i++) {
                const nfa_state *st = &m->s[set[i]];
                if (st->kind == NS_BYTE && st->lo <= r && r <= st->hi)
                    seed[n_seed++] = st->out;
            }
            b.work += n;
            int32_t t = ENG_REGEX_DEAD;
            if (n_seed) {
                memcpy(b.tmp, seed, (size_t)n_seed * sizeof *seed);
                b.n_tmp = n_seed;
                closure(&b, false);
                t = b.n_tmp ? dfa_state(&b, re, false) : ENG_REGEX_DEAD;
                if (b.rc) {
                    rc = b.rc;
                    break;
                }
            }
            re->trans[(size_t)s * (size_t)nc + (size_t)c] = t;
            if (b.work > RE_WORK_MAX) {
                rc = SW_ERANGE;
                break;
            }
        }
        if (rc)
            break;
    }
    sw_free(seed);
    if (!rc)
        rc = eng__rx_dfa_finish(re);
done:
    sw_free(b.mark);
    sw_free(b.stack);
    sw_free(b.tmp);
    sw_free(b.pool);
    sw_free(b.set_off);
    sw_free(b.set_len);
    sw_free(b.htab);
    return rc;
}
