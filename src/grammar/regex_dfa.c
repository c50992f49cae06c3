/* regex_dfa.c - the subset construction (stage 3 of regex.c's overview):
 * byte classes, epsilon closures, the DFA states' sets, then liveness,
 * pruning and pending continuation bytes (eng__rx_dfa_finish).
 *
 * What a state costs, since a pattern is request input: a closure is one
 * walk with generation-stamped marks (no clearing) and its set is kept in
 * the order the walk found it, under an order-free hash (a sum over the
 * members) and compared with a stamp per kept member, so no closure is
 * sorted; adjacent byte classes that no range of the set tells apart
 * share one closure, and so do other classes of a row with the same seed
 * states (a memo per row). The sets live in chunks that never move, the
 * rows in regex_rows.c's blocks. The automaton, the states' numbering and
 * the work counter are those of sorted sets and one closure per class.
 */
#include "grammar/regex-impl.h"

#include "common/alloc.h"

#include <stdlib.h>
#include <string.h>

/* ---- the DFA ------------------------------------------------------------ */

typedef struct seed_memo {
    uint32_t hash;
    int32_t n;     /* seeds, at memo_seeds + off */
    size_t off;
    int32_t state; /* the closure's DFA state, or ENG_REGEX_DEAD */
    long work;     /* what the closure counted */
    uint32_t gen;  /* the row it belongs to (dfa_build.memo_gen) */
} seed_memo;

typedef struct dfa_build {
    const re_nfa *m;
    int32_t tail;      /* the trailing loop's split state */
    /* closure scratch */
    uint32_t *mark;    /* m->n: generation of the last visit */
    uint32_t gen;
    uint32_t *kept;    /* m->n: kept_gen where the state is in the closure */
    uint32_t kept_gen;
    int32_t *stack;    /* m->n */
    int32_t *eol;      /* m->n: set_accepts' $ states */
    int32_t *tmp;      /* m->n: the closure being built, in no order */
    int32_t n_tmp;
    uint32_t tmp_hash; /* set_hash of tmp */
    bool collapsed;    /* the last closure matched for good */
    long work;
    /* the sets of the DFA states (each in the order its closure found it) */
    /* in chunks that never move (the sets of a large automaton are
     * megabytes; one pool grown by doubling copied them each time) */
    int32_t *pool;     /* the chunk being filled: used of cap_pool entries */
    size_t used_pool, cap_pool;
    size_t n_pool;     /* entries in every chunk: RE_MAX_POOL */
    int32_t **chunks;
    int32_t n_chunks, cap_chunks;
    int32_t cap_states; /* of set_at, set_len, set_hash, re->accept, re->universal */
    const int32_t **set_at;
    int32_t *set_len;
    uint32_t *set_hash;
    int32_t *htab;     /* open addressing, cap_htab entries: state or -1 */
    uint32_t cap_htab; /* a power of two, at least twice the states */
    /* dfa_row's scratch: the set's byte states (m->n each), a seed list
     * (m->n), the seed lists closed in this row and their memo */
    uint8_t *byte_lo, *byte_hi;
    int32_t *byte_out;
    int32_t *seed;
    int32_t *memo_seeds;
    size_t cap_memo_seeds;
    seed_memo *memo;   /* memo_slots (a power of two, at least twice the classes) */
    uint32_t memo_slots, memo_gen;
    void *scratch;     /* the block that mark .. byte_hi live in */
    re_rows rows;      /* the transitions, joined into re->trans at the end */
    int rc;
} dfa_build;

#define RE_MAX_POOL ((size_t)1 << 24) /* entries in the sets of one construction */
#define RE_POOL_CHUNK ((size_t)1 << 14)

static int int_cmp(const void *pa, const void *pb)
{
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    return a < b ? -1 : a > b;
}

/* A state's part of a set's hash: the hash is the sum of its members'
 * (the same for the set in any order; a set is kept in the order its
 * closure found it, so no sort is needed to recognise it again). */
static uint32_t member_hash(int32_t x)
{
    uint32_t h = (uint32_t)x * 0x9E3779B1u;
    h ^= h >> 15;
    h *= 0x85EBCA77u;
    h ^= h >> 13;
    return h;
}

