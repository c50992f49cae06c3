/* tokenizer.c - the SentencePiece ("llama") tokenizer and the streaming
 * detokenizer behind tokenizer.h.
 *
 * The vocabulary is copied out of the GGUF into one blob plus per-token
 * arrays, with an open-addressing hash table for piece -> id, so loading a
 * 32k or 150k vocabulary is a single linear pass and every lookup during
 * tokenization is O(1).
 *
 * Tokenization reproduces llama.cpp's SPM behaviour (checked against its
 * recorded outputs in ../shared), which is SentencePiece's BPE mode:
 *   1. Special-token partition: the text is cut at literal occurrences of
 *      special tokens, longest token text first (ties: lower id first), each
 *      token splitting every plain-text fragment left so far at its
 *      leftmost non-overlapping occurrences. USER_DEFINED tokens are always
 *      matched (as Hugging Face tokenizers and llama.cpp do); CONTROL and
 *      UNKNOWN tokens only when parse_special is set.
 *   2. Each plain fragment that is the first one, or follows a special
 *      token, gets a space prefix when add_space_prefix is set; spaces become
 *      U+2581 ("▁").
 *   3. The fragment is split into UTF-8 characters (length from the lead
 *      byte alone, cut at the end of the text: invalid sequences simply fall
 *      through to byte tokens), then the adjacent pair whose concatenation
 *      is a vocabulary piece with the highest score is merged, repeatedly
 *      (ties: leftmost pair), driven by a binary heap of candidate pairs with
 *      lazy invalidation: O(n log n), no quadratic rescans.
 *   4. A final symbol that is not a piece is emitted byte by byte through a
 *      byte -> token table (<0xNN>, else the one-byte piece, else unk).
 *
 * The byte-level BPE of "gpt2"-style vocabularies lives in tokenizer_bpe.c
 * (the struct is shared through tokenizer-impl.h): loading dispatches on
 * tokenizer.ggml.model, eng_tokenize and the detokenizer on `algo`. The
 * vocabulary, the special-token partition, the EOG set and the streaming
 * UTF-8 hold-back are common to both.
 */
#include "text/tokenizer-impl.h"

#include "common/alloc.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Limits that keep every index in int32 and every size computation far from
 * overflow. A 256 MiB prompt is far beyond any context length. */
#define TOK_MAX_VOCAB ((uint64_t)1 << 24)
#define TOK_MAX_PIECE_BYTES ((uint64_t)1 << 16)
#define TOK_MAX_INPUT_BYTES ((size_t)1 << 28)

/* U+2581 LOWER ONE EIGHTH BLOCK: SentencePiece's visible space. */
static const char spm_space[3] = {(char)0xE2, (char)0x96, (char)0x81};
/* U+2585 LOWER FIVE EIGHTHS BLOCK: how llama.cpp renders the unknown token. */
static const char unk_glyph[3] = {(char)0xE2, (char)0x96, (char)0x85};


/* ---- vocabulary lookup -------------------------------------------------- */

