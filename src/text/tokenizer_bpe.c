/* tokenizer_bpe.c - GPT-2 style byte-level BPE ("gpt2" in
 * tokenizer.ggml.model): Llama 3, Qwen2, GPT-2, gpt-oss (o200k) and their
 * relatives.
 *
 * tokenizer.c loads the vocabulary, cuts the text at special tokens and
 * calls eng__bpe_tokenize for every plain fragment; this file does the rest:
 *   1. Pre-tokenization: the fragment is decoded into code points and split
 *      by a hand-written matcher equivalent to the regular expression that
 *      tokenizer.ggml.pre names (no regex library; see the pre_* functions
 *      for each expression). Letters, numbers and white space come from
 *      Unicode tables generated once (unicode_tables.c).
 *   2. Each pre-token's bytes are mapped to GPT-2's byte alphabet (printable
 *      bytes stand for themselves, the other 68 for U+0100.. in order), so
 *      every piece is printable text and every single byte is a token.
 *   3. The adjacent pair of symbols with the lowest merge rank (its index in
 *      tokenizer.ggml.merges) is merged, repeatedly; ties go to the leftmost
 *      pair. A binary heap with lazy invalidation keeps a long word
 *      O(n log n). Llama 3 ("llama-bpe") first looks the whole pre-token up
 *      in the vocabulary (Hugging Face's ignore_merges), as its reference
 *      does.
 *   4. The final symbols become ids. A symbol that is not in the vocabulary
 *      (only possible with an inconsistent merges list) is emitted
 *      character by character, each the token of its byte; a byte without a
 *      token becomes the unknown token, or SW_EUNSUPPORTED without one.
 *
 * Invalid UTF-8 never fails: each byte that does not start a valid sequence
 * is a code point of its own with no letter/number/space category, and the
 * byte mapping carries it through unchanged, so the ids still stand for the
 * exact input bytes.
 */
#include "text/tokenizer-impl.h"

#include "common/alloc.h"
#include "text/unicode_tables.h"

#include <stdio.h>
#include <string.h>

typedef enum bpe_pre {
    BPE_PRE_GPT2 = 0,  /* "default", "gpt2", "gpt-2" */
    BPE_PRE_LLAMA3,    /* "llama-bpe" */
    BPE_PRE_QWEN2,     /* "qwen2" */
    BPE_PRE_GPT4O,     /* "gpt-4o" (o200k: gpt-oss) */
} bpe_pre;

static const struct {
    const char *name;
    bpe_pre pre;
} bpe_pre_names[] = {
    {"default", BPE_PRE_GPT2},
    {"gpt2", BPE_PRE_GPT2},
    {"gpt-2", BPE_PRE_GPT2},
    {"llama-bpe", BPE_PRE_LLAMA3},
    {"qwen2", BPE_PRE_QWEN2},
    {"gpt-4o", BPE_PRE_GPT4O},
};

#define BPE_MAX_MERGES ((uint64_t)1 << 24)
#define BPE_MAX_MERGE_BYTES ((uint64_t)1 << 16)

struct eng__bpe {
    bpe_pre pre;
    bool ignore_merges;    /* whole pre-token in the vocabulary wins */

    char *merge_blob;      /* the "left right" strings, back to back */
    uint64_t *merge_off;   /* (n_merges) offset in merge_blob */
    uint32_t *merge_len;   /* (n_merges) bytes of "left right" */
    uint32_t *merge_left;  /* (n_merges) bytes of "left" */
    uint32_t n_merges;
    uint32_t *merge_slots; /* open addressing: rank + 1, 0 for empty */
    size_t merge_mask;

    uint16_t byte_to_cp[256];  /* GPT-2 byte alphabet */
    int16_t cp_to_byte[0x144]; /* inverse for cp < U+0144, else -1 */
    int32_t byte_token[256];   /* id of each byte's one-character piece */
};

/* ---- the byte alphabet -------------------------------------------------- */

static bool byte_is_printable(int b)
{
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

static void build_byte_map(eng__bpe *bpe)
{
    int next = 0x100;
    for (size_t i = 0; i < sizeof bpe->cp_to_byte / sizeof bpe->cp_to_byte[0]; i++)
        bpe->cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int cp = byte_is_printable(b) ? b : next++;
        bpe->byte_to_cp[b] = (uint16_t)cp;
        bpe->cp_to_byte[cp] = (int16_t)b;
    }
}

