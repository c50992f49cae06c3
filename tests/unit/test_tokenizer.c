/* test_tokenizer.c - the SPM tokenizer and the streaming detokenizer.
 *
 * Correctness comes from three independent sources:
 *   - llama.cpp's recorded outputs in ../shared (the vocabulary test vectors
 *     and the model golden files);
 *   - small vocabularies written here with the GGUF writer, whose expected
 *     tokenizations are worked out by hand in the comments;
 *   - a deliberately naive O(n^2) implementation of the merge rule, written
 *     from the SentencePiece description, compared with the real one on
 *     random text.
 */
#include "testutil.h"

#include "common/alloc.h"
#include "gguf/gguf.h"
#include "modelgen/model_make.h"
#include "text/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- helpers ------------------------------------------------------------- */

static eng_tokenizer *load_tokenizer_file(const char *path)
{
    eng_gguf *g = NULL;
    eng_tokenizer *tok = NULL;
    sw_error err = {0};
    int rc = eng_gguf_open(path, &g, &err);
    if (rc)
        fail_msg("open %s: %s", path, err.message);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    rc = eng_tokenizer_load(g, &tok, &err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (rc)
        fail_msg("load vocabulary of %s: %s", path, err.message);
    /* Reported, never asserted (tests do not judge speed). */
    print_message("vocabulary of %d tokens loaded in %.1f ms\n", eng_tokenizer_n_vocab(tok),
                  (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
    eng_gguf_close(g); /* the tokenizer must not depend on the mapping */
    return tok;
}

/* An independent validator: strict RFC 3629 UTF-8. */
/* ---- small vocabularies written with the GGUF writer --------------------- */

typedef struct vocab_spec {
    const char *model;        /* tokenizer.ggml.model, NULL: "llama" */
    bool no_scores;           /* omit tokenizer.ggml.scores */
    int scores_delta;         /* scores array length = n + delta */
    int types_delta;          /* token_type array length = n + delta */
    int64_t bos;              /* written when >= 0 or == -2 (writes n_vocab) */
    bool set_add_space_prefix, add_space_prefix;
    bool no_tokens;
} vocab_spec;

typedef struct mini_piece {
    const char *text;
    float score;
    int32_t type;
} mini_piece;

/* The shape `spillway model make` uses: <unk>, <s>, </s>, 256 byte tokens,
 * then pieces with scores. Ids: 0 unk, 1 bos, 2 eos, 3 + b for byte b. */
static const mini_piece mini_pieces[] = {
    {"\xe2\x96\x81", -1.0f, ENG_TOKEN_NORMAL},                 /* 259 "▁" */
    {"a", -2.0f, ENG_TOKEN_NORMAL},                            /* 260 */
    {"b", -2.0f, ENG_TOKEN_NORMAL},                            /* 261 */
    {"c", -2.0f, ENG_TOKEN_NORMAL},                            /* 262 */
    {"t", -2.0f, ENG_TOKEN_NORMAL},                            /* 263 */
    {"h", -2.0f, ENG_TOKEN_NORMAL},                            /* 264 */
    {"e", -2.0f, ENG_TOKEN_NORMAL},                            /* 265 */
    {"x", -2.0f, ENG_TOKEN_NORMAL},                            /* 266 */
    {"y", -2.0f, ENG_TOKEN_NORMAL},                            /* 267 */
    {"z", -2.0f, ENG_TOKEN_NORMAL},                            /* 268 */
    {"ab", -1.0f, ENG_TOKEN_NORMAL},                           /* 269 */
    {"bc", -1.0f, ENG_TOKEN_NORMAL},                           /* 270: ties with "ab" */
    {"xy", -1.0f, ENG_TOKEN_NORMAL},                           /* 271 */
    {"yz", -0.5f, ENG_TOKEN_NORMAL},                           /* 272: beats "xy" */
    {"\xe2\x96\x81t", -3.0f, ENG_TOKEN_NORMAL},                /* 273 "▁t" */
    {"he", -1.5f, ENG_TOKEN_NORMAL},                           /* 274 */
    {"\xe2\x96\x81the", -0.5f, ENG_TOKEN_NORMAL},              /* 275 "▁the" */
    {"\xe2\x96\x81" "a", -2.5f, ENG_TOKEN_NORMAL},             /* 276 "▁a" */
    {"<|user|>", 0.0f, ENG_TOKEN_USER_DEFINED},                /* 277 */
    {"\xe2\x96\x81\xe2\x96\x81", -4.0f, ENG_TOKEN_NORMAL},     /* 278 "▁▁" */
};
enum { MINI_SPACE = 259, MINI_A = 260, MINI_B, MINI_C, MINI_T, MINI_H, MINI_E, MINI_X, MINI_Y,
       MINI_Z, MINI_AB, MINI_BC, MINI_XY, MINI_YZ, MINI_SPACE_T, MINI_HE, MINI_SPACE_THE,
       MINI_SPACE_A, MINI_USER, MINI_SPACE_SPACE, MINI_N };

static const char *write_mini_vocab(const char *name, const vocab_spec *spec)
{
    enum { N = MINI_N };
    static char byte_names[256][8];
    const char *texts[N];
    float scores[N + 4];
    int32_t types[N + 4];
    static const char *const first[3] = {"<unk>", "<s>", "</s>"};
    for (int i = 0; i < 3; i++) {
        texts[i] = first[i];
        scores[i] = 0.0f;
        types[i] = i == 0 ? ENG_TOKEN_UNKNOWN : ENG_TOKEN_CONTROL;
    }
    for (int b = 0; b < 256; b++) {
        snprintf(byte_names[b], sizeof byte_names[b], "<0x%02X>", b);
        texts[3 + b] = byte_names[b];
        scores[3 + b] = 0.0f;
        types[3 + b] = ENG_TOKEN_BYTE;
    }
    for (size_t i = 0; i < sizeof mini_pieces / sizeof mini_pieces[0]; i++) {
        texts[259 + i] = mini_pieces[i].text;
        scores[259 + i] = mini_pieces[i].score;
        types[259 + i] = mini_pieces[i].type;
    }
    for (int i = N; i < N + 4; i++)
        scores[i] = 0.0f, types[i] = ENG_TOKEN_NORMAL;

    eng_gguf_writer *w = eng_gguf_writer_create();
    sw_error err = {0};
    assert_non_null(w);
    assert_int_equal(eng_gguf_writer_set_str(w, "general.architecture", "llama"), SW_OK);
    assert_int_equal(eng_gguf_writer_set_str(w, "tokenizer.ggml.model",
                                             spec->model ? spec->model : "llama"), SW_OK);
    if (!spec->no_tokens)
        assert_int_equal(eng_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", texts, N), SW_OK);
    if (!spec->no_scores)
        assert_int_equal(eng_gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", scores,
                                                     (uint64_t)(N + spec->scores_delta)), SW_OK);
    assert_int_equal(eng_gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types,
                                                 (uint64_t)(N + spec->types_delta)), SW_OK);
    if (spec->bos >= 0 || spec->bos == -2)
        assert_int_equal(eng_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id",
                                                 spec->bos == -2 ? (uint32_t)N : (uint32_t)spec->bos),
                         SW_OK);
    assert_int_equal(eng_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2), SW_OK);
    assert_int_equal(eng_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0), SW_OK);
    if (spec->set_add_space_prefix)
        assert_int_equal(eng_gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix",
                                                  spec->add_space_prefix), SW_OK);
    const char *path = tu_tmp_path(name);
    if (eng_gguf_writer_write(w, path, &err) != SW_OK)
        fail_msg("write %s: %s", path, err.message);
    eng_gguf_writer_free(w);
    return path;
}