static void keep(dfa_build *b, int32_t x)
{
    b->tmp[b->n_tmp++] = x;
    b->kept[x] = b->kept_gen;
    b->tmp_hash += member_hash(x);
}

static void kept_next(dfa_build *b)
{
    if (++b->kept_gen == 0) {
        memset(b->kept, 0, (size_t)b->m->n * sizeof *b->kept);
        b->kept_gen = 1;
    }
    b->n_tmp = 0;
    b->tmp_hash = 0;
}

/* Closes the seeds (n_seeds of them) over epsilon edges into b->tmp:
 * splits always, ^ only at the start, $ never (acceptance decides it).
 * Keeps the states that matter for a set: bytes, $, the match. The work
 * counted is the states visited, whatever the order of the walk. */
static void closure(dfa_build *b, const int32_t *seeds, int32_t n_seeds, bool at_start)
{
    const nfa_state *s = b->m->s;
    int32_t sp = 0;
    if (++b->gen == 0) {
        memset(b->mark, 0, (size_t)b->m->n * sizeof *b->mark);
        b->gen = 1;
    }
    kept_next(b);
    for (int32_t i = 0; i < n_seeds; i++) {
        int32_t x = seeds[i];
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
            keep(b, x);
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
    b->collapsed = matched;
    if (matched) {
        /* Matched for good: every continuation is accepted. One state:
         * the trailing loop's closure alone. */
        sp = 0;
        ++b->gen;
        kept_next(b);
        b->mark[b->tail] = b->gen;
        b->stack[sp++] = b->tail;
        while (sp > 0) {
            int32_t x = b->stack[--sp];
            const nfa_state *st = &s[x];
            if (st->kind == NS_BYTE || st->kind == NS_MATCH) {
                keep(b, x);
            } else if (st->kind == NS_SPLIT) {
                int32_t nx[2] = {st->out, st->out2};
                for (int k = 0; k < 2; k++)
                    if (nx[k] >= 0 && b->mark[nx[k]] != b->gen) {
                        b->mark[nx[k]] = b->gen;
                        b->stack[sp++] = nx[k];
                    }
            }
        }
    }
}

/* Whether a set accepts at the end of the string: the match is in it, or
 * reachable through $ (and further epsilons; ^ too at the start). */
static bool set_accepts(dfa_build *b, const int32_t *set, int32_t n, bool at_start)
{
    const nfa_state *s = b->m->s;
    int32_t sp = 0, n_eol = 0;
    for (int32_t i = 0; i < n; i++) {
        if (s[set[i]].kind == NS_MATCH)
            return true;
        if (s[set[i]].kind == NS_EOL)
            b->eol[n_eol++] = set[i];
    }
    /* The walk from the $ states in increasing order, as when sets were
     * kept sorted: where it stops at the match decides the work counted,
     * and so which patterns the work bound refuses. */
    if (n_eol > 1)
        qsort(b->eol, (size_t)n_eol, sizeof *b->eol, int_cmp);
    ++b->gen;
    for (int32_t i = 0; i < n_eol; i++) {
        int32_t out = s[b->eol[i]].out;
        if (b->mark[out] != b->gen) {
            b->mark[out] = b->gen;
            b->stack[sp++] = out;
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

static uint32_t set_hash(const dfa_build *b, bool initial)
{
    uint32_t h = b->tmp_hash + (uint32_t)b->n_tmp * 0x27D4EB2Fu;
    h ^= initial ? 0x9E3779B9u : 0;
    h ^= h >> 16;
    return h;
}

/* Whether DFA state id's set is b->tmp's: as long, and each of its
 * members kept by the last closure. */
static bool set_is_tmp(const dfa_build *b, int32_t id)
{
    if (b->set_len[id] != b->n_tmp)
        return false;
    const int32_t *set = b->set_at[id];
    for (int32_t i = 0; i < b->n_tmp; i++)
        if (b->kept[set[i]] != b->kept_gen)
            return false;
    return true;
}

/* Twice as many slots (the table stays at most half full). */
static int htab_grow(dfa_build *b)
{
    uint32_t cap = b->cap_htab * 2;
    int32_t *t = sw_malloc((size_t)cap * sizeof *t);
    if (!t)
        return SW_ENOMEM;
    memset(t, 0xFF, (size_t)cap * sizeof *t);
    for (uint32_t i = 0; i < b->cap_htab; i++) {
        int32_t id = b->htab[i];
        if (id < 0)
            continue;
        uint32_t h = b->set_hash[id] & (cap - 1);
        while (t[h] >= 0)
            h = (h + 1) & (cap - 1);
        t[h] = id;
    }
    sw_free(b->htab);
    b->htab = t;
    b->cap_htab = cap;
    return SW_OK;
}

/* A new chunk for the sets, with room for at least n entries: twice the
 * last one's, up to RE_POOL_CHUNK, or n. */
static int pool_chunk(dfa_build *b, size_t n)
{
    if (b->n_chunks == b->cap_chunks) {
        int32_t cap = b->cap_chunks ? b->cap_chunks * 2 : 8;
        int32_t **chunks = sw_realloc(b->chunks, (size_t)cap * sizeof *chunks);
        if (!chunks)
            return SW_ENOMEM;
        b->chunks = chunks;
        b->cap_chunks = cap;
    }
    size_t cap = b->cap_pool ? b->cap_pool * 2 : 256;
    if (cap > RE_POOL_CHUNK)
        cap = RE_POOL_CHUNK;
    if (cap < n)
        cap = n;
    int32_t *pool = sw_malloc(cap * sizeof *pool);
    if (!pool)
        return SW_ENOMEM;
    b->chunks[b->n_chunks++] = pool;
    b->pool = pool;
    b->cap_pool = cap;
    b->used_pool = 0;
    return SW_OK;
}

/* Room for one more state's set and flags: the arrays grow with the
 * states (by doubling), not sized to ENG_REGEX_MAX_STATES up front. */
static int states_reserve(dfa_build *b, eng_regex *re)
{
    int32_t n = re->n_states + 1, cap = b->cap_states;
    if (n <= cap)
        return SW_OK;
    if (eng__rx_flags_reserve(re, &cap, n))
        return SW_ENOMEM;
    const int32_t **off = sw_realloc(b->set_at, (size_t)cap * sizeof *off);
    if (off)
        b->set_at = off;
    int32_t *len = off ? sw_realloc(b->set_len, (size_t)cap * sizeof *len) : NULL;
    if (len)
        b->set_len = len;
    uint32_t *hash = len ? sw_realloc(b->set_hash, (size_t)cap * sizeof *hash) : NULL;
    if (!hash)
        return SW_ENOMEM; /* the flags keep their larger size: harmless */
    b->set_hash = hash;
    b->cap_states = cap;
    return SW_OK;
}

/* The DFA state of the set in b->tmp: found, or added (with its
 * acceptance). -1 with b->rc on a bound or out of memory. */
static int32_t dfa_state(dfa_build *b, eng_regex *re, bool initial)
{
    const int32_t *set = b->tmp;
    int32_t n = b->n_tmp;
    uint32_t hash = set_hash(b, initial);
    uint32_t h = hash & (b->cap_htab - 1);
    for (;; h = (h + 1) & (b->cap_htab - 1)) {
        int32_t id = b->htab[h];
        if (id < 0)
            break;
        if (b->set_hash[id] == hash && (id == re->start) == initial && set_is_tmp(b, id))
            return id;
    }
    if (re->n_states >= ENG_REGEX_MAX_STATES) {
        b->rc = SW_ERANGE;
        return -1;
    }
    if ((b->rc = states_reserve(b, re)))
        return -1;
    if (b->n_pool + (size_t)n > RE_MAX_POOL) {
        b->rc = SW_ERANGE;
        return -1;
    }
    if (b->used_pool + (size_t)n > b->cap_pool && (b->rc = pool_chunk(b, (size_t)n)))
        return -1;
    int32_t id = re->n_states++;
    memcpy(b->pool + b->used_pool, set, (size_t)n * sizeof *set);
    b->set_at[id] = b->pool + b->used_pool;
    b->set_len[id] = n;
    b->set_hash[id] = hash;
    b->used_pool += (size_t)n;
    b->n_pool += (size_t)n;
    b->htab[h] = id;
    if ((uint32_t)re->n_states * 2 > b->cap_htab && (b->rc = htab_grow(b)))
        return -1;
    re->accept[id] = set_accepts(b, set, n, initial);
    re->universal[id] = b->collapsed;
    return id;
}

eng_regex *eng_regex_ref(eng_regex *re)
{
    atomic_fetch_add_explicit(&re->refs, 1, memory_order_relaxed);
    return re;
}

void eng_regex_free(eng_regex *re)
{
    if (!re || atomic_fetch_sub_explicit(&re->refs, 1, memory_order_acq_rel) > 0)
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

/* Each state's predecessors, one entry per (predecessor, state) pair
 * however many classes lead there: start (ns + 1 entries) indexes from,
 * state t's predecessors being from[start[t]] .. from[start[t + 1] - 1].
 * A row has few distinct targets, so this is much smaller than one entry
 * per edge. stamp (ns entries) is scratch. */
static int dfa_predecessors(const eng_regex *re, int32_t *start, int32_t *stamp,
                            int32_t **from_out)
{
    int32_t ns = re->n_states, nc = re->n_classes;
    memset(start, 0, ((size_t)ns + 1) * sizeof *start);
    memset(stamp, 0xFF, (size_t)ns * sizeof *stamp);
    for (int32_t s = 0; s < ns; s++) {
        const re_state_id *row = re->trans + (size_t)s * (size_t)nc;
        for (int32_t c = 0; c < nc; c++) {
            int32_t t = row[c];
            if (t >= 0 && stamp[t] != s) {
                stamp[t] = s;
                start[t + 1]++;
            }
        }
    }
    for (int32_t i = 0; i < ns; i++)
        start[i + 1] += start[i];
    int32_t *from = sw_malloc(((size_t)start[ns] + 1) * sizeof *from);
    if (!from)
        return SW_ENOMEM;
    /* stamp again, then a fill cursor per state in from's place */
    memset(stamp, 0xFF, (size_t)ns * sizeof *stamp);
    for (int32_t s = 0; s < ns; s++) {
        const re_state_id *row = re->trans + (size_t)s * (size_t)nc;
        for (int32_t c = 0; c < nc; c++) {
            int32_t t = row[c];
            if (t >= 0 && stamp[t] != s) {
                stamp[t] = s;
                /* start[t] is the cursor until the fill is done */
                from[start[t]++] = s;
            }
        }
    }
    /* the cursors ended at the next state's beginning: shift back */
    for (int32_t i = ns; i > 0; i--)
        start[i] = start[i - 1];
    start[0] = 0;
    *from_out = from;
    return SW_OK;
}

/* Liveness (reverse reachability from the accepting states), pruning of
 * the transitions into dead states, pending continuation bytes. */
int eng__rx_dfa_finish(eng_regex *re)
{
    int32_t ns = re->n_states, nc = re->n_classes;
    size_t edges = (size_t)ns * (size_t)nc;
    int32_t *count = sw_malloc(((size_t)ns + 1) * sizeof *count);
    int32_t *queue = sw_malloc(((size_t)ns + 1) * sizeof *queue);
    int32_t *rev = NULL;
    re->live = sw_calloc((size_t)ns, 1);
    re->pend = sw_calloc((size_t)ns, 1);
    uint8_t *seen = sw_calloc((size_t)ns, 1);
    int rc = SW_OK;
    if (!count || !queue || !re->live || !re->pend || !seen ||
        dfa_predecessors(re, count, queue, &rev)) {
        rc = SW_ENOMEM;
        goto done;
    }
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
            re->trans[e] = (re_state_id)ENG_REGEX_DEAD;
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

/* The seed lists a row has closed already, by hash: classes that are
 * not adjacent but read by the same byte states of the set ([a-z0-9]: the
 * letters and the digits) have the same list, in the same order (the
 * set's), so the same closure; it is looked up, not walked again, and its
 * work counted again, so the work counter is what a closure per class
 * gives. Lists are kept up to RE_SEED_MEMO_MAX entries per row. */
#define RE_SEED_MEMO_MAX ((size_t)1 << 16)

static uint32_t seeds_hash(const int32_t *seed, int32_t n)
{
    uint32_t h = 2166136261u ^ (uint32_t)n;
    for (int32_t i = 0; i < n; i++)
        h = (h ^ (uint32_t)seed[i]) * 16777619u;
    return h;
}

/* The seed list of a class (n_seed entries at seed) in this row's memo:
 * its slot, which holds the list's closure when slot->gen is this row's,
 * or is free for it otherwise. */
static seed_memo *seeds_find(dfa_build *b, const int32_t *seed, int32_t n_seed, uint32_t hash)
{
    uint32_t h = hash & (b->memo_slots - 1);
    for (;; h = (h + 1) & (b->memo_slots - 1)) {
        seed_memo *e = &b->memo[h];
        if (e->gen != b->memo_gen)
            return e;
        if (e->hash == hash && e->n == n_seed &&
            memcmp(b->memo_seeds + e->off, seed, (size_t)n_seed * sizeof *seed) == 0)
            return e;
    }
}

/* The transitions of DFA state s, one per byte class. Adjacent classes
 * that the same NFA byte states of s's set read (no range of the set
 * begins or ends between them) go to the same state: that is reused
 * with the work its closure counted, so the work counter and the
 * automaton are what a closure per class gives; other classes with the
 * same seeds are found in the row's memo (above). */
static int dfa_row(dfa_build *b, eng_regex *re, int32_t s, const uint8_t *rep, uint8_t *cut)
{
    const re_nfa *m = b->m;
    int32_t nc = re->n_classes;
    memset(cut, 0, (size_t)nc + 1);
    /* the set's byte states, compactly */
    int32_t n = b->set_len[s], n_bytes = 0;
    {
        const int32_t *set = b->set_at[s];
        for (int32_t i = 0; i < n; i++) {
            const nfa_state *st = &m->s[set[i]];
            if (st->kind == NS_BYTE) {
                cut[re->class_of[st->lo]] = 1;
                cut[re->class_of[st->hi] + 1] = 1;
                b->byte_lo[n_bytes] = st->lo;
                b->byte_hi[n_bytes] = st->hi;
                b->byte_out[n_bytes++] = st->out;
            }
        }
    }
    re_state_id *row = eng__rx_rows_at(&b->rows, s);
    if (!row)
        return SW_ENOMEM;
    if (++b->memo_gen == 0) {
        memset(b->memo, 0, b->memo_slots * sizeof *b->memo);
        b->memo_gen = 1;
    }
    size_t n_memo_seeds = 0;
    int32_t t = ENG_REGEX_DEAD;
    long closure_work = 0;
    for (int32_t c = 0; c < nc; c++) {
        b->work += n;
        if (c == 0 || cut[c]) {
            /* the list is built where the memo would keep it */
            if (n_memo_seeds + (size_t)n_bytes > b->cap_memo_seeds &&
                b->cap_memo_seeds < RE_SEED_MEMO_MAX) {
                size_t cap = b->cap_memo_seeds * 2;
                while (cap < n_memo_seeds + (size_t)n_bytes)
                    cap *= 2;
                if (cap > RE_SEED_MEMO_MAX)
                    cap = RE_SEED_MEMO_MAX;
                int32_t *kept = sw_realloc(b->memo_seeds, cap * sizeof *kept);
                if (!kept)
                    return SW_ENOMEM;
                b->memo_seeds = kept;
                b->cap_memo_seeds = cap;
            }
            bool memo_room = n_memo_seeds + (size_t)n_bytes <= b->cap_memo_seeds;
            int32_t *seed = memo_room ? b->memo_seeds + n_memo_seeds : b->seed;
            int32_t n_seed = 0;
            uint8_t r = rep[c];
            for (int32_t i = 0; i < n_bytes; i++)
                if (b->byte_lo[i] <= r && r <= b->byte_hi[i])
                    seed[n_seed++] = b->byte_out[i];
            t = ENG_REGEX_DEAD;
            closure_work = 0;
            if (n_seed) {
                uint32_t hash = seeds_hash(seed, n_seed);
                seed_memo *e = seeds_find(b, seed, n_seed, hash);
                if (e->gen == b->memo_gen) {
                    t = e->state;
                    closure_work = e->work;
                    b->work += closure_work;
                } else {
                    long before = b->work;
                    closure(b, seed, n_seed, false);
                    closure_work = b->work - before;
                    t = b->n_tmp ? dfa_state(b, re, false) : ENG_REGEX_DEAD;
                    if (b->rc)
                        return b->rc;
                    if (memo_room) {
                        *e = (seed_memo){hash, n_seed, n_memo_seeds, t, closure_work,
                                         b->memo_gen};
                        n_memo_seeds += (size_t)n_seed;
                    }
                }
            }
        } else {
            b->work += closure_work; /* what the same closure counted */
        }
        row[c] = (re_state_id)t;
        if (b->work > RE_WORK_MAX)
            return SW_ERANGE;
    }
    return SW_OK;
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
    b.memo_slots = 8;
    while (b.memo_slots < 2 * (uint32_t)nc)
        b.memo_slots *= 2;
    b.memo = sw_calloc(b.memo_slots, sizeof *b.memo);
    /* The scratch of m->n entries each, in one block (one allocation, not
     * nine: under ASan each is filled and poisoned on its own); mark and
     * kept start at generation 0. */
    size_t n = (size_t)m->n;
    b.scratch = sw_malloc(n * (7 * sizeof(int32_t) + 2));
    if (b.scratch) {
        b.mark = b.scratch;
        b.kept = (uint32_t *)b.scratch + n;
        memset(b.scratch, 0, 2 * n * sizeof(uint32_t));
        b.stack = (int32_t *)b.scratch + 2 * n;
        b.eol = (int32_t *)b.scratch + 3 * n;
        b.tmp = (int32_t *)b.scratch + 4 * n;
        b.seed = (int32_t *)b.scratch + 5 * n;
        b.byte_out = (int32_t *)b.scratch + 6 * n;
        b.byte_lo = (uint8_t *)((int32_t *)b.scratch + 7 * n);
        b.byte_hi = b.byte_lo + n;
    }
    b.cap_memo_seeds = n < RE_SEED_MEMO_MAX ? n : RE_SEED_MEMO_MAX;
    b.memo_seeds = sw_malloc(b.cap_memo_seeds * sizeof *b.memo_seeds);
    b.cap_htab = 64;
    b.htab = sw_malloc(b.cap_htab * sizeof *b.htab);
    /* allocated up front: a state's set may be empty (a lookahead whose ^
     * is read after the start), and pointer arithmetic on NULL is not C */
    int pool_rc = pool_chunk(&b, 0);
    eng__rx_rows_init(&b.rows, nc);
    if (!b.scratch || !b.memo || !b.memo_seeds || !b.htab || pool_rc) {
        rc = SW_ENOMEM;
        goto done;
    }
    memset(b.htab, 0xFF, b.cap_htab * sizeof *b.htab);
    re->start = -1;
    closure(&b, &head, 1, at_start);
    re->start = dfa_state(&b, re, at_start);
    if (re->start < 0) {
        rc = b.rc;
        goto done;
    }
    for (int32_t s = 0; s < re->n_states && !rc; s++)
        rc = dfa_row(&b, re, s, rep, cut);
    if (!rc)
        rc = eng__rx_rows_join(&b.rows, re->n_states, &re->trans);
    if (!rc)
        rc = eng__rx_dfa_finish(re);
done:
    sw_free(b.scratch);
    sw_free(b.memo);
    sw_free(b.memo_seeds);
    for (int32_t i = 0; i < b.n_chunks; i++)
        sw_free(b.chunks[i]);
    sw_free(b.chunks);
    sw_free(b.set_at);
    sw_free(b.set_len);
    sw_free(b.set_hash);
    sw_free(b.htab);
    eng__rx_rows_free(&b.rows);
    return rc;
}
