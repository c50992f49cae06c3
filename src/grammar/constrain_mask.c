/* constrain_mask.c - the constraint: its life cycle, feeding tokens, and
 * the token masks walked over the vocabulary's tries (constrain.h has the
 * contract, constrain.c the automaton, constrain-state.h the state).
 */
#include "grammar/constrain.h"

#include "common/alloc.h"
#include "grammar/constrain-impl.h"
#include "grammar/constrain-state.h"
#include "grammar/regex-impl.h" /* the DFA's table, read directly by list_build */

#include <stdlib.h>
#include <string.h>

/* ---- the constraint ------------------------------------------------------ */

void eng__cs_slots_free(cs_pat_cache *slots)
{
    for (int i = 0; slots && i < CS_PAT_SLOTS; i++) {
        sw_free(slots[i].e);
        sw_free(slots[i].bits);
    }
    sw_free(slots);
}

/* A set of slots from the vocabulary's pool, or NULL when it is empty.
 * The pool is the vocabulary's one mutable part (constrain-state.h): the
 * cast drops the const of a shared, otherwise immutable index. */
static cs_pat_cache *pool_take(const eng_cs_vocab *cv)
{
    eng_cs_vocab *v = (eng_cs_vocab *)cv;
    cs_pat_cache *slots = NULL;
    pthread_mutex_lock(&v->pool_lock);
    if (v->n_pool > 0)
        slots = v->pool[--v->n_pool];
    pthread_mutex_unlock(&v->pool_lock);
    return slots;
}

/* Gives a whole set back to the pool; false when the pool is full. */
static bool pool_give(const eng_cs_vocab *cv, cs_pat_cache *slots)
{
    eng_cs_vocab *v = (eng_cs_vocab *)cv;
    bool kept = false;
    pthread_mutex_lock(&v->pool_lock);
    if (v->n_pool < CS_POOL_SETS) {
        v->pool[v->n_pool++] = slots;
        kept = true;
    }
    pthread_mutex_unlock(&v->pool_lock);
    return kept;
}

/* Allocated up front, so masks allocate nothing: a set from the
 * vocabulary's pool, or a new one, touched here once (the pool keeps it
 * touched for the constraints after this one). */
static int pat_cache_create(eng_constraint *c)
{
    bool patterns = false;
    for (int32_t i = 0; i < c->g->n_nodes; i++)
        patterns |= c->g->nodes[i].kind == CS_PATTERN || c->g->nodes[i].kind == CS_RAW;
    if (!patterns || c->v->n_plain == 0)
        return SW_OK;
    if ((c->pcache = pool_take(c->v))) {
        for (int i = 0; i < CS_PAT_SLOTS; i++) {
            c->pcache[i].node = -1;
            c->pcache[i].used = 0;
        }
        return SW_OK;
    }
    if (!(c->pcache = sw_calloc(CS_PAT_SLOTS, sizeof *c->pcache)))
        return SW_ENOMEM;
    size_t words = ((size_t)c->v->n_tokens + 31) / 32;
    size_t entries = (size_t)c->v->n_plain + 1; /* one more: list_build writes one past */
    for (int i = 0; i < CS_PAT_SLOTS; i++) {
        c->pcache[i].node = -1;
        if (!(c->pcache[i].e = sw_malloc(entries * sizeof *c->pcache[i].e)) ||
            !(c->pcache[i].bits = sw_malloc(words * sizeof *c->pcache[i].bits)))
            return SW_ENOMEM;
        memset(c->pcache[i].e, 0, entries * sizeof *c->pcache[i].e);
        memset(c->pcache[i].bits, 0, words * sizeof *c->pcache[i].bits);
    }
    return SW_OK;
}

/* Back to the pool when whole (a create that failed half-way frees it). */
static void pat_cache_free(eng_constraint *c)
{
    if (!c->pcache)
        return;
    bool whole = true;
    for (int i = 0; i < CS_PAT_SLOTS; i++)
        whole &= c->pcache[i].e && c->pcache[i].bits;
    if (!whole || !pool_give(c->v, c->pcache))
        eng__cs_slots_free(c->pcache);
    c->pcache = NULL;
}

/* A state's list, built by one scan of the flat plain trie with the
 * automaton alone: per node one table lookup from its parent's state (kept
 * per depth), a refused byte jumps past every token under it. For GBNF
 * (raw), once an accepting state is reached inside a token, the tokens
 * below that node are undecided (cs_pat_cache). The entries come in the
 * trie's depth-first order. */