static uint64_t hash_bytes(const char *s, size_t n)
{
    /* FNV-1a with a final avalanche: cheap, and good enough on short pieces
     * for a table kept at most half full. */
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 0x100000001b3ull;
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

static const char *piece_ptr(const eng_tokenizer *tok, int32_t id)
{
    return tok->blob + tok->piece_off[id];
}

/* The id of piece s[0..n), or -1. */
static int32_t vocab_find(const eng_tokenizer *tok, const char *s, size_t n)
{
    size_t slot = (size_t)hash_bytes(s, n) & tok->hash_mask;
    for (;;) {
        int32_t id = tok->hash_slots[slot];
        if (id < 0)
            return -1;
        if (tok->piece_len[id] == n && memcmp(piece_ptr(tok, id), s, n) == 0)
            return id;
        slot = (slot + 1) & tok->hash_mask;
    }
}

/* Inserts id; a later duplicate of the same piece replaces the earlier one,
 * as in llama.cpp's token_to_id map (so lookups, and the score used for a
 * merge, agree with the reference on vocabularies with duplicates). */
static void vocab_insert(eng_tokenizer *tok, int32_t id)
{
    const char *s = piece_ptr(tok, id);
    size_t n = tok->piece_len[id];
    size_t slot = (size_t)hash_bytes(s, n) & tok->hash_mask;
    for (;;) {
        int32_t other = tok->hash_slots[slot];
        if (other < 0 || (tok->piece_len[other] == n && memcmp(piece_ptr(tok, other), s, n) == 0)) {
            tok->hash_slots[slot] = id;
            return;
        }
        slot = (slot + 1) & tok->hash_mask;
    }
}

/* ---- loading ------------------------------------------------------------ */

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* Parses "<0xNN>"; -1 when the piece has another shape. */
static int parse_byte_piece(const char *s, size_t n)
{
    if (n != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>')
        return -1;
    int hi = hex_digit(s[3]), lo = hex_digit(s[4]);
    if (hi < 0 || lo < 0)
        return -1;
    return hi * 16 + lo;
}

/* Reads an optional token-id key. Absent -> def. A stored -1 (or its u32
 * image, which some converters write) means "none". Anything else must be a
 * valid id: a model whose BOS points outside the vocabulary is broken. */
static int load_special_id(const eng_gguf *g, const char *key, int32_t def,
                           int32_t n_vocab, int32_t *out, sw_error *err)
{
    int64_t kv = eng_gguf_find_key(g, key);
    uint64_t u;
    int32_t i;
    if (kv < 0) {
        *out = def < n_vocab ? def : -1;
        return SW_OK;
    }
    if (eng_gguf_get_u64(g, key, &u, NULL) == SW_OK) {
        if (u == UINT32_MAX || u == UINT64_MAX) {
            *out = -1;
            return SW_OK;
        }
        if (u >= (uint64_t)n_vocab)
            return sw_error_set(err, SW_EFORMAT,
                                "%s is %llu, outside the vocabulary of %d tokens", key,
                                (unsigned long long)u, (int)n_vocab);
        *out = (int32_t)u;
        return SW_OK;
    }
    if (eng_gguf_get_i32(g, key, &i, NULL) == SW_OK && i == -1) {
        *out = -1;
        return SW_OK;
    }
    return sw_error_set(err, SW_EFORMAT, "%s is not a valid token id (type %s)", key,
                        eng_gguf_type_name(eng_gguf_kv_type(g, kv)));
}

static int load_bool(const eng_gguf *g, const char *key, bool def, bool *out, sw_error *err)
{
    int rc = eng_gguf_get_bool(g, key, out, err);
    if (rc == SW_ENOTFOUND) {
        *out = def;
        sw_error_clear(err);
        return SW_OK;
    }
    return rc;
}

/* Checks that key holds an array of elem_type with exactly n entries (or is
 * absent when !required: then *kv_out = -1). */
static int find_array(const eng_gguf *g, const char *key, eng_gguf_value_type elem_type,
                      bool required, uint64_t n, int64_t *kv_out, sw_error *err)
{
    eng_gguf_value_type et;
    uint64_t count;
    int64_t kv = eng_gguf_find_key(g, key);
    *kv_out = -1;
    if (kv < 0) {
        if (!required)
            return SW_OK;
        return sw_error_set(err, SW_EFORMAT, "vocabulary: %s is missing", key);
    }
    if (eng_gguf_kv_type(g, kv) != ENG_GGUF_ARRAY ||
        eng_gguf_get_arr(g, key, &et, &count, NULL) != SW_OK)
        return sw_error_set(err, SW_EFORMAT, "vocabulary: %s is not an array", key);
    /* Integer arrays of another width are converted element-wise by the
     * reader; only the kind (string / float / integer) must match. */
    bool ok = et == elem_type;
    if (elem_type == ENG_GGUF_INT32)
        ok = et == ENG_GGUF_INT32 || et == ENG_GGUF_UINT32 || et == ENG_GGUF_INT8 ||
             et == ENG_GGUF_UINT8 || et == ENG_GGUF_INT16 || et == ENG_GGUF_UINT16 ||
             et == ENG_GGUF_INT64 || et == ENG_GGUF_UINT64;
    if (elem_type == ENG_GGUF_FLOAT32)
        ok = et == ENG_GGUF_FLOAT32 || et == ENG_GGUF_FLOAT64;
    if (!ok)
        return sw_error_set(err, SW_EFORMAT, "vocabulary: %s holds %s, expected %s", key,
                            eng_gguf_type_name(et), eng_gguf_type_name(elem_type));
    if (n != UINT64_MAX && count != n)
        return sw_error_set(err, SW_EFORMAT,
                            "vocabulary: %s has %llu entries but tokenizer.ggml.tokens has %llu",
                            key, (unsigned long long)count, (unsigned long long)n);
    *kv_out = kv;
    return SW_OK;
}

static int special_cmp_len_desc(const eng_tokenizer *tok, int32_t a, int32_t b)
{
    if (tok->piece_len[a] != tok->piece_len[b])
        return tok->piece_len[a] > tok->piece_len[b] ? -1 : 1;
    return a < b ? -1 : (a > b);
}

/* Insertion sort is fine for the handful of special tokens most vocabularies
 * have, but some (Gemma) carry thousands: a plain merge sort keeps it
 * O(n log n) without needing a qsort context pointer. */
static void sort_specials(const eng_tokenizer *tok, int32_t *ids, int32_t *scratch, size_t n)
{
    if (n < 2)
        return;
    size_t half = n / 2;
    sort_specials(tok, ids, scratch, half);
    sort_specials(tok, ids + half, scratch, n - half);
    size_t i = 0, j = half, k = 0;
    while (i < half && j < n)
        scratch[k++] = special_cmp_len_desc(tok, ids[j], ids[i]) < 0 ? ids[j++] : ids[i++];
    while (i < half)
        scratch[k++] = ids[i++];
    while (j < n)
        scratch[k++] = ids[j++];
    memcpy(ids, scratch, n * sizeof *ids);
}

/* Texts of control tokens that end a turn in common chat templates: models
 * stop on them although the GGUF names only one eos_token_id. */
static const char *const eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|eom_id|>", "<EOT>", "<|end_of_text|>",
};

static int add_eog(eng_tokenizer *tok, int32_t id)
{
    if (id < 0)
        return SW_OK;
    for (size_t i = 0; i < tok->n_eog; i++)
        if (tok->eog[i] == id)
            return SW_OK;
    int32_t *grown = sw_realloc(tok->eog, (tok->n_eog + 1) * sizeof *grown);
    if (!grown)
        return SW_ENOMEM;
    tok->eog = grown;
    tok->eog[tok->n_eog++] = id;
    return SW_OK;
}

/* Loads the vocabulary shared by both algorithms: pieces, scores, types,
 * the piece -> id table, special ids, flags, specials and the EOG set. The
 * defaults differ per algorithm (see below); tok->algo is set already. */
static int load_vocab(const eng_gguf *g, eng_tokenizer *tok, sw_error *err)
{
    const bool spm = tok->algo == ENG__TOK_ALGO_SPM;
    int64_t kv_tokens, kv_scores, kv_types;
    uint64_t n;
    size_t blob_bytes = 0;
    int32_t *scratch = NULL;
    int rc;

    rc = find_array(g, "tokenizer.ggml.tokens", ENG_GGUF_STRING, true, UINT64_MAX,
                    &kv_tokens, err);
    if (rc)
        goto fail;
    eng_gguf_get_arr(g, "tokenizer.ggml.tokens", &(eng_gguf_value_type){0}, &n, NULL);
    if (n == 0 || n > TOK_MAX_VOCAB) {
        rc = sw_error_set(err, SW_EFORMAT, "vocabulary: tokenizer.ggml.tokens has %llu "
                          "entries (expected 1..%llu)", (unsigned long long)n,
                          (unsigned long long)TOK_MAX_VOCAB);
        goto fail;
    }
    /* Scores drive every SPM merge: an SPM vocabulary without them cannot
     * tokenize like its reference, so they are required there. BPE ranks
     * its merges by tokenizer.ggml.merges instead; scores are optional. */
    rc = find_array(g, "tokenizer.ggml.scores", ENG_GGUF_FLOAT32, spm, n, &kv_scores, err);
    if (rc)
        goto fail;
    rc = find_array(g, "tokenizer.ggml.token_type", ENG_GGUF_INT32, false, n, &kv_types, err);
    if (rc)
        goto fail;

    tok->n_vocab = (int32_t)n;
    tok->piece_off = sw_calloc(n, sizeof *tok->piece_off);
    tok->piece_len = sw_calloc(n, sizeof *tok->piece_len);
    tok->scores = sw_calloc(n, sizeof *tok->scores);
    tok->types = sw_calloc(n, sizeof *tok->types);
    tok->byte_value = sw_calloc(n, sizeof *tok->byte_value);
    if (!tok->piece_off || !tok->piece_len || !tok->scores || !tok->types || !tok->byte_value)
        goto nomem;

    for (uint64_t i = 0; i < n; i++) {
        const char *s;
        size_t len;
        if (eng_gguf_arr_str(g, kv_tokens, i, &s, &len) != SW_OK) {
            rc = sw_error_set(err, SW_EFORMAT, "vocabulary: token %llu is unreadable",
                              (unsigned long long)i);
            goto fail;
        }
        if (len > TOK_MAX_PIECE_BYTES) {
            rc = sw_error_set(err, SW_EFORMAT, "vocabulary: token %llu is %zu bytes long "
                              "(limit %llu)", (unsigned long long)i, len,
                              (unsigned long long)TOK_MAX_PIECE_BYTES);
            goto fail;
        }
        tok->piece_off[i] = blob_bytes;
        tok->piece_len[i] = (uint32_t)len;
        blob_bytes += len + 1; /* bounded: 2^24 tokens of at most 2^16+1 bytes */
        if (len > tok->max_piece_bytes)
            tok->max_piece_bytes = len;
    }
    tok->blob = sw_malloc(blob_bytes);
    if (!tok->blob)
        goto nomem;
    for (uint64_t i = 0; i < n; i++) {
        const char *s;
        size_t len;
        float score = 0.0f;
        int32_t type = ENG_TOKEN_NORMAL;
        eng_gguf_arr_str(g, kv_tokens, i, &s, &len);
        memcpy(tok->blob + tok->piece_off[i], s, len);
        tok->blob[tok->piece_off[i] + len] = '\0';
        if (kv_scores >= 0 && eng_gguf_arr_f32(g, kv_scores, i, &score) != SW_OK) {
            rc = sw_error_set(err, SW_EFORMAT, "vocabulary: score %llu is unreadable",
                              (unsigned long long)i);
            goto fail;
        }
        /* A NaN would break the heap's ordering; it can never win a merge. */
        tok->scores[i] = isnan(score) ? -INFINITY : score;
        if (kv_types >= 0 && eng_gguf_arr_i32(g, kv_types, i, &type) != SW_OK) {
            rc = sw_error_set(err, SW_EFORMAT, "vocabulary: token_type %llu is unreadable",
                              (unsigned long long)i);
            goto fail;
        }
        if (type < ENG_TOKEN_UNDEFINED || type > ENG_TOKEN_BYTE) {
            rc = sw_error_set(err, SW_EFORMAT, "vocabulary: token %llu has unknown type %d",
                              (unsigned long long)i, (int)type);
            goto fail;
        }
        tok->types[i] = (uint8_t)type;
        tok->byte_value[i] = -1;
        if (type == ENG_TOKEN_BYTE) {
            /* A BYTE token whose piece is not <0xNN> renders as its text. */
            int b = parse_byte_piece(s, len);
            tok->byte_value[i] = (int16_t)b;
        }
    }

    /* Hash table at most half full. */
    size_t slots = 16;
    while (slots < 2 * (size_t)n)
        slots *= 2;
    tok->hash_slots = sw_malloc(slots * sizeof *tok->hash_slots);
    if (!tok->hash_slots)
        goto nomem;
    memset(tok->hash_slots, 0xff, slots * sizeof *tok->hash_slots);
    tok->hash_mask = slots - 1;
    for (int32_t id = 0; id < tok->n_vocab; id++)
        vocab_insert(tok, id);

    /* Defaults: SPM as llama.cpp (bos 1, eos 2, unk 0, add BOS, space
     * prefix). BPE vocabularies always name their special ids, so a missing
     * one means "none" rather than llama.cpp's GPT-NeoX guess (11); BPE adds
     * no space prefix, and whether it adds BOS by default depends on the
     * pre-tokenizer (eng__bpe_load). */
    rc = load_special_id(g, "tokenizer.ggml.bos_token_id", spm ? 1 : -1, tok->n_vocab,
                         &tok->bos, err);
    if (!rc)
        rc = load_special_id(g, "tokenizer.ggml.eos_token_id", spm ? 2 : -1, tok->n_vocab,
                             &tok->eos, err);
    if (!rc)
        rc = load_special_id(g, "tokenizer.ggml.unknown_token_id", spm ? 0 : -1, tok->n_vocab,
                             &tok->unk, err);
    if (!rc)
        rc = load_special_id(g, "tokenizer.ggml.padding_token_id", -1, tok->n_vocab, &tok->pad,
                             err);
    if (!rc)
        rc = load_bool(g, "tokenizer.ggml.add_bos_token", spm, &tok->add_bos, err);
    if (!rc)
        rc = load_bool(g, "tokenizer.ggml.add_space_prefix", spm, &tok->add_space_prefix, err);
    if (!rc)
        rc = load_bool(g, "tokenizer.ggml.add_eos_token", false, &tok->add_eos, err);
    if (rc)
        goto fail;
    if (tok->add_bos && tok->bos < 0) {
        /* The SPM default (add BOS) quietly yields to a vocabulary without
         * one; an explicit request for a missing BOS is a broken file. */
        if (eng_gguf_find_key(g, "tokenizer.ggml.add_bos_token") >= 0) {
            rc = sw_error_set(err, SW_EFORMAT, "vocabulary asks for BOS "
                              "(tokenizer.ggml.add_bos_token) but has no BOS token");
            goto fail;
        }
        tok->add_bos = false;
    }
    if (tok->add_eos && tok->eos < 0)
        tok->add_eos = false;

    /* Byte fallback: <0xNN> as SentencePiece writes it, else a one-byte
     * piece, else unk. */
    for (int b = 0; b < 256; b++) {
        static const char hex[] = "0123456789ABCDEF";
        char name[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
        char one = (char)b;
        int32_t id = vocab_find(tok, name, sizeof name);
        if (id < 0)
            id = vocab_find(tok, &one, 1);
        tok->byte_to_id[b] = id >= 0 ? id : tok->unk;
    }

    /* Special tokens matched literally in the text. */
    size_t n_specials = 0;
    for (int32_t id = 0; id < tok->n_vocab; id++) {
        uint8_t t = tok->types[id];
        if ((t == ENG_TOKEN_CONTROL || t == ENG_TOKEN_USER_DEFINED || t == ENG_TOKEN_UNKNOWN) &&
            tok->piece_len[id] > 0)
            n_specials++;
    }
    tok->specials = sw_calloc(n_specials, sizeof *tok->specials);
    scratch = sw_calloc(n_specials, sizeof *scratch);
    if (!tok->specials || !scratch)
        goto nomem;
    for (int32_t id = 0; id < tok->n_vocab; id++) {
        uint8_t t = tok->types[id];
        if ((t == ENG_TOKEN_CONTROL || t == ENG_TOKEN_USER_DEFINED || t == ENG_TOKEN_UNKNOWN) &&
            tok->piece_len[id] > 0)
            tok->specials[tok->n_specials++] = id;
    }
    sort_specials(tok, tok->specials, scratch, tok->n_specials);

    /* End of generation: eos, the explicit eot/eom ids, and control tokens
     * whose text is a well-known end-of-turn marker. */
    int32_t eot = -1, eom = -1;
    rc = load_special_id(g, "tokenizer.ggml.eot_token_id", -1, tok->n_vocab, &eot, err);
    if (!rc)
        rc = load_special_id(g, "tokenizer.ggml.eom_token_id", -1, tok->n_vocab, &eom, err);
    if (rc)
        goto fail;
    if (add_eog(tok, tok->eos) || add_eog(tok, eot) || add_eog(tok, eom))
        goto nomem;
    for (size_t i = 0; i < sizeof eog_texts / sizeof eog_texts[0]; i++) {
        int32_t id = vocab_find(tok, eog_texts[i], strlen(eog_texts[i]));
        if (id >= 0 && tok->types[id] == ENG_TOKEN_CONTROL && add_eog(tok, id))
            goto nomem;
    }
    {
        /* gpt-oss (harmony): a turn ends with <|return|> or <|call|>, while
         * <|end|> only ends one of its messages (the thought, before the
         * answer), so it must not end generation (llama.cpp does the same) */
        int32_t ret = vocab_find(tok, "<|return|>", 10), call = vocab_find(tok, "<|call|>", 8);
        int32_t end = vocab_find(tok, "<|end|>", 7);
        if (ret >= 0 && call >= 0 && tok->types[ret] == ENG_TOKEN_CONTROL &&
            tok->types[call] == ENG_TOKEN_CONTROL) {
            if (add_eog(tok, ret) || add_eog(tok, call))
                goto nomem;
            for (size_t i = 0; end >= 0 && i < tok->n_eog; i++)
                if (tok->eog[i] == end)
                    tok->eog[i--] = tok->eog[--tok->n_eog];
        }
    }
    sw_free(scratch);
    return SW_OK;

nomem:
    rc = sw_error_set(err, SW_ENOMEM, "out of memory loading the vocabulary");
fail:
    sw_free(scratch);
    return rc;
}

int eng_tokenizer_load(const eng_gguf *g, eng_tokenizer **out, sw_error *err)
{
    eng_tokenizer *tok = NULL;
    const char *model;
    size_t model_len;
    int rc;

    *out = NULL;
    rc = eng_gguf_get_str(g, "tokenizer.ggml.model", &model, &model_len, err);
    if (rc == SW_ENOTFOUND)
        return sw_error_set(err, SW_EFORMAT,
                            "the file has no vocabulary (tokenizer.ggml.model is missing)");
    if (rc)
        return rc;
    eng__tok_algo algo;
    if (model_len == 5 && memcmp(model, "llama", 5) == 0)
        algo = ENG__TOK_ALGO_SPM;
    else if (model_len == 4 && memcmp(model, "gpt2", 4) == 0)
        algo = ENG__TOK_ALGO_BPE;
    else
        return sw_error_set(err, SW_EUNSUPPORTED,
                            "tokenizer model \"%.*s\" is not supported (supported: \"llama\", "
                            "SentencePiece; \"gpt2\", byte-level BPE)",
                            (int)(model_len > 64 ? 64 : model_len), model);

    tok = sw_calloc(1, sizeof *tok);
    if (!tok)
        return sw_error_set(err, SW_ENOMEM, "out of memory loading the vocabulary");
    tok->algo = algo;
    rc = load_vocab(g, tok, err);
    if (!rc && algo == ENG__TOK_ALGO_BPE)
        rc = eng__bpe_load(g, tok, eng_gguf_find_key(g, "tokenizer.ggml.add_bos_token") >= 0,
                           err);
    if (rc)
        goto fail;
    *out = tok;
    return SW_OK;
fail:
    eng_tokenizer_free(tok);
    return rc;
}

void eng_tokenizer_free(eng_tokenizer *tok)
{
    if (!tok)
        return;
    sw_free(tok->blob);
    sw_free(tok->piece_off);
    sw_free(tok->piece_len);
    sw_free(tok->scores);
    sw_free(tok->types);
    sw_free(tok->byte_value);
    sw_free(tok->hash_slots);
    sw_free(tok->specials);
    sw_free(tok->eog);
    eng__bpe_free(tok->bpe);
    sw_free(tok);
}

int32_t eng_tokenizer_n_vocab(const eng_tokenizer *tok) { return tok->n_vocab; }
int32_t eng_tokenizer_bos(const eng_tokenizer *tok) { return tok->bos; }
int32_t eng_tokenizer_eos(const eng_tokenizer *tok) { return tok->eos; }
int32_t eng_tokenizer_unk(const eng_tokenizer *tok) { return tok->unk; }
int32_t eng_tokenizer_pad(const eng_tokenizer *tok) { return tok->pad; }
bool eng_tokenizer_add_bos(const eng_tokenizer *tok) { return tok->add_bos; }
bool eng_tokenizer_add_eos(const eng_tokenizer *tok) { return tok->add_eos; }
bool eng_tokenizer_add_space_prefix(const eng_tokenizer *tok) { return tok->add_space_prefix; }

bool eng_tokenizer_is_eog(const eng_tokenizer *tok, int32_t id)
{
    for (size_t i = 0; i < tok->n_eog; i++)
        if (tok->eog[i] == id)
            return true;
    return false;
}

eng_token_type eng_token_get_type(const eng_tokenizer *tok, int32_t id)
{
    if (id < 0 || id >= tok->n_vocab)
        return ENG_TOKEN_UNDEFINED;
    return (eng_token_type)tok->types[id];
}

float eng_token_score(const eng_tokenizer *tok, int32_t id)
{
    if (id < 0 || id >= tok->n_vocab)
        return 0.0f;
    return tok->scores[id];
}

const char *eng_token_piece(const eng_tokenizer *tok, int32_t id, size_t *len)
{
    if (id < 0 || id >= tok->n_vocab) {
        if (len)
            *len = 0;
        return NULL;
    }
    if (len)
        *len = tok->piece_len[id];
    return piece_ptr(tok, id);
}

int32_t eng_token_find(const eng_tokenizer *tok, const char *piece, size_t len)
{
    return vocab_find(tok, piece, len);
}

/* ---- tokenization ------------------------------------------------------- */

/* A growable id list with a hard cap (the output can never exceed three ids
 * per input byte plus one per special token, so the cap is a bug guard). */
typedef eng__ids id_vec;

int eng__ids_push(eng__ids *v, int32_t id)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        if (cap > SIZE_MAX / sizeof *v->ids / 2)
            return SW_ENOMEM;
        int32_t *grown = sw_realloc(v->ids, cap * sizeof *grown);
        if (!grown)
            return SW_ENOMEM;
        v->ids = grown;
        v->cap = cap;
    }
    v->ids[v->n++] = id;
    return SW_OK;
}