static int try_load(const char *path, eng_tokenizer **tok, sw_error *err)
{
    eng_gguf *g = NULL;
    int rc = eng_gguf_open(path, &g, err);
    if (rc)
        fail_msg("open %s: %s", path, err->message);
    rc = eng_tokenizer_load(g, tok, err);
    eng_gguf_close(g);
    return rc;
}

static eng_tokenizer *mini_tokenizer(const vocab_spec *spec)
{
    eng_tokenizer *tok = NULL;
    sw_error err = {0};
    const char *path = write_mini_vocab("mini.gguf", spec);
    if (try_load(path, &tok, &err))
        fail_msg("load mini vocab: %s", err.message);
    remove(path);
    return tok;
}

static void expect_tokens(const eng_tokenizer *tok, const char *text, bool parse_special,
                          const int32_t *want, size_t n_want)
{
    int32_t *ids = NULL;
    size_t n = tu_tokenize(tok, text, strlen(text), false, parse_special, &ids);
    tu_assert_ids_equal(ids, n, want, n_want, text);
    sw_free(ids);
}
#define EXPECT(tok, text, special, ...)                                                       \
    do {                                                                                      \
        const int32_t want_[] = {__VA_ARGS__};                                                \
        expect_tokens(tok, text, special, want_, sizeof want_ / sizeof want_[0]);             \
    } while (0)

/* ---- hand-derived expectations on the mini vocabulary --------------------- */

