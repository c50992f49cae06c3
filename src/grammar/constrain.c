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
#include "grammar/constrain.h"

#include "common/alloc.h"
#include "grammar/constrain-impl.h"
#include "grammar/constrain-state.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the automaton ------------------------------------------------------- */

void eng__cs_stack_copy(cs_stack *dst, const cs_stack *src)
{
    dst->depth = src->depth;
    memcpy(dst->f, src->f, (size_t)src->depth * sizeof src->f[0]);
}

int64_t eng__cs_stack_min(const eng_grammar *g, const cs_stack *st);

/* A stack being fed one byte. Feeding forks it (anyOf branches, GBNF
 * readings), and copying whole stacks at every fork was most of the
 * automaton's time, so a walk stack shares its lower frames with the
 * stack of the input set it came from: frames [0, shared) are base's
 * (the input set is not written while a byte is fed), frames [shared,
 * depth) are its own, in f[] at the same index. Only the top is ever
 * written (run pops, changes the top frame, pushes), so the top frame is
 * copied into f[] the first time it is touched, and a fork copies only
 * the frames its parent owns. A fork runs to its end before its parent
 * goes on, so base is stable for the whole walk. */
typedef struct cs_wstack {
    const cs_frame *base;
    int32_t shared;
    int32_t depth;
    cs_frame f[ENG_CS_MAX_DEPTH];
} cs_wstack;

static const cs_frame *wstack_at(const cs_wstack *ws, int32_t i)
{
    return i < ws->shared ? &ws->base[i] : &ws->f[i];
}

/* The top frame, made the stack's own so that it may be written. */
static cs_frame *wstack_top(cs_wstack *ws)
{
    int32_t i = ws->depth - 1;
    if (i < ws->shared) {
        ws->f[i] = ws->base[i];
        ws->shared = i;
    }
    return &ws->f[i];
}

static void wstack_pop(cs_wstack *ws)
{
    ws->depth--;
    if (ws->shared > ws->depth)
        ws->shared = ws->depth;
}

/* dst (not initialised) becomes a fork of src: the same base, its own
 * copy of src's own frames. */
static void wstack_fork(cs_wstack *dst, const cs_wstack *src)
{
    dst->base = src->base;
    dst->shared = src->shared;
    dst->depth = src->depth;
    memcpy(dst->f + src->shared, src->f + src->shared,
           (size_t)(src->depth - src->shared) * sizeof src->f[0]);
}

static bool wstack_equal(const cs_stack *s, const cs_wstack *ws)
{
    /* the own frames first: two readings mostly differ near the top */
    return s->depth == ws->depth &&
           memcmp(s->f + ws->shared, ws->f + ws->shared,
                  (size_t)(ws->depth - ws->shared) * sizeof s->f[0]) == 0 &&
           memcmp(s->f, ws->base, (size_t)ws->shared * sizeof s->f[0]) == 0;
}

static void wstack_store(cs_stack *dst, const cs_wstack *ws)
{
    dst->depth = ws->depth;
    memcpy(dst->f, ws->base, (size_t)ws->shared * sizeof dst->f[0]);
    memcpy(dst->f + ws->shared, ws->f + ws->shared,
           (size_t)(ws->depth - ws->shared) * sizeof dst->f[0]);
}

static int64_t wstack_min(const eng_grammar *g, const cs_wstack *ws)
{
    int64_t m = 0;
    for (int32_t i = 0; i < ws->depth; i++) {
        m += eng__cs_frame_min(g, wstack_at(ws, i));
        if (m > CS_INF)
            m = CS_INF;
    }
    return m;
}

/* A walk stack's frames hashed, word by word (frames are zeroed when
 * pushed, so equal stacks hash equal). */
static uint64_t wstack_hash(const cs_wstack *ws)
{
    uint64_t h = (uint64_t)ws->depth * 0x9E3779B97F4A7C15ull;
    for (int32_t i = 0; i < ws->depth; i++) {
        const cs_frame *f = wstack_at(ws, i);
        uint32_t w[sizeof *f / 4];
        memcpy(w, f, sizeof w);
        for (size_t k = 0; k < sizeof w / sizeof w[0]; k++)
            h = (h ^ w[k]) * 0xFF51AFD7ED558CCDull;
    }
    return h ^ (h >> 29);
}

/* Adds a stack to the set unless it is there already (two paths to the
 * same stack are common in ambiguous GBNF grammars; the hashes are
 * compared first, the frames only when they agree). A full set keeps the
 * stacks with the shortest completions: the one with the longest gives
 * way, so the state's minimum is never lost and the budget rule (some
 * token always shortens it) holds however many are dropped. The full
 * set's minima are computed once, then kept with the stacks. */
