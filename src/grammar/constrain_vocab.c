/* constrain_vocab.c - the vocabulary index of constrained decoding: each
 * token's bytes, the plain tokens (ordinary string characters) and the
 * byte tries the masks walk (constrain-state.h, constrain.h).
 */
#include "grammar/constrain.h"

#include "common/alloc.h"
#include "grammar/constrain-impl.h"
#include "grammar/constrain-state.h"

#include <stdlib.h>
#include <string.h>

/* Length of the UTF-8 character starting with lead byte c and the range
 * of its first continuation byte (RFC 3629: no overlong forms, no
 * surrogates, nothing above U+10FFFF); 0 for a byte that cannot lead. */
int eng__cs_utf8_lead(uint8_t c, uint8_t *lo, uint8_t *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        return 1;
    if (c == 0xE0) {
        *lo = 0xA0;
        return 2;
    }
    if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF)
        return 2;
    if (c == 0xED) {
        *hi = 0x9F;
        return 2;
    }
    if (c == 0xF0) {
        *lo = 0x90;
        return 3;
    }
    if (c >= 0xF1 && c <= 0xF3)
        return 3;
    if (c == 0xF4) {
        *hi = 0x8F;
        return 3;
    }
    return 0;
}

/* Code points of a token made only of characters a JSON string may hold
 * unescaped (no '"', '\\', control bytes) in whole UTF-8 characters; -1
 * otherwise. */
static int32_t plain_chars(const uint8_t *p, int32_t n)
{
    int32_t chars = 0;
    for (int32_t i = 0; i < n;) {
        uint8_t c = p[i], lo, hi;
        if (c < 0x20 || c == '"' || c == '\\')
            return -1;
        chars++;
        if (c < 0x80) {
            i++;
            continue;
        }
        int k = eng__cs_utf8_lead(c, &lo, &hi);
        if (k == 0 || i + k >= n || p[i + 1] < lo || p[i + 1] > hi)
            return -1;
        for (int j = 2; j <= k; j++)
            if (p[i + j] < 0x80 || p[i + j] > 0xBF)
                return -1;
        i += k + 1;
    }
    return chars;
}

typedef struct cs_sort_item {
    const uint8_t *p;
    int32_t len;
    int32_t id;
} cs_sort_item;