static void test_mini_merges(void **state)
{
    (void)state;
    vocab_spec spec = {.bos = -1};
    eng_tokenizer *tok = mini_tokenizer(&spec);
    assert_int_equal(eng_tokenizer_n_vocab(tok), MINI_N);
    assert_int_equal(eng_tokenizer_bos(tok), 1); /* the SPM default */
    assert_int_equal(eng_tokenizer_eos(tok), 2);
    assert_int_equal(eng_tokenizer_unk(tok), 0);
    assert_true(eng_tokenizer_add_bos(tok));
    assert_true(eng_tokenizer_add_space_prefix(tok));
    assert_true(eng_tokenizer_is_eog(tok, 2));
    assert_false(eng_tokenizer_is_eog(tok, 1));

    /* "▁abc": pairs ▁a (-2.5), ab (-1), bc (-1): the tie goes to the
     * leftmost, ab; then neither "▁ab" nor "abc" exists. */
    EXPECT(tok, "abc", false, MINI_SPACE, MINI_AB, MINI_C);
    /* "▁xyz": yz (-0.5) beats xy (-1); "xyz" is not a piece. */
    EXPECT(tok, "xyz", false, MINI_SPACE, MINI_X, MINI_YZ);
    /* "▁the": he (-1.5), then ▁t (-3), then ▁t+he = ▁the (-0.5). */
    EXPECT(tok, "the", false, MINI_SPACE_THE);
    /* Spaces are "▁"; " the" is "▁▁the" -> ▁ ▁the. */
    EXPECT(tok, " the", false, MINI_SPACE, MINI_SPACE_THE);
    /* "  " is "▁▁▁": its two "▁▁" pairs tie, the leftmost merges. */
    EXPECT(tok, "  ", false, MINI_SPACE_SPACE, MINI_SPACE);
    /* Unknown characters fall back to byte tokens (id 3 + byte). */
    EXPECT(tok, "q", false, MINI_SPACE, 3 + 'q');
    EXPECT(tok, "\xc3\xa9", false, MINI_SPACE, 3 + 0xC3, 3 + 0xA9);
    EXPECT(tok, "", false);
    /* Control text is plain text unless parse_special: "<s>the" is
     * ▁ < s > t he (< s > are bytes, "the" lacks its "▁"). */
    EXPECT(tok, "<s>the", false, MINI_SPACE, 3 + '<', 3 + 's', 3 + '>', MINI_T, MINI_HE);
    /* With parse_special, <s> is BOS and the text after it gets the space
     * prefix again. */
    EXPECT(tok, "<s>the", true, 1, MINI_SPACE_THE);
    EXPECT(tok, "the</s>", true, MINI_SPACE_THE, 2);
    EXPECT(tok, "<unk>", true, 0);
    /* User-defined tokens are matched even without parse_special. */
    EXPECT(tok, "a<|user|>b", false, MINI_SPACE_A, MINI_USER, MINI_SPACE, MINI_B);

    /* add_bos prepends BOS. */
    int32_t *ids = NULL;
    size_t n = tu_tokenize(tok, "the", 3, true, false, &ids);
    const int32_t want[] = {1, MINI_SPACE_THE};
    tu_assert_ids_equal(ids, n, want, 2, "the with BOS");
    sw_free(ids);

    /* Lookup helpers. */
    size_t len;
    assert_string_equal(eng_token_piece(tok, MINI_SPACE_THE, &len), "\xe2\x96\x81the");
    assert_int_equal(len, 6);
    assert_null(eng_token_piece(tok, MINI_N, &len));
    assert_int_equal(eng_token_find(tok, "he", 2), MINI_HE);
    assert_int_equal(eng_token_find(tok, "hex", 3), -1);
    assert_int_equal(eng_token_get_type(tok, 3), ENG_TOKEN_BYTE);
    assert_true(eng_token_score(tok, MINI_YZ) == -0.5f);
    eng_tokenizer_free(tok);

    /* bos_token_id 0xFFFFFFFF (the u32 image of -1) means "no BOS": the
     * defaulted add_bos yields and nothing is prepended. */
    vocab_spec no_bos = {.bos = UINT32_MAX};
    tok = mini_tokenizer(&no_bos);
    assert_int_equal(eng_tokenizer_bos(tok), -1);
    assert_false(eng_tokenizer_add_bos(tok));
    n = tu_tokenize(tok, "the", 3, true, false, &ids);
    tu_assert_ids_equal(ids, n, (const int32_t[]){MINI_SPACE_THE}, 1, "the, no BOS in vocab");
    sw_free(ids);
    eng_tokenizer_free(tok);

    /* Without the space prefix: t h e -> t he; "the" is not a piece. */
    vocab_spec no_prefix = {.bos = -1, .set_add_space_prefix = true, .add_space_prefix = false};
    tok = mini_tokenizer(&no_prefix);
    assert_false(eng_tokenizer_add_space_prefix(tok));
    EXPECT(tok, "the", false, MINI_T, MINI_HE);
    EXPECT(tok, " the", false, MINI_SPACE_THE);
    char *text = eng_detokenize_ex(tok, (const int32_t[]){MINI_SPACE_THE}, 1, true, NULL);
    assert_string_equal(text, " the"); /* nothing to strip without a prefix */
    sw_free(text);
    eng_tokenizer_free(tok);
}

static void test_mini_detokenize(void **state)
{
    (void)state;
    vocab_spec spec = {.bos = 1};
    eng_tokenizer *tok = mini_tokenizer(&spec);
    const int32_t ids[] = {1, MINI_SPACE_THE, MINI_SPACE, MINI_AB, 2, MINI_USER, 0, 3 + '!'};
    size_t len;
    char *text = eng_detokenize_ex(tok, ids, 8, false, &len);
    /* BOS/EOS render nothing, ▁ is a space, unk is U+2585, bytes are bytes. */
    assert_string_equal(text, " the ab<|user|>\xe2\x96\x85!");
    assert_int_equal(len, strlen(text));
    sw_free(text);
    /* From the start of a text, the first text loses the prefix space even
     * behind BOS; later spaces stay. */
    text = eng_detokenize_ex(tok, ids, 8, true, NULL);
    assert_string_equal(text, "the ab<|user|>\xe2\x96\x85!");
    sw_free(text);
    text = eng_detokenize(tok, ids, 2);
    assert_string_equal(text, " the");
    sw_free(text);
    text = eng_detokenize(tok, ids, 0);
    assert_string_equal(text, "");
    sw_free(text);
    /* Out-of-range ids render nothing rather than crash. */
    text = eng_detokenize(tok, (const int32_t[]){-5, MINI_N, MINI_A}, 3);
    assert_string_equal(text, "a");
    sw_free(text);
    eng_tokenizer_free(tok);
}

