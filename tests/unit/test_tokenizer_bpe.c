/* test_tokenizer_bpe.c - the byte-level BPE ("gpt2") tokenizer.
 *
 * Expected results come from independent sources:
 *   - llama.cpp's recorded outputs for three real vocabularies in ../shared
 *     (Llama 3, Qwen2, GPT-2), special-token parsing off, no BOS;
 *   - small vocabularies written here with the GGUF writer, whose
 *     tokenizations are worked out by hand in the comments from the merge
 *     rule (lowest rank first, leftmost on ties);
 *   - properties the pre-tokenizer expressions imply (a contraction or a
 *     digit group is a pre-token of its own, so tokenizing the whole equals
 *     tokenizing the parts), checked on the real vocabularies.
 */
#include "testutil.h"

#include "common/alloc.h"
#include "gguf/gguf.h"
#include "text/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- helpers ------------------------------------------------------------- */

static eng_tokenizer *load_file(const char *path)
{
    eng_gguf *g = NULL;
    eng_tokenizer *tok = NULL;
    sw_error err = {0};
    if (eng_gguf_open(path, &g, &err))
        fail_msg("open %s: %s", path, err.message);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = eng_tokenizer_load(g, &tok, &err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    eng_gguf_close(g); /* the tokenizer must not depend on the mapping */
    if (rc)
        fail_msg("load vocabulary of %s: %s", path, err.message);
    /* Reported, never asserted (tests do not judge speed). */
    print_message("%s: %d tokens loaded in %.1f ms\n", path, eng_tokenizer_n_vocab(tok),
                  (double)(t1.tv_sec - t0.tv_sec) * 1e3 +
                      (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
    return tok;
}

static eng_tokenizer *load_shared(const char *name)
{
    char rel[256];
    snprintf(rel, sizeof rel, "vocab/%s", name);
    const char *p = tu_shared_path(rel);
    return p ? load_file(p) : NULL;
}

/* An independent validator: strict RFC 3629 UTF-8. */
/* Concatenated raw bytes of the ids (eng_token_to_bytes); sw_free. */
static char *ids_to_bytes(const eng_tokenizer *tok, const int32_t *ids, size_t n, size_t *len)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += eng_token_to_bytes(tok, ids[i], NULL, 0);
    char *buf = sw_malloc(total + 1);
    assert_non_null(buf);
    size_t at = 0;
    for (size_t i = 0; i < n; i++)
        at += eng_token_to_bytes(tok, ids[i], buf + at, total - at);
    assert_int_equal(at, total);
    buf[at] = '\0';
    *len = at;
    return buf;
}

/* GPT-2's byte alphabet, written out from its definition independently of
 * the library: printable bytes stand for themselves, the rest, in order,
 * for U+0100, U+0101, ... Returns the UTF-8 of byte b's symbol in out. */
static size_t byte_symbol(int b, char out[3])
{
    int cp;
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) {
        cp = b;
    } else {
        int k = 0;
        for (int x = 0; x < b; x++)
            if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) ||
                  (x >= 0xAE && x <= 0xFF)))
                k++;
        cp = 0x100 + k;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = '\0';
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    out[2] = '\0';
    return 2;
}

/* ---- small vocabularies written with the GGUF writer --------------------- */

/* A byte-level vocabulary: ids 0..255 are the byte symbols (id == byte),
 * then extra pieces, then the given merges. pre NULL leaves the key out;
 * model NULL writes "gpt2". Written to a scratch file, loaded, removed. */
static const char *write_vocab(const char *model, const char *pre, const char *const *extra,
                               const int32_t *extra_types, size_t n_extra,
                               const char *const *merges, size_t n_merges)
{
    size_t n = 256 + n_extra;
    char **texts = sw_calloc(n, sizeof *texts);
    int32_t *types = sw_calloc(n, sizeof *types);
    assert_non_null(texts);
    assert_non_null(types);
    for (int b = 0; b < 256; b++) {
        char sym[3];
        byte_symbol(b, sym);
        texts[b] = sw_strdup(sym);
        types[b] = 1;
    }
    for (size_t i = 0; i < n_extra; i++) {
        texts[256 + i] = sw_strdup(extra[i]);
        types[256 + i] = extra_types ? extra_types[i] : 1;
    }
    eng_gguf_writer *w = eng_gguf_writer_create();
    assert_non_null(w);
    assert_int_equal(eng_gguf_writer_set_str(w, "general.architecture", "llama"), SW_OK);
    assert_int_equal(eng_gguf_writer_set_str(w, "tokenizer.ggml.model", model ? model : "gpt2"),
                     SW_OK);
    if (pre)
        assert_int_equal(eng_gguf_writer_set_str(w, "tokenizer.ggml.pre", pre), SW_OK);
    assert_int_equal(eng_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens",
                                                 (const char *const *)texts, n), SW_OK);
    assert_int_equal(eng_gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, n),
                     SW_OK);
    assert_int_equal(eng_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, n_merges),
                     SW_OK);
    const char *path = tu_tmp_path("bpe-vocab.gguf");
    assert_int_equal(eng_gguf_writer_write(w, path, NULL), SW_OK);
    eng_gguf_writer_free(w);
    for (size_t i = 0; i < n; i++)
        sw_free(texts[i]);
    sw_free(texts);
    sw_free(types);
    return path;
}