/* UTF-8 of a code point below U+0800; returns the length (1 or 2). */
static size_t encode_small_cp(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* The inverse map needs no tokenizer: it is the same for every vocabulary,
 * so it is computed from the ranges (no shared table to initialise). */
int eng__bpe_unmap_char(const char *s, size_t n, size_t *i)
{
    uint8_t c = (uint8_t)s[*i];
    uint32_t cp;
    if (c < 0x80) {
        cp = c;
        if (!byte_is_printable((int)cp))
            return -1;
        *i += 1;
        return (int)cp;
    }
    if ((c & 0xE0) != 0xC0 || *i + 1 >= n || ((uint8_t)s[*i + 1] & 0xC0) != 0x80)
        return -1;
    cp = ((uint32_t)(c & 0x1F) << 6) | ((uint8_t)s[*i + 1] & 0x3F);
    if (cp < 0x80)
        return -1; /* overlong */
    int b;
    if (cp < 0x100) {
        if (!byte_is_printable((int)cp))
            return -1;
        b = (int)cp;
    } else {
        /* The n-th non-printable byte maps to U+0100 + n; those bytes are
         * 0x00..0x20 (33), 0x7F..0xA0 (34) and 0xAD, in that order. */
        uint32_t k = cp - 0x100;
        if (k < 33)
            b = (int)k;
        else if (k < 67)
            b = 0x7F + (int)(k - 33);
        else if (k == 67)
            b = 0xAD;
        else
            return -1;
    }
    *i += 2;
    return b;
}

/* ---- merges ------------------------------------------------------------- */

/* FNV-1a over "left right" with a final avalanche; the same value whether
 * computed from a stored merge string or from two adjacent symbols. */
static uint64_t hash_pair(const char *l, size_t ln, const char *r, size_t rn)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < ln; i++) {
        h ^= (uint8_t)l[i];
        h *= 0x100000001b3ull;
    }
    h ^= (uint8_t)' ';
    h *= 0x100000001b3ull;
    for (size_t i = 0; i < rn; i++) {
        h ^= (uint8_t)r[i];
        h *= 0x100000001b3ull;
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

static bool merge_equals(const eng__bpe *bpe, uint32_t rank, const char *l, size_t ln,
                         const char *r, size_t rn)
{
    const char *m = bpe->merge_blob + bpe->merge_off[rank];
    return bpe->merge_left[rank] == ln && bpe->merge_len[rank] == ln + 1 + rn &&
           memcmp(m, l, ln) == 0 && memcmp(m + ln + 1, r, rn) == 0;
}

/* Rank of merging l and r, or -1. */
static int64_t merge_rank(const eng__bpe *bpe, const char *l, size_t ln, const char *r,
                          size_t rn)
{
    size_t slot = (size_t)hash_pair(l, ln, r, rn) & bpe->merge_mask;
    for (;;) {
        uint32_t v = bpe->merge_slots[slot];
        if (v == 0)
            return -1;
        if (merge_equals(bpe, v - 1, l, ln, r, rn))
            return (int64_t)(v - 1);
        slot = (slot + 1) & bpe->merge_mask;
    }
}

/* Inserts a rank unless the same pair is already there: a duplicate merge
 * keeps its first (lowest) rank. */
static void merge_insert(eng__bpe *bpe, uint32_t rank)
{
    const char *m = bpe->merge_blob + bpe->merge_off[rank];
    size_t ln = bpe->merge_left[rank], rn = bpe->merge_len[rank] - ln - 1;
    size_t slot = (size_t)hash_pair(m, ln, m + ln + 1, rn) & bpe->merge_mask;
    for (;;) {
        uint32_t v = bpe->merge_slots[slot];
        if (v == 0) {
            bpe->merge_slots[slot] = rank + 1;
            return;
        }
        if (merge_equals(bpe, v - 1, m, ln, m + ln + 1, rn))
            return;
        slot = (slot + 1) & bpe->merge_mask;
    }
}

static int load_merges(const eng_gguf *g, eng__bpe *bpe, sw_error *err)
{
    static const char key[] = "tokenizer.ggml.merges";
    eng_gguf_value_type et;
    uint64_t n;
    uint64_t blob_bytes = 0;
    int64_t kv = eng_gguf_find_key(g, key);

    if (kv < 0)
        return sw_error_set(err, SW_EFORMAT, "vocabulary: %s is missing (a \"gpt2\" BPE "
                            "vocabulary needs its merges)", key);
    if (eng_gguf_kv_type(g, kv) != ENG_GGUF_ARRAY ||
        eng_gguf_get_arr(g, key, &et, &n, NULL) != SW_OK || et != ENG_GGUF_STRING)
        return sw_error_set(err, SW_EFORMAT, "vocabulary: %s is not an array of strings", key);
    if (n > BPE_MAX_MERGES)
        return sw_error_set(err, SW_EFORMAT, "vocabulary: %s has %llu entries (limit %llu)",
                            key, (unsigned long long)n, (unsigned long long)BPE_MAX_MERGES);

    bpe->n_merges = (uint32_t)n;
    bpe->merge_off = sw_calloc(n ? n : 1, sizeof *bpe->merge_off);
    bpe->merge_len = sw_calloc(n ? n : 1, sizeof *bpe->merge_len);
    bpe->merge_left = sw_calloc(n ? n : 1, sizeof *bpe->merge_left);
    if (!bpe->merge_off || !bpe->merge_len || !bpe->merge_left)
        return SW_ENOMEM;
    for (uint64_t i = 0; i < n; i++) {
        const char *s, *space;
        size_t len;
        if (eng_gguf_arr_str(g, kv, i, &s, &len) != SW_OK)
            return sw_error_set(err, SW_EFORMAT, "vocabulary: merge %llu is unreadable",
                                (unsigned long long)i);
        if (len > BPE_MAX_MERGE_BYTES)
            return sw_error_set(err, SW_EFORMAT, "vocabulary: merge %llu is %zu bytes long",
                                (unsigned long long)i, len);
        /* "left right": the separator is the first space after the first
         * byte (a byte-level piece never holds a literal space). */
        space = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
        if (!space || (size_t)(space - s) + 1 >= len)
            return sw_error_set(err, SW_EFORMAT, "vocabulary: merge %llu (\"%.*s\") is not "
                                "two pieces separated by a space", (unsigned long long)i,
                                (int)(len > 40 ? 40 : len), s);
        bpe->merge_off[i] = blob_bytes;
        bpe->merge_len[i] = (uint32_t)len;
        bpe->merge_left[i] = (uint32_t)(space - s);
        blob_bytes += len; /* bounded: 2^24 merges of at most 2^16 bytes */
    }
    bpe->merge_blob = sw_malloc(blob_bytes ? blob_bytes : 1);
    if (!bpe->merge_blob)
        return SW_ENOMEM;
    for (uint64_t i = 0; i < n; i++) {
        const char *s;
        size_t len;
        eng_gguf_arr_str(g, kv, i, &s, &len);
        memcpy(bpe->merge_blob + bpe->merge_off[i], s, len);
    }

    size_t slots = 16;
    while (slots < 2 * (size_t)n)
        slots *= 2;
    bpe->merge_slots = sw_calloc(slots, sizeof *bpe->merge_slots);
    if (!bpe->merge_slots)
        return SW_ENOMEM;
    bpe->merge_mask = slots - 1;
    for (uint32_t r = 0; r < bpe->n_merges; r++)
        merge_insert(bpe, r);
    return SW_OK;
}

int eng__bpe_load(const eng_gguf *g, eng_tokenizer *tok, bool add_bos_key_present,
                  sw_error *err)
{
    eng__bpe *bpe;
    const char *pre_name;
    size_t pre_len;
    int rc;

    bpe = sw_calloc(1, sizeof *bpe);
    if (!bpe)
        return sw_error_set(err, SW_ENOMEM, "out of memory loading the vocabulary");
    tok->bpe = bpe; /* freed with the tokenizer, also on failure */

    /* A missing tokenizer.ggml.pre means the GPT-2 expression: older
     * converters wrote none, and llama.cpp treats it as "default" too. */
    rc = eng_gguf_get_str(g, "tokenizer.ggml.pre", &pre_name, &pre_len, NULL);
    if (rc == SW_ENOTFOUND) {
        pre_name = "default";
        pre_len = strlen(pre_name);
    } else if (rc) {
        return sw_error_set(err, SW_EFORMAT, "vocabulary: tokenizer.ggml.pre is not a string");
    }
    bool known = false;
    for (size_t i = 0; i < sizeof bpe_pre_names / sizeof bpe_pre_names[0]; i++) {
        if (strlen(bpe_pre_names[i].name) == pre_len &&
            memcmp(bpe_pre_names[i].name, pre_name, pre_len) == 0) {
            bpe->pre = bpe_pre_names[i].pre;
            known = true;
            break;
        }
    }
    if (!known)
        return sw_error_set(err, SW_EUNSUPPORTED,
                            "BPE pre-tokenizer \"%.*s\" (tokenizer.ggml.pre) is not supported "
                            "(supported: \"default\", \"gpt2\", \"gpt-2\", \"llama-bpe\", "
                            "\"qwen2\", \"gpt-4o\")",
                            (int)(pre_len > 64 ? 64 : pre_len), pre_name);
    bpe->ignore_merges = bpe->pre == BPE_PRE_LLAMA3;

    /* Llama 3 prepends <|begin_of_text|>; Qwen2 and GPT-2 add nothing. The
     * file's tokenizer.ggml.add_bos_token, when present, was applied by
     * the vocabulary loader and wins. */
    if (!add_bos_key_present)
        tok->add_bos = bpe->pre == BPE_PRE_LLAMA3 && tok->bos >= 0;

    rc = load_merges(g, bpe, err);
    if (rc == SW_ENOMEM)
        return sw_error_set(err, rc, "out of memory loading the BPE merges");
    if (rc)
        return rc;

    build_byte_map(bpe);
    for (int b = 0; b < 256; b++) {
        char piece[2];
        size_t n = encode_small_cp(bpe->byte_to_cp[b], piece);
        int32_t id = eng_token_find(tok, piece, n);
        bpe->byte_token[b] = id >= 0 ? id : tok->unk;
    }
    return SW_OK;
}

void eng__bpe_free(eng__bpe *bpe)
{
    if (!bpe)
        return;
    sw_free(bpe->merge_blob);
    sw_free(bpe->merge_off);
    sw_free(bpe->merge_len);
    sw_free(bpe->merge_left);
    sw_free(bpe->merge_slots);
    sw_free(bpe);
}

/* ---- Unicode classes ---------------------------------------------------- */

enum {
    CP_LETTER = 1,
    CP_NUMBER = 2,
    CP_SPACE = 4,   /* White_Space */
    CP_NEWLINE = 8, /* \r or \n (also CP_SPACE) */
};

static bool in_ranges(const eng_unicode_range *r, size_t n, uint32_t cp)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < r[mid].first)
            hi = mid;
        else if (cp > r[mid].last)
            lo = mid + 1;
        else
            return true;
    }
    return false;
}