static int cs_sort_cmp(const void *pa, const void *pb)
{
    const cs_sort_item *a = pa, *b = pb;
    int32_t n = a->len < b->len ? a->len : b->len;
    int c = memcmp(a->p, b->p, (size_t)n);
    if (c)
        return c;
    if (a->len != b->len)
        return a->len < b->len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static void trie_free(cs_trie *t)
{
    sw_free(t->nodes);
    sw_free(t->ids);
    memset(t, 0, sizeof *t);
}

/* Builds a trie of the given items (sorted here). */
static int trie_build(cs_trie *t, cs_sort_item *items, int32_t n, int32_t max_len)
{
    size_t cap = 1;
    for (int32_t i = 0; i < n; i++)
        cap += (size_t)items[i].len;
    memset(t, 0, sizeof *t);
    t->nodes = sw_calloc(cap, sizeof *t->nodes);
    t->ids = sw_malloc((size_t)(n ? n : 1) * sizeof *t->ids);
    uint32_t *path = sw_calloc((size_t)max_len + 2, sizeof *path);
    if (!t->nodes || !t->ids || !path) {
        sw_free(path);
        trie_free(t);
        return SW_ENOMEM;
    }
    qsort(items, (size_t)n, sizeof *items, cs_sort_cmp);
    t->n_nodes = 1; /* the root */
    path[0] = 0;
    const cs_sort_item *prev = NULL;
    for (int32_t i = 0; i < n; i++) {
        const cs_sort_item *it = &items[i];
        int32_t lcp = 0;
        if (prev) {
            int32_t m = prev->len < it->len ? prev->len : it->len;
            while (lcp < m && prev->p[lcp] == it->p[lcp])
                lcp++;
        }
        for (int32_t d = lcp; d < it->len; d++) {
            uint32_t node = t->n_nodes++;
            t->nodes[node].byte = it->p[d];
            /* Sorted input: a new child goes after the children made so
             * far, the last of which is on the previous string's path. */
            if (d == lcp && prev && prev->len > d)
                t->nodes[path[d + 1]].next = node;
            else
                t->nodes[path[d]].first_child = node;
            path[d + 1] = node;
        }
        cs_tnode *end = &t->nodes[path[it->len]];
        if (end->tok_count == 0)
            end->tok_begin = (uint32_t)i;
        end->tok_count++;
        t->ids[i] = it->id;
        prev = it;
    }
    sw_free(path);
    /* Shared prefixes left part of the worst-case allocation unused. */
    cs_tnode *fit = sw_realloc(t->nodes, (size_t)t->n_nodes * sizeof *fit);
    if (fit)
        t->nodes = fit;
    return SW_OK;
}

/* Fills flat->nodes from *next on with the subtree of linked node `node`
 * (itself excluded: its children at `depth`), in depth-first order, and
 * counts the tokens into *tok. Recursion is bounded by the longest token. */
static void trie_flatten_below(const cs_trie *t, uint32_t node, uint16_t depth,
                               cs_flat_trie *flat, uint32_t *next, uint32_t *tok)
{
    for (uint32_t ch = t->nodes[node].first_child; ch; ch = t->nodes[ch].next) {
        const cs_tnode *tn = &t->nodes[ch];
        uint32_t at = (*next)++;
        flat->nodes[at].byte = tn->byte;
        flat->nodes[at].depth = depth;
        flat->nodes[at].tok_off = *tok;
        for (uint32_t k = 0; k < tn->tok_count; k++)
            flat->ids[(*tok)++] = t->ids[tn->tok_begin + k];
        trie_flatten_below(t, ch, (uint16_t)(depth + 1), flat, next, tok);
        flat->nodes[at].skip = *next;
    }
}

/* The flat copy of a linked trie (cs_flat_trie) holding n_ids tokens. */
static int trie_flatten(const cs_trie *t, int32_t n_ids, cs_flat_trie *flat)
{
    memset(flat, 0, sizeof *flat);
    flat->n_nodes = t->n_nodes - 1; /* the root is not stored */
    flat->nodes = sw_calloc((size_t)flat->n_nodes + 1, sizeof *flat->nodes);
    flat->ids = sw_calloc((size_t)n_ids + 1, sizeof *flat->ids); /* + 1: list_build */
    if (!flat->nodes || !flat->ids)
        return SW_ENOMEM;
    uint32_t next = 0, tok = 0;
    trie_flatten_below(t, 0, 1, flat, &next, &tok);
    flat->nodes[flat->n_nodes].tok_off = tok;
    flat->nodes[flat->n_nodes].skip = flat->n_nodes;
    return SW_OK;
}

static void flat_trie_free(cs_flat_trie *t)
{
    sw_free(t->nodes);
    sw_free(t->ids);
    memset(t, 0, sizeof *t);
}

void eng_cs_vocab_free(eng_cs_vocab *v)
{
    if (!v)
        return;
    sw_free(v->blob);
    sw_free(v->off);
    sw_free(v->len);
    sw_free(v->is_end);
    sw_free(v->end_ids);
    sw_free(v->plain_ids);
    sw_free(v->plain_chars);
    sw_free(v->plain_bits);
    sw_free(v->byte_plain_off);
    sw_free(v->byte_plain);
    sw_free(v->plain_upto);
    sw_free(v->by_chars);
    sw_free(v->by_chars_off);
    trie_free(&v->full);
    trie_free(&v->special);
    flat_trie_free(&v->plain);
    if (v->pool_ready)
        pthread_mutex_destroy(&v->pool_lock);
    for (int32_t i = 0; i < v->n_pool; i++)
        eng__cs_slots_free(v->pool[i]);
    sw_free(v);
}

int32_t eng_cs_vocab_n_tokens(const eng_cs_vocab *v)
{
    return v->n_tokens;
}

/* For each byte value, the plain tokens (indices into plain_ids) that hold
 * it as a character's first byte: two passes, counting then filling. */
static int plain_byte_index(eng_cs_vocab *v)
{
    int32_t *last = sw_malloc(256 * sizeof *last);
    v->byte_plain_off = sw_calloc(257, sizeof *v->byte_plain_off);
    if (!last || !v->byte_plain_off) {
        sw_free(last);
        return SW_ENOMEM;
    }
    for (int pass = 0; pass < 2; pass++) {
        for (int b = 0; b < 256; b++)
            last[b] = -1;
        int32_t *at = NULL;
        if (pass) {
            at = sw_malloc(256 * sizeof *at);
            v->byte_plain = sw_malloc(((size_t)v->byte_plain_off[256] + 1) * sizeof *v->byte_plain);
            if (!at || !v->byte_plain) {
                sw_free(at);
                sw_free(last);
                return SW_ENOMEM;
            }
            memcpy(at, v->byte_plain_off, 256 * sizeof *at);
        }
        for (int32_t i = 0; i < v->n_plain; i++) {
            int32_t id = v->plain_ids[i];
            const uint8_t *p = (const uint8_t *)v->blob + v->off[id];
            for (int32_t k = 0; k < v->len[id]; k++) {
                if ((p[k] & 0xC0) == 0x80 || last[p[k]] == i)
                    continue;
                last[p[k]] = i;
                if (pass)
                    v->byte_plain[at[p[k]]++] = i;
                else
                    v->byte_plain_off[p[k] + 1]++;
            }
        }
        if (!pass)
            for (int b = 0; b < 256; b++)
                v->byte_plain_off[b + 1] += v->byte_plain_off[b];
        sw_free(at);
    }
    sw_free(last);
    return SW_OK;
}

/* The plain tokens by code points (eng_cs_vocab.plain_upto, by_chars):
 * a counting sort by code points, then the masks of the short ones. */
static int plain_chars_index(eng_cs_vocab *v)
{
    size_t words = ((size_t)v->n_tokens + 31) / 32;
    int32_t n_counts = v->max_plain_chars + 2;
    v->by_chars_off = sw_calloc((size_t)n_counts, sizeof *v->by_chars_off);
    v->by_chars = sw_malloc(((size_t)v->n_plain + 1) * sizeof *v->by_chars);
    v->plain_upto = sw_calloc(CS_UPTO_MASKS * words, sizeof *v->plain_upto);
    int32_t *at = sw_malloc((size_t)n_counts * sizeof *at);
    if (!v->by_chars_off || !v->by_chars || !v->plain_upto || !at) {
        sw_free(at);
        return SW_ENOMEM;
    }
    for (int32_t i = 0; i < v->n_plain; i++)
        v->by_chars_off[v->plain_chars[i] + 1]++;
    for (int32_t k = 1; k < n_counts; k++)
        v->by_chars_off[k] += v->by_chars_off[k - 1];
    memcpy(at, v->by_chars_off, (size_t)n_counts * sizeof *at);
    for (int32_t i = 0; i < v->n_plain; i++)
        v->by_chars[at[v->plain_chars[i]]++] = i;
    sw_free(at);
    for (int32_t k = 0; k < CS_UPTO_MASKS; k++) {
        uint32_t *m = v->plain_upto + (size_t)k * words;
        int32_t end = v->by_chars_off[k + 1 < n_counts ? k + 1 : n_counts - 1];
        for (int32_t j = 0; j < end; j++) {
            int32_t id = v->plain_ids[v->by_chars[j]];
            m[id >> 5] |= 1u << (id & 31);
        }
        v->plain_upto_n[k] = end;
    }
    return SW_OK;
}

/* The shared part of both constructors: v->blob/off/len/is_end are set. */
static int vocab_finish(eng_cs_vocab *v, sw_error *err)
{
    int32_t n = v->n_tokens, n_special = 0;
    if (pthread_mutex_init(&v->pool_lock, NULL))
        return sw_error_set(err, SW_ENOMEM, "out of resources indexing the vocabulary");
    v->pool_ready = true;
    cs_sort_item *all = sw_malloc((size_t)(n ? n : 1) * sizeof *all);
    cs_sort_item *spec = sw_malloc((size_t)(n ? n : 1) * sizeof *spec);
    cs_sort_item *plain = sw_malloc((size_t)(n ? n : 1) * sizeof *plain);
    v->plain_ids = sw_malloc((size_t)(n ? n : 1) * sizeof *v->plain_ids);
    v->plain_chars = sw_malloc((size_t)(n ? n : 1) * sizeof *v->plain_chars);
    v->plain_bits = sw_calloc(((size_t)n + 31) / 32 + 1, sizeof *v->plain_bits);
    int32_t n_all = 0;
    int rc = SW_OK;
    if (!all || !spec || !plain || !v->plain_ids || !v->plain_chars || !v->plain_bits) {
        rc = sw_error_set(err, SW_ENOMEM, "out of memory indexing the vocabulary");
        goto done;
    }
    for (int32_t id = 0; id < n; id++) {
        if (v->len[id] <= 0)
            continue;
        const uint8_t *p = (const uint8_t *)v->blob + v->off[id];
        all[n_all++] = (cs_sort_item){p, v->len[id], id};
        if (v->len[id] > v->max_len)
            v->max_len = v->len[id];
        int32_t chars = plain_chars(p, v->len[id]);
        if (chars >= 0) {
            plain[v->n_plain] = (cs_sort_item){p, v->len[id], id};
            v->plain_ids[v->n_plain] = id;
            v->plain_chars[v->n_plain++] = chars;
            v->plain_bits[id >> 5] |= 1u << (id & 31);
            if (chars > v->max_plain_chars)
                v->max_plain_chars = chars;
        } else {
            spec[n_special++] = (cs_sort_item){p, v->len[id], id};
        }
    }
    cs_trie linked_plain = {0};
    if (trie_build(&v->full, all, n_all, v->max_len) ||
        trie_build(&v->special, spec, n_special, v->max_len) ||
        trie_build(&linked_plain, plain, v->n_plain, v->max_len) ||
        trie_flatten(&linked_plain, v->n_plain, &v->plain) || plain_byte_index(v) ||
        plain_chars_index(v))
        rc = sw_error_set(err, SW_ENOMEM, "out of memory indexing the vocabulary");
    trie_free(&linked_plain);
done:
    sw_free(all);
    sw_free(spec);
    sw_free(plain);
    return rc;
}

int eng_cs_vocab_create(const eng_tokenizer *tok, eng_cs_vocab **out, sw_error *err)
{
    int32_t n = eng_tokenizer_n_vocab(tok);
    eng_cs_vocab *v = sw_calloc(1, sizeof *v);
    size_t total = 0;
    int rc;
    if (!v)
        return sw_error_set(err, SW_ENOMEM, "out of memory indexing the vocabulary");
    v->n_tokens = n;
    v->off = sw_calloc((size_t)n, sizeof *v->off);
    v->len = sw_calloc((size_t)n, sizeof *v->len);
    v->is_end = sw_calloc((size_t)n, sizeof *v->is_end);
    v->end_ids = sw_calloc((size_t)n, sizeof *v->end_ids);
    if (!v->off || !v->len || !v->is_end || !v->end_ids) {
        rc = sw_error_set(err, SW_ENOMEM, "out of memory indexing the vocabulary");
        goto fail;
    }
    for (int32_t id = 0; id < n; id++) {
        eng_token_type t = eng_token_get_type(tok, id);
        if (eng_tokenizer_is_eog(tok, id)) {
            v->is_end[id] = 1;
            v->end_ids[v->n_end++] = id;
        }
        if (t == ENG_TOKEN_CONTROL || t == ENG_TOKEN_UNKNOWN || t == ENG_TOKEN_UNUSED ||
            v->is_end[id])
            continue;
        size_t len = eng_token_to_bytes(tok, id, NULL, 0);
        if (len > ENG_CS_MAX_TOKEN_BYTES)
            continue; /* no real token is this long; never allowed */
        v->off[id] = total;
        v->len[id] = (int32_t)len;
        total += len;
    }
    v->blob = sw_malloc(total ? total : 1);
    if (!v->blob) {
        rc = sw_error_set(err, SW_ENOMEM, "out of memory indexing the vocabulary");
        goto fail;
    }
    for (int32_t id = 0; id < n; id++)
        if (v->len[id] > 0)
            eng_token_to_bytes(tok, id, v->blob + v->off[id], (size_t)v->len[id]);
    if ((rc = vocab_finish(v, err)))
        goto fail;
    *out = v;
    return SW_OK;
fail:
    eng_cs_vocab_free(v);
    return rc;
}

int eng_cs_vocab_create_from_pieces(const char *const *pieces, const size_t *lens, int32_t n,
                                    const int32_t *end_ids, int32_t n_end, eng_cs_vocab **out,
                                    sw_error *err)
{
    eng_cs_vocab *v = sw_calloc(1, sizeof *v);
    size_t total = 0;
    int rc;
    if (!v || n <= 0)
        return v ? (sw_free(v), sw_error_set(err, SW_EINVAL, "an empty vocabulary"))
                 : sw_error_set(err, SW_ENOMEM, "out of memory indexing the vocabulary");
    v->n_tokens = n;
    v->off = sw_calloc((size_t)n, sizeof *v->off);
    v->len = sw_calloc((size_t)n, sizeof *v->len);
    v->is_end = sw_calloc((size_t)n, sizeof *v->is_end);
    v->end_ids = sw_calloc((size_t)n, sizeof *v->end_ids);
    if (!v->off || !v->len || !v->is_end || !v->end_ids) {
        rc = sw_error_set(err, SW_ENOMEM, "out of memory indexing the vocabulary");
        goto fail;
    }
    for (int32_t i = 0; i < n_end; i++) {
        if (end_ids[i] < 0 || end_ids[i] >= n || v->is_end[end_ids[i]])
            continue;
        v->is_end[end_ids[i]] = 1;
        v->end_ids[v->n_end++] = end_ids[i];
    }
    for (int32_t id = 0; id < n; id++) {
        if (!pieces[id] || lens[id] == 0 || lens[id] > ENG_CS_MAX_TOKEN_BYTES || v->is_end[id])
            continue;
        v->off[id] = total;
        v->len[id] = (int32_t)lens[id];
        total += lens[id];
    }
    v->blob = sw_malloc(total ? total : 1);
    if (!v->blob) {
        rc = sw_error_set(err, SW_ENOMEM, "out of memory indexing the vocabulary");
        goto fail;
    }
    for (int32_t id = 0; id < n; id++)
        if (v->len[id] > 0)
            memcpy(v->blob + v->off[id], pieces[id], (size_t)v->len[id]);
    if ((rc = vocab_finish(v, err)))
        goto fail;
    *out = v;
    return SW_OK;
fail:
    eng_cs_vocab_free(v);
    return rc;
}