/* Byte tokens fed one at a time: no step may emit invalid UTF-8, and the
 * steps together are the whole text. */
static void test_streaming_utf8(void **state)
{
    (void)state;
    vocab_spec spec = {.bos = 1};
    eng_tokenizer *tok = mini_tokenizer(&spec);
    const char *expected = "a\xc3\xa9\xe6\x97\xa5\xf0\x9f\x98\x80z"; /* a é 日 😀 z */
    int32_t ids[32];
    size_t n = 0;
    ids[n++] = MINI_A;
    for (const char *p = expected + 1; *p != 'z'; p++)
        ids[n++] = 3 + (uint8_t)*p;
    ids[n++] = MINI_Z;

    eng_detok d;
    eng_detok_reset(&d);
    size_t step_cap = eng_detok_max_bytes(tok);
    char *step = sw_malloc(step_cap);
    char all[128];
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        size_t k = eng_detok_push(tok, &d, ids[i], step, step_cap);
        assert_true(tu_valid_utf8(step, k));
        memcpy(all + total, step, k);
        total += k;
        /* Each completed character is out as soon as its last byte is in. */
        assert_true(tu_valid_utf8(all, total));
    }
    assert_int_equal(d.n_emitted_tokens, n);
    total += eng_detok_flush(&d, all + total, sizeof all - total);
    assert_int_equal(total, strlen(expected));
    assert_memory_equal(all, expected, total);

    char *whole = eng_detokenize(tok, ids, n);
    assert_string_equal(whole, expected);
    sw_free(whole);

    /* A truncated character flushes as one U+FFFD. */
    eng_detok_reset(&d);
    assert_int_equal(eng_detok_push(tok, &d, 3 + 0xE6, step, step_cap), 0);
    assert_int_equal(eng_detok_push(tok, &d, 3 + 0x97, step, step_cap), 0);
    size_t k = eng_detok_flush(&d, step, step_cap);
    assert_int_equal(k, 3);
    assert_memory_equal(step, "\xef\xbf\xbd", 3);
    assert_int_equal(eng_detok_flush(&d, step, step_cap), 0);

    /* A character interrupted by another token: U+FFFD, then the token. */
    eng_detok_reset(&d);
    assert_int_equal(eng_detok_push(tok, &d, 3 + 0xF0, step, step_cap), 0);
    k = eng_detok_push(tok, &d, MINI_A, step, step_cap);
    assert_int_equal(k, 4);
    assert_memory_equal(step, "\xef\xbf\xbd" "a", 4);

    /* Bytes that can never start a character (0xFF, a lone continuation,
     * an overlong lead, a surrogate) become U+FFFD at once. */
    const uint8_t bad[] = {0xFF, 0x80, 0xC0, 0xED};
    for (size_t i = 0; i < sizeof bad; i++) {
        eng_detok_reset(&d);
        k = eng_detok_push(tok, &d, 3 + bad[i], step, step_cap);
        if (bad[i] == 0xED) { /* ED is a lead; ED A0 is a surrogate */
            assert_int_equal(k, 0);
            k = eng_detok_push(tok, &d, 3 + 0xA0, step, step_cap);
            assert_true(k == 6); /* ED and A0 are separate maximal subparts */
        } else {
            assert_int_equal(k, 3);
        }
        assert_true(tu_valid_utf8(step, k));
    }

    /* A too-small buffer cuts at a character boundary, never mid-char. */
    eng_detok_reset(&d);
    char tiny[4];
    k = eng_detok_push(tok, &d, MINI_SPACE_THE, tiny, 2);
    assert_int_equal(k, 2);
    assert_memory_equal(tiny, " t", 2);
    sw_free(step);
    eng_tokenizer_free(tok);
}

/* Invalid UTF-8 and NUL bytes tokenize byte-wise; a long text does not
 * fail. */