static int write_and_load(const char *model, const char *pre, const char *const *extra,
                          const int32_t *extra_types, size_t n_extra,
                          const char *const *merges, size_t n_merges, eng_tokenizer **tok,
                          sw_error *err)
{
    const char *path = write_vocab(model, pre, extra, extra_types, n_extra, merges, n_merges);
    eng_gguf *g = NULL;
    assert_int_equal(eng_gguf_open(path, &g, NULL), SW_OK);
    *tok = NULL;
    int rc = eng_tokenizer_load(g, tok, err);
    eng_gguf_close(g);
    remove(path);
    return rc;
}

static void test_merge_order(void **state)
{
    (void)state;
    /* Pieces 256 "ab", 257 "bc", 258 "abc", 259 "aa". */
    static const char *const extra[] = {"ab", "bc", "abc", "aa"};
    eng_tokenizer *tok = NULL;
    int32_t *ids;
    size_t n;

    /* "b c" outranks "a b": "abc" -> a + bc -> (rank 2 "a bc") abc. Without
     * the "a bc" merge it would stay a, bc. */
    static const char *const m1[] = {"b c", "a b", "a bc"};
    assert_int_equal(write_and_load(NULL, "gpt2", extra, NULL, 4, m1, 3, &tok, NULL), SW_OK);
    n = tu_tokenize(tok, "abc", 3, false, false, &ids);
    tu_assert_ids_equal(ids, n, (int32_t[]){258}, 1, "abc, b c first");
    sw_free(ids);
    /* "abab": a-b merges twice (rank 1) -> ab ab; no "ab ab" merge. */
    n = tu_tokenize(tok, "abab", 4, false, false, &ids);
    tu_assert_ids_equal(ids, n, (int32_t[]){256, 256}, 2, "abab");
    sw_free(ids);
    eng_tokenizer_free(tok);

    /* The other order: "a b" first, then "ab c" -> abc; "bc" never forms. */
    static const char *const m2[] = {"a b", "b c", "ab c"};
    assert_int_equal(write_and_load(NULL, "gpt2", extra, NULL, 4, m2, 3, &tok, NULL), SW_OK);
    n = tu_tokenize(tok, "abc", 3, false, false, &ids);
    tu_assert_ids_equal(ids, n, (int32_t[]){258}, 1, "abc, a b first");
    sw_free(ids);
    /* "bcab": b c (rank 1) vs c a (none) vs a b (rank 0): a b first, then b c:
     * bc ab. */
    n = tu_tokenize(tok, "bcab", 4, false, false, &ids);
    tu_assert_ids_equal(ids, n, (int32_t[]){257, 256}, 2, "bcab");
    sw_free(ids);
    eng_tokenizer_free(tok);

    /* Ties go to the leftmost pair: "aaa" with "a a" -> aa a. */
    static const char *const m3[] = {"a a"};
    assert_int_equal(write_and_load(NULL, "gpt2", extra, NULL, 4, m3, 1, &tok, NULL), SW_OK);
    n = tu_tokenize(tok, "aaa", 3, false, false, &ids);
    tu_assert_ids_equal(ids, n, (int32_t[]){259, 'a'}, 2, "aaa");
    sw_free(ids);
    /* A long word is fine (the heap keeps it n log n) and pairs up. */
    size_t long_n = 100001;
    char *aaa = sw_malloc(long_n);
    assert_non_null(aaa);
    memset(aaa, 'a', long_n);
    n = tu_tokenize(tok, aaa, long_n, false, false, &ids);
    assert_int_equal(n, long_n / 2 + 1);
    for (size_t i = 0; i + 1 < n; i++)
        assert_int_equal(ids[i], 259);
    assert_int_equal(ids[n - 1], 'a');
    sw_free(ids);
    sw_free(aaa);
    eng_tokenizer_free(tok);
}

