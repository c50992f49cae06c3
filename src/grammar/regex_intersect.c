/* regex_intersect.c - the product of two compiled patterns
 * (eng_regex_intersect) and a deep copy of one (eng_regex_clone).
 */
#include "grammar/regex-impl.h"

#include "common/alloc.h"

#include <string.h>

/* ---- intersection ------------------------------------------------------- */

/* Room for n_states product states: their pairs and flags, grown by
 * doubling rather than sized to ENG_REGEX_MAX_STATES up front. */
static int states_reserve(eng_regex *re, int32_t *cap, int32_t **pair_a, int32_t **pair_b,
                          int32_t n_states)
{
    if (n_states <= *cap)
        return SW_OK;
    int32_t c = *cap;
    if (eng__rx_flags_reserve(re, &c, n_states))
        return SW_ENOMEM;
    int32_t *a = sw_realloc(*pair_a, (size_t)c * sizeof *a);
    if (!a)
        return SW_ENOMEM;
    *pair_a = a;
    int32_t *b = sw_realloc(*pair_b, (size_t)c * sizeof *b);
    if (!b)
        return SW_ENOMEM;
    *pair_b = b;
    *cap = c;
    return SW_OK;
}

int eng_regex_intersect(const eng_regex *a, const eng_regex *b, eng_regex **out, sw_error *err)
{
    *out = NULL;
    eng_regex *re = sw_calloc(1, sizeof *re);
    /* each product state's pair; cap_states of them, grown with re's flags */
    int32_t *pair_a = NULL, *pair_b = NULL;
    int32_t cap_states = 0;
    re_rows rows;
    /* at most twice as many slots as there can be pairs: a small pattern
     * beside a format does not clear the largest table */
    int64_t max_pairs = (int64_t)a->n_states * b->n_states;
    uint32_t cap_htab = 64;
    while (cap_htab < RE_HTAB && cap_htab < 2 * max_pairs)
        cap_htab *= 2;
    uint32_t mask = cap_htab - 1;
    int32_t *htab = sw_malloc(cap_htab * sizeof *htab);
    int rc = SW_OK;
    eng__rx_rows_init(&rows, 1);
    if (!re || !htab) {
        rc = sw_error_set(err, SW_ENOMEM, "pattern: out of memory");
        goto fail;
    }
    /* Classes: bytes that both automata treat alike, numbered in the
     * order of their first bytes. A class of each is a run of bytes, so a
     * pair of classes is one too: a byte starts a new class where either
     * automaton's class changes. */
    uint8_t rep[256];
    int32_t nc = 0;
    for (int x = 0; x < 256; x++) {
        if (x == 0 || a->class_of[x] != a->class_of[x - 1] ||
            b->class_of[x] != b->class_of[x - 1])
            rep[nc++] = (uint8_t)x;
        re->class_of[x] = (uint8_t)(nc - 1);
    }
    re->n_classes = nc;
    eng__rx_rows_init(&rows, nc);
    if (states_reserve(re, &cap_states, &pair_a, &pair_b, 1)) {
        rc = sw_error_set(err, SW_ENOMEM, "pattern: out of memory");
        goto fail;
    }
    memset(htab, 0xFF, cap_htab * sizeof *htab);
    int32_t nb = b->n_states;
    /* Start; then breadth first, adding pairs as they are reached. */
    pair_a[0] = a->start;
    pair_b[0] = b->start;
    re->n_states = 1;
    re->start = 0;
    htab[((uint32_t)a->start * (uint32_t)nb + (uint32_t)b->start) * 2654435761u & mask] = 0;
    for (int32_t s = 0; s < re->n_states; s++) {
        re->accept[s] = a->accept[pair_a[s]] && b->accept[pair_b[s]];
        re->universal[s] = a->universal[pair_a[s]] && b->universal[pair_b[s]];
        re_state_id *row = eng__rx_rows_at(&rows, s);
        if (!row) {
            rc = sw_error_set(err, SW_ENOMEM, "pattern: out of memory");
            goto fail;
        }
        for (int32_t c = 0; c < nc; c++) {
            int32_t ta = eng_regex_step(a, pair_a[s], rep[c]);
            int32_t tb = ta < 0 ? -1 : eng_regex_step(b, pair_b[s], rep[c]);
            int32_t t = ENG_REGEX_DEAD;
            if (ta >= 0 && tb >= 0) {
                uint32_t key = (uint32_t)ta * (uint32_t)nb + (uint32_t)tb;
                uint32_t h = key * 2654435761u & mask;
                for (;; h = (h + 1) & mask) {
                    int32_t id = htab[h];
                    if (id < 0 || (pair_a[id] == ta && pair_b[id] == tb))
                        break;
                }
                if (htab[h] >= 0) {
                    t = htab[h];
                } else {
                    if (re->n_states >= ENG_REGEX_MAX_STATES) {
                        rc = sw_error_set(err, SW_ERANGE,
                                          "pattern and format together too large (their "
                                          "automaton passes %d states)",
                                          ENG_REGEX_MAX_STATES);
                        goto fail;
                    }
                    if (states_reserve(re, &cap_states, &pair_a, &pair_b, re->n_states + 1)) {
                        rc = sw_error_set(err, SW_ENOMEM, "pattern: out of memory");
                        goto fail;
                    }
                    t = re->n_states++;
                    pair_a[t] = ta;
                    pair_b[t] = tb;
                    htab[h] = t;
                }
            }
            row[c] = (re_state_id)t;
        }
    }
    if ((rc = eng__rx_rows_join(&rows, re->n_states, &re->trans)) ||
        (rc = eng__rx_dfa_finish(re))) {
        sw_error_set(err, rc, "pattern: out of memory");
        goto fail;
    }
    sw_free(pair_a);
    sw_free(pair_b);
    sw_free(htab);
    *out = re;
    return SW_OK;
fail:
    sw_free(pair_a);
    sw_free(pair_b);
    sw_free(htab);
    eng__rx_rows_free(&rows);
    eng_regex_free(re);
    return rc;
}

int eng_regex_clone(const eng_regex *re, eng_regex **out, sw_error *err)
{
    size_t ns = (size_t)re->n_states, cells = ns * (size_t)re->n_classes;
    eng_regex *c = sw_calloc(1, sizeof *c);
    *out = NULL;
    if (!c || !(c->trans = sw_malloc((cells ? cells : 1) * sizeof *c->trans)) ||
        !(c->accept = sw_malloc(ns ? ns : 1)) || !(c->live = sw_malloc(ns ? ns : 1)) ||
        !(c->pend = sw_malloc(ns ? ns : 1)) || !(c->universal = sw_malloc(ns ? ns : 1))) {
        eng_regex_free(c);
        return sw_error_set(err, SW_ENOMEM, "pattern: out of memory");
    }
    c->n_states = re->n_states;
    c->n_classes = re->n_classes;
    c->start = re->start;
    memcpy(c->class_of, re->class_of, sizeof c->class_of);
    memcpy(c->trans, re->trans, cells * sizeof *c->trans);
    memcpy(c->accept, re->accept, ns);
    memcpy(c->live, re->live, ns);
    memcpy(c->pend, re->pend, ns);
    memcpy(c->universal, re->universal, ns);
    *out = c;
    return SW_OK;
}
