/* fuzzlib.h - what several fuzz harnesses share: the built-in vocabulary
 * (the synthetic model's, made in memory), the shared vocabularies of
 * ../shared/vocab when they are there, a UTF-8 check and a byte splitter.
 *
 * A header of static functions rather than a .c file: the build globs
 * tests/fuzz/fuzz_*.c as harnesses, and each harness is one translation
 * unit linked with replay_main.c or libFuzzer.
 *
 * Everything loaded here is loaded once per process and kept (reachable
 * from a static, so LeakSanitizer does not count it).
 */
#ifndef SPILLWAY_TESTS_FUZZLIB_H
#define SPILLWAY_TESTS_FUZZLIB_H

#include "common/alloc.h"
#include "common/utf8.h"
#include "grammar/constrain.h"
#include "gguf/gguf.h"
#include "modelgen/model_make.h"
#include "text/tokenizer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define FZ_CHECK(cond)                                                                             \
    do {                                                                                           \
        if (!(cond))                                                                               \
            __builtin_trap();                                                                      \
    } while (0)

/* The synthetic model's vocabulary (SPM, 512 pieces: what `spillway model
 * make` writes), built in memory on first use. NULL only when out of memory. */
static __attribute__((unused)) const eng_tokenizer *fz_builtin_tokenizer(void)
{
    static eng_tokenizer *tok;
    static bool tried;
    if (!tried) {
        eng_model_make_params p = eng_model_make_default_params();
        void *image = NULL;
        size_t size = 0;
        eng_gguf *g = NULL;
        sw_error err;
        tried = true;
        p.n_layer = 1;
        if (eng_model_make_to_memory(&p, &image, &size, &err) == SW_OK &&
            eng_gguf_open_memory(image, size, &g, &err) == SW_OK) {
            if (eng_tokenizer_load(g, &tok, &err) != SW_OK)
                tok = NULL;
            eng_gguf_close(g);
        }
        sw_free(image);
        if (!tok)
            fprintf(stderr, "fuzz: cannot build the built-in vocabulary\n");
    }
    return tok;
}

/* The shared directory: $SPILLWAY_SHARED (set by ctest and make test-fuzz),
 * else the path CMake knew at configure time (SPILLWAY_FUZZ_SHARED_DIR),
 * else ../shared. */
static __attribute__((unused)) const char *fz_shared_dir(void)
{
    const char *root = getenv("SPILLWAY_SHARED");
    if (root && *root)
        return root;
#ifdef SPILLWAY_FUZZ_SHARED_DIR
    return SPILLWAY_FUZZ_SHARED_DIR;
#else
    return "../shared";
#endif
}

/* A vocabulary of ../shared/vocab (file name, e.g. "ggml-vocab-qwen2.gguf"),
 * loaded on first use; NULL when the file is absent (the harness then
 * fuzzes the others and the built-in one). */
static __attribute__((unused)) eng_tokenizer *fz_shared_tokenizer(const char *file)
{
    char path[4096];
    struct stat st;
    eng_gguf *g = NULL;
    eng_tokenizer *tok = NULL;
    sw_error err;
    snprintf(path, sizeof path, "%s/vocab/%s", fz_shared_dir(), file);
    if (stat(path, &st) != 0)
        return NULL;
    if (eng_gguf_open(path, &g, &err) != SW_OK) {
        fprintf(stderr, "fuzz: cannot open %s: %s\n", path, err.message);
        return NULL;
    }
    if (eng_tokenizer_load(g, &tok, &err) != SW_OK) {
        fprintf(stderr, "fuzz: cannot load the vocabulary of %s: %s\n", path, err.message);
        tok = NULL;
    }
    eng_gguf_close(g);
    return tok;
}

/* Whether s[0..n) is well-formed UTF-8 (no overlongs, no surrogates). */
static __attribute__((unused)) bool fz_utf8_valid(const char *s, size_t n)
{
    const unsigned char *b = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = b[i];
        size_t len;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF)
            len = 2, cp = c & 0x1F;
        else if (c >= 0xE0 && c <= 0xEF)
            len = 3, cp = c & 0x0F;
        else if (c >= 0xF0 && c <= 0xF4)
            len = 4, cp = c & 0x07;
        else
            return false;
        if (i + len > n)
            return false;
        for (size_t k = 1; k < len; k++) {
            if ((b[i + k] & 0xC0) != 0x80)
                return false;
            cp = (cp << 6) | (b[i + k] & 0x3F);
        }
        if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += len;
    }
    return true;
}

