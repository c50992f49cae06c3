/* tokenizer.h - text <-> token ids for the vocabularies stored in GGUF files.
 *
 * SPM ("llama" in tokenizer.ggml.model): SentencePiece-style BPE that merges
 * the adjacent pair whose merged piece has the highest score, with a space
 * prefix ("▁"), spaces written as U+2581, and byte fallback (<0xNN> tokens)
 * for anything not in the vocabulary. Special/control tokens (<s>, </s>, ...)
 * are matched literally in the text when parse_special is set. Results
 * match llama.cpp token for token (tests/unit/test_tokenizer.c checks its
 * recorded outputs).
 *
 * BPE ("gpt2"): GPT-2 style byte-level BPE (Llama 3, Qwen2, GPT-2, ...).
 * Every byte of the text maps to a printable character, the text is split
 * by the pre-tokenizer that tokenizer.ggml.pre names ("default"/"gpt2"/
 * "gpt-2", "llama-bpe", "qwen2"; anything else is refused with
 * SW_EUNSUPPORTED), and each piece is merged by the ranked
 * tokenizer.ggml.merges. No space prefix, no byte fallback tokens (every
 * byte is a token of its own). Also checked against llama.cpp's recorded
 * outputs (tests/unit/test_tokenizer_bpe.c). Other models are refused with
 * SW_EUNSUPPORTED.
 *
 * The detokenizer is streaming: it never emits half a UTF-8 character, so
 * its output can go straight into an SSE stream, and its output is always
 * valid UTF-8 (bytes that can never form a character become U+FFFD).
 *
 * A loaded tokenizer is immutable: any number of threads may tokenize and
 * detokenize with it at once (each with its own eng_detok).
 */
#ifndef SPILLWAY_TEXT_TOKENIZER_H
#define SPILLWAY_TEXT_TOKENIZER_H

#include "common/error.h"
#include "gguf/gguf.h"

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
 * unsupported tokenizer model or BPE pre-tokenizer is a clear
 * SW_EUNSUPPORTED error naming it; missing tokens/scores (SPM) or merges
 * (BPE), arrays whose lengths disagree, unknown token types and special ids
 * outside the vocabulary are SW_EFORMAT naming the key.
 * SPM defaults as llama.cpp: bos 1, eos 2, unk 0 (when inside the
 * vocabulary), add_bos and add_space_prefix true, token_type NORMAL.
 * BPE defaults: no bos/eos/unk unless named, no space prefix, add_bos true
 * for the "llama-bpe" pre-tokenizer (Llama 3) and false otherwise (Qwen2,
 * GPT-2); tokenizer.ggml.add_bos_token overrides. The tokenizer copies what
 * it needs; the gguf may be closed afterwards. */
int eng_tokenizer_load(const eng_gguf *g, eng_tokenizer **out, sw_error *err);
void eng_tokenizer_free(eng_tokenizer *tok);

int32_t eng_tokenizer_n_vocab(const eng_tokenizer *tok);
int32_t eng_tokenizer_bos(const eng_tokenizer *tok); /* -1 if none */
int32_t eng_tokenizer_eos(const eng_tokenizer *tok); /* -1 if none */
int32_t eng_tokenizer_unk(const eng_tokenizer *tok); /* -1 if none */
int32_t eng_tokenizer_pad(const eng_tokenizer *tok); /* -1 if none */
/* True for end-of-generation tokens: EOS, tokenizer.ggml.eot_token_id and
 * eom_token_id when present, and CONTROL tokens whose text is a common
 * end-of-turn marker (<|im_end|>, <|eot_id|>, <end_of_turn>, ...). */
bool eng_tokenizer_is_eog(const eng_tokenizer *tok, int32_t id);
/* Whether the vocabulary asks for BOS to be prepended (default true for SPM). */
bool eng_tokenizer_add_bos(const eng_tokenizer *tok);
/* Whether the vocabulary asks for EOS to be appended to a text
 * (tokenizer.ggml.add_eos_token, default false; false without an EOS).
 * Generation never appends it; an embedding's input does, as llama.cpp
 * adds its special tokens (Qwen3-Embedding pools the last token, EOS). */
bool eng_tokenizer_add_eos(const eng_tokenizer *tok);
/* Whether the first text (and text after a special token) gets a "▁"
 * prefix (tokenizer.ggml.add_space_prefix, default true for SPM). */
bool eng_tokenizer_add_space_prefix(const eng_tokenizer *tok);

/* Tokenizes len bytes of text (NULs included; text need not be
 * NUL-terminated). Allocates *tokens_out (sw_free, non-NULL on success even
 * for zero ids) holding *n_out ids. add_bos prepends BOS (when the
 * vocabulary has one). parse_special matches the text of CONTROL and
 * UNKNOWN tokens (e.g. "<s>") literally and emits their ids; USER_DEFINED
 * tokens are matched either way, as llama.cpp and Hugging Face do. SPM:
 * the plain text after a matched token gets the space prefix again, like
 * the start of the text. BPE: each plain fragment between special tokens
 * is pre-tokenized and merged on its own. Invalid UTF-8 is tokenized
 * byte-wise, never an error.
 * Errors: SW_ERANGE (over 256 MiB), SW_ENOMEM, SW_EUNSUPPORTED (a byte the
 * vocabulary cannot represent: no byte token and no unk). */
int eng_tokenize(const eng_tokenizer *tok, const char *text, size_t len,
                 bool add_bos, bool parse_special, int32_t **tokens_out,
                 size_t *n_out, sw_error *err);

