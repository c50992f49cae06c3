/* regex_costs.c - the least cost of completing a match from each DFA state
 * under a bound on the characters still to come (eng_regex_costs_*).
 */
#include "grammar/regex-impl.h"

#include "common/alloc.h"

#include <string.h>

/* ---- completion costs under a length bound ----------------------------- */

struct eng_regex_costs {
    int32_t n_states, levels;
    int32_t min_chars, max_chars;
    bool unbounded;
    int32_t *cell; /* n_states * levels: least cost, or INT32_MAX */
};

void eng_regex_costs_free(eng_regex_costs *t)
{
    if (!t)
        return;
    sw_free(t->cell);
    sw_free(t);
}

int64_t eng_regex_costs_get(const eng_regex_costs *t, int32_t state, int64_t chars)
{
    if (state < 0 || chars < 0 || chars > t->max_chars)
        return -1;
    int64_t lvl = t->unbounded && chars > t->min_chars ? t->min_chars : chars;
    int32_t v = t->cell[(size_t)state * (size_t)t->levels + (size_t)lvl];
    return v == INT32_MAX ? -1 : v;
}

static int32_t cost_add(int32_t a, int32_t b)
{
    if (a == INT32_MAX || b == INT32_MAX)
        return INT32_MAX;
    int64_t s = (int64_t)a + b;
    return s >= INT32_MAX ? INT32_MAX - 1 : (int32_t)s;
}

/* One level (chars = lvl) of the table when every lead byte goes to level
 * lvl_next (a row of the table, or NULL: no more characters allowed), the
 * continuations staying at this level. Boundary states first, then the
 * states by pending bytes (1, 2, 3), each depending only on the ones
 * before. */
static void costs_level(const eng_regex *re, const int32_t *class_cost, const uint8_t *lead,
                        int32_t *row, const int32_t *row_next, bool accept_here, int32_t levels)
{
    int32_t nc = re->n_classes;
    for (int p = 0; p <= 3; p++) {
        for (int32_t s = 0; s < re->n_states; s++) {
            if (re->pend[s] != p)
                continue;
            int32_t best = accept_here && re->accept[s] ? 0 : INT32_MAX;
            for (int32_t c = 0; c < nc; c++) {
                int32_t t = re->trans[(size_t)s * (size_t)nc + (size_t)c];
                if (t < 0)
                    continue;
                int32_t v;
                if (lead[c])
                    v = row_next ? row_next[(size_t)t * (size_t)levels] : INT32_MAX;
                else
                    v = row[(size_t)t * (size_t)levels];
                v = cost_add(v, class_cost[c]);
                if (v < best)
                    best = v;
            }
            row[(size_t)s * (size_t)levels] = best;
        }
    }
}

/* A binary min-heap of states by dist, with each state's place in it
 * (pos, -1 when out), so that a shorter distance moves a state up. */
typedef struct cost_heap {
    int32_t *item, *pos;
    const int32_t *dist;
    int32_t n;
} cost_heap;

static void heap_up(cost_heap *h, int32_t i)
{
    int32_t x = h->item[i];
    while (i > 0) {
        int32_t parent = (i - 1) / 2;
        if (h->dist[h->item[parent]] <= h->dist[x])
            break;
        h->item[i] = h->item[parent];
        h->pos[h->item[i]] = i;
        i = parent;
    }
    h->item[i] = x;
    h->pos[x] = i;
}

static int32_t heap_pop(cost_heap *h)
{
    int32_t top = h->item[0], x = h->item[--h->n], i = 0;
    h->pos[top] = -1;
    if (h->n == 0)
        return top;
    for (;;) {
        int32_t kid = 2 * i + 1;
        if (kid >= h->n)
            break;
        if (kid + 1 < h->n && h->dist[h->item[kid + 1]] < h->dist[h->item[kid]])
            kid++;
        if (h->dist[h->item[kid]] >= h->dist[x])
            break;
        h->item[i] = h->item[kid];
        h->pos[h->item[i]] = i;
        i = kid;
    }
    h->item[i] = x;
    h->pos[x] = i;
    return top;
}

/* The level where the length no longer matters (unbounded, chars >=
 * min_chars): shortest paths to acceptance, Dijkstra over the reversed
 * edges (the distances do not depend on the order ties are taken in).
 * One reversed edge per (state, successor) pair, at the least cost of
 * the classes between them: a row has few distinct successors, and the
 * distances are those over every class's edge. */
