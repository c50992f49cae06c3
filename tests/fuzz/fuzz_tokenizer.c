/* fuzz_tokenizer.c - libFuzzer harness for the tokenizers and the
 * detokenizer.
 *
 * Input: one byte of options, then a text (or token ids). Bits 0..2 pick
 * the vocabulary: the built-in one (SPM, the synthetic model's), and those
 * of ../shared/vocab when present (gpt-2, llama-bpe and qwen2: BPE;
 * llama-spm: SPM); an absent one falls back to the built-in vocabulary,
 * so the harness works without ../shared. Bit 3: add BOS; bit 4: match
 * special-token text; bit 5: the rest is token ids (little-endian 16-bit,
 * offset so that ids just outside the vocabulary come up too), decoded.
 *
 * Invariants, encoding: ids inside the vocabulary, BOS first when asked
 * for; the tokens' raw bytes give the text back exactly (SPM: after the
 * space prefix it adds), and decoding gives it back for valid UTF-8
 * (decode(encode(x)) == x), which is what tokenizer.h promises: BPE for
 * any bytes, SPM for valid UTF-8 without U+2581 (its own space); cutting
 * the text into two spans without special parsing changes no id
 * (eng_tokenize_spans). Decoding any ids: the output is valid UTF-8, the
 * streaming detokenizer (eng_detok_push, then flush) gives the same bytes
 * as eng_detokenize_ex, and eng_token_to_bytes reports the length it
 * writes.
 */
#include "fuzzlib.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct fz_vocab {
    const char *file; /* NULL: the built-in vocabulary */
    bool bpe;
    const eng_tokenizer *tok;
    bool tried;
} fz_vocab;

static fz_vocab fz_vocabs[] = {
    {NULL, false, NULL, false},
    {"ggml-vocab-gpt-2.gguf", true, NULL, false},
    {"ggml-vocab-llama-bpe.gguf", true, NULL, false},
    {"ggml-vocab-qwen2.gguf", true, NULL, false},
    {"ggml-vocab-llama-spm.gguf", false, NULL, false},
};
#define FZ_N_VOCABS (sizeof fz_vocabs / sizeof fz_vocabs[0])

static const fz_vocab *vocab_get(size_t which)
{
    fz_vocab *v = &fz_vocabs[which % FZ_N_VOCABS];
    if (!v->tried) {
        v->tried = true;
        v->tok = v->file ? fz_shared_tokenizer(v->file) : fz_builtin_tokenizer();
    }
    if (!v->tok)
        return v->file ? vocab_get(0) : NULL;
    return v;
}

/* Decodes ids both ways (whole and streamed) and checks they agree and
 * are valid UTF-8; returns the whole decoding (sw_free) or NULL. */
static char *decode_checked(const eng_tokenizer *tok, const int32_t *ids, size_t n, bool strip,
                            size_t *len)
{
    char *whole = eng_detokenize_ex(tok, ids, n, strip, len);
    if (!whole)
        return NULL;
    FZ_CHECK(strlen(whole) <= *len && whole[*len] == 0);
    FZ_CHECK(fz_utf8_valid(whole, *len));
    size_t cap = eng_detok_max_bytes(tok);
    char *piece = sw_malloc(cap);
    char *streamed = sw_malloc(*len + 1);
    if (piece && streamed) {
        eng_detok d;
        size_t at = 0;
        eng_detok_reset(&d);
        d.strip_leading_space = strip;
        for (size_t i = 0; i < n; i++) {
            size_t w = eng_detok_push(tok, &d, ids[i], piece, cap);
            FZ_CHECK(w <= cap && w <= *len - at && fz_utf8_valid(piece, w));
            memcpy(streamed + at, piece, w);
            at += w;
        }
        size_t w = eng_detok_flush(&d, piece, cap);
        FZ_CHECK(w <= *len - at);
        memcpy(streamed + at, piece, w);
        at += w;
        FZ_CHECK(at == *len && !memcmp(streamed, whole, at));
    }
    sw_free(piece);
    sw_free(streamed);
    return whole;
}

static void fuzz_decode(const eng_tokenizer *tok, const uint8_t *data, size_t size)
{
    size_t n = size / 2;
    int32_t *ids = sw_malloc((n ? n : 1) * sizeof *ids);
    const int32_t n_vocab = eng_tokenizer_n_vocab(tok);
    if (!ids)
        return;
    for (size_t i = 0; i < n; i++) {
        uint32_t raw = (uint32_t)data[2 * i] | (uint32_t)data[2 * i + 1] << 8;
        /* most ids in the vocabulary, a few just past either end */
        ids[i] = raw % 64 == 63 ? n_vocab - 8 + (int32_t)(raw >> 6) % 16
                                : (int32_t)(raw * 2654435761u % (uint32_t)n_vocab);
        char buf[64];
        size_t need = eng_token_to_bytes(tok, ids[i], NULL, 0);
        size_t wrote = eng_token_to_bytes(tok, ids[i], buf, sizeof buf);
        FZ_CHECK(need == wrote);
        size_t piece_len = 7;
        const char *piece = eng_token_piece(tok, ids[i], &piece_len);
        FZ_CHECK(piece ? strlen(piece) <= piece_len : piece_len == 0);
        FZ_CHECK(!piece == (ids[i] < 0 || ids[i] >= n_vocab));
    }
    size_t len = 0;
    sw_free(decode_checked(tok, ids, n, false, &len));
    sw_free(decode_checked(tok, ids, n, true, &len));
    sw_free(ids);
}

