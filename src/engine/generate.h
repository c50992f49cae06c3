/* generate.h - the generation loop: prefill a prompt, then sample and decode
 * one token at a time, reporting each token through a callback.
 *
 * It is the one loop used by `spillway run`, the benchmarks and the tests.
 * Resuming an interrupted generation is a call with prompt + the k tokens
 * already emitted, replay_tokens = k and skip_draws = k: the prompt is
 * prefilled as before and the k tokens are decoded one at a time, as they
 * were when they were generated, so the cache and the logits are the same
 * bits as in the uninterrupted run (prefill and decode may round
 * differently); the sampler's counter-based stream then continues exactly.
 */
#ifndef SPILLWAY_ENGINE_GENERATE_H
#define SPILLWAY_ENGINE_GENERATE_H

#include "engine/model.h"
#include "engine/sampler.h"
#include "grammar/constrain.h"

#include <stdbool.h>
#include <stdint.h>

#define ENG_MAX_TOP_LOGPROBS 20

typedef struct eng_generate_params {
    int32_t max_tokens;           /* tokens to generate at most */
    eng_sampler_params sampling;
    int32_t top_logprobs;         /* 0..ENG_MAX_TOP_LOGPROBS per step */
    bool ignore_eos;              /* keep going past end-of-generation tokens */
    uint64_t skip_draws;          /* resume: sampler draws already consumed */
    int32_t replay_tokens;        /* resume: the last replay_tokens of the prompt were
                                     generated before; they are decoded one by one */
    int32_t seq_id;               /* which sequence of the context */
    /* Constrained decoding (grammar/constrain.h), or NULL: each token is
     * drawn under the constraint's mask (still one sampler draw) and fed to
     * it; generation ends when the value is closed or an end token comes.
     * The caller owns it and has fed it the replayed tokens of a resume. */
    struct eng_constraint *constraint;
} eng_generate_params;

typedef struct eng_token_logprob {
    int32_t id;
    float logprob;                /* natural log, full softmax, no sampling transforms */
} eng_token_logprob;

typedef struct eng_generate_step {
    int32_t index;                /* 0-based among generated tokens (after skip) */
    int32_t token;
    float logprob;                /* of the chosen token (when top_logprobs > 0) */
    int32_t n_top;
    eng_token_logprob top[ENG_MAX_TOP_LOGPROBS];
} eng_generate_step;

/* Called for every generated token; return false to stop (finish "cancelled"). */
typedef bool (*eng_generate_on_token)(void *user, const eng_generate_step *step);

typedef enum eng_finish_reason {
    ENG_FINISH_LENGTH = 0,        /* max_tokens or context limit */
    ENG_FINISH_STOP = 1,          /* end-of-generation token */
    ENG_FINISH_CANCELLED = 2,     /* the callback asked to stop */
} eng_finish_reason;

typedef struct eng_generate_stats {
    int32_t n_prompt;
    int32_t n_generated;
    double prefill_seconds;
    double decode_seconds;        /* from the first generated token's decode on */
    eng_finish_reason finish;
} eng_generate_stats;

eng_generate_params eng_generate_default_params(void);
const char *eng_finish_reason_name(eng_finish_reason reason);

/* Generates after prompt on params->seq_id (which must be empty: the call
 * clears it first and again at the end). */
int eng_generate(eng_context *ctx, const int32_t *prompt, int32_t n_prompt,
                 const eng_generate_params *params, eng_generate_on_token on_token,
                 void *user, eng_generate_stats *stats, sw_error *err);

/* Monotonic clock in seconds. */
double eng_now_seconds(void);

/* The k largest log-probabilities (k <= ENG_MAX_TOP_LOGPROBS), best first
 * (ties: lower id first); returns how many (min(k, n_vocab)). */
int32_t eng_top_logprobs(const float *logprobs, int32_t n_vocab, int32_t k,
                         eng_token_logprob *top);

/* What one sampling step reads besides the logits. */
typedef struct eng_step_inputs {
    eng_sampler *sampler;
    int32_t n_vocab;
    float *logprobs;           /* n_vocab floats of scratch, or NULL: no log-probabilities */
    int32_t top_logprobs;      /* alternatives to report (0..ENG_MAX_TOP_LOGPROBS) */
    struct eng_constraint *constraint; /* or NULL */
    int64_t budget;            /* tokens that may still be generated, this one included
                                  (the constraint closes its value within it) */
} eng_step_inputs;

/* The per-token step of every generation loop (eng_generate here, the
 * worker's batched decode): the log-probabilities and top alternatives
 * when asked, one sampler draw (under the constraint's mask when there is
 * one, which is then fed the token), and the token appended to history
 * (*n_history grows by one). Fills step->token, ->logprob, ->top, ->n_top;
 * *constraint_end: the constraint's value is closed or an end token came
 * (false without a constraint: end-of-generation is the caller's rule).
 * Errors: eng_constraint_sample's. */
int eng_sample_step(const eng_step_inputs *in, float *logits, int32_t *history,
                    size_t *n_history, eng_generate_step *step, bool *constraint_end,
                    sw_error *err);

/* One constrained step (grammar/constrain.h): */
/* Masks logits (disallowed ids -> -inf), samples with one draw of the
 * sampler (so counter-based resume stays exact), and feeds the token.
 * *token_out receives it; *is_end tells an end token (nothing fed).
 * SW_EINVAL when nothing is allowed (the budget is below the value's
 * minimum), SW_EINTERNAL if the sampler picked a masked token (cannot
 * happen with finite logits; the first allowed token is then used). */
int eng_constraint_sample(eng_constraint *c, eng_sampler *s, float *logits, int32_t n_logits,
                          const int32_t *history, size_t n_history, int64_t remaining_tokens,
                          int32_t *token_out, bool *is_end, sw_error *err);

#endif