typedef struct spm_symbol {
    int32_t start; /* byte offset in the normalized text */
    int32_t n;     /* bytes; 0 once merged into its left neighbour */
    int32_t prev, next;
} spm_symbol;

typedef struct spm_pair {
    float score;
    int32_t left, right;
    int32_t left_n, right_n; /* sizes when queued: stale if either changed */
} spm_pair;

/* Heap order: higher score first; on equal scores the leftmost pair, which
 * is what SentencePiece and llama.cpp do. */
static bool pair_before(const spm_pair *a, const spm_pair *b)
{
    if (a->score != b->score)
        return a->score > b->score;
    return a->left < b->left;
}

typedef struct spm_heap {
    spm_pair *items;
    size_t n, cap;
} spm_heap;

static int heap_push(spm_heap *h, spm_pair p)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        spm_pair *grown = sw_realloc(h->items, cap * sizeof *grown);
        if (!grown)
            return SW_ENOMEM;
        h->items = grown;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!pair_before(&p, &h->items[parent]))
            break;
        h->items[i] = h->items[parent];
        i = parent;
    }
    h->items[i] = p;
    return SW_OK;
}

static spm_pair heap_pop(spm_heap *h)
{
    spm_pair top = h->items[0];
    spm_pair last = h->items[--h->n];
    size_t i = 0;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= h->n)
            break;
        if (child + 1 < h->n && pair_before(&h->items[child + 1], &h->items[child]))
            child++;
        if (!pair_before(&h->items[child], &last))
            break;
        h->items[i] = h->items[child];
        i = child;
    }
    if (h->n > 0)
        h->items[i] = last;
    return top;
}

