/* constrain.h - constrained decoding: which tokens may come next so that the
 * text generated so far stays a prefix of a value the grammar accepts
 * (json_schema.h builds the grammar).
 *
 * The automaton works on bytes: a pushdown machine over the grammar's nodes
 * whose state is a small set of fixed-size stacks (anyOf alternatives that
 * agree so far). A token is allowed when all its bytes are accepted in
 * sequence. Masks are computed by walking a byte trie of the vocabulary
 * together with the automaton, so a byte that is refused prunes every token
 * that starts with it; inside a string, where most tokens are fine, the
 * tokens made only of ordinary string characters are decided in one linear
 * pass and only the rest (quotes, backslashes, partial UTF-8) are walked.
 *
 * Budget: a constraint is told how many tokens may still be generated, and
 * allows only tokens after which the shortest completion (in bytes: every
 * byte has a token of its own in the supported vocabularies) still fits,
 * so a value always completes, even from a random model.
 *
 * Special and control tokens are never allowed; the vocabulary's
 * end-of-generation tokens are allowed exactly when the value is complete.
 */
#ifndef SPILLWAY_GRAMMAR_CONSTRAIN_H
#define SPILLWAY_GRAMMAR_CONSTRAIN_H

#include "common/error.h"
#include "grammar/json_schema.h"
#include "text/tokenizer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The token byte strings of a vocabulary, arranged for mask computation.
 * Immutable once built, but for a pool of pattern-list memory its
 * constraints hand on to each other under a lock: shared by every
 * constraint and every thread; freed after its last constraint. */
typedef struct eng_cs_vocab eng_cs_vocab;

/* From a tokenizer: each token's bytes as eng_token_to_bytes gives them
 * (SPM "▁" as a space, byte tokens as their byte). CONTROL, UNKNOWN and
 * UNUSED tokens and tokens without bytes are never allowed; the
 * end-of-generation tokens (eng_tokenizer_is_eog) are the end tokens. */
int eng_cs_vocab_create(const eng_tokenizer *tok, eng_cs_vocab **out, sw_error *err);

/* From explicit pieces (tests): piece i is token i (lens[i] bytes; length 0
 * or NULL means never allowed); end_ids are the end tokens. */
int eng_cs_vocab_create_from_pieces(const char *const *pieces, const size_t *lens, int32_t n,
                                    const int32_t *end_ids, int32_t n_end, eng_cs_vocab **out,
                                    sw_error *err);
void eng_cs_vocab_free(eng_cs_vocab *v);
int32_t eng_cs_vocab_n_tokens(const eng_cs_vocab *v);

/* One generation's automaton. It keeps pointers to g and v, which must
 * outlive it. Allocates its scratch once; stepping and masks allocate
 * nothing. */
typedef struct eng_constraint eng_constraint;

int eng_constraint_create(const eng_grammar *g, const eng_cs_vocab *v, eng_constraint **out,
                          sw_error *err);
void eng_constraint_free(eng_constraint *c);

/* Feeds bytes; false (and the state unchanged) when they are refused. */
bool eng_constraint_feed(eng_constraint *c, const char *bytes, size_t n);
/* Feeds a token: its bytes, or nothing for an end token when the value is
 * complete. False (state unchanged) when refused. */
bool eng_constraint_accept_token(eng_constraint *c, int32_t token);
/* The text so far is a whole value: generation may end here. */
bool eng_constraint_is_complete(const eng_constraint *c);
/* Complete, and no byte can follow: generation must end here. */
bool eng_constraint_is_closed(const eng_constraint *c);
/* Bytes of the shortest completion of the text so far (0 when complete). */
int64_t eng_constraint_min_bytes(const eng_constraint *c);
bool eng_constraint_is_end_token(const eng_constraint *c, int32_t token);

/* The allowed next tokens: bit (id % 32) of mask[id / 32], for
 * (n_tokens + 31) / 32 words. remaining_tokens: tokens that may still be
 * generated, this one included (<= 0: only end tokens when complete).
 * Returns how many tokens are allowed. */
int32_t eng_constraint_mask(eng_constraint *c, int64_t remaining_tokens, uint32_t *mask);

/* The constraint's own mask buffer ((n_tokens + 31) / 32 words), for
 * eng_constraint_mask's output, and the vocabulary size it was built for. */
uint32_t *eng_constraint_mask_buffer(eng_constraint *c);
int32_t eng_constraint_n_tokens(const eng_constraint *c);

#endif