static void test_byte_alphabet(void **state)
{
    (void)state;
    static const char *const none[] = {"a b"};
    eng_tokenizer *tok = NULL;
    assert_int_equal(write_and_load(NULL, NULL, NULL, NULL, 0, none, 1, &tok, NULL), SW_OK);
    /* Every byte is its own token (id == byte): the library's alphabet
     * agrees with the one written above from the definition. */
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        int32_t *ids;
        size_t n = tu_tokenize(tok, &c, 1, false, false, &ids);
        assert_int_equal(n, 1);
        assert_int_equal(ids[0], b);
        char back[4];
        assert_int_equal(eng_token_to_bytes(tok, ids[0], back, sizeof back), 1);
        assert_int_equal((uint8_t)back[0], b);
        sw_free(ids);
    }
    /* Spot checks from the definition: space is U+0120 "Ġ", newline U+010A. */
    assert_int_equal(eng_token_find(tok, "\xC4\xA0", 2), ' ');
    assert_int_equal(eng_token_find(tok, "\xC4\x8A", 2), '\n');
    /* No pre key: "default", no BOS, nothing added. */
    assert_false(eng_tokenizer_add_bos(tok));
    assert_false(eng_tokenizer_add_space_prefix(tok));
    assert_int_equal(eng_tokenizer_bos(tok), -1);
    eng_tokenizer_free(tok);
}

static void test_streaming_utf8(void **state)
{
    (void)state;
    static const char *const none[] = {"a b"};
    eng_tokenizer *tok = NULL;
    assert_int_equal(write_and_load(NULL, "qwen2", NULL, NULL, 0, none, 1, &tok, NULL), SW_OK);
    /* With no useful merges every multi-byte character is split over
     * several byte tokens: the stream must hold them back. */
    const char *text = "h\xC3\xA9llo \xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\xA6\x99!";
    size_t len = strlen(text);
    int32_t *ids;
    size_t n = tu_tokenize(tok, text, len, false, false, &ids);
    assert_int_equal(n, len);
    eng_detok d;
    eng_detok_reset(&d);
    size_t cap = eng_detok_max_bytes(tok);
    char *piece = sw_malloc(cap);
    char all[128];
    size_t at = 0;
    assert_non_null(piece);
    for (size_t i = 0; i < n; i++) {
        size_t k = eng_detok_push(tok, &d, ids[i], piece, cap);
        assert_true(tu_valid_utf8(piece, k));
        assert_true(at + k < sizeof all);
        memcpy(all + at, piece, k);
        at += k;
    }
    at += eng_detok_flush(&d, all + at, sizeof all - at);
    assert_int_equal(at, len);
    assert_memory_equal(all, text, len);
    sw_free(piece);
    sw_free(ids);
    eng_tokenizer_free(tok);
}

static void test_load_errors(void **state)
{
    (void)state;
    static const char *const merges[] = {"a b"};
    eng_tokenizer *tok = NULL;
    sw_error err = {0};

    assert_int_equal(write_and_load(NULL, "nonsense-pre", NULL, NULL, 0, merges, 1, &tok, &err),
                     SW_EUNSUPPORTED);
    assert_null(tok);
    assert_non_null(strstr(err.message, "nonsense-pre"));
    assert_non_null(strstr(err.message, "llama-bpe")); /* lists what works */
    assert_non_null(strstr(err.message, "qwen2"));

    sw_error_clear(&err);
    assert_int_equal(write_and_load("rwkv", "gpt2", NULL, NULL, 0, merges, 1, &tok, &err),
                     SW_EUNSUPPORTED);
    assert_null(tok);
    assert_non_null(strstr(err.message, "rwkv"));
    assert_non_null(strstr(err.message, "gpt2"));

    /* A merge without a separator is a broken file, not a crash. */
    static const char *const bad[] = {"a b", "ab"};
    sw_error_clear(&err);
    assert_int_equal(write_and_load(NULL, "gpt2", NULL, NULL, 0, bad, 2, &tok, &err),
                     SW_EFORMAT);
    assert_null(tok);
    assert_non_null(strstr(err.message, "merge 1"));
}