static void push_out(const eng_grammar *g, cs_set *out, const cs_wstack *st)
{
    uint64_t h = wstack_hash(st);
    for (int32_t i = 0; i < out->n; i++)
        if (out->hash[i] == h && wstack_equal(&out->s[i], st))
            return;
    if (out->n < ENG_CS_MAX_ALTS) {
        out->hash[out->n] = h;
        wstack_store(&out->s[out->n++], st);
        return;
    }
    if (!out->have_min) {
        for (int32_t i = 0; i < out->n; i++)
            out->min[i] = eng__cs_stack_min(g, &out->s[i]);
        out->have_min = true;
    }
    int64_t worst = -1;
    int32_t at = -1;
    for (int32_t i = 0; i < out->n; i++) {
        if (out->min[i] > worst) {
            worst = out->min[i];
            at = i;
        }
    }
    int64_t mine = wstack_min(g, st);
    if (mine < worst) {
        out->hash[at] = h;
        out->min[at] = mine;
        wstack_store(&out->s[at], st);
    }
}

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
        int k = eng__cs_utf8_lead(ch, &lo, &hi);
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

int64_t eng__cs_pattern_min(const cs_node *n, const cs_frame *f);

int eng__cs_step_pattern(const cs_node *n, cs_frame *f, uint8_t ch)
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
        if (!boundary || eng__cs_pattern_min(n, &e) >= CS_INF)
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
int64_t eng__cs_pattern_min(const cs_node *n, const cs_frame *f)
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

static void run(const eng_grammar *g, cs_wstack *st, uint8_t ch, cs_set *out);

static bool refuses_first(const cs_node *n, uint8_t ch)
{
    return (n->refused_first[ch >> 5] >> (ch & 31)) & 1;
}

/* A value of node starts with ch on top of st. */
static void enter(const eng_grammar *g, cs_wstack *st, int32_t node, uint8_t ch, cs_set *out)
{
    const cs_node *n = &g->nodes[node];
    if (refuses_first(n, ch))
        return;
    if (n->kind == CS_ANYOF) {
        for (int32_t i = 0; i < n->n_alts; i++) {
            if (refuses_first(&g->nodes[n->alts[i]], ch))
                continue;
            cs_wstack copy;
            wstack_fork(&copy, st);
            enter(g, &copy, n->alts[i], ch, out);
        }
        return;
    }
    if (st->depth + (n->need_frames > 0 ? n->need_frames : 1) > ENG_CS_MAX_DEPTH)
        return;
    cs_frame *f = &st->f[st->depth++]; /* above shared: the stack's own */
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
static void fork_end(const eng_grammar *g, const cs_wstack *st, uint8_t ch, cs_set *out)
{
    cs_wstack copy;
    wstack_fork(&copy, st);
    wstack_pop(&copy);
    run(g, &copy, ch, out);
}

/* A copy of st whose top frame moved on to (phase 1, a) enters node;
 * tail: the frame has nothing left after it, so it is popped first. */
static void fork_enter(const eng_grammar *g, const cs_wstack *st, int32_t a, bool tail,
                       int32_t node, uint8_t ch, cs_set *out)
{
    if (refuses_first(&g->nodes[node], ch))
        return; /* enter() would refuse it: spare the copy */
    cs_wstack copy;
    wstack_fork(&copy, st);
    if (tail) {
        wstack_pop(&copy);
    } else {
        cs_frame *f = wstack_top(&copy);
        f->phase = 1;
        f->a = a;
    }
    enter(g, &copy, node, ch, out);
}

/* Returns true when the byte goes on to the frame below (st popped). */
static bool run_gbnf(const eng_grammar *g, const cs_node *n, cs_wstack *st, uint8_t ch,
                     cs_set *out)
{
    /* read in place: most bytes are refused, and a sequence or a
     * repetition only forks, so the frame is copied when one is taken */
    const cs_frame *f = wstack_at(st, st->depth - 1);
    bool fresh = f->phase == 0;
    switch (n->kind) {
    case CS_RAW: {
        int32_t from = fresh ? eng_regex_start(n->re) : f->b;
        int32_t to = eng_regex_step(n->re, from, ch);
        if (!fresh && eng_regex_accepting(n->re, from)) {
            if (to < 0) {
                wstack_pop(st);
                return true;
            }
            fork_end(g, st, ch, out);
        }
        if (to < 0)
            return false;
        cs_frame *taken = wstack_top(st);
        taken->phase = 1;
        taken->b = to;
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
        wstack_pop(st); /* the rest may be empty */
        return true;
    case CS_REP:
        if (n->max_items < 0 || f->a < n->max_items)
            fork_enter(g, st, f->a + 1, f->a + 1 == n->max_items, n->item, ch, out);
        if (fresh || (f->a < n->min_items && g->nodes[n->item].min_bytes > 0))
            return false;
        wstack_pop(st);
        return true;
    default: return false;
    }
}

static void run(const eng_grammar *g, cs_wstack *st, uint8_t ch, cs_set *out)
{
    for (;;) {
        if (st->depth <= 0)
            return;
        const cs_frame *top = wstack_at(st, st->depth - 1);
        cs_kind kind = top->node >= 0 ? g->nodes[top->node].kind : CS_ANYOF;
        if (kind == CS_RAW || kind == CS_SEQ || kind == CS_REP) {
            if (run_gbnf(g, &g->nodes[top->node], st, ch, out))
                continue;
            return;
        }
        cs_frame *f = wstack_top(st);
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
            r = n->kind == CS_PATTERN ? eng__cs_step_pattern(n, f, ch) : step_string(n, f, ch);
            if (r == R_REJECT)
                return;
            if (r == R_DONE)
                wstack_pop(st);
            push_out(g, out, st);
            return;
        case CS_NUMBER:
        case CS_INTEGER:
        case CS_LITERALS:
            r = n->kind == CS_LITERALS   ? step_literal(n, f, ch)
                : eng__cs_num_bounded(n) ? eng__cs_step_bounded(n, f, ch)
                                         : step_number(n->kind == CS_INTEGER, f, ch);
            if (r == R_REJECT)
                return;
            if (r == R_ACCEPT) {
                push_out(g, out, st);
                return;
            }
            wstack_pop(st); /* R_END: the byte belongs to the frame below */
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
                        wstack_pop(st);
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
                    wstack_pop(st);
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
                        wstack_pop(st);
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
                    wstack_pop(st);
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
                        wstack_pop(st);
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
                    wstack_pop(st);
                    push_out(g, out, st);
                }
                return;
            }
        case CS_RAW:
        case CS_SEQ:
        case CS_REP: return; /* run above, before the frame is copied */
        case CS_ANYOF:
            return; /* never on a stack: enter() forks instead */
        }
        return;
    }
}