typedef struct spm_work {
    char *text;            /* normalized fragment */
    size_t text_cap;
    spm_symbol *symbols;
    size_t symbols_cap;
    spm_heap heap;
} spm_work;

static int spm_try_pair(const eng_tokenizer *tok, spm_work *w, int32_t left, int32_t right)
{
    if (left < 0 || right < 0)
        return SW_OK;
    const spm_symbol *l = &w->symbols[left], *r = &w->symbols[right];
    /* Symbols stay contiguous in the text, so the merged piece is a slice. */
    int32_t id = vocab_find(tok, w->text + l->start, (size_t)l->n + (size_t)r->n);
    if (id < 0)
        return SW_OK;
    spm_pair p = {tok->scores[id], left, right, l->n, r->n};
    return heap_push(&w->heap, p);
}

/* Length of the UTF-8 sequence a lead byte announces, judged from its high
 * nibble only (continuation and invalid bytes count as one; 0xF8..0xFF as
 * four). This is the reference's rule; its results for invalid input are
 * byte tokens either way. */
static size_t utf8_len_from_lead(uint8_t c)
{
    static const uint8_t lengths[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lengths[c >> 4];
}

static int spm_tokenize_fragment(const eng_tokenizer *tok, spm_work *w, const char *raw,
                                 size_t raw_len, bool space_prefix, id_vec *out)
{
    size_t n_text = 0, n_symbols = 0;
    int rc;

    /* Normalize: optional "▁" prefix, every ' ' -> "▁". At most 3 bytes per
     * input byte plus 3; raw_len <= TOK_MAX_INPUT_BYTES keeps this small. */
    size_t need = raw_len * 3 + 3;
    if (need > w->text_cap) {
        char *grown = sw_realloc(w->text, need);
        if (!grown)
            return SW_ENOMEM;
        w->text = grown;
        w->text_cap = need;
    }
    if (space_prefix) {
        memcpy(w->text, spm_space, 3);
        n_text = 3;
    }
    for (size_t i = 0; i < raw_len; i++) {
        if (raw[i] == ' ') {
            memcpy(w->text + n_text, spm_space, 3);
            n_text += 3;
        } else {
            w->text[n_text++] = raw[i];
        }
    }
    if (n_text == 0)
        return SW_OK;

    if (n_text > w->symbols_cap) {
        spm_symbol *grown = sw_realloc(w->symbols, n_text * sizeof *grown);
        if (!grown)
            return SW_ENOMEM;
        w->symbols = grown;
        w->symbols_cap = n_text;
    }
    for (size_t off = 0; off < n_text;) {
        size_t len = utf8_len_from_lead((uint8_t)w->text[off]);
        if (len > n_text - off)
            len = n_text - off;
        spm_symbol *s = &w->symbols[n_symbols];
        s->start = (int32_t)off;
        s->n = (int32_t)len;
        s->prev = (int32_t)n_symbols - 1;
        off += len;
        s->next = off == n_text ? -1 : (int32_t)n_symbols + 1;
        n_symbols++;
    }

    w->heap.n = 0;
    for (size_t i = 1; i < n_symbols; i++) {
        rc = spm_try_pair(tok, w, (int32_t)i - 1, (int32_t)i);
        if (rc)
            return rc;
    }
    while (w->heap.n > 0) {
        spm_pair p = heap_pop(&w->heap);
        spm_symbol *l = &w->symbols[p.left], *r = &w->symbols[p.right];
        /* Stale: one side was merged away or grew since this was queued. */
        if (l->n != p.left_n || r->n != p.right_n || l->next != p.right)
            continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            w->symbols[r->next].prev = p.left;
        rc = spm_try_pair(tok, w, l->prev, p.left);
        if (!rc)
            rc = spm_try_pair(tok, w, p.left, l->next);
        if (rc)
            return rc;
    }

    /* Every merged symbol is a piece by construction; single characters
     * that are not fall back to bytes. */
    for (int32_t i = 0; i >= 0; i = w->symbols[i].next) {
        const spm_symbol *s = &w->symbols[i];
        int32_t id = vocab_find(tok, w->text + s->start, (size_t)s->n);
        if (id >= 0) {
            if (eng__ids_push(out, id))
                return SW_ENOMEM;
            continue;
        }
        for (int32_t j = 0; j < s->n; j++) {
            uint8_t b = (uint8_t)w->text[s->start + j];
            id = tok->byte_to_id[b];
            if (id < 0)
                return SW_EUNSUPPORTED;
            if (eng__ids_push(out, id))
                return SW_ENOMEM;
        }
    }
    return SW_OK;
}

/* A piece of the input: plain text [start, start+len), or a special token. */
typedef struct fragment {
    size_t start, len;
    int32_t id;         /* -1 for plain text */
    bool special_ok;    /* plain text: special-token text is matched in it */
} fragment;

typedef struct frag_vec {
    fragment *items;
    size_t n, cap;
} frag_vec;

static int frag_push(frag_vec *v, fragment f)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 16;
        fragment *grown = sw_realloc(v->items, cap * sizeof *grown);
        if (!grown)
            return SW_ENOMEM;
        v->items = grown;
        v->cap = cap;
    }
    v->items[v->n++] = f;
    return SW_OK;
}