static void test_robust_inputs(void **state)
{
    (void)state;
    vocab_spec spec = {.bos = 1};
    eng_tokenizer *tok = mini_tokenizer(&spec);
    int32_t *ids = NULL;
    size_t n;

    /* A lone continuation byte is one symbol; "\xc3a": the lead byte
     * announces two bytes, so "\xc3" "a" is one symbol that is not a piece
     * and falls back to two byte tokens - 'a' included, as the reference
     * does. */
    n = tu_tokenize(tok, "\x80" "b\xc3" "a", 4, false, false, &ids);
    const int32_t want_invalid[] = {MINI_SPACE, 3 + 0x80, MINI_B, 3 + 0xC3, 3 + 'a'};
    tu_assert_ids_equal(ids, n, want_invalid, 5, "invalid utf-8");
    sw_free(ids);
    /* 0xFF counts as a 4-byte lead: it swallows the three bytes after it. */
    n = tu_tokenize(tok, "\xff" "abcab", 6, false, false, &ids);
    const int32_t want_ff[] = {MINI_SPACE, 3 + 0xFF, 3 + 'a', 3 + 'b', 3 + 'c', MINI_AB};
    tu_assert_ids_equal(ids, n, want_ff, 6, "0xff lead");
    sw_free(ids);
    /* A lead byte cut off by the end of the text. */
    n = tu_tokenize(tok, "a\xf0\x9f", 3, false, false, &ids);
    const int32_t want_cut[] = {MINI_SPACE_A, 3 + 0xF0, 3 + 0x9F};
    tu_assert_ids_equal(ids, n, want_cut, 3, "truncated utf-8");
    sw_free(ids);

    /* Embedded NUL: the text has an explicit length. */
    n = tu_tokenize(tok, "a\0b", 3, false, false, &ids);
    const int32_t want_nul[] = {MINI_SPACE_A, 3 + 0, MINI_B};
    tu_assert_ids_equal(ids, n, want_nul, 3, "embedded NUL");
    size_t len;
    char *text = eng_detokenize_ex(tok, ids, n, true, &len);
    assert_int_equal(len, 3);
    assert_memory_equal(text, "a\0b", 3);
    sw_free(text);
    sw_free(ids);

    /* 200k characters of mixed text round-trip exactly. */
    static const char *const words[] = {"the ", "abc ", "xyz", " ", "q", "\xc3\xa9", "\n", "ab"};
    size_t cap = 200000 + 16, used = 0;
    char *big = sw_malloc(cap + 1);
    uint32_t lcg = 12345;
    while (used < 200000) {
        lcg = lcg * 1664525u + 1013904223u;
        const char *wd = words[(lcg >> 16) % (sizeof words / sizeof words[0])];
        size_t wl = strlen(wd);
        memcpy(big + used, wd, wl);
        used += wl;
    }
    big[used] = '\0';
    n = tu_tokenize(tok, big, used, true, true, &ids);
    assert_true(n > 50000);
    text = eng_detokenize_ex(tok, ids, n, true, &len);
    assert_int_equal(len, used);
    assert_memory_equal(text, big, used);
    sw_free(text);
    sw_free(ids);
    sw_free(big);

    /* NULL text with zero length is the empty text. */
    n = tu_tokenize(tok, NULL, 0, true, false, &ids);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 1);
    sw_free(ids);
    eng_tokenizer_free(tok);
}

/* Failing each allocation in turn never crashes or leaks; each run either
 * succeeds completely or reports SW_ENOMEM. */
static void test_alloc_failures(void **state)
{
    (void)state;
    const char *path = write_mini_vocab("mini-oom.gguf", &(vocab_spec){.bos = 1});
    eng_gguf *g = NULL;
    sw_error err = {0};
    assert_int_equal(eng_gguf_open(path, &g, &err), SW_OK);
    for (long k = 0;; k++) {
        eng_tokenizer *tok = NULL;
        sw_alloc_fail_after(k);
        int rc = eng_tokenizer_load(g, &tok, &err);
        sw_alloc_fail_after(-1);
        if (rc == SW_OK) {
            eng_tokenizer_free(tok);
            break;
        }
        assert_int_equal(rc, SW_ENOMEM);
        assert_null(tok);
    }
    eng_tokenizer *tok = NULL;
    assert_int_equal(eng_tokenizer_load(g, &tok, &err), SW_OK);
    for (long k = 0;; k++) {
        int32_t *ids = NULL;
        size_t n = 0;
        sw_alloc_fail_after(k);
        int rc = eng_tokenize(tok, "<s>the abc<|user|>xyz q", 23, true, true, &ids, &n, &err);
        sw_alloc_fail_after(-1);
        if (rc == SW_OK) {
            assert_int_equal(n, 12);
            sw_free(ids);
            break;
        }
        assert_int_equal(rc, SW_ENOMEM);
        assert_null(ids);
    }
    sw_alloc_fail_after(0);
    assert_null(eng_detokenize(tok, (const int32_t[]){MINI_A}, 1));
    sw_alloc_fail_after(-1);
    eng_tokenizer_free(tok);
    eng_gguf_close(g);
    remove(path);
}

/* Broken vocabularies are clear errors, never a crash. */
static void expect_load_error(const char *name, const vocab_spec *spec, int code,
                              const char *needle)
{
    eng_tokenizer *tok = NULL;
    sw_error err = {0};
    const char *path = write_mini_vocab(name, spec);
    int rc = try_load(path, &tok, &err);
    remove(path);
    if (rc != code || !strstr(err.message, needle))
        fail_msg("%s: got %d \"%s\", want %d with \"%s\"", name, rc, err.message, code, needle);
    assert_null(tok);
}