static void list_build(const eng_cs_vocab *v, const eng_regex *re, bool raw, int32_t state,
                       cs_pat_cache *slot)
{
    const cs_flat_node *nd = v->plain.nodes;
    const int32_t *ids = v->plain.ids;
    const re_state_id *trans = re->trans;
    const size_t n_classes = (size_t)re->n_classes;
    /* per depth: the transition row of the state there, and code points */
    const re_state_id *row_at[ENG_CS_MAX_TOKEN_BYTES + 1];
    int32_t chars_at[ENG_CS_MAX_TOKEN_BYTES + 1];
    cs_pat_entry *e = slot->e;
    int32_t n = 0;
    row_at[0] = trans + (size_t)state * n_classes;
    chars_at[0] = 0;
    for (uint32_t i = 0; i < v->plain.n_nodes;) {
        const cs_flat_node *x = &nd[i];
        int32_t to = row_at[x->depth - 1][re->class_of[x->byte]];
        if (to < 0) {
            i = x->skip;
            continue;
        }
        int32_t chars = chars_at[x->depth - 1] + ((x->byte & 0xC0) != 0x80);
        uint32_t k = x->tok_off, end = nd[i + 1].tok_off;
        /* Most nodes end one token or none: written either way, counted
         * when it is one (e and ids have room for one more). */
        e[n] = (cs_pat_entry){ids[k], to, chars};
        n += k < end;
        for (k++; k < end; k++)
            e[n++] = (cs_pat_entry){ids[k], to, chars};
        if (raw && re->accept[to]) {
            for (k = end; k < nd[x->skip].tok_off; k++)
                e[n++] = (cs_pat_entry){ids[k], CS_PAT_UNDECIDED, 0};
            i = x->skip;
            continue;
        }
        row_at[x->depth] = trans + (size_t)to * n_classes;
        chars_at[x->depth] = chars;
        i++;
    }
    slot->n = n;
}

/* Whether every plain character read from state `state` either comes back
 * to it or is refused, with no accepting state inside a character (raw:
 * such a token would be undecided). refused_ascii gets the refused
 * one-byte characters, dirty_lead the first bytes of the longer
 * characters of which some are refused. Per first byte the characters are
 * walked as pairs (state, bytes still to come) over their byte ranges;
 * false also when that meets too many pairs. */
#define WHOLE_MAX_PAIRS 64
static bool whole_state(const eng_regex *re, int32_t state, bool raw, bool refused_ascii[128],
                        bool dirty_lead[256])
{
    if (raw && eng_regex_accepting(re, state))
        return false;
    memset(refused_ascii, 0, 128 * sizeof *refused_ascii);
    memset(dirty_lead, 0, 256 * sizeof *dirty_lead);
    for (int ch = 0x20; ch < 0x80; ch++) {
        if (ch == '"' || ch == '\\')
            continue;
        int32_t to = eng_regex_step(re, state, (uint8_t)ch);
        if (to < 0)
            refused_ascii[ch] = true;
        else if (to != state)
            return false;
    }
    for (int lead = 0xC0; lead < 0x100; lead++) {
        uint8_t lo, hi;
        int k = eng__cs_utf8_lead((uint8_t)lead, &lo, &hi);
        if (k == 0)
            continue;
        int32_t first = eng_regex_step(re, state, (uint8_t)lead);
        if (first < 0) {
            dirty_lead[lead] = true;
            continue;
        }
        if (raw && eng_regex_accepting(re, first))
            return false;
        struct { int32_t q; int rest; uint8_t lo, hi; } pair[WHOLE_MAX_PAIRS];
        int n_pairs = 1, done = 0;
        pair[0].q = first, pair[0].rest = k, pair[0].lo = lo, pair[0].hi = hi;
        for (; done < n_pairs; done++) {
            int32_t q = pair[done].q;
            int rest = pair[done].rest;
            for (int b = pair[done].lo; b <= pair[done].hi; b++) {
                int32_t to = eng_regex_step(re, q, (uint8_t)b);
                if (to < 0) {
                    dirty_lead[lead] = true;
                    continue;
                }
                if (rest == 1) {
                    if (to != state)
                        return false;
                    continue;
                }
                if (raw && eng_regex_accepting(re, to))
                    return false;
                bool seen = false;
                for (int i = 0; i < n_pairs && !seen; i++)
                    seen = pair[i].q == to && pair[i].rest == rest - 1 && pair[i].lo == 0x80;
                if (seen)
                    continue;
                if (n_pairs == WHOLE_MAX_PAIRS)
                    return false;
                pair[n_pairs].q = to, pair[n_pairs].rest = rest - 1;
                pair[n_pairs].lo = 0x80, pair[n_pairs].hi = 0xBF;
                n_pairs++;
            }
        }
    }
    return true;
}