static void test_user_defined_and_control(void **state)
{
    (void)state;
    /* 256 <|ctl|> CONTROL, 257 <u> USER_DEFINED. */
    static const char *const extra[] = {"<|ctl|>", "<u>"};
    static const int32_t types[] = {3, 4};
    static const char *const merges[] = {"a b"};
    eng_tokenizer *tok = NULL;
    assert_int_equal(write_and_load(NULL, "llama-bpe", extra, types, 2, merges, 1, &tok, NULL),
                     SW_OK);
    int32_t *ids;
    size_t n = tu_tokenize(tok, "x<|ctl|>y<u>", 12, false, true, &ids);
    tu_assert_ids_equal(ids, n, (int32_t[]){'x', 256, 'y', 257}, 4, "parse_special on");
    char *text = eng_detokenize(tok, ids, n);
    assert_string_equal(text, "xy<u>"); /* control renders nothing */
    sw_free(text);
    sw_free(ids);
    /* Off: the control text is plain text; user-defined still matches. */
    n = tu_tokenize(tok, "<|ctl|><u>", 10, false, false, &ids);
    assert_int_equal(n, 8);
    assert_int_equal(ids[0], '<');
    assert_int_equal(ids[7], 257);
    sw_free(ids);
    eng_tokenizer_free(tok);
}

/* Every allocation of loading and tokenizing can fail cleanly. */
static void test_alloc_failures(void **state)
{
    (void)state;
    static const char *const extra[] = {"ab", "<|c|>"};
    static const int32_t types[] = {1, 3};
    static const char *const merges[] = {"a b", "Ġ ab"};
    const char *path = write_vocab(NULL, "llama-bpe", extra, types, 2, merges, 2);
    eng_gguf *g = NULL;
    sw_error err = {0};
    assert_int_equal(eng_gguf_open(path, &g, &err), SW_OK);
    eng_tokenizer *tok = NULL;
    for (long k = 0;; k++) {
        sw_alloc_fail_after(k);
        int rc = eng_tokenizer_load(g, &tok, &err);
        sw_alloc_fail_after(-1);
        if (rc == SW_OK)
            break;
        assert_int_equal(rc, SW_ENOMEM);
        assert_null(tok);
    }
    eng_gguf_close(g);
    remove(path);
    static const char text[] = "x<|c|> ab \xE4\xB8\x96 123 abab'S\n\n";
    for (long k = 0;; k++) {
        int32_t *ids = NULL;
        size_t n = 0;
        sw_alloc_fail_after(k);
        int rc = eng_tokenize(tok, text, sizeof text - 1, true, true, &ids, &n, &err);
        sw_alloc_fail_after(-1);
        if (rc == SW_OK) {
            size_t len;
            char *back = ids_to_bytes(tok, ids, n, &len);
            assert_int_equal(len, sizeof text - 1 - 5); /* <|c|> renders nothing */
            sw_free(back);
            sw_free(ids);
            break;
        }
        assert_int_equal(rc, SW_ENOMEM);
        assert_null(ids);
    }
    eng_tokenizer_free(tok);
}

/* ---- llama.cpp's vocabulary test vectors --------------------------------- */

static void check_vectors_at(const char *gguf_path, const char *name, int expected_cases);

static void check_vectors(const char *name, int expected_cases)
{
    const char *p = tu_shared_path(name);
    if (!p)
        return;
    char gguf_path[4096];
    snprintf(gguf_path, sizeof gguf_path, "%s", p);
    check_vectors_at(gguf_path, name, expected_cases);
}

/* Every case of the .inp/.out pair beside gguf_path. */
static void check_vectors_at(const char *gguf_path, const char *name, int expected_cases)
{
    size_t n_cases;
    tu_vocab_case *cases = tu_vocab_cases_load(gguf_path, &n_cases);
    eng_tokenizer *tok = load_file(gguf_path);
    int n_failed = 0;
    for (size_t c = 0; c < n_cases; c++) {
        const int32_t *want = cases[c].ids;
        size_t n_want = cases[c].n_ids;
        int32_t *ids = NULL;
        size_t n = tu_tokenize(tok, cases[c].text, cases[c].len, false, false, &ids);
        if (n != n_want || memcmp(ids, want, n * sizeof *ids) != 0) {
            print_error("%s case %zu (%.40s):\n  got: ", name, c, cases[c].text);
            for (size_t i = 0; i < n; i++)
                print_error(" %d", ids[i]);
            print_error("\n want:");
            for (size_t i = 0; i < n_want; i++)
                print_error(" %d", want[i]);
            print_error("\n");
            n_failed++;
        }
        /* And back, exactly. */
        size_t len;
        char *text = eng_detokenize_ex(tok, ids, n, true, &len);
        assert_non_null(text);
        if (len != cases[c].len || memcmp(text, cases[c].text, len) != 0) {
            print_error("%s case %zu: detokenized to \"%s\"\n", name, c, text);
            n_failed++;
        }
        sw_free(text);
        sw_free(ids);
    }
    assert_int_equal(n_failed, 0);
    assert_int_equal(n_cases, (size_t)expected_cases);
    eng_tokenizer_free(tok);
    tu_vocab_cases_free(cases, n_cases);
}