static void test_bad_vocabularies(void **state)
{
    (void)state;
    /* An unknown tokenizer model is refused naming it and the supported ones;
     * a gpt2 (BPE) vocabulary without merges is malformed. */
    expect_load_error("rwkv.gguf", &(vocab_spec){.model = "rwkv", .bos = -1}, SW_EUNSUPPORTED,
                      "\"rwkv\"");
    expect_load_error("rwkvb.gguf", &(vocab_spec){.model = "rwkv", .bos = -1}, SW_EUNSUPPORTED,
                      "llama");
    expect_load_error("gpt2.gguf", &(vocab_spec){.model = "gpt2", .bos = -1}, SW_EFORMAT,
                      "tokenizer.ggml.merges");
    expect_load_error("short-scores.gguf", &(vocab_spec){.scores_delta = -1, .bos = -1},
                      SW_EFORMAT, "tokenizer.ggml.scores");
    expect_load_error("long-scores.gguf", &(vocab_spec){.scores_delta = 3, .bos = -1},
                      SW_EFORMAT, "tokenizer.ggml.scores");
    expect_load_error("no-scores.gguf", &(vocab_spec){.no_scores = true, .bos = -1}, SW_EFORMAT,
                      "tokenizer.ggml.scores");
    expect_load_error("short-types.gguf", &(vocab_spec){.types_delta = -7, .bos = -1},
                      SW_EFORMAT, "tokenizer.ggml.token_type");
    expect_load_error("no-tokens.gguf", &(vocab_spec){.no_tokens = true, .bos = -1}, SW_EFORMAT,
                      "tokenizer.ggml.tokens");
    expect_load_error("bad-bos.gguf", &(vocab_spec){.bos = -2}, SW_EFORMAT,
                      "tokenizer.ggml.bos_token_id");
    expect_load_error("huge-bos.gguf", &(vocab_spec){.bos = 4000000}, SW_EFORMAT,
                      "tokenizer.ggml.bos_token_id");

    /* A file without any vocabulary. */
    eng_gguf_writer *w = eng_gguf_writer_create();
    sw_error err = {0};
    assert_int_equal(eng_gguf_writer_set_str(w, "general.architecture", "llama"), SW_OK);
    const char *path = tu_tmp_path("novocab.gguf");
    assert_int_equal(eng_gguf_writer_write(w, path, &err), SW_OK);
    eng_gguf_writer_free(w);
    eng_tokenizer *tok = NULL;
    assert_int_equal(try_load(path, &tok, &err), SW_EFORMAT);
    assert_non_null(strstr(err.message, "tokenizer.ggml.model"));
    remove(path);
}

/* ---- llama.cpp's vocabulary test vectors -------------------------------- */

/* Every case of a vocabulary's .inp/.out pair (llama.cpp's tokenizer test
 * vectors) tokenizes to llama.cpp's ids and decodes back to its text. */
static void check_spm_vectors(const char *p, size_t expected_cases)
{
    char gguf_path[4096];
    snprintf(gguf_path, sizeof gguf_path, "%s", p);
    size_t n_cases;
    tu_vocab_case *cases = tu_vocab_cases_load(gguf_path, &n_cases);
    eng_tokenizer *tok = load_tokenizer_file(gguf_path);
    for (size_t c = 0; c < n_cases; c++) {
        int32_t *ids = NULL;
        size_t n = tu_tokenize(tok, cases[c].text, cases[c].len, false, false, &ids);
        char what[96];
        snprintf(what, sizeof what, "vocab case %zu (%.40s)", c, cases[c].text);
        tu_assert_ids_equal(ids, n, cases[c].ids, cases[c].n_ids, what);

        /* And back: the ids of a text from its start decode to the text. */
        size_t len;
        char *text = eng_detokenize_ex(tok, ids, n, true, &len);
        if (len != cases[c].len || memcmp(text, cases[c].text, len) != 0)
            fail_msg("%s: detokenized to \"%s\"", what, text);
        sw_free(text);
        sw_free(ids);
    }
    assert_int_equal(n_cases, expected_cases);
    eng_tokenizer_free(tok);
    tu_vocab_cases_free(cases, n_cases);
}

static void test_vocab_llama_spm(void **state)
{
    (void)state;
    const char *p = tu_shared_path("vocab/ggml-vocab-llama-spm.gguf");
    if (p)
        check_spm_vectors(p, 46);
}

/* Phi-3's vocabulary (the phi3 family; tests/data, from llama.cpp's
 * models/, MIT) */
static void test_vocab_phi3(void **state)
{
    (void)state;
    const char *p = tu_data_path("ggml-vocab-phi-3.gguf");
    if (p)
        check_spm_vectors(p, 46);
}

/* ---- the model golden files --------------------------------------------- */

static size_t json_ids(json_t *arr, int32_t *ids, size_t cap)
{
    assert_true(json_is_array(arr));
    size_t n = json_array_size(arr);
    assert_true(n <= cap);
    for (size_t i = 0; i < n; i++)
        ids[i] = (int32_t)json_integer_value(json_array_get(arr, i));
    return n;
}