/* The next field of a byte string cut at sep: [*pos, end of field), *pos
 * moved past the separator. Returns false when nothing is left. */
static __attribute__((unused)) bool fz_next_field(const uint8_t *data, size_t size, size_t *pos,
                                                  uint8_t sep, const uint8_t **field,
                                                  size_t *len)
{
    if (*pos > size)
        return false;
    const uint8_t *start = data + *pos;
    const uint8_t *cut = memchr(start, sep, size - *pos);
    size_t n = cut ? (size_t)(cut - start) : size - *pos;
    *field = start;
    *len = n;
    *pos += n + 1; /* past the end when it was the last field */
    return true;
}

/* A NUL-terminated copy of n bytes (sw_free); NULL when out of memory. */
static __attribute__((unused)) char *fz_strndup(const uint8_t *p, size_t n)
{
    char *s = sw_malloc(n + 1);
    if (s) {
        memcpy(s, p, n);
        s[n] = 0;
    }
    return s;
}

/* A constraint vocabulary of the 256 single bytes, then the n_multi
 * pieces, then one end token (id 256 + n_multi), built on first use and
 * kept; NULL when out of memory. One per harness (one per process). */
static __attribute__((unused)) const eng_cs_vocab *fz_byte_vocab(const char *const *multi,
                                                                 int32_t n_multi)
{
    static eng_cs_vocab *v;
    static bool tried;
    if (!tried && n_multi <= 64) {
        static char bytes[256];
        const char *pieces[256 + 64 + 1];
        size_t lens[256 + 64 + 1];
        int32_t end_id = 256 + n_multi;
        tried = true;
        for (int i = 0; i < 256; i++) {
            bytes[i] = (char)i;
            pieces[i] = &bytes[i];
            lens[i] = 1;
        }
        for (int32_t i = 0; i < n_multi; i++) {
            pieces[256 + i] = multi[i];
            lens[256 + i] = strlen(multi[i]);
        }
        pieces[end_id] = NULL;
        lens[end_id] = 0;
        if (eng_cs_vocab_create_from_pieces(pieces, lens, end_id + 1, &end_id, 1, &v, NULL))
            v = NULL;
    }
    return v;
}

/* A constraint driven as the structured-output harnesses drive it: fed
 * the candidate bytes (a refused byte is skipped), then completed under
 * the tightest budget. Invariants checked (FZ_CHECK): complete exactly
 * when the shortest completion is 0 bytes, closed only when complete, the
 * end token allowed exactly when complete; the mask agrees with feeding
 * (on the first FZ_MASK_FIRST states and FZ_MASK_SPREAD more spread over
 * the input from an offset it chooses, a mask being costly)
 * and allows no byte feeding refuses; with the budget at exactly the
 * shortest completion some token is always allowed and each one shortens
 * it. on_complete judges the text whenever it is complete. The vocabulary
 * is fz_byte_vocab's with the same pieces. */
typedef struct fz_cs_walk {
    eng_constraint *c;
    const char *const *multi;
    int32_t n_tokens, end_id; /* 256 + pieces + 1, the last id */
    char *text;
    size_t len, cap;
    uint32_t *mask;           /* (n_tokens + 31) / 32 words */
    void (*on_complete)(const struct fz_cs_walk *w);
    const void *user;
} fz_cs_walk;

static __attribute__((unused)) bool fz_bit(const uint32_t *mask, int32_t id)
{
    return (mask[id / 32] >> (id % 32)) & 1;
}

/* with_mask: the mask's checks too; mask_held: w->mask is already this
 * state's (fz_cs_check_refusals made it), not computed again */
static __attribute__((unused)) void fz_cs_check_state(fz_cs_walk *w, bool with_mask,
                                                      bool mask_held)
{
    bool complete = eng_constraint_is_complete(w->c);
    int64_t min = eng_constraint_min_bytes(w->c);
    FZ_CHECK(min >= 0 && complete == (min == 0));
    FZ_CHECK(!eng_constraint_is_closed(w->c) || complete);
    if (with_mask) {
        if (!mask_held)
            eng_constraint_mask(w->c, (int64_t)1 << 40, w->mask);
        FZ_CHECK(fz_bit(w->mask, w->end_id) == complete);
        FZ_CHECK(eng_constraint_is_end_token(w->c, w->end_id));
    }
    if (complete)
        w->on_complete(w);
}