/* Splits the text at literal special tokens (see the top of the file for the
 * order). *frags receives the result; *spare is scratch of the same kind. */
static int partition_specials(const eng_tokenizer *tok, const char *text, size_t len,
                              const eng_text_span *spans, size_t n_spans, frag_vec *frags,
                              frag_vec *spare)
{
    bool any_special_ok = false;
    frags->n = 0;
    for (size_t i = 0; i < n_spans; i++) {
        if (frag_push(frags, (fragment){spans[i].offset, spans[i].len, -1, spans[i].parse_special}))
            return SW_ENOMEM;
        any_special_ok |= spans[i].parse_special;
    }
    for (size_t s = 0; s < tok->n_specials; s++) {
        int32_t id = tok->specials[s];
        uint8_t type = tok->types[id];
        /* User-defined tokens are matched even without special parsing, as
         * the reference does; control tokens only where it is on. */
        bool user_defined = type == ENG_TOKEN_USER_DEFINED;
        if (!any_special_ok && !user_defined)
            continue;
        const char *needle = piece_ptr(tok, id);
        size_t needle_len = tok->piece_len[id];
        if (needle_len > len || !memmem(text, len, needle, needle_len))
            continue;

        spare->n = 0;
        for (size_t f = 0; f < frags->n; f++) {
            fragment fr = frags->items[f];
            if (fr.id >= 0 || (!fr.special_ok && !user_defined)) {
                if (frag_push(spare, fr))
                    return SW_ENOMEM;
                continue;
            }
            size_t pos = fr.start, end = fr.start + fr.len;
            while (pos < end) {
                const char *hit = end - pos >= needle_len
                                      ? memmem(text + pos, end - pos, needle, needle_len)
                                      : NULL;
                if (!hit) {
                    if (frag_push(spare, (fragment){pos, end - pos, -1, fr.special_ok}))
                        return SW_ENOMEM;
                    break;
                }
                size_t at = (size_t)(hit - text);
                if (at > pos && frag_push(spare, (fragment){pos, at - pos, -1, fr.special_ok}))
                    return SW_ENOMEM;
                if (frag_push(spare, (fragment){at, needle_len, id, false}))
                    return SW_ENOMEM;
                pos = at + needle_len;
            }
        }
        frag_vec tmp = *frags;
        *frags = *spare;
        *spare = tmp;
    }
    /* Adjacent plain fragments from different spans are one stretch of
     * text, tokenized as they would be in the whole text. */
    size_t kept = 0;
    for (size_t f = 0; f < frags->n; f++) {
        fragment fr = frags->items[f];
        if (kept > 0 && fr.id < 0 && frags->items[kept - 1].id < 0)
            frags->items[kept - 1].len += fr.len;
        else
            frags->items[kept++] = fr;
    }
    frags->n = kept;
    return SW_OK;
}