static void check_golden(const char *model, const char *golden)
{
    const char *p = tu_shared_path(golden);
    if (!p)
        return;
    json_error_t jerr;
    json_t *root = json_load_file(p, 0, &jerr);
    if (!root)
        fail_msg("%s: %s", golden, jerr.text);
    p = tu_shared_path(model);
    if (!p) {
        json_decref(root);
        return;
    }
    eng_tokenizer *tok = load_tokenizer_file(p);
    int32_t want[1024];

    size_t i;
    json_t *entry;
    json_array_foreach(json_object_get(root, "tokenize"), i, entry) {
        const char *text = json_string_value(json_object_get(entry, "text"));
        size_t text_len = json_string_length(json_object_get(entry, "text"));
        size_t n_want = json_ids(json_object_get(entry, "tokens"), want, 1024);
        int32_t *ids = NULL;
        size_t n = tu_tokenize(tok, text, text_len, false, true, &ids);
        tu_assert_ids_equal(ids, n, want, n_want, text);
        sw_free(ids);
    }
    assert_true(i >= 5);

    size_t step_cap = eng_detok_max_bytes(tok);
    char *step = sw_malloc(step_cap);
    json_array_foreach(json_object_get(root, "greedy"), i, entry) {
        const char *prompt = json_string_value(json_object_get(entry, "prompt"));
        size_t prompt_len = json_string_length(json_object_get(entry, "prompt"));
        size_t n_want = json_ids(json_object_get(entry, "prompt_tokens_with_bos"), want, 1024);
        int32_t *ids = NULL;
        size_t n = tu_tokenize(tok, prompt, prompt_len, true, true, &ids);
        tu_assert_ids_equal(ids, n, want, n_want, prompt);
        assert_int_equal(ids[0], eng_tokenizer_bos(tok));

        /* The prompt decodes back to itself as a text from its start. */
        size_t len;
        char *text = eng_detokenize_ex(tok, ids, n, true, &len);
        if (len != prompt_len || memcmp(text, prompt, len) != 0)
            fail_msg("prompt \"%s\" detokenized to \"%s\"", prompt, text);
        sw_free(text);
        sw_free(ids);

        /* The continuation decodes to the reference text, first space kept,
         * both whole and streamed token by token. */
        const char *expect = json_string_value(json_object_get(entry, "text"));
        size_t expect_len = json_string_length(json_object_get(entry, "text"));
        n = json_ids(json_object_get(entry, "tokens"), want, 1024);
        text = eng_detokenize(tok, want, n);
        if (strlen(text) != expect_len || memcmp(text, expect, expect_len) != 0)
            fail_msg("greedy %zu: detokenized \"%s\", want \"%s\"", i, text, expect);
        sw_free(text);

        eng_detok d;
        eng_detok_reset(&d);
        char *streamed = sw_malloc(step_cap * (n + 1));
        size_t total = 0;
        for (size_t k = 0; k <= n; k++) {
            size_t m = k < n ? eng_detok_push(tok, &d, want[k], step, step_cap)
                             : eng_detok_flush(&d, step, step_cap);
            assert_true(tu_valid_utf8(step, m));
            memcpy(streamed + total, step, m);
            total += m;
        }
        assert_int_equal(total, expect_len);
        assert_memory_equal(streamed, expect, total);
        sw_free(streamed);
    }
    assert_true(i >= 5);
    sw_free(step);
    eng_tokenizer_free(tok);
    json_decref(root);
}

static void test_golden_stories260k(void **state)
{
    (void)state;
    check_golden("models/stories260K.gguf", "models/stories260K.golden.json");
}

static void test_golden_llama2_tiny(void **state)
{
    (void)state;
    check_golden("models/llama-2-tiny-random.gguf", "models/llama-2-tiny-random.golden.json");
}

/* ---- a naive reference of the merge rule ---------------------------------- */

/* Straight from the SentencePiece BPE description: start from characters,
 * repeatedly merge the adjacent pair whose concatenation is a piece with the
 * highest score (leftmost on ties), rescanning everything each time; then
 * pieces become ids and other characters bytes. No special tokens. */
static size_t naive_spm(const eng_tokenizer *tok, const char *raw, size_t raw_len, int32_t *out)
{
    size_t cap = raw_len * 3 + 3, n_text = 0;
    char *text = sw_malloc(cap);
    if (eng_tokenizer_add_space_prefix(tok) && raw_len > 0) {
        memcpy(text, "\xe2\x96\x81", 3);
        n_text = 3;
    }
    for (size_t i = 0; i < raw_len; i++) {
        if (raw[i] == ' ') {
            memcpy(text + n_text, "\xe2\x96\x81", 3);
            n_text += 3;
        } else {
            text[n_text++] = raw[i];
        }
    }
    size_t *start = sw_calloc(n_text + 1, sizeof *start);
    size_t *len = sw_calloc(n_text + 1, sizeof *len);
    size_t n_sym = 0;
    for (size_t off = 0; off < n_text;) {
        unsigned char c = (unsigned char)text[off];
        size_t l = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        if (l > n_text - off)
            l = n_text - off;
        start[n_sym] = off;
        len[n_sym++] = l;
        off += l;
    }
    for (;;) {
        size_t best = SIZE_MAX;
        float best_score = 0;
        for (size_t i = 0; i + 1 < n_sym; i++) {
            int32_t id = eng_token_find(tok, text + start[i], len[i] + len[i + 1]);
            if (id < 0)
                continue;
            float s = eng_token_score(tok, id);
            if (best == SIZE_MAX || s > best_score) {
                best = i;
                best_score = s;
            }
        }
        if (best == SIZE_MAX)
            break;
        len[best] += len[best + 1];
        memmove(start + best + 1, start + best + 2, (n_sym - best - 2) * sizeof *start);
        memmove(len + best + 1, len + best + 2, (n_sym - best - 2) * sizeof *len);
        n_sym--;
    }
    size_t n = 0;
    for (size_t i = 0; i < n_sym; i++) {
        int32_t id = eng_token_find(tok, text + start[i], len[i]);
        if (id >= 0) {
            out[n++] = id;
            continue;
        }
        for (size_t k = 0; k < len[i]; k++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", (unsigned char)text[start[i] + k]);
            out[n++] = eng_token_find(tok, name, 6);
        }
    }
    sw_free(text);
    sw_free(start);
    sw_free(len);
    return n;
}