static void fuzz_encode(const fz_vocab *v, const char *text, size_t len, bool add_bos,
                        bool special, uint8_t cut)
{
    const eng_tokenizer *tok = v->tok;
    int32_t *ids = NULL;
    size_t n = 0;
    sw_error err;
    int rc = eng_tokenize(tok, text, len, add_bos, special, &ids, &n, &err);
    if (rc != SW_OK) {
        /* every byte has a token in these vocabularies */
        FZ_CHECK(rc == SW_ENOMEM);
        return;
    }
    FZ_CHECK(ids != NULL);
    const int32_t n_vocab = eng_tokenizer_n_vocab(tok), bos = eng_tokenizer_bos(tok);
    for (size_t i = 0; i < n; i++)
        FZ_CHECK(ids[i] >= 0 && ids[i] < n_vocab);
    const bool with_bos = add_bos && bos >= 0;
    FZ_CHECK(!with_bos || (n >= 1 && ids[0] == bos));
    FZ_CHECK(len == 0 || n > (size_t)with_bos);

    /* SPM writes a space as U+2581 and splits invalid UTF-8 as llama.cpp
     * does (a bad lead byte takes the bytes after it into its byte
     * tokens, a following U+2581 included), so its promises hold for
     * valid UTF-8 without U+2581; BPE's for any bytes. */
    const bool promised =
        v->bpe || (fz_utf8_valid(text, len) && !memmem(text, len, "\xE2\x96\x81", 3));
    if (!special && promised) {
        /* the raw bytes of the tokens are the text (SPM: after its prefix) */
        size_t total = 0;
        for (size_t i = 0; i < n; i++)
            total += eng_token_to_bytes(tok, ids[i], NULL, 0);
        char *raw = sw_malloc(total + 1);
        if (raw) {
            size_t at = 0;
            for (size_t i = 0; i < n; i++)
                at += eng_token_to_bytes(tok, ids[i], raw + at, total - at);
            FZ_CHECK(at == total);
            const size_t prefix = !v->bpe && eng_tokenizer_add_space_prefix(tok) && len > 0;
            FZ_CHECK(total == len + prefix && !memcmp(raw + prefix, text, len));
            FZ_CHECK(!prefix || raw[0] == ' ');
        }
        sw_free(raw);

        /* decode(encode(x)) == x where the family promises it */
        size_t out_len = 0;
        char *back = decode_checked(tok, ids, n, true, &out_len);
        if (back && fz_utf8_valid(text, len))
            FZ_CHECK(out_len == len && !memcmp(back, text, len));
        sw_free(back);

        /* two spans, no special parsing: the same ids as one call. A
         * user-defined token that straddles the cut is not matched across
         * it (each span is searched on its own), so such a cut moves to
         * the token's start. */
        size_t at = len >= 2 ? 1 + cut % (len - 1) : 0;
        const size_t prefix = !v->bpe && eng_tokenizer_add_space_prefix(tok) && len > 0;
        for (size_t i = 0, end = 0; i < n && at > 0; i++) {
            size_t start = end;
            end += eng_token_to_bytes(tok, ids[i], NULL, 0);
            if (eng_token_get_type(tok, ids[i]) == ENG_TOKEN_USER_DEFINED && start < at + prefix &&
                at + prefix < end)
                at = start > prefix ? start - prefix : 0;
        }
        if (at > 0) {
            eng_text_span spans[2] = {{0, at, false}, {at, len - at, false}};
            int32_t *ids2 = NULL;
            size_t n2 = 0;
            rc = eng_tokenize_spans(tok, text, len, spans, 2, add_bos, &ids2, &n2, &err);
            FZ_CHECK(rc == SW_OK || rc == SW_ENOMEM);
            if (rc == SW_OK)
                FZ_CHECK(n2 == n && !memcmp(ids2, ids, n * sizeof *ids));
            sw_free(ids2);
        }
    }
    if (special || !promised) {
        size_t out_len = 0;
        sw_free(decode_checked(tok, ids, n, true, &out_len));
    }
    sw_free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const fz_vocab *v = vocab_get(data[0] & 7);
    if (!v)
        return 0;
    if (data[0] & 32) {
        fuzz_decode(v->tok, data + 1, size - 1);
        return 0;
    }
    /* the text in a buffer of its exact size (no NUL after it), so a read
     * past the end shows under ASan */
    char *text = sw_malloc(size > 1 ? size - 1 : 1);
    if (!text)
        return 0;
    memcpy(text, data + 1, size - 1);
    fuzz_encode(v, text, size - 1, data[0] & 8, data[0] & 16, size > 1 ? data[1] : 0);
    sw_free(text);
    return 0;
}