/* Whether a whole slot is worth it: the tokens it must look at (those
 * holding a refused or dirty first byte) are few, so most plain tokens are
 * in the set (a state that keeps a few characters and refuses the rest is
 * better walked). */
static bool whole_is_cheap(const eng_cs_vocab *v, const bool refused_ascii[128],
                           const bool dirty_lead[256])
{
    int64_t looked_at = 0;
    for (int b = 0; b < 256; b++)
        if (b < 128 ? refused_ascii[b] : dirty_lead[b])
            looked_at += v->byte_plain_off[b + 1] - v->byte_plain_off[b];
    return looked_at * 8 <= v->n_plain;
}

/* A whole slot's token set (cs_pat_cache.whole): every plain token, less
 * those holding a refused one-byte character, less those of a dirty first
 * byte that the automaton refuses when fed them. */
static void whole_build(const eng_constraint *c, const eng_regex *re, cs_pat_cache *slot,
                        const bool refused_ascii[128], const bool dirty_lead[256])
{
    const eng_cs_vocab *v = c->v;
    memcpy(slot->bits, v->plain_bits, ((size_t)v->n_tokens + 31) / 32 * sizeof *slot->bits);
    slot->n = v->n_plain;
    for (int b = 0; b < 256; b++) {
        bool refused = b < 128 ? refused_ascii[b] : dirty_lead[b];
        for (int32_t j = v->byte_plain_off[b]; refused && j < v->byte_plain_off[b + 1]; j++) {
            int32_t id = v->plain_ids[v->byte_plain[j]];
            uint32_t bit = 1u << (id & 31);
            if (!(slot->bits[id >> 5] & bit))
                continue;
            if (b >= 128) { /* fed from the state: kept unless refused */
                const uint8_t *p = (const uint8_t *)v->blob + v->off[id];
                int32_t q = slot->state;
                for (int32_t k = 0; k < v->len[id] && q >= 0; k++)
                    q = eng_regex_step(re, q, p[k]);
                if (q >= 0)
                    continue;
            }
            slot->bits[id >> 5] &= ~bit;
            slot->n--;
        }
    }
}

/* The slot's mask (cs_pat_cache.fast), after its list is built. */
static void pat_cache_bits(const eng_constraint *c, const cs_node *n, cs_pat_cache *slot)
{
    slot->fast = n->kind == CS_RAW || n->max_chars == INT32_MAX;
    slot->n_bits = 0;
    slot->max_cost = 0;
    if (!slot->fast)
        return;
    memset(slot->bits, 0, ((size_t)c->v->n_tokens + 31) / 32 * sizeof *slot->bits);
    /* A list holds tens of thousands of entries over a few states: their
     * costs are looked up once each through a small direct-mapped memo. */
    struct { int32_t state; int64_t cost; } memo[64];
    for (int i = 0; i < 64; i++)
        memo[i].state = -1;
    int32_t chars = n->kind == CS_RAW ? 0 : n->min_chars;
    for (int32_t i = 0; i < slot->n; i++) {
        const cs_pat_entry *e = &slot->e[i];
        if (e->state == CS_PAT_UNDECIDED) {
            slot->fast = false;
            return;
        }
        int h = e->state & 63;
        if (memo[h].state != e->state) {
            memo[h].state = e->state;
            memo[h].cost = eng_regex_costs_get(n->re_costs, e->state, chars);
        }
        int64_t m = memo[h].cost;
        if (m < 0)
            continue;
        slot->bits[e->id >> 5] |= 1u << (e->id & 31);
        slot->n_bits++;
        if (m > slot->max_cost)
            slot->max_cost = m;
    }
}