/* Unicode's White_Space property (PropList.txt): a short, stable list. */
static bool is_white_space(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

static uint8_t classify(uint32_t cp)
{
    if (cp < 0x80) {
        if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z'))
            return CP_LETTER;
        if (cp >= '0' && cp <= '9')
            return CP_NUMBER;
        if (cp == '\r' || cp == '\n')
            return CP_SPACE | CP_NEWLINE;
        return is_white_space(cp) ? CP_SPACE : 0;
    }
    if (is_white_space(cp))
        return CP_SPACE;
    if (in_ranges(eng_unicode_letters, eng_unicode_letters_count, cp))
        return CP_LETTER;
    if (in_ranges(eng_unicode_numbers, eng_unicode_numbers_count, cp))
        return CP_NUMBER;
    return 0;
}

/* Decodes the code point at s[0..n) (n >= 1) by RFC 3629; an invalid or
 * truncated sequence yields U+FFFD for its first byte alone (*len 1). */
static uint32_t decode_cp(const uint8_t *s, size_t n, size_t *len)
{
    uint8_t c = s[0];
    size_t need;
    uint32_t cp;
    *len = 1;
    if (c < 0x80)
        return c;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 2;
        cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        cp = c & 0x07;
    } else {
        return 0xFFFD;
    }
    if (need > n)
        return 0xFFFD;
    for (size_t k = 1; k < need; k++) {
        uint8_t lo = 0x80, hi = 0xBF;
        if (k == 1) {
            if (c == 0xE0)
                lo = 0xA0;
            else if (c == 0xED)
                hi = 0x9F;
            else if (c == 0xF0)
                lo = 0x90;
            else if (c == 0xF4)
                hi = 0x8F;
        }
        if (s[k] < lo || s[k] > hi)
            return 0xFFFD;
        cp = (cp << 6) | (s[k] & 0x3F);
    }
    *len = need;
    return cp;
}

