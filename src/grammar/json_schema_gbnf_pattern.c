/* json_schema_gbnf_pattern.c - a schema's pattern and format strings as
 * GBNF (json_schema_gbnf-impl.h).
 */
#include "grammar/json_schema_gbnf-impl.h"

#include "common/alloc.h"
#include "grammar/gbnf.h"
#include "grammar/regex.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* As constrain.c's eng__cs_step_pattern reads them: the content's decoded
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
#define JG_PATTERN_STEPS ((int64_t)1 << 23)

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
    eng__jg_fail(p->w, SW_EUNSUPPORTED, "a pattern too large to write out", p->node);
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
        eng__jg_fail(w, SW_EINVAL, "a pattern state with no way on", p->node);
    eng__gb_str(&w->o, "\n");
}

void eng__jg_write_pattern(jg_writer *w, int32_t node, const cs_node *n)
{
    jg_pattern p = {.w = w, .n = n, .node = node};
    int32_t n_states = eng_regex_n_states(n->re);
    int64_t levels = n->max_chars != INT32_MAX ? (int64_t)n->max_chars + 1
                                               : (int64_t)n->min_chars + 1;
    if (levels * n_states > (1 << 20)) {
        eng__jg_fail(w, SW_EUNSUPPORTED, "a pattern string with too long a length bound", node);
        return;
    }
    p.levels = (int32_t)levels;
    int32_t start = eng_regex_start(n->re);
    if (start == ENG_REGEX_DEAD || eng_regex_costs_get(n->re_costs, start, 0) < 0) {
        eng__jg_fail(w, SW_EUNSUPPORTED, "a pattern string that matches nothing", node);
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
    eng__jg_rule_head(w, node, NULL, 0);
    eng__gb_str(&w->o, "\"\\\"\" ");
    p.reached[start * p.levels] = 1;
    p.todo[p.n_todo++] = start * p.levels;
    put_pstate(&p, start * p.levels);
    eng__gb_str(&w->o, "\n");
    while (p.n_todo > 0 && !w->rc && !w->o.failed && w->o.len <= ENG_GBNF_MAX_BYTES)
        write_pstate(&p, p.todo[--p.n_todo]);
done:
    for (int32_t i = 0; p.cont && i < n_states * 3; i++)
        sw_free(p.cont[i].r);
    sw_free(p.cont);
    sw_free(p.reached);
    sw_free(p.todo);
    sw_free(p.r);
}