static void test_vectors_llama_bpe(void **state)
{
    (void)state;
    check_vectors("vocab/ggml-vocab-llama-bpe.gguf", 46);
}

static void test_vectors_qwen2(void **state)
{
    (void)state;
    check_vectors("vocab/ggml-vocab-qwen2.gguf", 46);
}

static void test_vectors_gpt2(void **state)
{
    (void)state;
    check_vectors("vocab/ggml-vocab-gpt-2.gguf", 46);
}

/* gpt-4o's pre-tokenizer (gpt-oss's o200k vocabulary), which no
 * vocabulary in ../shared names: Llama 3's pieces and merges with
 * tokenizer.ggml.pre rewritten to "gpt-4o", on llama-bpe's test texts and
 * more (mixed case, accents, contractions in any case, slashes after
 * newlines, scripts without case, random mixtures), against the ids
 * llama.cpp gives the same vocabulary under that key
 * (tests/data/pretok-gpt-4o.out, bench/record-pretok.sh). */
static void test_vectors_gpt4o(void **state)
{
    (void)state;
    const char *shared = tu_shared_path("vocab/ggml-vocab-llama-bpe.gguf");
    if (!shared)
        return;
    char src[4096], inp[4096], out[4096];
    snprintf(src, sizeof src, "%s", shared);
    const char *data_inp = tu_data_path("pretok-gpt-4o.inp");
    if (!data_inp)
        return;
    snprintf(inp, sizeof inp, "%s", data_inp);
    snprintf(out, sizeof out, "%.*s.out", (int)(strlen(inp) - 4), inp);
    eng_gguf *g = NULL;
    assert_int_equal(eng_gguf_open(src, &g, NULL), SW_OK);
    eng_gguf_writer *w = eng_gguf_writer_create();
    assert_non_null(w);
    for (int64_t i = 0; i < eng_gguf_n_kv(g); i++) {
        const char *key = eng_gguf_kv_key(g, i);
        if (strcmp(key, "tokenizer.ggml.pre") == 0)
            assert_int_equal(eng_gguf_writer_set_str(w, key, "gpt-4o"), SW_OK);
        else
            assert_int_equal(eng_gguf_writer_copy_kv(w, g, i, key), SW_OK);
    }
    char path[4096], copy[4200];
    snprintf(path, sizeof path, "%s", tu_tmp_path("vocab-gpt-4o.gguf"));
    assert_int_equal(eng_gguf_writer_write(w, path, NULL), SW_OK);
    eng_gguf_writer_free(w);
    eng_gguf_close(g);
    const char *const ext[2] = {".inp", ".out"};
    const char *const from[2] = {inp, out};
    for (int k = 0; k < 2; k++) {
        size_t len;
        char *text = tu_read_file(from[k], &len);
        assert_non_null(text);
        snprintf(copy, sizeof copy, "%s%s", path, ext[k]);
        FILE *f = fopen(copy, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(text, 1, len, f), len);
        fclose(f);
        sw_free(text);
    }
    check_vectors_at(path, "gpt-4o", 98);
}

/* The same pre-tokenizer on a vocabulary whose tokens show its cuts
 * (bench/pair_vocab.c: a token for every pair of a few characters, é and
 * É, so a merge that a cut forbids shows in the ids): mixed case, accented
 * capitals, contractions after letters, slashes after newlines, and seeded
 * random mixtures of those characters, against llama.cpp's ids
 * (tests/data/pretok-pairs-gpt-4o.gguf and its vectors, bench/record-
 * pretok.sh). Under llama-bpe's expression 19 of the 78 come out
 * otherwise. */
static void test_vectors_gpt4o_pairs(void **state)
{
    (void)state;
    const char *p = tu_data_path("pretok-pairs-gpt-4o.gguf");
    if (!p)
        return;
    char path[4096];
    snprintf(path, sizeof path, "%s", p);
    check_vectors_at(path, "gpt-4o pairs", 78);
}

/* ---- properties on the real vocabularies --------------------------------- */

/* tokenize(whole) == tokenize(part 1) + tokenize(part 2) + ... */
static void assert_splits(const eng_tokenizer *tok, const char *whole, const char *const *parts,
                          size_t n_parts)
{
    int32_t want[256];
    size_t n_want = 0;
    for (size_t i = 0; i < n_parts; i++) {
        int32_t *ids;
        size_t n = tu_tokenize(tok, parts[i], strlen(parts[i]), false, false, &ids);
        assert_true(n_want + n <= 256);
        memcpy(want + n_want, ids, n * sizeof *ids);
        n_want += n;
        sw_free(ids);
    }
    int32_t *ids;
    size_t n = tu_tokenize(tok, whole, strlen(whole), false, false, &ids);
    tu_assert_ids_equal(ids, n, want, n_want, whole);
    sw_free(ids);
}