/* ---- per-call scratch --------------------------------------------------- */

typedef struct bpe_symbol {
    int32_t start; /* byte offset in the mapped word */
    int32_t n;     /* bytes; 0 once merged into its left neighbour */
    int32_t prev, next;
} bpe_symbol;

typedef struct bpe_pair {
    int64_t rank;
    int32_t left, right;
    int32_t left_n, right_n; /* sizes when queued: stale if either changed */
} bpe_pair;

struct eng__bpe_work {
    uint32_t *cps;    /* (n) code points of the fragment */
    uint8_t *cls;     /* (n) CP_* classes */
    uint32_t *offs;   /* (n + 1) byte offset of each code point */
    size_t cps_cap;
    char *mapped;     /* a pre-token in the byte alphabet (2 bytes per byte) */
    size_t mapped_cap;
    bpe_symbol *symbols;
    size_t symbols_cap;
    bpe_pair *heap;
    size_t heap_n, heap_cap;
};

void eng__bpe_work_free(eng__bpe_work *w)
{
    if (!w)
        return;
    sw_free(w->cps);
    sw_free(w->cls);
    sw_free(w->offs);
    sw_free(w->mapped);
    sw_free(w->symbols);
    sw_free(w->heap);
    sw_free(w);
}

/* Grows *p to hold n elements of size elem (never shrinks). */
static int grow(void **p, size_t *cap, size_t n, size_t elem)
{
    if (n <= *cap)
        return SW_OK;
    if (n > SIZE_MAX / elem)
        return SW_ENOMEM;
    void *grown = sw_realloc(*p, n * elem);
    if (!grown)
        return SW_ENOMEM;
    *p = grown;
    *cap = n;
    return SW_OK;
}