/* A whole slot's fast mask: its entries share one state, so one cost. */
static void whole_bits(const cs_node *n, cs_pat_cache *slot)
{
    slot->fast = n->kind == CS_RAW || n->max_chars == INT32_MAX;
    int64_t m = eng_regex_costs_get(n->re_costs, slot->state, n->kind == CS_RAW ? 0 : n->min_chars);
    slot->n_bits = slot->fast && m >= 0 ? slot->n : 0;
    slot->max_cost = slot->n_bits > 0 ? m : 0;
}

/* The list's entry i, for a slot that is not whole: slot->e; for a whole
 * one, plain token i if it is in the set (false: it is not). */
static inline bool pat_entry(const eng_constraint *c, const cs_pat_cache *slot, int32_t i,
                             cs_pat_entry *e)
{
    if (!slot->whole) {
        *e = slot->e[i];
        return true;
    }
    int32_t id = c->v->plain_ids[i];
    if (!(slot->bits[id >> 5] & (1u << (id & 31))))
        return false;
    *e = (cs_pat_entry){id, slot->state, c->v->plain_chars[i]};
    return true;
}

/* The number of entries pat_entry walks over. */
static inline int32_t pat_entries(const eng_constraint *c, const cs_pat_cache *slot)
{
    return slot->whole ? c->v->n_plain : slot->n;
}

/* ORs a slot's mask into mask. */
static void pat_cache_or(const eng_constraint *c, const cs_pat_cache *slot, uint32_t *mask,
                         int32_t *count)
{
    if (slot->n_bits == 0)
        return; /* a whole slot's bits hold its set, not a mask, then */
    size_t words = ((size_t)c->v->n_tokens + 31) / 32;
    for (size_t i = 0; i < words; i++)
        mask[i] |= slot->bits[i];
    *count += slot->n_bits;
}

/* The list for (node, state), built the first time it is asked for. */
static const cs_pat_cache *pat_cache_get(eng_constraint *c, int32_t node, int32_t state)
{
    cs_pat_cache *slot = NULL, *lru = &c->pcache[0];
    for (int i = 0; i < CS_PAT_SLOTS; i++) {
        if (c->pcache[i].node == node && c->pcache[i].state == state)
            slot = &c->pcache[i];
        if (c->pcache[i].used < lru->used)
            lru = &c->pcache[i];
    }
    if (!slot) {
        slot = lru;
        slot->node = node;
        slot->state = state;
        slot->n = 0;
        const cs_node *n = &c->g->nodes[node];
        bool refused_ascii[128], dirty_lead[256];
        slot->whole = whole_state(n->re, state, n->kind == CS_RAW, refused_ascii, dirty_lead) &&
                      whole_is_cheap(c->v, refused_ascii, dirty_lead);
        if (slot->whole) {
            whole_build(c, n->re, slot, refused_ascii, dirty_lead);
            whole_bits(n, slot);
        } else {
            list_build(c->v, n->re, n->kind == CS_RAW, state, slot);
            pat_cache_bits(c, n, slot);
        }
    }
    slot->used = ++c->ptick;
    return slot;
}

/* ORs in the plain tokens of lo..hi code points that are in `within`
 * (NULL: every plain token), none of which mask holds yet: the short ones
 * from the vocabulary's masks by code points, the few longer ones from its
 * list by code points. */
static void plain_by_chars(const eng_cs_vocab *v, int64_t lo, int64_t hi, const uint32_t *within,
                           uint32_t *mask, int32_t *count)
{
    if (hi > v->max_plain_chars)
        hi = v->max_plain_chars;
    if (lo > hi)
        return;
    if (lo < CS_UPTO_MASKS) {
        size_t words = ((size_t)v->n_tokens + 31) / 32;
        int64_t top = hi < CS_UPTO_MASKS - 1 ? hi : CS_UPTO_MASKS - 1;
        const uint32_t *upto = v->plain_upto + (size_t)top * words;
        const uint32_t *below = lo > 0 ? v->plain_upto + (size_t)(lo - 1) * words : NULL;
        if (!within) {
            for (size_t i = 0; i < words; i++)
                mask[i] |= below ? upto[i] & ~below[i] : upto[i];
            *count += v->plain_upto_n[top] - (below ? v->plain_upto_n[lo - 1] : 0);
        } else {
            for (size_t i = 0; i < words; i++) {
                uint32_t add = (below ? upto[i] & ~below[i] : upto[i]) & within[i];
                mask[i] |= add;
                *count += __builtin_popcount(add);
            }
        }
        if (hi < CS_UPTO_MASKS)
            return;
        lo = CS_UPTO_MASKS;
    }
    for (int32_t j = v->by_chars_off[lo]; j < v->by_chars_off[hi + 1]; j++) {
        int32_t id = v->plain_ids[v->by_chars[j]];
        if (within && !(within[id >> 5] & (1u << (id & 31))))
            continue;
        mask[id >> 5] |= 1u << (id & 31);
        (*count)++;
    }
}