static void compare_with_naive(const eng_tokenizer *tok, const char *const *alphabet,
                               size_t n_alpha, int rounds)
{
    uint32_t lcg = 777;
    char text[2048];
    int32_t naive[8192];
    for (int r = 0; r < rounds; r++) {
        size_t used = 0;
        lcg = lcg * 1664525u + 1013904223u;
        size_t target = (lcg >> 8) % 400;
        while (used < target) {
            lcg = lcg * 1664525u + 1013904223u;
            const char *a = alphabet[(lcg >> 12) % n_alpha];
            size_t l = strlen(a);
            memcpy(text + used, a, l);
            used += l;
        }
        int32_t *ids = NULL;
        size_t n = tu_tokenize(tok, text, used, false, false, &ids);
        size_t n_naive = naive_spm(tok, text, used, naive);
        char what[64];
        snprintf(what, sizeof what, "random text %d (%zu bytes)", r, used);
        tu_assert_ids_equal(ids, n, naive, n_naive, what);
        sw_free(ids);
    }
}

static void test_naive_reference_mini(void **state)
{
    (void)state;
    eng_tokenizer *tok = mini_tokenizer(&(vocab_spec){.bos = 1});
    static const char *const alphabet[] = {"a", "b", "c", "t", "h", "e", "x", "y", "z",
                                           " ", "q", "\xc3\xa9"};
    compare_with_naive(tok, alphabet, sizeof alphabet / sizeof alphabet[0], 300);
    eng_tokenizer_free(tok);
}

static void test_naive_reference_llama(void **state)
{
    (void)state;
    const char *p = tu_shared_path("vocab/ggml-vocab-llama-spm.gguf");
    if (!p)
        return;
    eng_tokenizer *tok = load_tokenizer_file(p);
    static const char *const alphabet[] = {
        "a", "e", "i", "o", "n", "s", "t", "r", "l", "h", " ", " ", "th", "ing", "er",
        ".", ",", "\n", "1", "2", "\xc3\xa9", "\xe6\x97\xa5", "\xf0\x9f\x98\x80", "\t", "'"};
    compare_with_naive(tok, alphabet, sizeof alphabet / sizeof alphabet[0], 60);
    eng_tokenizer_free(tok);
}

/* The vocabulary `spillway model make` writes: nothing llama-2-specific may
 * be needed. Listed words come out as one "▁word" piece (model_make.h
 * promises the merge intermediates), text round-trips, and the merge order
 * agrees with the naive reference. */
static void test_model_make_vocab(void **state)
{
    (void)state;
    static const int32_t vocab_sizes[] = {ENG_MODEL_MAKE_MIN_VOCAB, 512, 4096};
    for (size_t v = 0; v < sizeof vocab_sizes / sizeof vocab_sizes[0]; v++) {
        eng_model_make_params params = eng_model_make_default_params();
        params.n_embd = 32;
        params.n_layer = 1;
        params.n_head = 2;
        params.n_head_kv = 1;
        params.n_ff = 32;
        params.n_vocab = vocab_sizes[v];
        void *image = NULL;
        size_t image_size = 0;
        eng_gguf *g = NULL;
        eng_tokenizer *tok = NULL;
        sw_error err = {0};
        if (eng_model_make_to_memory(&params, &image, &image_size, &err))
            fail_msg("model make: %s", err.message);
        assert_int_equal(eng_gguf_open_memory(image, image_size, &g, &err), SW_OK);
        if (eng_tokenizer_load(g, &tok, &err))
            fail_msg("load model make vocab: %s", err.message);
        eng_gguf_close(g);
        sw_free(image);
        assert_int_equal(eng_tokenizer_n_vocab(tok), vocab_sizes[v]);

        int32_t the = eng_token_find(tok, "\xe2\x96\x81the", 6);
        if (the >= 0) {
            int32_t *ids = NULL;
            size_t n = tu_tokenize(tok, "the", 3, false, false, &ids);
            tu_assert_ids_equal(ids, n, &the, 1, "the (model make vocab)");
            sw_free(ids);
        }
        static const char text[] = "Once upon a time, the little cat said: \"Hello, world!\"\n"
                                   "\t\xc3\xa9t\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac 42 <s> ~";
        int32_t *ids = NULL;
        size_t n = tu_tokenize(tok, text, sizeof text - 1, true, false, &ids);
        size_t len;
        char *back = eng_detokenize_ex(tok, ids, n, true, &len);
        assert_int_equal(len, sizeof text - 1);
        assert_memory_equal(back, text, len);
        sw_free(back);
        sw_free(ids);

        static const char *const alphabet[] = {"the", " ", "a", "in", "g", "s", "o", "n", "T",
                                               ",", "\n", "q", "\xc3\xa9", "ing", " was"};
        compare_with_naive(tok, alphabet, sizeof alphabet / sizeof alphabet[0], 40);
        eng_tokenizer_free(tok);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mini_merges),
        cmocka_unit_test(test_mini_detokenize),
        cmocka_unit_test(test_streaming_utf8),
        cmocka_unit_test(test_robust_inputs),
        cmocka_unit_test(test_alloc_failures),
        cmocka_unit_test(test_bad_vocabularies),
        cmocka_unit_test(test_vocab_llama_spm),
        cmocka_unit_test(test_vocab_phi3),
        cmocka_unit_test(test_golden_stories260k),
        cmocka_unit_test(test_golden_llama2_tiny),
        cmocka_unit_test(test_naive_reference_mini),
        cmocka_unit_test(test_naive_reference_llama),
        cmocka_unit_test(test_model_make_vocab),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