/* ---- the heap of candidate merges --------------------------------------- */

/* Lower rank first; on equal ranks the leftmost pair. */
static bool pair_before(const bpe_pair *a, const bpe_pair *b)
{
    if (a->rank != b->rank)
        return a->rank < b->rank;
    return a->left < b->left;
}

static int heap_push(eng__bpe_work *w, bpe_pair p)
{
    if (w->heap_n == w->heap_cap) {
        size_t cap = w->heap_cap ? w->heap_cap * 2 : 64;
        bpe_pair *grown = sw_realloc(w->heap, cap * sizeof *grown);
        if (!grown)
            return SW_ENOMEM;
        w->heap = grown;
        w->heap_cap = cap;
    }
    size_t i = w->heap_n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!pair_before(&p, &w->heap[parent]))
            break;
        w->heap[i] = w->heap[parent];
        i = parent;
    }
    w->heap[i] = p;
    return SW_OK;
}

static bpe_pair heap_pop(eng__bpe_work *w)
{
    bpe_pair top = w->heap[0];
    bpe_pair last = w->heap[--w->heap_n];
    size_t i = 0;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= w->heap_n)
            break;
        if (child + 1 < w->heap_n && pair_before(&w->heap[child + 1], &w->heap[child]))
            child++;
        if (!pair_before(&w->heap[child], &last))
            break;
        w->heap[i] = w->heap[child];
        i = child;
    }
    if (w->heap_n > 0)
        w->heap[i] = last;
    return top;
}

static int try_pair(const eng__bpe *bpe, eng__bpe_work *w, int32_t left, int32_t right)
{
    if (left < 0 || right < 0)
        return SW_OK;
    const bpe_symbol *l = &w->symbols[left], *r = &w->symbols[right];
    int64_t rank = merge_rank(bpe, w->mapped + l->start, (size_t)l->n, w->mapped + r->start,
                              (size_t)r->n);
    if (rank < 0)
        return SW_OK;
    bpe_pair p = {rank, left, right, l->n, r->n};
    return heap_push(w, p);
}

/* ---- BPE on one pre-token ----------------------------------------------- */