/* A whole slot's tokens that fit (pattern_plain_mask's slow case): they
 * share one state, so whether one fits depends on its code points alone;
 * each count is decided once, and each run of counts that fit is taken
 * from the slot's set by plain_by_chars. */
static void whole_plain_mask(const eng_constraint *c, const cs_node *n, const cs_pat_cache *slot,
                             int64_t chars_before, int64_t base_rest, int64_t budget_after,
                             uint32_t *mask, int32_t *count)
{
    int64_t run_lo = -1;
    for (int64_t k = 1; k <= c->v->max_plain_chars + 1; k++) {
        bool fits = false;
        if (k <= c->v->max_plain_chars && chars_before + k <= n->max_chars) {
            int64_t m = eng_regex_costs_get(n->re_costs, slot->state, chars_before + k);
            fits = m >= 0 && base_rest + m + 1 <= budget_after;
        }
        if (fits && run_lo < 0)
            run_lo = k;
        if (!fits && run_lo >= 0) {
            plain_by_chars(c->v, run_lo, k - 1, slot->bits, mask, count);
            run_lo = -1;
        }
    }
}

/* The plain tokens of a pattern frame from its state's list; false when
 * the frame is inside a character (or there are no lists): walk them. */
static bool pattern_plain_mask(eng_constraint *c, const cs_frame *f, int64_t base_rest,
                               int64_t budget_after, uint32_t *mask, int32_t *count)
{
    const cs_node *n = &c->g->nodes[f->node];
    if (!c->pcache || eng_regex_pending(n->re, f->b) != 0)
        return false;
    const cs_pat_cache *slot = pat_cache_get(c, f->node, f->b);
    if (slot->fast && f->a >= n->min_chars && base_rest + slot->max_cost + 1 <= budget_after) {
        pat_cache_or(c, slot, mask, count);
        return true;
    }
    if (slot->whole) {
        whole_plain_mask(c, n, slot, f->a, base_rest, budget_after, mask, count);
        return true;
    }
    for (int32_t i = 0; i < pat_entries(c, slot); i++) {
        cs_pat_entry entry;
        if (!pat_entry(c, slot, i, &entry))
            continue;
        const cs_pat_entry *e = &entry;
        int64_t a = (int64_t)f->a + e->chars;
        if (a > n->max_chars)
            continue;
        int64_t m = eng_regex_costs_get(n->re_costs, e->state, a);
        if (m < 0 || base_rest + m + 1 > budget_after)
            continue;
        mask[e->id >> 5] |= 1u << (e->id & 31);
        (*count)++;
    }
    return true;
}

int eng_constraint_create(const eng_grammar *g, const eng_cs_vocab *v, eng_constraint **out,
                          sw_error *err)
{
    if (!g || !v || !out || g->root < 0)
        return sw_error_set(err, SW_EINVAL, "eng_constraint_create: NULL argument");
    eng_constraint *c = sw_calloc(1, sizeof *c);
    if (!c)
        return sw_error_set(err, SW_ENOMEM, "out of memory starting a constraint");
    c->g = g;
    c->v = v;
    c->scratch = sw_malloc(((size_t)v->max_len + 2) * sizeof *c->scratch);
    c->mask = sw_calloc(((size_t)v->n_tokens + 31) / 32, sizeof *c->mask);
    if (!c->scratch || !c->mask || pat_cache_create(c)) {
        eng_constraint_free(c);
        return sw_error_set(err, SW_ENOMEM, "out of memory starting a constraint");
    }
    c->state.n = 1;
    c->state.s[0].depth = 1;
    memset(&c->state.s[0].f[0], 0, sizeof c->state.s[0].f[0]);
    c->state.s[0].f[0].node = -1;
    *out = c;
    return SW_OK;
}

