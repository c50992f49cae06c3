/* tokenizer-impl.h - the tokenizer's internal struct, shared by the
 * SentencePiece code and the streaming detokenizer (tokenizer.c) and the
 * byte-level BPE code (tokenizer_bpe.c). Callers outside these two files
 * use tokenizer.h only.
 */
#ifndef SPILLWAY_TEXT_TOKENIZER_IMPL_H
#define SPILLWAY_TEXT_TOKENIZER_IMPL_H

#include "text/tokenizer.h"

typedef enum eng__tok_algo {
    ENG__TOK_ALGO_SPM = 1, /* tokenizer.ggml.model "llama" */
    ENG__TOK_ALGO_BPE = 2, /* tokenizer.ggml.model "gpt2": byte-level BPE */
} eng__tok_algo;

typedef struct eng__bpe eng__bpe;           /* tokenizer_bpe.c */
typedef struct eng__bpe_work eng__bpe_work; /* per-call scratch, ditto */

struct eng_tokenizer {
    eng__tok_algo algo;
    int32_t n_vocab;

    char *blob;            /* every piece, each followed by a NUL */
    uint64_t *piece_off;   /* (n_vocab) offset of each piece in blob */
    uint32_t *piece_len;   /* (n_vocab) bytes, without the NUL */
    float *scores;         /* (n_vocab) merge priority, higher merges first */
    uint8_t *types;        /* (n_vocab) eng_token_type */
    int16_t *byte_value;   /* (n_vocab) 0..255 for BYTE tokens, else -1 */
    size_t max_piece_bytes;

    int32_t *hash_slots;   /* open addressing: id, or -1 for an empty slot */
    size_t hash_mask;      /* slots - 1; slots is a power of two */

    int32_t byte_to_id[256]; /* SPM byte fallback; -1 when not representable */

    int32_t *specials;     /* ids matched literally, longest text first */
    size_t n_specials;
    int32_t *eog;          /* end-of-generation ids */
    size_t n_eog;

    int32_t bos, eos, unk, pad;
    bool add_bos;
    bool add_eos;           /* tokenizer.ggml.add_eos_token (default false) */
    bool add_space_prefix;

    eng__bpe *bpe;         /* merges and pre-tokenizer; NULL unless algo BPE */
};

/* A growable id list (tokenizer.c). */
typedef struct eng__ids {
    int32_t *ids;
    size_t n, cap;
} eng__ids;

int eng__ids_push(eng__ids *v, int32_t id); /* SW_OK or SW_ENOMEM */

/* ---- byte-level BPE (tokenizer_bpe.c) ---------------------------------- */

/* Loads tokenizer.ggml.merges and tokenizer.ggml.pre into tok->bpe, after
 * the vocabulary itself was loaded. add_bos_key_present tells whether the
 * file set tokenizer.ggml.add_bos_token (else the pre-tokenizer's default
 * applies). Errors: SW_EUNSUPPORTED for an unknown pre-tokenizer, SW_EFORMAT
 * for broken merges, SW_ENOMEM. */
int eng__bpe_load(const eng_gguf *g, eng_tokenizer *tok, bool add_bos_key_present,
                  sw_error *err);
void eng__bpe_free(eng__bpe *bpe);

/* Pre-tokenizes and BPE-merges len bytes of plain text (no special tokens),
 * appending ids to out. *work is scratch reused across calls (start with
 * NULL, release with eng__bpe_work_free). SW_ENOMEM, or SW_EUNSUPPORTED when
 * a byte has no token and there is no unknown token. */
int eng__bpe_tokenize(const eng_tokenizer *tok, eng__bpe_work **work, const char *text,
                      size_t len, eng__ids *out);
void eng__bpe_work_free(eng__bpe_work *work);

/* Decodes one character of a byte-level piece at s[*i] (n bytes in all):
 * returns the byte it stands for and advances *i past it, or returns -1
 * (leaving *i) when the character is not one of the 256 byte symbols. */
int eng__bpe_unmap_char(const char *s, size_t n, size_t *i);

#endif