static void test_llama3_special_and_pretok(void **state)
{
    (void)state;
    eng_tokenizer *tok = load_shared("ggml-vocab-llama-bpe.gguf");
    if (!tok)
        return;
    int32_t bot = eng_token_find(tok, "<|begin_of_text|>", 17);
    int32_t hello = eng_token_find(tok, "Hello", 5);
    assert_int_equal(bot, eng_tokenizer_bos(tok));
    assert_int_equal(eng_token_get_type(tok, bot), ENG_TOKEN_CONTROL);
    assert_true(hello >= 0);
    /* Llama 3 adds BOS by default (no add_bos_token key in this file). */
    assert_true(eng_tokenizer_add_bos(tok));

    int32_t *ids;
    size_t n = tu_tokenize(tok, "<|begin_of_text|>Hello", 22, false, true, &ids);
    tu_assert_ids_equal(ids, n, (int32_t[]){bot, hello}, 2, "special on");
    sw_free(ids);
    n = tu_tokenize(tok, "Hello", 5, true, false, &ids);
    tu_assert_ids_equal(ids, n, (int32_t[]){bot, hello}, 2, "add_bos");
    char *text = eng_detokenize(tok, ids, n);
    assert_string_equal(text, "Hello"); /* BOS renders nothing */
    sw_free(text);
    sw_free(ids);
    /* Off: plain text, not the special id, and it reads back the same. */
    n = tu_tokenize(tok, "<|begin_of_text|>Hello", 22, false, false, &ids);
    assert_true(n > 2);
    for (size_t i = 0; i < n; i++)
        assert_int_not_equal(ids[i], bot);
    size_t len;
    text = eng_detokenize_ex(tok, ids, n, true, &len);
    assert_int_equal(len, 22);
    assert_memory_equal(text, "<|begin_of_text|>Hello", 22);
    sw_free(text);
    sw_free(ids);

    /* \p{N}{1,3}: digits in groups of three. */
    assert_splits(tok, "1234567", (const char *const[]){"123", "456", "7"}, 3);
    /* (?i:'t): "'T" is a contraction of its own, case-insensitively. */
    assert_splits(tok, "DON'T", (const char *const[]){"DON", "'T"}, 2);
    /* [^\r\n\p{L}\p{N}]?\p{L}+: a punctuation mark leads the word. */
    assert_splits(tok, "x\"word", (const char *const[]){"x", "\"word"}, 2);
    eng_tokenizer_free(tok);
}

static void test_qwen2_and_gpt2_pretok(void **state)
{
    (void)state;
    eng_tokenizer *tok = load_shared("ggml-vocab-qwen2.gguf");
    if (!tok)
        return;
    /* Qwen2 adds no BOS by default; \p{N}: digits one by one. */
    assert_false(eng_tokenizer_add_bos(tok));
    assert_splits(tok, "1234", (const char *const[]){"1", "2", "3", "4"}, 4);
    assert_splits(tok, "I'M", (const char *const[]){"I", "'M"}, 2);
    int32_t im_start = eng_token_find(tok, "<|im_start|>", 12);
    assert_true(im_start >= 0);
    int32_t *ids;
    size_t n = tu_tokenize(tok, "<|im_start|>user", 16, false, true, &ids);
    assert_true(n >= 2);
    assert_int_equal(ids[0], im_start);
    sw_free(ids);
    eng_tokenizer_free(tok);

    tok = load_shared("ggml-vocab-gpt-2.gguf");
    if (!tok)
        return;
    assert_false(eng_tokenizer_add_bos(tok));
    /* GPT-2's contractions are case-sensitive: "'T" is punctuation then a
     * letter, while "'t" is one pre-token. */
    assert_splits(tok, "DON'T", (const char *const[]){"DON", "'", "T"}, 3);
    assert_splits(tok, "don't", (const char *const[]){"don", "'t"}, 2);
    /* \s+(?!\S): of three spaces before a word, the last one joins it. */
    assert_splits(tok, "a   b", (const char *const[]){"a", "  ", " b"}, 3);
    eng_tokenizer_free(tok);
}