void eng_constraint_free(eng_constraint *c)
{
    if (!c)
        return;
    sw_free(c->scratch);
    sw_free(c->mask);
    pat_cache_free(c);
    sw_free(c);
}

bool eng_constraint_feed(eng_constraint *c, const char *bytes, size_t n)
{
    /* scratch[0] and [1] alternate; the state changes only on success. */
    const cs_set *cur = &c->state;
    for (size_t i = 0; i < n; i++) {
        cs_set *next = &c->scratch[i & 1];
        eng__cs_set_step(c->g, cur, (uint8_t)bytes[i], next);
        if (next->n == 0)
            return false;
        cur = next;
    }
    if (cur != &c->state) {
        c->state.n = cur->n;
        for (int32_t i = 0; i < cur->n; i++)
            eng__cs_stack_copy(&c->state.s[i], &cur->s[i]);
    }
    return true;
}

uint32_t *eng_constraint_mask_buffer(eng_constraint *c)
{
    return c->mask;
}

int32_t eng_constraint_n_tokens(const eng_constraint *c)
{
    return c->v->n_tokens;
}

bool eng_constraint_is_end_token(const eng_constraint *c, int32_t token)
{
    return token >= 0 && token < c->v->n_tokens && c->v->is_end[token];
}

bool eng_constraint_accept_token(eng_constraint *c, int32_t token)
{
    if (token < 0 || token >= c->v->n_tokens)
        return false;
    if (c->v->is_end[token])
        return eng_constraint_is_complete(c);
    if (c->v->len[token] <= 0)
        return false;
    return eng_constraint_feed(c, c->v->blob + c->v->off[token], (size_t)c->v->len[token]);
}

bool eng_constraint_is_complete(const eng_constraint *c)
{
    return eng__cs_set_complete(c->g, &c->state);
}

bool eng_constraint_is_closed(const eng_constraint *c)
{
    if (!eng__cs_set_complete(c->g, &c->state))
        return false;
    for (int ch = 0; ch < 256; ch++) {
        eng__cs_set_step(c->g, &c->state, (uint8_t)ch, &c->scratch[0]);
        if (c->scratch[0].n > 0)
            return false;
    }
    return true;
}

int64_t eng_constraint_min_bytes(const eng_constraint *c)
{
    return eng__cs_set_complete(c->g, &c->state) ? 0 : eng__cs_set_min(c->g, &c->state);
}

typedef struct walk_ctx {
    eng_constraint *c;
    const cs_trie *t;
    int64_t budget_after;
    uint32_t *mask;
    int32_t count;
} walk_ctx;

/* Every token that ends at trie node tn goes into the mask. */
static inline void allow_tokens(walk_ctx *w, const cs_tnode *tn)
{
    for (uint32_t k = 0; k < tn->tok_count; k++) {
        int32_t id = w->t->ids[tn->tok_begin + k];
        w->mask[id >> 5] |= 1u << (id & 31);
        w->count++;
    }
}

static void walk(walk_ctx *w, uint32_t node, int32_t depth)
{
    const cs_trie *t = w->t;
    const cs_set *cur = &w->c->scratch[depth];
    cs_set *next = &w->c->scratch[depth + 1];
    for (uint32_t ch = t->nodes[node].first_child; ch; ch = t->nodes[ch].next) {
        const cs_tnode *tn = &t->nodes[ch];
        eng__cs_set_step(w->c->g, cur, tn->byte, next);
        if (next->n == 0)
            continue;
        if (tn->tok_count && eng__cs_set_min(w->c->g, next) <= w->budget_after)
            allow_tokens(w, tn);
        if (tn->first_child)
            walk(w, ch, depth + 1);
    }
}

/* Plain tokens (ordinary string characters) decided by their length alone:
 * in a string, or in a pattern string that has matched for good. */
static bool plain_by_length(const cs_node *n, const cs_frame *top)
{
    if (n->kind == CS_STRING)
        return top->phase == S_IN && top->pend == 0;
    return n->kind == CS_PATTERN && top->phase == S_IN && eng_regex_pending(n->re, top->b) == 0 &&
           eng_regex_universal(n->re, top->b);
}