static int costs_free_level(const eng_regex *re, const int32_t *class_cost, int32_t *row,
                            int32_t levels)
{
    int32_t ns = re->n_states, nc = re->n_classes;
    int32_t *start = sw_calloc((size_t)ns + 1, sizeof *start);
    int32_t *stamp = sw_malloc(((size_t)ns + 1) * sizeof *stamp);
    int32_t *slot = sw_malloc(((size_t)ns + 1) * sizeof *slot);
    int32_t *dist = sw_malloc(((size_t)ns + 1) * sizeof *dist);
    int32_t *item = sw_malloc(((size_t)ns + 1) * sizeof *item);
    int32_t *pos = sw_malloc(((size_t)ns + 1) * sizeof *pos);
    int32_t *from = NULL, *cost = NULL;
    int rc = SW_OK;
    if (!start || !stamp || !slot || !dist || !item || !pos) {
        rc = SW_ENOMEM;
        goto out;
    }
    memset(stamp, 0xFF, (size_t)ns * sizeof *stamp);
    for (int32_t s = 0; s < ns; s++)
        for (int32_t c = 0; c < nc; c++) {
            int32_t t = re->trans[(size_t)s * (size_t)nc + (size_t)c];
            if (t >= 0 && stamp[t] != s) {
                stamp[t] = s;
                start[t + 1]++;
            }
        }
    for (int32_t i = 0; i < ns; i++)
        start[i + 1] += start[i];
    from = sw_malloc(((size_t)start[ns] + 1) * sizeof *from);
    cost = sw_malloc(((size_t)start[ns] + 1) * sizeof *cost);
    if (!from || !cost) {
        rc = SW_ENOMEM;
        goto out;
    }
    for (int32_t i = 0; i < ns; i++)
        dist[i] = start[i]; /* a fill cursor for now */
    memset(stamp, 0xFF, (size_t)ns * sizeof *stamp);
    for (int32_t s = 0; s < ns; s++)
        for (int32_t c = 0; c < nc; c++) {
            int32_t t = re->trans[(size_t)s * (size_t)nc + (size_t)c];
            if (t < 0)
                continue;
            if (stamp[t] != s) {
                stamp[t] = s;
                slot[t] = dist[t]++;
                from[slot[t]] = s;
                cost[slot[t]] = class_cost[c];
            } else if (class_cost[c] < cost[slot[t]]) {
                cost[slot[t]] = class_cost[c];
            }
        }
    cost_heap h = {item, pos, dist, 0};
    for (int32_t i = 0; i < ns; i++) {
        dist[i] = re->accept[i] ? 0 : INT32_MAX;
        pos[i] = -1;
        if (re->accept[i]) {
            item[h.n] = i;
            pos[i] = h.n++;
        }
    }
    /* pos >= 0: in the heap; -2: done */
    while (h.n > 0) {
        int32_t u = heap_pop(&h);
        pos[u] = -2;
        for (int32_t k = start[u]; k < start[u + 1]; k++) {
            int32_t w = from[k];
            int32_t v = cost_add(dist[u], cost[k]);
            if (pos[w] == -2 || v >= dist[w])
                continue;
            dist[w] = v;
            if (pos[w] < 0) {
                item[h.n] = w;
                pos[w] = h.n++;
            }
            heap_up(&h, pos[w]);
        }
    }
    for (int32_t i = 0; i < ns; i++)
        row[(size_t)i * (size_t)levels] = dist[i];
out:
    sw_free(start);
    sw_free(stamp);
    sw_free(slot);
    sw_free(from);
    sw_free(cost);
    sw_free(dist);
    sw_free(item);
    sw_free(pos);
    return rc;
}

int eng_regex_costs_build(const eng_regex *re, const uint8_t byte_cost[256], int32_t min_chars,
                          int32_t max_chars, eng_regex_costs **out, sw_error *err)
{
    *out = NULL;
    if (min_chars < 0 || max_chars < min_chars)
        return sw_error_set(err, SW_EINVAL, "pattern: length bounds out of order");
    bool unbounded = max_chars == INT32_MAX;
    int64_t levels = (int64_t)(unbounded ? min_chars : max_chars) + 1;
    if (levels * re->n_states > ENG_REGEX_MAX_COST_CELLS)
        return sw_error_set(err, SW_ERANGE,
                            "pattern with length bounds too large (%d automaton states x %lld "
                            "lengths)",
                            (int)re->n_states, (long long)levels);
    eng_regex_costs *t = sw_calloc(1, sizeof *t);
    int32_t *class_cost = sw_malloc((size_t)re->n_classes * sizeof *class_cost);
    uint8_t *lead = sw_calloc((size_t)re->n_classes, 1);
    int rc = SW_OK;
    if (!t || !class_cost || !lead ||
        !(t->cell = sw_malloc((size_t)levels * (size_t)re->n_states * sizeof *t->cell))) {
        rc = sw_error_set(err, SW_ENOMEM, "pattern: out of memory");
        goto fail;
    }
    t->n_states = re->n_states;
    t->levels = (int32_t)levels;
    t->min_chars = min_chars;
    t->max_chars = max_chars;
    t->unbounded = unbounded;
    for (int32_t c = 0; c < re->n_classes; c++)
        class_cost[c] = INT32_MAX;
    for (int b = 0; b < 256; b++) {
        int32_t c = re->class_of[b];
        if (byte_cost[b] < class_cost[c])
            class_cost[c] = byte_cost[b];
        lead[c] = eng__rx_utf8_role((uint8_t)b) >= 0;
    }
    int32_t top = t->levels - 1;
    if (unbounded) {
        if ((rc = costs_free_level(re, class_cost, t->cell + top, t->levels))) {
            sw_error_set(err, rc, "pattern: out of memory");
            goto fail;
        }
    } else {
        costs_level(re, class_cost, lead, t->cell + top, NULL, top >= min_chars, t->levels);
    }
    for (int32_t lvl = top - 1; lvl >= 0; lvl--)
        costs_level(re, class_cost, lead, t->cell + lvl, t->cell + lvl + 1, lvl >= min_chars,
                    t->levels);
    sw_free(class_cost);
    sw_free(lead);
    *out = t;
    return SW_OK;
fail:
    sw_free(class_cost);
    sw_free(lead);
    eng_regex_costs_free(t);
    return rc;
}