int eng_tokenize(const eng_tokenizer *tok, const char *text, size_t len, bool add_bos,
                 bool parse_special, int32_t **tokens_out, size_t *n_out, sw_error *err)
{
    eng_text_span whole = {0, len, parse_special};
    return eng_tokenize_spans(tok, text, len, &whole, len > 0 ? 1 : 0, add_bos, tokens_out,
                              n_out, err);
}

int eng_tokenize_spans(const eng_tokenizer *tok, const char *text, size_t len,
                       const eng_text_span *spans, size_t n_spans, bool add_bos,
                       int32_t **tokens_out, size_t *n_out, sw_error *err)
{
    id_vec out = {0};
    frag_vec frags = {0}, spare = {0};
    spm_work work = {0};
    eng__bpe_work *bpe_work = NULL;
    int rc = SW_OK;

    *tokens_out = NULL;
    *n_out = 0;
    if (!text && len > 0)
        return sw_error_set(err, SW_EINVAL, "tokenize: NULL text");
    if (len > TOK_MAX_INPUT_BYTES)
        return sw_error_set(err, SW_ERANGE, "tokenize: text of %zu bytes exceeds the limit of "
                            "%zu", len, TOK_MAX_INPUT_BYTES);
    {
        size_t pos = 0;
        for (size_t i = 0; i < n_spans; i++) {
            if (spans[i].offset != pos || spans[i].len == 0 || spans[i].len > len - pos)
                return sw_error_set(err, SW_EINVAL,
                                    "tokenize: span %zu (offset %zu, %zu bytes) does not "
                                    "continue the text at %zu of %zu bytes", i, spans[i].offset,
                                    spans[i].len, pos, len);
            pos += spans[i].len;
        }
        if (pos != len)
            return sw_error_set(err, SW_EINVAL, "tokenize: spans cover %zu of %zu bytes", pos,
                                len);
    }

    if (add_bos && tok->bos >= 0 && (rc = eng__ids_push(&out, tok->bos)))
        goto fail;
    if (len > 0) {
        rc = partition_specials(tok, text, len, spans, n_spans, &frags, &spare);
        if (rc)
            goto fail;
    }
    /* The space prefix goes on the first plain fragment and on every one
     * that follows a special token: the reference treats a special token
     * like the start of the text (so "<s> hi" gives <s> "▁" "▁hi"). */
    bool after_special = true;
    for (size_t f = 0; f < frags.n; f++) {
        const fragment *fr = &frags.items[f];
        if (fr->id >= 0) {
            rc = eng__ids_push(&out, fr->id);
            after_special = true;
        } else if (tok->algo == ENG__TOK_ALGO_BPE) {
            rc = eng__bpe_tokenize(tok, &bpe_work, text + fr->start, fr->len, &out);
        } else {
            rc = spm_tokenize_fragment(tok, &work, text + fr->start, fr->len,
                                       tok->add_space_prefix && after_special, &out);
            after_special = false;
        }
        if (rc)
            goto fail;
    }
    /* Hand back an exact-size allocation, even for zero ids. */
    if (!out.ids && (rc = eng__ids_push(&out, 0)) == SW_OK)
        out.n = 0;
    if (rc)
        goto fail;
    *tokens_out = out.ids;
    *n_out = out.n;
    out.ids = NULL;

fail:
    sw_free(out.ids);
    sw_free(frags.items);
    sw_free(spare.items);
    sw_free(work.text);
    sw_free(work.symbols);
    sw_free(work.heap.items);
    eng__bpe_work_free(bpe_work);
    if (rc == SW_ENOMEM)
        return sw_error_set(err, rc, "tokenize: out of memory");
    if (rc == SW_EUNSUPPORTED)
        return sw_error_set(err, rc, "tokenize: the vocabulary has neither byte tokens nor "
                            "an unknown token for a character it lacks");
    return rc;
}