/* Every byte the mask refuses, feeding refuses too (a refusal leaves the
 * state as it was, so all 256 can be tried). w->mask is left the state's. */
static __attribute__((unused)) void fz_cs_check_refusals(fz_cs_walk *w)
{
    eng_constraint_mask(w->c, (int64_t)1 << 40, w->mask);
    for (int b = 0; b < 256; b++) {
        char byte = (char)b;
        if (!fz_bit(w->mask, b))
            FZ_CHECK(!eng_constraint_feed(w->c, &byte, 1));
    }
}

#define FZ_MASK_FIRST 4
#define FZ_MASK_SPREAD 6

static __attribute__((unused)) void fz_cs_run(fz_cs_walk *w, const uint8_t *cand, size_t n,
                                              size_t max_cand, int64_t max_completion)
{
    fz_cs_check_refusals(w);
    bool masked = true;
    fz_cs_check_state(w, masked, true);
    /* The states that get a mask (a mask walks the whole vocabulary, the
     * cost of an input): the first FZ_MASK_FIRST, then at most
     * FZ_MASK_SPREAD more, one every `stride` fed bytes from an offset the
     * input chooses, so that over many inputs every position is checked
     * while one input costs a bounded number of masks. */
    size_t fed_max = n < max_cand ? n : max_cand;
    size_t stride = fed_max / FZ_MASK_SPREAD > 1 ? fed_max / FZ_MASK_SPREAD : 1;
    size_t offset = n ? cand[0] % stride : 0;
    int spread_masks = 0;
    for (size_t i = 0, fed_bytes = 0; i < n && i < max_cand; i++) {
        /* w->mask, when masked, is the current state's */
        char byte = (char)cand[i];
        bool fed = eng_constraint_feed(w->c, &byte, 1);
        FZ_CHECK(!masked || fed == fz_bit(w->mask, cand[i]));
        if (!fed)
            continue;
        FZ_CHECK(w->len < w->cap);
        w->text[w->len++] = byte;
        fed_bytes++;
        masked = fed_bytes < FZ_MASK_FIRST;
        if (!masked && fed_bytes % stride == offset && spread_masks < FZ_MASK_SPREAD) {
            masked = true;
            spread_masks++;
        }
        fz_cs_check_state(w, masked, false);
    }
    fz_cs_check_refusals(w);
    fz_cs_check_state(w, true, true);

    int64_t min = eng_constraint_min_bytes(w->c);
    if (min > max_completion)
        return;
    uint32_t pick = n ? cand[n - 1] : 0;
    for (int64_t step = 0; !eng_constraint_is_complete(w->c); step++) {
        FZ_CHECK(step < max_completion);
        int32_t n_allowed = eng_constraint_mask(w->c, min, w->mask);
        FZ_CHECK(n_allowed > 0 && !fz_bit(w->mask, w->end_id));
        /* the k-th allowed token, k from the input */
        int32_t k = (int32_t)((pick = pick * 1103515245u + 12345u) >> 8) % n_allowed, chosen = -1;
        for (int32_t id = 0; id < w->n_tokens && chosen < 0; id++)
            if (fz_bit(w->mask, id) && k-- == 0)
                chosen = id;
        FZ_CHECK(chosen >= 0 && chosen != w->end_id);
        FZ_CHECK(eng_constraint_accept_token(w->c, chosen));
        char one = (char)chosen;
        const char *piece = chosen < 256 ? &one : w->multi[chosen - 256];
        size_t piece_len = chosen < 256 ? 1 : strlen(w->multi[chosen - 256]);
        FZ_CHECK(w->len + piece_len <= w->cap);
        memcpy(w->text + w->len, piece, piece_len);
        w->len += piece_len;
        int64_t next = eng_constraint_min_bytes(w->c);
        FZ_CHECK(next <= min - 1);
        min = next;
    }
    fz_cs_check_state(w, true, false);
    FZ_CHECK(eng_constraint_accept_token(w->c, w->end_id));
}

#endif