static int push_byte_tokens(const eng_tokenizer *tok, const char *mapped, size_t n,
                            eng__ids *out)
{
    const eng__bpe *bpe = tok->bpe;
    for (size_t i = 0; i < n;) {
        int b = eng__bpe_unmap_char(mapped, n, &i);
        if (b < 0)
            return SW_EINTERNAL; /* the mapped word holds only byte symbols */
        int32_t id = bpe->byte_token[b];
        if (id < 0)
            return SW_EUNSUPPORTED;
        if (eng__ids_push(out, id))
            return SW_ENOMEM;
    }
    return SW_OK;
}

static int bpe_word(const eng_tokenizer *tok, eng__bpe_work *w, const uint8_t *bytes,
                    size_t len, eng__ids *out)
{
    const eng__bpe *bpe = tok->bpe;
    size_t n_mapped = 0;
    int rc;

    if (len == 0)
        return SW_OK;
    /* len <= 2^28 (the tokenizer's input limit), so 2 * len fits int32. */
    if (grow((void **)&w->mapped, &w->mapped_cap, 2 * len, 1) ||
        grow((void **)&w->symbols, &w->symbols_cap, len, sizeof *w->symbols))
        return SW_ENOMEM;
    for (size_t i = 0; i < len; i++) {
        bpe_symbol *s = &w->symbols[i];
        s->start = (int32_t)n_mapped;
        n_mapped += encode_small_cp(bpe->byte_to_cp[bytes[i]], w->mapped + n_mapped);
        s->n = (int32_t)n_mapped - s->start;
        s->prev = (int32_t)i - 1;
        s->next = i + 1 == len ? -1 : (int32_t)i + 1;
    }

    if (bpe->ignore_merges) {
        int32_t id = eng_token_find(tok, w->mapped, n_mapped);
        if (id >= 0)
            return eng__ids_push(out, id);
    }

    w->heap_n = 0;
    for (size_t i = 1; i < len; i++)
        if ((rc = try_pair(bpe, w, (int32_t)i - 1, (int32_t)i)))
            return rc;
    while (w->heap_n > 0) {
        bpe_pair p = heap_pop(w);
        bpe_symbol *l = &w->symbols[p.left], *r = &w->symbols[p.right];
        if (l->n != p.left_n || r->n != p.right_n || l->next != p.right)
            continue; /* stale: a side was merged away or grew */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            w->symbols[r->next].prev = p.left;
        rc = try_pair(bpe, w, l->prev, p.left);
        if (!rc)
            rc = try_pair(bpe, w, p.left, l->next);
        if (rc)
            return rc;
    }

    for (int32_t i = 0; i >= 0; i = w->symbols[i].next) {
        const bpe_symbol *s = &w->symbols[i];
        int32_t id = eng_token_find(tok, w->mapped + s->start, (size_t)s->n);
        if (id >= 0)
            rc = eng__ids_push(out, id);
        else
            rc = push_byte_tokens(tok, w->mapped + s->start, (size_t)s->n, out);
        if (rc)
            return rc;
    }
    return SW_OK;
}

/* ---- pre-tokenizers ----------------------------------------------------- */

/* Each returns the length in code points (>= 1) of the pre-token that
 * starts at code point i of cls/cps[0..n): the leftmost alternative of the
 * expression that matches, with the expression's greedy quantifiers and
 * backtracking worked out by hand. */

static size_t run_of(const uint8_t *cls, size_t n, size_t i, uint8_t want)
{
    while (i < n && (cls[i] & want))
        i++;
    return i;
}

static bool is_other(uint8_t c) { return (c & (CP_LETTER | CP_NUMBER | CP_SPACE)) == 0; }

static uint32_t ascii_lower(uint32_t cp)
{
    return cp >= 'A' && cp <= 'Z' ? cp + 32 : cp;
}

/* 's|'t|'re|'ve|'m|'ll|'d at i, ASCII case-insensitive when asked; returns
 * the length or 0. */