/* ---- detokenization ----------------------------------------------------- */

size_t eng_detok_max_bytes(const eng_tokenizer *tok)
{
    /* Every input byte (held-back ones included) may turn into a 3-byte
     * U+FFFD; the unknown glyph is 3 bytes. */
    size_t piece = tok->max_piece_bytes > 3 ? tok->max_piece_bytes : 3;
    return 3 * (piece + sizeof ((eng_detok *)0)->pending);
}

void eng_detok_reset(eng_detok *d) { memset(d, 0, sizeof *d); }

typedef struct out_buf {
    char *p;
    size_t n, cap;
    bool full; /* a character did not fit: nothing more is written */
} out_buf;

/* Appends whole characters only: if one does not fit, it (and everything
 * after it) is dropped, so the output stays valid UTF-8 even when a caller
 * passes less than eng_detok_max_bytes. */
static void out_put(out_buf *o, const void *s, size_t n)
{
    if (o->full || n > o->cap - o->n) {
        o->full = true;
        return;
    }
    memcpy(o->p + o->n, s, n);
    o->n += n;
}

static void out_replacement(out_buf *o)
{
    static const char fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
    out_put(o, fffd, 3);
}

/* Bytes of the sequence that lead byte c starts (RFC 3629), 0 if c can not
 * start one. */
static size_t utf8_expected_len(uint8_t c)
{
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        return 2;
    if (c >= 0xE0 && c <= 0xEF)
        return 3;
    if (c >= 0xF0 && c <= 0xF4)
        return 4;
    return 0;
}

/* Whether byte c may follow lead at position pos (1..3) of a sequence: the
 * second byte's range excludes overlong forms, surrogates and > U+10FFFF. */
static bool utf8_continues(uint8_t lead, size_t pos, uint8_t c)
{
    uint8_t lo = 0x80, hi = 0xBF;
    if (pos == 1) {
        if (lead == 0xE0)
            lo = 0xA0;
        else if (lead == 0xED)
            hi = 0x9F;
        else if (lead == 0xF0)
            lo = 0x90;
        else if (lead == 0xF4)
            hi = 0x8F;
    }
    return c >= lo && c <= hi;
}

/* Feeds one byte through the held-back state. Invalid input becomes one
 * U+FFFD per maximal ill-formed subpart (the Unicode recommendation), so the
 * output is valid UTF-8 whatever the tokens were. */
static void detok_feed(eng_detok *d, out_buf *o, uint8_t c)
{
    if (d->n_pending > 0) {
        uint8_t lead = d->pending[0];
        if (utf8_continues(lead, d->n_pending, c)) {
            d->pending[d->n_pending++] = c;
            if (d->n_pending == utf8_expected_len(lead)) {
                out_put(o, d->pending, d->n_pending);
                d->n_pending = 0;
            }
            return;
        }
        out_replacement(o);
        d->n_pending = 0;
    }
    size_t need = utf8_expected_len(c);
    if (need == 1) {
        out_put(o, &c, 1);
    } else if (need == 0) {
        out_replacement(o);
    } else {
        d->pending[0] = c;
        d->n_pending = 1;
    }
}