static void test_invalid_utf8(void **state)
{
    (void)state;
    static const char *const files[] = {"ggml-vocab-llama-bpe.gguf", "ggml-vocab-qwen2.gguf",
                                        "ggml-vocab-gpt-2.gguf"};
    static const char input[] = "ok \xFF\xFE abc\xC3 \xE2\x82 x\xF0\x9F\x98 \xED\xA0\x80"
                                "\xC0\xAF'\xF5 12\x80";
    const size_t len = sizeof input - 1;
    for (size_t f = 0; f < 3; f++) {
        eng_tokenizer *tok = load_shared(files[f]);
        if (!tok)
            return;
        int32_t *ids;
        size_t n = tu_tokenize(tok, input, len, false, false, &ids);
        size_t back_len;
        char *back = ids_to_bytes(tok, ids, n, &back_len);
        assert_int_equal(back_len, len);
        assert_memory_equal(back, input, len);
        sw_free(back);
        /* The detokenizer repairs it: valid UTF-8 out. */
        char *text = eng_detokenize_ex(tok, ids, n, true, &back_len);
        assert_non_null(text);
        assert_true(tu_valid_utf8(text, back_len));
        sw_free(text);
        sw_free(ids);

        /* Streaming a multi-byte text token by token never emits half a
         * character, whatever the merges split. */
        const char *multi = "Äpfel 🦙🦙 нещо на Български 世界 ½";
        n = tu_tokenize(tok, multi, strlen(multi), false, false, &ids);
        eng_detok d;
        eng_detok_reset(&d);
        size_t cap = eng_detok_max_bytes(tok);
        char *piece = sw_malloc(cap);
        assert_non_null(piece);
        for (size_t i = 0; i < n; i++) {
            size_t k = eng_detok_push(tok, &d, ids[i], piece, cap);
            assert_true(tu_valid_utf8(piece, k));
        }
        assert_int_equal(eng_detok_flush(&d, piece, cap), 0);
        sw_free(piece);
        sw_free(ids);
        eng_tokenizer_free(tok);
    }
}

/* ---- a naive reference for the merge rule -------------------------------- */

/* Merges as "left right" strings sorted bytewise, with their ranks, for
 * bsearch: a lookup independent of the library's hash table. */
typedef struct naive_merge {
    char *text;
    long rank;
} naive_merge;

static int naive_cmp(const void *a, const void *b)
{
    return strcmp(((const naive_merge *)a)->text, ((const naive_merge *)b)->text);
}

/* The merge rule as written in the GPT-2 description, O(n^2) per word:
 * while some adjacent pair has a rank, merge the lowest-ranked (leftmost)
 * one. Words here are ASCII letters, which are their own byte symbols. */
static size_t naive_bpe(const naive_merge *m, size_t n_merges, const char *word,
                        char sym[][64], size_t n_sym_max)
{
    size_t n = strlen(word);
    assert_true(n <= n_sym_max);
    for (size_t i = 0; i < n; i++) {
        sym[i][0] = word[i];
        sym[i][1] = '\0';
    }
    for (;;) {
        long best = -1;
        size_t at = 0;
        for (size_t i = 0; i + 1 < n; i++) {
            char key[130];
            snprintf(key, sizeof key, "%s %s", sym[i], sym[i + 1]);
            naive_merge probe = {key, 0};
            const naive_merge *hit = bsearch(&probe, m, n_merges, sizeof *m, naive_cmp);
            if (hit && (best < 0 || hit->rank < best)) {
                best = hit->rank;
                at = i;
            }
        }
        if (best < 0)
            return n;
        size_t la = strlen(sym[at]), lb = strlen(sym[at + 1]);
        assert_true(la + lb < 64);
        memcpy(sym[at] + la, sym[at + 1], lb + 1);
        memmove(sym + at + 1, sym + at + 2, (n - at - 2) * sizeof sym[0]);
        n--;
    }
}

