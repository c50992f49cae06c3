/* tokenizer.h - text <-> token ids for the vocabularies stored in GGUF files.
 *
 * SPM ("llama" in tokenizer.ggml.model): SentencePiece-style BPE that merges
 * the adjacent pair whose merged piece has the highest score, with a space
 * prefix ("▁"), spaces written as U+2581, and byte fallback (<0xNN> tokens)
 * for anything not in the vocabulary. Special/control tokens (<s>, </s>, ...)
 * are matched literally in the text when parse_special is set.
 *
 * The detokenizer is streaming: it never emits half a UTF-8 character, so
 * its output can go straight into an SSE stream.
 */
#ifndef SPILLWAY_ENGINE_TOKENIZER_H
#define SPILLWAY_ENGINE_TOKENIZER_H

#include "common/error.h"
#include "engine/gguf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct eng_tokenizer eng_tokenizer;

/* GGUF token types (tokenizer.ggml.token_type). */
typedef enum eng_token_type {
    ENG_TOKEN_UNDEFINED = 0,
    ENG_TOKEN_NORMAL = 1,
    ENG_TOKEN_UNKNOWN = 2,
    ENG_TOKEN_CONTROL = 3,
    ENG_TOKEN_USER_DEFINED = 4,
    ENG_TOKEN_UNUSED = 5,
    ENG_TOKEN_BYTE = 6,
} eng_token_type;

/* Loads the vocabulary of an open GGUF file (tokenizer.ggml.*). An
 * unsupported tokenizer model is a clear SW_EUNSUPPORTED error. The
 * tokenizer copies what it needs; the gguf may be closed afterwards. */
int eng_tokenizer_load(const eng_gguf *g, eng_tokenizer **out, sw_error *err);
void eng_tokenizer_free(eng_tokenizer *tok);

int32_t eng_tokenizer_n_vocab(const eng_tokenizer *tok);
int32_t eng_tokenizer_bos(const eng_tokenizer *tok); /* -1 if none */
int32_t eng_tokenizer_eos(const eng_tokenizer *tok); /* -1 if none */
/* True for end-of-generation tokens (EOS, EOT). */
bool eng_tokenizer_is_eog(const eng_tokenizer *tok, int32_t id);
/* Whether the vocabulary asks for BOS to be prepended (default true for SPM). */
bool eng_tokenizer_add_bos(const eng_tokenizer *tok);

/* Tokenizes len bytes of text. Allocates *tokens_out (sw_free) holding
 * *n_out ids. add_bos prepends BOS; parse_special matches special-token
 * text literally. Invalid UTF-8 is tokenized byte-wise, never an error. */
int eng_tokenize(const eng_tokenizer *tok, const char *text, size_t len,
                 bool add_bos, bool parse_special, int32_t **tokens_out,
                 size_t *n_out, sw_error *err);

/* The raw vocabulary piece of a token (as stored, e.g. "▁Hello", "<0x0A>"). */
const char *eng_token_piece(const eng_tokenizer *tok, int32_t id, size_t *len);

/* Streaming detokenizer state: zero-initialise (or eng_detok_reset). */
typedef struct eng_detok {
    uint8_t pending[8];  /* bytes of an incomplete UTF-8 character */
    size_t n_pending;
    size_t n_emitted_tokens;
} eng_detok;

void eng_detok_reset(eng_detok *d);

/* Appends the text of token id to out (capacity cap, at least 64 bytes is
 * always enough), holding back a trailing incomplete UTF-8 sequence until
 * the next call. Returns the number of bytes written. Control tokens render
 * as nothing. The first token's leading space (from the SPM space prefix)
 * is kept only if keep_leading_space. */
size_t eng_detok_push(const eng_tokenizer *tok, eng_detok *d, int32_t id,
                      char *out, size_t cap);
/* Flushes held-back bytes at end of stream (invalid ones become U+FFFD). */
size_t eng_detok_flush(eng_detok *d, char *out, size_t cap);

/* Convenience: detokenizes a whole sequence into a new NUL-terminated string
 * (sw_free). */
char *eng_detokenize(const eng_tokenizer *tok, const int32_t *ids, size_t n);

#endif