/* Where the bytes of a token's text go: the UTF-8 repair of a detokenizer,
 * or a plain byte buffer (eng_token_to_bytes). */
typedef struct byte_sink {
    eng_detok *d; /* NULL: raw bytes into raw/raw_cap */
    out_buf *o;
    char *raw;
    size_t raw_cap, raw_n; /* raw_n counts every byte, stored or not */
} byte_sink;

static void sink_byte(byte_sink *k, uint8_t c)
{
    if (k->d) {
        detok_feed(k->d, k->o, c);
        return;
    }
    if (k->raw_n < k->raw_cap)
        k->raw[k->raw_n] = (char)c;
    k->raw_n++;
}

/* Writes the text of a token to the sink. Byte tokens give raw bytes,
 * normal pieces their text with "▁" as a space (SPM) or their byte-level
 * characters mapped back to bytes (BPE), user-defined tokens their literal
 * text (they are added words, not pieces), the unknown token U+2585 as
 * llama.cpp renders it; control, unused and undefined tokens no text. With
 * *strip_leading_space, a leading space of the first token that has any text
 * is dropped (the SPM space prefix; BPE vocabularies have none). */
static void token_text(const eng_tokenizer *tok, bool *strip_leading_space, int32_t id,
                       byte_sink *k)
{
    const char *s;
    size_t n;
    bool unescape = false;
    uint8_t byte;

    if (id < 0 || id >= tok->n_vocab)
        return;
    s = piece_ptr(tok, id);
    n = tok->piece_len[id];
    switch (tok->types[id]) {
    case ENG_TOKEN_NORMAL:
        unescape = true;
        break;
    case ENG_TOKEN_USER_DEFINED:
        break;
    case ENG_TOKEN_BYTE:
        if (tok->byte_value[id] >= 0) {
            byte = (uint8_t)tok->byte_value[id];
            s = (const char *)&byte;
            n = 1;
        }
        break; /* a BYTE token that is not <0xNN> shows its text */
    case ENG_TOKEN_UNKNOWN:
        s = unk_glyph;
        n = 3;
        break;
    default:
        return;
    }
    if (n == 0)
        return;

    if (unescape && tok->algo == ENG__TOK_ALGO_BPE) {
        /* The space prefix rule never applies: add_space_prefix is off for
         * BPE unless a file asks for it, and its pieces carry real spaces. */
        size_t i = 0;
        bool first = true;
        while (i < n) {
            int b = eng__bpe_unmap_char(s, n, &i);
            if (b < 0)
                b = (uint8_t)s[i++]; /* not a byte symbol: its own bytes */
            if (first && *strip_leading_space) {
                *strip_leading_space = false;
                if (tok->add_space_prefix && b == ' ')
                    continue;
            }
            first = false;
            sink_byte(k, (uint8_t)b);
        }
        return;
    }

    size_t i = 0;
    bool space_first = (unescape && n >= 3 && memcmp(s, spm_space, 3) == 0) || s[0] == ' ';
    if (*strip_leading_space) {
        *strip_leading_space = false;
        if (tok->add_space_prefix && space_first)
            i = s[0] == ' ' ? 1 : 3;
    }
    while (i < n) {
        if (unescape && n - i >= 3 && memcmp(s + i, spm_space, 3) == 0) {
            sink_byte(k, ' ');
            i += 3;
        } else {
            sink_byte(k, (uint8_t)s[i++]);
        }
    }
}

static void detok_token(const eng_tokenizer *tok, eng_detok *d, int32_t id, out_buf *o)
{
    byte_sink k = {d, o, NULL, 0, 0};
    token_text(tok, &d->strip_leading_space, id, &k);
}

size_t eng_token_to_bytes(const eng_tokenizer *tok, int32_t id, char *out, size_t cap)
{
    bool strip = false;
    byte_sink k = {NULL, NULL, out, cap, 0};
    token_text(tok, &strip, id, &k);
    return k.raw_n;
}

size_t eng_detok_push(const eng_tokenizer *tok, eng_detok *d, int32_t id, char *out, size_t cap)
{
    out_buf o = {out, 0, cap, false};
    d->n_emitted_tokens++;
    detok_token(tok, d, id, &o);
    return o.n;
}

size_t eng_detok_flush(eng_detok *d, char *out, size_t cap)
{
    out_buf o = {out, 0, cap, false};
    if (d->n_pending > 0) {
        /* A truncated but so-far valid sequence is one maximal subpart. */
        out_replacement(&o);
        d->n_pending = 0;
    }
    return o.n;
}

char *eng_detokenize_ex(const eng_tokenizer *tok, const int32_t *ids, size_t n,
                        bool strip_space_prefix, size_t *len_out)
{
    eng_detok d;
    size_t step = eng_detok_max_bytes(tok);
    size_t cap = step + 1, len = 0;
    char *text = sw_malloc(cap);

    if (len_out)
        *len_out = 0;
    if (!text)
        return NULL;
    eng_detok_reset(&d);
    d.strip_leading_space = strip_space_prefix;
    for (size_t i = 0; i <= n; i++) {
        /* Room for the largest step plus the NUL, growing geometrically. */
        if (cap - len < step + 1) {
            size_t want = cap * 2;
            if (want < cap || want - len < step + 1)
                goto fail;
            char *grown = sw_realloc(text, want);
            if (!grown)
                goto fail;
            text = grown;
            cap = want;
        }
        if (i < n)
            len += eng_detok_push(tok, &d, ids[i], text + len, cap - len - 1);
        else
            len += eng_detok_flush(&d, text + len, cap - len - 1);
    }
    text[len] = '\0';
    if (len_out)
        *len_out = len;
    return text;
fail:
    sw_free(text);
    return NULL;
}

char *eng_detokenize(const eng_tokenizer *tok, const int32_t *ids, size_t n)
{
    return eng_detokenize_ex(tok, ids, n, false, NULL);
}