/* A stretch of a text and whether special-token text is matched in it. */
typedef struct eng_text_span {
    size_t offset;        /* into the text */
    size_t len;           /* > 0 */
    bool parse_special;   /* control tokens' text becomes their ids here */
} eng_text_span;

/* eng_tokenize over a text made of spans that cover it in order (a chat
 * prompt: the template's markers with special parsing, the clients' content
 * without). Plain text on both sides of a span boundary is tokenized as one
 * stretch, as it would be in the whole text. User-defined tokens are
 * matched everywhere, as in eng_tokenize. SW_EINVAL if the spans do not
 * cover the text exactly. */
int eng_tokenize_spans(const eng_tokenizer *tok, const char *text, size_t len,
                       const eng_text_span *spans, size_t n_spans, bool add_bos,
                       int32_t **tokens_out, size_t *n_out, sw_error *err);

/* The raw vocabulary piece of a token (as stored, e.g. "▁Hello", "<0x0A>"),
 * NUL-terminated; NULL (and *len 0) for an id outside the vocabulary. */
const char *eng_token_piece(const eng_tokenizer *tok, int32_t id, size_t *len);
/* The id of a piece (exact bytes, as stored), or -1. */
int32_t eng_token_find(const eng_tokenizer *tok, const char *piece, size_t len);
/* UNDEFINED for an id outside the vocabulary. */
eng_token_type eng_token_get_type(const eng_tokenizer *tok, int32_t id);
float eng_token_score(const eng_tokenizer *tok, int32_t id);

/* The raw bytes a token stands for, before any UTF-8 repair: what
 * eng_detok_push would feed through its hold-back logic (BPE byte symbols
 * mapped back to bytes, "▁" as a space, byte tokens as their byte, control
 * tokens nothing; no space stripping). Writes at most cap bytes and returns
 * the full length (call with cap 0 to size a buffer). Concatenated over the
 * ids of eng_tokenize, this gives back the input bytes exactly, invalid
 * UTF-8 included, for BPE; for SPM it also holds the space prefix that
 * tokenizing added (one " " at the start and after each special token). */
size_t eng_token_to_bytes(const eng_tokenizer *tok, int32_t id, char *out, size_t cap);

/* Streaming detokenizer state: zero-initialise (or eng_detok_reset).
 *
 * The leading-space rule. eng_tokenize puts a "▁" before the first text,
 * so token pieces of a text begin with a space that the text did not have.
 * Whether a decoder removes it depends on what is decoded:
 *   - A continuation (generated tokens after a prompt) keeps every space:
 *     " Paris" after "The capital of France is" is the right output. The
 *     reference goldens (../shared/models/<name>.golden.json greedy[].text) are
 *     exactly the concatenated pieces of the continuation tokens, first
 *     space included, so a zero-initialised eng_detok (strip_leading_space
 *     false) reproduces them byte for byte.
 *   - A whole text from its start (a prompt, a vocabulary round trip) sets
 *     strip_leading_space: the first token that renders any text loses one
 *     leading space when the vocabulary adds a space prefix. Tokens that
 *     render nothing (BOS and other control tokens) come before it without
 *     consuming the rule, so decode(tokenize(s)) == s with or without BOS.
 *     (llama.cpp's llama_detokenize differs here: it keeps the space when
 *     the sequence starts with BOS.)
 */
typedef struct eng_detok {
    uint8_t pending[8];  /* bytes of an incomplete UTF-8 character (<= 3) */
    size_t n_pending;
    size_t n_emitted_tokens; /* tokens pushed since the reset */
    bool strip_leading_space; /* see above; cleared once text was produced */
} eng_detok;

void eng_detok_reset(eng_detok *d); /* zeroes everything, flags included */

/* Output capacity that always suffices for one eng_detok_push or
 * eng_detok_flush with this vocabulary: 3 * (longest piece + 8) bytes, as
 * every held-back or invalid byte may become a 3-byte U+FFFD. */
size_t eng_detok_max_bytes(const eng_tokenizer *tok);

/* Appends the text of token id to out (capacity cap; not NUL-terminated),
 * holding back a trailing incomplete UTF-8 sequence until the next call.
 * Returns the number of bytes written. The output is always whole, valid
 * UTF-8 characters: bytes that cannot become part of a character are
 * written as U+FFFD. Byte tokens give their byte, "▁" a space, control
 * tokens nothing, the unknown token U+2585 (as llama.cpp shows it), ids
 * outside the vocabulary nothing. With cap < eng_detok_max_bytes(tok), the
 * text is cut at a character boundary and the rest of this token is lost. */
size_t eng_detok_push(const eng_tokenizer *tok, eng_detok *d, int32_t id,
                      char *out, size_t cap);
/* Flushes held-back bytes at end of stream: an incomplete character becomes
 * one U+FFFD. Returns the bytes written (0 or 3). */
size_t eng_detok_flush(eng_detok *d, char *out, size_t cap);

/* Detokenizes a whole sequence into a new NUL-terminated string (sw_free),
 * flushed; NULL when out of memory. strip_space_prefix: see the rule above.
 * *len_out (optional) receives the length, which tells embedded NULs apart
 * from the end. */
char *eng_detokenize_ex(const eng_tokenizer *tok, const int32_t *ids, size_t n,
                        bool strip_space_prefix, size_t *len_out);
/* Convenience: the concatenated text of the tokens, nothing stripped - the
 * same bytes a zero-initialised eng_detok streams (plus the flush), which is
 * what a generated continuation needs. For a whole text from its start use
 * eng_detokenize_ex(tok, ids, n, true, &len). */
char *eng_detokenize(const eng_tokenizer *tok, const int32_t *ids, size_t n);

#endif