/* Inside a pattern string (one stack, its top frame CS_PATTERN in S_IN):
 * the trie is walked with a copy of that frame alone while the bytes are
 * content (no stack copies per byte); a quote or a backslash goes back to
 * the general walk, from the full state rebuilt at that trie node.
 * base_rest: the shortest completion of the frames below. */
static void walk_pattern(walk_ctx *w, uint32_t node, int32_t depth, const cs_frame *f,
                         int64_t base_rest)
{
    const cs_trie *t = w->t;
    const cs_node *n = &w->c->g->nodes[f->node];
    for (uint32_t ch = t->nodes[node].first_child; ch; ch = t->nodes[ch].next) {
        const cs_tnode *tn = &t->nodes[ch];
        if (tn->byte == '"' || tn->byte == '\\') {
            cs_set *cur = &w->c->scratch[depth], *next = &w->c->scratch[depth + 1];
            cur->n = 1;
            eng__cs_stack_copy(&cur->s[0], &w->c->state.s[0]);
            cur->s[0].f[cur->s[0].depth - 1] = *f;
            eng__cs_set_step(w->c->g, cur, tn->byte, next);
            if (next->n == 0)
                continue;
            if (tn->tok_count && eng__cs_set_min(w->c->g, next) <= w->budget_after)
                allow_tokens(w, tn);
            if (tn->first_child)
                walk(w, ch, depth + 1);
            continue;
        }
        cs_frame f2 = *f;
        if (eng__cs_step_pattern(n, &f2, tn->byte) != R_ACCEPT)
            continue;
        if (tn->tok_count && base_rest + eng__cs_pattern_min(n, &f2) <= w->budget_after)
            allow_tokens(w, tn);
        if (tn->first_child)
            walk_pattern(w, ch, depth + 1, &f2, base_rest);
    }
}

/* Whether token id (not an end token) is accepted from the state with
 * its shortest completion within budget_after: fed through the full
 * state (scratch[0] and [1]). */
static bool token_fits(eng_constraint *c, int32_t id, int64_t budget_after)
{
    const cs_set *cur = &c->state;
    const uint8_t *p = (const uint8_t *)c->v->blob + c->v->off[id];
    for (int32_t k = 0; k < c->v->len[id]; k++) {
        cs_set *next = &c->scratch[k & 1];
        eng__cs_set_step(c->g, cur, p[k], next);
        if (next->n == 0)
            return false;
        cur = next;
    }
    return eng__cs_set_min(c->g, cur) <= budget_after;
}

/* The plain tokens of a CS_RAW frame that cannot end here, from its
 * state's list; false where it could end (or there are no lists): walk
 * them. */
static bool raw_plain_mask(eng_constraint *c, const cs_frame *f, int64_t base_rest,
                           int64_t budget_after, uint32_t *mask, int32_t *count)
{
    const cs_node *n = &c->g->nodes[f->node];
    if (!c->pcache || eng_regex_accepting(n->re, f->b))
        return false;
    const cs_pat_cache *slot = pat_cache_get(c, f->node, f->b);
    if (slot->fast && base_rest + slot->max_cost <= budget_after) {
        pat_cache_or(c, slot, mask, count);
        return true;
    }
    if (slot->whole) { /* one state, no undecided entry: all or none */
        if (base_rest + eng_regex_costs_get(n->re_costs, slot->state, 0) <= budget_after) {
            size_t words = ((size_t)c->v->n_tokens + 31) / 32;
            for (size_t i = 0; i < words; i++)
                mask[i] |= slot->bits[i];
            *count += slot->n;
        }
        return true;
    }
    for (int32_t i = 0; i < pat_entries(c, slot); i++) {
        cs_pat_entry entry;
        if (!pat_entry(c, slot, i, &entry))
            continue;
        const cs_pat_entry *e = &entry;
        bool ok = e->state == CS_PAT_UNDECIDED
                      ? token_fits(c, e->id, budget_after)
                      : base_rest + eng_regex_costs_get(n->re_costs, e->state, 0) <= budget_after;
        if (ok) {
            mask[e->id >> 5] |= 1u << (e->id & 31);
            (*count)++;
        }
    }
    return true;
}

/* Inside a GBNF automaton (one stack, its top frame CS_RAW): while the
 * automaton cannot end there, a byte only steps it, so the trie is walked
 * with a copy of that frame alone (one table lookup per trie node, no
 * stack copies); where it could end (the byte may belong to the frames
 * below) the general walk takes over from the full state. */