static void check_naive(const char *name)
{
    char rel[256];
    snprintf(rel, sizeof rel, "vocab/%s", name);
    const char *p = tu_shared_path(rel);
    if (!p)
        return;
    eng_gguf *g = NULL;
    assert_int_equal(eng_gguf_open(p, &g, NULL), SW_OK);
    eng_tokenizer *tok = NULL;
    assert_int_equal(eng_tokenizer_load(g, &tok, NULL), SW_OK);
    int64_t kv = eng_gguf_find_key(g, "tokenizer.ggml.merges");
    eng_gguf_value_type et;
    uint64_t n_merges;
    assert_int_equal(eng_gguf_get_arr(g, "tokenizer.ggml.merges", &et, &n_merges, NULL), SW_OK);
    naive_merge *m = sw_calloc(n_merges, sizeof *m);
    assert_non_null(m);
    size_t kept = 0;
    for (uint64_t i = 0; i < n_merges; i++) {
        const char *str;
        size_t len;
        assert_int_equal(eng_gguf_arr_str(g, kv, i, &str, &len), SW_OK);
        m[kept].text = sw_strndup(str, len);
        m[kept].rank = (long)i;
        kept++;
    }
    qsort(m, kept, sizeof *m, naive_cmp);
    /* A duplicate merge keeps its first rank. */
    for (size_t i = 1; i < kept; i++)
        if (strcmp(m[i].text, m[i - 1].text) == 0 && m[i].rank > m[i - 1].rank)
            m[i].rank = m[i - 1].rank;
    eng_gguf_close(g);

    /* Random lowercase words: one pre-token each under every expression. */
    unsigned seed = 12345;
    static char sym[64][64];
    for (int t = 0; t < 300; t++) {
        char word[48];
        seed = seed * 1103515245u + 12345u;
        size_t len = 1 + (seed >> 16) % 40;
        for (size_t i = 0; i < len; i++) {
            seed = seed * 1103515245u + 12345u;
            /* Skewed towards common letters so that long merges happen. */
            static const char letters[] = "etaoinshrdlucmfwypvbgkjqxz";
            word[i] = letters[(seed >> 16) % ((seed >> 8) % 3 ? 10 : 26)];
        }
        word[len] = '\0';
        size_t n_sym = naive_bpe(m, kept, word, sym, 64);
        int32_t want[64];
        for (size_t i = 0; i < n_sym; i++) {
            want[i] = eng_token_find(tok, sym[i], strlen(sym[i]));
            assert_true(want[i] >= 0);
        }
        int32_t *ids;
        size_t n = tu_tokenize(tok, word, len, false, false, &ids);
        tu_assert_ids_equal(ids, n, want, n_sym, word);
        sw_free(ids);
    }
    for (size_t i = 0; i < kept; i++)
        sw_free(m[i].text);
    sw_free(m);
    eng_tokenizer_free(tok);
}

static void test_naive_reference(void **state)
{
    (void)state;
    /* Not llama-bpe: its whole-word lookup comes before the merges. */
    check_naive("ggml-vocab-qwen2.gguf");
    check_naive("ggml-vocab-gpt-2.gguf");
}

/* Random bytes (spaces, digits, newlines, punctuation, invalid UTF-8): the
 * ids always stand for exactly the input bytes. */
static void test_random_bytes(void **state)
{
    (void)state;
    static const char *const files[] = {"ggml-vocab-llama-bpe.gguf", "ggml-vocab-qwen2.gguf",
                                        "ggml-vocab-gpt-2.gguf"};
    static const char alphabet[] = " \n\r\t'sStT0123456789aZ!.,\"\xC3\xA9\xE4\xB8\x96\xF0\x9F";
    for (size_t f = 0; f < 3; f++) {
        eng_tokenizer *tok = load_shared(files[f]);
        if (!tok)
            return;
        unsigned seed = 99 + (unsigned)f;
        for (int t = 0; t < 200; t++) {
            char text[96];
            seed = seed * 1103515245u + 12345u;
            size_t len = (seed >> 16) % sizeof text;
            for (size_t i = 0; i < len; i++) {
                seed = seed * 1103515245u + 12345u;
                text[i] = (seed >> 8) % 8 == 0 ? (char)(seed >> 16)
                                                : alphabet[(seed >> 16) % (sizeof alphabet - 1)];
            }
            int32_t *ids;
            size_t n = tu_tokenize(tok, text, len, false, false, &ids);
            size_t back_len;
            char *back = ids_to_bytes(tok, ids, n, &back_len);
            assert_int_equal(back_len, len);
            assert_memory_equal(back, text, len);
            sw_free(back);
            sw_free(ids);
        }
        eng_tokenizer_free(tok);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_merge_order),
        cmocka_unit_test(test_byte_alphabet),
        cmocka_unit_test(test_streaming_utf8),
        cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_user_defined_and_control),
        cmocka_unit_test(test_alloc_failures),
        cmocka_unit_test(test_vectors_llama_bpe),
        cmocka_unit_test(test_vectors_qwen2),
        cmocka_unit_test(test_vectors_gpt2),
        cmocka_unit_test(test_vectors_gpt4o),
        cmocka_unit_test(test_vectors_gpt4o_pairs),
        cmocka_unit_test(test_llama3_special_and_pretok),
        cmocka_unit_test(test_qwen2_and_gpt2_pretok),
        cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_naive_reference),
        cmocka_unit_test(test_random_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