static size_t match_contraction(const uint32_t *cps, size_t n, size_t i, bool fold)
{
    if (cps[i] != '\'' || i + 1 >= n)
        return 0;
    uint32_t a = fold ? ascii_lower(cps[i + 1]) : cps[i + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
        return 2;
    if (i + 2 >= n)
        return 0;
    uint32_t b = fold ? ascii_lower(cps[i + 2]) : cps[i + 2];
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        return 3;
    return 0;
}

/* \s+(?!\S)|\s+ at i (cls[i] is a space): the whole run when it reaches the
 * end or is one character long, else the run minus its last space, which
 * then leads the next pre-token. */
static size_t match_spaces(const uint8_t *cls, size_t n, size_t i)
{
    size_t e = run_of(cls, n, i, CP_SPACE);
    if (e == n || e - i == 1)
        return e - i;
    return e - 1 - i;
}

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|
 *        \s+(?!\S)|\s+ */
static size_t pre_gpt2(const uint32_t *cps, const uint8_t *cls, size_t n, size_t i)
{
    size_t m = match_contraction(cps, n, i, false);
    if (m)
        return m;
    size_t start = cps[i] == ' ' && i + 1 < n ? i + 1 : i;
    if (cls[start] & CP_LETTER)
        return run_of(cls, n, start, CP_LETTER) - i;
    if (cls[start] & CP_NUMBER)
        return run_of(cls, n, start, CP_NUMBER) - i;
    if (is_other(cls[start])) {
        size_t e = start;
        while (e < n && is_other(cls[e]))
            e++;
        return e - i;
    }
    /* Only a space can be left here: start == i + 1 was a space too, or
     * start == i. */
    return match_spaces(cls, n, i);
}

/* Llama 3 (max_digits 3) and Qwen2 (max_digits 1):
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max}|
 *   ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static size_t pre_llama3(const uint32_t *cps, const uint8_t *cls, size_t n, size_t i,
                         size_t max_digits)
{
    size_t m = match_contraction(cps, n, i, true);
    if (m)
        return m;
    uint8_t c = cls[i];
    if (!(c & (CP_NEWLINE | CP_LETTER | CP_NUMBER)) && i + 1 < n && (cls[i + 1] & CP_LETTER))
        return run_of(cls, n, i + 1, CP_LETTER) - i;
    if (c & CP_LETTER)
        return run_of(cls, n, i, CP_LETTER) - i;
    if (c & CP_NUMBER) {
        size_t e = i;
        while (e < n && e - i < max_digits && (cls[e] & CP_NUMBER))
            e++;
        return e - i;
    }
    size_t start = cps[i] == ' ' && i + 1 < n && is_other(cls[i + 1]) ? i + 1 : i;
    if (is_other(cls[start])) {
        size_t e = start;
        while (e < n && is_other(cls[e]))
            e++;
        return run_of(cls, n, e, CP_NEWLINE) - i;
    }
    /* A space. \s*[\r\n]+: up to the last newline of the run of spaces. */
    size_t e = run_of(cls, n, i, CP_SPACE);
    for (size_t k = e; k > i; k--)
        if (cls[k - 1] & CP_NEWLINE)
            return k - i;
    return match_spaces(cls, n, i);
}

/* gpt-4o's letters from s: the first two alternatives of the expression
 * below, A1 = U* L+ C? and A2 = U+ L* C?, where U is a letter other than
 * a-z, L a letter other than A-Z (a letter outside ASCII is both) and C a
 * contraction, any ASCII case. Returns the end, or 0 when neither matches
 * (s is not a letter). A1 tries the longest U* first: when the letter
 * after it is an L (a-z), L+ runs on from there; otherwise U* gives back
 * letters until one it gave back is an L (a non-ASCII letter), which is
 * then L+ alone (the letters after it are A-Z). A2 is left for a run of
 * A-Z only. */
static size_t gpt4o_letters(const uint32_t *cps, const uint8_t *cls, size_t n, size_t s)
{
#define U_AT(k) ((cls[k] & CP_LETTER) && !(cps[k] >= 'a' && cps[k] <= 'z'))
#define L_AT(k) ((cls[k] & CP_LETTER) && !(cps[k] >= 'A' && cps[k] <= 'Z'))
    size_t u = s, end = 0;
    while (u < n && U_AT(u))
        u++;
    if (u < n && L_AT(u)) {
        end = u;
        while (end < n && L_AT(end))
            end++;
    } else {
        for (size_t k = u; k > s && !end; k--)
            if (L_AT(k - 1))
                end = k;
        if (!end && u > s) /* A2: the U+ run; no L follows it */
            end = u;
    }
#undef U_AT
#undef L_AT
    if (!end)
        return 0;
    return end < n ? end + match_contraction(cps, n, end, true) : end;
}