static void walk_raw(walk_ctx *w, uint32_t node, int32_t depth, const cs_frame *f,
                     int64_t base_rest)
{
    const cs_node *n = &w->c->g->nodes[f->node];
    if (eng_regex_accepting(n->re, f->b)) {
        cs_set *cur = &w->c->scratch[depth];
        cur->n = 1;
        eng__cs_stack_copy(&cur->s[0], &w->c->state.s[0]);
        cur->s[0].f[cur->s[0].depth - 1] = *f;
        walk(w, node, depth);
        return;
    }
    const cs_trie *t = w->t;
    for (uint32_t ch = t->nodes[node].first_child; ch; ch = t->nodes[ch].next) {
        const cs_tnode *tn = &t->nodes[ch];
        int32_t to = eng_regex_step(n->re, f->b, tn->byte);
        if (to < 0)
            continue;
        cs_frame f2 = *f;
        f2.b = to;
        if (tn->tok_count && base_rest + eng_regex_costs_get(n->re_costs, to, 0) <= w->budget_after)
            allow_tokens(w, tn);
        if (tn->first_child)
            walk_raw(w, ch, depth + 1, &f2, base_rest);
    }
}

int32_t eng_constraint_mask(eng_constraint *c, int64_t remaining_tokens, uint32_t *mask)
{
    const eng_cs_vocab *v = c->v;
    const eng_grammar *g = c->g;
    memset(mask, 0, ((size_t)v->n_tokens + 31) / 32 * sizeof *mask);
    walk_ctx w = {c, &v->full, remaining_tokens - 1, mask, 0};
    if (remaining_tokens > 0) {
        cs_set *s0 = &c->scratch[0];
        s0->n = c->state.n;
        for (int32_t i = 0; i < c->state.n; i++)
            eng__cs_stack_copy(&s0->s[i], &c->state.s[i]);
        const cs_stack *only = &c->state.s[0];
        const cs_frame *top = &only->f[only->depth - 1];
        if (c->state.n == 1 && top->node >= 0 && plain_by_length(&g->nodes[top->node], top)) {
            /* Inside a string: ordinary characters keep it open; decide
             * those tokens by their length alone, walk the others. */
            const cs_node *n = &g->nodes[top->node];
            int64_t room = (int64_t)n->max_chars - top->a;
            int64_t need = n->min_chars > top->a ? n->min_chars - top->a : 0;
            int64_t base = eng__cs_stack_min(g, only);
            if (room >= v->max_plain_chars && need == 0 && base <= w.budget_after) {
                /* every plain token fits: the precomputed mask */
                size_t words = ((size_t)v->n_tokens + 31) / 32;
                for (size_t i = 0; i < words; i++)
                    mask[i] |= v->plain_bits[i];
                w.count += v->n_plain;
            } else {
                /* A token of k code points fits when k <= room and the
                 * completion left, base - min(k, need), is in budget. */
                int64_t short_by = base - w.budget_after, lo = short_by > 0 ? short_by : 0;
                if (need >= lo)
                    plain_by_chars(v, lo, room, NULL, mask, &w.count);
            }
            w.t = &v->special;
        }
        if (c->state.n == 1 && top->node >= 0 && g->nodes[top->node].kind == CS_PATTERN &&
            top->phase == S_IN && w.t == &v->full) {
            int64_t rest = eng__cs_stack_min(g, only) - eng__cs_frame_min(g, top);
            if (pattern_plain_mask(c, top, rest, w.budget_after, mask, &w.count))
                w.t = &v->special;
            walk_pattern(&w, 0, 0, top, rest);
        } else if (c->state.n == 1 && top->node >= 0 && g->nodes[top->node].kind == CS_RAW) {
            int64_t rest = eng__cs_stack_min(g, only) - eng__cs_frame_min(g, top);
            if (raw_plain_mask(c, top, rest, w.budget_after, mask, &w.count))
                w.t = &v->special;
            walk_raw(&w, 0, 0, top, rest);
        } else {
            walk(&w, 0, 0);
        }
    }
    if (eng__cs_set_complete(g, &c->state)) {
        for (int32_t i = 0; i < v->n_end; i++) {
            int32_t id = v->end_ids[i];
            mask[id >> 5] |= 1u << (id & 31);
            w.count++;
        }
    }
    return w.count;
}