void eng__cs_set_step(const eng_grammar *g, const cs_set *in, uint8_t ch, cs_set *out)
{
    out->n = 0;
    out->have_min = false;
    for (int32_t i = 0; i < in->n; i++) {
        cs_wstack ws; /* f[] is written as frames become its own */
        ws.base = in->s[i].f;
        ws.shared = ws.depth = in->s[i].depth;
        run(g, &ws, ch, out);
    }
}

static int64_t sat(int64_t x)
{
    return x > CS_INF ? CS_INF : x;
}

int64_t eng__cs_frame_min(const eng_grammar *g, const cs_frame *f)
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
    case CS_INTEGER: return eng__cs_num_min(n, f);
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
    case CS_PATTERN: return eng__cs_pattern_min(n, f);
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

int64_t eng__cs_stack_min(const eng_grammar *g, const cs_stack *st)
{
    int64_t m = 0;
    for (int32_t i = 0; i < st->depth; i++)
        m = sat(m + eng__cs_frame_min(g, &st->f[i]));
    return m;
}

int64_t eng__cs_set_min(const eng_grammar *g, const cs_set *s)
{
    int64_t best = CS_INF;
    for (int32_t i = 0; i < s->n; i++) {
        int64_t m = eng__cs_stack_min(g, &s->s[i]);
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
            can_end = eng__cs_num_can_end(n, f);
        else if (n->kind == CS_RAW)
            can_end = eng_regex_accepting(n->re, f->b);
        else if (n->kind == CS_SEQ || n->kind == CS_REP)
            can_end = eng__cs_frame_min(g, f) == 0;
        if (!can_end)
            return false;
        d--;
    }
    /* the root done, or not begun with a grammar that allows nothing */
    return d == 1 && (st->f[0].phase == 1 || g->nodes[g->root].min_bytes == 0);
}

bool eng__cs_set_complete(const eng_grammar *g, const cs_set *s)
{
    for (int32_t i = 0; i < s->n; i++)
        if (stack_complete(g, &s->s[i]))
            return true;
    return false;
}

