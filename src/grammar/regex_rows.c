/* regex_rows.c - the storage of an automaton while it is built (the
 * subset construction, regex_dfa.c, and the product, regex_intersect.c):
 * its transition rows in blocks, joined into the one table of n_states *
 * n_classes entries once the states are known, and its per-state flags
 * grown with the states.
 *
 * Why blocks: the number of states is known only at the end, and growing
 * one table by doubling copies it again and again and leaves it up to
 * twice too large; under ASan (the fuzz build) every large block is a
 * fresh mapping whose pages fault in, and that was the largest part of a
 * compile's time. Blocks (4 rows, then doubling up to RE_ROWS_BLOCK_BYTES)
 * stay small, the joined table is allocated once at its size.
 */
#include "grammar/regex-impl.h"

#include "common/alloc.h"

#include <string.h>

#define RE_ROWS_BLOCK_BYTES 16384

void eng__rx_rows_init(re_rows *r, int32_t n_classes)
{
    memset(r, 0, sizeof *r);
    r->n_classes = n_classes;
    int32_t per = RE_ROWS_BLOCK_BYTES / (n_classes * (int32_t)sizeof(re_state_id));
    r->max_rows = per > 0 ? per : 1;
}

re_state_id *eng__rx_rows_at(re_rows *r, int32_t state)
{
    /* rows are asked for in order: state is in the last block or starts
     * the next one */
    if (state >= r->end) {
        if (r->n_block == r->cap_block) {
            int32_t cap = r->cap_block ? r->cap_block * 2 : 8;
            re_state_id **block = sw_realloc(r->block, (size_t)cap * sizeof *block);
            int32_t *first = block ? sw_realloc(r->first, (size_t)cap * sizeof *first) : NULL;
            if (block)
                r->block = block;
            if (!first)
                return NULL;
            r->first = first;
            r->cap_block = cap;
        }
        /* 4 rows first, then twice the rows of the block before, up to
         * max_rows: a small automaton allocates little */
        int32_t rows = r->n_block ? 2 * (r->end - r->first[r->n_block - 1]) : 4;
        if (rows > r->max_rows)
            rows = r->max_rows;
        size_t bytes = (size_t)rows * (size_t)r->n_classes * sizeof(re_state_id);
        if (!(r->block[r->n_block] = sw_malloc(bytes)))
            return NULL;
        r->first[r->n_block++] = r->end;
        r->end += rows;
    }
    int32_t b = r->n_block - 1;
    return r->block[b] + (size_t)(state - r->first[b]) * (size_t)r->n_classes;
}

int eng__rx_rows_join(re_rows *r, int32_t n_states, re_state_id **out)
{
    size_t row = (size_t)r->n_classes, cells = (size_t)n_states * row;
    re_state_id *t = sw_malloc((cells ? cells : 1) * sizeof *t);
    if (!t)
        return SW_ENOMEM;
    for (int32_t b = 0; b < r->n_block && r->first[b] < n_states; b++) {
        int32_t end = b + 1 < r->n_block ? r->first[b + 1] : r->end;
        if (end > n_states)
            end = n_states;
        memcpy(t + (size_t)r->first[b] * row, r->block[b],
               (size_t)(end - r->first[b]) * row * sizeof *t);
    }
    *out = t;
    eng__rx_rows_free(r);
    return SW_OK;
}

void eng__rx_rows_free(re_rows *r)
{
    for (int32_t i = 0; i < r->n_block; i++)
        sw_free(r->block[i]);
    sw_free(r->block);
    sw_free(r->first);
    r->block = NULL;
    r->first = NULL;
    r->n_block = r->cap_block = 0;
    r->end = 0;
}

int eng__rx_flags_reserve(eng_regex *re, int32_t *cap, int32_t n_states)
{
    if (n_states <= *cap)
        return SW_OK;
    int32_t c = *cap ? *cap : 64;
    while (c < n_states)
        c *= 2;
    uint8_t *accept = sw_realloc(re->accept, (size_t)c);
    if (!accept)
        return SW_ENOMEM;
    re->accept = accept;
    uint8_t *universal = sw_realloc(re->universal, (size_t)c);
    if (!universal)
        return SW_ENOMEM;
    re->universal = universal;
    *cap = c;
    return SW_OK;
}