/* gpt-4o (o200k, gpt-oss's), as llama.cpp runs it - its form of the
 * expression, where "upper" and "lower" letters are told apart by ASCII
 * case only (a letter outside ASCII counts as both):
 *   [^\r\n\p{L}\p{N}]?U*L+C?|[^\r\n\p{L}\p{N}]?U+L*C?|\p{N}{1,3}|
 *    ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * (U, L, C as gpt4o_letters says). */
static size_t pre_gpt4o(const uint32_t *cps, const uint8_t *cls, size_t n, size_t i)
{
    uint8_t c = cls[i];
    if (!(c & (CP_NEWLINE | CP_LETTER | CP_NUMBER)) && i + 1 < n && (cls[i + 1] & CP_LETTER))
        return gpt4o_letters(cps, cls, n, i + 1) - i;
    if (c & CP_LETTER)
        return gpt4o_letters(cps, cls, n, i) - i;
    if (c & CP_NUMBER) {
        size_t e = i;
        while (e < n && e - i < 3 && (cls[e] & CP_NUMBER))
            e++;
        return e - i;
    }
    size_t start = cps[i] == ' ' && i + 1 < n && is_other(cls[i + 1]) ? i + 1 : i;
    if (is_other(cls[start])) {
        size_t e = start;
        while (e < n && is_other(cls[e]))
            e++;
        while (e < n && (cps[e] == '\r' || cps[e] == '\n' || cps[e] == '/'))
            e++;
        return e - i;
    }
    /* A space. \s*[\r\n]+: up to the last newline of the run of spaces. */
    size_t e = run_of(cls, n, i, CP_SPACE);
    for (size_t k = e; k > i; k--)
        if (cls[k - 1] & CP_NEWLINE)
            return k - i;
    return match_spaces(cls, n, i);
}

int eng__bpe_tokenize(const eng_tokenizer *tok, eng__bpe_work **work, const char *text,
                      size_t len, eng__ids *out)
{
    const eng__bpe *bpe = tok->bpe;
    const uint8_t *bytes = (const uint8_t *)text;
    eng__bpe_work *w = *work;
    size_t n = 0;
    int rc;

    if (len == 0)
        return SW_OK;
    if (!w) {
        w = sw_calloc(1, sizeof *w);
        if (!w)
            return SW_ENOMEM;
        *work = w;
    }
    if (len + 1 > w->cps_cap) {
        /* Three arrays of the same capacity, grown together. */
        size_t cap = w->cps_cap;
        size_t cap2 = w->cps_cap;
        size_t cap3 = w->cps_cap;
        if (grow((void **)&w->cps, &cap, len + 1, sizeof *w->cps) ||
            grow((void **)&w->cls, &cap2, len + 1, sizeof *w->cls) ||
            grow((void **)&w->offs, &cap3, len + 1, sizeof *w->offs))
            return SW_ENOMEM;
        w->cps_cap = len + 1;
    }
    for (size_t off = 0; off < len;) {
        size_t cl;
        uint32_t cp = decode_cp(bytes + off, len - off, &cl);
        w->cps[n] = cp;
        /* An invalid byte is U+FFFD's class: none (a symbol). */
        w->cls[n] = classify(cp);
        w->offs[n] = (uint32_t)off;
        n++;
        off += cl;
    }
    w->offs[n] = (uint32_t)len;

    for (size_t i = 0; i < n;) {
        size_t m;
        switch (bpe->pre) {
        case BPE_PRE_LLAMA3:
            m = pre_llama3(w->cps, w->cls, n, i, 3);
            break;
        case BPE_PRE_QWEN2:
            m = pre_llama3(w->cps, w->cls, n, i, 1);
            break;
        case BPE_PRE_GPT4O:
            m = pre_gpt4o(w->cps, w->cls, n, i);
            break;
        default:
            m = pre_gpt2(w->cps, w->cls, n, i);
            break;
        }
        rc = bpe_word(tok, w, bytes + w->offs[i], w->offs[i + m] - w->offs[i], out);
        if (rc)
            return rc;
        i += m;
    }
    return SW_OK;
}
